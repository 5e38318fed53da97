//! Helpers the tests of the fastudp crates share (a dev-dependency of
//! each; not published).
//!
//! A test that cannot run here (no root, no `ip`, no aioquic, no
//! io_uring...) calls [`skip`]: it says so on the process's standard
//! error, where `cargo test` shows it without `--nocapture`, and, when
//! `FASTUDP_SKIP_LOG` names a file, appends one line `test<TAB>why` to it.
//! `scripts/test.sh` (the README's test command) sets that variable and
//! ends the run with a count of the tests that skipped, by reason. Under
//! `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (set in CI) a skip is a failure.

use std::io::Write;

/// The variable that names the file skips are appended to.
pub const SKIP_LOG: &str = "FASTUDP_SKIP_LOG";

/// The variable that turns a skip into a failure (set in CI).
pub const REQUIRE: &str = "FASTUDP_REQUIRE_PRIVILEGED_TESTS";

/// The calling test's name: the test thread's name (the harness names
/// each test's thread after the test's path).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string()
}

/// Says that `test` does not run and why, or fails it instead under
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (as in CI).
///
/// The line goes straight to the process's standard error, past the test
/// harness's capture (which takes only `print!`/`eprint!`), so that
/// `cargo test` shows it among the results without `--nocapture`: a test
/// that skipped is visible, not a silent `ok`. The skip is also recorded
/// (see [`note`]).
pub fn skip(test: &str, why: &str) {
    if std::env::var(REQUIRE).as_deref() == Ok("1") {
        panic!("{test}: {why} ({REQUIRE}=1 forbids skipping)");
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED {test}: {why} ({REQUIRE}=1 makes this a failure)"
    );
    record(test, why);
}

/// Says that `test` does not run and why, and records it, but never fails:
/// for a test whose want (a kernel feature, `/proc`) CI does not require.
pub fn note(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
    record(test, why);
}

/// Appends `test<TAB>why` to the file `FASTUDP_SKIP_LOG` names, if any,
/// in one `write` on a file opened to append: lines of concurrent tests
/// and test binaries do not interleave.
fn record(test: &str, why: &str) {
    let Some(path) = std::env::var_os(SKIP_LOG) else {
        return;
    };
    let line = format!(
        "{}\t{}\n",
        test.replace(['\t', '\n'], " "),
        why.replace(['\t', '\n'], " ")
    );
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    match f {
        Ok(mut f) => {
            if let Err(e) = f.write_all(line.as_bytes()) {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "warning: could not record the skip in {}: {e}",
                    path.to_string_lossy()
                );
            }
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "warning: could not open {} to record the skip: {e}",
                path.to_string_lossy()
            );
        }
    }
}

/// Runs `test` (its full path in the calling test binary, `module::name`)
/// in a child with no `ip`, `ethtool` or `python3` on its `PATH`: without
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS` it passes and prints a line
/// "SKIPPED ...{name}: {why}" on stderr (not a silent `ok`, and shown
/// without `--nocapture`) and records the skip in `FASTUDP_SKIP_LOG`; with
/// the variable set to 1 it fails and names the variable.
pub fn skip_is_visible_and_fails_in_ci(test: &str, why: &str) {
    let name = test.rsplit("::").next().unwrap_or(test);
    let me = std::env::current_exe().expect("the test binary");
    let log = std::env::temp_dir().join(format!(
        "fastudp-skip-check-{}-{name}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let run = |require: bool| {
        let mut c = std::process::Command::new(&me);
        c.args([test, "--exact"])
            .env("PATH", "/nonexistent")
            .env(SKIP_LOG, &log);
        if require {
            c.env(REQUIRE, "1");
        } else {
            c.env_remove(REQUIRE);
        }
        c.output().expect("run the test binary")
    };
    let o = run(false);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("SKIPPED ") && l.contains(&format!("{name}: {why}"))),
        "the skip is not shown without --nocapture: {out}\n{err}"
    );
    let recorded = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        recorded
            .lines()
            .any(|l| l.contains(name) && l.contains(&format!("\t{why}"))),
        "the skip is not recorded in {SKIP_LOG}: {recorded:?}"
    );
    let o = run(true);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("FASTUDP_REQUIRE_PRIVILEGED_TESTS=1"), "{out}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `to_skip` below, run in a child: its skip is shown, recorded once
    /// (a tab in the reason flattened), and a failure under
    /// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`.
    #[test]
    fn a_skip_is_shown_recorded_and_fails_in_ci() {
        let me = std::env::current_exe().unwrap();
        let log = std::env::temp_dir().join(format!("fastudp-ts-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let run = |require: bool| {
            let mut c = std::process::Command::new(&me);
            c.args(["tests::to_skip", "--exact"])
                .env("FASTUDP_TEST_SUPPORT_CHILD", "1")
                .env(SKIP_LOG, &log);
            if require {
                c.env(REQUIRE, "1");
            } else {
                c.env_remove(REQUIRE);
            }
            c.output().unwrap()
        };
        let o = run(false);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("SKIPPED tests::to_skip: no such\ttool"),
            "{err}"
        );
        let rec = std::fs::read_to_string(&log).unwrap();
        assert_eq!(rec, "tests::to_skip\tno such tool\n");
        let o = run(true);
        assert!(!o.status.success());
        assert!(String::from_utf8_lossy(&o.stdout).contains("FASTUDP_REQUIRE_PRIVILEGED_TESTS=1"));
        // A failed test records nothing.
        assert_eq!(std::fs::read_to_string(&log).unwrap(), rec);
        let _ = std::fs::remove_file(&log);
    }

    /// Skips when run as the child above; passes otherwise.
    #[test]
    fn to_skip() {
        if std::env::var_os("FASTUDP_TEST_SUPPORT_CHILD").is_some() {
            skip(&current_test(), "no such\ttool");
        }
    }
}
