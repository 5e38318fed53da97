//! `fastudp stream-rx`: the flows received through reuseport groups.

use super::args::{check_common, StreamRxArgs};
use super::flows::{percentile, RxOut, Tally};
use super::header::mode_name;
use super::summary::{finish, steal_since, StreamSummary};
use crate::procfs::CpuTicks;
use crate::{interrupt, Failure};
use fastudp::{Config, RecvBatch, ReuseportGroup, Socket, Steering};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rx_thread(sock: Socket, limit: u32, stop: Arc<AtomicBool>, started: Arc<AtomicBool>) -> RxOut {
    let mut out = RxOut::new(limit);
    let _ = sock
        .as_std()
        .set_read_timeout(Some(Duration::from_millis(50)));
    let mut batch = RecvBatch::new(32);
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while !stop.load(Relaxed) {
        if sock.recv(&mut batch).is_err() {
            continue;
        }
        let now = fastudp_tools::os::monotonic_ns();
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
    out.cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
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
            refused_ports: None,
            refused_flows: None,
            datagrams: None,
            dropped_locally: None,
        },
        a.json,
    )
}
