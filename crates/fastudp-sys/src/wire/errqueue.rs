//! Error-queue messages (`MSG_ERRQUEUE`) as typed values, without
//! syscalls: ICMP errors with the destination that refused and the MTU,
//! `SCM_TXTIME` drops, and zerocopy completions.
//!
//! Each message carries one control message `IP_RECVERR` (`SOL_IP`) or
//! `IPV6_RECVERR` (`SOL_IPV6`) whose data is a `struct sock_extended_err`:
//!
//! ```text
//! 0: u32 ee_errno   4: u8 ee_origin  5: u8 ee_type  6: u8 ee_code  7: u8 pad
//! 8: u32 ee_info   12: u32 ee_data  16: struct sockaddr offender (SO_EE_OFFENDER)
//! ```
//!
//! and the message's `msg_name` is the original destination of the datagram
//! the error is about.

use super::cmsg::{CmsgError, Decoder};
use super::consts::{IPV6_RECVERR, IP_RECVERR, SOL_IP, SOL_IPV6};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `SO_EE_ORIGIN_LOCAL`: raised by this host's own stack.
pub const ORIGIN_LOCAL: u8 = 1;
/// `SO_EE_ORIGIN_ICMP`.
pub const ORIGIN_ICMP: u8 = 2;
/// `SO_EE_ORIGIN_ICMP6`.
pub const ORIGIN_ICMP6: u8 = 3;
/// `SO_EE_ORIGIN_ZEROCOPY`.
pub const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_ORIGIN_TXTIME`.
pub const ORIGIN_TXTIME: u8 = 6;
/// `SO_EE_CODE_ZEROCOPY_COPIED`.
pub const CODE_COPIED: u8 = 1;
/// `SO_EE_CODE_TXTIME_INVALID_PARAM`.
pub const CODE_TXTIME_INVALID: u8 = 1;

/// Why a destination could not be reached, from an ICMP or ICMPv6
/// "destination unreachable" (or "time exceeded").
// Exhaustive: fastudp-io maps every variant to its public kinds, and a new
// one must make it say what it maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unreachable {
    /// No socket listens on the port (ICMP code 3, ICMPv6 code 4):
    /// `ECONNREFUSED`.
    Port,
    /// The host cannot be reached (ICMP code 1, ICMPv6 code 3).
    Host,
    /// The network cannot be reached (ICMP code 0, ICMPv6 code 0).
    Network,
    /// A firewall refused it (ICMP codes 9, 10, 13; ICMPv6 code 1).
    Prohibited,
    /// The hop limit ran out on the way (ICMP type 11, ICMPv6 type 3).
    TimeExceeded,
    /// Another ICMP type and code.
    Other {
        /// ICMP type.
        kind: u8,
        /// ICMP code.
        code: u8,
    },
}

/// One message from a socket's error queue.
// Exhaustive, as `Unreachable` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketError {
    /// An ICMP error said a datagram to `destination` could not be
    /// delivered: the peer went away, or was never there.
    Unreachable {
        /// The destination of the datagram that was refused.
        destination: Option<SocketAddr>,
        /// Why.
        reason: Unreachable,
        /// The errno the kernel gives it (`ECONNREFUSED`, `EHOSTUNREACH`, ...).
        errno: i32,
        /// The host that sent the ICMP message (a router, or the peer).
        reporter: Option<IpAddr>,
    },
    /// A datagram to `destination` was larger than the path allows:
    /// ICMP "fragmentation needed", ICMPv6 "packet too big", or this
    /// host's own MTU (`local`).
    PacketTooBig {
        /// The destination of the datagram that was too big.
        destination: Option<SocketAddr>,
        /// The MTU the reporter gave: the largest IP packet that fits.
        mtu: u32,
        /// The host that sent the ICMP message (`None` when local).
        reporter: Option<IpAddr>,
        /// True when this host's own stack refused it.
        local: bool,
    },
    /// The qdisc dropped a packet for its `SCM_TXTIME` departure time.
    Txtime {
        /// The departure time it had, in ns of `CLOCK_MONOTONIC`.
        departure_ns: u64,
        /// True for an invalid time; false for a time already missed.
        invalid: bool,
        /// The errno (`ECANCELED`, `EINVAL`).
        errno: i32,
    },
    /// `MSG_ZEROCOPY` sends `lo..=hi` (per-socket counters) completed.
    ZeroCopy {
        /// First completed send.
        lo: u32,
        /// Last completed send (inclusive).
        hi: u32,
        /// The kernel copied the data anyway (`SO_EE_CODE_ZEROCOPY_COPIED`).
        copied: bool,
    },
    /// Anything else, with the raw fields of `sock_extended_err`.
    Other {
        /// The destination the message is about, if any.
        destination: Option<SocketAddr>,
        /// `ee_errno`.
        errno: i32,
        /// `ee_origin`.
        origin: u8,
        /// `ee_type`.
        kind: u8,
        /// `ee_code`.
        code: u8,
        /// `ee_info`.
        info: u32,
        /// `ee_data`.
        data: u32,
    },
}

impl SocketError {
    /// True for errors an ICMP message from the network caused.
    pub fn is_icmp(&self) -> bool {
        match self {
            SocketError::Unreachable { .. } => true,
            SocketError::PacketTooBig { local, .. } => !local,
            SocketError::Other { origin, .. } => matches!(*origin, ORIGIN_ICMP | ORIGIN_ICMP6),
            _ => false,
        }
    }

    /// The destination this error is about, if any.
    pub fn destination(&self) -> Option<SocketAddr> {
        match self {
            SocketError::Unreachable { destination, .. }
            | SocketError::PacketTooBig { destination, .. }
            | SocketError::Other { destination, .. } => *destination,
            _ => None,
        }
    }
}

impl std::fmt::Display for SocketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let to = |d: &Option<SocketAddr>| d.map_or("?".to_string(), |d| d.to_string());
        match self {
            SocketError::Unreachable {
                destination,
                reason,
                reporter,
                ..
            } => {
                let why = match reason {
                    Unreachable::Port => "port unreachable: nothing listens there",
                    Unreachable::Host => "host unreachable",
                    Unreachable::Network => "network unreachable",
                    Unreachable::Prohibited => "administratively prohibited",
                    Unreachable::TimeExceeded => "hop limit exceeded",
                    Unreachable::Other { .. } => "unreachable",
                };
                write!(f, "{} refused a datagram ({why})", to(destination))?;
                if let Some(r) = reporter {
                    write!(f, ", reported by {r}")?;
                }
                Ok(())
            }
            SocketError::PacketTooBig {
                destination,
                mtu,
                reporter,
                local,
            } => {
                write!(
                    f,
                    "datagram to {} too big for the path: MTU {mtu}",
                    to(destination)
                )?;
                match (local, reporter) {
                    (true, _) => write!(f, " (this host)"),
                    (false, Some(r)) => write!(f, ", reported by {r}"),
                    _ => Ok(()),
                }
            }
            SocketError::Txtime {
                departure_ns,
                invalid,
                ..
            } => write!(
                f,
                "packet with departure time {departure_ns} ns dropped: {}",
                if *invalid {
                    "invalid time"
                } else {
                    "time missed"
                }
            ),
            SocketError::ZeroCopy { lo, hi, copied } => write!(
                f,
                "zerocopy sends {lo}..={hi} done{}",
                if *copied { " (copied)" } else { "" }
            ),
            SocketError::Other {
                destination,
                errno,
                origin,
                kind,
                code,
                ..
            } => write!(
                f,
                "error {} for {} (origin {origin}, type {kind}, code {code})",
                std::io::Error::from_raw_os_error(*errno),
                to(destination)
            ),
        }
    }
}

/// Reads the `SO_EE_OFFENDER` address after the 16-byte header.
fn offender(data: &[u8]) -> Option<IpAddr> {
    let fam = u16::from_ne_bytes(data.get(16..18)?.try_into().ok()?);
    match fam as i32 {
        2 => {
            // AF_INET: sockaddr_in { family, port, addr[4] }
            let a: [u8; 4] = data.get(20..24)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(a)))
        }
        10 => {
            // AF_INET6: sockaddr_in6 { family, port, flowinfo, addr[16] }
            let a: [u8; 16] = data.get(24..40)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(a)))
        }
        _ => None,
    }
}

/// One error-queue message as the kernel gave it: the fields of its
/// `struct sock_extended_err`, the original destination (`msg_name`) and
/// the offender address (`SO_EE_OFFENDER`). [`Message::decode`] tells what
/// it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Message {
    /// `ee_errno`.
    pub errno: i32,
    /// `ee_origin` (`ORIGIN_*`).
    pub origin: u8,
    /// `ee_type`: the ICMP type for ICMP errors.
    pub kind: u8,
    /// `ee_code`: the ICMP code for ICMP errors.
    pub code: u8,
    /// `ee_info`.
    pub info: u32,
    /// `ee_data`.
    pub data: u32,
    /// The destination of the datagram the message is about; `None` when
    /// unknown (or the kernel gave the unspecified address and port 0).
    pub destination: Option<SocketAddr>,
    /// The host that sent the ICMP message; `None` when unknown or
    /// unspecified.
    pub offender: Option<IpAddr>,
}

impl Message {
    /// What the message means.
    pub fn decode(&self) -> SocketError {
        let Message {
            errno,
            origin,
            kind,
            code,
            info,
            data,
            destination,
            offender: reporter,
        } = *self;
        let reason = match (origin, kind, code) {
            (ORIGIN_ICMP, 3, 3) | (ORIGIN_ICMP6, 1, 4) => Some(Unreachable::Port),
            (ORIGIN_ICMP, 3, 1) | (ORIGIN_ICMP6, 1, 3) => Some(Unreachable::Host),
            (ORIGIN_ICMP, 3, 0) | (ORIGIN_ICMP6, 1, 0) => Some(Unreachable::Network),
            (ORIGIN_ICMP, 3, 9 | 10 | 13) | (ORIGIN_ICMP6, 1, 1) => Some(Unreachable::Prohibited),
            (ORIGIN_ICMP, 11, _) | (ORIGIN_ICMP6, 3, _) => Some(Unreachable::TimeExceeded),
            (ORIGIN_ICMP, 3, 4) | (ORIGIN_ICMP6, 2, _) => None,
            (ORIGIN_ICMP, 3, _) | (ORIGIN_ICMP6, 1, _) => Some(Unreachable::Other { kind, code }),
            _ => None,
        };
        let too_big = matches!(
            (origin, kind, code),
            (ORIGIN_ICMP, 3, 4) | (ORIGIN_ICMP6, 2, _)
        ) || (origin == ORIGIN_LOCAL && errno == libc_emsgsize());
        if let Some(reason) = reason {
            SocketError::Unreachable {
                destination,
                reason,
                errno,
                reporter,
            }
        } else if too_big {
            SocketError::PacketTooBig {
                destination,
                mtu: info,
                reporter: reporter.filter(|_| origin != ORIGIN_LOCAL),
                local: origin == ORIGIN_LOCAL,
            }
        } else if origin == ORIGIN_ZEROCOPY && errno == 0 {
            SocketError::ZeroCopy {
                lo: info,
                hi: data,
                copied: code & CODE_COPIED != 0,
            }
        } else if origin == ORIGIN_TXTIME {
            SocketError::Txtime {
                departure_ns: (u64::from(data) << 32) | u64::from(info),
                invalid: code == CODE_TXTIME_INVALID,
                errno,
            }
        } else {
            SocketError::Other {
                destination,
                errno,
                origin,
                kind,
                code,
                info,
                data,
            }
        }
    }
}

/// Reads one error-queue message: its control data and the address its
/// `msg_name` gave. `Ok(None)` when it holds no `IP_RECVERR` /
/// `IPV6_RECVERR` control message; an error for a malformed buffer.
pub fn parse_message(
    control: &[u8],
    destination: Option<SocketAddr>,
) -> Result<Option<Message>, CmsgError> {
    for c in Decoder::new(control) {
        let c = c?;
        let ours = (c.level == SOL_IP && c.ty == IP_RECVERR)
            || (c.level == SOL_IPV6 && c.ty == IPV6_RECVERR);
        if !ours || c.data.len() < 16 {
            continue;
        }
        let d = c.data;
        let u32_at = |o: usize| u32::from_ne_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
        return Ok(Some(Message {
            errno: u32_at(0) as i32,
            origin: d[4],
            kind: d[5],
            code: d[6],
            info: u32_at(8),
            data: u32_at(12),
            destination: destination.filter(|a| a.port() != 0 || !a.ip().is_unspecified()),
            offender: offender(d).filter(|a| !a.is_unspecified()),
        }));
    }
    Ok(None)
}

/// Decodes one error-queue message: [`parse_message`], then
/// [`Message::decode`].
#[cfg(any(feature = "tools", test))]
pub fn parse(
    control: &[u8],
    destination: Option<SocketAddr>,
) -> Result<Option<SocketError>, CmsgError> {
    Ok(parse_message(control, destination)?.map(|m| m.decode()))
}

/// `EMSGSIZE` on Linux (the pure layer does not use `libc`).
const fn libc_emsgsize() -> i32 {
    90
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::wire::cmsg::{CmsgBuf, Encoder};

    fn ee(errno: i32, origin: u8, kind: u8, code: u8, info: u32, data: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&errno.to_ne_bytes());
        v.extend_from_slice(&[origin, kind, code, 0]);
        v.extend_from_slice(&info.to_ne_bytes());
        v.extend_from_slice(&data.to_ne_bytes());
        v
    }

    fn one(level: i32, ty: i32, data: &[u8], to: Option<SocketAddr>) -> Option<SocketError> {
        let mut b = CmsgBuf::default();
        let mut e = Encoder::new(&mut b.0);
        e.push(level, ty, data).unwrap();
        let n = e.len();
        parse(&b.0[..n], to).unwrap()
    }

    #[test]
    fn port_unreachable_names_the_destination_and_reporter() {
        let mut d = ee(libc::ECONNREFUSED, ORIGIN_ICMP, 3, 3, 0, 0);
        // sockaddr_in offender 10.0.0.9
        d.extend_from_slice(&2u16.to_ne_bytes());
        d.extend_from_slice(&[0, 0, 10, 0, 0, 9]);
        d.extend_from_slice(&[0; 8]);
        let to: SocketAddr = "10.0.0.2:4433".parse().unwrap();
        let e = one(SOL_IP, IP_RECVERR, &d, Some(to)).unwrap();
        assert_eq!(
            e,
            SocketError::Unreachable {
                destination: Some(to),
                reason: Unreachable::Port,
                errno: libc::ECONNREFUSED,
                reporter: Some("10.0.0.9".parse().unwrap()),
            }
        );
        assert!(e.is_icmp());
        assert!(e.to_string().contains("10.0.0.2:4433 refused"), "{e}");
    }

    #[test]
    fn packet_too_big_gives_the_mtu() {
        let d = ee(libc::EMSGSIZE, ORIGIN_ICMP6, 2, 0, 1280, 0);
        let to: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
        assert_eq!(
            one(SOL_IPV6, IPV6_RECVERR, &d, Some(to)),
            Some(SocketError::PacketTooBig {
                destination: Some(to),
                mtu: 1280,
                reporter: None,
                local: false
            })
        );
        let d = ee(libc::EMSGSIZE, ORIGIN_ICMP, 3, 4, 1400, 0);
        assert!(matches!(
            one(SOL_IP, IP_RECVERR, &d, None),
            Some(SocketError::PacketTooBig { mtu: 1400, .. })
        ));
        let d = ee(libc::EMSGSIZE, ORIGIN_LOCAL, 0, 0, 1500, 0);
        assert!(matches!(
            one(SOL_IP, IP_RECVERR, &d, None),
            Some(SocketError::PacketTooBig {
                mtu: 1500,
                local: true,
                ..
            })
        ));
        assert_eq!(libc_emsgsize(), libc::EMSGSIZE);
    }

    #[test]
    fn zerocopy_txtime_and_other() {
        let d = ee(0, ORIGIN_ZEROCOPY, 0, CODE_COPIED, 3, 7);
        assert_eq!(
            one(SOL_IP, IP_RECVERR, &d, None),
            Some(SocketError::ZeroCopy {
                lo: 3,
                hi: 7,
                copied: true
            })
        );
        let t: u64 = 0x1_2345_6789;
        let d = ee(
            libc::ECANCELED,
            ORIGIN_TXTIME,
            0,
            2,
            t as u32,
            (t >> 32) as u32,
        );
        assert_eq!(
            one(SOL_IP, IP_RECVERR, &d, None),
            Some(SocketError::Txtime {
                departure_ns: t,
                invalid: false,
                errno: libc::ECANCELED
            })
        );
        let d = ee(5, 4, 0, 0, 0, 0);
        assert!(matches!(
            one(SOL_IP, IP_RECVERR, &d, None),
            Some(SocketError::Other { origin: 4, .. })
        ));
        assert_eq!(one(SOL_IP, 99, &d, None), None, "not an error message");
    }

    proptest::proptest! {
        /// Whatever bytes arrive, parsing returns a value or an error and
        /// never reads out of bounds.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = parse(&bytes, None);
            let _ = offender(&bytes);
        }
    }
}
