//! Portable fallback for Unix systems other than Linux: one datagram per
//! `sendmsg`/`recvmsg`-equivalent call, no control messages.

use super::{InControl, InMeta, OutMsg};
use std::io;
use std::net::UdpSocket;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

/// `MSG_TRUNC` (not reported by this fallback).
pub const MSG_TRUNC: i32 = 0x10;
/// `MSG_CTRUNC` (not reported by this fallback).
pub const MSG_CTRUNC: i32 = 0x20;

fn gather(m: &OutMsg<'_>) -> Vec<u8> {
    m.iov.iter().flat_map(|s| s.iter().copied()).collect()
}

fn unsupported() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "not supported on this platform")
}

/// Sends the messages one at a time; returns how many were sent.
pub(crate) fn sendmmsg(sock: &UdpSocket, msgs: &[OutMsg<'_>], flags: i32) -> io::Result<usize> {
    let mut sent = 0;
    for m in msgs {
        match sendmsg(sock, m, flags) {
            Ok(_) => sent += 1,
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sent)
}

/// Sends one message without control data.
pub(crate) fn sendmsg(sock: &UdpSocket, m: &OutMsg<'_>, _flags: i32) -> io::Result<usize> {
    let data = gather(m);
    match m.addr.and_then(|a| a.as_socket()) {
        Some(to) => sock.send_to(&data, to),
        None => sock.send(&data),
    }
}

/// Receives one message at a time into the first slot.
pub(crate) fn recvmmsg(
    sock: &UdpSocket,
    buf: &mut [u8],
    stride: usize,
    controls: &mut [InControl],
    metas: &mut [InMeta],
    flags: i32,
) -> io::Result<usize> {
    if metas.is_empty() || controls.is_empty() || buf.len() < stride {
        return Ok(0);
    }
    metas[0] = recvmsg(sock, &mut buf[..stride], &mut controls[0], flags)?;
    Ok(1)
}

/// Receives one datagram.
pub(crate) fn recvmsg(
    sock: &UdpSocket,
    buf: &mut [u8],
    _control: &mut InControl,
    _flags: i32,
) -> io::Result<InMeta> {
    let (len, from) = sock.recv_from(buf)?;
    Ok(InMeta {
        len,
        flags: 0,
        source: Some(from),
        control_len: 0,
    })
}

/// Not available: every option fastudp sets here is Linux-specific.
pub(crate) fn setsockopt_int(_fd: RawFd, _level: i32, _name: i32, _value: i32) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub(crate) fn getsockopt_int(_fd: RawFd, _level: i32, _name: i32) -> io::Result<i32> {
    Err(unsupported())
}

/// No error queue here.
pub(crate) fn recv_errqueue(
    _sock: &UdpSocket,
    _control: &mut InControl,
) -> io::Result<Option<usize>> {
    Ok(None)
}

/// `MSG_ZEROCOPY` (not available here).
pub const MSG_ZEROCOPY: i32 = 0;
/// `POLLERR`.
pub(crate) const POLLERR: i16 = 8;

/// Not available here.
pub(crate) fn socket_drops(_fd: RawFd) -> io::Result<u32> {
    Err(unsupported())
}

#[cfg(feature = "unstable-tools")]
/// ethtool exists only on Linux.
pub(crate) fn ethtool_ioctl(_ifname: &str, _data: &mut [u8]) -> io::Result<()> {
    Err(unsupported())
}

/// Reuseport steering programs exist only on Linux.
pub(crate) fn attach_reuseport_cbpf(
    _fd: RawFd,
    _prog: &[crate::wire::bpf::Insn],
) -> io::Result<()> {
    Err(unsupported())
}

/// `SO_MAX_PACING_RATE` (not available here).
pub(crate) const SO_MAX_PACING_RATE: i32 = -1;

/// Not available here.
pub(crate) fn getsockopt_u64(_fd: RawFd, _level: i32, _name: i32) -> io::Result<u64> {
    Err(unsupported())
}

/// Not available here.
pub(crate) fn setsockopt_bytes(
    _fd: RawFd,
    _level: i32,
    _name: i32,
    _value: &[u8],
) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub(crate) fn set_txtime(_fd: RawFd, _clockid: i32, _flags: u32) -> io::Result<()> {
    Err(unsupported())
}

/// Readiness is not polled here: blocking calls wait by themselves.
pub(crate) fn poll(_fd: RawFd, _events: i16, timeout: Duration) -> io::Result<bool> {
    std::thread::sleep(timeout.min(Duration::from_millis(1)));
    Ok(true)
}

/// `SO_RCVBUFFORCE`: `SO_RCVBUF` past `rmem_max` (CAP_NET_ADMIN).
pub(crate) const SO_RCVBUFFORCE: i32 = -1;
/// `SO_SNDBUFFORCE`: `SO_SNDBUF` past `wmem_max` (CAP_NET_ADMIN).
pub(crate) const SO_SNDBUFFORCE: i32 = -1;

/// `POLLOUT`.
pub(crate) const POLLOUT: i16 = 4;

/// Network namespaces exist only on Linux.
pub fn setns_net(_fd: BorrowedFd<'_>) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub fn set_timer_slack(_ns: u64) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub fn pin_to_cpu(_cpu: usize) -> io::Result<()> {
    Err(unsupported())
}
