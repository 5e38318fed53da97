//! How a connection is woken from outside the engine's events: a list of
//! connections to drive again, and an eventfd that the worker's wait
//! watches, written only while the worker sleeps (so a wake from the
//! worker's own thread, or from another while it is busy, costs a lock
//! and no system call).

use quinn_proto::ConnectionHandle;
use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// One worker's wakes: the connections to drive again and the eventfd
/// that ends its wait.
#[derive(Debug)]
pub(crate) struct WorkerWake {
    list: Mutex<Vec<ConnectionHandle>>,
    /// The worker is in (or about to enter) its wait: a wake writes the
    /// eventfd.
    parked: AtomicBool,
    /// `None` when the kernel refused an eventfd: wakes are then seen at
    /// the next packet or timer, within the wait's cap (counted in
    /// `signals_lost`).
    fd: Option<OwnedFd>,
    /// Writes of the eventfd (wakes that ended a wait, or would have).
    signals: AtomicU64,
}

impl Default for WorkerWake {
    fn default() -> Self {
        WorkerWake::new()
    }
}

impl WorkerWake {
    /// A worker's wakes with a non-blocking eventfd.
    pub(crate) fn new() -> Self {
        WorkerWake {
            list: Mutex::default(),
            parked: AtomicBool::new(false),
            fd: eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).ok(),
            signals: AtomicU64::new(0),
        }
    }

    /// Has `ch` driven again in the worker's next turn, waking the worker
    /// if it waits.
    pub(crate) fn push(&self, ch: ConnectionHandle) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(ch);
        self.notify();
    }

    /// Ends the worker's wait, if it waits.
    pub(crate) fn notify(&self) {
        if self.parked.swap(false, SeqCst) {
            self.signals.fetch_add(1, SeqCst);
            if let Some(fd) = &self.fd {
                // A full counter (2^64 - 2 unread writes) cannot happen:
                // the worker reads it after each wait.
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }

    /// Takes the connections to drive.
    pub(crate) fn take(&self) -> Vec<ConnectionHandle> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether no connection waits to be driven.
    pub(crate) fn is_empty(&self) -> bool {
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The worker is about to wait: from now on a wake writes the eventfd.
    /// False (and not parked) when a wake is already pending.
    pub(crate) fn park(&self) -> bool {
        self.parked.store(true, SeqCst);
        if self.is_empty() {
            return true;
        }
        self.parked.store(false, SeqCst);
        false
    }

    /// The wait ended; `signalled`: the eventfd was readable, and is read
    /// back to zero.
    pub(crate) fn unpark(&self, signalled: bool) {
        self.parked.store(false, SeqCst);
        if signalled {
            if let Some(fd) = &self.fd {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(fd, &mut b);
            }
        }
    }

    /// The eventfd the worker's wait watches, if there is one.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Wakes that wrote the eventfd so far.
    #[allow(dead_code)]
    pub(crate) fn signals(&self) -> u64 {
        self.signals.load(SeqCst)
    }
}

/// A worker's wakes, shared with the wakers of its connections.
pub(crate) type Wakes = Arc<WorkerWake>;

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags};

    #[test]
    fn a_wake_writes_the_eventfd_only_while_parked() {
        let w = WorkerWake::new();
        let ch = ConnectionHandle(3);
        w.push(ch);
        assert_eq!(w.signals(), 0, "not parked: no system call");
        assert!(!w.park(), "a pending wake refuses to park");
        assert_eq!(w.take(), vec![ch]);
        assert!(w.park());
        let w = Arc::new(w);
        let w2 = w.clone();
        let t = std::thread::spawn(move || w2.push(ConnectionHandle(7)));
        let fd = w.fd().expect("an eventfd");
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let ts = rustix::event::Timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        let n = poll(&mut fds, Some(&ts)).unwrap();
        assert_eq!(n, 1, "the wait ends with the wake, not at its timeout");
        w.unpark(true);
        t.join().unwrap();
        assert_eq!(w.signals(), 1);
        assert_eq!(w.take(), vec![ConnectionHandle(7)]);
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        assert_eq!(poll(&mut fds, Some(&zero)).unwrap(), 0, "read back");
    }
}
