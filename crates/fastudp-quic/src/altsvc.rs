//! HTTP/3 discovery over TCP: a TLS-over-TCP listener on the QUIC port
//! number that answers HTTP/1.1 and HTTP/2 (by ALPN) with the same
//! content as the HTTP/3 application and the header
//! `Alt-Svc: h3=":PORT"; ma=86400`, so that a browser that starts over
//! TCP (as every browser does for an origin it has not seen) moves to
//! HTTP/3.
//!
//! # Why here
//!
//! It lives in the engine crate, beside [`crate::h3`], because it answers
//! with the same [`Handler`] (`/bytes/N`, `/video/...`, static files
//! through [`crate::files::Root`], which opens them with `openat2(2)`),
//! so any embedder that serves HTTP/3 gets discovery for its own handler,
//! and both transports serve the same bytes. HTTP is hyper's
//! (hyper-util's auto server over tokio-rustls); what is here is the
//! handler's seam and the bounds. It shares no state with the QUIC
//! workers: it runs on a thread of its own, with a tokio current-thread
//! runtime and a `LocalSet` (a [`Handler`] need not be `Send`; each
//! connection gets its own from [`MakeHandler`]).
//!
//! # Shape and bounds
//!
//! One task accepts; each connection is a task, at most
//! [`Config::max_connections`] at once, and [`Config::per_ip`] from one
//! client address (more are closed at once and counted in
//! [`Stats::refused`]). Every way a client can hold a connection is
//! bounded:
//!
//! | What | Bound | When it is passed |
//! |---|---|---|
//! | TLS handshake plus the first request head | [`Config::request_timeout`] from accept | closed, [`Stats::request_timeouts`] |
//! | A later HTTP/1.1 request head | [`Config::request_timeout`] from its first byte (hyper's `header_read_timeout`, [`Config::idle_timeout`] plus [`Config::request_timeout`] from the previous answer, backs it) | closed, [`Stats::request_timeouts`] |
//! | Idle, no request under way (HTTP/1.1 keep-alive, HTTP/2 with no stream) | [`Config::idle_timeout`] | HTTP/1.1 closed, HTTP/2 GOAWAY then closed; [`Stats::idle_closed`] |
//! | HTTP/1.1 request head size | [`MAX_HEAD`] bytes (hyper's `max_buf_size`) | hyper answers 431, closed, [`Stats::bad_requests`] |
//! | HTTP/1.1 header fields | [`MAX_FIELDS`] (hyper's `max_headers`) | hyper answers 431, closed, [`Stats::bad_requests`] |
//! | HTTP/2 header list | [`MAX_HEAD`] bytes (`SETTINGS_MAX_HEADER_LIST_SIZE`) | the stream refused by h2 |
//! | HTTP/2 streams at once | [`H2_MAX_STREAMS`] (`SETTINGS_MAX_CONCURRENT_STREAMS`) | refused by h2 |
//! | HTTP/2 streams the client resets before they are answered, and resets the server must send | [`H2_MAX_PENDING_RESETS`], [`H2_MAX_LOCAL_RESETS`] | GOAWAY, closed |
//! | HTTP/2 request data the client may send unasked | [`H2_WINDOW`] per stream and per connection | flow control |
//! | Request body | none accepted (`Content-Length` above 0, any `Transfer-Encoding`) | 413 or 501 (HTTP/1.1: closed), [`Stats::bad_requests`] |
//! | A response piece the client does not take ([`crate::h3::CHUNK`] bytes once a write waits; over HTTP/2 also a chunk its window does not take) | [`Config::send_timeout`] | closed, [`Stats::send_failed`] |
//! | Requests per connection | [`MAX_REQUESTS`] | HTTP/1.1: the last answer says `connection: close`; HTTP/2: GOAWAY |
//! | Reading on after a refusal (so the answer is not lost to a reset) | [`LINGER`], [`LINGER_BYTES`] | closed |
//!
//! [`Listener::drain`] stops accepting (a new connection is refused by
//! the kernel), closes the connections that wait for a next request, and
//! lets those with a request under way finish it: over HTTP/1.1 its
//! answer says `connection: close` and the connection closes after it;
//! over HTTP/2 the connection gets GOAWAY and closes after its streams.
//!
//! HTTP/1.1 is parsed by hyper (httparse), which refuses a malformed head
//! with 400 (and a head over the bounds with 431) itself: those answers
//! carry no `Alt-Svc`, and are counted in [`Stats::bad_requests`] and as
//! 4xx. Stricter than hyper, a request is refused with 400 here when its
//! target is not in origin-form (`/path?query`) or an HTTP/1.1 request
//! has no `Host` field or more than one.
//!
//! [`Handler`]: crate::h3::Handler

use crate::app::ConnInfo;
use crate::h3::{Handler, MakeHandler, Next};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::{Body as _, Frame};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify};

/// The longest HTTP/1.1 request head (request line and header fields),
/// and the largest HTTP/2 header list, accepted, in bytes: 16 KiB.
pub const MAX_HEAD: usize = 16 * 1024;

/// The most header fields an HTTP/1.1 request may carry.
pub const MAX_FIELDS: usize = 64;

/// The most requests one connection may make; the last answer closes it
/// (HTTP/1.1), or GOAWAY follows it (HTTP/2).
pub const MAX_REQUESTS: u64 = 1000;

/// The default of [`Config::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

/// The default of [`Config::send_timeout`]: 10 s.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of [`Config::idle_timeout`]: 10 s.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an `Alt-Svc` advertisement lasts, in seconds (`ma=`).
pub const MAX_AGE: u32 = 86_400;

/// The ALPN protocols of the listener, in its order of preference.
pub const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// HTTP/2: streams open at once per connection (as HTTP/3's default
/// per connection).
pub const H2_MAX_STREAMS: u32 = 16;

/// HTTP/2: streams the client may reset before they are answered, at
/// once (hyper's bound against the "rapid reset" attack).
pub const H2_MAX_PENDING_RESETS: usize = 20;

/// HTTP/2: streams the server may reset for the client's errors before
/// it closes the connection.
pub const H2_MAX_LOCAL_RESETS: usize = 256;

/// HTTP/2: the receive window of each stream and of the connection (no
/// request body is taken: this is what a client may send anyway).
pub const H2_WINDOW: u32 = 64 * 1024;

/// The body chunk of a response over TCP: 16 KiB (one TLS record, one
/// HTTP/2 DATA frame at the default frame size). A chunk is read from
/// the handler's body only when the connection has room for it
/// ([`CONN_BODY`]) and the response's previous chunk has been written
/// whole to TLS.
pub const TCP_CHUNK: usize = 16 * 1024;

/// Response bytes one connection may hold at once, read from handlers'
/// bodies and not yet written whole to TLS (in hyper's or h2's buffers,
/// or waiting for the client's window): 64 KiB, four chunks. A response
/// whose chunk does not fit waits until one is written; over HTTP/2 at
/// most four of the 16 streams hold one at a time.
pub const CONN_BODY: usize = 4 * TCP_CHUNK;

/// What one connection may hold beyond [`CONN_BODY`], as counted for
/// `--max-memory` (docs/SECURITY.md has the terms): rustls' send buffer
/// ([`TLS_SEND_BUFFER`]), its record and plaintext read buffers (about
/// 34 KiB), hyper's HTTP/1.1 read and write buffers or h2's frame, header
/// list and write buffers and HPACK tables (about 52 KiB), the
/// connection's task and state (about 10 KiB).
pub const CONN_FIXED: usize = 128 * 1024;

/// rustls' buffer of encrypted bytes not yet taken by the socket, per
/// connection: 32 KiB (rustls' default is 64 KiB).
pub const TLS_SEND_BUFFER: usize = 32 * 1024;

/// A connection counts as stalled, and may be evicted for a newcomer
/// when every place is taken, once a chunk of its response has waited
/// this long to be written (the client's window is shut, or its socket
/// takes nothing), or its TLS handshake or an HTTP/1.1 head has taken
/// this long: 2 s, as the QUIC side's ([`crate::limits::STALL_EVICT`]).
pub const STALL_EVICT: Duration = crate::limits::STALL_EVICT;

/// A newcomer's eviction looks at this many connections of each address
/// at most, the oldest first.
const EVICT_PER_ADDRESS: usize = 64;

/// ... and at this many addresses at most, those holding the most first.
const EVICT_ADDRESSES: usize = 64;

/// When nothing idle or stalled can go, a newcomer whose address holds N
/// connections evicts the oldest of an address holding at least this
/// many times N + 1, busy or not (as the QUIC side).
const EVICT_BUSY_RATIO: usize = 8;

/// What the listener may hold at most with `max_connections` places,
/// bytes: each place's [`CONN_BODY`] and [`CONN_FIXED`]. `quic serve`
/// takes it from `--max-memory` before the QUIC connections' budget
/// ([`crate::EngineConfig::reserve`]); 256 places: 48 MiB.
pub fn memory_bound(max_connections: usize) -> u64 {
    max_connections as u64 * (CONN_BODY + CONN_FIXED) as u64
}

/// How long a refused request's connection reads on after the answer.
pub const LINGER: Duration = Duration::from_secs(1);

/// How many bytes it reads at most meanwhile (64 KiB).
pub const LINGER_BYTES: usize = 64 * 1024;

/// What the listener is to do.
#[derive(Clone)]
pub struct Config {
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    h3_port: u16,
    make: Arc<MakeHandler>,
    /// Connections open at once, at most (default [`MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Connections open at once from one client address (an IPv6 /64),
    /// at most; more are closed at once and counted in
    /// [`Stats::refused`]. `None` (the default): a quarter of
    /// [`Config::max_connections`], at least 1, so that one address
    /// cannot hold every place.
    pub max_connections_per_ip: Option<usize>,
    /// Time for a request head (and, for the first, the TLS handshake)
    /// to arrive whole (default [`crate::limits::REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// Time a connection may wait for its next request (default
    /// [`IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// Time the client has to take each piece of a response (its head,
    /// each body chunk), progress or not (default [`SEND_TIMEOUT`]).
    pub send_timeout: Duration,
    /// How long a chunk, a handshake or a head must have waited for its
    /// connection to count as stalled, and be evicted for a newcomer
    /// when every place is taken (default [`STALL_EVICT`]).
    pub stall_evict: Duration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("h3_port", &self.h3_port)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_ip", &self.max_connections_per_ip)
            .field("request_timeout", &self.request_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("stall_evict", &self.stall_evict)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Listen on `addr` with the certificate of `tls` (its ALPN list is
    /// replaced by `http/1.1`, and early data is refused), advertise
    /// HTTP/3 on `h3_port`, and answer with the handler `make` gives each
    /// connection's thread.
    pub fn new(
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        h3_port: u16,
        make: Arc<MakeHandler>,
    ) -> Config {
        Config {
            addr,
            tls,
            h3_port,
            make,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_ip: None,
            request_timeout: crate::limits::REQUEST_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            send_timeout: SEND_TIMEOUT,
            stall_evict: STALL_EVICT,
        }
    }

    /// The bound on connections from one address in force:
    /// [`Config::max_connections_per_ip`] or its default.
    pub fn per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or((self.max_connections / 4).max(1))
    }

    /// What the listener may hold at most, bytes ([`memory_bound`] of
    /// [`Config::max_connections`]).
    pub fn memory_bound(&self) -> u64 {
        memory_bound(self.max_connections)
    }
}

/// What the listener has counted (all atomic; read them with
/// [`Stats::snapshot`]).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed at once: [`Config::max_connections`] were open,
    /// or [`Config::per_ip`] from the client's address (or no thread
    /// could be started).
    pub refused: AtomicU64,
    /// TLS handshakes that failed.
    pub tls_failed: AtomicU64,
    /// Requests answered by the handler.
    pub requests: AtomicU64,
    /// Requests refused by the parser (400, 413, 431, 501).
    pub bad_requests: AtomicU64,
    /// Connections closed because a request head (or the handshake) was
    /// not whole within [`Config::request_timeout`].
    pub request_timeouts: AtomicU64,
    /// Connections closed after [`Config::idle_timeout`] without a request.
    pub idle_closed: AtomicU64,
    /// Responses cut short: a write failed or stalled past
    /// [`Config::send_timeout`].
    pub send_failed: AtomicU64,
    /// Responses cut short by their body's error (a file that shrank).
    pub body_errors: AtomicU64,
    /// Response bytes (head and body) handed to TLS.
    pub bytes_sent: AtomicU64,
    /// Responses begun, by status class ([`crate::status_class`]: index 0
    /// counts 1xx, 4 counts 5xx), the parser's refusals included.
    pub responses: [AtomicU64; 5],
    /// Connections closed to make room for a newcomer while every place
    /// was taken (idle or stalled ones, or the oldest of an address
    /// holding many times the newcomer's).
    pub evicted: AtomicU64,
    /// HTTP/2 connections h2 ended itself with a GOAWAY for the client's
    /// protocol error: rapid resets, floods of CONTINUATION, SETTINGS or
    /// PING frames, resets the server had to send, malformed frames. A
    /// client's GOAWAY, reset or vanished socket is not counted (HTTP/1.1
    /// heads hyper refuses are `bad_requests`).
    pub protocol_closed: AtomicU64,
    /// Response bytes held now: read from handlers' bodies and not yet
    /// written whole to TLS (at most [`CONN_BODY`] per connection).
    pub held: AtomicU64,
    /// The most [`Stats::held`] has been.
    pub held_peak: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// [`Stats::accepted`].
    pub accepted: u64,
    /// [`Stats::open`].
    pub open: u64,
    /// [`Stats::refused`].
    pub refused: u64,
    /// [`Stats::tls_failed`].
    pub tls_failed: u64,
    /// [`Stats::requests`].
    pub requests: u64,
    /// [`Stats::bad_requests`].
    pub bad_requests: u64,
    /// [`Stats::request_timeouts`].
    pub request_timeouts: u64,
    /// [`Stats::idle_closed`].
    pub idle_closed: u64,
    /// [`Stats::send_failed`].
    pub send_failed: u64,
    /// [`Stats::body_errors`].
    pub body_errors: u64,
    /// [`Stats::bytes_sent`].
    pub bytes_sent: u64,
    /// [`Stats::evicted`].
    pub evicted: u64,
    /// [`Stats::protocol_closed`].
    pub protocol_closed: u64,
    /// [`Stats::held`].
    pub held: u64,
    /// [`Stats::held_peak`].
    pub held_peak: u64,
}

impl Stats {
    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            accepted: self.accepted.load(Relaxed),
            open: self.open.load(Relaxed),
            refused: self.refused.load(Relaxed),
            tls_failed: self.tls_failed.load(Relaxed),
            requests: self.requests.load(Relaxed),
            bad_requests: self.bad_requests.load(Relaxed),
            request_timeouts: self.request_timeouts.load(Relaxed),
            idle_closed: self.idle_closed.load(Relaxed),
            send_failed: self.send_failed.load(Relaxed),
            body_errors: self.body_errors.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            protocol_closed: self.protocol_closed.load(Relaxed),
            held: self.held.load(Relaxed),
            held_peak: self.held_peak.load(Relaxed),
        }
    }
}

/// Where the listener is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Run,
    Drain,
    Stop,
}

/// State the accept task and the connections share.
struct Shared {
    cfg: Config,
    alt_svc: HeaderValue,
    stats: Arc<Stats>,
    /// Connections open per client address.
    per_address: crate::limits::PerAddress,
}

/// A running listener. [`Listener::stop`] ends it; dropping it does too.
pub struct Listener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// The listening socket (shut down to refuse new connections at once).
    socket: TcpListener,
    phase: watch::Sender<Phase>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Binds `cfg`'s address (TCP) and starts accepting. An address in
    /// use, or a configuration without a certificate, is an error here.
    pub fn start(cfg: Config) -> io::Result<Listener> {
        if cfg.max_connections == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "max_connections: at least 1",
            ));
        }
        if cfg.max_connections_per_ip == Some(0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "max_connections_per_ip: at least 1",
            ));
        }
        let mut tls = (*cfg.tls).clone();
        tls.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        tls.max_early_data_size = 0;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let alt_svc = HeaderValue::from_str(&format!("h3=\":{}\"; ma={MAX_AGE}", cfg.h3_port))
            .map_err(io::Error::other)?;
        let socket = TcpListener::bind(cfg.addr)?;
        socket.set_nonblocking(true)?;
        let addr = socket.local_addr()?;
        let per_address = crate::limits::PerAddress::new(cfg.per_ip());
        let shared = Arc::new(Shared {
            cfg,
            alt_svc,
            stats: Arc::new(Stats::default()),
            per_address,
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (phase, phase_rx) = watch::channel(Phase::Run);
        let (l, s) = (socket.try_clone()?, shared.clone());
        let thread = std::thread::Builder::new()
            .name("altsvc".into())
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, run(l, s, acceptor, phase_rx));
                // The connections still open end here, with their tasks.
                drop(local);
            })?;
        Ok(Listener {
            addr,
            shared,
            socket,
            phase,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound on connections from one address in force
    /// ([`Config::per_ip`]).
    pub fn per_ip(&self) -> usize {
        self.shared.cfg.per_ip()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.shared.stats
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.shared.stats.open.load(Relaxed)
    }

    /// Starts a graceful drain and returns at once: no new connection is
    /// accepted (the listening socket is shut, so the kernel refuses
    /// them), a connection waiting for its next request is closed, and a
    /// request under way is finished: over HTTP/1.1 its answer says
    /// `connection: close` and the connection closes after it, over
    /// HTTP/2 the connection gets GOAWAY and closes after its streams.
    /// [`Listener::open`] falls to 0 as they end; [`Listener::stop`] ends
    /// the rest.
    pub fn drain(&self) {
        self.phase.send_if_modified(|p| {
            let run = *p == Phase::Run;
            if run {
                *p = Phase::Drain;
            }
            run
        });
        let _ = socket2::SockRef::from(&self.socket).shutdown(Shutdown::Both);
    }

    /// Stops accepting, closes every open connection, and waits up to
    /// `wait` for them to end.
    pub fn stop(mut self, wait: Duration) {
        self.shutdown(wait);
    }

    fn shutdown(&mut self, wait: Duration) {
        self.phase.send_replace(Phase::Stop);
        let _ = socket2::SockRef::from(&self.socket).shutdown(Shutdown::Both);
        let end = Instant::now() + wait;
        if let Some(t) = self.thread.take() {
            while !t.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown(Duration::ZERO);
        }
    }
}

/// Runs the futures hyper spawns (HTTP/2 streams) on the listener's
/// `LocalSet`: the handler and its bodies need not be `Send`.
#[derive(Clone, Copy, Debug)]
struct Local;

impl<F: Future + 'static> hyper::rt::Executor<F> for Local {
    fn execute(&self, f: F) {
        tokio::task::spawn_local(f);
    }
}

/// hyper's server for one protocol, with its bounds.
fn builder(cfg: &Config, h2: bool) -> auto::Builder<Local> {
    let b = auto::Builder::new(Local);
    let mut b = if h2 { b.http2_only() } else { b.http1_only() };
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.idle_timeout + cfg.request_timeout)
        .max_buf_size(MAX_HEAD)
        .max_headers(MAX_FIELDS);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(MAX_HEAD as u32)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
        .initial_stream_window_size(H2_WINDOW)
        .initial_connection_window_size(H2_WINDOW)
        .max_send_buf_size(TCP_CHUNK);
    b
}

/// The listener's thread: accepts until a drain or a stop, then (after
/// a drain) keeps serving the connections open until the stop.
async fn run(
    l: TcpListener,
    shared: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    mut phase: watch::Receiver<Phase>,
) {
    let Ok(l) = tokio::net::TcpListener::from_std(l) else {
        return;
    };
    let builders = Rc::new([builder(&shared.cfg, false), builder(&shared.cfg, true)]);
    let table = Rc::new(Table::default());
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            a = l.accept() => a,
            _ = phase.wait_for(|p| *p != Phase::Run) => break,
        };
        if *phase.borrow() != Phase::Run {
            break;
        }
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            // EMFILE and the like: wait a little rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let stats = &shared.stats;
        let full = stats.open.load(Relaxed) >= shared.cfg.max_connections as u64
            && !table.evict_for(&shared, peer.ip(), Instant::now());
        if full || !shared.per_address.take(peer.ip()) {
            stats.refused.fetch_add(1, Relaxed);
            continue;
        }
        stats.open.fetch_add(1, Relaxed);
        stats.accepted.fetch_add(1, Relaxed);
        let slot = Rc::new(Slot {
            ip: peer.ip(),
            accepted: Instant::now(),
            state: RefCell::new(None),
            released: Cell::new(false),
            wake: Notify::new(),
        });
        table.insert(next_id, slot.clone());
        let open = Open {
            shared: shared.clone(),
            table: table.clone(),
            slot,
            id: next_id,
        };
        let c = Conn {
            shared: shared.clone(),
            builders: builders.clone(),
            acceptor: acceptor.clone(),
            phase: phase.clone(),
            id: next_id,
        };
        next_id += 1;
        tokio::task::spawn_local(c.serve(tcp, open));
    }
    // New connections are refused from here on (the socket is shut);
    // those open finish, or end at the stop.
    drop(l);
    let _ = phase.wait_for(|p| *p == Phase::Stop).await;
}

/// A connection's place as eviction sees it.
struct Slot {
    ip: IpAddr,
    accepted: Instant,
    /// Its state once the TLS handshake is done.
    state: RefCell<Option<Rc<State>>>,
    /// It was evicted: its place is given back already.
    released: Cell<bool>,
    /// Wakes the connection when it is evicted.
    wake: Notify,
}

impl Slot {
    /// Idle (no request under way) or stalled (a chunk, handshake or
    /// head waiting for `after`).
    fn evictable(&self, now: Instant, after: Duration) -> bool {
        match &*self.state.borrow() {
            None => now.saturating_duration_since(self.accepted) >= after,
            Some(st) => st.evictable(now, after),
        }
    }
}

/// The connections open, for eviction (the listener's thread only).
#[derive(Default)]
struct Table {
    conns: RefCell<HashMap<u64, Rc<Slot>>>,
    /// The connections of each address (key), the oldest first.
    by_address: RefCell<HashMap<IpAddr, std::collections::BTreeSet<u64>>>,
}

impl Table {
    fn insert(&self, id: u64, slot: Rc<Slot>) {
        let key = crate::limits::address_key(slot.ip);
        self.by_address
            .borrow_mut()
            .entry(key)
            .or_default()
            .insert(id);
        self.conns.borrow_mut().insert(id, slot);
    }

    fn remove(&self, id: u64) -> Option<Rc<Slot>> {
        let slot = self.conns.borrow_mut().remove(&id)?;
        let key = crate::limits::address_key(slot.ip);
        let mut by = self.by_address.borrow_mut();
        if let Some(set) = by.get_mut(&key) {
            set.remove(&id);
            if set.is_empty() {
                by.remove(&key);
            }
        }
        Some(slot)
    }

    /// Every place is taken: makes room for a newcomer from `ip`, if its
    /// address holds fewer than its share and at least two fewer than
    /// another, by closing the oldest idle or stalled connection of its
    /// own address, or else of the address holding the most that has
    /// one; when none is, the oldest connection of an address holding at
    /// least [`EVICT_BUSY_RATIO`] times the newcomer's plus one. The
    /// evicted connection's place is free at once. True when one was.
    fn evict_for(&self, shared: &Shared, ip: IpAddr, now: Instant) -> bool {
        let per = &shared.per_address;
        let mine = per.count(ip);
        if mine >= per.max() {
            return false;
        }
        let top = per.top(mine + 1, EVICT_ADDRESSES);
        if top.is_empty() {
            return false;
        }
        let after = shared.cfg.stall_evict;
        let victim = {
            let by = self.by_address.borrow();
            let conns = self.conns.borrow();
            let own = crate::limits::address_key(ip);
            let find = |key: &IpAddr| {
                by.get(key)?
                    .iter()
                    .take(EVICT_PER_ADDRESS)
                    .find(|id| conns.get(id).is_some_and(|s| s.evictable(now, after)))
                    .copied()
            };
            std::iter::once(own)
                .chain(top.iter().map(|&(k, _)| k))
                .find_map(|k| find(&k))
                .or_else(|| {
                    top.iter()
                        .filter(|&&(_, held)| held >= EVICT_BUSY_RATIO * (mine + 1))
                        .find_map(|(k, _)| by.get(k)?.iter().next().copied())
                })
        };
        let Some(slot) = victim.and_then(|id| self.remove(id)) else {
            return false;
        };
        slot.released.set(true);
        per.give(slot.ip);
        shared.stats.open.fetch_sub(1, Relaxed);
        shared.stats.evicted.fetch_add(1, Relaxed);
        slot.wake.notify_one();
        true
    }
}

/// A connection's place: counted open, and its address's share taken,
/// until dropped (or evicted).
struct Open {
    shared: Arc<Shared>,
    table: Rc<Table>,
    slot: Rc<Slot>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.table.remove(self.id);
        if !self.slot.released.replace(true) {
            self.shared.per_address.give(self.slot.ip);
            self.shared.stats.open.fetch_sub(1, Relaxed);
        }
    }
}

/// What one connection is served with.
struct Conn {
    shared: Arc<Shared>,
    builders: Rc<[auto::Builder<Local>; 2]>,
    acceptor: tokio_rustls::TlsAcceptor,
    phase: watch::Receiver<Phase>,
    id: u64,
}

/// Why the connection's watchdog woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// No (first) request head whole in time.
    Head,
    /// No request under way for the idle timeout.
    Idle,
    /// An HTTP/2 response chunk not taken in time.
    Piece,
    /// After GOAWAY with nothing under way, the time to close is up.
    Close,
}

/// What a connection's service, its bodies and its I/O share (all on
/// the listener's thread).
struct State {
    h2: bool,
    start: Instant,
    /// Responses under way (from the request's head to the end of its
    /// body).
    in_flight: Cell<usize>,
    /// Requests answered.
    served: Cell<u64>,
    /// Since when none has been under way.
    idle_since: Cell<Instant>,
    /// HTTP/1.1: since when a head has been arriving (a drain lets its
    /// request finish).
    head_begun: Cell<Option<Instant>>,
    /// A request was refused: the connection lingers when it ends.
    refused: Cell<bool>,
    /// A write waited past the send timeout (counted once).
    send_timed_out: Cell<bool>,
    /// Since when a write has been waiting for the socket with no
    /// progress (any bytes taken start it again).
    blocked: Cell<Option<Instant>>,
    /// The response chunks read and not yet written whole.
    held: Arc<Held>,
    next_body: Cell<u64>,
    /// Wakes the connection's watchdog when any of this changes.
    notify: Arc<Notify>,
}

/// A connection's response chunks read from handlers' bodies and not yet
/// written whole to TLS. Each chunk handed to hyper is a [`bytes::Bytes`]
/// whose owner ([`Chunk`]) gives its bytes back here when hyper or h2
/// drops the last of it (written, or the stream reset): `Send`, as
/// `Bytes::from_owner` asks, though only the listener's thread uses it.
struct Held {
    /// Bytes held now, at most [`CONN_BODY`].
    bytes: AtomicU64,
    /// By body: when its chunk was handed to hyper (one at a time).
    out: std::sync::Mutex<HashMap<u64, Instant>>,
    /// Bodies waiting for room or for their chunk to be written.
    waiting: std::sync::Mutex<Vec<std::task::Waker>>,
    stats: Arc<Stats>,
    notify: Arc<Notify>,
}

impl Held {
    fn out(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the oldest chunk out was handed to hyper.
    fn oldest(&self) -> Option<Instant> {
        self.out().values().min().copied()
    }

    /// Waits (registers `cx`) until a chunk is given back.
    fn wait(&self, cx: &Context<'_>) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|x| x.will_wake(cx.waker())) {
            w.push(cx.waker().clone());
        }
    }

    /// Body `id` hands `data` to hyper: counted until its last byte is
    /// dropped.
    fn hand(self: &Arc<Self>, id: u64, data: Bytes) -> Bytes {
        let n = data.len() as u64;
        if n == 0 {
            return data;
        }
        self.bytes.fetch_add(n, Relaxed);
        let now = self.stats.held.fetch_add(n, Relaxed) + n;
        self.stats.held_peak.fetch_max(now, Relaxed);
        self.out().insert(id, Instant::now());
        self.notify.notify_one();
        Bytes::from_owner(Chunk {
            data,
            held: self.clone(),
            id,
        })
    }
}

/// A response chunk as hyper holds it; gives its bytes back when dropped.
struct Chunk {
    data: Bytes,
    held: Arc<Held>,
    id: u64,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let h = &self.held;
        let n = self.data.len() as u64;
        h.bytes.fetch_sub(n, Relaxed);
        h.stats.held.fetch_sub(n, Relaxed);
        h.out().remove(&self.id);
        let waiting = std::mem::take(&mut *h.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        waiting.into_iter().for_each(std::task::Waker::wake);
        h.notify.notify_one();
    }
}

impl State {
    /// The next deadline, and what passes then.
    fn due(&self, cfg: &Config, closing: Option<Instant>) -> Option<(Instant, Due)> {
        let mut due = None;
        if self.in_flight.get() == 0 {
            due = Some(if self.served.get() == 0 {
                (self.start + cfg.request_timeout, Due::Head)
            } else if let Some(t) = self.head_begun.get() {
                (t + cfg.request_timeout, Due::Head)
            } else {
                (self.idle_since.get() + cfg.idle_timeout, Due::Idle)
            });
            if let Some(c) = closing {
                // What was sent before has the send timeout to go out.
                let since = c.max(self.idle_since.get());
                due = Some((since + cfg.send_timeout, Due::Close));
            }
        }
        if let Some(t) = self.held.oldest() {
            let piece = (t + cfg.send_timeout, Due::Piece);
            if due.is_none_or(|d| piece.0 < d.0) {
                due = Some(piece);
            }
        }
        due
    }

    /// Nothing under way, and (HTTP/1.1) no head arriving.
    fn idle(&self) -> bool {
        self.in_flight.get() == 0 && self.head_begun.get().is_none()
    }

    /// Idle with nothing left to write, or stalled: a chunk not written,
    /// a write waiting for the socket, or an HTTP/1.1 head arriving, for
    /// `after`.
    fn evictable(&self, now: Instant, after: Duration) -> bool {
        let long =
            |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) >= after);
        let oldest = self.held.oldest();
        (self.idle() && oldest.is_none() && self.blocked.get().is_none())
            || long(oldest)
            || long(self.blocked.get())
            || long(self.head_begun.get())
    }
}

impl Conn {
    /// One connection, from accept to close.
    async fn serve(mut self, tcp: tokio::net::TcpStream, open: Open) {
        let shared = self.shared.clone();
        let (stats, cfg) = (&shared.stats, &shared.cfg);
        let _ = tcp.set_nodelay(true);
        let start = Instant::now();
        // A second descriptor of the socket, to linger on it after hyper
        // has dropped the connection.
        let dup = tcp.as_fd().try_clone_to_owned().ok();
        let (Ok(remote), Ok(local)) = (tcp.peer_addr(), tcp.local_addr()) else {
            // Gone already.
            return;
        };
        let tls = tokio::select! {
            t = tokio::time::timeout(cfg.request_timeout, self.acceptor.accept(tcp)) => t,
            _ = self.phase.wait_for(|p| *p == Phase::Stop) => return,
            // Evicted during its handshake.
            _ = open.slot.wake.notified() => return,
        };
        let mut tls = match tls {
            Ok(Ok(tls)) => tls,
            Ok(Err(_)) => {
                stats.tls_failed.fetch_add(1, Relaxed);
                return;
            }
            Err(_) => {
                stats.request_timeouts.fetch_add(1, Relaxed);
                return;
            }
        };
        tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
        let (h2, server_name, alpn) = {
            let c = tls.get_ref().1;
            (
                c.alpn_protocol() == Some(b"h2"),
                c.server_name().map(str::to_string),
                c.alpn_protocol().map(<[u8]>::to_vec),
            )
        };
        let notify = Arc::new(Notify::new());
        let st = Rc::new(State {
            h2,
            start,
            in_flight: Cell::new(0),
            served: Cell::new(0),
            idle_since: Cell::new(start),
            head_begun: Cell::new(None),
            refused: Cell::new(false),
            send_timed_out: Cell::new(false),
            blocked: Cell::new(None),
            held: Arc::new(Held {
                bytes: AtomicU64::new(0),
                out: Default::default(),
                waiting: Default::default(),
                stats: shared.stats.clone(),
                notify: notify.clone(),
            }),
            next_body: Cell::new(0),
            notify,
        });
        *open.slot.state.borrow_mut() = Some(st.clone());
        let svc = Service {
            handler: (cfg.make)(self.id as usize),
            info: ConnInfo {
                remote,
                local,
                server_name,
                alpn,
                worker: self.id as usize,
                bidi_streams: if h2 { H2_MAX_STREAMS } else { 1 },
            },
            st: st.clone(),
            shared: shared.clone(),
            draining: self.phase.clone(),
        };
        let io = Io {
            inner: tls,
            st: st.clone(),
            shared: shared.clone(),
            behind: None,
        };
        let conn = self.builders[usize::from(h2)]
            .serve_connection(TokioIo::new(io), svc)
            .into_owned();
        // Boxed, so that it can be dropped (with its bodies) before the
        // connection lingers.
        let mut conn = Box::pin(conn);
        // When hyper's graceful shutdown began (HTTP/2: GOAWAY; HTTP/1.1:
        // no keep-alive after the response under way).
        let mut closing: Option<Instant> = None;
        let goaway = |conn: Pin<&mut _>, closing: &mut Option<Instant>| {
            if closing.is_none() {
                auto::Connection::graceful_shutdown(conn);
                *closing = Some(Instant::now());
            }
        };
        let mut drain_seen = false;
        let result = loop {
            let phase = *self.phase.borrow();
            if phase == Phase::Stop {
                break None;
            }
            if phase == Phase::Drain && !std::mem::replace(&mut drain_seen, true) {
                if h2 || st.in_flight.get() > 0 {
                    goaway(conn.as_mut(), &mut closing);
                } else if st.idle() {
                    break None;
                }
                // An HTTP/1.1 head under way: its answer says
                // `connection: close` (hyper's shutdown would drop it).
            }
            if h2 && st.served.get() >= MAX_REQUESTS {
                goaway(conn.as_mut(), &mut closing);
            }
            let due = st.due(cfg, closing);
            let sleep = async {
                match due {
                    Some((t, _)) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = conn.as_mut() => break Some(r),
                _ = sleep => {
                    let Some((_, why)) = st.due(cfg, closing) else { continue };
                    if st.due(cfg, closing).is_some_and(|(t, _)| t > Instant::now()) {
                        continue;
                    }
                    match why {
                        Due::Head => {
                            stats.request_timeouts.fetch_add(1, Relaxed);
                            break None;
                        }
                        Due::Idle if h2 => {
                            stats.idle_closed.fetch_add(1, Relaxed);
                            goaway(conn.as_mut(), &mut closing);
                        }
                        Due::Idle => {
                            stats.idle_closed.fetch_add(1, Relaxed);
                            break None;
                        }
                        // The bodies cut count it.
                        Due::Piece | Due::Close => break None,
                    }
                }
                c = self.phase.changed() => if c.is_err() { break None },
                _ = st.notify.notified() => {}
                // Evicted for a newcomer: its place is given back already.
                _ = open.slot.wake.notified() => if open.slot.released.get() { break None },
            }
        };
        drop(conn);
        let mut linger = st.refused.get();
        if let Some(Err(e)) = result {
            match e.downcast_ref::<hyper::Error>() {
                Some(e) if e.is_timeout() => {
                    stats.request_timeouts.fetch_add(1, Relaxed);
                }
                Some(e) if e.is_parse() || e.is_parse_too_large() => {
                    // hyper answered it (400, 431) itself.
                    stats.bad_requests.fetch_add(1, Relaxed);
                    stats.responses[3].fetch_add(1, Relaxed);
                    linger = true;
                }
                // h2 closed it itself with GOAWAY: rapid reset, floods,
                // malformed frames.
                _ if h2_goaway(&*e) => {
                    stats.protocol_closed.fetch_add(1, Relaxed);
                }
                _ => {}
            }
        }
        // An evicted connection's place is someone else's already: it
        // closes at once, without lingering.
        if linger && *self.phase.borrow() != Phase::Stop && !open.slot.released.get() {
            if let Some(fd) = dup {
                tokio::select! {
                    () = lingering(std::net::TcpStream::from(fd)) => {}
                    _ = open.slot.wake.notified() => {}
                }
            }
        }
        drop(open);
    }
}

/// True when h2 ended the connection with a GOAWAY of its own for the
/// client's error (not the client's GOAWAY, nor its socket's end).
fn h2_goaway(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_library();
        }
        next = e.source();
    }
    false
}

/// Closes the sending side and reads what the client still sends, for
/// at most [`LINGER`] and [`LINGER_BYTES`]: closing with unread bytes
/// would reset the connection, and the client might lose the answer.
async fn lingering(tcp: std::net::TcpStream) {
    if tcp.shutdown(Shutdown::Write).is_err() || tcp.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(mut tcp) = tokio::net::TcpStream::from_std(tcp) else {
        return;
    };
    let _ = tokio::time::timeout(LINGER, async {
        let mut scratch = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match tcp.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Answers a connection's requests with its [`Handler`].
struct Service {
    handler: Rc<dyn Handler>,
    info: ConnInfo,
    st: Rc<State>,
    shared: Arc<Shared>,
    draining: watch::Receiver<Phase>,
}

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<ReplyBody>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<ReplyBody>, std::convert::Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(self.answer(req)))
    }
}

impl Service {
    fn answer(&self, req: Request<Incoming>) -> Response<ReplyBody> {
        let (st, stats) = (&self.st, &self.shared.stats);
        let served = st.served.get() + 1;
        st.served.set(served);
        st.head_begun.set(None);
        st.in_flight.set(st.in_flight.get() + 1);
        st.notify.notify_one();
        let close = !st.h2
            && (served >= MAX_REQUESTS
                || *self.draining.borrow() != Phase::Run
                || asks_to_close(&req));
        if let Some(status) = refusal(&req, st.h2) {
            stats.bad_requests.fetch_add(1, Relaxed);
            if !st.h2 {
                st.refused.set(true);
            }
            let mut head = Response::new(());
            *head.status_mut() = status;
            head.headers_mut()
                .insert(http::header::CONTENT_LENGTH, HeaderValue::from(0u64));
            return self.respond(head, None, !st.h2);
        }
        stats.requests.fetch_add(1, Relaxed);
        let (parts, _body) = req.into_parts();
        let mut req = Request::from_parts(parts, ());
        req.extensions_mut().insert(self.info.clone());
        let reply = {
            // Files it opens count against its address's descriptors.
            let _peer = crate::files::Peer::set(self.info.remote.ip());
            self.handler.handle(&req, Instant::now())
        };
        let body = if req.method() == Method::HEAD {
            None
        } else {
            reply.body
        };
        self.respond(reply.head, body, close)
    }

    /// The response: `head`'s status and fields, `alt-svc`, and
    /// `connection: close` when the connection ends after it.
    fn respond(
        &self,
        head: Response<()>,
        body: Option<Box<dyn crate::h3::Body>>,
        close: bool,
    ) -> Response<ReplyBody> {
        let (mut parts, ()) = head.into_parts();
        if let Some(i) = crate::stats::status_class(parts.status.as_u16()) {
            self.shared.stats.responses[i].fetch_add(1, Relaxed);
        }
        let left = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        parts.headers.remove(http::header::CONNECTION);
        parts
            .headers
            .insert(http::header::ALT_SVC, self.shared.alt_svc.clone());
        if close {
            parts
                .headers
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        let id = self.st.next_body.get();
        self.st.next_body.set(id + 1);
        let body = ReplyBody {
            ended: body.is_none() || left == Some(0),
            body,
            wait: None,
            left,
            st: self.st.clone(),
            shared: self.shared.clone(),
            ip: self.info.remote.ip(),
            id,
        };
        Response::from_parts(parts, body)
    }
}

/// True when an HTTP/1.1 request's `Connection` field says `close`.
fn asks_to_close(req: &Request<Incoming>) -> bool {
    req.headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// Why a request whose head hyper took is refused here, if it is: a
/// target not in origin-form, HTTP/1.1 without exactly one `Host` (400),
/// a body (413), `Transfer-Encoding` (501).
fn refusal(req: &Request<Incoming>, h2: bool) -> Option<StatusCode> {
    let h = req.headers();
    if !h2 {
        let uri = req.uri();
        if uri.scheme().is_some() || uri.authority().is_some() || !uri.path().starts_with('/') {
            return Some(StatusCode::BAD_REQUEST);
        }
        if req.version() == Version::HTTP_11 && h.get_all(http::header::HOST).iter().count() != 1 {
            return Some(StatusCode::BAD_REQUEST);
        }
    }
    if h.contains_key(http::header::TRANSFER_ENCODING) {
        return Some(StatusCode::NOT_IMPLEMENTED);
    }
    let length = h
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .any(|v| v.as_bytes().iter().any(|&b| b != b'0'));
    if length || req.body().size_hint().lower() > 0 {
        return Some(StatusCode::PAYLOAD_TOO_LARGE);
    }
    None
}

/// A [`Handler`]'s body as an [`http_body::Body`]: each chunk of at most
/// [`crate::h3::CHUNK`] bytes pulled when hyper asks for it, a
/// [`Next::Wait`] slept on the runtime's timer. While it lives its
/// request counts as under way.
pub struct ReplyBody {
    body: Option<Box<dyn crate::h3::Body>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// What the `content-length` still promises.
    left: Option<u64>,
    /// It was sent whole (or had nothing to send).
    ended: bool,
    st: Rc<State>,
    shared: Arc<Shared>,
    ip: IpAddr,
    id: u64,
}

impl std::fmt::Debug for ReplyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyBody")
            .field("left", &self.left)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(w) = this.wait.as_mut() {
                ready!(w.as_mut().poll(cx));
                this.wait = None;
            }
            let Some(b) = this.body.as_mut() else {
                this.ended = true;
                return Poll::Ready(None);
            };
            // One chunk out per response, and the connection's room:
            // what a client that takes nothing makes it hold is bounded.
            let held = &this.st.held;
            let room = CONN_BODY.saturating_sub(held.bytes.load(Relaxed) as usize);
            if room == 0 || held.out().contains_key(&this.id) {
                held.wait(cx);
                return Poll::Pending;
            }
            let next = {
                let _peer = crate::files::Peer::set(this.ip);
                b.next(Instant::now(), TCP_CHUNK.min(room))
            };
            match next {
                Ok(Next::Data(d)) => {
                    if let Some(left) = this.left.as_mut() {
                        *left = left.saturating_sub(d.len() as u64);
                        this.ended |= *left == 0;
                    }
                    let d = held.hand(this.id, d);
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Ok(Next::Wait(t)) => this.wait = Some(Box::pin(tokio::time::sleep_until(t.into()))),
                Ok(Next::End) => {
                    this.body = None;
                    this.ended = true;
                    return Poll::Ready(None);
                }
                Err(e) => {
                    this.shared.stats.body_errors.fetch_add(1, Relaxed);
                    this.body = None;
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

impl Drop for ReplyBody {
    fn drop(&mut self) {
        let st = &self.st;
        let n = st.in_flight.get().saturating_sub(1);
        st.in_flight.set(n);
        if n == 0 {
            st.idle_since.set(Instant::now());
        }
        st.notify.notify_one();
        if !self.ended {
            self.shared.stats.send_failed.fetch_add(1, Relaxed);
        }
    }
}

/// The TLS stream as hyper sees it: response bytes counted, the first
/// byte of a next HTTP/1.1 head noted, and writes bounded in time. Once a
/// write has had to wait, the client must take [`crate::h3::CHUNK`]
/// bytes within [`Config::send_timeout`] (and again for each chunk), or
/// the write fails with `TimedOut` and the connection closes: a few
/// bytes now and then, as a socket buffer takes them, are not progress.
struct Io<S> {
    inner: S,
    st: Rc<State>,
    shared: Arc<Shared>,
    /// Since a write had to wait: its deadline, and the bytes taken since.
    behind: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
}

impl<S> Io<S> {
    /// `r`, what a write (`moved` bytes taken) or a flush gave, or
    /// `TimedOut` when the client has been behind for the send timeout.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
        moved: usize,
    ) -> Poll<io::Result<T>> {
        match &r {
            Poll::Ready(Err(_)) => return r,
            Poll::Pending => {
                let limit = self.shared.cfg.send_timeout;
                if self.behind.is_none() {
                    self.st.blocked.set(Some(Instant::now()));
                }
                self.behind
                    .get_or_insert_with(|| (Box::pin(tokio::time::sleep(limit)), 0));
            }
            Poll::Ready(Ok(_)) => {
                self.shared
                    .stats
                    .bytes_sent
                    .fetch_add(moved as u64, Relaxed);
                if let Some((_, taken)) = &mut self.behind {
                    *taken += moved;
                    // Progress: the stall clock of eviction starts again
                    // (a slow reader is not a stalled one).
                    if moved > 0 && self.st.blocked.get().is_some() {
                        self.st.blocked.set(Some(Instant::now()));
                    }
                    if *taken >= crate::h3::CHUNK {
                        self.behind = None;
                        self.st.blocked.set(None);
                    }
                }
            }
        }
        let Some((deadline, _)) = &mut self.behind else {
            return r;
        };
        if deadline.as_mut().poll(cx).is_pending() {
            return r;
        }
        if !self.st.send_timed_out.replace(true) && self.st.in_flight.get() == 0 {
            // No body is cut to count it: the end of a response was.
            self.shared.stats.send_failed.fetch_add(1, Relaxed);
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client did not take the response within the send timeout",
        )))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Io<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let st = &this.st;
        if buf.filled().len() > before && !st.h2 && st.idle() {
            st.head_begun.set(Some(Instant::now()));
            st.notify.notify_one();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Io<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        let moved = match &r {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        this.check(cx, r, moved)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        let moved = match &r {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        this.check(cx, r, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            // All of it is with the kernel: no one is behind.
            Poll::Ready(Ok(())) => {
                this.behind = None;
                this.st.blocked.set(None);
                Poll::Ready(Ok(()))
            }
            r => this.check(cx, r, 0),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, r, 0)
    }
}
