//! A bound on the frames of a peer's HTTP/3 control stream, and on the
//! frames other than DATA of a request stream.
//!
//! h3 reads a whole frame into memory before it decodes it, and the
//! control stream lives as long as the connection, so neither a cap on the
//! stream's bytes nor the transport window bounds what h3 holds. This
//! guard reads only the stream type and each frame's type and length
//! (RFC 9114 6.2, 7.1; QUIC varints, RFC 9000 16) as the bytes pass to h3,
//! and refuses a frame longer than its limit before h3 buffers it. It
//! decodes nothing else: h3 does the protocol.
//!
//! On a request stream ([`FrameGuard::request`]) h3 reads a HEADERS frame
//! (the head, trailers) or an unknown frame whole as well, but streams a
//! DATA frame's payload as it arrives: DATA frames pass at any length (the
//! request body, read as the application asks, bounded by the stream's
//! window), every other frame is held to the limit.

/// What the guard found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Within the bounds.
    Fine,
    /// A frame longer than the limit (its length).
    TooLong(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the stream type.
    StreamType,
    /// Not a control stream: h3 reads only its type (QPACK streams are
    /// held unread, unknown ones stopped), so the transport window bounds
    /// it.
    Pass,
    /// Reading a frame's type.
    FrameType,
    /// Reading a frame's length.
    FrameLen,
    /// Inside a frame's payload: this many bytes left.
    Payload(u64),
}

/// Tracks one unidirectional stream of the peer's.
#[derive(Debug, Clone)]
pub(crate) struct FrameGuard {
    state: State,
    /// The varint being read.
    var: [u8; 8],
    var_len: usize,
    max_frame: u64,
    /// A request stream: no stream type, DATA frames unbounded.
    request: bool,
    /// The type of the frame whose length is being read.
    frame_type: u64,
}

/// The length of a QUIC varint from its first byte.
fn varint_len(first: u8) -> usize {
    1 << (first >> 6)
}

fn varint_value(b: &[u8]) -> u64 {
    let mut v = u64::from(b[0] & 0x3f);
    for x in &b[1..] {
        v = (v << 8) | u64::from(*x);
    }
    v
}

impl FrameGuard {
    /// A guard refusing frames longer than `max_frame` bytes.
    pub(crate) fn new(max_frame: u64) -> Self {
        FrameGuard {
            state: State::StreamType,
            var: [0; 8],
            var_len: 0,
            max_frame,
            request: false,
            frame_type: 0,
        }
    }

    /// A guard for a request stream: frames other than DATA longer than
    /// `max_frame` are refused.
    pub(crate) fn request(max_frame: u64) -> Self {
        FrameGuard {
            state: State::FrameType,
            request: true,
            ..FrameGuard::new(max_frame)
        }
    }

    /// Whether it guards a request stream (else a control stream).
    pub(crate) fn is_request(&self) -> bool {
        self.request
    }

    /// Takes the next bytes of the stream.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> Verdict {
        while !data.is_empty() {
            match self.state {
                State::Pass => return Verdict::Fine,
                State::Payload(left) => {
                    let n = left.min(data.len() as u64);
                    data = &data[n as usize..];
                    self.state = if n == left {
                        State::FrameType
                    } else {
                        State::Payload(left - n)
                    };
                }
                State::StreamType | State::FrameType | State::FrameLen => {
                    self.var[self.var_len] = data[0];
                    self.var_len += 1;
                    data = &data[1..];
                    if self.var_len < varint_len(self.var[0]) {
                        continue;
                    }
                    let v = varint_value(&self.var[..self.var_len]);
                    self.var_len = 0;
                    self.state = match self.state {
                        // 0x00: the control stream.
                        State::StreamType if v == 0 => State::FrameType,
                        State::StreamType => State::Pass,
                        State::FrameType => {
                            self.frame_type = v;
                            State::FrameLen
                        }
                        // 0x00: DATA, whose payload h3 streams.
                        _ if self.request && self.frame_type == 0 && v > 0 => State::Payload(v),
                        _ if v > self.max_frame => return Verdict::TooLong(v),
                        _ if v == 0 => State::FrameType,
                        _ => State::Payload(v),
                    };
                }
            }
        }
        Verdict::Fine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_within_the_limit_pass_in_any_split() {
        // Control stream; SETTINGS (4) of 3 bytes; a grease frame type
        // 0x21 of 2 bytes; GOAWAY (7) with a 2-byte varint length 0x4005
        // would be too long for 100, so a 1-byte length here.
        let bytes = [
            0x00, 0x04, 0x03, 1, 2, 3, 0x21, 0x02, 9, 9, 0x07, 0x01, 0x00,
        ];
        for split in 0..bytes.len() {
            let mut g = FrameGuard::new(100);
            assert_eq!(g.feed(&bytes[..split]), Verdict::Fine);
            assert_eq!(g.feed(&bytes[split..]), Verdict::Fine);
            assert_eq!(g.state, State::FrameType, "split {split}");
        }
    }

    #[test]
    fn a_long_frame_is_refused_before_its_payload() {
        // Control stream, frame type 0x21, length 0x4005 (2-byte varint).
        let mut g = FrameGuard::new(16 * 1024);
        assert_eq!(g.feed(&[0x00, 0x21, 0x40]), Verdict::Fine);
        assert_eq!(g.feed(&[0x05]), Verdict::Fine);
        let mut g = FrameGuard::new(100);
        assert_eq!(
            g.feed(&[0x00, 0x21, 0x80, 0x01, 0x00, 0x00]),
            Verdict::TooLong(65536)
        );
        // A 4-byte frame type is read whole first.
        let mut g = FrameGuard::new(100);
        assert_eq!(
            g.feed(&[0x00, 0x80, 0, 0, 0x21, 0x41, 0x00]),
            Verdict::TooLong(256)
        );
    }

    #[test]
    fn a_request_stream_passes_data_of_any_length_and_bounds_the_rest() {
        // HEADERS (1) of 3 bytes, DATA (0) of 2^20 bytes, then a HEADERS
        // frame (trailers) of 256 bytes, over a limit of 100.
        let mut g = FrameGuard::request(100);
        assert_eq!(g.feed(&[0x01, 0x03, 1, 2, 3]), Verdict::Fine);
        assert_eq!(g.feed(&[0x00, 0x80, 0x10, 0x00, 0x00]), Verdict::Fine);
        let body = vec![7u8; 1 << 20];
        for piece in body.chunks(1000) {
            assert_eq!(g.feed(piece), Verdict::Fine);
        }
        assert_eq!(g.state, State::FrameType);
        assert_eq!(g.feed(&[0x01, 0x41, 0x00]), Verdict::TooLong(256));
        // An unknown frame type is held to the limit too.
        let mut g = FrameGuard::request(100);
        assert_eq!(g.feed(&[0x21, 0x41, 0x00]), Verdict::TooLong(256));
        assert!(g.is_request());
    }

    #[test]
    fn other_streams_are_not_read() {
        // QPACK encoder stream (2): whatever follows is not looked at.
        let mut g = FrameGuard::new(1);
        assert_eq!(g.feed(&[0x02, 0x3f, 0xff, 0xff]), Verdict::Fine);
        assert_eq!(g.state, State::Pass);
        // A grease stream type with a 2-byte varint.
        let mut g = FrameGuard::new(1);
        assert_eq!(g.feed(&[0x40, 0x21, 0xff]), Verdict::Fine);
        assert_eq!(g.state, State::Pass);
    }
}
