//! `fastudp stream` and `fastudp stream-rx`: the paper's many-flow paced
//! streaming workload, and its receiving side.
//!
//! Each datagram carries a 16-byte header: the flow id (4 bytes,
//! big-endian, at offset 0: the receivers' reuseport group steers on it),
//! the flow's sequence number (8 bytes, little-endian), and the pacing mode.

mod args;
// Public for the fuzz targets (fuzz/), which feed them datagrams.
pub mod flows;
pub mod header;
mod recv;
mod send;
mod summary;

pub use args::{StreamArgs, StreamRxArgs};
pub use header::{HDR, MAGIC};
pub use recv::run_stream_rx;
pub use send::run_stream;
