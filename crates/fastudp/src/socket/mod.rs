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

pub use recv::{RecvBatch, RecvMeta, DEFAULT_MESSAGE_CAPACITY};
pub use send::Sent;
pub use state::{Config, Stats, UdpState, DEFAULT_GSO_RETRY, DEFAULT_SPLIT_WAIT};

use crate::error::Error;
use crate::wire::control::EcnCodepoint;
use crate::wire::errqueue::SocketError;
use crate::wire::plan;
use std::io;
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
    /// (`SCM_TXTIME`; see [`UdpState::enable_txtime`]). Every segment of a
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
        .map_err(|e| Error::Setup {
            what: "socket",
            source: e,
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
        .map_err(|e| Error::Bind { addr, source: e })?;
    Ok(s.into())
}

impl Socket {
    /// Binds a new socket. An IPv6 wildcard address gives a dual-stack
    /// socket that also serves IPv4 peers (as v4-mapped addresses).
    pub fn bind(addr: SocketAddr) -> Result<Self, Error> {
        Self::bind_with(addr, Config::default())
    }

    /// Binds a new socket with options.
    pub fn bind_with(addr: SocketAddr, config: Config) -> Result<Self, Error> {
        Self::from_std_with(bind_udp(addr)?, config)
    }

    /// Wraps an existing bound socket with default options.
    pub fn from_std(sock: UdpSocket) -> Result<Self, Error> {
        Self::from_std_with(sock, Config::default())
    }

    /// Wraps an existing bound socket, probes what it supports and sets it
    /// up ([`UdpState::new`]).
    pub fn from_std_with(sock: UdpSocket, config: Config) -> Result<Self, Error> {
        let state = UdpState::new(&sock, config)?;
        Ok(Socket { inner: sock, state })
    }

    /// The core this socket runs on.
    pub fn state(&self) -> &UdpState {
        &self.state
    }

    /// The wrapped standard socket, e.g. to set timeouts or non-blocking mode.
    pub fn as_std(&self) -> &UdpSocket {
        &self.inner
    }

    /// Takes the standard socket and its state apart.
    pub fn into_parts(self) -> (UdpSocket, UdpState) {
        (self.inner, self.state)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// See [`UdpState::send`].
    pub fn send(&self, transmits: &[Transmit<'_>]) -> Result<Sent, Error> {
        self.state.send(&self.inner, transmits)
    }

    /// The socket, and its state to change.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    pub(crate) fn parts_mut(&mut self) -> (&UdpSocket, &mut UdpState) {
        (&self.inner, &mut self.state)
    }

    /// See [`UdpState::recv`].
    pub fn recv(&self, batch: &mut RecvBatch) -> Result<usize, Error> {
        self.state.recv(&self.inner, batch)
    }

    /// See [`UdpState::recv_error`].
    pub fn recv_error(&self) -> Result<Option<SocketError>, Error> {
        self.state.recv_error(&self.inner)
    }

    /// See [`UdpState::kernel_drops`].
    pub fn kernel_drops(&self) -> u64 {
        self.state.kernel_drops(&self.inner)
    }

    /// See [`UdpState::enable_txtime`].
    pub fn enable_txtime(&self, report_errors: bool) -> Result<(), Error> {
        self.state.enable_txtime(&self.inner, report_errors)
    }

    /// See [`UdpState::set_max_pacing_rate`].
    pub fn set_max_pacing_rate(&self, bytes_per_sec: u64) -> Result<(), Error> {
        self.state.set_max_pacing_rate(&self.inner, bytes_per_sec)
    }

    /// See [`UdpState::max_pacing_rate`].
    pub fn max_pacing_rate(&self) -> Result<u64, Error> {
        self.state.max_pacing_rate(&self.inner)
    }

    /// See [`UdpState::stats`].
    pub fn stats(&self) -> Stats {
        self.state.stats(&self.inner)
    }

    /// Waits until a datagram (or a queued socket error) can be read, or
    /// `timeout` passes, to the nanosecond (`ppoll(2)`); true when the
    /// socket is readable. A signal ends the wait early with `false`. The
    /// wait for a loop that also has timers: it sleeps until the next one
    /// at most.
    ///
    /// On the io_uring backend (feature `uring`) with its multishot
    /// receive armed, the kernel takes datagrams off the socket into the
    /// ring as they arrive, so the socket itself may never look readable:
    /// the wait is then on the ring's completions instead.
    pub fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        #[cfg(feature = "uring")]
        if let Some(b) = self.state.backend_for(self.inner.as_fd()) {
            if let Some(r) = b.wait_readable(timeout) {
                return r;
            }
        }
        crate::sys::wait_readable(self.inner.as_fd(), timeout)
    }

    /// Bytes sent on this socket that the kernel still holds, not yet
    /// handed to the device (`SIOCOUTQ`): what waits in the socket's send
    /// buffer and the qdisc in front of a slow link. A sender can hold
    /// back traffic of low priority while this is high. Linux only;
    /// elsewhere an `Unsupported` error.
    pub fn unsent_bytes(&self) -> io::Result<usize> {
        crate::sys::unsent_bytes(self.inner.as_fd())
    }
}

/// A UDP socket together with its fastudp state: what [`crate::Coalescer`]
/// and [`crate::ZeroCopySender`] send on. [`Socket`] is one; a caller's own
/// socket is one when paired with its state as `(&state, &socket)`, for
/// any `socket` with a file descriptor (std, tokio, mio, a raw fd).
pub trait UdpIo {
    /// The state.
    fn state(&self) -> &UdpState;
    /// The socket's descriptor.
    fn fd(&self) -> BorrowedFd<'_>;
}

/// A socket is its state plus its descriptor: the state's methods that
/// need no descriptor ([`UdpState::capabilities`],
/// [`UdpState::max_payload_to`], ...) are called on the socket directly.
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
    use crate::caps::Disabled;
    use crate::error::{ConfigError, Feature};
    use std::time::Duration;

    #[test]
    fn refused_ecn_mark_is_dropped_and_the_send_retried() {
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let dest = rx.local_addr().unwrap();
        let mut t = Transmit::new(dest, b"marked");
        t.ecn = Some(EcnCodepoint::Ect0);
        faults::refuse_ecn(true);
        let sent = tx.send(&[t, t]);
        faults::refuse_ecn(false);
        assert_eq!(sent.unwrap().transmits, 2);
        assert!(!tx.ecn_enabled());
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
        let why = "no UDP GSO on this socket (an old kernel, or Config::disabled with gso)";
        assert!(
            std::env::var_os("FASTUDP_REQUIRE_PRIVILEGED_TESTS").is_none(),
            "{why}"
        );
        // Past the harness's capture, which takes only `eprint!`.
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "skipped: {why}");
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
        let lo = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let path = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let data = vec![3u8; 4000];
        let to_lo = Transmit::train(lo.local_addr().unwrap(), &data, 1000);
        let to_path = Transmit::train(path.local_addr().unwrap(), &data, 1000);
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
        let rx = Socket::bind_with(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().recv_buffer(4 << 20),
        )
        .unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let dest = rx.local_addr().unwrap();
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
        let rx4 = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let rx6 = Socket::bind("[::1]:0".parse().unwrap()).unwrap();
        let tx = Socket::bind("[::]:0".parse().unwrap()).unwrap();
        if !gso_here(&tx) {
            return;
        }
        let (d4, d6) = (rx4.local_addr().unwrap(), rx6.local_addr().unwrap());
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
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind_with(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().gso_retry(Duration::ZERO),
        )
        .unwrap();
        if !gso_here(&tx) {
            return;
        }
        let data = [5u8; 200];
        let t = Transmit::train(rx.local_addr().unwrap(), &data, 100);
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
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind_with(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().gso_retry(Duration::from_secs(18_446_744_074)),
        )
        .unwrap();
        if !gso_here(&tx) {
            return;
        }
        let dest = rx.local_addr().unwrap();
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
        let rx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let tx = Socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let t = Transmit::new(rx.local_addr().unwrap(), b"marked")
            .with_ecn(Some(crate::EcnCodepoint::Ect0));
        faults::refuse_ecn_with(Some(libc::EIO));
        let sent = tx.send(&[t]);
        faults::refuse_ecn_with(None);
        assert!(sent.unwrap().all(1));
        assert!(!tx.ecn_enabled());
        assert_eq!(tx.stats().fallbacks[0].errno, Some(libc::EIO));
        assert_eq!(recv_lens(&rx, 1), vec![6]);
    }

    #[test]
    fn unknown_disable_name_is_a_clear_error() {
        let e = Disabled::parse("gso,gsoo").unwrap_err();
        assert_eq!(
            e,
            ConfigError::UnknownFeature {
                name: "gsoo".into()
            }
        );
        let m = e.to_string();
        assert!(m.contains("'gsoo'") && m.contains("known: gso, gro"), "{m}");
        let d = Disabled::parse(" GSO , ecn,").unwrap();
        assert!(d.gso && d.ecn && !d.gro);
    }

    #[test]
    fn disabled_features_are_off() {
        let c = Config::default().disabled(Disabled::parse("gso,gro,mmsg,ecn").unwrap());
        let s = Socket::bind_with("127.0.0.1:0".parse().unwrap(), c).unwrap();
        let caps = s.capabilities();
        assert_eq!(caps.max_gso_segments, 1);
        assert!(!caps.gro && !caps.mmsg && !caps.ecn);
    }
}
