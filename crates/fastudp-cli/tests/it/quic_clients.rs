//! `fastudp quic serve` against clients the project did not write: its
//! certificates (RSA and ECDSA in every PEM key form, made by openssl,
//! verified by aioquic and quic-go), and byte-exact parallel transfers
//! with quic-go and aioquic. The helpers are in tests/it/common/clients.rs.

use crate::common;
use fastudp_test_support as skip_check;

use common::clients::{self, Fetched, Trust};
use common::quic_server::{serve as serve_bare, server_bin, stats_until};
use common::{skip, Running};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A server started with `args` (plus `--json --stats`): the process, its
/// address, and the SPKI SHA-256 of its certificate from its start-up
/// lines.
fn serve(args: &[&str]) -> (Running, SocketAddr, String) {
    let (mut r, addr) = serve_bare(args);
    let l = r.wait_for_line(|l| l.contains("\"certificate\""));
    let v: serde_json::Value = serde_json::from_str(&l).expect("JSON line");
    let spki = v["spki_sha256"].as_str().unwrap().to_string();
    (r, addr, spki)
}

/// Stops a server with Ctrl-C; it must end cleanly.
fn stop(srv: Running) {
    srv.interrupt();
    let end = srv.finish();
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
}

/// The key forms a certificate test covers: openssl's arguments for the
/// key, and whether to rewrite the key in its traditional form (PKCS#1
/// for RSA, SEC1 for EC) instead of PKCS#8.
const KEY_FORMS: &[(&str, &[&str], bool)] = &[
    ("rsa-pkcs8", &["-newkey", "rsa:2048"], false),
    ("rsa-pkcs1", &["-newkey", "rsa:2048"], true),
    (
        "p256-pkcs8",
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
        false,
    ),
    (
        "p256-sec1",
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
        true,
    ),
    (
        "p384-pkcs8",
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp384r1"],
        false,
    ),
];

/// A certificate for localhost made by openssl in `dir`, its key in the
/// form `name` says: (cert, key, the SPKI SHA-256 that openssl computes).
fn openssl_cert(
    dir: &Path,
    name: &str,
    newkey: &[&str],
    traditional: bool,
) -> (PathBuf, PathBuf, String) {
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost"])
        .args(newkey)
        .arg("-keyout")
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if traditional {
        let kind = if name.starts_with("rsa") { "rsa" } else { "ec" };
        let t = dir.join(format!("{name}.trad.key"));
        let mut cmd = Command::new("openssl");
        cmd.arg(kind).arg("-in").arg(&k).arg("-out").arg(&t);
        if kind == "rsa" {
            cmd.arg("-traditional");
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::rename(&t, &k).unwrap();
    }
    let head = std::fs::read_to_string(&k).unwrap();
    let want = match (name.starts_with("rsa"), traditional) {
        (_, false) => "-----BEGIN PRIVATE KEY-----",
        (true, true) => "-----BEGIN RSA PRIVATE KEY-----",
        (false, true) => "-----BEGIN EC PRIVATE KEY-----",
    };
    assert!(head.starts_with(want), "{name}: {head}");
    let spki = common::sh(&[
        "sh",
        "-c",
        &format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
            c.display()
        ),
    ]);
    (c, k, spki.trim().to_string())
}

/// Whether openssl is here; otherwise says why `test` skips.
fn openssl(test: &str) -> bool {
    let ok = Command::new("openssl").arg("version").output().is_ok();
    if !ok {
        skip(
            test,
            "needs openssl (apt-get install openssl; scripts/install-test-deps.sh installs it)",
        );
    }
    ok
}

/// Serves each key form of [`KEY_FORMS`] in turn and has `client` fetch
/// /bytes/100000 from it, trusting only that certificate; a client that
/// trusts another certificate must fail. The server's SPKI line must be
/// what openssl computes.
fn each_certificate(
    tag: &str,
    client: impl Fn(SocketAddr, Trust<'_>) -> anyhow::Result<Vec<Fetched>>,
) {
    let dir = clients::tempdir(tag);
    let (other, _, _) = openssl_cert(&dir, "other", KEY_FORMS[2].1, false);
    let want = clients::sha256_hex(&clients::bytes_body(100_000));
    for (name, newkey, traditional) in KEY_FORMS {
        let (c, k, spki) = openssl_cert(&dir, name, newkey, *traditional);
        let (srv, addr, printed) = serve(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--cert",
            c.to_str().unwrap(),
            "--key",
            k.to_str().unwrap(),
        ]);
        assert_eq!(printed, spki, "{name}: the printed SPKI is openssl's");
        let got = client(addr, Trust::Ca(&c)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), 1, "{name}: {got:?}");
        assert_eq!((got[0].status, got[0].bytes), (200, 100_000), "{name}");
        assert_eq!(got[0].sha256, want, "{name}");
        let e = client(addr, Trust::Ca(&other)).expect_err("a client trusting another certificate");
        assert!(!e.to_string().is_empty(), "{name}");
        stop(srv);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// RSA (PKCS#8 and PKCS#1 keys) and ECDSA (P-256 PKCS#8 and SEC1, P-384)
/// certificates made by openssl are served, and aioquic verifies each.
#[test]
fn rsa_and_ecdsa_certificates_verify_with_aioquic() {
    let test = "rsa_and_ecdsa_certificates_verify_with_aioquic";
    if !openssl(test) || !clients::aioquic(test) {
        return;
    }
    each_certificate("cert-aioquic", |addr, trust| {
        let v = clients::aioquic_fetch(false, trust, addr, &["/bytes/100000"])?;
        Ok(clients::aioquic_fetched(&v))
    });
}

/// The same certificates, verified by quic-go (Go's crypto/x509).
#[test]
fn rsa_and_ecdsa_certificates_verify_with_quic_go() {
    let test = "rsa_and_ecdsa_certificates_verify_with_quic_go";
    if !openssl(test) {
        return;
    }
    let Some(bin) = clients::quic_go_client(test) else {
        return;
    };
    each_certificate("cert-quic-go", |addr, trust| {
        clients::quic_go_fetch(
            &bin,
            "hq-interop",
            trust,
            &clients::urls(addr, &["/bytes/100000"]),
        )
        .map(|(f, _)| f)
    });
}

/// Bad certificate files stop the server at start with exit status 2
/// and a message that names the file and the fault.
#[test]
fn bad_certificate_files_are_refused_with_clear_errors() {
    let dir = clients::tempdir("cert-bad");
    let w = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let a = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let b = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = w("cert.pem", &a.cert.pem());
    let key = w("key.pem", &a.key_pair.serialize_pem());
    let other = w("other.pem", &b.key_pair.serialize_pem());
    let empty = w("empty.pem", "");
    let missing = dir.join("missing.pem").to_str().unwrap().to_string();
    let serve = |c: &str, k: &str| {
        vec![
            "quic",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--cert",
            c,
            "--key",
            k,
        ]
        .into_iter()
        .map(|s| s.to_string())
        .collect::<Vec<String>>()
    };
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            serve(&cert, &other),
            format!("--key {other} does not belong to --cert {cert}"),
        ),
        (
            serve(&empty, &key),
            format!("--cert {empty}: the file is empty"),
        ),
        (
            serve(&cert, &empty),
            format!("--key {empty}: the file is empty"),
        ),
        (
            serve(&missing, &key),
            format!("--cert {missing}: No such file"),
        ),
        (
            serve(&key, &key),
            format!("--cert {key}: no certificate in it"),
        ),
        (
            serve(&cert, &cert),
            format!("--key {cert}: no private key in it"),
        ),
        (
            [
                "quic",
                "serve",
                "--test-endpoints",
                "--stack",
                "tls-tcp",
                "--0rtt",
            ]
            .map(String::from)
            .to_vec(),
            "--0rtt is for the QUIC stacks".into(),
        ),
    ];
    let cases: Vec<(Vec<&str>, &str)> = cases
        .iter()
        .map(|(a, n)| (a.iter().map(String::as_str).collect(), n.as_str()))
        .collect();
    common::assert_refused(&cases);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The self-signed certificate's SPKI SHA-256 that the server prints is
/// the one of the certificate a client is served (computed by aioquic
/// from what it received), in the base64 form Chromium takes.
#[test]
fn the_printed_spki_is_the_served_certificates() {
    let test = "the_printed_spki_is_the_served_certificates";
    if !clients::aioquic(test) {
        return;
    }
    let (srv, addr, printed) = serve(&["--listen", "127.0.0.1:0", "--workers", "1"]);
    let v = clients::aioquic_fetch(false, Trust::Insecure, addr, &["/bytes/10"]).unwrap();
    assert_eq!(v["peer_spki_sha256"], printed.as_str(), "{v}");
    assert_eq!(printed.len(), 44, "{printed}");
    stop(srv);
}

/// The /bytes sizes of a parallel fetch: empty, one byte, around packet
/// and window sizes, and a few megabytes.
const SIZES: &[usize] = &[0, 1, 1200, 65_536, 100_003, 1_000_000, 3_000_000, 250];

fn size_paths() -> Vec<String> {
    SIZES.iter().map(|n| format!("/bytes/{n}")).collect()
}

/// Asserts that `got` holds the /bytes responses of [`SIZES`], in order,
/// each complete, status 200 and byte-exact (by SHA-256).
fn assert_sizes(got: &[Fetched]) {
    assert_eq!(got.len(), SIZES.len(), "{got:?}");
    for (f, &n) in got.iter().zip(SIZES) {
        assert_eq!((f.status, f.bytes), (200, n as u64), "{f:?}");
        assert_eq!(
            f.sha256,
            clients::sha256_hex(&clients::bytes_body(n)),
            "{f:?}"
        );
    }
}

/// quic-go's hq-interop client fetches 8 /bytes responses in parallel on
/// one connection, byte-exact; a path the server does not serve is a
/// failure the client reports (reset with 0x10).
#[test]
fn quic_go_fetches_bytes_byte_exact_over_hq_interop() {
    let Some(bin) = clients::quic_go_client("quic_go_fetches_bytes_byte_exact_over_hq_interop")
    else {
        return;
    };
    let (mut srv, addr, _) = serve(&["--listen", "127.0.0.1:0", "--workers", "2"]);
    let paths = size_paths();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let (got, summary) = clients::quic_go_fetch(
        &bin,
        "hq-interop",
        Trust::Insecure,
        &clients::urls(addr, &paths),
    )
    .unwrap();
    assert_sizes(&got);
    assert_eq!(summary["alpn"], "hq-interop", "{summary}");
    let s = stats_until(&mut srv, |v| v["connections"] == 0 && v["accepted"] == 1);
    assert_eq!(s["accepted"], 1, "one connection: {s}");
    let e = clients::quic_go_fetch(
        &bin,
        "hq-interop",
        Trust::Insecure,
        &clients::urls(addr, &["/bytes/5", "/not/served"]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("error code 16"), "{e}");
    stop(srv);
}

/// aioquic fetches the same 8 responses in parallel on one connection,
/// byte-exact, verifying the server's certificate.
#[test]
fn aioquic_fetches_bytes_byte_exact_over_hq_interop() {
    let test = "aioquic_fetches_bytes_byte_exact_over_hq_interop";
    if !clients::aioquic(test) {
        return;
    }
    let dir = clients::tempdir("aioquic-hq");
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cp, kp) = (dir.join("c.pem"), dir.join("k.pem"));
    std::fs::write(&cp, c.cert.pem()).unwrap();
    std::fs::write(&kp, c.key_pair.serialize_pem()).unwrap();
    let (mut srv, addr, _) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--cert",
        cp.to_str().unwrap(),
        "--key",
        kp.to_str().unwrap(),
    ]);
    let paths = size_paths();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let v = clients::aioquic_fetch(false, Trust::Ca(&cp), addr, &paths).unwrap();
    assert_eq!(v["alpn"], "hq-interop", "{v}");
    assert_sizes(&clients::aioquic_fetched(&v));
    let s = stats_until(&mut srv, |v| v["connections"] == 0 && v["accepted"] == 1);
    assert_eq!(s["accepted"], 1, "one connection: {s}");
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Chromium helper reports a failed load as an error with Chromium's
/// reason (Chromium itself exits 0 and prints no DOM then), and does not
/// hang: here nothing listens on the port.
#[test]
fn chromium_reports_a_failed_load() {
    let Some(bin) = clients::chromium("chromium_reports_a_failed_load") else {
        return;
    };
    let port = common::free_port();
    let e = clients::chromium_dump_dom(
        &bin,
        "127.0.0.1",
        port,
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "/",
    )
    .unwrap_err();
    assert!(e.to_string().contains("net::ERR_"), "{e}");
}

/// A test whose client is missing says so where `cargo test` shows it,
/// and fails under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`: the Chromium
/// test run with no `PATH`.
#[test]
fn a_missing_client_is_a_visible_skip_and_a_failure_in_ci() {
    if std::env::var_os("FASTUDP_CHROMIUM").is_some() {
        return;
    }
    skip_check::skip_is_visible_and_fails_in_ci(
        "quic_clients::chromium_reports_a_failed_load",
        "needs chromium",
    );
}

/// A quinn client for hq-interop that does not verify the certificate
/// (the handshake's signature is still checked by rustls).
fn quinn_client() -> quinn::Endpoint {
    #[derive(Debug)]
    struct AnyCert(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                m,
                c,
                d,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"hq-interop".to_vec()];
    let cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap(),
    ));
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

/// A client that sends its request line, and its FIN only later (as
/// quic-go's does, with a separate `Close` after the `Write`), is not
/// sent STOP_SENDING in between: quic-go fails a request whose `Close`
/// meets one ("close called for canceled stream"), which broke the
/// interop runner's transfer case. The late FIN is read, so the stream's
/// credit comes back: 40 such requests, one after another, go through a
/// connection that allows 16 at once.
#[test]
fn a_late_fin_after_the_request_line_is_not_stopped() {
    let (srv, addr) = serve_bare(&["--listen", "127.0.0.1:0", "--workers", "1"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ep = quinn_client();
        let conn = tokio::time::timeout(common::STALL, ep.connect(addr, "localhost").unwrap())
            .await
            .expect("handshake in time")
            .expect("handshake");
        for i in 0..40 {
            let (mut send, mut recv) = tokio::time::timeout(common::STALL, conn.open_bi())
                .await
                .unwrap_or_else(|_| panic!("request {i}: no stream credit: the stream of an earlier one was not given back"))
                .unwrap();
            send.write_all(b"GET /bytes/100000\r\n").await.unwrap();
            // The first response bytes: the server has parsed the request.
            let mut first = [0u8; 1];
            recv.read_exact(&mut first).await.unwrap();
            if i == 0 {
                // Time for a STOP_SENDING to arrive, were one sent.
                let stopped = tokio::time::timeout(Duration::from_millis(300), send.stopped()).await;
                assert!(stopped.is_err(), "request {i}: STOP_SENDING before the FIN: {stopped:?}");
            }
            send.finish().unwrap();
            let rest = recv.read_to_end(1 << 20).await.unwrap();
            assert_eq!(rest.len() + 1, 100_000, "request {i}");
        }
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
    stop(srv);
}

// ------------------------------------------------------------ interop cases

/// A case of the QUIC interop runner (quic-interop-runner's testcases.py):
/// /bytes responses in place of the runner's random files.
struct Case {
    /// The server's options for it.
    server: &'static [&'static str],
    /// The paths fetched.
    paths: Vec<String>,
    /// The connections the server accepts for it.
    connections: u64,
}

fn case(name: &'static str) -> Case {
    let p = |v: &[usize]| v.iter().map(|n| format!("/bytes/{n}")).collect::<Vec<_>>();
    let (server, paths, connections): (&'static [&'static str], Vec<String>, u64) = match name {
        "handshake" | "retry" => (
            if name == "retry" { &["--retry"] } else { &[] },
            p(&[1000]),
            1,
        ),
        "transfer" => (&[], p(&[2_000_000, 3_000_000, 5_000_000]), 1),
        // Many more streams than the 16 the server allows at once.
        "multiplexing" => (
            &[],
            (1000..1200).map(|n| format!("/bytes/{n}")).collect(),
            1,
        ),
        "resumption" => (&[], p(&[1000, 2000, 3000]), 2),
        "zerortt" => (&["--0rtt"], p(&[1000, 2000, 3000]), 2),
        "chacha20" => (&[], p(&[1_000_000, 3000]), 1),
        "keyupdate" => (&[], p(&[1_000_000]), 1),
        // The client moves during the transfer (a new port, or a new
        // address, every 50 ms): the server validates each new path,
        // within 3x of what came from it until then.
        "rebind-port" | "rebind-addr" => (&[], p(&[3_000_000, 5_000_000]), 1),
        // The runner's sizes: 5, 10 and 500 KiB, over HTTP/3.
        "http3" => (&[], p(&[5 << 10, 10 << 10, 500 << 10]), 1),
        _ => panic!("no case {name}"),
    };
    Case {
        server,
        paths,
        connections,
    }
}

/// Runs `case` with `client` against a fresh server, then checks what
/// every case shares: each file byte-exact, the connections the case
/// makes, Retry used for `retry`, and every request answered over HTTP/3
/// (the server's `h3_requests`) if `h3`, none otherwise. `client` returns
/// the files it got, by path.
fn interop(
    name: &'static str,
    h3: bool,
    client: impl FnOnce(&Case, SocketAddr) -> Vec<(String, Vec<u8>)>,
) {
    let c = case(name);
    let mut args = vec!["--listen", "127.0.0.1:0", "--workers", "2"];
    args.extend_from_slice(c.server);
    let (mut srv, addr) = serve_bare(&args);
    let files = client(&c, addr);
    assert_eq!(files.len(), c.paths.len(), "{name}");
    for ((path, body), want) in files.iter().zip(&c.paths) {
        assert_eq!(path, want, "{name}");
        let n: usize = path.trim_start_matches("/bytes/").parse().unwrap();
        assert!(
            body.len() == n && *body == clients::bytes_body(n),
            "{name}: {path} is not byte-exact ({} bytes)",
            body.len()
        );
    }
    let s = stats_until(&mut srv, |v| {
        v["connections"] == 0 && v["accepted"] == c.connections
    });
    if name == "retry" {
        assert!(s["retries"].as_u64().unwrap() >= 1, "{name}: {s}");
    } else {
        assert_eq!(s["retries"], 0, "{name}: {s}");
    }
    let h3_requests = if h3 { c.paths.len() as u64 } else { 0 };
    assert_eq!(s["h3_requests"], h3_requests, "{name}: {s}");
    assert_eq!(s["h3_refused"], 0, "{name}: {s}");
    stop(srv);
}

/// An interop case run with aioquic, which reports what its connections
/// negotiated: the checks the runner makes on its packet captures are
/// made on that report here. Over HTTP/3 (aioquic's H3 layer) if `h3`
/// (the `http3` case always), hq-interop otherwise.
fn aioquic_case(name: &'static str, h3: bool) {
    let h3 = h3 || name == "http3";
    let test = if h3 && name != "http3" {
        format!("interop_aioquic_h3_{name}")
    } else {
        format!("interop_aioquic_{name}")
    };
    if !clients::aioquic(&test) {
        return;
    }
    let alpn = if h3 { "h3" } else { "hq-interop" };
    interop(name, h3, |c, addr| {
        let paths: Vec<&str> = c.paths.iter().map(String::as_str).collect();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script);
        if h3 {
            cmd.arg("--h3");
        }
        cmd.args(match name {
            "resumption" => &["--resume"][..],
            "zerortt" => &["--0rtt"],
            "chacha20" => &["--chacha20"],
            "keyupdate" => &["--key-update"],
            "rebind-port" => &["--rebind", "port"],
            "rebind-addr" => &["--rebind", "addr"],
            _ => &[],
        });
        cmd.arg("127.0.0.1")
            .arg(addr.port().to_string())
            .args(&paths);
        let (ok, out, err) = clients::run_bounded(&mut cmd).unwrap();
        assert!(ok, "{name}: {out}{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let conns = v["connections"].as_array().unwrap();
        assert!(
            conns.iter().all(|k| k["version"] == 1 && k["alpn"] == alpn),
            "{name}: {v}"
        );
        let last = &conns[conns.len() - 1];
        match name {
            "resumption" => assert!(last["resumed"] == true, "{name}: {v}"),
            "zerortt" => assert!(
                last["resumed"] == true && last["early_data_accepted"] == true,
                "{name}: {v}"
            ),
            "chacha20" => assert_eq!(last["cipher_suite"], "CHACHA20_POLY1305_SHA256", "{v}"),
            // The client's update, the small file under the new keys.
            "keyupdate" => assert_eq!(last["key_phase"], 1, "{v}"),
            // The test proves nothing unless the client moved during the
            // transfer.
            "rebind-port" | "rebind-addr" => assert!(
                last["rebinds"].as_u64().unwrap() >= 2,
                "{name}: the client did not move during the transfer: {v}"
            ),
            // No update without one asked for: the keyupdate check
            // means something.
            "handshake" => assert!(
                last["resumed"] == false && last["key_phase"] == 0,
                "{name}: {v}"
            ),
            _ => assert_eq!(last["resumed"], false, "{name}: {v}"),
        }
        let resp = v["responses"].as_array().unwrap();
        let mut files = Vec::new();
        for r in resp {
            let path = r["path"].as_str().unwrap().to_string();
            let n: usize = path.trim_start_matches("/bytes/").parse().unwrap();
            // aioquic reports hashes; a body of the right hash is the
            // pattern's.
            let body = if r["sha256"] == clients::sha256_hex(&clients::bytes_body(n)).as_str()
                && r["bytes"] == n
            {
                clients::bytes_body(n)
            } else {
                Vec::new()
            };
            files.push((path, body));
        }
        files
    });
}

/// An interop case run with quic-go's own interop-runner client.
fn quic_go_case(name: &'static str) {
    let Some(bin) = clients::quic_go_interop_client(&format!("interop_quic_go_{name}")) else {
        return;
    };
    interop(name, name == "http3", |c, addr| {
        let paths: Vec<&str> = c.paths.iter().map(String::as_str).collect();
        // The runner gives quic-go's client "transfer" for multiplexing
        // (the files differ, not the client). Whether the server accepted
        // 0-RTT is not visible from this client (Go's key log leaves out
        // the early secret in QUIC): the aioquic case checks that.
        let testcase = if name == "multiplexing" {
            "transfer"
        } else {
            name
        };
        let run = clients::quic_go_interop(&bin, testcase, addr, &paths).unwrap();
        paths
            .iter()
            .map(|p| (p.to_string(), run.file(p).unwrap_or_default()))
            .collect()
    });
}

#[test]
fn interop_aioquic_handshake() {
    aioquic_case("handshake", false);
}
#[test]
fn interop_aioquic_transfer() {
    aioquic_case("transfer", false);
}
#[test]
fn interop_aioquic_multiplexing() {
    aioquic_case("multiplexing", false);
}
#[test]
fn interop_aioquic_retry() {
    aioquic_case("retry", false);
}
#[test]
fn interop_aioquic_resumption() {
    aioquic_case("resumption", false);
}
#[test]
fn interop_aioquic_zerortt() {
    aioquic_case("zerortt", false);
}
#[test]
fn interop_aioquic_chacha20() {
    aioquic_case("chacha20", false);
}
#[test]
fn interop_aioquic_keyupdate() {
    aioquic_case("keyupdate", false);
}
#[test]
fn interop_aioquic_rebind_port() {
    aioquic_case("rebind-port", false);
}
#[test]
fn interop_aioquic_rebind_addr() {
    aioquic_case("rebind-addr", false);
}
#[test]
fn interop_aioquic_http3() {
    aioquic_case("http3", true);
}
#[test]
fn interop_aioquic_h3_handshake() {
    aioquic_case("handshake", true);
}
#[test]
fn interop_aioquic_h3_transfer() {
    aioquic_case("transfer", true);
}
#[test]
fn interop_aioquic_h3_multiplexing() {
    aioquic_case("multiplexing", true);
}
#[test]
fn interop_aioquic_h3_retry() {
    aioquic_case("retry", true);
}
#[test]
fn interop_aioquic_h3_resumption() {
    aioquic_case("resumption", true);
}
#[test]
fn interop_aioquic_h3_zerortt() {
    aioquic_case("zerortt", true);
}
#[test]
fn interop_aioquic_h3_chacha20() {
    aioquic_case("chacha20", true);
}
#[test]
fn interop_aioquic_h3_keyupdate() {
    aioquic_case("keyupdate", true);
}
#[test]
fn interop_quic_go_handshake() {
    quic_go_case("handshake");
}
#[test]
fn interop_quic_go_transfer() {
    quic_go_case("transfer");
}
#[test]
fn interop_quic_go_multiplexing() {
    quic_go_case("multiplexing");
}
#[test]
fn interop_quic_go_retry() {
    quic_go_case("retry");
}
#[test]
fn interop_quic_go_resumption() {
    quic_go_case("resumption");
}
#[test]
fn interop_quic_go_zerortt() {
    quic_go_case("zerortt");
}
#[test]
fn interop_quic_go_chacha20() {
    quic_go_case("chacha20");
}
#[test]
fn interop_quic_go_keyupdate() {
    quic_go_case("keyupdate");
}
/// An interop case over HTTP/3 with quic-go's `http3` client
/// (tools/quic-go-client; quic-go's interop client speaks HTTP/3 only in
/// its `http3` case): every path in parallel on the one connection it
/// dials.
fn quic_go_h3_case(name: &'static str) {
    let Some(bin) = clients::quic_go_client(&format!("interop_quic_go_h3_{name}")) else {
        return;
    };
    interop(name, true, |c, addr| {
        let paths: Vec<&str> = c.paths.iter().map(String::as_str).collect();
        let (got, summary) =
            clients::quic_go_fetch(&bin, "h3", Trust::Insecure, &clients::urls(addr, &paths))
                .unwrap();
        assert_eq!(summary["connections"], 1, "{name}: {summary}");
        got.iter()
            .zip(&paths)
            .map(|(f, p)| {
                let n: usize = p.trim_start_matches("/bytes/").parse().unwrap();
                // A body of the pattern's hash is the pattern.
                let exact = f.status == 200
                    && f.bytes == n as u64
                    && f.sha256 == clients::sha256_hex(&clients::bytes_body(n));
                let body = if exact {
                    clients::bytes_body(n)
                } else {
                    Vec::new()
                };
                (p.to_string(), body)
            })
            .collect()
    });
}
#[test]
fn interop_quic_go_h3_handshake() {
    quic_go_h3_case("handshake");
}
#[test]
fn interop_quic_go_h3_transfer() {
    quic_go_h3_case("transfer");
}
#[test]
fn interop_quic_go_h3_multiplexing() {
    quic_go_h3_case("multiplexing");
}
#[test]
fn interop_quic_go_h3_retry() {
    quic_go_h3_case("retry");
}

/// quic-go's interop client runs `http3` with its `http3` package.
#[test]
fn interop_quic_go_http3() {
    quic_go_case("http3");
}

// ------------------------------------------------------- cases with loss

/// The port the server listens on inside a [`Lossy`] namespace (the
/// test's own: nothing else can hold it). Fixed, because the nftables
/// rules name it before the server starts; not 4433, `quic serve`'s
/// default.
const LOSSY_PORT: u16 = 24433;

/// A network namespace of this test's own holding only loopback, where
/// nftables drops `loss` percent of the UDP datagrams to and from
/// [`LOSSY_PORT`] at random (`numgen random`: netem is absent here), and
/// counts them. Removed when dropped.
struct Lossy {
    ns: String,
}

impl Lossy {
    fn new(tag: &str, loss: u32) -> Self {
        let ns = format!("fu-iop-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(std::process::Stdio::null())
            .status();
        common::sh(&["ip", "netns", "add", &ns]);
        let l = Lossy { ns };
        common::sh(&["ip", "-n", &l.ns, "link", "set", "lo", "up"]);
        // The first four counters count datagrams by direction and ECN
        // mark (for the ecn case); the drops follow.
        let rules = format!(
            "table inet fu_loss {{\n chain input {{\n  type filter hook input priority 0; policy accept;\n  \
             udp dport {LOSSY_PORT} ip ecn ect0 counter\n  \
             udp dport {LOSSY_PORT} counter\n  \
             udp sport {LOSSY_PORT} ip ecn ect0 counter\n  \
             udp sport {LOSSY_PORT} counter\n  \
             udp dport {LOSSY_PORT} numgen random mod 100 < {loss} counter drop\n  \
             udp sport {LOSSY_PORT} numgen random mod 100 < {loss} counter drop\n }}\n}}\n"
        );
        let f = clients::tempdir("nft").join("loss.nft");
        std::fs::write(&f, rules).unwrap();
        common::sh(&[
            "ip",
            "netns",
            "exec",
            &l.ns,
            "nft",
            "-f",
            f.to_str().unwrap(),
        ]);
        let _ = std::fs::remove_dir_all(f.parent().unwrap());
        l
    }

    /// The rules' packet counters, in rule order.
    fn counters(&self) -> Vec<u64> {
        let out = common::sh(&["ip", "netns", "exec", &self.ns, "nft", "list", "ruleset"]);
        out.split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .collect()
    }

    /// Datagrams the rules dropped so far.
    fn dropped(&self) -> u64 {
        self.counters()[4..].iter().sum()
    }

    /// Datagrams seen so far: (to the server marked ECT(0), to the server,
    /// from the server marked ECT(0), from the server).
    fn ecn(&self) -> (u64, u64, u64, u64) {
        let c = self.counters();
        (c[0], c[1], c[2], c[3])
    }

    /// A server in the namespace, on 127.0.0.1:[`LOSSY_PORT`]. Without
    /// GSO: loopback carries a GSO train as one packet, which the rule
    /// would drop whole; the runner's loss is per datagram.
    fn serve(&self) -> Running {
        let bin = server_bin();
        let port = format!("127.0.0.1:{LOSSY_PORT}");
        let mut r = Running::start_with(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "env",
                "FASTUDP_DISABLE=gso",
                &bin,
                "quic",
                "serve",
                "--json",
                "--stats",
                "--test-endpoints",
                "--listen",
                &port,
                "--workers",
                "2",
            ],
        );
        r.wait_for_line(|l| l.contains("\"listening\""));
        r
    }
}

impl Drop for Lossy {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The runner's handshakeloss (30% of datagrams lost each way; many
/// connections, one small file each) and transferloss (2%; one connection,
/// a larger file), with `client` fetching `paths` one connection per path
/// (handshakeloss) or all on one (transferloss). Every file byte-exact,
/// every connection accepted, every request answered over HTTP/3 if `h3`
/// (none otherwise), and datagrams were dropped. The server runs at its
/// default settings, so with its default idle timeout.
///
/// Unlike the loss-free cases, this does not wait for the server's
/// connections to end: a client's CONNECTION_CLOSE is lost as often as
/// any datagram (30% for handshakeloss), and the server then keeps that
/// connection until its idle timeout (30 s), which
/// `vanished_clients_time_out_and_memory_returns` (tests/it/quic.rs)
/// covers. Ctrl-C closes them.
fn lossy_case(
    test: &str,
    name: &str,
    h3: bool,
    client: impl FnOnce(&Lossy, SocketAddr, &[&str]) -> Vec<(String, Vec<u8>)>,
) {
    if !common::privileged(test, &["ip", "nft"]) {
        return;
    }
    let (loss, paths, connections): (u32, Vec<String>, u64) = match name {
        "handshakeloss" => (
            30,
            (1000..1010).map(|n| format!("/bytes/{n}")).collect(),
            10,
        ),
        "transferloss" => (2, vec!["/bytes/2000000".into()], 1),
        _ => panic!("no case {name}"),
    };
    // One namespace per test: the tests of this binary run at once.
    let tag = format!(
        "{}{}{}",
        if test.contains("aioquic") { "a" } else { "g" },
        &name[..3],
        if h3 { "h" } else { "" }
    );
    let l = Lossy::new(&tag, loss);
    let mut srv = l.serve();
    let addr: SocketAddr = format!("127.0.0.1:{LOSSY_PORT}").parse().unwrap();
    let p: Vec<&str> = paths.iter().map(String::as_str).collect();
    let files = client(&l, addr, &p);
    assert_eq!(files.len(), paths.len(), "{name}");
    for ((path, body), want) in files.iter().zip(&paths) {
        assert_eq!(path, want);
        let n: usize = path.trim_start_matches("/bytes/").parse().unwrap();
        assert!(
            *body == clients::bytes_body(n),
            "{name}: {path} is not byte-exact ({} bytes)",
            body.len()
        );
    }
    let h3_requests = if h3 { paths.len() as u64 } else { 0 };
    let s = stats_until(&mut srv, |v| {
        v["accepted"] == connections && v["h3_requests"] == h3_requests
    });
    assert_eq!(s["retries"], 0, "{name}: {s}");
    assert_eq!(s["refused"], 0, "{name}: {s}");
    assert!(
        l.dropped() > 0,
        "{name}: nothing was dropped: the test proved nothing"
    );
    stop(srv);
}

/// aioquic in the lossy namespace: one connection per path for
/// handshakeloss, one for all of them for transferloss; over HTTP/3 if
/// `h3`.
fn aioquic_lossy(test: &str, name: &str, h3: bool) {
    if !clients::aioquic(test) {
        return;
    }
    lossy_case(test, name, h3, |l, addr, paths| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
        let groups: Vec<Vec<&str>> = if name == "handshakeloss" {
            paths.iter().map(|p| vec![*p]).collect()
        } else {
            vec![paths.to_vec()]
        };
        let mut files = Vec::new();
        for g in groups {
            let (ok, out, err) = clients::run_bounded(
                Command::new("ip")
                    .args(["netns", "exec", &l.ns, "python3", script])
                    .args(if h3 { &["--h3"][..] } else { &[] })
                    .arg(addr.ip().to_string())
                    .arg(addr.port().to_string())
                    .args(&g),
            )
            .unwrap();
            assert!(ok, "{name}: {out}{err}");
            let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            for r in v["responses"].as_array().unwrap() {
                let path = r["path"].as_str().unwrap().to_string();
                let n: usize = path.trim_start_matches("/bytes/").parse().unwrap();
                let exact = r["bytes"] == n
                    && r["sha256"] == clients::sha256_hex(&clients::bytes_body(n)).as_str();
                files.push((
                    path,
                    if exact {
                        clients::bytes_body(n)
                    } else {
                        Vec::new()
                    },
                ));
            }
        }
        files
    });
}

/// quic-go's interop client in the lossy namespace: `multiconnect` (one
/// connection per file) for handshakeloss, `transfer` for transferloss,
/// as the runner runs them.
fn quic_go_lossy(test: &str, name: &str) {
    let Some(bin) = clients::quic_go_interop_client(test) else {
        return;
    };
    lossy_case(test, name, false, |l, addr, paths| {
        let testcase = if name == "handshakeloss" {
            "multiconnect"
        } else {
            "transfer"
        };
        let run = clients::quic_go_interop_in(Some(&l.ns), &bin, testcase, addr, paths).unwrap();
        paths
            .iter()
            .map(|p| (p.to_string(), run.file(p).unwrap_or_default()))
            .collect()
    });
}

/// When all the server's ServerHello datagrams are lost, the handshake
/// can go more than 10 s without a packet reaching the server (both
/// sides' probes back off); with a 10 s idle timeout the server ended
/// its side first, and the client's request got no answer within
/// aioquic's 60 s (2 of about 6 runs of the whole file). The default is
/// now 30 s (docs/INTEROP.md, note 4).
#[test]
fn interop_aioquic_handshakeloss() {
    aioquic_lossy("interop_aioquic_handshakeloss", "handshakeloss", false);
}
#[test]
fn interop_aioquic_transferloss() {
    aioquic_lossy("interop_aioquic_transferloss", "transferloss", false);
}
/// As `interop_aioquic_handshakeloss`, over HTTP/3 (1 of 9 runs stalled
/// with the 10 s idle timeout).
#[test]
fn interop_aioquic_h3_handshakeloss() {
    aioquic_lossy("interop_aioquic_h3_handshakeloss", "handshakeloss", true);
}
#[test]
fn interop_aioquic_h3_transferloss() {
    aioquic_lossy("interop_aioquic_h3_transferloss", "transferloss", true);
}
/// quic-go's client gives up a handshake after 5 s without a packet
/// (its HandshakeIdleTimeout, which the runner's client leaves at the
/// default) or not done within twice that. Under 30% loss each way that
/// happened here in 1 of 6 runs of 10 connections, and in 4 of 6 against
/// plain quinn (`--stack quinn`); 0 of 23 with the server's 30 s idle
/// timeout, which does not move the client's limits (docs/INTEROP.md,
/// note 3): a pass is likely, not certain, so CI does not run it.
#[test]
#[ignore = "flaky by design: quic-go's 5 s handshake timeout under 30% loss (docs/INTEROP.md)"]
fn interop_quic_go_handshakeloss() {
    quic_go_lossy("interop_quic_go_handshakeloss", "handshakeloss");
}
#[test]
fn interop_quic_go_transferloss() {
    quic_go_lossy("interop_quic_go_transferloss", "transferloss");
}

/// Files served from `--www`, fetched byte-exact over hq-interop by both
/// clients, in parallel on one connection each: sizes around a chunk and
/// a window, a nested path, and `index.html` for the directory itself.
#[test]
fn www_files_are_fetched_byte_exact_by_quic_go_and_aioquic() {
    let test = "www_files_are_fetched_byte_exact_by_quic_go_and_aioquic";
    let dir = clients::tempdir("www");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, n) in [
        ("index.html", 300usize),
        ("a.bin", 1),
        ("b.bin", 65_536),
        ("c.bin", 65_537),
        ("sub/d.bin", 3_000_001),
    ] {
        // Content that no pattern elsewhere has: a hash chain.
        let mut body = Vec::with_capacity(n);
        let mut seed = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
        while body.len() < n {
            body.extend_from_slice(seed.as_ref());
            seed = ring::digest::digest(&ring::digest::SHA256, seed.as_ref());
        }
        body.truncate(n);
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &body).unwrap();
        files.push((format!("/{name}"), body));
    }
    files[0].0 = "/".into();
    let www = dir.to_str().unwrap().to_string();
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    let want: Vec<(u64, String)> = files
        .iter()
        .map(|(_, b)| (b.len() as u64, clients::sha256_hex(b)))
        .collect();
    let check = |who: &str, got: Vec<Fetched>| {
        assert_eq!(got.len(), want.len(), "{who}: {got:?}");
        for (f, w) in got.iter().zip(&want) {
            assert_eq!(
                (f.status, f.bytes, &f.sha256),
                (200, w.0, &w.1),
                "{who}: {f:?}"
            );
        }
    };
    let (srv, addr, _) = serve(&["--listen", "127.0.0.1:0", "--workers", "2", "--www", &www]);
    if let Some(bin) = clients::quic_go_client(test) {
        let (got, _) = clients::quic_go_fetch(
            &bin,
            "hq-interop",
            Trust::Insecure,
            &clients::urls(addr, &paths),
        )
        .unwrap();
        check("quic-go", got);
    }
    if clients::aioquic(test) {
        let v = clients::aioquic_fetch(false, Trust::Insecure, addr, &paths).unwrap();
        check("aioquic", clients::aioquic_fetched(&v));
    }
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The runner's ecn case. quic-go marks its datagrams ECT(0) and stops
/// unless the server's ACKs count the marks (its ECN validation); the
/// server marks its own and stops unless the client's ACKs count them
/// (quinn-proto's). Over a 3 MB transfer in the namespace (no loss), both
/// directions stay marked: each side's ACKs carry ECN counts. Counted
/// by nftables (`ip ecn ect0`), not from a capture.
#[test]
fn interop_quic_go_ecn() {
    let test = "interop_quic_go_ecn";
    let Some(bin) = clients::quic_go_interop_client(test) else {
        return;
    };
    if !common::privileged(test, &["ip", "nft"]) {
        return;
    }
    let l = Lossy::new("gecn", 0);
    let srv = l.serve();
    let addr: SocketAddr = format!("127.0.0.1:{LOSSY_PORT}").parse().unwrap();
    let run = clients::quic_go_interop_in(Some(&l.ns), &bin, "transfer", addr, &["/bytes/3000000"])
        .unwrap();
    assert!(run.file("/bytes/3000000").unwrap() == clients::bytes_body(3_000_000));
    let (to_marked, to_all, from_marked, from_all) = l.ecn();
    // Most of each direction's datagrams: a side that failed validation
    // stops marking after its first ones (quic-go: 10). quic-go sends its
    // first datagrams unmarked until validation completes, which on a busy
    // machine can be a fifth of the client's few (about 130) datagrams.
    assert!(
        to_all > 50 && to_marked * 2 >= to_all,
        "client's: {to_marked} of {to_all} marked"
    );
    assert!(
        from_all > 1000 && from_marked * 10 >= from_all * 9,
        "server's: {from_marked} of {from_all} marked"
    );
    stop(srv);
}

/// aioquic neither marks nor counts ECN: the server's ECN validation must
/// fail and it must stop marking (RFC 9000 13.4.2), so that a path or
/// peer without ECN is not sent marks that nobody reports.
#[test]
fn interop_aioquic_ecn_falls_back_without_ecn_counts() {
    let test = "interop_aioquic_ecn_falls_back_without_ecn_counts";
    if !clients::aioquic(test) || !common::privileged(test, &["ip", "nft"]) {
        return;
    }
    let l = Lossy::new("aecn", 0);
    let srv = l.serve();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    let (ok, out, err) = clients::run_bounded(
        Command::new("ip")
            .args(["netns", "exec", &l.ns, "python3", script, "127.0.0.1"])
            .arg(LOSSY_PORT.to_string())
            .arg("/bytes/3000000"),
    )
    .unwrap();
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["responses"][0]["pattern"], true, "{v}");
    let (to_marked, _, from_marked, from_all) = l.ecn();
    assert_eq!(to_marked, 0, "aioquic marks nothing");
    assert!(
        from_all > 1000 && from_marked <= 20,
        "server's: {from_marked} of {from_all} still marked"
    );
    stop(srv);
}

// ------------------------------------------------------------------ HTTP/3

/// Files of `sizes` in a fresh directory, each of bytes that no other
/// file or pattern here has (a SHA-256 chain seeded by its name): their
/// URL paths and contents, in order. `index.html` is served as `/`.
fn www_dir(tag: &str, sizes: &[(&str, usize)]) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let dir = clients::tempdir(tag);
    let mut files = Vec::new();
    for &(name, n) in sizes {
        let mut body = Vec::with_capacity(n + 32);
        let mut seed = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
        while body.len() < n {
            body.extend_from_slice(seed.as_ref());
            seed = ring::digest::digest(&ring::digest::SHA256, seed.as_ref());
        }
        body.truncate(n);
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &body).unwrap();
        let path = if name == "index.html" {
            "/".to_string()
        } else {
            format!("/{name}")
        };
        files.push((path, body));
    }
    (dir, files)
}

/// The files an HTTP/3 fetch from `--www` asks for: sizes around a chunk
/// and a window, a nested path, `index.html` for `/`, and an 8 MB file,
/// more than any stream window of either client (quic-go auto-tunes its
/// stream window up to 6 MB, aioquic keeps 1 MB).
const H3_WWW: &[(&str, usize)] = &[
    ("index.html", 300),
    ("a.bin", 1),
    ("b.bin", 65_536),
    ("c.bin", 65_537),
    ("sub/d.bin", 3_000_001),
    ("e.bin", 8_000_000),
];

/// `/bytes/N` and `/video/RATE/SECONDS` fetched with the files, and their
/// bodies (the video's bytes are the /bytes pattern too).
fn h3_generated() -> Vec<(String, Vec<u8>)> {
    [0usize, 1, 100_003, 3_000_000]
        .iter()
        .map(|&n| (format!("/bytes/{n}"), clients::bytes_body(n)))
        .chain([("/video/200000/1".to_string(), clients::bytes_body(200_000))])
        .collect()
}

/// Serves [`H3_WWW`] and has `client` fetch those files and
/// [`h3_generated`] in parallel on one connection over HTTP/3. Each
/// response must be 200 and byte-exact (by SHA-256), the server must have
/// accepted one connection and answered every request over HTTP/3 (its
/// `h3_requests` counter; an hq-interop answer does not count).
fn h3_www_case(tag: &str, client: impl FnOnce(SocketAddr, &[&str]) -> Vec<Fetched>) {
    let (dir, mut files) = www_dir(tag, H3_WWW);
    files.extend(h3_generated());
    let www = dir.to_str().unwrap().to_string();
    let (mut srv, addr, _) = serve(&["--listen", "127.0.0.1:0", "--workers", "2", "--www", &www]);
    let paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    let got = client(addr, &paths);
    assert_eq!(got.len(), files.len(), "{got:?}");
    for (f, (path, body)) in got.iter().zip(&files) {
        assert!(f.what.ends_with(path.as_str()), "{f:?} for {path}");
        assert_eq!(
            (f.status, f.bytes, &f.sha256),
            (200, body.len() as u64, &clients::sha256_hex(body)),
            "{path}: {f:?}"
        );
    }
    let n = files.len() as u64;
    let s = stats_until(&mut srv, |v| v["connections"] == 0 && v["accepted"] == 1);
    assert_eq!(s["h3_requests"], n, "every request over HTTP/3: {s}");
    assert_eq!(s["h3_refused"], 0, "{s}");
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// quic-go's `http3` client fetches files from `--www` (one of 8 MB),
/// `/bytes/N` and a `/video` stream, all in parallel on one connection,
/// byte-exact. The client dialled one QUIC connection and the server
/// accepted one: the requests were multiplexed, not spread.
#[test]
fn quic_go_fetches_www_files_over_h3_in_parallel_on_one_connection() {
    let test = "quic_go_fetches_www_files_over_h3_in_parallel_on_one_connection";
    let Some(bin) = clients::quic_go_client(test) else {
        return;
    };
    h3_www_case("h3-quic-go", |addr, paths| {
        let (got, summary) =
            clients::quic_go_fetch(&bin, "h3", Trust::Insecure, &clients::urls(addr, paths))
                .unwrap();
        assert_eq!(summary["alpn"], "h3", "{summary}");
        assert_eq!(summary["connections"], 1, "one connection: {summary}");
        got
    });
}

/// The same with aioquic's H3 layer (`aioquic_client.py --h3`), which
/// opens one connection for all requests.
#[test]
fn aioquic_fetches_www_files_over_h3_in_parallel_on_one_connection() {
    let test = "aioquic_fetches_www_files_over_h3_in_parallel_on_one_connection";
    if !clients::aioquic(test) {
        return;
    }
    h3_www_case("h3-aioquic", |addr, paths| {
        let v = clients::aioquic_fetch(true, Trust::Insecure, addr, paths).unwrap();
        assert_eq!(v["alpn"], "h3", "{v}");
        assert_eq!(v["connections"].as_array().map(Vec::len), Some(1), "{v}");
        clients::aioquic_fetched(&v)
    });
}

/// CRC-32 (IEEE, as PNG and zlib's gzip use), bit by bit.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG of `w` x `h` RGB pixels from `px(x, y)`, its zlib stream made of
/// stored (uncompressed) deflate blocks: about 3*w*h bytes.
fn png(w: u32, h: u32, mut px: impl FnMut(u32, u32) -> [u8; 3]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(((3 * w + 1) * h) as usize);
    for y in 0..h {
        raw.push(0); // filter: none
        for x in 0..w {
            raw.extend_from_slice(&px(x, y));
        }
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push((i + 1 == blocks.len()) as u8);
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &x in &raw {
        a = (a + x as u32) % 65_521;
        b = (b + a) % 65_521;
    }
    z.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut c = kind.to_vec();
        c.extend_from_slice(data);
        out.extend_from_slice(&c);
        out.extend_from_slice(&crc32(&c).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &z);
    chunk(b"IEND", &[]);
    out
}

/// FNV-1a, 32 bits: what the page's script computes over the large file.
fn fnv1a32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// The images of the Chromium page: (width, height); the last is a large
/// one of noise (about 1 MB, incompressible).
const PAGE_IMAGES: &[(u32, u32)] = &[(3, 5), (7, 2), (16, 9), (1, 1), (33, 20), (600, 560)];

/// The page: each image records whether it loaded (`onload`/`onerror`
/// set at parse time); a synchronous request reads a 4 MB file and writes
/// its status, length and FNV-1a hash; after the `load` event a script
/// writes each image's natural size and state. `--dump-dom` prints the
/// DOM after that event, so a missing or broken image, or a short file,
/// shows in what it prints.
fn page_html() -> String {
    let mut s = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>fastudp h3</title></head><body>\n",
    );
    for i in 0..PAGE_IMAGES.len() {
        s += &format!(
            "<img id=\"i{i}\" src=\"/img/{i}.png\" onload=\"this.dataset.s='load'\" onerror=\"this.dataset.s='error'\">\n"
        );
    }
    s += r#"<p id="big">big not read</p><p id="out">no load event</p>
<script>
(function () {
  var x = new XMLHttpRequest();
  x.open('GET', '/big.bin', false);
  x.overrideMimeType('text/plain; charset=x-user-defined');
  x.send();
  var t = x.responseText, h = 0x811c9dc5;
  for (var i = 0; i < t.length; i++) {
    h = Math.imul(h ^ (t.charCodeAt(i) & 0xff), 0x01000193);
  }
  document.getElementById('big').textContent =
    'big ' + x.status + ' ' + t.length + ' ' + (h >>> 0).toString(16);
})();
window.addEventListener('load', function () {
  var r = Array.prototype.map.call(document.images, function (i) {
    return i.id + '=' + i.naturalWidth + 'x' + i.naturalHeight + ':' + (i.dataset.s || 'pending');
  });
  document.getElementById('out').textContent = 'images ' + r.join(' ');
});
</script>
</body></html>
"#;
    s
}

/// Headless Chromium loads a page from `--www` over HTTP/3 (forced onto
/// QUIC for the origin, trusting the printed SPKI): every image decoded at
/// its size (one of about 1 MB) and a 4 MB file read whole (its hash
/// computed in the page), as the rendered DOM shows. The server answered
/// at least that many requests over HTTP/3 (Chromium also asks for
/// `/favicon.ico`). A server speaking hq-interop only (`--stack quinn`)
/// fails the same load: Chromium offers `h3` alone.
#[test]
fn chromium_renders_a_page_with_images_over_http3() {
    let test = "chromium_renders_a_page_with_images_over_http3";
    let Some(bin) = clients::chromium(test) else {
        return;
    };
    let dir = clients::tempdir("chromium-www");
    std::fs::create_dir_all(dir.join("img")).unwrap();
    std::fs::write(dir.join("index.html"), page_html()).unwrap();
    for (i, &(w, h)) in PAGE_IMAGES.iter().enumerate() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
        let img = png(w, h, |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            [x as u8, (x >> 8) as u8, (x >> 16) as u8]
        });
        std::fs::write(dir.join(format!("img/{i}.png")), img).unwrap();
    }
    let (big_dir, mut big) = www_dir("chromium-big", &[("big.bin", 4_000_000)]);
    let _ = std::fs::remove_dir_all(&big_dir);
    let big = big.remove(0).1;
    std::fs::write(dir.join("big.bin"), &big).unwrap();
    let www = dir.to_str().unwrap().to_string();
    let (mut srv, addr, spki) =
        serve(&["--listen", "127.0.0.1:0", "--workers", "2", "--www", &www]);
    let dom = clients::chromium_dump_dom(&bin, "127.0.0.1", addr.port(), &spki, "/")
        .unwrap_or_else(|e| panic!("{e}"));
    let want: Vec<String> = PAGE_IMAGES
        .iter()
        .enumerate()
        .map(|(i, (w, h))| format!("i{i}={w}x{h}:load"))
        .collect();
    assert_eq!(
        clients::dom_text(&dom, "out"),
        format!("images {}", want.join(" ")),
        "{dom}"
    );
    assert_eq!(
        clients::dom_text(&dom, "big"),
        format!("big 200 {} {:x}", big.len(), fnv1a32(&big)),
        "{dom}"
    );
    // The page, its images and the file.
    let resources = 1 + PAGE_IMAGES.len() as u64 + 1;
    let s = stats_until(&mut srv, |v| {
        v["h3_requests"].as_u64().unwrap_or(0) >= resources
    });
    assert_eq!(s["h3_refused"], 0, "{s}");
    stop(srv);
    // The same page from a server that speaks hq-interop only.
    let (srv, addr, spki) = serve(&["--listen", "127.0.0.1:0", "--stack", "quinn"]);
    let e = clients::chromium_dump_dom(&bin, "127.0.0.1", addr.port(), &spki, "/")
        .expect_err("an hq-interop-only server");
    assert!(e.to_string().contains("net::ERR_"), "{e}");
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The load client of the file-serving benchmark (scripts/bench-files.sh),
/// built next to quic-go's client by scripts/build-quic-go-client.sh.
pub(crate) fn quic_go_filebench(test: &str) -> Option<PathBuf> {
    let client = clients::quic_go_client(test)?;
    let bin = client.with_file_name("quic-go-filebench");
    if bin.exists() {
        Some(bin)
    } else {
        skip(
            test,
            &format!(
                "{} is missing (scripts/build-quic-go-client.sh builds it)",
                bin.display()
            ),
        );
        None
    }
}

/// Runs `quic-go-filebench load` against `addr` for 2 s, fetching the
/// files of `dir` with every byte compared; its exit success and JSON.
fn filebench_load(bin: &Path, addr: SocketAddr, dir: &Path) -> (bool, serde_json::Value) {
    let (ok, out, err) = clients::run_bounded(Command::new(bin).args([
        "load",
        "-proto",
        "h3",
        "-verify",
        "-insecure",
        "-connections",
        "20",
        "-duration",
        "2s",
        "-dir",
        dir.to_str().unwrap(),
        &format!("https://{addr}"),
    ]))
    .unwrap();
    let v = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("load output {out:?} ({e}); stderr {err}"));
    (ok, v)
}

/// The benchmark's workload in small: 20 quic-go HTTP/3 connections
/// fetch files from `--www` one after the other for 2 s, every byte
/// compared with the file; and the comparison is real: against a copy of
/// the directory with one byte changed, the same load reports errors.
#[test]
fn quic_go_loads_files_byte_exact_over_many_connections() {
    let test = "quic_go_loads_files_byte_exact_over_many_connections";
    let Some(bin) = quic_go_filebench(test) else {
        return;
    };
    let base =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("filebench-{}", std::process::id()));
    let (www, other) = (base.join("www"), base.join("changed"));
    for d in [&www, &other] {
        std::fs::create_dir_all(d).unwrap();
    }
    for n in [0usize, 1, 1000, 65536, 65537, 1_048_577] {
        // Bytes that differ from chunk to chunk, so a chunk served twice
        // or out of order shows.
        let body: Vec<u8> = (0..n)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(www.join(format!("f{n}.bin")), &body).unwrap();
        let mut changed = body;
        if n == 1_048_577 {
            changed[700_000] ^= 1;
        }
        std::fs::write(other.join(format!("f{n}.bin")), &changed).unwrap();
    }
    let (srv, addr, _) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--www",
        www.to_str().unwrap(),
    ]);
    let (ok, v) = filebench_load(&bin, addr, &www);
    assert!(ok, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(
        v["completed"].as_u64().unwrap() >= 6,
        "every file at least once: {v}"
    );
    let (ok, v) = filebench_load(&bin, addr, &other);
    assert!(!ok, "a changed byte must fail the load: {v}");
    assert!(
        v["first_error"]
            .as_str()
            .unwrap_or("")
            .contains("body differs"),
        "{v}"
    );
    stop(srv);
    let _ = std::fs::remove_dir_all(&base);
}

// ------------------------------------------------- discovery over TCP

/// The page of the `--alt-svc-tcp` test. It loads over TCP (a browser
/// knows nothing of HTTP/3 yet); a script of 3 s (`/video`, which keeps
/// the load event waiting) gives the browser time to take in the
/// `Alt-Svc` header; after 1.5 s and again after 2.5 s the page asks for
/// images, and at the load event it writes which protocol carried the
/// page and each image (Resource Timing's `nextHopProtocol`) and whether
/// each image decoded at its size.
fn alt_svc_page() -> String {
    r#"<!doctype html><html><head><meta charset="utf-8"><title>alt-svc</title></head><body>
<p id="nav">no navigation entry</p><p id="late">no load event</p>
<script async src="/video/2000/3"></script>
<script>
var nav = performance.getEntriesByType('navigation')[0];
document.getElementById('nav').textContent = 'nav ' + (nav ? nav.nextHopProtocol : 'none');
function add(names) {
  names.forEach(function (n) {
    var i = new Image();
    i.id = n;
    i.onload = function () { this.dataset.s = 'load'; };
    i.onerror = function () { this.dataset.s = 'error'; };
    i.src = '/img/' + n + '.png';
    document.body.appendChild(i);
  });
}
setTimeout(function () { add(['a', 'b']); }, 1500);
setTimeout(function () { add(['c', 'd']); }, 2500);
window.addEventListener('load', function () {
  var r = Array.prototype.map.call(document.images, function (i) {
    var e = performance.getEntriesByName(i.src);
    return i.id + '=' + i.naturalWidth + 'x' + i.naturalHeight + ':' + (i.dataset.s || 'pending') +
      ':' + (e.length ? e[e.length - 1].nextHopProtocol : 'none');
  });
  document.getElementById('late').textContent = 'images ' + r.join(' ');
});
</script>
</body></html>
"#
    .to_string()
}

/// Loads `https://127.0.0.1:PORT/` in headless Chromium with QUIC on but
/// not forced for that origin; with `allow_unknown_root`, QUIC is forced
/// for `127.0.0.1:9` instead, another origin of the same host that the
/// page never contacts (see the test). The dumped DOM.
fn chromium_alt_svc(bin: &Path, port: u16, spki: &str, allow_unknown_root: bool) -> String {
    let profile = clients::tempdir("altsvc-chromium");
    let mut cmd = Command::new(bin);
    cmd.arg("--headless=new")
        .arg("--no-sandbox")
        .arg("--disable-gpu")
        .arg("--no-first-run")
        .arg("--enable-quic")
        .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
        .arg(format!("--user-data-dir={}", profile.display()));
    if allow_unknown_root {
        cmd.arg("--origin-to-force-quic-on=127.0.0.1:9");
    }
    let r = clients::run_bounded(
        cmd.arg("--dump-dom")
            .arg(format!("https://127.0.0.1:{port}/")),
    );
    let _ = std::fs::remove_dir_all(&profile);
    let (_, dom, err) = r.unwrap();
    assert!(
        !err.contains("Page load failed") && !dom.trim().is_empty(),
        "{}",
        err.lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );
    dom
}

/// The protocol each of the page's late images came over, checking that
/// each decoded at its size.
fn late_protocols(dom: &str) -> Vec<String> {
    let late = clients::dom_text(dom, "late");
    ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let want = format!("{n}={}x3:load:", 4 + i);
            let got = late
                .split(' ')
                .find(|e| e.starts_with(&format!("{n}=")))
                .unwrap_or_else(|| panic!("no image {n} in {late:?}"));
            assert!(got.starts_with(&want), "{got} in {late:?}");
            got[want.len()..].to_string()
        })
        .collect()
}

/// `--alt-svc-tcp`: headless Chromium, with QUIC not forced for the
/// origin, loads `https://127.0.0.1:PORT/` over TLS over TCP, takes in
/// `Alt-Svc: h3=":PORT"`, and fetches the images the page asks for later
/// over HTTP/3, in the same session. The page reports each resource's
/// protocol (Resource Timing); the server's counters agree: requests
/// over TCP first, HTTP/3 requests after.
///
/// What Chromium 156 does here (its net log): it honours the header for
/// 127.0.0.1 and localhost alike (`ALT_SVC_FOUND`) and opens a QUIC
/// connection, but with a certificate that `--ignore-certificate-errors-
/// spki-list` accepts, not one of a known root, the QUIC handshake fails
/// (`CERTIFICATE_VERIFY_FAILED`, alert 46) unless the host is one that
/// `--origin-to-force-quic-on` names: only then does its QUIC verifier
/// accept an unknown root. It then marks the alternative broken and stays
/// on TCP. So the test runs twice: without that flag (everything over
/// TCP, and the QUIC attempts Alt-Svc caused are seen by the server), and
/// with QUIC forced for `127.0.0.1:9`, an origin of the same host the
/// page never contacts, which lets the QUIC handshake to PORT succeed
/// while PORT itself is still reached by Alt-Svc alone.
#[test]
fn alt_svc_tcp_chromium_starts_over_tcp_and_moves_to_http3() {
    let test = "alt_svc_tcp_chromium_starts_over_tcp_and_moves_to_http3";
    let Some(bin) = clients::chromium(test) else {
        return;
    };
    let dir = clients::tempdir("altsvc-www");
    std::fs::create_dir_all(dir.join("img")).unwrap();
    std::fs::write(dir.join("index.html"), alt_svc_page()).unwrap();
    for (i, n) in ["a", "b", "c", "d"].iter().enumerate() {
        let img = png(4 + i as u32, 3, |x, y| {
            [x as u8 * 40, y as u8 * 60, i as u8 * 50]
        });
        std::fs::write(dir.join(format!("img/{n}.png")), img).unwrap();
    }
    let www = dir.to_str().unwrap().to_string();
    let (mut srv, addr, spki) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--www",
        &www,
        "--alt-svc-tcp",
    ]);
    // Without an allowance for the unknown root: all over TCP (HTTP/2,
    // which the listener offers first by ALPN), after QUIC attempts that
    // the Alt-Svc header caused.
    let dom = chromium_alt_svc(&bin, addr.port(), &spki, false);
    assert_eq!(clients::dom_text(&dom, "nav"), "nav h2", "{dom}");
    assert_eq!(late_protocols(&dom), ["h2"; 4], "{dom}");
    let s = stats_until(&mut srv, |v| v["tcp"]["requests"].as_u64() >= Some(6));
    assert_eq!(s["h3_requests"], 0, "{s}");
    assert!(
        s["accepted"].as_u64().unwrap() >= 1,
        "Chromium never tried QUIC: {s}"
    );
    let tcp_before = s["tcp"]["requests"].as_u64().unwrap();
    // With it: the page over TCP, the images it asks for later over h3.
    let dom = chromium_alt_svc(&bin, addr.port(), &spki, true);
    assert_eq!(clients::dom_text(&dom, "nav"), "nav h2", "{dom}");
    let protos = late_protocols(&dom);
    let h3 = protos.iter().filter(|p| *p == "h3").count() as u64;
    assert!(protos.iter().all(|p| p == "h3" || p == "h2"), "{protos:?}");
    assert!(h3 > 0, "no image came over HTTP/3: {protos:?}");
    let s = stats_until(&mut srv, |v| v["h3_requests"].as_u64() >= Some(h3));
    // The page came over TCP in this session too. Its script and the
    // favicon race the QUIC handshake Alt-Svc started: either path.
    assert!(s["tcp"]["requests"].as_u64().unwrap() > tcp_before, "{s}");
    assert_eq!(s["tcp"]["bad_requests"], 0, "{s}");
    assert_eq!(s["h3_refused"], 0, "{s}");
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--alt-svc-tcp` with curl over TLS over TCP: the `Alt-Svc` header
/// names the QUIC port, a `--www` file and `/bytes/N` arrive byte-exact,
/// an escape is 404; then quic-go fetches the same file over HTTP/3 from
/// the same port, byte-exact.
#[test]
fn alt_svc_tcp_curl_and_quic_go_get_the_same_bytes() {
    let test = "alt_svc_tcp_curl_and_quic_go_get_the_same_bytes";
    if !common::have("curl") {
        skip(test, "needs curl (apt-get install curl)");
        return;
    }
    let (dir, files) = www_dir("altsvc-curl", &[("f.bin", 300_000)]);
    let (mut srv, addr, _) = serve(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--www",
        dir.to_str().unwrap(),
        "--alt-svc-tcp",
    ]);
    let out = dir.join("got");
    let curl = |path: &str| {
        let o = Command::new("curl")
            .args([
                "-sS",
                "-k",
                "--http1.1",
                "--max-time",
                "30",
                "-D",
                "-",
                "-o",
            ])
            .arg(&out)
            .arg(format!("https://{addr}{path}"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        (
            String::from_utf8_lossy(&o.stdout).to_ascii_lowercase(),
            std::fs::read(&out).unwrap(),
        )
    };
    let alt_svc = format!("alt-svc: h3=\":{}\"; ma=86400\r\n", addr.port());
    let (head, body) = curl("/f.bin");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&alt_svc), "{head}");
    assert_eq!(body, files[0].1, "the file over TCP, byte-exact");
    let (head, body) = curl("/bytes/70000");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, clients::bytes_body(70_000));
    let (head, _) = curl("/%2e%2e/etc/passwd");
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(head.contains(&alt_svc), "{head}");
    let s = stats_until(&mut srv, |v| v["tcp"]["requests"] == 3);
    assert_eq!(s["tcp"]["bad_requests"], 0, "{s}");
    if let Some(qg) = clients::quic_go_client(test) {
        let (got, _) = clients::quic_go_fetch(
            &qg,
            "h3",
            Trust::Insecure,
            &clients::urls(addr, &["/f.bin"]),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got[0].status, 200);
        assert_eq!(got[0].sha256, clients::sha256_hex(&files[0].1));
    }
    stop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that leaves in the middle of a response over TCP (curl,
/// reading slowly, stopped by its time limit: its close resets the
/// connection) costs the server that response only: the server, which
/// does not ignore SIGPIPE, must not be ended by its next write, and
/// serves the next client.
#[test]
fn alt_svc_tcp_a_client_that_resets_mid_response_does_not_end_the_server() {
    let test = "alt_svc_tcp_a_client_that_resets_mid_response_does_not_end_the_server";
    if !common::have("curl") {
        skip(test, "needs curl (apt-get install curl)");
        return;
    }
    let (mut srv, addr, _) = serve(&["--listen", "127.0.0.1:0", "--workers", "1", "--alt-svc-tcp"]);
    let curl = |path: &str, more: &[&str]| {
        Command::new("curl")
            .args([
                "-sS",
                "-k",
                "--http1.1",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(more)
            .arg(format!("https://{addr}{path}"))
            .output()
            .unwrap()
    };
    for _ in 0..3 {
        let o = curl(
            "/bytes/100000000",
            &["--limit-rate", "100k", "--max-time", "1"],
        );
        assert_eq!(
            o.status.code(),
            Some(28),
            "curl stopped by --max-time (7: the server is gone): {o:?}"
        );
    }
    // The stats lines are read in order: the first with all three
    // connections accepted and closed, not one from between the curls.
    let s = stats_until(&mut srv, |v| {
        v["tcp"]["accepted"].as_u64() >= Some(3) && v["tcp"]["open"] == 0
    });
    assert_eq!(s["tcp"]["send_failed"], 3, "{s}");
    let o = curl("/bytes/1000", &["--max-time", "10"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "200", "{o:?}");
    stop(srv);
}
