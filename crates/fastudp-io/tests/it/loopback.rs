//! Loopback integrity: every send strategy into every receive strategy,
//! 100,000 mixed-size self-checking datagrams each.

use crate::common;
use common::*;
use fastudp_io::UdpIo;
use fastudp_io::{Config, RecvBatch, Socket, Transmit};
use std::net::SocketAddr;

const TOTAL: u64 = 100_000;
const G: usize = 1200;

fn pair(tx: TxMode, rx: RxMode, bind: &str) -> (Socket, Socket, SocketAddr) {
    let r = common::bind_with(bind.parse().unwrap(), rx_config(rx)).unwrap();
    let t = common::bind_with(bind.parse().unwrap(), tx_config(tx)).unwrap();
    let dest = r.as_std().local_addr().unwrap();
    (t, r, dest)
}

fn run_combo(tx: TxMode, rx: RxMode) {
    let (t, r, dest) = pair(tx, rx, "127.0.0.1:0");
    let gso_tx = matches!(tx, TxMode::Gso | TxMode::MmsgGso);
    if gso_tx && t.capabilities().max_gso_segments <= 1 {
        skip(format!("{tx:?}: the kernel has no UDP GSO"));
        return;
    }
    let res = transfer(
        t,
        r,
        dest,
        tx,
        TOTAL,
        G,
        fastudp_tools::wire::MAX_PAYLOAD_V4,
    );
    eprintln!("{tx:?} -> {rx:?}: {res:?}");
    assert_eq!(res.received + res.lost, TOTAL);
    // Each strategy really uses the syscalls it names.
    match tx {
        TxMode::Plain => assert_eq!(res.tx_calls, TOTAL, "one syscall per datagram"),
        TxMode::Mmsg => {
            assert_eq!(res.tx_messages, TOTAL, "one message per datagram");
            assert!(
                res.tx_calls * 8 < TOTAL,
                "sendmmsg batches: {} calls",
                res.tx_calls
            );
        }
        TxMode::Gso => {
            assert_eq!(res.tx_calls, res.tx_messages, "one train per syscall");
            assert!(
                res.tx_messages * 4 < TOTAL,
                "GSO trains: {} messages",
                res.tx_messages
            );
        }
        TxMode::MmsgGso => {
            assert!(
                res.tx_messages * 4 < TOTAL,
                "GSO trains: {} messages",
                res.tx_messages
            );
            assert!(
                res.tx_calls * 4 < res.tx_messages,
                "sendmmsg batches trains: {} calls",
                res.tx_calls
            );
        }
    }
    if rx == RxMode::Gro && gso_tx {
        assert!(
            res.rx_messages * 4 < TOTAL,
            "GRO delivers whole trains: {} messages",
            res.rx_messages
        );
    } else {
        assert_eq!(
            res.rx_messages, res.received,
            "without GRO each message is one datagram"
        );
    }
}

macro_rules! combos {
    ($($name:ident: $tx:ident, $rx:ident;)*) => {$(
        #[test]
        fn $name() { run_combo(TxMode::$tx, RxMode::$rx) }
    )*};
}

combos! {
    plain_to_recvmsg: Plain, Recvmsg;
    plain_to_recvmmsg: Plain, Recvmmsg;
    plain_to_gro: Plain, Gro;
    mmsg_to_recvmsg: Mmsg, Recvmsg;
    mmsg_to_recvmmsg: Mmsg, Recvmmsg;
    mmsg_to_gro: Mmsg, Gro;
    gso_to_recvmsg: Gso, Recvmsg;
    gso_to_recvmmsg: Gso, Recvmmsg;
    gso_to_gro: Gso, Gro;
    mmsg_gso_to_recvmsg: MmsgGso, Recvmsg;
    mmsg_gso_to_recvmmsg: MmsgGso, Recvmmsg;
    mmsg_gso_to_gro: MmsgGso, Gro;
}

#[test]
fn ipv6_gso_into_gro() {
    let (t, r, dest) = pair(TxMode::MmsgGso, RxMode::Gro, "[::1]:0");
    let res = transfer(
        t,
        r,
        dest,
        TxMode::MmsgGso,
        20_000,
        G,
        // Don't-fragment is on: the largest datagram is lo's MTU less the
        // IPv6 and UDP headers.
        fastudp_io::max_segment_for_mtu(65_536, true),
    );
    assert_eq!(res.received + res.lost, 20_000);
}

/// With don't-fragment (the default) a datagram over the path MTU is
/// refused with an error that names it; with `may_fragment` the kernel
/// fragments it and it arrives whole.
#[test]
fn datagram_over_the_mtu_is_refused_unless_fragmenting_is_allowed() {
    let rx = common::bind("[::1]:0".parse().unwrap()).unwrap();
    let dest = rx.as_std().local_addr().unwrap();
    let big = vec![6u8; fastudp_io::max_payload(true)];
    let df = common::bind("[::1]:0".parse().unwrap()).unwrap();
    assert!(df
        .capabilities()
        .supports(fastudp_io::Feature::DontFragment));
    match df.send(&[Transmit::new(dest, b"small"), Transmit::new(dest, &big)]) {
        Ok(s) => {
            assert_eq!(s.transmits, 1, "the small one went, the big one did not");
            match df.send(&[Transmit::new(dest, &big)]) {
                Err(e)
                    if e.kind() == fastudp_io::ErrorKind::ExceedsPathMtu
                        && e.transmit_index() == Some(0) =>
                {
                    let len = big.len();
                    assert!(
                        e.to_string().contains(&format!("datagram of {len} bytes")),
                        "{e}"
                    );
                    assert!(e.to_string().contains("MTU"), "{e}");
                }
                other => panic!("expected DatagramExceedsMtu, got {other:?}"),
            }
        }
        other => panic!("expected a short send, got {other:?}"),
    }
    let frag = common::bind_with(
        "[::1]:0".parse().unwrap(),
        Config::default().may_fragment(true),
    )
    .unwrap();
    assert!(!frag
        .capabilities()
        .supports(fastudp_io::Feature::DontFragment));
    assert_eq!(
        frag.send(&[Transmit::new(dest, &big)]).unwrap().transmits,
        1
    );
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(4);
    let mut lens = Vec::new();
    while lens.len() < 2 {
        rx.recv(&mut b).unwrap();
        lens.extend(b.datagrams().map(|(_, d)| d.len()));
    }
    assert_eq!(lens, vec![5, big.len()]);
}

#[test]
fn dual_stack_socket_serves_v4_mapped_peers() {
    let server = common::bind("[::]:0".parse().unwrap()).unwrap();
    let port = server.as_std().local_addr().unwrap().port();
    let client = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let payload = vec![5u8; 3000];
    let t = Transmit::train(to, &payload, 1000).with_ecn(Some(fastudp_io::EcnCodepoint::Ect0));
    assert_eq!(client.send(&[t]).unwrap().transmits, 1);
    server
        .as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(8);
    let mut n = 0;
    let mut from = None;
    while n < 3 {
        server.recv(&mut b).unwrap();
        for (m, d) in b.datagrams() {
            assert_eq!(d, &payload[..1000]);
            if server.capabilities().supports(fastudp_io::Feature::Pktinfo) {
                // IPv4 traffic on a dual-stack socket reports IP_PKTINFO.
                assert_eq!(m.destination, Some("127.0.0.1".parse().unwrap()));
            }
            if server.capabilities().supports(fastudp_io::Feature::Ecn) {
                assert_eq!(
                    m.ecn,
                    Some(fastudp_io::EcnCodepoint::Ect0),
                    "ECN mark survives"
                );
            }
            from = Some(m.source);
            n += 1;
        }
    }
    let from = from.unwrap();
    assert!(
        matches!(from, SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some()),
        "{from}"
    );
    // Reply both to the mapped address and to the plain IPv4 one.
    let reply = [9u8; 10];
    let plain: SocketAddr = format!("127.0.0.1:{}", from.port()).parse().unwrap();
    let sent = server
        .send(&[
            Transmit::new(from, &reply),
            Transmit::new(plain, &reply).with_ecn(Some(fastudp_io::EcnCodepoint::Ce)),
        ])
        .unwrap();
    assert_eq!(sent.transmits, 2);
    client
        .as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut got = 0;
    while got < 2 {
        client.recv(&mut b).unwrap();
        for (m, d) in b.datagrams() {
            assert_eq!(d, &reply);
            assert_eq!(m.source.port(), port);
            assert_eq!(m.destination, Some("127.0.0.1".parse().unwrap()));
            got += 1;
        }
    }
    assert!(
        server.stats().fallbacks.is_empty(),
        "{:?}",
        server.stats().fallbacks
    );
}

#[test]
fn source_address_via_pktinfo() {
    let r = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let t = common::bind("0.0.0.0:0".parse().unwrap()).unwrap();
    let dest = r.as_std().local_addr().unwrap();
    let tr = Transmit::new(dest, b"hello").with_src_ip(Some("127.0.0.5".parse().unwrap()));
    t.send(&[tr]).unwrap();
    r.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(4);
    r.recv(&mut b).unwrap();
    let (m, d) = b.get(0).unwrap();
    assert_eq!(d, b"hello");
    assert_eq!(
        m.source.ip(),
        "127.0.0.5".parse::<std::net::IpAddr>().unwrap()
    );
}

#[test]
fn truncation_is_reported_not_silent() {
    let r = common::bind_with("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    let t = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dest = r.as_std().local_addr().unwrap();
    t.send(&[Transmit::new(dest, &[1u8; 5000])]).unwrap();
    r.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::with_capacity(4, 1000).unwrap();
    r.recv(&mut b).unwrap();
    let (m, d) = b.get(0).unwrap();
    assert!(m.truncated);
    assert_eq!(d.len(), 1000);
    assert_eq!(r.stats().truncated, 1);
}

#[test]
fn coalescer_packs_equal_datagrams_into_trains() {
    let r = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let t = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    if t.capabilities().max_gso_segments <= 1 {
        skip("no GSO");
        return;
    }
    let dest = r.as_std().local_addr().unwrap();
    let mut c = fastudp_io::Coalescer::new();
    for i in 0..100u8 {
        assert_eq!(
            c.push(&t, dest, &[i; 1000], None, None).unwrap(),
            u64::from(i)
        );
    }
    assert_eq!(
        c.queued(),
        (100, 100usize.div_ceil(t.max_gso_segments().min(65)))
    );
    assert_eq!(c.flush(&t).unwrap(), 100);
    assert_eq!(t.stats().send_calls, 1, "all trains in one sendmmsg");
    assert!(
        c.push(&t, dest, &vec![0u8; 65_508], None, None).is_err(),
        "oversized payload is refused"
    );
    assert_eq!(c.queued(), (0, 0));
}

#[test]
fn truncated_gro_train_yields_only_whole_datagrams() {
    let rx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let tx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    if !rx.capabilities().supports(fastudp_io::Feature::Gro)
        || tx.capabilities().max_gso_segments <= 1
    {
        skip("needs GSO and GRO");
        return;
    }
    let dest = rx.as_std().local_addr().unwrap();
    let payload = vec![7u8; 10 * 1200];
    tx.send(&[Transmit::train(dest, &payload, 1200)]).unwrap();
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::with_capacity(8, 1500).unwrap();
    rx.recv(&mut b).unwrap();
    let (m, _) = b.get(0).unwrap();
    assert!(m.truncated, "the train did not fit");
    let lens: Vec<usize> = b.datagrams().map(|(_, d)| d.len()).collect();
    assert_eq!(
        lens,
        vec![1200],
        "no fragment of a datagram is handed out as one"
    );
    assert_eq!(rx.stats().truncated, 1);
}

#[test]
fn coalescer_refuses_what_the_socket_would_refuse() {
    let t = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let r = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut c = fastudp_io::Coalescer::new();
    c.push(&t, r.as_std().local_addr().unwrap(), b"fine", None, None)
        .unwrap();
    let e = c
        .push(&t, "[::1]:9".parse().unwrap(), b"wrong family", None, None)
        .unwrap_err();
    assert_eq!(e.kind(), fastudp_io::ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.transmit_index(), Some(1), "the datagram's number");
    assert!(
        e.to_string()
            .contains("is an IPv6 address but the socket is IPv4"),
        "{e}"
    );
    assert_eq!(c.queued().0, 1);
    assert_eq!(c.flush(&t).unwrap(), 1, "the queue is not blocked");
}

#[test]
fn a_refusal_gso_is_not_to_blame_for_leaves_gso_on() {
    let t = common::bind("[::1]:0".parse().unwrap()).unwrap();
    let r = common::bind("[::1]:0".parse().unwrap()).unwrap();
    if t.capabilities().max_gso_segments <= 1 {
        skip("no UDP GSO");
        return;
    }
    let payload = vec![1u8; 4000];
    let tr = Transmit::train(r.as_std().local_addr().unwrap(), &payload, 1000);
    // Not an address of this host: the kernel refuses the source, with or
    // without GSO.
    let tr = tr.with_src_ip(Some("2001:db8::1".parse().unwrap()));
    assert!(t.send(&[tr]).is_err());
    assert!(t.stats().fallbacks.is_empty(), "{:?}", t.stats().fallbacks);
    assert!(t.max_gso_segments() > 1, "GSO stays on");
}

/// An IPv4 socket cannot reach an IPv6 address, a v4-mapped one included
/// (the kernel answers `EAFNOSUPPORT` to a `sockaddr_in6` there): the send
/// is refused before any syscall with the typed address-family error,
/// naming the transmit, and nothing of the batch goes out.
#[test]
fn v4_mapped_destination_on_an_ipv4_socket_is_a_typed_error() {
    let t = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let r = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = r.as_std().local_addr().unwrap();
    let mapped = SocketAddr::new(
        std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().into(),
        to.port(),
    );
    let e = t
        .send(&[
            Transmit::new(to, b"first"),
            Transmit::new(mapped, b"mapped"),
        ])
        .unwrap_err();
    assert_eq!(e.kind(), fastudp_io::ErrorKind::InvalidTransmit, "{e}");
    assert_eq!(e.transmit_index(), Some(1), "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "transmit 1: {mapped} is an IPv6 address but the socket is IPv4"
        )),
        "{e}"
    );
    assert_eq!(t.stats().send_calls, 0, "nothing of the batch was sent");
    let mut c = fastudp_io::Coalescer::new();
    let e = c.push(&t, mapped, b"mapped", None, None).unwrap_err();
    assert_eq!(e.kind(), fastudp_io::ErrorKind::InvalidTransmit, "{e}");
    assert!(
        e.to_string()
            .contains("is an IPv6 address but the socket is IPv4"),
        "{e}"
    );
}

/// `Socket::wait_readable` times out on an empty socket and wakes for a
/// datagram; `Socket::unsent_bytes` is 0 once loopback has taken a send.
#[test]
fn wait_readable_and_unsent_bytes() {
    use std::time::{Duration, Instant};
    let r = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let t = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let t0 = Instant::now();
    assert!(!r.wait_readable(Duration::from_millis(20)).unwrap());
    assert!(t0.elapsed() >= Duration::from_millis(20));
    let dest = r.as_std().local_addr().unwrap();
    t.send(&[Transmit::new(dest, b"hello")]).unwrap();
    assert!(r.wait_readable(Duration::from_secs(5)).unwrap());
    // Loopback hands the datagram on within the send call.
    assert_eq!(t.unsent_bytes().unwrap(), 0);
    let mut b = RecvBatch::new(4);
    assert_eq!(r.recv(&mut b).unwrap(), 1);
    assert!(!r.wait_readable(Duration::ZERO).unwrap());
}

/// Any wait the configuration names is taken, however long: a train sent
/// one datagram at a time that stops half-way (here on the port-unreachable
/// errors of a closed port, more than the send absorbs) with
/// `split_wait(Duration::MAX)` reports what went out instead of
/// panicking on the deadline's arithmetic (`Instant + Duration::MAX`).
#[test]
fn the_longest_split_wait_is_no_panic() {
    let closed = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dest = closed.as_std().local_addr().unwrap();
    drop(closed);
    let t = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default()
            .disable([fastudp_io::Feature::Gso, fastudp_io::Feature::Mmsg])
            .split_wait(std::time::Duration::MAX)
            .gso_retry(std::time::Duration::MAX),
    )
    .unwrap();
    let payload = vec![7u8; 40 * 1000];
    let mut partial = false;
    for _ in 0..4 {
        match t.send(&[Transmit::train(dest, &payload, 1000)]) {
            Ok(s) => partial |= s.transmits == 0 && s.datagrams > 0,
            Err(e) => assert!(
                e.to_string().contains("refused"),
                "only the closed port's error: {e:?}"
            ),
        }
    }
    assert!(
        partial,
        "the test proved nothing: no train stopped half-way"
    );
}
