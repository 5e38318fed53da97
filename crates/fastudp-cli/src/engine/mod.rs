//! The send/receive engine under the commands: the strategies
//! (`TxStrategy`, `RxStrategy`), the workload one run measures, the
//! sending and receiving loops (`tx`, `rx`, `uring`), sequence-number
//! accounting (`seq`) and the per-second lines (`report`).
//!
//! `bench`, `tx`/`rx` (with their control channel), `stream` and the
//! lab's `soak` all run on it. It imports no command (see
//! ARCHITECTURE.md, "The CLI").

pub mod report;
pub mod rx;
pub mod seq;
pub mod tx;
pub mod uring;

use crate::testbed::Profile;
use clap::ValueEnum;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

/// How datagrams are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TxStrategy {
    /// One datagram per sendto call.
    Sendto,
    /// One datagram per message, `--batch` messages per sendmmsg call.
    Sendmmsg,
    /// The UDP_SEGMENT socket option and one big buffer per sendto (the
    /// NGINX article's "merge sendto").
    GsoSockopt,
    /// A scatter-gather iovec of datagrams per sendmsg, with the socket
    /// option set (the NGINX article's "without segment").
    GsoIov,
    /// The same, with the UDP_SEGMENT cmsg instead of the option.
    GsoIovCmsg,
    /// One buffer with the UDP_SEGMENT cmsg per sendmsg (the NGINX article's "merge
    /// sendmsg").
    GsoCmsg,
    /// Several GSO super-buffers, each with its cmsg, per sendmmsg call.
    SendmmsgGso,
    /// The NGINX article's "sendmmsg + GSO": one datagram per message, each with a
    /// UDP_SEGMENT cmsg larger than the datagram, so nothing is segmented.
    SendmmsgGsoSeed,
    /// GSO with MSG_ZEROCOPY: the library's zerocopy sender, completions
    /// reaped, buffers reused only after their completion.
    GsoZerocopy,
    /// The fastudp library's own path: `Socket::send` of GSO trains.
    Fastudp,
    /// A TCP stream of the same bytes.
    Tcp,
    /// The TCP stream sent with MSG_ZEROCOPY, completions reaped from the
    /// error queue, buffers reused only after their completion.
    TcpZerocopy,
    /// The library's path on its io_uring backend: GSO trains as unlinked
    /// SENDMSGs reconciled into one prefix, one io_uring_enter per batch.
    UringGso,
    /// GSO trains with io_uring SENDMSG_ZC: buffers come back on the
    /// notification completion.
    UringZc,
    /// `uring-zc` from the sender's pool of registered buffers (fixed
    /// buffers) with the socket as a registered file, where the kernel
    /// takes them: each buffer stamped in place, reused after its
    /// notification.
    UringZcFixed,
}

impl TxStrategy {
    /// A TCP stream, with its own receiver, rather than datagrams.
    pub fn is_tcp(self) -> bool {
        matches!(self, TxStrategy::Tcp | TxStrategy::TcpZerocopy)
    }
}

/// How datagrams are received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RxStrategy {
    /// One datagram per recvfrom call.
    Recvfrom,
    /// `--batch` datagrams per recvmmsg call.
    Recvmmsg,
    /// UDP GRO, one coalesced message per recvmsg call.
    Gro,
    /// UDP GRO and recvmmsg.
    GroRecvmmsg,
    /// UDP GRO through io_uring: one multishot RECVMSG into provided
    /// buffers, datagrams read in place.
    UringGro,
}

/// `--batch` when not given.
pub const DEFAULT_BATCH: usize = 32;

/// The workload one pairing runs.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Datagram payload in bytes.
    pub payload: usize,
    /// Datagrams per batched send call.
    pub batch: usize,
    /// How long each pairing runs.
    pub duration: Duration,
    /// Run over IPv6 instead of IPv4.
    pub ipv6: bool,
    /// Datagrams per GSO buffer: the batch, cut to the kernel's segment and
    /// byte limits.
    pub segs: usize,
    /// The testbed profile, or `None` for loopback.
    pub net: Option<Profile>,
    /// Pin sender and receiver threads to CPUs 0 and 1.
    pub pin: bool,
    /// Cycle through [`tx::THRASH_BYTES`] of send buffers.
    pub cache_thrash: bool,
    /// Connect the UDP sender to its destination (`fastudp tx`), so that
    /// ICMP errors from a peer that went away are reported.
    pub connect: bool,
    /// Pace the UDP sender to this many payload bytes per second (`tx -b`).
    pub rate: Option<u64>,
    /// Bind the sender to this address first (`tx -B`).
    pub bind: Option<SocketAddr>,
    /// SO_BUSY_POLL on the receiving socket, in microseconds.
    pub busy_poll: Option<u32>,
}

/// Counters the threads share while running.
#[derive(Debug, Default)]
pub struct Live {
    /// Send calls so far.
    pub tx_calls: AtomicU64,
    /// Datagrams sent so far.
    pub tx_datagrams: AtomicU64,
    /// Payload bytes received so far.
    pub rx_bytes: AtomicU64,
    /// Datagrams received so far.
    pub rx_datagrams: AtomicU64,
    /// Receive calls that returned data so far.
    pub rx_calls: AtomicU64,
    /// Set when the sender has stopped: the receiver drains and ends.
    pub sender_done: AtomicBool,
}

/// What the sender reports at the end.
#[derive(Debug, Default, Clone, Copy)]
pub struct TxOutcome {
    /// Datagrams sent.
    pub datagrams: u64,
    /// Payload bytes sent.
    pub bytes: u64,
    /// Send calls made.
    pub calls: u64,
    /// The sending thread's CPU time.
    pub cpu: Duration,
    /// Wall-clock seconds the sender ran.
    pub seconds: f64,
    /// Zerocopy runs: (completions, of which copied).
    pub zerocopy: Option<(u64, u64)>,
}

/// What the receiver reports at the end.
#[derive(Debug, Default, Clone, Copy)]
pub struct RxOutcome {
    /// Datagrams received.
    pub datagrams: u64,
    /// Distinct sequence numbers seen (UDP; 0 for TCP).
    pub unique: u64,
    /// Datagrams too short to carry a sequence number.
    pub unsequenced: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// Receive calls that returned data.
    pub calls: u64,
    /// The receiving thread's CPU time.
    pub cpu: Duration,
    /// Drops the kernel counted on the receiving socket (messages).
    pub kernel_drops: u64,
}

/// The unspecified address of a family, port 0: where senders bind.
pub fn unspecified(ipv6: bool) -> SocketAddr {
    if ipv6 {
        "[::]:0".parse().expect("literal")
    } else {
        "0.0.0.0:0".parse().expect("literal")
    }
}

/// Prints one line per second, from `sample` (bytes, datagrams, calls so
/// far), until `handle`'s thread ends. A line that cannot be written ends
/// it with the error.
pub fn monitor<T>(
    label: &str,
    quiet: bool,
    handle: &std::thread::JoinHandle<T>,
    sample: impl Fn() -> (u64, u64, u64),
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = (0u64, 0u64, 0u64);
    let mut tick = 1u32;
    while !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        if start.elapsed() >= Duration::from_secs(tick as u64) {
            let now = sample();
            if !quiet {
                report::print_interval(
                    label,
                    tick,
                    now.0 - last.0,
                    now.1 - last.1,
                    now.2 - last.2,
                )?;
            }
            last = now;
            tick += 1;
        }
    }
    Ok(())
}

/// The width of the longest pairing label (of every send and receive
/// strategy), for the per-second lines.
pub fn label_width() -> usize {
    TxStrategy::value_variants()
        .iter()
        .flat_map(|&t| {
            RxStrategy::value_variants()
                .iter()
                .map(move |&r| pair_label(t, r).len())
        })
        .max()
        .unwrap_or(0)
}

/// A pairing's label in the per-second lines and messages.
pub fn pair_label(t: TxStrategy, r: RxStrategy) -> String {
    if t.is_tcp() {
        name(t)
    } else {
        format!("{}->{}", name(t), rname(r))
    }
}

/// The command-line name of a send strategy.
pub fn name(t: TxStrategy) -> String {
    t.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// The command-line name of a receive strategy.
pub fn rname(r: RxStrategy) -> String {
    r.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}
