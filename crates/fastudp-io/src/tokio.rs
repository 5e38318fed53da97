//! fastudp on tokio's reactor (feature `tokio`).
//!
//! [`UdpSocket`] is a `tokio::net::UdpSocket` with its [`UdpState`]: the
//! same batched sends and receives, GSO, GRO, ECN, fallbacks and counters
//! as [`crate::Socket`], as `async` calls.
//!
//! Its inherent `async fn`s `send`, `recv` and `recv_error` wait on the
//! reactor. It also implements [`UdpIo`], for [`crate::Coalescer`],
//! [`crate::ZeroCopySender`] and the calls that do not wait
//! (`stats()`, `state()`, pacing); the trait's `send`, `recv` and
//! `recv_error`, which the `async` ones shadow, are reached as
//! `UdpIo::send(&socket, ..)`: one non-blocking attempt that leaves
//! tokio's readiness alone.
//!
//! Readiness is exact: each call tries the socket, and only a `WouldBlock`
//! from the kernel clears tokio's readiness and waits for the next edge.
//! Any other error is returned at once, never retried in a loop; nothing
//! spins. An ICMP error for an earlier send is read into the socket's error
//! queue on an unconnected socket ([`UdpSocket::recv_error`]), and returned
//! by the next call on a connected one (such as `ConnectionRefused` when
//! the peer went away).
//!
//! A complete program: a receiver with room for the burst, a sender, ten
//! GSO trains of ten datagrams out, every datagram in.
//!
//! ```
//! use fastudp_io::tokio::UdpSocket;
//! use fastudp_io::{Config, RecvBatch, Transmit, UdpIo};
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), fastudp_io::Error> {
//!     let addr = "127.0.0.1:0".parse().unwrap();
//!     let rx = UdpSocket::bind(addr, Config::default().recv_buffer(4 << 20))?;
//!     let tx = UdpSocket::bind(addr, Config::default())?;
//!     let to = rx.as_tokio().local_addr()?;
//!     let payload = vec![7u8; 10 * 1200];
//!     let trains: Vec<Transmit<'_>> = (0..10)
//!         .map(|_| Transmit::train(to, &payload, 1200))
//!         .collect();
//!     // Waits whenever the socket is full, and resumes a train the kernel
//!     // took only part of; returns the datagrams sent.
//!     assert_eq!(tx.send_all(&trains).await?, 100);
//!     let mut batch = RecvBatch::new(32);
//!     let mut received = 0;
//!     while received < 100 {
//!         rx.recv(&mut batch).await?; // waits for data
//!         for (meta, datagram) in batch.datagrams() {
//!             assert_eq!((meta.source, datagram.len()), (tx.as_tokio().local_addr()?, 1200));
//!             received += 1;
//!         }
//!     }
//!     println!("{:?}", tx.stats()); // a `UdpIo` call: counters, fallbacks
//!     Ok(())
//! }
//! ```
//!
//! `send` returns what went out as soon as the kernel took something;
//! `send_all` waits whenever the socket is full; `recv` waits for data; `flush` empties a [`crate::Coalescer`]; `recv_error`
//! waits for the next ICMP error (with the destination that refused, or the
//! path MTU) or zerocopy completion. `recv` also wakes on `EPOLLERR`: a
//! connected socket whose peer went away returns `ConnectionRefused`; an
//! unconnected one reads the ICMP error into its queue and goes on
//! waiting. A longer program is `examples/tokio_gso.rs`
//! (`cargo run -p fastudp-io --features tokio --example tokio_gso`).

use crate::socket::{Config, RecvBatch, Sent, Transmit, UdpIo, UdpState};
use crate::{Coalescer, Error, SocketError};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::task::Poll;
use tokio::io::Interest;

/// A UDP socket on tokio's reactor, with fastudp's batched core.
///
/// Create it inside a tokio runtime (it registers with the reactor).
#[derive(Debug)]
pub struct UdpSocket {
    io: tokio::net::UdpSocket,
    state: UdpState,
    /// Woken when a send or receive read an ICMP error into the queue, for
    /// [`UdpSocket::recv_error`].
    queued: tokio::sync::Notify,
}

/// Runs `op` on the socket when tokio says it is ready for `interest`,
/// until it does not return `WouldBlock`. Only a `WouldBlock` clears
/// readiness (inside `try_io`); other outcomes, errors included, are
/// returned as they are.
async fn when_ready<R>(
    io: &tokio::net::UdpSocket,
    interest: Interest,
    mut op: impl FnMut() -> Result<R, Error>,
) -> Result<R, Error> {
    loop {
        let ready = io.ready(interest).await?;
        // `try_io` takes one interest (a combined one never matches): the
        // one that is ready, so that a `WouldBlock` clears exactly it.
        let one = if interest.is_readable() && (ready.is_readable() || ready.is_read_closed()) {
            Interest::READABLE
        } else if interest.is_writable() && (ready.is_writable() || ready.is_write_closed()) {
            Interest::WRITABLE
        } else if interest.is_error() && ready.is_error() {
            Interest::ERROR
        } else {
            continue;
        };
        let r = io.try_io(one, || match op() {
            Err(e) if e.is_would_block() => Err(io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        match r {
            Ok(outcome) => return outcome,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Error::from(e)),
        }
    }
}

impl UdpSocket {
    /// Binds a socket at `addr` and sets it up with `config`
    /// (`Config::default()` for the defaults). Call it inside a tokio
    /// runtime. To start from a standard socket, make a
    /// [`crate::Socket`] of it and convert that (`UdpSocket::try_from`).
    pub fn bind(addr: SocketAddr, config: Config) -> Result<Self, Error> {
        Self::try_from(crate::Socket::bind(addr, config)?)
    }

    /// Runs `op` when the socket is ready for `interest` (see
    /// [`when_ready`]), and wakes [`UdpSocket::recv_error`] if `op` read
    /// an ICMP error into the queue.
    async fn io<R>(
        &self,
        interest: Interest,
        mut op: impl FnMut() -> Result<R, Error>,
    ) -> Result<R, Error> {
        let errors = self.state.async_error_count();
        let r = when_ready(&self.io, interest, &mut op).await;
        if self.state.async_error_count() != errors {
            self.queued.notify_waiters();
        }
        r
    }

    /// Sends transmits, waiting until the socket takes at least part of
    /// them, and returns exactly what went out (as [`UdpIo::send`]).
    /// Resume the rest with [`Transmit::skip_datagrams`], or use
    /// [`UdpSocket::send_all`].
    pub async fn send(&self, transmits: &[Transmit<'_>]) -> Result<Sent, Error> {
        self.io(Interest::WRITABLE, || {
            self.state.send_on(&self.io, transmits)
        })
        .await
    }

    /// Sends every transmit, waiting whenever the socket is full. Returns
    /// the number of datagrams sent: datagrams a full local queue dropped
    /// (see [`UdpIo::send`]) are done, not in that number, and counted
    /// in [`crate::Stats::dropped_locally`]. On an error, the transmits before the
    /// one that failed went out, and the error names it (its index in
    /// `transmits`).
    pub async fn send_all(&self, transmits: &[Transmit<'_>]) -> Result<usize, Error> {
        let (mut k, mut skip, mut datagrams) = (0, 0, 0);
        while k < transmits.len() {
            if skip > 0 {
                // The rest of a split train, alone.
                let rest = transmits[k].skip_datagrams(skip);
                let sent = self.send(&[rest]).await.map_err(|e| e.at(k))?;
                if sent.transmits == 1 {
                    datagrams += rest.segments() - sent.dropped_locally;
                    (k, skip) = (k + 1, 0);
                } else {
                    datagrams += sent.datagrams - sent.dropped_locally;
                    skip += sent.datagrams;
                }
            } else {
                let sent = self.send(&transmits[k..]).await.map_err(|e| e.at(k))?;
                datagrams += sent.datagrams_done(&transmits[k..]) - sent.dropped_locally;
                k += sent.transmits;
                skip = sent.datagrams;
            }
        }
        Ok(datagrams)
    }

    /// Receives a batch of messages into `batch`, waiting until at least
    /// one is there (as [`UdpIo::recv`]). It also wakes on an ICMP
    /// error: a connected socket returns it (`ConnectionRefused` when the
    /// peer went away); an unconnected one reads it into the error queue
    /// and goes on waiting.
    pub async fn recv(&self, batch: &mut RecvBatch) -> Result<usize, Error> {
        self.io(Interest::READABLE | Interest::ERROR, || {
            self.state.recv_on(&self.io, batch)
        })
        .await
    }

    /// Sends everything `coalescer` has queued, waiting whenever the socket
    /// is full. Returns the number of datagrams sent. Errors are those of
    /// [`Coalescer::flush`].
    pub async fn flush(&self, coalescer: &mut Coalescer) -> Result<usize, Error> {
        let mut total = 0;
        while !coalescer.is_empty() {
            total += self
                .io(Interest::WRITABLE, || coalescer.flush(self))
                .await?;
        }
        Ok(total)
    }

    /// Waits for the next error-queue message: an ICMP error (with the
    /// destination that refused, or the path MTU), a departure-time drop,
    /// or a zerocopy completion (see [`UdpIo::recv_error`]).
    pub async fn recv_error(&self) -> Result<SocketError, Error> {
        loop {
            // Armed before the queue is looked at, so that an error a
            // concurrent receive reads in between still wakes this task.
            let mut queued = std::pin::pin!(self.queued.notified());
            queued.as_mut().enable();
            if let Some(e) = self.state.recv_error_on(&self.io)? {
                return Ok(e);
            }
            let mut ready = std::pin::pin!(self.io.ready(Interest::ERROR));
            // Whichever comes first: error readiness, or a wake-up from a
            // send or receive that read an error into the queue.
            let woke = std::future::poll_fn(|cx| {
                if queued.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                ready.as_mut().poll(cx).map(Some)
            })
            .await;
            if let Some(r) = woke {
                r?;
                let got = self.io.try_io(Interest::ERROR, || {
                    self.state
                        .recv_error_on(&self.io)
                        .map_err(io::Error::from)?
                        .ok_or_else(|| io::Error::from(io::ErrorKind::WouldBlock))
                });
                match got {
                    Ok(e) => return Ok(e),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(Error::from(e)),
                }
            }
        }
    }

    /// The tokio socket underneath, for what fastudp does not wrap (its
    /// local address, connecting, readiness).
    pub fn as_tokio(&self) -> &tokio::net::UdpSocket {
        &self.io
    }
}

/// The socket's state: its methods that need no descriptor
/// ([`UdpState::capabilities`], [`UdpState::max_gso_segments_to`], ...) are
/// called on the socket directly.
impl std::ops::Deref for UdpSocket {
    type Target = UdpState;

    fn deref(&self) -> &UdpState {
        &self.state
    }
}

/// Registers a [`crate::Socket`] (made non-blocking here) with tokio's
/// reactor, keeping its state: a socket from [`crate::Socket::from_std`]
/// or one of a [`crate::ReuseportGroup`]. Call it inside a tokio runtime.
impl TryFrom<crate::Socket> for UdpSocket {
    type Error = Error;

    fn try_from(socket: crate::Socket) -> Result<Self, Error> {
        let (sock, state) = socket.into_parts();
        sock.set_nonblocking(true)?;
        #[cfg(feature = "uring")]
        let state = state.without_uring("tokio");
        Ok(UdpSocket {
            io: tokio::net::UdpSocket::from_std(sock)?,
            state,
            queued: tokio::sync::Notify::new(),
        })
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

impl UdpIo for UdpSocket {
    fn state(&self) -> &UdpState {
        &self.state
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}
