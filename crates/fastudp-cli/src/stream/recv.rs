//! `fastudp stream-rx`: the flows received through reuseport groups.

use super::args::{check_common, StreamRxArgs};
use super::flows::{percentile, RxOut, Tally};
use super::header::mode_name;
use super::summary::{finish, steal_since, StreamSummary};
use crate::interrupt;
use crate::procfs::CpuTicks;
use anyhow::{bail, Context};
use fastudp_io::UdpIo;
use fastudp_io::{Config, RecvBatch, ReuseportGroup, Socket, Steering};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
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
pub fn run_stream_rx(a: StreamRxArgs) -> anyhow::Result<()> {
    validate(&a)?;
    interrupt::watch();
    let mut rx = Receivers::start(&a)?;
    rx.wait_for_stream(a.wait)?;
    let ticks0 = CpuTicks::now();
    rx.until_done(&a);
    rx.stop.store(true, Relaxed);
    let steal = steal_since(ticks0);
    let t = rx.join();
    report(&a, &t, steal)
}

/// Checks the options before anything is opened: each failure is a usage
/// error.
fn validate(a: &StreamRxArgs) -> anyhow::Result<()> {
    check_common(a.flows, a.port, a.ports, a.sockets)?;
    for (opt, v) in [
        ("--duration", a.duration),
        ("--idle", Some(a.idle)),
        ("--wait", Some(a.wait)),
    ] {
        if let Some(v) = v.filter(|v| !(*v > 0.0 && *v <= 86_400.0)) {
            bail_usage!("{opt} {v} is out of range: more than 0, at most 86400 seconds");
        }
    }
    if let Some(p) = &a.per_flow {
        crate::output::check_output_path("--per-flow", p)?;
    }
    Ok(())
}

/// The receiving threads: one per socket of each port's reuseport group.
struct Receivers {
    /// Tells the threads to end.
    stop: Arc<AtomicBool>,
    /// Set by a thread whenever it received the stream's datagrams.
    started: Arc<AtomicBool>,
    handles: Vec<JoinHandle<RxOut>>,
}

impl Receivers {
    /// Binds every port's group and starts a thread per socket. A port
    /// that cannot be bound is a runtime failure.
    fn start(a: &StreamRxArgs) -> anyhow::Result<Receivers> {
        let mut rx = Receivers {
            stop: Arc::new(AtomicBool::new(false)),
            started: Arc::new(AtomicBool::new(false)),
            handles: Vec::new(),
        };
        // `stream` numbers its flows from 0; no other id is tracked.
        let limit = a.flows.min(u32::MAX as usize) as u32;
        for p in 0..a.ports {
            let addr = SocketAddr::new(a.bind, a.port + p);
            let cfg = Config::default().recv_buffer(16 << 20);
            let g = ReuseportGroup::bind(addr, a.sockets, Steering::Payload { offset: 0 }, cfg)
                .with_context(|| format!("cannot listen on {addr}"));
            let g = match g {
                Ok(g) => g,
                Err(e) => {
                    rx.stop.store(true, Relaxed);
                    return Err(e);
                }
            };
            for s in g.into_sockets() {
                let (st, sd) = (rx.stop.clone(), rx.started.clone());
                rx.handles
                    .push(std::thread::spawn(move || rx_thread(s, limit, st, sd)));
            }
        }
        Ok(rx)
    }

    /// Waits up to `wait` seconds for the stream's first datagram. Without
    /// one the threads are stopped, and the run ends: a runtime failure,
    /// or an interruption on Ctrl-C.
    fn wait_for_stream(&mut self, wait: f64) -> anyhow::Result<()> {
        let begin = Instant::now();
        while !self.started.load(Relaxed) {
            let interrupted = interrupt::requested();
            if begin.elapsed().as_secs_f64() > wait || interrupted {
                self.stop.store(true, Relaxed);
                for h in self.handles.drain(..) {
                    let _ = h.join();
                }
                if interrupted {
                    return Err(interrupt::interrupted(&format!(
                        "after {:.1} s, before any stream arrived",
                        begin.elapsed().as_secs_f64()
                    )));
                }
                bail!("no stream arrived in {wait} s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Returns after `--duration` from the first datagram, after `--idle`
    /// seconds of silence, or on Ctrl-C.
    fn until_done(&self, a: &StreamRxArgs) {
        let first = Instant::now();
        // Idle detection: the total of flows' bytes stops growing. The
        // threads keep their counts, so watch the clock of the last
        // receive instead.
        let mut last_busy = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if interrupt::requested()
                || a.duration
                    .is_some_and(|d| first.elapsed().as_secs_f64() >= d)
            {
                return;
            }
            // A receive marks `started` again; clear it and see if it
            // comes back.
            if self.started.swap(false, Relaxed) {
                last_busy = Instant::now();
            } else if last_busy.elapsed().as_secs_f64() >= a.idle {
                return;
            }
        }
    }

    /// Stops the threads and merges their counts.
    fn join(self) -> Tally {
        self.stop.store(true, Relaxed);
        Tally::merge(
            self.handles
                .into_iter()
                .filter_map(|h| h.join().ok())
                .collect(),
        )
    }
}

/// Reports the run: warnings about datagrams of no flow on stderr, the
/// `--per-flow` file, and the summary.
fn report(a: &StreamRxArgs, t: &Tally, steal: Option<f64>) -> anyhow::Result<()> {
    let secs = (t.last_ns.saturating_sub(t.first_ns) as f64 / 1e9).max(1e-3);
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
    if let Some(path) = &a.per_flow {
        write_per_flow(path, t, secs)?;
    }
    let mut s = summary(a, t, secs);
    s.host_steal = steal;
    finish(&s, a.json)
}

/// Writes one CSV line per flow to `path`; a failed write is a runtime
/// failure (the path was checked before the run).
fn write_per_flow(path: &str, t: &Tally, secs: f64) -> anyhow::Result<()> {
    let flows = &t.flows;
    let mut ids: Vec<&u32> = flows.keys().collect();
    ids.sort();
    let mut out = String::from("flow,bytes,datagrams,rate_bytes_per_sec,lost,max_back_to_back\n");
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
    std::fs::write(path, out).with_context(|| format!("cannot write {path}"))
}

/// The summary of a run of `secs` seconds.
fn summary(a: &StreamRxArgs, t: &Tally, secs: f64) -> StreamSummary {
    let flows = &t.flows;
    let bytes: u64 = flows.values().map(|f| f.bytes).sum();
    let target = a.rate as f64 * secs;
    let within = flows
        .values()
        .filter(|f| (f.bytes as f64 - target).abs() <= 0.05 * target)
        .count();
    let modes = t.modes;
    let mode = (1..4)
        .max_by_key(|&i| modes[i])
        .filter(|&i| modes[i] > 0)
        .map_or("unknown", |i| mode_name(i as u8));
    StreamSummary {
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
        host_steal: None,
        seconds: secs,
        bytes,
        interrupted: interrupt::requested(),
        refused_ports: None,
        refused_flows: None,
        datagrams: None,
        dropped_locally: None,
    }
}
