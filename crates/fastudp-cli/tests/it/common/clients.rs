//! QUIC and HTTP/3 clients the project did not write, pointed at
//! `fastudp quic serve`: headless Chromium, quic-go's `http3` and
//! hq-interop clients (tools/quic-go-client), and aioquic
//! (tests/aioquic_client.py). Each finder says why a test skips when its
//! tool is missing, or fails it under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`
//! (scripts/install-test-deps.sh installs them all). Each run is bounded in time, and a failure
//! comes back as an `Err` with what the tool said, never as empty output.

use super::skip;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long one client run may take before it is killed and the run
/// fails (a hang, not a slow run: the transfers here take seconds).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(90);

/// One response as a client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The path (aioquic) or URL (quic-go) asked for.
    pub what: String,
    /// The HTTP status (200 for a complete HTTP/0.9 response).
    pub status: u16,
    /// The body's length.
    pub bytes: u64,
    /// The body's SHA-256, lowercase hex.
    pub sha256: String,
}

/// How a client trusts the server's certificate.
#[derive(Debug, Clone, Copy)]
pub enum Trust<'a> {
    /// It does not verify it.
    Insecure,
    /// It verifies it against this PEM file, for the name `localhost`.
    Ca(&'a Path),
}

/// SHA-256 of `data`, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The body of `/bytes/N` (byte i is i % 251), for comparing hashes.
pub fn bytes_body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Runs `cmd` with its output captured, killed (with its whole process
/// group: Chromium starts many) after [`CLIENT_TIMEOUT`]. Returns exit
/// success, stdout and stderr; `Err` if it could not start or timed out.
pub fn run_bounded(cmd: &mut Command) -> anyhow::Result<(bool, String, String)> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {cmd:?}: {e}"))?;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if Instant::now() > deadline {
            // The group's id is the child's pid (process_group(0)).
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (o.join().unwrap_or_default(), e.join().unwrap_or_default());
    match status {
        Some(s) => Ok((s.success(), out, err)),
        None => Err(anyhow::anyhow!(
            "{cmd:?} did not end within {CLIENT_TIMEOUT:?}\nstdout: {out}\nstderr: {err}"
        )),
    }
}

/// The first of `names` that is an executable file on `PATH` (found
/// without running it: a browser started with an unknown flag may not end).
fn in_path(names: &[&str]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
            {
                return Some(p);
            }
        }
    }
    None
}

// ---------------------------------------------------------------- Chromium

/// Headless Chromium (`FASTUDP_CHROMIUM`, else `chromium` or
/// `chromium-browser` on `PATH`); `None` after saying why `test` skips.
pub fn chromium(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("FASTUDP_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| in_path(&["chromium", "chromium-browser"]));
    if found.is_none() {
        skip(
            test,
            "needs chromium (apt-get install chromium; scripts/install-test-deps.sh installs it)",
        );
    }
    found
}

/// Loads `https://HOST:PORT{path}` in headless Chromium, forced onto
/// QUIC (HTTP/3) for that origin and trusting the certificate whose SPKI
/// SHA-256 (base64) is `spki`; the rendered DOM (`--dump-dom`).
///
/// `host` is what the URL names. Chromium resolves `localhost` to `::1`
/// first: use it only with a server listening on `[::]`; `127.0.0.1`
/// works with a server on `127.0.0.1` and a certificate for `localhost`
/// (the SPKI list overrides the name check too). Chromium exits 0 even
/// when the load fails, printing nothing on stdout and "Page load
/// failed: net::ERR_..." on stderr: that line is the `Err`. A page load
/// also asks for `/favicon.ico`.
pub fn chromium_dump_dom(
    bin: &Path,
    host: &str,
    port: u16,
    spki: &str,
    path: &str,
) -> anyhow::Result<String> {
    chromium_dump_dom_with(bin, host, port, spki, path, &[])
}

/// [`chromium_dump_dom`] with more of Chromium's flags (such as
/// `--virtual-time-budget=MS`, which waits for the page's scripts and
/// their requests, or `--screenshot=FILE`).
pub fn chromium_dump_dom_with(
    bin: &Path,
    host: &str,
    port: u16,
    spki: &str,
    path: &str,
    extra: &[&str],
) -> anyhow::Result<String> {
    let profile = tempdir("chromium");
    let origin = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let r = run_bounded(
        Command::new(bin)
            .arg("--headless=new")
            .arg("--no-sandbox")
            .arg("--disable-gpu")
            .arg("--no-first-run")
            .arg("--enable-quic")
            .arg(format!("--origin-to-force-quic-on={origin}"))
            .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg("--dump-dom")
            .arg(format!("https://{origin}{path}")),
    );
    let _ = std::fs::remove_dir_all(&profile);
    let (ok, out, err) = r?;
    if let Some(l) = err.lines().find(|l| l.contains("Page load failed")) {
        return Err(anyhow::anyhow!("{l}"));
    }
    if !ok || out.trim().is_empty() {
        let tail: Vec<&str> = err.lines().rev().take(10).collect();
        return Err(anyhow::anyhow!(
            "chromium printed no DOM (success: {ok}); stderr ends: {tail:?}"
        ));
    }
    Ok(out)
}

/// The text of the element of id `id` in a DOM Chromium dumped (up to
/// its first child or end tag).
pub fn dom_text<'a>(dom: &'a str, id: &str) -> &'a str {
    let open = format!("id=\"{id}\">");
    let at = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no #{id} in {dom}"));
    let rest = &dom[at + open.len()..];
    &rest[..rest.find('<').unwrap_or(rest.len())]
}

/// A fresh directory under the temporary directory.
pub fn tempdir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "fastudp-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

// ----------------------------------------------------------------- quic-go

/// The quic-go client (`FASTUDP_QUIC_GO_CLIENT`, else
/// target/tmp/quic-go-client), built once per test binary by
/// scripts/build-quic-go-client.sh (the Go build cache makes that about a
/// second once built); `None` after saying why `test` skips.
pub fn quic_go_client(test: &str) -> Option<PathBuf> {
    static BUILT: OnceLock<anyhow::Result<PathBuf>> = OnceLock::new();
    let r = BUILT.get_or_init(|| {
        if let Some(p) = std::env::var_os("FASTUDP_QUIC_GO_CLIENT") {
            return Ok(PathBuf::from(p));
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quic-go-client");
        let have_go = in_path(&["go"]).is_some() || Path::new("/usr/local/go/bin/go").exists();
        if !have_go {
            return Err(anyhow::anyhow!("needs Go 1.26+ to build tools/quic-go-client (.ci/run builds it with scripts/build-quic-go-client.sh)"));
        }
        // In cargo's scratch directory for tests; the script renames each
        // binary into place, so test binaries building at once do not
        // clash.
        match run_bounded(
            Command::new(root.join("scripts/build-quic-go-client.sh"))
                .arg(&out)
                .env_remove("FASTUDP_REQUIRE_PRIVILEGED_TESTS"),
        ) {
            Ok((true, _, _)) => Ok(out),
            Ok((false, o, e)) => Err(anyhow::anyhow!("scripts/build-quic-go-client.sh failed: {o}{e}")),
            Err(e) => Err(e),
        }
    });
    match r {
        Ok(p) => Some(p.clone()),
        Err(why) => {
            skip(test, &why.to_string());
            None
        }
    }
}

/// Fetches `urls` (https://...) in parallel on one connection with
/// quic-go: `alpn` is `h3` or `hq-interop`. `Ok` when every request got a
/// complete 200 response: the responses in the order asked, and the
/// client's summary line (`connections`: the QUIC connections it opened,
/// for h3). `Err` with the client's output otherwise.
pub fn quic_go_fetch(
    bin: &Path,
    alpn: &str,
    trust: Trust<'_>,
    urls: &[String],
) -> anyhow::Result<(Vec<Fetched>, serde_json::Value)> {
    let mut cmd = Command::new(bin);
    cmd.args(["-alpn", alpn, "-timeout", "80s"]);
    match trust {
        Trust::Insecure => {
            cmd.arg("-insecure");
        }
        Trust::Ca(p) => {
            cmd.arg("-ca").arg(p).args(["-servername", "localhost"]);
        }
    }
    cmd.args(urls);
    let (ok, out, err) = run_bounded(&mut cmd)?;
    if !ok {
        return Err(anyhow::anyhow!("quic-go-client failed:\n{out}{err}"));
    }
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| anyhow::anyhow!("{e}: {l}")))
        .collect::<Result<_, _>>()?;
    let (summary, rows) = lines
        .split_last()
        .ok_or_else(|| anyhow::anyhow!("no output"))?;
    let fetched = rows
        .iter()
        .map(|v| Fetched {
            what: v["url"].as_str().unwrap_or_default().into(),
            status: v["status"].as_u64().unwrap_or(0) as u16,
            bytes: v["bytes"].as_u64().unwrap_or(0),
            sha256: v["sha256"].as_str().unwrap_or_default().into(),
        })
        .collect();
    Ok((fetched, summary.clone()))
}

/// `https://{addr}{path}` for each of `paths`, as quic-go asks for them.
pub fn urls(addr: SocketAddr, paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| format!("https://{addr}{p}")).collect()
}

// ----------------------------------------------------------------- aioquic

/// Whether python3 with aioquic is here; otherwise says why `test` skips.
pub fn aioquic(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import aioquic"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        skip(
            test,
            "needs python3 with aioquic (pip install aioquic==1.7.2; scripts/install-test-deps.sh installs it)",
        );
    }
    ok
}

/// Runs tests/aioquic_client.py against `addr`: every path in parallel
/// on one connection, over HTTP/3 (`h3`) or hq-interop. Its JSON line
/// (`alpn`, `version`, `responses` with `bytes`, `sha256`, and `status`
/// for h3 or `reset` for a reset stream) when it exits 0; `Err` with its
/// output otherwise (for h3: any error, reset or status other than 200).
pub fn aioquic_fetch(
    h3: bool,
    trust: Trust<'_>,
    addr: SocketAddr,
    paths: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/aioquic_client.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script);
    if h3 {
        cmd.arg("--h3");
    }
    if let Trust::Ca(p) = trust {
        cmd.arg("--ca").arg(p);
    }
    cmd.arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .args(paths);
    let (ok, out, err) = run_bounded(&mut cmd)?;
    if !ok {
        return Err(anyhow::anyhow!("aioquic_client.py failed:\n{out}{err}"));
    }
    serde_json::from_str(out.trim()).map_err(|e| anyhow::anyhow!("{e}: {out}{err}"))
}

/// The responses of an [`aioquic_fetch`] as [`Fetched`] values (status 200
/// for a complete hq-interop response, 0 for a reset one).
pub fn aioquic_fetched(v: &serde_json::Value) -> Vec<Fetched> {
    v["responses"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| Fetched {
                    what: r["path"].as_str().unwrap_or_default().into(),
                    status: match (r.get("status"), r.get("reset")) {
                        (Some(s), _) => s.as_u64().unwrap_or(0) as u16,
                        (None, Some(_)) => 0,
                        (None, None) => 200,
                    },
                    bytes: r["bytes"].as_u64().unwrap_or(0),
                    sha256: r["sha256"].as_str().unwrap_or_default().into(),
                })
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------- quic-go's interop client

/// quic-go's interop-runner client, built next to [`quic_go_client`]
/// (target/quic-go-client-interop); `None` after saying why `test` skips.
/// It runs in a chroot (root only), as it writes to /downloads and /logs.
pub fn quic_go_interop_client(test: &str) -> Option<PathBuf> {
    if !super::root() {
        skip(
            test,
            "needs root (quic-go's interop client runs in a chroot)",
        );
        return None;
    }
    let p = quic_go_client(test)?;
    let mut name = p.into_os_string();
    name.push("-interop");
    Some(PathBuf::from(name))
}

/// What a run of quic-go's interop client left: its chroot, holding
/// `downloads/` (the files, named by their URL paths) and `logs/`
/// (`keys.log`: the TLS secrets it derived).
pub struct InteropRun {
    /// The chroot directory.
    pub root: PathBuf,
}

impl InteropRun {
    /// The downloaded file of `path`, if any.
    pub fn file(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(
            self.root
                .join("downloads")
                .join(path.trim_start_matches('/')),
        )
        .ok()
    }

    /// The TLS key log (NSS format) the client wrote.
    pub fn keylog(&self) -> String {
        std::fs::read_to_string(self.root.join("logs/keys.log")).unwrap_or_default()
    }
}

impl Drop for InteropRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Runs quic-go's interop client with `TESTCASE=case` against
/// `https://{addr}{path}` for each path, in a chroot of its own. `Ok` when
/// it exits 0 (its files still to be checked); `Err` with its output when
/// it fails, or exits 127 (a case it does not have).
pub fn quic_go_interop(
    bin: &Path,
    case: &str,
    addr: SocketAddr,
    paths: &[&str],
) -> anyhow::Result<InteropRun> {
    quic_go_interop_in(None, bin, case, addr, paths)
}

/// [`quic_go_interop`], in network namespace `netns` if given.
pub fn quic_go_interop_in(
    netns: Option<&str>,
    bin: &Path,
    case: &str,
    addr: SocketAddr,
    paths: &[&str],
) -> anyhow::Result<InteropRun> {
    let root = tempdir("quic-go-interop");
    std::fs::create_dir_all(root.join("logs")).unwrap();
    for p in paths {
        let f = root.join("downloads").join(p.trim_start_matches('/'));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    }
    // A hard link, not a copy: a file this process opened for writing can
    // be inherited by a child that another test thread forks meanwhile,
    // and exec of it then fails with ETXTBSY ("Text file busy"). A copy
    // only when the two are on different file systems (see below).
    let dst = root.join("client");
    if std::fs::hard_link(bin, &dst).is_err() {
        std::fs::copy(bin, &dst).map_err(|e| anyhow::anyhow!("{}: {e}", bin.display()))?;
    }
    let run = InteropRun { root };
    let chroot = in_path(&["chroot"]).ok_or_else(|| anyhow::anyhow!("no chroot on PATH"))?;
    let mut cmd = match netns {
        Some(ns) => {
            let mut c =
                Command::new(in_path(&["ip"]).ok_or_else(|| anyhow::anyhow!("no ip on PATH"))?);
            c.args(["netns", "exec", ns]).arg(chroot);
            c
        }
        None => Command::new(chroot),
    };
    cmd.arg(&run.root)
        .arg("/client")
        .args(urls(addr, paths))
        .env_clear()
        .env("TESTCASE", case)
        .env("SSLKEYLOGFILE", "/logs/keys.log");
    // After a copy, the exec can still meet ETXTBSY for the moment a
    // forked child holds the copy's descriptor: tried again, briefly.
    let mut tries = 0;
    let (ok, out, err) = loop {
        let (ok, out, err) = run_bounded(&mut cmd)?;
        tries += 1;
        if ok || tries == 5 || !err.contains("Text file busy") {
            break (ok, out, err);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    if !ok {
        let log = std::fs::read_to_string(run.root.join("logs/log.txt")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        return Err(anyhow::anyhow!(
            "quic-go interop client, {case}: {out}{err} (log ends: {tail:?})"
        ));
    }
    Ok(run)
}
