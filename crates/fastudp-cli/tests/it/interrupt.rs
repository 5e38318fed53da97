//! Ctrl-C never throws results away: every command interrupted with
//! SIGINT prints what it did until then, says it was interrupted, and
//! exits with status 130.

use crate::common;

use common::{free_port, wait_for_datagram, wait_for_sigint_handler, Ended, Running};
use serde_json::Value;
use std::net::UdpSocket;

fn json(e: &Ended) -> Value {
    serde_json::from_str(&e.stdout)
        .unwrap_or_else(|err| panic!("not JSON ({err}): {}\nstderr: {}", e.stdout, e.stderr))
}

fn assert_interrupted(e: &Ended) {
    assert_eq!(
        e.status.code(),
        Some(130),
        "stdout: {}\nstderr: {}",
        e.stdout,
        e.stderr
    );
    assert!(e.stderr.contains("interrupted"), "{}", e.stderr);
    assert!(!e.stderr.contains("panicked"), "{}", e.stderr);
}

#[test]
fn tx_prints_its_summary_when_interrupted() {
    for fmt in ["--json", "-q"] {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sink.local_addr().unwrap().port().to_string();
        let tx = Running::start(&["tx", "-D", "127.0.0.1", "-p", &port, "-l", "600", fmt]);
        wait_for_datagram(&sink);
        tx.interrupt();
        let e = tx.finish();
        assert_interrupted(&e);
        if fmt == "--json" {
            let v = json(&e);
            assert_eq!(v["interrupted"], true, "{v}");
            assert!(v["datagrams"].as_u64().unwrap() > 0, "{v}");
            assert!(v["seconds"].as_f64().unwrap() < 600.0, "{v}");
        } else {
            assert!(e.stdout.contains("tx sendto: "), "{}", e.stdout);
            assert!(e.stdout.contains("tx: interrupted"), "{}", e.stdout);
        }
    }
}

/// `tx -C -R`: Ctrl-C asks the server to stop, and the client prints what
/// arrived and what the server sent, marked interrupted.
#[test]
fn a_reverse_client_prints_its_summary_when_interrupted() {
    let control = free_port().to_string();
    let mut srv = Running::start(&["rx", "--server", "--control-port", &control]);
    srv.wait_for_line(|l| l.contains("serving tests"));
    let mut tx = Running::start(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "-R",
        "--control-port",
        &control,
        "-l",
        "30",
        "-b",
        "10M",
    ]);
    tx.wait_for_line(|l| l.contains(" sends "));
    std::thread::sleep(std::time::Duration::from_millis(500));
    tx.interrupt();
    let e = tx.finish();
    assert_interrupted(&e);
    assert!(
        e.stdout.contains("reverse: the server sent"),
        "{}",
        e.stdout
    );
    assert!(e.stdout.contains("rx: interrupted"), "{}", e.stdout);
    srv.interrupt();
    let _ = srv.finish();
}

#[test]
fn stream_prints_its_summary_when_interrupted() {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port().to_string();
    let s = Running::start(&[
        "stream",
        "--port",
        &port,
        "--flows",
        "10",
        "--rate",
        "100k",
        "--duration",
        "600",
        "--json",
    ]);
    wait_for_datagram(&sink);
    s.interrupt();
    let e = s.finish();
    assert_interrupted(&e);
    let v = json(&e);
    assert_eq!(v["interrupted"], true, "{v}");
    assert_eq!(v["role"], "stream");
    assert!(v["bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["seconds"].as_f64().unwrap() < 600.0, "{v}");
}

#[test]
fn rx_and_stream_rx_print_their_summary_when_interrupted() {
    // rx: a plain sender's datagrams, then Ctrl-C long before --idle.
    let port = free_port();
    let mut rx = Running::start(&["rx", "-p", &port.to_string(), "-v", "--idle", "600"]);
    rx.wait_for_line(|l| l.starts_with("rx: listening"));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0u64..10 {
        s.send_to(&i.to_le_bytes(), ("127.0.0.1", port)).unwrap();
    }
    rx.wait_for_line(|l| l.starts_with("[rx"));
    rx.interrupt();
    let e = rx.finish();
    assert_interrupted(&e);
    assert!(e.stdout.contains("verified: 0 lost"), "{}", e.stdout);
    assert!(e.stdout.contains("rx: interrupted"), "{}", e.stdout);

    // stream-rx: two flows' datagrams in the stream's header. It prints
    // nothing before its summary: Ctrl-C comes a while after they were
    // sent, and if that was before it noticed them (a slow host), again
    // after a longer while.
    for attempt in 1..=5u32 {
        let port = free_port();
        let srx = Running::start(&[
            "stream-rx",
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--flows",
            "2",
            "--idle",
            "600",
            "--json",
        ]);
        wait_for_sigint_handler(srx.pid());
        // Bound once the port is taken.
        while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        for seq in 0u64..10 {
            for flow in 0u32..2 {
                let mut d = flow.to_be_bytes().to_vec();
                d.extend_from_slice(&seq.to_le_bytes());
                d.push(2);
                d.extend_from_slice(b"FUs");
                d.resize(100, 0);
                s.send_to(&d, ("127.0.0.1", port)).unwrap();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(500 * attempt as u64));
        srx.interrupt();
        let e = srx.finish();
        assert_interrupted(&e);
        if e.stderr.contains("before any stream arrived") {
            continue;
        }
        let v = json(&e);
        assert_eq!(v["interrupted"], true, "{v}");
        assert_eq!(v["flows"], 2, "{v}");
        assert_eq!(v["loss"], 0.0, "{v}");
        return;
    }
    panic!("stream-rx never noticed the stream before Ctrl-C");
}

/// The pairing a per-second line belongs to: `[sendto->gro-recvmmsg  ] ...`.
fn pair_of(line: &str) -> Option<&str> {
    line.strip_prefix('[')?.split(']').next().map(str::trim)
}

#[test]
fn bench_reports_the_runs_that_finished_when_interrupted() {
    let svg = std::env::temp_dir().join(format!("fastudp-interrupted-{}.svg", std::process::id()));
    let mut b = Running::start(&[
        "bench",
        "--tx",
        "sendto,sendmmsg,gso-cmsg",
        "--duration",
        "3",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    // Ctrl-C once the second pairing has printed a second of its run.
    b.wait_for_line(|l| pair_of(l).is_some_and(|p| p.starts_with("sendmmsg->")));
    b.interrupt();
    let e = b.finish();
    assert_interrupted(&e);
    let rows: Vec<&str> = e
        .stdout
        .lines()
        .filter(|l| {
            l.starts_with("sendto ") || l.starts_with("sendmmsg ") || l.starts_with("gso-cmsg ")
        })
        .collect();
    assert!(
        rows.first().is_some_and(|r| r.starts_with("sendto ")),
        "the first run's row: {}",
        e.stdout
    );
    let note = e
        .stdout
        .lines()
        .find(|l| l.starts_with("interrupted (Ctrl-C) during "))
        .unwrap_or_else(|| panic!("no line says it was interrupted: {}", e.stdout));
    // Normally the second; the third if the signal came late. The run it
    // cut short has no row.
    let during = note["interrupted (Ctrl-C) during ".len()..]
        .split(':')
        .next()
        .unwrap();
    let cut = during.split("->").next().unwrap();
    assert!(cut == "sendmmsg" || cut == "gso-cmsg", "{note}");
    assert!(
        !rows.iter().any(|r| r.starts_with(&format!("{cut} "))),
        "{}",
        e.stdout
    );
    let drawn = std::fs::read_to_string(&svg).expect("the chart of the finished runs");
    let _ = std::fs::remove_file(&svg);
    assert!(
        drawn.contains("sendto -&gt; gro-recvmmsg") || drawn.contains("sendto -> gro-recvmmsg")
    );
    assert!(drawn.contains("(interrupted)"));
}

#[test]
fn bench_json_of_the_runs_that_finished_when_interrupted() {
    // Nothing shows progress with --json: Ctrl-C comes after a wait, and
    // if that fell in the first run (a slow host), again with a longer one.
    let secs = 2.0;
    for attempt in 1..=5u32 {
        let b = Running::start(&[
            "bench",
            "--tx",
            "sendto,sendmmsg,gso-cmsg",
            "--duration",
            "2",
            "--json",
        ]);
        wait_for_sigint_handler(b.pid());
        std::thread::sleep(std::time::Duration::from_secs_f64(
            secs * attempt as f64 + 0.5,
        ));
        b.interrupt();
        let e = b.finish();
        if e.status.success() {
            // Every run finished before the signal: too late, wait less.
            panic!("the bench finished before Ctrl-C: {}", e.stdout);
        }
        assert_interrupted(&e);
        let v = json(&e);
        assert_eq!(v["interrupted"], true, "{v}");
        let results = v["results"].as_array().unwrap();
        if results.is_empty() {
            assert_eq!(v["interrupted_during"], "sendto->gro-recvmmsg", "{v}");
            continue;
        }
        assert_eq!(results[0]["tx"], "sendto", "{v}");
        assert!(results[0]["bytes"].as_u64().unwrap() > 0, "{v}");
        let during = v["interrupted_during"].as_str().unwrap();
        assert!(
            !results
                .iter()
                .any(|r| during.starts_with(&format!("{}->", r["tx"].as_str().unwrap()))),
            "the run cut short is not reported: {v}"
        );
        return;
    }
    panic!("Ctrl-C never landed after the first run");
}
