//! The `fastudp` command: argument parsing and dispatch only.

/// Prints a line to standard output (or `--logfile`) like `println!`, but a failed write
/// (a full disk, say) ends the program with a clear message and status 1
/// instead of a panic message. The stack still unwinds, so guards such as
/// the testbed's clean up. (A closed pipe ends it by SIGPIPE, as for any
/// Unix tool.)
macro_rules! outln {
    () => {
        outln!("")
    };
    ($($t:tt)*) => {{
        if let Err(e) = $crate::out::line(format_args!($($t)*)) {
            $crate::stdout_failed(e)
        }
    }};
}

mod bench;
mod control;
mod host;
mod interrupt;
mod out;
mod procfs;
mod stream;
mod testbed;
mod txrx;

use clap::{Parser, Subcommand};

/// Checks before a run that `path` (the value of option `opt`) can be
/// written, so that a bad path is an error up front rather than after the
/// run, with its results lost. Only a regular file (or a path where none
/// exists yet) is probed by opening it; a file the probe creates is removed
/// again. FIFOs, devices and symbolic links are left as they are.
pub(crate) fn check_output_path(opt: &str, path: &str) -> Result<(), String> {
    let p = std::path::Path::new(path);
    if path.is_empty() {
        return Err(format!("{opt}: give a file name"));
    }
    if p.is_dir() {
        return Err(format!("{opt} {path}: is a directory; give a file name"));
    }
    match p.symlink_metadata() {
        Ok(m) if m.is_file() => std::fs::OpenOptions::new()
            .append(true)
            .open(p)
            .map(drop)
            .map_err(|e| format!("{opt} {path}: cannot write there: {e}")),
        Ok(_) => Ok(()),
        Err(_) => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(|e| format!("{opt} {path}: cannot write there: {e}"))?;
            let _ = std::fs::remove_file(p);
            Ok(())
        }
    }
}

/// The unwinding payload of a failed write to standard output.
struct StdoutFailed(std::io::Error);

/// Ends the program after standard output failed: unwinds to `main`,
/// which says so and exits with status 1.
fn stdout_failed(e: std::io::Error) -> ! {
    std::panic::resume_unwind(Box::new(StdoutFailed(e)))
}
use std::process::ExitCode;

/// Measure and compare UDP send/receive strategies on this host.
#[derive(Parser, Debug)]
#[command(name = "fastudp", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Compare every send and receive strategy side by side on loopback,
    /// with a TCP baseline.
    Bench(bench::BenchArgs),
    /// Send to a host running `fastudp rx` (or any UDP receiver), with the
    /// flags of udpgso_bench_tx.
    Tx(txrx::TxArgs),
    /// Receive from `fastudp tx` (or any UDP sender), with the flags of
    /// udpgso_bench_rx.
    Rx(txrx::RxArgs),
    /// Check this host's kernel, devices, qdiscs, sysctls and UDP error
    /// counters, and say how to fix what keeps UDP slow.
    Doctor(host::DoctorArgs),
    /// Apply what doctor recommends (dry run by default), or revert it.
    Tune(host::tune::TuneArgs),
    /// Stream many paced flows to `fastudp stream-rx` (the paper's server).
    Stream(stream::StreamArgs),
    /// Receive the flows of `fastudp stream` through reuseport groups and
    /// report per-flow rate, loss and burstiness.
    StreamRx(stream::StreamRxArgs),
    /// Build or remove two network namespaces joined by a veth pair (root).
    Testbed {
        #[command(subcommand)]
        action: TestbedCmd,
    },
}

#[derive(Subcommand, Debug)]
enum TestbedCmd {
    /// Build the pair with an offload profile (replacing an existing one).
    Up {
        /// offload, wire, wire-gro, nocsum or sink.
        profile: testbed::Profile,
    },
    /// Remove the pair.
    Down,
}

/// A command's failure: a message and an exit status (2 for bad input and
/// unusable set-ups, 1 for a run that broke off).
#[derive(Debug)]
pub struct Failure {
    /// Exit status.
    pub code: u8,
    /// One line for people.
    pub msg: String,
}

impl Failure {
    /// Bad input or an unusable set-up: exit status 2.
    pub fn usage(msg: String) -> Self {
        Failure { code: 2, msg }
    }
}

impl From<String> for Failure {
    fn from(msg: String) -> Self {
        Failure::usage(msg)
    }
}

fn main() -> ExitCode {
    fastudp::os::default_sigpipe();
    let cli = Cli::parse();
    let r = match std::panic::catch_unwind(move || run(cli)) {
        Ok(r) => r,
        Err(payload) => match payload.downcast::<StdoutFailed>() {
            Ok(e) => Err(Failure {
                code: 1,
                msg: format!("cannot write to standard output: {}", e.0),
            }),
            Err(other) => std::panic::resume_unwind(other),
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) if f.code == interrupt::EXIT_STATUS => {
            eprintln!("fastudp: {}", f.msg);
            ExitCode::from(f.code)
        }
        Err(f) => {
            eprintln!("fastudp: error: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

/// Runs the subcommand.
fn run(cli: Cli) -> Result<(), Failure> {
    match cli.cmd {
        Cmd::Tx(a) => txrx::run_tx(a),
        Cmd::Doctor(a) => host::run_doctor(a),
        Cmd::Stream(a) => stream::run_stream(a),
        Cmd::StreamRx(a) => stream::run_stream_rx(a),
        Cmd::Tune(a) => host::tune::run_tune(a),
        Cmd::Rx(a) => txrx::run_rx(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Testbed {
            action: TestbedCmd::Up { profile },
        } => testbed::up(profile)
            .map(|()| {
                let (v4, v6) = (testbed::addrs(false), testbed::addrs(true));
                outln!(
                    "testbed up: {} ({}, {}) <-> {} ({}, {}), veth {} <-> {}",
                    testbed::TX_NS,
                    v4.tx,
                    v6.tx,
                    testbed::RX_NS,
                    v4.rx,
                    v6.rx,
                    testbed::TX_DEV,
                    testbed::RX_DEV
                )
            })
            .map_err(Failure::from),
        Cmd::Testbed {
            action: TestbedCmd::Down,
        } => testbed::down()
            .map(|()| outln!("testbed down"))
            .map_err(Failure::from),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_paths_are_checked_before_a_run() {
        let dir = std::env::temp_dir();
        let d = dir.to_str().unwrap();
        assert!(super::check_output_path("--x", d)
            .unwrap_err()
            .contains("is a directory"));
        assert!(super::check_output_path("--x", "").is_err());
        assert!(super::check_output_path("--x", "/nonexistent-dir/a.csv")
            .unwrap_err()
            .contains("cannot write there"));
        let f = dir.join(format!("fastudp-check-{}.csv", std::process::id()));
        super::check_output_path("--x", f.to_str().unwrap()).unwrap();
        assert!(!f.exists(), "the check leaves no file behind");
        // A dangling symbolic link is left alone, not replaced or removed.
        let link = dir.join(format!("fastudp-link-{}.csv", std::process::id()));
        let target = dir.join(format!("fastudp-target-{}.csv", std::process::id()));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        super::check_output_path("--x", link.to_str().unwrap()).unwrap();
        assert!(link.symlink_metadata().is_ok() && !target.exists());
        let _ = std::fs::remove_file(&link);
        // An existing file keeps its contents.
        std::fs::write(&f, "keep").unwrap();
        super::check_output_path("--x", f.to_str().unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep");
        let _ = std::fs::remove_file(&f);
    }
}
