//! Readers for /proc: softirq time and UDP error counters.

use std::collections::HashMap;

/// Total softirq time of all CPUs, in nanoseconds, from the `cpu` line of
/// `/proc/stat` (the seventh field, in clock ticks).
pub fn softirq_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    parse_softirq_ticks(&s).map(|t| t * 1_000_000_000 / fastudp::os::clock_ticks_per_sec())
}

/// The softirq ticks of the aggregate `cpu` line.
pub fn parse_softirq_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    line.split_whitespace().nth(7)?.parse().ok()
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
