//! The error queue: ICMP errors, txtime drops and zerocopy completions, as
//! typed [`SocketError`]s.
//!
//! With `IP_RECVERR`, the kernel also sets the socket's pending error for
//! every ICMP error, and the next send or receive fails with it, even on an
//! unconnected socket where it is about another peer; and queued errors
//! count against the receive buffer. So fastudp reads the queue whenever
//! that happens, keeps what it read here (up to 256 messages, in order),
//! and retries the call on an unconnected socket.

use super::state::UdpState;
use crate::error::Error;
use crate::sys::{self, AddrBuf};
use crate::wire::cmsg::CmsgBuf;
use crate::wire::errqueue::{self, SocketError};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};

/// Error-queue messages fastudp read on the caller's behalf.
#[derive(Debug)]
pub(crate) struct ErrorRing {
    queue: VecDeque<SocketError>,
    lost: u64,
}

/// Messages kept before the oldest is dropped (and counted).
const RING: usize = 256;

impl Default for ErrorRing {
    fn default() -> Self {
        ErrorRing {
            queue: VecDeque::with_capacity(RING),
            lost: 0,
        }
    }
}

impl ErrorRing {
    /// Keeps `e`, dropping the oldest message when full.
    pub fn push(&mut self, e: SocketError) {
        if self.queue.len() >= RING {
            self.queue.pop_front();
            self.lost += 1;
        }
        self.queue.push_back(e);
    }

    /// Messages dropped because the ring was full.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

impl UdpState {
    /// The next message from the socket's error queue, without waiting:
    /// those fastudp already read on the caller's behalf first, then the
    /// kernel's. `None` when both are empty.
    ///
    /// Port and host unreachable come with the destination that refused;
    /// "fragmentation needed" and "packet too big" with the MTU;
    /// `SCM_TXTIME` drops with their departure time; zerocopy completions
    /// as ranges. A [`crate::ZeroCopySender`] on this socket keeps its own
    /// completions and leaves every other message here.
    pub fn recv_error(&self, sock: impl AsFd) -> Result<Option<SocketError>, Error> {
        if let Some(e) = self.pop_queued() {
            return Ok(Some(e));
        }
        self.read_kernel_error(sock.as_fd())
    }

    /// Takes the oldest message fastudp read on the caller's behalf.
    pub(crate) fn pop_queued(&self) -> Option<SocketError> {
        self.errors.lock().ok()?.queue.pop_front()
    }

    /// How many messages fastudp holds.
    pub(crate) fn queued_errors(&self) -> usize {
        self.errors.lock().map(|r| r.queue.len()).unwrap_or(0)
    }

    /// Puts a message back at the end of fastudp's queue.
    pub(crate) fn requeue_error(&self, e: SocketError) {
        if let Ok(mut r) = self.errors.lock() {
            r.push(e);
        }
    }

    /// Reads one message from the kernel's error queue.
    pub(crate) fn read_kernel_error(
        &self,
        fd: BorrowedFd<'_>,
    ) -> Result<Option<SocketError>, Error> {
        let mut cb = CmsgBuf::default();
        let mut name = AddrBuf::default();
        loop {
            let Some((len, dest)) = sys::recv_errqueue(fd, &mut cb, &mut name)? else {
                return Ok(None);
            };
            // A message without an extended error (none is known) is skipped.
            // Control data the kernel wrote that does not parse.
            let parsed = errqueue::parse(&cb.0[..len.min(cb.0.len())], dest).map_err(|e| {
                Error::from(crate::error::Detail::Control(io::Error::new(
                    io::ErrorKind::InvalidData,
                    e,
                )))
            })?;
            if let Some(e) = parsed {
                return Ok(Some(e));
            }
        }
    }

    /// Reads the kernel's whole error queue into fastudp's; returns how
    /// many of the messages were ICMP errors.
    pub(crate) fn drain_errors(&self, fd: BorrowedFd<'_>) -> usize {
        let mut icmp = 0;
        // Bounded: a flood of ICMP must not keep a send here for ever.
        for _ in 0..RING {
            match self.read_kernel_error(fd) {
                Ok(Some(e)) => {
                    icmp += usize::from(e.is_icmp());
                    self.requeue_error(e);
                }
                _ => break,
            }
        }
        icmp
    }
}
