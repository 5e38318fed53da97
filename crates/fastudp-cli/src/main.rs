//! The `fastudp` command: argument parsing and dispatch only.

mod bench;
mod procfs;

use clap::{Parser, Subcommand};
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Bench(a) => bench::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastudp: error: {e}");
            ExitCode::from(2)
        }
    }
}
