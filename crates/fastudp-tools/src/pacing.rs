//! Pacing arithmetic: when each flow's next packet or GSO train may leave.
//!
//! A [`Pacer`] gives every train an earliest departure time (EDT) from a
//! rate and an interval: in each interval a flow may send at most
//! `rate x interval` bytes, as one GSO train of at most `max_burst`
//! segments, and the next train departs once the previous one's bytes have
//! drained at the rate. Batching and pacing pull against each other (all
//! segments of one GSO send share one departure time); the interval is the
//! knob between them, as in the paper's Figure 4.
//!
//! The pacers are pure: they take the current time as an argument and
//! never sleep, so they are tested against a model without a clock (the
//! tests are in `tests/pacing.rs`, which compiles this file). Who honours
//! the departure time is a separate choice, [`PacingMode`], which the
//! library's [`fastudp_io::pacing::choose_mode`] makes; only [`Waiter`]
//! sleeps. The command's `stream` runs many flows with a [`Scheduler`].

pub use fastudp_io::pacing::{choose_mode, monotonic_ns, PacingMode};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Nanoseconds per second, and nano-bytes per byte.
const NANO: u128 = 1_000_000_000;

/// Advances an exact departure clock by the time `bytes` take to drain at
/// `rate` bytes per second. The clock is `(ns, early)`: the instant
/// `ns - early / rate` ns, with `early < rate`, so `ns` is that instant
/// rounded up and no rounding is lost from one train to the next. Returns
/// the new clock, or `None` if it lies past `u64::MAX` ns.
fn drain_clock(ns: u64, early: u64, bytes: u128, rate: u64) -> Option<(u64, u64)> {
    let rate = rate as u128;
    // ns - 1 + num / rate is the new instant; num > 0 since early < rate.
    let num = bytes
        .saturating_mul(NANO)
        .saturating_add(rate - early as u128);
    let q = num.div_ceil(rate);
    let next = u64::try_from(ns as u128 + q - 1).ok()?;
    let early = u64::try_from(q.checked_mul(rate)? - num).ok()?;
    Some((next, early))
}

/// Why a pacer cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// A scheduler with no flows.
    #[error("there must be at least 1 flow")]
    NoFlows,
    /// A segment size of zero.
    #[error("the segment size must be at least 1 byte")]
    ZeroSegment,
    /// A total rate below the flows' sum: they could not reach their rate.
    #[error("the total rate is below the flows' sum: they could not reach their rate")]
    TotalBelowSum,
}

/// One paced train: when it may leave and how many segments it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    /// How far before `next_ns` the previous trains have exactly drained,
    /// in 1/rate ns (see [`drain_clock`]).
    early: u64,
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
            early: 0,
        })
    }

    /// The rate in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Whole bytes the flow may send in one interval (rounded down, at most
    /// `u64::MAX`).
    pub fn budget(&self) -> u64 {
        (self.budget_nano() / NANO).min(u64::MAX as u128) as u64
    }

    /// The exact budget of one interval, in nano-bytes.
    fn budget_nano(&self) -> u128 {
        self.rate as u128 * self.interval_ns as u128
    }

    /// How many `seg`-byte segments the next train may hold: what one
    /// interval's budget allows, at least 1, at most `max_burst` and
    /// `pending`.
    pub(crate) fn train_segments(&self, seg: usize, pending: usize) -> usize {
        let by_budget = (self.budget() / seg.max(1) as u64).max(1) as usize;
        by_budget.min(self.max_burst).min(pending).max(1)
    }

    /// Plans the next train of `pending` datagrams of `seg` bytes at time
    /// `now_ns`. It departs at `now_ns` or when the previous train has
    /// drained at the rate, whichever is later; a flow that was idle (or
    /// late) does not save up credit for a bigger burst.
    ///
    /// Drain times are kept exactly (a train may drain in a fraction of a
    /// ns), so over time the flow gets exactly its rate. A departure past
    /// the end of the clock saturates at `u64::MAX`.
    pub fn next(&mut self, now_ns: u64, seg: usize, pending: usize) -> Departure {
        self.advance(now_ns, seg, pending).0
    }

    /// [`Pacer::next`], also returning when the flow may send again, or
    /// `None` if that lies past `u64::MAX` ns.
    fn advance(&mut self, now_ns: u64, seg: usize, pending: usize) -> (Departure, Option<u64>) {
        let segments = self.train_segments(seg, pending);
        let (at_ns, early) = match self.next_ns {
            Some(n) if n >= now_ns => (n, self.early),
            _ => (now_ns, 0),
        };
        let bytes = segments as u128 * seg.max(1) as u128;
        let next = drain_clock(at_ns, early, bytes, self.rate);
        (self.next_ns, self.early) = match next {
            Some((n, e)) => (Some(n), e),
            None => (Some(u64::MAX), 0),
        };
        (Departure { at_ns, segments }, next.map(|(n, _)| n))
    }

    /// When the flow may send again, if it has sent before (`u64::MAX` if
    /// that lies past the end of the clock).
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
    /// How far before `next_ns` the batches have exactly drained, in
    /// 1/rate ns (see [`drain_clock`]).
    early: u64,
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
            early: 0,
        })
    }

    /// How long, in ns, from `now_ns` until the next batch may leave; 0 if
    /// it may leave now.
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.next_ns.saturating_sub(now_ns)
    }

    /// Records a batch of `bytes` that left at `now_ns`. Drain times are
    /// kept exactly, as in [`Pacer::next`]; past the end of the clock the
    /// next batch's time saturates at `u64::MAX`.
    pub fn sent(&mut self, now_ns: u64, bytes: usize) {
        let base = now_ns.saturating_sub(self.slack_ns);
        let (at, early) = if self.next_ns >= base {
            (self.next_ns, self.early)
        } else {
            (base, 0)
        };
        (self.next_ns, self.early) =
            drain_clock(at, early, bytes as u128, self.rate).unwrap_or((u64::MAX, 0));
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
    pub(crate) const MIN_SPIN_NS: u64 = 20_000;
    /// The most the waiter spins, in ns: past this it sleeps and accepts
    /// being late.
    pub(crate) const MAX_SPIN_NS: u64 = 500_000;

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
    pub(crate) fn spin_ns(&self) -> u64 {
        (self.overshoot_ns + self.overshoot_ns / 4 + 10_000)
            .saturating_sub(self.tolerance_ns)
            .clamp(Self::MIN_SPIN_NS, Self::MAX_SPIN_NS)
    }

    /// Records that a sleep ended `late_ns` after it should have.
    pub(crate) fn note_overshoot(&mut self, late_ns: u64) {
        let est = self.overshoot_ns;
        self.overshoot_ns = if late_ns > est {
            est + (late_ns.min(Self::MAX_SPIN_NS) - est.min(Self::MAX_SPIN_NS)) / 4
        } else {
            est - (est - late_ns) / 32
        };
    }

    /// Records a wait short enough to spin through without sleeping.
    pub(crate) fn note_spin_only(&mut self) {
        self.overshoot_ns -= self.overshoot_ns / 64;
    }

    /// Waits until `deadline_ns` on [`monotonic_ns`]'s clock.
    /// Returns at once if it has passed.
    pub fn wait_until(&mut self, deadline_ns: u64) {
        let now = monotonic_ns();
        let spin = self.spin_ns();
        if deadline_ns.saturating_sub(now) > spin {
            let target = deadline_ns - spin;
            std::thread::sleep(Duration::from_nanos(target - now));
            self.note_overshoot(monotonic_ns().saturating_sub(target));
        } else if deadline_ns > now {
            self.note_spin_only();
        }
        while monotonic_ns() < deadline_ns {
            std::hint::spin_loop();
        }
    }
}

/// The most bytes a user-paced batch holds (one `sendmmsg` of one or more
/// trains), unless a single train is larger: about what a shallow router
/// buffer absorbs at once.
pub const DEFAULT_BATCH_BYTES: usize = 16 * 1024;

/// The catch-up credit of a user-paced aggregate (see [`AggregatePacer`]):
/// 100 us, 6 kB at 500 Mbit/s.
pub const DEFAULT_SLACK: Duration = Duration::from_micros(100);

/// The most trains [`Scheduler::due`] hands out at once.
pub const MAX_TRAINS_PER_BATCH: usize = 64;

/// What a [`Scheduler`] paces: many flows of one rate.
///
/// Build one with [`SchedulerConfig::new`] and its setters, which keep
/// working when a field is added:
///
/// ```
/// use fastudp_io::pacing::PacingMode;
/// use fastudp_tools::pacing::{Scheduler, SchedulerConfig};
/// use std::time::Duration;
///
/// // 25 flows of 2 MB/s, a train per flow every 8 ms, of up to 32
/// // segments of 1200 bytes, paced in user space.
/// let cfg = SchedulerConfig::new(25, 2_000_000, Duration::from_millis(8), 1200)
///     .max_burst(32)
///     .mode(PacingMode::User);
/// assert_eq!(cfg.flows, 25);
/// let sched = Scheduler::new(&cfg, 0)?;
/// assert_eq!(sched.total_rate(), 55_000_000); // the flows' sum plus 10%
/// # Ok::<(), fastudp_tools::pacing::PacingError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SchedulerConfig {
    /// Number of flows.
    pub flows: usize,
    /// Bytes per second, per flow.
    pub rate: u64,
    /// At most one train per flow per interval.
    pub interval: Duration,
    /// Most segments in a train.
    pub max_burst: usize,
    /// Bytes per segment (datagram payload).
    pub segment_size: usize,
    /// Who honours the departure times.
    pub mode: PacingMode,
    /// User space: the most all flows together may send, bytes per second
    /// (`None`: the flows' sum plus 10%). Unused in the other modes.
    pub total_rate: Option<u64>,
    /// User space: the most bytes in one batch ([`DEFAULT_BATCH_BYTES`]).
    pub batch_bytes: usize,
}

impl SchedulerConfig {
    /// `flows` flows of `rate` bytes per second each, at most one train per
    /// flow per `interval`, of `segment_size`-byte segments. The rest
    /// starts as: trains of one segment (`max_burst` 1), paced in user
    /// space ([`PacingMode::User`]), a total rate of the flows' sum plus
    /// 10%, and batches of at most [`DEFAULT_BATCH_BYTES`]. Nothing is
    /// checked here: [`Scheduler::new`] refuses what cannot be paced.
    pub fn new(flows: usize, rate: u64, interval: Duration, segment_size: usize) -> Self {
        SchedulerConfig {
            flows,
            rate,
            interval,
            max_burst: 1,
            segment_size,
            mode: PacingMode::User,
            total_rate: None,
            batch_bytes: DEFAULT_BATCH_BYTES,
        }
    }

    /// The most segments in one train (a GSO train when more than 1).
    pub fn max_burst(mut self, segments: usize) -> Self {
        self.max_burst = segments;
        self
    }

    /// Who honours the departure times ([`choose_mode`] picks one a socket
    /// can keep).
    pub fn mode(mut self, mode: PacingMode) -> Self {
        self.mode = mode;
        self
    }

    /// User space: the most all flows together may send, in bytes per
    /// second; `None` for the flows' sum plus 10%.
    pub fn total_rate(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.total_rate = bytes_per_sec;
        self
    }

    /// User space: the most bytes in one batch.
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes;
        self
    }
}

/// One train that may leave now: whose, when and how big.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Due {
    /// The flow, `0..flows`.
    pub flow: usize,
    /// Its departure time and segments.
    pub departure: Departure,
}

/// Schedules many flows' trains for one sending thread: a heap of flows by
/// departure time, one [`Pacer`] per flow, and in user space an
/// [`AggregatePacer`] over the whole.
///
/// Like the pacers it is pure: the caller asks [`Scheduler::due`] at a
/// time of its choosing, sends what it gets, and waits until
/// [`Scheduler::next_at`] (with a [`Waiter`] in user space). In each mode:
///
/// - [`PacingMode::User`]: flows start spread over one interval; a batch
///   holds at most `batch_bytes` (or one train) and leaves only when the
///   previous batches have drained at the total rate.
/// - [`PacingMode::Kernel`]: trains are handed out up to one interval
///   before their departure time, for the caller to pass as `SCM_TXTIME`.
/// - [`PacingMode::None`]: every interval, on one grid for all flows, each
///   flow's whole earned budget is due at once (the unpaced baseline). The
///   budget is kept exactly, in nano-bytes, so a flow that earns less than
///   a segment per interval sends once it has earned one, and over time
///   every flow sends exactly its rate, less at most one segment.
///
/// Catch-up is bounded in every mode, as in [`Pacer`] and
/// [`AggregatePacer`]: a caller that was late or idle for a long time gets
/// at most one interval's worth more than an on-time one (in
/// [`PacingMode::None`], one interval's budget plus what was left over from
/// the last one, less than a segment; in the paced modes, a flow more than
/// one interval behind goes on from one interval behind), never the
/// backlog of the whole idle time. One [`Scheduler::due`] call costs
/// O(flows) at most, however long the caller was away. A flow whose next
/// departure would lie past `u64::MAX` ns is done for good.
#[derive(Debug, Clone)]
pub struct Scheduler {
    mode: PacingMode,
    pacers: Vec<Pacer>,
    /// [`PacingMode::None`]: each flow's earned, unsent budget in
    /// nano-bytes (bytes x 10^9).
    credit: Vec<u128>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    aggregate: AggregatePacer,
    interval_ns: u64,
    horizon_ns: u64,
    segment_size: usize,
    max_burst: usize,
    batch_bytes: usize,
}

impl Scheduler {
    /// A scheduler whose first departures are at `start_ns`.
    pub fn new(cfg: &SchedulerConfig, start_ns: u64) -> Result<Self, PacingError> {
        if cfg.flows == 0 {
            return Err(PacingError::NoFlows);
        }
        if cfg.segment_size == 0 {
            return Err(PacingError::ZeroSegment);
        }
        let pacer = Pacer::new(cfg.rate, cfg.interval, cfg.max_burst)?;
        let interval_ns = pacer.interval_ns;
        let sum = cfg.rate as u128 * cfg.flows as u128;
        let total = match cfg.total_rate {
            Some(t) if (t as u128) < sum => return Err(PacingError::TotalBelowSum),
            Some(t) => t,
            None => (sum + sum / 10).min(u64::MAX as u128) as u64,
        };
        let heap = (0..cfg.flows)
            .map(|i| {
                let phase = if cfg.mode == PacingMode::None {
                    0
                } else {
                    (interval_ns as u128 * i as u128 / cfg.flows as u128) as u64
                };
                Reverse((start_ns.saturating_add(phase), i))
            })
            .collect();
        Ok(Scheduler {
            mode: cfg.mode,
            pacers: vec![pacer; cfg.flows],
            credit: vec![0; cfg.flows],
            heap,
            aggregate: AggregatePacer::new(total, DEFAULT_SLACK)?,
            interval_ns,
            horizon_ns: if cfg.mode == PacingMode::Kernel {
                interval_ns
            } else {
                0
            },
            segment_size: cfg.segment_size,
            max_burst: cfg.max_burst,
            batch_bytes: cfg.batch_bytes.max(1),
        })
    }

    /// The most all flows together may send in user space, bytes per
    /// second: the configured total, or the flows' sum plus 10%.
    pub fn total_rate(&self) -> u64 {
        self.aggregate.rate
    }

    /// The earliest time at which [`Scheduler::due`] may hand out a train;
    /// `u64::MAX` once every flow's next departure lies past the end of the
    /// clock.
    pub fn next_at(&self) -> u64 {
        let flow = self.heap.peek().map_or(u64::MAX, |Reverse((at, _))| {
            at.saturating_sub(self.horizon_ns)
        });
        if self.mode == PacingMode::User {
            flow.max(self.aggregate.next_ns)
        } else {
            flow
        }
    }

    /// Appends to `out` the trains that may leave at `now_ns`: one batch,
    /// at most [`MAX_TRAINS_PER_BATCH`] trains (and in user space at most
    /// `batch_bytes`, unless a single train is larger). Returns the bytes
    /// added. Call it again after sending: more may be due.
    pub fn due(&mut self, now_ns: u64, out: &mut Vec<Due>) -> usize {
        if self.mode == PacingMode::User && self.aggregate.wait_ns(now_ns) > 0 {
            return 0;
        }
        let seg = self.segment_size;
        let (mut trains, mut bytes) = (0, 0usize);
        while trains < MAX_TRAINS_PER_BATCH {
            let Some(&Reverse((at, f))) = self.heap.peek() else {
                break;
            };
            if at > now_ns.saturating_add(self.horizon_ns) {
                break;
            }
            if self.mode == PacingMode::User
                && bytes > 0
                && bytes.saturating_add(
                    self.pacers[f]
                        .train_segments(seg, usize::MAX)
                        .saturating_mul(seg),
                ) > self.batch_bytes
            {
                break;
            }
            self.heap.pop();
            // Every pop either hands out a train (paced modes: at least one
            // segment) or moves the flow past `now_ns` (unpaced), so the
            // loop ends after at most `flows + MAX_TRAINS_PER_BATCH` pops.
            let (departure, next) = if self.mode == PacingMode::None {
                self.unpaced_train(f, at, now_ns)
            } else {
                // A flow more than one interval behind goes on from one
                // interval behind: no bigger backlog is made up.
                let from = at.max(now_ns.saturating_sub(self.interval_ns));
                self.pacers[f].advance(from, seg, usize::MAX)
            };
            if let Some(next) = next {
                self.heap.push(Reverse((next, f)));
            }
            if departure.segments == 0 {
                continue;
            }
            trains += 1;
            bytes = bytes.saturating_add(departure.segments.saturating_mul(seg));
            out.push(Due { flow: f, departure });
        }
        if self.mode == PacingMode::User && bytes > 0 {
            self.aggregate.sent(now_ns, bytes);
        }
        bytes
    }

    /// [`PacingMode::None`]: flow `f`, due on the grid point `at`, at
    /// `now_ns` (`at <= now_ns`). Earns every grid point up to `now_ns` in
    /// one step, but keeps at most one interval's budget plus less than a
    /// segment; returns the train on the latest grid point and the next
    /// grid point (`None` past the end of the clock).
    fn unpaced_train(&mut self, f: usize, at: u64, now_ns: u64) -> (Departure, Option<u64>) {
        let seg_nano = self.segment_size as u128 * NANO;
        let budget = self.pacers[f].budget_nano();
        let missed = now_ns.saturating_sub(at) / self.interval_ns;
        let last = at + missed * self.interval_ns;
        let earned = budget.saturating_mul(missed as u128 + 1);
        let cap = budget.saturating_add(seg_nano - 1);
        let credit = self.credit[f].saturating_add(earned).min(cap);
        let segments = (credit / seg_nano).min(self.max_burst as u128) as usize;
        self.credit[f] = credit - segments as u128 * seg_nano;
        let departure = Departure {
            at_ns: last,
            segments,
        };
        (departure, last.checked_add(self.interval_ns))
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
            let deadline = monotonic_ns() + d;
            w.wait_until(deadline);
            assert!(monotonic_ns() >= deadline);
        }
        // A deadline in the past returns at once.
        w.wait_until(0);
    }

    fn fig4(mode: PacingMode) -> SchedulerConfig {
        // 25 flows x 2 MB/s, 8 ms, full trains of 1200-byte segments.
        SchedulerConfig {
            flows: 25,
            rate: 2_000_000,
            interval: Duration::from_millis(8),
            max_burst: 32,
            segment_size: 1200,
            mode,
            total_rate: None,
            batch_bytes: DEFAULT_BATCH_BYTES,
        }
    }

    /// Runs a scheduler for `secs` of simulated time: a thread that calls
    /// `due` at `next_at` plus `late(i)`. Returns each flow's bytes and
    /// every batch as (time, bytes, trains).
    fn simulate(
        cfg: &SchedulerConfig,
        secs: u64,
        late: impl Fn(usize) -> u64,
    ) -> (Vec<u64>, Vec<(u64, usize, usize)>) {
        let mut s = Scheduler::new(cfg, 0).unwrap();
        run(&mut s, cfg, 0, secs * 1_000_000_000, late)
    }

    /// Runs `s` (built from `cfg`) from `start` to `end` ns, as
    /// [`simulate`] does.
    fn run(
        s: &mut Scheduler,
        cfg: &SchedulerConfig,
        start: u64,
        end: u64,
        late: impl Fn(usize) -> u64,
    ) -> (Vec<u64>, Vec<(u64, usize, usize)>) {
        let mut per_flow = vec![0u64; cfg.flows];
        let mut batches = Vec::new();
        let mut now = start;
        let mut out = Vec::new();
        for i in 0.. {
            now = s.next_at().max(now) + late(i);
            if now >= end {
                break;
            }
            out.clear();
            let bytes = s.due(now, &mut out);
            assert_eq!(
                bytes,
                out.iter()
                    .map(|d| d.departure.segments * cfg.segment_size)
                    .sum::<usize>()
            );
            for d in &out {
                per_flow[d.flow] += (d.departure.segments * cfg.segment_size) as u64;
                if cfg.mode != PacingMode::Kernel {
                    assert!(d.departure.at_ns <= now, "handed out before its time");
                }
            }
            if bytes > 0 {
                batches.push((now, bytes, out.len()));
            }
        }
        (per_flow, batches)
    }

    #[test]
    fn scheduler_user_space_meets_every_rate_in_bounded_batches() {
        let cfg = fig4(PacingMode::User);
        // An on-time thread, and one up to 90 us late every time (inside
        // the slack): every flow within 1% of 2 MB/s over 2 s.
        for late in [0u64, 90_000] {
            let (per_flow, batches) = simulate(&cfg, 2, |i| (i as u64 * 7919) % (late + 1));
            for (f, &b) in per_flow.iter().enumerate() {
                let want = 4_000_000.0;
                assert!(
                    (b as f64 - want).abs() / want < 0.01,
                    "late {late}: flow {f} sent {b}"
                );
            }
            // A batch is one 13-segment train (15.6 kB): never two at once.
            assert!(batches
                .iter()
                .all(|&(_, bytes, n)| n == 1 && bytes == 15_600));
            // The whole never runs ahead of 440 Mbit/s plus the slack.
            let total = 55_000_000u128;
            for (i, &(t0, _, _)) in batches.iter().enumerate().step_by(97) {
                let mut sum = 0u128;
                for &(t, b, _) in &batches[i..] {
                    assert!(sum * 1_000_000_000 <= (t - t0 + 100_000) as u128 * total);
                    sum += b as u128;
                }
            }
        }
    }

    #[test]
    fn scheduler_batches_small_trains_up_to_the_cap() {
        // 1 ms at 2 MB/s: 2000 bytes per interval, one 1200-byte datagram
        // per train; 13 of them fill a 16 KiB batch, which takes 283 us to
        // drain at 55 MB/s, more than the 100 us of slack.
        let cfg = SchedulerConfig {
            interval: Duration::from_millis(1),
            ..fig4(PacingMode::User)
        };
        let mut s = Scheduler::new(&cfg, 0).unwrap();
        let mut out = Vec::new();
        // Everything is overdue 50 ms in: a batch is capped, not a burst.
        assert_eq!(s.due(50_000_000, &mut out), 13 * 1200);
        assert_eq!(out.len(), 13);
        out.clear();
        assert_eq!(s.due(50_000_000, &mut out), 0, "the aggregate gate holds");
        assert!(s.next_at() > 50_000_000);
        // One train bigger than the cap still goes, alone.
        let big = SchedulerConfig {
            batch_bytes: 1000,
            ..fig4(PacingMode::User)
        };
        let mut s = Scheduler::new(&big, 0).unwrap();
        out.clear();
        assert_eq!(s.due(50_000_000, &mut out), 15_600);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn scheduler_unpaced_sends_every_budget_at_once() {
        let cfg = fig4(PacingMode::None);
        let mut s = Scheduler::new(&cfg, 1_000).unwrap();
        assert_eq!(s.total_rate(), 55_000_000, "25 x 2 MB/s + 10%");
        let mut out = Vec::new();
        assert_eq!(s.next_at(), 1_000);
        assert_eq!(s.due(999, &mut out), 0);
        // All 25 flows at the same instant, 13 segments each.
        assert_eq!(s.due(1_000, &mut out), 25 * 15_600);
        assert!(out.iter().all(|d| d.departure.segments == 13));
        assert_eq!(s.next_at(), 1_000 + 8_000_000);
        // The 400-byte remainders add up (13, 13, then 14 segments): over
        // 125 intervals a flow sends all it earned but less than a segment.
        let (per_flow, _) = simulate(&cfg, 1, |_| 0);
        assert!(per_flow
            .iter()
            .all(|&b| (2_000_000 - 1_199..=2_000_000).contains(&b)));
    }

    #[test]
    fn scheduler_kernel_mode_hands_trains_out_one_interval_early() {
        let cfg = fig4(PacingMode::Kernel);
        let mut s = Scheduler::new(&cfg, 10_000_000).unwrap();
        let mut out = Vec::new();
        assert_eq!(s.next_at(), 2_000_000);
        s.due(2_000_000, &mut out);
        assert_eq!(out.len(), 1, "only flow 0 is within one interval");
        assert_eq!(out[0].departure.at_ns, 10_000_000);
        let (per_flow, _) = simulate(&cfg, 1, |_| 0);
        // Handed out up to 8 ms ahead: at most one interval's budget more.
        assert!(per_flow
            .iter()
            .all(|&b| (2_000_000..=2_000_000 + 2 * 15_600).contains(&b)));
    }

    /// Runs `f` on another thread; fails if it panics or has not returned
    /// within 10 s (a loop that never ends).
    fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(v) => v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("did not return within 10 s"),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("panicked"),
        }
    }

    #[test]
    fn scheduler_unpaced_carries_fractional_credit() {
        // (rate, interval ns, segment, flows): budgets of 0.1 byte, 0.003
        // byte, 14 bytes and 411.1 bytes per interval.
        for (rate, interval_ns, seg, flows) in [
            (1_000u64, 100_000u64, 10usize, 3usize),
            (3, 1_000_000, 1, 1),
            (2_000_000, 7_000, 1200, 2),
            (1_234_567, 333_000, 1000, 4),
        ] {
            let cfg = SchedulerConfig {
                flows,
                rate,
                interval: Duration::from_nanos(interval_ns),
                max_burst: 64,
                segment_size: seg,
                ..fig4(PacingMode::None)
            };
            let (per_flow, _) = simulate(&cfg, 2, |_| 0);
            // Each grid point in [0, 2 s) earns one interval's budget: a
            // flow sends all of it but less than a segment.
            let points = 2_000_000_000u64.div_ceil(interval_ns) as u128;
            let earned = (rate as u128 * interval_ns as u128 * points / 1_000_000_000) as u64;
            for &b in &per_flow {
                assert!(
                    b <= earned && b + seg as u64 > earned,
                    "{rate} B/s every {interval_ns} ns: sent {b} of {earned}"
                );
            }
        }
    }

    #[test]
    fn scheduler_unpaced_catch_up_is_bounded_and_cheap() {
        let cfg = fig4(PacingMode::None);
        let mut s = Scheduler::new(&cfg, 0).unwrap();
        let mut out = Vec::new();
        assert_eq!(s.due(0, &mut out), 25 * 15_600);
        // 10 s later: one interval's budget plus the 400-byte carry (14
        // segments) on the latest grid point, not 10 s of backlog.
        out.clear();
        let late = 10_003_000_000;
        assert_eq!(s.due(late, &mut out), 25 * 14 * 1200);
        assert!(
            out.iter()
                .all(|d| d.departure.at_ns == 10_000_000_000 && d.departure.segments == 14),
            "{out:?}"
        );
        out.clear();
        assert_eq!(s.due(late, &mut out), 0, "no backlog left");
        assert_eq!(s.next_at(), 10_008_000_000);
        // 1 byte per second in 1 ns intervals: a call after 10^6 s idle
        // (10^15 intervals) returns at once, with one datagram per flow.
        let slow = SchedulerConfig {
            flows: 1000,
            rate: 1,
            interval: Duration::from_nanos(1),
            segment_size: 1,
            ..fig4(PacingMode::None)
        };
        let idle = 1_000_000 * 1_000_000_000;
        let (total, next) = within_seconds(move || {
            let mut s = Scheduler::new(&slow, 0).unwrap();
            let mut out = Vec::new();
            let mut total = 0;
            for _ in 0..100 {
                match s.due(idle, &mut out) {
                    0 => break,
                    b => total += b,
                }
            }
            (total, s.next_at())
        });
        assert_eq!((total, next), (1000, idle + 1));
    }

    #[test]
    fn scheduler_paced_catch_up_is_bounded_to_one_interval() {
        // Kernel: after a 10 s stall, a flow is handed at most one train
        // from one interval back, one now and one up to an interval ahead.
        let cfg = fig4(PacingMode::Kernel);
        let mut s = Scheduler::new(&cfg, 0).unwrap();
        let mut out = Vec::new();
        s.due(0, &mut out);
        out.clear();
        let now = 10_000_000_000;
        for _ in 0..1000 {
            if s.due(now, &mut out) == 0 {
                break;
            }
        }
        let mut trains = [0; 25];
        for d in &out {
            trains[d.flow] += 1;
            assert!(d.departure.at_ns >= now - 8 * MS, "{d:?}");
        }
        assert!(trains.iter().all(|&n| (1..=3).contains(&n)), "{trains:?}");
        // User space: after the stall each flow goes on at its rate (plus
        // at most one interval's catch-up), not at the total rate until
        // it has made up 10 s.
        let cfg = fig4(PacingMode::User);
        let mut s = Scheduler::new(&cfg, 0).unwrap();
        run(&mut s, &cfg, 0, 1_000_000_000, |_| 0);
        let (per_flow, _) = run(&mut s, &cfg, 11_000_000_000, 12_000_000_000, |_| 0);
        for (f, &b) in per_flow.iter().enumerate() {
            assert!(
                (1_980_000..=2_000_000 + 2 * 15_600).contains(&b),
                "flow {f} sent {b}"
            );
        }
    }

    #[test]
    fn scheduler_returns_promptly_at_a_saturated_clock() {
        for mode in [PacingMode::None, PacingMode::User, PacingMode::Kernel] {
            for (rate, interval_ns) in [(1u64, 1u64), (1_000, 100_000), (2_000_000, 8 * MS)] {
                for start in [0, u64::MAX - 20 * MS, u64::MAX - 1, u64::MAX] {
                    let cfg = SchedulerConfig {
                        flows: 3,
                        rate,
                        interval: Duration::from_nanos(interval_ns),
                        ..fig4(mode)
                    };
                    within_seconds(move || {
                        let mut s = Scheduler::new(&cfg, start).unwrap();
                        let mut out = Vec::new();
                        for now in [start, start.saturating_add(10 * MS), u64::MAX - 1] {
                            s.due(now, &mut out);
                            s.next_at();
                        }
                        // At the end of the clock the flows send what
                        // they are due, then nothing more, for good.
                        let mut calls = 0;
                        while s.due(u64::MAX, &mut out) > 0 {
                            calls += 1;
                            assert!(calls < 100, "{mode} {rate} {interval_ns} {start}");
                        }
                        assert_eq!(s.due(u64::MAX, &mut out), 0);
                        assert_eq!(s.next_at(), u64::MAX);
                    });
                }
            }
        }
    }

    #[test]
    fn pacers_carry_sub_nanosecond_drain() {
        // 3 GB/s in 1-byte trains: 1/3 ns each, so 3000 take 1 us, not 3.
        let mut p = Pacer::new(3_000_000_000, Duration::from_millis(1), 1).unwrap();
        for k in 0..3000u64 {
            assert_eq!(p.next(0, 1, 1).at_ns, k.div_ceil(3));
        }
        assert_eq!(p.next_departure(), Some(1000));
        // 7 GB/s, 1200 bytes: 171.4 ns each, 7 take exactly 1200 ns.
        let mut p = Pacer::new(7_000_000_000, Duration::from_millis(1), 1).unwrap();
        for _ in 0..7 {
            p.next(0, 1200, 1);
        }
        assert_eq!(p.next_departure(), Some(1200));
        let mut g = AggregatePacer::new(3_000_000_000, Duration::ZERO).unwrap();
        for _ in 0..3000 {
            g.sent(0, 1);
        }
        assert_eq!(g.wait_ns(0), 1000);
        // The largest budget saturates rather than wrapping.
        let p = Pacer::new(u64::MAX, Duration::MAX, 1).unwrap();
        assert_eq!(p.budget(), u64::MAX);
    }

    #[test]
    fn scheduler_rejects_bad_settings() {
        let bad = |f: fn(&mut SchedulerConfig)| {
            let mut c = fig4(PacingMode::User);
            f(&mut c);
            Scheduler::new(&c, 0).unwrap_err()
        };
        assert_eq!(bad(|c| c.flows = 0), PacingError::NoFlows);
        assert_eq!(bad(|c| c.segment_size = 0), PacingError::ZeroSegment);
        assert_eq!(bad(|c| c.rate = 0), PacingError::ZeroRate);
        assert_eq!(
            bad(|c| c.interval = Duration::ZERO),
            PacingError::ZeroInterval
        );
        assert_eq!(bad(|c| c.max_burst = 0), PacingError::ZeroBurst);
        assert_eq!(
            bad(|c| c.total_rate = Some(1_000_000)),
            PacingError::TotalBelowSum
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
