//! A fleet of `quic serve --server-id` behind the kernel's own balancer:
//! `quic lb-rules` checked by nftables, and (as root) the `fleet` testbed
//! with traffic.

use crate::common::{self, fastudp};
use std::io::Write;
use std::process::{Command, Stdio};

/// `nft -c -f -` on `rules`: the kernel and nft check the ruleset without
/// loading it. Its error output on failure.
fn nft_check(rules: &str) -> Result<(), String> {
    let mut c = Command::new("nft")
        .args(["-c", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nft");
    c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    if o.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

fn lb_rules(extra: &[&str]) -> String {
    let mut args = vec!["quic", "lb-rules"];
    args.extend_from_slice(extra);
    let o = fastudp(&args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Every shape of ruleset `lb-rules` prints is one nftables takes: IPv4
/// and IPv6, 1- and 15-byte server IDs, a drained server, routing by
/// address only. A broken rule is refused by the check (shown with one).
#[test]
fn lb_rules_are_valid_nftables() {
    if !common::privileged("fleet::lb_rules_are_valid_nftables", &["nft"]) {
        return;
    }
    let v4 = [
        "--public",
        "10.201.0.2:4433",
        "--server",
        "01=10.202.1.2",
        "--server",
        "02=10.202.2.2:4433",
        "--server",
        "03=10.202.3.2",
    ];
    let long_id = format!("{}=fd00:fa58:1::2", "ab".repeat(15));
    let v6 = [
        "--public",
        "[fd00:fa58::2]:443",
        "--lb-config",
        "2:15:4",
        "--server",
        &long_id,
    ];
    let cases: Vec<Vec<&str>> = vec![
        [&v4[..], &["--lb-config", "0:1:8"]].concat(),
        [&v4[..], &["--lb-config", "6:1:18", "--drain", "02"]].concat(),
        [
            &v4[..],
            &["--lb-config", "0:1:8", "--by-address", "--buckets", "3"],
        ]
        .concat(),
        v6.to_vec(),
    ];
    for args in cases {
        let rules = lb_rules(&args);
        if let Err(e) = nft_check(&rules) {
            panic!("{args:?}: nft refuses the rules: {e}\n{rules}");
        }
    }
    // The check can fail: a rule nftables does not know.
    let broken = lb_rules(&[&v4[..], &["--lb-config", "0:1:8"]].concat())
        .replace("notrack goto quic", "notrack goto nowhere");
    assert!(nft_check(&broken).is_err(), "a broken ruleset passed");
}

/// What cannot make a ruleset is refused with status 2 and one line.
#[test]
fn lb_rules_refuses_bad_plans() {
    let base = ["quic", "lb-rules", "--public", "10.0.0.1:4433"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    common::assert_refused(&[
        (
            with(&["--lb-config", "7:1:8", "--server", "01=10.0.0.2"]),
            "config rotation 7",
        ),
        (
            with(&["--lb-config", "0:2:8", "--server", "01=10.0.0.2"]),
            "says 2",
        ),
        (
            with(&["--lb-config", "0:1:8", "--server", "01=10.0.0.2:99"]),
            "public port",
        ),
        (
            with(&[
                "--lb-config",
                "0:1:8",
                "--server",
                "01=10.0.0.2",
                "--drain",
                "01",
            ]),
            "every server is drained",
        ),
        (
            with(&["--lb-config", "0:1:3", "--server", "01=10.0.0.2"]),
            "nonce length 3",
        ),
    ]);
}

/// `quic serve`'s QUIC-LB options: together, well formed, for the
/// fastudp stack; an unreadable or short reset key is refused.
#[test]
fn serve_refuses_bad_fleet_options() {
    let dir = std::env::temp_dir().join(format!("fastudp-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.key");
    std::fs::write(&short, "0011").unwrap();
    let short = short.to_str().unwrap().to_string();
    let short: &'static str = Box::leak(short.into_boxed_str());
    let base = [
        "quic",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "1",
    ];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    common::assert_refused(&[
        (with(&["--server-id", "01"]), "go together"),
        (with(&["--lb-config", "0:1:8"]), "go together"),
        (
            with(&["--server-id", "0102", "--lb-config", "0:1:8"]),
            "the configuration says 1",
        ),
        (
            with(&["--server-id", "xy", "--lb-config", "0:1:8"]),
            "hexadecimal",
        ),
        (
            with(&["--server-id", "01", "--lb-config", "0:0:8"]),
            "server ID length 0",
        ),
        (
            with(&["--reset-key", "/nonexistent/fastudp.key"]),
            "--reset-key",
        ),
        (with(&["--reset-key", short]), "16 to 4096 bytes"),
        (
            with(&[
                "--stack",
                "quinn",
                "--server-id",
                "01",
                "--lb-config",
                "0:1:8",
            ]),
            "need --stack fastudp",
        ),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- The fleet testbed, with traffic (root, nft, ip). ----

use crate::common::Running;

/// The fleet's servers: namespace, address, ID (as `testbed up fleet`
/// builds them).
const SERVERS: [(&str, &str, &str); 3] = [
    ("fastudp-s1", "10.202.1.2", "01"),
    ("fastudp-s2", "10.202.2.2", "02"),
    ("fastudp-s3", "10.202.3.2", "03"),
];
const PUBLIC: &str = "10.201.0.2:4433";
const LB_CONFIG: &str = "0:1:8";
const BIN: &str = env!("CARGO_BIN_EXE_fastudp");

/// The fleet testbed, up while this lives; the servers run in it.
struct Fleet {
    servers: Vec<Option<Running>>,
    key: std::path::PathBuf,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Fleet {
    /// Builds the fleet and starts its three servers with a shared reset
    /// key. `None` (after saying why) when this host cannot.
    fn up(test: &str) -> Option<Fleet> {
        if !common::privileged(test, &["ip", "nft", "ethtool"]) {
            return None;
        }
        let lock = common::testbed_lock();
        let o = fastudp(&["testbed", "up", "fleet"]);
        assert!(
            o.status.success(),
            "testbed up fleet: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let key = std::env::temp_dir().join(format!("fastudp-fleet-{}.key", std::process::id()));
        std::fs::write(
            &key,
            "8f1e0c2b9a7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f\n",
        )
        .unwrap();
        let mut f = Fleet {
            servers: Vec::new(),
            key,
            _lock: lock,
        };
        for i in 0..SERVERS.len() {
            f.servers.push(Some(f.start(i)));
        }
        Some(f)
    }

    /// Starts server `i` (2 workers, JSON lines, a line of figures every
    /// second), once it listens.
    fn start(&self, i: usize) -> Running {
        let (ns, addr, id) = SERVERS[i];
        let listen = format!("{addr}:4433");
        let mut r = Running::start_with(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                BIN,
                "quic",
                "serve",
                "--listen",
                &listen,
                "--workers",
                "2",
                "--lb-config",
                LB_CONFIG,
                "--server-id",
                id,
                "--reset-key",
                self.key.to_str().unwrap(),
                "--test-endpoints",
                "--json",
                "--stats",
                "--duration",
                "300",
            ],
        );
        r.wait_for_line(|l| l.contains("\"listening\""));
        r
    }

    /// The number of connections server `i` has accepted so far: from a
    /// line of figures printed after this call.
    fn accepted_now(&mut self, i: usize) -> u64 {
        let r = self.servers[i].as_mut().expect("server running");
        r.skip_queued();
        let l = r.wait_for_line(|l| l.contains("\"accepted\""));
        let v: serde_json::Value = serde_json::from_str(&l).expect("a JSON line");
        v["accepted"].as_u64().expect("accepted")
    }

    /// Loads `lb-rules` with `extra` options into the balancer.
    fn rules(&self, extra: &[&str]) {
        let mut args = vec!["--public", PUBLIC, "--lb-config", LB_CONFIG];
        let specs: Vec<String> = SERVERS
            .iter()
            .map(|(_, a, id)| format!("{id}={a}"))
            .collect();
        for s in &specs {
            args.extend(["--server", s]);
        }
        args.extend_from_slice(extra);
        let rules = lb_rules(&args);
        load_rules(&rules);
    }

    /// Stops the servers still running; each one's summary line.
    fn stop(&mut self) -> Vec<Option<serde_json::Value>> {
        self.servers
            .iter_mut()
            .map(|s| {
                let r = s.take()?;
                r.interrupt();
                let e = r.finish();
                e.stdout
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .find(|v| v["kind"] == "summary")
            })
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for r in self.servers.iter_mut().filter_map(Option::take) {
            drop(r);
        }
        let _ = fastudp(&["testbed", "down"]);
        let _ = std::fs::remove_file(&self.key);
    }
}

/// Loads `rules` into the balancer's namespace.
fn load_rules(rules: &str) {
    let mut c = Command::new("ip")
        .args(["netns", "exec", "fastudp-lb", "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `quic load` from the clients' namespace to the public address; its
/// JSON summary (whether or not every connection completed).
fn load(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "netns",
        "exec",
        "fastudp-cl",
        BIN,
        "quic",
        "load",
        PUBLIC,
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = Command::new("ip")
        .args(&args)
        .output()
        .expect("run quic load");
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!(
            "{args:?}: {e}: {out} {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// 300 connections through the balancer: spread over the three servers
/// by the hash of their address and port, each on one server only (the
/// servers' counts add up to 300), each response byte-exact.
#[test]
fn fleet_spreads_connections_over_three_servers() {
    let Some(mut f) = Fleet::up("fleet::fleet_spreads_connections_over_three_servers") else {
        return;
    };
    let s = load(&[
        "--connections",
        "300",
        "--endpoints",
        "100",
        "--request",
        "/bytes/50000",
    ]);
    assert_eq!(n(&s, "completed"), 300, "{s}");
    assert_eq!(n(&s, "wrong_bytes"), 0, "{s}");
    let sums = f.stop();
    let accepted: Vec<u64> = sums
        .iter()
        .map(|v| n(v.as_ref().expect("a summary"), "accepted"))
        .collect();
    assert_eq!(accepted.iter().sum::<u64>(), 300, "{accepted:?}");
    assert!(
        accepted.iter().all(|&a| a > 0),
        "a server got nothing: {accepted:?}"
    );
}

/// Clients move to a new address and port mid-transfer: through QUIC-LB
/// every transfer completes on its server; through a balancer that hashes
/// address and port only, connections land on servers that do not hold
/// them, which reset them.
#[test]
fn fleet_keeps_rebinding_clients_on_their_server() {
    let Some(mut f) = Fleet::up("fleet::fleet_keeps_rebinding_clients_on_their_server") else {
        return;
    };
    let args = [
        "--connections",
        "48",
        "--endpoints",
        "12",
        "--request",
        "/video/250000/3",
        "--rebind",
        "1",
        "--rebind-address",
        "10.201.0.3",
        "--timeout",
        "20",
    ];
    let s = load(&args);
    assert_eq!(n(&s, "rebound_endpoints"), 12, "{s}");
    assert_eq!(n(&s, "completed"), 48, "{s}");
    assert_eq!(n(&s, "wrong_bytes"), 0, "{s}");
    assert_eq!(n(&s, "stateless_resets"), 0, "{s}");
    // The same against a balancer without QUIC-LB.
    f.rules(&["--by-address"]);
    let s = load(&args);
    assert_eq!(n(&s, "rebound_endpoints"), 12, "{s}");
    assert!(
        n(&s, "failed") > 0,
        "no transfer broke without QUIC-LB: {s}"
    );
    assert!(n(&s, "stateless_resets") > 0, "{s}");
    eprintln!(
        "by address only: {} of 48 transfers broke after the rebind, {} by a stateless reset",
        n(&s, "failed"),
        n(&s, "stateless_resets")
    );
    f.stop();
}

/// A drained server gets no new connection, and its open ones finish.
#[test]
fn fleet_drain_lets_open_connections_finish() {
    let Some(mut f) = Fleet::up("fleet::fleet_drain_lets_open_connections_finish") else {
        return;
    };
    // Long transfers, open before the drain.
    let open = Running::start_with(
        "ip",
        &[
            "netns",
            "exec",
            "fastudp-cl",
            BIN,
            "quic",
            "load",
            PUBLIC,
            "--json",
            "--connections",
            "30",
            "--endpoints",
            "30",
            "--request",
            "/video/125000/10",
        ],
    );
    // Every one of them accepted somewhere before the drain.
    let deadline = std::time::Instant::now() + common::STALL;
    while (0..3).map(|i| f.accepted_now(i)).sum::<u64>() < 30 {
        assert!(
            std::time::Instant::now() < deadline,
            "the 30 connections did not open"
        );
    }
    let on_two = f.accepted_now(1);
    assert!(on_two > 0, "server 02 holds none of the open connections");
    f.rules(&["--drain", "02"]);
    let s = load(&[
        "--connections",
        "90",
        "--endpoints",
        "90",
        "--request",
        "/bytes/20000",
    ]);
    assert_eq!(n(&s, "completed"), 90, "{s}");
    assert_eq!(
        f.accepted_now(1),
        on_two,
        "the drained server took new connections"
    );
    let e = open.finish();
    let s: serde_json::Value = serde_json::from_str(e.stdout.trim()).expect(&e.stdout);
    assert_eq!(n(&s, "completed"), 30, "an open connection broke: {s}");
    assert_eq!(n(&s, "wrong_bytes"), 0, "{s}");
    f.stop();
}

/// A server killed: the balancer hands its server ID to a peer, whose
/// stateless reset (the shared key's token) ends its clients' connections
/// at their next packet, not at their idle timeout; new connections land
/// on the two others.
#[test]
fn fleet_resets_a_dead_servers_clients_from_a_peer() {
    let Some(mut f) = Fleet::up("fleet::fleet_resets_a_dead_servers_clients_from_a_peer") else {
        return;
    };
    let open = Running::start_with(
        "ip",
        &[
            "netns",
            "exec",
            "fastudp-cl",
            BIN,
            "quic",
            "load",
            PUBLIC,
            "--json",
            "--connections",
            "30",
            "--endpoints",
            "30",
            "--request",
            "/video/125000/10",
            "--keepalive",
            "300ms",
            "--timeout",
            "25",
        ],
    );
    let deadline = std::time::Instant::now() + common::STALL;
    while (0..3).map(|i| f.accepted_now(i)).sum::<u64>() < 30 {
        assert!(
            std::time::Instant::now() < deadline,
            "the 30 connections did not open"
        );
    }
    let on_three = f.accepted_now(2);
    assert!(on_three > 0, "server 03 holds none of the open connections");
    // Killed (SIGKILL: no close frames), and its ID given to server 01.
    drop(f.servers[2].take());
    let specs = [
        "--server",
        "01=10.202.1.2",
        "--server",
        "02=10.202.2.2",
        "--server",
        "03=10.202.1.2",
    ];
    let rules = lb_rules(
        &[
            &["--public", PUBLIC, "--lb-config", LB_CONFIG][..],
            &specs[..],
        ]
        .concat(),
    );
    load_rules(&rules);
    let e = open.finish();
    let s: serde_json::Value = serde_json::from_str(e.stdout.trim()).expect(&e.stdout);
    let failed = n(&s, "failed");
    assert_eq!(
        failed, on_three,
        "the dead server's connections, and only they, failed: {s}"
    );
    assert_eq!(
        n(&s, "stateless_resets"),
        failed,
        "each ended by a stateless reset, none by a timeout: {s}"
    );
    // New connections go to the living.
    let s = load(&[
        "--connections",
        "60",
        "--endpoints",
        "60",
        "--request",
        "/bytes/20000",
    ]);
    assert_eq!(n(&s, "completed"), 60, "{s}");
    f.stop();
}
