//! MSG_ZEROCOPY completion notifications and the bookkeeping that keeps a
//! buffer away from the caller until the kernel is done with it.
//!
//! Each successful `MSG_ZEROCOPY` send call gets the next 32-bit id from a
//! per-socket counter. The kernel reports finished calls on the socket's
//! error queue as a `struct sock_extended_err` with origin
//! `SO_EE_ORIGIN_ZEROCOPY` and the inclusive id range `ee_info..=ee_data`;
//! `ee_code` has `SO_EE_CODE_ZEROCOPY_COPIED` when the kernel copied the
//! data after all (as it does for any delivery to a local socket).

use super::cmsg::{CmsgError, Decoder};
use super::consts::{SOL_IP, SOL_IPV6};
use std::collections::VecDeque;

/// `IP_RECVERR`: error-queue message level/type for IPv4.
pub const IP_RECVERR: i32 = 11;
/// `IPV6_RECVERR`: error-queue message type for IPv6.
pub const IPV6_RECVERR: i32 = 25;
/// `SO_EE_ORIGIN_ZEROCOPY`.
pub const ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`.
pub const CODE_COPIED: u8 = 1;
/// `SO_EE_ORIGIN_TXTIME`: a packet dropped for a missed or invalid
/// departure time.
pub const ORIGIN_TXTIME: u8 = 6;

/// One message from the error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrQueueMsg {
    /// Zerocopy sends `lo..=hi` completed; `copied` when the kernel copied.
    Zerocopy {
        /// First completed id.
        lo: u32,
        /// Last completed id (inclusive).
        hi: u32,
        /// The kernel copied the data instead of sending it from the buffer.
        copied: bool,
    },
    /// Something else: an ICMP error, a txtime error, ...
    Other {
        /// `ee_errno`.
        errno: u32,
        /// `ee_origin`.
        origin: u8,
        /// `ee_code`.
        code: u8,
        /// `ee_info`.
        info: u32,
        /// `ee_data`.
        data: u32,
    },
}

/// Parses the control data of one error-queue read.
pub fn parse_errqueue(control: &[u8]) -> Result<Vec<ErrQueueMsg>, CmsgError> {
    let mut out = Vec::new();
    for c in Decoder::new(control) {
        let c = c?;
        let ours = (c.level == SOL_IP && c.ty == IP_RECVERR)
            || (c.level == SOL_IPV6 && c.ty == IPV6_RECVERR);
        if !ours || c.data.len() < 16 {
            continue;
        }
        let u32_at = |o: usize| u32::from_ne_bytes(c.data[o..o + 4].try_into().unwrap_or_default());
        let (errno, origin, code, info, data) =
            (u32_at(0), c.data[4], c.data[6], u32_at(8), u32_at(12));
        out.push(if origin == ORIGIN_ZEROCOPY && errno == 0 {
            ErrQueueMsg::Zerocopy {
                lo: info,
                hi: data,
                copied: code & CODE_COPIED != 0,
            }
        } else {
            ErrQueueMsg::Other {
                errno,
                origin,
                code,
                info,
                data,
            }
        });
    }
    Ok(out)
}

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

    /// Sends in flight (not yet released).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The id the next send will get.
    pub fn next_id(&self) -> u32 {
        self.next_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cmsg::{CmsgBuf, Encoder};
    use proptest::prelude::*;

    fn ee(errno: u32, origin: u8, code: u8, info: u32, data: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&errno.to_ne_bytes());
        v.extend_from_slice(&[origin, 0, code, 0]);
        v.extend_from_slice(&info.to_ne_bytes());
        v.extend_from_slice(&data.to_ne_bytes());
        v.extend_from_slice(&[0; 16]); // offender address
        v
    }

    #[test]
    fn parses_zerocopy_and_other_notifications() {
        let mut b = CmsgBuf::default();
        let mut e = Encoder::new(&mut b.0);
        e.push(SOL_IP, IP_RECVERR, &ee(0, 5, 1, 3, 7)).unwrap();
        e.push(SOL_IPV6, IPV6_RECVERR, &ee(0, 5, 0, 8, 8)).unwrap();
        let n = e.len();
        let mut b2 = CmsgBuf::default();
        let mut e2 = Encoder::new(&mut b2.0);
        e2.push(SOL_IP, IP_RECVERR, &ee(111, 2, 3, 0, 0)).unwrap();
        let n2 = e2.len();
        assert_eq!(
            parse_errqueue(&b.0[..n]).unwrap(),
            vec![
                ErrQueueMsg::Zerocopy {
                    lo: 3,
                    hi: 7,
                    copied: true
                },
                ErrQueueMsg::Zerocopy {
                    lo: 8,
                    hi: 8,
                    copied: false
                }
            ]
        );
        assert!(matches!(
            parse_errqueue(&b2.0[..n2]).unwrap()[0],
            ErrQueueMsg::Other { errno: 111, .. }
        ));
    }

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
