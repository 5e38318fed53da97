//! The soak's report: what each slot and fault did, memory and
//! descriptors over time, and the verdict.

use serde::Serialize;
use std::collections::BTreeMap;

/// The faults the injector cycles through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `SO_NO_CHECK` on the sending socket: the kernel refuses every GSO
    /// send with `EINVAL` (the way to make a kernel >= 6.11 refuse GSO).
    GsoRefused,
    /// The sending link down, then up.
    LinkDown,
    /// The MTU from 1500 to 1280 (below the datagrams), then back.
    Mtu1280,
    /// tx checksum offload off, then on.
    TxCsumOff,
    /// tx-udp-segmentation off, then on.
    TxUdpSegOff,
    /// The receiver's socket closed and bound again.
    RxRestart,
    /// The receiving link down, then up: the sender is not told (its
    /// link stays up; the peer's carrier goes), so datagrams are lost in
    /// silence until it comes back.
    RxLinkDown,
    /// The receiving end's MTU from 1500 to 1280, the sending end's left
    /// at 1500: a veth drops frames over its peer's MTU, in silence.
    RxMtu1280,
    /// GRO of the receiving veth switched from its state to the other
    /// (on: NAPI mode, with a ring of its own), then back.
    RxGroToggle,
    /// The receiving socket's buffer squeezed to a few kB while its
    /// reader stalls for 100 ms, then restored: overflows, counted by the
    /// kernel as `RcvbufErrors`.
    RxRcvbufSqueeze,
}

/// Every fault, in the injector's order.
pub const FAULTS: [FaultKind; 10] = [
    FaultKind::GsoRefused,
    FaultKind::LinkDown,
    FaultKind::Mtu1280,
    FaultKind::TxCsumOff,
    FaultKind::TxUdpSegOff,
    FaultKind::RxRestart,
    FaultKind::RxLinkDown,
    FaultKind::RxMtu1280,
    FaultKind::RxGroToggle,
    FaultKind::RxRcvbufSqueeze,
];

impl FaultKind {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::GsoRefused => "gso-refused",
            FaultKind::LinkDown => "link-down",
            FaultKind::Mtu1280 => "mtu-1280",
            FaultKind::TxCsumOff => "tx-csum-off",
            FaultKind::TxUdpSegOff => "tx-udp-seg-off",
            FaultKind::RxRestart => "rx-restart",
            FaultKind::RxLinkDown => "rx-link-down",
            FaultKind::RxMtu1280 => "rx-mtu-1280",
            FaultKind::RxGroToggle => "rx-gro-toggle",
            FaultKind::RxRcvbufSqueeze => "rx-rcvbuf-squeeze",
        }
    }

    /// Whether it makes the kernel refuse a strategy's sends, so that a
    /// library strategy must report it (an error or a counted fallback).
    pub fn refuses_sends(self, gso: bool) -> bool {
        match self {
            FaultKind::GsoRefused => gso,
            FaultKind::LinkDown | FaultKind::Mtu1280 => true,
            _ => false,
        }
    }
}

/// Slot `i`'s send strategy, receive strategy, fault and address family
/// (`true`: IPv6): with 12 send and 5 receive strategies, every send
/// strategy, every fault and both families in 12 slots, every send
/// strategy in both families in 24, every pairing and every fault in
/// both families in 60, and each send strategy meets every fault within
/// 120.
pub fn plan(i: usize, n_tx: usize, n_rx: usize) -> (usize, usize, usize, bool) {
    let tx = i % n_tx;
    let rx = (i + i / (n_tx * n_rx)) % n_rx;
    let fault = (i + i / n_tx) % FAULTS.len();
    let v6 = (i / 2 + i / n_tx) % 2 == 1;
    (tx, rx, fault, v6)
}

/// One fault and what it did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FaultReport {
    /// The fault.
    pub kind: String,
    /// Seconds from the start of the run when it struck.
    pub at_s: f64,
    /// How long it was held, ms.
    pub held_ms: f64,
    /// Datagrams lost in its window.
    pub lost: u64,
    /// Send errors while it lasted, by errno (or library error).
    pub errors: BTreeMap<String, u64>,
    /// Fallbacks the library recorded while it lasted.
    pub fallbacks: u64,
    /// Datagrams the library resent one by one after a GSO refusal.
    pub resent_unsegmented: u64,
    /// Times the library tried GSO again.
    pub gso_retries: u64,
    /// Whether the library's GSO was off at some point.
    pub gso_went_off: bool,
    /// From the heal to the first arrival of a datagram sent after it, ms.
    pub resume_ms: Option<f64>,
    /// From the heal until the library's GSO was on again, ms (when it
    /// went off).
    pub gso_back_ms: Option<f64>,
    /// Datagrams per second sent before the fault, from the slot's start
    /// (the slot's own rate on this machine, at this moment).
    pub rate_before: Option<f64>,
    /// Datagrams per second sent after recovery, to the slot's end.
    pub rate_after: Option<f64>,
    /// `rate_after` over `rate_before`: how much of its own pre-fault rate
    /// the sender got back. Reported, never a reason to fail: a busy
    /// machine slows a sender without anything being wrong.
    pub recovery_share: Option<f64>,
    /// The library's datagrams per message after recovery (`fastudp`
    /// only): GSO trains of 10 when GSO is back on, 1 when it is not.
    pub datagrams_per_message_after: Option<f64>,
    /// Whether the offloads were as before once healed.
    pub offloads_restored: bool,
}

/// One slot: a pairing and its fault.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SlotReport {
    /// Its index.
    pub slot: usize,
    /// The address family: `ipv4` or `ipv6`.
    pub family: String,
    /// The send strategy.
    pub tx: String,
    /// The receive strategy.
    pub rx: String,
    /// Whether the sender is the library's.
    pub library: bool,
    /// Whether it sends GSO trains.
    pub gso: bool,
    /// Seconds it ran.
    pub seconds: f64,
    /// Datagrams the kernel took.
    pub sent: u64,
    /// Distinct datagrams that arrived intact.
    pub received: u64,
    /// Sent and never arrived.
    pub lost: u64,
    /// Lost outside the fault's window.
    pub lost_outside: u64,
    /// A few of those, to look for.
    pub lost_outside_examples: Vec<u64>,
    /// Arrived more than once.
    pub duplicates: u64,
    /// Failed their length or checksum check.
    pub damaged: u64,
    /// From an earlier slot.
    pub stale: u64,
    /// Numbers never sent.
    pub beyond: u64,
    /// Kernel drops at the receiving socket (messages; library sockets).
    pub kernel_drops: u64,
    /// Datagrams the receiving namespace dropped for a full receive
    /// buffer (`RcvbufErrors`): a receiver that did not keep up.
    pub rcvbuf_errors: u64,
    /// Datagrams the sending host's own queue dropped (the library's
    /// `ENOBUFS` from a full qdisc): counted as sent, and so as lost.
    pub dropped_locally: u64,
    /// The library's fallback reasons on the sending socket.
    pub fallback_reasons: Vec<String>,
    /// The fault.
    pub fault: FaultReport,
    /// Resident memory at the end, kB.
    pub rss_kb: u64,
    /// Open descriptors at the end.
    pub fds: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Minutes asked for.
    pub minutes: f64,
    /// Seconds it ran.
    pub seconds: f64,
    /// When it started (seconds since 1970).
    pub started_unix: u64,
    /// `uname -r`.
    pub kernel: String,
    /// `uptime` before and after.
    pub load: Vec<String>,
    /// Paced rate, datagrams per second.
    pub rate: f64,
    /// Datagram payload, bytes.
    pub payload: usize,
    /// Slots run.
    pub slots: Vec<SlotReport>,
    /// Totals.
    pub totals: Totals,
    /// Memory and descriptors.
    pub memory: Memory,
    /// Why the run failed; empty when it passed.
    pub failures: Vec<String>,
    /// Whether it passed.
    pub passed: bool,
}

/// Sums over the slots.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Totals {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Lost in fault windows.
    pub lost_in_faults: u64,
    /// Lost outside them.
    pub lost_outside: u64,
    /// Duplicates.
    pub duplicates: u64,
    /// Damaged.
    pub damaged: u64,
    /// Faults injected.
    pub faults: usize,
    /// Per fault kind: count, lost, worst resume and GSO-back times.
    pub per_fault: BTreeMap<String, FaultSummary>,
    /// Per send strategy.
    pub per_strategy: BTreeMap<String, StrategySummary>,
}

/// One send strategy over the run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct StrategySummary {
    /// Slots it sent in.
    pub slots: usize,
    /// Datagrams sent.
    pub sent: u64,
    /// Lost in fault windows.
    pub lost_in_faults: u64,
    /// Send errors in fault windows.
    pub errors: u64,
    /// Library fallbacks recorded in fault windows.
    pub fallbacks: u64,
}

/// One fault kind over the run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FaultSummary {
    /// Times injected.
    pub count: usize,
    /// Datagrams lost in its windows.
    pub lost: u64,
    /// Send errors while it lasted.
    pub errors: u64,
    /// Library fallbacks recorded.
    pub fallbacks: u64,
    /// Send errors by errno (or library error) over all its windows.
    pub error_kinds: BTreeMap<String, u64>,
    /// Median resume, ms.
    pub median_resume_ms: Option<f64>,
    /// Longest resume, ms.
    pub max_resume_ms: Option<f64>,
    /// Longest time until GSO was back, ms.
    pub max_gso_back_ms: Option<f64>,
}

/// Memory and descriptors.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Memory {
    /// RSS at each slot's end, kB, with the run's seconds.
    pub rss_kb: Vec<(f64, u64)>,
    /// The least-squares trend after warm-up, kB per hour.
    pub rss_trend_kb_per_hour: Option<f64>,
    /// Median growth after warm-up (last third minus first third), kB.
    pub rss_growth_kb: Option<f64>,
    /// Descriptors at each slot's end.
    pub fds: Vec<u64>,
}

/// Slots left out of the memory figures (allocator warm-up: every
/// strategy's buffers once): a third of the run, at most 10.
pub fn warmup_slots(slots: usize) -> usize {
    (slots / 3).min(10)
}
/// Fewest datagrams per message after recovery that show the library's
/// GSO on again.
pub const MIN_GSO_DATAGRAMS_PER_MESSAGE: f64 = 2.0;
/// Most RSS growth after warm-up that passes, kB.
pub const MAX_RSS_GROWTH_KB: f64 = 4096.0;

impl Report {
    /// Fills in the totals, the memory trend and the verdict.
    pub fn finish(&mut self) {
        let mut t = Totals::default();
        for s in &self.slots {
            t.sent += s.sent;
            t.received += s.received;
            t.lost_in_faults += s.lost - s.lost_outside;
            t.lost_outside += s.lost_outside;
            t.duplicates += s.duplicates;
            t.damaged += s.damaged;
            t.faults += 1;
            let f = t.per_fault.entry(s.fault.kind.clone()).or_default();
            f.count += 1;
            f.lost += s.fault.lost;
            f.errors += s.fault.errors.values().sum::<u64>();
            f.fallbacks += s.fault.fallbacks;
            let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            };
            f.max_resume_ms = max(f.max_resume_ms, s.fault.resume_ms);
            f.max_gso_back_ms = max(f.max_gso_back_ms, s.fault.gso_back_ms);
            for (k, v) in &s.fault.errors {
                *f.error_kinds.entry(k.clone()).or_default() += v;
            }
            let p = t.per_strategy.entry(s.tx.clone()).or_default();
            p.slots += 1;
            p.sent += s.sent;
            p.lost_in_faults += s.lost - s.lost_outside;
            p.errors += s.fault.errors.values().sum::<u64>();
            p.fallbacks += s.fault.fallbacks;
        }
        for (k, f) in t.per_fault.iter_mut() {
            let mut v: Vec<f64> = self
                .slots
                .iter()
                .filter(|s| &s.fault.kind == k)
                .filter_map(|s| s.fault.resume_ms)
                .collect();
            v.sort_by(|a, b| a.total_cmp(b));
            f.median_resume_ms = v.get(v.len() / 2).copied();
        }
        self.totals = t;
        let warmup = warmup_slots(self.memory.rss_kb.len());
        let after: Vec<(f64, f64)> = self
            .memory
            .rss_kb
            .iter()
            .skip(warmup)
            .map(|&(s, k)| (s, k as f64))
            .collect();
        self.memory.rss_trend_kb_per_hour = super::account::trend_per_hour(&after);
        let series: Vec<f64> = self.memory.rss_kb.iter().map(|&(_, k)| k as f64).collect();
        self.memory.rss_growth_kb = super::account::growth(&series, warmup);
        self.failures.extend(verdict(self));
        self.passed = self.failures.is_empty();
    }
}

/// Everything wrong with a finished run.
pub fn verdict(r: &Report) -> Vec<String> {
    let mut f = Vec::new();
    if r.slots.is_empty() {
        f.push("no slot ran".into());
    }
    for s in &r.slots {
        let id = format!("slot {} ({} -> {}, {})", s.slot, s.tx, s.rx, s.fault.kind);
        delivery(s, &id, &mut f);
        fault_handling(s, &id, &mut f);
    }
    leaks(r, &mut f);
    f
}

/// What went wrong with the datagrams of slot `s` (`id`): nothing went
/// through, or some arrived twice, damaged, unsent, or were lost outside
/// the fault's window.
fn delivery(s: &SlotReport, id: &str, f: &mut Vec<String>) {
    if s.sent == 0 || s.received == 0 {
        f.push(format!(
            "{id}: nothing went through ({} sent, {} received)",
            s.sent, s.received
        ));
    }
    if s.duplicates > 0 {
        f.push(format!("{id}: {} datagrams arrived twice", s.duplicates));
    }
    if s.damaged > 0 {
        f.push(format!("{id}: {} datagrams arrived damaged", s.damaged));
    }
    if s.beyond > 0 {
        f.push(format!(
            "{id}: {} datagrams carried numbers never sent",
            s.beyond
        ));
    }
    if s.lost_outside > 0 {
        let why = if s.rcvbuf_errors > 0 {
            format!(
                "; the receive buffer overflowed {} times: the receiver did not keep up",
                s.rcvbuf_errors
            )
        } else if s.dropped_locally > 0 {
            format!(
                "; the sending host's queue dropped {} (ENOBUFS: the qdisc was full)",
                s.dropped_locally
            )
        } else {
            String::new()
        };
        f.push(format!(
            "{id}: {} datagrams lost outside the fault's window (e.g. {:?}){why}",
            s.lost_outside, s.lost_outside_examples
        ));
    }
}

/// What went wrong with the fault of slot `s` (`id`) and the recovery
/// from it.
fn fault_handling(s: &SlotReport, id: &str, f: &mut Vec<String>) {
    let k = &s.fault;
    if k.resume_ms.is_none() {
        f.push(format!("{id}: no datagram sent after the heal arrived"));
    }
    if s.library && k.gso_went_off && k.gso_back_ms.is_none() {
        f.push(format!("{id}: the library's GSO did not come back on"));
    }
    if let Some(d) = k.datagrams_per_message_after {
        if d < MIN_GSO_DATAGRAMS_PER_MESSAGE {
            f.push(format!(
                "{id}: the library sent {d:.1} datagrams per message after recovery: GSO is not back on"
            ));
        }
    }
    if !k.offloads_restored {
        f.push(format!(
            "{id}: the offloads were not as before after the heal"
        ));
    }
    let gso_refused = k.kind == FaultKind::GsoRefused.name();
    let refused = FAULTS
        .iter()
        .find(|x| x.name() == k.kind)
        .is_some_and(|x| x.refuses_sends(s.gso));
    if s.library && refused && k.errors.is_empty() && k.fallbacks == 0 {
        f.push(format!(
            "{id}: the path refused sends but the library reported no error and no fallback"
        ));
    }
    if k.kind == FaultKind::RxRcvbufSqueeze.name() && k.lost > 0 && s.rcvbuf_errors == 0 {
        f.push(format!(
            "{id}: {} datagrams lost to a squeezed receive buffer that the kernel did not count (RcvbufErrors 0)",
            k.lost
        ));
    }
    if s.library
        && gso_refused
        && (s.tx == "fastudp" || s.tx == "uring-gso")
        && (k.fallbacks == 0 || k.lost > 0)
    {
        f.push(format!(
            "{id}: a GSO refusal must be a counted fallback with nothing lost ({} fallbacks, {} lost)",
            k.fallbacks, k.lost
        ));
    }
}

/// Descriptors or memory that grew over the run.
fn leaks(r: &Report, f: &mut Vec<String>) {
    if let Some(&first) = r.memory.fds.first() {
        if let Some(&bad) = r.memory.fds.iter().find(|&&n| n != first) {
            f.push(format!(
                "open descriptors changed from {first} to {bad} between slots"
            ));
        }
    }
    if let Some(g) = r.memory.rss_growth_kb {
        if g > MAX_RSS_GROWTH_KB {
            f.push(format!(
                "RSS grew by {g:.0} kB after warm-up (at most {MAX_RSS_GROWTH_KB:.0})"
            ));
        }
    }
}

/// The report as lines for people.
pub fn text(r: &Report) -> String {
    let mut o = String::new();
    let t = &r.totals;
    o += &format!(
        "soak: {:.1} min, {} slots, {:.0} datagrams/s x {} B, kernel {}\n",
        r.seconds / 60.0,
        r.slots.len(),
        r.rate,
        r.payload,
        r.kernel
    );
    o += &format!(
        "sent {}, received {}, lost in fault windows {}, lost outside {}, duplicates {}, damaged {}\n",
        t.sent, t.received, t.lost_in_faults, t.lost_outside, t.duplicates, t.damaged
    );
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} ms"));
    o += &format!(
        "{:<15} {:>5} {:>7} {:>8} {:>9} {:>11} {:>11} {:>12}  errors by kind\n",
        "fault", "count", "lost", "errors", "fallbacks", "med resume", "max resume", "max GSO back"
    );
    for (k, s) in &t.per_fault {
        let kinds: Vec<String> = s
            .error_kinds
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        o += &format!(
            "{:<15} {:>5} {:>7} {:>8} {:>9} {:>11} {:>11} {:>12}  {}\n",
            k,
            s.count,
            s.lost,
            s.errors,
            s.fallbacks,
            ms(s.median_resume_ms),
            ms(s.max_resume_ms),
            ms(s.max_gso_back_ms),
            kinds.join(", ")
        );
    }
    o += &format!(
        "{:<18} {:>5} {:>10} {:>14} {:>8} {:>9}\n",
        "send strategy", "slots", "sent", "lost in faults", "errors", "fallbacks"
    );
    for (k, s) in &t.per_strategy {
        o += &format!(
            "{:<18} {:>5} {:>10} {:>14} {:>8} {:>9}\n",
            k, s.slots, s.sent, s.lost_in_faults, s.errors, s.fallbacks
        );
    }
    let m = &r.memory;
    o += &format!(
        "RSS {} kB -> {} kB, trend {} kB/h, growth {} kB; descriptors {:?}\n",
        m.rss_kb.first().map_or(0, |x| x.1),
        m.rss_kb.last().map_or(0, |x| x.1),
        m.rss_trend_kb_per_hour
            .map_or("-".into(), |v| format!("{v:.0}")),
        m.rss_growth_kb.map_or("-".into(), |v| format!("{v:.0}")),
        {
            let mut d = m.fds.clone();
            d.dedup();
            d
        }
    );
    o += &recovery_line(r);
    if r.passed {
        o += "PASS\n";
    } else {
        for x in &r.failures {
            o += &format!("FAIL: {x}\n");
        }
    }
    o
}

/// How much of its own pre-fault rate each slot's sender got back after
/// the heal: the lowest share (with its slot) and the median. A figure for
/// people; the verdict never looks at rates, since a machine that is busy
/// with other work slows a sender without anything being wrong.
fn recovery_line(r: &Report) -> String {
    let mut v: Vec<(f64, &SlotReport)> = r
        .slots
        .iter()
        .filter_map(|s| s.fault.recovery_share.map(|x| (x, s)))
        .collect();
    if v.is_empty() {
        return String::new();
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (low, s) = v[0];
    let rate = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.0}"));
    format!(
        "recovery (rate after the heal / the slot's own rate before the fault): median {:.0}%, lowest {:.0}% in slot {} ({} -> {}, {}: {} datagrams/s before, {} after)\n",
        v[v.len() / 2].0 * 100.0,
        low * 100.0,
        s.slot,
        s.tx,
        s.rx,
        s.fault.kind,
        rate(s.fault.rate_before),
        rate(s.fault.rate_after)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_covers_every_strategy_pairing_and_fault() {
        use std::collections::HashSet;
        let p = |i| plan(i, 12, 5);
        // The shortest run (12 slots): every send strategy, every receive
        // strategy, every fault, both families.
        let tx: HashSet<usize> = (0..12).map(|i| p(i).0).collect();
        assert_eq!(tx.len(), 12);
        let rx: HashSet<usize> = (0..12).map(|i| p(i).1).collect();
        assert_eq!(rx.len(), 5);
        let faults: HashSet<usize> = (0..12).map(|i| p(i).2).collect();
        assert_eq!(faults.len(), FAULTS.len());
        let v6 = (0..12).filter(|&i| p(i).3).count();
        assert_eq!(v6, 6);
        // Each send strategy in both families within 24.
        let fam: HashSet<(usize, bool)> = (0..24).map(|i| (p(i).0, p(i).3)).collect();
        assert_eq!(fam.len(), 24);
        let pairs: HashSet<(usize, usize)> = (0..60).map(|i| (p(i).0, p(i).1)).collect();
        assert_eq!(pairs.len(), 60);
        for tx in 0..12 {
            let met: HashSet<usize> = (0..120).map(p).filter(|p| p.0 == tx).map(|p| p.2).collect();
            assert_eq!(met.len(), FAULTS.len(), "send strategy {tx}");
        }
        // Every fault in both families within 60.
        let kf: HashSet<(usize, bool)> = (0..60).map(|i| (p(i).2, p(i).3)).collect();
        assert_eq!(kf.len(), 2 * FAULTS.len());
        // The first slot: the library's sender against a GSO refusal.
        assert_eq!(p(0), (0, 0, 0, false));
        assert_eq!(FAULTS[0], FaultKind::GsoRefused);
    }

    fn good_slot(i: usize) -> SlotReport {
        SlotReport {
            slot: i,
            tx: "fastudp".into(),
            rx: "recvmmsg".into(),
            library: true,
            gso: true,
            seconds: 20.0,
            sent: 200_000,
            received: 199_990,
            lost: 10,
            fault: FaultReport {
                kind: "link-down".into(),
                lost: 10,
                errors: [("ENETUNREACH".to_string(), 900)].into(),
                resume_ms: Some(3.0),
                datagrams_per_message_after: Some(10.0),
                rate_before: Some(10_000.0),
                rate_after: Some(10_000.0),
                recovery_share: Some(1.0),
                offloads_restored: true,
                ..FaultReport::default()
            },
            rss_kb: 6000,
            fds: 8,
            ..SlotReport::default()
        }
    }

    fn report(slots: Vec<SlotReport>) -> Report {
        let mut r = Report {
            rate: 10_000.0,
            payload: 1400,
            memory: Memory {
                rss_kb: slots
                    .iter()
                    .map(|s| (s.slot as f64 * 20.0, s.rss_kb))
                    .collect(),
                fds: slots.iter().map(|s| s.fds).collect(),
                ..Memory::default()
            },
            slots,
            ..Report::default()
        };
        r.finish();
        r
    }

    #[test]
    fn a_clean_run_passes_and_sums_up() {
        let r = report((0..6).map(good_slot).collect());
        assert!(r.passed, "{:?}", r.failures);
        assert_eq!(r.totals.sent, 1_200_000);
        assert_eq!(r.totals.lost_in_faults, 60);
        assert_eq!(r.totals.lost_outside, 0);
        assert_eq!(r.totals.per_fault["link-down"].count, 6);
        assert_eq!(
            r.totals.per_fault["link-down"].error_kinds["ENETUNREACH"],
            5400
        );
        assert_eq!(r.totals.per_fault["link-down"].median_resume_ms, Some(3.0));
        assert_eq!(r.totals.per_strategy["fastudp"].slots, 6);
        assert_eq!(r.totals.per_strategy["fastudp"].lost_in_faults, 60);
        assert_eq!(r.memory.rss_trend_kb_per_hour, Some(0.0));
        assert!(text(&r).ends_with("PASS\n"));
    }

    #[test]
    fn each_defect_fails_the_run() {
        type Spoil = Box<dyn Fn(&mut SlotReport)>;
        let cases: Vec<(&str, Spoil)> = vec![
            ("twice", Box::new(|s| s.duplicates = 1)),
            ("damaged", Box::new(|s| s.damaged = 2)),
            ("outside", Box::new(|s| s.lost_outside = 1)),
            (
                "did not count",
                Box::new(|s| {
                    s.fault.kind = "rx-rcvbuf-squeeze".into();
                    s.rcvbuf_errors = 0;
                }),
            ),
            (
                "overflowed 5 times",
                Box::new(|s| {
                    s.lost_outside = 5;
                    s.rcvbuf_errors = 5;
                }),
            ),
            ("never sent", Box::new(|s| s.beyond = 1)),
            ("nothing went through", Box::new(|s| s.received = 0)),
            ("after the heal", Box::new(|s| s.fault.resume_ms = None)),
            (
                "GSO did not come back",
                Box::new(|s| s.fault.gso_went_off = true),
            ),
            ("offloads", Box::new(|s| s.fault.offloads_restored = false)),
            (
                "GSO is not back on",
                Box::new(|s| s.fault.datagrams_per_message_after = Some(1.0)),
            ),
            (
                "no error and no fallback",
                Box::new(|s| s.fault.errors.clear()),
            ),
            (
                "counted fallback",
                Box::new(|s| {
                    s.fault.kind = "gso-refused".into();
                    s.fault.fallbacks = 0;
                }),
            ),
            (
                "counted fallback",
                Box::new(|s| {
                    s.fault.kind = "gso-refused".into();
                    s.fault.fallbacks = 1;
                    s.fault.lost = 3;
                }),
            ),
        ];
        for (want, spoil) in cases {
            let mut slots: Vec<SlotReport> = (0..6).map(good_slot).collect();
            spoil(&mut slots[3]);
            let r = report(slots);
            assert!(!r.passed, "{want}");
            assert!(
                r.failures.iter().any(|f| f.contains(want)),
                "{want}: {:?}",
                r.failures
            );
            assert!(text(&r).contains("FAIL: "));
        }
        // A fault that refuses nothing needs no error (tx-csum-off on a
        // kernel that checksums GSO in software).
        let mut slots: Vec<SlotReport> = (0..6).map(good_slot).collect();
        slots[3].fault.kind = "tx-csum-off".into();
        slots[3].fault.errors.clear();
        assert!(report(slots).passed);
    }

    /// A slow recovery on a busy machine is reported against the slot's
    /// own pre-fault rate, and never fails the run: 8788 datagrams/s after
    /// recovery against 10,000 before is a figure, not a failure.
    #[test]
    fn a_slow_recovery_is_reported_not_failed() {
        let mut slots: Vec<SlotReport> = (0..6).map(good_slot).collect();
        slots[2].fault.rate_before = Some(9_500.0);
        slots[2].fault.rate_after = Some(8_788.0);
        slots[2].fault.recovery_share = Some(8_788.0 / 9_500.0);
        slots[4].fault.rate_after = Some(2_000.0);
        slots[4].fault.recovery_share = Some(0.2);
        let r = report(slots);
        assert!(r.passed, "{:?}", r.failures);
        let t = text(&r);
        assert!(t.contains("PASS"), "{t}");
        assert!(
            t.contains("median 100%, lowest 20% in slot 4 (fastudp -> recvmmsg, link-down: 10000 datagrams/s before, 2000 after)"),
            "{t}"
        );
    }

    #[test]
    fn leaks_of_memory_or_descriptors_fail_the_run() {
        let mut slots: Vec<SlotReport> = (0..9).map(good_slot).collect();
        slots[7].fds = 9;
        let r = report(slots);
        assert!(r
            .failures
            .iter()
            .any(|f| f.contains("descriptors changed from 8 to 9")));
        let mut slots: Vec<SlotReport> = (0..9).map(good_slot).collect();
        for (i, s) in slots.iter_mut().enumerate() {
            s.rss_kb = 6000 + 2000 * i as u64;
        }
        let r = report(slots);
        assert!(
            r.failures.iter().any(|f| f.contains("RSS grew")),
            "{:?}",
            r.failures
        );
        assert!(r.memory.rss_trend_kb_per_hour.unwrap() > 100_000.0);
        // Warm-up growth alone passes.
        let mut slots: Vec<SlotReport> = (0..9).map(good_slot).collect();
        slots[0].rss_kb = 1000;
        slots[2].rss_kb = 9000;
        assert!(report(slots).passed);
        assert_eq!(warmup_slots(9), 3);
        assert_eq!(warmup_slots(90), 10);
    }
}
