//! Ctrl-C (SIGINT): one handler for the whole program. The first Ctrl-C
//! sets a flag that every long-running loop checks, so that a command
//! stops, reports what it has done so far, says it was interrupted and
//! exits with status 130. A second Ctrl-C stops at once, after the
//! clean-ups registered with [`at_forced_exit`].
//!
//! A server run as a service ([`watch_service`], `quic serve`) also takes
//! SIGTERM as the first Ctrl-C (a second one stops at once, status 143),
//! and SIGHUP as a call of its own (a reload).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, Once};

/// The exit status of an interrupted command (128 + SIGINT, as a shell
/// reports a program that SIGINT ended).
pub const EXIT_STATUS: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static TERMINATED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
static CLEANUPS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Installs the handler (once; later calls do nothing).
pub fn watch() {
    INSTALL.call_once(|| {
        let r = ctrlc::set_handler(|| {
            if REQUESTED.swap(true, Relaxed) {
                eprintln!("fastudp: interrupted again; stopping now");
                forced_exit(EXIT_STATUS);
            }
        });
        if let Err(e) = r {
            eprintln!("fastudp: warning: Ctrl-C will end the run without its summary: {e}");
        }
    });
}

/// Runs the registered clean-ups and exits with `status`.
fn forced_exit(status: u8) -> ! {
    let fs: Vec<fn()> = CLEANUPS.lock().map(|v| v.clone()).unwrap_or_default();
    for f in fs {
        f();
    }
    std::process::exit(status.into())
}

/// The exit status of a server that a second SIGTERM stopped at once
/// (128 + SIGTERM).
pub const TERMINATED_STATUS: u8 = 143;

/// For a server run as a service: SIGTERM asks it to stop as Ctrl-C does
/// ([`requested`] then says so, and [`terminated`] that it was SIGTERM),
/// a second SIGTERM (or Ctrl-C) stops it at once; SIGHUP calls
/// `on_hangup`, on a thread of its own. Installs [`watch`] too. Once per
/// process; an error says why the signals could not be taken.
pub fn watch_service(on_hangup: impl Fn() + Send + 'static) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGTERM};
    watch();
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("fastudp-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGHUP {
                    on_hangup();
                    continue;
                }
                TERMINATED.store(true, Relaxed);
                if REQUESTED.swap(true, Relaxed) {
                    eprintln!("fastudp: terminated again; stopping now");
                    forced_exit(TERMINATED_STATUS);
                }
            }
        })?;
    Ok(())
}

/// Whether SIGTERM asked the command to stop ([`watch_service`]).
pub fn terminated() -> bool {
    TERMINATED.load(Relaxed)
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Relaxed)
}

/// Registers `f` to run if a second Ctrl-C ends the program at once (the
/// first one leaves the clean-up to the command's own unwinding).
pub fn at_forced_exit(f: fn()) {
    if let Ok(mut v) = CLEANUPS.lock() {
        v.push(f);
    }
}

/// The error an interrupted command returns after its report: status 130
/// (see [`crate::failure`]), and `what` says what was reported.
pub fn interrupted(what: &str) -> anyhow::Error {
    anyhow::Error::new(crate::failure::Interrupted(what.to_string()))
}

/// The error of a command that Ctrl-C cut short after it printed its
/// summary: status 130, and a line saying what the summary covers.
pub fn summarized_err() -> anyhow::Error {
    interrupted("the summary above covers the run until then")
}
