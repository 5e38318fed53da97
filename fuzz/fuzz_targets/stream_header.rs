//! The stream receiver's header parsing and per-flow accounting
//! (`fastudp-cli/src/stream/flows.rs`, `RxOut::datagram`, with the header
//! layout of `stream/header.rs`), on any datagrams, forged or not.
//!
//! Input: the flows the run expects (1 byte), then one datagram per
//! record: its length (1 byte), the time since the previous one in µs
//! (2 bytes, little-endian) and its bytes.
//!
//! Checks: every datagram counts either for a flow or as foreign; only
//! expected flow ids keep state; per flow, the distinct datagrams and the
//! lost ones add up to one past the highest plausible sequence number
//! (computed here from the header, apart from the receiver); the mode
//! counts add up to the distinct datagrams, and count no datagram for a
//! mode its header did not name; the report's figures (loss,
//! gap percentiles) are computed without a panic.

#![no_main]

use fastudp_fuzz::engine::seq::MAX_JUMP;
use fastudp_fuzz::input::Input;
use fastudp_fuzz::stream::flows::{percentile, RxOut, Tally};
use fastudp_fuzz::stream::header::mode_name;
use fastudp_fuzz::stream::{HDR, MAGIC};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let limit = u32::from(inp.u8());
    let mut rx = RxOut::new(limit);
    // Per flow: one past the highest sequence number it accepted.
    let mut next: HashMap<u32, u64> = HashMap::new();
    let (mut counted, mut foreign, mut total) = (0u64, 0u64, 0u64);
    // Datagrams that counted for a flow, by the mode their header names
    // (0: a byte that names none).
    let mut by_mode = [0u64; 4];
    let mut now = 0u64;
    while !inp.is_empty() {
        let len = usize::from(inp.u8());
        now += u64::from(inp.u16()) * 1000;
        let d = inp.bytes(len);
        total += 1;
        let ok = rx.datagram(d, now);
        if ok {
            counted += 1;
        } else {
            foreign += 1;
        }
        let header = (d.len() >= HDR && &d[13..HDR] == MAGIC).then(|| {
            let flow = u32::from_be_bytes(d[..4].try_into().unwrap());
            let seq = u64::from_le_bytes(d[4..12].try_into().unwrap());
            (flow, seq, d[12])
        });
        let Some((flow, seq, mode)) = header else {
            assert!(!ok, "a datagram without the header counted");
            continue;
        };
        assert_eq!(mode_name(mode) == "unknown", !(1..=3).contains(&mode));
        if flow >= limit {
            assert!(!ok, "flow {flow} of {limit} counted");
            continue;
        }
        let n = next.get(&flow).copied().unwrap_or(0);
        let plausible = seq < n || (seq - n < MAX_JUMP && seq != u64::MAX);
        assert_eq!(ok, plausible, "flow {flow} seq {seq} after {n}");
        if plausible {
            next.insert(flow, n.max(seq + 1));
            by_mode[if (1..=3).contains(&mode) { mode } else { 0 } as usize] += 1;
        }
    }
    assert_eq!(counted + foreign, total);

    let t = Tally::merge(vec![rx]);
    assert_eq!(t.foreign, foreign);
    assert!(t.out_of_range <= t.foreign);
    assert_eq!(t.flows.len(), next.len());
    let mut distinct = 0;
    for (id, f) in &t.flows {
        assert!(*id < limit);
        assert_eq!(f.datagrams + f.lost, next[id], "flow {id}");
        assert!(f.bytes >= f.datagrams * HDR as u64);
        distinct += f.datagrams;
    }
    assert_eq!(t.modes.iter().sum::<u64>(), distinct);
    for (m, (&got, &sent)) in t.modes.iter().zip(&by_mode).enumerate() {
        assert!(
            got <= sent,
            "mode {m}: {got} datagrams, {sent} sent with it"
        );
    }
    assert!((0.0..=1.0).contains(&t.loss()));
    for p in [0.5, 0.9, 0.99, 1.0] {
        assert!(percentile(&t.gaps, p) >= 0.0);
    }
});
