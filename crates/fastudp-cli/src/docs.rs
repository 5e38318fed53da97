//! `fastudp completions SHELL` and `fastudp man`: the shell completion
//! scripts (clap_complete) and the manual pages (clap_mangen), made from
//! the command's own definition, so that they never fall behind it. The
//! Debian package installs both (scripts/deb.sh).

use anyhow::Context;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// `fastudp completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `fastudp man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write a page per command (fastudp.1, fastudp-quic-serve.1, ...)
    /// into this directory, made if missing, instead of printing
    /// fastudp.1.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Prints `a.shell`'s completion script for `cmd` on standard output.
pub fn completions(mut cmd: clap::Command, a: &CompletionsArgs) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "fastudp", &mut buf);
    let mut out = std::io::stdout().lock();
    out.write_all(&buf)?;
    out.flush()?;
    Ok(())
}

/// Prints the manual page of `cmd` (roff) on standard output, or, with
/// `--dir`, writes one per command and subcommand there and lists them.
pub fn man(cmd: clap::Command, a: &ManArgs) -> anyhow::Result<()> {
    match &a.dir {
        None => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut buf)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&buf)?;
            out.flush()?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot make {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write the manual pages in {}", dir.display()))?;
            let mut pages: Vec<String> = std::fs::read_dir(dir)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("fastudp") && n.ends_with(".1"))
                .collect();
            pages.sort();
            let mut out = std::io::stdout().lock();
            for p in pages {
                writeln!(out, "{}", dir.join(p).display())?;
            }
            out.flush()?;
        }
    }
    Ok(())
}
