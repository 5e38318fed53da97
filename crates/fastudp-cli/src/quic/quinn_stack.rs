//! `fastudp quic serve --stack quinn`: the same application on plain quinn
//! (tokio, quinn's own socket), the baseline fastudp's server is measured
//! against. Also the async form of the application, which the TLS-over-TCP
//! baseline shares.

use super::hq::{self, Frames, Request};
use super::stats::{baseline_run, Counters};
use super::{tls, workers, ServeArgs};
use crate::interrupt;
use anyhow::{anyhow, Context};
use fastudp_quic::transport;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reads a request line from `r` (at most [`hq::MAX_REQUEST`] bytes).
pub async fn read_request<R: AsyncRead + Unpin>(r: &mut R) -> Result<Request, hq::BadRequest> {
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    loop {
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|_| hq::BadRequest::Invalid)?;
        buf.extend_from_slice(&chunk[..n]);
        if let Some(req) = hq::parse(&buf, n == 0)? {
            return Ok(req);
        }
        if n == 0 {
            return Err(hq::BadRequest::Invalid);
        }
    }
}

/// Where a response goes, a piece of the static pattern at a time.
pub trait Sink {
    /// Writes all of `piece`.
    async fn put(&mut self, piece: &'static [u8]) -> std::io::Result<()>;
    /// Flushes what is buffered.
    async fn done(&mut self) -> std::io::Result<()>;
}

impl Sink for quinn::SendStream {
    /// The piece goes in as a reference to the static pattern, not a copy
    /// (as `quic serve` writes it).
    async fn put(&mut self, piece: &'static [u8]) -> std::io::Result<()> {
        self.write_chunk(bytes::Bytes::from_static(piece))
            .await
            .map_err(std::io::Error::from)
    }

    async fn done(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A byte stream (TLS over TCP) as a [`Sink`].
pub struct Stream<'a, W>(pub &'a mut W);

impl<W: AsyncWrite + Unpin> Sink for Stream<'_, W> {
    async fn put(&mut self, piece: &'static [u8]) -> std::io::Result<()> {
        self.0.write_all(piece).await
    }

    async fn done(&mut self) -> std::io::Result<()> {
        self.0.flush().await
    }
}

/// Writes the response to `req` on `w`; counts the bytes as they go out
/// (`wire_bytes`); its length. The caller counts it as goodput once it
/// knows it delivered.
pub async fn respond<W: Sink>(
    w: &mut W,
    req: Request,
    interval: Duration,
    counters: &Counters,
) -> std::io::Result<u64> {
    match req {
        Request::Bytes(n) => {
            let mut off = 0;
            while off < n {
                let p = piece(counters, off, n - off);
                w.put(p).await?;
                off += p.len() as u64;
            }
        }
        Request::Video { rate, seconds } => {
            let f = Frames::new(rate, seconds, interval);
            let start = tokio::time::Instant::now();
            let mut off = 0;
            for k in 0..f.count {
                tokio::time::sleep_until(start + f.interval * k as u32).await;
                let end = off + f.bytes;
                while off < end {
                    let p = piece(counters, off, end - off);
                    w.put(p).await?;
                    off += p.len() as u64;
                }
            }
        }
    }
    w.done().await?;
    Ok(match req {
        Request::Bytes(n) => n,
        Request::Video { rate, seconds } => Frames::new(rate, seconds, interval).total(),
    })
}

/// The next piece of the pattern, counted as written.
fn piece(counters: &Counters, off: u64, len: u64) -> &'static [u8] {
    let p = hq::pattern(off, len);
    counters.wire_bytes.fetch_add(p.len() as u64, Relaxed);
    p
}

/// A tokio runtime with `n` worker threads.
pub fn runtime(n: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(n)
        .enable_all()
        .build()
        .context("cannot start the runtime")
}

/// The largest UDP payload plain quinn can send in whole GSO calls: quinn
/// puts up to 10 datagrams in one, and quinn-udp drops a call the kernel
/// refuses as over 64 KiB (EMSGSIZE) as if it were an MTU probe.
const QUINN_MAX_UDP_PAYLOAD: u16 = (fastudp_quic::MAX_GSO_PAYLOAD / 10) as u16;

/// Runs `fastudp quic serve --stack quinn`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let n = workers(&a);
    let id = tls::identity(a.cert.as_deref(), a.key.as_deref())?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls::server(&id, a.zero_rtt)?)
        .map_err(|e| anyhow!("TLS set-up: {e}"))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut t = transport(std::time::Duration::from_secs_f64(a.idle_timeout));
    if let Some(n) = a.ack_every {
        fastudp_quic::ack_every(&mut t, n);
    }
    fastudp_quic::max_udp_payload(&mut t, a.max_udp_payload.min(QUINN_MAX_UDP_PAYLOAD));
    cfg.transport_config(Arc::new(t));
    let rt = runtime(n)?;
    let ep = {
        let _g = rt.enter();
        quinn::Endpoint::server(cfg, a.listen).with_context(|| format!("--listen {}", a.listen))?
    };
    let addr = ep.local_addr().context("getsockname")?;
    let counters = Arc::new(Counters::default());
    interrupt::watch();
    let interval = Duration::from_secs_f64(a.interval / 1000.0);
    let (retry, max) = (
        a.retry,
        a.max_connections.unwrap_or(super::MAX_CONNECTIONS) as u64,
    );
    {
        let (ep, counters) = (ep.clone(), counters.clone());
        rt.spawn(async move {
            while let Some(inc) = ep.accept().await {
                if counters.connections.load(Relaxed) >= max {
                    counters.refused.fetch_add(1, Relaxed);
                    inc.refuse();
                    continue;
                }
                if retry && !inc.remote_address_validated() {
                    counters.retries.fetch_add(1, Relaxed);
                    let _ = inc.retry();
                    continue;
                }
                let counters = counters.clone();
                tokio::spawn(async move {
                    let Ok(conn) = inc.await else { return };
                    counters.accepted.fetch_add(1, Relaxed);
                    counters.connections.fetch_add(1, Relaxed);
                    connection(conn, interval, &counters).await;
                    counters.connections.fetch_sub(1, Relaxed);
                });
            }
        });
    }
    let pacing = "quinn's pacer, in user space";
    let rep = baseline_run(&counters, "quinn", addr, n, &a, pacing, &id)?;
    ep.close(
        quinn::VarInt::from_u32(hq::CLOSE_SHUTDOWN),
        b"server shutting down",
    );
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(2), ep.wait_idle()).await;
    });
    rep.summary(&counters, a.json, pacing)?;
    rt.shutdown_timeout(Duration::from_millis(200));
    if interrupt::requested() {
        return Err(interrupt::summarized_err());
    }
    Ok(())
}

/// Serves one connection's streams; keeps the loss counter up to date.
async fn connection(conn: quinn::Connection, interval: Duration, counters: &Arc<Counters>) {
    let mut seen = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            s = conn.accept_bi() => {
                let Ok((mut send, mut recv)) = s else { break };
                let counters = counters.clone();
                tokio::spawn(async move {
                    match read_request(&mut recv).await {
                        Ok(req) => {
                            // The FIN after the request line is read, not
                            // pre-empted by a STOP_SENDING that would race
                            // it (quic-go's client fails the request then);
                            // bytes past the line are refused.
                            tokio::spawn(async move {
                                if recv.read_to_end(0).await.is_err() {
                                    let _ = recv.stop(quinn::VarInt::from_u32(0));
                                }
                            });
                            if let Ok(len) = respond(&mut send, req, interval, &counters).await {
                                let _ = send.finish();
                                // Ok(None): the client acknowledged it all.
                                if let Ok(None) = send.stopped().await {
                                    counters.app_bytes.fetch_add(len, Relaxed);
                                }
                            }
                        }
                        Err(bad) => {
                            let code = quinn::VarInt::from_u32(bad.code());
                            let _ = send.reset(code);
                            let _ = recv.stop(code);
                        }
                    }
                });
            }
            _ = tick.tick() => {
                let l = conn.stats().path.lost_packets;
                counters.lost_packets.fetch_add(l.saturating_sub(seen), Relaxed);
                seen = l;
            }
        }
    }
    let l = conn.stats().path.lost_packets;
    counters
        .lost_packets
        .fetch_add(l.saturating_sub(seen), Relaxed);
}
