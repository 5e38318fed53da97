//! Set-up: the options fastudp turns on, what it probes, and the state it
//! keeps for one socket (capabilities, fallbacks, counters), apart from the
//! socket itself.

use super::errqueue::ErrorRing;
#[cfg(feature = "uring")]
use crate::backend::{Host, RingBackend, RingParams};
use crate::caps::{self, Capabilities, FeatureSet};
use crate::error::{ConfigError, Error, FallbackEvent, Feature};
use crate::sys;
use crate::wire::consts::*;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a train sent one datagram at a time (GSO off) on a *blocking*
/// socket may wait for buffer space once its first datagram is out, unless
/// [`Config::split_wait`] says otherwise.
pub(crate) const DEFAULT_SPLIT_WAIT: Duration = Duration::from_secs(5);

/// How long GSO stays off after a path refused it, unless
/// [`Config::gso_retry`] says otherwise. Each refusal in a row doubles it,
/// up to 64 s.
pub(crate) const DEFAULT_GSO_RETRY: Duration = Duration::from_secs(1);

/// The longest GSO stays off after refusals in a row.
pub(crate) const MAX_GSO_RETRY: Duration = Duration::from_secs(64);

/// Options applied when fastudp sets up a socket: `Config::default()` and
/// the setters below.
///
/// ```
/// use fastudp_io::{Config, Feature};
/// let config = Config::default()
///     .recv_buffer(8 << 20)
///     .disable(Feature::parse_list("zerocopy")?);
/// # Ok::<(), fastudp_io::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Config {
    pub(crate) gro: bool,
    pub(crate) disabled: FeatureSet,
    pub(crate) recv_buffer: Option<usize>,
    pub(crate) send_buffer: Option<usize>,
    pub(crate) split_wait: Duration,
    pub(crate) gso_retry: Duration,
    pub(crate) may_fragment: bool,
    /// The backend that moves the socket's datagrams instead of the
    /// syscall path, if any: set by [`Config::uring`].
    #[cfg(feature = "uring")]
    pub(crate) backend: Option<crate::backend::BackendChoice>,
    /// Provided receive buffers of the io_uring backend (rounded up to a
    /// power of two). Each holds one message (a GRO train). The default,
    /// 0, sizes the ring from the messages it receives
    /// (`fastudp_io::uring::recv_buffers_for`): 8 buffers for GRO trains, so
    /// that the memory the kernel cycles through (about 1 MiB) stays in
    /// the CPU's cache; 64 for single datagrams, which write only the
    /// first bytes of each.
    #[cfg(feature = "uring")]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    pub uring_recv_buffers: u16,
    /// Submit the io_uring backend's `SENDMSG`s unlinked (default false:
    /// one linked chain per batch). Cheaper in the kernel, but a send that
    /// fails no longer stops the ones after it: such a *hole* is resent
    /// at once, after them, and one whose resend fails too (a full socket
    /// buffer on a non-blocking socket, a datagram over a path MTU that
    /// shrank) is reported as dropped locally rather than as an error.
    /// For protocols that recover losses and reordering themselves (QUIC);
    /// see the `fastudp_io::uring` module.
    #[cfg(feature = "uring")]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    pub uring_unlinked_sends: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            gro: true,
            disabled: FeatureSet::default(),
            recv_buffer: None,
            send_buffer: None,
            split_wait: DEFAULT_SPLIT_WAIT,
            gso_retry: DEFAULT_GSO_RETRY,
            may_fragment: false,
            #[cfg(feature = "uring")]
            backend: None,
            #[cfg(feature = "uring")]
            uring_recv_buffers: 0,
            #[cfg(feature = "uring")]
            uring_unlinked_sends: false,
        }
    }
}

impl Config {
    /// UDP GRO on receive, or not (default true).
    pub fn gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    /// Features to switch off, in addition to those an earlier call
    /// switched off (default none; the library reads no environment
    /// variable): `disable([Feature::Gso, Feature::Ecn])`, or a list
    /// parsed with [`Feature::parse_list`]. A feature switched off is
    /// neither probed nor used, and a call that needs it (a zero-copy
    /// sender, [`crate::UdpIo::enable_txtime`]) fails with
    /// an error of kind [`crate::ErrorKind::Config`]. [`Feature::DontFragment`] is
    /// [`Config::may_fragment`]; [`Feature::RxqOvfl`] and
    /// [`Feature::Recverr`] leave those socket options at the kernel's
    /// default (off).
    pub fn disable(mut self, features: impl IntoIterator<Item = Feature>) -> Self {
        for f in features {
            self.disabled.insert(f);
        }
        self
    }

    /// `SO_RCVBUF` to request, in bytes (default the system's; the kernel
    /// takes at most `i32::MAX`, and a larger request asks for that).
    pub fn recv_buffer(mut self, bytes: usize) -> Self {
        self.recv_buffer = Some(bytes);
        self
    }

    /// `SO_SNDBUF` to request, in bytes (default the system's; at most
    /// `i32::MAX`, as above).
    pub fn send_buffer(mut self, bytes: usize) -> Self {
        self.send_buffer = Some(bytes);
        self
    }

    /// On a *blocking* socket, how long a train sent one datagram at a time
    /// (GSO off) may wait for buffer space once its first datagram is out
    /// (default 5 s). A non-blocking socket never waits.
    /// Any length is taken: one past what an `Instant` holds
    /// (`Duration::MAX`) waits without end.
    pub fn split_wait(mut self, d: Duration) -> Self {
        self.split_wait = d;
        self
    }

    /// How long GSO stays off after a path refused it before it is tried
    /// again (default 1 s, doubling per refusal in a row up to 64 s).
    pub fn gso_retry(mut self, d: Duration) -> Self {
        self.gso_retry = d;
        self
    }

    /// Let the kernel fragment datagrams larger than the path MTU (default
    /// false). When false, fastudp sets `IP_PMTUDISC_PROBE` and
    /// `IPV6_DONTFRAG`: every datagram leaves with don't-fragment set and
    /// the kernel neither fragments nor shrinks it, as datagram path-MTU
    /// discovery (DPLPMTUD, RFC 8899; QUIC) requires.
    pub fn may_fragment(mut self, on: bool) -> Self {
        self.may_fragment = on;
        self
    }

    /// Drive the socket with io_uring (default false): see the `uring`
    /// module. On this platform io_uring does not exist: the socket uses
    /// syscalls and says why in [`Stats::fallbacks`].
    #[cfg(all(feature = "uring", not(target_os = "linux")))]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    pub fn uring(mut self, on: bool) -> Self {
        fn linux_only(
            _: BorrowedFd<'_>,
            _: &crate::backend::RingParams,
        ) -> Result<Box<dyn crate::backend::RingBackend>, FallbackEvent> {
            Err(FallbackEvent {
                feature: Feature::Uring,
                errno: None,
                reason: "io_uring is Linux-only; using syscalls".into(),
            })
        }
        self.backend = on.then_some(crate::backend::BackendChoice {
            name: "uring",
            open: linux_only,
        });
        self
    }

    /// See [`Config::uring_unlinked_sends`](struct.Config.html#structfield.uring_unlinked_sends).
    #[cfg(feature = "uring")]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    pub fn uring_unlinked_sends(mut self, on: bool) -> Self {
        self.uring_unlinked_sends = on;
        self
    }

    /// See [`Config::uring_recv_buffers`](struct.Config.html#structfield.uring_recv_buffers).
    #[cfg(feature = "uring")]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    pub fn uring_recv_buffers(mut self, n: u16) -> Self {
        self.uring_recv_buffers = n;
        self
    }
}

/// Counters and fallback events of one socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// `sendmmsg`/`sendmsg` calls made.
    pub send_calls: u64,
    /// Messages the kernel accepted (a GSO train counts once).
    pub send_messages: u64,
    /// `recvmmsg`/`recvmsg` calls that returned data.
    pub recv_calls: u64,
    /// Messages received (a GRO train counts once).
    pub recv_messages: u64,
    /// Datagrams resent one by one after a GSO send failed.
    pub resent_unsegmented: u64,
    /// Datagrams the local host dropped instead of sending: the kernel
    /// answered `ENOBUFS` because the device's queue (qdisc) was full or it
    /// had no memory for them. Each send call reports its own in
    /// [`crate::Sent::dropped_locally`]; see [`UdpIo::send`](crate::UdpIo::send).
    pub dropped_locally: u64,
    /// Messages received with `MSG_TRUNC`: the buffer was too small and the
    /// tail of the message was lost.
    pub truncated: u64,
    /// Messages received with `MSG_CTRUNC`: some control data was lost.
    pub control_truncated: u64,
    /// Messages received with an ECN mark (ECT(0), ECT(1) or CE).
    pub recv_ecn_marked: u64,
    /// Messages received marked CE (congestion experienced).
    pub recv_ecn_ce: u64,
    /// The kernel's drop counter for this socket (`sk_drops`), in messages
    /// (a GRO train counts once, however many datagrams it held): read
    /// with `SO_MEMINFO` when the stats are taken, or as last reported by
    /// `SO_RXQ_OVFL` on a received message where `SO_MEMINFO` is not
    /// available. A drop after the last received message shows up here,
    /// not in any message.
    pub kernel_drops: u64,
    /// ICMP errors (and other error-queue messages) that interrupted a send
    /// or a receive; fastudp read them into its error queue
    /// ([`UdpIo::recv_error`](crate::UdpIo::recv_error)) and, on an unconnected socket, retried.
    pub async_errors: u64,
    /// Error-queue messages dropped because fastudp's queue of 256 was
    /// full: read them with [`UdpIo::recv_error`](crate::UdpIo::recv_error).
    pub errors_lost: u64,
    /// Times GSO was tried again after a refusal had turned it off.
    pub gso_retries: u64,
    /// The most recent features the socket turned off at run time, and
    /// why: at most 32 events, oldest first. A path
    /// whose GSO refusals come and go records one event per refusal, so
    /// older events are only counted ([`Stats::fallbacks_total`]). Shared:
    /// [`UdpIo::stats`](crate::UdpIo::stats) does not copy them.
    pub fallbacks: Arc<[FallbackEvent]>,
    /// Fallback events recorded since the socket was made, including those
    /// no longer kept in [`Stats::fallbacks`].
    pub fallbacks_total: u64,
}

/// How many recent fallback events a socket keeps ([`Stats::fallbacks`]);
/// older ones are counted in [`Stats::fallbacks_total`] only, so a socket's
/// memory stays bounded however often a path flaps.
pub(crate) const FALLBACK_EVENTS_KEPT: usize = 32;

/// The recent fallback events of a socket and how many there were.
#[derive(Debug, Default)]
struct FallbackLog {
    /// The last 32 events, oldest first; replaced
    /// (copied) on each new event, which is rare, so that a snapshot is
    /// a reference count.
    recent: Arc<[FallbackEvent]>,
    /// Events recorded so far.
    total: u64,
}

/// What fastudp knows and keeps about one UDP socket: capabilities,
/// fallbacks, counters and error-queue messages. It does not own the
/// socket: paired with the caller's socket as `(&state, &socket)` (a
/// `std::net::UdpSocket`, a `tokio::net::UdpSocket`, a raw fd), it makes
/// the [`crate::UdpIo`] calls, so the same core serves any runtime. Use the same state with the same socket
/// it was created for.
///
/// All methods take `&self`; one state can be shared by threads.
///
/// ```no_run
/// use fastudp_io::{Config, RecvBatch, Transmit, UdpIo, UdpState};
/// use std::net::UdpSocket;
///
/// let sock = UdpSocket::bind("127.0.0.1:0")?;
/// sock.set_nonblocking(true)?;
/// let state = UdpState::new(&sock, Config::default())?;
/// let io = (&state, &sock); // the socket with its state: the `UdpIo` calls
/// let to = "127.0.0.1:4433".parse().unwrap();
/// let payload = vec![1u8; 10 * 1200];
/// let mut ts = vec![Transmit::train(to, &payload, 1200)];
/// let mut k = 0;
/// while k < ts.len() {
///     match io.send(&ts[k..]) {
///         Ok(sent) => {
///             // Datagrams a full local queue dropped are done too
///             // (`sent.dropped_locally`): they are not sent again.
///             k += sent.transmits;
///             if sent.datagrams > 0 {
///                 // A train sent one datagram at a time stopped part-way.
///                 ts[k] = ts[k].skip_datagrams(sent.datagrams);
///             }
///         }
///         // Never a wait inside the library: wait for writability here.
///         Err(e) if e.is_would_block() => break,
///         Err(e) => return Err(e.into()),
///     }
/// }
/// let mut batch = RecvBatch::new(32);
/// match io.recv(&mut batch) {
///     Ok(n) => println!("{n} messages"),
///     Err(e) if e.is_would_block() => {}
///     Err(e) => return Err(e.into()),
/// }
/// while let Some(err) = io.recv_error()? {
///     println!("{err}"); // port unreachable, packet too big, ...
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct UdpState {
    pub(super) ipv6: bool,
    pub(super) caps: Capabilities,
    pub(super) split_wait: Duration,
    gso_retry: Duration,
    /// GSO now, per address family of the destination (IPv4, IPv6): a
    /// path may refuse GSO for one family only (older virtio for IPv6).
    gso: [GsoNow; 2],
    /// Trains whose last datagram is shorter than the rest were refused
    /// while uniform ones were not (a Linux 6.6.44 regression): such
    /// trains go one datagram at a time, and GSO stays on.
    pub(super) short_tail_refused: AtomicBool,
    pub(super) ecn: AtomicBool,
    pub(super) txtime: AtomicBool,
    pub(super) c: Counters,
    fallbacks: Mutex<FallbackLog>,
    pub(super) errors: Mutex<ErrorRing>,
    /// The backend that sends and receives instead of the syscall path,
    /// when the config chose one and it could be opened.
    #[cfg(feature = "uring")]
    pub(crate) backend: Option<Box<dyn RingBackend>>,
    /// Unique in the process: tells this state from another one that
    /// got the same descriptor number later (a ring's registered file).
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub(crate) id: u64,
}

/// The next [`UdpState`] id.
#[cfg(all(feature = "uring", target_os = "linux"))]
static NEXT_STATE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The counters behind [`Stats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub send_calls: AtomicU64,
    pub send_messages: AtomicU64,
    pub recv_calls: AtomicU64,
    pub recv_messages: AtomicU64,
    pub resent: AtomicU64,
    pub dropped_locally: AtomicU64,
    pub truncated: AtomicU64,
    pub ctruncated: AtomicU64,
    pub ecn_marked: AtomicU64,
    pub ecn_ce: AtomicU64,
    pub drops: AtomicU64,
    pub async_errors: AtomicU64,
    pub gso_retries: AtomicU64,
}

fn setup(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::from(crate::error::Detail::Setup { what, source })
}

impl UdpState {
    /// Sets up the caller's bound UDP socket and probes what it supports:
    /// GRO, ECN, PKTINFO, `SO_RXQ_OVFL`, `IP_RECVERR`/`IPV6_RECVERR`,
    /// don't-fragment (unless [`Config::may_fragment`]) and the buffer
    /// sizes asked for. The socket may be blocking or not; fastudp never
    /// changes that.
    pub fn new(sock: impl AsFd, config: Config) -> Result<Self, Error> {
        let fd = sock.as_fd();
        let sref = socket2::SockRef::from(&fd);
        let ipv6 = sref
            .local_addr()
            .map_err(setup("getsockname"))?
            .as_socket()
            .ok_or_else(|| {
                Error::from(crate::error::Detail::Setup {
                    what: "getsockname",
                    source: io::Error::new(io::ErrorKind::InvalidInput, "not an IP socket"),
                })
            })?
            .is_ipv6();
        set_buffers(&sref, &config)?;
        let caps = probe_capabilities(fd.as_raw_fd(), ipv6, &config)?;
        let (max_gso_segments, ecn) = (caps.max_gso_segments, caps.supports(Feature::Ecn));
        let state = UdpState {
            ipv6,
            caps,
            split_wait: config.split_wait,
            gso_retry: config.gso_retry,
            gso: [GsoNow::new(max_gso_segments), GsoNow::new(max_gso_segments)],
            short_tail_refused: AtomicBool::new(false),
            ecn: AtomicBool::new(ecn),
            txtime: AtomicBool::new(false),
            c: Counters::default(),
            fallbacks: Mutex::new(FallbackLog::default()),
            errors: Mutex::new(ErrorRing::default()),
            #[cfg(feature = "uring")]
            backend: None,
            #[cfg(all(feature = "uring", target_os = "linux"))]
            id: NEXT_STATE_ID.fetch_add(1, Relaxed),
        };
        #[cfg(feature = "uring")]
        let state = state.with_backend(fd, &config);
        Ok(state)
    }

    /// Opens the backend the config chose, if any, or records why it
    /// cannot be used (the socket then uses syscalls).
    #[cfg(feature = "uring")]
    fn with_backend(mut self, fd: BorrowedFd<'_>, config: &Config) -> Self {
        let Some(choice) = config
            .backend
            .filter(|_| !config.disabled.contains(Feature::Uring))
        else {
            return self;
        };
        let params = RingParams {
            gro: self.caps.supports(Feature::Gro),
            recv_buffers: config.uring_recv_buffers,
            unlinked: config.uring_unlinked_sends,
        };
        match (choice.open)(fd, &params) {
            Ok(b) => self.backend = Some(b),
            Err(ev) => self.record(ev.feature, ev.errno, ev.reason),
        }
        self
    }

    /// Takes the io_uring backend down, if there is one, for a wrapper
    /// that waits on the socket's own readiness (tokio's reactor), which
    /// a ring receive would never make readable; records why.
    #[cfg(all(feature = "uring", feature = "tokio"))]
    pub(crate) fn without_uring(mut self, wrapper: &str) -> Self {
        if self.backend.take().is_some() {
            self.record(
                Feature::Uring,
                None,
                format!("the io_uring backend does not run under {wrapper}, which waits on the socket's readiness; using syscalls"),
            );
        }
        self
    }

    /// The backend for socket `fd`, when this state has one for it.
    #[cfg(feature = "uring")]
    pub(crate) fn backend_for(&self, fd: BorrowedFd<'_>) -> Option<&dyn RingBackend> {
        self.backend.as_deref().filter(|b| b.for_fd(fd))
    }

    /// What was probed when the socket was set up, and what the user
    /// switched off; [`Feature::Ecn`] turns false after an ECN fallback,
    /// and [`Feature::Uring`](Feature) is true while the io_uring backend
    /// runs.
    pub fn capabilities(&self) -> Capabilities {
        let mut c = self.caps;
        c.supported.set(Feature::Ecn, self.ecn.load(Relaxed));
        #[cfg(feature = "uring")]
        c.supported.set(Feature::Uring, self.backend.is_some());
        c
    }

    /// GSO segments per send now: the probed maximum, or 1 while GSO is
    /// off after a path refused it (until [`Config::gso_retry`] passes).
    /// GSO is kept per address family: this is the smaller of the two (see
    /// [`UdpState::max_gso_segments_to`]).
    pub fn max_gso_segments(&self) -> usize {
        self.gso_now(0).min(self.gso_now(1))
    }

    /// GSO segments per send to `dest` now: GSO may be off for IPv6
    /// destinations only (or IPv4 ones only) after a refusal.
    pub fn max_gso_segments_to(&self, dest: &SocketAddr) -> usize {
        self.gso_now(family(dest))
    }

    /// GSO segments for address family `f` (0: IPv4, 1: IPv6), turning
    /// GSO back on when its retry time has come.
    fn gso_now(&self, f: usize) -> usize {
        let g = &self.gso[f];
        let now = g.segments.load(Relaxed);
        if now > 1 || self.caps.max_gso_segments <= 1 {
            return now;
        }
        let until = g.off_until.load(Relaxed);
        if until != 0
            && sys::monotonic_ns() >= until
            && g.off_until
                .compare_exchange(until, 0, Relaxed, Relaxed)
                .is_ok()
        {
            g.segments.store(self.caps.max_gso_segments, Relaxed);
            self.c.gso_retries.fetch_add(1, Relaxed);
        }
        g.segments.load(Relaxed)
    }

    /// The most datagrams one [`crate::RecvMeta`] can hold: 64
    /// (`UDP_GRO_CNT_MAX`) with GRO, else 1.
    pub fn max_receive_segments(&self) -> usize {
        if self.caps.supports(Feature::Gro) {
            crate::wire::GRO_MAX_SEGMENTS
        } else {
            1
        }
    }

    /// The kernel's count of messages this socket dropped (`sk_drops`;
    /// a dropped GRO train counts once, however many datagrams it held),
    /// read now with `SO_MEMINFO`, or as last reported by `SO_RXQ_OVFL` on a
    /// received message where `SO_MEMINFO` is not available. A drop after
    /// the last received message shows up here, not in any message.
    pub(crate) fn kernel_drops(&self, sock: impl AsFd) -> u64 {
        let now = sys::socket_drops(sock.as_fd().as_raw_fd())
            .map(u64::from)
            .unwrap_or(0);
        now.max(self.c.drops.load(Relaxed))
    }

    /// Turns on `SO_TXTIME` on `sock` (see [`crate::UdpIo::enable_txtime`]).
    pub(crate) fn enable_txtime_on(
        &self,
        sock: impl AsFd,
        report_errors: bool,
    ) -> Result<(), Error> {
        if self.caps.is_disabled(Feature::Txtime) {
            return Err(ConfigError::SwitchedOff(Feature::Txtime).into());
        }
        let flags = if report_errors { 2 } else { 0 }; // SOF_TXTIME_REPORT_ERRORS
        sys::set_txtime(sock.as_fd().as_raw_fd(), libc::CLOCK_MONOTONIC, flags)
            .map_err(setup("SO_TXTIME"))?;
        self.txtime.store(true, Relaxed);
        Ok(())
    }

    /// Sets `SO_MAX_PACING_RATE` on `sock` (see
    /// [`crate::UdpIo::set_max_pacing_rate`]).
    pub(crate) fn set_max_pacing_rate_on(
        &self,
        sock: impl AsFd,
        bytes_per_sec: u64,
    ) -> Result<(), Error> {
        let fd = sock.as_fd();
        if !is_connected(fd) {
            return Err(ConfigError::NotConnected.into());
        }
        if bytes_per_sec == 0 {
            return Err(ConfigError::ZeroRate.into());
        }
        sys::setsockopt_bytes(
            fd.as_raw_fd(),
            SOL_SOCKET,
            sys::SO_MAX_PACING_RATE,
            &bytes_per_sec.to_ne_bytes(),
        )
        .map_err(setup("SO_MAX_PACING_RATE"))
    }

    /// Error-queue messages read so far (the `async_errors` counter), for
    /// wrappers that wake a task waiting on the error queue.
    #[cfg(feature = "tokio")]
    pub(crate) fn async_error_count(&self) -> u64 {
        self.c.async_errors.load(Relaxed)
    }

    /// Counters and fallback events (see [`crate::UdpIo::stats`]).
    pub(crate) fn stats_on(&self, sock: impl AsFd) -> Stats {
        let (fallbacks, fallbacks_total) = {
            let log = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
            (log.recent.clone(), log.total)
        };
        Stats {
            send_calls: self.c.send_calls.load(Relaxed),
            send_messages: self.c.send_messages.load(Relaxed),
            recv_calls: self.c.recv_calls.load(Relaxed),
            recv_messages: self.c.recv_messages.load(Relaxed),
            resent_unsegmented: self.c.resent.load(Relaxed),
            dropped_locally: self.c.dropped_locally.load(Relaxed),
            truncated: self.c.truncated.load(Relaxed),
            control_truncated: self.c.ctruncated.load(Relaxed),
            recv_ecn_marked: self.c.ecn_marked.load(Relaxed),
            recv_ecn_ce: self.c.ecn_ce.load(Relaxed),
            kernel_drops: self.kernel_drops(sock),
            async_errors: self.c.async_errors.load(Relaxed),
            errors_lost: self.errors.lock().map(|r| r.lost()).unwrap_or(0),
            gso_retries: self.c.gso_retries.load(Relaxed),
            fallbacks,
            fallbacks_total,
        }
    }

    /// The largest payload of one send to `dest` (65507 for IPv4
    /// destinations, including v4-mapped ones; 65527 for IPv6).
    pub(crate) fn max_payload_to(&self, dest: &SocketAddr) -> usize {
        crate::wire::max_payload(!is_v4_dest(dest))
    }

    pub(crate) fn record(&self, feature: Feature, errno: Option<i32>, reason: String) {
        let mut log = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
        let keep = log.recent.len().min(FALLBACK_EVENTS_KEPT - 1);
        let from = log.recent.len() - keep;
        let ev = FallbackEvent {
            feature,
            errno,
            reason,
        };
        log.recent = log.recent[from..]
            .iter()
            .cloned()
            .chain(std::iter::once(ev))
            .collect();
        log.total += 1;
    }

    /// Turns GSO off for `dest`'s address family after `dest` refused it,
    /// for [`Config::gso_retry`] doubled per refusal in a row.
    pub(super) fn disable_gso(&self, e: &io::Error, dest: &SocketAddr) {
        let g = &self.gso[family(dest)];
        if g.segments.swap(1, Relaxed) > 1 {
            let n = g.refusals.fetch_add(1, Relaxed).min(16) as u32;
            let wait = self
                .gso_retry
                .saturating_mul(1 << n.min(6))
                .min(MAX_GSO_RETRY.max(self.gso_retry));
            let until = sys::monotonic_ns()
                .saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX))
                .max(1);
            g.off_until.store(until, Relaxed);
            let fam = if family(dest) == 0 { "IPv4" } else { "IPv6" };
            self.record(
                Feature::Gso,
                e.raw_os_error(),
                format!("GSO send to {dest} failed ({e}); datagrams to {fam} destinations go one by one, and GSO is tried again in {wait:?}"),
            );
        }
    }

    /// A train whose last datagram is shorter was refused: such trains go
    /// one datagram at a time from now on, and GSO stays on for uniform
    /// ones (if those are refused too, GSO goes off as usual).
    pub(super) fn disable_short_tail(&self, e: &io::Error, dest: &SocketAddr) {
        if !self.short_tail_refused.swap(true, Relaxed) {
            self.record(
                Feature::Gso,
                e.raw_os_error(),
                format!("a GSO train to {dest} whose last datagram is shorter than the rest was refused ({e}); such trains go one datagram at a time, uniform trains keep GSO"),
            );
        }
    }

    /// A GSO train to `dest` went out whole: refusals are no longer in a
    /// row.
    pub(super) fn gso_worked(&self, dest: &SocketAddr) {
        let g = &self.gso[family(dest)];
        if g.refusals.load(Relaxed) != 0 {
            g.refusals.store(0, Relaxed);
        }
    }

    pub(super) fn disable_ecn(&self, e: &io::Error, dest: &SocketAddr) {
        if self.ecn.swap(false, Relaxed) {
            self.record(
                Feature::Ecn,
                e.raw_os_error(),
                format!("send with an ECN mark to {dest} failed ({e}); ECN marks are off for this socket"),
            );
        }
    }
}

/// GSO's state for one address family.
#[derive(Debug)]
struct GsoNow {
    /// Segments per send now (1: off).
    segments: AtomicUsize,
    /// When GSO may be tried again (`CLOCK_MONOTONIC` ns), 0 while on.
    off_until: AtomicU64,
    /// Refusals in a row, for the back-off.
    refusals: AtomicU64,
}

impl GsoNow {
    fn new(segments: usize) -> Self {
        GsoNow {
            segments: AtomicUsize::new(segments),
            off_until: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        }
    }
}

/// 0 for an IPv4 destination (native or v4-mapped), 1 for IPv6.
fn family(dest: &SocketAddr) -> usize {
    usize::from(!is_v4_dest(dest))
}

/// True when the socket has a peer (`getpeername` succeeds).
pub(super) fn is_connected(fd: BorrowedFd<'_>) -> bool {
    socket2::SockRef::from(&fd).peer_addr().is_ok()
}

/// Asks for the buffer sizes in `config` (`SO_RCVBUF`, `SO_SNDBUF`, and
/// their FORCE variants past the system's cap where allowed).
fn set_buffers(sref: &socket2::SockRef<'_>, config: &Config) -> Result<(), Error> {
    let raw = sref.as_raw_fd();
    // SO_RCVBUF/SO_SNDBUF are capped at net.core.rmem_max/wmem_max; with
    // CAP_NET_ADMIN the FORCE variants go past the cap.
    // The kernel's type is an int: a larger request asks for the most
    // it takes, never for its low 32 bits.
    let int = |n: usize| n.min(i32::MAX as usize);
    if let Some(n) = config.recv_buffer.map(int) {
        sref.set_recv_buffer_size(n).map_err(setup("SO_RCVBUF"))?;
        force_buffer(raw, sref.recv_buffer_size(), n, sys::SO_RCVBUFFORCE);
    }
    if let Some(n) = config.send_buffer.map(int) {
        sref.set_send_buffer_size(n).map_err(setup("SO_SNDBUF"))?;
        force_buffer(raw, sref.send_buffer_size(), n, sys::SO_SNDBUFFORCE);
    }
    Ok(())
}

/// Turns on what the socket should use (GRO, ECN and PKTINFO reporting,
/// `SO_RXQ_OVFL`, `IP_RECVERR`, don't-fragment) and probes what it
/// accepts, less what `config` switches off.
fn probe_capabilities(raw: RawFd, ipv6: bool, config: &Config) -> Result<Capabilities, Error> {
    let mut disabled = config.disabled;
    if config.may_fragment {
        disabled.insert(Feature::DontFragment);
    }
    let off = |f| disabled.contains(f);
    let linux = cfg!(any(target_os = "linux", target_os = "android"));
    let on = |level, name| sys::setsockopt_int(raw, level, name, 1).is_ok();
    // An option for each family a dual-stack socket serves: the IPv6
    // one decides, the IPv4 one covers v4-mapped peers.
    let both = |v4: (i32, i32, i32), v6: (i32, i32, i32)| {
        if ipv6 {
            let ok = sys::setsockopt_int(raw, v6.0, v6.1, v6.2).is_ok();
            let _ = sys::setsockopt_int(raw, v4.0, v4.1, v4.2);
            ok
        } else {
            sys::setsockopt_int(raw, v4.0, v4.1, v4.2).is_ok()
        }
    };

    // GSO: the option must be accepted; reset it to 0 so that sends
    // without a cmsg are never segmented.
    let kernel_max = caps::kernel_max_segments();
    let gso_ok = sys::setsockopt_int(raw, SOL_UDP, UDP_SEGMENT, 1472).is_ok();
    if gso_ok {
        sys::setsockopt_int(raw, SOL_UDP, UDP_SEGMENT, 0).map_err(setup("UDP_SEGMENT reset"))?;
    }
    let max_gso_segments = if gso_ok && !off(Feature::Gso) && kernel_max > 1 {
        kernel_max
    } else {
        1
    };
    let gro = config.gro && !off(Feature::Gro) && on(SOL_UDP, UDP_GRO);
    let ecn = !off(Feature::Ecn) && both((SOL_IP, IP_RECVTOS, 1), (SOL_IPV6, IPV6_RECVTCLASS, 1));
    let pktinfo =
        !off(Feature::Pktinfo) && both((SOL_IP, IP_PKTINFO, 1), (SOL_IPV6, IPV6_RECVPKTINFO, 1));
    let rxq_ovfl = !off(Feature::RxqOvfl) && on(SOL_SOCKET, SO_RXQ_OVFL);
    let recverr =
        !off(Feature::Recverr) && both((SOL_IP, IP_RECVERR, 1), (SOL_IPV6, IPV6_RECVERR, 1));
    let dont_fragment = !off(Feature::DontFragment) && {
        let probe = both(
            (SOL_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE),
            (SOL_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE),
        );
        let df = !ipv6 || sys::setsockopt_int(raw, SOL_IPV6, IPV6_DONTFRAG, 1).is_ok();
        probe && df
    };
    let (zc, txtime) = caps::zerocopy_and_txtime();
    let mut supported = FeatureSet::default();
    for (f, yes) in [
        (Feature::Gso, max_gso_segments > 1),
        (Feature::Gro, gro),
        (Feature::Mmsg, linux && !off(Feature::Mmsg)),
        (Feature::Ecn, ecn),
        (Feature::Pktinfo, pktinfo),
        (Feature::Zerocopy, zc && !off(Feature::Zerocopy)),
        (Feature::Txtime, txtime && !off(Feature::Txtime)),
        (Feature::RxqOvfl, rxq_ovfl),
        (Feature::Recverr, recverr),
        (Feature::DontFragment, dont_fragment),
    ] {
        supported.set(f, yes);
    }
    Ok(Capabilities {
        max_gso_segments,
        kernel_max_segments: kernel_max.max(1),
        supported,
        disabled,
    })
}

/// Asks for `want` bytes with a FORCE option when the plain one was capped
/// (`got` below `want`); best effort, as it needs CAP_NET_ADMIN.
fn force_buffer(fd: RawFd, got: io::Result<usize>, want: usize, force: i32) {
    if got.unwrap_or(want) < want {
        let _ = sys::setsockopt_int(fd, SOL_SOCKET, force, want.min(i32::MAX as usize) as i32);
    }
}

/// True for an IPv4 destination, native or v4-mapped.
pub(super) fn is_v4_dest(d: &SocketAddr) -> bool {
    match d {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
    }
}

#[cfg(feature = "uring")]
impl Host for UdpState {
    fn record(&self, feature: Feature, errno: Option<i32>, reason: String) {
        UdpState::record(self, feature, errno, reason);
    }

    fn count_recv(&self, messages: usize) {
        self.c.recv_calls.fetch_add(1, Relaxed);
        self.c.recv_messages.fetch_add(messages as u64, Relaxed);
    }

    fn absorb_async_error(&self, fd: BorrowedFd<'_>, e: &io::Error) -> bool {
        UdpState::absorb_async_error(self, fd, e)
    }
}
