//! `fastudp doctor` end to end: its JSON, bad input, and a full standard
//! output.

mod common;

use common::{assert_refused, fastudp};
use serde_json::Value;
use std::process::Command;

#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
    let Ok(full) = full else {
        eprintln!("skipped: no /dev/full here");
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["doctor", "--dev", "lo"])
        .stdout(full)
        .output()
        .expect("run fastudp");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write to standard output"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn doctor_bad_values_exit_2_with_one_clear_line() {
    assert_refused(&[(vec!["doctor", "--dev", "."], "no such device")]);
}

#[test]
fn doctor_json_is_complete_and_bad_input_is_refused() {
    let o = fastudp(&["doctor", "--json", "--dev", "lo"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    for c in checks {
        let s = c["status"].as_str().unwrap();
        assert!(["PASS", "WARN", "FAIL", "N/A"].contains(&s), "{c}");
        assert!(!c["detail"].as_str().unwrap().is_empty());
        if s == "WARN" || s == "FAIL" {
            // Every WARN and FAIL that can be fixed says how; the rest say why not.
            assert!(
                c["fix"].is_string()
                    || c["detail"].as_str().unwrap().contains("fixed")
                    || c["section"] == "udp",
                "{c}"
            );
        }
    }
    for name in [
        "UDP GSO",
        "UDP GRO",
        "MSG_ZEROCOPY",
        "SO_TXTIME",
        "io_uring",
        "generic-receive-offload",
        "egress qdisc",
        "net.core.rmem_max",
        "RcvbufErrors",
    ] {
        assert!(
            checks.iter().any(|c| c["name"] == name),
            "no check named {name}"
        );
    }
    let o = fastudp(&["doctor", "--dev", "no-such-dev"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such device"));
}

#[test]
fn doctor_json_with_watch_is_json_lines() {
    let o = fastudp(&["doctor", "--dev", "lo", "--json", "--watch", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON document"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0]["checks"].is_array());
    assert_eq!(lines[1]["second"], 1);
}
