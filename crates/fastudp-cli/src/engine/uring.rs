//! The io_uring strategies (`uring-gso`, `uring-zc`, `uring-gro`): the
//! library's io_uring backend, set up and checked here so that the shared
//! send and receive loops stay as they are.

use super::{RxStrategy, TxStrategy};
use anyhow::bail;
use fastudp_io::uring::UringZeroCopySender;
use fastudp_io::UdpIo;
use fastudp_io::{Config, Error, SendMeta, Socket, ZeroCopySender, ZeroCopyStats};
use std::net::SocketAddr;
use std::time::Duration;

/// The io_uring strategies.
fn is_uring(t: TxStrategy, r: RxStrategy) -> bool {
    matches!(
        t,
        TxStrategy::UringGso | TxStrategy::UringZc | TxStrategy::UringZcFixed
    ) || r == RxStrategy::UringGro
}

/// The default plan (every strategy, `all`) without its io_uring pairings
/// where io_uring is not available, saying so: a host without io_uring
/// still compares everything else. Strategies named on the command line
/// run, and fail with the reason.
pub fn unless_unavailable(
    pairs: Vec<(TxStrategy, RxStrategy)>,
    all: bool,
) -> Vec<(TxStrategy, RxStrategy)> {
    let why = fastudp_io::uring::probe().why_not();
    match why {
        Some(why) if all => {
            eprintln!("fastudp: note: the io_uring strategies are left out: {why}");
            pairs
                .into_iter()
                .filter(|&(t, r)| !is_uring(t, r))
                .collect()
        }
        _ => pairs,
    }
}

/// The socket options of a library send strategy: `uring-gso` sends its
/// batches unlinked (the bench counts any loss by sequence number).
pub fn config(t: TxStrategy) -> Config {
    let ring = t == TxStrategy::UringGso;
    Config::default().uring(ring).uring_unlinked_sends(ring)
}

/// Why a strategy's socket did not run on the ring, if it was meant to:
/// a strategy that fell back to syscalls must not be reported as io_uring.
/// Found after the run: a runtime failure.
fn fell_back(
    want: bool,
    s: &Socket,
    active: impl Fn(&fastudp_io::uring::UringStats) -> bool,
) -> anyhow::Result<()> {
    if !want {
        return Ok(());
    }
    match s.state().uring_stats() {
        Some(u) if active(&u) => Ok(()),
        _ => bail!(
            "io_uring was not used: {}",
            s.stats()
                .fallbacks
                .iter()
                .map(|f| f.reason.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// Checks that `uring-gso` really sent through the ring.
pub fn check_tx(t: TxStrategy, s: &Socket) -> anyhow::Result<()> {
    fell_back(t == TxStrategy::UringGso, s, |u| {
        u.send_active && u.send_sqes > 0
    })
}

/// Checks that `uring-gro` really received through the ring.
pub fn check_rx(r: RxStrategy, s: &Socket) -> anyhow::Result<()> {
    fell_back(r == RxStrategy::UringGro, s, |u| {
        u.recv_active && u.recv_messages > 0
    })
}

/// What the zerocopy send loop needs of a sender.
pub trait ZcSender {
    /// Sends `buf`, kept until the kernel is done with it.
    fn send(
        &mut self,
        sock: &Socket,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)>;
    /// A buffer the kernel is done with.
    fn pop_done(&mut self) -> Option<Vec<u8>>;
    /// Waits up to `t` for completions.
    fn wait(&mut self, sock: &Socket, t: Duration) -> Result<usize, Error>;
    /// Reads completions queued now.
    fn reap(&mut self, sock: &Socket) -> Result<usize, Error>;
    /// Waits for every buffer, up to `t`; returns how many are still out.
    fn drain(&mut self, sock: &Socket, t: Duration) -> Result<usize, Error>;
    /// Counters.
    fn stats(&self) -> ZeroCopyStats;
}

impl ZcSender for ZeroCopySender {
    fn send(
        &mut self,
        s: &Socket,
        d: SocketAddr,
        b: Vec<u8>,
        g: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        ZeroCopySender::send(self, s, d, b, g, SendMeta::default())
    }
    fn pop_done(&mut self) -> Option<Vec<u8>> {
        ZeroCopySender::pop_done(self)
    }
    fn wait(&mut self, s: &Socket, t: Duration) -> Result<usize, Error> {
        ZeroCopySender::wait(self, s, t)
    }
    fn reap(&mut self, s: &Socket) -> Result<usize, Error> {
        ZeroCopySender::reap(self, s)
    }
    fn drain(&mut self, s: &Socket, t: Duration) -> Result<usize, Error> {
        ZeroCopySender::drain(self, s, t)
    }
    fn stats(&self) -> ZeroCopyStats {
        ZeroCopySender::stats(self)
    }
}

impl ZcSender for UringZeroCopySender {
    fn send(
        &mut self,
        s: &Socket,
        d: SocketAddr,
        b: Vec<u8>,
        g: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        UringZeroCopySender::send(self, s, d, b, g)
    }
    fn pop_done(&mut self) -> Option<Vec<u8>> {
        UringZeroCopySender::pop_done(self)
    }
    fn wait(&mut self, _: &Socket, t: Duration) -> Result<usize, Error> {
        UringZeroCopySender::wait(self, t)
    }
    fn reap(&mut self, _: &Socket) -> Result<usize, Error> {
        Ok(UringZeroCopySender::reap(self))
    }
    fn drain(&mut self, _: &Socket, t: Duration) -> Result<usize, Error> {
        UringZeroCopySender::drain(self, t)
    }
    fn stats(&self) -> ZeroCopyStats {
        UringZeroCopySender::stats(self)
    }
}

/// The zerocopy sender of `gso-zerocopy` (MSG_ZEROCOPY, not adaptive: this
/// measures zerocopy itself) or `uring-zc` (SENDMSG_ZC). A kernel without
/// it is a usage error: a strategy this host cannot run, found before the
/// run.
pub fn zc_sender(t: TxStrategy, sock: &Socket) -> anyhow::Result<Box<dyn ZcSender>> {
    let name = super::name(t);
    let na = |e: Error| usage!("{name} is not available here: {e}");
    Ok(if t == TxStrategy::UringZc {
        Box::new(UringZeroCopySender::new(sock).map_err(na)?)
    } else {
        Box::new(ZeroCopySender::new(sock).map_err(na)?.adaptive(false))
    })
}
