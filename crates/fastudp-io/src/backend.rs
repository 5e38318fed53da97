//! The seam between a socket's state and a backend that moves its
//! datagrams instead of the syscall path (today: io_uring, feature
//! `uring`).
//!
//! This module sits below `socket`: the state holds a
//! `Box<dyn RingBackend>` and calls it through the trait, and the backend
//! reaches back into the state only through [`Host`]. Neither names the
//! other's module, so the state never imports the backend. Which backend a
//! socket gets is chosen by its `Config` (`Config::uring` puts the
//! backend's [`BackendChoice`] there), never by the environment.

// Elsewhere than Linux no backend exists (io_uring is the only one), so
// nothing implements or calls the trait there.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use crate::error::{Error, FallbackEvent, Feature};
use crate::sys::{InMeta, SendMsg};
use std::any::Any;
use std::io;
use std::os::fd::BorrowedFd;
use std::panic::{RefUnwindSafe, UnwindSafe};

/// Builds message `i` of a batch in the control buffer it is given.
pub(crate) type Fill<'f, 'a> = dyn FnMut(usize, &mut [u8]) -> Result<SendMsg<'a>, Error> + 'f;

/// Takes received message `i`: its raw metadata, control data and payload.
pub(crate) type Deliver<'f> = dyn FnMut(usize, InMeta, &[u8], &[u8]) + 'f;

/// What a backend needs from the state it serves.
pub(crate) trait Host {
    /// Records a fallback event in the socket's stats.
    fn record(&self, feature: Feature, errno: Option<i32>, reason: String);
    /// Counts `messages` received outside the syscall path.
    fn count_recv(&self, messages: usize);
    /// Reads a queued ICMP error that failed a call into the state's
    /// error queue; true when the call should be retried.
    fn absorb_async_error(&self, fd: BorrowedFd<'_>, e: &io::Error) -> bool;
}

/// A backend the state sends and receives through, when it has one. Each
/// call returns `None` when the backend cannot do it (now or any more):
/// the state then uses the syscall path.
pub(crate) trait RingBackend:
    std::fmt::Debug + Send + Sync + UnwindSafe + RefUnwindSafe
{
    /// Whether `fd` is the socket the backend was set up for.
    fn for_fd(&self, fd: BorrowedFd<'_>) -> bool;

    /// Sends one batch of `n` messages built by `fill`, as
    /// `sys::send_batch`; bit `i` of `holes` is set when message `i`
    /// failed while a later one went out.
    #[allow(clippy::too_many_arguments)]
    fn send_batch<'a>(
        &self,
        host: &dyn Host,
        fd: BorrowedFd<'_>,
        n: usize,
        dontwait: bool,
        holes: &mut u128,
        fill: &mut Fill<'_, 'a>,
    ) -> Option<Result<io::Result<usize>, Error>>;

    /// How many of a batch's `n` transmits go in one submission, given the
    /// largest datagram of each (`size(i)`).
    fn cut_after_growth(&self, n: usize, size: &dyn Fn(usize) -> usize) -> usize;

    /// Remembers the largest datagram sent so far.
    fn note_sent_size(&self, size: usize);

    /// Counts a hole of a batch: resent (`filled`), or dropped.
    fn note_hole(&self, filled: bool);

    /// Receives up to `max` messages: message `i` goes to
    /// `f(i, meta, control, payload)`, its payload cut to `room(i)` bytes
    /// (and `meta` flagged truncated when it was longer). Waits as the
    /// socket says.
    fn recv(
        &self,
        host: &dyn Host,
        fd: BorrowedFd<'_>,
        max: usize,
        room: &dyn Fn(usize) -> usize,
        f: &mut Deliver<'_>,
    ) -> Option<Result<usize, Error>>;

    /// Waits until a received message is ready for the next receive, or
    /// `timeout` passes; true when one is. `None` when the backend's
    /// receive is not armed (or off): the caller then polls the socket,
    /// where the datagrams still are.
    fn wait_readable(&self, timeout: std::time::Duration) -> Option<io::Result<bool>>;

    /// The backend itself, for the module that implements it.
    fn as_any(&self) -> &dyn Any;

    /// The backend itself, mutably, for the module that implements it.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// What the state knows when it opens a backend.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingParams {
    /// GRO is on: each received message may be a whole train.
    pub gro: bool,
    /// Provided receive buffers asked for (0: sized by the backend).
    pub recv_buffers: u16,
    /// Submit sends unlinked.
    pub unlinked: bool,
}

/// Opens a backend for a socket, or says why it cannot be used.
pub(crate) type Open =
    for<'f> fn(BorrowedFd<'f>, &RingParams) -> Result<Box<dyn RingBackend>, FallbackEvent>;

/// A backend a `Config` asks for: its name and how to open it.
#[derive(Clone, Copy)]
pub(crate) struct BackendChoice {
    /// The backend's name, as `Config`'s `Debug` shows it.
    pub name: &'static str,
    /// Opens it for one socket.
    pub open: Open,
}

impl std::fmt::Debug for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}
