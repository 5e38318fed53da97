//! The soak's sender: every send strategy of `fastudp bench` but TCP,
//! the io_uring ones included, paced, numbering datagrams across the whole run,
//! carrying on through faults: an error is counted and the call retried a
//! millisecond later with the same numbers, so that only what the kernel
//! took counts as sent.

use super::account::{fill, Pacer};
use super::Shared;
use crate::engine::tx::send_trains;
use crate::engine::uring::ZcSender;
use crate::engine::TxStrategy;
use anyhow::{anyhow, bail, Context};
use fastudp_io::Transmit;
use fastudp_io::UdpIo;
use fastudp_tools::raw::{self, OutMsg};
use fastudp_tools::wire::cmsg::Encoder;
use fastudp_tools::wire::consts::{SOL_UDP, UDP_SEGMENT};
use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

/// The send strategies the soak cycles through, the library's own first.
pub const STRATEGIES: [TxStrategy; 12] = [
    TxStrategy::Fastudp,
    TxStrategy::Sendto,
    TxStrategy::Sendmmsg,
    TxStrategy::GsoSockopt,
    TxStrategy::GsoIov,
    TxStrategy::GsoIovCmsg,
    TxStrategy::GsoCmsg,
    TxStrategy::SendmmsgGso,
    TxStrategy::SendmmsgGsoSeed,
    TxStrategy::GsoZerocopy,
    TxStrategy::UringGso,
    TxStrategy::UringZc,
];

/// Datagrams per call: per GSO train, per sendmmsg; two trains of
/// `SEGS / 2` for `sendmmsg-gso` and `fastudp`.
pub const SEGS: usize = 20;

/// The library's strategies, whose faults must come back as an error or
/// a counted fallback.
pub fn is_library(t: TxStrategy) -> bool {
    matches!(
        t,
        TxStrategy::Fastudp | TxStrategy::GsoZerocopy | TxStrategy::UringGso | TxStrategy::UringZc
    )
}

/// Whether a strategy's buffers go out zerocopy (kept until the kernel
/// is done with them).
fn zerocopy(t: TxStrategy) -> bool {
    matches!(t, TxStrategy::GsoZerocopy | TxStrategy::UringZc)
}

/// Whether a strategy sends GSO trains.
pub fn uses_gso(t: TxStrategy) -> bool {
    !matches!(t, TxStrategy::Sendto | TxStrategy::Sendmmsg)
}

/// A short name of an errno.
pub fn errno_name(e: i32) -> String {
    let n = match e {
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENETDOWN => "ENETDOWN",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EINVAL => "EINVAL",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EIO => "EIO",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENOBUFS => "ENOBUFS",
        libc::EAGAIN => "EAGAIN",
        libc::EPERM => "EPERM",
        libc::ENXIO => "ENXIO",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

/// A short name of a library error: its errno, or its kind.
fn error_name(e: &fastudp_io::Error) -> String {
    match (e.kind(), e.io_error()) {
        (fastudp_io::ErrorKind::Io | fastudp_io::ErrorKind::PartialTrain, Some(io)) => io_name(io),
        (kind, _) => format!("{kind:?}"),
    }
}

fn io_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => errno_name(n),
        None => format!("{:?}", e.kind()),
    }
}

/// What a send call returned: datagrams sent, or none and the error's
/// name.
fn io_sent(r: io::Result<usize>) -> (usize, Option<String>) {
    match r {
        Ok(n) => (n, None),
        Err(e) => (0, Some(io_name(&e))),
    }
}

/// One strategy's socket and buffers.
struct Sender {
    t: TxStrategy,
    sock: UdpSocket,
    fast: Option<fastudp_io::Socket>,
    zc: Option<Box<dyn ZcSender>>,
    pool: Vec<Vec<u8>>,
    dest: SocketAddr,
    addr: socket2::SockAddr,
    payload: usize,
    cmsg: Vec<u8>,
    seed_cmsg: Vec<u8>,
}

fn segment_cmsg(size: usize) -> anyhow::Result<Vec<u8>> {
    let mut b = raw::control_buffer();
    let mut enc = Encoder::new(&mut b.0);
    enc.push_u16(SOL_UDP, UDP_SEGMENT, size.min(u16::MAX as usize) as u16)
        .map_err(|e| anyhow!("UDP_SEGMENT control message: {e}"))?;
    let n = enc.len();
    Ok(b.0[..n].to_vec())
}

impl Sender {
    /// The socket and buffers of strategy `t` (a runtime error if they
    /// cannot be set up).
    fn new(t: TxStrategy, dest: SocketAddr, payload: usize) -> anyhow::Result<Self> {
        let any = if dest.is_ipv6() {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let sock = UdpSocket::bind(any).map_err(|e| anyhow!("bind sender: {e}"))?;
        let (fast, zc) = match t {
            TxStrategy::Fastudp | TxStrategy::UringGso => (
                Some(
                    fastudp_io::Socket::from_std(
                        sock.try_clone().context("clone the sending socket")?,
                        crate::engine::uring::config(t),
                    )
                    .map_err(|e| anyhow!("{e}"))?,
                ),
                None,
            ),
            TxStrategy::GsoZerocopy | TxStrategy::UringZc => {
                let f = fastudp_io::Socket::from_std(
                    sock.try_clone().context("clone the sending socket")?,
                    fastudp_io::Config::default(),
                )
                .map_err(|e| anyhow!("{e}"))?;
                let z = crate::engine::uring::zc_sender(t, &f)?;
                (Some(f), Some(z))
            }
            _ => (None, None),
        };
        if matches!(t, TxStrategy::GsoSockopt | TxStrategy::GsoIov) {
            raw::set_option_int(&sock, SOL_UDP, UDP_SEGMENT, payload as i32)
                .map_err(|e| anyhow!("UDP_SEGMENT option: {e}"))?;
        }
        Ok(Sender {
            t,
            sock,
            fast,
            zc,
            pool: (0..64).map(|_| vec![0u8; SEGS * payload]).collect(),
            dest,
            addr: raw::sockaddr(dest),
            payload,
            cmsg: segment_cmsg(payload)?,
            seed_cmsg: segment_cmsg(1472.max(payload))?,
        })
    }

    /// Sets or clears `SO_NO_CHECK` (IPv4) or `UDP_NO_CHECK6_TX` (IPv6):
    /// no UDP checksum, with which the kernel refuses every GSO send with
    /// `EINVAL` (`SO_NO_CHECK` does nothing to an IPv6 send).
    fn set_no_check(&self, on: bool) -> io::Result<()> {
        if self.dest.is_ipv6() {
            raw::set_option_int(&self.sock, SOL_UDP, libc::UDP_NO_CHECK6_TX, on as i32)
        } else {
            raw::set_option_int(&self.sock, libc::SOL_SOCKET, libc::SO_NO_CHECK, on as i32)
        }
    }

    /// Sends datagrams `seq..seq + SEGS`; returns how many went out and
    /// the error that stopped the rest.
    fn call(&mut self, seq: u64) -> (usize, Option<String>) {
        let p = self.payload;
        let mut buf = match self.pool.pop() {
            Some(b) => b,
            None => {
                // Every zerocopy buffer is still with the kernel.
                let zc = self.zc.as_mut().expect("only zerocopy keeps buffers");
                let f = self.fast.as_ref().expect("zerocopy socket");
                return match zc.wait(f, Duration::from_millis(10)) {
                    Ok(_) => {
                        while let Some(b) = zc.pop_done() {
                            self.pool.push(b);
                        }
                        (0, None)
                    }
                    Err(e) => (0, Some(error_name(&e))),
                };
            }
        };
        for (i, d) in buf.chunks_mut(p).enumerate() {
            fill(d, seq + i as u64);
        }
        let (n, err) = self.send(&mut buf);
        if zerocopy(self.t) {
            let zc = self.zc.as_mut().expect("zerocopy sender");
            let f = self.fast.as_ref().expect("zerocopy socket");
            if let Err(e) = zc.reap(f) {
                return (n, Some(error_name(&e)));
            }
            while let Some(b) = zc.pop_done() {
                self.pool.push(b);
            }
        }
        (n, err)
    }

    /// Sends the datagrams in `buf` with the slot's strategy; returns how
    /// many went out and the name of the error that stopped the rest. The
    /// buffer goes back to the pool, or to the kernel when zerocopy.
    fn send(&mut self, buf: &mut Vec<u8>) -> (usize, Option<String>) {
        let r = match self.t {
            TxStrategy::GsoZerocopy | TxStrategy::UringZc => return self.send_zerocopy(buf),
            TxStrategy::Sendto => self.send_each(buf),
            TxStrategy::Sendmmsg | TxStrategy::SendmmsgGsoSeed => self.send_mmsg(buf),
            TxStrategy::GsoSockopt => io_sent(self.sock.send_to(buf, self.dest).map(|_| SEGS)),
            TxStrategy::GsoIov | TxStrategy::GsoIovCmsg | TxStrategy::GsoCmsg => self.send_gso(buf),
            TxStrategy::SendmmsgGso => self.send_mmsg_gso(buf),
            TxStrategy::Fastudp | TxStrategy::UringGso => self.send_library(buf),
            TxStrategy::Tcp | TxStrategy::TcpZerocopy | TxStrategy::UringZcFixed => {
                unreachable!("not in the soak's strategies")
            }
        };
        self.pool.push(std::mem::take(buf));
        r
    }

    /// `sendto`, one datagram per call.
    fn send_each(&self, buf: &[u8]) -> (usize, Option<String>) {
        let mut n = 0;
        for d in buf.chunks(self.payload) {
            if let Err(e) = self.sock.send_to(d, self.dest) {
                return (n, Some(io_name(&e)));
            }
            n += 1;
        }
        (n, None)
    }

    /// `sendmmsg`, one datagram per message (`sendmmsg-gso-seed`: each with
    /// a `UDP_SEGMENT` larger than the datagram).
    fn send_mmsg(&self, buf: &[u8]) -> (usize, Option<String>) {
        let control: &[u8] = if self.t == TxStrategy::SendmmsgGsoSeed {
            &self.seed_cmsg
        } else {
            &[]
        };
        let iovs: Vec<[IoSlice<'_>; 1]> = buf
            .chunks(self.payload)
            .map(|c| [IoSlice::new(c)])
            .collect();
        let msgs: Vec<OutMsg<'_>> = iovs
            .iter()
            .map(|iov| OutMsg {
                addr: Some(&self.addr),
                iov,
                control,
            })
            .collect();
        // sendmmsg stops at the first message it cannot send: the count is
        // exact, the error comes with the next call.
        io_sent(raw::sendmmsg(&self.sock, &msgs))
    }

    /// One GSO train by `sendmsg`: one iovec per datagram (`gso-iov`, the
    /// segment size set as a socket option; `gso-iov-cmsg`) or one for the
    /// train (`gso-cmsg`), the segment size in a control message.
    fn send_gso(&self, buf: &[u8]) -> (usize, Option<String>) {
        let iov: Vec<IoSlice<'_>> = if self.t == TxStrategy::GsoCmsg {
            vec![IoSlice::new(buf)]
        } else {
            buf.chunks(self.payload).map(IoSlice::new).collect()
        };
        let control: &[u8] = if self.t == TxStrategy::GsoIov {
            &[]
        } else {
            &self.cmsg
        };
        io_sent(
            raw::sendmsg(
                &self.sock,
                &OutMsg {
                    addr: Some(&self.addr),
                    iov: &iov,
                    control,
                },
            )
            .map(|_| SEGS),
        )
    }

    /// Two GSO trains in one `sendmmsg`.
    fn send_mmsg_gso(&self, buf: &[u8]) -> (usize, Option<String>) {
        let iovs: Vec<[IoSlice<'_>; 1]> = buf
            .chunks(self.payload * SEGS / 2)
            .map(|c| [IoSlice::new(c)])
            .collect();
        let msgs: Vec<OutMsg<'_>> = iovs
            .iter()
            .map(|iov| OutMsg {
                addr: Some(&self.addr),
                iov,
                control: &self.cmsg,
            })
            .collect();
        io_sent(raw::sendmmsg(&self.sock, &msgs).map(|m| m * SEGS / 2))
    }

    /// Two trains through the library's socket (`fastudp`, `uring-gso`).
    fn send_library(&self, buf: &[u8]) -> (usize, Option<String>) {
        let p = self.payload;
        let f = self.fast.as_ref().expect("fastudp socket");
        let mut ts: Vec<Transmit<'_>> = buf
            .chunks(p * SEGS / 2)
            .map(|c| Transmit::train(self.dest, c, p))
            .collect();
        let (n, e) = send_trains(&mut ts, |t| f.send(t));
        (n, e.map(|e| error_name(&e)))
    }

    /// One train handed to the zerocopy sender, which keeps the buffer
    /// until the kernel is done with it (back in the pool on an error).
    fn send_zerocopy(&mut self, buf: &mut Vec<u8>) -> (usize, Option<String>) {
        let zc = self.zc.as_mut().expect("zerocopy sender");
        let f = self.fast.as_ref().expect("zerocopy socket");
        match zc.send(f, self.dest, std::mem::take(buf), Some(self.payload)) {
            Ok(()) => (SEGS, None),
            Err((e, b)) => {
                self.pool.push(b);
                let n = e.datagrams_sent().unwrap_or(0);
                (n, Some(error_name(&e)))
            }
        }
    }

    /// Reports the library's counters and GSO state into `sh`.
    fn publish(&self, sh: &Shared) {
        if let Some(f) = &self.fast {
            let s = f.stats();
            sh.fallbacks.store(s.fallbacks_total, Relaxed);
            sh.resent.store(s.resent_unsegmented, Relaxed);
            sh.dropped_locally.store(s.dropped_locally, Relaxed);
            sh.gso_retries.store(s.gso_retries, Relaxed);
            sh.messages.store(s.send_messages, Relaxed);
            let g = f.state().max_gso_segments_to(&self.dest);
            sh.gso_segments.store(g as u64, Relaxed);
        }
    }

    /// Waits for the zerocopy buffers still with the kernel, and checks
    /// that an io_uring strategy really sent through its ring.
    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(f) = &self.fast {
            crate::engine::uring::check_tx(self.t, f)
                .with_context(|| crate::engine::name(self.t))?;
        }
        if let (Some(zc), Some(f)) = (self.zc.as_mut(), self.fast.as_ref()) {
            let left = zc
                .drain(f, Duration::from_secs(2))
                .map_err(|e| anyhow!("{} drain: {e}", crate::engine::name(self.t)))?;
            if left > 0 {
                bail!(
                    "{}: {left} completions did not arrive within 2 s",
                    crate::engine::name(self.t)
                );
            }
        }
        Ok(())
    }
}

/// Sends with strategy `t` at `rate` datagrams per second until `sh.stop`;
/// the caller's thread is in the sender's namespace. Returns the fallback
/// reasons the library recorded. Every error is a runtime error: the
/// slot's sender broke off (a refused send is counted, not an error).
pub fn run(
    t: TxStrategy,
    dest: SocketAddr,
    payload: usize,
    rate: f64,
    sh: &Shared,
) -> anyhow::Result<Vec<String>> {
    let mut s = Sender::new(t, dest, payload)?;
    let origin = Instant::now();
    let mut pacer = Pacer::new(rate, 2 * SEGS, Duration::ZERO);
    let mut no_check = false;
    s.publish(sh);
    while !sh.stop.load(Acquire) {
        sh.beat();
        let want = sh.no_check.load(Acquire);
        if want != no_check {
            s.set_no_check(want)
                .map_err(|e| anyhow!("no UDP checksum: {e}"))?;
            no_check = want;
        }
        let wait = pacer.wait(SEGS, origin.elapsed());
        if !wait.is_zero() {
            std::thread::sleep(wait.min(Duration::from_millis(5)));
            continue;
        }
        let seq = sh.next_seq.load(Relaxed);
        let (n, err) = s.call(seq);
        sh.next_seq.store(seq + n as u64, Release);
        pacer.take(n);
        if n > 0 {
            sh.last_sent_ns.store(sh.now_ns(), Release);
        }
        s.publish(sh);
        if let Some(e) = err {
            sh.count_error(e);
            // The path refused it: try again a little later, at the rate.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    sh.beat();
    s.finish()?;
    Ok(s.fast
        .as_ref()
        .map(|f| {
            f.stats()
                .fallbacks
                .iter()
                .map(|f| f.reason.clone())
                .collect()
        })
        .unwrap_or_default())
}
