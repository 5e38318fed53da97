//! The unit tests of `src/pacing.rs` (the pacers, the scheduler and the
//! waiter), which reach into private state. The crate's own unit tests do
//! not run (its `wire` and `sys` sources are the library's and are tested
//! there), so this binary compiles the one file with its tests.

#[allow(dead_code, unused_imports)]
#[path = "../src/pacing.rs"]
mod pacing;
