//! `fastudp-lab soak`: its options are checked before anything is built,
//! and a soak that fails says so in one line, with status 1, leaving
//! nothing behind.

use crate::common::{self, lab, namespaces, privileged, LAB};
use std::process::Command;

/// A negative value is refused by the option's own check, in one line,
/// with exit status 2.
#[test]
fn negative_values_are_refused_in_one_line_naming_the_option() {
    for (args, opt) in [
        (vec!["soak", "--minutes", "-1"], "--minutes"),
        (vec!["soak", "--rate", "-10"], "--rate"),
    ] {
        let o = lab(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(opt) && err.contains('-'), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(err.starts_with("fastudp-lab: error: "), "{args:?}: {err}");
    }
}

/// The soak's options are checked before anything is built (so without
/// root too); the command is in the lab's help.
#[test]
fn soak_refuses_bad_options() {
    for (args, opt) in [
        (vec!["soak", "--minutes", "0.1"], "--minutes"),
        (vec!["soak", "--rate", "1e9"], "--rate"),
        (vec!["soak", "--payload", "1200"], "--payload"),
        (vec!["soak", "--payload", "1473"], "--payload"),
    ] {
        let o = lab(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("fastudp-lab: error: ") && err.contains(opt),
            "{args:?}: {err}"
        );
    }
    let help = String::from_utf8_lossy(&lab(&["--help"]).stdout).to_string();
    for cmd in ["soak", "attack", "figure", "bench", "quic"] {
        assert!(help.contains(cmd), "{cmd}: {help}");
    }
}

/// A directory whose `ethtool` fails every call, first on `PATH`: the
/// soak finds it (so its up-front check passes) and then fails when it
/// strikes a fault, as a real `ethtool` does on a device that refuses a
/// switch.
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
    assert!(last.starts_with("fastudp-lab: error: "), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("error")).count(),
        1,
        "one error line: {err}"
    );
    last
}

/// Exit status 2 is for usage only: a soak that fails while it runs
/// exits with 1, its error in one line, and leaves no namespace behind.
/// Bad options are 2, and so is a soak without root.
#[test]
fn soak_failures_exit_1_and_usage_2() {
    if !privileged("soak_failures_exit_1_and_usage_2", &["ip"]) {
        return;
    }
    let _lock = common::testbed_lock();
    let (dir, path) = failing_ethtool();

    // Slot 3 strikes a tx checksum fault with ethtool, which fails: the
    // soak reports and fails with status 1.
    let child = Command::new(LAB)
        .args(["soak", "--minutes", "0.5", "--slots", "3"])
        .env("PATH", &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let line = error_line(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{line}");
    assert!(
        line.starts_with("fastudp-lab: error: the soak failed: slot 3: `ip netns exec ")
            && line.contains(" tx off` failed: ethtool: refused by the test"),
        "{line}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("soak:"),
        "the report is printed before the error"
    );
    assert!(
        !namespaces().contains(&format!("fusoak-{pid}-")),
        "left behind: {}",
        namespaces()
    );
    let _ = std::fs::remove_dir_all(dir);

    // A value out of range: usage, status 2, before anything is built.
    let o = lab(&["soak", "--rate", "10"]);
    let line = error_line(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{line}");
    assert_eq!(
        line,
        "fastudp-lab: error: --rate 10 is out of range: 1000 to 100000 datagrams per second"
    );
    // Not root: usage, status 2.
    if Command::new("setpriv").arg("--version").output().is_ok() {
        let o = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                LAB,
                "soak",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if !err.contains("Permission denied") {
            let line = error_line(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{line}");
            assert!(line.contains("needs root"), "{line}");
        }
    }
}
