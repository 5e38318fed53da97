//! `fastudp stream` and `fastudp stream-rx`: the paper's many-flow paced
//! streaming workload, and its receiving side.
//!
//! Each datagram carries a 16-byte header: the flow id (4 bytes,
//! big-endian, at offset 0: the receivers' reuseport group steers on it),
//! the flow's sequence number (8 bytes, little-endian), and the pacing mode.

mod flows;

use crate::host::{netlink, routes};
use crate::procfs::{CpuTicks, STEAL_WARN};
use crate::{interrupt, Failure};
use clap::{Args, ValueEnum};
use fastudp::pacing::{
    choose_mode, PacingMode, Scheduler, SchedulerConfig, Waiter, DEFAULT_BATCH_BYTES,
    DEFAULT_SLACK, MAX_TRAINS_PER_BATCH,
};
use fastudp::{Config, RecvBatch, ReuseportGroup, Socket, Steering, Transmit};
use flows::{percentile, RxOut, Tally};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the stream header: flow id (4, big-endian), sequence number (8,
/// little-endian), pacing mode (1), and [`MAGIC`] (3).
pub const HDR: usize = 16;

/// The last 3 header bytes, so that `stream-rx` can tell the stream's
/// datagrams from anything else sent to its ports.
pub const MAGIC: &[u8; 3] = b"FUs";

/// `--pacing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PacingArg {
    /// SO_TXTIME departure times, honoured by an fq/etf qdisc (falls back
    /// to user space, and says so, where the qdisc ignores them).
    Kernel,
    /// fastudp waits until each train's departure time.
    User,
    /// Every flow sends its interval's budget at the same instant.
    None,
}

/// Parses a rate such as `125000`, `125k`, `1M` or `1.5M` (bytes per second).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate in bytes per second (like 125000, 125k, 1M)"))?;
    let r = v * mult;
    if !(r.is_finite() && (1.0..=1e12).contains(&r)) {
        return Err(format!("{s:?}: a rate must be 1 byte/s to 1 TB/s"));
    }
    Ok(r as u64)
}

/// Options of `fastudp stream`.
#[derive(Args, Debug, Clone)]
pub struct StreamArgs {
    /// Where the receivers (`fastudp stream-rx`) listen.
    #[arg(long, default_value = "127.0.0.1")]
    pub dest: IpAddr,
    /// Their first port.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// How many ports the flows are spread over (flow i goes to port + i % ports).
    #[arg(long, default_value_t = 1)]
    pub ports: u16,
    /// Number of flows.
    #[arg(long, default_value_t = 10_000)]
    pub flows: usize,
    /// Rate per flow, bytes per second (k, M, G multiply by 1000).
    #[arg(long, default_value = "20k", value_parser = parse_rate)]
    pub rate: u64,
    /// Pacing interval in ms: each flow sends at most one train per interval.
    #[arg(long, default_value_t = 8.0, allow_negative_numbers = true)]
    pub interval: f64,
    /// Most GSO segments per flow per interval.
    #[arg(long, default_value_t = 16)]
    pub max_burst: usize,
    /// Who enforces departure times.
    #[arg(long, value_enum, default_value_t = PacingArg::User)]
    pub pacing: PacingArg,
    /// With user-space pacing, the most all flows together may send, bytes
    /// per second: set it just under the bottleneck's rate (default: flows
    /// x rate + 10%).
    #[arg(long, value_parser = parse_rate)]
    pub total_rate: Option<u64>,
    /// Send trains with MSG_ZEROCOPY (adaptive: falls back to copying
    /// where the kernel copies anyway).
    #[arg(long)]
    pub zerocopy: bool,
    /// Unconnected send sockets to spread the flows over.
    #[arg(long, default_value_t = 1)]
    pub sockets: usize,
    /// Datagram payload in bytes.
    #[arg(long, default_value_t = 1200)]
    pub payload: usize,
    /// Seconds to stream.
    #[arg(long, default_value_t = 5.0, allow_negative_numbers = true)]
    pub duration: f64,
    /// No per-second lines.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options of `fastudp stream-rx`.
#[derive(Args, Debug, Clone)]
pub struct StreamRxArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// First port.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// Number of ports.
    #[arg(long, default_value_t = 1)]
    pub ports: u16,
    /// Sockets per port, in a reuseport group steered by flow id.
    #[arg(long, default_value_t = 2)]
    pub sockets: usize,
    /// The flows expected: flow ids 0 to this minus 1 are tracked (any
    /// other id is counted as foreign), and the within-5% fraction is of
    /// this many.
    #[arg(long, default_value_t = 10_000)]
    pub flows: usize,
    /// The target rate per flow, bytes per second.
    #[arg(long, default_value = "20k", value_parser = parse_rate)]
    pub rate: u64,
    /// Seconds to measure after the first datagram (default: until the
    /// stream has been silent for --idle seconds).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Seconds of silence that end the run.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub idle: f64,
    /// Seconds to wait for the first datagram.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pub wait: f64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write one line per flow to this CSV file: flow, bytes,
    /// datagrams, rate (bytes/s), lost, longest back-to-back run.
    #[arg(long, value_name = "FILE.csv")]
    pub per_flow: Option<String>,
}

fn open_files_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let l = s.lines().find(|l| l.starts_with("Max open files"))?;
    l.split_whitespace().nth(3)?.parse().ok()
}

fn check_common(flows: usize, port: u16, ports: u16, sockets: usize) -> Result<(), Failure> {
    if port == 0 {
        return Err(Failure::usage(
            "--port 0: give the first port, 1 to 65535".into(),
        ));
    }
    if ports > 0 && port as u32 + ports as u32 - 1 > 65_535 {
        return Err(Failure::usage(format!(
            "--port {port} --ports {ports} runs past port 65535: lower --port or --ports"
        )));
    }
    if flows == 0 {
        return Err(Failure::usage(
            "--flows 0: there must be at least one flow".into(),
        ));
    }
    if ports == 0 {
        return Err(Failure::usage(
            "--ports 0: there must be at least one port".into(),
        ));
    }
    if sockets == 0 {
        return Err(Failure::usage(
            "--sockets 0: there must be at least one socket".into(),
        ));
    }
    let per_port = flows.div_ceil(ports as usize);
    if per_port > 65_535 {
        return Err(Failure::usage(format!(
            "{flows} flows over {ports} ports is {per_port} per port; at most 65535: add --ports"
        )));
    }
    let fds = sockets * ports as usize;
    if let Some(max) = open_files_limit() {
        if fds as u64 + 64 > max {
            return Err(Failure::usage(format!(
                "{fds} sockets need more file descriptors than this process may open ({max}): raise `ulimit -n` or use fewer sockets"
            )));
        }
    }
    Ok(())
}

/// The summary of a stream run, either side.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    /// `stream` or `stream-rx`.
    pub role: &'static str,
    /// Flows seen (rx) or sent (tx).
    pub flows: usize,
    /// Fraction of the flows within 5% of their target rate.
    pub flows_within_5pct: f64,
    /// The pacing mode in force.
    pub pacing: String,
    /// Why that mode.
    pub pacing_reason: String,
    /// Aggregate rate, Gbit/s.
    pub gbps: f64,
    /// Sending or receiving thread CPU ns per byte.
    pub cpu_ns_per_byte: f64,
    /// CPU seconds per Gbit/s of stream.
    pub cpu_sec_per_gbit: f64,
    /// Send or receive calls per second.
    pub calls_per_sec: f64,
    /// The share of the flows' datagrams that never arrived, from their
    /// sequence numbers (rx; null on tx).
    pub loss: Option<f64>,
    /// Datagrams of a flow that arrived twice (rx).
    pub duplicates: Option<u64>,
    /// Datagrams of a flow that arrived after a later one (rx).
    pub reordered: Option<u64>,
    /// Inter-arrival gaps within a flow, µs (upper bound of a power-of-two
    /// bucket): p50 (rx).
    pub gap_us_p50: Option<f64>,
    /// p90 gap.
    pub gap_us_p90: Option<f64>,
    /// p99 gap.
    pub gap_us_p99: Option<f64>,
    /// Longest run of a flow's datagrams arriving back to back (rx).
    pub max_back_to_back: Option<u64>,
    /// Datagrams counted for no flow (rx): without the stream's header,
    /// with a flow id outside `0..--flows`, or with a sequence number far
    /// off their flow's. Counted only: they keep no state.
    pub foreign: Option<u64>,
    /// Of `foreign`, those with the header and a flow id outside
    /// `0..--flows` (rx).
    pub out_of_range: Option<u64>,
    /// The fraction of all CPU time the hypervisor took from this VM
    /// during the run (steal, from /proc/stat): above a few percent, the
    /// threads stall for milliseconds and pacing and rates suffer.
    pub host_steal: Option<f64>,
    /// Seconds measured.
    pub seconds: f64,
    /// Bytes.
    pub bytes: u64,
    /// Ctrl-C ended the run: the figures cover it until then.
    pub interrupted: bool,
}

fn print(s: &StreamSummary, json: bool) -> Result<(), Failure> {
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(s).map_err(|e| Failure::usage(e.to_string()))?
        );
        return Ok(());
    }
    outln!(
        "{}: {} flows, {:.3} Gbit/s in {:.1} s, {:.1}% of flows within 5% of their rate, pacing {} ({}), {:.3} CPU ns/B, {:.0} calls/s",
        s.role,
        s.flows,
        s.gbps,
        s.seconds,
        s.flows_within_5pct * 100.0,
        s.pacing,
        s.pacing_reason,
        s.cpu_ns_per_byte,
        s.calls_per_sec
    );
    if let Some(st) = s.host_steal.filter(|&st| st > 0.0) {
        outln!("host steal {:.1}% of CPU time", st * 100.0);
    }
    if let Some(l) = s.loss {
        outln!(
            "loss {:.3}%, {} duplicate, {} reordered, gaps within a flow p50 <= {:.0} us, p90 <= {:.0} us, p99 <= {:.0} us, longest back-to-back burst {}",
            l * 100.0,
            s.duplicates.unwrap_or(0),
            s.reordered.unwrap_or(0),
            s.gap_us_p50.unwrap_or(0.0),
            s.gap_us_p90.unwrap_or(0.0),
            s.gap_us_p99.unwrap_or(0.0),
            s.max_back_to_back.unwrap_or(0)
        );
    }
    if s.interrupted {
        outln!(
            "{}: interrupted (Ctrl-C) after {:.2} s: the figures above cover the run until then",
            s.role,
            s.seconds
        );
    }
    Ok(())
}

/// Prints the summary, then ends with status 130 if Ctrl-C cut the run short.
fn finish(s: &StreamSummary, json: bool) -> Result<(), Failure> {
    print(s, json)?;
    if s.interrupted {
        return Err(interrupt::failure(
            "the summary above covers the run until then",
        ));
    }
    Ok(())
}

/// A rate in bytes per second as bits per second, in a readable unit.
fn bits_per_sec(bytes: u64) -> String {
    let b = bytes as f64 * 8.0;
    match b {
        b if b >= 1e9 => format!("{:.2} Gbit/s", b / 1e9),
        b if b >= 1e6 => format!("{:.1} Mbit/s", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kbit/s", b / 1e3),
        b => format!("{b:.0} bit/s"),
    }
}

/// The steal fraction since `ticks0`, with a warning on stderr when it is
/// high enough to spoil the run's timings.
fn steal_since(ticks0: Option<CpuTicks>) -> Option<f64> {
    let steal = CpuTicks::now()?.steal_since(&ticks0?)?;
    if steal > STEAL_WARN {
        eprintln!(
            "fastudp: warning: the hypervisor took {:.0}% of this VM's CPU time during the run (steal); threads stalled and the timings are unreliable",
            steal * 100.0
        );
    }
    Some(steal)
}

fn mode_byte(m: PacingMode) -> u8 {
    match m {
        PacingMode::Kernel => 1,
        PacingMode::User => 2,
        PacingMode::None => 3,
    }
}

fn mode_name(b: u8) -> &'static str {
    match b {
        1 => "kernel",
        2 => "user",
        3 => "none",
        _ => "unknown",
    }
}

/// Runs `fastudp stream`.
pub fn run_stream(a: StreamArgs) -> Result<(), Failure> {
    check_common(a.flows, a.port, a.ports, a.sockets)?;
    if !(a.interval > 0.0 && a.interval <= 1000.0) {
        return Err(Failure::usage(format!(
            "--interval {} ms is out of range: more than 0, at most 1000",
            a.interval
        )));
    }
    if !(a.duration >= 0.01 && a.duration <= 86_400.0) {
        return Err(Failure::usage(format!(
            "--duration {} is out of range: 0.01 to 86400 seconds",
            a.duration
        )));
    }
    let max = fastudp::wire::max_payload(a.dest.is_ipv6());
    if a.payload < HDR || a.payload > 1472 {
        return Err(Failure::usage(format!(
            "--payload {} is out of range: {HDR} to 1472 bytes (one MTU-sized segment)",
            a.payload
        )));
    }
    if a.max_burst == 0 || a.max_burst * a.payload > max {
        return Err(Failure::usage(format!(
            "--max-burst {} is out of range: 1 to {}",
            a.max_burst,
            max / a.payload
        )));
    }
    let sum = a.rate as u128 * a.flows as u128;
    if let Some(t) = a.total_rate.filter(|&t| (t as u128) < sum) {
        return Err(Failure::usage(format!(
            "--total-rate {t} is below --flows x --rate = {sum} bytes/s: the flows could not reach their rate"
        )));
    }
    let interval = Duration::from_secs_f64(a.interval / 1000.0);
    let wanted = match a.pacing {
        PacingArg::Kernel => PacingMode::Kernel,
        PacingArg::User => PacingMode::User,
        PacingArg::None => PacingMode::None,
    };
    let bind: SocketAddr = if a.dest.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("literal");
    let mut socks = Vec::new();
    for _ in 0..a.sockets {
        socks.push(
            Socket::bind_with(bind, Config::default().send_buffer(8 << 20))
                .map_err(|e| Failure::usage(e.to_string()))?,
        );
    }
    let qdisc = routes::device_for(a.dest).ok().and_then(|dev| {
        let idx: i32 = std::fs::read_to_string(format!("/sys/class/net/{dev}/ifindex"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        netlink::qdiscs()
            .ok()?
            .into_iter()
            .find(|q| q.ifindex == idx && q.parent == netlink::TC_H_ROOT)
            .map(|q| q.kind)
    });
    interrupt::watch();
    let (mode, reason) = choose_mode(wanted, socks[0].capabilities().txtime, qdisc.as_deref());
    if a.total_rate.is_some() && mode != PacingMode::User {
        eprintln!("fastudp: note: --total-rate applies to user-space pacing only; pacing is {mode} here, so it is not used");
    }
    if mode == PacingMode::Kernel {
        for s in &socks {
            s.enable_txtime(true)
                .map_err(|e| Failure::usage(e.to_string()))?;
        }
    }
    let mut seqs = vec![0u64; a.flows];
    if mode == PacingMode::User {
        // Sleeps that end on time are what user-space pacing is made of;
        // without this they may end 50 us late. Best effort.
        let _ = fastudp::os::set_timer_slack(1_000);
    }
    let mut sent_bytes = vec![0u64; a.flows];
    let t0 = fastudp::os::monotonic_ns() + 10_000_000;
    let mut sched = Scheduler::new(
        &SchedulerConfig {
            flows: a.flows,
            rate: a.rate,
            interval,
            max_burst: a.max_burst,
            segment_size: a.payload,
            mode,
            total_rate: a.total_rate,
            batch_bytes: DEFAULT_BATCH_BYTES,
        },
        t0,
    )
    .map_err(|e| Failure::usage(e.to_string()))?;
    let end = t0 + (a.duration * 1e9) as u64;
    let mut zcs: Vec<fastudp::ZeroCopySender> = if a.zerocopy {
        socks
            .iter()
            .map(fastudp::ZeroCopySender::new)
            .collect::<Result<_, _>>()
            .map_err(|e| Failure::usage(e.to_string()))?
    } else {
        Vec::new()
    };
    let mut buf = vec![0u8; MAX_TRAINS_PER_BATCH * a.max_burst * a.payload];
    let mut pending: Vec<(usize, usize, SocketAddr, usize, Option<u64>)> =
        Vec::with_capacity(MAX_TRAINS_PER_BATCH);
    let mut dues = Vec::with_capacity(MAX_TRAINS_PER_BATCH);
    let (mut calls, mut total) = (0u64, 0u64);
    let mut txtime_errors = 0u64;
    let cpu0 = fastudp::os::thread_cpu_time();
    let ticks0 = CpuTicks::now();
    let started = Instant::now();
    let (mut tick, mut last_total) = (1u64, 0u64);
    let mut next_sock = 0;
    let mut waiter = Waiter::tolerating(DEFAULT_SLACK);
    loop {
        let now = fastudp::os::monotonic_ns();
        if now >= end || interrupt::requested() {
            break;
        }
        // The trains due now, one batch (in user space: at most 16 KiB,
        // and only once the previous batches have drained at the total
        // rate, so a late wake-up does not become a burst).
        dues.clear();
        sched.due(now, &mut dues);
        if dues.is_empty() {
            let due = sched.next_at().min(end);
            if mode == PacingMode::User {
                waiter.wait_until(due);
            } else {
                // Unpaced flows and kernel pacing need no precise wake-up:
                // sleep, and do not spin.
                let left = due.saturating_sub(fastudp::os::monotonic_ns());
                std::thread::sleep(Duration::from_nanos(left));
            }
            continue;
        }
        pending.clear();
        let mut off = 0;
        for d in &dues {
            let (f, segs) = (d.flow, d.departure.segments);
            let len = segs * a.payload;
            for s in 0..segs {
                let b = &mut buf[off + s * a.payload..off + (s + 1) * a.payload];
                b[..4].copy_from_slice(&(f as u32).to_be_bytes());
                b[4..12].copy_from_slice(&seqs[f].to_le_bytes());
                b[12] = mode_byte(mode);
                b[13..HDR].copy_from_slice(MAGIC);
                seqs[f] += 1;
            }
            let dest = SocketAddr::new(a.dest, a.port + (f % a.ports as usize) as u16);
            let txtime = (mode == PacingMode::Kernel).then_some(d.departure.at_ns);
            pending.push((off, len, dest, segs, txtime));
            sent_bytes[f] += len as u64;
            off += len;
        }
        let sock = next_sock % socks.len();
        next_sock += 1;
        if a.zerocopy {
            let zc = &mut zcs[sock];
            for &(o, len, dest, segs, _) in &pending {
                let mut b = zc.pop_done().unwrap_or_default();
                b.clear();
                b.extend_from_slice(&buf[o..o + len]);
                if let Err((e, _)) = zc.send(&socks[sock], dest, b, (segs > 1).then_some(a.payload))
                {
                    return Err(Failure {
                        code: 1,
                        msg: format!("zerocopy send to {dest} failed: {e}"),
                    });
                }
                calls += 1;
                total += len as u64;
            }
            zc.reap(&socks[sock]).map_err(|e| Failure {
                code: 1,
                msg: e.to_string(),
            })?;
        } else {
            let mut ts: Vec<Transmit<'_>> = pending
                .iter()
                .map(|&(o, len, dest, segs, txtime)| {
                    let c = &buf[o..o + len];
                    let t = if segs > 1 {
                        Transmit::train(dest, c, a.payload)
                    } else {
                        Transmit::new(dest, c)
                    };
                    t.with_txtime(txtime)
                })
                .collect();
            total += ts.iter().map(|t| t.contents.len() as u64).sum::<u64>();
            let mut k = 0;
            while k < ts.len() {
                match socks[sock].send(&ts[k..]) {
                    Ok(n) => {
                        k += n.transmits;
                        if n.datagrams > 0 {
                            ts[k] = ts[k].skip_datagrams(n.datagrams);
                        }
                    }
                    Err(e)
                        if e.is_would_block()
                            || e.io_kind()
                                .is_some_and(|k| k == std::io::ErrorKind::OutOfMemory) =>
                    {
                        std::thread::yield_now()
                    }
                    Err(e) => {
                        let msg = format!("send failed: {e}");
                        return Err(Failure { code: 1, msg });
                    }
                }
            }
        }
        if mode == PacingMode::Kernel && !a.zerocopy && next_sock % 256 == 0 {
            // SOF_TXTIME_REPORT_ERRORS: packets the qdisc dropped for a
            // missed or invalid departure time.
            for s in &socks {
                while let Ok(Some(e)) = s.recv_error() {
                    txtime_errors += u64::from(matches!(e, fastudp::SocketError::Txtime { .. }));
                }
            }
        }
        if !a.quiet && !a.json && started.elapsed() >= Duration::from_secs(tick) {
            outln!(
                "[stream] {:>3}-{:<3} s  {:>8.3} Gbit/s",
                tick - 1,
                tick,
                (total - last_total) as f64 * 8.0 / 1e9
            );
            last_total = total;
            tick += 1;
        }
    }
    let stopped = fastudp::os::monotonic_ns();
    let cpu = fastudp::os::thread_cpu_time().saturating_sub(cpu0);
    let steal = steal_since(ticks0);
    if txtime_errors > 0 {
        eprintln!("fastudp: warning: the qdisc dropped {txtime_errors} packets for a missed or invalid departure time");
    }
    for (zc, s) in zcs.iter_mut().zip(&socks) {
        let _ = zc.drain(s, Duration::from_secs(2));
        if let Some(f) = zc.stats().fallback {
            eprintln!("fastudp: note: {}", f.reason);
        }
    }
    // Cut short by Ctrl-C, the run lasted until then.
    let interrupted = interrupt::requested();
    let secs = if interrupted {
        (stopped.saturating_sub(t0) as f64 / 1e9).clamp(1e-3, a.duration)
    } else {
        a.duration
    };
    let target = a.rate as f64 * secs;
    let within = sent_bytes
        .iter()
        .filter(|&&b| (b as f64 - target).abs() <= 0.05 * target)
        .count();
    let calls: u64 = if a.zerocopy {
        calls
    } else {
        socks.iter().map(|s| s.stats().send_calls).sum()
    };
    let gbit = total as f64 * 8.0 / 1e9;
    finish(
        &StreamSummary {
            role: "stream",
            flows: a.flows,
            flows_within_5pct: within as f64 / a.flows as f64,
            pacing: mode.to_string(),
            pacing_reason: if mode == PacingMode::User {
                format!(
                    "{reason}; all flows together at most {}",
                    bits_per_sec(sched.total_rate())
                )
            } else {
                reason
            },
            gbps: gbit / secs,
            cpu_ns_per_byte: if total > 0 {
                cpu.as_nanos() as f64 / total as f64
            } else {
                0.0
            },
            cpu_sec_per_gbit: if gbit > 0.0 {
                cpu.as_secs_f64() / gbit
            } else {
                0.0
            },
            calls_per_sec: calls as f64 / secs,
            loss: None,
            duplicates: None,
            reordered: None,
            gap_us_p50: None,
            gap_us_p90: None,
            gap_us_p99: None,
            max_back_to_back: None,
            foreign: None,
            out_of_range: None,
            host_steal: steal,
            seconds: secs,
            bytes: total,
            interrupted,
        },
        a.json,
    )
}

fn rx_thread(sock: Socket, limit: u32, stop: Arc<AtomicBool>, started: Arc<AtomicBool>) -> RxOut {
    let mut out = RxOut::new(limit);
    let _ = sock
        .as_std()
        .set_read_timeout(Some(Duration::from_millis(50)));
    let mut batch = RecvBatch::new(32);
    let cpu0 = fastudp::os::thread_cpu_time();
    while !stop.load(Relaxed) {
        if sock.recv(&mut batch).is_err() {
            continue;
        }
        let now = fastudp::os::monotonic_ns();
        out.calls += 1;
        let mut stream = false;
        for (_, d) in batch.datagrams() {
            stream |= out.datagram(d, now);
        }
        // Only the stream's datagrams start the run and keep it going.
        if stream {
            started.store(true, Relaxed);
        }
    }
    out.cpu = fastudp::os::thread_cpu_time().saturating_sub(cpu0);
    out
}

/// Runs `fastudp stream-rx`.
pub fn run_stream_rx(a: StreamRxArgs) -> Result<(), Failure> {
    check_common(a.flows, a.port, a.ports, a.sockets)?;
    for (opt, v) in [
        ("--duration", a.duration),
        ("--idle", Some(a.idle)),
        ("--wait", Some(a.wait)),
    ] {
        if let Some(v) = v.filter(|v| !(*v > 0.0 && *v <= 86_400.0)) {
            return Err(Failure::usage(format!(
                "{opt} {v} is out of range: more than 0, at most 86400 seconds"
            )));
        }
    }
    if let Some(p) = &a.per_flow {
        crate::output::check_output_path("--per-flow", p).map_err(Failure::usage)?;
    }
    interrupt::watch();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    // `stream` numbers its flows from 0; no other id is tracked.
    let limit = a.flows.min(u32::MAX as usize) as u32;
    let mut handles = Vec::new();
    for p in 0..a.ports {
        let addr = SocketAddr::new(a.bind, a.port + p);
        let cfg = Config::default().recv_buffer(16 << 20);
        let g = ReuseportGroup::bind(addr, a.sockets, Steering::Payload { offset: 0 }, cfg)
            .map_err(|e| Failure::usage(e.to_string()))?;
        for s in g.into_sockets() {
            let (st, sd) = (stop.clone(), started.clone());
            handles.push(std::thread::spawn(move || rx_thread(s, limit, st, sd)));
        }
    }
    let begin = Instant::now();
    while !started.load(Relaxed) {
        let interrupted = interrupt::requested();
        if begin.elapsed().as_secs_f64() > a.wait || interrupted {
            stop.store(true, Relaxed);
            for h in handles {
                let _ = h.join();
            }
            return Err(if interrupted {
                interrupt::failure(&format!(
                    "after {:.1} s, before any stream arrived",
                    begin.elapsed().as_secs_f64()
                ))
            } else {
                Failure {
                    code: 1,
                    msg: format!("no stream arrived in {} s", a.wait),
                }
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let first = Instant::now();
    let ticks0 = CpuTicks::now();
    // Idle detection: the total of flows' bytes stops growing. The threads
    // keep their counts, so watch the clock of the last receive instead.
    let mut last_busy = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if interrupt::requested()
            || a.duration
                .is_some_and(|d| first.elapsed().as_secs_f64() >= d)
        {
            break;
        }
        // A receive marks `started` again; clear it and see if it comes back.
        if started.swap(false, Relaxed) {
            last_busy = Instant::now();
        } else if last_busy.elapsed().as_secs_f64() >= a.idle {
            break;
        }
    }
    stop.store(true, Relaxed);
    let steal = steal_since(ticks0);
    let t = Tally::merge(handles.into_iter().filter_map(|h| h.join().ok()).collect());
    let flows = &t.flows;
    let secs = (t.last_ns.saturating_sub(t.first_ns) as f64 / 1e9).max(1e-3);
    let bytes: u64 = flows.values().map(|f| f.bytes).sum();
    if t.out_of_range > 0 {
        eprintln!(
            "fastudp: warning: {} datagrams carried a flow id outside 0..{} and were ignored (forged, or a sender with more flows than --flows)",
            t.out_of_range, a.flows
        );
    }
    if t.foreign > t.out_of_range {
        eprintln!(
            "fastudp: warning: {} datagrams without the stream's header, or with a sequence number far off their flow's, were ignored (another sender on these ports?)",
            t.foreign - t.out_of_range
        );
    }
    let target = a.rate as f64 * secs;
    let within = flows
        .values()
        .filter(|f| (f.bytes as f64 - target).abs() <= 0.05 * target)
        .count();
    if let Some(path) = &a.per_flow {
        let mut ids: Vec<&u32> = flows.keys().collect();
        ids.sort();
        let mut out =
            String::from("flow,bytes,datagrams,rate_bytes_per_sec,lost,max_back_to_back\n");
        for id in ids {
            let f = &flows[id];
            out.push_str(&format!(
                "{id},{},{},{:.0},{},{}\n",
                f.bytes,
                f.datagrams,
                f.bytes as f64 / secs,
                f.lost,
                f.max_run
            ));
        }
        std::fs::write(path, out).map_err(|e| Failure {
            code: 1,
            msg: format!("cannot write {path}: {e}"),
        })?;
    }
    let modes = t.modes;
    let mode = (1..4)
        .max_by_key(|&i| modes[i])
        .filter(|&i| modes[i] > 0)
        .map_or("unknown", |i| mode_name(i as u8));
    finish(
        &StreamSummary {
            role: "stream-rx",
            flows: flows.len(),
            flows_within_5pct: within as f64 / a.flows as f64,
            pacing: mode.to_string(),
            pacing_reason: "as the sender marked its datagrams".into(),
            gbps: bytes as f64 * 8.0 / secs / 1e9,
            cpu_ns_per_byte: if bytes > 0 {
                t.cpu.as_nanos() as f64 / bytes as f64
            } else {
                0.0
            },
            cpu_sec_per_gbit: if bytes > 0 {
                t.cpu.as_secs_f64() / (bytes as f64 * 8.0 / 1e9)
            } else {
                0.0
            },
            calls_per_sec: t.calls as f64 / secs,
            loss: Some(t.loss()),
            duplicates: Some(flows.values().map(|f| f.duplicates).sum()),
            reordered: Some(flows.values().map(|f| f.reordered).sum()),
            gap_us_p50: Some(percentile(&t.gaps, 0.5)),
            gap_us_p90: Some(percentile(&t.gaps, 0.9)),
            gap_us_p99: Some(percentile(&t.gaps, 0.99)),
            max_back_to_back: Some(flows.values().map(|f| f.max_run).max().unwrap_or(0)),
            foreign: Some(t.foreign),
            out_of_range: Some(t.out_of_range),
            host_steal: steal,
            seconds: secs,
            bytes,
            interrupted: interrupt::requested(),
        },
        a.json,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_rates_read_well() {
        assert_eq!(bits_per_sec(55_000_000), "440.0 Mbit/s");
        assert_eq!(bits_per_sec(250_000_000), "2.00 Gbit/s");
        assert_eq!(bits_per_sec(110), "880 bit/s");
        assert_eq!(bits_per_sec(5_500), "44.0 kbit/s");
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("125000"), Ok(125_000));
        assert_eq!(parse_rate("125k"), Ok(125_000));
        assert_eq!(parse_rate("1.5M"), Ok(1_500_000));
        assert_eq!(parse_rate("2G"), Ok(2_000_000_000));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1k").is_err());
    }

    #[test]
    fn limits() {
        assert!(check_common(0, 9000, 1, 1)
            .unwrap_err()
            .msg
            .contains("--flows 0"));
        assert!(check_common(10, 9000, 0, 1).is_err());
        assert!(check_common(200_000, 9000, 1, 1)
            .unwrap_err()
            .msg
            .contains("--ports"));
        assert!(check_common(200_000, 9000, 4, 1).is_ok());
        assert!(check_common(10, 0, 1, 1)
            .unwrap_err()
            .msg
            .contains("--port 0"));
        assert!(check_common(10, 65_535, 2, 1)
            .unwrap_err()
            .msg
            .contains("past port 65535"));
        assert!(check_common(10, 65_534, 2, 1).is_ok());
        assert!(check_common(10, 9000, 1, 10_000_000)
            .unwrap_err()
            .msg
            .contains("file descriptors"));
    }
}
