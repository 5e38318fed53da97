//! `quic serve`'s operations: Prometheus metrics (`--metrics`), scraped
//! and parsed with a Prometheus text parser; the certificate reload on
//! SIGHUP, seen by new clients while an old connection goes on; and the
//! drain on SIGTERM, over HTTP/3, HTTP/1.1 and HTTP/2.

use crate::common::clients::tempdir;
use crate::common::quic_server::serve;
use crate::common::{Running, STALL};
use crate::proxy::{client_tls, h3_request, rt, SendRequest};
use bytes::{Buf, Bytes};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::CertificateDer;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `sig` (`HUP`, `TERM`) to `pid`.
fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} failed");
}

/// The next JSON line of `kind` the server prints.
fn line_of(srv: &mut Running, kind: &str) -> serde_json::Value {
    let want = format!("\"kind\":\"{kind}\"");
    let l = srv.wait_for_line(|l| l.contains(&want));
    serde_json::from_str(&l).unwrap()
}

/// SHA-256 (hex) of a certificate chain's leaf.
fn leaf_sha(chain: &[CertificateDer<'_>]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, chain[0].as_ref());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An HTTP/3 connection: its endpoint, the QUIC connection (for its
/// peer's certificate and its end), the request sender, and its driver's
/// end (h3's error once the connection is gone).
struct H3 {
    _ep: quinn::Endpoint,
    conn: quinn::Connection,
    send: SendRequest,
    driver: tokio::task::JoinHandle<h3::error::ConnectionError>,
}

async fn h3_open(addr: SocketAddr) -> Result<H3, quinn::ConnectionError> {
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client_tls(&[b"h3"])).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    let conn = ep.connect(addr, "localhost").unwrap().await?;
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .unwrap();
    let driver =
        tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    Ok(H3 {
        _ep: ep,
        conn,
        send,
        driver,
    })
}

impl H3 {
    /// The leaf certificate the server showed this connection.
    fn cert(&self) -> String {
        let id = self.conn.peer_identity().expect("a peer identity");
        let chain = id
            .downcast::<Vec<CertificateDer<'static>>>()
            .expect("a certificate chain");
        leaf_sha(&chain)
    }
}

/// A TLS/TCP connection with ALPN `alpn`, and the leaf certificate the
/// server showed it.
async fn tls_open(
    addr: SocketAddr,
    alpn: &[u8],
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    String,
)> {
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&[alpn])));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let s = tls.connect("localhost".try_into().unwrap(), tcp).await?;
    let cert = leaf_sha(s.get_ref().1.peer_certificates().expect("a certificate"));
    Ok((s, cert))
}

/// Reads one HTTP/1.1 response with a `content-length` from `s`: its
/// status, its header block (lower case) and its body.
async fn read_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.expect("read a response");
        assert!(n > 0, "the connection closed before a response head");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status: u16 = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse().unwrap())
        .expect("a content-length");
    let mut body = buf[end..].to_vec();
    while body.len() < len {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.expect("read a body");
        assert!(n > 0, "the connection closed inside a body");
        body.extend_from_slice(&chunk[..n]);
    }
    (status, head, body)
}

/// Whether the server has closed `s` (a read returns its end, or fails).
async fn closed<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(STALL, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// One scrape of `http://ADDR/metrics` over plain HTTP/1.1: its status
/// line and header block, and its body.
fn get(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STALL)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: metrics\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").expect("a response");
    (head.to_ascii_lowercase(), body.to_string())
}

/// A scrape parsed by a Prometheus text parser (prometheus-parse): every
/// line that is not a comment must be a sample it read.
fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let (head, body) = get(addr, "GET", "/metrics");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let s = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text scrape");
    let samples = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count();
    assert_eq!(s.samples.len(), samples, "every sample parsed:\n{body}");
    s
}

/// The value of sample `name` with `labels` (among others).
fn value(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name}: not a plain value"),
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    found[0]
}

/// The sum of sample `name` over all its label sets, and how many.
fn sum(s: &prometheus_parse::Scrape, name: &str) -> (f64, usize) {
    let v: Vec<f64> = s
        .samples
        .iter()
        .filter(|x| x.metric == name)
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .collect();
    (v.iter().sum(), v.len())
}

/// Scrapes until `want` holds (the workers publish some figures every
/// 100 ms); the last scrape.
fn scrape_until(
    addr: SocketAddr,
    want: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let t = Instant::now();
    loop {
        let s = scrape(addr);
        if want(&s) {
            return s;
        }
        assert!(t.elapsed() < STALL, "the metrics never got there");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--metrics`: the scrape parses as Prometheus text, names every family
/// the docs list, and its figures move with HTTP/3 and TLS/TCP requests;
/// the admin listener answers only GET /metrics, and bounds its
/// connections and their time.
#[test]
fn metrics_are_scraped_and_move_with_requests() {
    let (mut srv, addr) = serve(&[
        "--workers",
        "2",
        "--alt-svc-tcp",
        "--metrics",
        "127.0.0.1:0",
    ]);
    let m = line_of(&mut srv, "metrics");
    let url = m["url"].as_str().unwrap();
    let admin: SocketAddr = url
        .strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/metrics"))
        .unwrap()
        .parse()
        .unwrap();
    let s0 = scrape(admin);
    let h3 = |c: &'static str| [("transport", "h3"), ("class", c)];
    let tcp = |c: &'static str| [("transport", "tcp"), ("class", c)];
    assert_eq!(value(&s0, "fastudp_quic_connections", &[]), 0.0);
    assert_eq!(value(&s0, "fastudp_http_responses_total", &h3("2xx")), 0.0);
    assert_eq!(value(&s0, "fastudp_http_responses_total", &tcp("2xx")), 0.0);
    for reason in [
        "limit",
        "memory",
        "per_ip",
        "protocol",
        "draining",
        "admission",
    ] {
        assert_eq!(
            value(&s0, "fastudp_quic_refused_total", &[("reason", reason)]),
            0.0
        );
    }
    assert!(value(&s0, "fastudp_quic_budget_limit_bytes", &[]) > 0.0);
    assert_eq!(value(&s0, "fastudp_quic_draining", &[]), 0.0);
    for name in [
        "fastudp_quic_worker_connections",
        "fastudp_quic_worker_datagrams_received_total",
        "fastudp_quic_worker_restarts_total",
    ] {
        assert_eq!(sum(&s0, name).1, 2, "{name}: one per worker");
    }
    assert_eq!(sum(&s0, "fastudp_quic_datagrams_dropped_total").1, 5);
    // The TLS/TCP listener's closes by reason, and its refused requests.
    for reason in ["tls_failed", "head_timeout", "idle", "send_timeout"] {
        assert_eq!(
            value(&s0, "fastudp_tcp_closed_total", &[("reason", reason)]),
            0.0,
            "{reason}"
        );
    }
    assert_eq!(value(&s0, "fastudp_tcp_bad_requests_total", &[]), 0.0);
    // QUIC DATAGRAM frames (`quic serve` offers none: they stay 0).
    for what in ["read", "queued", "blocked", "dropped"] {
        let name = format!("fastudp_quic_datagram_frames_{what}_total");
        assert_eq!(value(&s0, &name, &[]), 0.0, "{name}");
    }

    rt().block_on(async {
        let mut c = h3_open(addr).await.unwrap();
        for path in ["/bytes/1000", "/nope", "/bytes/2000", "/nope"] {
            h3_request(&mut c.send, "GET", path, None).await.unwrap();
        }
        let (mut t, _) = tls_open(addr, b"http/1.1").await.unwrap();
        t.write_all(b"GET /bytes/100 HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let (status, _, body) = read_response(&mut t).await;
        assert_eq!((status, body.len()), (200, 100));
        let s1 = scrape_until(admin, |s| {
            sum(s, "fastudp_quic_worker_datagrams_received_total").0 > 0.0
                && value(s, "fastudp_quic_app_bytes_total", &[]) >= 3000.0
        });
        assert_eq!(value(&s1, "fastudp_http_responses_total", &h3("2xx")), 2.0);
        assert_eq!(value(&s1, "fastudp_http_responses_total", &h3("4xx")), 2.0);
        assert_eq!(value(&s1, "fastudp_http_responses_total", &tcp("2xx")), 1.0);
        assert_eq!(value(&s1, "fastudp_quic_connections", &[]), 1.0);
        assert_eq!(value(&s1, "fastudp_quic_accepted_total", &[]), 1.0);
        assert_eq!(value(&s1, "fastudp_tcp_accepted_total", &[]), 1.0);
        assert!(value(&s1, "fastudp_quic_datagrams_received_total", &[]) > 0.0);
        assert!(value(&s1, "fastudp_quic_wire_bytes_total", &[]) > 3000.0);
        assert!(value(&s1, "fastudp_quic_budget_peak_bytes", &[]) > 0.0);
        assert_eq!(sum(&s1, "fastudp_quic_worker_connections").0, 1.0);
        drop(c);
    });

    // A client that speaks no TLS to the TCP listener: its close is
    // counted by reason.
    {
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(STALL)).unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut b = [0u8; 64];
        let _ = raw.read(&mut b);
    }
    let s2 = scrape_until(admin, |s| {
        value(s, "fastudp_tcp_closed_total", &[("reason", "tls_failed")]) > 0.0
    });
    assert_eq!(
        value(&s2, "fastudp_tcp_closed_total", &[("reason", "tls_failed")]),
        1.0
    );

    // Only GET (and HEAD) /metrics.
    assert!(get(admin, "GET", "/").0.starts_with("http/1.1 404"));
    let (head, _) = get(admin, "POST", "/metrics");
    assert!(head.starts_with("http/1.1 405"), "{head}");
    // Connections that send nothing hold every place: one more is closed
    // at once and counted; they themselves are closed after the head
    // timeout.
    let idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(admin).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut extra = TcpStream::connect(admin).unwrap();
    extra.set_read_timeout(Some(STALL)).unwrap();
    let mut b = [0u8; 16];
    assert!(
        matches!(extra.read(&mut b), Ok(0) | Err(_)),
        "a 17th connection is closed at once"
    );
    let t = Instant::now();
    for mut s in idle {
        s.set_read_timeout(Some(STALL)).unwrap();
        assert!(
            matches!(s.read(&mut b), Ok(0) | Err(_)),
            "a silent scraper is let go"
        );
    }
    println!("silent scrapers closed after {:?}", t.elapsed());
    let s2 = scrape(admin);
    assert!(value(&s2, "fastudp_admin_refused_total", &[]) >= 1.0);
    srv.interrupt();
    srv.finish();
}

/// A certificate for localhost: (PEM certificate, PEM key, SHA-256 of the
/// certificate's DER, hex).
fn certificate() -> (String, String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    (
        c.cert.pem(),
        c.key_pair.serialize_pem(),
        leaf_sha(&[c.cert.der().clone()]),
    )
}

/// SIGHUP reads --cert and --key again: new HTTP/3 and TLS/TCP clients
/// get the new certificate while a connection opened before goes on; a
/// bad file is refused and the certificate in force stays.
#[test]
fn sighup_reloads_the_certificate() {
    let dir = tempdir("ops-reload");
    let (cert_a, key_a, sha_a) = certificate();
    let (cert_b, key_b, sha_b) = certificate();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, &cert_a).unwrap();
    std::fs::write(&key, &key_a).unwrap();
    let (mut srv, addr) = serve(&[
        "--workers",
        "1",
        "--alt-svc-tcp",
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    rt().block_on(async {
        let mut old = h3_open(addr).await.unwrap();
        assert_eq!(old.cert(), sha_a);
        assert_eq!(tls_open(addr, b"http/1.1").await.unwrap().1, sha_a);
        let a = h3_request(&mut old.send, "GET", "/bytes/1000", None)
            .await
            .unwrap();
        assert_eq!((a.status, a.len), (StatusCode::OK, 1000));

        std::fs::write(&cert, &cert_b).unwrap();
        std::fs::write(&key, &key_b).unwrap();
        signal(srv.pid(), "HUP");
        let r = line_of(&mut srv, "certificate_reload");
        assert_eq!(r["ok"], true, "{r}");
        let new = h3_open(addr).await.unwrap();
        assert_eq!(new.cert(), sha_b, "a new HTTP/3 client gets the new one");
        assert_eq!(
            tls_open(addr, b"http/1.1").await.unwrap().1,
            sha_b,
            "a new TLS/TCP client gets the new one"
        );
        // The old connection goes on, with the keys it agreed.
        let a = h3_request(&mut old.send, "GET", "/bytes/100000", None)
            .await
            .unwrap();
        assert_eq!(
            (a.status, a.len, a.pattern_ok),
            (StatusCode::OK, 100000, true)
        );
        assert_eq!(old.cert(), sha_a);

        // A bad file: refused, and the certificate in force stays.
        std::fs::write(&cert, "not a certificate\n").unwrap();
        signal(srv.pid(), "HUP");
        let r = line_of(&mut srv, "certificate_reload");
        assert_eq!(r["ok"], false, "{r}");
        assert!(
            r["error"]
                .as_str()
                .unwrap()
                .contains("no certificate in it"),
            "{r}"
        );
        assert_eq!(h3_open(addr).await.unwrap().cert(), sha_b);
        // A key that is not the certificate's: refused too.
        std::fs::write(&cert, &cert_a).unwrap();
        signal(srv.pid(), "HUP");
        let r = line_of(&mut srv, "certificate_reload");
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(h3_open(addr).await.unwrap().cert(), sha_b);
        drop((old, new));
    });
    srv.interrupt();
    let end = srv.finish();
    assert!(
        end.stderr.contains("SIGHUP: certificate not reloaded"),
        "{}",
        end.stderr
    );
}

/// SIGTERM drains: a long HTTP/3 download finishes, a new request on its
/// connection is not served (GOAWAY), new QUIC and TCP connections are
/// refused, an idle HTTP/1.1 connection is closed and one with a request
/// under way gets `connection: close`; then the server exits 0.
#[test]
fn sigterm_drains_http3_and_http1() {
    let (mut srv, addr) = serve(&["--workers", "1", "--alt-svc-tcp", "--drain-timeout", "30"]);
    let video = fastudp_quic::hq::wire::Frames::new(250_000, 3, Duration::from_millis(40));
    let video_len = video.bytes * video.count;
    let r = rt().block_on(async {
        let mut c = h3_open(addr).await.unwrap();
        // The download, read as it comes; the first bytes say it runs.
        let mut s = c
            .send
            .send_request(
                Request::get("https://localhost/video/250000/3")
                    .body(())
                    .unwrap(),
            )
            .await
            .unwrap();
        s.finish().await.unwrap();
        let resp = s.recv_response().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut got = 0u64;
        let mut ok = true;
        let first = s.recv_data().await.unwrap().expect("the first bytes");
        ok &= fastudp_quic::hq::wire::check(0, first.chunk()).is_ok();
        got += first.remaining() as u64;
        let download = tokio::spawn(async move {
            while let Some(mut d) = s.recv_data().await? {
                let b = d.copy_to_bytes(d.remaining());
                ok &= fastudp_quic::hq::wire::check(got, &b).is_ok();
                got += b.len() as u64;
            }
            Ok::<_, h3::error::StreamError>((got, ok))
        });
        // An idle keep-alive HTTP/1.1 connection, and one whose request
        // head is half sent.
        let (mut idle, _) = tls_open(addr, b"http/1.1").await.unwrap();
        idle.write_all(b"GET /bytes/10 HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let (status, head, _) = read_response(&mut idle).await;
        assert_eq!(status, 200);
        assert!(!head.contains("connection: close"), "{head}");
        let (mut busy, _) = tls_open(addr, b"http/1.1").await.unwrap();
        busy.write_all(b"GET /bytes/10 HTTP/1.1\r\nhost: localhost\r\n")
            .await
            .unwrap();
        busy.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;

        signal(srv.pid(), "TERM");
        line_of(&mut srv, "draining");
        // No new connections.
        let e = h3_open(addr)
            .await
            .err()
            .expect("a new QUIC connection is refused");
        assert!(
            matches!(&e, quinn::ConnectionError::ConnectionClosed(c)
                if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED),
            "{e}"
        );
        let e = tokio::net::TcpStream::connect(addr)
            .await
            .expect_err("a new TCP connection is refused");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        // No new request on the old HTTP/3 connection.
        let r = h3_request(&mut c.send, "GET", "/bytes/10", None).await;
        assert!(
            r.is_err(),
            "a request after the GOAWAY is not served: {r:?}"
        );
        // The idle HTTP/1.1 connection is closed; the busy one is answered
        // and told the connection closes.
        assert!(closed(&mut idle).await, "an idle connection is closed");
        busy.write_all(b"\r\n").await.unwrap();
        let (status, head, body) = read_response(&mut busy).await;
        assert_eq!((status, body.len()), (200, 10));
        assert!(head.contains("connection: close"), "{head}");
        assert!(closed(&mut busy).await, "closed after its answer");
        // The download finishes whole, then the connection is closed.
        let got = download.await.unwrap();
        let end = tokio::time::timeout(STALL, c.driver)
            .await
            .unwrap()
            .unwrap();
        (got, end)
    });
    let end = srv.finish();
    println!("{}\n{}", end.stdout, end.stderr);
    let (got, closed) = r;
    let (got, ok) = got.expect("the download finishes");
    assert_eq!((got, ok), (video_len, true));
    println!("the old connection ended: {closed}");
    assert!(closed.is_h3_no_error(), "{closed}");
    assert_eq!(end.status.code(), Some(0), "{}", end.stderr);
    let d: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"kind\":\"drain\""))
            .expect("a drain line"),
    )
    .unwrap();
    assert_eq!(d["timed_out"], false, "{d}");
    assert_eq!(d["left_at_timeout"], 0, "{d}");
    assert_eq!(d["closed_after_requests"], 1, "{d}");
    let s: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"summary\""))
            .unwrap(),
    )
    .unwrap();
    assert!(s["refused"].as_u64().unwrap() >= 1, "{s}");
}

/// Ctrl-C (SIGINT) drains as SIGTERM does: a download under way
/// finishes whole, a new connection is refused; then the server exits
/// with status 130 (an interrupted command's), where SIGTERM's drain
/// exits 0 (`sigterm_drains_http3_and_http1`).
#[test]
fn ctrl_c_drains_then_exits_130() {
    let (mut srv, addr) = serve(&["--workers", "1", "--drain-timeout", "30"]);
    let video = fastudp_quic::hq::wire::Frames::new(250_000, 2, Duration::from_millis(40));
    let video_len = video.bytes * video.count;
    let got = rt().block_on(async {
        let mut c = h3_open(addr).await.unwrap();
        let mut s = c
            .send
            .send_request(
                Request::get("https://localhost/video/250000/2")
                    .body(())
                    .unwrap(),
            )
            .await
            .unwrap();
        s.finish().await.unwrap();
        assert_eq!(s.recv_response().await.unwrap().status(), StatusCode::OK);
        let first = s.recv_data().await.unwrap().expect("the first bytes");
        let mut ok = fastudp_quic::hq::wire::check(0, first.chunk()).is_ok();
        let mut got = first.remaining() as u64;
        srv.interrupt();
        line_of(&mut srv, "draining");
        let e = h3_open(addr)
            .await
            .err()
            .expect("a new QUIC connection is refused");
        assert!(
            matches!(&e, quinn::ConnectionError::ConnectionClosed(c)
                if c.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED),
            "{e}"
        );
        while let Some(mut d) = s.recv_data().await.expect("the download goes on") {
            let b = d.copy_to_bytes(d.remaining());
            ok &= fastudp_quic::hq::wire::check(got, &b).is_ok();
            got += b.len() as u64;
        }
        (got, ok)
    });
    assert_eq!(got, (video_len, true));
    let end = srv.finish();
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(end.stderr.contains("interrupted"), "{}", end.stderr);
    let d: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"kind\":\"drain\""))
            .expect("a drain line"),
    )
    .unwrap();
    assert_eq!(d["timed_out"], false, "{d}");
    assert_eq!(d["closed_after_requests"], 1, "{d}");
}

/// An upstream whose `/hold` requests say they arrived and wait until
/// released (`true` sent on the watch).
fn holding_upstream() -> (
    tokio::runtime::Runtime,
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    tokio::sync::watch::Sender<bool>,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let (release, released) = tokio::sync::watch::channel(false);
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                continue;
            };
            let (arrived, released) = (arrived.clone(), released.clone());
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                        let (arrived, mut released) = (arrived.clone(), released.clone());
                        async move {
                            let _ = arrived.send(());
                            let _ = released.wait_for(|r| *r).await;
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                http_body_util::Full::new(Bytes::from_static(b"released")),
                            ))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (rt, addr, arrivals, release)
}

/// SIGTERM drains the proxy's TLS/TCP side through hyper's graceful
/// shutdown: an HTTP/1.1 response under way is finished with
/// `connection: close`, an HTTP/2 connection gets GOAWAY after its
/// stream, and new connections are refused; then the server exits 0.
#[test]
fn sigterm_drains_the_proxy_over_http1_and_http2() {
    let (_up_rt, up, mut arrivals, release) = holding_upstream();
    let (mut srv, addr) = serve(&[
        "--workers",
        "1",
        "--alt-svc-tcp",
        "--upstream",
        &format!("http://{up}"),
    ]);
    rt().block_on(async {
        let (s1, _) = tls_open(addr, b"http/1.1").await.unwrap();
        let (mut h1, c1) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s1))
            .await
            .unwrap();
        let c1 = tokio::spawn(c1);
        let (s2, _) = tls_open(addr, b"h2").await.unwrap();
        let (mut h2, c2) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(s2),
        )
        .await
        .unwrap();
        let c2 = tokio::spawn(c2);
        let r1 = tokio::spawn(
            h1.send_request(
                Request::get("/hold")
                    .header("host", "localhost")
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            ),
        );
        let r2 = tokio::spawn(
            h2.send_request(
                Request::get("https://localhost/hold")
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            ),
        );
        for _ in 0..2 {
            tokio::time::timeout(STALL, arrivals.recv())
                .await
                .expect("both requests reach the upstream");
        }

        signal(srv.pid(), "TERM");
        line_of(&mut srv, "draining");
        let e = tokio::net::TcpStream::connect(addr)
            .await
            .expect_err("a new TCP connection is refused");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        release.send(true).unwrap();

        let r = r1.await.unwrap().expect("the HTTP/1.1 answer");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["connection"], "close", "{:?}", r.headers());
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"released");
        let r = r2.await.unwrap().expect("the HTTP/2 answer");
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"released");
        // Both connections end: HTTP/1.1 after its answer, HTTP/2 after
        // the GOAWAY and its stream.
        tokio::time::timeout(STALL, c1)
            .await
            .expect("the HTTP/1.1 connection ends")
            .unwrap()
            .unwrap();
        tokio::time::timeout(STALL, c2)
            .await
            .expect("the HTTP/2 connection ends")
            .unwrap()
            .unwrap();
        assert!(h2.ready().await.is_err(), "no new stream after the GOAWAY");
    });
    let end = srv.finish();
    assert_eq!(end.status.code(), Some(0), "{}", end.stderr);
    let d = end
        .stdout
        .lines()
        .find(|l| l.contains("\"kind\":\"drain\""))
        .expect("a drain line");
    assert!(d.contains("\"timed_out\":false"), "{d}");
}

/// --drain-timeout bounds a drain: a response that would run for a minute
/// is cut when it passes, and the server still exits 0; a second SIGTERM
/// ends a drain at once.
#[test]
fn a_drain_ends_at_its_timeout_or_at_a_second_signal() {
    for second in [false, true] {
        let (mut srv, addr) = serve(&["--workers", "1", "--drain-timeout", "1"]);
        rt().block_on(async {
            let mut c = h3_open(addr).await.unwrap();
            let mut s = c
                .send
                .send_request(
                    Request::get("https://localhost/video/125000/60")
                        .body(())
                        .unwrap(),
                )
                .await
                .unwrap();
            s.finish().await.unwrap();
            s.recv_response().await.unwrap();
            s.recv_data().await.unwrap().expect("the first bytes");
            let t = Instant::now();
            signal(srv.pid(), "TERM");
            line_of(&mut srv, "draining");
            if second {
                // The process ends at once, without a word to its clients.
                signal(srv.pid(), "TERM");
                return;
            }
            // The download is cut, not finished.
            let mut cut = false;
            while t.elapsed() < STALL {
                match s.recv_data().await {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        cut = true;
                        break;
                    }
                }
            }
            assert!(cut, "a 60 s response is cut");
        });
        let end = srv.finish();
        if second {
            assert_eq!(end.status.code(), Some(143), "{}", end.stderr);
            assert!(end.stderr.contains("terminated again"), "{}", end.stderr);
        } else {
            assert_eq!(end.status.code(), Some(0), "{}", end.stderr);
            let d = end
                .stdout
                .lines()
                .find(|l| l.contains("\"kind\":\"drain\""))
                .expect("a drain line");
            assert!(d.contains("\"timed_out\":true"), "{d}");
            assert!(d.contains("\"left_at_timeout\":1"), "{d}");
        }
    }
}
