//! `fastudp-lab`: the lab around the `fastudp` command, for tests,
//! scripts and CI; never installed. It runs every command of `fastudp`
//! (from the command's library, `fastudp_cli`), so that a test or a
//! script needs one binary, and adds what users never run: the soak with
//! fault injection (`soak`), hostile QUIC clients (`attack`) and the
//! paper's figures (`figure`).

#![forbid(unsafe_code)]

#[macro_use]
extern crate fastudp_cli;

mod attack;
mod figure;
mod soak;

// The modules of the command's library the lab's own modules name as
// `crate::...`.
use fastudp_cli::{engine, interrupt, output, procfs, testbed};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The lab around `fastudp`: every command of `fastudp`, and the soak,
/// hostile QUIC clients and the paper's figures.
#[derive(Parser, Debug)]
#[command(name = "fastudp-lab", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once at start: the size of the largest variant (all of fastudp's
// commands) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Soak with fault injection (root; run it through scripts/soak.sh).
    Soak(soak::SoakArgs),
    /// Unstable: hostile QUIC clients for a bounded time, against a
    /// server of your own (tests and scripts/quic-attacks.sh).
    Attack(attack::AttackArgs),
    /// Run the rows of one of the paper's figures on the testbed (root).
    Figure(figure::FigureArgs),
    #[command(flatten)]
    Fastudp(fastudp_cli::Cmd),
}

fn main() -> ExitCode {
    fastudp_cli::main("fastudp-lab", |cli: Cli| match cli.cmd {
        Cmd::Soak(a) => soak::run(a),
        Cmd::Attack(a) => attack::run(a),
        Cmd::Figure(a) => figure::main(a),
        Cmd::Fastudp(c) => fastudp_cli::run(c),
    })
}
