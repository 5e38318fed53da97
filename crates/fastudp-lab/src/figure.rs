//! `fastudp-lab figure 1|3|5`: the rows of the paper's Figures 1, 3
//! and 5 ("Optimizing UDP for content delivery: GSO, pacing and
//! zerocopy") side by side on the testbed.
//!
//! Each row runs on its testbed profile, with the sending veth's offload
//! features set for that row (`ethtool -K`, and `gso_max_segs` for TCP
//! without segmentation offload), and set back after it: after a failed
//! row and Ctrl-C too. A second Ctrl-C, which exits at once, sets them
//! back on the way out.

use anyhow::anyhow;
use clap::Args;
use fastudp_cli::bench::{self, plot, profile_name, run_pair, BenchArgs, Measurement, Moving};
use fastudp_cli::engine::report::Host;
use fastudp_cli::engine::{RxStrategy, TxStrategy, Workload};
use fastudp_cli::interrupt;
use fastudp_cli::testbed::{self, Profile};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Options of `fastudp-lab figure`: the figure, and the options of
/// `fastudp bench` that go with it.
#[derive(Args, Debug, Clone)]
pub struct FigureArgs {
    /// The paper's Figure 1 (TCP and UDP, with and without segmentation
    /// offload), 3 (with MSG_ZEROCOPY, warm and cache thrashing) or 5
    /// (recvfrom against GRO), run on the testbed (root), each row with
    /// its own offload features on the sending veth, set back after it;
    /// with the paper's ratios next to the measured ones.
    #[arg(value_name = "N")]
    pub figure: u8,
    /// The options of `fastudp bench`.
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// Runs `fastudp-lab figure N`, after its checks: the figure's own,
/// root, and the workload's as on the testbed.
pub fn main(f: FigureArgs) -> anyhow::Result<()> {
    let (n, a) = (f.figure, &f.bench);
    validate(n, a)?;
    testbed::preflight().map_err(Moving::usage)?;
    // Checked as a testbed run: a segment must fit the veth's MTU.
    let mut w = bench::validate(&BenchArgs {
        testbed: Some(Profile::WireGro),
        ..a.clone()
    })?;
    // Full trains: as many datagrams per GSO buffer as fit 64 KB (the
    // size of TCP's GSO packets), and TCP writes of the same size.
    w.segs = full_train(w.payload);
    w.batch = w.segs;
    run(a, n, w)
}

/// The figures `figure` reproduces.
pub const FIGURES: [u8; 3] = [1, 3, 5];

/// Set by tests only: the row (counted from 1) that fails on purpose
/// after its features were set, to show that they are set back.
pub const FAIL_ROW_ENV: &str = "FASTUDP_FIGURE_FAIL_ROW";

/// One row of a figure.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The row's name in the table, as the paper names it.
    pub label: &'static str,
    /// The sender.
    pub tx: TxStrategy,
    /// The receiver (TCP rows have their own).
    pub rx: RxStrategy,
    /// The testbed profile it runs on (unless `--on-testbed`).
    pub profile: Profile,
    /// `ethtool -K` features of the sending veth for this row.
    pub features: &'static [(&'static str, &'static str)],
    /// `ip link set ... gso_max_segs` of the sending veth for this row.
    pub gso_max_segs: Option<u32>,
    /// The sender rotates through a cache-sized ring (`--cache-thrash`).
    pub cache_thrash: bool,
}

const fn row(label: &'static str, tx: TxStrategy, rx: RxStrategy, profile: Profile) -> Row {
    Row {
        label,
        tx,
        rx,
        profile,
        features: &[],
        gso_max_segs: None,
        cache_thrash: false,
    }
}

/// The rows of figure `n`.
pub fn rows(n: u8) -> Vec<Row> {
    use Profile::*;
    use RxStrategy as R;
    use TxStrategy as T;
    match n {
        // Figure 1: the sender's cost, TCP and UDP, with and without
        // segmentation offload. On `wire-gro` UDP GSO trains are cut in
        // software before the veth, as TCP's are with `tso off`; the
        // receiver coalesces both again (NAPI GRO).
        1 => vec![
            Row {
                features: &[("tso", "off"), ("gso", "off")],
                // Since Linux 4.19 (commit 0a6b2a1dc2a2, "tcp: switch to
                // GSO being always on") TCP builds GSO packets whatever
                // the device's gso feature: only gso_max_segs 1 makes it
                // send MTU-sized packets from the socket.
                gso_max_segs: Some(1),
                ..row("TCP", T::Tcp, R::Recvfrom, WireGro)
            },
            Row {
                features: &[("tso", "off")],
                ..row("TCP gso", T::Tcp, R::Recvfrom, WireGro)
            },
            row("TCP tso", T::Tcp, R::Recvfrom, WireGro),
            row("UDP", T::Sendto, R::GroRecvmmsg, WireGro),
            row("UDP gso", T::Fastudp, R::GroRecvmmsg, WireGro),
        ],
        // Figure 3: copy avoidance, with and without cache thrashing. TCP
        // with TSO to a receiver (TCP needs one); UDP GSO into the sink,
        // where the trains leave the sending namespace whole.
        3 => {
            let mut v = Vec::new();
            for ct in [false, true] {
                for r in [
                    row("TCP tso", T::Tcp, R::Recvfrom, Offload),
                    row("TCP tso zerocopy", T::TcpZerocopy, R::Recvfrom, Offload),
                    row("UDP gso", T::GsoCmsg, R::GroRecvmmsg, Sink),
                    row("UDP gso zerocopy", T::GsoZerocopy, R::GroRecvmmsg, Sink),
                ] {
                    v.push(Row {
                        cache_thrash: ct,
                        ..r
                    });
                }
            }
            v
        }
        // Figure 5: the receiver's cost, one datagram per call against
        // GRO, where trains are cut on the way and where they cross whole.
        5 => vec![
            row("UDP (wire-gro)", T::Fastudp, R::Recvfrom, WireGro),
            row("UDP gro (wire-gro)", T::Fastudp, R::Gro, WireGro),
            row("UDP (offload)", T::Fastudp, R::Recvfrom, Offload),
            row("UDP gro (offload)", T::Fastudp, R::Gro, Offload),
        ],
        _ => Vec::new(),
    }
}

/// Checks figure `n` against the other options: each failure is a usage
/// error.
pub fn validate(n: u8, a: &BenchArgs) -> anyhow::Result<()> {
    if !FIGURES.contains(&n) {
        bail_usage!("figure {n}: the paper's figures reproduced here are 1, 3 and 5");
    }
    if !a.tx.is_empty() || !a.rx.is_empty() {
        bail_usage!("a figure runs its own rows: drop --tx and --rx");
    }
    if a.testbed.is_some() {
        bail_usage!(
            "a figure builds the testbed profile each row needs: drop --testbed (or use --on-testbed to run every row on the testbed that is up)"
        );
    }
    if a.cache_thrash {
        bail_usage!("a figure sets --cache-thrash per row (figure 3 runs both): drop it");
    }
    if a.batch != fastudp_cli::engine::DEFAULT_BATCH {
        bail_usage!("a figure sends full 64 KB GSO trains, as TCP's GSO packets are: drop --batch");
    }
    if a.ipv6 {
        bail_usage!("a figure runs over IPv4, as the paper did: drop --ipv6");
    }
    Ok(())
}

/// Datagrams of `payload` bytes in a full GSO train: as many as fit the
/// 65507 bytes of a UDP datagram, within the kernel's segment limit.
pub fn full_train(payload: usize) -> usize {
    let kmax = fastudp_tools::os::kernel_max_segments().max(1);
    (fastudp_tools::wire::MAX_PAYLOAD_V4 / payload.max(1))
        .min(kmax)
        .max(1)
}

/// The offload state of the sending veth: its changeable `ethtool -k`
/// features and its `gso_max_segs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DevState {
    /// Feature name to "on" or "off" (fixed features left out).
    pub features: BTreeMap<String, String>,
    /// The device's `gso_max_segs`.
    pub gso_max_segs: u32,
}

fn tx_ns(args: &[&str]) -> anyhow::Result<String> {
    let mut v = vec!["ip", "netns", "exec", testbed::TX_NS];
    v.extend_from_slice(args);
    testbed::run_cmd(&v).map_err(Moving::runtime)
}

/// Parses `ethtool -k` output: the features that can be changed.
pub fn parse_features(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter(|l| !l.contains("[fixed]") && l.starts_with(|c: char| c.is_ascii_lowercase()))
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let v = v.split_whitespace().next()?;
            matches!(v, "on" | "off").then(|| (k.trim().to_string(), v.to_string()))
        })
        .collect()
}

/// Parses `gso_max_segs N` out of `ip -d link show` output.
pub fn parse_gso_max_segs(s: &str) -> Option<u32> {
    let mut it = s.split_whitespace();
    while let Some(w) = it.next() {
        if w == "gso_max_segs" {
            return it.next()?.parse().ok();
        }
    }
    None
}

/// Reads the sending veth's state now.
pub fn dev_state() -> anyhow::Result<DevState> {
    let k = tx_ns(&["ethtool", "-k", testbed::TX_DEV])?;
    let l = tx_ns(&["ip", "-d", "link", "show", "dev", testbed::TX_DEV])?;
    Ok(DevState {
        features: parse_features(&k),
        gso_max_segs: parse_gso_max_segs(&l)
            .ok_or_else(|| anyhow!("no gso_max_segs in `ip -d link show {}`", testbed::TX_DEV))?,
    })
}

fn set_gso_max_segs(n: u32) -> anyhow::Result<()> {
    testbed::run_cmd(&[
        "ip",
        "-n",
        testbed::TX_NS,
        "link",
        "set",
        testbed::TX_DEV,
        "gso_max_segs",
        &n.to_string(),
    ])
    .map(|_| ())
    .map_err(Moving::runtime)
}

/// Sets the device back to `want`: every feature that differs now, then
/// `gso_max_segs`; then checks that it is back.
pub fn restore(want: &DevState) -> anyhow::Result<()> {
    let now = dev_state()?;
    if now.gso_max_segs != want.gso_max_segs {
        set_gso_max_segs(want.gso_max_segs)?;
    }
    let diff: Vec<(&String, &String)> = want
        .features
        .iter()
        .filter(|(k, v)| now.features.get(*k) != Some(*v))
        .collect();
    if !diff.is_empty() {
        let mut args = vec!["ethtool", "-K", testbed::TX_DEV];
        for (k, v) in &diff {
            args.push(k);
            args.push(v);
        }
        tx_ns(&args)?;
    }
    let after = dev_state()?;
    if &after != want {
        let off: Vec<String> = want
            .features
            .iter()
            .filter(|(k, v)| after.features.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k} should be {v}"))
            .collect();
        return Err(anyhow!(
            "the features of {} could not be set back: {}{}",
            testbed::TX_DEV,
            off.join(", "),
            if after.gso_max_segs != want.gso_max_segs {
                format!(
                    " gso_max_segs is {}, was {}",
                    after.gso_max_segs, want.gso_max_segs
                )
            } else {
                String::new()
            }
        ));
    }
    Ok(())
}

/// The state to go back to if a second Ctrl-C ends the program while a
/// row's features are set.
static SAVED: Mutex<Option<DevState>> = Mutex::new(None);

fn restore_saved() {
    let saved = SAVED.lock().ok().and_then(|mut s| s.take());
    if let Some(s) = saved {
        match restore(&s) {
            Ok(()) => eprintln!("fastudp-lab: {} features set back", testbed::TX_DEV),
            Err(e) => eprintln!("fastudp-lab: {e:#}"),
        }
    }
}

/// Sets a row's features; sets them back when dropped.
struct Features {
    before: DevState,
    restored: bool,
}

impl Features {
    fn apply(r: &Row) -> anyhow::Result<Features> {
        let before = dev_state()?;
        if let Ok(mut s) = SAVED.lock() {
            *s = Some(before.clone());
        }
        let f = Features {
            before,
            restored: false,
        };
        if !r.features.is_empty() {
            let mut args = vec!["ethtool", "-K", testbed::TX_DEV];
            for (k, v) in r.features {
                args.extend([*k, *v]);
            }
            tx_ns(&args)?;
        }
        if let Some(n) = r.gso_max_segs {
            set_gso_max_segs(n)?;
        }
        Ok(f)
    }

    fn restore(mut self) -> anyhow::Result<()> {
        self.restored = true;
        let r = restore(&self.before);
        if let Ok(mut s) = SAVED.lock() {
            *s = None;
        }
        r
    }
}

impl Drop for Features {
    fn drop(&mut self) {
        if !self.restored {
            if let Err(e) = restore(&self.before) {
                eprintln!("fastudp-lab: {e:#}");
            }
            if let Ok(mut s) = SAVED.lock() {
                *s = None;
            }
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    /// The row's name.
    pub label: String,
    /// The testbed profile it ran on.
    pub profile: String,
    /// The features it set on the sending veth (`name value`).
    pub features: Vec<String>,
    /// The `gso_max_segs` it set, if any.
    pub gso_max_segs: Option<u32>,
    /// Whether the sender rotated through a cache-sized ring.
    pub cache_thrash: bool,
    /// The measurement.
    #[serde(flatten)]
    pub m: Measurement,
}

/// A ratio of this run next to the paper's.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    /// What is compared.
    pub what: String,
    /// Measured here.
    pub measured: f64,
    /// The paper's.
    pub paper: f64,
}

fn find<'a>(rs: &'a [RowResult], label: &str, ct: bool) -> Option<&'a Measurement> {
    rs.iter()
        .find(|r| r.label == label && r.cache_thrash == ct)
        .map(|r| &r.m)
}

/// Adds a ratio to `out` where it could be measured.
fn push(out: &mut Vec<Ratio>, what: &str, v: Option<f64>, paper: f64) {
    if let Some(v) = v.filter(|v| v.is_finite()) {
        out.push(Ratio {
            what: what.into(),
            measured: v,
            paper,
        });
    }
}

/// Sender CPU per byte of row `b` over row `a`: how many times more
/// efficient `a` is (the paper's "speed-up").
fn eff(rs: &[RowResult], a: &str, b: &str, ct: bool) -> Option<f64> {
    Some(find(rs, b, ct)?.tx_cpu_ns_per_byte / find(rs, a, ct)?.tx_cpu_ns_per_byte)
}

/// The ratios each figure is compared by, where both rows ran.
pub fn ratios(n: u8, rs: &[RowResult]) -> Vec<Ratio> {
    let mut out = Vec::new();
    match n {
        1 => figure_1_ratios(rs, &mut out),
        3 => figure_3_ratios(rs, &mut out),
        5 => figure_5_ratios(rs, &mut out),
        _ => {}
    }
    out
}

/// Figure 1: the sender's efficiency, TCP and UDP.
fn figure_1_ratios(rs: &[RowResult], out: &mut Vec<Ratio>) {
    // The paper: Mcycles/s at line rate, so cycles per byte; its
    // "speed-up" is TCP's cycles per byte over the row's.
    // The paper's "speed-up" column (TCP without segmentation ran
    // at 9.3 Gbit/s, the others at line rate, 10).
    for (label, paper) in [
        ("TCP gso", 1.62),
        ("TCP tso", 4.87),
        ("UDP", 1.07),
        ("UDP gso", 1.74),
    ] {
        push(
            out,
            &format!("sender efficiency of {label} over TCP without segmentation"),
            eff(rs, label, "TCP", false),
            paper,
        );
    }
    push(
        out,
        "sender efficiency of UDP gso over TCP gso (both segmenting in software)",
        eff(rs, "UDP gso", "TCP gso", false),
        1856.0 / 1727.0,
    );
    let cost = |f: fn(&Measurement) -> f64| {
        Some(f(find(rs, "TCP gso", false)?) / f(find(rs, "UDP gso", false)?))
    };
    push(
        out,
        "receiver efficiency of UDP gso over TCP gso",
        cost(|m| m.rx_cpu_ns_per_byte),
        1.0,
    );
    push(
        out,
        "all-CPU efficiency of UDP gso over TCP gso",
        cost(|m| m.all_cpu_ns_per_byte),
        1856.0 / 1727.0,
    );
    push(
        out,
        "throughput of UDP gso over TCP gso",
        find(rs, "UDP gso", false)
            .zip(find(rs, "TCP gso", false))
            .map(|(u, t)| u.mbytes_per_sec / t.mbytes_per_sec),
        1.0,
    );
}

/// Figure 3: copy avoidance, warm and cache thrashing.
fn figure_3_ratios(rs: &[RowResult], out: &mut Vec<Ratio>) {
    for (label, zc, ct, paper) in [
        ("TCP tso", "TCP tso zerocopy", false, 618.0 / 425.0),
        ("UDP gso", "UDP gso zerocopy", false, 1727.0 / 1690.0),
        ("UDP gso", "UDP gso zerocopy", true, 1916.0 / 1694.0),
    ] {
        push(
            out,
            &format!(
                "sender efficiency of {zc} over {label}{}",
                if ct { ", cache thrashing" } else { "" }
            ),
            eff(rs, zc, label, ct),
            paper,
        );
    }
    push(
        out,
        "sender cost of UDP gso, cache thrashing over warm",
        find(rs, "UDP gso", true)
            .zip(find(rs, "UDP gso", false))
            .map(|(c, w)| c.tx_cpu_ns_per_byte / w.tx_cpu_ns_per_byte),
        1916.0 / 1727.0,
    );
}

/// Figure 5: the receiver's cost, recvfrom against GRO.
fn figure_5_ratios(rs: &[RowResult], out: &mut Vec<Ratio>) {
    for p in ["wire-gro", "offload"] {
        let (a, b) = (format!("UDP ({p})"), format!("UDP gro ({p})"));
        let (Some(x), Some(g)) = (find(rs, &a, false), find(rs, &b, false)) else {
            continue;
        };
        push(
            out,
            &format!("receive calls per byte, recvfrom over gro ({p})"),
            Some((x.rx_calls_per_sec / x.mbytes_per_sec) / (g.rx_calls_per_sec / g.mbytes_per_sec)),
            (568_000.0 / 798.0) / (40_250.0 / 1022.0),
        );
        push(
            out,
            &format!("throughput, gro over recvfrom ({p})"),
            Some(g.mbytes_per_sec / x.mbytes_per_sec),
            1022.0 / 798.0,
        );
        push(
            out,
            &format!("receiver efficiency, gro over recvfrom ({p})"),
            Some(x.rx_cpu_ns_per_byte / g.rx_cpu_ns_per_byte),
            (3564.0 / 798.0) / (2498.0 / 1022.0),
        );
    }
}

/// Runs figure `n` on the workload `w`.
pub fn run(a: &BenchArgs, n: u8, w: Workload) -> anyhow::Result<()> {
    let all = rows(n);
    let current = on_testbed(a, n, &all)?;
    let fail_row: Option<usize> = std::env::var(FAIL_ROW_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    interrupt::watch();
    interrupt::at_forced_exit(restore_saved);
    let host = fastudp_cli::engine::report::host_info();
    if !a.json {
        out!(
            "fastudp-lab figure {n}: {}, payload {} B, batch {}, {} datagrams per GSO buffer, {:.1} s per row{}",
            host.kernel,
            w.payload,
            w.batch,
            w.segs,
            a.duration,
            match current {
                Some(p) => format!(", every row on the testbed that is up ({})", profile_name(p)),
                None => String::new(),
            }
        )?;
    }
    let mut fig = Figure::default();
    fig.run_rows(a, &w, &all, current, fail_row);
    let rat = ratios(n, &fig.results);
    if a.json {
        let doc = serde_json::json!({ "schema": 1, "figure": n, "host": host, "workload": {
            "payload": w.payload, "batch": w.batch, "gso_segments": w.segs,
            "duration": a.duration, "repeat": a.repeat, "on_testbed": a.on_testbed },
            "rows": fig.results, "ratios": rat,
            "interrupted": fig.interrupted.is_some(), "interrupted_during": fig.interrupted });
        out!("{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        print_table(&fig.results, &rat)?;
    }
    if let (Some(path), false) = (&a.plot, fig.results.is_empty()) {
        draw_plot(path, a, n, &w, &host, &fig.results)?;
    }
    fig.end()
}

/// With `--on-testbed`, the profile of the testbed that is up, checked
/// against the rows (usage errors).
fn on_testbed(a: &BenchArgs, n: u8, all: &[Row]) -> anyhow::Result<Option<Profile>> {
    if !a.on_testbed {
        return Ok(None);
    }
    let current = testbed::current().map_err(Moving::usage)?;
    if current == Profile::Sink {
        if let Some(r) = all.iter().find(|r| r.tx.is_tcp()) {
            bail_usage!(
                "figure {n}'s row \"{}\" sends TCP, which needs a receiver: the sink profile has none",
                r.label
            );
        }
    }
    Ok(Some(current))
}

/// Draws the rows' chart of `--plot` and says where it went. A chart
/// that cannot be drawn is a runtime failure.
fn draw_plot(
    path: &str,
    a: &BenchArgs,
    n: u8,
    w: &Workload,
    host: &Host,
    results: &[RowResult],
) -> anyhow::Result<()> {
    let ms: Vec<Measurement> = results.iter().map(|r| r.m.clone()).collect();
    let labels: Vec<String> = results
        .iter()
        .map(|r| format!("{}{}", r.label, if r.cache_thrash { " (CT)" } else { "" }))
        .collect();
    let title = format!(
        "fastudp-lab figure {n}: {}, payload {} B, testbed veth",
        host.kernel, w.payload
    );
    plot::svg_labeled(path, &title, &ms, &labels)?;
    if a.json {
        eprintln!("fastudp-lab: plot written to {path}");
        Ok(())
    } else {
        out!("plot written to {path}")
    }
}

/// A figure's run: the testbed it built, the rows measured, and why it
/// stopped early, if it did.
#[derive(Default)]
struct Figure {
    /// The testbed built for the current row's profile.
    guard: Option<testbed::Guard>,
    /// That profile.
    built: Option<Profile>,
    /// The rows that finished.
    results: Vec<RowResult>,
    /// The failure that ended the figure early.
    failure: Option<anyhow::Error>,
    /// The row Ctrl-C cut short.
    interrupted: Option<String>,
}

impl Figure {
    /// Runs the rows until one fails or Ctrl-C comes, each on its own
    /// testbed profile (or on `current`, the one that is up).
    fn run_rows(
        &mut self,
        a: &BenchArgs,
        w: &Workload,
        all: &[Row],
        current: Option<Profile>,
        fail_row: Option<usize>,
    ) {
        for (i, r) in all.iter().enumerate() {
            let profile = current.unwrap_or(r.profile);
            if current.is_none() && !self.testbed_for(r, profile) {
                return;
            }
            let rw = Workload {
                net: Some(profile),
                cache_thrash: r.cache_thrash,
                ..*w
            };
            let fail = fail_row == Some(i + 1);
            let Some(m) = self.run_row(a, r, &rw, fail.then_some(i + 1)) else {
                return;
            };
            self.results.push(RowResult {
                label: r.label.into(),
                profile: profile_name(profile),
                features: r.features.iter().map(|(k, v)| format!("{k} {v}")).collect(),
                gso_max_segs: r.gso_max_segs,
                cache_thrash: r.cache_thrash,
                m,
            });
        }
    }

    /// Builds row `r`'s testbed profile unless it is up already; false
    /// (with the reason recorded) when it could not be built or Ctrl-C
    /// came first.
    fn testbed_for(&mut self, r: &Row, profile: Profile) -> bool {
        if self.built == Some(profile) {
            return true;
        }
        if interrupt::requested() {
            self.interrupted = Some(r.label.into());
            return false;
        }
        drop(self.guard.take());
        match testbed::up_guarded(profile) {
            Ok(g) => {
                self.guard = Some(g);
                self.built = Some(profile);
                true
            }
            Err(_) if interrupt::requested() => {
                self.interrupted = Some(r.label.into());
                false
            }
            Err(e) => {
                self.failure = Some(e.runtime());
                false
            }
        }
    }

    /// Runs row `r` `--repeat` times, each with its features set and set
    /// back after it; its median run, or `None` (with the reason
    /// recorded) when a run failed or Ctrl-C came. `fail` is the row's
    /// number when it is to fail on purpose ([`FAIL_ROW_ENV`]).
    fn run_row(
        &mut self,
        a: &BenchArgs,
        r: &Row,
        rw: &Workload,
        fail: Option<usize>,
    ) -> Option<Measurement> {
        let mut runs = Vec::new();
        for _ in 0..a.repeat {
            if interrupt::requested() {
                self.interrupted = Some(r.label.into());
                return None;
            }
            let feats = match Features::apply(r) {
                Ok(f) => f,
                Err(e) => {
                    self.failure = Some(e.context(r.label));
                    return None;
                }
            };
            let out = match fail {
                Some(i) => Err(anyhow!("row {i} failed on purpose ({FAIL_ROW_ENV} is set)")),
                None => run_pair(r.tx, r.rx, rw, a.quiet || a.json),
            };
            let restored = feats.restore();
            if interrupt::requested() {
                self.interrupted = Some(r.label.into());
                if let Err(e) = restored {
                    self.failure = Some(e);
                }
                return None;
            }
            match (out, restored) {
                (Ok(m), Ok(())) => runs.push(m),
                (Err(e), _) | (_, Err(e)) => {
                    self.failure = Some(e.context(r.label));
                    return None;
                }
            }
        }
        runs.sort_by_key(|m| m.bytes);
        Some(runs.swap_remove(runs.len() / 2))
    }

    /// Removes the testbed it built, and ends as the figure went: Ctrl-C
    /// (status 130), a failure (status 1), or done.
    fn end(mut self) -> anyhow::Result<()> {
        let removed = self.guard.take().is_some();
        if let Some(during) = self.interrupted {
            // Said before the interruption, not lost in it.
            if let Some(e) = self.failure {
                eprintln!("fastudp-lab: {e:#}");
            }
            return Err(interrupt::interrupted(&format!(
                "during \"{during}\"; {}{} features set back; the rows that finished are reported above",
                if removed { "testbed removed; " } else { "" },
                testbed::TX_DEV
            )));
        }
        match self.failure {
            None => Ok(()),
            Some(e) => Err(anyhow!(
                "{e:#} ({} features set back{})",
                testbed::TX_DEV,
                if self.results.is_empty() {
                    String::new()
                } else {
                    "; the rows that finished before it are reported above".into()
                }
            )),
        }
    }
}

fn print_table(rs: &[RowResult], rat: &[Ratio]) -> anyhow::Result<()> {
    out!()?;
    out!(
        "{:<24} {:<9} {:<28} {:>8} {:>9} {:>8} {:>8} {:>9} {:>8} {:>10} {:>10}",
        "row",
        "profile",
        "fu-tx",
        "MB/s",
        "calls/s",
        "tx ns/B",
        "rx ns/B",
        "sirq ns/B",
        "all ns/B",
        "rx call/s",
        "zc copied"
    )?;
    for r in rs {
        let mut f = r.features.join(", ");
        if let Some(g) = r.gso_max_segs {
            if !f.is_empty() {
                f.push_str(", ");
            }
            f.push_str(&format!("gso_max_segs {g}"));
        }
        if f.is_empty() {
            f = "as the profile".into();
        }
        out!(
            "{:<24} {:<9} {:<28} {:>8.1} {:>9.0} {:>8.3} {:>8.3} {:>9.3} {:>8.3} {:>10.0} {:>10}",
            format!("{}{}", r.label, if r.cache_thrash { " (CT)" } else { "" }),
            r.profile,
            f,
            r.m.mbytes_per_sec,
            r.m.tx_calls_per_sec,
            r.m.tx_cpu_ns_per_byte,
            r.m.rx_cpu_ns_per_byte,
            r.m.softirq_ns_per_byte,
            r.m.all_cpu_ns_per_byte,
            r.m.rx_calls_per_sec,
            match (r.m.zerocopy_completions, r.m.zerocopy_copied) {
                (Some(d), Some(c)) if d > 0 => format!("{:.0}%", c as f64 * 100.0 / d as f64),
                (Some(_), Some(_)) => "none".into(),
                _ => "-".into(),
            }
        )?;
    }
    for r in rs.iter().filter(|r| r.m.lost.is_some_and(|l| l > 0)) {
        out!(
            "{}: {} datagrams lost ({} receive-buffer drops counted by the kernel)",
            r.label,
            r.m.lost.unwrap_or(0),
            r.m.kernel_drops
        )?;
    }
    if !rat.is_empty() {
        out!()?;
        out!("{:<80} {:>9} {:>7}", "ratio", "measured", "paper")?;
        for x in rat {
            out!("{:<80} {:>8.2}x {:>6.2}x", x.what, x.measured, x.paper)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethtool_output_is_read_without_fixed_features() {
        let k = "Features for fu-tx:\nrx-checksumming: on\ntx-checksumming: on\n\ttx-checksum-ipv4: off [fixed]\n\ttx-checksum-ip-generic: on\ntcp-segmentation-offload: off\nhsr-fwd-offload: off [fixed]\nrx-gro-list: off\n";
        let f = parse_features(k);
        assert_eq!(
            f.get("tcp-segmentation-offload").map(|s| s.as_str()),
            Some("off")
        );
        assert_eq!(f.get("rx-gro-list").map(|s| s.as_str()), Some("off"));
        assert!(!f.contains_key("hsr-fwd-offload"));
        // Sub-features follow their parent: only top-level ones are set.
        assert!(!f.contains_key("tx-checksum-ip-generic"));
        assert_eq!(f.len(), 4);
    }

    #[test]
    fn gso_max_segs_is_found() {
        let l = "7: fu-tx@if6: <BROADCAST> mtu 1500\n    link/ether 1a:2b veth addrgenmode eui64 numtxqueues 2 gso_max_size 65536 gso_max_segs 65535 tso_max_size 524280";
        assert_eq!(parse_gso_max_segs(l), Some(65535));
        assert_eq!(parse_gso_max_segs("mtu 1500"), None);
        assert_eq!(parse_gso_max_segs("gso_max_segs"), None);
    }

    fn row(label: &str, ct: bool, mbps: f64, tx_ns: f64, rx_ns: f64, rx_calls: f64) -> RowResult {
        RowResult {
            label: label.into(),
            profile: "wire-gro".into(),
            features: Vec::new(),
            gso_max_segs: None,
            cache_thrash: ct,
            m: Measurement {
                tx: TxStrategy::Fastudp,
                rx: "gro".into(),
                bytes: 1,
                datagrams: 1,
                seconds: 1.0,
                mbytes_per_sec: mbps,
                gbps: mbps * 8.0 / 1e3,
                datagrams_per_sec: 0.0,
                tx_calls_per_sec: 0.0,
                bytes_per_call: 0.0,
                rx_calls_per_sec: rx_calls,
                tx_cpu_ns_per_byte: tx_ns,
                rx_cpu_ns_per_byte: rx_ns,
                softirq_ns_per_byte: 0.0,
                all_cpu_ns_per_byte: tx_ns + rx_ns,
                sent: 1,
                lost: Some(0),
                kernel_drops: 0,
                speedup_vs_sendto: None,
                speedup_vs_recvfrom: None,
                zerocopy_completions: None,
                zerocopy_copied: None,
                host_steal: None,
            },
        }
    }

    fn ratio(rat: &[Ratio], what: &str) -> Option<f64> {
        rat.iter().find(|r| r.what == what).map(|r| r.measured)
    }

    /// Each figure's ratios come from the rows they name, and only where
    /// both rows ran.
    #[test]
    fn ratios_compare_the_rows_they_name() {
        let rs = [
            row("TCP", false, 100.0, 8.0, 1.0, 0.0),
            row("TCP gso", false, 200.0, 4.0, 2.0, 0.0),
            row("UDP gso", false, 400.0, 2.0, 1.0, 0.0),
        ];
        let rat = ratios(1, &rs);
        let r = |w| ratio(&rat, w);
        assert_eq!(
            r("sender efficiency of TCP gso over TCP without segmentation"),
            Some(2.0)
        );
        assert_eq!(
            r("sender efficiency of UDP gso over TCP without segmentation"),
            Some(4.0)
        );
        assert_eq!(
            r("sender efficiency of TCP tso over TCP without segmentation"),
            None
        );
        assert_eq!(
            r("sender efficiency of UDP gso over TCP gso (both segmenting in software)"),
            Some(2.0)
        );
        assert_eq!(r("receiver efficiency of UDP gso over TCP gso"), Some(2.0));
        assert_eq!(r("all-CPU efficiency of UDP gso over TCP gso"), Some(2.0));
        assert_eq!(r("throughput of UDP gso over TCP gso"), Some(2.0));
        assert_eq!(rat.len(), 6);

        let rs = [
            row("UDP gso", false, 100.0, 2.0, 0.0, 0.0),
            row("UDP gso zerocopy", false, 100.0, 1.0, 0.0, 0.0),
            row("UDP gso", true, 100.0, 3.0, 0.0, 0.0),
        ];
        let rat = ratios(3, &rs);
        assert_eq!(
            ratio(&rat, "sender efficiency of UDP gso zerocopy over UDP gso"),
            Some(2.0)
        );
        assert_eq!(
            ratio(&rat, "sender cost of UDP gso, cache thrashing over warm"),
            Some(1.5)
        );
        assert_eq!(rat.len(), 2, "no cache-thrashing zerocopy row");

        let rs = [
            row("UDP (offload)", false, 100.0, 0.0, 4.0, 1000.0),
            row("UDP gro (offload)", false, 200.0, 0.0, 1.0, 100.0),
        ];
        let rat = ratios(5, &rs);
        assert_eq!(
            ratio(&rat, "receive calls per byte, recvfrom over gro (offload)"),
            Some(20.0)
        );
        assert_eq!(
            ratio(&rat, "throughput, gro over recvfrom (offload)"),
            Some(2.0)
        );
        assert_eq!(
            ratio(&rat, "receiver efficiency, gro over recvfrom (offload)"),
            Some(4.0)
        );
        assert_eq!(rat.len(), 3, "wire-gro did not run");
        assert!(ratios(2, &rs).is_empty());
    }

    #[test]
    fn every_figure_has_rows_and_paper_ratios_are_sane() {
        for n in FIGURES {
            let rs = rows(n);
            assert!(!rs.is_empty());
            for r in &rs {
                assert!(
                    r.tx.is_tcp() || r.profile != Profile::Sink || r.rx == RxStrategy::GroRecvmmsg
                );
                assert!(
                    !(r.tx.is_tcp() && r.profile == Profile::Sink),
                    "{}",
                    r.label
                );
            }
        }
        assert!(rows(2).is_empty());
        assert_eq!(full_train(1448), 45);
        assert_eq!(full_train(1216), 53);
        assert_eq!(full_train(65507), 1);
    }
}
