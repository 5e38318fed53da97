//! Zerocopy sends (`MSG_ZEROCOPY`) with a safe buffer lifetime.

use crate::error::{Error, FallbackEvent, Feature};
use crate::socket::{Socket, Transmit};
use crate::sys;
use crate::wire::cmsg::CmsgBuf;
use crate::wire::consts::{SOL_SOCKET, SO_ZEROCOPY};
use crate::wire::zerocopy::{parse_errqueue, CompletionTracker, ErrQueueMsg};
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How the sender sends now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroCopyMode {
    /// `MSG_ZEROCOPY`: the kernel sends from the caller's buffer.
    Zerocopy,
    /// Plain sends that copy (after an adaptive fallback).
    Copy,
}

/// Counters of a [`ZeroCopySender`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZeroCopyStats {
    /// Send calls made.
    pub sends: u64,
    /// Of which with `MSG_ZEROCOPY`.
    pub zerocopy_sends: u64,
    /// Zerocopy sends whose completion arrived.
    pub completions: u64,
    /// Of which the kernel copied anyway (`SO_EE_CODE_ZEROCOPY_COPIED`).
    pub copied: u64,
    /// Times `ENOBUFS` (optmem exhausted) made the sender reap and retry.
    pub enobufs_retries: u64,
    /// Why the sender switched to copying, if it did.
    pub fallback: Option<FallbackEvent>,
}

/// Window of completions the adaptive check looks at.
const ADAPT_WINDOW: u64 = 64;

/// Sends buffers with `MSG_ZEROCOPY` (and GSO), and owns each buffer until
/// the kernel reports it done: [`ZeroCopySender::send`] takes the buffer,
/// [`ZeroCopySender::pop_done`] hands it back only after its completion
/// arrived, so it can be neither reused nor freed while the kernel may still
/// read it.
///
/// Adaptive by default: when the kernel keeps copying (as it does for any
/// delivery to a local socket, or a device without scatter-gather), pinning
/// pages costs more than it saves, so after 64 completions of which at
/// least 60 were copies the sender switches to plain copying sends and
/// records why in [`ZeroCopyStats::fallback`].
#[derive(Debug)]
pub struct ZeroCopySender<'s> {
    socket: &'s Socket,
    /// `None` marks a completion id a failed send may have used.
    tracker: CompletionTracker<Option<Vec<u8>>>,
    ready: std::collections::VecDeque<Vec<u8>>,
    mode: ZeroCopyMode,
    adaptive: bool,
    stats: ZeroCopyStats,
    window: (u64, u64),
    control: CmsgBuf,
}

impl<'s> ZeroCopySender<'s> {
    /// Turns `SO_ZEROCOPY` on for `socket`. Fails when the kernel does not
    /// support it (or `FASTUDP_DISABLE` has `zerocopy`).
    pub fn new(socket: &'s Socket) -> Result<Self, Error> {
        if socket.capabilities().disabled.zerocopy {
            return Err(Error::Config(
                "zerocopy is switched off (FASTUDP_DISABLE)".into(),
            ));
        }
        sys::setsockopt_int(socket.as_raw_fd(), SOL_SOCKET, SO_ZEROCOPY, 1).map_err(|e| {
            Error::Setup {
                what: "SO_ZEROCOPY",
                source: e,
            }
        })?;
        Ok(ZeroCopySender {
            socket,
            tracker: CompletionTracker::new(),
            ready: Default::default(),
            mode: ZeroCopyMode::Zerocopy,
            adaptive: true,
            stats: ZeroCopyStats::default(),
            window: (0, 0),
            control: CmsgBuf::default(),
        })
    }

    /// Switches the adaptive fallback on (default) or off.
    pub fn adaptive(mut self, on: bool) -> Self {
        self.adaptive = on;
        self
    }

    /// The current mode.
    pub fn mode(&self) -> ZeroCopyMode {
        self.mode
    }

    /// Counters so far.
    pub fn stats(&self) -> ZeroCopyStats {
        self.stats.clone()
    }

    /// Buffers the kernel may still read.
    pub fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// Sends `buf` to `dest`, as a GSO train when `segment_size` is smaller
    /// than it. The sender keeps the buffer until its completion.
    ///
    /// On error the buffer comes back with it, unsent. `ENOBUFS` (too many
    /// zerocopy sends outstanding for `net.core.optmem_max`) is handled
    /// here: the sender waits for completions and retries, for up to a
    /// second.
    pub fn send(
        &mut self,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        let t = Transmit {
            segment_size,
            ..Transmit::new(dest, &buf)
        };
        if let Err(e) = self.socket.validate(0, &t) {
            return Err((e, buf));
        }
        // A train the socket cannot send with GSO (switched off, or off
        // after a fallback) goes through the socket's own split path, which
        // copies.
        if self.mode == ZeroCopyMode::Copy
            || (t.segments() > 1 && self.socket.max_gso_segments() <= 1)
        {
            return self.send_copy(dest, buf, segment_size);
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.socket.send_one_flags(&t, sys::MSG_ZEROCOPY) {
                Ok(_) => {
                    self.stats.sends += 1;
                    self.stats.zerocopy_sends += 1;
                    self.tracker.push(Some(buf));
                    return Ok(());
                }
                // ENOBUFS (optmem) and EAGAIN come before the kernel takes a
                // completion id.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && Instant::now() < deadline => {
                    self.stats.enobufs_retries += 1;
                    if self.tracker.in_flight() == 0 {
                        // Nothing of ours to wait for: the memory is held elsewhere.
                        std::thread::sleep(Duration::from_millis(1));
                    } else if let Err(e) = self.wait(Duration::from_millis(10)) {
                        return Err((e, buf));
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    return Err((Error::Io(e), buf));
                }
                Err(e) => {
                    // The kernel may have built the packet, and so used up a
                    // completion id, before it failed (errors from
                    // udp_send_skb do). Count the id as used: if it was not,
                    // later buffers come back one completion late, never
                    // early.
                    self.tracker.push(None);
                    let refused = matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL));
                    if refused && t.segments() > 1 {
                        // The path refused GSO: the socket's own send falls
                        // back (and records why).
                        return self.send_copy(dest, buf, segment_size);
                    }
                    return Err((Error::Io(e), buf));
                }
            }
        }
    }

    /// A plain, copying send: the buffer is free as soon as it returns.
    fn send_copy(
        &mut self,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        let r = self.socket.send(&[Transmit {
            segment_size,
            ..Transmit::new(dest, &buf)
        }]);
        match r {
            Ok(_) => {
                self.stats.sends += 1;
                self.ready.push_back(buf);
                Ok(())
            }
            Err(e) => Err((e, buf)),
        }
    }

    /// Reads every completion queued now, without waiting. Returns how many
    /// sends completed.
    pub fn reap(&mut self) -> Result<usize, Error> {
        let mut n = 0;
        while let Some(len) =
            sys::recv_errqueue(self.socket.as_std(), &mut self.control).map_err(Error::Io)?
        {
            let msgs = parse_errqueue(&self.control.0[..len.min(self.control.0.len())])
                .map_err(Error::Control)?;
            for m in msgs {
                if let ErrQueueMsg::Zerocopy { lo, hi, copied } = m {
                    let k = self.tracker.complete(lo, hi) as u64;
                    n += k as usize;
                    self.stats.completions += k;
                    self.window.0 += k;
                    if copied {
                        self.stats.copied += k;
                        self.window.1 += k;
                    }
                }
            }
        }
        while let Some(b) = self.tracker.pop_done() {
            self.ready.extend(b);
        }
        self.adapt();
        Ok(n)
    }

    fn adapt(&mut self) {
        if self.window.0 < ADAPT_WINDOW {
            return;
        }
        let (total, copied) = self.window;
        self.window = (0, 0);
        if self.adaptive && self.mode == ZeroCopyMode::Zerocopy && copied * 16 >= total * 15 {
            self.mode = ZeroCopyMode::Copy;
            self.stats.fallback = Some(FallbackEvent {
                feature: Feature::Zerocopy,
                errno: None,
                reason: format!(
                    "the kernel copied {copied} of the last {total} zerocopy sends (local delivery or a device without scatter-gather); sending with plain copies"
                ),
            });
        }
    }

    /// Waits up to `timeout` for completions, then reaps them.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, Error> {
        if self.tracker.in_flight() == 0 {
            return Ok(0);
        }
        sys::poll(self.socket.as_raw_fd(), sys::POLLERR, timeout).map_err(Error::Io)?;
        self.reap()
    }

    /// Takes back a buffer whose send completed (oldest first).
    pub fn pop_done(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    /// Waits until every buffer in flight completed, up to `timeout`;
    /// returns how many are still in flight.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize, Error> {
        let deadline = Instant::now() + timeout;
        while self.tracker.in_flight() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.wait(left.min(Duration::from_millis(50)))?;
        }
        Ok(self.tracker.in_flight())
    }
}

impl From<crate::wire::cmsg::CmsgError> for io::Error {
    fn from(e: crate::wire::cmsg::CmsgError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
    }
}
