//! Zerocopy sends (`MSG_ZEROCOPY`) with a safe buffer lifetime.

use crate::error::{ConfigError, Error, FallbackEvent, Feature};
use crate::socket::errqueue::SocketError;
use crate::socket::{Transmit, UdpIo};
use crate::sys;
use crate::wire::consts::{SOL_SOCKET, SO_ZEROCOPY};
use crate::wire::control::EcnCodepoint;
use crate::wire::errqueue::SocketError as Detail;
use crate::wire::zerocopy::CompletionTracker;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How the sender sends now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZeroCopyMode {
    /// `MSG_ZEROCOPY`: the kernel sends from the caller's buffer.
    Zerocopy,
    /// Plain sends that copy (after an adaptive fallback).
    Copy,
}

/// Counters of a [`ZeroCopySender`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Datagrams of sends the local queue dropped (`ENOBUFS` after the
    /// kernel built the packet): the send counts as done, as in
    /// [`crate::UdpIo::send`], and the buffer comes back when its
    /// completion does. Also in [`crate::Stats::dropped_locally`].
    pub dropped_locally: u64,
    /// Why the sender switched to copying, if it did.
    pub fallback: Option<FallbackEvent>,
}

/// What a zerocopy send carries besides its destination, payload and
/// segment size: what becomes control messages, as on a [`Transmit`].
/// `SendMeta::default()` carries none of it; the setters add it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendMeta {
    pub(crate) ecn: Option<EcnCodepoint>,
    pub(crate) src_ip: Option<IpAddr>,
    pub(crate) txtime: Option<u64>,
}

impl SendMeta {
    /// With an ECN codepoint on every datagram ([`Transmit::with_ecn`]).
    pub fn with_ecn(self, ecn: Option<EcnCodepoint>) -> Self {
        SendMeta { ecn, ..self }
    }

    /// Sent from `src_ip` ([`Transmit::with_src_ip`]).
    pub fn with_src_ip(self, src_ip: Option<IpAddr>) -> Self {
        SendMeta { src_ip, ..self }
    }

    /// Leaving no earlier than `txtime` ([`Transmit::with_txtime`]).
    pub fn with_txtime(self, txtime: Option<u64>) -> Self {
        SendMeta { txtime, ..self }
    }
}

/// What a zerocopy send does after an error.
enum After {
    /// The local queue dropped it: done.
    Dropped,
    /// Send it again.
    Retry,
    /// Send it with a plain, copying send.
    Copy,
    /// Give the buffer back with this error.
    Fail(Error),
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
///
/// It holds no socket: each call takes one ([`UdpIo`]), always the same,
/// so it can live next to its socket. After warm-up its sends and reaps
/// allocate nothing. Error-queue messages that are not its completions
/// (ICMP errors, say) stay in the socket's queue for
/// [`crate::UdpIo::recv_error`].
#[derive(Debug)]
pub struct ZeroCopySender {
    /// `None` marks a completion id a failed send may have used.
    tracker: CompletionTracker<Option<Vec<u8>>>,
    ready: std::collections::VecDeque<Vec<u8>>,
    mode: ZeroCopyMode,
    adaptive: bool,
    stats: ZeroCopyStats,
    window: (u64, u64),
}

impl ZeroCopySender {
    /// Turns `SO_ZEROCOPY` on for `sock`. Fails when the kernel does not
    /// support it (or `Config::disable` has `Feature::Zerocopy`).
    pub fn new(sock: &impl UdpIo) -> Result<Self, Error> {
        if sock.state().capabilities().is_disabled(Feature::Zerocopy) {
            return Err(ConfigError::SwitchedOff(Feature::Zerocopy).into());
        }
        sys::setsockopt_int(sock.fd().as_raw_fd(), SOL_SOCKET, SO_ZEROCOPY, 1).map_err(|e| {
            Error::from(crate::error::Detail::Setup {
                what: "SO_ZEROCOPY",
                source: e,
            })
        })?;
        Ok(ZeroCopySender {
            tracker: CompletionTracker::new(),
            ready: Default::default(),
            mode: ZeroCopyMode::Zerocopy,
            adaptive: true,
            stats: ZeroCopyStats::default(),
            window: (0, 0),
        })
    }

    /// Switches the adaptive fallback on (default) or off.
    pub fn adaptive(mut self, on: bool) -> Self {
        self.adaptive = on;
        self
    }

    /// True once the adaptive fallback has switched the sender to plain
    /// sends that copy (the kernel copied nearly every zerocopy send; see
    /// [`ZeroCopySender::adaptive`]); false while it sends with
    /// `MSG_ZEROCOPY`.
    pub fn is_copying(&self) -> bool {
        self.mode == ZeroCopyMode::Copy
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
    /// On error the buffer comes back with it, unsent (for
    /// [`ErrorKind::PartialTrain`](crate::ErrorKind::PartialTrain), partly
    /// sent: [`Error::datagrams_sent`]). `ENOBUFS` means one of two
    /// things, which the completion queue tells apart. Too many zerocopy
    /// sends outstanding for `net.core.optmem_max` (no completion id was
    /// used) is handled here on a blocking socket: the sender waits for
    /// completions and retries, for up to a second. A non-blocking socket
    /// never waits: `ENOBUFS` comes back at once, to be retried after
    /// [`ZeroCopySender::reap`]. A full local queue that dropped the packet
    /// (its id completed before the call returned) is not an error: the
    /// send is done, its datagrams are counted in
    /// [`ZeroCopyStats::dropped_locally`], and the buffer comes back
    /// through [`ZeroCopySender::pop_done`] like any other.
    ///
    /// `meta` carries an ECN codepoint, a source address or a departure
    /// time (`SendMeta::default()` for none): what a protocol stack's
    /// transmits carry. They go out as the socket's own sends would put
    /// them, on the zerocopy path and on every fallback.
    pub fn send(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
        meta: SendMeta,
    ) -> Result<(), (Error, Vec<u8>)> {
        let state = sock.state();
        let t = match checked(state, dest, &buf, segment_size, meta) {
            Ok(t) => t,
            Err(e) => return Err((e, buf)),
        };
        // A train the socket cannot send with GSO (switched off, or off
        // after a fallback) goes through the socket's own split path, which
        // copies.
        if self.mode == ZeroCopyMode::Copy || (t.segments() > 1 && state.max_gso_segments() <= 1) {
            return self.send_copy(sock, dest, buf, segment_size, meta);
        }
        let mut deadline: Option<Instant> = None;
        let mut retries = 0;
        loop {
            let e = match state.send_one_flags(sock.fd(), &t, sys::MSG_ZEROCOPY) {
                Ok(()) => {
                    self.stats.sends += 1;
                    self.stats.zerocopy_sends += 1;
                    self.tracker.push(Some(buf));
                    return Ok(());
                }
                Err(e) => e,
            };
            match self.after_error(sock, &t, e, &mut deadline, &mut retries) {
                After::Dropped => {
                    self.dropped(state, t.segments(), buf);
                    return Ok(());
                }
                After::Retry => {}
                After::Copy => return self.send_copy(sock, dest, buf, segment_size, meta),
                After::Fail(e) => return Err((e, buf)),
            }
        }
    }

    /// What to do after a zerocopy send of `t` failed with `e`: `deadline`
    /// bounds the waits for optmem, `retries` counts the retries after ICMP
    /// errors.
    fn after_error(
        &mut self,
        sock: &impl UdpIo,
        t: &Transmit<'_>,
        e: io::Error,
        deadline: &mut Option<Instant>,
        retries: &mut usize,
    ) -> After {
        let enobufs = e.raw_os_error() == Some(libc::ENOBUFS);
        if enobufs {
            // ENOBUFS from a full local queue comes after the kernel
            // built the packet: its completion id is used, and the
            // completion was queued before the call returned.
            match self.dropped_by_queue(sock) {
                Ok(true) => return After::Dropped,
                Ok(false) => {}
                Err(re) => return After::Fail(re),
            }
            // ENOBUFS (optmem) and EAGAIN come before the kernel takes a
            // completion id.
            if !sys::is_nonblocking(sock.fd()).unwrap_or(true)
                && Instant::now()
                    < *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(1))
            {
                self.stats.enobufs_retries += 1;
                if self.tracker.in_flight() == 0 {
                    // Nothing of ours to wait for: the memory is held elsewhere.
                    std::thread::sleep(Duration::from_millis(1));
                } else if let Err(e) = self.wait(sock, Duration::from_millis(10)) {
                    return After::Fail(e);
                }
                return After::Retry;
            }
        }
        if e.kind() == io::ErrorKind::WouldBlock || enobufs {
            return After::Fail(Error::from(e));
        }
        self.after_failure(sock, t, e, retries)
    }

    /// [`ZeroCopySender::after_error`] for an error other than `ENOBUFS`
    /// and `EAGAIN`.
    fn after_failure(
        &mut self,
        sock: &impl UdpIo,
        t: &Transmit<'_>,
        e: io::Error,
        retries: &mut usize,
    ) -> After {
        // The kernel may have built the packet, and so used up a
        // completion id, before it failed (errors from
        // udp_send_skb do): it then freed the packet before the
        // call returned, which queued that id's completion.
        // Count the id as used and read what is queued. A
        // failure before any packet was built (no route, a
        // pending ICMP error: the kernel gives the id back
        // itself) has no completion: take the id back, or every
        // later buffer would come back one completion late, and
        // the last ones never. Only errors that can come that
        // early are taken back, and only without a completion,
        // so a buffer is never handed back early.
        self.tracker.push(None);
        // (The socket reads the ICMP errors first: it decides
        // on a retry by what it finds in the kernel's queue.)
        let again = *retries < 4 && sock.state().absorb_async_error(sock.fd(), &e);
        if before_any_packet(&e) {
            if let Err(re) = self.reap(sock) {
                return After::Fail(re);
            }
            self.tracker.unpush();
        }
        if again {
            *retries += 1;
            return After::Retry;
        }
        let refused = matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL));
        if refused && t.segments() > 1 {
            // The path refused GSO: the socket's own send falls
            // back (and records why).
            return After::Copy;
        }
        After::Fail(Error::from(e))
    }

    /// A zerocopy send of `segments` datagrams in `buf` that the local
    /// queue dropped: done, counted, and the buffer back in send order.
    fn dropped(&mut self, state: &crate::UdpState, segments: usize, buf: Vec<u8>) {
        self.stats.sends += 1;
        self.stats.zerocopy_sends += 1;
        self.stats.dropped_locally += segments as u64;
        state.dropped_locally(segments, &mut 0);
        // The kernel is done with the buffer: it goes back in
        // send order.
        if let Err(b) = self.tracker.set_last(Some(buf)) {
            self.ready.extend(b);
        }
        while let Some(b) = self.tracker.pop_done() {
            self.ready.extend(b);
        }
    }

    /// After `ENOBUFS` from a zerocopy send: true when the kernel had taken
    /// a completion id (it built the packet, and the local queue dropped
    /// it: the completion is already queued), false when it refused before
    /// (optmem exhausted: the id is taken back).
    fn dropped_by_queue(&mut self, sock: &impl UdpIo) -> Result<bool, Error> {
        self.tracker.push(None);
        let r = self.reap(sock);
        let taken_back = self.tracker.unpush().is_some();
        r.map(|_| !taken_back)
    }

    /// A plain, copying send: the buffer is free as soon as it returns.
    fn send_copy(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
        meta: SendMeta,
    ) -> Result<(), (Error, Vec<u8>)> {
        send_copy(sock, dest, buf, segment_size, meta).map(|buf| {
            self.stats.sends += 1;
            self.ready.push_back(buf);
        })
    }

    /// Reads every completion queued now, without waiting (including any
    /// the socket's own calls read on its behalf). Returns how many sends
    /// completed. Every other error-queue message stays queued, in order,
    /// for [`crate::UdpIo::recv_error`].
    pub fn reap(&mut self, sock: &impl UdpIo) -> Result<usize, Error> {
        let state = sock.state();
        let mut n = 0;
        // What the socket read on the caller's behalf: take ours, put the
        // rest back behind it, once each.
        for _ in 0..state.queued_errors() {
            match state.pop_queued() {
                Some(e) => {
                    if let Some(e) = self.own(e, &mut n) {
                        state.requeue_error(e);
                    }
                }
                None => break,
            }
        }
        while let Some(e) = state.read_kernel_error(sock.fd())? {
            if let Some(e) = self.own(e, &mut n) {
                state.requeue_error(e);
            }
        }
        while let Some(b) = self.tracker.pop_done() {
            self.ready.extend(b);
        }
        self.adapt();
        Ok(n)
    }

    /// Takes a completion (counting the sends in `n`); hands anything
    /// else back.
    fn own(&mut self, e: SocketError, n: &mut usize) -> Option<SocketError> {
        let Detail::ZeroCopy { lo, hi, copied } = e.detail() else {
            return Some(e);
        };
        let k = self.tracker.complete(lo, hi) as u64;
        *n += k as usize;
        self.stats.completions += k;
        self.window.0 += k;
        if copied {
            self.stats.copied += k;
            self.window.1 += k;
        }
        None
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

    /// Waits up to `timeout` for completions, then reaps them. This call
    /// waits, whatever the socket's mode: for a non-blocking event loop,
    /// wait for the socket's error readiness instead and call
    /// [`ZeroCopySender::reap`].
    pub fn wait(&mut self, sock: &impl UdpIo, timeout: Duration) -> Result<usize, Error> {
        if self.tracker.in_flight() == 0 {
            return Ok(0);
        }
        sys::poll(sock.fd().as_raw_fd(), sys::POLLERR, timeout).map_err(Error::from)?;
        self.reap(sock)
    }

    /// Takes back a buffer whose send completed (oldest first).
    pub fn pop_done(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    /// Waits until every buffer in flight completed, up to `timeout`;
    /// returns how many are still in flight.
    pub fn drain(&mut self, sock: &impl UdpIo, timeout: Duration) -> Result<usize, Error> {
        // No deadline when the wait is longer than an `Instant` holds.
        let deadline = Instant::now().checked_add(timeout);
        while self.tracker.in_flight() > 0 {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            self.wait(sock, left.min(Duration::from_millis(50)))?;
        }
        Ok(self.tracker.in_flight())
    }
}

/// Errors a UDP send can fail with before the kernel built a packet (the
/// route lookup, a pending ICMP error, the length check of a datagram
/// without GSO): no zerocopy id was used then. Some of them can also come
/// after (`EMSGSIZE` from a GSO check, `ENETDOWN` from the device), which
/// the completion queued before the call returned tells apart.
fn before_any_packet(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ENETDOWN
                | libc::EHOSTDOWN
                | libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::EMSGSIZE
                | libc::EACCES
        )
    )
}

/// A plain, copying send of one transmit through the socket's own path
/// (and its fallbacks): the buffer is free again when it returns, and comes
/// back either way.
pub(crate) fn send_copy(
    sock: &impl UdpIo,
    dest: SocketAddr,
    buf: Vec<u8>,
    segment_size: Option<usize>,
    meta: SendMeta,
) -> Result<Vec<u8>, (Error, Vec<u8>)> {
    let t = transmit(dest, &buf, segment_size, meta);
    match sock.state().send_on(sock.fd(), &[t]) {
        Ok(s) if s.transmits == 1 => Ok(buf),
        Ok(s) if s.datagrams > 0 => {
            let segments = t.segments();
            Err((
                Error::from(crate::error::Detail::PartialTrain {
                    index: 0,
                    sent: s.datagrams,
                    segments,
                    source: io::Error::from(io::ErrorKind::WouldBlock),
                }),
                buf,
            ))
        }
        Ok(_) => Err((Error::from(io::Error::from(io::ErrorKind::WouldBlock)), buf)),
        Err(e) => Err((e, buf)),
    }
}

/// The transmit of a zerocopy send of `buf`, checked as the socket's own
/// send would check it.
pub(crate) fn checked<'a>(
    state: &crate::UdpState,
    dest: SocketAddr,
    buf: &'a [u8],
    segment_size: Option<usize>,
    meta: SendMeta,
) -> Result<Transmit<'a>, Error> {
    let t = transmit(dest, buf, segment_size, meta);
    state.validate(0, &t)?;
    Ok(t)
}

/// The transmit of `buf` with `meta`'s control data.
fn transmit(
    dest: SocketAddr,
    buf: &[u8],
    segment_size: Option<usize>,
    meta: SendMeta,
) -> Transmit<'_> {
    Transmit {
        segment_size,
        ecn: meta.ecn,
        src_ip: meta.src_ip,
        txtime: meta.txtime,
        ..Transmit::new(dest, buf)
    }
}
