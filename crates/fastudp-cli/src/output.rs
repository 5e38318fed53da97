//! Writing results: standard output (or the file of `--logfile`, appended
//! to, as iperf3 does) that may fail (a full disk, a closed pipe), and
//! output files checked before a run.

/// Prints a line to standard output (or the file of `--logfile`) like
/// `println!`, and evaluates to an `anyhow::Result<()>`: a failed write (a
/// full disk, say) is an error for the caller's `?`, with status 1; a
/// closed pipe is [`crate::failure::StdoutClosed`], which ends the program
/// quietly with status 0, as for any Unix tool.
#[macro_export]
macro_rules! out {
    () => {
        $crate::out!("")
    };
    ($($t:tt)*) => {
        $crate::output::line(format_args!($($t)*))
    };
}

// `usage!` is defined after this module: the function it calls instead.
use crate::failure::usage;
use std::fmt;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

static LOG: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// Sends every later output line to `path` (appended; created if missing,
/// never through a symbolic link at `path`). A path that cannot be
/// written is a usage error.
pub fn to_file(opt: &str, path: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    check_output_path(opt, path)?;
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| usage(format!("{opt} {path}: cannot write there: {e}")))?;
    LOG.set(Mutex::new(f))
        .map_err(|_| usage(format!("{opt}: output already goes to a file")))
}

/// Writes one line to the output.
pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    match LOG.get() {
        Some(f) => {
            let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
            writeln!(f, "{args}")
                .map_err(|e| anyhow::Error::new(e).context("cannot write to the log file"))
        }
        None => writeln!(std::io::stdout(), "{args}").map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                crate::failure::StdoutClosed.into()
            } else {
                anyhow::Error::new(e).context("cannot write to standard output")
            }
        }),
    }
}

/// Checks before a run that `path` (the value of option `opt`) can be
/// written, so that a bad path is an error up front rather than after the
/// run, with its results lost. Only a regular file (or a path where none
/// exists yet) is probed by opening it; a file the probe creates is removed
/// again. FIFOs, devices and symbolic links are left as they are. A path
/// that cannot be written is a usage error.
pub fn check_output_path(opt: &str, path: &str) -> anyhow::Result<()> {
    let p = std::path::Path::new(path);
    if path.is_empty() {
        return Err(usage(format!("{opt}: give a file name")));
    }
    if p.is_dir() {
        return Err(usage(format!(
            "{opt} {path}: is a directory; give a file name"
        )));
    }
    match p.symlink_metadata() {
        Ok(m) if m.is_file() => std::fs::OpenOptions::new()
            .append(true)
            .open(p)
            .map(drop)
            .map_err(|e| usage(format!("{opt} {path}: cannot write there: {e}"))),
        Ok(_) => Ok(()),
        Err(_) => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(|e| usage(format!("{opt} {path}: cannot write there: {e}")))?;
            let _ = std::fs::remove_file(p);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_paths_are_checked_before_a_run() {
        use crate::failure::exit_status;
        let dir = std::env::temp_dir();
        let d = dir.to_str().unwrap();
        let e = super::check_output_path("--x", d).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!("--x {d}: is a directory; give a file name")
        );
        assert_eq!(exit_status(&e), 2, "a usage error");
        let e = super::check_output_path("--x", "").unwrap_err();
        assert_eq!(exit_status(&e), 2);
        let e = super::check_output_path("--x", "/nonexistent-dir/a.csv").unwrap_err();
        assert!(format!("{e:#}").contains("cannot write there"), "{e:#}");
        assert_eq!(exit_status(&e), 2);
        let f = dir.join(format!("fastudp-check-{}.csv", std::process::id()));
        super::check_output_path("--x", f.to_str().unwrap()).unwrap();
        assert!(!f.exists(), "the check leaves no file behind");
        // A dangling symbolic link is left alone, not replaced or removed.
        let link = dir.join(format!("fastudp-link-{}.csv", std::process::id()));
        let target = dir.join(format!("fastudp-target-{}.csv", std::process::id()));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        super::check_output_path("--x", link.to_str().unwrap()).unwrap();
        assert!(link.symlink_metadata().is_ok() && !target.exists());
        let _ = std::fs::remove_file(&link);
        // An existing file keeps its contents.
        std::fs::write(&f, "keep").unwrap();
        super::check_output_path("--x", f.to_str().unwrap()).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep");
        let _ = std::fs::remove_file(&f);
    }
}
