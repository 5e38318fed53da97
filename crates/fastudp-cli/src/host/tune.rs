//! `fastudp tune`: apply (and revert) what `doctor` recommends, through
//! /proc/sys, sysfs and the ethtool ioctl, never through a shell.

use super::{read_sysctl, up_devices, SYSCTLS};
use crate::Failure;
use clap::Args;
use serde::{Deserialize, Serialize};

/// Where `tune --apply` keeps the previous values unless `--state` says.
pub const DEFAULT_STATE: &str = "/var/lib/fastudp/tune-state.json";
/// The gro_flush_timeout `tune` sets on a veth, in ns.
pub const GRO_FLUSH_NS: u64 = 50_000;

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

/// One change of a setting, with the value before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// A sysctl under /proc/sys.
    Sysctl {
        /// Dotted name.
        name: String,
        /// Before.
        old: u64,
        /// After.
        new: u64,
    },
    /// An ethtool feature (kernel name).
    Feature {
        /// Device.
        dev: String,
        /// Feature.
        name: String,
        /// Before.
        old: bool,
        /// After.
        new: bool,
    },
    /// veth channels (`ethtool -L rx N tx N`).
    Channels {
        /// Device.
        dev: String,
        /// Before: (rx, tx).
        old: (u32, u32),
        /// After: (rx, tx).
        new: (u32, u32),
    },
    /// A sysfs attribute.
    Sysfs {
        /// Path.
        path: String,
        /// Before.
        old: String,
        /// After.
        new: String,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let oo = |b: &bool| if *b { "on" } else { "off" };
        match self {
            Change::Sysctl { name, old, new } => write!(f, "sysctl {name}: {old} -> {new}"),
            Change::Feature {
                dev,
                name,
                old,
                new,
            } => write!(f, "{dev}: feature {name}: {} -> {}", oo(old), oo(new)),
            Change::Channels { dev, old, new } => {
                write!(
                    f,
                    "{dev}: channels: rx {} tx {} -> rx {} tx {}",
                    old.0, old.1, new.0, new.1
                )
            }
            Change::Sysfs { path, old, new } => write!(f, "{path}: {old} -> {new}"),
        }
    }
}

impl Change {
    /// The change that undoes this one.
    pub fn inverse(&self) -> Change {
        match self.clone() {
            Change::Sysctl { name, old, new } => Change::Sysctl {
                name,
                old: new,
                new: old,
            },
            Change::Feature {
                dev,
                name,
                old,
                new,
            } => Change::Feature {
                dev,
                name,
                old: new,
                new: old,
            },
            Change::Channels { dev, old, new } => Change::Channels {
                dev,
                old: new,
                new: old,
            },
            Change::Sysfs { path, old, new } => Change::Sysfs {
                path,
                old: new,
                new: old,
            },
        }
    }

    /// Makes the change: the new value is written.
    pub fn apply(&self) -> Result<(), String> {
        match self {
            Change::Sysctl { name, new, .. } => {
                let p = format!("/proc/sys/{}", name.replace('.', "/"));
                std::fs::write(&p, format!("{new}\n")).map_err(|e| format!("cannot write {p}: {e}"))
            }
            Change::Feature { dev, name, new, .. } => {
                fastudp::host::set_features(dev, &[(name, *new)])
                    .map_err(|e| format!("{dev}: {e}"))?;
                // The kernel may accept the request and still not turn it on.
                let now = fastudp::host::features(dev).map_err(|e| format!("{dev}: {e}"))?;
                match now.iter().find(|f| f.name == *name) {
                    Some(f) if f.active == *new => Ok(()),
                    _ => Err(format!(
                        "{dev}: {name} did not become {} (a feature it needs is off?)",
                        if *new { "on" } else { "off" }
                    )),
                }
            }
            Change::Channels { dev, new, .. } => {
                let mut c = fastudp::host::channels(dev).map_err(|e| format!("{dev}: {e}"))?;
                c.rx = new.0;
                c.tx = new.1;
                fastudp::host::set_channels(dev, &c)
                    .map_err(|e| format!("{dev}: setting channels: {e}"))
            }
            Change::Sysfs { path, new, .. } => std::fs::write(path, format!("{new}\n"))
                .map_err(|e| format!("cannot write {path}: {e}")),
        }
    }
}

/// What `tune` will change, and what it will not (with the reason).
#[derive(Debug, Default)]
pub struct Plan {
    /// Changes to make, in order.
    pub changes: Vec<Change>,
    /// Recommendations tune does not apply, one line each.
    pub skipped: Vec<String>,
}

fn sysfs_path(dev: &str, file: &str) -> String {
    format!("/sys/class/net/{dev}/{file}")
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
            Err(e) => p.skipped.push(format!("sysctl {name}: {e}")),
        }
    }
    for dev in devs {
        let feats = match fastudp::host::features(dev) {
            Ok(f) => f,
            Err(e) => {
                p.skipped
                    .push(format!("{dev}: cannot read its features: {e}"));
                continue;
            }
        };
        let veth = fastudp::host::driver(dev).is_ok_and(|d| d == "veth");
        let mut want = vec![
            "tx-checksum-ip-generic",
            "tx-udp-segmentation",
            "tx-generic-segmentation",
            "rx-gro",
        ];
        if veth {
            want.push("rx-udp-gro-forwarding");
        }
        for w in want {
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
            match fastudp::host::channels(dev) {
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
            let path = sysfs_path(dev, "gro_flush_timeout");
            match std::fs::read_to_string(&path).map(|v| v.trim().to_string()) {
                Ok(v) if v == "0" => p.changes.push(Change::Sysfs {
                    path,
                    old: v,
                    new: GRO_FLUSH_NS.to_string(),
                }),
                Ok(_) => {}
                Err(e) => p.skipped.push(format!("cannot read {path}: {e}")),
            }
        }
        p.skipped.push(format!(
            "{dev}: the egress qdisc is not changed by tune (for kernel pacing: tc qdisc replace dev {dev} root fq)"
        ));
    }
    p
}

fn need_root(what: &str) -> Result<(), Failure> {
    if crate::testbed::is_root() {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "tune {what} needs root: it changes sysctls and device settings"
        )))
    }
}

/// Applies `changes` in order; if one fails, undoes those already made
/// and returns the error.
pub fn apply_all(changes: &[Change]) -> Result<(), String> {
    for (i, c) in changes.iter().enumerate() {
        if let Err(e) = c.apply() {
            for done in changes[..i].iter().rev() {
                if let Err(e2) = done.inverse().apply() {
                    eprintln!("fastudp: warning: could not undo \"{done}\": {e2}");
                }
            }
            return Err(format!(
                "\"{c}\" failed: {e}; the changes before it were undone"
            ));
        }
    }
    Ok(())
}

/// Runs `fastudp tune`.
pub fn run_tune(a: TuneArgs) -> Result<(), Failure> {
    if let Some(file) = &a.revert {
        need_root("--revert")?;
        let text = std::fs::read_to_string(file)
            .map_err(|e| Failure::usage(format!("cannot read {file}: {e}")))?;
        let changes: Vec<Change> = serde_json::from_str(&text)
            .map_err(|e| Failure::usage(format!("{file} is not a tune state file: {e}")))?;
        let undo: Vec<Change> = changes.iter().rev().map(Change::inverse).collect();
        apply_all(&undo).map_err(|e| Failure { code: 1, msg: e })?;
        for c in &undo {
            outln!("restored: {c}");
        }
        return Ok(());
    }
    if a.apply {
        need_root("--apply")?;
    }
    let devs = match &a.dev {
        Some(d) => {
            if !super::is_device(d) {
                return Err(Failure::usage(format!(
                    "--dev {d}: no such device in this network namespace"
                )));
            }
            vec![d.clone()]
        }
        None => up_devices().into_iter().filter(|d| d != "lo").collect(),
    };
    let p = plan(&devs);
    if !a.apply {
        outln!("fastudp tune: the plan (a dry run: --apply makes these changes, as root)");
    }
    for c in &p.changes {
        outln!("  {c}");
    }
    if p.changes.is_empty() {
        outln!("  nothing to change");
    }
    for s in &p.skipped {
        outln!("  not changed: {s}");
    }
    if !a.apply || p.changes.is_empty() {
        return Ok(());
    }
    if let Some(dir) = std::path::Path::new(&a.state)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::usage(format!("cannot create {}: {e}", dir.display())))?;
    }
    let json =
        serde_json::to_string_pretty(&p.changes).map_err(|e| Failure::usage(e.to_string()))?;
    std::fs::write(&a.state, json)
        .map_err(|e| Failure::usage(format!("cannot write the state file {}: {e}", a.state)))?;
    if let Err(e) = apply_all(&p.changes) {
        // Everything was undone: a state file would only mislead a revert.
        let _ = std::fs::remove_file(&a.state);
        return Err(Failure { code: 1, msg: e });
    }
    outln!(
        "applied {} changes; previous values in {} (undo: fastudp tune --revert {})",
        p.changes.len(),
        a.state,
        a.state
    );
    Ok(())
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
            Change::Sysfs {
                path: "/sys/class/net/fu-rx/gro_flush_timeout".into(),
                old: "0".into(),
                new: "50000".into(),
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
