//! A command's failure and its exit status, in the manner of ripgrep's
//! `main`: every command returns an [`anyhow::Error`]; `main` prints its
//! chain on one line and picks the status from what the chain holds:
//!
//! - [`Usage`] anywhere in the chain (bad input, an option this host or
//!   combination cannot honour, caught before a run): status 2;
//! - [`Interrupted`] (Ctrl-C, after the command reported what it had):
//!   status 130;
//! - [`StdoutClosed`] (the reader of standard output went away, as `head`
//!   does): status 0, and nothing printed, as ripgrep does;
//! - anything else (a run that broke off: a socket that failed, a peer
//!   that vanished, a file that could not be written): status 1.
//!
//! SIGPIPE stays ignored (Rust's default), so a write to a closed pipe or
//! a reset TCP peer is an `EPIPE` error, never the end of the process.
//!
//! A runtime failure is an ordinary error (`anyhow!`, `bail!`,
//! `.context(..)`); only usage errors are marked, with [`usage!`] or
//! [`bail_usage!`].

/// A usage error: bad input, caught before the run. Exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// A command that Ctrl-C cut short after it reported what it had. Exit
/// status 130 ([`crate::interrupt::EXIT_STATUS`]).
#[derive(Debug, thiserror::Error)]
#[error("interrupted (Ctrl-C); {0}")]
pub struct Interrupted(pub String);

/// Standard output was closed by its reader (`EPIPE`): the command ends
/// quietly, with status 0.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct StdoutClosed;

/// A usage error from a message: `usage!("--rate {v}: not a rate")`.
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => {
        ::anyhow::Error::new($crate::failure::Usage(format!($($t)*)))
    };
}

/// Returns a usage error from the enclosing function.
#[macro_export]
macro_rules! bail_usage {
    ($($t:tt)*) => {
        return Err($crate::usage!($($t)*).into())
    };
}

/// Turns a message (or an error's one line) into a usage error (for
/// `map_err`).
pub fn usage(msg: impl std::fmt::Display) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.to_string()))
}

/// The exit status for `e`: 2, 130 or 1 (see the module's documentation).
pub fn exit_status(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<StdoutClosed>()) {
        0
    } else if e.chain().any(|c| c.is::<Interrupted>()) {
        crate::interrupt::EXIT_STATUS
    } else if e.chain().any(|c| c.is::<Usage>()) {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn usage_anywhere_in_the_chain_is_2_interrupt_130_else_1() {
        assert_eq!(exit_status(&usage!("--rate x: not a rate")), 2);
        let wrapped = Err::<(), _>(usage("bad")).context("tx").unwrap_err();
        assert_eq!(exit_status(&wrapped), 2);
        assert_eq!(format!("{wrapped:#}"), "tx: bad");
        let int = anyhow::Error::new(Interrupted("summary above".into()));
        assert_eq!(exit_status(&int), 130);
        assert_eq!(int.to_string(), "interrupted (Ctrl-C); summary above");
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let runtime = Err::<(), _>(io).context("send").unwrap_err();
        assert_eq!(exit_status(&runtime), 1);
        assert_eq!(exit_status(&anyhow::anyhow!("cannot start a worker")), 1);
    }
}
