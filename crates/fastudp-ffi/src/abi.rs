//! The exported C functions: the only module of this crate allowed
//! `unsafe` code. Each function
//! - runs its body inside [`call`], which turns a panic into
//!   `FASTUDP_ERR_PANIC` and any failure into its code and the thread's
//!   last error;
//! - checks every pointer for NULL and every length before use;
//! - reads its inputs during the call only, and writes its outputs with
//!   `ptr::write`, so that they may point to uninitialized memory.
//!
//! Ownership: objects created by a `*_new`, `*_bind` or `*_from_fd`
//! function belong to the caller, who frees each with its `*_free`
//! function, once, when no other call is using it. Pointers into a receive
//! batch stay valid until the next receive into that batch or its
//! `fastudp_recv_batch_free`.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]

use crate::result::*;
use crate::types::*;
use fastudp_io::{Coalescer, RecvBatch, Transmit, UdpIo, UdpState};
use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void};
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Once;

// ------------------------------------------------------------- the guard

/// Runs one exported function's body: a panic becomes `FASTUDP_ERR_PANIC`,
/// a failure its code; either is recorded as the thread's last error.
/// Nothing is printed: the panic's message and place go to the last error.
fn call(function: &'static str, body: impl FnOnce() -> Res<()>) -> fastudp_result {
    let r = quietly(AssertUnwindSafe(|| {
        #[cfg(feature = "test-hooks")]
        hooks::panic_if_asked(function);
        body()
    }));
    match r {
        Ok(Ok(())) => FASTUDP_OK,
        Ok(Err(f)) => record(function, f),
        Err(f) => record(function, f),
    }
}

thread_local! {
    /// Calls into the library running on this thread: while one is, a
    /// panic prints nothing.
    static IN_CALL: Cell<u32> = const { Cell::new(0) };
    /// Where the last panic inside a call happened (`file:line`).
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, stopping a panic at this frame: `Err` with the panic's
/// message and place. While `f` runs, the panic hook prints nothing (a
/// library does not write to its host's stderr); panics elsewhere in the
/// process go to the hook that was there before.
fn quietly<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> Result<R, Failure> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_CALL.try_with(Cell::get).unwrap_or(0) > 0 {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                let _ = PANIC_AT.try_with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
    let _ = IN_CALL.try_with(|d| d.set(d.get() + 1));
    let r = catch_unwind(f);
    let _ = IN_CALL.try_with(|d| d.set(d.get().saturating_sub(1)));
    r.map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(a panic without a message)".to_string());
        // The payload's destructor could itself panic: keep it from
        // unwinding out of this frame.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        Failure::Panic(
            match PANIC_AT.try_with(|p| p.borrow_mut().take()).ok().flatten() {
                Some(at) => format!("{msg} (at {at})"),
                None => msg,
            },
        )
    })
}

#[cfg(feature = "test-hooks")]
mod hooks {
    use std::cell::Cell;

    thread_local! {
        static PANIC_NEXT: Cell<bool> = const { Cell::new(false) };
    }

    /// Asks for a panic in the next call on this thread.
    pub fn arm() {
        PANIC_NEXT.with(|p| p.set(true));
    }

    /// Panics, once, if [`arm`] asked for it.
    pub fn panic_if_asked(function: &str) {
        if PANIC_NEXT.with(|p| p.replace(false)) {
            panic!("{function}: panic requested by fastudp_test_panic_next");
        }
    }
}

// ------------------------------------------------------- pointer helpers

/// Writes `v` to the caller's `p`, which may be uninitialized.
///
/// # Safety
/// A non-NULL `p` must be valid for a write of `T` and aligned.
unsafe fn put<T>(p: *mut T, name: &'static str, v: T) -> Res<()> {
    if p.is_null() {
        return Err(Failure::Null(name));
    }
    // SAFETY: non-NULL, and the caller vouches for validity and alignment.
    unsafe { p.write(v) };
    Ok(())
}

/// Writes `v` to `p` unless `p` is NULL (an optional output).
///
/// # Safety
/// As [`put`].
unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-NULL, and the caller vouches for validity and alignment.
        unsafe { p.write(v) };
    }
}

/// The caller's object behind `p`.
///
/// # Safety
/// A non-NULL `p` must point to a live `T` for `'a`.
unsafe fn get<'a, T>(p: *const T, name: &'static str) -> Res<&'a T> {
    // SAFETY: the caller vouches for the pointee; NULL is an error.
    unsafe { p.as_ref() }.ok_or(Failure::Null(name))
}

/// The caller's object behind `p`, to change.
///
/// # Safety
/// A non-NULL `p` must point to a live `T` for `'a`, used by no one else.
unsafe fn get_mut<'a, T>(p: *mut T, name: &'static str) -> Res<&'a mut T> {
    // SAFETY: the caller vouches for the pointee and exclusive use.
    unsafe { p.as_mut() }.ok_or(Failure::Null(name))
}

/// `len` bytes at `p`: NULL is allowed only for an empty slice.
///
/// # Safety
/// A non-NULL `p` must be valid for reads of `len` bytes for `'a`.
unsafe fn bytes<'a>(p: *const u8, len: usize, name: &'static str) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::Null(name));
    }
    if len > isize::MAX as usize {
        return Err(Failure::Invalid(format!(
            "{name}: length {len} is too large"
        )));
    }
    // SAFETY: non-NULL, the length fits an allocation, and the caller
    // vouches for `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

// ------------------------------------------------------ socket addresses

/// An all-zero `sockaddr_storage` (family `AF_UNSPEC`).
pub(crate) fn empty_storage() -> sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all zeros is a valid
    // value (AF_UNSPEC).
    unsafe { std::mem::zeroed() }
}

/// Reads the caller's IPv4 or IPv6 socket address.
///
/// # Safety
/// A non-NULL `p` must be valid for reads of `len` bytes.
unsafe fn read_addr(p: *const sockaddr, len: socklen_t, name: &'static str) -> Res<SocketAddr> {
    if p.is_null() {
        return Err(Failure::Null(name));
    }
    let len = len as usize;
    let short = |want: usize| {
        Failure::Invalid(format!(
            "{name}: length {len} is too short for its address family ({want} bytes)"
        ))
    };
    if len < size_of::<libc::sa_family_t>() {
        return Err(short(size_of::<libc::sa_family_t>()));
    }
    // SAFETY: at least the family's bytes are readable (checked above);
    // read_unaligned makes no alignment demand.
    let family = unsafe { ptr::read_unaligned(p.cast::<libc::sa_family_t>()) };
    match family as c_int {
        libc::AF_INET => {
            if len < size_of::<sockaddr_in>() {
                return Err(short(size_of::<sockaddr_in>()));
            }
            // SAFETY: a whole sockaddr_in is readable (checked above).
            let a = unsafe { ptr::read_unaligned(p.cast::<sockaddr_in>()) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            if len < size_of::<sockaddr_in6>() {
                return Err(short(size_of::<sockaddr_in6>()));
            }
            // SAFETY: a whole sockaddr_in6 is readable (checked above).
            let a = unsafe { ptr::read_unaligned(p.cast::<sockaddr_in6>()) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        f => Err(Failure::Invalid(format!(
            "{name}: address family {f} is neither AF_INET ({}) nor AF_INET6 ({})",
            libc::AF_INET,
            libc::AF_INET6
        ))),
    }
}

/// The `sockaddr_storage` of an address, and its length.
fn storage_of(a: SocketAddr) -> (sockaddr_storage, socklen_t) {
    let mut ss = empty_storage();
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and
            // aligned for any socket address.
            unsafe {
                ptr::write(
                    (&mut ss as *mut sockaddr_storage).cast::<sockaddr_in>(),
                    sin,
                )
            };
            size_of::<sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and
            // aligned for any socket address.
            unsafe {
                ptr::write(
                    (&mut ss as *mut sockaddr_storage).cast::<sockaddr_in6>(),
                    sin6,
                )
            };
            size_of::<sockaddr_in6>()
        }
    };
    (ss, len as socklen_t)
}

/// The storage of an optional IP address (port 0); length 0 for none.
fn ip_storage(ip: Option<IpAddr>) -> (sockaddr_storage, socklen_t) {
    match ip {
        Some(ip) => storage_of(SocketAddr::new(ip, 0)),
        None => (empty_storage(), 0),
    }
}

// ------------------------------------------------------------ meta calls

/// The name of an error code, as a static NUL-terminated string; any
/// value is accepted ("unknown error code"). Never fails; the string is
/// never freed.
#[no_mangle]
pub extern "C" fn fastudp_strerror(code: fastudp_result) -> *const c_char {
    describe(code).as_ptr()
}

/// The library's version, `"MAJOR.MINOR.PATCH"`, as a static
/// NUL-terminated string: compare it with `FASTUDP_VERSION_STRING` to find
/// a header that does not match the library. Never fails.
#[no_mangle]
pub extern "C" fn fastudp_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Writes the last error of the calling thread to `*out` (code
/// `FASTUDP_OK` when no call on this thread has failed). It describes the
/// last call that failed, until another fails; this call changes nothing.
///
/// # Safety
/// `out` must be NULL or point to writable memory for one
/// `fastudp_error_info`.
#[no_mangle]
pub unsafe extern "C" fn fastudp_last_error(out: *mut fastudp_error_info) -> fastudp_result {
    if out.is_null() {
        // Reported without overwriting the error the caller asks about.
        return FASTUDP_ERR_NULL;
    }
    let info = match quietly(last) {
        Ok(Some((code, error_number, index))) => fastudp_error_info {
            code,
            error_number,
            has_index: index.is_some(),
            index: index.unwrap_or(0),
        },
        Ok(None) => fastudp_error_info::default(),
        Err(_) => return FASTUDP_ERR_PANIC,
    };
    // SAFETY: non-NULL; the caller vouches for a writable fastudp_error_info.
    unsafe { out.write(info) };
    FASTUDP_OK
}

/// Writes the last error of the calling thread as a sentence that names
/// the function, as `snprintf` does: at most `cap - 1` bytes and a NUL to
/// `buf`, and the whole message's length (without the NUL) to `*len`
/// unless `len` is NULL. `buf` may be NULL when `cap` is 0 (to ask for the
/// length). With no error on this thread the message is empty. This call
/// changes nothing.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes (or NULL with `cap` 0);
/// `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_last_error_message(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> fastudp_result {
    if buf.is_null() && cap > 0 {
        return FASTUDP_ERR_NULL;
    }
    let msg = match quietly(last_message) {
        Ok(m) => m.unwrap_or_default(),
        Err(_) => return FASTUDP_ERR_PANIC,
    };
    if cap > 0 {
        let n = msg.len().min(cap - 1);
        // SAFETY: buf is non-NULL (cap > 0) and valid for cap bytes; n + 1
        // <= cap; the message is our own String, apart from buf.
        unsafe {
            ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    // SAFETY: NULL or writable, as the caller vouches.
    unsafe { put_opt(len, msg.len()) };
    FASTUDP_OK
}

/// Fills `*config` with the defaults: GRO on, nothing switched off, the
/// system's buffer sizes, split wait 5000 ms, GSO retry 1000 ms,
/// don't-fragment.
///
/// # Safety
/// `config` must point to writable memory for one `fastudp_config`.
#[no_mangle]
pub unsafe extern "C" fn fastudp_config_init(config: *mut fastudp_config) -> fastudp_result {
    // SAFETY: put checks NULL; the caller vouches for the rest.
    call("fastudp_config_init", || unsafe {
        put(config, "config", fastudp_config::default())
    })
}

// -------------------------------------------------------------- sockets

/// A UDP socket with its fastudp state (capabilities, fallbacks, counters,
/// error queue). Create it with `fastudp_socket_bind` or
/// `fastudp_socket_from_fd`; free it with `fastudp_socket_free`. Several
/// threads may use one socket at once (say, one sending and one
/// receiving); free it only when no call is using it.
pub struct fastudp_socket {
    fd: Fd,
    state: UdpState,
}

/// A socket's descriptor: its own, or the caller's.
enum Fd {
    Owned(OwnedFd),
    Borrowed(RawFd),
}

impl fastudp_socket {
    fn fd(&self) -> BorrowedFd<'_> {
        match &self.fd {
            Fd::Owned(o) => o.as_fd(),
            // SAFETY: the caller of fastudp_socket_from_fd keeps a borrowed
            // descriptor open until fastudp_socket_free ends this socket.
            Fd::Borrowed(r) => unsafe { BorrowedFd::borrow_raw(*r) },
        }
    }
}

/// The Rust configuration of an optional C one (NULL: defaults).
///
/// # Safety
/// A non-NULL `config` must point to a `fastudp_config`.
unsafe fn config_of(config: *const fastudp_config) -> Res<fastudp_io::Config> {
    if config.is_null() {
        return Ok(fastudp_io::Config::default());
    }
    // SAFETY: non-NULL; the caller vouches for a readable fastudp_config.
    let c = unsafe { ptr::read(config) };
    c.to_config()
}

/// Creates a UDP socket bound to `addr` (a `sockaddr_in` or `sockaddr_in6`
/// of `addr_len` bytes, read during the call), sets it up with `config`
/// (NULL: defaults) and writes it to `*out`. An IPv6 wildcard address
/// gives a dual-stack socket. The socket is blocking; make it non-blocking
/// with `fcntl` on `fastudp_socket_fd` if you want.
///
/// # Safety
/// `addr` must be valid for reads of `addr_len` bytes; `config` NULL or a
/// `fastudp_config`; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_bind(
    addr: *const sockaddr,
    addr_len: socklen_t,
    config: *const fastudp_config,
    out: *mut *mut fastudp_socket,
) -> fastudp_result {
    call("fastudp_socket_bind", || {
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        // SAFETY: the caller vouches for addr and config.
        let (a, c) = unsafe { (read_addr(addr, addr_len, "addr")?, config_of(config)?) };
        let s = fastudp_io::Socket::bind(a, c)?;
        let (std, state) = s.into_parts();
        let b = Box::new(fastudp_socket {
            fd: Fd::Owned(OwnedFd::from(std)),
            state,
        });
        // SAFETY: out is non-NULL (checked) and writable.
        unsafe { put(out, "out", Box::into_raw(b)) }
    })
}

/// Wraps the caller's bound UDP socket `fd`: sets it up with `config`
/// (NULL: defaults), probes what it supports and writes the new socket to
/// `*out`. Blocking or not, as the descriptor is: fastudp never changes
/// that.
///
/// With `FASTUDP_FD_OWNED` in `flags` the socket takes the descriptor and
/// closes it in `fastudp_socket_free`; without, the caller keeps it and
/// must keep it open until `fastudp_socket_free`. On failure the
/// descriptor is left open and remains the caller's.
///
/// # Safety
/// `fd` must be a descriptor the caller may use (and give away, with
/// `FASTUDP_FD_OWNED`); `config` NULL or a `fastudp_config`; `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_from_fd(
    fd: c_int,
    flags: u32,
    config: *const fastudp_config,
    out: *mut *mut fastudp_socket,
) -> fastudp_result {
    call("fastudp_socket_from_fd", || {
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        if flags & !FASTUDP_FD_OWNED != 0 {
            return Err(Failure::Invalid(format!(
                "flags {flags:#x}: unknown bits (known: FASTUDP_FD_OWNED)"
            )));
        }
        if fd < 0 {
            return Err(Failure::Invalid(format!("fd {fd} is not a descriptor")));
        }
        // SAFETY: fcntl(F_GETFD) on any integer only reads the descriptor
        // table; EBADF tells us the descriptor is not open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: the descriptor is open (checked) and the caller may use
        // it; the borrow ends with this call.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let ty = socket_type(borrowed)?;
        if ty != libc::SOCK_DGRAM {
            return Err(Failure::Invalid(format!(
                "fd {fd} is not a datagram socket (SO_TYPE {ty})"
            )));
        }
        // SAFETY: the caller vouches for config.
        let c = unsafe { config_of(config)? };
        let state = UdpState::new(borrowed, c)?;
        let fd = if flags & FASTUDP_FD_OWNED != 0 {
            // SAFETY: the caller gave the open descriptor away with
            // FASTUDP_FD_OWNED; from here only this OwnedFd closes it.
            Fd::Owned(unsafe { OwnedFd::from_raw_fd(fd) })
        } else {
            Fd::Borrowed(fd)
        };
        let b = Box::into_raw(Box::new(fastudp_socket { fd, state }));
        // SAFETY: out is non-NULL (checked) and writable.
        unsafe { put(out, "out", b) }
    })
}

/// `SO_TYPE` of a socket, or the error that says it is none.
fn socket_type(fd: BorrowedFd<'_>) -> Res<c_int> {
    use std::os::fd::AsRawFd;
    let mut ty: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: ty and len are live locals of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut c_int).cast::<c_void>(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(Failure::Setup {
            what: "SO_TYPE",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(ty)
}

/// Frees a socket (NULL is allowed, and does nothing). Closes its
/// descriptor if the socket owns it.
///
/// # Safety
/// `sock` must be NULL or a socket from this library not yet freed, used
/// by no other call.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_free(sock: *mut fastudp_socket) -> fastudp_result {
    call("fastudp_socket_free", || {
        if !sock.is_null() {
            // SAFETY: the pointer came from Box::into_raw in this module
            // and is freed once, as the caller vouches.
            drop(unsafe { Box::from_raw(sock) });
        }
        Ok(())
    })
}

/// Writes the socket's descriptor to `*fd` (still the socket's if it owns
/// it: do not close it).
///
/// # Safety
/// `sock` a live socket; `fd` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_fd(
    sock: *const fastudp_socket,
    fd: *mut c_int,
) -> fastudp_result {
    call("fastudp_socket_fd", || {
        use std::os::fd::AsRawFd;
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let s = get(sock, "sock")?;
            put(fd, "fd", s.fd().as_raw_fd())
        }
    })
}

/// Writes the socket's local address to `*addr` and its length to
/// `*addr_len`.
///
/// # Safety
/// `sock` a live socket; `addr` and `addr_len` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_local_addr(
    sock: *const fastudp_socket,
    addr: *mut sockaddr_storage,
    addr_len: *mut socklen_t,
) -> fastudp_result {
    call("fastudp_socket_local_addr", || {
        // SAFETY: the caller vouches for the pointers.
        let s = unsafe { get(sock, "sock")? };
        if addr.is_null() {
            return Err(Failure::Null("addr"));
        }
        if addr_len.is_null() {
            return Err(Failure::Null("addr_len"));
        }
        let local = socket2::SockRef::from(&s.fd()).local_addr()?;
        let a = local.as_socket().ok_or_else(|| {
            Failure::Invalid("the socket's local address is not an IP address".into())
        })?;
        let (ss, len) = storage_of(a);
        // SAFETY: both are non-NULL (checked) and writable.
        unsafe {
            put(addr, "addr", ss)?;
            put(addr_len, "addr_len", len)
        }
    })
}

/// Writes what the socket supports to `*out`.
///
/// # Safety
/// `sock` a live socket; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_capabilities(
    sock: *const fastudp_socket,
    out: *mut fastudp_capabilities,
) -> fastudp_result {
    call("fastudp_socket_capabilities", || {
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let s = get(sock, "sock")?;
            put(out, "out", s.state.capabilities().into())
        }
    })
}

/// Writes the GSO segments per send in force now to `*out`: 1 while GSO
/// is off after the path refused it, so build no longer trains.
///
/// # Safety
/// `sock` a live socket; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_max_gso_segments(
    sock: *const fastudp_socket,
    out: *mut usize,
) -> fastudp_result {
    call("fastudp_socket_max_gso_segments", || {
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let s = get(sock, "sock")?;
            put(out, "out", s.state.max_gso_segments())
        }
    })
}

/// Writes the most datagrams one received message may hold to `*out` (64
/// with GRO, else 1).
///
/// # Safety
/// `sock` a live socket; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_max_receive_segments(
    sock: *const fastudp_socket,
    out: *mut usize,
) -> fastudp_result {
    call("fastudp_socket_max_receive_segments", || {
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let s = get(sock, "sock")?;
            put(out, "out", s.state.max_receive_segments())
        }
    })
}

/// Turns `SO_TXTIME` on, so that transmits with `has_txtime` leave at
/// their departure time; `report_errors` asks for drops on the error queue
/// (`FASTUDP_SOCKET_ERROR_TXTIME`).
///
/// # Safety
/// `sock` a live socket.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_enable_txtime(
    sock: *const fastudp_socket,
    report_errors: bool,
) -> fastudp_result {
    call("fastudp_socket_enable_txtime", || {
        // SAFETY: the caller vouches for the socket.
        let s = unsafe { get(sock, "sock")? };
        Ok((&s.state, s.fd()).enable_txtime(report_errors)?)
    })
}

/// Writes the socket's counters to `*out`.
///
/// # Safety
/// `sock` a live socket; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_stats(
    sock: *const fastudp_socket,
    out: *mut fastudp_stats,
) -> fastudp_result {
    call("fastudp_socket_stats", || {
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let s = get(sock, "sock")?;
            if out.is_null() {
                return Err(Failure::Null("out"));
            }
            put(out, "out", (&(&s.state, s.fd()).stats()).into())
        }
    })
}

/// Writes fallback event `index` (0 to `fastudp_stats.fallbacks - 1`, in
/// the order they happened; the socket keeps the most recent 32) to
/// `*out`: a feature the socket turned off at run time, the errno and why.
///
/// # Safety
/// `sock` a live socket; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_socket_fallback(
    sock: *const fastudp_socket,
    index: usize,
    out: *mut fastudp_fallback_event,
) -> fastudp_result {
    call("fastudp_socket_fallback", || {
        // SAFETY: the caller vouches for the socket.
        let s = unsafe { get(sock, "sock")? };
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        let st = (&s.state, s.fd()).stats();
        let e = st.fallbacks.get(index).ok_or_else(|| {
            Failure::Invalid(format!(
                "index {index}: the socket has {} fallback events",
                st.fallbacks.len()
            ))
        })?;
        // SAFETY: out is non-NULL (checked) and writable.
        unsafe { put(out, "out", e.into()) }
    })
}

// ------------------------------------------------------------------ send

/// Transmits of one `fastudp_send` converted on the stack; a call with
/// more converts them into one allocation.
const SEND_CHUNK: usize = 64;

/// The Rust transmit of a C one.
///
/// # Safety
/// The pointers in `t` must be valid as its documentation says, for `'a`.
unsafe fn transmit_of<'a>(t: &fastudp_transmit, i: usize) -> Res<Transmit<'a>> {
    let at = |f: Failure| match f {
        Failure::Null(what) => Failure::Invalid(format!("transmit {i}: {what} is NULL")),
        Failure::Invalid(s) => Failure::Invalid(format!("transmit {i}: {s}")),
        other => other,
    };
    // SAFETY: the caller vouches for the destination, contents and source.
    let (dest, contents, src) = unsafe {
        (
            read_addr(t.destination, t.destination_len, "destination").map_err(at)?,
            bytes(t.contents, t.contents_len, "contents").map_err(at)?,
            if t.source.is_null() {
                None
            } else {
                Some(
                    read_addr(t.source, t.source_len, "source")
                        .map_err(at)?
                        .ip(),
                )
            },
        )
    };
    let ecn = ecn_from_c(t.ecn).map_err(at)?;
    let base = if t.segment_size > 0 {
        Transmit::train(dest, contents, t.segment_size)
    } else {
        Transmit::new(dest, contents)
    };
    Ok(base
        .with_ecn(ecn)
        .with_src_ip(src)
        .with_txtime(t.has_txtime.then_some(t.txtime_ns)))
}

/// Sends `transmits[0..n]` in order, in as few system calls as the
/// socket's features allow (GSO trains, `sendmmsg`), and writes what went
/// out to `*sent`.
///
/// A full local queue is not an error: the datagrams the qdisc dropped
/// (`ENOBUFS`) are done, counted in `sent->dropped_locally` and in
/// `fastudp_stats.dropped_locally`, and the call goes on with the next
/// transmit, as the kernel would without `IP_RECVERR`.
///
/// `FASTUDP_OK` with `sent->transmits < n` means the kernel stopped early
/// (`EAGAIN` on a non-blocking socket, or an error on the next
/// transmit, which the next call reports): resume from
/// `transmits[sent->transmits]`, first advancing its `contents` by
/// `sent->datagrams * segment_size` bytes if `sent->datagrams` is not 0.
/// Nothing is ever sent twice. An error code means nothing was sent;
/// `fastudp_last_error` names the transmit when the error is about one.
/// Every transmit is checked before any is sent. `transmits` and the
/// memory it points to are read during the call only.
///
/// # Safety
/// `sock` a live socket; `transmits` valid for reads of `n` transmits,
/// each valid as `fastudp_transmit` says; `sent` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_send(
    sock: *const fastudp_socket,
    transmits: *const fastudp_transmit,
    n: usize,
    sent: *mut fastudp_sent,
) -> fastudp_result {
    call("fastudp_send", || {
        // SAFETY: the caller vouches for the socket.
        let s = unsafe { get(sock, "sock")? };
        if sent.is_null() {
            return Err(Failure::Null("sent"));
        }
        let ts: &[fastudp_transmit] = if n == 0 {
            &[]
        } else if transmits.is_null() {
            return Err(Failure::Null("transmits"));
        } else if n > isize::MAX as usize / size_of::<fastudp_transmit>() {
            return Err(Failure::Invalid(format!("n {n} is too large")));
        } else {
            // SAFETY: non-NULL, the size fits, and the caller vouches for n
            // readable transmits.
            unsafe { std::slice::from_raw_parts(transmits, n) }
        };
        // All transmits go to the library in one call, which checks every
        // one (C pointers here, sizes and families there) before it sends
        // any. Up to SEND_CHUNK on the stack; more in one allocation, whose
        // failure is an error code.
        let empty = Transmit::new(SocketAddr::from(([0, 0, 0, 0], 0)), &[]);
        let mut stack = [empty; SEND_CHUNK];
        let mut heap = Vec::new();
        let all: &mut [Transmit<'_>] = if n <= SEND_CHUNK {
            &mut stack[..n]
        } else {
            heap.try_reserve_exact(n).map_err(|_| {
                Failure::NoMemory(format!("cannot allocate room for {n} transmits"))
            })?;
            heap.resize(n, empty);
            &mut heap
        };
        for (i, t) in ts.iter().enumerate() {
            // SAFETY: the caller vouches for each transmit's pointers.
            all[i] = unsafe { transmit_of(t, i)? };
        }
        let r = (&s.state, s.fd()).send(all)?;
        let result = fastudp_sent {
            transmits: r.transmits,
            datagrams: r.datagrams,
            dropped_locally: r.dropped_locally,
        };
        // SAFETY: sent is non-NULL (checked) and writable.
        unsafe { put(sent, "sent", result) }
    })
}

// --------------------------------------------------------------- receive

/// Reusable receive buffers and their messages' metadata: allocated once by
/// `fastudp_recv_batch_new`, filled by each `fastudp_recv`, freed by
/// `fastudp_recv_batch_free`. Use a batch from one thread at a time.
pub struct fastudp_recv_batch {
    inner: RecvBatch,
    metas: Vec<fastudp_recv_meta>,
    /// Receives into the batch so far: an iterator set up before the last
    /// one has ended.
    generation: u64,
}

/// Bytes per message of a receive batch created with
/// `bytes_per_message` 0: the header's default, and `fastudp_io::RecvBatch::new`'s.
const DEFAULT_MESSAGE_CAPACITY: usize = 96 * 1024;

/// Creates a receive batch of `messages` buffers (1 to 128) of
/// `bytes_per_message` bytes each (0 for 98304, room for a 64-datagram GRO
/// train of 1472-byte datagrams; at most 16 MiB) and writes it to `*out`.
/// A size out of range is `FASTUDP_ERR_INVALID`; memory the system cannot
/// give (up to 2 GiB at the largest sizes) is `FASTUDP_ERR_NO_MEMORY`.
/// Either way `*out` is left as it was, and nothing is printed.
///
/// # Safety
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv_batch_new(
    messages: usize,
    bytes_per_message: usize,
    out: *mut *mut fastudp_recv_batch,
) -> fastudp_result {
    call("fastudp_recv_batch_new", || {
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        if !(1..=128).contains(&messages) {
            return Err(Failure::Invalid(format!(
                "messages {messages}: a batch holds 1 to 128 messages"
            )));
        }
        if bytes_per_message > 16 << 20 {
            return Err(Failure::Invalid(format!(
                "bytes_per_message {bytes_per_message}: at most 16 MiB ({})",
                16 << 20
            )));
        }
        let per = if bytes_per_message == 0 {
            DEFAULT_MESSAGE_CAPACITY
        } else {
            bytes_per_message
        };
        let inner = RecvBatch::with_capacity(messages, per)
            .map_err(|e| Failure::NoMemory(format!("{e} for {messages} buffers of {per} bytes")))?;
        let meta = fastudp_recv_meta::scalars(&fastudp_io::RecvMeta::default());
        let mut metas = Vec::new();
        metas
            .try_reserve_exact(inner.capacity())
            .map_err(|_| Failure::NoMemory("cannot allocate the batch's metadata".into()))?;
        metas.resize(inner.capacity(), meta);
        let b = Box::new(fastudp_recv_batch {
            metas,
            inner,
            generation: 0,
        });
        // SAFETY: out is non-NULL (checked) and writable.
        unsafe { put(out, "out", Box::into_raw(b)) }
    })
}

/// Frees a receive batch (NULL is allowed, and does nothing). Pointers
/// into it become invalid.
///
/// # Safety
/// `batch` must be NULL or a batch from this library not yet freed, used by
/// no other call.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv_batch_free(batch: *mut fastudp_recv_batch) -> fastudp_result {
    call("fastudp_recv_batch_free", || {
        if !batch.is_null() {
            // SAFETY: the pointer came from Box::into_raw in this module
            // and is freed once, as the caller vouches.
            drop(unsafe { Box::from_raw(batch) });
        }
        Ok(())
    })
}

/// Receives a batch of messages into `batch` and writes how many to
/// `*messages`. On a blocking socket, waits until at least one message is
/// there, then takes what else is queued without waiting; on a
/// non-blocking one, returns `FASTUDP_ERR_WOULD_BLOCK` when nothing is
/// queued. With GRO one message may hold many datagrams: iterate them with
/// `fastudp_recv_batch_datagrams`. What the batch held before is replaced.
///
/// # Safety
/// `sock` a live socket; `batch` a live batch used by no other call;
/// `messages` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv(
    sock: *const fastudp_socket,
    batch: *mut fastudp_recv_batch,
    messages: *mut usize,
) -> fastudp_result {
    call("fastudp_recv", || {
        // SAFETY: the caller vouches for the socket and the batch.
        let (s, b) = unsafe { (get(sock, "sock")?, get_mut(batch, "batch")?) };
        if messages.is_null() {
            return Err(Failure::Null("messages"));
        }
        b.generation += 1;
        let got = match (&s.state, s.fd()).recv(&mut b.inner) {
            Ok(n) => n,
            Err(e) => {
                // SAFETY: messages is non-NULL (checked) and writable.
                unsafe { put(messages, "messages", 0)? };
                return Err(e.into());
            }
        };
        for (i, slot) in b.metas.iter_mut().enumerate().take(got) {
            let Some((m, _)) = b.inner.get(i) else { break };
            let mut c = fastudp_recv_meta::scalars(m);
            (c.source, c.source_len) = storage_of(m.source);
            (c.destination, c.destination_len) = ip_storage(m.destination);
            *slot = c;
        }
        // SAFETY: messages is non-NULL (checked) and writable.
        unsafe { put(messages, "messages", got) }
    })
}

/// Writes message `index` of the last receive into `batch`: its metadata
/// to `*meta` and its payload (`(*meta)->len` bytes) to `*data`. Both
/// point into the batch, valid until the next receive into it or its
/// free.
///
/// # Safety
/// `batch` a live batch; `meta` and `data` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv_batch_message(
    batch: *const fastudp_recv_batch,
    index: usize,
    meta: *mut *const fastudp_recv_meta,
    data: *mut *const u8,
) -> fastudp_result {
    call("fastudp_recv_batch_message", || {
        // SAFETY: the caller vouches for the batch.
        let b = unsafe { get(batch, "batch")? };
        if meta.is_null() {
            return Err(Failure::Null("meta"));
        }
        if data.is_null() {
            return Err(Failure::Null("data"));
        }
        let (_, payload) = b.inner.get(index).ok_or_else(|| {
            Failure::Invalid(format!(
                "index {index}: the last receive got {} messages",
                b.inner.len()
            ))
        })?;
        // SAFETY: both are non-NULL (checked) and writable.
        unsafe {
            put(meta, "meta", &b.metas[index] as *const fastudp_recv_meta)?;
            put(data, "data", payload.as_ptr())
        }
    })
}

/// Sets up `*iter` to go through every datagram of every message of the
/// last receive into `batch`, in order. The iterator lives on the
/// caller's stack and holds no resources; a receive into the batch ends
/// it.
///
/// # Safety
/// `batch` a live batch; `iter` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv_batch_datagrams(
    batch: *const fastudp_recv_batch,
    iter: *mut fastudp_datagram_iter,
) -> fastudp_result {
    call("fastudp_recv_batch_datagrams", || {
        // SAFETY: the caller vouches for both pointers.
        unsafe {
            let b = get(batch, "batch")?;
            put(
                iter,
                "iter",
                fastudp_datagram_iter {
                    batch: (b as *const fastudp_recv_batch).cast(),
                    message: 0,
                    offset: 0,
                    generation: b.generation,
                },
            )
        }
    })
}

/// Writes the next datagram of the iteration to `*out` and true to
/// `*has_datagram`, or false when there are no more. The datagram points
/// into the batch, valid until the next receive into it or its free.
/// `FASTUDP_ERR_INVALID` when the batch received again since the iterator
/// was set up.
///
/// # Safety
/// `iter` set up by `fastudp_recv_batch_datagrams` on a batch still alive;
/// `out` and `has_datagram` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_datagram_iter_next(
    iter: *mut fastudp_datagram_iter,
    out: *mut fastudp_datagram,
    has_datagram: *mut bool,
) -> fastudp_result {
    call("fastudp_datagram_iter_next", || {
        // SAFETY: the caller vouches for the iterator, and through it for
        // the batch it was set up on.
        let it = unsafe { get_mut(iter, "iter")? };
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        if has_datagram.is_null() {
            return Err(Failure::Null("has_datagram"));
        }
        // SAFETY: the iterator's batch pointer came from a live batch, as
        // the caller vouches.
        let b = unsafe { get(it.batch.cast::<fastudp_recv_batch>(), "iter->batch")? };
        if it.generation != b.generation {
            return Err(Failure::Invalid(
                "the batch received again since the iterator was set up".into(),
            ));
        }
        while let Some((m, payload)) = b.inner.get(it.message) {
            // The library's splitting: the first datagram of what is left.
            let rest = payload.get(it.offset..).unwrap_or(&[]);
            let d = if it.offset == 0 || !rest.is_empty() {
                m.datagrams(rest).next()
            } else {
                None
            };
            match d {
                Some(d) => {
                    let dg = fastudp_datagram {
                        data: d.as_ptr(),
                        len: d.len(),
                        meta: &b.metas[it.message],
                        message: it.message,
                    };
                    it.offset += d.len();
                    if d.is_empty() {
                        // An empty message is one empty datagram.
                        it.message += 1;
                        it.offset = 0;
                    }
                    // SAFETY: both are non-NULL (checked) and writable.
                    return unsafe {
                        put(out, "out", dg)?;
                        put(has_datagram, "has_datagram", true)
                    };
                }
                None => {
                    it.message += 1;
                    it.offset = 0;
                }
            }
        }
        // SAFETY: non-NULL (checked) and writable.
        unsafe { put(has_datagram, "has_datagram", false) }
    })
}

// ------------------------------------------------------------- coalescer

/// Packs datagrams pushed one at a time (as a QUIC stack produces them)
/// into GSO trains per destination, and sends them with as few system
/// calls as it can. It copies each datagram. Use one coalescer with one
/// socket, from one thread at a time; free it with
/// `fastudp_coalescer_free`.
pub struct fastudp_coalescer {
    inner: Coalescer,
}

/// The path MTU a coalescer assumes when given 0 (the header's default,
/// and `fastudp_io::Coalescer::new`'s).
const DEFAULT_MTU: usize = 1500;

/// Checks a path MTU given to the coalescer: 0 means the default (1500).
fn mtu_of(mtu: usize) -> Res<usize> {
    match mtu {
        0 => Ok(DEFAULT_MTU),
        68..=65535 => Ok(mtu),
        _ => Err(Failure::Invalid(format!(
            "mtu {mtu}: a path MTU is 68 to 65535 bytes (0 for {DEFAULT_MTU})"
        ))),
    }
}

/// Most trains a coalescer may queue (`max_trains` of
/// `fastudp_coalescer_new`): with trains of up to 64 KiB each, a queue
/// holds at most 256 MiB.
pub const FASTUDP_MAX_COALESCER_TRAINS: usize = 4096;

/// Creates a coalescer for a path MTU of `mtu` bytes (0: 1500; else 68 to
/// 65535) that flushes by itself when `max_trains` trains are queued (0:
/// 64; at most `FASTUDP_MAX_COALESCER_TRAINS`), and writes it to `*out`.
/// A size out of range is `FASTUDP_ERR_INVALID`, and `*out` is left as it
/// was.
///
/// # Safety
/// `out` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_coalescer_new(
    mtu: usize,
    max_trains: usize,
    out: *mut *mut fastudp_coalescer,
) -> fastudp_result {
    call("fastudp_coalescer_new", || {
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        if max_trains > FASTUDP_MAX_COALESCER_TRAINS {
            return Err(Failure::Invalid(format!(
                "max_trains {max_trains}: at most {FASTUDP_MAX_COALESCER_TRAINS} (0 for 64)"
            )));
        }
        let mut c = Coalescer::new();
        c.set_mtu(mtu_of(mtu)?);
        if max_trains > 0 {
            c = c.with_max_trains(max_trains);
        }
        let b = Box::into_raw(Box::new(fastudp_coalescer { inner: c }));
        // SAFETY: out is non-NULL (checked) and writable.
        unsafe { put(out, "out", b) }
    })
}

/// Frees a coalescer (NULL is allowed, and does nothing). Datagrams still
/// queued are dropped: flush first.
///
/// # Safety
/// `c` must be NULL or a coalescer from this library not yet freed, used
/// by no other call.
#[no_mangle]
pub unsafe extern "C" fn fastudp_coalescer_free(c: *mut fastudp_coalescer) -> fastudp_result {
    call("fastudp_coalescer_free", || {
        if !c.is_null() {
            // SAFETY: the pointer came from Box::into_raw in this module
            // and is freed once, as the caller vouches.
            drop(unsafe { Box::from_raw(c) });
        }
        Ok(())
    })
}

/// Queues one datagram (`len` bytes at `data`, copied) to `dest`, with an
/// ECN codepoint (`FASTUDP_ECN_*`) and a source address (`source`, or NULL
/// for the kernel's choice), and writes its number to `*number` unless
/// `number` is NULL: datagrams are numbered 0, 1, 2, ... in push order, and
/// errors name them so (`fastudp_last_error`'s index). When the queue is
/// full the queued trains are flushed on `sock` first. An error means the
/// datagram was not queued (`FASTUDP_ERR_NO_MEMORY` when there was no
/// memory to queue it).
///
/// # Safety
/// `c` a live coalescer and `sock` a live socket, used with no other;
/// `dest` valid for `dest_len` bytes; `data` for `len` bytes; `source`
/// NULL or valid for `source_len` bytes; `number` NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn fastudp_coalescer_push(
    c: *mut fastudp_coalescer,
    sock: *const fastudp_socket,
    dest: *const sockaddr,
    dest_len: socklen_t,
    data: *const u8,
    len: usize,
    ecn: u8,
    source: *const sockaddr,
    source_len: socklen_t,
    number: *mut u64,
) -> fastudp_result {
    call("fastudp_coalescer_push", || {
        // SAFETY: the caller vouches for every pointer.
        let (c, s, dest, data, src) = unsafe {
            (
                get_mut(c, "c")?,
                get(sock, "sock")?,
                read_addr(dest, dest_len, "dest")?,
                bytes(data, len, "data")?,
                if source.is_null() {
                    None
                } else {
                    Some(read_addr(source, source_len, "source")?.ip())
                },
            )
        };
        let ecn = ecn_from_c(ecn)?;
        let n = c.inner.push(&(&s.state, s.fd()), dest, data, ecn, src)?;
        // SAFETY: NULL or writable, as the caller vouches.
        unsafe { put_opt(number, n) };
        Ok(())
    })
}

/// Sends every queued train on `sock` and writes the number of datagrams
/// sent to `*sent` unless `sent` is NULL. On a non-blocking socket the
/// kernel may take only some: the rest stay queued, in order, for the
/// next flush (`fastudp_coalescer_queued`). An error means nothing was
/// sent, with one exception: a datagram that does not fit the path MTU on
/// its own (`FASTUDP_ERR_DATAGRAM_EXCEEDS_MTU`, whose index is the
/// datagram's number) is dropped from the queue so that the rest can go.
///
/// # Safety
/// `c` a live coalescer and `sock` a live socket; `sent` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_coalescer_flush(
    c: *mut fastudp_coalescer,
    sock: *const fastudp_socket,
    sent: *mut usize,
) -> fastudp_result {
    call("fastudp_coalescer_flush", || {
        // SAFETY: the caller vouches for both pointers.
        let (c, s) = unsafe { (get_mut(c, "c")?, get(sock, "sock")?) };
        let n = c.inner.flush(&(&s.state, s.fd()))?;
        // SAFETY: NULL or writable, as the caller vouches.
        unsafe { put_opt(sent, n) };
        Ok(())
    })
}

/// Writes how many datagrams and trains are queued and not yet sent.
///
/// # Safety
/// `c` a live coalescer; `datagrams` and `trains` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_coalescer_queued(
    c: *const fastudp_coalescer,
    datagrams: *mut usize,
    trains: *mut usize,
) -> fastudp_result {
    call("fastudp_coalescer_queued", || {
        // SAFETY: the caller vouches for the pointers.
        unsafe {
            let c = get(c, "c")?;
            if trains.is_null() {
                return Err(Failure::Null("trains"));
            }
            let (queued_datagrams, queued_trains) = c.inner.queued();
            put(datagrams, "datagrams", queued_datagrams)?;
            put(trains, "trains", queued_trains)
        }
    })
}

/// Changes the path MTU (68 to 65535; 0 for 1500), say after a
/// `FASTUDP_SOCKET_ERROR_PACKET_TOO_BIG`. Queued trains whose segments no
/// longer fit go one datagram at a time.
///
/// # Safety
/// `c` a live coalescer used by no other call.
#[no_mangle]
pub unsafe extern "C" fn fastudp_coalescer_set_mtu(
    c: *mut fastudp_coalescer,
    mtu: usize,
) -> fastudp_result {
    call("fastudp_coalescer_set_mtu", || {
        // SAFETY: the caller vouches for the coalescer.
        let c = unsafe { get_mut(c, "c")? };
        c.inner.set_mtu(mtu_of(mtu)?);
        Ok(())
    })
}

// ----------------------------------------------------------- error queue

/// Takes the oldest message of the socket's error queue (ICMP errors with
/// the destination that refused and who said so, "packet too big" with
/// the MTU, departure-time drops, zerocopy completions): writes it to
/// `*out` and true to `*got`, or false to `*got` (and nothing to `*out`)
/// when the queue is empty. Never waits.
///
/// # Safety
/// `sock` a live socket; `out` and `got` writable.
#[no_mangle]
pub unsafe extern "C" fn fastudp_recv_error(
    sock: *const fastudp_socket,
    out: *mut fastudp_socket_error,
    got: *mut bool,
) -> fastudp_result {
    call("fastudp_recv_error", || {
        // SAFETY: the caller vouches for the socket.
        let s = unsafe { get(sock, "sock")? };
        if out.is_null() {
            return Err(Failure::Null("out"));
        }
        if got.is_null() {
            return Err(Failure::Null("got"));
        }
        match (&s.state, s.fd()).recv_error()? {
            Some(e) => {
                let mut c = fastudp_socket_error::scalars(&e);
                let (dest, reporter) = error_addresses(&e);
                if let Some(d) = dest {
                    (c.destination, c.destination_len) = storage_of(d);
                }
                (c.reporter, c.reporter_len) = ip_storage(reporter);
                // SAFETY: both are non-NULL (checked) and writable.
                unsafe {
                    put(out, "out", c)?;
                    put(got, "got", true)
                }
            }
            // SAFETY: non-NULL (checked) and writable.
            None => unsafe { put(got, "got", false) },
        }
    })
}

// ------------------------------------------------------------ test hooks

/// Test builds only (`FASTUDP_TEST_HOOKS`, the `test-hooks` feature): the
/// calling thread's next libfastudp call panics inside the library, before
/// it does anything, so that a test can check that the panic comes back
/// as `FASTUDP_ERR_PANIC` and that the library keeps working.
#[cfg(feature = "test-hooks")]
#[no_mangle]
pub extern "C" fn fastudp_test_panic_next() -> fastudp_result {
    call("fastudp_test_panic_next", || {
        hooks::arm();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_a_body_becomes_an_error_code_with_its_message() {
        let r = call("fastudp_example", || panic!("boom {}", 7));
        assert_eq!(r, FASTUDP_ERR_PANIC);
        let m = last_message().unwrap();
        assert!(m.starts_with("fastudp_example: internal error"), "{m}");
        assert!(m.contains("boom 7"), "{m}");
        assert!(m.contains("(at crates/fastudp-ffi/src/abi.rs:"), "{m}");
        // The guard still works after a panic.
        assert_eq!(call("fastudp_example", || Ok(())), FASTUDP_OK);
    }

    #[test]
    fn addresses_round_trip_through_c_storage() {
        for a in [
            "192.0.2.7:4433",
            "[2001:db8::1]:443",
            "[::ffff:192.0.2.1]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = storage_of(a);
            let p = (&ss as *const sockaddr_storage).cast::<sockaddr>();
            // SAFETY: ss is a live local of at least len bytes.
            let back = unsafe { read_addr(p, len, "a") }.unwrap();
            assert_eq!(back, a);
            // SAFETY: as above; a length one short is refused.
            let short = unsafe { read_addr(p, len - 1, "a") }.unwrap_err();
            assert!(matches!(short, Failure::Invalid(ref s) if s.contains("too short")));
        }
        let mut ss = empty_storage();
        ss.ss_family = libc::AF_UNIX as libc::sa_family_t;
        let p = (&ss as *const sockaddr_storage).cast::<sockaddr>();
        // SAFETY: ss is a live sockaddr_storage.
        let e = unsafe { read_addr(p, size_of::<sockaddr_storage>() as socklen_t, "a") };
        assert!(matches!(e, Err(Failure::Invalid(ref s)) if s.contains("neither AF_INET")));
        // SAFETY: NULL is checked before any read.
        let e = unsafe { read_addr(ptr::null(), 16, "dest") };
        assert!(matches!(e, Err(Failure::Null("dest"))));
    }
}
