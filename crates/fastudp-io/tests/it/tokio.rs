//! `fastudp_io::tokio::UdpSocket`: batched sends and receives on tokio's
//! reactor, exact readiness (an idle socket uses no CPU), and ICMP errors
//! returned rather than looped on.

use crate::common;

use common::*;
use fastudp_io::tokio::UdpSocket;
use fastudp_io::{Coalescer, Config, RecvBatch, SocketErrorKind, Transmit};
use std::net::SocketAddr;
use std::time::Duration;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A port that nobody listens on.
fn closed_port(addr: &str) -> SocketAddr {
    let s = std::net::UdpSocket::bind(addr).unwrap();
    s.local_addr().unwrap()
}

/// Receives until `total` self-checking datagrams of `seg` bytes arrived.
async fn receive_exactly_async(rx: &UdpSocket, total: u64, seg: usize) {
    let mut checker = Checker::uniform(total, seg);
    let mut b = RecvBatch::new(32);
    while checker.received < total {
        tokio::time::timeout(Duration::from_secs(5), rx.recv(&mut b))
            .await
            .unwrap_or_else(|_| panic!("only {} of {total} arrived", checker.received))
            .unwrap();
        for (_, d) in b.datagrams() {
            checker.check(d);
        }
    }
    checker.finish(0);
}

#[test]
fn trains_and_a_coalescer_through_a_small_send_buffer_arrive_exactly_once() {
    runtime().block_on(async {
        const TRAINS: usize = 400;
        const SEGS: usize = 10;
        const SEG: usize = 1200;
        let rx = UdpSocket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().recv_buffer(64 << 20),
        )
        .unwrap();
        let tx = UdpSocket::bind(
            "127.0.0.1:0".parse().unwrap(),
            Config::default().send_buffer(16 << 10),
        )
        .unwrap();
        let dest = rx.as_tokio().local_addr().unwrap();
        let bufs = self_checking_trains(TRAINS, SEGS, SEG);
        let ts: Vec<Transmit<'_>> = bufs.iter().map(|b| Transmit::train(dest, b, SEG)).collect();
        let total = (TRAINS * SEGS) as u64;
        let (sent, ()) = tokio::join!(tx.send_all(&ts), receive_exactly_async(&rx, total, SEG));
        assert_eq!(sent.unwrap(), TRAINS * SEGS);

        // The same datagrams again, one by one through a coalescer.
        let mut c = Coalescer::new();
        let send = async {
            let mut n = 0;
            for b in &bufs {
                for d in b.chunks(SEG) {
                    c.push(&tx, dest, d, None, None).or_else(|e| {
                        if e.is_would_block() {
                            Ok(u64::MAX)
                        } else {
                            Err(e)
                        }
                    })?;
                    if c.queued().0 >= 64 {
                        n += tx.flush(&mut c).await?;
                    }
                }
            }
            n += tx.flush(&mut c).await?;
            Ok::<usize, fastudp_io::Error>(n)
        };
        let (n, ()) = tokio::join!(send, receive_exactly_async(&rx, total, SEG));
        assert_eq!(n.unwrap(), TRAINS * SEGS);
    });
}

/// CPU time of this process.
/// CPU time of the calling thread: the other tests of this binary run in
/// the same process at the same time, so the process's clock would count
/// their work too.
fn cpu() -> Duration {
    fastudp_tools::os::thread_cpu_time()
}

/// On a runtime of the test's own thread (its I/O driver included), so
/// that a receive that spun would show in this thread's CPU time.
#[test]
fn an_idle_socket_uses_no_cpu() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let rx = std::sync::Arc::new(
                UdpSocket::bind(
                    "127.0.0.1:0".parse().unwrap(),
                    fastudp_io::Config::default(),
                )
                .unwrap(),
            );
            let waiter = {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let mut b = RecvBatch::new(32);
                    rx.recv(&mut b)
                        .await
                        .map(|_| b.get(0).map(|(_, d)| d.to_vec()))
                })
            };
            let errors = {
                let rx = rx.clone();
                tokio::spawn(async move { rx.recv_error().await })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = cpu();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let used = cpu() - before;
            // A receive that spun would burn the whole second.
            assert!(
                used < Duration::from_millis(200),
                "idle socket used {used:?} of CPU"
            );
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.send_to(b"wake", rx.as_tokio().local_addr().unwrap())
                .unwrap();
            let got = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("the datagram woke the receiver")
                .unwrap()
                .unwrap();
            assert_eq!(got.as_deref(), Some(&b"wake"[..]));
            errors.abort();
        });
}

#[test]
fn a_connected_socket_whose_peer_went_away_returns_the_error() {
    runtime().block_on(async {
        let gone = closed_port("127.0.0.1:0");
        let std = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        std.connect(gone).unwrap();
        let s = UdpSocket::try_from(fastudp_io::Socket::from_std(std, Config::default()).unwrap())
            .unwrap();
        s.send_all(&[Transmit::new(gone, b"anyone?")])
            .await
            .unwrap();
        let before = cpu();
        let mut b = RecvBatch::new(8);
        let r = tokio::time::timeout(Duration::from_secs(5), s.recv(&mut b))
            .await
            .expect("the receive returned instead of waiting or looping");
        let e = r.expect_err("the peer is gone");
        assert_eq!(
            e.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused),
            "{e}"
        );
        assert!(cpu() - before < Duration::from_millis(500));
    });
}

#[test]
fn an_unconnected_socket_reads_the_icmp_error_naming_the_destination() {
    for bind in ["127.0.0.1:0", "[::1]:0"] {
        runtime().block_on(async {
            let gone = closed_port(bind);
            let s = UdpSocket::bind(bind.parse().unwrap(), fastudp_io::Config::default()).unwrap();
            s.send_all(&[Transmit::new(gone, b"anyone?")])
                .await
                .unwrap();
            let e = tokio::time::timeout(Duration::from_secs(5), s.recv_error())
                .await
                .expect("the ICMP error was read")
                .unwrap();
            // Port unreachable (ICMP type 3 code 3, ICMPv6 type 1 code 4).
            let (errno, origin, ty, code, ..) = e.raw();
            assert_eq!(e.kind(), SocketErrorKind::Unreachable, "{e:?}");
            assert!(
                matches!((origin, ty, code), (2, 3, 3) | (3, 1, 4)),
                "expected port unreachable, got {e:?}"
            );
            assert_eq!(errno, libc::ECONNREFUSED);
            assert_eq!(e.destination(), Some(gone));
            // Receiving goes on: the error does not come back as a failure.
            let peer = std::net::UdpSocket::bind(bind).unwrap();
            peer.send_to(b"still here", s.as_tokio().local_addr().unwrap())
                .unwrap();
            let mut b = RecvBatch::new(8);
            tokio::time::timeout(Duration::from_secs(5), s.recv(&mut b))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(b.get(0).unwrap().1, b"still here");
        });
    }
}
