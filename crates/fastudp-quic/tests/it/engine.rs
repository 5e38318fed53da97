//! The engine with applications of its own, on loopback, against quinn
//! clients: the handshake and the ALPN routing, hq-interop byte-exact,
//! the write rule (write until Blocked, wait for Writable), timeouts,
//! refusals and the admission policy, and the embedding example.

#[cfg(feature = "h3")]
#[path = "engine/altsvc.rs"]
mod altsvc;
#[path = "../../examples/embed.rs"]
#[allow(dead_code)] // its `main`
mod embed;
#[path = "engine/platform.rs"]
mod platform;
#[path = "engine/restart.rs"]
mod restart;
#[cfg(all(feature = "uring", target_os = "linux"))]
#[path = "engine/uring.rs"]
mod uring;

use bytes::Bytes;
use fastudp_quic::app::hq::HqApp;
use fastudp_quic::app::{
    AppCx, AppEvent, Application, Closed, ConnApp, ConnInfo, Dir, Read, Router, StreamId,
    WorkerApp, Write, REFUSED,
};
use fastudp_quic::hq::wire as hq;
use fastudp_quic::{Engine, EngineConfig, Error};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) type Cert = rustls::pki_types::CertificateDer<'static>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A TLS 1.3 server configuration with a self-signed certificate.
fn server_tls() -> (Arc<rustls::ServerConfig>, Cert) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(c.key_pair.serialize_der());
    let tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![c.cert.der().clone()], key.into())
        .unwrap();
    (Arc::new(tls), c.cert.der().clone())
}

/// An engine on 127.0.0.1 (two workers unless `f` says otherwise)
/// serving `app` with a self-signed certificate, and that certificate.
pub(crate) fn start(
    app: impl Application,
    f: impl FnOnce(EngineConfig) -> EngineConfig,
) -> (Engine, Cert) {
    let (tls, cert) = server_tls();
    let cfg = f(EngineConfig::new("127.0.0.1:0".parse().unwrap(), tls).workers(2));
    (Engine::start(cfg, Arc::new(app)).unwrap(), cert)
}

/// A quinn client endpoint that trusts `cert`, offers `alpn`, and grants
/// `window` bytes per stream if given.
fn client(cert: Cert, alpn: &[u8], window: Option<u32>) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    if let Some(w) = window {
        let mut t = quinn::TransportConfig::default();
        t.stream_receive_window(w.into());
        cfg.transport_config(Arc::new(t));
    }
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> anyhow::Result<quinn::Connection> {
    Ok(ep.connect(addr, "localhost")?.await?)
}

/// `GET /bytes/N` for every size in `sizes`, all at once on `conn`, each
/// answer checked byte for byte; the bytes served.
async fn fetch_bytes_at_once(conn: &quinn::Connection, sizes: impl Iterator<Item = u64>) -> u64 {
    let mut tasks = Vec::new();
    for n in sizes {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let body = fetch(&conn, format!("GET /bytes/{n}\r\n").as_bytes())
                .await
                .unwrap();
            assert_eq!(body.len() as u64, n);
            assert_eq!(hq::check(0, &body), Ok(()));
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// Sends `request` on a new stream; the whole answer, or why not.
async fn fetch(conn: &quinn::Connection, request: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(request).await?;
    let _ = send.finish();
    Ok(recv.read_to_end(1 << 30).await?)
}

/// Waits up to 5 s for `f`.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < t, "{what}: not within 5 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stop(engine: Engine) {
    engine.stop();
    engine.join().unwrap();
}

#[test]
fn the_embedding_example_echoes_every_byte() {
    let o = embed::run(1 << 20).expect("the example runs");
    assert_eq!(o.echoed, 1 << 20);
    assert_eq!(o.goodput, 1 << 20, "acknowledged bytes counted");
}

/// hq-interop through the router: 16 requests at once on one connection,
/// each answer byte-exact; the goodput counts every acknowledged byte; a
/// unidirectional stream is stopped.
#[test]
fn hq_answers_sixteen_parallel_requests_byte_exact() {
    let (engine, cert) = start(Router::new().with(hq::ALPN, HqApp::default()), |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, hq::ALPN, None);
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        let total = fetch_bytes_at_once(&conn, (0..16).map(|i| 10_000 + i * 7_919)).await;
        eventually("goodput", || {
            engine.counters().app_bytes.load(Relaxed) == total
        });
        let mut uni = conn.open_uni().await.unwrap();
        let _ = uni.write_all(b"nothing for hq").await;
        let code = uni.stopped().await.unwrap();
        assert_eq!(code, Some(0u32.into()), "hq stops a unidirectional stream");
        conn.close(0u32.into(), b"");
    });
    stop(engine);
}

/// A protocol no application speaks: TLS refuses the handshake.
#[test]
fn an_unknown_alpn_is_refused_in_the_handshake() {
    let (engine, cert) = start(Router::new().with(hq::ALPN, HqApp::default()), |c| c);
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"h9", None);
    let r = rt.block_on(connect(&ep, engine.local_addr()));
    let e = r.expect_err("no common protocol").to_string();
    assert!(e.contains("120") || e.contains("protocol"), "{e}");
    stop(engine);
}

/// What a [`Writer`] saw, shared with the test.
#[derive(Default)]
struct Seen {
    writable: AtomicUsize,
    blocked: AtomicUsize,
    timeouts: AtomicUsize,
    closed: Mutex<Vec<Closed>>,
    infos: Mutex<Vec<(Vec<u8>, ConnInfo)>>,
}

/// Answers any request with `len` bytes of the hq pattern, written by the
/// rule: until Blocked, then on Writable. With `late`, the answer starts
/// only at a timeout that long after the request.
#[derive(Clone)]
struct Writer {
    len: u64,
    late: Option<Duration>,
    refuse: bool,
    seen: Arc<Seen>,
}

impl Application for Writer {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![b"test".to_vec()]
    }
    fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
        Box::new(self.clone())
    }
}

impl WorkerApp for Writer {
    fn accept(&mut self, alpn: &[u8], info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        self.seen
            .infos
            .lock()
            .unwrap()
            .push((alpn.to_vec(), info.clone()));
        (!self.refuse).then(|| {
            Box::new(WriterConn {
                w: self.clone(),
                streams: Vec::new(),
                due: None,
            }) as Box<dyn ConnApp>
        })
    }
}

struct WriterConn {
    w: Writer,
    /// Streams and the bytes written on each.
    streams: Vec<(StreamId, u64)>,
    due: Option<Instant>,
}

impl WriterConn {
    fn write(&mut self, cx: &mut AppCx<'_>, i: usize) {
        let (id, mut off) = self.streams[i];
        while off < self.w.len {
            let mut piece = [Bytes::from_static(hq::pattern(off, self.w.len - off))];
            match cx.write(id, &mut piece) {
                Write::All(n) => off += n as u64,
                Write::Blocked(n) => {
                    off += n as u64;
                    self.w.seen.blocked.fetch_add(1, Relaxed);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        self.streams[i].1 = off;
        if off == self.w.len {
            assert!(cx.finish(id, off));
        }
    }
}

impl ConnApp for WriterConn {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        match ev {
            AppEvent::Opened(id) => {
                assert_eq!(id.dir(), Dir::Bi);
                assert!(id.client_initiated());
                // The request itself is not looked at.
                while let Read::Data(_) = cx.read(id, 1 << 16) {}
                self.streams.push((id, 0));
                match self.w.late {
                    Some(d) => self.due = Some(cx.now() + d),
                    None => self.write(cx, self.streams.len() - 1),
                }
            }
            AppEvent::Writable(id) => {
                self.w.seen.writable.fetch_add(1, Relaxed);
                let i = self.streams.iter().position(|s| s.0 == id).unwrap();
                self.write(cx, i);
            }
            AppEvent::Timeout => {
                self.w.seen.timeouts.fetch_add(1, Relaxed);
                self.due = None;
                for i in 0..self.streams.len() {
                    self.write(cx, i);
                }
            }
            _ => {}
        }
    }
    fn timeout(&self) -> Option<Instant> {
        self.due
    }
    fn on_closed(&mut self, reason: Closed) {
        self.w.seen.closed.lock().unwrap().push(reason);
    }
}

fn writer(len: u64) -> Writer {
    Writer {
        len,
        late: None,
        refuse: false,
        seen: Arc::default(),
    }
}

/// A client that grants 4 KiB per stream: the response of 1 MiB is written
/// in many pieces, each after a Writable, and arrives whole; the
/// connection's end reaches the application with the client's code.
#[test]
fn a_small_client_window_gives_many_writable_and_the_answer_completes() {
    let w = writer(1 << 20);
    let seen = w.seen.clone();
    let (engine, cert) = start(w, |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", Some(4096));
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        let body = fetch(&conn, b"x").await.unwrap();
        assert_eq!(body.len(), 1 << 20);
        assert_eq!(hq::check(0, &body), Ok(()));
        conn.close(7u32.into(), b"bye");
        ep.wait_idle().await;
    });
    let (writable, blocked) = (seen.writable.load(Relaxed), seen.blocked.load(Relaxed));
    // 1 MiB through a 4 KiB window: about 256 refusals, each followed by
    // a Writable (the last refusal's Writable may come after the end).
    assert!(blocked >= 64, "blocked {blocked} times");
    assert!(
        writable + 1 >= blocked,
        "{writable} Writable for {blocked} blocks"
    );
    eventually("the connection's end", || {
        !seen.closed.lock().unwrap().is_empty()
    });
    assert_eq!(seen.closed.lock().unwrap()[0], Closed::ByPeer(7));
    let infos = seen.infos.lock().unwrap();
    assert_eq!(infos[0].0, b"test");
    assert_eq!(infos[0].1.remote.ip(), addr.ip());
    assert_eq!(infos[0].1.server_name.as_deref(), Some("localhost"));
    drop(infos);
    eventually("goodput", || {
        engine.counters().app_bytes.load(Relaxed) == 1 << 20
    });
    stop(engine);
}

/// The application's timeout is part of the connection's timer: the
/// answer starts when it comes, not before.
#[test]
fn the_application_timeout_fires() {
    let mut w = writer(1000);
    w.late = Some(Duration::from_millis(200));
    let seen = w.seen.clone();
    let (engine, cert) = start(w, |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", None);
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        let t = Instant::now();
        let body = fetch(&conn, b"x").await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(body.len(), 1000);
        conn.close(0u32.into(), b"");
    });
    assert_eq!(seen.timeouts.load(Relaxed), 1);
    stop(engine);
}

/// An application that takes no connection: it is closed with
/// [`REFUSED`] and counted.
#[test]
fn a_connection_the_application_refuses_is_closed_and_counted() {
    let mut w = writer(10);
    w.refuse = true;
    let (engine, cert) = start(w, |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", None);
    rt.block_on(async {
        // The refusal comes during the handshake, where QUIC carries an
        // application's close as a transport APPLICATION_ERROR (RFC 9000
        // 10.2.3); a client that finished its side sees the code itself.
        match connect(&ep, addr).await {
            Err(e) => assert!(e.to_string().contains("the application"), "{e}"),
            Ok(conn) => {
                let e = conn.closed().await;
                assert!(
                    matches!(&e, quinn::ConnectionError::ApplicationClosed(c)
                        if c.error_code == REFUSED.into()),
                    "{e}"
                );
            }
        }
    });
    assert_eq!(engine.counters().refused.load(Relaxed), 1);
    stop(engine);
}

/// The admission policy: with `max_connections` 1 the second client is
/// refused; with `retry` every client is validated first, and served.
#[test]
fn admission_refuses_over_the_limit_and_retries_when_asked() {
    let (engine, cert) = start(writer(100), |c| c.max_connections(1));
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert.clone(), b"test", None);
    rt.block_on(async {
        let first = connect(&ep, addr).await.unwrap();
        assert_eq!(fetch(&first, b"x").await.unwrap().len(), 100);
        let second = connect(&ep, addr).await;
        assert!(second.is_err(), "a second connection over the limit");
        first.close(0u32.into(), b"");
    });
    assert_eq!(engine.counters().refused.load(Relaxed), 1);
    assert_eq!(engine.counters().accepted.load(Relaxed), 1);
    stop(engine);

    let (engine, cert) = start(writer(100), |c| c.retry(true));
    let addr = engine.local_addr();
    let ep = client(cert, b"test", None);
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        assert_eq!(fetch(&conn, b"x").await.unwrap().len(), 100);
        conn.close(0u32.into(), b"");
    });
    assert_eq!(engine.counters().retries.load(Relaxed), 1);
    stop(engine);
}

/// A quinn client endpoint on `local` (any 127.0.0.0/8 address binds on
/// loopback), trusting `cert`, sending a PING every `keep_alive`.
fn client_at(cert: Cert, alpn: &[u8], local: &str, keep_alive: Duration) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(keep_alive));
    cfg.transport_config(Arc::new(t));
    let mut ep = quinn::Endpoint::client(local.parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

/// Fairness when full, on sockets: 5 addresses hold every place
/// (`max_connections` 20), kept alive with PINGs. A client from a sixth
/// address gets in (after a Retry, by evicting an idle connection of an
/// address holding the most) and is served; the evicted client is told
/// why (0x107, H3_EXCESSIVE_LOAD). Before eviction existed, it was
/// refused for as long as the attackers wished.
#[test]
fn a_newcomer_gets_in_while_five_addresses_hold_every_place() {
    let (engine, cert) = start(writer(100), |c| c.max_connections(20));
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let mut held = Vec::new();
        let mut eps = Vec::new();
        for a in 11..16 {
            let ep = client_at(
                cert.clone(),
                b"test",
                &format!("127.0.0.{a}:0"),
                Duration::from_millis(500),
            );
            for _ in 0..4 {
                held.push(connect(&ep, addr).await.unwrap());
            }
            eps.push(ep);
        }
        assert_eq!(engine.counters().connections.load(Relaxed), 20);
        // One attacker address more: every address holds as many, nobody
        // is evicted.
        assert!(connect(&eps[0], addr).await.is_err());
        assert_eq!(engine.counters().evicted.load(Relaxed), 0);
        let new = client_at(
            cert.clone(),
            b"test",
            "127.0.0.16:0",
            Duration::from_secs(1),
        );
        let conn = tokio::time::timeout(Duration::from_secs(10), connect(&new, addr))
            .await
            .expect("the newcomer waited 10 s")
            .expect("the newcomer was refused");
        assert_eq!(fetch(&conn, b"x").await.unwrap().len(), 100);
        assert_eq!(engine.counters().evicted.load(Relaxed), 1);
        let mut gone = None;
        for _ in 0..100 {
            gone = held.iter().find_map(|c| c.close_reason());
            if gone.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match gone {
            Some(quinn::ConnectionError::ApplicationClosed(a)) => {
                assert_eq!(a.error_code, 0x107u32.into())
            }
            other => panic!("no attacker was evicted: {other:?}"),
        }
        conn.close(0u32.into(), b"");
        for c in held {
            c.close(0u32.into(), b"");
        }
    });
    assert!(engine.counters().retries.load(Relaxed) >= 1);
    stop(engine);
}

/// Bad configurations are refused before anything starts.
#[test]
fn bad_configurations_are_refused() {
    let (tls, _) = server_tls();
    let cfg = EngineConfig::new("127.0.0.1:0".parse().unwrap(), tls.clone()).workers(0);
    let e = Engine::start(cfg, Arc::new(writer(1))).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
    let cfg = EngineConfig::new("127.0.0.1:0".parse().unwrap(), tls);
    let e = Engine::start(cfg, Arc::new(Router::new())).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
}

/// A TLS configuration QUIC cannot use is refused at start with a typed
/// error an embedder can match: a provider without QUIC's Initial suite,
/// and a configuration rustls refuses for QUIC.
#[test]
fn tls_configurations_quic_cannot_use_are_refused_by_kind() {
    use fastudp_quic::TlsError;
    use rustls::CipherSuite;
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let make = |p: rustls::crypto::CryptoProvider| {
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(c.key_pair.serialize_der());
        rustls::ServerConfig::builder_with_provider(Arc::new(p))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![c.cert.der().clone()], key.into())
            .unwrap()
    };
    let start = |tls: rustls::ServerConfig| {
        let cfg = EngineConfig::new("127.0.0.1:0".parse().unwrap(), Arc::new(tls)).workers(1);
        Engine::start(cfg, Arc::new(writer(1))).unwrap_err()
    };
    // Only AES-256-GCM: QUIC's Initial packets need AES-128-GCM.
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites
        .retain(|s| s.suite() == CipherSuite::TLS13_AES_256_GCM_SHA384);
    let e = start(make(p));
    assert!(
        matches!(e, Error::Tls(TlsError::NoInitialCipherSuite(_))),
        "{e:?}"
    );
    assert!(std::error::Error::source(&e).is_some(), "{e:?}");
    assert!(e.to_string().contains("TLS_AES_128_GCM_SHA256"), "{e}");
    // Early data of a size QUIC does not allow (RFC 9001 4.6.1).
    let mut tls = make(rustls::crypto::aws_lc_rs::default_provider());
    tls.max_early_data_size = 1000;
    let e = start(tls);
    assert!(
        matches!(e, Error::Tls(TlsError::Refused(rustls::Error::General(_)))),
        "{e:?}"
    );
    assert!(e.to_string().contains("max early data"), "{e}");
}

/// Every connection's place is given back when it ends.
#[test]
fn connections_are_counted_while_open() {
    let (engine, cert) = start(writer(10), |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", None);
    let open = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        assert_eq!(fetch(&conn, b"x").await.unwrap().len(), 10);
        open.store(engine.counters().connections.load(Relaxed), Relaxed);
        conn.close(0u32.into(), b"");
        ep.wait_idle().await;
    });
    assert_eq!(open.load(Relaxed), 1);
    eventually("the place given back", || {
        engine.counters().connections.load(Relaxed) == 0
    });
    stop(engine);
}

/// Datagrams received by two workers: each worker counts its own in its
/// share of `datagrams_recv`, each share is what that worker's socket
/// received, and the counter and the snapshot give the sum. Short headers
/// whose connection ID starts with 1 are worker 1's, with 2 worker 0's;
/// their sizes grow one by one, so that GRO joins none of them and the
/// sockets' message counts are datagram counts.
#[test]
fn two_workers_count_received_datagrams_in_their_own_shares() {
    let (engine, _cert) = start(writer(10), |c| c);
    assert_eq!(engine.workers(), 2);
    let to = engine.local_addr();
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..50usize {
        let mut d = vec![0x40, if i % 5 < 3 { 1 } else { 2 }];
        d.resize(100 + i, 0x5a);
        peer.send_to(&d, to).unwrap();
    }
    eventually("50 datagrams counted", || {
        engine.stats().datagrams_recv == 50
            && engine
                .worker_stats()
                .iter()
                .map(|w| w.datagrams_received)
                .sum::<u64>()
                == 50
    });
    let c = engine.counters();
    let workers = engine.worker_stats();
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(
            c.datagrams_recv.share(i),
            w.datagrams_received,
            "worker {i}'s share is what its socket received"
        );
    }
    assert_eq!(c.datagrams_recv.share(0) + c.datagrams_recv.share(1), 50);
    assert_eq!(c.datagrams_recv.load(Relaxed), 50);
    assert_eq!(engine.stats().datagrams_recv, 50);
    stop(engine);
}

/// An engine dropped without `join` stops: its workers end and the port
/// is free again.
#[test]
fn a_dropped_engine_stops_its_workers() {
    let (engine, _) = start(writer(10), |c| c);
    let addr = engine.local_addr();
    assert!(
        std::net::UdpSocket::bind(addr).is_err(),
        "the port is taken"
    );
    drop(engine);
    eventually("the port free", || std::net::UdpSocket::bind(addr).is_ok());
}

/// A client that moves during a response, as the interop runner's
/// `rebind-port` and `rebind-addr` cases make it (a NAT that gives it a
/// new port, then a new address): the server validates each new path
/// within the 3x limit and goes on; the 4 MB answer arrives byte-exact.
#[test]
fn a_client_that_moves_mid_response_gets_it_whole() {
    let (engine, cert) = start(Router::new().with(hq::ALPN, HqApp::default()), |c| c);
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    // 64 KiB of stream window: the response crosses many round trips, so
    // the moves fall in the middle of it.
    let ep = client(cert, hq::ALPN, Some(64 * 1024));
    const N: usize = 4_000_000;
    let moves = ["127.0.0.1:0", "127.0.0.2:0"];
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            let conn = connect(&ep, addr).await.unwrap();
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(format!("GET /bytes/{N}\r\n").as_bytes())
                .await
                .unwrap();
            let _ = send.finish();
            let mut body = Vec::with_capacity(N);
            let mut moved = 0;
            while let Some(c) = recv.read_chunk(usize::MAX, true).await.unwrap() {
                body.extend_from_slice(&c.bytes);
                if moved < moves.len() && body.len() > (moved + 1) * N / 3 {
                    let from = moves[moved];
                    ep.rebind(std::net::UdpSocket::bind(from).unwrap()).unwrap();
                    moved += 1;
                }
            }
            assert_eq!(moved, moves.len(), "the client did not move");
            assert_eq!(body.len(), N);
            assert_eq!(hq::check(0, &body), Ok(()));
            assert_eq!(ep.local_addr().unwrap().ip().to_string(), "127.0.0.2");
            // The server answers on the last path too.
            let again = fetch(&conn, b"GET /bytes/1000\r\n").await.unwrap();
            assert_eq!(again.len(), 1000);
            conn.close(0u32.into(), b"");
        })
        .await
        .expect("a hang guard");
    });
    stop(engine);
}
