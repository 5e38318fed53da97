//! The sysctls and UDP error counters doctor checks, and `--watch`.

use super::check::{check, Check, Status};
use crate::host::sysctl::{read_sysctl, SYSCTLS};
use crate::procfs;
use std::time::Duration;

/// The sysctls against their minimums.
pub fn sysctl_checks(out: &mut Vec<Check>) {
    for (name, min, why) in SYSCTLS {
        out.push(match read_sysctl(name) {
            Ok(v) if v >= min => check("sysctl", name, Status::Pass, format!("{v}"), None),
            Ok(v) => check("sysctl", name, Status::Warn, format!("{v}, below {min}: {why}"), Some(format!("sysctl -w {name}={min}"))),
            Err(_) if name == "net.core.netdev_max_backlog" && !std::path::Path::new("/proc/sys/net/core/netdev_max_backlog").exists() => check(
                "sysctl",
                name,
                Status::NA,
                "not visible in this network namespace: it is host-wide, check it from the host",
                None,
            ),
            Err(e) => check("sysctl", name, Status::NA, e, None),
        });
    }
}

/// The UDP error counters doctor reports.
pub const COUNTERS: [&str; 4] = ["RcvbufErrors", "SndbufErrors", "InErrors", "InCsumErrors"];

/// The UDP error counters.
pub fn counter_checks(out: &mut Vec<Check>) {
    let m = procfs::udp_counters();
    for c in COUNTERS {
        let v = m.get(c).copied().unwrap_or(0) + m.get(&format!("6{c}")).copied().unwrap_or(0);
        out.push(if m.is_empty() {
            check("udp", c, Status::NA, "cannot read /proc/net/snmp", None)
        } else if v == 0 {
            check("udp", c, Status::Pass, "0 since boot", None)
        } else {
            check(
                "udp",
                c,
                Status::Warn,
                format!("{v} since boot (IPv4 + IPv6); see --watch for the rate now"),
                None,
            )
        });
    }
}

fn snapshot() -> Vec<u64> {
    let m = procfs::udp_counters();
    COUNTERS
        .iter()
        .map(|c| m.get(*c).copied().unwrap_or(0) + m.get(&format!("6{c}")).copied().unwrap_or(0))
        .collect()
}

/// Prints the counters' rates every second for `secs` seconds.
pub fn watch(secs: u64, json: bool) {
    let mut last = snapshot();
    for t in 1..=secs {
        std::thread::sleep(Duration::from_secs(1));
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
            outln!("{}", serde_json::json!({ "second": t, "rates": m }));
        } else {
            let line: Vec<String> = COUNTERS
                .iter()
                .zip(&rates)
                .map(|(k, v)| format!("{k} {v}/s"))
                .collect();
            outln!("[{t:>3} s] {}", line.join("  "));
        }
        last = now;
    }
}
