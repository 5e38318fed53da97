//! Pacing: when each flow's next packet or GSO train may leave.
//!
//! A [`Pacer`] gives every train an earliest departure time (EDT) from a
//! rate and an interval: in each interval a flow may send at most
//! `rate x interval` bytes, as one GSO train of at most `max_burst`
//! segments, and the next train departs once the previous one's bytes have
//! drained at the rate. Batching and pacing pull against each other (all
//! segments of one GSO send share one departure time); the interval is the
//! knob between them, as in the paper's Figure 4.
//!
//! The pacer is pure: it takes the current time as an argument and never
//! sleeps, so it is tested against a model without a clock. Who honours the
//! departure time is a separate choice, [`PacingMode`].

use std::time::Duration;

/// Why a pacer cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacingError {
    /// A rate of zero bytes per second.
    #[error("the pacing rate must be more than 0 bytes per second")]
    ZeroRate,
    /// An interval of zero.
    #[error("the pacing interval must be more than 0")]
    ZeroInterval,
    /// A burst of zero segments.
    #[error("the burst must be at least 1 segment")]
    ZeroBurst,
}

/// One paced train: when it may leave and how many segments it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departure {
    /// Earliest departure time, in ns on the caller's clock.
    pub at_ns: u64,
    /// Segments in the train (1 = a single datagram).
    pub segments: usize,
}

/// A per-flow pacer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pacer {
    rate: u64,
    interval_ns: u64,
    max_burst: usize,
    next_ns: Option<u64>,
}

impl Pacer {
    /// A pacer for `rate` bytes per second, sending at most one train per
    /// `interval` of at most `max_burst` segments.
    pub fn new(rate: u64, interval: Duration, max_burst: usize) -> Result<Self, PacingError> {
        if rate == 0 {
            return Err(PacingError::ZeroRate);
        }
        let interval_ns = interval.as_nanos().min(u64::MAX as u128) as u64;
        if interval_ns == 0 {
            return Err(PacingError::ZeroInterval);
        }
        if max_burst == 0 {
            return Err(PacingError::ZeroBurst);
        }
        Ok(Pacer {
            rate,
            interval_ns,
            max_burst,
            next_ns: None,
        })
    }

    /// The rate in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Bytes the flow may send in one interval.
    pub fn budget(&self) -> u64 {
        ((self.rate as u128 * self.interval_ns as u128) / 1_000_000_000) as u64
    }

    /// How many `seg`-byte segments the next train may hold: what one
    /// interval's budget allows, at least 1, at most `max_burst` and
    /// `pending`.
    pub fn train_segments(&self, seg: usize, pending: usize) -> usize {
        let by_budget = (self.budget() / seg.max(1) as u64).max(1) as usize;
        by_budget.min(self.max_burst).min(pending).max(1)
    }

    /// Plans the next train of `pending` datagrams of `seg` bytes at time
    /// `now_ns`. It departs at `now_ns` or when the previous train has
    /// drained at the rate, whichever is later; a flow that was idle (or
    /// late) does not save up credit for a bigger burst.
    pub fn next(&mut self, now_ns: u64, seg: usize, pending: usize) -> Departure {
        let segments = self.train_segments(seg, pending);
        let at_ns = self.next_ns.map_or(now_ns, |n| n.max(now_ns));
        let bytes = (segments * seg.max(1)) as u128;
        let drain = (bytes * 1_000_000_000).div_ceil(self.rate as u128) as u64;
        self.next_ns = Some(at_ns.saturating_add(drain));
        Departure { at_ns, segments }
    }

    /// When the flow may send again, if it has sent before.
    pub fn next_departure(&self) -> Option<u64> {
        self.next_ns
    }
}

/// Who enforces departure times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacingMode {
    /// The kernel: SO_TXTIME with an EDT-aware qdisc (fq or etf).
    Kernel,
    /// fastudp, in user space: a send waits until its departure time.
    User,
    /// No pacing: everything leaves at once.
    None,
}

impl std::fmt::Display for PacingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PacingMode::Kernel => "kernel",
            PacingMode::User => "user",
            PacingMode::None => "none",
        })
    }
}

/// Chooses the mode for a wish, from whether the socket accepts SO_TXTIME
/// and the egress qdisc's kind, and says why in one sentence.
pub fn choose_mode(
    wanted: PacingMode,
    txtime_accepted: bool,
    qdisc: Option<&str>,
) -> (PacingMode, String) {
    let edt_qdisc = matches!(qdisc, Some("fq") | Some("etf"));
    match wanted {
        PacingMode::None => (PacingMode::None, "pacing is off".into()),
        PacingMode::User => (PacingMode::User, "pacing in user space, as asked".into()),
        PacingMode::Kernel if txtime_accepted && edt_qdisc => (
            PacingMode::Kernel,
            format!("the {} qdisc honours SO_TXTIME", qdisc.unwrap_or_default()),
        ),
        PacingMode::Kernel if !txtime_accepted => (
            PacingMode::User,
            "SO_TXTIME is not accepted here: pacing in user space instead".into(),
        ),
        PacingMode::Kernel => (
            PacingMode::User,
            format!(
                "the egress qdisc ({}) ignores SO_TXTIME: pacing in user space instead",
                qdisc.unwrap_or("unknown")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn bad_settings_are_errors() {
        assert_eq!(
            Pacer::new(0, Duration::from_millis(1), 1),
            Err(PacingError::ZeroRate)
        );
        assert_eq!(
            Pacer::new(1, Duration::ZERO, 1),
            Err(PacingError::ZeroInterval)
        );
        assert_eq!(
            Pacer::new(1, Duration::from_millis(1), 0),
            Err(PacingError::ZeroBurst)
        );
    }

    #[test]
    fn one_megabyte_per_second_in_8ms_trains() {
        // 1 MB/s, 8 ms: 8000 bytes per interval: 6 x 1200-byte segments.
        let mut p = Pacer::new(1_000_000, Duration::from_millis(8), 64).unwrap();
        assert_eq!(p.budget(), 8000);
        let d = p.next(0, 1200, 1000);
        assert_eq!(
            d,
            Departure {
                at_ns: 0,
                segments: 6
            }
        );
        // 7200 bytes drain in 7.2 ms.
        let d = p.next(MS, 1200, 1000);
        assert_eq!(
            d,
            Departure {
                at_ns: 7_200_000,
                segments: 6
            }
        );
        // Asked late: departs now, with no saved-up credit.
        let d = p.next(50 * MS, 1200, 1000);
        assert_eq!(
            d,
            Departure {
                at_ns: 50 * MS,
                segments: 6
            }
        );
    }

    #[test]
    fn small_budget_still_sends_one_datagram() {
        let mut p = Pacer::new(100_000, Duration::from_millis(1), 64).unwrap();
        assert_eq!(p.budget(), 100);
        let a = p.next(0, 1200, 10);
        let b = p.next(0, 1200, 10);
        assert_eq!(a.segments, 1);
        assert_eq!(b.at_ns, 12 * MS, "1200 bytes at 100 kB/s take 12 ms");
    }

    #[test]
    fn burst_and_pending_cap_the_train() {
        let mut p = Pacer::new(1_000_000_000, Duration::from_millis(8), 16).unwrap();
        assert_eq!(p.next(0, 1200, 1000).segments, 16);
        assert_eq!(p.next(0, 1200, 3).segments, 3);
    }

    #[test]
    fn modes() {
        assert_eq!(
            choose_mode(PacingMode::Kernel, true, Some("fq")).0,
            PacingMode::Kernel
        );
        assert_eq!(
            choose_mode(PacingMode::Kernel, true, Some("etf")).0,
            PacingMode::Kernel
        );
        let (m, why) = choose_mode(PacingMode::Kernel, true, Some("noqueue"));
        assert_eq!(m, PacingMode::User);
        assert!(why.contains("noqueue"), "{why}");
        assert_eq!(
            choose_mode(PacingMode::Kernel, false, Some("fq")).0,
            PacingMode::User
        );
        assert_eq!(
            choose_mode(PacingMode::None, true, Some("fq")).0,
            PacingMode::None
        );
    }

    proptest! {
        /// Against the model: a flow that always has data sends at most one
        /// interval's budget (or one datagram) per train, departures never go
        /// back in time, and over any run its bytes never exceed
        /// rate x elapsed plus one train.
        #[test]
        fn departures_follow_the_rate(
            rate in 10_000u64..10_000_000_000,
            interval_ms in 1u64..16,
            burst in 1usize..128,
            seg in 1usize..1473,
            asks in proptest::collection::vec(0u64..5_000_000, 1..200),
        ) {
            let mut p = Pacer::new(rate, Duration::from_millis(interval_ms), burst).unwrap();
            let budget = p.budget();
            let mut now = 0u64;
            let mut last_at = 0u64;
            let mut first_at = None;
            let mut sent: u128 = 0;
            for gap in asks {
                now += gap;
                let d = p.next(now, seg, usize::MAX);
                prop_assert!(d.segments >= 1 && d.segments <= burst);
                prop_assert!(d.segments == 1 || (d.segments * seg) as u64 <= budget);
                prop_assert!(d.at_ns >= now && d.at_ns >= last_at);
                let first = *first_at.get_or_insert(d.at_ns);
                let bytes = (d.segments * seg) as u128;
                // Everything before this train has drained by its departure.
                prop_assert!(sent * 1_000_000_000 <= (d.at_ns - first) as u128 * rate as u128 + 1_000_000_000);
                sent += bytes;
                last_at = d.at_ns;
            }
        }
    }
}
