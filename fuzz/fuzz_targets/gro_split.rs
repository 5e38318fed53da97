//! The GRO splitter (`wire::gro::Datagrams`): one received buffer and the
//! `UDP_GRO` segment size.
//!
//! Input: the stride (2 bytes, little-endian; 0 = no `UDP_GRO` message),
//! then the buffer.
//!
//! Checks: the datagrams, end to end, are the buffer; every one but the
//! last is `stride` bytes and the last is no longer; only an empty buffer
//! gives an empty datagram; `count`, `len` and `size_hint` agree with what
//! the iterator yields.

#![no_main]

use fastudp_fuzz::input::Input;
use fastudp_tools::wire::gro::Datagrams;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let stride = usize::from(inp.u16());
    let buf = inp.rest();

    let mut it = Datagrams::new(buf, stride);
    let count = it.len();
    assert_eq!(it.size_hint(), (count, Some(count)));
    assert!(count >= 1);
    let mut parts = Vec::new();
    while let Some(d) = it.next() {
        assert_eq!(it.len(), count - parts.len() - 1);
        assert_eq!(it.size_hint(), (it.len(), Some(it.len())));
        parts.push(d);
    }
    assert_eq!(parts.len(), count);
    assert_eq!(parts.concat(), buf);
    let seg = if stride == 0 { buf.len() } else { stride };
    let (last, full) = parts.split_last().expect("at least one datagram");
    assert!(full.iter().all(|d| d.len() == seg));
    assert!(last.len() <= seg);
    assert_eq!(last.is_empty(), buf.is_empty());
    assert!(it.next().is_none(), "the iterator is fused");
});
