//! The io_uring backend's own cases: the ring is really used, buffer-ring
//! exhaustion is counted and loses nothing, the multishot receive is
//! re-armed, teardown with operations in flight is clean, and zerocopy
//! buffers come back only after their notification. (Every integrity test
//! of the library also runs over this backend: .ci/run runs core,
//! loopback, gso_edges, netns, zerocopy, field_bugs and alloc again with
//! `FASTUDP_BACKEND=uring`, which their helpers in `tests/common` turn
//! into `Config::uring`.)
#![cfg(target_os = "linux")]

use crate::common;
use common::*;
use fastudp_io::uring::{probe, UringZeroCopySender};
use fastudp_io::UdpIo;
use fastudp_io::{Config, Feature, RecvBatch, Socket, Transmit};
use std::time::{Duration, Instant};

/// io_uring's pieces for this test, or `None` after saying why not.
fn uring_here(zerocopy: bool) -> bool {
    let p = probe();
    if let Some(why) = p.why_not() {
        skip(format!("io_uring unavailable: {why}"));
        return false;
    }
    if !p.receive_ok() || !p.send_ok() || (zerocopy && !p.zerocopy_ok()) {
        skip(format!("io_uring lacks an opcode: {p:?}"));
        return false;
    }
    true
}

fn bind(config: Config) -> Socket {
    let s = Socket::bind("127.0.0.1:0".parse().unwrap(), config.uring(true)).unwrap();
    s.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    s
}

#[test]
fn probe_reports_what_the_kernel_has() {
    let p = probe();
    eprintln!("{p:?}");
    if p.available {
        assert!(p.error.is_none());
        assert!(p.sendmsg, "every io_uring kernel since 5.3 has SENDMSG");
    } else {
        assert!(p.error.is_some() && p.why_not().is_some());
    }
}

#[test]
fn trains_go_through_the_ring_with_control_messages() {
    if !uring_here(false) {
        return;
    }
    let rx = bind(Config::default().recv_buffer(4 << 20));
    let tx = bind(Config::default());
    let dest = rx.as_std().local_addr().unwrap();
    let trains = self_checking_trains(20, 10, 1200);
    let ts: Vec<Transmit<'_>> = trains
        .iter()
        .map(|b| {
            Transmit::train(dest, b, 1200)
                .with_ecn(Some(fastudp_io::EcnCodepoint::Ect0))
                .with_src_ip(Some("127.0.0.1".parse().unwrap()))
        })
        .collect();
    assert!(tx.send(&ts).unwrap().all(ts.len()));
    let mut checker = Checker::uniform(200, 1200);
    let mut scratch = RecvBatch::new(32);
    while checker.received < 200 {
        rx.state()
            .recv_with(rx.as_std(), &mut scratch, |m, p| {
                // GRO, ECN and PKTINFO arrived through the ring's buffers.
                assert_eq!(m.stride, 1200);
                assert_eq!(m.ecn, Some(fastudp_io::EcnCodepoint::Ect0));
                assert_eq!(m.destination, Some("127.0.0.1".parse().unwrap()));
                for d in m.datagrams(p) {
                    checker.check(d);
                }
            })
            .unwrap();
    }
    checker.finish(0);
    let (t, r) = (
        tx.state().uring_stats().unwrap(),
        rx.state().uring_stats().unwrap(),
    );
    assert!(t.send_active && t.send_sqes >= 20, "{t:?}");
    assert!(r.recv_active && r.recv_messages >= 1, "{r:?}");
    assert!(
        rx.stats().recv_messages < 200,
        "GRO coalesced: {:?}",
        rx.stats()
    );
    assert!(tx.stats().fallbacks.is_empty(), "{:?}", tx.stats());
}

/// Two provided buffers and 300 queued datagrams: the kernel runs out of
/// buffers (ENOBUFS ends the multishot receive), which is counted, the
/// receive is re-armed, and every datagram still arrives exactly once.
#[test]
fn buffer_ring_exhaustion_is_counted_and_loses_nothing() {
    if !uring_here(false) {
        return;
    }
    let rx = bind(
        Config::default()
            .gro(false)
            .recv_buffer(4 << 20)
            .uring_recv_buffers(2),
    );
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    // Arm the receive first, so that the kernel fills the buffers as the
    // datagrams arrive.
    rx.as_std().set_nonblocking(true).unwrap();
    let mut b = RecvBatch::new(1);
    assert!(rx.recv(&mut b).unwrap_err().is_would_block());
    rx.as_std().set_nonblocking(false).unwrap();
    let mut data = Vec::new();
    for s in 0..300 {
        fill(s, 500, &mut data);
    }
    let ts: Vec<Transmit<'_>> = data.chunks(500).map(|c| Transmit::new(dest, c)).collect();
    let mut k = 0;
    while k < ts.len() {
        k += tx.send(&ts[k..]).unwrap().transmits;
    }
    let mut checker = Checker::uniform(300, 500);
    while checker.received < 300 {
        rx.recv(&mut b).unwrap();
        for (_, d) in b.datagrams() {
            checker.check(d);
        }
    }
    checker.finish(0);
    let u = rx.state().uring_stats().unwrap();
    assert!(u.buffer_exhausted >= 1, "{u:?}");
    assert!(u.rearms >= 1, "{u:?}");
    assert_eq!(rx.stats().kernel_drops, 0);
}

/// Sockets dropped (in either order with their state) while a multishot
/// receive is armed and data is arriving: the teardown cancels and waits
/// for the final completion before the buffers go; the process survives
/// and no thread hangs.
#[test]
fn teardown_with_a_receive_in_flight() {
    if !uring_here(false) {
        return;
    }
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let payload = vec![9u8; 1000];
    let start = Instant::now();
    for round in 0..50 {
        let rx = bind(Config::default().gro(false).uring_recv_buffers(4));
        let dest = rx.as_std().local_addr().unwrap();
        rx.as_std().set_nonblocking(true).unwrap();
        let mut b = RecvBatch::new(4);
        let _ = rx.recv(&mut b);
        let ts = vec![Transmit::new(dest, &payload); 16];
        let _ = tx.send(&ts);
        if round % 2 == 0 {
            drop(rx);
        } else {
            // The socket closes first; the armed request holds the file.
            let (sock, state) = rx.into_parts();
            drop(sock);
            let _ = tx.send(&ts);
            drop(state);
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30));
}

/// Buffers come back only after their notification, each exactly once,
/// and the data arrives intact.
#[test]
fn zerocopy_buffers_come_back_after_their_notification() {
    if !uring_here(true) {
        return;
    }
    let rx = bind(Config::default().recv_buffer(8 << 20));
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let mut zc = UringZeroCopySender::new(&tx).unwrap();
    const N: usize = 100;
    const SEGS: usize = 8;
    const SEG: usize = 1200;
    let recv = std::thread::spawn(move || {
        receive_exactly(&rx, (N * SEGS) as u64, SEG, Duration::from_secs(2))
    });
    let mut back = std::collections::HashSet::new();
    let mut sent = std::collections::HashSet::new();
    for i in 0..N {
        let mut buf = Vec::with_capacity(SEGS * SEG);
        for s in 0..SEGS {
            fill((i * SEGS + s) as u64, SEG, &mut buf);
        }
        sent.insert(buf[..8].to_vec());
        zc.send(&tx, dest, buf, Some(SEG))
            .map_err(|(e, _)| e)
            .unwrap();
        zc.reap();
        while let Some(b) = zc.pop_done() {
            assert_eq!(b.len(), SEGS * SEG);
            assert!(back.insert(b[..8].to_vec()), "a buffer came back twice");
        }
        assert_eq!(zc.in_flight() + back.len(), i + 1);
    }
    assert_eq!(zc.drain(Duration::from_secs(5)).unwrap(), 0);
    while let Some(b) = zc.pop_done() {
        assert!(back.insert(b[..8].to_vec()), "a buffer came back twice");
    }
    assert_eq!(back, sent);
    let st = zc.stats();
    assert_eq!(
        (st.sends, st.zerocopy_sends, st.completions),
        (N as u64, N as u64, N as u64)
    );
    eprintln!("{st:?}");
    recv.join().unwrap();
}

/// A GSO refusal on the zerocopy path falls back to the socket's own send
/// (and its recorded GSO fallback); nothing is lost.
#[test]
fn zerocopy_gso_refusal_falls_back() {
    if !uring_here(true) {
        return;
    }
    let rx = bind(Config::default().recv_buffer(8 << 20));
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    set_no_check(&tx, true);
    let mut zc = UringZeroCopySender::new(&tx).unwrap();
    let trains = self_checking_trains(10, 5, 1000);
    let recv = std::thread::spawn(move || receive_exactly(&rx, 50, 1000, Duration::from_secs(2)));
    for t in trains {
        zc.send(&tx, dest, t, Some(1000))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    recv.join().unwrap();
    assert!(tx
        .stats()
        .fallbacks
        .iter()
        .any(|f| f.feature == Feature::Gso));
    assert_eq!(zc.drain(Duration::from_secs(5)).unwrap(), 0);
}

/// A blocking sender behind a slow qdisc: the ring's sends never wait
/// (`MSG_DONTWAIT`), so a full send buffer ends a chain early, and the
/// blocking socket then waits for room in the ring; one call sends every
/// train, whole, and every datagram arrives exactly once.
#[test]
fn a_blocking_sender_waits_for_room_in_the_ring() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    if !uring_here(false) {
        return;
    }
    let p = VethPair::new("uringblock", 7);
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 100mbit burst 16kb limit 20mb",
        p.a
    ));
    let rc = rx_config(RxMode::Gro).recv_buffer(64 << 20).uring(true);
    let rx = p.bind(&p.b, std::net::SocketAddr::new(p.addr_b.into(), 0), rc);
    let dest = rx.as_std().local_addr().unwrap();
    let tc = Config::default().send_buffer(32 * 1024).uring(true);
    let tx = p.bind(&p.a, std::net::SocketAddr::new(p.addr_a.into(), 0), tc);
    const TRAINS: usize = 300;
    let bufs = self_checking_trains(TRAINS, 5, 1000);
    let ts: Vec<Transmit<'_>> = bufs
        .iter()
        .map(|b| Transmit::train(dest, b, 1000))
        .collect();
    let recv = std::thread::spawn(move || {
        receive_exactly(&rx, (TRAINS * 5) as u64, 1000, Duration::from_secs(5));
        rx
    });
    let mut k = 0;
    while k < ts.len() {
        let s = tx.send(&ts[k..]).unwrap();
        assert_eq!(s.datagrams, 0, "trains go whole");
        k += s.transmits;
    }
    let rx = recv.join().unwrap();
    let u = tx.state().uring_stats().unwrap();
    assert!(u.send_active && u.send_sqes >= TRAINS as u64, "{u:?}");
    assert!(rx.state().uring_stats().unwrap().recv_messages > 0);
    assert!(tx.stats().fallbacks.is_empty(), "{:?}", tx.stats());
}

/// GRO trains read in place: each datagram of a train is a slice of the
/// provided buffer the train landed in (no copy), byte for byte what was
/// sent, a short last segment included.
#[test]
fn borrowed_receive_splits_gro_trains_in_place_byte_exact() {
    if !uring_here(false) {
        return;
    }
    let mut rx = bind(Config::default().recv_buffer(4 << 20));
    let tx = bind(Config::default());
    let dest = rx.as_std().local_addr().unwrap();
    // 10 trains of 9 full datagrams and a short tenth one.
    let trains: Vec<Vec<u8>> = (0..10u8)
        .map(|t| {
            (0..9 * 1200 + 300)
                .map(|i| t.wrapping_mul(31).wrapping_add((i / 1200) as u8 ^ i as u8))
                .collect()
        })
        .collect();
    let ts: Vec<Transmit<'_>> = trains
        .iter()
        .map(|b| Transmit::train(dest, b, 1200))
        .collect();
    assert!(tx.send(&ts).unwrap().all(ts.len()));
    let mut expected: Vec<&[u8]> = trains.iter().flat_map(|b| b.chunks(1200)).collect();
    let mut scratch = RecvBatch::new(8);
    let mut trains_seen = 0;
    while !expected.is_empty() {
        let view = rx.recv_borrowed(&mut scratch).unwrap();
        assert!(view.in_ring());
        for (m, p) in view.iter() {
            trains_seen += usize::from(m.datagrams(p).len() > 1);
            let range = p.as_ptr_range();
            for d in m.datagrams(p) {
                // In place: a sub-slice of the message's buffer.
                assert!(range.start <= d.as_ptr() && d.as_ptr_range().end <= range.end);
                let i = expected
                    .iter()
                    .position(|e| *e == d)
                    .expect("a datagram that was sent, once");
                expected.remove(i);
            }
        }
        // Same datagrams through `datagrams()`.
        let n: usize = view.iter().map(|(m, p)| m.datagrams(p).len()).sum();
        assert_eq!(view.datagrams().count(), n);
    }
    assert!(
        trains_seen > 0,
        "GRO never coalesced: the test proved nothing"
    );
    let u = rx.state().uring_stats().unwrap();
    assert!(u.recv_active && u.recv_messages >= 1, "{u:?}");
}

/// A view holds its buffers: while it lives the kernel cannot write into
/// them (more data arriving does not change what the view shows), the
/// ring runs out of buffers (counted), and once the view is dropped the
/// receive is re-armed and every datagram arrives exactly once.
#[test]
fn borrowed_views_hold_their_buffers_and_exhaustion_is_counted_and_recovered() {
    if !uring_here(false) {
        return;
    }
    let mut rx = bind(
        Config::default()
            .gro(false)
            .recv_buffer(4 << 20)
            .uring_recv_buffers(4),
    );
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let mut data = Vec::new();
    for s in 0..304 {
        fill(s, 500, &mut data);
    }
    let ts: Vec<Transmit<'_>> = data.chunks(500).map(|c| Transmit::new(dest, c)).collect();
    let mut scratch = RecvBatch::new(4);
    let mut checker = Checker::uniform(304, 500);
    // Arm the receive, then fill all four buffers.
    rx.as_std().set_nonblocking(true).unwrap();
    assert!(rx.recv_borrowed(&mut scratch).unwrap_err().is_would_block());
    rx.as_std().set_nonblocking(false).unwrap();
    assert!(tx.send(&ts[..4]).unwrap().all(4));
    std::thread::sleep(Duration::from_millis(50));
    {
        let view = rx.recv_borrowed(&mut scratch).unwrap();
        assert!(view.in_ring());
        let before: Vec<Vec<u8>> = view.iter().map(|(_, p)| p.to_vec()).collect();
        assert!(!before.is_empty());
        // 300 more arrive while the view holds its buffers.
        let mut k = 4;
        while k < ts.len() {
            k += tx.send(&ts[k..]).unwrap().transmits;
        }
        std::thread::sleep(Duration::from_millis(50));
        let after: Vec<Vec<u8>> = view.iter().map(|(_, p)| p.to_vec()).collect();
        assert_eq!(before, after, "the kernel wrote into a lent buffer");
        for (_, d) in view.datagrams() {
            checker.check(d);
        }
    }
    while checker.received < 304 {
        let view = rx.recv_borrowed(&mut scratch).unwrap();
        for (_, d) in view.datagrams() {
            checker.check(d);
        }
    }
    checker.finish(0);
    let u = rx.state().uring_stats().unwrap();
    assert!(u.buffer_exhausted >= 1, "{u:?}");
    assert!(u.rearms >= 1, "{u:?}");
    assert_eq!(rx.stats().kernel_drops, 0);
}

/// Without io_uring on the socket (`Config::uring` not set: no
/// environment variable puts a socket on it), the same call receives into
/// the scratch batch and lends its messages out.
#[test]
fn borrowed_receive_without_the_ring_lends_the_scratch_batch() {
    let mut rx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    rx.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let tx = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let payload: Vec<u8> = (0..3 * 1000).map(|i| (i % 251) as u8).collect();
    tx.send(&[Transmit::train(
        rx.as_std().local_addr().unwrap(),
        &payload,
        1000,
    )])
    .unwrap();
    let mut scratch = RecvBatch::new(8);
    let mut got = Vec::new();
    while got.len() < payload.len() {
        assert!(rx.state().uring_stats().is_none());
        let view = rx.recv_borrowed(&mut scratch).unwrap();
        assert!(!view.in_ring());
        for (_, d) in view.datagrams() {
            got.extend_from_slice(d);
        }
    }
    assert_eq!(got, payload);
}

/// `drain` takes any timeout: `Duration::MAX` (wait without end) returns at
/// once when nothing is in flight instead of panicking on the deadline's
/// arithmetic (`Instant + Duration::MAX`).
#[test]
fn zerocopy_drain_takes_the_longest_timeout() {
    if !uring_here(true) {
        return;
    }
    let tx = bind(Config::default());
    let mut zc = UringZeroCopySender::new(&tx).unwrap();
    assert_eq!(zc.drain(Duration::MAX).unwrap(), 0);
}

/// A pool buffer the kernel holds (`UringZeroCopySender::with_buffers`).
/// On loopback the kernel copies each send at once and notifies at once,
/// so no buffer is ever held. Here the sends cross a veth into another
/// namespace behind a 1 Mbit/s tbf: each send's skb waits in the qdisc,
/// its fragments pointing at the pool's pages, and the notification comes
/// only when the qdisc lets it go (the veth copies the data then, on its
/// way into the other namespace). With 4 buffers and 24 sends, the kernel
/// holds every buffer at some point and later sends wait for a
/// notification. A buffer reused before its own would be overwritten
/// while the skb still points at it, and the receiver would see the later
/// send's bytes: every datagram must arrive once and intact, and each
/// buffer handed out again must hold the stamp of a send already notified.
#[test]
fn a_pool_buffer_the_kernel_holds_is_not_reused_before_its_notification() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    if !uring_here(true) {
        return;
    }
    let p = VethPair::new("uringpool", 9);
    // A burst larger than a send (4,000 bytes): the tbf queues skbs whole,
    // without segmenting (and so copying) them.
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 1mbit burst 16kb limit 1mb",
        p.a
    ));
    let rx = p.bind(
        &p.b,
        std::net::SocketAddr::new(p.addr_b.into(), 0),
        Config::default().recv_buffer(4 << 20),
    );
    let dest = rx.as_std().local_addr().unwrap();
    let tx = p.bind(
        &p.a,
        std::net::SocketAddr::new(p.addr_a.into(), 0),
        Config::default(),
    );
    const BUFFERS: usize = 4;
    const SENDS: usize = 24;
    const SEGS: usize = 4;
    const SEG: usize = 1000;
    let mut zc = UringZeroCopySender::new(&tx)
        .unwrap()
        .with_buffers(&tx, BUFFERS, SEGS * SEG)
        .unwrap();
    let recv = std::thread::spawn(move || {
        receive_exactly(&rx, (SENDS * SEGS) as u64, SEG, Duration::from_secs(10))
    });
    let mut most_held = 0;
    let mut reused = 0;
    for k in 0..SENDS {
        most_held = most_held.max(zc.in_flight());
        let mut previous = None;
        zc.send_with(&tx, dest, SEGS * SEG, Some(SEG), |buf| {
            // The stamp of the buffer's last send, if it had one: its
            // first datagram's sequence number and length.
            if buf[8..12] != [0; 4] {
                let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
                previous = Some(seq as usize / SEGS);
            }
            let mut data = Vec::with_capacity(SEGS * SEG);
            for s in 0..SEGS {
                fill((k * SEGS + s) as u64, SEG, &mut data);
            }
            buf.copy_from_slice(&data);
        })
        .unwrap();
        if let Some(prev) = previous {
            reused += 1;
            // Notifications come in the order of the sends (one flow, one
            // FIFO qdisc): send `prev` was notified if `prev + 1` were.
            let notified = zc.stats().completions;
            assert!(
                notified > prev as u64,
                "send {k} reused the buffer of send {prev} with only {notified} notifications"
            );
        }
    }
    assert_eq!(zc.drain(Duration::from_secs(10)).unwrap(), 0);
    recv.join().unwrap();
    let st = zc.stats();
    eprintln!(
        "{st:?}, at most {most_held} held, fixed: {}",
        zc.fixed_buffers()
    );
    assert_eq!(st.completions, st.zerocopy_sends);
    assert_eq!(
        reused,
        SENDS - BUFFERS,
        "every send after the 4th reuses one"
    );
    assert_eq!(
        most_held, BUFFERS,
        "the kernel never held the whole pool: the test proved nothing"
    );
}
