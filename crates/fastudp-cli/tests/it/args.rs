//! Rules every subcommand shares: a negative value is refused by the
//! option's own check, in one line, with exit status 2.

use crate::common;

use common::fastudp;

#[test]
fn negative_values_are_refused_in_one_line_naming_the_option() {
    for (args, opt) in [
        (vec!["bench", "--payload", "-1"], "--payload"),
        (vec!["bench", "--batch", "-5"], "--batch"),
        (vec!["bench", "--repeat", "-1"], "--repeat"),
        (vec!["bench", "--duration", "-1"], "--duration"),
        (vec!["stream", "--flows", "-1"], "--flows"),
        (vec!["stream", "--port", "-1"], "--port"),
        (vec!["stream", "--rate", "-1k"], "--rate"),
        (vec!["stream", "--total-rate", "-5M"], "--total-rate"),
        (vec!["stream", "--interval", "-8"], "--interval"),
        (vec!["stream-rx", "--sockets", "-2"], "--sockets"),
        (vec!["stream-rx", "--idle", "-1"], "--idle"),
        (vec!["doctor", "--watch", "-1"], "--watch"),
        (vec!["tx", "-D", "127.0.0.1", "-s", "-1"], "-s"),
        (vec!["rx", "-p", "-1"], "-p"),
    ] {
        let o = fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(opt) && err.contains('-'), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(err.starts_with("fastudp: error: "), "{args:?}: {err}");
    }
}

/// The address, rate and output-file checks the commands share are usage
/// errors: status 2, one line, nothing run.
#[test]
fn shared_checks_are_usage_errors_in_one_line() {
    for (args, line) in [
        (
            vec!["tx", "-D", "::1", "-4"],
            "-D ::1 is not an IPv4 address",
        ),
        (
            vec!["rx", "--logfile", "/"],
            "--logfile /: is a directory; give a file name",
        ),
        (
            vec!["stream", "--rate", "fast"],
            "--rate fast: \"fast\" is not a rate in bytes per second (like 125000, 125k, 1M)",
        ),
        (
            vec!["stream-rx", "--per-flow", "/nonexistent-dir/f.csv"],
            "--per-flow /nonexistent-dir/f.csv: cannot write there: No such file or directory (os error 2)",
        ),
    ] {
        let o = fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err, format!("fastudp: error: {line}\n"), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}: nothing runs");
    }
}

/// The installed command has none of the lab's commands (they are
/// `fastudp-lab`'s): not in the help, and not to be run.
#[test]
fn the_lab_is_not_in_the_command() {
    let help = String::from_utf8_lossy(&fastudp(&["--help"]).stdout).to_string();
    assert!(help.contains("bench") && help.contains("quic"), "{help}");
    for lab in ["soak", "attack", "figure"] {
        assert!(!help.contains(lab), "{lab}: {help}");
    }
    for args in [
        vec!["soak"],
        vec!["quic", "attack", "version", "127.0.0.1:4433"],
        vec!["bench", "--figure", "1"],
    ] {
        let o = fastudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("unrecognized subcommand") || err.contains("unexpected argument"),
            "{args:?}: {err}"
        );
    }
}

/// Rates print in one style everywhere: "Gbit/s", "Mbit/s", "kbit/s",
/// "bit/s" (as the table, `tx`, `rx`, `stream` and `quic` print them), never
/// iperf3's "Gbits/sec" nor "Mbps" or "Gb/s" next to them. Checked on the
/// text every command prints: the string literals of the CLI's sources.
#[test]
fn rates_print_in_one_unit_style() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read the source directory") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "{files:?}");
    let other = [
        "bits/sec",
        "Bytes/sec",
        "Gbps",
        "Mbps",
        "Kbps",
        "kbps",
        "Gb/s",
        "Mb/s",
        "Kbit/s",
    ];
    let mut bad = Vec::new();
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read a source file");
        for (i, line) in text.lines().enumerate() {
            seen += line.matches("Gbit/s").count();
            for o in other {
                if line.contains(o) {
                    bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "another unit style:\n{}", bad.join("\n"));
    assert!(seen > 5, "the check found no rate at all ({seen})");
}
