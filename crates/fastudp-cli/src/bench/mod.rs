//! `fastudp bench`: every UDP send and receive strategy side by side.

mod report;
mod rx;
mod tx;

use crate::procfs;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How datagrams are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TxStrategy {
    /// One datagram per sendto call.
    Sendto,
    /// One datagram per message, `--batch` messages per sendmmsg call.
    Sendmmsg,
    /// The UDP_SEGMENT socket option and one big buffer per sendto (the
    /// seed's "merge sendto").
    GsoSockopt,
    /// A scatter-gather iovec of datagrams per sendmsg, with the socket
    /// option set (the seed's "without segment").
    GsoIov,
    /// The same, with the UDP_SEGMENT cmsg instead of the option.
    GsoIovCmsg,
    /// One buffer with the UDP_SEGMENT cmsg per sendmsg (the seed's "merge
    /// sendmsg").
    GsoCmsg,
    /// Several GSO super-buffers, each with its cmsg, per sendmmsg call.
    SendmmsgGso,
    /// The seed's "sendmmsg + GSO": one datagram per message, each with a
    /// UDP_SEGMENT cmsg larger than the datagram, so nothing is segmented.
    SendmmsgGsoSeed,
    /// The fastudp library's own path: `Socket::send` of GSO trains.
    Fastudp,
    /// A TCP stream of the same bytes.
    Tcp,
}

/// How datagrams are received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RxStrategy {
    /// One datagram per recvfrom call.
    Recvfrom,
    /// `--batch` datagrams per recvmmsg call.
    Recvmmsg,
    /// UDP GRO, one coalesced message per recvmsg call.
    Gro,
    /// UDP GRO and recvmmsg.
    GroRecvmmsg,
}

/// Options of `fastudp bench`.
#[derive(Args, Debug, Clone)]
#[command(after_help = report::COLUMNS_HELP)]
pub struct BenchArgs {
    /// Seconds per strategy.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    pub duration: f64,
    /// Datagram payload in bytes (1..=65507; 65527 with --ipv6).
    #[arg(long, default_value_t = 1216)]
    pub payload: usize,
    /// Datagrams per call (per GSO buffer, per sendmmsg/recvmmsg).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Use ::1 instead of 127.0.0.1.
    #[arg(long)]
    pub ipv6: bool,
    /// Send strategies to run (comma-separated); each runs into the best
    /// receiver. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub tx: Vec<TxStrategy>,
    /// Receive strategies to run (comma-separated); each runs against the
    /// best sender. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub rx: Vec<RxStrategy>,
    /// Run every pairing N times and report the median by throughput.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// No per-second lines.
    #[arg(long, short)]
    pub quiet: bool,
    /// Print JSON (see the README for the schema) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The workload one pairing runs.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub payload: usize,
    pub batch: usize,
    pub duration: Duration,
    pub ipv6: bool,
    /// Datagrams per GSO buffer: the batch, cut to the kernel's segment and
    /// byte limits.
    pub segs: usize,
}

/// Counters the threads share while running.
#[derive(Debug, Default)]
pub struct Live {
    pub tx_calls: AtomicU64,
    pub tx_datagrams: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_datagrams: AtomicU64,
    pub rx_calls: AtomicU64,
    pub sender_done: AtomicBool,
}

/// What the sender reports at the end.
#[derive(Debug, Default, Clone, Copy)]
pub struct TxOutcome {
    pub datagrams: u64,
    pub bytes: u64,
    pub calls: u64,
    pub cpu: Duration,
    pub seconds: f64,
}

/// What the receiver reports at the end.
#[derive(Debug, Default, Clone, Copy)]
pub struct RxOutcome {
    pub datagrams: u64,
    pub bytes: u64,
    pub calls: u64,
    pub cpu: Duration,
    pub kernel_drops: u64,
}

/// One measured pairing.
#[derive(Debug, Clone, Serialize)]
pub struct Result {
    pub tx: TxStrategy,
    /// The receive strategy, or "tcp" for the TCP baseline.
    pub rx: String,
    pub bytes: u64,
    pub datagrams: u64,
    pub seconds: f64,
    pub mbytes_per_sec: f64,
    pub gbps: f64,
    pub datagrams_per_sec: f64,
    pub tx_calls_per_sec: f64,
    pub bytes_per_call: f64,
    pub rx_calls_per_sec: f64,
    pub tx_cpu_ns_per_byte: f64,
    pub rx_cpu_ns_per_byte: f64,
    pub softirq_ns_per_byte: f64,
    pub sent: u64,
    pub lost: u64,
    pub kernel_drops: u64,
    pub speedup_vs_sendto: Option<f64>,
}

fn validate(a: &BenchArgs) -> std::result::Result<Workload, String> {
    let max = if a.ipv6 {
        fastudp::wire::MAX_PAYLOAD_V6
    } else {
        fastudp::wire::MAX_PAYLOAD_V4
    };
    if a.payload == 0 || a.payload > max {
        return Err(format!(
            "--payload {} is out of range: a UDP payload is 1 to {max} bytes",
            a.payload
        ));
    }
    if a.batch == 0 || a.batch > fastudp::os::MAX_BATCH {
        return Err(format!(
            "--batch {} is out of range: 1 to {}",
            a.batch,
            fastudp::os::MAX_BATCH
        ));
    }
    if !(a.duration > 0.0 && a.duration <= 3600.0) {
        return Err(format!(
            "--duration {} is out of range: more than 0 and at most 3600 seconds",
            a.duration
        ));
    }
    if a.repeat == 0 || a.repeat > 100 {
        return Err(format!("--repeat {} is out of range: 1 to 100", a.repeat));
    }
    let kmax = fastudp::caps::kernel_max_segments().max(1);
    let segs = a.batch.min(max / a.payload).min(kmax).max(1);
    Ok(Workload {
        payload: a.payload,
        batch: a.batch,
        duration: Duration::from_secs_f64(a.duration),
        ipv6: a.ipv6,
        segs,
    })
}

/// Runs `fastudp bench`.
pub fn run(a: BenchArgs) -> std::result::Result<(), String> {
    let w = validate(&a)?;
    let all_tx = TxStrategy::value_variants().to_vec();
    let all_rx = RxStrategy::value_variants().to_vec();
    let (txs, rxs) = match (a.tx.is_empty(), a.rx.is_empty()) {
        (true, true) => (all_tx, all_rx),
        (false, true) => (a.tx.clone(), vec![]),
        (true, false) => (vec![], a.rx.clone()),
        (false, false) => (a.tx.clone(), a.rx.clone()),
    };
    let best_rx = RxStrategy::GroRecvmmsg;
    let best_tx = TxStrategy::Fastudp;
    let mut pairs: Vec<(TxStrategy, RxStrategy)> = Vec::new();
    if !a.tx.is_empty() && !a.rx.is_empty() {
        for &t in &txs {
            for &r in &rxs {
                pairs.push((t, r));
            }
        }
    } else {
        pairs.extend(txs.iter().map(|&t| (t, best_rx)));
        pairs.extend(
            rxs.iter()
                .filter(|&&r| r != best_rx || txs.is_empty())
                .map(|&r| (best_tx, r)),
        );
        // The receive comparison needs its baseline against the same sender.
        if !rxs.is_empty() && !pairs.contains(&(best_tx, RxStrategy::Recvfrom)) {
            pairs.push((best_tx, RxStrategy::Recvfrom));
        }
    }
    let host = report::host_info();
    if !a.json {
        println!(
            "fastudp bench: {} on {}, payload {} B, batch {}, {} datagrams per GSO buffer, {:.1} s per run",
            host.kernel, if w.ipv6 { "::1" } else { "127.0.0.1" }, w.payload, w.batch, w.segs, a.duration
        );
    }
    let mut results = Vec::new();
    for &(t, r) in &pairs {
        let mut runs = Vec::new();
        for _ in 0..a.repeat {
            runs.push(run_pair(t, r, &w, a.quiet || a.json)?);
        }
        runs.sort_by_key(|r| r.bytes);
        results.push(runs.swap_remove(runs.len() / 2));
    }
    if let Some(base) = results
        .iter()
        .find(|r| r.tx == TxStrategy::Sendto)
        .map(|r| r.mbytes_per_sec)
    {
        for r in &mut results {
            r.speedup_vs_sendto = Some(r.mbytes_per_sec / base);
        }
    }
    if a.json {
        let doc = serde_json::json!({ "schema": 1, "host": host, "workload": {
            "payload": w.payload, "batch": w.batch, "gso_segments": w.segs,
            "duration": a.duration, "ipv6": w.ipv6, "repeat": a.repeat }, "results": results });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
        );
    } else {
        report::print_table(&results);
    }
    Ok(())
}

fn loopback(ipv6: bool) -> SocketAddr {
    if ipv6 {
        "[::1]:0".parse().expect("literal")
    } else {
        "127.0.0.1:0".parse().expect("literal")
    }
}

fn pin(cpu: usize) {
    if std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        >= 2
    {
        let _ = fastudp::os::pin_to_cpu(cpu);
    }
}

/// Runs one sender/receiver pairing and measures it.
fn run_pair(
    t: TxStrategy,
    r: RxStrategy,
    w: &Workload,
    quiet: bool,
) -> std::result::Result<Result, String> {
    let live = Arc::new(Live::default());
    let drops_before = procfs::rcvbuf_errors();
    let soft_before = procfs::softirq_ns();
    let (rx_handle, dest) = if t == TxStrategy::Tcp {
        let l = TcpListener::bind(loopback(w.ipv6)).map_err(|e| format!("TCP listen: {e}"))?;
        let dest = l.local_addr().map_err(|e| e.to_string())?;
        let live2 = live.clone();
        let w2 = *w;
        let h = std::thread::spawn(move || {
            pin(1);
            rx::tcp(l, &w2, &live2)
        });
        (h, dest)
    } else {
        let sock = rx::bind(r, w)?;
        let dest = sock.local_addr().map_err(|e| e.to_string())?;
        let live2 = live.clone();
        let w2 = *w;
        let h = std::thread::spawn(move || {
            pin(1);
            rx::udp(r, sock, &w2, &live2)
        });
        (h, dest)
    };
    let live3 = live.clone();
    let w3 = *w;
    let tx_handle = std::thread::spawn(move || {
        pin(0);
        let out = if t == TxStrategy::Tcp {
            TcpStream::connect(dest)
                .map_err(|e| format!("TCP connect to {dest}: {e}"))
                .and_then(|s| tx::tcp(s, &w3, &live3))
        } else {
            tx::udp(t, dest, &w3, &live3)
        };
        live3.sender_done.store(true, Release);
        out
    });
    let start = Instant::now();
    let mut last = (0u64, 0u64, 0u64);
    let mut tick = 1u32;
    let label = if t == TxStrategy::Tcp {
        "tcp".to_string()
    } else {
        format!("{}->{}", name(t), rname(r))
    };
    while !tx_handle.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if start.elapsed() >= Duration::from_secs(tick as u64) {
            let now = (
                live.rx_bytes.load(Relaxed),
                live.rx_datagrams.load(Relaxed),
                live.tx_calls.load(Relaxed),
            );
            if !quiet {
                report::print_interval(
                    &label,
                    tick,
                    now.0 - last.0,
                    now.1 - last.1,
                    now.2 - last.2,
                );
            }
            last = now;
            tick += 1;
        }
    }
    let txo = tx_handle
        .join()
        .map_err(|_| "sender thread panicked".to_string())??;
    let rxo = rx_handle
        .join()
        .map_err(|_| "receiver thread panicked".to_string())??;
    let soft = match (soft_before, procfs::softirq_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let drops = procfs::rcvbuf_errors()
        .saturating_sub(drops_before)
        .max(rxo.kernel_drops);
    let secs = txo.seconds.max(1e-9);
    let per_byte = |d: f64| {
        if rxo.bytes > 0 {
            d / rxo.bytes as f64
        } else {
            0.0
        }
    };
    Ok(Result {
        tx: t,
        rx: if t == TxStrategy::Tcp {
            "tcp".into()
        } else {
            rname(r)
        },
        bytes: rxo.bytes,
        datagrams: rxo.datagrams,
        seconds: secs,
        mbytes_per_sec: rxo.bytes as f64 / secs / 1e6,
        gbps: rxo.bytes as f64 * 8.0 / secs / 1e9,
        datagrams_per_sec: rxo.datagrams as f64 / secs,
        tx_calls_per_sec: txo.calls as f64 / secs,
        bytes_per_call: if txo.calls > 0 {
            txo.bytes as f64 / txo.calls as f64
        } else {
            0.0
        },
        rx_calls_per_sec: rxo.calls as f64 / secs,
        tx_cpu_ns_per_byte: per_byte(txo.cpu.as_nanos() as f64),
        rx_cpu_ns_per_byte: per_byte(rxo.cpu.as_nanos() as f64),
        softirq_ns_per_byte: per_byte(soft as f64),
        sent: txo.datagrams,
        lost: txo.datagrams.saturating_sub(rxo.datagrams),
        kernel_drops: drops,
        speedup_vs_sendto: None,
    })
}

/// The command-line name of a send strategy.
pub fn name(t: TxStrategy) -> String {
    t.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// The command-line name of a receive strategy.
pub fn rname(r: RxStrategy) -> String {
    r.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn args(s: &[&str]) -> BenchArgs {
        let mut v = vec!["t"];
        v.extend_from_slice(s);
        T::try_parse_from(v).unwrap().a
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for (a, needle) in [
            (vec!["--payload", "0"], "--payload 0"),
            (vec!["--payload", "65508"], "65507"),
            (vec!["--batch", "0"], "--batch 0"),
            (vec!["--duration", "0"], "--duration"),
            (vec!["--repeat", "0"], "--repeat"),
        ] {
            let e = validate(&args(&a)).unwrap_err();
            assert!(e.contains(needle), "{a:?}: {e}");
        }
        assert!(validate(&args(&["--payload", "65527", "--ipv6"])).is_ok());
    }

    #[test]
    fn segments_per_buffer_respect_the_byte_limit() {
        let w = validate(&args(&["--payload", "1216", "--batch", "64"])).unwrap();
        assert_eq!(w.segs, 53); // 53 * 1216 = 64448 <= 65507
        let w = validate(&args(&["--payload", "1216"])).unwrap();
        assert_eq!(w.segs, 32);
    }

    #[test]
    fn unknown_strategy_is_a_parse_error() {
        assert!(T::try_parse_from(["t", "--tx", "sendfoo"]).is_err());
        assert_eq!(
            args(&["--tx", "gso-cmsg,sendto"]).tx,
            vec![TxStrategy::GsoCmsg, TxStrategy::Sendto]
        );
    }
}
