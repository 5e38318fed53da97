//! quinn on fastudp against quinn on its own socket (quinn-udp), in one
//! run, on loopback: throughput, client and server CPU per byte, and the
//! socket calls each side makes.
//!
//! ```sh
//! cargo run --release -p fastudp-io --features quinn --example quinn_bench
//! cargo run --release -p fastudp-io --features quinn --example quinn_bench -- \
//!     --workload many --conns 100 --conn-mb 10 --rounds 3
//! ```
//!
//! The server and the client each run on one thread (a current-thread
//! tokio runtime), so each side's CPU time is its thread's. Every byte is
//! checked at the server. Sockets alternate in each round (fastudp first in
//! odd rounds), and the table shows per-round ratios fastudp / quinn-udp
//! and their median, because absolute figures on a shared VM are noisy.

#[path = "../tests/it/support/quic.rs"]
mod quic;

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// The calls quinn made into one socket: each `try_send` is one send
/// syscall for both sockets, and each `poll_recv` that returns data one
/// receive syscall that returned data.
#[derive(Debug, Default)]
struct Counts {
    sends: AtomicU64,
    recvs: AtomicU64,
}

/// A socket whose calls are counted.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn AsyncUdpSocket>,
    counts: Arc<Counts>,
}

impl AsyncUdpSocket for Counting {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }
    fn try_send(&self, t: &Transmit<'_>) -> std::io::Result<()> {
        self.counts.sends.fetch_add(1, Relaxed);
        self.inner.try_send(t)
    }
    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<std::io::Result<usize>> {
        let r = self.inner.poll_recv(cx, bufs, meta);
        if matches!(r, Poll::Ready(Ok(_))) {
            self.counts.recvs.fetch_add(1, Relaxed);
        }
        r
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }
    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }
    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Fastudp,
    QuinnUdp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fastudp => "fastudp",
            Kind::QuinnUdp => "quinn-udp",
        }
    }

    /// The socket quinn runs on, and its call counts; built inside a
    /// tokio runtime.
    fn socket(self, std: std::net::UdpSocket) -> (Arc<dyn AsyncUdpSocket>, Arc<Counts>) {
        let inner: Arc<dyn AsyncUdpSocket> = match self {
            Kind::Fastudp => Arc::new(
                fastudp_io::Socket::from_std(std, fastudp_io::Config::default())
                    .and_then(fastudp_io::quinn::Socket::try_from)
                    .expect("fastudp socket"),
            ),
            Kind::QuinnUdp => quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, std)
                .expect("quinn-udp socket"),
        };
        let counts = Arc::new(Counts::default());
        (
            Arc::new(Counting {
                inner,
                counts: counts.clone(),
            }),
            counts,
        )
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    secs: f64,
    bytes: u64,
    server_cpu: f64,
    client_cpu: f64,
    client_sends: u64,
    client_recvs: u64,
    server_sends: u64,
    server_recvs: u64,
    server_drops: u64,
    client_drops: u64,
}

/// The kernel's drop count of the UDP socket bound at `port`, from
/// `/proc/net/udp` and `udp6` (its last column), whatever socket it is.
fn udp_drops(port: u16) -> u64 {
    let mut total = 0;
    for f in ["/proc/net/udp", "/proc/net/udp6"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                total += cols.last().and_then(|d| d.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// This thread's CPU time, in seconds.
fn cpu() -> f64 {
    fastudp_tools::os::thread_cpu_time().as_secs_f64()
}

/// One run: `conns` connections of `each` bytes from one client endpoint
/// to one server endpoint on `kind` sockets, on loopback at `ip`.
fn run(kind: Kind, ip: &str, conns: usize, each: u64) -> Measured {
    let (cert, key) = quic::certificate();
    let server_std = std::net::UdpSocket::bind(format!("{ip}:0")).expect("bind");
    let client_std = std::net::UdpSocket::bind(format!("{ip}:0")).expect("bind");
    let server_addr = server_std.local_addr().expect("addr");
    let client_port = client_std.local_addr().expect("addr").port();
    let start = Arc::new(std::sync::Barrier::new(2));
    let server = {
        let (cert, start) = (cert.clone(), start.clone());
        std::thread::Builder::new()
            .name("server".into())
            .spawn(move || {
                current_thread().block_on(async move {
                    let (sock, counts) = kind.socket(server_std);
                    let ep = quic::endpoint(sock, Some(quic::server_config(cert, key)));
                    start.wait();
                    let cpu0 = cpu();
                    let got = quic::serve(ep, conns).await;
                    let used = cpu() - cpu0;
                    assert!(got.iter().all(|&b| b == each), "every byte arrived");
                    (used, (counts, udp_drops(server_addr.port())))
                })
            })
            .expect("server thread")
    };
    let (client_cpu, secs, client_counts) = current_thread().block_on(async move {
        let (sock, counts) = kind.socket(client_std);
        let ep = quic::endpoint(sock, None);
        start.wait();
        let cpu0 = cpu();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..conns {
            let ep = ep.clone();
            let cfg = quic::client_config(cert.clone());
            tasks.push(tokio::spawn(async move {
                let conn = ep
                    .connect_with(cfg, server_addr, quic::SERVER_NAME)
                    .expect("connect")
                    .await
                    .expect("handshake");
                quic::send(&conn, i as u64 + 1, each).await;
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        let secs = t0.elapsed().as_secs_f64();
        (cpu() - cpu0, secs, (counts, udp_drops(client_port)))
    });
    let (client_counts, client_drops) = client_counts;
    let (server_cpu, (server_counts, server_drops)) = server.join().expect("server thread");
    Measured {
        secs,
        bytes: conns as u64 * each,
        server_cpu,
        client_cpu,
        client_sends: client_counts.sends.load(Relaxed),
        client_recvs: client_counts.recvs.load(Relaxed),
        server_sends: server_counts.sends.load(Relaxed),
        server_recvs: server_counts.recvs.load(Relaxed),
        server_drops,
        client_drops,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Options, from `--name value` pairs.
struct Opts {
    workload: String,
    bulk_mb: u64,
    conns: usize,
    conn_mb: u64,
    rounds: usize,
    ip: String,
    only: Option<Kind>,
}

fn parse() -> Opts {
    let mut o = Opts {
        workload: "both".into(),
        bulk_mb: 1024,
        conns: 100,
        conn_mb: 10,
        rounds: 3,
        ip: "127.0.0.1".into(),
        only: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        let num = |what: &str| -> u64 {
            v.parse()
                .ok()
                .filter(|&n: &u64| n > 0)
                .unwrap_or_else(|| die(&format!("{what} {v:?}: expected a positive number")))
        };
        match args[i].as_str() {
            "--workload" if ["bulk", "many", "both"].contains(&v.as_str()) => o.workload = v,
            "--workload" => die(&format!("--workload {v:?}: expected bulk, many or both")),
            "--bulk-mb" => o.bulk_mb = num("--bulk-mb"),
            "--conns" => o.conns = num("--conns") as usize,
            "--conn-mb" => o.conn_mb = num("--conn-mb"),
            "--rounds" => o.rounds = num("--rounds") as usize,
            "--only" if v == "fastudp" => o.only = Some(Kind::Fastudp),
            "--only" if v == "quinn-udp" => o.only = Some(Kind::QuinnUdp),
            "--only" => die(&format!("--only {v:?}: expected fastudp or quinn-udp")),
            "--ipv6" => {
                o.ip = "[::1]".into();
                i += 1;
                continue;
            }
            other => die(&format!(
                "unknown option {other:?} (--workload bulk|many|both, --bulk-mb N, --conns N, --conn-mb N, --rounds N, --only fastudp|quinn-udp, --ipv6)"
            )),
        }
        i += 2;
    }
    o
}

fn die(msg: &str) -> ! {
    eprintln!("quinn_bench: {msg}");
    std::process::exit(2)
}

fn main() {
    let o = parse();
    let mut workloads = Vec::new();
    if o.workload != "many" {
        workloads.push(("bulk (1 connection)", 1, o.bulk_mb << 20));
    }
    if o.workload != "bulk" {
        workloads.push(("many (concurrent connections)", o.conns, o.conn_mb << 20));
    }
    println!(
        "quinn on fastudp vs quinn on quinn-udp, loopback {}, {} rounds",
        o.ip, o.rounds
    );
    for (name, conns, each) in workloads {
        println!("\n{name}: {conns} x {} MiB", each >> 20);
        println!(
            "{:<10} {:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "socket",
            "MB/s",
            "client ns/B",
            "server ns/B",
            "cli sends/s",
            "srv recvs/s",
            "srv sends/s",
            "cli recvs/s"
        );
        let mut ratios: [Vec<f64>; 3] = Default::default();
        for round in 0..o.rounds {
            let order = if round % 2 == 0 {
                [Kind::Fastudp, Kind::QuinnUdp]
            } else {
                [Kind::QuinnUdp, Kind::Fastudp]
            };
            let mut got = Vec::new();
            for k in order.into_iter().filter(|k| o.only.is_none_or(|x| x == *k)) {
                let m = run(k, &o.ip, conns, each);
                println!(
                    "{:<10} {:>8.0} {:>12.3} {:>12.3} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>9} {:>9}",
                    k.name(),
                    m.bytes as f64 / m.secs / 1e6,
                    m.client_cpu * 1e9 / m.bytes as f64,
                    m.server_cpu * 1e9 / m.bytes as f64,
                    m.client_sends as f64 / m.secs,
                    m.server_recvs as f64 / m.secs,
                    m.server_sends as f64 / m.secs,
                    m.client_recvs as f64 / m.secs,
                    m.server_drops,
                    m.client_drops,
                );
                got.push((k, m));
            }
            if o.only.is_some() {
                continue;
            }
            let f = got.iter().find(|x| x.0 == Kind::Fastudp).unwrap().1;
            let q = got.iter().find(|x| x.0 == Kind::QuinnUdp).unwrap().1;
            ratios[0].push(q.secs / f.secs);
            ratios[1].push(f.client_cpu / q.client_cpu);
            ratios[2].push(f.server_cpu / q.server_cpu);
        }
        if o.only.is_some() {
            continue;
        }
        println!(
            "fastudp / quinn-udp, median of {} rounds: throughput {:.2}x, client CPU/B {:.2}x, server CPU/B {:.2}x",
            o.rounds,
            median(ratios[0].clone()),
            median(ratios[1].clone()),
            median(ratios[2].clone()),
        );
    }
}
