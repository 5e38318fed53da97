//! Rendering: per-second lines, the summary table, host facts.

use super::{name, Measurement, TxStrategy};
use crate::testbed::Profile;

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
  x sendto   MB/s relative to sendto into the same receiver (TCP rows:
             into the receiver the send strategies share)
  x recvfrom MB/s relative to recvfrom from the same sender
Under the table, the verdict: the best sender against sendto, the best
receiver against recvfrom, and why runs lost datagrams, if they did.";

/// The line under the table of a bench that Ctrl-C cut short during the
/// pairing `during`, after `finished` pairings.
pub fn print_interrupted(during: &str, finished: usize) -> anyhow::Result<()> {
    if finished == 0 {
        out!("interrupted (Ctrl-C) during {during}, before any run finished")
    } else {
        out!(
            "interrupted (Ctrl-C) during {during}: the {finished} run(s) above finished; {during} is not reported"
        )
    }
}

/// The summary table.
pub fn print_table(rs: &[Measurement]) -> anyhow::Result<()> {
    out!()?;
    out!(
        "{:<18} {:<13} {:>9} {:>7} {:>10} {:>9} {:>8} {:>9} {:>7} {:>7} {:>9} {:>8} {:>8} {:>10}",
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
        "x sendto",
        "x recvfrom"
    )?;
    let x = |v: Option<f64>| v.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into());
    for r in rs {
        out!(
            "{:<18} {:<13} {:>9.1} {:>7.2} {:>10.0} {:>9.0} {:>8.0} {:>9.0} {:>7.3} {:>7.3} {:>9.3} {:>8} {:>8} {:>10}",
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
            x(r.speedup_vs_sendto),
            x(r.speedup_vs_recvfrom)
        )?;
    }
    for r in rs.iter().filter(|r| r.lost.is_some_and(|l| l > 0)) {
        out!(
            "{} -> {}: {} datagrams lost by sequence number; the kernel counted {} receive-buffer drops (RcvbufErrors: messages, a GRO train counts once)",
            name(r.tx),
            r.rx,
            r.lost.unwrap_or(0),
            r.kernel_drops
        )?;
    }
    for r in rs {
        if let Some(st) = r.host_steal.filter(|&st| st > crate::procfs::STEAL_WARN) {
            out!(
                "{} -> {}: the hypervisor took {:.0}% of this VM's CPU time during the run (steal); its figures are unreliable",
                name(r.tx),
                r.rx,
                st * 100.0
            )?;
        }
    }
    for r in rs {
        if let (Some(done), Some(copied)) = (r.zerocopy_completions, r.zerocopy_copied) {
            out!(
                "{}: {done} zerocopy completions, {copied} of them copied by the kernel anyway ({:.0}%){}",
                name(r.tx),
                if done > 0 { copied as f64 * 100.0 / done as f64 } else { 0.0 },
                if done > 0 && copied * 10 >= done * 9 {
                    ": the data did not leave the host (local delivery copies)"
                } else {
                    ""
                }
            )?;
        }
    }
    Ok(())
}

/// Fills in each row's ratios: against `sendto` into the same receiver
/// (the send comparison) and against `recvfrom` from the same sender (the
/// receive comparison), where this invocation ran that baseline.
pub fn ratios(rs: &mut [Measurement]) {
    let rate = |rs: &[Measurement], f: &dyn Fn(&Measurement) -> bool| {
        rs.iter()
            .find(|r| f(r))
            .map(|r| r.mbytes_per_sec)
            .filter(|&b| b > 0.0)
    };
    // TCP has its own receiver: its row is compared with sendto into the
    // receiver the send rows share (the first sendto row).
    let any_sendto = rate(rs, &|r| r.tx == TxStrategy::Sendto);
    let sendto: Vec<Option<f64>> = rs
        .iter()
        .map(|row| {
            if row.tx.is_tcp() {
                any_sendto
            } else {
                rate(rs, &|r| r.tx == TxStrategy::Sendto && r.rx == row.rx)
            }
        })
        .collect();
    let recvfrom: Vec<Option<f64>> = rs
        .iter()
        .map(|row| {
            if row.tx.is_tcp() {
                None
            } else {
                rate(rs, &|r| r.tx == row.tx && r.rx == "recvfrom")
            }
        })
        .collect();
    for ((r, s), v) in rs.iter_mut().zip(sendto).zip(recvfrom) {
        r.speedup_vs_sendto = s.map(|b| r.mbytes_per_sec / b);
        r.speedup_vs_recvfrom = v.map(|b| r.mbytes_per_sec / b);
    }
}

/// The lines under the table: the best sender (against `sendto`), the
/// best receiver (against `recvfrom`, from the sender that ran into the
/// most receivers), TCP where it ran, and why runs lost datagrams when
/// they did, with what to do about it. Run after [`ratios`].
pub fn verdict(rs: &[Measurement], net: Option<Profile>) -> Vec<String> {
    let udp: Vec<&Measurement> = rs.iter().filter(|r| !r.tx.is_tcp()).collect();
    if udp.is_empty() {
        return Vec::new();
    }
    let mut v = vec![String::new(), "verdict:".into()];
    best_lines(rs, &udp, &mut v);
    loss_lines(&udp, net, &mut v);
    v
}

/// The fastest of `rows`.
fn best(rows: &[&Measurement]) -> Option<Measurement> {
    rows.iter()
        .max_by(|a, b| a.mbytes_per_sec.total_cmp(&b.mbytes_per_sec))
        .map(|r| (*r).clone())
}

/// The verdict's lines on the best sender, the best receiver and TCP.
fn best_lines(rs: &[Measurement], udp: &[&Measurement], v: &mut Vec<String>) {
    if let Some(b) = best(udp) {
        v.push(format!(
            "  best sender:   {} ({:.1} MB/s, {:.2} Gbit/s, into {}): {}",
            name(b.tx),
            b.mbytes_per_sec,
            b.gbps,
            b.rx,
            match b.speedup_vs_sendto {
                Some(x) => format!("{x:.2}x sendto into {}", b.rx),
                None => format!("no sendto run into {} to compare with", b.rx),
            }
        ));
    }
    // The receivers compared: those of the sender that ran into the most.
    let mut senders: Vec<TxStrategy> = Vec::new();
    for r in udp {
        if !senders.contains(&r.tx) {
            senders.push(r.tx);
        }
    }
    let count = |t: TxStrategy| udp.iter().filter(|r| r.tx == t).count();
    if let Some(t) = senders.iter().copied().max_by_key(|&t| count(t)) {
        let rows: Vec<&Measurement> = udp.iter().copied().filter(|r| r.tx == t).collect();
        if let Some(b) = best(&rows).filter(|_| rows.len() > 1 || rows[0].rx == "recvfrom") {
            v.push(format!(
                "  best receiver: {} ({:.1} MB/s, {:.2} Gbit/s, from {}): {}",
                b.rx,
                b.mbytes_per_sec,
                b.gbps,
                name(t),
                match b.speedup_vs_recvfrom {
                    Some(x) => format!("{x:.2}x recvfrom from {}", name(t)),
                    None => format!("no recvfrom run from {} to compare with", name(t)),
                }
            ));
        }
    }
    if let (Some(tcp), Some(b)) = (
        rs.iter()
            .filter(|r| r.tx.is_tcp())
            .max_by(|a, b| a.mbytes_per_sec.total_cmp(&b.mbytes_per_sec)),
        best(udp),
    ) {
        if tcp.mbytes_per_sec > 0.0 {
            v.push(format!(
                "  TCP:           {} {:.1} MB/s; the best UDP run is {:.2}x that",
                name(tcp.tx),
                tcp.mbytes_per_sec,
                b.mbytes_per_sec / tcp.mbytes_per_sec
            ));
        }
    }
}

/// The verdict's lines on runs that lost datagrams: why, and what to do.
fn loss_lines(udp: &[&Measurement], net: Option<Profile>, v: &mut Vec<String>) {
    let lossy: Vec<&Measurement> = udp
        .iter()
        .copied()
        .filter(|r| r.lost.is_some_and(|l| l > 0))
        .collect();
    if lossy.is_empty() {
        return;
    }
    let why = match net {
        None => "loopback has no flow control",
        Some(_) => "a veth pair has no flow control",
    };
    let lost: u64 = lossy.iter().filter_map(|r| r.lost).sum();
    let drops: u64 = lossy.iter().map(|r| r.kernel_drops).sum();
    let pad = "                 ";
    v.push(format!(
        "  loss:          {} of {} UDP runs lost datagrams ({lost} in all; the kernel counted {drops} receive-buffer drops).",
        lossy.len(),
        udp.len()
    ));
    v.push(format!(
        "{pad}bench sends unpaced, as fast as it can, and {why}: a sender faster"
    ));
    v.push(format!(
        "{pad}than its receiver fills the receiving socket's buffer, and the kernel drops"
    ));
    v.push(format!(
        "{pad}what does not fit. The receiver fell behind; nothing is broken."
    ));
    if net.is_some() {
        v.push(format!(
            "{pad}A veth in NAPI mode also drops when its ring is full (`ip -s link`)."
        ));
    }
    let gro_everywhere = lossy.iter().all(|r| r.rx.contains("gro"));
    v.push(format!(
        "{pad}To measure without it: pace the sender (`fastudp tx -b RATE` into `fastudp rx`),"
    ));
    v.push(format!(
        "{pad}or give the receiver a larger buffer (raise net.core.rmem_max: `fastudp tune`){}",
        if gro_everywhere { "." } else { "," }
    ));
    if !gro_everywhere {
        v.push(format!(
            "{pad}or receive with GRO (--rx gro-recvmmsg), which takes a whole train per read."
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::TxStrategy;

    fn row(tx: TxStrategy, rx: &str, mbytes_per_sec: f64, lost: u64) -> Measurement {
        Measurement {
            tx,
            rx: rx.into(),
            bytes: 0,
            datagrams: 0,
            seconds: 1.0,
            mbytes_per_sec,
            gbps: mbytes_per_sec * 8.0 / 1e3,
            datagrams_per_sec: 0.0,
            tx_calls_per_sec: 0.0,
            bytes_per_call: 0.0,
            rx_calls_per_sec: 0.0,
            tx_cpu_ns_per_byte: 0.0,
            rx_cpu_ns_per_byte: 0.0,
            softirq_ns_per_byte: 0.0,
            all_cpu_ns_per_byte: 0.0,
            sent: 0,
            lost: (!tx.is_tcp()).then_some(lost),
            kernel_drops: lost / 10,
            speedup_vs_sendto: None,
            speedup_vs_recvfrom: None,
            zerocopy_completions: None,
            zerocopy_copied: None,
            host_steal: None,
        }
    }

    /// Send rows compare with sendto into the same receiver; receive rows
    /// with recvfrom from the same sender (never with the sendto run); the
    /// verdict names the best of each with its ratio, and explains loss.
    #[test]
    fn receive_ratios_are_against_recvfrom_and_the_verdict_names_the_best() {
        use TxStrategy::*;
        let mut rs = vec![
            row(Sendto, "gro-recvmmsg", 400.0, 0),
            row(GsoCmsg, "gro-recvmmsg", 1600.0, 0),
            row(Fastudp, "gro-recvmmsg", 1500.0, 0),
            row(Tcp, "tcp", 2000.0, 0),
            row(Fastudp, "recvfrom", 300.0, 50_000),
            row(Fastudp, "recvmmsg", 450.0, 10),
        ];
        ratios(&mut rs);
        assert_eq!(rs[1].speedup_vs_sendto, Some(4.0));
        assert_eq!(rs[3].speedup_vs_sendto, Some(5.0));
        assert_eq!(rs[3].speedup_vs_recvfrom, None);
        // fastudp -> recvfrom is 1.00x recvfrom, not 0.75x sendto.
        assert_eq!(rs[4].speedup_vs_recvfrom, Some(1.0));
        assert_eq!(rs[4].speedup_vs_sendto, None);
        assert_eq!(rs[5].speedup_vs_recvfrom, Some(1.5));
        assert_eq!(rs[2].speedup_vs_recvfrom, Some(5.0));
        let v = verdict(&rs, None).join("\n");
        assert!(
            v.contains("best sender:   gso-cmsg (1600.0 MB/s, 12.80 Gbit/s, into gro-recvmmsg): 4.00x sendto into gro-recvmmsg"),
            "{v}"
        );
        assert!(
            v.contains("best receiver: gro-recvmmsg (1500.0 MB/s, 12.00 Gbit/s, from fastudp): 5.00x recvfrom from fastudp"),
            "{v}"
        );
        assert!(v.contains("the best UDP run is 0.80x that"), "{v}");
        assert!(
            v.contains("2 of 5 UDP runs lost datagrams (50010 in all"),
            "{v}"
        );
        assert!(v.contains("loopback has no flow control"), "{v}");
        assert!(
            v.contains("fastudp tx -b RATE") && v.contains("rmem_max"),
            "{v}"
        );
        // No loss, no explanation; no baseline, said so.
        let mut one = vec![row(GsoCmsg, "recvmmsg", 900.0, 0)];
        ratios(&mut one);
        let v = verdict(&one, None).join("\n");
        assert!(
            v.contains("no sendto run into recvmmsg to compare with"),
            "{v}"
        );
        assert!(!v.contains("loss:") && !v.contains("best receiver"), "{v}");
    }
}
