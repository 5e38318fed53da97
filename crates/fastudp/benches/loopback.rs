//! Loopback throughput: one sender thread and one receiver thread on
//! 127.0.0.1, 1472-byte datagrams, for a fixed time per strategy.
//!
//! Strategies:
//! - `sendto/recvfrom`: `std::net::UdpSocket`, one datagram per syscall;
//! - `fastudp sendmmsg/recvmmsg`: 32 datagrams per syscall, GSO and GRO off;
//! - `fastudp gso+gro`: 8 GSO trains of 44 datagrams per `sendmmsg`, GRO on;
//! - `quinn-udp gso+gro`: the same trains with `quinn-udp`, one `sendmsg`
//!   per train, `recvmmsg` of 32 GRO messages.
//!
//! Throughput is counted on the receive side only, from the moment both
//! threads start to the last datagram received. The sender's count is used
//! for the loss column alone.
//!
//! `cargo bench -p fastudp --bench loopback`; `FASTUDP_BENCH_SECS=5` sets the
//! time per strategy (default 2 s). The receivers of `sendto/recvfrom` and
//! fastudp block with a 200 ms read timeout; quinn-udp puts its socket in
//! non-blocking mode (it is made for an async runtime), so its receiver
//! polls, yielding the CPU between empty reads. `FASTUDP_BENCH_POLL=1`
//! makes the other receivers poll too, for a like-for-like comparison.

use fastudp::{Config, Disabled, RecvBatch, Socket, Transmit};
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// Payload bytes per datagram: a 1500-byte MTU minus IPv4 and UDP headers.
const DATAGRAM: usize = 1472;
/// Datagrams (or messages) per batched send and receive call.
const BATCH: usize = 32;
/// Segments per GSO train: 44 x 1472 = 64768 <= 65507.
const GSO_SEGMENTS: usize = 44;
/// GSO trains per fastudp `send` call.
const TRAINS_PER_SEND: usize = 8;
/// Receive buffer per quinn-udp message: room for a 64-segment GRO train.
const GRO_MESSAGE: usize = 64 * DATAGRAM;
/// `SO_RCVBUF` asked for on every receiving socket.
const RECV_BUFFER: usize = 4 << 20;
/// A receiver stops once the sender is done and nothing came for this long.
const IDLE: Duration = Duration::from_millis(200);
/// A receiver stops at the latest this long after the sender's deadline.
const GRACE: Duration = Duration::from_secs(2);
/// Default seconds per strategy.
const DEFAULT_SECS: f64 = 2.0;

/// How every strategy runs.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Sending time.
    dur: Duration,
    /// Pin the sender to CPU 0 and the receiver to CPU 1.
    pin: bool,
    /// Receivers of std and fastudp sockets poll a non-blocking socket
    /// instead of blocking (`FASTUDP_BENCH_POLL=1`), as quinn-udp's does.
    polling: bool,
}

/// When a receiver must stop.
struct Stop<'a> {
    sender_done: &'a AtomicBool,
    hard: Instant,
}

impl Stop<'_> {
    /// The sender has finished.
    fn sender_done(&self) -> bool {
        self.sender_done.load(Ordering::Acquire)
    }

    /// The receiver has run out of time, whatever the sender does.
    fn expired(&self) -> bool {
        Instant::now() >= self.hard
    }

    /// Called when a receive found nothing; true when the receiver is done.
    /// A blocking receive has already waited [`IDLE`]; a polling one yields
    /// the CPU and is done once the sender is and [`IDLE`] has passed.
    fn nothing_came(&self, polling: bool, idle_since: &mut Option<Instant>) -> bool {
        if !self.sender_done() {
            *idle_since = None;
        } else if !polling || idle_since.get_or_insert_with(Instant::now).elapsed() >= IDLE {
            return true;
        }
        if polling {
            thread::yield_now();
        }
        false
    }
}

/// What a receiver counted.
struct Tally {
    start: Instant,
    last: Option<Instant>,
    bytes: u64,
    datagrams: u64,
}

impl Tally {
    fn new() -> Self {
        Tally {
            start: Instant::now(),
            last: None,
            bytes: 0,
            datagrams: 0,
        }
    }

    fn add(&mut self, bytes: usize, datagrams: usize) {
        self.bytes += bytes as u64;
        self.datagrams += datagrams as u64;
        self.last = Some(Instant::now());
    }

    /// From the start to the last datagram received.
    fn elapsed(&self) -> Duration {
        self.last.map_or(Duration::ZERO, |l| l - self.start)
    }
}

/// One strategy's result.
struct Measured {
    bytes: u64,
    datagrams: u64,
    elapsed: Duration,
    sent: u64,
}

impl Measured {
    fn bytes_per_sec(&self) -> f64 {
        per_sec(self.bytes, self.elapsed)
    }

    fn datagrams_per_sec(&self) -> f64 {
        per_sec(self.datagrams, self.elapsed)
    }

    fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * (self.sent.saturating_sub(self.datagrams)) as f64 / self.sent as f64
        }
    }
}

fn per_sec(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Errors a sender or receiver waits out rather than fails on.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// Runs `send` and `recv` on two threads, pinned when there are two CPUs.
/// `send` gets its deadline and returns the datagrams it sent.
fn measure<S, R>(run: &Run, send: S, recv: R) -> Result<Measured, String>
where
    S: FnOnce(Instant) -> Result<u64, String> + Send,
    R: FnOnce(&Stop<'_>) -> Result<Tally, String> + Send,
{
    let Run { dur, pin, .. } = *run;
    let barrier = &Barrier::new(2);
    let done = &AtomicBool::new(false);
    thread::scope(|s| {
        let rx = s.spawn(move || {
            if pin {
                let _ = fastudp::os::pin_to_cpu(1);
            }
            barrier.wait();
            let stop = Stop {
                sender_done: done,
                hard: Instant::now() + dur + GRACE,
            };
            recv(&stop)
        });
        let tx = s.spawn(move || {
            if pin {
                let _ = fastudp::os::pin_to_cpu(0);
            }
            barrier.wait();
            let r = send(Instant::now() + dur);
            done.store(true, Ordering::Release);
            r
        });
        let sent = tx
            .join()
            .map_err(|_| "sender panicked".to_string())
            .and_then(|r| r.map_err(|e| format!("sender: {e}")));
        let got = rx
            .join()
            .map_err(|_| "receiver panicked".to_string())
            .and_then(|r| r.map_err(|e| format!("receiver: {e}")));
        let (sent, got) = (sent?, got?);
        Ok(Measured {
            bytes: got.bytes,
            datagrams: got.datagrams,
            elapsed: got.elapsed(),
            sent,
        })
    })
}

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn std_pair() -> io::Result<(UdpSocket, UdpSocket)> {
    let rx = UdpSocket::bind(local())?;
    let tx = UdpSocket::bind(local())?;
    socket2::SockRef::from(&rx).set_recv_buffer_size(RECV_BUFFER)?;
    Ok((tx, rx))
}

/// A blocking receiver waits at most [`IDLE`] per call; a polling one
/// never waits.
fn set_wait(sock: &UdpSocket, polling: bool) -> io::Result<()> {
    if polling {
        sock.set_nonblocking(true)
    } else {
        sock.set_read_timeout(Some(IDLE))
    }
}

fn sendto_recvfrom(run: &Run) -> Result<Measured, String> {
    let (tx, rx) = std_pair().map_err(|e| e.to_string())?;
    let dest = rx.local_addr().map_err(|e| e.to_string())?;
    let polling = run.polling;
    set_wait(&rx, polling).map_err(|e| e.to_string())?;
    measure(
        run,
        |until| {
            let buf = vec![0x5a_u8; DATAGRAM];
            let mut sent = 0u64;
            while Instant::now() < until {
                match tx.send_to(&buf, dest) {
                    Ok(_) => sent += 1,
                    Err(e) if transient(&e) => thread::yield_now(),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(sent)
        },
        |stop| {
            let mut buf = vec![0u8; 65_536];
            let mut t = Tally::new();
            let mut idle_since = None;
            while !stop.expired() {
                match rx.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        idle_since = None;
                        t.add(n, 1);
                    }
                    Err(e) if transient(&e) => {
                        if stop.nothing_came(polling, &mut idle_since) {
                            break;
                        }
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(t)
        },
    )
}

/// Receives with a fastudp socket until the sender is done and the socket
/// idle, counting every datagram of every (GRO) message.
fn fastudp_receive(rx: &Socket, polling: bool, stop: &Stop<'_>) -> Result<Tally, String> {
    let mut batch = RecvBatch::new(BATCH);
    let mut t = Tally::new();
    let mut idle_since = None;
    while !stop.expired() {
        match rx.recv(&mut batch) {
            Ok(_) => {
                idle_since = None;
                let (mut bytes, mut n) = (0, 0);
                for (_, d) in batch.datagrams() {
                    bytes += d.len();
                    n += 1;
                }
                t.add(bytes, n);
            }
            Err(fastudp::Error::Io(e)) if transient(&e) => {
                if stop.nothing_came(polling, &mut idle_since) {
                    break;
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(t)
}

/// Sends `transmits` over and over until `until`; returns datagrams sent.
fn fastudp_send_loop(
    tx: &Socket,
    transmits: &[Transmit<'_>],
    until: Instant,
) -> Result<u64, String> {
    let mut sent = 0u64;
    while Instant::now() < until {
        match tx.send(transmits) {
            Ok(n) => {
                sent += transmits[..n]
                    .iter()
                    .map(|t| t.segments() as u64)
                    .sum::<u64>()
            }
            Err(fastudp::Error::Io(e)) if transient(&e) => thread::yield_now(),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(sent)
}

fn fastudp_pair(config: Config, polling: bool) -> Result<(Socket, Socket), String> {
    let rx = Socket::bind_with(
        local(),
        Config {
            recv_buffer: Some(RECV_BUFFER),
            ..config
        },
    )
    .map_err(|e| e.to_string())?;
    let tx = Socket::bind_with(local(), config).map_err(|e| e.to_string())?;
    set_wait(rx.as_std(), polling).map_err(|e| e.to_string())?;
    Ok((tx, rx))
}

fn fastudp_mmsg(run: &Run) -> Result<Measured, String> {
    let config = Config {
        disabled: Disabled {
            gso: true,
            ..Disabled::default()
        },
        gro: false,
        ..Config::default()
    };
    let (tx, rx) = fastudp_pair(config, run.polling)?;
    let dest = rx.local_addr().map_err(|e| e.to_string())?;
    let r = measure(
        run,
        |until| {
            let buf = vec![0x5a_u8; DATAGRAM];
            let ts = vec![Transmit::new(dest, &buf); BATCH];
            fastudp_send_loop(&tx, &ts, until)
        },
        |stop| fastudp_receive(&rx, run.polling, stop),
    );
    report_fastudp("fastudp sendmmsg/recvmmsg", &tx, &rx);
    r
}

fn fastudp_gso_gro(run: &Run) -> Result<Measured, String> {
    let (tx, rx) = fastudp_pair(Config::default(), run.polling)?;
    let dest = rx.local_addr().map_err(|e| e.to_string())?;
    if tx.max_gso_segments() < GSO_SEGMENTS {
        eprintln!(
            "note: fastudp GSO allows {} segments per send; trains go out split",
            tx.max_gso_segments()
        );
    }
    let r = measure(
        run,
        |until| {
            let payload = vec![0x5a_u8; GSO_SEGMENTS * DATAGRAM];
            let ts = vec![Transmit::train(dest, &payload, DATAGRAM); TRAINS_PER_SEND];
            fastudp_send_loop(&tx, &ts, until)
        },
        |stop| fastudp_receive(&rx, run.polling, stop),
    );
    report_fastudp("fastudp gso+gro", &tx, &rx);
    r
}

/// Prints what the sockets probed and any fallback, drop or truncation.
fn report_fastudp(name: &str, tx: &Socket, rx: &Socket) {
    let (ts, rs) = (tx.stats(), rx.stats());
    let caps = rx.capabilities();
    println!(
        "  [{name}] gso segments {}, gro {}, send calls {}, recv calls {}, recv messages {}, kernel drops {}, truncated {}, fallbacks {}",
        tx.max_gso_segments(),
        caps.gro,
        ts.send_calls,
        rs.recv_calls,
        rs.recv_messages,
        rs.kernel_drops,
        rs.truncated,
        ts.fallbacks.len() + rs.fallbacks.len(),
    );
    for f in ts.fallbacks.iter().chain(&rs.fallbacks) {
        println!("    fallback: {}", f.reason);
    }
}

fn quinn_gso_gro(run: &Run) -> Result<Measured, String> {
    let (tx, rx) = std_pair().map_err(|e| e.to_string())?;
    let dest = rx.local_addr().map_err(|e| e.to_string())?;
    // Both calls make the socket non-blocking.
    let tx_state = quinn_udp::UdpSocketState::new((&tx).into()).map_err(|e| e.to_string())?;
    let rx_state = quinn_udp::UdpSocketState::new((&rx).into()).map_err(|e| e.to_string())?;
    if tx_state.max_gso_segments() < GSO_SEGMENTS {
        return Err(format!(
            "quinn-udp GSO allows {} segments per send",
            tx_state.max_gso_segments()
        ));
    }
    println!(
        "  [quinn-udp gso+gro] max_gso_segments {}, gro_segments {}",
        tx_state.max_gso_segments(),
        rx_state.gro_segments()
    );
    measure(
        run,
        |until| {
            let payload = vec![0x5a_u8; GSO_SEGMENTS * DATAGRAM];
            let transmit = quinn_udp::Transmit {
                destination: dest,
                ecn: None,
                contents: &payload,
                segment_size: Some(DATAGRAM),
                src_ip: None,
            };
            let mut sent = 0u64;
            while Instant::now() < until {
                // The same work as one fastudp `send`: TRAINS_PER_SEND trains.
                let mut i = 0;
                while i < TRAINS_PER_SEND && Instant::now() < until {
                    match tx_state.send((&tx).into(), &transmit) {
                        Ok(()) => {
                            sent += GSO_SEGMENTS as u64;
                            i += 1;
                        }
                        Err(e) if transient(&e) => thread::yield_now(),
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            Ok(sent)
        },
        |stop| {
            let mut bufs = vec![vec![0u8; GRO_MESSAGE]; BATCH];
            let mut slices: Vec<IoSliceMut<'_>> =
                bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let mut metas = vec![quinn_udp::RecvMeta::default(); BATCH];
            let mut t = Tally::new();
            let mut idle_since = None;
            while !stop.expired() {
                match rx_state.recv((&rx).into(), &mut slices, &mut metas) {
                    Ok(n) => {
                        idle_since = None;
                        let (mut bytes, mut count) = (0, 0);
                        for m in &metas[..n] {
                            bytes += m.len;
                            count += m.len.div_ceil(m.stride.max(1));
                        }
                        t.add(bytes, count);
                    }
                    Err(e) if transient(&e) => {
                        if stop.nothing_came(true, &mut idle_since) {
                            break;
                        }
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(t)
        },
    )
}

fn bench_secs() -> f64 {
    match std::env::var("FASTUDP_BENCH_SECS") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => s,
            _ => {
                eprintln!("FASTUDP_BENCH_SECS={v:?} is not a number of seconds in (0, 3600]; using {DEFAULT_SECS}");
                DEFAULT_SECS
            }
        },
        Err(_) => DEFAULT_SECS,
    }
}

type Strategy = fn(&Run) -> Result<Measured, String>;

fn main() {
    // `cargo bench` passes `--bench`; there are no other options.
    let secs = bench_secs();
    let dur = Duration::from_secs_f64(secs);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let pin = cpus >= 2;
    let polling = std::env::var("FASTUDP_BENCH_POLL").is_ok_and(|v| v.trim() == "1");
    let run = Run { dur, pin, polling };
    let rcvbuf = UdpSocket::bind(local()).ok().and_then(|s| {
        let r = socket2::SockRef::from(&s);
        r.set_recv_buffer_size(RECV_BUFFER).ok()?;
        r.recv_buffer_size().ok()
    });
    println!(
        "loopback 127.0.0.1, {DATAGRAM}-byte datagrams, {secs} s per strategy, {cpus} CPUs, {}",
        if pin {
            "sender pinned to CPU 0, receiver to CPU 1"
        } else {
            "not pinned"
        }
    );
    println!(
        "receivers: {}; quinn-udp's always polls (its socket is non-blocking)",
        if polling {
            "std and fastudp poll non-blocking sockets (FASTUDP_BENCH_POLL=1)"
        } else {
            "std and fastudp block, 200 ms read timeout"
        }
    );
    println!(
        "SO_RCVBUF asked {RECV_BUFFER}, got {} (the kernel reports double)",
        rcvbuf.map_or("?".to_string(), |n| n.to_string())
    );

    let strategies: [(&str, Strategy); 4] = [
        ("sendto/recvfrom", sendto_recvfrom),
        ("fastudp sendmmsg/recvmmsg", fastudp_mmsg),
        ("fastudp gso+gro", fastudp_gso_gro),
        ("quinn-udp gso+gro", quinn_gso_gro),
    ];
    let mut results: Vec<(&str, Result<Measured, String>)> = Vec::new();
    for (name, strategy) in strategies {
        results.push((name, strategy(&run)));
    }

    let base = results
        .first()
        .and_then(|(_, r)| r.as_ref().ok())
        .map(Measured::bytes_per_sec)
        .filter(|&b| b > 0.0);
    println!();
    println!(
        "{:<27} {:>10} {:>14} {:>11} {:>8}",
        "strategy", "MB/s", "datagrams/s", "vs sendto", "loss %"
    );
    for (name, r) in &results {
        match r {
            Ok(m) => {
                let ratio = base.map_or("-".to_string(), |b| {
                    format!("{:.2}x", m.bytes_per_sec() / b)
                });
                println!(
                    "{:<27} {:>10.1} {:>14.0} {:>11} {:>8.2}",
                    name,
                    m.bytes_per_sec() / 1e6,
                    m.datagrams_per_sec(),
                    ratio,
                    m.loss_percent()
                );
            }
            Err(e) => println!("{name:<27} error: {e}"),
        }
    }
    let rate = |name: &str| {
        results
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, r)| r.as_ref().ok())
            .map(Measured::bytes_per_sec)
    };
    match (rate("fastudp gso+gro"), rate("quinn-udp gso+gro")) {
        (Some(f), Some(q)) if q > 0.0 => {
            println!("gso+gro fastudp / quinn-udp: {:.2}x", f / q)
        }
        _ => println!("gso+gro fastudp / quinn-udp: -"),
    }
}
