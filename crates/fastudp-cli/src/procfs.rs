//! Readers for /proc: softirq time and UDP error counters.

use std::collections::HashMap;

/// Total softirq time of all CPUs, in nanoseconds, from the `cpu` line of
/// `/proc/stat` (the seventh field, in clock ticks).
pub fn softirq_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    parse_softirq_ticks(&s).map(|t| t * 1_000_000_000 / fastudp_tools::os::clock_ticks_per_sec())
}

/// The softirq ticks of the aggregate `cpu` line.
pub fn parse_softirq_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    line.split_whitespace().nth(7)?.parse().ok()
}

/// Steal above this share of CPU time gets a warning: threads stall for
/// milliseconds and timings stop meaning much.
pub const STEAL_WARN: f64 = 0.05;

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks: the time the
/// hypervisor took from this VM's CPUs (steal), and all time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTicks {
    /// Ticks stolen by the hypervisor (the eighth field).
    pub steal: u64,
    /// All ticks: user, nice, system, idle, iowait, irq, softirq and steal.
    pub total: u64,
}

impl CpuTicks {
    /// Reads `/proc/stat` now.
    pub fn now() -> Option<CpuTicks> {
        parse_cpu_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The fraction of the time from `earlier` to `self` that was stolen,
    /// if any time passed.
    pub fn steal_since(&self, earlier: &CpuTicks) -> Option<f64> {
        // Idle and iowait may step back a little on a tickless kernel: a
        // total that did not grow gives no answer rather than a wrong one.
        let total = self.total.saturating_sub(earlier.total);
        let steal = self.steal.saturating_sub(earlier.steal).min(total);
        (total > 0).then(|| steal as f64 / total as f64)
    }
}

/// The busy time of all CPUs so far (user, nice, system, irq and softirq
/// of `/proc/stat`'s `cpu` line; not idle, iowait or steal), in ns.
pub fn busy_ns() -> Option<u64> {
    parse_busy_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
        .map(|t| t * 1_000_000_000 / fastudp_tools::os::clock_ticks_per_sec().max(1))
}

/// The busy ticks of `/proc/stat`'s `cpu` line: user, nice, system, irq
/// and softirq.
pub fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(7)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 7).then(|| f[0] + f[1] + f[2] + f[5] + f[6])
}

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub fn parse_cpu_ticks(stat: &str) -> Option<CpuTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 8).then(|| CpuTicks {
        steal: f[7],
        total: f.iter().sum(),
    })
}

/// The `Udp:` counters of `/proc/net/snmp` (or `Udp6:` of
/// `/proc/net/snmp6`), by name.
pub fn udp_counters() -> HashMap<String, u64> {
    let mut m = std::fs::read_to_string("/proc/net/snmp")
        .map(|s| parse_snmp(&s, "Udp:"))
        .unwrap_or_default();
    if let Ok(s) = std::fs::read_to_string("/proc/net/snmp6") {
        for l in s.lines() {
            let mut it = l.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let (Some(k), Ok(v)) = (k.strip_prefix("Udp6"), v.parse()) {
                    m.insert(format!("6{k}"), v);
                }
            }
        }
    }
    m
}

/// Parses one protocol's header/value line pair of `/proc/net/snmp`.
pub fn parse_snmp(s: &str, proto: &str) -> HashMap<String, u64> {
    let lines: Vec<&str> = s.lines().filter(|l| l.starts_with(proto)).collect();
    let mut m = HashMap::new();
    if lines.len() >= 2 {
        for (k, v) in lines[0]
            .split_whitespace()
            .skip(1)
            .zip(lines[1].split_whitespace().skip(1))
        {
            if let Ok(v) = v.parse() {
                m.insert(k.to_string(), v);
            }
        }
    }
    m
}

/// Datagrams the kernel dropped for lack of receive buffer, IPv4 + IPv6.
pub fn rcvbuf_errors() -> u64 {
    let m = udp_counters();
    m.get("RcvbufErrors").copied().unwrap_or(0) + m.get("6RcvbufErrors").copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_recorded_proc_stat() {
        let s = "cpu  2255 34 2290 22625563 6290 127 456 0 0 0\ncpu0 1132 34 1441 11311718 3675 127 438 0 0 0\n";
        assert_eq!(parse_softirq_ticks(s), Some(456));
        assert_eq!(parse_softirq_ticks("intr 1 2"), None);
        let a = parse_cpu_ticks(s).unwrap();
        let b = parse_cpu_ticks("cpu  392275 0 187005 942511 7463 0 53068 51127 0 0\nintr 5\n")
            .unwrap();
        assert_eq!(b.steal, 51127);
        assert_eq!(b.total, 392275 + 187005 + 942511 + 7463 + 53068 + 51127);
        let c = CpuTicks {
            steal: b.steal + 25,
            total: b.total + 100,
        };
        assert_eq!(c.steal_since(&b), Some(0.25));
        assert_eq!(b.steal_since(&b), None, "no time passed");
        assert_eq!(b.steal_since(&c), None, "backwards");
        assert!(a.total > 0);
        assert_eq!(parse_cpu_ticks("cpu  1 2 3"), None, "too few fields");
        // user + nice + system + irq + softirq; not idle or iowait.
        assert_eq!(parse_busy_ticks(s), Some(2255 + 34 + 2290 + 127 + 456));
        assert_eq!(parse_busy_ticks("cpu  1 2 3"), None);
    }

    #[test]
    fn parses_recorded_snmp() {
        let s = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 1000 3 17 900 15 2 0 0 0\n";
        let m = parse_snmp(s, "Udp:");
        assert_eq!(m["InErrors"], 17);
        assert_eq!(m["RcvbufErrors"], 15);
        assert_eq!(m["SndbufErrors"], 2);
        assert!(parse_snmp(s, "Tcp:").is_empty());
    }
}
