//! The engine's configuration.

use crate::limits;
use quinn_proto::{TransportConfig, VarInt};
use std::time::Duration;

/// The transport settings every stack shares, with `idle_timeout` (whole
/// milliseconds; 10 s where it does not fit a QUIC varint).
pub fn transport(idle_timeout: Duration) -> TransportConfig {
    let mut t = TransportConfig::default();
    t.max_idle_timeout(Some(
        VarInt::from_u64(idle_timeout.as_millis().min(u128::from(u64::MAX)) as u64)
            .unwrap_or(VarInt::from_u32(10_000))
            .into(),
    ));
    // Sized for the application (see [`limits`]): a request is one line
    // of at most 1 KiB; quinn-proto's defaults (1.25 MB per stream, no
    // bound per connection) would let one client park 125 MB.
    t.max_concurrent_bidi_streams(VarInt::from_u32(limits::STREAMS));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.stream_receive_window(VarInt::from_u32(limits::STREAM_WINDOW));
    t.receive_window(VarInt::from_u32(limits::CONN_WINDOW));
    t.crypto_buffer_size(limits::CRYPTO_BUFFER);
    t.send_window(limits::SEND_WINDOW);
    t.datagram_receive_buffer_size(None);
    t.datagram_send_buffer_size(0);
    t
}
