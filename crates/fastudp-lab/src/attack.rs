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
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

/// Runs `fastudp-lab attack`.
pub fn run(a: AttackArgs) -> anyhow::Result<()> {
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 600.0) {
        bail_usage!("--duration {}: between 0 and 600 s", a.duration);
    }
    if a.connections == 0 || a.connections > 10_000 || a.streams > 10_000 {
        bail_usage!("--connections: 1 to 10000; --streams: at most 10000");
    }
    let until = Instant::now() + Duration::from_secs_f64(a.duration);
    let done = match a.kind {
        Kind::Forward => forward(a.server, a.source, until),
        Kind::Version => version(a.server, a.source, until),
        Kind::Initials => initials(a.server, a.source, until),
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
        )
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
        })
    }

    fn connect(&mut self, cfg: ClientConfig) -> Option<ConnectionHandle> {
        let (ch, c) = self
            .ep
            .connect(Instant::now(), cfg, self.server, "localhost")
            .ok()?;
        self.conns.insert(ch, c);
        Some(ch)
    }

    /// Receives, handles timers and sends; `keep` says whether a datagram
    /// of a connection goes out (an attack may drop its own packets).
    fn step(&mut self, d: &mut Done, keep: &mut dyn FnMut(ConnectionHandle) -> bool) {
        let now = Instant::now();
        let mut b = [0u8; 65536];
        while let Ok((n, from)) = self.sock.recv_from(&mut b) {
            d.datagrams_received += 1;
            self.buf.clear();
            match self.ep.handle(
                now,
                from,
                None,
                None,
                BytesMut::from(&b[..n]),
                &mut self.buf,
            ) {
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(c) = self.conns.get_mut(&ch) {
                        c.handle_event(ev);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    let _ = self.sock.send_to(&self.buf[..t.size], t.destination);
                }
                _ => {}
            }
        }
        let handles: Vec<ConnectionHandle> = self.conns.keys().copied().collect();
        for ch in handles {
            let Some(c) = self.conns.get_mut(&ch) else {
                continue;
            };
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            while let Some(ev) = c.poll_endpoint_events() {
                if let Some(back) = self.ep.handle_event(ch, ev) {
                    c.handle_event(back);
                }
            }
            while c.poll().is_some() {}
            for _ in 0..64 {
                self.buf.clear();
                let Some(t) = c.poll_transmit(now, 1, &mut self.buf) else {
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
            if c.is_drained() {
                self.conns.remove(&ch);
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
        d.connections_established = self
            .conns
            .values()
            .filter(|c| !c.is_handshaking() && !c.is_closed())
            .count() as u64;
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
        c.step(&mut d, &mut |_| true);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(d)
}
