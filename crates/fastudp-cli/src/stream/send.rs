//! `fastudp stream`: many paced flows.

use super::args::{check_common, PacingArg, StreamArgs};
use super::header::{mode_byte, HDR, MAGIC};
use super::summary::{bits_per_sec, finish, steal_since, StreamSummary};
use crate::host::routes::egress_qdisc;
use crate::interrupt;
use crate::procfs::CpuTicks;
use anyhow::{bail, Context};
use fastudp_io::pacing::{choose_mode, PacingMode};
use fastudp_io::UdpIo;
use fastudp_io::{Config, SendMeta, Socket, Transmit, ZeroCopySender};
use fastudp_tools::pacing::{
    Due, Scheduler, SchedulerConfig, Waiter, DEFAULT_BATCH_BYTES, DEFAULT_SLACK,
    MAX_TRAINS_PER_BATCH,
};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Runs `fastudp stream`.
pub fn run_stream(a: StreamArgs) -> anyhow::Result<()> {
    validate(&a)?;
    let socks = open_sockets(&a)?;
    let qdisc = egress_qdisc(a.dest);
    interrupt::watch();
    let wanted = match a.pacing {
        PacingArg::Kernel => PacingMode::Kernel,
        PacingArg::User => PacingMode::User,
        PacingArg::None => PacingMode::None,
    };
    let (mode, reason) = choose_mode(
        wanted,
        socks[0]
            .capabilities()
            .supports(fastudp_io::Feature::Txtime),
        qdisc.as_deref(),
    );
    if a.total_rate.is_some() && mode != PacingMode::User {
        eprintln!("fastudp: note: --total-rate applies to user-space pacing only; pacing is {mode} here, so it is not used");
    }
    if mode == PacingMode::Kernel {
        for s in &socks {
            s.enable_txtime(true)
                .map_err(|e| usage!("--pacing kernel: {e}"))?;
        }
    }
    if mode == PacingMode::User {
        // Sleeps that end on time are what user-space pacing is made of;
        // without this they may end 50 us late. Best effort.
        let _ = fastudp_tools::os::set_timer_slack(1_000);
    }
    let t0 = fastudp_tools::os::monotonic_ns() + 10_000_000;
    let mut sched = Scheduler::new(
        &SchedulerConfig::new(
            a.flows,
            a.rate,
            Duration::from_secs_f64(a.interval / 1000.0),
            a.payload,
        )
        .max_burst(a.max_burst)
        .mode(mode)
        .total_rate(a.total_rate)
        .batch_bytes(DEFAULT_BATCH_BYTES),
        t0,
    )
    .map_err(|e| usage!("{e}"))?;
    let end = t0 + (a.duration * 1e9) as u64;
    let mut tx = Sender::new(&a, socks, mode)?;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    let ticks0 = CpuTicks::now();
    tx.stream(&mut sched, end)?;
    let stopped = fastudp_tools::os::monotonic_ns();
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let steal = steal_since(ticks0);
    tx.wind_up();
    // Cut short by Ctrl-C, or by every port refusing, the run lasted until
    // then.
    let interrupted = interrupt::requested();
    let all_refused = tx.refused.len() == a.ports as usize;
    let secs = if interrupted || all_refused {
        (stopped.saturating_sub(t0) as f64 / 1e9).clamp(1e-3, a.duration)
    } else {
        a.duration
    };
    let reason = if mode == PacingMode::User {
        format!(
            "{reason}; all flows together at most {}",
            bits_per_sec(sched.total_rate())
        )
    } else {
        reason
    };
    let mut s = tx.summary(secs, cpu, mode, reason);
    s.host_steal = steal;
    s.interrupted = interrupted;
    finish(&s, a.json)?;
    if all_refused {
        bail!(
            "nothing listens at {}: every port refused the stream (ICMP port unreachable)",
            destinations(a.dest, &tx.refused)
        );
    }
    Ok(())
}

/// `addr:port`, or the address and its ports, for messages.
pub fn destinations(ip: IpAddr, ports: &BTreeSet<u16>) -> String {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let host = if ip.is_ipv6() {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    match ports.len() {
        1 => format!("{host}:{}", ports[0]),
        _ => format!("{host} ports {}", ports.join(", ")),
    }
}

/// Checks the options before anything is opened.
fn validate(a: &StreamArgs) -> anyhow::Result<()> {
    check_common(a.flows, a.port, a.ports, a.sockets)?;
    if !(a.interval > 0.0 && a.interval <= 1000.0) {
        bail_usage!(
            "--interval {} ms is out of range: more than 0, at most 1000",
            a.interval
        );
    }
    if !(a.duration >= 0.01 && a.duration <= 86_400.0) {
        bail_usage!(
            "--duration {} is out of range: 0.01 to 86400 seconds",
            a.duration
        );
    }
    let max = fastudp_tools::wire::max_payload(a.dest.is_ipv6());
    if a.payload < HDR || a.payload > 1472 {
        bail_usage!(
            "--payload {} is out of range: {HDR} to 1472 bytes (one MTU-sized segment)",
            a.payload
        );
    }
    if a.max_burst == 0 || a.max_burst * a.payload > max {
        bail_usage!(
            "--max-burst {} is out of range: 1 to {}",
            a.max_burst,
            max / a.payload
        );
    }
    let sum = a.rate as u128 * a.flows as u128;
    if let Some(t) = a.total_rate.filter(|&t| (t as u128) < sum) {
        bail_usage!("--total-rate {t} is below --flows x --rate = {sum} bytes/s: the flows could not reach their rate");
    }
    Ok(())
}

/// The unconnected send sockets the flows are spread over.
fn open_sockets(a: &StreamArgs) -> anyhow::Result<Vec<Socket>> {
    let bind: SocketAddr = if a.dest.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("literal");
    (0..a.sockets)
        .map(|_| {
            Socket::bind(bind, Config::default().send_buffer(8 << 20))
                .with_context(|| format!("cannot open a send socket on {bind}"))
        })
        .collect()
}

/// One train of a batch: where its bytes are in the batch buffer, where it
/// goes, and when.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Offset in the batch buffer.
    off: usize,
    /// Bytes.
    len: usize,
    /// The flow's receiver.
    dest: SocketAddr,
    /// Datagrams in the train.
    segs: usize,
    /// Its departure time, with kernel pacing.
    txtime: Option<u64>,
}

/// The sending side of a run: the sockets, the batch being built, and the
/// counts.
struct Sender<'a> {
    a: &'a StreamArgs,
    mode: PacingMode,
    socks: Vec<Socket>,
    zcs: Vec<ZeroCopySender>,
    buf: Vec<u8>,
    pending: Vec<Pending>,
    /// The next sequence number of each flow.
    seqs: Vec<u64>,
    /// Bytes sent per flow.
    sent_bytes: Vec<u64>,
    /// Send calls (counted here with zerocopy; by the sockets otherwise).
    calls: u64,
    /// Bytes sent.
    total: u64,
    /// Datagrams sent (of which the sockets' `dropped_locally` never left
    /// the host).
    datagrams: u64,
    /// Packets the qdisc dropped for their departure time.
    txtime_errors: u64,
    /// Batches sent: the socket of the next is this modulo the sockets.
    next_sock: usize,
    /// The ports that refused datagrams (ICMP port unreachable, read from
    /// the error queue): their flows are sent no more (with zerocopy,
    /// marked at the end).
    refused: BTreeSet<u16>,
}

impl<'a> Sender<'a> {
    fn new(a: &'a StreamArgs, socks: Vec<Socket>, mode: PacingMode) -> anyhow::Result<Self> {
        let zcs = if a.zerocopy {
            socks
                .iter()
                .map(ZeroCopySender::new)
                .collect::<Result<_, _>>()
                .map_err(|e| usage!("--zerocopy: {e}"))?
        } else {
            Vec::new()
        };
        Ok(Sender {
            a,
            mode,
            socks,
            zcs,
            buf: vec![0u8; MAX_TRAINS_PER_BATCH * a.max_burst * a.payload],
            pending: Vec::with_capacity(MAX_TRAINS_PER_BATCH),
            seqs: vec![0; a.flows],
            sent_bytes: vec![0; a.flows],
            calls: 0,
            total: 0,
            datagrams: 0,
            txtime_errors: 0,
            next_sock: 0,
            refused: BTreeSet::new(),
        })
    }

    /// Sends what `sched` makes due until `end` (monotonic ns) or Ctrl-C,
    /// with a line per second unless quiet.
    fn stream(&mut self, sched: &mut Scheduler, end: u64) -> anyhow::Result<()> {
        let mut dues = Vec::with_capacity(MAX_TRAINS_PER_BATCH);
        let started = Instant::now();
        let (mut tick, mut last_total) = (1u64, 0u64);
        let mut waiter = Waiter::tolerating(DEFAULT_SLACK);
        loop {
            let now = fastudp_tools::os::monotonic_ns();
            if now >= end || interrupt::requested() {
                return Ok(());
            }
            // The trains due now, one batch (in user space: at most 16 KiB,
            // and only once the previous batches have drained at the total
            // rate, so a late wake-up does not become a burst).
            dues.clear();
            sched.due(now, &mut dues);
            if dues.is_empty() {
                let due = sched.next_at().min(end);
                if self.mode == PacingMode::User {
                    waiter.wait_until(due);
                } else {
                    // Unpaced flows and kernel pacing need no precise
                    // wake-up: sleep, and do not spin.
                    let left = due.saturating_sub(fastudp_tools::os::monotonic_ns());
                    std::thread::sleep(Duration::from_nanos(left));
                }
                continue;
            }
            self.fill(&dues);
            let sock = self.next_sock % self.socks.len();
            self.next_sock += 1;
            if self.a.zerocopy {
                self.send_zerocopy(sock)?;
            } else {
                self.send(sock)?;
            }
            // With zerocopy the error queue also holds the completions,
            // which only the zerocopy sender may read: there the refusals
            // are read at the end, once every send has completed.
            if !self.a.zerocopy && self.next_sock.is_multiple_of(64) {
                self.read_errors();
                if self.refused.len() == self.a.ports as usize {
                    return Ok(());
                }
            }
            if !self.a.quiet && !self.a.json && started.elapsed() >= Duration::from_secs(tick) {
                out!(
                    "[stream] {:>3}-{:<3} s  {:>8.3} Gbit/s",
                    tick - 1,
                    tick,
                    (self.total - last_total) as f64 * 8.0 / 1e9
                )?;
                last_total = self.total;
                tick += 1;
            }
        }
    }

    /// Writes the datagrams of the trains due into the batch buffer, each
    /// with its flow's header.
    fn fill(&mut self, dues: &[Due]) {
        let p = self.a.payload;
        self.pending.clear();
        let mut off = 0;
        for d in dues {
            let (f, segs) = (d.flow, d.departure.segments);
            let port = self.port_of(f);
            if self.refused.contains(&port) {
                continue;
            }
            let len = segs * p;
            for s in 0..segs {
                let b = &mut self.buf[off + s * p..off + (s + 1) * p];
                b[..4].copy_from_slice(&(f as u32).to_be_bytes());
                b[4..12].copy_from_slice(&self.seqs[f].to_le_bytes());
                b[12] = mode_byte(self.mode);
                b[13..HDR].copy_from_slice(MAGIC);
                self.seqs[f] += 1;
            }
            let dest = SocketAddr::new(self.a.dest, port);
            let txtime = (self.mode == PacingMode::Kernel).then_some(d.departure.at_ns);
            self.pending.push(Pending {
                off,
                len,
                dest,
                segs,
                txtime,
            });
            self.sent_bytes[f] += len as u64;
            self.datagrams += segs as u64;
            off += len;
        }
    }

    /// Sends the batch with MSG_ZEROCOPY on socket `sock`.
    fn send_zerocopy(&mut self, sock: usize) -> anyhow::Result<()> {
        let zc = &mut self.zcs[sock];
        for t in &self.pending {
            let mut b = zc.pop_done().unwrap_or_default();
            b.clear();
            b.extend_from_slice(&self.buf[t.off..t.off + t.len]);
            let gso = (t.segs > 1).then_some(self.a.payload);
            if let Err((e, _)) = zc.send(&self.socks[sock], t.dest, b, gso, SendMeta::default()) {
                bail!("zerocopy send to {} failed: {e}", t.dest);
            }
            self.calls += 1;
            self.total += t.len as u64;
        }
        zc.reap(&self.socks[sock])?;
        Ok(())
    }

    /// Sends the batch on socket `sock`, all of it. Datagrams a full local
    /// queue drops are done, as the kernel would have it without
    /// `IP_RECVERR`: the run goes on at its pace, and the sockets count
    /// them ([`fastudp_io::Stats::dropped_locally`]).
    fn send(&mut self, sock: usize) -> anyhow::Result<()> {
        let p = self.a.payload;
        let mut ts: Vec<Transmit<'_>> = self
            .pending
            .iter()
            .map(|t| {
                let c = &self.buf[t.off..t.off + t.len];
                let tr = if t.segs > 1 {
                    Transmit::train(t.dest, c, p)
                } else {
                    Transmit::new(t.dest, c)
                };
                tr.with_txtime(t.txtime)
            })
            .collect();
        self.total += ts.iter().map(|t| t.contents.len() as u64).sum::<u64>();
        let mut k = 0;
        while k < ts.len() {
            match self.socks[sock].send(&ts[k..]) {
                Ok(n) => {
                    k += n.transmits;
                    if n.datagrams > 0 {
                        ts[k] = ts[k].skip_datagrams(n.datagrams);
                    }
                }
                Err(e)
                    if e.is_would_block()
                        || e.io_error()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::OutOfMemory) =>
                {
                    std::thread::yield_now()
                }
                Err(e) => bail!("send failed: {e}"),
            }
        }
        Ok(())
    }

    /// The port flow `f` is sent to.
    fn port_of(&self, f: usize) -> u16 {
        self.a.port + (f % self.a.ports as usize) as u16
    }

    /// Reads the sockets' error queues: the ports that refused datagrams
    /// (nothing listens there), and the packets the qdisc dropped for a
    /// missed or invalid departure time (SOF_TXTIME_REPORT_ERRORS).
    fn read_errors(&mut self) {
        let first = self.a.port;
        let last = first as u32 + self.a.ports as u32 - 1;
        for s in &self.socks {
            while let Ok(Some(e)) = s.recv_error() {
                let (errno, ..) = e.raw();
                match e.kind() {
                    fastudp_io::SocketErrorKind::Txtime => self.txtime_errors += 1,
                    // Port unreachable, whose errno is ECONNREFUSED.
                    fastudp_io::SocketErrorKind::Unreachable if errno == libc::ECONNREFUSED => {
                        let destination = e.destination();
                        // Without the destination, only a single port can
                        // be the one.
                        let port = match destination {
                            Some(d) if d.ip().to_canonical() == self.a.dest.to_canonical() => {
                                Some(d.port())
                            }
                            Some(_) => None,
                            None => (self.a.ports == 1).then_some(first),
                        };
                        if let Some(p) =
                            port.filter(|&p| (first as u32..=last).contains(&(p as u32)))
                        {
                            self.refused.insert(p);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The flows whose port refused datagrams.
    fn refused_flows(&self) -> usize {
        (0..self.a.flows)
            .filter(|&f| self.refused.contains(&self.port_of(f)))
            .count()
    }

    /// After the run: lets zerocopy sends complete, reads the refusals
    /// and txtime drops not read yet, and says what the qdisc dropped.
    fn wind_up(&mut self) {
        for (zc, s) in self.zcs.iter_mut().zip(&self.socks) {
            let _ = zc.drain(s, Duration::from_secs(2));
            if let Some(f) = zc.stats().fallback {
                eprintln!("fastudp: note: {}", f.reason);
            }
        }
        self.read_errors();
        if self.txtime_errors > 0 {
            eprintln!(
                "fastudp: warning: the qdisc dropped {} packets for a missed or invalid departure time",
                self.txtime_errors
            );
        }
    }

    /// The summary of a run that lasted `secs` and took `cpu`.
    fn summary(&self, secs: f64, cpu: Duration, mode: PacingMode, reason: String) -> StreamSummary {
        let a = self.a;
        let target = a.rate as f64 * secs;
        // A flow whose port refused it is never on rate, whatever it sent
        // before the refusal came back.
        let within = self
            .sent_bytes
            .iter()
            .enumerate()
            .filter(|&(f, &b)| {
                !self.refused.contains(&self.port_of(f))
                    && (b as f64 - target).abs() <= 0.05 * target
            })
            .count();
        let calls: u64 = if a.zerocopy {
            self.calls
        } else {
            self.socks.iter().map(|s| s.stats().send_calls).sum()
        };
        let total = self.total;
        let gbit = total as f64 * 8.0 / 1e9;
        StreamSummary {
            role: "stream",
            flows: a.flows,
            flows_within_5pct: within as f64 / a.flows as f64,
            pacing: mode.to_string(),
            pacing_reason: reason,
            gbps: gbit / secs,
            cpu_ns_per_byte: if total > 0 {
                cpu.as_nanos() as f64 / total as f64
            } else {
                0.0
            },
            cpu_sec_per_gbit: if gbit > 0.0 {
                cpu.as_secs_f64() / gbit
            } else {
                0.0
            },
            calls_per_sec: calls as f64 / secs,
            loss: None,
            duplicates: None,
            reordered: None,
            gap_us_p50: None,
            gap_us_p90: None,
            gap_us_p99: None,
            max_back_to_back: None,
            foreign: None,
            out_of_range: None,
            host_steal: None,
            seconds: secs,
            bytes: total,
            interrupted: false,
            refused_ports: Some(self.refused.iter().copied().collect()),
            refused_flows: Some(self.refused_flows()),
            datagrams: Some(self.datagrams),
            // The zerocopy path counts its drops in the socket's stats too.
            dropped_locally: Some(self.socks.iter().map(|s| s.stats().dropped_locally).sum()),
        }
    }
}
