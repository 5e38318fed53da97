//! `fastudp tx` and `fastudp rx` end to end: bad input, any UDP peer on
//! the other side, and a receiver that is missing or goes away.

use crate::common;

use common::{assert_fails_with, assert_refused, fastudp, fastudp_json, free_port, spawn};
use serde_json::Value;

#[test]
fn tx_and_rx_bad_values_exit_2_with_one_clear_line() {
    assert_refused(&[
        (vec!["tx", "-D", "127.0.0.1", "-p", "0"], "-p 0"),
        (vec!["tx", "-D", "127.0.0.1", "-l", "1e-9"], "-l"),
        (vec!["rx", "-p", "0"], "-p 0"),
        (
            vec!["tx", "-D", "127.0.0.1", "-S", "1000", "-s", "1500"],
            "not a multiple",
        ),
        (vec!["tx", "-D", "127.0.0.1", "-t", "-S", "1000"], "-S"),
        (vec!["rx", "-t", "-G"], "-G"),
    ]);
}

#[test]
fn rx_counts_any_udp_sender_and_verifies_only_with_v() {
    let port = free_port();
    let rx = spawn(&[
        "rx",
        "-p",
        &port.to_string(),
        "--json",
        "-q",
        "--idle",
        "0.5",
        "-v",
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0u64..100 {
        let mut d = i.to_le_bytes().to_vec();
        d.extend_from_slice(b"plain sender");
        s.send_to(&d, ("127.0.0.1", port)).unwrap();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    s.send_to(b"hi", ("127.0.0.1", port)).unwrap();
    let o = rx.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["datagrams"], 101);
    assert_eq!(v["lost"], 0);
    assert_eq!(v["unsequenced"], 1);
    assert_eq!(v["duplicates"], 0);
}

#[test]
fn tx_interoperates_with_a_plain_receiver() {
    let r = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    r.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    let port = r.local_addr().unwrap().port().to_string();
    let v = fastudp_json(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-p",
        &port,
        "-l",
        "0.3",
        "-s",
        "300",
        "-q",
        "--json",
    ]);
    assert!(v["datagrams"].as_u64().unwrap() > 0);
    let mut buf = [0u8; 2048];
    let mut last = None;
    for _ in 0..50 {
        let (n, _) = r.recv_from(&mut buf).unwrap();
        assert_eq!(n, 300, "tx -s 300 sends 300-byte datagrams");
        let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
        if let Some(l) = last {
            assert!(seq > l, "sequence numbers increase: {l} then {seq}");
        }
        last = Some(seq);
    }
}

#[test]
fn tx_and_rx_errors_are_clear() {
    // Nothing listens: the destination does not answer, a runtime failure.
    let port = free_port().to_string();
    assert_fails_with(
        &["tx", "-D", "127.0.0.1", "-p", &port, "-l", "2", "-q"],
        1,
        &format!("127.0.0.1:{port} does not answer: nothing listens on that port"),
    );
    // GSO size beyond the path MTU, a family mismatch: usage errors.
    assert_fails_with(
        &["tx", "-D", "127.0.0.1", "-S", "70000"],
        2,
        "-S 70000: a GSO segment to 127.0.0.1:8000 must be 1 to ",
    );
    assert_fails_with(
        &["tx", "-4", "-D", "::1"],
        2,
        "-D ::1 is not an IPv4 address",
    );
    // A port already in use: the socket cannot be bound, a runtime failure.
    let busy = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let p = busy.local_addr().unwrap().port().to_string();
    let o = fastudp(&["rx", "-p", &p, "--wait", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("in use"), "{err}");
    // So is a TCP port in use.
    let busy = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let p = busy.local_addr().unwrap().port().to_string();
    assert_fails_with(
        &["rx", "-t", "-p", &p, "--wait", "1"],
        1,
        &format!("cannot listen on 0.0.0.0:{p}: "),
    );
    // Nothing arrives within --wait: a runtime failure.
    let p = free_port().to_string();
    assert_fails_with(
        &["rx", "-p", &p, "--wait", "0.3"],
        1,
        &format!("no datagram arrived on 0.0.0.0:{p} in 0.3 s"),
    );
    // Bad values are usage errors, each one line.
    assert_fails_with(
        &["tx", "-D", "127.0.0.1", "-p", "0"],
        2,
        "-p 0: give the destination port, 1 to 65535",
    );
    assert_fails_with(
        &["rx", "--wait", "0"],
        2,
        "--wait 0 is out of range: more than 0 and at most 86400",
    );
}

/// A batched sender (`-m`, with and without GSO) to a port where nothing
/// listens learns it from the ICMP errors on its error queue, and says so.
#[test]
fn a_batched_sender_notices_a_missing_receiver() {
    for extra in [&["-m"][..], &["-m", "-S", "1000", "-s", "8000"][..]] {
        let port = free_port().to_string();
        let mut args = vec!["tx", "-D", "127.0.0.1", "-p", &port, "-l", "5", "-q"];
        args.extend_from_slice(extra);
        let start = std::time::Instant::now();
        let o = fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("not there") || err.contains("stopped answering"),
            "{args:?}: {err}"
        );
        assert!(
            start.elapsed().as_secs() < 4,
            "noticed at once, not at the end"
        );
    }
}

#[test]
fn a_receiver_that_vanishes_ends_the_senders_run() {
    let port = free_port();
    let mut rx = spawn(&["rx", "-p", &port.to_string(), "-q"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let tx = spawn(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-l",
        "20",
        "-q",
    ]);
    std::thread::sleep(std::time::Duration::from_millis(800));
    rx.kill().unwrap();
    let _ = rx.wait();
    let start = std::time::Instant::now();
    let o = tx.wait_with_output().unwrap();
    // A stall guard, not a timing check: a busy machine is slow.
    assert!(start.elapsed() < common::STALL, "the sender hung");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("stopped answering"));
}
