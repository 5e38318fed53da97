//! The send strategies.

use super::{unspecified, Live, TxOutcome, TxStrategy, Workload};
use anyhow::{anyhow, bail, Context};
use fastudp_io::Transmit;
use fastudp_io::UdpIo;
use fastudp_tools::raw::{self, OutMsg};
use fastudp_tools::wire::cmsg::{CmsgBuf, Encoder};
use fastudp_tools::wire::consts::{SOL_UDP, UDP_SEGMENT};
use std::collections::{BTreeSet, VecDeque};
use std::io::{self, IoSlice, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// GSO super-buffers per sendmmsg call in `sendmmsg-gso` and `fastudp`.
pub const BUFFERS_PER_MMSG: usize = 8;

/// Bytes the sender cycles through with `--cache-thrash`: far more than any
/// CPU cache, as `udpgso_bench_tx -c` does.
pub const THRASH_BYTES: usize = 128 << 20;

/// The size of the send ring: one call's worth, or [`THRASH_BYTES`]
/// rounded to whole calls with `--cache-thrash`.
fn ring_len(w: &Workload, call_len: usize) -> usize {
    if w.cache_thrash {
        (THRASH_BYTES / call_len).max(2) * call_len
    } else {
        call_len
    }
}

/// The send ring, every page written once so that no page fault lands in
/// the measured loop.
fn ring(w: &Workload, call_len: usize) -> Vec<u8> {
    (0..ring_len(w, call_len)).map(|i| i as u8).collect()
}

/// The buffers a sender cycles through, one call's worth at a time.
struct Ring {
    buf: Vec<u8>,
    call_len: usize,
    payload: usize,
    off: usize,
    seq: u64,
    /// The number of the last call's first datagram.
    call_seq: u64,
}

impl Ring {
    fn new(w: &Workload, call_len: usize) -> Self {
        Ring {
            buf: ring(w, call_len),
            call_len,
            payload: w.payload,
            off: 0,
            seq: 0,
            call_seq: 0,
        }
    }

    /// The next call's bytes, each datagram stamped with its sequence number.
    fn next(&mut self) -> &[u8] {
        let at = self.off;
        self.off = (self.off + self.call_len) % self.buf.len();
        let b = &mut self.buf[at..at + self.call_len];
        self.call_seq = self.seq;
        stamp(b, self.payload, &mut self.seq);
        b
    }

    /// Says how many of the last call's datagrams went out: the numbers of
    /// those that did not are given to the next ones, so that a receiver
    /// counts no datagram as lost that was never sent.
    fn sent(&mut self, datagrams: usize) {
        self.seq = self.call_seq + datagrams as u64;
    }
}

/// Writes a sequence number into the first 8 bytes of each datagram, and
/// the send time (`CLOCK_MONOTONIC` ns, one reading per call) into the next
/// 8, from which a receiver computes the interarrival jitter (RFC 3550;
/// only differences of transit times count, so the two hosts' clocks need
/// not agree).
fn stamp(buf: &mut [u8], payload: usize, seq: &mut u64) {
    let now = fastudp_tools::os::monotonic_ns().to_le_bytes();
    for d in buf.chunks_mut(payload) {
        if d.len() >= 8 {
            d[..8].copy_from_slice(&seq.to_le_bytes());
        }
        if d.len() >= 16 {
            d[8..16].copy_from_slice(&now);
        }
        *seq += 1;
    }
}

thread_local! {
    /// A flag that ends the sender loops on this thread (see [`with_stop`]).
    static STOP: std::cell::RefCell<Option<std::sync::Arc<std::sync::atomic::AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a sender on this thread) so that setting `stop` ends its
/// loop, as Ctrl-C does: a reverse test whose client hung up.
pub fn with_stop<R>(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    f: impl FnOnce() -> R,
) -> R {
    STOP.with(|s| *s.borrow_mut() = Some(stop));
    let r = f();
    STOP.with(|s| *s.borrow_mut() = None);
    r
}

/// Ctrl-C, or this thread's stop flag.
fn stop_requested() -> bool {
    crate::interrupt::requested()
        || STOP.with(|s| s.borrow().as_ref().is_some_and(|f| f.load(Relaxed)))
}

/// How far ahead of its rate a paced sender may run before it sleeps: a
/// sleep per datagram would cost more CPU than the sends (a burst of this
/// long at 1 Gbit/s is 25 kB).
const PACE_SLACK: Duration = Duration::from_micros(200);

/// The longest single sleep of a paced sender: it looks at Ctrl-C and its
/// stop flag (a reverse test's client hanging up) at least this often.
const PACE_TICK: Duration = Duration::from_millis(20);

/// How much of its rate a paced sender puts in one call: a call of 10 ms
/// worth of bytes at most (but one datagram or train at least), so that
/// no burst of a whole batch goes out ahead of the rate.
const PACE_CALL: Duration = Duration::from_millis(10);

/// Waits until sending `next` more bytes, after the `bytes` sent since
/// `start`, keeps within `rate` bytes per second (at most [`PACE_SLACK`]
/// early). False when that time is past `deadline`, or a stop was asked
/// for while waiting: the call must not be made, so a paced run never
/// sends more than its rate allows over its duration.
fn pace(rate: Option<u64>, start: Instant, bytes: u64, next: u64, deadline: Instant) -> bool {
    let Some(r) = rate.filter(|&r| r > 0) else {
        return true;
    };
    let due = start + Duration::from_secs_f64((bytes + next) as f64 / r as f64);
    if due > deadline {
        return false;
    }
    loop {
        if stop_requested() {
            return false;
        }
        let now = Instant::now();
        if due <= now + PACE_SLACK {
            return true;
        }
        std::thread::sleep((due - now).min(PACE_TICK));
    }
}

/// Datagrams per call for a paced run: `per_call` cut to [`PACE_CALL`]'s
/// worth of `rate`, in whole multiples of `unit` (the smallest call the
/// strategy makes: one datagram, or one GSO train).
fn paced_per_call(rate: Option<u64>, payload: usize, per_call: usize, unit: usize) -> usize {
    let Some(r) = rate.filter(|&r| r > 0) else {
        return per_call;
    };
    let unit = unit.clamp(1, per_call.max(1));
    let budget = (r as f64 * PACE_CALL.as_secs_f64()) as usize;
    let units = (budget / (payload.max(1) * unit)).max(1);
    per_call.min(units * unit)
}

/// The sender's socket: bound to `w.bind` if given, else to any address
/// of `dest`'s family. A `w.bind` this host does not have is a usage
/// error; any other failure to bind, a runtime one.
fn bind_sender(dest: SocketAddr, w: &Workload) -> anyhow::Result<UdpSocket> {
    let at = w.bind.unwrap_or_else(|| unspecified(dest.is_ipv6()));
    UdpSocket::bind(at).map_err(|e| {
        if w.bind.is_some() && e.kind() == io::ErrorKind::AddrNotAvailable {
            usage!("bind sender to {at}: {e}")
        } else {
            anyhow::Error::new(e).context(format!("bind sender to {at}"))
        }
    })
}

/// Says how many datagrams the sending host's own queue dropped (the
/// library's `ENOBUFS` from a full qdisc, see `fastudp_io::UdpState::send`):
/// the run counts them as sent, and the receiver as lost.
fn note_local_drops(n: u64) {
    if n > 0 {
        eprintln!(
            "fastudp: note: the local queue (qdisc) was full and dropped {n} datagrams (ENOBUFS); they count as sent and lost"
        );
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// A send the destination refused (`ECONNREFUSED`): nothing listens there
/// (any more). `tx` tells it apart from other failures.
#[derive(Debug, thiserror::Error)]
#[error(
    "the receiver stopped answering (connection refused: nothing listens on that port any more)"
)]
pub struct Refused;

/// The error of a failed send: a runtime failure.
fn send_err(t: TxStrategy, e: io::Error) -> anyhow::Error {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => anyhow::Error::new(Refused),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            anyhow!("the receiver went away ({e})")
        }
        _ => anyhow::Error::new(e).context(format!("{} send failed", super::name(t))),
    }
}

/// Reads the error queue (IP_RECVERR) of the sending socket: an ICMP
/// "unreachable" for `dest` ends the run with an error that says so. A
/// batched send can lose the socket's pending error between its messages
/// (sendmmsg returns the count sent and drops it), so this is how `tx -m`
/// notices a receiver that is missing or has left.
fn peer_gone(
    state: &fastudp_io::UdpState,
    sock: &UdpSocket,
    dest: SocketAddr,
    dgrams: u64,
) -> anyhow::Result<()> {
    while let Ok(Some(e)) = (state, sock).recv_error() {
        if e.kind() == fastudp_io::SocketErrorKind::Unreachable {
            let to_dest = e.destination().is_none_or(|d| {
                d.ip().to_canonical() == dest.ip().to_canonical() && d.port() == dest.port()
            });
            if to_dest {
                bail!("the receiver at {dest} is not there: {e} (after {dgrams} datagrams sent)");
            }
        }
    }
    Ok(())
}

/// A UDP send strategy set up for its loop: the socket (with the
/// library's socket over it for `fastudp` and `uring-gso`), the watch on
/// its error queue, and what every call passes.
struct UdpSender {
    t: TxStrategy,
    dest: SocketAddr,
    sock: UdpSocket,
    /// The library's socket, for `fastudp` and `uring-gso`.
    fast: Option<fastudp_io::Socket>,
    /// The error queue's reader for the other strategies.
    watch: Option<fastudp_io::UdpState>,
    addr: socket2::SockAddr,
    /// The UDP_SEGMENT cmsg for a GSO buffer, or the seed's oversized one,
    /// in its first `seg_len` bytes.
    seg_cmsg: CmsgBuf,
    seg_len: usize,
    /// Payload bytes per datagram.
    p: usize,
    /// Datagrams per GSO buffer.
    segs: usize,
    /// Datagrams per call.
    per_call: usize,
}

impl UdpSender {
    /// Binds (and connects, if the workload says so) the socket and
    /// prepares what the calls of strategy `t` pass.
    fn new(t: TxStrategy, dest: SocketAddr, w: &Workload) -> anyhow::Result<Self> {
        let sock = bind_sender(dest, w)?;
        if w.connect {
            sock.connect(dest)
                .with_context(|| format!("connect to {dest}"))?;
        }
        let fast = if matches!(t, TxStrategy::Fastudp | TxStrategy::UringGso) {
            let clone = sock.try_clone().context("the sender's socket")?;
            Some(
                fastudp_io::Socket::from_std(clone, super::uring::config(t))
                    .map_err(|e| anyhow!("{e}"))?,
            )
        } else {
            None
        };
        // ICMP errors on the error queue (the fastudp strategy's own state
        // reads them already); fragments allowed, as a plain socket would
        // (the sizes were checked against the path MTU already).
        let watch = match fast {
            Some(_) => None,
            None => fastudp_io::UdpState::new(
                &sock,
                fastudp_io::Config::default().gro(false).may_fragment(true),
            )
            .ok(),
        };
        let p = w.payload;
        let segs = w.segs;
        let per_call = match t {
            TxStrategy::Sendto => 1,
            TxStrategy::Sendmmsg | TxStrategy::SendmmsgGsoSeed => w.batch,
            TxStrategy::SendmmsgGso | TxStrategy::Fastudp | TxStrategy::UringGso => {
                segs * BUFFERS_PER_MMSG
            }
            _ => segs,
        };
        // A batched call may carry fewer messages: one datagram, or one train.
        let unit = match t {
            TxStrategy::Sendmmsg | TxStrategy::SendmmsgGsoSeed => 1,
            TxStrategy::SendmmsgGso | TxStrategy::Fastudp | TxStrategy::UringGso => segs,
            _ => per_call,
        };
        let per_call = paced_per_call(w.rate, p, per_call, unit);
        if matches!(t, TxStrategy::GsoSockopt | TxStrategy::GsoIov) {
            raw::set_option_int(&sock, SOL_UDP, UDP_SEGMENT, p as i32)
                .context("UDP_SEGMENT option")?;
        }
        let mut seg_cmsg = raw::control_buffer();
        let seg_len = {
            let mut enc = Encoder::new(&mut seg_cmsg.0);
            let size = if t == TxStrategy::SendmmsgGsoSeed {
                1472.max(p)
            } else {
                p
            };
            enc.push_u16(SOL_UDP, UDP_SEGMENT, size.min(u16::MAX as usize) as u16)
                .map_err(|e| anyhow!("{e}"))?;
            enc.len()
        };
        Ok(UdpSender {
            t,
            dest,
            sock,
            fast,
            watch,
            addr: raw::sockaddr(dest),
            seg_cmsg,
            seg_len,
            p,
            segs,
            per_call,
        })
    }

    /// One call: sends `buf` (`per_call` datagrams) the strategy's way;
    /// returns the datagrams that went out.
    #[inline(always)]
    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let (t, dest, sock, addr, p, segs) =
            (self.t, self.dest, &self.sock, &self.addr, self.p, self.segs);
        let cmsg = &self.seg_cmsg.0[..self.seg_len];
        match t {
            TxStrategy::Sendto => sock.send_to(buf, dest).map(|_| 1),
            TxStrategy::Sendmmsg | TxStrategy::SendmmsgGsoSeed => {
                let iovs: Vec<[IoSlice<'_>; 1]> =
                    buf.chunks(p).map(|c| [IoSlice::new(c)]).collect();
                let control: &[u8] = if t == TxStrategy::SendmmsgGsoSeed {
                    cmsg
                } else {
                    &[]
                };
                let msgs: Vec<OutMsg<'_>> = iovs
                    .iter()
                    .map(|iov| OutMsg {
                        addr: Some(addr),
                        iov,
                        control,
                    })
                    .collect();
                raw::sendmmsg(sock, &msgs)
            }
            TxStrategy::GsoSockopt => sock.send_to(buf, dest).map(|_| segs),
            TxStrategy::GsoIov | TxStrategy::GsoIovCmsg => {
                let iov: Vec<IoSlice<'_>> = buf.chunks(p).map(IoSlice::new).collect();
                let control: &[u8] = if t == TxStrategy::GsoIovCmsg {
                    cmsg
                } else {
                    &[]
                };
                raw::sendmsg(
                    sock,
                    &OutMsg {
                        addr: Some(addr),
                        iov: &iov,
                        control,
                    },
                )
                .map(|_| segs)
            }
            TxStrategy::GsoCmsg => {
                let iov = [IoSlice::new(buf)];
                raw::sendmsg(
                    sock,
                    &OutMsg {
                        addr: Some(addr),
                        iov: &iov,
                        control: cmsg,
                    },
                )
                .map(|_| segs)
            }
            TxStrategy::SendmmsgGso => {
                let iovs: Vec<[IoSlice<'_>; 1]> =
                    buf.chunks(p * segs).map(|c| [IoSlice::new(c)]).collect();
                let msgs: Vec<OutMsg<'_>> = iovs
                    .iter()
                    .map(|iov| OutMsg {
                        addr: Some(addr),
                        iov,
                        control: cmsg,
                    })
                    .collect();
                raw::sendmmsg(sock, &msgs).map(|m| m * segs)
            }
            TxStrategy::Fastudp | TxStrategy::UringGso => {
                let f = self.fast.as_ref().expect("fastudp socket");
                let mut ts: Vec<Transmit<'_>> = buf
                    .chunks(p * segs)
                    .map(|c| Transmit::train(dest, c, p))
                    .collect();
                match send_trains(&mut ts, |t| f.send(t)) {
                    (0, Some(e)) => Err(io::Error::from(e)),
                    (n, _) => Ok(n),
                }
            }
            TxStrategy::Tcp
            | TxStrategy::TcpZerocopy
            | TxStrategy::GsoZerocopy
            | TxStrategy::UringZc
            | TxStrategy::UringZcFixed => {
                unreachable!("handled by tx::tcp and tx::zerocopy")
            }
        }
    }

    /// Ends the run with an error if the receiver is gone ([`peer_gone`]).
    fn check_peer(&self, dgrams: u64) -> anyhow::Result<()> {
        if let Some(w) = &self.watch {
            peer_gone(w, &self.sock, self.dest, dgrams)?;
        }
        if let Some(f) = &self.fast {
            peer_gone(f.state(), f.as_std(), self.dest, dgrams)?;
        }
        Ok(())
    }

    /// After the loop: the library's socket counts its own send calls
    /// (`calls` otherwise), says what its queue dropped and where it fell
    /// back, and `uring-gso` must have sent through its ring.
    fn finish(&self, calls: u64) -> anyhow::Result<u64> {
        let Some(f) = &self.fast else {
            return Ok(calls);
        };
        let s = f.stats();
        note_local_drops(s.dropped_locally);
        super::uring::check_tx(self.t, f)?;
        if !s.fallbacks.is_empty() {
            eprintln!(
                "fastudp: note: {}",
                s.fallbacks
                    .iter()
                    .map(|f| f.reason.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        Ok(s.send_calls)
    }
}

/// Runs a UDP send strategy to `dest` until the workload's time is up, or
/// Ctrl-C.
pub fn udp(
    t: TxStrategy,
    dest: SocketAddr,
    w: &Workload,
    live: &Live,
) -> anyhow::Result<TxOutcome> {
    if matches!(t, TxStrategy::GsoZerocopy | TxStrategy::UringZc) {
        return zerocopy(t, dest, w, live);
    }
    if t == TxStrategy::UringZcFixed {
        return zerocopy_fixed(dest, w, live);
    }
    let s = UdpSender::new(t, dest, w)?;
    let (p, per_call) = (s.p, s.per_call);
    let mut ring = Ring::new(w, p * per_call);
    let (mut calls, mut dgrams, mut bytes) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let deadline = start + w.duration;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while Instant::now() < deadline && !stop_requested() {
        if !pace(w.rate, start, bytes, (p * per_call) as u64, deadline) {
            break;
        }
        let buf = ring.next();
        let sent: io::Result<usize> = s.send(buf);
        calls += 1;
        if calls % 64 == 0 {
            s.check_peer(dgrams)?;
        }
        ring.sent(*sent.as_ref().unwrap_or(&0));
        match sent {
            Ok(n) => {
                dgrams += n as u64;
                bytes += (n * p) as u64;
                live.tx_calls.store(calls, Relaxed);
                live.tx_datagrams.store(dgrams, Relaxed);
            }
            Err(e) if transient(&e) => std::thread::yield_now(),
            Err(e) => return Err(send_err(t, e)),
        }
    }
    s.check_peer(dgrams)?;
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let calls = s.finish(calls)?;
    Ok(TxOutcome {
        datagrams: dgrams,
        bytes,
        calls,
        cpu,
        seconds: start.elapsed().as_secs_f64(),
        zerocopy: None,
    })
}

/// Sends every transmit of `ts` with `send` (the library's
/// `Socket::send`), resuming after each partial send, until all went out
/// or a call failed. Returns the datagrams that went out, counting those
/// of a train split over several calls once each, and the error that
/// stopped it. A call that sends nothing and reports nothing ends it too.
pub fn send_trains<'a>(
    ts: &mut [Transmit<'a>],
    mut send: impl FnMut(&[Transmit<'a>]) -> Result<fastudp_io::Sent, fastudp_io::Error>,
) -> (usize, Option<fastudp_io::Error>) {
    let (mut k, mut datagrams) = (0, 0);
    while k < ts.len() {
        match send(&ts[k..]) {
            Ok(n) => {
                let whole = n.transmits.min(ts.len() - k);
                datagrams += ts[k..k + whole].iter().map(|t| t.segments()).sum::<usize>();
                k += whole;
                if n.datagrams > 0 && k < ts.len() {
                    datagrams += n.datagrams.min(ts[k].segments());
                    ts[k] = ts[k].skip_datagrams(n.datagrams);
                } else if whole == 0 {
                    break;
                }
            }
            Err(e) => return (datagrams, Some(e)),
        }
    }
    (datagrams, None)
}

/// Writes the same bytes over TCP until the workload's time is up, or Ctrl-C.
pub fn tcp(mut s: TcpStream, w: &Workload, live: &Live) -> anyhow::Result<TxOutcome> {
    let p = w.payload;
    let mut ring = Ring::new(w, p * w.segs);
    let (mut calls, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let deadline = start + w.duration;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while Instant::now() < deadline && !stop_requested() {
        if !pace(w.rate, start, bytes, (p * w.segs) as u64, deadline) {
            break;
        }
        let buf = ring.next();
        s.write_all(buf).map_err(|e| send_err(TxStrategy::Tcp, e))?;
        calls += 1;
        bytes += buf.len() as u64;
        live.tx_calls.store(calls, Relaxed);
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let seconds = start.elapsed().as_secs_f64();
    drop(s);
    Ok(TxOutcome {
        datagrams: bytes / p as u64,
        bytes,
        calls,
        cpu,
        seconds,
        zerocopy: None,
    })
}

/// `gso-zerocopy`: GSO buffers sent with MSG_ZEROCOPY through the library's
/// [`fastudp_io::ZeroCopySender`] (not adaptive: this measures zerocopy itself);
/// `uring-zc`: the same with io_uring SENDMSG_ZC.
/// A buffer is stamped and sent again only after its completion arrived.
pub fn zerocopy(
    t: TxStrategy,
    dest: SocketAddr,
    w: &Workload,
    live: &Live,
) -> anyhow::Result<TxOutcome> {
    let sock = zerocopy_socket(dest, w)?;
    let mut zc = super::uring::zc_sender(t, &sock)?;
    let p = w.payload;
    let call_len = p * w.segs;
    let pool_len = ring_len(w, call_len) / call_len;
    let mut pool: Vec<Vec<u8>> = (0..pool_len.max(64))
        .map(|_| {
            ring(
                &Workload {
                    cache_thrash: false,
                    ..*w
                },
                call_len,
            )
        })
        .collect();
    let segment = (w.segs > 1).then_some(p);
    let mut seq = 0u64;
    let (mut calls, mut dgrams, mut bytes) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let deadline = start + w.duration;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while Instant::now() < deadline && !stop_requested() {
        if !pace(w.rate, start, bytes, call_len as u64, deadline) {
            break;
        }
        let mut buf = match pool.pop().or_else(|| zc.pop_done()) {
            Some(b) => b,
            None => {
                zc.wait(&sock, Duration::from_millis(10))
                    .map_err(|e| send_err(t, e.into()))?;
                continue;
            }
        };
        stamp(&mut buf, p, &mut seq);
        match zc.send(&sock, dest, buf, segment) {
            Ok(()) => {
                calls += 1;
                dgrams += w.segs as u64;
                bytes += call_len as u64;
                live.tx_calls.store(calls, Relaxed);
                live.tx_datagrams.store(dgrams, Relaxed);
            }
            Err((e, b)) => {
                pool.push(b);
                // Not sent: its numbers go to the next buffer.
                seq -= w.segs as u64;
                let e: io::Error = e.into();
                if !transient(&e) {
                    return Err(send_err(t, e));
                }
                std::thread::yield_now();
            }
        }
        zc.reap(&sock).map_err(|e| send_err(t, e.into()))?;
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let seconds = start.elapsed().as_secs_f64();
    let drained = zc.drain(&sock, Duration::from_secs(2));
    zerocopy_outcome(
        t,
        &sock,
        drained,
        zc.stats(),
        [dgrams, bytes, calls],
        cpu,
        seconds,
    )
}

/// The socket of the zerocopy senders: bound as [`bind_sender`] does,
/// connected when the workload says so.
fn zerocopy_socket(dest: SocketAddr, w: &Workload) -> anyhow::Result<fastudp_io::Socket> {
    let std_sock = bind_sender(dest, w)?;
    if w.connect {
        std_sock
            .connect(dest)
            .with_context(|| format!("connect to {dest}"))?;
    }
    fastudp_io::Socket::from_std(std_sock, fastudp_io::Config::default())
        .map_err(|e| anyhow!("{e}"))
}

/// The end of a zerocopy run: `drained` is the final wait for the
/// kernel's notifications (how many did not come), `s` the sender's
/// counters after it, `[datagrams, bytes, calls]` what was sent.
fn zerocopy_outcome(
    t: TxStrategy,
    sock: &fastudp_io::Socket,
    drained: Result<usize, fastudp_io::Error>,
    s: fastudp_io::ZeroCopyStats,
    [datagrams, bytes, calls]: [u64; 3],
    cpu: Duration,
    seconds: f64,
) -> anyhow::Result<TxOutcome> {
    let left = drained.map_err(|e| send_err(t, e.into()))?;
    if left > 0 {
        eprintln!("fastudp: warning: {left} zerocopy completions did not arrive within 2 s");
    }
    note_local_drops(sock.stats().dropped_locally);
    Ok(TxOutcome {
        datagrams,
        bytes,
        calls,
        cpu,
        seconds,
        zerocopy: Some((s.completions, s.copied)),
    })
}

/// `uring-zc-fixed`: `uring-zc` sending from the sender's pool of
/// registered buffers ([`fastudp_io::uring::UringZeroCopySender::with_buffers`]),
/// as many as `uring-zc`'s buffers: each is stamped in place and sent
/// again only after its notification. Where the kernel refuses fixed
/// buffers the pool is ordinary memory, and a note says so.
pub fn zerocopy_fixed(dest: SocketAddr, w: &Workload, live: &Live) -> anyhow::Result<TxOutcome> {
    use fastudp_io::uring::UringZeroCopySender;
    let t = TxStrategy::UringZcFixed;
    let sock = zerocopy_socket(dest, w)?;
    let p = w.payload;
    let call_len = p * w.segs;
    let count = (ring_len(w, call_len) / call_len)
        .max(64)
        .min(((256 << 20) / call_len).max(1));
    let na = |e: fastudp_io::Error| usage!("uring-zc-fixed is not available here: {e}");
    let mut zc = UringZeroCopySender::new(&sock)
        .map_err(na)?
        .with_buffers(&sock, count, call_len)
        .map_err(na)?;
    if !zc.fixed_buffers() || !zc.fixed_file(&sock) {
        let why: Vec<String> = sock
            .stats()
            .fallbacks
            .iter()
            .map(|f| f.reason.clone())
            .collect();
        eprintln!(
            "fastudp: note: uring-zc-fixed without its registrations: {}",
            why.join("; ")
        );
    }
    let segment = (w.segs > 1).then_some(p);
    let mut seq = 0u64;
    let (mut calls, mut dgrams, mut bytes) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let deadline = start + w.duration;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while Instant::now() < deadline && !stop_requested() {
        if !pace(w.rate, start, bytes, call_len as u64, deadline) {
            break;
        }
        let mut wrote = false;
        match zc.send_with(&sock, dest, call_len, segment, |b| {
            wrote = true;
            stamp(b, p, &mut seq);
        }) {
            Ok(()) => {
                calls += 1;
                dgrams += w.segs as u64;
                bytes += call_len as u64;
                live.tx_calls.store(calls, Relaxed);
                live.tx_datagrams.store(dgrams, Relaxed);
            }
            Err(e) => {
                if wrote {
                    // Not sent: its numbers go to the next buffer.
                    seq -= w.segs as u64;
                }
                let e: io::Error = e.into();
                if !transient(&e) {
                    return Err(send_err(t, e));
                }
                std::thread::yield_now();
            }
        }
        zc.reap();
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let seconds = start.elapsed().as_secs_f64();
    let drained = zc.drain(Duration::from_secs(2));
    zerocopy_outcome(
        t,
        &sock,
        drained,
        zc.stats(),
        [dgrams, bytes, calls],
        cpu,
        seconds,
    )
}

/// The buffers of `tcp-zerocopy`: the free ones, those in flight with the
/// ids of the sends that read them, and the completions counted.
struct TcpZcBuffers {
    pool: Vec<Vec<u8>>,
    /// Buffers in flight, oldest first, with the ids of the sends that
    /// read them (first, last).
    flight: VecDeque<(u32, u32, Vec<u8>)>,
    /// Ids the kernel reported done and not yet matched.
    done: BTreeSet<u32>,
    completions: u64,
    copied: u64,
}

impl TcpZcBuffers {
    /// A pool of buffers of `call_len` bytes: as many as the workload's
    /// ring holds, at least 64.
    fn new(w: &Workload, call_len: usize) -> Self {
        let pool_len = (ring_len(w, call_len) / call_len).max(64);
        TcpZcBuffers {
            pool: (0..pool_len)
                .map(|_| (0..call_len).map(|i| i as u8).collect())
                .collect(),
            flight: VecDeque::new(),
            done: BTreeSet::new(),
            completions: 0,
            copied: 0,
        }
    }

    /// Reads the notifications queued on `s`'s error queue, and gives
    /// back to the pool every buffer whose sends all completed.
    fn reap(&mut self, s: &TcpStream) -> anyhow::Result<()> {
        loop {
            match raw::recv_error(s) {
                Ok(Some(fastudp_tools::wire::errqueue::SocketError::ZeroCopy {
                    lo,
                    hi,
                    copied: c,
                })) => {
                    let n = u64::from(hi.wrapping_sub(lo)) + 1;
                    self.completions += n;
                    if c {
                        self.copied += n;
                    }
                    let mut id = lo;
                    loop {
                        self.done.insert(id);
                        if id == hi {
                            break;
                        }
                        id = id.wrapping_add(1);
                    }
                }
                Ok(Some(e)) => bail!("tcp-zerocopy: the socket reported {e}"),
                Ok(None) => break,
                Err(e) => return Err(send_err(TxStrategy::TcpZerocopy, e)),
            }
        }
        while let Some((first, last, _)) = self.flight.front() {
            let (first, last) = (*first, *last);
            let mut id = first;
            let all = loop {
                if !self.done.contains(&id) {
                    break false;
                }
                if id == last {
                    break true;
                }
                id = id.wrapping_add(1);
            };
            if !all {
                break;
            }
            let mut id = first;
            loop {
                self.done.remove(&id);
                if id == last {
                    break;
                }
                id = id.wrapping_add(1);
            }
            let (_, _, b) = self.flight.pop_front().expect("front");
            self.pool.push(b);
        }
        Ok(())
    }

    /// Waits up to 2 s for the last completions, which come when the
    /// receiver has acknowledged; warns of those that did not.
    fn drain(&mut self, s: &TcpStream) -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs(2);
        while !self.flight.is_empty() && Instant::now() < until {
            let _ = raw::wait_error(s, Duration::from_millis(10));
            self.reap(s)?;
        }
        if !self.flight.is_empty() {
            eprintln!(
                "fastudp: warning: {} zerocopy completions did not arrive within 2 s",
                self.flight.len()
            );
        }
        Ok(())
    }
}

/// `tcp-zerocopy`: the TCP stream of [`tcp`], sent with `MSG_ZEROCOPY`
/// (`SO_ZEROCOPY` on the socket). A buffer is written again only after
/// every send that read it completed (the error queue's notifications);
/// the completions the kernel marks copied are counted: to a receiver on
/// this host, every one is (the stack copies the pages before handing
/// them over, so that a local reader cannot see a buffer that changes).
pub fn tcp_zerocopy(s: TcpStream, w: &Workload, live: &Live) -> anyhow::Result<TxOutcome> {
    use fastudp_tools::wire::consts::{SOL_SOCKET, SO_ZEROCOPY};
    let t = TxStrategy::TcpZerocopy;
    raw::set_option_int(&s, SOL_SOCKET, SO_ZEROCOPY, 1).context("SO_ZEROCOPY on the TCP socket")?;
    let p = w.payload;
    let call_len = p * w.segs;
    let mut bufs = TcpZcBuffers::new(w, call_len);
    let mut next_id = 0u32;
    let mut seq = 0u64;
    let (mut calls, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let deadline = start + w.duration;
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    while Instant::now() < deadline && !stop_requested() {
        if !pace(w.rate, start, bytes, call_len as u64, deadline) {
            break;
        }
        let Some(mut buf) = bufs.pool.pop() else {
            // Every buffer is in flight: wait for a completion.
            let _ = raw::wait_error(&s, Duration::from_millis(10));
            bufs.reap(&s)?;
            continue;
        };
        stamp(&mut buf, p, &mut seq);
        let first = next_id;
        let mut off = 0;
        while off < buf.len() {
            let iov = [IoSlice::new(&buf[off..])];
            let msg = OutMsg {
                addr: None,
                iov: &iov,
                control: &[],
            };
            match raw::sendmsg_flags(&s, &msg, libc::MSG_ZEROCOPY) {
                Ok(n) => {
                    off += n;
                    calls += 1;
                    next_id = next_id.wrapping_add(1);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Over the socket's optmem limit of notifications: reap.
                    if Instant::now() > deadline + Duration::from_secs(5) {
                        bail!("tcp-zerocopy: no zerocopy notification for 5 s past the run's end (ENOBUFS)");
                    }
                    let _ = raw::wait_error(&s, Duration::from_millis(10));
                    bufs.reap(&s)?;
                }
                Err(e) => return Err(send_err(t, e)),
            }
        }
        bufs.flight.push_back((first, next_id.wrapping_sub(1), buf));
        bytes += call_len as u64;
        live.tx_calls.store(calls, Relaxed);
        bufs.reap(&s)?;
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    let seconds = start.elapsed().as_secs_f64();
    bufs.drain(&s)?;
    drop(s);
    Ok(TxOutcome {
        datagrams: bytes / p as u64,
        bytes,
        calls,
        cpu,
        seconds,
        zerocopy: Some((bufs.completions, bufs.copied)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastudp_io::Sent;

    fn sent(transmits: usize, datagrams: usize) -> Sent {
        let mut s = Sent::default();
        s.transmits = transmits;
        s.datagrams = datagrams;
        s
    }

    /// A paced sender makes calls of about 10 ms of its rate (one datagram
    /// or one train at least), makes no call whose bytes would be due after
    /// its deadline, and wakes for its stop flag while it waits.
    #[test]
    fn pacing_holds_the_rate_and_wakes_for_a_stop() {
        // 1 Mbit/s: 10 ms is 1250 bytes, one 1200-byte datagram per call.
        assert_eq!(paced_per_call(Some(125_000), 1200, 32, 1), 1);
        assert_eq!(paced_per_call(Some(125_000), 1200, 512, 64), 64);
        assert_eq!(paced_per_call(Some(125_000_000), 1200, 32, 1), 32);
        assert_eq!(paced_per_call(None, 1200, 32, 1), 32);
        let start = Instant::now();
        let end = start + Duration::from_secs(1);
        assert!(
            !pace(Some(125_000), start, 0, 200_000, end),
            "due after the deadline"
        );
        assert!(
            !pace(Some(125_000), start, 120_000, 10_000, end),
            "the last call over"
        );
        assert!(pace(Some(125_000), start, 0, 10, end));
        assert!(pace(None, start, u64::MAX / 2, 1 << 30, end));
        // Due in 8 s of a 30 s run: the stop flag ends the wait at once.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let setter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                stop.store(true, Relaxed);
            })
        };
        let t0 = Instant::now();
        let went = with_stop(stop, || {
            pace(Some(1000), t0, 0, 8000, t0 + Duration::from_secs(30))
        });
        setter.join().unwrap();
        assert!(!went);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }

    /// A train split over calls counts every datagram once: the datagrams
    /// of the first part are not forgotten when the rest goes out.
    #[test]
    fn a_train_split_over_calls_counts_every_datagram_once() {
        let dest: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let buf = vec![0u8; 3 * 4 * 100];
        let mut ts: Vec<Transmit<'_>> = buf
            .chunks(400)
            .map(|c| Transmit::train(dest, c, 100))
            .collect();
        // 1 datagram of train 0; then the rest of train 0 and train 1; then
        // 2 datagrams of train 2; then its last 2.
        let mut answers = vec![sent(0, 1), sent(2, 0), sent(0, 2), sent(1, 0)].into_iter();
        let mut lens = Vec::new();
        let (n, e) = send_trains(&mut ts, |t| {
            lens.push(t.iter().map(|t| t.segments()).sum::<usize>());
            Ok(answers.next().expect("no more calls than answers"))
        });
        assert!(e.is_none());
        assert_eq!(n, 12);
        assert_eq!(lens, vec![12, 11, 4, 2]);
    }

    /// An error after a partial send reports the datagrams that did go
    /// out, so their numbers are not given to others.
    #[test]
    fn an_error_after_a_partial_send_keeps_what_went_out() {
        let dest: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let buf = vec![0u8; 2 * 4 * 100];
        let mut ts: Vec<Transmit<'_>> = buf
            .chunks(400)
            .map(|c| Transmit::train(dest, c, 100))
            .collect();
        let mut calls = 0;
        let (n, e) = send_trains(&mut ts, |_| {
            calls += 1;
            match calls {
                1 => Ok(sent(0, 3)),
                _ => Err(fastudp_io::Error::from(io::Error::from_raw_os_error(
                    libc::ENETUNREACH,
                ))),
            }
        });
        assert_eq!(n, 3);
        assert!(e.is_some());
        // A call that sends nothing and reports nothing ends the loop.
        let (n, e) = send_trains(&mut ts, |_| Ok(sent(0, 0)));
        assert_eq!((n, e.is_none()), (0, true));
    }
}
