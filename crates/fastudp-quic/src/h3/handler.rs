//! What answers an HTTP/3 request: the [`Handler`] seam, response
//! [`Body`] sources, and the built-in `/bytes/N` and `/video/RATE/SECONDS`
//! endpoints ([`Builtin`]).
//!
//! A handler answers a request's head synchronously with a [`Reply`]: the
//! response head and, unless there is none (HEAD, 404), a body. The
//! connection's task then pulls the body chunk by chunk, each at most
//! [`CHUNK`] bytes, and sends a chunk only once the previous one was taken
//! by the QUIC stream (so a slow reader pins one chunk here and its send
//! window in quinn-proto). A body may ask to wait until an instant (video
//! frames); the task sleeps on the connection's timer, which the engine
//! reads through the application's `timeout()`.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The largest chunk a body is asked for at once (64 KiB).
pub const CHUNK: usize = 64 * 1024;

/// What a body gives next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Bytes to send (at most the `max` asked for, never empty).
    Data(Bytes),
    /// Nothing before this instant: ask again then.
    Wait(Instant),
    /// The body is complete.
    End,
}

/// A response body, pulled chunk by chunk (a file read with `pread`, a
/// pattern, timed video frames).
pub trait Body {
    /// The next piece, of at most `max` bytes. An error resets the stream
    /// with `H3_INTERNAL_ERROR` (the head was already sent).
    fn next(&mut self, now: Instant, max: usize) -> io::Result<Next>;
}

/// A handler's answer to one request.
pub struct Reply {
    /// Status and headers (the task sends them as they are).
    pub head: Response<()>,
    /// The body, or `None` for a response without one.
    pub body: Option<Box<dyn Body>>,
}

impl Reply {
    /// A response with `status`, `content-length: 0` and no body.
    pub fn empty(status: StatusCode) -> Reply {
        let mut head = Response::new(());
        *head.status_mut() = status;
        head.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(0u64));
        Reply { head, body: None }
    }

    /// 404 Not Found.
    pub fn not_found() -> Reply {
        Reply::empty(StatusCode::NOT_FOUND)
    }

    /// 200 with `content-length: len` and `body` (dropped for HEAD).
    pub fn ok(method: &Method, len: u64, body: Box<dyn Body>) -> Reply {
        let mut head = Response::new(());
        head.headers_mut()
            .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
        let body = (method != Method::HEAD).then_some(body);
        Reply { head, body }
    }
}

/// Answers HTTP/3 requests. One per worker thread (it need not be `Send`);
/// the static-file handler and [`Builtin`] implement it.
pub trait Handler {
    /// The answer to `req` (its head; a GET has no body to read). Called
    /// once per request, on the worker thread, at `now`. The request
    /// carries the connection's [`crate::app::ConnInfo`] as an extension
    /// (over HTTP/3 from [`crate::h3::H3App`], and over TCP from
    /// [`crate::altsvc`], whose `worker` is the TCP connection's number).
    fn handle(&self, req: &Request<()>, now: Instant) -> Reply;
}

/// What a built-in path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/bytes/N`: N bytes of the pattern.
    Bytes(u64),
    /// `/video/RATE/SECONDS`: `count` frames of `bytes` each, one every
    /// `interval`, the first at once.
    Video {
        /// Bytes per frame.
        bytes: u64,
        /// Number of frames.
        count: u64,
        /// Time between frames.
        interval: Duration,
    },
}

/// The content the built-in endpoints serve, the same over hq-interop and
/// HTTP/3: how a path is parsed and which bytes the pattern has.
pub trait Content {
    /// What `path` asks for, or `None` when it is not a built-in path.
    fn route(&self, path: &str) -> Option<Route>;
    /// `len` bytes (`len` ≤ [`CHUNK`]) of the pattern, from offset `off`.
    fn pattern(&self, off: u64, len: usize) -> Bytes;
}

/// `/bytes/N` and `/video/RATE/SECONDS` for GET and HEAD; any other path
/// goes to the fallback handler (static files), or is 404; any other
/// method is 405.
pub struct Builtin<C> {
    content: Rc<C>,
    fallback: Option<Rc<dyn Handler>>,
}

impl<C: Content + 'static> Builtin<C> {
    /// The built-in endpoints over `content`, 404 elsewhere.
    pub fn new(content: C) -> Self {
        Builtin {
            content: Rc::new(content),
            fallback: None,
        }
    }

    /// Paths that are not built in go to `fallback`.
    pub fn with_fallback(mut self, fallback: Rc<dyn Handler>) -> Self {
        self.fallback = Some(fallback);
        self
    }
}

impl<C: Content + 'static> Handler for Builtin<C> {
    fn handle(&self, req: &Request<()>, now: Instant) -> Reply {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = Reply::empty(StatusCode::METHOD_NOT_ALLOWED);
            r.head.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD"),
            );
            return r;
        }
        match self.content.route(req.uri().path()) {
            Some(Route::Bytes(n)) => Reply::ok(
                req.method(),
                n,
                Box::new(PatternBody {
                    content: self.content.clone(),
                    off: 0,
                    end: n,
                }),
            ),
            Some(Route::Video {
                bytes,
                count,
                interval,
            }) => Reply::ok(
                req.method(),
                bytes.saturating_mul(count),
                Box::new(VideoBody {
                    content: self.content.clone(),
                    start: now,
                    frame: bytes,
                    count,
                    interval,
                    sent: 0,
                }),
            ),
            None => match &self.fallback {
                Some(f) => f.handle(req, now),
                None => Reply::not_found(),
            },
        }
    }
}

/// `end - off` more bytes of the pattern.
struct PatternBody<C> {
    content: Rc<C>,
    off: u64,
    end: u64,
}

impl<C: Content> Body for PatternBody<C> {
    fn next(&mut self, _now: Instant, max: usize) -> io::Result<Next> {
        let left = self.end - self.off;
        if left == 0 {
            return Ok(Next::End);
        }
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(max)
            .min(CHUNK);
        let b = self.content.pattern(self.off, n);
        if b.is_empty() || b.len() > n {
            return Err(io::Error::other("the pattern source gave a wrong length"));
        }
        self.off += b.len() as u64;
        Ok(Next::Data(b))
    }
}

/// Frames of the pattern, each due at `start + k * interval`.
struct VideoBody<C> {
    content: Rc<C>,
    start: Instant,
    frame: u64,
    count: u64,
    interval: Duration,
    /// Bytes sent so far.
    sent: u64,
}

impl<C: Content> Body for VideoBody<C> {
    fn next(&mut self, now: Instant, max: usize) -> io::Result<Next> {
        let total = self.frame.saturating_mul(self.count);
        if self.sent >= total {
            return Ok(Next::End);
        }
        // The frame the next byte belongs to, and when it is due.
        let k = self.sent / self.frame.max(1);
        let due = self.start + self.interval * u32::try_from(k).unwrap_or(u32::MAX);
        if now < due {
            return Ok(Next::Wait(due));
        }
        let frame_end = (k + 1).saturating_mul(self.frame).min(total);
        let n = usize::try_from(frame_end - self.sent)
            .unwrap_or(usize::MAX)
            .min(max)
            .min(CHUNK);
        let b = self.content.pattern(self.sent, n);
        if b.is_empty() || b.len() > n {
            return Err(io::Error::other("the pattern source gave a wrong length"));
        }
        self.sent += b.len() as u64;
        Ok(Next::Data(b))
    }
}
