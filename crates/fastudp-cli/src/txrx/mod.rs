//! `fastudp tx` and `fastudp rx`: the bench strategies between two hosts,
//! with flags after the kernel's udpgso_bench_tx/rx.

use fastudp_io::UdpIo;
mod control;

use crate::args::resolve_as;
use crate::engine::seq::{SenderCounts, Verifier, MAX_SENDERS};
use crate::engine::{self, report, rx, tx, Live, TxStrategy, Workload};
use crate::interrupt;
use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde::Serialize;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `fastudp tx`.
#[derive(Args, Debug, Clone)]
pub struct TxArgs {
    /// IPv4 (default).
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6.
    #[arg(short = '6')]
    pub ipv6: bool,
    /// Destination: a host name or address (a host running `fastudp rx`,
    /// or any UDP sink).
    #[arg(short = 'D', value_name = "HOST")]
    pub dest: String,
    /// Destination port.
    #[arg(short = 'p', default_value_t = 8000)]
    pub port: u16,
    /// Seconds to send.
    #[arg(short = 'l', default_value_t = 4.0, allow_negative_numbers = true)]
    pub secs: f64,
    /// Payload bytes per send call: one datagram, or with -S one GSO buffer.
    /// Default: 1472 (IPv4) or 1452 (IPv6) bytes, or with -S as many whole
    /// segments as one send may hold.
    #[arg(short = 's', value_name = "BYTES")]
    pub size: Option<usize>,
    /// GSO: cut each send into segments of this many bytes (UDP_SEGMENT cmsg).
    #[arg(short = 'S', value_name = "GSO_SIZE")]
    pub gso: Option<usize>,
    /// sendmmsg: 32 datagrams, or 8 GSO buffers, per call.
    #[arg(short = 'm')]
    pub mmsg: bool,
    /// MSG_ZEROCOPY (with -S: GSO buffers), completions reaped; reports
    /// how many sends the kernel copied anyway.
    #[arg(short = 'z', conflicts_with_all = ["mmsg", "tcp"])]
    pub zerocopy: bool,
    /// Rotate through 128 MiB of buffers (cache thrash).
    #[arg(short = 'c')]
    pub cache: bool,
    /// TCP instead of UDP.
    #[arg(short = 't', conflicts_with_all = ["gso", "mmsg"])]
    pub tcp: bool,
    /// No per-second lines.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Target rate in bits per second, paced (suffix k, M or G: -b 500M).
    #[arg(short = 'b', value_name = "RATE", allow_hyphen_values = true)]
    pub rate: Option<String>,
    /// Send from this local address.
    #[arg(short = 'B', value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// Seconds between interval lines.
    #[arg(short = 'i', default_value_t = 1.0, allow_negative_numbers = true)]
    pub interval: f64,
    /// Run the test with a `fastudp rx --server` on the destination: it
    /// picks the data port, and its receive counts (loss, duplicates,
    /// reordering, jitter, CPU) are printed with the send side.
    #[arg(short = 'C', long = "control", conflicts_with = "tcp")]
    pub control: bool,
    /// Reverse (with -C): the server sends to this host, at the same
    /// options (-s, -S, -m, -b, -l, within its limits), and this side
    /// receives and counts.
    #[arg(short = 'R', requires = "control", conflicts_with_all = ["zerocopy", "parallel", "bind"])]
    pub reverse: bool,
    /// The server's control port (with -C).
    #[arg(long, default_value_t = control::DEFAULT_CONTROL_PORT)]
    pub control_port: u16,
    /// Parallel streams: this many sockets, each on a thread of its own
    /// (-b is per stream, as in iperf3).
    #[arg(short = 'P', default_value_t = 1, allow_negative_numbers = true)]
    pub parallel: i64,
    /// Append the output (interval lines, summary, JSON) to this file
    /// instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub logfile: Option<String>,
}

/// Options of `fastudp rx`.
#[derive(Args, Debug, Clone)]
pub struct RxArgs {
    /// IPv4 only.
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 (dual stack: IPv4 senders are received too).
    #[arg(short = '6')]
    pub ipv6: bool,
    /// Port to listen on.
    #[arg(short = 'p', default_value_t = 8000)]
    pub port: u16,
    /// Use UDP GRO (coalesced receive).
    #[arg(short = 'G')]
    pub gro: bool,
    /// Verify: read the sequence number in each datagram's first 8 bytes
    /// (as `fastudp tx` writes it) and count lost, duplicate and reordered
    /// ones, per sender (address and port).
    #[arg(short = 'v')]
    pub verify: bool,
    /// TCP instead of UDP: accept one connection and read it to the end.
    #[arg(short = 't', conflicts_with_all = ["gro", "verify"])]
    pub tcp: bool,
    /// Stop this many seconds after the first datagram (default: when the
    /// sender has been silent for --idle seconds).
    #[arg(short = 'l', allow_negative_numbers = true)]
    pub secs: Option<f64>,
    /// Seconds of silence, after traffic started, that end the run.
    #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
    pub idle: f64,
    /// Seconds to wait for the first datagram before giving up.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pub wait: f64,
    /// No per-second lines.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Serve tests for `fastudp tx -C` on the control port (TCP), one at a
    /// time, until Ctrl-C: each test gets a data port of its own, and its
    /// counts go back to the client.
    #[arg(long, conflicts_with_all = ["tcp", "secs"])]
    pub server: bool,
    /// The control port (with --server).
    #[arg(long, default_value_t = control::DEFAULT_CONTROL_PORT)]
    pub control_port: u16,
    /// Longest test a client may ask for, seconds (with --server).
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pub max_duration: f64,
    /// Highest rate a client may ask for, bits per second (k, M, G); a
    /// client must then pace with -b (with --server).
    #[arg(long, value_name = "RATE", allow_hyphen_values = true)]
    pub max_rate: Option<String>,
    /// Tests run at once; more are told the server is busy (with --server).
    #[arg(long, default_value_t = 1)]
    pub concurrent: usize,
    /// Stop after this many tests (with --server).
    #[arg(long)]
    pub max_tests: Option<u64>,
    /// Append the output (interval lines, summary, JSON, the server's
    /// log) to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub logfile: Option<String>,
}

/// Parses a rate in bits per second, as iperf3's `-b`: a number with an
/// optional k, M or G (powers of 1000). Returns bytes per second.
/// A bad one is a usage error.
pub fn parse_rate(opt: &str, v: &str) -> anyhow::Result<u64> {
    let t = v.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1e3),
        Some((i, 'm' | 'M')) => (&t[..i], 1e6),
        Some((i, 'g' | 'G')) => (&t[..i], 1e9),
        _ => (t, 1.0),
    };
    let bits = num
        .parse::<f64>()
        .ok()
        .filter(|b| b.is_finite() && *b > 0.0)
        .map(|b| b * mul)
        .ok_or_else(|| usage!("{opt} {v}: give a rate in bits per second, such as 500M or 2G"))?;
    if !(8.0..=1e13).contains(&bits) {
        bail_usage!("{opt} {v} is out of range: 8 bit/s to 10 Tbit/s");
    }
    Ok((bits / 8.0) as u64)
}

/// The summary of a `tx` or `rx` run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The JSON layout's version (1), as in `bench --json`.
    pub schema: u32,
    /// The host: kernel, CPU, the library's probe (with `--json`).
    pub host: Option<report::Host>,
    /// The run's settings (with `--json`).
    pub settings: Option<serde_json::Value>,
    /// `tx` or `rx`.
    pub role: &'static str,
    /// The strategy the run used.
    pub mode: String,
    /// The other end, once known.
    pub peer: Option<String>,
    /// Payload bytes sent or received.
    pub bytes: u64,
    /// Datagrams sent or received.
    pub datagrams: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Payload Gbit/s.
    pub gbps: f64,
    /// Datagrams per second.
    pub datagrams_per_sec: f64,
    /// Send or receive calls per second.
    pub calls_per_sec: f64,
    /// The sending or receiving thread's CPU ns per byte.
    pub cpu_ns_per_byte: f64,
    /// Verified runs only: datagrams missing from the sequence.
    pub lost: Option<u64>,
    /// Verified runs only: datagrams seen twice.
    pub duplicates: Option<u64>,
    /// Verified runs only: datagrams that arrived after a later one.
    pub reordered: Option<u64>,
    /// Verified runs only: datagrams that arrived too far behind the
    /// sender's highest number to tell a duplicate from a late one.
    pub late: Option<u64>,
    /// Datagrams too short to carry a sequence number, or with one far
    /// beyond the sender's numbering (verified runs).
    pub unsequenced: Option<u64>,
    /// Verified runs only: datagrams from senders past the first
    /// [`MAX_SENDERS`], counted but not verified.
    pub unverified: Option<u64>,
    /// Verified runs only: each sender's counts.
    pub senders: Option<Vec<SenderCounts>>,
    /// `tx -z` only: zerocopy completions read from the error queue.
    pub zerocopy_completions: Option<u64>,
    /// `tx -z` only: completions the kernel copied anyway.
    pub zerocopy_copied: Option<u64>,
    /// Ctrl-C ended the run: the figures cover it until then.
    pub interrupted: bool,
    /// `tx -C` only: what the server received.
    pub server: Option<control::Outcome>,
    /// `tx -C -R` only: datagrams the server says it sent.
    pub sent_by_server: Option<u64>,
    /// The interval lines (bytes, datagrams, calls in each), with -i.
    pub intervals: Vec<Interval>,
    /// `rx` (UDP) only: messages the kernel dropped at the receiving
    /// socket because its buffer was full (`sk_drops`; a GRO train counts
    /// once).
    pub kernel_drops: Option<u64>,
    /// `rx` (UDP) only: the receiving socket's buffer, bytes (SO_RCVBUF as
    /// the kernel reports it).
    pub recv_buffer: Option<u64>,
}

/// One interval line.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    /// Seconds from the start to the interval's start.
    pub start: f64,
    /// Seconds from the start to its end.
    pub end: f64,
    /// Payload bytes in it.
    pub bytes: u64,
    /// Datagrams in it.
    pub datagrams: u64,
    /// Calls in it.
    pub calls: u64,
}

impl Summary {
    /// A summary with rates computed from totals; the verification and
    /// zerocopy fields start empty.
    #[allow(clippy::too_many_arguments)]
    fn new(
        role: &'static str,
        mode: String,
        peer: Option<String>,
        bytes: u64,
        datagrams: u64,
        calls: u64,
        seconds: f64,
        cpu: Duration,
    ) -> Self {
        let rate = |x: u64| {
            if seconds > 0.0 {
                x as f64 / seconds
            } else {
                0.0
            }
        };
        Summary {
            schema: 1,
            host: None,
            settings: None,
            role,
            mode,
            peer,
            bytes,
            datagrams,
            seconds,
            gbps: rate(bytes) * 8.0 / 1e9,
            datagrams_per_sec: rate(datagrams),
            calls_per_sec: rate(calls),
            cpu_ns_per_byte: if bytes > 0 {
                cpu.as_nanos() as f64 / bytes as f64
            } else {
                0.0
            },
            lost: None,
            duplicates: None,
            reordered: None,
            late: None,
            unsequenced: None,
            unverified: None,
            senders: None,
            zerocopy_completions: None,
            zerocopy_copied: None,
            interrupted: false,
            server: None,
            sent_by_server: None,
            intervals: Vec::new(),
            kernel_drops: None,
            recv_buffer: None,
        }
    }
}

/// Checks that option `name`'s value `v` is more than 0 and at most
/// `max`: a usage error if not.
fn in_range(name: &str, v: f64, max: f64) -> anyhow::Result<()> {
    if v > 0.0 && v <= max {
        Ok(())
    } else {
        bail_usage!("{name} {v} is out of range: more than 0 and at most {max}")
    }
}

fn print_summary(s: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        return out!("{}", serde_json::to_string_pretty(s)?);
    }
    out!(
        "{} {}: {:.1} MB in {:.2} s = {:.2} Gbit/s, {:.0} datagrams/s, {:.0} calls/s, {:.3} CPU ns/B",
        s.role,
        s.mode,
        s.bytes as f64 / 1e6,
        s.seconds,
        s.gbps,
        s.datagrams_per_sec,
        s.calls_per_sec,
        s.cpu_ns_per_byte
    )?;
    if let (Some(done), Some(copied)) = (s.zerocopy_completions, s.zerocopy_copied) {
        out!("zerocopy: {done} completions, {copied} copied by the kernel anyway")?;
    }
    if let (Some(l), Some(d), Some(r), Some(la), Some(u)) =
        (s.lost, s.duplicates, s.reordered, s.late, s.unsequenced)
    {
        out!("verified: {l} lost, {d} duplicate, {r} reordered, {la} late, {u} without a sequence number")?;
    }
    if let Some(ss) = s.senders.as_ref().filter(|ss| ss.len() > 1) {
        for c in ss {
            out!(
                "  from {}: {} received, {} lost, {} duplicate, {} reordered, {} late, {} without a sequence number",
                c.source, c.received, c.lost, c.duplicates, c.reordered, c.late, c.unsequenced
            )?;
        }
    }
    if let Some(o) = &s.server {
        let lost_pct = if s.datagrams > 0 {
            100.0 * o.lost as f64 / s.datagrams as f64
        } else {
            0.0
        };
        if o.datagrams > s.datagrams {
            out!(
                "server: reports {} datagrams received, more than the {} sent: its figures are not this test's",
                o.datagrams,
                s.datagrams
            )?;
        }
        out!(
            "server: {} of {} datagrams received ({:.1} MB), {} lost ({lost_pct:.3}%), {} duplicate, {} reordered; jitter {}; {:.3} CPU ns/B, {} receive calls for {} messages",
            o.datagrams,
            s.datagrams,
            o.bytes as f64 / 1e6,
            o.lost,
            o.duplicates,
            o.reordered,
            control::show_jitter(o.jitter_ms),
            o.cpu_ns_per_byte,
            o.calls,
            o.messages
        )?;
        if o.foreign > 0 {
            out!(
                "server: {} datagrams from other addresses were not counted",
                o.foreign
            )?;
        }
    }
    if let Some(drops) = s.kernel_drops.filter(|&d| d > 0) {
        for l in overrun_hint(drops, s.recv_buffer, s.mode.contains("gro")) {
            out!("{l}")?;
        }
    }
    if let Some(n) = s.unverified.filter(|&n| n > 0) {
        out!(
            "{n} datagrams from senders past the first {MAX_SENDERS} were counted but not verified"
        )?;
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

/// What `rx` says when the kernel dropped `drops` messages at its socket
/// for a full receive buffer (`buffer` bytes): the sender outran this
/// receiver, and how to measure without that.
pub fn overrun_hint(drops: u64, buffer: Option<u64>, gro: bool) -> Vec<String> {
    let size = buffer
        .map(|b| format!(" of {:.1} MB", b as f64 / 1e6))
        .unwrap_or_default();
    let mut v = vec![
        format!(
            "rx: the kernel dropped {drops} messages at this socket: its receive buffer{size} was full. The sender was faster than this receiver, and nothing between them slows it (no flow control in UDP)."
        ),
        "rx: to measure without this loss: pace the sender (`fastudp tx -b RATE`), or give this socket a larger buffer (raise net.core.rmem_max: `fastudp tune`)".to_string(),
    ];
    if gro {
        v[1].push('.');
    } else {
        v[1].push_str(
            ", or receive with GRO (`fastudp rx -G`), which takes a whole train per read.",
        );
    }
    v
}

/// Prints the summary, then ends with status 130 if Ctrl-C cut the run short.
fn finish(s: &Summary, json: bool) -> anyhow::Result<()> {
    print_summary(s, json)?;
    if s.interrupted {
        return Err(interrupt::summarized_err());
    }
    Ok(())
}

/// What `tx`'s options come to, once checked.
struct TxPlan {
    /// The destination (with -C: the server's address, at the data port
    /// it names once asked).
    dest: SocketAddr,
    t: TxStrategy,
    /// Payload bytes per datagram (TCP: per write).
    payload: usize,
    /// Datagrams per GSO send (1: none).
    segs: usize,
    /// Bytes per second per stream, if paced.
    rate: Option<u64>,
}

/// Runs `fastudp tx`.
pub fn run_tx(a: TxArgs) -> anyhow::Result<()> {
    let plan = validate_tx(&a)?;
    if a.reverse {
        return run_reverse(&a, &plan);
    }
    // With a server on the other side: ask for the test, and send to the
    // data port it opens.
    let mut dest = plan.dest;
    let control = if a.control {
        let (r, w, port) = control::request(
            SocketAddr::new(dest.ip(), a.control_port),
            a.bind,
            &control::Request {
                fastudp: control::PROTOCOL,
                seconds: a.secs,
                rate: plan.rate,
                mode: engine::name(plan.t),
                reverse: None,
                streams: a.parallel as u32,
            },
        )?;
        dest.set_port(port);
        Some((r, w))
    } else {
        None
    };
    interrupt::watch();
    let (o, intervals) = send_streams(&a, &plan, dest)?;
    let server = match control {
        Some((r, w)) => Some(server_outcome(r, w, &o)?),
        None => None,
    };
    finish(&tx_summary(&a, &plan, dest, &o, server, intervals), a.json)
}

/// Checks `tx`'s options (usage errors) and works out what to send.
fn validate_tx(a: &TxArgs) -> anyhow::Result<TxPlan> {
    if let Some(f) = &a.logfile {
        crate::output::to_file("--logfile", f)?;
    }
    in_range("-l", a.secs, 86_400.0)?;
    if a.secs < 0.01 {
        bail_usage!("-l {} is too short: at least 0.01 seconds", a.secs);
    }
    in_range("-i", a.interval, 3600.0)?;
    if a.interval < 0.1 {
        bail_usage!("-i {} is too short: at least 0.1 seconds", a.interval);
    }
    if a.port == 0 {
        bail_usage!("-p 0: give the destination port, 1 to 65535");
    }
    if !(1..=128).contains(&a.parallel) {
        bail_usage!("-P {} is out of range: 1 to 128 streams", a.parallel);
    }
    let rate = a.rate.as_deref().map(|v| parse_rate("-b", v)).transpose()?;
    let dest = resolve_as("-D", &a.dest, a.port, a.ipv4, a.ipv6)?;
    if let Some(b) = a.bind {
        if b.is_ipv6() != dest.is_ipv6() {
            bail_usage!(
                "-B {b} and the destination {} are of different address families",
                dest.ip()
            );
        }
    }
    let (t, payload, segs) = if a.tcp {
        let s = a.size.unwrap_or(64 * 1024);
        if s == 0 || s > 1 << 24 {
            bail_usage!("-s {s} is out of range for TCP: 1 to {}", 1 << 24);
        }
        (TxStrategy::Tcp, s, 1)
    } else if let Some(g) = a.gso {
        gso_shape(a, dest, g)?
    } else {
        udp_shape(a, dest.is_ipv6())?
    };
    Ok(TxPlan {
        dest,
        t,
        payload,
        segs,
        rate,
    })
}

/// `tx -S g`: the strategy, the segment size and the segments per send,
/// checked against the path MTU to `dest` and the kernel's limits.
fn gso_shape(a: &TxArgs, dest: SocketAddr, g: usize) -> anyhow::Result<(TxStrategy, usize, usize)> {
    let ipv6 = dest.is_ipv6();
    let max = fastudp_tools::wire::max_payload(ipv6);
    let kmax = fastudp_tools::os::kernel_max_segments().max(1);
    let mtu = probe_mtu(dest)?;
    let fit = fastudp_tools::wire::max_segment_for_mtu(mtu, ipv6);
    if g == 0 || g > fit {
        bail_usage!(
            "-S {g}: a GSO segment to {dest} must be 1 to {fit} bytes (path MTU {mtu} minus {} bytes of headers)",
            mtu - fit
        );
    }
    let s = a.size.unwrap_or(g * kmax.min(max / g));
    if !s.is_multiple_of(g) {
        // The suggestion is one that is accepted: whole segments, no
        // more than a send may hold.
        let fits = (s / g).min(kmax).min(max / g).max(1);
        bail_usage!(
            "-s {s} is not a multiple of -S {g}: fastudp tx sends whole segments (try -s {})",
            fits * g
        );
    }
    if s < g || s > max || s / g > kmax {
        bail_usage!(
            "-s {s} with -S {g}: a GSO send holds {g} to {} bytes and at most {kmax} segments",
            max.min(g * kmax)
        );
    }
    let t = if a.zerocopy {
        TxStrategy::GsoZerocopy
    } else if a.mmsg {
        TxStrategy::SendmmsgGso
    } else {
        TxStrategy::GsoCmsg
    };
    Ok((t, g, s / g))
}

/// `tx` without -S or -t: the strategy and the datagram's size.
fn udp_shape(a: &TxArgs, ipv6: bool) -> anyhow::Result<(TxStrategy, usize, usize)> {
    let max = fastudp_tools::wire::max_payload(ipv6);
    let s = a
        .size
        .unwrap_or(fastudp_tools::wire::max_segment_for_mtu(1500, ipv6));
    if s == 0 || s > max {
        bail_usage!("-s {s} is out of range: a UDP payload is 1 to {max} bytes");
    }
    let t = if a.zerocopy {
        TxStrategy::GsoZerocopy
    } else if a.mmsg {
        TxStrategy::Sendmmsg
    } else {
        TxStrategy::Sendto
    };
    Ok((t, s, 1))
}

/// The workload of each of `tx`'s streams.
fn tx_workload(a: &TxArgs, plan: &TxPlan) -> Workload {
    Workload {
        payload: plan.payload,
        batch: if a.mmsg { 32 } else { plan.segs },
        duration: Duration::from_secs_f64(a.secs),
        ipv6: plan.dest.is_ipv6(),
        segs: plan.segs,
        net: None,
        pin: false,
        cache_thrash: a.cache,
        connect: true,
        rate: plan.rate,
        bind: a.bind.map(|ip| SocketAddr::new(ip, 0)),
        busy_poll: None,
    }
}

/// Sends `a.parallel` streams to `dest`, each on a thread of its own,
/// while printing the interval lines; returns their summed outcome and
/// the intervals. A stream that fails ends the run: a runtime failure
/// that says what went out before it, unless nothing could (a usage
/// error, such as a strategy this host cannot run).
fn send_streams(
    a: &TxArgs,
    plan: &TxPlan,
    dest: SocketAddr,
) -> anyhow::Result<(engine::TxOutcome, Vec<Interval>)> {
    let (t, payload) = (plan.t, plan.payload);
    let w = tx_workload(a, plan);
    // One Live per stream; the interval lines sum them.
    let lives: Arc<Vec<Live>> = Arc::new((0..a.parallel).map(|_| Live::default()).collect());
    let l2 = lives.clone();
    let start = Instant::now();
    let h = std::thread::spawn(move || run_streams(t, dest, &w, &l2));
    let label = if a.parallel > 1 {
        format!("tx {} x{} -> {dest}", engine::name(t), a.parallel)
    } else {
        format!("tx {} -> {dest}", engine::name(t))
    };
    let totals = || {
        lives.iter().fold((0u64, 0u64), |(d, c), l| {
            (
                d + l.tx_datagrams.load(Relaxed),
                c + l.tx_calls.load(Relaxed),
            )
        })
    };
    let intervals = watch_intervals(&label, a.quiet || a.json, a.interval, &h, || {
        let (d, c) = totals();
        if t == TxStrategy::Tcp {
            (c * payload as u64, c, c)
        } else {
            (d * payload as u64, d, c)
        }
    })?;
    let e = match h.join().map_err(|_| anyhow!("sender thread panicked"))? {
        Ok(o) => return Ok((o, intervals)),
        Err(e) => e,
    };
    // Refused at once: nothing listens there. Refused later: it went away.
    if start.elapsed() < Duration::from_millis(500) && e.chain().any(|c| c.is::<tx::Refused>()) {
        bail!("{dest} does not answer: nothing listens on that port");
    }
    if e.chain().any(|c| c.is::<crate::failure::Usage>()) {
        return Err(e);
    }
    // What went out before the failure is reported, not lost.
    let (d, c) = totals();
    let sent = if t == TxStrategy::Tcp {
        format!("{} bytes in {c} writes", c * payload as u64)
    } else {
        format!("{d} datagrams ({} bytes) in {c} calls", d * payload as u64)
    };
    bail!(
        "{e:#}; stopped after {:.1} s, having sent {sent}",
        start.elapsed().as_secs_f64()
    )
}

/// Runs one sender per entry of `lives` (its counters) to `dest`, each on
/// a thread of its own; returns their summed outcome, or the first
/// failure.
fn run_streams(
    t: TxStrategy,
    dest: SocketAddr,
    w: &Workload,
    lives: &[Live],
) -> anyhow::Result<engine::TxOutcome> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = lives
            .iter()
            .map(|live| {
                sc.spawn(move || {
                    if t == TxStrategy::Tcp {
                        let s = TcpStream::connect_timeout(&dest, Duration::from_secs(3))
                            .map_err(|e| anyhow!("{dest} does not answer: {e}"))?;
                        tx::tcp(s, w, live)
                    } else {
                        tx::udp(t, dest, w, live)
                    }
                })
            })
            .collect();
        let mut total: Option<engine::TxOutcome> = None;
        for h in hs {
            let o = h
                .join()
                .map_err(|_| anyhow!("a sender thread panicked"))??;
            total = Some(match total {
                None => o,
                Some(t) => engine::TxOutcome {
                    datagrams: t.datagrams + o.datagrams,
                    bytes: t.bytes + o.bytes,
                    calls: t.calls + o.calls,
                    cpu: t.cpu + o.cpu,
                    seconds: t.seconds.max(o.seconds),
                    zerocopy: match (t.zerocopy, o.zerocopy) {
                        (Some(x), Some(y)) => Some((x.0 + y.0, x.1 + y.1)),
                        (x, y) => x.or(y),
                    },
                },
            });
        }
        total.ok_or_else(|| anyhow!("no stream ran"))
    })
}

/// `tx -C`, after sending: what the server received, where datagrams
/// that never arrived count as lost too, not only gaps in the sequence
/// (the tail of a run, or all of it).
fn server_outcome(
    r: std::io::BufReader<TcpStream>,
    w: TcpStream,
    o: &engine::TxOutcome,
) -> anyhow::Result<control::Outcome> {
    let mut out = control::finish(
        r,
        w,
        control::Done {
            datagrams: o.datagrams,
            bytes: o.bytes,
        },
    )?;
    out.lost = out.lost.max(o.datagrams.saturating_sub(out.datagrams));
    Ok(out)
}

/// The summary of a `tx` run to `dest`.
fn tx_summary(
    a: &TxArgs,
    plan: &TxPlan,
    dest: SocketAddr,
    o: &engine::TxOutcome,
    server: Option<control::Outcome>,
    intervals: Vec<Interval>,
) -> Summary {
    Summary {
        zerocopy_completions: o.zerocopy.map(|z| z.0),
        zerocopy_copied: o.zerocopy.map(|z| z.1),
        interrupted: interrupt::requested(),
        server,
        intervals,
        host: a.json.then(report::host_info),
        settings: a.json.then(|| {
            serde_json::json!({
                "destination": dest.to_string(),
                "seconds": a.secs,
                "payload": plan.payload,
                "segments_per_send": plan.segs,
                "strategy": engine::name(plan.t),
                "rate_bits_per_sec": plan.rate.map(|r| r * 8),
                "bind": a.bind.map(|b| b.to_string()),
                "interval": a.interval,
                "parallel": a.parallel,
                "control": a.control,
                "cache_thrash": a.cache,
            })
        }),
        ..Summary::new(
            "tx",
            engine::name(plan.t),
            Some(dest.to_string()),
            o.bytes,
            o.datagrams,
            o.calls,
            o.seconds.max(1e-9),
            o.cpu,
        )
    }
}

/// `tx -C -R`: the server sends, this side receives and reports.
fn run_reverse(a: &TxArgs, plan: &TxPlan) -> anyhow::Result<()> {
    let (server, t) = (plan.dest, plan.t);
    // Ctrl-C asks the server to stop, and the summary is printed, marked
    // interrupted, as for a forward test.
    interrupt::watch();
    let (_, sock) = rx::bind_batched(true, engine::unspecified(server.is_ipv6()))?;
    let port = sock
        .as_std()
        .local_addr()
        .context("the receiving socket")?
        .port();
    let (r, w, _) = control::request(
        SocketAddr::new(server.ip(), a.control_port),
        None,
        &control::Request {
            fastudp: control::PROTOCOL,
            seconds: a.secs,
            rate: plan.rate,
            mode: format!("reverse {}", engine::name(t)),
            reverse: Some(control::Reverse {
                port,
                payload: plan.payload,
                segments: plan.segs,
                mmsg: a.mmsg,
            }),
            streams: 1,
        },
    )?;
    if !a.quiet && !a.json {
        out!(
            "rx: {} sends {} to port {port} for {} s",
            server.ip(),
            engine::name(t),
            a.secs
        )?;
    }
    let (mut o, sent) = control::receive_reverse(r, w, sock, server.ip(), a.secs)?;
    if o.datagrams > sent.datagrams {
        eprintln!(
            "fastudp: warning: the server says it sent {} datagrams, fewer than the {} that arrived",
            sent.datagrams, o.datagrams
        );
    }
    o.lost = o.lost.max(sent.datagrams.saturating_sub(o.datagrams));
    let cpu = Duration::from_nanos((o.cpu_ns_per_byte * o.bytes as f64) as u64);
    let s = Summary {
        lost: Some(o.lost),
        duplicates: Some(o.duplicates),
        reordered: Some(o.reordered),
        late: Some(0),
        unsequenced: Some(0),
        sent_by_server: Some(sent.datagrams),
        interrupted: interrupt::requested(),
        host: a.json.then(report::host_info),
        ..Summary::new(
            "rx",
            format!("reverse {}", engine::name(t)),
            Some(server.ip().to_string()),
            o.bytes,
            o.datagrams,
            o.calls,
            o.seconds.max(1e-9),
            cpu,
        )
    };
    if !a.json {
        out!(
            "reverse: the server sent {} datagrams; {} arrived, {} lost, jitter {}",
            sent.datagrams,
            o.datagrams,
            o.lost,
            control::show_jitter(o.jitter_ms)
        )?;
    }
    finish(&s, a.json)
}

/// Prints a line every `every` seconds while `handle` runs (unless
/// `quiet`) and returns the intervals; `sample` gives the running totals
/// (bytes, datagrams, calls).
fn watch_intervals<T>(
    label: &str,
    quiet: bool,
    every: f64,
    handle: &std::thread::JoinHandle<T>,
    sample: impl Fn() -> (u64, u64, u64),
) -> anyhow::Result<Vec<Interval>> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut last = (0u64, 0u64, 0u64);
    let mut n = 1u32;
    while !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(10));
        let end = every * n as f64;
        if start.elapsed().as_secs_f64() >= end {
            let now = sample();
            let i = Interval {
                start: end - every,
                end,
                bytes: now.0 - last.0,
                datagrams: now.1 - last.1,
                calls: now.2 - last.2,
            };
            if !quiet {
                out!(
                    "[{label}] {:>6.2}-{:<6.2} s  {:>9.1} MB  {:>7.3} Gbit/s  {:>10.0} datagrams/s  {:>9.0} calls/s",
                    i.start,
                    i.end,
                    i.bytes as f64 / 1e6,
                    i.bytes as f64 * 8.0 / 1e9 / every,
                    i.datagrams as f64 / every,
                    i.calls as f64 / every
                )?;
            }
            out.push(i);
            last = now;
            n += 1;
        }
    }
    Ok(out)
}

/// The path MTU towards `dest`, from a connected probe socket.
fn probe_mtu(dest: SocketAddr) -> anyhow::Result<usize> {
    let s = std::net::UdpSocket::bind(engine::unspecified(dest.is_ipv6()))
        .and_then(|s| s.connect(dest).map(|()| s))
        .with_context(|| format!("no route to {dest}"))?;
    fastudp_tools::raw::path_mtu(&s).with_context(|| format!("cannot read the path MTU to {dest}"))
}

/// The unspecified address of a family at `port`: where `rx` listens.
fn listen_addr(ipv6: bool, port: u16) -> SocketAddr {
    let ip: IpAddr = if ipv6 {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    SocketAddr::new(ip, port)
}

/// Runs `fastudp rx`.
pub fn run_rx(a: RxArgs) -> anyhow::Result<()> {
    if let Some(f) = &a.logfile {
        crate::output::to_file("--logfile", f)?;
    }
    if let Some(l) = a.secs {
        in_range("-l", l, 86_400.0)?;
    }
    in_range("--idle", a.idle, 3600.0)?;
    in_range("--wait", a.wait, 86_400.0)?;
    if a.port == 0 {
        bail_usage!("-p 0: give the port to listen on, 1 to 65535");
    }
    interrupt::watch();
    if a.server {
        return serve(&a);
    }
    let addr = listen_addr(a.ipv6, a.port);
    if a.tcp {
        return rx_tcp(&a, addr);
    }
    let (strategy, sock) = rx::bind_batched(a.gro, addr)?;
    if !a.quiet && !a.json {
        out!("rx: listening on {addr} ({})", engine::rname(strategy))?;
    }
    let c = receive_udp(&a, addr, &sock)?;
    finish(&rx_summary(&a, addr, strategy, &sock, c), a.json)
}

/// What `rx` counted.
struct RxCounts {
    /// The sequence numbers seen (with -v).
    verifier: Verifier,
    bytes: u64,
    datagrams: u64,
    /// Receive calls that returned data.
    calls: u64,
    /// Seconds from the first datagram to the last.
    seconds: f64,
    /// The first sender.
    peer: Option<SocketAddr>,
    /// The thread's CPU time from the first datagram on.
    cpu: Duration,
}

/// Receives on `sock` until `a`'s time is up, the sender falls silent, or
/// Ctrl-C; prints a line a second (unless quiet). A failed receive, or no
/// datagram within `--wait`, is a runtime failure.
fn receive_udp(
    a: &RxArgs,
    addr: SocketAddr,
    sock: &fastudp_io::Socket,
) -> anyhow::Result<RxCounts> {
    let mut batch = fastudp_io::RecvBatch::new(32);
    let mut v = Verifier::default();
    let (mut bytes, mut dgrams, mut calls) = (0u64, 0u64, 0u64);
    let waiting = Instant::now();
    let mut first: Option<Instant> = None;
    let mut last_data = Instant::now();
    let mut peer = None;
    let mut tick = 1u32;
    let mut last = (0u64, 0u64, 0u64);
    let mut cpu0 = fastudp_tools::os::thread_cpu_time();
    let lines = !a.quiet && !a.json;
    while !interrupt::requested() {
        match sock.recv(&mut batch) {
            Ok(_) => {
                let now = Instant::now();
                if first.is_none() {
                    first = Some(now);
                    cpu0 = fastudp_tools::os::thread_cpu_time();
                }
                last_data = now;
                calls += 1;
                for (m, buf) in &batch {
                    peer.get_or_insert(m.source);
                    bytes += m.len as u64;
                    if a.verify {
                        for d in m.datagrams(buf) {
                            v.datagram(m.source, d);
                            dgrams += 1;
                        }
                    } else {
                        dgrams += m.datagrams(buf).len() as u64;
                    }
                }
            }
            Err(e) if e.is_would_block() => {}
            // A signal (Ctrl-C) interrupted the wait: the loop's check
            // ends the run with its summary.
            Err(e)
                if e.io_error().map(std::io::Error::kind)
                    == Some(std::io::ErrorKind::Interrupted) => {}
            Err(e) => bail!("receive failed: {e}"),
        }
        let now = Instant::now();
        let Some(f) = first else {
            if now.duration_since(waiting).as_secs_f64() > a.wait {
                bail!("no datagram arrived on {addr} in {} s", a.wait);
            }
            continue;
        };
        if now.duration_since(f) >= Duration::from_secs(tick as u64) {
            if lines {
                let (b, d, c) = (bytes - last.0, dgrams - last.1, calls - last.2);
                report::print_interval("rx", tick, b, d, c)?;
            }
            last = (bytes, dgrams, calls);
            tick += 1;
        }
        if a.secs
            .is_some_and(|l| now.duration_since(f).as_secs_f64() >= l)
            || now.duration_since(last_data).as_secs_f64() >= a.idle
        {
            break;
        }
    }
    Ok(RxCounts {
        verifier: v,
        bytes,
        datagrams: dgrams,
        calls,
        seconds: match first {
            Some(f) => last_data.duration_since(f).as_secs_f64().max(1e-3),
            None => 0.0,
        },
        peer,
        cpu: fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0),
    })
}

/// The summary of an `rx` run (UDP) on `sock`, listening at `addr`.
fn rx_summary(
    a: &RxArgs,
    addr: SocketAddr,
    strategy: engine::RxStrategy,
    sock: &fastudp_io::Socket,
    c: RxCounts,
) -> Summary {
    let st = sock.stats();
    if st.truncated > 0 {
        eprintln!("fastudp: warning: {} messages were truncated", st.truncated);
    }
    let recv_buffer = socket2::SockRef::from(sock.as_std())
        .recv_buffer_size()
        .ok()
        .map(|b| b as u64);
    let v = &c.verifier;
    let t = v.totals();
    Summary {
        kernel_drops: Some(st.kernel_drops),
        recv_buffer,
        lost: a.verify.then_some(t.lost),
        duplicates: a.verify.then_some(t.duplicates),
        reordered: a.verify.then_some(t.reordered),
        late: a.verify.then_some(t.late),
        unsequenced: a.verify.then_some(t.unsequenced),
        unverified: a.verify.then_some(v.untracked),
        senders: a.verify.then(|| v.per_sender()),
        interrupted: interrupt::requested(),
        host: a.json.then(report::host_info),
        settings: a.json.then(|| {
            serde_json::json!({
                "listen": addr.to_string(),
                "gro": a.gro,
                "verify": a.verify,
                "seconds": a.secs,
                "idle": a.idle,
            })
        }),
        ..Summary::new(
            "rx",
            engine::rname(strategy),
            c.peer.map(|p| p.to_string()),
            c.bytes,
            c.datagrams,
            c.calls,
            c.seconds,
            c.cpu,
        )
    }
}

/// `fastudp rx --server`.
fn serve(a: &RxArgs) -> anyhow::Result<()> {
    in_range("--max-duration", a.max_duration, 86_400.0)?;
    if a.control_port == 0 {
        bail_usage!("--control-port 0: give the port to listen on, 1 to 65535");
    }
    if a.max_tests == Some(0) {
        bail_usage!("--max-tests 0: give at least 1 (or leave it out to serve until Ctrl-C)");
    }
    if a.concurrent == 0 || a.concurrent > 64 {
        bail_usage!("--concurrent {} is out of range: 1 to 64", a.concurrent);
    }
    let max_rate = a
        .max_rate
        .as_deref()
        .map(|v| parse_rate("--max-rate", v))
        .transpose()?;
    control::serve(
        listen_addr(a.ipv6, a.control_port),
        control::Limits {
            max_seconds: a.max_duration,
            max_rate,
        },
        a.concurrent,
        a.max_tests,
        a.gro,
        a.quiet || a.json,
    )
}

/// Waits up to `wait` seconds for one connection on `l` (listening at
/// `addr`), or Ctrl-C.
fn accept_within(
    l: &TcpListener,
    addr: SocketAddr,
    wait: f64,
) -> anyhow::Result<(TcpStream, SocketAddr)> {
    l.set_nonblocking(true).context("the listening socket")?;
    let waiting = Instant::now();
    loop {
        match l.accept() {
            Ok(c) => return Ok(c),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if interrupt::requested() {
                    return Err(interrupt::interrupted("no connection had arrived"));
                }
                if waiting.elapsed().as_secs_f64() > wait {
                    bail!("no connection arrived on {addr} in {wait} s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(anyhow::Error::new(e).context("accept")),
        }
    }
}

fn rx_tcp(a: &RxArgs, addr: SocketAddr) -> anyhow::Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    if !a.quiet && !a.json {
        out!("rx: listening on {addr} (tcp)")?;
    }
    let (mut s, peer) = accept_within(&l, addr, a.wait)?;
    s.set_nonblocking(false)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_millis(200))))
        .context("the TCP connection")?;
    let mut buf = vec![0u8; 256 * 1024];
    let (mut bytes, mut calls) = (0u64, 0u64);
    let start = Instant::now();
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    let mut tick = 1u32;
    let mut last = (0u64, 0u64);
    loop {
        if interrupt::requested() || a.secs.is_some_and(|l| start.elapsed().as_secs_f64() >= l) {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                bytes += n as u64;
                calls += 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(anyhow::Error::new(e).context("TCP receive failed")),
        }
        if start.elapsed() >= Duration::from_secs(tick as u64) {
            if !a.quiet && !a.json {
                report::print_interval("rx tcp", tick, bytes - last.0, 0, calls - last.1)?;
            }
            last = (bytes, calls);
            tick += 1;
        }
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    finish(
        &Summary {
            interrupted: interrupt::requested(),
            ..Summary::new(
                "rx",
                "tcp".into(),
                Some(peer.to_string()),
                bytes,
                0,
                calls,
                secs,
                cpu,
            )
        },
        a.json,
    )
}
