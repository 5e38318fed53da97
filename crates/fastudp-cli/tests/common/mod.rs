//! Helpers of the CLI tests that run `fastudp` in the background: its
//! output read as it comes, Ctrl-C sent, and stall guards that fail a test
//! only when a run hangs, never when it is merely slow.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_fastudp"))
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
