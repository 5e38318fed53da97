//! The only module with `unsafe` code and raw syscalls.
//!
//! Each function is a thin wrapper over one syscall (or a tight loop of the
//! same one), in the manner of `socket2`: it takes Rust types, fills the C
//! structures, makes the call and turns `-1` into an [`std::io::Error`].

#[cfg(any(target_os = "linux", target_os = "android"))]
mod linux;
#[cfg(any(target_os = "linux", target_os = "android"))]
pub use linux::*;
#[cfg(all(feature = "uring", target_os = "linux"))]
pub mod uring;

#[cfg(not(any(target_os = "linux", target_os = "android")))]
mod other;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub use other::*;

use crate::wire::cmsg::CmsgBuf;
use std::io::IoSlice;
use std::net::SocketAddr;

/// Asks the processor to bring the cache line holding `p` into its
/// caches, without waiting for it: a hint that reads nothing a program can
/// see, and cannot fault, whatever the address. For a server whose
/// connections have left the caches between two of their datagrams: the
/// misses of a batch's connections, asked for together, overlap. A no-op
/// on processors other than x86-64.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 (SSE, part of every x86-64 processor) is a hint:
    // it does not access memory as far as the program is concerned, and
    // never faults, even on an invalid or unmapped address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Most messages handed to one `sendmmsg` / `recvmmsg` call.
pub const MAX_BATCH: usize = 128;

/// Bytes of control data room per message of [`send_batch`]: UDP_SEGMENT,
/// an ECN mark, an IPv6 PKTINFO and SCM_TXTIME take 112.
pub const SEND_CONTROL_LEN: usize = 128;

/// One message of [`send_batch`]: destination and payload; its control
/// data was encoded in place.
#[derive(Debug, Clone, Copy)]
pub struct SendMsg<'a> {
    /// Destination, in the socket's family; `None` on a connected socket.
    pub dest: Option<SocketAddr>,
    /// The payload.
    pub payload: &'a [u8],
    /// Bytes of control data encoded.
    pub control_len: usize,
}

/// One message to send: destination, payload slices and control data.
#[derive(Debug, Clone, Copy)]
pub struct OutMsg<'a> {
    /// Destination; `None` on a connected socket.
    pub addr: Option<&'a socket2::SockAddr>,
    /// Payload, gathered from one or more slices.
    pub iov: &'a [IoSlice<'a>],
    /// Encoded control messages (may be empty).
    pub control: &'a [u8],
}

/// Where one received message's metadata lands.
#[derive(Debug, Clone, Copy, Default)]
pub struct InMeta {
    /// Bytes received (the full datagram length when `MSG_TRUNC` is set).
    pub len: usize,
    /// `msg_flags`.
    pub flags: i32,
    /// Source address.
    pub source: Option<SocketAddr>,
    /// Bytes of control data.
    pub control_len: usize,
}

/// The control buffer of each received message.
pub type InControl = CmsgBuf;

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
#[cfg(feature = "tools")]
pub fn thread_cpu_time() -> std::time::Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// `CLOCK_MONOTONIC` now, in ns: the clock of `SCM_TXTIME` departure times.
pub fn monotonic_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC).as_nanos() as u64
}

/// CPU time the whole process has used (`CLOCK_PROCESS_CPUTIME_ID`).
#[cfg(feature = "tools")]
pub fn process_cpu_time() -> std::time::Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one live timespec; the clock ids used here exist on every
    // supported system, and on failure `ts` stays zero.
    unsafe { libc::clock_gettime(id, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Clock ticks per second for `/proc/stat` times (`sysconf(_SC_CLK_TCK)`).
#[cfg(feature = "tools")]
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// `len` zeroed bytes, or `None` when the allocator cannot give them
/// (`calloc`-like: the pages are touched only when used). Unlike
/// `vec![0; len]`, a failure is an answer, not an abort of the process.
pub fn try_zeroed_bytes(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: the layout has a non-zero size (len > 0).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: p was allocated by the global allocator with the layout of
    // `len` u8s (align 1), all `len` bytes are initialized (zeroed), and
    // the length equals the capacity.
    Some(unsafe { Vec::from_raw_parts(p, len, len) })
}
