//! The control channel between `fastudp tx -C` and `fastudp rx --server`,
//! as iperf3 has one: the client asks for a test over TCP, the server
//! opens a data port, the client sends, and the server answers with what
//! it received, so that the client prints both sides in one summary.
//!
//! The protocol is one JSON object per line, each way: a [`Request`], a
//! [`Reply`], then the client's [`Done`] and the server's [`Outcome`].
//!
//! The server faces the network, so it trusts nothing it reads:
//! - every line is bounded ([`MAX_LINE`] bytes) and must arrive whole
//!   within its phase's time (5 s for a request, the test plus 10 s for a
//!   report), however slowly it trickles, so an idle, slow or half-open
//!   client cannot hold it;
//! - requests are checked (protocol version, unknown fields refused,
//!   duration and rate within the server's `--max-duration` and
//!   `--max-rate`);
//! - it runs at most `--concurrent` tests at once (default 1) and tells
//!   the others it is busy;
//! - it receives on a port of its own and counts only datagrams from the
//!   client's address (others are counted as foreign);
//! - in a reverse test it sends only to the address of the client's
//!   control connection (a request names a port, never a host), within
//!   the same limits, on a connected socket; a client that hangs up its
//!   control connection (or whose port goes away: an ICMP error) ends the
//!   test at once; it cannot be made to send traffic to anyone else;
//! - `--max-rate` bounds each test (payload bytes, all its streams); with
//!   `--concurrent N`, N tests may each use it;
//! - text from the other side is printed with control characters escaped.

use crate::engine::rx;
use crate::engine::seq::Verifier;
use crate::interrupt;
use anyhow::{anyhow, bail, Context};
use fastudp_io::UdpIo;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The control port unless `--control-port` says otherwise.
pub const DEFAULT_CONTROL_PORT: u16 = 8001;
/// The protocol version this build speaks.
pub const PROTOCOL: u32 = 1;
/// The longest line either side reads.
pub const MAX_LINE: usize = 4096;
/// How long the server waits for a request once connected.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past the test's duration the server waits for the client's
/// [`Done`] before it gives the test up.
pub const DONE_GRACE: Duration = Duration::from_secs(10);
/// Silence on the data port, after the client is done, that ends a test.
const DRAIN: Duration = Duration::from_millis(300);

/// What the client asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The protocol version ([`PROTOCOL`]).
    pub fastudp: u32,
    /// Seconds the client will send.
    pub seconds: f64,
    /// The client's sending rate in bytes per second, if paced.
    pub rate: Option<u64>,
    /// The client's send mode, for the server's log.
    pub mode: String,
    /// Reverse (`tx -C -R`): the server sends, the client receives.
    #[serde(default)]
    pub reverse: Option<Reverse>,
    /// Parallel streams (`tx -P`), each at `rate`.
    #[serde(default = "one")]
    pub streams: u32,
}

fn one() -> u32 {
    1
}

/// What the server sends in a reverse test: always to the address of the
/// client's control connection, at the port given here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reverse {
    /// The client's UDP port to send to.
    pub port: u16,
    /// Payload bytes per datagram.
    pub payload: usize,
    /// Datagrams per GSO send (1: none).
    pub segments: usize,
    /// Batch sends with sendmmsg.
    pub mmsg: bool,
}

/// The server's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// Send to this UDP port of the server's address.
    Ready {
        /// The data port.
        data_port: u16,
    },
    /// Not now, or not this: why.
    Refused {
        /// Why, for people.
        error: String,
    },
}

/// The client's report once it has stopped sending.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {
    /// Datagrams sent.
    pub datagrams: u64,
    /// Payload bytes sent.
    pub bytes: u64,
}

/// What the server received in a test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// Datagrams received from the client's address.
    pub datagrams: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Seconds from the first datagram to the last.
    pub seconds: f64,
    /// Sequence numbers missing (never arrived).
    pub lost: u64,
    /// Datagrams that arrived twice.
    pub duplicates: u64,
    /// Datagrams that arrived after a later one.
    pub reordered: u64,
    /// Interarrival jitter (RFC 3550), ms; the mean over the client's
    /// sockets.
    pub jitter_ms: f64,
    /// The receiving thread's CPU ns per byte.
    pub cpu_ns_per_byte: f64,
    /// Receive calls that returned data.
    pub calls: u64,
    /// Messages received (a GRO train counts once).
    pub messages: u64,
    /// Datagrams from other addresses, not counted above.
    pub foreign: u64,
}

/// A jitter for people: ms with 3 decimals, or us below 10 us.
pub fn show_jitter(ms: f64) -> String {
    if ms < 0.01 {
        format!("{:.2} us", ms * 1000.0)
    } else {
        format!("{ms:.3} ms")
    }
}

/// Reads one line of at most [`MAX_LINE`] bytes, all of it before
/// `deadline`: the read timeout is set to the time left before every read,
/// so a peer that trickles a byte at a time cannot stretch the wait.
pub fn read_line_by(r: &mut BufReader<TcpStream>, deadline: Instant) -> anyhow::Result<String> {
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("timed out waiting for the other side");
        }
        r.get_ref()
            .set_read_timeout(Some(left))
            .context("control connection")?;
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                        anyhow!("timed out waiting for the other side")
                    }
                    _ => anyhow::Error::new(e).context("control connection"),
                })
            }
        };
        if chunk.is_empty() {
            if buf.is_empty() {
                bail!("the other side closed the control connection");
            }
            bail!("the other side closed the control connection mid-message");
        }
        let (take, end) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        buf.extend_from_slice(&chunk[..take]);
        r.consume(take);
        if buf.len() > MAX_LINE {
            bail!("a control message longer than {MAX_LINE} bytes");
        }
        if end {
            return String::from_utf8(buf)
                .map_err(|_| anyhow!("a control message that is not UTF-8"));
        }
    }
}

/// Text from the other side, fit to print: control characters escaped,
/// at most 200 characters.
pub fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .take(200)
        .collect();
    if s.chars().count() > 200 {
        out.push_str("...");
    }
    out
}

/// Writes `msg` as one JSON line.
pub fn write_msg(w: &mut impl Write, msg: &impl Serialize) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    w.write_all(&line)
        .and_then(|()| w.flush())
        .context("control connection")
}

/// Parses one JSON line as `T`.
fn parse_msg<T: for<'de> Deserialize<'de>>(line: &str) -> anyhow::Result<T> {
    serde_json::from_str(line.trim_end())
        .map_err(|e| anyhow!("a malformed control message: {}", clean(&e.to_string())))
}

/// Reads one JSON line as `T`, all of it before `deadline`.
pub fn read_msg_by<T: for<'de> Deserialize<'de>>(
    r: &mut BufReader<TcpStream>,
    deadline: Instant,
) -> anyhow::Result<T> {
    parse_msg(&read_line_by(r, deadline)?)
}

/// The limits of `fastudp rx --server`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest test, seconds.
    pub max_seconds: f64,
    /// Highest rate a client may ask for, bytes per second (`None`: any,
    /// and unpaced clients are welcome).
    pub max_rate: Option<u64>,
}

impl Limits {
    /// Checks a request against the limits and the protocol.
    pub fn check(&self, r: &Request) -> anyhow::Result<()> {
        if r.fastudp != PROTOCOL {
            bail!(
                "protocol version {} is not this server's ({PROTOCOL})",
                r.fastudp
            );
        }
        if !(r.seconds > 0.0 && r.seconds <= self.max_seconds) {
            bail!(
                "a test of {} s is not allowed here: at most {} s (--max-duration)",
                r.seconds,
                self.max_seconds
            );
        }
        if r.rate == Some(0) {
            bail!("a rate of 0 bytes per second");
        }
        if r.streams == 0 || r.streams > 128 {
            bail!("{} streams: 1 to 128", r.streams);
        }
        if let Some(max) = self.max_rate {
            match r.rate.map(|x| x.saturating_mul(u64::from(r.streams))) {
                None => bail!(
                    "this server allows at most {} bit/s (--max-rate): pace the test with -b",
                    max * 8
                ),
                Some(rate) if rate > max => bail!(
                    "{} bit/s in all is over this server's limit of {} bit/s (--max-rate)",
                    rate.saturating_mul(8),
                    max * 8
                ),
                _ => {}
            }
        }
        if r.mode.len() > 64 {
            bail!("a mode name longer than 64 bytes");
        }
        if let Some(rev) = &r.reverse {
            let kmax = fastudp_tools::os::kernel_max_segments().max(1);
            if rev.port == 0 {
                bail!("reverse: port 0");
            }
            // The family's own limit is checked again against the client's
            // address before sending.
            let max = fastudp_io::max_payload(true);
            if rev.payload == 0 || rev.payload > max {
                bail!("reverse: a payload of {} bytes (1 to {max})", rev.payload);
            }
            if rev.segments == 0 || rev.segments > kmax || rev.payload * rev.segments > max {
                bail!(
                    "reverse: {} segments of {} bytes do not fit one send (at most {kmax} segments, {max} bytes)",
                    rev.segments,
                    rev.payload
                );
            }
        }
        Ok(())
    }
}

/// Interarrival jitter per RFC 3550, from send times carried in the
/// datagrams (bytes 8..16, ns of the sender's clock) and arrival times.
#[derive(Debug, Default, Clone, Copy)]
struct Jitter {
    last_transit: Option<i64>,
    /// J, in ns.
    j: f64,
}

impl Jitter {
    fn datagram(&mut self, sent_ns: u64, arrived_ns: u64) {
        let transit = arrived_ns as i64 - sent_ns as i64;
        if let Some(prev) = self.last_transit {
            let d = (transit - prev).unsigned_abs() as f64;
            self.j += (d - self.j) / 16.0;
        }
        self.last_transit = Some(transit);
    }
}

/// Reads the send time a `fastudp tx` datagram carries.
fn send_time(d: &[u8]) -> Option<u64> {
    d.get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Receives one test on `sock` from `client`'s address, until `done` is
/// set and the port has been quiet for [`DRAIN`], or `deadline`. Ctrl-C
/// ends it at once unless `drain_on_interrupt` (a reverse test's client,
/// whose server stops and reports when asked: what is in flight still
/// counts).
fn receive(
    sock: &fastudp_io::Socket,
    client: IpAddr,
    done: &AtomicBool,
    deadline: Instant,
    drain_on_interrupt: bool,
) -> Outcome {
    let mut batch = fastudp_io::RecvBatch::new(32);
    let mut v = Verifier::default();
    let mut jitter: HashMap<SocketAddr, Jitter> = HashMap::new();
    let (mut bytes, mut dgrams, mut calls, mut messages, mut foreign) = (0u64, 0, 0, 0, 0);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    let same = |a: IpAddr| {
        let canon = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        canon(a) == canon(client)
    };
    loop {
        let now = Instant::now();
        if now >= deadline || (interrupt::requested() && !drain_on_interrupt) {
            break;
        }
        if done.load(Acquire) && now.duration_since(last) >= DRAIN {
            break;
        }
        match sock.recv(&mut batch) {
            Ok(_) => {
                let at = fastudp_tools::os::monotonic_ns();
                let now = Instant::now();
                calls += 1;
                for (m, buf) in &batch {
                    if !same(m.source.ip()) {
                        foreign += m.datagrams(buf).len() as u64;
                        continue;
                    }
                    first.get_or_insert(now);
                    last = now;
                    messages += 1;
                    bytes += m.len as u64;
                    for d in m.datagrams(buf) {
                        dgrams += 1;
                        v.datagram(m.source, d);
                        if let Some(sent) = send_time(d) {
                            if jitter.len() < crate::engine::seq::MAX_SENDERS
                                || jitter.contains_key(&m.source)
                            {
                                jitter.entry(m.source).or_default().datagram(sent, at);
                            }
                        }
                    }
                }
            }
            Err(e)
                if e.is_would_block()
                    || matches!(
                        e.io_error().map(std::io::Error::kind),
                        Some(std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted)
                    ) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let t = v.totals();
    Outcome {
        datagrams: dgrams,
        bytes,
        seconds: first.map_or(0.0, |f| last.duration_since(f).as_secs_f64()),
        lost: t.lost,
        duplicates: t.duplicates,
        reordered: t.reordered,
        jitter_ms: if jitter.is_empty() {
            0.0
        } else {
            jitter.values().map(|j| j.j).sum::<f64>() / jitter.len() as f64 / 1e6
        },
        cpu_ns_per_byte: if bytes > 0 {
            cpu.as_nanos() as f64 / bytes as f64
        } else {
            0.0
        },
        calls,
        messages,
        foreign,
    }
}

/// Why a test did not run to its end.
enum Refusal {
    /// Before it began (a bad or refused request): not counted as a test.
    Before(anyhow::Error),
    /// After it began.
    During(anyhow::Error),
}

/// Runs one test on an accepted control connection; returns what the
/// server says about it (one line for its log). A request it refuses
/// calls `free_slot` before it answers, so that a client that asks next
/// finds the slot free rather than the server busy.
fn run_test(
    conn: TcpStream,
    peer: SocketAddr,
    limits: &Limits,
    gro: bool,
    ipv6: bool,
    free_slot: &dyn Fn(),
) -> Result<String, Refusal> {
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(REQUEST_TIMEOUT)))
        .map_err(|e| Refusal::Before(e.into()))?;
    let mut w = conn.try_clone().map_err(|e| Refusal::Before(e.into()))?;
    let mut r = BufReader::new(conn);
    let req: Request = match read_msg_by(&mut r, Instant::now() + REQUEST_TIMEOUT) {
        Ok(q) => q,
        Err(e) => {
            let e = format!("{e:#}");
            free_slot();
            let _ = write_msg(&mut w, &Reply::Refused { error: e.clone() });
            return Err(Refusal::Before(anyhow!("{}", clean(&e))));
        }
    };
    if let Err(e) = limits.check(&req) {
        let e = format!("{e:#}");
        free_slot();
        let _ = write_msg(&mut w, &Reply::Refused { error: e.clone() });
        return Err(Refusal::Before(anyhow!("refused: {}", clean(&e))));
    }
    if let Some(rev) = req.reverse {
        return send_reverse(r, w, peer, &req, rev).map_err(Refusal::During);
    }
    run_forward(r, w, peer, &req, gro, ipv6)
}

/// A test where the client sends and the server receives.
fn run_forward(
    mut r: BufReader<TcpStream>,
    mut w: TcpStream,
    peer: SocketAddr,
    req: &Request,
    gro: bool,
    ipv6: bool,
) -> Result<String, Refusal> {
    let (_, sock) =
        rx::bind_batched(gro, crate::engine::unspecified(ipv6)).map_err(Refusal::Before)?;
    let data_port = sock
        .as_std()
        .local_addr()
        .map_err(|e| Refusal::Before(e.into()))?
        .port();
    write_msg(&mut w, &Reply::Ready { data_port }).map_err(Refusal::Before)?;
    let during = Refusal::During;
    let done = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs_f64(req.seconds) + DONE_GRACE;
    let receiver = {
        let done = done.clone();
        std::thread::spawn(move || receive(&sock, peer.ip(), &done, deadline, false))
    };
    // The client's report, no later than its test's end plus the grace.
    let client_done: anyhow::Result<Done> = read_msg_by(&mut r, deadline);
    done.store(true, Release);
    let outcome = receiver
        .join()
        .map_err(|_| during(anyhow!("the receiving thread panicked")))?;
    let sent = client_done
        .with_context(|| format!("test from {peer} abandoned"))
        .map_err(during)?;
    write_msg(&mut w, &outcome).map_err(during)?;
    Ok(format!(
        "test from {peer} ({}, {:.1} s): {} of {} datagrams received, {} lost, jitter {}",
        clean(&req.mode),
        req.seconds,
        outcome.datagrams,
        sent.datagrams,
        outcome.lost,
        show_jitter(outcome.jitter_ms)
    ))
}

/// The send strategy of a reverse test.
fn reverse_strategy(rev: &Reverse) -> crate::engine::TxStrategy {
    use crate::engine::TxStrategy::*;
    match (rev.segments > 1, rev.mmsg) {
        (true, true) => SendmmsgGso,
        (true, false) => GsoCmsg,
        (false, true) => Sendmmsg,
        (false, false) => Sendto,
    }
}

/// A reverse test: the server sends, within its limits, to the client's
/// own address only (its control connection's), then reports what it sent.
fn send_reverse(
    r: BufReader<TcpStream>,
    mut w: TcpStream,
    peer: SocketAddr,
    req: &Request,
    rev: Reverse,
) -> anyhow::Result<String> {
    let dest = SocketAddr::new(peer.ip(), rev.port);
    let t = reverse_strategy(&rev);
    let work = crate::engine::Workload {
        payload: rev.payload,
        batch: if rev.mmsg { 32 } else { rev.segments },
        duration: Duration::from_secs_f64(req.seconds),
        ipv6: dest.is_ipv6(),
        segs: rev.segments,
        net: None,
        pin: false,
        cache_thrash: false,
        // Connected: a client that goes away ends the test (ICMP).
        connect: true,
        rate: req.rate,
        bind: None,
        busy_poll: None,
    };
    let fits = fastudp_io::max_payload(dest.is_ipv6());
    if rev.payload * rev.segments > fits {
        let e = format!(
            "reverse: {} bytes per send do not fit a UDP payload to {dest} ({fits})",
            rev.payload * rev.segments
        );
        let _ = write_msg(&mut w, &Reply::Refused { error: e.clone() });
        return Err(anyhow!(e));
    }
    write_msg(&mut w, &Reply::Ready { data_port: 0 })?;
    // The client hanging up (or saying anything, as its Ctrl-C does) ends
    // the sending at once; a paced sender wakes for it too.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let conn = r.get_ref().try_clone().context("control connection")?;
        std::thread::spawn(move || {
            let _ = conn.set_read_timeout(None);
            let mut one = [0u8; 1];
            let _ = (&conn).read(&mut one);
            stop.store(true, Release);
        })
    };
    let live = crate::engine::Live::default();
    let out = crate::engine::tx::with_stop(stop.clone(), || {
        crate::engine::tx::udp(t, dest, &work, &live)
    });
    let hung_up = stop.load(Acquire);
    let (datagrams, bytes) = match &out {
        Ok(o) => (o.datagrams, o.bytes),
        Err(_) => (live.tx_datagrams.load(Relaxed), 0),
    };
    let reported = write_msg(&mut w, &Done { datagrams, bytes });
    // Done: closing both ways (after the report, which goes first) also
    // ends the watcher's read, whatever the client does.
    let _ = r.get_ref().shutdown(std::net::Shutdown::Both);
    let _ = watcher.join();
    if hung_up {
        bail!(
            "reverse test to {dest}: the client hung up or asked to stop; stopped after {datagrams} datagrams"
        );
    }
    reported?;
    match out {
        Ok(_) => Ok(format!(
            "reverse test to {dest} ({}, {:.1} s): {datagrams} datagrams sent",
            crate::engine::name(t),
            req.seconds
        )),
        Err(e) => Err(e.context(format!("reverse test to {dest} stopped"))),
    }
}

/// The client's side of a reverse test: receives on `sock` from the
/// server until it reports what it sent; returns what arrived and that.
pub fn receive_reverse(
    mut r: BufReader<TcpStream>,
    w: TcpStream,
    sock: fastudp_io::Socket,
    server: IpAddr,
    seconds: f64,
) -> anyhow::Result<(Outcome, Done)> {
    let done = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds) + DONE_GRACE;
    let receiver = {
        let done = done.clone();
        std::thread::spawn(move || receive(&sock, server, &done, deadline, true))
    };
    // Ctrl-C: a line on the control connection asks the server to stop;
    // it still reports what it sent. A server that does not answer within
    // DONE_GRACE is cut off.
    let asker = {
        let done = done.clone();
        let mut conn = w.try_clone().context("control connection")?;
        std::thread::spawn(move || {
            while !done.load(Acquire) {
                if interrupt::requested() {
                    let _ = conn.write_all(b"\n");
                    let asked = Instant::now();
                    while !done.load(Acquire) && asked.elapsed() < DONE_GRACE {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if !done.load(Acquire) {
                        let _ = conn.shutdown(std::net::Shutdown::Both);
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let sent: anyhow::Result<Done> = read_msg_by(&mut r, deadline);
    done.store(true, Release);
    let _ = asker.join();
    let got = receiver
        .join()
        .map_err(|_| anyhow!("the receiving thread panicked"))?;
    drop(w);
    let sent = sent.context("the server's report")?;
    Ok((got, sent))
}

/// `fastudp rx --server`: serves tests until Ctrl-C, or `max_tests` of
/// them.
pub fn serve(
    control: SocketAddr,
    limits: Limits,
    concurrent: usize,
    max_tests: Option<u64>,
    gro: bool,
    quiet: bool,
) -> anyhow::Result<()> {
    let l = TcpListener::bind(control).with_context(|| format!("cannot listen on {control}"))?;
    l.set_nonblocking(true).context("the control socket")?;
    if !quiet {
        out!(
            "rx: serving tests on {control} (at most {concurrent} at once, {} s each{})",
            limits.max_seconds,
            limits
                .max_rate
                .map(|r| format!(", {} bit/s", r * 8))
                .unwrap_or_default()
        )?;
    }
    let tally = Arc::new(Tally::default());
    let (log_tx, log_rx) = std::sync::mpsc::channel::<String>();
    loop {
        while let Ok(line) = log_rx.try_recv() {
            if !quiet {
                out!("rx: {line}")?;
            }
        }
        if interrupt::requested() {
            return Err(interrupt::interrupted("the server stopped"));
        }
        if max_tests.is_some_and(|m| tally.finished.load(Acquire) as u64 >= m) {
            return Ok(());
        }
        let (conn, peer) = match l.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                let _ = log_tx.send(format!("accept: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = conn.set_nonblocking(false);
        let all_started = max_tests.is_some_and(|m| tally.started.load(Acquire) as u64 >= m);
        if all_started || tally.active.load(Acquire) >= concurrent {
            let mut w = conn;
            let _ = w.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_msg(
                &mut w,
                &Reply::Refused {
                    error: format!(
                        "busy: this server runs {concurrent} test(s) at a time; try again"
                    ),
                },
            );
            let _ = log_tx.send(format!("refused {peer}: busy"));
            continue;
        }
        tally.started.fetch_add(1, AcqRel);
        tally.active.fetch_add(1, AcqRel);
        let (tally, log, limits) = (tally.clone(), log_tx.clone(), limits.clone());
        let ipv6 = control.is_ipv6();
        std::thread::spawn(move || serve_one(conn, peer, &limits, gro, ipv6, &tally, &log));
    }
}

/// The server's counts of tests, shared with the threads that run them.
#[derive(Debug, Default)]
struct Tally {
    /// Running now.
    active: AtomicUsize,
    /// Begun (a request refused is taken back).
    started: AtomicUsize,
    /// Run to their end, or cut off after they began.
    finished: AtomicUsize,
}

/// Runs the test asked for on `conn` (its own thread), logs it, and gives
/// its slot back. A request refused before the test began is not a test:
/// it is taken back from `tally`, once.
fn serve_one(
    conn: TcpStream,
    peer: SocketAddr,
    limits: &Limits,
    gro: bool,
    ipv6: bool,
    tally: &Tally,
    log: &std::sync::mpsc::Sender<String>,
) {
    let freed = AtomicBool::new(false);
    let free_slot = || {
        if !freed.swap(true, AcqRel) {
            tally.started.fetch_sub(1, AcqRel);
            tally.active.fetch_sub(1, AcqRel);
        }
    };
    let (ran, line) = match run_test(conn, peer, limits, gro, ipv6, &free_slot) {
        Ok(l) => (true, l),
        Err(Refusal::Before(e)) => (false, format!("{peer}: {e:#}")),
        Err(Refusal::During(e)) => (true, format!("{peer}: {e:#}")),
    };
    let _ = log.send(line);
    if ran {
        tally.finished.fetch_add(1, AcqRel);
        tally.active.fetch_sub(1, AcqRel);
    } else {
        free_slot();
    }
}

/// The client's side: asks `server` for a test, returning the connection
/// and the data port to send to. A server that is not there, or refuses
/// the test, is a runtime failure; a `bind` address this host does not
/// have, a usage error.
pub fn request(
    server: SocketAddr,
    bind: Option<IpAddr>,
    req: &Request,
) -> anyhow::Result<(BufReader<TcpStream>, TcpStream, u16)> {
    let no_server = |e: std::io::Error| {
        anyhow!("no fastudp server at {server} ({e}): start `fastudp rx --server` there")
    };
    // From the data's own address (-B): the server counts only datagrams
    // from the address of the control connection.
    let conn: TcpStream = match bind {
        None => TcpStream::connect_timeout(&server, Duration::from_secs(3)).map_err(no_server)?,
        Some(ip) => {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(server),
                socket2::Type::STREAM,
                None,
            )
            .context("the control connection's socket")?;
            s.bind(&SocketAddr::new(ip, 0).into()).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                    usage!("-B {ip}: {e}")
                } else {
                    anyhow!("-B {ip}: {e}")
                }
            })?;
            s.connect_timeout(&server.into(), Duration::from_secs(3))
                .map_err(no_server)?;
            s.into()
        }
    };
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(REQUEST_TIMEOUT)))
        .context("control connection")?;
    let mut w = conn.try_clone().context("control connection")?;
    let mut r = BufReader::new(conn);
    write_msg(&mut w, req)?;
    let reply = read_msg_by::<Reply>(&mut r, Instant::now() + REQUEST_TIMEOUT)
        .with_context(|| server.to_string())?;
    match reply {
        Reply::Ready { data_port: 0 } if req.reverse.is_none() => {
            bail!("{server}: the server named data port 0: not a fastudp server?")
        }
        Reply::Ready { data_port } => Ok((r, w, data_port)),
        Reply::Refused { error } => bail!("the server refused the test: {}", clean(&error)),
    }
}

/// The client's side after sending: reports `done` and reads the server's
/// outcome.
pub fn finish(
    mut r: BufReader<TcpStream>,
    mut w: TcpStream,
    done: Done,
) -> anyhow::Result<Outcome> {
    write_msg(&mut w, &done).context("the server's results")?;
    read_msg_by(&mut r, Instant::now() + DRAIN + Duration::from_secs(10))
        .context("the server's results")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_seconds: 60.0,
            max_rate: Some(125_000_000),
        }
    }

    fn req(seconds: f64, rate: Option<u64>) -> Request {
        Request {
            fastudp: PROTOCOL,
            seconds,
            rate,
            mode: "sendto".into(),
            reverse: None,
            streams: 1,
        }
    }

    #[test]
    fn requests_outside_the_limits_are_refused() {
        let l = limits();
        assert!(l.check(&req(10.0, Some(1_000_000))).is_ok());
        let err = |r: &Request| l.check(r).unwrap_err().to_string();
        assert!(err(&req(61.0, Some(1))).contains("--max-duration"));
        assert!(l.check(&req(0.0, Some(1))).is_err());
        assert!(l.check(&req(f64::NAN, Some(1))).is_err());
        assert!(err(&req(10.0, None)).contains("-b"));
        assert!(err(&req(10.0, Some(200_000_000))).contains("--max-rate"));
        let mut old = req(1.0, Some(1));
        old.fastudp = 99;
        assert!(err(&old).contains("protocol"));
        let rev = |port, payload, segments| {
            let mut q = req(1.0, Some(1000));
            q.reverse = Some(Reverse {
                port,
                payload,
                segments,
                mmsg: false,
            });
            q
        };
        assert!(l.check(&rev(9000, 1472, 1)).is_ok());
        assert!(l.check(&rev(0, 1472, 1)).is_err());
        assert!(l.check(&rev(9000, 0, 1)).is_err());
        assert!(l.check(&rev(9000, 70_000, 1)).is_err());
        assert!(l.check(&rev(9000, 1472, 10_000)).is_err());
        assert!(l.check(&rev(9000, 1472, 0)).is_err());
    }

    #[test]
    fn lines_are_bounded_and_unknown_fields_refused() {
        /// What `read_line_by` makes of `bytes` sent, then the connection closed.
        fn line_of(bytes: &[u8]) -> anyhow::Result<String> {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (server, _) = l.accept().unwrap();
            c.write_all(bytes).unwrap();
            drop(c);
            read_line_by(
                &mut BufReader::new(server),
                Instant::now() + Duration::from_secs(5),
            )
        }
        let err = |b: &[u8]| line_of(b).unwrap_err().to_string();
        assert!(err(&vec![b'x'; MAX_LINE + 10]).contains("longer"));
        assert!(err(b"{\"fastudp\":1}").contains("mid-message"));
        let line = line_of(
            b"{\"fastudp\":1,\"seconds\":1,\"rate\":null,\"mode\":\"x\",\"to\":\"1.2.3.4\"}\n",
        )
        .unwrap();
        assert!(parse_msg::<Request>(&line)
            .unwrap_err()
            .to_string()
            .contains("malformed"));
    }

    #[test]
    fn jitter_follows_rfc_3550() {
        let mut j = Jitter::default();
        // Transit times 100, 110, 100, 110 ns: |D| = 10 each time.
        for (i, transit) in [100u64, 110, 100, 110].iter().enumerate() {
            let sent = i as u64 * 1000;
            j.datagram(sent, sent + transit);
        }
        let expected = {
            let mut e = 0.0f64;
            for _ in 0..3 {
                e += (10.0 - e) / 16.0;
            }
            e
        };
        assert!((j.j - expected).abs() < 1e-9, "{} vs {expected}", j.j);
        // A constant clock offset does not matter.
        let mut k = Jitter::default();
        for (i, transit) in [100u64, 110, 100, 110].iter().enumerate() {
            let sent = i as u64 * 1000;
            k.datagram(sent, sent + transit + 5_000_000_000);
        }
        assert!((k.j - j.j).abs() < 1e-9);
    }
}
