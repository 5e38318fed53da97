//! The engine's integration tests: one test binary, `it`
//! (`cargo test -p fastudp-quic --test it -- engine::altsvc::` runs the
//! Alt-Svc server's).

mod axum;
mod engine;
