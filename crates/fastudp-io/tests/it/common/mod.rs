//! Shared helpers for the integration tests: self-checking datagrams, a
//! flow-controlled sender/receiver pair, and network-namespace plumbing.
#![allow(dead_code)]

use fastudp_io::UdpIo;
use fastudp_io::{Coalescer, Config, Feature, RecvBatch, Socket, Transmit};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether this run of the tests asks for the io_uring backend:
/// `FASTUDP_BACKEND=uring` (the uring feature's second pass of the
/// integrity tests, see .ci/run). The library reads no such variable; this
/// test hook maps it to [`Config::uring`] for every socket the tests make
/// ([`backend`], [`bind`], [`bind_with`], [`from_std`], [`state`]).
pub fn uring_run() -> bool {
    match std::env::var("FASTUDP_BACKEND") {
        Err(_) => false,
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "uring" | "io_uring" => true,
            "" | "syscall" | "syscalls" => false,
            other => panic!("FASTUDP_BACKEND: unknown backend '{other}' (known: uring, syscall)"),
        },
    }
}

/// `config` on the backend this run asks for ([`uring_run`]), with the
/// features `FASTUDP_DISABLE` (such as `gso,gro`) switches off added to
/// its own. The library reads no environment variable; this test hook maps
/// the variable to [`Config::disable`] for every socket the tests make.
pub fn backend(config: Config) -> Config {
    let env = match std::env::var("FASTUDP_DISABLE") {
        Ok(v) => Feature::parse_list(&v).expect("FASTUDP_DISABLE"),
        Err(_) => Vec::new(),
    };
    let config = config.disable(env);
    #[cfg(feature = "uring")]
    if uring_run() {
        return config.uring(true);
    }
    config
}

/// `Socket::bind` on this run's backend.
pub fn bind(addr: SocketAddr) -> Result<Socket, fastudp_io::Error> {
    Socket::bind(addr, backend(Config::default()))
}

/// `Socket::bind_with` on this run's backend.
pub fn bind_with(addr: SocketAddr, config: Config) -> Result<Socket, fastudp_io::Error> {
    Socket::bind(addr, backend(config))
}

/// `Socket::from_std` on this run's backend.
pub fn from_std(sock: std::net::UdpSocket) -> Result<Socket, fastudp_io::Error> {
    Socket::from_std(sock, backend(Config::default()))
}

/// `Socket::from_std_with` on this run's backend.
pub fn from_std_with(
    sock: std::net::UdpSocket,
    config: Config,
) -> Result<Socket, fastudp_io::Error> {
    Socket::from_std(sock, backend(config))
}

/// `UdpState::new` on this run's backend.
pub fn state(
    sock: impl std::os::fd::AsFd,
    config: Config,
) -> Result<fastudp_io::UdpState, fastudp_io::Error> {
    fastudp_io::UdpState::new(sock, backend(config))
}

/// Bytes of header a self-checking datagram carries (seq, len, checksum).
pub const HDR: usize = 16;

/// FNV-1a over a byte slice.
pub fn fnv(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// Writes datagram `seq` of `len` bytes into `out`.
pub fn fill(seq: u64, len: usize, out: &mut Vec<u8>) {
    let at = out.len();
    if len < HDR {
        out.extend((0..len).map(|i| ((seq % 251) as u8).wrapping_add(i as u8)));
        return;
    }
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend((HDR..len).map(|i| {
        (seq as u8)
            .wrapping_mul(31)
            .wrapping_add((i as u8).wrapping_mul(7))
    }));
    let c = fnv(&out[at + HDR..]);
    out[at + 12..at + 16].copy_from_slice(&c.to_le_bytes());
}

/// The mixed size pattern: runs of `g`, then g-1, g+1, 1, and now and then
/// the largest payload allowed.
pub fn size_of_seq(seq: u64, g: usize, max: usize) -> usize {
    let block = seq / 25;
    match seq % 25 {
        0..=19 => g,
        20 => g - 1,
        21 => g + 1,
        22 => 1,
        23 => g,
        _ if block % 40 == 0 => max,
        _ => g + 1,
    }
}

/// Verifies every datagram, once, intact.
pub struct Checker {
    total: u64,
    seen: Vec<bool>,
    small_expected: [u64; 251],
    small_seen: [u64; 251],
    pub received: u64,
    pub bytes: u64,
    g: usize,
    max: usize,
    uniform: Option<usize>,
}

impl Checker {
    /// A checker for datagrams of `len` bytes each.
    pub fn uniform(total: u64, len: usize) -> Self {
        let mut c = Checker::new(total, len, len);
        c.uniform = Some(len);
        c.small_expected = [0; 251];
        if len < HDR {
            for s in 0..total {
                c.small_expected[(s % 251) as usize] += 1;
            }
        }
        c
    }

    fn size(&self, s: u64) -> usize {
        self.uniform
            .unwrap_or_else(|| size_of_seq(s, self.g, self.max))
    }

    /// A checker for the mixed pattern of [`size_of_seq`].
    pub fn new(total: u64, g: usize, max: usize) -> Self {
        let mut small_expected = [0u64; 251];
        for s in 0..total {
            if size_of_seq(s, g, max) < HDR {
                small_expected[(s % 251) as usize] += 1;
            }
        }
        Checker {
            total,
            seen: vec![false; total as usize],
            small_expected,
            small_seen: [0; 251],
            received: 0,
            bytes: 0,
            g,
            max,
            uniform: None,
        }
    }

    /// Checks one received datagram; panics on corruption or a duplicate.
    pub fn check(&mut self, d: &[u8]) {
        self.received += 1;
        self.bytes += d.len() as u64;
        if d.len() < HDR {
            assert_eq!(d.len(), 1, "unexpected short datagram of {} bytes", d.len());
            let r = d[0] as usize;
            assert!(r < 251, "bad small datagram value {r}");
            self.small_seen[r] += 1;
            assert!(
                self.small_seen[r] <= self.small_expected[r],
                "duplicate 1-byte datagram with residue {r}"
            );
            return;
        }
        let seq = u64::from_le_bytes(d[..8].try_into().unwrap());
        let len = u32::from_le_bytes(d[8..12].try_into().unwrap()) as usize;
        let sum = u32::from_le_bytes(d[12..16].try_into().unwrap());
        assert!(seq < self.total, "sequence {seq} out of range");
        assert_eq!(
            len,
            d.len(),
            "datagram {seq}: length field {len} but {} bytes arrived",
            d.len()
        );
        assert_eq!(sum, fnv(&d[HDR..]), "datagram {seq}: checksum mismatch");
        assert!(!self.seen[seq as usize], "datagram {seq} arrived twice");
        self.seen[seq as usize] = true;
    }

    /// Panics unless every datagram arrived (or `drops` accounts for the
    /// missing ones).
    pub fn finish(&self, drops: u64) {
        assert_eq!(
            self.received + drops,
            self.total,
            "sent {} datagrams, received {}, kernel reported {} drops",
            self.total,
            self.received,
            drops
        );
        if drops == 0 {
            let missing = (0..self.total)
                .filter(|&s| self.size(s) >= HDR && !self.seen[s as usize])
                .count();
            assert_eq!(missing, 0, "{missing} datagrams never arrived");
            assert_eq!(
                self.small_seen, self.small_expected,
                "1-byte datagram counts differ"
            );
        }
    }
}

/// How the test sender sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxMode {
    /// One datagram per sendmsg.
    Plain,
    /// Single datagrams, many per sendmmsg.
    Mmsg,
    /// GSO trains, one per sendmsg.
    Gso,
    /// GSO trains, many per sendmmsg.
    MmsgGso,
}

/// How the test receiver receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxMode {
    /// One datagram per recvmsg.
    Recvmsg,
    /// Many datagrams per recvmmsg.
    Recvmmsg,
    /// recvmmsg with UDP GRO.
    Gro,
}

pub fn tx_config(m: TxMode) -> Config {
    let gso = matches!(m, TxMode::Plain | TxMode::Mmsg).then_some(Feature::Gso);
    let mmsg = matches!(m, TxMode::Plain | TxMode::Gso).then_some(Feature::Mmsg);
    Config::default()
        .gro(false)
        .disable(gso.into_iter().chain(mmsg))
}

pub fn rx_config(m: RxMode) -> Config {
    let mmsg = (m == RxMode::Recvmsg).then_some(Feature::Mmsg);
    Config::default()
        .gro(m == RxMode::Gro)
        .disable(mmsg)
        .recv_buffer(8 << 20)
}

/// The outcome of one transfer.
#[derive(Debug)]
pub struct Transfer {
    pub sent: u64,
    pub received: u64,
    pub rx_messages: u64,
    pub tx_calls: u64,
    pub tx_messages: u64,
    pub drops: u64,
    /// Drops at the per-CPU input backlog (`/proc/net/softnet_stat`)
    /// during the transfer, which no socket counter sees: a veth or
    /// loopback delivers through it, and tests running at the same time
    /// share it. Host-wide, so an upper bound of this transfer's share.
    pub backlog_drops: u64,
    /// Datagrams that never arrived, every one of them explained by a
    /// kernel counter in `counters` (the transfer panics otherwise).
    pub lost: u64,
    /// The kernel's drop counters along the path during the transfer.
    pub counters: PathDrops,
    pub resent_unsegmented: u64,
    pub tx_fallbacks: usize,
    /// Times the sender tried GSO again after a refusal (each may bring
    /// one more fallback event).
    pub tx_gso_retries: u64,
}

/// The kernel's drop counters along a test's path, by name, as differences
/// over one transfer. A datagram can be dropped on the sending side (the
/// library's `Stats::dropped_locally`: the kernel's `ENOBUFS`), by the device (a
/// veth's `tx_dropped` and its peer's `rx_dropped`, which count a NAPI
/// ring's drops and the input backlog's; on loopback only the host-wide
/// backlog counter sees it), or by UDP (the socket's own drop counter, and
/// the receiving namespace's `Udp InErrors`: buffer full, bad checksum).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PathDrops {
    /// `Stats::dropped_locally` of the sender.
    pub sender_queue: u64,
    /// The sending veth's `tx_dropped` (`ip -s link`), when on a veth pair.
    pub veth_tx: u64,
    /// The receiving veth's `rx_dropped`, when on a veth pair.
    pub veth_rx: u64,
    /// `/proc/net/softnet_stat` drops, host-wide (tests running at the same
    /// time share it): counted only where no veth counter is read.
    pub backlog: u64,
    /// The receiving socket's drop counter (`SO_MEMINFO`/`SO_RXQ_OVFL`).
    pub socket: u64,
    /// `Udp InErrors` of the receiving namespace (`/proc/net/snmp`), when
    /// on a veth pair (the root namespace's is shared by every test).
    pub udp_in_errors: u64,
}

impl PathDrops {
    /// The most datagrams these counters explain, never counting one drop
    /// twice: the larger of the counters that can see the same drop. A
    /// datagram a veth drops is counted as its `tx_dropped`, its peer's
    /// `rx_dropped` (a backlog drop there too) and, as the kernel answers
    /// the send with `ENOBUFS`, as the sender's local drop; a socket's drop
    /// also counts in `InErrors`. Device and UDP drops are apart.
    pub fn explained(&self, on_veth: bool) -> u64 {
        let device = if on_veth {
            self.veth_tx.max(self.veth_rx)
        } else {
            self.backlog
        };
        self.sender_queue.max(device) + self.socket.max(self.udp_in_errors)
    }
}

/// Counters of a veth pair's namespaces: (`tx_dropped` of `va`,
/// `rx_dropped` of `vb`, `Udp InErrors` in `b`).
fn veth_counters(p: &VethPair) -> (u64, u64, u64) {
    let link = |ns: &str, dev: &str, dir: &str| -> u64 {
        let out = Command::new("ip")
            .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| o.stdout)
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        v[0]["stats64"][dir]["dropped"].as_u64().unwrap_or(0)
    };
    let snmp = Command::new("ip")
        .args(["netns", "exec", &p.b, "cat", "/proc/net/snmp"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    let in_errors = match udp.as_slice() {
        [names, values] => names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "InErrors")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    (link(&p.a, "va", "tx"), link(&p.b, "vb", "rx"), in_errors)
}

/// Datagrams waiting in the per-CPU input backlogs now (the
/// `backlog_len` column of `/proc/net/softnet_stat`, summed): sent, not yet
/// delivered to any socket.
pub fn softnet_queued() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(11))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .sum()
}

/// Datagrams the kernel dropped at its per-CPU input backlogs so far
/// (the second column of `/proc/net/softnet_stat`, summed).
pub fn softnet_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .sum()
}

/// Sends `total` self-checking datagrams from `tx` to `rx` and checks them
/// (see [`transfer_on`]), on loopback or any path without a veth pair.
pub fn transfer(
    tx: Socket,
    rx: Socket,
    dest: SocketAddr,
    mode: TxMode,
    total: u64,
    g: usize,
    max: usize,
) -> Transfer {
    transfer_on(None, tx, rx, dest, mode, total, g, max)
}

/// Sends `total` self-checking datagrams from `tx` to `rx` and checks them:
/// every datagram arrives intact, or its loss is explained by a kernel drop
/// counter along the path ([`PathDrops`], read from the veth pair `path`'s
/// namespaces when given); a loss no counter explains fails the test.
///
/// The sender keeps at most a receive buffer's worth in flight, so the
/// kernel has no reason to drop. The receiver does not give up while
/// datagrams still wait in the input backlogs (a busy host may leave them
/// there for a while).
#[allow(clippy::too_many_arguments)]
pub fn transfer_on(
    path: Option<&VethPair>,
    tx: Socket,
    rx: Socket,
    dest: SocketAddr,
    mode: TxMode,
    total: u64,
    g: usize,
    max: usize,
) -> Transfer {
    let rcvbuf = socket2::SockRef::from(rx.as_std())
        .recv_buffer_size()
        .unwrap_or(212_992);
    let window_bytes = (rcvbuf / 4).max(64 * 1024) as u64;
    // Also stay under net.core.netdev_max_backlog (1000 by default): a veth
    // delivers through the per-CPU backlog, whose drops no socket counter sees.
    let window_dgrams = (rcvbuf / 4 / 2048).clamp(16, 500) as u64;
    rx.as_std()
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let got_bytes = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let rx = Arc::new(rx);
    let rx2 = rx.clone();
    let (got2, gb2, done2) = (got.clone(), got_bytes.clone(), done.clone());
    let backlog0 = softnet_drops();
    let veth0 = path.map(veth_counters).unwrap_or_default();
    let tx_dropped0 = tx.stats().dropped_locally;
    let receiver = std::thread::spawn(move || {
        let mut checker = Checker::new(total, g, max);
        let mut batch = RecvBatch::new(32);
        let mut idle_since: Option<Instant> = None;
        loop {
            match rx2.recv(&mut batch) {
                Ok(_) => {
                    idle_since = None;
                    for (m, d) in batch.datagrams() {
                        assert!(!m.truncated, "message truncated");
                        checker.check(d);
                    }
                    got2.store(checker.received, Release);
                    gb2.store(checker.bytes, Release);
                }
                Err(e) if e.is_would_block() => {
                    let drops = rx2.stats().kernel_drops;
                    if checker.received + drops >= total {
                        break;
                    }
                    let backlog = softnet_drops() - backlog0;
                    let t = *idle_since.get_or_insert_with(Instant::now);
                    let wait = if backlog > 0 { 1 } else { 5 };
                    // Never while datagrams still wait in a backlog: on a
                    // busy host softirq work can be late by seconds.
                    let idle = t.elapsed();
                    if done2.load(Acquire)
                        && idle > Duration::from_secs(wait)
                        && (softnet_queued() == 0 || idle > Duration::from_secs(30))
                    {
                        break;
                    }
                }
                Err(e) => panic!("receive failed: {e}"),
            }
        }
        checker
    });

    let mut sent: u64 = 0;
    let mut sent_bytes: u64 = 0;
    let mut buf = Vec::with_capacity(1 << 20);
    let mut lens = Vec::new();
    let mut coalescer = Coalescer::new();
    coalescer.set_mtu(1500);
    // Datagrams the veth pair dropped, as last read.
    let mut dev_dropped = 0u64;
    while sent < total {
        let n = 32.min(total - sent);
        buf.clear();
        lens.clear();
        for s in sent..sent + n {
            let l = size_of_seq(s, g, max);
            fill(s, l, &mut buf);
            lens.push(l);
        }
        let chunk_bytes = buf.len() as u64;
        // Flow control: wait until the receiver has room. What the
        // device dropped never arrives: while waiting, the veth's drop
        // counters are read now and then (each such datagram taken as
        // `max` bytes).
        let start = Instant::now();
        let mut checked = start;
        loop {
            let r = got.load(Acquire)
                + rx.stats().kernel_drops
                + (tx.stats().dropped_locally - tx_dropped0)
                + dev_dropped;
            let rb = got_bytes.load(Acquire) + dev_dropped * max as u64;
            if sent - r.min(sent) + n <= window_dgrams
                && sent_bytes - rb.min(sent_bytes) + chunk_bytes <= window_bytes + max as u64
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "receiver stalled at {r} of {sent} sent"
            );
            if let Some(p) = path.filter(|_| checked.elapsed() > Duration::from_millis(50)) {
                let v = veth_counters(p);
                dev_dropped = (v.0 - veth0.0).max(v.1 - veth0.1);
                checked = Instant::now();
            }
            std::thread::yield_now();
        }
        let mut off = 0;
        match mode {
            TxMode::Plain | TxMode::Mmsg => {
                let mut ts: Vec<Transmit<'_>> = lens
                    .iter()
                    .map(|&l| {
                        let t = Transmit::new(dest, &buf[off..off + l]);
                        off += l;
                        t
                    })
                    .collect();
                let mut k = 0;
                while k < ts.len() {
                    let s = tx.send(&ts[k..]).expect("send");
                    k += s.transmits;
                    if s.datagrams > 0 {
                        ts[k] = ts[k].skip_datagrams(s.datagrams);
                    }
                }
            }
            TxMode::Gso | TxMode::MmsgGso => {
                for &l in &lens {
                    coalescer
                        .push(&tx, dest, &buf[off..off + l], None, None)
                        .expect("push");
                    off += l;
                }
                while coalescer.queued().0 > 0 {
                    coalescer.flush(&tx).expect("flush");
                }
            }
        }
        sent += n;
        sent_bytes += chunk_bytes;
    }
    done.store(true, Release);
    let checker = receiver.join().expect("receiver thread");
    let received = checker.received;
    let ts = tx.stats();
    let rs = rx.stats();
    let backlog_drops = softnet_drops() - backlog0;
    let veth1 = path.map(veth_counters).unwrap_or_default();
    let counters = PathDrops {
        sender_queue: ts.dropped_locally - tx_dropped0,
        veth_tx: veth1.0 - veth0.0,
        veth_rx: veth1.1 - veth0.1,
        backlog: backlog_drops,
        socket: rs.kernel_drops,
        udp_in_errors: veth1.2 - veth0.2,
    };
    let missing = total - received.min(total);
    let explained = counters.explained(path.is_some());
    assert!(
        missing <= explained,
        "sent {total} datagrams, received {received}: {missing} lost, and the kernel's drop counters explain only {explained}: {counters:?}"
    );
    if missing > 0 {
        // Lost, and counted by the kernel: accounted, and said.
        eprintln!("{missing} datagrams lost, counted by the kernel: {counters:?}");
    }
    checker.finish(missing);
    used_backend(&tx, false);
    used_backend(&rx, true);
    Transfer {
        sent,
        received,
        rx_messages: rs.recv_messages,
        tx_calls: ts.send_calls,
        tx_messages: ts.send_messages,
        drops: rs.kernel_drops,
        backlog_drops,
        lost: missing,
        counters,
        resent_unsegmented: ts.resent_unsegmented,
        tx_fallbacks: ts.fallbacks_total as usize,
        tx_gso_retries: ts.gso_retries,
    }
}

/// True when the tests run as root (needed for namespaces and ethtool).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Runs a command; returns its success.
pub fn run(cmd: &str) -> bool {
    let parts: Vec<&str> = cmd.split_whitespace().collect();
    Command::new(parts[0])
        .args(&parts[1..])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Runs a command and panics with its output if it fails.
pub fn must(cmd: &str) {
    let parts: Vec<&str> = cmd.split_whitespace().collect();
    let o = Command::new(parts[0])
        .args(&parts[1..])
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Why namespace tests cannot run here, if they cannot. With
/// `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (as in CI) a reason to skip is a
/// failure instead.
/// Says why the calling test does not run (the test thread's name says
/// which); under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (set in CI) a skip
/// is a failure.
pub fn skip(why: impl std::fmt::Display) {
    fastudp_test_support::skip(&fastudp_test_support::current_test(), &why.to_string());
}

pub fn netns_unavailable() -> Option<String> {
    let why = netns_missing();
    if let Some(why) = &why {
        if std::env::var("FASTUDP_REQUIRE_PRIVILEGED_TESTS").as_deref() == Ok("1") {
            panic!("namespace test cannot run ({why}) and FASTUDP_REQUIRE_PRIVILEGED_TESTS=1");
        }
    }
    why
}

fn netns_missing() -> Option<String> {
    if !is_root() {
        return Some("needs root".into());
    }
    for tool in ["ip", "ethtool"] {
        if !run(&format!("{tool} -V")) && !run(&format!("{tool} --version")) {
            return Some(format!("needs the {tool} program"));
        }
    }
    if !run("ip netns list") {
        return Some("network namespaces unavailable".into());
    }
    None
}

/// Two namespaces joined by a veth pair; removed on drop.
pub struct VethPair {
    pub a: String,
    pub b: String,
    pub addr_a: std::net::Ipv4Addr,
    pub addr_b: std::net::Ipv4Addr,
    pub addr6_a: std::net::Ipv6Addr,
    pub addr6_b: std::net::Ipv6Addr,
}

impl VethPair {
    /// Creates `fu-<tag>-a` and `fu-<tag>-b` joined by veth `va`/`vb`, with
    /// 10.201.<n>.1/.2 on a /30 that exists only inside the namespaces.
    pub fn new(tag: &str, n: u8) -> Self {
        let a = format!("fu-{tag}-a");
        let b = format!("fu-{tag}-b");
        let _ = run(&format!("ip netns del {a}"));
        let _ = run(&format!("ip netns del {b}"));
        must(&format!("ip netns add {a}"));
        must(&format!("ip netns add {b}"));
        must(&format!(
            "ip -n {a} link add va type veth peer name vb netns {b}"
        ));
        must(&format!("ip -n {a} addr add 10.201.{n}.1/30 dev va"));
        must(&format!("ip -n {b} addr add 10.201.{n}.2/30 dev vb"));
        must(&format!(
            "ip -n {a} addr add fd00:201:{n}::1/64 dev va nodad"
        ));
        must(&format!(
            "ip -n {b} addr add fd00:201:{n}::2/64 dev vb nodad"
        ));
        must(&format!("ip -n {a} link set va up"));
        must(&format!("ip -n {b} link set vb up"));
        must(&format!("ip -n {a} link set lo up"));
        must(&format!("ip -n {b} link set lo up"));
        VethPair {
            a,
            b,
            addr_a: format!("10.201.{n}.1").parse().unwrap(),
            addr_b: format!("10.201.{n}.2").parse().unwrap(),
            addr6_a: format!("fd00:201:{n}::1").parse().unwrap(),
            addr6_b: format!("fd00:201:{n}::2").parse().unwrap(),
        }
    }

    /// Runs `ethtool ARGS` on the veth end in namespace `ns`.
    pub fn ethtool(&self, ns: &str, args: &str) {
        let dev = if ns == self.a { "va" } else { "vb" };
        must(&format!(
            "ip netns exec {ns} ethtool {} {dev} {}",
            args.split_whitespace().next().unwrap(),
            args.split_once(' ').map(|x| x.1).unwrap_or("")
        ));
    }

    /// Binds a fastudp socket inside namespace `ns`.
    pub fn bind(&self, ns: &str, addr: SocketAddr, config: Config) -> Socket {
        bind_in(ns, addr, config)
    }
}

/// Binds a standard UDP socket inside network namespace `ns` (as
/// [`bind_in`] does).
pub fn std_bind_in(ns: &str, addr: SocketAddr) -> std::net::UdpSocket {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(&path).expect("open netns");
            fastudp_tools::os::setns_net(std::os::fd::AsFd::as_fd(&f)).expect("setns");
            std::net::UdpSocket::bind(addr).expect("bind in namespace")
        })
        .join()
        .expect("namespace thread")
    })
}

/// Binds a fastudp socket inside network namespace `ns`: a helper thread
/// enters the namespace, and the socket stays there when the thread ends.
pub fn bind_in(ns: &str, addr: SocketAddr, config: Config) -> Socket {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(&path).expect("open netns");
            fastudp_tools::os::setns_net(std::os::fd::AsFd::as_fd(&f)).expect("setns");
            Socket::bind(addr, backend(config)).expect("bind in namespace")
        })
        .join()
        .expect("namespace thread")
    })
}

/// A network namespace whose loopback has a given MTU; removed on drop.
pub struct MtuNamespace(pub String);

impl MtuNamespace {
    pub fn new(tag: &str, mtu: u32) -> Self {
        let ns = format!("fu-{tag}");
        let _ = run(&format!("ip netns del {ns}"));
        must(&format!("ip netns add {ns}"));
        must(&format!("ip -n {ns} link set lo mtu {mtu} up"));
        MtuNamespace(ns)
    }
}

impl Drop for MtuNamespace {
    fn drop(&mut self) {
        let _ = run(&format!("ip netns del {}", self.0));
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        let _ = run(&format!("ip netns del {}", self.a));
        let _ = run(&format!("ip netns del {}", self.b));
    }
}

/// `trains` buffers of `segs` self-checking datagrams of `seg` bytes each,
/// numbered in order across all of them.
pub fn self_checking_trains(trains: usize, segs: usize, seg: usize) -> Vec<Vec<u8>> {
    (0..trains)
        .map(|t| {
            let mut b = Vec::with_capacity(segs * seg);
            for s in 0..segs {
                fill((t * segs + s) as u64, seg, &mut b);
            }
            b
        })
        .collect()
}

/// Receives until `total` self-checking datagrams of `seg` bytes arrived,
/// each exactly once and intact; panics with the count if the socket falls
/// silent for `timeout` first.
pub fn receive_exactly(rx: &Socket, total: u64, seg: usize, timeout: Duration) {
    let mut checker = Checker::uniform(total, seg);
    let mut b = RecvBatch::new(32);
    rx.as_std().set_read_timeout(Some(timeout)).unwrap();
    while checker.received < total {
        rx.recv(&mut b)
            .unwrap_or_else(|e| panic!("only {} of {total} arrived: {e}", checker.received));
        for (_, d) in b.datagrams() {
            checker.check(d);
        }
    }
    checker.finish(0);
    used_backend(rx, true);
}

/// Under `FASTUDP_BACKEND=uring` (the uring feature's second run of these
/// tests, see .ci/run), checks that `s` really received (`rx`) or sent
/// through its io_uring ring, unless io_uring is unavailable here, which
/// is then said (and must have been recorded as a fallback).
pub fn used_backend(s: &Socket, rx: bool) {
    #[cfg(all(feature = "uring", target_os = "linux"))]
    {
        if !uring_run() {
            return;
        }
        if let Some(why) = fastudp_io::uring::probe().why_not() {
            eprintln!("io_uring unavailable ({why}): the syscall path ran");
            assert!(
                s.stats()
                    .fallbacks
                    .iter()
                    .any(|f| f.feature == Feature::Uring),
                "io_uring unavailable but no fallback recorded"
            );
            return;
        }
        let u = s
            .state()
            .uring_stats()
            .expect("FASTUDP_BACKEND=uring but the socket has no ring");
        if rx {
            assert!(u.recv_messages > 0, "nothing came through the ring: {u:?}");
        } else {
            assert!(u.send_sqes > 0, "nothing went through the ring: {u:?}");
        }
    }
    #[cfg(not(all(feature = "uring", target_os = "linux")))]
    let _ = (s, rx);
}

/// Sets or clears `SO_NO_CHECK`, with which the kernel refuses GSO sends
/// (EINVAL from udp_send_skb): a real refusal on any kernel.
pub fn set_no_check(s: &Socket, on: bool) {
    fastudp_tools::raw::set_option_int(
        s.as_std(),
        libc::SOL_SOCKET,
        libc::SO_NO_CHECK,
        i32::from(on),
    )
    .expect("SO_NO_CHECK");
}

/// What [`threads_send_while_gso_flips`] saw.
#[derive(Debug)]
pub struct FlipRun {
    /// GSO fallbacks the sender recorded.
    pub fallbacks: usize,
    /// Sends that returned a train cut half-way (`Sent::datagrams > 0`).
    pub partials: u64,
}

/// Two threads share `tx` (made non-blocking here) and send 300 ten-datagram
/// trains each to `rx`, resuming half-sent trains with `skip_datagrams`,
/// while a third keeps flipping `SO_NO_CHECK` so that the kernel refuses
/// GSO mid-send. Panics unless every datagram arrives exactly once.
pub fn threads_send_while_gso_flips(tx: Socket, rx: Socket, rx_timeout: Duration) -> FlipRun {
    const THREADS: usize = 2;
    const TRAINS: usize = 300;
    const SEGS: usize = 10;
    const SEG: usize = 1000;
    let dest = rx.as_std().local_addr().unwrap();
    let tx = Arc::new(tx);
    tx.as_std().set_nonblocking(true).unwrap();
    let all = self_checking_trains(THREADS * TRAINS, SEGS, SEG);
    let stop = Arc::new(AtomicBool::new(false));
    let partials = AtomicU64::new(0);
    // Refused from the first send, and the flipper starts only once that
    // refusal was seen: a run over before the flipper gets going still
    // tests something (a flipper that turned the refusal off at once could
    // let a fast run go through without one).
    set_no_check(&tx, true);
    let flipper = {
        let (tx, stop) = (tx.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) && tx.stats().fallbacks.is_empty() {
                std::thread::sleep(Duration::from_micros(50));
            }
            let mut on = true;
            while !stop.load(Relaxed) {
                on = !on;
                set_no_check(&tx, on);
                std::thread::sleep(Duration::from_micros(300));
            }
            set_no_check(&tx, false);
        })
    };
    let total = (THREADS * TRAINS * SEGS) as u64;
    let receiver = std::thread::spawn(move || {
        receive_exactly(&rx, total, SEG, rx_timeout);
    });
    std::thread::scope(|s| {
        for part in all.chunks(TRAINS) {
            let (tx, partials) = (tx.clone(), &partials);
            s.spawn(move || {
                let mut ts: Vec<Transmit<'_>> =
                    part.iter().map(|b| Transmit::train(dest, b, SEG)).collect();
                let mut k = 0;
                let start = Instant::now();
                while k < ts.len() {
                    assert!(start.elapsed() < Duration::from_secs(60), "stalled");
                    match tx.send(&ts[k..]) {
                        Ok(s) => {
                            k += s.transmits;
                            if s.datagrams > 0 {
                                partials.fetch_add(1, Relaxed);
                                ts[k] = ts[k].skip_datagrams(s.datagrams);
                            }
                        }
                        Err(e) if e.is_would_block() => std::thread::yield_now(),
                        Err(e) => panic!("send failed: {e}"),
                    }
                }
            });
        }
    });
    stop.store(true, Relaxed);
    flipper.join().unwrap();
    receiver.join().expect("every datagram exactly once");
    let st = tx.stats();
    let run = FlipRun {
        fallbacks: st.fallbacks_total as usize,
        partials: partials.load(Relaxed),
    };
    eprintln!(
        "fallbacks {}, retries {}, resent one by one {}, half-sent trains {}",
        run.fallbacks, st.gso_retries, st.resent_unsegmented, run.partials
    );
    run
}
