//! Static files: a request path mapped to a regular file beneath one
//! directory, without a way out.
//!
//! The part every protocol shares (hq-interop and HTTP/3 both call it):
//!
//! 1. [`request_path`] turns the request target into a relative path. It
//!    is pure code on bytes (and fuzzed): it strips `?query` and `#frag`,
//!    percent-decodes once, and refuses `%00`, a NUL, invalid UTF-8, an
//!    absolute path after decoding (`//etc`, `/%2Fetc`) and any `..`
//!    component (`/../`, `/%2e%2e/`). An empty path or one ending in `/`
//!    names `index.html`.
//! 2. [`Root`] opens that path beneath its directory with
//!    `open_beneath` (`openat2(2)` with `RESOLVE_BENEATH |
//!    RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`). The kernel is the
//!    judge: it refuses `..` and absolute paths even where the parser
//!    would miss one, and it refuses **every** symbolic link, including
//!    one whose target stays inside the directory. That is stricter than
//!    "nothing outside the directory" and is deliberate: a link checked
//!    and then followed can be changed in between, a link refused cannot.
//!    Then `fstat`: a directory serves its `index.html` (opened beneath
//!    the directory's own descriptor, with the same rules); anything but
//!    a regular file (FIFO, socket, device) is 404.
//! 3. [`Response`] carries the status, `Content-Type` (by extension,
//!    [`content_type`]), `Content-Length` (from `st_size`), the
//!    `Content-Range` of a single `Range` ([`byte_range`]), and for a
//!    `GET` a [`FileBody`], read with `pread` in chunks of at most
//!    [`CHUNK`] bytes, one at a time, as the caller's flow control lets
//!    it write, into buffers the root reuses (zeroed once, when first
//!    allocated; at most [`FREE_BUFFERS`] kept). Files are never mapped (a file truncated while mapped
//!    kills the process with `SIGBUS`) nor read whole.
//!
//! | outcome | status | counted in [`FileStats`] |
//! |---|---|---|
//! | a regular file | 200, or 206 for a satisfiable single range | `served` |
//! | `Range` past the end | 416 | `unsatisfiable` |
//! | `..` or absolute (parser), `ELOOP`/`EXDEV` (kernel) | 404 | `escapes_refused` |
//! | `ENOENT`, `ENOTDIR`, `ENAMETOOLONG`, not a regular file | 404 | `not_found` |
//! | `EACCES` | 403 | `forbidden` |
//! | a malformed target (bad `%`, NUL, not UTF-8, not `/...`) | 400 | `bad_requests` |
//! | no descriptor left: the server's or the client address's share ([`Descriptors`]), `EMFILE`, `ENFILE` | 503 | `unavailable` |
//! | any other error | 500 | `errors` |
//!
//! An escape answers 404, like a missing file, so a client learns nothing
//! about what lies outside. Each open [`FileBody`] holds one file
//! descriptor, counted in the root's [`Descriptors`] server-wide and
//! against the client's address (an IPv6 /64) until the body is dropped
//! (docs/SECURITY.md, "Descriptors").

mod beneath;

use beneath::open_beneath;
use bytes::Bytes;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The most bytes one [`FileBody`] read returns (64 KiB).
pub const CHUNK: usize = 64 * 1024;

/// The longest request path accepted, in bytes after percent-decoding
/// (Linux's `PATH_MAX`); a longer one is [`PathError::TooLong`].
pub const MAX_PATH: usize = 4096;

/// The file served for a directory.
pub const INDEX: &str = "index.html";

/// A request path that passed [`request_path`]: relative, decoded, UTF-8,
/// without NUL or a `..` component, not empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath(String);

impl RelPath {
    /// The path, relative to the served directory.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path as a [`Path`].
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

/// Why [`request_path`] refused a request target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathError {
    /// Not empty and not starting with `/` (RFC 9112's origin form).
    NotOrigin,
    /// A `%` not followed by two hexadecimal digits.
    BadEscape,
    /// A NUL byte, raw or as `%00`.
    Nul,
    /// Not UTF-8 after decoding.
    NotUtf8,
    /// Absolute after decoding (`//etc/passwd`, `/%2Fetc/passwd`).
    Absolute,
    /// A `..` component (`/../x`, `/%2e%2e/x`).
    DotDot,
    /// Longer than [`MAX_PATH`] bytes.
    TooLong,
}

impl PathError {
    /// True for the refusals that are attempts to leave the directory
    /// (answered 404 and counted as escapes), false for a malformed
    /// target (400).
    pub fn is_escape(self) -> bool {
        matches!(self, PathError::Absolute | PathError::DotDot)
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::NotOrigin => "the request path does not start with '/'",
            PathError::BadEscape => "a '%' not followed by two hexadecimal digits",
            PathError::Nul => "a NUL byte in the request path",
            PathError::NotUtf8 => "the request path is not UTF-8",
            PathError::Absolute => "an absolute path after decoding",
            PathError::DotDot => "a '..' component in the request path",
            PathError::TooLong => "the request path is too long",
        })
    }
}

impl std::error::Error for PathError {}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Maps a request target (`/a/b%20c.html?x=1`) to a path relative to the
/// served directory.
///
/// In order: everything from the first `?` or `#` is dropped; the target
/// must then be empty or start with `/`, which is removed; `%XX` is
/// decoded once (so `%252e` is the literal name `%2e`, and `%2F` is a
/// `/`); the result must hold no NUL, be UTF-8, not start with `/` and
/// have no `..` component. An empty path or one ending in `/` gets
/// [`INDEX`] appended. `.` components and repeated slashes are left to
/// the kernel, which resolves them inside the directory.
pub fn request_path(target: &[u8]) -> Result<RelPath, PathError> {
    let end = target
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(target.len());
    let raw = &target[..end];
    // Decoding shrinks by at most 3 to 1: bound the work before it.
    if raw.len() > 3 * MAX_PATH + 1 {
        return Err(PathError::TooLong);
    }
    let rest = match raw {
        [] => raw,
        [b'/', rest @ ..] => rest,
        _ => return Err(PathError::NotOrigin),
    };
    let mut out = Vec::with_capacity(rest.len() + INDEX.len());
    let mut i = 0;
    while i < rest.len() {
        if rest[i] == b'%' {
            let (h, l) = match (rest.get(i + 1), rest.get(i + 2)) {
                (Some(&h), Some(&l)) => (h, l),
                _ => return Err(PathError::BadEscape),
            };
            let (h, l) = hex(h).zip(hex(l)).ok_or(PathError::BadEscape)?;
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(rest[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(PathError::Nul);
    }
    if out.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    let mut s = String::from_utf8(out).map_err(|_| PathError::NotUtf8)?;
    if s.starts_with('/') {
        return Err(PathError::Absolute);
    }
    if s.split('/').any(|c| c == "..") {
        return Err(PathError::DotDot);
    }
    if s.is_empty() || s.ends_with('/') {
        s.push_str(INDEX);
    }
    Ok(RelPath(s))
}

/// The `Content-Type` for a file name, by its extension (ASCII case
/// ignored): html/htm, css, js/mjs, json, png, jpg/jpeg, gif, svg, webp,
/// ico, mp4, wasm, txt; anything else is `application/octet-stream`.
pub fn content_type(name: &str) -> &'static str {
    let base = name.rsplit('/').next().unwrap_or(name);
    let Some((_, ext)) = base.rsplit_once('.') else {
        return "application/octet-stream";
    };
    const TABLE: &[(&str, &str)] = &[
        ("html", "text/html; charset=utf-8"),
        ("htm", "text/html; charset=utf-8"),
        ("css", "text/css; charset=utf-8"),
        ("js", "text/javascript; charset=utf-8"),
        ("mjs", "text/javascript; charset=utf-8"),
        ("json", "application/json"),
        ("png", "image/png"),
        ("jpg", "image/jpeg"),
        ("jpeg", "image/jpeg"),
        ("gif", "image/gif"),
        ("svg", "image/svg+xml"),
        ("webp", "image/webp"),
        ("ico", "image/x-icon"),
        ("mp4", "video/mp4"),
        ("wasm", "application/wasm"),
        ("txt", "text/plain; charset=utf-8"),
    ];
    TABLE
        .iter()
        .find(|(e, _)| e.eq_ignore_ascii_case(ext))
        .map_or("application/octet-stream", |&(_, t)| t)
}

/// What a `Range` header asks of a representation of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Serve the whole file (200): no range, several ranges, another unit,
    /// or a header that does not parse (which RFC 9110 lets a server
    /// ignore).
    Whole,
    /// Serve bytes `start..end` (206).
    Part {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// No byte of it exists (416).
    Unsatisfiable,
}

/// Parses a `Range` header value against a file of `size` bytes: a single
/// `bytes=a-b`, `bytes=a-` or `bytes=-n` (RFC 9110 14.1.2).
///
/// `b` past the end is cut to the end; `a` at or past the end, and
/// `-0`, are unsatisfiable. Several ranges are answered with the whole
/// file, as RFC 9110 allows (no multipart responses). For an empty file
/// a suffix range is answered with the whole (empty) file.
pub fn byte_range(header: &[u8], size: u64) -> RangeAnswer {
    let h = header.trim_ascii();
    let Some(eq) = h.iter().position(|&b| b == b'=') else {
        return RangeAnswer::Whole;
    };
    let (unit, spec) = (h[..eq].trim_ascii(), h[eq + 1..].trim_ascii());
    if !unit.eq_ignore_ascii_case(b"bytes") || spec.contains(&b',') {
        return RangeAnswer::Whole;
    }
    let Some(dash) = spec.iter().position(|&b| b == b'-') else {
        return RangeAnswer::Whole;
    };
    let (a, b) = (&spec[..dash], &spec[dash + 1..]);
    // Digits only, saturating: a number past u64 is past any file.
    let num = |s: &[u8]| -> Option<u64> {
        (!s.is_empty() && s.iter().all(u8::is_ascii_digit)).then(|| {
            s.iter().fold(0u64, |n, &d| {
                n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
            })
        })
    };
    if a.is_empty() {
        let Some(n) = num(b) else {
            return RangeAnswer::Whole;
        };
        return match (n, size) {
            (0, _) => RangeAnswer::Unsatisfiable,
            (_, 0) => RangeAnswer::Whole,
            _ => RangeAnswer::Part {
                start: size.saturating_sub(n),
                end: size,
            },
        };
    }
    let Some(start) = num(a) else {
        return RangeAnswer::Whole;
    };
    let last = if b.is_empty() {
        u64::MAX
    } else {
        match num(b) {
            Some(l) if l >= start => l,
            _ => return RangeAnswer::Whole,
        }
    };
    if start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Part {
        start,
        end: last.saturating_add(1).min(size),
    }
}

/// The request method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Headers and body.
    Get,
    /// The same headers, no body. `Range` is ignored (RFC 9110 defines
    /// range handling for GET only).
    Head,
}

/// The status of a [`Response`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// 200: the whole file.
    Ok,
    /// 206: one range of it.
    PartialContent,
    /// 400: a malformed request target.
    BadRequest,
    /// 403: the file exists and may not be read (`EACCES`).
    Forbidden,
    /// 404: no such file, not a regular file, or an escape refused.
    NotFound,
    /// 416: the range lies past the end.
    RangeNotSatisfiable,
    /// 500: anything else.
    InternalError,
    /// 503: no file descriptor left for this request (the server's, or
    /// its client address's share); the client may try again.
    ServiceUnavailable,
}

impl Status {
    /// The HTTP status code.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::PartialContent => 206,
            Status::BadRequest => 400,
            Status::Forbidden => 403,
            Status::NotFound => 404,
            Status::RangeNotSatisfiable => 416,
            Status::InternalError => 500,
            Status::ServiceUnavailable => 503,
        }
    }

    /// True for 200 and 206.
    pub fn is_success(self) -> bool {
        matches!(self, Status::Ok | Status::PartialContent)
    }
}

/// The answer to one request: status, headers and, for a `GET` that
/// succeeded, the body to stream.
#[derive(Debug)]
#[non_exhaustive]
pub struct Response {
    /// The status.
    pub status: Status,
    /// `Content-Type`, for 200 and 206.
    pub content_type: Option<&'static str>,
    /// `Content-Length`: the bytes a `GET` sends (for `HEAD`, what it
    /// would send); 0 for an error.
    pub content_length: u64,
    /// `Content-Range`, for 206 (`bytes a-b/size`) and 416 (`bytes */size`).
    pub content_range: Option<String>,
    /// The body of a successful `GET`; `None` for `HEAD` and errors.
    pub body: Option<FileBody>,
}

impl Response {
    fn error(status: Status) -> Response {
        Response {
            status,
            content_type: None,
            content_length: 0,
            content_range: None,
            body: None,
        }
    }

    /// The response's header fields, lower-case, as HTTP/2 and HTTP/3
    /// write them: `content-type`, `content-length`, `content-range` where
    /// they apply, and `accept-ranges: bytes` on success.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = Vec::with_capacity(4);
        if let Some(t) = self.content_type {
            h.push(("content-type", t.to_string()));
        }
        h.push(("content-length", self.content_length.to_string()));
        if let Some(r) = &self.content_range {
            h.push(("content-range", r.clone()));
        }
        if self.status.is_success() {
            h.push(("accept-ranges", "bytes".to_string()));
        }
        h
    }
}

/// A file's bytes `off..end`, read on demand in chunks of at most
/// [`CHUNK`] bytes with `pread` (`FileExt::read_at`).
///
/// It holds the file descriptor and at most one chunk; the caller writes
/// chunk by chunk as flow control allows, so a slow reader pins no more
/// than its window plus one chunk. A file that shrinks while it is served
/// gives an `UnexpectedEof` error (the caller resets the stream: the
/// promised `Content-Length` cannot be met); one that grows is served up
/// to the length announced.
pub struct FileBody {
    file: File,
    off: u64,
    end: u64,
    held: Bytes,
    /// Where its chunks' buffers come from and go back to.
    bufs: Arc<Buffers>,
    /// Its descriptor's place, given back when the body is dropped.
    _fd: Permit,
}

impl fmt::Debug for FileBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The held chunk by its length: its bytes are the file's.
        f.debug_struct("FileBody")
            .field("file", &self.file)
            .field("off", &self.off)
            .field("end", &self.end)
            .field("held", &self.held.len())
            .finish()
    }
}

impl FileBody {
    /// Bytes not yet handed out by [`next_chunk`](Self::next_chunk) or
    /// consumed from [`chunk`](Self::chunk).
    pub fn remaining(&self) -> u64 {
        self.held.len() as u64 + (self.end - self.off)
    }

    /// True once every byte has been handed out.
    pub fn is_done(&self) -> bool {
        self.remaining() == 0
    }

    /// The chunk to write next, read from the file when the last one was
    /// used up; empty at the end. A writer that takes only part of it
    /// (`write_chunks` advances the `Bytes` in place) leaves the rest for
    /// the next call, so nothing is read twice and nothing is lost.
    pub fn chunk(&mut self) -> io::Result<&mut Bytes> {
        if self.held.is_empty() && self.off < self.end {
            self.held = self.read_next()?;
        }
        Ok(&mut self.held)
    }

    /// Takes the next chunk (`None` at the end).
    pub fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let c = std::mem::take(self.chunk()?);
        Ok((!c.is_empty()).then_some(c))
    }

    /// Takes the next chunk of at most `max` bytes (at least 1): one read
    /// of that many into a buffer of its own size, so that what a chunk
    /// holds is its length (`None` at the end).
    pub fn next_chunk_max(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        let max = max.max(1);
        if !self.held.is_empty() {
            let n = self.held.len().min(max);
            return Ok(Some(self.held.split_to(n)));
        }
        if self.off >= self.end {
            return Ok(None);
        }
        self.read_max(max).map(Some)
    }

    fn read_next(&mut self) -> io::Result<Bytes> {
        self.read_max(CHUNK)
    }

    /// Reads the next chunk of at most `max` (and [`CHUNK`]) bytes.
    fn read_max(&mut self, max: usize) -> io::Result<Bytes> {
        let n = (self.end - self.off).min(CHUNK.min(max) as u64) as usize;
        let mut buf = self.bufs.take(n);
        let mut got = 0;
        while got < n {
            match self.file.read_at(&mut buf[got..n], self.off + got as u64) {
                Ok(0) => {
                    self.bufs.give(buf);
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was served",
                    ));
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.bufs.give(buf);
                    return Err(e);
                }
            }
        }
        self.off += n as u64;
        Ok(Bytes::from_owner(Lease {
            buf,
            len: n,
            bufs: self.bufs.clone(),
        }))
    }
}

/// The most free read buffers a [`Root`] keeps for reuse (64 of
/// [`CHUNK`] bytes: 4 MiB), shared by its responses.
pub const FREE_BUFFERS: usize = 64;

/// Read buffers of [`CHUNK`] bytes, reused: a chunk handed out lends its
/// buffer, which comes back here when the last `Bytes` of it is dropped
/// (once the QUIC stream no longer holds any of its bytes). A buffer is
/// zeroed once, when it is first allocated, and then only ever
/// overwritten by `pread`; a chunk shows only the bytes read into it.
/// At most [`FREE_BUFFERS`] wait here; the rest are freed.
#[derive(Debug, Default)]
struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl Buffers {
    /// A buffer of at least `n` bytes (`n` ≤ [`CHUNK`]): a free one, or a
    /// new one (of [`CHUNK`] bytes, or of `n` for a last, short chunk,
    /// which is not kept).
    fn take(&self, n: usize) -> Vec<u8> {
        // A whole chunk reuses a kept buffer; a shorter one (a file's
        // end, a range, a bounded read) gets one of its own size, so that
        // no 64 KiB buffer is held for a few bytes.
        if n == CHUNK {
            if let Some(b) = self.free.lock().ok().and_then(|mut f| f.pop()) {
                return b;
            }
        }
        vec![0u8; n]
    }

    /// Keeps `buf` for reuse if it is a whole one and there is room.
    fn give(&self, buf: Vec<u8>) {
        if buf.len() != CHUNK {
            return;
        }
        if let Ok(mut f) = self.free.lock() {
            if f.len() < FREE_BUFFERS {
                f.push(buf);
            }
        }
    }
}

/// A chunk's buffer while `Bytes` of it live (`Bytes::from_owner`).
struct Lease {
    buf: Vec<u8>,
    len: usize,
    bufs: Arc<Buffers>,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.bufs.give(std::mem::take(&mut self.buf));
    }
}

/// What a [`Root`] has answered, by outcome (see the module's table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileStats {
    /// Requests answered.
    pub requests: u64,
    /// 200 and 206.
    pub served: u64,
    /// 404 for a missing or non-regular file.
    pub not_found: u64,
    /// 404 for a path that tried to leave the directory: `..` or absolute
    /// (refused by the parser), a symbolic link or an escape the kernel
    /// refused (`ELOOP`, `EXDEV`).
    pub escapes_refused: u64,
    /// 403.
    pub forbidden: u64,
    /// 400.
    pub bad_requests: u64,
    /// 416.
    pub unsatisfiable: u64,
    /// 500.
    pub errors: u64,
    /// 503: no descriptor left for the request ([`Descriptors`]).
    pub unavailable: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    served: AtomicU64,
    not_found: AtomicU64,
    escapes_refused: AtomicU64,
    forbidden: AtomicU64,
    bad_requests: AtomicU64,
    unsatisfiable: AtomicU64,
    errors: AtomicU64,
    unavailable: AtomicU64,
}

thread_local! {
    static PEER: std::cell::Cell<Option<std::net::IpAddr>> = const { std::cell::Cell::new(None) };
}

/// The client a thread answers now, for [`Descriptors`]' per-address
/// share: set while the engine's worker drives a connection (and by the
/// TCP listener's thread for its connection), cleared when dropped.
/// Requests answered with no client set count under one shared key.
#[derive(Debug)]
pub struct Peer(Option<std::net::IpAddr>);

impl Peer {
    /// Sets the thread's client to `ip` until the guard is dropped.
    pub fn set(ip: std::net::IpAddr) -> Peer {
        Peer(PEER.with(|p| p.replace(Some(ip))))
    }

    fn current() -> Option<std::net::IpAddr> {
        PEER.with(|p| p.get())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        PEER.with(|p| p.set(self.0));
    }
}

/// The file descriptors responses may hold open: at most `total`
/// server-wide and `per_address` for one client address (an IPv6 /64).
/// A request past either is answered 503 and counted.
#[derive(Debug)]
pub struct Descriptors {
    total: usize,
    per_address: usize,
    held: std::sync::Mutex<(
        usize,
        std::collections::HashMap<Option<std::net::IpAddr>, usize>,
    )>,
}

/// Descriptors kept out of [`Descriptors::from_limit`]'s share for the
/// process itself: sockets, the TCP listener's connections, logs.
pub const RESERVED_DESCRIPTORS: u64 = 1024;
/// One client address may hold this fraction of the descriptors for
/// responses ([`Descriptors::from_limit`]).
pub const DESCRIPTOR_SHARE: usize = 8;

impl Descriptors {
    /// At most `total` open at once, `per_address` for one address (each
    /// at least 1).
    pub fn new(total: usize, per_address: usize) -> Descriptors {
        Descriptors {
            total: total.max(1),
            per_address: per_address.clamp(1, total.max(1)),
            held: Default::default(),
        }
    }

    /// The bound for a process whose open-file limit is `limit`: half of
    /// what is left after [`RESERVED_DESCRIPTORS`] (at least half of the
    /// limit when that is less), and an eighth of it per address.
    pub fn from_limit(limit: u64) -> Descriptors {
        let total = if limit > 2 * RESERVED_DESCRIPTORS {
            (limit - RESERVED_DESCRIPTORS) / 2
        } else {
            limit / 2
        };
        let total = usize::try_from(total).unwrap_or(usize::MAX).max(1);
        Descriptors::new(total, (total / DESCRIPTOR_SHARE).max(1))
    }

    /// The bound for this process's open-file limit now (its soft
    /// `RLIMIT_NOFILE`; 1,024 where it cannot be read).
    pub fn from_process() -> Descriptors {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Descriptors::from_limit(limit)
    }

    /// At most this many open server-wide.
    pub fn total(&self) -> usize {
        self.total
    }

    /// At most this many open for one client address.
    pub fn per_address(&self) -> usize {
        self.per_address
    }

    /// Descriptors held now.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn take(self: &std::sync::Arc<Self>) -> Option<Permit> {
        let key = Peer::current().map(crate::limits::address_key);
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.0 >= self.total {
            return None;
        }
        let n = h.1.entry(key).or_insert(0);
        if *n >= self.per_address {
            return None;
        }
        *n += 1;
        h.0 += 1;
        Some(Permit {
            of: self.clone(),
            key,
        })
    }

    fn give(&self, key: Option<std::net::IpAddr>) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.0 -= 1;
        if let Some(n) = h.1.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                h.1.remove(&key);
            }
        }
    }
}

/// One descriptor's place in a [`Descriptors`].
struct Permit {
    of: std::sync::Arc<Descriptors>,
    key: Option<std::net::IpAddr>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.of.give(self.key);
    }
}

/// The served directory: an open directory descriptor that every request
/// path is resolved beneath. Shared by all workers (`Arc<Root>`); its
/// counters are atomic.
#[derive(Debug)]
pub struct Root {
    dir: File,
    counts: Counters,
    fds: std::sync::Arc<Descriptors>,
    bufs: Arc<Buffers>,
}

impl Root {
    /// Opens the directory `dir` (following a symbolic link in `dir`
    /// itself: that is the operator's choice, not a client's) and checks
    /// that `openat2(2)` works here. Without it this fails with the error
    /// of `openat2(2)` (see `open_beneath`): files are never served by a
    /// weaker method.
    pub fn open(dir: &Path) -> io::Result<Root> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        open_beneath(f.as_fd(), Path::new("."))?;
        Ok(Root {
            dir: f,
            counts: Counters::default(),
            fds: std::sync::Arc::new(Descriptors::from_process()),
            bufs: Arc::default(),
        })
    }

    /// Bounds the descriptors its responses hold with `d` (by default
    /// [`Descriptors::from_process`], from the open-file limit when the
    /// root was opened).
    pub fn descriptors(mut self, d: Descriptors) -> Root {
        self.fds = std::sync::Arc::new(d);
        self
    }

    /// The bound on the descriptors its responses hold.
    pub fn descriptor_limits(&self) -> &Descriptors {
        &self.fds
    }

    /// Answers one request for `target` (the request path as received,
    /// percent-encoded, maybe with a query), with the value of its
    /// `Range` header if any.
    pub fn respond(&self, method: Method, target: &[u8], range: Option<&[u8]>) -> Response {
        let c = &self.counts;
        c.requests.fetch_add(1, Relaxed);
        let (r, counter) = match self.answer(method, target, range) {
            Ok(r) if r.status == Status::RangeNotSatisfiable => (r, &c.unsatisfiable),
            Ok(r) => (r, &c.served),
            Err(Fail::Escape) => (Response::error(Status::NotFound), &c.escapes_refused),
            Err(Fail::Status(s)) => (
                Response::error(s),
                match s {
                    Status::BadRequest => &c.bad_requests,
                    Status::Forbidden => &c.forbidden,
                    Status::NotFound => &c.not_found,
                    Status::ServiceUnavailable => &c.unavailable,
                    _ => &c.errors,
                },
            ),
        };
        counter.fetch_add(1, Relaxed);
        r
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> FileStats {
        let c = &self.counts;
        FileStats {
            requests: c.requests.load(Relaxed),
            served: c.served.load(Relaxed),
            not_found: c.not_found.load(Relaxed),
            escapes_refused: c.escapes_refused.load(Relaxed),
            forbidden: c.forbidden.load(Relaxed),
            bad_requests: c.bad_requests.load(Relaxed),
            unsatisfiable: c.unsatisfiable.load(Relaxed),
            errors: c.errors.load(Relaxed),
            unavailable: c.unavailable.load(Relaxed),
        }
    }

    /// Opens `path` beneath the directory; a directory gives its
    /// `index.html`. The file, its size and the name its type comes from.
    fn open_file(&self, path: &RelPath) -> Result<(File, u64, bool), Fail> {
        let f = open_beneath(self.dir.as_fd(), path.as_path()).map_err(|e| refused(&e))?;
        let m = f.metadata().map_err(|e| refused(&e))?;
        let (f, m, index) = if m.is_dir() {
            let f = open_beneath(f.as_fd(), Path::new(INDEX)).map_err(|e| refused(&e))?;
            let m = f.metadata().map_err(|e| refused(&e))?;
            (f, m, true)
        } else {
            (f, m, false)
        };
        if !m.is_file() {
            return Err(Fail::Status(Status::NotFound));
        }
        Ok((f, m.len(), index))
    }

    fn answer(
        &self,
        method: Method,
        target: &[u8],
        range: Option<&[u8]>,
    ) -> Result<Response, Fail> {
        let path = request_path(target).map_err(|e| {
            if e.is_escape() {
                Fail::Escape
            } else {
                Fail::Status(Status::BadRequest)
            }
        })?;
        // A descriptor's place first: a request past the bound opens
        // nothing.
        let permit = self
            .fds
            .take()
            .ok_or(Fail::Status(Status::ServiceUnavailable))?;
        let (file, size, index) = self.open_file(&path)?;
        let ctype = content_type(if index { INDEX } else { path.as_str() });
        let answer = match (method, range) {
            (Method::Get, Some(h)) => byte_range(h, size),
            _ => RangeAnswer::Whole,
        };
        let (status, start, end, content_range) = match answer {
            RangeAnswer::Whole => (Status::Ok, 0, size, None),
            RangeAnswer::Part { start, end } => (
                Status::PartialContent,
                start,
                end,
                Some(format!("bytes {start}-{}/{size}", end - 1)),
            ),
            RangeAnswer::Unsatisfiable => {
                let mut r = Response::error(Status::RangeNotSatisfiable);
                r.content_range = Some(format!("bytes */{size}"));
                return Ok(r);
            }
        };
        Ok(Response {
            status,
            content_type: Some(ctype),
            content_length: end - start,
            content_range,
            body: (method == Method::Get).then_some(FileBody {
                file,
                off: start,
                end,
                held: Bytes::new(),
                bufs: self.bufs.clone(),
                _fd: permit,
            }),
        })
    }
}

/// Why a request gets no file: a status, or an escape (404, counted apart).
enum Fail {
    Status(Status),
    Escape,
}

/// The answer to an error of `open_beneath` or `fstat`.
fn refused(e: &io::Error) -> Fail {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) => Fail::Status(Status::NotFound),
        Some(libc::ELOOP | libc::EXDEV) => Fail::Escape,
        Some(libc::EACCES) => Fail::Status(Status::Forbidden),
        Some(libc::EMFILE | libc::ENFILE) => Fail::Status(Status::ServiceUnavailable),
        _ => Fail::Status(Status::InternalError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn ok(t: &str) -> String {
        request_path(t.as_bytes())
            .unwrap_or_else(|e| panic!("{t:?}: {e}"))
            .0
    }

    fn err(t: &[u8]) -> PathError {
        match request_path(t) {
            Ok(p) => panic!("{:?} accepted as {:?}", String::from_utf8_lossy(t), p.0),
            Err(e) => e,
        }
    }

    #[test]
    fn request_paths_map_to_relative_names() {
        assert_eq!(ok("/a.html"), "a.html");
        assert_eq!(ok("/dir/b%20c.txt"), "dir/b c.txt");
        assert_eq!(ok("/a.html?x=/../../etc#frag"), "a.html");
        assert_eq!(ok("/a.html#x"), "a.html");
        assert_eq!(ok(""), "index.html");
        assert_eq!(ok("/"), "index.html");
        assert_eq!(ok("/?q"), "index.html");
        assert_eq!(ok("/dir/"), "dir/index.html");
        // Decoded once: %25 is '%', and what it spells stays literal.
        assert_eq!(ok("/%252e%252e/x"), "%2e%2e/x");
        // %2F is a '/', judged after decoding.
        assert_eq!(ok("/dir%2Fb.txt"), "dir/b.txt");
        // '.' components and repeated slashes are left to the kernel.
        assert_eq!(ok("/./a//b"), "./a//b");
        assert_eq!(ok("/a..b/..c/d.."), "a..b/..c/d..");
        assert_eq!(ok("/%C3%A9t%C3%A9"), "été");
        assert_eq!(ok("/%3F.txt"), "?.txt");
    }

    #[test]
    fn request_paths_that_escape_are_refused() {
        use PathError::*;
        for t in [
            &b"/.."[..],
            b"/../etc/passwd",
            b"/a/../../etc/passwd",
            b"/a/..",
            b"/%2e%2e/etc/passwd",
            b"/%2E%2E%2Fetc",
            b"/.%2e/x",
            b"/a/%2e%2e",
            b"/..%2f",
        ] {
            assert_eq!(err(t), DotDot, "{}", String::from_utf8_lossy(t));
        }
        for t in [&b"//etc/passwd"[..], b"/%2Fetc/passwd", b"/%2f", b"///"] {
            assert_eq!(err(t), Absolute, "{}", String::from_utf8_lossy(t));
        }
        assert!(DotDot.is_escape() && Absolute.is_escape());
    }

    #[test]
    fn malformed_request_paths_are_refused() {
        use PathError::*;
        assert_eq!(err(b"a.html"), NotOrigin);
        assert_eq!(err(b"../a"), NotOrigin);
        assert_eq!(err(b"http://x/a"), NotOrigin);
        assert_eq!(err(b"/a%"), BadEscape);
        assert_eq!(err(b"/a%2"), BadEscape);
        assert_eq!(err(b"/a%zz"), BadEscape);
        assert_eq!(err(b"/a%00.html"), Nul);
        assert_eq!(err(b"/a\0.html"), Nul);
        assert_eq!(err(b"/%ff%fe"), NotUtf8);
        assert_eq!(err(b"/\xc3"), NotUtf8);
        let long = format!("/{}", "a".repeat(MAX_PATH + 1));
        assert_eq!(err(long.as_bytes()), TooLong);
        let long = format!("/{}", "%41".repeat(MAX_PATH + 1));
        assert_eq!(err(long.as_bytes()), TooLong);
        assert_eq!(ok(&format!("/{}", "a".repeat(MAX_PATH))).len(), MAX_PATH);
        for e in [NotOrigin, BadEscape, Nul, NotUtf8, TooLong] {
            assert!(!e.is_escape(), "{e}");
        }
    }

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(content_type("a/B.JPG"), "image/jpeg");
        assert_eq!(content_type("x.jpeg"), "image/jpeg");
        assert_eq!(content_type("app.wasm"), "application/wasm");
        assert_eq!(content_type("m.mp4"), "video/mp4");
        assert_eq!(content_type("s.svg"), "image/svg+xml");
        assert_eq!(content_type("a.tar.gz"), "application/octet-stream");
        assert_eq!(content_type("README"), "application/octet-stream");
        // The extension of the file, not of a directory.
        assert_eq!(content_type("d.html/file"), "application/octet-stream");
        assert_eq!(content_type("dir/.css"), "text/css; charset=utf-8");
    }

    #[test]
    fn ranges() {
        use RangeAnswer::*;
        let r = |h: &str| byte_range(h.as_bytes(), 100);
        assert_eq!(r("bytes=0-9"), Part { start: 0, end: 10 });
        assert_eq!(
            r("bytes=90-"),
            Part {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=-10"),
            Part {
                start: 90,
                end: 100
            }
        );
        assert_eq!(r("bytes=-1000"), Part { start: 0, end: 100 });
        assert_eq!(
            r("bytes=50-1000"),
            Part {
                start: 50,
                end: 100
            }
        );
        assert_eq!(
            r("bytes=99-99"),
            Part {
                start: 99,
                end: 100
            }
        );
        assert_eq!(r(" Bytes = 1-2 "), Part { start: 1, end: 3 });
        assert_eq!(
            r("bytes=0-99999999999999999999999"),
            Part { start: 0, end: 100 }
        );
        assert_eq!(r("bytes=100-"), Unsatisfiable);
        assert_eq!(r("bytes=100-200"), Unsatisfiable);
        assert_eq!(r("bytes=99999999999999999999999-"), Unsatisfiable);
        assert_eq!(r("bytes=-0"), Unsatisfiable);
        // Several ranges, another unit, nonsense: the whole file.
        for h in [
            "bytes=0-1,5-6",
            "bytes=0-1, 200-300",
            "items=0-1",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=1",
            "bytes=-",
            "bytes=+1-2",
            "bytes=0x1-2",
            "bytes",
            "",
        ] {
            assert_eq!(r(h), Whole, "{h:?}");
        }
        // An empty file: a suffix gets the (empty) whole, a start is past
        // the end.
        assert_eq!(byte_range(b"bytes=-5", 0), Whole);
        assert_eq!(byte_range(b"bytes=0-", 0), Unsatisfiable);
    }

    /// A fresh directory under the system's temporary directory, removed
    /// when dropped.
    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// `t/www` is served; `t/secret` lies beside it.
    fn site(tag: &str) -> (TempDir, Root) {
        let t = TempDir(std::env::temp_dir().join(format!(
            "fastudp-files-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        )));
        let www = t.0.join("www");
        for d in ["sub", "noindex", "img", "idxdir/index.html"] {
            std::fs::create_dir_all(www.join(d)).unwrap();
        }
        std::fs::write(www.join("index.html"), b"<p>home</p>").unwrap();
        std::fs::write(www.join("sub/index.html"), b"<p>sub</p>").unwrap();
        std::fs::write(www.join("a.txt"), b"0123456789").unwrap();
        std::fs::write(www.join("img/pic.png"), b"\x89PNG").unwrap();
        std::fs::write(www.join("empty.css"), b"").unwrap();
        std::fs::write(t.0.join("secret"), b"outside").unwrap();
        fn ln(to: impl AsRef<Path>, at: PathBuf) -> io::Result<()> {
            std::os::unix::fs::symlink(to, at)
        }
        ln("a.txt", www.join("link-in")).unwrap();
        ln("../secret", www.join("link-out")).unwrap();
        ln(t.0.join("secret"), www.join("link-abs")).unwrap();
        ln("sub", www.join("dirlink")).unwrap();
        ln("a.txt", www.join("noindex/index.html")).unwrap();
        let root = Root::open(&www).unwrap();
        (t, root)
    }

    fn body(r: &mut Response) -> Vec<u8> {
        let b = r.body.as_mut().expect("a body");
        let mut v = Vec::new();
        while let Some(c) = b.next_chunk().unwrap() {
            assert!(c.len() <= CHUNK);
            v.extend_from_slice(&c);
        }
        assert!(b.is_done());
        assert_eq!(v.len() as u64, r.content_length);
        v
    }

    fn get(root: &Root, t: &str) -> Response {
        root.respond(Method::Get, t.as_bytes(), None)
    }

    #[test]
    fn serves_files_and_index_html() {
        let (_t, root) = site("serve");
        let mut r = get(&root, "/a.txt?v=2");
        assert_eq!(r.status, Status::Ok);
        assert_eq!(r.content_type, Some("text/plain; charset=utf-8"));
        assert_eq!(body(&mut r), b"0123456789");
        assert_eq!(
            r.headers(),
            [
                ("content-type", "text/plain; charset=utf-8".to_string()),
                ("content-length", "10".to_string()),
                ("accept-ranges", "bytes".to_string()),
            ]
        );
        for (t, want) in [
            ("/", &b"<p>home</p>"[..]),
            ("", b"<p>home</p>"),
            ("/sub/", b"<p>sub</p>"),
            // A directory without the slash: its index.html, no redirect.
            ("/sub", b"<p>sub</p>"),
        ] {
            let mut r = get(&root, t);
            assert_eq!(r.status, Status::Ok, "{t}");
            assert_eq!(r.content_type, Some("text/html; charset=utf-8"), "{t}");
            assert_eq!(body(&mut r), want, "{t}");
        }
        let mut r = get(&root, "/img/pic.png");
        assert_eq!(r.content_type, Some("image/png"));
        assert_eq!(body(&mut r), b"\x89PNG");
        let mut r = get(&root, "/empty.css");
        assert_eq!((r.status, r.content_length), (Status::Ok, 0));
        assert_eq!(body(&mut r), b"");
        let s = root.stats();
        assert_eq!((s.requests, s.served), (7, 7));
    }

    #[test]
    fn head_has_the_headers_and_no_body() {
        let (_t, root) = site("head");
        let r = root.respond(Method::Head, b"/a.txt", Some(b"bytes=0-1"));
        // Range applies to GET only.
        assert_eq!(r.status, Status::Ok);
        assert_eq!(r.content_length, 10);
        assert!(r.body.is_none());
        let r = root.respond(Method::Head, b"/missing", None);
        assert_eq!(r.status, Status::NotFound);
    }

    #[test]
    fn missing_and_special_files_are_404() {
        let (t, root) = site("missing");
        assert_eq!(get(&root, "/missing.html").status, Status::NotFound);
        assert_eq!(get(&root, "/a.txt/x").status, Status::NotFound);
        assert_eq!(get(&root, "/a.txt/").status, Status::NotFound);
        // A directory with no index.html, and one whose index.html is a
        // directory.
        assert_eq!(get(&root, "/img/").status, Status::NotFound);
        assert_eq!(get(&root, "/idxdir/").status, Status::NotFound);
        let long = format!("/{}", "n".repeat(300));
        assert_eq!(get(&root, &long).status, Status::NotFound);
        let mut n = 6;
        if std::process::Command::new("mkfifo")
            .arg(t.0.join("www/fifo"))
            .status()
            .is_ok_and(|s| s.success())
        {
            // Opened without blocking (O_NONBLOCK), then refused by fstat.
            assert_eq!(get(&root, "/fifo").status, Status::NotFound);
            n += 1;
        } else {
            eprintln!("mkfifo(1) failed: the FIFO case did not run");
        }
        let s = root.stats();
        assert_eq!((s.not_found, s.escapes_refused), (n, 0));
    }

    #[test]
    fn escapes_are_refused_and_counted() {
        let (_t, root) = site("escape");
        let escapes = [
            // The parser's refusals.
            "/../secret",
            "/%2e%2e/secret",
            "/sub/%2E%2E/%2e%2e/secret",
            "/%2Fetc/passwd",
            "//etc/passwd",
            // The kernel's: every symbolic link, in or out, file or
            // directory, and an index.html that is one.
            "/link-out",
            "/link-abs",
            "/link-in",
            "/dirlink/index.html",
            "/dirlink/",
            "/noindex/",
        ];
        for t in escapes {
            let r = get(&root, t);
            assert_eq!(r.status, Status::NotFound, "{t}");
            assert!(r.body.is_none() && r.content_type.is_none(), "{t}");
        }
        let s = root.stats();
        assert_eq!(s.escapes_refused, escapes.len() as u64);
        assert_eq!((s.served, s.not_found), (0, 0));
        // The served name for a double-encoded dot-dot is literal.
        assert_eq!(get(&root, "/%252e%252e/secret").status, Status::NotFound);
        assert_eq!(root.stats().not_found, 1);
    }

    #[test]
    fn the_kernel_refuses_what_the_parser_would_let_through() {
        // Straight to the open, past request_path: the kernel alone judges.
        let (_t, root) = site("kernel");
        for p in ["../secret", "/etc/passwd", "sub/../../secret", "link-out"] {
            let r = root.open_file(&RelPath(p.to_string()));
            assert!(matches!(r, Err(Fail::Escape)), "{p}");
        }
    }

    #[test]
    fn malformed_targets_are_400() {
        let (_t, root) = site("bad");
        for t in [&b"/a%zz"[..], b"/a%00", b"/\xff", b"a.txt"] {
            let r = root.respond(Method::Get, t, None);
            assert_eq!(r.status, Status::BadRequest);
        }
        assert_eq!(root.stats().bad_requests, 4);
    }

    #[test]
    fn unreadable_files_are_403_unless_root() {
        use std::os::unix::fs::PermissionsExt;
        let (t, root) = site("perm");
        let p = t.0.join("www/private.txt");
        std::fs::write(&p, b"private").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        let r = get(&root, "/private.txt");
        // Root (CAP_DAC_OVERRIDE) reads a mode-0 file: EACCES cannot be
        // provoked, and the file is served. Anyone else gets 403.
        let is_root = std::fs::read(&p).is_ok();
        if is_root {
            eprintln!("running with CAP_DAC_OVERRIDE: EACCES cannot occur, 403 untested");
            assert_eq!(r.status, Status::Ok);
        } else {
            assert_eq!(r.status, Status::Forbidden);
            assert_eq!(root.stats().forbidden, 1);
        }
    }

    #[test]
    fn ranges_are_served() {
        let (_t, root) = site("range");
        let get_r = |h: &str| root.respond(Method::Get, b"/a.txt", Some(h.as_bytes()));
        let mut r = get_r("bytes=2-4");
        assert_eq!(r.status, Status::PartialContent);
        assert_eq!(r.content_range.as_deref(), Some("bytes 2-4/10"));
        assert_eq!(body(&mut r), b"234");
        assert!(r
            .headers()
            .contains(&("content-range", "bytes 2-4/10".to_string())));
        let mut r = get_r("bytes=-3");
        assert_eq!(r.content_range.as_deref(), Some("bytes 7-9/10"));
        assert_eq!(body(&mut r), b"789");
        let mut r = get_r("bytes=8-");
        assert_eq!(body(&mut r), b"89");
        let r = get_r("bytes=10-");
        assert_eq!(r.status, Status::RangeNotSatisfiable);
        assert_eq!(r.content_range.as_deref(), Some("bytes */10"));
        assert!(r.body.is_none());
        let mut r = get_r("bytes=0-1,4-5");
        assert_eq!(r.status, Status::Ok);
        assert_eq!(body(&mut r), b"0123456789");
        let s = root.stats();
        assert_eq!((s.served, s.unsatisfiable), (4, 1));
    }

    #[test]
    fn large_files_stream_in_chunks() {
        let (t, root) = site("large");
        let data: Vec<u8> = (0..(3 * CHUNK + 123) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(t.0.join("www/big.bin"), &data).unwrap();
        let mut r = get(&root, "/big.bin");
        assert_eq!(r.content_type, Some("application/octet-stream"));
        let b = r.body.as_mut().unwrap();
        // A writer that takes part of a chunk leaves the rest in place.
        let c = b.chunk().unwrap();
        assert_eq!(c.len(), CHUNK);
        let first = c.split_to(1000);
        assert_eq!(b.remaining(), data.len() as u64 - 1000);
        let mut got = first.to_vec();
        let mut sizes = Vec::new();
        while let Some(c) = b.next_chunk().unwrap() {
            sizes.push(c.len());
            got.extend_from_slice(&c);
        }
        assert_eq!(sizes, [CHUNK - 1000, CHUNK, CHUNK, 123]);
        assert!(got == data, "the bytes differ");
        // A range across chunk boundaries.
        let (a, z) = (CHUNK as u64 - 5, 2 * CHUNK as u64 + 7);
        let h = format!("bytes={a}-{z}");
        let mut r = root.respond(Method::Get, b"/big.bin", Some(h.as_bytes()));
        assert!(body(&mut r) == data[a as usize..=z as usize]);
    }

    #[test]
    fn read_buffers_are_reused_and_show_only_their_bytes() {
        let (t, root) = site("reuse");
        let a: Vec<u8> = (0..(2 * CHUNK + 10) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        let b: Vec<u8> = (0..(2 * CHUNK) as u32).map(|i| (i % 13) as u8).collect();
        std::fs::write(t.0.join("www/a.bin"), &a).unwrap();
        std::fs::write(t.0.join("www/b.bin"), &b).unwrap();
        let mut r = get(&root, "/a.bin");
        let body_a = r.body.as_mut().unwrap();
        let c = body_a.next_chunk().unwrap().unwrap();
        assert!(c == a[..CHUNK]);
        let at = c.as_ptr();
        drop(c);
        // The next whole chunk lands in the same buffer.
        let c = body_a.next_chunk().unwrap().unwrap();
        assert_eq!(c.as_ptr(), at, "the buffer was not reused");
        assert!(c == a[CHUNK..2 * CHUNK]);
        // The last 10 bytes get a buffer of their own size, not a kept
        // 64 KiB one.
        let end = body_a.next_chunk().unwrap().unwrap();
        assert!(end == a[2 * CHUNK..]);
        drop(end);
        assert!(body_a.next_chunk().unwrap().is_none());
        // A chunk still held (by a stream that has not had all of it
        // acknowledged) keeps its buffer: the next read goes elsewhere
        // and leaves its bytes as they were.
        let mut r = get(&root, "/b.bin");
        let body_b = r.body.as_mut().unwrap();
        let first = body_b.next_chunk().unwrap().unwrap();
        let other = first.as_ptr();
        assert_ne!(other, at, "a buffer still held was reused");
        assert!(first == b[..CHUNK]);
        assert!(c == a[CHUNK..2 * CHUNK]);
        drop(c);
        let second = body_b.next_chunk().unwrap().unwrap();
        assert_eq!(second.as_ptr(), at, "a free buffer is taken first");
        assert!(second == b[CHUNK..]);
        // A slice of a chunk keeps the whole buffer until it is dropped.
        let tail = first.slice(CHUNK - 1..);
        drop((first, second));
        let mut r = get(&root, "/b.bin");
        let again = r.body.as_mut().unwrap().next_chunk().unwrap().unwrap();
        assert_eq!(again.as_ptr(), at);
        assert!(again == b[..CHUNK]);
        assert_eq!(tail[..], b[CHUNK - 1..CHUNK]);
        assert_eq!(tail.as_ptr(), other.wrapping_add(CHUNK - 1));
    }

    #[test]
    fn bounded_chunks_hold_no_more_than_asked() {
        use bytes::Buf;
        let (t, root) = site("bounded");
        let data: Vec<u8> = (0..(2 * CHUNK + 7) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(t.0.join("www/big.bin"), &data).unwrap();
        // A whole chunk first, kept for reuse when dropped.
        let mut r = get(&root, "/big.bin");
        let whole = r.body.as_mut().unwrap().next_chunk().unwrap().unwrap();
        let kept = whole.as_ptr();
        drop((whole, r));
        let mut r = get(&root, "/big.bin");
        let b = r.body.as_mut().unwrap();
        let (mut got, mut sizes) = (Vec::new(), Vec::new());
        while let Some(c) = b.next_chunk_max(16 * 1024).unwrap() {
            assert_ne!(c.as_ptr(), kept, "a 64 KiB buffer held for a 16 KiB chunk");
            sizes.push(c.len());
            got.extend_from_slice(&c);
        }
        assert!(got == data, "the bytes differ");
        assert!(sizes.iter().all(|&n| n <= 16 * 1024), "{sizes:?}");
        assert_eq!(sizes.len(), 9, "{sizes:?}");
        // A range of one byte is one byte.
        let mut r = root.respond(Method::Get, b"/big.bin", Some(b"bytes=5-5"));
        let c = r.body.as_mut().unwrap().next_chunk_max(1).unwrap().unwrap();
        assert_eq!(c[..], data[5..6]);
        // What a writer left of a chunk is handed out by the bound too.
        let mut r = get(&root, "/big.bin");
        let b = r.body.as_mut().unwrap();
        b.chunk().unwrap().advance(10);
        let c = b.next_chunk_max(100).unwrap().unwrap();
        assert_eq!(c[..], data[10..110]);
    }

    #[test]
    fn a_file_that_shrinks_while_served_is_an_error() {
        let (t, root) = site("shrink");
        let p = t.0.join("www/big.bin");
        std::fs::write(&p, vec![7u8; 2 * CHUNK]).unwrap();
        let mut r = get(&root, "/big.bin");
        let b = r.body.as_mut().unwrap();
        assert_eq!(b.next_chunk().unwrap().unwrap().len(), CHUNK);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(CHUNK as u64 + 10)
            .unwrap();
        let e = b.next_chunk().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_missing_directory_is_an_error_at_open() {
        let e = Root::open(Path::new("/nonexistent-fastudp-www")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("/nonexistent-fastudp-www"), "{e}");
        let e = Root::open(Path::new("/etc/passwd")).unwrap_err();
        assert_eq!(e.raw_os_error(), None);
        assert!(e.to_string().contains("/etc/passwd"), "{e}");
    }

    /// One address holds at most its share of the descriptors, and the
    /// server at most the total: past either a GET is answered 503 (not
    /// 500) and counted; a descriptor comes back when its body is
    /// dropped. Without a client set, requests share one key.
    #[test]
    fn descriptors_are_bounded_per_address_and_server_wide() {
        let (_t, root) = site("fds");
        let root = root.descriptors(Descriptors::new(5, 2));
        let a: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let b: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let b2: std::net::IpAddr = "2001:db8::2".parse().unwrap();
        let mut held = Vec::new();
        {
            let _p = Peer::set(a);
            held.push(get(&root, "/a.txt"));
            held.push(get(&root, "/a.txt"));
            let r = get(&root, "/a.txt");
            assert_eq!(r.status, Status::ServiceUnavailable);
            assert_eq!(r.status.code(), 503);
            assert!(r.body.is_none());
        }
        {
            // The same /64 is one address.
            let _p = Peer::set(b);
            held.push(get(&root, "/a.txt"));
            let _q = Peer::set(b2);
            held.push(get(&root, "/a.txt"));
            assert_eq!(get(&root, "/a.txt").status, Status::ServiceUnavailable);
        }
        // The fifth, with no client set, fills the server; a sixth from a
        // new address finds none left.
        held.push(get(&root, "/a.txt"));
        assert!(held.iter().all(|r| r.status == Status::Ok));
        assert_eq!(root.descriptor_limits().held(), 5);
        {
            let _p = Peer::set("198.51.100.7".parse().unwrap());
            assert_eq!(get(&root, "/a.txt").status, Status::ServiceUnavailable);
            // A refused request holds none.
            assert_eq!(root.descriptor_limits().held(), 5);
            held.truncate(4);
            assert_eq!(get(&root, "/a.txt").status, Status::Ok);
        }
        assert_eq!(root.descriptor_limits().held(), 4);
        assert_eq!(root.stats().unavailable, 3);
        assert_eq!(root.stats().errors, 0);
        drop(held);
        assert_eq!(root.descriptor_limits().held(), 0);
    }

    /// The bound for an open-file limit keeps 1,024 for the process and
    /// gives one address an eighth of the rest's half.
    #[test]
    fn descriptors_from_the_open_file_limit() {
        let d = Descriptors::from_limit(1024);
        assert_eq!((d.total(), d.per_address()), (512, 64));
        let d = Descriptors::from_limit(65_536);
        assert_eq!((d.total(), d.per_address()), (32_256, 4032));
        let d = Descriptors::from_limit(1);
        assert_eq!((d.total(), d.per_address()), (1, 1));
    }
}
