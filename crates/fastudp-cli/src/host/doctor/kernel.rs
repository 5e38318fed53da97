//! The kernel's UDP features, from the library's probe.

use super::check::{check, Check, Status};
use fastudp_io::Feature;

/// The kernel's version and UDP features.
pub fn kernel_checks(out: &mut Vec<Check>, uring: bool) {
    out.push(version_check());
    let caps = match probe() {
        Ok(sock) => sock.capabilities(),
        Err(e) => {
            out.push(check(
                S,
                "capabilities",
                Status::NA,
                format!("cannot open a probe socket: {e:#}"),
                None,
            ));
            return;
        }
    };
    out.push(gso_check(&caps));
    out.push(gro_check(&caps));
    feature_checks(&caps, out);
    out.push(super::uring::uring_check_now(uring));
}

/// The section of these checks.
const S: &str = "kernel";

/// The kernel's release.
fn version_check() -> Check {
    match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(v) => check(
            S,
            "version",
            Status::Pass,
            format!("Linux {}", v.trim()),
            None,
        ),
        Err(e) => check(
            S,
            "version",
            Status::NA,
            format!("cannot read /proc/sys/kernel/osrelease: {e}"),
            None,
        ),
    }
}

/// A socket of the library, as a program would open it (`FASTUDP_DISABLE`
/// included), whose capabilities say what the kernel offers.
fn probe() -> anyhow::Result<fastudp_io::Socket> {
    let d = crate::args::disabled_from_env()?;
    // The library's error says its cause itself: one message, no chain.
    fastudp_io::Socket::bind(
        "127.0.0.1:0".parse().expect("literal"),
        fastudp_io::Config::default().disable(d),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// UDP GSO, and how many segments a send may carry.
fn gso_check(caps: &fastudp_io::Capabilities) -> Check {
    let segs = caps.max_gso_segments as u64;
    match caps.max_gso_segments {
        n if n >= 64 => check(
            S,
            "UDP GSO",
            Status::Pass,
            format!("{n} segments per send"),
            None,
        ),
        _ if caps.is_disabled(Feature::Gso) => check(
            S,
            "UDP GSO",
            Status::Warn,
            "switched off by FASTUDP_DISABLE",
            None,
        ),
        _ => check(
            S,
            "UDP GSO",
            Status::Fail,
            "not supported: needs Linux 4.18",
            None,
        ),
    }
    .with("max_segments", segs)
}

/// UDP GRO.
fn gro_check(caps: &fastudp_io::Capabilities) -> Check {
    if caps.supports(Feature::Gro) {
        check(
            S,
            "UDP GRO",
            Status::Pass,
            "coalesced receive available",
            None,
        )
    } else {
        check(
            S,
            "UDP GRO",
            Status::Warn,
            "not available: needs Linux 5.0 (or FASTUDP_DISABLE has gro)",
            None,
        )
    }
}

/// The features a program can do without: MSG_ZEROCOPY, SO_TXTIME, ECN,
/// PKTINFO.
fn feature_checks(caps: &fastudp_io::Capabilities, out: &mut Vec<Check>) {
    let yes_no = |ok: bool, name: &str, good: &str, bad: &str| {
        check(
            S,
            name,
            if ok { Status::Pass } else { Status::Warn },
            if ok { good } else { bad },
            None,
        )
    };
    out.push(yes_no(
        caps.supports(Feature::Zerocopy),
        "MSG_ZEROCOPY",
        "available",
        "not available: needs Linux 5.0",
    ));
    out.push(yes_no(
        caps.supports(Feature::Txtime),
        "SO_TXTIME",
        "accepted (whether it is honoured depends on the egress qdisc, below)",
        "not accepted: kernel pacing unavailable, fastudp paces in user space",
    ));
    out.push(yes_no(
        caps.supports(Feature::Ecn),
        "ECN",
        "marks can be read on receive",
        "ECN marks cannot be read",
    ));
    out.push(yes_no(
        caps.supports(Feature::Pktinfo),
        "PKTINFO",
        "destination and source addresses per datagram",
        "not available",
    ));
}
