//! HTTP/3 with the `h3` crate over the engine's connections.
//!
//! - `backend`: h3's QUIC traits (`h3::quic`) over the
//!   `quinn_proto::Connection` the engine drives, with the wakes quinn's
//!   connection driver would give.
//! - `task`: one future per connection runs h3's server and its requests,
//!   polled by the engine when woken, with no runtime and no spawn.
//! - [`handler`]: the [`Handler`] seam that answers requests, and the
//!   built-in `/bytes/N` and `/video/RATE/SECONDS` endpoints.
//!
//! What a connection makes h3 hold, beyond the transport's windows: one
//! frame (at most [`CHUNK`] bytes of body plus its header) per stream
//! being written, the header block of each request being read (at most
//! [`REQUEST_STREAM_CAP`]), what each of the peer's unidirectional streams
//! sent (at most [`UNI_STREAM_CAP`] each, three streams), a sleeping
//! timer per request, and one finished-stream id per request until the
//! accept loop takes it. h3's QPACK is stateless (no dynamic table), so
//! no decoder state grows.

// The engine's application glue drives `backend` and `task`; until then
// only the tests do.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod backend;
pub mod handler;
pub(crate) mod task;
#[cfg(test)]
mod tests;

pub use handler::{Body, Builtin, Content, Handler, Next, Reply, Route, CHUNK};
pub use task::{MAX_FIELD_SECTION, REQUEST_STREAM_CAP, UNI_STREAM_CAP};

/// The ALPN token of HTTP/3.
pub const ALPN: &[u8] = b"h3";
