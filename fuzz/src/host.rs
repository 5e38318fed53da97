//! `fastudp-cli/src/host`: the sysctl list and tune's state file.

#[path = "../../crates/fastudp-cli/src/host/sysctl.rs"]
pub mod sysctl;
pub mod tune;
