//! hq-interop (HTTP/0.9 over QUIC) as an application of the engine:
//! `GET /bytes/N` and `GET /video/RATE/SECONDS` on bidirectional streams
//! ([`crate::hq::wire`] has the protocol).
//!
//! A response is written when its request is whole, then on
//! [`AppEvent::Writable`] (the stream's credit came back) and on
//! [`AppEvent::Timeout`] (a video frame fell due, or a request line's
//! deadline passed): no stream is looked at unless something happened to
//! it. Unidirectional streams are stopped at once (hq-interop uses none;
//! the engine allows three per connection for HTTP/3).
//!
//! With [`HqApp::files`], every other `GET` is a file beneath a directory
//! ([`crate::files`]). The two endpoints come first: `/bytes/N` and
//! `/video/RATE/SECONDS` are answered as always, even if the directory
//! holds a file of that name, so a benchmark's requests never touch the
//! file system; any other target is a file. A file is read in chunks of
//! at most [`crate::files::CHUNK`] as the stream's credit allows. HTTP/0.9
//! has no status line: a refused file request is reset with
//! [`hq::code::NOT_FOUND`] (also for an escape), [`hq::code::FORBIDDEN`],
//! [`hq::code::BAD_REQUEST`] or [`hq::code::FILE_ERROR`].
//!
//! [`HqApp::test_endpoints`]`(false)` turns the two endpoints off: their
//! paths are then files like any other (with [`HqApp::files`]), or reset
//! with [`hq::code::NOT_FOUND`] (without), as any missing path is.

use super::{
    AppCx, AppEvent, Application, ConnApp, ConnInfo, Dir, Read, StreamId, WorkerApp, Write,
};
use crate::files::{FileBody, Method, Root, Status};
use crate::hq::wire::{self as hq, BadRequest, Frames, Request};
use crate::limits;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The hq-interop application.
#[derive(Debug, Clone)]
pub struct HqApp {
    interval: Duration,
    request_timeout: Duration,
    files: Option<Arc<Root>>,
    test_endpoints: bool,
}

impl Default for HqApp {
    /// Frames every 40 ms; [`limits::REQUEST_TIMEOUT`] for a request line;
    /// `/bytes/N` and `/video/RATE/SECONDS` served.
    fn default() -> Self {
        HqApp {
            interval: Duration::from_millis(40),
            request_timeout: limits::REQUEST_TIMEOUT,
            files: None,
            test_endpoints: true,
        }
    }
}

impl HqApp {
    /// Sets the time between the frames of a `/video` response (more
    /// than 0).
    pub fn frame_interval(mut self, d: Duration) -> Self {
        self.interval = d.max(Duration::from_nanos(1));
        self
    }

    /// Sets the time a client has to send a whole request line; a stream
    /// without one by then is reset with [`hq::code::REQUEST_TIMEOUT`] and
    /// counted in [`crate::Counters::request_timeouts`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Serves files beneath `root` for every `GET` that is not `/bytes/N`
    /// or `/video/RATE/SECONDS` (see the module's documentation).
    pub fn files(mut self, root: Arc<Root>) -> Self {
        self.files = Some(root);
        self
    }

    /// Whether `/bytes/N` and `/video/RATE/SECONDS` are served (the
    /// default). Off, their paths are files like any other (with
    /// [`HqApp::files`]) or not found (reset with [`hq::code::NOT_FOUND`]).
    pub fn test_endpoints(mut self, on: bool) -> Self {
        self.test_endpoints = on;
        self
    }
}

impl Application for HqApp {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![hq::ALPN.to_vec()]
    }

    fn worker(&self, _worker: usize) -> Box<dyn WorkerApp> {
        Box::new(self.clone())
    }

    fn close_codes(&self, _alpn: &[u8]) -> super::CloseCodes {
        super::CloseCodes::HQ_INTEROP
    }
}

impl WorkerApp for HqApp {
    fn accept(&mut self, _alpn: &[u8], _info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        Some(Box::new(HqConn {
            streams: HashMap::new(),
            interval: self.interval,
            request_timeout: self.request_timeout,
            files: self.files.clone(),
            test_endpoints: self.test_endpoints,
            file_window: false,
            draining: false,
        }))
    }
}

/// A response in progress on one stream.
enum Resp {
    /// Reading the request line, until `deadline`.
    Reading { buf: Vec<u8>, deadline: Instant },
    /// `/bytes/N`: `off` of `len` written.
    Bytes { off: u64, len: u64 },
    /// `/video/...`: frames released by time; `off` bytes written;
    /// `blocked`: the last write found the stream without credit (an
    /// [`AppEvent::Writable`] follows), so the response waits for that
    /// rather than for its next frame's time.
    Video {
        frames: Frames,
        start: Instant,
        off: u64,
        blocked: bool,
    },
    /// A file (`--www`): what is left of it, and its length.
    File { body: FileBody, len: u64 },
}

/// One connection's requests.
struct HqConn {
    streams: HashMap<StreamId, Resp>,
    interval: Duration,
    request_timeout: Duration,
    files: Option<Arc<Root>>,
    /// Whether `/bytes/N` and `/video/...` are served.
    test_endpoints: bool,
    /// Whether the send window is [`limits::FILE_SEND_WINDOW`] yet (from
    /// the first file response on).
    file_window: bool,
    /// The server is draining: new requests are refused.
    draining: bool,
}

impl ConnApp for HqConn {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        let now = cx.now();
        match ev {
            AppEvent::Opened(id) if id.dir() == Dir::Uni => {
                cx.stop(id, 0);
            }
            AppEvent::Opened(id) if self.draining => {
                // HTTP/0.9 has no GOAWAY: a request that comes during a
                // drain is refused, as at a stop.
                cx.stop(id, hq::code::SHUTDOWN.into());
                cx.reset(id, hq::code::SHUTDOWN.into());
            }
            AppEvent::Opened(id) => {
                let deadline = now + self.request_timeout;
                self.streams.insert(
                    id,
                    Resp::Reading {
                        buf: Vec::new(),
                        deadline,
                    },
                );
                self.read_request(cx, id);
            }
            AppEvent::Readable(id) => self.read_request(cx, id),
            AppEvent::Writable(id) => self.respond(cx, id),
            AppEvent::Stopped(id, _) => {
                self.streams.remove(&id);
            }
            AppEvent::Timeout => {
                let timed_out = self.expire_requests(cx);
                if timed_out > 0 {
                    cx.counters().request_timeouts.fetch_add(timed_out, Relaxed);
                }
                let due: Vec<StreamId> = self
                    .streams
                    .iter()
                    .filter(|(_, r)| matches!(r, Resp::Video { .. }))
                    .map(|(id, _)| *id)
                    .collect();
                for id in due {
                    self.respond(cx, id);
                }
            }
            _ => {}
        }
    }

    fn timeout(&self) -> Option<Instant> {
        [self.next_frame(), self.next_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    fn on_drain(&mut self, _cx: &mut AppCx<'_>) {
        self.draining = true;
    }

    fn drained(&self) -> bool {
        self.streams.is_empty()
    }

    fn on_shutdown(&mut self, cx: &mut AppCx<'_>) {
        for id in self.streams.keys() {
            cx.reset(*id, hq::code::SHUTDOWN.into());
        }
        self.streams.clear();
    }
}

impl HqConn {
    /// The time of the earliest video frame not written yet, of the
    /// responses not blocked. A blocked response waits for the stream's
    /// credit ([`AppEvent::Writable`]), not for a timer: it would be in
    /// the past, and the worker would never sleep. A frame that fell due
    /// since the last write (while other events came) is an instant in the
    /// past, and its [`AppEvent::Timeout`] comes at once: its write then
    /// either moves the response on or blocks it, so the worker sleeps.
    fn next_frame(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|r| match r {
                Resp::Video {
                    frames,
                    start,
                    off,
                    blocked: false,
                } => {
                    let sent_frames = off / frames.bytes;
                    (sent_frames < frames.count).then(|| frames.due_at(*start, sent_frames))
                }
                _ => None,
            })
            .min()
    }

    /// The earliest deadline of a request line still being read.
    fn next_deadline(&self) -> Option<Instant> {
        self.streams
            .values()
            .filter_map(|r| match r {
                Resp::Reading { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .min()
    }

    /// Resets every stream whose request line is not whole by its deadline,
    /// with [`hq::code::REQUEST_TIMEOUT`]; how many.
    fn expire_requests(&mut self, cx: &mut AppCx<'_>) -> u64 {
        let now = cx.now();
        if self.next_deadline().is_none_or(|d| d > now) {
            return 0;
        }
        let late: Vec<StreamId> = self
            .streams
            .iter()
            .filter_map(|(id, r)| match r {
                Resp::Reading { deadline, .. } if *deadline <= now => Some(*id),
                _ => None,
            })
            .collect();
        let code = u64::from(hq::code::REQUEST_TIMEOUT);
        for id in &late {
            cx.reset(*id, code);
            cx.stop(*id, code);
            self.streams.remove(id);
        }
        late.len() as u64
    }

    /// Reads what arrived of a request; starts the response once it is
    /// whole, or resets the stream when it is bad.
    fn read_request(&mut self, cx: &mut AppCx<'_>, id: StreamId) {
        let Some(Resp::Reading { buf, .. }) = self.streams.get_mut(&id) else {
            after_request(cx, id);
            return;
        };
        let (fin, reset) = read_line(cx, id, buf);
        if let Some(code) = reset {
            // The client gave up on its request: the response side closes
            // too (else the stream would hold one of its slots for ever).
            cx.reset(id, code);
            self.streams.remove(&id);
            return;
        }
        // Bytes past the request line (a second request, garbage) are
        // refused with STOP_SENDING; a request line alone waits for its FIN,
        // which `after_request` reads. A STOP_SENDING sent as soon as the
        // line is in would race the client's FIN, and clients such as
        // quic-go's (Write, then Close) fail the request when it wins.
        let extra = buf
            .iter()
            .position(|&b| b == b'\n')
            .is_some_and(|i| i + 1 < buf.len());
        let stop = !fin && extra;
        let parsed = match hq::parse(buf, fin) {
            // The endpoints off: their paths are as any other.
            Ok(Some(_)) if !self.test_endpoints => Err(BadRequest::Invalid),
            p => p,
        };
        match parsed {
            Ok(None) => {}
            Ok(Some(Request::Bytes(len))) => {
                self.streams.insert(id, Resp::Bytes { off: 0, len });
                if stop {
                    cx.stop(id, 0);
                }
                self.respond(cx, id);
            }
            Ok(Some(Request::Video { rate, seconds })) => {
                self.streams.insert(
                    id,
                    Resp::Video {
                        frames: Frames::new(rate, seconds, self.interval),
                        start: cx.now(),
                        off: 0,
                        blocked: false,
                    },
                );
                if stop {
                    cx.stop(id, 0);
                }
                self.respond(cx, id);
            }
            Err(BadRequest::Invalid) if self.files.is_some() => {
                let (Some(root), Some(target)) = (&self.files, hq::request_target(buf, fin)) else {
                    // Not a GET: nothing to look up.
                    let code = u64::from(hq::code::BAD_REQUEST);
                    cx.reset(id, code);
                    cx.stop(id, code);
                    self.streams.remove(&id);
                    return;
                };
                let r = root.respond(Method::Get, target, None);
                self.start_file(cx, id, r, stop);
            }
            Err(BadRequest::Invalid)
                if !self.test_endpoints && hq::request_target(buf, fin).is_some() =>
            {
                // A GET of a path, with nothing to serve it: not found.
                let code = u64::from(hq::code::NOT_FOUND);
                cx.reset(id, code);
                cx.stop(id, code);
                self.streams.remove(&id);
            }
            Err(bad) => {
                let code = u64::from(bad.code());
                cx.reset(id, code);
                cx.stop(id, code);
                self.streams.remove(&id);
            }
        }
    }

    /// Starts the answer to a file request: the file's bytes, or a reset
    /// with the code of why not. `stop`: bytes came after the request line.
    fn start_file(
        &mut self,
        cx: &mut AppCx<'_>,
        id: StreamId,
        r: crate::files::Response,
        stop: bool,
    ) {
        match (r.status, r.body) {
            (Status::Ok, Some(body)) => {
                if !self.file_window {
                    // File bytes are copies held until
                    // acknowledged: the memory model counts this
                    // window for them.
                    cx.set_send_window(limits::FILE_SEND_WINDOW);
                    self.file_window = true;
                }
                let len = r.content_length;
                self.streams.insert(id, Resp::File { body, len });
                if stop {
                    cx.stop(id, 0);
                }
                self.respond(cx, id);
            }
            (status, _) => {
                let code = u64::from(match status {
                    Status::NotFound => hq::code::NOT_FOUND,
                    Status::Forbidden => hq::code::FORBIDDEN,
                    Status::BadRequest => hq::code::BAD_REQUEST,
                    Status::ServiceUnavailable => hq::code::UNAVAILABLE,
                    _ => hq::code::FILE_ERROR,
                });
                cx.reset(id, code);
                cx.stop(id, code);
                self.streams.remove(&id);
            }
        }
    }

    /// Writes what a file response may write now: chunk by chunk until
    /// the stream is blocked (a [`AppEvent::Writable`] follows) or the
    /// file is written.
    fn respond_file(&mut self, cx: &mut AppCx<'_>, id: StreamId) {
        let Some(Resp::File { body, len }) = self.streams.get_mut(&id) else {
            return;
        };
        let len = *len;
        loop {
            let chunk = match body.chunk() {
                Ok(c) => c,
                Err(_) => {
                    // Read failed or the file shrank: the length cannot be
                    // met, so the client must not take it as whole.
                    cx.reset(id, u64::from(hq::code::FILE_ERROR));
                    self.streams.remove(&id);
                    return;
                }
            };
            if chunk.is_empty() {
                self.streams.remove(&id);
                cx.finish(id, len);
                return;
            }
            match cx.write(id, std::slice::from_mut(chunk)) {
                Write::All(_) => {}
                Write::Blocked(_) => return,
                Write::Stopped(_) | Write::Closed => {
                    self.streams.remove(&id);
                    return;
                }
            }
        }
    }

    /// Writes what a response may write now: until the stream is blocked
    /// (a [`AppEvent::Writable`] follows) or what is due is written.
    fn respond(&mut self, cx: &mut AppCx<'_>, id: StreamId) {
        let now = cx.now();
        let (off, limit, total) = match self.streams.get(&id) {
            Some(Resp::Bytes { off, len }) => (*off, *len, *len),
            Some(Resp::Video {
                frames, start, off, ..
            }) => (*off, frames.due(*start, now) * frames.bytes, frames.total()),
            Some(Resp::File { .. }) => return self.respond_file(cx, id),
            _ => return,
        };
        let mut at = off;
        let mut blocked = false;
        while at < limit {
            // The pattern is static: quinn-proto keeps a reference to it
            // rather than a copy.
            let mut piece = [Bytes::from_static(hq::pattern(at, limit - at))];
            match cx.write(id, &mut piece) {
                Write::All(n) => at += n as u64,
                Write::Blocked(n) => {
                    at += n as u64;
                    blocked = true;
                    break;
                }
                Write::Stopped(_) | Write::Closed => {
                    self.streams.remove(&id);
                    return;
                }
            }
        }
        if at == total {
            self.streams.remove(&id);
            // Counted as goodput once the client has acknowledged it all.
            cx.finish(id, total);
        } else {
            match self.streams.get_mut(&id) {
                Some(Resp::Bytes { off, .. }) => *off = at,
                Some(Resp::Video {
                    off, blocked: b, ..
                }) => {
                    *off = at;
                    *b = blocked;
                }
                _ => {}
            }
        }
    }
}

/// Reads what arrives on a stream whose request is in: its FIN, which
/// gives the stream's credit back once the response is done too, or bytes
/// past the request, refused with STOP_SENDING. The stream holds nothing
/// either way: the request's stream window bounds what waits unread.
fn after_request(cx: &mut AppCx<'_>, id: StreamId) {
    let mut extra = false;
    while let Read::Data(_) = cx.read(id, usize::MAX) {
        extra = true;
    }
    if extra {
        cx.stop(id, 0);
    }
}

/// Reads what stream `id` has of its request line into `buf`, up to one
/// byte more than the longest request: whether its FIN came, and the code
/// it was reset with, if it was.
fn read_line(cx: &mut AppCx<'_>, id: StreamId, buf: &mut Vec<u8>) -> (bool, Option<u64>) {
    loop {
        match cx.read(id, hq::MAX_REQUEST + 2 - buf.len().min(hq::MAX_REQUEST + 1)) {
            Read::Data(ch) => {
                buf.extend_from_slice(&ch);
                if buf.len() > hq::MAX_REQUEST + 1 {
                    return (false, None);
                }
            }
            Read::Fin => return (true, None),
            Read::Reset(code) => return (false, Some(code)),
            _ => return (false, None),
        }
    }
}
