//! `fastudp testbed` and `bench --testbed` as root: the profiles are
//! built, and everything is removed after a run, a failed run and Ctrl-C.

use crate::common;

use common::{fastudp, fastudp_json, namespaces, privileged, sh, spawn};
use std::process::Command;

fn assert_no_testbed() {
    assert!(
        !namespaces().contains("fastudp-"),
        "left behind: {}",
        namespaces()
    );
}

/// The testbed builds its profile and removes everything after itself:
/// after `down`, and after a `bench --testbed` run, also a failed one.
/// One test, so that no two tests share the namespace names at once.
#[test]
fn testbed_builds_profiles_and_cleans_up() {
    if !privileged("testbed_builds_profiles_and_cleans_up", &["ip", "ethtool"]) {
        return;
    }
    let _lock = common::testbed_lock();
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
    assert_no_testbed();

    let v = fastudp_json(&[
        "bench",
        "--testbed",
        "offload",
        "--duration",
        "0.3",
        "--json",
        "--tx",
        "fastudp,tcp",
    ]);
    assert_eq!(v["workload"]["testbed"], "offload");
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["bytes"].as_u64().unwrap() > 0));
    assert_no_testbed();

    let v = fastudp_json(&[
        "bench",
        "--testbed",
        "sink",
        "--duration",
        "0.3",
        "--json",
        "--tx",
        "gso-cmsg,gso-zerocopy",
    ]);
    assert_eq!(v["results"][0]["rx"], "sink");
    assert!(v["results"][0]["lost"].is_null());
    // Where the data leaves the host, zerocopy really is zerocopy.
    let z = &v["results"][1];
    if v["host"]["capabilities"]["zerocopy"] == true {
        assert!(z["zerocopy_completions"].as_u64().unwrap() > 0, "{z}");
        assert_eq!(z["zerocopy_copied"], 0, "{z}");
    }
    assert_no_testbed();

    // A bad value with --testbed is refused before anything is built.
    let o = fastudp(&["bench", "--testbed", "nocsum", "--payload", "1473"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("MTU"));
    assert_no_testbed();

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
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        let o = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_fastudp"),
                "tune",
                "--dev",
                "lo",
                "--apply",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if !err.contains("Permission denied") {
            assert_eq!(o.status.code(), Some(2), "{err}");
            assert!(err.contains("needs root"), "{err}");
        }
    } else {
        common::skip(
            "testbed_builds_profiles_and_cleans_up (its part without root)",
            "needs setpriv (util-linux)",
        );
    }
}

/// Ctrl-C in the middle of a testbed run removes the testbed.
#[test]
fn interrupted_testbed_run_cleans_up() {
    if !privileged(
        "interrupted_testbed_run_cleans_up",
        &["ip", "ethtool", "kill"],
    ) {
        return;
    }
    // The testbed names are shared with testbed_builds_profiles_and_cleans_up:
    // wait for it to finish with them.
    let _lock = common::testbed_lock();
    let child = spawn(&[
        "bench",
        "--testbed",
        "offload",
        "--duration",
        "30",
        "-q",
        "--tx",
        "fastudp",
    ]);
    let start = std::time::Instant::now();
    while !namespaces().contains("fastudp-rx") {
        // A stall guard, not a timing check: a busy machine builds it slowly.
        assert!(start.elapsed() < common::STALL, "the testbed never came up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    sh(&["kill", "-INT", &child.id().to_string()]);
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("testbed removed"));
    assert_no_testbed();
}

/// A directory whose `ethtool` fails every call, first on `PATH`: the
/// testbed finds it (so its up-front check passes) and then fails while it
/// sets its namespaces up, as a real `ethtool` does on a device that
/// refuses a switch.
fn failing_ethtool() -> (std::path::PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("fastudp-failing-ethtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tool = dir.join("ethtool");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho 'ethtool: refused by the test' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (dir, path)
}

/// The last line of standard error: the error, in one line.
fn error_line(stderr: &[u8]) -> String {
    let err = String::from_utf8_lossy(stderr);
    let last = err
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(last.starts_with("fastudp: error: "), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("error")).count(),
        1,
        "one error line: {err}"
    );
    last
}

/// Exit status 2 is for usage only: a command that fails while it builds
/// the testbed exits with 1, its error in one line, and leaves no
/// namespace behind (without root it is 2; see
/// testbed_builds_profiles_and_cleans_up).
#[test]
fn testbed_failures_exit_1() {
    if !privileged("testbed_failures_exit_1", &["ip"]) {
        return;
    }
    let _lock = common::testbed_lock();
    let (dir, path) = failing_ethtool();

    // The `wire` profile switches an offload with ethtool, which fails.
    let o = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["testbed", "up", "wire"])
        .env("PATH", &path)
        .output()
        .unwrap();
    let line = error_line(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{line}");
    assert!(
        line.contains(
            "ethtool -K fu-tx tx-udp-segmentation off` failed: ethtool: refused by the test"
        ),
        "{line}"
    );
    assert_no_testbed();
    let _ = std::fs::remove_dir_all(dir);
}
