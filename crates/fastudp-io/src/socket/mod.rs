//! The batched UDP socket: [`UdpState`], the core that works on any UDP
//! socket the caller owns, and [`Socket`], the easy way in, which owns its
//! socket and calls the core.
//!
//! The parts: [`state`] sets a socket up and keeps what fastudp knows of
//! it; [`send`] and [`recv`] are the two paths; [`errqueue`] reads the
//! error queue.

pub(crate) mod errqueue;
pub(crate) mod recv;
pub(crate) mod send;
pub(crate) mod state;

#[cfg(all(feature = "uring", target_os = "linux"))]
pub(crate) use recv::DEFAULT_MESSAGE_CAPACITY;
pub use recv::{RecvBatch, RecvMeta};
pub use send::Sent;
pub use state::{Config, Stats, UdpState};

use crate::error::Error;
use crate::wire::control::EcnCodepoint;
use crate::wire::plan;
use errqueue::SocketError;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// One send: a payload to a destination, optionally a GSO train.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Transmit<'a> {
    /// Where the datagrams go.
    pub destination: SocketAddr,
    /// The payload. With a `segment_size`, several datagrams laid end to end.
    pub contents: &'a [u8],
    /// Bytes per datagram of a train; the last may be shorter. `None` (or a
    /// size not smaller than `contents`) sends one datagram.
    pub segment_size: Option<usize>,
    pub(crate) ecn: Option<EcnCodepoint>,
    pub(crate) src_ip: Option<IpAddr>,
    pub(crate) txtime: Option<u64>,
}

impl<'a> Transmit<'a> {
    /// One datagram to `destination`.
    pub fn new(destination: SocketAddr, contents: &'a [u8]) -> Self {
        Transmit {
            destination,
            contents,
            segment_size: None,
            ecn: None,
            src_ip: None,
            txtime: None,
        }
    }

    /// A GSO train of `segment_size`-byte datagrams.
    pub fn train(destination: SocketAddr, contents: &'a [u8], segment_size: usize) -> Self {
        Transmit {
            segment_size: Some(segment_size),
            ..Transmit::new(destination, contents)
        }
    }

    /// With an ECN codepoint on every datagram of this transmit (default
    /// none: Not-ECT).
    pub fn with_ecn(self, ecn: Option<EcnCodepoint>) -> Self {
        Transmit { ecn, ..self }
    }

    /// Sent from this source address (`IP_PKTINFO` / `IPV6_PKTINFO`;
    /// default none: the kernel picks).
    pub fn with_src_ip(self, src_ip: Option<IpAddr>) -> Self {
        Transmit { src_ip, ..self }
    }

    /// With an earliest departure time, in ns of `CLOCK_MONOTONIC`
    /// (`SCM_TXTIME`; see [`UdpIo::enable_txtime`]). Every segment of a
    /// train shares it.
    pub fn with_txtime(self, txtime: Option<u64>) -> Self {
        Transmit { txtime, ..self }
    }

    /// How many datagrams this transmit carries.
    pub fn segments(&self) -> usize {
        plan::segments(self.contents.len(), self.segment_size)
    }

    /// The rest of this transmit after its first `n` datagrams: what to
    /// send again after a [`Sent`] with `datagrams == n`.
    pub fn skip_datagrams(&self, n: usize) -> Transmit<'a> {
        let seg = match self.segment_size {
            Some(s) if s > 0 => s,
            _ => self.contents.len().max(1),
        };
        let at = n.saturating_mul(seg).min(self.contents.len());
        Transmit {
            contents: &self.contents[at..],
            ..*self
        }
    }
}

/// A UDP socket that sends and receives batches of datagrams with
/// sendmmsg/recvmmsg, GSO and GRO, and falls back at run time without
/// losing a datagram: a `std::net::UdpSocket` with its [`UdpState`].
///
/// All methods take `&self`; one socket can be shared by threads.
#[derive(Debug)]
pub struct Socket {
    inner: UdpSocket,
    state: UdpState,
}

/// A new, unbound UDP socket of `addr`'s family; IPv6 ones are dual-stack
/// where the system allows it.
pub(crate) fn new_udp(addr: SocketAddr) -> Result<socket2::Socket, Error> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))
        .map_err(|e| {
            Error::from(crate::error::Detail::Setup {
                what: "socket",
                source: e,
            })
        })?;
    if addr.is_ipv6() {
        // Best effort: some systems forbid dual-stack sockets.
        let _ = s.set_only_v6(false);
    }
    Ok(s)
}

/// A new UDP socket bound at `addr` (dual-stack for an IPv6 wildcard).
pub(crate) fn bind_udp(addr: SocketAddr) -> Result<UdpSocket, Error> {
    let s = new_udp(addr)?;
    s.bind(&addr.into())
        .map_err(|e| Error::from(crate::error::Detail::Bind { addr, source: e }))?;
    Ok(s.into())
}

impl Socket {
    /// Binds a new socket at `addr` and sets it up with `config`
    /// (`Config::default()` for the defaults). An IPv6 wildcard address
    /// gives a dual-stack socket that also serves IPv4 peers (as v4-mapped
    /// addresses).
    pub fn bind(addr: SocketAddr, config: Config) -> Result<Self, Error> {
        Self::from_std(bind_udp(addr)?, config)
    }

    /// Takes an existing bound socket, probes what it supports and sets it
    /// up with `config` ([`UdpState::new`]). Blocking or not, as it is.
    pub fn from_std(sock: UdpSocket, config: Config) -> Result<Self, Error> {
        let state = UdpState::new(&sock, config)?;
        Ok(Socket { inner: sock, state })
    }

    /// The wrapped standard socket: its local address, timeouts,
    /// non-blocking mode.
    pub fn as_std(&self) -> &UdpSocket {
        &self.inner
    }

    /// Takes the standard socket and its state apart.
    pub fn into_parts(self) -> (UdpSocket, UdpState) {
        (self.inner, self.state)
    }

    /// The socket, and its state to change.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub(crate) fn parts_mut(&mut self) -> (&UdpSocket, &mut UdpState) {
        (&self.inner, &mut self.state)
    }
}

/// A UDP socket together with its fastudp state: the batched calls.
///
/// [`Socket`], `tokio::UdpSocket` and `quinn::Socket`
/// are one; a caller's own socket is one when paired with its state as
/// `(&state, &socket)`, for any `socket` with a file descriptor (std,
/// tokio, mio, a raw fd). [`crate::Coalescer`] and
/// [`crate::ZeroCopySender`] send on any of them. Import the trait to
/// call its methods: `use fastudp_io::UdpIo;`.
///
/// Every call works on the socket as it is, blocking or not, and never
/// changes that. On `tokio::UdpSocket`, the inherent `async`
/// methods of the same names (`send`, `recv`, `recv_error`) take
/// precedence and wait on tokio's reactor; these ones, called as
/// `UdpIo::send(&socket, ..)`, are single non-blocking attempts that
/// return `WouldBlock` when the socket is not ready.
///
/// ```
/// use fastudp_io::{Config, RecvBatch, Transmit, UdpIo, UdpState};
///
/// // A socket of one's own, with its state beside it.
/// let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
/// let state = UdpState::new(&sock, Config::default())?;
/// let io = (&state, &sock);
/// let to = sock.local_addr()?; // to itself
/// assert!(io.send(&[Transmit::new(to, b"hello")])?.all(1));
/// let mut batch = RecvBatch::new(8);
/// assert_eq!(io.recv(&mut batch)?, 1);
/// assert_eq!(io.stats().send_calls, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait UdpIo {
    /// The state.
    fn state(&self) -> &UdpState;
    /// The socket's descriptor.
    fn fd(&self) -> BorrowedFd<'_>;

    /// Sends the transmits in order, in as few syscalls as the features
    /// allow, on the socket (blocking or not).
    ///
    /// Returns what went out ([`Sent`]): fewer than all when the kernel
    /// stopped early (`EAGAIN` on a non-blocking socket, or an error on the
    /// next transmit, which the next call reports). The caller resumes from
    /// there, and nothing is ever sent twice. An error means nothing was
    /// sent.
    ///
    /// A full local queue is not an error. fastudp sets `IP_RECVERR`, with
    /// which the kernel reports a datagram that the device's qdisc dropped
    /// (or had no memory for) as `ENOBUFS`; without it, the kernel would
    /// count the drop and return success. `send` does as the kernel would:
    /// the dropped datagrams count as done, are reported in
    /// [`Sent::dropped_locally`] and [`crate::Stats::dropped_locally`], and the
    /// call goes on with the next transmit. So a burst larger than the
    /// queue never fails the call; what did not fit is reported dropped,
    /// and `sent + dropped_locally` is what was offered. A GSO train that
    /// the queue drops as a whole counts all its datagrams dropped; a queue
    /// that splits the train and keeps some (tbf does) returns success,
    /// and its own drops are the qdisc's statistics, as they would be
    /// without `IP_RECVERR`. Blocking or not, the call never waits for a
    /// full qdisc: that is back-pressure for the caller's pacing, not for
    /// the socket buffer.
    ///
    /// Every transmit is checked before any is sent: an oversized payload,
    /// a zero segment size or a train over the kernel's segment limit is an
    /// error that names the transmit. A GSO send the path refuses (`EIO` or
    /// `EINVAL`) is resent one datagram at a time at once, and GSO stays off
    /// for [`crate::Config::gso_retry`]; an ECN mark that is refused is
    /// dropped and the send retried. Both are reported in
    /// [`UdpIo::stats`].
    ///
    /// On a non-blocking socket no call waits, polls or sleeps. On a
    /// blocking socket a train split into datagrams waits for buffer space
    /// up to [`crate::Config::split_wait`], so that it is not left half
    /// sent. `EINTR` is retried.
    fn send(&self, transmits: &[Transmit<'_>]) -> Result<Sent, Error> {
        self.state().send_on(self.fd(), transmits)
    }

    /// Receives a batch of messages into `batch`
    /// and returns how many.
    ///
    /// On a blocking socket, waits until at least one message is there,
    /// then takes what else is queued without waiting; on a non-blocking
    /// one, returns `WouldBlock` when nothing is queued. With GRO, one
    /// message may hold many datagrams: see [`RecvMeta::datagrams`].
    /// Truncated messages are flagged in their [`RecvMeta`] and counted.
    ///
    /// An ICMP error for an earlier send makes the kernel fail the next
    /// receive; on an unconnected socket fastudp reads it into its error
    /// queue ([`UdpIo::recv_error`]) and receives again, on a connected
    /// one it returns the error (such as `ECONNREFUSED`: the peer went
    /// away). `EINTR` is retried.
    fn recv(&self, batch: &mut RecvBatch) -> Result<usize, Error> {
        self.state().recv_on(self.fd(), batch)
    }

    /// Receives into buffers the caller owns, as quinn and other stacks
    /// hold them: message `i` into `bufs[i]` and its metadata into
    /// `meta[i]`, for up to `bufs.len().min(meta.len())` messages (at most
    /// 128); returns how many.
    ///
    /// The same receive as [`UdpIo::recv`] (waiting, errors, GRO,
    /// truncation and counters), without a [`RecvBatch`]: names and control
    /// data live on the stack, and nothing is allocated. A buffer should
    /// hold [`UdpState::max_receive_segments`] datagrams of the largest
    /// size expected, or GRO trains are truncated (flagged and counted).
    fn recv_slices(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Result<usize, Error> {
        self.state().recv_slices_on(self.fd(), bufs, meta)
    }

    /// The next message from the socket's error queue, without waiting:
    /// those fastudp already read on the caller's behalf first, then the
    /// kernel's. `None` when both are empty.
    ///
    /// Port and host unreachable come with the destination that refused;
    /// "fragmentation needed" and "packet too big" with the MTU;
    /// `SCM_TXTIME` drops with their departure time; zerocopy completions
    /// as ranges. A [`crate::ZeroCopySender`] on this socket keeps its own
    /// completions and leaves every other message here.
    fn recv_error(&self) -> Result<Option<SocketError>, Error> {
        self.state().recv_error_on(self.fd())
    }

    /// Counters and fallback events so far, with the kernel's drop
    /// counter read now. Cheap: the recent fallback events are shared,
    /// not copied.
    fn stats(&self) -> Stats {
        self.state().stats_on(self.fd())
    }

    /// Turns on `SO_TXTIME` (clock `CLOCK_MONOTONIC`), so that a departure time
    /// ([`crate::Transmit::with_txtime`]) reaches the kernel as `SCM_TXTIME`. With
    /// `report_errors`, packets the qdisc drops for a missed or invalid time
    /// are reported on the error queue ([`UdpIo::recv_error`]).
    ///
    /// The kernel accepts this on any path, but only an EDT-aware egress
    /// qdisc (fq, etf) holds a packet until its time; elsewhere it leaves at
    /// once. See [`crate::pacing::choose_mode`].
    fn enable_txtime(&self, report_errors: bool) -> Result<(), Error> {
        self.state().enable_txtime_on(self.fd(), report_errors)
    }

    /// Caps this *connected* socket's rate at `bytes_per_sec`
    /// (`SO_MAX_PACING_RATE`), for the kernel to pace: honoured by the fq
    /// qdisc (and by TCP's internal pacing), ignored by other qdiscs. The
    /// socket must be connected: the rate belongs to one peer.
    fn set_max_pacing_rate(&self, bytes_per_sec: u64) -> Result<(), Error> {
        self.state()
            .set_max_pacing_rate_on(self.fd(), bytes_per_sec)
    }

    /// Waits until a datagram (or a queued socket error) can be read, or
    /// `timeout` passes, to the nanosecond (`ppoll(2)`); true when the
    /// socket is readable. A signal ends the wait early with `false`. The
    /// wait for a loop that also has timers: it sleeps until the next one
    /// at most. It blocks the thread: on tokio, await `recv` instead.
    ///
    /// On the io_uring backend (feature `uring`) with its multishot
    /// receive armed, the kernel takes datagrams off the socket into the
    /// ring as they arrive, so the socket itself may never look readable:
    /// the wait is then on the ring's completions instead.
    fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        #[cfg(feature = "uring")]
        if let Some(b) = self.state().backend_for(self.fd()) {
            if let Some(r) = b.wait_readable(timeout) {
                return r;
            }
        }
        crate::sys::wait_readable(self.fd(), timeout)
    }

    /// Bytes sent on this socket that the kernel still holds, not yet
    /// handed to the device (`SIOCOUTQ`): what waits in the socket's send
    /// buffer and the qdisc in front of a slow link. A sender can hold
    /// back traffic of low priority while this is high. Linux only;
    /// elsewhere an `Unsupported` error.
    fn unsent_bytes(&self) -> io::Result<usize> {
        crate::sys::unsent_bytes(self.fd())
    }
}

/// A socket is its state plus its descriptor: the state's methods that
/// need no descriptor ([`UdpState::capabilities`],
/// [`UdpState::max_gso_segments_to`], ...) are called on the socket directly.
impl std::ops::Deref for Socket {
    type Target = UdpState;

    fn deref(&self) -> &UdpState {
        &self.state
    }
}

impl UdpIo for Socket {
    fn state(&self) -> &UdpState {
        &self.state
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl<S: AsFd> UdpIo for (&UdpState, S) {
    fn state(&self) -> &UdpState {
        self.0
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.1.as_fd()
    }
}

impl<T: UdpIo + ?Sized> UdpIo for &T {
    fn state(&self) -> &UdpState {
        (**self).state()
    }
    fn fd(&self) -> BorrowedFd<'_> {
        (**self).fd()
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// Fault injection for unit tests: while switched on, a send that carries
/// an ECN mark fails with EINVAL instead of reaching the kernel, as on a
/// path that refuses ECN control messages.
#[cfg(test)]
mod faults {
    use super::Transmit;
    use std::cell::Cell;
    use std::io;

    /// A kernel refusal of GSO sends to emulate, with its errno.
    #[derive(Debug, Clone, Copy)]
    pub struct GsoFault {
        /// The errno (EIO, EINVAL).
        pub errno: i32,
        /// Only trains whose last datagram is shorter (Linux 6.6.44).
        pub short_tail_only: bool,
        /// Only IPv6 destinations (older virtio-net).
        pub v6_only: bool,
        /// Only this destination (a path that cannot, next to one that can).
        pub dest: Option<std::net::SocketAddr>,
    }

    thread_local! {
        static REFUSE_ECN: Cell<Option<i32>> = const { Cell::new(None) };
        static REFUSE_GSO: Cell<Option<GsoFault>> = const { Cell::new(None) };
    }

    /// Refuse ECN-marked sends on this thread with EINVAL.
    pub fn refuse_ecn(on: bool) {
        refuse_ecn_with(on.then_some(libc::EINVAL));
    }

    /// Refuse ECN-marked sends on this thread with this errno.
    pub fn refuse_ecn_with(errno: Option<i32>) {
        REFUSE_ECN.with(|c| c.set(errno));
    }

    /// Refuse GSO sends on this thread as `f` says (`None`: stop).
    pub fn refuse_gso(f: Option<GsoFault>) {
        REFUSE_GSO.with(|c| c.set(f));
    }

    /// The error to answer instead of making the syscall for a send whose
    /// first message is `t`, if any.
    pub fn refused(t: &Transmit<'_>, has_ecn: bool, gso: bool) -> Option<io::Error> {
        if let Some(errno) = REFUSE_ECN.with(|c| c.get()).filter(|_| has_ecn) {
            return Some(io::Error::from_raw_os_error(errno));
        }
        let f = REFUSE_GSO.with(|c| c.get())?;
        let seg = t.segment_size.unwrap_or(0);
        let train = gso && t.segments() > 1;
        let short = seg > 0 && t.contents.len() % seg != 0;
        let applies = train
            && (!f.short_tail_only || short)
            && (!f.v6_only || !super::state::is_v4_dest(&t.destination))
            && f.dest.is_none_or(|d| d == t.destination);
        applies.then(|| io::Error::from_raw_os_error(f.errno))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::error::Feature;
    use crate::sys;
    use std::time::Duration;

    #[test]
    fn refused_ecn_mark_is_dropped_and_the_send_retried() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let dest = rx.as_std().local_addr().unwrap();
        let mut t = Transmit::new(dest, b"marked");
        t.ecn = Some(EcnCodepoint::Ect0);
        faults::refuse_ecn(true);
        let sent = tx.send(&[t, t]);
        faults::refuse_ecn(false);
        assert_eq!(sent.unwrap().transmits, 2);
        assert!(!tx.capabilities().supports(Feature::Ecn));
        let s = tx.stats();
        assert_eq!(s.fallbacks.len(), 1);
        assert_eq!(s.fallbacks[0].feature, Feature::Ecn);
        assert_eq!(s.fallbacks[0].errno, Some(libc::EINVAL));
        rx.as_std()
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut b = RecvBatch::new(4);
        let mut n = 0;
        while n < 2 {
            rx.recv(&mut b).unwrap();
            for (m, d) in b.datagrams() {
                assert_eq!(d, b"marked");
                assert_eq!(m.ecn, None, "sent without the refused mark");
                n += 1;
            }
        }
    }

    /// Receives `n` datagrams (their lengths), in any message shape.
    fn recv_lens(rx: &Socket, n: usize) -> Vec<usize> {
        rx.as_std()
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut b = RecvBatch::new(8);
        let mut lens = Vec::new();
        while lens.len() < n {
            rx.recv(&mut b).expect("every datagram arrives");
            lens.extend(b.datagrams().map(|(_, d)| d.len()));
        }
        assert_eq!(lens.len(), n, "no more than sent");
        lens
    }

    /// Whether `tx` can send GSO trains here; says why not (and fails
    /// under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`) when it cannot: a GSO
    /// refusal test without GSO proves nothing.
    fn gso_here(tx: &Socket) -> bool {
        if tx.capabilities().max_gso_segments > 1 {
            return true;
        }
        let why = "no UDP GSO on this socket (an old kernel, or Config::disable with Feature::Gso)";
        fastudp_test_support::skip(&fastudp_test_support::current_test(), why);
        false
    }

    fn gso_fault(errno: i32) -> faults::GsoFault {
        faults::GsoFault {
            errno,
            short_tail_only: false,
            v6_only: false,
            dest: None,
        }
    }

    /// Field bug: GSO refused with EIO on a path whose device cannot do
    /// it, after the probe and the first sends (to loopback) said yes. The
    /// path's answer wins: its train is resent one by one, nothing is lost,
    /// and the fallback names EIO.
    #[test]
    fn gso_refused_with_eio_on_a_path_after_loopback_worked() {
        let lo = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let path = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let data = vec![3u8; 4000];
        let to_lo = Transmit::train(lo.as_std().local_addr().unwrap(), &data, 1000);
        let to_path = Transmit::train(path.as_std().local_addr().unwrap(), &data, 1000);
        assert!(tx.send(&[to_lo]).unwrap().all(1));
        assert_eq!(recv_lens(&lo, 4), vec![1000; 4]);
        faults::refuse_gso(Some(faults::GsoFault {
            dest: Some(to_path.destination),
            ..gso_fault(libc::EIO)
        }));
        let sent = tx.send(&[to_path]);
        faults::refuse_gso(None);
        assert!(sent.unwrap().all(1));
        assert_eq!(recv_lens(&path, 4), vec![1000; 4]);
        let st = tx.stats();
        assert_eq!(st.fallbacks.len(), 1, "{:?}", st.fallbacks);
        assert_eq!(st.fallbacks[0].errno, Some(libc::EIO));
        assert_eq!(st.resent_unsegmented, 4);
    }

    /// Field bug (Linux 6.6.44): EINVAL for a train whose last segment is
    /// shorter. That train goes as datagrams, GSO stays on for uniform
    /// trains, and later short-tailed trains go as datagrams at once.
    #[test]
    fn a_refused_short_last_segment_keeps_gso_for_uniform_trains() {
        let rx = Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().recv_buffer(4 << 20),
        )
        .unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let dest = rx.as_std().local_addr().unwrap();
        let short = vec![1u8; 3500];
        let uniform = vec![2u8; 4000];
        faults::refuse_gso(Some(faults::GsoFault {
            short_tail_only: true,
            ..gso_fault(libc::EINVAL)
        }));
        let r1 = tx.send(&[Transmit::train(dest, &short, 1000)]);
        assert_eq!(recv_lens(&rx, 4), vec![1000, 1000, 1000, 500]);
        assert!(tx.max_gso_segments() > 1, "GSO stays on");
        let calls = tx.stats().send_calls;
        let r2 = tx.send(&[Transmit::train(dest, &uniform, 1000)]);
        assert_eq!(tx.stats().send_calls, calls + 1, "one GSO send");
        assert_eq!(recv_lens(&rx, 4), vec![1000; 4]);
        let r3 = tx.send(&[Transmit::train(dest, &short, 1000)]);
        faults::refuse_gso(None);
        assert!(r1.unwrap().all(1) && r2.unwrap().all(1) && r3.unwrap().all(1));
        assert_eq!(recv_lens(&rx, 4), vec![1000, 1000, 1000, 500]);
        let st = tx.stats();
        assert_eq!(st.fallbacks.len(), 1, "{:?}", st.fallbacks);
        assert!(
            st.fallbacks[0].reason.contains("shorter"),
            "{:?}",
            st.fallbacks
        );
    }

    /// Field bug (older virtio-net): EINVAL for IPv6 GSO only. The
    /// fallback is per address family: IPv4 keeps GSO.
    #[test]
    fn an_ipv6_gso_refusal_leaves_ipv4_gso_on() {
        let rx4 = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let rx6 = Socket::bind("[::1]:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind("[::]:0".parse().unwrap(), Config::default()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let (d4, d6) = (
            rx4.as_std().local_addr().unwrap(),
            rx6.as_std().local_addr().unwrap(),
        );
        let data = vec![4u8; 3000];
        faults::refuse_gso(Some(faults::GsoFault {
            v6_only: true,
            ..gso_fault(libc::EINVAL)
        }));
        let r6 = tx.send(&[Transmit::train(d6, &data, 1000)]);
        assert_eq!(tx.state().max_gso_segments_to(&d6), 1);
        assert!(tx.state().max_gso_segments_to(&d4) > 1, "IPv4 keeps GSO");
        let calls = tx.stats().send_calls;
        let r4 = tx.send(&[Transmit::train(d4, &data, 1000)]);
        faults::refuse_gso(None);
        assert_eq!(tx.stats().send_calls, calls + 1, "one GSO send to IPv4");
        assert!(r6.unwrap().all(1) && r4.unwrap().all(1));
        assert_eq!(recv_lens(&rx6, 3), vec![1000; 3]);
        assert_eq!(recv_lens(&rx4, 3), vec![1000; 3]);
        let st = tx.stats();
        assert_eq!(st.fallbacks.len(), 1);
        assert!(
            st.fallbacks[0].reason.contains("IPv6"),
            "{:?}",
            st.fallbacks
        );
    }

    /// A path whose GSO refusals come and go records one event per
    /// refusal: the socket keeps the most recent 32
    /// and counts the rest, and `stats()` shares them instead of copying.
    #[test]
    fn fallback_events_are_bounded_and_counted() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().gso_retry(Duration::ZERO),
        )
        .unwrap();
        if !gso_here(&tx) {
            return;
        }
        let data = [5u8; 200];
        let t = Transmit::train(rx.as_std().local_addr().unwrap(), &data, 100);
        faults::refuse_gso(Some(gso_fault(libc::EIO)));
        for _ in 0..100 {
            assert!(tx.send(&[t]).unwrap().all(1));
        }
        faults::refuse_gso(None);
        let st = tx.stats();
        assert_eq!(st.fallbacks_total, 100);
        assert_eq!(
            st.fallbacks.len(),
            state::FALLBACK_EVENTS_KEPT,
            "{:?}",
            st.fallbacks
        );
        assert!(st.fallbacks.iter().all(|e| e.errno == Some(libc::EIO)));
        assert_eq!(st.resent_unsegmented, 200);
        assert!(
            std::sync::Arc::ptr_eq(&st.fallbacks, &tx.stats().fallbacks),
            "stats() copied the events"
        );
    }

    /// A GSO retry wait longer than 2^64 ns is kept whole, not cut to its
    /// low 64 bits: 18,446,744,074 s (about 585 years, which a C caller
    /// asks for with `gso_retry_ms` 18446744074000) became 0.29 s.
    #[test]
    fn a_gso_retry_past_u64_nanoseconds_is_not_cut_short() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().gso_retry(Duration::from_secs(18_446_744_074)),
        )
        .unwrap();
        if !gso_here(&tx) {
            return;
        }
        let dest = rx.as_std().local_addr().unwrap();
        let data = [5u8; 200];
        faults::refuse_gso(Some(gso_fault(libc::EIO)));
        let sent = tx.send(&[Transmit::train(dest, &data, 100)]);
        faults::refuse_gso(None);
        assert!(sent.unwrap().all(1));
        assert_eq!(
            tx.state.max_gso_segments_to(&dest),
            1,
            "GSO off after the refusal"
        );
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            tx.state.max_gso_segments_to(&dest),
            1,
            "GSO came back within 0.5 s of a 585-year wait"
        );
    }

    /// Field bug (old kernels, Android): ECN refused with EIO. The
    /// datagrams still go, ECN is off, and the fallback says EIO.
    #[test]
    fn ecn_refused_with_eio_is_dropped_and_reported() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let t = Transmit::new(rx.as_std().local_addr().unwrap(), b"marked")
            .with_ecn(Some(crate::EcnCodepoint::Ect0));
        faults::refuse_ecn_with(Some(libc::EIO));
        let sent = tx.send(&[t]);
        faults::refuse_ecn_with(None);
        assert!(sent.unwrap().all(1));
        assert!(!tx.capabilities().supports(Feature::Ecn));
        assert_eq!(tx.stats().fallbacks[0].errno, Some(libc::EIO));
        assert_eq!(recv_lens(&rx, 1), vec![6]);
    }

    #[test]
    fn unknown_disable_name_is_a_clear_error() {
        let e = Feature::parse_list("gso,gsoo").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        assert_eq!(e.transmit_index(), None);
        assert!(e.to_string().contains("unknown feature 'gsoo'"), "{e}");
        let m = e.to_string();
        assert!(m.contains("'gsoo'") && m.contains("known: gso, gro"), "{m}");
        let d = Feature::parse_list(" GSO , ecn,").unwrap();
        assert_eq!(d, [Feature::Gso, Feature::Ecn]);
        // Every name reads back as its feature.
        for f in Feature::ALL {
            assert_eq!(f.to_string().parse::<Feature>().unwrap(), *f);
        }
    }

    /// Overflows `rx` (nobody reads while 200 datagrams arrive), drains
    /// it, then receives 3 more; returns the socket's `SO_MEMINFO` drop
    /// count and the `SO_RXQ_OVFL` counts the last messages carried.
    fn overflow_then_receive(rx: &Socket) -> (u64, Vec<Option<u32>>) {
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let dest = rx.as_std().local_addr().unwrap();
        let payload = [7u8; 1000];
        for _ in 0..200 {
            tx.send(&[Transmit::new(dest, &payload)]).unwrap();
        }
        let drops = u64::from(sys::socket_drops(rx.as_std().as_raw_fd()).unwrap());
        assert!(
            drops > 0,
            "the buffer never overflowed: the test proved nothing"
        );
        rx.as_std()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = RecvBatch::new(8);
        while rx.recv(&mut b).is_ok() {}
        for _ in 0..3 {
            tx.send(&[Transmit::new(dest, &payload)]).unwrap();
        }
        let mut carried = Vec::new();
        while carried.len() < 3 {
            rx.recv(&mut b).expect("the 3 later datagrams arrive");
            carried.extend((&b).into_iter().map(|(m, _)| m.kernel_drops));
        }
        (drops, carried)
    }

    /// The drop counter that messages queued after drops carry
    /// (`SO_RXQ_OVFL`) agrees exactly with the socket's own
    /// (`SO_MEMINFO`), and with `Stats::kernel_drops`.
    #[test]
    fn rxq_ovfl_count_agrees_with_meminfo() {
        let c = Config::default().gro(false).recv_buffer(4096);
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), c).unwrap();
        assert!(rx.capabilities().supports(Feature::RxqOvfl));
        let (drops, carried) = overflow_then_receive(&rx);
        assert!(
            carried.iter().all(|&c| c.map(u64::from) == Some(drops)),
            "SO_RXQ_OVFL {carried:?} and SO_MEMINFO {drops} disagree"
        );
        assert_eq!(rx.stats().kernel_drops, drops);
    }

    /// With `SO_RXQ_OVFL` switched off, messages carry no count and the
    /// drops are still counted (`SO_MEMINFO`).
    #[test]
    fn rxq_ovfl_switched_off() {
        let c = Config::default()
            .gro(false)
            .recv_buffer(4096)
            .disable([Feature::RxqOvfl]);
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), c).unwrap();
        let caps = rx.capabilities();
        assert!(!caps.supports(Feature::RxqOvfl) && caps.is_disabled(Feature::RxqOvfl));
        let (drops, carried) = overflow_then_receive(&rx);
        assert_eq!(carried, [None; 3]);
        assert_eq!(rx.stats().kernel_drops, drops);
    }

    /// `disable(DontFragment)` is `may_fragment(true)`; `Recverr` leaves
    /// the error queue off.
    #[test]
    fn probed_features_can_be_switched_off() {
        let on = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        let caps = on.capabilities();
        assert!(caps.supports(Feature::DontFragment) && caps.supports(Feature::Recverr));
        assert!(on.capabilities().supports(Feature::DontFragment));
        let c = Config::default().disable([Feature::DontFragment, Feature::Recverr]);
        let off = Socket::bind("127.0.0.1:0".parse().unwrap(), c).unwrap();
        let caps = off.capabilities();
        assert!(!caps.supports(Feature::DontFragment) && !caps.supports(Feature::Recverr));
        assert!(!off.capabilities().supports(Feature::DontFragment));
        let mf = Config::default().may_fragment(true);
        let mf = Socket::bind("127.0.0.1:0".parse().unwrap(), mf).unwrap();
        assert!(mf.capabilities().is_disabled(Feature::DontFragment));
    }

    #[test]
    fn disabled_features_are_off() {
        let c = Config::default().disable(Feature::parse_list("gso,gro,mmsg,ecn").unwrap());
        let s = Socket::bind("127.0.0.1:0".parse().unwrap(), c).unwrap();
        let caps = s.capabilities();
        assert_eq!(caps.max_gso_segments, 1);
        for f in [Feature::Gso, Feature::Gro, Feature::Mmsg, Feature::Ecn] {
            assert!(!caps.supports(f) && caps.is_disabled(f), "{f}");
        }
        assert!(!caps.is_disabled(Feature::Pktinfo));
    }
}
