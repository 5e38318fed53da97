//! A reuseport receive group: N sockets on one address, with a classic BPF
//! program deciding which socket gets each datagram.

use crate::error::{ConfigError, Error};
use crate::socket::{new_udp, Config, Socket};
use crate::sys;
use crate::wire::bpf;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// How datagrams are spread over the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Steering {
    /// The kernel's default: a hash of the 4-tuple.
    Hash,
    /// By the CPU that received the datagram: socket `cpu % N`.
    Cpu,
    /// By 4 payload bytes at `offset` (a QUIC connection ID, say), read
    /// big-endian: socket `word % N`. A flow with fixed bytes there always
    /// lands on the same socket, whatever its source address.
    Payload {
        /// Offset of the 4 bytes in the UDP payload, at most 65523 (the 4
        /// bytes must lie within the largest UDP payload, 65527 bytes).
        /// A larger one is refused with [`crate::ErrorKind::Config`].
        offset: u32,
    },
    /// By the QUIC destination connection ID: its first byte, found at
    /// offset 6 of a long-header packet and offset 1 of a short-header one
    /// (the header-form bit of byte 0 tells which): socket `byte % N`. A
    /// QUIC server whose connection IDs start with its worker's index gets
    /// every packet of a connection on that worker's socket.
    QuicCid,
    /// By byte `index` of the QUIC destination connection ID (as
    /// [`Steering::QuicCid`], which is index 0): socket `byte % N`. A
    /// QUIC-LB connection ID (draft-ietf-quic-load-balancers) starts with
    /// a first octet and a server ID that a load balancer routes by; the
    /// worker's byte is then the first of the nonce, at `1 + server ID
    /// length`. At most 19 (QUIC version 1's IDs are at most 20 bytes); a
    /// larger one is refused with [`crate::ErrorKind::Config`].
    QuicCidAt {
        /// The byte's index within the connection ID, 0 to 19.
        index: u8,
    },
}

/// The largest [`Steering::Payload`] offset: the 4 bytes must lie within
/// the largest UDP payload (65527 bytes).
pub(crate) const MAX_STEERING_OFFSET: u32 = (crate::wire::MAX_PAYLOAD_V6 - 4) as u32;

impl Steering {
    /// The index of the socket among `n` that this steering gives
    /// `datagram`, computed in user space exactly as the kernel's run of the
    /// group's program computes it; `None` for [`Steering::Hash`] and
    /// [`Steering::Cpu`], which depend on the 4-tuple's hash or the
    /// receiving CPU, not on the datagram.
    ///
    /// A worker that receives a datagram owned by another socket (one
    /// steered before the program was attached, say) can hand it on. A
    /// datagram too short for the steering bytes belongs to socket 0, as in
    /// the kernel; `n` of 0 counts as 1.
    ///
    /// ```
    /// use fastudp_io::Steering;
    /// // A QUIC short-header packet whose destination connection ID
    /// // starts with 7: socket 7 % 4.
    /// assert_eq!(Steering::QuicCid.owner(&[0x40, 7, 1, 2, 3], 4), Some(3));
    /// assert_eq!(Steering::Hash.owner(&[0x40, 7], 4), None);
    /// ```
    pub fn owner(&self, datagram: &[u8], n: usize) -> Option<usize> {
        let n = u32::try_from(n).unwrap_or(u32::MAX).max(1);
        match *self {
            Steering::Hash | Steering::Cpu => None,
            Steering::Payload { offset } => {
                let o = offset as usize;
                let word = datagram
                    .get(o..o.saturating_add(4))
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                Some((word % n) as usize)
            }
            Steering::QuicCid => Some(bpf::quic_cid_index(datagram, n) as usize),
            Steering::QuicCidAt { index } => {
                Some(bpf::quic_cid_index_at(datagram, index, n) as usize)
            }
        }
    }
}

/// N sockets bound to one address with `SO_REUSEPORT`, steered by
/// [`Steering`]. Socket `i` of [`ReuseportGroup::sockets`] is index `i` for
/// the steering program. All of them are bound to one address:
/// `group.sockets()[0].local_addr()`.
#[derive(Debug)]
pub struct ReuseportGroup {
    sockets: Vec<Socket>,
}

impl ReuseportGroup {
    /// Binds `n` sockets to `addr` (port 0 picks one port for all).
    pub fn bind(
        addr: SocketAddr,
        n: usize,
        steering: Steering,
        config: Config,
    ) -> Result<Self, Error> {
        if n == 0 {
            return Err(ConfigError::EmptyGroup.into());
        }
        if let Steering::Payload { offset } = steering {
            // Classic BPF reads offsets from 0xFFE00000 up as link-layer,
            // network-header or kernel metadata, not payload.
            if offset > MAX_STEERING_OFFSET {
                return Err(ConfigError::SteeringOffset {
                    offset,
                    max: MAX_STEERING_OFFSET,
                }
                .into());
            }
        }
        if let Steering::QuicCidAt { index } = steering {
            if index > bpf::MAX_QUIC_CID_INDEX {
                return Err(ConfigError::SteeringCidIndex {
                    index,
                    max: bpf::MAX_QUIC_CID_INDEX,
                }
                .into());
            }
        }
        if addr.port() != 0 {
            // Any socket already there with SO_REUSEPORT (another process's
            // group, say) would silently join this group and take a share
            // of its flows: refuse the address instead.
            if let Err(e) = new_udp(addr)?.bind(&addr.into()) {
                let source = if e.kind() == std::io::ErrorKind::AddrInUse {
                    std::io::Error::new(
                        e.kind(),
                        "another socket is bound there already, and would share the group's datagrams",
                    )
                } else {
                    e
                };
                return Err(Error::from(crate::error::Detail::Bind { addr, source }));
            }
        }
        let mut sockets = Vec::with_capacity(n);
        let mut at = addr;
        for _ in 0..n {
            let s = new_udp(at)?;
            s.set_reuse_port(true).map_err(|e| {
                Error::from(crate::error::Detail::Setup {
                    what: "SO_REUSEPORT",
                    source: e,
                })
            })?;
            s.bind(&at.into()).map_err(|e| {
                Error::from(crate::error::Detail::Bind {
                    addr: at,
                    source: e,
                })
            })?;
            let sock = Socket::from_std(s.into(), config)?;
            at = sock.as_std().local_addr().map_err(|e| {
                Error::from(crate::error::Detail::Setup {
                    what: "getsockname",
                    source: e,
                })
            })?;
            sockets.push(sock);
        }
        let prog = match steering {
            Steering::Hash => None,
            Steering::Cpu => Some(bpf::by_cpu(n as u32)),
            Steering::Payload { offset } => Some(bpf::by_payload(offset, n as u32)),
            Steering::QuicCid => Some(bpf::by_quic_cid(n as u32)),
            Steering::QuicCidAt { index } => Some(bpf::by_quic_cid_at(index, n as u32)),
        };
        if let Some(p) = prog {
            sys::attach_reuseport_cbpf(sockets[0].as_raw_fd(), &p).map_err(|e| {
                Error::from(crate::error::Detail::Setup {
                    what: "SO_ATTACH_REUSEPORT_CBPF",
                    source: e,
                })
            })?;
        }
        Ok(ReuseportGroup { sockets })
    }

    /// The sockets, in group order.
    pub fn sockets(&self) -> &[Socket] {
        &self.sockets
    }

    /// Takes the sockets out, for one thread each.
    pub fn into_sockets(self) -> Vec<Socket> {
        self.sockets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The user-space owner is the socket the kernel's program picks.
        #[test]
        fn the_owner_is_what_the_program_picks(
            d in any::<Vec<u8>>(), n in 1usize..300, offset in 0u32..64,
        ) {
            let quic = bpf::run(&bpf::by_quic_cid(n as u32), &d, 0).map(|i| i as usize);
            prop_assert_eq!(Steering::QuicCid.owner(&d, n), quic);
            let payload = bpf::run(&bpf::by_payload(offset, n as u32), &d, 0).map(|i| i as usize);
            prop_assert_eq!(Steering::Payload { offset }.owner(&d, n), payload);
            let index = (offset % 20) as u8;
            let at = bpf::run(&bpf::by_quic_cid_at(index, n as u32), &d, 0).map(|i| i as usize);
            prop_assert_eq!(Steering::QuicCidAt { index }.owner(&d, n), at);
        }
    }

    #[test]
    fn hash_and_cpu_have_no_owner_and_zero_sockets_count_as_one() {
        assert_eq!(Steering::Hash.owner(&[0; 16], 4), None);
        assert_eq!(Steering::Cpu.owner(&[0; 16], 4), None);
        assert_eq!(Steering::QuicCid.owner(&[0x40, 9], 0), Some(0));
        assert_eq!(Steering::QuicCid.owner(&[], 4), Some(0));
        // A long header: the DCID's first byte is at offset 6.
        assert_eq!(
            Steering::QuicCid.owner(&[0xc0, 0, 0, 0, 1, 8, 5], 4),
            Some(1)
        );
    }
}
