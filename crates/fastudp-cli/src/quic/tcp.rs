//! `fastudp quic serve --stack tls-tcp`: the same requests and bytes over
//! TLS 1.3 on TCP (rustls), the paper's TCP reference. One request per
//! connection: the client sends `GET /PATH\r\n`, the server answers and
//! closes.

use super::quinn_stack::{read_request, respond, runtime, Stream};
use super::stats::{baseline_run, Counters};
use super::{tls, workers, ServeArgs};
use crate::interrupt;
use anyhow::Context;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// TCP segments retransmitted in this network namespace so far
/// (`RetransSegs` of /proc/net/snmp).
pub fn retrans_segs() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = s.lines().filter(|l| l.starts_with("Tcp:"));
    let names = tcp.next()?.split_whitespace();
    let values = tcp.next()?.split_whitespace();
    names
        .zip(values)
        .find(|(n, _)| *n == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
}

/// Runs `fastudp quic serve --stack tls-tcp`.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let n = workers(&a);
    let id = tls::identity(a.cert.as_deref(), a.key.as_deref())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server(&id, false)?));
    let rt = runtime(n)?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(a.listen))
        .with_context(|| format!("--listen {}", a.listen))?;
    let addr = listener.local_addr().context("getsockname")?;
    let counters = Arc::new(Counters::default());
    interrupt::watch();
    let interval = Duration::from_secs_f64(a.interval / 1000.0);
    let max = a.max_connections.unwrap_or(super::MAX_CONNECTIONS) as u64;
    let retrans0 = retrans_segs();
    {
        let counters = counters.clone();
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                if counters.connections.load(Relaxed) >= max {
                    counters.refused.fetch_add(1, Relaxed);
                    continue;
                }
                let _ = tcp.set_nodelay(true);
                let (acceptor, counters) = (acceptor.clone(), counters.clone());
                tokio::spawn(async move {
                    counters.connections.fetch_add(1, Relaxed);
                    if let Ok(mut s) = acceptor.accept(tcp).await {
                        counters.accepted.fetch_add(1, Relaxed);
                        if let Ok(req) = read_request(&mut s).await {
                            if let Ok(len) =
                                respond(&mut Stream(&mut s), req, interval, &counters).await
                            {
                                // Taken whole by the kernel (TCP delivers it
                                // or the connection fails).
                                if s.shutdown().await.is_ok() {
                                    counters.app_bytes.fetch_add(len, Relaxed);
                                }
                            }
                        }
                    }
                    counters.connections.fetch_sub(1, Relaxed);
                });
            }
        });
    }
    {
        // Retransmissions: the namespace's TCP counter, once a second.
        let counters = counters.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                if let (Some(a), Some(b)) = (retrans0, retrans_segs()) {
                    counters.lost_packets.store(b.saturating_sub(a), Relaxed);
                }
            }
        });
    }
    let pacing = "none (TCP: the kernel's congestion control and qdisc)";
    let rep = baseline_run(&counters, "tls-tcp", addr, n, &a, pacing, &id)?;
    if let (Some(a), Some(b)) = (retrans0, retrans_segs()) {
        counters.lost_packets.store(b.saturating_sub(a), Relaxed);
    }
    rep.summary(&counters, a.json, pacing)?;
    rt.shutdown_timeout(Duration::from_millis(200));
    if interrupt::requested() {
        return Err(interrupt::summarized_err());
    }
    Ok(())
}
