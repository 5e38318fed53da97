//! `fastudp quic serve --stack fastudp`: the command's front end of
//! [`fastudp_quic::Engine`]. It turns the arguments into an
//! [`EngineConfig`], picks the applications (HTTP/3 and hq-interop, by ALPN), loads or
//! makes the certificate, prints where the server listens and its limits,
//! and reports until `--duration` ends, or SIGTERM or Ctrl-C start a
//! drain; the engine does the rest. SIGHUP reads `--cert` and `--key`
//! again; `--metrics` serves Prometheus metrics ([`super::metrics`]).

use super::access_log::{self, AccessLog, LoggedHandler};
use super::config::RouteTo;
use super::stats::{listening, Reporter};
use super::{metrics, proxy, tls, workers, PacingArg, ServeArgs};
use crate::failure::usage;
use crate::interrupt;
use anyhow::{anyhow, Context};
use fastudp_io::pacing::PacingMode;
use fastudp_quic::altsvc;
use fastudp_quic::app::{hq::HqApp, Router};
use fastudp_quic::files::{Descriptors, FileStats, Root, DESCRIPTOR_SHARE};
use fastudp_quic::h3::{
    builtin_handler, FilesHandler, H3App, Handler, MakeHandler, PatternContent, Reply,
};
use fastudp_quic::{limits, Engine, EngineConfig, Pacing};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `fastudp quic serve --stack fastudp`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    // Validate and set up: nothing runs yet.
    let n = workers(&a);
    raise_open_files();
    let id = tls::identity(a.cert.as_deref(), a.key.as_deref())?;
    let (tls, certs) = tls::server_reloadable(&id, a.zero_rtt)?;
    let tls = Arc::new(tls);
    let cfg = engine_config(&a, n, tls.clone())?;
    if let Err(e) = cfg.budget() {
        return Err(usage(e.to_string()));
    }
    let files = www_root(&a)?;
    let (log, log_writer) = match &a.access_log {
        Some(dest) => {
            let (l, w) =
                access_log::open(dest, a.access_log_format).map_err(|e| usage(format!("{e:#}")))?;
            (Some(l), Some(w))
        }
        None => (None, None),
    };
    let proxy = match a.upstream.is_empty() && a.routes.is_empty() {
        true => None,
        false => Some(Arc::new(route_table(&a, files.clone(), log.clone())?)),
    };
    let (app, handler) = match &proxy {
        Some(table) => (proxy_application(&a, table.clone()), None),
        None => {
            let (app, handler) = applications(&a, files.clone(), log.clone());
            (app, Some(handler))
        }
    };
    // Start.
    let files_given = match (&a.cert, &a.key) {
        (Some(cert), Some(key)) => Some(tls::Files {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let json = a.json;
    interrupt::watch_service(move || reload(&certs, files_given.as_ref(), json))
        .map_err(|e| anyhow!("cannot take SIGTERM and SIGHUP: {e}"))?;
    let engine = Engine::start(cfg, Arc::new(app)).map_err(start_error)?;
    let pacing = pacing_in_force(&a, &engine);
    if let Some(e) = engine.zerocopy_error() {
        eprintln!("fastudp: note: --zerocopy: {e}; sending with copies");
    }
    if let Some(e) = engine.uring_error() {
        eprintln!("fastudp: note: --uring: {e}");
    }
    let front = match (&proxy, a.alt_svc_tcp) {
        (Some(table), true) => {
            let addr = engine.local_addr();
            match proxy::TcpFront::start(
                addr,
                (*tls).clone(),
                table.clone(),
                Duration::from_secs_f64(a.upstream_timeout),
                altsvc::MAX_CONNECTIONS,
            )
            .with_context(|| format!("--alt-svc-tcp: TCP {addr}"))
            {
                Ok(f) => Some(f),
                Err(e) => {
                    engine.stop();
                    let _ = engine.join();
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    let tcp = if let (true, Some(handler)) = (a.alt_svc_tcp, handler) {
        match alt_svc_tcp(&a, &engine, tls.clone(), handler) {
            Ok(l) => Some(l),
            Err(e) => {
                engine.stop();
                let _ = engine.join();
                return Err(e);
            }
        }
    } else {
        None
    };
    let admin = match a.metrics {
        Some(addr) => {
            let sources = metrics::Sources {
                engine: engine.monitor(),
                tcp: tcp.as_ref().map(|l| l.stats().clone()),
                proxy_tcp: front.as_ref().map(|f| f.stats.clone()),
                proxy: proxy.clone(),
                admin_refused: Arc::default(),
            };
            match metrics::Server::start(addr, sources).with_context(|| format!("--metrics {addr}"))
            {
                Ok(m) => Some(m),
                Err(e) => {
                    engine.stop();
                    let _ = engine.join();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    // Run until --duration, SIGTERM, Ctrl-C or a worker's failure; then
    // drain (on a signal) and stop.
    let counters = engine.counters().clone();
    let served = announce(&a, &engine, &id, files.as_deref(), tcp.as_ref())
        .and_then(|()| match (&proxy, &front) {
            (Some(table), f) => announce_proxy(table, f.as_ref(), a.json),
            _ => Ok(()),
        })
        .and_then(|()| match &log_writer {
            Some(w) => access_log::announce(w, a.access_log_format, a.json),
            None => Ok(()),
        })
        .and_then(|()| match a.test_endpoints {
            true => announce_test_endpoints(a.json),
            false => Ok(()),
        })
        .and_then(|()| match &admin {
            Some(m) => announce_metrics(m, a.json),
            None => Ok(()),
        })
        .and_then(|()| {
            let rep = Reporter::new(&counters, "fastudp", true)
                .alt_svc(tcp.as_ref().map(|l| l.stats().clone()));
            rep.wait(&counters, a.duration, a.stats, a.json, &pacing, &|| {
                engine.failed()
            })?;
            Ok(rep)
        });
    let drained = if interrupt::requested() && !engine.failed() && a.drain_timeout > 0.0 {
        Some(drain(
            &engine,
            tcp.as_ref(),
            front.as_ref(),
            Duration::from_secs_f64(a.drain_timeout),
            a.json,
        ))
    } else {
        None
    };
    if let Some(l) = tcp {
        l.stop(fastudp_quic::STOP_WAIT);
    }
    if let Some(f) = front {
        f.stop(fastudp_quic::STOP_WAIT);
    }
    engine.stop();
    let joined = engine.join();
    drop(admin);
    // Every request has ended: what the log holds goes out.
    let log_stats = log_writer.map(|w| {
        let s = w.stats.clone();
        w.stop();
        s
    });
    // Report.
    let reported = served.and_then(|rep| {
        rep.summary(&counters, a.json, &pacing)?;
        if let Some(d) = &drained {
            drain_summary(d, a.json)?;
        }
        if let Some(table) = &proxy {
            proxy_summary(table, a.json)?;
        }
        if let Some(s) = &log_stats {
            access_log::summary(s, a.json)?;
        }
        match (&proxy, &files) {
            // The routes' directories (`--www` among them).
            (Some(table), _) => {
                for r in table.routes() {
                    if let proxy::Target::Files { root, .. } = &r.target {
                        files_summary(&root.stats(), a.json)?;
                    }
                }
                Ok(())
            }
            (None, Some(root)) => files_summary(&root.stats(), a.json),
            (None, None) => Ok(()),
        }
    });
    joined.map_err(run_error)?;
    reported?;
    // SIGTERM is how a service manager stops the server: a drain that
    // ends is a clean stop (status 0). Ctrl-C keeps the command's status.
    if interrupt::requested() && !interrupt::terminated() {
        return Err(interrupt::summarized_err());
    }
    Ok(())
}

/// SIGHUP: reads `--cert` and `--key` again; the next handshakes (QUIC
/// and TLS/TCP) get the new certificate, and open connections go on. Bad
/// files are reported, and the certificate in force stays. A
/// `certificate_reload` line says what happened.
fn reload(certs: &tls::Certs, files: Option<&tls::Files>, json: bool) {
    let r = match files {
        Some(f) => certs.reload(&f.cert, &f.key).map_err(|e| format!("{e:#}")),
        None => Err("no --cert and --key to read again; the self-signed certificate stays".into()),
    };
    let spki = certs.spki_sha256();
    if let Err(e) = &r {
        eprintln!("fastudp: SIGHUP: certificate not reloaded: {e}");
    }
    let _ = if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "certificate_reload",
                "ok": r.is_ok(),
                "error": r.as_ref().err(),
                "spki_sha256": spki,
            })
        )
    } else {
        match &r {
            Ok(_) => {
                out!("certificate: reloaded (SIGHUP); SPKI SHA-256 {spki}; new handshakes use it")
            }
            Err(_) => out!(
                "certificate: not reloaded (SIGHUP); the one in force stays, SPKI SHA-256 {spki}"
            ),
        }
    };
}

/// How a drain went.
struct Drained {
    /// How long it took.
    took: Duration,
    /// QUIC connections closed by the drain after their requests.
    closed: u64,
    /// QUIC and TCP connections still open at the drain timeout (the stop
    /// that follows closes them).
    left: u64,
    /// Whether the drain timeout ended it.
    timed_out: bool,
}

/// Drains: new connections refused, GOAWAY to HTTP/3 connections (and
/// hq-interop's new requests refused), `connection: close` over TCP
/// (GOAWAY over HTTP/2), and the requests under way given up to
/// `timeout` to finish. Returns when every connection has closed, the
/// timeout has passed, or a worker failed; a second signal exits at once
/// ([`interrupt`]).
fn drain(
    engine: &Engine,
    tcp: Option<&altsvc::Listener>,
    front: Option<&proxy::TcpFront>,
    timeout: Duration,
    json: bool,
) -> Drained {
    eprintln!(
        "fastudp: draining: new connections refused, requests under way have up to {} s to finish (--drain-timeout); a second signal stops at once",
        timeout.as_secs_f64()
    );
    let t0 = Instant::now();
    let before = engine.counters().drained.load(Relaxed);
    engine.drain();
    if let Some(l) = tcp {
        l.drain();
    }
    if let Some(f) = front {
        f.drain();
    }
    // From here on a newcomer is refused.
    let _ = if json {
        out!(
            "{}",
            serde_json::json!({"kind": "draining", "drain_timeout_s": timeout.as_secs_f64()})
        )
    } else {
        out!("draining: up to {} s", timeout.as_secs_f64())
    };
    let open = || {
        engine.counters().connections.load(Relaxed)
            + tcp.map_or(0, |l| l.open())
            + front.map_or(0, |f| f.open())
    };
    while open() > 0 && t0.elapsed() < timeout && !engine.failed() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = open();
    Drained {
        took: t0.elapsed(),
        closed: engine.counters().drained.load(Relaxed) - before,
        left,
        timed_out: left > 0 && t0.elapsed() >= timeout,
    }
}

/// The `drain` line after the summary.
fn drain_summary(d: &Drained, json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "drain",
                "seconds": d.took.as_secs_f64(),
                "closed_after_requests": d.closed,
                "left_at_timeout": d.left,
                "timed_out": d.timed_out,
            })
        )
    } else {
        out!(
            "drain: {:.3} s; {} QUIC connections closed after their requests; {} connections still open {}",
            d.took.as_secs_f64(),
            d.closed,
            d.left,
            if d.timed_out {
                "at --drain-timeout, closed by the stop"
            } else {
                "at the end"
            }
        )
    }
}

/// Says where the metrics are.
fn announce_metrics(m: &metrics::Server, json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "metrics",
                "url": format!("http://{}/metrics", m.local_addr()),
                "max_connections": metrics::MAX_CONNECTIONS,
                "connection_time_s": metrics::CONNECTION_TIME.as_secs_f64(),
            })
        )
    } else {
        out!(
            "metrics: http://{}/metrics (Prometheus; {} connections at most, each closed after {} s)",
            m.local_addr(),
            metrics::MAX_CONNECTIONS,
            metrics::CONNECTION_TIME.as_secs()
        )
    }
}

/// The engine's configuration from the options.
fn engine_config(
    a: &ServeArgs,
    workers: usize,
    tls: Arc<rustls::ServerConfig>,
) -> anyhow::Result<EngineConfig> {
    let pacing = match a.pacing {
        PacingArg::Quic => Pacing::Quic,
        PacingArg::Kernel => Pacing::Kernel {
            qdisc: crate::host::routes::egress_qdisc(if a.listen.ip().is_unspecified() {
                IpAddr::from([127, 0, 0, 1])
            } else {
                a.listen.ip()
            }),
        },
    };
    let disabled = crate::args::disabled_from_env()?;
    Ok(EngineConfig::new(a.listen, tls)
        .quic_lb(super::quic_lb(a)?)
        .reset_key(super::reset_key(a)?)
        .workers(workers)
        .pacing(pacing)
        .total_rate(a.total_rate)
        .zerocopy(a.zerocopy)
        .uring(a.uring)
        .retry(a.retry)
        .max_half_open(a.max_half_open)
        .max_connections(
            a.max_connections
                .unwrap_or(fastudp_quic::DEFAULT_MAX_CONNECTIONS),
        )
        .max_connections_per_ip(a.max_connections_per_ip)
        .max_memory(a.max_memory)
        .reserve(tcp_reserved(a))
        .idle_timeout(Duration::from_secs_f64(a.idle_timeout))
        .tuning({
            let mut t = fastudp_quic::Tuning::default();
            t.recv_arena = a.recv_arena;
            t.ack_every = a.ack_every;
            t.max_train = a.max_train;
            t.trains_per_turn = a.trains_per_turn;
            t.max_udp_payload = a.max_udp_payload;
            t.timer_tick = Duration::from_micros(a.timer_tick_us);
            t.busy_poll = Duration::from_micros(a.busy_poll_us);
            t.rx_coalesce = Duration::from_micros(a.rx_coalesce_us);
            t.pacing_burst = a.pacing_burst;
            t
        })
        .disabled(disabled))
}

/// `--www DIR`, opened: a path that is not a directory it can open is a
/// usage error.
fn www_root(a: &ServeArgs) -> anyhow::Result<Option<Arc<Root>>> {
    match &a.www {
        Some(dir) => Root::open(dir)
            .map(|r| match a.max_open_files {
                Some(n) => r.descriptors(Descriptors::new(n, (n / DESCRIPTOR_SHARE).max(1))),
                None => r,
            })
            .map(|r| Some(Arc::new(r)))
            .map_err(|e| usage(format!("--www {}: {e}", dir.display()))),
        None => Ok(None),
    }
}

/// The applications: HTTP/3 and hq-interop on one port (the ALPN picks),
/// and the handler HTTP/1.1 and HTTP/2 over TCP share with HTTP/3: the test
/// endpoints with `--test-endpoints`, the files of `--www`, 404 for the
/// rest; each HTTP request logged with `--access-log`.
fn applications(
    a: &ServeArgs,
    files: Option<Arc<Root>>,
    log: Option<AccessLog>,
) -> (Router, Arc<MakeHandler>) {
    let interval = Duration::from_secs_f64(a.interval / 1000.0);
    let mut hq = HqApp::default()
        .request_timeout(Duration::from_secs_f64(a.request_timeout))
        .frame_interval(interval)
        .test_endpoints(a.test_endpoints);
    let h3_files: Option<Arc<MakeHandler>> = files.clone().map(|root| {
        Arc::new(move |_worker: usize| Rc::new(FilesHandler::new(root.clone())) as Rc<dyn Handler>)
            as Arc<MakeHandler>
    });
    if let Some(root) = &files {
        hq = hq.files(root.clone());
    }
    // One handler for HTTP/3 and for HTTP/1.1 and HTTP/2 over TCP: the same bytes.
    let handler = match (a.test_endpoints, h3_files) {
        (true, f) => builtin_handler(interval, f),
        (false, Some(f)) => f,
        (false, None) => Arc::new(|_worker: usize| Rc::new(NotFound) as Rc<dyn Handler>),
    };
    let handler: Arc<MakeHandler> = match log {
        Some(log) => Arc::new(move |worker: usize| {
            Rc::new(LoggedHandler::new(handler(worker), log.clone())) as Rc<dyn Handler>
        }),
        None => handler,
    };
    let app = Router::new()
        .with(
            fastudp_quic::h3::ALPN,
            H3App::new({
                let make = handler.clone();
                move |worker| make(worker)
            })
            .request_timeout(Duration::from_secs_f64(a.request_timeout)),
        )
        .with(super::hq::ALPN, hq);
    (app, handler)
}

/// A handler with nothing to serve: 404 for every path.
struct NotFound;

impl Handler for NotFound {
    fn handle(&self, _req: &http::Request<()>, _now: std::time::Instant) -> Reply {
        Reply::not_found()
    }
}

/// The routes of `--config`, and `--upstream` (the route `/` to its
/// upstreams) or `--www` (the route `/` to its files) beside them; the
/// test endpoints first with `--test-endpoints`.
fn route_table(
    a: &ServeArgs,
    www: Option<Arc<Root>>,
    log: Option<AccessLog>,
) -> anyhow::Result<proxy::Table> {
    let timeout = Duration::from_secs_f64(a.upstream_timeout);
    let skip = Duration::from_secs_f64(a.upstream_fail_duration);
    let upstreams = |urls: &[String], skip: Duration| -> anyhow::Result<proxy::Target> {
        Ok(proxy::Target::Upstreams(Arc::new(
            proxy::Shared::new(urls, timeout)
                .map_err(|e| usage(format!("--upstream {e}")))?
                .fail_duration(skip),
        )))
    };
    let mut routes = Vec::with_capacity(a.routes.len() + 1);
    for r in &a.routes {
        let target = match &r.to {
            RouteTo::Upstreams(urls, fail) => upstreams(urls, fail.unwrap_or(skip))
                .map_err(|e| usage(format!("{}: {e:#}", r.place)))?,
            RouteTo::Www(dir) => {
                let root = Root::open(dir)
                    .map_err(|e| usage(format!("{}: www {}: {e}", r.place, dir.display())))?;
                proxy::Target::Files {
                    root: Arc::new(match a.max_open_files {
                        Some(n) => {
                            root.descriptors(Descriptors::new(n, (n / DESCRIPTOR_SHARE).max(1)))
                        }
                        None => root,
                    }),
                    dir: dir.clone(),
                }
            }
        };
        routes.push(proxy::Route {
            prefix: r.prefix.clone(),
            target,
        });
    }
    if !a.upstream.is_empty() {
        routes.push(proxy::Route {
            prefix: "/".into(),
            target: upstreams(&a.upstream, skip)?,
        });
    }
    if let (Some(root), Some(dir)) = (www, &a.www) {
        routes.push(proxy::Route {
            prefix: "/".into(),
            target: proxy::Target::Files {
                root,
                dir: dir.clone(),
            },
        });
    }
    let test = a
        .test_endpoints
        .then(|| PatternContent::new(Duration::from_secs_f64(a.interval / 1000.0)));
    Ok(proxy::Table::new(routes, test, log))
}

/// The application of `--upstream` and of routes: HTTP/3 answered by the
/// reverse proxy, a pooled client per worker sharing the upstreams'
/// health.
fn proxy_application(a: &ServeArgs, table: Arc<proxy::Table>) -> Router {
    let connect = Duration::from_secs_f64(a.upstream_timeout);
    Router::new().with(
        fastudp_quic::h3::ALPN,
        H3App::service_per_worker(move |_worker| proxy::Proxy::new(table.clone(), connect))
            .request_timeout(Duration::from_secs_f64(a.request_timeout)),
    )
}

/// Says where requests go: each route.
fn announce_proxy(
    table: &proxy::Table,
    front: Option<&proxy::TcpFront>,
    json: bool,
) -> anyhow::Result<()> {
    let tcp = front.map(|f| f.local_addr().to_string());
    let ups: Vec<&str> = table
        .upstream_sets()
        .flat_map(|(_, s)| s.upstreams().iter().map(|u| u.authority()))
        .collect();
    let fail = table
        .upstream_sets()
        .map(|(_, s)| s.skip_time())
        .next()
        .unwrap_or(proxy::FAIL_DURATION);
    let routes: Vec<serde_json::Value> = table
        .routes()
        .iter()
        .map(|r| match &r.target {
            proxy::Target::Upstreams(s) => serde_json::json!({
                "prefix": r.prefix,
                "upstreams": s.upstreams().iter().map(|u| u.authority()).collect::<Vec<_>>(),
                "fail_duration_s": s.skip_time().as_secs_f64(),
            }),
            proxy::Target::Files { dir, .. } => serde_json::json!({
                "prefix": r.prefix,
                "www": dir.display().to_string(),
            }),
        })
        .collect();
    if json {
        return out!(
            "{}",
            serde_json::json!({
                "kind": "proxy",
                "upstreams": ups,
                "routes": routes,
                "tcp": tcp,
                "fail_duration_s": fail.as_secs_f64(),
            })
        );
    }
    for r in table.routes() {
        match &r.target {
            proxy::Target::Upstreams(s) => out!(
                "proxy: {} to http://{} (in turn; one that fails is skipped {} s)",
                r.prefix,
                s.upstreams()
                    .iter()
                    .map(|u| u.authority())
                    .collect::<Vec<_>>()
                    .join(", http://"),
                s.skip_time().as_secs_f64()
            )?,
            proxy::Target::Files { dir, .. } => {
                out!("proxy: {} to the files beneath {}", r.prefix, dir.display())?
            }
        }
    }
    match tcp {
        Some(t) => out!("proxy: TLS over TCP on {t} (HTTP/1.1, HTTP/2)"),
        None => Ok(()),
    }
}

/// Says that the test endpoints are served.
fn announce_test_endpoints(json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "test_endpoints",
                "paths": ["/bytes/N", "/video/RATE/SECONDS"],
                "max_bytes": fastudp_quic::hq::wire::MAX_BYTES,
            })
        )
    } else {
        out!("test endpoints: /bytes/N (up to 1 TiB) and /video/RATE/SECONDS are served (--test-endpoints)")
    }
}

/// What the proxy counted, over every route's upstreams: a `proxy` line
/// after the summary.
fn proxy_summary(table: &proxy::Table, json: bool) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut f, mut b, mut t, mut n, mut x, mut r) = (0, 0, 0, 0, 0, 0);
    let (mut over, mut fds) = (0, 0);
    for (_, s) in table.upstream_sets() {
        let s = &s.stats;
        f += s.forwarded.load(Relaxed);
        b += s.bad_gateway.load(Relaxed);
        t += s.gateway_timeout.load(Relaxed);
        n += s.no_upstream.load(Relaxed);
        x += s.aborted.load(Relaxed);
        r += s.retries.load(Relaxed);
        over += s.over_limit.load(Relaxed);
        fds += s.local_exhausted.load(Relaxed);
    }
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "proxy_summary",
                "forwarded": f,
                "bad_gateway": b,
                "gateway_timeout": t,
                "no_upstream": n,
                "aborted": x,
                "retries": r,
                "over_limit": over,
                "out_of_descriptors": fds,
            })
        )
    } else {
        out!("proxy: {f} forwarded, {b} bad gateway (502), {t} timed out (504), {n} with no upstream (502), {x} aborted mid-response, {r} retried on the next upstream, {over} over the in-flight limits (503), {fds} out of file descriptors (503)")
    }
}

/// Why the engine did not start: a configuration it refuses is a usage
/// error; an address it cannot bind, a socket or thread it cannot set up,
/// a runtime error.
fn start_error(e: fastudp_quic::Error) -> anyhow::Error {
    match e {
        fastudp_quic::Error::Listen { addr, source } => anyhow!("--listen {addr}: {source}"),
        fastudp_quic::Error::Config(m) => usage(m),
        e => anyhow!("{e}"),
    }
}

/// Why the engine stopped on its own: a worker that failed.
fn run_error(e: fastudp_quic::Error) -> anyhow::Error {
    match e {
        fastudp_quic::Error::Worker {
            index,
            kind: fastudp_quic::WorkerError::Panicked,
        } => anyhow!(
            "worker {index} panicked more than {} times (or outside the loop that restarts it); the server stopped",
            fastudp_quic::MAX_RESTARTS
        ),
        e => anyhow!("{e}"),
    }
}

/// The pacing in force and why, for the reports; a note when
/// `--pacing kernel` fell back.
fn pacing_in_force(a: &ServeArgs, engine: &Engine) -> String {
    let (mode, why) = engine.pacing();
    if a.pacing == PacingArg::Kernel && mode != PacingMode::Kernel {
        eprintln!("fastudp: note: --pacing kernel: {why}; quinn-proto's pacer alone paces");
    }
    match mode {
        PacingMode::Kernel => format!("kernel (SCM_TXTIME): {why}"),
        _ if a.pacing == PacingArg::Kernel => format!("quic (fallback from kernel: {why})"),
        _ => format!("quic ({why})"),
    }
}

/// The start-up lines: where the server listens, its certificate, its
/// limits, and the TCP listener of `--alt-svc-tcp`.
fn announce(
    a: &ServeArgs,
    engine: &Engine,
    id: &tls::Identity,
    files: Option<&Root>,
    tcp: Option<&altsvc::Listener>,
) -> anyhow::Result<()> {
    let n = engine.workers();
    listening("fastudp", engine.local_addr(), n, "h3, hq-interop", a.json)?;
    tls::announce(id, a.json)?;
    announce_fleet(a)?;
    announce_limits(a, engine, files)?;
    match tcp {
        Some(l) => announce_tcp(l, a.json),
        None => Ok(()),
    }
}

/// With --server-id or --reset-key: this server's place in its fleet.
fn announce_fleet(a: &ServeArgs) -> anyhow::Result<()> {
    let lb = super::quic_lb(a)?;
    if lb.is_none() && a.reset_key.is_none() {
        return Ok(());
    }
    let shared = a.reset_key.is_some();
    match (&lb, a.json) {
        (Some(lb), true) => out!(
            "{}",
            serde_json::json!({
                "kind": "quic_lb",
                "server_id": lb.server_id().to_string(),
                "lb_config": lb.config().to_string(),
                "first_octet": lb.config().first_octet(),
                "cid_len": lb.config().cid_len(),
                "worker_byte": lb.config().worker_byte(),
                "shared_reset_key": shared,
            })
        ),
        (None, true) => out!(
            "{}",
            serde_json::json!({"kind": "quic_lb", "server_id": null, "shared_reset_key": true})
        ),
        (Some(lb), false) => {
            let c = lb.config();
            out!(
                "QUIC-LB: server ID {} (config {c}): {}-byte connection IDs, first octet 0x{:02x}, workers steered by byte {}; stateless-reset key {}",
                lb.server_id(),
                c.cid_len(),
                c.first_octet(),
                c.worker_byte(),
                if shared { "shared (--reset-key)" } else { "random (this server's own)" }
            )
        }
        (None, false) => out!("stateless-reset key shared (--reset-key)"),
    }
}

/// Raises the soft open-file limit to the hard one (systemd's default
/// soft limit is 1,024); says so when that fails.
fn raise_open_files() {
    if let Err(e) = limits::raise_open_files() {
        eprintln!("fastudp: note: cannot raise the open-file limit (RLIMIT_NOFILE): {e}");
    }
}

/// Says what the limits are: the memory budget and its marks, what a
/// connection is counted and may hold at most, the shares per address,
/// the descriptors.
fn announce_limits(a: &ServeArgs, engine: &Engine, files: Option<&Root>) -> anyhow::Result<()> {
    let workers = engine.workers();
    let b = engine.budget();
    let max_memory = a.max_memory.unwrap_or_else(limits::default_budget);
    let light = limits::held(
        false,
        0,
        u64::from(limits::UNI_STREAMS),
        limits::Grant::Full,
    );
    let max_connections = a
        .max_connections
        .unwrap_or(fastudp_quic::DEFAULT_MAX_CONNECTIONS);
    let places = max_connections.min(b.light_places());
    let per_ip = engine.per_ip();
    let nofile = open_files_limit();
    let fds = files.map(|r| r.descriptor_limits());
    if a.json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "limits",
                "max_memory": max_memory,
                "budget": b.hard(),
                "pressure": b.pressure(),
                "admit": b.admit(),
                "per_worker": limits::per_worker(),
                "light_connection": light,
                "per_connection": limits::per_connection(),
                "max_connections": max_connections,
                "places": places,
                "max_connections_per_ip": per_ip,
                "tcp_reserved": tcp_reserved(a),
                "request_timeout_s": a.request_timeout,
                "idle_timeout_s": a.idle_timeout,
                "stall_timeout_s": limits::STALL_TIMEOUT.as_secs_f64(),
                "streams_per_connection": limits::STREAMS,
                "stream_window": limits::STREAM_WINDOW,
                "connection_window": limits::CONN_WINDOW,
                "open_files_limit": nofile,
                "max_open_files": fds.map(|d| d.total()),
                "max_open_files_per_ip": fds.map(|d| d.per_address()),
            })
        )?;
    } else {
        out!(
            "limits: memory {} MiB (--max-memory): {} workers {} MiB each,{} connections' budget {} MiB, windows shrink above {} MiB, newcomers refused above {} MiB; a light connection is counted {} KiB, one at most {} KiB; {places} connections (light) at most, {per_ip} per client address, when full a newcomer evicts an idle or stalled connection of the address holding the most; a response with no progress for {} s is cut; request timeout {} s; idle timeout {} s",
            max_memory >> 20,
            workers,
            limits::per_worker() >> 20,
            match tcp_reserved(a) {
                0 => String::new(),
                r => format!(" the TLS/TCP listener {} MiB,", r >> 20),
            },
            b.hard() >> 20,
            b.pressure() >> 20,
            b.admit() >> 20,
            light >> 10,
            limits::per_connection() >> 10,
            limits::STALL_TIMEOUT.as_secs(),
            a.request_timeout,
            a.idle_timeout
        )?;
        if let Some(d) = fds {
            out!(
                "files: {} descriptors at most for responses, {} per client address (open-file limit {})",
                d.total(),
                d.per_address(),
                nofile.map_or("unknown".to_string(), |n| n.to_string())
            )?;
        }
    }
    Ok(())
}

/// The soft open-file limit, from /proc/self/limits.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Max open files"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
}

/// The file requests of `--www`, by outcome: a `files` line after the
/// summary.
fn files_summary(s: &FileStats, json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "files",
                "requests": s.requests,
                "served": s.served,
                "not_found": s.not_found,
                "escapes_refused": s.escapes_refused,
                "forbidden": s.forbidden,
                "bad_requests": s.bad_requests,
                "errors": s.errors,
                "unavailable": s.unavailable,
            })
        )
    } else {
        out!(
            "files: {} requests, {} served, {} not found, {} escapes refused, {} forbidden, {} bad, {} errors, {} unavailable (no descriptor)",
            s.requests,
            s.served,
            s.not_found,
            s.escapes_refused,
            s.forbidden,
            s.bad_requests,
            s.errors,
            s.unavailable
        )
    }
}

/// What `--alt-svc-tcp`'s listener may hold at most, taken from
/// `--max-memory` before the QUIC connections' budget: its places'
/// bound ([`altsvc::memory_bound`]); 0 without it, or with `--upstream`
/// or `--route` (the proxy's TLS/TCP front, bounded apart).
fn tcp_reserved(a: &ServeArgs) -> u64 {
    match a.alt_svc_tcp && a.upstream.is_empty() && a.routes.is_empty() {
        true => altsvc::memory_bound(altsvc::MAX_CONNECTIONS),
        false => 0,
    }
}

/// Starts `--alt-svc-tcp`: TLS over TCP on the engine's address and port,
/// advertising HTTP/3 there. A port it cannot take is a runtime error.
fn alt_svc_tcp(
    a: &ServeArgs,
    engine: &Engine,
    tls: Arc<rustls::ServerConfig>,
    handler: Arc<MakeHandler>,
) -> anyhow::Result<altsvc::Listener> {
    let addr = engine.local_addr();
    let mut cfg = altsvc::Config::new(addr, tls, addr.port(), handler);
    cfg.request_timeout = Duration::from_secs_f64(a.request_timeout);
    cfg.idle_timeout = Duration::from_secs_f64(a.idle_timeout);
    altsvc::Listener::start(cfg).with_context(|| format!("--alt-svc-tcp: TCP {addr}"))
}

/// Says where the TCP listener is and what bounds it.
fn announce_tcp(l: &altsvc::Listener, json: bool) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "alt_svc_tcp",
                "addr": l.local_addr().to_string(),
                "alpn": ["h2", "http/1.1"],
                "h2_max_streams": altsvc::H2_MAX_STREAMS,
                "alt_svc": format!("h3=\":{}\"; ma={}", l.local_addr().port(), altsvc::MAX_AGE),
                "max_connections": altsvc::MAX_CONNECTIONS,
                "max_connections_per_ip": l.per_ip(),
                "memory_bound": altsvc::memory_bound(altsvc::MAX_CONNECTIONS),
                "response_bytes_per_connection": altsvc::CONN_BODY,
                "max_head": altsvc::MAX_HEAD,
                "max_requests_per_connection": altsvc::MAX_REQUESTS,
                "send_timeout_s": altsvc::SEND_TIMEOUT.as_secs_f64(),
            })
        )
    } else {
        out!(
            "alt-svc: TLS over TCP on {} (HTTP/1.1, HTTP/2; Alt-Svc h3 on port {}), {} connections at most ({} per address; when full a newcomer evicts an idle or stalled connection of the address holding the most), heads up to {} KiB, {} KiB of responses held per connection, {} MiB at most in all (within --max-memory)",
            l.local_addr(),
            l.local_addr().port(),
            altsvc::MAX_CONNECTIONS,
            l.per_ip(),
            altsvc::MAX_HEAD >> 10,
            altsvc::CONN_BODY >> 10,
            altsvc::memory_bound(altsvc::MAX_CONNECTIONS) >> 20
        )
    }
}
