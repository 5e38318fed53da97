//! The `fastudp` binary end to end: bad input, the JSON schema, and that
//! each strategy makes the syscalls it names.

use serde_json::Value;
use std::process::Command;

fn fastudp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(args)
        .output()
        .expect("run fastudp")
}

#[test]
fn bad_values_exit_2_with_one_clear_line() {
    for (args, needle) in [
        (vec!["bench", "--payload", "0"], "--payload 0"),
        (vec!["bench", "--payload", "70000"], "65507"),
        (vec!["bench", "--batch", "0"], "--batch 0"),
        (vec!["bench", "--tx", "sendfoo"], "sendfoo"),
        (vec!["bench", "--duration", "-1"], "--duration"),
        (
            vec!["bench", "--plot", "/nonexistent/dir/x.svg"],
            "does not exist",
        ),
    ] {
        let o = fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{err}"
        );
    }
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
        "sendto,sendmmsg,gso-cmsg,sendmmsg-gso,fastudp,tcp",
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
    assert_eq!(results.len(), 6);
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
    assert!(out.contains("0-1") && out.contains("Gbits/sec"), "{out}");
    assert!(out.contains("speedup") && out.contains("1.00x"), "{out}");
    let q = fastudp(&["bench", "--duration", "1.2", "--tx", "sendto", "--quiet"]);
    assert!(!String::from_utf8_lossy(&q.stdout).contains("Gbits/sec"));
}

fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-V").output().is_ok()
}

fn namespaces() -> String {
    String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned()
}

/// The testbed builds its profile and removes everything after itself:
/// after `down`, and after a `bench --testbed` run, also a failed one.
/// One test, so that no two tests share the namespace names at once.
#[test]
fn testbed_builds_profiles_and_cleans_up() {
    if !root() || !have("ip") || !have("ethtool") {
        eprintln!("skipping testbed_builds_profiles_and_cleans_up: needs root, ip and ethtool");
        return;
    }
    let o = fastudp(&["testbed", "up", "wire"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(namespaces().contains("fastudp-tx") && namespaces().contains("fastudp-rx"));
    let k = Command::new("ip")
        .args(["netns", "exec", "fastudp-tx", "ethtool", "-k", "fu-tx"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&k.stdout).contains("tx-udp-segmentation: off"),
        "wire profile cuts trains"
    );
    let o = fastudp(&["testbed", "down"]);
    assert!(o.status.success());
    assert!(
        !namespaces().contains("fastudp-"),
        "left behind: {}",
        namespaces()
    );

    let o = fastudp(&[
        "bench",
        "--testbed",
        "offload",
        "--duration",
        "0.3",
        "--json",
        "--tx",
        "fastudp,tcp",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["workload"]["testbed"], "offload");
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["bytes"].as_u64().unwrap() > 0));
    assert!(
        !namespaces().contains("fastudp-"),
        "left behind: {}",
        namespaces()
    );

    let o = fastudp(&[
        "bench",
        "--testbed",
        "sink",
        "--duration",
        "0.3",
        "--json",
        "--tx",
        "gso-cmsg",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["results"][0]["rx"], "sink");
    assert!(v["results"][0]["lost"].is_null());
    assert!(!namespaces().contains("fastudp-"));

    // A bad value with --testbed is refused before anything is built.
    let o = fastudp(&["bench", "--testbed", "nocsum", "--payload", "1473"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("MTU"));
    assert!(!namespaces().contains("fastudp-"));

    // Without root: one clear line, status 2.
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let o = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_fastudp"),
                "testbed",
                "up",
                "offload",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if !err.contains("Permission denied") {
            assert_eq!(o.status.code(), Some(2), "{err}");
            assert!(err.contains("needs root"), "{err}");
        }
    }
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
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg"), "not an SVG");
    assert!(svg.contains("sendto -&gt; gro-recvmmsg") || svg.contains("sendto -> gro-recvmmsg"));
    assert!(svg.contains("gso-cmsg") && svg.contains("Gbit/s"));
}
