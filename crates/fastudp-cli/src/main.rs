//! The `fastudp` command: argument parsing and dispatch only.

mod bench;
mod procfs;
mod testbed;

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Bench(a) => bench::run(a),
        Cmd::Testbed {
            action: TestbedCmd::Up { profile },
        } => testbed::up(profile).map(|()| {
            let (v4, v6) = (testbed::addrs(false), testbed::addrs(true));
            println!(
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
        }),
        Cmd::Testbed {
            action: TestbedCmd::Down,
        } => testbed::down().map(|()| println!("testbed down")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fastudp: error: {e}");
            ExitCode::from(2)
        }
    }
}
