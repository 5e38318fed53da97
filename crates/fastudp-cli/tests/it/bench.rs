//! `fastudp bench` end to end: bad input, the JSON schema, that each
//! strategy makes the syscalls it names, the table and the plot.

use crate::common;

use common::{assert_refused, fastudp, fastudp_json, privileged};
use serde_json::Value;

#[test]
fn bench_bad_values_exit_2_with_one_clear_line() {
    assert_refused(&[
        (vec!["bench", "--payload", "0"], "--payload 0"),
        (vec!["bench", "--payload", "70000"], "65507"),
        (vec!["bench", "--batch", "0"], "--batch 0"),
        (vec!["bench", "--tx", "sendfoo"], "sendfoo"),
        (vec!["bench", "--busy-poll", "0"], "--busy-poll"),
        (vec!["bench", "--duration", "-1"], "--duration"),
        (
            vec!["bench", "--plot", "/nonexistent/dir/x.svg"],
            "does not exist",
        ),
        (vec!["bench", "--plot", "/"], "is a directory"),
        (vec!["bench", "--duration", "0.000001"], "--duration"),
    ]);
}

#[test]
fn json_is_complete_and_strategies_make_the_calls_they_name() {
    let o = fastudp(&[
        "bench",
        "--duration",
        "0.3",
        "--json",
        "--payload",
        "1000",
        "--batch",
        "16",
        "--tx",
        "sendto,sendmmsg,gso-cmsg,sendmmsg-gso,fastudp,tcp,gso-zerocopy",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(v["schema"], 1);
    for k in ["kernel", "cpu", "cpus", "capabilities"] {
        assert!(!v["host"][k].is_null(), "host.{k} missing");
    }
    for k in [
        "gso_max_segments",
        "gro",
        "ecn",
        "pktinfo",
        "mmsg",
        "zerocopy",
        "txtime",
    ] {
        assert!(
            !v["host"]["capabilities"][k].is_null(),
            "capabilities.{k} missing"
        );
    }
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 7);
    let keys = [
        "tx",
        "rx",
        "bytes",
        "datagrams",
        "seconds",
        "gbps",
        "datagrams_per_sec",
        "tx_calls_per_sec",
        "tx_cpu_ns_per_byte",
        "rx_cpu_ns_per_byte",
        "lost",
        "speedup_vs_sendto",
        "bytes_per_call",
        "host_steal",
    ];
    let gso = v["host"]["capabilities"]["gso_max_segments"]
        .as_u64()
        .unwrap()
        > 1;
    for r in results {
        for k in keys {
            assert!(
                r.get(k).is_some_and(|x| !x.is_null()),
                "result {} lacks {k}",
                r["tx"]
            );
        }
        assert!(
            r["bytes"].as_u64().unwrap() > 0,
            "{} moved no bytes",
            r["tx"]
        );
        let bpc = r["bytes_per_call"].as_f64().unwrap();
        match r["tx"].as_str().unwrap() {
            "sendto" => assert_eq!(bpc, 1000.0, "sendto: one datagram per call"),
            "sendmmsg" => assert_eq!(bpc, 16_000.0, "sendmmsg: a batch per call"),
            "gso-cmsg" if gso => assert_eq!(bpc, 16_000.0, "one GSO buffer of 16 per call"),
            "sendmmsg-gso" if gso => assert_eq!(bpc, 8.0 * 16_000.0, "8 GSO buffers per call"),
            "fastudp" if gso => assert!(bpc >= 16_000.0, "trains per call: {bpc}"),
            "tcp" => assert_eq!(r["rx"], "tcp"),
            "gso-zerocopy" if v["host"]["capabilities"]["zerocopy"] == true => {
                // Loopback delivery always copies, and the report says so.
                let done = r["zerocopy_completions"].as_u64().unwrap();
                assert!(done > 0);
                assert_eq!(r["zerocopy_copied"].as_u64().unwrap(), done);
            }
            _ => {}
        }
    }
    let speed = results[0]["speedup_vs_sendto"].as_f64().unwrap();
    assert!((speed - 1.0).abs() < 1e-9);
}

#[test]
fn table_and_interval_lines() {
    let o = fastudp(&["bench", "--duration", "1.2", "--tx", "sendto"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    // One unit style for rates, in the per-second lines and the table.
    let second = out
        .lines()
        .find(|l| l.contains("0-1 "))
        .unwrap_or_else(|| panic!("no per-second line: {out}"));
    assert!(second.contains(" Gbit/s "), "{second}");
    assert!(!out.contains("Gbits/sec"), "{out}");
    assert!(out.contains("x sendto") && out.contains("1.00x"), "{out}");
    // The verdict under the table.
    assert!(out.contains("verdict:"), "{out}");
    assert!(
        out.contains("best sender:   sendto (") && out.contains("1.00x sendto into gro-recvmmsg"),
        "{out}"
    );
    let q = fastudp(&["bench", "--duration", "1.2", "--tx", "sendto", "--quiet"]);
    assert!(!String::from_utf8_lossy(&q.stdout).contains("0-1 "));
}

/// `fastudp bench | head -1`: once the reader has gone, the next line
/// ends the program quietly with status 0, as ripgrep does: no panic, no
/// "cannot write" message, and no death by SIGPIPE (which stays ignored,
/// so that a write to a reset TCP peer is an error and not the end).
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["bench", "--duration", "1.2", "--tx", "sendto"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fastudp starts");
    let mut first = String::new();
    {
        let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        out.read_line(&mut first).expect("a first line");
        // Dropping the reader closes the pipe, as `head -1` does.
    }
    assert!(!first.is_empty(), "bench printed nothing");
    let o = child.wait_with_output().expect("fastudp ends");
    let err = String::from_utf8_lossy(&o.stderr);
    // The table comes after the reader left, so the program does meet the
    // closed pipe (EPIPE; SIGPIPE stays ignored): it ends with status 0
    // and says nothing, as ripgrep does, not status 1 and a message.
    assert_eq!(o.status.signal(), None, "{:?}: {err}", o.status);
    assert_eq!(o.status.code(), Some(0), "{:?}: {err}", o.status);
    assert!(err.trim().is_empty(), "standard error: {err}");
}

#[test]
fn plot_draws_an_svg_of_every_run() {
    let path = std::env::temp_dir().join(format!("fastudp-plot-{}.svg", std::process::id()));
    let p = path.to_str().unwrap();
    let o = fastudp(&[
        "bench",
        "--duration",
        "0.3",
        "-q",
        "--tx",
        "sendto,gso-cmsg",
        "--plot",
        p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let abs = std::fs::canonicalize(&path).unwrap();
    let said = format!("plot written to {}", abs.display());
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&said),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg"), "not an SVG");
    assert!(svg.contains("sendto -&gt; gro-recvmmsg") || svg.contains("sendto -> gro-recvmmsg"));
    assert!(svg.contains("gso-cmsg") && svg.contains("Gbit/s"));
}

/// With --json the plot's path goes to standard error, and standard
/// output stays one JSON document.
#[test]
fn plot_with_json_says_where_on_stderr() {
    let path = std::env::temp_dir().join(format!("fastudp-plot-json-{}.svg", std::process::id()));
    let p = path.to_str().unwrap();
    let o = fastudp(&[
        "bench",
        "--duration",
        "0.2",
        "--json",
        "--tx",
        "sendto",
        "--plot",
        p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let abs = std::fs::canonicalize(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let v: Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(v["schema"], 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("plot written to {}", abs.display())),
        "{err}"
    );
}

/// The io_uring strategies run on the ring (a strategy that fell back to
/// syscalls fails rather than report syscall numbers as io_uring), and
/// `uring-zc` reports its notifications, all copied on loopback.
#[test]
fn uring_strategies_run_on_the_ring() {
    let doctor: Value =
        serde_json::from_slice(&fastudp(&["doctor", "--json", "--dev", "lo"]).stdout)
            .expect("doctor JSON");
    let u = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "io_uring")
        .expect("an io_uring check")
        .clone();
    if u["values"]["sendmsg_zc"] != 1 || u["values"]["recvmsg_multishot"] != 1 {
        let why = format!("io_uring lacks a piece here: {}", u["detail"]);
        common::skip("uring_strategies_run_on_the_ring", &why);
        return;
    }
    let o = fastudp(&[
        "bench",
        "--duration",
        "0.3",
        "--json",
        "--payload",
        "1000",
        "--batch",
        "16",
        "--tx",
        "uring-gso,uring-zc",
        "--rx",
        "uring-gro",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let results = v["results"].as_array().expect("results array");
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["rx"], "uring-gro");
        assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
        if r["tx"] == "uring-zc" {
            let done = r["zerocopy_completions"].as_u64().unwrap();
            assert!(done > 0);
            assert_eq!(r["zerocopy_copied"].as_u64().unwrap(), done);
        }
    }
}

/// `--busy-poll` sets SO_BUSY_POLL on the receiving sockets, UDP and TCP
/// (root: the value is above net.core.busy_read), and the runs complete.
#[test]
fn busy_poll_runs() {
    if !privileged("busy_poll_runs", &[]) {
        return;
    }
    let v = fastudp_json(&[
        "bench",
        "--tx",
        "sendto,tcp",
        "--rx",
        "recvfrom",
        "--busy-poll",
        "50",
        "--duration",
        "0.2",
        "--json",
    ]);
    let rs = v["results"].as_array().unwrap();
    assert_eq!(rs.len(), 2);
    for r in rs {
        assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
    }
}

/// Receive rows are compared with recvfrom from the same sender (not with
/// a sendto send run), the verdict names the best receiver, and a run
/// that lost datagrams is explained with what to do about it.
#[test]
fn receive_rows_compare_with_recvfrom_and_the_verdict_explains_loss() {
    let v = fastudp_json(&[
        "bench",
        "--duration",
        "0.5",
        "--rx",
        "recvfrom,gro-recvmmsg",
        "--json",
    ]);
    let rows = v["results"].as_array().expect("results");
    let from = rows
        .iter()
        .find(|r| r["rx"] == "recvfrom")
        .expect("a recvfrom row");
    assert_eq!(from["tx"], "fastudp", "{from}");
    assert_eq!(from["speedup_vs_recvfrom"], 1.0, "{from}");
    assert!(from["speedup_vs_sendto"].is_null(), "{from}");
    let gro = rows
        .iter()
        .find(|r| r["rx"] == "gro-recvmmsg")
        .expect("a gro-recvmmsg row");
    let ratio = gro["mbytes_per_sec"].as_f64().unwrap() / from["mbytes_per_sec"].as_f64().unwrap();
    let got = gro["speedup_vs_recvfrom"].as_f64().unwrap();
    assert!((got - ratio).abs() < 1e-9, "{got} {ratio}");
    let verdict: Vec<&str> = v["verdict"]
        .as_array()
        .expect("verdict lines")
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let text = verdict.join("\n");
    assert!(text.contains("best receiver: "), "{text}");
    assert!(text.contains("x recvfrom from fastudp"), "{text}");
    let lost: u64 = rows.iter().filter_map(|r| r["lost"].as_u64()).sum();
    // Loss is explained exactly when there was some.
    assert_eq!(
        text.contains("loopback has no flow control"),
        lost > 0,
        "{lost} lost: {text}"
    );
    if lost > 0 {
        assert!(text.contains("fastudp tx -b RATE"), "{text}");
    }
}

/// `--testbed` without root is a usage error (status 2, one line), found
/// before anything is built or run.
#[test]
fn testbed_without_root_is_a_usage_error() {
    let probe = std::process::Command::new("setpriv")
        .arg("--version")
        .output();
    if probe.is_err() {
        common::skip(
            "testbed_without_root_is_a_usage_error",
            "needs setpriv (util-linux)",
        );
        return;
    }
    let o = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            env!("CARGO_BIN_EXE_fastudp"),
            "bench",
            "--testbed",
            "offload",
            "--tx",
            "sendto",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("Permission denied") {
        common::skip(
            "testbed_without_root_is_a_usage_error",
            "the test binary is out of reach of user nobody",
        );
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("fastudp: error: the testbed needs root"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "nothing ran");
}

/// A bad option is a usage error: status 2, one line, and nothing run. A
/// failure during the run (here: the plot's directory is removed while
/// the bench runs, so the chart cannot be written) is a runtime failure:
/// status 1 and one line, after the table, which is still printed.
#[test]
fn usage_errors_exit_2_and_runtime_failures_exit_1_each_in_one_line() {
    use std::io::{BufRead, Read};
    use std::process::{Command, Stdio};
    let o = fastudp(&["bench", "--plot", "/nonexistent/dir/x.svg"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        "fastudp: error: --plot /nonexistent/dir/x.svg: the directory does not exist\n"
    );
    assert!(o.stdout.is_empty(), "nothing ran");

    let dir = std::env::temp_dir().join(format!("fastudp-plot-gone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("x.svg");
    let svg = svg.to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args([
            "bench",
            "--duration",
            "0.5",
            "-q",
            "--tx",
            "sendto",
            "--plot",
            svg,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fastudp starts");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    // The header comes once the options were checked, before the run.
    let mut header = String::new();
    out.read_line(&mut header).expect("a header");
    assert!(header.starts_with("fastudp bench: "), "{header}");
    std::fs::remove_dir_all(&dir).unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("fastudp: error: cannot draw {svg}: ")),
        "{err}"
    );
    assert!(
        rest.contains("sendto") && rest.contains("verdict:"),
        "{rest}"
    );
}
