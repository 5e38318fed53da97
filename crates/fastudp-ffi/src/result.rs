//! Error codes, their names, and the per-thread last error behind
//! `fastudp_last_error`.
//!
//! Codes are plain integers, not a Rust enum: a C caller may pass any
//! `int` to `fastudp_strerror`, and an out-of-range value must be a name
//! ("unknown error code"), never undefined behaviour.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::CStr;
use std::io;

/// What a libfastudp function returns: `FASTUDP_OK` (0), or one of the
/// `FASTUDP_ERR_*` codes. Details of the last failure on the calling
/// thread: `fastudp_last_error`, `fastudp_last_error_message`.
pub type fastudp_result = i32;

/// Success.
pub const FASTUDP_OK: fastudp_result = 0;
/// A pointer the function needs was NULL.
pub const FASTUDP_ERR_NULL: fastudp_result = 1;
/// An argument is out of range: a length that does not match what it
/// describes, an address family other than IPv4/IPv6, an unknown flag or
/// value.
pub const FASTUDP_ERR_INVALID: fastudp_result = 2;
/// A bug inside libfastudp panicked; the panic was stopped at the boundary.
/// Objects the call was using may be in an inconsistent state: free them.
pub const FASTUDP_ERR_PANIC: fastudp_result = 3;
/// Nothing was sent or received: the non-blocking socket is not ready
/// (`EAGAIN`). Wait for readiness and call again.
pub const FASTUDP_ERR_WOULD_BLOCK: fastudp_result = 4;
/// A system call failed; `fastudp_last_error` gives the errno.
pub const FASTUDP_ERR_IO: fastudp_result = 5;
/// A payload is larger than one UDP send can carry (65507 bytes IPv4,
/// 65527 IPv6); nothing was sent. The last error names the transmit.
pub const FASTUDP_ERR_PAYLOAD_TOO_LARGE: fastudp_result = 6;
/// A GSO train has more segments than the kernel allows per send; nothing
/// was sent. The last error names the transmit.
pub const FASTUDP_ERR_TOO_MANY_SEGMENTS: fastudp_result = 7;
/// A transmit has a zero segment size. (A zero `segment_size` field in
/// `fastudp_transmit` means "one datagram", so this comes from the Rust
/// layer only.)
pub const FASTUDP_ERR_ZERO_SEGMENT_SIZE: fastudp_result = 8;
/// The kernel refused a GSO train whose segment does not fit the path MTU
/// (`EMSGSIZE`); nothing was sent from that transmit on.
pub const FASTUDP_ERR_SEGMENT_EXCEEDS_MTU: fastudp_result = 9;
/// A single datagram is larger than the path MTU and don't-fragment is on
/// (`EMSGSIZE`); it was not sent.
pub const FASTUDP_ERR_DATAGRAM_EXCEEDS_MTU: fastudp_result = 10;
/// An IPv6 destination on an IPv4 socket, a v4-mapped one
/// (`::ffff:a.b.c.d`) included: send to the plain IPv4 address, or bind
/// to `[::]` for dual stack. Nothing was sent.
pub const FASTUDP_ERR_ADDRESS_FAMILY: fastudp_result = 11;
/// Control data could not be encoded (such as an IPv6 source address for
/// an IPv4 destination).
pub const FASTUDP_ERR_CONTROL: fastudp_result = 12;
/// A setting cannot work as asked: a
/// departure time while `SO_TXTIME` is off, a feature switched off.
pub const FASTUDP_ERR_CONFIG: fastudp_result = 13;
/// Binding the address failed; `fastudp_last_error` gives the errno.
pub const FASTUDP_ERR_BIND: fastudp_result = 14;
/// A socket set-up step failed (a descriptor that is not an IP socket,
/// say); `fastudp_last_error` gives the errno.
pub const FASTUDP_ERR_SETUP: fastudp_result = 15;
/// An error of the Rust library this version of the C ABI does not name;
/// the message says what it is.
pub const FASTUDP_ERR_OTHER: fastudp_result = 16;
/// Memory for the object could not be allocated (a memory limit, or none
/// left); nothing was created, and the host program goes on.
pub const FASTUDP_ERR_NO_MEMORY: fastudp_result = 17;

/// The highest code in use (for tests of `fastudp_strerror`).
#[cfg(test)]
const LAST_CODE: fastudp_result = FASTUDP_ERR_NO_MEMORY;

/// The name of a code, as a sentence fragment: a static C string, so that
/// `fastudp_strerror` returns it as it is.
pub fn describe(code: fastudp_result) -> &'static CStr {
    match code {
        FASTUDP_OK => c"success",
        FASTUDP_ERR_NULL => c"a required pointer argument is NULL",
        FASTUDP_ERR_INVALID => c"invalid argument",
        FASTUDP_ERR_PANIC => c"internal error: libfastudp panicked (a bug; the call was stopped)",
        FASTUDP_ERR_WOULD_BLOCK => c"the socket is not ready (EAGAIN)",
        FASTUDP_ERR_IO => c"system call failed",
        FASTUDP_ERR_PAYLOAD_TOO_LARGE => c"payload larger than one UDP send can carry",
        FASTUDP_ERR_TOO_MANY_SEGMENTS => c"GSO train over the kernel's segment limit",
        FASTUDP_ERR_ZERO_SEGMENT_SIZE => c"segment size 0",
        FASTUDP_ERR_SEGMENT_EXCEEDS_MTU => c"GSO segment does not fit the path MTU",
        FASTUDP_ERR_DATAGRAM_EXCEEDS_MTU => c"datagram does not fit the path MTU",
        FASTUDP_ERR_ADDRESS_FAMILY => c"IPv6 destination on an IPv4 socket",
        FASTUDP_ERR_CONTROL => c"control message cannot be encoded",
        FASTUDP_ERR_CONFIG => c"setting or call not possible as configured",
        FASTUDP_ERR_BIND => c"cannot bind the address",
        FASTUDP_ERR_SETUP => c"socket set-up failed",
        FASTUDP_ERR_OTHER => c"other error",
        FASTUDP_ERR_NO_MEMORY => c"cannot allocate memory",
        _ => c"unknown error code",
    }
}

/// The code for a library error: one per [`fastudp_io::Reason`], matched
/// exhaustively (no wildcard), so a cause the library adds fails to
/// compile here instead of turning into `FASTUDP_ERR_OTHER` unnoticed.
/// The message's wording plays no part. `every_reason_has_its_code`
/// checks the table, `every_library_error_keeps_its_code` real errors.
pub fn code_of(e: &fastudp_io::Error) -> fastudp_result {
    code_of_reason(e.reason())
}

/// The code for each [`fastudp_io::Reason`].
fn code_of_reason(r: fastudp_io::Reason) -> fastudp_result {
    use fastudp_io::Reason as R;
    match r {
        R::PayloadTooLarge => FASTUDP_ERR_PAYLOAD_TOO_LARGE,
        R::TooManySegments => FASTUDP_ERR_TOO_MANY_SEGMENTS,
        R::ZeroSegmentSize => FASTUDP_ERR_ZERO_SEGMENT_SIZE,
        R::SegmentExceedsMtu => FASTUDP_ERR_SEGMENT_EXCEEDS_MTU,
        R::DatagramExceedsMtu => FASTUDP_ERR_DATAGRAM_EXCEEDS_MTU,
        R::AddressFamily => FASTUDP_ERR_ADDRESS_FAMILY,
        R::QueueMemory | R::NoMemory => FASTUDP_ERR_NO_MEMORY,
        // A zerocopy train sent in part: the C ABI has no zerocopy sender,
        // and no code of its own for it.
        R::PartialTrain => FASTUDP_ERR_OTHER,
        R::Control => FASTUDP_ERR_CONTROL,
        R::Config => FASTUDP_ERR_CONFIG,
        R::Bind => FASTUDP_ERR_BIND,
        R::Setup => FASTUDP_ERR_SETUP,
        R::WouldBlock => FASTUDP_ERR_WOULD_BLOCK,
        R::Io => FASTUDP_ERR_IO,
    }
}

/// The errno inside a library error, if it carries one.
fn errno_of(e: &fastudp_io::Error) -> i32 {
    if e.kind() == fastudp_io::ErrorKind::ExceedsPathMtu {
        return libc::EMSGSIZE;
    }
    e.io_error().and_then(io::Error::raw_os_error).unwrap_or(0)
}

/// Why a call failed, before it becomes a code. Its message is the
/// sentence [`last_message`] gives after the function's name.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A required pointer was NULL: the argument's name.
    #[error("argument '{0}' is NULL")]
    Null(&'static str),
    /// A bad argument, with a sentence.
    #[error("{0}")]
    Invalid(String),
    /// The Rust library's error.
    #[error("{0}")]
    Lib(fastudp_io::Error),
    /// A panic, with its message.
    #[error("internal error (a bug in libfastudp): panic: {0}")]
    Panic(String),
    /// An allocation failed, with a sentence.
    #[error("{0}")]
    NoMemory(String),
    /// A set-up step of this crate failed: the step, and why.
    #[error("socket set-up failed at {what}: {source}")]
    Setup {
        /// The step.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
}

impl From<fastudp_io::Error> for Failure {
    fn from(e: fastudp_io::Error) -> Self {
        Failure::Lib(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Lib(fastudp_io::Error::from(e))
    }
}

/// A shorthand for results inside the ABI functions.
pub type Res<T> = Result<T, Failure>;

/// The last failure on this thread, kept as it came: its message is
/// written only when asked for, so that a `WouldBlock` costs no
/// allocation.
struct Last {
    /// The function that failed.
    function: &'static str,
    /// Why.
    failure: Failure,
}

thread_local! {
    static LAST: RefCell<Option<Last>> = const { RefCell::new(None) };
}

/// Records a failure of `function` as this thread's last error and returns
/// its code.
pub fn record(function: &'static str, failure: Failure) -> fastudp_result {
    let code = match &failure {
        Failure::Null(_) => FASTUDP_ERR_NULL,
        Failure::Invalid(_) => FASTUDP_ERR_INVALID,
        Failure::Lib(e) => code_of(e),
        Failure::Panic(_) => FASTUDP_ERR_PANIC,
        Failure::NoMemory(_) => FASTUDP_ERR_NO_MEMORY,
        Failure::Setup { .. } => FASTUDP_ERR_SETUP,
    };
    // A destructor running during thread exit may find the slot gone: the
    // code is still returned.
    let _ = LAST.try_with(|l| *l.borrow_mut() = Some(Last { function, failure }));
    code
}

/// This thread's last error: code, errno (0 when none), transmit index.
pub fn last() -> Option<(fastudp_result, i32, Option<usize>)> {
    LAST.try_with(|l| {
        l.borrow().as_ref().map(|last| match &last.failure {
            Failure::Null(_) => (FASTUDP_ERR_NULL, 0, None),
            Failure::Invalid(_) => (FASTUDP_ERR_INVALID, 0, None),
            Failure::Panic(_) => (FASTUDP_ERR_PANIC, 0, None),
            Failure::NoMemory(_) => (FASTUDP_ERR_NO_MEMORY, libc::ENOMEM, None),
            Failure::Lib(e) => (code_of(e), errno_of(e), e.transmit_index()),
            Failure::Setup { source, .. } => {
                (FASTUDP_ERR_SETUP, source.raw_os_error().unwrap_or(0), None)
            }
        })
    })
    .ok()
    .flatten()
}

/// This thread's last error as a sentence, naming the function.
pub fn last_message() -> Option<String> {
    LAST.try_with(|l| {
        l.borrow()
            .as_ref()
            .map(|last| format!("{}: {}", last.function, last.failure))
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_name_and_unknown_codes_say_so() {
        let names: Vec<&CStr> = (0..=LAST_CODE).map(describe).collect();
        for (i, a) in names.iter().enumerate() {
            assert_ne!(*a, c"unknown error code", "code {i} is unnamed");
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(describe(-1), c"unknown error code");
        assert_eq!(describe(LAST_CODE + 1), c"unknown error code");
    }

    #[test]
    fn library_errors_map_to_codes_with_errno_and_index() {
        use fastudp_io::UdpIo;
        let e = fastudp_io::Error::from(io::Error::from_raw_os_error(libc::EAGAIN));
        assert_eq!(record("f", e.into()), FASTUDP_ERR_WOULD_BLOCK);
        assert_eq!(last(), Some((FASTUDP_ERR_WOULD_BLOCK, libc::EAGAIN, None)));

        let e = fastudp_io::Error::from(io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert_eq!(record("f", e.into()), FASTUDP_ERR_IO);
        assert_eq!(last(), Some((FASTUDP_ERR_IO, libc::ECONNREFUSED, None)));

        let s = fastudp_io::Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            fastudp_io::Config::default(),
        )
        .unwrap();
        let to = s.as_std().local_addr().unwrap();
        let big = vec![0u8; 70_000];
        let t = fastudp_io::Transmit::new(to, b"x");
        let e = s
            .send(&[t, t, fastudp_io::Transmit::new(to, &big)])
            .unwrap_err();
        assert_eq!(
            record("fastudp_send", e.into()),
            FASTUDP_ERR_PAYLOAD_TOO_LARGE
        );
        assert_eq!(last(), Some((FASTUDP_ERR_PAYLOAD_TOO_LARGE, 0, Some(2))));
        let m = last_message().unwrap();
        assert!(
            m.starts_with("fastudp_send: transmit 2: payload of 70000 bytes"),
            "{m}"
        );

        assert_eq!(record("g", Failure::Null("sock")), FASTUDP_ERR_NULL);
        assert_eq!(last_message().unwrap(), "g: argument 'sock' is NULL");
    }

    /// Every library error reachable without special privileges keeps
    /// the code, errno and transmit index it had when each was a variant
    /// of its own.
    #[test]
    fn every_reason_has_its_code() {
        use fastudp_io::Reason as R;
        let table = [
            (R::PayloadTooLarge, FASTUDP_ERR_PAYLOAD_TOO_LARGE),
            (R::TooManySegments, FASTUDP_ERR_TOO_MANY_SEGMENTS),
            (R::ZeroSegmentSize, FASTUDP_ERR_ZERO_SEGMENT_SIZE),
            (R::SegmentExceedsMtu, FASTUDP_ERR_SEGMENT_EXCEEDS_MTU),
            (R::DatagramExceedsMtu, FASTUDP_ERR_DATAGRAM_EXCEEDS_MTU),
            (R::AddressFamily, FASTUDP_ERR_ADDRESS_FAMILY),
            (R::QueueMemory, FASTUDP_ERR_NO_MEMORY),
            (R::NoMemory, FASTUDP_ERR_NO_MEMORY),
            (R::PartialTrain, FASTUDP_ERR_OTHER),
            (R::Control, FASTUDP_ERR_CONTROL),
            (R::Config, FASTUDP_ERR_CONFIG),
            (R::Bind, FASTUDP_ERR_BIND),
            (R::Setup, FASTUDP_ERR_SETUP),
            (R::WouldBlock, FASTUDP_ERR_WOULD_BLOCK),
            (R::Io, FASTUDP_ERR_IO),
        ];
        for (reason, code) in table {
            assert_eq!(code_of_reason(reason), code, "{reason:?}");
        }
        // Every code a library error can have is named by some reason,
        // apart from the FFI's own (NULL, INVALID, PANIC).
        for code in FASTUDP_ERR_WOULD_BLOCK..=LAST_CODE {
            assert!(
                table.iter().any(|&(_, c)| c == code),
                "code {code} is reached by no reason"
            );
        }
    }

    #[test]
    fn every_library_error_keeps_its_code() {
        use fastudp_io::{Socket, Transmit, UdpIo};
        let code = |e: fastudp_io::Error| {
            record("f", e.into());
            last().unwrap()
        };
        let v4 = Socket::bind(
            "127.0.0.1:0".parse().unwrap(),
            fastudp_io::Config::default(),
        )
        .unwrap();
        let to = v4.as_std().local_addr().unwrap();
        let x = Transmit::new(to, b"x");

        let e = v4.send(&[x, Transmit::train(to, b"xx", 0)]).unwrap_err();
        assert_eq!(code(e), (FASTUDP_ERR_ZERO_SEGMENT_SIZE, 0, Some(1)));

        let e = v4
            .send(&[Transmit::new("[::1]:9".parse().unwrap(), b"x")])
            .unwrap_err();
        assert_eq!(code(e), (FASTUDP_ERR_ADDRESS_FAMILY, 0, Some(0)));

        if v4.max_gso_segments() > 1 {
            let train = vec![0u8; 1000];
            let e = v4.send(&[x, Transmit::train(to, &train, 1)]).unwrap_err();
            assert_eq!(code(e), (FASTUDP_ERR_TOO_MANY_SEGMENTS, 0, Some(1)));
        }

        let e = Socket::bind(to, fastudp_io::Config::default()).unwrap_err();
        assert_eq!(code(e), (FASTUDP_ERR_BIND, libc::EADDRINUSE, None));

        let e = v4.set_max_pacing_rate(1 << 20).unwrap_err();
        assert_eq!(code(e), (FASTUDP_ERR_CONFIG, 0, None));

        let e = Failure::Setup {
            what: "SO_TYPE",
            source: io::Error::from_raw_os_error(libc::ENOTSOCK),
        };
        assert_eq!(record("g", e), FASTUDP_ERR_SETUP);
        assert_eq!(last(), Some((FASTUDP_ERR_SETUP, libc::ENOTSOCK, None)));
        assert_eq!(
            last_message().unwrap(),
            format!(
                "g: socket set-up failed at SO_TYPE: {}",
                io::Error::from_raw_os_error(libc::ENOTSOCK)
            )
        );
    }
}
