//! A worker's connections by quinn-proto's handle: a vector indexed by
//! the handle, which is the index of quinn-proto's slab of connections
//! (dense, reused as connections end, never chosen by a client).
//!
//! At 50,000 connections a worker, nearly every datagram of an idle
//! connection (a keep-alive) reaches memory that has left the caches
//! since its last one, 15 s earlier. A hash table costs two misses to
//! find the connection's box (the control bytes and the bucket); here it
//! is one, and its address is known before any load, so that the
//! connections of a receive batch can be fetched together
//! ([`Slots::prefetch_slot`], [`prefetch`]) instead of one after another.

pub(crate) use fastudp_sys::sys::prefetch;
use quinn_proto::ConnectionHandle;

/// Values by [`ConnectionHandle`], each in a box of its own (taken out
/// and put back whole).
#[derive(Debug)]
pub(crate) struct Slots<T> {
    v: Vec<Option<Box<T>>>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            v: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slots<T> {
    /// How many are held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `ch`.
    pub(crate) fn get(&self, ch: &ConnectionHandle) -> Option<&T> {
        self.v.get(ch.0).and_then(|s| s.as_deref())
    }

    /// The value of `ch`, to change.
    pub(crate) fn get_mut(&mut self, ch: &ConnectionHandle) -> Option<&mut T> {
        self.v.get_mut(ch.0).and_then(|s| s.as_deref_mut())
    }

    /// Takes the value of `ch` out.
    pub(crate) fn remove(&mut self, ch: &ConnectionHandle) -> Option<Box<T>> {
        let taken = self.v.get_mut(ch.0)?.take();
        if taken.is_some() {
            self.len -= 1;
        }
        taken
    }

    /// Puts `value` in as `ch`'s; returns the one it replaces.
    pub(crate) fn insert(&mut self, ch: ConnectionHandle, value: Box<T>) -> Option<Box<T>> {
        if ch.0 >= self.v.len() {
            self.v.resize_with(ch.0 + 1, || None);
        }
        let old = self.v[ch.0].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The handles held, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = ConnectionHandle> + '_ {
        self.v
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| ConnectionHandle(i))
    }

    /// The values held.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.v.iter().filter_map(|s| s.as_deref())
    }

    /// The values held, to change.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.v.iter_mut().filter_map(|s| s.as_deref_mut())
    }

    /// The handles and values held, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (ConnectionHandle, &mut T)> {
        self.v
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| Some((ConnectionHandle(i), s.as_deref_mut()?)))
    }

    /// Takes every value out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (ConnectionHandle, Box<T>)> {
        self.len = 0;
        std::mem::take(&mut self.v)
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| Some((ConnectionHandle(i), s?)))
    }

    /// Gives back the memory of empty slots at the end, and of the
    /// vector once it is mostly unused.
    pub(crate) fn shrink(&mut self) {
        while self.v.last().is_some_and(|s| s.is_none()) {
            self.v.pop();
        }
        if self.v.capacity() > 4 * self.v.len() + 64 {
            self.v.shrink_to_fit();
        }
    }

    /// Asks the processor for `ch`'s slot (a pointer), without waiting
    /// for it.
    pub(crate) fn prefetch_slot(&self, ch: &ConnectionHandle) {
        if let Some(s) = self.v.get(ch.0) {
            prefetch(s);
        }
    }

    /// Asks the processor for every cache line of `ch`'s value, without
    /// waiting for them (a load of its slot: see
    /// [`Slots::prefetch_slot`]).
    pub(crate) fn prefetch_value(&self, ch: &ConnectionHandle) {
        if let Some(v) = self.get(ch) {
            // One more line: the box need not start on a line.
            prefetch_lines(v, std::mem::size_of::<T>().div_ceil(64) + 1);
        }
    }
}

/// Asks for the first `lines` cache lines from `p` ([`prefetch`]).
#[inline]
pub(crate) fn prefetch_lines<T>(p: *const T, lines: usize) {
    let b = p.cast::<u8>();
    for i in 0..lines {
        prefetch(b.wrapping_add(i * 64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(i: usize) -> ConnectionHandle {
        ConnectionHandle(i)
    }

    #[test]
    fn slots_hold_take_and_shrink() {
        let mut s = Slots::default();
        assert!(s.is_empty());
        assert!(s.insert(ch(3), Box::new(30)).is_none());
        assert!(s.insert(ch(0), Box::new(0)).is_none());
        assert_eq!(s.insert(ch(3), Box::new(33)).as_deref(), Some(&30));
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(&ch(3)), Some(&33));
        assert_eq!(s.get(&ch(1)), None);
        assert_eq!(s.get(&ch(1000)), None);
        *s.get_mut(&ch(0)).unwrap() += 1;
        assert_eq!(s.keys().collect::<Vec<_>>(), vec![ch(0), ch(3)]);
        assert_eq!(s.values().copied().collect::<Vec<_>>(), vec![1, 33]);
        for v in s.values_mut() {
            *v *= 2;
        }
        let pairs: Vec<_> = s.iter_mut().map(|(c, v)| (c, *v)).collect();
        assert_eq!(pairs, vec![(ch(0), 2), (ch(3), 66)]);
        assert_eq!(s.remove(&ch(3)).as_deref(), Some(&66));
        assert_eq!(s.remove(&ch(3)), None);
        assert_eq!(s.remove(&ch(99)), None);
        assert_eq!(s.len(), 1);
        s.shrink();
        assert_eq!(s.v.len(), 1, "the empty slots at the end are gone");
        for i in 0..1000 {
            s.insert(ch(i), Box::new(i));
        }
        for i in 1..1000 {
            s.remove(&ch(i));
        }
        s.prefetch_slot(&ch(0));
        s.prefetch_value(&ch(0));
        s.prefetch_value(&ch(5000));
        s.shrink();
        assert!(s.v.capacity() <= 64 + 4, "{}", s.v.capacity());
        let all: Vec<_> = s.drain().map(|(c, v)| (c, *v)).collect();
        assert_eq!(all, vec![(ch(0), 0)]);
        assert!(s.is_empty());
        assert_eq!(s.get(&ch(0)), None);
    }
}
