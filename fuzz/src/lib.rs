//! What the fuzz targets share: a reader for structured inputs, and the
//! CLI's parsers, from the command's library (`fastudp_cli`): the
//! sequence-number windows (`engine::seq`), the sysctl list, device names
//! and tune's state file (`host`), and the stream header and per-flow
//! accounting (`stream`).

pub mod input;

pub use fastudp_cli::{engine, failure, host, stream};
