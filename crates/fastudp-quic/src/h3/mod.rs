//! HTTP/3 with the `h3` crate over the engine's connections.
//!
//! - `backend`: h3's QUIC traits (`h3::quic`) over the
//!   `quinn_proto::Connection` the engine drives, with the wakes quinn's
//!   connection driver would give.
//! - `task`: one future per connection runs h3's server and its requests,
//!   polled by the engine when woken, with no runtime and no spawn.
//! - [`H3App`]: the engine's application for ALPN `h3`; register it in a
//!   [`crate::app::Router`] beside hq-interop to serve both on one port.
//! - [`handler`]: the [`Handler`] seam that answers requests, and the
//!   built-in `/bytes/N` and `/video/RATE/SECONDS` endpoints.
//! - [`service`]: any `tower::Service` (an axum `Router`) answering
//!   requests with async futures, streaming request and response bodies
//!   ([`H3App::service`]); `executor`: each worker's tokio runtime they
//!   run in.
//!
//! What a connection makes h3 hold, beyond the transport's windows: one
//! frame (at most [`CHUNK`] bytes of body plus its header) per stream
//! being written, the header block of each request being read (at most
//! [`REQUEST_STREAM_CAP`]), the frame being read on the peer's control
//! stream (at most [`CONTROL_FRAME_MAX`]), the type of each of its QPACK
//! streams (their bytes wait in the transport window), a sleeping
//! timer per request, and one finished-stream id per request until the
//! accept loop takes it. h3's QPACK is stateless (no dynamic table), so
//! no decoder state grows.

mod app;
pub(crate) mod backend;
mod executor;
mod files;
mod guard;
pub mod handler;
pub mod service;
pub(crate) mod task;
#[cfg(test)]
mod tests;

pub use app::{builtin_handler, H3App, MakeHandler, PatternContent};
pub use files::FilesHandler;
pub use handler::{Body, Builtin, Content, Handler, Next, Reply, Route, CHUNK};
pub use service::{Alpn, BoxError, RequestBody, RequestBodyError};
pub use task::{CONTROL_FRAME_MAX, MAX_FIELD_SECTION, REQUEST_STREAM_CAP};

/// The ALPN token of HTTP/3.
pub const ALPN: &[u8] = b"h3";

/// HTTP/3's error codes (RFC 9114 8.1) that the engine's HTTP/3 sends,
/// in a stream's reset or STOP_SENDING or a connection's close.
pub mod code {
    /// No error: a connection closed cleanly.
    pub const H3_NO_ERROR: u64 = 0x100;
    /// A peer violated the protocol in a way no more specific code says.
    pub const H3_GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    /// An internal error: a handler that panicked after its response's
    /// head was sent has its stream reset with it.
    pub const H3_INTERNAL_ERROR: u64 = 0x102;
    /// A stream the connection needs (a control stream) was closed.
    pub const H3_CLOSED_CRITICAL_STREAM: u64 = 0x104;
    /// The peer generates excessive load: an oversized frame, an eviction
    /// when the server is full, a response without progress.
    pub const H3_EXCESSIVE_LOAD: u64 = 0x107;
    /// A request refused before any processing (past a GOAWAY); it may be
    /// retried.
    pub const H3_REQUEST_REJECTED: u64 = 0x10b;
    /// The request ended before it was whole (its header section not
    /// within the request timeout).
    pub const H3_REQUEST_INCOMPLETE: u64 = 0x10d;
    /// A malformed message: a request body that does not match its
    /// `content-length`.
    pub const H3_MESSAGE_ERROR: u64 = 0x10e;
}
