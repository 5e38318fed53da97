//! `quic load --duration`: many long-lived HTTP/3 connections over a
//! bounded number of UDP sockets, spread over local source addresses; the
//! handshake rate reached while opening them, failures by reason, the
//! client's own memory, CPU and descriptors, and what a new client waits
//! throughout (a probe connection every --probe-every).

use super::super::{hq, tls, LoadAlpn, LoadArgs};
use super::{client_endpoint, resolve, Target};
use crate::interrupt;
use anyhow::{anyhow, bail};
use bytes::Buf;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most sockets (QUIC endpoints) a run binds.
const MAX_SOCKETS: usize = 65_536;
/// The sockets a run binds with --source and no --endpoints, at most.
const DEFAULT_SOURCE_SOCKETS: usize = 1024;
/// How long a probe (connect and first response) may take before it is a
/// failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Examples of errors kept for the report.
const EXAMPLES: usize = 5;

/// Parses a time: seconds (`15`, `0.5`), or with a suffix (`500ms`,
/// `15s`, `10m`, `1h`).
pub(crate) fn parse_time(s: &str) -> Option<Duration> {
    let t = s.trim();
    let (num, mul) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    let secs = v * mul;
    (secs.is_finite() && (0.0..=1e7).contains(&secs)).then(|| Duration::from_secs_f64(secs))
}

/// A prefix of addresses: `ADDR` or `ADDR/LEN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefix {
    /// The network address (host bits cleared).
    pub net: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl Prefix {
    /// Parses `ADDR` or `ADDR/LEN`.
    pub fn parse(s: &str) -> Result<Prefix, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let ip: IpAddr = a
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => match l.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{l:?} is not a prefix length (0 to {max})")),
            },
        };
        let net = match ip {
            IpAddr::V4(v) => {
                let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v) & m))
            }
            IpAddr::V6(v) => {
                let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v) & m))
            }
        };
        Ok(Prefix { net, len })
    }

    /// Up to `n` host addresses of the prefix, in order: below /31 (IPv4)
    /// or /127 (IPv6) the network address is skipped, and in IPv4 the
    /// broadcast address too.
    pub fn hosts(&self, n: usize) -> Vec<IpAddr> {
        let bits = if self.net.is_ipv4() { 32 } else { 128 } - u32::from(self.len);
        let size: u128 = if bits >= 128 {
            u128::MAX
        } else {
            1u128 << bits
        };
        let (skip_first, skip_last) = match self.net {
            IpAddr::V4(_) => (bits >= 2, bits >= 2),
            IpAddr::V6(_) => (bits >= 2, false),
        };
        let first = u128::from(skip_first);
        let end = size - u128::from(skip_last);
        let count = (end - first).min(n as u128);
        (0..count)
            .map(|i| match self.net {
                IpAddr::V4(v) => IpAddr::V4(Ipv4Addr::from(u32::from(v) + (first + i) as u32)),
                IpAddr::V6(v) => IpAddr::V6(Ipv6Addr::from(u128::from(v) + first + i)),
            })
            .collect()
    }
}

/// What the run was asked, checked.
struct Plan {
    target: Target,
    /// HTTP/0.9 (hq-interop) rather than HTTP/3, and then the length the
    /// body must have, when the path tells it.
    hq: Option<Option<u64>>,
    path: String,
    duration: Duration,
    keepalive: Option<Duration>,
    request_every: Option<Duration>,
    probe_every: Option<Duration>,
    /// The local address of each socket.
    binds: Vec<SocketAddr>,
    /// The distinct source addresses among them.
    sources: usize,
}

pub(super) fn time_arg(name: &str, v: &str) -> anyhow::Result<Duration> {
    parse_time(v)
        .ok_or_else(|| usage!("{name} {v}: a time such as 15, 15s, 500ms or 10m (0 to 10^7 s)"))
}

fn validate(a: &LoadArgs) -> anyhow::Result<Plan> {
    if a.stack != super::LoadStack::Quic {
        bail_usage!("--duration: QUIC only (--stack quic)");
    }
    if !a.request.starts_with('/') || a.request.chars().any(|c| c.is_control() || c == ' ') {
        bail_usage!("--request {:?}: a path starting with /", a.request);
    }
    if a.connections == 0 || a.connections > 1_000_000 {
        bail_usage!("--connections {}: between 1 and 1000000", a.connections);
    }
    if a.threads == 0 || a.threads > 256 {
        bail_usage!("--threads {}: between 1 and 256", a.threads);
    }
    if a.concurrency == 0 || a.concurrency > 1_000_000 {
        bail_usage!("--concurrency {}: between 1 and 1000000", a.concurrency);
    }
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0 && r <= 1e7) {
            bail_usage!("--rate {r}: connections per second, above 0");
        }
    }
    if a.timeline.is_some() {
        bail_usage!("--timeline: not with --duration");
    }
    let duration = time_arg("--duration", a.duration.as_deref().unwrap_or(""))?;
    if duration.is_zero() {
        bail_usage!("--duration: above 0");
    }
    let nonzero = |name: &str, v: &Option<String>| -> anyhow::Result<Option<Duration>> {
        match v {
            None => Ok(None),
            Some(v) => {
                let d = time_arg(name, v)?;
                if d < Duration::from_millis(10) {
                    bail_usage!("{name} {v}: at least 10ms");
                }
                Ok(Some(d))
            }
        }
    };
    let keepalive = nonzero("--keepalive", &a.keepalive)?;
    // 0: each connection asks again as soon as its response is whole
    // (back to back, for bulk measurements).
    let request_every = match a.request_every.as_deref() {
        Some(v) if time_arg("--request-every", v)?.is_zero() => Some(Duration::ZERO),
        _ => nonzero("--request-every", &a.request_every)?,
    };
    let probe = time_arg("--probe-every", &a.probe_every)?;
    let probe_every = if probe.is_zero() {
        None
    } else if probe < Duration::from_millis(10) {
        bail_usage!("--probe-every {}: 0 (none) or at least 10ms", a.probe_every);
    } else {
        Some(probe)
    };
    let target = resolve(&a.server)?;
    let (binds, sources) = sockets(a, &target)?;
    let hq = match a.alpn {
        LoadAlpn::H3 => None,
        LoadAlpn::HqInterop => Some(
            match hq::parse(format!("GET {}\r\n", a.request).as_bytes(), true) {
                Ok(Some(hq::Request::Bytes(n))) => Some(n),
                Ok(Some(hq::Request::Video { rate, seconds })) => {
                    let interval = Duration::from_secs_f64(a.interval / 1000.0);
                    Some(hq::Frames::new(rate, seconds, interval).total())
                }
                _ => None,
            },
        ),
    };
    Ok(Plan {
        hq,
        path: a.request.clone(),
        target,
        duration,
        keepalive,
        request_every,
        probe_every,
        binds,
        sources,
    })
}

/// The local address of each socket: with --source, the prefix's
/// addresses in turn (port 0); else the unspecified address.
fn sockets(a: &LoadArgs, t: &Target) -> anyhow::Result<(Vec<SocketAddr>, usize)> {
    if let Some(n) = a.endpoints {
        if n == 0 || n > MAX_SOCKETS {
            bail_usage!("--endpoints {n}: between 1 and {MAX_SOCKETS}");
        }
    }
    let Some(src) = &a.source else {
        let any: IpAddr = if t.addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let n = a.endpoints.unwrap_or(1);
        return Ok((vec![SocketAddr::new(any, 0); n], 1));
    };
    let p = Prefix::parse(src).map_err(|e| usage!("--source {src}: {e}"))?;
    if p.net.is_ipv4() != t.addr.is_ipv4() {
        bail_usage!(
            "--source {src}: not the server's address family ({})",
            t.addr
        );
    }
    let addrs = p.hosts(a.endpoints.unwrap_or(DEFAULT_SOURCE_SOCKETS));
    if addrs.is_empty() {
        bail_usage!("--source {src}: no host address in it");
    }
    // One socket per address by default, never more than connections.
    let n = a.endpoints.unwrap_or(addrs.len()).min(a.connections).max(1);
    for ip in &addrs {
        if ip.is_unspecified() || ip.is_multicast() || *ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
            bail_usage!("--source {src}: {ip} is not an address to send from");
        }
        if ip.is_loopback() && !t.addr.ip().is_loopback() {
            bail_usage!(
                "--source {src}: a loopback source reaches only a loopback server, not {}",
                t.addr
            );
        }
    }
    let binds = (0..n)
        .map(|i| SocketAddr::new(addrs[i % addrs.len()], 0))
        .collect();
    Ok((binds, addrs.len()))
}

/// Raises the soft descriptor limit to the hard one; the limit in force.
fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

/// Open descriptors of this process.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The counters every connection updates.
#[derive(Default)]
struct Shared {
    handshakes: AtomicU64,
    alive: AtomicU64,
    /// Connections that failed to open or were lost (each once).
    conn_failed: AtomicU64,
    requests_started: AtomicU64,
    requests_ok: AtomicU64,
    requests_failed: AtomicU64,
    length_mismatches: AtomicU64,
    no_length: AtomicU64,
    /// Connections that failed or were lost, by reason.
    failures: Mutex<BTreeMap<String, u64>>,
    /// The first few errors in full.
    examples: Mutex<Vec<String>>,
    /// Probe waits: when each started (seconds from the start) and how
    /// long it waited, ms.
    probes: Mutex<Vec<(f64, f64)>>,
    probe_failures: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    /// A connection failed to open, or was lost.
    fn fail_conn(&self, reason: String, detail: String) {
        self.conn_failed.fetch_add(1, Relaxed);
        self.fail(reason, detail);
    }

    /// Counts a failure (of a connection or a request) by reason.
    fn fail(&self, reason: String, detail: String) {
        *self.failures.lock().unwrap().entry(reason).or_default() += 1;
        let mut ex = self.examples.lock().unwrap();
        if ex.len() < EXAMPLES {
            ex.push(detail);
        }
    }
}

/// The reason of a connection error, for counting: timeout, a close by
/// the server with its code, a TLS error, a reset.
fn reason(e: &quinn::ConnectionError) -> String {
    use quinn::ConnectionError as E;
    match e {
        E::TimedOut => "timeout".into(),
        E::ConnectionClosed(c) => {
            let code = u64::from(c.error_code);
            if (0x100..0x200).contains(&code) {
                format!("TLS error (alert {}) from the server", code - 0x100)
            } else {
                format!("closed by the server: {} (0x{code:x})", c.error_code)
            }
        }
        E::ApplicationClosed(c) => {
            format!(
                "closed by the server: application code 0x{:x}",
                c.error_code.into_inner()
            )
        }
        E::Reset => "reset by the server (stateless reset)".into(),
        E::TransportError(t) => {
            let code = u64::from(t.code);
            if (0x100..0x200).contains(&code) {
                format!("TLS error (alert {}) here", code - 0x100)
            } else {
                format!("local transport error: {}", t.code)
            }
        }
        E::VersionMismatch => "version mismatch".into(),
        E::LocallyClosed => "closed here".into(),
        E::CidsExhausted => "local: connection IDs exhausted".into(),
    }
}

/// The quinn client configuration: ALPN h3, the keep-alive, and an idle
/// timeout the keep-alive stays within.
fn client_config(keepalive: Option<Duration>, hq: bool) -> anyhow::Result<quinn::ClientConfig> {
    let mut rustls = tls::client();
    if !hq {
        rustls.alpn_protocols = vec![b"h3".to_vec()];
    }
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(rustls)
        .map_err(|e| anyhow!("TLS set-up: {e}"))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    let idle = keepalive.map_or(Duration::from_secs(30), |k| {
        (k * 3).max(Duration::from_secs(30))
    });
    t.max_idle_timeout(Some(
        idle.try_into()
            .map_err(|_| usage!("--keepalive: too long"))?,
    ));
    t.keep_alive_interval(keepalive);
    // Light connections: small windows, so that 100,000 of them cost
    // little here.
    t.stream_receive_window(quinn::VarInt::from_u32(256 << 10));
    t.receive_window(quinn::VarInt::from_u32(1 << 20));
    t.send_window(256 << 10);
    cfg.transport_config(Arc::new(t));
    Ok(cfg)
}

/// Why a request failed: the counting key, and the detail.
struct ReqError(String, String);

/// One GET of `path`: the status must be 2xx and the body as long as the
/// content-length (when there is one). Whether it had one.
async fn get(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>,
    t: &Target,
    path: &str,
) -> Result<bool, ReqError> {
    let h3e = |e: &dyn std::fmt::Display| ReqError("request: HTTP/3 error".into(), e.to_string());
    let uri = format!("https://{}:{}{path}", t.sni, t.addr.port());
    let req = http::Request::get(&uri)
        .body(())
        .map_err(|e| ReqError("request: bad URI".into(), format!("{uri}: {e}")))?;
    let mut s = send.send_request(req).await.map_err(|e| h3e(&e))?;
    s.finish().await.map_err(|e| h3e(&e))?;
    let resp = s.recv_response().await.map_err(|e| h3e(&e))?;
    let length = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let mut n = 0u64;
    while let Some(mut b) = s.recv_data().await.map_err(|e| h3e(&e))? {
        n += b.remaining() as u64;
        b.advance(b.remaining());
    }
    if !resp.status().is_success() {
        return Err(ReqError(
            format!("request: status {}", resp.status().as_u16()),
            format!("{path}: status {}", resp.status()),
        ));
    }
    match length {
        Some(l) if l != n => Err(ReqError(
            "request: body length differs from content-length".into(),
            format!("{path}: content-length {l}, body {n} bytes"),
        )),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// One HTTP/0.9 GET of `path` on a stream of its own, read to its end:
/// the body must be `want` bytes long when that is known. Whether it was.
async fn get_hq(conn: &quinn::Connection, path: &str, want: Option<u64>) -> Result<bool, ReqError> {
    let e = |e: &dyn std::fmt::Display| ReqError("request: stream error".into(), e.to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|x| e(&x))?;
    send.write_all(format!("GET {path}\r\n").as_bytes())
        .await
        .map_err(|x| e(&x))?;
    let _ = send.finish();
    let mut n = 0u64;
    while let Some(c) = recv.read_chunk(64 * 1024, true).await.map_err(|x| e(&x))? {
        n += c.bytes.len() as u64;
    }
    match want {
        Some(w) if w != n => Err(ReqError(
            "request: body length differs from content-length".into(),
            format!("{path}: {w} bytes expected, body {n} bytes"),
        )),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// Counts a request's outcome; whether it went well.
fn count(sh: &Shared, r: Result<bool, ReqError>) -> bool {
    match r {
        Ok(had_length) => {
            sh.requests_ok.fetch_add(1, Relaxed);
            if !had_length {
                sh.no_length.fetch_add(1, Relaxed);
            }
            true
        }
        Err(ReqError(key, detail)) => {
            sh.requests_failed.fetch_add(1, Relaxed);
            if key.contains("content-length") {
                sh.length_mismatches.fetch_add(1, Relaxed);
            }
            sh.fail(key, detail);
            false
        }
    }
}

/// One long-lived connection: the handshake (holding a place among the
/// --concurrency pending ones), a request now and every --request-every,
/// open until `until`.
async fn hold_one(
    ep: quinn::Endpoint,
    plan: Arc<Plan>,
    sh: Arc<Shared>,
    pending: tokio::sync::OwnedSemaphorePermit,
    until: tokio::time::Instant,
) {
    let t = &plan.target;
    let connecting = match ep.connect(t.addr, &t.sni) {
        Ok(c) => c,
        Err(e) => {
            return sh.fail_conn(format!("local: {e}"), format!("connect: {e}"));
        }
    };
    let conn = match connecting.await {
        Ok(c) => c,
        Err(e) => {
            return sh.fail_conn(
                format!("handshake: {}", reason(&e)),
                format!("handshake: {e}"),
            )
        }
    };
    drop(pending);
    sh.handshakes.fetch_add(1, Relaxed);
    sh.alive.fetch_add(1, Relaxed);
    let lost = |sh: &Shared, e: &quinn::ConnectionError| {
        sh.alive.fetch_sub(1, Relaxed);
        sh.fail_conn(format!("lost: {}", reason(e)), format!("lost: {e}"));
    };
    if let Some(want) = plan.hq {
        let work = async {
            loop {
                sh.requests_started.fetch_add(1, Relaxed);
                if !count(&sh, get_hq(&conn, &plan.path, want).await) {
                    return;
                }
                let next = match plan.request_every {
                    Some(e) => (tokio::time::Instant::now() + e).min(until),
                    None => until,
                };
                if plan.request_every != Some(Duration::ZERO) {
                    tokio::time::sleep_until(next).await;
                }
                if tokio::time::Instant::now() >= until {
                    return;
                }
            }
        };
        tokio::select! {
            () = async { work.await; tokio::time::sleep_until(until).await } => {
                if let Some(e) = conn.close_reason() {
                    lost(&sh, &e);
                }
            }
            e = conn.closed() => lost(&sh, &e),
            // A request still pending at the end is not counted.
            () = tokio::time::sleep_until(until) => {}
        }
        conn.close(quinn::VarInt::from_u32(0), b"done");
        return;
    }
    let (mut driver, mut send) =
        match h3::client::new(h3_quinn::Connection::new(conn.clone())).await {
            Ok(x) => x,
            Err(e) => {
                match conn.close_reason() {
                    Some(r) => lost(&sh, &r),
                    None => {
                        sh.alive.fetch_sub(1, Relaxed);
                        sh.fail_conn("HTTP/3 set-up".into(), format!("HTTP/3 set-up: {e}"));
                    }
                }
                conn.close(quinn::VarInt::from_u32(0x100), b"");
                return;
            }
        };
    let work = async {
        loop {
            sh.requests_started.fetch_add(1, Relaxed);
            if !count(&sh, get(&mut send, t, &plan.path).await) {
                return;
            }
            let next = match plan.request_every {
                Some(e) => (tokio::time::Instant::now() + e).min(until),
                None => until,
            };
            if plan.request_every != Some(Duration::ZERO) {
                tokio::time::sleep_until(next).await;
            }
            if tokio::time::Instant::now() >= until {
                return;
            }
        }
    };
    let closed = tokio::select! {
        () = async { work.await; tokio::time::sleep_until(until).await } => None,
        _ = driver.wait_idle() => conn.close_reason(),
        // A request still pending at the end is not counted.
        () = tokio::time::sleep_until(until) => None,
    };
    match closed {
        Some(e) => lost(&sh, &e),
        None => {
            if let Some(e) = conn.close_reason() {
                lost(&sh, &e);
            }
        }
    }
    // H3_NO_ERROR.
    conn.close(quinn::VarInt::from_u32(0x100), b"done");
}

/// One probe: a new connection on its own socket, and its first
/// response; the wait, ms.
async fn probe(ep: &quinn::Endpoint, plan: &Plan) -> Result<f64, String> {
    let t0 = Instant::now();
    let t = &plan.target;
    let conn = ep
        .connect(t.addr, &t.sni)
        .map_err(|e| format!("local: {e}"))?
        .await
        .map_err(|e| format!("handshake: {}", reason(&e)))?;
    if let Some(want) = plan.hq {
        let r = get_hq(&conn, &plan.path, want).await;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        conn.close(quinn::VarInt::from_u32(0), b"done");
        return r.map(|_| ms).map_err(|e| e.0);
    }
    let r = async {
        let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
            .await
            .map_err(|_| "HTTP/3 set-up".to_string())?;
        tokio::select! {
            r = get(&mut send, t, &plan.path) => r.map_err(|e| e.0),
            _ = driver.wait_idle() => Err("closed".to_string()),
        }
    }
    .await;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    conn.close(quinn::VarInt::from_u32(0x100), b"done");
    r.map(|_| ms)
}

/// Percentiles of what a new client waited.
#[derive(Debug, Serialize, Default)]
struct Waits {
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    failures: BTreeMap<String, u64>,
}

/// One second of the run.
#[derive(Debug, Serialize)]
struct Tick {
    t_s: f64,
    established: u64,
    alive: u64,
    rss_kib: u64,
    fds: u64,
}

/// The report of a `--duration` run.
#[derive(Debug, Serialize)]
struct Summary {
    mode: &'static str,
    server: String,
    request: String,
    connections: usize,
    /// UDP sockets (QUIC endpoints) the connections shared, and the
    /// distinct source addresses among them.
    sockets: usize,
    source_addresses: usize,
    /// Connections whose handshake completed, and still open at the end.
    established: u64,
    alive_at_end: u64,
    /// Connections that failed to open or were lost.
    failed: u64,
    /// Failures by reason: of connections (`handshake: ...`, `lost: ...`,
    /// `local: ...`) and of requests (`request: ...`).
    failures: BTreeMap<String, u64>,
    errors: Vec<String>,
    /// Seconds from the first connection attempt to the last handshake's
    /// end; handshakes per second over it, and in the best second.
    opening_s: f64,
    handshakes_per_s: f64,
    handshakes_per_s_peak: u64,
    requests_ok: u64,
    requests_failed: u64,
    /// Requests without a response at the end (a server that never
    /// answered, or a request sent just before the end).
    requests_unanswered: u64,
    content_length_mismatches: u64,
    responses_without_content_length: u64,
    /// Connect plus first response of a new client, sampled throughout
    /// (every --probe-every), and split: the probes that started while
    /// the connections were being opened, and after.
    new_client: Waits,
    new_client_opening: Waits,
    new_client_holding: Waits,
    client_rss_kib_peak: u64,
    client_rss_kib_end: u64,
    client_cpu_s: f64,
    /// CPU over the time the connections were held (after opening), in
    /// cores.
    client_cpu_cores_holding: Option<f64>,
    /// Descriptors open at most, and the limit (raised to the hard one).
    client_fds_peak: u64,
    nofile_limit: u64,
    seconds: f64,
    started_unix_ms: u64,
    /// Each second: connections established so far, open, RSS, fds.
    timeline: Vec<Tick>,
}

/// The waits of the probes that started at a time `when` takes
/// (seconds from the start).
fn waits(
    probes: &[(f64, f64)],
    when: impl Fn(f64) -> bool,
    failures: BTreeMap<String, u64>,
) -> Waits {
    let mut ms: Vec<f64> = probes.iter().filter(|p| when(p.0)).map(|p| p.1).collect();
    ms.sort_by(f64::total_cmp);
    Waits {
        samples: ms.len(),
        p50_ms: quantile(&ms, 0.5),
        p99_ms: quantile(&ms, 0.99),
        max_ms: ms.last().copied().unwrap_or(0.0),
        failures,
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Runs `quic load --duration`.
pub(super) fn run(a: &LoadArgs) -> anyhow::Result<()> {
    let plan = Arc::new(validate(a)?);
    let nofile = raise_nofile();
    let need = plan.binds.len() as u64 + 64;
    if nofile != 0 && nofile < need {
        bail!(
            "{} sockets need about {need} descriptors; the limit here is {nofile} (ulimit -n)",
            plan.binds.len()
        );
    }
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    interrupt::watch();
    let rt = super::runtime(a.threads)?;
    let cfg = client_config(plan.keepalive, plan.hq.is_some())?;
    let s = rt.block_on(async {
        let mut eps = Vec::with_capacity(plan.binds.len());
        for b in &plan.binds {
            let mut ep = client_endpoint(*b, a.max_udp_payload).map_err(|e| {
                if a.source.is_some() {
                    usage!(
                        "--source {}: cannot use {}: {e:#} (the prefix must be loopback, or assigned to an interface here)",
                        a.source.as_deref().unwrap_or(""),
                        b.ip()
                    )
                } else {
                    e
                }
            })?;
            ep.set_default_client_config(cfg.clone());
            eps.push(ep);
        }
        Ok::<_, anyhow::Error>(drive(a, &plan, eps, cfg.clone()).await)
    })?;
    rt.shutdown_timeout(Duration::from_millis(500));
    let mut s = s;
    s.started_unix_ms = started_unix_ms;
    s.nofile_limit = nofile;
    print(&s, a.json)?;
    if interrupt::requested() {
        return Err(interrupt::summarized_err());
    }
    if s.failed > 0 || s.requests_failed > 0 {
        bail!(
            "{} of {} connections failed or were lost, {} requests failed",
            s.failed,
            s.connections,
            s.requests_failed
        );
    }
    Ok(())
}

/// Opens the connections, holds them, probes, samples; the summary.
async fn drive(
    a: &LoadArgs,
    plan: &Arc<Plan>,
    eps: Vec<quinn::Endpoint>,
    cfg: quinn::ClientConfig,
) -> Summary {
    let sh = Arc::new(Shared::default());
    let cpu0 = fastudp_tools::os::process_cpu_time();
    let t0 = tokio::time::Instant::now();
    let until = t0 + plan.duration;
    let opened_at = Arc::new(Mutex::new(None::<(Duration, Duration)>));
    // The opener: connection i no sooner than i / --rate, with at most
    // --concurrency handshakes pending.
    let opener = {
        let (plan, sh, eps) = (Arc::clone(plan), Arc::clone(&sh), eps.clone());
        let (n, conc, rate) = (a.connections, a.concurrency, a.rate);
        tokio::spawn(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(conc));
            let mut tasks = Vec::with_capacity(n);
            for i in 0..n {
                if let Some(r) = rate {
                    tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / r)).await;
                }
                let permit = tokio::select! {
                    p = Arc::clone(&sem).acquire_owned() => p.expect("never closed"),
                    () = tokio::time::sleep_until(until) => break,
                };
                if interrupt::requested() {
                    break;
                }
                let ep = eps[i % eps.len()].clone();
                tasks.push(tokio::spawn(hold_one(
                    ep,
                    Arc::clone(&plan),
                    Arc::clone(&sh),
                    permit,
                    until,
                )));
            }
            let opened = tasks.len();
            // Opening ends when every handshake has ended: all permits back.
            let _ = sem.acquire_many(conc as u32).await;
            (opened, t0.elapsed(), tasks)
        })
    };
    // The probes, on a thread and a runtime of their own: a new client's
    // wait is the server's, not that of this process's runtime busy with
    // the held connections.
    let start = std::time::Instant::now();
    let prober = plan.probe_every.map(|every| {
        let (plan, sh) = (Arc::clone(plan), Arc::clone(&sh));
        let (bind, payload) = (plan.binds[0], a.max_udp_payload);
        let deadline = start + plan.duration;
        std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    *sh.probe_failures
                        .lock()
                        .unwrap()
                        .entry(format!("local: probe runtime: {e}"))
                        .or_default() += 1;
                    return;
                }
            };
            rt.block_on(async move {
                let ep = match client_endpoint(bind, payload) {
                    Ok(mut ep) => {
                        ep.set_default_client_config(cfg);
                        ep
                    }
                    Err(e) => {
                        *sh.probe_failures
                            .lock()
                            .unwrap()
                            .entry(format!("local: probe socket: {e:#}"))
                            .or_default() += 1;
                        return;
                    }
                };
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                let mut running = Vec::new();
                loop {
                    tick.tick().await;
                    if std::time::Instant::now() >= deadline || interrupt::requested() {
                        break;
                    }
                    let (ep, plan, sh) = (ep.clone(), Arc::clone(&plan), Arc::clone(&sh));
                    running.push(tokio::spawn(async move {
                        let at = start.elapsed().as_secs_f64();
                        let r = tokio::time::timeout(PROBE_TIMEOUT, probe(&ep, &plan))
                            .await
                            .unwrap_or_else(|_| Err("timeout".into()));
                        match r {
                            Ok(ms) => sh.probes.lock().unwrap().push((at, ms)),
                            Err(k) => *sh.probe_failures.lock().unwrap().entry(k).or_default() += 1,
                        }
                    }));
                }
                for r in running {
                    let _ = tokio::time::timeout(PROBE_TIMEOUT, r).await;
                }
                ep.close(quinn::VarInt::from_u32(0x100), b"done");
            });
        })
    });
    // The sampler, every second, until the end.
    let mut timeline = Vec::new();
    let (mut peak_rss, mut peak_fds, mut peak_rate, mut last) = (0, 0, 0, 0);
    let mut tick = tokio::time::interval_at(t0 + Duration::from_secs(1), Duration::from_secs(1));
    let mut opener = opener;
    let mut opening: Option<(usize, Duration, Vec<tokio::task::JoinHandle<()>>)> = None;
    let mut cpu_open = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = &mut opener, if opening.is_none() => {
                let r = r.unwrap_or((0, t0.elapsed(), Vec::new()));
                cpu_open = Some((fastudp_tools::os::process_cpu_time(), t0.elapsed()));
                *opened_at.lock().unwrap() = Some((r.1, r.1));
                opening = Some(r);
                continue;
            }
            () = tokio::time::sleep_until(until) => break,
        }
        let est = sh.handshakes.load(Relaxed);
        peak_rate = peak_rate.max(est - last);
        last = est;
        let (rss, fds) = (rss_kib(), open_fds());
        peak_rss = peak_rss.max(rss);
        peak_fds = peak_fds.max(fds);
        timeline.push(Tick {
            t_s: t0.elapsed().as_secs_f64(),
            established: est,
            alive: sh.alive.load(Relaxed),
            rss_kib: rss,
            fds,
        });
        if interrupt::requested() {
            break;
        }
    }
    let cpu_end = fastudp_tools::os::process_cpu_time();
    let t_end = t0.elapsed();
    let (rss, fds) = (rss_kib(), open_fds());
    peak_rss = peak_rss.max(rss);
    peak_fds = peak_fds.max(fds);
    let alive_at_end = sh.alive.load(Relaxed);
    let opening = match opening {
        Some(o) => o,
        None => {
            // Still opening at the end: the handshakes so far.
            opener.abort();
            (0, t_end, Vec::new())
        }
    };
    let mut tasks = opening.2;
    for t in tasks.drain(..) {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    if let Some(p) = prober {
        // It stops by itself within PROBE_TIMEOUT of the end.
        let _ = tokio::task::spawn_blocking(move || p.join()).await;
    }
    for ep in &eps {
        ep.close(quinn::VarInt::from_u32(0x100), b"done");
    }
    let est = sh.handshakes.load(Relaxed);
    let probes = sh.probes.lock().unwrap().clone();
    let failures = sh.failures.lock().unwrap().clone();
    let opening_s = opening.1.as_secs_f64();
    let errors = sh.examples.lock().unwrap().clone();
    let probe_failures = sh.probe_failures.lock().unwrap().clone();
    Summary {
        mode: "duration",
        server: plan.target.shown.clone(),
        request: plan.path.clone(),
        connections: a.connections,
        sockets: eps.len(),
        source_addresses: plan.sources,
        established: est,
        alive_at_end,
        failed: sh.conn_failed.load(Relaxed),
        failures,
        errors,
        opening_s,
        handshakes_per_s: est as f64 / opening_s.max(1e-6),
        handshakes_per_s_peak: peak_rate,
        requests_ok: sh.requests_ok.load(Relaxed),
        requests_failed: sh.requests_failed.load(Relaxed),
        requests_unanswered: sh
            .requests_started
            .load(Relaxed)
            .saturating_sub(sh.requests_ok.load(Relaxed) + sh.requests_failed.load(Relaxed)),
        content_length_mismatches: sh.length_mismatches.load(Relaxed),
        responses_without_content_length: sh.no_length.load(Relaxed),
        new_client: waits(&probes, |_| true, probe_failures),
        new_client_opening: waits(&probes, |t| t < opening_s, BTreeMap::new()),
        new_client_holding: waits(&probes, |t| t >= opening_s, BTreeMap::new()),
        client_rss_kib_peak: peak_rss,
        client_rss_kib_end: rss,
        client_cpu_s: cpu_end.saturating_sub(cpu0).as_secs_f64(),
        client_cpu_cores_holding: cpu_open.and_then(|(c, at)| {
            let secs = t_end.saturating_sub(at).as_secs_f64();
            (secs >= 1.0).then(|| cpu_end.saturating_sub(c).as_secs_f64() / secs)
        }),
        client_fds_peak: peak_fds,
        nofile_limit: 0,
        seconds: t_end.as_secs_f64(),
        started_unix_ms: 0,
        timeline,
    }
}

fn print(s: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        return out!("{}", serde_json::to_string(s).unwrap_or_default());
    }
    out!(
        "{} connections to {} ({}) over {} sockets from {} source addresses: {} established, {} open at the end, {} failed or lost",
        s.connections,
        s.server,
        s.request,
        s.sockets,
        s.source_addresses,
        s.established,
        s.alive_at_end,
        s.failed
    )?;
    out!(
        "opening: {:.1} s, {:.0} handshakes/s (best second {})",
        s.opening_s,
        s.handshakes_per_s,
        s.handshakes_per_s_peak
    )?;
    out!(
        "requests: {} ok, {} failed ({} with a body unlike their content-length, {} without content-length), {} unanswered at the end",
        s.requests_ok,
        s.requests_failed,
        s.content_length_mismatches,
        s.responses_without_content_length,
        s.requests_unanswered
    )?;
    let w = &s.new_client;
    out!(
        "a new client waited (connect + first response, {} samples): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} probes failed",
        w.samples,
        w.p50_ms,
        w.p99_ms,
        w.max_ms,
        w.failures.values().sum::<u64>()
    )?;
    for (when, w) in [
        ("while opening", &s.new_client_opening),
        ("while holding", &s.new_client_holding),
    ] {
        out!(
            "  {when}: {} samples, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            w.samples,
            w.p50_ms,
            w.p99_ms,
            w.max_ms
        )?;
    }
    out!(
        "client: RSS {} KiB at most ({} KiB at the end), CPU {:.2} s ({} cores while holding), {} descriptors at most (limit {}), {:.1} s",
        s.client_rss_kib_peak,
        s.client_rss_kib_end,
        s.client_cpu_s,
        s.client_cpu_cores_holding
            .map_or_else(|| "-".into(), |c| format!("{c:.3}")),
        s.client_fds_peak,
        s.nofile_limit,
        s.seconds
    )?;
    for (k, n) in &s.failures {
        out!("failed: {n} × {k}")?;
    }
    for e in &s.errors {
        out!("error: {e}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_and_list_their_hosts() {
        let p = Prefix::parse("127.1.0.9/28").unwrap();
        assert_eq!(p.net, "127.1.0.0".parse::<IpAddr>().unwrap());
        let h = p.hosts(100);
        assert_eq!(h.len(), 14);
        assert_eq!(h[0], "127.1.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(h[13], "127.1.0.14".parse::<IpAddr>().unwrap());
        assert_eq!(Prefix::parse("127.1.0.0/16").unwrap().hosts(500).len(), 500);
        assert_eq!(
            Prefix::parse("127.0.0.7").unwrap().hosts(9),
            vec!["127.0.0.7".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(Prefix::parse("::1/128").unwrap().hosts(9).len(), 1);
        assert_eq!(Prefix::parse("fd00::/120").unwrap().hosts(1000).len(), 255);
        assert!(Prefix::parse("127.0.0.1/33").is_err());
        assert!(Prefix::parse("nope/8").is_err());
        assert!(Prefix::parse("::1/129").is_err());
    }

    #[test]
    fn times_parse_with_their_units() {
        assert_eq!(parse_time("15"), Some(Duration::from_secs(15)));
        assert_eq!(parse_time("15s"), Some(Duration::from_secs(15)));
        assert_eq!(parse_time("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_time("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_time("-1"), None);
        assert_eq!(parse_time("x"), None);
        assert_eq!(parse_time("inf"), None);
    }
}
