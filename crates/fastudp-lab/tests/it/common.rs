//! Helpers of the lab's tests: `fastudp-lab` run to its end or in the
//! background (its output read as it comes, Ctrl-C sent), stall guards
//! that fail a test only when a run hangs, never when it is merely slow,
//! the rule for tests that need root, and `quic serve` started for the
//! attacks.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const LAB: &str = env!("CARGO_BIN_EXE_fastudp-lab");

/// How long any step may take before the test calls it a hang.
pub const STALL: Duration = Duration::from_secs(60);

/// A `fastudp-lab` process running in the background.
pub struct Running {
    child: Child,
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    out_done: bool,
}

impl Drop for Running {
    /// A test that fails half-way leaves nothing running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How a background run ended.
pub struct Ended {
    /// Its exit status.
    pub status: ExitStatus,
    /// All it wrote to standard output.
    pub stdout: String,
    /// All it wrote to standard error.
    pub stderr: String,
}

impl Running {
    /// Starts `fastudp-lab args`.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(LAB, args)
    }

    /// Starts `program args` (such as fastudp-lab under `ip netns exec`).
    pub fn start_with(program: &str, args: &[&str]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Running {
            child,
            lines,
            stdout: Vec::new(),
            stderr: Some(stderr),
            out_done: false,
        }
    }

    /// The lines of standard output read so far.
    pub fn stdout_lines(&self) -> &[String] {
        &self.stdout
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a line of standard output satisfies `want`; panics if
    /// the process ends first or nothing comes within [`STALL`].
    pub fn wait_for_line(&mut self, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + STALL;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.stdout.push(l.clone());
                    if want(&l) {
                        return l;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("no such line within {STALL:?}: {:?}", self.stdout);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.out_done = true;
                    panic!("the run ended first: {:?}", self.stdout);
                }
            }
        }
    }

    /// Sends SIGINT, as Ctrl-C does.
    pub fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.pid().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -INT failed");
    }

    /// Waits for the end (within [`STALL`], else kills it and panics).
    pub fn finish(mut self) -> Ended {
        let deadline = Instant::now() + STALL;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the run did not end within {STALL:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !self.out_done {
            // The pipe closes with the process: the reader ends.
            while let Ok(l) = self.lines.recv_timeout(STALL) {
                self.stdout.push(l);
            }
        }
        Ended {
            status,
            stdout: self.stdout.join("\n"),
            stderr: self
                .stderr
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
        }
    }
}

/// Waits until process `pid` catches SIGINT (its Ctrl-C handler is in
/// place, per /proc/PID/status), so that a SIGINT sent now is handled
/// rather than ending it. Panics after [`STALL`].
pub fn wait_for_sigint_handler(pid: u32) {
    let start = Instant::now();
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (SIGINT - 1)) != 0 {
            return;
        }
        assert!(
            start.elapsed() < STALL,
            "no SIGINT handler within {STALL:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGINT's number on Linux.
const SIGINT: u32 = 2;

/// Runs a command, which must succeed; its standard output.
pub fn sh(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether this process runs as root.
pub fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether `tool` can be run.
pub fn have(tool: &str) -> bool {
    Command::new(tool).arg("-V").output().is_ok()
}

/// True when `test`, which needs root and `tools`, can run. Otherwise it
/// says why it skips, or fails instead under
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (as in CI).
pub fn privileged(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    if root() && missing.is_empty() {
        return true;
    }
    let why = if root() {
        format!("needs {}", missing.join(", "))
    } else {
        format!("needs root and {}", tools.join(", "))
    };
    skip(test, &why);
    false
}

/// Says that `test` does not run and why, or fails it instead under
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (as in CI).
///
/// The line goes straight to the process's standard error, past the
/// test harness's capture (which takes only `print!`/`eprint!`), so that
/// `cargo test` shows it among the results without `--nocapture`: a test
/// that skipped is visible, not a silent `ok`.
pub fn skip(test: &str, why: &str) {
    fastudp_test_support::skip(test, why);
}

/// The testbed's namespaces have fixed names (`fastudp-tx`, `fastudp-rx`):
/// every test that builds them, or checks that none is left, holds this
/// lock, so that the tests of different modules take them one at a time.
pub fn testbed_lock() -> std::sync::MutexGuard<'static, ()> {
    static TESTBED: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TESTBED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The network namespaces `ip netns list` shows.
pub fn namespaces() -> String {
    String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned()
}

/// Runs `fastudp-lab args` to its end.
pub fn lab(args: &[&str]) -> Output {
    Command::new(LAB)
        .args(args)
        .output()
        .expect("run fastudp-lab")
}

/// Runs fastudp-lab, which must succeed, and parses its JSON output.
pub fn lab_json(args: &[&str]) -> Value {
    let o = lab(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

/// Asserts that each of `cases` (arguments, and a word its error must
/// contain) is refused with exit status 2 and one line on standard error,
/// without a panic.
pub fn assert_refused(cases: &[(Vec<&str>, &str)]) {
    for (args, needle) in cases {
        let o = lab(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{err}"
        );
    }
}

/// The server binary: the lab's own `quic serve` (the command's code), or
/// `FASTUDP_QUIC_SERVER_BIN` (to run a test against another build, such
/// as an installed `fastudp`; the attacks stay this build's).
pub fn server_bin() -> String {
    std::env::var("FASTUDP_QUIC_SERVER_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| LAB.to_string())
}

/// A server started with `args` (plus `--json --stats --test-endpoints`,
/// the endpoints the attacks ask for), and its address.
pub fn serve(args: &[&str]) -> (Running, SocketAddr) {
    let mut all = vec!["quic", "serve", "--json", "--stats", "--test-endpoints"];
    all.extend_from_slice(args);
    let mut r = Running::start_with(&server_bin(), &all);
    let l = r.wait_for_line(|l| l.contains("\"listening\""));
    let v: Value = serde_json::from_str(&l).expect("JSON line");
    let addr = v["addr"].as_str().unwrap().parse().unwrap();
    (r, addr)
}

/// The next `--stats` line of a server that satisfies `want`.
pub fn stats_until(r: &mut Running, want: impl Fn(&Value) -> bool) -> Value {
    let l = r.wait_for_line(|l| {
        serde_json::from_str::<Value>(l)
            .map(|v| v["kind"] == "stats" && want(&v))
            .unwrap_or(false)
    });
    serde_json::from_str(&l).unwrap()
}
