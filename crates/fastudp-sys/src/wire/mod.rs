//! Pure wire logic: no syscalls, no `unsafe`.
//!
//! fastudp-io's, and through the `fastudp-tools` crate (not published)
//! the command's, the tests', the benchmarks' and the fuzz targets'; items
//! only those use are compiled with this crate's `tools` feature only.
//!
//! Everything here works on plain byte buffers and numbers, so it can be
//! unit-tested, property-tested and fuzzed without a kernel:
//!
//! - [`cmsg`]: the control-message (ancillary data) layout, as typed views
//!   over a byte buffer with checked constructors;
//! - [`control`]: the control messages fastudp sends and receives
//!   (UDP_SEGMENT, UDP_GRO, ECN, PKTINFO, SO_RXQ_OVFL);
//! - [`plan`]: GSO train planning within every kernel limit;
//! - [`gro`]: splitting a coalesced (GRO) receive buffer into datagrams;
//! - [`errqueue`]: error-queue messages (ICMP, txtime, zerocopy) as types;
//! - [`zerocopy`]: MSG_ZEROCOPY buffer bookkeeping.

pub mod bpf;
pub mod cmsg;
pub mod control;
pub mod errqueue;
pub mod gro;
pub mod plan;
pub mod zerocopy;

/// Linux constants for the socket options and control messages fastudp uses.
///
/// They are the kernel's ABI values, spelled out so that the pure layer can
/// encode and decode them on any host (and be tested without `libc`'s
/// per-platform tables).
pub mod consts {
    /// `SOL_SOCKET`.
    pub const SOL_SOCKET: i32 = 1;
    /// `SOL_IP` / `IPPROTO_IP`.
    pub const SOL_IP: i32 = 0;
    /// `SOL_IPV6` / `IPPROTO_IPV6`.
    pub const SOL_IPV6: i32 = 41;
    /// `SOL_UDP` / `IPPROTO_UDP`.
    pub const SOL_UDP: i32 = 17;
    /// `UDP_SEGMENT`: GSO segment size (socket option `int`, cmsg `u16`).
    pub const UDP_SEGMENT: i32 = 103;
    /// `UDP_GRO`: receive coalescing (socket option `int`, cmsg `int` gso_size).
    pub const UDP_GRO: i32 = 104;
    /// `IP_TOS`: type of service byte (send cmsg `int`, receive cmsg `u8`).
    pub const IP_TOS: i32 = 1;
    /// `IP_PKTINFO`: `struct in_pktinfo`.
    pub const IP_PKTINFO: i32 = 8;
    /// `IP_RECVTOS`: ask for `IP_TOS` on receive.
    pub const IP_RECVTOS: i32 = 13;
    /// `IPV6_RECVPKTINFO`: ask for `IPV6_PKTINFO` on receive.
    pub const IPV6_RECVPKTINFO: i32 = 49;
    /// `IPV6_PKTINFO`: `struct in6_pktinfo`.
    pub const IPV6_PKTINFO: i32 = 50;
    /// `IPV6_RECVTCLASS`: ask for `IPV6_TCLASS` on receive.
    pub const IPV6_RECVTCLASS: i32 = 66;
    /// `IPV6_TCLASS`: traffic class (`int`).
    pub const IPV6_TCLASS: i32 = 67;
    /// `SO_RXQ_OVFL`: cumulative count of datagrams the socket dropped (`u32`).
    pub const SO_RXQ_OVFL: i32 = 40;
    /// `SO_TXTIME` / `SCM_TXTIME`: earliest departure time (`u64` ns).
    pub const SCM_TXTIME: i32 = 61;
    /// `SO_ZEROCOPY`.
    pub const SO_ZEROCOPY: i32 = 60;
    /// `IP_MTU_DISCOVER`: path-MTU discovery mode (`int`).
    pub const IP_MTU_DISCOVER: i32 = 10;
    /// `IP_PMTUDISC_PROBE`: set DF, ignore the path MTU the kernel learnt.
    pub const IP_PMTUDISC_PROBE: i32 = 3;
    /// `IP_RECVERR`: queue extended errors; also the error cmsg type.
    pub const IP_RECVERR: i32 = 11;
    /// `IP_MTU`: the path MTU of a connected socket.
    #[cfg(feature = "tools")]
    pub const IP_MTU: i32 = 14;
    /// `IPV6_MTU_DISCOVER`.
    pub const IPV6_MTU_DISCOVER: i32 = 23;
    /// `IPV6_PMTUDISC_PROBE`.
    pub const IPV6_PMTUDISC_PROBE: i32 = 3;
    /// `IPV6_MTU`: the path MTU of a connected socket.
    #[cfg(feature = "tools")]
    pub const IPV6_MTU: i32 = 24;
    /// `IPV6_RECVERR`: queue extended errors; also the error cmsg type.
    pub const IPV6_RECVERR: i32 = 25;
    /// `IPV6_DONTFRAG`: never fragment locally; refuse instead.
    pub const IPV6_DONTFRAG: i32 = 62;
}

/// Largest UDP payload of one IPv4 send call: 65535 - 20 (IP) - 8 (UDP).
pub const MAX_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload of one IPv6 send call: 65535 - 8 (UDP); the IPv6
/// header is not counted in the payload length field.
pub const MAX_PAYLOAD_V6: usize = 65_527;
/// IPv4 + UDP header bytes: the MTU minus this is the largest segment.
pub const HEADER_V4: usize = 28;
/// IPv6 + UDP header bytes: the MTU minus this is the largest segment.
pub const HEADER_V6: usize = 48;
/// `UDP_GRO_CNT_MAX`: most segments the kernel coalesces into one read.
pub const GRO_MAX_SEGMENTS: usize = 64;

/// The largest UDP payload of one send call for an address family.
pub const fn max_payload(ipv6: bool) -> usize {
    if ipv6 {
        MAX_PAYLOAD_V6
    } else {
        MAX_PAYLOAD_V4
    }
}

/// The largest segment (payload bytes per datagram) that fits a link MTU.
pub const fn max_segment_for_mtu(mtu: usize, ipv6: bool) -> usize {
    let hdr = if ipv6 { HEADER_V6 } else { HEADER_V4 };
    mtu.saturating_sub(hdr)
}
