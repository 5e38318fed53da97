//! `fastudp-cli/src/host`: the sysctl list, device names and tune's state
//! file.

#[path = "../../crates/fastudp-cli/src/host/devices.rs"]
pub mod devices;
#[path = "../../crates/fastudp-cli/src/host/sysctl.rs"]
pub mod sysctl;
pub mod tune;
