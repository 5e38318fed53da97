//! h3's QUIC traits (`h3::quic`) over a `quinn_proto::Connection` that the
//! engine owns and drives on one thread.
//!
//! The handles share the connection as `Rc<RefCell<quinn_proto::Connection>>`
//! and borrow it only inside their `poll_*` calls; the driver never holds a
//! borrow while it polls the HTTP/3 task. What quinn keeps in its
//! `ConnectionDriver` (who waits to accept, to open, to read, to write) is
//! [`H3Shared`], woken from quinn-proto's events by the `on_*` methods of
//! [`Link`] (quinn's `forward_app_events`).
//!
//! Flow control: quinn-proto tells that a stream may be written again
//! (`StreamEvent::Writable`) only after a write to it was refused with
//! `Blocked`. [`H3Send::poll_ready`] therefore writes until everything is
//! taken or the write is refused, and only then waits.
//!
//! Bounds: h3 buffers a whole frame before it decodes it, so what is
//! handed to h3 on a peer's stream is bounded here ([`Limits`]): a request
//! stream frame other than DATA over its cap is refused with `H3_EXCESSIVE_LOAD`, and a
//! control-stream frame longer than its limit closes the connection with
//! it.
//!
//! A borrow of the connection that fails (which the engine's discipline
//! rules out) is counted, makes the operation fail with an internal error,
//! and the task closes the connection: never a panic.

use super::guard::{FrameGuard, Verdict};
use ::h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, WriteBuf};
use bytes::{Buf, Bytes};
use quinn_proto::{
    Connection, ConnectionError, Dir, FinishError, ReadError, StreamId, VarInt, WriteError,
};
use std::cell::{Cell, RefCell, RefMut};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// The connection as the engine's slot and the h3 handles share it.
pub(crate) type ConnRef = Rc<RefCell<Connection>>;

/// `H3_INTERNAL_ERROR` (RFC 9114 section 8.1).
pub(crate) const H3_INTERNAL_ERROR: u64 = 0x102;
/// `H3_NO_ERROR` (RFC 9114 section 8.1).
pub(crate) const H3_NO_ERROR: u64 = 0x100;
/// `H3_EXCESSIVE_LOAD` (RFC 9114 section 8.1).
pub(crate) const H3_EXCESSIVE_LOAD: u64 = 0x107;
/// `H3_CLOSED_CRITICAL_STREAM` (RFC 9114 section 8.1).
pub(crate) const H3_CLOSED_CRITICAL_STREAM: u64 = 0x104;

/// The most bytes handed to h3 on one stream the peer opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// The longest frame other than DATA on a bidirectional (request)
    /// stream ([`FrameGuard::request`]); `None`: unbounded (a client's
    /// response streams).
    pub(crate) request_stream: Option<u64>,
    /// The longest frame on the peer's control stream
    /// ([`super::guard::FrameGuard`]).
    pub(crate) control_frame: Option<u64>,
}

impl Limits {
    /// No caps (a client).
    #[cfg(test)]
    pub(crate) const NONE: Limits = Limits {
        request_stream: None,
        control_frame: None,
    };
}

/// What the handles count.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackendStats {
    /// Borrows of the connection or of the shared state that failed.
    pub(crate) borrow_faults: u64,
    /// Request streams refused for sending more than their cap.
    pub(crate) request_streams_over_cap: u64,
    /// Connections closed for a control-stream frame over its limit.
    pub(crate) control_frames_too_long: u64,
    /// Connections closed because the peer stopped our control or QPACK
    /// stream.
    pub(crate) critical_streams_stopped: u64,
    /// DATA payload bytes given to quinn-proto by reference (lent:
    /// [`Link::lend`]), not copied.
    pub(crate) body_bytes_by_reference: u64,
}

/// The per-connection state the handles and the event forwarding share.
#[derive(Default)]
pub(crate) struct H3Shared {
    /// Streams the peer opened, accepted from quinn-proto, not yet taken
    /// by h3; indexed by `Dir as usize`. At most the stream limits.
    accepted: [VecDeque<StreamId>; 2],
    /// Who waits for `accepted`.
    accept_waker: [Option<Waker>; 2],
    /// Who wait for stream credit to open a stream (all are woken, as
    /// quinn's `notify_waiters`; one per task that opens streams).
    open_wakers: [Vec<Waker>; 2],
    /// Who waits for data on a stream (at most one per open stream).
    readers: HashMap<StreamId, Waker>,
    /// Who waits for room on a stream (at most one per open stream).
    writers: HashMap<StreamId, Waker>,
    /// Why the connection ended, once it did.
    error: Option<ConnectionErrorIncoming>,
}

/// What every handle of one connection holds.
pub(crate) struct Link {
    /// The QUIC connection.
    conn: ConnRef,
    /// Wakers and accepted streams.
    shared: RefCell<H3Shared>,
    /// The caps on what the peer may send.
    limits: Limits,
    /// The driver's clock, set before each poll.
    now: Cell<Instant>,
    /// Counts.
    stats: Cell<BackendStats>,
    /// Set when the connection must be closed with `H3_INTERNAL_ERROR`
    /// (a failed borrow).
    fault: Cell<bool>,
    /// Streams finished since the driver last took them, with the bytes
    /// written on each (HTTP/3 framing included): the engine counts them
    /// as goodput once acknowledged. At most one entry per stream.
    finished: RefCell<Vec<(StreamId, u64)>>,
    /// The body bytes of the DATA frame about to be given to h3
    /// ([`Link::lend`]), taken by the stream's `send_data`.
    lent: Cell<Option<Bytes>>,
}

/// A failed borrow: counted, and the connection is to be closed.
struct Fault;

impl Link {
    /// A link over `conn`.
    pub(crate) fn new(conn: ConnRef, limits: Limits, now: Instant) -> Rc<Link> {
        Rc::new(Link {
            conn,
            shared: RefCell::default(),
            limits,
            now: Cell::new(now),
            stats: Cell::default(),
            fault: Cell::new(false),
            finished: RefCell::default(),
            lent: Cell::default(),
        })
    }

    /// Lends `body`, the payload of the DATA frame the caller is about
    /// to give h3's `send_data`, to the stream that frame is written on,
    /// so that its bytes go to quinn-proto by reference
    /// (`write_chunks`), not copied. h3's `WriteBuf` shows the QUIC layer
    /// the frame only as `&[u8]` (docs/UPSTREAM.md); the stream writes a
    /// piece by reference only when that `&[u8]` lies within `body`'s
    /// memory (`Bytes::slice_ref`), so the bytes sent are the frame's
    /// whatever is lent. h3 calls the stream's `send_data` before its
    /// first await, so the call right after this one takes it.
    pub(crate) fn lend(&self, body: &Bytes) {
        self.lent.set(Some(body.clone()));
    }

    /// The connection.
    pub(crate) fn conn(&self) -> &ConnRef {
        &self.conn
    }

    /// Sets the clock (before a poll).
    pub(crate) fn set_now(&self, now: Instant) {
        self.now.set(now);
    }

    /// The clock.
    pub(crate) fn now(&self) -> Instant {
        self.now.get()
    }

    /// The counts.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> BackendStats {
        self.stats.get()
    }

    /// A borrow failed: the task must close the connection.
    pub(crate) fn faulted(&self) -> bool {
        self.fault.get()
    }

    fn count(&self, f: impl FnOnce(&mut BackendStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    fn fault(&self) -> Fault {
        self.count(|s| s.borrow_faults += 1);
        self.fault.set(true);
        Fault
    }

    fn conn_mut(&self) -> Result<RefMut<'_, Connection>, Fault> {
        self.conn.try_borrow_mut().map_err(|_| self.fault())
    }

    fn shared_mut(&self) -> Result<RefMut<'_, H3Shared>, Fault> {
        self.shared.try_borrow_mut().map_err(|_| self.fault())
    }

    /// Hands `f` the streams finished since the last call. The list's
    /// memory is kept for the next ones: no allocation per drive.
    pub(crate) fn drain_finished(&self, mut f: impl FnMut(StreamId, u64)) {
        let Ok(mut done) = self
            .finished
            .try_borrow_mut()
            .map(|mut v| std::mem::take(&mut *v))
        else {
            return;
        };
        for (id, written) in done.drain(..) {
            f(id, written);
        }
        if let Ok(mut v) = self.finished.try_borrow_mut() {
            if v.is_empty() {
                *v = done;
            }
        }
    }

    /// Takes the streams finished since the last call.
    #[cfg(test)]
    pub(crate) fn take_finished(&self) -> Vec<(StreamId, u64)> {
        self.finished
            .try_borrow_mut()
            .map(|mut f| std::mem::take(&mut *f))
            .unwrap_or_default()
    }

    fn finished(&self, id: StreamId, written: u64) {
        if let Ok(mut f) = self.finished.try_borrow_mut() {
            f.push((id, written));
        }
    }

    /// The connection's error, if it ended.
    pub(crate) fn error(&self) -> Option<ConnectionErrorIncoming> {
        self.shared.try_borrow().ok().and_then(|s| s.error.clone())
    }

    /// A stream error for a stream quinn-proto no longer knows: the
    /// connection's error if it ended, else `Unknown`.
    fn closed_stream(
        &self,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> StreamErrorIncoming {
        match self.error() {
            Some(connection_error) => {
                StreamErrorIncoming::ConnectionErrorIncoming { connection_error }
            }
            None => StreamErrorIncoming::Unknown(Box::new(e)),
        }
    }

    /// `peer opened a stream`: `id` was accepted from quinn-proto.
    pub(crate) fn on_opened(&self, dir: Dir, id: StreamId) {
        let w = match self.shared_mut() {
            Ok(mut s) => {
                s.accepted[dir as usize].push_back(id);
                s.accept_waker[dir as usize].take()
            }
            Err(Fault) => None,
        };
        wake(w);
    }

    /// Data (or its end, or a reset) arrived on `id`.
    pub(crate) fn on_readable(&self, id: StreamId) {
        let w = self
            .shared_mut()
            .ok()
            .and_then(|mut s| s.readers.remove(&id));
        wake(w);
    }

    /// `id` may be written again, or the peer stopped it.
    pub(crate) fn on_writable(&self, id: StreamId) {
        let w = self
            .shared_mut()
            .ok()
            .and_then(|mut s| s.writers.remove(&id));
        wake(w);
    }

    /// The peer stopped `id` (STOP_SENDING). One of our unidirectional
    /// streams is a critical one (the control stream or a QPACK stream;
    /// no push streams are opened): that is a connection error of type
    /// `H3_CLOSED_CRITICAL_STREAM` (RFC 9114 6.2.1), and the connection is
    /// closed with it. Any other stream's writer is woken to see the
    /// error.
    pub(crate) fn on_stopped(&self, id: StreamId) {
        if id.dir() == Dir::Uni {
            if let Ok(mut c) = self.conn_mut() {
                if id.initiator() == c.side() {
                    self.count(|s| s.critical_streams_stopped += 1);
                    c.close(
                        self.now(),
                        varint(H3_CLOSED_CRITICAL_STREAM),
                        Bytes::from_static(b"critical stream stopped"),
                    );
                }
            }
        }
        self.on_writable(id);
    }

    /// Credit to open streams of `dir` arrived.
    pub(crate) fn on_available(&self, dir: Dir) {
        let w = self
            .shared_mut()
            .map(|mut s| std::mem::take(&mut s.open_wakers[dir as usize]))
            .unwrap_or_default();
        w.into_iter().for_each(Waker::wake);
    }

    /// The connection ended: every waiter is woken and sees the error.
    pub(crate) fn on_lost(&self, reason: &ConnectionError) {
        let mut all = Vec::new();
        if let Ok(mut s) = self.shared_mut() {
            s.error.get_or_insert_with(|| connection_error(reason));
            all.extend(s.accept_waker.iter_mut().filter_map(Option::take));
            all.extend(s.open_wakers.iter_mut().flat_map(std::mem::take));
            all.extend(s.readers.drain().map(|(_, w)| w));
            all.extend(s.writers.drain().map(|(_, w)| w));
        }
        all.into_iter().for_each(Waker::wake);
    }

    /// quinn-proto's `Event`, turned into wakes: quinn's
    /// `forward_app_events`. For a driver that hands the raw events over
    /// (tests); it accepts the opened streams itself. Call it with no
    /// borrow of the connection held. (The engine hands over its own
    /// events instead, through `H3App`.)
    #[cfg(test)]
    pub(crate) fn forward(&self, event: &quinn_proto::Event) {
        use quinn_proto::{Event, StreamEvent};
        match event {
            Event::Stream(StreamEvent::Opened { dir }) => loop {
                let id = match self.conn_mut() {
                    Ok(mut c) => c.streams().accept(*dir),
                    Err(Fault) => None,
                };
                match id {
                    Some(id) => self.on_opened(*dir, id),
                    None => break,
                }
            },
            Event::Stream(StreamEvent::Readable { id }) => self.on_readable(*id),
            Event::Stream(StreamEvent::Writable { id }) => self.on_writable(*id),
            Event::Stream(StreamEvent::Stopped { id, .. }) => self.on_stopped(*id),
            Event::Stream(StreamEvent::Available { dir }) => self.on_available(*dir),
            Event::ConnectionLost { reason } => self.on_lost(reason),
            // The peer's stream limits arrive with its transport
            // parameters, without an `Available` event.
            Event::Connected => {
                self.on_available(Dir::Uni);
                self.on_available(Dir::Bi);
            }
            Event::Stream(StreamEvent::Finished { .. })
            | Event::HandshakeDataReady
            | Event::DatagramReceived
            | Event::DatagramsUnblocked => {}
        }
    }
}

fn wake(w: Option<Waker>) {
    if let Some(w) = w {
        w.wake();
    }
}

/// quinn-proto's connection error as h3 takes it.
pub(crate) fn connection_error(e: &ConnectionError) -> ConnectionErrorIncoming {
    match e {
        ConnectionError::ApplicationClosed(c) => ConnectionErrorIncoming::ApplicationClose {
            error_code: c.error_code.into_inner(),
        },
        ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        e => ConnectionErrorIncoming::Undefined(Arc::new(e.clone())),
    }
}

fn internal(what: &str) -> ConnectionErrorIncoming {
    ConnectionErrorIncoming::InternalError(what.to_string())
}

fn stream_internal(what: &str) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming {
        connection_error: internal(what),
    }
}

/// A stream's id in both crates' types. Both are QUIC varints, so the
/// conversion cannot fail; it is checked all the same.
#[derive(Debug, Clone, Copy)]
struct Ids {
    quic: StreamId,
    h3: quic::StreamId,
}

impl Ids {
    fn new(id: StreamId) -> Option<Ids> {
        let h3 = quic::StreamId::try_from(VarInt::from(id).into_inner()).ok()?;
        Some(Ids { quic: id, h3 })
    }
}

fn varint(code: u64) -> VarInt {
    VarInt::from_u64(code).unwrap_or(VarInt::MAX)
}

/// The connection: accepts the peer's streams, opens ours.
pub(crate) struct H3Conn {
    link: Rc<Link>,
}

impl H3Conn {
    /// A connection over `link`.
    pub(crate) fn new(link: Rc<Link>) -> Self {
        H3Conn { link }
    }

    fn poll_accept(
        &mut self,
        dir: Dir,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Ids, ConnectionErrorIncoming>> {
        let Ok(mut s) = self.link.shared_mut() else {
            return Poll::Ready(Err(internal("shared state busy")));
        };
        if let Some(id) = s.accepted[dir as usize].pop_front() {
            return Poll::Ready(Ids::new(id).ok_or_else(|| internal("stream id")));
        }
        if let Some(e) = &s.error {
            return Poll::Ready(Err(e.clone()));
        }
        s.accept_waker[dir as usize] = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<B: Buf> quic::Connection<B> for H3Conn {
    type RecvStream = H3Recv;
    type OpenStreams = H3Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Recv, ConnectionErrorIncoming>> {
        self.poll_accept(Dir::Uni, cx).map_ok(|id| {
            let guard = self.link.limits.control_frame.map(FrameGuard::new);
            H3Recv::new(self.link.clone(), id, None, guard)
        })
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Bidi<B>, ConnectionErrorIncoming>> {
        self.poll_accept(Dir::Bi, cx).map_ok(|id| H3Bidi {
            send: H3Send::new(self.link.clone(), id),
            recv: H3Recv::new(
                self.link.clone(),
                id,
                None,
                self.link.limits.request_stream.map(FrameGuard::request),
            ),
        })
    }

    fn opener(&self) -> H3Opener {
        H3Opener {
            link: self.link.clone(),
        }
    }
}

impl<B: Buf> quic::OpenStreams<B> for H3Conn {
    type BidiStream = H3Bidi<B>;
    type SendStream = H3Send<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Bidi<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut quic::Connection::<B>::opener(self), cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Send<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut quic::Connection::<B>::opener(self), cx)
    }

    fn close(&mut self, code: ::h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut quic::Connection::<B>::opener(self), code, reason)
    }
}

/// Opens our streams.
#[derive(Clone)]
pub(crate) struct H3Opener {
    link: Rc<Link>,
}

impl H3Opener {
    fn poll_open(
        &mut self,
        dir: Dir,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Ids, StreamErrorIncoming>> {
        if let Some(connection_error) = self.link.error() {
            return Poll::Ready(Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error,
            }));
        }
        let opened = match self.link.conn_mut() {
            Ok(mut c) => c.streams().open(dir),
            Err(Fault) => return Poll::Ready(Err(stream_internal("connection busy"))),
        };
        match opened {
            Some(id) => Poll::Ready(Ids::new(id).ok_or_else(|| stream_internal("stream id"))),
            None => match self.link.shared_mut() {
                Ok(mut s) => {
                    let w = &mut s.open_wakers[dir as usize];
                    if !w.iter().any(|w| w.will_wake(cx.waker())) {
                        w.push(cx.waker().clone());
                    }
                    Poll::Pending
                }
                Err(Fault) => Poll::Ready(Err(stream_internal("shared state busy"))),
            },
        }
    }
}

impl<B: Buf> quic::OpenStreams<B> for H3Opener {
    type BidiStream = H3Bidi<B>;
    type SendStream = H3Send<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Bidi<B>, StreamErrorIncoming>> {
        self.poll_open(Dir::Bi, cx).map_ok(|id| H3Bidi {
            send: H3Send::new(self.link.clone(), id),
            // Our own request stream: what comes back is a response.
            recv: H3Recv::new(self.link.clone(), id, None, None),
        })
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H3Send<B>, StreamErrorIncoming>> {
        self.poll_open(Dir::Uni, cx)
            .map_ok(|id| H3Send::new(self.link.clone(), id))
    }

    fn close(&mut self, code: ::h3::error::Code, reason: &[u8]) {
        let now = self.link.now();
        if let Ok(mut c) = self.link.conn_mut() {
            c.close(now, varint(code.value()), Bytes::copy_from_slice(reason));
        }
    }
}

/// The sending half of a stream. It holds at most one frame of h3's
/// (`send_data` before the previous one was taken is an internal error,
/// as in h3-quinn).
pub(crate) struct H3Send<B: Buf> {
    link: Rc<Link>,
    id: Ids,
    writing: Option<WriteBuf<B>>,
    /// The payload of `writing`, lent by the caller of h3's `send_data`
    /// ([`Link::lend`]): pieces of `writing` within it are written by
    /// reference.
    lent: Option<Bytes>,
    /// Bytes written so far.
    written: u64,
    /// Finished or reset: nothing to do on drop.
    closed: bool,
}

impl<B: Buf> Drop for H3Send<B> {
    /// A stream h3 let go of without finishing or resetting it is
    /// finished, as quinn's `SendStream` does on drop and h3 expects (h3
    /// drops the stream of a 431 answer, and of a response whose body
    /// failed after resetting it). quinn-proto then frees the stream once
    /// the peer has it all. A stream the peer stopped (STOP_SENDING) is
    /// reset with the peer's code, as quinn's `SendStream` does: quinn-proto
    /// frees a stopped stream only once it is reset, so without it the
    /// stream, and the peer's credit for it, would be held for the rest of
    /// the connection.
    fn drop(&mut self) {
        if !self.closed {
            let ok = match self.link.conn.try_borrow_mut() {
                Ok(mut c) => match c.send_stream(self.id.quic).finish() {
                    Ok(()) => true,
                    Err(FinishError::Stopped(code)) => {
                        let _ = c.send_stream(self.id.quic).reset(code);
                        false
                    }
                    Err(FinishError::ClosedStream) => false,
                },
                Err(_) => false,
            };
            if ok {
                self.link.finished(self.id.quic, self.written);
            }
        }
    }
}

impl<B: Buf> H3Send<B> {
    fn new(link: Rc<Link>, id: Ids) -> Self {
        H3Send {
            link,
            id,
            writing: None,
            lent: None,
            written: 0,
            closed: false,
        }
    }
}

impl<B: Buf> quic::SendStream<B> for H3Send<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let Some(data) = self.writing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if let Some(connection_error) = self.link.error() {
            return Poll::Ready(Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error,
            }));
        }
        let mut conn = match self.link.conn_mut() {
            Ok(c) => c,
            Err(Fault) => return Poll::Ready(Err(stream_internal("connection busy"))),
        };
        // Write until all is taken or quinn-proto refuses: only a refusal
        // (`Blocked`) is followed by `StreamEvent::Writable`. The frame's
        // header is copied (a few bytes); its payload, when lent, is
        // written by reference.
        while data.has_remaining() {
            let piece = data.chunk();
            let lent = self.lent.as_ref().filter(|b| within(piece, b));
            let by_reference = lent.is_some();
            let r = match lent {
                Some(b) => conn
                    .send_stream(self.id.quic)
                    .write_chunks(&mut [b.slice_ref(piece)])
                    .map(|w| w.bytes),
                None => conn.send_stream(self.id.quic).write(piece),
            };
            match r {
                Ok(n) => {
                    if by_reference {
                        self.link.count(|s| s.body_bytes_by_reference += n as u64);
                    }
                    data.advance(n);
                    self.written += n as u64;
                }
                Err(WriteError::Blocked) => {
                    // quinn-proto answers `Blocked` for a connection
                    // without send credit before it looks at the stream:
                    // a stream the peer stopped (and the engine reset) is
                    // `Blocked` then too, and its only `Writable` would
                    // come with more connection credit, which a peer that
                    // stopped everything may never give. So a stopped
                    // stream ends here, and h3 lets go of it (freeing it
                    // and the peer's stream credit).
                    match conn.send_stream(self.id.quic).stopped() {
                        Ok(None) => {}
                        Ok(Some(code)) => {
                            return Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
                                error_code: code.into_inner(),
                            }));
                        }
                        Err(e) => {
                            drop(conn);
                            return Poll::Ready(Err(self.link.closed_stream(e)));
                        }
                    }
                    drop(conn);
                    return match self.link.shared_mut() {
                        Ok(mut s) => {
                            s.writers.insert(self.id.quic, cx.waker().clone());
                            Poll::Pending
                        }
                        Err(Fault) => Poll::Ready(Err(stream_internal("shared state busy"))),
                    };
                }
                Err(WriteError::Stopped(code)) => {
                    return Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
                        error_code: code.into_inner(),
                    }));
                }
                Err(e @ WriteError::ClosedStream) => {
                    drop(conn);
                    return Poll::Ready(Err(self.link.closed_stream(e)));
                }
            }
        }
        self.writing = None;
        self.lent = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        let lent = self.link.lent.take();
        if self.writing.is_some() {
            return Err(stream_internal(
                "send_data before the previous frame was sent",
            ));
        }
        self.writing = Some(data.into());
        self.lent = lent;
        Ok(())
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let r = match self.link.conn_mut() {
            Ok(mut c) => {
                let r = c.send_stream(self.id.quic).finish();
                if let Err(FinishError::Stopped(code)) = r {
                    // Freed only once reset (see `drop`).
                    let _ = c.send_stream(self.id.quic).reset(code);
                }
                r
            }
            Err(Fault) => return Poll::Ready(Err(stream_internal("connection busy"))),
        };
        self.closed = true;
        Poll::Ready(match r {
            Ok(()) => {
                self.link.finished(self.id.quic, self.written);
                Ok(())
            }
            Err(FinishError::Stopped(code)) => Err(StreamErrorIncoming::StreamTerminated {
                error_code: code.into_inner(),
            }),
            Err(e @ FinishError::ClosedStream) => Err(self.link.closed_stream(e)),
        })
    }

    fn reset(&mut self, reset_code: u64) {
        self.closed = true;
        if let Ok(mut c) = self.link.conn_mut() {
            let _ = c.send_stream(self.id.quic).reset(varint(reset_code));
        }
    }

    fn send_id(&self) -> quic::StreamId {
        self.id.h3
    }
}

/// True when `piece` (not empty) lies within `b`'s bytes, so that
/// `b.slice_ref(piece)` is `piece` by reference.
fn within(piece: &[u8], b: &Bytes) -> bool {
    let (p, r) = (piece.as_ptr_range(), b.as_ptr_range());
    !piece.is_empty() && r.start <= p.start && p.end <= r.end
}

/// The receiving half of a stream.
pub(crate) struct H3Recv {
    link: Rc<Link>,
    id: Ids,
    /// Bytes handed to h3 so far.
    taken: u64,
    /// The most it may be handed.
    cap: Option<u64>,
    /// The frame-length guard of a peer's unidirectional stream.
    guard: Option<FrameGuard>,
    /// Read to its end, reset, stopped or gone: nothing to do on drop.
    closed: bool,
}

impl Drop for H3Recv {
    /// A stream h3 let go of before its end is stopped (`H3_NO_ERROR`, as
    /// a server that needs no more of a request does), so that quinn-proto
    /// frees it and gives the peer its stream credit back.
    fn drop(&mut self) {
        if !self.closed {
            if let Ok(mut c) = self.link.conn.try_borrow_mut() {
                let _ = c.recv_stream(self.id.quic).stop(varint(H3_NO_ERROR));
            }
        }
    }
}

impl H3Recv {
    fn new(link: Rc<Link>, id: Ids, cap: Option<u64>, guard: Option<FrameGuard>) -> Self {
        H3Recv {
            link,
            id,
            taken: 0,
            cap,
            guard,
            closed: false,
        }
    }

    /// The peer sent more than the cap: refuse the stream (or, for a
    /// control-stream frame, the connection).
    fn over_cap(&mut self, conn: &mut Connection) -> StreamErrorIncoming {
        let code = varint(H3_EXCESSIVE_LOAD);
        if self.guard.as_ref().is_some_and(|g| !g.is_request()) {
            self.link.count(|s| s.control_frames_too_long += 1);
            conn.close(
                self.link.now(),
                code,
                Bytes::from_static(b"control frame too long"),
            );
            StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::ApplicationClose {
                    error_code: H3_EXCESSIVE_LOAD,
                },
            }
        } else {
            self.link.count(|s| s.request_streams_over_cap += 1);
            let _ = conn.recv_stream(self.id.quic).stop(code);
            let _ = conn.send_stream(self.id.quic).reset(code);
            StreamErrorIncoming::StreamTerminated {
                error_code: H3_EXCESSIVE_LOAD,
            }
        }
    }
}

impl quic::RecvStream for H3Recv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let link = self.link.clone();
        let mut conn = match link.conn_mut() {
            Ok(c) => c,
            Err(Fault) => return Poll::Ready(Err(stream_internal("connection busy"))),
        };
        let max = match self.cap {
            // One byte past the cap tells "over" from "exactly at".
            Some(cap) => usize::try_from(cap.saturating_sub(self.taken) + 1).unwrap_or(usize::MAX),
            None => usize::MAX,
        };
        let r = match conn.recv_stream(self.id.quic).read(true) {
            Ok(mut chunks) => {
                let r = chunks.next(max);
                // The window is re-opened (MAX_STREAM_DATA) when the driver
                // polls transmits, which it does right after polling the task.
                let _ = chunks.finalize();
                Ok(r)
            }
            Err(e) => Err(e),
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.closed = true;
                drop(conn);
                return Poll::Ready(Err(link.closed_stream(e)));
            }
        };
        match r {
            Ok(Some(chunk)) => {
                self.taken += chunk.bytes.len() as u64;
                let too_long = self
                    .guard
                    .as_mut()
                    .is_some_and(|g| g.feed(&chunk.bytes) != Verdict::Fine);
                if too_long || self.cap.is_some_and(|cap| self.taken > cap) {
                    self.closed = true;
                    return Poll::Ready(Err(self.over_cap(&mut conn)));
                }
                Poll::Ready(Ok(Some(chunk.bytes)))
            }
            Ok(None) => {
                self.closed = true;
                Poll::Ready(Ok(None))
            }
            Err(ReadError::Reset(code)) => {
                self.closed = true;
                Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
                    error_code: code.into_inner(),
                }))
            }
            Err(ReadError::Blocked) => {
                drop(conn);
                match self.link.shared_mut() {
                    Ok(mut s) => {
                        s.readers.insert(self.id.quic, cx.waker().clone());
                        Poll::Pending
                    }
                    Err(Fault) => Poll::Ready(Err(stream_internal("shared state busy"))),
                }
            }
        }
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.closed = true;
        if let Ok(mut c) = self.link.conn_mut() {
            let _ = c.recv_stream(self.id.quic).stop(varint(error_code));
        }
    }

    fn recv_id(&self) -> quic::StreamId {
        self.id.h3
    }
}

/// Both halves of a bidirectional stream.
pub(crate) struct H3Bidi<B: Buf> {
    send: H3Send<B>,
    recv: H3Recv,
}

impl<B: Buf> quic::BidiStream<B> for H3Bidi<B> {
    type SendStream = H3Send<B>;
    type RecvStream = H3Recv;

    fn split(self) -> (H3Send<B>, H3Recv) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::RecvStream for H3Bidi<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> quic::StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> quic::SendStream<B> for H3Bidi<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code)
    }

    fn send_id(&self) -> quic::StreamId {
        self.send.send_id()
    }
}
