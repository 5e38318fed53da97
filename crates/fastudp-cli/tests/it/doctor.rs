//! `fastudp doctor` end to end: its JSON, bad input, and a full standard
//! output.

use crate::common;

use common::{assert_refused, fastudp, privileged, sh};
use serde_json::Value;
use std::process::Command;

#[test]
fn a_full_standard_output_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
    let Ok(full) = full else {
        common::skip(
            "a_full_standard_output_is_an_error_not_a_panic",
            "no /dev/full here",
        );
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

/// Bad input is exit status 2, a run that fails (here its output cannot
/// be written) exit status 1; each says why in one line.
#[test]
fn doctor_exits_2_for_bad_input_and_1_for_a_failed_run() {
    let o = fastudp(&["doctor", "--watch", "0"]);
    common::assert_one_line_error(&o, 2, "--watch must be 1 to 86400 seconds");
    let o = fastudp(&["doctor", "--dev", "no-such-dev0"]);
    common::assert_one_line_error(&o, 2, "--dev no-such-dev0: no such device");
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        common::skip(
            "doctor_exits_2_for_bad_input_and_1_for_a_failed_run",
            "no /dev/full here",
        );
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["doctor", "--json", "--dev", "lo"])
        .stdout(full)
        .output()
        .expect("run fastudp");
    common::assert_one_line_error(&o, 1, "cannot write to standard output");
}

#[test]
fn doctor_headings_have_no_trailing_blank() {
    let o = fastudp(&["doctor", "--dev", "lo"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A heading without a device ("SYSCTL") once ended in a blank.
    assert!(text.lines().any(|l| l == "SYSCTL"), "{text}");
    assert!(text.lines().any(|l| l == "DEVICE lo"), "{text}");
    for line in text.lines() {
        assert_eq!(line, line.trim_end(), "a trailing blank in:\n{text}");
    }
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

/// The JSON carries the numbers, not only prose, under a schema version.
#[test]
fn doctor_json_has_a_schema_and_the_numbers_it_read() {
    let o = fastudp(&["doctor", "--json", "--dev", "lo"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], 1);
    assert!(["boot", "namespace", "unknown"].contains(&v["counters_since"].as_str().unwrap()));
    let checks = v["checks"].as_array().unwrap();
    let find = |name: &str| {
        checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}"))
    };
    assert!(checks.iter().all(|c| c["values"].is_object()), "{v}");
    let mtu: u64 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(find("MTU")["values"]["mtu"], mtu);
    let rmem: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let c = find("net.core.rmem_max");
    assert_eq!(c["values"]["value"], rmem, "{c}");
    assert_eq!(c["values"]["minimum"], 7_500_000, "{c}");
    for name in ["RcvbufErrors", "SndbufErrors", "InErrors", "InCsumErrors"] {
        let x = &find(name)["values"];
        let (n, a, b) = (
            x["count"].as_u64().unwrap(),
            x["ipv4"].as_u64().unwrap(),
            x["ipv6"].as_u64().unwrap(),
        );
        assert_eq!(n, a + b, "{name}: {x}");
    }
}

/// In a network namespace the UDP counters are the namespace's: doctor
/// says they count from its creation, not from boot.
#[test]
fn doctor_in_a_namespace_says_what_its_counters_cover() {
    if !privileged(
        "doctor_in_a_namespace_says_what_its_counters_cover",
        &["ip"],
    ) {
        return;
    }
    let ns = format!("fu-doc-{}", std::process::id());
    sh(&["ip", "netns", "add", &ns]);
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_fastudp")])
        .args(["doctor", "--dev", "lo", "--json"])
        .output()
        .unwrap();
    let text = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_fastudp")])
        .args(["doctor", "--dev", "lo"])
        .output()
        .unwrap();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns])
        .output();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["counters_since"], "namespace", "{v}");
    assert_eq!(v["namespace"], ns.as_str(), "{v}");
    let words = format!("since network namespace {ns} was created");
    for c in v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["section"] == "udp")
    {
        let d = c["detail"].as_str().unwrap();
        assert!(d.contains(&words) && !d.contains("boot"), "{c}");
    }
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains(&words) && !out.contains("since boot"), "{out}");
}

/// `doctor --dest` checks the device the kernel would really use: a
/// policy rule sends 10.9.1.0/24 through another table than the main one,
/// which /proc/net/route does not show.
#[test]
fn doctor_dest_follows_the_kernels_route_past_policy_rules() {
    if !privileged(
        "doctor_dest_follows_the_kernels_route_past_policy_rules",
        &["ip"],
    ) {
        return;
    }
    let ns = format!("fu-route-{}", std::process::id());
    sh(&["ip", "netns", "add", &ns]);
    let ip = |args: &[&str]| {
        let mut v = vec!["ip", "-n", ns.as_str()];
        v.extend_from_slice(args);
        sh(&v)
    };
    let run = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_fastudp")])
            .args(args)
            .output()
            .unwrap()
    };
    let result = std::panic::catch_unwind(|| {
        for (a, b) in [("ra", "rb"), ("pa", "pb")] {
            ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
            ip(&["link", "set", a, "up"]);
            ip(&["link", "set", b, "up"]);
        }
        ip(&["route", "add", "10.9.0.0/16", "dev", "ra"]);
        ip(&["route", "add", "10.9.1.0/24", "dev", "pa", "table", "100"]);
        ip(&["rule", "add", "to", "10.9.1.0/24", "table", "100"]);
        let section = |dest: &str| {
            let o = run(&["doctor", "--json", "--dest", dest]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            let devs: Vec<String> = v["checks"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| {
                    c["section"]
                        .as_str()?
                        .strip_prefix("device ")
                        .map(String::from)
                })
                .collect();
            devs[0].clone()
        };
        assert_eq!(section("10.9.1.5"), "pa", "the policy rule's table");
        assert_eq!(section("10.9.2.5"), "ra", "the main table");
        // No route at all: one clear line, status 2.
        let o = run(&["doctor", "--dest", "192.0.2.1"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("no route to 192.0.2.1"), "{err}");
    });
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns])
        .output();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// `doctor --dest` takes a host name, as `tx -D` does.
#[test]
fn doctor_dest_takes_a_host_name() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["doctor", "--json", "--dest", "localhost"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sections: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["section"].as_str())
        .filter(|s| s.starts_with("device "))
        .collect();
    assert!(!sections.is_empty());
    assert!(sections.iter().all(|s| *s == "device lo"), "{sections:?}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["doctor", "--dest", "no-such-host.invalid"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot resolve"));
}

/// `doctor --watch 60` stops at Ctrl-C, after the samples it printed,
/// with status 130, instead of running out its 60 seconds.
#[test]
fn doctor_watch_stops_at_ctrl_c() {
    let mut r = common::Running::start(&["doctor", "--watch", "60"]);
    r.wait_for_line(|l| l.starts_with("[  1 s]"));
    common::wait_for_sigint_handler(r.pid());
    r.interrupt();
    let end = r.finish();
    // Running out the 60 s would end with status 0; only a stop at Ctrl-C
    // gives 130.
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(end.stderr.contains("interrupted"), "{}", end.stderr);
}
