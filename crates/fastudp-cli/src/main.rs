//! The `fastudp` command: argument parsing and dispatch only.

// Every `unsafe` operation the command needs lives behind a safe function
// in the library's `sys` module.
#![forbid(unsafe_code)]

#[macro_use]
mod output;
#[macro_use]
mod failure;
mod args;
mod bench;
mod engine;
mod host;
mod interrupt;
#[cfg(test)]
mod layers;
mod procfs;
mod quic;
mod soak;
mod stream;
mod testbed;
mod txrx;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
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
    Doctor(host::doctor::DoctorArgs),
    /// Apply what doctor recommends (dry run by default), or revert it.
    Tune(host::tune::TuneArgs),
    /// Stream many paced flows to `fastudp stream-rx` (the paper's server).
    Stream(stream::StreamArgs),
    /// Receive the flows of `fastudp stream` through reuseport groups and
    /// report per-flow rate, loss and burstiness.
    StreamRx(stream::StreamRxArgs),
    /// Soak with fault injection (root; run it through scripts/soak.sh).
    #[command(hide = true)]
    Soak(soak::SoakArgs),
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
}

#[derive(Subcommand, Debug)]
enum TestbedCmd {
    /// Build the pair with an offload profile (replacing an existing one).
    Up {
        /// The veth pair's profile.
        profile: testbed::Profile,
    },
    /// Remove the pair.
    Down,
}

fn main() -> ExitCode {
    let matches = match args::allow_negative_numbers(Cli::command()).try_get_matches() {
        Ok(m) => m,
        Err(e) => match args::bad_value_line(&e) {
            Some(line) => {
                eprintln!("fastudp: error: {line}");
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let r = run(cli);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = failure::exit_status(&e);
            if code == 0 {
                // Standard output was closed (`| head`): nothing to say.
            } else if code == interrupt::EXIT_STATUS {
                eprintln!("fastudp: {e:#}");
            } else {
                eprintln!("fastudp: error: {e:#}");
            }
            ExitCode::from(code)
        }
    }
}

/// Runs the subcommand.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Tx(a) => txrx::run_tx(a)?,
        Cmd::Doctor(a) => host::doctor::run_doctor(a)?,
        Cmd::Stream(a) => stream::run_stream(a)?,
        Cmd::StreamRx(a) => stream::run_stream_rx(a)?,
        Cmd::Tune(a) => host::tune::run_tune(a)?,
        Cmd::Rx(a) => txrx::run_rx(a)?,
        Cmd::Bench(a) => bench::run(a)?,
        Cmd::Soak(a) => soak::run(a)?,
        Cmd::Quic { action } => quic::run(action)?,
        Cmd::Testbed {
            action: TestbedCmd::Up { profile },
        } => {
            testbed::up(profile)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Every option that takes a value takes a negative number as its
    /// value: never "unexpected argument '-1'".
    #[test]
    fn every_option_with_a_value_takes_a_negative_number() {
        fn walk(cmd: &clap::Command, path: Vec<String>, checked: &mut usize) {
            for a in cmd.get_arguments() {
                if !a.get_action().takes_values() || a.is_positional() {
                    continue;
                }
                let flag = match (a.get_long(), a.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    _ => continue,
                };
                let mut argv = vec!["fastudp".to_string()];
                argv.extend(path.iter().cloned());
                argv.extend([flag.clone(), "-1".into()]);
                let cmd = args::allow_negative_numbers(Cli::command());
                if let Err(e) = cmd.try_get_matches_from(&argv) {
                    assert_ne!(
                        e.kind(),
                        clap::error::ErrorKind::UnknownArgument,
                        "{argv:?}: {e}"
                    );
                }
                *checked += 1;
            }
            for s in cmd.get_subcommands() {
                let mut p = path.clone();
                p.push(s.get_name().to_string());
                walk(s, p, checked);
            }
        }
        let mut checked = 0;
        walk(&Cli::command(), Vec::new(), &mut checked);
        assert!(checked > 40, "only {checked} options checked");
    }

    /// The help of `testbed up` lists every profile, and its own words
    /// name all of them or none (a list written by hand falls behind).
    #[test]
    fn testbed_up_help_names_every_profile() {
        let mut cmd = Cli::command();
        let up = cmd
            .find_subcommand_mut("testbed")
            .and_then(|t| t.find_subcommand_mut("up"))
            .expect("testbed up");
        let arg = up
            .get_arguments()
            .find(|a| a.get_id() == "profile")
            .expect("profile");
        let own = format!(
            "{} {}",
            arg.get_help().map(|h| h.to_string()).unwrap_or_default(),
            arg.get_long_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
        );
        let names: Vec<String> = testbed::Profile::value_variants()
            .iter()
            .map(|p| p.to_possible_value().unwrap().get_name().to_string())
            .collect();
        let named = names
            .iter()
            .filter(|n| {
                own.split(|c: char| !c.is_alphanumeric() && c != '-')
                    .any(|w| w == n.as_str())
            })
            .count();
        assert!(named == 0 || named == names.len(), "{own:?}");
        for long in [false, true] {
            let help = if long {
                up.render_long_help().to_string()
            } else {
                up.render_help().to_string()
            };
            for n in &names {
                assert!(help.contains(n.as_str()), "{n} missing from {help}");
            }
        }
    }
}
