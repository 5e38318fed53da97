//! What every run reports besides its figures: the host's facts and the
//! per-second lines.

use super::label_width;
use fastudp_io::Feature;
use serde::Serialize;

/// Facts about the host, for the JSON output.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    /// The kernel, such as `Linux 6.18.44`.
    pub kernel: String,
    /// The CPU model.
    pub cpu: String,
    /// CPUs online.
    pub cpus: usize,
    /// The library's probe of the kernel.
    pub capabilities: Caps,
}

/// The library's probe of the kernel, as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Caps {
    /// Most segments in one GSO send (1: no GSO).
    pub gso_max_segments: usize,
    /// UDP_GRO is accepted.
    pub gro: bool,
    /// ECN marks can be sent and read.
    pub ecn: bool,
    /// IP_PKTINFO / IPV6_PKTINFO work.
    pub pktinfo: bool,
    /// sendmmsg / recvmmsg exist.
    pub mmsg: bool,
    /// SO_ZEROCOPY is accepted.
    pub zerocopy: bool,
    /// SO_TXTIME is accepted.
    pub txtime: bool,
}

/// Reads the kernel, the CPU model and the library's capability probe.
pub fn host_info() -> Host {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|_| std::env::consts::OS.to_string());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let caps = fastudp_io::Socket::bind(
        "127.0.0.1:0".parse().expect("literal"),
        fastudp_io::Config::default(),
    )
    .map(|s| s.capabilities());
    let capabilities = match caps {
        Ok(c) => Caps {
            gso_max_segments: c.max_gso_segments,
            gro: c.supports(Feature::Gro),
            ecn: c.supports(Feature::Ecn),
            pktinfo: c.supports(Feature::Pktinfo),
            mmsg: c.supports(Feature::Mmsg),
            zerocopy: c.supports(Feature::Zerocopy),
            txtime: c.supports(Feature::Txtime),
        },
        Err(_) => Caps {
            gso_max_segments: 1,
            gro: false,
            ecn: false,
            pktinfo: false,
            mmsg: false,
            zerocopy: false,
            txtime: false,
        },
    };
    Host {
        kernel,
        cpu,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        capabilities,
    }
}

/// One iperf3-style line for one second of one run.
pub fn print_interval(
    label: &str,
    sec: u32,
    bytes: u64,
    dgrams: u64,
    calls: u64,
) -> anyhow::Result<()> {
    out!("{}", interval_line(label, sec, bytes, dgrams, calls))
}

/// The text of a per-second line: the label padded to the longest pairing
/// bench runs, so that the columns of every pairing line up; bytes in MB
/// (10^6 bytes, as everywhere in fastudp).
pub fn interval_line(label: &str, sec: u32, bytes: u64, dgrams: u64, calls: u64) -> String {
    format!(
        "[{label:<w$}] {:>3}-{:<3} s  {:>9.1} MB  {:>7.2} Gbit/s  {:>10} dgram/s  {:>9} calls/s",
        sec - 1,
        sec,
        bytes as f64 / 1e6,
        bytes as f64 * 8.0 / 1e9,
        dgrams,
        calls,
        w = label_width()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{pair_label, RxStrategy, TxStrategy};
    use clap::ValueEnum;

    #[test]
    fn every_pairing_s_per_second_line_lines_up() {
        let mut cols = std::collections::HashSet::new();
        for &t in TxStrategy::value_variants() {
            for &r in RxStrategy::value_variants() {
                let l = interval_line(&pair_label(t, r), 3, 1_234_567_890, 1_000_000, 31_250);
                assert!(l.contains(" MB ") && !l.contains("MBytes"), "{l}");
                cols.insert((l.find(']').unwrap(), l.find(" MB ").unwrap(), l.len()));
            }
        }
        assert_eq!(cols.len(), 1, "columns differ: {cols:?}");
    }
}
