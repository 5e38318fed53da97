//! What this host's UDP depends on: `fastudp doctor` checks it, `fastudp
//! tune` changes it.

pub mod devices;
pub mod doctor;
pub mod netlink;
pub mod routes;
pub mod sysctl;
pub mod tune;
