//! fastudp as the UDP socket of the quinn QUIC stack (feature `quinn`).
//!
//! [`Socket`] implements quinn 0.11's `AsyncUdpSocket`, so that
//! `quinn::Endpoint::new_with_abstract_socket` runs on fastudp's core:
//! GSO trains with run-time fallback, GRO receive straight into quinn's
//! buffers, ECN, `IP_PKTINFO`, path-MTU defaults and fastudp's counters.
//!
//! ```
//! use std::sync::Arc;
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let socket = fastudp_io::quinn::Socket::bind("127.0.0.1:0".parse()?, fastudp_io::Config::default())?;
//!     let endpoint = quinn::Endpoint::new_with_abstract_socket(
//!         quinn::EndpointConfig::default(),
//!         None, // a client; pass Some(server_config) to accept connections
//!         Arc::new(socket),
//!         Arc::new(quinn::TokioRuntime),
//!     )?;
//!     println!("a quinn endpoint on fastudp at {}", endpoint.local_addr()?);
//!     Ok(())
//! }
//! ```
//!
//! A complete program, a server with a certificate made at start and a
//! client moving 8 MB each way over fastudp sockets, is
//! `examples/quinn_on_fastudp.rs` (`cargo run -p fastudp-io --features quinn
//! --example quinn_on_fastudp`; the test `examples` runs it).
//! `tests/it/quinn.rs` moves 1 GiB with every byte checked, over loopback and
//! across a veth pair with and without segmentation offload, and with the
//! kernel refusing GSO part-way.
//!
//! What quinn sees:
//! - `max_transmit_segments()` is the GSO segment count *now*: it drops to
//!   1 when a path refuses GSO and comes back after
//!   [`crate::Config::gso_retry`], so quinn stops building trains while
//!   they would be split;
//! - `max_receive_segments()` is 64 with GRO, else 1;
//! - `may_fragment()` is false: fastudp sets don't-fragment by default, so
//!   quinn's path-MTU discovery runs (its probes over the MTU are refused
//!   by the kernel and count as lost, as QUIC expects).
//!
//! Errors. quinn closes every connection of an endpoint when its socket
//! returns an error other than `WouldBlock`, so, like quinn's own socket,
//! a send that fails for another reason (a probe over the path MTU, an
//! unreachable destination) is reported as sent and left to QUIC's loss
//! recovery; each one is counted ([`Socket::send_errors`]). Datagrams a
//! full local queue drops (`ENOBUFS`) are done as well, as the kernel
//! would report them without `IP_RECVERR`: quinn sees them as sent, and
//! its loss recovery and congestion control see them lost. They are
//! counted in [`crate::Stats::dropped_locally`]. ICMP errors
//! are read into the error queue ([`UdpIo::recv_error`]), not
//! returned by receives. Counters: [`UdpIo::stats`].
//!
//! Receive stays on `recvmmsg`, straight into quinn's buffers, also with
//! the `uring` feature (a socket configured with `Config::uring` is taken
//! off its ring here, and the fallback recorded). quinn's `poll_recv` wants each datagram in a
//! buffer of its own, so an io_uring receive would still copy it, out of
//! the ring's provided buffer into quinn's: measured on a 2-vCPU VM
//! (docs/BENCHMARKS.md, section 13.1), that ring receive plus copy cost
//! 1.10x to 1.18x the receiver's CPU per byte of `recvmmsg` into the same
//! buffers (with the ring's default 8 buffers; 1.79x to 1.86x with 64).
//! tokio also waits on the socket's readiness, which a ring receive takes
//! away. The receive that reads datagrams in place,
//! `Socket::recv_borrowed`, pays where the datagram is consumed where it
//! lies, as in the fastudp-quic engine's `uring` setting.
//!
//! A train split half-way (GSO refused mid-run, then the socket filled) is
//! never lost or sent twice: its rest is kept (one copy, the only one) and
//! sent before anything else.
//!
//! Batching across connections: quinn hands the socket one transmit per
//! `try_send` call and expects it to be with the kernel, or refused with
//! `WouldBlock`, when the call returns; it has no "end of batch" call. A
//! socket that held transmits back to send several with one `sendmmsg`
//! would delay them by an unknown time (until a later call that may never
//! come), against quinn's pacing and loss timers. So each transmit is one
//! `sendmsg`, a whole GSO train; batching across flows belongs to a server
//! that drives `quinn-proto` itself and sees all its connections' transmits
//! at once.

use crate::socket::{Config, RecvMeta, Transmit, UdpIo, UdpState};
use crate::{EcnCodepoint, Error};
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use tokio::io::Interest;

/// Most messages one receive asks for (quinn hands over 32 buffers).
const RECV_BATCH: usize = 32;

/// fastudp as quinn's UDP socket: see the [module docs](self).
pub struct Socket {
    io: tokio::net::UdpSocket,
    state: UdpState,
    /// The rest of a train split half-way, sent before anything else.
    pending: Mutex<Pending>,
    send_errors: AtomicU64,
}

impl fmt::Debug for Socket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("fastudp_io::quinn::Socket")
            .field("local_addr", &self.io.local_addr().ok())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// The rest of a train the kernel took only part of.
#[derive(Debug, Default)]
struct Pending {
    /// Its datagrams (empty: nothing pending).
    contents: Vec<u8>,
    destination: Option<SocketAddr>,
    segment_size: Option<usize>,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<std::net::IpAddr>,
}

impl Pending {
    fn transmit(&self) -> Option<Transmit<'_>> {
        let dest = self.destination?;
        if self.contents.is_empty() {
            return None;
        }
        let mut t = Transmit::new(dest, &self.contents)
            .with_ecn(self.ecn)
            .with_src_ip(self.src_ip);
        t.segment_size = self.segment_size;
        Some(t)
    }

    fn keep(&mut self, t: &Transmit<'_>) {
        self.contents.clear();
        self.contents.extend_from_slice(t.contents);
        self.destination = Some(t.destination);
        self.segment_size = t.segment_size;
        self.ecn = t.ecn;
        self.src_ip = t.src_ip;
    }

    fn clear(&mut self) {
        self.contents.clear();
        self.destination = None;
    }
}

fn to_quinn_ecn(e: EcnCodepoint) -> quinn::udp::EcnCodepoint {
    match e {
        EcnCodepoint::Ect0 => quinn::udp::EcnCodepoint::Ect0,
        EcnCodepoint::Ect1 => quinn::udp::EcnCodepoint::Ect1,
        EcnCodepoint::Ce => quinn::udp::EcnCodepoint::Ce,
    }
}

fn from_quinn_ecn(e: quinn::udp::EcnCodepoint) -> EcnCodepoint {
    match e {
        quinn::udp::EcnCodepoint::Ect0 => EcnCodepoint::Ect0,
        quinn::udp::EcnCodepoint::Ect1 => EcnCodepoint::Ect1,
        quinn::udp::EcnCodepoint::Ce => EcnCodepoint::Ce,
    }
}

/// What one send attempt came to.
enum Outcome {
    /// Everything went out.
    Done,
    /// The kernel took nothing: wait for writability.
    WouldBlock,
}

impl Socket {
    /// Binds a socket at `addr` and sets it up with `config`
    /// (`Config::default()` for the defaults). Call it inside a tokio
    /// runtime. To start from a standard socket, make a
    /// [`crate::Socket`] of it and convert that (`Socket::try_from`).
    pub fn bind(addr: SocketAddr, config: Config) -> Result<Self, Error> {
        Self::try_from(crate::Socket::bind(addr, config)?)
    }

    /// Sends that failed for a reason other than a full socket and were
    /// left to QUIC's loss recovery (see the module docs).
    pub fn send_errors(&self) -> u64 {
        self.send_errors.load(Relaxed)
    }

    /// One send of `t`; a train cut half-way keeps its rest in `pending`.
    fn send_one(&self, t: &Transmit<'_>, pending: &mut Pending) -> Outcome {
        match self.state.send_on(&self.io, std::slice::from_ref(t)) {
            Ok(s) if s.transmits == 1 => Outcome::Done,
            Ok(s) if s.datagrams > 0 => {
                pending.keep(&t.skip_datagrams(s.datagrams));
                Outcome::Done
            }
            Ok(_) => Outcome::WouldBlock,
            Err(e) if e.is_would_block() => Outcome::WouldBlock,
            Err(_) => {
                self.send_errors.fetch_add(1, Relaxed);
                Outcome::Done
            }
        }
    }

    /// Sends the rest of a split train, if any; true when nothing is left.
    fn drain_pending(&self, pending: &mut Pending) -> bool {
        loop {
            let r = match pending.transmit() {
                None => return true,
                Some(t) => self.state.send_on(&self.io, std::slice::from_ref(&t)),
            };
            match r {
                Ok(s) if s.transmits == 1 => {
                    pending.clear();
                    return true;
                }
                Ok(s) if s.datagrams > 0 => {
                    let seg = pending
                        .segment_size
                        .unwrap_or(pending.contents.len())
                        .max(1);
                    let cut = (s.datagrams * seg).min(pending.contents.len());
                    pending.contents.drain(..cut);
                }
                Ok(_) => return false,
                Err(e) if e.is_would_block() => return false,
                Err(_) => {
                    self.send_errors.fetch_add(1, Relaxed);
                    pending.clear();
                    return true;
                }
            }
        }
    }
}

/// Registers a [`crate::Socket`] (made non-blocking here) with tokio's
/// reactor, keeping its state: a socket from [`crate::Socket::from_std`]
/// or one of a [`crate::ReuseportGroup`]. Call it inside a tokio runtime.
impl TryFrom<crate::Socket> for Socket {
    type Error = Error;

    fn try_from(socket: crate::Socket) -> Result<Self, Error> {
        let (sock, state) = socket.into_parts();
        sock.set_nonblocking(true)?;
        #[cfg(feature = "uring")]
        let state = state.without_uring("quinn");
        Ok(Socket {
            io: tokio::net::UdpSocket::from_std(sock)?,
            state,
            pending: Mutex::new(Pending::default()),
            send_errors: AtomicU64::new(0),
        })
    }
}

/// fastudp's calls on quinn's socket: `stats()`, `state()`, pacing and
/// the error queue ([`UdpIo::recv_error`]). Its `send` and `recv` go
/// around quinn: datagrams received here never reach quinn.
impl UdpIo for Socket {
    fn state(&self) -> &UdpState {
        &self.state
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

/// Waits for writability with tokio's `writable()`, which wakes every
/// waiting task (several connections share one socket).
struct Poller {
    socket: Arc<Socket>,
    fut: Option<Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>>,
}

impl fmt::Debug for Poller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl quinn::UdpPoller for Poller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let fut = this.fut.get_or_insert_with(|| {
            let s = this.socket.clone();
            Box::pin(async move { s.io.writable().await })
        });
        let r = fut.as_mut().poll(cx);
        if r.is_ready() {
            this.fut = None;
        }
        r
    }
}

impl quinn::AsyncUdpSocket for Socket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        Box::pin(Poller {
            socket: self,
            fut: None,
        })
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> io::Result<()> {
        let mut t = Transmit::new(transmit.destination, transmit.contents)
            .with_ecn(transmit.ecn.map(from_quinn_ecn))
            .with_src_ip(transmit.src_ip);
        t.segment_size = transmit
            .segment_size
            .filter(|&s| s < transmit.contents.len());
        self.io.try_io(Interest::WRITABLE, || {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if !self.drain_pending(&mut pending) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            match self.send_one(&t, &mut pending) {
                Outcome::Done => Ok(()),
                Outcome::WouldBlock => Err(io::ErrorKind::WouldBlock.into()),
            }
        })
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let cap = bufs.len().min(meta.len()).min(RECV_BATCH);
        let mut ours = [RecvMeta::default(); RECV_BATCH];
        loop {
            ready!(self.io.poll_recv_ready(cx))?;
            // A full batch each call, as quinn's own socket asks: quinn's
            // work per call (its driver, a wake-up per connection) costs
            // more than the failed last try of a `recvmmsg`, so the
            // one-message rule of `RecvBatch` does not pay here
            // (docs/BENCHMARKS.md).
            let want = cap;
            let r = self.io.try_io(Interest::READABLE, || {
                self.state
                    .recv_slices_on(&self.io, &mut bufs[..want], &mut ours[..want])
                    .map_err(io::Error::from)
            });
            match r {
                Ok(got) => {
                    for (q, m) in meta.iter_mut().zip(&ours[..got]) {
                        q.addr = m.source;
                        q.len = m.len;
                        q.stride = m.stride;
                        q.ecn = m.ecn.map(to_quinn_ecn);
                        q.dst_ip = m.destination;
                    }
                    return Poll::Ready(Ok(got));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        !self
            .state
            .capabilities()
            .supports(crate::Feature::DontFragment)
    }
}
