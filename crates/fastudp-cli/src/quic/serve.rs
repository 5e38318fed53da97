//! `fastudp quic serve --stack fastudp`: quinn-proto driven by fastudp in
//! the paper's architecture.
//!
//! - N workers, each a thread with its own quinn-proto `Endpoint`.
//! - Their receive sockets form a reuseport group steered by BPF on the
//!   QUIC destination connection ID ([`Steering::QuicCid`]); each worker's
//!   connection ID generator starts every ID with a byte that is the
//!   worker's index modulo N, so every packet of a connection reaches its
//!   worker's socket. A client's first Initial carries its own random
//!   DCID; the same program sends it, and every later packet with that
//!   DCID, to one fixed worker, which is the one that computes the same
//!   index in user space and so accepts it. A datagram steered elsewhere
//!   (a group without the program, say, or a client that makes it so) is
//!   copied into a fixed ring of its owner's ([`super::forward`]); a full
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
//!   flag: [`super::limits`] has the memory model.

use super::forward::{Inbox, Ring, SLOTS};
use super::hq::{self, Frames, Request};
use super::limits::{self, PENDING_TRAINS, SPARE_TRAINS, STATELESS_BUF, STATELESS_QUEUE};
use super::stats::{listening, Counters, Reporter};
use super::{tls, workers, PacingArg, ServeArgs};
use crate::{interrupt, Failure};
use bytes::{Bytes, BytesMut};
use fastudp::pacing::{choose_mode, PacingMode, DEFAULT_BATCH_BYTES};
use fastudp::wire::bpf::quic_cid_index;
use fastudp::{
    Config, EcnCodepoint, RecvBatch, ReuseportGroup, SendMeta, Socket, Steering, Transmit,
    ZeroCopySender,
};
use quinn_proto::{
    ConnectionHandle, ConnectionId, ConnectionIdGenerator, DatagramEvent, Dir, Endpoint,
    EndpointConfig, Event, ServerConfig, StreamEvent, StreamId, TransportConfig, VarInt,
};
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of every connection ID the server issues.
const CID_LEN: usize = 8;
/// Datagrams per GSO train at most: 40 of quinn-proto's largest (1452
/// bytes) fit the 64 KB a train may hold.
const MAX_TRAIN: usize = 40;
/// Trains one connection may queue in one loop turn; one with more to send
/// goes on in the next turn, after the others had theirs.
pub(super) const TRAINS_PER_TURN: usize = 8;
/// Forwarded datagrams a worker hands to quinn-proto in one loop turn at
/// most; the rest wait in its ring (or are dropped when it is full).
const FORWARDED_PER_TURN: usize = 128;
/// Trains at least this long go out with MSG_ZEROCOPY under --zerocopy.
const ZEROCOPY_MIN: usize = 16 * 1024;
/// The longest a worker sleeps without looking at its forwarding channel
/// and the stop flag.
const MAX_WAIT: Duration = Duration::from_millis(10);
/// The send socket's buffer, bytes.
const SEND_BUFFER: usize = 4 << 20;
/// How long a worker whose send socket is full waits before it tries again.
const BLOCKED_WAIT: Duration = Duration::from_millis(1);
/// Stateless replies wait while more than this many bytes of the send
/// socket's buffer are not yet sent (`SIOCOUTQ`; a slow link's qdisc holds
/// them): replies to a flood never put more than this in front of the
/// connections' own packets in the kernel's queue.
const STATELESS_OUTQ: usize = 128 << 10;
/// How long a stopping server waits for its connections to close: the
/// whole stop takes at most about this, under any flood.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Connection IDs whose first byte is the worker's index modulo the
/// number of workers; the rest is random.
struct WorkerCids {
    worker: u8,
    workers: u8,
    rng: &'static dyn rustls::crypto::SecureRandom,
    /// Should the system generator ever fail: IDs are then a keyed hash of
    /// the worker and a counter shared by all generators, as unlinkable.
    fallback: Arc<(ring::hmac::Key, std::sync::atomic::AtomicU64)>,
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut b = [0u8; CID_LEN];
        if self.rng.fill(&mut b).is_err() {
            let (key, counter) = &*self.fallback;
            let mut m = [0u8; 9];
            m[0] = self.worker;
            m[1..].copy_from_slice(&counter.fetch_add(1, Relaxed).to_be_bytes());
            b.copy_from_slice(&ring::hmac::sign(key, &m).as_ref()[..CID_LEN]);
        }
        let n = u16::from(self.workers.max(1));
        let spread = (256 / n) as u8;
        b[0] = self
            .worker
            .wrapping_add(self.workers.wrapping_mul(b[0] % spread.max(1)));
        ConnectionId::new(&b)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// A response in progress on one stream.
enum Resp {
    /// Reading the request line, until `deadline`.
    Reading { buf: Vec<u8>, deadline: Instant },
    /// `/bytes/N`: `off` of `len` written.
    Bytes { off: u64, len: u64 },
    /// `/video/...`: frames released by time; `off` bytes written.
    Video {
        frames: Frames,
        start: Instant,
        off: u64,
    },
}

/// One connection and its streams.
struct Conn {
    conn: quinn_proto::Connection,
    streams: HashMap<StreamId, Resp>,
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
    finishing: Vec<(StreamId, u64)>,
}

/// A transmit waiting for the end of the loop turn.
struct Pending {
    /// Its buffer.
    buf: Vec<u8>,
    /// Bytes of it already sent (whole datagrams of a train the socket
    /// took only part of before its buffer filled).
    start: usize,
    len: usize,
    dest: SocketAddr,
    segment: Option<usize>,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    txtime: Option<u64>,
    /// A stateless reply (counted against [`STATELESS_QUEUE`]).
    stateless: bool,
}

impl Pending {
    /// quinn-proto's transmit `t`, written into `buf`.
    fn new(t: &quinn_proto::Transmit, buf: Vec<u8>, txtime: Option<u64>) -> Self {
        Pending {
            buf,
            start: 0,
            len: t.size,
            dest: t.destination,
            segment: t.segment_size.filter(|&s| s < t.size),
            ecn: from_quinn_ecn(t.ecn),
            src_ip: t.src_ip,
            txtime,
            stateless: false,
        }
    }

    /// What is left of it to send.
    fn transmit(&self) -> Transmit<'_> {
        let c = &self.buf[self.start..self.len];
        let t = match self.segment {
            Some(s) if s < c.len() => Transmit::train(self.dest, c, s),
            _ => Transmit::new(self.dest, c),
        };
        t.with_ecn(self.ecn)
            .with_src_ip(self.src_ip)
            .with_txtime(self.txtime)
    }
}

/// Keeps a buffer for reuse, up to `max` of them.
fn keep_spare(spare: &mut Vec<Vec<u8>>, b: Vec<u8>, max: usize) {
    if spare.len() < max {
        spare.push(b);
    }
}

/// The send socket's buffer is full (`EAGAIN`) or the kernel is short of
/// memory for it (`ENOBUFS` from zerocopy's optmem): nothing was sent, and
/// a later try will do. A full qdisc is not an error: the library reports
/// those datagrams done and dropped (`Sent::dropped_locally`), so QUIC
/// counts them sent and its loss recovery resends them, as after any loss
/// on the way (congestion).
fn send_buffer_full(e: &fastudp::Error) -> bool {
    matches!(e, fastudp::Error::Io(io)
        if io.kind() == std::io::ErrorKind::WouldBlock
            || io.raw_os_error() == Some(libc::ENOBUFS))
}

/// What a worker is given.
struct Setup {
    id: usize,
    workers: usize,
    rx: Socket,
    tx: Socket,
    server: Arc<ServerConfig>,
    endpoint: Arc<EndpointConfig>,
    /// Every worker's inbox of forwarded datagrams.
    inboxes: Arc<Vec<Inbox>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    /// Set by a worker that stopped on an error.
    failed: Arc<AtomicBool>,
    pacing: PacingMode,
    zerocopy: bool,
    retry: bool,
    /// Server-wide: the counter is `counters.connections`.
    max_connections: usize,
    /// `--request-timeout`.
    request_timeout: Duration,
    /// `--max-half-open`.
    max_half_open: usize,
    /// `--max-connections-per-ip`, server-wide.
    per_address: Arc<limits::PerAddress>,
    interval: Duration,
    total_rate: Option<u64>,
}

/// Runs `fastudp quic serve --stack fastudp`.
pub fn run(a: ServeArgs) -> Result<(), Failure> {
    let n = workers(&a);
    let (max_connections, budget) = connection_limit(&a, n)?;
    let per_ip = a
        .max_connections_per_ip
        .unwrap_or((max_connections / limits::PER_ADDRESS_SHARE).max(1));
    let per_address = Arc::new(limits::PerAddress::new(per_ip));
    let id = tls::identity(a.cert.as_deref(), a.key.as_deref())?;
    let crypto =
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls::server(&id, a.zero_rtt)?)
            .map_err(|e| Failure::usage(format!("TLS set-up: {e}")))?;
    let mut server = ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport(&a)));
    // Memory held for connections not yet accepted stays small whatever a
    // flood of Initials does.
    server.max_incoming(4096);
    server.incoming_buffer_size(64 * 1024);
    server.incoming_buffer_size_total(limits::INCOMING_BUFFER);
    let server = Arc::new(server);

    let group = ReuseportGroup::bind(
        a.listen,
        n,
        Steering::QuicCid,
        Config::default().recv_buffer(4 << 20),
    )
    .map_err(|e| Failure::usage(format!("--listen {}: {e}", a.listen)))?;
    let addr = group
        .local_addr()
        .map_err(|e| Failure::usage(format!("getsockname: {e}")))?;
    let mut txs = Vec::with_capacity(n);
    for _ in 0..n {
        txs.push(send_socket(addr)?);
    }
    let qdisc = crate::stream::egress_qdisc(if a.listen.ip().is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        a.listen.ip()
    });
    let (pacing, why) = match a.pacing {
        PacingArg::Quic => (
            PacingMode::User,
            "quinn-proto's pacer, in user space".to_string(),
        ),
        PacingArg::Kernel => {
            let (m, why) = choose_mode(
                PacingMode::Kernel,
                txs[0].capabilities().txtime,
                qdisc.as_deref(),
            );
            if m != PacingMode::Kernel {
                eprintln!("fastudp: note: --pacing kernel: {why}; quinn-proto's pacer alone paces");
            }
            (m, why)
        }
    };
    if pacing == PacingMode::Kernel {
        for s in &txs {
            s.enable_txtime(false)
                .map_err(|e| Failure::usage(format!("SO_TXTIME: {e}")))?;
        }
    }
    let pacing_desc = match pacing {
        PacingMode::Kernel => format!("kernel (SCM_TXTIME): {why}"),
        _ if a.pacing == PacingArg::Kernel => format!("quic (fallback from kernel: {why})"),
        _ => format!("quic ({why})"),
    };

    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicBool::new(false));
    let inboxes: Arc<Vec<Inbox>> = Arc::new((0..n).map(|_| Inbox::new(SLOTS)).collect());
    interrupt::watch();
    let reset_key = {
        let mut k = [0u8; 64];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut k)
            .map_err(|_| Failure::usage("the system random generator failed".into()))?;
        Arc::new(ring_hmac(&k))
    };
    let cid_fallback = {
        let mut k = [0u8; 32];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut k)
            .map_err(|_| Failure::usage("the system random generator failed".into()))?;
        Arc::new((ring_hmac(&k), std::sync::atomic::AtomicU64::new(0)))
    };
    let mut handles = Vec::with_capacity(n);
    for (i, (rx, tx)) in group.into_sockets().into_iter().zip(txs).enumerate() {
        let mut ep = EndpointConfig::new(reset_key.clone());
        // QUIC version 1 only (RFC 9000), not the drafts quinn-proto also
        // speaks by default.
        ep.supported_versions(vec![1]);
        let fallback = cid_fallback.clone();
        let rng = rustls::crypto::ring::default_provider().secure_random;
        // 256 workers wrap to 0 in a byte: every byte value is then its own
        // worker's, as `byte % 256` says.
        let (w, nn) = (i as u8, n as u8);
        ep.cid_generator(move || {
            Box::new(WorkerCids {
                worker: w,
                workers: nn,
                rng,
                fallback: fallback.clone(),
            })
        });
        let setup = Setup {
            id: i,
            workers: n,
            rx,
            tx,
            server: server.clone(),
            endpoint: Arc::new(ep),
            inboxes: inboxes.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            failed: failed.clone(),
            pacing,
            zerocopy: a.zerocopy,
            retry: a.retry,
            max_connections,
            request_timeout: Duration::from_secs_f64(a.request_timeout),
            max_half_open: a.max_half_open,
            per_address: per_address.clone(),
            interval: Duration::from_secs_f64(a.interval / 1000.0),
            total_rate: a.total_rate,
        };
        let h = std::thread::Builder::new()
            .name(format!("quic-worker-{i}"))
            .spawn(move || {
                let failed = setup.failed.clone();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Worker::new(setup).and_then(|mut w| w.run())
                }))
                .unwrap_or_else(|_| Err(format!("worker {i} panicked")));
                if r.is_err() {
                    // The server stops rather than go on without a worker.
                    failed.store(true, Relaxed);
                }
                r
            })
            .map_err(|e| Failure::usage(format!("cannot start a worker: {e}")))?;
        handles.push(h);
    }
    listening("fastudp", addr, n, a.json);
    tls::announce(&id, a.json);
    announce_limits(&a, n, (max_connections, per_ip), budget);
    let rep = Reporter::new(&counters, "fastudp", true);
    rep.wait(
        &counters,
        a.duration,
        a.stats,
        a.json,
        &pacing_desc,
        &failed,
    );
    stop.store(true, Relaxed);
    let mut err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => err = Some(e),
            Err(_) => err = Some("a worker panicked".to_string()),
        }
    }
    rep.summary(&counters, a.json, &pacing_desc);
    if let Some(e) = err {
        return Err(Failure { code: 1, msg: e });
    }
    if interrupt::requested() {
        return Err(interrupt::summarized());
    }
    Ok(())
}

/// `--max-connections`, as `--max-memory` (or its default) allows it; and
/// the budget.
fn connection_limit(a: &ServeArgs, workers: usize) -> Result<(usize, u64), Failure> {
    let budget = a.max_memory.unwrap_or_else(limits::default_budget);
    let asked = a.max_connections.unwrap_or(super::MAX_CONNECTIONS);
    let n = limits::max_connections(budget, workers, asked).map_err(Failure::usage)?;
    if a.max_connections.is_some_and(|m| m > n) {
        eprintln!(
            "fastudp: note: --max-connections {asked}: {n} at most within --max-memory {} MiB",
            budget >> 20
        );
    }
    Ok((n, budget))
}

/// Says what the limits are and what they cost at worst.
fn announce_limits(
    a: &ServeArgs,
    workers: usize,
    (max_connections, per_ip): (usize, usize),
    budget: u64,
) {
    let worst = limits::worst_case(workers, max_connections);
    if a.json {
        outln!(
            "{}",
            serde_json::json!({
                "kind": "limits",
                "max_memory": budget,
                "max_connections": max_connections,
                "max_connections_per_ip": per_ip,
                "per_connection": limits::per_connection(),
                "per_worker": limits::per_worker(),
                "worst_case": worst,
                "request_timeout_s": a.request_timeout,
                "streams_per_connection": limits::STREAMS,
                "stream_window": limits::STREAM_WINDOW,
                "connection_window": limits::CONN_WINDOW,
            })
        );
    } else {
        outln!(
            "limits: {max_connections} connections ({} KiB each at most), {workers} workers ({} MiB each), worst case {} MiB of --max-memory {} MiB; request timeout {} s; {per_ip} connections per client address",
            limits::per_connection() >> 10,
            limits::per_worker() >> 20,
            worst >> 20,
            budget >> 20,
            a.request_timeout
        );
    }
}

/// quinn-proto's HMAC key for stateless resets, from ring.
fn ring_hmac(k: &[u8]) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k)
}

/// The transport settings every stack shares.
pub fn transport(a: &ServeArgs) -> TransportConfig {
    let mut t = TransportConfig::default();
    t.max_idle_timeout(Some(
        VarInt::from_u64((a.idle_timeout * 1000.0) as u64)
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

/// An unconnected send socket on `addr`, in the reuseport group after its
/// receive sockets (the steering program never picks it).
fn send_socket(addr: SocketAddr) -> Result<Socket, Failure> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .and_then(|s| {
        if addr.is_ipv6() {
            s.set_only_v6(false).ok();
        }
        s.set_reuse_port(true)?;
        s.bind(&addr.into())?;
        Ok(s)
    })
    .map_err(|e| Failure::usage(format!("send socket on {addr}: {e}")))?;
    // The socket is non-blocking: a buffer that holds a whole turn's
    // trains of many connections keeps `EAGAIN` (and the retry calls
    // after it) rare (capped at net.core.wmem_max without CAP_NET_ADMIN).
    Socket::from_std_with(s.into(), Config::default().send_buffer(SEND_BUFFER))
        .map_err(|e| Failure::usage(format!("send socket on {addr}: {e}")))
}

fn to_quinn_ecn(e: Option<EcnCodepoint>) -> Option<quinn_proto::EcnCodepoint> {
    e.and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8))
}

fn from_quinn_ecn(e: Option<quinn_proto::EcnCodepoint>) -> Option<EcnCodepoint> {
    e.and_then(|e| EcnCodepoint::from_bits(e as u8))
}

/// `--total-rate`'s token bucket: bytes a worker may send, refilled at its
/// rate, at most [`DEFAULT_BATCH_BYTES`] ahead, so that the worker's
/// connections together leave no faster than the rate and in bursts no
/// larger than that: what a shallow bottleneck queue takes.
struct Bucket {
    /// Bytes per second.
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        Bucket {
            rate: rate.max(1.0),
            tokens: DEFAULT_BATCH_BYTES as f64,
            last: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate)
            .min(DEFAULT_BATCH_BYTES as f64);
        self.last = now;
    }

    /// When the tokens are positive again.
    fn positive_at(&self) -> Instant {
        if self.tokens > 0.0 {
            return self.last;
        }
        self.last + Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
    }
}

/// One worker.
struct Worker {
    s: Setup,
    endpoint: Endpoint,
    conns: HashMap<ConnectionHandle, Box<Conn>>,
    timers: BTreeSet<(Instant, ConnectionHandle)>,
    dirty: Vec<ConnectionHandle>,
    /// Connections that stopped at [`TRAINS_PER_TURN`].
    more: Vec<ConnectionHandle>,
    batch: Option<RecvBatch>,
    /// This turn's transmits (and those --total-rate held back): quinn-proto
    /// writes each into a buffer of its own, which is sent from there.
    pending: Vec<Pending>,
    /// --total-rate: the worker's share, bytes per second, and its tokens.
    pacer: Option<Bucket>,
    /// Large trains for the zerocopy sender.
    zc_pending: Vec<Pending>,
    /// The send socket's buffer was full at the last flush: what was not
    /// sent waits in `pending`, connections make no new transmits, and
    /// the worker tries again within [`BLOCKED_WAIT`].
    tx_blocked: bool,
    /// Connections accepted whose handshake is not done: above
    /// `--max-half-open`, new clients get a Retry (as with `--retry`), so a
    /// flood of Initials from spoofed addresses costs a stateless reply
    /// each, not a connection's memory. So do they once handshakes
    /// under way hold half of `--max-connections` server-wide
    /// ([`Counters::half_open`]): addresses that never answer can take
    /// at most half of the places, and a client that answers its Retry
    /// finds one of the rest.
    half_open: usize,
    zc: Option<ZeroCopySender>,
    /// Train buffers to reuse.
    spare: Vec<Vec<u8>>,
    /// Stateless reply buffers to reuse.
    small_spare: Vec<Vec<u8>>,
    /// Stateless replies waiting to be sent (after `pending`), at most
    /// [`STATELESS_QUEUE`].
    stateless_q: Vec<Pending>,
    /// The last flush held the stateless replies back: more than
    /// [`STATELESS_OUTQ`] bytes waited in the kernel.
    stateless_held: bool,
    /// Forwarded datagrams being worked through (swapped with the inbox
    /// when empty).
    fwd_local: Ring,
    max_train: usize,
    closing_since: Option<Instant>,
    published: Instant,
    published_lost: Instant,
    calls_seen: (u64, u64),
    lost_closed: u64,
}

impl Worker {
    fn new(s: Setup) -> Result<Self, String> {
        s.rx.as_std()
            .set_nonblocking(true)
            .map_err(|e| format!("worker {}: {e}", s.id))?;
        // A full send buffer must not stop the worker's receives and
        // timers: the tail waits in `pending` instead.
        s.tx.as_std()
            .set_nonblocking(true)
            .map_err(|e| format!("worker {}: {e}", s.id))?;
        let allow_mtud = !s.tx.may_fragment();
        let endpoint = Endpoint::new(s.endpoint.clone(), Some(s.server.clone()), allow_mtud, None);
        let zc = if s.zerocopy {
            match ZeroCopySender::new(&s.tx) {
                Ok(z) => Some(z),
                Err(e) => {
                    if s.id == 0 {
                        eprintln!("fastudp: note: --zerocopy: {e}; sending with copies");
                    }
                    None
                }
            }
        } else {
            None
        };
        let mut max_train = s.tx.max_gso_segments().clamp(1, MAX_TRAIN);
        if s.total_rate.is_some() {
            // Pacing is made of waits that end on time; without this they
            // may end 50 us late. Best effort.
            let _ = fastudp::os::set_timer_slack(1_000);
            // A train is one burst: no longer than a batch.
            max_train = max_train.clamp(1, DEFAULT_BATCH_BYTES / 1452);
        }
        Ok(Worker {
            endpoint,
            conns: HashMap::new(),
            timers: BTreeSet::new(),
            dirty: Vec::new(),
            more: Vec::new(),
            batch: Some(RecvBatch::new(limits::RECV_BATCH)),
            pending: Vec::new(),
            pacer: s
                .total_rate
                .map(|r| Bucket::new(r as f64 / s.workers as f64)),
            zc_pending: Vec::new(),
            tx_blocked: false,
            half_open: 0,
            zc,
            spare: Vec::new(),
            small_spare: Vec::new(),
            stateless_q: Vec::new(),
            stateless_held: false,
            fwd_local: Ring::new(SLOTS),
            max_train,
            closing_since: None,
            published: Instant::now(),
            published_lost: Instant::now(),
            calls_seen: (0, 0),
            lost_closed: 0,
            s,
        })
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            let now = Instant::now();
            if self.s.stop.load(Relaxed) && self.closing_since.is_none() {
                self.close_all(now);
            }
            if let Some(t) = self.closing_since {
                if self.conns.is_empty() || now.duration_since(t) > CLOSE_WAIT {
                    self.flush();
                    self.publish(true);
                    return Ok(());
                }
            }
            self.forwarded(now);
            self.receive(now)?;
            self.fire_timers(now);
            self.drive_dirty(now);
            self.flush();
            if now.duration_since(self.published) > Duration::from_millis(100) {
                self.publish(false);
            }
            self.wait();
        }
    }

    /// Waits for a datagram, the next timer, or at most [`MAX_WAIT`].
    fn wait(&mut self) {
        if (!self.dirty.is_empty() && !self.tx_blocked) || !self.fwd_local.is_empty() {
            return;
        }
        let now = Instant::now();
        let cap = if self.tx_blocked || self.stateless_held {
            BLOCKED_WAIT
        } else {
            MAX_WAIT
        };
        let mut until = self
            .timers
            .first()
            .map(|&(t, _)| t)
            .unwrap_or(now + cap)
            .min(now + cap);
        let queued = !self.pending.is_empty() || !self.stateless_q.is_empty();
        if let (Some(b), true) = (self.pacer.as_ref(), queued) {
            until = until.min(b.positive_at());
        }
        if until > now {
            let _ = fastudp::os::wait_readable(self.s.rx.as_fd(), until - now);
        }
    }

    /// Hands at most [`FORWARDED_PER_TURN`] datagrams other workers
    /// forwarded to quinn-proto.
    fn forwarded(&mut self, now: Instant) {
        self.s.inboxes[self.s.id].take_into(&mut self.fwd_local);
        let mut local = std::mem::replace(&mut self.fwd_local, Ring::new(0));
        for _ in 0..FORWARDED_PER_TURN {
            let Some((m, d)) = local.pop() else { break };
            self.datagram(now, m.source, m.destination, m.ecn, d);
        }
        self.fwd_local = local;
    }

    /// Reads what is queued (a few batches at most, so that sends are not
    /// starved) and hands each datagram to quinn-proto.
    fn receive(&mut self, now: Instant) -> Result<(), String> {
        for _ in 0..8 {
            let Some(b) = self.batch.as_mut() else { break };
            match self.s.rx.recv(b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    let e = std::io::Error::from(e);
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        // ICMP errors for earlier sends (a client that
                        // went away) fail receives on the group's
                        // sockets; the library reads them off, and the
                        // worker goes on.
                        self.s.counters.recv_errors.fetch_add(1, Relaxed);
                    }
                    break;
                }
            }
            let Some(batch) = self.batch.take() else {
                break;
            };
            for (meta, d) in batch.datagrams() {
                self.s.counters.datagrams_recv.fetch_add(1, Relaxed);
                let owner = quic_cid_index(d, self.s.workers as u32) as usize;
                if owner != self.s.id && !d.is_empty() {
                    let c = &self.s.counters;
                    if self.s.inboxes[owner].push(meta.source, meta.destination, meta.ecn, d) {
                        c.forwarded.fetch_add(1, Relaxed);
                    } else {
                        c.forward_dropped.fetch_add(1, Relaxed);
                    }
                    continue;
                }
                self.datagram(now, meta.source, meta.destination, meta.ecn, d);
            }
            let full = batch.len() == batch.capacity();
            self.batch = Some(batch);
            if !full {
                break;
            }
        }
        Ok(())
    }

    fn datagram(
        &mut self,
        now: Instant,
        source: SocketAddr,
        destination: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        d: &[u8],
    ) {
        // What quinn-proto writes here is a stateless reply, one datagram.
        let mut buf = self.small_spare.pop().unwrap_or_default();
        buf.clear();
        buf.reserve(STATELESS_BUF);
        let ev = self.endpoint.handle(
            now,
            source,
            destination,
            to_quinn_ecn(ecn),
            BytesMut::from(d),
            &mut buf,
        );
        match ev {
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(c) = self.conns.get_mut(&ch) {
                    c.conn.handle_event(ev);
                    self.dirty.push(ch);
                }
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                // A place among the server's connections, taken now and
                // given back when the connection goes (or is not made).
                let max = self.s.max_connections as u64;
                let placed = self.closing_since.is_none()
                    && self
                        .s
                        .counters
                        .connections
                        .fetch_update(Relaxed, Relaxed, |c| (c < max).then_some(c + 1))
                        .is_ok();
                if !placed {
                    let t = self.endpoint.refuse(incoming, &mut buf);
                    self.s.counters.refused.fetch_add(1, Relaxed);
                    return self.queue_stateless(&t, buf);
                } else if (self.s.retry
                    || self.half_open >= self.s.max_half_open
                    || self.s.counters.half_open.load(Relaxed) >= max / 2)
                    && !incoming.remote_address_validated()
                    && incoming.may_retry()
                {
                    self.s.counters.connections.fetch_sub(1, Relaxed);
                    match self.endpoint.retry(incoming, &mut buf) {
                        Ok(t) => {
                            self.s.counters.retries.fetch_add(1, Relaxed);
                            return self.queue_stateless(&t, buf);
                        }
                        Err(e) => self.endpoint.ignore(e.into_incoming()),
                    }
                } else {
                    // A validated address (a Retry token) takes its place
                    // of its share now; others once the handshake is done.
                    let address = incoming.remote_address().ip();
                    let address_counted = incoming.remote_address_validated();
                    if address_counted && !self.s.per_address.take(address) {
                        self.s.counters.connections.fetch_sub(1, Relaxed);
                        let t = self.endpoint.refuse(incoming, &mut buf);
                        self.s.counters.refused.fetch_add(1, Relaxed);
                        return self.queue_stateless(&t, buf);
                    }
                    match self.endpoint.accept(incoming, now, &mut buf, None) {
                        Ok((ch, conn)) => {
                            self.s.counters.accepted.fetch_add(1, Relaxed);
                            self.half_open += 1;
                            self.s.counters.half_open.fetch_add(1, Relaxed);
                            self.conns.insert(
                                ch,
                                Box::new(Conn {
                                    conn,
                                    streams: HashMap::new(),
                                    timer: None,
                                    next_departure: 0,
                                    lost: 0,
                                    half_open: true,
                                    address,
                                    address_counted,
                                    finishing: Vec::new(),
                                }),
                            );
                            self.dirty.push(ch);
                        }
                        Err(e) => {
                            self.s.counters.connections.fetch_sub(1, Relaxed);
                            if address_counted {
                                self.s.per_address.give(address);
                            }
                            if let Some(t) = e.response {
                                return self.queue_stateless(&t, buf);
                            }
                        }
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => return self.queue_stateless(&t, buf),
            None => {
                self.s.counters.dropped.fetch_add(1, Relaxed);
            }
        }
        keep_spare(&mut self.small_spare, buf, STATELESS_QUEUE);
    }

    /// Queues a stateless reply, unless [`STATELESS_QUEUE`] of them wait
    /// already and a flush cannot send them (the send socket is full):
    /// then the reply is dropped and counted.
    fn queue_stateless(&mut self, t: &quinn_proto::Transmit, buf: Vec<u8>) {
        // Once per turn at most the socket is found full: a flood of
        // triggers then costs no send call each.
        if self.stateless_q.len() >= STATELESS_QUEUE && !self.tx_blocked && !self.stateless_held {
            self.flush();
        }
        if self.stateless_q.len() >= STATELESS_QUEUE {
            self.s.counters.stateless_dropped.fetch_add(1, Relaxed);
            keep_spare(&mut self.small_spare, buf, STATELESS_QUEUE);
            return;
        }
        let mut p = Pending::new(t, buf, None);
        p.stateless = true;
        self.stateless_q.push(p);
    }

    /// A cleared buffer, reused where one is spare.
    fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        // Room for the largest train, so that quinn-proto never grows
        // (and so copies) it.
        b.reserve(MAX_TRAIN * 1500);
        b
    }

    /// Keeps a buffer for reuse (up to a bound).
    fn give_buf(&mut self, b: Vec<u8>) {
        keep_spare(&mut self.spare, b, SPARE_TRAINS);
    }

    /// Gives back a sent (or dropped) transmit's buffer.
    fn done_with(&mut self, p: Pending) {
        if p.stateless {
            keep_spare(&mut self.small_spare, p.buf, STATELESS_QUEUE);
        } else {
            keep_spare(&mut self.spare, p.buf, SPARE_TRAINS);
        }
    }

    /// Queues a transmit, in its buffer, for the end of the turn.
    fn queue(&mut self, t: &quinn_proto::Transmit, buf: Vec<u8>, txtime: Option<u64>) {
        self.pending.push(Pending::new(t, buf, txtime));
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&(t, ch)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.conns.get_mut(&ch) {
                c.timer = None;
                if c.conn.poll_timeout().is_some_and(|q| q <= now) {
                    c.conn.handle_timeout(now);
                }
                self.dirty.push(ch);
            }
        }
    }

    fn drive_dirty(&mut self, now: Instant) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable_by_key(|h| h.0);
        dirty.dedup();
        for ch in dirty.drain(..) {
            self.drive(ch, now);
            // The queue of trains stays short: what it holds goes out
            // before more connections add to it.
            if self.pending.len() + self.zc_pending.len() >= PENDING_TRAINS {
                self.flush();
            }
        }
        // Connections that have more to send go on next turn.
        dirty.append(&mut self.more);
        self.dirty = dirty;
    }

    /// Lets one connection do all it can now: endpoint events, stream
    /// events, responses, transmits; then sets its timer.
    fn drive(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(mut c) = self.conns.remove(&ch) else {
            return;
        };
        let counters = self.s.counters.clone();
        let mut trains = 0;
        let mut gone = false;
        loop {
            let mut again = false;
            while let Some(ev) = c.conn.poll_endpoint_events() {
                let drained = ev.is_drained();
                if let Some(back) = self.endpoint.handle_event(ch, ev) {
                    c.conn.handle_event(back);
                    again = true;
                }
                if drained {
                    // The endpoint has forgotten the handle: nothing more
                    // of this connection may reach it.
                    gone = true;
                    break;
                }
            }
            if gone {
                break;
            }
            while let Some(ev) = c.conn.poll() {
                if let Event::Stream(se) = ev {
                    match se {
                        StreamEvent::Opened { dir: Dir::Bi } => {
                            while let Some(id) = c.conn.streams().accept(Dir::Bi) {
                                let deadline = now + self.s.request_timeout;
                                c.streams.insert(
                                    id,
                                    Resp::Reading {
                                        buf: Vec::new(),
                                        deadline,
                                    },
                                );
                                read_request(&mut c, id, now, self.s.interval);
                            }
                        }
                        StreamEvent::Finished { id } => {
                            // Every byte of the response is acknowledged.
                            if let Some(i) = c.finishing.iter().position(|f| f.0 == id) {
                                let (_, len) = c.finishing.swap_remove(i);
                                counters.app_bytes.fetch_add(len, Relaxed);
                            }
                        }
                        StreamEvent::Readable { id } => {
                            read_request(&mut c, id, now, self.s.interval)
                        }
                        StreamEvent::Stopped { id, error_code } => {
                            // RFC 9000 3.5: a STOP_SENDING is answered with
                            // a RESET_STREAM, which also gives the stream's
                            // credit back.
                            let _ = c.conn.send_stream(id).reset(error_code);
                            c.streams.remove(&id);
                            c.finishing.retain(|f| f.0 != id);
                        }
                        _ => {}
                    }
                }
                again = true;
            }
            let timed_out = expire_requests(&mut c, now);
            if timed_out > 0 {
                counters.request_timeouts.fetch_add(timed_out, Relaxed);
                again = true;
            }
            let ids: Vec<StreamId> = c.streams.keys().copied().collect();
            for id in ids {
                respond(&mut c, id, now);
            }
            // Transmits: quinn-proto's pacer says when to stop.
            loop {
                if trains == TRAINS_PER_TURN
                    || self.tx_blocked
                    || self.pending.len() + self.zc_pending.len() >= PENDING_TRAINS
                {
                    self.more.push(ch);
                    break;
                }
                trains += 1;
                let mut buf = self.take_buf();
                let Some(t) = c.conn.poll_transmit(now, self.max_train, &mut buf) else {
                    self.give_buf(buf);
                    break;
                };
                let txtime =
                    (self.s.pacing == PacingMode::Kernel).then(|| departure(&mut c, t.size));
                if self.zc.is_some() && t.size >= ZEROCOPY_MIN {
                    buf.truncate(t.size);
                    self.zc_pending.push(Pending::new(&t, buf, txtime));
                } else {
                    self.queue(&t, buf, txtime);
                }
            }
            if !again {
                break;
            }
        }
        if c.half_open && (gone || c.conn.is_drained() || !c.conn.is_handshaking()) {
            c.half_open = false;
            self.half_open -= 1;
            self.s.counters.half_open.fetch_sub(1, Relaxed);
            // The handshake validated the address: the connection takes
            // its place of the address's share, or is closed.
            if !gone && !c.conn.is_drained() && !c.address_counted {
                if self.s.per_address.take(c.address) {
                    c.address_counted = true;
                } else {
                    c.conn.close(
                        now,
                        VarInt::from_u32(hq::CLOSE_ADDRESS_LIMIT),
                        Bytes::from_static(b"too many connections from this address"),
                    );
                    self.s.counters.refused.fetch_add(1, Relaxed);
                    // Its close goes out next turn.
                    self.more.push(ch);
                }
            }
        }
        if gone || c.conn.is_drained() {
            if let Some(t) = c.timer {
                self.timers.remove(&(t, ch));
            }
            self.lost_closed += c.conn.stats().path.lost_packets.saturating_sub(c.lost);
            self.s.counters.connections.fetch_sub(1, Relaxed);
            if c.address_counted {
                self.s.per_address.give(c.address);
            }
            // The table gives back its room as connections go.
            if self.conns.capacity() > 4 * self.conns.len() + 64 {
                self.conns.shrink_to_fit();
            }
            return;
        }
        let next = [
            c.conn.poll_timeout(),
            next_frame(&c, now),
            next_deadline(&c),
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
        self.conns.insert(ch, c);
    }

    /// Sends this turn's transmits: the batch in as few calls as the
    /// socket allows, large trains with zerocopy.
    fn flush(&mut self) {
        let counters = self.s.counters.clone();
        self.tx_blocked = false;
        // Connections' transmits first, stateless replies after: a flood
        // that fills the send path with replies must not hold back the
        // handshakes and responses of real clients.
        let mut q = std::mem::take(&mut self.pending);
        self.send_queue(&mut q);
        self.pending = q;
        // Stateless replies only while the kernel's queue is short, so
        // that a flood's replies do not delay real clients' packets there.
        self.stateless_held = !self.stateless_q.is_empty()
            && fastudp::os::unsent_bytes(self.s.tx.as_fd()).is_ok_and(|n| n > STATELESS_OUTQ);
        if !self.tx_blocked && !self.stateless_held {
            let mut q = std::mem::take(&mut self.stateless_q);
            self.send_queue(&mut q);
            self.stateless_q = q;
        }
        if let Some(zc) = self.zc.as_mut() {
            let mut kept = Vec::new();
            for p in self.zc_pending.drain(..) {
                if self.tx_blocked {
                    kept.push(p);
                    continue;
                }
                let (len, segs) = (
                    p.len as u64,
                    p.segment.map_or(1, |s| p.len.div_ceil(s)) as u64,
                );
                if let Some(b) = self.pacer.as_mut() {
                    b.tokens -= len as f64;
                }
                let meta = SendMeta::default()
                    .with_ecn(p.ecn)
                    .with_src_ip(p.src_ip)
                    .with_txtime(p.txtime);
                match zc.send_with(&self.s.tx, p.dest, p.buf, p.segment, meta) {
                    Ok(()) => {
                        counters.wire_bytes.fetch_add(len, Relaxed);
                        counters.datagrams_sent.fetch_add(segs, Relaxed);
                    }
                    Err((e, buf)) if send_buffer_full(&e) => {
                        // Kept, whole, for the next try (nothing of it
                        // went out: a cut train is an error of its own).
                        self.tx_blocked = true;
                        kept.push(Pending { buf, ..p });
                    }
                    Err((_, b)) => {
                        counters.send_errors.fetch_add(1, Relaxed);
                        keep_spare(&mut self.spare, b, SPARE_TRAINS);
                    }
                }
            }
            self.zc_pending = kept;
            let _ = zc.reap(&self.s.tx);
            while let Some(b) = zc.pop_done() {
                keep_spare(&mut self.spare, b, SPARE_TRAINS);
            }
        }
    }

    /// Sends what `q` holds, in as few calls as the socket allows, as far
    /// as --total-rate's tokens and the socket's buffer let it; what went
    /// out leaves `q` (a cut train keeps its rest at the front).
    fn send_queue(&mut self, q: &mut Vec<Pending>) {
        let counters = self.s.counters.clone();
        // With --total-rate, what the tokens allow: at least one transmit
        // once they are positive (a train may overdraw them).
        let n = match self.pacer.as_mut() {
            None => q.len(),
            Some(b) => {
                b.refill();
                let mut n = 0;
                for p in q.iter() {
                    if b.tokens <= 0.0 {
                        break;
                    }
                    b.tokens -= (p.len - p.start) as f64;
                    n += 1;
                }
                n
            }
        };
        if n > 0 {
            let mut ts: Vec<Transmit<'_>> = q[..n].iter().map(Pending::transmit).collect();
            let mut at = 0;
            let mut dropped_locally = 0u64;
            while at < ts.len() {
                match self.s.tx.send(&ts[at..]) {
                    Ok(sent) if sent.transmits == 0 && sent.datagrams == 0 => {
                        self.tx_blocked = true;
                        break;
                    }
                    Ok(sent) => {
                        // Fewer than all: the buffer filled (or the next
                        // transmit fails, which the next call says).
                        // Datagrams a full qdisc dropped are done: QUIC
                        // sees them lost and resends.
                        dropped_locally += sent.dropped_locally as u64;
                        at += sent.transmits;
                        if sent.datagrams > 0 {
                            ts[at] = ts[at].skip_datagrams(sent.datagrams);
                        }
                    }
                    Err(e) if send_buffer_full(&e) => {
                        self.tx_blocked = true;
                        break;
                    }
                    Err(_) => {
                        // The first transmit is refused (and the library
                        // has said why in its stats); QUIC recovers it.
                        counters.send_errors.fetch_add(1, Relaxed);
                        at += 1;
                    }
                }
            }
            // What is left of the transmit at `at`, if a call cut it.
            let left = ts.get(at).map(|t| (t.contents.len(), t.segments()));
            drop(ts);
            // What went out: the whole transmits before `at`, and the front
            // of the one at `at`, which keeps only the rest.
            let (mut bytes, mut datagrams) = (0u64, 0u64);
            for p in &q[..at] {
                bytes += (p.len - p.start) as u64;
                datagrams += p.transmit().segments() as u64;
            }
            if let Some((len, segs)) = left {
                let p = &mut q[at];
                let cut = p.len - p.start - len;
                if cut > 0 {
                    bytes += cut as u64;
                    datagrams += (p.transmit().segments() - segs) as u64;
                    p.start += cut;
                }
            }
            // `wire_bytes` counts what the kernel was handed, datagrams its
            // queue then dropped included (their count is apart).
            counters.wire_bytes.fetch_add(bytes, Relaxed);
            counters
                .datagrams_sent
                .fetch_add(datagrams.saturating_sub(dropped_locally), Relaxed);
            counters.dropped_locally.fetch_add(dropped_locally, Relaxed);
            for p in q.drain(..at) {
                self.done_with(p);
            }
        }
    }

    /// Closes every connection (Ctrl-C or the end of --duration).
    fn close_all(&mut self, now: Instant) {
        self.closing_since = Some(now);
        for (ch, c) in self.conns.iter_mut() {
            for id in c.streams.keys() {
                let _ = c
                    .conn
                    .send_stream(*id)
                    .reset(VarInt::from_u32(hq::code::SHUTDOWN));
            }
            c.streams.clear();
            c.finishing.clear();
            c.conn.close(
                now,
                VarInt::from_u32(hq::CLOSE_SHUTDOWN),
                Bytes::from_static(b"server shutting down"),
            );
            self.dirty.push(*ch);
        }
    }

    /// Publishes the socket counters (and, at most once a second, the
    /// connections' losses).
    fn publish(&mut self, last: bool) {
        let c = &self.s.counters;
        let (tx, rx) = (self.s.tx.stats(), self.s.rx.stats());
        c.send_calls
            .fetch_add(tx.send_calls.saturating_sub(self.calls_seen.0), Relaxed);
        c.recv_calls
            .fetch_add(rx.recv_calls.saturating_sub(self.calls_seen.1), Relaxed);
        self.calls_seen = (tx.send_calls, rx.recv_calls);
        if last || self.published_lost.elapsed() > Duration::from_secs(1) {
            let mut lost = 0;
            for conn in self.conns.values_mut() {
                let l = conn.conn.stats().path.lost_packets;
                lost += l.saturating_sub(conn.lost);
                conn.lost = l;
            }
            let closed = std::mem::take(&mut self.lost_closed);
            c.lost_packets.fetch_add(lost + closed, Relaxed);
            self.published_lost = Instant::now();
        }
        self.published = Instant::now();
    }
}

/// The next departure of a connection's train under kernel pacing: no
/// earlier than now, and after the previous train has left at the
/// connection's rate (its window over its RTT).
fn departure(c: &mut Conn, bytes: usize) -> u64 {
    let now = fastudp::os::monotonic_ns();
    let at = c.next_departure.max(now);
    let rtt = c.conn.rtt().as_nanos().max(1_000) as u64;
    let window = c.conn.congestion_state().window().max(1);
    // ns per byte at 1.25 window per RTT.
    let ns = (bytes as u128 * rtt as u128 * 4 / (window as u128 * 5)) as u64;
    c.next_departure = at + ns;
    at
}

/// The earliest video frame due on a connection after `now`. A frame due
/// already (by the same count [`respond`] writes by, so it was offered)
/// that could not be written waits for the stream's credit (the peer's
/// MAX_STREAM_DATA marks the connection to be driven), not for a timer: a
/// timer in the past would never let the worker sleep.
fn next_frame(c: &Conn, now: Instant) -> Option<Instant> {
    c.streams
        .values()
        .filter_map(|r| match r {
            Resp::Video { frames, start, off } => {
                let sent_frames = off / frames.bytes;
                (sent_frames < frames.count && off % frames.bytes == 0)
                    .then(|| frames.due_at(*start, sent_frames))
            }
            _ => None,
        })
        .filter(|&t| t > now)
        .min()
}

/// The earliest deadline of a request line still being read.
fn next_deadline(c: &Conn) -> Option<Instant> {
    c.streams
        .values()
        .filter_map(|r| match r {
            Resp::Reading { deadline, .. } => Some(*deadline),
            _ => None,
        })
        .min()
}

/// Resets every stream whose request line is not whole by its deadline
/// (`--request-timeout`), with [`hq::code::REQUEST_TIMEOUT`]; how many.
fn expire_requests(c: &mut Conn, now: Instant) -> u64 {
    if next_deadline(c).is_none_or(|d| d > now) {
        return 0;
    }
    let late: Vec<StreamId> = c
        .streams
        .iter()
        .filter_map(|(id, r)| match r {
            Resp::Reading { deadline, .. } if *deadline <= now => Some(*id),
            _ => None,
        })
        .collect();
    let code = VarInt::from_u32(hq::code::REQUEST_TIMEOUT);
    for id in &late {
        let _ = c.conn.send_stream(*id).reset(code);
        let _ = c.conn.recv_stream(*id).stop(code);
        c.streams.remove(id);
    }
    late.len() as u64
}

/// Reads what arrived of a request; starts the response once it is whole,
/// or resets the stream when it is bad.
fn read_request(c: &mut Conn, id: StreamId, now: Instant, interval: Duration) {
    let Some(Resp::Reading { buf, .. }) = c.streams.get_mut(&id) else {
        after_request(c, id);
        return;
    };
    let mut fin = false;
    let mut reset = None;
    if let Ok(mut chunks) = c.conn.recv_stream(id).read(true) {
        loop {
            match chunks.next(hq::MAX_REQUEST + 2 - buf.len().min(hq::MAX_REQUEST + 1)) {
                Ok(Some(ch)) => {
                    buf.extend_from_slice(&ch.bytes);
                    if buf.len() > hq::MAX_REQUEST + 1 {
                        break;
                    }
                }
                Ok(None) => {
                    fin = true;
                    break;
                }
                Err(quinn_proto::ReadError::Blocked) => break,
                Err(quinn_proto::ReadError::Reset(code)) => {
                    reset = Some(code);
                    break;
                }
            }
        }
        let _ = chunks.finalize();
    }
    if let Some(code) = reset {
        // The client gave up on its request: the response side closes too
        // (else the stream would hold one of its slots for ever).
        let _ = c.conn.send_stream(id).reset(code);
        c.streams.remove(&id);
        return;
    }
    // Bytes past the request line (a second request, garbage) are refused
    // with STOP_SENDING; a request line alone waits for its FIN, which
    // `after_request` reads. A STOP_SENDING sent as soon as the line is in
    // would race the client's FIN, and clients such as quic-go's fail the
    // request when it wins.
    let extra = buf
        .iter()
        .position(|&b| b == b'\n')
        .is_some_and(|i| i + 1 < buf.len());
    let stop = !fin && extra;
    match hq::parse(buf, fin) {
        Ok(None) => {}
        Ok(Some(Request::Bytes(len))) => {
            c.streams.insert(id, Resp::Bytes { off: 0, len });
            if stop {
                let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(0));
            }
        }
        Ok(Some(Request::Video { rate, seconds })) => {
            c.streams.insert(
                id,
                Resp::Video {
                    frames: Frames::new(rate, seconds, interval),
                    start: now,
                    off: 0,
                },
            );
            if stop {
                let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(0));
            }
        }
        Err(bad) => {
            let code = VarInt::from_u32(bad.code());
            let _ = c.conn.send_stream(id).reset(code);
            let _ = c.conn.recv_stream(id).stop(code);
            c.streams.remove(&id);
        }
    }
}

/// Reads what arrives on a stream whose request is in: its FIN, which
/// gives the stream's credit back once the response is done too, or
/// bytes past the request, refused with STOP_SENDING. Either way the
/// stream holds nothing: the request's stream window bounds what waits
/// unread.
fn after_request(c: &mut Conn, id: StreamId) {
    let mut extra = false;
    if let Ok(mut chunks) = c.conn.recv_stream(id).read(true) {
        while let Ok(Some(_)) = chunks.next(usize::MAX) {
            extra = true;
        }
        let _ = chunks.finalize();
    }
    if extra {
        let _ = c.conn.recv_stream(id).stop(VarInt::from_u32(0));
    }
}

/// Writes what a response may write now.
fn respond(c: &mut Conn, id: StreamId, now: Instant) {
    let (off, limit, total) = match c.streams.get(&id) {
        Some(Resp::Bytes { off, len }) => (*off, *len, *len),
        Some(Resp::Video { frames, start, off }) => {
            (*off, frames.due(*start, now) * frames.bytes, frames.total())
        }
        _ => return,
    };
    let mut at = off;
    let mut s = c.conn.send_stream(id);
    while at < limit {
        // The pattern is static: quinn-proto keeps a reference to it
        // rather than a copy.
        let mut piece = [Bytes::from_static(hq::pattern(at, limit - at))];
        match s.write_chunks(&mut piece) {
            Ok(w) if w.bytes > 0 => at += w.bytes as u64,
            _ => break,
        }
    }
    let mut done = false;
    if at == total {
        let _ = s.finish();
        done = true;
    }
    if done {
        c.streams.remove(&id);
        // Counted as goodput once the client has acknowledged it all.
        c.finishing.push((id, total));
    } else {
        match c.streams.get_mut(&id) {
            Some(Resp::Bytes { off, .. }) | Some(Resp::Video { off, .. }) => *off = at,
            _ => {}
        }
    }
}
