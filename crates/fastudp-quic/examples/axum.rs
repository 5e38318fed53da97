//! An unchanged axum `Router` served over HTTP/3 on the engine, and the
//! same `Router` over TLS/TCP (HTTP/1.1 and HTTP/2, hyper-util's auto
//! server) on the same port number, whose answers name the HTTP/3 one in
//! `alt-svc`.
//!
//! ```text
//! cargo run --release -p fastudp-quic --example axum -- --listen 127.0.0.1:4433 [--cert C --key K]
//!     [--workers N] [--stream-window BYTES] [--recv-arena] [--rx-coalesce-us US]
//! ```
//!
//! `--stream-window` raises each request stream's receive window from the
//! engine's default (4 KiB, sized for small requests) for uploads; the
//! engine refuses a value out of range, naming it. `--recv-arena` turns on
//! the engine's receive arena (`fastudp_quic::Tuning::recv_arena`);
//! `--rx-coalesce-us` sets its receive coalescing wait
//! (`fastudp_quic::Tuning::rx_coalesce`, 250 us by default; 0 turns it
//! off; the engine refuses more than 1,000).
//!
//! Without `--cert`/`--key` (PEM) the certificate is a self-signed one for
//! `localhost`; the SHA-256 of its public key (SPKI, base64) is printed, as
//! `fastudp quic serve` does, for Chromium's
//! `--ignore-certificate-errors-spki-list`.
//!
//! Routes:
//! - `GET /hello/{name}`: `hello {name}`;
//! - `POST /upload`: the body's length and SHA-256 in hex, `LEN HEX`, read
//!   as a stream (one chunk held at a time);
//! - `GET /download/{n}`: n bytes of the `/bytes/N` pattern, streamed;
//! - `GET /panic`: the handler panics; HTTP/3 answers 500 and the worker
//!   goes on;
//! - `GET /json`: a 1 KB (1,024-byte) JSON document from an async handler,
//!   the small dynamic answer of scripts/app-bench.sh;
//! - `GET /sleep`: `slept`, after the handler awaits a 1 ms tokio timer;
//! - `GET /`: a page whose script GETs `/hello/browser` and POSTs 10 MB
//!   to `/upload` with `fetch()`, and shows both answers with the protocol
//!   each went over (Resource Timing's `nextHopProtocol`).
//!
//! `examples/axum_quinn.rs` serves this same `Router` ([`router`]) on
//! quinn + h3-quinn, for the comparison of docs/BENCHMARKS.md.

use axum::extract::Path;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use fastudp_quic::app::Router as AlpnRouter;
use fastudp_quic::h3::H3App;
use fastudp_quic::{Engine, EngineConfig};
use http_body_util::BodyExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::Digest;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The application: the same for HTTP/3 and TCP.
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| async { axum::response::Html(PAGE) }))
        .route(
            "/hello/{name}",
            get(|Path(name): Path<String>| async move { format!("hello {name}") }),
        )
        .route("/json", get(json))
        .route(
            "/sleep",
            get(|| async {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                "slept"
            }),
        )
        .route("/upload", post(upload))
        .route("/download/{n}", get(download))
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("GET /panic panics, as asked");
                }
                "unreachable"
            }),
        )
}

/// The length of the page's upload: byte i of it is i % 251.
pub const PAGE_UPLOAD: usize = 10_000_000;

/// `GET /`: a page that asks for `/hello/browser`, then POSTs
/// [`PAGE_UPLOAD`] bytes to `/upload`, and writes each answer, its status
/// and the protocol it went over into `#hello` and `#upload`.
pub const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>axum over HTTP/3 on fastudp</title></head>
<body>
<h1>An axum Router over HTTP/3 on fastudp</h1>
<p>GET /hello/browser: <span id="hello">pending</span></p>
<p>POST /upload (10 MB): <span id="upload">pending</span></p>
<script>
function proto(path) {
  var e = performance.getEntriesByName(new URL(path, location.href).href);
  return e.length ? e[e.length - 1].nextHopProtocol : 'unknown';
}
function put(id, text) { document.getElementById(id).textContent = text; }
(async function () {
  try {
    var r = await fetch('/hello/browser');
    put('hello', r.status + ' ' + (await r.text()) + ' over ' + proto('/hello/browser'));
  } catch (e) { put('hello', 'error ' + e); }
  try {
    var n = 10000000, b = new Uint8Array(n);
    for (var i = 0; i < n; i++) b[i] = i % 251;
    var r = await fetch('/upload', {method: 'POST', body: b,
      headers: {'content-type': 'application/octet-stream'}});
    put('upload', r.status + ' ' + (await r.text()) + ' over ' + proto('/upload'));
  } catch (e) { put('upload', 'error ' + e); }
})();
</script>
</body></html>
"#;

/// The length of the `GET /json` document.
pub const JSON_LEN: usize = 1024;

/// A 1 KB JSON document: 16 items, padded to exactly [`JSON_LEN`] bytes.
/// Built per request, as a dynamic answer would be.
pub fn json_document() -> String {
    let mut s = String::with_capacity(JSON_LEN);
    s.push_str("{\"items\":[");
    for i in 0..16 {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"id\":{i},\"name\":\"item-{i:02}\",\"price\":{}.{:02}}}",
            10 + i,
            (i * 7) % 100
        ));
    }
    s.push_str("],\"pad\":\"");
    // The closing `"}` takes two bytes.
    while s.len() < JSON_LEN - 2 {
        s.push('x');
    }
    s.push_str("\"}");
    s
}

/// `GET /json`: [`json_document`], as `application/json`.
async fn json() -> impl axum::response::IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        json_document(),
    )
}

/// `LEN HEX` of the body, read frame by frame.
async fn upload(body: axum::body::Body) -> Result<String, (http::StatusCode, String)> {
    let mut body = body;
    let mut hash = sha2::Sha256::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (http::StatusCode::BAD_REQUEST, e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            len += data.len() as u64;
            hash.update(&data);
        }
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{len} {hex}"))
}

/// `n` bytes of the pattern, a chunk at a time.
async fn download(Path(n): Path<u64>) -> axum::body::Body {
    axum::body::Body::new(Pattern { off: 0, end: n })
}

/// A body of the `/bytes/N` pattern (`fastudp_quic::hq::wire::pattern`).
pub struct Pattern {
    off: u64,
    end: u64,
}

impl http_body::Body for Pattern {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let left = self.end - self.off;
        if left == 0 {
            return Poll::Ready(None);
        }
        let b = fastudp_quic::hq::wire::pattern(self.off, left);
        self.off += b.len() as u64;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b)))))
    }

    fn is_end_stream(&self) -> bool {
        self.off == self.end
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.end - self.off)
    }
}

/// What to serve.
pub struct Options {
    /// The address of both listeners (UDP for HTTP/3, TCP for the rest).
    pub listen: SocketAddr,
    /// PEM certificate chain and key; self-signed when `None`.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// Engine workers.
    pub workers: usize,
    /// The receive window of each request stream, bytes (what an upload
    /// moves per round trip); `None`: the engine's default
    /// (`fastudp_quic::Transport`).
    pub stream_window: Option<u32>,
    /// Copies received datagrams into a shared arena
    /// (`fastudp_quic::Tuning::recv_arena`): no allocation per datagram.
    pub recv_arena: bool,
    /// The engine's receive coalescing wait
    /// (`fastudp_quic::Tuning::rx_coalesce`); `None`: its default.
    pub rx_coalesce: Option<std::time::Duration>,
}

/// The engine's transport, with `stream_window` when one is given.
pub fn transport(stream_window: Option<u32>) -> fastudp_quic::Transport {
    let t = fastudp_quic::Transport::new();
    match stream_window {
        Some(w) => t.stream_window(w),
        None => t,
    }
}

/// A running server.
pub struct Server {
    /// The HTTP/3 engine.
    pub engine: Engine,
    /// The TCP listener's address.
    pub tcp: SocketAddr,
    /// SHA-256 of the certificate's SPKI, base64.
    pub spki_sha256: String,
    /// The certificate (DER), for clients to trust.
    pub cert: CertificateDer<'static>,
    /// The runtime of the TCP server; dropping it stops it.
    pub tcp_runtime: tokio::runtime::Runtime,
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The certificate chain and key: read from PEM files, or a self-signed
/// one for `localhost`.
pub fn identity(
    cert: &Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    Ok(match cert {
        Some((c, k)) => {
            let chain = CertificateDer::pem_file_iter(c)?.collect::<Result<Vec<_>, _>>()?;
            anyhow::ensure!(!chain.is_empty(), "{}: no certificate", c.display());
            (chain, PrivateKeyDer::from_pem_file(k)?)
        }
        None => {
            let c = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
            let key = PrivatePkcs8KeyDer::from(c.key_pair.serialize_der()).into();
            (vec![c.cert.der().clone()], key)
        }
    })
}

/// A TLS 1.3 server configuration (aws-lc-rs) offering `alpn`.
pub fn tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[&[u8]],
) -> anyhow::Result<rustls::ServerConfig> {
    let mut c = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    c.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(c)
}

/// Starts both listeners.
pub fn serve(o: &Options) -> anyhow::Result<Server> {
    let (chain, key) = identity(&o.cert)?;
    let leaf = rustls::server::ParsedCertificate::try_from(&chain[0])?;
    let spki = ring::digest::digest(
        &ring::digest::SHA256,
        leaf.subject_public_key_info().as_ref(),
    );
    let cert = chain[0].clone();
    let quic_tls = tls(chain.clone(), key.clone_key(), &[])?;
    let app = AlpnRouter::new().with(fastudp_quic::h3::ALPN, H3App::service(router()));
    let engine = Engine::start(
        EngineConfig::new(o.listen, Arc::new(quic_tls))
            .workers(o.workers)
            .transport(transport(o.stream_window))
            .tuning({
                let mut t = fastudp_quic::Tuning::default();
                t.recv_arena = o.recv_arena;
                if let Some(c) = o.rx_coalesce {
                    t.rx_coalesce = c;
                }
                t
            }),
        Arc::new(app),
    )?;
    let port = engine.local_addr().port();

    // TLS/TCP on the same port number, naming HTTP/3 in alt-svc.
    let tcp_tls = Arc::new(tls(chain, key, &[b"h2", b"http/1.1"])?);
    let alt_svc = http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400"))?;
    let tcp_app = router().layer(axum::middleware::map_response(
        move |mut r: axum::response::Response| {
            let v = alt_svc.clone();
            async move {
                r.headers_mut().insert(http::header::ALT_SVC, v);
                r
            }
        },
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = rt.block_on(tokio::net::TcpListener::bind(SocketAddr::new(
        o.listen.ip(),
        port,
    )))?;
    let tcp = listener.local_addr()?;
    rt.spawn(accept_tcp(
        listener,
        tokio_rustls::TlsAcceptor::from(tcp_tls),
        tcp_app,
    ));
    Ok(Server {
        engine,
        tcp,
        spki_sha256: base64(spki.as_ref()),
        cert,
        tcp_runtime: rt,
    })
}

/// How long a TCP client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn accept_tcp(l: tokio::net::TcpListener, tls: tokio_rustls::TlsAcceptor, app: Router) {
    loop {
        let Ok((tcp, _)) = l.accept().await else {
            continue;
        };
        let tls = tls.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let Ok(Ok(stream)) = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(tcp)).await
            else {
                return;
            };
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
        });
    }
}

fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut listen = None;
    let (mut cert, mut key) = (None, None);
    let mut workers = 1;
    let mut stream_window = None;
    let mut recv_arena = false;
    let mut rx_coalesce = None;
    let mut args = args;
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(val()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--cert" => cert = Some(PathBuf::from(val()?)),
            "--key" => key = Some(PathBuf::from(val()?)),
            "--workers" => workers = val()?.parse().map_err(|e| format!("--workers: {e}"))?,
            "--stream-window" => {
                stream_window = Some(
                    val()?
                        .parse()
                        .map_err(|e| format!("--stream-window: {e}"))?,
                )
            }
            "--recv-arena" => recv_arena = true,
            "--rx-coalesce-us" => {
                let us: u64 = val()?
                    .parse()
                    .map_err(|e| format!("--rx-coalesce-us: {e}"))?;
                rx_coalesce = Some(std::time::Duration::from_micros(us));
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err("--cert and --key go together".into()),
    };
    Ok(Options {
        listen: listen.unwrap_or_else(|| "127.0.0.1:4433".parse().expect("an address")),
        cert,
        workers,
        stream_window,
        recv_arena,
        rx_coalesce,
    })
}

#[allow(dead_code)]
fn main() {
    let o = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("axum: {e}\nusage: axum --listen ADDR [--cert C --key K] [--workers N] [--stream-window BYTES] [--recv-arena] [--rx-coalesce-us US]");
            std::process::exit(2);
        }
    };
    let s = match serve(&o) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("axum: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "HTTP/3 on udp {}, HTTP/1.1 and HTTP/2 on tcp {}",
        s.engine.local_addr(),
        s.tcp
    );
    println!("certificate SPKI SHA-256 (base64): {}", s.spki_sha256);
    loop {
        std::thread::park();
    }
}
