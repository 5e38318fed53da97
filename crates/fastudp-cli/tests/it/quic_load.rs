//! `fastudp quic load --duration`: long-lived HTTP/3 connections spread
//! over local source addresses with few sockets, kept alive past the
//! server's idle timeout, their bodies checked against content-length.

use crate::common;

use common::fastudp;
use common::quic_server::serve;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Runs `fastudp quic load --json ARGS`: its summary, exit status and
/// stderr.
fn load(args: &[&str]) -> (serde_json::Value, Option<i32>, String) {
    let mut all = vec!["quic", "load", "--json"];
    all.extend_from_slice(args);
    let o = fastudp(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {err} {}", String::from_utf8_lossy(&o.stdout)));
    (v, o.status.code(), err)
}

/// A directory to serve with `f.bin` (12,345 bytes); removed on drop.
struct Www(PathBuf);

impl Www {
    fn new(tag: &str) -> Www {
        let d = std::env::temp_dir().join(format!("fastudp-load-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let f: Vec<u8> = (0..12_345u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(d.join("f.bin"), f).unwrap();
        Www(d)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Www {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// 300 connections from the 14 hosts of 127.1.0.0/28, to a server that
/// takes at most 30 per address: all get in only because they come from
/// at least 10 distinct addresses (from one address, 270 are refused,
/// which the second run shows). They share 14 sockets, and the load
/// process never holds more than a few dozen descriptors.
#[test]
fn load_spreads_connections_over_source_addresses_with_few_sockets() {
    let www = Www::new("src");
    let (_srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--www",
        www.path(),
        "--max-connections-per-ip",
        "30",
    ]);
    let a = addr.to_string();
    let (v, code, err) = load(&[
        &a,
        "--duration",
        "4s",
        "--connections",
        "300",
        "--source",
        "127.1.0.0/28",
        "--request",
        "/f.bin",
    ]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert_eq!(n(&v, "established"), 300, "{v}");
    assert_eq!(n(&v, "alive_at_end"), 300, "{v}");
    assert_eq!(n(&v, "failed"), 0, "{v}");
    assert_eq!(n(&v, "source_addresses"), 14, "{v}");
    assert_eq!(n(&v, "sockets"), 14, "{v}");
    assert!(n(&v, "requests_ok") >= 300, "{v}");
    assert_eq!(n(&v, "content_length_mismatches"), 0, "{v}");
    assert_eq!(n(&v, "requests_unanswered"), 0, "{v}");
    // 14 sockets, the probe's, the runtime's and stdio: far below 300.
    let fds = n(&v, "client_fds_peak");
    assert!(fds > 14 && fds < 100, "{fds} descriptors: {v}");
    assert!(v["new_client"]["samples"].as_u64().unwrap() >= 1, "{v}");
    assert!(n(&v, "client_rss_kib_peak") > 0, "{v}");

    // The same from one address: the server's per-address bound refuses
    // all but 30 (after their handshakes: by its code, or by no longer
    // answering), so at most 30 are served, and at least 270 are lost or
    // left without an answer.
    let (v, code, _) = load(&[
        &a,
        "--duration",
        "3s",
        "--connections",
        "300",
        "--source",
        "127.1.0.1",
        "--request",
        "/f.bin",
        "--probe-every",
        "0",
    ]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(n(&v, "source_addresses"), 1, "{v}");
    assert!(n(&v, "requests_ok") <= 30, "{v}");
    let refused = n(&v, "failed") + n(&v, "requests_unanswered");
    assert!(refused >= 270, "{v}");
    assert!(n(&v, "failed") <= 300, "{v}");
}

/// With a keep-alive shorter than the server's 1 s idle timeout, the
/// connections are all open after 3.5 s; without it, they are all lost
/// to the idle timeout, and the run says so.
#[test]
fn load_keepalive_keeps_connections_past_the_idle_timeout() {
    let www = Www::new("ka");
    let (_srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--www",
        www.path(),
        "--idle-timeout",
        "1",
    ]);
    let a = addr.to_string();
    let common = [
        a.as_str(),
        "--duration",
        "3.5s",
        "--connections",
        "20",
        "--request",
        "/f.bin",
        "--probe-every",
        "0",
    ];
    let mut with = common.to_vec();
    with.extend(["--keepalive", "300ms"]);
    let (v, code, err) = load(&with);
    assert_eq!(code, Some(0), "{v} {err}");
    assert_eq!(n(&v, "established"), 20, "{v}");
    assert_eq!(n(&v, "alive_at_end"), 20, "{v}");

    let (v, code, _) = load(&common);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(n(&v, "established"), 20, "{v}");
    assert_eq!(n(&v, "alive_at_end"), 0, "{v}");
    assert_eq!(v["failures"]["lost: timeout"].as_u64(), Some(20), "{v}");
}

/// A file of the README's file server (`quic serve --www`) is checked
/// against its content-length, again every --request-every.
#[test]
fn load_requests_any_file_checked_against_content_length() {
    let www = Www::new("cl");
    let (_srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--www",
        www.path(),
    ]);
    let (v, code, err) = load(&[
        &addr.to_string(),
        "--duration",
        "2.5s",
        "--connections",
        "5",
        "--request",
        "/f.bin",
        "--request-every",
        "1s",
    ]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert!(n(&v, "requests_ok") >= 10, "{v}");
    assert_eq!(n(&v, "responses_without_content_length"), 0, "{v}");
    assert!(v["new_client"]["samples"].as_u64().unwrap() >= 1, "{v}");
    // `--request-every 0`: back to back, as soon as a response is whole
    // (asked once, a connection would count 1).
    let (v, code, err) = load(&[
        &addr.to_string(),
        "--duration",
        "1.5s",
        "--connections",
        "1",
        "--request",
        "/f.bin",
        "--request-every",
        "0",
        "--probe-every",
        "0",
    ]);
    assert_eq!(code, Some(0), "{v} {err}");
    assert!(n(&v, "requests_ok") >= 2, "{v}");
    assert_eq!(n(&v, "requests_failed"), 0, "{v}");
    // A file that is not there is a failed request, by its status.
    let (v, code, _) = load(&[
        &addr.to_string(),
        "--duration",
        "1s",
        "--connections",
        "2",
        "--request",
        "/missing",
        "--probe-every",
        "0",
    ]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(
        v["failures"]["request: status 404"].as_u64(),
        Some(2),
        "{v}"
    );
}

/// An HTTP/3 server (quinn and h3) that announces a content-length of
/// 1000 and sends 600 bytes; its address. It runs until the test ends.
fn lying_server() -> SocketAddr {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
    let cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let ep = quinn::Endpoint::server(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
            tx.send(ep.local_addr().unwrap()).unwrap();
            while let Some(inc) = ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = inc.await else { return };
                    let Ok(mut h3) = h3::server::Connection::<_, bytes::Bytes>::new(
                        h3_quinn::Connection::new(conn),
                    )
                    .await
                    else {
                        return;
                    };
                    while let Ok(Some(r)) = h3.accept().await {
                        tokio::spawn(async move {
                            let Ok((_, mut s)) = r.resolve_request().await else {
                                return;
                            };
                            let resp = http::Response::builder()
                                .header(http::header::CONTENT_LENGTH, "1000")
                                .body(())
                                .unwrap();
                            let _ = s.send_response(resp).await;
                            let _ = s.send_data(bytes::Bytes::from(vec![7u8; 600])).await;
                            let _ = s.finish().await;
                        });
                    }
                });
            }
        });
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap()
}

/// A body shorter than its content-length is a failed request, counted
/// as a mismatch, and the run fails.
#[test]
fn load_reports_a_body_unlike_its_content_length() {
    let addr = lying_server();
    let (v, code, _) = load(&[
        &addr.to_string(),
        "--duration",
        "1.5s",
        "--connections",
        "3",
        "--request",
        "/anything",
    ]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(n(&v, "content_length_mismatches"), 3, "{v}");
    assert_eq!(
        v["failures"]["request: body length differs from content-length"].as_u64(),
        Some(3),
        "{v}"
    );
    assert!(
        v["errors"][0]
            .as_str()
            .unwrap()
            .contains("content-length 1000, body 600 bytes"),
        "{v}"
    );
    // The probes are checked the same way: they fail.
    assert_eq!(v["new_client"]["samples"].as_u64(), Some(0), "{v}");
}

/// Bad values of the long-lived mode are usage errors (status 2) that
/// name the option.
#[test]
fn load_duration_options_reject_bad_values() {
    for (args, want) in [
        (vec!["--duration", "x"], "--duration x"),
        (vec!["--duration", "0"], "--duration"),
        (
            vec!["--duration", "1", "--source", "127.1.0.0/33"],
            "--source",
        ),
        (vec!["--duration", "1", "--source", "nope"], "--source"),
        (vec!["--duration", "1", "--source", "::1"], "address family"),
        // Not assigned here (a documentation prefix): not bindable.
        (
            vec!["--duration", "1", "--source", "192.0.2.0/30"],
            "--source 192.0.2.0/30",
        ),
        (vec!["--duration", "1", "--keepalive", "1ms"], "--keepalive"),
        (
            vec!["--duration", "1", "--request-every", "5ms"],
            "--request-every 5ms: at least 10ms",
        ),
        (
            vec!["--duration", "1", "--request-every", "soon"],
            "--request-every",
        ),
        (
            vec!["--duration", "1", "--concurrency", "0"],
            "--concurrency",
        ),
        (vec!["--duration", "1", "--rate", "0"], "--rate"),
        (vec!["--duration", "1", "--endpoints", "0"], "--endpoints"),
        (vec!["--duration", "1", "--request", "nope"], "--request"),
        (vec!["--source", "127.1.0.0/16"], "only with --duration"),
        (vec!["--keepalive", "1ms"], "--keepalive 1ms"),
        (vec!["--rebind", "-1"], "--rebind -1"),
        (vec!["--rebind-address", "10.0.0.1"], "only with --rebind"),
        (
            vec!["--rebind", "1", "--stack", "tls-tcp"],
            "not with --stack tls-tcp",
        ),
        (
            vec!["--duration", "1", "--rebind", "1"],
            "not with --duration",
        ),
    ] {
        let mut all = vec!["quic", "load", "127.0.0.1:9"];
        all.extend(args.iter().copied());
        let o = fastudp(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
