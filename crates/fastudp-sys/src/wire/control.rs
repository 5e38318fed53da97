//! The control messages fastudp attaches to sends and reads from receives.

use super::cmsg::{CmsgError, Decoder, Encoder};
use super::consts::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An ECN codepoint: the low two bits of the IPv4 TOS / IPv6 traffic class.
/// `codepoint as u8` gives the two bits; [`EcnCodepoint::from_bits`]
/// decodes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EcnCodepoint {
    /// ECT(0): ECN-capable transport.
    Ect0 = 0b10,
    /// ECT(1): ECN-capable transport (L4S).
    Ect1 = 0b01,
    /// CE: congestion experienced.
    Ce = 0b11,
}

impl EcnCodepoint {
    /// Decodes the ECN bits of a TOS or traffic-class byte; `None` is Not-ECT.
    pub fn from_bits(tos: u8) -> Option<Self> {
        match tos & 0b11 {
            0b10 => Some(EcnCodepoint::Ect0),
            0b01 => Some(EcnCodepoint::Ect1),
            0b11 => Some(EcnCodepoint::Ce),
            _ => None,
        }
    }
}

/// The per-message control data of one send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendControl {
    /// `UDP_SEGMENT`; only set when the message holds more than one segment.
    pub segment_size: Option<u16>,
    /// ECN codepoint, as `IP_TOS` (IPv4 destination) or `IPV6_TCLASS`.
    pub ecn: Option<EcnCodepoint>,
    /// Source address, as `IP_PKTINFO` or `IPV6_PKTINFO`.
    pub src_ip: Option<IpAddr>,
    /// Earliest departure time in ns (`SCM_TXTIME`).
    pub txtime: Option<u64>,
}

/// Encodes `ctl` into `buf` and returns the `msg_controllen` to use.
///
/// `dest_is_v4` is true for an IPv4 destination, native or v4-mapped;
/// `socket_is_v6` is true for an `AF_INET6` socket. A v4 destination on a v6
/// socket takes `IP_TOS` for ECN and a v4-mapped `IPV6_PKTINFO` for the
/// source, which is what the kernel's `ip_cmsg_send` accepts there.
pub fn encode_send(
    buf: &mut [u8],
    ctl: &SendControl,
    dest_is_v4: bool,
    socket_is_v6: bool,
) -> Result<usize, CmsgError> {
    let mut enc = Encoder::new(buf);
    if let Some(seg) = ctl.segment_size {
        enc.push_u16(SOL_UDP, UDP_SEGMENT, seg)?;
    }
    if let Some(ecn) = ctl.ecn {
        if dest_is_v4 {
            enc.push_i32(SOL_IP, IP_TOS, ecn as i32)?;
        } else {
            enc.push_i32(SOL_IPV6, IPV6_TCLASS, ecn as i32)?;
        }
    }
    if let Some(src) = ctl.src_ip {
        match (src, socket_is_v6) {
            (IpAddr::V4(v4), false) => {
                let mut d = [0u8; 12];
                // struct in_pktinfo { int ipi_ifindex; in_addr ipi_spec_dst; in_addr ipi_addr; }
                d[4..8].copy_from_slice(&v4.octets());
                enc.push(SOL_IP, IP_PKTINFO, &d)?;
            }
            (ip, true) => {
                let v6 = match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                enc.push(SOL_IPV6, IPV6_PKTINFO, &in6_pktinfo(v6))?;
            }
            (IpAddr::V6(v6), false) => match v6.to_ipv4_mapped() {
                Some(v4) => {
                    let mut d = [0u8; 12];
                    d[4..8].copy_from_slice(&v4.octets());
                    enc.push(SOL_IP, IP_PKTINFO, &d)?;
                }
                None => return Err(CmsgError::SourceFamily(v6)),
            },
        }
    }
    if let Some(t) = ctl.txtime {
        enc.push_u64(SOL_SOCKET, SCM_TXTIME, t)?;
    }
    Ok(enc.len())
}

fn in6_pktinfo(addr: Ipv6Addr) -> [u8; 20] {
    // struct in6_pktinfo { struct in6_addr ipi6_addr; int ipi6_ifindex; }
    let mut d = [0u8; 20];
    d[..16].copy_from_slice(&addr.octets());
    d
}

/// What fastudp reads from one received message's control data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvControl {
    /// `UDP_GRO`: the segment size of a coalesced message.
    pub stride: Option<usize>,
    /// The ECN bits, from `IP_TOS` or `IPV6_TCLASS`.
    pub ecn: Option<EcnCodepoint>,
    /// True when a TOS / traffic-class message was present at all.
    pub tos_seen: bool,
    /// The destination address of the datagram (`ipi_addr` / `ipi6_addr`).
    pub dst_ip: Option<IpAddr>,
    /// The interface the datagram arrived on.
    pub ifindex: Option<u32>,
    /// `SO_RXQ_OVFL`: the socket's cumulative drop counter.
    pub drops: Option<u32>,
}

fn int_of(data: &[u8]) -> Option<i32> {
    match data.len() {
        1 => Some(data[0] as i32),
        n if n >= 4 => Some(i32::from_ne_bytes(data[..4].try_into().ok()?)),
        _ => None,
    }
}

/// Decodes the control data of one received message.
///
/// Unknown messages are skipped; malformed lengths are an error.
pub fn decode_recv(buf: &[u8]) -> Result<RecvControl, CmsgError> {
    let mut out = RecvControl::default();
    for c in Decoder::new(buf) {
        let c = c?;
        match (c.level, c.ty) {
            (SOL_UDP, UDP_GRO) => {
                out.stride = int_of(c.data).filter(|&v| v > 0).map(|v| v as usize);
            }
            (SOL_IP, IP_TOS) | (SOL_IPV6, IPV6_TCLASS) => {
                if let Some(v) = int_of(c.data) {
                    out.tos_seen = true;
                    out.ecn = EcnCodepoint::from_bits(v as u8);
                }
            }
            (SOL_IP, IP_PKTINFO) if c.data.len() >= 12 => {
                let ifindex = i32::from_ne_bytes(c.data[..4].try_into().unwrap_or_default());
                let a: [u8; 4] = c.data[8..12].try_into().unwrap_or_default();
                out.dst_ip = Some(IpAddr::V4(Ipv4Addr::from(a)));
                out.ifindex = Some(ifindex as u32);
            }
            (SOL_IPV6, IPV6_PKTINFO) if c.data.len() >= 20 => {
                let a: [u8; 16] = c.data[..16].try_into().unwrap_or_default();
                let ifindex = i32::from_ne_bytes(c.data[16..20].try_into().unwrap_or_default());
                out.dst_ip = Some(IpAddr::V6(Ipv6Addr::from(a)));
                out.ifindex = Some(ifindex as u32);
            }
            (SOL_SOCKET, SO_RXQ_OVFL) if c.data.len() >= 4 => {
                out.drops = Some(u32::from_ne_bytes(
                    c.data[..4].try_into().unwrap_or_default(),
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::wire::cmsg::{CmsgBuf, Decoder};

    #[test]
    fn no_control_for_a_plain_send() {
        let mut b = CmsgBuf::default();
        assert_eq!(
            encode_send(&mut b.0, &SendControl::default(), true, false),
            Ok(0)
        );
    }

    #[test]
    fn v4_send_control() {
        let mut b = CmsgBuf::default();
        let ctl = SendControl {
            segment_size: Some(1472),
            ecn: Some(EcnCodepoint::Ect0),
            src_ip: Some("127.0.0.2".parse().unwrap()),
            txtime: None,
        };
        let n = encode_send(&mut b.0, &ctl, true, false).unwrap();
        let msgs: Vec<_> = Decoder::new(&b.0[..n]).map(Result::unwrap).collect();
        assert_eq!(msgs.len(), 3);
        assert_eq!((msgs[0].level, msgs[0].ty), (17, 103));
        assert_eq!(msgs[0].data, 1472u16.to_ne_bytes());
        assert_eq!((msgs[1].level, msgs[1].ty), (0, 1));
        assert_eq!(msgs[1].data, 2i32.to_ne_bytes());
        assert_eq!((msgs[2].level, msgs[2].ty), (0, 8));
        assert_eq!(&msgs[2].data[4..8], &[127, 0, 0, 2]);
    }

    #[test]
    fn mapped_destination_on_v6_socket_uses_ip_tos_and_mapped_pktinfo() {
        let mut b = CmsgBuf::default();
        let ctl = SendControl {
            ecn: Some(EcnCodepoint::Ce),
            src_ip: Some("127.0.0.1".parse().unwrap()),
            ..Default::default()
        };
        let n = encode_send(&mut b.0, &ctl, true, true).unwrap();
        let msgs: Vec<_> = Decoder::new(&b.0[..n]).map(Result::unwrap).collect();
        assert_eq!((msgs[0].level, msgs[0].ty), (0, 1));
        assert_eq!((msgs[1].level, msgs[1].ty), (41, 50));
        let want: Ipv6Addr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(&msgs[1].data[..16], &want.octets());
    }

    #[test]
    fn v6_send_uses_tclass() {
        let mut b = CmsgBuf::default();
        let ctl = SendControl {
            ecn: Some(EcnCodepoint::Ect1),
            ..Default::default()
        };
        let n = encode_send(&mut b.0, &ctl, false, true).unwrap();
        let m = Decoder::new(&b.0[..n]).next().unwrap().unwrap();
        assert_eq!((m.level, m.ty, m.data), (41, 67, &1i32.to_ne_bytes()[..]));
    }

    #[test]
    fn decodes_what_the_kernel_sends() {
        let mut b = CmsgBuf::default();
        let mut enc = Encoder::new(&mut b.0);
        enc.push_i32(SOL_UDP, UDP_GRO, 1216).unwrap();
        enc.push(SOL_IP, IP_TOS, &[0x03]).unwrap();
        let mut pi = [0u8; 12];
        pi[..4].copy_from_slice(&1i32.to_ne_bytes());
        pi[8..].copy_from_slice(&[127, 0, 0, 1]);
        enc.push(SOL_IP, IP_PKTINFO, &pi).unwrap();
        enc.push(SOL_SOCKET, SO_RXQ_OVFL, &7u32.to_ne_bytes())
            .unwrap();
        let n = enc.len();
        let r = decode_recv(&b.0[..n]).unwrap();
        assert_eq!(r.stride, Some(1216));
        assert_eq!(r.ecn, Some(EcnCodepoint::Ce));
        assert_eq!(r.dst_ip, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(r.ifindex, Some(1));
        assert_eq!(r.drops, Some(7));
    }

    #[test]
    fn decodes_v6_pktinfo_and_tclass() {
        let mut b = CmsgBuf::default();
        let mut enc = Encoder::new(&mut b.0);
        let mut pi = in6_pktinfo("::1".parse().unwrap());
        pi[16..].copy_from_slice(&1i32.to_ne_bytes());
        enc.push(SOL_IPV6, IPV6_PKTINFO, &pi).unwrap();
        enc.push_i32(SOL_IPV6, IPV6_TCLASS, 2).unwrap();
        let n = enc.len();
        let r = decode_recv(&b.0[..n]).unwrap();
        assert_eq!(r.dst_ip, Some("::1".parse().unwrap()));
        assert_eq!(r.ecn, Some(EcnCodepoint::Ect0));
        assert_eq!(r.stride, None);
    }

    proptest::proptest! {
        /// Whatever bytes arrive as control data, decoding returns a value
        /// or an error, never a panic or an out-of-bounds read.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = decode_recv(&bytes);
            for m in Decoder::new(&bytes).flatten() {
                proptest::prop_assert!(m.data.len() <= bytes.len());
            }
        }

        /// Whatever is encoded decodes back to the same values.
        #[test]
        fn encode_then_decode_round_trips(seg in 1u16.., ecn in 0u8..4, v4 in proptest::prelude::any::<[u8; 4]>()) {
            let mut b = CmsgBuf::default();
            let ctl = SendControl {
                segment_size: Some(seg),
                ecn: EcnCodepoint::from_bits(ecn),
                src_ip: Some(IpAddr::V4(Ipv4Addr::from(v4))),
                txtime: Some(7),
            };
            let n = encode_send(&mut b.0, &ctl, true, false).unwrap();
            let msgs: Vec<_> = Decoder::new(&b.0[..n]).collect::<Result<_, _>>().unwrap();
            proptest::prop_assert_eq!(msgs[0].data, &seg.to_ne_bytes()[..]);
            proptest::prop_assert_eq!(msgs.len(), 3 + usize::from(ctl.ecn.is_some()));
        }
    }

    #[test]
    fn ecn_bits_round_trip() {
        for e in [EcnCodepoint::Ect0, EcnCodepoint::Ect1, EcnCodepoint::Ce] {
            assert_eq!(EcnCodepoint::from_bits(e as u8 | 0xb8), Some(e));
        }
        assert_eq!(EcnCodepoint::from_bits(0xb8), None);
    }
}
