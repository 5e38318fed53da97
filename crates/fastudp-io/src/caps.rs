//! Run-time capability probing, and the features a `Config` switches off.

use crate::error::{ConfigError, Error, Feature};
use crate::sys;
use crate::wire::cmsg::CmsgBuf;
use crate::wire::consts::*;
use crate::wire::control::{encode_send, SendControl};
use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

impl Feature {
    /// Parses a comma-separated list of feature names such as `"gso,ecn"`
    /// (for [`crate::Config::disable`]). Case and spaces are ignored, and
    /// so are empty names; an unknown name is an error that lists the
    /// known ones.
    ///
    /// The library reads no environment variable: a program that wants a
    /// switch such as the `fastudp` command's `FASTUDP_DISABLE=gso,ecn`
    /// parses it here and puts it in its `Config`.
    ///
    /// ```
    /// use fastudp_io::Feature;
    /// assert_eq!(Feature::parse_list(" GSO , ecn,")?, [Feature::Gso, Feature::Ecn]);
    /// assert!(Feature::parse_list("gso,gsoo").is_err());
    /// # Ok::<(), fastudp_io::Error>(())
    /// ```
    pub fn parse_list(s: &str) -> Result<Vec<Feature>, Error> {
        s.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::parse)
            .collect()
    }
}

impl std::str::FromStr for Feature {
    type Err = Error;

    /// One feature by its name (as [`Feature`]'s `Display` writes it),
    /// in any case; an unknown name is an error that lists the known ones.
    fn from_str(s: &str) -> Result<Self, Error> {
        Feature::ALL
            .iter()
            .copied()
            .find(|f| f.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                ConfigError::UnknownFeature {
                    name: s.trim().to_ascii_lowercase(),
                }
                .into()
            })
    }
}

/// A set of [`Feature`]s, one bit each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct FeatureSet(u16);

impl FeatureSet {
    fn bit(f: Feature) -> u16 {
        1 << (f as u16)
    }

    /// Whether `f` is in the set.
    pub(crate) fn contains(self, f: Feature) -> bool {
        self.0 & Self::bit(f) != 0
    }

    /// Adds `f`.
    pub(crate) fn insert(&mut self, f: Feature) {
        self.0 |= Self::bit(f);
    }

    /// Adds `f` if `on`, removes it otherwise.
    pub(crate) fn set(&mut self, f: Feature, on: bool) {
        if on {
            self.0 |= Self::bit(f);
        } else {
            self.0 &= !Self::bit(f);
        }
    }
}

/// What the kernel and this socket support, as probed when the socket was
/// set up (after the features [`crate::Config::disable`] switched off are
/// removed): ask with [`Capabilities::supports`] and
/// [`Capabilities::is_disabled`].
///
/// ```
/// use fastudp_io::{Config, Feature, UdpState};
/// let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
/// let state = UdpState::new(&sock, Config::default().disable([Feature::Gso]))?;
/// let caps = state.capabilities();
/// assert!(caps.is_disabled(Feature::Gso) && !caps.supports(Feature::Gso));
/// assert_eq!(caps.max_gso_segments, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Most GSO segments per send: 128 on new kernels, 64 on older ones, 1
    /// without GSO.
    pub max_gso_segments: usize,
    /// The kernel's segment limit per send (`UDP_MAX_SEGMENTS`), whether or
    /// not this socket uses GSO; trains above it are rejected.
    pub kernel_max_segments: usize,
    pub(crate) supported: FeatureSet,
    pub(crate) disabled: FeatureSet,
}

impl Capabilities {
    /// Whether the socket uses `feature`: the kernel accepted it and it is
    /// not switched off.
    ///
    /// - [`Feature::Gso`]: [`Capabilities::max_gso_segments`] is above 1.
    /// - [`Feature::Ecn`]: ECN marks are sent and read; false once a send
    ///   with a mark was refused and marks stopped (received marks are
    ///   still read; the fallback is in [`crate::Stats::fallbacks`]).
    /// - [`Feature::Txtime`]: the kernel accepts `SO_TXTIME`; whether the
    ///   egress qdisc honours it is a property of the path, not of the
    ///   socket. [`crate::UdpIo::enable_txtime`] turns it on.
    /// - [`Feature::Zerocopy`]: the kernel accepts `SO_ZEROCOPY`.
    /// - [`Feature::RxqOvfl`], [`Feature::Recverr`],
    ///   [`Feature::DontFragment`]: the option is set.
    pub fn supports(&self, feature: Feature) -> bool {
        self.supported.contains(feature)
    }

    /// Whether `feature` was switched off by [`crate::Config::disable`]
    /// (or, for [`Feature::DontFragment`], by
    /// [`crate::Config::may_fragment`]).
    pub fn is_disabled(&self, feature: Feature) -> bool {
        self.disabled.contains(feature)
    }
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
