//! The soak's bookkeeping, free of sockets and clocks: the datagram
//! format (a sequence number and a checksum), the ledger of one slot's
//! arrivals, fault windows and the loss they explain, the send pacer and
//! the memory trend.

use std::time::Duration;

/// Bytes of a datagram's sequence number (at its start).
const SEQ_LEN: usize = 8;
/// Bytes of a datagram's checksum (at its end).
const SUM_LEN: usize = 8;
/// The smallest datagram that carries both.
pub const MIN_PAYLOAD: usize = SEQ_LEN + SUM_LEN;

/// FNV-1a (64 bits) of `b`.
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Writes datagram number `seq` into `d` (at least [`MIN_PAYLOAD`] bytes):
/// the number, bytes that depend on it, and a checksum of all of that.
pub fn fill(d: &mut [u8], seq: u64) {
    let n = d.len();
    debug_assert!(n >= MIN_PAYLOAD);
    d[..SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
    let k = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) as u8;
    for (i, b) in d[SEQ_LEN..n - SUM_LEN].iter_mut().enumerate() {
        *b = k.wrapping_add(i as u8);
    }
    let sum = fnv1a(&d[..n - SUM_LEN]);
    d[n - SUM_LEN..].copy_from_slice(&sum.to_le_bytes());
}

/// The sequence number of an intact datagram of `payload` bytes; `None`
/// for a damaged one (wrong length or checksum).
pub fn check(d: &[u8], payload: usize) -> Option<u64> {
    if d.len() != payload || d.len() < MIN_PAYLOAD {
        return None;
    }
    let n = d.len();
    let sum = u64::from_le_bytes(d[n - SUM_LEN..].try_into().expect("8 bytes"));
    if fnv1a(&d[..n - SUM_LEN]) != sum {
        return None;
    }
    Some(u64::from_le_bytes(
        d[..SEQ_LEN].try_into().expect("8 bytes"),
    ))
}

/// What one intact arrival was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// First arrival of a number of this slot.
    New,
    /// A number of this slot that had arrived already.
    Duplicate,
    /// A number from before this slot (a straggler of an earlier one).
    Stale,
    /// A number past what this slot can have sent.
    Beyond,
}

/// The arrivals of one slot: a bit per sequence number from `base`.
#[derive(Debug, Default)]
pub struct Ledger {
    base: u64,
    bits: Vec<u64>,
    /// Distinct numbers that arrived.
    pub received: u64,
    /// Arrivals of a number already seen.
    pub duplicates: u64,
    /// Arrivals from before the slot.
    pub stale: u64,
    /// Arrivals past the slot's capacity.
    pub beyond: u64,
}

impl Ledger {
    /// Starts a slot whose numbers begin at `base`, for at most `cap`
    /// numbers; the memory of the previous slot is reused.
    pub fn reset(&mut self, base: u64, cap: u64) {
        let words = cap.div_ceil(64) as usize;
        self.bits.clear();
        self.bits.resize(words, 0);
        self.base = base;
        self.received = 0;
        self.duplicates = 0;
        self.stale = 0;
        self.beyond = 0;
    }

    /// Records the arrival of `seq`.
    pub fn arrive(&mut self, seq: u64) -> Arrival {
        if seq < self.base {
            self.stale += 1;
            return Arrival::Stale;
        }
        let i = seq - self.base;
        let Some(w) = self.bits.get_mut((i / 64) as usize) else {
            self.beyond += 1;
            return Arrival::Beyond;
        };
        let m = 1u64 << (i % 64);
        if *w & m != 0 {
            self.duplicates += 1;
            return Arrival::Duplicate;
        }
        *w |= m;
        self.received += 1;
        Arrival::New
    }

    /// Whether every number in `base..end` has arrived.
    pub fn complete(&self, end: u64) -> bool {
        end <= self.base || (self.received >= end - self.base && self.missing(end).next().is_none())
    }

    /// The numbers in `base..end` that have not arrived, in order.
    pub fn missing(&self, end: u64) -> impl Iterator<Item = u64> + '_ {
        let n = end.saturating_sub(self.base);
        (0..n)
            .filter(move |&i| {
                self.bits
                    .get((i / 64) as usize)
                    .is_none_or(|w| w & (1 << (i % 64)) == 0)
            })
            .map(move |i| self.base + i)
    }
}

/// The sequence numbers a fault may cost: from a little before it struck
/// (datagrams still in flight) until a while after it healed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First number of the window.
    pub first: u64,
    /// One past the last.
    pub end: u64,
}

/// Loss split between fault windows: `per_window[i]` numbers of
/// `windows[i]` were lost, and `outside` numbers outside every window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attribution {
    /// Lost numbers inside each window (the first window that holds one).
    pub per_window: Vec<u64>,
    /// Lost numbers in no window: a failure of the run.
    pub outside: u64,
    /// The first few lost numbers outside windows, to look for.
    pub outside_examples: Vec<u64>,
}

/// Attributes each lost number to the window that holds it.
pub fn attribute(lost: impl IntoIterator<Item = u64>, windows: &[Window]) -> Attribution {
    let mut a = Attribution {
        per_window: vec![0; windows.len()],
        ..Attribution::default()
    };
    for s in lost {
        match windows.iter().position(|w| w.first <= s && s < w.end) {
            Some(i) => a.per_window[i] += 1,
            None => {
                a.outside += 1;
                if a.outside_examples.len() < 8 {
                    a.outside_examples.push(s);
                }
            }
        }
    }
    a
}

/// A token bucket of datagrams: `rate` per second, at most `burst` saved
/// up, so that a sender held up by a fault resumes at its rate instead of
/// catching up in a burst the path cannot take.
#[derive(Debug, Clone)]
pub struct Pacer {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Duration,
}

impl Pacer {
    /// A bucket that starts full, at time `now` (any monotonic origin).
    pub fn new(rate: f64, burst: usize, now: Duration) -> Self {
        Pacer {
            rate,
            burst: burst as f64,
            tokens: burst as f64,
            last: now,
        }
    }

    /// How long to wait at `now` before `n` datagrams may go (zero: now).
    pub fn wait(&mut self, n: usize, now: Duration) -> Duration {
        let dt = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        let short = n as f64 - self.tokens;
        if short <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(short / self.rate)
        }
    }

    /// Takes `n` datagrams that went out (never below an empty bucket's
    /// debt of one call).
    pub fn take(&mut self, n: usize) {
        self.tokens = (self.tokens - n as f64).max(-self.burst);
    }
}

/// The least-squares slope of `(seconds, kilobytes)` samples, in
/// kilobytes per hour; `None` with fewer than 3 samples or no time spread.
pub fn trend_per_hour(samples: &[(f64, f64)]) -> Option<f64> {
    if samples.len() < 3 {
        return None;
    }
    let n = samples.len() as f64;
    let mx = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|s| (s.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = samples.iter().map(|s| (s.0 - mx) * (s.1 - my)).sum();
    Some(sxy / sxx * 3600.0)
}

/// The growth of a memory series after its warm-up: the median of its
/// last third minus the median of its first third, with the first
/// `warmup` samples left out. `None` with fewer than 3 samples left.
pub fn growth(samples: &[f64], warmup: usize) -> Option<f64> {
    let s = samples.get(warmup..)?;
    if s.len() < 3 {
        return None;
    }
    let third = s.len() / 3;
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    Some(median(&s[s.len() - third..]) - median(&s[..third]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_checks_only_when_intact() {
        let mut d = vec![0u8; 1400];
        fill(&mut d, 123_456_789);
        assert_eq!(check(&d, 1400), Some(123_456_789));
        // Any one flipped bit, anywhere, is found.
        for i in [0, 7, 8, 700, 1391, 1392, 1399] {
            let mut e = d.clone();
            e[i] ^= 0x10;
            assert_eq!(check(&e, 1400), None, "byte {i}");
        }
        // Cut short, or another length than sent.
        assert_eq!(check(&d[..1399], 1400), None);
        assert_eq!(check(&d, 1300), None);
        assert_eq!(check(&d[..10], 10), None);
        // Two numbers give different bodies.
        let mut d2 = vec![0u8; 1400];
        fill(&mut d2, 123_456_790);
        assert_ne!(d[8..1392], d2[8..1392]);
    }

    #[test]
    fn the_ledger_tells_new_duplicate_stale_and_beyond() {
        let mut l = Ledger::default();
        l.reset(1000, 100);
        assert_eq!(l.arrive(1000), Arrival::New);
        assert_eq!(l.arrive(1000), Arrival::Duplicate);
        assert_eq!(l.arrive(999), Arrival::Stale);
        // The capacity rounds up to whole words of 64.
        assert_eq!(l.arrive(1127), Arrival::New);
        assert_eq!(l.arrive(1128), Arrival::Beyond);
        for s in 1001..1010 {
            if s != 1005 {
                l.arrive(s);
            }
        }
        assert_eq!(l.received, 10);
        assert!(!l.complete(1010));
        assert!(l.complete(1005));
        assert_eq!(l.missing(1012).collect::<Vec<_>>(), vec![1005, 1010, 1011]);
        assert_eq!((l.duplicates, l.stale, l.beyond), (1, 1, 1));
        // A reset forgets it all.
        l.reset(5000, 10);
        assert_eq!(l.received, 0);
        assert_eq!(l.arrive(1000), Arrival::Stale);
        assert_eq!(l.missing(5003).count(), 3);
    }

    #[test]
    fn loss_is_attributed_to_windows_or_counted_outside() {
        let w = [
            Window {
                first: 100,
                end: 200,
            },
            Window {
                first: 150,
                end: 400,
            },
        ];
        let a = attribute([5, 100, 150, 199, 200, 399, 400, 1000], &w);
        assert_eq!(a.per_window, vec![3, 2]);
        assert_eq!(a.outside, 3);
        assert_eq!(a.outside_examples, vec![5, 400, 1000]);
        let none = attribute(std::iter::empty(), &w);
        assert_eq!((none.per_window, none.outside), (vec![0, 0], 0));
        assert_eq!(attribute([1], &[]).outside, 1);
    }

    #[test]
    fn the_pacer_keeps_the_rate_and_never_catches_up_in_a_burst() {
        let ms = Duration::from_millis;
        let mut p = Pacer::new(10_000.0, 40, ms(0));
        // A full bucket: 40 at once, then 10 per ms.
        assert_eq!(p.wait(40, ms(0)), Duration::ZERO);
        p.take(40);
        let w = p.wait(20, ms(0));
        assert!((w.as_secs_f64() - 0.002).abs() < 1e-9, "{w:?}");
        assert_eq!(p.wait(20, ms(2)), Duration::ZERO);
        p.take(20);
        // Held up for a second (a fault): only the burst is saved up.
        assert_eq!(p.wait(40, ms(1002)), Duration::ZERO);
        p.take(40);
        assert!(p.wait(1, ms(1002)) > Duration::ZERO);
        // Over a simulated second at 1 ms steps, 10,000 (+ the burst) go.
        let mut p = Pacer::new(10_000.0, 40, ms(0));
        let mut sent = 0;
        for t in 0..1000 {
            while p.wait(20, ms(t)) == Duration::ZERO {
                p.take(20);
                sent += 20;
            }
        }
        assert!((10_000..=10_040).contains(&sent), "{sent}");
    }

    #[test]
    fn the_memory_trend_and_growth() {
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64 * 60.0, 5000.0)).collect();
        assert_eq!(trend_per_hour(&flat), Some(0.0));
        // 1 kB a minute is 60 kB an hour.
        let rising: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64 * 60.0, 5000.0 + i as f64))
            .collect();
        assert!((trend_per_hour(&rising).unwrap() - 60.0).abs() < 1e-9);
        assert_eq!(trend_per_hour(&flat[..2]), None);
        assert_eq!(trend_per_hour(&[(1.0, 1.0); 5]), None);
        // Growth after a warm-up that doubled memory once.
        let s = [
            100.0, 2000.0, 2000.0, 2010.0, 2000.0, 2000.0, 2004.0, 2002.0,
        ];
        assert_eq!(growth(&s, 1), Some(4.0));
        let leak: Vec<f64> = (0..12).map(|i| 1000.0 + 100.0 * i as f64).collect();
        assert!(growth(&leak, 0).unwrap() >= 700.0);
        assert_eq!(growth(&s, 7), None);
        assert_eq!(growth(&s, 9), None);
    }
}
