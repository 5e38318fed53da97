//! The raw syscalls and wire formats under [fastudp-io](https://docs.rs/fastudp-io):
//! `sendmmsg`/`recvmmsg` with their control messages (UDP GSO and GRO, ECN,
//! PKTINFO, SO_TXTIME), the error queue (ICMP errors, zerocopy
//! completions), socket options, and with feature `uring` the io_uring
//! calls.
//!
//! **Internal.** This crate exists so that each source file belongs to one
//! crate: fastudp-io builds its sockets on it, fastudp-quic takes its
//! prefetch hint ([`sys::prefetch`]) from it, and the project's unpublished
//! tools (the command, the lab, the tests, the benchmarks and the fuzz
//! targets) call the same code rather than compiling a second copy. Its API
//! follows fastudp-io's needs and carries no stability promise of its
//! own; use [fastudp-io](https://docs.rs/fastudp-io).
//!
//! - [`sys`]: the only module with `unsafe` code: each function a thin
//!   wrapper over one syscall (or, for [`sys::prefetch`], one processor
//!   hint), each `unsafe` block with its `// SAFETY:` comment;
//! - [`wire`]: the pure byte-level logic (no syscalls, no `unsafe`), unit-
//!   and property-tested and fuzzed without a kernel;
//! - `ethtool` (feature `tools`): the `SIOCETHTOOL` ioctl's layouts.
//!
//! Features: `uring` (the io_uring layer, Linux only), `tools` (items only
//! the project's tools use).

#![deny(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "tools")]
pub mod ethtool;
#[allow(unsafe_code)]
pub mod sys;
pub mod wire;
