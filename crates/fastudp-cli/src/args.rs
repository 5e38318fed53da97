//! Parsing rules every subcommand shares: an option's value may be a
//! negative number, so that the option's own check says why it is wrong,
//! and a bad value is one line of error.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Command;
use std::net::{IpAddr, SocketAddr};

/// Lets every option (and argument) that takes a value take one that
/// starts with `-` and a digit. Without this clap reads `--payload -1` as
/// the option `-1` and says "unexpected argument '-1'"; with it the value
/// reaches the option's parser or check, which says why it is wrong.
pub fn allow_negative_numbers(cmd: Command) -> Command {
    cmd.mut_args(|a| {
        if a.get_action().takes_values() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(allow_negative_numbers)
}

/// The one line to print for an option's bad value, or `None` for errors
/// that clap renders better itself (an unknown option, with its tip; a
/// value not among the possible ones, with the list).
pub fn bad_value_line(e: &clap::Error) -> Option<String> {
    if e.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let text = |k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let arg = text(ContextKind::InvalidArg)?;
    let value = text(ContextKind::InvalidValue)?;
    // `--payload <PAYLOAD>`: the option's name is enough.
    let opt = arg.split(' ').next().unwrap_or(&arg).to_string();
    let source = std::error::Error::source(e);
    let why = source.map(|s| s.to_string()).unwrap_or_default();
    let negative = value.starts_with('-') && value[1..].parse::<f64>().is_ok();
    let integer =
        source.is_some_and(|s| s.is::<std::num::ParseIntError>()) || why.contains(" is not in ");
    Some(if negative && integer {
        format!("{opt} {value} is out of range: it cannot be negative")
    } else {
        format!("{opt} {value}: {why}")
    })
}

/// Resolves `host` (a name or an address, the value of option `opt`) to
/// an address of the family asked for (`v4`/`v6`), or of either when
/// neither -4 nor -6 was given. A name that does not resolve is a usage
/// error.
pub fn resolve_as(
    opt: &str,
    host: &str,
    port: u16,
    v4: bool,
    v6: bool,
) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.parse::<IpAddr>() {
        if (v6 && ip.is_ipv4()) || (v4 && ip.is_ipv6()) {
            bail_usage!(
                "{opt} {host} is not an {} address",
                if v6 { "IPv6" } else { "IPv4" }
            );
        }
        return Ok(SocketAddr::new(ip, port));
    }
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| usage!("{opt} {host}: cannot resolve it: {e}"))?
        .collect();
    all.iter()
        .copied()
        .find(|a| {
            if v6 {
                a.is_ipv6()
            } else if v4 {
                a.is_ipv4()
            } else {
                true
            }
        })
        .ok_or_else(|| {
            usage!(
                "{opt} {host} has no {} address",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })
}

/// Parses a rate such as `125000`, `125k`, `1M` or `1.5M` (bytes per
/// second); a bad one is a usage error. (Also clap's value parser.)
pub fn parse_rate(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| usage!("{s:?} is not a rate in bytes per second (like 125000, 125k, 1M)"))?;
    let r = v * mult;
    if !(r.is_finite() && (1.0..=1e12).contains(&r)) {
        bail_usage!("{s:?}: a rate must be 1 byte/s to 1 TB/s");
    }
    Ok(r as u64)
}

/// The command line as parsed, kept by [`remember`] so that a command can
/// tell an option given there from its default (`quic serve --config`).
static MATCHES: std::sync::OnceLock<clap::ArgMatches> = std::sync::OnceLock::new();

/// Keeps the parsed command line (once; [`crate::main`] does it).
pub fn remember(m: &clap::ArgMatches) {
    let _ = MATCHES.set(m.clone());
}

/// Whether the option `id` (a field of `quic serve`'s arguments) was
/// given on the command line. False when the command line was not kept
/// (a caller of [`crate::run`] other than [`crate::main`]).
pub fn given_in_serve(id: &str) -> bool {
    fn find<'a>(m: &'a clap::ArgMatches, name: &str) -> Option<&'a clap::ArgMatches> {
        match m.subcommand() {
            Some((n, sub)) if n == name => Some(sub),
            Some((_, sub)) => find(sub, name),
            None => None,
        }
    }
    MATCHES
        .get()
        .and_then(|m| find(m, "serve"))
        .is_some_and(|m| {
            matches!(
                m.try_get_raw(id).ok().flatten().map(|_| m.value_source(id)),
                Some(Some(clap::parser::ValueSource::CommandLine))
            )
        })
}

/// The features `FASTUDP_DISABLE` (a list such as `gso,gro,mmsg`) switches
/// off. The library reads no environment variable: `doctor` and
/// `quic serve` map this one to `fastudp_io::Config::disable` for their
/// sockets (docs/CLI.md). Unset or empty switches nothing off; an unknown
/// name is a usage error that lists the known ones.
pub fn disabled_from_env() -> anyhow::Result<Vec<fastudp_io::Feature>> {
    match std::env::var("FASTUDP_DISABLE") {
        Ok(v) => fastudp_io::Feature::parse_list(&v).map_err(|e| usage!("FASTUDP_DISABLE: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
        Err(std::env::VarError::NotUnicode(_)) => Err(usage!("FASTUDP_DISABLE: not valid Unicode")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(cmd: &Command, args: &[&str]) -> Result<clap::ArgMatches, clap::Error> {
        cmd.clone().try_get_matches_from(args)
    }

    fn test_cmd() -> Command {
        allow_negative_numbers(
            Command::new("t").subcommand(
                Command::new("s")
                    .arg(
                        clap::Arg::new("count")
                            .long("count")
                            .value_parser(clap::value_parser!(u64)),
                    )
                    .arg(
                        clap::Arg::new("port")
                            .long("port")
                            .value_parser(clap::value_parser!(u16)),
                    )
                    .arg(
                        clap::Arg::new("quiet")
                            .long("quiet")
                            .action(clap::ArgAction::SetTrue),
                    ),
            ),
        )
    }

    #[test]
    fn a_negative_count_is_a_bad_value_not_an_unknown_option() {
        let cmd = test_cmd();
        for opt in ["--count", "--port"] {
            let e = parse(&cmd, &["t", "s", opt, "-1"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{e}");
            assert_eq!(
                bad_value_line(&e).unwrap(),
                format!("{opt} -1 is out of range: it cannot be negative")
            );
        }
        let e = parse(&cmd, &["t", "s", "--count", "x"]).unwrap_err();
        assert_eq!(
            bad_value_line(&e).unwrap(),
            "--count x: invalid digit found in string"
        );
        // Flags stay flags, and an unknown option is still clap's to explain.
        let e = parse(&cmd, &["t", "s", "--quiet", "-1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument);
        assert!(bad_value_line(&e).is_none());
    }

    /// A wrong address family, a name that does not resolve and a bad
    /// rate are usage errors (status 2), each one line.
    #[test]
    fn bad_addresses_and_rates_are_usage_errors() {
        use crate::failure::exit_status;
        let e = resolve_as("-D", "::1", 9, true, false).unwrap_err();
        assert_eq!(format!("{e:#}"), "-D ::1 is not an IPv4 address");
        assert_eq!(exit_status(&e), 2);
        let e = resolve_as("-D", "127.0.0.1", 9, false, true).unwrap_err();
        assert_eq!(format!("{e:#}"), "-D 127.0.0.1 is not an IPv6 address");
        assert_eq!(exit_status(&e), 2);
        let e = resolve_as("-D", "no-such-host.invalid", 9, false, false).unwrap_err();
        assert!(format!("{e:#}").contains("cannot resolve it"), "{e:#}");
        assert_eq!(exit_status(&e), 2);
        assert_eq!(
            resolve_as("-D", "127.0.0.1", 9, false, false).unwrap(),
            "127.0.0.1:9".parse::<SocketAddr>().unwrap()
        );
        for bad in ["fast", "0", "-1k", "2T"] {
            let e = parse_rate(bad).unwrap_err();
            assert_eq!(exit_status(&e), 2, "{bad}: {e:#}");
        }
        assert_eq!(
            format!("{:#}", parse_rate("fast").unwrap_err()),
            "\"fast\" is not a rate in bytes per second (like 125000, 125k, 1M)"
        );
    }
}
