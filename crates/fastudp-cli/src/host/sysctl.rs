//! The sysctls fastudp cares about, and reading them.

/// The sysctls fastudp cares about: (name, minimum, why).
pub const SYSCTLS: [(&str, u64, &str); 6] = [
    (
        "net.core.rmem_max",
        7_500_000,
        "caps SO_RCVBUF: bursts beyond it are dropped",
    ),
    ("net.core.wmem_max", 7_500_000, "caps SO_SNDBUF"),
    (
        "net.core.rmem_default",
        212_992,
        "receive buffer of sockets that set none",
    ),
    (
        "net.core.wmem_default",
        212_992,
        "send buffer of sockets that set none",
    ),
    (
        "net.core.optmem_max",
        131_072,
        "bounds outstanding MSG_ZEROCOPY sends (ENOBUFS beyond it)",
    ),
    (
        "net.core.netdev_max_backlog",
        5_000,
        "per-CPU input queue of veth and loopback",
    ),
];

use anyhow::{anyhow, Context};

/// Reads a sysctl by its dotted name.
pub fn read_sysctl(name: &str) -> anyhow::Result<u64> {
    let p = format!("/proc/sys/{}", name.replace('.', "/"));
    let text = std::fs::read_to_string(&p).with_context(|| format!("cannot read {p}"))?;
    parse_sysctl(&text).with_context(|| p)
}

/// Parses a numeric sysctl's text (a number and a newline).
pub fn parse_sysctl(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    t.parse().map_err(|_| anyhow!("not a single number: {t:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_recorded_sysctls() {
        assert_eq!(parse_sysctl("212992\n").unwrap(), 212_992);
        assert_eq!(parse_sysctl("  4194304 \n").unwrap(), 4_194_304);
        assert!(
            parse_sysctl("4096\t131072\t6291456\n").is_err(),
            "a vector is not one number"
        );
        assert!(parse_sysctl("").is_err());
    }
}
