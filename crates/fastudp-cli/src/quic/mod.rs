//! `fastudp quic`: a QUIC server on fastudp in the paper's architecture
//! (`serve`), its baselines (plain quinn, TLS over TCP), and a load
//! generator (`load`). The server's engine is the `fastudp-quic` crate;
//! it answers HTTP/3 (ALPN `h3`) and HTTP/0.9 over QUIC (`hq-interop`,
//! see [`hq`]) on one port. The load generator speaks hq-interop.

pub mod access_log;
pub mod config;
pub mod lb;
mod load;
pub mod metrics;
pub mod proxy;
mod quinn_stack;
mod serve;
mod stats;
mod tcp;
pub mod tls;

pub use fastudp_quic::hq::wire as hq;
use fastudp_quic::limits;

use anyhow::anyhow;
use clap::{Args, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `fastudp quic ...`.
#[derive(Subcommand, Debug)]
pub enum QuicCmd {
    /// Serve HTTP/3 and hq-interop (HTTP/0.9 over QUIC) on one port: files
    /// with --www DIR, a reverse proxy with --upstream URL or routes in
    /// --config FILE, the test endpoints /bytes/N and /video/RATE/SECONDS
    /// with --test-endpoints.
    Serve(Box<ServeArgs>),
    /// Open many client connections to a server and report per-connection
    /// goodput, rate, stalls, loss and client CPU.
    Load(LoadArgs),
    /// Print the nftables ruleset of a stateless QUIC-LB load balancer for
    /// a fleet of `quic serve --server-id` (docs/SCALE-OUT.md).
    LbRules(LbRulesArgs),
}

/// `fastudp quic lb-rules`.
#[derive(Args, Debug)]
pub struct LbRulesArgs {
    /// The public address and port, where clients connect: the
    /// balancer's (ADDR:PORT).
    #[arg(long = "public", value_name = "ADDR:PORT")]
    pub public: SocketAddr,
    /// The fleet's QUIC-LB configuration, as the servers' --lb-config
    /// (ROTATION:SERVER_ID_LEN:NONCE_LEN, such as 0:1:8).
    #[arg(long, value_name = "R:S:N")]
    pub lb_config: String,
    /// A server: its --server-id (hexadecimal) and address, ID=ADDR (or
    /// ID=ADDR:PORT with the public port: servers listen on the public
    /// port). Repeat for each. Two IDs may name one address: to hand a
    /// dead server's connections to a peer, which resets them.
    #[arg(long = "server", value_name = "ID=ADDR", required = true)]
    pub servers: Vec<String>,
    /// A server ID that gets no new connections (its address leaves the
    /// hash of new connections; packets of its open ones still reach it).
    /// Repeat for several.
    #[arg(long, value_name = "ID")]
    pub drain: Vec<String>,
    /// Route every packet by a hash of the client's address and port only,
    /// as a balancer without QUIC-LB does: a client whose address or port
    /// changes lands on another server (for comparison).
    #[arg(long)]
    pub by_address: bool,
    /// Buckets of the hash that spreads new connections (1 to 4096): each
    /// is one server's, and draining a server moves its buckets only.
    #[arg(long, default_value_t = 64)]
    pub buckets: u32,
    /// The nftables table (ip or ip6 family, after the public address).
    #[arg(long, default_value = "fastudp_lb")]
    pub table: String,
}

/// Which server.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stack {
    /// quinn-proto driven by fastudp: reuseport workers steered by
    /// connection ID, batched GSO sends.
    Fastudp,
    /// Plain quinn on tokio with quinn's own socket (baseline).
    Quinn,
    /// rustls over TCP carrying the same requests (baseline).
    TlsTcp,
}

/// How `quic serve` paces.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PacingArg {
    /// quinn-proto's own pacer decides when each connection sends.
    Quic,
    /// quinn-proto's pacer, and each train's departure time passed down
    /// as SCM_TXTIME where an fq/etf qdisc honours it.
    Kernel,
}

/// `fastudp quic serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks one; the first line of output
    /// says which).
    #[arg(long, default_value = "0.0.0.0:4433")]
    pub listen: SocketAddr,
    /// The server.
    #[arg(long, value_enum, default_value = "fastudp")]
    pub stack: Stack,
    /// Worker threads (default: one per CPU; at most 256).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Pacing.
    #[arg(long, value_enum, default_value = "quic")]
    pub pacing: PacingArg,
    /// Send large trains with MSG_ZEROCOPY (the adaptive sender).
    #[arg(long)]
    pub zerocopy: bool,
    /// The most all connections together may send, bytes/s (k, M, G
    /// suffixes): bursts of at most --pacing-burst bytes leave no faster
    /// than this. Set it just under a bottleneck's rate. Default: no limit
    /// (each connection's own pacer only).
    #[arg(long, value_parser = crate::args::parse_rate)]
    pub total_rate: Option<u64>,
    /// With --total-rate, the most bytes a worker sends in one burst (1452
    /// to 65536): it wakes once per burst, so a larger one costs fewer
    /// wake-ups, but the bottleneck's queue must take it whole.
    #[arg(long, value_name = "BYTES", default_value_t = fastudp_quic::Tuning::default().pacing_burst)]
    pub pacing_burst: usize,
    /// Validate client addresses with Retry packets before accepting.
    #[arg(long)]
    pub retry: bool,
    /// Connections at most, server-wide; more are refused, or when full
    /// a newcomer may evict an idle one (docs/SECURITY.md). Default:
    /// --stack fastudp 1000000 (the memory budget bounds them first);
    /// other stacks 100000.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Connections at most from one client address (an IPv6 /64),
    /// server-wide, counted once the address is validated; more are
    /// refused. Default: a quarter of the places (--max-connections, or
    /// the light connections --max-memory holds), at least 1 (the number
    /// in force is printed at start). --stack fastudp only.
    #[arg(long)]
    pub max_connections_per_ip: Option<usize>,
    /// The most memory the server may hold, bytes (k, M, G suffixes): the
    /// process and its workers, and a budget over what connections hold
    /// (windows granted, request state, send windows) with the rest.
    /// Windows shrink for every connection above 3/4 of the budget; at
    /// the budget a newcomer is refused or evicts an idle connection
    /// (docs/SECURITY.md). Default: a quarter of the host's memory.
    /// --stack fastudp only.
    #[arg(long, value_parser = parse_bytes)]
    pub max_memory: Option<u64>,
    /// File descriptors responses of --www may hold open at once,
    /// server-wide; one client address may hold an eighth of them. A
    /// request past either is answered 503 and counted. Default: half of
    /// the open-file limit (raised to its hard limit at start) less 1024
    /// kept for the process. --stack fastudp only.
    #[arg(long)]
    pub max_open_files: Option<usize>,
    /// Seconds a client has to send a whole request line (hq-interop) or
    /// request header section (HTTP/3); a stream without one by then is
    /// reset with code 0x13 (HTTP/3: H3_REQUEST_INCOMPLETE) and counted.
    #[arg(long, default_value_t = limits::REQUEST_TIMEOUT.as_secs_f64())]
    pub request_timeout: f64,
    /// Handshakes from unvalidated addresses a worker keeps open at most;
    /// above it new clients get a Retry first (as with --retry), so a
    /// flood of Initials costs no connection state.
    #[arg(long, default_value_t = 1024)]
    pub max_half_open: usize,
    /// Milliseconds between the frames of a /video stream.
    #[arg(long, default_value_t = 40.0)]
    pub interval: f64,
    /// Seconds without a packet after which a connection is dropped,
    /// also during its handshake (30 s, as quinn and quic-go: under heavy
    /// loss a handshake can go that long between packets).
    #[arg(long, default_value_t = limits::IDLE_TIMEOUT.as_secs_f64())]
    pub idle_timeout: f64,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print a line of figures every second.
    #[arg(long)]
    pub stats: bool,
    /// Output JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Certificate chain (PEM, leaf first; RSA or ECDSA); with --key.
    /// Default: a self-signed one for localhost, whose SPKI SHA-256 is
    /// printed at start.
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Private key (PEM: PKCS#8, SEC1 or PKCS#1, unencrypted); with
    /// --cert.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Accept 0-RTT data from resuming clients. Off by default: early
    /// data can be replayed (docs/SECURITY.md). QUIC stacks only.
    #[arg(long = "0rtt")]
    pub zero_rtt: bool,
    /// The cryptography of TLS and QUIC packet protection (AES-GCM, header
    /// protection), every stack.
    #[arg(long, value_enum, default_value = "ring")]
    pub crypto: Crypto,
    /// Ask clients that support the ACK-frequency extension to acknowledge
    /// every Nth packet (at least 2; QUIC's default is every second).
    /// QUIC stacks only.
    #[arg(long, value_name = "N")]
    pub ack_every: Option<u32>,
    /// Datagrams per GSO train at most (1 to 44). --stack fastudp only.
    #[arg(long, default_value_t = fastudp_quic::Tuning::default().max_train)]
    pub max_train: usize,
    /// GSO trains one connection queues at most per loop turn. --stack
    /// fastudp only.
    #[arg(long, default_value_t = fastudp_quic::Tuning::default().trains_per_turn)]
    pub trains_per_turn: usize,
    /// Receive with io_uring: each datagram is read in place in the
    /// ring's provided buffers and copied once, into quinn-proto's buffer
    /// (docs/BENCHMARKS.md section 13). Where the kernel refuses io_uring,
    /// the workers receive with syscalls and a note says why. --stack
    /// fastudp only.
    #[arg(long)]
    pub uring: bool,
    /// The largest UDP payload path-MTU discovery probes for, bytes (1200
    /// to 9188): 1452 fits a 1500-byte MTU, 8972 a 9000-byte (jumbo)
    /// IPv4 path. QUIC stacks; plain quinn sends at most 10 datagrams per
    /// GSO call and quinn-udp drops a call over 64 KiB without a word
    /// (EMSGSIZE), so --stack quinn takes at most 6550.
    #[arg(long, value_name = "BYTES", default_value_t = fastudp_quic::DEFAULT_MAX_UDP_PAYLOAD)]
    pub max_udp_payload: u16,
    /// Copy received datagrams into shared 64 KiB blocks instead of one
    /// allocation each (no saving measured: docs/BENCHMARKS.md section
    /// 17). --stack fastudp only.
    #[arg(long)]
    pub recv_arena: bool,
    /// Round each worker's sleep until its next timer up to a multiple of
    /// this many microseconds (0 to 10000), as tokio rounds its timers to
    /// 1 ms: timers due within one tick fire in one wake-up, at most one
    /// tick late. 0: each timer at its own time. --stack fastudp only.
    #[arg(long, value_name = "US", default_value_t = fastudp_quic::DEFAULT_TIMER_TICK.as_micros() as u64)]
    pub timer_tick_us: u64,
    /// Before it sleeps, each worker polls its socket this many
    /// microseconds (0 to 1000) without sleeping: a datagram that arrives
    /// meanwhile costs no wake-up, but the polling is CPU time. --stack
    /// fastudp only.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub busy_poll_us: u64,
    /// Each worker starts a loop turn at most once per this many
    /// microseconds (0 to 1000): datagrams that arrive meanwhile wait and
    /// are read in one call, as a NIC's interrupt moderation does. Adds
    /// at most this much delay to a datagram. A worker holding many
    /// connections waits this much per 3,125 of them, up to 4000 (idle
    /// connections' keep-alives then cost fewer wake-ups; a busy worker
    /// does not wait). 0: a turn as soon as something arrives. --stack
    /// fastudp only.
    #[arg(long, value_name = "US", default_value_t = fastudp_quic::DEFAULT_RX_COALESCE.as_micros() as u64)]
    pub rx_coalesce_us: u64,
    /// Serve the files beneath DIR (hq-interop `GET /path`): regular
    /// files only, `index.html` for a directory, no symbolic links, no
    /// way out of DIR (docs/SECURITY.md, "Static files"). `/bytes/N` and
    /// `/video/RATE/SECONDS` keep their meaning and come first. Needs
    /// openat2(2) (Linux 5.6+). --stack fastudp only.
    #[arg(long, value_name = "DIR")]
    pub www: Option<PathBuf>,
    /// Also listen with TLS over TCP on the same address and port, with
    /// the same certificate (ALPN http/1.1), and answer HTTP/1.1 with the
    /// same content plus `Alt-Svc: h3=":PORT"; ma=86400`, so that a
    /// browser that starts over TCP moves to HTTP/3. Bounded as
    /// docs/SECURITY.md says ("HTTP/3 discovery over TCP"); uses
    /// --request-timeout and --idle-timeout. --stack fastudp only.
    #[arg(long)]
    pub alt_svc_tcp: bool,
    /// Be a reverse proxy: send every request to this HTTP/1.1 upstream
    /// (`http://HOST:PORT`), through a pool of kept-alive connections.
    /// Repeat for several upstreams, taken in turn; one that fails is
    /// skipped for a while. Requests over HTTP/3, and over TLS/TCP
    /// (HTTP/1.1 and HTTP/2, on the same port), are proxied; docs/PROXY.md.
    /// --stack fastudp only; not with --www.
    #[arg(long, value_name = "URL")]
    pub upstream: Vec<String>,
    /// How long an upstream may take to answer a request's head (seconds):
    /// past it the client gets 504.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub upstream_timeout: f64,
    /// This server's ID in a fleet behind a QUIC-LB load balancer
    /// (hexadecimal, as many bytes as --lb-config says): every connection
    /// ID it issues carries it, so that the balancer (`fastudp quic
    /// lb-rules`) sends each packet to this server whatever the client's
    /// address and port (docs/SCALE-OUT.md). With --lb-config. --stack
    /// fastudp only.
    #[arg(long, value_name = "HEX")]
    pub server_id: Option<String>,
    /// The fleet's QUIC-LB configuration, ROTATION:SERVER_ID_LEN:NONCE_LEN
    /// (config rotation 0 to 6, server ID 1 to 15 bytes, nonce at least 4;
    /// 19 bytes at most together), such as 0:1:8: connection IDs of 1 +
    /// SERVER_ID_LEN + NONCE_LEN bytes. With --server-id. --stack fastudp
    /// only.
    #[arg(long, value_name = "R:S:N")]
    pub lb_config: Option<String>,
    /// A file holding the secret the fleet's servers share (16 to 4096
    /// bytes, or hexadecimal digits: `openssl rand -hex 32`): stateless-reset
    /// tokens derive from it instead of a random key, so that any server
    /// can end the connections of one that died or restarted at once
    /// (docs/SCALE-OUT.md). Keep it as the TLS key is kept. --stack
    /// fastudp only.
    #[arg(long, value_name = "FILE")]
    pub reset_key: Option<PathBuf>,
    /// Serve the test endpoints: /bytes/N (N bytes of a pattern, up to 1
    /// TiB) and /video/RATE/SECONDS (paced frames), over HTTP/3,
    /// hq-interop and the TCP listener, before any file or route. Off by
    /// default: they are 404 like any missing path. For benchmarks and
    /// `quic load`; --stack quinn and tls-tcp serve nothing else, and
    /// need it.
    #[arg(long)]
    pub test_endpoints: bool,
    /// Write a line per HTTP request (HTTP/3 and the TCP listener) to
    /// FILE (appended to), or to standard output with `-`: time, client
    /// address, protocol, method, path, status, bytes sent, duration.
    /// Written by a thread of its own through a bounded queue; lines
    /// that find it full are dropped and counted (docs/PROXY.md).
    /// --stack fastudp only.
    #[arg(long, value_name = "FILE|-")]
    pub access_log: Option<PathBuf>,
    /// The access log's lines: `text` (the common log format's shape) or
    /// `json` (one object per line).
    #[arg(long, value_enum, default_value = "text")]
    pub access_log_format: access_log::LogFormat,
    /// Read the options, and routes (`[[route]]`: a path prefix to
    /// upstreams or to a directory), from this TOML file; an option on
    /// the command line wins over the file. Checked whole at start: an
    /// error names the file, the line and the key (docs/PROXY.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds an upstream whose connection failed is skipped before it
    /// is tried again (passive health; a 504 does not skip it).
    #[arg(long, value_name = "SECONDS", default_value_t = proxy::FAIL_DURATION.as_secs_f64())]
    pub upstream_fail_duration: f64,
    /// The routes of --config (file only).
    #[arg(skip)]
    pub routes: Vec<config::RouteSpec>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (plain HTTP/1.1
    /// over TCP; keep ADDR private, 127.0.0.1:9090 say): connections,
    /// handshakes, refusals by reason, requests by status class, bytes,
    /// datagrams, drops, the memory budget, and per-worker figures
    /// (docs/PROXY.md, "Operations"). --stack fastudp only.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// On SIGTERM or Ctrl-C, drain: refuse new connections, send GOAWAY
    /// (HTTP/3) and `connection: close` (HTTP/1.1), let the requests
    /// under way finish for up to this many seconds, then stop. 0: stop
    /// at once. A second signal stops at once. --stack fastudp only.
    #[arg(long, default_value_t = DRAIN_TIMEOUT.as_secs_f64(), value_name = "SECONDS")]
    pub drain_timeout: f64,
}

/// The default of `quic serve --drain-timeout`: 30 s (the systemd unit
/// gives the service longer to stop).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections at most of `--stack quinn` and `--stack tcp` when
/// --max-connections says nothing (`--stack fastudp`'s default is
/// [`fastudp_quic::DEFAULT_MAX_CONNECTIONS`], under its memory budget).
pub const MAX_CONNECTIONS: usize = 100_000;

/// A cryptography provider for rustls.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Crypto {
    /// ring.
    #[default]
    Ring,
    /// aws-lc-rs (AWS-LC).
    AwsLcRs,
}

/// Which client.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadStack {
    /// quinn clients (QUIC, hq-interop).
    Quic,
    /// rustls over TCP.
    TlsTcp,
}

/// `fastudp quic load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    /// The server: HOST:PORT, where HOST is an address (127.0.0.1, [::1])
    /// or a name (localhost), resolved once at the start.
    pub server: String,
    /// Client connections.
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// The request of every connection: /video/RATE/SECONDS or /bytes/N
    /// (the server's test endpoints: `quic serve --test-endpoints`), or,
    /// with --duration, any path.
    #[arg(long, default_value = "/video/125000/5")]
    pub request: String,
    /// Which protocol.
    #[arg(long, value_enum, default_value = "quic")]
    pub stack: LoadStack,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Client UDP sockets (QUIC endpoints) the connections share
    /// (default 1; with --source, one per source address, at most 1024;
    /// at most 256 without --duration, 65536 with it).
    #[arg(long)]
    pub endpoints: Option<usize>,
    /// Seconds over which to spread the connections' starts (clients that
    /// arrive over time, so that their frames do not all fall due at once).
    #[arg(long, default_value_t = 0.0)]
    pub ramp: f64,
    /// The server's frame interval in ms (a gap longer than two is a
    /// stall).
    #[arg(long, default_value_t = 40.0)]
    pub interval: f64,
    /// Give up on connections still running after this many seconds
    /// (default: the request's length plus 30 s).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Output JSON.
    #[arg(long)]
    pub json: bool,
    /// With --json: each connection's bytes received per bucket of this
    /// many ms from the load's start (`timelines`, with `started_unix_ms`),
    /// to see when each connection stalled and when it came back (10 to
    /// 10000 ms).
    #[arg(long, value_name = "MS")]
    pub timeline: Option<f64>,
    /// The cryptography of TLS and QUIC packet protection.
    #[arg(long, value_enum, default_value = "ring")]
    pub crypto: Crypto,
    /// Ask the server, if it supports the ACK-frequency extension, to
    /// acknowledge every Nth packet, and offer the extension to it (at
    /// least 2). QUIC only.
    #[arg(long, value_name = "N")]
    pub ack_every: Option<u32>,
    /// The largest UDP payload the clients take, bytes (1200 to 9188; the
    /// `max_udp_payload_size` they announce, which bounds the server's
    /// path-MTU discovery): 1472, quinn's, fits a 1500-byte MTU; 8972 a
    /// jumbo path. QUIC only.
    #[arg(long, value_name = "BYTES", default_value_t = LOAD_MAX_UDP_PAYLOAD)]
    pub max_udp_payload: u16,
    /// Hold the connections open this long (seconds, or with a suffix:
    /// 500ms, 90s, 10m), speaking HTTP/3: each connection's --request is
    /// any path, its body checked against the response's content-length,
    /// asked again every --request-every; a probe connection measures
    /// the wait of a new client throughout. QUIC only.
    #[arg(long, value_name = "TIME")]
    pub duration: Option<String>,
    /// Spread the connections over the local source addresses of this
    /// prefix (an address, or ADDR/LEN: 127.1.0.0/16, ::1/128): any
    /// 127.0.0.0/8 address binds on lo; others must be assigned to an
    /// interface here. With --duration.
    #[arg(long, value_name = "CIDR")]
    pub source: Option<String>,
    /// A keep-alive PING when a connection has sent nothing for this long
    /// (for example 15s), so that idle connections outlive the server's
    /// idle timeout (and a client that only receives notices at once a
    /// server that lost its connection, by the stateless reset its PING
    /// gets). Default: none.
    #[arg(long, value_name = "TIME")]
    pub keepalive: Option<String>,
    /// With --duration: each connection asks for --request again this
    /// often (for example 60s; at least 10ms), or with 0 as soon as its
    /// previous response is whole (back to back). Default: once, when it
    /// opens.
    #[arg(long, value_name = "TIME")]
    pub request_every: Option<String>,
    /// With --duration: the protocol, HTTP/3 (`h3`: any path, checked
    /// against its content-length) or HTTP/0.9 (`hq-interop`: /bytes/N
    /// and /video/... checked against their length; for servers without
    /// HTTP/3, such as `quic serve --stack quinn`).
    #[arg(long, value_enum, default_value = "h3")]
    pub alpn: LoadAlpn,
    /// With --duration: handshakes in flight at most while opening.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub concurrency: usize,
    /// With --duration: connections opened per second at most (default:
    /// as fast as --concurrency allows).
    #[arg(long, value_name = "PER_S")]
    pub rate: Option<f64>,
    /// With --duration: a new client (connect and first response) every
    /// this long, to measure what a new client waits; 0 for none.
    #[arg(long, value_name = "TIME", default_value = "1s")]
    pub probe_every: String,
    /// This many seconds after the start, every client endpoint moves to
    /// a new UDP socket, so its connections go on from a new source port,
    /// as after a NAT rebinding (quinn's `Endpoint::rebind`: the client
    /// takes a new connection ID of the server's if it has one). QUIC,
    /// without --duration.
    #[arg(long, value_name = "SECONDS")]
    pub rebind: Option<f64>,
    /// With --rebind: the new sockets' source address (one of this
    /// host's), so that the address changes too.
    #[arg(long, value_name = "ADDR")]
    pub rebind_address: Option<std::net::IpAddr>,
}

/// The protocol of `quic load --duration`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadAlpn {
    /// HTTP/3.
    H3,
    /// HTTP/0.9 over QUIC.
    HqInterop,
}

/// The default `quic load --max-udp-payload`: quinn's, a 1500-byte
/// Ethernet MTU less the IPv4 and UDP headers.
pub const LOAD_MAX_UDP_PAYLOAD: u16 = 1472;

/// Runs `fastudp quic ...`.
pub fn run(cmd: QuicCmd) -> anyhow::Result<()> {
    match cmd {
        QuicCmd::Serve(a) => {
            let mut a = *a;
            let origin = config::apply(&mut a, &crate::args::given_in_serve)?;
            check_serve(&a).map_err(|e| origin.locate(e))?;
            tls::use_crypto(a.crypto);
            match a.stack {
                Stack::Fastudp => serve::run(a).map_err(|e| origin.locate(e)),
                Stack::Quinn => quinn_stack::run(a),
                Stack::TlsTcp => tcp::run(a),
            }
        }
        QuicCmd::Load(a) => {
            if a.ack_every.is_some_and(|n| n < 2) {
                bail_usage!("--ack-every: at least 2");
            }
            if !(1200..=fastudp_quic::MAX_UDP_PAYLOAD_LIMIT).contains(&a.max_udp_payload) {
                bail_usage!(
                    "--max-udp-payload {}: between 1200 and {}",
                    a.max_udp_payload,
                    fastudp_quic::MAX_UDP_PAYLOAD_LIMIT
                );
            }
            tls::use_crypto(a.crypto);
            load::run(a)
        }
        QuicCmd::LbRules(a) => lb::run(a),
    }
}

/// The options of `quic serve`, alone and together: a value or a
/// combination that cannot work is a usage error, before anything starts.
fn check_serve(a: &ServeArgs) -> anyhow::Result<()> {
    let bad = |m: String| Err(crate::failure::usage(m));
    if let Some(w) = a.workers {
        if w == 0 || w > 256 {
            return bad(format!("--workers {w}: between 1 and 256"));
        }
    }
    if !(a.interval.is_finite() && a.interval >= 1.0 && a.interval <= 10_000.0) {
        return bad(format!("--interval {}: between 1 and 10000 ms", a.interval));
    }
    if !(a.idle_timeout.is_finite() && a.idle_timeout >= 0.1 && a.idle_timeout <= 3600.0) {
        return bad(format!(
            "--idle-timeout {}: between 0.1 and 3600 s",
            a.idle_timeout
        ));
    }
    if let Some(d) = a.duration {
        if !(d.is_finite() && d > 0.0 && d <= 1e6) {
            return bad(format!("--duration {d}: a positive number of seconds"));
        }
    }
    if a.ack_every.is_some_and(|n| n < 2) {
        return bad("--ack-every: at least 2".into());
    }
    if !(1..=fastudp_quic::MAX_TRAIN_LIMIT).contains(&a.max_train) {
        return bad(format!(
            "--max-train {}: between 1 and {}",
            a.max_train,
            fastudp_quic::MAX_TRAIN_LIMIT
        ));
    }
    if a.trains_per_turn == 0 {
        return bad("--trains-per-turn 0: at least 1".into());
    }
    let d = fastudp_quic::Tuning::default();
    // The wake-up switches: (flag, value in us, its largest, its default).
    let wakeups = [
        (
            "--timer-tick-us",
            a.timer_tick_us,
            fastudp_quic::MAX_TIMER_TICK,
            d.timer_tick,
        ),
        (
            "--busy-poll-us",
            a.busy_poll_us,
            fastudp_quic::MAX_BUSY_POLL,
            d.busy_poll,
        ),
        (
            "--rx-coalesce-us",
            a.rx_coalesce_us,
            fastudp_quic::MAX_RX_COALESCE,
            d.rx_coalesce,
        ),
    ];
    for (flag, us, max, _) in wakeups {
        if Duration::from_micros(us) > max {
            return bad(format!("{flag} {us}: between 0 and {}", max.as_micros()));
        }
    }
    if a.stack != Stack::Fastudp
        && wakeups
            .iter()
            .any(|&(_, us, _, default)| Duration::from_micros(us) != default)
    {
        return bad(
            "--timer-tick-us, --busy-poll-us and --rx-coalesce-us need --stack fastudp".into(),
        );
    }
    if !(1200..=fastudp_quic::MAX_UDP_PAYLOAD_LIMIT).contains(&a.max_udp_payload) {
        return bad(format!(
            "--max-udp-payload {}: between 1200 and {}",
            a.max_udp_payload,
            fastudp_quic::MAX_UDP_PAYLOAD_LIMIT
        ));
    }
    if a.stack == Stack::TlsTcp && a.max_udp_payload != fastudp_quic::DEFAULT_MAX_UDP_PAYLOAD {
        return bad(
            "--max-udp-payload is QUIC's: not with --stack tls-tcp (TCP takes the interface's MTU)"
                .into(),
        );
    }
    if a.max_connections == Some(0) {
        return bad("--max-connections 0: at least 1".into());
    }
    if a.max_connections_per_ip == Some(0) {
        return bad("--max-connections-per-ip 0: at least 1".into());
    }
    if a.stack != Stack::Fastudp && a.max_connections_per_ip.is_some() {
        return bad("--max-connections-per-ip needs --stack fastudp".into());
    }
    if !(a.request_timeout.is_finite() && a.request_timeout >= 0.01 && a.request_timeout <= 3600.0)
    {
        return bad(format!(
            "--request-timeout {}: between 0.01 and 3600 s",
            a.request_timeout
        ));
    }
    if a.stack == Stack::TlsTcp && a.zero_rtt {
        return bad("--0rtt is for the QUIC stacks (--stack fastudp or quinn)".into());
    }
    if a.stack != Stack::Fastudp && a.www.is_some() {
        return bad("--www needs --stack fastudp".into());
    }
    if a.stack != Stack::Fastudp && a.alt_svc_tcp {
        return bad("--alt-svc-tcp needs --stack fastudp".into());
    }
    if !a.upstream.is_empty() && a.stack != Stack::Fastudp {
        return bad("--upstream needs --stack fastudp".into());
    }
    if !a.upstream.is_empty() && a.www.is_some() {
        return bad("--upstream and --www: one or the other".into());
    }
    if !a.routes.is_empty() && a.stack != Stack::Fastudp {
        return bad("--config: routes need --stack fastudp".into());
    }
    if let Some(r) = a.routes.iter().find(|r| r.prefix == "/") {
        if !a.upstream.is_empty() || a.www.is_some() {
            return bad(format!(
                "--upstream or --www, and the route for / ({}): one or the other",
                r.place
            ));
        }
    }
    if a.stack != Stack::Fastudp && a.access_log.is_some() {
        return bad("--access-log needs --stack fastudp".into());
    }
    if !(a.upstream_fail_duration.is_finite()
        && a.upstream_fail_duration >= 0.0
        && a.upstream_fail_duration <= 86_400.0)
    {
        return bad(format!(
            "--upstream-fail-duration {}: between 0 and 86400 s",
            a.upstream_fail_duration
        ));
    }
    for u in &a.upstream {
        if let Err(e) = proxy::Upstream::parse(u) {
            return bad(format!("--upstream {u}: {e}"));
        }
    }
    if !(a.upstream_timeout.is_finite()
        && a.upstream_timeout >= 0.01
        && a.upstream_timeout <= 3600.0)
    {
        return bad(format!(
            "--upstream-timeout {}: between 0.01 and 3600 s",
            a.upstream_timeout
        ));
    }
    if !(a.drain_timeout.is_finite() && a.drain_timeout >= 0.0 && a.drain_timeout <= 3600.0) {
        return bad(format!(
            "--drain-timeout {}: between 0 and 3600 s",
            a.drain_timeout
        ));
    }
    if a.stack != Stack::Fastudp
        && (a.metrics.is_some() || a.drain_timeout != DRAIN_TIMEOUT.as_secs_f64())
    {
        return bad("--metrics and --drain-timeout need --stack fastudp".into());
    }
    if a.stack != Stack::Fastudp && a.uring {
        return bad("--uring needs --stack fastudp".into());
    }
    if a.max_open_files == Some(0) {
        return bad("--max-open-files 0: at least 1".into());
    }
    if a.stack != Stack::Fastudp && a.max_open_files.is_some() {
        return bad("--max-open-files needs --stack fastudp".into());
    }
    if a.stack != Stack::Fastudp && a.max_memory.is_some() {
        return bad("--max-memory needs --stack fastudp".into());
    }
    if a.max_half_open == 0 {
        return bad("--max-half-open 0: at least 1 (use --retry to validate every client)".into());
    }
    if !(fastudp_quic::MIN_PACING_BURST..=fastudp_quic::MAX_PACING_BURST).contains(&a.pacing_burst)
    {
        return bad(format!(
            "--pacing-burst {}: between {} and {} bytes",
            a.pacing_burst,
            fastudp_quic::MIN_PACING_BURST,
            fastudp_quic::MAX_PACING_BURST
        ));
    }
    if a.stack != Stack::Fastudp
        && (a.zerocopy || a.pacing == PacingArg::Kernel || a.total_rate.is_some())
    {
        return bad("--zerocopy, --pacing kernel and --total-rate need --stack fastudp".into());
    }
    if a.stack == Stack::TlsTcp && a.retry {
        return bad("--retry is QUIC's: not with --stack tls-tcp".into());
    }
    if a.stack != Stack::Fastudp
        && (a.server_id.is_some() || a.lb_config.is_some() || a.reset_key.is_some())
    {
        return bad("--server-id, --lb-config and --reset-key need --stack fastudp".into());
    }
    quic_lb(a)?;
    // Last: any other mistake of a baseline's options is named first.
    if a.stack != Stack::Fastudp && !a.test_endpoints {
        return bad(
            "--stack quinn and tls-tcp serve only the test endpoints (/bytes/N, /video/...): add --test-endpoints"
                .into(),
        );
    }
    Ok(())
}

/// `--server-id` with `--lb-config`: this server's QUIC-LB identity; one
/// without the other, or either malformed, is a usage error.
fn quic_lb(a: &ServeArgs) -> anyhow::Result<Option<fastudp_quic::lb::QuicLb>> {
    use fastudp_quic::lb::{LbConfig, QuicLb, ServerId};
    let bad = |m: String| Err(crate::failure::usage(m));
    match (&a.server_id, &a.lb_config) {
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => bad("--server-id and --lb-config go together".into()),
        (Some(id), Some(c)) => {
            let c = match LbConfig::parse(c) {
                Ok(c) => c,
                Err(e) => return bad(format!("--lb-config {e}")),
            };
            let id = match ServerId::parse_hex(id) {
                Ok(id) => id,
                Err(e) => return bad(format!("--server-id {e}")),
            };
            match QuicLb::new(c, id) {
                Ok(lb) => Ok(Some(lb)),
                Err(e) => bad(format!("--server-id: {e}")),
            }
        }
    }
}

/// `--reset-key FILE`, read: a file that cannot be read or holds no
/// usable secret is a usage error. A file others than its owner may read
/// is used, with a warning.
fn reset_key(a: &ServeArgs) -> anyhow::Result<Option<fastudp_quic::lb::ResetKey>> {
    let Some(path) = &a.reset_key else {
        return Ok(None);
    };
    let shown = path.display();
    let bytes = std::fs::read(path)
        .map_err(|e| crate::failure::usage(format!("--reset-key {shown}: {e}")))?;
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                eprintln!(
                    "fastudp: warning: --reset-key {shown} may be read by others than its owner (chmod 600): whoever has it can end any connection of the fleet"
                );
            }
        }
    }
    fastudp_quic::lb::ResetKey::from_file_contents(&bytes)
        .map(Some)
        .map_err(|e| crate::failure::usage(format!("--reset-key {shown}: {e}")))
}

/// The number of workers: as asked, or one per CPU.
fn workers(a: &ServeArgs) -> usize {
    a.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(256)
    })
}

/// Parses a byte count with an optional k, M, G suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| anyhow!("{s:?}: a byte count such as 512M or 2G"))?;
    if !(v.is_finite() && v > 0.0 && v * mul as f64 <= 1e15) {
        return Err(anyhow!("{s:?}: a positive byte count up to 1P"));
    }
    Ok((v * mul as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
        assert_eq!(parse_bytes("2G").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        for bad in ["", "-1G", "0", "x", "1T"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
