//! # fastudp
//!
//! Batched UDP send and receive for Linux at the lowest CPU cost per byte
//! the kernel allows: `sendmmsg`/`recvmmsg`, UDP GSO (segmentation offload)
//! and UDP GRO (receive coalescing), `MSG_ZEROCOPY` and departure-time
//! pacing, probed at run time, with fallbacks that never lose a datagram.
//!
//! ```
//! use fastudp_io::{Coalescer, Config, RecvBatch, Socket, Transmit, UdpIo};
//!
//! let rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default())?; // GRO on by default
//! let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default())?;
//! let to = rx.as_std().local_addr()?;
//!
//! // A GSO train: ten 1200-byte datagrams, one buffer, one syscall.
//! let payload = vec![7u8; 12_000];
//! let sent = tx.send(&[Transmit::train(to, &payload, 1200)])?;
//! assert!(sent.all(1));
//!
//! // Or one datagram at a time, as a QUIC stack produces them: the
//! // coalescer packs equal-size datagrams to one destination into trains
//! // and flushes them with as few sendmmsg calls as it can.
//! let mut c = Coalescer::new();
//! for _ in 0..20 {
//!     c.push(&tx, to, &[7u8; 1200], None, None)?; // no ECN mark, any source
//! }
//! c.flush(&tx)?;
//!
//! // Receive: one recvmmsg; a message may hold a whole GRO train, which
//! // `datagrams()` splits.
//! let mut batch = RecvBatch::new(32);
//! let mut received = 0;
//! while received < 30 {
//!     rx.recv(&mut batch)?;
//!     for (meta, datagram) in batch.datagrams() {
//!         assert_eq!(datagram.len(), 1200);
//!         assert_eq!(meta.source, tx.as_std().local_addr()?);
//!         received += 1;
//!     }
//! }
//! println!("{:?}", tx.stats()); // calls, messages, fallbacks and why
//! # Ok::<(), fastudp_io::Error>(())
//! ```
//!
//! # On your own socket (any runtime, blocking or not)
//!
//! The core is [`UdpState`]: capabilities, fallbacks, counters and the error
//! queue, apart from the socket, in the manner of quinn-udp's
//! `UdpSocketState`. The calls are those of the [`UdpIo`] trait, on a
//! socket with its state: [`Socket`] is a `std::net::UdpSocket` with its
//! `UdpState`, and the caller's own socket (anything with a file
//! descriptor: `std::net::UdpSocket`, `tokio::net::UdpSocket`, a mio
//! socket, a raw fd) is one as `(&state, &socket)`. [`Coalescer`] and [`ZeroCopySender`] hold no socket: each
//! call takes one (`&socket`, or `&(&state, &socket)`), so they live in the
//! same struct as their socket.
//!
//! A non-blocking send returns what went out ([`Sent`]); the caller resumes
//! from there, and nothing is ever sent twice:
//!
//! ```
//! use fastudp_io::{Config, RecvBatch, Transmit, UdpIo, UdpState};
//! use std::net::UdpSocket;
//!
//! let peer = UdpSocket::bind("127.0.0.1:0")?;
//! let sock = UdpSocket::bind("127.0.0.1:0")?;
//! sock.set_nonblocking(true)?;
//! let state = UdpState::new(&sock, Config::default())?;
//! let io = (&state, &sock);
//! let to = peer.local_addr()?;
//! let payload = vec![1u8; 10 * 1200];
//! let mut ts = vec![Transmit::train(to, &payload, 1200)];
//! let mut k = 0;
//! while k < ts.len() {
//!     match io.send(&ts[k..]) {
//!         Ok(sent) => {
//!             k += sent.transmits; // whole transmits
//!             if sent.datagrams > 0 {
//!                 // A train sent one datagram at a time stopped part-way.
//!                 ts[k] = ts[k].skip_datagrams(sent.datagrams);
//!             }
//!         }
//!         Err(e) if e.is_would_block() => {
//!             // The socket is full: wait for writability (poll, epoll,
//!             // a reactor), then resume from ts[k].
//!             std::thread::sleep(std::time::Duration::from_millis(1));
//!         }
//!         Err(e) => return Err(e.into()),
//!     }
//! }
//!
//! // The peer's socket is an ordinary one: ten datagrams arrive.
//! let mut buf = [0u8; 2000];
//! for _ in 0..10 {
//!     assert_eq!(peer.recv(&mut buf)?, 1200);
//! }
//!
//! // A non-blocking receive never waits: nothing is queued here.
//! let mut batch = RecvBatch::new(32);
//! match io.recv(&mut batch) {
//!     Ok(n) => println!("{n} messages"),
//!     Err(e) if e.is_would_block() => {}
//!     Err(e) => return Err(e.into()),
//! }
//! // ICMP errors, txtime drops and zerocopy completions, typed.
//! while let Some(err) = io.recv_error()? {
//!     println!("{err}");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the crate promises
//!
//! - **Non-blocking means non-blocking.** On a non-blocking socket no call
//!   sleeps, polls or spins: it returns what went out ([`Sent`]: whole
//!   transmits, then datagrams of a train that was being sent one by one)
//!   or `WouldBlock`, and the caller resumes from there. Nothing is ever
//!   sent twice. On a blocking socket, a train split into datagrams (GSO
//!   off) waits for buffer space up to [`Config::split_wait`] (5 s) so that
//!   it is not left half sent. `EINTR` is retried.
//! - **No heap allocation per call.** After warm-up, `send`, `recv`,
//!   [`Coalescer::push`]/[`Coalescer::flush`] and the zerocopy send and
//!   reap allocate nothing (`tests/it/alloc.rs` counts with a global
//!   allocator). Message headers are built on the stack, only as many as
//!   the batch uses.
//! - **Path MTU.** Don't-fragment is on by default (`IP_PMTUDISC_PROBE`,
//!   `IPV6_DONTFRAG`), as QUIC and datagram PMTU discovery (RFC 8899)
//!   need: a datagram over the MTU is refused
//!   ([`ErrorKind::ExceedsPathMtu`], for a datagram or a train's segment)
//!   and never fragmented. [`Config::may_fragment`] restores the
//!   kernel's fragmenting.
//! - **ICMP errors, typed.** `IP_RECVERR`/`IPV6_RECVERR` are on.
//!   [`UdpIo::recv_error`] returns [`SocketError`]s of a
//!   [`SocketErrorKind`]: `Unreachable` (port, host, network, prohibited)
//!   with the destination that refused and the router that said so;
//!   `PacketTooBig` with the MTU; `Txtime` drops; `ZeroCopy` completions. The kernel also fails the *next* send
//!   or receive with an ICMP error, even on an unconnected socket where it
//!   concerns another peer, and queued errors eat the receive buffer:
//!   fastudp reads them into its own queue (256 kept, overflow counted in
//!   [`Stats::errors_lost`]) and, on an unconnected socket, retries the
//!   call; a connected socket gets the error (`ECONNREFUSED`: the peer went
//!   away). [`ZeroCopySender`] keeps only its completions and leaves
//!   everything else for `recv_error`.
//! - **A full local queue is not an error.** With `IP_RECVERR` the kernel
//!   answers `ENOBUFS` for a datagram the device's qdisc dropped, where it
//!   would otherwise count the drop and return success. The send goes on:
//!   those datagrams are done, and counted in [`Sent::dropped_locally`]
//!   and [`Stats::dropped_locally`] (see [`UdpIo::send`]).
//! - **GSO refusals are not for ever, nor for everyone.** A GSO send the
//!   path refuses (`EIO`, `EINVAL`) is resent one datagram at a time at
//!   once; GSO stays off for [`Config::gso_retry`] (1 s, doubling per
//!   refusal in a row up to 64 s), then is tried again
//!   ([`Stats::gso_retries`]). It stays off only for the refusing
//!   destination's address family (older virtio-net refuses IPv6 GSO
//!   only): [`UdpState::max_gso_segments_to`]. A refused train whose last
//!   datagram is shorter than the rest (a Linux 6.6.44 regression) turns
//!   only such trains into datagrams. Each is a recorded fallback
//!   ([`FallbackEvent`]).
//! - **A stable surface.** Public structs and enums that will grow are
//!   `#[non_exhaustive]` (build [`Config`] and [`Transmit`] with their
//!   methods), errors have a kind to branch on ([`ErrorKind`]), and the
//!   public API is checked against a snapshot in CI.
//!
//! # What the socket does
//!
//! - **Send** ([`UdpIo::send`]): one `sendmmsg` for many transmits;
//!   each message gets its own control messages: `UDP_SEGMENT` only when
//!   it holds more than one segment, `IP_TOS`/`IPV6_TCLASS` for ECN,
//!   `IP_PKTINFO`/`IPV6_PKTINFO` for the source address. Every transmit is
//!   checked first: a payload over 65507 bytes (IPv4) / 65527 (IPv6), a
//!   zero segment size, or a train over the kernel's segment limit is an
//!   error that names the transmit, and nothing is sent.
//! - **Receive** ([`UdpIo::recv`]): `recvmmsg` with `UDP_GRO` on; each
//!   message has its source, destination IP (PKTINFO), ECN bits, stride
//!   (segment size) and an iterator over its datagrams ([`RecvMeta`]).
//!   Buffers default to 96 KiB per message, so a 64-segment train of
//!   1472-byte datagrams is never truncated. The batch is adaptive: a
//!   receiver that keeps up makes one `recvmsg` per call; a backlog or GRO
//!   trains make calls ask for about twice the backlog, within 256 KiB
//!   (a byte budget per call). `MSG_TRUNC`/`MSG_CTRUNC` are flagged per
//!   message and counted; the kernel's drop counter is
//!   [`Stats::kernel_drops`] (`SO_MEMINFO`, or the `SO_RXQ_OVFL` count on
//!   the last message queued after a drop). It counts dropped *messages*:
//!   a dropped GRO train counts once.
//! - **Dual stack**: bind `[::]` and IPv4 peers appear as v4-mapped
//!   addresses; you may send to either form.
//! - **Capabilities** ([`UdpState::capabilities`]): maximum GSO segments
//!   (128 on new kernels, 64 on older ones, probed once per process with a
//!   real send), and [`Capabilities::supports`] for each [`Feature`]: GRO,
//!   ECN, PKTINFO, `SO_RXQ_OVFL`, `IP_RECVERR`, don't-fragment, zerocopy
//!   and `SO_TXTIME` acceptance.
//!   [`UdpState::max_gso_segments`] drops to 1 while GSO is off after a
//!   refusal.
//! - **Fallbacks, none of which lose a datagram**: GSO (above); an ECN mark
//!   refused with `EINVAL`/`EIO` is dropped for a retry, and turned off
//!   only if the retry works. Each is recorded in [`Stats::fallbacks`] with
//!   the errno and a sentence.
//! - **Switches**: [`Config::disable`] turns features off;
//!   [`Feature::parse_list`] reads a list such as `"gso,gro,mmsg,ecn,pktinfo,zerocopy,txtime"`
//!   (an unknown name is an error that lists the known ones). The library
//!   reads no environment variable; the `fastudp` command maps
//!   `FASTUDP_DISABLE` to this setting.
//! - **Zerocopy** ([`ZeroCopySender`]): `MSG_ZEROCOPY` sends, with GSO,
//!   that take ownership of each buffer and hand it back only after its
//!   completion was read from the error queue, so a buffer can never be
//!   reused or freed while the kernel may read it. Completions the kernel
//!   copied anyway (always the case for local delivery) are counted, and by
//!   default the sender switches to plain copying sends when 60 of 64
//!   completions were copies, and says why.
//! - **Pacing** ([`pacing`]): a per-flow `Pacer` gives each train an
//!   earliest departure time; `choose_mode` picks kernel pacing
//!   (`SO_TXTIME`) only where the egress qdisc honours it (fq, etf), else
//!   user space, and says why; `Scheduler` runs many flows for one sending
//!   thread (`examples/paced.rs` shows the loop).
//! - **Reuseport groups** ([`ReuseportGroup`], [`Steering`]): N sockets on
//!   one address with `SO_REUSEPORT`, steered by a classic BPF program by
//!   receiving CPU or by 4 payload bytes (a QUIC connection ID), so a flow
//!   always lands on the same socket.
//! - **Other Unix systems**: the crate compiles to a plain
//!   one-datagram-per-call fallback that refuses control data rather than
//!   dropping it.
//!
//! # Features
//!
//! | feature | adds | stability |
//! |---|---|---|
//! | `tokio` | `tokio::UdpSocket`: the core as `async` calls on tokio's reactor | stable |
//! | `quinn` | `quinn::Socket`: fastudp as the UDP socket of the quinn QUIC stack (implies `tokio`) | stable |
//! | `uring` | `uring`: an io_uring backend for the same sockets (Linux; elsewhere nothing) | new: may still change |
//! //!
//! Each feature-gated item is marked with its feature in this
//! documentation. Complete programs: `examples/tokio_gso.rs` (tokio),
//! `examples/quinn_on_fastudp.rs` (a quinn client and server moving 8 MB),
//! `examples/paced.rs` (many paced flows).
//!
//! # Layout
//!
//! The crate keeps pure logic (control messages, train planning, GRO
//! splitting, error-queue decoding: `wire`, unit- and property-tested
//! without a kernel, and fuzzed) apart from the syscalls, which live in one
//! private module, the only one allowed `unsafe` code
//! (`#![deny(unsafe_code)]` everywhere else).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![deny(unsafe_code)]
// Every `unsafe` block says why it is sound, in a `// SAFETY:` comment.
#![deny(clippy::undocumented_unsafe_blocks)]

// The crate's README (the crates.io page): its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;

#[cfg(feature = "uring")]
mod backend;
mod caps;
mod coalesce;
mod error;
pub mod pacing;
#[cfg(feature = "quinn")]
#[cfg_attr(docsrs, doc(cfg(feature = "quinn")))]
pub mod quinn;
mod reuseport;
mod socket;
// The syscalls and the wire formats, in their own crate (fastudp-sys, the
// only one with `unsafe`), used under their old names.
use fastudp_sys::sys;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod tokio;
#[cfg(all(feature = "uring", target_os = "linux"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "uring", target_os = "linux"))))]
pub mod uring;
use fastudp_sys::wire;
mod zerocopy;

pub use caps::Capabilities;
pub use coalesce::Coalescer;
#[doc(hidden)]
pub use error::Reason;
pub use error::{Error, ErrorKind, FallbackEvent, Feature};
pub use reuseport::{ReuseportGroup, Steering};
pub use socket::errqueue::{SocketError, SocketErrorKind};
pub use socket::{Config, RecvBatch, RecvMeta, Sent, Socket, Stats, Transmit, UdpIo, UdpState};
pub use wire::control::EcnCodepoint;
pub use wire::gro::Datagrams;
pub use wire::{max_payload, max_segment_for_mtu};
pub use zerocopy::{SendMeta, ZeroCopySender, ZeroCopyStats};
