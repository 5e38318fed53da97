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

impl Detail {
    /// For a path-MTU refusal: the transmit's index, with the destination
    /// of a single datagram (`None` for a GSO train's segment).
    pub(crate) fn mtu_refusal(&self) -> Option<(usize, Option<SocketAddr>)> {
        match self {
            Detail::SegmentExceedsMtu { index, .. } => Some((*index, None)),
            Detail::DatagramExceedsMtu {
                index, destination, ..
            } => Some((*index, Some(*destination))),
            _ => None,
        }
    }
}

/// A buffer the allocator could not give ([`ErrorKind::OutOfMemory`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes")]
pub(crate) struct AllocError {
    /// The size asked for.
    pub(crate) bytes: usize,
}

/// A setting or a call that cannot work as asked ([`ErrorKind::Config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConfigError {
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
    /// A QUIC connection-ID steering byte past the longest connection ID.
    #[error("steering byte {index} of the QUIC connection ID: QUIC version 1's IDs are at most 20 bytes (index at most {max})")]
    SteeringCidIndex {
        /// The index given.
        index: u8,
        /// The largest index accepted.
        max: u8,
    },
}

/// What went wrong, in detail: the private side of [`Error`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum Detail {
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
        #[source]
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
    Control(#[source] io::Error),
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
    #[error("{0}")]
    Io(#[source] io::Error),
    /// A buffer the allocator could not give, outside a batch.
    #[error(transparent)]
    NoMemory(#[from] AllocError),
}

/// What kind of error an [`Error`] is: what a program branches on. The
/// details (sizes, addresses, the setting) are in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A transmit the socket cannot send as it is: a payload over the UDP
    /// maximum, a GSO train over the kernel's segment limit, a segment
    /// size of 0, a destination or source address of a family the socket
    /// cannot reach. Nothing was sent from [`Error::transmit_index`] on
    /// (the transmits before it went out): fix or drop that transmit and
    /// send the rest again. A bug in the caller, not a condition of the
    /// network.
    InvalidTransmit,
    /// The kernel refused a datagram, or a GSO train's segment size, as
    /// larger than the path MTU (`EMSGSIZE`). Nothing was sent from
    /// [`Error::transmit_index`] on: lower the datagram size (the path MTU
    /// shrank, or the probe was too large) and send it again.
    ExceedsPathMtu,
    /// A [`crate::ZeroCopySender`] train went out in part, one datagram at a
    /// time: [`Error::datagrams_sent`] of them went out, the rest did not.
    /// Send the rest again later; [`Error::io_error`] says what stopped them.
    PartialTrain,
    /// A setting, or a call that the socket's settings do not allow: a
    /// feature switched off, a departure time while `SO_TXTIME` is off, a
    /// pacing rate on an unconnected socket, an unknown feature name. Fix
    /// the configuration or the call; trying again does not help.
    Config,
    /// A system call failed: binding, a socket set-up step, a send or a
    /// receive, or the kernel's control data could not be read.
    /// [`Error::io_error`] gives the `io::Error` (its errno), the message
    /// says which step failed. [`Error::is_would_block`] is the one to
    /// retry after the socket is ready.
    Io,
    /// Memory could not be allocated (a memory limit, or none left):
    /// nothing was queued or created. Free memory, or use smaller
    /// buffers, and try again.
    OutOfMemory,
}

/// The exact cause of an [`Error`], one variant per message the library
/// writes: what the C ABI (`fastudp-ffi`) turns into its error codes,
/// matched exhaustively so that a new cause cannot fall through to
/// "other" unnoticed. Programs branch on [`ErrorKind`]; this enum is not
/// part of the stable API (hidden, and it may grow in any release).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A payload larger than one UDP send can carry.
    PayloadTooLarge,
    /// A GSO train over the kernel's segment limit.
    TooManySegments,
    /// A segment size of zero.
    ZeroSegmentSize,
    /// `EMSGSIZE` for a GSO train's segment.
    SegmentExceedsMtu,
    /// `EMSGSIZE` for a single datagram.
    DatagramExceedsMtu,
    /// A destination of the other address family.
    AddressFamily,
    /// A datagram's queue memory could not be allocated.
    QueueMemory,
    /// A zerocopy train went out in part.
    PartialTrain,
    /// Control data that could not be encoded or parsed.
    Control,
    /// A bad setting, or a call the settings do not allow.
    Config,
    /// Binding failed.
    Bind,
    /// A socket set-up step failed.
    Setup,
    /// The socket is not ready (`EAGAIN`).
    WouldBlock,
    /// Another failed system call.
    Io,
    /// A buffer could not be allocated outside a batch.
    NoMemory,
}

/// Errors from fastudp: an [`ErrorKind`] to branch on, the transmit it is
/// about ([`Error::transmit_index`]), the `io::Error` under it
/// ([`Error::io_error`], also `std::error::Error::source`), and a message
/// for people (`Display`).
#[derive(Debug)]
pub struct Error {
    /// The detail behind the kind.
    detail: Detail,
}

impl Error {
    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match &self.detail {
            Detail::PayloadTooLarge { .. }
            | Detail::TooManySegments { .. }
            | Detail::ZeroSegmentSize { .. }
            | Detail::AddressFamily { .. } => ErrorKind::InvalidTransmit,
            // A source address the destination's family cannot carry is
            // the caller's; control data the kernel sent is an I/O error.
            Detail::Control(e) if e.kind() == io::ErrorKind::InvalidInput => {
                ErrorKind::InvalidTransmit
            }
            Detail::SegmentExceedsMtu { .. } | Detail::DatagramExceedsMtu { .. } => {
                ErrorKind::ExceedsPathMtu
            }
            Detail::PartialTrain { .. } => ErrorKind::PartialTrain,
            Detail::Config(_) => ErrorKind::Config,
            Detail::Alloc { .. } | Detail::NoMemory(_) => ErrorKind::OutOfMemory,
            Detail::Control(_) | Detail::Bind { .. } | Detail::Setup { .. } | Detail::Io(_) => {
                ErrorKind::Io
            }
        }
    }

    /// The exact cause, for the C ABI's codes: see [`Reason`]. Hidden, not
    /// part of the stable API.
    #[doc(hidden)]
    pub fn reason(&self) -> Reason {
        match &self.detail {
            Detail::PayloadTooLarge { .. } => Reason::PayloadTooLarge,
            Detail::TooManySegments { .. } => Reason::TooManySegments,
            Detail::ZeroSegmentSize { .. } => Reason::ZeroSegmentSize,
            Detail::SegmentExceedsMtu { .. } => Reason::SegmentExceedsMtu,
            Detail::DatagramExceedsMtu { .. } => Reason::DatagramExceedsMtu,
            Detail::AddressFamily { .. } => Reason::AddressFamily,
            Detail::Alloc { .. } => Reason::QueueMemory,
            Detail::PartialTrain { .. } => Reason::PartialTrain,
            Detail::Control(_) => Reason::Control,
            Detail::Config(_) => Reason::Config,
            Detail::Bind { .. } => Reason::Bind,
            Detail::Setup { .. } => Reason::Setup,
            Detail::Io(e) if e.kind() == io::ErrorKind::WouldBlock => Reason::WouldBlock,
            Detail::Io(_) => Reason::Io,
            Detail::NoMemory(_) => Reason::NoMemory,
        }
    }

    /// True for `EAGAIN`/`EWOULDBLOCK`: nothing was sent or received, try
    /// again when the socket is ready.
    pub fn is_would_block(&self) -> bool {
        matches!(&self.detail, Detail::Io(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// The index of the transmit (in the batch given to the call) this
    /// error is about, if it is about one. For a [`crate::Coalescer`] it
    /// is the datagram's number.
    pub fn transmit_index(&self) -> Option<usize> {
        match &self.detail {
            Detail::PayloadTooLarge { index, .. }
            | Detail::TooManySegments { index, .. }
            | Detail::ZeroSegmentSize { index }
            | Detail::SegmentExceedsMtu { index, .. }
            | Detail::DatagramExceedsMtu { index, .. }
            | Detail::AddressFamily { index, .. }
            | Detail::PartialTrain { index, .. }
            | Detail::Alloc { index, .. } => Some(*index),
            Detail::Config(ConfigError::TxtimeOff { index }) => Some(*index),
            _ => None,
        }
    }

    /// For [`ErrorKind::PartialTrain`], how many datagrams of the train
    /// went out (its first ones); `None` for every other kind.
    pub fn datagrams_sent(&self) -> Option<usize> {
        match &self.detail {
            Detail::PartialTrain { sent, .. } => Some(*sent),
            _ => None,
        }
    }

    /// The `io::Error` under this error, if there is one (a failed system
    /// call, what stopped a partial train, control data that could not be
    /// encoded or read): its `kind()` and `raw_os_error()`. The same as
    /// `std::error::Error::source`, typed.
    pub fn io_error(&self) -> Option<&io::Error> {
        match &self.detail {
            Detail::Io(e)
            | Detail::Bind { source: e, .. }
            | Detail::Setup { source: e, .. }
            | Detail::PartialTrain { source: e, .. }
            | Detail::Control(e) => Some(e),
            _ => None,
        }
    }

    /// The detail, for the crate's own decisions.
    pub(crate) fn detail(&self) -> &Detail {
        &self.detail
    }

    /// Shifts the transmit index by `offset` (for errors found in a suffix
    /// of a batch).
    pub(crate) fn at(mut self, offset: usize) -> Self {
        match &mut self.detail {
            Detail::PayloadTooLarge { index, .. }
            | Detail::TooManySegments { index, .. }
            | Detail::ZeroSegmentSize { index }
            | Detail::SegmentExceedsMtu { index, .. }
            | Detail::DatagramExceedsMtu { index, .. }
            | Detail::AddressFamily { index, .. }
            | Detail::PartialTrain { index, .. }
            | Detail::Config(ConfigError::TxtimeOff { index }) => *index += offset,
            _ => {}
        }
        self
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.detail, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.detail)
    }
}

impl From<Detail> for Error {
    fn from(detail: Detail) -> Self {
        Error { detail }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Detail::Config(e).into()
    }
}

impl From<AllocError> for Error {
    fn from(e: AllocError) -> Self {
        Detail::NoMemory(e).into()
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Detail::Io(e).into()
    }
}

/// An I/O error stays itself; any other error becomes an `InvalidInput`
/// one with the same message.
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e.detail {
            Detail::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}
