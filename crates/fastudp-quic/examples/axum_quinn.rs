//! The axum example's `Router` (`examples/axum.rs`, the same module,
//! compiled in) served over HTTP/3 on quinn + h3-quinn instead of the
//! engine: the baseline of the application comparison in
//! docs/BENCHMARKS.md (scripts/app-bench.sh).
//!
//! ```text
//! cargo run --release -p fastudp-quic --example axum_quinn -- --listen 127.0.0.1:4434
//!     [--cert C --key K] [--duration S] [--stream-window BYTES]
//! ```
//!
//! One tokio current-thread runtime (one core, as one engine worker), a
//! task per connection and per request, as h3's `examples/server.rs`
//! does; quinn's transport is the engine's default
//! (`fastudp_quic::transport`), with `--stream-window` the same stream and
//! connection windows as the axum example's engine with that option. Each request's body is the request
//! stream's DATA read as it comes (`recv_data`), and the response body is
//! sent frame by frame, with a `content-length` when the body's size is
//! exact (as the engine's service adapter does). Without `--duration` it
//! serves until killed.

#[path = "axum.rs"]
#[allow(dead_code)]
mod app;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tower_service::Service;

/// What to serve.
struct Args {
    listen: SocketAddr,
    cert: Option<(PathBuf, PathBuf)>,
    duration: Option<Duration>,
    stream_window: Option<u32>,
}

fn args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut listen = None;
    let (mut cert, mut key) = (None, None);
    let mut duration = None;
    let mut stream_window = None;
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--listen" => listen = Some(val()?.parse().map_err(|e| format!("--listen: {e}"))?),
            "--cert" => cert = Some(PathBuf::from(val()?)),
            "--key" => key = Some(PathBuf::from(val()?)),
            "--duration" => {
                let v = val()?;
                let s = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
                    .ok_or(format!("--duration {v}: positive seconds"))?;
                duration = Some(Duration::from_secs_f64(s));
            }
            "--stream-window" => {
                stream_window = Some(
                    val()?
                        .parse()
                        .map_err(|e| format!("--stream-window: {e}"))?,
                )
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err("--cert and --key go together".into()),
    };
    Ok(Args {
        listen: listen.unwrap_or_else(|| "127.0.0.1:4434".parse().expect("an address")),
        cert,
        duration,
        stream_window,
    })
}

fn main() {
    let a = match args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "axum_quinn: {e}\nusage: axum_quinn --listen ADDR [--cert C --key K] [--duration S] [--stream-window BYTES]"
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = run(a) {
        eprintln!("axum_quinn: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> anyhow::Result<()> {
    let (chain, key) = app::identity(&a.cert)?;
    let mut tls = app::tls(chain, key, &[b"h3"])?;
    // quinn takes 0-RTT data only as all or nothing.
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut t = fastudp_quic::transport(Duration::from_secs(30));
    if let Some(w) = a.stream_window {
        let engine = app::transport(Some(w));
        engine.check(Duration::from_secs(30))?;
        t.stream_receive_window(quinn::VarInt::from_u32(w));
        t.receive_window(quinn::VarInt::from_u64(engine.receive_window())?);
    }
    cfg.transport_config(Arc::new(t));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let ep = quinn::Endpoint::server(cfg, a.listen)?;
        println!("HTTP/3 on udp {} (quinn + h3-quinn)", ep.local_addr()?);
        let router = app::router();
        let accept = async {
            while let Some(inc) = ep.accept().await {
                let router = router.clone();
                tokio::spawn(async move {
                    if let Ok(conn) = inc.await {
                        connection(conn, router).await;
                    }
                });
            }
        };
        let until = async {
            match a.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = accept => {}
            () = until => {}
        }
        // H3_NO_ERROR.
        ep.close(quinn::VarInt::from_u32(0x100), b"shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
        anyhow::Ok(())
    })
}

/// One connection: a task per request.
async fn connection(conn: quinn::Connection, router: axum::Router) {
    let Ok(mut h3) = h3::server::Connection::<_, Bytes>::new(h3_quinn::Connection::new(conn)).await
    else {
        return;
    };
    while let Ok(Some(resolver)) = h3.accept().await {
        let router = router.clone();
        tokio::spawn(async move {
            if let Ok((req, stream)) = resolver.resolve_request().await {
                let _ = request(req, stream, router).await;
            }
        });
    }
}

/// One request through the `Router`: its body read from the stream as it
/// comes, the answer's body sent frame by frame.
async fn request<S>(
    req: http::Request<()>,
    stream: h3::server::RequestStream<S, Bytes>,
    mut router: axum::Router,
) -> anyhow::Result<()>
where
    S: h3::quic::BidiStream<Bytes> + Send + 'static,
    S::RecvStream: Send + 'static,
    S::SendStream: Send + 'static,
{
    let (mut send, recv) = stream.split();
    // The request body: DATA frames until the stream ends; after an error
    // the body ends.
    let frames = futures_util::stream::unfold(Some(recv), |r| async move {
        let mut r = r?;
        match r.recv_data().await {
            Ok(Some(mut b)) => Some((
                Ok(http_body::Frame::data(b.copy_to_bytes(b.remaining()))),
                Some(r),
            )),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    });
    let (parts, ()) = req.into_parts();
    let req = http::Request::from_parts(
        parts,
        axum::body::Body::new(http_body_util::StreamBody::new(frames)),
    );
    type Req = http::Request<axum::body::Body>;
    std::future::poll_fn(|cx| Service::<Req>::poll_ready(&mut router, cx)).await?;
    let resp = Service::<Req>::call(&mut router, req).await?;
    let (mut head, mut body) = resp.into_parts();
    if !head.headers.contains_key(http::header::CONTENT_LENGTH) {
        if let Some(n) = http_body::Body::size_hint(&body).exact() {
            head.headers
                .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(n));
        }
    }
    send.send_response(http::Response::from_parts(head, ()))
        .await?;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        match frame.into_data() {
            Ok(data) => send.send_data(data).await?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers).await?;
                }
            }
        }
    }
    send.finish().await?;
    Ok(())
}
