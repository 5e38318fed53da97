//! The kernel's UDP features, from the library's probe.

use super::check::{check, Check, Status};

/// The kernel's version and UDP features.
pub fn kernel_checks(out: &mut Vec<Check>, uring: bool) {
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
    let probe = crate::args::disabled_from_env().and_then(|d| {
        fastudp::Socket::bind_with(
            "127.0.0.1:0".parse().expect("literal"),
            fastudp::Config::default().disabled(d),
        )
        .map_err(anyhow::Error::from)
    });
    let caps = match probe {
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
    let segs = caps.max_gso_segments as u64;
    out.push(
        match caps.max_gso_segments {
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
        }
        .with("max_segments", segs),
    );
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
    out.push(super::uring::uring_check_now(uring));
}
