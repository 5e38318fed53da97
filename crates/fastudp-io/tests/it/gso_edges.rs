//! The GSO edge cases the kernel's own selftest (udpgso.c) checks, on IPv4
//! and IPv6, through the library.

use crate::common;
use common::*;
use fastudp_io::UdpIo;
use fastudp_io::{ErrorKind, RecvBatch, Socket, Transmit};
use std::net::SocketAddr;
use std::time::Duration;

struct Pair {
    tx: Socket,
    rx: Socket,
    dest: SocketAddr,
}

fn pair(v6: bool) -> Pair {
    let a = if v6 { "[::1]:0" } else { "127.0.0.1:0" };
    pair_at(a.parse().unwrap(), None)
}

fn pair_at(a: SocketAddr, ns: Option<&str>) -> Pair {
    // GRO off: count datagrams one by one.
    let rc = fastudp_io::Config::default()
        .gro(false)
        .recv_buffer(4 << 20);
    let (rx, tx) = match ns {
        Some(ns) => (
            bind_in(ns, a, rc),
            bind_in(ns, a, fastudp_io::Config::default()),
        ),
        None => (common::bind_with(a, rc).unwrap(), common::bind(a).unwrap()),
    };
    rx.as_std()
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    Pair { tx, rx, dest }
}

impl Pair {
    /// Receives until `n` datagrams arrived; returns their lengths.
    fn expect(&self, n: usize) -> Vec<usize> {
        let mut b = RecvBatch::new(64);
        let mut lens = Vec::new();
        while lens.len() < n {
            match self.rx.recv(&mut b) {
                Ok(_) => lens.extend(b.datagrams().map(|(_, d)| d.len())),
                Err(e) => panic!("expected {n} datagrams, got {}: {e}", lens.len()),
            }
        }
        assert_eq!(lens.len(), n);
        // Nothing more.
        self.rx
            .as_std()
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        assert!(
            self.rx.recv(&mut b).is_err(),
            "more datagrams than expected"
        );
        self.rx
            .as_std()
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        lens
    }

    fn gso(&self) -> bool {
        let ok = self.tx.capabilities().max_gso_segments > 1;
        if !ok {
            skip("no UDP GSO in this kernel");
        }
        ok
    }
}

fn one_byte_segments(v6: bool) {
    let p = pair(v6);
    if !p.gso() {
        return;
    }
    let data = vec![1u8; 10];
    assert_eq!(
        p.tx.send(&[Transmit::train(p.dest, &data, 1)])
            .unwrap()
            .transmits,
        1
    );
    assert_eq!(p.expect(10), vec![1; 10]);
}

fn segment_count_limit(v6: bool) {
    let p = pair(v6);
    if !p.gso() {
        return;
    }
    let max = p.tx.capabilities().kernel_max_segments;
    assert!(max == 64 || max == 128, "kernel limit probed as {max}");
    let data = vec![2u8; max * 100];
    p.tx.send(&[Transmit::train(p.dest, &data, 100)]).unwrap();
    assert_eq!(p.expect(max), vec![100; max]);
    let over = vec![2u8; (max + 1) * 100];
    match p.tx.send(&[Transmit::train(p.dest, &over, 100)]) {
        Err(e) if e.kind() == ErrorKind::InvalidTransmit && e.transmit_index() == Some(0) => {
            assert_eq!(
                e.to_string(),
                format!(
                    "transmit 0: GSO train of {} segments is over the kernel limit of {max} segments per send",
                    max + 1
                )
            );
        }
        other => panic!("expected a segment-count error, got {other:?}"),
    }
    // A short last segment still counts as a segment.
    let ragged = vec![2u8; max * 100 + 1];
    let e =
        p.tx.send(&[Transmit::train(p.dest, &ragged, 100)])
            .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTransmit, "{e}");
    assert!(e.to_string().contains("GSO train of"), "{e}");
    p.expect(0);
}

fn byte_limit(v6: bool) {
    let p = pair(v6);
    if !p.gso() {
        return;
    }
    let max = if v6 { 65_527 } else { 65_507 };
    let seg = 1400;
    let data = vec![3u8; max];
    p.tx.send(&[Transmit::train(p.dest, &data, seg)]).unwrap();
    let lens = p.expect(max.div_ceil(seg));
    assert_eq!(lens.iter().sum::<usize>(), max);
    assert_eq!(*lens.last().unwrap(), max % seg);
    let over = vec![3u8; max + 1];
    match p.tx.send(&[Transmit::train(p.dest, &over, seg)]) {
        Err(e) if e.kind() == ErrorKind::InvalidTransmit && e.transmit_index() == Some(0) => {
            assert!(e.to_string().contains(&format!("{}", max)), "{e}");
            assert!(
                e.to_string().contains("is larger than the UDP maximum"),
                "{e}"
            );
        }
        other => panic!("expected a payload error, got {other:?}"),
    }
    // And without GSO too.
    let e = p.tx.send(&[Transmit::new(p.dest, &over)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTransmit, "{e}");
    assert!(
        e.to_string().contains("is larger than the UDP maximum"),
        "{e}"
    );
    p.expect(0);
}

fn segment_not_smaller_than_payload(v6: bool) {
    let p = pair(v6);
    let data = vec![4u8; 1000];
    // Equal: one datagram. Larger: one datagram.
    p.tx.send(&[
        Transmit::train(p.dest, &data, 1000),
        Transmit::train(p.dest, &data, 5000),
    ])
    .unwrap();
    assert_eq!(p.expect(2), vec![1000, 1000]);
    let e = p.tx.send(&[Transmit::train(p.dest, &data, 0)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.to_string(), "transmit 0: segment size 0 is invalid");
}

#[test]
fn v4_one_byte_segments() {
    one_byte_segments(false)
}
#[test]
fn v6_one_byte_segments() {
    one_byte_segments(true)
}
#[test]
fn v4_segment_count_limit() {
    segment_count_limit(false)
}
#[test]
fn v6_segment_count_limit() {
    segment_count_limit(true)
}
#[test]
fn v4_byte_limit() {
    byte_limit(false)
}
#[test]
fn v6_byte_limit() {
    byte_limit(true)
}
#[test]
fn v4_segment_size_at_or_above_length() {
    segment_not_smaller_than_payload(false)
}
#[test]
fn v6_segment_size_at_or_above_length() {
    segment_not_smaller_than_payload(true)
}

/// In a namespace whose loopback has a 1500-byte MTU, a segment over the
/// MTU is a clear error, while a single datagram with the same large
/// "segment size" carries no cmsg and is sent (fragmented) as usual.
fn segment_over_mtu(v6: bool) {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let ns = MtuNamespace::new(if v6 { "mtu6" } else { "mtu4" }, 1500);
    let a: SocketAddr = if v6 { "[::1]:0" } else { "127.0.0.1:0" }.parse().unwrap();
    let p = pair_at(a, Some(&ns.0));
    if !p.gso() {
        return;
    }
    let hdr = if v6 { 48 } else { 28 };
    let fits = 1500 - hdr;
    let data = vec![5u8; fits * 3];
    p.tx.send(&[Transmit::train(p.dest, &data, fits)]).unwrap();
    assert_eq!(p.expect(3), vec![fits; 3]);
    let too_big = vec![5u8; (fits + 1) * 3];
    match p.tx.send(&[Transmit::train(p.dest, &too_big, fits + 1)]) {
        Err(e) if e.kind() == ErrorKind::ExceedsPathMtu && e.transmit_index() == Some(0) => {
            assert!(
                e.to_string()
                    .contains(&format!("segment size {}", fits + 1)),
                "{e}"
            );
            assert!(e.to_string().contains("MTU"), "{e}")
        }
        other => panic!("expected an MTU error, got {other:?}"),
    }
    assert!(
        p.tx.stats().fallbacks.is_empty(),
        "an MTU error must not turn GSO off"
    );
    // gso_size == len > MTU: one datagram, no cmsg. Don't-fragment is on
    // by default, so it is refused with an error that names it...
    let single = vec![5u8; 3000];
    match p.tx.send(&[Transmit::train(p.dest, &single, 3000)]) {
        Err(e) if e.kind() == ErrorKind::ExceedsPathMtu && e.transmit_index() == Some(0) => {
            assert!(e.to_string().contains("datagram of 3000 bytes"), "{e}")
        }
        other => panic!("expected a datagram MTU error, got {other:?}"),
    }
    // ...and a socket that allows fragments sends it in fragments.
    let frag = bind_in(&ns.0, a, fastudp_io::Config::default().may_fragment(true));
    frag.send(&[Transmit::train(p.dest, &single, 3000)])
        .unwrap();
    assert_eq!(p.expect(1), vec![3000]);
}

#[test]
fn v4_segment_over_mtu_is_a_clear_error() {
    segment_over_mtu(false)
}
#[test]
fn v6_segment_over_mtu_is_a_clear_error() {
    segment_over_mtu(true)
}

#[test]
fn ipv6_destination_on_ipv4_socket_is_a_clear_error() {
    let p = pair(false);
    let r =
        p.tx.send(&[Transmit::new("[::1]:9".parse().unwrap(), b"x")]);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.transmit_index(), Some(0), "{e}");
    assert!(
        e.to_string()
            .contains("is an IPv6 address but the socket is IPv4"),
        "{e}"
    );
}

#[test]
fn bad_batch_sends_nothing_and_names_the_culprit() {
    let p = pair(false);
    let ok = [1u8; 10];
    let bad = vec![0u8; 70_000];
    let r =
        p.tx.send(&[Transmit::new(p.dest, &ok), Transmit::new(p.dest, &bad)]);
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.transmit_index(), Some(1), "{e}");
    assert!(e.to_string().contains("payload of 70000 bytes"), "{e}");
    p.expect(0);
}
