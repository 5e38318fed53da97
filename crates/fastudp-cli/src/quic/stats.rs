//! The counters every server stack keeps, the `--stats` line and the
//! final summary.

use crate::interrupt;
pub use fastudp_quic::Counters;
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A snapshot of the counters and the process CPU time.
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    at: Option<Instant>,
    cpu: Duration,
    app: u64,
    wire: u64,
    dg_sent: u64,
    dg_recv: u64,
    send_calls: u64,
    recv_calls: u64,
}

impl Snap {
    fn take(c: &Counters) -> Self {
        Snap {
            at: Some(Instant::now()),
            cpu: fastudp_tools::os::process_cpu_time(),
            app: c.app_bytes.load(Relaxed),
            wire: c.wire_bytes.load(Relaxed),
            dg_sent: c.datagrams_sent.load(Relaxed),
            dg_recv: c.datagrams_recv.load(Relaxed),
            send_calls: c.send_calls.load(Relaxed),
            recv_calls: c.recv_calls.load(Relaxed),
        }
    }
}

/// One report: over a second (`--stats`) or the whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `stats` or `summary`.
    pub kind: &'static str,
    /// Which server.
    pub stack: &'static str,
    /// Seconds covered.
    pub seconds: f64,
    /// Connections open at the end.
    pub connections: u64,
    /// Connections accepted in all.
    pub accepted: u64,
    /// Connections refused in all.
    pub refused: u64,
    /// Of those, refused at the memory budget's hard limit.
    pub refused_memory: u64,
    /// Connections evicted to make room for a newcomer when full.
    pub evicted: u64,
    /// Connections cut for a response that made no progress.
    pub stalled_cut: u64,
    /// Retry packets sent in all.
    pub retries: u64,
    /// Response bytes acknowledged per second, in Gbit/s.
    pub goodput_gbit_s: f64,
    /// UDP payload (or TCP payload) Gbit/s sent.
    pub wire_gbit_s: f64,
    /// Server CPU seconds (all threads) per Gbit of response bytes.
    pub cpu_s_per_gbit: Option<f64>,
    /// Server CPU use, in cores.
    pub cpu_cores: f64,
    /// Send syscalls per second (where the stack's I/O is fastudp's).
    pub send_calls_s: Option<f64>,
    /// Receive syscalls per second.
    pub recv_calls_s: Option<f64>,
    /// Datagrams per send call.
    pub datagrams_per_send_call: Option<f64>,
    /// Datagrams per receive call.
    pub datagrams_per_recv_call: Option<f64>,
    /// Packets the connections declared lost and sent again, in all.
    pub retransmissions: u64,
    /// Datagrams handed to another worker, in all.
    pub forwarded: u64,
    /// Datagrams dropped as unusable, in all.
    pub dropped: u64,
    /// Datagrams for another worker dropped (its ring full), in all.
    pub forward_dropped: u64,
    /// Stateless replies dropped (the queue full), in all.
    pub stateless_dropped: u64,
    /// Requests reset for their deadline, in all.
    pub request_timeouts: u64,
    /// HTTP/3 requests answered, in all.
    pub h3_requests: u64,
    /// HTTP/3 requests refused before an answer, in all.
    pub h3_refused: u64,
    /// Response bytes acknowledged, in all (what goodput counts).
    pub goodput_bytes: u64,
    /// Datagrams the host's own queue dropped (`ENOBUFS`), in all.
    pub dropped_locally: u64,
    /// Datagrams (GRO trains count once) the kernel dropped at a worker's
    /// full receive buffer, in all.
    pub rx_overflow: u64,
    /// Send errors, in all.
    pub send_errors: u64,
    /// Receive errors, in all.
    pub recv_errors: u64,
    /// `--uring`: datagrams read in place in the rings' buffers, in all.
    pub recv_in_place: u64,
    /// `--uring`: workers that receive with syscalls instead (io_uring
    /// refused).
    pub uring_fallbacks: u64,
    /// `--uring`: times a ring had no free buffer (the datagrams waited
    /// in the socket), in all.
    pub uring_exhausted: u64,
    /// The pacing in force, and why.
    pub pacing: String,
    /// `--alt-svc-tcp`: the TCP listener's counters, in all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpReport>,
}

/// The counters of `--alt-svc-tcp` (HTTP/1.1 and HTTP/2 over TLS over TCP).
#[derive(Debug, Serialize)]
pub struct TcpReport {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub open: u64,
    /// Connections refused (its connection bound).
    pub refused: u64,
    /// TLS handshakes that failed.
    pub tls_failed: u64,
    /// Requests answered (HTTP/1.1 and HTTP/2).
    pub requests: u64,
    /// Requests refused: malformed or too large (hyper's 400 and 431),
    /// not in origin-form, or with a body.
    pub bad_requests: u64,
    /// Connections closed for a request head late.
    pub request_timeouts: u64,
    /// Connections closed idle.
    pub idle_closed: u64,
    /// Responses cut short by a failed or stalled write.
    pub send_failed: u64,
    /// Responses cut short by their body's error.
    pub body_errors: u64,
    /// Connections evicted for a newcomer while every place was taken.
    pub evicted: u64,
    /// HTTP/2 connections h2 closed itself with GOAWAY (rapid reset,
    /// floods, malformed frames).
    pub protocol_closed: u64,
    /// Response bytes held now (read, not yet written whole to TLS).
    pub held: u64,
    /// The most response bytes held at once.
    pub held_peak: u64,
}

impl TcpReport {
    fn from(s: &fastudp_quic::altsvc::Stats) -> Self {
        let s = s.snapshot();
        TcpReport {
            accepted: s.accepted,
            open: s.open,
            refused: s.refused,
            tls_failed: s.tls_failed,
            requests: s.requests,
            bad_requests: s.bad_requests,
            request_timeouts: s.request_timeouts,
            idle_closed: s.idle_closed,
            send_failed: s.send_failed,
            body_errors: s.body_errors,
            evicted: s.evicted,
            protocol_closed: s.protocol_closed,
            held: s.held,
            held_peak: s.held_peak,
        }
    }
}

fn report(
    kind: &'static str,
    stack: &'static str,
    c: &Counters,
    from: Snap,
    to: Snap,
    calls_known: bool,
    pacing: &str,
) -> Report {
    let secs = match (from.at, to.at) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64().max(1e-6),
        _ => 1e-6,
    };
    let app = to.app.saturating_sub(from.app);
    let gbit = app as f64 * 8.0 / 1e9;
    let cpu = to.cpu.saturating_sub(from.cpu).as_secs_f64();
    let dg_sent = to.dg_sent.saturating_sub(from.dg_sent);
    let dg_recv = to.dg_recv.saturating_sub(from.dg_recv);
    let sc = to.send_calls.saturating_sub(from.send_calls);
    let rc = to.recv_calls.saturating_sub(from.recv_calls);
    let per = |n: u64, d: u64| (calls_known && d > 0).then(|| n as f64 / d as f64);
    Report {
        kind,
        stack,
        seconds: secs,
        connections: c.connections.load(Relaxed),
        accepted: c.accepted.load(Relaxed),
        refused: c.refused.load(Relaxed),
        refused_memory: c.refused_memory.load(Relaxed),
        evicted: c.evicted.load(Relaxed),
        stalled_cut: c.stalled_cut.load(Relaxed),
        retries: c.retries.load(Relaxed),
        goodput_gbit_s: gbit / secs,
        wire_gbit_s: to.wire.saturating_sub(from.wire) as f64 * 8.0 / 1e9 / secs,
        cpu_s_per_gbit: (gbit > 1e-3).then(|| cpu / gbit),
        cpu_cores: cpu / secs,
        send_calls_s: calls_known.then(|| sc as f64 / secs),
        recv_calls_s: calls_known.then(|| rc as f64 / secs),
        datagrams_per_send_call: per(dg_sent, sc),
        datagrams_per_recv_call: per(dg_recv, rc),
        retransmissions: c.lost_packets.load(Relaxed),
        forwarded: c.forwarded.load(Relaxed),
        dropped: c.dropped.load(Relaxed),
        forward_dropped: c.forward_dropped.load(Relaxed),
        stateless_dropped: c.stateless_dropped.load(Relaxed),
        request_timeouts: c.request_timeouts.load(Relaxed),
        h3_requests: c.h3_requests.load(Relaxed),
        h3_refused: c.h3_refused.load(Relaxed),
        goodput_bytes: to.app,
        dropped_locally: c.dropped_locally.load(Relaxed),
        rx_overflow: c.rx_overflow.load(Relaxed),
        send_errors: c.send_errors.load(Relaxed),
        recv_errors: c.recv_errors.load(Relaxed),
        recv_in_place: c.recv_in_place.load(Relaxed),
        uring_fallbacks: c.uring_fallbacks.load(Relaxed),
        uring_exhausted: c.uring_exhausted.load(Relaxed),
        pacing: pacing.to_string(),
        tcp: None,
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

fn print(r: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        return out!("{}", serde_json::to_string(r).unwrap_or_default());
    }
    if let Some(t) = &r.tcp {
        out!(
            "{} tcp: {} connections ({} accepted, {} refused, {} evicted, {} TLS failures, {} closed by h2), {} requests, {} bad, {} request timeouts, {} idle closed, {} send failures, {} body errors, {} KiB of responses held (at most {} KiB)",
            r.kind,
            t.open,
            t.accepted,
            t.refused,
            t.evicted,
            t.tls_failed,
            t.protocol_closed,
            t.requests,
            t.bad_requests,
            t.request_timeouts,
            t.idle_closed,
            t.send_failed,
            t.body_errors,
            t.held >> 10,
            t.held_peak >> 10
        )?;
    }
    out!(
        "{}: {:.1} s, {} connections ({} accepted, {} refused ({} at the memory limit), {} evicted, {} stalled cut, {} retries), goodput {:.3} Gbit/s, wire {:.3} Gbit/s, CPU {} s/Gbit ({:.2} cores), send calls {}/s ({} datagrams each), recv calls {}/s ({} datagrams each), {} retransmissions, {} forwarded, {} dropped, {} forward drops, {} stateless drops, {} request timeouts, {} dropped by the local queue, {} dropped at a full receive buffer,{} pacing: {}",
        r.kind,
        r.seconds,
        r.connections,
        r.accepted,
        r.refused,
        r.refused_memory,
        r.evicted,
        r.stalled_cut,
        r.retries,
        r.goodput_gbit_s,
        r.wire_gbit_s,
        opt(r.cpu_s_per_gbit, 3),
        r.cpu_cores,
        opt(r.send_calls_s, 0),
        opt(r.datagrams_per_send_call, 1),
        opt(r.recv_calls_s, 0),
        opt(r.datagrams_per_recv_call, 1),
        r.retransmissions,
        r.forwarded,
        r.dropped,
        r.forward_dropped,
        r.stateless_dropped,
        r.request_timeouts,
        r.dropped_locally,
        r.rx_overflow,
        if r.recv_in_place + r.uring_fallbacks > 0 {
            format!(
                " io_uring: {} datagrams read in place, {} workers on syscalls, {} ring exhaustions,",
                r.recv_in_place, r.uring_fallbacks, r.uring_exhausted
            )
        } else {
            String::new()
        },
        r.pacing
    )
}

/// A baseline stack's run: says where it listens and its certificate, then prints `--stats`
/// lines until `--duration` ends or Ctrl-C; the reporter, for the summary.
/// A failed write to standard output ends it with the error.
pub fn baseline_run(
    c: &Counters,
    stack: &'static str,
    addr: std::net::SocketAddr,
    workers: usize,
    a: &super::ServeArgs,
    pacing: &str,
    cert: &super::tls::Identity,
) -> anyhow::Result<Reporter> {
    listening(stack, addr, workers, "hq-interop", a.json)?;
    super::tls::announce(cert, a.json)?;
    let rep = Reporter::new(c, stack, false);
    rep.wait(c, a.duration, a.stats, a.json, pacing, &|| false)?;
    Ok(rep)
}

/// Prints the line that says where the server listens.
pub fn listening(
    stack: &str,
    addr: std::net::SocketAddr,
    workers: usize,
    alpn: &str,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        out!(
            "{}",
            serde_json::json!({"kind": "listening", "stack": stack, "addr": addr.to_string(), "workers": workers, "alpn": alpn})
        )
    } else {
        out!("listening on {addr} ({stack}, {workers} workers, ALPN {alpn})")
    }
}

/// Runs the main thread of a server: a `--stats` line every second until
/// `--duration` passes or Ctrl-C; returns when the server should stop,
/// with the snapshot taken at the start.
pub struct Reporter {
    start: Snap,
    stack: &'static str,
    calls_known: bool,
    tcp: Option<std::sync::Arc<fastudp_quic::altsvc::Stats>>,
}

impl Reporter {
    /// Starts counting now.
    pub fn new(c: &Counters, stack: &'static str, calls_known: bool) -> Self {
        Reporter {
            start: Snap::take(c),
            stack,
            calls_known,
            tcp: None,
        }
    }

    /// Reports the counters of `--alt-svc-tcp` too.
    pub fn alt_svc(mut self, tcp: Option<std::sync::Arc<fastudp_quic::altsvc::Stats>>) -> Self {
        self.tcp = tcp;
        self
    }

    fn with_tcp(&self, mut r: Report) -> Report {
        r.tcp = self.tcp.as_deref().map(TcpReport::from);
        r
    }

    /// Waits, printing `--stats` lines, until the run should end: Ctrl-C,
    /// the end of `--duration`, or `failed` true (a worker that stopped);
    /// or a `--stats` line that cannot be written, with the error.
    pub fn wait(
        &self,
        c: &Counters,
        duration: Option<f64>,
        stats: bool,
        json: bool,
        pacing: &str,
        failed: &dyn Fn() -> bool,
    ) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let mut last = Snap::take(c);
        let mut next = t0 + Duration::from_secs(1);
        loop {
            if interrupt::requested() || failed() {
                return Ok(());
            }
            if let Some(d) = duration {
                if t0.elapsed().as_secs_f64() >= d {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
            if Instant::now() >= next {
                next += Duration::from_secs(1);
                let now = Snap::take(c);
                if stats {
                    print(
                        &self.with_tcp(report(
                            "stats",
                            self.stack,
                            c,
                            last,
                            now,
                            self.calls_known,
                            pacing,
                        )),
                        json,
                    )?;
                }
                last = now;
            }
        }
    }

    /// Prints the summary of the whole run.
    pub fn summary(&self, c: &Counters, json: bool, pacing: &str) -> anyhow::Result<()> {
        let now = Snap::take(c);
        print(
            &self.with_tcp(report(
                "summary",
                self.stack,
                c,
                self.start,
                now,
                self.calls_known,
                pacing,
            )),
            json,
        )
    }
}
