//! The application interface: what the engine calls, on the worker thread
//! that owns the connection, and what the application may do to it.
//!
//! - An [`Application`] is shared by all workers. It names the ALPN
//!   protocols it speaks and makes one [`WorkerApp`] per worker thread.
//! - A [`WorkerApp`] lives on one worker thread (it need not be `Send`). At
//!   the end of a connection's handshake it decides whether to take the
//!   connection, and makes its [`ConnApp`].
//! - A [`ConnApp`] is told what happened on its connection
//!   ([`AppEvent`]) and acts through an [`AppCx`]: it reads, writes,
//!   finishes, resets, opens streams and closes the connection.
//!
//! The engine calls synchronously and never re-enters: no call into the
//! application starts while another one runs. There is no queue between
//! the engine and the application beyond quinn-proto's own.
//!
//! **The rule for writing:** write until [`Write::Blocked`], then wait for
//! [`AppEvent::Writable`] on that stream. [`AppCx::write`] never returns a
//! short write without a `Writable` to follow. What a connection holds
//! unacknowledged is bounded by its send window
//! ([`crate::limits::SEND_WINDOW`] unless [`AppCx::set_send_window`] or
//! the embedder's [`crate::Transport::send_window`] changes it), so a slow
//! reader pins at most that.
//!
//! **Goodput:** [`AppCx::finish`] takes the length the application
//! counts for the stream; the engine adds it to
//! [`crate::Counters::app_bytes`] once the peer has acknowledged every
//! byte ([`AppEvent::Finished`]).

pub mod hq;
mod router;
mod wake;

pub use router::Router;
pub(crate) use wake::Wakes;

use crate::stats::Counters;
use bytes::Bytes;
use quinn_proto::VarInt;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// An application the engine serves: shared by all workers.
pub trait Application: Send + Sync + 'static {
    /// The ALPN protocols it speaks, in order of preference. The engine
    /// offers exactly these in TLS.
    fn alpn(&self) -> Vec<Vec<u8>>;
    /// The part of the application that runs on worker thread `worker`
    /// (from 0), made once, on that thread.
    fn worker(&self, worker: usize) -> Box<dyn WorkerApp>;
    /// The application error codes the engine closes a connection of
    /// protocol `alpn` with when it decides to itself (an address over its
    /// share, an eviction, a response without progress): the protocol's
    /// own. The default: [`CloseCodes::HTTP3`].
    fn close_codes(&self, alpn: &[u8]) -> CloseCodes {
        let _ = alpn;
        CloseCodes::HTTP3
    }
}

/// The application error codes (CONNECTION_CLOSE) the engine uses itself
/// on a connection, per protocol ([`Application::close_codes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseCodes {
    /// A connection whose client address was found over its share
    /// ([`crate::EngineConfig::max_connections_per_ip`]) when its
    /// handshake ended (reason "too many connections from this address").
    pub address_limit: u64,
    /// A connection evicted to make room for a newcomer when the server
    /// was full, or closed because a response made no progress for
    /// [`crate::limits::STALL_TIMEOUT`].
    pub excessive_load: u64,
}

impl CloseCodes {
    /// HTTP/3's (RFC 9114 8.1): `H3_EXCESSIVE_LOAD` (0x107) for both.
    pub const HTTP3: CloseCodes = CloseCodes {
        address_limit: 0x107,
        excessive_load: 0x107,
    };
    /// hq-interop's (this crate's, [`crate::hq::wire`]): 0x14
    /// ([`crate::hq::wire::CLOSE_ADDRESS_LIMIT`]) for an address over its
    /// share, 0x107 for load.
    pub const HQ_INTEROP: CloseCodes = CloseCodes {
        address_limit: crate::hq::wire::CLOSE_ADDRESS_LIMIT as u64,
        excessive_load: 0x107,
    };

    /// Codes of a protocol of the embedder's.
    pub const fn new(address_limit: u64, excessive_load: u64) -> Self {
        CloseCodes {
            address_limit,
            excessive_load,
        }
    }
}

/// The application on one worker thread.
pub trait WorkerApp {
    /// A connection has finished reading the client's hello: `alpn` is the
    /// protocol agreed (empty if the client named none). Streams follow,
    /// 0-RTT ones included. `None` refuses the connection: the engine
    /// closes it with [`REFUSED`] and counts it in
    /// [`crate::Counters::refused`].
    fn accept(&mut self, alpn: &[u8], info: &ConnInfo) -> Option<Box<dyn ConnApp>>;
}

/// One connection's application.
pub trait ConnApp {
    /// Something happened on the connection.
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent);
    /// Called when the engine drives the connection and the application
    /// has something to do: after a round of the connection's events
    /// (after [`ConnApp::on_event`]), after its waker
    /// ([`AppCx::waker`]) was called, when its [`ConnApp::timeout`]
    /// came, while the server drains, and once the connection is closed;
    /// before the connection's packets are made. The place for work that
    /// is not tied to one event. A datagram that gives the application
    /// nothing (a keep-alive PING, an acknowledgement) does not call it:
    /// work that waits on something outside the connection wakes it
    /// instead. The default does nothing.
    fn poll(&mut self, cx: &mut AppCx<'_>) {
        let _ = cx;
    }
    /// The next instant at which [`AppEvent::Timeout`] is due (a deadline,
    /// a frame of a paced response); part of the connection's timer. The
    /// engine reads it after each [`ConnApp::poll`] (and after
    /// [`ConnApp::on_drain`]) and keeps it until the next: a deadline
    /// changed outside those calls needs a wake ([`AppCx::waker`]). It
    /// must not return an instant already past once the event for it has
    /// been handled, or the worker would never sleep. The default: none.
    fn timeout(&self) -> Option<Instant> {
        None
    }
    /// The server is stopping: the connection is closed right after this.
    /// Also called when a drain closes the connection (after
    /// [`ConnApp::drained`] said so).
    fn on_shutdown(&mut self, cx: &mut AppCx<'_>) {
        let _ = cx;
    }
    /// The server is draining ([`crate::Engine::drain`]): take no new
    /// requests (HTTP/3 sends GOAWAY) and finish those under way. Called
    /// once, when the drain starts, or as soon as the connection has an
    /// application if its handshake ends during the drain. The default
    /// does nothing.
    fn on_drain(&mut self, cx: &mut AppCx<'_>) {
        let _ = cx;
    }
    /// Whether, once told of a drain, the connection has nothing under
    /// way: the engine then closes it, as soon as every response finished
    /// is acknowledged. Asked after each drive during a drain. The
    /// default: true (a drain closes the connection at once).
    fn drained(&self) -> bool {
        true
    }
    /// The connection is gone; no more calls follow.
    fn on_closed(&mut self, reason: Closed) {
        let _ = reason;
    }
}

/// The application close code of a connection the application refused
/// ([`WorkerApp::accept`] gave `None`): 0x0101, as HTTP/3's
/// H3_GENERAL_PROTOCOL_ERROR.
pub const REFUSED: u32 = 0x0101;

/// What the engine knows of a new connection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The local address and port the client sent to (over QUIC, as
    /// [`crate::Admission::local`]).
    pub local: SocketAddr,
    /// The server name the client asked for (SNI), if any.
    pub server_name: Option<String>,
    /// The application protocol agreed in the handshake (ALPN: `h3`,
    /// `hq-interop`, `h2`, `http/1.1`, ...). Always `Some` over QUIC,
    /// where the handshake fails without one; `None` on a TLS/TCP
    /// connection whose client offered none.
    pub alpn: Option<Vec<u8>>,
    /// The worker thread that owns the connection.
    pub worker: usize,
    /// Requests (bidirectional streams) the client may have open at once
    /// ([`crate::Transport::bidi_streams`]; fewer while the memory budget
    /// is under pressure, [`crate::limits::Grant`]).
    pub bidi_streams: u32,
}

/// A stream's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Bidirectional.
    Bi,
    /// Unidirectional.
    Uni,
}

/// A stream of a connection: its QUIC stream ID (RFC 9000 2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(u64);

impl StreamId {
    /// The stream ID as a number.
    pub fn value(self) -> u64 {
        self.0
    }

    /// Its direction.
    pub fn dir(self) -> Dir {
        if self.0 & 2 == 0 {
            Dir::Bi
        } else {
            Dir::Uni
        }
    }

    /// Whether the client opened it.
    pub fn client_initiated(self) -> bool {
        self.0 & 1 == 0
    }

    pub(crate) fn quinn(self) -> quinn_proto::StreamId {
        // Built only from quinn-proto's own ids, which are varints.
        quinn_proto::StreamId::from(VarInt::from_u64(self.0).unwrap_or(VarInt::MAX))
    }
}

impl From<quinn_proto::StreamId> for StreamId {
    fn from(id: quinn_proto::StreamId) -> Self {
        StreamId(VarInt::from(id).into_inner())
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub(crate) fn quinn_dir(d: Dir) -> quinn_proto::Dir {
    match d {
        Dir::Bi => quinn_proto::Dir::Bi,
        Dir::Uni => quinn_proto::Dir::Uni,
    }
}

/// What happened on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AppEvent {
    /// The client opened a stream (one event per stream; the engine has
    /// accepted it).
    Opened(StreamId),
    /// Data (or the end, or a reset) can be read on a stream.
    Readable(StreamId),
    /// A stream whose write was [`Write::Blocked`] may be written again.
    Writable(StreamId),
    /// Every byte written on a finished stream is acknowledged.
    Finished(StreamId),
    /// The client asked the stream's sending side to stop
    /// (STOP_SENDING) with this code; the engine has already reset it.
    Stopped(StreamId, u64),
    /// A stream of this direction can be opened ([`AppCx::open`] gave
    /// `None` before).
    CanOpen(Dir),
    /// [`ConnApp::timeout`] has come.
    Timeout,
    /// QUIC DATAGRAM frames arrived (RFC 9221; with
    /// [`crate::Transport::datagram_receive_buffer`]): read them with
    /// [`AppCx::recv_datagram`] until it gives `None`. The event comes
    /// in each round of the connection's events in which frames arrived;
    /// frames left unread are not announced again, so read them all.
    Datagram,
    /// A DATAGRAM frame may be queued again ([`AppCx::send_datagram`] was
    /// [`DatagramError::Blocked`]).
    DatagramsWritable,
}

/// Why [`AppCx::send_datagram`] did not queue a DATAGRAM frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DatagramError {
    /// The server offers no DATAGRAM frames
    /// ([`crate::Transport::datagram_receive_buffer`] is `None`), or the
    /// client takes none.
    #[error("DATAGRAM frames are not in use on this connection")]
    Unsupported,
    /// The datagram is larger than the client takes, or than a packet
    /// holds ([`AppCx::max_datagram_size`]).
    #[error("the datagram is larger than the connection takes")]
    TooLarge,
    /// The connection's send buffer is full; [`AppEvent::DatagramsWritable`]
    /// follows when there is room. The datagram comes back. Counted in
    /// [`crate::Counters::quic_datagrams_blocked`].
    #[error("the connection's DATAGRAM send buffer is full")]
    Blocked(Bytes),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Closed {
    /// The peer closed it with this application error code.
    ByPeer(u64),
    /// The peer closed it with a transport error, or a transport error
    /// ended it; the message says which.
    Transport(String),
    /// No packet for the idle timeout.
    TimedOut,
    /// The peer reset it (a stateless reset).
    Reset,
    /// This side closed it (the application, a limit, or the server
    /// stopping).
    Locally,
}

impl From<&quinn_proto::ConnectionError> for Closed {
    fn from(e: &quinn_proto::ConnectionError) -> Self {
        use quinn_proto::ConnectionError as E;
        match e {
            E::ApplicationClosed(c) => Closed::ByPeer(c.error_code.into_inner()),
            E::TimedOut => Closed::TimedOut,
            E::Reset => Closed::Reset,
            E::LocallyClosed => Closed::Locally,
            e => Closed::Transport(e.to_string()),
        }
    }
}

/// What [`AppCx::read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Read {
    /// Bytes, in order.
    Data(Bytes),
    /// Nothing now; [`AppEvent::Readable`] follows when there is.
    Blocked,
    /// The stream ended: everything was read.
    Fin,
    /// The peer reset the stream with this code.
    Reset(u64),
    /// The stream is not open for reading (never was, or is done).
    Closed,
}

/// What [`AppCx::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Write {
    /// Every byte was taken: this many.
    All(usize),
    /// This many bytes were taken (perhaps 0), then flow control or the
    /// send window refused more: [`AppEvent::Writable`] follows.
    Blocked(usize),
    /// The peer stopped the stream with this code.
    Stopped(u64),
    /// The stream is not open for writing.
    Closed,
}

/// Marks one connection to be driven again in its worker's next loop
/// turn (with [`ConnApp::poll`] called), from any thread; a worker that
/// waits is woken at once through its eventfd. A `std::task::Wake`, so
/// `Waker::from(Arc::new(waker))` makes a `Waker` of it.
pub(crate) struct ConnWaker {
    wakes: Wakes,
    ch: quinn_proto::ConnectionHandle,
}

impl ConnWaker {
    /// Has the connection driven again.
    pub(crate) fn wake_conn(&self) {
        self.wakes.push(self.ch);
    }
}

impl std::task::Wake for ConnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_conn();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_conn();
    }
}

/// What the application may do to its connection, during one call.
pub struct AppCx<'a> {
    conn: &'a Rc<RefCell<quinn_proto::Connection>>,
    now: Instant,
    finishing: &'a mut Vec<(quinn_proto::StreamId, u64)>,
    /// What the engine keeps beside the connection for its application.
    side: &'a mut ConnSide,
    counters: &'a Counters,
    wake: (&'a Wakes, quinn_proto::ConnectionHandle),
}

/// The overhead quinn-proto counts per buffered DATAGRAM frame, bytes (its
/// `Datagram`, a `Bytes`): the engine's own buffer counts the same.
const DATAGRAM_OVERHEAD: usize = std::mem::size_of::<Bytes>();

/// What the engine keeps of a connection for its application, beside
/// quinn-proto's state: the DATAGRAM frames received and not yet read
/// (moved out of quinn-proto's buffer at the end of each drive in which
/// one arrived, so that a frame its full buffer pushed out is counted as
/// it happens: quinn-proto drops them without a word), and the embedder's
/// send window.
#[derive(Debug, Default)]
pub(crate) struct ConnSide {
    /// Frames moved out of quinn-proto's buffer, oldest first.
    received: std::collections::VecDeque<Bytes>,
    /// Their bytes, with [`DATAGRAM_OVERHEAD`] each.
    received_bytes: usize,
    /// Its bound, bytes: [`crate::Transport::datagram_receive_buffer`].
    receive_buffer: usize,
    /// quinn-proto's count of frames received when last settled.
    seen: u64,
    /// Frames the application read straight from quinn-proto's buffer
    /// since then.
    read_direct: u64,
    /// Frames the application read, in all.
    read: u64,
    /// Frames counted dropped, in all.
    dropped: u64,
    /// A frame arrived since the last settling.
    pub(crate) arrived: bool,
    /// [`crate::Transport::send_window`]: when set, the application's
    /// [`AppCx::set_send_window`] changes nothing.
    send_window: Option<u64>,
}

impl ConnSide {
    /// For a connection under transport `t`.
    pub(crate) fn new(t: &crate::Transport) -> Self {
        ConnSide {
            receive_buffer: t.datagram_receive_buffer.unwrap_or(0),
            send_window: t.send_window,
            ..ConnSide::default()
        }
    }

    /// Moves the frames quinn-proto holds into the engine's buffer, drops
    /// the oldest past its bound, and counts in `counters` what was
    /// dropped since the last settling, by quinn-proto or here: of the
    /// frames quinn-proto received since then, those neither moved nor
    /// read.
    pub(crate) fn settle(&mut self, conn: &mut quinn_proto::Connection, counters: &Counters) {
        self.arrived = false;
        let received = conn.stats().frame_rx.datagram;
        let mut moved = 0u64;
        while let Some(d) = conn.datagrams().recv() {
            moved += 1;
            self.received_bytes += d.len() + DATAGRAM_OVERHEAD;
            self.received.push_back(d);
        }
        let mut dropped = received
            .saturating_sub(self.seen)
            .saturating_sub(moved + self.read_direct);
        while self.received_bytes > self.receive_buffer {
            let Some(d) = self.received.pop_front() else {
                break;
            };
            self.received_bytes -= d.len() + DATAGRAM_OVERHEAD;
            dropped += 1;
        }
        self.seen = received;
        self.read_direct = 0;
        self.count_dropped(dropped, counters);
    }

    /// At the connection's end: what it received (`received`, quinn-proto's
    /// count) and no application read, not counted yet, is counted
    /// dropped.
    pub(crate) fn end(&mut self, received: u64, counters: &Counters) {
        let unread = received.saturating_sub(self.read + self.dropped);
        self.count_dropped(unread, counters);
        self.received.clear();
        self.received_bytes = 0;
    }

    fn count_dropped(&mut self, n: u64, counters: &Counters) {
        if n > 0 {
            self.dropped += n;
            counters
                .quic_datagrams_dropped
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The next frame: the engine's buffer first (the older), then
    /// quinn-proto's.
    fn recv(&mut self, conn: &mut quinn_proto::Connection) -> Option<Bytes> {
        let d = match self.received.pop_front() {
            Some(d) => {
                self.received_bytes -= d.len() + DATAGRAM_OVERHEAD;
                d
            }
            None => {
                let d = conn.datagrams().recv()?;
                self.read_direct += 1;
                d
            }
        };
        self.read += 1;
        Some(d)
    }
}

fn varint(v: u64) -> VarInt {
    VarInt::from_u64(v).unwrap_or(VarInt::MAX)
}

impl<'a> AppCx<'a> {
    pub(crate) fn new(
        conn: &'a Rc<RefCell<quinn_proto::Connection>>,
        now: Instant,
        finishing: &'a mut Vec<(quinn_proto::StreamId, u64)>,
        side: &'a mut ConnSide,
        counters: &'a Counters,
        wake: (&'a Wakes, quinn_proto::ConnectionHandle),
    ) -> Self {
        AppCx {
            conn,
            now,
            finishing,
            side,
            counters,
            wake,
        }
    }

    /// A waker that has the engine drive this connection again (and call
    /// [`ConnApp::poll`]) in the worker's next loop turn. It may be woken
    /// from any thread: a worker that waits for packets or timers is woken
    /// at once (through an eventfd its wait watches), so a future that
    /// runs on the connection's behalf and is woken elsewhere (a channel, a
    /// timer of another runtime) goes on within microseconds.
    pub fn waker(&self) -> std::task::Waker {
        std::task::Waker::from(Arc::new(self.conn_waker()))
    }

    /// The waker of [`AppCx::waker`], as its own type.
    pub(crate) fn conn_waker(&self) -> ConnWaker {
        ConnWaker {
            wakes: self.wake.0.clone(),
            ch: self.wake.1,
        }
    }

    /// The connection, shared with handles that outlive one call (the
    /// HTTP/3 backend's). The engine holds no borrow of it while it calls
    /// the application; a borrow must not outlive the call that took it.
    #[allow(dead_code)]
    pub(crate) fn conn(&self) -> &Rc<RefCell<quinn_proto::Connection>> {
        self.conn
    }

    /// The worker's counters.
    pub(crate) fn counters(&self) -> &Counters {
        self.counters
    }

    /// The time of this turn of the worker's loop.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Reads at most `max` bytes of `id`, in order.
    pub fn read(&mut self, id: StreamId, max: usize) -> Read {
        let mut c = self.conn.borrow_mut();
        let mut s = c.recv_stream(id.quinn());
        let Ok(mut chunks) = s.read(true) else {
            return Read::Closed;
        };
        let r = match chunks.next(max) {
            Ok(Some(ch)) => Read::Data(ch.bytes),
            Ok(None) => Read::Fin,
            Err(quinn_proto::ReadError::Blocked) => Read::Blocked,
            Err(quinn_proto::ReadError::Reset(code)) => Read::Reset(code.into_inner()),
        };
        // Any credit it gives back goes out with the connection's next
        // packets: the engine makes them after this call.
        let _ = chunks.finalize();
        r
    }

    /// Writes `data` on `id`, taking from the front of the slice (the
    /// pieces taken whole are left empty), until all is taken or the
    /// stream is blocked. Pieces are kept by reference, not copied.
    pub fn write(&mut self, id: StreamId, data: &mut [Bytes]) -> Write {
        let mut c = self.conn.borrow_mut();
        let mut s = c.send_stream(id.quinn());
        let mut n = 0;
        loop {
            if data.iter().all(|b| b.is_empty()) {
                return Write::All(n);
            }
            match s.write_chunks(data) {
                Ok(w) => n += w.bytes,
                // quinn-proto says `Blocked` for a connection without send
                // credit before it looks at the stream: a stream the peer
                // stopped is reported as such, not as blocked (its
                // `Writable` would wait for credit that may never come).
                Err(quinn_proto::WriteError::Blocked) => {
                    return match s.stopped() {
                        Ok(None) => Write::Blocked(n),
                        Ok(Some(code)) => Write::Stopped(code.into_inner()),
                        Err(_) => Write::Closed,
                    }
                }
                Err(quinn_proto::WriteError::Stopped(code)) => {
                    return Write::Stopped(code.into_inner())
                }
                Err(quinn_proto::WriteError::ClosedStream) => return Write::Closed,
            }
        }
    }

    /// Ends `id`'s sending side after what was written. `len` is what the
    /// application counts as delivered for it (its goodput), added to
    /// [`crate::Counters::app_bytes`] once the peer has acknowledged
    /// everything. False when the stream is not open for writing.
    pub fn finish(&mut self, id: StreamId, len: u64) -> bool {
        let ok = self
            .conn
            .borrow_mut()
            .send_stream(id.quinn())
            .finish()
            .is_ok();
        if ok {
            self.finishing.push((id.quinn(), len));
        }
        ok
    }

    /// Counts `len` for `id`, a stream finished through the shared
    /// connection (the HTTP/3 backend finishes its streams itself), as
    /// [`AppCx::finish`] does: once the peer has acknowledged everything.
    #[cfg_attr(not(feature = "h3"), allow(dead_code))]
    pub(crate) fn count_finished(&mut self, id: quinn_proto::StreamId, len: u64) {
        self.finishing.push((id, len));
    }

    /// Abandons `id`'s sending side with `code` (RESET_STREAM).
    pub fn reset(&mut self, id: StreamId, code: u64) {
        let _ = self
            .conn
            .borrow_mut()
            .send_stream(id.quinn())
            .reset(varint(code));
        self.finishing.retain(|f| f.0 != id.quinn());
    }

    /// Asks the peer to stop sending on `id` with `code` (STOP_SENDING);
    /// what arrives of it is discarded.
    pub fn stop(&mut self, id: StreamId, code: u64) {
        let _ = self
            .conn
            .borrow_mut()
            .recv_stream(id.quinn())
            .stop(varint(code));
    }

    /// Opens a stream of the server's, if the peer's limit allows one now
    /// (else [`AppEvent::CanOpen`] follows when it does).
    pub fn open(&mut self, dir: Dir) -> Option<StreamId> {
        self.conn
            .borrow_mut()
            .streams()
            .open(quinn_dir(dir))
            .map(StreamId::from)
    }

    /// Closes the connection with an application error code and reason.
    pub fn close(&mut self, code: u64, reason: &[u8]) {
        self.conn
            .borrow_mut()
            .close(self.now, varint(code), Bytes::copy_from_slice(reason));
    }

    /// The next DATAGRAM frame received, oldest first; `None` when none
    /// is left ([`AppEvent::Datagram`] follows the next). What is not
    /// read stays in the connection's receive buffer
    /// ([`crate::Transport::datagram_receive_buffer`]), whose oldest
    /// frames are dropped when it is full (counted in
    /// [`crate::Counters::quic_datagrams_dropped`] by the end of the
    /// drive that received the frame pushing them out).
    pub fn recv_datagram(&mut self) -> Option<Bytes> {
        let d = self.side.recv(&mut self.conn.borrow_mut());
        if d.is_some() {
            self.counters
                .quic_datagrams_read
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        d
    }

    /// Queues `data` to be sent in a DATAGRAM frame (unreliable: it is
    /// not sent again if lost). The queue holds at most
    /// [`crate::Transport::datagram_send_buffer`] bytes (by default the
    /// receive buffer's size); when it is
    /// full the datagram comes back ([`DatagramError::Blocked`]) and
    /// [`AppEvent::DatagramsWritable`] follows.
    pub fn send_datagram(&mut self, data: Bytes) -> Result<(), DatagramError> {
        use quinn_proto::SendDatagramError as E;
        use std::sync::atomic::Ordering::Relaxed;
        match self.conn.borrow_mut().datagrams().send(data, false) {
            Ok(()) => {
                self.counters.quic_datagrams_queued.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(E::Blocked(d)) => {
                self.counters.quic_datagrams_blocked.fetch_add(1, Relaxed);
                Err(DatagramError::Blocked(d))
            }
            Err(E::TooLarge) => Err(DatagramError::TooLarge),
            Err(_) => Err(DatagramError::Unsupported),
        }
    }

    /// The largest DATAGRAM payload the connection takes now, bytes;
    /// `None` when DATAGRAM frames are not in use.
    pub fn max_datagram_size(&mut self) -> Option<usize> {
        self.conn.borrow_mut().datagrams().max_size()
    }

    /// Sets the bytes the connection may have sent and not yet had
    /// acknowledged (default [`crate::limits::SEND_WINDOW`]); count a
    /// larger one in the server's memory budget. When the embedder set
    /// [`crate::Transport::send_window`], that one stays and this does
    /// nothing.
    pub fn set_send_window(&mut self, bytes: u64) {
        if self.side.send_window.is_none() {
            self.conn.borrow_mut().set_send_window(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig};
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Answers a request only once `go` is set and its waker has woken the
    /// connection: what a task woken from outside the engine's events
    /// (the HTTP/3 backend's) relies on.
    struct Woken {
        go: Arc<AtomicBool>,
        tx: mpsc::Sender<std::task::Waker>,
    }

    impl Application for Woken {
        fn alpn(&self) -> Vec<Vec<u8>> {
            vec![b"test".to_vec()]
        }
        fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
            Box::new(Woken {
                go: self.go.clone(),
                tx: self.tx.clone(),
            })
        }
    }

    impl WorkerApp for Woken {
        fn accept(&mut self, _: &[u8], _: &ConnInfo) -> Option<Box<dyn ConnApp>> {
            Some(Box::new(WokenConn {
                go: self.go.clone(),
                tx: self.tx.clone(),
                stream: None,
            }))
        }
    }

    struct WokenConn {
        go: Arc<AtomicBool>,
        tx: mpsc::Sender<std::task::Waker>,
        stream: Option<StreamId>,
    }

    impl ConnApp for WokenConn {
        fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
            if let AppEvent::Opened(id) = ev {
                self.stream = Some(id);
                let _ = self.tx.send(cx.waker());
            }
        }
        fn poll(&mut self, cx: &mut AppCx<'_>) {
            if let (Some(id), true) = (self.stream, self.go.load(Relaxed)) {
                assert_eq!(
                    cx.write(id, &mut [Bytes::from_static(b"woken")]),
                    Write::All(5)
                );
                assert!(cx.finish(id, 5));
                self.stream = None;
            }
        }
    }

    #[test]
    fn a_waker_has_the_connection_driven_again() {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(c.key_pair.serialize_der());
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![c.cert.der().clone()], key.into())
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let go = Arc::new(AtomicBool::new(false));
        let app = Woken { go: go.clone(), tx };
        let cfg = EngineConfig::new("127.0.0.1:0".parse().unwrap(), Arc::new(tls)).workers(1);
        let engine = Engine::start(cfg, Arc::new(app)).unwrap();
        let addr = engine.local_addr();

        let mut roots = rustls::RootCertStore::empty();
        roots.add(c.cert.der().clone()).unwrap();
        let mut ctls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        ctls.alpn_protocols = vec![b"test".to_vec()];
        let cfg = quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(ctls).unwrap(),
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
            ep.set_default_client_config(cfg);
            let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(b"?").await.unwrap();
            let waker = tokio::task::spawn_blocking(move || rx.recv().unwrap())
                .await
                .unwrap();
            // Nothing comes before the wake.
            let early =
                tokio::time::timeout(Duration::from_millis(100), recv.read_to_end(100)).await;
            assert!(early.is_err(), "an answer before the wake: {early:?}");
            go.store(true, Relaxed);
            waker.wake();
            // Within a few of the worker's turns, not at some later
            // timer of the connection's.
            let body = tokio::time::timeout(Duration::from_secs(2), recv.read_to_end(100))
                .await
                .expect("the answer soon after the wake")
                .unwrap();
            assert_eq!(body, b"woken");
            conn.close(0u32.into(), b"");
        });
        engine.stop();
        engine.join().unwrap();
    }
}
