//! The soak's receiver: one receive strategy per slot, every datagram
//! checked and entered in the slot's ledger, restarted on request.

use super::account::{check, Arrival, Ledger};
use super::Shared;
use crate::engine::rx::{self, RxSock};
use crate::engine::RxStrategy;
use anyhow::{anyhow, bail, Context};
use fastudp_io::RecvBatch;
use fastudp_io::UdpIo;
use std::io;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

/// The receive strategies the soak cycles through.
pub const STRATEGIES: [RxStrategy; 5] = [
    RxStrategy::Recvmmsg,
    RxStrategy::Recvfrom,
    RxStrategy::Gro,
    RxStrategy::GroRecvmmsg,
    RxStrategy::UringGro,
];

/// The receive buffer while squeezed (the kernel doubles it).
const SQUEEZED: i32 = 4096;
/// How long the reader stalls when its buffer is squeezed, so that it
/// overflows.
const SQUEEZE_STALL: Duration = Duration::from_millis(100);

/// How long the receiver stays away when restarted.
pub const RESTART_GAP: Duration = Duration::from_millis(300);

/// After the sender stopped: how long to wait for the rest before what is
/// missing is lost.
const DRAIN: Duration = Duration::from_secs(2);

/// What one slot's receiver saw.
#[derive(Debug, Default)]
pub struct RxResult {
    /// Datagrams that failed their check (length or checksum).
    pub damaged: u64,
    /// Drops the kernel counted on the receiving sockets (messages).
    pub kernel_drops: u64,
    /// Messages cut short by a small buffer.
    pub truncated: u64,
    /// Times the socket was closed and bound again.
    pub restarts: u64,
    /// Datagrams the receiver's namespace dropped for a full receive
    /// buffer while this slot ran (`RcvbufErrors`).
    pub rcvbuf_errors: u64,
    /// Times the receive buffer was squeezed.
    pub squeezes: u64,
    /// Reads that returned data on the current socket.
    received_here: u64,
}

/// The receiving socket's buffer (forced past `rmem_max`: the soak runs
/// as root): 64 MiB holds over a second of the soak's traffic, so that a
/// receiver the scheduler holds up on a busy host catches up instead of
/// losing datagrams.
pub const RCVBUF: usize = 64 << 20;

fn fd(s: &RxSock) -> &std::net::UdpSocket {
    match s {
        RxSock::Std(u) => u,
        RxSock::Fast(f) => f.as_std(),
    }
}

/// Binds the receiving socket for strategy `r` (a runtime error if it
/// cannot).
fn bind(r: RxStrategy, addr: std::net::SocketAddr) -> anyhow::Result<RxSock> {
    // A restart may find the port still held for a moment: retry briefly.
    let mut tries = 1;
    let s = loop {
        match rx::bind(r, addr) {
            Ok(s) => break s,
            Err(e) if tries == 50 => return Err(e),
            Err(_) => tries += 1,
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    fastudp_tools::raw::set_option_int(
        fd(&s),
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        RCVBUF as i32,
    )
    .map_err(|e| anyhow!("SO_RCVBUFFORCE: {e}"))?;
    if addr.is_ipv6() {
        // The GSO-refusal fault sends without UDP checksums
        // (`UDP_NO_CHECK6_TX`), which an IPv6 receiver drops unless told
        // to take them: the datagrams still carry the soak's own checksum.
        fastudp_tools::raw::set_option_int(
            fd(&s),
            fastudp_tools::wire::consts::SOL_UDP,
            libc::UDP_NO_CHECK6_RX,
            1,
        )
        .map_err(|e| anyhow!("UDP_NO_CHECK6_RX: {e}"))?;
    }
    Ok(s)
}

/// The receive-buffer overflows of the calling thread's namespace, IPv4
/// and IPv6 (`RcvbufErrors` of `/proc/thread-self/net/snmp` plus
/// `Udp6RcvbufErrors` of `snmp6`: IPv6 drops are counted only there).
fn rcvbuf_errors() -> u64 {
    let v4 = std::fs::read_to_string("/proc/thread-self/net/snmp")
        .map(|s| {
            crate::procfs::parse_snmp(&s, "Udp:")
                .get("RcvbufErrors")
                .copied()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    let v6 = std::fs::read_to_string("/proc/thread-self/net/snmp6")
        .map(|s| snmp6(&s, "Udp6RcvbufErrors"))
        .unwrap_or(0);
    v4 + v6
}

/// One counter of `/proc/net/snmp6` (lines of a name and a value).
fn snmp6(s: &str, name: &str) -> u64 {
    s.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(name)).then(|| it.next()?.parse().ok())?
        })
        .unwrap_or(0)
}

fn counters(r: RxStrategy, s: &RxSock, out: &mut RxResult) -> anyhow::Result<()> {
    if let RxSock::Fast(f) = s {
        let st = f.stats();
        out.kernel_drops += st.kernel_drops;
        out.truncated += st.truncated;
        // An io_uring strategy that fell back to syscalls must not pass
        // for io_uring.
        if out.received_here > 0 {
            crate::engine::uring::check_rx(r, f).with_context(|| crate::engine::rname(r))?;
        }
    }
    out.received_here = 0;
    Ok(())
}

/// Squeezes the receive buffer (and stalls once, so that it overflows),
/// or restores it.
fn set_squeezed(sock: &RxSock, squeeze: bool, out: &mut RxResult) -> anyhow::Result<()> {
    let (opt, size) = if squeeze {
        (libc::SO_RCVBUF, SQUEEZED)
    } else {
        (libc::SO_RCVBUFFORCE, RCVBUF as i32)
    };
    fastudp_tools::raw::set_option_int(fd(sock), libc::SOL_SOCKET, opt, size)
        .map_err(|e| anyhow!("receive buffer to {size}: {e}"))?;
    if squeeze {
        out.squeezes += 1;
        std::thread::sleep(SQUEEZE_STALL);
    }
    Ok(())
}

/// One read with strategy `r`; `see` takes each datagram.
fn read(
    r: RxStrategy,
    sock: &mut RxSock,
    batch: &mut RecvBatch,
    buf: &mut [u8],
    see: &mut impl FnMut(&[u8]),
) -> io::Result<()> {
    match sock {
        RxSock::Std(s) => s.recv_from(buf).map(|(n, _)| see(&buf[..n])),
        // Read in place in the ring's buffers (a borrowed receive).
        RxSock::Fast(s) if r == RxStrategy::UringGro => s
            .recv_borrowed(batch)
            .map(|view| {
                for (_, dg) in view.datagrams() {
                    see(dg);
                }
            })
            .map_err(io::Error::from),
        RxSock::Fast(s) => match s.recv(batch) {
            Ok(_) => {
                for (_, dg) in batch.datagrams() {
                    see(dg);
                }
                Ok(())
            }
            Err(e) => Err(io::Error::from(e)),
        },
    }
}

/// Receives with strategy `r` into `ledger` until the sender has stopped
/// and everything it sent arrived (or [`DRAIN`] passed); the caller's
/// thread is in the receiver's namespace. `ready` is set once bound.
/// Every error is a runtime error: the slot's receiver broke off.
pub fn run(
    r: RxStrategy,
    addr: std::net::SocketAddr,
    payload: usize,
    ledger: &mut Ledger,
    sh: &Shared,
) -> anyhow::Result<RxResult> {
    let mut out = RxResult::default();
    let overflows0 = rcvbuf_errors();
    let mut sock = bind(r, addr)?;
    let mut squeezed = false;
    sh.rx_ready.store(true, Release);
    let mut batch = match r {
        RxStrategy::Recvmmsg => RecvBatch::with_capacity(32, payload)?,
        _ => RecvBatch::new(32),
    };
    let mut buf = vec![0u8; 65_536];
    let mut drained_since: Option<Instant> = None;
    loop {
        sh.rx_beat();
        if sh.restart_rx.load(Acquire) {
            counters(r, &sock, &mut out)?;
            drop(sock);
            std::thread::sleep(RESTART_GAP);
            sock = bind(r, addr)?;
            out.restarts += 1;
            sh.restart_rx.store(false, Release);
        }
        let squeeze = sh.squeeze_rx.load(Acquire);
        if squeeze != squeezed {
            set_squeezed(&sock, squeeze, &mut out)?;
            squeezed = squeeze;
        }
        let mut see = |d: &[u8]| match check(d, payload) {
            Some(seq) => {
                if ledger.arrive(seq) == Arrival::New && seq >= sh.resume_after.load(Relaxed) {
                    let _ = sh
                        .resumed_ns
                        .compare_exchange(0, sh.now_ns(), AcqRel, Relaxed);
                }
            }
            None => out.damaged += 1,
        };
        match read(r, &mut sock, &mut batch, &mut buf, &mut see) {
            Ok(()) => out.received_here += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => bail!("{} receive failed: {e}", crate::engine::rname(r)),
        }
        if sh.sender_done.load(Acquire) {
            let end = sh.next_seq.load(Acquire);
            if ledger.complete(end) {
                break;
            }
            let since = *drained_since.get_or_insert_with(Instant::now);
            if since.elapsed() > DRAIN {
                break;
            }
        }
    }
    counters(r, &sock, &mut out)?;
    out.rcvbuf_errors = rcvbuf_errors().saturating_sub(overflows0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_snmp6_counter_is_read_by_its_name() {
        let s = "Udp6InDatagrams                 \t120\nUdp6RcvbufErrors                \t42\nUdplite6RcvbufErrors\t7\n";
        assert_eq!(snmp6(s, "Udp6RcvbufErrors"), 42);
        assert_eq!(snmp6(s, "Udp6InDatagrams"), 120);
        assert_eq!(snmp6(s, "Udp6NoPorts"), 0);
    }
}
