//! Bugs other UDP stacks hit in the field, as regression tests on a real
//! kernel path (issue: reliability suite). The ones this machine cannot
//! produce on a real path are unit tests with the library's fault
//! injection (`src/socket/mod.rs`, `mod tests`).

use crate::common;
use fastudp_io::UdpIo;

use common::*;
use fastudp_io::{Config, ErrorKind, RecvBatch, Socket, Transmit};
use std::net::SocketAddr;
use std::time::Duration;

/// UDP GRO on a socket that also receives fragmented datagrams: a sender
/// whose datagrams exceed the path MTU (fragmented, then reassembled) and
/// a sender of GSO trains feed one GRO receiver; every reassembled
/// datagram arrives whole as a message of its own, never mixed into a
/// train, and every datagram of both is intact.
fn fragments_and_gro_trains_on_one_socket(v6: bool) {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let ns = MtuNamespace::new(if v6 { "fraggro6" } else { "fraggro4" }, 1500);
    let a: SocketAddr = if v6 { "[::1]:0" } else { "127.0.0.1:0" }.parse().unwrap();
    let rx = bind_in(&ns.0, a, Config::default().recv_buffer(32 << 20));
    if !rx.capabilities().supports(fastudp_io::Feature::Gro) {
        skip("no UDP GRO");
        return;
    }
    let trains = bind_in(&ns.0, a, Config::default());
    if trains.capabilities().max_gso_segments <= 1 {
        skip("no UDP GSO");
        return;
    }
    let frag = bind_in(&ns.0, a, Config::default().may_fragment(true));
    let dest = rx.as_std().local_addr().unwrap();
    let frag_from = frag.as_std().local_addr().unwrap();
    const ROUNDS: u64 = 200;
    const SEGS: u64 = 10;
    const SEG: usize = 1000;
    const BIG: usize = 3000;
    for r in 0..ROUNDS {
        let mut train = Vec::new();
        for s in 0..SEGS {
            fill(r * SEGS + s, SEG, &mut train);
        }
        trains.send(&[Transmit::train(dest, &train, SEG)]).unwrap();
        let mut big = Vec::new();
        fill(r, BIG, &mut big);
        frag.send(&[Transmit::new(dest, &big)]).unwrap();
    }
    let mut small = Checker::uniform(ROUNDS * SEGS, SEG);
    let mut large = Checker::uniform(ROUNDS, BIG);
    let mut b = RecvBatch::new(32);
    rx.as_std()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    while small.received < ROUNDS * SEGS || large.received < ROUNDS {
        rx.recv(&mut b).unwrap_or_else(|e| {
            panic!(
                "only {} train datagrams and {} fragmented ones arrived: {e}",
                small.received, large.received
            )
        });
        for (m, payload) in &b {
            assert!(!m.truncated);
            if m.source == frag_from {
                assert_eq!(
                    (m.len, m.datagrams(payload).len()),
                    (BIG, 1),
                    "a reassembled datagram came as part of a train"
                );
                large.check(payload);
            } else {
                for d in m.datagrams(payload) {
                    small.check(d);
                }
            }
        }
    }
    small.finish(0);
    large.finish(0);
}

#[test]
fn v4_fragments_and_gro_trains_on_one_socket() {
    fragments_and_gro_trains_on_one_socket(false)
}

#[test]
fn v6_fragments_and_gro_trains_on_one_socket() {
    fragments_and_gro_trains_on_one_socket(true)
}

/// A datagram over the path MTU in the middle of a batch (a path-MTU probe
/// among normal trains) is refused on its own, named by its index; the
/// transmits before it went out, and the caller sends the rest.
fn oversize_in_a_batch_costs_only_itself(v6: bool) {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let ns = MtuNamespace::new(if v6 { "probe6" } else { "probe4" }, 1500);
    let a: SocketAddr = if v6 { "[::1]:0" } else { "127.0.0.1:0" }.parse().unwrap();
    let rx = bind_in(&ns.0, a, Config::default().gro(false).recv_buffer(8 << 20));
    let tx = bind_in(&ns.0, a, Config::default());
    let dest = rx.as_std().local_addr().unwrap();
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    for seq in 0..6u64 {
        let mut b = Vec::new();
        fill(seq, 1200, &mut b);
        bufs.push(b);
    }
    let probe = vec![0u8; 4000];
    let mut ts: Vec<Transmit<'_>> = bufs.iter().map(|b| Transmit::new(dest, b)).collect();
    ts.insert(3, Transmit::new(dest, &probe));
    let mut k = 0;
    let mut refused = Vec::new();
    while k < ts.len() {
        match tx.send(&ts[k..]) {
            Ok(s) => {
                assert!(s.transmits > 0, "a send took nothing: {s:?}");
                k += s.transmits;
            }
            Err(e) if e.kind() == ErrorKind::ExceedsPathMtu => {
                let index = e.transmit_index().expect("names the transmit");
                let len = ts[k + index].contents.len();
                assert!(
                    e.to_string().contains(&format!("datagram of {len} bytes")),
                    "{e}"
                );
                refused.push((k + index, len));
                k += index + 1;
            }
            Err(e) => panic!("send failed: {e}"),
        }
    }
    assert_eq!(refused, vec![(3, 4000)], "only the probe is refused");
    receive_exactly(&rx, 6, 1200, Duration::from_secs(2));
    assert!(
        tx.stats().fallbacks.is_empty(),
        "{:?}",
        tx.stats().fallbacks
    );
}

#[test]
fn v4_oversize_in_a_batch_costs_only_itself() {
    oversize_in_a_batch_costs_only_itself(false)
}

#[test]
fn v6_oversize_in_a_batch_costs_only_itself() {
    oversize_in_a_batch_costs_only_itself(true)
}

/// A GRO receiver with `recv_buffer` bytes of buffer and a GSO sender on
/// loopback, and the receiver's address; `None` (the test skipped) where
/// the kernel has no GSO or GRO.
fn gso_gro_pair(recv_buffer: usize) -> Option<(Socket, Socket, SocketAddr)> {
    let rx = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default().recv_buffer(recv_buffer),
    )
    .unwrap();
    let tx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    if !rx.capabilities().supports(fastudp_io::Feature::Gro)
        || tx.capabilities().max_gso_segments <= 1
    {
        skip("needs GSO and GRO");
        return None;
    }
    let dest = rx.as_std().local_addr().unwrap();
    Some((rx, tx, dest))
}

/// A receive buffer too small for a 64-segment train: the message is
/// flagged truncated and counted, and yields only whole datagrams.
#[test]
fn a_truncated_gro_train_is_flagged_counted_and_never_mis_split() {
    let Some((rx, tx, dest)) = gso_gro_pair(8 << 20) else {
        return;
    };
    let mut train = Vec::new();
    for s in 0..40u64 {
        fill(s, 1000, &mut train);
    }
    tx.send(&[Transmit::train(dest, &train, 1000)]).unwrap();
    // Room for 10.5 datagrams.
    let mut b = RecvBatch::with_capacity(4, 10_500).unwrap();
    rx.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    rx.recv(&mut b).unwrap();
    let (m, payload) = b.get(0).unwrap();
    assert!(m.truncated, "{m:?}");
    assert_eq!(m.stride, 1000);
    assert_eq!(m.len, 10_000, "only whole datagrams");
    let mut c = Checker::uniform(40, 1000);
    for d in m.datagrams(payload) {
        c.check(d);
    }
    assert_eq!(c.received, 10);
    assert!(rx.stats().truncated >= 1);
}

/// The receive buffer overflows under GRO: the kernel drops whole trains,
/// each counted once (drops are in messages). With uniform trains the
/// library can tell how many datagrams that was: every one sent is
/// received or in a dropped train. (That the `SO_RXQ_OVFL` count messages
/// carry agrees with `SO_MEMINFO` is the library's unit test
/// `rxq_ovfl_count_agrees_with_meminfo`.)
#[test]
fn an_overflowing_gro_socket_counts_dropped_trains_exactly() {
    let Some((rx, tx, dest)) = gso_gro_pair(64 << 10) else {
        return;
    };
    const BURST: u64 = 300;
    const LATER: u64 = 3;
    const SEGS: u64 = 10;
    const SEG: usize = 1000;
    let send = |from: u64, to: u64| {
        for t in from..to {
            let mut train = Vec::new();
            for s in 0..SEGS {
                fill(t * SEGS + s, SEG, &mut train);
            }
            tx.send(&[Transmit::train(dest, &train, SEG)]).unwrap();
        }
    };
    let mut c = Checker::uniform((BURST + LATER) * SEGS, SEG);
    let mut b = RecvBatch::new(32);
    rx.as_std()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut drain = |c: &mut Checker| {
        while rx.recv(&mut b).is_ok() {
            for (m, payload) in &b {
                assert_eq!(
                    m.datagrams(payload).len(),
                    SEGS as usize,
                    "trains arrive whole"
                );
                for d in m.datagrams(payload) {
                    c.check(d);
                }
            }
        }
    };
    // Nobody reads while the burst goes: the 64 KiB buffer overflows.
    send(0, BURST);
    drain(&mut c);
    let drops = rx.stats().kernel_drops;
    assert!(
        drops > 0,
        "the buffer never overflowed: the test proved nothing"
    );
    send(BURST, BURST + LATER);
    drain(&mut c);
    assert_eq!(
        rx.stats().kernel_drops,
        drops,
        "no drop in the second round"
    );
    // Each drop was one whole train of SEGS datagrams.
    c.finish(drops * SEGS);
}
