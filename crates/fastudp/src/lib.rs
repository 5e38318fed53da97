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
//! tx.send(&[Transmit::train(to, &payload, 1200)])?;
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
//! The crate keeps pure logic (control messages, train planning, GRO
//! splitting) in [`wire`], apart from the syscalls, which live in one
//! private module, the only one with `unsafe` code.

#![deny(missing_docs)]

pub mod caps;
mod coalesce;
mod error;
pub mod host;
pub mod pacing;
pub mod raw;
mod reuseport;
mod socket;
mod sys;
pub mod wire;
mod zerocopy;

pub use caps::{Capabilities, Disabled, DISABLE_ENV};
pub use coalesce::{Coalescer, DEFAULT_MTU};
pub use error::{Error, FallbackEvent, Feature};
pub use reuseport::{ReuseportGroup, Steering};
pub use socket::{
    Config, RecvBatch, RecvMeta, Socket, Stats, Transmit, DEFAULT_MESSAGE_CAPACITY, SPLIT_DEADLINE,
};
pub use wire::control::EcnCodepoint;
pub use zerocopy::{ZeroCopyMode, ZeroCopySender, ZeroCopyStats};

/// Operating-system helpers the benchmark and test tools share.
pub mod os {
    pub use crate::sys::{
        clock_ticks_per_sec, default_sigpipe, monotonic_ns, pin_to_cpu, process_cpu_time,
        set_timer_slack, setns_net, thread_cpu_time, MAX_BATCH,
    };
}
