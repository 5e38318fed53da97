//! Which device a destination is routed through: the kernel's own answer
//! (`RTM_GETROUTE`, as `ip route get` asks), after policy rules and
//! across every table, the local one included.

use super::netlink;
use std::net::IpAddr;

/// The name of the device of index `ifindex`, from sysfs.
fn device_name(ifindex: u32) -> Option<String> {
    std::fs::read_dir("/sys/class/net")
        .ok()?
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_to_string(e.path().join("ifindex"))
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                == Some(ifindex)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// The device that carries traffic to `ip` in this network namespace.
pub fn device_for(ip: IpAddr) -> anyhow::Result<String> {
    use anyhow::Context;
    let idx = netlink::route_device(ip).with_context(|| format!("no route to {ip}"))?;
    device_name(idx).with_context(|| {
        format!("the route to {ip} leaves through device {idx}, which sysfs does not list")
    })
}

/// The kind of the root qdisc of the device that carries traffic to
/// `dest`, if it can be read.
pub fn egress_qdisc(dest: IpAddr) -> Option<String> {
    let dev = device_for(dest).ok()?;
    let idx: i32 = std::fs::read_to_string(format!("/sys/class/net/{dev}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    netlink::qdiscs()
        .ok()?
        .into_iter()
        .find(|q| q.ifindex == idx && q.parent == netlink::TC_H_ROOT)
        .map(|q| q.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_goes_over_lo() {
        assert_eq!(device_for("127.0.0.1".parse().unwrap()).unwrap(), "lo");
        // One of this host's own addresses goes over lo too, as the
        // kernel's local table says.
        assert_eq!(device_for("127.3.4.5".parse().unwrap()).unwrap(), "lo");
    }
}
