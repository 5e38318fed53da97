//! `fastudp quic serve` for the QUIC tests (`quic`, `quic_clients`,
//! `h3_attacks`): started with `--json --stats`, its address read from its
//! `listening` line, and its stats lines waited for.

use super::Running;
use serde_json::Value;
use std::net::SocketAddr;

/// The server binary: this build's, or `FASTUDP_QUIC_SERVER_BIN` (to run
/// a test against another build, as when checking that a test fails
/// without its fix; the clients stay this build's).
pub fn server_bin() -> String {
    std::env::var("FASTUDP_QUIC_SERVER_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_fastudp").to_string())
}

/// A server started with `args` (plus `--json --stats --test-endpoints`,
/// as the benchmarks run it, and `--listen 127.0.0.1:0` when `args` name
/// no address: a test never takes 4433, the default a user's server may
/// hold), and its address.
pub fn serve(args: &[&str]) -> (Running, SocketAddr) {
    let mut all = vec!["--test-endpoints"];
    all.extend_from_slice(args);
    serve_without_test_endpoints(&all)
}

/// [`serve`] without `--test-endpoints`.
pub fn serve_without_test_endpoints(args: &[&str]) -> (Running, SocketAddr) {
    let mut all = vec!["quic", "serve", "--json", "--stats"];
    if !args.contains(&"--listen") {
        all.extend_from_slice(&["--listen", "127.0.0.1:0"]);
    }
    all.extend_from_slice(args);
    let mut r = Running::start_with(&server_bin(), &all);
    let l = r.wait_for_line(|l| l.contains("\"listening\""));
    let v: Value = serde_json::from_str(&l).expect("JSON line");
    let addr = v["addr"].as_str().unwrap().parse().unwrap();
    (r, addr)
}

/// The next `--stats` line of a server that satisfies `want`.
pub fn stats_until(r: &mut Running, want: impl Fn(&Value) -> bool) -> Value {
    let l = r.wait_for_line(|l| {
        serde_json::from_str::<Value>(l)
            .map(|v| v["kind"] == "stats" && want(&v))
            .unwrap_or(false)
    });
    serde_json::from_str(&l).unwrap()
}
