//! MSG_ZEROCOPY bookkeeping that keeps a buffer away from the caller until
//! the kernel is done with it.
//!
//! Each successful `MSG_ZEROCOPY` send call gets the next 32-bit id from a
//! per-socket counter. The kernel reports finished calls on the socket's
//! error queue as a `struct sock_extended_err` with origin
//! `SO_EE_ORIGIN_ZEROCOPY` and the inclusive id range `ee_info..=ee_data`;
//! `ee_code` has `SO_EE_CODE_ZEROCOPY_COPIED` when the kernel copied the
//! data after all (as it does for any delivery to a local socket).

use std::collections::VecDeque;

/// Holds items (buffers) in send order until their zerocopy id completes,
/// and releases them strictly in order, only once complete.
#[derive(Debug)]
pub struct CompletionTracker<T> {
    next_id: u32,
    front_id: u32,
    pending: VecDeque<(T, bool)>,
}

impl<T> Default for CompletionTracker<T> {
    fn default() -> Self {
        CompletionTracker {
            next_id: 0,
            front_id: 0,
            pending: VecDeque::new(),
        }
    }
}

impl<T> CompletionTracker<T> {
    /// An empty tracker whose first send gets id 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a successful zerocopy send of `item`; returns its id.
    pub fn push(&mut self, item: T) -> u32 {
        if self.pending.is_empty() {
            self.front_id = self.next_id;
        }
        let id = self.next_id;
        self.pending.push_back((item, false));
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// Marks ids `lo..=hi` complete (wrapping). Ids not in flight are
    /// ignored. Returns how many in-flight ids it marked.
    pub fn complete(&mut self, lo: u32, hi: u32) -> usize {
        // Offsets from the oldest id in flight, read as signed 32-bit
        // distances so that ranges across the wrap (or partly released
        // already) clip correctly.
        let first = lo.wrapping_sub(self.front_id) as i32 as i64;
        let last = first + hi.wrapping_sub(lo) as i64;
        let from = first.max(0);
        let to = last.min(self.pending.len() as i64 - 1);
        let mut marked = 0;
        for idx in from..=to {
            let slot = &mut self.pending[idx as usize].1;
            if !*slot {
                *slot = true;
                marked += 1;
            }
        }
        marked
    }

    /// Takes the next item whose send and every earlier one completed.
    pub fn pop_done(&mut self) -> Option<T> {
        match self.pending.front() {
            Some((_, true)) => {
                self.front_id = self.front_id.wrapping_add(1);
                self.pending.pop_front().map(|(t, _)| t)
            }
            _ => None,
        }
    }

    /// Takes back the id of the last send recorded, if it has not
    /// completed: for a send that failed before the kernel took an id, so
    /// that the next send gets it again. Returns its item; `None` when it
    /// completed (the kernel did take the id) or nothing is in flight.
    pub fn unpush(&mut self) -> Option<T> {
        match self.pending.back() {
            Some((_, false)) => {
                self.next_id = self.next_id.wrapping_sub(1);
                self.pending.pop_back().map(|(t, _)| t)
            }
            _ => None,
        }
    }

    /// Puts `item` in the slot of the last send recorded, if it is still
    /// in flight (a send recorded before its buffer could be handed over);
    /// gives it back otherwise (the slot was released already).
    pub fn set_last(&mut self, item: T) -> Result<(), T> {
        match self.pending.back_mut() {
            Some(slot) => {
                slot.0 = item;
                Ok(())
            }
            None => Err(item),
        }
    }

    /// Sends in flight (not yet released).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The id the next send will get.
    #[cfg(any(test, feature = "tools"))]
    pub fn next_id(&self) -> u32 {
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn releases_only_completed_and_in_order() {
        let mut t = CompletionTracker::new();
        for i in 0..5 {
            assert_eq!(t.push(i), i as u32);
        }
        assert_eq!(t.pop_done(), None, "nothing before its completion");
        t.complete(1, 2);
        assert_eq!(t.pop_done(), None, "id 0 is still in flight");
        t.complete(0, 0);
        assert_eq!(
            (t.pop_done(), t.pop_done(), t.pop_done(), t.pop_done()),
            (Some(0), Some(1), Some(2), None)
        );
        t.complete(3, 10); // beyond what is in flight: ignored past 4
        assert_eq!(
            (t.pop_done(), t.pop_done(), t.pop_done()),
            (Some(3), Some(4), None)
        );
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_buffer_handed_over_late_comes_back_in_send_order() {
        let mut t = CompletionTracker::new();
        t.push(Some(1u8));
        // A send recorded without its buffer (the local queue dropped it),
        // completed at once while id 0 is still in flight.
        t.push(None);
        t.complete(1, 1);
        assert_eq!(t.unpush(), None, "a completed id is not taken back");
        assert_eq!(t.set_last(Some(2)), Ok(()));
        assert_eq!(t.pop_done(), None, "id 0 first");
        t.complete(0, 0);
        assert_eq!((t.pop_done(), t.pop_done()), (Some(Some(1)), Some(Some(2))));
        // Everything released: the buffer is handed back to the caller.
        assert_eq!(t.set_last(Some(3)), Err(Some(3)));
    }

    #[test]
    fn an_unused_id_is_taken_back_and_a_used_one_kept() {
        let mut t = CompletionTracker::new();
        assert_eq!(t.unpush(), None::<u8>);
        assert_eq!(t.push(1u8), 0);
        assert_eq!(t.push(2), 1);
        // The failed send's id was not taken: the next send gets it.
        assert_eq!(t.unpush(), Some(2));
        assert_eq!(t.next_id(), 1);
        assert_eq!(t.push(3), 1);
        t.complete(0, 1);
        assert_eq!(t.pop_done(), Some(1));
        assert_eq!(t.pop_done(), Some(3));
        // A completed id stays (its completion was the kernel's word).
        assert_eq!(t.push(4), 2);
        t.complete(2, 2);
        assert_eq!(t.unpush(), None);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.next_id(), 3);
    }

    #[test]
    fn ids_wrap() {
        let mut t = CompletionTracker::<u8> {
            next_id: u32::MAX - 1,
            front_id: 0,
            pending: VecDeque::new(),
        };
        assert_eq!(t.push(1), u32::MAX - 1);
        assert_eq!(t.push(2), u32::MAX);
        assert_eq!(t.push(3), 0);
        t.complete(u32::MAX, 0);
        assert_eq!(t.pop_done(), None);
        t.complete(u32::MAX - 1, u32::MAX - 1);
        assert_eq!(
            (t.pop_done(), t.pop_done(), t.pop_done()),
            (Some(1), Some(2), Some(3))
        );
    }

    proptest! {
        /// Whatever order completions arrive in, an item is never released
        /// before its own id completed, and all are released, in order,
        /// once every id completed.
        #[test]
        fn never_released_before_completion(
            n in 1usize..60,
            ranges in proptest::collection::vec((0u32..70, 0u32..5), 0..80),
        ) {
            let mut t = CompletionTracker::new();
            for i in 0..n { t.push(i); }
            let mut done = vec![false; n];
            let mut released = Vec::new();
            for (lo, len) in ranges {
                t.complete(lo, lo + len);
                for id in lo..=lo + len { if (id as usize) < n { done[id as usize] = true; } }
                while let Some(i) = t.pop_done() {
                    prop_assert!(done[i], "item {} released before its completion", i);
                    released.push(i);
                }
            }
            t.complete(0, n as u32 - 1);
            while let Some(i) = t.pop_done() { released.push(i); }
            prop_assert_eq!(released, (0..n).collect::<Vec<_>>());
        }
    }
}
