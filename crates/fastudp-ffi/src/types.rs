//! The C structures and constants of libfastudp, and their conversions from
//! the Rust library's types where no raw memory is involved (socket
//! addresses are written by [`crate::abi`]).
//!
//! Structures passed *in* are read during the call only; structures passed
//! *out* are written by the call and belong to the caller.

#![allow(non_camel_case_types)]

use crate::abi::empty_storage;
use crate::result::Failure;
use libc::{sockaddr, sockaddr_storage, socklen_t};
use std::ffi::c_char;
use std::time::Duration;

// ---------------------------------------------------------------- features

/// Feature bit: UDP GSO (segmentation offload) on send.
pub const FASTUDP_FEATURE_GSO: u32 = 1 << 0;
/// Feature bit: UDP GRO (receive coalescing).
pub const FASTUDP_FEATURE_GRO: u32 = 1 << 1;
/// Feature bit: `sendmmsg`/`recvmmsg` batching.
pub const FASTUDP_FEATURE_MMSG: u32 = 1 << 2;
/// Feature bit: ECN marks on send and receive.
pub const FASTUDP_FEATURE_ECN: u32 = 1 << 3;
/// Feature bit: PKTINFO (destination address on receive, source on send).
pub const FASTUDP_FEATURE_PKTINFO: u32 = 1 << 4;
/// Feature bit: `MSG_ZEROCOPY`.
pub const FASTUDP_FEATURE_ZEROCOPY: u32 = 1 << 5;
/// Feature bit: `SO_TXTIME` departure times.
pub const FASTUDP_FEATURE_TXTIME: u32 = 1 << 6;
/// Every feature bit this version knows.
pub const FASTUDP_FEATURE_ALL: u32 = (1 << 7) - 1;

/// Each `FASTUDP_FEATURE_*` bit and the library's feature it names.
const FEATURE_BITS: [(fastudp_io::Feature, u32); 7] = [
    (fastudp_io::Feature::Gso, FASTUDP_FEATURE_GSO),
    (fastudp_io::Feature::Gro, FASTUDP_FEATURE_GRO),
    (fastudp_io::Feature::Mmsg, FASTUDP_FEATURE_MMSG),
    (fastudp_io::Feature::Ecn, FASTUDP_FEATURE_ECN),
    (fastudp_io::Feature::Pktinfo, FASTUDP_FEATURE_PKTINFO),
    (fastudp_io::Feature::Zerocopy, FASTUDP_FEATURE_ZEROCOPY),
    (fastudp_io::Feature::Txtime, FASTUDP_FEATURE_TXTIME),
];

/// The features of a feature mask.
pub fn features_from_mask(mask: u32) -> Vec<fastudp_io::Feature> {
    FEATURE_BITS
        .iter()
        .filter(|(_, bit)| mask & bit != 0)
        .map(|(f, _)| *f)
        .collect()
}

/// The feature mask of the features `has` says yes to.
pub fn mask_of(has: impl Fn(fastudp_io::Feature) -> bool) -> u32 {
    FEATURE_BITS
        .iter()
        .filter(|(f, _)| has(*f))
        .fold(0, |m, (_, bit)| m | bit)
}

/// The feature bit of a feature the socket turned off (0 for one this
/// version does not know).
pub fn feature_bit(f: fastudp_io::Feature) -> u32 {
    mask_of(|g| g == f)
}

// ------------------------------------------------------------------- config

/// Options for a new socket. Fill it with `fastudp_config_init` first, then
/// change what you need; the functions that take it read it during the
/// call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fastudp_config {
    /// Turn UDP GRO on for receive (default true).
    pub gro: bool,
    /// `FASTUDP_FEATURE_*` bits to switch off (default 0). The library
    /// reads no environment variable.
    pub disabled: u32,
    /// `SO_RCVBUF` to request in bytes; 0 leaves the system's default. At
    /// most `INT_MAX`, the kernel's type for it (more is
    /// `FASTUDP_ERR_INVALID`).
    pub recv_buffer: usize,
    /// `SO_SNDBUF` to request in bytes; 0 leaves the system's default. At
    /// most `INT_MAX` (more is `FASTUDP_ERR_INVALID`).
    pub send_buffer: usize,
    /// On a blocking socket, how long a train sent one datagram at a time
    /// (GSO off) may wait for buffer space once its first datagram is out,
    /// in milliseconds (default 5000).
    pub split_wait_ms: u64,
    /// How long GSO stays off after the path refused it, in milliseconds,
    /// doubling per refusal in a row (default 1000).
    pub gso_retry_ms: u64,
    /// Let the kernel fragment datagrams larger than the path MTU (default
    /// false: don't-fragment, as QUIC needs).
    pub may_fragment: bool,
}

impl Default for fastudp_config {
    fn default() -> Self {
        // `fastudp_io::Config::default()`'s values, as its setters document
        // them (a test compares the two configurations).
        fastudp_config {
            gro: true,
            disabled: 0,
            recv_buffer: 0,
            send_buffer: 0,
            split_wait_ms: 5000,
            gso_retry_ms: 1000,
            may_fragment: false,
        }
    }
}

impl fastudp_config {
    /// The Rust configuration, or a sentence saying what is wrong.
    pub fn to_config(&self) -> Result<fastudp_io::Config, Failure> {
        if self.disabled & !FASTUDP_FEATURE_ALL != 0 {
            return Err(Failure::Invalid(format!(
                "config.disabled has unknown feature bits {:#x} (known: {:#x})",
                self.disabled & !FASTUDP_FEATURE_ALL,
                FASTUDP_FEATURE_ALL
            )));
        }
        for (name, v) in [
            ("recv_buffer", self.recv_buffer),
            ("send_buffer", self.send_buffer),
        ] {
            // The kernel takes an int: a larger value would be cut to its
            // low 32 bits (4 GiB + 5 would ask for 5 bytes).
            if v > i32::MAX as usize {
                return Err(Failure::Invalid(format!(
                    "config.{name} {v}: at most {} (INT_MAX) bytes, 0 for the system's default",
                    i32::MAX
                )));
            }
        }
        let mut c = fastudp_io::Config::default()
            .gro(self.gro)
            .disable(features_from_mask(self.disabled))
            .split_wait(Duration::from_millis(self.split_wait_ms))
            .gso_retry(Duration::from_millis(self.gso_retry_ms))
            .may_fragment(self.may_fragment);
        if self.recv_buffer > 0 {
            c = c.recv_buffer(self.recv_buffer);
        }
        if self.send_buffer > 0 {
            c = c.send_buffer(self.send_buffer);
        }
        Ok(c)
    }
}

/// `flags` of `fastudp_socket_from_fd`: the socket takes the descriptor
/// and closes it in `fastudp_socket_free`. Without it the caller keeps the
/// descriptor, and must keep it open until `fastudp_socket_free`.
pub const FASTUDP_FD_OWNED: u32 = 1;

// ------------------------------------------------------------- capabilities

/// What the kernel and this socket support, as probed when the socket was
/// set up (after switched-off features are removed).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fastudp_capabilities {
    /// Most GSO segments per send: 128 on new kernels, 64 on older ones, 1
    /// without GSO. `fastudp_socket_max_gso_segments` gives the number in
    /// force now (1 while GSO is off after a refusal).
    pub max_gso_segments: usize,
    /// The kernel's segment limit per send, whether or not this socket
    /// uses GSO.
    pub kernel_max_segments: usize,
    /// UDP GRO is on for receive.
    pub gro: bool,
    /// ECN marks are sent and read.
    pub ecn: bool,
    /// PKTINFO: destination address on receive, source on send.
    pub pktinfo: bool,
    /// `sendmmsg`/`recvmmsg` batching.
    pub mmsg: bool,
    /// The `SO_RXQ_OVFL` drop counter.
    pub rxq_ovfl: bool,
    /// ICMP errors reach the error queue (`IP_RECVERR`/`IPV6_RECVERR`).
    pub recverr: bool,
    /// Don't-fragment is set.
    pub dont_fragment: bool,
    /// `MSG_ZEROCOPY` is accepted.
    pub zerocopy: bool,
    /// `SO_TXTIME` is accepted.
    pub txtime: bool,
    /// `FASTUDP_FEATURE_*` bits the user switched off.
    pub disabled: u32,
}

impl From<fastudp_io::Capabilities> for fastudp_capabilities {
    fn from(c: fastudp_io::Capabilities) -> Self {
        use fastudp_io::Feature;
        fastudp_capabilities {
            max_gso_segments: c.max_gso_segments,
            kernel_max_segments: c.kernel_max_segments,
            gro: c.supports(Feature::Gro),
            ecn: c.supports(Feature::Ecn),
            pktinfo: c.supports(Feature::Pktinfo),
            mmsg: c.supports(Feature::Mmsg),
            rxq_ovfl: c.supports(Feature::RxqOvfl),
            recverr: c.supports(Feature::Recverr),
            dont_fragment: c.supports(Feature::DontFragment),
            zerocopy: c.supports(Feature::Zerocopy),
            txtime: c.supports(Feature::Txtime),
            disabled: mask_of(|f| c.is_disabled(f)),
        }
    }
}

// --------------------------------------------------------------------- send

/// ECN codepoint: none (Not-ECT).
pub const FASTUDP_ECN_NONE: u8 = 0;
/// ECN codepoint ECT(1).
pub const FASTUDP_ECN_ECT1: u8 = 1;
/// ECN codepoint ECT(0).
pub const FASTUDP_ECN_ECT0: u8 = 2;
/// ECN codepoint CE (congestion experienced).
pub const FASTUDP_ECN_CE: u8 = 3;

/// The Rust codepoint of a C ECN value (`None` for 0), or an error for a
/// value over 3.
pub fn ecn_from_c(v: u8) -> Result<Option<fastudp_io::EcnCodepoint>, Failure> {
    if v > FASTUDP_ECN_CE {
        return Err(Failure::Invalid(format!("ECN value {v} is not 0 to 3")));
    }
    Ok(fastudp_io::EcnCodepoint::from_bits(v))
}

/// The C value of an ECN codepoint.
pub fn ecn_to_c(e: Option<fastudp_io::EcnCodepoint>) -> u8 {
    e.map_or(FASTUDP_ECN_NONE, |e| e as u8)
}

/// One send: a payload to a destination, optionally a GSO train. Every
/// pointer is read during `fastudp_send` only; the caller owns them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fastudp_transmit {
    /// Where the datagrams go: a `struct sockaddr_in` or `sockaddr_in6`
    /// (an IPv4 destination on an IPv6 socket may be either form).
    pub destination: *const sockaddr,
    /// The size of `*destination`.
    pub destination_len: socklen_t,
    /// The payload. With a `segment_size`, several datagrams laid end to
    /// end. May be NULL only when `contents_len` is 0.
    pub contents: *const u8,
    /// Bytes at `contents`.
    pub contents_len: usize,
    /// Bytes per datagram of a GSO train (the last may be shorter); 0 sends
    /// `contents` as one datagram.
    pub segment_size: usize,
    /// `FASTUDP_ECN_*` for every datagram of the transmit.
    pub ecn: u8,
    /// The source address to send from (`IP_PKTINFO`/`IPV6_PKTINFO`; the
    /// port is ignored), or NULL for the kernel's choice.
    pub source: *const sockaddr,
    /// The size of `*source` (ignored when `source` is NULL).
    pub source_len: socklen_t,
    /// Send at `txtime_ns` (`SCM_TXTIME`; needs `fastudp_socket_enable_txtime`).
    pub has_txtime: bool,
    /// Earliest departure time in ns of `CLOCK_MONOTONIC`, when
    /// `has_txtime`.
    pub txtime_ns: u64,
}

/// What one `fastudp_send` got through: `transmits[0..transmits]` whole,
/// then the first `datagrams` datagrams of `transmits[transmits]` (non-zero
/// only for a train sent one datagram at a time, with GSO off). Resume from
/// there: advance that transmit's `contents` by `datagrams * segment_size`
/// bytes.
///
/// Of those datagrams, `dropped_locally` never left the host: a local
/// queue (the device's qdisc) was full and the kernel answered `ENOBUFS`.
/// They are done all the same, as datagrams lost on the way would be (the
/// kernel reports them so only because fastudp sets `IP_RECVERR`; without
/// it they would be counted and the send would succeed): do not send them
/// again as if they were waiting. The datagrams that went out are the
/// others.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fastudp_sent {
    /// Transmits done whole (sent, or dropped by the local queue).
    pub transmits: usize,
    /// Datagrams of the next transmit done before the call stopped.
    pub datagrams: usize,
    /// Of the datagrams above, those a full local queue dropped (a GSO
    /// train dropped at once counts all its datagrams).
    pub dropped_locally: usize,
}

// ------------------------------------------------------------------ receive

/// Metadata of one received message, which may hold a GRO train of
/// datagrams. It lives in its batch: valid until the next receive into the
/// batch or `fastudp_recv_batch_free`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fastudp_recv_meta {
    /// Who sent it (v4-mapped on a dual-stack socket for IPv4 peers).
    pub source: sockaddr_storage,
    /// The size of the address in `source`.
    pub source_len: socklen_t,
    /// The address it was sent to (PKTINFO; port 0), when known.
    pub destination: sockaddr_storage,
    /// The size of the address in `destination`; 0 when unknown.
    pub destination_len: socklen_t,
    /// `FASTUDP_ECN_*`: its ECN codepoint (0 when unmarked or ECN is off).
    pub ecn: u8,
    /// Bytes of payload.
    pub len: usize,
    /// Bytes of each datagram (the GRO segment size); equal to `len` for a
    /// single datagram. The last datagram may be shorter.
    pub stride: usize,
    /// Datagrams in the message.
    pub datagrams: usize,
    /// `MSG_TRUNC`: the message was larger than the buffer; its tail was
    /// lost.
    pub truncated: bool,
    /// `MSG_CTRUNC`: some control data was lost.
    pub control_truncated: bool,
    /// The interface it arrived on (PKTINFO), 0 when unknown.
    pub ifindex: u32,
}

impl fastudp_recv_meta {
    /// A meta with the scalar fields of `m`; the addresses are left empty
    /// for [`crate::abi`] to write.
    pub fn scalars(m: &fastudp_io::RecvMeta) -> fastudp_recv_meta {
        fastudp_recv_meta {
            source: empty_storage(),
            source_len: 0,
            destination: empty_storage(),
            destination_len: 0,
            ecn: ecn_to_c(m.ecn),
            len: m.len,
            stride: m.stride,
            datagrams: if m.len == 0 {
                1
            } else {
                m.len.div_ceil(m.stride.max(1))
            },
            truncated: m.truncated,
            control_truncated: m.control_truncated,
            ifindex: m.ifindex.unwrap_or(0),
        }
    }
}

/// One datagram of a received batch, from `fastudp_datagram_iter_next`.
/// Its pointers point into the batch: valid until the next receive into
/// it or `fastudp_recv_batch_free`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fastudp_datagram {
    /// The payload.
    pub data: *const u8,
    /// Its length.
    pub len: usize,
    /// The metadata of the message it came in.
    pub meta: *const fastudp_recv_meta,
    /// The index of that message in the batch.
    pub message: usize,
}

/// An iterator over every datagram of every message of a batch, set up by
/// `fastudp_recv_batch_datagrams` on the caller's stack. Its fields are
/// private: do not change them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fastudp_datagram_iter {
    /// The batch (private).
    pub batch: *const core::ffi::c_void,
    /// The message being split (private).
    pub message: usize,
    /// The offset of the next datagram in it (private).
    pub offset: usize,
    /// The batch's receive count when the iterator was set up (private): a
    /// receive into the batch ends the iteration.
    pub generation: u64,
}

// -------------------------------------------------------------- error queue

/// `kind` of a `fastudp_socket_error`: an ICMP error said a destination
/// could not be reached.
pub const FASTUDP_SOCKET_ERROR_UNREACHABLE: u32 = 1;
/// `kind`: a datagram was larger than the path allows (`mtu`).
pub const FASTUDP_SOCKET_ERROR_PACKET_TOO_BIG: u32 = 2;
/// `kind`: the qdisc dropped a packet for its `SCM_TXTIME` departure time.
pub const FASTUDP_SOCKET_ERROR_TXTIME: u32 = 3;
/// `kind`: `MSG_ZEROCOPY` sends `zerocopy_lo..=zerocopy_hi` completed.
pub const FASTUDP_SOCKET_ERROR_ZEROCOPY: u32 = 4;
/// `kind`: anything else (raw fields in `origin`, `icmp_type`,
/// `icmp_code`, `info`, `data`).
pub const FASTUDP_SOCKET_ERROR_OTHER: u32 = 5;

/// `reason` of an unreachable error: no socket on the port.
pub const FASTUDP_UNREACHABLE_PORT: u32 = 1;
/// `reason`: the host cannot be reached.
pub const FASTUDP_UNREACHABLE_HOST: u32 = 2;
/// `reason`: the network cannot be reached.
pub const FASTUDP_UNREACHABLE_NETWORK: u32 = 3;
/// `reason`: a firewall refused it.
pub const FASTUDP_UNREACHABLE_PROHIBITED: u32 = 4;
/// `reason`: the hop limit ran out.
pub const FASTUDP_UNREACHABLE_TIME_EXCEEDED: u32 = 5;
/// `reason`: another ICMP type and code (`icmp_type`, `icmp_code`).
pub const FASTUDP_UNREACHABLE_OTHER: u32 = 6;

/// Bytes of `fastudp_socket_error::description` and
/// `fastudp_fallback_event::reason`, with the terminating NUL.
pub const FASTUDP_TEXT_LEN: usize = 256;

/// One message from the socket's error queue (ICMP errors, departure-time
/// drops, zerocopy completions), written by `fastudp_recv_error`. Fields
/// that do not apply to its `kind` are 0.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fastudp_socket_error {
    /// `FASTUDP_SOCKET_ERROR_*`.
    pub kind: u32,
    /// The destination of the datagram the error is about.
    pub destination: sockaddr_storage,
    /// The size of the address in `destination`; 0 when unknown.
    pub destination_len: socklen_t,
    /// The host that sent the ICMP message (port 0).
    pub reporter: sockaddr_storage,
    /// The size of the address in `reporter`; 0 when unknown or local.
    pub reporter_len: socklen_t,
    /// The errno the kernel gives it (`ECONNREFUSED`, `EMSGSIZE`, ...).
    pub error_number: i32,
    /// Unreachable: `FASTUDP_UNREACHABLE_*`.
    pub reason: u32,
    /// Unreachable (other) and other kinds: the ICMP type.
    pub icmp_type: u8,
    /// Unreachable (other) and other kinds: the ICMP code.
    pub icmp_code: u8,
    /// Other kinds: `ee_origin`.
    pub origin: u8,
    /// Packet too big: the MTU the reporter gave.
    pub mtu: u32,
    /// Packet too big: this host's own stack refused it.
    pub local: bool,
    /// Txtime: the departure time the packet had, in ns.
    pub departure_ns: u64,
    /// Txtime: an invalid time (else a time already missed).
    pub invalid: bool,
    /// Zerocopy: the first completed send.
    pub zerocopy_lo: u32,
    /// Zerocopy: the last completed send (inclusive).
    pub zerocopy_hi: u32,
    /// Zerocopy: the kernel copied the data anyway.
    pub copied: bool,
    /// Other kinds: `ee_info`.
    pub info: u32,
    /// Other kinds: `ee_data`.
    pub data: u32,
    /// The error as a sentence, NUL-terminated (cut to fit).
    pub description: [c_char; FASTUDP_TEXT_LEN],
}

/// Copies `s` into a NUL-terminated C text buffer, cut at a character
/// boundary to fit.
pub fn fill_text(out: &mut [c_char; FASTUDP_TEXT_LEN], s: &str) {
    let mut n = s.len().min(FASTUDP_TEXT_LEN - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (o, &b) in out.iter_mut().zip(&s.as_bytes()[..n]) {
        *o = b as c_char;
    }
    out[n..].fill(0);
}

impl fastudp_socket_error {
    /// A C error with the fields of `e` that are not addresses; the
    /// addresses are left empty for [`crate::abi`] to write.
    pub fn scalars(e: &fastudp_io::SocketError) -> fastudp_socket_error {
        use fastudp_tools::wire::errqueue::{SocketError as S, Unreachable as U};
        let mut out = fastudp_socket_error {
            kind: FASTUDP_SOCKET_ERROR_OTHER,
            destination: empty_storage(),
            destination_len: 0,
            reporter: empty_storage(),
            reporter_len: 0,
            error_number: 0,
            reason: 0,
            icmp_type: 0,
            icmp_code: 0,
            origin: 0,
            mtu: 0,
            local: false,
            departure_ns: 0,
            invalid: false,
            zerocopy_lo: 0,
            zerocopy_hi: 0,
            copied: false,
            info: 0,
            data: 0,
            description: [0; FASTUDP_TEXT_LEN],
        };
        fill_text(&mut out.description, &e.to_string());
        match detail(e) {
            S::Unreachable { reason, errno, .. } => {
                out.kind = FASTUDP_SOCKET_ERROR_UNREACHABLE;
                out.error_number = errno;
                out.reason = match reason {
                    U::Port => FASTUDP_UNREACHABLE_PORT,
                    U::Host => FASTUDP_UNREACHABLE_HOST,
                    U::Network => FASTUDP_UNREACHABLE_NETWORK,
                    U::Prohibited => FASTUDP_UNREACHABLE_PROHIBITED,
                    U::TimeExceeded => FASTUDP_UNREACHABLE_TIME_EXCEEDED,
                    U::Other { kind, code } => {
                        out.icmp_type = kind;
                        out.icmp_code = code;
                        FASTUDP_UNREACHABLE_OTHER
                    }
                };
            }
            S::PacketTooBig { mtu, local, .. } => {
                out.kind = FASTUDP_SOCKET_ERROR_PACKET_TOO_BIG;
                out.error_number = libc::EMSGSIZE;
                out.mtu = mtu;
                out.local = local;
            }
            S::Txtime {
                departure_ns,
                invalid,
                errno,
            } => {
                out.kind = FASTUDP_SOCKET_ERROR_TXTIME;
                out.departure_ns = departure_ns;
                out.invalid = invalid;
                out.error_number = errno;
            }
            S::ZeroCopy { lo, hi, copied } => {
                out.kind = FASTUDP_SOCKET_ERROR_ZEROCOPY;
                out.zerocopy_lo = lo;
                out.zerocopy_hi = hi;
                out.copied = copied;
            }
            S::Other {
                errno,
                origin,
                kind,
                code,
                info,
                data,
                ..
            } => {
                out.error_number = errno;
                out.origin = origin;
                out.icmp_type = kind;
                out.icmp_code = code;
                out.info = info;
                out.data = data;
            }
        }
        out
    }
}

/// The error decoded in full, from what the library reports (the kernel's
/// fields and the addresses), by the library's own decoder
/// (`wire::errqueue`, which `fastudp-tools` compiles from the same source).
fn detail(e: &fastudp_io::SocketError) -> fastudp_tools::wire::errqueue::SocketError {
    let (errno, origin, kind, code, info, data) = e.raw();
    fastudp_tools::wire::errqueue::Message {
        errno,
        origin,
        kind,
        code,
        info,
        data,
        destination: e.destination(),
        offender: e.reporter(),
    }
    .decode()
}

/// The address an error is about (destination) and the reporter's, for
/// [`crate::abi`] to write.
pub fn error_addresses(
    e: &fastudp_io::SocketError,
) -> (Option<std::net::SocketAddr>, Option<std::net::IpAddr>) {
    (e.destination(), e.reporter())
}

// -------------------------------------------------------------------- stats

/// Counters of one socket, written by `fastudp_socket_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fastudp_stats {
    /// `sendmmsg`/`sendmsg` calls made.
    pub send_calls: u64,
    /// Messages the kernel accepted (a GSO train counts once).
    pub send_messages: u64,
    /// Receive calls that returned data.
    pub recv_calls: u64,
    /// Messages received (a GRO train counts once).
    pub recv_messages: u64,
    /// Datagrams resent one by one after a GSO send failed.
    pub resent_unsegmented: u64,
    /// Messages received with `MSG_TRUNC`.
    pub truncated: u64,
    /// Messages received with `MSG_CTRUNC`.
    pub control_truncated: u64,
    /// Messages received with an ECN mark.
    pub recv_ecn_marked: u64,
    /// Messages received marked CE.
    pub recv_ecn_ce: u64,
    /// The kernel's drop counter for the socket, in messages.
    pub kernel_drops: u64,
    /// Error-queue messages that interrupted a send or receive (read into
    /// the socket's queue for `fastudp_recv_error`).
    pub async_errors: u64,
    /// Error-queue messages dropped because the socket's queue was full.
    pub errors_lost: u64,
    /// Times GSO was tried again after a refusal.
    pub gso_retries: u64,
    /// Fallback events kept (features the socket turned off at run time,
    /// the most recent 32): read each with `fastudp_socket_fallback`.
    pub fallbacks: usize,
    /// Fallback events since the socket was made, including older ones no
    /// longer kept.
    pub fallbacks_total: u64,
    /// Datagrams a full local queue (qdisc) dropped instead of sending
    /// (`ENOBUFS`); each call reports its own in
    /// `fastudp_sent.dropped_locally`.
    pub dropped_locally: u64,
}

impl From<&fastudp_io::Stats> for fastudp_stats {
    fn from(s: &fastudp_io::Stats) -> Self {
        fastudp_stats {
            send_calls: s.send_calls,
            send_messages: s.send_messages,
            recv_calls: s.recv_calls,
            recv_messages: s.recv_messages,
            resent_unsegmented: s.resent_unsegmented,
            truncated: s.truncated,
            control_truncated: s.control_truncated,
            recv_ecn_marked: s.recv_ecn_marked,
            recv_ecn_ce: s.recv_ecn_ce,
            kernel_drops: s.kernel_drops,
            async_errors: s.async_errors,
            errors_lost: s.errors_lost,
            gso_retries: s.gso_retries,
            fallbacks: s.fallbacks.len(),
            fallbacks_total: s.fallbacks_total,
            dropped_locally: s.dropped_locally,
        }
    }
}

/// A feature the socket turned off at run time, and why.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct fastudp_fallback_event {
    /// The `FASTUDP_FEATURE_*` bit of the feature.
    pub feature: u32,
    /// The errno that caused it, 0 when none.
    pub error_number: i32,
    /// A sentence for people, NUL-terminated (cut to fit).
    pub reason: [c_char; FASTUDP_TEXT_LEN],
}

impl From<&fastudp_io::FallbackEvent> for fastudp_fallback_event {
    fn from(e: &fastudp_io::FallbackEvent) -> Self {
        let mut out = fastudp_fallback_event {
            feature: feature_bit(e.feature),
            error_number: e.errno.unwrap_or(0),
            reason: [0; FASTUDP_TEXT_LEN],
        };
        fill_text(&mut out.reason, &e.reason);
        out
    }
}

// ------------------------------------------------------------- last error

/// The last error on the calling thread, from `fastudp_last_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fastudp_error_info {
    /// Its code; `FASTUDP_OK` when no call on this thread has failed.
    pub code: i32,
    /// The errno behind it, 0 when none.
    pub error_number: i32,
    /// True when the error is about one transmit (or, from the coalescer,
    /// one pushed datagram).
    pub has_index: bool,
    /// The index of that transmit in the array passed to `fastudp_send`
    /// (the datagram's number for the coalescer).
    pub index: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_masks_round_trip() {
        for mask in 0..=FASTUDP_FEATURE_ALL {
            let d = features_from_mask(mask);
            assert_eq!(mask_of(|f| d.contains(&f)), mask);
        }
        let d = fastudp_io::Feature::parse_list("gso,txtime").unwrap();
        assert_eq!(
            mask_of(|f| d.contains(&f)),
            FASTUDP_FEATURE_GSO | FASTUDP_FEATURE_TXTIME
        );
        // A socket reports back the bits it was given.
        let c = fastudp_config {
            disabled: FASTUDP_FEATURE_GSO | FASTUDP_FEATURE_ECN,
            ..fastudp_config::default()
        };
        let s = fastudp_io::Socket::bind("127.0.0.1:0".parse().unwrap(), c.to_config().unwrap())
            .unwrap();
        let caps = fastudp_capabilities::from(s.capabilities());
        assert_eq!(caps.disabled, FASTUDP_FEATURE_GSO | FASTUDP_FEATURE_ECN);
        assert!(caps.max_gso_segments == 1 && !caps.ecn);
    }

    #[test]
    fn default_config_is_the_library_default_and_bad_bits_are_refused() {
        let c = fastudp_config::default();
        assert!(c.gro && !c.may_fragment);
        assert_eq!(c.disabled, 0);
        // Every setting, split wait and GSO retry included, as the
        // library's default configuration has it.
        assert_eq!(
            format!("{:?}", c.to_config().unwrap()),
            format!("{:?}", fastudp_io::Config::default())
        );
        let bad = fastudp_config {
            disabled: 1 << 20,
            ..c
        };
        let e = bad.to_config().unwrap_err();
        assert!(matches!(e, Failure::Invalid(_)), "{e:?}");
        assert!(
            e.to_string().contains("unknown feature bits 0x100000"),
            "{e}"
        );
    }

    #[test]
    fn ecn_values_are_the_ip_header_bits() {
        assert_eq!(ecn_from_c(FASTUDP_ECN_NONE).unwrap(), None);
        assert_eq!(
            ecn_from_c(FASTUDP_ECN_ECT0).unwrap(),
            Some(fastudp_io::EcnCodepoint::Ect0)
        );
        assert_eq!(
            ecn_from_c(FASTUDP_ECN_CE).unwrap(),
            Some(fastudp_io::EcnCodepoint::Ce)
        );
        assert_eq!(
            ecn_to_c(Some(fastudp_io::EcnCodepoint::Ect1)),
            FASTUDP_ECN_ECT1
        );
        let e = ecn_from_c(4).unwrap_err();
        assert!(matches!(e, Failure::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("not 0 to 3"), "{e}");
    }

    #[test]
    fn text_is_cut_at_a_character_boundary_and_terminated() {
        let mut out = [-1 as c_char; FASTUDP_TEXT_LEN];
        let long = "é".repeat(200); // 400 bytes
        fill_text(&mut out, &long);
        let bytes: Vec<u8> = out.iter().map(|&c| c as u8).collect();
        let end = bytes.iter().position(|&b| b == 0).unwrap();
        assert!(end < FASTUDP_TEXT_LEN);
        assert!(std::str::from_utf8(&bytes[..end]).is_ok());
        assert_eq!(end % 2, 0, "no half character");
        fill_text(&mut out, "short");
        let bytes: Vec<u8> = out.iter().map(|&c| c as u8).collect();
        assert_eq!(&bytes[..6], b"short\0");
    }
}
