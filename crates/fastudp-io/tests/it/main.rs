//! The library's integration tests: one test binary, `it`, with a module
//! per area (`cargo test -p fastudp-io --test it -- netns::` runs one area).
//! The modules of the optional adapters build only with their feature.
//!
//! `alloc` installs this binary's global allocator, a counting one: its
//! count is per thread, so the tests of the other modules, running in
//! parallel, neither disturb it nor are slowed by it beyond a thread-local
//! increment.

mod common;
/// Helpers the `quinn_bench` example (`quic`) includes too.
mod support {
    #[cfg(feature = "quinn")]
    pub mod quic;
}

mod alloc;
mod core;
#[cfg(feature = "quinn")]
mod examples;
mod field_bugs;
mod gso_edges;
mod loopback;
mod netns;
mod pacing;
#[cfg(feature = "quinn")]
mod quinn;
mod reuseport;
#[cfg(feature = "tokio")]
mod tokio;
#[cfg(feature = "uring")]
mod uring;
mod zerocopy;
