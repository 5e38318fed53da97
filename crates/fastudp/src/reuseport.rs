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
        /// Offset of the 4 bytes in the UDP payload, at most
        /// [`MAX_STEERING_OFFSET`].
        offset: u32,
    },
    /// By the QUIC destination connection ID: its first byte, found at
    /// offset 6 of a long-header packet and offset 1 of a short-header one
    /// (the header-form bit of byte 0 tells which): socket `byte % N`. A
    /// QUIC server whose connection IDs start with its worker's index gets
    /// every packet of a connection on that worker's socket.
    QuicCid,
}

/// The largest [`Steering::Payload`] offset: the 4 bytes must lie within
/// the largest UDP payload (65527 bytes).
pub const MAX_STEERING_OFFSET: u32 = (crate::wire::MAX_PAYLOAD_V6 - 4) as u32;

/// N sockets bound to one address with `SO_REUSEPORT`, steered by
/// [`Steering`]. Socket `i` of [`ReuseportGroup::sockets`] is index `i` for
/// the steering program.
#[derive(Debug)]
pub struct ReuseportGroup {
    sockets: Vec<Socket>,
    steering: Steering,
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
                return Err(Error::Bind { addr, source });
            }
        }
        let mut sockets = Vec::with_capacity(n);
        let mut at = addr;
        for _ in 0..n {
            let s = new_udp(at)?;
            s.set_reuse_port(true).map_err(|e| Error::Setup {
                what: "SO_REUSEPORT",
                source: e,
            })?;
            s.bind(&at.into()).map_err(|e| Error::Bind {
                addr: at,
                source: e,
            })?;
            let sock = Socket::from_std_with(s.into(), config)?;
            at = sock.local_addr().map_err(|e| Error::Setup {
                what: "getsockname",
                source: e,
            })?;
            sockets.push(sock);
        }
        let prog = match steering {
            Steering::Hash => None,
            Steering::Cpu => Some(bpf::by_cpu(n as u32)),
            Steering::Payload { offset } => Some(bpf::by_payload(offset, n as u32)),
            Steering::QuicCid => Some(bpf::by_quic_cid(n as u32)),
        };
        if let Some(p) = prog {
            sys::attach_reuseport_cbpf(sockets[0].as_raw_fd(), &p).map_err(|e| Error::Setup {
                what: "SO_ATTACH_REUSEPORT_CBPF",
                source: e,
            })?;
        }
        Ok(ReuseportGroup { sockets, steering })
    }

    /// The sockets, in group order.
    pub fn sockets(&self) -> &[Socket] {
        &self.sockets
    }

    /// Takes the sockets out, for one thread each.
    pub fn into_sockets(self) -> Vec<Socket> {
        self.sockets
    }

    /// The address all of them are bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.sockets[0].local_addr()
    }

    /// The steering in force.
    pub fn steering(&self) -> Steering {
        self.steering
    }
}
