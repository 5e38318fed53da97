//! The axum example (`examples/axum.rs`): an unchanged `Router` over
//! HTTP/3 on the engine (h3 + quinn client) and over TLS/TCP (hyper's
//! HTTP/1.1 and HTTP/2 clients): each route, a 64 MB upload and download
//! with bounded memory, a handler panic that leaves the worker serving,
//! connection facts as request extensions, and an async handler awaiting
//! a tokio timer.

#[path = "../../examples/axum.rs"]
#[allow(dead_code)]
mod example;

use bytes::{Buf, Bytes};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use sha2::Digest;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn client_tls(
    cert: &rustls::pki_types::CertificateDer<'static>,
    alpn: &[&[u8]],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    c
}

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// An HTTP/3 connection to `addr` (its driver spawned).
async fn h3_connect(
    cert: &rustls::pki_types::CertificateDer<'static>,
    addr: SocketAddr,
) -> (quinn::Endpoint, SendRequest) {
    let tls = client_tls(cert, &[b"h3"]);
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .unwrap();
    tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    (ep, send)
}

/// What came back: status, and the body (or, past `keep`, its length and
/// SHA-256 only).
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Vec<u8>,
    len: u64,
    sha: String,
    pattern_ok: bool,
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The pattern's bytes, `len` of them, in pieces.
fn pattern_pieces(len: u64) -> impl Iterator<Item = Bytes> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off == len {
            return None;
        }
        let b = fastudp_quic::hq::wire::pattern(off, len - off);
        off += b.len() as u64;
        Some(Bytes::from_static(b))
    })
}

fn sha_of_pattern(len: u64) -> String {
    let mut h = sha2::Sha256::new();
    for p in pattern_pieces(len) {
        h.update(&p);
    }
    hex(h.finalize())
}

const KEEP: usize = 1 << 16;

async fn h3_request(
    send: &mut SendRequest,
    method: &str,
    path: &str,
    upload: Option<u64>,
) -> anyhow::Result<Answer> {
    let req = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .body(())?;
    let mut s = send.send_request(req).await?;
    if let Some(n) = upload {
        for p in pattern_pieces(n) {
            s.send_data(p).await?;
        }
    }
    s.finish().await?;
    let resp = s.recv_response().await?;
    let mut a = Answer {
        status: resp.status(),
        headers: resp.headers().clone(),
        body: Vec::new(),
        len: 0,
        sha: String::new(),
        pattern_ok: true,
    };
    let mut h = sha2::Sha256::new();
    while let Some(mut chunk) = s.recv_data().await? {
        let b = chunk.copy_to_bytes(chunk.remaining());
        if fastudp_quic::hq::wire::check(a.len, &b).is_err() {
            a.pattern_ok = false;
        }
        a.len += b.len() as u64;
        h.update(&b);
        if a.body.len() < KEEP {
            a.body
                .extend_from_slice(&b[..b.len().min(KEEP - a.body.len())]);
        }
    }
    a.sha = hex(h.finalize());
    Ok(a)
}

/// The process's peak resident memory (VmHWM), bytes.
fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn start() -> example::Server {
    example::serve(&example::Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        cert: None,
        workers: 1,
        stream_window: None,
        recv_arena: false,
        rx_coalesce: None,
    })
    .expect("the example starts")
}

/// An engine of one worker on 127.0.0.1 serving `app` over HTTP/3 with
/// a self-signed certificate for `localhost`, and that certificate.
fn start_engine(
    app: fastudp_quic::h3::H3App,
) -> (
    fastudp_quic::Engine,
    rustls::pki_types::CertificateDer<'static>,
) {
    let app = fastudp_quic::app::Router::new().with(fastudp_quic::h3::ALPN, app);
    crate::engine::start(app, |c| c.workers(1))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const BIG: u64 = 64 << 20;

/// Every route over HTTP/3; after `/panic` (500) the same connection and
/// worker serve.
#[test]
fn the_axum_example_serves_each_route_over_http3() {
    let s = start();
    let addr = s.engine.local_addr();
    let counters = s.engine.counters().clone();
    rt().block_on(async {
        let (_ep, mut send) = h3_connect(&s.cert, addr).await;
        let a = h3_request(&mut send, "GET", "/hello/world", None)
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.body, b"hello world");

        let a = h3_request(&mut send, "GET", "/nope", None).await.unwrap();
        assert_eq!(a.status, StatusCode::NOT_FOUND);

        let a = h3_request(&mut send, "GET", "/json", None).await.unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.headers[http::header::CONTENT_TYPE], "application/json");
        assert_eq!(a.body.len(), example::JSON_LEN);
        assert_eq!(a.body, example::json_document().as_bytes());
        assert!(a.body.starts_with(b"{\"items\":[{\"id\":0,") && a.body.ends_with(b"\"}"));

        let a = h3_request(&mut send, "GET", "/sleep", None).await.unwrap();
        assert_eq!((a.status, &a.body[..]), (StatusCode::OK, &b"slept"[..]));

        let a = h3_request(&mut send, "POST", "/upload", Some(100_000))
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(
            String::from_utf8(a.body).unwrap(),
            format!("100000 {}", sha_of_pattern(100_000))
        );

        let a = h3_request(&mut send, "GET", "/download/300000", None)
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!((a.len, a.pattern_ok), (300_000, true));
        assert_eq!(a.headers[http::header::CONTENT_LENGTH], "300000");

        let a = h3_request(&mut send, "GET", "/panic", None).await.unwrap();
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            counters
                .app_panics
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // The connection, and the worker, serve on.
        let a = h3_request(&mut send, "GET", "/hello/again", None)
            .await
            .unwrap();
        assert_eq!(a.body, b"hello again");
        let (_ep2, mut send2) = h3_connect(&s.cert, addr).await;
        let a = h3_request(&mut send2, "GET", "/hello/new", None)
            .await
            .unwrap();
        assert_eq!(a.body, b"hello new");
    });
    s.engine.stop();
    s.engine.join().unwrap();
}

/// 64 MB each way over HTTP/3 with bounded memory: the process (client
/// and server) grows by far less than a body. Run alone in a child
/// process, so that the other tests' memory is not counted.
#[test]
fn the_axum_example_moves_64_mb_each_way_in_bounded_memory() {
    const ALONE: &str = "FASTUDP_TEST_ALONE";
    let name = "axum::the_axum_example_moves_64_mb_each_way_in_bounded_memory";
    if std::env::var_os(ALONE).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
        eprintln!(
            "{}",
            text.lines()
                .filter(|l| l.contains("64 MB"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        return;
    }
    let s = start();
    let addr = s.engine.local_addr();
    rt().block_on(async {
        let (_ep, mut send) = h3_connect(&s.cert, addr).await;
        // Warm up: the first connection's and request's allocations.
        let a = h3_request(&mut send, "POST", "/upload", Some(1 << 20))
            .await
            .unwrap();
        assert_eq!(a.status, StatusCode::OK);
        let before = peak_rss();
        let t = Instant::now();
        let a = h3_request(&mut send, "POST", "/upload", Some(BIG))
            .await
            .unwrap();
        let up = t.elapsed();
        assert_eq!(
            String::from_utf8(a.body).unwrap(),
            format!("{BIG} {}", sha_of_pattern(BIG))
        );
        let t = Instant::now();
        let a = h3_request(&mut send, "GET", &format!("/download/{BIG}"), None)
            .await
            .unwrap();
        let down = t.elapsed();
        assert_eq!((a.len, a.pattern_ok), (BIG, true));
        let grew = peak_rss().saturating_sub(before);
        eprintln!("64 MB up in {up:?}, down in {down:?}; peak RSS grew {grew} bytes");
        assert!(
            grew < BIG / 4,
            "peak RSS grew by {grew} bytes for {BIG}-byte bodies"
        );
    });
    s.engine.stop();
    s.engine.join().unwrap();
}

/// The same Router over TLS/TCP: HTTP/1.1 and HTTP/2 (ALPN), each route,
/// with the alt-svc header naming the HTTP/3 port.
#[test]
fn the_axum_example_serves_each_route_over_tcp() {
    let s = start();
    let port = s.engine.local_addr().port();
    let tcp = s.tcp;
    rt().block_on(async {
        for alpn in [&b"http/1.1"[..], b"h2"] {
            let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&s.cert, &[alpn])));
            let conn = || async {
                let t = tokio::net::TcpStream::connect(tcp).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                hyper_util::rt::TokioIo::new(tls.connect(name, t).await.unwrap())
            };
            let get = |path: &str, body: Option<u64>| {
                let method = if body.is_some() { "POST" } else { "GET" };
                let body = http_body_util::StreamBody::new(futures_util::stream::iter(
                    pattern_pieces(body.unwrap_or(0))
                        .map(|b| Ok::<_, std::convert::Infallible>(http_body::Frame::data(b))),
                ));
                Request::builder()
                    .method(method)
                    .uri(format!("https://localhost{path}"))
                    .body(body)
                    .unwrap()
            };
            let mut results = Vec::new();
            for (path, body) in [
                ("/hello/tcp", None),
                ("/upload", Some(1_000_000)),
                ("/download/200000", None),
                ("/panic", None),
                ("/hello/after", None),
            ] {
                let io = conn().await;
                let resp = if alpn == b"h2" {
                    let (mut send, c) = hyper::client::conn::http2::handshake(
                        hyper_util::rt::TokioExecutor::new(),
                        io,
                    )
                    .await
                    .unwrap();
                    tokio::spawn(c);
                    send.send_request(get(path, body)).await
                } else {
                    let (mut send, c) = hyper::client::conn::http1::handshake(io).await.unwrap();
                    tokio::spawn(c);
                    send.send_request(get(path, body)).await
                };
                let got = match resp {
                    Ok(r) => {
                        let alt = r.headers().get(http::header::ALT_SVC).cloned();
                        let status = r.status();
                        let b = r.into_body().collect().await.map(|b| b.to_bytes());
                        Some((status, alt, b.ok()))
                    }
                    // A panic in a TCP handler ends its connection.
                    Err(_) => None,
                };
                results.push((path, got));
            }
            let want_alt = format!("h3=\":{port}\"; ma=86400");
            let ok = |i: usize| {
                let (_, g) = &results[i];
                let (status, alt, body) = g.clone().expect("an answer");
                assert_eq!(status, StatusCode::OK, "{alpn:?} {}", results[i].0);
                assert_eq!(alt.unwrap(), want_alt.as_str());
                body.unwrap()
            };
            assert_eq!(&ok(0)[..], b"hello tcp");
            assert_eq!(
                String::from_utf8(ok(1).to_vec()).unwrap(),
                format!("1000000 {}", sha_of_pattern(1_000_000))
            );
            let d = ok(2);
            assert_eq!(d.len(), 200_000);
            assert_eq!(fastudp_quic::hq::wire::check(0, &d), Ok(()));
            assert!(
                results[3].1.as_ref().is_none_or(|g| g.0 != StatusCode::OK),
                "/panic answered 200"
            );
            assert_eq!(&ok(4)[..], b"hello after");
        }
    });
    s.engine.stop();
    s.engine.join().unwrap();
}

/// An async handler awaiting a 1 ms tokio timer is answered soon after
/// it fires (a wake from the runtime's thread ends the worker's wait),
/// and requests carry the connection's facts.
#[test]
fn async_handlers_await_tokio_timers_and_see_the_connection() {
    use axum::routing::get;
    use fastudp_quic::app::ConnInfo;
    use fastudp_quic::h3::{Alpn, H3App};
    let router = axum::Router::new()
        .route(
            "/sleep",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                "slept"
            }),
        )
        .route("/hello", get(|| async { "hello" }))
        .route(
            "/who",
            get(
                |axum::Extension(info): axum::Extension<ConnInfo>,
                 axum::Extension(alpn): axum::Extension<Alpn>| async move {
                    format!(
                        "{} {} {} {} {}",
                        info.remote,
                        info.local,
                        info.server_name.unwrap_or_default(),
                        String::from_utf8_lossy(&alpn.0),
                        String::from_utf8_lossy(&info.alpn.unwrap_or_default()),
                    )
                },
            ),
        );
    let (engine, cert) = start_engine(H3App::service(router));
    let addr = engine.local_addr();
    rt().block_on(async {
        let (ep, mut send) = h3_connect(&cert, addr).await;
        let a = h3_request(&mut send, "GET", "/who", None).await.unwrap();
        let local = ep.local_addr().unwrap();
        assert_eq!(
            String::from_utf8(a.body).unwrap(),
            format!("127.0.0.1:{} {addr} localhost h3 h3", local.port())
        );
        // The same request without the timer, then with it, alternating.
        let (mut plain, mut slept) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            let t = Instant::now();
            let a = h3_request(&mut send, "GET", "/hello", None).await.unwrap();
            plain.push(t.elapsed());
            assert_eq!(a.body, b"hello");
            let t = Instant::now();
            let a = h3_request(&mut send, "GET", "/sleep", None).await.unwrap();
            slept.push(t.elapsed());
            assert_eq!(a.body, b"slept");
        }
        // What a 1 ms tokio sleep takes on its own, on this thread's
        // runtime: the floor of the added time.
        let mut alone = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            alone.push(t.elapsed());
        }
        alone.sort();
        plain.sort();
        slept.sort();
        let p = |v: &[Duration], q: usize| v[(v.len() * q / 100).min(v.len() - 1)];
        // No bound on time (a slow machine is no failure): the figures
        // are for docs/BENCHMARKS.md.
        eprintln!(
            "tokio sleep(1 ms) alone: p50 {:?} p99 {:?}; GET /hello: p50 {:?} p99 {:?}; \
             GET /sleep (1 ms tokio timer): p50 {:?} p99 {:?}",
            p(&alone, 50),
            p(&alone, 99),
            p(&plain, 50),
            p(&plain, 99),
            p(&slept, 50),
            p(&slept, 99)
        );
    });
    engine.stop();
    engine.join().unwrap();
}

/// A POST whose body does not match its `content-length`, or whose
/// `content-length` is not one number, is malformed (RFC 9114 4.1.2,
/// RFC 9110 8.6): the service sees a body error (the example answers
/// 400), never a short or long body passed off as whole.
#[test]
fn a_body_that_breaks_its_content_length_is_malformed() {
    let s = start();
    let addr = s.engine.local_addr();
    rt().block_on(async {
        let (_ep, mut send) = h3_connect(&s.cert, addr).await;
        // (content-length values, body bytes)
        let cases: [(&[&str], usize); 5] = [
            (&["1000000"], 5),
            (&["3"], 10),
            (&["5", "7"], 5),
            (&["-1"], 5),
            (&["5"], 5),
        ];
        for (lengths, body) in cases {
            let mut req = Request::builder()
                .method("POST")
                .uri("https://localhost/upload");
            for l in lengths {
                req = req.header(http::header::CONTENT_LENGTH, *l);
            }
            let mut st = send.send_request(req.body(()).unwrap()).await.unwrap();
            // The server may stop the stream before all of it is sent.
            let _ = st.send_data(Bytes::from(vec![b'x'; body])).await;
            let _ = st.finish().await;
            let resp = st.recv_response().await.unwrap();
            let mut got = Vec::new();
            while let Ok(Some(mut c)) = st.recv_data().await {
                got.extend_from_slice(&c.copy_to_bytes(c.remaining()));
            }
            let got = String::from_utf8_lossy(&got).to_string();
            if lengths == ["5"] {
                assert_eq!(resp.status(), StatusCode::OK, "{lengths:?}: {got}");
                assert!(got.starts_with("5 "), "{got}");
            } else {
                assert_eq!(
                    resp.status(),
                    StatusCode::BAD_REQUEST,
                    "content-length {lengths:?} with {body} bytes: {got}"
                );
            }
        }
    });
    s.engine.stop();
    s.engine.join().unwrap();
}

/// A request body read by a task the handler spawned, which outlives the
/// request: when the connection goes before the body's end, the reader
/// gets an error, rather than waiting forever (and holding what it holds).
#[test]
fn a_body_reader_outliving_its_request_is_told_the_request_ended() {
    use axum::routing::post;
    use fastudp_quic::h3::H3App;
    let (tx, rx) = std::sync::mpsc::channel::<Result<usize, String>>();
    let tx = std::sync::Mutex::new(tx);
    let tx = Arc::new(tx);
    let router = axum::Router::new().route(
        "/spawn",
        post(move |body: axum::body::Body| {
            let tx = tx.lock().unwrap().clone();
            async move {
                tokio::spawn(async move {
                    let r = body.collect().await;
                    let _ = tx.send(r.map(|c| c.to_bytes().len()).map_err(|e| e.to_string()));
                });
                "accepted"
            }
        }),
    );
    let (engine, cert) = start_engine(H3App::service(router));
    let addr = engine.local_addr();
    rt().block_on(async {
        let (ep, mut send) = h3_connect(&cert, addr).await;
        let req = Request::builder()
            .method("POST")
            .uri("https://localhost/spawn")
            .body(())
            .unwrap();
        let mut st = send.send_request(req).await.unwrap();
        st.send_data(Bytes::from(vec![b'x'; 1024])).await.unwrap();
        let resp = st.recv_response().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        // The body never ends: the client goes away.
        ep.close(0u32.into(), b"bye");
        drop(st);
        drop(send);
        ep.wait_idle().await;
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the spawned reader got no answer: it waits forever");
    assert!(r.is_err(), "a body cut short read as whole: {r:?}");
    engine.stop();
    engine.join().unwrap();
}

/// A synchronous [`fastudp_quic::h3::Handler`] sees the connection's
/// facts too: the request carries its [`fastudp_quic::app::ConnInfo`]
/// (peer and local address, SNI, the ALPN agreed) as an extension.
#[test]
fn a_synchronous_handler_sees_the_connection() {
    use fastudp_quic::app::ConnInfo;
    use fastudp_quic::h3::{H3App, Handler, Reply};
    struct Who;
    impl Handler for Who {
        fn handle(&self, req: &http::Request<()>, _: Instant) -> Reply {
            let Some(info) = req.extensions().get::<ConnInfo>() else {
                return Reply::empty(StatusCode::INTERNAL_SERVER_ERROR);
            };
            let mut r = Reply::empty(StatusCode::OK);
            let who = format!(
                "{} {} {} {}",
                info.remote,
                info.local,
                info.server_name.as_deref().unwrap_or_default(),
                String::from_utf8_lossy(info.alpn.as_deref().unwrap_or_default()),
            );
            r.head
                .headers_mut()
                .insert("x-who", http::HeaderValue::from_str(&who).unwrap());
            r
        }
    }
    let (engine, cert) = start_engine(H3App::new(|_| {
        std::rc::Rc::new(Who) as std::rc::Rc<dyn Handler>
    }));
    let addr = engine.local_addr();
    rt().block_on(async {
        let (ep, mut send) = h3_connect(&cert, addr).await;
        let a = h3_request(&mut send, "GET", "/who", None).await.unwrap();
        assert_eq!(a.status, StatusCode::OK);
        let local = ep.local_addr().unwrap();
        assert_eq!(
            a.headers["x-who"].to_str().unwrap(),
            format!("127.0.0.1:{} {addr} localhost h3", local.port())
        );
    });
    engine.stop();
    engine.join().unwrap();
}
