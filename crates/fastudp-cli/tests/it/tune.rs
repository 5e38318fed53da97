//! `fastudp tune` as root, on throwaway veth pairs in a network namespace:
//! it applies and reverts exactly, merges a second run's originals, and
//! writes nothing it did not set out to write (a hand-edited state file,
//! a symbolic link at the state path, a directory others can write).

use crate::common;

use common::{fastudp, privileged, sh};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A namespace holding a veth pair `va`/`vb`, both up; removed on drop,
/// with its private state directory.
struct Ns {
    name: String,
    dir: PathBuf,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("fu-tune-{tag}");
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        sh(&[
            "ip", "-n", &name, "link", "add", "va", "type", "veth", "peer", "name", "vb",
        ]);
        sh(&["ip", "-n", &name, "link", "set", "va", "up"]);
        sh(&["ip", "-n", &name, "link", "set", "vb", "up"]);
        let dir = std::env::temp_dir().join(format!("fastudp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        Ns { name, dir }
    }

    /// Runs fastudp inside the namespace.
    fn fastudp(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, env!("CARGO_BIN_EXE_fastudp")])
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs fastudp inside the namespace, which must succeed; its output.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.fastudp(args);
        assert!(
            o.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Everything tune may change on `dev`: features, channels,
    /// gro_flush_timeout, napi_defer_hard_irqs.
    fn snapshot(&self, dev: &str) -> (String, String, String, String) {
        let n = self.name.as_str();
        let cat = |f: &str| {
            sh(&[
                "ip",
                "netns",
                "exec",
                n,
                "cat",
                &format!("/sys/class/net/{dev}/{f}"),
            ])
        };
        (
            sh(&["ip", "netns", "exec", n, "ethtool", "-k", dev]),
            sh(&["ip", "netns", "exec", n, "ethtool", "-l", dev]),
            cat("gro_flush_timeout"),
            cat("napi_defer_hard_irqs"),
        )
    }

    fn gro_flush(&self, dev: &str) -> String {
        self.snapshot(dev).2.trim().to_string()
    }

    fn state(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes a state file as tune would (mode 0600).
fn write_state(p: &Path, text: &str) {
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn tune_applies_and_reverts_and_a_second_revert_changes_nothing() {
    if !privileged("tune_applies_and_reverts", &["ip", "ethtool"]) {
        return;
    }
    let ns = Ns::new("rt");
    let before = ns.snapshot("vb");
    let doc = ns.ok(&["doctor", "--dev", "vb", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
    let find = |v: &serde_json::Value, n: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(find(&v, "generic-receive-offload")["status"], "WARN");
    assert_eq!(
        find(&v, "generic-receive-offload")["fix"],
        "ethtool -K vb gro on"
    );

    let st = ns.state("state.json");
    let out = ns.ok(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    assert!(out.contains("applied"), "{out}");
    let after = ns.snapshot("vb");
    assert!(
        after.0.contains("generic-receive-offload: on"),
        "{}",
        after.0
    );
    assert!(after.0.contains("rx-udp-gro-forwarding: on"));
    assert_eq!(after.2.trim(), "50000");
    assert_eq!(after.3.trim(), "2");
    let mode = std::fs::metadata(&st).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the state file is private");
    let v: serde_json::Value =
        serde_json::from_str(&ns.ok(&["doctor", "--dev", "vb", "--json"])).unwrap();
    assert_eq!(find(&v, "generic-receive-offload")["status"], "PASS");
    assert_eq!(find(&v, "napi_defer_hard_irqs")["status"], "PASS");

    let out = ns.ok(&["tune", "--revert", path(&st)]);
    assert!(
        out.contains("restored: vb: gro_flush_timeout: 50000 -> 0"),
        "{out}"
    );
    assert_eq!(ns.snapshot("vb"), before, "every changed value is back");

    // Nothing left to restore: it says so, and claims nothing.
    let out = ns.ok(&["tune", "--revert", path(&st)]);
    assert!(!out.contains("restored:"), "{out}");
    assert!(
        out.contains("already at its original value: vb: gro_flush_timeout: 0"),
        "{out}"
    );
    assert_eq!(ns.snapshot("vb"), before);
}

#[test]
fn a_second_apply_merges_and_revert_restores_every_device() {
    if !privileged("a_second_apply_merges", &["ip", "ethtool"]) {
        return;
    }
    let ns = Ns::new("merge");
    let (a0, b0) = (ns.snapshot("va"), ns.snapshot("vb"));
    let st = ns.state("state.json");
    ns.ok(&["tune", "--dev", "va", "--apply", "--state", path(&st)]);
    let out = ns.ok(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    assert!(out.contains("merged"), "{out}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    assert_eq!(saved["devices"], serde_json::json!(["va", "vb"]));
    // A third run on a device already tuned changes nothing and keeps the
    // originals.
    let out = ns.ok(&["tune", "--dev", "va", "--apply", "--state", path(&st)]);
    assert!(out.contains("nothing to change"), "{out}");
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    assert_eq!(again, saved);

    let out = ns.ok(&["tune", "--revert", path(&st)]);
    assert!(out.contains("restored: va:"), "{out}");
    assert!(out.contains("restored: vb:"), "{out}");
    assert_eq!(ns.snapshot("va"), a0, "the first run's originals are back");
    assert_eq!(ns.snapshot("vb"), b0);
}

#[test]
fn revert_refuses_what_tune_never_writes_before_changing_anything() {
    if !privileged("revert_refuses_what_tune_never_writes", &["ip", "ethtool"]) {
        return;
    }
    let ns = Ns::new("evil");
    let st = ns.state("state.json");
    ns.ok(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    assert_eq!(ns.gro_flush("vb"), "50000");
    let victim = ns.dir.join("victim");
    let aslr = std::fs::read_to_string("/proc/sys/kernel/randomize_va_space").unwrap();
    // A valid change first: if anything were written before the check,
    // gro_flush_timeout would become 12345. (The files use the older list
    // form, which earlier versions read too.)
    let valid = r#"{"kind":"sysfs","path":"/sys/class/net/vb/gro_flush_timeout","old":"12345","new":"50000"}"#;
    let evil = [
        (
            format!(r#"{{"kind":"sysfs","path":"{}","old":"x","new":"y"}}"#, victim.display()),
            "not a file tune changes",
        ),
        (
            r#"{"kind":"sysctl","name":"kernel.randomize_va_space","old":0,"new":2}"#.to_string(),
            "not one tune changes",
        ),
        (
            r#"{"kind":"sysfs","path":"/sys/class/net/vb/../../../../../tmp/x/gro_flush_timeout","old":"0","new":"1"}"#.to_string(),
            "not a file tune changes",
        ),
        (
            r#"{"kind":"sysctl","name":"net.core.rmem_max","old":99999999999,"new":1}"#.to_string(),
            "out of range",
        ),
        (
            r#"{"kind":"feature","dev":"vb","name":"loopback","old":true,"new":false}"#.to_string(),
            "not one tune changes",
        ),
        (
            r#"{"kind":"gro_flush_timeout","dev":"../../x","old":1,"new":0}"#.to_string(),
            "not a network interface name",
        ),
    ];
    for (i, (e, needle)) in evil.iter().enumerate() {
        let f = ns.state(&format!("evil{i}.json"));
        write_state(&f, &format!("[{valid},{e}]"));
        let o = ns.fastudp(&["tune", "--revert", path(&f)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{e}: {err}");
        assert!(err.contains(needle), "{e}: {err}");
        assert!(err.contains("change 2"), "{err}");
        assert_eq!(ns.gro_flush("vb"), "50000", "nothing written for {e}");
    }
    assert!(!victim.exists(), "revert created a file it was told to");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/randomize_va_space").unwrap(),
        aslr
    );
    // A state file another user could have edited is not trusted.
    let f = ns.state("open.json");
    write_state(
        &f,
        &format!(r#"{{"version":2,"devices":["vb"],"changes":[{valid}]}}"#),
    );
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = ns.fastudp(&["tune", "--revert", path(&f)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("other users"));
    assert_eq!(ns.gro_flush("vb"), "50000");
    ns.ok(&["tune", "--revert", path(&st)]);
}

/// `--revert` is all or nothing. A file whose changes are each in range
/// but which the system cannot take (more channels than the veth has) is
/// refused before any write; one the system does not take when written (a
/// feature whose dependency is off) makes the values restored before it
/// go back. Either way nothing is left half reverted.
#[test]
fn revert_is_all_or_nothing() {
    if !privileged("revert_is_all_or_nothing", &["ip", "ethtool"]) {
        return;
    }
    let ns = Ns::new("atomic");
    let st = ns.state("state.json");
    ns.ok(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    assert_eq!(ns.gro_flush("vb"), "50000");
    // Restored first (a revert goes from the last change back).
    let gro = r#"{"kind":"gro_flush_timeout","dev":"vb","old":12345,"new":50000}"#;
    let channels = r#"{"kind":"channels","dev":"vb","old":[4000,4000],"new":[1,1]}"#;
    let feature =
        r#"{"kind":"feature","dev":"vb","name":"tx-udp-segmentation","old":true,"new":false}"#;
    // Without tx checksumming, UDP segmentation cannot come on.
    sh(&[
        "ip", "netns", "exec", &ns.name, "ethtool", "-K", "vb", "tx", "off",
    ]);
    for (i, (first, needle)) in [(channels, "maximum"), (feature, "set back")]
        .iter()
        .enumerate()
    {
        let f = ns.state(&format!("partial{i}.json"));
        write_state(
            &f,
            &format!(r#"{{"version":2,"devices":["vb"],"changes":[{first},{gro}]}}"#),
        );
        let o = ns.fastudp(&["tune", "--revert", path(&f)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "{err}");
        assert!(err.contains("nothing was changed"), "{err}");
        assert_eq!(ns.gro_flush("vb"), "50000", "{first}: half reverted");
    }
}

#[test]
fn apply_never_follows_a_symlinked_state_file_nor_trusts_an_open_directory() {
    if !privileged(
        "apply_never_follows_a_symlinked_state_file",
        &["ip", "ethtool"],
    ) {
        return;
    }
    let ns = Ns::new("link");
    let before = ns.snapshot("vb");
    let important = ns.dir.join("important");
    std::fs::write(&important, "keep me\n").unwrap();
    let link = ns.state("state.json");
    std::os::unix::fs::symlink(&important, &link).unwrap();
    let o = ns.fastudp(&["tune", "--dev", "vb", "--apply", "--state", path(&link)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&important).unwrap(), "keep me\n");
    assert_eq!(ns.snapshot("vb"), before, "nothing applied");
    // A revert through the link is refused too.
    let o = ns.fastudp(&["tune", "--revert", path(&link)]);
    assert_eq!(o.status.code(), Some(2));

    // A directory anyone can write: refused, unless sticky and the file new.
    let open = ns.dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let st = open.join("state.json");
    let o = ns.fastudp(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("other users can write"), "{err}");
    assert_eq!(ns.snapshot("vb"), before, "nothing applied");
    assert!(!st.exists());
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    ns.ok(&["tune", "--dev", "vb", "--apply", "--state", path(&st)]);
    ns.ok(&["tune", "--revert", path(&st)]);
    assert_eq!(ns.snapshot("vb"), before);
}

/// Bad input is exit status 2, a run that fails (here the plan cannot be
/// written out) exit status 1; each says why in one line. Nothing here
/// changes the host: the run that fails is a dry run.
#[test]
fn tune_exits_2_for_bad_input_and_1_for_a_failed_run() {
    let o = fastudp(&["tune", "--dev", "no-such-dev0"]);
    common::assert_one_line_error(&o, 2, "--dev no-such-dev0: no such device");
    let o = fastudp(&["tune", "--revert", "/nonexistent/state.json"]);
    let why = if common::root() {
        "/nonexistent/state.json: no such state file"
    } else {
        "tune --revert needs root"
    };
    common::assert_one_line_error(&o, 2, why);
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        common::skip(
            "tune_exits_2_for_bad_input_and_1_for_a_failed_run",
            "no /dev/full here",
        );
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(["tune", "--dev", "lo"])
        .stdout(full)
        .output()
        .expect("run fastudp");
    common::assert_one_line_error(&o, 1, "cannot write to standard output");
}

#[test]
fn tune_without_root_is_a_dry_run_and_a_missing_state_file_is_refused() {
    let o = fastudp(&["tune", "--revert", "/nonexistent/state.json"]);
    assert_eq!(o.status.code(), Some(2));
    let o = fastudp(&["tune", "--dev", "lo"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("dry run"));
}
