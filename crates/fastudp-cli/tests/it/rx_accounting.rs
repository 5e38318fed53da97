//! The receivers' accounting holds whatever arrives: `rx -v` follows each
//! sender's numbering apart, and `stream-rx` keeps state only for the
//! flows it expects.

use crate::common;

use common::{free_port, Running};
use serde_json::Value;
use std::net::UdpSocket;
use std::time::Duration;

fn parse(e: &common::Ended) -> Value {
    assert!(
        e.status.success(),
        "stdout: {}\nstderr: {}",
        e.stdout,
        e.stderr
    );
    serde_json::from_str(&e.stdout).expect("valid JSON")
}

/// Waits until something has bound `port` on 127.0.0.1.
fn wait_bound(port: u16) {
    let start = std::time::Instant::now();
    while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
        assert!(start.elapsed() < common::STALL, "port {port} never bound");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn rx_v_follows_two_senders_apart() {
    let port = free_port();
    let rx = Running::start(&[
        "rx",
        "-p",
        &port.to_string(),
        "-v",
        "--json",
        "-q",
        "--idle",
        "0.5",
    ]);
    wait_bound(port);
    // Both count from 0, interleaved. One skips 3 numbers, the other 5 and
    // sends one twice.
    let (a, b) = (
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    );
    let d = |seq: u64| {
        let mut v = seq.to_le_bytes().to_vec();
        v.resize(100, 7);
        v
    };
    for seq in 0u64..2000 {
        if ![100, 900, 1500].contains(&seq) {
            a.send_to(&d(seq), ("127.0.0.1", port)).unwrap();
        }
        if ![1, 2, 3, 1000, 1998].contains(&seq) {
            b.send_to(&d(seq), ("127.0.0.1", port)).unwrap();
        }
        if seq == 50 {
            b.send_to(&d(seq), ("127.0.0.1", port)).unwrap();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let v = parse(&rx.finish());
    assert_eq!(v["datagrams"], 1997 + 1995 + 1, "{v}");
    assert_eq!(v["lost"], 8, "{v}");
    assert_eq!(v["duplicates"], 1, "{v}");
    assert_eq!(v["reordered"], 0, "{v}");
    assert_eq!(v["unsequenced"], 0, "{v}");
    let senders = v["senders"].as_array().unwrap();
    assert_eq!(senders.len(), 2, "{v}");
    let port_of = |s: &UdpSocket| s.local_addr().unwrap().port();
    for (sock, lost, dups) in [(&a, 3, 0), (&b, 5, 1)] {
        let s = senders
            .iter()
            .find(|s| {
                s["source"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!(":{}", port_of(sock)))
            })
            .unwrap_or_else(|| panic!("sender {} missing: {v}", port_of(sock)));
        assert_eq!(s["lost"], lost, "{s}");
        assert_eq!(s["duplicates"], dups, "{s}");
    }
}

#[test]
fn rx_v_with_two_fastudp_senders_sees_no_duplicates() {
    let port = free_port();
    let rx = Running::start(&[
        "rx",
        "-p",
        &port.to_string(),
        "-v",
        "--json",
        "-q",
        "--idle",
        "1",
    ]);
    wait_bound(port);
    let p = port.to_string();
    let args = ["tx", "-D", "127.0.0.1", "-p", &p, "-l", "1", "--json", "-q"];
    let (t1, t2) = (Running::start(&args), Running::start(&args));
    let mut sent = 0;
    for t in [t1, t2] {
        let v = parse(&t.finish());
        sent += v["datagrams"].as_u64().unwrap();
    }
    let v = parse(&rx.finish());
    // The loopback may drop what the receiver cannot keep up with; that is
    // loss, never duplicates.
    assert_eq!(v["duplicates"], 0, "{v}");
    assert_eq!(v["late"], 0, "{v}");
    assert_eq!(v["unsequenced"], 0, "{v}");
    let senders = v["senders"].as_array().unwrap();
    assert_eq!(senders.len(), 2, "{v}");
    let accounted: u64 = senders
        .iter()
        .map(|s| s["received"].as_u64().unwrap() + s["lost"].as_u64().unwrap())
        .sum();
    assert!(
        accounted <= sent,
        "{accounted} accounted of {sent} sent: {v}"
    );
    assert!(senders.iter().all(|s| s["received"].as_u64().unwrap() > 0));
}

#[test]
fn stream_rx_counts_forged_flow_ids_as_foreign() {
    let port = free_port();
    let p = port.to_string();
    let rx = Running::start(&[
        "stream-rx",
        "--bind",
        "127.0.0.1",
        "--port",
        &p,
        "--flows",
        "4",
        "--rate",
        "20k",
        "--idle",
        "1",
        "--json",
    ]);
    wait_bound(port);
    // Datagrams with the stream's header, random flow ids (some in range)
    // and random sequence numbers, from a stranger.
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rand = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut out_of_range, forged) = (0u64, 3000u64);
    for i in 0..forged {
        let flow = if i % 10 == 0 {
            (i % 4) as u32
        } else {
            rand() as u32 | 4
        };
        out_of_range += u64::from(flow >= 4);
        let mut d = flow.to_be_bytes().to_vec();
        d.extend_from_slice(&(rand() | 1 << 62).to_le_bytes());
        d.push(2);
        d.extend_from_slice(b"FUs");
        d.resize(200, 0);
        s.send_to(&d, ("127.0.0.1", port)).unwrap();
        if i % 20 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let tx = Running::start(&[
        "stream",
        "--port",
        &p,
        "--flows",
        "4",
        "--rate",
        "20k",
        "--duration",
        "1.5",
        "--json",
    ]);
    parse(&tx.finish());
    let v = parse(&rx.finish());
    assert_eq!(v["flows"], 4, "only the 4 flows in range: {v}");
    assert_eq!(v["foreign"], forged, "{v}");
    assert_eq!(v["out_of_range"], out_of_range, "{v}");
    assert!(v["loss"].as_f64().unwrap() < 0.01, "{v}");
    assert_eq!(v["duplicates"], 0, "{v}");
}

/// A receiver that falls behind (here: stopped while a burst arrives)
/// loses datagrams at its socket's full buffer; `rx` reports the kernel's
/// drops and says what to do: pace the sender, a larger buffer, or GRO.
#[test]
fn rx_explains_loss_from_a_full_receive_buffer() {
    let port = free_port();
    let rx = Running::start(&["rx", "-p", &port.to_string(), "-q", "--idle", "1"]);
    wait_bound(port);
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &rx.pid().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig}");
    };
    // Stopped, it reads nothing: 40,000 datagrams of 1400 bytes (56 MB)
    // cannot all fit its buffer (8 MB asked for, at most twice that).
    signal("-STOP");
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let d = vec![7u8; 1400];
    for _ in 0..40_000 {
        // The sender's own buffer may fill for a moment: retry, never drop.
        while s.send_to(&d, ("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    signal("-CONT");
    let e = rx.finish();
    assert!(e.status.success(), "{}\n{}", e.stdout, e.stderr);
    assert!(
        e.stdout.contains("rx: the kernel dropped") && e.stdout.contains("receive buffer"),
        "{}",
        e.stdout
    );
    assert!(e.stdout.contains("fastudp tx -b RATE"), "{}", e.stdout);
    assert!(e.stdout.contains("net.core.rmem_max"), "{}", e.stdout);
    assert!(e.stdout.contains("fastudp rx -G"), "{}", e.stdout);
}
