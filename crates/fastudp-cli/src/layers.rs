//! The CLI's layering rule, checked on its own source: a command imports
//! the shared modules and the engine, never another command, and no shared
//! module imports a command (ARCHITECTURE.md, "The CLI").

use std::path::{Path, PathBuf};

/// The command modules: each is one subcommand (or a family of them) of
/// `lib.rs`. `testbed up`/`down` are two arms of `lib.rs` over the
/// shared `testbed` module, which `bench` runs on (and the lab's soak).
const COMMANDS: &[&str] = &[
    "bench",
    "txrx",
    "stream",
    "quic",
    "host::doctor",
    "host::tune",
    "docs",
];

/// The shared modules under the commands.
const SHARED: &[&str] = &[
    "engine",
    "args",
    "failure",
    "output",
    "interrupt",
    "procfs",
    "host",
    "testbed",
];

/// The command (or shared module) a module path belongs to: the longest
/// of `COMMANDS` and `SHARED` that is a prefix of it.
fn owner(path: &[String]) -> Option<String> {
    let joined = path.join("::");
    COMMANDS
        .iter()
        .chain(SHARED)
        .filter(|m| joined == **m || joined.starts_with(&format!("{m}::")))
        .max_by_key(|m| m.len())
        .map(|m| m.to_string())
}

/// The module path of a source file, relative to `src/`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// The module paths a source file names through `crate::` or `super::`,
/// resolved against the file's own module path; comments are skipped and
/// `crate::{a, b::c}` groups are opened.
fn named_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // A byte inside a multi-byte character (a `×` in a string) starts
        // no path.
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let (mut base, skip) = if word_start && rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if word_start && rest.starts_with("super::") {
            let mut base = module.to_vec();
            let mut n = 0;
            while code[i + n..].starts_with("super::") {
                base.pop();
                n += "super::".len();
            }
            (base, n)
        } else {
            i += 1;
            continue;
        };
        i += skip;
        let tail = &code[i..];
        if let Some(group) = tail.strip_prefix('{') {
            // Up to the matching brace; each item's leading path.
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(k, _)| k);
            for item in group[..end].split(',') {
                let p = leading_path(item.trim());
                if !p.is_empty() && p[0] != "self" {
                    out.push(base.iter().cloned().chain(p).collect());
                }
            }
        } else {
            base.extend(leading_path(tail));
            out.push(base);
        }
    }
    out
}

/// The lowercase path segments at the start of `s` (`a::b::C` gives
/// `[a, b]`): module names, not the item.
fn leading_path(s: &str) -> Vec<String> {
    let mut v = Vec::new();
    for seg in s.split("::") {
        let name: String = seg
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            break;
        }
        v.push(name.clone());
        if name.len() != seg.len() {
            break;
        }
    }
    v
}

/// The rule's violations in one file: `file imports command` lines.
fn violations(rel: &Path, text: &str) -> Vec<String> {
    let module = module_of(rel);
    let Some(me) = owner(&module) else {
        return Vec::new();
    };
    let mut v: Vec<String> = named_paths(&module, text)
        .iter()
        .filter_map(|p| owner(p))
        .filter(|o| *o != me && COMMANDS.contains(&o.as_str()))
        .map(|o| format!("{} ({me}) imports the command {o}", rel.display()))
        .collect();
    v.dedup();
    v
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src/ is readable") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_command_imports_another_and_no_shared_module_imports_a_command() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut owned = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let text = std::fs::read_to_string(f).expect("readable source");
        if owner(&module_of(rel)).is_some() {
            owned += 1;
        }
        bad.extend(violations(rel, &text));
    }
    // Every module is either a command or shared, but lib.rs, main.rs and
    // this file.
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let m = module_of(rel);
        assert!(
            owner(&m).is_some() || m == ["lib"] || m == ["main"] || m == ["layers"],
            "{} is neither a command nor a shared module: add it to COMMANDS or SHARED",
            rel.display()
        );
    }
    assert!(
        owned > 40,
        "the scan found only {owned} files: it proved nothing"
    );
    assert!(bad.is_empty(), "layering violations:\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_each_way_of_naming_a_command() {
    let p = |s: &str| Path::new(s).to_path_buf();
    let cases = [
        ("stream/send.rs", "use crate::bench::tx::send_trains;"),
        ("stream/send.rs", "let n = crate::bench::name(t);"),
        (
            "quic/serve.rs",
            "use crate::{interrupt, stream::egress_qdisc};",
        ),
        ("host/doctor/mod.rs", "use super::tune::NAPI_DEFER;"),
        ("host/doctor/device.rs", "use super::super::tune::Plan;"),
        ("engine/tx.rs", "use crate::txrx::resolve_as;"),
        ("output.rs", "crate::quic::run(a)"),
    ];
    for (file, text) in cases {
        assert_eq!(violations(&p(file), text).len(), 1, "{file}: {text}");
    }
    let fine = [
        (
            "stream/send.rs",
            "use crate::engine::tx::send_trains; // crate::bench::x",
        ),
        (
            "host/doctor/mod.rs",
            "use super::devices::{is_device, up_devices};",
        ),
        ("host/doctor/kernel.rs", "use super::check::{check, Check};"),
        ("bench/report.rs", "use super::{plot, run_pair};"),
        ("txrx/mod.rs", "use crate::{interrupt, output};"),
    ];
    for (file, text) in fine {
        assert_eq!(
            violations(&p(file), text),
            Vec::<String>::new(),
            "{file}: {text}"
        );
    }
}
