//! `quic serve`'s operations: the test endpoints only with
//! `--test-endpoints`, the access log (text and JSON, HTTP/3 and TCP),
//! the TOML configuration file and its errors, and routes (round robin
//! over two upstreams, a dead one skipped, a directory).

use crate::common::quic_server::{serve, serve_without_test_endpoints};
use crate::common::{assert_fails_with, Running};
use crate::proxy::{client_tls, h3_connect, h3_request, rt, tcp_request};
use http::StatusCode;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A directory of its own for a test's files.
fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastudp-ops-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An hq-interop request on a connection of its own: the body, or the
/// code its stream was reset with.
async fn hq_get(addr: SocketAddr, path: &str) -> Result<Vec<u8>, u64> {
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client_tls(&[b"hq-interop"])).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    let conn = ep.connect(addr, "localhost").unwrap().await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(format!("GET {path}\r\n").as_bytes())
        .await
        .unwrap();
    let _ = send.finish();
    let r = match recv.read_to_end(1 << 20).await {
        Ok(b) => Ok(b),
        Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => Err(code.into_inner()),
        Err(e) => panic!("{path}: {e}"),
    };
    conn.close(0u32.into(), b"");
    ep.wait_idle().await;
    r
}

/// Without `--test-endpoints`, `/bytes/N` and `/video/...` are 404 (a
/// NOT_FOUND reset over hq-interop) over HTTP/3, hq-interop and TCP, as a
/// missing path is; with it they are served; the baselines refuse to
/// start without it.
#[test]
fn test_endpoints_only_with_the_flag() {
    for on in [false, true] {
        let args = ["--workers", "1", "--alt-svc-tcp"];
        let (srv, addr) = match on {
            true => serve(&args),
            false => serve_without_test_endpoints(&args),
        };
        rt().block_on(async {
            let (_ep, mut send) = h3_connect(addr).await;
            for path in ["/bytes/1000", "/video/100000/1"] {
                let a = h3_request(&mut send, "GET", path, None).await.unwrap();
                match on {
                    true => assert_eq!((a.status, a.pattern_ok), (StatusCode::OK, true), "{path}"),
                    false => assert_eq!((a.status, a.len), (StatusCode::NOT_FOUND, 0), "{path}"),
                }
                let t = tcp_request(addr, false, "GET", path, None).await.unwrap();
                match on {
                    true => assert_eq!((t.status, t.len), (StatusCode::OK, a.len), "{path}"),
                    false => assert_eq!(t.status, StatusCode::NOT_FOUND, "{path}"),
                }
            }
            assert_eq!(
                h3_request(&mut send, "GET", "/bytes/1000", None)
                    .await
                    .unwrap()
                    .len,
                if on { 1000 } else { 0 }
            );
            let hq = hq_get(addr, "/bytes/1000").await;
            match on {
                true => assert_eq!(hq.map(|b| b.len()), Ok(1000)),
                // hq-interop's NOT_FOUND, as for any missing path.
                false => assert_eq!(hq, Err(0x15)),
            }
        });
        drop(srv);
    }
    for stack in ["quinn", "tls-tcp"] {
        assert_fails_with(
            &["quic", "serve", "--stack", stack, "--listen", "127.0.0.1:0"],
            2,
            "--stack quinn and tls-tcp serve only the test endpoints (/bytes/N, /video/...): add --test-endpoints",
        );
    }
}

/// The lines of the access log at `path` once it holds `n` (within 20 s,
/// while the server runs: the log is flushed within a second, not only
/// at exit).
fn log_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = s.lines().map(str::to_string).collect();
        if lines.len() >= n || Instant::now() > end {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An RFC 3339 UTC time with milliseconds: `2026-12-06T07:40:00.123Z`.
fn is_rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z'
        && t[..4].parse::<u32>().is_ok_and(|y| y >= 2024)
}

/// The access log, as text and as JSON: a line per request over HTTP/3
/// and over TCP, with time, client, protocol, method, path, status,
/// bytes and duration, written while the server runs; its counts at exit.
#[test]
fn access_log_text_and_json() {
    let dir = tempdir("log");
    for format in ["text", "json"] {
        let file = dir.join(format!("access.{format}"));
        let f = file.to_str().unwrap();
        let (mut srv, addr) = serve(&[
            "--workers",
            "1",
            "--alt-svc-tcp",
            "--access-log",
            f,
            "--access-log-format",
            format,
        ]);
        srv.wait_for_line(|l| l.contains("\"access_log\""));
        rt().block_on(async {
            let (_ep, mut send) = h3_connect(addr).await;
            let a = h3_request(&mut send, "GET", "/bytes/1000", None)
                .await
                .unwrap();
            assert_eq!(a.len, 1000);
            let a = h3_request(&mut send, "GET", "/missing?q=1", None)
                .await
                .unwrap();
            assert_eq!(a.status, StatusCode::NOT_FOUND);
            let t = tcp_request(addr, false, "GET", "/bytes/2000", None)
                .await
                .unwrap();
            assert_eq!(t.len, 2000);
        });
        let lines = log_lines(&file, 3);
        assert_eq!(lines.len(), 3, "{lines:?}");
        // (protocol, method, path, status, bytes).
        let want = [
            ("h3", "GET", "/bytes/1000", 200, 1000),
            ("h3", "GET", "/missing?q=1", 404, 0),
            ("http/1.1", "GET", "/bytes/2000", 200, 2000),
        ];
        for (proto, method, path, status, bytes) in want {
            let line = lines
                .iter()
                .find(|l| {
                    l.contains(&format!(
                        "{path}{}",
                        if format == "text" { " " } else { "\"" }
                    ))
                })
                .unwrap_or_else(|| panic!("no line for {path}: {lines:?}"));
            match format {
                "text" => {
                    // 127.0.0.1:PORT - - [TIME] "GET /path h3" 200 1000 0.000104
                    let (client, rest) = line.split_once(" - - [").expect(line);
                    assert!(client.starts_with("127.0.0.1:"), "{line}");
                    let (time, rest) = rest.split_once("] \"").expect(line);
                    assert!(is_rfc3339(time), "{line}");
                    let (req, rest) = rest.split_once("\" ").expect(line);
                    assert_eq!(req, format!("{method} {path} {proto}"), "{line}");
                    let f: Vec<&str> = rest.split(' ').collect();
                    assert_eq!(f.len(), 3, "{line}");
                    assert_eq!(f[0], status.to_string(), "{line}");
                    assert_eq!(f[1], bytes.to_string(), "{line}");
                    let d: f64 = f[2].parse().expect(line);
                    assert!((0.0..60.0).contains(&d), "{line}");
                }
                _ => {
                    let v: Value = serde_json::from_str(line).expect(line);
                    assert!(is_rfc3339(v["time"].as_str().unwrap()), "{line}");
                    assert!(
                        v["client"].as_str().unwrap().starts_with("127.0.0.1:"),
                        "{line}"
                    );
                    assert_eq!(v["proto"], proto, "{line}");
                    assert_eq!(v["method"], method, "{line}");
                    assert_eq!(v["path"], path, "{line}");
                    assert_eq!(v["status"], status, "{line}");
                    assert_eq!(v["bytes"], bytes, "{line}");
                    let d = v["duration_s"].as_f64().unwrap();
                    assert!((0.0..60.0).contains(&d), "{line}");
                }
            }
        }
        srv.interrupt();
        let end = srv.finish();
        assert!(
            end.stdout.contains("\"kind\":\"access_log_summary\""),
            "{}",
            end.stdout
        );
        let summary: Value = end
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["kind"] == "access_log_summary")
            .unwrap();
        assert_eq!(summary["written"], 3, "{summary}");
        assert_eq!(summary["dropped"], 0, "{summary}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `text` to a configuration file of `dir`.
fn conf(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// A configuration file with a mistake is refused at start, in one line
/// that names the file, the line and the key.
#[test]
fn config_file_errors_name_the_line() {
    let dir = tempdir("conf");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let cases: Vec<(&str, String, String)> = vec![
        (
            "unknown key",
            "listen = \"127.0.0.1:0\"\n\nworkerz = 2\n".into(),
            ":3: unknown key `workerz`".into(),
        ),
        (
            "bad type",
            "# a comment\nlisten = \"127.0.0.1:0\"\nworkers = \"two\"\n".into(),
            ":3: workers: invalid type: string \"two\"".into(),
        ),
        (
            "bad address",
            "workers = 1\nlisten = \"127.0.0.1\"\n".into(),
            ":2: listen: invalid socket address".into(),
        ),
        (
            "bad value",
            "listen = \"127.0.0.1:0\"\nworkers = 0\n".into(),
            ":2: workers: --workers 0: between 1 and 256".into(),
        ),
        (
            "bad size",
            "listen = \"127.0.0.1:0\"\nmax-memory = \"lots\"\n".into(),
            ":2: max-memory: ".into(),
        ),
        (
            "bad enum",
            "stack = \"nginx\"\n".into(),
            ":1: stack: unknown variant `nginx`".into(),
        ),
        (
            "route path",
            "listen = \"127.0.0.1:0\"\n\n[[route]]\npath = \"api\"\nupstream = \"http://127.0.0.1:1\"\n"
                .into(),
            ":4: [[route]] path: \"api\": a path prefix starts with /".into(),
        ),
        (
            "route upstream",
            "[[route]]\npath = \"/api/\"\nupstream = [\"http://127.0.0.1:1\", \"https://x:1\"]\n"
                .into(),
            ":3: [[route]] upstream: https://x:1: scheme https".into(),
        ),
        (
            "route both",
            format!(
                "[[route]]\npath = \"/\"\nupstream = \"http://127.0.0.1:1\"\nwww = {:?}\n",
                www.to_str().unwrap()
            ),
            ":3: [[route]] upstream: a route has `upstream` or `www`, not both".into(),
        ),
        (
            "route unknown key",
            "[[route]]\npath = \"/\"\nupstreams = \"http://127.0.0.1:1\"\n".into(),
            ":3: [[route]]: unknown key `upstreams`".into(),
        ),
        (
            "route www",
            "[[route]]\npath = \"/\"\nwww = \"/nonexistent-www\"\n".into(),
            ":3: [[route]] www: /nonexistent-www: not a directory".into(),
        ),
        (
            "route twice",
            "[[route]]\npath = \"/a/\"\nupstream = \"http://127.0.0.1:1\"\n[[route]]\npath = \"/a/\"\nupstream = \"http://127.0.0.1:2\"\n"
                .into(),
            ":5: [[route]] path: \"/a/\" has a route already".into(),
        ),
        (
            "bad metrics address",
            "listen = \"127.0.0.1:0\"\nmetrics = \"localhost\"\n".into(),
            ":2: metrics: invalid socket address".into(),
        ),
        (
            "bad drain-timeout type",
            "drain-timeout = \"soon\"\n".into(),
            ":1: drain-timeout: invalid type: string \"soon\"".into(),
        ),
        (
            "bad drain-timeout value",
            "listen = \"127.0.0.1:0\"\n\ndrain-timeout = -1\n".into(),
            ":3: drain-timeout: --drain-timeout -1: between 0 and 3600 s".into(),
        ),
        (
            "server-id alone",
            "listen = \"127.0.0.1:0\"\nserver-id = \"01\"\n".into(),
            ":2: server-id: --server-id and --lb-config go together".into(),
        ),
        (
            "bad lb-config",
            "server-id = \"01\"\nlb-config = \"nine\"\n".into(),
            ":2: lb-config: --lb-config ".into(),
        ),
        (
            "unreadable reset-key",
            "listen = \"127.0.0.1:0\"\nreset-key = \"/nonexistent/reset.key\"\n".into(),
            ":2: reset-key: --reset-key /nonexistent/reset.key: No such file".into(),
        ),
        (
            "not TOML",
            "listen = \n".into(),
            ":1: listen: ".into(),
        ),
        (
            "route path with a quote",
            "listen = \"127.0.0.1:0\"\n[[route]]\npath = \"/a\\\"b/\"\nupstream = \"http://127.0.0.1:1\"\n"
                .into(),
            ":3: [[route]] path: \"/a\\\"b/\": a path prefix holds no".into(),
        ),
        (
            "route path with a backslash",
            "[[route]]\npath = '/a\\b/'\nupstream = \"http://127.0.0.1:1\"\n".into(),
            ":2: [[route]] path: \"/a\\\\b/\": a path prefix holds no".into(),
        ),
        (
            "route path not normalised",
            "[[route]]\npath = \"/a//b/\"\nupstream = \"http://127.0.0.1:1\"\n".into(),
            ":2: [[route]] path: \"/a//b/\": requests are matched by their normalised path".into(),
        ),
        (
            "upstream port 0",
            "listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:0\"\n".into(),
            ":2: upstream: --upstream http://127.0.0.1:0: port 0: from 1 to 65535".into(),
        ),
        (
            "upstream empty",
            "listen = \"127.0.0.1:0\"\nupstream = []\n".into(),
            ":2: upstream: an empty list".into(),
        ),
    ];
    for (i, (what, text, want)) in cases.iter().enumerate() {
        let f = conf(&dir, &format!("c{i}.toml"), text);
        let o = crate::common::fastudp(&["quic", "serve", "--config", &f]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains(&format!("{f}{want}")),
            "{what}: want {f}{want}, got {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    }
    assert_fails_with(
        &["quic", "serve", "--config", "/nonexistent/fastudp.toml"],
        2,
        "--config /nonexistent/fastudp.toml: No such file",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The file's options apply, and the command line wins over them: a
/// file's `workers = 0` is not an error with `--workers 1`, its
/// `test-endpoints = true` serves them, its `metrics` listener answers
/// and its `drain-timeout` is the drain's.
#[test]
fn config_file_options_and_the_command_line() {
    let dir = tempdir("conf-ok");
    let f = conf(
        &dir,
        "ok.toml",
        "listen = \"127.0.0.1:0\"\nworkers = 0\ntest-endpoints = true\nupstream-timeout = 5\nmetrics = \"127.0.0.1:0\"\ndrain-timeout = 7\n",
    );
    let mut srv = Running::start(&["quic", "serve", "--json", "--config", &f, "--workers", "1"]);
    let l = srv.wait_for_line(|l| l.contains("\"listening\""));
    let v: Value = serde_json::from_str(&l).unwrap();
    assert_eq!(v["workers"], 1, "{v}");
    let addr: SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
    srv.wait_for_line(|l| l.contains("\"test_endpoints\""));
    let m: Value =
        serde_json::from_str(&srv.wait_for_line(|l| l.contains("\"kind\":\"metrics\""))).unwrap();
    let url = m["url"].as_str().unwrap();
    let maddr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    let mut c = std::net::TcpStream::connect(maddr).unwrap();
    std::io::Write::write_all(
        &mut c,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut c, &mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("fastudp_"), "{text}");
    rt().block_on(async {
        let (_ep, mut send) = h3_connect(addr).await;
        let a = h3_request(&mut send, "GET", "/bytes/10", None)
            .await
            .unwrap();
        assert_eq!((a.status, a.len), (StatusCode::OK, 10));
    });
    srv.interrupt();
    let d: Value =
        serde_json::from_str(&srv.wait_for_line(|l| l.contains("\"kind\":\"draining\""))).unwrap();
    assert_eq!(d["drain_timeout_s"], 7.0, "{d}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upstream that answers every request with its name and the path.
fn named_upstream(name: &'static str) -> (tokio::runtime::Runtime, SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(format!(
                                "{name} {}",
                                req.uri().path()
                            ))),
                        ))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (rt, addr)
}

/// Routes from the file: `/api/` to two upstreams taken in turn, `/dead/`
/// to a refusing upstream (retried on the live one once, then skipped) and a live one, `/` to
/// a directory, the longest prefix first; over HTTP/3 and HTTP/2; the
/// access log (JSON, on standard output) names each request.
#[test]
fn routes_round_robin_skip_a_dead_upstream_and_serve_files() {
    let (_a_rt, a) = named_upstream("A");
    let (_b_rt, b) = named_upstream("B");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = dead.local_addr().unwrap();
    drop(dead);
    let dir = tempdir("routes");
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "home\n").unwrap();
    let f = conf(
        &dir,
        "routes.toml",
        &format!(
            r#"# The test's routes.
listen = "127.0.0.1:0"
workers = 1
alt-svc-tcp = true
access-log = "-"
access-log-format = "json"

[[route]]
path = "/"
www = {www:?}

[[route]]
path = "/api/"
upstream = ["http://{a}", "http://{b}"]

[[route]]
path = "/dead/"
upstream = ["http://{down}", "http://{a}"]
fail-duration = 600
"#,
            www = www.to_str().unwrap()
        ),
    );
    let (mut srv, addr) = serve_without_test_endpoints(&["--config", &f]);
    let proxy = srv.wait_for_line(|l| l.contains("\"kind\":\"proxy\""));
    let v: Value = serde_json::from_str(&proxy).unwrap();
    assert_eq!(v["routes"].as_array().unwrap().len(), 3, "{v}");
    let bodies = rt().block_on(async {
        let (_ep, mut send) = h3_connect(addr).await;
        let mut got = Vec::new();
        for path in [
            "/api/1",
            "/api/2",
            "/api/3",
            "/api/4",
            "/dead/1",
            "/dead/2",
            "/dead/3",
            "/",
            "/index.html",
            "/bytes/10",
        ] {
            let r = h3_request(&mut send, "GET", path, None).await.unwrap();
            got.push((r.status, String::from_utf8_lossy(&r.body).to_string()));
        }
        let r = tcp_request(addr, true, "GET", "/api/5", None)
            .await
            .unwrap();
        got.push((r.status, String::from_utf8_lossy(&r.body).to_string()));
        got
    });
    let ok = |s: &str| (StatusCode::OK, s.to_string());
    assert_eq!(
        bodies[..4],
        [
            ok("A /api/1"),
            ok("B /api/2"),
            ok("A /api/3"),
            ok("B /api/4")
        ]
    );
    // The dead upstream refuses: the request goes on to A (a retry), and
    // the dead one is skipped afterwards.
    assert_eq!(
        bodies[4..7],
        [ok("A /dead/1"), ok("A /dead/2"), ok("A /dead/3")],
        "{bodies:?}"
    );
    assert_eq!(bodies[7..9], [ok("home\n"), ok("home\n")]);
    assert_eq!(bodies[9].0, StatusCode::NOT_FOUND, "no test endpoints");
    assert!(
        bodies[10] == ok("A /api/5") || bodies[10] == ok("B /api/5"),
        "{bodies:?}"
    );
    // The access log's lines, on standard output among the server's own.
    let mut log = Vec::new();
    while log.len() < 11 {
        let l = srv.wait_for_line(|l| l.contains("\"method\""));
        log.push(serde_json::from_str::<Value>(&l).unwrap());
    }
    let dead = log.iter().find(|v| v["path"] == "/dead/1").unwrap();
    assert_eq!(
        (dead["status"].as_u64(), dead["proto"].as_str()),
        (Some(200), Some("h3"))
    );
    let h2 = log.iter().find(|v| v["path"] == "/api/5").unwrap();
    assert_eq!(
        (h2["status"].as_u64(), h2["proto"].as_str()),
        (Some(200), Some("h2"))
    );
    let file = log.iter().find(|v| v["path"] == "/index.html").unwrap();
    assert_eq!(file["bytes"], 5, "{file}");
    srv.interrupt();
    let end = srv.finish();
    assert!(end.stdout.contains("\"bad_gateway\":0"), "{}", end.stdout);
    assert!(end.stdout.contains("\"retries\":1"), "{}", end.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example file of packaging/ is a valid configuration: the server
/// starts with it (its address and log overridden on the command line)
/// and announces its routes.
#[test]
fn the_packaged_example_configuration_loads() {
    let f = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/fastudp-quic.toml"
    );
    let (mut srv, _addr) = serve_without_test_endpoints(&[
        "--config",
        f,
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--max-memory",
        "512M",
    ]);
    let l = srv.wait_for_line(|l| l.contains("\"kind\":\"proxy\""));
    let v: Value = serde_json::from_str(&l).unwrap();
    let prefixes: Vec<&str> = v["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefix"].as_str().unwrap())
        .collect();
    assert_eq!(prefixes, ["/api/", "/"], "{v}");
    assert_eq!(v["routes"][0]["fail_duration_s"], 5.0, "{v}");
    assert!(v["tcp"].is_string(), "alt-svc-tcp from the file: {v}");
    drop(srv);
}
