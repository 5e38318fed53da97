//! The io_uring check: what fastudp would use here, and why not io_uring
//! when it would not.

use super::check::{check, Check, Status};
use fastudp_io::uring::{probe, UringProbe};
use fastudp_io::UdpIo;

/// What a socket set up for io_uring got: ring sends, the ring receive,
/// and the fallbacks it recorded.
#[derive(Debug, Default, Clone)]
pub struct Tried {
    /// Sends go through the ring.
    pub send: bool,
    /// Receives come through the ring.
    pub recv: bool,
    /// Why not, as the socket recorded it.
    pub fallbacks: Vec<String>,
}

/// The check, with what this host offers now; `asked`: judged for a
/// program that turns the io_uring backend on (`doctor --uring`).
pub fn uring_check_now(asked: bool) -> Check {
    let p = probe();
    let tried = if p.available {
        try_socket()
    } else {
        Tried::default()
    };
    uring_check(asked, &p, &tried)
}

/// Sets up a loopback socket on the io_uring backend, as an application
/// asking for it would.
fn try_socket() -> Tried {
    let c = fastudp_io::Config::default().uring(true);
    match fastudp_io::Socket::bind("127.0.0.1:0".parse().expect("literal"), c) {
        Ok(s) => {
            let u = s.state().uring_stats().unwrap_or_default();
            Tried {
                send: u.send_active,
                recv: u.recv_active,
                fallbacks: s
                    .stats()
                    .fallbacks
                    .iter()
                    .filter(|f| f.feature == fastudp_io::Feature::Uring)
                    .map(|f| f.reason.clone())
                    .collect(),
            }
        }
        Err(e) => Tried {
            fallbacks: vec![format!("a socket could not be set up: {e}")],
            ..Tried::default()
        },
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The finding: which opcodes the kernel has, which backend fastudp picks
/// (syscalls unless a program asks for io_uring with `Config::uring`;
/// `doctor --uring` judges for such a program), and why not io_uring. Loosening
/// `kernel.io_uring_disabled` is advised only when io_uring was asked for:
/// fastudp's default path does not need it.
pub fn uring_check(asked: bool, p: &UringProbe, t: &Tried) -> Check {
    let s = "kernel";
    let name = "io_uring";
    let values = |c: Check| {
        c.with("available", u64::from(p.available))
            .with("recvmsg_multishot", u64::from(p.receive_ok()))
            .with("sendmsg", u64::from(p.send_ok()))
            .with("sendmsg_zc", u64::from(p.zerocopy_ok()))
            .with("asked", u64::from(asked))
    };
    if !p.available {
        let why = p.why_not().unwrap_or_default();
        if !asked {
            return values(check(
                s,
                name,
                Status::Pass,
                format!("backend: syscalls (the default; io_uring is not available here: {why})"),
                None,
            ));
        }
        let sysctl = p.errno == Some(libc::EPERM) && p.sysctl_disabled.is_some_and(|v| v > 0);
        let fix = sysctl.then(|| {
            if p.sysctl_disabled == Some(1) {
                "add this user to the group in kernel.io_uring_group, or sysctl -w kernel.io_uring_disabled=0".to_string()
            } else {
                "sysctl -w kernel.io_uring_disabled=0".to_string()
            }
        });
        let tail = if sysctl {
            ""
        } else {
            " (this cannot be fixed from fastudp: the kernel build or a seccomp filter decides)"
        };
        return values(check(
            s,
            name,
            Status::Warn,
            format!("io_uring asked for (--uring), but {why}; backend: syscalls{tail}"),
            fix,
        ));
    }
    let ops = format!(
        "multishot RECVMSG with buffer rings {}, SENDMSG {}, SENDMSG_ZC {}",
        yes(p.receive_ok()),
        yes(p.send_ok()),
        yes(p.zerocopy_ok())
    );
    let chosen = match (t.send, t.recv) {
        (true, true) => "io_uring for send and receive",
        (true, false) => "io_uring for send, syscalls for receive",
        (false, true) => "syscalls for send, io_uring for receive",
        (false, false) => "syscalls",
    };
    let why_not = if t.fallbacks.is_empty() {
        String::new()
    } else {
        format!("; why not io_uring: {}", t.fallbacks.join("; "))
    };
    if !asked {
        return values(check(
            s,
            name,
            Status::Pass,
            format!(
                "{ops}; backend: syscalls (the default); with Config::uring: {chosen}{why_not}"
            ),
            None,
        ));
    }
    let full = t.send && t.recv;
    values(check(
        s,
        name,
        if full { Status::Pass } else { Status::Warn },
        format!(
            "{ops}; backend (Config::uring, asked for with --uring): {chosen}{why_not}{}",
            if full {
                ""
            } else {
                " (cannot be fixed by a setting: the kernel lacks the pieces named)"
            }
        ),
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(sysctl: u8, errno: i32) -> UringProbe {
        let mut p = UringProbe::default();
        p.sysctl_disabled = Some(sysctl);
        p.errno = Some(errno);
        p.error = Some("io_uring_setup failed".into());
        p
    }

    #[test]
    fn loosening_the_sysctl_is_advised_only_when_io_uring_was_asked_for() {
        let p = denied(2, libc::EPERM);
        let c = uring_check(false, &p, &Tried::default());
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(
            c.fix.is_none() && c.detail.contains("backend: syscalls"),
            "{c:?}"
        );
        let c = uring_check(true, &p, &Tried::default());
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            c.fix.as_deref(),
            Some("sysctl -w kernel.io_uring_disabled=0")
        );
        // A seccomp filter is not the sysctl's doing: no sysctl advice.
        let c = uring_check(true, &denied(0, libc::ENOSYS), &Tried::default());
        assert!(
            c.fix.is_none() && c.detail.contains("cannot be fixed"),
            "{c:?}"
        );
    }

    #[test]
    fn says_which_ops_and_which_backend() {
        let mut p = UringProbe::default();
        p.available = true;
        p.sendmsg = true;
        let t = Tried {
            send: true,
            recv: false,
            fallbacks: vec![],
        };
        let c = uring_check(true, &p, &t);
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("SENDMSG yes"), "{}", c.detail);
        assert!(c.detail.contains("multishot RECVMSG with buffer rings no"));
        assert!(c.detail.contains("io_uring for send, syscalls for receive"));
        let c = uring_check(false, &p, &t);
        assert_eq!(c.status, Status::Pass);
        assert!(
            c.detail.contains("backend: syscalls (the default)"),
            "{}",
            c.detail
        );
    }
}
