//! `fastudp-lab figure N`: every row of the paper's Figures 1, 3 and 5
//! runs on the testbed, each with its offload features on the sending
//! veth, and the features are set back after the figure, after a failed
//! row and after Ctrl-C.

use crate::common;

use common::{assert_refused, lab, lab_json, namespaces, privileged, sh, Running, LAB};
use std::process::Command;

/// Options that do not go with a figure are refused before anything
/// is built (no root needed).
#[test]
fn figure_arguments_are_checked() {
    assert_refused(&[
        (vec!["figure", "2"], "1, 3 and 5"),
        (vec!["figure", "0"], "1, 3 and 5"),
        (vec!["figure", "300"], "300"),
        (vec!["figure", "-1"], "-1"),
        (vec!["figure", "1", "--tx", "sendto"], "--tx"),
        (vec!["figure", "5", "--rx", "gro"], "--rx"),
        (vec!["figure", "1", "--testbed", "offload"], "--testbed"),
        (vec!["figure", "3", "--cache-thrash"], "--cache-thrash"),
        (vec!["figure", "1", "--ipv6"], "IPv4"),
        (vec!["figure", "1", "--batch", "8"], "--batch"),
    ]);
}

/// The sending veth's features and gso_max_segs, as `ethtool -k` and
/// `ip -d link` show them.
fn dev_state() -> (String, String) {
    let k = sh(&[
        "ip",
        "netns",
        "exec",
        "fastudp-tx",
        "ethtool",
        "-k",
        "fu-tx",
    ]);
    let l = sh(&[
        "ip",
        "-n",
        "fastudp-tx",
        "-d",
        "link",
        "show",
        "dev",
        "fu-tx",
    ]);
    let segs = l
        .split_whitespace()
        .skip_while(|w| *w != "gso_max_segs")
        .nth(1)
        .unwrap_or("?")
        .to_string();
    (k, segs)
}

fn feature(k: &str, name: &str) -> String {
    k.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or("?")
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// Figure 1 on a testbed that is up: every row runs, and the device is
/// as it was afterwards; after a row that fails; and after Ctrl-C while
/// the first row (TCP without segmentation offload) has its features set.
#[test]
fn figure_rows_run_and_features_are_set_back() {
    if !privileged(
        "figure_rows_run_and_features_are_set_back",
        &["ip", "ethtool"],
    ) {
        return;
    }
    let _g = common::testbed_lock();
    let o = lab(&["testbed", "up", "wire-gro"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    struct Down;
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = lab(&["testbed", "down"]);
        }
    }
    let _down = Down;
    let before = dev_state();
    assert_eq!(feature(&before.0, "tcp-segmentation-offload"), "on");
    assert_ne!(before.1, "1");

    let v = lab_json(&["figure", "1", "--on-testbed", "--duration", "0.3", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["TCP", "TCP gso", "TCP tso", "UDP", "UDP gso"]);
    for r in rows {
        assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["profile"], "wire-gro");
    }
    assert_eq!(rows[0]["gso_max_segs"], 1);
    assert_eq!(rows[0]["features"][1], "gso off");
    assert!(!v["ratios"].as_array().unwrap().is_empty());
    assert_eq!(dev_state(), before, "features set back after the figure");

    // A row that fails after its features were set.
    let o = Command::new(LAB)
        .args(["figure", "1", "--on-testbed", "--duration", "0.2"])
        .env("FASTUDP_FIGURE_FAIL_ROW", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("failed on purpose") && err.contains("set back"),
        "{err}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("TCP "),
        "the row before it is reported"
    );
    assert_eq!(dev_state(), before, "features set back after a failed row");

    // Ctrl-C during the first row, whose features are then set.
    let mut r = Running::start(&["figure", "1", "--on-testbed", "--duration", "5"]);
    r.wait_for_line(|l| l.starts_with("[tcp "));
    let during = dev_state();
    assert_eq!(feature(&during.0, "tcp-segmentation-offload"), "off");
    assert_eq!(feature(&during.0, "generic-segmentation-offload"), "off");
    assert_eq!(during.1, "1");
    r.interrupt();
    let end = r.finish();
    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(end.stderr.contains("set back"), "{}", end.stderr);
    assert_eq!(dev_state(), before, "features set back after Ctrl-C");
}

/// Figures 3 and 5 build the profiles their rows need and remove them;
/// TCP zerocopy to a receiver on this host is copied, every send, and
/// GRO takes fewer receive calls per byte than recvfrom.
#[test]
fn figures_3_and_5_run_every_row() {
    if !privileged("figures_3_and_5_run_every_row", &["ip", "ethtool"]) {
        return;
    }
    // Not at the same time as any other test of the testbed's names.
    let _g = common::testbed_lock();
    let v = lab_json(&["figure", "3", "--duration", "0.3", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    for r in rows {
        assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
    }
    assert_eq!(rows.iter().filter(|r| r["cache_thrash"] == true).count(), 4);
    let tz = rows
        .iter()
        .find(|r| r["tx"] == "tcp-zerocopy")
        .expect("tcp-zerocopy row");
    let done = tz["zerocopy_completions"].as_u64().unwrap();
    assert!(done > 0, "{tz}");
    assert_eq!(tz["zerocopy_copied"].as_u64().unwrap(), done, "{tz}");
    assert!(!namespaces().contains("fastudp-"), "{}", namespaces());

    let v = lab_json(&["figure", "5", "--duration", "0.3", "--json"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let per_byte = |r: &serde_json::Value| {
        r["rx_calls_per_sec"].as_f64().unwrap() / r["mbytes_per_sec"].as_f64().unwrap()
    };
    for pair in rows.chunks(2) {
        assert_eq!(pair[0]["rx"], "recvfrom");
        assert_eq!(pair[1]["rx"], "gro");
        assert!(per_byte(&pair[1]) < per_byte(&pair[0]), "{pair:?}");
    }
    assert!(!namespaces().contains("fastudp-"), "{}", namespaces());
}
