//! Departure times through the library: SCM_TXTIME reaches the kernel when
//! SO_TXTIME is on, and is refused clearly when it is not.

use crate::common;
use common::skip;
use fastudp_io::UdpIo;

use fastudp_io::pacing::{choose_mode, PacingMode};
use fastudp_io::{ErrorKind, RecvBatch, Socket, Transmit};
use fastudp_tools::pacing::Pacer;
use std::time::Duration;

#[test]
fn departure_time_without_so_txtime_is_a_clear_error() {
    let tx = Socket::bind(
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    )
    .unwrap();
    let t = Transmit::new("127.0.0.1:9".parse().unwrap(), b"x")
        .with_txtime(Some(fastudp_tools::os::monotonic_ns()));
    match tx.send(&[t]) {
        Err(e) if e.kind() == ErrorKind::Config && e.transmit_index() == Some(0) => {
            assert!(e.to_string().contains("SO_TXTIME is off"), "{e}");
            assert!(e.to_string().contains("enable_txtime"), "{e}")
        }
        other => panic!("expected a clear error, got {other:?}"),
    }
}

#[test]
fn paced_trains_with_scm_txtime_are_delivered() {
    let rx = Socket::bind(
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    )
    .unwrap();
    let tx = Socket::bind(
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    )
    .unwrap();
    if !tx.capabilities().supports(fastudp_io::Feature::Txtime) {
        skip("SO_TXTIME is not accepted here");
        return;
    }
    tx.enable_txtime(true).unwrap();
    // Loopback's qdisc (noqueue) ignores SO_TXTIME: the mode choice says so.
    let (mode, why) = choose_mode(PacingMode::Kernel, true, Some("noqueue"));
    assert_eq!(mode, PacingMode::User, "{why}");
    let dest = rx.as_std().local_addr().unwrap();
    let mut pacer = Pacer::new(10_000_000, Duration::from_millis(2), 16).unwrap();
    let payload = vec![3u8; 1200 * 16];
    let mut sent = 0;
    let now = fastudp_tools::os::monotonic_ns();
    for _ in 0..10 {
        let d = pacer.next(now, 1200, 16);
        let t =
            Transmit::train(dest, &payload[..d.segments * 1200], 1200).with_txtime(Some(d.at_ns));
        assert_eq!(tx.send(&[t]).unwrap().transmits, 1);
        sent += d.segments;
    }
    rx.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut b = RecvBatch::new(32);
    let mut got = 0;
    while got < sent {
        rx.recv(&mut b).unwrap();
        got += b.datagrams().count();
    }
    assert_eq!(got, sent);
    let error = tx.recv_error().unwrap();
    assert!(error.is_none(), "{error:?}");
}

#[test]
fn max_pacing_rate_on_a_connected_socket() {
    let rx = Socket::bind(
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    )
    .unwrap();
    let tx = Socket::bind(
        "127.0.0.1:0".parse().unwrap(),
        fastudp_io::Config::default(),
    )
    .unwrap();
    let e = tx.set_max_pacing_rate(1_000_000).unwrap_err();
    assert!(e.to_string().contains("connect"), "{e}");
    tx.as_std()
        .connect(rx.as_std().local_addr().unwrap())
        .unwrap();
    assert!(tx.set_max_pacing_rate(0).is_err());
    tx.set_max_pacing_rate(1_000_000).unwrap();
    assert_eq!(
        fastudp_tools::os::max_pacing_rate(tx.as_std()).unwrap(),
        1_000_000
    );
}

/// `set_timer_slack` is accepted by the kernel (only the thread group's
/// leader shows its slack in /proc, so the value is not read back here).
#[test]
fn timer_slack_is_accepted() {
    std::thread::spawn(|| fastudp_io::pacing::set_timer_slack(1_000).unwrap())
        .join()
        .unwrap();
}
