//! `fastudp completions SHELL` and `fastudp man`: made from the command's
//! definition, they name every command and option, and the bash script is
//! valid bash.

use crate::common::fastudp;

/// The top-level commands, as `fastudp --help` lists them.
fn commands() -> Vec<String> {
    let o = fastudp(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut names = Vec::new();
    let mut inside = false;
    for l in help.lines() {
        if l.starts_with("Commands:") {
            inside = true;
            continue;
        }
        if inside {
            let Some(name) = l
                .strip_prefix("  ")
                .and_then(|r| r.split_whitespace().next())
            else {
                break;
            };
            if name != "help" {
                names.push(name.to_string());
            }
        }
    }
    assert!(names.len() >= 10, "{names:?} from {help}");
    names
}

#[test]
fn completions_name_every_command_in_every_shell() {
    let names = commands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = fastudp(&["completions", shell]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        for n in &names {
            assert!(out.contains(n.as_str()), "{shell}: {n} missing");
        }
        // A subcommand's option, two levels down.
        assert!(
            out.contains("max-connections"),
            "{shell}: quic serve's options missing"
        );
    }
}

#[test]
fn the_bash_completion_is_valid_bash_and_completes() {
    let o = fastudp(&["completions", "bash"]);
    assert!(o.status.success());
    let dir = std::env::temp_dir().join(format!("fastudp-compl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("fastudp.bash");
    std::fs::write(&script, &o.stdout).unwrap();
    // Source it and ask for the completions of `fastudp qu`.
    let r = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(fastudp qu); COMP_CWORD=1; COMP_LINE='fastudp qu'; \
             COMP_POINT=${{#COMP_LINE}}; _fastudp fastudp qu fastudp; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let Ok(r) = r else {
        crate::common::skip(
            "the_bash_completion_is_valid_bash_and_completes",
            "no bash here",
        );
        return;
    };
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(out.trim(), "quic", "{out}");
}

#[test]
fn an_unknown_shell_is_refused() {
    let o = fastudp(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tcsh") && err.contains("bash"), "{err}");
}

#[test]
fn the_manual_page_names_every_command() {
    let o = fastudp(&["man"]);
    assert!(o.status.success());
    let page = String::from_utf8_lossy(&o.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH fastudp 1"),
        "{page}"
    );
    assert!(page.contains(".TH fastudp 1"), "{page}");
    assert!(
        page.contains(env!("CARGO_PKG_VERSION")),
        "no version in the page"
    );
    for n in commands() {
        assert!(
            page.contains(&format!("fastudp\\-{}", n.replace('-', "\\-"))) || page.contains(&n),
            "{n} missing"
        );
    }
}

#[test]
fn man_dir_writes_a_page_per_command() {
    let dir = std::env::temp_dir().join(format!("fastudp-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = fastudp(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = String::from_utf8_lossy(&o.stdout).into_owned();
    let serve = std::fs::read_to_string(dir.join("fastudp-quic-serve.1"));
    let top = std::fs::read_to_string(dir.join("fastudp.1"));
    let n = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    let serve = serve.expect("fastudp-quic-serve.1");
    assert!(serve.contains("\\-\\-listen"), "{serve}");
    assert!(top.expect("fastudp.1").contains(".TH fastudp 1"));
    // One page per command of the tree, the nested ones included.
    for cmd in [
        "bench",
        "tx",
        "rx",
        "doctor",
        "tune",
        "stream",
        "stream-rx",
        "quic",
        "quic-serve",
        "quic-load",
        "quic-lb-rules",
        "testbed",
        "testbed-up",
        "testbed-down",
        "completions",
        "man",
    ] {
        assert!(
            listed
                .lines()
                .any(|l| l.ends_with(&format!("fastudp-{cmd}.1"))),
            "no page for {cmd}: {listed}"
        );
    }
    assert_eq!(n, 17, "pages: {listed}");
    assert_eq!(listed.lines().count(), n, "{listed}");
    assert!(listed.lines().all(|l| l.ends_with(".1")), "{listed}");
}

#[test]
fn man_dir_that_cannot_be_made_is_an_error() {
    let o = fastudp(&["man", "--dir", "/proc/fastudp-no/x"]);
    assert_eq!(o.status.code(), Some(1), "{:?}", o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot make /proc/fastudp-no/x"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
