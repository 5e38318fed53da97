//! `fastudp tune`: apply (and revert) what `doctor` recommends, through
//! /proc/sys, sysfs and the ethtool ioctl, never through a shell.

pub mod change;
pub mod state;

use super::devices::{is_device, up_devices, GRO_FLUSH_NS, NAPI_DEFER};
use super::sysctl::{read_sysctl, SYSCTLS};
use anyhow::anyhow;
pub use change::{Change, Value, TUNE_FEATURES};
use clap::Args;
use state::State;
use std::path::Path;

/// Where `tune --apply` keeps the previous values unless `--state` says.
pub const DEFAULT_STATE: &str = "/var/lib/fastudp/tune-state.json";

/// Options of `fastudp tune`.
#[derive(Args, Debug, Clone)]
pub struct TuneArgs {
    /// Tune this device (default: every interface that is up, but lo).
    #[arg(long, value_name = "IFACE")]
    pub dev: Option<String>,
    /// Apply the plan (root). Without it, tune only prints the plan.
    #[arg(long, conflicts_with = "revert")]
    pub apply: bool,
    /// Where to save the previous values before applying.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_STATE)]
    pub state: String,
    /// Restore the values saved in FILE by an earlier --apply (root).
    #[arg(long, value_name = "FILE")]
    pub revert: Option<String>,
}

/// What `tune` will change, and what it will not (with the reason).
#[derive(Debug, Default)]
pub struct Plan {
    /// Changes to make, in order.
    pub changes: Vec<Change>,
    /// Recommendations tune does not apply, one line each.
    pub skipped: Vec<String>,
}

/// Builds the plan from the current settings.
pub fn plan(devs: &[String]) -> Plan {
    let mut p = Plan::default();
    let root = crate::testbed::is_root();
    for (name, min, _) in SYSCTLS {
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        // Some net.core sysctls are host-wide: absent or read-only inside a
        // network namespace.
        let here = std::path::Path::new(&path).exists()
            && (!root || std::fs::OpenOptions::new().write(true).open(&path).is_ok());
        match read_sysctl(name) {
            Ok(v) if v < min && here => p.changes.push(Change::Sysctl { name: name.into(), old: v, new: min }),
            Ok(v) if v < min => p.skipped.push(format!(
                "sysctl {name} ({v}, below {min}) is host-wide and read-only in this network namespace: set it from the host"
            )),
            Ok(_) => {}
            Err(_) if !here => p.skipped.push(format!(
                "sysctl {name} is host-wide and not visible in this network namespace: check it from the host"
            )),
            Err(e) => p.skipped.push(format!("sysctl {name}: {e:#}")),
        }
    }
    for dev in devs {
        let feats = match fastudp_tools::host::features(dev) {
            Ok(f) => f,
            Err(e) => {
                p.skipped
                    .push(format!("{dev}: cannot read its features: {e}"));
                continue;
            }
        };
        let veth = fastudp_tools::host::driver(dev).is_ok_and(|d| d == "veth");
        let want = TUNE_FEATURES
            .iter()
            .filter(|w| veth || **w != "rx-udp-gro-forwarding");
        for &w in want {
            match feats.iter().find(|f| f.name == w) {
                Some(f) if f.active => {}
                Some(f) if f.changeable => p.changes.push(Change::Feature {
                    dev: dev.clone(),
                    name: w.into(),
                    old: false,
                    new: true,
                }),
                Some(_) => p
                    .skipped
                    .push(format!("{dev}: cannot turn {w} on: fixed by its driver")),
                None if w == "tx-checksum-ip-generic" => {}
                None => p
                    .skipped
                    .push(format!("{dev}: the kernel has no feature {w}")),
            }
        }
        if veth {
            let ncpu = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1) as u32;
            match fastudp_tools::host::channels(dev) {
                Ok(c) if c.rx < 2 && c.max_rx >= 2 => {
                    let n = c.max_rx.min(ncpu.max(2));
                    p.changes.push(Change::Channels {
                        dev: dev.clone(),
                        old: (c.rx, c.tx),
                        new: (n, n.min(c.max_tx.max(1))),
                    })
                }
                Ok(_) => {}
                Err(e) => p
                    .skipped
                    .push(format!("{dev}: cannot read its channels: {e}")),
            }
            let probe = Change::GroFlushTimeout {
                dev: dev.clone(),
                old: 0,
                new: GRO_FLUSH_NS,
            };
            match probe.current() {
                Ok(Value::Num(0)) => p.changes.push(probe),
                Ok(_) => {}
                Err(e) => p.skipped.push(format!("{e:#}")),
            }
            let probe = Change::NapiDeferHardIrqs {
                dev: dev.clone(),
                old: 0,
                new: NAPI_DEFER,
            };
            match probe.current() {
                Ok(Value::Num(0)) => p.changes.push(probe),
                Ok(_) => {}
                Err(e) => p.skipped.push(format!("{e:#}")),
            }
        }
        p.skipped.push(format!(
            "{dev}: the egress qdisc is not changed by tune (for kernel pacing: tc qdisc replace dev {dev} root fq)"
        ));
    }
    p
}

/// tune's changes need root: without it, `--apply` and `--revert` are
/// usage errors (the plan alone needs nothing).
fn need_root(what: &str) -> anyhow::Result<()> {
    if crate::testbed::is_root() {
        Ok(())
    } else {
        bail_usage!("tune {what} needs root: it changes sysctls and device settings")
    }
}

/// Applies `changes` in order; if one fails, undoes those already made
/// and returns the error.
pub fn apply_all(changes: &[Change]) -> anyhow::Result<()> {
    for (i, c) in changes.iter().enumerate() {
        if let Err(e) = c.apply() {
            for done in changes[..i].iter().rev() {
                if let Err(e2) = done.inverse().apply() {
                    eprintln!("fastudp: warning: could not undo \"{done}\": {e2:#}");
                }
            }
            return Err(anyhow!(
                "\"{c}\" failed: {e:#}; the changes before it were undone"
            ));
        }
    }
    Ok(())
}

/// What a revert does with one saved change.
enum Step {
    /// Write the original back (it is `now` at the moment).
    Restore(Change, Value),
    /// Already at its original value.
    Already(Change),
    /// Its device is gone: nothing to restore.
    Gone(Change),
}

/// `fastudp tune --revert FILE`: all or nothing. Checks the whole file
/// first, reads every setting's value now and checks that the system can
/// take each restore (features that can change, channels within the
/// device's maximum); then writes. If a write fails midway, the values
/// already restored are set back to what they were, and nothing is left
/// half reverted.
fn revert(file: &str) -> anyhow::Result<()> {
    need_root("--revert")?;
    let st = state::load(Path::new(file))?.ok_or_else(|| usage!("{file}: no such state file"))?;
    let steps = revert_steps(&st)?;
    check_restores(&steps)?;
    restore_all(&steps)?;
    report_revert(&steps)
}

/// What to do with each saved change, last first, from the values now.
/// A value that cannot be read is a runtime error (nothing written yet).
fn revert_steps(st: &State) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for c in st.changes.iter().rev() {
        if let Some(d) = c.device() {
            if !is_device(d) {
                steps.push(Step::Gone(c.clone()));
                continue;
            }
        }
        let (old, _) = c.values();
        let now = c.current()?;
        steps.push(if now == old {
            Step::Already(c.clone())
        } else {
            Step::Restore(c.clone(), now)
        });
    }
    Ok(steps)
}

/// Every restore must be possible, and so must setting each value back to
/// what it is now, before the first write. The file is valid; it is the
/// system that cannot take it: a runtime error.
fn check_restores(steps: &[Step]) -> anyhow::Result<()> {
    for s in steps {
        if let Step::Restore(c, now) = s {
            let back = c
                .inverse()
                .set_to(now)
                .ok_or_else(|| anyhow!("its value now ({now}) is of another kind"))
                .and_then(|b| b.checked().map(drop));
            if let Err(why) = c.inverse().feasible().and(back) {
                return Err(anyhow!(
                    "cannot restore {}: {why:#}; nothing was changed",
                    what(c)
                ));
            }
        }
    }
    Ok(())
}

/// Writes every original back. If a write fails, the values restored
/// before it are set back to what they were, and the error says whether
/// that worked.
fn restore_all(steps: &[Step]) -> anyhow::Result<()> {
    let mut done: Vec<(&Change, &Value)> = Vec::new();
    for s in steps {
        let Step::Restore(c, now) = s else { continue };
        if let Err(e) = c.inverse().apply() {
            let (old, _) = c.values();
            let after = undo_restores(&done);
            return Err(anyhow!(
                "could not restore {}: {now} -> {old}: {e:#}; {after}",
                what(c)
            ));
        }
        done.push((c, now));
    }
    Ok(())
}

/// Sets the values of `done` back to what they were before the revert
/// (last first); what happened, for the error.
fn undo_restores(done: &[(&Change, &Value)]) -> String {
    let mut unsure = 0;
    for (d, was) in done.iter().rev() {
        // Writes the value found before the restore again.
        match d.inverse().set_to(was).map(|b| b.apply()) {
            Some(Ok(())) => {}
            Some(Err(e2)) => {
                unsure += 1;
                eprintln!(
                    "fastudp: warning: could not set {} back to {was}: {e2:#}",
                    what(d)
                );
            }
            None => unsure += 1,
        }
    }
    if unsure == 0 {
        format!(
            "the {} values restored before it were set back: nothing was changed",
            done.len()
        )
    } else {
        format!("{unsure} values could not be set back (see above)")
    }
}

/// One line per saved change: restored, already so, or its device gone.
fn report_revert(steps: &[Step]) -> anyhow::Result<()> {
    for s in steps {
        match s {
            Step::Restore(c, now) => {
                let (old, new) = c.values();
                let since = if *now == new {
                    String::new()
                } else {
                    format!(" (changed since tune set {new})")
                };
                out!("restored: {}: {now} -> {old}{since}", what(c))?;
            }
            Step::Already(c) => out!(
                "already at its original value: {}: {}",
                what(c),
                c.values().0
            )?,
            Step::Gone(c) => out!(
                "not restored: {c} ({} is gone from this network namespace)",
                c.device().unwrap_or_default()
            )?,
        }
    }
    Ok(())
}

/// The setting a change is about, for people.
fn what(c: &Change) -> String {
    match c {
        Change::Sysctl { name, .. } => format!("sysctl {name}"),
        Change::Feature { dev, name, .. } => format!("{dev}: feature {name}"),
        Change::Channels { dev, .. } => format!("{dev}: channels"),
        Change::GroFlushTimeout { dev, .. } => format!("{dev}: gro_flush_timeout"),
        Change::NapiDeferHardIrqs { dev, .. } => format!("{dev}: napi_defer_hard_irqs"),
        Change::Sysfs { path, .. } => path.clone(),
    }
}

/// Runs `fastudp tune`.
pub fn run_tune(a: TuneArgs) -> anyhow::Result<()> {
    if let Some(file) = &a.revert {
        return revert(file);
    }
    if a.apply {
        need_root("--apply")?;
    }
    let devs = match &a.dev {
        Some(d) => {
            if !is_device(d) {
                bail_usage!("--dev {d}: no such device in this network namespace");
            }
            vec![d.clone()]
        }
        None => up_devices().into_iter().filter(|d| d != "lo").collect(),
    };
    let p = plan(&devs);
    print_plan(&p, a.apply)?;
    if !a.apply || p.changes.is_empty() {
        return Ok(());
    }
    apply(&a, &devs, &p)
}

/// Prints the plan: the changes, and what tune leaves alone and why.
fn print_plan(p: &Plan, apply: bool) -> anyhow::Result<()> {
    if !apply {
        out!("fastudp tune: the plan (a dry run: --apply makes these changes, as root)")?;
    }
    for c in &p.changes {
        out!("  {c}")?;
    }
    if p.changes.is_empty() {
        out!("  nothing to change")?;
    }
    for s in &p.skipped {
        out!("  not changed: {s}")?;
    }
    Ok(())
}

/// `--apply`: saves the originals, then makes the changes (all or none).
fn apply(a: &TuneArgs, devs: &[String], p: &Plan) -> anyhow::Result<()> {
    // The state file is checked and written before anything changes, so
    // that whatever happens next, the originals are on disk.
    let path = Path::new(&a.state);
    let previous = state::prepare(path)?;
    let mut st = previous.clone().unwrap_or(State {
        version: state::STATE_VERSION,
        ..State::default()
    });
    st.merge(devs, &p.changes);
    state::save(path, &st)?;
    if let Err(e) = apply_all(&p.changes) {
        // Everything was undone: put the state file back as it was.
        state::restore(path, previous.as_ref());
        return Err(e);
    }
    out!(
        "applied {} changes; original values in {}{} (undo: fastudp tune --revert {})",
        p.changes.len(),
        a.state,
        if previous.is_some() {
            " (merged with the earlier run's)"
        } else {
            ""
        },
        a.state
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_round_trips_and_inverts() {
        let cs = vec![
            Change::Sysctl {
                name: "net.core.rmem_max".into(),
                old: 212_992,
                new: 7_500_000,
            },
            Change::Feature {
                dev: "fu-rx".into(),
                name: "rx-gro".into(),
                old: false,
                new: true,
            },
            Change::Channels {
                dev: "fu-rx".into(),
                old: (1, 1),
                new: (2, 2),
            },
            Change::GroFlushTimeout {
                dev: "fu-rx".into(),
                old: 0,
                new: 50_000,
            },
            Change::NapiDeferHardIrqs {
                dev: "fu-rx".into(),
                old: 0,
                new: 2,
            },
        ];
        let json = serde_json::to_string(&cs).unwrap();
        assert!(json.contains("\"kind\":\"sysctl\""));
        let back: Vec<Change> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cs);
        for c in &cs {
            assert_eq!(&c.inverse().inverse(), c);
        }
        assert_eq!(
            cs[1].inverse(),
            Change::Feature {
                dev: "fu-rx".into(),
                name: "rx-gro".into(),
                old: true,
                new: false
            }
        );
        assert_eq!(cs[2].to_string(), "fu-rx: channels: rx 1 tx 1 -> rx 2 tx 2");
    }

    #[test]
    fn a_state_file_of_something_else_is_refused() {
        assert!(serde_json::from_str::<Vec<Change>>("{\"not\": \"a list\"}").is_err());
        assert!(serde_json::from_str::<Vec<Change>>("[{\"kind\": \"reboot\"}]").is_err());
    }
}
