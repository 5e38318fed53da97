//! One device's offloads, queues and egress qdisc.

use super::check::{check, Check, Status};
use crate::host::devices::sysfs;
use crate::host::netlink;

/// The offloads, channels and egress qdisc of `dev`.
pub fn device_checks(
    dev: &str,
    qdiscs: &std::io::Result<Vec<netlink::Qdisc>>,
    out: &mut Vec<Check>,
) {
    let veth = fastudp_tools::host::driver(dev).is_ok_and(|d| d == "veth");
    let s = format!("device {dev}");
    out.push(mtu_check(dev, &s));
    let feats = match fastudp_tools::host::features(dev) {
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
    offload_checks(dev, &s, &feats, veth, out);
    if veth {
        veth_checks(dev, &s, &feats, out);
    }
    out.push(qdisc_check(dev, qdiscs));
}

/// The MTU, and the largest UDP segment it allows.
fn mtu_check(dev: &str, s: &str) -> Check {
    let mtu = sysfs(dev, "mtu");
    match &mtu {
        Ok(m) => {
            let mtu: usize = m.parse().unwrap_or(0);
            let seg = fastudp_tools::wire::max_segment_for_mtu(mtu, false)
                .min(fastudp_tools::wire::MAX_PAYLOAD_V4);
            check(
                s,
                "MTU",
                Status::Pass,
                format!("{m} bytes (largest UDP segment {seg} on IPv4)"),
                None,
            )
            .with("mtu", mtu as u64)
            .with("max_udp_segment_v4", seg as u64)
        }
        Err(e) => check(s, "MTU", Status::NA, format!("{e:#}"), None),
    }
}

/// The features of a device, by kernel name.
type Features = [fastudp_tools::host::NicFeature];

/// The feature `name` of `feats`, if the kernel has it.
fn get<'a>(feats: &'a Features, name: &str) -> Option<&'a fastudp_tools::host::NicFeature> {
    feats.iter().find(|f| f.name == name)
}

/// The offloads UDP GSO and GRO depend on.
fn offload_checks(dev: &str, s: &str, feats: &Features, veth: bool, out: &mut Vec<Check>) {
    out.push(checksum_check(dev, s, feats));
    let feature = |kernel: &str, shown: &str, why_off: &str, opt: &str| {
        offload_check(dev, s, get(feats, kernel), shown, why_off, opt)
    };
    out.push(feature(
        "tx-udp-segmentation",
        "tx-udp-segmentation",
        "GSO trains are cut into datagrams before the device",
        "tx-udp-segmentation",
    ));
    out.push(feature(
        "tx-generic-segmentation",
        "generic-segmentation-offload",
        "segmentation happens early, per datagram",
        "gso",
    ));
    out.push(feature(
        "rx-gro",
        "generic-receive-offload",
        "received datagrams are not coalesced",
        "gro",
    ));
    out.push(if veth {
        feature(
            "rx-udp-gro-forwarding",
            "rx-udp-gro-forwarding",
            "UDP forwarded or tunnelled through this veth is not aggregated",
            "rx-udp-gro-forwarding",
        )
    } else {
        gro_forwarding_check(s, feats)
    });
    out.push(gro_list_check(s, feats));
}

/// Transmit checksumming, without which GSO trains are checksummed in
/// software.
fn checksum_check(dev: &str, s: &str, feats: &Features) -> Check {
    let on = |n: &str| get(feats, n).is_some_and(|f| f.active);
    let csum = [
        "tx-checksum-ipv4",
        "tx-checksum-ip-generic",
        "tx-checksum-ipv6",
    ]
    .iter()
    .any(|n| on(n));
    let fixable = get(feats, "tx-checksum-ip-generic")
        .filter(|f| f.changeable)
        .map(|_| format!("ethtool -K {dev} tx on"));
    if csum {
        check(s, "tx-checksumming", Status::Pass, "on", None)
    } else {
        check(s, "tx-checksumming", Status::Warn, "off: GSO trains are checksummed in software (kernels before 6.11 refuse them with EIO)", fixable)
    }
}

/// One offload `f`, shown as `shown`: on, or off with why (`why_off`) and
/// the `ethtool -K` option (`opt`) that turns it on where the driver can.
fn offload_check(
    dev: &str,
    s: &str,
    f: Option<&fastudp_tools::host::NicFeature>,
    shown: &str,
    why_off: &str,
    opt: &str,
) -> Check {
    match f {
        None => check(s, shown, Status::NA, "the kernel has no such feature", None),
        Some(f) if f.active => check(s, shown, Status::Pass, "on", None),
        Some(f) if !f.changeable => check(
            s,
            shown,
            Status::Warn,
            format!("off [fixed]: {why_off}; the driver cannot change it"),
            None,
        ),
        Some(_) => check(
            s,
            shown,
            Status::Warn,
            format!("off: {why_off}"),
            Some(format!("ethtool -K {dev} {opt} on")),
        ),
    }
}

/// `rx-udp-gro-forwarding` on a device that is not a veth: it matters only
/// for forwarded or tunnelled UDP.
fn gro_forwarding_check(s: &str, feats: &Features) -> Check {
    match get(feats, "rx-udp-gro-forwarding") {
        Some(f) => check(
            s,
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
            s,
            "rx-udp-gro-forwarding",
            Status::NA,
            "the kernel has no such feature (needs 5.12)",
            None,
        ),
    }
}

/// Fraglist GRO: either way is fine, the check says what it means.
fn gro_list_check(s: &str, feats: &Features) -> Check {
    match get(feats, "rx-gro-list") {
        Some(f) if f.active => check(
            s,
            "rx-gro-list",
            Status::Pass,
            "on: fraglist GRO (good for forwarding; local sockets get trains re-segmented)",
            None,
        ),
        Some(_) => check(
            s,
            "rx-gro-list",
            Status::Pass,
            "off: UDP GRO builds trains a GRO socket takes whole",
            None,
        ),
        None => check(
            s,
            "rx-gro-list",
            Status::NA,
            "the kernel has no such feature",
            None,
        ),
    }
}

/// A veth's queues and NAPI GRO: what aggregates the datagrams crossing it.
fn veth_checks(dev: &str, s: &str, feats: &Features, out: &mut Vec<Check>) {
    out.push(channels_check(dev, s));
    out.push(gro_flush_check(dev, s));
    out.push(napi_defer_check(dev, s));
    out.push(napi_gro_check(dev, s, feats));
}

/// A veth's channels: one rx queue is one NAPI instance for all flows.
fn channels_check(dev: &str, s: &str) -> Check {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as u32;
    match fastudp_tools::host::channels(dev) {
        Ok(c) => {
            let want = c.max_rx.min(ncpu).max(1);
            let found = if c.rx >= 2 || c.rx >= c.max_rx {
                check(
                    s,
                    "channels",
                    Status::Pass,
                    format!("{} rx / {} tx queues", c.rx, c.tx),
                    None,
                )
            } else {
                check(
                    s,
                    "channels",
                    Status::Warn,
                    format!(
                        "{} rx queue of {} possible: one NAPI instance for all flows",
                        c.rx, c.max_rx
                    ),
                    Some(format!("ethtool -L {dev} rx {want} tx {want}")),
                )
            };
            found
                .with("rx", c.rx.into())
                .with("tx", c.tx.into())
                .with("max_rx", c.max_rx.into())
                .with("max_tx", c.max_tx.into())
        }
        Err(e) => check(s, "channels", Status::NA, format!("cannot read: {e}"), None),
    }
}

/// `gro_flush_timeout`: 0 flushes GRO at the end of every NAPI poll.
fn gro_flush_check(dev: &str, s: &str) -> Check {
    match sysfs(dev, "gro_flush_timeout") {
        Ok(v) if v != "0" => {
            let c = check(
                s,
                "gro_flush_timeout",
                Status::Pass,
                format!("{v} ns"),
                None,
            );
            match v.parse() {
                Ok(ns) => c.with("ns", ns),
                Err(_) => c,
            }
        }
        Ok(_) => check(
            s,
            "gro_flush_timeout",
            Status::Warn,
            "0: GRO flushes at the end of every NAPI poll, so trains stay short",
            Some(format!(
                "echo 50000 > /sys/class/net/{dev}/gro_flush_timeout"
            )),
        )
        .with("ns", 0),
        Err(e) => check(s, "gro_flush_timeout", Status::NA, format!("{e:#}"), None),
    }
}

/// `napi_defer_hard_irqs`: 0 polls for every few packets.
fn napi_defer_check(dev: &str, s: &str) -> Check {
    match sysfs(dev, "napi_defer_hard_irqs") {
        Ok(v) if v != "0" => {
            let c = check(s, "napi_defer_hard_irqs", Status::Pass, v.clone(), None);
            match v.parse::<u64>() {
                Ok(n) => c.with("value", n),
                Err(_) => c,
            }
        }
        Ok(_) => check(
            s,
            "napi_defer_hard_irqs",
            Status::Warn,
            "0: a NAPI poll for every few packets the sender puts on the veth; deferred to the gro_flush_timeout timer, UDP GSO+GRO took a quarter less CPU per byte on the testbed (BENCHMARKS section 15)",
            Some(format!(
                "echo {} > /sys/class/net/{dev}/napi_defer_hard_irqs",
                crate::host::devices::NAPI_DEFER
            )),
        )
        .with("value", 0),
        Err(e) => check(s, "napi_defer_hard_irqs", Status::NA, format!("{e:#}"), None),
    }
}

/// Whether the veth runs in NAPI mode (it does with GRO on).
fn napi_gro_check(dev: &str, s: &str, feats: &Features) -> Check {
    if get(feats, "rx-gro").is_some_and(|f| f.active) {
        check(
            s,
            "NAPI GRO",
            Status::Pass,
            "on: the veth runs in NAPI mode and aggregates what crosses it",
            None,
        )
    } else {
        check(
            s,
            "NAPI GRO",
            Status::Warn,
            "off: the veth hands every datagram up alone (no NAPI without GRO or XDP)",
            Some(format!("ethtool -K {dev} gro on")),
        )
    }
}

/// The root qdisc on `dev`: whether it honours SO_TXTIME.
fn qdisc_check(dev: &str, qdiscs: &std::io::Result<Vec<netlink::Qdisc>>) -> Check {
    // Egress qdisc.
    let qs = format!("qdisc {dev}");
    let ifindex = sysfs(dev, "ifindex")
        .ok()
        .and_then(|v| v.parse::<i32>().ok());
    match (qdiscs, ifindex) {
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
    }
}
