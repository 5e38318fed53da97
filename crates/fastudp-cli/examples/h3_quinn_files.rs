//! The plain-quinn reference of the file-serving comparison
//! (scripts/bench-files.sh, docs/BENCHMARKS.md): static files over HTTP/3
//! with quinn (tokio, quinn-udp) and h3-quinn, the obvious Rust
//! alternative to `fastudp quic serve --www`.
//!
//! It serves the same way `quic serve --www` does, so the comparison
//! is of the QUIC stacks: the same transport configuration
//! ([`fastudp_quic::transport`]), the same file code ([`Root`]: the path
//! resolved beneath the directory with `openat2`, the file read in 64 KiB
//! chunks with `pread` as the stream takes them), a self-signed ECDSA
//! certificate.
//!
//! ```sh
//! cargo run --release -p fastudp-cli --example h3_quinn_files -- \
//!     --listen 127.0.0.1:4433 --www DIR [--workers 1] [--duration SECONDS]
//! ```
//!
//! It prints `listening ADDR`, serves until `--duration` ends or SIGINT,
//! and prints one JSON line with its request counts.

use bytes::Bytes;
use fastudp_quic::files::{Method, Root};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// What the server counts.
#[derive(Default)]
struct Counts {
    connections: AtomicU64,
    requests: AtomicU64,
    served: AtomicU64,
    failed: AtomicU64,
}

struct Args {
    listen: SocketAddr,
    www: PathBuf,
    workers: usize,
    duration: Option<Duration>,
}

fn args() -> anyhow::Result<Args> {
    let mut listen = None;
    let mut www = None;
    let mut workers = 1;
    let mut duration = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{a}: a value is expected"))
        };
        match a.as_str() {
            "--listen" => {
                let v = value()?;
                listen = Some(
                    v.parse()
                        .map_err(|e| anyhow::anyhow!("--listen {v}: {e}"))?,
                );
            }
            "--www" => www = Some(PathBuf::from(value()?)),
            "--workers" => {
                let v = value()?;
                workers = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    anyhow::anyhow!("--workers {v}: a positive number is expected")
                })?;
            }
            "--duration" => {
                let v = value()?;
                let s: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| {
                        anyhow::anyhow!("--duration {v}: positive seconds are expected")
                    })?;
                duration = Some(Duration::from_secs_f64(s));
            }
            _ => return Err(anyhow::anyhow!("{a}: unknown argument")),
        }
    }
    Ok(Args {
        listen: listen.ok_or_else(|| anyhow::anyhow!("--listen ADDR is required"))?,
        www: www.ok_or_else(|| anyhow::anyhow!("--www DIR is required"))?,
        workers,
        duration,
    })
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("h3_quinn_files: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(a) {
        eprintln!("h3_quinn_files: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> anyhow::Result<()> {
    let root = Arc::new(
        Root::open(&a.www).map_err(|e| anyhow::anyhow!("--www {}: {e}", a.www.display()))?,
    );
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])
        .map_err(|e| anyhow::anyhow!("certificate: {e}"))?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(Arc::new(fastudp_quic::transport(Duration::from_secs(30))));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.workers)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("runtime: {e}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    ctrlc::set_handler(move || {
        let _ = stop_tx.send(true);
    })
    .map_err(|e| anyhow::anyhow!("SIGINT handler: {e}"))?;
    let counts = Arc::new(Counts::default());
    rt.block_on(async {
        let ep = quinn::Endpoint::server(cfg, a.listen)
            .map_err(|e| anyhow::anyhow!("--listen {}: {e}", a.listen))?;
        let addr = ep
            .local_addr()
            .map_err(|e| anyhow::anyhow!("getsockname: {e}"))?;
        println!("listening {addr} (h3, quinn + h3-quinn)");
        let accept = {
            let (ep, counts) = (ep.clone(), counts.clone());
            async move {
                while let Some(inc) = ep.accept().await {
                    let (root, counts) = (root.clone(), counts.clone());
                    tokio::spawn(async move {
                        if let Ok(conn) = inc.await {
                            counts.connections.fetch_add(1, Relaxed);
                            connection(conn, root, counts).await;
                        }
                    });
                }
            }
        };
        let mut stop = stop_rx;
        let until = async {
            match a.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = stop.wait_for(|s| *s) => {}
            _ = until => {}
        }
        ep.close(quinn::VarInt::from_u32(0x100), b"shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_millis(200));
    println!(
        "{{\"kind\":\"served\",\"connections\":{},\"requests\":{},\"served\":{},\"failed\":{}}}",
        counts.connections.load(Relaxed),
        counts.requests.load(Relaxed),
        counts.served.load(Relaxed),
        counts.failed.load(Relaxed)
    );
    Ok(())
}

/// Serves the requests of one connection, each on a task of its own.
async fn connection(conn: quinn::Connection, root: Arc<Root>, counts: Arc<Counts>) {
    let Ok(mut h3) = h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(conn)).await
    else {
        return;
    };
    while let Ok(Some(resolver)) = h3.accept().await {
        let (root, counts) = (root.clone(), counts.clone());
        tokio::spawn(async move {
            let Ok((req, mut stream)) = resolver.resolve_request().await else {
                return;
            };
            counts.requests.fetch_add(1, Relaxed);
            let ok = respond(&req, &mut stream, &root).await.is_ok();
            if ok {
                counts.served.fetch_add(1, Relaxed);
            } else {
                counts.failed.fetch_add(1, Relaxed);
            }
        });
    }
}

/// Answers one request from the files beneath `root`.
async fn respond<S: h3::quic::BidiStream<Bytes>>(
    req: &http::Request<()>,
    stream: &mut h3::server::RequestStream<S, Bytes>,
    root: &Root,
) -> anyhow::Result<()> {
    let method = match *req.method() {
        http::Method::GET => Some(Method::Get),
        http::Method::HEAD => Some(Method::Head),
        _ => None,
    };
    let Some(method) = method else {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        stream.send_response(r).await?;
        return Ok(stream.finish().await?);
    };
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let range = req
        .headers()
        .get(http::header::RANGE)
        .map(HeaderValue::as_bytes);
    let answer = root.respond(method, target.as_bytes(), range);
    let mut head = Response::new(());
    *head.status_mut() =
        StatusCode::from_u16(answer.status.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in answer.headers() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            head.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    stream.send_response(head).await?;
    if let Some(mut body) = answer.body {
        while let Some(chunk) = body.next_chunk().map_err(|e| {
            // The promised length cannot be met: reset, as `quic serve` does.
            stream.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
            anyhow::anyhow!("{e}")
        })? {
            stream.send_data(chunk).await?;
        }
    }
    Ok(stream.finish().await?)
}
