//! The io_uring backend (feature `uring`, Linux only): the same
//! [`UdpState`] and [`Socket`](crate::Socket), driven by
//! io_uring instead of one syscall per batch.
//!
//! Turn it on per socket with [`Config::uring`](crate::Config::uring)
//! (the environment plays no part: a program that wants a switch, such as
//! the `fastudp` command's `--backend`, maps it to the config). Then:
//!
//! * **Receive** is one multishot `IORING_OP_RECVMSG` into a ring of
//!   provided buffers: the kernel receives as data arrives, and each
//!   completion carries the source address and the control messages
//!   (`UDP_GRO` segment size, TOS/ECN, PKTINFO, `SO_RXQ_OVFL`), decoded by
//!   the same code as the syscall path. When the request ends (a completion
//!   without `IORING_CQE_F_MORE`) it is armed again. When every buffer is
//!   in use the kernel ends it with `ENOBUFS`: the datagrams stay in the
//!   socket's queue, nothing is lost, the event is counted
//!   ([`UringStats::buffer_exhausted`]) and the request re-armed once
//!   buffers are back.
//!   [`UdpState::recv_borrowed`](crate::UdpState::recv_borrowed) (and
//!   [`Socket::recv_borrowed`](crate::Socket::recv_borrowed)) lends a
//!   batch of messages in place in the provided buffers, a [`RecvView`]
//!   whose buffers go back to the kernel when it is dropped;
//!   [`UdpState::recv_with`](crate::UdpState::recv_with)
//!   hands messages straight out of the provided buffers to a callback;
//!   [`UdpIo::recv`] copies them into a
//!   [`RecvBatch`](crate::RecvBatch) as before.
//! * **Send** goes as one chain of linked `IORING_OP_SENDMSG`s per batch,
//!   in one `io_uring_enter`, with the control messages of the syscall path
//!   (`UDP_SEGMENT`, TOS, PKTINFO, `SCM_TXTIME`). A failure cancels the
//!   rest of the chain, so what went out is a prefix, as with `sendmmsg`,
//!   and every fallback (a GSO refusal, an ECN refusal, ICMP errors) is the
//!   syscall path's own code. The kernel issues each linked send after the
//!   first through task work; with
//!   [`Config::uring_unlinked_sends`](crate::Config::uring_unlinked_sends)
//!   the `SENDMSG`s of a batch go unlinked, with `MSG_DONTWAIT`, each
//!   issued inline, in order, and their completions are reconciled by
//!   index into the same [`Sent`](crate::Sent). Unlinked, a failed send
//!   does not stop the ones after it. When the failures are all at the end,
//!   what went out is a prefix, exactly as `sendmmsg` reports it. When a
//!   send fails and a later one went (a *hole*), the later ones cannot be
//!   called back: the call reports everything up to the last send that
//!   went, and resends each hole at once, alone, through the whole send
//!   path with its fallbacks (so it goes out after the ones behind it). A
//!   hole whose resend fails too (on a non-blocking socket: the buffer
//!   still full) is reported as a local drop, in
//!   [`Sent::dropped_locally`](crate::Sent::dropped_locally), and counted
//!   in [`UringStats::holes_dropped`]. So nothing is sent twice, and
//!   nothing is lost without being reported, but such a hole is a loss
//!   where the linked chain would have returned an error or `WouldBlock`:
//!   under a full socket buffer on a non-blocking socket holes are common,
//!   which is why the chain stays the default. A datagram larger than any
//!   the socket sent so far (a path-MTU probe) ends its batch, so that the
//!   path's refusal (`EMSGSIZE`) names it alone, as on the syscall path,
//!   with nothing sent after it. A blocking socket that must
//!   wait for buffer space sends its batch as one chain of linked
//!   `SENDMSG`s (io_uring would otherwise complete the waiting ones out
//!   of order), where a failure cancels the rest.
//! * **Zerocopy** sends go with `IORING_OP_SENDMSG_ZC`
//!   ([`UringZeroCopySender`]): the buffer comes back on the notification
//!   completion, not through the error queue, and
//!   `IORING_SEND_ZC_REPORT_USAGE` says whether the kernel copied. The
//!   socket is the ring's registered file, and
//!   [`UringZeroCopySender::with_buffers`] adds a pool of registered send
//!   buffers (fixed buffers, Linux 6.15 for `SENDMSG_ZC`), each refusal a
//!   recorded fallback.
//!
//! When io_uring cannot be used (`kernel.io_uring_disabled`, seccomp,
//! `ENOSYS`, `EPERM`, a missing opcode or buffer ring, a multishot receive
//! the kernel refuses), the socket uses the syscall path and says why in
//! [`Stats::fallbacks`](crate::Stats::fallbacks), under
//! [`Feature::Uring`]. [`probe`] says what this
//! kernel offers.
//!
//! ```
//! use fastudp_io::{Config, RecvBatch, Socket, Transmit, UdpIo};
//!
//! let addr = "127.0.0.1:0".parse().unwrap();
//! let rx = Socket::bind(addr, Config::default().uring(true))?;
//! let tx = Socket::bind(addr, Config::default())?;
//! let payload = [1u8; 4 * 1200];
//! tx.send(&[Transmit::train(rx.as_std().local_addr()?, &payload, 1200)])?;
//! // Datagrams straight out of the ring's provided buffers, no copy (or
//! // out of `scratch` where io_uring is not allowed).
//! let mut scratch = RecvBatch::new(32);
//! let mut received = 0;
//! while received < 4 {
//!     rx.state().recv_with(rx.as_std(), &mut scratch, |meta, payload| {
//!         for datagram in meta.datagrams(payload) {
//!             assert_eq!(datagram.len(), 1200);
//!             received += 1;
//!         }
//!     })?;
//! }
//! // Which backend the socket got, and why not io_uring if it did not.
//! println!("{:?} {:?}", rx.state().uring_stats(), rx.stats().fallbacks);
//! # Ok::<(), fastudp_io::Error>(())
//! ```
//!
//! tokio and quinn sockets stay on syscalls: their reactor waits on the
//! socket's readiness, which a ring receive takes away. On a 2-vCPU
//! virtual machine the syscall path stayed cheaper for GSO sends and GRO
//! receives, so it is the default; `SENDMSG_ZC` is where the backend wins
//! (docs/BENCHMARKS.md, section 13).
//!
//! A non-blocking socket on this backend is ready when the ring has
//! completions, which a poll of the socket itself does not show: wait
//! with [`Socket::wait_readable`](crate::Socket::wait_readable), which
//! waits on the ring while its receive is armed, or use the blocking
//! form.
//! Every safety argument about memory the kernel holds is written down in
//! the private `sys::uring` module.

use crate::backend::{BackendChoice, Deliver, Fill, Host, RingBackend, RingParams};
use crate::error::{Error, FallbackEvent, Feature};
use crate::socket::{Config, RecvMeta, Transmit, UdpIo, UdpState};
use crate::sys::{self, InMeta};
use crate::zerocopy::{checked, send_copy, SendMeta, ZeroCopyStats};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sys::uring::{self as ring, RecvEvent, RecvRing, SendRing, ZcDone, ZcRing};

/// Bytes of provided receive buffers a ring gets by default (see
/// [`recv_buffers_for`]).
pub const RECV_RING_BYTES: usize = 1 << 20;

/// The number of provided receive buffers a ring gets by default when
/// the kernel writes about `bytes` into each (a GRO train's 96 KiB, or a
/// datagram's 1500): as many as fit in [`RECV_RING_BYTES`], rounded down
/// to a power of two, at least 4 and at most 64 (8 for GRO trains).
///
/// The kernel takes buffers from the ring in order and they come back at
/// its tail, so every buffer of the ring is written in turn: the fewer
/// there are, the more of them are still in the CPU's cache when the
/// kernel copies the next message in and the application reads it. On a
/// 2-vCPU VM, 8 buffers of 96 KiB took 0.82-0.90x the receive CPU per
/// byte of `recvmmsg`, 64 took 1.02-1.10x (docs/BENCHMARKS.md, section
/// 13). When they are all in use, the kernel stops the receive and the
/// datagrams wait in the socket's buffer, as they would for `recvmmsg`,
/// until it is armed again ([`UringStats::buffer_exhausted`]).
pub fn recv_buffers_for(bytes: usize) -> u16 {
    let n = (RECV_RING_BYTES / (ring::RECV_OVERHEAD + bytes).max(1)).clamp(4, 64);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// What io_uring offers this process, as probed once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringProbe {
    /// `kernel.io_uring_disabled` (0: allowed, 1: only for the
    /// `io_uring_group`, 2: off), when the sysctl exists.
    pub sysctl_disabled: Option<u8>,
    /// A ring could be created.
    pub available: bool,
    /// Why not, when it could not (or a needed piece is missing).
    pub error: Option<String>,
    /// The errno behind `error`.
    pub errno: Option<i32>,
    /// `IORING_OP_RECVMSG`.
    pub recvmsg: bool,
    /// `IORING_OP_SENDMSG`.
    pub sendmsg: bool,
    /// `IORING_OP_SENDMSG_ZC`.
    pub sendmsg_zc: bool,
    /// `IORING_OP_ASYNC_CANCEL`, needed to tear a receive down.
    pub async_cancel: bool,
    /// Provided buffer rings (`IORING_REGISTER_PBUF_RING`).
    pub buf_ring: bool,
}

impl UringProbe {
    /// The ring receive can run: RECVMSG, a buffer ring and cancel.
    pub fn receive_ok(&self) -> bool {
        self.available && self.recvmsg && self.buf_ring && self.async_cancel
    }

    /// Ring sends can run.
    pub fn send_ok(&self) -> bool {
        self.available && self.sendmsg
    }

    /// Ring zerocopy sends can run.
    pub fn zerocopy_ok(&self) -> bool {
        self.available && self.sendmsg_zc
    }

    /// Why the backend cannot be used at all, or `None`.
    pub fn why_not(&self) -> Option<String> {
        if !self.available {
            return Some(
                self.error
                    .clone()
                    .unwrap_or_else(|| "io_uring is not available".into()),
            );
        }
        if !self.receive_ok() && !self.send_ok() {
            return Some("the kernel lacks IORING_OP_SENDMSG and the multishot receive's pieces (RECVMSG, buffer rings, cancel)".into());
        }
        None
    }
}

/// Reads `kernel.io_uring_disabled`.
fn sysctl_disabled() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// What io_uring offers this process: probed once (a ring is created and
/// `IORING_REGISTER_PROBE` asked), then remembered.
pub fn probe() -> UringProbe {
    static P: OnceLock<UringProbe> = OnceLock::new();
    P.get_or_init(probe_now).clone()
}

#[cfg(target_os = "linux")]
fn probe_now() -> UringProbe {
    let sysctl = sysctl_disabled();
    match ring::probe() {
        Ok(o) => UringProbe {
            sysctl_disabled: sysctl,
            available: true,
            error: None,
            errno: None,
            recvmsg: o.recvmsg,
            sendmsg: o.sendmsg,
            sendmsg_zc: o.sendmsg_zc,
            async_cancel: o.async_cancel,
            buf_ring: o.buf_ring,
        },
        Err((what, e)) => {
            let why = match (e.raw_os_error(), sysctl) {
                (Some(libc::EPERM), Some(2)) => "kernel.io_uring_disabled is 2".to_string(),
                (Some(libc::EPERM), Some(1)) => {
                    "kernel.io_uring_disabled is 1 and this process is not in io_uring_group"
                        .to_string()
                }
                (Some(libc::EPERM), _) => {
                    "not permitted (a seccomp filter or a security module)".to_string()
                }
                (Some(libc::ENOSYS), _) => {
                    "the kernel has no io_uring (or a seccomp filter hides it)".to_string()
                }
                _ => "unavailable".to_string(),
            };
            UringProbe {
                sysctl_disabled: sysctl,
                available: false,
                error: Some(format!("io_uring {why}: {what} failed ({e})")),
                errno: e.raw_os_error(),
                ..UringProbe::default()
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn probe_now() -> UringProbe {
    UringProbe {
        error: Some("io_uring is Linux-only".into()),
        ..UringProbe::default()
    }
}

/// Counters of a socket's io_uring backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UringStats {
    /// Ring sends are on.
    pub send_active: bool,
    /// The ring receive is on.
    pub recv_active: bool,
    /// `io_uring_enter` calls made to send.
    pub send_enters: u64,
    /// `SENDMSG` entries submitted.
    pub send_sqes: u64,
    /// Messages received through the ring.
    pub recv_messages: u64,
    /// Times the multishot receive was armed again after it ended.
    pub rearms: u64,
    /// Times the kernel found no free receive buffer (`ENOBUFS`); the data
    /// stayed queued in the socket and was received after the re-arm.
    pub buffer_exhausted: u64,
    /// Sends of an unlinked batch that failed while a later one went out,
    /// and were resent at once (through every fallback of the syscall
    /// path) and went.
    pub holes_resent: u64,
    /// Such sends whose resend failed too: their datagrams are counted in
    /// [`crate::Sent::dropped_locally`] and
    /// [`crate::Stats::dropped_locally`], and the reason recorded in
    /// [`crate::Stats::fallbacks`].
    pub holes_dropped: u64,
}

/// The backend's state inside a [`UdpState`].
#[derive(Debug)]
pub(crate) struct Backend {
    fd: RawFd,
    #[cfg(target_os = "linux")]
    send: Mutex<Option<SendRing>>,
    #[cfg(target_os = "linux")]
    recv: Mutex<Option<RecvRing>>,
    send_enters: AtomicU64,
    send_sqes: AtomicU64,
    recv_messages: AtomicU64,
    rearms: AtomicU64,
    exhausted: AtomicU64,
    arms: AtomicU64,
    holes_resent: AtomicU64,
    holes_dropped: AtomicU64,
    /// Payload of the largest datagram sent (see `cut_after_growth`).
    largest_sent: std::sync::atomic::AtomicUsize,
    /// Batches go unlinked.
    unlinked: bool,
}

/// Payload every path is taken to carry before the socket sent anything
/// larger: IPv6's minimum MTU (1280) less 48 bytes of IPv6 and UDP
/// headers. A larger datagram ends its unlinked batch until one of its
/// size went (see `Backend::cut_after_growth`).
const SAFE_DATAGRAM: usize = 1232;

#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
impl Config {
    /// Drive the socket with io_uring (default false): see
    /// [`crate::uring`]. Where io_uring cannot be used the socket falls
    /// back to syscalls and says why in
    /// [`Stats::fallbacks`](crate::Stats::fallbacks). This is the only
    /// switch: fastudp reads no environment variable to pick a backend.
    pub fn uring(mut self, on: bool) -> Self {
        self.backend = on.then_some(BackendChoice {
            name: "uring",
            open,
        });
        self
    }
}

/// Opens the io_uring backend for socket `fd` (what [`Config::uring`]
/// chooses), or says why it cannot be used.
fn open(fd: BorrowedFd<'_>, p: &RingParams) -> Result<Box<dyn RingBackend>, FallbackEvent> {
    let payload = if p.gro {
        crate::socket::DEFAULT_MESSAGE_CAPACITY
    } else {
        65536
    };
    let buffers = match p.recv_buffers {
        // GRO trains fill most of each buffer; single datagrams only
        // their first bytes.
        0 if p.gro => recv_buffers_for(payload),
        0 => recv_buffers_for(1500),
        n => n,
    };
    let b = Backend::new(fd, buffers, payload)?.unlinked(p.unlinked);
    Ok(Box::new(b))
}

impl Backend {
    /// Sets the rings up for socket `fd`, or says why not.
    #[cfg(target_os = "linux")]
    pub(crate) fn new(
        fd: BorrowedFd<'_>,
        recv_buffers: u16,
        payload: usize,
    ) -> Result<Self, FallbackEvent> {
        Self::with_probe(fd, recv_buffers, payload, &probe())
    }

    /// [`Backend::new`] with what the probe found.
    fn with_probe(
        fd: BorrowedFd<'_>,
        recv_buffers: u16,
        payload: usize,
        p: &UringProbe,
    ) -> Result<Self, FallbackEvent> {
        let off = |errno: Option<i32>, reason: String| FallbackEvent {
            feature: Feature::Uring,
            errno,
            reason,
        };
        if let Some(why) = p.why_not() {
            return Err(off(p.errno, format!("{why}; using syscalls")));
        }
        let send = if p.send_ok() {
            Some(SendRing::new().map_err(|e| {
                off(
                    e.raw_os_error(),
                    format!("io_uring send ring: {e}; using syscalls"),
                )
            })?)
        } else {
            None
        };
        let recv = if p.receive_ok() {
            let n = match recv_buffers {
                0 => recv_buffers_for(payload),
                n => n.clamp(1, 1 << 15).next_power_of_two(),
            };
            Some(RecvRing::new(fd, n, payload).map_err(|e| {
                off(
                    e.raw_os_error(),
                    format!("io_uring receive ring: {e}; using syscalls"),
                )
            })?)
        } else {
            None
        };
        Ok(Backend {
            fd: fd.as_raw_fd(),
            send: Mutex::new(send),
            recv: Mutex::new(recv),
            send_enters: AtomicU64::new(0),
            send_sqes: AtomicU64::new(0),
            recv_messages: AtomicU64::new(0),
            rearms: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
            arms: AtomicU64::new(0),
            holes_resent: AtomicU64::new(0),
            holes_dropped: AtomicU64::new(0),
            largest_sent: std::sync::atomic::AtomicUsize::new(SAFE_DATAGRAM),
            unlinked: false,
        })
    }

    /// The backend, if `fd` is the socket it was set up for.
    pub(crate) fn for_fd(&self, fd: BorrowedFd<'_>) -> bool {
        fd.as_raw_fd() == self.fd
    }

    pub(crate) fn stats(&self) -> UringStats {
        #[cfg(target_os = "linux")]
        let (send_active, recv_active) = (
            self.send
                .lock()
                .map(|g| g.as_ref().is_some_and(|r| !r.broken()))
                .unwrap_or(false),
            self.recv.lock().map(|g| g.is_some()).unwrap_or(false),
        );
        #[cfg(not(target_os = "linux"))]
        let (send_active, recv_active) = (false, false);
        UringStats {
            send_active,
            recv_active,
            send_enters: self.send_enters.load(Relaxed),
            send_sqes: self.send_sqes.load(Relaxed),
            recv_messages: self.recv_messages.load(Relaxed),
            rearms: self.rearms.load(Relaxed),
            buffer_exhausted: self.exhausted.load(Relaxed),
            holes_resent: self.holes_resent.load(Relaxed),
            holes_dropped: self.holes_dropped.load(Relaxed),
        }
    }

    /// Sends a batch on the ring, as [`sys::send_batch`]; `None` when ring
    /// sends are off (the caller uses the syscall).
    fn send_on_ring<'a>(
        &self,
        state: &dyn Host,
        fd: BorrowedFd<'_>,
        n: usize,
        dontwait: bool,
        holes: &mut u128,
        fill: &mut Fill<'_, 'a>,
    ) -> Option<Result<io::Result<usize>, Error>> {
        let mut g = self.send.lock().ok()?;
        let r = g.as_mut()?;
        if r.broken() {
            return None;
        }
        let out = r.send_batch(fd, n, dontwait && self.unlinked, dontwait, fill);
        if let Ok(o) = &out {
            *holes = o.holes;
            self.send_enters.fetch_add(o.enters, Relaxed);
            self.send_sqes.fetch_add(n as u64, Relaxed);
            if r.broken() {
                let e = o.sent.as_ref().err();
                state.record(
                    Feature::Uring,
                    e.and_then(|e| e.raw_os_error()),
                    format!(
                        "the io_uring send ring failed ({}); sends use syscalls",
                        e.map(|e| e.to_string()).unwrap_or_default()
                    ),
                );
                *g = None;
            }
        }
        Some(out.map(|o| o.sent))
    }

    /// How many of a batch's `n` transmits go in one unlinked submission:
    /// up to and including the first whose largest datagram (`size(i)`)
    /// is larger than any this socket sent so far (and than
    /// [`SAFE_DATAGRAM`]). A datagram over the
    /// path MTU then fails (`EMSGSIZE`) as the last of its batch, never
    /// with sends after it.
    pub(crate) fn cut_after_growth(&self, n: usize, size: &dyn Fn(usize) -> usize) -> usize {
        if !self.unlinked {
            return n;
        }
        let max = self.largest_sent.load(Relaxed);
        (0..n).position(|i| size(i) > max).map_or(n, |p| p + 1)
    }

    /// Remembers the largest datagram sent so far.
    pub(crate) fn note_sent_size(&self, size: usize) {
        self.largest_sent.fetch_max(size, Relaxed);
    }

    /// Sends batches unlinked (see [`crate::Config::uring_unlinked_sends`]).
    pub(crate) fn unlinked(mut self, on: bool) -> Self {
        self.unlinked = on;
        self
    }

    /// Counts a hole of an unlinked batch: resent (`filled`), or dropped.
    pub(crate) fn note_hole(&self, filled: bool) {
        if filled {
            self.holes_resent.fetch_add(1, Relaxed);
        } else {
            self.holes_dropped.fetch_add(1, Relaxed);
        }
    }

    /// Receives up to `max` messages from the ring: message `i` is handed
    /// to `f(i, meta, payload)` straight from its provided buffer, cut to
    /// `room(i)` bytes (longer ones are flagged truncated and counted, as
    /// a receive into a buffer of that size would be). Waits as the socket
    /// says (blocking, `SO_RCVTIMEO`, or not at all). `None` when the ring
    /// receive is off: the caller uses syscalls.
    fn recv_on_ring(
        &self,
        state: &dyn Host,
        fd: BorrowedFd<'_>,
        max: usize,
        room: &dyn Fn(usize) -> usize,
        f: &mut Deliver<'_>,
    ) -> Option<Result<usize, Error>> {
        let mut g = self.recv.lock().ok()?;
        self.recv_in(&mut g, state, fd, max, room, false, f)
    }

    /// [`Backend::recv`] on the locked ring `g`; with `hold`, the messages'
    /// buffers stay out of the ring (for [`RecvView`]) until the next
    /// receive or [`sys::uring::RecvRing::release_held`]. Buffers still
    /// held from an earlier receive go back first.
    #[allow(clippy::too_many_arguments)]
    fn recv_in(
        &self,
        g: &mut Option<RecvRing>,
        state: &dyn Host,
        fd: BorrowedFd<'_>,
        max: usize,
        room: &dyn Fn(usize) -> usize,
        hold: bool,
        f: &mut Deliver<'_>,
    ) -> Option<Result<usize, Error>> {
        let r = g.as_mut()?;
        r.release_held();
        let mut started: Option<(Instant, Option<Duration>)> = None;
        let mut retries = 0;
        loop {
            if !r.armed() {
                if let Err(e) = r.arm() {
                    state.record(
                        Feature::Uring,
                        e.raw_os_error(),
                        format!("arming the io_uring multishot receive failed ({e}); receives use syscalls"),
                    );
                    *g = None;
                    return None;
                }
                if self.arms.fetch_add(1, Relaxed) > 0 {
                    self.rearms.fetch_add(1, Relaxed);
                }
            }
            let mut got = 0;
            let mut err: Option<io::Error> = None;
            r.drain(max, hold, |ev| match ev {
                RecvEvent::Message(m) => {
                    let cap = room(got);
                    let truncated = m.payload.len() > cap;
                    let raw = InMeta {
                        len: m.len,
                        flags: m.flags | if truncated { sys::MSG_TRUNC } else { 0 },
                        source: m.source,
                        control_len: m.control.len(),
                    };
                    f(got, raw, m.control, &m.payload[..m.payload.len().min(cap)]);
                    got += 1;
                }
                RecvEvent::Failed(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.exhausted.fetch_add(1, Relaxed);
                }
                RecvEvent::Failed(e) => {
                    err.get_or_insert(e);
                }
            });
            if got > 0 {
                self.recv_messages.fetch_add(got as u64, Relaxed);
                state.count_recv(got);
                return Some(Ok(got));
            }
            if let Some(e) = err {
                if e.raw_os_error() == Some(libc::EINVAL) && self.recv_messages.load(Relaxed) == 0 {
                    state.record(
                        Feature::Uring,
                        Some(libc::EINVAL),
                        "the kernel refused a multishot RECVMSG (before Linux 6.0); receives use syscalls".into(),
                    );
                    *g = None;
                    return None;
                }
                if retries < 4 && state.absorb_async_error(fd, &e) {
                    retries += 1;
                    continue;
                }
                return Some(Err(Error::from(e)));
            }
            if !r.armed() || r.ready() {
                continue;
            }
            let (t0, timeout) = *started.get_or_insert_with(|| {
                let nb = sys::is_nonblocking(fd).unwrap_or(true);
                let t = if nb {
                    Some(Duration::ZERO)
                } else {
                    socket2::SockRef::from(&fd).read_timeout().unwrap_or(None)
                };
                (Instant::now(), t)
            });
            let left = match timeout {
                Some(t) => {
                    let left = t.saturating_sub(t0.elapsed());
                    if left.is_zero() {
                        return Some(Err(Error::from(io::Error::from(io::ErrorKind::WouldBlock))));
                    }
                    Some(left)
                }
                None => None,
            };
            if let Err(e) = r.wait(left) {
                return Some(Err(Error::from(e)));
            }
        }
    }
}

impl RingBackend for Backend {
    fn for_fd(&self, fd: BorrowedFd<'_>) -> bool {
        Backend::for_fd(self, fd)
    }

    fn send_batch<'a>(
        &self,
        host: &dyn Host,
        fd: BorrowedFd<'_>,
        n: usize,
        dontwait: bool,
        holes: &mut u128,
        fill: &mut Fill<'_, 'a>,
    ) -> Option<Result<io::Result<usize>, Error>> {
        self.send_on_ring(host, fd, n, dontwait, holes, fill)
    }

    fn cut_after_growth(&self, n: usize, size: &dyn Fn(usize) -> usize) -> usize {
        Backend::cut_after_growth(self, n, size)
    }

    fn wait_readable(&self, timeout: Duration) -> Option<io::Result<bool>> {
        #[cfg(target_os = "linux")]
        {
            let mut g = self.recv.lock().unwrap_or_else(|e| e.into_inner());
            let r = g.as_mut().filter(|r| r.armed())?;
            if r.ready() {
                return Some(Ok(true));
            }
            Some(r.wait(Some(timeout)).map(|_| r.ready()))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = timeout;
            None
        }
    }

    fn note_sent_size(&self, size: usize) {
        Backend::note_sent_size(self, size);
    }

    fn note_hole(&self, filled: bool) {
        Backend::note_hole(self, filled);
    }

    fn recv(
        &self,
        host: &dyn Host,
        fd: BorrowedFd<'_>,
        max: usize,
        room: &dyn Fn(usize) -> usize,
        f: &mut Deliver<'_>,
    ) -> Option<Result<usize, Error>> {
        self.recv_on_ring(host, fd, max, room, f)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl UdpState {
    /// This state's io_uring backend, if it has one.
    fn ring(&self) -> Option<&Backend> {
        self.backend.as_deref()?.as_any().downcast_ref()
    }

    /// This state's io_uring backend for socket `fd`, if it has one.
    fn ring_for(&self, fd: BorrowedFd<'_>) -> Option<&Backend> {
        self.ring().filter(|b| b.for_fd(fd))
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
impl UdpState {
    /// The io_uring backend's counters, when this socket uses it.
    pub fn uring_stats(&self) -> Option<UringStats> {
        self.ring().map(Backend::stats)
    }

    /// Receives messages and hands each to `f` with its metadata, without
    /// copying: on the io_uring backend straight out of the provided
    /// buffer it arrived in, which goes back to the kernel when `f`
    /// returns. Up to `scratch.capacity()` messages; waits, truncation
    /// (never, beyond the ring's buffers) and errors as
    /// [`UdpIo::recv`](crate::UdpIo::recv). Without the ring, receives into `scratch` with
    /// [`UdpIo::recv`](crate::UdpIo::recv) and hands out its messages. Returns how many.
    pub fn recv_with(
        &self,
        sock: impl std::os::fd::AsFd,
        scratch: &mut crate::RecvBatch,
        mut f: impl FnMut(&RecvMeta, &[u8]),
    ) -> Result<usize, Error> {
        let fd = sock.as_fd();
        if let Some(b) = self.backend_for(fd) {
            let max = scratch.capacity();
            if let Some(r) = self.ring_recv(b, fd, max, &|_| usize::MAX, |_, m, p| f(m, p)) {
                return r;
            }
        }
        let n = self.recv_on(fd, scratch)?;
        for (m, p) in &*scratch {
            f(m, p);
        }
        Ok(n)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
impl UdpState {
    /// Receives a batch of messages and lends them to the caller in place:
    /// on the io_uring backend, each payload is read where the kernel
    /// wrote it, in the ring's provided buffer, with no copy. The buffers
    /// go back to the kernel when the returned [`RecvView`] is dropped (or
    /// at the latest when the next receive starts, if it was leaked).
    ///
    /// The view borrows the state mutably, so the borrow checker, not a
    /// convention, keeps a buffer from going back while a view of it
    /// lives: no other receive (or anything else) can run on this state
    /// until the view is gone. One that tries does not compile:
    ///
    /// ```compile_fail,E0499
    /// use fastudp_io::{Config, RecvBatch, Socket};
    /// let mut rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default().uring(true))?;
    /// let (mut a, mut b) = (RecvBatch::new(8), RecvBatch::new(8));
    /// let first = rx.recv_borrowed(&mut a)?;
    /// let second = rx.recv_borrowed(&mut b)?; // `rx` is still lent to `first`
    /// println!("{} {}", first.len(), second.len());
    /// # Ok::<(), fastudp_io::Error>(())
    /// ```
    ///
    /// Up to `scratch.capacity()` messages. Waits, truncation (never,
    /// beyond the ring's buffers), counters and errors as
    /// [`UdpIo::recv`](crate::UdpIo::recv); a GRO train is one message, split in place by
    /// [`RecvView::datagrams`]. When every provided buffer is in use
    /// (lent out in views, or filled and not yet received) the kernel ends
    /// its multishot receive: the datagrams stay queued in the socket,
    /// the event is counted in [`UringStats::buffer_exhausted`], and the
    /// receive is armed again once buffers are back; nothing is lost.
    /// Without the ring (io_uring unavailable or refused, another socket's
    /// state, a platform without it) it receives into `scratch` with
    /// [`UdpIo::recv`](crate::UdpIo::recv) and the view lends out `scratch`'s messages.
    pub fn recv_borrowed<'a>(
        &'a mut self,
        sock: impl std::os::fd::AsFd,
        scratch: &'a mut crate::RecvBatch,
    ) -> Result<RecvView<'a>, Error> {
        let fd = sock.as_fd();
        #[cfg(target_os = "linux")]
        if let Some(n) = self.recv_held(fd, scratch) {
            let n = n?;
            let ring = self
                .backend
                .as_mut()
                .and_then(|b| b.as_any_mut().downcast_mut::<Backend>())
                .and_then(|b| b.recv.get_mut().unwrap_or_else(|e| e.into_inner()).as_mut());
            let inner = match ring {
                Some(ring) => ViewInner::Ring {
                    metas: &scratch.metas_for_view()[..n],
                    ring,
                },
                // Cannot happen: the ring receive just ran.
                None => ViewInner::Batch(scratch),
            };
            return Ok(RecvView { inner });
        }
        self.recv_on(fd, scratch)?;
        Ok(RecvView {
            inner: ViewInner::Batch(scratch),
        })
    }

    /// The ring half of [`UdpState::recv_borrowed`]: receives with the
    /// buffers held, metadata into `scratch`; `None` without the ring.
    #[cfg(target_os = "linux")]
    fn recv_held(
        &self,
        fd: BorrowedFd<'_>,
        scratch: &mut crate::RecvBatch,
    ) -> Option<Result<usize, Error>> {
        let b = self.ring_for(fd)?;
        let metas = scratch.metas_for_view();
        let max = metas.len().min(sys::MAX_BATCH);
        let mut g = b.recv.lock().unwrap_or_else(|e| e.into_inner());
        b.recv_in(
            &mut g,
            self,
            fd,
            max,
            &|_| usize::MAX,
            true,
            &mut |i, raw, control, payload| {
                metas[i] = self.decode(raw, control, payload.len());
            },
        )
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
impl crate::Socket {
    /// See [`UdpState::recv_borrowed`].
    ///
    /// ```
    /// use fastudp_io::{Config, RecvBatch, Socket, Transmit, UdpIo};
    ///
    /// let mut rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default().uring(true))?;
    /// let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default())?;
    /// tx.send(&[Transmit::train(rx.as_std().local_addr()?, &[7u8; 3 * 1000], 1000)])?;
    /// let mut scratch = RecvBatch::new(16);
    /// let mut seen = 0;
    /// while seen < 3 {
    ///     let view = rx.recv_borrowed(&mut scratch)?;
    ///     for (meta, datagram) in view.datagrams() {
    ///         assert_eq!((meta.stride, datagram), (1000, &[7u8; 1000][..]));
    ///         seen += 1;
    ///     }
    ///     // `view` is dropped here, and its buffers go back to the kernel.
    /// }
    /// # Ok::<(), fastudp_io::Error>(())
    /// ```
    pub fn recv_borrowed<'a>(
        &'a mut self,
        scratch: &'a mut crate::RecvBatch,
    ) -> Result<RecvView<'a>, Error> {
        let (sock, state) = self.parts_mut();
        let fd = std::os::fd::AsFd::as_fd(sock);
        state.recv_borrowed(fd, scratch)
    }
}

/// Messages lent by [`UdpState::recv_borrowed`]: each one's metadata and
/// payload, read in place in the io_uring ring's provided buffers (or in
/// the scratch batch without the ring). Dropping the view gives the
/// buffers back to the kernel.
pub struct RecvView<'a> {
    inner: ViewInner<'a>,
}

enum ViewInner<'a> {
    #[cfg(target_os = "linux")]
    Ring {
        metas: &'a [RecvMeta],
        ring: &'a mut RecvRing,
    },
    Batch(&'a crate::RecvBatch),
}

impl std::fmt::Debug for RecvView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvView")
            .field("len", &self.len())
            .field("in_ring", &self.in_ring())
            .finish()
    }
}

impl RecvView<'_> {
    /// Messages in the view.
    pub fn len(&self) -> usize {
        match &self.inner {
            #[cfg(target_os = "linux")]
            ViewInner::Ring { metas, .. } => metas.len(),
            ViewInner::Batch(b) => b.len(),
        }
    }

    /// True when the receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the payloads are read in place in the ring's buffers;
    /// false when they were received into the scratch batch (no ring).
    pub fn in_ring(&self) -> bool {
        match &self.inner {
            #[cfg(target_os = "linux")]
            ViewInner::Ring { .. } => true,
            ViewInner::Batch(_) => false,
        }
    }

    /// Message `i`: its metadata and payload (a GRO train whole).
    pub fn get(&self, i: usize) -> Option<(&RecvMeta, &[u8])> {
        match &self.inner {
            #[cfg(target_os = "linux")]
            ViewInner::Ring { metas, ring } => metas.get(i).map(|m| {
                let p = ring.held_payload(i);
                (m, &p[..m.len.min(p.len())])
            }),
            ViewInner::Batch(b) => b.get(i),
        }
    }

    /// The messages, in the order received.
    pub fn iter(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// Every datagram of every message, GRO trains split in place (each
    /// datagram a slice of the buffer the train arrived in), with its
    /// message's metadata.
    pub fn datagrams(&self) -> impl Iterator<Item = (&RecvMeta, &[u8])> + '_ {
        self.iter()
            .flat_map(|(m, p)| m.datagrams(p).map(move |d| (m, d)))
    }
}

impl Drop for RecvView<'_> {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let ViewInner::Ring { ring, .. } = &mut self.inner {
            ring.release_held();
        }
    }
}

/// Sends buffers with `IORING_OP_SENDMSG_ZC` (and GSO), and owns each
/// buffer until the kernel's notification completion says it is done:
/// the same lifetime guarantee as [`crate::ZeroCopySender`] (a buffer
/// comes back from [`UringZeroCopySender::pop_done`] only after its
/// notification), without the error queue. `IORING_SEND_ZC_REPORT_USAGE`
/// tells when the kernel copied ([`ZeroCopyStats::copied`]).
///
/// Dropping it waits up to a second for outstanding notifications; a
/// buffer the kernel still holds after that is leaked, never freed.
///
/// Two registrations make each send cheaper where the kernel takes them:
/// the socket is registered as the ring's fixed file
/// (`IORING_REGISTER_FILES`) when the sender is made, and
/// [`UringZeroCopySender::with_buffers`] sets up a pool of send buffers
/// registered as fixed buffers (`IORING_REGISTER_BUFFERS`), which
/// [`UringZeroCopySender::send_with`] fills and sends with
/// `IORING_RECVSEND_FIXED_BUF`, so the kernel does not pin the pages of
/// each send. A refused registration is a fallback, recorded in the
/// socket's [`Stats::fallbacks`](crate::Stats::fallbacks) under
/// [`Feature::Uring`]: the sends go on without it.
#[derive(Debug)]
pub struct UringZeroCopySender {
    #[cfg(target_os = "linux")]
    ring: ZcRing,
    #[cfg(target_os = "linux")]
    done: Vec<ZcDone>,
    ready: VecDeque<Vec<u8>>,
    stats: ZeroCopyStats,
    /// The [`UdpState::id`] of the socket registered as the ring's fixed
    /// file.
    #[cfg(target_os = "linux")]
    file_state: Option<u64>,
}

/// Why a pool send's header could not be built.
#[cfg(target_os = "linux")]
enum PoolFill {
    /// The transmit is invalid.
    Invalid(Error),
    /// The socket cannot send it with GSO now: its own send must.
    Copy,
}

impl UringZeroCopySender {
    /// A sender with its own ring. Fails when io_uring or
    /// `IORING_OP_SENDMSG_ZC` is not available (see [`probe`]), or
    /// `Config::disable` has `Feature::Zerocopy`.
    pub fn new(sock: &impl UdpIo) -> Result<Self, Error> {
        if sock.state().capabilities().is_disabled(Feature::Zerocopy) {
            return Err(crate::error::ConfigError::SwitchedOff(Feature::Zerocopy).into());
        }
        let p = probe();
        let unsupported = |why: String| {
            Error::from(crate::error::Detail::Setup {
                what: "io_uring SENDMSG_ZC",
                source: io::Error::new(io::ErrorKind::Unsupported, why),
            })
        };
        if !p.zerocopy_ok() {
            return Err(unsupported(p.why_not().unwrap_or_else(|| {
                "the kernel lacks IORING_OP_SENDMSG_ZC (Linux 6.1)".into()
            })));
        }
        #[cfg(target_os = "linux")]
        {
            let mut ring = ZcRing::new().map_err(|e| {
                Error::from(crate::error::Detail::Setup {
                    what: "io_uring_setup",
                    source: e,
                })
            })?;
            let state = sock.state();
            let file_state = match ring.register_file(sock.fd().as_raw_fd()) {
                Ok(()) => Some(state.id),
                Err(e) => {
                    state.record(
                        Feature::Uring,
                        e.raw_os_error(),
                        format!("io_uring: registering the socket as a fixed file (IORING_REGISTER_FILES) failed ({e}): SENDMSG_ZC names it by descriptor"),
                    );
                    None
                }
            };
            Ok(UringZeroCopySender {
                ring,
                done: Vec::new(),
                ready: VecDeque::new(),
                stats: ZeroCopyStats::default(),
                file_state,
            })
        }
        #[cfg(not(target_os = "linux"))]
        Err(unsupported("io_uring is Linux-only".into()))
    }

    /// Sets up a pool of `count` send buffers of `len` bytes each, for
    /// [`UringZeroCopySender::send_with`], and registers it with the ring
    /// as fixed buffers, where the kernel takes them for `SENDMSG_ZC`
    /// (Linux 6.15; probed once, with a send that the kernel refuses
    /// before anything goes out). Where it does not, or the registration
    /// is refused (`RLIMIT_MEMLOCK`, an older kernel), the pool is
    /// ordinary memory, the sends work the same, and the reason is
    /// recorded in `sock`'s [`Stats::fallbacks`](crate::Stats::fallbacks)
    /// under [`Feature::Uring`]; [`UringZeroCopySender::fixed_buffers`]
    /// says which. The pool is pinned memory of at most 256 MiB, and is
    /// set up once: a second call keeps the first pool.
    ///
    /// ```
    /// use fastudp_io::{uring::UringZeroCopySender, Config, Socket};
    ///
    /// let rx = std::net::UdpSocket::bind("127.0.0.1:0")?;
    /// let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default())?;
    /// let Ok(zc) = UringZeroCopySender::new(&tx) else { return Ok(()) };
    /// let mut zc = zc.with_buffers(&tx, 16, 4 * 1200)?;
    /// zc.send_with(&tx, rx.local_addr()?, 4 * 1200, Some(1200), |buf| buf.fill(7))?;
    /// zc.drain(std::time::Duration::from_secs(1))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_buffers(
        #[allow(unused_mut)] mut self,
        sock: &impl UdpIo,
        count: usize,
        len: usize,
    ) -> Result<Self, Error> {
        #[cfg(target_os = "linux")]
        match self.ring.setup_pool(count, len) {
            Ok(None) => {}
            Ok(Some(r)) => sock.state().record(
                Feature::Uring,
                r.error.raw_os_error(),
                format!(
                    "io_uring: {} refused ({}): SENDMSG_ZC sends the pool's buffers as ordinary memory",
                    r.what, r.error
                ),
            ),
            Err(e) => {
                return Err(Error::from(crate::error::Detail::Setup {
                    what: "io_uring send buffer pool",
                    source: e,
                }))
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (sock, count, len);
        Ok(self)
    }

    /// True when the pool of [`UringZeroCopySender::with_buffers`] is
    /// registered and sent from as fixed buffers.
    pub fn fixed_buffers(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.ring.pool_fixed();
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// True when sends on `sock` name it as the ring's registered file.
    pub fn fixed_file(&self, sock: &impl UdpIo) -> bool {
        #[cfg(target_os = "linux")]
        return self.file_state == Some(sock.state().id)
            && self.ring.file() == Some(sock.fd().as_raw_fd());
        #[cfg(not(target_os = "linux"))]
        {
            let _ = sock;
            false
        }
    }

    /// Sends `len` bytes to `dest` from a buffer of the pool
    /// ([`UringZeroCopySender::with_buffers`]), as a GSO train when
    /// `segment_size` is smaller than `len`: `write` fills the buffer
    /// (its bytes are those of an earlier send, or zeros), and the buffer
    /// goes back to the pool on its notification. Waits for the send's
    /// own completion, not for the notification; when every buffer or
    /// slot is in flight it first waits (up to a second) for one to come
    /// back. The fallbacks are those of [`UringZeroCopySender::send`]: a
    /// train the socket cannot send with GSO now, or one the path
    /// refuses, goes through the socket's own (copying) send, and a send
    /// the local queue dropped (`ENOBUFS`) is done, counted in
    /// [`ZeroCopyStats::dropped_locally`]. An error when there is no pool
    /// or `len` is larger than its buffers.
    pub fn send_with(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        len: usize,
        segment_size: Option<usize>,
        write: impl FnOnce(&mut [u8]),
    ) -> Result<(), Error> {
        #[cfg(target_os = "linux")]
        {
            let state = sock.state();
            let mut write = Some(write);
            let mut write = |b: &mut [u8]| {
                if let Some(w) = write.take() {
                    w(b)
                }
            };
            let fixed_file = self.fixed_file(sock);
            let deadline = Instant::now() + Duration::from_secs(1);
            loop {
                let fd = sock.fd();
                let nonblocking = sys::is_nonblocking(fd).unwrap_or(false);
                let mut segments = 1;
                let r = self.ring.send(
                    fd,
                    fixed_file,
                    if nonblocking { libc::MSG_DONTWAIT } else { 0 },
                    ring::ZcSrc::Pool {
                        len,
                        write: &mut write,
                    },
                    |b, ctl| {
                        let t = checked(state, dest, b, segment_size, SendMeta::default())
                            .map_err(PoolFill::Invalid)?;
                        segments = t.segments();
                        if segments > 1 && state.max_gso_segments_to(&dest) <= 1 {
                            return Err(PoolFill::Copy);
                        }
                        state
                            .message(&t, b, true, ctl, true)
                            .map_err(PoolFill::Invalid)
                    },
                    &mut self.done,
                );
                self.collect();
                match r {
                    Err((PoolFill::Invalid(e), _)) => return Err(e),
                    Err((PoolFill::Copy, data)) => {
                        return self
                            .copy(sock, dest, data, segment_size)
                            .map_err(|(e, _)| e)
                    }
                    Ok(Ok(())) => {
                        self.stats.sends += 1;
                        self.stats.zerocopy_sends += 1;
                        return Ok(());
                    }
                    Ok(Err((e, _)))
                        if e.kind() == io::ErrorKind::WouldBlock
                            && (self.ring.in_flight() >= ring::ZC_SLOTS
                                || (self.ring.pool_free() == 0 && self.ring.pool_len() > 0)) =>
                    {
                        if Instant::now() > deadline {
                            return Err(Error::from(e));
                        }
                        let _ = self.ring.wait(Duration::from_millis(10), &mut self.done);
                        self.collect();
                    }
                    Ok(Err((e, _))) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        self.stats.sends += 1;
                        self.stats.zerocopy_sends += 1;
                        self.stats.dropped_locally += segments as u64;
                        state.dropped_locally(segments, &mut 0);
                        return Ok(());
                    }
                    Ok(Err((e, Some(data))))
                        if segments > 1
                            && matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
                    {
                        // The path refused GSO: the socket's own send falls
                        // back (and records why).
                        return self
                            .copy(sock, dest, data, segment_size)
                            .map_err(|(e, _)| e);
                    }
                    Ok(Err((e, _))) => return Err(Error::from(e)),
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (sock, dest, len, segment_size, write);
            Err(Error::from(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring is Linux-only",
            )))
        }
    }

    /// Counters so far (`completions` counts notifications).
    pub fn stats(&self) -> ZeroCopyStats {
        self.stats.clone()
    }

    /// Buffers the kernel may still read.
    pub fn in_flight(&self) -> usize {
        #[cfg(target_os = "linux")]
        return self.ring.in_flight();
        #[cfg(not(target_os = "linux"))]
        0
    }

    /// Sends `buf` to `dest`, as a GSO train when `segment_size` is smaller
    /// than it; the sender keeps the buffer until its notification. Waits
    /// for the send's own completion, not for the notification. When 64
    /// sends are in flight it first waits (up to a second) for one to
    /// finish. On error the buffer comes back with it, unsent (empty only
    /// if the ring itself failed while the kernel held the buffer: that one
    /// is kept, and leaked at teardown if never released). A train the
    /// socket cannot send with GSO now, or one the path refuses, goes
    /// through the socket's own (copying) send and its fallbacks. A send
    /// the local queue dropped (`ENOBUFS`) is done, not an error, as in
    /// [`crate::UdpIo::send`]: counted in
    /// [`ZeroCopyStats::dropped_locally`], its buffer free at once.
    pub fn send(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        let state = sock.state();
        let segments = match checked(state, dest, &buf, segment_size, SendMeta::default()) {
            Ok(t) => t.segments(),
            Err(e) => return Err((e, buf)),
        };
        if segments > 1 && state.max_gso_segments_to(&dest) <= 1 {
            return self.copy(sock, dest, buf, segment_size);
        }
        #[cfg(target_os = "linux")]
        {
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut buf = buf;
            loop {
                let fd = sock.fd();
                let nonblocking = sys::is_nonblocking(fd).unwrap_or(false);
                let fixed_file = self.fixed_file(sock);
                let r = self.ring.send(
                    fd,
                    fixed_file,
                    if nonblocking { libc::MSG_DONTWAIT } else { 0 },
                    ring::ZcSrc::Owned(buf),
                    |b, ctl| {
                        let t = Transmit {
                            segment_size,
                            ..Transmit::new(dest, b)
                        };
                        state.message(&t, b, true, ctl, true)
                    },
                    &mut self.done,
                );
                self.collect();
                match r {
                    Err((e, b)) => return Err((e, b)),
                    Ok(Ok(())) => {
                        self.stats.sends += 1;
                        self.stats.zerocopy_sends += 1;
                        return Ok(());
                    }
                    Ok(Err((e, Some(b))))
                        if e.kind() == io::ErrorKind::WouldBlock
                            && self.ring.in_flight() >= ring::ZC_SLOTS =>
                    {
                        if Instant::now() > deadline {
                            return Err((Error::from(e), b));
                        }
                        buf = b;
                        let _ = self.ring.wait(Duration::from_millis(10), &mut self.done);
                        self.collect();
                    }
                    Ok(Err((e, Some(b)))) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        // The local queue dropped the packet (a ring
                        // zerocopy send has no optmem limit): done, as in
                        // `UdpIo::send`; the buffer is free again.
                        self.stats.sends += 1;
                        self.stats.zerocopy_sends += 1;
                        self.stats.dropped_locally += segments as u64;
                        state.dropped_locally(segments, &mut 0);
                        self.ready.push_back(b);
                        return Ok(());
                    }
                    Ok(Err((e, Some(b))))
                        if segments > 1
                            && matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) =>
                    {
                        // The path refused GSO: the socket's own send falls
                        // back (and records why).
                        return self.copy(sock, dest, b, segment_size);
                    }
                    Ok(Err((e, Some(b)))) => return Err((Error::from(e), b)),
                    Ok(Err((e, None))) => return Err((Error::from(e), Vec::new())),
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        self.copy(sock, dest, buf, segment_size)
    }

    fn copy(
        &mut self,
        sock: &impl UdpIo,
        dest: SocketAddr,
        buf: Vec<u8>,
        segment_size: Option<usize>,
    ) -> Result<(), (Error, Vec<u8>)> {
        send_copy(sock, dest, buf, segment_size, SendMeta::default()).map(|buf| {
            self.stats.sends += 1;
            self.ready.push_back(buf);
        })
    }

    /// Moves finished buffers to the ready queue, counting them.
    #[cfg(target_os = "linux")]
    fn collect(&mut self) {
        for d in self.done.drain(..) {
            self.stats.completions += 1;
            if d.copied {
                self.stats.copied += 1;
            }
            if !d.pooled {
                self.ready.push_back(d.buf);
            }
        }
    }

    /// Reads every notification queued now, without waiting; returns how
    /// many sends finished.
    pub fn reap(&mut self) -> usize {
        #[cfg(target_os = "linux")]
        {
            self.ring.reap(&mut self.done);
            let n = self.done.len();
            self.collect();
            n
        }
        #[cfg(not(target_os = "linux"))]
        0
    }

    /// Waits up to `timeout` for a notification, then reaps; returns how
    /// many sends finished.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, Error> {
        self.ring
            .wait(timeout, &mut self.done)
            .map_err(Error::from)?;
        let n = self.done.len();
        self.collect();
        Ok(n)
    }

    /// Takes back a buffer whose send finished (oldest first).
    pub fn pop_done(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }

    /// Waits until every buffer in flight came back, up to `timeout`;
    /// returns how many are still in flight.
    pub fn drain(&mut self, timeout: Duration) -> Result<usize, Error> {
        // No deadline when the wait is longer than an `Instant` holds.
        let deadline = Instant::now().checked_add(timeout);
        #[cfg(target_os = "linux")]
        while self.ring.in_flight() > 0 {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            self.ring
                .wait(left.min(Duration::from_millis(50)), &mut self.done)
                .map_err(Error::from)?;
            self.collect();
        }
        let _ = deadline;
        Ok(self.in_flight())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn unavailable_io_uring_is_a_fallback_that_says_why() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let denied = UringProbe {
            sysctl_disabled: Some(2),
            errno: Some(libc::EPERM),
            error: Some("io_uring kernel.io_uring_disabled is 2: io_uring_setup failed".into()),
            ..UringProbe::default()
        };
        let ev = Backend::with_probe(sock.as_fd(), 4, 1500, &denied).unwrap_err();
        assert_eq!((ev.feature, ev.errno), (Feature::Uring, Some(libc::EPERM)));
        assert!(ev.reason.contains("io_uring_disabled is 2") && ev.reason.contains("syscalls"));
        let old = UringProbe {
            available: true,
            ..UringProbe::default()
        };
        let ev = Backend::with_probe(sock.as_fd(), 4, 1500, &old).unwrap_err();
        assert!(ev.reason.contains("SENDMSG"), "{}", ev.reason);
        // Sends only: no receive ring, and receives stay on syscalls.
        let sends = UringProbe {
            sendmsg: true,
            ..old
        };
        let b = Backend::with_probe(sock.as_fd(), 4, 1500, &sends).unwrap();
        let st = b.stats();
        assert!(st.send_active && !st.recv_active, "{st:?}");
    }

    /// Whether ring sends and receives run here; says why not (and fails
    /// under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`) when they do not.
    fn ring_here() -> bool {
        let p = probe();
        if p.send_ok() && p.receive_ok() {
            return true;
        }
        let why = format!("io_uring unavailable: {:?}", p.why_not());
        fastudp_test_support::skip(&fastudp_test_support::current_test(), &why);
        false
    }

    /// Datagram `seq`: its number, then filler, `len` bytes.
    fn datagram(seq: u32, len: usize) -> Vec<u8> {
        let mut d = seq.to_be_bytes().to_vec();
        d.extend((4..len).map(|i| (seq as usize * 7 + i) as u8));
        d
    }

    /// A plain receiver, and a sender on the ring.
    fn pair() -> (std::net::UdpSocket, crate::Socket) {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let tx = crate::Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            crate::Config::default()
                .uring(true)
                .uring_unlinked_sends(true),
        )
        .unwrap();
        assert!(tx.state().uring_stats().unwrap().send_active);
        // A first datagram as large as any the tests send, elsewhere: a
        // batch is cut after a datagram larger than any sent before.
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let warm = [0u8; 1472];
        let sent = tx
            .send(&[Transmit::new(sink.local_addr().unwrap(), &warm)])
            .unwrap();
        assert!(sent.all(1));
        (rx, tx)
    }

    /// Every datagram that arrives, in arrival order.
    fn arrivals(rx: &std::net::UdpSocket) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = rx.recv(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    /// Sends `n` datagrams of 500 bytes in one call with the ring batches'
    /// failures `masks` injected (the kernel really fails those sends):
    /// what the call reported, what arrived (by number, in order), and the
    /// ring's counters.
    fn send_with_failures(
        masks: &[u128],
        n: u32,
    ) -> (crate::Sent, Vec<u32>, UringStats, crate::Stats) {
        let (rx, tx) = pair();
        let dest = rx.local_addr().unwrap();
        let data: Vec<Vec<u8>> = (0..n).map(|i| datagram(i, 500)).collect();
        let ts: Vec<Transmit<'_>> = data.iter().map(|d| Transmit::new(dest, d)).collect();
        ring::inject::fail_next(masks);
        let sent = tx.send(&ts).unwrap();
        let got = arrivals(&rx);
        for g in &got {
            let seq = u32::from_be_bytes(g[..4].try_into().unwrap());
            assert_eq!(g, &data[seq as usize], "datagram {seq} intact");
        }
        let seqs = got
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        (sent, seqs, tx.state().uring_stats().unwrap(), tx.stats())
    }

    #[test]
    fn the_ring_is_sized_from_the_bytes_each_message_writes() {
        assert_eq!(recv_buffers_for(crate::socket::DEFAULT_MESSAGE_CAPACITY), 8);
        assert_eq!(recv_buffers_for(1500), 64);
        assert_eq!(recv_buffers_for(1 << 20), 4);
    }

    /// A datagram larger than any sent before ends its batch, so that a
    /// path-MTU refusal is never followed by sends that went.
    #[test]
    fn a_batch_ends_after_a_datagram_larger_than_any_sent_before() {
        if !ring_here() {
            return;
        }
        let (rx, tx) = pair();
        let b = tx.state().ring().unwrap();
        let sizes = [500, 1472, 1473, 600, 2000];
        assert_eq!(b.cut_after_growth(5, &|i| sizes[i]), 3);
        b.note_sent_size(1473);
        assert_eq!(b.cut_after_growth(5, &|i| sizes[i]), 5);
        // Through the send path: the larger datagram goes last in its
        // ring batch (so the failure injected after it finds nothing).
        let dest = rx.local_addr().unwrap();
        let data: Vec<Vec<u8>> = (0..4)
            .map(|i| datagram(i, if i == 1 { 3000 } else { 500 }))
            .collect();
        let ts: Vec<Transmit<'_>> = data.iter().map(|d| Transmit::new(dest, d)).collect();
        let before = tx.state().uring_stats().unwrap().send_enters;
        ring::inject::fail_next(&[0, 0b11]);
        let sent = tx.send(&ts).unwrap();
        // Batch [0, 1] went whole; the next batch failed whole, and
        // the call stopped there: an exact prefix, no hole.
        assert_eq!((sent.transmits, sent.dropped_locally), (2, 0), "{sent:?}");
        assert!(tx.state().uring_stats().unwrap().send_enters >= before + 2);
        let rest = tx.send(&ts[2..]).unwrap();
        assert!(rest.all(2));
        let got: Vec<u32> = arrivals(&rx)
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, [0, 1, 2, 3]);
    }

    /// By default a batch is one linked chain: a failure in the middle
    /// cancels the rest, nothing after it goes, and the call goes on from
    /// there in order; there is never a hole.
    #[test]
    fn a_linked_batch_stops_at_a_failure_in_the_middle() {
        if !ring_here() {
            return;
        }
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let tx = crate::Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            crate::Config::default().uring(true),
        )
        .unwrap();
        let dest = rx.local_addr().unwrap();
        let data: Vec<Vec<u8>> = (0..4).map(|i| datagram(i, 500)).collect();
        let ts: Vec<Transmit<'_>> = data.iter().map(|d| Transmit::new(dest, d)).collect();
        ring::inject::fail_next(&[0b0010, 0b1]);
        let sent = tx.send(&ts).unwrap();
        assert_eq!((sent.transmits, sent.dropped_locally), (1, 0), "{sent:?}");
        assert!(tx.send(&ts[1..]).unwrap().all(3));
        let got: Vec<u32> = arrivals(&rx)
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, [0, 1, 2, 3]);
        let u = tx.state().uring_stats().unwrap();
        assert_eq!((u.holes_resent, u.holes_dropped), (0, 0), "{u:?}");
    }

    #[test]
    fn reconcile_reports_the_last_send_that_went_and_the_holes_before_it() {
        assert_eq!(ring::reconcile(&[1, 1, 1]), (3, 0));
        assert_eq!(ring::reconcile(&[1, 1, -11, -11]), (2, 0));
        assert_eq!(ring::reconcile(&[-11, -11]), (0, 0));
        assert_eq!(ring::reconcile(&[1, -95, 1, -11]), (3, 0b10));
        assert_eq!(ring::reconcile(&[-95, -95, 1]), (3, 0b11));
    }

    /// Failures at the end of an unlinked batch: exactly the prefix before
    /// them went and is reported, as `sendmmsg` reports it; the caller
    /// resumes there and nothing is sent twice.
    #[test]
    fn failures_at_the_end_of_an_unlinked_batch_are_an_exact_prefix() {
        if !ring_here() {
            return;
        }
        let (rx, tx) = pair();
        let dest = rx.local_addr().unwrap();
        let data: Vec<Vec<u8>> = (0..6).map(|i| datagram(i, 500)).collect();
        let ts: Vec<Transmit<'_>> = data.iter().map(|d| Transmit::new(dest, d)).collect();
        // The call goes on after a short batch (as after a short
        // `sendmmsg`): its next batch fails whole, and it stops there.
        ring::inject::fail_next(&[0b111000, 0b111]);
        let sent = tx.send(&ts).unwrap();
        assert_eq!(
            (sent.transmits, sent.datagrams, sent.dropped_locally),
            (3, 0, 0)
        );
        let rest = tx.send(&ts[sent.transmits..]).unwrap();
        assert!(rest.all(3), "{rest:?}");
        let got: Vec<u32> = arrivals(&rx)
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        let u = tx.state().uring_stats().unwrap();
        assert_eq!((u.holes_resent, u.holes_dropped), (0, 0), "{u:?}");
    }

    /// A send in the middle fails and the ones after it go out: the call
    /// resends it at once, alone, and reports the whole batch; every
    /// datagram arrives exactly once (the resent one last).
    #[test]
    fn a_hole_in_an_unlinked_batch_is_resent_and_reported_whole() {
        if !ring_here() {
            return;
        }
        let (sent, got, u, _) = send_with_failures(&[0b0010], 4);
        assert_eq!(
            (sent.transmits, sent.datagrams, sent.dropped_locally),
            (4, 0, 0)
        );
        // The hole really happened: 2 and 3 went before 1 was resent.
        assert_eq!(got, [0, 2, 3, 1]);
        assert_eq!((u.holes_resent, u.holes_dropped), (1, 0), "{u:?}");
        // The first send failing, the rest going: the same.
        let (sent, got, u, _) = send_with_failures(&[0b0001], 3);
        assert!(sent.all(3) && sent.dropped_locally == 0, "{sent:?}");
        assert_eq!(got, [1, 2, 0]);
        assert_eq!(u.holes_resent, 1, "{u:?}");
    }

    /// A hole whose resend fails too: the sends after it are on the wire,
    /// so it is neither reported unsent (the caller would send those
    /// again) nor lost silently: it is a local drop, counted and explained.
    #[test]
    fn a_hole_whose_resend_fails_is_reported_as_dropped() {
        if !ring_here() {
            return;
        }
        let (sent, got, u, st) = send_with_failures(&[0b0010, 0b1], 4);
        assert_eq!(
            (sent.transmits, sent.datagrams, sent.dropped_locally),
            (4, 0, 1)
        );
        assert_eq!(got, [0, 2, 3]);
        assert_eq!((u.holes_resent, u.holes_dropped), (0, 1), "{u:?}");
        assert_eq!(st.dropped_locally, 1);
        assert!(
            st.fallbacks
                .iter()
                .any(|f| f.feature == Feature::Uring && f.reason.contains("1 datagrams")),
            "{:?}",
            st.fallbacks
        );
    }

    /// A hole among GSO trains: the train is resent whole, and every
    /// datagram of every train arrives exactly once.
    #[test]
    fn a_hole_among_gso_trains_is_resent_whole() {
        if !ring_here() {
            return;
        }
        let (rx, tx) = pair();
        let dest = rx.local_addr().unwrap();
        let trains: Vec<Vec<u8>> = (0..3)
            .map(|t| (0..4).flat_map(|d| datagram(t * 4 + d, 500)).collect())
            .collect();
        let ts: Vec<Transmit<'_>> = trains
            .iter()
            .map(|b| Transmit::train(dest, b, 500))
            .collect();
        ring::inject::fail_next(&[0b010]);
        let sent = tx.send(&ts).unwrap();
        assert!(sent.all(3) && sent.dropped_locally == 0, "{sent:?}");
        let mut got: Vec<u32> = arrivals(&rx)
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        assert_eq!(&got[4..8], [8, 9, 10, 11], "train 2 went before train 1");
        got.sort_unstable();
        assert_eq!(got, (0..12).collect::<Vec<_>>());
        assert_eq!(tx.state().uring_stats().unwrap().holes_resent, 1);
    }

    /// Whether `SENDMSG_ZC` runs here; says why not (and fails under
    /// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`) when it does not.
    fn zc_here() -> bool {
        let p = probe();
        if p.zerocopy_ok() {
            return true;
        }
        let why = format!("io_uring SENDMSG_ZC unavailable: {:?}", p.why_not());
        fastudp_test_support::skip(&fastudp_test_support::current_test(), &why);
        false
    }

    /// Train `t` of `n` datagrams of `len` bytes, each numbered.
    fn train(t: u32, n: u32, len: usize) -> Vec<u8> {
        (0..n).flat_map(|d| datagram(t * 100 + d, len)).collect()
    }

    /// A receiver, and a sender with a zerocopy ring and a pool of
    /// `count` buffers of 4 x 1000 bytes.
    fn zc_pair(count: usize) -> (std::net::UdpSocket, crate::Socket, UringZeroCopySender) {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let tx = crate::Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let zc = UringZeroCopySender::new(&tx)
            .unwrap()
            .with_buffers(&tx, count, 4 * 1000)
            .unwrap();
        (rx, tx, zc)
    }

    /// Trains sent from the registered pool arrive byte for byte, each
    /// datagram once, in order; the ring names the socket as its fixed
    /// file and the pool as a fixed buffer where the kernel takes them
    /// (and says why not where it does not).
    #[test]
    fn fixed_buffer_sends_arrive_byte_exact() {
        if !zc_here() {
            return;
        }
        let (rx, tx, mut zc) = zc_pair(4);
        assert!(zc.fixed_file(&tx), "{:?}", tx.stats().fallbacks);
        let fixed_ok = zc.fixed_buffers();
        if !fixed_ok {
            // A kernel before 6.15: the refusal is a recorded fallback.
            assert!(
                tx.stats()
                    .fallbacks
                    .iter()
                    .any(|f| f.reason.contains("FIXED_BUF")),
                "{:?}",
                tx.stats().fallbacks
            );
            eprintln!("this kernel refuses fixed buffers for SENDMSG_ZC: ordinary buffers tested");
        } else if std::env::var_os("FASTUDP_REQUIRE_PRIVILEGED_TESTS").is_some() {
            assert!(uname_at_least(6, 15) || fixed_ok);
        }
        let dest = rx.local_addr().unwrap();
        let trains: Vec<Vec<u8>> = (0..24).map(|t| train(t, 4, 1000)).collect();
        for t in &trains {
            zc.send_with(&tx, dest, t.len(), Some(1000), |b| b.copy_from_slice(t))
                .unwrap();
        }
        // A single datagram, shorter than the buffer.
        let one = datagram(9999, 700);
        zc.send_with(&tx, dest, one.len(), None, |b| b.copy_from_slice(&one))
            .unwrap();
        assert_eq!(zc.drain(Duration::from_secs(5)).unwrap(), 0);
        let got = arrivals(&rx);
        let want: Vec<Vec<u8>> = trains
            .iter()
            .flat_map(|t| t.chunks(1000).map(<[u8]>::to_vec))
            .chain([one])
            .collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "datagrams differ");
        let st = zc.stats();
        assert_eq!((st.sends, st.completions), (25, 25), "{st:?}");
        // Pool buffers never come back as the caller's buffers.
        assert!(zc.pop_done().is_none());
        assert_eq!(zc.ring.pool_free(), 4);
    }

    /// The running kernel is at least `major.minor`.
    fn uname_at_least(major: u32, minor: u32) -> bool {
        let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = r.trim().split(|c: char| !c.is_ascii_digit());
        let a: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let b: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        (a, b) >= (major, minor)
    }

    /// A pool buffer is handed out to be written only when no send holds
    /// it: every buffer written was not in flight at the call, each comes
    /// back to the pool only with its notification (one per send), and
    /// with every buffer held a pool send waits instead of writing. On
    /// loopback the kernel copies at delivery and notifies at once, so
    /// the buffers are held only between a send and its reap here.
    #[test]
    fn a_pool_buffer_is_reused_only_after_its_notification() {
        if !zc_here() {
            return;
        }
        let (rx, tx, mut zc) = zc_pair(2);
        let dest = rx.local_addr().unwrap();
        let mut used = std::collections::HashSet::new();
        for t in 0..200u32 {
            let held = zc.ring.pool_in_flight();
            let mut at = std::ptr::null();
            let data = train(t, 4, 1000);
            zc.send_with(&tx, dest, data.len(), Some(1000), |b| {
                at = b.as_ptr();
                b.copy_from_slice(&data);
            })
            .unwrap();
            let idx = zc.ring.pool_index_of(at).expect("a pool buffer");
            used.insert(idx);
            assert!(!held.contains(&idx), "buffer {idx} written while in flight");
            assert!(zc.ring.pool_in_flight().len() + zc.ring.pool_free() == 2);
            if t % 50 == 0 {
                while rx.recv(&mut [0u8; 2048]).is_ok() {}
            }
        }
        zc.drain(Duration::from_secs(5)).unwrap();
        let st = zc.stats();
        assert_eq!((st.sends, st.completions), (200, 200), "{st:?}");
        assert_eq!(zc.ring.pool_free(), 2);
        assert!(!used.is_empty() && used.len() <= 2, "{used:?}");
    }

    /// Registrations the kernel refuses (injected): the socket is named by
    /// descriptor, the pool is ordinary memory, both refusals are recorded
    /// as fallbacks, and the data still arrives byte for byte.
    #[test]
    fn refused_registrations_fall_back_and_are_recorded() {
        if !zc_here() {
            return;
        }
        ring::inject::refuse_registrations(2);
        let (rx, tx, mut zc) = zc_pair(4);
        assert!(!zc.fixed_file(&tx) && !zc.fixed_buffers());
        let fb = tx.stats().fallbacks;
        let uring: Vec<_> = fb.iter().filter(|f| f.feature == Feature::Uring).collect();
        assert!(
            uring
                .iter()
                .any(|f| f.reason.contains("IORING_REGISTER_FILES"))
                && uring
                    .iter()
                    .any(|f| f.reason.contains("IORING_REGISTER_BUFFERS")
                        && f.errno == Some(libc::EPERM)),
            "{fb:?}"
        );
        let dest = rx.local_addr().unwrap();
        let trains: Vec<Vec<u8>> = (0..8).map(|t| train(t, 4, 1000)).collect();
        for t in &trains {
            zc.send_with(&tx, dest, t.len(), Some(1000), |b| b.copy_from_slice(t))
                .unwrap();
        }
        zc.drain(Duration::from_secs(5)).unwrap();
        let got = arrivals(&rx);
        assert_eq!(got.concat(), trains.concat());
        // A plain buffer through the same ring, too.
        zc.send(&tx, dest, datagram(5, 300), None).unwrap();
        zc.drain(Duration::from_secs(5)).unwrap();
        assert_eq!(arrivals(&rx), [datagram(5, 300)]);
        assert_eq!(zc.pop_done().map(|b| b.len()), Some(300));
    }

    /// A pool send the kernel fails (injected: it refuses MSG_OOB) is
    /// reported as that send's error, its buffer goes back to the pool,
    /// and exactly the sends before and after it arrive.
    #[test]
    fn a_failed_pool_send_is_reported_and_its_buffer_returns() {
        if !zc_here() {
            return;
        }
        let (rx, tx, mut zc) = zc_pair(4);
        let dest = rx.local_addr().unwrap();
        let trains: Vec<Vec<u8>> = (0..5).map(|t| train(t, 4, 1000)).collect();
        ring::inject::fail_next(&[0, 0, 1]);
        let mut results = Vec::new();
        for t in &trains {
            results.push(
                zc.send_with(&tx, dest, t.len(), Some(1000), |b| b.copy_from_slice(t))
                    .map_err(|e| e.to_string()),
            );
        }
        assert!(results[..2].iter().all(Result::is_ok), "{results:?}");
        assert!(results[3..].iter().all(Result::is_ok), "{results:?}");
        let e = results[2].as_ref().unwrap_err();
        assert!(e.contains("not supported") || e.contains("95"), "{e}");
        zc.drain(Duration::from_secs(5)).unwrap();
        assert_eq!(zc.ring.pool_free(), 4);
        let got = arrivals(&rx);
        let want: Vec<u8> = [0, 1, 3, 4]
            .iter()
            .flat_map(|&i| trains[i].clone())
            .collect();
        assert_eq!(got.concat(), want);
        // A pool send larger than a buffer is an error, nothing sent.
        assert!(zc.send_with(&tx, dest, 4001, Some(1000), |_| {}).is_err());
        assert_eq!(zc.ring.pool_free(), 4);
    }

    /// The socket registered as the ring's file is told apart from another
    /// one, even with the same descriptor number.
    #[test]
    fn the_registered_file_names_only_its_own_socket() {
        if !zc_here() {
            return;
        }
        let tx = crate::Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let zc = UringZeroCopySender::new(&tx).unwrap();
        assert!(zc.fixed_file(&tx));
        let other = crate::Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        assert!(!zc.fixed_file(&other));
        // The same descriptor under another state.
        let (std_sock, _) = tx.into_parts();
        let again = crate::Socket::from_std(std_sock, Config::default()).unwrap();
        assert!(!zc.fixed_file(&again));
    }

    /// A state whose ring receive was refused (here: a probe without the
    /// receive's pieces) lends out the scratch batch's messages instead.
    #[test]
    fn borrowed_receive_falls_back_when_the_ring_receive_is_refused() {
        let (sock, mut state) =
            crate::Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default())
                .unwrap()
                .into_parts();
        let sends_only = UringProbe {
            available: true,
            sendmsg: true,
            ..UringProbe::default()
        };
        state.backend = Some(Box::new(
            Backend::with_probe(sock.as_fd(), 4, 1500, &sends_only).unwrap(),
        ));
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(&datagram(7, 300), sock.local_addr().unwrap())
            .unwrap();
        let mut scratch = crate::RecvBatch::new(4);
        let view = state.recv_borrowed(&sock, &mut scratch).unwrap();
        assert!(!view.in_ring());
        assert_eq!(view.len(), 1);
        assert_eq!(view.get(0).unwrap().1, &datagram(7, 300)[..]);
    }
}
