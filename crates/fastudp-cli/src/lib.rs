//! The `fastudp` command as a library: its commands and the modules under
//! them (the engine, the testbed, `/proc` readers, the QUIC server and
//! load generator), for the `fastudp` binary (`src/main.rs`) and the lab's
//! `fastudp-lab` (crates/fastudp-lab), which adds the soak, the hostile
//! QUIC clients and the paper's figures. Not published, not a stable API.

// Every `unsafe` operation the command needs lives behind a safe function
// in the library's `sys` module.
#![forbid(unsafe_code)]

#[macro_use]
pub mod output;
#[macro_use]
pub mod failure;
pub mod args;
pub mod bench;
pub mod docs;
pub mod engine;
pub mod host;
pub mod interrupt;
#[cfg(test)]
mod layers;
pub mod procfs;
pub mod quic;
pub mod stream;
pub mod testbed;
pub mod txrx;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// Measure and compare UDP send/receive strategies on this host.
#[derive(Parser, Debug)]
#[command(name = "fastudp", version, about, long_about = None)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// The commands of `fastudp`.
#[derive(Subcommand, Debug)]
// Parsed once at start: the size of the largest variant (`quic serve`'s
// options) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Cmd {
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
    Doctor(host::doctor::DoctorArgs),
    /// Apply what doctor recommends (dry run by default), or revert it.
    Tune(host::tune::TuneArgs),
    /// Stream many paced flows to `fastudp stream-rx` (the paper's server).
    Stream(stream::StreamArgs),
    /// Receive the flows of `fastudp stream` through reuseport groups and
    /// report per-flow rate, loss and burstiness.
    StreamRx(stream::StreamRxArgs),
    /// A QUIC server on fastudp in the paper's architecture (HTTP/3 and hq-interop),
    /// its baselines, and a load generator.
    Quic {
        #[command(subcommand)]
        action: quic::QuicCmd,
    },
    /// Build or remove two network namespaces joined by a veth pair (root).
    Testbed {
        #[command(subcommand)]
        action: TestbedCmd,
    },
    /// Print the completion script of a shell (bash, zsh, fish, elvish,
    /// powershell) for `fastudp`.
    Completions(docs::CompletionsArgs),
    /// Print the manual page of `fastudp` (roff), or write one per
    /// command into a directory.
    Man(docs::ManArgs),
}

/// `fastudp testbed ...`.
#[derive(Subcommand, Debug)]
pub enum TestbedCmd {
    /// Build the pair with an offload profile (replacing an existing one).
    Up {
        /// The veth pair's profile.
        profile: testbed::Profile,
    },
    /// Remove the pair.
    Down,
}

/// The rest of `testbed up fleet`: the balancer's ruleset, loaded, and
/// what runs where, said. A ruleset that does not load removes the
/// testbed.
fn fleet_up() -> anyhow::Result<()> {
    use testbed::fleet;
    let plan = quic::lb::fleet_plan();
    if let Err(e) = fleet::load_rules(&quic::lb::ruleset(&plan)) {
        let _ = testbed::down();
        return Err(e);
    }
    out!(
        "testbed up: fleet: clients {} ({}, {}) -> balancer {} (public {}:{}, nftables table {}, QUIC-LB config {}) -> servers:",
        fleet::CLIENTS,
        fleet::CLIENT_ADDR,
        fleet::CLIENT_ADDR2,
        fleet::BALANCER,
        fleet::PUBLIC_ADDR,
        fleet::PORT,
        plan.table,
        fleet::LB_CONFIG
    )?;
    for s in fleet::SERVERS {
        out!(
            "  ip netns exec {} fastudp quic serve --listen {}:{} --lb-config {} --server-id {} --reset-key KEYFILE",
            s.ns,
            s.addr,
            fleet::PORT,
            fleet::LB_CONFIG,
            s.id
        )?;
    }
    out!(
        "clients: ip netns exec {} fastudp quic load {}:{} ...",
        fleet::CLIENTS,
        fleet::PUBLIC_ADDR,
        fleet::PORT
    )?;
    Ok(())
}

/// Parses the command line into `C` (an option's value may be a negative
/// number), runs it with `run`, and exits as [`failure::exit_status`]
/// says, a failure printed on one line after `name: error: `.
pub fn main<C: Parser>(name: &str, run: impl FnOnce(C) -> anyhow::Result<()>) -> ExitCode {
    let matches = match args::allow_negative_numbers(C::command()).try_get_matches() {
        Ok(m) => m,
        Err(e) => match args::bad_value_line(&e) {
            Some(line) => {
                eprintln!("{name}: error: {line}");
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    args::remember(&matches);
    let cli = C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = failure::exit_status(&e);
            if code == 0 {
                // Standard output was closed (`| head`): nothing to say.
            } else if code == interrupt::EXIT_STATUS {
                eprintln!("{name}: {e:#}");
            } else {
                eprintln!("{name}: error: {e:#}");
            }
            ExitCode::from(code)
        }
    }
}

/// Runs a command of `fastudp`.
pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Tx(a) => txrx::run_tx(a)?,
        Cmd::Doctor(a) => host::doctor::run_doctor(a)?,
        Cmd::Stream(a) => stream::run_stream(a)?,
        Cmd::StreamRx(a) => stream::run_stream_rx(a)?,
        Cmd::Tune(a) => host::tune::run_tune(a)?,
        Cmd::Rx(a) => txrx::run_rx(a)?,
        Cmd::Bench(a) => bench::run(a)?,
        Cmd::Quic { action } => quic::run(action)?,
        Cmd::Completions(a) => docs::completions(Cli::command(), &a)?,
        Cmd::Man(a) => docs::man(Cli::command(), &a)?,
        Cmd::Testbed {
            action: TestbedCmd::Up { profile },
        } => {
            testbed::up(profile)?;
            if profile == testbed::Profile::Fleet {
                return fleet_up();
            }
            let (v4, v6) = (testbed::addrs(false), testbed::addrs(true));
            out!(
                "testbed up: {} ({}, {}) <-> {} ({}, {}), veth {} <-> {}",
                testbed::TX_NS,
                v4.tx,
                v6.tx,
                testbed::RX_NS,
                v4.rx,
                v6.rx,
                testbed::TX_DEV,
                testbed::RX_DEV
            )?
        }
        Cmd::Testbed {
            action: TestbedCmd::Down,
        } => {
            testbed::down()?;
            out!("testbed down")?
        }
    }
    Ok(())
}
