//! Shared by the library's and the command's test binaries: checks that a
//! test which cannot run here says so where `cargo test` shows it.

/// Runs `test` (its full path in this test binary, `module::name`) in a
/// child with no `ip`, `ethtool` or `python3` on its `PATH`: without
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS` it passes and prints a line
/// "SKIPPED ...{name}: {why}" on stderr (not a silent `ok`, and shown
/// without `--nocapture`); with it set to 1 it fails and names the
/// variable.
pub fn skip_is_visible_and_fails_in_ci(test: &str, why: &str) {
    let name = test.rsplit("::").next().unwrap_or(test);
    let me = std::env::current_exe().expect("the test binary");
    let run = |require: bool| {
        let mut c = std::process::Command::new(&me);
        c.args([test, "--exact"]).env("PATH", "/nonexistent");
        if require {
            c.env("FASTUDP_REQUIRE_PRIVILEGED_TESTS", "1");
        } else {
            c.env_remove("FASTUDP_REQUIRE_PRIVILEGED_TESTS");
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
    let o = run(true);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("FASTUDP_REQUIRE_PRIVILEGED_TESTS=1"), "{out}");
}
