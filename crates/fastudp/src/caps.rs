//! Run-time capability probing, and the features a `Config` switches off.

use crate::error::ConfigError;
use crate::sys;
use crate::wire::cmsg::CmsgBuf;
use crate::wire::consts::*;
use crate::wire::control::{encode_send, SendControl};
use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// Features switched off by the user ([`crate::Config::disabled`]).
///
/// The library reads no environment variable: a program that wants a
/// switch such as the `fastudp` command's `FASTUDP_DISABLE=gso,ecn` parses
/// it with [`Disabled::parse`] and puts it in its `Config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Disabled {
    /// No UDP GSO: every datagram is its own message.
    pub gso: bool,
    /// No UDP GRO on receive.
    pub gro: bool,
    /// No sendmmsg/recvmmsg: one message per syscall.
    pub mmsg: bool,
    /// No ECN marks on send, none read on receive.
    pub ecn: bool,
    /// No PKTINFO on send or receive.
    pub pktinfo: bool,
    /// No MSG_ZEROCOPY.
    pub zerocopy: bool,
    /// No SO_TXTIME.
    pub txtime: bool,
}

impl Disabled {
    /// Parses a comma-separated list such as `"gso,ecn"`. Spaces are
    /// ignored; an unknown name is an error that lists the known ones.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let mut d = Disabled::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name.to_ascii_lowercase().as_str() {
                "gso" => d.gso = true,
                "gro" => d.gro = true,
                "mmsg" => d.mmsg = true,
                "ecn" => d.ecn = true,
                "pktinfo" => d.pktinfo = true,
                "zerocopy" => d.zerocopy = true,
                "txtime" => d.txtime = true,
                other => {
                    return Err(ConfigError::UnknownFeature {
                        name: other.to_string(),
                    }
                    .into())
                }
            }
        }
        Ok(d)
    }

    /// Merges two sets: a feature is off if either switches it off.
    pub(crate) fn union(self, o: Disabled) -> Disabled {
        Disabled {
            gso: self.gso || o.gso,
            gro: self.gro || o.gro,
            mmsg: self.mmsg || o.mmsg,
            ecn: self.ecn || o.ecn,
            pktinfo: self.pktinfo || o.pktinfo,
            zerocopy: self.zerocopy || o.zerocopy,
            txtime: self.txtime || o.txtime,
        }
    }
}

/// What the kernel and this socket support, as probed when the socket was
/// set up (after [`Disabled`] features are removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Most GSO segments per send: 128 on new kernels, 64 on older ones, 1
    /// without GSO.
    pub max_gso_segments: usize,
    /// The kernel's segment limit per send (`UDP_MAX_SEGMENTS`), whether or
    /// not this socket uses GSO; trains above it are rejected.
    pub kernel_max_segments: usize,
    /// UDP GRO is on for receive.
    pub gro: bool,
    /// ECN marks are sent and read.
    pub ecn: bool,
    /// PKTINFO (destination address on receive, source on send).
    pub pktinfo: bool,
    /// sendmmsg/recvmmsg batching.
    pub mmsg: bool,
    /// SO_RXQ_OVFL drop counter.
    pub rxq_ovfl: bool,
    /// `IP_RECVERR`/`IPV6_RECVERR`: ICMP errors reach the error queue.
    pub recverr: bool,
    /// Don't-fragment is set (`IP_PMTUDISC_PROBE`, `IPV6_DONTFRAG`).
    pub dont_fragment: bool,
    /// MSG_ZEROCOPY is accepted (SO_ZEROCOPY can be set).
    pub zerocopy: bool,
    /// SO_TXTIME is accepted. Whether the egress qdisc honours it is a
    /// property of the path, not of the socket.
    pub txtime: bool,
    /// What the user switched off.
    pub disabled: Disabled,
}

fn probe_segments_on(addr: SocketAddr, segs: usize) -> std::io::Result<()> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    let to = socket2::SockAddr::from(s.local_addr()?);
    let payload = vec![0u8; segs];
    let mut cb = CmsgBuf::default();
    let ctl = SendControl {
        segment_size: Some(1),
        ..Default::default()
    };
    let n = encode_send(&mut cb.0, &ctl, addr.is_ipv4(), addr.is_ipv6())
        .map_err(std::io::Error::other)?;
    let iov = [IoSlice::new(&payload)];
    let m = sys::OutMsg {
        addr: Some(&to),
        iov: &iov,
        control: &cb.0[..n],
    };
    sys::sendmsg(std::os::fd::AsFd::as_fd(&s), &m, 0).map(drop)
}

/// The kernel's `UDP_MAX_SEGMENTS` (128 since 2024, 64 before), probed once
/// per process by sending a train of 1-byte segments to a throwaway
/// loopback socket; 0 when the kernel refuses GSO outright.
pub(crate) fn kernel_max_segments() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr: SocketAddr = addr.parse().expect("literal address");
            match probe_segments_on(addr, 128) {
                Ok(()) => return 128,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return if probe_segments_on(addr, 64).is_ok() {
                        64
                    } else {
                        0
                    };
                }
                Err(_) => continue,
            }
        }
        // The probe could not run (no usable loopback in this network
        // namespace, say): the older, safe limit. Whether a socket can do
        // GSO at all is its own UDP_SEGMENT check.
        64
    })
}

/// Whether `SO_ZEROCOPY` and `SO_TXTIME` are accepted, probed once per
/// process on throwaway sockets.
pub(crate) fn zerocopy_and_txtime() -> (bool, bool) {
    static R: OnceLock<(bool, bool)> = OnceLock::new();
    *R.get_or_init(|| {
        // Any address will do: the options need no route.
        let Ok(s) = UdpSocket::bind("0.0.0.0:0").or_else(|_| UdpSocket::bind("[::]:0")) else {
            return (false, false);
        };
        let fd = s.as_raw_fd();
        let zc = sys::setsockopt_int(fd, SOL_SOCKET, SO_ZEROCOPY, 1).is_ok();
        let tx = sys::set_txtime(fd, libc::CLOCK_MONOTONIC, 0).is_ok();
        (zc, tx)
    })
}
