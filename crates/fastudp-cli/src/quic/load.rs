//! `fastudp quic load`: many client connections (quinn, or rustls over
//! TCP), one request each, and what each got: goodput, whether it kept its
//! rate, stalls, loss, the bytes checked against the pattern; client CPU.

use super::hq::{self, Frames, Request};
use super::quinn_stack::runtime;
use super::{tls, LoadArgs, LoadStack};
use crate::interrupt;
use anyhow::{anyhow, bail};
use serde::Serialize;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the run waits for the server's first answer (a completed
/// handshake, or a refusal from the server) before it gives up on the
/// whole run: a dead port or a wrong address is an error within this
/// time, not a silent wait for every connection's own timeout.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// Where the clients connect, and under which name.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The address the clients use (the name's first address).
    addr: SocketAddr,
    /// Other addresses the name resolved to, for the error message.
    others: Vec<SocketAddr>,
    /// The TLS server name: the host name, or "localhost" for an address.
    sni: String,
    /// As given, with the address when a name was resolved.
    shown: String,
}

/// Resolves `HOST:PORT` (an address or a name) once. A server given
/// without a port, or a name that does not resolve, is a usage error.
pub(super) fn resolve(server: &str) -> anyhow::Result<Target> {
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok(Target {
            addr,
            others: Vec::new(),
            sni: "localhost".into(),
            shown: addr.to_string(),
        });
    }
    let bad = |why: String| {
        usage!(
            "{server}: {why} (give HOST:PORT, such as localhost:4433, 127.0.0.1:4433 or [::1]:4433)"
        )
    };
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| bad("no port".into()))?;
    if port.parse::<u16>().is_err() {
        return Err(bad(format!("{port:?} is not a port")));
    }
    let all: Vec<SocketAddr> = server
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve {host}: {e}")))?
        .collect();
    let (&addr, others) = all
        .split_first()
        .ok_or_else(|| bad(format!("{host} resolves to no address")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let sni = if rustls::pki_types::DnsName::try_from(host).is_ok() {
        host.to_string()
    } else {
        "localhost".into()
    };
    Ok(Target {
        addr,
        others: others.to_vec(),
        sni,
        shown: format!("{server} ({addr})"),
    })
}

/// The error of a run to which nothing answered within [`ANSWER_WITHIN`]
/// (a runtime error: the arguments were fine).
fn no_answer(t: &Target, stack: LoadStack) -> anyhow::Error {
    let what = match stack {
        LoadStack::Quic => "no QUIC server answered",
        LoadStack::TlsTcp => "no TLS server answered",
    };
    let others = if t.others.is_empty() {
        String::new()
    } else {
        let o: Vec<String> = t.others.iter().map(|a| a.to_string()).collect();
        format!(
            "; the name also resolves to {}: give one of those to try it",
            o.join(", ")
        )
    };
    anyhow!(
        "{what} at {} within {} s: is the server running there (`fastudp quic serve`), with this port and protocol?{others}",
        t.addr,
        ANSWER_WITHIN.as_secs()
    )
}

/// Waits for the clients; gives up on all of them (aborted) when nothing
/// answered within [`ANSWER_WITHIN`].
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Outcome>>,
    answered: &AtomicBool,
) -> Option<Vec<Outcome>> {
    let aborts: Vec<tokio::task::AbortHandle> = tasks.iter().map(|t| t.abort_handle()).collect();
    let watchdog = async {
        tokio::time::sleep(ANSWER_WITHIN).await;
        if !answered.load(Relaxed) {
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        out = collect(tasks) => Some(out),
        () = watchdog => {
            for a in aborts {
                a.abort();
            }
            None
        }
    }
}
mod hold;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// What one connection got.
#[derive(Debug, Default, Clone)]
struct Outcome {
    bytes: u64,
    /// From the request to the first byte, and to the last.
    first: Option<Duration>,
    last: Option<Duration>,
    stalls: u64,
    max_gap: Duration,
    wrong_at: Option<u64>,
    error: Option<String>,
    /// The connection ended with a stateless reset.
    reset: bool,
    complete: bool,
    lost_packets: u64,
    sent_packets: u64,
    rx_datagrams: u64,
    rx_udp_bytes: u64,
    /// The load's start and the bucket length, when a timeline is kept.
    timeline_at: Option<(Instant, Duration)>,
    /// Bytes received per bucket from the load's start.
    timeline: Vec<u64>,
}

/// The most buckets a connection's timeline keeps (bytes later than that
/// go in the last one).
const TIMELINE_BUCKETS: usize = 100_000;

/// The summary.
#[derive(Debug, Serialize)]
struct Summary {
    stack: &'static str,
    server: String,
    request: String,
    connections: usize,
    completed: usize,
    failed: usize,
    /// Connections whose bytes differed from the pattern.
    wrong_bytes: usize,
    /// The requested rate in bytes/s (video only).
    rate_bytes_s: Option<u64>,
    /// Per-connection goodput in Mbit/s.
    goodput_mbit_s: Spread,
    /// Share of completed video connections whose goodput is within 5% of
    /// the requested rate.
    on_rate_share: Option<f64>,
    /// Gaps longer than two frame intervals, in all (video only).
    stalls: u64,
    /// Connections with at least one stall.
    stalled_connections: usize,
    /// The longest gap between two reads, ms.
    max_gap_ms: f64,
    /// Packets the clients declared lost, and sent.
    client_lost_packets: u64,
    client_sent_packets: u64,
    /// Datagrams the clients received.
    client_rx_datagrams: u64,
    /// UDP payload bytes the clients received: over the datagrams, the
    /// server's mean packet size (path-MTU discovery's result).
    client_rx_udp_bytes: u64,
    /// All bytes received, Gbit/s over the run.
    total_gbit_s: f64,
    seconds: f64,
    /// Client CPU seconds (all threads), and per Gbit received.
    client_cpu_s: f64,
    client_cpu_s_per_gbit: Option<f64>,
    /// The first few errors.
    errors: Vec<String>,
    /// Connections the server ended with a stateless reset (one of a
    /// fleet's servers that did not hold the connection).
    stateless_resets: usize,
    /// With --rebind: the endpoints that moved to a new socket (0 when
    /// every connection ended before the rebind was due).
    #[serde(skip_serializing_if = "Option::is_none")]
    rebound_endpoints: Option<usize>,
    /// When the load started, ms since 1970.
    started_unix_ms: u64,
    /// The timelines' bucket, ms (with --timeline).
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline_ms: Option<f64>,
    /// Each connection's bytes per bucket from the load's start (with
    /// --timeline), in connection order.
    #[serde(skip_serializing_if = "Option::is_none")]
    timelines: Option<Vec<Vec<u64>>>,
}

/// Minimum, 10th percentile, median, mean and maximum.
#[derive(Debug, Serialize, Default)]
struct Spread {
    min: f64,
    p10: f64,
    median: f64,
    mean: f64,
    max: f64,
}

fn spread(mut v: Vec<f64>) -> Spread {
    if v.is_empty() {
        return Spread::default();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Spread {
        min: v[0],
        p10: at(0.1),
        median: at(0.5),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        max: v[v.len() - 1],
    }
}

/// What `quic load` was asked to do, checked.
struct Plan {
    req: Request,
    interval: Duration,
    timeout: Duration,
    /// The timeline's bucket, with --timeline.
    bucket: Option<Duration>,
    target: Target,
    /// --keepalive.
    keepalive: Option<Duration>,
}

/// One client connection's part of the run.
struct Client {
    target: Target,
    /// The request line, `GET /PATH\r\n`.
    request: String,
    interval: Duration,
    timeout: Duration,
    /// When it starts, from the load's start.
    start: Duration,
    /// The load's start and the timeline's bucket, with --timeline.
    timeline_at: Option<(Instant, Duration)>,
}

impl Plan {
    /// Connection `i`'s client, its start spread over `--ramp`.
    fn client(&self, a: &LoadArgs, i: usize, t0: Instant) -> Client {
        Client {
            target: self.target.clone(),
            request: format!("GET {}\r\n", a.request),
            interval: self.interval,
            timeout: self.timeout,
            start: Duration::from_secs_f64(a.ramp * i as f64 / a.connections as f64),
            timeline_at: self.bucket.map(|b| (t0, b)),
        }
    }
}

impl Client {
    /// Runs one connection (`conn`, given this client and an outcome to
    /// fill) after its start, within its timeout; what it got.
    async fn run<F>(self, conn: F) -> Outcome
    where
        F: AsyncFnOnce(&Client, &mut Outcome) -> anyhow::Result<()>,
    {
        tokio::time::sleep(self.start).await;
        let mut o = Outcome {
            timeline_at: self.timeline_at,
            ..Outcome::default()
        };
        match tokio::time::timeout(self.timeout, conn(&self, &mut o)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => o.error = Some(format!("{e:#}")),
            Err(_) => o.error = Some("timed out".into()),
        }
        o
    }
}

/// Runs `fastudp quic load`.
pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    if a.duration.is_some() {
        if a.rebind.is_some() {
            bail_usage!("--rebind: not with --duration");
        }
        return hold::run(&a);
    }
    if let Some(o) = [
        ("--source", a.source.is_some()),
        ("--request-every", a.request_every.is_some()),
        ("--rate", a.rate.is_some()),
    ]
    .iter()
    .find(|o| o.1)
    {
        bail_usage!("{}: only with --duration (long-lived connections)", o.0);
    }
    let plan = validate(&a)?;
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let answered = Arc::new(AtomicBool::new(false));
    interrupt::watch();
    let rt = runtime(a.threads)?;
    let cpu0 = fastudp_tools::os::process_cpu_time();
    let t0 = Instant::now();
    let outcomes = rt.block_on(async {
        match a.stack {
            LoadStack::Quic => quic_clients(&a, &plan, t0, &answered).await,
            LoadStack::TlsTcp => Ok(tcp_clients(&a, &plan, t0, &answered)
                .await
                .map(|o| (o, None))),
        }
    })?;
    let Some((outcomes, rebound)) = outcomes else {
        rt.shutdown_timeout(Duration::from_millis(200));
        if interrupt::requested() {
            return Err(interrupt::interrupted("before the server answered"));
        }
        return Err(no_answer(&plan.target, a.stack));
    };
    let secs = t0.elapsed().as_secs_f64();
    let cpu = fastudp_tools::os::process_cpu_time()
        .saturating_sub(cpu0)
        .as_secs_f64();
    rt.shutdown_timeout(Duration::from_millis(200));
    let mut s = summarize(&a, &plan, &outcomes, secs, cpu);
    s.started_unix_ms = started_unix_ms;
    s.rebound_endpoints = rebound;
    report(&s, a.json)
}

/// Checks the options; resolves the server.
fn validate(a: &LoadArgs) -> anyhow::Result<Plan> {
    let req = hq::parse(format!("GET {}\r\n", a.request).as_bytes(), true)
        .map_err(|_| usage!("--request {}: /video/RATE/SECONDS or /bytes/N", a.request))?
        .ok_or_else(|| usage!("--request: empty"))?;
    if a.connections == 0 || a.connections > 1_000_000 {
        bail_usage!("--connections {}: between 1 and 1000000", a.connections);
    }
    let endpoints = a.endpoints.unwrap_or(1);
    if a.threads == 0 || a.threads > 256 || endpoints == 0 || endpoints > 256 {
        bail_usage!("--threads and --endpoints: between 1 and 256");
    }
    if !(a.interval.is_finite() && a.interval >= 1.0) {
        bail_usage!("--interval {}: at least 1 ms", a.interval);
    }
    if !(a.ramp.is_finite() && (0.0..=3600.0).contains(&a.ramp)) {
        bail_usage!("--ramp {}: 0 to 3600 s", a.ramp);
    }
    let length = match req {
        Request::Video { seconds, .. } => seconds as f64,
        Request::Bytes(_) => 0.0,
    };
    let timeout = a.timeout.unwrap_or(length + 30.0);
    if !(timeout.is_finite() && timeout > 0.0 && timeout <= 1e6) {
        bail_usage!("--timeout {timeout}: positive seconds");
    }
    if let Some(r) = a.rebind {
        if !(r.is_finite() && (0.0..=3600.0).contains(&r)) {
            bail_usage!("--rebind {r}: 0 to 3600 s");
        }
        if a.stack != LoadStack::Quic {
            bail_usage!("--rebind is QUIC's: not with --stack tls-tcp");
        }
    }
    if a.rebind_address.is_some() && a.rebind.is_none() {
        bail_usage!("--rebind-address: only with --rebind");
    }
    let keepalive = match &a.keepalive {
        None => None,
        Some(v) => {
            let d = hold::time_arg("--keepalive", v)?;
            if !(Duration::from_millis(10)..=Duration::from_secs(20)).contains(&d) {
                bail_usage!("--keepalive {v}: 10ms to 20s (under the 30 s idle timeout)");
            }
            Some(d)
        }
    };
    let bucket = match a.timeline {
        None => None,
        Some(ms) if ms.is_finite() && (10.0..=10_000.0).contains(&ms) => {
            Some(Duration::from_secs_f64(ms / 1000.0))
        }
        Some(ms) => bail_usage!("--timeline {ms}: 10 to 10000 ms"),
    };
    Ok(Plan {
        req,
        interval: Duration::from_secs_f64(a.interval / 1000.0),
        timeout: Duration::from_secs_f64(timeout),
        bucket,
        target: resolve(&a.server)?,
        keepalive,
    })
}

/// The quinn clients over `--endpoints` sockets; `None` when nothing
/// answered in time.
async fn quic_clients(
    a: &LoadArgs,
    plan: &Plan,
    t0: Instant,
    answered: &Arc<AtomicBool>,
) -> anyhow::Result<Option<(Vec<Outcome>, Option<usize>)>> {
    let bind: SocketAddr = if plan.target.addr.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let cfg = client_config(a.ack_every, plan.keepalive)?;
    let mut eps = Vec::new();
    for _ in 0..a.endpoints.unwrap_or(1) {
        let mut ep = client_endpoint(bind, a.max_udp_payload)?;
        ep.set_default_client_config(cfg.clone());
        eps.push(ep);
    }
    let rebinder = a.rebind.map(|secs| {
        let (eps, to) = (eps.clone(), a.rebind_address);
        let ip = to.unwrap_or(bind.ip());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            rebind(&eps, SocketAddr::new(ip, 0))
        })
    });
    let mut tasks = Vec::with_capacity(a.connections);
    for i in 0..a.connections {
        let ep = eps[i % eps.len()].clone();
        let (client, answered) = (plan.client(a, i, t0), Arc::clone(answered));
        tasks.push(tokio::spawn(client.run(
            async move |c: &Client, o: &mut Outcome| quic_one(&ep, c, &answered, o).await,
        )));
    }
    let out = gather(tasks, answered).await;
    let rebound = match rebinder {
        None => None,
        Some(t) if t.is_finished() => Some(t.await.map_err(|e| anyhow!("rebind: {e}"))??),
        Some(t) => {
            // The connections ended before the rebind was due.
            t.abort();
            Some(0)
        }
    };
    for ep in &eps {
        ep.close(quinn::VarInt::from_u32(0), b"done");
    }
    if out.is_some() {
        for ep in &eps {
            let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
        }
    }
    Ok(out.map(|o| (o, rebound)))
}

/// Moves every endpoint to a new socket bound to `to`: how many moved. A
/// socket that cannot be had, or a move quinn refuses, is a runtime error.
fn rebind(eps: &[quinn::Endpoint], to: SocketAddr) -> anyhow::Result<usize> {
    for ep in eps {
        let s = fastudp_io::Socket::bind(to, fastudp_io::Config::default().recv_buffer(8 << 20))
            .map_err(|e| anyhow!("--rebind: a socket on {to}: {e}"))?;
        let (sock, _) = s.into_parts();
        sock.set_nonblocking(true)
            .map_err(|e| anyhow!("--rebind: {e}"))?;
        ep.rebind(sock).map_err(|e| anyhow!("--rebind: {e}"))?;
    }
    Ok(eps.len())
}

/// The quinn client configuration: large windows, and the ACK-frequency
/// extension with `--ack-every`.
fn client_config(
    ack_every: Option<u32>,
    keepalive: Option<Duration>,
) -> anyhow::Result<quinn::ClientConfig> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls::client())
        .map_err(|e| anyhow!("TLS set-up: {e}"))?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    let mut t = quinn::TransportConfig::default();
    t.max_idle_timeout(Some(Duration::from_secs(30).try_into().unwrap()));
    t.stream_receive_window(quinn::VarInt::from_u32(8 << 20));
    t.receive_window(quinn::VarInt::from_u32(16 << 20));
    t.keep_alive_interval(keepalive);
    if let Some(n) = ack_every {
        fastudp_quic::ack_every(&mut t, n);
    }
    cfg.transport_config(Arc::new(t));
    Ok(cfg)
}

/// The clients of TLS over TCP; `None` when nothing answered in time.
async fn tcp_clients(
    a: &LoadArgs,
    plan: &Plan,
    t0: Instant,
    answered: &Arc<AtomicBool>,
) -> Option<Vec<Outcome>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls::client()));
    let mut tasks = Vec::with_capacity(a.connections);
    for i in 0..a.connections {
        let (client, connector) = (plan.client(a, i, t0), connector.clone());
        let answered = Arc::clone(answered);
        tasks.push(tokio::spawn(client.run(
            async move |c: &Client, o: &mut Outcome| tcp_one(&connector, c, &answered, o).await,
        )));
    }
    gather(tasks, answered).await
}

/// Prints the summary; a run where a connection failed or got wrong
/// bytes is a runtime error after it.
fn report(s: &Summary, json: bool) -> anyhow::Result<()> {
    print(s, json)?;
    if interrupt::requested() {
        return Err(interrupt::summarized_err());
    }
    if s.failed > 0 || s.wrong_bytes > 0 {
        bail!(
            "{} of {} connections failed, {} got wrong bytes",
            s.failed,
            s.connections,
            s.wrong_bytes
        );
    }
    Ok(())
}

/// A quinn client endpoint on a socket with a large receive buffer (8 MB,
/// past rmem_max where allowed), so that the clients, not their socket
/// queue, are what a run measures, taking datagrams of up to
/// `max_udp_payload` bytes. A socket that cannot be had is a runtime
/// error.
pub(super) fn client_endpoint(
    bind: SocketAddr,
    max_udp_payload: u16,
) -> anyhow::Result<quinn::Endpoint> {
    let bad = |e: &dyn std::fmt::Display| anyhow!("client socket: {e}");
    let s = fastudp_io::Socket::bind(bind, fastudp_io::Config::default().recv_buffer(8 << 20))
        .map_err(|e| bad(&e))?;
    let (sock, _) = s.into_parts();
    sock.set_nonblocking(true).map_err(|e| bad(&e))?;
    let mut cfg = quinn::EndpointConfig::default();
    cfg.max_udp_payload_size(max_udp_payload)
        .map_err(|e| bad(&e))?;
    quinn::Endpoint::new(cfg, None, sock, Arc::new(quinn::TokioRuntime)).map_err(|e| bad(&e))
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Outcome>>) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Outcome {
            error: Some(format!("client task: {e}")),
            ..Outcome::default()
        }));
    }
    out
}

/// Tracks the bytes of one response as they come.
struct Reader {
    start: Instant,
    prev: Option<Instant>,
    stall_gap: Duration,
}

impl Reader {
    fn new(interval: Duration) -> Self {
        Reader {
            start: Instant::now(),
            prev: None,
            stall_gap: interval * 2,
        }
    }

    fn data(&mut self, o: &mut Outcome, d: &[u8]) {
        let now = Instant::now();
        if let Some(p) = self.prev {
            let gap = now - p;
            o.max_gap = o.max_gap.max(gap);
            if gap > self.stall_gap {
                o.stalls += 1;
            }
        } else {
            o.first = Some(now - self.start);
        }
        self.prev = Some(now);
        o.last = Some(now - self.start);
        if o.wrong_at.is_none() {
            let mut at = 0;
            while at < d.len() {
                let want = hq::pattern(o.bytes + at as u64, (d.len() - at) as u64);
                let got = &d[at..at + want.len()];
                if got != want {
                    o.wrong_at = hq::check(o.bytes + at as u64, got).err();
                    break;
                }
                at += want.len();
            }
        }
        o.bytes += d.len() as u64;
        if let Some((t0, b)) = o.timeline_at {
            let i = ((now - t0).as_nanos() / b.as_nanos().max(1)) as usize;
            let i = i.min(TIMELINE_BUCKETS - 1);
            if o.timeline.len() <= i {
                o.timeline.resize(i + 1, 0);
            }
            o.timeline[i] += d.len() as u64;
        }
    }
}

/// One quinn connection: its request, and the response read to its end.
async fn quic_one(
    ep: &quinn::Endpoint,
    c: &Client,
    answered: &AtomicBool,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let conn = ep
        .connect(c.target.addr, &c.target.sni)
        .map_err(|e| anyhow!("connect: {e}"))?
        .await
        .map_err(|e| {
            // Anything but silence is an answer: a refusal or a close
            // comes from a server.
            if !matches!(e, quinn::ConnectionError::TimedOut) {
                answered.store(true, Relaxed);
            }
            anyhow!("handshake: {e}")
        })?;
    answered.store(true, Relaxed);
    let r = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| anyhow!("{e}"))?;
        send.write_all(c.request.as_bytes())
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let _ = send.finish();
        let mut rd = Reader::new(c.interval);
        loop {
            match recv.read_chunk(64 * 1024, true).await {
                Ok(Some(c)) => rd.data(o, &c.bytes),
                Ok(None) => {
                    o.complete = true;
                    return Ok(());
                }
                Err(e) => {
                    o.reset = matches!(conn.close_reason(), Some(quinn::ConnectionError::Reset));
                    return Err(match conn.close_reason() {
                        Some(why) => anyhow!("stream: {e}: {why}"),
                        None => anyhow!("stream: {e}"),
                    });
                }
            }
        }
    }
    .await;
    let st = conn.stats();
    o.lost_packets = st.path.lost_packets;
    o.sent_packets = st.path.sent_packets;
    o.rx_datagrams = st.udp_rx.datagrams;
    o.rx_udp_bytes = st.udp_rx.bytes;
    conn.close(quinn::VarInt::from_u32(0), b"done");
    r
}

/// One connection of TLS over TCP: its request, and the response read to
/// its end.
async fn tcp_one(
    connector: &tokio_rustls::TlsConnector,
    c: &Client,
    answered: &AtomicBool,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(c.target.addr)
        .await
        .map_err(|e| anyhow!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from(c.target.sni.clone())
        .map_err(|e| anyhow!("server name {}: {e}", c.target.sni))?;
    let mut s = connector.connect(name, tcp).await.map_err(|e| {
        answered.store(true, Relaxed);
        anyhow!("handshake: {e}")
    })?;
    answered.store(true, Relaxed);
    s.write_all(c.request.as_bytes())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    read_all(&mut s, c.interval, o).await
}

async fn read_all<R: AsyncRead + Unpin>(
    r: &mut R,
    interval: Duration,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let mut rd = Reader::new(interval);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => {
                o.complete = true;
                return Ok(());
            }
            Ok(n) => rd.data(o, &buf[..n]),
            // rustls reports a peer that closed without close_notify.
            Err(e) => return Err(anyhow!("read: {e}")),
        }
    }
}

/// The summary of the outcomes, with the timelines under --timeline.
fn summarize(a: &LoadArgs, plan: &Plan, outs: &[Outcome], secs: f64, cpu: f64) -> Summary {
    let (req, interval, target) = (plan.req, plan.interval, &plan.target);
    let (rate, expect) = match req {
        Request::Video { rate, seconds } => {
            let f = Frames::new(rate, seconds, interval);
            (Some(rate), f.total())
        }
        Request::Bytes(n) => (None, n),
    };
    let mut goodputs = Vec::new();
    let mut on_rate = 0usize;
    let mut completed = 0usize;
    let mut errors = Vec::new();
    for o in outs {
        let ok = o.complete && o.error.is_none() && o.bytes == expect && o.wrong_at.is_none();
        if ok {
            completed += 1;
        }
        if let Some(e) = &o.error {
            if errors.len() < 5 {
                errors.push(e.clone());
            }
        } else if o.complete && o.bytes != expect && errors.len() < 5 {
            errors.push(format!("got {} bytes of {expect}", o.bytes));
        }
        if let (Some(f), Some(l)) = (o.first, o.last) {
            // Video: bytes over first-to-last byte plus one frame interval
            // (the last frame's own time); bulk: over request-to-last byte.
            let span = match req {
                Request::Video { .. } => (l - f + interval).as_secs_f64(),
                Request::Bytes(_) => l.as_secs_f64(),
            };
            let g = o.bytes as f64 / span.max(1e-6);
            goodputs.push(g * 8.0 / 1e6);
            if let Some(r) = rate {
                if ok && (g / r as f64 - 1.0).abs() <= 0.05 {
                    on_rate += 1;
                }
            }
        }
    }
    let total: u64 = outs.iter().map(|o| o.bytes).sum();
    let gbit = total as f64 * 8.0 / 1e9;
    Summary {
        stack: match a.stack {
            LoadStack::Quic => "quic",
            LoadStack::TlsTcp => "tls-tcp",
        },
        server: target.shown.clone(),
        request: a.request.clone(),
        connections: outs.len(),
        completed,
        failed: outs.len() - completed,
        wrong_bytes: outs.iter().filter(|o| o.wrong_at.is_some()).count(),
        rate_bytes_s: rate,
        goodput_mbit_s: spread(goodputs),
        on_rate_share: rate.map(|_| on_rate as f64 / outs.len().max(1) as f64),
        stalls: if rate.is_some() {
            outs.iter().map(|o| o.stalls).sum()
        } else {
            0
        },
        stalled_connections: if rate.is_some() {
            outs.iter().filter(|o| o.stalls > 0).count()
        } else {
            0
        },
        max_gap_ms: outs
            .iter()
            .map(|o| o.max_gap.as_secs_f64() * 1e3)
            .fold(0.0, f64::max),
        client_lost_packets: outs.iter().map(|o| o.lost_packets).sum(),
        client_sent_packets: outs.iter().map(|o| o.sent_packets).sum(),
        client_rx_datagrams: outs.iter().map(|o| o.rx_datagrams).sum(),
        client_rx_udp_bytes: outs.iter().map(|o| o.rx_udp_bytes).sum(),
        total_gbit_s: gbit / secs.max(1e-6),
        seconds: secs,
        client_cpu_s: cpu,
        client_cpu_s_per_gbit: (gbit > 1e-3).then(|| cpu / gbit),
        errors,
        stateless_resets: outs.iter().filter(|o| o.reset).count(),
        rebound_endpoints: None,
        started_unix_ms: 0,
        timeline_ms: plan.bucket.and(a.timeline),
        timelines: plan
            .bucket
            .map(|_| outs.iter().map(|o| o.timeline.clone()).collect()),
    }
}

fn print(s: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        return out!("{}", serde_json::to_string(s).unwrap_or_default());
    }
    out!(
        "{} connections to {} ({}, {}): {} completed, {} failed, {} with wrong bytes",
        s.connections,
        s.server,
        s.stack,
        s.request,
        s.completed,
        s.failed,
        s.wrong_bytes
    )?;
    let g = &s.goodput_mbit_s;
    out!(
        "goodput per connection, Mbit/s: min {:.3}, p10 {:.3}, median {:.3}, mean {:.3}, max {:.3}",
        g.min,
        g.p10,
        g.median,
        g.mean,
        g.max
    )?;
    if let Some(share) = s.on_rate_share {
        out!(
            "within 5% of the rate: {:.1}% of connections; {} stalls (gap > 2 frame intervals) on {} connections; longest gap {:.1} ms",
            share * 100.0,
            s.stalls,
            s.stalled_connections,
            s.max_gap_ms
        )?;
    }
    out!(
        "client: {} packets lost of {} sent, {} datagrams received; {:.3} Gbit/s in all over {:.1} s; CPU {:.2} s ({} s/Gbit)",
        s.client_lost_packets,
        s.client_sent_packets,
        s.client_rx_datagrams,
        s.total_gbit_s,
        s.seconds,
        s.client_cpu_s,
        s.client_cpu_s_per_gbit
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into())
    )?;
    if let Some(n) = s.rebound_endpoints {
        out!("rebind: {n} endpoints moved to a new socket")?;
    }
    if s.stateless_resets > 0 {
        out!(
            "{} connections ended by a stateless reset",
            s.stateless_resets
        )?;
    }
    for e in &s.errors {
        out!("error: {e}")?;
    }
    Ok(())
}
