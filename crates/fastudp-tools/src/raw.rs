//! Thin, safe, one-to-one wrappers over the send and receive syscalls, in
//! the manner of `socket2`, for tools that compare strategies (such as the
//! `fastudp bench` command) and for callers that need a call the
//! [`Socket`](fastudp_io::Socket) type does not make. Most users want `Socket`.
//!
//! Not part of the library's API: it exists for the `fastudp` command
//! and may change at any time.

use crate::sys;
pub use crate::sys::OutMsg;
use crate::wire::cmsg::CmsgBuf;
use crate::wire::consts::{IPV6_MTU, IP_MTU, SOL_IP, SOL_IPV6};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};

/// `sendmsg(2)`: one message, gathered from `msg.iov`, with its control
/// data. Returns the bytes sent.
pub fn sendmsg(sock: &UdpSocket, msg: &OutMsg<'_>) -> io::Result<usize> {
    sys::sendmsg(sock.as_fd(), msg, 0)
}

/// `sendmmsg(2)`: up to [`crate::os::MAX_BATCH`] messages in one call.
/// Returns how many messages were sent.
pub fn sendmmsg(sock: &UdpSocket, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
    sys::sendmmsg(sock.as_fd(), msgs, 0)
}

/// `setsockopt(2)` with an `int` value.
pub fn set_option_int(sock: &impl AsRawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    sys::setsockopt_int(sock.as_raw_fd(), level, name, value)
}

/// `getsockopt(2)` of an `int` option.
pub fn get_option_int(sock: &impl AsRawFd, level: i32, name: i32) -> io::Result<i32> {
    sys::getsockopt_int(sock.as_raw_fd(), level, name)
}

/// The path MTU of a *connected* socket (`IP_MTU` / `IPV6_MTU`).
pub fn path_mtu(sock: &UdpSocket) -> io::Result<usize> {
    let v6 = sock.local_addr()?.is_ipv6() && !sock.peer_addr()?.ip().to_canonical().is_ipv4();
    let (level, name) = if v6 {
        (SOL_IPV6, IPV6_MTU)
    } else {
        (SOL_IP, IP_MTU)
    };
    sys::getsockopt_int(sock.as_raw_fd(), level, name).map(|m| m as usize)
}

/// A `socket2::SockAddr` for a destination, for [`OutMsg::addr`].
pub fn sockaddr(addr: SocketAddr) -> socket2::SockAddr {
    addr.into()
}

/// An aligned control buffer, for [`OutMsg::control`] and
/// [`crate::wire::cmsg::Encoder`].
pub fn control_buffer() -> CmsgBuf {
    CmsgBuf::default()
}

/// `sendmsg(2)` of one gathered message with `flags` (such as
/// `MSG_ZEROCOPY`) on any socket, a connected TCP stream too: `msg.addr`
/// is `None` there. Returns the bytes sent, which for a stream may be
/// fewer than given.
pub fn sendmsg_flags(sock: &impl AsFd, msg: &OutMsg<'_>, flags: i32) -> io::Result<usize> {
    sys::sendmsg(sock.as_fd(), msg, flags)
}

/// Reads one message of the socket's error queue (`MSG_ERRQUEUE`),
/// without waiting, and decodes it: a zerocopy completion, an ICMP error
/// and so on. `Ok(None)` when the queue is empty; a message the decoder
/// does not know is skipped. Works on any socket, a TCP stream too.
pub fn recv_error(sock: &impl AsFd) -> io::Result<Option<crate::wire::errqueue::SocketError>> {
    let mut cb = CmsgBuf::default();
    let mut name = sys::AddrBuf::default();
    loop {
        let Some((len, dest)) = sys::recv_errqueue(sock.as_fd(), &mut cb, &mut name)? else {
            return Ok(None);
        };
        match crate::wire::errqueue::parse(&cb.0[..len.min(cb.0.len())], dest) {
            Ok(Some(e)) => return Ok(Some(e)),
            Ok(None) => continue,
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
    }
}

/// Waits up to `timeout` until the socket's error queue has a message
/// (`poll(2)` for `POLLERR`); true when it has.
pub fn wait_error(sock: &impl AsFd, timeout: std::time::Duration) -> io::Result<bool> {
    sys::poll(sock.as_fd().as_raw_fd(), sys::POLLERR, timeout)
}
