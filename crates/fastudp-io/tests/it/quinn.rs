//! quinn on fastudp: a quinn client and server on fastudp sockets transfer
//! bulk data with every byte checked, on loopback and across a veth pair
//! (`offload` and `wire` profiles), IPv4 and IPv6; ECN marks reach the
//! peer; a GSO fallback mid-connection and a receive buffer that overflows
//! do not stop the transfer.

use crate::common;
use crate::support::quic;
use fastudp_io::UdpIo;

use common::*;
use fastudp_io::quinn::Socket;
use fastudp_io::Config;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What one transfer saw.
struct Run {
    server: Arc<Socket>,
    client: Arc<Socket>,
    elapsed: Duration,
}

/// Transfers `bytes` from a client on `client` to a server on `server`
/// (both std sockets, bound), checking every byte; `during` runs on the
/// client socket once a third of the data is out.
fn transfer(
    server: std::net::UdpSocket,
    client: std::net::UdpSocket,
    server_cfg: Config,
    bytes: u64,
    during: impl FnOnce(&Socket) + Send + 'static,
) -> Run {
    let rt = runtime();
    rt.block_on(async move {
        let (cert, key) = quic::certificate();
        let server = Arc::new(
            Socket::try_from(fastudp_io::Socket::from_std(server, server_cfg).unwrap()).unwrap(),
        );
        let client = Arc::new(
            Socket::try_from(fastudp_io::Socket::from_std(client, Config::default()).unwrap())
                .unwrap(),
        );
        let addr = quinn::AsyncUdpSocket::local_addr(&*server).unwrap();
        let srv = quic::endpoint(server.clone(), Some(quic::server_config(cert.clone(), key)));
        let cli = quic::endpoint(client.clone(), None);
        let start = Instant::now();
        let served =
            tokio::spawn(async move { quic::check_connection(srv.accept().await.unwrap()).await });
        let conn = cli
            .connect_with(quic::client_config(cert), addr, quic::SERVER_NAME)
            .unwrap()
            .await
            .expect("handshake");
        let c2 = client.clone();
        let watcher = tokio::spawn({
            let conn = conn.clone();
            async move {
                loop {
                    if conn.stats().udp_tx.bytes >= bytes / 3 {
                        during(&c2);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(300), quic::send(&conn, 7, bytes))
            .await
            .expect("the transfer stalled");
        let got = served.await.expect("server");
        assert_eq!(got, bytes, "every byte arrived, checked");
        watcher.abort();
        Run {
            server,
            client,
            elapsed: start.elapsed(),
        }
    })
}

fn bound(addr: &str) -> std::net::UdpSocket {
    std::net::UdpSocket::bind(addr).unwrap()
}

fn report(what: &str, bytes: u64, r: &Run) {
    let s = r.server.stats();
    let c = r.client.stats();
    eprintln!(
        "{what}: {} MiB in {:.2?} ({:.0} MB/s); client sends {} ({} messages), server receives {} ({} messages, {} ECN-marked, {} drops), fallbacks {:?}",
        bytes >> 20,
        r.elapsed,
        bytes as f64 / r.elapsed.as_secs_f64() / 1e6,
        c.send_calls,
        c.send_messages,
        s.recv_calls,
        s.recv_messages,
        s.recv_ecn_marked,
        s.kernel_drops,
        c.fallbacks
    );
}

/// The server saw ECN marks on (nearly) every message: quinn marked them,
/// fastudp sent the marks and read them back, and quinn's ECN validation
/// kept them on.
fn assert_ecn(r: &Run) {
    let s = r.server.stats();
    if !r
        .client
        .state()
        .capabilities()
        .supports(fastudp_io::Feature::Ecn)
    {
        panic!(
            "ECN was turned off on the client: {:?}",
            r.client.stats().fallbacks
        );
    }
    assert!(
        s.recv_ecn_marked * 10 >= s.recv_messages * 9,
        "only {} of {} messages carried an ECN mark",
        s.recv_ecn_marked,
        s.recv_messages
    );
}

fn loopback(server: &str, client: &str) {
    let (srv, cli) = (bound(server), bound(client));
    let r = transfer(srv, cli, Config::default(), GIB, |_| {});
    report(server, GIB, &r);
    assert_ecn(&r);
    assert!(r.server.stats().recv_messages > 0);
}

#[test]
fn one_gib_over_loopback_v4() {
    loopback("127.0.0.1:0", "127.0.0.1:0");
}

#[test]
fn one_gib_over_loopback_v6() {
    loopback("[::1]:0", "[::1]:0");
}

/// 1 GiB across a veth pair, IPv4 then IPv6, with the sending veth set up
/// as `profile` says.
fn across_veth(tag: &str, n: u8, wire: bool) {
    if let Some(why) = netns_unavailable() {
        skip(format!("quinn across a veth ({tag}): {why}"));
        return;
    }
    let p = VethPair::new(tag, n);
    if wire {
        // The `wire` profile: trains are cut before the veth, as a NIC
        // without UDP segmentation offload cuts them.
        p.ethtool(&p.a, "-K tx-udp-segmentation off");
    }
    for (srv, cli) in [
        (
            SocketAddr::new(p.addr_b.into(), 0),
            SocketAddr::new(p.addr_a.into(), 0),
        ),
        (
            SocketAddr::new(p.addr6_b.into(), 0),
            SocketAddr::new(p.addr6_a.into(), 0),
        ),
    ] {
        let r = transfer(
            std_bind_in(&p.b, srv),
            std_bind_in(&p.a, cli),
            Config::default(),
            GIB,
            |_| {},
        );
        report(&format!("{tag} {srv}"), GIB, &r);
        assert_ecn(&r);
    }
}

#[test]
fn one_gib_across_a_veth_offload_profile_v4_and_v6() {
    across_veth("qoffl", 8, false);
}

#[test]
fn one_gib_across_a_veth_wire_profile_v4_and_v6() {
    across_veth("qwire", 9, true);
}

/// Waits (up to 5 s) until quinn is offered single datagrams, and returns
/// the segment count then.
fn segments_after_refusal(c: &Socket) -> usize {
    let start = Instant::now();
    while quinn::AsyncUdpSocket::max_transmit_segments(c) > 1
        && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    quinn::AsyncUdpSocket::max_transmit_segments(c)
}

/// The path starts refusing the client's GSO trains a third of the way
/// in; fastudp falls back, quinn sees `max_transmit_segments()` drop to 1,
/// and the transfer goes on to the last byte.
fn gso_fallback_mid_connection(
    srv: std::net::UdpSocket,
    cli: std::net::UdpSocket,
    what: &str,
    refuse: impl FnOnce(&Socket) + Send + 'static,
) {
    const BYTES: u64 = 256 << 20;
    let segments_after = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let seen = segments_after.clone();
    let r = transfer(srv, cli, Config::default(), BYTES, move |c| {
        refuse(c);
        seen.store(
            segments_after_refusal(c),
            std::sync::atomic::Ordering::Relaxed,
        );
    });
    report(&format!("gso fallback {what}"), BYTES, &r);
    let st = r.client.stats();
    assert!(!st.fallbacks.is_empty(), "GSO was never refused");
    assert_eq!(
        segments_after.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "quinn was still offered GSO trains after the fallback"
    );
}

/// IPv4 on loopback: `SO_NO_CHECK`, with which the kernel refuses GSO
/// sends (EINVAL) and still sends single datagrams.
#[test]
fn a_gso_fallback_mid_connection_does_not_stop_the_transfer_v4() {
    let probe =
        fastudp_io::Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
    if probe.capabilities().max_gso_segments <= 1 {
        skip("no GSO here");
        return;
    }
    gso_fallback_mid_connection(
        bound("127.0.0.1:0"),
        bound("127.0.0.1:0"),
        "v4 loopback",
        |c| {
            fastudp_tools::raw::set_option_int(
                &std::os::fd::AsFd::as_fd(c),
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                1,
            )
            .expect("SO_NO_CHECK");
        },
    );
}

/// IPv6 on loopback: `UDP_NO_CHECK6_TX` (101), with which the kernel
/// refuses GSO sends (EINVAL) and sends single datagrams with a zero
/// checksum, which the server accepts with `UDP_NO_CHECK6_RX` (102).
#[test]
fn a_gso_fallback_mid_connection_does_not_stop_the_transfer_v6() {
    let probe = fastudp_io::Socket::bind("[::1]:0".parse().unwrap(), Config::default()).unwrap();
    if probe.capabilities().max_gso_segments <= 1 {
        skip("no GSO here");
        return;
    }
    let srv = bound("[::1]:0");
    fastudp_tools::raw::set_option_int(&srv, libc::SOL_UDP, 102, 1).expect("UDP_NO_CHECK6_RX");
    gso_fallback_mid_connection(srv, bound("[::1]:0"), "v6 loopback", |c| {
        fastudp_tools::raw::set_option_int(&std::os::fd::AsFd::as_fd(c), libc::SOL_UDP, 101, 1)
            .expect("UDP_NO_CHECK6_TX");
    });
}

/// A server receive buffer of 16 KiB overflows under a bulk transfer: the
/// kernel drops, quinn recovers, every byte arrives.
fn receive_buffer_overflow(bind: &str) {
    const BYTES: u64 = 64 << 20;
    let (srv, cli) = (bound(bind), bound(bind));
    let r = transfer(
        srv,
        cli,
        Config::default().recv_buffer(16 << 10),
        BYTES,
        |_| {},
    );
    report(&format!("overflow {bind}"), BYTES, &r);
    assert!(
        r.server.stats().kernel_drops > 0,
        "the receive buffer never overflowed: the test proved nothing"
    );
}

#[test]
fn the_connection_survives_a_receive_buffer_that_overflows_v4() {
    receive_buffer_overflow("127.0.0.1:0");
}

#[test]
fn the_connection_survives_a_receive_buffer_that_overflows_v6() {
    receive_buffer_overflow("[::1]:0");
}

#[test]
fn quinn_is_told_what_the_socket_does() {
    let rt = runtime();
    rt.block_on(async {
        let s = Socket::bind("127.0.0.1:0".parse().unwrap(), Config::default()).unwrap();
        use quinn::AsyncUdpSocket;
        assert!(!s.may_fragment(), "don't-fragment is set by default");
        let gro = s.state().capabilities().supports(fastudp_io::Feature::Gro);
        assert_eq!(s.max_receive_segments(), if gro { 64 } else { 1 });
        assert_eq!(
            s.max_transmit_segments(),
            s.state().capabilities().max_gso_segments.max(1)
        );
        let f = Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().may_fragment(true),
        )
        .unwrap();
        assert!(f.may_fragment());
    });
}
