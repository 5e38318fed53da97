//! `fastudp quic serve` and `quic load`: content, rate, robustness (clients
//! that vanish, garbage, floods of Initials), Ctrl-C, on loopback and on
//! the testbed.

use crate::common;
use fastudp_test_support as skip_check;

use common::quic_server::{serve, stats_until};
use common::{fastudp, privileged, wait_for_sigint_handler, Running};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `fastudp quic load` to its end; its JSON summary and exit status.
fn load(args: &[&str]) -> (serde_json::Value, Option<i32>, String) {
    let mut all = vec!["quic", "load", "--json"];
    all.extend_from_slice(args);
    let o = fastudp(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    (v, o.status.code(), err)
}

/// Resident memory of a process, kB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The pattern byte at offset `i` (as the server writes it).
fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

/// A certificate and key for `localhost`, as PEM files in a fresh
/// directory; and the certificate, for the client to trust.
fn cert_files(tag: &str) -> (String, String, rustls::pki_types::CertificateDer<'static>) {
    let dir = std::env::temp_dir().join(format!("fastudp-quic-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cp, kp) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cp, c.cert.pem()).unwrap();
    std::fs::write(&kp, c.key_pair.serialize_pem()).unwrap();
    (
        cp.to_str().unwrap().into(),
        kp.to_str().unwrap().into(),
        c.cert.der().clone(),
    )
}

/// A quinn client that trusts `cert` and speaks hq-interop.
fn client(server: SocketAddr, cert: rustls::pki_types::CertificateDer<'static>) -> quinn::Endpoint {
    client_with(server, cert, None)
}

/// [`client`], with a stream receive window of `window` bytes if given.
fn client_with(
    server: SocketAddr,
    cert: rustls::pki_types::CertificateDer<'static>,
    window: Option<u32>,
) -> quinn::Endpoint {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"hq-interop".to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    if let Some(w) = window {
        let mut t = quinn::TransportConfig::default();
        t.stream_receive_window(w.into());
        cfg.transport_config(Arc::new(t));
    }
    let bind: SocketAddr = if server.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let mut ep = quinn::Endpoint::client(bind).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

/// What a request got: the body, or the stream's reset code.
async fn fetch(conn: &quinn::Connection, request: &[u8]) -> anyhow::Result<Vec<u8>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(request).await?;
    let _ = send.finish();
    Ok(recv.read_to_end(1 << 30).await?)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A quinn client fetches /bytes/10000000 with the server's own
/// certificate (--cert/--key) and checks every byte; a bad request and an
/// over-long one are reset with their codes; the server counts it all.
fn fetch_and_check(listen: &str, tag: &str, extra: &[&str]) {
    let (cert, key, der) = cert_files(tag);
    let mut args = vec![
        "--listen",
        listen,
        "--workers",
        "2",
        "--cert",
        &cert,
        "--key",
        &key,
    ];
    args.extend_from_slice(extra);
    let (mut srv, addr) = serve(&args);
    rt().block_on(async {
        let ep = client(addr, der);
        let conn = tokio::time::timeout(Duration::from_secs(30), async {
            ep.connect(addr, "localhost").unwrap().await
        })
        .await
        .expect("handshake in time")
        .expect("handshake");
        assert_eq!(
            conn.handshake_data()
                .unwrap()
                .downcast::<quinn::crypto::rustls::HandshakeData>()
                .unwrap()
                .protocol
                .as_deref(),
            Some(&b"hq-interop"[..])
        );
        let body = fetch(&conn, b"GET /bytes/10000000\r\n").await.unwrap();
        assert_eq!(body.len(), 10_000_000);
        if let Some(i) = (0..body.len()).find(|&i| body[i] != pattern(i as u64)) {
            panic!("byte {i} is wrong");
        }
        let e = fetch(&conn, b"GET /nothing/here\r\n").await.unwrap_err();
        assert!(
            e.to_string().contains("16"),
            "reset with BAD_REQUEST (0x10): {e}"
        );
        let long = vec![b'x'; 2000];
        let e = fetch(&conn, &long).await.unwrap_err();
        assert!(
            e.to_string().contains("17"),
            "reset with TOO_LONG (0x11): {e}"
        );
        // The connection survives bad requests.
        assert_eq!(
            fetch(&conn, b"GET /bytes/5\r\n").await.unwrap(),
            [0, 1, 2, 3, 4]
        );
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
    let v = stats_until(&mut srv, |v| v["connections"] == 0 && v["accepted"] == 1);
    assert!(v["retransmissions"].as_u64().is_some());
    srv.interrupt();
    let end = srv.finish();
    assert!(end.stdout.contains("\"summary\""), "{}", end.stdout);
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
}

#[test]
fn quinn_client_fetches_bytes_on_loopback_v4() {
    fetch_and_check("127.0.0.1:0", "v4", &[]);
}

#[test]
fn quinn_client_fetches_bytes_on_loopback_v6() {
    if UdpSocket::bind("[::1]:0").is_err() {
        common::skip(
            "quinn_client_fetches_bytes_on_loopback_v6",
            "no IPv6 loopback",
        );
        return;
    }
    fetch_and_check("[::1]:0", "v6", &[]);
}

/// The same with zerocopy sends and kernel pacing asked for: where the
/// qdisc cannot honour SO_TXTIME, the server says why and paces with
/// quinn-proto alone.
#[test]
fn zerocopy_and_kernel_pacing_fall_back_cleanly() {
    let (cert, key, der) = cert_files("zc");
    let mut r = Running::start(&[
        "quic",
        "serve",
        "--json",
        "--test-endpoints",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--cert",
        &cert,
        "--key",
        &key,
        "--zerocopy",
        "--pacing",
        "kernel",
        "--duration",
        "30",
    ]);
    let l = r.wait_for_line(|l| l.contains("\"listening\""));
    let v: serde_json::Value = serde_json::from_str(&l).unwrap();
    let addr: SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
    rt().block_on(async {
        let ep = client(addr, der);
        let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
        let body = fetch(&conn, b"GET /bytes/3000000\r\n").await.unwrap();
        assert_eq!(body.len(), 3_000_000);
        assert!(body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i as u64)));
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
    r.interrupt();
    let end = r.finish();
    let summary: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"summary\""))
            .unwrap(),
    )
    .unwrap();
    let pacing = summary["pacing"].as_str().unwrap();
    if pacing.starts_with("kernel") {
        assert!(pacing.contains("honours SO_TXTIME"), "{pacing}");
    } else {
        assert!(pacing.contains("fallback from kernel"), "{pacing}");
        assert!(
            end.stderr.contains("--pacing kernel:") && end.stderr.contains("SO_TXTIME"),
            "the fallback says why: {}",
            end.stderr
        );
    }
}

/// 200 concurrent /video connections for 3 s on loopback: every one
/// completes with its bytes checked. How many kept their rate is reported
/// (`on_rate_share`), not judged: a busy machine is slow, not wrong.
#[test]
fn two_hundred_video_connections_get_every_byte() {
    let (srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "2"]);
    let (v, code, err) = load(&[
        &addr.to_string(),
        "--connections",
        "200",
        "--request",
        "/video/62500/3",
    ]);
    assert_eq!(code, Some(0), "{v}\n{err}");
    assert_eq!(v["completed"], 200, "{v}");
    assert_eq!(v["wrong_bytes"], 0, "{v}");
    let share = v["on_rate_share"].as_f64().expect("on_rate_share reported");
    assert!((0.0..=1.0).contains(&share), "{v}");
    srv.interrupt();
    let end = srv.finish();
    // Ctrl-C ends the server with its summary, and says so in a sentence.
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(
        end.stderr
            .contains("interrupted (Ctrl-C); the summary above covers the run until then"),
        "{}",
        end.stderr
    );
    let s: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"summary\""))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(s["accepted"], 200, "{s}");
    // Batched sends: more than one datagram per send call on average.
    assert!(s["datagrams_per_send_call"].as_f64().unwrap() > 1.0, "{s}");
}

/// The wake-up levers of docs/BENCHMARKS.md section 17.3 away from their
/// defaults (every other test runs with 1 ms timer ticks and coalesced
/// turns): each timer at its own time, a turn for every arrival, and a
/// busy-poll before each sleep. Video and bulk connections still get
/// every byte, in order.
#[test]
fn ticks_and_busy_poll_keep_every_byte() {
    let (srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--timer-tick-us",
        "0",
        "--busy-poll-us",
        "50",
        "--rx-coalesce-us",
        "0",
    ]);
    for request in ["/video/62500/2", "/bytes/3000000"] {
        let (v, code, err) = load(&[
            &addr.to_string(),
            "--connections",
            "50",
            "--request",
            request,
        ]);
        assert_eq!(code, Some(0), "{request}: {v}\n{err}");
        assert_eq!(v["completed"], 50, "{request}: {v}");
        assert_eq!(v["wrong_bytes"], 0, "{request}: {v}");
    }
    srv.interrupt();
    let end = srv.finish();
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
}

/// Clients that vanish mid-stream: the server's connections time out, and
/// its memory comes back to where it was after the first such round
/// (glibc keeps what it freed for reuse, so the first round sets the
/// baseline): round after round, nothing is left behind.
#[test]
fn vanished_clients_time_out_and_memory_returns() {
    let (mut srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--idle-timeout",
        "1",
        // The default share of one address (a quarter of the connection
        // limit, which the memory budget sets) may be below 300.
        "--max-connections-per-ip",
        "300",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let base = rss_kb(srv.pid());
    let mut after = Vec::new();
    let mut peak = base;
    for round in 1..=3u64 {
        let mut client = Command::new(env!("CARGO_BIN_EXE_fastudp"))
            .args([
                "quic",
                "load",
                &addr.to_string(),
                "--connections",
                "300",
                "--request",
                "/video/25000/60",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        stats_until(&mut srv, |v| v["connections"] == 300);
        std::thread::sleep(Duration::from_millis(500));
        peak = peak.max(rss_kb(srv.pid()));
        // SIGKILL: no close, the packets just stop.
        client.kill().unwrap();
        client.wait().unwrap();
        let pid = srv.pid();
        let top = std::cell::Cell::new(peak);
        let v = stats_until(&mut srv, |v| {
            top.set(top.get().max(rss_kb(pid)));
            v["connections"] == 0
        });
        peak = top.get();
        assert_eq!(v["accepted"], 300 * round);
        after.push(rss_kb(srv.pid()));
    }
    eprintln!("RSS kB: base {base}, peak with 300 connections {peak}, after each round {after:?}");
    // A leak of the connections would add their whole share each round.
    let slack = (peak - base) / 4 + 2 * 1024;
    assert!(
        after[1] <= after[0] + slack && after[2] <= after[0] + slack,
        "memory grows round by round: base {base} kB, peak {peak} kB, after each round {after:?} kB"
    );
    srv.interrupt();
    srv.finish();
}

/// Garbage datagrams of every size and first byte are dropped; the server
/// goes on serving.
#[test]
fn garbage_datagrams_are_dropped() {
    let (mut srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "2"]);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..3000usize {
        let len = (next() % 1500) as usize;
        let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if let Some(b) = d.first_mut() {
            // Every header form, and long headers of QUIC v1 too.
            *b = i as u8;
        }
        if i % 3 == 0 && d.len() > 5 {
            d[1..5].copy_from_slice(&1u32.to_be_bytes());
        }
        let _ = s.send_to(&d, addr);
    }
    let v = stats_until(&mut srv, |v| v["dropped"].as_u64().unwrap() > 0);
    assert_eq!(v["connections"], 0, "{v}");
    let (v, code, err) = load(&[
        &addr.to_string(),
        "--connections",
        "2",
        "--request",
        "/bytes/100000",
    ]);
    assert_eq!(code, Some(0), "{v}\n{err}");
    srv.interrupt();
    let end = srv.finish();
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
}

/// A flood the worker cannot keep up with (stopped with SIGSTOP while it
/// arrives): what overflows its receive buffer is counted in
/// `rx_overflow`, the rest in `dropped`, and together they are every
/// datagram sent: nothing is lost without a count.
#[test]
fn a_full_receive_buffer_is_counted() {
    let (mut srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "1"]);
    let pid = srv.pid().to_string();
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig}");
    };
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    // 20 bytes with the fixed bit clear: no QUIC packet, too short for a
    // stateless reset; the worker drops each one it reads.
    let junk = [0u8; 20];
    let n = 200_000u64;
    signal("-STOP");
    for _ in 0..n {
        s.send_to(&junk, addr).unwrap();
    }
    signal("-CONT");
    let v = stats_until(&mut srv, |v| {
        v["dropped"].as_u64().unwrap() + v["rx_overflow"].as_u64().unwrap() >= n
    });
    assert_eq!(
        v["dropped"].as_u64().unwrap() + v["rx_overflow"].as_u64().unwrap(),
        n,
        "{v}"
    );
    assert!(v["rx_overflow"].as_u64().unwrap() > 0, "{v}");
    srv.interrupt();
    srv.finish();
}

/// Initial packets of `n` connections, from `sockets` source ports; the
/// datagrams that came back, by first byte's packet type.
fn flood_initials(server: SocketAddr, n: usize, sockets: usize) -> (usize, usize) {
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"hq-interop".to_vec()];
    let cfg = quinn_proto::ClientConfig::new(Arc::new(
        quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut ep = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let socks: Vec<UdpSocket> = (0..sockets)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let mut buf = Vec::new();
    let (mut retries, mut other) = (0, 0);
    let mut drain = |socks: &[UdpSocket]| {
        let mut b = [0u8; 2048];
        for s in socks {
            while let Ok(n) = s.recv(&mut b) {
                // RFC 9000 17.2.5: a v1 Retry is a long header of type 3.
                if n > 0 && b[0] & 0xF0 == 0xF0 {
                    retries += 1;
                } else {
                    other += 1;
                }
            }
        }
    };
    for i in 0..n {
        let (_, mut conn) = ep
            .connect(Instant::now(), cfg.clone(), server, "localhost")
            .unwrap();
        buf.clear();
        let t = conn.poll_transmit(Instant::now(), 1, &mut buf).unwrap();
        let _ = socks[i % sockets].send_to(&buf[..t.size], server);
        if i % 100 == 99 {
            std::thread::sleep(Duration::from_millis(5));
            drain(&socks);
        }
    }
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        drain(&socks);
    }
    (retries, other)
}

/// A flood of Initials from many source ports: with --retry every one
/// gets a Retry and no connection state; without, --max-connections caps
/// the connections (half of them at most handshakes under way, the rest
/// of the flood gets a Retry), they time out, and memory stays bounded.
#[test]
fn initial_flood_is_bounded_and_retry_validates() {
    let (mut srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "2", "--retry"]);
    std::thread::sleep(Duration::from_millis(300));
    let base = rss_kb(srv.pid());
    let (retries, other) = flood_initials(addr, 2000, 64);
    let v = stats_until(&mut srv, |v| v["retries"].as_u64().unwrap() >= 1900);
    assert_eq!(v["accepted"], 0, "no state before validation: {v}");
    assert!(retries >= 1900, "{retries} Retry packets, {other} others");
    let grown = rss_kb(srv.pid()).saturating_sub(base);
    assert!(grown < 32 * 1024, "grew by {grown} kB");
    // A real client passes the Retry.
    let (v, code, err) = load(&[
        &addr.to_string(),
        "--connections",
        "3",
        "--request",
        "/bytes/1000",
    ]);
    assert_eq!(code, Some(0), "{v}\n{err}");
    srv.interrupt();
    srv.finish();

    let (mut srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--max-connections",
        "200",
        "--idle-timeout",
        "1",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let base = rss_kb(srv.pid());
    flood_initials(addr, 2000, 64);
    // Past 100 handshakes under way (half the places), the rest get a
    // Retry.
    let v = stats_until(&mut srv, |v| {
        v["refused"].as_u64().unwrap()
            + v["accepted"].as_u64().unwrap()
            + v["retries"].as_u64().unwrap()
            >= 1900
    });
    assert!(v["accepted"].as_u64().unwrap() <= 200, "{v}");
    assert!(v["connections"].as_u64().unwrap() <= 200, "{v}");
    let grown = rss_kb(srv.pid()).saturating_sub(base);
    assert!(grown < 64 * 1024, "grew by {grown} kB");
    stats_until(&mut srv, |v| v["connections"] == 0);
    srv.interrupt();
    srv.finish();

    // Without --retry, past --max-half-open unvalidated handshakes a
    // worker, new clients get a Retry: the flood costs no more state.
    let (mut srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--max-half-open",
        "100",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let (retries, other) = flood_initials(addr, 1000, 64);
    let v = stats_until(&mut srv, |v| {
        v["retries"].as_u64().unwrap() + v["accepted"].as_u64().unwrap() >= 950
    });
    assert!(v["accepted"].as_u64().unwrap() <= 200, "{v}");
    assert!(
        retries >= 750,
        "{retries} Retry packets, {other} others; {v}"
    );
    srv.interrupt();
    srv.finish();
}

/// Ctrl-C drains, and at the end of --drain-timeout closes every
/// connection still open with an application close (code 0), which the
/// clients see; the server ends with its summary.
#[test]
fn ctrl_c_closes_connections() {
    let (mut srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--drain-timeout",
        "1",
    ]);
    wait_for_sigint_handler(srv.pid());
    let client = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args([
            "quic",
            "load",
            "--json",
            &addr.to_string(),
            "--connections",
            "20",
            "--request",
            "/video/125000/60",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    stats_until(&mut srv, |v| v["connections"] == 20);
    let t = Instant::now();
    srv.interrupt();
    let end = srv.finish();
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "closed without waiting for idle timeouts"
    );
    let s: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"summary\""))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(s["connections"], 0, "{s}");
    let o = client.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["failed"], 20, "{v}");
    let errs = v["errors"].to_string();
    assert!(
        errs.contains("closed by peer") && errs.contains("server shutting down"),
        "{errs}"
    );
}

#[test]
fn bad_arguments_are_refused() {
    common::assert_refused(&[
        (vec!["quic", "serve", "--workers", "0"], "--workers"),
        (vec!["quic", "serve", "--interval", "0"], "--interval"),
        (
            vec!["quic", "serve", "--cert", "/nonexistent"],
            "--cert and --key",
        ),
        (
            vec![
                "quic",
                "serve",
                "--cert",
                "/nonexistent",
                "--key",
                "/nonexistent",
            ],
            "--cert",
        ),
        (
            vec!["quic", "serve", "--stack", "quinn", "--zerocopy"],
            "--stack fastudp",
        ),
        (
            vec!["quic", "serve", "--drain-timeout", "-1"],
            "--drain-timeout -1: between 0 and 3600 s",
        ),
        (
            vec![
                "quic",
                "serve",
                "--stack",
                "quinn",
                "--metrics",
                "127.0.0.1:0",
            ],
            "--metrics and --drain-timeout need --stack fastudp",
        ),
        (vec!["quic", "serve", "--metrics", "localhost"], "--metrics"),
        (
            vec!["quic", "serve", "--www", "/nonexistent-www"],
            "--www /nonexistent-www",
        ),
        (
            vec!["quic", "serve", "--www", "/etc/passwd"],
            "--www /etc/passwd",
        ),
        (
            vec!["quic", "serve", "--stack", "quinn", "--www", "/tmp"],
            "--www needs --stack fastudp",
        ),
        (
            vec!["quic", "serve", "--timer-tick-us", "10001"],
            "--timer-tick-us 10001: between 0 and 10000",
        ),
        (
            vec!["quic", "serve", "--busy-poll-us", "1001"],
            "--busy-poll-us 1001: between 0 and 1000",
        ),
        (
            vec!["quic", "serve", "--rx-coalesce-us", "1001"],
            "--rx-coalesce-us 1001: between 0 and 1000",
        ),
        (
            vec![
                "quic",
                "serve",
                "--stack",
                "quinn",
                "--timer-tick-us",
                "500",
            ],
            "need --stack fastudp",
        ),
        (
            vec!["quic", "load", "127.0.0.1:1", "--request", "/x"],
            "--request",
        ),
        (
            vec!["quic", "load", "127.0.0.1:1", "--connections", "0"],
            "--connections",
        ),
    ]);
}

/// `quic serve` and `quic load` tell bad input (exit status 2) from a run
/// that failed (exit status 1), each in one line: a port another socket
/// holds is the host's state, not the arguments' fault; a missing
/// certificate file is the arguments'.
#[test]
fn serve_and_load_exit_2_for_bad_input_and_1_for_a_failed_run() {
    use common::assert_one_line_error;
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let held = udp.local_addr().unwrap().to_string();
    for stack in ["fastudp", "quinn"] {
        let o = fastudp(&[
            "quic",
            "serve",
            "--test-endpoints",
            "--stack",
            stack,
            "--listen",
            &held,
            "--workers",
            "1",
        ]);
        assert_one_line_error(&o, 1, &format!("--listen {held}"));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("already"),
            "{stack}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_tcp = tcp.local_addr().unwrap().to_string();
    let o = fastudp(&[
        "quic",
        "serve",
        "--test-endpoints",
        "--stack",
        "tls-tcp",
        "--listen",
        &held_tcp,
        "--workers",
        "1",
    ]);
    assert_one_line_error(&o, 1, &format!("--listen {held_tcp}"));
    let o = fastudp(&[
        "quic",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--cert",
        "/nonexistent/cert.pem",
        "--key",
        "/nonexistent/key.pem",
    ]);
    assert_one_line_error(&o, 2, "--cert /nonexistent/cert.pem: No such file");

    // Nothing listens on this TCP port: the connection is refused, the
    // run reports it and fails.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let o = fastudp(&[
        "quic",
        "load",
        &closed,
        "--stack",
        "tls-tcp",
        "--connections",
        "1",
        "--request",
        "/bytes/10",
    ]);
    assert_one_line_error(&o, 1, "1 of 1 connections failed, 0 got wrong bytes");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("1 failed"),
        "the summary comes first: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = fastudp(&["quic", "load", &closed, "--timeline", "5"]);
    assert_one_line_error(&o, 2, "--timeline 5: 10 to 10000 ms");
    drop((udp, tcp));
}

/// The baselines serve the same protocol: the load generator gets the
/// same checked bytes from plain quinn and from TLS over TCP.
#[test]
fn baselines_serve_the_same_bytes() {
    for (stack, client) in [("quinn", "quic"), ("tls-tcp", "tls-tcp")] {
        let (srv, addr) = serve(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "2",
            "--stack",
            stack,
        ]);
        let (v, code, err) = load(&[
            &addr.to_string(),
            "--stack",
            client,
            "--connections",
            "2",
            "--request",
            "/bytes/2000000",
        ]);
        assert_eq!(code, Some(0), "{stack}: {v}\n{err}");
        let (v, code, err) = load(&[
            &addr.to_string(),
            "--stack",
            client,
            "--connections",
            "20",
            "--request",
            "/video/62500/2",
        ]);
        assert_eq!(code, Some(0), "{stack}: {v}\n{err}");
        assert_eq!(v["completed"], 20, "{stack}: {v}");
        assert_eq!(v["wrong_bytes"], 0, "{stack}: {v}");
        assert!(v["on_rate_share"].as_f64().is_some(), "{stack}: {v}");
        srv.interrupt();
        let end = srv.finish();
        // Goodput: every response delivered whole, 2 x 2,000,000 bytes
        // and 20 x 50 frames of 2,500.
        let sum = last_json(&end.stdout, "summary");
        assert_eq!(sum["goodput_bytes"], 6_500_000, "{stack}: {sum}");
    }
}

/// On the testbed (a veth pair between namespaces), IPv4 and IPv6: the
/// load generator fetches /bytes/10000000 and checks every byte.
#[test]
fn fetches_bytes_on_the_testbed_v4_and_v6() {
    if !privileged("fetches_bytes_on_the_testbed_v4_and_v6", &["ip", "ethtool"]) {
        return;
    }
    let _lock = common::testbed_lock();
    let o = fastudp(&["testbed", "up", "offload"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bin = env!("CARGO_BIN_EXE_fastudp");
    let result = std::panic::catch_unwind(|| {
        for (listen, host) in [
            ("10.200.0.2:0", "10.200.0.2"),
            ("[fd00:fa57::2]:0", "[fd00:fa57::2]"),
        ] {
            let mut srv = Running::start_with(
                "ip",
                &[
                    "netns",
                    "exec",
                    "fastudp-rx",
                    bin,
                    "quic",
                    "serve",
                    "--json",
                    "--test-endpoints",
                    "--listen",
                    listen,
                    "--workers",
                    "2",
                ],
            );
            let l = srv.wait_for_line(|l| l.contains("\"listening\""));
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            let port = v["addr"]
                .as_str()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .to_string();
            let o = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    "fastudp-tx",
                    bin,
                    "quic",
                    "load",
                    "--json",
                    &format!("{host}:{port}"),
                    "--connections",
                    "1",
                    "--request",
                    "/bytes/10000000",
                ])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
            assert!(o.status.success(), "{listen}: {v}");
            assert_eq!(v["completed"], 1, "{listen}: {v}");
            assert_eq!(v["wrong_bytes"], 0, "{listen}: {v}");
            srv.interrupt();
            srv.finish();
        }
    });
    let o = fastudp(&["testbed", "down"]);
    assert!(o.status.success());
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// Whether python3 with aioquic is here; otherwise says why the test
/// skips, or fails under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (CI, whose
/// scripts/install-test-deps.sh installs it).
fn have_aioquic(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import aioquic"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        common::skip(
            test,
            "needs python3 with aioquic (pip install aioquic==1.7.2; scripts/install-test-deps.sh installs it)",
        );
    }
    ok
}

/// A test whose external tool is missing says so where `cargo test` shows
/// it without `--nocapture` (not a silent `ok`), and fails under
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`. Shown by running the aioquic test
/// in a child of this test binary with no python3 on its `PATH`.
#[test]
fn a_missing_tool_is_a_visible_skip_and_a_failure_in_ci() {
    skip_check::skip_is_visible_and_fails_in_ci(
        "quic::aioquic_client_interoperates",
        "needs python3 with aioquic",
    );
}

/// Another implementation's client (aioquic) talks to the server: QUIC
/// v1, ALPN hq-interop, checked bytes, a bad request reset with its code,
/// a video stream; with and without Retry.
#[test]
fn aioquic_client_interoperates() {
    if !have_aioquic("aioquic_client_interoperates") {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    for extra in [&[][..], &["--retry"][..]] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--workers", "2"];
        args.extend_from_slice(extra);
        let (mut srv, addr) = serve(&args);
        let o = Command::new("python3")
            .args([
                script,
                "127.0.0.1",
                &addr.port().to_string(),
                "/bytes/3000000",
                "/not/served",
                "/bytes/0",
                "/video/200000/1",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{extra:?}: {err}");
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
        assert_eq!(v["alpn"], "hq-interop", "{v}");
        assert_eq!(v["version"], 1, "QUIC v1: {v}");
        let r = &v["responses"];
        assert_eq!(r[0]["bytes"], 3_000_000, "{v}");
        assert_eq!(r[0]["pattern"], true, "{v}");
        assert_eq!(r[1]["reset"], 0x10, "{v}");
        assert_eq!(r[2]["bytes"], 0, "{v}");
        assert_eq!(r[3]["bytes"], 200_000, "{v}");
        assert_eq!(r[3]["pattern"], true, "{v}");
        let s = stats_until(&mut srv, |v| v["accepted"] == 1 && v["connections"] == 0);
        if !extra.is_empty() {
            assert!(s["retries"].as_u64().unwrap() >= 1, "{s}");
        }
        srv.interrupt();
        srv.finish();
    }
}

/// aioquic's HTTP/3 client (its H3 layer, ALPN `h3`) fetches `/bytes/N`
/// byte-exact, many in parallel on one connection (more than the 16
/// request streams the server allows at once), a 404 and a video stream;
/// hq-interop answers on the same port; the server counts the HTTP/3
/// requests.
#[test]
fn aioquic_h3_client_fetches_in_parallel() {
    if !have_aioquic("aioquic_h3_client_fetches_in_parallel") {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    let (mut srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "2"]);
    let port = addr.port().to_string();
    let sizes: Vec<u64> = (0..20u64)
        .map(|i| [0, 1, 65_535, 65_536, 65_537, 1_000_003][i as usize % 6] + i * 7919)
        .chain([3_000_000])
        .collect();
    let mut paths: Vec<String> = sizes.iter().map(|n| format!("/bytes/{n}")).collect();
    paths.push("/not/served".into());
    paths.push("/video/200000/1".into());
    let mut args = vec![script, "--h3", "--any-status", "127.0.0.1", &port];
    args.extend(paths.iter().map(String::as_str));
    let o = Command::new("python3").args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["alpn"], "h3", "{v}");
    let r = v["responses"].as_array().unwrap();
    assert_eq!(r.len(), paths.len(), "{v}");
    for (i, n) in sizes.iter().enumerate() {
        assert_eq!(r[i]["status"], 200, "{}: {v}", paths[i]);
        assert_eq!(r[i]["content_length"], *n, "{}", paths[i]);
        assert_eq!(r[i]["bytes"], *n, "{}", paths[i]);
        assert_eq!(r[i]["pattern"], true, "{}", paths[i]);
    }
    let k = sizes.len();
    assert_eq!(r[k]["status"], 404, "{v}");
    assert_eq!(r[k + 1]["status"], 200, "{v}");
    assert_eq!(r[k + 1]["bytes"], 200_000, "{v}");
    assert_eq!(r[k + 1]["pattern"], true, "{v}");
    // hq-interop on the same port.
    let o = Command::new("python3")
        .args([script, "127.0.0.1", &port, "/bytes/300000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["alpn"], "hq-interop", "{v}");
    assert_eq!(v["responses"][0]["pattern"], true, "{v}");
    let want = paths.len() as u64;
    let s = stats_until(&mut srv, |v| {
        v["h3_requests"] == want && v["accepted"] == 2 && v["connections"] == 0
    });
    assert_eq!(s["h3_refused"], 0, "{s}");
    // Goodput counts the responses whose every byte was acknowledged
    // (HTTP/3 framing included) before the clients closed: HTTP/3's too,
    // not only hq-interop's 300,000 bytes.
    let body: u64 = sizes.iter().sum::<u64>() + 200_000 + 300_000;
    let g = s["goodput_bytes"].as_u64().unwrap();
    assert!(
        (1_000_000..body + 65_536).contains(&g),
        "goodput {g} of {body}: {s}"
    );
    srv.interrupt();
    srv.finish();
}

/// `--www` over HTTP/3 with aioquic's H3 client: files whose bytes are
/// the pattern (so the client checks them) byte-exact and in parallel, a
/// directory's index.html, escapes and a missing file answered 404.
#[test]
fn aioquic_h3_client_fetches_files() {
    if !have_aioquic("aioquic_h3_client_fetches_files") {
        return;
    }
    let base = std::env::temp_dir().join(format!("fastudp-h3www-{}", std::process::id()));
    let www = base.join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::write(base.join("secret"), b"outside").unwrap();
    let pattern = |n: usize| -> Vec<u8> { (0..n).map(|i| (i % 251) as u8).collect() };
    let sizes = [0usize, 1, 65_536, 65_537, 1_000_003, 3_000_000];
    for n in sizes {
        std::fs::write(www.join(format!("f{n}.bin")), pattern(n)).unwrap();
    }
    std::fs::write(www.join("sub/index.html"), pattern(1000)).unwrap();
    let (mut srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--www",
        www.to_str().unwrap(),
    ]);
    let port = addr.port().to_string();
    let mut paths: Vec<String> = sizes.iter().map(|n| format!("/f{n}.bin")).collect();
    paths.push("/sub/".into());
    for p in ["/../secret", "/%2e%2e/secret", "/missing"] {
        paths.push(p.into());
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    let mut args = vec![script, "--h3", "--any-status", "127.0.0.1", &port];
    args.extend(paths.iter().map(String::as_str));
    let o = Command::new("python3").args(&args).output().unwrap();
    let _ = std::fs::remove_dir_all(&base);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    let r = &v["responses"];
    for (i, n) in sizes.iter().enumerate() {
        assert_eq!(r[i]["status"], 200, "{v}");
        assert_eq!(r[i]["content_length"], *n as u64, "{v}");
        assert_eq!(r[i]["bytes"], *n as u64, "{v}");
        assert_eq!(r[i]["pattern"], true, "{v}");
    }
    let k = sizes.len();
    assert_eq!(r[k]["status"], 200, "{v}");
    assert_eq!(r[k]["bytes"], 1000, "{v}");
    for j in 1..=3 {
        assert_eq!(r[k + j]["status"], 404, "{}: {v}", paths[k + j]);
        assert_eq!(r[k + j]["bytes"], 0, "{v}");
    }
    let want = paths.len() as u64;
    stats_until(&mut srv, |v| v["h3_requests"] == want);
    srv.interrupt();
    srv.finish();
}

/// A one-worker server on loopback with a certificate the client can
/// trust (`tag` names its files), plus `extra` arguments.
fn serve_one_worker(
    tag: &str,
    extra: &[&str],
) -> (
    Running,
    SocketAddr,
    rustls::pki_types::CertificateDer<'static>,
) {
    let (cert, key, der) = cert_files(tag);
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--cert",
        &cert,
        "--key",
        &key,
    ];
    args.extend_from_slice(extra);
    let (srv, addr) = serve(&args);
    (srv, addr, der)
}

/// A client that connects to `addr` (trusting `der`) and runs `f`.
fn with_connection<F, Fut>(
    addr: SocketAddr,
    der: rustls::pki_types::CertificateDer<'static>,
    window: Option<u32>,
    f: F,
) where
    F: FnOnce(quinn::Connection) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    rt().block_on(async {
        let ep = client_with(addr, der, window);
        let conn = tokio::time::timeout(Duration::from_secs(30), async {
            ep.connect(addr, "localhost").unwrap().await
        })
        .await
        .expect("handshake in time")
        .expect("handshake");
        f(conn.clone()).await;
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
}

/// STOP_SENDING from the client is answered with RESET_STREAM (RFC 9000
/// 3.5), and a client's RESET_STREAM of its request closes the response
/// side too: either way the stream is closed and its credit comes back.
/// 150 of each (more than the 16 concurrent streams the server allows)
/// leave the connection able to open another stream.
#[test]
fn stopped_and_reset_requests_give_their_streams_back() {
    let (srv, addr, der) = serve_one_worker("stop", &[]);
    with_connection(addr, der, None, |conn| async move {
        for _ in 0..150 {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(b"GET /bytes/100000000\r\n").await.unwrap();
            let _ = send.finish();
            // Wait for the response to start, then stop it.
            let mut b = [0u8; 1];
            recv.read_exact(&mut b).await.unwrap();
            recv.stop(7u32.into()).unwrap();
        }
        for _ in 0..150 {
            let (mut send, _recv) = conn.open_bi().await.unwrap();
            send.write_all(b"GET /bytes/").await.unwrap();
            send.reset(9u32.into()).unwrap();
        }
        let last = tokio::time::timeout(Duration::from_secs(20), fetch(&conn, b"GET /bytes/5\r\n"))
            .await
            .expect("a stream after 300 abandoned ones: the server gave their credit back");
        assert_eq!(last.unwrap(), [0, 1, 2, 3, 4]);
    });
    srv.interrupt();
    let end = srv.finish();
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
}

/// `--www`: a quinn client fetches files byte-exact over hq-interop,
/// four at once on one connection: a 3 MB file through a 100 KB stream
/// window (so the server writes it chunk by chunk as credit comes back),
/// a directory's `index.html`, a percent-encoded name, and `/bytes/N`,
/// which keeps its meaning. Every way out of the directory (`..`, encoded
/// `..`, absolute, a symbolic link out or in) is reset with NOT_FOUND
/// (0x15) and counted as an escape; a missing file is a plain 404.
#[test]
fn www_serves_files_byte_exact_and_refuses_escapes() {
    let base = std::env::temp_dir().join(format!("fastudp-www-{}", std::process::id()));
    let www = base.join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::write(base.join("secret"), b"outside the directory").unwrap();
    // Not the /bytes pattern: a file's own bytes (xorshift).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let big: Vec<u8> = (0..3_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(www.join("big.bin"), &big).unwrap();
    std::fs::write(www.join("sub/index.html"), b"<p>sub</p>").unwrap();
    std::fs::write(www.join("a b.txt"), b"spaced").unwrap();
    std::os::unix::fs::symlink("../secret", www.join("link-out")).unwrap();
    std::os::unix::fs::symlink("big.bin", www.join("link-in")).unwrap();
    let escapes = [
        "/../secret",
        "/%2e%2e/secret",
        "/sub/%2E%2E/../secret",
        "/%2Fetc/passwd",
        "//etc/passwd",
        "/link-out",
        "/link-in",
    ];
    let (srv, addr, der) = serve_one_worker("www", &["--www", www.to_str().unwrap()]);
    with_connection(addr, der, Some(100_000), |conn| async move {
        let (a, b, c, d) = tokio::join!(
            fetch(&conn, b"GET /big.bin\r\n"),
            fetch(&conn, b"GET /sub/\r\n"),
            fetch(&conn, b"GET /a%20b.txt?v=1\r\n"),
            fetch(&conn, b"GET /bytes/5\r\n"),
        );
        let a = a.unwrap();
        assert_eq!(a.len(), big.len());
        if let Some(i) = (0..a.len()).find(|&i| a[i] != big[i]) {
            panic!("byte {i} of big.bin is wrong");
        }
        assert_eq!(b.unwrap(), b"<p>sub</p>");
        assert_eq!(c.unwrap(), b"spaced");
        assert_eq!(d.unwrap(), [0, 1, 2, 3, 4]);
        for t in escapes {
            let e = fetch(&conn, format!("GET {t}\r\n").as_bytes())
                .await
                .expect_err(t);
            assert!(
                e.to_string().contains("21"),
                "{t}: reset with NOT_FOUND (0x15): {e}"
            );
        }
        let e = fetch(&conn, b"GET /missing.html\r\n").await.unwrap_err();
        assert!(
            e.to_string().contains("21"),
            "reset with NOT_FOUND (0x15): {e}"
        );
        let e = fetch(&conn, b"GET /a%zz\r\n").await.unwrap_err();
        assert!(
            e.to_string().contains("16"),
            "reset with BAD_REQUEST (0x10): {e}"
        );
        // Not a GET: refused, not looked up (nor taken for "/").
        for r in [&b"POST /sub/\r\n"[..], b"HEAD /sub/\r\n", b"\r\n"] {
            let e = fetch(&conn, r).await.unwrap_err();
            assert!(
                e.to_string().contains("16"),
                "reset with BAD_REQUEST (0x10): {e}"
            );
        }
    });
    srv.interrupt();
    let end = srv.finish();
    let _ = std::fs::remove_dir_all(&base);
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
    let files: serde_json::Value = end
        .stdout
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v["kind"] == "files")
        })
        .unwrap_or_else(|| panic!("no files line: {}", end.stdout));
    assert_eq!(files["escapes_refused"], escapes.len() as u64, "{files}");
    assert_eq!(files["served"], 3, "{files}");
    assert_eq!(files["not_found"], 1, "{files}");
    assert_eq!(files["bad_requests"], 1, "{files}");
    // The descriptors responses may hold are bounded, per address too.
    let limits: serde_json::Value = end
        .stdout
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v["kind"] == "limits")
        })
        .unwrap_or_else(|| panic!("no limits line: {}", end.stdout));
    let total = limits["max_open_files"].as_u64().unwrap();
    let per_ip = limits["max_open_files_per_ip"].as_u64().unwrap();
    assert!(per_ip >= 1 && per_ip < total, "{limits}");
    assert_eq!(files["unavailable"], 0, "{files}");
}

/// `--www` with another implementation's client (aioquic): a 2 MB file
/// whose bytes are the server's pattern, so the client's own pattern check
/// makes the comparison byte-exact; a directory's index; escapes reset
/// with NOT_FOUND (0x15).
#[test]
fn aioquic_client_fetches_files_from_www() {
    if !have_aioquic("aioquic_client_fetches_files_from_www") {
        return;
    }
    let base = std::env::temp_dir().join(format!("fastudp-www-aioquic-{}", std::process::id()));
    let www = base.join("www");
    std::fs::create_dir_all(www.join("sub")).unwrap();
    std::fs::write(base.join("secret"), b"outside").unwrap();
    let data: Vec<u8> = (0..2_000_000u64).map(pattern).collect();
    std::fs::write(www.join("pattern.bin"), &data).unwrap();
    std::fs::write(www.join("sub/index.html"), b"<p>sub</p>").unwrap();
    std::os::unix::fs::symlink("../secret", www.join("link-out")).unwrap();
    let (srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--www",
        www.to_str().unwrap(),
    ]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    let o = Command::new("python3")
        .args([
            script,
            "127.0.0.1",
            &addr.port().to_string(),
            "/pattern.bin",
            "/sub/",
            "/%2e%2e/secret",
            "/link-out",
            "/bytes/1000",
        ])
        .output()
        .unwrap();
    srv.interrupt();
    let end = srv.finish();
    let _ = std::fs::remove_dir_all(&base);
    let err = String::from_utf8_lossy(&o.stderr);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    let r = &v["responses"];
    assert_eq!(r[0]["bytes"], 2_000_000, "{v}");
    assert_eq!(r[0]["pattern"], true, "{v}");
    assert_eq!(r[1]["bytes"], 10, "{v}");
    assert_eq!(r[2]["reset"], 0x15, "{v}");
    assert_eq!(r[3]["reset"], 0x15, "{v}");
    assert_eq!(r[4]["pattern"], true, "{v}");
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
    assert!(
        end.stdout.contains("\"escapes_refused\":2"),
        "{}",
        end.stdout
    );
}

/// CPU time (user + system) of a process so far, seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the name.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The CPU seconds process `pid` uses in the next `d`.
async fn cpu_used_in(pid: u32, d: Duration) -> f64 {
    let before = cpu_seconds(pid);
    tokio::time::sleep(d).await;
    cpu_seconds(pid) - before
}

/// A video stream whose frame is exactly the client's stream window stops
/// at a frame boundary while the client does not read: the worker waits
/// for the client's credit, it does not spin on the frame that is due
/// (which took a whole core before).
#[test]
fn a_video_stream_blocked_at_a_frame_boundary_lets_the_worker_sleep() {
    let (srv, addr, der) = serve_one_worker("blocked", &["--interval", "40"]);
    let pid = srv.pid();
    // 26,214,400 B/s in 40 ms frames: 1 MiB a frame, the client's window.
    with_connection(addr, der, Some(1 << 20), |conn| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"GET /video/26214400/30\r\n").await.unwrap();
        let _ = send.finish();
        let mut b = [0u8; 1];
        recv.read_exact(&mut b).await.unwrap();
        // Not reading: the window stays full. Let a few frames fall due.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let used = cpu_used_in(pid, Duration::from_secs(2)).await;
        assert!(
            used < 0.5,
            "the server used {used:.2} s of CPU in 2 s with one blocked stream"
        );
    });
    srv.interrupt();
    srv.finish();
}

/// A response paced by --total-rate: while the rate's tokens are spent,
/// the worker sleeps until they come back; it does not turn over and over
/// with nothing to send (which took a whole core before).
#[test]
fn a_worker_paced_by_total_rate_sleeps_between_bursts() {
    let (srv, addr, der) = serve_one_worker("paced", &["--total-rate", "1M"]);
    let pid = srv.pid();
    with_connection(addr, der, None, |conn| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        // 30 MB at 1 MB/s: still going when the measurement ends.
        send.write_all(b"GET /bytes/30000000\r\n").await.unwrap();
        let _ = send.finish();
        let reader = tokio::spawn(async move {
            let mut b = vec![0u8; 64 * 1024];
            while let Ok(Some(_)) = recv.read(&mut b).await {}
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let used = cpu_used_in(pid, Duration::from_secs(2)).await;
        assert!(
            used < 0.5,
            "the server used {used:.2} s of CPU in 2 s sending 1 MB/s"
        );
        reader.abort();
    });
    srv.interrupt();
    srv.finish();
}

/// Only QUIC version 1 is offered: a client's Initial in a draft version
/// gets a Version Negotiation packet (RFC 9000 17.2.1) that lists version
/// 1 and no draft.
#[test]
fn a_draft_version_gets_version_negotiation_for_v1_only() {
    let (srv, addr) = serve(&["--listen", "127.0.0.1:0", "--workers", "1"]);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut p = vec![0u8; 1200];
    p[0] = 0xc0;
    p[1..5].copy_from_slice(&0xff00_001du32.to_be_bytes());
    p[5] = 8;
    p[6..14].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    p[14] = 8;
    p[15..23].copy_from_slice(&[9, 10, 11, 12, 13, 14, 15, 16]);
    s.send_to(&p, addr).unwrap();
    let mut b = [0u8; 1500];
    let n = s.recv(&mut b).expect("a Version Negotiation packet");
    assert!(
        b[0] & 0x80 != 0 && b[1..5] == [0, 0, 0, 0],
        "not VN: {:?}",
        &b[..n]
    );
    // Its DCID is our SCID, its SCID our DCID.
    assert_eq!(b[5], 8);
    assert_eq!(b[6..14], [9, 10, 11, 12, 13, 14, 15, 16]);
    assert_eq!(b[14], 8);
    assert_eq!(b[15..23], [1, 2, 3, 4, 5, 6, 7, 8]);
    let versions: Vec<u32> = b[23..n]
        .chunks(4)
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
        .collect();
    assert!(versions.contains(&1), "{versions:x?}");
    assert!(
        versions
            .iter()
            .all(|&v| v == 1 || v & 0x0f0f_0f0f == 0x0a0a_0a0a),
        "only v1 (and greasing): {versions:x?}"
    );
    srv.interrupt();
    srv.finish();
}

/// The last JSON line of a kind in a server's output.
fn last_json(stdout: &str, kind: &str) -> serde_json::Value {
    serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find(|l| l.contains(&format!("\"kind\":\"{kind}\"")))
            .unwrap_or_else(|| panic!("no {kind} line: {stdout}")),
    )
    .unwrap()
}

/// With `--max-connections 1` and two workers, one client of several is
/// served: the limit is the server's, not each worker's.
#[test]
fn max_connections_is_server_wide() {
    let (cert, key, der) = cert_files("maxconn");
    let (srv, addr) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--max-connections",
        "1",
        "--cert",
        &cert,
        "--key",
        &key,
    ]);
    let ok = rt().block_on(async {
        // Each client its own endpoint: random connection IDs spread
        // them over both workers.
        let eps: Vec<quinn::Endpoint> = (0..8).map(|_| client(addr, der.clone())).collect();
        let mut conns = Vec::new();
        for ep in &eps {
            let c = tokio::time::timeout(common::STALL, ep.connect(addr, "localhost").unwrap())
                .await
                .expect("an answer within the stall guard");
            conns.push(c);
        }
        let ok = conns.iter().filter(|c| c.is_ok()).count();
        for c in conns.into_iter().flatten() {
            c.close(0u32.into(), b"done");
        }
        for ep in &eps {
            ep.wait_idle().await;
        }
        ok
    });
    assert_eq!(ok, 1, "clients served with --max-connections 1");
    srv.interrupt();
    let end = srv.finish();
    let s = last_json(&end.stdout, "summary");
    assert_eq!(s["accepted"], 1, "{s}");
    assert!(s["refused"].as_u64().unwrap() >= 7, "{s}");
}

/// A request line not whole within the deadline (5 s by default) is
/// reset with code 0x13 and counted; the connection goes on.
#[test]
fn a_request_line_has_a_deadline() {
    let (mut srv, addr, der) = serve_one_worker("deadline", &[]);
    with_connection(addr, der, None, |conn| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"GET /bytes/").await.unwrap();
        let e = tokio::time::timeout(common::STALL, recv.read_to_end(1 << 20))
            .await
            .expect("an unfinished request is reset within the stall guard")
            .unwrap_err();
        assert!(
            e.to_string().contains("19"),
            "reset with REQUEST_TIMEOUT (0x13): {e}"
        );
        assert_eq!(
            fetch(&conn, b"GET /bytes/5\r\n").await.unwrap(),
            [0, 1, 2, 3, 4]
        );
    });
    let v = stats_until(&mut srv, |v| v["request_timeouts"] == 1);
    assert_eq!(v["accepted"], 1, "{v}");
    srv.interrupt();
    srv.finish();
}

/// Goodput counts bytes the client acknowledged: a response the client
/// does not read counts nothing however much the server has queued; read
/// to its end, it counts exactly its length.
#[test]
fn goodput_counts_acknowledged_bytes() {
    let (mut srv, addr, der) = serve_one_worker("goodput", &[]);
    let srv_ref = &mut srv;
    with_connection(addr, der, Some(64 * 1024), |conn| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"GET /bytes/20000000\r\n").await.unwrap();
        let _ = send.finish();
        let mut b = [0u8; 1];
        recv.read_exact(&mut b).await.unwrap();
        // Not reading: the server can send a window's worth at most.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let v = stats_until(srv_ref, |_| true);
        assert_eq!(
            v["goodput_bytes"], 0,
            "nothing was delivered in full yet: {v}"
        );
        let rest = recv.read_to_end(1 << 30).await.unwrap();
        assert_eq!(rest.len(), 20_000_000 - 1);
        assert_eq!(
            fetch(&conn, b"GET /bytes/1000\r\n").await.unwrap().len(),
            1000
        );
    });
    let v = stats_until(&mut srv, |v| v["goodput_bytes"] == 20_001_000);
    assert_eq!(v["accepted"], 1, "{v}");
    srv.interrupt();
    srv.finish();
}

/// `--max-memory` is a budget over what connections hold: the start-up
/// line gives its hard limit and pressure mark, and the places it holds
/// of light connections, a quarter of them per address; it no longer
/// divides by a worst case. A budget too small for the workers is refused.
#[test]
fn max_memory_is_a_budget() {
    let mut r = Running::start(&[
        "quic",
        "serve",
        "--json",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--max-memory",
        "256M",
        "--duration",
        "30",
    ]);
    let l = r.wait_for_line(|l| l.contains("\"limits\""));
    let v: serde_json::Value = serde_json::from_str(&l).unwrap();
    let budget = v["budget"].as_u64().unwrap();
    assert_eq!(
        budget,
        (256 << 20) - fastudp_quic::limits::BASE - 2 * v["per_worker"].as_u64().unwrap(),
        "{v}"
    );
    assert_eq!(v["pressure"].as_u64().unwrap(), budget / 4 * 3, "{v}");
    let places = v["places"].as_u64().unwrap();
    let light = v["light_connection"].as_u64().unwrap();
    let admit = v["admit"].as_u64().unwrap();
    assert_eq!(admit, budget / 8 * 7, "{v}");
    assert_eq!(places, admit / light, "{v}");
    // The worst case would have allowed about 38.
    assert!(places > 4000, "{v}");
    assert_eq!(v["max_connections_per_ip"], (places / 4).max(1), "{v}");
    r.interrupt();
    r.finish();
    common::assert_refused(&[
        (
            vec!["quic", "serve", "--workers", "2", "--max-memory", "1M"],
            "--max-memory",
        ),
        (
            vec!["quic", "serve", "--request-timeout", "0"],
            "--request-timeout",
        ),
    ]);
}

/// `quic load` to a port where nothing answers fails with a clear error
/// once the answer is overdue (5 s), not after every connection's own
/// timeout (here 600 s: the run would otherwise outlast the stall guard).
#[test]
fn load_to_a_silent_port_fails_with_a_clear_error() {
    // Bound and never read: nothing answers, and no other test takes it.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    for stack in ["quic", "tls-tcp"] {
        let args = [
            "quic",
            "load",
            &addr,
            "--stack",
            stack,
            "--connections",
            "3",
            "--request",
            "/bytes/1000",
            "--timeout",
            "600",
        ];
        let start = Instant::now();
        let end = Running::start(&args).finish();
        let took = start.elapsed();
        if stack == "quic" {
            assert_eq!(end.status.code(), Some(1), "{}", end.stderr);
            assert!(
                end.stderr.contains(&format!(
                    "no QUIC server answered at {addr} within 5 s: is the server running there"
                )),
                "{}",
                end.stderr
            );
            assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
        } else {
            // TCP is refused at once (nothing listens on the TCP port):
            // every connection fails and the run says so.
            assert_eq!(end.status.code(), Some(1), "{}", end.stderr);
            assert!(
                end.stderr.contains("3 of 3 connections failed"),
                "{}",
                end.stderr
            );
        }
        eprintln!("{stack}: ended after {took:?}");
    }
    drop(silent);
}

/// `quic load` takes a host name (resolved once: here localhost, on
/// loopback) as well as an address, and refuses a server without a port
/// in one clear line.
#[test]
fn load_takes_a_host_name() {
    use std::net::ToSocketAddrs;
    // Listen where the name leads first (127.0.0.1 or ::1).
    let first = ("localhost", 0)
        .to_socket_addrs()
        .expect("localhost resolves")
        .next()
        .expect("an address");
    assert!(first.ip().is_loopback(), "{first}");
    let listen = SocketAddr::new(first.ip(), 0).to_string();
    let (srv, addr) = serve(&["--listen", &listen, "--workers", "1"]);
    let by_name = format!("localhost:{}", addr.port());
    let (v, code, err) = load(&[&by_name, "--connections", "2", "--request", "/bytes/100000"]);
    assert_eq!(code, Some(0), "{v}\n{err}");
    assert_eq!(v["completed"], 2, "{v}");
    assert_eq!(v["wrong_bytes"], 0, "{v}");
    assert_eq!(v["server"], format!("{by_name} ({addr})"), "{v}");
    srv.interrupt();
    let _ = srv.finish();
    for (bad, why) in [
        ("localhost", "no port"),
        ("localhost:http", "is not a port"),
    ] {
        let o = fastudp(&["quic", "load", bad]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains(why) && err.contains("HOST:PORT"),
            "{bad}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{bad}: {err}");
    }
}
