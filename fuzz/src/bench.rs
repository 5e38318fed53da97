//! `fastudp-cli/src/bench/seq.rs`: sequence-number windows, which the
//! stream receiver's accounting uses.

#[path = "../../crates/fastudp-cli/src/bench/seq.rs"]
pub mod seq;
