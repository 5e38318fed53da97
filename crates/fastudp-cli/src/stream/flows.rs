//! `stream-rx`'s accounting: per flow, only for the flow ids the run
//! expects (`0 .. --flows`, the ids `fastudp stream` numbers its flows
//! with). Anything else is counted as foreign, in constant memory, so that
//! forged headers can neither grow the receiver nor spoil its report.

use super::{HDR, MAGIC};
use crate::engine::seq::{Arrival, SeqWindow};
use std::collections::HashMap;
use std::time::Duration;

/// Gap histogram buckets: powers of two of µs, up to about 1 s.
pub const BUCKETS: usize = 21;

/// Datagrams closer than this count as back to back.
const BACK_TO_BACK_NS: u64 = 20_000;

/// Sequence numbers a flow may arrive out of order by and still be told
/// apart as reordered or duplicate (a flow sends at most a train of
/// `--max-burst` segments at a time).
const FLOW_WINDOW: usize = 256;

/// What one receiving thread saw of one flow.
#[derive(Debug, Clone)]
struct FlowSeen {
    /// Payload bytes of the flow's distinct datagrams.
    bytes: u64,
    seq: SeqWindow,
    last_ns: u64,
    run: u64,
    max_run: u64,
}

/// What one receiving thread saw.
#[derive(Debug)]
pub struct RxOut {
    /// Flow ids from 0 up to this one (excluded) are tracked.
    limit: u32,
    flows: HashMap<u32, FlowSeen>,
    /// Datagrams counted for no flow: without the stream header, with a
    /// flow id out of range, or with an implausible sequence number.
    foreign: u64,
    /// Of those, datagrams with the header and a flow id out of range.
    out_of_range: u64,
    gaps: [u64; BUCKETS],
    modes: [u64; 4],
    /// Receive calls.
    pub calls: u64,
    /// The thread's CPU time.
    pub cpu: Duration,
    /// The first and last arrival of a flow's datagram (monotonic ns).
    first_ns: u64,
    last_ns: u64,
}

impl RxOut {
    /// Nothing seen yet; flows `0 .. limit` are tracked.
    pub fn new(limit: u32) -> Self {
        RxOut {
            limit,
            flows: HashMap::new(),
            foreign: 0,
            out_of_range: 0,
            gaps: [0; BUCKETS],
            modes: [0; 4],
            calls: 0,
            cpu: Duration::ZERO,
            first_ns: u64::MAX,
            last_ns: 0,
        }
    }

    /// Records one datagram that arrived at `now` (monotonic ns); true if
    /// it counted for a flow.
    pub fn datagram(&mut self, d: &[u8], now: u64) -> bool {
        if d.len() < HDR || &d[13..HDR] != MAGIC {
            self.foreign += 1;
            return false;
        }
        let flow = u32::from_be_bytes(d[..4].try_into().expect("4 bytes"));
        if flow >= self.limit {
            self.foreign += 1;
            self.out_of_range += 1;
            return false;
        }
        let seq = u64::from_le_bytes(d[4..12].try_into().expect("8 bytes"));
        let f = self.flows.entry(flow).or_insert_with(|| FlowSeen {
            bytes: 0,
            seq: SeqWindow::new(FLOW_WINDOW),
            last_ns: 0,
            run: 0,
            max_run: 0,
        });
        let first = f.seq.received == 0;
        match f.seq.record(seq) {
            Arrival::New | Arrival::Reordered => {}
            // Counted by the window; no new data for the flow.
            Arrival::Duplicate | Arrival::Late => return true,
            Arrival::Implausible => {
                self.foreign += 1;
                return false;
            }
        }
        // A byte that names no mode counts as unknown (0), never as one.
        let mode = if (1..=3).contains(&d[12]) { d[12] } else { 0 };
        self.modes[usize::from(mode)] += 1;
        if first {
            f.run = 1;
        } else {
            let gap = now.saturating_sub(f.last_ns);
            let b = ((gap / 1000).max(1) as f64).log2() as usize;
            self.gaps[b.min(BUCKETS - 1)] += 1;
            if gap < BACK_TO_BACK_NS {
                f.run += 1;
            } else {
                f.run = 1;
            }
        }
        f.max_run = f.max_run.max(f.run);
        f.last_ns = now;
        f.bytes += d.len() as u64;
        self.first_ns = self.first_ns.min(now);
        self.last_ns = now;
        true
    }

    /// Flows with state in this thread.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.flows.len()
    }
}

/// One flow over all threads.
#[derive(Debug, Default, Clone)]
pub struct FlowTotal {
    /// Payload bytes of its distinct datagrams.
    pub bytes: u64,
    /// Its distinct datagrams.
    pub datagrams: u64,
    /// Its sequence numbers that never arrived.
    pub lost: u64,
    /// Its datagrams that arrived twice.
    pub duplicates: u64,
    /// Its datagrams that arrived after a later one (or too late to tell
    /// from a duplicate).
    pub reordered: u64,
    /// Its longest run of datagrams arriving back to back.
    pub max_run: u64,
    /// One past its highest sequence number (to merge with other threads).
    next: u64,
}

/// Every thread's counts together.
#[derive(Debug, Default)]
pub struct Tally {
    /// The tracked flows that sent anything, by id.
    pub flows: HashMap<u32, FlowTotal>,
    /// The gap histogram within flows.
    pub gaps: [u64; BUCKETS],
    /// Datagrams by the pacing mode their header names (the index is the
    /// header byte; 0 for a byte that names none).
    pub modes: [u64; 4],
    /// Datagrams counted for no flow.
    pub foreign: u64,
    /// Of those, the ones with a flow id out of range.
    pub out_of_range: u64,
    /// Receive calls.
    pub calls: u64,
    /// CPU time of the receiving threads.
    pub cpu: Duration,
    /// The first and last arrival of a flow's datagram (monotonic ns;
    /// first > last when none arrived).
    pub first_ns: u64,
    /// See `first_ns`.
    pub last_ns: u64,
}

impl Tally {
    /// Merges the threads' counts.
    pub fn merge(outs: Vec<RxOut>) -> Self {
        let mut t = Tally {
            first_ns: u64::MAX,
            ..Tally::default()
        };
        for o in outs {
            // (A flow whose every datagram was set aside sent nothing.)
            for (id, f) in o.flows.into_iter().filter(|f| f.1.seq.received > 0) {
                let w = &f.seq;
                let mine = FlowTotal {
                    bytes: f.bytes,
                    datagrams: w.received,
                    lost: w.lost(),
                    duplicates: w.duplicates,
                    reordered: w.reordered + w.late,
                    max_run: f.max_run,
                    next: w.next(),
                };
                match t.flows.get_mut(&id) {
                    None => {
                        t.flows.insert(id, mine);
                    }
                    // Steering keeps a flow on one socket. Should it have
                    // moved, each thread saw a part of its numbers: the
                    // loss is what is missing below the highest number.
                    Some(a) => {
                        a.bytes += mine.bytes;
                        a.datagrams += mine.datagrams;
                        a.duplicates += mine.duplicates;
                        a.reordered += mine.reordered;
                        a.max_run = a.max_run.max(mine.max_run);
                        a.next = a.next.max(mine.next);
                        a.lost = a.next.saturating_sub(a.datagrams);
                    }
                }
            }
            for (g, x) in t.gaps.iter_mut().zip(o.gaps) {
                *g += x;
            }
            for (m, x) in t.modes.iter_mut().zip(o.modes) {
                *m += x;
            }
            t.foreign += o.foreign;
            t.out_of_range += o.out_of_range;
            t.calls += o.calls;
            t.cpu += o.cpu;
            t.first_ns = t.first_ns.min(o.first_ns);
            t.last_ns = t.last_ns.max(o.last_ns);
        }
        t
    }

    /// Lost datagrams over the datagrams the flows sent (0 without any).
    pub fn loss(&self) -> f64 {
        let lost: u64 = self.flows.values().map(|f| f.lost).sum();
        let got: u64 = self.flows.values().map(|f| f.datagrams).sum();
        if lost + got > 0 {
            lost as f64 / (lost + got) as f64
        } else {
            0.0
        }
    }
}

/// The `p` quantile of a gap histogram, as the upper bound (µs) of the
/// power-of-two bucket it falls in.
pub fn percentile(hist: &[u64; BUCKETS], p: f64) -> f64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let want = (total as f64 * p).ceil() as u64;
    let mut acc = 0;
    for (i, &c) in hist.iter().enumerate() {
        acc += c;
        if acc >= want {
            return (1u64 << (i + 1)) as f64;
        }
    }
    (1u64 << BUCKETS) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(flow: u32, seq: u64) -> Vec<u8> {
        let mut d = flow.to_be_bytes().to_vec();
        d.extend_from_slice(&seq.to_le_bytes());
        d.push(2);
        d.extend_from_slice(MAGIC);
        d.resize(200, 0);
        d
    }

    /// A small xorshift generator: forged ids and numbers without a
    /// dependency.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn forged_flow_ids_are_foreign_and_keep_no_state() {
        let mut o = RxOut::new(10);
        let mut t = 1_000_000u64;
        for seq in 0..100 {
            for flow in 0..10 {
                t += 100_000;
                assert!(o.datagram(&dgram(flow, seq), t));
            }
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut forged_ids = 0;
        for i in 0..200_000 {
            let flow = rng(&mut s) as u32;
            let seq = rng(&mut s);
            forged_ids += u64::from(flow >= 10);
            o.datagram(&dgram(flow, seq), t + 1_000 * (i + 1));
        }
        assert_eq!(o.tracked(), 10, "no state for an id out of range");
        assert_eq!(o.out_of_range, forged_ids);
        // The few forged ids in range carry numbers far off their flow's:
        // foreign too, and the flows' figures are untouched.
        assert_eq!(o.foreign, 200_000);
        let tally = Tally::merge(vec![o]);
        assert_eq!(tally.loss(), 0.0);
        assert_eq!(tally.flows.len(), 10);
        for f in tally.flows.values() {
            assert_eq!((f.datagrams, f.lost, f.bytes), (100, 0, 100 * 200));
        }
        assert_eq!(tally.last_ns, t, "the time of the flows' last datagram");
    }

    #[test]
    fn a_flow_that_only_sent_forgeries_is_not_a_flow() {
        let mut o = RxOut::new(10);
        assert!(!o.datagram(&dgram(3, 1 << 50), 1));
        assert!(o.datagram(&dgram(4, 0), 1));
        let t = Tally::merge(vec![o]);
        assert_eq!(t.flows.len(), 1);
        assert_eq!(t.foreign, 1);
    }

    #[test]
    fn headerless_datagrams_are_foreign() {
        let mut o = RxOut::new(10);
        assert!(!o.datagram(b"short", 1));
        let mut d = dgram(1, 0);
        d[15] = b'x';
        assert!(!o.datagram(&d, 1));
        assert_eq!((o.foreign, o.out_of_range, o.tracked()), (2, 0, 0));
    }

    #[test]
    fn flow_loss_duplicates_and_reordering() {
        let mut o = RxOut::new(2);
        for seq in [0, 1, 3, 2, 2, 5] {
            o.datagram(&dgram(1, seq), 10);
        }
        let t = Tally::merge(vec![o]);
        let f = &t.flows[&1];
        assert_eq!(
            (f.datagrams, f.lost, f.duplicates, f.reordered),
            (5, 1, 1, 1)
        );
        assert_eq!(t.loss(), 1.0 / 6.0);
        assert_eq!(f.bytes, 5 * 200, "a duplicate adds no bytes");
    }

    #[test]
    fn a_flow_split_over_threads_is_merged() {
        let (mut a, mut b) = (RxOut::new(1), RxOut::new(1));
        for seq in 0..10 {
            if seq % 2 == 0 {
                a.datagram(&dgram(0, seq), 1);
            } else if seq != 9 {
                b.datagram(&dgram(0, seq), 1);
            }
        }
        let t = Tally::merge(vec![a, b]);
        assert_eq!((t.flows[&0].datagrams, t.flows[&0].lost), (9, 0));
    }

    #[test]
    fn an_unknown_mode_byte_counts_for_no_mode() {
        // Found by the stream_header fuzz target: mode byte 7 was counted
        // as mode 3 ("none"), so stream-rx could report pacing "none" for
        // a stream that never said so.
        let crash: &[u8] = &[
            0, 0, 0, 0, 0x2c, 0x07, 0x46, 0x55, 0x73, 0, 0, 0, 0x07, b'F', b'U', b's',
        ];
        let mut o = RxOut::new(17);
        assert!(o.datagram(crash, 1));
        let mut none = dgram(1, 0);
        none[12] = 3;
        assert!(o.datagram(&none, 2));
        assert!(o.datagram(&dgram(2, 0), 3), "mode 2, user");
        let mut zero = dgram(3, 0);
        zero[12] = 0;
        assert!(o.datagram(&zero, 4));
        let t = Tally::merge(vec![o]);
        assert_eq!(t.modes, [2, 0, 1, 1]);
    }

    #[test]
    fn gap_percentiles() {
        let mut h = [0u64; BUCKETS];
        h[0] = 50; // 1 us
        h[10] = 49; // 1024 us
        h[20] = 1;
        assert_eq!(percentile(&h, 0.5), 2.0);
        assert_eq!(percentile(&h, 0.9), 2048.0);
        assert_eq!(percentile(&h, 0.999), (1u64 << 21) as f64);
    }
}
