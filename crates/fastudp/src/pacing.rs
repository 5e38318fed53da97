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

/// Paces the sum of many flows, for user-space pacing: a batch may leave
/// only once the previous batches have drained at the aggregate rate.
///
/// Per-flow departure times alone do not stop a late sending thread from
/// sending every flow that fell due at once, which is the burst pacing is
/// meant to prevent. `slack` is how much sooner than the rate a batch may
/// leave, so that a thread whose sleep ended a little late does not lose
/// that time for good; it does not add up: over any stretch of time `T`,
/// the batches that left before the last one hold at most
/// `rate x (T + slack)` bytes. A thread later than `slack` saves up no
/// credit and goes on at the rate. Like [`Pacer`], it is pure and takes
/// the time as an argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregatePacer {
    rate: u64,
    slack_ns: u64,
    next_ns: u64,
}

impl AggregatePacer {
    /// An aggregate pacer for `rate` bytes per second with `slack` (see
    /// the type's documentation).
    pub fn new(rate: u64, slack: Duration) -> Result<Self, PacingError> {
        if rate == 0 {
            return Err(PacingError::ZeroRate);
        }
        Ok(AggregatePacer {
            rate,
            slack_ns: slack.as_nanos().min(u64::MAX as u128) as u64,
            next_ns: 0,
        })
    }

    /// How long, in ns, from `now_ns` until the next batch may leave; 0 if
    /// it may leave now.
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.next_ns.saturating_sub(now_ns)
    }

    /// Records a batch of `bytes` that left at `now_ns`.
    pub fn sent(&mut self, now_ns: u64, bytes: usize) {
        let drain = (bytes as u128 * 1_000_000_000).div_ceil(self.rate as u128);
        self.next_ns = self
            .next_ns
            .max(now_ns.saturating_sub(self.slack_ns))
            .saturating_add(drain.min(u64::MAX as u128) as u64);
    }
}

/// Waits until a departure time for a user-space pacer: it sleeps, then
/// spins for the last stretch, since on a loaded host or a VM a sleep can
/// end tens or hundreds of microseconds late.
///
/// How long to spin is learnt: the waiter watches how late its own sleeps
/// end and keeps an estimate that moves up fast (a quarter of the way) and
/// down slowly (1/32), so it sits near the bad end of the distribution
/// rather than the mean; it spins for that long plus a little. A host with
/// precise timers spins little; a noisy one spins more instead of sending
/// late. When it spins without sleeping, the estimate decays (1/64 per
/// wait), so one bad spell does not keep it spinning for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    overshoot_ns: u64,
    tolerance_ns: u64,
}

impl Default for Waiter {
    fn default() -> Self {
        Waiter::new()
    }
}

impl Waiter {
    /// The least the waiter spins, in ns.
    pub const MIN_SPIN_NS: u64 = 20_000;
    /// The most the waiter spins, in ns: past this it sleeps and accepts
    /// being late.
    pub const MAX_SPIN_NS: u64 = 500_000;

    /// A waiter that assumes sleeps overshoot by 50 us until it has seen
    /// otherwise.
    pub fn new() -> Self {
        Waiter::tolerating(Duration::ZERO)
    }

    /// A waiter for a caller that tolerates returning up to `late` after
    /// the deadline (such as an [`AggregatePacer`] with that much slack):
    /// it spins that much less.
    pub fn tolerating(late: Duration) -> Self {
        Waiter {
            overshoot_ns: 50_000,
            tolerance_ns: late.as_nanos().min(u64::MAX as u128) as u64,
        }
    }

    /// How long before a deadline the waiter stops sleeping, in ns.
    pub fn spin_ns(&self) -> u64 {
        (self.overshoot_ns + self.overshoot_ns / 4 + 10_000)
            .saturating_sub(self.tolerance_ns)
            .clamp(Self::MIN_SPIN_NS, Self::MAX_SPIN_NS)
    }

    /// Records that a sleep ended `late_ns` after it should have.
    pub fn note_overshoot(&mut self, late_ns: u64) {
        let est = self.overshoot_ns;
        self.overshoot_ns = if late_ns > est {
            est + (late_ns.min(Self::MAX_SPIN_NS) - est.min(Self::MAX_SPIN_NS)) / 4
        } else {
            est - (est - late_ns) / 32
        };
    }

    /// Records a wait short enough to spin through without sleeping.
    pub fn note_spin_only(&mut self) {
        self.overshoot_ns -= self.overshoot_ns / 64;
    }

    /// Waits until `deadline_ns` on [`crate::os::monotonic_ns`]'s clock.
    /// Returns at once if it has passed.
    pub fn wait_until(&mut self, deadline_ns: u64) {
        let now = crate::sys::monotonic_ns();
        let spin = self.spin_ns();
        if deadline_ns.saturating_sub(now) > spin {
            let target = deadline_ns - spin;
            std::thread::sleep(Duration::from_nanos(target - now));
            self.note_overshoot(crate::sys::monotonic_ns().saturating_sub(target));
        } else if deadline_ns > now {
            self.note_spin_only();
        }
        while crate::sys::monotonic_ns() < deadline_ns {
            std::hint::spin_loop();
        }
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

    #[test]
    fn aggregate_pacer_spaces_batches_and_saves_no_credit() {
        // 1 GB/s: 10,000 bytes drain in 10 us.
        assert_eq!(
            AggregatePacer::new(0, Duration::ZERO),
            Err(PacingError::ZeroRate)
        );
        let mut g = AggregatePacer::new(1_000_000_000, Duration::ZERO).unwrap();
        assert_eq!(g.wait_ns(0), 0);
        g.sent(0, 10_000);
        assert_eq!(g.wait_ns(0), 10_000);
        assert_eq!(g.wait_ns(4_000), 6_000);
        g.sent(10_000, 10_000);
        assert_eq!(g.wait_ns(10_000), 10_000);
        // A thread 1 ms late may send one batch now, then must wait again.
        assert_eq!(g.wait_ns(1_000_000), 0);
        g.sent(1_000_000, 10_000);
        assert_eq!(g.wait_ns(1_000_000), 10_000);
        // With 3 us of slack, a thread 2 us late keeps its place...
        let mut g = AggregatePacer::new(1_000_000_000, Duration::from_nanos(3_000)).unwrap();
        g.sent(0, 10_000);
        g.sent(12_000, 10_000);
        assert_eq!(
            g.wait_ns(12_000),
            8_000,
            "due at 20 us, as if it had been on time"
        );
        // ... but one 1 ms late gets only the slack back.
        g.sent(1_000_000, 10_000);
        assert_eq!(g.wait_ns(1_000_000), 7_000);
    }

    #[test]
    fn waiter_learns_how_late_sleeps_end() {
        let mut w = Waiter::new();
        assert_eq!(w.spin_ns(), 50_000 + 12_500 + 10_000);
        // A bad sleep moves the estimate a quarter of the way up at once.
        w.note_overshoot(450_000);
        assert_eq!(w.overshoot_ns, 150_000);
        // A good one brings it down by 1/32 of the gap.
        w.note_overshoot(22_000);
        assert_eq!(w.overshoot_ns, 146_000);
        // Many good sleeps bring it down to what they show.
        for _ in 0..500 {
            w.note_overshoot(2_000);
        }
        assert_eq!(w.spin_ns(), Waiter::MIN_SPIN_NS);
        // A host where a tenth of sleeps end 300 us late: the estimate
        // settles well above the mean (39 us), near the bad end.
        for i in 0..5_000 {
            w.note_overshoot(if i % 10 == 0 { 300_000 } else { 10_000 });
        }
        assert!(
            (100_000..300_000).contains(&w.overshoot_ns),
            "{}",
            w.overshoot_ns
        );
        // Spinning without sleeping decays it, so it cannot stay stuck high.
        for _ in 0..500 {
            w.note_spin_only();
        }
        assert_eq!(w.spin_ns(), Waiter::MIN_SPIN_NS);
        // Never more than the cap, however bad the host.
        for _ in 0..100 {
            w.note_overshoot(50_000_000);
        }
        assert_eq!(w.spin_ns(), Waiter::MAX_SPIN_NS);
        // A caller that tolerates 100 us of lateness gets 100 us less spin.
        let mut t = Waiter::tolerating(Duration::from_micros(100));
        t.note_overshoot(450_000);
        assert_eq!(t.spin_ns(), 150_000 + 37_500 + 10_000 - 100_000);
        assert_eq!(
            Waiter::tolerating(Duration::from_micros(100)).spin_ns(),
            Waiter::MIN_SPIN_NS
        );
    }

    #[test]
    fn waiter_never_returns_early() {
        let mut w = Waiter::new();
        for d in [0u64, 1_000, 30_000, 300_000, 2_000_000] {
            let deadline = crate::sys::monotonic_ns() + d;
            w.wait_until(deadline);
            assert!(crate::sys::monotonic_ns() >= deadline);
        }
        // A deadline in the past returns at once.
        w.wait_until(0);
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

        /// Against the model: a thread that sends whenever the aggregate
        /// pacer lets it (at any times, any batch sizes) never sends more
        /// before a batch than the rate allows since the first one, plus
        /// the slack.
        #[test]
        fn aggregate_never_exceeds_the_rate(
            rate in 10_000u64..10_000_000_000,
            slack in 0u64..100_000,
            steps in proptest::collection::vec((0u64..2_000_000, 1usize..65_536), 1..300),
        ) {
            let mut g = AggregatePacer::new(rate, Duration::from_nanos(slack)).unwrap();
            let mut now = 1_000_000u64;
            // (departure, bytes sent before it) of every batch so far.
            let mut past: Vec<(u64, u128)> = Vec::new();
            let mut sent: u128 = 0;
            for (gap, bytes) in steps {
                now += gap;
                now += g.wait_ns(now);
                prop_assert_eq!(g.wait_ns(now), 0);
                // Every stretch from an earlier batch to this one.
                for &(t, before) in &past {
                    prop_assert!(
                        (sent - before) * 1_000_000_000 <= (now - t + slack) as u128 * rate as u128
                    );
                }
                past.push((now, sent));
                g.sent(now, bytes);
                sent += bytes as u128;
            }
        }
    }
}
