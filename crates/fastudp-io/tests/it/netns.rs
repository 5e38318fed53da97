//! Real kernel paths through a veth pair between two network namespaces.
//! These need root, `ip` and `ethtool`; without them they skip and say why.

use crate::common;
use common::*;
use fastudp_io::UdpIo;
use fastudp_io::{Config, Feature, RecvBatch, Socket, Transmit};
use fastudp_test_support as skip_check;
use std::net::SocketAddr;

fn sockets(p: &VethPair, rx_gro: bool) -> (Socket, Socket, SocketAddr) {
    let rc = rx_config(if rx_gro {
        RxMode::Gro
    } else {
        RxMode::Recvmmsg
    });
    let rc = rc.recv_buffer(8 << 20);
    let rx = p.bind(&p.b, SocketAddr::new(p.addr_b.into(), 0), rc);
    let tx = p.bind(&p.a, SocketAddr::new(p.addr_a.into(), 0), Config::default());
    let dest = rx.as_std().local_addr().unwrap();
    (tx, rx, dest)
}

/// Without tx checksum offload, kernels before 6.11 refuse a GSO send
/// with EIO; newer ones ("udp: Allow GSO transmit from devices with no
/// checksum offload") checksum in software instead. Either way every
/// datagram must arrive intact, and a refusal must be a counted fallback.
#[test]
fn gso_on_a_path_without_checksum_offload() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("nocsum", 1);
    p.ethtool(&p.a, "-K tx off");
    let (tx, rx, dest) = sockets(&p, true);
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no UDP GSO");
        return;
    }
    let res = transfer_on(Some(&p), tx, rx, dest, TxMode::MmsgGso, 20_000, 1200, 1472);
    assert_eq!(res.received + res.lost, 20_000, "{res:?}");
    if res.tx_fallbacks == 1 {
        eprintln!("the kernel refused GSO without checksum offload (EIO); fell back: {res:?}");
        assert!(res.resent_unsegmented > 0);
    } else {
        eprintln!("the kernel accepted GSO without checksum offload (software checksums): {res:?}");
        assert_eq!(res.tx_fallbacks, 0);
    }
}

/// A path whose kernel refuses every GSO send: with SO_NO_CHECK set, the
/// kernel answers EINVAL to any UDP_SEGMENT send (udp_send_skb), as some
/// drivers and old kernels do. The library must turn GSO off at the first
/// refusal, resend those datagrams one by one at once, report it, and lose
/// nothing over a whole stream.
#[test]
fn gso_refused_by_the_kernel_falls_back_without_loss() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("refuse", 4);
    let (tx, rx, dest) = sockets(&p, true);
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no UDP GSO");
        return;
    }
    set_no_check(&tx, true);
    let probe = vec![0u8; 4000];
    tx.send(&[Transmit::train(dest, &probe, 1000)])
        .expect("fallback send");
    let s = tx.stats();
    assert_eq!(s.fallbacks.len(), 1, "{:?}", s.fallbacks);
    let ev = &s.fallbacks[0];
    assert_eq!(ev.feature, Feature::Gso);
    assert_eq!(ev.errno, Some(EINVAL), "{}", ev.reason);
    assert!(ev.reason.contains("GSO"), "{}", ev.reason);
    assert_eq!(s.resent_unsegmented, 4);
    assert_eq!(tx.max_gso_segments(), 1, "GSO is off for this socket now");
    let mut b = fastudp_io::RecvBatch::new(8);
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut n = 0;
    while n < 4 {
        rx.recv(&mut b).unwrap();
        n += b
            .datagrams()
            .map(|(_, d)| assert_eq!(d, &probe[..1000]))
            .count();
    }
    // A fresh socket meets the refusal in the middle of a real stream.
    let tx2 = p.bind(&p.a, SocketAddr::new(p.addr_a.into(), 0), Config::default());
    set_no_check(&tx2, true);
    let res = transfer_on(Some(&p), tx2, rx, dest, TxMode::MmsgGso, 20_000, 1200, 1472);
    assert_eq!(res.received + res.lost, 20_000, "{res:?}");
    assert!(res.resent_unsegmented > 0);
    // One fallback; or two when the first refused train had a shorter last
    // datagram, which first turns only such trains into datagrams (the
    // Linux 6.6.44 case) until a uniform train is refused too; and one more
    // for each time GSO was tried again (after Config::gso_retry, 1 s: a
    // slow run on a busy host outlasts it).
    let most = 2 + res.tx_gso_retries as usize;
    assert!(
        (1..=most).contains(&res.tx_fallbacks),
        "{} fallbacks, {} retries",
        res.tx_fallbacks,
        res.tx_gso_retries
    );
}

const EINVAL: i32 = 22;

/// With tx-udp-segmentation off on the veth, the GSO layer cuts trains into
/// datagrams before the veth; a GRO receiver still gets every one intact.
#[test]
fn gro_receiver_through_a_cutting_veth() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("wire", 2);
    p.ethtool(&p.a, "-K tx-udp-segmentation off");
    let (tx, rx, dest) = sockets(&p, true);
    let res = transfer_on(Some(&p), tx, rx, dest, TxMode::MmsgGso, 50_000, 1200, 1472);
    assert_eq!(res.received + res.lost, 50_000, "{res:?}");
    assert_eq!(
        res.tx_fallbacks, 0,
        "segmentation before the veth is not a failure"
    );
}

/// Across an offloading veth the GSO train reaches the GRO socket whole.
#[test]
fn gso_train_crosses_an_offloading_veth_whole() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("offl", 3);
    let (tx, rx, dest) = sockets(&p, true);
    let res = transfer_on(Some(&p), tx, rx, dest, TxMode::MmsgGso, 50_000, 1200, 1472);
    assert_eq!(res.received + res.lost, 50_000, "{res:?}");
    assert!(res.rx_messages * 4 < res.received, "{res:?}");
}

/// Through a slow qdisc with a small send buffer, a non-blocking socket
/// runs out of buffer: `send` must report exactly which transmits went out,
/// so that retrying the rest delivers each datagram once.
#[test]
fn partial_sends_are_reported_exactly() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("partial", 5);
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 50mbit burst 16kb limit 20mb",
        p.a
    ));
    let (_, rx, dest) = sockets(&p, true);
    let tx_cfg = Config::default().send_buffer(64 * 1024);
    let tx = p.bind(&p.a, SocketAddr::new(p.addr_a.into(), 0), tx_cfg);
    tx.as_std().set_nonblocking(true).unwrap();
    const TRAINS: usize = 400;
    const SEGS: usize = 5;
    const SEG: usize = 1000;
    let bufs = self_checking_trains(TRAINS, SEGS, SEG);
    let ts: Vec<Transmit<'_>> = bufs.iter().map(|b| Transmit::train(dest, b, SEG)).collect();
    let mut next = 0;
    let (mut short, mut blocked) = (0, 0);
    let start = std::time::Instant::now();
    while next < TRAINS {
        assert!(start.elapsed().as_secs() < 30, "sending stalled at {next}");
        match tx.send(&ts[next..]) {
            Ok(s) => {
                let n = s.transmits;
                assert!(n >= 1 && n <= TRAINS - next);
                assert_eq!(s.datagrams, 0, "GSO trains go whole or not at all");
                if n < TRAINS - next {
                    short += 1;
                }
                next += n;
            }
            Err(e) if e.is_would_block() => {
                blocked += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => panic!("send failed: {e}"),
        }
    }
    eprintln!("short sends: {short}, would-block: {blocked}");
    assert!(
        short + blocked > 0,
        "the send buffer never filled: the test proved nothing"
    );
    receive_exactly(
        &rx,
        (TRAINS * SEGS) as u64,
        SEG,
        std::time::Duration::from_secs(3),
    );
}

/// With GSO off, trains go out one datagram at a time; through a slow
/// qdisc a train can end half sent. The caller learns exactly how much
/// (`Sent::datagrams`), resends only the rest, and every datagram arrives
/// exactly once.
#[test]
fn half_sent_trains_are_reported_exactly_and_resent_once() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("halftrain", 6);
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 50mbit burst 16kb limit 20mb",
        p.a
    ));
    // The receiver reads only after the sender is done: room for all of it.
    let rc = rx_config(RxMode::Gro).recv_buffer(64 << 20);
    let rx = p.bind(&p.b, SocketAddr::new(p.addr_b.into(), 0), rc);
    let dest = rx.as_std().local_addr().unwrap();
    // A non-blocking socket never waits mid-train: half-sent trains are
    // what this test is about.
    let tx_cfg = Config::default()
        .send_buffer(32 * 1024)
        .disable([fastudp_io::Feature::Gso]);
    let tx = p.bind(&p.a, SocketAddr::new(p.addr_a.into(), 0), tx_cfg);
    tx.as_std().set_nonblocking(true).unwrap();
    const TRAINS: usize = 200;
    const SEGS: usize = 20;
    const SEG: usize = 1000;
    let bufs = self_checking_trains(TRAINS, SEGS, SEG);
    // (train, first datagram not yet sent)
    let (mut next, mut from) = (0usize, 0usize);
    let mut partials = 0;
    let start = std::time::Instant::now();
    while next < TRAINS {
        assert!(
            start.elapsed().as_secs() < 60,
            "sending stalled at train {next}"
        );
        let first = Transmit::train(dest, &bufs[next][from * SEG..], SEG);
        let rest: Vec<Transmit<'_>> = bufs[next + 1..]
            .iter()
            .map(|b| Transmit::train(dest, b, SEG))
            .collect();
        let mut ts = vec![first];
        ts.extend(rest);
        match tx.send(&ts) {
            Ok(s) if s.datagrams > 0 => {
                partials += 1;
                next += s.transmits;
                from = if s.transmits == 0 {
                    from + s.datagrams
                } else {
                    s.datagrams
                };
            }
            Ok(s) => {
                next += s.transmits;
                from = 0;
            }
            Err(e) if e.is_would_block() => std::thread::sleep(std::time::Duration::from_millis(1)),
            Err(e) => panic!("send failed: {e}"),
        }
    }
    eprintln!("partial trains: {partials}");
    assert!(
        partials > 0,
        "no train ended half sent: the test proved nothing"
    );
    receive_exactly(
        &rx,
        (TRAINS * SEGS) as u64,
        SEG,
        std::time::Duration::from_secs(5),
    );
}

/// Threads share a socket whose GSO keeps being refused, behind a slow
/// qdisc on a veth, so that the send buffer fills mid-train: trains are cut
/// half-way (which the test checks happened), and every datagram still
/// arrives exactly once.
#[test]
fn threads_sharing_a_socket_across_a_slow_veth_while_gso_flips_send_every_datagram_once() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("gsoflip", 6);
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 200mbit burst 32kb limit 20mb",
        p.a
    ));
    let rc = rx_config(RxMode::Gro).recv_buffer(64 << 20);
    let rx = p.bind(&p.b, SocketAddr::new(p.addr_b.into(), 0), rc);
    let tx_cfg = Config::default()
        .send_buffer(32 * 1024)
        .gso_retry(std::time::Duration::from_micros(200));
    let tx = p.bind(&p.a, SocketAddr::new(p.addr_a.into(), 0), tx_cfg);
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no GSO");
        return;
    }
    let r = threads_send_while_gso_flips(tx, rx, std::time::Duration::from_secs(10));
    assert!(
        r.fallbacks > 0,
        "GSO was never refused: the test proved nothing"
    );
    assert!(
        r.partials > 0,
        "no train was cut half-way: the test proved nothing"
    );
}

/// Three namespaces: `a` (the sender) and `b` (the receiver) joined
/// through a router `r` whose link to `b` has a 1280-byte MTU, in IPv4 and
/// IPv6. Removed on drop.
struct Routed {
    a: String,
    r: String,
    b: String,
}

impl Routed {
    fn new(tag: &str) -> Self {
        let (a, r, b) = (
            format!("fu-{tag}-a"),
            format!("fu-{tag}-r"),
            format!("fu-{tag}-b"),
        );
        for ns in [&a, &r, &b] {
            let _ = run(&format!("ip netns del {ns}"));
            must(&format!("ip netns add {ns}"));
            must(&format!("ip -n {ns} link set lo up"));
        }
        must(&format!(
            "ip -n {a} link add va1 type veth peer name vr1 netns {r}"
        ));
        must(&format!(
            "ip -n {r} link add vr2 type veth peer name vb2 netns {b}"
        ));
        must(&format!("ip -n {r} link set vr2 mtu 1280"));
        must(&format!("ip -n {b} link set vb2 mtu 1280"));
        for (ns, dev, v4, v6) in [
            (&a, "va1", "10.203.1.1/24", "fd03:1::1/64"),
            (&r, "vr1", "10.203.1.2/24", "fd03:1::2/64"),
            (&r, "vr2", "10.203.2.1/24", "fd03:2::1/64"),
            (&b, "vb2", "10.203.2.2/24", "fd03:2::2/64"),
        ] {
            must(&format!("ip -n {ns} addr add {v4} dev {dev}"));
            must(&format!("ip -n {ns} addr add {v6} dev {dev} nodad"));
            must(&format!("ip -n {ns} link set {dev} up"));
        }
        must(&format!("ip -n {a} route add default via 10.203.1.2"));
        must(&format!("ip -n {a} -6 route add default via fd03:1::2"));
        must(&format!("ip -n {b} route add default via 10.203.2.1"));
        must(&format!("ip -n {b} -6 route add default via fd03:2::1"));
        must(&format!(
            "ip netns exec {r} sysctl -qw net.ipv4.ip_forward=1"
        ));
        must(&format!(
            "ip netns exec {r} sysctl -qw net.ipv6.conf.all.forwarding=1"
        ));
        Routed { a, r, b }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        for ns in [&self.a, &self.r, &self.b] {
            let _ = run(&format!("ip netns del {ns}"));
        }
    }
}

/// A router on the way says "fragmentation needed" (IPv4) or "packet too
/// big" (IPv6) to a datagram with don't-fragment set: the sender's error
/// queue gives the MTU, the destination and the router.
fn packet_too_big_gives_the_mtu(v6: bool) {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let n = Routed::new(if v6 { "ptb6" } else { "ptb4" });
    let (a_ip, b_ip, router): (&str, &str, &str) = if v6 {
        ("[fd03:1::1]:0", "[fd03:2::2]:0", "fd03:1::2")
    } else {
        ("10.203.1.1:0", "10.203.2.2:0", "10.203.1.2")
    };
    let rx = bind_in(&n.b, b_ip.parse().unwrap(), Config::default());
    let tx = bind_in(&n.a, a_ip.parse().unwrap(), Config::default());
    let dest = rx.as_std().local_addr().unwrap();
    assert!(tx
        .capabilities()
        .supports(fastudp_io::Feature::DontFragment));
    // Fits the first hop (1500), not the second (1280).
    let big = vec![1u8; 1400];
    let mut found = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while found.is_none() && std::time::Instant::now() < deadline {
        tx.send(&[Transmit::new(dest, &big)]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        while let Some(e) = tx.recv_error().unwrap() {
            if e.kind() == fastudp_io::SocketErrorKind::PacketTooBig {
                found = Some(e);
            }
        }
    }
    let e = found.expect("no packet-too-big error arrived");
    assert_eq!(e.destination(), Some(dest), "{e:?}");
    assert_eq!(e.mtu(), Some(1280), "{e:?}");
    // Reported by the router, not raised by this host.
    assert_eq!(e.reporter(), Some(router.parse().unwrap()), "{e:?}");
    // A datagram that fits still goes, and arrives (the router may first
    // resolve the receiver's address: seconds on a busy host).
    tx.send(&[Transmit::new(dest, &big[..1200])]).unwrap();
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut b = fastudp_io::RecvBatch::new(4);
    rx.recv(&mut b).unwrap();
    assert_eq!(b.get(0).unwrap().1.len(), 1200);
}

#[test]
fn v4_fragmentation_needed_gives_the_mtu() {
    packet_too_big_gives_the_mtu(false)
}

#[test]
fn v6_packet_too_big_gives_the_mtu() {
    packet_too_big_gives_the_mtu(true)
}

/// The path MTU shrinks under a coalescer with trains queued: it is not
/// stuck. Each datagram that no longer fits is handed back once, named by
/// its number; the rest go; smaller datagrams pushed after go as trains.
#[test]
fn coalescer_survives_an_mtu_that_shrinks_mid_run() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("mtushrink", 7);
    let (tx, rx, dest) = sockets(&p, true);
    if tx.capabilities().max_gso_segments <= 1 {
        skip("no UDP GSO");
        return;
    }
    let mut c = fastudp_io::Coalescer::new();
    let mut data = Vec::new();
    // Before: 20 datagrams of 1472 bytes go as trains.
    for i in 0..20u64 {
        data.clear();
        fill(i, 1472, &mut data);
        c.push(&tx, dest, &data, None, None).unwrap();
    }
    assert_eq!(c.flush(&tx).unwrap(), 20);
    // 20 more queued (numbers 20..40) and 10 of 1200 bytes (40..50)...
    for i in 20..40u64 {
        data.clear();
        fill(i, 1472, &mut data);
        c.push(&tx, dest, &data, None, None).unwrap();
    }
    for i in 40..50u64 {
        data.clear();
        fill(i, 1200, &mut data);
        c.push(&tx, dest, &data, None, None).unwrap();
    }
    // ...then the MTU drops to 1280.
    must(&format!("ip -n {} link set va mtu 1280", p.a));
    let mut refused = Vec::new();
    let mut sent = 0;
    for _ in 0..100 {
        if c.queued().0 == 0 {
            break;
        }
        match c.flush(&tx) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == fastudp_io::ErrorKind::ExceedsPathMtu => {
                assert!(e.to_string().contains("datagram of 1472 bytes"), "{e}");
                refused.push(e.transmit_index().expect("names the datagram"));
            }
            Err(e) => panic!("flush: {e}"),
        }
    }
    assert_eq!(c.queued().0, 0, "the coalescer is stuck");
    assert_eq!(
        refused,
        (20..40).collect::<Vec<_>>(),
        "each named once, in order"
    );
    assert_eq!(sent, 10);
    assert!(c.mtu() <= 1472 + 28, "the MTU was lowered: {}", c.mtu());
    // After: 1200-byte datagrams go as GSO trains again.
    let calls = tx.stats().send_calls;
    for i in 50..80u64 {
        data.clear();
        fill(i, 1200, &mut data);
        c.push(&tx, dest, &data, None, None).unwrap();
    }
    assert_eq!(c.flush(&tx).unwrap(), 30);
    assert_eq!(tx.stats().send_calls, calls + 1, "one sendmmsg of trains");
    // The receiver sees 0..20 and 40..80, each once, intact.
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut b = fastudp_io::RecvBatch::new(32);
    while seen.len() < 60 {
        rx.recv(&mut b).unwrap();
        for (_, d) in b.datagrams() {
            let seq = u64::from_le_bytes(d[..8].try_into().unwrap());
            assert!(seen.insert(seq), "datagram {seq} twice");
        }
    }
    let want: std::collections::BTreeSet<u64> = (0..20).chain(40..80).collect();
    assert_eq!(seen, want);
}

/// One shape of burst offered to a full queue.
#[derive(Debug, Clone, Copy)]
enum Burst {
    /// Single datagrams, many per `sendmmsg`.
    Datagrams,
    /// GSO trains.
    Trains,
    /// Trains sent one datagram at a time (GSO off).
    Split,
}

/// Offers `burst` to the state's `send` on `sock` all at once, faster than
/// the qdisc drains, and checks what comes back: the call never fails
/// hard, every datagram is done (sent or dropped locally) once, the drops
/// are counted in `Sent` and `Stats`, and the receiver gets exactly the
/// datagrams reported sent. Returns the datagrams dropped locally.
fn offer_burst(
    p: &VethPair,
    rx: &Socket,
    dest: SocketAddr,
    burst: Burst,
    nonblocking: bool,
) -> usize {
    const SEG: usize = 1200;
    let (trains, segs) = match burst {
        Burst::Datagrams => (2000, 1),
        Burst::Trains | Burst::Split => (300, 8),
    };
    let mut cfg = Config::default().send_buffer(8 << 20);
    if matches!(burst, Burst::Split) {
        cfg = cfg.disable([fastudp_io::Feature::Gso]);
    }
    let sock = std_bind_in(&p.a, SocketAddr::new(p.addr_a.into(), 0));
    sock.set_nonblocking(nonblocking).unwrap();
    let state = common::state(&sock, cfg).unwrap();
    let bufs = self_checking_trains(trains, segs, SEG);
    let ts: Vec<Transmit<'_>> = bufs
        .iter()
        .map(|b| {
            if segs > 1 {
                Transmit::train(dest, b, SEG)
            } else {
                Transmit::new(dest, b)
            }
        })
        .collect();
    let total = trains * segs;
    let (mut k, mut skip) = (0, 0);
    let (mut done, mut dropped, mut blocked) = (0, 0, 0);
    let start = std::time::Instant::now();
    while k < trains {
        assert!(start.elapsed().as_secs() < 30, "{burst:?}: stalled at {k}");
        let rest = [ts[k].skip_datagrams(skip)];
        let offered: &[Transmit<'_>] = if skip > 0 { &rest } else { &ts[k..] };
        match (&state, &sock).send(offered) {
            Ok(s) => {
                // Datagrams done: those of the whole transmits, plus the
                // first `datagrams` of the next one.
                let n = offered[..s.transmits]
                    .iter()
                    .map(Transmit::segments)
                    .sum::<usize>()
                    + s.datagrams;
                assert!(s.dropped_locally <= n);
                done += n;
                dropped += s.dropped_locally;
                if s.transmits > 0 {
                    (k, skip) = (k + s.transmits, 0);
                }
                skip += s.datagrams;
            }
            Err(e) if e.is_would_block() && nonblocking => {
                blocked += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => panic!("{burst:?} (non-blocking: {nonblocking}): send failed: {e}"),
        }
    }
    // Under FASTUDP_BACKEND=uring (see .ci/run) the sends went through the
    // ring, whose chains stop at a drop as sendmmsg does.
    #[cfg(all(feature = "uring", target_os = "linux"))]
    if common::uring_run() && fastudp_io::uring::probe().why_not().is_none() {
        let u = state
            .uring_stats()
            .expect("FASTUDP_BACKEND=uring but the state has no ring");
        assert!(u.send_sqes > 0, "nothing went through the ring: {u:?}");
    }
    let stats = (&state, &sock).stats();
    eprintln!(
        "{burst:?} (non-blocking: {nonblocking}): offered {total}, dropped locally {dropped}, would-block {blocked}, {} send calls",
        stats.send_calls
    );
    assert_eq!(
        done, total,
        "{burst:?}: every datagram is done exactly once"
    );
    assert_eq!(
        stats.dropped_locally, dropped as u64,
        "{burst:?}: Stats and Sent agree"
    );
    assert!(
        dropped > 0,
        "{burst:?}: the queue never overflowed: the test proved nothing"
    );
    assert!(dropped < total, "{burst:?}: nothing was sent");
    // What was reported sent arrives, once each; what was reported dropped
    // does not.
    let sent = (total - dropped) as u64;
    let mut checker = Checker::uniform(total as u64, SEG);
    let mut b = RecvBatch::new(64);
    rx.as_std()
        .set_read_timeout(Some(std::time::Duration::from_millis(1500)))
        .unwrap();
    while checker.received < sent {
        match rx.recv(&mut b) {
            Ok(_) => b.datagrams().for_each(|(_, d)| checker.check(d)),
            Err(_) => break,
        }
    }
    let drops = rx.stats().kernel_drops;
    assert_eq!(
        checker.received + drops,
        sent,
        "{burst:?}: {sent} reported sent, {} received, {drops} dropped by the receiver",
        checker.received
    );
    dropped
}

/// A full local qdisc makes the kernel answer `ENOBUFS` (fastudp sets
/// `IP_RECVERR`). A burst larger than the queue never fails the send: the
/// datagrams the queue dropped are reported in `Sent::dropped_locally` and
/// `Stats`, and sent plus dropped is what was offered.
fn full_qdisc(tag: &str, n: u8, nonblocking: bool) {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new(tag, n);
    // A bucket that passes a GSO train whole, and a 32 KiB queue behind it.
    must(&format!(
        "ip netns exec {} tc qdisc add dev va root tbf rate 20mbit burst 64kb limit 32kb",
        p.a
    ));
    let rc = rx_config(RxMode::Recvmmsg);
    let rc = rc.recv_buffer(16 << 20);
    let rx = p.bind(&p.b, SocketAddr::new(p.addr_b.into(), 0), rc);
    let dest = rx.as_std().local_addr().unwrap();
    for burst in [Burst::Datagrams, Burst::Trains, Burst::Split] {
        offer_burst(&p, &rx, dest, burst, nonblocking);
    }
    coalescer_burst(&p, &rx, dest, nonblocking);
    zerocopy_burst(&p, &rx, dest, nonblocking);
}

/// The same through the coalescer: pushes and flushes never fail, the
/// queue empties, and the receiver gets exactly the datagrams not counted
/// dropped. (A push that finds the queue full flushes it itself, and does
/// not say how many went: `flush`'s own counts are a part of the sends.)
fn coalescer_burst(p: &VethPair, rx: &Socket, dest: SocketAddr, nonblocking: bool) {
    const SEG: usize = 1200;
    const N: usize = 2000;
    let tx = p.bind(
        &p.a,
        SocketAddr::new(p.addr_a.into(), 0),
        Config::default().send_buffer(8 << 20),
    );
    tx.as_std().set_nonblocking(nonblocking).unwrap();
    let bufs = self_checking_trains(N, 1, SEG);
    let mut c = fastudp_io::Coalescer::new();
    let mut sent = 0;
    let start = std::time::Instant::now();
    for (i, b) in bufs.iter().enumerate() {
        // Alternate ECN marks: no two datagrams join one train, so no GSO
        // train is longer than the tbf's bucket (it would cut it, and drop
        // some of its datagrams without a word; see UdpState::send).
        let ecn = (i % 2 == 0).then_some(fastudp_io::EcnCodepoint::Ect0);
        loop {
            assert!(start.elapsed().as_secs() < 30, "coalescer: stalled at {i}");
            match c.push(&tx, dest, b, ecn, None) {
                Ok(_) => break,
                Err(e) if e.is_would_block() && nonblocking => {
                    sent += c
                        .flush(&tx)
                        .or_else(|e| if e.is_would_block() { Ok(0) } else { Err(e) })
                        .unwrap();
                }
                Err(e) => panic!("coalescer (non-blocking: {nonblocking}): push failed: {e}"),
            }
        }
    }
    while c.queued().0 > 0 {
        assert!(
            start.elapsed().as_secs() < 30,
            "coalescer: the flush stalled"
        );
        match c.flush(&tx) {
            Ok(n) => sent += n,
            Err(e) if e.is_would_block() && nonblocking => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("coalescer (non-blocking: {nonblocking}): flush failed: {e}"),
        }
    }
    let dropped = tx.stats().dropped_locally as usize;
    eprintln!(
        "coalescer (non-blocking: {nonblocking}): offered {N}, dropped locally {dropped}, {sent} sent by the caller's flushes"
    );
    assert!(
        dropped <= N && sent <= N - dropped,
        "coalescer: flush counted a dropped datagram as sent"
    );
    let sent = N - dropped;
    assert!(
        dropped > 0,
        "coalescer: the queue never overflowed: the test proved nothing"
    );
    let mut checker = Checker::uniform(N as u64, SEG);
    let mut b = RecvBatch::new(64);
    while checker.received < sent as u64 {
        match rx.recv(&mut b) {
            Ok(_) => b.datagrams().for_each(|(_, d)| checker.check(d)),
            Err(_) => break,
        }
    }
    let drops = rx.stats().kernel_drops;
    assert_eq!(
        checker.received + drops,
        sent as u64,
        "coalescer: {sent} reported sent, {} received, {drops} dropped by the receiver",
        checker.received
    );
}

/// A zerocopy sender as the burst below drives it: the `MSG_ZEROCOPY`
/// one and the io_uring `SENDMSG_ZC` one.
trait Zc {
    fn send(
        &mut self,
        s: &Socket,
        d: SocketAddr,
        b: Vec<u8>,
    ) -> Result<(), (fastudp_io::Error, Vec<u8>)>;
    fn wait(&mut self, s: &Socket);
    fn drain(&mut self, s: &Socket) -> usize;
    fn pop_done(&mut self) -> Option<Vec<u8>>;
    fn stats(&self) -> fastudp_io::ZeroCopyStats;
}

impl Zc for fastudp_io::ZeroCopySender {
    fn send(
        &mut self,
        s: &Socket,
        d: SocketAddr,
        b: Vec<u8>,
    ) -> Result<(), (fastudp_io::Error, Vec<u8>)> {
        fastudp_io::ZeroCopySender::send(self, s, d, b, None, fastudp_io::SendMeta::default())
    }
    fn wait(&mut self, s: &Socket) {
        fastudp_io::ZeroCopySender::wait(self, s, std::time::Duration::from_millis(10)).unwrap();
    }
    fn drain(&mut self, s: &Socket) -> usize {
        fastudp_io::ZeroCopySender::drain(self, s, std::time::Duration::from_secs(5)).unwrap()
    }
    fn pop_done(&mut self) -> Option<Vec<u8>> {
        fastudp_io::ZeroCopySender::pop_done(self)
    }
    fn stats(&self) -> fastudp_io::ZeroCopyStats {
        fastudp_io::ZeroCopySender::stats(self)
    }
}

#[cfg(all(feature = "uring", target_os = "linux"))]
impl Zc for fastudp_io::uring::UringZeroCopySender {
    fn send(
        &mut self,
        s: &Socket,
        d: SocketAddr,
        b: Vec<u8>,
    ) -> Result<(), (fastudp_io::Error, Vec<u8>)> {
        fastudp_io::uring::UringZeroCopySender::send(self, s, d, b, None)
    }
    fn wait(&mut self, _: &Socket) {
        fastudp_io::uring::UringZeroCopySender::wait(self, std::time::Duration::from_millis(10))
            .unwrap();
    }
    fn drain(&mut self, _: &Socket) -> usize {
        fastudp_io::uring::UringZeroCopySender::drain(self, std::time::Duration::from_secs(5))
            .unwrap()
    }
    fn pop_done(&mut self) -> Option<Vec<u8>> {
        fastudp_io::uring::UringZeroCopySender::pop_done(self)
    }
    fn stats(&self) -> fastudp_io::ZeroCopyStats {
        fastudp_io::uring::UringZeroCopySender::stats(self)
    }
}

/// The same burst through `MSG_ZEROCOPY`: a send the full queue dropped
/// used its completion id, so it is done (counted dropped), not the
/// optmem `ENOBUFS` that is retried; every buffer comes back once, and the
/// receiver gets exactly the sends reported sent.
fn zerocopy_burst(p: &VethPair, rx: &Socket, dest: SocketAddr, nonblocking: bool) {
    let bind = || {
        let tx = p.bind(
            &p.a,
            SocketAddr::new(p.addr_a.into(), 0),
            Config::default().send_buffer(8 << 20),
        );
        tx.as_std().set_nonblocking(nonblocking).unwrap();
        tx
    };
    let tx = bind();
    match fastudp_io::ZeroCopySender::new(&tx) {
        Ok(zc) => zc_burst(
            "zerocopy",
            &tx,
            &mut zc.adaptive(false),
            rx,
            dest,
            nonblocking,
        ),
        Err(e) => skip(format!("MSG_ZEROCOPY unavailable: {e}")),
    }
    #[cfg(all(feature = "uring", target_os = "linux"))]
    {
        let tx = bind();
        match fastudp_io::uring::UringZeroCopySender::new(&tx) {
            Ok(mut zc) => zc_burst("io_uring zerocopy", &tx, &mut zc, rx, dest, nonblocking),
            Err(e) => skip(format!("io_uring SENDMSG_ZC unavailable: {e}")),
        }
    }
}

fn zc_burst(
    name: &str,
    tx: &Socket,
    zc: &mut dyn Zc,
    rx: &Socket,
    dest: SocketAddr,
    nonblocking: bool,
) {
    const SEG: usize = 1200;
    const N: usize = 2000;
    let bufs = self_checking_trains(N, 1, SEG);
    let (mut next, mut blocked) = (0, 0);
    let start = std::time::Instant::now();
    let mut bufs = bufs.into_iter();
    let mut pending = bufs.next();
    while let Some(b) = pending.take() {
        assert!(start.elapsed().as_secs() < 30, "{name}: stalled at {next}");
        match zc.send(tx, dest, b) {
            Ok(()) => {
                next += 1;
                pending = bufs.next();
            }
            Err((e, b))
                if e.is_would_block()
                    || (e.kind() == fastudp_io::ErrorKind::Io
                        && e.io_error().and_then(std::io::Error::raw_os_error)
                            == Some(libc::ENOBUFS)) =>
            {
                // optmem exhausted, the socket or the ring full: reap and
                // retry.
                assert!(nonblocking, "{name}: a blocking send failed: {e}");
                blocked += 1;
                zc.wait(tx);
                pending = Some(b);
            }
            Err((e, _)) => panic!("{name} (non-blocking: {nonblocking}): send failed: {e}"),
        }
    }
    assert_eq!(zc.drain(tx), 0);
    let mut back = 0;
    while zc.pop_done().is_some() {
        back += 1;
    }
    let st = zc.stats();
    let dropped = st.dropped_locally as usize;
    eprintln!(
        "{name} (non-blocking: {nonblocking}): offered {N}, dropped locally {dropped}, optmem retries {}, would-block {blocked}",
        st.enobufs_retries
    );
    assert_eq!(back, N, "{name}: every buffer comes back once");
    assert_eq!(tx.stats().dropped_locally, dropped as u64, "{name}");
    assert!(
        dropped > 0,
        "{name}: the queue never overflowed: the test proved nothing"
    );
    let sent = (N - dropped) as u64;
    let mut checker = Checker::uniform(N as u64, SEG);
    let mut b = RecvBatch::new(64);
    while checker.received < sent {
        match rx.recv(&mut b) {
            Ok(_) => b.datagrams().for_each(|(_, d)| checker.check(d)),
            Err(_) => break,
        }
    }
    let drops = rx.stats().kernel_drops;
    assert_eq!(
        checker.received + drops,
        sent,
        "{name}: {sent} reported sent, {} received, {drops} dropped by the receiver",
        checker.received
    );
}

#[test]
fn full_qdisc_drops_are_reported_not_errors_blocking() {
    full_qdisc("qfullb", 12, false);
}

#[test]
fn full_qdisc_drops_are_reported_not_errors_nonblocking() {
    full_qdisc("qfulln", 13, true);
}

/// A namespace test that cannot run here says so where `cargo test`
/// shows it without `--nocapture` (not a silent `ok`), and fails under
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`. Shown by running one in a child
/// of this test binary with no `ip` or `ethtool` on its `PATH`.
#[test]
fn a_test_without_its_tools_says_so_and_fails_in_ci() {
    skip_check::skip_is_visible_and_fails_in_ci(
        "netns::gro_receiver_through_a_cutting_veth",
        "needs",
    );
}

/// Loss at a device is counted by the device alone: a receiving veth with
/// a smaller MTU than its peer drops the largest datagrams
/// (`is_skb_forwardable`), and only the veths' `tx_dropped`/`rx_dropped`
/// say so, not the socket nor the input backlog. The transfer's accounting
/// must find every lost datagram there, by name (it read only the socket's
/// and the backlog's counters, and called such a loss "0 drops").
#[test]
fn loss_at_a_veth_is_explained_by_its_counters() {
    if let Some(why) = netns_unavailable() {
        skip(why);
        return;
    }
    let p = VethPair::new("vdrop", 12);
    // 1450: the 1472-byte datagrams (one in a thousand) do not fit.
    must(&format!("ip -n {} link set vb mtu 1450", p.b));
    let (tx, rx, dest) = sockets(&p, false);
    let res = transfer_on(Some(&p), tx, rx, dest, TxMode::Mmsg, 20_000, 1200, 1472);
    assert!(
        res.lost > 0,
        "the smaller MTU dropped nothing: the test proved nothing: {res:?}"
    );
    assert_eq!(res.received + res.lost, 20_000, "{res:?}");
    assert_eq!(res.counters.socket, 0, "{res:?}");
    assert!(
        res.counters.veth_tx.max(res.counters.veth_rx) >= res.lost,
        "{res:?}"
    );
}
