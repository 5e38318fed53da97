//! MSG_ZEROCOPY through the library: buffers come back only after their
//! completion, nothing is lost, and the adaptive fallback to copying works
//! on loopback, where the kernel always copies.

use crate::common;
use common::*;
use fastudp_io::UdpIo;
use fastudp_io::{SendMeta, Socket, ZeroCopySender};
use std::time::Duration;

fn receiver() -> Socket {
    let r = common::bind_with("127.0.0.1:0".parse().unwrap(), rx_config(RxMode::Gro)).unwrap();
    r.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    r
}

/// A sender and a GRO receiver on loopback, or `None` (and why) where the
/// kernel has no MSG_ZEROCOPY.
fn zerocopy_pair() -> Option<(Socket, Socket, std::net::SocketAddr)> {
    let tx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    if !tx.capabilities().supports(fastudp_io::Feature::Zerocopy) {
        skip("no MSG_ZEROCOPY here");
        return None;
    }
    let rx = receiver();
    let dest = rx.as_std().local_addr().unwrap();
    Some((tx, rx, dest))
}

fn receive_all(r: &Socket, total: u64, seg: usize) {
    receive_exactly(r, total, seg, Duration::from_secs(2));
}

#[test]
fn buffers_come_back_only_after_completion() {
    let Some((tx, rx, dest)) = zerocopy_pair() else {
        return;
    };
    let mut zc = ZeroCopySender::new(&tx).unwrap().adaptive(false);
    const N: usize = 100;
    const SEGS: usize = 8;
    const SEG: usize = 1200;
    let recv = std::thread::spawn(move || receive_all(&rx, (N * SEGS) as u64, SEG));
    let mut returned = 0;
    for i in 0..N {
        let mut buf = Vec::with_capacity(SEGS * SEG);
        for s in 0..SEGS {
            fill((i * SEGS + s) as u64, SEG, &mut buf);
        }
        zc.send(&tx, dest, buf, Some(SEG), SendMeta::default())
            .map_err(|(e, _)| e)
            .unwrap();
        // Nothing is handed back before its completion has been read.
        assert!(zc.in_flight() >= 1);
        while let Some(b) = zc.pop_done() {
            assert_eq!(b.len(), SEGS * SEG);
            returned += 1;
        }
        zc.reap(&tx).unwrap();
    }
    assert_eq!(
        zc.drain(&tx, Duration::from_secs(5)).unwrap(),
        0,
        "every completion arrives"
    );
    while zc.pop_done().is_some() {
        returned += 1;
    }
    assert_eq!(returned, N);
    let s = zc.stats();
    assert_eq!(
        (s.sends, s.zerocopy_sends, s.completions),
        (N as u64, N as u64, N as u64)
    );
    // Loopback delivery always copies; the kernel says so.
    assert_eq!(s.copied, N as u64, "{s:?}");
    assert!(!zc.is_copying(), "not adaptive: stays in zerocopy mode");
    recv.join().unwrap();
}

#[test]
fn adaptive_sender_falls_back_to_copying_on_loopback() {
    let Some((tx, rx, dest)) = zerocopy_pair() else {
        return;
    };
    let mut zc = ZeroCopySender::new(&tx).unwrap();
    const N: usize = 300;
    let recv = std::thread::spawn(move || receive_all(&rx, N as u64, 1000));
    let mut pool: Vec<Vec<u8>> = Vec::new();
    for i in 0..N {
        let mut buf = pool.pop().unwrap_or_default();
        buf.clear();
        fill(i as u64, 1000, &mut buf);
        zc.send(&tx, dest, buf, None, SendMeta::default())
            .map_err(|(e, _)| e)
            .unwrap();
        zc.reap(&tx).unwrap();
        while let Some(b) = zc.pop_done() {
            pool.push(b);
        }
    }
    zc.drain(&tx, Duration::from_secs(5)).unwrap();
    let s = zc.stats();
    assert!(zc.is_copying(), "{s:?}");
    let fb = s.fallback.clone().expect("the fallback is reported");
    assert!(fb.reason.contains("copied"), "{}", fb.reason);
    assert!(
        s.zerocopy_sends >= 64 && s.zerocopy_sends < N as u64,
        "{s:?}"
    );
    assert_eq!(s.sends, N as u64);
    recv.join().unwrap();
}

#[test]
fn disabled_zerocopy_is_a_clear_error() {
    let c = fastudp_io::Config::default().disable([fastudp_io::Feature::Zerocopy]);
    let tx = common::bind_with("127.0.0.1:0".parse().unwrap(), c).unwrap();
    let e = ZeroCopySender::new(&tx).unwrap_err();
    assert!(e.to_string().contains("zerocopy"), "{e}");
}

#[test]
fn oversized_buffer_comes_back_with_the_error() {
    let tx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    if !tx.capabilities().supports(fastudp_io::Feature::Zerocopy) {
        return;
    }
    let mut zc = ZeroCopySender::new(&tx).unwrap();
    let (e, buf) = zc
        .send(
            &tx,
            "127.0.0.1:9".parse().unwrap(),
            vec![0; 70_000],
            None,
            SendMeta::default(),
        )
        .unwrap_err();
    assert_eq!(buf.len(), 70_000, "the caller gets its buffer back");
    assert_eq!(e.kind(), fastudp_io::ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.transmit_index(), Some(0));
    assert!(e.to_string().contains("payload of 70000 bytes"), "{e}");
}

/// A zerocopy GSO send the kernel refuses after building the packet (a
/// segment over the MTU: EMSGSIZE from udp_send_skb) still uses up a
/// completion id. The sender must count it, or it would hand the next
/// buffer back on the failed send's completion, before its own.
#[test]
fn a_refused_zerocopy_send_keeps_completions_in_step() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let ns = MtuNamespace::new("zcmtu", 1500);
    let tx = bind_in(
        &ns.0,
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    );
    let rx = bind_in(
        &ns.0,
        "127.0.0.1:0".parse().unwrap(),
        rx_config(RxMode::Gro),
    );
    if !tx.capabilities().supports(fastudp_io::Feature::Zerocopy)
        || tx.capabilities().max_gso_segments <= 1
    {
        skip("needs MSG_ZEROCOPY and GSO");
        return;
    }
    let dest = rx.as_std().local_addr().unwrap();
    let mut zc = ZeroCopySender::new(&tx).unwrap().adaptive(false);
    let (e, back) = zc
        .send(
            &tx,
            dest,
            vec![1u8; 3 * 2000],
            Some(2000),
            SendMeta::default(),
        )
        .unwrap_err();
    assert_eq!(back.len(), 6000, "the refused buffer comes back at once");
    assert!(
        e.to_string().contains("Message too long") || e.to_string().contains("EMSGSIZE"),
        "{e}"
    );
    let mut ok = Vec::new();
    fill(0, 1000, &mut ok);
    zc.send(&tx, dest, ok, None, SendMeta::default())
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(
        zc.drain(&tx, Duration::from_secs(5)).unwrap(),
        0,
        "the good buffer's completion arrives and is matched"
    );
    let b = zc.pop_done().expect("the good buffer comes back");
    assert_eq!(b.len(), 1000);
    assert!(
        zc.pop_done().is_none(),
        "the failed send's id holds no buffer"
    );
}

/// A zerocopy send that fails before the kernel builds a packet (no route:
/// ENETUNREACH) uses no completion id. The sender must not count one, or
/// every later buffer would come back a completion late and the last one
/// never (found by the soak: a link flap stalled `gso-zerocopy`).
#[test]
fn a_send_without_a_route_uses_no_completion_id() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    // A namespace with only loopback: 10.0.0.0/8 has no route.
    let ns = MtuNamespace::new("zcnoroute", 65536);
    let tx = bind_in(
        &ns.0,
        "0.0.0.0:0".parse().unwrap(),
        fastudp_io::Config::default(),
    );
    let rx = bind_in(
        &ns.0,
        "127.0.0.1:0".parse().unwrap(),
        rx_config(RxMode::Gro),
    );
    if !tx.capabilities().supports(fastudp_io::Feature::Zerocopy) {
        skip("needs MSG_ZEROCOPY");
        return;
    }
    let mut zc = ZeroCopySender::new(&tx).unwrap().adaptive(false);
    let nowhere = "10.9.9.9:9".parse().unwrap();
    for _ in 0..3 {
        let (e, back) = zc
            .send(&tx, nowhere, vec![7u8; 1000], None, SendMeta::default())
            .unwrap_err();
        assert_eq!(back.len(), 1000);
        assert_eq!(
            e.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::NetworkUnreachable),
            "{e}"
        );
    }
    let dest = rx.as_std().local_addr().unwrap();
    for i in 0..2u64 {
        let mut ok = Vec::new();
        fill(i, 1000, &mut ok);
        zc.send(&tx, dest, ok, None, SendMeta::default())
            .map_err(|(e, _)| e)
            .unwrap();
    }
    assert_eq!(
        zc.drain(&tx, Duration::from_secs(5)).unwrap(),
        0,
        "both good buffers' completions arrive and are matched"
    );
    assert_eq!(zc.pop_done().map(|b| b.len()), Some(1000));
    assert_eq!(zc.pop_done().map(|b| b.len()), Some(1000));
    assert!(zc.pop_done().is_none());
    assert_eq!(zc.stats().completions, 2);
}

/// `send`'s [`SendMeta`] carries the source address and the ECN codepoint, both on
/// the zerocopy path and after the sender switched to copying: a server
/// answering from the address its client used keeps doing so.
#[test]
fn send_meta_keeps_source_address_and_ecn() {
    use fastudp_io::{EcnCodepoint, RecvBatch};
    if !common::bind("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .capabilities()
        .supports(fastudp_io::Feature::Zerocopy)
    {
        skip("no MSG_ZEROCOPY here");
        return;
    }
    let rx = receiver();
    let dest = rx.as_std().local_addr().unwrap();
    let src: std::net::IpAddr = "127.0.0.7".parse().unwrap();
    let meta = SendMeta::default()
        .with_src_ip(Some(src))
        .with_ecn(Some(EcnCodepoint::Ect0));
    const SEG: usize = 1000;
    for adaptive_copy in [false, true] {
        // One sender per socket: the kernel numbers a socket's zerocopy
        // sends from 0 once.
        let tx = common::bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let mut zc = ZeroCopySender::new(&tx).unwrap().adaptive(false);
        if adaptive_copy {
            // 64 completions on loopback (always copied) switch an
            // adaptive sender to copying sends.
            zc = ZeroCopySender::new(&tx).unwrap();
            // (A completion comes when the receiver has read the datagram.)
            let mut batch = RecvBatch::new(8);
            for i in 0..70u64 {
                let mut b = Vec::new();
                fill(i, SEG, &mut b);
                zc.send(&tx, dest, b, None, SendMeta::default())
                    .map_err(|(e, _)| e)
                    .unwrap();
                rx.recv(&mut batch).unwrap();
                zc.wait(&tx, Duration::from_millis(200)).unwrap();
            }
            assert!(zc.is_copying(), "{:?}", zc.stats());
        }
        let mut buf = Vec::new();
        for s in 0..4u64 {
            fill(s, SEG, &mut buf);
        }
        zc.send(&tx, dest, buf, Some(SEG), meta)
            .map_err(|(e, _)| e)
            .unwrap();
        let mut batch = RecvBatch::new(8);
        let mut seen = 0;
        while seen < 4 {
            rx.recv(&mut batch).unwrap();
            for (m, d) in &batch {
                assert_eq!(m.source.ip(), src, "copying sender: {adaptive_copy}");
                assert_eq!(m.ecn, Some(EcnCodepoint::Ect0), "copying: {adaptive_copy}");
                seen += d.len() / SEG;
            }
        }
        zc.drain(&tx, Duration::from_secs(2)).unwrap();
    }
}

/// `drain` takes any timeout: `Duration::MAX` (wait without end) returns at
/// once when nothing is in flight instead of panicking on the deadline's
/// arithmetic (`Instant + Duration::MAX`).
#[test]
fn drain_takes_the_longest_timeout() {
    let Some((tx, _rx, _)) = zerocopy_pair() else {
        return;
    };
    let mut zc = ZeroCopySender::new(&tx).unwrap();
    assert_eq!(zc.drain(&tx, Duration::MAX).unwrap(), 0);
}
