//! `fastudp-cli/src/engine/seq.rs`: sequence-number windows, which the
//! stream receiver's accounting uses.

#[path = "../../crates/fastudp-cli/src/engine/seq.rs"]
pub mod seq;
