//! The command's integration tests: one test binary, `it`, with a module
//! per command or area (`cargo test -p fastudp-cli --test it -- quic::`
//! runs one). Each test runs the `fastudp` binary that cargo built for it.

mod common;
#[path = "../../../fastudp-io/tests/it/support/skip_check.rs"]
mod skip_check;

mod args;
mod bench;
mod control;
mod doctor;
mod h3_attacks;
mod interrupt;
mod proxy;
mod quic;
mod quic_clients;
mod rx_accounting;
mod stream;
mod testbed;
mod tune;
mod txrx;
