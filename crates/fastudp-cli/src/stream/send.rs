//! `fastudp stream`: many paced flows.

use super::args::{check_common, PacingArg, StreamArgs};
use super::header::{mode_byte, HDR, MAGIC};
use super::summary::{bits_per_sec, finish, steal_since, StreamSummary};
use crate::host::{netlink, routes};
use crate::procfs::CpuTicks;
use crate::{interrupt, Failure};
use fastudp::pacing::{
    choose_mode, PacingMode, Scheduler, SchedulerConfig, Waiter, DEFAULT_BATCH_BYTES,
    DEFAULT_SLACK, MAX_TRAINS_PER_BATCH,
};
use fastudp::{Config, Socket, Transmit};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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
