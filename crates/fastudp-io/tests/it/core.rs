//! The core on caller-owned sockets: non-blocking semantics, the typed
//! error queue (ICMP errors name the destination), GSO that comes back
//! after a refusal, threads sharing a socket while GSO flips, and bad
//! steering offsets.

use crate::common;
use fastudp_io::UdpIo;

use common::*;
use fastudp_io::{
    Config, ErrorKind, RecvBatch, ReuseportGroup, SocketError, SocketErrorKind, Steering, Transmit,
    UdpState,
};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// A bound std socket and a port that nobody listens on.
fn closed_port(addr: &str) -> SocketAddr {
    let s = UdpSocket::bind(addr).unwrap();
    let a = s.local_addr().unwrap();
    drop(s);
    a
}

#[test]
fn core_runs_on_a_caller_owned_non_blocking_socket() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_nonblocking(true).unwrap();
    let rx_state = common::state(&rx, Config::default()).unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.set_nonblocking(true).unwrap();
    let tx_state = common::state(&tx, Config::default()).unwrap();
    let dest = rx.local_addr().unwrap();
    let mut batch = RecvBatch::new(8);
    // Nothing queued: WouldBlock at once, never a wait.
    let t0 = Instant::now();
    let e = (&rx_state, &rx).recv(&mut batch).unwrap_err();
    assert!(e.is_would_block(), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    let payload = vec![9u8; 3 * 1000];
    let sent = (&tx_state, &tx)
        .send(&[Transmit::train(dest, &payload, 1000)])
        .unwrap();
    assert!(sent.all(1));
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    while got < 3 && Instant::now() < deadline {
        match (&rx_state, &rx).recv(&mut batch) {
            Ok(_) => got += batch.datagrams().count(),
            Err(e) if e.is_would_block() => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, 3);
    // The Coalescer lives next to the socket, holding neither.
    struct Conn {
        sock: UdpSocket,
        state: UdpState,
        out: fastudp_io::Coalescer,
    }
    let mut c = Conn {
        sock: tx,
        state: tx_state,
        out: fastudp_io::Coalescer::new(),
    };
    for _ in 0..10 {
        c.out
            .push(&(&c.state, &c.sock), dest, &[1u8; 500], None, None)
            .unwrap();
    }
    assert_eq!(c.out.flush(&(&c.state, &c.sock)).unwrap(), 10);
}

/// Fills a non-blocking socket's send buffer: the send returns what went
/// out, or WouldBlock, and never waits.
#[test]
fn a_full_non_blocking_socket_never_waits() {
    let rx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let c = Config::default()
        .send_buffer(4096)
        .disable([fastudp_io::Feature::Gso]);
    let tx = common::bind_with("127.0.0.1:0".parse().unwrap(), c).unwrap();
    tx.as_std().set_nonblocking(true).unwrap();
    let payload = vec![3u8; 60 * 1000];
    let t0 = Instant::now();
    let mut short = 0;
    for _ in 0..200 {
        match tx.send(&[Transmit::train(dest, &payload, 1000)]) {
            Ok(s) if !s.all(1) => short += 1,
            Ok(_) => {}
            Err(e) if e.is_would_block() => short += 1,
            Err(e) => panic!("{e}"),
        }
    }
    // Loopback delivers at once, so the buffer may not fill every time;
    // what matters is that no call waited for it.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a non-blocking send waited: {:?}",
        t0.elapsed()
    );
    eprintln!("short or blocked sends: {short}");
}

/// An ICMP (type 3, code 3) or ICMPv6 (type 1, code 4) port unreachable.
fn is_port_unreachable(e: &SocketError) -> bool {
    let (_, origin, ty, code, ..) = e.raw();
    e.kind() == SocketErrorKind::Unreachable && matches!((origin, ty, code), (2, 3, 3) | (3, 1, 4))
}

fn port_unreachable_names_the_destination(bind: &str) {
    let tx = common::bind(bind.parse().unwrap()).unwrap();
    assert!(tx.capabilities().supports(fastudp_io::Feature::Recverr));
    let gone = closed_port(bind);
    let alive = common::bind(bind.parse().unwrap()).unwrap();
    let alive_addr = alive.as_std().local_addr().unwrap();
    tx.send(&[Transmit::new(gone, b"anyone there?")]).unwrap();
    // The ICMP error comes back at once on loopback; the next send to
    // someone else must not fail for it.
    std::thread::sleep(Duration::from_millis(50));
    let s = tx.send(&[Transmit::new(alive_addr, b"hello")]).unwrap();
    assert!(s.all(1), "a send to another peer is not refused");
    let mut errors = Vec::new();
    while let Some(e) = tx.recv_error().unwrap() {
        errors.push(e);
    }
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = errors[0];
    assert_eq!(e.kind(), SocketErrorKind::Unreachable, "{e:?}");
    assert!(
        is_port_unreachable(&e),
        "expected port unreachable, got {e:?}"
    );
    assert_eq!(e.destination(), Some(gone));
    assert_eq!(e.raw().0, libc::ECONNREFUSED);
    assert!(errors[0].to_string().contains(&gone.to_string()));
    assert!(tx.stats().async_errors >= 1, "{:?}", tx.stats());
    alive
        .as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(4);
    alive.recv(&mut b).unwrap();
    assert_eq!(b.get(0).unwrap().1, b"hello");
}

#[test]
fn v4_port_unreachable_names_the_destination() {
    port_unreachable_names_the_destination("127.0.0.1:0");
}

#[test]
fn v6_port_unreachable_names_the_destination() {
    port_unreachable_names_the_destination("[::1]:0");
}

/// A receive on an unconnected socket is not failed by an ICMP error for
/// an earlier send; on a connected one the error comes back, once.
#[test]
fn icmp_errors_and_receive() {
    let gone = closed_port("127.0.0.1:0");
    let server = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let peer = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    server.send(&[Transmit::new(gone, b"x")]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    peer.send(&[Transmit::new(
        server.as_std().local_addr().unwrap(),
        b"data",
    )])
    .unwrap();
    server
        .as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(4);
    assert_eq!(server.recv(&mut b).unwrap(), 1, "the data, not the error");
    assert_eq!(b.get(0).unwrap().1, b"data");
    let e = server
        .recv_error()
        .unwrap()
        .expect("the ICMP error is queued");
    assert!(is_port_unreachable(&e), "{e:?}");

    let client = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    client.as_std().connect(gone).unwrap();
    client
        .as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    client.send(&[Transmit::new(gone, b"x")]).unwrap();
    let e = client.recv(&mut b).unwrap_err();
    assert_eq!(e.kind(), fastudp_io::ErrorKind::Io, "{e}");
    assert_eq!(
        e.io_error().map(std::io::Error::kind),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a connected socket learns its peer went away: {e}"
    );
    assert!(client.recv_error().unwrap().is_some(), "and why");
}

/// A GSO refusal (SO_NO_CHECK: EINVAL from udp_send_skb) turns GSO off
/// for a while, not for good.
#[test]
fn gso_comes_back_after_a_refusal() {
    let rx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let tx = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default().gso_retry(Duration::from_millis(50)),
    )
    .unwrap();
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no GSO");
        return;
    }
    let trains = self_checking_trains(2, 4, 1000);
    set_no_check(&tx, true);
    assert!(tx
        .send(&[Transmit::train(dest, &trains[0], 1000)])
        .unwrap()
        .all(1));
    assert_eq!(tx.max_gso_segments(), 1, "off after the refusal");
    assert_eq!(tx.stats().resent_unsegmented, 4);
    set_no_check(&tx, false);
    std::thread::sleep(Duration::from_millis(120));
    assert!(tx.max_gso_segments() > 1, "tried again after gso_retry");
    let calls = tx.stats().send_calls;
    tx.send(&[Transmit::train(dest, &trains[1], 1000)]).unwrap();
    assert_eq!(tx.stats().send_calls, calls + 1, "one GSO send");
    assert_eq!(tx.stats().gso_retries, 1);
    receive_exactly(&rx, 8, 1000, Duration::from_secs(2));
}

/// Threads share one socket; another thread keeps making the kernel refuse
/// GSO (and GSO keeps coming back), so trains are split mid-send. Every
/// datagram must arrive exactly once: a half-sent train is reported, never
/// sent again whole. (The veth variant in `netns.rs`, behind a slow qdisc,
/// also proves that trains were cut half-way.)
#[test]
fn threads_sharing_a_socket_while_gso_flips_send_every_datagram_once() {
    let rx = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default().recv_buffer(64 << 20),
    )
    .unwrap();
    let tx = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default()
            .send_buffer(16 * 1024)
            .gso_retry(Duration::from_micros(200)),
    )
    .unwrap();
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no GSO");
        return;
    }
    let r = threads_send_while_gso_flips(tx, rx, Duration::from_secs(5));
    assert!(
        r.fallbacks > 0,
        "GSO was never refused: the test proved nothing"
    );
}

#[test]
fn payload_steering_offset_must_address_the_payload() {
    // The 4 bytes must lie within the largest UDP payload, 65527 bytes.
    const MAX_OFFSET: u32 = 65_523;
    for offset in [0xFFF0_0000u32, 0xFFFF_F000, MAX_OFFSET + 1] {
        let e = ReuseportGroup::bind(
            "127.0.0.1:0".parse().unwrap(),
            2,
            Steering::Payload { offset },
            common::backend(Config::default()),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("steering offset {offset} is too large")),
            "{e}"
        );
    }
    ReuseportGroup::bind(
        "127.0.0.1:0".parse().unwrap(),
        2,
        Steering::Payload { offset: MAX_OFFSET },
        common::backend(Config::default()),
    )
    .unwrap();
}
