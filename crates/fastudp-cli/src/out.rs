//! Where the program's output lines go: standard output, or the file of
//! `--logfile` (appended to, as iperf3 does).

use std::fmt;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

static LOG: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// Sends every later output line to `path` (appended; created if missing,
/// never through a symbolic link at `path`).
pub fn to_file(opt: &str, path: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    crate::output::check_output_path(opt, path)?;
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{opt} {path}: cannot write there: {e}"))?;
    LOG.set(Mutex::new(f))
        .map_err(|_| format!("{opt}: output already goes to a file"))
}

/// Writes one line to the output.
pub fn line(args: fmt::Arguments<'_>) -> std::io::Result<()> {
    match LOG.get() {
        Some(f) => {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            writeln!(f, "{args}")
        }
        None => writeln!(std::io::stdout(), "{args}"),
    }
}
