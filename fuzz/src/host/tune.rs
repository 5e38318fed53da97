//! `fastudp-cli/src/host/tune`: a setting tune changes, and the state file
//! that lists them.

#[path = "../../../crates/fastudp-cli/src/host/tune/change.rs"]
pub mod change;
#[path = "../../../crates/fastudp-cli/src/host/tune/state.rs"]
pub mod state;
