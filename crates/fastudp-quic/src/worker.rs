//! The engine's workers: quinn-proto driven by fastudp in the paper's
//! architecture.
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

use crate::app::{quinn_dir, AppCx, AppEvent, Closed, ConnApp, ConnInfo, Dir, WorkerApp, REFUSED};
use crate::forward::{Inbox, Ring, SLOTS};
use crate::hq::wire as hq;
use crate::limits::{
    self, PENDING_TRAINS, SPARE_TRAINS, STATELESS_BUF, STATELESS_QUEUE, TRAINS_PER_TURN,
};
use crate::stats::Counters;
use bytes::{Bytes, BytesMut};
use fastudp::pacing::{PacingMode, DEFAULT_BATCH_BYTES};
use fastudp::{
    Config, EcnCodepoint, RecvBatch, SendMeta, Socket, Steering, Transmit, ZeroCopySender,
};
use quinn_proto::{
    ConnectionHandle, DatagramEvent, Endpoint, EndpointConfig, Event, ServerConfig, StreamEvent,
    VarInt,
};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Datagrams per GSO train at most: 40 of quinn-proto's largest (1452
/// bytes) fit the 64 KB a train may hold.
const MAX_TRAIN: usize = 40;
/// Forwarded datagrams a worker hands to quinn-proto in one loop turn at
/// most; the rest wait in its ring (or are dropped when it is full).
const FORWARDED_PER_TURN: usize = 128;
/// Trains at least this long go out with MSG_ZEROCOPY under --zerocopy.
const ZEROCOPY_MIN: usize = 16 * 1024;
/// The longest a worker sleeps without looking at its forwarding channel
/// and the stop flag.
const MAX_WAIT: Duration = Duration::from_millis(10);
/// The send socket's buffer, bytes.
pub(crate) const SEND_BUFFER: usize = 4 << 20;
/// How long a worker whose send socket is full waits before it tries again.
const BLOCKED_WAIT: Duration = Duration::from_millis(1);
/// Stateless replies wait while more than this many bytes of the send
/// socket's buffer are not yet sent (`SIOCOUTQ`; a slow link's qdisc holds
/// them): replies to a flood never put more than this in front of the
/// connections' own packets in the kernel's queue.
const STATELESS_OUTQ: usize = 128 << 10;
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
pub(crate) struct Setup {
    pub(crate) id: usize,
    pub(crate) workers: usize,
    pub(crate) rx: Socket,
    pub(crate) tx: Socket,
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) endpoint: Arc<EndpointConfig>,
    /// Every worker's inbox of forwarded datagrams.
    pub(crate) inboxes: Arc<Vec<Inbox>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) stop: Arc<AtomicBool>,
    /// Set by a worker that stopped on an error.
    pub(crate) failed: Arc<AtomicBool>,
    pub(crate) pacing: PacingMode,
    /// The zerocopy sender, with --zerocopy where the socket has one.
    pub(crate) zc: Option<ZeroCopySender>,
    pub(crate) retry: bool,
    /// Server-wide: the counter is `counters.connections`.
    pub(crate) max_connections: usize,
    /// Handshakes from unvalidated addresses the worker keeps open at most.
    pub(crate) max_half_open: usize,
    /// Connections per client address, server-wide.
    pub(crate) per_address: Arc<limits::PerAddress>,
    /// The application.
    pub(crate) app: Arc<dyn crate::app::Application>,
    /// All workers' rate together, bytes/s.
    pub(crate) total_rate: Option<u64>,
}

/// An unconnected send socket on `addr`, in the reuseport group after its
/// receive sockets (the steering program never picks it).
pub(crate) fn send_socket(addr: SocketAddr) -> Result<Socket, String> {
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
    .map_err(|e| format!("send socket on {addr}: {e}"))?;
    // The socket is non-blocking: a buffer that holds a whole turn's
    // trains of many connections keeps `EAGAIN` (and the retry calls
    // after it) rare (capped at net.core.wmem_max without CAP_NET_ADMIN).
    Socket::from_std_with(s.into(), Config::default().send_buffer(SEND_BUFFER))
        .map_err(|e| format!("send socket on {addr}: {e}"))
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
pub(crate) struct Worker {
    s: Setup,
    /// The application's part on this worker.
    app: Box<dyn WorkerApp>,
    /// A connection's events, between quinn-proto and the application.
    events: Vec<Event>,
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
    pub(crate) fn new(mut s: Setup) -> Result<Self, String> {
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
        let zc = s.zc.take();
        let mut max_train = s.tx.max_gso_segments().clamp(1, MAX_TRAIN);
        if s.total_rate.is_some() {
            // Pacing is made of waits that end on time; without this they
            // may end 50 us late. Best effort.
            let _ = fastudp::pacing::set_timer_slack(1_000);
            // A train is one burst: no longer than a batch.
            max_train = max_train.clamp(1, DEFAULT_BATCH_BYTES / 1452);
        }
        Ok(Worker {
            app: s.app.worker(s.id),
            events: Vec::new(),
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

    pub(crate) fn run(&mut self) -> Result<(), String> {
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
            let _ = self.s.rx.wait_readable(until - now);
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
                let owner = Steering::QuicCid
                    .owner(d, self.s.workers)
                    .unwrap_or(self.s.id);
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
                    c.conn.borrow_mut().handle_event(ev);
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
                let mut conn = c.conn.borrow_mut();
                if conn.poll_timeout().is_some_and(|q| q <= now) {
                    conn.handle_timeout(now);
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

    /// Lets one connection do all it can now: endpoint events, its
    /// events to the application, transmits; then sets its timer.
    fn drive(&mut self, ch: ConnectionHandle, now: Instant) {
        let Some(mut c) = self.conns.remove(&ch) else {
            return;
        };
        let counters = self.s.counters.clone();
        let mut trains = 0;
        let mut gone = false;
        let mut events = std::mem::take(&mut self.events);
        loop {
            let mut again = false;
            {
                let mut conn = c.conn.borrow_mut();
                while let Some(ev) = conn.poll_endpoint_events() {
                    let drained = ev.is_drained();
                    if let Some(back) = self.endpoint.handle_event(ch, ev) {
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
            for ev in events.drain(..) {
                self.dispatch(&mut c, ev, now);
            }
            let timeout_due = c
                .app
                .as_ref()
                .and_then(|a| a.timeout())
                .is_some_and(|t| t <= now);
            if let Some(app) = c.app.as_mut() {
                let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, &counters);
                if timeout_due {
                    app.on_event(&mut cx, AppEvent::Timeout);
                }
                app.poll(&mut cx);
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
                let t = c
                    .conn
                    .borrow_mut()
                    .poll_transmit(now, self.max_train, &mut buf);
                let Some(t) = t else {
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
        self.events = events;
        let (drained, handshaking) = {
            let conn = c.conn.borrow();
            (conn.is_drained(), conn.is_handshaking())
        };
        if c.half_open && (gone || drained || !handshaking) {
            c.half_open = false;
            self.half_open -= 1;
            self.s.counters.half_open.fetch_sub(1, Relaxed);
            // The handshake validated the address: the connection takes
            // its place of the address's share, or is closed.
            if !gone && !drained && !c.address_counted {
                if self.s.per_address.take(c.address) {
                    c.address_counted = true;
                } else {
                    c.conn.borrow_mut().close(
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
        if gone || drained {
            if let Some(t) = c.timer {
                self.timers.remove(&(t, ch));
            }
            self.lost_closed += c
                .conn
                .borrow()
                .stats()
                .path
                .lost_packets
                .saturating_sub(c.lost);
            self.s.counters.connections.fetch_sub(1, Relaxed);
            if c.address_counted {
                self.s.per_address.give(c.address);
            }
            if let Some(mut app) = c.app.take() {
                app.on_closed(c.closed.take().unwrap_or(Closed::Locally));
            }
            // The table gives back its room as connections go.
            if self.conns.capacity() > 4 * self.conns.len() + 64 {
                self.conns.shrink_to_fit();
            }
            return;
        }
        let next = [
            c.conn.borrow_mut().poll_timeout(),
            c.app.as_ref().and_then(|a| a.timeout()),
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

    /// Hands one of a connection's events to its application (accepting
    /// its streams, counting goodput, answering STOP_SENDING first).
    fn dispatch(&mut self, c: &mut Conn, ev: Event, now: Instant) {
        let counters = &*self.s.counters;
        let app_ev = match ev {
            Event::HandshakeDataReady => {
                self.accept(c, now);
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
                            let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, counters);
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
            _ => return,
        };
        if let Some(app) = c.app.as_mut() {
            let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, counters);
            app.on_event(&mut cx, app_ev);
        }
    }

    /// The handshake has named the ALPN: the application takes the
    /// connection, or it is closed with [`REFUSED`].
    fn accept(&mut self, c: &mut Conn, now: Instant) {
        let (alpn, server_name, remote, local_ip) = {
            let conn = c.conn.borrow();
            let hd = conn.crypto_session().handshake_data().and_then(|d| {
                d.downcast::<quinn_proto::crypto::rustls::HandshakeData>()
                    .ok()
            });
            let (alpn, name) = match hd {
                Some(h) => (h.protocol.unwrap_or_default(), h.server_name),
                None => (Vec::new(), None),
            };
            (alpn, name, conn.remote_address(), conn.local_ip())
        };
        let info = ConnInfo {
            remote,
            local_ip,
            server_name,
            worker: self.s.id,
        };
        c.app = self.app.accept(&alpn, &info);
        if c.app.is_none() {
            self.s.counters.refused.fetch_add(1, Relaxed);
            c.conn.borrow_mut().close(
                now,
                VarInt::from_u32(REFUSED),
                Bytes::from_static(b"no application for this protocol"),
            );
        }
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
            && self.s.tx.unsent_bytes().is_ok_and(|n| n > STATELESS_OUTQ);
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

    /// Closes every connection (the engine stopping): each application
    /// hears of it first.
    fn close_all(&mut self, now: Instant) {
        self.closing_since = Some(now);
        let counters = self.s.counters.clone();
        for (ch, c) in self.conns.iter_mut() {
            if let Some(app) = c.app.as_mut() {
                let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, &counters);
                app.on_shutdown(&mut cx);
            }
            c.finishing.clear();
            c.conn.borrow_mut().close(
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
                let l = conn.conn.borrow().stats().path.lost_packets;
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
    let now = fastudp::pacing::monotonic_ns();
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
