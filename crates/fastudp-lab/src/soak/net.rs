//! The soak's own pair of namespaces and veth, named after the process so
//! that it never touches the shared testbed or another run, and the
//! switches the fault injector flips on it.

use crate::testbed::run_cmd as run;
use anyhow::anyhow;
use std::net::SocketAddr;

/// The sender's address inside its namespace.
pub const TX_ADDR: &str = "10.77.0.1";
/// The receiver's address inside its namespace.
pub const RX_ADDR: &str = "10.77.0.2";
/// The sender's IPv6 address inside its namespace.
pub const TX_ADDR6: &str = "fd77::1";
/// The receiver's IPv6 address inside its namespace.
pub const RX_ADDR6: &str = "fd77::2";
/// The receiver's port.
pub const RX_PORT: u16 = 4991;

/// The names of one run's namespaces and devices.
#[derive(Debug, Clone)]
pub struct Names {
    /// The sender's namespace.
    pub tx_ns: String,
    /// The receiver's namespace.
    pub rx_ns: String,
    /// The veth end in the sender's namespace.
    pub tx_dev: String,
    /// The veth end in the receiver's namespace.
    pub rx_dev: String,
}

impl Names {
    /// The names for process `pid` (devices stay under 16 bytes).
    pub fn for_pid(pid: u32) -> Self {
        Names {
            tx_ns: format!("fusoak-{pid}-tx"),
            rx_ns: format!("fusoak-{pid}-rx"),
            tx_dev: format!("fsk{pid}t"),
            rx_dev: format!("fsk{pid}r"),
        }
    }
}

/// Where the receiver listens, over IPv6 or IPv4.
pub fn rx_addr(v6: bool) -> SocketAddr {
    let a = if v6 { RX_ADDR6 } else { RX_ADDR };
    SocketAddr::new(a.parse().expect("literal"), RX_PORT)
}

/// The pair, removed when dropped.
#[derive(Debug)]
pub struct Net {
    /// Its names.
    pub names: Names,
}

/// Names of the pair removed at a second Ctrl-C (which exits at once).
static LIVE: std::sync::Mutex<Option<Names>> = std::sync::Mutex::new(None);

fn remove_live() {
    if let Some(n) = LIVE.lock().ok().and_then(|mut g| g.take()) {
        remove(&n);
        eprintln!("fastudp-lab: soak namespaces removed");
    }
}

fn remove(n: &Names) {
    for ns in [&n.tx_ns, &n.rx_ns] {
        if std::path::Path::new(&format!("/var/run/netns/{ns}")).exists() {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

impl Net {
    /// Builds the pair: two namespaces, a veth with MTU 1500 between them,
    /// offloads at their defaults. On failure, removes what it built. Not
    /// root, or no `ip` or `ethtool`, is a usage error (status 2, found
    /// before anything is built); an `ip` command that fails is a runtime
    /// error (status 1), as is every switch below that fails.
    pub fn up(names: Names) -> anyhow::Result<Net> {
        crate::testbed::preflight()?;
        if let Ok(mut g) = LIVE.lock() {
            *g = Some(names.clone());
        }
        crate::interrupt::at_forced_exit(remove_live);
        let net = Net { names };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> anyhow::Result<()> {
        let n = &self.names;
        remove(n);
        run(&["ip", "netns", "add", &n.tx_ns])?;
        run(&["ip", "netns", "add", &n.rx_ns])?;
        run(&[
            "ip", "-n", &n.tx_ns, "link", "add", &n.tx_dev, "type", "veth", "peer", "name",
            &n.rx_dev, "netns", &n.rx_ns,
        ])?;
        for (ns, dev, a, a6) in [
            (&n.tx_ns, &n.tx_dev, TX_ADDR, TX_ADDR6),
            (&n.rx_ns, &n.rx_dev, RX_ADDR, RX_ADDR6),
        ] {
            // IPv6 addresses survive a link flap (by default a link that
            // goes down loses them), and need no duplicate detection.
            run(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.keep_addr_on_down=1",
            ])?;
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{a6}/64"),
                "dev",
                dev,
                "nodad",
            ])?;
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                dev,
            ])?;
            run(&["ip", "-n", ns, "link", "set", dev, "mtu", "1500", "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        // The sender knows the receiver's address from the start, and again
        // after each link flap (which flushes the neighbour table), without
        // waiting for ARP.
        self.pin_neighbour()
    }

    fn pin_neighbour(&self) -> anyhow::Result<()> {
        let n = &self.names;
        let mac = run(&[
            "ip",
            "netns",
            "exec",
            &n.rx_ns,
            "cat",
            &format!("/sys/class/net/{}/address", n.rx_dev),
        ])?;
        for a in [RX_ADDR, RX_ADDR6] {
            run(&[
                "ip",
                "-n",
                &n.tx_ns,
                "neigh",
                "replace",
                a,
                "lladdr",
                mac.trim(),
                "dev",
                &n.tx_dev,
                "nud",
                "permanent",
            ])?;
        }
        Ok(())
    }

    /// Sets the receiving link down or up (up again pins the sender's
    /// neighbour, in case the carrier's loss took it).
    pub fn rx_link(&self, up: bool) -> anyhow::Result<()> {
        let n = &self.names;
        run(&[
            "ip",
            "-n",
            &n.rx_ns,
            "link",
            "set",
            &n.rx_dev,
            if up { "up" } else { "down" },
        ])?;
        if up {
            self.pin_neighbour()?;
        }
        Ok(())
    }

    /// Sets the MTU of the receiving end alone.
    pub fn rx_mtu(&self, mtu: u32) -> anyhow::Result<()> {
        let n = &self.names;
        let m = mtu.to_string();
        run(&["ip", "-n", &n.rx_ns, "link", "set", &n.rx_dev, "mtu", &m]).map(|_| ())
    }

    /// Whether GRO is on on the receiving end.
    pub fn rx_gro(&self) -> anyhow::Result<bool> {
        let n = &self.names;
        let k = run(&["ip", "netns", "exec", &n.rx_ns, "ethtool", "-k", &n.rx_dev])?;
        k.lines()
            .find_map(|l| l.trim().strip_prefix("generic-receive-offload:"))
            .map(|v| v.trim().starts_with("on"))
            .ok_or_else(|| anyhow!("ethtool -k {}: no generic-receive-offload line", n.rx_dev))
    }

    /// Turns an offload of the receiving end on or off (`gro`).
    pub fn rx_offload(&self, feature: &str, on: bool) -> anyhow::Result<()> {
        let n = &self.names;
        run(&[
            "ip",
            "netns",
            "exec",
            &n.rx_ns,
            "ethtool",
            "-K",
            &n.rx_dev,
            feature,
            if on { "on" } else { "off" },
        ])
        .map(|_| ())
    }

    /// Sets the sending link down or up (up again pins the neighbour).
    pub fn link(&self, up: bool) -> anyhow::Result<()> {
        let n = &self.names;
        run(&[
            "ip",
            "-n",
            &n.tx_ns,
            "link",
            "set",
            &n.tx_dev,
            if up { "up" } else { "down" },
        ])?;
        if up {
            self.pin_neighbour()?;
        }
        Ok(())
    }

    /// Sets the MTU of both ends: the sender's first when it shrinks, the
    /// receiver's first when it grows, so that the receiving end never
    /// takes less than the sending end may send (a veth drops a frame over
    /// its peer's MTU).
    pub fn mtu(&self, mtu: u32, shrink: bool) -> anyhow::Result<()> {
        let n = &self.names;
        let m = mtu.to_string();
        let tx = ["ip", "-n", &n.tx_ns, "link", "set", &n.tx_dev, "mtu", &m];
        let rx = ["ip", "-n", &n.rx_ns, "link", "set", &n.rx_dev, "mtu", &m];
        let (a, b) = if shrink { (tx, rx) } else { (rx, tx) };
        run(&a)?;
        run(&b)?;
        Ok(())
    }

    /// Turns an offload of the sending end on or off (`tx`,
    /// `tx-udp-segmentation`).
    pub fn offload(&self, feature: &str, on: bool) -> anyhow::Result<()> {
        let n = &self.names;
        run(&[
            "ip",
            "netns",
            "exec",
            &n.tx_ns,
            "ethtool",
            "-K",
            &n.tx_dev,
            feature,
            if on { "on" } else { "off" },
        ])
        .map(|_| ())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove(&self.names);
        if let Ok(mut g) = LIVE.lock() {
            *g = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_per_process_and_fit_a_device_name() {
        let n = Names::for_pid(4_194_304);
        assert_eq!(n.tx_ns, "fusoak-4194304-tx");
        assert_eq!(n.rx_ns, "fusoak-4194304-rx");
        // IFNAMSIZ is 16 with the terminating zero.
        assert!(n.tx_dev.len() <= 15 && n.rx_dev.len() <= 15);
        assert_ne!(n.tx_dev, n.rx_dev);
        assert_ne!(n.tx_ns, crate::testbed::TX_NS);
        assert_ne!(n.tx_dev, crate::testbed::TX_DEV);
    }
}
