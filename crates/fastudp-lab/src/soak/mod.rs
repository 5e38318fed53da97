//! `fastudp-lab soak` (run through `scripts/soak.sh`): every send and
//! receive strategy in turn, paced below the path's capacity, across a
//! veth pair of the soak's own, while a fault injector breaks the path
//! once per slot and heals it. Every datagram is numbered and checksummed:
//! the run fails on a duplicate, a damaged datagram, loss outside a
//! fault's window, a fault the library did not report, a sender that
//! stalled (nothing sent after the heal arrives) or whose GSO did not come
//! back on, or memory or descriptors that grow. The rate after recovery is
//! measured against the slot's own rate before the fault and reported; it
//! never fails a run (a busy machine is slow, not broken).

pub mod account;
mod net;
mod recv;
pub mod report;
mod send;

use crate::interrupt;
use account::{attribute, Ledger, Window};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use report::{plan, FaultKind, FaultReport, Report, SlotReport, FAULTS};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of `fastudp-lab soak`.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Minutes to run (0.5 to 1440).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub minutes: f64,
    /// Datagrams per second (paced; below what any strategy sustains).
    #[arg(long, default_value_t = 10_000.0, allow_negative_numbers = true)]
    pub rate: f64,
    /// Datagram payload in bytes (over 1280 - 28, so that the MTU fault
    /// bites; at most 1452, which fits a 1500-byte MTU over IPv6).
    #[arg(long, default_value_t = 1400)]
    pub payload: usize,
    /// Write the report as JSON into this file.
    #[arg(long, value_name = "FILE.json")]
    pub json: Option<String>,
    /// Run only these slots of the plan (to replay a pairing and fault),
    /// sharing the minutes between them.
    #[arg(long, value_delimiter = ',')]
    pub slots: Vec<usize>,
}

/// State the sender, the receiver and the injector share.
#[derive(Debug)]
pub struct Shared {
    origin: Instant,
    /// The next sequence number to send (numbers before it went out).
    pub next_seq: AtomicU64,
    /// Tells the sender to stop.
    pub stop: AtomicBool,
    /// Set once the sender has stopped.
    pub sender_done: AtomicBool,
    /// Set once the receiver is bound.
    pub rx_ready: AtomicBool,
    /// `SO_NO_CHECK` wanted on the sending socket.
    pub no_check: AtomicBool,
    /// Asks the receiver to restart; it clears it when bound again.
    pub restart_rx: AtomicBool,
    /// Asks the receiver to squeeze its receive buffer (and stall once);
    /// cleared, to restore it.
    pub squeeze_rx: AtomicBool,
    /// The first number sent after a heal (`u64::MAX`: none armed).
    pub resume_after: AtomicU64,
    /// When that number, or a later one, arrived (ns from `origin`; 0: not yet).
    pub resumed_ns: AtomicU64,
    /// When a send last took datagrams.
    pub last_sent_ns: AtomicU64,
    tx_beat_ns: AtomicU64,
    rx_beat_ns: AtomicU64,
    /// The library's fallback events on the sending socket.
    pub fallbacks: AtomicU64,
    /// The library's datagrams resent one by one.
    pub resent: AtomicU64,
    /// The library's datagrams dropped by the sending host's full queue
    /// (`ENOBUFS`): counted as sent, and lost.
    pub dropped_locally: AtomicU64,
    /// The library's GSO retries.
    pub gso_retries: AtomicU64,
    /// The library's GSO segments per send now (1: off).
    pub gso_segments: AtomicU64,
    /// The library's messages sent (a GSO train counts once).
    pub messages: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn new() -> Self {
        Shared {
            origin: Instant::now(),
            next_seq: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sender_done: AtomicBool::new(false),
            rx_ready: AtomicBool::new(false),
            no_check: AtomicBool::new(false),
            restart_rx: AtomicBool::new(false),
            squeeze_rx: AtomicBool::new(false),
            resume_after: AtomicU64::new(u64::MAX),
            resumed_ns: AtomicU64::new(0),
            last_sent_ns: AtomicU64::new(0),
            tx_beat_ns: AtomicU64::new(0),
            rx_beat_ns: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            resent: AtomicU64::new(0),
            dropped_locally: AtomicU64::new(0),
            gso_retries: AtomicU64::new(0),
            gso_segments: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    /// ns since the run began (never 0).
    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64 + 1
    }

    /// The sender is alive.
    pub fn beat(&self) {
        self.tx_beat_ns.store(self.now_ns(), Relaxed);
    }

    /// The receiver is alive.
    pub fn rx_beat(&self) {
        self.rx_beat_ns.store(self.now_ns(), Relaxed);
    }

    /// Counts one send error.
    pub fn count_error(&self, name: String) {
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(name).or_default() += 1;
        }
    }

    fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn reset_slot(&self) {
        for f in [
            &self.stop,
            &self.sender_done,
            &self.rx_ready,
            &self.no_check,
            &self.restart_rx,
            &self.squeeze_rx,
        ] {
            f.store(false, Release);
        }
        self.resume_after.store(u64::MAX, Release);
        self.resumed_ns.store(0, Release);
        for c in [
            &self.fallbacks,
            &self.resent,
            &self.dropped_locally,
            &self.gso_retries,
            &self.gso_segments,
            &self.messages,
        ] {
            c.store(0, Release);
        }
        let now = self.now_ns();
        self.tx_beat_ns.store(now, Release);
        self.rx_beat_ns.store(now, Release);
        if let Ok(mut m) = self.errors.lock() {
            m.clear();
        }
    }
}

/// A thread that has not shown a sign of life for this long has hung.
const HANG: Duration = Duration::from_secs(10);
/// How long a fault is held.
const HOLD: Duration = Duration::from_secs(1);
/// Datagrams sent this long before a fault may still be in flight when it
/// strikes: its window starts that far back.
const IN_FLIGHT: Duration = Duration::from_millis(200);
/// After recovery, the window stays open this long.
const SETTLE: Duration = Duration::from_millis(500);
/// The longest a recovery may take before the slot gives up on it.
const RECOVERY_LIMIT: Duration = Duration::from_secs(12);

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fd_count() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn capture(args: &[&str]) -> String {
    std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Checks the options before anything is built: a value out of range is
/// a usage error (status 2).
fn validate(a: &SoakArgs) -> anyhow::Result<()> {
    if !(a.minutes >= 0.5 && a.minutes <= 1440.0) {
        bail_usage!("--minutes {} is out of range: 0.5 to 1440", a.minutes);
    }
    if !(a.rate >= 1000.0 && a.rate <= 100_000.0) {
        bail_usage!(
            "--rate {} is out of range: 1000 to 100000 datagrams per second",
            a.rate
        );
    }
    if !(1253..=1452).contains(&a.payload) {
        bail_usage!(
            "--payload {} is out of range: 1253 to 1452 bytes (over an MTU of 1280, within 1500 over IPv6)",
            a.payload
        );
    }
    if let Some(p) = &a.json {
        crate::output::check_output_path("--json", p)?;
    }
    if a.slots.len() > 10_000 {
        bail_usage!("--slots: {} slots, at most 10000", a.slots.len());
    }
    Ok(())
}

/// The slot plan for a run of `total`: at least 12 slots (every send
/// strategy, every receive strategy, every fault, both address families),
/// of 6 to 20 s.
fn slot_plan(total: Duration) -> (usize, Duration) {
    let secs = total.as_secs_f64();
    let n = ((secs / 20.0).ceil() as usize).max(send::STRATEGIES.len());
    (n, Duration::from_secs_f64((secs / n as f64).max(6.0)))
}

/// Runs the soak. Bad options, or a host without root, `ip` or `ethtool`,
/// are usage errors (status 2), found before anything is built. A pair
/// that cannot be built, a run that broke off, a report that cannot be
/// written and a failed verdict are runtime errors (status 1): the last
/// lists what failed. Ctrl-C reports the slots that ran (status 130).
pub fn run(a: SoakArgs) -> anyhow::Result<()> {
    validate(&a)?;
    interrupt::watch();
    let net = net::Net::up(net::Names::for_pid(std::process::id()))?;
    let mut report = Report {
        minutes: a.minutes,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kernel: capture(&["uname", "-r"]),
        load: vec![capture(&["uptime"])],
        rate: a.rate,
        payload: a.payload,
        ..Report::default()
    };
    let start = Instant::now();
    let r = soak(&a, &net, &mut report);
    report.seconds = start.elapsed().as_secs_f64();
    report.load.push(capture(&["uptime"]));
    drop(net);
    if let Err(e) = &r {
        report.failures.push(format!("{e:#}"));
    }
    report.finish();
    out!("{}", report::text(&report).trim_end())?;
    if let Some(p) = &a.json {
        let j = serde_json::to_string_pretty(&report).context("the report as JSON")?;
        std::fs::write(p, j + "\n").map_err(|e| anyhow!("cannot write {p}: {e}"))?;
    }
    if interrupt::requested() {
        return Err(interrupt::interrupted(
            "the report covers the slots that ran",
        ));
    }
    if !report.passed {
        bail!("the soak failed: {}", report.failures.join("; "));
    }
    Ok(())
}

/// One slot of the plan: its pairing, its fault and its length.
#[derive(Debug, Clone, Copy)]
struct Slot {
    i: usize,
    t: crate::engine::TxStrategy,
    r: crate::engine::RxStrategy,
    kind: FaultKind,
    dest: std::net::SocketAddr,
    len: Duration,
}

/// Runs the slots in turn (until Ctrl-C) into `report`; the first slot
/// that breaks off ends the run with its error.
fn soak(a: &SoakArgs, net: &net::Net, report: &mut Report) -> anyhow::Result<()> {
    let total = Duration::from_secs_f64(a.minutes * 60.0);
    let (slots, slot_len) = slot_plan(total);
    let order: Vec<usize> = if a.slots.is_empty() {
        (0..slots).collect()
    } else {
        a.slots.clone()
    };
    let slot_len = if a.slots.is_empty() {
        slot_len
    } else {
        Duration::from_secs_f64((total.as_secs_f64() / order.len() as f64).max(6.0))
    };
    let sh = Arc::new(Shared::new());
    let cap = (a.rate * (slot_len + RECOVERY_LIMIT + HOLD).as_secs_f64() * 1.5) as u64 + 4096;
    let mut ledger = Ledger::default();
    for (done, &i) in order.iter().enumerate() {
        if interrupt::requested() {
            break;
        }
        let (t, r, k, v6) = plan(i, send::STRATEGIES.len(), recv::STRATEGIES.len());
        let slot = Slot {
            i,
            t: send::STRATEGIES[t],
            r: recv::STRATEGIES[r],
            kind: FAULTS[k],
            dest: net::rx_addr(v6),
            len: slot_len,
        };
        let (slot, back) =
            run_slot(&slot, a, net, &sh, ledger, cap).with_context(|| format!("slot {i}"))?;
        ledger = back;
        let secs = sh.origin.elapsed().as_secs_f64();
        report.memory.rss_kb.push((secs, slot.rss_kb));
        report.memory.fds.push(slot.fds);
        eprintln!(
            "fastudp-lab: soak slot {i} ({}/{}): {} -> {} ({}), {}: sent {}, lost {} ({} outside), resume {}, GSO back {}",
            done + 1,
            order.len(),
            slot.tx,
            slot.rx,
            slot.family,
            slot.fault.kind,
            slot.sent,
            slot.lost,
            slot.lost_outside,
            slot.fault
                .resume_ms
                .map_or("-".into(), |v| format!("{v:.1} ms")),
            slot.fault
                .gso_back_ms
                .map_or("-".into(), |v| format!("{v:.0} ms")),
        );
        report.slots.push(slot);
    }
    Ok(())
}

/// Waits until `deadline`, watching for hung threads and Ctrl-C.
fn watch(sh: &Shared, deadline: Instant, tx_running: bool) -> anyhow::Result<()> {
    loop {
        let now = Instant::now();
        if now >= deadline || interrupt::requested() {
            return Ok(());
        }
        check_alive(sh, tx_running)?;
        std::thread::sleep((deadline - now).min(Duration::from_millis(1)));
    }
}

/// Fails if the sender (when running) or the receiver has hung.
fn check_alive(sh: &Shared, tx_running: bool) -> anyhow::Result<()> {
    let now = sh.now_ns();
    let hang = HANG.as_nanos() as u64;
    if tx_running && now.saturating_sub(sh.tx_beat_ns.load(Relaxed)) > hang {
        bail!("the sender hung (no progress for {} s)", HANG.as_secs());
    }
    if now.saturating_sub(sh.rx_beat_ns.load(Relaxed)) > hang {
        bail!("the receiver hung (no progress for {} s)", HANG.as_secs());
    }
    Ok(())
}

/// Joins `h`, failing if it does not end within `limit`.
fn join<T>(h: std::thread::JoinHandle<T>, limit: Duration, what: &str) -> anyhow::Result<T> {
    let until = Instant::now() + limit;
    while !h.is_finished() {
        if Instant::now() > until {
            bail!(
                "the {what} did not stop within {} s (hung)",
                limit.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    h.join().map_err(|_| anyhow!("the {what} panicked"))
}

/// The offloads of both ends, and the MTUs, to check that a heal restored
/// them.
fn offloads(net: &net::Net) -> String {
    let n = &net.names;
    let mut out = String::new();
    for (ns, dev) in [(&n.tx_ns, &n.tx_dev), (&n.rx_ns, &n.rx_dev)] {
        out.push_str(&capture(&["ip", "netns", "exec", ns, "ethtool", "-k", dev]));
        out.push_str(&capture(&[
            "ip",
            "netns",
            "exec",
            ns,
            "cat",
            &format!("/sys/class/net/{dev}/mtu"),
        ]));
    }
    out.lines()
        .filter(|l| !l.contains("[fixed]"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The receiver's thread: its result, and the ledger it filled.
type RxThread = std::thread::JoinHandle<(anyhow::Result<recv::RxResult>, Ledger)>;

/// Runs one slot: the receiver and the sender start, the fault strikes
/// after a lead, is held and healed, the slot waits for recovery and runs
/// to its end; then the ledger says what was lost, and where. Every error
/// is a runtime error (the caller names the slot).
fn run_slot(
    slot: &Slot,
    a: &SoakArgs,
    net: &net::Net,
    sh: &Arc<Shared>,
    mut ledger: Ledger,
    cap: u64,
) -> anyhow::Result<(SlotReport, Ledger)> {
    sh.reset_slot();
    let base = sh.next_seq.load(Acquire);
    ledger.reset(base, cap);
    let rx = start_rx(slot, a.payload, &net.names.rx_ns, sh, ledger)?;
    let tx = start_tx(slot, a, &net.names.tx_ns, sh);
    let slot_start = Instant::now();
    let seq_at_start = sh.next_seq.load(Acquire);
    let t0 = sh.origin.elapsed().as_secs_f64();
    let lead = (slot.len / 4).min(Duration::from_secs(3));
    watch(sh, slot_start + lead, true)?;
    let fault = strike_and_heal(slot, a.rate, net, sh, slot_start, seq_at_start)?;
    let after = recover(slot, sh, &fault, slot_start)?;
    sh.stop.store(true, Release);
    let fallback_reasons = join(tx, HANG, "sender")?.context("sender")?;
    sh.sender_done.store(true, Release);
    let (rres, ledger) = join(rx, HANG, "receiver")?;
    let rres = rres.context("receiver")?;
    let report = slot_report(
        slot,
        sh,
        &ledger,
        rres,
        fallback_reasons,
        &fault,
        &after,
        base,
        t0,
    );
    Ok((report, ledger))
}

/// Starts the receiver in its namespace and waits (up to 5 s) until it is
/// bound; a receiver that ended by then fails the slot with its error.
fn start_rx(
    slot: &Slot,
    payload: usize,
    rx_ns: &str,
    sh: &Arc<Shared>,
    mut ledger: Ledger,
) -> anyhow::Result<RxThread> {
    let (r, dest) = (slot.r, slot.dest);
    let rx = {
        let sh = Arc::clone(sh);
        let ns = rx_ns.to_string();
        std::thread::spawn(move || {
            let r = crate::testbed::enter(&ns)
                .and_then(|()| recv::run(r, dest, payload, &mut ledger, &sh));
            if r.is_err() {
                sh.rx_ready.store(true, Release);
            }
            (r, ledger)
        })
    };
    let until = Instant::now() + Duration::from_secs(5);
    while !sh.rx_ready.load(Acquire) {
        if Instant::now() > until || rx.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if rx.is_finished() {
        let (res, _) = rx.join().map_err(|_| anyhow!("the receiver panicked"))?;
        let e = res
            .err()
            .unwrap_or_else(|| anyhow!("it ended before it was bound"));
        return Err(e.context("receiver"));
    }
    Ok(rx)
}

/// Starts the sender in its namespace; it sends until `sh.stop`.
fn start_tx(
    slot: &Slot,
    a: &SoakArgs,
    tx_ns: &str,
    sh: &Arc<Shared>,
) -> std::thread::JoinHandle<anyhow::Result<Vec<String>>> {
    let sh = Arc::clone(sh);
    let ns = tx_ns.to_string();
    let (t, dest, payload, rate) = (slot.t, slot.dest, a.payload, a.rate);
    std::thread::spawn(move || {
        let r = crate::testbed::enter(&ns).and_then(|()| send::run(t, dest, payload, rate, &sh));
        sh.sender_done.store(true, Release);
        r
    })
}

/// The library's counters at one moment.
#[derive(Debug, Clone, Copy)]
struct Counters {
    fallbacks: u64,
    resent: u64,
    gso_retries: u64,
}

impl Counters {
    fn now(sh: &Shared) -> Self {
        Counters {
            fallbacks: sh.fallbacks.load(Acquire),
            resent: sh.resent.load(Acquire),
            gso_retries: sh.gso_retries.load(Acquire),
        }
    }
}

/// What the fault phase saw: from just before the fault to its heal.
#[derive(Debug)]
struct Fault {
    /// The first number of the fault's window.
    first: u64,
    /// When it struck, in s from the run's start.
    at_s: f64,
    struck: Instant,
    healed: Instant,
    healed_ns: u64,
    /// The slot's rate before the fault, datagrams per second.
    rate_before: Option<f64>,
    errors: BTreeMap<String, u64>,
    counters: Counters,
    gso_went_off: bool,
    offloads_restored: bool,
}

/// Strikes the slot's fault, holds it (watching the library's GSO) and
/// heals it; arms the resume check for the first number sent after.
fn strike_and_heal(
    slot: &Slot,
    rate: f64,
    net: &net::Net,
    sh: &Shared,
    slot_start: Instant,
    seq_at_start: u64,
) -> anyhow::Result<Fault> {
    let kind = slot.kind;
    let rate_per = |d: Duration| (rate * d.as_secs_f64()) as u64;
    let before = offloads(net);
    let errors = sh.errors();
    let counters = Counters::now(sh);
    let first = sh
        .next_seq
        .load(Acquire)
        .saturating_sub(rate_per(IN_FLIGHT));
    let struck = Instant::now();
    // The slot's own rate before the fault: what recovery is measured
    // against (the machine's load at this moment, not a configured rate).
    let before_dt = struck.duration_since(slot_start).as_secs_f64();
    let rate_before = (before_dt >= 0.5)
        .then(|| sh.next_seq.load(Acquire).saturating_sub(seq_at_start) as f64 / before_dt);
    let at_s = sh.origin.elapsed().as_secs_f64();
    let mut gso_went_off = false;
    let rx_gro = if kind == FaultKind::RxGroToggle {
        net.rx_gro()?
    } else {
        false
    };
    strike(kind, net, sh, rx_gro)?;
    // Held, watching the library's GSO.
    let hold_until = struck
        + if kind == FaultKind::RxRestart {
            recv::RESTART_GAP
        } else {
            HOLD
        };
    while Instant::now() < hold_until {
        check_alive(sh, true)?;
        gso_went_off |= sh.gso_segments.load(Acquire) == 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    heal(kind, net, sh, rx_gro)?;
    let healed = Instant::now();
    let healed_ns = sh.now_ns();
    sh.resumed_ns.store(0, Release);
    sh.resume_after.store(sh.next_seq.load(Acquire), Release);
    let offloads_restored = offloads(net) == before;
    Ok(Fault {
        first,
        at_s,
        struck,
        healed,
        healed_ns,
        rate_before,
        errors,
        counters,
        gso_went_off,
        offloads_restored,
    })
}

/// Breaks the path with fault `kind` (`rx_gro`: whether GRO is on now).
fn strike(kind: FaultKind, net: &net::Net, sh: &Shared, rx_gro: bool) -> anyhow::Result<()> {
    match kind {
        FaultKind::GsoRefused => sh.no_check.store(true, Release),
        FaultKind::LinkDown => net.link(false)?,
        FaultKind::Mtu1280 => net.mtu(1280, true)?,
        FaultKind::TxCsumOff => net.offload("tx", false)?,
        FaultKind::TxUdpSegOff => net.offload("tx-udp-segmentation", false)?,
        FaultKind::RxRestart => sh.restart_rx.store(true, Release),
        FaultKind::RxLinkDown => net.rx_link(false)?,
        FaultKind::RxMtu1280 => net.rx_mtu(1280)?,
        FaultKind::RxGroToggle => net.rx_offload("gro", !rx_gro)?,
        FaultKind::RxRcvbufSqueeze => sh.squeeze_rx.store(true, Release),
    }
    Ok(())
}

/// Heals what [`strike`] broke (`rx_gro`: whether GRO was on before).
fn heal(kind: FaultKind, net: &net::Net, sh: &Shared, rx_gro: bool) -> anyhow::Result<()> {
    match kind {
        FaultKind::GsoRefused => sh.no_check.store(false, Release),
        FaultKind::LinkDown => net.link(true)?,
        FaultKind::Mtu1280 => net.mtu(1500, false)?,
        FaultKind::TxCsumOff => net.offload("tx", true)?,
        FaultKind::TxUdpSegOff => net.offload("tx-udp-segmentation", true)?,
        FaultKind::RxRestart => {
            let until = Instant::now() + Duration::from_secs(5);
            while sh.restart_rx.load(Acquire) {
                if Instant::now() > until {
                    bail!("the receiver did not come back within 5 s");
                }
                check_alive(sh, true)?;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        FaultKind::RxLinkDown => net.rx_link(true)?,
        FaultKind::RxMtu1280 => net.rx_mtu(1500)?,
        FaultKind::RxGroToggle => net.rx_offload("gro", rx_gro)?,
        FaultKind::RxRcvbufSqueeze => sh.squeeze_rx.store(false, Release),
    }
    Ok(())
}

/// What the slot saw after the heal: recovery, then full speed to its end.
#[derive(Debug)]
struct After {
    gso_went_off: bool,
    /// When the library's GSO came back on (`None`: it did not stay on).
    gso_back: Option<Instant>,
    /// The end of the fault's window (numbers before it).
    window_end: u64,
    errors: BTreeMap<String, u64>,
    counters: Counters,
    /// Datagrams sent and messages from recovery to the slot's end, and
    /// over how many seconds.
    sent: u64,
    messages: u64,
    seconds: f64,
}

/// Waits for recovery (a datagram sent after the heal arrives, and the
/// library's GSO is back on if it went off; at most [`RECOVERY_LIMIT`]),
/// settles, then runs at full speed to the end of the slot.
fn recover(slot: &Slot, sh: &Shared, fault: &Fault, slot_start: Instant) -> anyhow::Result<After> {
    let library_gso = send::is_library(slot.t) && send::uses_gso(slot.t);
    let mut gso_went_off = fault.gso_went_off;
    let mut gso_back: Option<Instant> = None;
    let recovery_end = fault.healed + RECOVERY_LIMIT;
    loop {
        check_alive(sh, true)?;
        let g = sh.gso_segments.load(Acquire);
        gso_went_off |= g == 1;
        if gso_back.is_none() && g > 1 {
            gso_back = Some(Instant::now());
        }
        let resumed = sh.resumed_ns.load(Acquire) != 0;
        let gso_ok = !(library_gso && gso_went_off) || gso_back.is_some();
        if (resumed && gso_ok) || Instant::now() > recovery_end || interrupt::requested() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let recovered = Instant::now();
    watch(sh, recovered + SETTLE, true)?;
    let window_end = sh.next_seq.load(Acquire);
    let errors = sh.errors();
    let counters = Counters::now(sh);
    // Full speed to the end of the slot, with GSO (the library's trains
    // go out as one message each).
    let (rate_t0, msgs0) = (Instant::now(), sh.messages.load(Acquire));
    watch(
        sh,
        (slot_start + slot.len).max(rate_t0 + Duration::from_secs(1)),
        true,
    )?;
    let sent = sh.next_seq.load(Acquire) - window_end;
    let messages = sh.messages.load(Acquire).saturating_sub(msgs0);
    let seconds = rate_t0.elapsed().as_secs_f64();
    if library_gso && sh.gso_segments.load(Acquire) <= 1 {
        // Off again by the end: it did not stay back.
        gso_back = None;
    }
    Ok(After {
        gso_went_off,
        gso_back,
        window_end,
        errors,
        counters,
        sent,
        messages,
        seconds,
    })
}

/// The slot's report, from the ledger and what each phase saw.
#[allow(clippy::too_many_arguments)]
fn slot_report(
    slot: &Slot,
    sh: &Shared,
    ledger: &Ledger,
    rres: recv::RxResult,
    fallback_reasons: Vec<String>,
    fault: &Fault,
    after: &After,
    base: u64,
    t0: f64,
) -> SlotReport {
    let end = sh.next_seq.load(Acquire);
    let windows = [Window {
        first: fault.first,
        end: after.window_end,
    }];
    let att = attribute(ledger.missing(end), &windows);
    let lost = att.per_window[0] + att.outside;
    let mut errors = after.errors.clone();
    for (k, v) in &fault.errors {
        if let Some(x) = errors.get_mut(k) {
            *x -= v;
        }
    }
    errors.retain(|_, v| *v > 0);
    let resumed_ns = sh.resumed_ns.load(Acquire);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rate_after = (after.seconds >= 0.5).then(|| after.sent as f64 / after.seconds);
    let (c0, c1) = (fault.counters, after.counters);
    let fault_report = FaultReport {
        kind: slot.kind.name().into(),
        at_s: fault.at_s,
        held_ms: ms(fault.healed - fault.struck),
        lost: att.per_window[0],
        errors,
        fallbacks: c1.fallbacks.saturating_sub(c0.fallbacks),
        resent_unsegmented: c1.resent.saturating_sub(c0.resent),
        gso_retries: c1.gso_retries.saturating_sub(c0.gso_retries),
        gso_went_off: after.gso_went_off,
        resume_ms: (resumed_ns != 0)
            .then(|| resumed_ns.saturating_sub(fault.healed_ns) as f64 / 1e6),
        gso_back_ms: if after.gso_went_off {
            after
                .gso_back
                .map(|b| ms(b.saturating_duration_since(fault.healed)))
        } else {
            None
        },
        rate_before: fault.rate_before,
        rate_after,
        recovery_share: match (fault.rate_before, rate_after) {
            (Some(b), Some(a)) if b > 0.0 => Some(a / b),
            _ => None,
        },
        datagrams_per_message_after: (slot.t == crate::engine::TxStrategy::Fastudp
            && after.messages > 0)
            .then(|| after.sent as f64 / after.messages as f64),
        offloads_restored: fault.offloads_restored,
    };
    SlotReport {
        slot: slot.i,
        family: if slot.dest.is_ipv6() { "ipv6" } else { "ipv4" }.into(),
        tx: crate::engine::name(slot.t),
        rx: crate::engine::rname(slot.r),
        library: send::is_library(slot.t),
        gso: send::uses_gso(slot.t),
        seconds: sh.origin.elapsed().as_secs_f64() - t0,
        sent: end - base,
        received: ledger.received,
        lost,
        lost_outside: att.outside,
        lost_outside_examples: att.outside_examples,
        duplicates: ledger.duplicates,
        damaged: rres.damaged,
        stale: ledger.stale,
        beyond: ledger.beyond,
        kernel_drops: rres.kernel_drops,
        rcvbuf_errors: rres.rcvbuf_errors,
        dropped_locally: sh.dropped_locally.load(Acquire),
        fallback_reasons,
        fault: fault_report,
        rss_kb: rss_kb(),
        fds: fd_count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_everything_even_in_a_minute() {
        let (n, len) = slot_plan(Duration::from_secs(60));
        assert_eq!(n, 12);
        assert_eq!(len, Duration::from_secs(6));
        let (n, len) = slot_plan(Duration::from_secs(1800));
        assert_eq!(n, 90);
        assert_eq!(len, Duration::from_secs(20));
        // Never shorter than 6 s, whatever the count.
        assert_eq!(slot_plan(Duration::from_secs(30)).1, Duration::from_secs(6));
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        let a = |m: f64, r: f64, p: usize| SoakArgs {
            minutes: m,
            rate: r,
            payload: p,
            json: None,
            slots: Vec::new(),
        };
        assert!(validate(&a(1.0, 10_000.0, 1400)).is_ok());
        for (bad, want) in [
            (a(0.1, 10_000.0, 1400), "--minutes"),
            (a(f64::NAN, 10_000.0, 1400), "--minutes"),
            (a(1.0, 0.0, 1400), "--rate"),
            (a(1.0, 10_000.0, 1200), "--payload"),
            (a(1.0, 10_000.0, 1500), "--payload"),
            (a(1.0, 10_000.0, 1453), "--payload"),
        ] {
            let e = validate(&bad).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
            assert_eq!(
                fastudp_cli::failure::exit_status(&e),
                2,
                "{want}: a usage error"
            );
        }
    }
}
