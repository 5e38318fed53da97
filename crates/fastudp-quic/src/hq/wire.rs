//! HTTP/0.9 over QUIC (`hq-interop`, as the QUIC interop runner uses), the
//! application every stack here serves: a request is `GET /PATH\r\n` on a
//! bidirectional stream; `/bytes/N` returns N bytes, `/video/RATE/SECONDS`
//! streams RATE bytes per second for SECONDS in frames.

use std::time::{Duration, Instant};

/// The ALPN token.
pub const ALPN: &[u8] = b"hq-interop";
/// The longest request line taken; a longer one is refused.
pub const MAX_REQUEST: usize = 1024;
/// The largest `/bytes/N` served (1 TB).
pub const MAX_BYTES: u64 = 1 << 40;
/// Stream error codes a refused request is reset with.
pub mod code {
    /// The request was not `GET /bytes/N` or `GET /video/RATE/SECONDS`
    /// (nor, with `--www`, a well-formed file path).
    pub const BAD_REQUEST: u32 = 0x10;
    /// The request line was longer than [`super::MAX_REQUEST`].
    pub const TOO_LONG: u32 = 0x11;
    /// The server is closing.
    pub const SHUTDOWN: u32 = 0x12;
    /// The request line was not whole within `--request-timeout`.
    pub const REQUEST_TIMEOUT: u32 = 0x13;
    /// A file request (`--www`): no such regular file, or a path that
    /// tried to leave the directory (HTTP's 404).
    pub const NOT_FOUND: u32 = 0x15;
    /// A file request: the file may not be read (HTTP's 403).
    pub const FORBIDDEN: u32 = 0x16;
    /// A file request: the file could not be opened or read (HTTP's 500).
    pub const FILE_ERROR: u32 = 0x17;
    /// A file request: no file descriptor left for it, the server's or
    /// the client address's share (HTTP's 503); it may be tried again.
    pub const UNAVAILABLE: u32 = 0x18;
}
/// The application close code of a server shutting down: no error.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// The application close code of a connection over its address's share
/// (`--max-connections-per-ip`).
pub const CLOSE_ADDRESS_LIMIT: u32 = 0x14;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// N bytes of the pattern.
    Bytes(u64),
    /// `rate` bytes per second for `seconds`.
    Video {
        /// Bytes per second.
        rate: u64,
        /// How long.
        seconds: u64,
    },
}

/// What can be wrong with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRequest {
    /// Longer than [`MAX_REQUEST`] without a line end.
    TooLong,
    /// Not a request served here.
    Invalid,
}

impl BadRequest {
    /// The stream error code.
    pub fn code(self) -> u32 {
        match self {
            BadRequest::TooLong => code::TOO_LONG,
            BadRequest::Invalid => code::BAD_REQUEST,
        }
    }
}

/// Parses what arrived of a request so far. `fin` says the stream ended.
/// `Ok(None)`: wait for more.
pub fn parse(buf: &[u8], fin: bool) -> Result<Option<Request>, BadRequest> {
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) => &buf[..i],
        None if fin => buf,
        None if buf.len() > MAX_REQUEST => return Err(BadRequest::TooLong),
        None => return Ok(None),
    };
    if line.len() > MAX_REQUEST {
        return Err(BadRequest::TooLong);
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|_| BadRequest::Invalid)?;
    let path = line.strip_prefix("GET ").ok_or(BadRequest::Invalid)?;
    let num = |s: &str| -> Result<u64, BadRequest> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(BadRequest::Invalid);
        }
        s.parse().map_err(|_| BadRequest::Invalid)
    };
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "bytes", n] => {
            let n = num(n)?;
            if n > MAX_BYTES {
                return Err(BadRequest::Invalid);
            }
            Ok(Some(Request::Bytes(n)))
        }
        ["", "video", rate, secs] => {
            let (rate, seconds) = (num(rate)?, num(secs)?);
            if rate == 0 || rate > 10_000_000_000 || seconds > 86_400 {
                return Err(BadRequest::Invalid);
            }
            Ok(Some(Request::Video { rate, seconds }))
        }
        _ => Err(BadRequest::Invalid),
    }
}

/// The target of a whole request line `GET TARGET` (CR LF or LF ended,
/// or ended by the stream), as bytes, for a request [`parse`] does not
/// serve itself (a file, with `--www`). `None` when the line is not whole
/// yet, too long, or not a `GET`.
pub fn request_target(buf: &[u8], fin: bool) -> Option<&[u8]> {
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) => &buf[..i],
        None if fin => buf,
        None => return None,
    };
    if line.len() > MAX_REQUEST {
        return None;
    }
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"GET ")
}

/// The byte at offset `i` of every response: a pattern a client checks.
pub fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// Pattern period.
const PERIOD: usize = 251;
/// The pattern, long enough to slice any chunk up to [`CHUNK`] from any
/// phase.
static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
/// The largest piece written at once.
pub const CHUNK: usize = 64 * 1024;

/// Up to `len` bytes of the pattern, from offset `off`.
pub fn pattern(off: u64, len: u64) -> &'static [u8] {
    let p = PATTERN.get_or_init(|| (0..(CHUNK + PERIOD) as u64).map(pattern_byte).collect());
    let at = (off % PERIOD as u64) as usize;
    &p[at..at + (len.min(CHUNK as u64) as usize)]
}

/// Checks received bytes against the pattern; the offset of the first
/// wrong byte.
pub fn check(off: u64, data: &[u8]) -> Result<(), u64> {
    match data
        .iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern_byte(off + i as u64))
    {
        Some((i, _)) => Err(off + i as u64),
        None => Ok(()),
    }
}

/// The frames of a video stream: one every `interval`, `rate * interval`
/// bytes each, `seconds / interval` of them (at least one).
#[derive(Debug, Clone, Copy)]
pub struct Frames {
    /// Bytes per frame.
    pub bytes: u64,
    /// Number of frames.
    pub count: u64,
    /// Time between frames.
    pub interval: Duration,
}

impl Frames {
    /// The frames of `rate` bytes/s for `seconds`.
    pub fn new(rate: u64, seconds: u64, interval: Duration) -> Self {
        let count = ((seconds as f64) / interval.as_secs_f64()).round().max(1.0) as u64;
        let bytes = ((rate as f64) * interval.as_secs_f64()).round().max(1.0) as u64;
        Frames {
            bytes,
            count,
            interval,
        }
    }

    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.bytes * self.count
    }

    /// When frame `k` (from 0) of a stream that started at `start` is due.
    pub fn due_at(&self, start: Instant, k: u64) -> Instant {
        start + self.interval * u32::try_from(k).unwrap_or(u32::MAX)
    }

    /// How many frames are due at `now`: exactly the `k` with
    /// [`Frames::due_at`]`(start, k) <= now` (in whole nanoseconds, so
    /// that a frame whose time has come is never counted as not due yet).
    pub fn due(&self, start: Instant, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(start).as_nanos();
        let k = elapsed / self.interval.as_nanos().max(1) + 1;
        u64::try_from(k).unwrap_or(u64::MAX).min(self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame is due from the very nanosecond of its time on: what the
    /// server's timer is set for is what `due` counts.
    #[test]
    fn frames_are_due_exactly_at_their_time() {
        let f = Frames::new(125_000, 10, Duration::from_millis(40));
        let start = Instant::now();
        for k in [0u64, 1, 7, 100, 249] {
            let t = f.due_at(start, k);
            assert_eq!(f.due(start, t), k + 1, "frame {k}");
            if k > 0 {
                assert_eq!(f.due(start, t - Duration::from_nanos(1)), k);
            }
        }
        assert_eq!(f.due(start, start + Duration::from_secs(100)), f.count);
    }

    #[test]
    fn requests() {
        assert_eq!(
            parse(b"GET /bytes/10\r\n", false),
            Ok(Some(Request::Bytes(10)))
        );
        assert_eq!(parse(b"GET /bytes/10", true), Ok(Some(Request::Bytes(10))));
        assert_eq!(parse(b"GET /bytes/10", false), Ok(None));
        assert_eq!(
            parse(b"GET /video/125000/3\n", false),
            Ok(Some(Request::Video {
                rate: 125_000,
                seconds: 3
            }))
        );
        for bad in [
            &b"GET /bytes/\r\n"[..],
            b"GET /bytes/-1\r\n",
            b"GET /bytes/99999999999999999999999\r\n",
            b"POST /bytes/1\r\n",
            b"GET /video/0/3\r\n",
            b"GET /index.html\r\n",
            b"\xff\xfe\r\n",
        ] {
            assert_eq!(parse(bad, false), Err(BadRequest::Invalid), "{bad:?}");
        }
        let long = vec![b'a'; MAX_REQUEST + 1];
        assert_eq!(parse(&long, false), Err(BadRequest::TooLong));
    }

    #[test]
    fn request_targets() {
        fn t(b: &[u8], fin: bool) -> Option<&[u8]> {
            request_target(b, fin)
        }
        assert_eq!(t(b"GET /index.html\r\n", false), Some(&b"/index.html"[..]));
        assert_eq!(t(b"GET /a%20b?x\nrest", false), Some(&b"/a%20b?x"[..]));
        assert_eq!(t(b"GET /a", true), Some(&b"/a"[..]));
        assert_eq!(t(b"GET /\xff\r\n", false), Some(&b"/\xff"[..]));
        assert_eq!(t(b"GET /a", false), None);
        assert_eq!(t(b"HEAD /a\r\n", false), None);
        assert_eq!(t(b"get /a\r\n", false), None);
        let mut long = b"GET /".to_vec();
        long.resize(MAX_REQUEST + 1, b'a');
        long.push(b'\n');
        assert_eq!(t(&long, false), None);
    }

    #[test]
    fn pattern_slices_match_the_bytes() {
        for off in [0u64, 1, 250, 251, 1_000_003] {
            let p = pattern(off, 5000);
            assert_eq!(p.len(), 5000);
            assert_eq!(check(off, p), Ok(()));
        }
        assert_eq!(check(3, &[3, 4, 0]), Err(5));
        let f = Frames::new(125_000, 3, Duration::from_millis(40));
        assert_eq!((f.bytes, f.count, f.total()), (5000, 75, 375_000));
    }
}
