//! `fastudp doctor`: what keeps this host's UDP slow, and how to fix it.

mod check;
mod counters;
mod device;
mod kernel;
mod uring;

use super::devices::{is_device, up_devices};
use super::{netlink, routes};
use crate::failure::usage;
use anyhow::Context;
use check::{Check, Status};
use clap::Args;
use counters::{counter_checks, sysctl_checks, watch, CountersSince};
use device::device_checks;
use kernel::kernel_checks;

/// Options of `fastudp doctor`.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Check the device that routes to this host, a name or an address
    /// (default: every interface that is up).
    #[arg(long, value_name = "HOST")]
    pub dest: Option<String>,
    /// Check this device.
    #[arg(long, value_name = "IFACE", conflicts_with = "dest")]
    pub dev: Option<String>,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Then sample the UDP error counters every second for SECS seconds
    /// and print their rates.
    #[arg(long, value_name = "SECS")]
    pub watch: Option<u64>,
    /// Judge the io_uring check for a program that turns the library's
    /// io_uring backend on (`Config::uring`, or `bench`'s `uring-*`
    /// strategies): a host where it cannot run is then a warning, with the
    /// fix when a sysctl is the cause.
    #[arg(long)]
    pub uring: bool,
}

/// Runs every check.
pub fn diagnose(a: &DoctorArgs) -> anyhow::Result<Vec<Check>> {
    let devs = match (&a.dev, &a.dest) {
        (Some(d), _) => {
            if !is_device(d) {
                bail_usage!("--dev {d}: no such device in this network namespace");
            }
            vec![d.clone()]
        }
        (None, Some(host)) => {
            let ip = crate::args::resolve_as("--dest", host, 0, false, false)?.ip();
            // The host asked for has no route here: the check cannot be
            // made, as with a device that does not exist.
            vec![routes::device_for(ip).map_err(|e| usage(format!("{e:#}")))?]
        }
        (None, None) => up_devices(),
    };
    let mut out = Vec::new();
    kernel_checks(&mut out, a.uring);
    let qdiscs = netlink::qdiscs();
    for d in &devs {
        device_checks(d, &qdiscs, &mut out);
    }
    sysctl_checks(&mut out);
    counter_checks(&mut out, &CountersSince::here());
    Ok(out)
}

/// The version of `doctor --json`'s layout: it changes when a field is
/// renamed or removed, not when one is added.
pub const SCHEMA: u32 = 1;

/// Runs `fastudp doctor`.
pub fn run_doctor(a: DoctorArgs) -> anyhow::Result<()> {
    if a.watch == Some(0) || a.watch.is_some_and(|w| w > 86_400) {
        bail_usage!("--watch must be 1 to 86400 seconds");
    }
    let checks = diagnose(&a)?;
    if a.json {
        print_json(&checks, a.watch.is_some())?;
    } else {
        print_text(&checks)?;
    }
    if let Some(secs) = a.watch {
        watch(secs, a.json)?;
    }
    Ok(())
}

/// The findings as one JSON document: pretty, or on one line when
/// `--watch` samples follow (then everything is JSON Lines).
fn print_json(checks: &[Check], lines: bool) -> anyhow::Result<()> {
    let since = CountersSince::here();
    let (since, namespace) = since.key();
    let doc = serde_json::json!({
        "schema": SCHEMA,
        "counters_since": since,
        "namespace": namespace,
        "checks": checks,
    });
    let text = if lines {
        serde_json::to_string(&doc)
    } else {
        serde_json::to_string_pretty(&doc)
    };
    out!("{}", text.context("the findings as JSON")?)
}

/// The findings for people, by section, and the count of each verdict.
fn print_text(checks: &[Check]) -> anyhow::Result<()> {
    let mut section = String::new();
    for c in checks {
        if c.section != section {
            let (head, rest) = c.section.split_once(' ').unwrap_or((&c.section, ""));
            // "DEVICE lo", or "SYSCTL" alone (no trailing blank).
            out!("{}", format!("{} {rest}", head.to_uppercase()).trim_end())?;
            section = c.section.clone();
        }
        out!("  {:<5} {:<30} {}", c.status.to_string(), c.name, c.detail)?;
        if let Some(f) = &c.fix {
            out!("        fix: {f}")?;
        }
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    out!(
        "{} PASS, {} WARN, {} FAIL, {} N/A",
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::NA)
    )
}
