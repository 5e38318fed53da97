//! The lab's integration tests: one test binary, `it`, with a module per
//! command (`cargo test -p fastudp-lab --test it -- soak::` runs one).
//! Each test runs the `fastudp-lab` binary that cargo built for it.

mod common;

mod attack;
mod figure;
mod soak;
