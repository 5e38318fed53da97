//! Two network namespaces joined by a veth pair, with named offload
//! profiles: a real kernel path with real offload switches, on one host.

use clap::ValueEnum;
use serde::Serialize;
use std::net::IpAddr;
use std::process::{Command, Stdio};

/// Namespace of the sending side.
pub const TX_NS: &str = "fastudp-tx";
/// Namespace of the receiving side.
pub const RX_NS: &str = "fastudp-rx";
/// The veth end in [`TX_NS`].
pub const TX_DEV: &str = "fu-tx";
/// The veth end in [`RX_NS`].
pub const RX_DEV: &str = "fu-rx";

/// The offload profile of the veth pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Defaults: the veth passes GSO trains whole.
    Offload,
    /// tx-udp-segmentation off on the sending veth: trains are cut before
    /// the veth, as a NIC without UDP segmentation offload would cut them.
    Wire,
    /// `wire`, plus NAPI GRO on the receiving veth (channels, gro on,
    /// rx-udp-gro-forwarding on, gro_flush_timeout): the container case.
    WireGro,
    /// tx checksum offload off on the sending veth.
    Nocsum,
    /// The receiving side drops the datagrams at its routing step (a
    /// blackhole route), so only the transmit side is measured.
    Sink,
    /// A shallow-buffer bottleneck on the sending veth: a tbf qdisc of
    /// 500 Mbit/s with a 16 KiB burst and a 32 KiB queue, where bursts
    /// overflow as they would in a router.
    Bottleneck,
}

/// The addresses of the pair for one address family.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    /// The sender's address.
    pub tx: IpAddr,
    /// The receiver's address.
    pub rx: IpAddr,
    /// An address the receiving side routes to a blackhole (`sink`).
    pub sink: IpAddr,
}

/// Addresses for IPv4 or IPv6. They exist only inside the two namespaces.
pub fn addrs(ipv6: bool) -> Addrs {
    let p = |s: &str| s.parse().expect("literal address");
    if ipv6 {
        Addrs {
            tx: p("fd00:fa57::1"),
            rx: p("fd00:fa57::2"),
            sink: p("fd00:fa57::3"),
        }
    } else {
        Addrs {
            tx: p("10.200.0.1"),
            rx: p("10.200.0.2"),
            sink: p("10.200.0.3"),
        }
    }
}

/// True when running as root (user id 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn run(args: &[&str], input: Option<&str>) -> Result<String, String> {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if input.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c
        .spawn()
        .map_err(|e| format!("cannot run {}: {e} (is it installed?)", args[0]))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let o = child.wait_with_output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Runs a command to its end; its standard output, or an error that
/// quotes the command and its standard error.
pub fn run_cmd(args: &[&str]) -> Result<String, String> {
    run(args, None)
}

fn ns(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v, None)
}

/// Checks root and the `ip` and `ethtool` programs.
pub fn preflight() -> Result<(), String> {
    if !is_root() {
        return Err("the testbed needs root (it creates network namespaces and a veth pair); run it with sudo".into());
    }
    for tool in ["ip", "ethtool"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Err(format!(
                "the testbed needs the `{tool}` program (Debian: apt-get install {})",
                if tool == "ip" { "iproute2" } else { tool }
            ));
        }
    }
    Ok(())
}

/// Whether the testbed namespaces exist now.
pub fn exists() -> bool {
    std::path::Path::new(&format!("/var/run/netns/{TX_NS}")).exists()
        || std::path::Path::new(&format!("/var/run/netns/{RX_NS}")).exists()
}

/// Where `up` records the profile of the testbed it built.
pub const PROFILE_FILE: &str = "/run/fastudp-testbed.profile";

/// Builds the pair with `profile`. On any failure, removes what it built.
pub fn up(profile: Profile) -> Result<(), String> {
    preflight()?;
    if exists() {
        down()?;
    }
    let r = build(profile).and_then(|()| {
        let name = profile
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        std::fs::write(PROFILE_FILE, name).map_err(|e| format!("cannot write {PROFILE_FILE}: {e}"))
    });
    if r.is_err() {
        let _ = down();
    }
    r
}

/// The profile of the testbed that is up now, if one is.
pub fn current() -> Result<Profile, String> {
    if !exists() {
        return Err("no testbed is up: run `fastudp testbed up PROFILE` first".into());
    }
    let name = std::fs::read_to_string(PROFILE_FILE)
        .map_err(|e| format!("cannot read {PROFILE_FILE}: {e}"))?;
    Profile::from_str(name.trim(), true).map_err(|e| format!("{PROFILE_FILE}: {e}"))
}

fn build(profile: Profile) -> Result<(), String> {
    run(&["ip", "netns", "add", TX_NS], None)?;
    run(&["ip", "netns", "add", RX_NS], None)?;
    run(
        &[
            "ip", "-n", TX_NS, "link", "add", TX_DEV, "type", "veth", "peer", "name", RX_DEV,
            "netns", RX_NS,
        ],
        None,
    )?;
    let (v4, v6) = (addrs(false), addrs(true));
    for (n, dev, a4, a6) in [(TX_NS, TX_DEV, v4.tx, v6.tx), (RX_NS, RX_DEV, v4.rx, v6.rx)] {
        run(
            &[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{a4}/24"),
                "dev",
                dev,
            ],
            None,
        )?;
        run(
            &[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{a6}/64"),
                "dev",
                dev,
                "nodad",
            ],
            None,
        )?;
        run(
            &["ip", "-n", n, "link", "set", dev, "mtu", "1500", "up"],
            None,
        )?;
        run(&["ip", "-n", n, "link", "set", "lo", "up"], None)?;
    }
    match profile {
        Profile::Offload => {}
        Profile::Wire => {
            ns(
                TX_NS,
                &["ethtool", "-K", TX_DEV, "tx-udp-segmentation", "off"],
            )?;
        }
        Profile::WireGro => {
            ns(
                TX_NS,
                &["ethtool", "-K", TX_DEV, "tx-udp-segmentation", "off"],
            )?;
            // More than one queue, so the veth runs in NAPI mode with GRO.
            ns(RX_NS, &["ethtool", "-L", RX_DEV, "rx", "2", "tx", "2"])?;
            ns(TX_NS, &["ethtool", "-L", TX_DEV, "rx", "2", "tx", "2"])?;
            ns(
                RX_NS,
                &[
                    "ethtool",
                    "-K",
                    RX_DEV,
                    "gro",
                    "on",
                    "rx-udp-gro-forwarding",
                    "on",
                ],
            )?;
            run(
                &[
                    "ip",
                    "netns",
                    "exec",
                    RX_NS,
                    "tee",
                    &format!("/sys/class/net/{RX_DEV}/gro_flush_timeout"),
                ],
                Some("50000\n"),
            )?;
        }
        Profile::Bottleneck => {
            run(
                &[
                    "ip", "netns", "exec", TX_NS, "tc", "qdisc", "add", "dev", TX_DEV, "root",
                    "tbf", "rate", "500mbit", "burst", "16kb", "limit", "32kb",
                ],
                None,
            )?;
        }
        Profile::Nocsum => {
            ns(TX_NS, &["ethtool", "-K", TX_DEV, "tx", "off"])?;
        }
        Profile::Sink => {
            // The sender reaches the sink address without ARP; the receiver
            // drops it at routing, before any socket work.
            let mac = std::fs::read_to_string(format!("/sys/class/net/{RX_DEV}/address"))
                .or_else(|_| ns(RX_NS, &["cat", &format!("/sys/class/net/{RX_DEV}/address")]))
                .map_err(|e| e.to_string())?;
            let mac = mac.trim();
            for (a, v6) in [(v4.sink, false), (v6.sink, true)] {
                let fam = if v6 { "-6" } else { "-4" };
                run(
                    &[
                        "ip",
                        fam,
                        "-n",
                        TX_NS,
                        "neigh",
                        "add",
                        &a.to_string(),
                        "lladdr",
                        mac,
                        "dev",
                        TX_DEV,
                        "nud",
                        "permanent",
                    ],
                    None,
                )?;
                run(
                    &[
                        "ip",
                        fam,
                        "-n",
                        RX_NS,
                        "route",
                        "add",
                        "blackhole",
                        &a.to_string(),
                    ],
                    None,
                )?;
            }
        }
    }
    Ok(())
}

/// Removes both namespaces (and with them the veth pair).
pub fn down() -> Result<(), String> {
    preflight()?;
    let mut errs = Vec::new();
    for n in [TX_NS, RX_NS] {
        if std::path::Path::new(&format!("/var/run/netns/{n}")).exists() {
            if let Err(e) = run(&["ip", "netns", "del", n], None) {
                errs.push(e);
            }
        }
    }
    let _ = std::fs::remove_file(PROFILE_FILE);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// Moves the calling thread into namespace `name`.
pub fn enter(name: &str) -> Result<(), String> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))
        .map_err(|e| format!("open namespace {name}: {e}"))?;
    fastudp_tools::os::setns_net(std::os::fd::AsFd::as_fd(&f))
        .map_err(|e| format!("enter namespace {name}: {e}"))
}

/// Runs `f` on a thread inside namespace `name`: sockets it creates stay
/// in that namespace.
pub fn within<T: Send>(
    name: &str,
    f: impl FnOnce() -> Result<T, String> + Send,
) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(name)?;
            f()
        })
        .join()
        .map_err(|_| "namespace thread panicked".to_string())?
    })
}

/// Removes the testbed when dropped: on normal exit, error or panic.
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = down();
    }
}

/// Builds the testbed, removed when the guard drops. Ctrl-C ends the
/// run through the guard too (the caller watches [`crate::interrupt`]); a
/// second Ctrl-C, which exits at once, removes it on the way out.
pub fn up_guarded(profile: Profile) -> Result<Guard, String> {
    crate::interrupt::at_forced_exit(|| {
        let _ = down();
        eprintln!("fastudp: testbed removed");
    });
    up(profile)?;
    Ok(Guard)
}
