//! `fastudp stream` and `fastudp stream-rx` end to end: bad input, the
//! end of a run, and every flow at its rate.

use crate::common;

use common::{assert_refused, fastudp_json, free_port, spawn};
use serde_json::Value;

#[test]
fn stream_bad_input_exits_2() {
    assert_refused(&[
        (vec!["stream", "--flows", "0"], "--flows 0"),
        (vec!["stream", "--rate", "0"], "rate"),
        (vec!["stream", "--interval", "0"], "--interval"),
        (vec!["stream", "--flows", "200000"], "--ports"),
        (vec!["stream-rx", "--flows", "0"], "--flows 0"),
        (vec!["stream", "--max-burst", "0"], "--max-burst"),
        (
            vec![
                "stream",
                "--flows",
                "10",
                "--rate",
                "1M",
                "--total-rate",
                "5M",
            ],
            "--total-rate",
        ),
        (vec!["stream", "--total-rate", "fast"], "not a rate"),
        (vec!["stream", "--port", "0"], "--port 0"),
        (
            vec!["stream-rx", "--port", "65535", "--ports", "3"],
            "past port 65535",
        ),
        (vec!["stream-rx", "--per-flow", "/"], "is a directory"),
        (vec!["stream-rx", "--wait", "1e10"], "--wait"),
    ]);
}

/// Bad input is a usage error (status 2); a receiver that cannot listen,
/// or that no stream reaches, is a runtime failure (status 1). Each is
/// one line.
#[test]
fn usage_errors_exit_2_and_runtime_failures_exit_1_each_in_one_line() {
    let o = common::fastudp(&["stream", "--interval", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        "fastudp: error: --interval 0 ms is out of range: more than 0, at most 1000\n"
    );
    // A port that a socket outside the reuseport group holds.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = common::fastudp(&[
        "stream-rx",
        "--bind",
        "127.0.0.1",
        "--port",
        &port,
        "--wait",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "fastudp: error: cannot listen on 127.0.0.1:{port}: "
        )),
        "{err}"
    );
    drop(taken);
    // Nothing sends.
    let port = free_port().to_string();
    let o = common::fastudp(&["stream-rx", "--port", &port, "--wait", "0.3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err, "fastudp: error: no stream arrived in 0.3 s\n");
}

#[test]
fn stream_ends_on_time_when_departures_lie_beyond_the_run() {
    // One flow of 100 bytes/s: its second 1200-byte datagram is due 12 s
    // in. The run must still end after its 0.5 s, not wait for it (the
    // bound is generous: this checks for a hang, not for speed).
    // A receiver, so that the flow is not stopped as refused.
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port().to_string();
    for pacing in ["user", "none"] {
        let t = std::time::Instant::now();
        let v = fastudp_json(&[
            "stream",
            "--port",
            &port,
            "--flows",
            "1",
            "--rate",
            "100",
            "--duration",
            "0.5",
            "--pacing",
            pacing,
            "--json",
        ]);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{pacing}: {:?}",
            t.elapsed()
        );
        assert_eq!(v["seconds"], 0.5);
    }
}

#[test]
fn stream_reaches_every_flow_at_its_rate() {
    let port = free_port().to_string();
    let csv = std::env::temp_dir().join(format!("fastudp-flows-{}.csv", std::process::id()));
    let rx = spawn(&[
        "stream-rx",
        "--port",
        &port,
        "--flows",
        "300",
        "--rate",
        "20k",
        "--idle",
        "0.5",
        "--json",
        "--per-flow",
        csv.to_str().unwrap(),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Another sender's datagrams on the port, mid-stream: ignored, counted.
    let junk_to: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let junk = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..5u8 {
            s.send_to(&[i; 40], junk_to).unwrap();
        }
    });
    let tx = fastudp_json(&[
        "stream",
        "--port",
        &port,
        "--flows",
        "300",
        "--rate",
        "20k",
        "--duration",
        "1.5",
        "--pacing",
        "kernel",
        "--json",
    ]);
    let o = rx.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rx: Value = serde_json::from_slice(&o.stdout).unwrap();
    for v in [&tx, &rx] {
        for k in [
            "flows",
            "flows_within_5pct",
            "pacing",
            "cpu_ns_per_byte",
            "loss",
        ] {
            assert!(v.get(k).is_some(), "{k} missing in {v}");
        }
        let steal = v["host_steal"].as_f64().expect("host_steal on Linux");
        assert!((0.0..=1.0).contains(&steal), "{v}");
    }
    // Loopback's qdisc ignores SO_TXTIME: kernel pacing falls back, and says why.
    assert_eq!(tx["pacing"], "user");
    assert!(
        tx["pacing_reason"].as_str().unwrap().contains("SO_TXTIME"),
        "{tx}"
    );
    assert_eq!(rx["pacing"], "user");
    junk.join().unwrap();
    assert_eq!(rx["flows"], 300, "every flow arrived, and no junk flow");
    assert_eq!(rx["foreign"], 5, "{rx}");
    let per_flow = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let lines: Vec<&str> = per_flow.lines().collect();
    assert_eq!(
        lines[0],
        "flow,bytes,datagrams,rate_bytes_per_sec,lost,max_back_to_back"
    );
    assert_eq!(lines.len(), 301, "one line per flow");
    assert!(lines[1..].iter().all(|l| l.split(',').count() == 6));
    assert!(rx["loss"].as_f64().unwrap() < 0.01, "{rx}");
}

/// A port where nothing listens refuses the stream (ICMP port
/// unreachable, on the error queue): its flows stop and the summary says
/// so; when every port refuses, the run ends with status 1, not with
/// every flow "on rate".
#[test]
fn stream_to_a_port_where_nothing_listens_is_refused() {
    // Without zerocopy the refusal stops the flows at once; with it, the
    // refusals are read once the sends have completed, at the end.
    for zerocopy in [false, true] {
        let port = free_port().to_string();
        let mut args = vec![
            "stream",
            "--port",
            &port,
            "--flows",
            "20",
            "--rate",
            "100k",
            "--duration",
            "1",
            "--json",
        ];
        if zerocopy {
            args.push("--zerocopy");
        }
        let o = common::fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(
            err.lines().last(),
            Some(
                format!(
                    "fastudp: error: nothing listens at 127.0.0.1:{port}: every port refused the stream (ICMP port unreachable)"
                )
                .as_str()
            ),
            "{args:?}: {err}"
        );
        let v: Value = serde_json::from_slice(&o.stdout).expect("the summary comes first");
        assert_eq!(
            v["refused_ports"],
            serde_json::json!([port.parse::<u16>().unwrap()]),
            "{v}"
        );
        assert_eq!(v["refused_flows"], 20, "{v}");
        assert_eq!(v["flows_within_5pct"], 0.0, "{v}");
    }
}

/// Of two ports, the one with a receiver gets its flows; the other's
/// flows are stopped and reported.
#[test]
fn stream_stops_only_the_flows_whose_port_refused() {
    // Two adjacent ports: the first with a receiver, the second free.
    let (rx, port) = loop {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = rx.local_addr().unwrap().port();
        if p < 65_535 && std::net::UdpSocket::bind(("127.0.0.1", p + 1)).is_ok() {
            break (rx, p);
        }
    };
    let o = common::fastudp(&[
        "stream",
        "--port",
        &port.to_string(),
        "--ports",
        "2",
        "--flows",
        "10",
        "--rate",
        "100k",
        "--duration",
        "1.5",
        "--json",
    ]);
    drop(rx);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["refused_ports"], serde_json::json!([port + 1]), "{v}");
    assert_eq!(v["refused_flows"], 5, "{v}");
    assert!(v["flows_within_5pct"].as_f64().unwrap() <= 0.5, "{v}");
}

/// The Figure 4 pair on the `bottleneck` testbed (a tbf with a 32 KiB
/// queue on the sending veth): unpaced 32-datagram trains overflow the
/// queue, which the kernel reports as `ENOBUFS` (fastudp sets
/// `IP_RECVERR`). Both runs go to their end; the sender counts what its
/// own queue dropped, and nothing it reported dropped arrived.
#[test]
fn figure_4_pair_runs_to_the_end_through_a_full_qdisc() {
    if !common::privileged(
        "figure_4_pair_runs_to_the_end_through_a_full_qdisc",
        &["ip", "ethtool"],
    ) {
        return;
    }
    let _lock = common::testbed_lock();
    let o = common::fastudp(&["testbed", "up", "bottleneck"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = common::fastudp(&["testbed", "down"]);
        }
    }
    let _down = Down;
    let bin = env!("CARGO_BIN_EXE_fastudp");
    let netns = |ns: &str, args: &[&str]| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", ns, bin]).args(args);
        c
    };
    for pacing in ["none", "user"] {
        let rx = netns(
            "fastudp-rx",
            &[
                "stream-rx",
                "--flows",
                "25",
                "--rate",
                "2M",
                "--idle",
                "1",
                "--json",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        let tx = netns(
            "fastudp-tx",
            &[
                "stream",
                "--dest",
                "10.200.0.2",
                "--flows",
                "25",
                "--rate",
                "2M",
                "--interval",
                "4",
                "--max-burst",
                "32",
                "--pacing",
                pacing,
                "--duration",
                "1.5",
                "--json",
            ],
        )
        .output()
        .unwrap();
        let rxo = rx.wait_with_output().unwrap();
        assert!(
            tx.status.success(),
            "--pacing {pacing}: {}",
            String::from_utf8_lossy(&tx.stderr)
        );
        assert!(
            rxo.status.success(),
            "--pacing {pacing}: {}",
            String::from_utf8_lossy(&rxo.stderr)
        );
        let tx: Value = serde_json::from_slice(&tx.stdout).unwrap();
        let rx: Value = serde_json::from_slice(&rxo.stdout).unwrap();
        eprintln!(
            "--pacing {pacing}: sent {}, dropped locally {}, received {} B, receiver loss {}",
            tx["datagrams"], tx["dropped_locally"], rx["bytes"], rx["loss"]
        );
        let sent = tx["datagrams"].as_u64().expect("datagrams");
        let dropped = tx["dropped_locally"].as_u64().expect("dropped_locally");
        let received = rx["bytes"].as_u64().unwrap() / 1200;
        assert!(sent > 0 && dropped <= sent, "{tx}");
        assert_eq!(tx["bytes"].as_u64().unwrap(), sent * 1200, "{tx}");
        // What the sender reported dropped never arrived.
        assert!(
            received + dropped <= sent,
            "--pacing {pacing}: {received} received + {dropped} dropped locally > {sent} sent"
        );
        assert_eq!(rx["duplicates"], 0, "{rx}");
        if pacing == "none" {
            assert!(
                dropped > 0,
                "unpaced bursts never overflowed the queue: the test proved nothing"
            );
            assert!(rx["loss"].as_f64().unwrap() > 0.0, "{rx}");
        }
    }
}
