//! `fastudp-cli/src/stream`: the datagram header and the receiver's
//! per-flow accounting, which reads it.

#[path = "../../crates/fastudp-cli/src/stream/flows.rs"]
pub mod flows;
#[path = "../../crates/fastudp-cli/src/stream/header.rs"]
pub mod header;

pub use header::{HDR, MAGIC};
