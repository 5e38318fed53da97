//! Ctrl-C (SIGINT): one handler for the whole program. The first Ctrl-C
//! sets a flag that every long-running loop checks, so that a command
//! stops, reports what it has done so far, says it was interrupted and
//! exits with status 130. A second Ctrl-C stops at once, after the
//! clean-ups registered with [`at_forced_exit`].

use crate::Failure;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, Once};

/// The exit status of an interrupted command (128 + SIGINT, as a shell
/// reports a program that SIGINT ended).
pub const EXIT_STATUS: u8 = 130;

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();
static CLEANUPS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Installs the handler (once; later calls do nothing).
pub fn watch() {
    INSTALL.call_once(|| {
        let r = ctrlc::set_handler(|| {
            if REQUESTED.swap(true, Relaxed) {
                eprintln!("fastudp: interrupted again; stopping now");
                forced_exit();
            }
        });
        if let Err(e) = r {
            eprintln!("fastudp: warning: Ctrl-C will end the run without its summary: {e}");
        }
    });
}

/// Runs the registered clean-ups and exits with [`EXIT_STATUS`].
fn forced_exit() -> ! {
    let fs: Vec<fn()> = CLEANUPS.lock().map(|v| v.clone()).unwrap_or_default();
    for f in fs {
        f();
    }
    std::process::exit(EXIT_STATUS.into())
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

/// The failure an interrupted command returns after its report: status
/// 130, and `what` says what was reported.
pub fn failure(what: &str) -> Failure {
    Failure {
        code: EXIT_STATUS,
        msg: format!("interrupted (Ctrl-C); {what}"),
    }
}

/// The failure of a command that Ctrl-C cut short after it printed its
/// summary: status 130, and a line saying what the summary covers.
#[allow(dead_code)]
pub fn summarized() -> Failure {
    failure("the summary above covers the run until then")
}
