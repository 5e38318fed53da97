//! What the `fastudp` command, the library's tests and benchmarks, and the
//! fuzz targets share, apart from the library's API: thin wrappers over
//! raw syscalls ([`raw`]), operating-system helpers ([`os`]), device
//! features through the ethtool ioctl ([`host`]), the pacing arithmetic
//! of the command's paced streams ([`pacing`]), and the wire formats
//! ([`wire`]).
//!
//! Not published, and no promise of stability: the published `fastudp-io`
//! library exposes none of this. The syscalls and the wire formats come
//! from the `fastudp-sys` crate, with its `tools` feature (the items only
//! the tools use), so there is one copy of every parser and of every
//! `unsafe` block: `fastudp-sys`' `sys` stays the only module with
//! `unsafe`, each block with its `// SAFETY:` comment.

#![deny(missing_docs)]
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub use fastudp_sys::ethtool;
pub mod host;
pub mod pacing;
pub mod raw;

// The library's syscall layer (fastudp-sys, feature `tools`); the tools
// call part of it.
use fastudp_sys::sys;

pub use fastudp_sys::wire;

/// Operating-system helpers the command and the benchmarks share.
pub mod os {
    pub use crate::sys::{
        clock_ticks_per_sec, monotonic_ns, pin_to_cpu, process_cpu_time, set_timer_slack,
        setns_net, thread_cpu_time, unsent_bytes, wait_readable, MAX_BATCH,
    };
    /// A socket's `SO_MAX_PACING_RATE` in bytes per second (`u64::MAX` or
    /// `u32::MAX` when unlimited): what `fastudp_io::UdpIo::set_max_pacing_rate`
    /// set.
    pub fn max_pacing_rate(sock: impl std::os::fd::AsFd) -> std::io::Result<u64> {
        use std::os::fd::AsRawFd;
        crate::sys::getsockopt_u64(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            crate::sys::SO_MAX_PACING_RATE,
        )
    }
    /// Directory-relative file syscalls (`openat2`, `mkdirat`, `renameat`,
    /// `unlinkat`), for resolving a path without following symbolic links.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub use crate::sys::{mkdirat, openat2, renameat, unlinkat};

    /// The kernel's `UDP_MAX_SEGMENTS` (128 since 2024, 64 before), as the
    /// library probes it once per process
    /// ([`fastudp_io::Capabilities::kernel_max_segments`]); 0 when the kernel
    /// refuses GSO outright, and the older limit, 64, when no loopback
    /// socket can be made to ask.
    pub fn kernel_max_segments() -> usize {
        ["127.0.0.1:0", "[::1]:0"]
            .iter()
            .filter_map(|a| std::net::UdpSocket::bind(a).ok())
            .find_map(|s| fastudp_io::UdpState::new(&s, fastudp_io::Config::default()).ok())
            .map_or(64, |st| st.capabilities().kernel_max_segments)
    }
}
