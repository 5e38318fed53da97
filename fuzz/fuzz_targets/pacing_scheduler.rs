//! The pacing `Scheduler` under any configuration and any sequence of
//! calls.
//!
//! Input (little-endian): flows (1 byte, + 1), rate in bytes/s (8),
//! interval in ns (8), burst (2), segment size (2), mode (1: 0 kernel,
//! 1 user, 2 none), total rate (1-byte flag, 8), batch bytes (4), start
//! time (8); then one step per 5 bytes: a 4-byte time advance, shifted left
//! by the low 6 bits of the fifth byte (so the clock can also leap to its
//! end).
//!
//! Checks, at every `due` call: nothing before `next_at`; at most
//! `MAX_TRAINS_PER_BATCH` trains, of 1 to `burst` segments, of known flows,
//! departing no later than the call (one interval ahead in kernel mode);
//! the bytes returned are the trains' bytes; a user-space batch of several
//! trains holds at most `batch_bytes`. Over the whole run: each paced
//! flow's departures are spaced by what its trains take to drain at its
//! rate; an unpaced flow sends no more than it earned; user-space batches
//! keep to the total rate, plus the slack.

#![no_main]

use fastudp_fuzz::input::Input;
use fastudp_tools::pacing::{
    Due, PacingMode, Scheduler, SchedulerConfig, DEFAULT_SLACK, MAX_TRAINS_PER_BATCH,
};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

const NANO: u128 = 1_000_000_000;

/// What one flow was handed out so far.
#[derive(Default, Clone)]
struct Flow {
    first_at: Option<u64>,
    last_at: u64,
    /// Bytes of every train but the last.
    before_last: u128,
    last_bytes: u128,
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let flows = usize::from(inp.u8()) + 1;
    let rate = inp.u64();
    let interval_ns = inp.u64();
    let max_burst = usize::from(inp.u16());
    let segment_size = usize::from(inp.u16());
    let mode = match inp.u8() % 3 {
        0 => PacingMode::Kernel,
        1 => PacingMode::User,
        _ => PacingMode::None,
    };
    let total_rate = (inp.u8() & 1 == 1).then_some(inp.u64());
    let batch_bytes = inp.u32() as usize;
    let start_ns = inp.u64();
    let cfg = SchedulerConfig::new(flows, rate, Duration::from_nanos(interval_ns), segment_size)
        .max_burst(max_burst)
        .mode(mode)
        .total_rate(total_rate)
        .batch_bytes(batch_bytes);
    let Ok(mut s) = Scheduler::new(&cfg, start_ns) else {
        return;
    };
    let total = u128::from(s.total_rate());
    let horizon = if mode == PacingMode::Kernel {
        interval_ns
    } else {
        0
    };
    let seg = segment_size as u128;

    let mut seen = vec![Flow::default(); flows];
    // User space: the first batch's time, and the bytes of every batch but
    // the last.
    let mut first_batch: Option<u64> = None;
    let mut batches_before_last: u128 = 0;
    let mut last_batch: u128 = 0;
    let mut now = start_ns;
    let mut out: Vec<Due> = Vec::new();
    while !inp.is_empty() {
        let step = u64::from(inp.u32());
        let shift = inp.u8() & 63;
        now = now.saturating_add(step << shift);
        let next_at = s.next_at();
        out.clear();
        let bytes = s.due(now, &mut out);
        if now < next_at {
            assert!(out.is_empty(), "a train before next_at {next_at} at {now}");
        }
        assert!(out.len() <= MAX_TRAINS_PER_BATCH);
        let mut sum = 0usize;
        for d in &out {
            let segs = d.departure.segments;
            assert!(d.flow < flows);
            assert!(segs >= 1 && segs <= max_burst, "{d:?}");
            assert!(
                d.departure.at_ns <= now.saturating_add(horizon),
                "{d:?} at {now}"
            );
            sum = sum.saturating_add(segs.saturating_mul(segment_size));
            let f = &mut seen[d.flow];
            let b = segs as u128 * seg;
            match f.first_at {
                None => f.first_at = Some(d.departure.at_ns),
                Some(_) => {
                    assert!(d.departure.at_ns >= f.last_at, "{d:?}");
                    f.before_last += f.last_bytes;
                }
            }
            f.last_at = d.departure.at_ns;
            f.last_bytes = b;
        }
        assert_eq!(bytes, sum);
        if mode == PacingMode::User && out.len() > 1 {
            assert!(bytes <= batch_bytes.max(1), "{bytes} bytes in one batch");
        }
        if mode == PacingMode::User && !out.is_empty() && now < u64::MAX {
            let first = *first_batch.get_or_insert(now);
            batches_before_last += last_batch;
            last_batch = bytes as u128;
            let allowed = total * (u128::from(now - first) + DEFAULT_SLACK.as_nanos());
            assert!(
                batches_before_last * NANO <= allowed,
                "{batches_before_last} bytes before {now}: more than the total rate {total} allows"
            );
        }
    }

    for f in &seen {
        let Some(first) = f.first_at else { continue };
        if mode == PacingMode::None {
            // Earned: one interval's budget per grid point up to the last.
            let points = u128::from((f.last_at - start_ns) / interval_ns) + 1;
            let earned = u128::from(rate)
                .saturating_mul(u128::from(interval_ns))
                .saturating_mul(points);
            assert!((f.before_last + f.last_bytes).saturating_mul(NANO) <= earned);
        } else {
            let drained = u128::from(rate) * u128::from(f.last_at - first);
            assert!(
                f.before_last * NANO <= drained,
                "{} bytes left before the last train: more than {rate} B/s allows",
                f.before_last
            );
        }
    }
});
