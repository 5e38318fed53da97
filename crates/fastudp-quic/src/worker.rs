//! The engine's workers: quinn-proto driven by fastudp in the paper's
//! architecture.
//!
//! - N workers, each a thread with its own quinn-proto `Endpoint`.
//! - Their receive sockets form a reuseport group steered by BPF on the
//!   QUIC destination connection ID ([`Steering::QuicCid`]); each worker's
//!   connection ID generator starts every ID with a byte that is the
//!   worker's index modulo N (with QUIC-LB, [`crate::lb`], the nonce's
//!   first byte, after the server ID: [`Steering::QuicCidAt`]), so every
//!   packet of a connection reaches its worker's socket. A client's first Initial carries its own random
//!   DCID; the same program sends it, and every later packet with that
//!   DCID, to one fixed worker, which is the one that computes the same
//!   index in user space and so accepts it. A datagram steered elsewhere
//!   (a group without the program, say, or a client that makes it so) is
//!   copied into a fixed ring of its owner's ([`crate::forward`]); a full
//!   ring drops it and counts the drop.
//! - Each worker sends from its own unconnected socket on the same port
//!   (it joins the reuseport group after the receive sockets, so the
//!   program never picks it).
//! - Each loop turn a worker collects the transmits of every connection
//!   that has something to send (quinn-proto's pacer decides which may)
//!   and sends them all in as few `sendmmsg` calls as possible, one GSO
//!   train per connection and path.
//! - Every queue is bounded, and each loop turn bounds the forwarded,
//!   received and stateless work it does, so that a flood of any kind
//!   leaves room for established connections, new handshakes and the stop
//!   flag: [`crate::limits`] has the memory model.

use crate::app::{
    quinn_dir, AppCx, AppEvent, Closed, ConnApp, ConnInfo, ConnSide, Dir, Wakes, WorkerApp, REFUSED,
};
use crate::forward::{Inbox, Ring, SLOTS};
use crate::hq::wire as hq;
use crate::limits::{self, PENDING_TRAINS, STATELESS_BUF, STATELESS_QUEUE};
use crate::slots::{prefetch, prefetch_lines, Slots};
use crate::stats::Counters;
use crate::tx::{keep_spare, Pending, Tx, ZEROCOPY_MIN};
use crate::{Admission, Decision};
use crate::{Error, WorkerError};
use bytes::{Bytes, BytesMut};
use fastudp_io::pacing::PacingMode;
use fastudp_io::UdpIo;
use fastudp_io::{EcnCodepoint, RecvBatch, RecvMeta, Socket, Steering};
use quinn_proto::{
    ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, EndpointEvent, Event, ServerConfig,
    StreamEvent, VarInt,
};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Forwarded datagrams a worker hands to quinn-proto in one loop turn at
/// most; the rest wait in its ring (or are dropped when it is full).
const FORWARDED_PER_TURN: usize = 128;
/// Bytes of the receive arena's blocks ([`EndpointDriver::arena`]).
const ARENA: usize = 64 * 1024;
/// Messages in one receive call from which a worker takes its socket for
/// busy (a flood, many clients) and starts its next turn without the
/// coalescing wait ([`crate::Tuning::rx_coalesce`]): a quarter of a batch.
/// Light traffic (ACKs: 1-8 a call) is what the wait batches.
const BUSY_RECV: usize = limits::RECV_BATCH / 4;
/// Connections a worker holds per step of its coalescing wait's growth
/// ([`coalescing_wait`]).
const COALESCE_STEP_CONNECTIONS: usize = 3_125;
/// The longest coalescing wait the growth reaches ([`coalescing_wait`]):
/// 16 steps of the default 250 us, at 50,000 connections a worker.
const MAX_GROWN_COALESCE: Duration = Duration::from_millis(4);
/// Cache lines of quinn-proto's connection asked for ahead of a received
/// datagram ([`ConnTable::deliver`]): its first ones (the cell's flag and
/// the fields laid out first).
const CONNECTION_LINES: usize = 4;
/// The longest a worker sleeps without looking at its forwarding channel
/// and the stop flag.
const MAX_WAIT: Duration = Duration::from_millis(10);
/// How long a worker whose send socket is full waits before it tries again.
const BLOCKED_WAIT: Duration = Duration::from_millis(1);
/// How long a stopping server waits for its connections to close: the
/// whole stop takes at most about this, under any flood.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// One connection and its application.
struct Conn {
    /// Shared with the application's handles that outlive one call (the
    /// HTTP/3 backend's); the worker never holds a borrow of it while it
    /// calls the application.
    conn: Rc<RefCell<quinn_proto::Connection>>,
    /// None until the handshake names the ALPN (and after a refusal).
    app: Option<Box<dyn ConnApp>>,
    /// Why it ended, once quinn-proto has said.
    closed: Option<Closed>,
    /// Its key in the timer set.
    timer: Option<Instant>,
    /// Earliest departure of its next train (`--pacing kernel`), ns.
    next_departure: u64,
    /// Packets lost, as last counted.
    lost: u64,
    /// Counted in the worker's handshakes from unvalidated addresses.
    half_open: bool,
    /// Its client's address, and whether it holds a place of that
    /// address's share (`--max-connections-per-ip`).
    address: IpAddr,
    address_counted: bool,
    /// Responses written in full and finished, waiting for the client to
    /// acknowledge their last byte (quinn-proto's
    /// `StreamEvent::Finished`): their lengths, counted as goodput then.
    finishing: Vec<(quinn_proto::StreamId, u64)>,
    /// When a packet of the client was last found to have passed
    /// quinn-proto's decryption (at the first drive after it), and its
    /// frames counted then ([`frames_received`]). The engine drops
    /// the connection `--idle-timeout` after it, whatever quinn-proto's own
    /// idle timer says: that one waits at least 3 probe timeouts, which a
    /// client that acknowledges late stretches without bound.
    heard: Instant,
    frames: u64,
    /// What it holds as the budget counts it ([`limits::held`]), bytes.
    charge: u64,
    /// The windows it is granted now.
    grant: limits::Grant,
    /// Its place, its address's place and its charge were given back
    /// already (it was evicted): [`ConnTable::forget`] gives nothing back.
    released: bool,
    /// Its order of acceptance on this worker: the oldest is evicted first.
    seq: u64,
    /// Requests (client bidirectional streams) open, as last seen.
    bi: u64,
    /// Its application was told of the drain ([`ConnApp::on_drain`]).
    drain_told: bool,
    /// STREAM frames sent and received as last seen, and when that number
    /// last grew (or when no request was open): a response that does not
    /// move for [`limits::STALL_TIMEOUT`] while the client's flow control
    /// blocks it is cut. Received frames count, so an upload is progress.
    progress: (u64, Instant),
    /// DATA_BLOCKED and STREAM_DATA_BLOCKED frames sent as last seen, and
    /// whether one was sent since `progress` last grew: the server has
    /// data the client does not take. A request waiting for a slow
    /// handler or upstream sends none, and is not cut as stalled.
    blocked: (u64, bool),
    /// When `progress` was last read.
    checked: Instant,
    /// What the engine keeps beside it for its application (DATAGRAM
    /// frames received, the embedder's send window).
    side: ConnSide,
    /// Its application's [`ConnApp::timeout`], as read after the
    /// application was last called.
    app_due: Option<Instant>,
    /// Its application's waker was called since its last drive.
    woken: bool,
}

impl Conn {
    /// Idle (no request open) or stalled (a request open and no progress
    /// for [`limits::STALL_EVICT`]), established and holding its places.
    fn evictable(&self, now: Instant) -> bool {
        !self.released
            && !self.half_open
            && self.address_counted
            && self.closed.is_none()
            && (self.bi == 0
                || (self.blocked.1
                    && now.saturating_duration_since(self.progress.1) >= limits::STALL_EVICT))
    }
}

/// When a connection last heard from at `heard` is dropped: `idle` later;
/// never when `idle` is zero (QUIC's "no idle timeout", which quinn-proto
/// takes it for too) or out of the clock's range.
fn idle_deadline(heard: Instant, idle: Duration) -> Option<Instant> {
    if idle.is_zero() {
        return None;
    }
    heard.checked_add(idle)
}

/// Frames quinn-proto has taken from a connection's packets (it grows
/// with each packet that passed decryption, and only then), and the
/// packets it declared lost: one copy of its statistics.
fn frames_and_lost(conn: &quinn_proto::Connection) -> (u64, u64) {
    let st = conn.stats();
    (frames_received(&st.frame_rx), st.path.lost_packets)
}

/// The sum of the frame counters.
fn frames_received(f: &quinn_proto::FrameStats) -> u64 {
    [
        f.acks,
        f.ack_frequency,
        f.crypto,
        f.connection_close,
        f.data_blocked,
        f.datagram,
        u64::from(f.handshake_done),
        f.immediate_ack,
        f.max_data,
        f.max_stream_data,
        f.max_streams_bidi,
        f.max_streams_uni,
        f.new_connection_id,
        f.new_token,
        f.path_challenge,
        f.path_response,
        f.ping,
        f.reset_stream,
        f.retire_connection_id,
        f.stream_data_blocked,
        f.streams_blocked_bidi,
        f.streams_blocked_uni,
        f.stop_sending,
        f.stream,
    ]
    .iter()
    .fold(0u64, |a, &b| a.wrapping_add(b))
}

/// What a worker is given.
pub(crate) struct Setup {
    pub(crate) id: usize,
    pub(crate) workers: usize,
    /// The address the listening sockets are bound to.
    pub(crate) local: SocketAddr,
    /// How the reuseport group steers ([`crate::EngineConfig::steering`]):
    /// a datagram this says is another worker's is handed on.
    pub(crate) steering: Steering,
    pub(crate) server: Arc<ServerConfig>,
    /// `server` with the windows of [`limits::Grant::Small`] and
    /// [`limits::Grant::Minimal`], for connections accepted under
    /// pressure (empty: `server` for all).
    pub(crate) graded: Arc<Vec<Arc<ServerConfig>>>,
    pub(crate) endpoint: Arc<EndpointConfig>,
    /// Every worker's inbox of forwarded datagrams.
    pub(crate) inboxes: Arc<Vec<Inbox>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) stop: Arc<AtomicBool>,
    /// Set by [`crate::Engine::drain`]: refuse newcomers, let each
    /// connection finish what it began, then close it.
    pub(crate) drain: Arc<AtomicBool>,
    /// Every worker's published figures ([`crate::WorkerStats`]).
    pub(crate) gauges: Arc<Vec<crate::stats::WorkerGauges>>,
    /// Set by a worker that stopped on an error.
    pub(crate) failed: Arc<AtomicBool>,
    pub(crate) pacing: PacingMode,
    pub(crate) retry: bool,
    /// Server-wide: the counter is `counters.connections`.
    pub(crate) max_connections: usize,
    /// Handshakes from unvalidated addresses the worker keeps open at most.
    pub(crate) max_half_open: usize,
    /// Connections per client address, server-wide.
    pub(crate) per_address: Arc<limits::PerAddress>,
    /// [`crate::EngineConfig::idle_timeout`]: a connection that receives
    /// no packet for this long is dropped, whatever its RTT.
    pub(crate) idle_timeout: Duration,
    /// [`crate::EngineConfig::transport`]: the windows and streams granted,
    /// and what the budget counts for them.
    pub(crate) transport: crate::Transport,
    /// [`crate::EngineConfig::admission`].
    pub(crate) admission: Option<crate::AdmissionHook>,
    /// The memory budget, server-wide.
    pub(crate) budget: Arc<limits::Budget>,
    /// The application.
    pub(crate) app: Arc<dyn crate::app::Application>,
    /// All workers' rate together, bytes/s.
    pub(crate) total_rate: Option<u64>,
    /// Copy received datagrams into one shared buffer
    /// ([`crate::Tuning::recv_arena`]).
    pub(crate) recv_arena: bool,
    /// [`crate::Tuning::trains_per_turn`].
    pub(crate) trains_per_turn: usize,
    /// [`crate::Tuning::timer_tick`].
    pub(crate) timer_tick: Duration,
    /// [`crate::Tuning::busy_poll`].
    pub(crate) busy_poll: Duration,
    /// [`crate::Tuning::rx_coalesce`].
    pub(crate) rx_coalesce: Duration,
    /// Receive in place from the socket's io_uring ring
    /// ([`crate::EngineConfig::uring`]).
    pub(crate) uring: bool,
    /// Why io_uring was refused, the first time a worker saw it.
    pub(crate) uring_error: Arc<Mutex<Option<String>>>,
}

/// How often a connection's progress is read while a request is open.
const PROGRESS_CHECK: Duration = Duration::from_secs(1);

/// What a new connection is charged until its first drive counts it:
/// its state and its handshake's buffers.
const HANDSHAKE_CHARGE: u64 = limits::CONN_STATE + limits::HANDSHAKE_EXTRA;

/// Takes a place among the server's connections (`max_connections`) and
/// a handshake's memory from the budget; false, with neither taken, when
/// one of them is full.
fn take_place(s: &Setup) -> bool {
    take_place_from(s, false)
}

/// [`take_place`], from the budget's reserve (`reserved`: for an address
/// that holds no connection; `limits::Budget::try_take_reserved`).
fn take_place_from(s: &Setup, reserved: bool) -> bool {
    let max = s.max_connections as u64;
    if s.counters
        .connections
        .fetch_update(Relaxed, Relaxed, |c| (c < max).then_some(c + 1))
        .is_err()
    {
        return false;
    }
    let taken = if reserved {
        s.budget.try_take_reserved(HANDSHAKE_CHARGE)
    } else {
        s.budget.try_take(HANDSHAKE_CHARGE)
    };
    if !taken {
        s.counters.connections.fetch_sub(1, Relaxed);
        return false;
    }
    true
}

/// Handshakes under way server-wide above which clients from unvalidated
/// addresses get a Retry first: half of `max_connections`, and what a
/// quarter of the budget holds of handshakes, so that Initials from
/// sources that never answer cannot fill the budget (they are not
/// evictable).
fn half_open_cap(s: &Setup) -> u64 {
    (s.max_connections as u64 / 2).min(s.budget.hard() / 4 / HANDSHAKE_CHARGE)
}

/// The embedder's decision on `incoming` ([`crate::EngineConfig::admission`]);
/// [`Decision::Accept`] without a hook, [`Decision::Refuse`] (counted as a
/// panic) when the hook panicked.
fn admit(s: &Setup, incoming: &quinn_proto::Incoming) -> Decision {
    let Some(hook) = &s.admission else {
        return Decision::Accept;
    };
    let a = Admission {
        remote: incoming.remote_address(),
        local: local_address(incoming.local_ip(), s.local),
        validated: incoming.remote_address_validated(),
        worker: s.id,
    };
    hook.decide(&a).unwrap_or_else(|| {
        s.counters.app_panics.fetch_add(1, Relaxed);
        Decision::Refuse
    })
}

/// The local address a client sent to: the destination address the
/// kernel reported for its datagram (`IP_PKTINFO`; on a wildcard bind,
/// the address the client chose), else the listening address's; the
/// listening port.
fn local_address(ip: Option<IpAddr>, listen: SocketAddr) -> SocketAddr {
    SocketAddr::new(ip.unwrap_or(listen.ip()), listen.port())
}

/// Gives back what [`take_place`] took, for a connection not made.
fn give_place(s: &Setup) {
    s.counters.connections.fetch_sub(1, Relaxed);
    s.budget.change(HANDSHAKE_CHARGE, 0);
}

/// A newcomer's eviction looks at the connections of this many
/// addresses at most, those holding the most first ...
const EVICT_ADDRESSES: usize = 128;
/// ... at most this many of each, the oldest first ...
const EVICT_PER_ADDRESS: usize = 64;
/// ... and this many in all.
const EVICT_SCAN: usize = 4096;
/// When nothing idle or stalled can go, a newcomer holding N connections
/// evicts the oldest connection of an address holding at least this many
/// times N + 1, busy or not ([`ConnTable::evict_for`]).
const EVICT_BUSY_RATIO: usize = 8;

/// The application close code of a connection closed to make room for a
/// newcomer, or for a response that made no progress, under HTTP/3 and
/// hq-interop: H3_EXCESSIVE_LOAD (RFC 9114 8.1); others say theirs
/// ([`crate::app::Application::close_codes`]).
#[cfg(test)]
pub(crate) const CLOSE_EXCESSIVE_LOAD: u32 = 0x107;

/// The close codes of `conn`'s protocol (its ALPN, once the handshake has
/// named it) as the application says them.
fn close_codes(conn: &quinn_proto::Connection, s: &Setup) -> crate::app::CloseCodes {
    let alpn = conn
        .crypto_session()
        .handshake_data()
        .and_then(|d| {
            d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                .ok()
        })
        .and_then(|h| h.protocol)
        .unwrap_or_default();
    s.app.close_codes(&alpn)
}

/// `v` as a QUIC varint (the largest where it does not fit).
fn varint(v: u64) -> VarInt {
    VarInt::from_u64(v).unwrap_or(VarInt::MAX)
}

fn to_quinn_ecn(e: Option<EcnCodepoint>) -> Option<quinn_proto::EcnCodepoint> {
    e.and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8))
}

/// The endpoint side of a worker: quinn-proto's endpoint, the receive
/// batch, the datagrams other workers forwarded, and the admission
/// policy (which connections it takes, retries or refuses).
pub(crate) struct EndpointDriver {
    endpoint: Endpoint,
    batch: Option<RecvBatch>,
    /// Receiving in place from the socket's io_uring ring: `batch` then
    /// only holds the metadata (and the datagrams, if the ring is taken
    /// down under it).
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    ring: bool,
    /// Forwarded datagrams being worked through (swapped with the inbox
    /// when empty).
    fwd_local: Ring,
    /// Received datagrams are copied here and split off, so that many
    /// share one allocation; a new one is made when the pieces still held
    /// (quinn-proto keeps stream data until it is read) leave no room.
    arena: BytesMut,
    /// Connections accepted whose handshake is not done: above
    /// `--max-half-open`, new clients get a Retry (as with `--retry`), so a
    /// flood of Initials from spoofed addresses costs a stateless reply
    /// each, not a connection's memory. So do they once handshakes
    /// under way hold half of `--max-connections` server-wide
    /// ([`Counters::half_open`]): addresses that never answer can take
    /// at most half of the places, and a client that answers its Retry
    /// finds one of the rest.
    pub(crate) half_open: usize,
    /// The last receive found a busy socket ([`BUSY_RECV`] messages or
    /// more in one call): the next turn starts at once, with no coalescing
    /// wait, in which the socket's buffer could overflow.
    pub(crate) rx_more: bool,
    /// Datagrams the last receive found: at most one, and the traffic is
    /// sparse (keep-alives of idle connections, a lone request), and the
    /// worker does not wait for more before it sleeps
    /// ([`Worker::wait`]).
    pub(crate) rx_last: usize,
}

/// A worker's connections: the table, their timers, and the lists of
/// those to drive; it drives them and hands their events to the
/// application.
pub(crate) struct ConnTable {
    /// By handle (quinn-proto's slab index, not chosen by a client),
    /// taken out and put back at every drive.
    conns: Slots<Conn>,
    pub(crate) timers: BTreeSet<(Instant, ConnectionHandle)>,
    dirty: Vec<ConnectionHandle>,
    /// Datagrams quinn-proto's endpoint routed to a connection, in the
    /// order received, not yet handed to it ([`ConnTable::deliver`]):
    /// those of one receive batch at most (or of the forwarded ones a
    /// turn takes, [`FORWARDED_PER_TURN`]), handed over at its end.
    arrived: Vec<(ConnectionHandle, quinn_proto::ConnectionEvent)>,
    /// Connections that stopped at [`limits::TRAINS_PER_TURN`].
    more: Vec<ConnectionHandle>,
    /// A connection's events, between quinn-proto and the application.
    events: Vec<Event>,
    /// Connections the application's wakers asked to drive again.
    wakes: Wakes,
    /// Packets lost, counted at drives and when connections end, not yet
    /// published.
    lost_unpublished: u64,
    /// The connection being driven (out of `conns` meanwhile): its
    /// places among the server's, as [`Worker::salvage`] gives them back
    /// should the application panic under it.
    in_drive: Option<Places>,
    /// This worker's connections by their address's key, oldest first.
    by_address: HashMap<IpAddr, BTreeSet<(u64, ConnectionHandle)>>,
    /// The next connection's [`Conn::seq`].
    seq: u64,
    /// The server is draining ([`Setup::drain`]).
    pub(crate) draining: bool,
}

/// What a connection holds of the server's counts.
#[derive(Debug, Clone, Copy)]
struct Places {
    half_open: bool,
    address: Option<IpAddr>,
    /// Its charge in the budget.
    charge: u64,
    /// Given back already (evicted): only `half_open` is left to give.
    released: bool,
}

impl Places {
    fn of(c: &Conn) -> Places {
        Places {
            half_open: c.half_open,
            address: c.address_counted.then_some(c.address),
            charge: c.charge,
            released: c.released,
        }
    }

    fn give_back(self, s: &Setup) {
        if self.half_open {
            s.counters.half_open.fetch_sub(1, Relaxed);
        }
        if self.released {
            return;
        }
        s.counters.connections.fetch_sub(1, Relaxed);
        if let Some(a) = self.address {
            s.per_address.give(a);
        }
        s.budget.change(self.charge, 0);
    }
}

/// One worker: its endpoint, its connections, its send side and its
/// part of the application.
pub(crate) struct Worker {
    s: Setup,
    /// The receive socket, of the reuseport group.
    rx: Socket,
    /// The application's part on this worker.
    app: Box<dyn WorkerApp>,
    pub(crate) ep: EndpointDriver,
    pub(crate) table: ConnTable,
    /// The send side: this turn's transmits, the stateless replies, the
    /// socket.
    pub(crate) tx: Tx,
    closing_since: Option<Instant>,
    /// Timers are rounded to ticks counted from here.
    epoch: Instant,
    published: Instant,
    calls_seen: (u64, u64),
    /// The receive socket's kernel drops, as last published.
    overflow_seen: u64,
    /// The ring's buffer exhaustions, as last published.
    #[cfg_attr(not(feature = "uring"), allow(dead_code))]
    exhausted_seen: u64,
}

impl Worker {
    pub(crate) fn new(s: Setup, rx: Socket, tx: Tx) -> Result<Self, Error> {
        rx.as_std()
            .set_nonblocking(true)
            .map_err(|e| Error::Worker {
                index: s.id,
                kind: WorkerError::Io(e),
            })?;
        let allow_mtud = tx
            .socket
            .capabilities()
            .supports(fastudp_io::Feature::DontFragment);
        let endpoint = Endpoint::new(s.endpoint.clone(), Some(s.server.clone()), allow_mtud, None);
        if s.total_rate.is_some() {
            // Pacing is made of waits that end on time; without this they
            // may end 50 us late. Best effort.
            let _ = fastudp_io::pacing::set_timer_slack(1_000);
        }
        // The engine checked its sockets already (and counted those that
        // fell back): this finds the same.
        let ring = s.uring && ring_receive(&rx, &s.counters, &s.uring_error);
        Ok(Worker {
            app: s.app.worker(s.id),
            ep: EndpointDriver {
                endpoint,
                batch: Some(
                    RecvBatch::with_capacity(
                        if ring {
                            limits::RING_BATCH
                        } else {
                            limits::RECV_BATCH
                        },
                        limits::RECV_MESSAGE,
                    )
                    .map_err(|e| Error::Worker {
                        index: s.id,
                        kind: WorkerError::Io(e.into()),
                    })?,
                ),
                ring,
                fwd_local: Ring::new(SLOTS),
                arena: BytesMut::new(),
                half_open: 0,
                rx_more: false,
                rx_last: 0,
            },
            table: ConnTable {
                conns: Slots::default(),
                arrived: Vec::new(),
                timers: BTreeSet::new(),
                dirty: Vec::new(),
                more: Vec::new(),
                events: Vec::new(),
                wakes: Wakes::default(),
                lost_unpublished: 0,
                in_drive: None,
                by_address: HashMap::new(),
                seq: 0,
                draining: false,
            },
            tx,
            closing_since: None,
            epoch: Instant::now(),
            published: Instant::now(),
            calls_seen: (0, 0),
            overflow_seen: 0,
            exhausted_seen: 0,
            rx,
            s,
        })
    }

    pub(crate) fn run(&mut self) -> Result<(), Error> {
        loop {
            let now = Instant::now();
            if !self.table.draining && self.s.drain.load(Relaxed) {
                self.table.start_drain();
            }
            if self.s.stop.load(Relaxed) && self.closing_since.is_none() {
                self.closing_since = Some(now);
                self.table.close_all(now, &self.s);
            }
            if let Some(t) = self.closing_since {
                if self.table.conns.is_empty() || now.duration_since(t) > CLOSE_WAIT {
                    self.tx.flush();
                    self.publish(true);
                    // Connections whose close was not acknowledged in
                    // time end here.
                    for (_, mut c) in self.table.conns.drain() {
                        if let Some(mut app) = c.app.take() {
                            app.on_closed(c.closed.take().unwrap_or(Closed::Locally));
                        }
                    }
                    return Ok(());
                }
            }
            // Newcomers are refused while the server drains or stops.
            let closing = self.closing_since.is_some() || self.table.draining;
            self.ep
                .forwarded(now, &self.s, &mut self.table, &mut self.tx, closing);
            self.ep.receive(
                now,
                &mut self.rx,
                &self.s,
                &mut self.table,
                &mut self.tx,
                closing,
            );
            self.turn(now);
            self.tx.flush();
            if now.duration_since(self.published) > Duration::from_millis(100) {
                self.publish(false);
            }
            self.wait(now);
        }
    }

    /// What a new worker is made of, taken back from one whose loop
    /// panicked: its setup and sockets. Its connections are given up
    /// (their clients' next packets meet a stateless reset) and their
    /// places among the server's connections given back; its
    /// application's part is dropped without further calls.
    pub(crate) fn salvage(self) -> (Setup, Socket, Tx) {
        let Worker {
            s,
            rx,
            tx,
            table,
            ep,
            app,
            ..
        } = self;
        if let Some(p) = table.in_drive {
            p.give_back(&s);
        }
        for c in table.conns.values() {
            Places::of(c).give_back(&s);
        }
        // Dropping what the panic left may panic again: that is caught.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            drop(table);
            drop(app);
            drop(ep);
        }));
        (s, rx, tx)
    }

    /// Fires the timers due and drives every connection that has
    /// something to do (the application's wakes included).
    pub(crate) fn turn(&mut self, now: Instant) {
        self.table.deliver();
        self.table.fire_timers(now);
        let woken = self.table.wakes.take();
        for ch in &woken {
            if let Some(c) = self.table.conns.get_mut(ch) {
                c.woken = true;
            }
        }
        self.table.dirty.extend(woken);
        self.table
            .drive_dirty(now, &mut self.ep, &mut self.tx, &mut *self.app, &self.s);
    }

    /// Waits for a datagram, the next timer, or at most [`MAX_WAIT`]; with
    /// [`crate::Tuning::rx_coalesce`], not before that long after `turn`
    /// (when this turn started). After a turn that received at most one
    /// datagram (sparse traffic: keep-alives, a lone request) the worker
    /// does not sleep that long first, only when a datagram comes within
    /// it: a PING of an idle connection then costs one wake-up, not two.
    fn wait(&mut self, turn: Instant) {
        let now = Instant::now();
        // Connections with more to send wait, as a full socket makes them,
        // while --total-rate's tokens are spent: the next turn could send
        // nothing, and turning until the tokens come back spins a core.
        let paced = self.tx.paced_until();
        let paced_out = paced.is_some_and(|t| t > now);
        if (!self.table.dirty.is_empty() && !self.tx.blocked && !paced_out)
            || !self.ep.fwd_local.is_empty()
            || self.ep.rx_more
        {
            return;
        }
        if !self.table.wakes.is_empty() {
            return;
        }
        let cap = if self.tx.blocked || self.tx.stateless_held {
            BLOCKED_WAIT
        } else {
            MAX_WAIT
        };
        let mut until = self
            .table
            .timers
            .first()
            .map(|&(t, _)| tick_up(t, self.epoch, self.s.timer_tick))
            .unwrap_or(now + cap)
            .min(now + cap);
        if let Some(t) = paced {
            until = until.min(t);
        }
        if until <= now {
            return;
        }
        let coalesced =
            (turn + coalescing_wait(self.s.rx_coalesce, self.table.conns.len())).min(until);
        let sparse = self.ep.rx_last <= 1;
        if coalesced > now && !sparse {
            self.coalesce(coalesced - now);
        }
        if !self.s.busy_poll.is_zero() {
            let spin_end = until.min(Instant::now() + self.s.busy_poll);
            loop {
                if matches!(self.rx.wait_readable(Duration::ZERO), Ok(true)) {
                    return;
                }
                if Instant::now() >= spin_end {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let now = Instant::now();
        if until > now && self.table.wakes.park() {
            let woken = self.wait_for(until - now);
            // Sparse traffic that grows dense: a datagram came within the
            // coalescing wait, which the worker now takes (then more of
            // them arrive for one receive, and the next turn is not
            // sparse). A wake of an application's does not wait.
            let now = Instant::now();
            if sparse && coalesced > now && !woken {
                self.coalesce(coalesced - now);
            }
        }
    }

    /// Sleeps `d` (the coalescing wait), or less when an application's
    /// waker ([`crate::app::AppCx::waker`]) is called meanwhile: the
    /// worker is parked on its eventfd alone, so that the wake is not
    /// held back by the wait (up to [`MAX_GROWN_COALESCE`]). No sleep when
    /// a wake is pending already.
    fn coalesce(&mut self, d: Duration) {
        let wakes = self.table.wakes.clone();
        let Some(efd) = wakes.fd() else {
            std::thread::sleep(d);
            return;
        };
        if !wakes.park() {
            return;
        }
        use rustix::event::{PollFd, PollFlags};
        let mut fds = [PollFd::new(&efd, PollFlags::IN)];
        // EINTR ends the sleep early, as a wake would.
        let _ = rustix::event::poll(&mut fds, Some(&timespec(d)));
        let signalled = !fds[0].revents().is_empty();
        wakes.unpark(signalled);
    }

    /// Waits up to `d` for a datagram or a wake of the application's
    /// ([`crate::app::AppCx::waker`], through the worker's eventfd); the
    /// worker is parked. True when a wake ended the wait.
    fn wait_for(&mut self, d: Duration) -> bool {
        let wakes = self.table.wakes.clone();
        let efd = match wakes.fd() {
            // On a ring (armed) the wait is on its completions, which the
            // eventfd is not part of: a wake from another thread is seen
            // at the next completion or within the wait's cap.
            Some(efd) if !self.ep.ring => efd,
            _ => {
                let _ = self.rx.wait_readable(d);
                wakes.unpark(false);
                return false;
            }
        };
        use rustix::event::{PollFd, PollFlags};
        let sock = self.rx.as_std();
        let mut fds = [
            PollFd::new(sock, PollFlags::IN),
            PollFd::new(&efd, PollFlags::IN),
        ];
        // EINTR ends the wait early, as a timeout would.
        let _ = rustix::event::poll(&mut fds, Some(&timespec(d)));
        let signalled = !fds[1].revents().is_empty();
        wakes.unpark(signalled);
        signalled
    }

    /// Publishes the socket counters and the packets lost (counted at
    /// each drive; at the end, those of every connection still open).
    fn publish(&mut self, last: bool) {
        let c = &self.s.counters;
        let (tx, rx) = (self.tx.socket.stats(), self.rx.stats());
        #[cfg(feature = "uring")]
        if let Some(u) = self.rx.uring_stats() {
            c.uring_exhausted.fetch_add(
                u.buffer_exhausted.saturating_sub(self.exhausted_seen),
                Relaxed,
            );
            self.exhausted_seen = u.buffer_exhausted;
        }
        c.send_calls
            .fetch_add(tx.send_calls.saturating_sub(self.calls_seen.0), Relaxed);
        c.recv_calls
            .fetch_add(rx.recv_calls.saturating_sub(self.calls_seen.1), Relaxed);
        self.calls_seen = (tx.send_calls, rx.recv_calls);
        c.rx_overflow
            .fetch_add(rx.kernel_drops.saturating_sub(self.overflow_seen), Relaxed);
        self.overflow_seen = self.overflow_seen.max(rx.kernel_drops);
        if let Some(g) = self.s.gauges.get(self.s.id) {
            g.connections.store(self.table.conns.len() as u64, Relaxed);
            g.datagrams_sent.store(tx.send_messages, Relaxed);
            g.datagrams_received.store(rx.recv_messages, Relaxed);
            g.send_calls.store(tx.send_calls, Relaxed);
            g.recv_calls.store(rx.recv_calls, Relaxed);
            g.rx_overflow.store(rx.kernel_drops, Relaxed);
        }
        if last {
            // The connections still open at the end: their losses since
            // their last drive.
            for conn in self.table.conns.values_mut() {
                let l = conn.conn.borrow().stats().path.lost_packets;
                self.table.lost_unpublished += l.saturating_sub(conn.lost);
                conn.lost = l;
            }
        }
        c.lost_packets
            .fetch_add(std::mem::take(&mut self.table.lost_unpublished), Relaxed);
        self.published = Instant::now();
    }
}

/// `d` for `poll`.
fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec {
        tv_sec: d.as_secs().min(i32::MAX as u64) as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

/// `t` rounded up to the next multiple of `tick` after `epoch` (`t` itself
/// when `tick` is zero, or when `t` is before `epoch`).
fn tick_up(t: Instant, epoch: Instant, tick: Duration) -> Instant {
    let tick = tick.as_nanos();
    if tick == 0 || t <= epoch {
        return t;
    }
    let since = (t - epoch).as_nanos();
    let up = since.div_ceil(tick) * tick;
    epoch + Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
}

/// A receive that failed: counted, unless it only found nothing.
fn recv_error(e: fastudp_io::Error, s: &Setup) {
    let e = std::io::Error::from(e);
    if e.kind() != std::io::ErrorKind::WouldBlock {
        // ICMP errors for earlier sends (a client that went away) fail
        // receives on the group's sockets; the library reads them off,
        // and the worker goes on.
        s.counters.recv_errors.fetch_add(1, Relaxed);
    }
}

/// Whether `rx` receives from an io_uring ring; when not, the fallback is
/// counted and its reason kept.
pub(crate) fn ring_receive(
    rx: &Socket,
    counters: &Counters,
    reason: &Mutex<Option<String>>,
) -> bool {
    #[cfg(feature = "uring")]
    if rx.uring_stats().is_some_and(|u| u.recv_active) {
        return true;
    }
    fell_back(rx, counters, reason);
    false
}

/// Counts a worker that receives with syscalls although asked for
/// io_uring, and keeps the first reason (the socket's fallback event).
fn fell_back(rx: &Socket, counters: &Counters, reason: &Mutex<Option<String>>) {
    counters.uring_fallbacks.fetch_add(1, Relaxed);
    #[cfg(feature = "uring")]
    let event = rx
        .stats()
        .fallbacks
        .iter()
        .rev()
        .find(|e| e.feature == fastudp_io::Feature::Uring)
        .map(|e| e.reason.clone());
    // Without the feature the engine refuses the setting at start.
    #[cfg(not(feature = "uring"))]
    let event = {
        let _ = rx;
        None
    };
    let why =
        event.unwrap_or_else(|| "the io_uring receive is not available; using syscalls".into());
    reason
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(why);
}

impl EndpointDriver {
    /// Hands at most [`FORWARDED_PER_TURN`] datagrams other workers
    /// forwarded to quinn-proto.
    fn forwarded(
        &mut self,
        now: Instant,
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
    ) {
        s.inboxes[s.id].take_into(&mut self.fwd_local);
        let mut local = std::mem::replace(&mut self.fwd_local, Ring::new(0));
        for _ in 0..FORWARDED_PER_TURN {
            let Some((m, d)) = local.pop() else { break };
            self.datagram(
                now,
                m.source,
                m.destination,
                m.ecn,
                d,
                s,
                table,
                tx,
                closing,
            );
        }
        table.deliver();
        self.fwd_local = local;
    }

    /// Reads what is queued (a few batches at most, so that sends are not
    /// starved) and hands each datagram to quinn-proto.
    fn receive(
        &mut self,
        now: Instant,
        rx: &mut Socket,
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
    ) {
        self.rx_more = false;
        self.rx_last = 0;
        #[cfg(feature = "uring")]
        if self.ring {
            return self.receive_in_place(now, rx, s, table, tx, closing);
        }
        for _ in 0..8 {
            let Some(b) = self.batch.as_mut() else { break };
            match rx.recv(b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    recv_error(e, s);
                    break;
                }
            }
            let Some(batch) = self.batch.take() else {
                break;
            };
            for (meta, d) in batch.datagrams() {
                self.received(now, meta, d, s, table, tx, closing);
            }
            table.deliver();
            self.rx_last += batch.len();
            let full = batch.len() == batch.capacity();
            self.rx_more |= batch.len() >= BUSY_RECV;
            self.batch = Some(batch);
            if !full {
                break;
            }
        }
    }

    /// [`EndpointDriver::receive`] from the socket's io_uring ring: each
    /// datagram is read where the kernel wrote it, in a provided buffer
    /// lent for the batch (`Socket::recv_borrowed`), and copied once,
    /// into the buffer quinn-proto takes (or a forwarding slot); the
    /// buffers go back to the kernel when the batch is done. As many
    /// messages per turn as the syscall path reads at most.
    #[cfg(feature = "uring")]
    fn receive_in_place(
        &mut self,
        now: Instant,
        rx: &mut Socket,
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
    ) {
        let mut messages = 0;
        while messages < 8 * limits::RECV_BATCH {
            let Some(mut scratch) = self.batch.take() else {
                break;
            };
            let cap = scratch.capacity();
            let got = match rx.recv_borrowed(&mut scratch) {
                Ok(view) => {
                    let in_ring = view.in_ring();
                    for (meta, d) in view.datagrams() {
                        if in_ring {
                            s.counters.recv_in_place.add(s.id, 1);
                        }
                        self.received(now, meta, d, s, table, tx, closing);
                    }
                    table.deliver();
                    // The view ends here: its buffers go back to the kernel.
                    Ok((view.len(), in_ring))
                }
                Err(e) => Err(e),
            };
            self.batch = Some(scratch);
            match got {
                Ok((n, in_ring)) => {
                    if !in_ring {
                        // The library took the ring down (a multishot
                        // receive the kernel refused, say) and received
                        // with a syscall: so does this worker from now.
                        self.ring = false;
                        self.batch = Some(RecvBatch::new(limits::RECV_BATCH));
                        fell_back(rx, &s.counters, &s.uring_error);
                        return;
                    }
                    messages += n;
                    self.rx_last = messages;
                    self.rx_more |= n >= BUSY_RECV.min(cap);
                    if n < cap {
                        break;
                    }
                }
                Err(e) => {
                    recv_error(e, s);
                    break;
                }
            }
        }
    }

    /// One received datagram: handed to its owner's ring when another
    /// worker owns its connection, to quinn-proto otherwise.
    #[allow(clippy::too_many_arguments)]
    fn received(
        &mut self,
        now: Instant,
        meta: &RecvMeta,
        d: &[u8],
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
    ) {
        s.counters.datagrams_recv.add(s.id, 1);
        let owner = s.steering.owner(d, s.workers).unwrap_or(s.id);
        if owner != s.id && !d.is_empty() {
            let c = &s.counters;
            if s.inboxes[owner].push(meta.source, meta.destination, meta.ecn, d) {
                c.forwarded.add(s.id, 1);
            } else {
                c.forward_dropped.fetch_add(1, Relaxed);
            }
            return;
        }
        self.datagram(
            now,
            meta.source,
            meta.destination,
            meta.ecn,
            d,
            s,
            table,
            tx,
            closing,
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn datagram(
        &mut self,
        now: Instant,
        source: SocketAddr,
        destination: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        d: &[u8],
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
    ) {
        // What quinn-proto writes here is a stateless reply, one datagram.
        let mut buf = tx.small_spare.pop().unwrap_or_default();
        buf.clear();
        buf.reserve(STATELESS_BUF);
        let data = if s.recv_arena {
            if self.arena.capacity() < d.len() {
                // Reclaims the old block when nothing holds a piece of it.
                self.arena.reserve(ARENA.max(d.len()));
            }
            self.arena.extend_from_slice(d);
            self.arena.split()
        } else {
            BytesMut::from(d)
        };
        let ev = self
            .endpoint
            .handle(now, source, destination, to_quinn_ecn(ecn), data, &mut buf);
        match ev {
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                // Handed to the connection with the rest of the batch
                // (`ConnTable::deliver`), at the batch's end.
                table.arrived.push((ch, ev));
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                return self.new_connection(incoming, now, s, table, tx, closing, buf);
            }
            Some(DatagramEvent::Response(t)) => return tx.stateless(&t, buf),
            None => {
                s.counters.dropped.add(s.id, 1);
            }
        }
        keep_spare(&mut tx.small_spare, buf, STATELESS_QUEUE);
    }

    /// A client's first datagram: the connection is refused, asked to
    /// retry (address validation), or accepted. `buf` holds any stateless
    /// reply, and goes back to the spares otherwise.
    #[allow(clippy::too_many_arguments)]
    fn new_connection(
        &mut self,
        incoming: quinn_proto::Incoming,
        now: Instant,
        s: &Setup,
        table: &mut ConnTable,
        tx: &mut Tx,
        closing: bool,
        mut buf: Vec<u8>,
    ) {
        // A place among the server's connections and its handshake's
        // memory, taken now and given back when the connection goes (or
        // is not made).
        let max = s.max_connections as u64;
        let mut placed = !closing && take_place(s);
        if !placed && !closing {
            // Full: a newcomer whose address is validated may take the
            // place of an idle or stalled connection of the address holding
            // the most; one not validated is asked to prove its address
            // first, so that a spoofed source cannot evict anyone.
            if !incoming.remote_address_validated() && incoming.may_retry() {
                match self.endpoint.retry(incoming, &mut buf) {
                    Ok(t) => {
                        s.counters.retries.fetch_add(1, Relaxed);
                        return tx.stateless(&t, buf);
                    }
                    Err(e) => {
                        self.endpoint.ignore(e.into_incoming());
                        return keep_spare(&mut tx.small_spare, buf, STATELESS_QUEUE);
                    }
                }
            }
            // A light connection evicted may free less memory than a
            // handshake takes: up to 4 make room for one.
            if incoming.remote_address_validated() {
                let ip = incoming.remote_address().ip();
                for _ in 0..4 {
                    if !table.evict_for(ip, now, s) {
                        break;
                    }
                    placed = take_place(s);
                    if placed {
                        break;
                    }
                }
                // Still no room, the memory full of clients that refill
                // what is freed: an address that holds nothing takes its
                // handshake from the budget's reserve.
                if !placed && s.per_address.count(ip) == 0 {
                    placed = take_place_from(s, true);
                }
            }
        }
        if !placed {
            let t = self.endpoint.refuse(incoming, &mut buf);
            s.counters.refused.fetch_add(1, Relaxed);
            if closing {
                s.counters.refused_draining.fetch_add(1, Relaxed);
            } else if s.counters.connections.load(Relaxed) < max {
                s.counters.refused_memory.fetch_add(1, Relaxed);
            }
            return tx.stateless(&t, buf);
        } else if (s.retry
            || self.half_open >= s.max_half_open
            || s.counters.half_open.load(Relaxed) >= half_open_cap(s))
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            give_place(s);
            match self.endpoint.retry(incoming, &mut buf) {
                Ok(t) => {
                    s.counters.retries.fetch_add(1, Relaxed);
                    return tx.stateless(&t, buf);
                }
                Err(e) => self.endpoint.ignore(e.into_incoming()),
            }
        } else {
            match admit(s, &incoming) {
                Decision::Refuse => {
                    give_place(s);
                    let t = self.endpoint.refuse(incoming, &mut buf);
                    s.counters.refused.fetch_add(1, Relaxed);
                    s.counters.refused_admission.fetch_add(1, Relaxed);
                    return tx.stateless(&t, buf);
                }
                Decision::Retry if !incoming.remote_address_validated() && incoming.may_retry() => {
                    give_place(s);
                    match self.endpoint.retry(incoming, &mut buf) {
                        Ok(t) => {
                            s.counters.retries.fetch_add(1, Relaxed);
                            return tx.stateless(&t, buf);
                        }
                        Err(e) => self.endpoint.ignore(e.into_incoming()),
                    }
                }
                _ => {
                    if let Some(t) = self.accept(incoming, now, s, table, &mut buf) {
                        return tx.stateless(&t, buf);
                    }
                }
            }
        }
        keep_spare(&mut tx.small_spare, buf, STATELESS_QUEUE);
    }

    /// Accepts a connection that has its place among the server's: it
    /// goes into the table, half open. A stateless reply to send instead
    /// (a refusal) comes back, written into `buf`.
    fn accept(
        &mut self,
        incoming: quinn_proto::Incoming,
        now: Instant,
        s: &Setup,
        table: &mut ConnTable,
        buf: &mut Vec<u8>,
    ) -> Option<quinn_proto::Transmit> {
        // A validated address (a Retry token) takes its place
        // of its share now; others once the handshake is done.
        let address = incoming.remote_address().ip();
        let address_counted = incoming.remote_address_validated();
        if address_counted && !s.per_address.take(address) {
            give_place(s);
            let t = self.endpoint.refuse(incoming, buf);
            s.counters.refused.fetch_add(1, Relaxed);
            s.counters.refused_per_ip.fetch_add(1, Relaxed);
            return Some(t);
        }
        let grant = s.budget.grant();
        let graded = match grant {
            limits::Grant::Full => None,
            limits::Grant::Small => s.graded.first().cloned(),
            limits::Grant::Minimal => s.graded.get(1).cloned(),
        };
        let grant = if graded.is_some() {
            grant
        } else {
            limits::Grant::Full
        };
        match self.endpoint.accept(incoming, now, buf, graded) {
            Ok((ch, conn)) => {
                let frames = frames_and_lost(&conn).0;
                s.counters.accepted.fetch_add(1, Relaxed);
                self.half_open += 1;
                s.counters.half_open.fetch_add(1, Relaxed);
                let seq = table.seq;
                table.seq += 1;
                table
                    .by_address
                    .entry(limits::address_key(address))
                    .or_default()
                    .insert((seq, ch));
                table.conns.insert(
                    ch,
                    Box::new(Conn {
                        conn: Rc::new(RefCell::new(conn)),
                        app: None,
                        closed: None,
                        timer: None,
                        next_departure: 0,
                        lost: 0,
                        half_open: true,
                        address,
                        address_counted,
                        finishing: Vec::new(),
                        heard: now,
                        frames,
                        charge: HANDSHAKE_CHARGE,
                        grant,
                        released: false,
                        seq,
                        bi: 0,
                        drain_told: false,
                        progress: (0, now),
                        blocked: (0, false),
                        checked: now,
                        side: ConnSide::new(&s.transport),
                        app_due: None,
                        woken: false,
                    }),
                );
                table.dirty.push(ch);
                None
            }
            Err(e) => {
                give_place(s);
                if address_counted {
                    s.per_address.give(address);
                }
                e.response
            }
        }
    }
}

impl ConnTable {
    /// Hands the datagrams held ([`ConnTable::arrived`]) to their
    /// connections, and marks those to drive. The connections of idle
    /// clients (a keep-alive every 15 s) are cold: each is reached through
    /// three dependent loads (its slot, its box, quinn-proto's connection),
    /// every one a cache miss. Asking for each level of the whole batch
    /// before the next makes the misses of a batch overlap, instead of
    /// coming one after another. The whole of the worker's own part of a
    /// connection (6 lines) is asked for, as its drive reads fields all
    /// over it; of quinn-proto's (6 KB) only the first lines: asking for
    /// all of it measured dearer (docs/BENCHMARKS.md section 29).
    pub(crate) fn deliver(&mut self) {
        if self.arrived.is_empty() {
            return;
        }
        let mut arrived = std::mem::take(&mut self.arrived);
        for (ch, _) in &arrived {
            self.conns.prefetch_slot(ch);
        }
        for (ch, _) in &arrived {
            self.conns.prefetch_value(ch);
        }
        for (ch, _) in &arrived {
            if let Some(c) = self.conns.get(ch) {
                prefetch_lines(Rc::as_ptr(&c.conn), CONNECTION_LINES);
                if let Some(app) = &c.app {
                    prefetch((&**app as *const dyn ConnApp).cast::<u8>());
                }
            }
        }
        for (ch, ev) in arrived.drain(..) {
            if let Some(c) = self.conns.get_mut(&ch) {
                // What it decrypted is counted once per drive
                // (`ConnTable::drive`), not per datagram.
                c.conn.borrow_mut().handle_event(ev);
                self.dirty.push(ch);
            }
        }
        // A batch of GRO trains can hold thousands: that room is not kept.
        arrived.shrink_to(limits::RECV_BATCH);
        self.arrived = arrived;
    }

    pub(crate) fn fire_timers(&mut self, now: Instant) {
        while let Some(&(t, ch)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.conns.get_mut(&ch) {
                c.timer = None;
                let mut conn = c.conn.borrow_mut();
                if conn.poll_timeout().is_some_and(|q| q <= now) {
                    conn.handle_timeout(now);
                }
                self.dirty.push(ch);
            }
        }
    }

    fn drive_dirty(
        &mut self,
        now: Instant,
        ep: &mut EndpointDriver,
        tx: &mut Tx,
        app: &mut dyn WorkerApp,
        s: &Setup,
    ) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable_by_key(|h| h.0);
        dirty.dedup();
        for ch in dirty.drain(..) {
            self.drive(ch, now, ep, tx, app, s);
            // The queue of trains stays short: what it holds goes out
            // before more connections add to it.
            if tx.pending.len() + tx.zc_pending.len() >= PENDING_TRAINS {
                tx.flush();
            }
        }
        // Connections that have more to send go on next turn.
        dirty.append(&mut self.more);
        self.dirty = dirty;
    }

    /// Lets one connection do all it can now: endpoint events, its
    /// events to the application, transmits; then sets its timer.
    fn drive(
        &mut self,
        ch: ConnectionHandle,
        now: Instant,
        ep: &mut EndpointDriver,
        tx: &mut Tx,
        app: &mut dyn WorkerApp,
        s: &Setup,
    ) {
        let Some(mut c) = self.conns.remove(&ch) else {
            return;
        };
        self.in_drive = Some(Places::of(&c));
        // Files opened for it count against its address's descriptors.
        let _peer = crate::files::Peer::set(c.address);
        let counters = &*s.counters;
        let mut trains = 0;
        let mut gone = false;
        // Frames decrypted since the last drive: the client was heard.
        // Every connection a datagram reaches is driven in the same turn.
        // Its packets lost are counted here too (and when it ends), not
        // by a pass over every connection: an idle one loses none.
        let (frames, lost) = frames_and_lost(&c.conn.borrow());
        if frames != c.frames {
            c.frames = frames;
            c.heard = now;
        }
        self.lost_unpublished += lost.saturating_sub(c.lost);
        c.lost = lost;
        if idle_deadline(c.heard, s.idle_timeout).is_some_and(|t| now >= t) {
            // Nothing heard for the idle timeout: the connection is
            // dropped silently, as quinn-proto's idle timeout would (RFC
            // 9000 10.1), but not later, however long the RTT it measured.
            // The endpoint forgets its handle and connection IDs now.
            ep.endpoint.handle_event(ch, EndpointEvent::drained());
            c.closed.get_or_insert(Closed::TimedOut);
            gone = true;
        }
        let mut events = std::mem::take(&mut self.events);
        while !gone {
            let mut again = false;
            {
                let mut conn = c.conn.borrow_mut();
                while let Some(ev) = conn.poll_endpoint_events() {
                    let drained = ev.is_drained();
                    if let Some(back) = ep.endpoint.handle_event(ch, ev) {
                        conn.handle_event(back);
                        again = true;
                    }
                    if drained {
                        // The endpoint has forgotten the handle: nothing more
                        // of this connection may reach it.
                        gone = true;
                        break;
                    }
                }
                if !gone {
                    while let Some(ev) = conn.poll() {
                        events.push(ev);
                    }
                }
            }
            if gone {
                break;
            }
            again |= !events.is_empty();
            if self.draining {
                // Told before it hears of the streams that came meanwhile.
                Self::drain_one(&mut c, now, counters, (&self.wakes, ch), false);
            }
            let dispatched = !events.is_empty();
            for ev in events.drain(..) {
                self.dispatch(ch, &mut c, ev, now, app, s);
            }
            // The application is called only when it has something to
            // do: events, a wake, its timeout, the drain, or the
            // connection closed. A keep-alive of an idle connection gives
            // it none, and its memory (cold since the last one, 15 s
            // earlier) is not touched.
            let woken = std::mem::take(&mut c.woken);
            let forced = dispatched || woken || self.draining || c.conn.borrow().is_closed();
            // Called anyway: its deadline as it is now (an event may have
            // moved it); otherwise as read after its last call.
            let due = match &c.app {
                Some(a) if forced => a.timeout(),
                _ => c.app_due,
            };
            let timeout_due = due.is_some_and(|t| t <= now);
            let call = forced || timeout_due;
            if let Some(app) = c.app.as_mut().filter(|_| call) {
                let mut cx = AppCx::new(
                    &c.conn,
                    now,
                    &mut c.finishing,
                    &mut c.side,
                    counters,
                    (&self.wakes, ch),
                );
                if timeout_due {
                    app.on_event(&mut cx, AppEvent::Timeout);
                }
                app.poll(&mut cx);
                c.app_due = app.timeout();
            }
            if c.side.arrived {
                // What quinn-proto's full buffer pushed out is counted now.
                c.side.settle(&mut c.conn.borrow_mut(), counters);
            }
            if self.draining {
                again |= Self::drain_one(&mut c, now, counters, (&self.wakes, ch), true);
                c.app_due = c.app.as_ref().and_then(|a| a.timeout());
            }
            self.transmits(ch, &mut c, now, tx, s, &mut trains);
            if !again {
                break;
            }
        }
        self.events = events;
        if !gone {
            self.account(ch, &mut c, now, s);
        }
        let drained = c.conn.borrow().is_drained();
        self.settle_half_open(ch, &mut c, now, ep, s, gone || drained);
        self.in_drive = None;
        if gone || drained {
            self.forget(ch, &mut c, s);
            return;
        }
        self.set_timer(ch, &mut c, s.idle_timeout);
        self.conns.insert(ch, c);
    }

    /// Queues connection `c`'s transmits (quinn-proto's pacer says when to
    /// stop), up to the turn's share of trains (`trains` so far) or a full
    /// queue: it then goes on next turn.
    fn transmits(
        &mut self,
        ch: ConnectionHandle,
        c: &mut Conn,
        now: Instant,
        tx: &mut Tx,
        s: &Setup,
        trains: &mut usize,
    ) {
        loop {
            if *trains == s.trains_per_turn
                || tx.blocked
                || tx.pending.len() + tx.zc_pending.len() >= PENDING_TRAINS
            {
                self.more.push(ch);
                break;
            }
            *trains += 1;
            let mut buf = tx.take_buf();
            let mut conn = c.conn.borrow_mut();
            // Larger datagrams (path-MTU discovery past 1452 bytes), fewer
            // of them: a train is one `sendmsg` of at most 64 KiB.
            let n = tx
                .max_train
                .min(crate::MAX_GSO_PAYLOAD / usize::from(conn.current_mtu()).max(1))
                .max(1);
            let t = conn.poll_transmit(now, n, &mut buf);
            drop(conn);
            let Some(t) = t else {
                tx.give_buf(buf);
                break;
            };
            let txtime = (s.pacing == PacingMode::Kernel).then(|| departure(c, t.size));
            if tx.zc.is_some() && t.size >= ZEROCOPY_MIN {
                buf.truncate(t.size);
                tx.zc_pending.push(Pending::new(&t, buf, txtime));
            } else {
                tx.queue(&t, buf, txtime);
            }
        }
    }

    /// A half-open connection whose handshake ended (or that is `ending`)
    /// is no longer counted half open. The handshake validated the
    /// address: the connection takes its place of the address's share,
    /// or is closed.
    fn settle_half_open(
        &mut self,
        ch: ConnectionHandle,
        c: &mut Conn,
        now: Instant,
        ep: &mut EndpointDriver,
        s: &Setup,
        ending: bool,
    ) {
        let handshaking = c.conn.borrow().is_handshaking();
        if c.half_open && (ending || !handshaking) {
            c.half_open = false;
            ep.half_open -= 1;
            s.counters.half_open.fetch_sub(1, Relaxed);
            if !ending && !c.address_counted {
                if s.per_address.take(c.address) {
                    c.address_counted = true;
                } else {
                    let code = close_codes(&c.conn.borrow(), s).address_limit;
                    c.conn.borrow_mut().close(
                        now,
                        varint(code),
                        Bytes::from_static(b"too many connections from this address"),
                    );
                    s.counters.refused.fetch_add(1, Relaxed);
                    s.counters.refused_per_ip.fetch_add(1, Relaxed);
                    // Its close goes out next turn.
                    self.more.push(ch);
                }
            }
        }
    }

    /// Drops a connection that is gone: its timer, its place among the
    /// server's and its address's connections, and its application.
    fn forget(&mut self, ch: ConnectionHandle, c: &mut Conn, s: &Setup) {
        if let Some(t) = c.timer {
            self.timers.remove(&(t, ch));
        }
        let stats = c.conn.borrow().stats();
        self.lost_unpublished += stats.path.lost_packets.saturating_sub(c.lost);
        // What the application never read of the DATAGRAM frames.
        c.side.end(stats.frame_rx.datagram, &s.counters);
        self.release(ch, c, s);
        if let Some(set) = self.by_address.get_mut(&limits::address_key(c.address)) {
            set.remove(&(c.seq, ch));
            if set.is_empty() {
                self.by_address.remove(&limits::address_key(c.address));
            }
        }
        if let Some(mut app) = c.app.take() {
            app.on_closed(c.closed.take().unwrap_or(Closed::Locally));
        }
        // The table gives back its room as connections go.
        self.conns.shrink();
    }

    /// Gives back connection `c`'s place among the server's, its place of
    /// its address's share and its charge, once.
    fn release(&mut self, _ch: ConnectionHandle, c: &mut Conn, s: &Setup) {
        if c.released {
            return;
        }
        c.released = true;
        s.counters.connections.fetch_sub(1, Relaxed);
        if c.address_counted {
            s.per_address.give(c.address);
        }
        s.budget.change(c.charge, 0);
        c.charge = 0;
    }

    /// Counts what connection `c` holds in the budget, grants it the
    /// windows the budget's level allows, and cuts it when a response has
    /// made no progress for [`limits::STALL_TIMEOUT`].
    fn account(&mut self, ch: ConnectionHandle, c: &mut Conn, now: Instant, s: &Setup) {
        if c.released {
            return;
        }
        let mut conn = c.conn.borrow_mut();
        if conn.is_closed() {
            // What it holds goes when it is drained; no new grant.
            return;
        }
        let handshaking = conn.is_handshaking();
        let bi = conn.streams().remote_open_streams(quinn_proto::Dir::Bi);
        let uni = conn.streams().remote_open_streams(quinn_proto::Dir::Uni);
        let grant = s.budget.grant();
        if grant != c.grant {
            conn.set_max_concurrent_streams(
                quinn_proto::Dir::Bi,
                VarInt::from_u32(s.transport.grant_streams(grant)),
            );
            conn.set_receive_window(
                VarInt::from_u64(s.transport.grant_receive_window(grant)).unwrap_or(VarInt::MAX),
            );
            if grant == limits::Grant::Full {
                conn.set_send_window(s.transport.grant_send_window(grant));
            }
            c.grant = grant;
        }
        if grant != limits::Grant::Full {
            // The application may have set its own since.
            conn.set_send_window(s.transport.grant_send_window(grant));
        }
        // Progress is read at most once a second (the connection's
        // statistics are a copy): a stall is cut within 1 s of its
        // deadline.
        if bi > 0 && (c.bi == 0 || now >= c.checked + PROGRESS_CHECK) {
            c.checked = now;
            let st = conn.stats();
            let moved = st.frame_tx.stream + st.frame_rx.stream;
            let blocked = st.frame_tx.stream_data_blocked + st.frame_tx.data_blocked;
            let fresh = c.bi == 0 || moved != c.progress.0;
            if fresh {
                c.progress = (moved, now);
                c.blocked.1 = false;
            }
            if blocked != c.blocked.0 {
                c.blocked = (blocked, true);
            }
            if !fresh
                && c.blocked.1
                && now.saturating_duration_since(c.progress.1) >= limits::STALL_TIMEOUT
            {
                let code = close_codes(&conn, s).excessive_load;
                conn.close(now, varint(code), Bytes::from_static(b"no progress"));
                s.counters.stalled_cut.fetch_add(1, Relaxed);
                self.more.push(ch);
            }
        } else if bi == 0 {
            c.progress.1 = now;
        }
        c.bi = bi;
        let held = s.transport.held(handshaking, bi, uni, c.grant);
        s.budget.change(c.charge, held);
        c.charge = held;
    }

    /// The server is full: makes room for a newcomer from `ip`, if its
    /// address holds fewer than its share and at least two fewer than
    /// another, by closing the oldest idle or stalled connection (of this
    /// worker's) of its own address, or else of the address holding the
    /// most that has one ([`EVICT_ADDRESSES`] addresses and
    /// [`EVICT_SCAN`] connections looked at, at most). True when one was
    /// closed (its places are free at once).
    pub(crate) fn evict_for(&mut self, ip: IpAddr, now: Instant, s: &Setup) -> bool {
        let mine = s.per_address.count(ip);
        if mine >= s.per_address.max() {
            return false;
        }
        let top = s.per_address.top(mine + 1, EVICT_ADDRESSES);
        if top.is_empty() {
            return false;
        }
        // An address holding an idle or stalled connection of its own
        // gives up that one first: one that refills what the server cuts
        // would otherwise take every idle place as it appears, before a
        // newcomer holding nothing could. Then the addresses holding the
        // most; those whose connections are all busy (requests open and
        // moving, or waiting for the application) are passed over, so
        // that a few of them at the top cannot shield the idle places of
        // the others. The connections looked at are bounded.
        let own = limits::address_key(ip);
        let mut left = EVICT_SCAN;
        // The last resort, below: an address holding many times what the
        // newcomer holds.
        let heavy: Vec<IpAddr> = top
            .iter()
            .filter(|&&(_, held)| held >= EVICT_BUSY_RATIO * (mine + 1))
            .map(|&(k, _)| k)
            .collect();
        for key in std::iter::once(own).chain(top.into_iter().map(|(k, _)| k)) {
            if left == 0 {
                break;
            }
            let Some(set) = self.by_address.get(&key) else {
                continue;
            };
            let looked = set.len().min(EVICT_PER_ADDRESS).min(left);
            left -= looked;
            let victim = set
                .iter()
                .take(looked)
                .map(|&(_, ch)| ch)
                .find(|ch| self.conns.get(ch).is_some_and(|c| c.evictable(now)));
            let Some(ch) = victim else { continue };
            if self.evict(ch, now, s) {
                return true;
            }
        }
        // Nothing idle or stalled among those looked at: addresses that
        // refill every place the server frees with a request that has not
        // stalled yet would keep a newcomer out for good. An address
        // holding at least EVICT_BUSY_RATIO times what the newcomer holds
        // (plus one) gives up its oldest connection, busy or not: when
        // full, places go to the addresses holding the fewest.
        for key in heavy {
            let oldest = self
                .by_address
                .get(&key)
                .and_then(|set| set.iter().next().map(|&(_, ch)| ch));
            if let Some(ch) = oldest {
                if self.evict(ch, now, s) {
                    return true;
                }
            }
        }
        false
    }

    /// Closes connection `ch` to make room (0x107, "evicted: the server
    /// is full") and gives its places back now; counted in `evicted`.
    fn evict(&mut self, ch: ConnectionHandle, now: Instant, s: &Setup) -> bool {
        let Some(mut c) = self.conns.remove(&ch) else {
            return false;
        };
        let code = close_codes(&c.conn.borrow(), s).excessive_load;
        c.conn.borrow_mut().close(
            now,
            varint(code),
            Bytes::from_static(b"evicted: the server is full"),
        );
        self.release(ch, &mut c, s);
        s.counters.evicted.fetch_add(1, Relaxed);
        self.conns.insert(ch, c);
        self.dirty.push(ch);
        true
    }

    /// Sets connection `c`'s timer to its next deadline: quinn-proto's,
    /// its application's, the end of its `idle` time without a packet, or
    /// the end of a response's time without progress, whichever comes
    /// first.
    fn set_timer(&mut self, ch: ConnectionHandle, c: &mut Conn, idle: Duration) {
        // While a request is open: once, 2 s after its last progress (and
        // a second after the last look), the connection is looked at
        // again, so that a response the client's flow control blocks is
        // known stalled, and evictable, whether or not the client sends
        // anything (its next keep-alive may be 25 s away); then at the
        // cut.
        let stall = (c.bi > 0 && !c.released).then(|| {
            let evictable = c.progress.1 + limits::STALL_EVICT;
            if !c.blocked.1 && c.checked < evictable {
                evictable.max(c.checked + PROGRESS_CHECK)
            } else {
                c.progress.1 + limits::STALL_TIMEOUT
            }
        });
        let next = [
            c.conn.borrow_mut().poll_timeout(),
            c.app_due,
            idle_deadline(c.heard, idle),
            stall,
        ]
        .into_iter()
        .flatten()
        .min();
        if next != c.timer {
            if let Some(t) = c.timer {
                self.timers.remove(&(t, ch));
            }
            if let Some(t) = next {
                self.timers.insert((t, ch));
            }
            c.timer = next;
        }
    }

    /// Hands one of a connection's events to its application (accepting
    /// its streams, counting goodput, answering STOP_SENDING first).
    fn dispatch(
        &mut self,
        ch: ConnectionHandle,
        c: &mut Conn,
        ev: Event,
        now: Instant,
        app: &mut dyn WorkerApp,
        s: &Setup,
    ) {
        let counters = &*s.counters;
        let app_ev = match ev {
            Event::HandshakeDataReady => {
                Self::accept(c, now, app, s);
                if self.draining {
                    // Its handshake ended during a drain: told at once.
                    Self::drain_one(c, now, counters, (&self.wakes, ch), false);
                }
                return;
            }
            Event::ConnectionLost { reason } => {
                c.closed = Some(Closed::from(&reason));
                return;
            }
            Event::Stream(StreamEvent::Opened { dir }) => {
                let d = match dir {
                    quinn_proto::Dir::Bi => Dir::Bi,
                    quinn_proto::Dir::Uni => Dir::Uni,
                };
                loop {
                    let id = c.conn.borrow_mut().streams().accept(quinn_dir(d));
                    let Some(id) = id else { break };
                    match c.app.as_mut() {
                        Some(app) => {
                            let mut cx = AppCx::new(
                                &c.conn,
                                now,
                                &mut c.finishing,
                                &mut c.side,
                                counters,
                                (&self.wakes, ch),
                            );
                            app.on_event(&mut cx, AppEvent::Opened(id.into()));
                        }
                        None => {
                            // No application (refused): the stream is
                            // given back at once.
                            let mut conn = c.conn.borrow_mut();
                            let _ = conn.recv_stream(id).stop(VarInt::from_u32(REFUSED));
                            if d == Dir::Bi {
                                let _ = conn.send_stream(id).reset(VarInt::from_u32(REFUSED));
                            }
                        }
                    }
                }
                return;
            }
            Event::Stream(StreamEvent::Readable { id }) => AppEvent::Readable(id.into()),
            Event::Stream(StreamEvent::Writable { id }) => AppEvent::Writable(id.into()),
            Event::Stream(StreamEvent::Finished { id }) => {
                // Every byte of the stream is acknowledged.
                if let Some(i) = c.finishing.iter().position(|f| f.0 == id) {
                    let (_, len) = c.finishing.swap_remove(i);
                    counters.app_bytes.fetch_add(len, Relaxed);
                }
                AppEvent::Finished(id.into())
            }
            Event::Stream(StreamEvent::Stopped { id, error_code }) => {
                // RFC 9000 3.5: a STOP_SENDING is answered with a
                // RESET_STREAM, which also gives the stream's credit back.
                let _ = c.conn.borrow_mut().send_stream(id).reset(error_code);
                c.finishing.retain(|f| f.0 != id);
                AppEvent::Stopped(id.into(), error_code.into_inner())
            }
            Event::Stream(StreamEvent::Available { dir }) => AppEvent::CanOpen(match dir {
                quinn_proto::Dir::Bi => Dir::Bi,
                quinn_proto::Dir::Uni => Dir::Uni,
            }),
            Event::DatagramReceived => {
                c.side.arrived = true;
                AppEvent::Datagram
            }
            Event::DatagramsUnblocked => AppEvent::DatagramsWritable,
            _ => return,
        };
        if let Some(app) = c.app.as_mut() {
            let mut cx = AppCx::new(
                &c.conn,
                now,
                &mut c.finishing,
                &mut c.side,
                counters,
                (&self.wakes, ch),
            );
            app.on_event(&mut cx, app_ev);
        }
    }

    /// The handshake has named the ALPN: the application takes the
    /// connection, or it is closed with [`REFUSED`].
    fn accept(c: &mut Conn, now: Instant, app: &mut dyn WorkerApp, s: &Setup) {
        let (alpn, server_name, remote, local) = {
            let conn = c.conn.borrow();
            let hd = conn.crypto_session().handshake_data().and_then(|d| {
                d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                    .ok()
            });
            let (alpn, name) = match hd {
                Some(h) => (h.protocol.unwrap_or_default(), h.server_name),
                None => (Vec::new(), None),
            };
            (
                alpn,
                name,
                conn.remote_address(),
                local_address(conn.local_ip(), s.local),
            )
        };
        let info = ConnInfo {
            remote,
            local,
            server_name,
            alpn: Some(alpn.clone()),
            worker: s.id,
            bidi_streams: s.transport.bidi_streams,
        };
        c.app = app.accept(&alpn, &info);
        if c.app.is_none() {
            s.counters.refused.fetch_add(1, Relaxed);
            s.counters.refused_protocol.fetch_add(1, Relaxed);
            c.conn.borrow_mut().close(
                now,
                VarInt::from_u32(REFUSED),
                Bytes::from_static(b"no application for this protocol"),
            );
        }
    }

    /// The server starts draining: every connection is driven, and its
    /// application told ([`ConnTable::drain_one`]).
    fn start_drain(&mut self) {
        self.draining = true;
        self.dirty.extend(self.conns.keys());
    }

    /// While the server drains: tells the connection's application (once,
    /// as soon as it has one, before it hears of new streams), and, with
    /// `close`, closes the connection once the application has nothing
    /// under way ([`ConnApp::drained`]) and every response it finished is
    /// acknowledged. True when it told or closed (the connection has more
    /// to do this drive).
    fn drain_one(
        c: &mut Conn,
        now: Instant,
        counters: &Counters,
        wake: (&Wakes, ConnectionHandle),
        close: bool,
    ) -> bool {
        let Some(app) = c.app.as_mut() else {
            return false;
        };
        if c.conn.borrow().is_closed() {
            return false;
        }
        let mut acted = false;
        if !c.drain_told {
            c.drain_told = true;
            let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, &mut c.side, counters, wake);
            app.on_drain(&mut cx);
            app.poll(&mut cx);
            acted = true;
        }
        if close && app.drained() && c.finishing.is_empty() && !c.conn.borrow().is_closed() {
            let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, &mut c.side, counters, wake);
            app.on_shutdown(&mut cx);
            c.conn.borrow_mut().close(
                now,
                VarInt::from_u32(hq::CLOSE_SHUTDOWN),
                Bytes::from_static(b"server draining"),
            );
            counters.drained.fetch_add(1, Relaxed);
            acted = true;
        }
        acted
    }

    /// Closes every connection (the engine stopping): each application
    /// hears of it first.
    fn close_all(&mut self, now: Instant, s: &Setup) {
        let counters = s.counters.clone();
        for (ch, c) in self.conns.iter_mut() {
            if let Some(app) = c.app.as_mut() {
                let mut cx = AppCx::new(
                    &c.conn,
                    now,
                    &mut c.finishing,
                    &mut c.side,
                    &counters,
                    (&self.wakes, ch),
                );
                app.on_shutdown(&mut cx);
            }
            c.finishing.clear();
            c.conn.borrow_mut().close(
                now,
                VarInt::from_u32(hq::CLOSE_SHUTDOWN),
                Bytes::from_static(b"server shutting down"),
            );
            self.dirty.push(ch);
        }
    }
}

/// The next departure of a connection's train under kernel pacing: no
/// earlier than now, and after the previous train has left at the
/// connection's rate (its window over its RTT).
fn departure(c: &mut Conn, bytes: usize) -> u64 {
    let now = fastudp_io::pacing::monotonic_ns();
    let at = c.next_departure.max(now);
    let (rtt, window) = {
        let conn = c.conn.borrow();
        (
            conn.rtt().as_nanos().max(1_000) as u64,
            conn.congestion_state().window().max(1),
        )
    };
    // ns per byte at 1.25 window per RTT.
    let ns = (bytes as u128 * rtt as u128 * 4 / (window as u128 * 5)) as u64;
    c.next_departure = at + ns;
    at
}

/// The coalescing wait of a worker that holds `connections`: `base`
/// ([`crate::Tuning::rx_coalesce`]) once per [`COALESCE_STEP_CONNECTIONS`]
/// connections, up to [`MAX_GROWN_COALESCE`] (or `base`, if larger).
/// The keep-alives of many idle connections come one by one at a steady
/// rate (50,000 connections with a PING every 15 s: 3,333 a second), each
/// a wake-up of its own unless the wait gathers several: at 50,000
/// connections a worker, a 1 ms wait costs 0.8x the CPU of 250 us, 2 ms
/// 0.84x of 1 ms, and 4 ms 0.9x of 2 ms (docs/BENCHMARKS.md section 29);
/// it adds at most
/// that much to a datagram of light traffic (a busy worker does not
/// wait).
fn coalescing_wait(base: Duration, connections: usize) -> Duration {
    let steps = u32::try_from((connections / COALESCE_STEP_CONNECTIONS).max(1)).unwrap_or(u32::MAX);
    base.saturating_mul(steps).min(MAX_GROWN_COALESCE.max(base))
}

/// The worker without its sockets: datagrams go in through
/// [`Worker::datagram`] and come out of the send side's queues, and time
/// is a virtual clock, against quinn-proto clients in the same thread.
#[cfg(test)]
mod harness {
    use super::*;
    use crate::app::hq::HqApp;
    use crate::app::Router;
    use quinn_proto::{ClientConfig, ConnectionHandle as Ch};

    // Loopback addresses: should a test ever flush the send queue to the
    // (unused) socket, nothing leaves the host.
    const SERVER: &str = "127.0.0.1:4433";
    const CLIENT: &str = "127.0.0.2:5000";

    struct Net {
        w: Worker,
        client: Endpoint,
        conns: HashMap<Ch, quinn_proto::Connection>,
        /// Client connections with a source address of their own (the
        /// others use `from`).
        sources: HashMap<Ch, SocketAddr>,
        now: Instant,
        cert: rustls::pki_types::CertificateDer<'static>,
        ack_every: Option<u32>,
        /// The largest train and datagram the server queued so far, bytes.
        largest_train: usize,
        largest_datagram: usize,
        /// The clients' source address now (a client may move).
        from: SocketAddr,
        /// Addresses that never answer: what the server sends them is
        /// counted and not delivered.
        silent: Option<IpAddr>,
        /// The clients' datagrams reach the server this much later.
        delay: Duration,
        /// The clients' datagrams on their way: when each arrives, from
        /// where.
        late: std::collections::VecDeque<(Instant, SocketAddr, Vec<u8>)>,
        /// The clients are gone: nothing goes either way.
        vanished: bool,
        /// Bytes the server received from, and sent to, each address.
        received_from: HashMap<SocketAddr, usize>,
        sent_to: HashMap<SocketAddr, usize>,
        /// When a client's datagram last reached the server.
        last_arrival: Option<Instant>,
        /// The clients' keep-alive interval.
        keep_alive: Option<Duration>,
    }

    fn tls() -> (
        rustls::ServerConfig,
        rustls::pki_types::CertificateDer<'static>,
    ) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(c.key_pair.serialize_der());
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![c.cert.der().clone()], key.into())
        .unwrap();
        (tls, c.cert.der().clone())
    }

    impl Net {
        /// A worker serving hq-interop (the sockets are bound on loopback
        /// and never used), and a client endpoint.
        fn new(f: impl FnOnce(&mut Setup)) -> Net {
            Net::with_ack_every(None, f)
        }

        /// As [`Net::new`], with the ACK-frequency extension on both
        /// sides when `ack_every` is given.
        fn with_ack_every(ack_every: Option<u32>, f: impl FnOnce(&mut Setup)) -> Net {
            Net::with_transport(ack_every, |_| {}, f)
        }

        /// As [`Net::with_ack_every`], with the server's transport
        /// configuration changed by `t` too.
        fn with_transport(
            ack_every: Option<u32>,
            t: impl Fn(&mut quinn_proto::TransportConfig),
            f: impl FnOnce(&mut Setup),
        ) -> Net {
            let (mut tls, cert) = tls();
            tls.alpn_protocols = vec![hq::ALPN.to_vec()];
            let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
            let mut server = ServerConfig::with_crypto(Arc::new(crypto));
            let mut transport = crate::transport(Duration::from_secs(10));
            if let Some(k) = ack_every {
                crate::ack_every(&mut transport, k);
            }
            t(&mut transport);
            server.transport_config(Arc::new(transport));
            let counters = Arc::new(Counters::default());
            let mut s = Setup {
                id: 0,
                workers: 1,
                // The receive socket's, once bound.
                local: SocketAddr::from(([127, 0, 0, 1], 0)),
                steering: Steering::QuicCid,
                graded: Arc::new(
                    [limits::Grant::Small, limits::Grant::Minimal]
                        .into_iter()
                        .map(|g| {
                            let mut s = server.clone();
                            let mut tc = crate::transport(Duration::from_secs(10));
                            t(&mut tc);
                            crate::graded(&mut tc, g);
                            s.transport_config(Arc::new(tc));
                            Arc::new(s)
                        })
                        .collect(),
                ),
                server: Arc::new(server),
                // The engine's connection IDs (8 bytes, 7 random), as a
                // server has them: quinn-proto's default generator has a
                // 3-byte nonce, and its Retry does not check its new ID
                // against the connections' (docs/UPSTREAM.md), so with
                // thousands of connections a Retry could take one's ID.
                endpoint: Arc::new(crate::engine::endpoint_config(
                    0,
                    1,
                    Arc::new(crate::cid::ring_hmac(&[7; 64])),
                    Arc::new((
                        crate::cid::ring_hmac(&[9; 32]),
                        std::sync::atomic::AtomicU64::new(0),
                    )),
                    None,
                )),
                inboxes: Arc::new(vec![Inbox::new(SLOTS)]),
                counters: counters.clone(),
                stop: Arc::default(),
                drain: Arc::default(),
                gauges: Arc::new(vec![Default::default()]),
                failed: Arc::default(),
                pacing: PacingMode::User,
                retry: false,
                max_connections: 100,
                max_half_open: 100,
                per_address: Arc::new(limits::PerAddress::new(100)),
                idle_timeout: Duration::from_secs(10),
                transport: crate::Transport::default(),
                admission: None,
                budget: Arc::new(limits::Budget::new(1 << 30)),
                app: Arc::new(Router::new().with(hq::ALPN, HqApp::default())),
                total_rate: None,
                recv_arena: true,
                trains_per_turn: limits::TRAINS_PER_TURN,
                timer_tick: Duration::ZERO,
                busy_poll: Duration::ZERO,
                rx_coalesce: Duration::ZERO,
                uring: false,
                uring_error: Arc::default(),
            };
            f(&mut s);
            let sock = Socket::bind(
                "127.0.0.1:0".parse().unwrap(),
                fastudp_io::Config::default(),
            )
            .unwrap();
            let mut tx = Tx::new(sock, None, counters, None, 0, crate::tx::MAX_TRAIN).unwrap();
            tx.hold = true;
            let config = fastudp_io::Config::default();
            #[cfg(feature = "uring")]
            let config = config
                .uring(s.uring)
                .uring_recv_buffers(limits::RING_BUFFERS);
            let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), config).unwrap();
            s.local = rx.as_std().local_addr().unwrap();
            let w = Worker::new(s, rx, tx).unwrap();
            let client = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None);
            Net {
                w,
                client,
                conns: HashMap::new(),
                sources: HashMap::new(),
                now: Instant::now(),
                cert,
                ack_every,
                largest_train: 0,
                largest_datagram: 0,
                from: CLIENT.parse().unwrap(),
                silent: None,
                delay: Duration::ZERO,
                late: std::collections::VecDeque::new(),
                vanished: false,
                received_from: HashMap::new(),
                sent_to: HashMap::new(),
                last_arrival: None,
                keep_alive: None,
            }
        }

        fn connect(&mut self) -> Ch {
            self.connect_with(None, None)
        }

        /// A client connection from `from`, with transport `t` (or the
        /// default).
        fn connect_from(
            &mut self,
            from: SocketAddr,
            t: Option<quinn_proto::TransportConfig>,
        ) -> Ch {
            self.connect_with(Some(from), t)
        }

        /// A client connection from `from` (or `self.from`, which may
        /// move), with transport `custom` (or the default).
        fn connect_with(
            &mut self,
            from: Option<SocketAddr>,
            custom: Option<quinn_proto::TransportConfig>,
        ) -> Ch {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.cert.clone()).unwrap();
            let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            tls.alpn_protocols = vec![hq::ALPN.to_vec()];
            let mut cfg = ClientConfig::new(Arc::new(
                quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
            ));
            let mut t = quinn_proto::TransportConfig::default();
            if let Some(k) = self.ack_every {
                crate::ack_every(&mut t, k);
            }
            t.keep_alive_interval(self.keep_alive);
            cfg.transport_config(Arc::new(t));
            if let Some(t) = custom {
                cfg.transport_config(Arc::new(t));
            }
            let (ch, conn) = self
                .client
                .connect(self.now, cfg, SERVER.parse().unwrap(), "localhost")
                .unwrap();
            self.conns.insert(ch, conn);
            if let Some(a) = from {
                self.sources.insert(ch, a);
            }
            ch
        }

        /// Moves every datagram both ways until neither side has one,
        /// then lets the earliest timer fire (advancing the clock to it,
        /// at most `max` ahead). False when nothing was left to do.
        fn step(&mut self, max: Duration) -> bool {
            let mut moved = false;
            // Client to server.
            let chs: Vec<Ch> = self.conns.keys().copied().collect();
            for ch in chs {
                loop {
                    let mut buf = Vec::new();
                    let c = self.conns.get_mut(&ch).unwrap();
                    let Some(t) = c.poll_transmit(self.now, 1, &mut buf) else {
                        break;
                    };
                    moved = true;
                    if !self.vanished {
                        let d = buf[..t.size].to_vec();
                        let from = self.sources.get(&ch).copied().unwrap_or(self.from);
                        self.late.push_back((self.now + self.delay, from, d));
                    }
                }
            }
            while self.late.front().is_some_and(|l| l.0 <= self.now) {
                let (_, from, d) = self.late.pop_front().unwrap();
                moved = true;
                self.last_arrival = Some(self.now);
                *self.received_from.entry(from).or_default() += d.len();
                let w = &mut self.w;
                // Newcomers are refused during a drain, as `run` does.
                let draining = w.table.draining;
                w.ep.datagram(
                    self.now,
                    from,
                    None,
                    None,
                    &d,
                    &w.s,
                    &mut w.table,
                    &mut w.tx,
                    draining,
                );
            }
            self.w.turn(self.now);
            // Server to client.
            let q: Vec<Pending> = std::mem::take(&mut self.w.tx.pending)
                .into_iter()
                .chain(std::mem::take(&mut self.w.tx.stateless_q))
                .collect();
            for p in q {
                let ds = p.datagrams();
                let to = p.destination();
                self.largest_train = self.largest_train.max(ds.iter().map(|d| d.len()).sum());
                for d in ds {
                    self.largest_datagram = self.largest_datagram.max(d.len());
                    moved = true;
                    *self.sent_to.entry(to).or_default() += d.len();
                    if self.vanished || self.silent == Some(to.ip()) {
                        continue;
                    }
                    let mut out = Vec::new();
                    let ev = self.client.handle(
                        self.now,
                        SERVER.parse().unwrap(),
                        None,
                        None,
                        BytesMut::from(d),
                        &mut out,
                    );
                    if let Some(DatagramEvent::ConnectionEvent(ch, ev)) = ev {
                        if let Some(c) = self.conns.get_mut(&ch) {
                            c.handle_event(ev);
                        }
                    }
                }
            }
            let chs: Vec<Ch> = self.conns.keys().copied().collect();
            for ch in chs {
                let c = self.conns.get_mut(&ch).unwrap();
                while let Some(ev) = c.poll_endpoint_events() {
                    if let Some(back) = self.client.handle_event(ch, ev) {
                        c.handle_event(back);
                    }
                }
            }
            if moved {
                return true;
            }
            // Idle: the clock moves to the next timer of either side.
            let next = self
                .conns
                .values_mut()
                .filter_map(|c| c.poll_timeout())
                .chain(self.w.table.timers.first().map(|&(t, _)| t))
                .chain(self.late.front().map(|l| l.0))
                .min();
            match next {
                Some(t) if t <= self.now + max => {
                    self.now = self.now.max(t);
                    for c in self.conns.values_mut() {
                        if c.poll_timeout().is_some_and(|t| t <= self.now) {
                            c.handle_timeout(self.now);
                        }
                    }
                    true
                }
                _ => false,
            }
        }

        /// Runs for `d` of the virtual clock.
        fn advance(&mut self, d: Duration) {
            let until = self.now + d;
            while self.now < until {
                if !self.step(until - self.now) {
                    self.now = until;
                }
            }
        }

        /// Steps until `done`, at most 10,000 times.
        fn run_until(&mut self, mut done: impl FnMut(&mut Net) -> bool) {
            for _ in 0..10_000 {
                if done(self) {
                    return;
                }
                if !self.step(Duration::from_secs(60)) {
                    break;
                }
            }
            assert!(done(self), "not reached: {:?}", self.w.s.counters);
        }
    }

    /// Reads what `id` holds: its bytes, and whether it ended (or its
    /// reset code).
    fn read_all(
        c: &mut quinn_proto::Connection,
        id: quinn_proto::StreamId,
        into: &mut Vec<u8>,
    ) -> Option<Result<(), u64>> {
        let mut s = c.recv_stream(id);
        let mut chunks = s.read(true).ok()?;
        let r = loop {
            match chunks.next(usize::MAX) {
                Ok(Some(ch)) => into.extend_from_slice(&ch.bytes),
                Ok(None) => break Some(Ok(())),
                Err(quinn_proto::ReadError::Blocked) => break None,
                Err(quinn_proto::ReadError::Reset(code)) => break Some(Err(code.into_inner())),
            }
        };
        let _ = chunks.finalize();
        r
    }

    fn request(n: &mut Net, ch: Ch, line: &[u8], fin: bool) -> quinn_proto::StreamId {
        let c = n.conns.get_mut(&ch).unwrap();
        let id = c.streams().open(quinn_proto::Dir::Bi).unwrap();
        c.send_stream(id).write(line).unwrap();
        if fin {
            c.send_stream(id).finish().unwrap();
        }
        id
    }

    /// The coalescing wait grows with the connections a worker holds, one
    /// step per 3,125, to 4 ms; zero stays zero, and a wait set above
    /// what the growth reaches is kept.
    #[test]
    fn the_coalescing_wait_grows_with_the_connections() {
        let us = Duration::from_micros;
        assert_eq!(coalescing_wait(us(250), 0), us(250));
        assert_eq!(coalescing_wait(us(250), 3_124), us(250));
        assert_eq!(coalescing_wait(us(250), 6_250), us(500));
        assert_eq!(coalescing_wait(us(250), 12_500), us(1000));
        assert_eq!(coalescing_wait(us(250), 25_000), us(2000));
        assert_eq!(coalescing_wait(us(250), 37_500), us(3000));
        assert_eq!(coalescing_wait(us(250), 50_000), us(4000));
        assert_eq!(coalescing_wait(us(250), 1_000_000), us(4000));
        assert_eq!(coalescing_wait(Duration::ZERO, 1_000_000), Duration::ZERO);
        assert_eq!(coalescing_wait(us(100), 100_000), us(3200));
        assert_eq!(coalescing_wait(us(1000), 100), us(1000));
        assert_eq!(coalescing_wait(us(1000), 100_000), us(4000));
    }

    /// A `/video` response whose next frame falls due at the very instant
    /// another event of its connection is handled (here a second request
    /// arrives then) still gets that frame and every one after it: the
    /// frame's timer is kept even when the time it names has come, and no
    /// response stalls for good.
    #[test]
    fn a_video_frame_due_when_another_event_comes_is_still_sent() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        // 40 ms frames of 8,000 bytes, 25 of them.
        let frame = 8_000usize;
        let interval = Duration::from_millis(40);
        let video = request(&mut n, ch, b"GET /video/200000/1\r\n", true);
        let mut body = Vec::new();
        // Right after the second frame went out (at its due time).
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            read_all(c, video, &mut body);
            body.len() >= 2 * frame
        });
        assert_eq!(body.len(), 2 * frame, "more than two frames at once");
        // A request that reaches the server exactly when the third frame
        // falls due.
        n.delay = interval;
        let other = request(&mut n, ch, b"GET /bytes/10\r\n", true);
        let mut small = Vec::new();
        let (mut video_done, mut other_done) = (false, false);
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            if !video_done {
                video_done = read_all(c, video, &mut body).is_some();
            }
            if !other_done {
                other_done = read_all(c, other, &mut small).is_some();
            }
            video_done && other_done
        });
        assert_eq!(body.len(), 25 * frame);
        assert_eq!(hq::check(0, &body), Ok(()));
        assert_eq!(small.len(), 10);
    }

    /// The handshake, then `/bytes/N` on 4 streams, byte-exact, without a
    /// socket: the worker's own receive path, its application and its
    /// send queue, on a virtual clock.
    #[test]
    fn hq_bytes_without_sockets() {
        let mut n = Net::new(|_| {});
        four_bodies(&mut n);
    }

    /// The same with one allocation per received datagram (the receive
    /// arena off).
    #[test]
    fn hq_bytes_without_the_receive_arena() {
        let mut n = Net::new(|s| s.recv_arena = false);
        four_bodies(&mut n);
    }

    /// The same with the ACK-frequency extension on: the server asks for
    /// fewer ACKs (an ACK_FREQUENCY frame goes out and arrives), and every
    /// byte still arrives. quinn-proto announces that it honours the
    /// extension (`min_ack_delay`) whatever its own configuration, so a
    /// quinn client is asked too when only the server turns it on.
    #[test]
    fn hq_bytes_with_ack_frequency() {
        let mut n = Net::with_ack_every(Some(10), |_| {});
        let ch = four_bodies(&mut n);
        assert!(
            ack_frequency_sent(&n) >= 1,
            "the server sent no ACK_FREQUENCY frame"
        );
        assert!(n.conns[&ch].stats().frame_rx.ack_frequency >= 1);
        // The extension on the server only.
        let mut n = Net::with_ack_every(Some(10), |_| {});
        n.ack_every = None;
        let ch = four_bodies(&mut n);
        assert!(n.conns[&ch].stats().frame_rx.ack_frequency >= 1);
        // Off on the server: nothing is asked.
        let mut n = Net::with_ack_every(None, |_| {});
        n.ack_every = Some(10);
        four_bodies(&mut n);
        assert_eq!(
            ack_frequency_sent(&n),
            0,
            "asked for fewer ACKs with the extension off"
        );
    }

    /// A client's keep-alive PING is acknowledged in the drive that
    /// receives it, with the clock standing still: no ACK-delay timer (25
    /// ms, and a wake-up of the worker) per PING of an idle connection
    /// (the patch of docs/UPSTREAM.md). A request is not: its ACK rides
    /// the response.
    #[test]
    fn a_keep_alive_ping_is_acknowledged_at_once() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        // Quiet: everything of the handshake sent and acknowledged.
        n.advance(Duration::from_secs(1));
        let server = |n: &Net| n.w.table.conns.values().next().unwrap().conn.clone();
        for round in 0..3 {
            let (acks, pings) = {
                let s = server(&n).borrow().stats();
                (s.frame_tx.acks, s.frame_rx.ping)
            };
            let client_acks = n.conns[&ch].stats().frame_rx.acks;
            let at = n.now;
            n.conns.get_mut(&ch).unwrap().ping();
            // Datagrams both ways, and the timers due now: the clock
            // does not move.
            while n.step(Duration::ZERO) {}
            assert_eq!(n.now, at, "the clock moved");
            let s = server(&n).borrow().stats();
            assert_eq!(
                s.frame_rx.ping,
                pings + 1,
                "round {round}: the PING was not received"
            );
            assert_eq!(
                s.frame_tx.acks,
                acks + 1,
                "round {round}: the PING was not acknowledged at once"
            );
            assert_eq!(n.conns[&ch].stats().frame_rx.acks, client_acks + 1);
            // The next keep-alive, a second later.
            n.advance(Duration::from_secs(1));
        }
    }

    /// Counts its connections' polls, and keeps the waker of the last.
    #[derive(Default, Clone)]
    struct Polls {
        n: Arc<std::sync::atomic::AtomicUsize>,
        waker: Arc<Mutex<Option<std::task::Waker>>>,
    }

    impl crate::app::Application for Polls {
        fn alpn(&self) -> Vec<Vec<u8>> {
            vec![hq::ALPN.to_vec()]
        }
        fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
            Box::new(self.clone())
        }
    }

    impl WorkerApp for Polls {
        fn accept(&mut self, _: &[u8], _: &ConnInfo) -> Option<Box<dyn ConnApp>> {
            Some(Box::new(self.clone()))
        }
    }

    impl ConnApp for Polls {
        fn on_event(&mut self, _: &mut AppCx<'_>, _: AppEvent) {}
        fn poll(&mut self, cx: &mut AppCx<'_>) {
            self.n.fetch_add(1, Relaxed);
            *self.waker.lock().unwrap() = Some(cx.waker());
        }
    }

    /// A keep-alive PING (and its acknowledgement) is handled without a
    /// call to the application: the connection's application memory,
    /// cold since the last one, is not touched. Its waker has it polled
    /// at the next turn.
    #[test]
    fn a_keep_alive_does_not_call_the_application() {
        let polls = Polls::default();
        let app = polls.clone();
        let mut n = Net::new(move |s| s.app = Arc::new(Router::new().with(hq::ALPN, app)));
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        n.advance(Duration::from_secs(1));
        let before = polls.n.load(Relaxed);
        assert!(before > 0, "the application was never polled");
        let server = |n: &Net| n.w.table.conns.values().next().unwrap().conn.clone();
        for round in 0..3 {
            let pings = server(&n).borrow().stats().frame_rx.ping;
            n.conns.get_mut(&ch).unwrap().ping();
            while n.step(Duration::ZERO) {}
            let s = server(&n).borrow().stats();
            assert_eq!(s.frame_rx.ping, pings + 1, "round {round}: no PING");
            n.advance(Duration::from_secs(1));
        }
        assert_eq!(
            polls.n.load(Relaxed),
            before,
            "a keep-alive called the application"
        );
        polls.waker.lock().unwrap().take().unwrap().wake();
        n.step(Duration::ZERO);
        assert_eq!(polls.n.load(Relaxed), before + 1, "the wake was not polled");
        // A request is an event: the application hears of it.
        request(&mut n, ch, b"GET /bytes/10\r\n", true);
        while n.step(Duration::ZERO) {}
        assert!(
            polls.n.load(Relaxed) > before + 1,
            "the request was not polled"
        );
        // A wake from another thread ends the worker's coalescing wait
        // at once: it is not held back until the wait's end (20 s here).
        let waker = polls.waker.lock().unwrap().take().unwrap();
        let start = std::time::Instant::now();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            waker.wake();
        });
        n.w.coalesce(Duration::from_secs(20));
        t.join().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the wake did not end the coalescing wait"
        );
        let polled = polls.n.load(Relaxed);
        n.step(Duration::ZERO);
        assert_eq!(polls.n.load(Relaxed), polled + 1, "the wake was not polled");
    }

    /// The io_uring receive path: 20 datagrams of 1,202 bytes that
    /// another worker owns (sent back to back, so GRO may join them into
    /// trains, split in place) go byte-exact and in order to its inbox;
    /// one of this worker's own goes to quinn-proto; all 21 are read in
    /// place in the ring's buffers.
    #[cfg(feature = "uring")]
    #[test]
    fn the_ring_path_forwards_to_the_owner_byte_exact() {
        if let Some(why) = fastudp_io::uring::probe().why_not() {
            assert_ne!(
                std::env::var("FASTUDP_REQUIRE_PRIVILEGED_TESTS").as_deref(),
                Ok("1"),
                "io_uring unavailable: {why}"
            );
            fastudp_test_support::note(
                &fastudp_test_support::current_test(),
                &format!("io_uring unavailable: {why}"),
            );
            return;
        }
        let mut n = Net::new(|s| {
            s.uring = true;
            s.workers = 2;
            s.inboxes = Arc::new(vec![Inbox::new(SLOTS), Inbox::new(SLOTS)]);
        });
        assert!(n.w.ep.ring, "the worker does not receive from a ring");
        let to = n.w.rx.as_std().local_addr().unwrap();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // Short headers (0x40) whose connection ID starts with 1 (worker
        // 1 of 2), then one with 2 (worker 0).
        let theirs: Vec<Vec<u8>> = (0..20u32)
            .map(|i| {
                let mut d = vec![0x40, 1];
                d.extend((0..1200u32).map(|j| (i * 7 + j) as u8));
                d
            })
            .collect();
        for d in &theirs {
            assert_eq!(Steering::QuicCid.owner(d, 2), Some(1));
            peer.send_to(d, to).unwrap();
        }
        let mine = [
            0x40u8, 2, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,
        ];
        assert_eq!(Steering::QuicCid.owner(&mine, 2), Some(0));
        peer.send_to(&mine, to).unwrap();
        let c = n.w.s.counters.clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.datagrams_recv.load(Relaxed) < 21 {
            assert!(Instant::now() < deadline, "not received in 5 s");
            let _ = n.w.rx.wait_readable(Duration::from_millis(10));
            let w = &mut n.w;
            w.ep.receive(n.now, &mut w.rx, &w.s, &mut w.table, &mut w.tx, false);
        }
        assert_eq!(c.datagrams_recv.load(Relaxed), 21);
        assert_eq!(c.recv_in_place.load(Relaxed), 21);
        assert_eq!(c.forwarded.load(Relaxed), 20);
        assert_eq!(c.uring_fallbacks.load(Relaxed), 0);
        let mut inbox = Ring::new(SLOTS);
        n.w.s.inboxes[1].take_into(&mut inbox);
        for d in &theirs {
            let (m, got) = inbox.pop().expect("a forwarded datagram is missing");
            assert_eq!(got, &d[..]);
            assert_eq!(m.source, peer.local_addr().unwrap());
        }
        assert!(inbox.pop().is_none());
    }

    /// With path-MTU discovery allowed past 1452 bytes (a jumbo path),
    /// the server's datagrams grow near the bound and its trains hold fewer
    /// of them: none over the 64 KiB one `sendmsg` may carry (at 8972
    /// bytes, 40 datagrams would be 359 KB). Every byte still arrives.
    /// A worker's sleep until a timer ends on the tick at or after it, so
    /// that timers of one tick fire in one wake-up; no tick, no rounding.
    #[test]
    fn timers_round_up_to_the_tick() {
        let e = Instant::now();
        let ms = Duration::from_millis(1);
        let us = Duration::from_micros;
        assert_eq!(tick_up(e + us(300), e, ms), e + ms);
        assert_eq!(tick_up(e + ms, e, ms), e + ms);
        assert_eq!(tick_up(e + us(1001), e, ms), e + 2 * ms);
        assert_eq!(tick_up(e + us(300), e, Duration::ZERO), e + us(300));
        // A timer already due before the epoch is not moved.
        assert_eq!(tick_up(e, e + ms, ms), e);
    }

    #[test]
    fn larger_datagrams_make_shorter_trains() {
        let mut n = Net::with_transport(None, |t| crate::max_udp_payload(t, 8972), |_| {});
        // The client announces that it takes jumbo datagrams (quinn-proto's
        // default is 1472 bytes, which would bound the server's search).
        let mut cfg = EndpointConfig::default();
        cfg.max_udp_payload_size(9000).unwrap();
        n.client = Endpoint::new(Arc::new(cfg), None, true, None);
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let len = 4_000_000u64;
        let id = request(&mut n, ch, format!("GET /bytes/{len}\r\n").as_bytes(), true);
        let mut body = Vec::new();
        let mut ended = false;
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            if !ended {
                if let Some(r) = read_all(c, id, &mut body) {
                    assert_eq!(r, Ok(()));
                    ended = true;
                }
            }
            ended
        });
        assert_eq!(body.len() as u64, len);
        assert_eq!(hq::check(0, &body), Ok(()));
        // The search ends near the bound (quinn-proto stops probing once
        // its interval is narrow, or the body is sent), never past it.
        assert!(
            (8000..=8972).contains(&n.largest_datagram),
            "path-MTU discovery reached {} bytes",
            n.largest_datagram
        );
        assert!(
            n.largest_train <= crate::MAX_GSO_PAYLOAD,
            "a train of {} bytes",
            n.largest_train
        );
        assert!(
            n.largest_train > 6 * 8000,
            "no train of several jumbo datagrams ({} bytes at most)",
            n.largest_train
        );
    }

    /// ACK_FREQUENCY frames the server's connections sent.
    fn ack_frequency_sent(n: &Net) -> u64 {
        n.w.table
            .conns
            .values()
            .map(|c| c.conn.borrow().stats().frame_tx.ack_frequency)
            .sum()
    }

    /// Connects, then fetches `/bytes/N` on 4 streams and checks every
    /// byte.
    fn four_bodies(n: &mut Net) -> Ch {
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let ids: Vec<_> = (0..4u64)
            .map(|i| {
                request(
                    n,
                    ch,
                    format!("GET /bytes/{}\r\n", 100_000 + i).as_bytes(),
                    true,
                )
            })
            .collect();
        let mut bodies = vec![Vec::new(); 4];
        let mut ended = [false; 4];
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            for (i, id) in ids.iter().enumerate() {
                if !ended[i] {
                    if let Some(r) = read_all(c, *id, &mut bodies[i]) {
                        assert_eq!(r, Ok(()));
                        ended[i] = true;
                    }
                }
            }
            ended.iter().all(|&e| e)
        });
        for (i, b) in bodies.iter().enumerate() {
            assert_eq!(b.len() as u64, 100_000 + i as u64);
            assert_eq!(hq::check(0, b), Ok(()));
        }
        n.run_until(|n| n.w.s.counters.app_bytes.load(Relaxed) == 400_006);
        ch
    }

    /// A request line not whole within the deadline (5 s of the virtual
    /// clock) is reset with REQUEST_TIMEOUT and counted; one sent in
    /// time on the same connection is served.
    #[test]
    fn a_request_line_times_out_on_the_virtual_clock() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let start = n.now;
        let slow = request(&mut n, ch, b"GET /by", false);
        let mut got = Vec::new();
        let mut end = None;
        n.run_until(|n| {
            end = end.or_else(|| read_all(n.conns.get_mut(&ch).unwrap(), slow, &mut got));
            end.is_some()
        });
        assert_eq!(end, Some(Err(u64::from(hq::code::REQUEST_TIMEOUT))));
        assert!(
            n.now >= start + limits::REQUEST_TIMEOUT,
            "reset before the deadline"
        );
        assert_eq!(n.w.s.counters.request_timeouts.load(Relaxed), 1);
        let ok = request(&mut n, ch, b"GET /bytes/10\r\n", true);
        let mut body = Vec::new();
        let mut end = None;
        n.run_until(|n| {
            end = end.or_else(|| read_all(n.conns.get_mut(&ch).unwrap(), ok, &mut body));
            end.is_some()
        });
        assert_eq!((end, body.len()), (Some(Ok(())), 10));
    }

    /// The admission policy: above `max_half_open` handshakes a new client
    /// gets a Retry (and, its address validated, a connection); with
    /// `max_connections` full it is refused.
    #[test]
    fn admission_retries_then_refuses() {
        let mut n = Net::new(|s| {
            s.max_half_open = 1;
            s.max_connections = 2;
        });
        let a = n.connect();
        // The first Initial is accepted: one handshake under way.
        n.step(Duration::ZERO);
        assert_eq!(n.w.ep.half_open, 1);
        let b = n.connect();
        n.run_until(|n| !n.conns[&a].is_handshaking() && !n.conns[&b].is_handshaking());
        // Counted per datagram, not per client: a first flight of two
        // Initials (a post-quantum key share) is retried twice.
        let c = &n.w.s.counters;
        assert!(
            c.retries.load(Relaxed) >= 1,
            "the second client was retried"
        );
        assert_eq!(c.accepted.load(Relaxed), 2);
        let third = n.connect();
        n.run_until(|n| n.conns[&third].is_closed());
        assert!(n.w.s.counters.refused.load(Relaxed) >= 1);
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 2);
        assert!(!n.conns[&a].is_closed() && !n.conns[&b].is_closed());
    }

    /// A client that stops reading a response (STOP_SENDING) gets the
    /// stream's place back: 16 more requests on the same connection (the
    /// whole limit) are all served.
    #[test]
    fn a_stopped_response_gives_its_stream_back() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let big = request(&mut n, ch, b"GET /bytes/100000000\r\n", true);
        let mut got = Vec::new();
        n.run_until(|n| {
            let _ = read_all(n.conns.get_mut(&ch).unwrap(), big, &mut got);
            !got.is_empty()
        });
        n.conns
            .get_mut(&ch)
            .unwrap()
            .recv_stream(big)
            .stop(VarInt::from_u32(42))
            .unwrap();
        let mut ids = Vec::new();
        let mut bodies = vec![Vec::new(); 16];
        let mut done = 0;
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            // A new stream as soon as the server's credit allows one.
            while ids.len() < 16 {
                let Some(id) = c.streams().open(quinn_proto::Dir::Bi) else {
                    break;
                };
                c.send_stream(id).write(b"GET /bytes/1000\r\n").unwrap();
                c.send_stream(id).finish().unwrap();
                ids.push(id);
            }
            for (i, id) in ids.iter().enumerate() {
                if bodies[i].len() < 1000 {
                    if let Some(r) = read_all(c, *id, &mut bodies[i]) {
                        assert_eq!(r, Ok(()));
                        done += 1;
                    }
                }
            }
            done == 16
        });
        assert!(bodies
            .iter()
            .all(|b| b.len() == 1000 && hq::check(0, b).is_ok()));
        // Nothing of the stopped response counts as delivered.
        assert_eq!(n.w.s.counters.app_bytes.load(Relaxed) % 1000, 0);
    }

    /// A drain: a response under way finishes whole, a new request on its
    /// connection is refused (hq-interop has no GOAWAY), a new connection
    /// is refused and counted, and the connection is closed (code 0) only
    /// once the client has acknowledged the whole response.
    #[test]
    fn a_drain_finishes_responses_and_refuses_newcomers() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let len = 3_000_000;
        let big = request(&mut n, ch, format!("GET /bytes/{len}\r\n").as_bytes(), true);
        let mut got = Vec::new();
        n.run_until(|n| {
            let _ = read_all(n.conns.get_mut(&ch).unwrap(), big, &mut got);
            !got.is_empty()
        });
        n.w.s.drain.store(true, Relaxed);
        n.w.table.start_drain();
        let late = request(&mut n, ch, b"GET /bytes/10\r\n", true);
        let newcomer = n.connect();
        let mut late_body = Vec::new();
        let mut late_end = None;
        let mut end = None;
        n.run_until(|n| {
            let c = n.conns.get_mut(&ch).unwrap();
            if let Some(r) = read_all(c, big, &mut got) {
                end = Some(r);
            }
            if late_end.is_none() {
                late_end = read_all(c, late, &mut late_body);
            }
            end.is_some() && late_end.is_some() && n.conns[&newcomer].is_closed()
        });
        assert_eq!(end, Some(Ok(())));
        assert_eq!(got.len(), len);
        assert!(hq::check(0, &got).is_ok());
        assert_eq!(late_end, Some(Err(u64::from(hq::code::SHUTDOWN))));
        assert_eq!(closed_with(&mut n, newcomer), Some(u64::MAX), "refused");
        // Each Initial the newcomer sent was refused and counted: one,
        // or more if its loss timer sent the Initial again before the
        // refusal came (a refused Initial leaves no state to match a
        // second one to).
        let sent = n.conns[&newcomer].stats().udp_tx.datagrams;
        let refused = n.w.s.counters.refused_draining.load(Relaxed);
        assert!(sent >= 1);
        assert_eq!(refused, sent, "{:?}", n.w.s.counters);
        // Closed once every byte is acknowledged, and counted.
        n.run_until(|n| n.conns[&ch].is_closed());
        assert_eq!(closed_with(&mut n, ch), Some(u64::from(hq::CLOSE_SHUTDOWN)));
        assert_eq!(n.w.s.counters.drained.load(Relaxed), 1);
        assert_eq!(n.w.s.counters.app_bytes.load(Relaxed), len as u64);
    }

    /// The migration flood of issue 37: after its handshake a client sends
    /// PINGs from new ports of an address that never answers (the
    /// victim), `per_port` from each. The server sends each of those
    /// ports at most 3 times what it received from it (RFC 9000 8), and
    /// the client's connection lives on.
    fn migration_flood(per_port: usize) {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        // The handshake's last ACKs settle.
        for _ in 0..20 {
            n.step(Duration::from_millis(50));
        }
        let victim: IpAddr = "127.0.0.3".parse().unwrap();
        n.silent = Some(victim);
        let challenges = n.w.table.conns.values().next().unwrap();
        let before = challenges.conn.borrow().stats().frame_tx.path_challenge;
        for port in 0..200u16 {
            n.from = SocketAddr::new(victim, 20_000 + port);
            for _ in 0..per_port {
                n.conns.get_mut(&ch).unwrap().ping();
                // The server answers, its ACK delay included.
                for _ in 0..3 {
                    n.step(Duration::from_millis(30));
                }
            }
        }
        let c = n.w.table.conns.values().next().unwrap();
        let challenges = c.conn.borrow().stats().frame_tx.path_challenge - before;
        assert!(
            challenges >= 200,
            "the test proved nothing: {challenges} PATH_CHALLENGEs for 200 new paths"
        );
        let (mut got, mut sent) = (0, 0);
        for (a, &s) in n.sent_to.iter().filter(|(a, _)| a.ip() == victim) {
            let r = n.received_from.get(a).copied().unwrap_or(0);
            assert!(s <= 3 * r, "{a}: sent {s} bytes for {r} received");
            got += r;
            sent += s;
        }
        assert!(
            sent > 0,
            "the test proved nothing: nothing sent to the victim"
        );
        assert!(sent <= 3 * got, "sent {sent} bytes to the victim for {got}");
        eprintln!("{per_port} PING(s) per port: {sent} bytes sent to the victim for {got}");
        assert!(!n.conns[&ch].is_closed());
    }

    #[test]
    fn a_migration_flood_gets_at_most_3x_one_ping_per_port() {
        migration_flood(1);
    }

    #[test]
    fn a_migration_flood_gets_at_most_3x_two_pings_per_port() {
        migration_flood(2);
    }

    /// A client that really moves (a NAT rebinding mid-transfer, then a
    /// new address) keeps its connection: the server validates each new
    /// path within the 3x limit, and the response arrives whole.
    #[test]
    fn a_moving_client_is_served_within_the_limit() {
        let mut n = Net::new(|_| {});
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let id = request(&mut n, ch, b"GET /bytes/3000000\r\n", true);
        let mut body = Vec::new();
        let mut end = None;
        let moves = ["127.0.0.2:6001", "127.0.0.2:6002", "127.0.0.4:7000"];
        let mut moved = 0;
        n.run_until(|n| {
            end = end.or_else(|| read_all(n.conns.get_mut(&ch).unwrap(), id, &mut body));
            // A move at each third of the body.
            if moved < moves.len() && body.len() > (moved + 1) * 750_000 {
                n.from = moves[moved].parse().unwrap();
                moved += 1;
            }
            end.is_some()
        });
        assert_eq!(end, Some(Ok(())));
        assert_eq!(body.len(), 3_000_000);
        assert!(hq::check(0, &body).is_ok());
        assert_eq!(
            moved,
            moves.len(),
            "the test proved nothing: the client did not move"
        );
        let c = n.w.table.conns.values().next().unwrap();
        let stats = c.conn.borrow().stats();
        assert!(stats.frame_tx.path_challenge >= moves.len() as u64);
        assert_eq!(c.conn.borrow().remote_address(), moves[2].parse().unwrap());
        // Most of the body went to the last address, after its validation.
        let last = n.sent_to[&moves[2].parse().unwrap()];
        assert!(last > 3 * n.received_from[&moves[2].parse().unwrap()]);
    }

    /// Issue 37's late acknowledgements: a client whose every datagram
    /// reaches the server 5 s late (an RTT of 5 s, and 3 probe timeouts of
    /// more than 15 s), then vanishes. Its place is free within the idle
    /// timeout (2 s here) of the last datagram that reached the server,
    /// plus the timer tick, whatever RTT it claimed: not after quinn-proto's
    /// idle timer of 3 probe timeouts.
    #[test]
    fn a_vanished_client_with_late_acks_is_dropped_at_the_idle_timeout() {
        let idle = Duration::from_secs(2);
        let mut n = Net::with_transport(
            None,
            |t| {
                t.max_idle_timeout(Some(idle.try_into().unwrap()));
            },
            |s| s.idle_timeout = idle,
        );
        // The client is heard from every 0.5 s, however late.
        n.keep_alive = Some(Duration::from_millis(500));
        let ch = n.connect();
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        // The delay grows slowly, so that datagrams never stop arriving
        // for as long as the idle timeout.
        let late = Duration::from_secs(5);
        // A request every 0.5 s: the responses are what the client
        // acknowledges late, so that the server measures the delay.
        let ask = |n: &mut Net| {
            let c = n.conns.get_mut(&ch).unwrap();
            if let Some(id) = c.streams().open(quinn_proto::Dir::Bi) {
                c.send_stream(id).write(b"GET /bytes/10\r\n").unwrap();
                c.send_stream(id).finish().unwrap();
            }
            n.advance(Duration::from_millis(500));
        };
        while n.delay < late {
            n.delay += Duration::from_millis(100);
            ask(&mut n);
        }
        for _ in 0..40 {
            ask(&mut n);
        }
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 1);
        let c = n.w.table.conns.values().next().unwrap();
        let rtt = c.conn.borrow().rtt();
        assert!(
            rtt >= Duration::from_secs(4),
            "the test proved nothing: RTT {rtt:?}"
        );
        n.vanished = true;
        n.run_until(|n| n.w.s.counters.connections.load(Relaxed) == 0);
        let heard = n.last_arrival.unwrap();
        let held = n.now - heard;
        eprintln!("RTT {rtt:?}: the place was held {held:?} after the last datagram");
        assert!(
            held <= idle + Duration::from_millis(500),
            "the place was held {held:?} after the last datagram"
        );
    }

    /// The engine's idle clock: off for a zero timeout (QUIC's "none"),
    /// and no overflow for one past the clock's range.
    #[test]
    fn the_idle_deadline_is_off_for_zero_and_never_overflows() {
        let t = Instant::now();
        assert_eq!(idle_deadline(t, Duration::ZERO), None);
        assert_eq!(idle_deadline(t, Duration::MAX), None);
        assert_eq!(
            idle_deadline(t, Duration::from_secs(2)),
            Some(t + Duration::from_secs(2))
        );
    }
    /// The application close code the server closed client connection
    /// `ch` with, once it is lost (None while it lives).
    fn closed_with(n: &mut Net, ch: Ch) -> Option<u64> {
        let c = n.conns.get_mut(&ch)?;
        while let Some(ev) = c.poll() {
            if let quinn_proto::Event::ConnectionLost { reason } = ev {
                return Some(match reason {
                    quinn_proto::ConnectionError::ApplicationClosed(a) => a.error_code.into_inner(),
                    _ => u64::MAX,
                });
            }
        }
        None
    }

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, i], 5000))
    }

    /// Fetches `/bytes/N` on `ch` and checks every byte.
    fn fetch(n: &mut Net, ch: Ch, len: usize) {
        let id = request(n, ch, format!("GET /bytes/{len}\r\n").as_bytes(), true);
        let mut body = Vec::new();
        let mut end = None;
        n.run_until(|n| {
            end = end.or_else(|| read_all(n.conns.get_mut(&ch).unwrap(), id, &mut body));
            end.is_some()
        });
        assert_eq!((end, body.len()), (Some(Ok(())), len));
        assert_eq!(hq::check(0, &body), Ok(()));
    }

    /// The budget at small scale: 2,000 light connections against a
    /// budget of about 1,700. Below the pressure mark each is granted
    /// full windows; above it the grants shrink for every connection
    /// driven (4 requests at once, not 16); at the hard limit newcomers
    /// are refused (counted) and the sum never passes the limit. When
    /// connections go, the grants grow back and a newcomer is taken.
    #[test]
    fn the_budget_shrinks_grants_then_refuses() {
        let light = limits::held(false, 0, 0, limits::Grant::Full);
        let hard = 1950 * light;
        // No idle timeout: the virtual clock runs on through 2,000
        // handshakes.
        let mut n = Net::with_transport(
            None,
            |t| {
                t.max_idle_timeout(None);
            },
            |s| {
                s.max_connections = 10_000;
                s.max_half_open = 10_000;
                s.per_address = Arc::new(limits::PerAddress::new(10_000));
                s.idle_timeout = Duration::ZERO;
                s.budget = Arc::new(limits::Budget::new(hard));
            },
        );
        let budget = n.w.s.budget.clone();
        let mut chs = Vec::new();
        let mut full_seen = false;
        let mut small_seen = false;
        for i in 0..2000u32 {
            let mut t = quinn_proto::TransportConfig::default();
            t.max_idle_timeout(None);
            let from = SocketAddr::from(([127, 1, (i >> 8) as u8, i as u8], 5000));
            let ch = n.connect_from(from, Some(t));
            n.run_until(|n| !n.conns[&ch].is_handshaking() || n.conns[&ch].is_closed());
            chs.push(ch);
            assert!(budget.held() <= hard, "{} of {hard} held", budget.held());
            let level = budget.level();
            let conns = &n.w.table.conns;
            if level == limits::Level::Normal {
                full_seen |= conns.values().all(|c| {
                    c.grant == limits::Grant::Full
                        && c.conn.borrow().max_concurrent_streams(quinn_proto::Dir::Bi)
                            == u64::from(limits::STREAMS)
                });
            } else {
                // The connection just driven was granted less.
                small_seen |= conns.values().any(|c| {
                    c.grant != limits::Grant::Full
                        && c.conn.borrow().max_concurrent_streams(quinn_proto::Dir::Bi) <= 4
                });
            }
        }
        assert!(full_seen, "no connection was granted full windows");
        assert!(small_seen, "the grants did not shrink under pressure");
        // The clients refused, counted by the clients: the server counts
        // datagrams (two for a first flight with a post-quantum key share).
        let c = &n.w.s.counters;
        let refused = chs.iter().filter(|ch| n.conns[ch].is_closed()).count() as u64;
        let open = c.connections.load(Relaxed);
        assert!(refused > 0, "nothing refused at the hard limit");
        assert!(c.refused_memory.load(Relaxed) >= refused);
        assert_eq!(open + refused, 2000, "{open} open, {refused} refused");
        assert!(open >= 1600, "only {open} connections within the budget");
        assert!(budget.peak() <= hard, "peak {} of {hard}", budget.peak());
        // A request under pressure is still served, in full.
        let served = *chs.iter().find(|ch| !n.conns[ch].is_closed()).unwrap();
        fetch(&mut n, served, 50_000);
        // Half of them go: the budget falls below the pressure mark, and
        // a newcomer is taken and granted full windows again.
        for ch in chs.iter().take(1000) {
            n.conns
                .get_mut(ch)
                .unwrap()
                .close(n.now, VarInt::from_u32(0), Bytes::new());
        }
        for _ in 0..1_000_000 {
            if n.w.s.counters.connections.load(Relaxed) <= open - 1000 {
                break;
            }
            n.step(Duration::from_secs(60));
        }
        assert!(n.w.s.counters.connections.load(Relaxed) <= open - 1000);
        assert_eq!(
            budget.level(),
            limits::Level::Normal,
            "{} held",
            budget.held()
        );
        let late = n.connect_from(addr(99), None);
        n.run_until(|n| !n.conns[&late].is_handshaking() || n.conns[&late].is_closed());
        assert!(
            !n.conns[&late].is_closed(),
            "refused below the pressure mark"
        );
        let newest = n.w.table.conns.values().max_by_key(|c| c.seq).unwrap();
        assert_eq!(newest.grant, limits::Grant::Full);
        assert_eq!(
            newest
                .conn
                .borrow()
                .max_concurrent_streams(quinn_proto::Dir::Bi),
            u64::from(limits::STREAMS)
        );
    }

    /// Fairness when full: 5 addresses hold every place with idle
    /// connections. A client from a sixth address is asked to validate
    /// its address (Retry), then takes the place of the oldest idle
    /// connection of an address holding the most, and is served. An
    /// attacker address asking for more while full evicts nobody.
    #[test]
    fn a_newcomer_evicts_from_the_address_holding_most() {
        let mut n = Net::new(|s| {
            s.max_connections = 20;
            s.per_address = Arc::new(limits::PerAddress::new(20));
        });
        let mut attackers = Vec::new();
        for a in 0..5u8 {
            for _ in 0..4 {
                let ch = n.connect_from(addr(11 + a), None);
                n.run_until(|n| !n.conns[&ch].is_handshaking());
                attackers.push(ch);
            }
        }
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 20);
        // An attacker address asking for a 5th place: every address holds
        // as many as it, so nobody is evicted.
        let more = n.connect_from(addr(11), None);
        n.run_until(|n| n.conns[&more].is_closed());
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 0);
        // The newcomer.
        let retries = n.w.s.counters.retries.load(Relaxed);
        let new = n.connect_from(addr(16), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert!(
            n.w.s.counters.retries.load(Relaxed) > retries,
            "no Retry first"
        );
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 20);
        fetch(&mut n, new, 10_000);
        // The oldest of the first address (all hold 4; the first in
        // the ordered list) was closed, with H3_EXCESSIVE_LOAD.
        let mut evicted = Vec::new();
        n.run_until(|n| {
            evicted = attackers
                .iter()
                .filter_map(|&ch| closed_with(n, ch).map(|code| (ch, code)))
                .collect();
            !evicted.is_empty()
        });
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].1, u64::from(CLOSE_EXCESSIVE_LOAD));
        let i = attackers.iter().position(|&c| c == evicted[0].0).unwrap();
        assert_eq!(i % 4, 0, "not the oldest of its address");
    }

    /// Fairness when full, past the addresses holding the most: 9
    /// addresses hold 3 connections each, every one with a request open
    /// and waiting (not idle, not stalled: none may be evicted), and 10
    /// more addresses hold 2 idle connections each, every place taken. A
    /// newcomer evicts an idle connection of an address holding 2: the
    /// busy addresses holding the most do not shield the idle ones (only
    /// the 8 addresses holding the most were looked at before, and the
    /// newcomer was refused).
    #[test]
    fn busy_addresses_holding_the_most_do_not_shield_idle_ones() {
        let mut n = Net::new(|s| {
            s.max_connections = 9 * 3 + 10 * 2;
            s.per_address = Arc::new(limits::PerAddress::new(100));
        });
        let mut idle = Vec::new();
        for a in 0..10u8 {
            for _ in 0..2 {
                let ch = n.connect_from(addr(100 + a), None);
                n.run_until(|n| !n.conns[&ch].is_handshaking());
                idle.push(ch);
            }
        }
        let mut busy = Vec::new();
        for a in 0..9u8 {
            for _ in 0..3 {
                let ch = n.connect_from(addr(140 + a), None);
                n.run_until(|n| !n.conns[&ch].is_handshaking());
                busy.push(ch);
            }
        }
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 47);
        // Each busy connection has half a request line open (well within
        // the request timeout): a request waiting, not a stalled response.
        for &ch in &busy {
            request(&mut n, ch, b"GET /bytes/", false);
        }
        for _ in 0..10 {
            n.step(Duration::from_millis(20));
        }
        let new = n.connect_from(addr(200), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
        let mut gone = Vec::new();
        n.run_until(|n| {
            gone = idle
                .iter()
                .chain(&busy)
                .filter_map(|&ch| closed_with(n, ch).map(|code| (ch, code)))
                .collect();
            !gone.is_empty()
        });
        assert_eq!(gone.len(), 1);
        assert!(idle.contains(&gone[0].0), "a busy connection was evicted");
        fetch(&mut n, new, 10_000);
    }

    /// When every place is held by busy connections (requests open and
    /// not stalled, as attackers refilling what the server frees keep
    /// them), a newcomer holding nothing still gets in: the address
    /// holding at least 8 times its share gives up its oldest connection,
    /// busy or not; an address holding fewer than that does not.
    #[test]
    fn a_newcomer_evicts_a_busy_connection_of_a_heavy_address() {
        let mut n = Net::new(|s| {
            s.max_connections = 12;
            s.per_address = Arc::new(limits::PerAddress::new(100));
        });
        // 8 from one address, 4 from another: all with a request open.
        let mut heavy = Vec::new();
        let mut light = Vec::new();
        for i in 0..12 {
            let from = if i < 8 { addr(150) } else { addr(151) };
            let ch = n.connect_from(from, None);
            n.run_until(|n| !n.conns[&ch].is_handshaking());
            request(&mut n, ch, b"GET /bytes/", false);
            if i < 8 {
                heavy.push(ch);
            } else {
                light.push(ch);
            }
        }
        for _ in 0..10 {
            n.step(Duration::from_millis(20));
        }
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 12);
        let new = n.connect_from(addr(201), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
        let mut gone = Vec::new();
        n.run_until(|n| {
            gone = heavy
                .iter()
                .chain(&light)
                .filter_map(|&ch| closed_with(n, ch).map(|code| (ch, code)))
                .collect();
            !gone.is_empty()
        });
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].0, heavy[0], "not the heavy address's oldest");
        assert_eq!(gone[0].1, u64::from(CLOSE_EXCESSIVE_LOAD));
        // The next newcomer from the same address, which now holds 1 (busy
        // too): an address holding 7 (< 8 x 2) is not made to give one up;
        // it is refused.
        request(&mut n, new, b"GET /bytes/", false);
        for _ in 0..10 {
            n.step(Duration::from_millis(20));
        }
        let second = n.connect_from(addr(201), None);
        n.run_until(|n| !n.conns[&second].is_handshaking() || n.conns[&second].is_closed());
        assert!(
            n.conns[&second].is_closed(),
            "a busy connection was evicted for a second one"
        );
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
    }

    /// An address that asks for one more place while full, holding an
    /// idle connection of its own, gives up its own oldest idle one, not
    /// another address's: attackers refilling what the server cuts would
    /// otherwise take every idle or stalled place as it appears, before a
    /// newcomer could (a legitimate client was refused 3 times in a row
    /// against 5 addresses holding stalled responses).
    #[test]
    fn an_address_holding_an_idle_connection_evicts_its_own() {
        let mut n = Net::new(|s| {
            s.max_connections = 6;
            s.per_address = Arc::new(limits::PerAddress::new(100));
        });
        let mut all = Vec::new();
        for (a, k) in [(51u8, 4), (52, 2)] {
            for _ in 0..k {
                let ch = n.connect_from(addr(a), None);
                n.run_until(|n| !n.conns[&ch].is_handshaking());
                all.push(ch);
            }
        }
        assert_eq!(n.w.s.counters.connections.load(Relaxed), 6);
        // 52 holds 2, two fewer than 51: it may evict, and its own go.
        let more = n.connect_from(addr(52), None);
        n.run_until(|n| !n.conns[&more].is_handshaking() || n.conns[&more].is_closed());
        assert!(!n.conns[&more].is_closed(), "refused");
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
        let mut gone = Vec::new();
        n.run_until(|n| {
            gone = all
                .iter()
                .filter_map(|&ch| closed_with(n, ch).map(|_| ch))
                .collect();
            !gone.is_empty()
        });
        assert_eq!(gone, vec![all[4]], "not 52's own oldest");
        // A newcomer holding nothing evicts from the address holding the
        // most.
        let new = n.connect_from(addr(53), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 2);
        n.run_until(|n| closed_with(n, all[0]).is_some());
    }

    /// A response blocked by the client's flow control is evictable 2 s
    /// after its last progress, even when its client sends nothing more
    /// (no keep-alive): the server looks at it again then, not at the
    /// client's next packet (which may come only at its keep-alive, 5 s
    /// or 25 s later; a newcomer was refused until then).
    #[test]
    fn a_stalled_response_is_evictable_without_a_packet_from_its_client() {
        let mut n = Net::new(|s| {
            s.max_connections = 2;
            s.per_address = Arc::new(limits::PerAddress::new(100));
        });
        let mut stalled = Vec::new();
        for _ in 0..2 {
            // 16 responses of 1 KiB windows: more than the first
            // congestion window, so the server is blocked only after
            // the first ACKs, not in the turn that took the requests.
            let mut t = quinn_proto::TransportConfig::default();
            t.stream_receive_window(VarInt::from_u32(1024));
            t.receive_window(VarInt::from_u32(16 * 1024));
            let ch = n.connect_from(addr(41), Some(t));
            n.run_until(|n| !n.conns[&ch].is_handshaking());
            for _ in 0..16 {
                request(&mut n, ch, b"GET /bytes/100000000\r\n", true);
            }
            stalled.push(ch);
        }
        // Their windows fill at once; then nothing moves either way.
        n.advance(Duration::from_secs(3));
        let new = n.connect_from(addr(42), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert_eq!(n.w.s.counters.evicted.load(Relaxed), 1);
        fetch(&mut n, new, 10_000);
    }

    /// The same when the memory budget, not the count, is full: 5
    /// addresses hold all the budget has room for; a newcomer from a sixth
    /// address evicts (as many as its handshake needs) and is served.
    #[test]
    fn a_newcomer_evicts_when_the_budget_is_full() {
        let light = limits::held(false, 0, 0, limits::Grant::Full);
        let hard = 24 * light;
        let mut n = Net::new(|s| {
            s.max_connections = 1000;
            s.per_address = Arc::new(limits::PerAddress::new(1000));
            s.budget = Arc::new(limits::Budget::new(hard));
        });
        let c = n.w.s.counters.clone();
        // 5 addresses in turn until the budget takes no more.
        let mut i = 0u8;
        while c.refused_memory.load(Relaxed) == 0 {
            let ch = n.connect_from(addr(31 + i % 5), None);
            n.run_until(|n| !n.conns[&ch].is_handshaking() || n.conns[&ch].is_closed());
            i += 1;
            assert!(i < 100, "the budget never filled");
        }
        let held = c.connections.load(Relaxed);
        assert!(held >= 15, "{held}");
        let new = n.connect_from(addr(36), None);
        n.run_until(|n| !n.conns[&new].is_handshaking() || n.conns[&new].is_closed());
        assert!(!n.conns[&new].is_closed(), "the newcomer was refused");
        assert!(c.evicted.load(Relaxed) >= 1);
        fetch(&mut n, new, 10_000);
        assert!(
            n.w.s.budget.peak() <= hard,
            "{} of {hard}",
            n.w.s.budget.peak()
        );
    }

    /// A response the client never reads (1 KiB windows), its connection
    /// kept alive with PINGs, is cut after [`limits::STALL_TIMEOUT`] and
    /// counted; a response read in full on another connection is not.
    #[test]
    fn a_stalled_response_is_cut() {
        let mut n = Net::new(|_| {});
        let mut t = quinn_proto::TransportConfig::default();
        t.stream_receive_window(VarInt::from_u32(1024));
        t.receive_window(VarInt::from_u32(1024));
        t.keep_alive_interval(Some(Duration::from_secs(2)));
        let ch = n.connect_from(addr(21), Some(t));
        n.run_until(|n| !n.conns[&ch].is_handshaking());
        let mut t = quinn_proto::TransportConfig::default();
        t.keep_alive_interval(Some(Duration::from_secs(2)));
        let ok = n.connect_from(addr(22), Some(t));
        n.run_until(|n| !n.conns[&ok].is_handshaking());
        let start = n.now;
        request(&mut n, ch, b"GET /bytes/100000000\r\n", true);
        let mut code = None;
        n.run_until(|n| {
            code = code.or_else(|| closed_with(n, ch));
            code.is_some()
        });
        assert_eq!(code, Some(u64::from(CLOSE_EXCESSIVE_LOAD)));
        assert!(n.now >= start + limits::STALL_TIMEOUT, "cut early");
        assert!(
            n.now <= start + limits::STALL_TIMEOUT + Duration::from_secs(4),
            "cut late: {:?}",
            n.now - start
        );
        assert_eq!(n.w.s.counters.stalled_cut.load(Relaxed), 1);
        fetch(&mut n, ok, 1_000_000);
        assert_eq!(n.w.s.counters.stalled_cut.load(Relaxed), 1);
    }
}
