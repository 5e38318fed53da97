//! The GSO train planner (`wire::plan`) on any datagram lengths and limits.
//!
//! Input: the segment limit (2 bytes), the family (1 byte, odd = IPv6), the
//! path MTU (4 bytes), then one 2-byte length per datagram (all
//! little-endian).
//!
//! Checks: the plan covers every datagram once and in order, and every
//! train respects every kernel limit (segments, bytes per call, segment
//! size for the MTU, equal segments but a shorter last one, and the
//! kernel's own cut giving back the same count); an oversized datagram is
//! refused, naming the first one.

#![no_main]

use fastudp_fuzz::input::Input;
use fastudp_tools::wire::plan::{plan, segments, Limits, Oversized};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let max_segments = usize::from(inp.u16());
    let ipv6 = inp.u8() & 1 == 1;
    let mtu = inp.u32() as usize;
    let mut lens = Vec::new();
    while !inp.is_empty() {
        lens.push(usize::from(inp.u16()));
    }
    let limits = Limits::new(max_segments, ipv6, mtu);
    assert!(limits.max_segments >= 1);

    let trains = match plan(&lens, limits) {
        Ok(t) => t,
        Err(e) => {
            let first = lens.iter().find(|&&l| l > limits.max_payload);
            assert_eq!(
                Some(e),
                first.map(|&len| Oversized {
                    len,
                    max: limits.max_payload
                })
            );
            return;
        }
    };
    assert!(lens.iter().all(|&l| l <= limits.max_payload));
    let mut next = 0;
    for t in &trains {
        assert_eq!(t.start, next, "{t:?}");
        next += t.count;
        let ds = &lens[t.start..t.start + t.count];
        assert!(t.count >= 1 && t.count <= limits.max_segments, "{t:?}");
        assert!(t.bytes <= limits.max_payload, "{t:?}");
        assert_eq!(t.bytes, ds.iter().sum::<usize>(), "{t:?}");
        assert_eq!(t.segment_size, ds[0], "{t:?}");
        if t.count > 1 {
            assert!(t.segment_size > 0 && t.segment_size <= limits.max_segment_size);
            assert!(ds[..t.count - 1].iter().all(|&l| l == t.segment_size));
            let last = ds[t.count - 1];
            assert!(last > 0 && last <= t.segment_size, "{t:?}");
            assert_eq!(segments(t.bytes, Some(t.segment_size)), t.count);
        }
    }
    assert_eq!(next, lens.len());
});
