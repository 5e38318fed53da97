//! The C side of libfastudp, from C: compiles the examples
//! (`examples/c/`) and the C API tests (`tests/c/api_test.c`) against the
//! library and the checked-in header, then
//! - runs the API tests (argument checks, errors, GSO and GRO, the
//!   coalescer, ICMP errors, fallbacks, a panic inside the library coming
//!   back as `FASTUDP_ERR_PANIC` through the `test-hooks` build);
//! - has the example receiver and sender exchange 100,000 datagrams over
//!   loopback, every byte checked, nothing lost (the sender keeps within
//!   the receiver's acknowledged window);
//! - does both again built with AddressSanitizer, and runs the API tests
//!   under valgrind.
//!
//! The library is built here, with the `test-hooks` feature, into
//! `target/capi-test` (apart from the workspace build, whose features
//! vary). Without a C compiler (or valgrind) the tests say so and pass,
//! unless `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (CI), where they fail.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const DATAGRAMS: u64 = 100_000;

/// The libraries a Rust static library needs on Linux (rustc's
/// `--print native-static-libs` for the standard library).
const NATIVE_LIBS: [&str; 7] = [
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Skips (prints why) or, under FASTUDP_REQUIRE_PRIVILEGED_TESTS=1, fails.
fn skip(why: &str) {
    fastudp_test_support::skip(&fastudp_test_support::current_test(), why);
}

fn compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn have(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The workspace's target directory, from this test's own path
/// (`target/debug/deps/c-HASH`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("target/PROFILE/deps/EXE")
        .to_path_buf()
}

/// Builds libfastudp with the test hooks (once per test run) and returns
/// the static library.
fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = target_dir().join("capi-test");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(repo())
            .args([
                "build",
                "-p",
                "fastudp-ffi",
                "--lib",
                "--features",
                "test-hooks",
            ])
            .arg("--target-dir")
            .arg(&dir)
            .output()
            .expect("run cargo");
        assert!(
            out.status.success(),
            "building libfastudp failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir.join("debug/libfastudp_ffi.a")
    })
}

/// Compiles one C program; `asan` adds AddressSanitizer.
fn compile(source: &Path, out: &Path, asan: bool) {
    let mut cmd = Command::new(compiler());
    cmd.args([
        "-std=c11",
        "-D_GNU_SOURCE",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
    ])
    .arg("-DFASTUDP_TEST_HOOKS")
    .arg("-I")
    .arg(repo().join("include"))
    .arg("-I")
    .arg(repo().join("examples/c"));
    if asan {
        cmd.args(["-O1", "-fsanitize=address", "-fno-omit-frame-pointer"]);
    } else {
        cmd.arg("-O2");
    }
    cmd.arg("-o").arg(out).arg(source).arg(library());
    cmd.args(NATIVE_LIBS);
    let o = cmd.output().expect("run the C compiler");
    assert!(
        o.status.success(),
        "compiling {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A directory for this test's programs.
fn work(name: &str) -> PathBuf {
    let d = target_dir().join("capi-test/bin").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The `key=value` fields of a `summary:` line.
fn field(summary: &str, key: &str) -> u64 {
    summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {summary}"))
        .parse::<f64>()
        .unwrap_or_else(|_| panic!("{key} is not a number in {summary}")) as u64
}

fn run_api_test(exe: &Path, wrapper: &[&str]) {
    let mut cmd = if wrapper.is_empty() {
        Command::new(exe)
    } else {
        let mut c = Command::new(wrapper[0]);
        c.args(&wrapper[1..]).arg(exe);
        c
    };
    // A panic prints nothing (the library keeps its message and place
    // for fastudp_last_error_message), even with backtraces asked for.
    let o = cmd
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run api_test");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    eprintln!("{stdout}");
    assert!(
        o.status.success(),
        "api_test failed ({}):\n{stdout}\n{stderr}",
        o.status
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(
        !stderr.contains("panicked"),
        "a panic inside libfastudp printed on the host's stderr:\n{stderr}"
    );
    assert!(
        stdout.contains("panic hook: tested"),
        "the panic test did not run: {stdout}"
    );
}

/// Runs the example receiver and sender: DATAGRAMS datagrams, checked.
fn exchange(receiver: &Path, sender: &Path, extra: &[&str]) {
    let mut rx = Command::new(receiver)
        .args([
            "-p",
            "0",
            "-n",
            &DATAGRAMS.to_string(),
            "-c",
            "-a",
            "-q",
            "-i",
            "10",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the receiver");
    let mut lines = BufReader::new(rx.stdout.take().unwrap()).lines();
    let first = lines.next().expect("the receiver's first line").unwrap();
    let port = first
        .strip_prefix("listening on port ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    let tx = Command::new(sender)
        .args(["-p", &port, "-n", &DATAGRAMS.to_string(), "-a", "-q"])
        .args(extra)
        .output()
        .expect("run the sender");
    let tx_out = String::from_utf8_lossy(&tx.stdout);
    assert!(
        tx.status.success(),
        "sender failed: {tx_out}{}",
        String::from_utf8_lossy(&tx.stderr)
    );
    let summary: String = lines
        .map_while(Result::ok)
        .find(|l| l.starts_with("summary:"))
        .expect("the receiver's summary");
    let status = rx.wait().unwrap();
    eprintln!("{}{summary}", tx_out);
    assert!(status.success(), "receiver failed: {summary}");
    assert_eq!(field(tx_out.trim(), "datagrams"), DATAGRAMS, "{tx_out}");
    assert_eq!(field(&summary, "datagrams"), DATAGRAMS, "{summary}");
    assert_eq!(field(&summary, "bytes"), DATAGRAMS * 1216, "{summary}");
    for k in ["lost", "duplicates", "corrupt", "out_of_range"] {
        assert_eq!(field(&summary, k), 0, "{k}: {summary}");
    }
}

#[test]
fn c_examples_exchange_100k_datagrams_and_api_tests_pass() {
    if !have(&compiler(), "--version") {
        return skip(&format!("no C compiler ({} --version failed)", compiler()));
    }
    let dir = work("plain");
    let ex = repo().join("examples/c");
    let (api, rx, tx) = (
        dir.join("api_test"),
        dir.join("receiver"),
        dir.join("sender"),
    );
    compile(
        &repo().join("crates/fastudp-ffi/tests/c/api_test.c"),
        &api,
        false,
    );
    compile(&ex.join("receiver.c"), &rx, false);
    compile(&ex.join("sender.c"), &tx, false);
    run_api_test(&api, &[]);
    exchange(&rx, &tx, &[]);
    exchange(&rx, &tx, &["-6"]);
}

#[test]
fn c_tests_under_address_sanitizer() {
    let cc = compiler();
    if !have(&cc, "--version") {
        return skip(&format!("no C compiler ({cc} --version failed)"));
    }
    let dir = work("asan");
    let probe = dir.join("probe.c");
    std::fs::write(&probe, "int main(void) { return 0; }\n").unwrap();
    let ok = Command::new(&cc)
        .arg("-fsanitize=address")
        .arg("-o")
        .arg(dir.join("probe"))
        .arg(&probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return skip(&format!("{cc} cannot build with -fsanitize=address"));
    }
    let ex = repo().join("examples/c");
    let (api, rx, tx) = (
        dir.join("api_test"),
        dir.join("receiver"),
        dir.join("sender"),
    );
    compile(
        &repo().join("crates/fastudp-ffi/tests/c/api_test.c"),
        &api,
        true,
    );
    compile(&ex.join("receiver.c"), &rx, true);
    compile(&ex.join("sender.c"), &tx, true);
    // Any report fails the run: ASan exits non-zero on an error, and
    // LeakSanitizer (on by default on Linux) on a leak.
    run_api_test(&api, &[]);
    exchange(&rx, &tx, &[]);
}

#[test]
fn c_api_tests_under_valgrind() {
    if !have(&compiler(), "--version") {
        return skip(&format!("no C compiler ({} --version failed)", compiler()));
    }
    if !have("valgrind", "--version") {
        return skip("no valgrind");
    }
    let dir = work("valgrind");
    let api = dir.join("api_test");
    compile(
        &repo().join("crates/fastudp-ffi/tests/c/api_test.c"),
        &api,
        false,
    );
    run_api_test(
        &api,
        &[
            "valgrind",
            "-q",
            "--error-exitcode=86",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
        ],
    );
}

/// Sizes out of range (`SIZE_MAX`, 2^40 trains) and allocations that fail
/// under a memory limit (`RLIMIT_AS`) come back as error codes: the host
/// program neither aborts nor gets a line on its stderr. Without
/// sanitizers, which reserve address space of their own.
#[test]
fn c_allocation_failures_are_error_codes_and_print_nothing() {
    if !have(&compiler(), "--version") {
        return skip(&format!("no C compiler ({} --version failed)", compiler()));
    }
    let dir = work("alloc");
    let exe = dir.join("alloc_test");
    compile(
        &repo().join("crates/fastudp-ffi/tests/c/alloc_test.c"),
        &exe,
        false,
    );
    let o = Command::new(&exe)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run alloc_test");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "alloc_test failed ({}):\n{stdout}\nstderr:\n{stderr}",
        o.status
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(
        stderr.is_empty(),
        "libfastudp wrote to the host's stderr:\n{stderr}"
    );
}
