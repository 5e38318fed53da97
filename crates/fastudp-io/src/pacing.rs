//! Pacing: who makes each packet or GSO train leave at its departure time.
//!
//! A sender paces by giving each [`Transmit`](crate::Transmit) an earliest
//! departure time ([`Transmit::with_txtime`](crate::Transmit::with_txtime),
//! in ns of [`monotonic_ns`]'s clock), which the kernel honours with
//! `SO_TXTIME` and an EDT-aware qdisc, or by waiting for that time itself
//! in user space. [`choose_mode`] picks the one a socket can keep and says
//! why; [`set_timer_slack`] makes a user-space pacer's sleeps end on time.
//! Kernel pacing of a whole socket is
//! [`UdpIo::set_max_pacing_rate`](crate::UdpIo::set_max_pacing_rate).

/// `CLOCK_MONOTONIC` now, in ns: the clock of departure times and
/// `SCM_TXTIME`.
pub use crate::sys::monotonic_ns;

/// Asks the kernel to end the calling thread's timed waits within `ns`
/// nanoseconds of their deadline (`PR_SET_TIMERSLACK`; the default slack
/// is 50 us). A thread that paces by sleeping sets it small so that its
/// waits end on time. Linux only; elsewhere an `Unsupported` error.
pub fn set_timer_slack(ns: u64) -> std::io::Result<()> {
    crate::sys::set_timer_slack(ns)
}

/// Who enforces departure times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PacingMode {
    /// The kernel: SO_TXTIME with an EDT-aware qdisc (fq or etf).
    Kernel,
    /// fastudp, in user space: a send waits until its departure time.
    User,
    /// No pacing: everything leaves at once.
    None,
}

impl std::fmt::Display for PacingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PacingMode::Kernel => "kernel",
            PacingMode::User => "user",
            PacingMode::None => "none",
        })
    }
}

/// Chooses the mode for a wish, from whether the socket accepts SO_TXTIME
/// and the egress qdisc's kind, and says why in one sentence.
pub fn choose_mode(
    wanted: PacingMode,
    txtime_accepted: bool,
    qdisc: Option<&str>,
) -> (PacingMode, String) {
    let edt_qdisc = matches!(qdisc, Some("fq") | Some("etf"));
    match wanted {
        PacingMode::None => (PacingMode::None, "pacing is off".into()),
        PacingMode::User => (PacingMode::User, "pacing in user space, as asked".into()),
        PacingMode::Kernel if txtime_accepted && edt_qdisc => (
            PacingMode::Kernel,
            format!("the {} qdisc honours SO_TXTIME", qdisc.unwrap_or_default()),
        ),
        PacingMode::Kernel if !txtime_accepted => (
            PacingMode::User,
            "SO_TXTIME is not accepted here: pacing in user space instead".into(),
        ),
        PacingMode::Kernel => (
            PacingMode::User,
            format!(
                "the egress qdisc ({}) ignores SO_TXTIME: pacing in user space instead",
                qdisc.unwrap_or("unknown")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(
            choose_mode(PacingMode::Kernel, true, Some("fq")).0,
            PacingMode::Kernel
        );
        assert_eq!(
            choose_mode(PacingMode::Kernel, true, Some("etf")).0,
            PacingMode::Kernel
        );
        let (m, why) = choose_mode(PacingMode::Kernel, true, Some("noqueue"));
        assert_eq!(m, PacingMode::User);
        assert!(why.contains("noqueue"), "{why}");
        assert_eq!(
            choose_mode(PacingMode::Kernel, false, Some("fq")).0,
            PacingMode::User
        );
        assert_eq!(
            choose_mode(PacingMode::None, true, Some("fq")).0,
            PacingMode::None
        );
    }
}
