//! Rendering: per-second lines, the summary table, host facts.

use super::{label_width, name, Measurement};
use serde::Serialize;

/// What each column means, for `--help` and docs/CLI.md.
pub const COLUMNS_HELP: &str = "\
Columns of the summary table:
  MB/s       payload bytes received per second (10^6 bytes)
  Gbit/s     the same in gigabits per second
  dgram/s    datagrams received per second (TCP: bytes / payload)
  calls/s    send syscalls per second
  B/call     payload bytes per send syscall
  rx call/s  receive syscalls per second that returned data (with GRO,
             fewer calls for the same datagrams show coalescing)
  tx ns/B    sender thread CPU time per received byte (thread CPU clock);
             on loopback this includes the receive softirq work the kernel
             runs on the sender's CPU
  rx ns/B    receiver thread CPU time per received byte
  sirq ns/B  softirq time of all CPUs during the run (/proc/stat) per byte;
             it overlaps the two columns before it, it is not extra
  lost       datagrams sent but not received (sequence count); drops are
             cross-checked with the kernel's RcvbufErrors counter
  speedup    MB/s relative to the sendto run of the same invocation";

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
    let caps =
        fastudp::Socket::bind("127.0.0.1:0".parse().expect("literal")).map(|s| s.capabilities());
    let capabilities = match caps {
        Ok(c) => Caps {
            gso_max_segments: c.max_gso_segments,
            gro: c.gro,
            ecn: c.ecn,
            pktinfo: c.pktinfo,
            mmsg: c.mmsg,
            zerocopy: c.zerocopy,
            txtime: c.txtime,
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
pub fn print_interval(label: &str, sec: u32, bytes: u64, dgrams: u64, calls: u64) {
    outln!("{}", interval_line(label, sec, bytes, dgrams, calls));
}

/// The text of a per-second line: the label padded to the longest pairing
/// bench runs, so that the columns of every pairing line up; bytes in MB
/// (10^6 bytes, as everywhere in fastudp).
pub fn interval_line(label: &str, sec: u32, bytes: u64, dgrams: u64, calls: u64) -> String {
    format!(
        "[{label:<w$}] {:>3}-{:<3} s  {:>9.1} MB  {:>7.2} Gbits/sec  {:>10} dgram/s  {:>9} calls/s",
        sec - 1,
        sec,
        bytes as f64 / 1e6,
        bytes as f64 * 8.0 / 1e9,
        dgrams,
        calls,
        w = label_width()
    )
}

/// The line under the table of a bench that Ctrl-C cut short during the
/// pairing `during`, after `finished` pairings.
pub fn print_interrupted(during: &str, finished: usize) {
    if finished == 0 {
        outln!("interrupted (Ctrl-C) during {during}, before any run finished");
    } else {
        outln!(
            "interrupted (Ctrl-C) during {during}: the {finished} run(s) above finished; {during} is not reported"
        );
    }
}

/// The summary table.
pub fn print_table(rs: &[Measurement]) {
    outln!();
    outln!(
        "{:<18} {:<13} {:>9} {:>7} {:>10} {:>9} {:>8} {:>9} {:>7} {:>7} {:>9} {:>8} {:>8}",
        "send",
        "receive",
        "MB/s",
        "Gbit/s",
        "dgram/s",
        "calls/s",
        "B/call",
        "rx call/s",
        "tx ns/B",
        "rx ns/B",
        "sirq ns/B",
        "lost",
        "speedup"
    );
    for r in rs {
        outln!(
            "{:<18} {:<13} {:>9.1} {:>7.2} {:>10.0} {:>9.0} {:>8.0} {:>9.0} {:>7.3} {:>7.3} {:>9.3} {:>8} {:>8}",
            name(r.tx),
            r.rx,
            r.mbytes_per_sec,
            r.gbps,
            r.datagrams_per_sec,
            r.tx_calls_per_sec,
            r.bytes_per_call,
            r.rx_calls_per_sec,
            r.tx_cpu_ns_per_byte,
            r.rx_cpu_ns_per_byte,
            r.softirq_ns_per_byte,
            r.lost
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into()),
            r.speedup_vs_sendto.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into())
        );
    }
    for r in rs.iter().filter(|r| r.lost.is_some_and(|l| l > 0)) {
        outln!(
            "{} -> {}: {} datagrams lost by sequence number; the kernel counted {} receive-buffer drops (RcvbufErrors: messages, a GRO train counts once)",
            name(r.tx),
            r.rx,
            r.lost.unwrap_or(0),
            r.kernel_drops
        );
    }
    for r in rs {
        if let Some(st) = r.host_steal.filter(|&st| st > crate::procfs::STEAL_WARN) {
            outln!(
                "{} -> {}: the hypervisor took {:.0}% of this VM's CPU time during the run (steal); its figures are unreliable",
                name(r.tx),
                r.rx,
                st * 100.0
            );
        }
    }
    for r in rs {
        if let (Some(done), Some(copied)) = (r.zerocopy_completions, r.zerocopy_copied) {
            outln!(
                "{}: {done} zerocopy completions, {copied} of them copied by the kernel anyway ({:.0}%){}",
                name(r.tx),
                if done > 0 { copied as f64 * 100.0 / done as f64 } else { 0.0 },
                if done > 0 && copied * 10 >= done * 9 {
                    ": the data did not leave the host (local delivery copies)"
                } else {
                    ""
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{pair_label, RxStrategy, TxStrategy};
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
