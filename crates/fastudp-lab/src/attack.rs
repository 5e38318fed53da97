//! `fastudp-lab attack` (unstable): the hostile clients a server
//! must withstand, each for a bounded time, for tests and
//! scripts/quic-attacks.sh. Point it only at a server of your own.
//!
//! - `forward`: GSO trains of 1,200-byte Initial-shaped datagrams whose
//!   first datagram steers to worker 0 and the rest to worker 1, so that
//!   worker 0 must hand them over (against `--workers 2`).
//! - `version`: 1,200-byte long headers of an unknown version, each
//!   answered by a Version Negotiation packet.
//! - `initials`: Initials of new connections from many source ports.
//! - `windows`: connections whose streams carry request bytes from offset
//!   1 on, never byte 0: nothing can be read, all of it must be buffered.
//! - `slow-requests`: connections that open every stream they may with
//!   half a request line and keep the connection alive.
//! - `never-read`: connections that ask for large responses and never
//!   read them.
//! - `connections`: as many idle connections as the server takes.
//! - `migration`: after a handshake, each PING from a new port of an
//!   address that never answers (the victim); measures what the server
//!   sends the victim's ports against what came from them (RFC 9000 8:
//!   3x at most).
//! - `late-ack`: connections that take every datagram of the server
//!   `--delay` seconds late (so acknowledge it late, and claim a long
//!   RTT), asking for a small response every second, then vanish at the
//!   end without a word; says when they vanished.
//! - `hold`: connections from `--addresses` addresses, kept alive with a
//!   PING every `--keep-alive` seconds, each with `--streams` GETs of
//!   `--request` (if given) that it never reads through a `--window` byte
//!   window; a connection the server closes is opened again, so that the
//!   addresses hold every place they can. Counts how the server closed
//!   them.

use anyhow::Context;
use bytes::BytesMut;
use clap::{Args, ValueEnum};
use fastudp_cli::quic::tls;
use fastudp_io::UdpIo;
use fastudp_io::{Socket, Transmit};
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    StreamId, TransportConfig, VarInt,
};
use quinn_proto::{ConnectionError, Event, StreamEvent};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Which attack.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Datagrams steered to the wrong worker.
    Forward,
    /// Unknown-version datagrams (Version Negotiation replies).
    Version,
    /// Initials of new connections.
    Initials,
    /// Stream data with a gap at offset 0.
    Windows,
    /// Unfinished request lines, kept alive.
    SlowRequests,
    /// Large responses never read.
    NeverRead,
    /// Idle connections, as many as taken.
    Connections,
    /// PINGs from new ports of a victim's address after a handshake.
    Migration,
    /// Late acknowledgements, then gone.
    LateAck,
    /// Connections from many addresses holding places (PINGs, stalled
    /// responses), opened again when closed.
    Hold,
}

/// Options of `fastudp-lab attack`.
#[derive(Args, Debug)]
pub struct AttackArgs {
    /// The attack.
    #[arg(value_enum)]
    pub kind: Kind,
    /// The server (loopback or a namespace of your own).
    pub server: SocketAddr,
    /// Seconds to go on for.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Connections (windows, slow-requests, never-read, connections).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Streams per connection (windows, slow-requests, never-read).
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// The source address to send from (default: the one the route
    /// picks), so that a legitimate client on the same host can have an
    /// address of its own.
    #[arg(long)]
    pub source: Option<std::net::IpAddr>,
    /// Send from this many consecutive addresses, the first `--source`
    /// (hold, late-ack; an IPv6 address steps by /64).
    #[arg(long, default_value_t = 1)]
    pub addresses: usize,
    /// The victim's address, which never answers (migration).
    #[arg(long)]
    pub victim: Option<IpAddr>,
    /// New ports of the victim's address (migration).
    #[arg(long, default_value_t = 500)]
    pub ports: usize,
    /// PINGs from each new port (migration).
    #[arg(long, default_value_t = 1)]
    pub per_port: usize,
    /// Seconds each datagram of the server waits before the client takes
    /// it (late-ack).
    #[arg(long, default_value_t = 20.0)]
    pub delay: f64,
    /// Seconds between the client's PINGs (hold, late-ack).
    #[arg(long, default_value_t = 5.0)]
    pub keep_alive: f64,
    /// The path each stream asks for and never reads (hold; without it,
    /// the connections open no stream).
    #[arg(long)]
    pub request: Option<String>,
    /// The stream receive window, bytes (hold).
    #[arg(long, default_value_t = 1024)]
    pub window: u32,
    /// Output JSON.
    #[arg(long)]
    pub json: bool,
}

/// What an attack did.
#[derive(Default, serde::Serialize)]
struct Done {
    datagrams_sent: u64,
    bytes_sent: u64,
    datagrams_received: u64,
    connections_established: u64,
    streams_opened: u64,
    /// migration: what the victim's ports sent and got, and the worst
    /// port's ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    victim: Option<Victim>,
    /// late-ack: when the clients vanished (seconds since the Unix
    /// epoch), and the median of their own RTT estimates then, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    vanished_at_unix: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rtt_ms_median: Option<f64>,
    /// hold, late-ack: connections started, the most established at
    /// once, and how the server closed connections, by code.
    #[serde(skip_serializing_if = "Option::is_none")]
    handshakes_started: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    established_peak: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    closed: BTreeMap<String, u64>,
}

/// What the victim's ports of a migration flood sent and got.
#[derive(Default, serde::Serialize)]
struct Victim {
    ports: u64,
    bytes_from_victim: u64,
    bytes_to_victim: u64,
    datagrams_to_victim: u64,
    /// bytes_to_victim / bytes_from_victim.
    ratio: f64,
    /// The highest ratio of one port.
    worst_port_ratio: f64,
}

/// Runs `fastudp-lab attack`.
pub fn run(a: AttackArgs) -> anyhow::Result<()> {
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 600.0) {
        bail_usage!("--duration {}: between 0 and 600 s", a.duration);
    }
    if a.connections == 0 || a.connections > 10_000 || a.streams > 10_000 {
        bail_usage!("--connections: 1 to 10000; --streams: at most 10000");
    }
    if a.addresses == 0 || a.addresses > 1_000 || (a.addresses > 1 && a.source.is_none()) {
        bail_usage!("--addresses: 1 to 1000, and more than 1 needs --source");
    }
    if a.ports == 0 || a.ports > 10_000 || a.per_port == 0 || a.per_port > 100 {
        bail_usage!("--ports: 1 to 10000; --per-port: 1 to 100");
    }
    if !(a.delay.is_finite() && (0.0..=120.0).contains(&a.delay)) {
        bail_usage!("--delay {}: between 0 and 120 s", a.delay);
    }
    if !(a.keep_alive.is_finite() && a.keep_alive >= 0.1 && a.keep_alive <= 30.0) {
        bail_usage!("--keep-alive {}: between 0.1 and 30 s", a.keep_alive);
    }
    if a.window == 0 || a.window > 1 << 20 {
        bail_usage!("--window {}: 1 to 1048576 bytes", a.window);
    }
    if a.kind == Kind::Migration && a.victim.is_none() {
        bail_usage!("migration needs --victim ADDRESS (one of your own that never answers)");
    }
    if a.request.as_ref().is_some_and(|r| {
        !r.starts_with('/')
            || r.len() > 1000
            || r.chars().any(|c| c.is_whitespace() || c.is_control())
    }) {
        bail_usage!("--request: a path starting with /, without spaces, at most 1000 bytes");
    }
    let until = Instant::now() + Duration::from_secs_f64(a.duration);
    let done = match a.kind {
        Kind::Forward => forward(a.server, a.source, until),
        Kind::Version => version(a.server, a.source, until),
        Kind::Initials => initials(a.server, a.source, until),
        Kind::Migration => migration(&a, until),
        Kind::LateAck => late_ack(&a, until),
        Kind::Hold => hold(&a, until),
        k => connections(k, &a, until),
    }
    .context("attack")?;
    if a.json {
        out!("{}", serde_json::to_string(&done).unwrap_or_default())
    } else {
        out!(
            "{:?}: {} datagrams ({} bytes) sent, {} received, {} connections, {} streams",
            a.kind,
            done.datagrams_sent,
            done.bytes_sent,
            done.datagrams_received,
            done.connections_established,
            done.streams_opened
        )?;
        if let Some(v) = &done.victim {
            out!(
                "victim: {} ports sent {} bytes, got {} bytes in {} datagrams: {:.2}x (worst port {:.2}x)",
                v.ports,
                v.bytes_from_victim,
                v.bytes_to_victim,
                v.datagrams_to_victim,
                v.ratio,
                v.worst_port_ratio
            )?;
        }
        if let Some(t) = done.vanished_at_unix {
            out!(
                "vanished at {t:.3} (Unix time), median RTT {:.0} ms",
                done.rtt_ms_median.unwrap_or(0.0)
            )?;
        }
        if let Some(p) = done.established_peak {
            out!(
                "{} handshakes started, {p} established at most; closed by the server: {:?}",
                done.handshakes_started.unwrap_or(0),
                done.closed
            )?;
        }
        Ok(())
    }
}

/// The addresses to send from: `--source` and the `--addresses - 1`
/// after it (IPv6 by /64), or the route's choice.
fn sources(a: &AttackArgs) -> Vec<Option<IpAddr>> {
    match a.source {
        None => vec![None],
        Some(IpAddr::V4(v4)) => (0..a.addresses as u32)
            .map(|i| Some(IpAddr::V4(u32::from(v4).wrapping_add(i).into())))
            .collect(),
        Some(IpAddr::V6(v6)) => (0..a.addresses as u128)
            .map(|i| Some(IpAddr::V6(u128::from(v6).wrapping_add(i << 64).into())))
            .collect(),
    }
}

/// The address to bind for `server`: `source` (port 0), or the unspecified
/// address of its family.
fn local_for(server: SocketAddr, source: Option<std::net::IpAddr>) -> SocketAddr {
    match source {
        Some(ip) => SocketAddr::new(ip, 0),
        None if server.is_ipv6() => "[::]:0".parse().unwrap_or(server),
        None => "0.0.0.0:0".parse().unwrap_or(server),
    }
}

fn bind_for(server: SocketAddr, source: Option<std::net::IpAddr>) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(local_for(server, source))
}

/// A 1,200-byte long header of `version` with an 8-byte DCID starting
/// with `dcid0`.
fn long_header(version: u32, dcid0: u8, n: u64) -> [u8; 1200] {
    let mut p = [0u8; 1200];
    p[0] = 0xc3;
    p[1..5].copy_from_slice(&version.to_be_bytes());
    p[5] = 8;
    p[6] = dcid0;
    p[7..14].copy_from_slice(&n.to_be_bytes()[1..]);
    p[14] = 8;
    p[15..23].copy_from_slice(&n.to_le_bytes());
    p
}

fn forward(
    server: SocketAddr,
    source: Option<std::net::IpAddr>,
    until: Instant,
) -> std::io::Result<Done> {
    let s = Socket::bind(local_for(server, source), fastudp_io::Config::default())
        .map_err(std::io::Error::from)?;
    let mut d = Done::default();
    let mut train = Vec::with_capacity(50 * 1200);
    let mut n = 0u64;
    while Instant::now() < until {
        train.clear();
        for i in 0..50 {
            n += 1;
            // Byte 6, the DCID's first: even to worker 0, odd to worker 1.
            train.extend_from_slice(&long_header(1, if i == 0 { 0 } else { 1 }, n));
        }
        let t = [Transmit::train(server, &train, 1200)];
        if s.send(&t).is_ok() {
            d.datagrams_sent += 50;
            d.bytes_sent += train.len() as u64;
        }
    }
    Ok(d)
}

fn version(
    server: SocketAddr,
    source: Option<std::net::IpAddr>,
    until: Instant,
) -> std::io::Result<Done> {
    let s = bind_for(server, source)?;
    s.set_nonblocking(true)?;
    let mut d = Done::default();
    let mut n = 0u64;
    let mut b = [0u8; 2048];
    while Instant::now() < until {
        for _ in 0..64 {
            n += 1;
            if s.send_to(&long_header(0x1a2a_3a4a, n as u8, n), server)
                .is_ok()
            {
                d.datagrams_sent += 1;
                d.bytes_sent += 1200;
            }
        }
        while s.recv(&mut b).is_ok() {
            d.datagrams_received += 1;
        }
    }
    Ok(d)
}

fn client_config(transport: Option<TransportConfig>) -> ClientConfig {
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls::client())
        .expect("TLS 1.3 with an initial cipher suite");
    let mut c = ClientConfig::new(Arc::new(crypto));
    if let Some(t) = transport {
        c.transport_config(Arc::new(t));
    }
    c
}

fn initials(
    server: SocketAddr,
    source: Option<std::net::IpAddr>,
    until: Instant,
) -> std::io::Result<Done> {
    let cfg = client_config(None);
    let mut ep = Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None);
    let socks = (0..64)
        .map(|_| {
            let s = bind_for(server, source)?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut d = Done::default();
    let mut buf = Vec::new();
    let mut b = [0u8; 2048];
    let mut i = 0usize;
    while Instant::now() < until {
        let now = Instant::now();
        let Ok((_, mut conn)) = ep.connect(now, cfg.clone(), server, "localhost") else {
            break;
        };
        buf.clear();
        if let Some(t) = conn.poll_transmit(now, 1, &mut buf) {
            if socks[i % socks.len()]
                .send_to(&buf[..t.size], server)
                .is_ok()
            {
                d.datagrams_sent += 1;
                d.bytes_sent += t.size as u64;
            }
        }
        // The connection is forgotten: the endpoint keeps no more than
        // its handle (a few bytes) for each.
        drop(conn);
        i += 1;
        if i.is_multiple_of(64) {
            for s in &socks {
                while s.recv(&mut b).is_ok() {
                    d.datagrams_received += 1;
                }
            }
        }
    }
    Ok(d)
}

/// A quinn-proto client endpoint and its connections on one socket.
struct Client {
    sock: UdpSocket,
    ep: Endpoint,
    conns: HashMap<ConnectionHandle, Connection>,
    server: SocketAddr,
    buf: Vec<u8>,
    /// Connections to drive at the next step (a datagram, a timer or the
    /// attack touched them).
    dirty: HashSet<ConnectionHandle>,
    /// Each connection's next timeout.
    timers: BTreeSet<(Instant, ConnectionHandle)>,
    timer_of: HashMap<ConnectionHandle, Instant>,
    /// How long a received datagram waits before the endpoint takes it
    /// (late-ack), and those waiting.
    delay: Duration,
    late: VecDeque<(Instant, SocketAddr, BytesMut)>,
    /// Connections whose handshake finished since the attack last looked.
    connected: Vec<ConnectionHandle>,
    /// Read and drop what the server's streams bring (late-ack); others
    /// never read.
    read: bool,
    /// How connections ended, by code.
    closed: BTreeMap<String, u64>,
}

/// A name for how a connection ended: the server's close code (a
/// transport error or an application's), or what ended it here.
fn close_name(e: &ConnectionError) -> String {
    match e {
        ConnectionError::ApplicationClosed(c) => {
            format!("application 0x{:x}", c.error_code.into_inner())
        }
        ConnectionError::ConnectionClosed(c) => {
            format!("transport 0x{:x}", u64::from(c.error_code))
        }
        ConnectionError::TransportError(e) => format!("local transport 0x{:x}", u64::from(e.code)),
        ConnectionError::TimedOut => "timed out".into(),
        ConnectionError::Reset => "reset".into(),
        ConnectionError::LocallyClosed => "closed here".into(),
        ConnectionError::VersionMismatch => "version mismatch".into(),
        ConnectionError::CidsExhausted => "CIDs exhausted".into(),
    }
}

impl Client {
    fn new(server: SocketAddr, source: Option<std::net::IpAddr>) -> std::io::Result<Self> {
        let sock = bind_for(server, source)?;
        sock.set_nonblocking(true)?;
        Ok(Client {
            sock,
            ep: Endpoint::new(Arc::new(EndpointConfig::default()), None, false, None),
            conns: HashMap::new(),
            server,
            buf: Vec::new(),
            dirty: HashSet::new(),
            timers: BTreeSet::new(),
            timer_of: HashMap::new(),
            delay: Duration::ZERO,
            late: VecDeque::new(),
            connected: Vec::new(),
            read: false,
            closed: BTreeMap::new(),
        })
    }

    fn connect(&mut self, cfg: ClientConfig) -> Option<ConnectionHandle> {
        let (ch, c) = self
            .ep
            .connect(Instant::now(), cfg, self.server, "localhost")
            .ok()?;
        self.conns.insert(ch, c);
        self.dirty.insert(ch);
        Some(ch)
    }

    /// Every connection is driven at the next step.
    fn touch_all(&mut self) {
        self.dirty.extend(self.conns.keys().copied());
    }

    /// Connections not closed.
    fn live(&self) -> usize {
        self.conns.values().filter(|c| !c.is_closed()).count()
    }

    /// Connections established and not closed.
    fn established(&self) -> usize {
        self.conns
            .values()
            .filter(|c| !c.is_handshaking() && !c.is_closed())
            .count()
    }

    /// Receives, handles timers and sends; `keep` says whether a datagram
    /// of a connection goes out (an attack may drop its own packets).
    fn step(&mut self, d: &mut Done, keep: &mut dyn FnMut(ConnectionHandle) -> bool) {
        let now = Instant::now();
        let mut b = vec![0u8; 65536];
        while let Ok((n, from)) = self.sock.recv_from(&mut b) {
            d.datagrams_received += 1;
            self.late
                .push_back((now + self.delay, from, BytesMut::from(&b[..n])));
        }
        while self.late.front().is_some_and(|l| l.0 <= now) {
            let Some((_, from, data)) = self.late.pop_front() else {
                break;
            };
            self.buf.clear();
            match self.ep.handle(now, from, None, None, data, &mut self.buf) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = self.conns.get_mut(&ch) {
                        c.handle_event(ev);
                        self.dirty.insert(ch);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    let _ = self.sock.send_to(&self.buf[..t.size], t.destination);
                }
                _ => {}
            }
        }
        while let Some(&(t, ch)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            self.timer_of.remove(&ch);
            self.dirty.insert(ch);
        }
        let dirty: Vec<ConnectionHandle> = self.dirty.drain().collect();
        for ch in dirty {
            self.drive(ch, now, d, keep);
        }
    }

    /// Drives one connection: its timer, its events, its datagrams.
    fn drive(
        &mut self,
        ch: ConnectionHandle,
        now: Instant,
        d: &mut Done,
        keep: &mut dyn FnMut(ConnectionHandle) -> bool,
    ) {
        let Some(c) = self.conns.get_mut(&ch) else {
            return;
        };
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while let Some(ev) = c.poll_endpoint_events() {
            if let Some(back) = self.ep.handle_event(ch, ev) {
                c.handle_event(back);
            }
        }
        while let Some(ev) = c.poll() {
            match ev {
                Event::Connected => self.connected.push(ch),
                Event::ConnectionLost { reason } => {
                    *self.closed.entry(close_name(&reason)).or_default() += 1;
                }
                Event::Stream(StreamEvent::Readable { id }) if self.read => {
                    let mut s = c.recv_stream(id);
                    let read = s.read(true);
                    if let Ok(mut chunks) = read {
                        while let Ok(Some(_)) = chunks.next(usize::MAX) {}
                        let _ = chunks.finalize();
                    }
                }
                _ => {}
            }
        }
        let mut more = true;
        for _ in 0..64 {
            self.buf.clear();
            let Some(t) = c.poll_transmit(now, 1, &mut self.buf) else {
                more = false;
                break;
            };
            if keep(ch)
                && self
                    .sock
                    .send_to(&self.buf[..t.size], t.destination)
                    .is_ok()
            {
                d.datagrams_sent += 1;
                d.bytes_sent += t.size as u64;
            }
        }
        if more {
            self.dirty.insert(ch);
        }
        let next = if c.is_drained() {
            self.conns.remove(&ch);
            None
        } else {
            c.poll_timeout()
        };
        if self.timer_of.get(&ch).copied() != next {
            if let Some(t) = self.timer_of.remove(&ch) {
                self.timers.remove(&(t, ch));
            }
            if let Some(t) = next {
                self.timers.insert((t, ch));
                self.timer_of.insert(ch, t);
            }
        }
    }

    /// Steps until every connection has finished its handshake (or
    /// `until`).
    fn handshake(&mut self, d: &mut Done, until: Instant) {
        while Instant::now() < until && self.conns.values().any(|c| c.is_handshaking()) {
            self.step(d, &mut |_| true);
            std::thread::sleep(Duration::from_millis(1));
        }
        self.connected.clear();
        d.connections_established = self.established() as u64;
    }
}

fn connections(kind: Kind, a: &AttackArgs, until: Instant) -> std::io::Result<Done> {
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_millis(500)));
    t.max_idle_timeout(Some(VarInt::from_u32(60_000).into()));
    if kind == Kind::NeverRead {
        // A small window: the server may send little, and holds the rest.
        t.stream_receive_window(VarInt::from_u32(16 * 1024));
        t.receive_window(VarInt::from_u32(256 * 1024));
    }
    if kind == Kind::Windows {
        // The dropped packet of byte 0 is never found lost: no
        // retransmission fills the gap.
        t.packet_threshold(u32::MAX / 2);
        t.time_threshold(1e6);
    }
    let cfg = client_config(Some(t));
    let mut d = Done::default();
    let mut c = Client::new(a.server, a.source)?;
    for _ in 0..a.connections {
        c.connect(cfg.clone());
    }
    c.handshake(&mut d, until);
    let handles: Vec<ConnectionHandle> = c.conns.keys().copied().collect();
    // Streams whose byte 0 is to be dropped (windows), by connection.
    let mut gap: HashMap<ConnectionHandle, Vec<StreamId>> = HashMap::new();
    let chunk = vec![b'x'; 1200];
    for &ch in &handles {
        let Some(conn) = c.conns.get_mut(&ch) else {
            continue;
        };
        for _ in 0..a.streams {
            let Some(id) = conn.streams().open(Dir::Bi) else {
                break;
            };
            d.streams_opened += 1;
            match kind {
                Kind::SlowRequests => {
                    let _ = conn.send_stream(id).write(b"GET /bytes/");
                }
                Kind::NeverRead => {
                    let _ = conn.send_stream(id).write(b"GET /bytes/1000000000\r\n");
                    let _ = conn.send_stream(id).finish();
                }
                Kind::Windows => {
                    let _ = conn.send_stream(id).write(b"G");
                    gap.entry(ch).or_default().push(id);
                }
                _ => {}
            }
        }
    }
    if kind == Kind::Windows {
        // Byte 0 of every stream leaves in packets of their own, which
        // are dropped.
        c.touch_all();
        c.step(&mut d, &mut |_| false);
    }
    while Instant::now() < until {
        if kind == Kind::Windows {
            // Keep every stream's window full from offset 1.
            for (ch, ids) in &gap {
                if let Some(conn) = c.conns.get_mut(ch) {
                    for id in ids {
                        let mut s = conn.send_stream(*id);
                        while matches!(s.write(&chunk), Ok(n) if n > 0) {}
                    }
                }
            }
        }
        c.touch_all();
        c.step(&mut d, &mut |_| true);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(d)
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The migration flood: a handshake from `--source`, then for each of
/// `--ports` new ports of `--victim`, `--per-port` PINGs sent from it.
/// The victim's sockets never answer; what the server sends them is
/// counted after a second's wait for the last of it.
fn migration(a: &AttackArgs, until: Instant) -> std::io::Result<Done> {
    let victim = a
        .victim
        .ok_or_else(|| std::io::Error::other("migration needs --victim"))?;
    let mut d = Done::default();
    let mut c = Client::new(a.server, a.source)?;
    let ch = c
        .connect(client_config(None))
        .ok_or_else(|| std::io::Error::other("cannot start a connection"))?;
    c.handshake(&mut d, until);
    // The handshake's last packets and ACKs settle.
    let settle = Instant::now() + Duration::from_millis(300);
    while Instant::now() < settle.min(until) {
        c.touch_all();
        c.step(&mut d, &mut |_| true);
        std::thread::sleep(Duration::from_millis(1));
    }
    if d.connections_established != 1 {
        return Err(std::io::Error::other("no handshake with the server"));
    }
    // Each port: its socket, what it sent, what it got (bytes, datagrams).
    let mut ports: Vec<(UdpSocket, u64, u64, u64)> = Vec::new();
    let mut b = vec![0u8; 65536];
    let drain = |ports: &mut Vec<(UdpSocket, u64, u64, u64)>, b: &mut [u8]| {
        for p in ports.iter_mut() {
            while let Ok(n) = p.0.recv(b) {
                p.2 += n as u64;
                p.3 += 1;
            }
        }
    };
    for _ in 0..a.ports {
        if Instant::now() >= until {
            break;
        }
        let v = UdpSocket::bind(SocketAddr::new(victim, 0))?;
        v.set_nonblocking(true)?;
        let mut sent = 0u64;
        let Some(conn) = c.conns.get_mut(&ch) else {
            break;
        };
        for _ in 0..a.per_port {
            conn.ping();
            loop {
                c.buf.clear();
                let Some(t) = conn.poll_transmit(Instant::now(), 1, &mut c.buf) else {
                    break;
                };
                if v.send_to(&c.buf[..t.size], a.server).is_ok() {
                    sent += t.size as u64;
                    d.datagrams_sent += 1;
                    d.bytes_sent += t.size as u64;
                }
            }
        }
        ports.push((v, sent, 0, 0));
        if ports.len().is_multiple_of(64) {
            drain(&mut ports, &mut b);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The server's last answers (its ACK delay, its PATH_CHALLENGE
    // retransmissions within the budget) arrive.
    std::thread::sleep(Duration::from_secs(1));
    drain(&mut ports, &mut b);
    let mut v = Victim {
        ports: ports.len() as u64,
        ..Victim::default()
    };
    for p in &ports {
        v.bytes_from_victim += p.1;
        v.bytes_to_victim += p.2;
        v.datagrams_to_victim += p.3;
        if p.1 > 0 {
            v.worst_port_ratio = v.worst_port_ratio.max(p.2 as f64 / p.1 as f64);
        }
    }
    v.ratio = v.bytes_to_victim as f64 / v.bytes_from_victim.max(1) as f64;
    d.victim = Some(v);
    Ok(d)
}

/// Late acknowledgements: `--connections` from each of `--addresses`
/// addresses finish their handshake, then take every datagram of the
/// server `--delay` seconds after it arrived, while asking for a small
/// response every second (what the server's RTT samples are made of)
/// and PINGing every `--keep-alive` seconds; at `--duration` they vanish
/// without a close.
fn late_ack(a: &AttackArgs, until: Instant) -> std::io::Result<Done> {
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs_f64(a.keep_alive)));
    t.max_idle_timeout(Some(VarInt::from_u32(600_000).into()));
    let cfg = client_config(Some(t));
    let mut d = Done::default();
    let mut clients = Vec::new();
    for ip in sources(a) {
        let mut c = Client::new(a.server, ip)?;
        c.read = true;
        for _ in 0..a.connections {
            c.connect(cfg.clone());
        }
        clients.push(c);
    }
    d.handshakes_started = Some((a.connections * clients.len()) as u64);
    while Instant::now() < until
        && clients
            .iter()
            .any(|c| c.conns.values().any(|c| c.is_handshaking()))
    {
        for c in &mut clients {
            c.step(&mut d, &mut |_| true);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let established: u64 = clients.iter().map(|c| c.established() as u64).sum();
    for c in &mut clients {
        c.connected.clear();
        c.delay = Duration::from_secs_f64(a.delay);
    }
    d.connections_established = established;
    d.established_peak = Some(established);
    let mut next_ask = Instant::now();
    while Instant::now() < until {
        if Instant::now() >= next_ask {
            next_ask += Duration::from_secs(1);
            for c in &mut clients {
                for (&ch, conn) in c.conns.iter_mut() {
                    if conn.is_closed() {
                        continue;
                    }
                    if let Some(id) = conn.streams().open(Dir::Bi) {
                        let _ = conn.send_stream(id).write(b"GET /bytes/10\r\n");
                        let _ = conn.send_stream(id).finish();
                        d.streams_opened += 1;
                        c.dirty.insert(ch);
                    }
                }
            }
        }
        for c in &mut clients {
            c.step(&mut d, &mut |_| true);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Gone: no close, no more datagrams.
    d.vanished_at_unix = Some(unix_now());
    d.connections_established = clients.iter().map(|c| c.established() as u64).sum();
    let mut rtts: Vec<Duration> = clients
        .iter()
        .flat_map(|c| c.conns.values())
        .filter(|c| !c.is_closed())
        .map(|c| c.rtt())
        .collect();
    rtts.sort();
    d.rtt_ms_median = rtts.get(rtts.len() / 2).map(|r| r.as_secs_f64() * 1e3);
    for c in &clients {
        for (k, n) in &c.closed {
            *d.closed.entry(k.clone()).or_default() += n;
        }
    }
    Ok(d)
}

/// Holding places: `--connections` from each of `--addresses`
/// addresses, kept alive with PINGs, each asking (if `--request` is
/// given) for `--request` on `--streams` streams it never reads through a
/// `--window`-byte window; whatever the server closes is opened again, a
/// few handshakes at a time per address.
fn hold(a: &AttackArgs, until: Instant) -> std::io::Result<Done> {
    let streams = if a.request.is_some() {
        a.streams.min(1000)
    } else {
        0
    };
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs_f64(a.keep_alive)));
    t.max_idle_timeout(Some(VarInt::from_u32(60_000).into()));
    t.stream_receive_window(VarInt::from_u32(a.window));
    t.receive_window(VarInt::from_u32(
        a.window.saturating_mul(streams.max(1) as u32),
    ));
    let cfg = client_config(Some(t));
    let line = a
        .request
        .as_ref()
        .map(|r| format!("GET {r}\r\n").into_bytes());
    let mut d = Done::default();
    let mut clients = sources(a)
        .into_iter()
        .map(|ip| Client::new(a.server, ip))
        .collect::<std::io::Result<Vec<_>>>()?;
    // Handshakes under way per address: 128 in all at most, and as many
    // started every 100 ms at most (a refused address tries again at
    // that pace).
    let in_flight = (128 / clients.len()).max(1);
    let (mut started, mut peak) = (0u64, 0u64);
    let mut next_count = Instant::now();
    let mut next_open = Instant::now();
    while Instant::now() < until {
        let open = Instant::now() >= next_open;
        if open {
            next_open += Duration::from_millis(100);
        }
        for c in &mut clients {
            if open {
                let live = c.live();
                let handshaking = c
                    .conns
                    .values()
                    .filter(|c| c.is_handshaking() && !c.is_closed())
                    .count();
                let want = a
                    .connections
                    .saturating_sub(live)
                    .min(in_flight.saturating_sub(handshaking));
                for _ in 0..want {
                    if c.connect(cfg.clone()).is_some() {
                        started += 1;
                    }
                }
            }
            c.step(&mut d, &mut |_| true);
            if let Some(line) = &line {
                for ch in std::mem::take(&mut c.connected) {
                    let Some(conn) = c.conns.get_mut(&ch) else {
                        continue;
                    };
                    for _ in 0..streams {
                        let Some(id) = conn.streams().open(Dir::Bi) else {
                            break;
                        };
                        let _ = conn.send_stream(id).write(line);
                        let _ = conn.send_stream(id).finish();
                        d.streams_opened += 1;
                    }
                    c.dirty.insert(ch);
                }
            } else {
                c.connected.clear();
            }
        }
        if Instant::now() >= next_count {
            next_count += Duration::from_millis(100);
            let now: u64 = clients.iter().map(|c| c.established() as u64).sum();
            peak = peak.max(now);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    d.connections_established = clients.iter().map(|c| c.established() as u64).sum();
    d.handshakes_started = Some(started);
    d.established_peak = Some(peak.max(d.connections_established));
    for c in &clients {
        for (k, n) in &c.closed {
            *d.closed.entry(k.clone()).or_default() += n;
        }
    }
    Ok(d)
}
