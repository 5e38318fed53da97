//! Errors and fallback events.

use crate::wire::cmsg::CmsgError;
use std::io;
use std::net::SocketAddr;

/// A feature the socket can turn off at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// UDP generic segmentation offload.
    Gso,
    /// ECN marks on send.
    Ecn,
    /// MSG_ZEROCOPY.
    Zerocopy,
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::Gso => "gso",
            Feature::Ecn => "ecn",
            Feature::Zerocopy => "zerocopy",
        })
    }
}

/// A feature the socket turned off, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackEvent {
    /// What was turned off.
    pub feature: Feature,
    /// The errno that caused it, if any.
    pub errno: Option<i32>,
    /// A sentence for people.
    pub reason: String,
}

/// Errors from fastudp.
#[derive(Debug, thiserror::Error)]
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
    /// An address of the wrong family for this socket.
    #[error("transmit {index}: {destination} is an IPv6 address but the socket is IPv4 (bind to [::] for dual stack)")]
    AddressFamily {
        /// Index of the transmit in the batch.
        index: usize,
        /// The destination.
        destination: SocketAddr,
    },
    /// After GSO was turned off, a train's datagrams could only be sent in
    /// part: `transmit[index]`'s first `sent` datagrams went out.
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
    /// Control data could not be encoded.
    #[error("control message: {0}")]
    Control(#[from] CmsgError),
    /// A bad setting, such as an unknown name in `FASTUDP_DISABLE`.
    #[error("{0}")]
    Config(String),
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

    /// Shifts the transmit index by `offset` (for errors found in a suffix
    /// of a batch).
    pub(crate) fn at(mut self, offset: usize) -> Self {
        match &mut self {
            Error::PayloadTooLarge { index, .. }
            | Error::TooManySegments { index, .. }
            | Error::ZeroSegmentSize { index }
            | Error::SegmentExceedsMtu { index, .. }
            | Error::AddressFamily { index, .. }
            | Error::PartialTrain { index, .. } => *index += offset,
            _ => {}
        }
        self
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}
