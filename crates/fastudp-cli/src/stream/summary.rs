//! The summary both sides print.

use crate::interrupt;
use crate::procfs::{CpuTicks, STEAL_WARN};
use serde::Serialize;

/// The summary of a stream run, either side.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    /// `stream` or `stream-rx`.
    pub role: &'static str,
    /// Flows seen (rx) or sent (tx).
    pub flows: usize,
    /// Fraction of the flows within 5% of their target rate.
    pub flows_within_5pct: f64,
    /// The pacing mode in force.
    pub pacing: String,
    /// Why that mode.
    pub pacing_reason: String,
    /// Aggregate rate, Gbit/s.
    pub gbps: f64,
    /// Sending or receiving thread CPU ns per byte.
    pub cpu_ns_per_byte: f64,
    /// CPU seconds per Gbit/s of stream.
    pub cpu_sec_per_gbit: f64,
    /// Send or receive calls per second.
    pub calls_per_sec: f64,
    /// The share of the flows' datagrams that never arrived, from their
    /// sequence numbers (rx; null on tx).
    pub loss: Option<f64>,
    /// Datagrams of a flow that arrived twice (rx).
    pub duplicates: Option<u64>,
    /// Datagrams of a flow that arrived after a later one (rx).
    pub reordered: Option<u64>,
    /// Inter-arrival gaps within a flow, µs (upper bound of a power-of-two
    /// bucket): p50 (rx).
    pub gap_us_p50: Option<f64>,
    /// p90 gap.
    pub gap_us_p90: Option<f64>,
    /// p99 gap.
    pub gap_us_p99: Option<f64>,
    /// Longest run of a flow's datagrams arriving back to back (rx).
    pub max_back_to_back: Option<u64>,
    /// Datagrams counted for no flow (rx): without the stream's header,
    /// with a flow id outside `0..--flows`, or with a sequence number far
    /// off their flow's. Counted only: they keep no state.
    pub foreign: Option<u64>,
    /// Of `foreign`, those with the header and a flow id outside
    /// `0..--flows` (rx).
    pub out_of_range: Option<u64>,
    /// The fraction of all CPU time the hypervisor took from this VM
    /// during the run (steal, from /proc/stat): above a few percent, the
    /// threads stall for milliseconds and pacing and rates suffer.
    pub host_steal: Option<f64>,
    /// Seconds measured.
    pub seconds: f64,
    /// Bytes.
    pub bytes: u64,
    /// Ctrl-C ended the run: the figures cover it until then.
    pub interrupted: bool,
    /// The ports that refused the stream: nothing listened there (tx;
    /// null on rx). Their flows were stopped at the refusal (with
    /// `--zerocopy`, found at the end of the run) and count as off rate.
    pub refused_ports: Option<Vec<u16>>,
    /// The flows stopped because their port refused them (tx).
    pub refused_flows: Option<usize>,
    /// Datagrams the flows sent, all told (tx).
    pub datagrams: Option<u64>,
    /// Of `datagrams`, those the sending host's own queue dropped: the
    /// kernel answered `ENOBUFS` because the device's qdisc was full. They
    /// count as sent and lost, and the receiver's `loss` includes them
    /// (tx).
    pub dropped_locally: Option<u64>,
}

fn print(s: &StreamSummary, json: bool) -> anyhow::Result<()> {
    if json {
        return out!("{}", serde_json::to_string_pretty(s)?);
    }
    out!(
        "{}: {} flows, {:.3} Gbit/s in {:.1} s, {:.1}% of flows within 5% of their rate, pacing {} ({}), {:.3} CPU ns/B, {:.0} calls/s",
        s.role,
        s.flows,
        s.gbps,
        s.seconds,
        s.flows_within_5pct * 100.0,
        s.pacing,
        s.pacing_reason,
        s.cpu_ns_per_byte,
        s.calls_per_sec
    )?;
    if let Some(st) = s.host_steal.filter(|&st| st > 0.0) {
        out!("host steal {:.1}% of CPU time", st * 100.0)?;
    }
    if let Some(l) = s.loss {
        out!(
            "loss {:.3}%, {} duplicate, {} reordered, gaps within a flow p50 <= {:.0} us, p90 <= {:.0} us, p99 <= {:.0} us, longest back-to-back burst {}",
            l * 100.0,
            s.duplicates.unwrap_or(0),
            s.reordered.unwrap_or(0),
            s.gap_us_p50.unwrap_or(0.0),
            s.gap_us_p90.unwrap_or(0.0),
            s.gap_us_p99.unwrap_or(0.0),
            s.max_back_to_back.unwrap_or(0)
        )?;
    }
    if let (Some(n), Some(d)) = (s.datagrams, s.dropped_locally) {
        out!(
            "{}: {n} datagrams, {d} ({:.3}%) dropped by the local queue (the qdisc was full: ENOBUFS); the receiver counts them lost",
            s.role,
            if n > 0 { d as f64 * 100.0 / n as f64 } else { 0.0 }
        )?;
    }
    if let (Some(ports), Some(n)) = (&s.refused_ports, s.refused_flows) {
        if !ports.is_empty() {
            let list: Vec<String> = ports.iter().map(u16::to_string).collect();
            out!(
                "{}: {n} of {} flows stopped: nothing listens on port {} (ICMP port unreachable); the rate above counts what was sent before",
                s.role,
                s.flows,
                list.join(", ")
            )?;
        }
    }
    if s.interrupted {
        out!(
            "{}: interrupted (Ctrl-C) after {:.2} s: the figures above cover the run until then",
            s.role,
            s.seconds
        )?;
    }
    Ok(())
}

/// Prints the summary, then ends with status 130 if Ctrl-C cut the run short.
pub fn finish(s: &StreamSummary, json: bool) -> anyhow::Result<()> {
    print(s, json)?;
    if s.interrupted {
        return Err(interrupt::summarized_err());
    }
    Ok(())
}

/// A rate in bytes per second as bits per second, in a readable unit.
pub fn bits_per_sec(bytes: u64) -> String {
    let b = bytes as f64 * 8.0;
    match b {
        b if b >= 1e9 => format!("{:.2} Gbit/s", b / 1e9),
        b if b >= 1e6 => format!("{:.1} Mbit/s", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kbit/s", b / 1e3),
        b => format!("{b:.0} bit/s"),
    }
}

/// The steal fraction since `ticks0`, with a warning on stderr when it is
/// high enough to spoil the run's timings.
pub fn steal_since(ticks0: Option<CpuTicks>) -> Option<f64> {
    let steal = CpuTicks::now()?.steal_since(&ticks0?)?;
    if steal > STEAL_WARN {
        eprintln!(
            "fastudp: warning: the hypervisor took {:.0}% of this VM's CPU time during the run (steal); threads stalled and the timings are unreliable",
            steal * 100.0
        );
    }
    Some(steal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_rates_read_well() {
        assert_eq!(bits_per_sec(55_000_000), "440.0 Mbit/s");
        assert_eq!(bits_per_sec(250_000_000), "2.00 Gbit/s");
        assert_eq!(bits_per_sec(110), "880 bit/s");
        assert_eq!(bits_per_sec(5_500), "44.0 kbit/s");
    }
}
