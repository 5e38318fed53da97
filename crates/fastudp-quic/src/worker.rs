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

use crate::app::{
    quinn_dir, AppCx, AppEvent, Closed, ConnApp, ConnInfo, Dir, Wakes, WorkerApp, REFUSED,
};
use crate::forward::{Inbox, Ring, SLOTS};
use crate::hq::wire as hq;
use crate::limits::{self, PENDING_TRAINS, STATELESS_BUF, STATELESS_QUEUE, TRAINS_PER_TURN};
use crate::stats::Counters;
use crate::tx::{keep_spare, Pending, Tx, ZEROCOPY_MIN};
use bytes::{Bytes, BytesMut};
use fastudp::pacing::PacingMode;
use fastudp::{EcnCodepoint, RecvBatch, Socket, Steering};
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

/// Forwarded datagrams a worker hands to quinn-proto in one loop turn at
/// most; the rest wait in its ring (or are dropped when it is full).
const FORWARDED_PER_TURN: usize = 128;
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
}

/// What a worker is given.
pub(crate) struct Setup {
    pub(crate) id: usize,
    pub(crate) workers: usize,
    pub(crate) rx: Socket,
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) endpoint: Arc<EndpointConfig>,
    /// Every worker's inbox of forwarded datagrams.
    pub(crate) inboxes: Arc<Vec<Inbox>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) stop: Arc<AtomicBool>,
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
    /// The application.
    pub(crate) app: Arc<dyn crate::app::Application>,
    /// All workers' rate together, bytes/s.
    pub(crate) total_rate: Option<u64>,
}

fn to_quinn_ecn(e: Option<EcnCodepoint>) -> Option<quinn_proto::EcnCodepoint> {
    e.and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8))
}

/// One worker.
pub(crate) struct Worker {
    s: Setup,
    /// The application's part on this worker.
    app: Box<dyn WorkerApp>,
    /// A connection's events, between quinn-proto and the application.
    events: Vec<Event>,
    /// Connections the application's wakers asked to drive again.
    wakes: Wakes,
    endpoint: Endpoint,
    conns: HashMap<ConnectionHandle, Box<Conn>>,
    timers: BTreeSet<(Instant, ConnectionHandle)>,
    dirty: Vec<ConnectionHandle>,
    /// Connections that stopped at [`TRAINS_PER_TURN`].
    more: Vec<ConnectionHandle>,
    batch: Option<RecvBatch>,
    /// The send side: this turn's transmits, the stateless replies, the
    /// socket.
    tx: Tx,
    /// Connections accepted whose handshake is not done: above
    /// `--max-half-open`, new clients get a Retry (as with `--retry`), so a
    /// flood of Initials from spoofed addresses costs a stateless reply
    /// each, not a connection's memory. So do they once handshakes
    /// under way hold half of `--max-connections` server-wide
    /// ([`Counters::half_open`]): addresses that never answer can take
    /// at most half of the places, and a client that answers its Retry
    /// finds one of the rest.
    half_open: usize,
    /// Forwarded datagrams being worked through (swapped with the inbox
    /// when empty).
    fwd_local: Ring,
    closing_since: Option<Instant>,
    published: Instant,
    published_lost: Instant,
    calls_seen: (u64, u64),
    lost_closed: u64,
}

impl Worker {
    pub(crate) fn new(s: Setup, tx: Tx) -> Result<Self, String> {
        s.rx.as_std()
            .set_nonblocking(true)
            .map_err(|e| format!("worker {}: {e}", s.id))?;
        let allow_mtud = !tx.socket.may_fragment();
        let endpoint = Endpoint::new(s.endpoint.clone(), Some(s.server.clone()), allow_mtud, None);
        if s.total_rate.is_some() {
            // Pacing is made of waits that end on time; without this they
            // may end 50 us late. Best effort.
            let _ = fastudp::pacing::set_timer_slack(1_000);
        }
        Ok(Worker {
            app: s.app.worker(s.id),
            events: Vec::new(),
            wakes: Wakes::default(),
            endpoint,
            conns: HashMap::new(),
            timers: BTreeSet::new(),
            dirty: Vec::new(),
            more: Vec::new(),
            batch: Some(RecvBatch::new(limits::RECV_BATCH)),
            tx,
            half_open: 0,
            fwd_local: Ring::new(SLOTS),
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
                    self.tx.flush();
                    self.publish(true);
                    // Connections whose close was not acknowledged in
                    // time end here.
                    for (_, mut c) in self.conns.drain() {
                        if let Some(mut app) = c.app.take() {
                            app.on_closed(c.closed.take().unwrap_or(Closed::Locally));
                        }
                    }
                    return Ok(());
                }
            }
            self.forwarded(now);
            self.receive(now)?;
            self.fire_timers(now);
            self.dirty
                .append(&mut self.wakes.lock().unwrap_or_else(|e| e.into_inner()));
            self.drive_dirty(now);
            self.tx.flush();
            if now.duration_since(self.published) > Duration::from_millis(100) {
                self.publish(false);
            }
            self.wait();
        }
    }

    /// Waits for a datagram, the next timer, or at most [`MAX_WAIT`].
    fn wait(&mut self) {
        if (!self.dirty.is_empty() && !self.tx.blocked) || !self.fwd_local.is_empty() {
            return;
        }
        if !self
            .wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return;
        }
        let now = Instant::now();
        let cap = if self.tx.blocked || self.tx.stateless_held {
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
        let queued = !self.tx.pending.is_empty() || !self.tx.stateless_q.is_empty();
        if let (Some(b), true) = (self.tx.pacer.as_ref(), queued) {
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
        let mut buf = self.tx.small_spare.pop().unwrap_or_default();
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
                    return self.tx.stateless(&t, buf);
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
                            return self.tx.stateless(&t, buf);
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
                        return self.tx.stateless(&t, buf);
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
                                return self.tx.stateless(&t, buf);
                            }
                        }
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => return self.tx.stateless(&t, buf),
            None => {
                self.s.counters.dropped.fetch_add(1, Relaxed);
            }
        }
        keep_spare(&mut self.tx.small_spare, buf, STATELESS_QUEUE);
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
            if self.tx.pending.len() + self.tx.zc_pending.len() >= PENDING_TRAINS {
                self.tx.flush();
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
                self.dispatch(ch, &mut c, ev, now);
            }
            let timeout_due = c
                .app
                .as_ref()
                .and_then(|a| a.timeout())
                .is_some_and(|t| t <= now);
            if let Some(app) = c.app.as_mut() {
                let mut cx =
                    AppCx::new(&c.conn, now, &mut c.finishing, &counters, (&self.wakes, ch));
                if timeout_due {
                    app.on_event(&mut cx, AppEvent::Timeout);
                }
                app.poll(&mut cx);
            }
            // Transmits: quinn-proto's pacer says when to stop.
            loop {
                if trains == TRAINS_PER_TURN
                    || self.tx.blocked
                    || self.tx.pending.len() + self.tx.zc_pending.len() >= PENDING_TRAINS
                {
                    self.more.push(ch);
                    break;
                }
                trains += 1;
                let mut buf = self.tx.take_buf();
                let t = c
                    .conn
                    .borrow_mut()
                    .poll_transmit(now, self.tx.max_train, &mut buf);
                let Some(t) = t else {
                    self.tx.give_buf(buf);
                    break;
                };
                let txtime =
                    (self.s.pacing == PacingMode::Kernel).then(|| departure(&mut c, t.size));
                if self.tx.zc.is_some() && t.size >= ZEROCOPY_MIN {
                    buf.truncate(t.size);
                    self.tx.zc_pending.push(Pending::new(&t, buf, txtime));
                } else {
                    self.tx.queue(&t, buf, txtime);
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
    fn dispatch(&mut self, ch: ConnectionHandle, c: &mut Conn, ev: Event, now: Instant) {
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
                            let mut cx = AppCx::new(
                                &c.conn,
                                now,
                                &mut c.finishing,
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
            _ => return,
        };
        if let Some(app) = c.app.as_mut() {
            let mut cx = AppCx::new(&c.conn, now, &mut c.finishing, counters, (&self.wakes, ch));
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

    /// Closes every connection (the engine stopping): each application
    /// hears of it first.
    fn close_all(&mut self, now: Instant) {
        self.closing_since = Some(now);
        let counters = self.s.counters.clone();
        for (ch, c) in self.conns.iter_mut() {
            if let Some(app) = c.app.as_mut() {
                let mut cx = AppCx::new(
                    &c.conn,
                    now,
                    &mut c.finishing,
                    &counters,
                    (&self.wakes, *ch),
                );
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
        let (tx, rx) = (self.tx.socket.stats(), self.s.rx.stats());
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
