//! `fastudp bench`: every UDP send and receive strategy side by side.

pub mod plot;
pub mod report;

use crate::engine::report::Host;
use crate::engine::{
    monitor, name, pair_label, rname, rx, tx, uring, Live, RxOutcome, RxStrategy, TxOutcome,
    TxStrategy, Workload, DEFAULT_BATCH,
};
use crate::testbed::{self, Profile};
use crate::{interrupt, procfs};
use anyhow::{anyhow, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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
    #[arg(long, default_value_t = DEFAULT_BATCH)]
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
    /// Print JSON (schema: docs/CLI.md) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Rotate the sender through 128 MiB of buffers, so that payload reads
    /// miss the CPU caches (as `udpgso_bench_tx -c`).
    #[arg(long)]
    pub cache_thrash: bool,
    /// Also draw the results as an SVG bar chart into this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,
    /// Do not pin the sender and receiver threads to CPUs 0 and 1.
    #[arg(long)]
    pub no_pin: bool,
    /// Run across a veth pair between two network namespaces built with
    /// this profile (root), instead of loopback; removed at the end.
    #[arg(long, value_name = "PROFILE", conflicts_with = "on_testbed")]
    pub testbed: Option<Profile>,
    /// Run across the testbed that is up now (`fastudp testbed up`),
    /// leaving it as it is: to measure before and after `fastudp tune`.
    #[arg(long)]
    pub on_testbed: bool,
    /// Busy-poll the receiving socket for up to US microseconds per
    /// receive call (SO_BUSY_POLL; above net.core.busy_read it needs
    /// root): the receiver runs the device's NAPI poll itself.
    #[arg(long, value_name = "US")]
    pub busy_poll: Option<u32>,
}

/// One measured pairing.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// The send strategy, or `Tcp` for the TCP baseline.
    pub tx: TxStrategy,
    /// The receive strategy, or "tcp" for the TCP baseline.
    pub rx: String,
    /// Payload bytes received (sent, in the sink profile).
    pub bytes: u64,
    /// Datagrams received (sent, in the sink profile).
    pub datagrams: u64,
    /// Seconds the sender ran.
    pub seconds: f64,
    /// Payload MB/s (10^6 bytes).
    pub mbytes_per_sec: f64,
    /// The same in Gbit/s.
    pub gbps: f64,
    /// Datagrams per second.
    pub datagrams_per_sec: f64,
    /// Send calls per second.
    pub tx_calls_per_sec: f64,
    /// Payload bytes per send call.
    pub bytes_per_call: f64,
    /// Receive calls per second that returned data.
    pub rx_calls_per_sec: f64,
    /// The sending thread's CPU ns per byte.
    pub tx_cpu_ns_per_byte: f64,
    /// The receiving thread's CPU ns per byte.
    pub rx_cpu_ns_per_byte: f64,
    /// Softirq time of all CPUs (/proc/stat) per byte.
    pub softirq_ns_per_byte: f64,
    /// Busy time of all CPUs (/proc/stat: user, system, irq, softirq;
    /// anything else running on the host counts too) per byte.
    pub all_cpu_ns_per_byte: f64,
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams sent and not received; `None` in the sink profile.
    pub lost: Option<u64>,
    /// Receive-buffer drops the kernel counted (messages: a GRO train counts once).
    pub kernel_drops: u64,
    /// MB/s relative to the `sendto` run into the same receiver (for TCP:
    /// into the receiver the send strategies share) of the same
    /// invocation, if there was one.
    pub speedup_vs_sendto: Option<f64>,
    /// MB/s relative to the `recvfrom` run from the same sender of the same
    /// invocation, if there was one (UDP only).
    pub speedup_vs_recvfrom: Option<f64>,
    /// `gso-zerocopy` only: zerocopy completions read from the error queue.
    pub zerocopy_completions: Option<u64>,
    /// `gso-zerocopy` only: of those, how many the kernel copied anyway.
    pub zerocopy_copied: Option<u64>,
    /// The share of all CPU time the hypervisor took during the run
    /// (steal, /proc/stat); `None` where it cannot be read.
    pub host_steal: Option<f64>,
}

/// An error of a module that is moving from `String` to `anyhow` (the
/// testbed): the same call compiles before and after.
pub trait Moving {
    /// As a runtime failure: a message, or the error as it is.
    fn runtime(self) -> anyhow::Error;
    /// As a usage error: a message marked as one, or the error as it is
    /// (a module that has moved marks its own usage errors).
    fn usage(self) -> anyhow::Error;
}

impl Moving for String {
    fn runtime(self) -> anyhow::Error {
        anyhow::Error::msg(self)
    }
    fn usage(self) -> anyhow::Error {
        crate::failure::usage(self)
    }
}

impl Moving for anyhow::Error {
    fn runtime(self) -> anyhow::Error {
        self
    }
    fn usage(self) -> anyhow::Error {
        self
    }
}

/// Checks the options before anything runs: each failure is a usage
/// error.
pub fn validate(a: &BenchArgs) -> anyhow::Result<Workload> {
    let max = if a.ipv6 {
        fastudp_tools::wire::MAX_PAYLOAD_V6
    } else {
        fastudp_tools::wire::MAX_PAYLOAD_V4
    };
    if a.payload == 0 || a.payload > max {
        bail_usage!(
            "--payload {} is out of range: a UDP payload is 1 to {max} bytes",
            a.payload
        );
    }
    if a.batch == 0 || a.batch > fastudp_tools::os::MAX_BATCH {
        bail_usage!(
            "--batch {} is out of range: 1 to {}",
            a.batch,
            fastudp_tools::os::MAX_BATCH
        );
    }
    if !(a.duration >= 0.01 && a.duration <= 3600.0) {
        bail_usage!(
            "--duration {} is out of range: 0.01 to 3600 seconds",
            a.duration
        );
    }
    if a.busy_poll.is_some_and(|us| us == 0 || us > 1_000_000) {
        bail_usage!(
            "--busy-poll {} is out of range: 1 to 1000000 microseconds",
            a.busy_poll.unwrap_or(0)
        );
    }
    if a.repeat == 0 || a.repeat > 100 {
        bail_usage!("--repeat {} is out of range: 1 to 100", a.repeat);
    }
    let kmax = fastudp_tools::os::kernel_max_segments().max(1);
    let segs = a.batch.min(max / a.payload).min(kmax).max(1);
    if let Some(p) = &a.plot {
        let dir = std::path::Path::new(p)
            .parent()
            .filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            bail_usage!("--plot {p}: the directory does not exist");
        }
        crate::output::check_output_path("--plot", p)?;
    }
    check_mtu(a)?;
    Ok(Workload {
        rate: None,
        bind: None,
        busy_poll: a.busy_poll,
        payload: a.payload,
        batch: a.batch,
        duration: Duration::from_secs_f64(a.duration),
        ipv6: a.ipv6,
        segs,
        net: a.testbed,
        pin: !a.no_pin,
        cache_thrash: a.cache_thrash,
        connect: false,
    })
}

/// Checks that a datagram fits the MTU of the path it takes.
fn check_mtu(a: &BenchArgs) -> anyhow::Result<()> {
    if a.testbed == Some(Profile::Fleet) {
        bail_usage!("the fleet testbed has no sender and receiver pair: bench runs on a pair profile (offload, wire, ...)");
    }
    if a.testbed.is_none() {
        // Loopback: a datagram must fit its MTU, since the GSO strategies
        // send it as one segment, and a segment over the MTU is refused
        // (EMSGSIZE) rather than fragmented.
        let lo_mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(65_536);
        let fit = fastudp_tools::wire::max_segment_for_mtu(lo_mtu, a.ipv6);
        if a.payload > fit {
            bail_usage!(
                "--payload {} does not fit loopback's MTU of {lo_mtu}: at most {fit} bytes over {}",
                a.payload,
                if a.ipv6 { "IPv6" } else { "IPv4" }
            );
        }
    }
    let mtu_seg = fastudp_tools::wire::max_segment_for_mtu(1500, a.ipv6);
    if a.testbed.is_some() && a.payload > mtu_seg {
        bail_usage!(
            "--payload {} is over the testbed's MTU: a GSO segment on a 1500-byte MTU holds at most {mtu_seg} bytes",
            a.payload
        );
    }
    Ok(())
}

/// The pairings of a bench, each a sender and a receiver.
type Pairs = Vec<(TxStrategy, RxStrategy)>;

/// Runs `fastudp bench`.
pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let (a, w, pairs) = prepare(a)?;
    interrupt::watch();
    let mut guard = build_testbed(&a)?;
    let host = crate::engine::report::host_info();
    if !a.json {
        print_header(&a, &w, &host)?;
    }
    let runs = run_pairs(&pairs, &w, &a);
    print_results(&a, &w, &host, &runs)?;
    // The chart comes after the table, so a failure to draw it loses
    // nothing; there is none without results.
    if !runs.results.is_empty() {
        if let Some(path) = &a.plot {
            draw_plot(path, &a, &w, &host, &runs)?;
        }
    }
    if runs.interrupted.is_some() {
        // The testbed goes now, so that the message can say so.
        let removed = guard.take().is_some();
        return Err(interrupt::interrupted(&format!(
            "{}the runs that finished are reported above",
            if removed { "testbed removed; " } else { "" }
        )));
    }
    match runs.failure {
        None => Ok(()),
        Some(e) if runs.results.is_empty() => Err(e),
        Some(e) => Err(anyhow!(
            "{e:#} (the runs that finished before it are reported above)"
        )),
    }
}

/// Checks the options (usage errors) and plans the pairings; with
/// `--on-testbed`, on the profile of the testbed that is up.
fn prepare(mut a: BenchArgs) -> anyhow::Result<(BenchArgs, Workload, Pairs)> {
    if a.on_testbed {
        testbed::preflight().map_err(Moving::usage)?;
        a.testbed = Some(testbed::current().map_err(Moving::usage)?);
    }
    let w = validate(&a)?;
    let pairs = plan_pairs(&a.tx, &a.rx, w.net == Some(Profile::Sink))?;
    let pairs = uring::unless_unavailable(pairs, a.tx.is_empty() && a.rx.is_empty());
    if a.testbed.is_some() && !a.on_testbed {
        testbed::preflight().map_err(Moving::usage)?;
    }
    Ok((a, w, pairs))
}

/// Builds the testbed of `--testbed` (not the one `--on-testbed` runs
/// on, which stays as it is); it goes when the guard drops. A testbed
/// that cannot be built is a runtime failure.
fn build_testbed(a: &BenchArgs) -> anyhow::Result<Option<testbed::Guard>> {
    match a.testbed {
        Some(p) if !a.on_testbed => match testbed::up_guarded(p) {
            Ok(g) => Ok(Some(g)),
            // A Ctrl-C at the terminal ends the `ip` commands that build
            // it too; `up` removed what they had built.
            Err(_) if interrupt::requested() => Err(interrupt::interrupted(
                "the testbed was being built; removed",
            )),
            Err(e) => Err(e.runtime()),
        },
        _ => Ok(None),
    }
}

/// The line that says what the bench runs, where.
fn print_header(a: &BenchArgs, w: &Workload, host: &Host) -> anyhow::Result<()> {
    out!(
        "fastudp bench: {} on {}, payload {} B, batch {}, {} datagrams per GSO buffer, {:.1} s per run",
        host.kernel,
        match w.net {
            None => (if w.ipv6 { "loopback ::1" } else { "loopback 127.0.0.1" }).to_string(),
            Some(p) => format!(
                "testbed {} (veth between namespaces {} and {})",
                profile_name(p),
                testbed::TX_NS,
                testbed::RX_NS
            ),
        },
        w.payload,
        w.batch,
        w.segs,
        a.duration
    )
}

/// What the pairings of a bench gave.
struct Runs {
    /// The median run of each pairing that finished, with its ratios.
    results: Vec<Measurement>,
    /// The failure that ended the bench early.
    failure: Option<anyhow::Error>,
    /// The pairing Ctrl-C cut short, which is left out.
    interrupted: Option<String>,
}

/// Runs every pairing `--repeat` times and keeps its median run by
/// throughput. A run that fails stops the bench, but the runs before it
/// are still reported (then the failure, with exit status 1). So does
/// Ctrl-C: the pairing it cut short is left out (status 130).
fn run_pairs(pairs: &[(TxStrategy, RxStrategy)], w: &Workload, a: &BenchArgs) -> Runs {
    let mut out = Runs {
        results: Vec::new(),
        failure: None,
        interrupted: None,
    };
    'pairs: for &(t, r) in pairs {
        let mut runs = Vec::new();
        for _ in 0..a.repeat {
            // Checked before the run too: Ctrl-C may come while the
            // testbed is being built.
            let run = (!interrupt::requested()).then(|| run_pair(t, r, w, a.quiet || a.json));
            let Some(run) = run.filter(|_| !interrupt::requested()) else {
                out.interrupted = Some(pair_label(t, r));
                break 'pairs;
            };
            match run {
                Ok(x) => runs.push(x),
                Err(e) => {
                    out.failure = Some(e);
                    break 'pairs;
                }
            }
        }
        runs.sort_by_key(|r| r.bytes);
        out.results.push(runs.swap_remove(runs.len() / 2));
    }
    report::ratios(&mut out.results);
    out
}

/// The results as JSON, or as the table with the verdict under it.
fn print_results(a: &BenchArgs, w: &Workload, host: &Host, runs: &Runs) -> anyhow::Result<()> {
    let (results, interrupted) = (&runs.results, &runs.interrupted);
    let verdict = report::verdict(results, w.net);
    if a.json {
        let doc = serde_json::json!({ "schema": 1, "host": host, "workload": {
            "payload": w.payload, "batch": w.batch, "gso_segments": w.segs,
            "duration": a.duration, "ipv6": w.ipv6, "repeat": a.repeat, "cache_thrash": w.cache_thrash,
            "testbed": w.net.map(profile_name) }, "results": results, "verdict": verdict,
            "interrupted": interrupted.is_some(), "interrupted_during": interrupted });
        return out!("{}", serde_json::to_string_pretty(&doc)?);
    }
    if !results.is_empty() {
        report::print_table(results)?;
        for l in &verdict {
            out!("{l}")?;
        }
    }
    if let Some(during) = interrupted {
        report::print_interrupted(during, results.len())?;
    }
    Ok(())
}

/// Draws the chart of `--plot` and says where it went. A chart that
/// cannot be drawn is a runtime failure.
fn draw_plot(
    path: &str,
    a: &BenchArgs,
    w: &Workload,
    host: &Host,
    runs: &Runs,
) -> anyhow::Result<()> {
    let title = format!(
        "fastudp bench: {} B payload, {}, {}{}",
        w.payload,
        w.net
            .map(|p| format!("testbed {}", profile_name(p)))
            .unwrap_or_else(|| "loopback".into()),
        host.kernel,
        if runs.interrupted.is_some() {
            " (interrupted)"
        } else {
            ""
        }
    );
    plot::svg(path, &title, &runs.results)?;
    // Where it went, as an absolute path; on stderr with --json, so
    // that standard output stays one JSON document.
    let at = std::fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string());
    if a.json {
        eprintln!("fastudp: plot written to {at}");
        Ok(())
    } else {
        out!("plot written to {at}")
    }
}

/// The testbed profile's command-line name.
pub fn profile_name(p: Profile) -> String {
    p.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// Where the receiver binds: loopback, or its testbed address.
fn rx_addr(w: &Workload) -> SocketAddr {
    match w.net {
        None if w.ipv6 => "[::1]:0".parse().expect("literal"),
        None => "127.0.0.1:0".parse().expect("literal"),
        Some(_) => SocketAddr::new(testbed::addrs(w.ipv6).rx, 0),
    }
}

/// Runs `f` in the receiving namespace when on the testbed.
fn on_rx_side<T: Send>(
    w: &Workload,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    match w.net {
        Some(_) => testbed::within(testbed::RX_NS, || Ok(f())).map_err(Moving::runtime)?,
        None => f(),
    }
}

fn pin(w: &Workload, cpu: usize) {
    if w.pin
        && std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            >= 2
    {
        let _ = fastudp_tools::os::pin_to_cpu(cpu);
    }
}

/// The items of `v` without repeats, in their first order.
fn unique<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for &x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// Which (sender, receiver) pairings to run.
///
/// With neither list given: every send strategy into the best receiver and
/// every receive strategy against the best sender. With one list: that
/// comparison only. With both: every pair. The receive comparison always
/// includes its `recvfrom` baseline. In the sink profile only senders run,
/// and TCP, which needs a peer, cannot (a usage error, as is `--rx`).
pub fn plan_pairs(tx: &[TxStrategy], rx: &[RxStrategy], sink: bool) -> anyhow::Result<Pairs> {
    let best_rx = RxStrategy::GroRecvmmsg;
    let best_tx = TxStrategy::Fastudp;
    // A strategy named twice runs once.
    let (tx, rx) = (&unique(tx)[..], &unique(rx)[..]);
    if sink {
        if tx.iter().any(|t| t.is_tcp()) {
            bail_usage!("tcp cannot run in the sink profile: TCP needs a peer that answers");
        }
        if !rx.is_empty() {
            bail_usage!("the sink profile measures the transmit side only: drop --rx");
        }
        let all: Vec<TxStrategy> = TxStrategy::value_variants()
            .iter()
            .copied()
            .filter(|t| !t.is_tcp())
            .collect();
        let txs = if tx.is_empty() { all } else { tx.to_vec() };
        return Ok(txs.into_iter().map(|t| (t, best_rx)).collect());
    }
    let (txs, rxs) = match (tx.is_empty(), rx.is_empty()) {
        (true, true) => (
            TxStrategy::value_variants().to_vec(),
            RxStrategy::value_variants().to_vec(),
        ),
        _ => (tx.to_vec(), rx.to_vec()),
    };
    let mut pairs: Pairs = Vec::new();
    if !tx.is_empty() && !rx.is_empty() {
        for &t in &txs {
            // TCP has its own receiver: one run, whatever the UDP receivers.
            let rs = if t.is_tcp() { &rxs[..1] } else { &rxs[..] };
            for &r in rs {
                pairs.push((t, r));
            }
        }
        return Ok(pairs);
    }
    pairs.extend(txs.iter().map(|&t| (t, best_rx)));
    for &r in &rxs {
        if !pairs.contains(&(best_tx, r)) {
            pairs.push((best_tx, r));
        }
    }
    // The receive comparison needs its baseline against the same sender.
    if !rxs.is_empty() && !pairs.contains(&(best_tx, RxStrategy::Recvfrom)) {
        pairs.push((best_tx, RxStrategy::Recvfrom));
    }
    Ok(pairs)
}

/// The host's counters before a run, to take the run's share of them.
struct Counters {
    drops: u64,
    softirq_ns: Option<u64>,
    busy_ns: Option<u64>,
    ticks: Option<procfs::CpuTicks>,
}

impl Counters {
    fn now() -> Counters {
        Counters {
            drops: procfs::rcvbuf_errors(),
            softirq_ns: procfs::softirq_ns(),
            busy_ns: procfs::busy_ns(),
            ticks: procfs::CpuTicks::now(),
        }
    }
}

/// The receiving side's thread.
type Receiver = JoinHandle<anyhow::Result<RxOutcome>>;

/// Runs one sender/receiver pairing and measures it. Every failure is a
/// runtime failure.
pub fn run_pair(
    t: TxStrategy,
    r: RxStrategy,
    w: &Workload,
    quiet: bool,
) -> anyhow::Result<Measurement> {
    let live = Arc::new(Live::default());
    let before = Counters::now();
    let (rx_handle, dest) = start_receiver(t, r, w, &live)?;
    let tx_handle = start_sender(t, dest, w, &live);
    monitor(&pair_label(t, r), quiet, &tx_handle, || {
        (
            live.rx_bytes.load(Relaxed),
            live.rx_datagrams.load(Relaxed),
            live.tx_calls.load(Relaxed),
        )
    })?;
    let txo = tx_handle
        .join()
        .map_err(|_| anyhow!("sender thread panicked"))??;
    let rxo = rx_handle
        .join()
        .map_err(|_| anyhow!("receiver thread panicked"))??;
    Ok(measurement(t, r, w, &before, &txo, &rxo))
}

/// Starts the receiving side of a pairing (in the sink profile, none;
/// for TCP, TCP's own): its thread, and the address to send to.
fn start_receiver(
    t: TxStrategy,
    r: RxStrategy,
    w: &Workload,
    live: &Arc<Live>,
) -> anyhow::Result<(Receiver, SocketAddr)> {
    if w.net == Some(Profile::Sink) {
        let dest = SocketAddr::new(testbed::addrs(w.ipv6).sink, 9);
        let h = std::thread::spawn(|| Ok(RxOutcome::default()));
        return Ok((h, dest));
    }
    let addr = rx_addr(w);
    let (live, w) = (live.clone(), *w);
    if t.is_tcp() {
        let l = on_rx_side(&w, || {
            TcpListener::bind(addr).with_context(|| format!("TCP listen on {addr}"))
        })?;
        // Accepted sockets inherit the listener's SO_BUSY_POLL.
        busy_poll(&l, &w)?;
        let dest = l.local_addr()?;
        let h = std::thread::spawn(move || {
            pin(&w, 1);
            rx::tcp(l, &w, &live)
        });
        return Ok((h, dest));
    }
    let sock = on_rx_side(&w, || rx::bind(r, addr))?;
    match &sock {
        rx::RxSock::Std(s) => busy_poll(s, &w)?,
        rx::RxSock::Fast(f) => busy_poll(f.as_std(), &w)?,
    }
    let dest = sock.local_addr()?;
    let h = std::thread::spawn(move || {
        pin(&w, 1);
        rx::udp(r, sock, &w, &live)
    });
    Ok((h, dest))
}

/// Starts the sending side of a pairing, to `dest`.
fn start_sender(
    t: TxStrategy,
    dest: SocketAddr,
    w: &Workload,
    live: &Arc<Live>,
) -> JoinHandle<anyhow::Result<TxOutcome>> {
    let (live, w) = (live.clone(), *w);
    std::thread::spawn(move || {
        pin(&w, 0);
        if w.net.is_some() {
            testbed::enter(testbed::TX_NS).map_err(Moving::runtime)?;
        }
        let out = if t.is_tcp() {
            TcpStream::connect_timeout(&dest, Duration::from_secs(3))
                .map_err(|e| anyhow!("TCP connect to {dest}: {e}: the destination does not answer"))
                .and_then(|s| {
                    if t == TxStrategy::TcpZerocopy {
                        tx::tcp_zerocopy(s, &w, &live)
                    } else {
                        tx::tcp(s, &w, &live)
                    }
                })
        } else {
            tx::udp(t, dest, &w, &live)
        };
        live.sender_done.store(true, Release);
        out
    })
}

/// The measurement of a pairing from what its two sides and the host's
/// counters say.
fn measurement(
    t: TxStrategy,
    r: RxStrategy,
    w: &Workload,
    before: &Counters,
    txo: &TxOutcome,
    rxo: &RxOutcome,
) -> Measurement {
    let sink = w.net == Some(Profile::Sink);
    let soft = match (before.softirq_ns, procfs::softirq_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let busy = match (before.busy_ns, procfs::busy_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let drops = procfs::rcvbuf_errors()
        .saturating_sub(before.drops)
        .max(rxo.kernel_drops);
    let secs = txo.seconds.max(1e-9);
    // In the sink profile nothing is received: the transmit side is measured.
    let (bytes, datagrams) = if sink {
        (txo.bytes, txo.datagrams)
    } else {
        (rxo.bytes, rxo.datagrams)
    };
    let per_byte = |d: f64| if bytes > 0 { d / bytes as f64 } else { 0.0 };
    Measurement {
        tx: t,
        rx: if sink {
            "sink".into()
        } else if t.is_tcp() {
            "tcp".into()
        } else {
            rname(r)
        },
        bytes,
        datagrams,
        seconds: secs,
        mbytes_per_sec: bytes as f64 / secs / 1e6,
        gbps: bytes as f64 * 8.0 / secs / 1e9,
        datagrams_per_sec: datagrams as f64 / secs,
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
        all_cpu_ns_per_byte: per_byte(busy as f64),
        sent: txo.datagrams,
        // From sequence numbers where every datagram carries one (payload of
        // 8 bytes or more), else from counts; TCP loses nothing.
        lost: (!sink).then(|| {
            let got = if t.is_tcp() || rxo.unsequenced > 0 {
                rxo.datagrams
            } else {
                rxo.unique
            };
            txo.datagrams.saturating_sub(got)
        }),
        kernel_drops: drops,
        speedup_vs_sendto: None,
        speedup_vs_recvfrom: None,
        zerocopy_completions: txo.zerocopy.map(|z| z.0),
        zerocopy_copied: txo.zerocopy.map(|z| z.1),
        host_steal: before
            .ticks
            .zip(procfs::CpuTicks::now())
            .and_then(|(a, b)| b.steal_since(&a)),
    }
}

/// Sets `--busy-poll` on a receiving socket; refused, a runtime failure
/// (the socket call failed).
fn busy_poll(s: &impl std::os::fd::AsRawFd, w: &Workload) -> anyhow::Result<()> {
    let Some(us) = w.busy_poll else {
        return Ok(());
    };
    fastudp_tools::raw::set_option_int(s, libc::SOL_SOCKET, libc::SO_BUSY_POLL, us as i32).map_err(
        |e| anyhow!("--busy-poll {us}: SO_BUSY_POLL: {e} (above net.core.busy_read it needs root)"),
    )
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
            (vec!["--busy-poll", "0"], "--busy-poll"),
            (vec!["--busy-poll", "1000001"], "--busy-poll"),
        ] {
            let e = validate(&args(&a)).unwrap_err();
            assert!(e.to_string().contains(needle), "{a:?}: {e}");
            assert_eq!(crate::failure::exit_status(&e), 2, "{a:?}: a usage error");
        }
        // IPv6 on loopback: the datagram must fit lo's MTU (65536: 65488
        // bytes of payload), below the protocol's 65527.
        let mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(65_536);
        let fit = (mtu - 48).min(65_527).to_string();
        let over = (mtu - 47).to_string();
        assert!(validate(&args(&["--payload", &fit, "--ipv6"])).is_ok());
        if mtu - 47 <= 65_527 {
            let e = validate(&args(&["--payload", &over, "--ipv6"])).unwrap_err();
            assert!(e.to_string().contains("MTU"), "{e}");
        }
    }

    #[test]
    fn segments_per_buffer_respect_the_byte_limit() {
        let w = validate(&args(&["--payload", "1216", "--batch", "64"])).unwrap();
        assert_eq!(w.segs, 53); // 53 * 1216 = 64448 <= 65507
        let w = validate(&args(&["--payload", "1216"])).unwrap();
        assert_eq!(w.segs, 32);
    }

    #[test]
    fn pairings() {
        use RxStrategy as R;
        use TxStrategy as T;
        let all = plan_pairs(&[], &[], false).unwrap();
        assert_eq!(
            all.len(),
            TxStrategy::value_variants().len() + RxStrategy::value_variants().len() - 1
        );
        assert!(
            all.contains(&(T::Sendto, R::GroRecvmmsg)) && all.contains(&(T::Fastudp, R::Recvfrom))
        );
        assert_eq!(
            plan_pairs(&[T::Sendto], &[], false).unwrap(),
            vec![(T::Sendto, R::GroRecvmmsg)]
        );
        assert_eq!(
            plan_pairs(&[], &[R::Gro], false).unwrap(),
            vec![(T::Fastudp, R::Gro), (T::Fastudp, R::Recvfrom)]
        );
        assert_eq!(
            plan_pairs(&[T::Sendto, T::Tcp], &[R::Gro, R::Recvfrom], false)
                .unwrap()
                .len(),
            3,
            "TCP runs once"
        );
        assert_eq!(
            plan_pairs(&[T::Sendto, T::Sendto], &[R::Gro, R::Gro], false).unwrap(),
            vec![(T::Sendto, R::Gro)],
            "a strategy named twice runs once"
        );
        let sink = plan_pairs(&[], &[], true).unwrap();
        assert!(sink.iter().all(|&(t, _)| t != T::Tcp));
        let e = plan_pairs(&[T::Tcp], &[], true).unwrap_err();
        assert!(e.to_string().contains("sink"), "{e}");
        assert_eq!(crate::failure::exit_status(&e), 2, "a usage error");
        assert!(plan_pairs(&[], &[R::Gro], true).is_err());
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
