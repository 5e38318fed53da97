//! The bounded queue between workers: a datagram that reached a worker
//! other than its connection's owner is copied into a fixed ring of
//! preallocated slots in the owner's inbox. Nothing is allocated per
//! datagram; a full ring drops the datagram, and the caller counts it.
//!
//! Each worker owns two rings of [`SLOTS`] slots of [`SLOT`] bytes: the
//! inbox that other workers fill (behind a mutex), and the one it works
//! through. When the one it works through is empty, it swaps the two
//! under the lock, so the lock is held for a copy-in or a pointer swap,
//! never while quinn-proto handles a datagram. A worker's forwarding
//! memory is therefore `2 * SLOTS * SLOT` bytes, whatever arrives.

use fastudp_io::EcnCodepoint;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

/// Bytes of one slot: the largest datagram forwarded (QUIC packets of
/// the paths here are at most 1,500 bytes; larger ones are dropped and
/// counted like a full ring).
pub const SLOT: usize = 2048;
/// Slots of one ring.
pub const SLOTS: usize = 512;

/// What came with a forwarded datagram.
#[derive(Clone, Copy)]
pub struct Meta {
    /// The client's address.
    pub source: SocketAddr,
    /// The local address it was sent to.
    pub destination: Option<IpAddr>,
    /// Its ECN marks.
    pub ecn: Option<EcnCodepoint>,
    len: u16,
}

/// A fixed ring of datagrams.
pub struct Ring {
    data: Box<[u8]>,
    meta: Box<[Option<Meta>]>,
    head: usize,
    len: usize,
}

impl Ring {
    /// A ring of `slots` slots, allocated once.
    pub fn new(slots: usize) -> Self {
        Ring {
            data: vec![0u8; slots * SLOT].into_boxed_slice(),
            meta: vec![None; slots].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Datagrams held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `d` in; false (and nothing copied) when the ring is full or
    /// `d` is longer than a slot.
    pub fn push(
        &mut self,
        source: SocketAddr,
        destination: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        d: &[u8],
    ) -> bool {
        let slots = self.meta.len();
        if self.len == slots || d.len() > SLOT {
            return false;
        }
        let at = (self.head + self.len) % slots;
        self.data[at * SLOT..at * SLOT + d.len()].copy_from_slice(d);
        self.meta[at] = Some(Meta {
            source,
            destination,
            ecn,
            len: d.len() as u16,
        });
        self.len += 1;
        true
    }

    /// The oldest datagram, taken out (its bytes stay valid until the next
    /// push).
    pub fn pop(&mut self) -> Option<(Meta, &[u8])> {
        if self.len == 0 {
            return None;
        }
        let at = self.head;
        self.head = (self.head + 1) % self.meta.len();
        self.len -= 1;
        let m = self.meta[at].take()?;
        Some((m, &self.data[at * SLOT..at * SLOT + usize::from(m.len)]))
    }
}

/// A worker's inbox: the ring other workers copy into.
pub struct Inbox {
    ring: Mutex<Ring>,
}

impl Inbox {
    /// An inbox of `slots` slots.
    pub fn new(slots: usize) -> Self {
        Inbox {
            ring: Mutex::new(Ring::new(slots)),
        }
    }

    /// Copies a datagram in; false when it is full (the caller counts the
    /// drop).
    pub fn push(
        &self,
        source: SocketAddr,
        destination: Option<IpAddr>,
        ecn: Option<EcnCodepoint>,
        d: &[u8],
    ) -> bool {
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        r.push(source, destination, ecn, d)
    }

    /// Swaps the inbox's ring with `local` when `local` is empty and the
    /// inbox is not: the owner then works through what arrived without
    /// the lock.
    pub fn take_into(&self, local: &mut Ring) {
        if !local.is_empty() {
            return;
        }
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if !r.is_empty() {
            std::mem::swap(&mut *r, local);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    #[test]
    fn a_full_ring_refuses_and_keeps_order() {
        let mut r = Ring::new(3);
        for i in 0..3u8 {
            assert!(r.push(addr(), None, None, &[i; 5]));
        }
        assert!(!r.push(addr(), None, None, &[9]), "full");
        assert_eq!(r.pop().unwrap().1, &[0; 5]);
        assert!(r.push(addr(), None, None, &[3, 3]));
        for want in [&[1u8; 5][..], &[2; 5], &[3, 3]] {
            assert_eq!(r.pop().unwrap().1, want);
        }
        assert!(r.pop().is_none());
        assert!(!r.push(addr(), None, None, &vec![0; SLOT + 1]), "too long");
        assert!(r.push(addr(), None, None, &vec![7; SLOT]));
        assert_eq!(r.pop().unwrap().1.len(), SLOT);
    }

    #[test]
    fn the_inbox_swaps_only_into_an_empty_ring() {
        let inbox = Inbox::new(4);
        let mut local = Ring::new(4);
        assert!(inbox.push(addr(), None, None, b"a"));
        inbox.take_into(&mut local);
        assert_eq!(local.len(), 1);
        assert!(inbox.push(addr(), None, None, b"b"));
        inbox.take_into(&mut local);
        assert_eq!(local.len(), 1, "not swapped while the local ring holds one");
        assert_eq!(local.pop().unwrap().1, b"a");
        inbox.take_into(&mut local);
        assert_eq!(local.pop().unwrap().1, b"b");
    }
}
