//! Two network namespaces joined by a veth pair, with named offload
//! profiles: a real kernel path with real offload switches, on one host.

use anyhow::{anyhow, bail, Context};
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
    /// `offload` with jumbo frames: MTU 9000 on both veth ends, as inside
    /// many data centres (TCP's MSS follows; QUIC servers use larger
    /// packets where their path-MTU discovery is allowed to look).
    Jumbo,
    /// Not a pair: a fleet. Clients (`fastudp-cl`), a balancer
    /// (`fastudp-lb`, the servers' gateway, forwarding with the nftables
    /// ruleset of `quic lb-rules` loaded) and three servers
    /// (`fastudp-s1` to `fastudp-s3`), each on its own veth to the
    /// balancer (docs/SCALE-OUT.md). Start a `quic serve --server-id` in
    /// each server's namespace.
    Fleet,
}

/// The MTU of the veth pair of [`Profile::Jumbo`].
pub const JUMBO_MTU: u32 = 9000;

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

/// Runs `args` (with `input` on its standard input) to its end: its
/// standard output. A program that cannot start, or that fails, is a
/// runtime error (status 1) quoting the command and its standard error:
/// what the testbed needs is checked up front by [`preflight`].
fn run(args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if input.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c
        .spawn()
        .map_err(|e| anyhow!("cannot run {}: {e} (is it installed?)", args[0]))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        stdin
            .write_all(text.as_bytes())
            .with_context(|| format!("cannot write to the input of `{}`", args.join(" ")))?;
    }
    let o = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for `{}`", args.join(" ")))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )
    }
}

/// Runs a command to its end; its standard output, or a runtime error
/// that quotes the command and its standard error.
pub fn run_cmd(args: &[&str]) -> anyhow::Result<String> {
    run(args, None)
}

fn ns(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v, None)
}

/// Checks root and the `ip` and `ethtool` programs. Either missing is a
/// usage error (status 2): this host cannot build the testbed as it is
/// invoked, and nothing has been built yet.
pub fn preflight() -> anyhow::Result<()> {
    if !is_root() {
        bail_usage!("the testbed needs root (it creates network namespaces and a veth pair); run it with sudo");
    }
    for tool in ["ip", "ethtool"] {
        if Command::new(tool).arg("-V").output().is_err() {
            bail_usage!(
                "the testbed needs the `{tool}` program (Debian: apt-get install {})",
                if tool == "ip" { "iproute2" } else { tool }
            );
        }
    }
    Ok(())
}

/// Whether the testbed namespaces (a pair's or the fleet's) exist now.
pub fn exists() -> bool {
    all_namespaces()
        .iter()
        .any(|n| std::path::Path::new(&format!("/var/run/netns/{n}")).exists())
}

/// Every namespace a testbed may have: the pair's and the fleet's.
fn all_namespaces() -> Vec<&'static str> {
    let mut v = vec![TX_NS, RX_NS, fleet::CLIENTS, fleet::BALANCER];
    v.extend(fleet::SERVERS.iter().map(|s| s.ns));
    v
}

/// Where `up` records the profile of the testbed it built.
pub const PROFILE_FILE: &str = "/run/fastudp-testbed.profile";

/// Builds the pair with `profile`. On any failure, removes what it built.
/// Not root, or a missing program, is a usage error ([`preflight`]); a
/// command that fails while building is a runtime error (status 1).
pub fn up(profile: Profile) -> anyhow::Result<()> {
    preflight()?;
    if exists() {
        down()?;
    }
    let r = build(profile).and_then(|()| {
        let name = profile
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        std::fs::write(PROFILE_FILE, name).with_context(|| format!("cannot write {PROFILE_FILE}"))
    });
    if r.is_err() {
        let _ = down();
    }
    r
}

/// The profile of the testbed that is up now, if one is. No testbed up
/// is a usage error (the command asked for one that is not there); a
/// profile file that cannot be read or holds no profile is a runtime
/// error.
pub fn current() -> anyhow::Result<Profile> {
    if !exists() {
        bail_usage!("no testbed is up: run `fastudp testbed up PROFILE` first");
    }
    let name = std::fs::read_to_string(PROFILE_FILE)
        .with_context(|| format!("cannot read {PROFILE_FILE}"))?;
    Profile::from_str(name.trim(), true).map_err(|e| anyhow!("{PROFILE_FILE}: {e}"))
}

/// Builds the namespaces, the veth pair and its addresses, then applies
/// `profile`.
fn build(profile: Profile) -> anyhow::Result<()> {
    if profile == Profile::Fleet {
        return fleet::build();
    }
    pair()?;
    match profile {
        Profile::Fleet => Ok(()),
        Profile::Offload => Ok(()),
        Profile::Wire => cut_trains(),
        Profile::WireGro => {
            cut_trains()?;
            napi_gro()
        }
        Profile::Bottleneck => run(
            &[
                "ip", "netns", "exec", TX_NS, "tc", "qdisc", "add", "dev", TX_DEV, "root", "tbf",
                "rate", "500mbit", "burst", "16kb", "limit", "32kb",
            ],
            None,
        )
        .map(drop),
        Profile::Nocsum => ns(TX_NS, &["ethtool", "-K", TX_DEV, "tx", "off"]).map(drop),
        Profile::Sink => blackhole(),
        Profile::Jumbo => {
            let mtu = JUMBO_MTU.to_string();
            for (n, dev) in [(TX_NS, TX_DEV), (RX_NS, RX_DEV)] {
                run(&["ip", "-n", n, "link", "set", dev, "mtu", &mtu], None)?;
            }
            Ok(())
        }
    }
}

/// The two namespaces, the veth between them (MTU 1500, up), their
/// addresses and loopbacks.
fn pair() -> anyhow::Result<()> {
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
        let (a4, a6) = (format!("{a4}/24"), format!("{a6}/64"));
        run(&["ip", "-n", n, "addr", "add", &a4, "dev", dev], None)?;
        run(
            &["ip", "-n", n, "addr", "add", &a6, "dev", dev, "nodad"],
            None,
        )?;
        run(
            &["ip", "-n", n, "link", "set", dev, "mtu", "1500", "up"],
            None,
        )?;
        run(&["ip", "-n", n, "link", "set", "lo", "up"], None)?;
    }
    Ok(())
}

/// tx-udp-segmentation off on the sending veth (`wire`).
fn cut_trains() -> anyhow::Result<()> {
    ns(
        TX_NS,
        &["ethtool", "-K", TX_DEV, "tx-udp-segmentation", "off"],
    )
    .map(drop)
}

/// NAPI GRO on the receiving veth (`wire-gro`).
fn napi_gro() -> anyhow::Result<()> {
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
    )
    .map(drop)
}

/// The sink addresses (`sink`): the sender reaches them without ARP; the
/// receiver drops them at routing, before any socket work.
fn blackhole() -> anyhow::Result<()> {
    let mac = match std::fs::read_to_string(format!("/sys/class/net/{RX_DEV}/address")) {
        Ok(m) => m,
        Err(_) => ns(RX_NS, &["cat", &format!("/sys/class/net/{RX_DEV}/address")])?,
    };
    let mac = mac.trim();
    for (a, v6) in [(addrs(false).sink, false), (addrs(true).sink, true)] {
        let fam = if v6 { "-6" } else { "-4" };
        let a = a.to_string();
        run(
            &[
                "ip",
                fam,
                "-n",
                TX_NS,
                "neigh",
                "add",
                &a,
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
            &["ip", fam, "-n", RX_NS, "route", "add", "blackhole", &a],
            None,
        )?;
    }
    Ok(())
}

/// Removes both namespaces (and with them the veth pair). Not root is a
/// usage error ([`preflight`]); a namespace that cannot be removed is a
/// runtime error.
pub fn down() -> anyhow::Result<()> {
    preflight()?;
    let mut errs = Vec::new();
    for n in all_namespaces() {
        if std::path::Path::new(&format!("/var/run/netns/{n}")).exists() {
            if let Err(e) = run(&["ip", "netns", "del", n], None) {
                errs.push(format!("{e:#}"));
            }
        }
    }
    let _ = std::fs::remove_file(PROFILE_FILE);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(errs.join("; ")))
    }
}

/// Moves the calling thread into namespace `name` (a runtime error if it
/// cannot).
pub fn enter(name: &str) -> anyhow::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))
        .map_err(|e| anyhow!("open namespace {name}: {e}"))?;
    fastudp_tools::os::setns_net(std::os::fd::AsFd::as_fd(&f))
        .map_err(|e| anyhow!("enter namespace {name}: {e}"))
}

/// Runs `f` on a thread inside namespace `name`: sockets it creates stay
/// in that namespace.
pub fn within<T: Send>(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(name)?;
            f()
        })
        .join()
        .map_err(|_| anyhow!("namespace thread panicked"))?
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
/// second Ctrl-C, which exits at once, removes it on the way out. Errors
/// as [`up`].
pub fn up_guarded(profile: Profile) -> anyhow::Result<Guard> {
    crate::interrupt::at_forced_exit(|| {
        let _ = down();
        eprintln!("fastudp: testbed removed");
    });
    up(profile)?;
    Ok(Guard)
}

/// The fleet testbed ([`Profile::Fleet`]): clients, a balancer and three
/// servers, all IPv4.
pub mod fleet {
    use super::{ns, run};
    use std::net::Ipv4Addr;

    /// The clients' namespace.
    pub const CLIENTS: &str = "fastudp-cl";
    /// The balancer's namespace: the servers' gateway.
    pub const BALANCER: &str = "fastudp-lb";
    /// The clients' veth end, and the balancer's end facing them.
    pub const CLIENT_DEV: &str = "fu-cl";
    /// The balancer's veth end facing the clients.
    pub const BALANCER_DEV: &str = "fu-lb";
    /// The clients' address.
    pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
    /// A second address of the clients, to move a connection to.
    pub const CLIENT_ADDR2: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 3);
    /// The public address: the balancer's, facing the clients.
    pub const PUBLIC_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
    /// The port the servers listen on, the public one.
    pub const PORT: u16 = 4433;
    /// The fleet's QUIC-LB configuration: rotation 0, 1-byte server IDs,
    /// 8-byte nonces.
    pub const LB_CONFIG: &str = "0:1:8";

    /// One server of the fleet.
    #[derive(Debug, Clone, Copy)]
    pub struct Server {
        /// Its namespace.
        pub ns: &'static str,
        /// Its veth end.
        pub dev: &'static str,
        /// The balancer's veth end facing it.
        pub peer: &'static str,
        /// Its address.
        pub addr: Ipv4Addr,
        /// The balancer's address facing it (its gateway).
        pub gateway: Ipv4Addr,
        /// Its QUIC-LB server ID, hexadecimal.
        pub id: &'static str,
    }

    /// The three servers.
    pub const SERVERS: [Server; 3] = [
        Server {
            ns: "fastudp-s1",
            dev: "fu-s1",
            peer: "fu-lb1",
            addr: Ipv4Addr::new(10, 202, 1, 2),
            gateway: Ipv4Addr::new(10, 202, 1, 1),
            id: "01",
        },
        Server {
            ns: "fastudp-s2",
            dev: "fu-s2",
            peer: "fu-lb2",
            addr: Ipv4Addr::new(10, 202, 2, 2),
            gateway: Ipv4Addr::new(10, 202, 2, 1),
            id: "02",
        },
        Server {
            ns: "fastudp-s3",
            dev: "fu-s3",
            peer: "fu-lb3",
            addr: Ipv4Addr::new(10, 202, 3, 2),
            gateway: Ipv4Addr::new(10, 202, 3, 1),
            id: "03",
        },
    ];

    /// A veth between namespace `a` (device `da`, address `aa/24`) and
    /// namespace `b` (device `db`, address `ab/24`), both up, with
    /// `a`'s default route via `ab`.
    fn link(
        a: &str,
        da: &str,
        aa: Ipv4Addr,
        b: &str,
        db: &str,
        ab: Ipv4Addr,
    ) -> anyhow::Result<()> {
        run(
            &[
                "ip", "-n", a, "link", "add", da, "type", "veth", "peer", "name", db, "netns", b,
            ],
            None,
        )?;
        for (n, d, addr) in [(a, da, aa), (b, db, ab)] {
            run(
                &[
                    "ip",
                    "-n",
                    n,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    d,
                ],
                None,
            )?;
            run(
                &["ip", "-n", n, "link", "set", d, "mtu", "1500", "up"],
                None,
            )?;
        }
        run(
            &[
                "ip",
                "-n",
                a,
                "route",
                "add",
                "default",
                "via",
                &ab.to_string(),
            ],
            None,
        )
        .map(drop)
    }

    /// Builds the namespaces, veths, addresses and routes; the balancer
    /// forwards. The ruleset is loaded by the caller ([`load_rules`]).
    pub(super) fn build() -> anyhow::Result<()> {
        if std::process::Command::new("nft")
            .arg("-V")
            .output()
            .is_err()
        {
            bail_usage!(
                "the fleet testbed needs the `nft` program (Debian: apt-get install nftables)"
            );
        }
        let mut names = vec![CLIENTS, BALANCER];
        names.extend(SERVERS.iter().map(|s| s.ns));
        for n in &names {
            run(&["ip", "netns", "add", n], None)?;
            run(&["ip", "-n", n, "link", "set", "lo", "up"], None)?;
        }
        link(
            CLIENTS,
            CLIENT_DEV,
            CLIENT_ADDR,
            BALANCER,
            BALANCER_DEV,
            PUBLIC_ADDR,
        )?;
        run(
            &[
                "ip",
                "-n",
                CLIENTS,
                "addr",
                "add",
                &format!("{CLIENT_ADDR2}/24"),
                "dev",
                CLIENT_DEV,
            ],
            None,
        )?;
        for s in SERVERS {
            link(s.ns, s.dev, s.addr, BALANCER, s.peer, s.gateway)?;
        }
        ns(BALANCER, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]).map(drop)
    }

    /// Loads `rules` (`nft -f`) in the balancer's namespace.
    pub fn load_rules(rules: &str) -> anyhow::Result<()> {
        run(
            &["ip", "netns", "exec", BALANCER, "nft", "-f", "-"],
            Some(rules),
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::exit_status;

    /// A command that fails or cannot start while the testbed is built is
    /// a runtime error (status 1) that quotes it; its input reaches it.
    #[test]
    fn a_failing_command_is_a_runtime_error_that_quotes_it() {
        let e = run_cmd(&["sh", "-c", "echo refused >&2; exit 3"]).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "`sh -c echo refused >&2; exit 3` failed: refused"
        );
        assert_eq!(exit_status(&e), 1);
        let e = run_cmd(&["fastudp-no-such-program"]).unwrap_err();
        assert!(
            format!("{e:#}").starts_with("cannot run fastudp-no-such-program: "),
            "{e:#}"
        );
        assert_eq!(exit_status(&e), 1);
        assert_eq!(run(&["cat"], Some("50000\n")).unwrap(), "50000\n");
    }
}
