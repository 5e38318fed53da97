//! Portable fallback for Unix systems other than Linux: one datagram per
//! `sendto`/`recvfrom` call, no control messages (a message that carries
//! some is refused with `Unsupported`, never sent without them).

use super::{InControl, InMeta, OutMsg, SendMsg, MAX_BATCH, SEND_CONTROL_LEN};
use socket2::SockRef;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::time::Duration;

/// `MSG_TRUNC` (not reported by this fallback).
pub const MSG_TRUNC: i32 = 0x10;
/// `MSG_CTRUNC` (not reported by this fallback).
pub const MSG_CTRUNC: i32 = 0x20;

fn unsupported() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "not supported on this platform")
}

fn no_control() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "control messages (GSO, ECN, source address, departure time) are not supported on this platform",
    )
}

/// Sends one payload to `dest` (or the connected peer).
fn send_one(fd: BorrowedFd<'_>, dest: Option<SocketAddr>, payload: &[u8]) -> io::Result<usize> {
    let sock = SockRef::from(&fd);
    match dest {
        Some(to) => sock.send_to(payload, &to.into()),
        None => sock.send(payload),
    }
}

/// Sends the messages one at a time; returns how many were sent.
#[cfg(feature = "tools")]
pub fn sendmmsg(fd: BorrowedFd<'_>, msgs: &[OutMsg<'_>], flags: i32) -> io::Result<usize> {
    let mut sent = 0;
    for m in msgs.iter().take(MAX_BATCH) {
        match sendmsg(fd, m, flags) {
            Ok(_) => sent += 1,
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(sent)
}

/// Sends one gathered message; refuses control data.
pub fn sendmsg(fd: BorrowedFd<'_>, m: &OutMsg<'_>, _flags: i32) -> io::Result<usize> {
    if !m.control.is_empty() {
        return Err(no_control());
    }
    let sock = SockRef::from(&fd);
    match m.addr {
        Some(to) => sock.send_to_vectored(m.iov, to),
        None => sock.send_vectored(m.iov),
    }
}

/// Sends `n` messages built by `fill`, one `sendto` each (only the first
/// when `mmsg` is false), with the same contract as on Linux: the count
/// sent, or the first message's error.
pub fn send_batch<'a, E>(
    fd: BorrowedFd<'_>,
    n: usize,
    _flags: i32,
    mmsg: bool,
    mut fill: impl FnMut(usize, &mut [u8]) -> Result<SendMsg<'a>, E>,
) -> Result<io::Result<usize>, E> {
    let n = if mmsg { n.min(MAX_BATCH) } else { n.min(1) };
    let mut ctl = [0u8; SEND_CONTROL_LEN];
    let mut sent = 0;
    for i in 0..n {
        ctl.fill(0);
        let m = fill(i, &mut ctl)?;
        let r = if m.control_len > 0 {
            Err(no_control())
        } else {
            send_one(fd, m.dest, m.payload)
        };
        match r {
            Ok(_) => sent += 1,
            Err(e) if sent == 0 => return Ok(Err(e)),
            Err(_) => break,
        }
    }
    Ok(Ok(sent))
}

/// Where a received message's source address lands.
#[derive(Clone, Copy, Default)]
pub struct AddrBuf(Option<SocketAddr>);

impl std::fmt::Debug for AddrBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddrBuf(..)")
    }
}

/// Receives one datagram into the first slot (`n` is at most 1 here);
/// no control data is reported.
#[allow(clippy::too_many_arguments)]
pub fn recvmmsg(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    stride: usize,
    controls: &mut [InControl],
    names: &mut [AddrBuf],
    metas: &mut [InMeta],
    n: usize,
    _flags: i32,
) -> io::Result<usize> {
    if n == 0 || metas.is_empty() || controls.is_empty() || names.is_empty() || buf.len() < stride {
        return Ok(0);
    }
    let sock = SockRef::from(&fd);
    let slot = &mut buf[..stride];
    // SAFETY: `[u8]` and `[MaybeUninit<u8>]` have the same layout, and the
    // socket only writes initialised bytes into the slice, so it stays
    // initialised for the `&mut [u8]` it came from.
    let uninit = unsafe { &mut *(slot as *mut [u8] as *mut [MaybeUninit<u8>]) };
    let (len, from) = sock.recv_from(uninit)?;
    names[0] = AddrBuf(from.as_socket());
    metas[0] = InMeta {
        len,
        flags: 0,
        source: names[0].0,
        control_len: 0,
    };
    Ok(1)
}

/// Receives one datagram into `bufs[0]` and reports it through `each`
/// (no control data here).
pub fn recvmmsg_slices(
    fd: BorrowedFd<'_>,
    bufs: &mut [io::IoSliceMut<'_>],
    _flags: i32,
    mut each: impl FnMut(usize, InMeta, &[u8]),
) -> io::Result<usize> {
    let Some(first) = bufs.first_mut() else {
        return Ok(0);
    };
    let sock = SockRef::from(&fd);
    let slot: &mut [u8] = first;
    // SAFETY: as in `recvmmsg`: same layout, and the socket writes only
    // initialised bytes.
    let uninit = unsafe { &mut *(slot as *mut [u8] as *mut [MaybeUninit<u8>]) };
    let (len, from) = sock.recv_from(uninit)?;
    each(
        0,
        InMeta {
            len,
            flags: 0,
            source: from.as_socket(),
            control_len: 0,
        },
        &[],
    );
    Ok(1)
}

/// Not available: every option fastudp sets here is Linux-specific.
pub fn setsockopt_int(_fd: RawFd, _level: i32, _name: i32, _value: i32) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
#[cfg(feature = "tools")]
pub fn getsockopt_int(_fd: RawFd, _level: i32, _name: i32) -> io::Result<i32> {
    Err(unsupported())
}

/// No error queue here: always empty.
pub fn recv_errqueue(
    _fd: BorrowedFd<'_>,
    _control: &mut InControl,
    _name: &mut AddrBuf,
) -> io::Result<Option<(usize, Option<SocketAddr>)>> {
    Ok(None)
}

/// True when the descriptor is in non-blocking mode (`O_NONBLOCK`).
pub fn is_nonblocking(fd: BorrowedFd<'_>) -> io::Result<bool> {
    SockRef::from(&fd).nonblocking()
}

/// `MSG_ZEROCOPY` (not available here).
pub const MSG_ZEROCOPY: i32 = 0;
/// `POLLERR`.
pub const POLLERR: i16 = 8;

/// Not available here.
pub fn socket_drops(_fd: RawFd) -> io::Result<u32> {
    Err(unsupported())
}

#[cfg(feature = "tools")]
/// ethtool exists only on Linux.
pub fn ethtool_ioctl(_ifname: &str, _data: &mut [u8]) -> io::Result<()> {
    Err(unsupported())
}

/// Reuseport steering programs exist only on Linux.
pub fn attach_reuseport_cbpf(_fd: RawFd, _prog: &[crate::wire::bpf::Insn]) -> io::Result<()> {
    Err(unsupported())
}

/// `SO_MAX_PACING_RATE` (not available here).
pub const SO_MAX_PACING_RATE: i32 = -1;

/// Not available here.
#[cfg(feature = "tools")]
pub fn getsockopt_u64(_fd: RawFd, _level: i32, _name: i32) -> io::Result<u64> {
    Err(unsupported())
}

/// Not available here.
pub fn setsockopt_bytes(_fd: RawFd, _level: i32, _name: i32, _value: &[u8]) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub fn set_txtime(_fd: RawFd, _clockid: i32, _flags: u32) -> io::Result<()> {
    Err(unsupported())
}

/// Readiness is not polled here: blocking calls wait by themselves.
pub fn poll(_fd: RawFd, _events: i16, timeout: Duration) -> io::Result<bool> {
    std::thread::sleep(timeout.min(Duration::from_millis(1)));
    Ok(true)
}

/// `SIOCOUTQ` is Linux's: unsupported here.
pub fn unsent_bytes(_fd: std::os::fd::BorrowedFd<'_>) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "SIOCOUTQ is Linux-only",
    ))
}

/// Readiness is not polled here: sleeps up to a millisecond and says
/// readable.
pub fn wait_readable(_fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    std::thread::sleep(timeout.min(Duration::from_millis(1)));
    Ok(true)
}

/// `SO_RCVBUFFORCE`: `SO_RCVBUF` past `rmem_max` (CAP_NET_ADMIN).
pub const SO_RCVBUFFORCE: i32 = -1;
/// `SO_SNDBUFFORCE`: `SO_SNDBUF` past `wmem_max` (CAP_NET_ADMIN).
pub const SO_SNDBUFFORCE: i32 = -1;

/// `POLLOUT`.
pub const POLLOUT: i16 = 4;

/// Network namespaces exist only on Linux.
#[cfg(feature = "tools")]
pub fn setns_net(_fd: BorrowedFd<'_>) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
pub fn set_timer_slack(_ns: u64) -> io::Result<()> {
    Err(unsupported())
}

/// Not available here.
#[cfg(feature = "tools")]
pub fn pin_to_cpu(_cpu: usize) -> io::Result<()> {
    Err(unsupported())
}
