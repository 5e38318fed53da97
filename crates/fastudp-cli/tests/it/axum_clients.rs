//! The axum example of fastudp-quic (`examples/axum.rs`: an unchanged
//! axum `Router` over HTTP/3 on the engine and over TLS/TCP with hyper)
//! against clients the project did not write: quic-go's `http3` client
//! and aioquic over HTTP/3, curl over TLS/TCP (HTTP/1.1 and HTTP/2), and
//! headless Chromium over HTTP/3, whose page POSTs 10 MB with `fetch()`.
//! The example is the binary `cargo build -p fastudp-quic --example axum`
//! puts beside this test (target/PROFILE/examples/axum); the README's test
//! command (scripts/test.sh) builds it first, because `cargo test
//! --all-targets` builds examples only as test harnesses.

use crate::common::clients::{self, Fetched, Trust};
use crate::common::skip;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The example's binary beside this test binary's directory
/// (target/PROFILE/deps/it-HASH -> target/PROFILE/examples/axum); `None`
/// after saying why `test` skips.
fn example(test: &str) -> Option<PathBuf> {
    let p = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("examples/axum")));
    match p {
        Some(p) if p.exists() => Some(p),
        _ => {
            skip(
                test,
                "needs fastudp-quic's axum example built beside the tests (scripts/test.sh builds it; or cargo build -p fastudp-quic --example axum --all-features)",
            );
            None
        }
    }
}

/// The example, running until dropped.
struct Example {
    child: Child,
    /// Its HTTP/3 (UDP) and TLS/TCP address (the same port).
    addr: SocketAddr,
    /// Its self-signed certificate's SPKI SHA-256, base64.
    spki: String,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the example on 127.0.0.1 with a port of its choosing (and
/// `extra` arguments), and reads its address and SPKI from the two lines
/// it prints.
fn start_with(bin: &PathBuf, extra: &[&str]) -> Example {
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("a line").expect("a line");
    // "HTTP/3 on udp ADDR, HTTP/1.1 and HTTP/2 on tcp ADDR"
    let first = next();
    let addr = first
        .strip_prefix("HTTP/3 on udp ")
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .parse()
        .unwrap();
    // "certificate SPKI SHA-256 (base64): X"
    let second = next();
    let spki = second
        .rsplit(": ")
        .next()
        .filter(|_| second.starts_with("certificate SPKI"))
        .unwrap_or_else(|| panic!("no SPKI in {second:?}"))
        .to_string();
    Example { child, addr, spki }
}

/// [`start_with`] at the example's defaults.
fn start(bin: &PathBuf) -> Example {
    start_with(bin, &[])
}

impl Example {
    /// The example's peak resident memory so far (VmHWM), bytes.
    fn peak_rss(&self) -> u64 {
        crate::common::proc_memory(self.child.id(), "VmHWM")
    }
}

/// One request with quic-go's HTTP/3 load client (`quic-go-filebench
/// load -count 1`): a GET of `base/NAME` for the one file of `dir` (its
/// length checked), or with `post`, a POST of that many bytes to
/// `base/NAME` (the answer's `LEN` checked). The client stops by itself
/// after 300 s (`-duration`); its JSON report.
fn one_request(
    bin: &std::path::Path,
    dir: &std::path::Path,
    base: &str,
    post: Option<u64>,
) -> serde_json::Value {
    let mut cmd = Command::new(bin);
    cmd.args([
        "load",
        "-proto",
        "h3",
        "-insecure",
        "-connections",
        "1",
        "-count",
        "1",
    ])
    .args(["-duration", "300s", "-dir"])
    .arg(dir);
    if let Some(n) = post {
        cmd.args(["-post", &n.to_string()]);
    }
    let out = cmd.arg(base).output().expect("quic-go-filebench runs");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
}

/// A 1 GB upload and a 1 GB download over HTTP/3 (quic-go's client), each
/// read and written as a stream by the example's handlers (`POST /upload`
/// hashes as it reads, `GET /download/N` makes each chunk as it is
/// taken): both complete, and the example's peak RSS stays under 256
/// MiB, a quarter of either body.
#[test]
fn axum_example_moves_a_gigabyte_each_way_over_http3_in_bounded_memory() {
    let test = "axum_example_moves_a_gigabyte_each_way_over_http3_in_bounded_memory";
    let (Some(ex), Some(fb)) = (example(test), crate::quic_clients::quic_go_filebench(test)) else {
        return;
    };
    // Request streams' windows of 1 MiB, as scripts/app-bench.sh runs it
    // (the engine's default, 4 KiB, is sized for small requests).
    let s = start_with(&ex, &["--stream-window", "1048576"]);
    const GB: u64 = 1_000_000_000;
    let dir = clients::tempdir("axum-gb");
    let up = dir.join("up");
    let down = dir.join("down");
    std::fs::create_dir_all(&up).unwrap();
    std::fs::create_dir_all(&down).unwrap();
    std::fs::write(up.join("upload"), b"").unwrap();
    // A sparse file: only its name and length matter to the client.
    std::fs::File::create(down.join(GB.to_string()))
        .unwrap()
        .set_len(GB)
        .unwrap();
    let base = format!("https://{}", s.addr);
    let v = one_request(&fb, &up, &base, Some(GB));
    assert_eq!(v["completed"].as_u64(), Some(1), "upload: {v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "upload: {v}");
    let v = one_request(&fb, &down, &format!("{base}/download"), None);
    assert_eq!(v["completed"].as_u64(), Some(1), "download: {v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "download: {v}");
    assert_eq!(v["bytes"].as_u64(), Some(GB), "download: {v}");
    let peak = s.peak_rss();
    assert!(peak > 0, "no VmHWM for the example");
    assert!(
        peak < 256 << 20,
        "the example's peak RSS was {} MiB for 1 GB each way",
        peak >> 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /hello/{who}` and `GET /download/N`, as a client saw them: both
/// 200, the greeting's and the pattern's bytes.
fn check_hello_and_download(got: &[Fetched], who: &str, n: usize) {
    assert_eq!(got.len(), 2, "{got:?}");
    let hello = format!("hello {who}");
    assert_eq!(got[0].status, 200, "{got:?}");
    assert_eq!(got[0].bytes, hello.len() as u64, "{got:?}");
    assert_eq!(
        got[0].sha256,
        clients::sha256_hex(hello.as_bytes()),
        "{got:?}"
    );
    assert_eq!(got[1].status, 200, "{got:?}");
    assert_eq!(got[1].bytes, n as u64, "{got:?}");
    assert_eq!(
        got[1].sha256,
        clients::sha256_hex(&clients::bytes_body(n)),
        "{got:?}"
    );
}

/// quic-go's `http3` client fetches a greeting and a 1 MB download over
/// HTTP/3, in parallel on one connection, byte-exact.
#[test]
fn axum_example_serves_quic_go_over_http3() {
    let test = "axum_example_serves_quic_go_over_http3";
    let (Some(ex), Some(go)) = (example(test), clients::quic_go_client(test)) else {
        return;
    };
    let s = start(&ex);
    let n = 1_000_000;
    let (got, _) = clients::quic_go_fetch(
        &go,
        "h3",
        Trust::Insecure,
        &clients::urls(s.addr, &["/hello/quic-go", &format!("/download/{n}")]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    check_hello_and_download(&got, "quic-go", n);
}

/// aioquic's HTTP/3 client fetches the same, byte-exact.
#[test]
fn axum_example_serves_aioquic_over_http3() {
    let test = "axum_example_serves_aioquic_over_http3";
    let Some(ex) = example(test) else {
        return;
    };
    if !clients::aioquic(test) {
        return;
    }
    let s = start(&ex);
    let n = 1_000_000;
    let v = clients::aioquic_fetch(
        true,
        Trust::Insecure,
        s.addr,
        &["/hello/aioquic", &format!("/download/{n}")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    check_hello_and_download(&clients::aioquic_fetched(&v), "aioquic", n);
}

/// curl over TLS/TCP, HTTP/1.1 and HTTP/2: the greeting with the HTTP/3
/// port in `alt-svc`, and a 3 MB upload answered with its length and
/// SHA-256.
#[test]
fn axum_example_serves_curl_over_tls_tcp() {
    let test = "axum_example_serves_curl_over_tls_tcp";
    let Some(ex) = example(test) else {
        return;
    };
    if Command::new("curl").arg("--version").output().is_err() {
        skip(
            test,
            "needs curl (apt-get install curl; scripts/install-test-deps.sh installs it)",
        );
        return;
    }
    let s = start(&ex);
    let dir = clients::tempdir("axum-curl");
    let upload = clients::bytes_body(3_000_000);
    let file = dir.join("upload.bin");
    std::fs::write(&file, &upload).unwrap();
    let base = format!("https://{}", s.addr);
    for version in ["--http1.1", "--http2"] {
        let (ok, out, err) = clients::run_bounded(Command::new("curl").args([
            "-sSk",
            version,
            "-D",
            "-",
            &format!("{base}/hello/curl"),
        ]))
        .unwrap();
        assert!(ok, "{version}: {err}");
        let head = out.to_ascii_lowercase();
        assert!(
            head.contains(&format!("alt-svc: h3=\":{}\"", s.addr.port())),
            "{version}: {out}"
        );
        assert!(out.ends_with("hello curl"), "{version}: {out}");
        let (ok, out, err) = clients::run_bounded(Command::new("curl").args([
            "-sSk",
            version,
            "--data-binary",
            &format!("@{}", file.display()),
            "-H",
            "content-type: application/octet-stream",
            &format!("{base}/upload"),
        ]))
        .unwrap();
        assert!(ok, "{version}: {err}");
        assert_eq!(
            out,
            format!("{} {}", upload.len(), clients::sha256_hex(&upload)),
            "{version}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Headless Chromium, forced onto QUIC for the example's origin, loads
/// its page: the greeting and the 10 MB `fetch()` upload each went over
/// HTTP/3 (`h3` in Resource Timing), and the handler read the upload
/// byte for byte (its length and SHA-256 are in the DOM).
#[test]
fn axum_example_serves_chromium_a_10_mb_fetch_upload_over_http3() {
    let test = "axum_example_serves_chromium_a_10_mb_fetch_upload_over_http3";
    let (Some(ex), Some(bin)) = (example(test), clients::chromium(test)) else {
        return;
    };
    let s = start(&ex);
    // The budget lets the page's fetches end before the DOM is dumped;
    // virtual time does not pass while a request is under way.
    let dom = clients::chromium_dump_dom_with(
        &bin,
        "127.0.0.1",
        s.addr.port(),
        &s.spki,
        "/",
        &["--virtual-time-budget=60000"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        clients::dom_text(&dom, "hello"),
        "200 hello browser over h3",
        "{dom}"
    );
    let n = 10_000_000;
    assert_eq!(
        clients::dom_text(&dom, "upload"),
        format!(
            "200 {n} {} over h3",
            clients::sha256_hex(&clients::bytes_body(n))
        ),
        "{dom}"
    );
}
