//! Linux syscalls.

use super::{InControl, InMeta, OutMsg, SendMsg, MAX_BATCH, SEND_CONTROL_LEN};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr;
use std::time::Duration;

/// `MSG_TRUNC`.
pub const MSG_TRUNC: i32 = libc::MSG_TRUNC;
/// `MSG_CTRUNC`.
pub const MSG_CTRUNC: i32 = libc::MSG_CTRUNC;

fn cvt(r: libc::c_int) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn cvt_ssize(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Retries a syscall while it fails with `EINTR`.
fn retry<T: PartialOrd + Default>(mut f: impl FnMut() -> T) -> T {
    loop {
        let r = f();
        if r < T::default() && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return r;
    }
}

fn fill_msghdr(hdr: &mut libc::msghdr, m: &OutMsg<'_>) {
    if let Some(a) = m.addr {
        hdr.msg_name = a.as_ptr() as *mut libc::c_void;
        hdr.msg_namelen = a.len();
    }
    // IoSlice is ABI-compatible with struct iovec on Unix (std guarantees it).
    hdr.msg_iov = m.iov.as_ptr() as *mut libc::iovec;
    hdr.msg_iovlen = m.iov.len() as _;
    if !m.control.is_empty() {
        hdr.msg_control = m.control.as_ptr() as *mut libc::c_void;
        hdr.msg_controllen = m.control.len() as _;
    }
}

/// An all-zero `msghdr`: null pointers and zero lengths.
pub(super) fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct for which all-zero bytes is a valid
    // value (null pointers, zero lengths), whatever private padding fields
    // the C library gives it.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// `sendmmsg(2)` of gathered messages: sends up to [`MAX_BATCH`] in one
/// call and returns how many were sent. Only the headers used are built.
#[cfg(feature = "tools")]
pub fn sendmmsg(fd: BorrowedFd<'_>, msgs: &[OutMsg<'_>], flags: i32) -> io::Result<usize> {
    let n = msgs.len().min(MAX_BATCH);
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    for (h, m) in hdrs.iter_mut().zip(&msgs[..n]) {
        let mut msg_hdr = empty_msghdr();
        fill_msghdr(&mut msg_hdr, m);
        h.write(libc::mmsghdr {
            msg_hdr,
            msg_len: 0,
        });
    }
    // SAFETY: `hdrs[..n]` were written just above, and point at addresses,
    // iovecs and control buffers borrowed from `msgs`, which outlive the
    // call; the kernel reads `n` headers and writes only their `msg_len`.
    let r = retry(|| unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr() as *mut libc::mmsghdr,
            n as _,
            flags as _,
        )
    });
    cvt(r)
}

/// `sendmsg(2)` of one gathered message; returns the bytes sent.
pub fn sendmsg(fd: BorrowedFd<'_>, m: &OutMsg<'_>, flags: i32) -> io::Result<usize> {
    let mut hdr = empty_msghdr();
    fill_msghdr(&mut hdr, m);
    // SAFETY: `hdr` points into `m`'s borrowed buffers, alive for the call.
    let r = retry(|| unsafe { libc::sendmsg(fd.as_raw_fd(), &hdr, flags) });
    cvt_ssize(r)
}

/// Room for an IPv4 or IPv6 socket address.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

// Used by the io_uring backend only.
#[cfg(feature = "uring")]
impl RawAddr {
    /// An all-zero address (family `AF_UNSPEC`).
    pub(super) fn zeroed() -> Self {
        // SAFETY: both members are plain C structs for which all-zero bytes
        // are valid.
        unsafe { MaybeUninit::zeroed().assume_init() }
    }
}

/// The socket address in `b`, as the kernel wrote it (`b.len()` bytes of a
/// `struct sockaddr`). Used by the io_uring backend only.
#[cfg(feature = "uring")]
pub(super) fn addr_from_bytes(b: &[u8]) -> Option<SocketAddr> {
    let mut a = AddrBuf::default();
    let n = b.len().min(size_of::<libc::sockaddr_storage>());
    // SAFETY: `n` bytes fit in the sockaddr_storage, and `b` holds them;
    // the two do not overlap.
    unsafe { ptr::copy_nonoverlapping(b.as_ptr(), &mut a.0 as *mut _ as *mut u8, n) };
    a.socket_addr(n as _)
}

/// Writes `a` as a C socket address; returns its length.
pub(super) fn raw_addr(a: &SocketAddr) -> (RawAddr, libc::socklen_t) {
    match a {
        SocketAddr::V4(v4) => (
            RawAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*v4.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                },
            },
            size_of::<libc::sockaddr_in>() as _,
        ),
        SocketAddr::V6(v6) => (
            RawAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                },
            },
            size_of::<libc::sockaddr_in6>() as _,
        ),
    }
}

/// Sends `n` messages (at most [`MAX_BATCH`]) built one by one by `fill`,
/// with one `sendmmsg(2)`, or with `sendmsg(2)` when `mmsg` is false (then
/// only the first message) or there is only one. `fill(i, control)` encodes message `i`'s control
/// data into `control` (zeroed, [`SEND_CONTROL_LEN`] bytes) and returns the
/// message. Everything lives on the stack, and only the `n` entries used
/// are written: no heap allocation, no work for unused entries.
///
/// Returns `Err` from `fill` as the outer error, or the syscall's outcome:
/// the number of messages sent.
pub fn send_batch<'a, E>(
    fd: BorrowedFd<'_>,
    n: usize,
    flags: i32,
    mmsg: bool,
    mut fill: impl FnMut(usize, &mut [u8]) -> Result<SendMsg<'a>, E>,
) -> Result<io::Result<usize>, E> {
    #[repr(C, align(8))]
    struct Control([u8; SEND_CONTROL_LEN]);
    let n = if mmsg { n.min(MAX_BATCH) } else { n.min(1) };
    if n == 0 {
        return Ok(Ok(0));
    }
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let mut names = [const { MaybeUninit::<RawAddr>::uninit() }; MAX_BATCH];
    let mut ctls = [const { MaybeUninit::<Control>::uninit() }; MAX_BATCH];
    for i in 0..n {
        let ctl = ctls[i].write(Control([0; SEND_CONTROL_LEN]));
        let m = fill(i, &mut ctl.0)?;
        let clen = m.control_len.min(SEND_CONTROL_LEN);
        let mut h = empty_msghdr();
        if let Some(dest) = &m.dest {
            let (raw, len) = raw_addr(dest);
            h.msg_name = names[i].write(raw) as *mut RawAddr as *mut libc::c_void;
            h.msg_namelen = len;
        }
        let iov = iovs[i].write(libc::iovec {
            iov_base: m.payload.as_ptr() as *mut libc::c_void,
            iov_len: m.payload.len(),
        });
        h.msg_iov = iov;
        h.msg_iovlen = 1;
        if clen > 0 {
            h.msg_control = ctl.0.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = clen as _;
        }
        hdrs[i].write(libc::mmsghdr {
            msg_hdr: h,
            msg_len: 0,
        });
    }
    // One message goes with `sendmsg`: `sendmmsg` would only add the copy
    // of its header array and the loop around it.
    let r = if n > 1 {
        // SAFETY: `hdrs[..n]` were written above; each points at its own
        // name, iovec and control entry on this stack frame, and at a
        // payload borrowed for 'a, all alive for the call. The kernel reads
        // them and writes only `msg_len`.
        let r = retry(|| unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr() as *mut libc::mmsghdr,
                n as _,
                flags as _,
            )
        });
        cvt(r)
    } else {
        // SAFETY: as above, for the one header written (n == 1).
        let r =
            retry(|| unsafe { libc::sendmsg(fd.as_raw_fd(), &(*hdrs[0].as_ptr()).msg_hdr, flags) });
        cvt_ssize(r).map(|_| 1)
    };
    Ok(r)
}

/// A `struct sockaddr_storage` for the kernel to fill in.
#[derive(Clone, Copy)]
pub struct AddrBuf(libc::sockaddr_storage);

impl Default for AddrBuf {
    fn default() -> Self {
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        AddrBuf(unsafe { MaybeUninit::zeroed().assume_init() })
    }
}

impl std::fmt::Debug for AddrBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddrBuf(..)")
    }
}

impl AddrBuf {
    fn socket_addr(&self, len: libc::socklen_t) -> Option<SocketAddr> {
        addr_from_raw(&self.0, len)
    }
}

/// The socket address the kernel wrote at `p` (`len` bytes of it). Only
/// the bytes written are read, through the raw pointer: `p` may point at
/// storage that was uninitialised before the call.
fn addr_from_raw(p: *const libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    if len < size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: `p` is valid for reads of a sockaddr_storage, and the kernel
    // wrote at least the family.
    let family = unsafe { ptr::addr_of!((*p).ss_family).read() } as i32;
    match family {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, all
            // of whose bytes were written; sockaddr_storage is large and
            // aligned enough for it.
            let a = unsafe { p.cast::<libc::sockaddr_in>().read() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { p.cast::<libc::sockaddr_in6>().read() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The receive call both receive forms share: `recvmsg(2)` when `n` is 1,
/// else `recvmmsg(2)` with `MSG_WAITFORONE`, on the first `n` headers
/// (which the caller wrote). Returns how many messages arrived; each
/// header's `msg_len` is set.
fn recv_headers(
    fd: BorrowedFd<'_>,
    hdrs: &mut [MaybeUninit<libc::mmsghdr>; MAX_BATCH],
    n: usize,
    flags: i32,
) -> io::Result<usize> {
    if n == 1 {
        // SAFETY: header 0 was written by the caller and points at live,
        // writable buffers of the lengths given.
        let r = retry(|| unsafe {
            libc::recvmsg(fd.as_raw_fd(), &mut (*hdrs[0].as_mut_ptr()).msg_hdr, flags)
        });
        let len = cvt_ssize(r)?;
        // SAFETY: as above; recvmsg does not write msg_len, so set it.
        unsafe { (*hdrs[0].as_mut_ptr()).msg_len = len as _ };
        Ok(1)
    } else {
        // SAFETY: `hdrs[..n]` were written by the caller; every header
        // points at distinct, live, writable buffers of the lengths given.
        let r = retry(|| unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr() as *mut libc::mmsghdr,
                n as _,
                (flags | libc::MSG_WAITFORONE) as _,
                ptr::null_mut(),
            )
        });
        cvt(r)
    }
}

/// A receive header for one message into `iov`, with its name and control
/// buffers.
fn recv_header(
    iov: *mut libc::iovec,
    name: *mut libc::sockaddr_storage,
    control: *mut CmsgBufRaw,
) -> libc::mmsghdr {
    let mut h = empty_msghdr();
    h.msg_name = name as *mut libc::c_void;
    h.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
    h.msg_iov = iov;
    h.msg_iovlen = 1;
    h.msg_control = control as *mut libc::c_void;
    h.msg_controllen = size_of::<CmsgBufRaw>() as _;
    libc::mmsghdr {
        msg_hdr: h,
        msg_len: 0,
    }
}

/// The raw bytes of an [`InControl`].
type CmsgBufRaw = InControl;

/// What a received header says, with its source read from `name`.
fn in_meta(h: &libc::mmsghdr, name: *const libc::sockaddr_storage) -> InMeta {
    InMeta {
        len: h.msg_len as usize,
        flags: h.msg_hdr.msg_flags,
        source: addr_from_raw(name, h.msg_hdr.msg_namelen),
        // usize on glibc, u32 on musl.
        #[allow(clippy::unnecessary_cast)]
        control_len: h.msg_hdr.msg_controllen as usize,
    }
}

/// `recvmmsg(2)` of up to `n` messages (with `recvmsg(2)` when `n` is 1):
/// message `i` into `buf[i * stride..(i + 1) * stride]`, its source into
/// `names[i]` and its control data into `controls[i]`. Only the `n`
/// headers used are built, on the stack.
#[allow(clippy::too_many_arguments)]
pub fn recvmmsg(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    stride: usize,
    controls: &mut [InControl],
    names: &mut [AddrBuf],
    metas: &mut [InMeta],
    n: usize,
    flags: i32,
) -> io::Result<usize> {
    let n = n
        .min(metas.len())
        .min(controls.len())
        .min(names.len())
        .min(buf.len() / stride.max(1))
        .min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
    let base = buf.as_mut_ptr();
    for i in 0..n {
        let iov = iovs[i].write(libc::iovec {
            // SAFETY: i * stride + stride <= buf.len() by the choice of n.
            iov_base: unsafe { base.add(i * stride) } as *mut libc::c_void,
            iov_len: stride,
        });
        hdrs[i].write(recv_header(iov, &mut names[i].0, &mut controls[i]));
    }
    let got = recv_headers(fd, &mut hdrs, n, flags)?;
    for i in 0..got {
        // SAFETY: the first `got` <= n headers were written above.
        let h = unsafe { hdrs[i].assume_init_ref() };
        metas[i] = in_meta(h, &names[i].0);
    }
    Ok(got)
}

/// `recvmmsg(2)` (or `recvmsg(2)` for one) into caller-provided buffers:
/// message `i` into `bufs[i]`. Names and control buffers live on the
/// stack, uninitialised until the kernel writes them; `each(i, meta,
/// control)` is called for every message received, with its control data.
pub fn recvmmsg_slices(
    fd: BorrowedFd<'_>,
    bufs: &mut [io::IoSliceMut<'_>],
    flags: i32,
    mut each: impl FnMut(usize, InMeta, &[u8]),
) -> io::Result<usize> {
    let n = bufs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
    let mut names = [const { MaybeUninit::<AddrBuf>::uninit() }; MAX_BATCH];
    let mut ctls = [const { MaybeUninit::<InControl>::uninit() }; MAX_BATCH];
    for i in 0..n {
        // IoSliceMut is ABI-compatible with struct iovec on Unix (std
        // guarantees it), and `bufs[i]` stays borrowed for the call.
        let iov = &mut bufs[i] as *mut io::IoSliceMut<'_> as *mut libc::iovec;
        hdrs[i].write(recv_header(
            iov,
            names[i].as_mut_ptr() as *mut libc::sockaddr_storage,
            ctls[i].as_mut_ptr(),
        ));
    }
    let got = recv_headers(fd, &mut hdrs, n, flags)?;
    for i in 0..got {
        // SAFETY: the first `got` <= n headers were written above, and the
        // kernel wrote `msg_controllen` bytes of control data (no more than
        // the buffer holds) at the start of `ctls[i]`.
        let (h, control) = unsafe {
            let h = hdrs[i].assume_init_ref();
            // usize on glibc, u32 on musl.
            #[allow(clippy::unnecessary_cast)]
            let clen = (h.msg_hdr.msg_controllen as usize).min(size_of::<InControl>());
            let control = std::slice::from_raw_parts(ctls[i].as_ptr() as *const u8, clen);
            (h, control)
        };
        // The name is read through its pointer, only the bytes written.
        let meta = in_meta(h, names[i].as_ptr() as *const libc::sockaddr_storage);
        each(i, meta, control);
    }
    Ok(got)
}

/// `recvmsg(2)` with `MSG_ERRQUEUE | MSG_DONTWAIT` and no payload: reads
/// one error-queue message's control data into `control`, and the address
/// its error is about into `name`. Returns the control length and that
/// address, or `None` when the queue is empty.
pub fn recv_errqueue(
    fd: BorrowedFd<'_>,
    control: &mut InControl,
    name: &mut AddrBuf,
) -> io::Result<Option<(usize, Option<SocketAddr>)>> {
    let mut h = empty_msghdr();
    h.msg_name = &mut name.0 as *mut _ as *mut libc::c_void;
    h.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
    h.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
    h.msg_controllen = control.0.len() as _;
    // SAFETY: `h` points at live, writable buffers of the stated lengths.
    let r = retry(|| unsafe {
        libc::recvmsg(
            fd.as_raw_fd(),
            &mut h,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
        )
    });
    match cvt_ssize(r) {
        // usize on glibc, u32 on musl.
        #[allow(clippy::unnecessary_cast)]
        Ok(_) => Ok(Some((
            h.msg_controllen as usize,
            name.socket_addr(h.msg_namelen),
        ))),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// True when the descriptor is in non-blocking mode (`O_NONBLOCK`).
pub fn is_nonblocking(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: F_GETFL reads the file status flags of a borrowed, open
    // descriptor and touches no memory of ours.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    cvt(r).map(|f| f as i32 & libc::O_NONBLOCK != 0)
}

/// `MSG_ZEROCOPY`.
pub const MSG_ZEROCOPY: i32 = libc::MSG_ZEROCOPY;
/// `POLLERR`: the error queue has something.
pub const POLLERR: i16 = libc::POLLERR;

/// `setsockopt(2)` with an `int` value.
pub fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    setsockopt_bytes(fd, level, name, &value.to_ne_bytes())
}

/// `setsockopt(2)` with raw option bytes.
pub fn setsockopt_bytes(fd: RawFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is a live buffer of the length passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr() as *const libc::c_void,
            value.len() as _,
        )
    };
    cvt(r).map(drop)
}

/// `getsockopt(2)` of an `int` option.
#[cfg(feature = "tools")]
pub fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized for an int option.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    cvt(r).map(|_| v)
}

/// `getsockopt(SO_MEMINFO)`: the socket's `sk_drops` counter now.
pub fn socket_drops(fd: RawFd) -> io::Result<u32> {
    let mut v = [0u32; 16];
    let mut len = std::mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: `v` and `len` are live; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            v.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    cvt(r)?;
    let i = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (i + 1) * 4 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO without a drop counter",
        ));
    }
    Ok(v[i])
}

#[cfg(feature = "tools")]
/// `ioctl(SIOCETHTOOL)` on device `ifname` with the request in `data`,
/// which the kernel reads and overwrites with its reply.
///
/// Only for requests whose reply is never longer than the request (every
/// layout in the [`crate::ethtool`] module is sized so, the string reply from
/// the count the kernel gave just before).
pub fn ethtool_ioctl(ifname: &str, data: &mut [u8]) -> io::Result<()> {
    #[repr(C)]
    struct Ifreq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut libc::c_void,
        _pad: [u8; 16],
    }
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    // The kernel writes as much as the command's reply needs: refuse any
    // request whose buffer is shorter than that, and any other command.
    use crate::ethtool as et;
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let need = match u32_at(0) {
        Some(et::GSSET_INFO) => Some(16 + 4),
        Some(et::GSTRINGS) => u32_at(8)
            .filter(|&n| n > 0)
            .map(|n| 12 + n as usize * et::GSTRING_LEN),
        Some(et::GFEATURES) => u32_at(4).map(|n| 8 + n as usize * 16),
        Some(et::SFEATURES) => u32_at(4).map(|n| 8 + n as usize * 8),
        Some(et::GCHANNELS) | Some(et::SCHANNELS) => Some(et::CHANNELS_LEN),
        Some(et::GDRVINFO) => Some(et::DRVINFO_LEN),
        _ => None,
    };
    if need.is_none_or(|n| data.len() < n) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unsupported or short ethtool request",
        ));
    }
    let mut req = Ifreq {
        name: [0; libc::IFNAMSIZ],
        data: data.as_mut_ptr() as *mut libc::c_void,
        _pad: [0; 16],
    };
    req.name[..name.len()].copy_from_slice(name);
    let sock =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"))?;
    // SAFETY: `req` is a valid ifreq whose data pointer points at `data`,
    // live and writable for the call. The kernel writes at most the reply
    // of the command, checked above to fit `data`; for GSTRINGS, kernels
    // since 6.19 write nothing unless the count matches, and older ones
    // write the string set's size, which the caller read just before.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), crate::ethtool::SIOCETHTOOL as _, &mut req) };
    cvt(r).map(drop)
}

/// `setsockopt(SO_ATTACH_REUSEPORT_CBPF)`: steers the socket's reuseport
/// group with a classic BPF program.
pub fn attach_reuseport_cbpf(fd: RawFd, prog: &[crate::wire::bpf::Insn]) -> io::Result<()> {
    let mut filters: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let fprog = libc::sock_fprog {
        len: filters.len() as u16,
        filter: filters.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `filters`, alive for the call; the kernel
    // copies the program and keeps no pointer to it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            size_of::<libc::sock_fprog>() as _,
        )
    };
    cvt(r).map(drop)
}

/// `SO_MAX_PACING_RATE`.
pub const SO_MAX_PACING_RATE: i32 = libc::SO_MAX_PACING_RATE;

/// `getsockopt(2)` of an option the kernel reports as a `u32` or a `u64`.
#[cfg(feature = "tools")]
pub fn getsockopt_u64(fd: RawFd, level: i32, name: i32) -> io::Result<u64> {
    let mut v = [0u8; 8];
    let mut len = 8 as libc::socklen_t;
    // SAFETY: `v` and `len` are live; the kernel writes at most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            v.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    cvt(r)?;
    Ok(match len {
        4 => u32::from_ne_bytes(v[..4].try_into().expect("4 bytes")) as u64,
        _ => u64::from_ne_bytes(v),
    })
}

/// `SO_TXTIME` with `struct sock_txtime { clockid_t clockid; u32 flags; }`.
pub fn set_txtime(fd: RawFd, clockid: i32, flags: u32) -> io::Result<()> {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&clockid.to_ne_bytes());
    b[4..].copy_from_slice(&flags.to_ne_bytes());
    setsockopt_bytes(fd, libc::SOL_SOCKET, libc::SO_TXTIME, &b)
}

/// `poll(2)` on one descriptor; true when an event in `events` is ready.
pub fn poll(fd: RawFd, events: i16, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    cvt(r).map(|n| n > 0)
}

/// `ioctl(SIOCOUTQ)`: the bytes of the socket's send buffer in use, that
/// is datagrams handed to the kernel and not yet sent (for UDP, those
/// still waiting in a qdisc count too).
pub fn unsent_bytes(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which points at
    // a live, writable c_int; the descriptor is borrowed for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ as _, &mut n) };
    cvt(r)?;
    Ok(n.max(0) as usize)
}

/// Waits until `fd` has data to read or `timeout` passes, to the
/// nanosecond (`ppoll(2)`, where `poll` counts milliseconds); true when it
/// is readable. A signal ends the wait early with `false`.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one live pollfd and a live timespec; no signal mask.
    let r = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    match cvt(r) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// `SO_RCVBUFFORCE`: `SO_RCVBUF` past `rmem_max` (CAP_NET_ADMIN).
pub const SO_RCVBUFFORCE: i32 = libc::SO_RCVBUFFORCE;
/// `SO_SNDBUFFORCE`: `SO_SNDBUF` past `wmem_max` (CAP_NET_ADMIN).
pub const SO_SNDBUFFORCE: i32 = libc::SO_SNDBUFFORCE;

/// `POLLOUT`.
pub const POLLOUT: i16 = libc::POLLOUT;

/// `setns(fd, CLONE_NEWNET)`: moves the calling thread into a network
/// namespace.
#[cfg(feature = "tools")]
pub fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a plain syscall on a borrowed, open descriptor.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    cvt(r).map(drop)
}

/// Sets this thread's timer slack (PR_SET_TIMERSLACK), in ns: how late
/// the kernel may end a sleep to batch wake-ups. The default is 50 us; a
/// user-space pacer wants it near 0. 0 restores the thread's default.
pub fn set_timer_slack(ns: u64) -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no
    // memory of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    cvt(r).map(drop)
}

/// `sched_setaffinity(0, {cpu})`: pins the calling thread to one CPU.
#[cfg(feature = "tools")]
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond CPU_SETSIZE"),
        ));
    }
    // SAFETY: all-zero is an empty cpu_set_t; CPU_SET writes within it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = MaybeUninit::zeroed().assume_init();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    cvt(r).map(drop)
}

/// A path as a C string for a `*at` syscall; a NUL byte in it is an error.
#[cfg(feature = "tools")]
fn c_path(p: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// `openat2(dir, path, {flags | O_CLOEXEC, mode, resolve})` (Linux 5.6+):
/// opens `path` relative to the directory `dir`, with the kernel enforcing
/// `resolve` (`RESOLVE_NO_SYMLINKS`, `RESOLVE_BENEATH`, ...) on every
/// component.
#[cfg(feature = "tools")]
pub fn openat2(
    dir: BorrowedFd<'_>,
    path: &std::path::Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let p = c_path(path)?;
    // SAFETY: open_how is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = resolve;
    // SAFETY: p is a NUL-terminated string and how a valid open_how that
    // outlive the call; the size passed is how's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            p.as_ptr(),
            &how as *const libc::open_how,
            size_of::<libc::open_how>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r as RawFd) })
}

/// `mkdirat(dir, name, mode)`.
#[cfg(feature = "tools")]
pub fn mkdirat(dir: BorrowedFd<'_>, name: &std::path::Path, mode: u32) -> io::Result<()> {
    let p = c_path(name)?;
    // SAFETY: p is a NUL-terminated string that outlives the call.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), p.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// `renameat(dir, from, dir, to)`: a rename within one directory (it
/// replaces `to` and never follows a symbolic link there).
#[cfg(feature = "tools")]
pub fn renameat(
    dir: BorrowedFd<'_>,
    from: &std::path::Path,
    to: &std::path::Path,
) -> io::Result<()> {
    let (f, t) = (c_path(from)?, c_path(to)?);
    // SAFETY: both are NUL-terminated strings that outlive the call.
    cvt(unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) })
        .map(drop)
}

/// `unlinkat(dir, name, 0)`: removes a file (not a directory).
#[cfg(feature = "tools")]
pub fn unlinkat(dir: BorrowedFd<'_>, name: &std::path::Path) -> io::Result<()> {
    let p = c_path(name)?;
    // SAFETY: p is a NUL-terminated string that outlives the call.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), p.as_ptr(), 0) }).map(drop)
}
