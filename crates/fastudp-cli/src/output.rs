//! Writing results: standard output that may fail (a full disk), and
//! output files checked before a run.

/// Prints a line to standard output (or the file of `--logfile`) like
/// `println!`, but a failed write (a full disk, say) ends the program with
/// a clear message and status 1 instead of a panic message. The stack
/// still unwinds, so guards such as the testbed's clean up. (A closed pipe
/// ends it by SIGPIPE, as for any Unix tool.)
macro_rules! outln {
    () => {
        outln!("")
    };
    ($($t:tt)*) => {{
        if let Err(e) = $crate::out::line(format_args!($($t)*)) {
            $crate::output::stdout_failed(e)
        }
    }};
}

/// Checks before a run that `path` (the value of option `opt`) can be
/// written, so that a bad path is an error up front rather than after the
/// run, with its results lost. Only a regular file (or a path where none
/// exists yet) is probed by opening it; a file the probe creates is removed
/// again. FIFOs, devices and symbolic links are left as they are.
pub fn check_output_path(opt: &str, path: &str) -> Result<(), String> {
    let p = std::path::Path::new(path);
    if path.is_empty() {
        return Err(format!("{opt}: give a file name"));
    }
    if p.is_dir() {
        return Err(format!("{opt} {path}: is a directory; give a file name"));
    }
    match p.symlink_metadata() {
        Ok(m) if m.is_file() => std::fs::OpenOptions::new()
            .append(true)
            .open(p)
            .map(drop)
            .map_err(|e| format!("{opt} {path}: cannot write there: {e}")),
        Ok(_) => Ok(()),
        Err(_) => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map_err(|e| format!("{opt} {path}: cannot write there: {e}"))?;
            let _ = std::fs::remove_file(p);
            Ok(())
        }
    }
}

/// The unwinding payload of a failed write to standard output.
pub struct StdoutFailed(pub std::io::Error);

/// Ends the program after standard output failed: unwinds to `main`,
/// which says so and exits with status 1.
pub fn stdout_failed(e: std::io::Error) -> ! {
    std::panic::resume_unwind(Box::new(StdoutFailed(e)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn output_paths_are_checked_before_a_run() {
        let dir = std::env::temp_dir();
        let d = dir.to_str().unwrap();
        assert!(super::check_output_path("--x", d)
            .unwrap_err()
            .contains("is a directory"));
        assert!(super::check_output_path("--x", "").is_err());
        assert!(super::check_output_path("--x", "/nonexistent-dir/a.csv")
            .unwrap_err()
            .contains("cannot write there"));
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
