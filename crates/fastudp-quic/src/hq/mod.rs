//! hq-interop: HTTP/0.9 over QUIC, as the QUIC interop runner uses it.
//!
//! [`wire`] is the protocol without I/O: the request parser, the response
//! pattern a client checks, and the video frame clock.

pub mod wire;
