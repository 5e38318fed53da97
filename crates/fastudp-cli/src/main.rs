//! The `fastudp` command: argument parsing and dispatch only (the
//! commands are the crate's library).

#![forbid(unsafe_code)]

use fastudp_cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    fastudp_cli::main("fastudp", |cli: Cli| fastudp_cli::run(cli.cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, ValueEnum};
    use fastudp_cli::{args, testbed};

    /// Every option that takes a value takes a negative number as its
    /// value: never "unexpected argument '-1'".
    #[test]
    fn every_option_with_a_value_takes_a_negative_number() {
        fn walk(cmd: &clap::Command, path: Vec<String>, checked: &mut usize) {
            for a in cmd.get_arguments() {
                if !a.get_action().takes_values() || a.is_positional() {
                    continue;
                }
                let flag = match (a.get_long(), a.get_short()) {
                    (Some(l), _) => format!("--{l}"),
                    (None, Some(s)) => format!("-{s}"),
                    _ => continue,
                };
                let mut argv = vec!["fastudp".to_string()];
                argv.extend(path.iter().cloned());
                argv.extend([flag.clone(), "-1".into()]);
                let cmd = args::allow_negative_numbers(Cli::command());
                if let Err(e) = cmd.try_get_matches_from(&argv) {
                    assert_ne!(
                        e.kind(),
                        clap::error::ErrorKind::UnknownArgument,
                        "{argv:?}: {e}"
                    );
                }
                *checked += 1;
            }
            for s in cmd.get_subcommands() {
                let mut p = path.clone();
                p.push(s.get_name().to_string());
                walk(s, p, checked);
            }
        }
        let mut checked = 0;
        walk(&Cli::command(), Vec::new(), &mut checked);
        assert!(checked > 40, "only {checked} options checked");
    }

    /// The installed command hides nothing: no hidden command and no
    /// hidden option (the lab's are `fastudp-lab`'s).
    #[test]
    fn nothing_is_hidden() {
        fn walk(cmd: &clap::Command, path: &str, seen: &mut usize) {
            for a in cmd.get_arguments() {
                assert!(!a.is_hide_set(), "{path} --{:?} is hidden", a.get_id());
                *seen += 1;
            }
            for s in cmd.get_subcommands() {
                assert!(!s.is_hide_set(), "{path} {} is hidden", s.get_name());
                walk(s, &format!("{path} {}", s.get_name()), seen);
            }
        }
        let mut seen = 0;
        walk(&Cli::command(), "fastudp", &mut seen);
        assert!(seen > 40, "only {seen} options seen");
    }

    /// The help of `testbed up` lists every profile, and its own words
    /// name all of them or none (a list written by hand falls behind).
    #[test]
    fn testbed_up_help_names_every_profile() {
        let mut cmd = Cli::command();
        let up = cmd
            .find_subcommand_mut("testbed")
            .and_then(|t| t.find_subcommand_mut("up"))
            .expect("testbed up");
        let arg = up
            .get_arguments()
            .find(|a| a.get_id() == "profile")
            .expect("profile");
        let own = format!(
            "{} {}",
            arg.get_help().map(|h| h.to_string()).unwrap_or_default(),
            arg.get_long_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
        );
        let names: Vec<String> = testbed::Profile::value_variants()
            .iter()
            .map(|p| p.to_possible_value().unwrap().get_name().to_string())
            .collect();
        let named = names
            .iter()
            .filter(|n| {
                own.split(|c: char| !c.is_alphanumeric() && c != '-')
                    .any(|w| w == n.as_str())
            })
            .count();
        assert!(named == 0 || named == names.len(), "{own:?}");
        for long in [false, true] {
            let help = if long {
                up.render_long_help().to_string()
            } else {
                up.render_help().to_string()
            };
            for n in &names {
                assert!(help.contains(n.as_str()), "{n} missing from {help}");
            }
        }
    }
}
