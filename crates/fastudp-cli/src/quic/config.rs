//! `fastudp quic serve --config FILE`: the options of `quic serve` in a
//! TOML file, and its routes.
//!
//! Every key is an option's long name without its dashes (`listen`,
//! `max-connections`, `alt-svc-tcp`, `0rtt`, ...), with a value of the
//! option's type: a string for addresses, paths, names and sizes with a
//! suffix (`max-memory = "2G"`, or a number of bytes), a number, `true` or
//! `false` for a switch, a string or a list of strings for `upstream`.
//! An option given on the command line wins over the file.
//!
//! `[[route]]` tables (file only) send a path prefix to upstreams or to a
//! directory:
//!
//! ```toml
//! [[route]]
//! path = "/api/"
//! upstream = ["http://127.0.0.1:8080", "http://127.0.0.1:8081"]
//! fail-duration = 5
//!
//! [[route]]
//! path = "/"
//! www = "/srv/www"
//! ```
//!
//! The file is checked whole before anything starts: a key that is not
//! an option, a value of the wrong type, a value an option refuses (an
//! address that is not one, `workers = 0`) or a bad route is an error
//! that names the file, the line and the key.

use super::access_log::LogFormat;
use super::{proxy, Crypto, PacingArg, ServeArgs, Stack};
use crate::failure::usage;
use serde::{Deserialize, Deserializer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The largest configuration file read, bytes.
pub const MAX_FILE: u64 = 1 << 20;

/// The most routes a file may hold.
pub const MAX_ROUTES: usize = 1024;

/// The file's top level: `quic serve`'s options and its routes.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    listen: Option<SocketAddr>,
    stack: Option<Stack>,
    workers: Option<usize>,
    pacing: Option<PacingArg>,
    zerocopy: Option<bool>,
    #[serde(default, deserialize_with = "rate")]
    total_rate: Option<u64>,
    pacing_burst: Option<usize>,
    retry: Option<bool>,
    max_connections: Option<usize>,
    max_connections_per_ip: Option<usize>,
    #[serde(default, deserialize_with = "bytes")]
    max_memory: Option<u64>,
    max_open_files: Option<usize>,
    request_timeout: Option<f64>,
    max_half_open: Option<usize>,
    interval: Option<f64>,
    idle_timeout: Option<f64>,
    duration: Option<f64>,
    stats: Option<bool>,
    json: Option<bool>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    #[serde(rename = "0rtt")]
    zero_rtt: Option<bool>,
    crypto: Option<Crypto>,
    ack_every: Option<u32>,
    max_train: Option<usize>,
    trains_per_turn: Option<usize>,
    uring: Option<bool>,
    max_udp_payload: Option<u16>,
    recv_arena: Option<bool>,
    timer_tick_us: Option<u64>,
    busy_poll_us: Option<u64>,
    rx_coalesce_us: Option<u64>,
    www: Option<PathBuf>,
    alt_svc_tcp: Option<bool>,
    #[serde(default, deserialize_with = "one_or_many")]
    upstream: Option<Vec<String>>,
    upstream_timeout: Option<f64>,
    test_endpoints: Option<bool>,
    access_log: Option<PathBuf>,
    access_log_format: Option<LogFormat>,
    upstream_fail_duration: Option<f64>,
    server_id: Option<String>,
    lb_config: Option<String>,
    reset_key: Option<PathBuf>,
    metrics: Option<SocketAddr>,
    drain_timeout: Option<f64>,
    #[serde(default)]
    route: Vec<toml::Spanned<RouteFile>>,
}

/// A `[[route]]` table.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RouteFile {
    path: Option<toml::Spanned<String>>,
    #[serde(default, deserialize_with = "spanned_one_or_many")]
    upstream: Option<toml::Spanned<Vec<String>>>,
    www: Option<toml::Spanned<PathBuf>>,
    fail_duration: Option<toml::Spanned<f64>>,
}

/// A route, checked.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// The path prefix.
    pub prefix: String,
    /// Where its requests go.
    pub to: RouteTo,
    /// Where it was written: `FILE:LINE`.
    pub place: String,
}

/// Where a route's requests go.
#[derive(Debug, Clone)]
pub enum RouteTo {
    /// These upstreams (`http://HOST:PORT`), in turn; one that fails is
    /// skipped this long (`None`: `--upstream-fail-duration`).
    Upstreams(Vec<String>, Option<Duration>),
    /// The files beneath this directory.
    Www(PathBuf),
}

/// Where the options given by the file were written, to name the line of
/// a value an option refuses.
#[derive(Debug, Default)]
pub struct Origin {
    file: Option<PathBuf>,
    /// (option's long name, line) for the top-level keys the file set
    /// and the command line did not.
    keys: Vec<(String, usize)>,
}

impl Origin {
    /// `e` (a usage error: an option's refusal, which starts with
    /// `--NAME`) with the file's name, line and key when that option came
    /// from the file; any other error as it is.
    pub fn locate(&self, e: anyhow::Error) -> anyhow::Error {
        let Some(file) = &self.file else { return e };
        if !e.chain().any(|c| c.is::<crate::failure::Usage>()) {
            return e;
        }
        let msg = format!("{e:#}");
        let Some(flag) = msg
            .split_whitespace()
            .find_map(|w| w.strip_prefix("--"))
            .map(|w| w.trim_end_matches([':', ',', ')']))
        else {
            return e;
        };
        match self.keys.iter().find(|(k, _)| k == flag) {
            Some((k, line)) => usage(format!("{}:{line}: {k}: {msg}", file.display())),
            None => e,
        }
    }
}

/// Reads `--config FILE` into `a`: each option the file sets and the
/// command line does not (`given(id)` says whether it did) takes the
/// file's value; the routes are checked and kept in `a.routes`.
pub fn apply(a: &mut ServeArgs, given: &dyn Fn(&str) -> bool) -> anyhow::Result<Origin> {
    let Some(path) = a.config.clone() else {
        return Ok(Origin::default());
    };
    let text = read(&path)?;
    let f: FileConfig = toml::from_str(&text).map_err(|e| de_error(&path, &text, &e))?;
    let mut origin = Origin {
        file: Some(path.clone()),
        keys: Vec::new(),
    };
    let lines = top_level_keys(&text);
    let no_upstream = f.upstream.as_ref().is_some_and(|u| u.is_empty());
    let mut set = |id: &str| -> bool {
        if given(id) {
            return false;
        }
        let name = match id {
            "zero_rtt" => "0rtt".to_string(),
            _ => id.replace('_', "-"),
        };
        if let Some((_, line)) = lines.iter().find(|(k, _)| *k == name) {
            origin.keys.push((name, *line));
        }
        true
    };
    // Options whose value replaces the default.
    macro_rules! plain {
        ($($field:ident),* $(,)?) => {$(
            if let Some(v) = f.$field {
                if set(stringify!($field)) {
                    a.$field = v;
                }
            }
        )*};
    }
    // Options that are `None` unless given.
    macro_rules! optional {
        ($($field:ident),* $(,)?) => {$(
            if let Some(v) = f.$field {
                if set(stringify!($field)) {
                    a.$field = Some(v);
                }
            }
        )*};
    }
    plain!(
        listen,
        stack,
        pacing,
        zerocopy,
        pacing_burst,
        retry,
        request_timeout,
        max_half_open,
        interval,
        idle_timeout,
        stats,
        json,
        zero_rtt,
        crypto,
        max_train,
        trains_per_turn,
        uring,
        max_udp_payload,
        recv_arena,
        timer_tick_us,
        busy_poll_us,
        rx_coalesce_us,
        alt_svc_tcp,
        upstream,
        upstream_timeout,
        test_endpoints,
        access_log_format,
        upstream_fail_duration,
        drain_timeout,
    );
    optional!(
        workers,
        total_rate,
        max_connections,
        max_connections_per_ip,
        max_memory,
        max_open_files,
        duration,
        cert,
        key,
        ack_every,
        www,
        access_log,
        server_id,
        lb_config,
        reset_key,
        metrics,
    );
    a.routes = routes(&path, &text, f.route)?;
    if no_upstream {
        let line = lines
            .iter()
            .find(|(k, _)| k == "upstream")
            .map_or(String::new(), |(_, l)| format!("{l}:"));
        return Err(usage(format!(
            "{}:{line} upstream: an empty list (give an upstream, or leave the key out)",
            path.display()
        )));
    }
    Ok(origin)
}

/// What is wrong with a route's path prefix beyond its first character
/// and spaces: a `"` or `\` (they would need escaping in the metrics'
/// labels and mean nothing in a path), or a form the proxy's path
/// normalisation would change (`//`, `.` or `..` segments, an escape of
/// an unreserved character: no normalised path could match it).
fn prefix_problem(p: &str) -> Option<String> {
    if p.contains('"') || p.contains('\\') {
        return Some("a path prefix holds no `\"` or `\\`".into());
    }
    match super::proxy::normalize_path(p) {
        Ok(n) if n == p => None,
        Ok(n) => Some(format!(
            "requests are matched by their normalised path, and this prefix normalises to {n:?}: write that"
        )),
        Err(_) => Some("not a path a request could have (an encoded /, \\ or NUL, a .. above /, or a bad % escape)".into()),
    }
}

/// The file's text: a missing or unreadable file, one over [`MAX_FILE`]
/// or not UTF-8 is a usage error naming it.
fn read(path: &Path) -> anyhow::Result<String> {
    let bad = |m: String| usage(format!("--config {}: {m}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_FILE {
        return Err(bad(format!("larger than {} KiB", MAX_FILE >> 10)));
    }
    let b = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    String::from_utf8(b).map_err(|_| bad("not UTF-8".into()))
}

/// The 1-based line of byte offset `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The key a line sets (`key = value`), if it sets one.
fn key_of_line(line: &str) -> Option<String> {
    let (k, _) = line.split_once('=')?;
    let k = k.trim().trim_matches(|c| c == '"' || c == '\'');
    (!k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    .then(|| k.to_string())
}

/// The top-level keys (before the first table) and their lines.
fn top_level_keys(text: &str) -> Vec<(String, usize)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| !l.trim_start().starts_with('['))
        .filter_map(|(i, l)| key_of_line(l).map(|k| (k, i + 1)))
        .collect()
}

/// A TOML error as `FILE:LINE: KEY: what` (the key from the line the
/// error points at, and the table it is in).
fn de_error(path: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let msg = e.message().trim();
    // serde lists every field: the key is what matters.
    let msg = match msg.split_once(", expected one of") {
        Some((head, _)) if head.starts_with("unknown field") => {
            format!(
                "{}: not an option of `quic serve` (docs/PROXY.md lists the keys)",
                head.replacen("unknown field", "unknown key", 1)
            )
        }
        _ => msg.to_string(),
    };
    let Some(span) = e.span() else {
        return usage(format!("--config {}: {msg}", path.display()));
    };
    let line = line_of(text, span.start);
    let line_text = text.lines().nth(line - 1).unwrap_or("");
    let table = text
        .lines()
        .take(line)
        .filter(|l| l.trim_start().starts_with('['))
        .last()
        .map(|l| l.trim().to_string());
    // An unknown key names itself.
    let key = key_of_line(line_text).filter(|_| !msg.starts_with("unknown key"));
    let place = match (table, key) {
        (Some(t), Some(k)) => format!("{t} {k}: "),
        (None, Some(k)) => format!("{k}: "),
        (Some(t), None) => format!("{t}: "),
        (None, None) => String::new(),
    };
    usage(format!("{}:{line}: {place}{msg}", path.display()))
}

/// The routes, checked: a path that starts with `/`, one prefix once,
/// either upstreams (each `http://HOST:PORT`) or a directory.
fn routes(
    path: &Path,
    text: &str,
    routes: Vec<toml::Spanned<RouteFile>>,
) -> anyhow::Result<Vec<RouteSpec>> {
    let at = |span: std::ops::Range<usize>, key: &str, m: String| {
        usage(format!(
            "{}:{}: [[route]] {key}{}{m}",
            path.display(),
            line_of(text, span.start),
            if key.is_empty() { "" } else { ": " }
        ))
    };
    if routes.len() > MAX_ROUTES {
        return Err(usage(format!(
            "--config {}: {} routes: at most {MAX_ROUTES}",
            path.display(),
            routes.len()
        )));
    }
    let mut out: Vec<RouteSpec> = Vec::with_capacity(routes.len());
    for r in routes {
        let span = r.span();
        let r = r.into_inner();
        let Some(prefix) = r.path else {
            return Err(at(
                span,
                "",
                "no `path` (the prefix it serves, such as \"/api/\")".into(),
            ));
        };
        let p = prefix.get_ref();
        if !p.starts_with('/') || p.chars().any(|c| c.is_control() || c == ' ') {
            return Err(at(
                prefix.span(),
                "path",
                format!("{p:?}: a path prefix starts with / and holds no spaces"),
            ));
        }
        if let Some(m) = prefix_problem(p) {
            return Err(at(prefix.span(), "path", format!("{p:?}: {m}")));
        }
        if let Some(first) = out.iter().find(|o| o.prefix == *p) {
            return Err(at(
                prefix.span(),
                "path",
                format!("{p:?} has a route already ({})", first.place),
            ));
        }
        let fail_span = r.fail_duration.as_ref().map(|d| d.span());
        let fail = match r.fail_duration {
            Some(d) => {
                let v = *d.get_ref();
                if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
                    return Err(at(
                        d.span(),
                        "fail-duration",
                        format!("{v}: between 0 and 86400 s"),
                    ));
                }
                Some(Duration::from_secs_f64(v))
            }
            None => None,
        };
        let to = match (r.upstream, r.www) {
            (Some(u), Some(_)) => {
                return Err(at(
                    u.span(),
                    "upstream",
                    "a route has `upstream` or `www`, not both".into(),
                ))
            }
            (None, None) => {
                return Err(at(
                    span,
                    "",
                    format!("{p:?}: no `upstream` and no `www`: say where its requests go"),
                ))
            }
            (Some(u), None) => {
                let us = u.get_ref();
                if us.is_empty() {
                    return Err(at(u.span(), "upstream", "an empty list".into()));
                }
                for s in us {
                    if let Err(e) = proxy::Upstream::parse(s) {
                        return Err(at(u.span(), "upstream", format!("{s}: {e}")));
                    }
                }
                RouteTo::Upstreams(us.clone(), fail)
            }
            (None, Some(w)) => {
                if let Some(f) = fail_span {
                    return Err(at(
                        f,
                        "fail-duration",
                        "only for a route to upstreams".into(),
                    ));
                }
                let dir = w.get_ref();
                if !dir.is_dir() {
                    return Err(at(
                        w.span(),
                        "www",
                        format!("{}: not a directory", dir.display()),
                    ));
                }
                RouteTo::Www(dir.clone())
            }
        };
        out.push(RouteSpec {
            prefix: p.clone(),
            to,
            place: format!("{}:{}", path.display(), line_of(text, span.start)),
        });
    }
    Ok(out)
}

/// A string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for Vec<String> {
    fn from(v: OneOrMany) -> Vec<String> {
        match v {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Some(OneOrMany::deserialize(d)?.into()))
}

fn spanned_one_or_many<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<toml::Spanned<Vec<String>>>, D::Error> {
    let s = toml::Spanned::<OneOrMany>::deserialize(d)?;
    let span = s.span();
    Ok(Some(toml::Spanned::new(span, s.into_inner().into())))
}

/// A number, or a string with a suffix.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    Num(u64),
    Text(String),
}

fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = match NumOrText::deserialize(d)? {
        NumOrText::Num(n) => n.to_string(),
        NumOrText::Text(t) => t,
    };
    crate::args::parse_rate(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = match NumOrText::deserialize(d)? {
        NumOrText::Num(n) => n.to_string(),
        NumOrText::Text(t) => t,
    };
    super::parse_bytes(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
}
