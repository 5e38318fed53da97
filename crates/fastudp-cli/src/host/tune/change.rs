//! One setting `tune` changes: what it is, the value before and after, and
//! how it is checked, read and written.
//!
//! Only what `tune --apply` itself could have changed can be written here:
//! the sysctls on doctor's list, the device features tune turns on, veth
//! channel counts, and a device's `gro_flush_timeout` and
//! `napi_defer_hard_irqs`. A state file is
//! input like any other, so [`Change::checked`] refuses anything else, and
//! any value out of its type's range, before anything is written.

pub use crate::host::devices::valid_dev_name;
use crate::host::sysctl::{read_sysctl, SYSCTLS};
use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The device features `tune` turns on (by kernel name).
pub const TUNE_FEATURES: [&str; 5] = [
    "tx-checksum-ip-generic",
    "tx-udp-segmentation",
    "tx-generic-segmentation",
    "rx-gro",
    "rx-udp-gro-forwarding",
];

/// Largest value of a sysctl on the list (they are C `int`s).
const SYSCTL_MAX: u64 = i32::MAX as u64;
/// Most channels a revert may ask for.
const CHANNELS_MAX: u32 = 4096;
/// Largest `gro_flush_timeout` a revert may write, in ns (about 4.3 s).
const GRO_FLUSH_MAX: u64 = u32::MAX as u64;
/// Largest `napi_defer_hard_irqs` (the kernel's limit, `S32_MAX`).
const DEFER_MAX: u64 = i32::MAX as u64;

/// One change of a setting, with the value before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Change {
    /// A sysctl under /proc/sys, from doctor's list.
    Sysctl {
        /// Dotted name.
        name: String,
        /// Before.
        old: u64,
        /// After.
        new: u64,
    },
    /// An ethtool feature (kernel name), from [`TUNE_FEATURES`].
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
    /// `/sys/class/net/<dev>/gro_flush_timeout`, in ns.
    GroFlushTimeout {
        /// Device.
        dev: String,
        /// Before.
        old: u64,
        /// After.
        new: u64,
    },
    /// `/sys/class/net/<dev>/napi_defer_hard_irqs`: how many empty NAPI
    /// polls the device's interrupt (a veth's wake-up) stays off for, the
    /// `gro_flush_timeout` timer polling instead.
    NapiDeferHardIrqs {
        /// Device.
        dev: String,
        /// Before.
        old: u64,
        /// After.
        new: u64,
    },
    /// The form older versions saved `gro_flush_timeout` in; read only,
    /// and accepted only for exactly that file (see [`Change::checked`]).
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
            Change::Channels { dev, old, new } => write!(
                f,
                "{dev}: channels: rx {} tx {} -> rx {} tx {}",
                old.0, old.1, new.0, new.1
            ),
            Change::GroFlushTimeout { dev, old, new } => {
                write!(f, "{dev}: gro_flush_timeout: {old} -> {new}")
            }
            Change::NapiDeferHardIrqs { dev, old, new } => {
                write!(f, "{dev}: napi_defer_hard_irqs: {old} -> {new}")
            }
            Change::Sysfs { path, old, new } => write!(f, "{path}: {old} -> {new}"),
        }
    }
}

/// A value a setting has, for messages and comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A number (sysctls, `gro_flush_timeout`).
    Num(u64),
    /// A feature's state.
    Bool(bool),
    /// Channel counts (rx, tx).
    Pair(u32, u32),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Num(n) => write!(f, "{n}"),
            Value::Bool(b) => f.write_str(if *b { "on" } else { "off" }),
            Value::Pair(rx, tx) => write!(f, "rx {rx} tx {tx}"),
        }
    }
}

/// A device name as the kernel takes it; a usage error otherwise (a state
/// file is input).
fn check_dev(dev: &str) -> anyhow::Result<()> {
    if valid_dev_name(dev) {
        Ok(())
    } else {
        bail_usage!("{dev:?} is not a network interface name")
    }
}

/// The real path of `dev`'s `gro_flush_timeout`: `/sys/class/net/<dev>`
/// must resolve to a `net/<dev>` directory under `/sys/devices`, as the
/// kernel makes it, and nothing else.
pub fn gro_flush_path(dev: &str) -> anyhow::Result<PathBuf> {
    dev_sysfs_path(dev, "gro_flush_timeout")
}

/// The real path of the sysfs attribute `file` of `dev`, checked as
/// [`gro_flush_path`] checks it.
pub fn dev_sysfs_path(dev: &str, file: &str) -> anyhow::Result<PathBuf> {
    check_dev(dev)?;
    let link = Path::new("/sys/class/net").join(dev);
    let real = std::fs::canonicalize(&link)
        .map_err(|e| anyhow!("{dev}: no such device in this network namespace ({e})"))?;
    let ok = real.starts_with("/sys/devices/")
        && real.file_name() == Some(std::ffi::OsStr::new(dev))
        && real.parent().and_then(Path::file_name) == Some(std::ffi::OsStr::new("net"));
    if !ok {
        bail!(
            "{} resolves to {}, not to a network device under /sys/devices: refusing to write there",
            link.display(),
            real.display()
        );
    }
    Ok(real.join(file))
}

/// Writes `value` and a newline to an existing file that is not a
/// symbolic link (sysfs and /proc/sys files are never created).
fn write_existing(path: &Path, value: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    f.write_all(format!("{value}\n").as_bytes())
        .with_context(|| format!("cannot write {value} to {}", path.display()))
}

fn read_gro_flush(dev: &str) -> anyhow::Result<u64> {
    read_dev_num(dev, "gro_flush_timeout")
}

fn read_dev_num(dev: &str, file: &str) -> anyhow::Result<u64> {
    let p = dev_sysfs_path(dev, file)?;
    let t = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    t.trim()
        .parse()
        .map_err(|_| anyhow!("{}: not a number: {:?}", p.display(), t.trim()))
}

/// Which setting a change is about: two changes with the same key change
/// the same thing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key(&'static str, String, String);

impl Change {
    /// Checks that this is something `tune --apply` could have changed,
    /// with values in range, and returns it in today's form. Does not look
    /// at the system: a device may be gone (see [`Change::device`]). A
    /// refusal is a usage error: the change comes from a file given.
    pub fn checked(self) -> anyhow::Result<Change> {
        match self {
            Change::Sysctl { name, old, new } => {
                if !SYSCTLS.iter().any(|(n, _, _)| *n == name) {
                    bail_usage!(
                        "sysctl {name:?} is not one tune changes (it changes only {})",
                        SYSCTLS.map(|s| s.0).join(", ")
                    );
                }
                for v in [old, new] {
                    if v == 0 || v > SYSCTL_MAX {
                        bail_usage!("sysctl {name}: {v} is out of range (1 to {SYSCTL_MAX})");
                    }
                }
                Ok(Change::Sysctl { name, old, new })
            }
            Change::Feature {
                dev,
                name,
                old,
                new,
            } => {
                check_dev(&dev)?;
                if !TUNE_FEATURES.contains(&name.as_str()) {
                    bail_usage!(
                        "{dev}: feature {name:?} is not one tune changes (it changes only {})",
                        TUNE_FEATURES.join(", ")
                    );
                }
                Ok(Change::Feature {
                    dev,
                    name,
                    old,
                    new,
                })
            }
            Change::Channels { dev, old, new } => {
                check_dev(&dev)?;
                for (rx, tx) in [old, new] {
                    if !(1..=CHANNELS_MAX).contains(&rx) || !(1..=CHANNELS_MAX).contains(&tx) {
                        bail_usage!(
                            "{dev}: channels rx {rx} tx {tx} out of range (1 to {CHANNELS_MAX})"
                        );
                    }
                }
                Ok(Change::Channels { dev, old, new })
            }
            Change::GroFlushTimeout { dev, old, new } => {
                check_dev(&dev)?;
                for v in [old, new] {
                    if v > GRO_FLUSH_MAX {
                        bail_usage!(
                            "{dev}: gro_flush_timeout {v} out of range (0 to {GRO_FLUSH_MAX} ns)"
                        );
                    }
                }
                Ok(Change::GroFlushTimeout { dev, old, new })
            }
            Change::NapiDeferHardIrqs { dev, old, new } => {
                check_dev(&dev)?;
                for v in [old, new] {
                    if v > DEFER_MAX {
                        bail_usage!(
                            "{dev}: napi_defer_hard_irqs {v} out of range (0 to {DEFER_MAX})"
                        );
                    }
                }
                Ok(Change::NapiDeferHardIrqs { dev, old, new })
            }
            Change::Sysfs { path, old, new } => {
                let dev = path
                    .strip_prefix("/sys/class/net/")
                    .and_then(|r| r.strip_suffix("/gro_flush_timeout"))
                    .filter(|d| valid_dev_name(d))
                    .ok_or_else(|| {
                        usage!(
                            "{path:?} is not a file tune changes (it writes only /sys/class/net/<device>/gro_flush_timeout)"
                        )
                    })?;
                let num = |v: &str| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| usage!("{path}: {v:?} is not a number of ns"))
                };
                Change::GroFlushTimeout {
                    dev: dev.to_string(),
                    old: num(&old)?,
                    new: num(&new)?,
                }
                .checked()
            }
        }
    }

    /// The setting this change is about.
    pub fn key(&self) -> Key {
        match self {
            Change::Sysctl { name, .. } => Key("sysctl", String::new(), name.clone()),
            Change::Feature { dev, name, .. } => Key("feature", dev.clone(), name.clone()),
            Change::Channels { dev, .. } => Key("channels", dev.clone(), String::new()),
            Change::GroFlushTimeout { dev, .. } => Key("gro_flush", dev.clone(), String::new()),
            Change::NapiDeferHardIrqs { dev, .. } => Key("napi_defer", dev.clone(), String::new()),
            Change::Sysfs { path, .. } => Key("sysfs", String::new(), path.clone()),
        }
    }

    /// The device this change is about, if any.
    pub fn device(&self) -> Option<&str> {
        match self {
            Change::Feature { dev, .. }
            | Change::Channels { dev, .. }
            | Change::GroFlushTimeout { dev, .. }
            | Change::NapiDeferHardIrqs { dev, .. } => Some(dev),
            Change::Sysctl { .. } | Change::Sysfs { .. } => None,
        }
    }

    /// The value before (`old`) and after (`new`).
    pub fn values(&self) -> (Value, Value) {
        match self {
            Change::Sysctl { old, new, .. }
            | Change::GroFlushTimeout { old, new, .. }
            | Change::NapiDeferHardIrqs { old, new, .. } => (Value::Num(*old), Value::Num(*new)),
            Change::Feature { old, new, .. } => (Value::Bool(*old), Value::Bool(*new)),
            Change::Channels { old, new, .. } => {
                (Value::Pair(old.0, old.1), Value::Pair(new.0, new.1))
            }
            Change::Sysfs { .. } => (Value::Num(0), Value::Num(0)),
        }
    }

    /// Keeps this change's `old` (the first-saved original) and takes the
    /// `new` of `later`, a change of the same setting.
    pub fn merge(&mut self, later: &Change) {
        match (self, later) {
            (Change::Sysctl { new, .. }, Change::Sysctl { new: n, .. })
            | (Change::GroFlushTimeout { new, .. }, Change::GroFlushTimeout { new: n, .. })
            | (Change::NapiDeferHardIrqs { new, .. }, Change::NapiDeferHardIrqs { new: n, .. }) => {
                *new = *n
            }
            (Change::Feature { new, .. }, Change::Feature { new: n, .. }) => *new = *n,
            (Change::Channels { new, .. }, Change::Channels { new: n, .. }) => *new = *n,
            _ => {}
        }
    }

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
            Change::GroFlushTimeout { dev, old, new } => Change::GroFlushTimeout {
                dev,
                old: new,
                new: old,
            },
            Change::NapiDeferHardIrqs { dev, old, new } => Change::NapiDeferHardIrqs {
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

    /// This change with `new` replaced by `v` (`None` when `v` is not of
    /// this setting's kind): the change that sets the value `v` again.
    pub fn set_to(&self, v: &Value) -> Option<Change> {
        let mut c = self.clone();
        match (&mut c, v) {
            (Change::Sysctl { new, .. }, Value::Num(n))
            | (Change::GroFlushTimeout { new, .. }, Value::Num(n))
            | (Change::NapiDeferHardIrqs { new, .. }, Value::Num(n)) => *new = *n,
            (Change::Feature { new, .. }, Value::Bool(b)) => *new = *b,
            (Change::Channels { new, .. }, Value::Pair(rx, tx)) => *new = (*rx, *tx),
            _ => return None,
        }
        Some(c)
    }

    /// Checks, without writing, that the system can take this change now:
    /// the feature exists and can be changed, the channel counts are
    /// within the device's maximum.
    pub fn feasible(&self) -> anyhow::Result<()> {
        match self.clone().checked()? {
            Change::Feature { dev, name, .. } => {
                let all = fastudp_tools::host::features(&dev).with_context(|| dev.clone())?;
                match all.iter().find(|f| f.name == name) {
                    Some(f) if f.changeable => Ok(()),
                    Some(_) => bail!("{dev}: feature {name} cannot be changed"),
                    None => bail!("{dev}: the kernel has no feature {name}"),
                }
            }
            Change::Channels { dev, new, .. } => {
                let c = fastudp_tools::host::channels(&dev).with_context(|| dev.clone())?;
                if new.0 > c.max_rx || new.1 > c.max_tx {
                    bail!(
                        "{dev}: channels rx {} tx {} exceed the device's maximum (rx {} tx {})",
                        new.0,
                        new.1,
                        c.max_rx,
                        c.max_tx
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Reads the setting's value now.
    pub fn current(&self) -> anyhow::Result<Value> {
        match self {
            Change::Sysctl { name, .. } => read_sysctl(name).map(Value::Num),
            Change::Feature { dev, name, .. } => {
                let all = fastudp_tools::host::features(dev).with_context(|| dev.clone())?;
                all.iter()
                    .find(|f| f.name == *name)
                    .map(|f| Value::Bool(f.active))
                    .ok_or_else(|| anyhow!("{dev}: the kernel has no feature {name}"))
            }
            Change::Channels { dev, .. } => fastudp_tools::host::channels(dev)
                .map(|c| Value::Pair(c.rx, c.tx))
                .with_context(|| dev.clone()),
            Change::GroFlushTimeout { dev, .. } => read_gro_flush(dev).map(Value::Num),
            Change::NapiDeferHardIrqs { dev, .. } => {
                read_dev_num(dev, "napi_defer_hard_irqs").map(Value::Num)
            }
            Change::Sysfs { path, .. } => bail!("{path}: an unchecked change"),
        }
    }

    /// Makes the change: the new value is written. Refuses a change that
    /// [`Change::checked`] refuses.
    pub fn apply(&self) -> anyhow::Result<()> {
        match self.clone().checked()? {
            Change::Sysctl { name, new, .. } => {
                let p = PathBuf::from(format!("/proc/sys/{}", name.replace('.', "/")));
                write_existing(&p, &new.to_string())
            }
            Change::Feature { dev, name, new, .. } => {
                fastudp_tools::host::set_features(&dev, &[(&name, new)])
                    .with_context(|| dev.clone())?;
                // The kernel may accept the request and still not turn it on.
                let now = fastudp_tools::host::features(&dev).with_context(|| dev.clone())?;
                match now.iter().find(|f| f.name == *name) {
                    Some(f) if f.active == new => Ok(()),
                    _ => bail!(
                        "{dev}: {name} did not become {} (a feature it needs is off?)",
                        if new { "on" } else { "off" }
                    ),
                }
            }
            Change::Channels { dev, new, .. } => {
                let mut c = fastudp_tools::host::channels(&dev).with_context(|| dev.clone())?;
                if new.0 > c.max_rx || new.1 > c.max_tx {
                    bail!(
                        "{dev}: channels rx {} tx {} exceed the device's maximum (rx {} tx {})",
                        new.0,
                        new.1,
                        c.max_rx,
                        c.max_tx
                    );
                }
                c.rx = new.0;
                c.tx = new.1;
                fastudp_tools::host::set_channels(&dev, &c)
                    .with_context(|| format!("{dev}: setting channels"))
            }
            Change::GroFlushTimeout { dev, new, .. } => {
                write_existing(&gro_flush_path(&dev)?, &new.to_string())
            }
            Change::NapiDeferHardIrqs { dev, new, .. } => write_existing(
                &dev_sysfs_path(&dev, "napi_defer_hard_irqs")?,
                &new.to_string(),
            ),
            Change::Sysfs { .. } => unreachable!("checked() turns it into GroFlushTimeout"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_tune_changes_passes_the_check() {
        let bad = [
            r#"{"kind":"sysfs","path":"/etc/passwd","old":"x","new":"y"}"#,
            r#"{"kind":"sysfs","path":"/sys/class/net/../../../etc/x/gro_flush_timeout","old":"0","new":"1"}"#,
            r#"{"kind":"sysfs","path":"/sys/class/net/eth0/mtu","old":"1500","new":"9000"}"#,
            r#"{"kind":"sysfs","path":"/sys/class/net/eth0/gro_flush_timeout","old":"0","new":"-1"}"#,
            r#"{"kind":"sysctl","name":"kernel.randomize_va_space","old":2,"new":0}"#,
            r#"{"kind":"sysctl","name":"net.core.rmem_max","old":212992,"new":99999999999}"#,
            r#"{"kind":"sysctl","name":"net.core.rmem_max","old":0,"new":1}"#,
            r#"{"kind":"feature","dev":"../x","name":"rx-gro","old":false,"new":true}"#,
            r#"{"kind":"feature","dev":"eth0","name":"loopback","old":false,"new":true}"#,
            r#"{"kind":"channels","dev":"eth0","old":[1,1],"new":[0,1]}"#,
            r#"{"kind":"channels","dev":"eth0","old":[1,1],"new":[100000,1]}"#,
            r#"{"kind":"gro_flush_timeout","dev":"eth0","old":0,"new":99999999999}"#,
            r#"{"kind":"gro_flush_timeout","dev":"a b","old":0,"new":1}"#,
            r#"{"kind":"napi_defer_hard_irqs","dev":"eth0","old":0,"new":2147483648}"#,
            r#"{"kind":"napi_defer_hard_irqs","dev":"../x","old":0,"new":2}"#,
        ];
        for b in bad {
            let c: Result<Change, _> = serde_json::from_str(b);
            let r = c.map_err(anyhow::Error::from).and_then(Change::checked);
            assert!(r.is_err(), "accepted: {b}");
        }
        // Unknown fields and kinds are refused while parsing.
        assert!(serde_json::from_str::<Change>(
            r#"{"kind":"sysctl","name":"net.core.rmem_max","old":1,"new":2,"path":"/x"}"#
        )
        .is_err());
        let old: Change = serde_json::from_str(
            r#"{"kind":"sysfs","path":"/sys/class/net/vb/gro_flush_timeout","old":"0","new":"50000"}"#,
        )
        .unwrap();
        assert_eq!(
            old.checked().unwrap(),
            Change::GroFlushTimeout {
                dev: "vb".into(),
                old: 0,
                new: 50000
            }
        );
    }

    #[test]
    fn merging_keeps_the_first_original() {
        let mut a = Change::Sysctl {
            name: "net.core.rmem_max".into(),
            old: 212_992,
            new: 7_500_000,
        };
        let b = Change::Sysctl {
            name: "net.core.rmem_max".into(),
            old: 7_500_000,
            new: 8_000_000,
        };
        assert_eq!(a.key(), b.key());
        a.merge(&b);
        assert_eq!(a.values(), (Value::Num(212_992), Value::Num(8_000_000)));
    }
}
