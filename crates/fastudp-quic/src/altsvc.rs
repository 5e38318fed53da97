//! HTTP/3 discovery over TCP: a TLS-over-TCP listener on the QUIC port
//! number that answers HTTP/1.1 with the same content as the HTTP/3
//! application and the header `Alt-Svc: h3=":PORT"; ma=86400`, so that a
//! browser that starts over TCP (as every browser does for an origin it
//! has not seen) moves to HTTP/3.
//!
//! # Why here
//!
//! It lives in the engine crate, beside [`crate::h3`], because it answers
//! with the same [`Handler`] (`/bytes/N`, `/video/...`, static files
//! through [`crate::files::Root`], which opens them with `openat2(2)`),
//! so any embedder that serves HTTP/3 gets discovery for its own handler,
//! and both transports serve the same bytes. It needs nothing of the
//! command: std threads, blocking sockets with kernel timeouts, and
//! rustls, which the crate already depends on. It shares no state with
//! the QUIC workers: its threads are its own.
//!
//! # Shape and bounds
//!
//! One thread accepts; each connection gets a thread of its own, at most
//! [`Config::max_connections`] at once, and [`Config::per_ip`] from one
//! client address (more are closed at once and counted in
//! [`Stats::refused`]). Every way a client can hold a
//! connection is bounded:
//!
//! | What | Bound | When it is passed |
//! |---|---|---|
//! | TLS handshake plus the first request head | [`Config::request_timeout`] from accept | closed, [`Stats::request_timeouts`] |
//! | A later request head | [`Config::request_timeout`] from its first byte | closed, [`Stats::request_timeouts`] |
//! | Idle between requests (keep-alive) | [`Config::idle_timeout`] | closed, [`Stats::idle_closed`] |
//! | Request head size | [`MAX_HEAD`] bytes | 431, closed, [`Stats::bad_requests`] |
//! | Header fields | [`MAX_FIELDS`] | 431, closed, [`Stats::bad_requests`] |
//! | Request body | none accepted (`Content-Length` above 0, any `Transfer-Encoding`) | 413 or 501, closed, [`Stats::bad_requests`] |
//! | A response piece (head, a body chunk of [`crate::h3::CHUNK`]) the client does not take | [`Config::send_timeout`] | closed, [`Stats::send_failed`] |
//! | Requests per connection | [`MAX_REQUESTS`] | the last answer says `connection: close` |
//! | Reading on after a refusal (so the answer is not lost to a reset) | [`LINGER`], [`LINGER_BYTES`] | closed |
//!
//! [`Listener::drain`] stops accepting (a new connection is refused by
//! the kernel), closes the connections that wait for a next request, and
//! lets those with a request under way finish it: its answer says
//! `connection: close`, and the connection closes after it.
//!
//! The HTTP/1.1 parser ([`parse_head`]) is strict: CRLF line ends only,
//! origin-form targets (`/path?query`) only, exactly one `Host` field
//! for HTTP/1.1, no whitespace before a field's colon, no obsolete line
//! folding; anything else is 400 and the connection closes.
//!
//! [`Handler`]: crate::h3::Handler

use crate::app::ConnInfo;
use crate::h3::{Handler, MakeHandler, Next};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest request head (request line and header fields) accepted,
/// in bytes: 16 KiB.
pub const MAX_HEAD: usize = 16 * 1024;

/// The most header fields a request may carry.
pub const MAX_FIELDS: usize = 64;

/// The most requests one connection may make; the last answer closes it.
pub const MAX_REQUESTS: u64 = 1000;

/// The default of [`Config::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

/// The default of [`Config::send_timeout`]: 10 s.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The default of [`Config::idle_timeout`]: 10 s.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an `Alt-Svc` advertisement lasts, in seconds (`ma=`).
pub const MAX_AGE: u32 = 86_400;

/// The ALPN protocol of the listener.
pub const ALPN: &[u8] = b"http/1.1";

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
        }
    }

    /// The bound on connections from one address in force:
    /// [`Config::max_connections_per_ip`] or its default.
    pub fn per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or((self.max_connections / 4).max(1))
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
        }
    }
}

/// State the accept thread and the connection threads share.
struct Shared {
    cfg: Config,
    tls: Arc<rustls::ServerConfig>,
    alt_svc: HeaderValue,
    stats: Arc<Stats>,
    /// Connections open per client address.
    per_address: crate::limits::PerAddress,
    stop: AtomicBool,
    /// Set by [`Listener::drain`].
    draining: AtomicBool,
    /// The open connections' sockets, to shut them down at stop, and
    /// whether each waits for a next request (a drain closes those).
    conns: Mutex<HashMap<u64, (TcpStream, Arc<AtomicBool>)>>,
}

/// A running listener. [`Listener::stop`] ends it; dropping it does too.
pub struct Listener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    socket: TcpListener,
    accept: Option<JoinHandle<()>>,
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
        tls.alpn_protocols = vec![ALPN.to_vec()];
        tls.max_early_data_size = 0;
        let alt_svc = HeaderValue::from_str(&format!("h3=\":{}\"; ma={MAX_AGE}", cfg.h3_port))
            .map_err(io::Error::other)?;
        let socket = TcpListener::bind(cfg.addr)?;
        let addr = socket.local_addr()?;
        let per_address = crate::limits::PerAddress::new(cfg.per_ip());
        let shared = Arc::new(Shared {
            cfg,
            tls: Arc::new(tls),
            alt_svc,
            stats: Arc::new(Stats::default()),
            per_address,
            stop: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
        });
        let (l, s) = (socket.try_clone()?, shared.clone());
        let accept = std::thread::Builder::new()
            .name("altsvc-accept".into())
            .spawn(move || accept_loop(l, s))?;
        Ok(Listener {
            addr,
            shared,
            socket,
            accept: Some(accept),
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
    /// request under way is answered with `connection: close`, the
    /// connection closed after it. [`Listener::open`] falls to 0 as they
    /// end; [`Listener::stop`] ends the rest.
    pub fn drain(&self) {
        self.shared.draining.store(true, SeqCst);
        let _ = socket2::SockRef::from(&self.socket).shutdown(Shutdown::Both);
        if let Ok(conns) = self.shared.conns.lock() {
            for (s, idle) in conns.values() {
                if idle.load(SeqCst) {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
    }

    /// Stops accepting, shuts down every open connection, and waits up to
    /// `wait` for their threads to end.
    pub fn stop(mut self, wait: Duration) {
        self.shutdown(wait);
    }

    fn shutdown(&mut self, wait: Duration) {
        self.shared.stop.store(true, SeqCst);
        // On Linux, shutting a listening socket down wakes a blocked
        // accept(2) with EINVAL.
        let _ = socket2::SockRef::from(&self.socket).shutdown(Shutdown::Both);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        if let Ok(conns) = self.shared.conns.lock() {
            for (s, _) in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        let end = Instant::now() + wait;
        while self.shared.stats.open.load(Relaxed) > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.shutdown(Duration::ZERO);
        }
    }
}

fn accept_loop(l: TcpListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    loop {
        let accepted = l.accept();
        if shared.stop.load(SeqCst) || shared.draining.load(SeqCst) {
            return;
        }
        let (tcp, ip) = match accepted {
            Ok((tcp, peer)) => (tcp, peer.ip()),
            // EMFILE and the like: wait a little rather than spin.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let stats = &shared.stats;
        if stats.open.load(Relaxed) >= shared.cfg.max_connections as u64
            || !shared.per_address.take(ip)
        {
            stats.refused.fetch_add(1, Relaxed);
            continue;
        }
        let Ok(clone) = tcp.try_clone() else {
            shared.per_address.give(ip);
            stats.refused.fetch_add(1, Relaxed);
            continue;
        };
        let id = next_id;
        next_id += 1;
        stats.open.fetch_add(1, Relaxed);
        let idle = Arc::new(AtomicBool::new(false));
        if let Ok(mut conns) = shared.conns.lock() {
            conns.insert(id, (clone, idle.clone()));
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("altsvc-conn".into())
            .spawn(move || {
                // Files it opens count against its address's descriptors.
                let _peer = crate::files::Peer::set(ip);
                s.stats.accepted.fetch_add(1, Relaxed);
                serve(tcp, &s, id, &idle);
                if let Ok(mut conns) = s.conns.lock() {
                    conns.remove(&id);
                }
                s.per_address.give(ip);
                s.stats.open.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            if let Ok(mut conns) = shared.conns.lock() {
                conns.remove(&id);
            }
            shared.per_address.give(ip);
            stats.open.fetch_sub(1, Relaxed);
            stats.refused.fetch_add(1, Relaxed);
        }
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, Sock>;

/// A connection's TCP socket, with the deadline every read must meet.
///
/// rustls reads a TLS record, and a handshake flight, in as many reads as
/// it takes. A receive timeout set once before a rustls call would bound
/// each of those reads, not their sum: a client that trickles the bytes
/// of one record (up to 16 KiB), or of its ClientHello, a byte at a time
/// would renew it with each byte. Here each read sets the kernel's
/// receive timeout to the time left before [`Sock::deadline`] and fails
/// with [`io::ErrorKind::TimedOut`] once none is.
///
/// Its writes pass `MSG_NOSIGNAL`: rustls writes with `write_vectored`,
/// which `std` makes a `writev(2)`, and a `writev` to a connection the
/// client has reset raises SIGPIPE, which ends a process that has not
/// ignored it (as `fastudp` does not, so that a closed pipe ends it).
///
/// Writes have a deadline too, `write_deadline`, armed ([`Sock::arm`])
/// before each piece the server hands to rustls (the head, each body
/// chunk of at most [`crate::h3::CHUNK`] bytes, a flush): the kernel's
/// send timeout counts from each `send(2)` and any progress ends it, so
/// a client that takes a few bytes now and then would hold the
/// connection for ever. Once the deadline passes the socket is stalled
/// and every later write fails at once (rustls' `Write` swallows the
/// error of its own flush and would wait again).
struct Sock {
    tcp: TcpStream,
    deadline: Instant,
    write_deadline: Instant,
    send_timeout: Duration,
    stalled: bool,
}

impl Sock {
    /// Gives the next writes [`Config::send_timeout`] from now.
    fn arm(&mut self) {
        self.write_deadline = Instant::now() + self.send_timeout;
    }

    fn send(
        &mut self,
        f: impl FnOnce(&socket2::SockRef<'_>) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let left = self
            .write_deadline
            .saturating_duration_since(Instant::now());
        if self.stalled || left.is_zero() {
            self.stalled = true;
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not take the response within the send timeout",
            ));
        }
        self.tcp.set_write_timeout(Some(left))?;
        let r = f(&socket2::SockRef::from(&self.tcp));
        if r.as_ref().is_err_and(timed_out) {
            self.stalled = true;
        }
        r
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !until(&self.tcp, self.deadline) {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.tcp.read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send(|t| t.send_with_flags(buf, libc::MSG_NOSIGNAL))
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.send(|t| t.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// Why a connection ended before its time.
enum End {
    /// The client closed or reset it, or the server is stopping.
    Closed,
    /// A deadline passed while reading.
    Timeout,
    /// The TLS layer failed.
    Tls,
}

/// Sets the socket's receive timeout to what is left until `deadline`;
/// `false` when nothing is.
fn until(tcp: &TcpStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    // A zero timeout would mean "none" to the kernel.
    !left.is_zero() && tcp.set_read_timeout(Some(left)).is_ok()
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// One connection, from accept to close. `idle` is set while it waits
/// for a next request.
fn serve(tcp: TcpStream, shared: &Shared, id: u64, idle: &AtomicBool) {
    let stats = &shared.stats;
    let cfg = &shared.cfg;
    let _ = tcp.set_nodelay(true);
    let Ok(conn) = rustls::ServerConnection::new(shared.tls.clone()) else {
        stats.tls_failed.fetch_add(1, Relaxed);
        return;
    };
    let first = Instant::now() + cfg.request_timeout;
    let sock = Sock {
        tcp,
        deadline: first,
        write_deadline: first,
        send_timeout: cfg.send_timeout,
        stalled: false,
    };
    let mut s = rustls::StreamOwned::new(conn, sock);
    match handshake(&mut s, first) {
        Ok(()) => {}
        Err(End::Timeout) => {
            stats.request_timeouts.fetch_add(1, Relaxed);
            return;
        }
        Err(_) => {
            stats.tls_failed.fetch_add(1, Relaxed);
            return;
        }
    }
    let handler = (cfg.make)(id as usize);
    // What each request carries to the handler.
    let (Ok(remote), Ok(local)) = (s.sock.tcp.peer_addr(), s.sock.tcp.local_addr()) else {
        // Gone already.
        return;
    };
    let info = Rc::new(ConnInfo {
        remote,
        local,
        server_name: s.conn.server_name().map(str::to_string),
        alpn: s.conn.alpn_protocol().map(<[u8]>::to_vec),
        worker: id as usize,
        // HTTP/1.1: one request at a time.
        bidi_streams: 1,
    });
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut served = 0u64;
    loop {
        if shared.stop.load(SeqCst) {
            return;
        }
        let head_deadline = if served == 0 { Some(first) } else { None };
        if served > 0 && buf.is_empty() {
            // Waiting for a next request: a drain closes it now, or
            // finds it idle and shuts it.
            idle.store(true, SeqCst);
            if shared.draining.load(SeqCst) {
                return;
            }
        }
        let read = read_head(&mut s, &mut buf, head_deadline, cfg, idle);
        idle.store(false, SeqCst);
        let end = match read {
            Ok(end) => end,
            Err(Some(End::Timeout)) if served > 0 && buf.is_empty() => {
                stats.idle_closed.fetch_add(1, Relaxed);
                return;
            }
            Err(Some(End::Timeout)) => {
                stats.request_timeouts.fetch_add(1, Relaxed);
                return;
            }
            Err(Some(End::Tls)) if served == 0 => {
                stats.tls_failed.fetch_add(1, Relaxed);
                return;
            }
            Err(Some(_)) => return,
            Err(None) => {
                // The head is larger than MAX_HEAD.
                stats.bad_requests.fetch_add(1, Relaxed);
                let _ = refuse(&mut s, 431, shared);
                return;
            }
        };
        let parsed = parse_head(&buf[..end]);
        buf.drain(..end);
        let mut req = match parsed {
            Ok(r) => r,
            Err(e) => {
                stats.bad_requests.fetch_add(1, Relaxed);
                let _ = refuse(&mut s, e.status(), shared);
                return;
            }
        };
        served += 1;
        let close = req.close || served >= MAX_REQUESTS || shared.draining.load(SeqCst);
        stats.requests.fetch_add(1, Relaxed);
        req.request.extensions_mut().insert(ConnInfo::clone(&info));
        match respond(&mut s, &*handler, &req.request, close, shared) {
            Ok(true) if !close => {}
            _ => {
                s.conn.send_close_notify();
                s.sock.arm();
                let _ = s.flush();
                return;
            }
        }
    }
}

fn handshake(s: &mut Tls, deadline: Instant) -> Result<(), End> {
    s.sock.deadline = deadline;
    s.sock.write_deadline = deadline;
    while s.conn.is_handshaking() {
        match s.conn.complete_io(&mut s.sock) {
            Ok((0, 0)) => return Err(End::Closed),
            Ok(_) => {}
            Err(e) if timed_out(&e) => return Err(End::Timeout),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(End::Tls),
            Err(_) => return Err(End::Closed),
        }
    }
    Ok(())
}

/// Reads until `buf` holds a whole request head; its length with the
/// blank line. `Err(None)`: the head is over [`MAX_HEAD`]. Without a
/// `deadline`, the connection may idle [`Config::idle_timeout`] for the
/// first byte, and then has [`Config::request_timeout`] for the rest.
fn read_head(
    s: &mut Tls,
    buf: &mut Vec<u8>,
    mut deadline: Option<Instant>,
    cfg: &Config,
    idle: &AtomicBool,
) -> Result<usize, Option<End>> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = find_end(buf) {
            return Ok(i);
        }
        if buf.len() >= MAX_HEAD {
            return Err(None);
        }
        if deadline.is_none() && !buf.is_empty() {
            deadline = Some(Instant::now() + cfg.request_timeout);
        }
        s.sock.deadline = deadline.unwrap_or_else(|| Instant::now() + cfg.idle_timeout);
        // What rustls may still send while reading (a KeyUpdate's answer).
        s.sock.arm();
        let want = (MAX_HEAD - buf.len()).min(chunk.len());
        match s.read(&mut chunk[..want]) {
            Ok(0) => return Err(Some(End::Closed)),
            Ok(n) => {
                // A request has begun: a drain lets it finish.
                idle.store(false, SeqCst);
                buf.extend_from_slice(&chunk[..n]);
                if deadline.is_none() {
                    deadline = Some(Instant::now() + cfg.request_timeout);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if timed_out(&e) => return Err(Some(End::Timeout)),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(Some(End::Tls)),
            Err(_) => return Err(Some(End::Closed)),
        }
    }
}

/// The length of the head in `buf` up to and with its blank line.
fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Answers `req`; `Ok(true)` when the response went out whole and the
/// connection may carry another request.
fn respond(
    s: &mut Tls,
    handler: &dyn Handler,
    req: &Request<()>,
    close: bool,
    shared: &Shared,
) -> io::Result<bool> {
    let stats = &shared.stats;
    let now = Instant::now();
    let reply = handler.handle(req, now);
    let head_only = req.method() == Method::HEAD;
    let mut body = if head_only { None } else { reply.body };
    // Without a length, the end of the body is the end of the connection.
    let length_known = reply
        .head
        .headers()
        .contains_key(http::header::CONTENT_LENGTH);
    let close = close || (body.is_some() && !length_known);
    let mut head = Vec::with_capacity(256);
    let status = reply.head.status();
    count_status(stats, status.as_u16());
    head.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        )
        .as_bytes(),
    );
    write_fields(&mut head, reply.head.headers(), &shared.alt_svc, close);
    let mut sent = head.len() as u64;
    let r = (|| -> io::Result<bool> {
        s.sock.arm();
        s.write_all(&head)?;
        if let Some(b) = body.as_mut() {
            loop {
                if shared.stop.load(SeqCst) {
                    return Ok(false);
                }
                match b.next(Instant::now(), crate::h3::CHUNK) {
                    Ok(Next::Data(d)) => {
                        s.sock.arm();
                        s.write_all(&d)?;
                        sent += d.len() as u64;
                    }
                    Ok(Next::Wait(t)) => {
                        s.sock.arm();
                        s.flush()?;
                        std::thread::sleep(t.saturating_duration_since(Instant::now()));
                    }
                    Ok(Next::End) => break,
                    Err(_) => {
                        stats.body_errors.fetch_add(1, Relaxed);
                        let _ = s.flush();
                        return Ok(false);
                    }
                }
            }
        }
        s.sock.arm();
        s.flush()?;
        Ok(true)
    })();
    stats.bytes_sent.fetch_add(sent, Relaxed);
    match r {
        Ok(whole) => Ok(whole && !close),
        Err(e) => {
            stats.send_failed.fetch_add(1, Relaxed);
            Err(e)
        }
    }
}

/// Counts a response begun with `status`, by its class.
fn count_status(stats: &Stats, status: u16) {
    if let Some(i) = crate::stats::status_class(status) {
        stats.responses[i].fetch_add(1, Relaxed);
    }
}

/// Writes the response's header fields, `alt-svc`, `connection: close`
/// when the connection ends after it, and the blank line.
fn write_fields(out: &mut Vec<u8>, fields: &HeaderMap, alt_svc: &HeaderValue, close: bool) {
    for (name, value) in fields {
        if name == http::header::CONNECTION || name == http::header::ALT_SVC {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"alt-svc: ");
    out.extend_from_slice(alt_svc.as_bytes());
    out.extend_from_slice(b"\r\n");
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// An error answer (the connection closes after it).
fn refuse(s: &mut Tls, code: u16, shared: &Shared) -> io::Result<()> {
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|c| c.canonical_reason())
        .unwrap_or("");
    count_status(&shared.stats, code);
    let mut out = format!("HTTP/1.1 {code} {reason}\r\ncontent-length: 0\r\n").into_bytes();
    write_fields(&mut out, &HeaderMap::new(), &shared.alt_svc, true);
    s.sock.arm();
    s.write_all(&out)?;
    shared.stats.bytes_sent.fetch_add(out.len() as u64, Relaxed);
    s.conn.send_close_notify();
    s.sock.arm();
    s.flush()?;
    linger(&s.sock.tcp);
    Ok(())
}

/// Closes the sending side and reads what the client still sends, for
/// at most [`LINGER`] and [`LINGER_BYTES`]: closing with unread bytes
/// would reset the connection, and the client might lose the answer.
fn linger(tcp: &TcpStream) {
    if tcp.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let end = Instant::now() + LINGER;
    let mut scratch = [0u8; 4096];
    let mut left = LINGER_BYTES;
    let mut r = tcp;
    while left > 0 && until(tcp, end) {
        match r.read(&mut scratch) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// How long a refused request's connection reads on after the answer.
pub const LINGER: Duration = Duration::from_secs(1);

/// How many bytes it reads at most meanwhile (64 KiB).
pub const LINGER_BYTES: usize = 64 * 1024;

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    /// Method, target (origin-form) and header fields.
    pub request: Request<()>,
    /// True when the connection ends after the answer: HTTP/1.0, or a
    /// `Connection: close` field.
    pub close: bool,
}

/// Why [`parse_head`] refused a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadError {
    /// A malformed request line or header field, a target not in
    /// origin-form, a missing or repeated `Host` (400).
    Malformed(&'static str),
    /// A version other than HTTP/1.0 or HTTP/1.1 (505).
    Version,
    /// A request with a body (413).
    Body,
    /// `Transfer-Encoding` (501).
    TransferEncoding,
    /// More than [`MAX_FIELDS`] header fields (431).
    TooManyFields,
}

impl HeadError {
    /// The status the client is answered with.
    pub fn status(self) -> u16 {
        match self {
            HeadError::Malformed(_) => 400,
            HeadError::Version => 505,
            HeadError::Body => 413,
            HeadError::TransferEncoding => 501,
            HeadError::TooManyFields => 431,
        }
    }
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::Malformed(what) => write!(f, "malformed request: {what}"),
            HeadError::Version => f.write_str("HTTP version not supported"),
            HeadError::Body => f.write_str("a request body is not accepted"),
            HeadError::TransferEncoding => f.write_str("Transfer-Encoding is not accepted"),
            HeadError::TooManyFields => write!(f, "more than {MAX_FIELDS} header fields"),
        }
    }
}

impl std::error::Error for HeadError {}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses one HTTP/1.1 request head: the bytes up to and with the blank
/// line (`\r\n\r\n`), as RFC 9112 describes it, strictly (see the
/// module's documentation).
pub fn parse_head(head: &[u8]) -> Result<Head, HeadError> {
    use HeadError::Malformed;
    if !head.ends_with(b"\r\n\r\n") {
        return Err(Malformed("no blank line"));
    }
    // Without the blank line's "\n\r\n": every line then ends with "\r".
    let head = &head[..head.len() - 3];
    let mut lines = head.split(|&b| b == b'\n');
    let line = lines.next().ok_or(Malformed("no request line"))?;
    let line = line
        .strip_suffix(b"\r")
        .ok_or(Malformed("a line not ended by CRLF"))?;
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Malformed(
            "the request line is not METHOD SP TARGET SP VERSION",
        ));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(Malformed("the method"));
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        v if v.starts_with(b"HTTP/") => return Err(HeadError::Version),
        _ => return Err(Malformed("the version")),
    };
    if target.first() != Some(&b'/') || !target.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err(Malformed("the target is not in origin-form"));
    }
    let uri = Uri::try_from(target).map_err(|_| Malformed("the target"))?;
    let method = Method::from_bytes(method).map_err(|_| Malformed("the method"))?;
    let mut fields = HeaderMap::new();
    let mut count = 0;
    let mut close = !http11;
    let mut hosts = 0;
    for line in lines {
        let line = line
            .strip_suffix(b"\r")
            .ok_or(Malformed("a line not ended by CRLF"))?;
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return Err(Malformed("obsolete line folding"));
        }
        count += 1;
        if count > MAX_FIELDS {
            return Err(HeadError::TooManyFields);
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(Malformed("a field without a colon"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(Malformed("a field name"));
        }
        let value = value.trim_ascii();
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(Malformed("a field value"));
        }
        let name = HeaderName::from_bytes(name).map_err(|_| Malformed("a field name"))?;
        let value = HeaderValue::from_bytes(value).map_err(|_| Malformed("a field value"))?;
        if name == http::header::TRANSFER_ENCODING {
            return Err(HeadError::TransferEncoding);
        }
        if name == http::header::CONTENT_LENGTH {
            let v = value.as_bytes();
            if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                return Err(Malformed("Content-Length"));
            }
            if v.iter().any(|&b| b != b'0') {
                return Err(HeadError::Body);
            }
        }
        if name == http::header::HOST {
            hosts += 1;
        }
        if name == http::header::CONNECTION {
            for t in value.as_bytes().split(|&b| b == b',') {
                let t = t.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && !http11 {
                    close = false;
                }
            }
        }
        fields.append(name, value);
    }
    if hosts > 1 || (http11 && hosts == 0) {
        return Err(Malformed("HTTP/1.1 needs exactly one Host field"));
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = fields;
    Ok(Head { request, close })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(h: &[u8]) -> Head {
        parse_head(h).unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(h)))
    }

    #[test]
    fn parses_a_browser_request() {
        let h = ok(b"GET /img/a.png?x=1 HTTP/1.1\r\nHost: 127.0.0.1:4433\r\nUser-Agent: x\r\nRange: bytes=0-9\r\nAccept: */*\r\n\r\n");
        assert_eq!(h.request.method(), Method::GET);
        assert_eq!(h.request.uri().path(), "/img/a.png");
        assert_eq!(h.request.uri().query(), Some("x=1"));
        assert_eq!(h.request.headers()["range"], "bytes=0-9");
        assert!(!h.close);
        let h = ok(b"HEAD / HTTP/1.1\r\nhost: a\r\nConnection: keep-alive, close\r\n\r\n");
        assert!(h.close);
        assert_eq!(h.request.method(), Method::HEAD);
        // HTTP/1.0: closes unless asked to keep it, needs no Host.
        assert!(ok(b"GET / HTTP/1.0\r\n\r\n").close);
        assert!(!ok(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").close);
        assert!(
            ok(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
                .request
                .headers()
                .contains_key("content-length")
        );
    }

    #[test]
    fn refuses_what_is_not_strict_http_1_1() {
        let cases: &[(&[u8], u16)] = &[
            (b"GET / HTTP/1.1\r\n\r\n", 400),                       // no Host
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400), // two
            (b"GET / HTTP/1.1\nHost: a\r\n\r\n", 400),              // bare LF
            (b"GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400),           // two spaces
            (b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),    // absolute-form
            (b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400), // space before colon
            (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: a\r\nnocolon\r\n\r\n", 400),
            (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
            (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
            (b"GET / FTP/1.1\r\nHost: a\r\n\r\n", 400),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
                413,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
                400,
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                501,
            ),
            (b"GET / HTTP/1.1\r\nHost: a\r\n", 400), // no blank line
        ];
        for (h, code) in cases {
            match parse_head(h) {
                Ok(_) => panic!("accepted {:?}", String::from_utf8_lossy(h)),
                Err(e) => assert_eq!(e.status(), *code, "{:?}: {e}", String::from_utf8_lossy(h)),
            }
        }
        let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..MAX_FIELDS {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_head(&many).unwrap_err(), HeadError::TooManyFields);
    }

    #[test]
    fn finds_the_end_of_a_head() {
        assert_eq!(find_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET"), Some(27));
        assert_eq!(find_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r"), None);
    }
}
