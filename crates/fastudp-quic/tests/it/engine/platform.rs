//! What an embedder configures and decides: the transport (windows,
//! streams, keep-alive, DATAGRAM frames) as a quinn client sees it and
//! as the memory budget counts it.

use super::{client, connect, eventually, rt, start, stop};
use fastudp_quic::app::{AppCx, AppEvent, Application, CloseCodes, ConnApp, ConnInfo, WorkerApp};
use fastudp_quic::limits::Grant;
use fastudp_quic::{Engine, Stats, Transport};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Accepts every connection and stream and reads nothing: what a client
/// may send is what the server's flow control granted. Keeps each
/// connection's facts.
#[derive(Clone, Default)]
struct Silent {
    infos: Arc<Mutex<Vec<ConnInfo>>>,
    /// The protocol's close codes (the default's when `None`).
    codes: Option<CloseCodes>,
}

impl Application for Silent {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![b"test".to_vec()]
    }
    fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
        Box::new(self.clone())
    }
    fn close_codes(&self, alpn: &[u8]) -> CloseCodes {
        assert_eq!(alpn, b"test");
        self.codes.unwrap_or(CloseCodes::HTTP3)
    }
}

impl WorkerApp for Silent {
    fn accept(&mut self, _: &[u8], info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        self.infos.lock().unwrap().push(info.clone());
        Some(Box::new(SilentConn))
    }
}

struct SilentConn;

impl ConnApp for SilentConn {
    fn on_event(&mut self, _: &mut AppCx<'_>, _: AppEvent) {}
}

/// Writes on `send` until flow control stops it (a write that does not
/// complete at once); the bytes taken.
async fn write_until_blocked(send: &mut quinn::SendStream) -> usize {
    let buf = vec![7u8; 16 * 1024];
    let mut total = 0;
    // The credit is known to the client from the handshake: a write
    // within it completes at its first poll, and one past it never does
    // (the server reads nothing), so the timeout only ends the wait.
    while let Ok(r) = tokio::time::timeout(Duration::from_millis(300), send.write(&buf)).await {
        total += r.unwrap();
    }
    total
}

/// The windows and streams configured are what the client is granted:
/// a stream's window, then the connection's across streams, and the
/// number of requests at once. The budget charges the connection for
/// what is configured.
#[test]
fn a_configured_window_is_what_a_client_sees_and_the_budget_counts() {
    let t = Transport::new()
        .stream_window(64 * 1024)
        .connection_window(Some(100 * 1024))
        .bidi_streams(3)
        .uni_streams(0);
    let app = Silent::default();
    let (engine, cert) = start(app.clone(), |c| c.workers(1).transport(t.clone()));
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", None);
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        let (mut a, _ra) = conn.open_bi().await.unwrap();
        assert_eq!(
            write_until_blocked(&mut a).await,
            64 * 1024,
            "stream window"
        );
        let (mut b, _rb) = conn.open_bi().await.unwrap();
        assert_eq!(
            write_until_blocked(&mut b).await,
            (100 - 64) * 1024,
            "the connection's window, across streams"
        );
        let (_c, _rc) = conn.open_bi().await.unwrap();
        // Three requests at once, no fourth.
        let fourth = tokio::time::timeout(Duration::from_millis(300), conn.open_bi()).await;
        assert!(fourth.is_err(), "a fourth stream was granted");
        // The server holds two open requests (the third sent nothing):
        // their credit, at most the connection's window, is charged.
        let want = t.held(false, 2, 0, Grant::Full);
        assert_ne!(want, Transport::default().held(false, 2, 0, Grant::Full));
        let mon = engine.monitor();
        tokio::task::spawn_blocking(move || {
            eventually("the budget charges the configured windows", || {
                mon.budget().held() == want
            })
        })
        .await
        .unwrap();
        conn.close(0u32.into(), b"");
    });
    assert_eq!(app.infos.lock().unwrap()[0].bidi_streams, 3);
    stop(engine);
}

/// Keep-alive sends PINGs to the client; DATAGRAM frames are offered
/// only when a receive buffer is configured.
#[test]
fn keep_alive_pings_and_datagrams_are_offered_when_configured() {
    let t = Transport::new()
        .keep_alive(Some(Duration::from_millis(100)))
        .datagram_receive_buffer(Some(64 * 1024));
    let (engine, cert) = start(Silent::default(), |c| c.workers(1).transport(t));
    let (plain, plain_cert) = start(Silent::default(), |c| c.workers(1));
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let conn = connect(&client(cert, b"test", None), engine.local_addr())
            .await
            .unwrap();
        assert!(conn.max_datagram_size().is_some(), "DATAGRAM not offered");
        // PINGs without anything sent by either side (the client
        // acknowledges them).
        let c = conn.clone();
        tokio::task::spawn_blocking(move || {
            eventually("keep-alive PINGs", || c.stats().frame_rx.ping >= 3)
        })
        .await
        .unwrap();
        let other = connect(&client(plain_cert, b"test", None), plain.local_addr())
            .await
            .unwrap();
        assert!(
            other.max_datagram_size().is_none(),
            "DATAGRAM offered by default"
        );
        conn.close(0u32.into(), b"");
        other.close(0u32.into(), b"");
    });
    stop(engine);
    stop(plain);
}

/// A transport value out of range stops the start with its name.
#[test]
fn a_transport_out_of_range_is_refused_at_start() {
    let (tls, _) = super::server_tls();
    let cfg = fastudp_quic::EngineConfig::new("127.0.0.1:0".parse().unwrap(), tls)
        .workers(1)
        .transport(Transport::new().stream_window(1024));
    let e = fastudp_quic::Engine::start(cfg, Arc::new(Silent::default())).unwrap_err();
    assert!(matches!(e, fastudp_quic::Error::Config(_)), "{e:?}");
    assert!(e.to_string().starts_with("stream_window 1024"), "{e}");
}

/// A quinn client endpoint on `ip` (a loopback address) that trusts
/// `cert` and offers the `test` protocol.
fn client_at(cert: super::Cert, ip: &str) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"test".to_vec()];
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client(format!("{ip}:0").parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

/// The admission hook refuses by address before any handshake state:
/// the refused client's connection fails with CONNECTION_REFUSED, the
/// refusal is counted, a hook that panics refuses too (counted as a
/// panic), and the other clients are served by the same worker.
#[test]
fn the_admission_hook_refuses_by_address() {
    use fastudp_quic::{Admission, Decision};
    let seen: Arc<Mutex<Vec<Admission>>> = Arc::default();
    let s = seen.clone();
    let app = Silent::default();
    let (engine, cert) = start(app.clone(), move |c| {
        c.workers(1).admission(move |a| {
            s.lock().unwrap().push(*a);
            match a.remote.ip().to_string().as_str() {
                "127.0.0.2" => Decision::Refuse,
                "127.0.0.3" => panic!("a hook's panic"),
                _ => Decision::Accept,
            }
        })
    });
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        for ip in ["127.0.0.2", "127.0.0.3"] {
            let e = connect(&client_at(cert.clone(), ip), addr)
                .await
                .expect_err("refused");
            assert!(
                matches!(
                    e.downcast_ref::<quinn::ConnectionError>(),
                    Some(quinn::ConnectionError::ConnectionClosed(c))
                        if c.error_code == quinn_proto::TransportErrorCode::CONNECTION_REFUSED
                ),
                "{ip}: {e:?}"
            );
        }
        let ok = connect(&client_at(cert.clone(), "127.0.0.1"), addr)
            .await
            .unwrap();
        ok.close(0u32.into(), b"");
    });
    let c = engine.counters();
    assert_eq!(c.refused_admission.load(Relaxed), 2);
    assert_eq!(c.refused.load(Relaxed), 2);
    assert_eq!(c.app_panics.load(Relaxed), 1);
    assert_eq!(c.accepted.load(Relaxed), 1);
    assert_eq!(app.infos.lock().unwrap().len(), 1, "only one handshake");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for a in seen.iter() {
        assert_eq!(a.local, addr, "{a:?}");
        assert!(!a.validated);
        assert_eq!(a.worker, 0);
    }
    stop(engine);
}

/// The admission hook sees the local address and port each client sent
/// to: on a wildcard bind, a hook refuses the clients of one local
/// address (127.0.0.9) and serves those of another (127.0.0.1). The
/// connection served carries the same local address, its peer's and the
/// ALPN agreed ([`ConnInfo`]).
#[test]
fn the_admission_hook_decides_by_local_address() {
    use fastudp_quic::{Admission, Decision};
    let seen: Arc<Mutex<Vec<Admission>>> = Arc::default();
    let s = seen.clone();
    let app = Silent::default();
    let (tls, cert) = super::server_tls();
    let cfg = fastudp_quic::EngineConfig::new("0.0.0.0:0".parse().unwrap(), tls)
        .workers(1)
        .admission(move |a| {
            s.lock().unwrap().push(*a);
            if a.local.ip() == std::net::Ipv4Addr::new(127, 0, 0, 9) {
                Decision::Refuse
            } else {
                Decision::Accept
            }
        });
    let engine = fastudp_quic::Engine::start(cfg, Arc::new(app.clone())).unwrap();
    let port = engine.local_addr().port();
    let (refused, served): (std::net::SocketAddr, std::net::SocketAddr) = (
        format!("127.0.0.9:{port}").parse().unwrap(),
        format!("127.0.0.1:{port}").parse().unwrap(),
    );
    let rt = rt();
    let _in = rt.enter();
    let ep = client_at(cert, "127.0.0.1");
    let client = rt.block_on(async {
        let e = connect(&ep, refused).await.expect_err("refused");
        assert!(
            matches!(
                e.downcast_ref::<quinn::ConnectionError>(),
                Some(quinn::ConnectionError::ConnectionClosed(c))
                    if c.error_code == quinn_proto::TransportErrorCode::CONNECTION_REFUSED
            ),
            "{e:?}"
        );
        let ok = connect(&ep, served).await.unwrap();
        ok.close(0u32.into(), b"");
        ep.local_addr().unwrap()
    });
    let seen = seen.lock().unwrap();
    let locals: Vec<_> = seen.iter().map(|a| a.local).collect();
    assert_eq!(locals, vec![refused, served], "{seen:?}");
    assert!(seen.iter().all(|a| a.remote.port() == client.port()));
    assert_eq!(engine.stats().refused_admission, 1);
    let infos = app.infos.lock().unwrap();
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert_eq!(infos[0].local, served);
    assert_eq!(infos[0].remote.port(), client.port());
    assert_eq!(infos[0].alpn.as_deref(), Some(&b"test"[..]));
    assert_eq!(infos[0].server_name.as_deref(), Some("localhost"));
    drop(infos);
    stop(engine);
}

/// A hook that asks for a Retry has every client prove its address: the
/// client comes back with the token, the hook sees it validated (its
/// Retry is then an accept), and the connection is served.
#[test]
fn the_admission_hook_forces_a_retry() {
    use fastudp_quic::Decision;
    let seen: Arc<Mutex<Vec<bool>>> = Arc::default();
    let s = seen.clone();
    let (engine, cert) = start(Silent::default(), move |c| {
        c.workers(1).admission(move |a| {
            s.lock().unwrap().push(a.validated);
            Decision::Retry
        })
    });
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let conn = connect(&client(cert, b"test", None), engine.local_addr())
            .await
            .unwrap();
        conn.close(0u32.into(), b"");
    });
    let st = engine.stats();
    assert_eq!(st.retries, 1);
    assert_eq!(st.accepted, 1);
    assert_eq!(st.refused_admission, 0);
    assert_eq!(engine.monitor().stats().retries, 1);
    assert_eq!(*seen.lock().unwrap(), vec![false, true]);
    stop(engine);
}

/// The engine closes a connection with its protocol's own code: an
/// address over its share is told the application's `address_limit`
/// (HTTP/3's H3_EXCESSIVE_LOAD by default, not hq-interop's 0x14).
#[test]
fn the_engine_closes_with_the_protocols_codes() {
    for (codes, want) in [
        (Some(CloseCodes::new(0x1234, 0x99)), 0x1234u32),
        (None, 0x107),
    ] {
        let app = Silent {
            codes,
            ..Silent::default()
        };
        let (engine, cert) = start(app, |c| c.workers(1).max_connections_per_ip(Some(1)));
        let addr = engine.local_addr();
        let rt = rt();
        let _in = rt.enter();
        rt.block_on(async {
            let first = connect(&client(cert.clone(), b"test", None), addr)
                .await
                .unwrap();
            let second = client(cert.clone(), b"test", None);
            // The handshake may finish before the close arrives, or not.
            let e = match connect(&second, addr).await {
                Ok(c) => c.closed().await,
                Err(e) => e.downcast::<quinn::ConnectionError>().unwrap(),
            };
            match e {
                quinn::ConnectionError::ApplicationClosed(a) => {
                    assert_eq!(a.error_code, want.into());
                    assert_eq!(&a.reason[..], b"too many connections from this address");
                }
                e => panic!("{e:?}"),
            }
            first.close(0u32.into(), b"");
        });
        assert_eq!(engine.stats().refused_per_ip, 1);
        stop(engine);
    }
}

/// Sends back every DATAGRAM frame it reads.
#[derive(Clone)]
struct EchoDatagrams;

impl Application for EchoDatagrams {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![b"test".to_vec()]
    }
    fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
        Box::new(self.clone())
    }
}

impl WorkerApp for EchoDatagrams {
    fn accept(&mut self, _: &[u8], _: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        Some(Box::new(EchoDatagrams))
    }
}

impl ConnApp for EchoDatagrams {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        if ev == AppEvent::Datagram {
            assert!(cx.max_datagram_size().is_some());
            while let Some(d) = cx.recv_datagram() {
                cx.send_datagram(d).unwrap();
            }
        }
    }
}

/// DATAGRAM frames reach the application and its own reach the client;
/// with a receive buffer the application does not read, what it held
/// and what was pushed out is counted dropped when the connection ends.
#[test]
fn datagrams_are_echoed_and_unread_ones_counted() {
    let t = Transport::new().datagram_receive_buffer(Some(4096));
    let (engine, cert) = start(EchoDatagrams, |c| c.workers(1).transport(t.clone()));
    let (silent, silent_cert) = start(Silent::default(), |c| c.workers(1).transport(t));
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let conn = connect(&client(cert, b"test", None), engine.local_addr())
            .await
            .unwrap();
        let sent: std::collections::BTreeSet<Vec<u8>> = (0..10)
            .map(|i| format!("datagram {i}").into_bytes())
            .collect();
        for d in &sent {
            conn.send_datagram(d.clone().into()).unwrap();
        }
        let mut got = std::collections::BTreeSet::new();
        while got.len() < sent.len() {
            let d = tokio::time::timeout(Duration::from_secs(10), conn.read_datagram())
                .await
                .expect("the echo")
                .unwrap();
            got.insert(d.to_vec());
        }
        assert_eq!(got, sent);
        conn.close(0u32.into(), b"");

        // 20 of 1,000 bytes into 4 KiB that nobody reads.
        let other_ep = client(silent_cert, b"test", None);
        let other = connect(&other_ep, silent.local_addr()).await.unwrap();
        for _ in 0..20 {
            other.send_datagram(vec![1u8; 1000].into()).unwrap();
        }
        // All sent (a close would drop what is queued), then the close.
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while other.stats().frame_tx.datagram < 20 {
            assert!(std::time::Instant::now() < until, "{:?}", other.stats());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        other.close(0u32.into(), b"");
        // The close is sent.
        other_ep.wait_idle().await;
    });
    let (echo, quiet) = (engine.monitor(), silent.monitor());
    eventually("the echo's connection gone", || {
        echo.stats().connections == 0
    });
    let st = echo.stats();
    assert_eq!(st.quic_datagrams_read, 10);
    assert_eq!(st.quic_datagrams_queued, 10);
    assert_eq!(st.quic_datagrams_dropped, 0);
    assert_eq!(st.quic_datagrams_blocked, 0);
    eventually("the silent connection gone", || {
        quiet.stats().connections == 0
    });
    eventually("the unread datagrams counted", || {
        quiet.stats().quic_datagrams_dropped > 0
    });
    let st = quiet.stats();
    assert_eq!(st.quic_datagrams_read, 0);
    assert!(st.quic_datagrams_dropped <= 20, "{st:?}");
    stop(engine);
    stop(silent);
}

/// Answers each DATAGRAM frame with ten of 1,000 bytes, more than its
/// send buffer holds at once: the ones past it come back, counted, and
/// the buffer frees room later.
#[derive(Clone, Default)]
struct Burst {
    writable: Arc<std::sync::atomic::AtomicU64>,
}

impl Application for Burst {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![b"test".to_vec()]
    }
    fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
        Box::new(self.clone())
    }
}

impl WorkerApp for Burst {
    fn accept(&mut self, _: &[u8], _: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        Some(Box::new(self.clone()))
    }
}

impl ConnApp for Burst {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        match ev {
            AppEvent::Datagram => {
                while cx.recv_datagram().is_some() {
                    for _ in 0..10 {
                        match cx.send_datagram(vec![2u8; 1000].into()) {
                            Ok(()) => {}
                            Err(fastudp_quic::app::DatagramError::Blocked(d)) => {
                                assert_eq!(d.len(), 1000, "the datagram comes back");
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            }
            AppEvent::DatagramsWritable => {
                self.writable.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }
}

/// Starts `app` with transport `t` on one worker, asks it for its burst
/// ("go"), reads one 1,000-byte frame of it (the ones queued arrive,
/// unless lost: DATAGRAM frames are not sent again) and closes; returns
/// the engine and its statistics after the close.
fn burst_and_read_one(app: Burst, t: Transport) -> (Engine, Stats) {
    let (engine, cert) = start(app, |c| c.workers(1).transport(t));
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let conn = connect(&client(cert, b"test", None), engine.local_addr())
            .await
            .unwrap();
        conn.send_datagram(b"go".to_vec().into()).unwrap();
        let d = tokio::time::timeout(Duration::from_secs(10), conn.read_datagram())
            .await
            .expect("a datagram")
            .unwrap();
        assert_eq!(d.len(), 1000);
        conn.close(0u32.into(), b"");
    });
    let st = engine.stats();
    (engine, st)
}

#[test]
fn a_full_datagram_send_buffer_hands_the_datagram_back() {
    let t = Transport::new().datagram_receive_buffer(Some(4096));
    let app = Burst::default();
    let (engine, st) = burst_and_read_one(app.clone(), t);
    assert_eq!(st.quic_datagrams_queued + st.quic_datagrams_blocked, 10);
    assert!(st.quic_datagrams_blocked >= 1, "{st:?}");
    assert!(st.quic_datagrams_queued >= 1, "{st:?}");
    let w = app.writable.clone();
    eventually("DatagramsWritable after a refusal", || w.load(Relaxed) >= 1);
    stop(engine);
}

/// A DATAGRAM send buffer of its own: with 8 KiB to send and 1,200 bytes
/// to receive, a burst of ten 1,000-byte frames queues seven (each
/// counts 32 bytes more, as quinn-proto counts it) and hands three back;
/// with the receive buffer's size (the default) it would queue one.
#[test]
fn the_datagram_send_buffer_is_its_own() {
    let t = Transport::new()
        .datagram_receive_buffer(Some(1200))
        .datagram_send_buffer(Some(8192));
    let (engine, st) = burst_and_read_one(Burst::default(), t);
    assert_eq!(
        (st.quic_datagrams_queued, st.quic_datagrams_blocked),
        (7, 3),
        "{st:?}"
    );
    stop(engine);
}

/// DATAGRAM frames pushed out of a full receive buffer are counted as it
/// happens, while the connection lives (not only when it ends): ten of
/// 1,000 bytes into 1,200 bytes that nobody reads leave one, nine
/// counted dropped with the connection open; its end counts the last.
#[test]
fn datagrams_pushed_out_are_counted_while_the_connection_lives() {
    let t = Transport::new().datagram_receive_buffer(Some(1200));
    let (engine, cert) = start(Silent::default(), |c| c.workers(1).transport(t));
    let mon = engine.monitor();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, b"test", None);
    rt.block_on(async {
        let conn = connect(&ep, engine.local_addr()).await.unwrap();
        for _ in 0..10 {
            conn.send_datagram(vec![1u8; 1000].into()).unwrap();
        }
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while conn.stats().frame_tx.datagram < 10 {
            assert!(std::time::Instant::now() < until, "{:?}", conn.stats());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let m = mon.clone();
        tokio::task::spawn_blocking(move || {
            eventually("nine dropped, counted while open", || {
                m.stats().quic_datagrams_dropped == 9
            })
        })
        .await
        .unwrap();
        assert_eq!(mon.stats().connections, 1, "the connection is open");
        conn.close(0u32.into(), b"");
        ep.wait_idle().await;
    });
    eventually("the connection gone", || mon.stats().connections == 0);
    let st = mon.stats();
    assert_eq!(st.quic_datagrams_dropped, 10, "{st:?}");
    assert_eq!(st.quic_datagrams_read, 0);
    stop(engine);
}

/// A send window of the embedder's is what the budget counts for a
/// connection with a request open (instead of the applications' 2 MiB).
#[test]
fn a_configured_send_window_is_counted_with_a_request_open() {
    let t = Transport::new().uni_streams(0).send_window(Some(8 << 20));
    let (engine, cert) = start(Silent::default(), |c| c.workers(1).transport(t.clone()));
    let rt = rt();
    let _in = rt.enter();
    rt.block_on(async {
        let conn = connect(&client(cert, b"test", None), engine.local_addr())
            .await
            .unwrap();
        let (mut a, _ra) = conn.open_bi().await.unwrap();
        a.write_all(b"a request").await.unwrap();
        let want = t.held(false, 1, 0, Grant::Full);
        assert_eq!(
            want,
            Transport::new()
                .uni_streams(0)
                .held(false, 1, 0, Grant::Full)
                + (8 << 20)
                - fastudp_quic::limits::FULL_SEND_WINDOW
        );
        let mon = engine.monitor();
        tokio::task::spawn_blocking(move || {
            eventually("the budget counts the configured send window", || {
                mon.budget().held() == want
            })
        })
        .await
        .unwrap();
        conn.close(0u32.into(), b"");
    });
    stop(engine);
}
