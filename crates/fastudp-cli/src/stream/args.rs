//! The options of `stream` and `stream-rx`, and the checks they share.

use crate::args::parse_rate;
use clap::{Args, ValueEnum};
use std::net::IpAddr;

/// `--pacing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PacingArg {
    /// SO_TXTIME departure times, honoured by an fq/etf qdisc (falls back
    /// to user space, and says so, where the qdisc ignores them).
    Kernel,
    /// fastudp waits until each train's departure time.
    User,
    /// Every flow sends its interval's budget at the same instant.
    None,
}

/// Options of `fastudp stream`.
#[derive(Args, Debug, Clone)]
pub struct StreamArgs {
    /// Where the receivers (`fastudp stream-rx`) listen.
    #[arg(long, default_value = "127.0.0.1")]
    pub dest: IpAddr,
    /// Their first port.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// How many ports the flows are spread over (flow i goes to port + i % ports).
    #[arg(long, default_value_t = 1)]
    pub ports: u16,
    /// Number of flows.
    #[arg(long, default_value_t = 10_000)]
    pub flows: usize,
    /// Rate per flow, bytes per second (k, M, G multiply by 1000).
    #[arg(long, default_value = "20k", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rate: u64,
    /// Pacing interval in ms: each flow sends at most one train per interval.
    #[arg(long, default_value_t = 8.0, allow_negative_numbers = true)]
    pub interval: f64,
    /// Most GSO segments per flow per interval.
    #[arg(long, default_value_t = 16)]
    pub max_burst: usize,
    /// Who enforces departure times.
    #[arg(long, value_enum, default_value_t = PacingArg::User)]
    pub pacing: PacingArg,
    /// With user-space pacing, the most all flows together may send, bytes
    /// per second: set it just under the bottleneck's rate (default: flows
    /// x rate + 10%).
    #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
    pub total_rate: Option<u64>,
    /// Send trains with MSG_ZEROCOPY (adaptive: falls back to copying
    /// where the kernel copies anyway).
    #[arg(long)]
    pub zerocopy: bool,
    /// Unconnected send sockets to spread the flows over.
    #[arg(long, default_value_t = 1)]
    pub sockets: usize,
    /// Datagram payload in bytes.
    #[arg(long, default_value_t = 1200)]
    pub payload: usize,
    /// Seconds to stream.
    #[arg(long, default_value_t = 5.0, allow_negative_numbers = true)]
    pub duration: f64,
    /// No per-second lines.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options of `fastudp stream-rx`.
#[derive(Args, Debug, Clone)]
pub struct StreamRxArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// First port.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// Number of ports.
    #[arg(long, default_value_t = 1)]
    pub ports: u16,
    /// Sockets per port, in a reuseport group steered by flow id.
    #[arg(long, default_value_t = 2)]
    pub sockets: usize,
    /// The flows expected: flow ids 0 to this minus 1 are tracked (any
    /// other id is counted as foreign), and the within-5% fraction is of
    /// this many.
    #[arg(long, default_value_t = 10_000)]
    pub flows: usize,
    /// The target rate per flow, bytes per second.
    #[arg(long, default_value = "20k", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rate: u64,
    /// Seconds to measure after the first datagram (default: until the
    /// stream has been silent for --idle seconds).
    #[arg(long, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Seconds of silence that end the run.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub idle: f64,
    /// Seconds to wait for the first datagram.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pub wait: f64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write one line per flow to this CSV file: flow, bytes,
    /// datagrams, rate (bytes/s), lost, longest back-to-back run.
    #[arg(long, value_name = "FILE.csv")]
    pub per_flow: Option<String>,
}

fn open_files_limit() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let l = s.lines().find(|l| l.starts_with("Max open files"))?;
    l.split_whitespace().nth(3)?.parse().ok()
}

/// Checks the options both sides share.
/// Each failed check is a usage error.
pub fn check_common(flows: usize, port: u16, ports: u16, sockets: usize) -> anyhow::Result<()> {
    if port == 0 {
        bail_usage!("--port 0: give the first port, 1 to 65535");
    }
    if ports > 0 && port as u32 + ports as u32 - 1 > 65_535 {
        bail_usage!("--port {port} --ports {ports} runs past port 65535: lower --port or --ports");
    }
    if flows == 0 {
        bail_usage!("--flows 0: there must be at least one flow");
    }
    if ports == 0 {
        bail_usage!("--ports 0: there must be at least one port");
    }
    if sockets == 0 {
        bail_usage!("--sockets 0: there must be at least one socket");
    }
    let per_port = flows.div_ceil(ports as usize);
    if per_port > 65_535 {
        bail_usage!(
            "{flows} flows over {ports} ports is {per_port} per port; at most 65535: add --ports"
        );
    }
    let fds = sockets * ports as usize;
    if let Some(max) = open_files_limit() {
        if fds as u64 + 64 > max {
            bail_usage!("{fds} sockets need more file descriptors than this process may open ({max}): raise `ulimit -n` or use fewer sockets");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("125000").unwrap(), 125_000);
        assert_eq!(parse_rate("125k").unwrap(), 125_000);
        assert_eq!(parse_rate("1.5M").unwrap(), 1_500_000);
        assert_eq!(parse_rate("2G").unwrap(), 2_000_000_000);
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1k").is_err());
    }

    #[test]
    fn limits() {
        let e = check_common(0, 9000, 1, 1).unwrap_err();
        assert_eq!(crate::failure::exit_status(&e), 2, "a usage error");
        assert!(check_common(0, 9000, 1, 1)
            .unwrap_err()
            .to_string()
            .contains("--flows 0"));
        assert!(check_common(10, 9000, 0, 1).is_err());
        assert!(check_common(200_000, 9000, 1, 1)
            .unwrap_err()
            .to_string()
            .contains("--ports"));
        assert!(check_common(200_000, 9000, 4, 1).is_ok());
        assert!(check_common(10, 0, 1, 1)
            .unwrap_err()
            .to_string()
            .contains("--port 0"));
        assert!(check_common(10, 65_535, 2, 1)
            .unwrap_err()
            .to_string()
            .contains("past port 65535"));
        assert!(check_common(10, 65_534, 2, 1).is_ok());
        assert!(check_common(10, 9000, 1, 10_000_000)
            .unwrap_err()
            .to_string()
            .contains("file descriptors"));
    }
}
