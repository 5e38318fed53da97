//! `quic serve --metrics ADDR`: the server's figures for Prometheus, on an
//! admin listener of its own (plain HTTP/1.1 over TCP, `GET /metrics`).
//!
//! The figures are read when scraped, from what the engine, the TLS/TCP
//! listener and the proxy already count ([`fastudp_quic::Monitor`],
//! [`altsvc::Stats`], [`proxy::TcpStats`], [`proxy::ProxyStats`]): the
//! metrics add nothing to the path of a datagram or a request. They are
//! encoded by prometheus-client, in the OpenMetrics text format (which
//! Prometheus reads, as it reads its own text format).
//!
//! The listener bounds what a scraper can hold: [`MAX_CONNECTIONS`]
//! connections at once (more are closed at once and counted), a request
//! head within [`HEAD_TIMEOUT`], and each connection closed after
//! [`CONNECTION_TIME`] whatever it does, so a slow or stuck scraper costs
//! one of the places for that long at most. Its thread and runtime are
//! its own: the QUIC workers never wait for it.

use super::proxy;
use bytes::Bytes;
use fastudp_quic::altsvc;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Scrapers' connections open at once, at most.
pub const MAX_CONNECTIONS: usize = 16;
/// The time a scraper has to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection to the admin listener stays open.
pub const CONNECTION_TIME: Duration = Duration::from_secs(30);

/// The OpenMetrics text format's media type, as prometheus-client writes it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The status classes of [`fastudp_quic::status_class`], by index.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What the metrics are read from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The QUIC engine.
    pub engine: fastudp_quic::Monitor,
    /// The TLS/TCP listener of `--alt-svc-tcp` (files, built-in paths).
    pub tcp: Option<Arc<altsvc::Stats>>,
    /// The reverse proxy's TLS/TCP side.
    pub proxy_tcp: Option<Arc<proxy::TcpStats>>,
    /// The reverse proxy's routes.
    pub proxy: Option<Arc<proxy::Table>>,
    /// What the admin listener itself refused.
    pub admin_refused: Arc<AtomicU64>,
}

/// Writes a counter.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

/// Writes a gauge.
fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// Label sets of `N` labels with their values, as the family writers
/// take them.
fn rows<'a, const N: usize>(
    v: &'a [([(&'a str, &'a str); N], u64)],
) -> Vec<(&'a [(&'a str, &'a str)], u64)> {
    v.iter().map(|(k, x)| (&k[..], *x)).collect()
}

/// Writes a counter family.
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&[(&str, &str)], u64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
    for (labels, v) in values {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes a gauge family.
fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&[(&str, &str)], u64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
    for (labels, v) in values {
        ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX)).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let c = self.engine.counters();
        let l = |a: &AtomicU64| a.load(Relaxed);
        // Connections.
        gauge(
            &mut e,
            "quic_connections",
            "QUIC connections open.",
            l(&c.connections),
        )?;
        gauge(
            &mut e,
            "quic_half_open",
            "QUIC connections whose handshake is not done.",
            l(&c.half_open),
        )?;
        counter(
            &mut e,
            "quic_accepted",
            "QUIC connections accepted (handshakes begun).",
            l(&c.accepted),
        )?;
        counter(&mut e, "quic_retries", "Retry packets sent.", l(&c.retries))?;
        let (refused, memory, per_ip, protocol, draining, admission) = (
            l(&c.refused),
            l(&c.refused_memory),
            l(&c.refused_per_ip),
            l(&c.refused_protocol),
            l(&c.refused_draining),
            l(&c.refused_admission),
        );
        let limit = refused.saturating_sub(memory + per_ip + protocol + draining + admission);
        counters(
            &mut e,
            "quic_refused",
            "QUIC connections refused, by reason: the connection limit, the memory budget, the address's share, no application for the ALPN, a drain or stop, the embedder's admission hook.",
            &[
                (&[("reason", "limit")], limit),
                (&[("reason", "memory")], memory),
                (&[("reason", "per_ip")], per_ip),
                (&[("reason", "protocol")], protocol),
                (&[("reason", "draining")], draining),
                (&[("reason", "admission")], admission),
            ],
        )?;
        counter(
            &mut e,
            "quic_evicted",
            "Idle or stalled QUIC connections closed to make room for a newcomer.",
            l(&c.evicted),
        )?;
        counter(
            &mut e,
            "quic_stalled_cut",
            "QUIC connections closed because a response made no progress.",
            l(&c.stalled_cut),
        )?;
        counter(
            &mut e,
            "quic_drained",
            "QUIC connections closed by a drain after their requests were done.",
            l(&c.drained),
        )?;
        gauge(
            &mut e,
            "quic_draining",
            "1 while the server drains (after SIGTERM or Ctrl-C).",
            u64::from(self.engine.draining()),
        )?;
        // Requests.
        let mut by_class: Vec<([(&str, &str); 2], u64)> = Vec::new();
        for (i, class) in CLASSES.iter().enumerate() {
            by_class.push((
                [("transport", "h3"), ("class", class)],
                l(&c.h3_responses[i]),
            ));
        }
        if let Some(t) = &self.tcp {
            for (i, class) in CLASSES.iter().enumerate() {
                by_class.push(([("transport", "tcp"), ("class", class)], l(&t.responses[i])));
            }
        }
        if let Some(t) = &self.proxy_tcp {
            for (i, class) in CLASSES.iter().enumerate() {
                by_class.push(([("transport", "tcp"), ("class", class)], l(&t.responses[i])));
            }
        }
        counters(
            &mut e,
            "http_responses",
            "HTTP responses begun, by transport (h3: HTTP/3; tcp: HTTP/1.1 and HTTP/2 over TLS/TCP) and status class.",
            &rows(&by_class),
        )?;
        counter(
            &mut e,
            "h3_refused",
            "HTTP/3 requests refused before an answer (a malformed or oversized head, a reset, a request past a GOAWAY).",
            l(&c.h3_refused),
        )?;
        counter(
            &mut e,
            "request_timeouts",
            "Request streams reset for not being whole within the request timeout.",
            l(&c.request_timeouts),
        )?;
        counter(
            &mut e,
            "app_panics",
            "Panics in application code caught (the request answered 500 or reset).",
            l(&c.app_panics),
        )?;
        // Bytes and datagrams.
        counter(
            &mut e,
            "quic_app_bytes",
            "Response bytes delivered over QUIC (acknowledged).",
            l(&c.app_bytes),
        )?;
        counter(
            &mut e,
            "quic_wire_bytes",
            "UDP payload bytes handed to the kernel.",
            l(&c.wire_bytes),
        )?;
        counter(
            &mut e,
            "quic_datagrams_sent",
            "Datagrams sent.",
            l(&c.datagrams_sent),
        )?;
        counter(
            &mut e,
            "quic_datagrams_received",
            "Datagrams received.",
            c.datagrams_recv.load(Relaxed),
        )?;
        counter(
            &mut e,
            "quic_send_calls",
            "Send syscalls.",
            l(&c.send_calls),
        )?;
        counter(
            &mut e,
            "quic_recv_calls",
            "Receive syscalls.",
            l(&c.recv_calls),
        )?;
        counter(
            &mut e,
            "quic_lost_packets",
            "Packets the connections declared lost.",
            l(&c.lost_packets),
        )?;
        counter(
            &mut e,
            "quic_forwarded",
            "Datagrams handed to the worker owning their connection.",
            c.forwarded.load(Relaxed),
        )?;
        counters(
            &mut e,
            "quic_datagrams_dropped",
            "Datagrams dropped, by where: not usable by QUIC, a full forwarding ring, a full queue of stateless replies, the host's send queue, a full receive buffer.",
            &[
                (&[("where", "unusable")], c.dropped.load(Relaxed)),
                (&[("where", "forward_ring")], l(&c.forward_dropped)),
                (&[("where", "stateless_queue")], l(&c.stateless_dropped)),
                (&[("where", "send_queue")], l(&c.dropped_locally)),
                (&[("where", "receive_buffer")], l(&c.rx_overflow)),
            ],
        )?;
        // QUIC DATAGRAM frames (RFC 9221), apart from the UDP datagrams
        // above.
        counter(
            &mut e,
            "quic_datagram_frames_read",
            "QUIC DATAGRAM frames the applications read.",
            l(&c.quic_datagrams_read),
        )?;
        counter(
            &mut e,
            "quic_datagram_frames_queued",
            "QUIC DATAGRAM frames the applications queued to send.",
            l(&c.quic_datagrams_queued),
        )?;
        counter(
            &mut e,
            "quic_datagram_frames_blocked",
            "QUIC DATAGRAM frames an application could not queue: the connection's send buffer was full.",
            l(&c.quic_datagrams_blocked),
        )?;
        counter(
            &mut e,
            "quic_datagram_frames_dropped",
            "QUIC DATAGRAM frames received that no application read: pushed out of a full receive buffer, or unread when the connection ended.",
            l(&c.quic_datagrams_dropped),
        )?;
        counter(
            &mut e,
            "quic_send_errors",
            "Send errors.",
            l(&c.send_errors),
        )?;
        counter(
            &mut e,
            "quic_recv_errors",
            "Receive errors.",
            l(&c.recv_errors),
        )?;
        // Memory.
        let b = self.engine.budget();
        gauge(
            &mut e,
            "quic_budget_held_bytes",
            "Memory the connections hold, as the budget counts it.",
            b.held(),
        )?;
        gauge(
            &mut e,
            "quic_budget_peak_bytes",
            "The most the connections held at once.",
            b.peak(),
        )?;
        gauge(
            &mut e,
            "quic_budget_limit_bytes",
            "The budget's hard bound.",
            b.hard(),
        )?;
        // Per worker.
        let ws = self.engine.worker_stats();
        let names: Vec<String> = (0..ws.len()).map(|i| i.to_string()).collect();
        let per = |f: fn(&fastudp_quic::WorkerStats) -> u64| -> Vec<([(&str, &str); 1], u64)> {
            ws.iter()
                .zip(&names)
                .map(|(w, n)| ([("worker", n.as_str())], f(w)))
                .collect()
        };
        let conns = per(|w| w.connections);
        gauges(
            &mut e,
            "quic_worker_connections",
            "QUIC connections in each worker's table.",
            &rows(&conns),
        )?;
        for (name, help, f) in [
            (
                "quic_worker_datagrams_sent",
                "Datagrams each worker sent.",
                (|w: &fastudp_quic::WorkerStats| w.datagrams_sent) as fn(&_) -> u64,
            ),
            (
                "quic_worker_datagrams_received",
                "Datagrams each worker received.",
                |w| w.datagrams_received,
            ),
            (
                "quic_worker_send_calls",
                "Each worker's send syscalls.",
                |w| w.send_calls,
            ),
            (
                "quic_worker_recv_calls",
                "Each worker's receive syscalls.",
                |w| w.recv_calls,
            ),
            (
                "quic_worker_rx_overflow",
                "Datagrams the kernel dropped at each worker's full receive buffer.",
                |w| w.rx_overflow,
            ),
            (
                "quic_worker_restarts",
                "Times each worker was made again after a panic in its loop.",
                |w| w.restarts,
            ),
        ] {
            let v = per(f);
            counters(&mut e, name, help, &rows(&v))?;
        }
        // TLS/TCP.
        if let Some(t) = &self.tcp {
            gauge(
                &mut e,
                "tcp_connections",
                "TLS/TCP connections open.",
                l(&t.open),
            )?;
            counter(
                &mut e,
                "tcp_bytes_sent",
                "Response bytes handed to TLS over TCP.",
                l(&t.bytes_sent),
            )?;
            let closed: Vec<([(&str, &str); 1], u64)> = vec![
                ([("reason", "tls_failed")], l(&t.tls_failed)),
                ([("reason", "head_timeout")], l(&t.request_timeouts)),
                ([("reason", "idle")], l(&t.idle_closed)),
                ([("reason", "send_timeout")], l(&t.send_failed)),
                ([("reason", "evicted")], l(&t.evicted)),
                ([("reason", "h2_goaway")], l(&t.protocol_closed)),
            ];
            counters(
                &mut e,
                "tcp_closed",
                "TLS/TCP connections the listener's bounds closed, by reason: a failed TLS handshake, no complete request head (or handshake) in time, idle, a response the client did not take within the send deadline, evicted for a newcomer while every place was taken, closed by h2 with GOAWAY for the client's errors (rapid reset, floods, malformed frames).",
                &rows(&closed),
            )?;
            gauge(
                &mut e,
                "tcp_response_bytes_held",
                "Response bytes the TLS/TCP listener holds: read from handlers' bodies and not yet written whole to TLS (64 KiB per connection at most).",
                l(&t.held),
            )?;
            counter(
                &mut e,
                "tcp_bad_requests",
                "TLS/TCP requests refused as malformed or not served (400, 413, 431, 501).",
                l(&t.bad_requests),
            )?;
        }
        // The TCP listener is the files' (`tcp`) or the proxy's
        // (`proxy_tcp`), never both: one family each.
        let tcp_counts = match (&self.tcp, &self.proxy_tcp) {
            (Some(t), _) => Some((l(&t.accepted), l(&t.refused))),
            (None, Some(t)) => Some((l(&t.accepted), l(&t.refused))),
            (None, None) => None,
        };
        if let (None, Some(t)) = (&self.tcp, &self.proxy_tcp) {
            proxy_tcp(&mut e, t)?;
        }
        if let Some((accepted, refused)) = tcp_counts {
            counter(
                &mut e,
                "tcp_accepted",
                "TLS/TCP connections accepted.",
                accepted,
            )?;
            counter(
                &mut e,
                "tcp_refused",
                "TLS/TCP connections closed at once (the listener's bounds).",
                refused,
            )?;
        }
        if let Some(table) = &self.proxy {
            // By route: the path prefix its upstreams serve.
            let sets: Vec<(&str, &proxy::ProxyStats)> = table
                .upstream_sets()
                .map(|(prefix, s)| (prefix, &s.stats))
                .collect();
            let forwarded: Vec<([(&str, &str); 1], u64)> = sets
                .iter()
                .map(|(p, s)| ([("route", *p)], l(&s.forwarded)))
                .collect();
            counters(
                &mut e,
                "proxy_forwarded",
                "Requests an upstream answered, by route (path prefix).",
                &rows(&forwarded),
            )?;
            let retries: Vec<([(&str, &str); 1], u64)> = sets
                .iter()
                .map(|(p, s)| ([("route", *p)], l(&s.retries)))
                .collect();
            counters(
                &mut e,
                "proxy_retries",
                "Requests sent again to the route's next upstream because one refused the connection before any of the body went to it, by route.",
                &rows(&retries),
            )?;
            let dropped: Vec<([(&str, &str); 1], u64)> = sets
                .iter()
                .map(|(p, s)| ([("route", *p)], l(&s.headers_dropped)))
                .collect();
            counters(
                &mut e,
                "proxy_headers_dropped",
                "Request headers not passed to an upstream (names with '_', X-Real-IP and the like), by route.",
                &rows(&dropped),
            )?;
            let mut failures: Vec<([(&str, &str); 2], u64)> = Vec::new();
            for (p, s) in &sets {
                for (kind, v) in [
                    ("bad_gateway", &s.bad_gateway),
                    ("gateway_timeout", &s.gateway_timeout),
                    ("no_upstream", &s.no_upstream),
                    ("aborted", &s.aborted),
                    ("over_limit", &s.over_limit),
                    ("out_of_descriptors", &s.local_exhausted),
                ] {
                    failures.push(([("route", *p), ("kind", kind)], l(v)));
                }
            }
            counters(
                &mut e,
                "proxy_failures",
                "Requests the upstreams failed, by route and kind: refused or broken before the head (502), no head in time (504), every upstream skipped (502), broken mid-response, too many in flight for the client or route (503), the proxy out of file descriptors (503).",
                &rows(&failures),
            )?;
        }
        counter(
            &mut e,
            "admin_refused",
            "Connections to the metrics listener closed at once (too many open).",
            l(&self.admin_refused),
        )?;
        Ok(())
    }
}

/// The text of one scrape.
pub fn render(sources: &Sources) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("fastudp");
    r.register_collector(Box::new(sources.clone()));
    let mut out = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut out, &r)?;
    Ok(out)
}

/// The admin listener: runs until dropped.
pub struct Server {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl Server {
    /// Binds `addr` (TCP) and serves the metrics of `sources` there.
    pub fn start(addr: SocketAddr, sources: Sources) -> anyhow::Result<Server> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fastudp-metrics")
            .enable_all()
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        rt.spawn(accept(listener, Arc::new(sources)));
        Ok(Server { addr, rt: Some(rt) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

async fn accept(l: tokio::net::TcpListener, sources: Arc<Sources>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((tcp, _)) = l.accept().await else {
            // EMFILE and the like: wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            sources.admin_refused.fetch_add(1, Relaxed);
            drop(tcp);
            continue;
        };
        let sources = sources.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = answer(&req, &sources);
                async move { Ok::<_, Infallible>(r) }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(16 * 1024);
            let conn = b.serve_connection(TokioIo::new(tcp), svc);
            // Whatever the scraper does, the connection ends by then.
            let _ = tokio::time::timeout(CONNECTION_TIME, conn).await;
        });
    }
}

/// The answer to one request: the metrics at `GET /metrics`.
fn answer(req: &Request<hyper::body::Incoming>, sources: &Sources) -> Response<Full<Bytes>> {
    let status = |s: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = s;
        r
    };
    if req.uri().path() != "/metrics" {
        return status(StatusCode::NOT_FOUND, "the metrics are at /metrics\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = status(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match render(sources) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(CONTENT_TYPE),
            );
            r
        }
        Err(_) => status(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
    }
}

/// The proxy's TLS/TCP side: connections open, and those its bounds
/// closed.
fn proxy_tcp(e: &mut DescriptorEncoder, t: &proxy::TcpStats) -> std::fmt::Result {
    let l = |v: &std::sync::atomic::AtomicU64| v.load(std::sync::atomic::Ordering::Relaxed);
    gauge(
        e,
        "tcp_connections",
        "TLS/TCP connections open.",
        l(&t.open),
    )?;
    let closed: Vec<([(&str, &str); 1], u64)> = vec![
        ([("reason", "per_ip")], l(&t.refused_per_ip)),
        ([("reason", "head_timeout")], l(&t.head_timeouts)),
        ([("reason", "idle")], l(&t.idle_closed)),
        ([("reason", "send_timeout")], l(&t.send_timeouts)),
    ];
    counters(
        e,
        "proxy_tcp_closed",
        "The proxy's TLS/TCP connections its bounds closed, by reason: refused at once for their address's share, no complete request head in time, idle, the client took no bytes within the send deadline.",
        &rows(&closed),
    )
}
