//! Sequence numbers: each datagram from `fastudp tx` and `fastudp bench`
//! carries its number in its first 8 bytes (little-endian), counting from
//! 0 per sending socket. [`SeqWindow`] follows one numbering with a
//! sliding window, at any count; [`Verifier`] keeps one window per sender.

use serde::Serialize;
use std::collections::HashMap;
use std::net::SocketAddr;

/// A number this far or further ahead of the highest one so far is taken
/// for foreign data, not for a jump over lost datagrams: a sender at 10
/// million datagrams a second would have to lose everything for 30 hours.
pub const MAX_JUMP: u64 = 1 << 40;

/// Window of `rx -v` and the bench receivers, in sequence numbers: a
/// datagram up to this far behind the highest one is still told apart as
/// reordered or duplicate (8 KiB per sender).
pub const SENDER_WINDOW: usize = 1 << 16;

/// Senders `rx -v` tracks; datagrams from any further ones are counted
/// as untracked (memory stays under [`SENDER_WINDOW`] / 8 bytes times this).
pub const MAX_SENDERS: usize = 256;

/// What one sequence number turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The highest so far (possibly past a gap).
    New,
    /// Inside the window, behind the highest, for the first time.
    Reordered,
    /// Inside the window, seen before.
    Duplicate,
    /// Behind the window: a duplicate or a very late datagram, which
    /// cannot be told apart any more (if it was new, it has been counted
    /// as lost). Never counted as received.
    Late,
    /// [`MAX_JUMP`] or more ahead: not this sender's numbering.
    Implausible,
}

/// One numbering (one sender, or one flow), followed through a window of
/// a fixed number of sequence numbers behind the highest one seen.
///
/// Numbers start at 0. A number inside the window is new, reordered or a
/// duplicate; one behind it is late; a gap becomes loss once the window
/// has passed it, or at the end. Memory is the window's bitmap, whatever
/// the count.
#[derive(Debug, Clone)]
pub struct SeqWindow {
    /// Bit `n % window` is set when number `n`, inside the window, arrived.
    bits: Box<[u64]>,
    /// The window size minus 1 (a power of two minus 1).
    mask: u64,
    /// One past the highest number seen: the window is
    /// `next - window .. next` (from 0 at first).
    next: u64,
    /// Distinct numbers that arrived (new or reordered).
    pub received: u64,
    /// Numbers the window passed without them arriving.
    lost_behind: u64,
    /// Arrivals of a number inside the window that was there already.
    pub duplicates: u64,
    /// Distinct numbers that arrived after a higher one.
    pub reordered: u64,
    /// Arrivals behind the window.
    pub late: u64,
    /// Arrivals [`MAX_JUMP`] or more ahead, set aside.
    pub implausible: u64,
}

impl SeqWindow {
    /// A window of `size` sequence numbers: a power of two, at least 64.
    pub fn new(size: usize) -> Self {
        assert!(
            size.is_power_of_two() && size >= 64,
            "window of {size}: a power of two of at least 64"
        );
        SeqWindow {
            bits: vec![0u64; size / 64].into_boxed_slice(),
            mask: size as u64 - 1,
            next: 0,
            received: 0,
            lost_behind: 0,
            duplicates: 0,
            reordered: 0,
            late: 0,
            implausible: 0,
        }
    }

    fn size(&self) -> u64 {
        self.mask + 1
    }

    fn bit(&self, n: u64) -> bool {
        let i = n & self.mask;
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, n: u64) {
        let i = n & self.mask;
        self.bits[(i / 64) as usize] |= 1 << (i % 64);
    }

    fn clear(&mut self, n: u64) {
        let i = n & self.mask;
        self.bits[(i / 64) as usize] &= !(1 << (i % 64));
    }

    fn arrived_in_window(&self) -> u64 {
        self.bits.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Records the arrival of number `seq`.
    pub fn record(&mut self, seq: u64) -> Arrival {
        let size = self.size();
        if seq >= self.next {
            let ahead = seq - self.next;
            // (u64::MAX itself would leave no room for the window's end.)
            if ahead >= MAX_JUMP || seq == u64::MAX {
                self.implausible += 1;
                return Arrival::Implausible;
            }
            if ahead >= size {
                // The whole window leaves, and so do the numbers jumped
                // over that never even entered it.
                let held = self.next.min(size);
                self.lost_behind += held - self.arrived_in_window();
                self.lost_behind += seq + 1 - size - self.next;
                self.bits.iter_mut().for_each(|w| *w = 0);
            } else {
                // Each step forward reuses the slot of the number that
                // leaves the window behind.
                for k in self.next..=seq {
                    if k >= size && !self.bit(k) {
                        self.lost_behind += 1;
                    }
                    self.clear(k);
                }
            }
            self.set(seq);
            self.next = seq + 1;
            self.received += 1;
            return Arrival::New;
        }
        if self.next - seq > size {
            self.late += 1;
            return Arrival::Late;
        }
        if self.bit(seq) {
            self.duplicates += 1;
            return Arrival::Duplicate;
        }
        self.set(seq);
        self.received += 1;
        self.reordered += 1;
        Arrival::Reordered
    }

    /// Numbers below the highest one seen that have not arrived: those the
    /// window passed, and the gaps still inside it.
    pub fn lost(&self) -> u64 {
        self.lost_behind + self.next.min(self.size()) - self.arrived_in_window()
    }

    /// One past the highest number seen (0 before the first).
    pub fn next(&self) -> u64 {
        self.next
    }

    /// A window whose numbering is taken to be at `n` already, every
    /// number before it received: for tests at counts that would take too
    /// long to feed.
    #[cfg(test)]
    fn at(size: usize, n: u64) -> Self {
        let mut w = SeqWindow::new(size);
        w.next = n;
        w.received = n;
        w.bits.iter_mut().for_each(|b| *b = u64::MAX);
        w
    }
}

/// The sequence number in a datagram's first 8 bytes, if it has them.
pub fn read_seq(d: &[u8]) -> Option<u64> {
    d.get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Sequence-number bookkeeping for `rx -v` and the bench receivers: one
/// [`SeqWindow`] per sender (source address and port), for up to
/// [`MAX_SENDERS`] senders.
#[derive(Debug)]
pub struct Verifier {
    senders: Vec<(SocketAddr, SeqWindow)>,
    index: HashMap<SocketAddr, usize>,
    /// The sender of the previous datagram: most come in runs.
    last: usize,
    /// Datagrams shorter than 8 bytes.
    pub short: u64,
    /// Datagrams from senders past [`MAX_SENDERS`], not tracked.
    pub untracked: u64,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier {
            senders: Vec::new(),
            index: HashMap::new(),
            last: usize::MAX,
            short: 0,
            untracked: 0,
        }
    }
}

/// The totals over every tracked sender.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Distinct sequence numbers that arrived.
    pub received: u64,
    /// Sequence numbers that never arrived.
    pub lost: u64,
    /// Datagrams seen twice.
    pub duplicates: u64,
    /// Datagrams that arrived after a later one.
    pub reordered: u64,
    /// Datagrams that arrived too far behind to tell (see [`Arrival::Late`]).
    pub late: u64,
    /// Datagrams without a plausible sequence number: too short, or
    /// [`MAX_JUMP`] ahead.
    pub unsequenced: u64,
}

/// One sender's counts, for the `rx -v` summary.
#[derive(Debug, Clone, Serialize)]
pub struct SenderCounts {
    /// Its address and port.
    pub source: String,
    /// Distinct sequence numbers that arrived.
    pub received: u64,
    /// Sequence numbers that never arrived.
    pub lost: u64,
    /// Datagrams seen twice.
    pub duplicates: u64,
    /// Datagrams that arrived after a later one.
    pub reordered: u64,
    /// Datagrams too far behind to tell (see [`Arrival::Late`]).
    pub late: u64,
    /// Datagrams with a number [`MAX_JUMP`] or more ahead.
    pub unsequenced: u64,
}

impl Verifier {
    /// Each tracked sender's counts, in the order they were first heard.
    pub fn per_sender(&self) -> Vec<SenderCounts> {
        self.senders()
            .map(|(a, w)| SenderCounts {
                source: a.to_string(),
                received: w.received,
                lost: w.lost(),
                duplicates: w.duplicates,
                reordered: w.reordered,
                late: w.late,
                unsequenced: w.implausible,
            })
            .collect()
    }

    /// Records one datagram from `from`.
    pub fn datagram(&mut self, from: SocketAddr, d: &[u8]) {
        let Some(seq) = read_seq(d) else {
            self.short += 1;
            return;
        };
        if let Some(w) = self.window(from) {
            w.record(seq);
        } else {
            self.untracked += 1;
        }
    }

    /// The window of sender `from`, made on its first datagram; `None`
    /// past [`MAX_SENDERS`].
    fn window(&mut self, from: SocketAddr) -> Option<&mut SeqWindow> {
        if self.senders.get(self.last).map(|s| s.0) != Some(from) {
            self.last = match self.index.get(&from) {
                Some(&i) => i,
                None if self.senders.len() < MAX_SENDERS => {
                    self.index.insert(from, self.senders.len());
                    self.senders.push((from, SeqWindow::new(SENDER_WINDOW)));
                    self.senders.len() - 1
                }
                None => return None,
            };
        }
        Some(&mut self.senders[self.last].1)
    }

    /// Each tracked sender and its window, in the order they were first heard.
    pub fn senders(&self) -> impl Iterator<Item = (SocketAddr, &SeqWindow)> {
        self.senders.iter().map(|(a, w)| (*a, w))
    }

    /// The sums over all senders.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            unsequenced: self.short,
            ..Totals::default()
        };
        for (_, w) in &self.senders {
            t.received += w.received;
            t.lost += w.lost();
            t.duplicates += w.duplicates;
            t.reordered += w.reordered;
            t.late += w.late;
            t.unsequenced += w.implausible;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(seq: u64) -> Vec<u8> {
        let mut v = seq.to_le_bytes().to_vec();
        v.extend_from_slice(&[0; 100]);
        v
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn verifier_counts_loss_duplicates_and_reordering() {
        let mut v = Verifier::default();
        for s in [0, 1, 2, 4, 3, 3, 7] {
            v.datagram(addr(1), &d(s));
        }
        v.datagram(addr(1), b"x");
        v.datagram(addr(1), &u64::MAX.to_le_bytes());
        let t = v.totals();
        assert_eq!(t.lost, 2); // 5 and 6
        assert_eq!(t.received, 6);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.reordered, 1);
        assert_eq!(t.unsequenced, 2);
        assert_eq!(Verifier::default().totals(), Totals::default());
    }

    #[test]
    fn two_senders_are_two_numberings() {
        // Both count from 0, interleaved: no duplicates, and each one's
        // own gap is its loss.
        let mut v = Verifier::default();
        for s in 0..1000u64 {
            if s != 500 {
                v.datagram(addr(1), &d(s));
            }
            if s != 10 && s != 20 {
                v.datagram(addr(2), &d(s));
            }
        }
        let t = v.totals();
        assert_eq!(t.duplicates, 0);
        assert_eq!(t.reordered, 0);
        assert_eq!(t.lost, 3);
        assert_eq!(t.received, 1997);
        let per: Vec<u64> = v.senders().map(|(_, w)| w.lost()).collect();
        assert_eq!(per, vec![1, 2]);
    }

    #[test]
    fn senders_past_the_limit_are_counted_not_tracked() {
        let mut v = Verifier::default();
        for p in 0..(MAX_SENDERS as u16 + 10) {
            v.datagram(addr(1000 + p), &d(0));
            v.datagram(addr(1000 + p), &d(1));
        }
        assert_eq!(v.senders().count(), MAX_SENDERS);
        assert_eq!(v.untracked, 20);
        assert_eq!(v.totals().received, 2 * MAX_SENDERS as u64);
    }

    #[test]
    fn gaps_become_loss_as_the_window_passes_them() {
        let mut w = SeqWindow::new(64);
        for s in (0..200).filter(|s| s % 10 != 0) {
            assert_eq!(w.record(s), Arrival::New);
        }
        assert_eq!(w.lost(), 20);
        // Inside the window: reordered, then a duplicate.
        assert_eq!(w.record(190), Arrival::Reordered);
        assert_eq!(w.record(190), Arrival::Duplicate);
        assert_eq!(w.lost(), 19);
        // Behind it: late, never received, and the loss stays.
        assert_eq!(w.record(100), Arrival::Late);
        assert_eq!(w.record(5), Arrival::Late);
        assert_eq!(w.lost(), 19);
        assert_eq!(w.received, 181);
        // A jump past the whole window: the gap and the window's holes.
        assert_eq!(w.record(1000), Arrival::New);
        assert_eq!(w.lost(), 19 + (1000 - 200));
        assert_eq!(w.record(1000 + MAX_JUMP + 1), Arrival::Implausible);
        assert_eq!(w.next, 1001);
    }

    #[test]
    fn a_run_past_2_to_the_28_counts_every_loss() {
        // Every datagram of a run past 2^28 is fed (no shortcut): every
        // 1000th is lost, a few are repeated and reordered near the
        // boundary, and none is taken for foreign.
        let end = (1u64 << 28) + 5_000;
        let mut w = SeqWindow::new(SENDER_WINDOW);
        let mut lost = 0;
        for s in 0..end {
            if s % 1000 == 999 {
                lost += 1;
                continue;
            }
            w.record(s);
        }
        let near = (1u64 << 28) + 7;
        assert_eq!(w.record(near), Arrival::Duplicate);
        assert_eq!(w.lost(), lost);
        assert_eq!(w.received, end - lost);
        assert_eq!(w.implausible + w.late + w.reordered, 0);
        // One lost near the boundary arrives late after all, inside the window.
        let missing = (1u64 << 28) + 999 - (1 << 28) % 1000;
        assert_eq!(w.record(missing), Arrival::Reordered);
        assert_eq!(w.lost(), lost - 1);
    }

    #[test]
    fn numbers_near_2_to_the_40_and_beyond() {
        for start in [1u64 << 40, (1 << 63) - 5, u64::MAX - 10_000_000] {
            let mut w = SeqWindow::at(SENDER_WINDOW, start);
            for s in start..start + 100_000 {
                if s % 7 != 0 {
                    assert_eq!(w.record(s), Arrival::New, "{s}");
                }
            }
            for s in (start + 99_990..start + 100_000).rev() {
                w.record(s);
            }
            let sevens = (start..start + 99_990).filter(|s| s % 7 == 0).count() as u64;
            assert_eq!(w.lost(), sevens, "{start}");
            assert_eq!(w.received, start + 100_000 - sevens);
            assert_eq!(w.late + w.implausible, 0);
        }
    }
}
