//! The sysctls and UDP error counters doctor checks, and `--watch`.

use super::check::{check, Check, Status};
use crate::host::sysctl::{read_sysctl, SYSCTLS};
use crate::procfs;
use std::time::Duration;

/// The sysctls against their minimums.
pub fn sysctl_checks(out: &mut Vec<Check>) {
    for (name, min, why) in SYSCTLS {
        out.push(match read_sysctl(name) {
            Ok(v) if v >= min => check("sysctl", name, Status::Pass, format!("{v}"), None)
                .with("value", v)
                .with("minimum", min),
            Ok(v) => check("sysctl", name, Status::Warn, format!("{v}, below {min}: {why}"), Some(format!("sysctl -w {name}={min}")))
                .with("value", v)
                .with("minimum", min),
            Err(_) if name == "net.core.netdev_max_backlog" && !std::path::Path::new("/proc/sys/net/core/netdev_max_backlog").exists() => check(
                "sysctl",
                name,
                Status::NA,
                "not visible in this network namespace: it is host-wide, check it from the host",
                None,
            ),
            Err(e) => check("sysctl", name, Status::NA, format!("{e:#}"), None),
        });
    }
}

/// The UDP error counters doctor reports.
pub const COUNTERS: [&str; 4] = ["RcvbufErrors", "SndbufErrors", "InErrors", "InCsumErrors"];

/// What the UDP error counters of /proc/net/snmp cover: they belong to
/// the network namespace, so in any but the host's they count from the
/// namespace's creation, not from boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CountersSince {
    /// The host's namespace (that of PID 1): since boot.
    Boot,
    /// Another namespace (named, if `ip netns add` made it): since it was
    /// created.
    NamespaceCreation(Option<String>),
    /// Neither can be told (PID 1's namespace cannot be read): either.
    Unknown,
}

/// The device and inode of a namespace file (following the link).
fn ns_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl CountersSince {
    /// Compares this process's network namespace with PID 1's, and with
    /// those `ip netns` names in /run/netns.
    pub fn here() -> CountersSince {
        let Some(me) = ns_id("/proc/self/ns/net".as_ref()) else {
            return CountersSince::Unknown;
        };
        let named = std::fs::read_dir("/run/netns").ok().and_then(|d| {
            d.filter_map(|e| e.ok())
                .find(|e| ns_id(&e.path()) == Some(me))
                .map(|e| e.file_name().to_string_lossy().into_owned())
        });
        match (ns_id("/proc/1/ns/net".as_ref()), named) {
            (_, Some(name)) => CountersSince::NamespaceCreation(Some(name)),
            (Some(init), None) if init == me => CountersSince::Boot,
            (Some(_), None) => CountersSince::NamespaceCreation(None),
            (None, None) => CountersSince::Unknown,
        }
    }

    /// For JSON: `boot`, `namespace` or `unknown`, and the namespace's
    /// name if it has one.
    pub fn key(&self) -> (&'static str, Option<&str>) {
        match self {
            CountersSince::Boot => ("boot", None),
            CountersSince::NamespaceCreation(n) => ("namespace", n.as_deref()),
            CountersSince::Unknown => ("unknown", None),
        }
    }

    /// The words after a count.
    pub fn words(&self) -> String {
        match self {
            CountersSince::Boot => "since boot".into(),
            CountersSince::NamespaceCreation(Some(n)) => {
                format!("since network namespace {n} was created")
            }
            CountersSince::NamespaceCreation(None) => {
                "since this network namespace was created".into()
            }
            CountersSince::Unknown => {
                "since this network namespace was created (at boot, for the host's)".into()
            }
        }
    }
}

/// The UDP error counters, `since` what they cover.
pub fn counter_checks(out: &mut Vec<Check>, since: &CountersSince) {
    let m = procfs::udp_counters();
    let when = since.words();
    for c in COUNTERS {
        let (v4, v6) = (
            m.get(c).copied().unwrap_or(0),
            m.get(&format!("6{c}")).copied().unwrap_or(0),
        );
        let v = v4 + v6;
        out.push(
            if m.is_empty() {
                check("udp", c, Status::NA, "cannot read /proc/net/snmp", None)
            } else if v == 0 {
                check("udp", c, Status::Pass, format!("0 {when}"), None)
            } else {
                check(
                    "udp",
                    c,
                    Status::Warn,
                    format!("{v} {when} (IPv4 + IPv6); see --watch for the rate now"),
                    None,
                )
            }
            .with("count", v)
            .with("ipv4", v4)
            .with("ipv6", v6),
        );
    }
}

fn snapshot() -> Vec<u64> {
    let m = procfs::udp_counters();
    COUNTERS
        .iter()
        .map(|c| m.get(*c).copied().unwrap_or(0) + m.get(&format!("6{c}")).copied().unwrap_or(0))
        .collect()
}

/// Prints the counters' rates every second for `secs` seconds, or until
/// Ctrl-C (then status 130).
pub fn watch(secs: u64, json: bool) -> anyhow::Result<()> {
    crate::interrupt::watch();
    let mut last = snapshot();
    let start = std::time::Instant::now();
    for t in 1..=secs {
        let due = start + Duration::from_secs(t);
        while let Some(left) = due.checked_duration_since(std::time::Instant::now()) {
            if crate::interrupt::requested() {
                return Err(crate::interrupt::interrupted(
                    "the samples above cover the time until then",
                ));
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        let now = snapshot();
        let rates: Vec<u64> = now
            .iter()
            .zip(&last)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        if json {
            let m: serde_json::Map<String, serde_json::Value> = COUNTERS
                .iter()
                .zip(&rates)
                .map(|(k, v)| (format!("{k}_per_sec"), (*v).into()))
                .collect();
            out!("{}", serde_json::json!({ "second": t, "rates": m }))?;
        } else {
            let line: Vec<String> = COUNTERS
                .iter()
                .zip(&rates)
                .map(|(k, v)| format!("{k} {v}/s"))
                .collect();
            out!("[{t:>3} s] {}", line.join("  "))?;
        }
        last = now;
    }
    Ok(())
}
