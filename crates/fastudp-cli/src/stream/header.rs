//! The stream's datagram header.

use fastudp_io::pacing::PacingMode;

/// Bytes of the stream header: flow id (4, big-endian), sequence number (8,
/// little-endian), pacing mode (1), and [`MAGIC`] (3).
pub const HDR: usize = 16;

/// The last 3 header bytes, so that `stream-rx` can tell the stream's
/// datagrams from anything else sent to its ports.
pub const MAGIC: &[u8; 3] = b"FUs";

/// The header byte of a pacing mode.
pub fn mode_byte(m: PacingMode) -> u8 {
    match m {
        PacingMode::Kernel => 1,
        PacingMode::User => 2,
        PacingMode::None => 3,
        // A mode this version does not know: `mode_name` says "unknown".
        _ => 0,
    }
}

/// The name of a pacing mode, from its header byte.
pub fn mode_name(b: u8) -> &'static str {
    match b {
        1 => "kernel",
        2 => "user",
        3 => "none",
        _ => "unknown",
    }
}
