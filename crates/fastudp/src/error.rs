//! Errors and fallback events.

use std::io;
use std::net::SocketAddr;

// `Feature` lives here, so that the errors about features need nothing
// from the module that parses their names (`caps`).

/// A feature of a socket: one [`crate::Config::disable`] switches off, one
/// [`crate::Capabilities::supports`] says the socket uses, and one fastudp
/// turns off at run time when the kernel or the path refuses it
/// ([`FallbackEvent`]). Its `Display` and `FromStr` use the names below
/// (lower case), and [`Feature::parse_list`] reads a list of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// `gso`: UDP generic segmentation offload on send.
    Gso,
    /// `gro`: UDP GRO (receive coalescing).
    Gro,
    /// `mmsg`: `sendmmsg`/`recvmmsg` batching (off: one message per
    /// syscall).
    Mmsg,
    /// `ecn`: ECN marks on send, and read on receive.
    Ecn,
    /// `pktinfo`: PKTINFO (destination address on receive, source on
    /// send).
    Pktinfo,
    /// `zerocopy`: `MSG_ZEROCOPY`.
    Zerocopy,
    /// `txtime`: `SO_TXTIME` departure times.
    Txtime,
    /// `rxq_ovfl`: the `SO_RXQ_OVFL` drop counter on received messages
    /// (off: [`crate::Stats::kernel_drops`] comes from `SO_MEMINFO` only).
    RxqOvfl,
    /// `recverr`: `IP_RECVERR`/`IPV6_RECVERR`, ICMP errors on the error
    /// queue (off: the kernel's default, where an unconnected socket
    /// never hears of them).
    Recverr,
    /// `dont_fragment`: don't-fragment on every datagram
    /// (`IP_PMTUDISC_PROBE`, `IPV6_DONTFRAG`); switching it off is
    /// [`crate::Config::may_fragment`].
    DontFragment,
    /// `uring`: the io_uring backend (feature `uring`); switching it off
    /// overrides [`crate::Config::uring`].
    #[cfg(feature = "uring")]
    #[cfg_attr(docsrs, doc(cfg(feature = "uring")))]
    Uring,
}

impl Feature {
    /// Every feature, in declaration order.
    pub(crate) const ALL: &'static [Feature] = &[
        Feature::Gso,
        Feature::Gro,
        Feature::Mmsg,
        Feature::Ecn,
        Feature::Pktinfo,
        Feature::Zerocopy,
        Feature::Txtime,
        Feature::RxqOvfl,
        Feature::Recverr,
        Feature::DontFragment,
        #[cfg(feature = "uring")]
        Feature::Uring,
    ];

    /// The feature's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Feature::Gso => "gso",
            Feature::Gro => "gro",
            Feature::Mmsg => "mmsg",
            Feature::Ecn => "ecn",
            Feature::Pktinfo => "pktinfo",
            Feature::Zerocopy => "zerocopy",
            Feature::Txtime => "txtime",
            Feature::RxqOvfl => "rxq_ovfl",
            Feature::Recverr => "recverr",
            Feature::DontFragment => "dont_fragment",
            #[cfg(feature = "uring")]
            Feature::Uring => "uring",
        }
    }
}

/// The names [`Feature::parse_list`] accepts, for error messages.
fn feature_names() -> String {
    let names: Vec<_> = Feature::ALL.iter().map(|f| f.name()).collect();
    names.join(", ")
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A buffer the allocator could not give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes")]
#[non_exhaustive]
pub struct AllocError {
    /// The size asked for.
    pub bytes: usize,
}

/// A feature the socket turned off, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FallbackEvent {
    /// What was turned off.
    pub feature: Feature,
    /// The errno that caused it, if any.
    pub errno: Option<i32>,
    /// A sentence for people.
    pub reason: String,
}

/// A setting or a call that cannot work as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An unknown name given to [`Feature::parse_list`] or `Feature`'s
    /// `FromStr`.
    #[error("unknown feature '{name}' (known: {known})", known = feature_names())]
    UnknownFeature {
        /// The name given.
        name: String,
    },
    /// A feature the call needs is switched off
    /// ([`crate::Config::disable`]).
    #[error("{0} is switched off (Config::disable)")]
    SwitchedOff(Feature),
    /// A transmit has a departure time, but `SO_TXTIME` is off.
    #[error(
        "transmit {index} has a departure time, but SO_TXTIME is off: call enable_txtime first"
    )]
    TxtimeOff {
        /// Index of the transmit in the batch.
        index: usize,
    },
    /// `SO_MAX_PACING_RATE` paces one peer: the socket must be connected.
    #[error("SO_MAX_PACING_RATE paces one peer: connect the socket first")]
    NotConnected,
    /// A pacing rate of 0 would stop the socket.
    #[error("a pacing rate of 0 bytes per second would stop the socket")]
    ZeroRate,
    /// A reuseport group of no sockets.
    #[error("a reuseport group needs at least one socket")]
    EmptyGroup,
    /// A payload steering offset the kernel's BPF would not read from the
    /// payload.
    #[error("steering offset {offset} is too large: the 4 bytes must lie within a UDP payload (offset at most {max})")]
    SteeringOffset {
        /// The offset given.
        offset: u32,
        /// The largest offset accepted.
        max: u32,
    },
}

/// Errors from fastudp.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A payload larger than one UDP send can carry.
    #[error("transmit {index}: payload of {len} bytes is larger than the UDP maximum of {max} bytes for this destination")]
    PayloadTooLarge {
        /// Index of the transmit in the batch.
        index: usize,
        /// Its length.
        len: usize,
        /// The maximum (65507 IPv4, 65527 IPv6).
        max: usize,
    },
    /// A train with more segments than the kernel allows in one send.
    #[error("transmit {index}: GSO train of {segments} segments is over the kernel limit of {max} segments per send")]
    TooManySegments {
        /// Index of the transmit in the batch.
        index: usize,
        /// Segments in the train.
        segments: usize,
        /// The kernel's limit (`UDP_MAX_SEGMENTS`).
        max: usize,
    },
    /// A segment size of zero.
    #[error("transmit {index}: segment size 0 is invalid")]
    ZeroSegmentSize {
        /// Index of the transmit in the batch.
        index: usize,
    },
    /// The kernel said EMSGSIZE to a GSO train: the segment does not fit the
    /// path MTU.
    #[error("transmit {index}: segment size {segment_size} does not fit the path MTU to {destination} (EMSGSIZE); a segment may carry at most the MTU minus 28 bytes on IPv4, 48 on IPv6")]
    SegmentExceedsMtu {
        /// Index of the transmit in the batch.
        index: usize,
        /// The segment size asked for.
        segment_size: usize,
        /// The destination.
        destination: SocketAddr,
    },
    /// The kernel said EMSGSIZE to a single datagram: it is larger than
    /// the path MTU, and don't-fragment is set (or it is over the local
    /// device's MTU).
    #[error("transmit {index}: datagram of {len} bytes to {destination} does not fit the path MTU (EMSGSIZE); it was not sent")]
    DatagramExceedsMtu {
        /// Index of the transmit in the batch.
        index: usize,
        /// Its length.
        len: usize,
        /// The destination.
        destination: SocketAddr,
    },
    /// An address of the wrong family for this socket:
    /// an IPv4 socket refuses every IPv6 address, v4-mapped ones included
    /// (send to the plain IPv4 address instead).
    #[error("transmit {index}: {destination} is an IPv6 address but the socket is IPv4 (bind to [::] for dual stack; for a v4-mapped address, send to the plain IPv4 one)")]
    AddressFamily {
        /// Index of the transmit in the batch.
        index: usize,
        /// The destination.
        destination: SocketAddr,
    },
    /// Memory for queueing the datagram could not be allocated (a
    /// [`crate::Coalescer`] under a memory limit): it was not queued.
    #[error("datagram {index}: {source}")]
    Alloc {
        /// The datagram's number.
        index: usize,
        /// What could not be allocated.
        source: AllocError,
    },
    /// A [`crate::ZeroCopySender`] train sent one datagram at a time (GSO
    /// off) went out in part: its first `sent` datagrams went out.
    #[error("transmit {index}: only {sent} of {segments} datagrams of the train went out one by one after GSO was turned off: {source}")]
    PartialTrain {
        /// Index of the transmit in the batch.
        index: usize,
        /// Datagrams sent.
        sent: usize,
        /// Datagrams in the train.
        segments: usize,
        /// What stopped the rest.
        source: io::Error,
    },
    /// Control data could not be encoded for a send (a source address of
    /// the other family than the destination: `InvalidInput`), or the
    /// kernel's could not be parsed (`InvalidData`).
    #[error("control message: {0}")]
    Control(io::Error),
    /// A bad setting, or a call that needs one.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Binding failed.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// A socket set-up step failed.
    #[error("socket set-up failed at {what}: {source}")]
    Setup {
        /// The step.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// A syscall failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    /// True for `EAGAIN`/`EWOULDBLOCK`: nothing was sent or received, try
    /// again when the socket is ready.
    pub fn is_would_block(&self) -> bool {
        matches!(self, Error::Io(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// The `io::ErrorKind` of an I/O error, if this is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io(e) | Error::PartialTrain { source: e, .. } => Some(e.kind()),
            _ => None,
        }
    }

    /// The index of the transmit this error is about, if it is about one.
    pub fn transmit_index(&self) -> Option<usize> {
        match self {
            Error::PayloadTooLarge { index, .. }
            | Error::TooManySegments { index, .. }
            | Error::ZeroSegmentSize { index }
            | Error::SegmentExceedsMtu { index, .. }
            | Error::DatagramExceedsMtu { index, .. }
            | Error::AddressFamily { index, .. }
            | Error::PartialTrain { index, .. }
            | Error::Alloc { index, .. } => Some(*index),
            Error::Config(ConfigError::TxtimeOff { index }) => Some(*index),
            _ => None,
        }
    }

    /// Shifts the transmit index by `offset` (for errors found in a suffix
    /// of a batch).
    pub(crate) fn at(mut self, offset: usize) -> Self {
        match &mut self {
            Error::PayloadTooLarge { index, .. }
            | Error::TooManySegments { index, .. }
            | Error::ZeroSegmentSize { index }
            | Error::SegmentExceedsMtu { index, .. }
            | Error::DatagramExceedsMtu { index, .. }
            | Error::AddressFamily { index, .. }
            | Error::PartialTrain { index, .. }
            | Error::Config(ConfigError::TxtimeOff { index }) => *index += offset,
            _ => {}
        }
        self
    }
}
