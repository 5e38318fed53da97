//! The receive strategies.

use super::{Live, RxOutcome, RxStrategy, Workload};
use anyhow::{anyhow, Context};
use fastudp_io::UdpIo;
use fastudp_io::{Config, Feature, RecvBatch};
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

/// Receive buffer requested for every UDP receiver.
pub const RCVBUF: usize = 8 << 20;

/// A bound receiving socket.
pub enum RxSock {
    /// Plain socket for `recvfrom`.
    Std(UdpSocket),
    /// fastudp socket for the batched strategies.
    Fast(Box<fastudp_io::Socket>),
}

impl RxSock {
    /// The address the socket is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            RxSock::Std(s) => s.local_addr(),
            RxSock::Fast(s) => s.as_std().local_addr(),
        }
    }
}

/// Binds a batched receiver at `addr` (`recvmmsg`, with GRO if `gro`):
/// its strategy and its fastudp socket.
pub fn bind_batched(
    gro: bool,
    addr: SocketAddr,
) -> anyhow::Result<(RxStrategy, fastudp_io::Socket)> {
    let r = if gro {
        RxStrategy::GroRecvmmsg
    } else {
        RxStrategy::Recvmmsg
    };
    match bind(r, addr)? {
        RxSock::Fast(s) => Ok((r, *s)),
        RxSock::Std(_) => unreachable!("batched strategies use fastudp sockets"),
    }
}

/// Binds the receiver for strategy `r` at `addr`. A socket that cannot be
/// bound is a runtime failure; a kernel without GRO, when GRO was asked
/// for, a usage error.
pub fn bind(r: RxStrategy, addr: SocketAddr) -> anyhow::Result<RxSock> {
    let s = match r {
        RxStrategy::Recvfrom => {
            let s = UdpSocket::bind(addr).with_context(|| format!("bind receiver {addr}"))?;
            let _ = socket2::SockRef::from(&s).set_recv_buffer_size(RCVBUF);
            RxSock::Std(s)
        }
        _ => {
            let gro = matches!(
                r,
                RxStrategy::Gro | RxStrategy::GroRecvmmsg | RxStrategy::UringGro
            );
            let c = Config::default()
                .gro(gro)
                .disable((r == RxStrategy::Gro).then_some(Feature::Mmsg))
                .recv_buffer(RCVBUF)
                .uring(r == RxStrategy::UringGro);
            let s = fastudp_io::Socket::bind(addr, c).map_err(|e| anyhow!("{e}"))?;
            if gro && !s.capabilities().supports(Feature::Gro) {
                bail_usage!("this kernel has no UDP GRO (needs Linux 5.0)");
            }
            RxSock::Fast(Box::new(s))
        }
    };
    let timeout = Some(Duration::from_millis(100));
    match &s {
        RxSock::Std(u) => u.set_read_timeout(timeout),
        RxSock::Fast(f) => f.as_std().set_read_timeout(timeout),
    }
    .context("the receiver's read timeout")?;
    Ok(s)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Receives until the sender is done and the queue is drained.
pub fn udp(
    r: RxStrategy,
    mut sock: RxSock,
    w: &Workload,
    live: &Live,
) -> anyhow::Result<RxOutcome> {
    let (mut dgrams, mut bytes, mut calls) = (0u64, 0u64, 0u64);
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    let hard_stop = Instant::now() + w.duration + Duration::from_secs(10);
    let mut batch = match r {
        RxStrategy::Recvmmsg => RecvBatch::with_capacity(w.batch, w.payload.max(1))?,
        _ => RecvBatch::new(w.batch),
    };
    let mut buf = vec![0u8; 65_536];
    let mut drops = 0;
    let mut seq = super::seq::Verifier::default();
    loop {
        let got: io::Result<(u64, u64)> = match &mut sock {
            RxSock::Std(s) => s.recv_from(&mut buf).map(|(n, from)| {
                seq.datagram(from, &buf[..n]);
                (1, n as u64)
            }),
            // Read in place in the ring's buffers (a borrowed receive).
            RxSock::Fast(s) if r == RxStrategy::UringGro => s
                .recv_borrowed(&mut batch)
                .map(|view| {
                    view.datagrams().fold((0, 0), |(d, b), (m, dg)| {
                        seq.datagram(m.source, dg);
                        (d + 1, b + dg.len() as u64)
                    })
                })
                .map_err(io::Error::from),
            // Every datagram is looked at, as an application would.
            RxSock::Fast(s) => match s.recv(&mut batch) {
                Ok(_) => Ok(batch.datagrams().fold((0, 0), |(d, b), (m, dg)| {
                    seq.datagram(m.source, dg);
                    (d + 1, b + dg.len() as u64)
                })),
                Err(e) => Err(io::Error::from(e)),
            },
        };
        match got {
            Ok((d, b)) => {
                calls += 1;
                dgrams += d;
                bytes += b;
                live.rx_datagrams.store(dgrams, Relaxed);
                live.rx_bytes.store(bytes, Relaxed);
                live.rx_calls.store(calls, Relaxed);
            }
            Err(e) if timed_out(&e) => {
                if live.sender_done.load(Acquire) {
                    break;
                }
            }
            Err(e) => {
                let what = format!("{} receive failed", super::rname(r));
                return Err(anyhow::Error::new(e).context(what));
            }
        }
        if Instant::now() > hard_stop {
            break;
        }
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    if let RxSock::Fast(s) = &sock {
        let st = s.stats();
        drops = st.kernel_drops;
        super::uring::check_rx(r, s)?;
        if st.truncated > 0 {
            eprintln!("fastudp: warning: {} messages were truncated", st.truncated);
        }
    }
    let t = seq.totals();
    Ok(RxOutcome {
        unique: t.received,
        unsequenced: t.unsequenced,
        datagrams: dgrams,
        bytes,
        calls,
        cpu,
        kernel_drops: drops,
    })
}

/// Accepts one TCP connection and reads it to the end.
pub fn tcp(l: TcpListener, w: &Workload, live: &Live) -> anyhow::Result<RxOutcome> {
    let (mut s, _) = l.accept().context("TCP accept")?;
    s.set_read_timeout(Some(w.duration + Duration::from_secs(10)))
        .context("the TCP receiver's read timeout")?;
    let mut buf = vec![0u8; 256 * 1024];
    let (mut bytes, mut calls) = (0u64, 0u64);
    let cpu0 = fastudp_tools::os::thread_cpu_time();
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                bytes += n as u64;
                calls += 1;
                live.rx_bytes.store(bytes, Relaxed);
                live.rx_datagrams.store(bytes / w.payload as u64, Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(anyhow::Error::new(e).context("TCP receive failed")),
        }
    }
    let cpu = fastudp_tools::os::thread_cpu_time().saturating_sub(cpu0);
    Ok(RxOutcome {
        datagrams: bytes / w.payload as u64,
        unique: 0,
        unsequenced: 0,
        bytes,
        calls,
        cpu,
        kernel_drops: 0,
    })
}
