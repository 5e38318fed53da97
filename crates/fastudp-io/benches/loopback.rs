//! Loopback throughput and CPU cost: one sender thread and one receiver
//! thread on 127.0.0.1, 1472-byte datagrams, for a fixed time per run.
//!
//! Strategies:
//! - `sendto/recvfrom`: `std::net::UdpSocket`, one datagram per syscall;
//! - `fastudp sendmmsg/recvmmsg`: 32 datagrams per syscall, GSO and GRO off;
//! - `fastudp gso+gro`: 8 GSO trains of 44 datagrams per `sendmmsg`, GRO on;
//! - `quinn-udp gso+gro`: the same 8 trains with `quinn-udp`, one `sendmsg`
//!   per train, `recvmmsg` of 32 GRO messages.
//!
//! Every sender loop sends a whole batch (32 datagrams, or 8 trains of
//! 44 x 1472 bytes) per iteration and looks at the clock only between
//! iterations. Throughput is counted on the receive side only, from the
//! moment both threads start to the last datagram received; the sender's
//! count is used for the loss column alone. Each thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`, from the start to the end of its loop) is
//! divided by the bytes received: `tx ns/B` and `rx ns/B`.
//!
//! The full table runs each strategy once. Its receivers are the bottleneck
//! and lose datagrams, so its gso+gro rows compare little. Two A/B
//! sections follow, fastudp (A) then quinn-udp (B) alternately for
//! `FASTUDP_BENCH_ROUNDS` rounds, each round printed, then the medians.
//! In both, the kernel's work is the same for A and B and nothing is
//! overloaded:
//!
//! - send side: each library's sender alone (fastudp `Socket::send` of the
//!   8 trains; quinn-udp `try_send` of the same 8 trains one by one, both
//!   on blocking sockets) sends to a 127.0.0.1 port where nothing is bound
//!   (bound, noted and dropped before each run). The kernel drops every
//!   train at UDP input and answers with an ICMP port unreachable, which
//!   the unconnected senders never see; an `ECONNREFUSED` would be counted
//!   and the train skipped. Reported: bytes sent per second, and the
//!   sender thread's CPU per byte sent (this includes the loopback
//!   delivery run in the sender's softirq, the same for both);
//! - receive side: the same fastudp GSO sender for A and B, paced to
//!   [`OFFERED_MBS`] (after each send call it sleeps while ahead of
//!   schedule), into the fastudp receiver (GRO, `RecvBatch::new(32)`) or
//!   quinn-udp's (GRO, 32 slices). Both receivers are non-blocking and,
//!   when nothing is queued, wait for a datagram with a blocking 1-byte
//!   `MSG_PEEK` (quinn-udp's `recvmmsg` has no `MSG_WAITFORONE`, so it
//!   cannot block on its own). Reported: bytes received per second, loss,
//!   and the receiver thread's CPU per byte received; a round that loses
//!   more than [`LOSS_WARN_PERCENT`] is flagged.
//!
//! `cargo bench -p fastudp-io --bench loopback`. Environment:
//! - `FASTUDP_BENCH_SECS`: seconds per run (default 2);
//! - `FASTUDP_BENCH_ROUNDS`: A/B rounds per side (default 5);
//! - `FASTUDP_BENCH_POLL=1`: every receiver polls a non-blocking socket,
//!   yielding the CPU between empty reads, instead of sleeping. Otherwise
//!   the std and fastudp receivers of the full table block (200 ms read
//!   timeout) and quinn-udp's waits with the `MSG_PEEK` above.

use fastudp_io::UdpIo;
use fastudp_io::{Config, Feature, RecvBatch, Socket, Transmit};
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
/// GSO trains per sender loop iteration: one fastudp `send`, or this many
/// quinn-udp `send`s.
const TRAINS_PER_SEND: usize = 8;
/// Receive buffer per quinn-udp message: room for a 64-segment GRO train.
const GRO_MESSAGE: usize = 64 * DATAGRAM;
/// `SO_RCVBUF` asked for on every receiving socket.
const RECV_BUFFER: usize = 4 << 20;
/// A receiver stops once the sender is done and nothing came for this long.
const IDLE: Duration = Duration::from_millis(200);
/// A receiver stops at the latest this long after the sender's deadline.
const GRACE: Duration = Duration::from_secs(2);
/// Default seconds per run.
const DEFAULT_SECS: f64 = 2.0;
/// Default A/B rounds per side.
const DEFAULT_ROUNDS: usize = 5;
/// Most A/B rounds accepted from the environment.
const MAX_ROUNDS: usize = 1000;
/// Load offered by the paced sender of the receive side, in MB/s.
const OFFERED_MBS: f64 = 1000.0;
/// A receive-side round that loses more than this is flagged.
const LOSS_WARN_PERCENT: f64 = 1.0;

/// What a receiver does when a receive finds nothing queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Blocking socket with an [`IDLE`] read timeout: the receive waited.
    Block,
    /// Non-blocking socket; wait up to [`IDLE`] with a blocking 1-byte
    /// `MSG_PEEK`, then receive again.
    Peek,
    /// Non-blocking socket; yield the CPU and receive again.
    Poll,
}

/// How every strategy runs.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Sending time.
    dur: Duration,
    /// Pin the sender to CPU 0 and the receiver to CPU 1.
    pin: bool,
    /// How the std receiver waits.
    std_wait: Wait,
    /// How the fastudp receivers wait.
    fastudp_wait: Wait,
    /// How the quinn-udp receiver waits (never [`Wait::Block`]).
    quinn_wait: Wait,
    /// Print each socket's probe results and counters.
    verbose: bool,
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

    /// Called when a receive on `sock` found nothing; waits as `wait` says
    /// and returns true when the receiver is done: the sender has finished
    /// and nothing came for [`IDLE`].
    fn nothing_came(
        &self,
        wait: Wait,
        sock: &UdpSocket,
        idle_since: &mut Option<Instant>,
    ) -> anyhow::Result<bool> {
        match wait {
            // The receive has already waited IDLE.
            Wait::Block => Ok(self.sender_done()),
            Wait::Peek => {
                // Read before waiting: a sender that finishes during an idle
                // wait has sent everything before it.
                let done = self.sender_done();
                let came = wait_readable(sock)?;
                Ok(!came && done)
            }
            Wait::Poll => {
                if !self.sender_done() {
                    *idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= IDLE {
                    return Ok(true);
                }
                thread::yield_now();
                Ok(false)
            }
        }
    }
}

/// Waits up to [`IDLE`] (the socket's read timeout) for a datagram on a
/// non-blocking socket, without taking it; true when one is there.
fn wait_readable(sock: &UdpSocket) -> io::Result<bool> {
    sock.set_nonblocking(false)?;
    let r = sock.peek(&mut [0u8; 1]);
    sock.set_nonblocking(true)?;
    match r {
        Ok(_) => Ok(true),
        Err(e) if transient(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The calling thread's CPU time since it was made.
struct CpuClock(Duration);

impl CpuClock {
    fn start() -> Self {
        CpuClock(fastudp_tools::os::thread_cpu_time())
    }

    fn elapsed(&self) -> Duration {
        fastudp_tools::os::thread_cpu_time().saturating_sub(self.0)
    }
}

/// What a sender did.
#[derive(Default)]
struct Sent {
    datagrams: u64,
    bytes: u64,
    /// Sends that failed with `ECONNREFUSED`; their datagrams are skipped,
    /// not counted.
    refused: u64,
    /// From the start to the end of the loop.
    elapsed: Duration,
    cpu: Duration,
}

impl Sent {
    /// Bytes sent per second, in MB.
    fn mb_per_sec(&self) -> f64 {
        per_sec(self.bytes, self.elapsed) / 1e6
    }

    /// Sender CPU nanoseconds per byte sent.
    fn ns_per_byte(&self) -> Option<f64> {
        ns_per_byte(self.cpu, self.bytes)
    }
}

/// What a receiver counted.
struct Tally {
    start: Instant,
    last: Option<Instant>,
    bytes: u64,
    datagrams: u64,
    clock: CpuClock,
    cpu: Duration,
}

impl Tally {
    /// Starts the wall and CPU clocks: call it right before the loop.
    fn new() -> Self {
        Tally {
            start: Instant::now(),
            last: None,
            bytes: 0,
            datagrams: 0,
            clock: CpuClock::start(),
            cpu: Duration::ZERO,
        }
    }

    fn add(&mut self, bytes: usize, datagrams: usize) {
        self.bytes += bytes as u64;
        self.datagrams += datagrams as u64;
        self.last = Some(Instant::now());
    }

    /// Stops the CPU clock: call it right after the loop.
    fn finish(mut self) -> Self {
        self.cpu = self.clock.elapsed();
        self
    }

    /// From the start to the last datagram received.
    fn elapsed(&self) -> Duration {
        self.last.map_or(Duration::ZERO, |l| l - self.start)
    }
}

/// One run's result.
struct Measured {
    bytes: u64,
    datagrams: u64,
    elapsed: Duration,
    sent: u64,
    /// Bytes sent per second, in MB.
    sent_mbs: f64,
    tx_cpu: Duration,
    rx_cpu: Duration,
}

impl Measured {
    fn bytes_per_sec(&self) -> f64 {
        per_sec(self.bytes, self.elapsed)
    }

    fn mb_per_sec(&self) -> f64 {
        self.bytes_per_sec() / 1e6
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

    /// Sender CPU nanoseconds per byte received.
    fn tx_ns_per_byte(&self) -> Option<f64> {
        ns_per_byte(self.tx_cpu, self.bytes)
    }

    /// Receiver CPU nanoseconds per byte received.
    fn rx_ns_per_byte(&self) -> Option<f64> {
        ns_per_byte(self.rx_cpu, self.bytes)
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

fn ns_per_byte(cpu: Duration, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu.as_nanos() as f64 / bytes as f64)
}

/// `a / b` when both are there and `b` is not zero.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn show(x: Option<f64>, digits: usize, suffix: &str) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.digits$}{suffix}"))
}

/// Median of the values there; `None` when there are none.
fn median(xs: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let mut v: Vec<f64> = xs.into_iter().flatten().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Errors a sender or receiver waits out rather than fails on.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// An ICMP port unreachable reported back on a send: counted, not fatal.
fn refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ECONNREFUSED)
}

/// With `pace` (bytes per second), sleeps while `bytes` sent since `start`
/// are ahead of that rate.
fn keep_pace(pace: Option<f64>, start: Instant, bytes: u64) {
    if let Some(rate) = pace {
        let due = start + Duration::from_secs_f64(bytes as f64 / rate);
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
    }
}

/// Runs `send` and `recv` on two threads, pinned when there are two CPUs.
/// `send` gets its deadline.
fn measure<S, R>(run: &Run, send: S, recv: R) -> anyhow::Result<Measured>
where
    S: FnOnce(Instant) -> anyhow::Result<Sent> + Send,
    R: FnOnce(&Stop<'_>) -> anyhow::Result<Tally> + Send,
{
    let Run { dur, pin, .. } = *run;
    let barrier = &Barrier::new(2);
    let done = &AtomicBool::new(false);
    thread::scope(|s| {
        let rx = s.spawn(move || {
            if pin {
                let _ = fastudp_tools::os::pin_to_cpu(1);
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
                let _ = fastudp_tools::os::pin_to_cpu(0);
            }
            barrier.wait();
            let r = send(Instant::now() + dur);
            done.store(true, Ordering::Release);
            r
        });
        let sent = tx
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))
            .and_then(|r| r.map_err(|e| anyhow::anyhow!("sender: {e}")));
        let got = rx
            .join()
            .map_err(|_| anyhow::anyhow!("receiver panicked"))
            .and_then(|r| r.map_err(|e| anyhow::anyhow!("receiver: {e}")));
        let (sent, got) = (sent?, got?);
        Ok(Measured {
            bytes: got.bytes,
            datagrams: got.datagrams,
            elapsed: got.elapsed(),
            sent: sent.datagrams,
            sent_mbs: sent.mb_per_sec(),
            tx_cpu: sent.cpu,
            rx_cpu: got.cpu,
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

/// Sets a receiving socket up for `wait`.
fn set_wait(sock: &UdpSocket, wait: Wait) -> io::Result<()> {
    match wait {
        Wait::Block => {
            sock.set_nonblocking(false)?;
            sock.set_read_timeout(Some(IDLE))
        }
        Wait::Peek => {
            sock.set_read_timeout(Some(IDLE))?;
            sock.set_nonblocking(true)
        }
        Wait::Poll => sock.set_nonblocking(true),
    }
}

fn sendto_recvfrom(run: &Run) -> anyhow::Result<Measured> {
    let (tx, rx) = std_pair()?;
    let dest = rx.local_addr()?;
    let wait = run.std_wait;
    set_wait(&rx, wait)?;
    measure(
        run,
        |until| {
            let buf = vec![0x5a_u8; DATAGRAM];
            let mut s = Sent::default();
            let start = Instant::now();
            let cpu = CpuClock::start();
            while Instant::now() < until {
                match tx.send_to(&buf, dest) {
                    Ok(n) => {
                        s.datagrams += 1;
                        s.bytes += n as u64;
                    }
                    Err(e) if refused(&e) => s.refused += 1,
                    Err(e) if transient(&e) => thread::yield_now(),
                    Err(e) => return Err(e.into()),
                }
            }
            s.cpu = cpu.elapsed();
            s.elapsed = start.elapsed();
            Ok(s)
        },
        |stop| {
            let mut buf = vec![0u8; 65_536];
            let mut idle_since = None;
            let mut t = Tally::new();
            while !stop.expired() {
                match rx.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        idle_since = None;
                        t.add(n, 1);
                    }
                    Err(e) if transient(&e) => {
                        if stop.nothing_came(wait, &rx, &mut idle_since)? {
                            break;
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(t.finish())
        },
    )
}

/// Receives with a fastudp socket until the sender is done and the socket
/// idle, counting every datagram of every (GRO) message.
fn fastudp_receive(rx: &Socket, wait: Wait, stop: &Stop<'_>) -> anyhow::Result<Tally> {
    let mut batch = RecvBatch::new(BATCH);
    let mut idle_since = None;
    let mut t = Tally::new();
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
            Err(e) if e.io_error().is_some_and(transient) => {
                if stop.nothing_came(wait, rx.as_std(), &mut idle_since)? {
                    break;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(t.finish())
}

/// Sends all of `transmits` per iteration, over and over until `until`.
/// A short send is completed with the rest before the next iteration; a
/// transmit refused with `ECONNREFUSED` is counted and skipped. With `pace`
/// (bytes per second), sleeps after each call while ahead of that rate.
fn fastudp_send_loop(
    tx: &Socket,
    transmits: &[Transmit<'_>],
    until: Instant,
    pace: Option<f64>,
) -> anyhow::Result<Sent> {
    let mut s = Sent::default();
    let start = Instant::now();
    let cpu = CpuClock::start();
    'run: while Instant::now() < until {
        let mut done = 0;
        while done < transmits.len() {
            match tx.send(&transmits[done..]) {
                Ok(sent) => {
                    // GSO stays on here: trains go whole or not at all.
                    let n = sent.transmits;
                    for t in &transmits[done..done + n] {
                        s.datagrams += t.segments() as u64;
                        s.bytes += t.contents.len() as u64;
                    }
                    done += n;
                }
                Err(e) if e.io_error().is_some_and(refused) => {
                    s.refused += 1;
                    done += 1;
                }
                Err(e) if e.io_error().is_some_and(transient) => {
                    if Instant::now() >= until {
                        break 'run;
                    }
                    thread::yield_now();
                }
                Err(e) => return Err(e.into()),
            }
            keep_pace(pace, start, s.bytes);
        }
    }
    s.cpu = cpu.elapsed();
    s.elapsed = start.elapsed();
    Ok(s)
}

/// `TRAINS_PER_SEND` GSO trains of `GSO_SEGMENTS` datagrams to `dest`.
fn trains(dest: SocketAddr, payload: &[u8]) -> Vec<Transmit<'_>> {
    vec![Transmit::train(dest, payload, DATAGRAM); TRAINS_PER_SEND]
}

/// One GSO train's payload.
fn train_payload() -> Vec<u8> {
    vec![0x5a_u8; GSO_SEGMENTS * DATAGRAM]
}

fn fastudp_pair(config: Config, wait: Wait) -> anyhow::Result<(Socket, Socket)> {
    let rx = Socket::bind(local(), config.recv_buffer(RECV_BUFFER))?;
    let tx = Socket::bind(local(), config)?;
    set_wait(rx.as_std(), wait)?;
    Ok((tx, rx))
}

fn fastudp_mmsg(run: &Run) -> anyhow::Result<Measured> {
    let config = Config::default().disable([Feature::Gso]).gro(false);
    let wait = run.fastudp_wait;
    let (tx, rx) = fastudp_pair(config, wait)?;
    let dest = rx.as_std().local_addr()?;
    let r = measure(
        run,
        |until| {
            let buf = vec![0x5a_u8; DATAGRAM];
            let ts = vec![Transmit::new(dest, &buf); BATCH];
            fastudp_send_loop(&tx, &ts, until, None)
        },
        |stop| fastudp_receive(&rx, wait, stop),
    );
    if run.verbose {
        report_fastudp("fastudp sendmmsg/recvmmsg", &tx, &rx);
    }
    r
}

fn fastudp_gso_gro(run: &Run) -> anyhow::Result<Measured> {
    let wait = run.fastudp_wait;
    let (tx, rx) = fastudp_pair(Config::default(), wait)?;
    let dest = rx.as_std().local_addr()?;
    if tx.max_gso_segments() < GSO_SEGMENTS {
        eprintln!(
            "note: fastudp GSO allows {} segments per send; trains go out split",
            tx.max_gso_segments()
        );
    }
    let r = measure(
        run,
        |until| {
            let payload = train_payload();
            fastudp_send_loop(&tx, &trains(dest, &payload), until, None)
        },
        |stop| fastudp_receive(&rx, wait, stop),
    );
    if run.verbose {
        report_fastudp("fastudp gso+gro", &tx, &rx);
    }
    r
}

/// Prints what the sockets probed and any fallback, drop or truncation.
fn report_fastudp(name: &str, tx: &Socket, rx: &Socket) {
    let (ts, rs) = (tx.stats(), rx.stats());
    let caps = rx.capabilities();
    println!(
        "  [{name}] gso segments {}, gro {}, send calls {}, recv calls {}, recv messages {}, kernel drops {}, truncated {}, fallbacks {}",
        tx.max_gso_segments(),
        caps.supports(Feature::Gro),
        ts.send_calls,
        rs.recv_calls,
        rs.recv_messages,
        rs.kernel_drops,
        rs.truncated,
        ts.fallbacks_total + rs.fallbacks_total,
    );
    for f in ts.fallbacks.iter().chain(rs.fallbacks.iter()) {
        println!("    fallback: {}", f.reason);
    }
}

/// A quinn-udp sender on a blocking socket, as fastudp's.
fn quinn_sender() -> anyhow::Result<(UdpSocket, quinn_udp::UdpSocketState)> {
    let tx = UdpSocket::bind(local())?;
    // This makes the socket non-blocking.
    let state = quinn_udp::UdpSocketState::new((&tx).into())?;
    tx.set_nonblocking(false)?;
    if state.max_gso_segments() < GSO_SEGMENTS {
        return Err(anyhow::anyhow!(
            "quinn-udp GSO allows {} segments per send",
            state.max_gso_segments()
        ));
    }
    Ok((tx, state))
}

/// A quinn-udp receiver set up for `run.quinn_wait`, and how it waits. It
/// cannot block: quinn-udp's `recvmmsg` would wait for all BATCH messages.
fn quinn_receiver(run: &Run) -> anyhow::Result<(UdpSocket, quinn_udp::UdpSocketState, Wait)> {
    let rx = UdpSocket::bind(local())?;
    socket2::SockRef::from(&rx).set_recv_buffer_size(RECV_BUFFER)?;
    // This makes the socket non-blocking and turns GRO on.
    let state = quinn_udp::UdpSocketState::new((&rx).into())?;
    let wait = match run.quinn_wait {
        Wait::Block => Wait::Peek,
        w => w,
    };
    set_wait(&rx, wait)?;
    Ok((rx, state, wait))
}

/// Sends `TRAINS_PER_SEND` trains per iteration, one `try_send` each, over
/// and over until `until`: the same work as one fastudp `send` per
/// iteration. A train refused with `ECONNREFUSED` is counted and skipped.
fn quinn_send_loop(
    state: &quinn_udp::UdpSocketState,
    tx: &UdpSocket,
    dest: SocketAddr,
    until: Instant,
) -> anyhow::Result<Sent> {
    let payload = train_payload();
    let transmit = quinn_udp::Transmit {
        destination: dest,
        ecn: None,
        contents: &payload,
        segment_size: Some(DATAGRAM),
        src_ip: None,
    };
    let mut s = Sent::default();
    let start = Instant::now();
    let cpu = CpuClock::start();
    'run: while Instant::now() < until {
        let mut done = 0;
        while done < TRAINS_PER_SEND {
            // `try_send` reports every error, as fastudp's `send`; `send`
            // would swallow all but `WouldBlock`.
            match state.try_send(tx.into(), &transmit) {
                Ok(()) => {
                    s.datagrams += GSO_SEGMENTS as u64;
                    s.bytes += payload.len() as u64;
                    done += 1;
                }
                Err(e) if refused(&e) => {
                    s.refused += 1;
                    done += 1;
                }
                Err(e) if transient(&e) => {
                    if Instant::now() >= until {
                        break 'run;
                    }
                    thread::yield_now();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    s.cpu = cpu.elapsed();
    s.elapsed = start.elapsed();
    Ok(s)
}

/// Receives with quinn-udp until the sender is done and the socket idle,
/// counting every datagram of every (GRO) message.
fn quinn_receive(
    state: &quinn_udp::UdpSocketState,
    rx: &UdpSocket,
    wait: Wait,
    stop: &Stop<'_>,
) -> anyhow::Result<Tally> {
    let mut bufs = vec![vec![0u8; GRO_MESSAGE]; BATCH];
    let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
    let mut metas = vec![quinn_udp::RecvMeta::default(); BATCH];
    let mut idle_since = None;
    let mut t = Tally::new();
    while !stop.expired() {
        match state.recv(rx.into(), &mut slices, &mut metas) {
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
                if stop.nothing_came(wait, rx, &mut idle_since)? {
                    break;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(t.finish())
}

fn quinn_gso_gro(run: &Run) -> anyhow::Result<Measured> {
    let (rx, rx_state, wait) = quinn_receiver(run)?;
    let (tx, tx_state) = quinn_sender()?;
    let dest = rx.local_addr()?;
    if run.verbose {
        println!(
            "  [quinn-udp gso+gro] max_gso_segments {}, gro_segments {}",
            tx_state.max_gso_segments(),
            rx_state.gro_segments()
        );
    }
    measure(
        run,
        |until| quinn_send_loop(&tx_state, &tx, dest, until),
        |stop| quinn_receive(&rx_state, &rx, wait, stop),
    )
}

/// A 127.0.0.1 address with nothing bound on it: a port bound and dropped
/// at once. Call it while the sender is bound, so the two differ.
fn closed_port() -> anyhow::Result<SocketAddr> {
    let probe = UdpSocket::bind(local())?;
    Ok(probe.local_addr()?)
}

/// Runs `f` on a new thread, pinned to CPU 0 when `pin`.
fn on_sender_thread<T: Send>(pin: bool, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    thread::scope(|s| {
        s.spawn(move || {
            if pin {
                let _ = fastudp_tools::os::pin_to_cpu(0);
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))
    })
}

/// Send side, A: fastudp's sender alone, to a closed port.
fn fastudp_send_only(run: &Run) -> anyhow::Result<Sent> {
    let tx = Socket::bind(local(), Config::default())?;
    let dest = closed_port()?;
    if tx.max_gso_segments() < GSO_SEGMENTS {
        return Err(anyhow::anyhow!(
            "fastudp GSO allows {} segments per send",
            tx.max_gso_segments()
        ));
    }
    on_sender_thread(run.pin, || {
        let payload = train_payload();
        fastudp_send_loop(&tx, &trains(dest, &payload), Instant::now() + run.dur, None)
    })?
}

/// Send side, B: quinn-udp's sender alone, to a closed port.
fn quinn_send_only(run: &Run) -> anyhow::Result<Sent> {
    let (tx, state) = quinn_sender()?;
    let dest = closed_port()?;
    on_sender_thread(run.pin, || {
        quinn_send_loop(&state, &tx, dest, Instant::now() + run.dur)
    })?
}

/// The receive side's sender, the same for A and B: fastudp, the 8 trains
/// per call, paced to [`OFFERED_MBS`].
fn paced_send(tx: &Socket, dest: SocketAddr, until: Instant) -> anyhow::Result<Sent> {
    let payload = train_payload();
    fastudp_send_loop(tx, &trains(dest, &payload), until, Some(OFFERED_MBS * 1e6))
}

/// Receive side, A: the paced sender into fastudp's receiver.
fn fastudp_recv_only(run: &Run) -> anyhow::Result<Measured> {
    let wait = run.fastudp_wait;
    let (tx, rx) = fastudp_pair(Config::default(), wait)?;
    let dest = rx.as_std().local_addr()?;
    measure(
        run,
        |until| paced_send(&tx, dest, until),
        |stop| fastudp_receive(&rx, wait, stop),
    )
}

/// Receive side, B: the paced sender into quinn-udp's receiver.
fn quinn_recv_only(run: &Run) -> anyhow::Result<Measured> {
    let (rx, state, wait) = quinn_receiver(run)?;
    let tx = Socket::bind(local(), Config::default())?;
    let dest = rx.local_addr()?;
    measure(
        run,
        |until| paced_send(&tx, dest, until),
        |stop| quinn_receive(&state, &rx, wait, stop),
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

fn bench_rounds() -> usize {
    match std::env::var("FASTUDP_BENCH_ROUNDS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_ROUNDS).contains(&n) => n,
            _ => {
                eprintln!("FASTUDP_BENCH_ROUNDS={v:?} is not a whole number in [1, {MAX_ROUNDS}]; using {DEFAULT_ROUNDS}");
                DEFAULT_ROUNDS
            }
        },
        Err(_) => DEFAULT_ROUNDS,
    }
}

type Strategy = fn(&Run) -> anyhow::Result<Measured>;

fn full_table(run: &Run) {
    let strategies: [(&str, Strategy); 4] = [
        ("sendto/recvfrom", sendto_recvfrom),
        ("fastudp sendmmsg/recvmmsg", fastudp_mmsg),
        ("fastudp gso+gro", fastudp_gso_gro),
        ("quinn-udp gso+gro", quinn_gso_gro),
    ];
    let mut results: Vec<(&str, anyhow::Result<Measured>)> = Vec::new();
    for (name, strategy) in strategies {
        results.push((name, strategy(run)));
    }

    let base = results
        .first()
        .and_then(|(_, r)| r.as_ref().ok())
        .map(Measured::bytes_per_sec);
    println!();
    println!(
        "{:<27} {:>8} {:>12} {:>9} {:>7} {:>9} {:>9}",
        "strategy", "MB/s", "datagrams/s", "vs sendto", "loss %", "tx ns/B", "rx ns/B"
    );
    for (name, r) in &results {
        match r {
            Ok(m) => println!(
                "{:<27} {:>8.1} {:>12.0} {:>9} {:>7.2} {:>9} {:>9}",
                name,
                m.mb_per_sec(),
                m.datagrams_per_sec(),
                show(ratio(Some(m.bytes_per_sec()), base), 2, "x"),
                m.loss_percent(),
                show(m.tx_ns_per_byte(), 3, ""),
                show(m.rx_ns_per_byte(), 3, ""),
            ),
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
    println!(
        "gso+gro fastudp / quinn-udp, this one run: {} (receiver-bound, with loss; see (a) and (b) below)",
        show(
            ratio(rate("fastudp gso+gro"), rate("quinn-udp gso+gro")),
            2,
            "x"
        )
    );
}

/// Prints one row of an A/B table: a label, then cells right-aligned.
fn row(label: &str, cells: &[String]) {
    let mut line = format!("{label:<7}");
    for c in cells {
        line.push_str(&format!(" {c:>9}"));
    }
    println!("{line}");
}

/// Median of one column of rounds, shown.
fn median_of<T>(
    rounds: &[T],
    f: impl Fn(&T) -> Option<f64>,
    digits: usize,
    suffix: &str,
) -> String {
    show(median(rounds.iter().map(f)), digits, suffix)
}

/// Runs `a` then `b`, `rounds` times; returns the rounds where both worked
/// after `each` printed them, and prints those that failed.
fn alternate<T>(
    rounds: usize,
    a: impl Fn() -> anyhow::Result<T>,
    b: impl Fn() -> anyhow::Result<T>,
    each: impl Fn(usize, &T, &T),
) -> Vec<(T, T)> {
    let mut all = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        match (a(), b()) {
            (Ok(a), Ok(b)) => {
                each(round, &a, &b);
                all.push((a, b));
            }
            (a, b) => {
                for (name, r) in [("fastudp", a.err()), ("quinn-udp", b.err())] {
                    if let Some(e) = r {
                        println!("{round:<7} {name} error: {e}");
                    }
                }
            }
        }
    }
    all
}

/// (a) Each library's sender alone, to a port where nothing is bound.
fn send_side(run: &Run, rounds: usize) {
    let secs = run.dur.as_secs_f64();
    println!();
    println!(
        "(a) send side: fastudp (A) vs quinn-udp (B), {rounds} rounds of A then B, {secs} s each"
    );
    println!(
        "A: Socket::send of {TRAINS_PER_SEND} trains of {GSO_SEGMENTS} x {DATAGRAM} B per call; B: try_send of the same {TRAINS_PER_SEND} trains one by one; blocking sockets, {}",
        if run.pin { "sender pinned to CPU 0" } else { "not pinned" }
    );
    println!("to 127.0.0.1:<a port bound and dropped per run>: the kernel drops each train at UDP input (ICMP port unreachable), the same work for A and B");
    println!("MB/s: bytes sent per second; tx ns/B: sender thread CPU ns per byte sent");
    println!("ratios: MB/s A/B, CPU B/A (above 1: fastudp better)");
    let head = ["A MB/s", "B MB/s", "MB/s", "A tx ns/B", "B tx ns/B", "CPU"];
    row("round", &head.map(String::from));
    let ratios = |a: &Sent, b: &Sent| {
        (
            ratio(Some(a.mb_per_sec()), Some(b.mb_per_sec())),
            ratio(b.ns_per_byte(), a.ns_per_byte()),
        )
    };
    let all = alternate(
        rounds,
        || fastudp_send_only(run),
        || quinn_send_only(run),
        |round, a, b| {
            let (mbs, cpu) = ratios(a, b);
            row(
                &round.to_string(),
                &[
                    format!("{:.1}", a.mb_per_sec()),
                    format!("{:.1}", b.mb_per_sec()),
                    show(mbs, 2, "x"),
                    show(a.ns_per_byte(), 4, ""),
                    show(b.ns_per_byte(), 4, ""),
                    show(cpu, 2, "x"),
                ],
            );
        },
    );
    row(
        "median",
        &[
            median_of(&all, |(a, _)| Some(a.mb_per_sec()), 1, ""),
            median_of(&all, |(_, b)| Some(b.mb_per_sec()), 1, ""),
            median_of(&all, |(a, b)| ratios(a, b).0, 2, "x"),
            median_of(&all, |(a, _)| a.ns_per_byte(), 4, ""),
            median_of(&all, |(_, b)| b.ns_per_byte(), 4, ""),
            median_of(&all, |(a, b)| ratios(a, b).1, 2, "x"),
        ],
    );
    println!(
        "ECONNREFUSED (counted, train skipped): fastudp {}, quinn-udp {}",
        all.iter().map(|(a, _)| a.refused).sum::<u64>(),
        all.iter().map(|(_, b)| b.refused).sum::<u64>(),
    );
}

/// (b) The same paced sender into each library's receiver.
fn receive_side(run: &Run, rounds: usize) {
    let secs = run.dur.as_secs_f64();
    println!();
    println!("(b) receive side: fastudp (A) vs quinn-udp (B), {rounds} rounds of A then B, {secs} s each");
    println!(
        "the same sender for A and B: fastudp, {TRAINS_PER_SEND} trains of {GSO_SEGMENTS} x {DATAGRAM} B per call, paced to {OFFERED_MBS} MB/s offered"
    );
    println!(
        "A: fastudp receiver, GRO, RecvBatch::new({BATCH}); B: quinn-udp receiver, GRO, {BATCH} slices of {GRO_MESSAGE} B; both {}",
        match run.fastudp_wait {
            Wait::Poll => "poll a non-blocking socket (FASTUDP_BENCH_POLL=1: rx CPU is all wall time)",
            _ => "non-blocking, waiting with a 1-byte MSG_PEEK when empty",
        }
    );
    println!("sent/got: MB/s sent and received; rx ns/B: receiver thread CPU ns per byte received; ratio B/A (above 1: fastudp cheaper)");
    let head = [
        "A sent",
        "A got",
        "A loss %",
        "A rx ns/B",
        "B sent",
        "B got",
        "B loss %",
        "B rx ns/B",
        "rx CPU",
    ];
    row("round", &head.map(String::from));
    let cpu = |a: &Measured, b: &Measured| ratio(b.rx_ns_per_byte(), a.rx_ns_per_byte());
    let all = alternate(
        rounds,
        || fastudp_recv_only(run),
        || quinn_recv_only(run),
        |round, a, b| {
            row(
                &round.to_string(),
                &[
                    format!("{:.1}", a.sent_mbs),
                    format!("{:.1}", a.mb_per_sec()),
                    format!("{:.2}", a.loss_percent()),
                    show(a.rx_ns_per_byte(), 4, ""),
                    format!("{:.1}", b.sent_mbs),
                    format!("{:.1}", b.mb_per_sec()),
                    format!("{:.2}", b.loss_percent()),
                    show(b.rx_ns_per_byte(), 4, ""),
                    show(cpu(a, b), 2, "x"),
                ],
            );
            for (name, m) in [("fastudp", a), ("quinn-udp", b)] {
                if m.loss_percent() > LOSS_WARN_PERCENT {
                    println!(
                        "  warning: round {round}: the {name} receiver lost {:.2}% at {OFFERED_MBS} MB/s offered (over {LOSS_WARN_PERCENT}%): it was overloaded, so this round's rx CPU does not compare like with like",
                        m.loss_percent()
                    );
                }
            }
        },
    );
    row(
        "median",
        &[
            median_of(&all, |(a, _)| Some(a.sent_mbs), 1, ""),
            median_of(&all, |(a, _)| Some(a.mb_per_sec()), 1, ""),
            median_of(&all, |(a, _)| Some(a.loss_percent()), 2, ""),
            median_of(&all, |(a, _)| a.rx_ns_per_byte(), 4, ""),
            median_of(&all, |(_, b)| Some(b.sent_mbs), 1, ""),
            median_of(&all, |(_, b)| Some(b.mb_per_sec()), 1, ""),
            median_of(&all, |(_, b)| Some(b.loss_percent()), 2, ""),
            median_of(&all, |(_, b)| b.rx_ns_per_byte(), 4, ""),
            median_of(&all, |(a, b)| cpu(a, b), 2, "x"),
        ],
    );
}

fn main() {
    // `cargo bench` passes `--bench`. Without it (`cargo test --all-targets`)
    // the benchmark only proves it runs: one short round of everything.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let secs = if smoke { 0.2 } else { bench_secs() };
    let rounds = if smoke { 1 } else { bench_rounds() };
    if smoke {
        println!("smoke run (cargo bench runs the real benchmark): 0.2 s per run, 1 round");
    }
    let dur = Duration::from_secs_f64(secs);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let pin = cpus >= 2;
    let polling = std::env::var("FASTUDP_BENCH_POLL").is_ok_and(|v| v.trim() == "1");
    let (blocking, peeking) = if polling {
        (Wait::Poll, Wait::Poll)
    } else {
        (Wait::Block, Wait::Peek)
    };
    let table = Run {
        dur,
        pin,
        std_wait: blocking,
        fastudp_wait: blocking,
        quinn_wait: peeking,
        verbose: true,
    };
    let ab = Run {
        fastudp_wait: peeking,
        verbose: false,
        ..table
    };
    let rcvbuf = UdpSocket::bind(local()).ok().and_then(|s| {
        let r = socket2::SockRef::from(&s);
        r.set_recv_buffer_size(RECV_BUFFER).ok()?;
        r.recv_buffer_size().ok()
    });
    println!(
        "loopback 127.0.0.1, {DATAGRAM}-byte datagrams, {secs} s per run, {cpus} CPUs, {}",
        if pin {
            "sender pinned to CPU 0, receiver to CPU 1"
        } else {
            "not pinned"
        }
    );
    println!(
        "receivers: {}",
        if polling {
            "all poll non-blocking sockets (FASTUDP_BENCH_POLL=1)"
        } else {
            "std and fastudp block (200 ms read timeout); quinn-udp's is non-blocking and waits with a 1-byte MSG_PEEK"
        }
    );
    println!(
        "SO_RCVBUF asked {RECV_BUFFER}, got {} (the kernel reports double)",
        rcvbuf.map_or("?".to_string(), |n| n.to_string())
    );
    println!("tx/rx ns/B: sender/receiver thread CPU ns per byte received");

    full_table(&table);
    send_side(&ab, rounds);
    receive_side(&ab, rounds);
}
