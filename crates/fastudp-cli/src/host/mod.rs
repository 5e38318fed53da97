//! `fastudp doctor`: what keeps this host's UDP slow, and how to fix it.

pub mod netlink;
pub mod routes;
pub mod tune;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_checked() {
        assert!(is_device("lo"));
        for bad in [
            "",
            ".",
            "..",
            "lo/..",
            "../lo",
            "nonexistent0",
            "a b",
            "0123456789abcdefg",
        ] {
            assert!(!is_device(bad), "{bad:?}");
        }
    }

    #[test]
    fn parses_recorded_sysctls() {
        assert_eq!(parse_sysctl("212992\n"), Ok(212_992));
        assert_eq!(parse_sysctl("  4194304 \n"), Ok(4_194_304));
        assert!(
            parse_sysctl("4096\t131072\t6291456\n").is_err(),
            "a vector is not one number"
        );
        assert!(parse_sysctl("").is_err());
    }

    #[test]
    fn status_names() {
        assert_eq!(Status::NA.to_string(), "N/A");
        assert_eq!(serde_json::to_string(&Status::Warn).unwrap(), "\"WARN\"");
        assert_eq!(serde_json::to_string(&Status::NA).unwrap(), "\"N/A\"");
    }
}

use crate::procfs;
use crate::Failure;
use clap::Args;
use serde::Serialize;
use std::net::IpAddr;
use std::time::Duration;

/// Options of `fastudp doctor`.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Check the device that routes to this address (default: every
    /// interface that is up).
    #[arg(long, value_name = "ADDR")]
    pub dest: Option<IpAddr>,
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
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Good.
    Pass,
    /// Works, but slower than it could be.
    Warn,
    /// Broken.
    Fail,
    /// Does not apply, or could not be read.
    #[serde(rename = "N/A")]
    NA,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::NA => "N/A",
        })
    }
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// `kernel`, `device <name>`, `qdisc <name>`, `sysctl` or `udp`.
    pub section: String,
    /// What was checked.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// One line saying why.
    pub detail: String,
    /// The exact command that fixes a WARN or FAIL.
    pub fix: Option<String>,
}

fn check(
    section: &str,
    name: &str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<String>,
) -> Check {
    Check {
        section: section.into(),
        name: name.into(),
        status,
        detail: detail.into(),
        fix,
    }
}

fn kernel_checks(out: &mut Vec<Check>) {
    let s = "kernel";
    let ver = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|v| v.trim().to_string());
    out.push(match &ver {
        Ok(v) => check(s, "version", Status::Pass, format!("Linux {v}"), None),
        Err(e) => check(
            s,
            "version",
            Status::NA,
            format!("cannot read /proc/sys/kernel/osrelease: {e}"),
            None,
        ),
    });
    let caps = match fastudp::Socket::bind("127.0.0.1:0".parse().expect("literal")) {
        Ok(sock) => sock.capabilities(),
        Err(e) => {
            out.push(check(
                s,
                "capabilities",
                Status::NA,
                format!("cannot open a probe socket: {e}"),
                None,
            ));
            return;
        }
    };
    let yes_no = |ok: bool, name: &str, good: &str, bad: &str| {
        check(
            s,
            name,
            if ok { Status::Pass } else { Status::Warn },
            if ok { good } else { bad },
            None,
        )
    };
    out.push(match caps.max_gso_segments {
        n if n >= 64 => check(
            s,
            "UDP GSO",
            Status::Pass,
            format!("{n} segments per send"),
            None,
        ),
        _ if caps.disabled.gso => check(
            s,
            "UDP GSO",
            Status::Warn,
            "switched off by FASTUDP_DISABLE",
            None,
        ),
        _ => check(
            s,
            "UDP GSO",
            Status::Fail,
            "not supported: needs Linux 4.18",
            None,
        ),
    });
    out.push(if caps.gro {
        check(
            s,
            "UDP GRO",
            Status::Pass,
            "coalesced receive available",
            None,
        )
    } else {
        check(
            s,
            "UDP GRO",
            Status::Warn,
            "not available: needs Linux 5.0 (or FASTUDP_DISABLE has gro)",
            None,
        )
    });
    out.push(yes_no(
        caps.zerocopy,
        "MSG_ZEROCOPY",
        "available",
        "not available: needs Linux 5.0",
    ));
    out.push(yes_no(
        caps.txtime,
        "SO_TXTIME",
        "accepted (whether it is honoured depends on the egress qdisc, below)",
        "not accepted: kernel pacing unavailable, fastudp paces in user space",
    ));
    out.push(yes_no(
        caps.ecn,
        "ECN",
        "marks can be read on receive",
        "ECN marks cannot be read",
    ));
    out.push(yes_no(
        caps.pktinfo,
        "PKTINFO",
        "destination and source addresses per datagram",
        "not available",
    ));
    out.push(
        match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|v| v.trim().to_string())
        {
            Ok(v) if v == "0" => check(s, "io_uring", Status::Pass, "available", None),
            Ok(v) if v == "1" => check(
                s,
                "io_uring",
                Status::Warn,
                "restricted to the group in kernel.io_uring_group",
                Some("sysctl -w kernel.io_uring_disabled=0".into()),
            ),
            Ok(_) => check(
                s,
                "io_uring",
                Status::Warn,
                "disabled (kernel.io_uring_disabled=2)",
                Some("sysctl -w kernel.io_uring_disabled=0".into()),
            ),
            Err(_) => check(
                s,
                "io_uring",
                Status::NA,
                "no kernel.io_uring_disabled sysctl (kernel before 6.6, or built without io_uring)",
                None,
            ),
        },
    );
}

fn sysfs(dev: &str, file: &str) -> Result<String, String> {
    let p = format!("/sys/class/net/{dev}/{file}");
    std::fs::read_to_string(&p)
        .map(|v| v.trim().to_string())
        .map_err(|e| format!("cannot read {p}: {e}"))
}

/// Devices that are up in this namespace.
pub fn up_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.retain(|d| {
        sysfs(d, "flags")
            .ok()
            .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & 1 != 0)
    });
    v.sort();
    v
}

fn device_checks(dev: &str, qdiscs: &Result<Vec<netlink::Qdisc>, String>, out: &mut Vec<Check>) {
    let driver = fastudp::host::driver(dev).unwrap_or_default();
    let veth = driver == "veth";
    let mtu = sysfs(dev, "mtu");
    let s = format!("device {dev}");
    out.push(match &mtu {
        Ok(m) => check(
            &s,
            "MTU",
            Status::Pass,
            format!(
                "{m} bytes (largest UDP segment {} on IPv4)",
                fastudp::wire::max_segment_for_mtu(m.parse().unwrap_or(0), false)
                    .min(fastudp::wire::MAX_PAYLOAD_V4)
            ),
            None,
        ),
        Err(e) => check(&s, "MTU", Status::NA, e.clone(), None),
    });
    let feats = match fastudp::host::features(dev) {
        Ok(f) => f,
        Err(e) => {
            out.push(check(
                &s,
                "features",
                Status::NA,
                format!("cannot read the ethtool features: {e}"),
                None,
            ));
            return;
        }
    };
    let get = |n: &str| feats.iter().find(|f| f.name == n);
    let on = |n: &str| get(n).is_some_and(|f| f.active);
    let fixable = |n: &str, cmd: String| get(n).filter(|f| f.changeable).map(|_| cmd);
    let csum = [
        "tx-checksum-ipv4",
        "tx-checksum-ip-generic",
        "tx-checksum-ipv6",
    ]
    .iter()
    .any(|n| on(n));
    out.push(if csum {
        check(&s, "tx-checksumming", Status::Pass, "on", None)
    } else {
        check(&s, "tx-checksumming", Status::Warn, "off: GSO trains are checksummed in software (kernels before 6.11 refuse them with EIO)", fixable("tx-checksum-ip-generic", format!("ethtool -K {dev} tx on")))
    });
    let feature = |out: &mut Vec<Check>, kernel: &str, shown: &str, why_off: &str, opt: &str| {
        out.push(match get(kernel) {
            None => check(
                &s,
                shown,
                Status::NA,
                "the kernel has no such feature",
                None,
            ),
            Some(f) if f.active => check(&s, shown, Status::Pass, "on", None),
            Some(f) if !f.changeable => check(
                &s,
                shown,
                Status::Warn,
                format!("off [fixed]: {why_off}; the driver cannot change it"),
                None,
            ),
            Some(_) => check(
                &s,
                shown,
                Status::Warn,
                format!("off: {why_off}"),
                Some(format!("ethtool -K {dev} {opt} on")),
            ),
        })
    };
    feature(
        out,
        "tx-udp-segmentation",
        "tx-udp-segmentation",
        "GSO trains are cut into datagrams before the device",
        "tx-udp-segmentation",
    );
    feature(
        out,
        "tx-generic-segmentation",
        "generic-segmentation-offload",
        "segmentation happens early, per datagram",
        "gso",
    );
    feature(
        out,
        "rx-gro",
        "generic-receive-offload",
        "received datagrams are not coalesced",
        "gro",
    );
    if veth {
        feature(
            out,
            "rx-udp-gro-forwarding",
            "rx-udp-gro-forwarding",
            "UDP forwarded or tunnelled through this veth is not aggregated",
            "rx-udp-gro-forwarding",
        );
    } else {
        out.push(match get("rx-udp-gro-forwarding") {
            Some(f) => check(
                &s,
                "rx-udp-gro-forwarding",
                if f.active { Status::Pass } else { Status::NA },
                if f.active {
                    "on"
                } else {
                    "off (matters only for forwarded or tunnelled UDP)"
                },
                None,
            ),
            None => check(
                &s,
                "rx-udp-gro-forwarding",
                Status::NA,
                "the kernel has no such feature (needs 5.12)",
                None,
            ),
        });
    }
    out.push(match get("rx-gro-list") {
        Some(f) if f.active => check(
            &s,
            "rx-gro-list",
            Status::Pass,
            "on: fraglist GRO (good for forwarding; local sockets get trains re-segmented)",
            None,
        ),
        Some(_) => check(
            &s,
            "rx-gro-list",
            Status::Pass,
            "off: UDP GRO builds trains a GRO socket takes whole",
            None,
        ),
        None => check(
            &s,
            "rx-gro-list",
            Status::NA,
            "the kernel has no such feature",
            None,
        ),
    });
    if veth {
        let ncpu = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as u32;
        match fastudp::host::channels(dev) {
            Ok(c) => {
                let want = c.max_rx.min(ncpu).max(1);
                out.push(if c.rx >= 2 || c.rx >= c.max_rx {
                    check(
                        &s,
                        "channels",
                        Status::Pass,
                        format!("{} rx / {} tx queues", c.rx, c.tx),
                        None,
                    )
                } else {
                    check(
                        &s,
                        "channels",
                        Status::Warn,
                        format!(
                            "{} rx queue of {} possible: one NAPI instance for all flows",
                            c.rx, c.max_rx
                        ),
                        Some(format!("ethtool -L {dev} rx {want} tx {want}")),
                    )
                });
            }
            Err(e) => out.push(check(
                &s,
                "channels",
                Status::NA,
                format!("cannot read: {e}"),
                None,
            )),
        }
        out.push(match sysfs(dev, "gro_flush_timeout") {
            Ok(v) if v != "0" => check(
                &s,
                "gro_flush_timeout",
                Status::Pass,
                format!("{v} ns"),
                None,
            ),
            Ok(_) => check(
                &s,
                "gro_flush_timeout",
                Status::Warn,
                "0: GRO flushes at the end of every NAPI poll, so trains stay short",
                Some(format!(
                    "echo 50000 > /sys/class/net/{dev}/gro_flush_timeout"
                )),
            ),
            Err(e) => check(&s, "gro_flush_timeout", Status::NA, e, None),
        });
        out.push(if on("rx-gro") {
            check(
                &s,
                "NAPI GRO",
                Status::Pass,
                "on: the veth runs in NAPI mode and aggregates what crosses it",
                None,
            )
        } else {
            check(
                &s,
                "NAPI GRO",
                Status::Warn,
                "off: the veth hands every datagram up alone (no NAPI without GRO or XDP)",
                Some(format!("ethtool -K {dev} gro on")),
            )
        });
    }
    // Egress qdisc.
    let qs = format!("qdisc {dev}");
    let ifindex = sysfs(dev, "ifindex")
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    out.push(match (qdiscs, ifindex) {
        (Err(e), _) => check(
            &qs,
            "egress qdisc",
            Status::NA,
            format!("cannot dump qdiscs over netlink: {e}"),
            None,
        ),
        (_, None) => check(&qs, "egress qdisc", Status::NA, "unknown ifindex", None),
        (Ok(list), Some(i)) => match list
            .iter()
            .find(|q| q.ifindex == i && q.parent == netlink::TC_H_ROOT)
        {
            Some(q) if q.kind == "fq" || q.kind == "etf" => check(
                &qs,
                "egress qdisc",
                Status::Pass,
                format!("{}: honours SO_TXTIME, the kernel paces", q.kind),
                None,
            ),
            Some(q) => check(
                &qs,
                "egress qdisc",
                Status::Warn,
                format!(
                    "{}: ignores SO_TXTIME, so fastudp paces in user space",
                    q.kind
                ),
                Some(format!(
                    "tc qdisc replace dev {dev} root fq   # needs the sch_fq module"
                )),
            ),
            None => check(
                &qs,
                "egress qdisc",
                Status::NA,
                "no root qdisc reported",
                None,
            ),
        },
    });
}

/// The sysctls fastudp cares about: (name, minimum, why).
pub const SYSCTLS: [(&str, u64, &str); 6] = [
    (
        "net.core.rmem_max",
        7_500_000,
        "caps SO_RCVBUF: bursts beyond it are dropped",
    ),
    ("net.core.wmem_max", 7_500_000, "caps SO_SNDBUF"),
    (
        "net.core.rmem_default",
        212_992,
        "receive buffer of sockets that set none",
    ),
    (
        "net.core.wmem_default",
        212_992,
        "send buffer of sockets that set none",
    ),
    (
        "net.core.optmem_max",
        131_072,
        "bounds outstanding MSG_ZEROCOPY sends (ENOBUFS beyond it)",
    ),
    (
        "net.core.netdev_max_backlog",
        5_000,
        "per-CPU input queue of veth and loopback",
    ),
];

/// Reads a sysctl by its dotted name.
pub fn read_sysctl(name: &str) -> Result<u64, String> {
    let p = format!("/proc/sys/{}", name.replace('.', "/"));
    let text = std::fs::read_to_string(&p).map_err(|e| format!("cannot read {p}: {e}"))?;
    parse_sysctl(&text).map_err(|e| format!("{p}: {e}"))
}

/// Parses a numeric sysctl's text (a number and a newline).
pub fn parse_sysctl(text: &str) -> Result<u64, String> {
    let t = text.trim();
    t.parse().map_err(|_| format!("not a single number: {t:?}"))
}

fn sysctl_checks(out: &mut Vec<Check>) {
    for (name, min, why) in SYSCTLS {
        out.push(match read_sysctl(name) {
            Ok(v) if v >= min => check("sysctl", name, Status::Pass, format!("{v}"), None),
            Ok(v) => check("sysctl", name, Status::Warn, format!("{v}, below {min}: {why}"), Some(format!("sysctl -w {name}={min}"))),
            Err(_) if name == "net.core.netdev_max_backlog" && !std::path::Path::new("/proc/sys/net/core/netdev_max_backlog").exists() => check(
                "sysctl",
                name,
                Status::NA,
                "not visible in this network namespace: it is host-wide, check it from the host",
                None,
            ),
            Err(e) => check("sysctl", name, Status::NA, e, None),
        });
    }
}

/// The UDP error counters doctor reports.
pub const COUNTERS: [&str; 4] = ["RcvbufErrors", "SndbufErrors", "InErrors", "InCsumErrors"];

fn counter_checks(out: &mut Vec<Check>) {
    let m = procfs::udp_counters();
    for c in COUNTERS {
        let v = m.get(c).copied().unwrap_or(0) + m.get(&format!("6{c}")).copied().unwrap_or(0);
        out.push(if m.is_empty() {
            check("udp", c, Status::NA, "cannot read /proc/net/snmp", None)
        } else if v == 0 {
            check("udp", c, Status::Pass, "0 since boot", None)
        } else {
            check(
                "udp",
                c,
                Status::Warn,
                format!("{v} since boot (IPv4 + IPv6); see --watch for the rate now"),
                None,
            )
        });
    }
}

/// Whether `name` is a network device of this namespace: a valid
/// interface name (1 to 15 bytes, no `/`, whitespace or `:`, not `.` or
/// `..`) that sysfs lists.
pub fn is_device(name: &str) -> bool {
    tune::change::valid_dev_name(name)
        && std::path::Path::new(&format!("/sys/class/net/{name}")).exists()
}

/// Runs every check.
pub fn diagnose(a: &DoctorArgs) -> Result<Vec<Check>, Failure> {
    let devs = match (&a.dev, a.dest) {
        (Some(d), _) => {
            if !is_device(d) {
                return Err(Failure::usage(format!(
                    "--dev {d}: no such device in this network namespace"
                )));
            }
            vec![d.clone()]
        }
        (None, Some(ip)) => vec![routes::device_for(ip).map_err(Failure::usage)?],
        (None, None) => up_devices(),
    };
    let mut out = Vec::new();
    kernel_checks(&mut out);
    let qdiscs = netlink::qdiscs().map_err(|e| e.to_string());
    for d in &devs {
        device_checks(d, &qdiscs, &mut out);
    }
    sysctl_checks(&mut out);
    counter_checks(&mut out);
    Ok(out)
}

/// Runs `fastudp doctor`.
pub fn run_doctor(a: DoctorArgs) -> Result<(), Failure> {
    if a.watch == Some(0) || a.watch.is_some_and(|w| w > 86_400) {
        return Err(Failure::usage("--watch must be 1 to 86400 seconds".into()));
    }
    let checks = diagnose(&a)?;
    if a.json {
        let doc = serde_json::json!({ "checks": checks });
        // With --watch the samples follow, one per line: then everything is
        // JSON Lines, the checks included.
        let text = if a.watch.is_some() {
            serde_json::to_string(&doc)
        } else {
            serde_json::to_string_pretty(&doc)
        };
        outln!("{}", text.map_err(|e| Failure::usage(e.to_string()))?);
    } else {
        let mut section = String::new();
        for c in &checks {
            if c.section != section {
                let (head, rest) = c.section.split_once(' ').unwrap_or((&c.section, ""));
                outln!("{} {rest}", head.to_uppercase());
                section = c.section.clone();
            }
            outln!("  {:<5} {:<30} {}", c.status.to_string(), c.name, c.detail);
            if let Some(f) = &c.fix {
                outln!("        fix: {f}");
            }
        }
        let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
        outln!(
            "{} PASS, {} WARN, {} FAIL, {} N/A",
            count(Status::Pass),
            count(Status::Warn),
            count(Status::Fail),
            count(Status::NA)
        );
    }
    if let Some(secs) = a.watch {
        watch(secs, a.json);
    }
    Ok(())
}

fn snapshot() -> Vec<u64> {
    let m = procfs::udp_counters();
    COUNTERS
        .iter()
        .map(|c| m.get(*c).copied().unwrap_or(0) + m.get(&format!("6{c}")).copied().unwrap_or(0))
        .collect()
}

fn watch(secs: u64, json: bool) {
    let mut last = snapshot();
    for t in 1..=secs {
        std::thread::sleep(Duration::from_secs(1));
        let now = snapshot();
        let rates: Vec<u64> = now
            .iter()
            .zip(&last)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        if json {
            let m: serde_json::Map<String, serde_json::Value> = COUNTERS
                .iter()
                .zip(&rates)
                .map(|(k, v)| (format!("{k}_per_sec"), (*v).into()))
                .collect();
            outln!("{}", serde_json::json!({ "second": t, "rates": m }));
        } else {
            let line: Vec<String> = COUNTERS
                .iter()
                .zip(&rates)
                .map(|(k, v)| format!("{k} {v}/s"))
                .collect();
            outln!("[{t:>3} s] {}", line.join("  "));
        }
        last = now;
    }
}
