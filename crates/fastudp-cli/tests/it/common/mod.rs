//! Helpers of the CLI tests: `fastudp` run to its end or in the
//! background (its output read as it comes, Ctrl-C sent), stall guards that
//! fail a test only when a run hangs, never when it is merely slow, and the
//! rule for tests that need root.

#![allow(dead_code)]

pub mod clients;
pub mod quic_server;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long any step may take before the test calls it a hang.
pub const STALL: Duration = Duration::from_secs(60);

/// A `fastudp` process running in the background.
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
    /// Starts `fastudp args`.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(env!("CARGO_BIN_EXE_fastudp"), args)
    }

    /// Starts `program args` (such as fastudp under `ip netns exec`).
    pub fn start_with(program: &str, args: &[&str]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fastudp");
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

    /// Takes the lines already written (kept in the output), so that the
    /// next [`Running::wait_for_line`] sees only what comes after.
    pub fn skip_queued(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            self.stdout.push(l);
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
                panic!("fastudp did not end within {STALL:?}");
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

/// A UDP port free on 127.0.0.1 just now.
pub fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `sock` (with a read timeout) receives a datagram: the
/// sender is running. Panics after [`STALL`].
pub fn wait_for_datagram(sock: &std::net::UdpSocket) {
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 65536];
    while sock.recv(&mut buf).is_err() {
        assert!(start.elapsed() < STALL, "nothing arrived within {STALL:?}");
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

/// Runs `fastudp args` to its end.
pub fn fastudp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(args)
        .output()
        .expect("run fastudp")
}

/// Runs fastudp, which must succeed, and parses its JSON output.
pub fn fastudp_json(args: &[&str]) -> serde_json::Value {
    let o = fastudp(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("valid JSON")
}

/// Starts `fastudp args` in the background, its output piped.
pub fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fastudp")
}

/// Asserts that each of `cases` (arguments, and a word its error must
/// contain) is refused with exit status 2 and one line on standard error,
/// without a panic.
pub fn assert_refused(cases: &[(Vec<&str>, &str)]) {
    for (args, needle) in cases {
        let o = fastudp(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{err}"
        );
    }
}

/// Asserts that a finished `fastudp` exited with `code` (2: bad input, 1:
/// a run that failed) and said why in one line, `fastudp: error: ...`
/// with `needle` in it, without a panic.
pub fn assert_one_line_error(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{err}");
    let lines: Vec<&str> = err.trim().lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("fastudp: error: "), "{err}");
    assert!(lines[0].contains(needle), "{needle:?}: {err}");
}

/// Runs `fastudp args`, which must fail with exit status `status` (2: a
/// usage error, 1: a runtime failure) and exactly one line on standard
/// error, `fastudp: error: ` and then one that starts with `line`.
pub fn assert_fails_with(args: &[&str], status: i32, line: &str) {
    let o = fastudp(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(status), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    assert!(
        err.starts_with(&format!("fastudp: error: {line}")),
        "{args:?}: want `fastudp: error: {line}...`, got: {err}"
    );
}

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

/// A memory figure of process `pid` from /proc/PID/status (`key` such as
/// `VmRSS` or `VmHWM`), bytes; 0 when it cannot be read.
pub fn proc_memory(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
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
