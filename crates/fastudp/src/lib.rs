//! # fastudp
//!
//! Batched UDP send and receive for Linux at the lowest CPU cost per byte
//! the kernel allows: `sendmmsg`/`recvmmsg`, UDP GSO (segmentation offload)
//! and UDP GRO (receive coalescing), probed at run time, with fallbacks that
//! never lose a datagram.
//!
//! ```no_run
//! use fastudp::{RecvBatch, Socket, Transmit};
//!
//! let rx = Socket::bind("127.0.0.1:0".parse().unwrap())?;
//! let tx = Socket::bind("127.0.0.1:0".parse().unwrap())?;
//! let to = rx.local_addr()?;
//!
//! // Ten 1200-byte datagrams in one GSO train, one syscall.
//! let payload = vec![7u8; 12_000];
//! let sent = tx.send(&[Transmit::train(to, &payload, 1200)])?;
//! assert!(sent.all(1));
//!
//! // With GRO they may arrive as one message of ten datagrams.
//! let mut batch = RecvBatch::new(32);
//! rx.recv(&mut batch)?;
//! for (meta, datagram) in batch.datagrams() {
//!     assert_eq!(datagram.len(), 1200);
//!     let _ = meta.source;
//! }
//! # Ok::<(), fastudp::Error>(())
//! ```
//!
//! The core is [`UdpState`]: it works on any UDP socket the caller owns
//! (a `std::net::UdpSocket`, a `tokio::net::UdpSocket`, a raw fd), blocking
//! or not. [`Socket`] is a standard socket with its state, the easy way in.
//!
//! The crate keeps pure logic (control messages, train planning, GRO
//! splitting, error-queue decoding) apart from the syscalls, which live in
//! one private module, the only one allowed `unsafe` code
//! (`#![deny(unsafe_code)]` everywhere else).
//!
//! Optional features: `tokio` adds [`tokio::UdpSocket`](crate::tokio), the
//! core as `async` calls on tokio's reactor; `quinn` adds
//! `quinn::Socket`, fastudp as the UDP socket of the quinn QUIC stack;
//! `uring` (Linux) adds an io_uring backend to the same sockets
//! (`fastudp::uring`): multishot GRO receive into provided buffers, linked
//! `SENDMSG` batches of GSO trains and `SENDMSG_ZC`, with a run-time
//! fallback to the syscalls.
//!
//! The `unstable-tools` feature adds modules the `fastudp` command uses
//! (`host`, `raw`, `os`, `wire`). They are not part of the stable API.

#![deny(missing_docs)]
#![deny(unsafe_code)]
// Without `unstable-tools`, helpers only the tool modules call are unused.
#![cfg_attr(not(feature = "unstable-tools"), allow(dead_code))]

mod caps;
mod coalesce;
mod error;
#[cfg(feature = "unstable-tools")]
pub mod host;
pub mod pacing;
#[cfg(feature = "quinn")]
pub mod quinn;
#[cfg(feature = "unstable-tools")]
pub mod raw;
mod reuseport;
mod socket;
#[allow(unsafe_code)]
mod sys;
#[cfg(feature = "tokio")]
pub mod tokio;
#[cfg(all(feature = "uring", target_os = "linux"))]
pub mod uring;
#[cfg(feature = "unstable-tools")]
pub mod wire;
#[cfg(not(feature = "unstable-tools"))]
mod wire;
mod zerocopy;

pub use caps::{Capabilities, Disabled, DISABLE_ENV, FEATURE_NAMES};
pub use coalesce::{Coalescer, DEFAULT_MTU};
pub use error::{AllocError, ConfigError, Error, FallbackEvent, Feature};
pub use reuseport::{ReuseportGroup, Steering, MAX_STEERING_OFFSET};
pub use socket::{
    Config, RecvBatch, RecvMeta, Sent, Socket, Stats, Transmit, UdpIo, UdpState, DEFAULT_GSO_RETRY,
    DEFAULT_MESSAGE_CAPACITY, DEFAULT_RECV_BUDGET, DEFAULT_SPLIT_WAIT, FALLBACK_EVENTS_KEPT,
    MAX_GSO_RETRY,
};
pub use wire::cmsg::CmsgError;
pub use wire::control::EcnCodepoint;
pub use wire::errqueue::{SocketError, Unreachable};
pub use wire::gro::Datagrams;
pub use wire::{
    max_payload, max_segment_for_mtu, GRO_MAX_SEGMENTS, HEADER_V4, HEADER_V6, MAX_PAYLOAD_V4,
    MAX_PAYLOAD_V6,
};
pub use zerocopy::{SendMeta, ZeroCopyMode, ZeroCopySender, ZeroCopyStats};

/// Operating-system helpers the benchmark and test tools share. Not part of
/// the stable API: only with the `unstable-tools` feature.
#[cfg(feature = "unstable-tools")]
pub mod os {
    pub use crate::caps::kernel_max_segments;
    pub use crate::sys::{
        clock_ticks_per_sec, default_sigpipe, monotonic_ns, pin_to_cpu, process_cpu_time,
        set_timer_slack, setns_net, thread_cpu_time, wait_readable, MAX_BATCH,
    };
    /// Directory-relative file syscalls (`openat2`, `mkdirat`, `renameat`,
    /// `unlinkat`), for resolving a path without following symbolic links.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub use crate::sys::{mkdirat, openat2, renameat, unlinkat};
}
