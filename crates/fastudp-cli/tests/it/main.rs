//! The command's integration tests: one test binary, `it`, with a module
//! per command or area (`cargo test -p fastudp-cli --test it -- quic::`
//! runs one). Each test runs the `fastudp` binary that cargo built for it.

mod common;

mod args;
mod axum_clients;
mod bench;
mod control;
mod docs;
mod doctor;
mod fleet;
mod h3_attacks;
mod interrupt;
mod ops;
mod proxy;
mod proxy_web;
mod quic;
mod quic_clients;
mod quic_load;
mod rx_accounting;
mod serve_ops;
mod stream;
mod testbed;
mod tune;
mod txrx;
