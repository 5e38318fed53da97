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
use crate::wire::errqueue::{self, Message};
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};

/// One message from a socket's error queue, from
/// [`crate::UdpIo::recv_error`]: an ICMP error about a datagram sent, a
/// departure-time drop, or a zerocopy completion.
///
/// [`SocketError::kind`] says which; [`SocketError::destination`] names
/// the peer the error is about, and [`SocketError::mtu`] the path MTU a
/// router gave. What the kernel reported, field by field, is in
/// [`SocketError::raw`]. `Display` describes it in a sentence.
///
/// ```no_run
/// use fastudp_io::{Config, Socket, SocketErrorKind, UdpIo};
///
/// let sock = Socket::bind("127.0.0.1:0".parse()?, Config::default())?;
/// while let Some(e) = sock.recv_error()? {
///     match e.kind() {
///         SocketErrorKind::Unreachable => println!("{:?} is gone: {e}", e.destination()),
///         SocketErrorKind::PacketTooBig => println!("path MTU {:?}", e.mtu()),
///         _ => println!("{e}"),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketError(Message);

/// What a [`SocketError`] is about, from [`SocketError::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SocketErrorKind {
    /// An ICMP or ICMPv6 "destination unreachable" or "time exceeded": the
    /// destination could not be reached (port unreachable, errno
    /// `ECONNREFUSED`: nothing listens there, the peer went away; or the
    /// host, the network, a firewall, the hop limit).
    Unreachable,
    /// A datagram was larger than the path allows: ICMP "fragmentation
    /// needed", ICMPv6 "packet too big", or this host's own MTU (then
    /// without a reporter). [`SocketError::mtu`] gives the MTU.
    PacketTooBig,
    /// The qdisc dropped a packet for its `SCM_TXTIME` departure time
    /// (`ee_info` and `ee_data` of [`SocketError::raw`] hold its low and
    /// high 32 bits, in ns of `CLOCK_MONOTONIC`; `ee_code` 1 for an invalid
    /// time, else a missed one).
    Txtime,
    /// `MSG_ZEROCOPY` sends `ee_info..=ee_data` (per-socket counters)
    /// completed; `ee_code` 1 when the kernel copied the data anyway.
    ZeroCopy,
    /// Anything else: see [`SocketError::raw`].
    Other,
}

impl SocketError {
    /// The decoded message, for the library's own use.
    pub(crate) fn detail(&self) -> errqueue::SocketError {
        self.0.decode()
    }

    /// What the message is about.
    pub fn kind(&self) -> SocketErrorKind {
        match self.detail() {
            errqueue::SocketError::Unreachable { .. } => SocketErrorKind::Unreachable,
            errqueue::SocketError::PacketTooBig { .. } => SocketErrorKind::PacketTooBig,
            errqueue::SocketError::Txtime { .. } => SocketErrorKind::Txtime,
            errqueue::SocketError::ZeroCopy { .. } => SocketErrorKind::ZeroCopy,
            errqueue::SocketError::Other { .. } => SocketErrorKind::Other,
        }
    }

    /// The destination of the datagram the error is about (the peer that
    /// refused it, the one the path was too small for), if the kernel gave
    /// it; `None` for departure-time drops and zerocopy completions.
    pub fn destination(&self) -> Option<SocketAddr> {
        self.detail().destination()
    }

    /// The host that sent the ICMP message (a router, or the peer itself);
    /// `None` when unknown, and for errors this host raised.
    pub fn reporter(&self) -> Option<IpAddr> {
        match self.detail() {
            errqueue::SocketError::Unreachable { reporter, .. }
            | errqueue::SocketError::PacketTooBig { reporter, .. } => reporter,
            _ => None,
        }
    }

    /// For [`SocketErrorKind::PacketTooBig`], the MTU reported: the largest
    /// IP packet that fits the path (or this host's interface). `None` for
    /// every other kind.
    pub fn mtu(&self) -> Option<u32> {
        match self.detail() {
            errqueue::SocketError::PacketTooBig { mtu, .. } => Some(mtu),
            _ => None,
        }
    }

    /// The kernel's `struct sock_extended_err`, as it came:
    /// `(ee_errno, ee_origin, ee_type, ee_code, ee_info, ee_data)`.
    ///
    /// `ee_errno` is the errno the kernel gives the error
    /// (`ECONNREFUSED` for port unreachable, `EHOSTUNREACH`, `EMSGSIZE`,
    /// `ECANCELED` for a missed departure time; 0 for zerocopy
    /// completions). For ICMP errors (`ee_origin` 2 for ICMP, 3 for
    /// ICMPv6) `ee_type` and `ee_code` are the ICMP type and code; see
    /// [`SocketErrorKind`] for what `ee_info` and `ee_data` hold.
    pub fn raw(&self) -> (i32, u8, u8, u8, u32, u32) {
        let m = &self.0;
        (m.errno, m.origin, m.kind, m.code, m.info, m.data)
    }
}

impl fmt::Display for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.detail(), f)
    }
}

impl fmt::Debug for SocketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.detail(), f)
    }
}

impl std::error::Error for SocketError {}

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
    /// The next error-queue message of `sock` (see
    /// [`crate::UdpIo::recv_error`]).
    pub(crate) fn recv_error_on(&self, sock: impl AsFd) -> Result<Option<SocketError>, Error> {
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
            let parsed =
                errqueue::parse_message(&cb.0[..len.min(cb.0.len())], dest).map_err(|e| {
                    Error::from(crate::error::Detail::Control(io::Error::new(
                        io::ErrorKind::InvalidData,
                        e,
                    )))
                })?;
            if let Some(m) = parsed {
                return Ok(Some(SocketError(m)));
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
                    icmp += usize::from(e.detail().is_icmp());
                    self.requeue_error(e);
                }
                _ => break,
            }
        }
        icmp
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::wire::cmsg::{CmsgBuf, Encoder};
    use crate::wire::consts::{IPV6_RECVERR, IP_RECVERR, SOL_IP, SOL_IPV6};
    use crate::wire::errqueue::{ORIGIN_ICMP, ORIGIN_ICMP6, ORIGIN_LOCAL, ORIGIN_TXTIME};

    /// The error a kernel message with these `sock_extended_err` fields
    /// (and offender, if any) gives.
    fn error(
        v6: bool,
        ee: (i32, u8, u8, u8, u32, u32),
        offender: Option<[u8; 4]>,
        to: Option<SocketAddr>,
    ) -> SocketError {
        let (errno, origin, kind, code, info, data) = ee;
        let mut d = Vec::new();
        d.extend_from_slice(&errno.to_ne_bytes());
        d.extend_from_slice(&[origin, kind, code, 0]);
        d.extend_from_slice(&info.to_ne_bytes());
        d.extend_from_slice(&data.to_ne_bytes());
        if let Some(a) = offender {
            d.extend_from_slice(&2u16.to_ne_bytes());
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&a);
            d.extend_from_slice(&[0; 8]);
        }
        let (level, ty) = if v6 {
            (SOL_IPV6, IPV6_RECVERR)
        } else {
            (SOL_IP, IP_RECVERR)
        };
        let mut b = CmsgBuf::default();
        let mut e = Encoder::new(&mut b.0);
        e.push(level, ty, &d).unwrap();
        let n = e.len();
        SocketError(errqueue::parse_message(&b.0[..n], to).unwrap().unwrap())
    }

    #[test]
    fn port_unreachable() {
        let to: SocketAddr = "10.0.0.2:4433".parse().unwrap();
        let ee = (libc::ECONNREFUSED, ORIGIN_ICMP, 3, 3, 0, 0);
        let e = error(false, ee, Some([10, 0, 0, 9]), Some(to));
        assert_eq!(e.kind(), SocketErrorKind::Unreachable);
        assert_eq!(e.destination(), Some(to));
        assert_eq!(e.reporter(), Some("10.0.0.9".parse().unwrap()));
        assert_eq!(e.mtu(), None);
        assert_eq!(e.raw(), ee);
        assert_eq!(
            e.to_string(),
            "10.0.0.2:4433 refused a datagram (port unreachable: nothing listens there), reported by 10.0.0.9"
        );
        assert!(format!("{e:?}").contains("Port"), "{e:?}");
    }

    #[test]
    fn packet_too_big() {
        let to: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        let e = error(
            true,
            (libc::EMSGSIZE, ORIGIN_ICMP6, 2, 0, 1280, 0),
            None,
            Some(to),
        );
        assert_eq!(e.kind(), SocketErrorKind::PacketTooBig);
        assert_eq!((e.destination(), e.mtu()), (Some(to), Some(1280)));
        assert_eq!(
            e.to_string(),
            "datagram to [2001:db8::1]:443 too big for the path: MTU 1280"
        );
        // This host's own MTU: no reporter, whatever the offender says.
        let local = (libc::EMSGSIZE, ORIGIN_LOCAL, 0, 0, 1500, 0);
        let e = error(false, local, Some([10, 0, 0, 9]), None);
        assert_eq!(e.kind(), SocketErrorKind::PacketTooBig);
        assert_eq!((e.mtu(), e.reporter()), (Some(1500), None));
        assert!(e.to_string().ends_with("MTU 1500 (this host)"), "{e}");
    }

    #[test]
    fn txtime_zerocopy_and_other() {
        let t: u64 = 0x1_2345_6789;
        let ee = (
            libc::ECANCELED,
            ORIGIN_TXTIME,
            0,
            0,
            t as u32,
            (t >> 32) as u32,
        );
        let e = error(false, ee, None, None);
        assert_eq!(e.kind(), SocketErrorKind::Txtime);
        assert_eq!((e.destination(), e.mtu(), e.raw()), (None, None, ee));
        assert_eq!(
            e.to_string(),
            format!("packet with departure time {t} ns dropped: time missed")
        );
        let e = error(false, (0, 5, 0, 1, 3, 7), None, None);
        assert_eq!(e.kind(), SocketErrorKind::ZeroCopy);
        assert_eq!(e.to_string(), "zerocopy sends 3..=7 done (copied)");
        let e = error(false, (5, 4, 1, 2, 3, 4), None, None);
        assert_eq!(e.kind(), SocketErrorKind::Other);
        assert_eq!(e.raw(), (5, 4, 1, 2, 3, 4));
    }
}
