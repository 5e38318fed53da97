//! The access log of `quic serve` (`--access-log FILE|-`,
//! `--access-log-format text|json`): one line per request, over HTTP/3
//! and over the TCP listener.
//!
//! The worker that answered a request never writes: when the response
//! ends (its body sent, cut or dropped) it makes a [`Record`] (no
//! formatting) and offers it to a bounded queue of [`QUEUE`] records
//! with `try_send`, which never waits. A record that finds the queue full
//! is dropped and counted ([`LogStats::dropped`]), and the count is
//! reported at exit. One thread of the log's own formats the records and
//! writes them through a `BufWriter`, flushed at least once a second
//! ([`FLUSH_EVERY`]) and at exit, so a slow disk slows that thread, not
//! the workers.
//!
//! A line, as text:
//!
//! ```text
//! 127.0.0.1:53211 - - [2026-12-06T07:40:00.123Z] "GET /bytes/10 h3" 200 10 0.000104
//! ```
//!
//! (client address and port, `-` for ident and user as in the common log
//! format, the time in RFC 3339 (UTC, milliseconds), method, target and
//! protocol (`h3`, `h2`, `http/1.1`, `http/1.0`), status, body bytes sent,
//! seconds from the request's head to the response's end); as JSON:
//!
//! ```text
//! {"time":"2026-12-06T07:40:00.123Z","client":"127.0.0.1:53211","proto":"h3","method":"GET","path":"/bytes/10","status":200,"bytes":10,"duration_s":0.000104}
//! ```

use anyhow::Context as _;
use clap::ValueEnum;
use fastudp_quic::app::ConnInfo;
use fastudp_quic::h3::{Body, Handler, Next, Reply};
use http::{Method, Version};
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Records the queue between the workers and the log's thread holds at
/// most; past it a record is dropped and counted.
pub const QUEUE: usize = 16_384;

/// The longest a written line waits in the buffer before it is flushed.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The longest target kept in a line, in bytes; a longer one is cut
/// (and ends with `...`).
pub const MAX_TARGET: usize = 2048;

/// The format of the access log's lines.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// The common log format's shape, with the protocol in the request
    /// and the duration last.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The protocol a request came over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/3.
    H3,
    /// HTTP/2 (TLS over TCP).
    H2,
    /// HTTP/1.1 (TLS over TCP).
    Http11,
    /// HTTP/1.0 (TLS over TCP).
    Http10,
}

impl Proto {
    /// From the request's version.
    pub fn of(v: Version) -> Proto {
        match v {
            Version::HTTP_2 => Proto::H2,
            Version::HTTP_11 => Proto::Http11,
            Version::HTTP_10 | Version::HTTP_09 => Proto::Http10,
            _ => Proto::H3,
        }
    }

    /// Its name in a line: the ALPN token.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::H3 => "h3",
            Proto::H2 => "h2",
            Proto::Http11 => "http/1.1",
            Proto::Http10 => "http/1.0",
        }
    }
}

/// One request, as logged.
#[derive(Debug, Clone)]
pub struct Record {
    /// When its head arrived.
    pub time: SystemTime,
    /// The client's address, where known.
    pub client: Option<SocketAddr>,
    /// The protocol.
    pub proto: Proto,
    /// The method.
    pub method: Method,
    /// The target (path and query), cut at [`MAX_TARGET`] bytes.
    pub target: String,
    /// The response's status.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// From the request's head to the response's end.
    pub duration: Duration,
}

/// What the log counted.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Lines written (to the buffer; flushed within [`FLUSH_EVERY`]).
    pub written: AtomicU64,
    /// Records dropped because the queue was full (or the log stopped).
    pub dropped: AtomicU64,
    /// Lines that could not be written (the file's errors).
    pub write_errors: AtomicU64,
}

enum Msg {
    Line(Box<Record>),
    Stop,
}

/// The workers' side of the log: cheap to clone, never blocks.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Msg>,
    stats: Arc<LogStats>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

/// The log's thread; [`Writer::stop`] flushes and ends it.
pub struct Writer {
    tx: SyncSender<Msg>,
    thread: Option<JoinHandle<()>>,
    /// What was counted.
    pub stats: Arc<LogStats>,
    /// Where it writes (`-`: standard output).
    pub dest: String,
}

/// Where the log goes: a file (appended to, made if missing) or standard
/// output (`-`).
pub fn open(dest: &std::path::Path, format: LogFormat) -> anyhow::Result<(AccessLog, Writer)> {
    let out: Box<dyn Write + Send> = if dest.as_os_str() == "-" {
        Box::new(io::stdout())
    } else {
        Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dest)
                .with_context(|| format!("--access-log {}", dest.display()))?,
        )
    };
    Ok(start(out, format, dest.display().to_string()))
}

/// The log writing to `out`.
pub fn start(out: Box<dyn Write + Send>, format: LogFormat, dest: String) -> (AccessLog, Writer) {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let stats = Arc::new(LogStats::default());
    let thread = {
        let stats = stats.clone();
        std::thread::Builder::new()
            .name("fastudp-log".into())
            .spawn(move || write_loop(rx, BufWriter::with_capacity(64 << 10, out), format, &stats))
            .ok()
    };
    let log = AccessLog {
        tx: tx.clone(),
        stats: stats.clone(),
    };
    (
        log,
        Writer {
            tx,
            thread,
            stats,
            dest,
        },
    )
}

impl AccessLog {
    /// Offers `r` to the log's thread; dropped and counted when the
    /// queue is full.
    pub fn log(&self, r: Record) {
        match self.tx.try_send(Msg::Line(Box::new(r))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// A request whose response is under way: logged when it is dropped
    /// (with [`Pending::status`] and the bytes counted by then).
    pub fn pending<B>(&self, req: &http::Request<B>) -> Pending {
        let client = req
            .extensions()
            .get::<ConnInfo>()
            .map(|c| c.remote)
            .or_else(|| req.extensions().get::<super::proxy::Peer>().map(|p| p.0));
        Pending {
            log: Some(self.clone()),
            time: SystemTime::now(),
            start: Instant::now(),
            client,
            proto: Proto::of(req.version()),
            method: req.method().clone(),
            target: target(req.uri()),
            status: 0,
            bytes: 0,
        }
    }
}

/// A request being answered; its line is sent when this is dropped.
#[derive(Debug)]
pub struct Pending {
    log: Option<AccessLog>,
    time: SystemTime,
    start: Instant,
    client: Option<SocketAddr>,
    proto: Proto,
    method: Method,
    target: String,
    /// The response's status.
    pub status: u16,
    /// Body bytes sent so far.
    pub bytes: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            log.log(Record {
                time: self.time,
                client: self.client,
                proto: self.proto,
                method: std::mem::replace(&mut self.method, Method::GET),
                target: std::mem::take(&mut self.target),
                status: self.status,
                bytes: self.bytes,
                duration: self.start.elapsed(),
            });
        }
    }
}

/// The target as logged: path and query, cut at [`MAX_TARGET`].
fn target(u: &http::Uri) -> String {
    let t = u.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    if t.len() <= MAX_TARGET {
        return t.to_string();
    }
    let mut end = MAX_TARGET;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &t[..end])
}

/// A [`Handler`] whose requests are logged: the line is sent when the
/// reply's body ends (or at once for a reply without one).
pub struct LoggedHandler {
    inner: Rc<dyn Handler>,
    log: AccessLog,
}

impl LoggedHandler {
    /// `inner`'s requests, logged to `log`.
    pub fn new(inner: Rc<dyn Handler>, log: AccessLog) -> LoggedHandler {
        LoggedHandler { inner, log }
    }
}

impl Handler for LoggedHandler {
    fn handle(&self, req: &http::Request<()>, now: Instant) -> Reply {
        let mut p = self.log.pending(req);
        let mut reply = self.inner.handle(req, now);
        p.status = reply.head.status().as_u16();
        if let Some(body) = reply.body.take() {
            reply.body = Some(Box::new(LoggedBody { inner: body, p }));
        }
        reply
    }
}

/// A reply's body, its bytes counted for the line.
struct LoggedBody {
    inner: Box<dyn Body>,
    p: Pending,
}

impl Body for LoggedBody {
    fn next(&mut self, now: Instant, max: usize) -> io::Result<Next> {
        let n = self.inner.next(now, max)?;
        if let Next::Data(b) = &n {
            self.p.bytes += b.len() as u64;
        }
        Ok(n)
    }
}

/// A response body (of the proxy, or of a route), its bytes counted for
/// the line, which is sent when the body is dropped.
pub struct LoggedHttpBody<B> {
    inner: B,
    p: Pending,
}

impl<B> LoggedHttpBody<B> {
    /// `inner`, counted into `p`.
    pub fn new(inner: B, p: Pending) -> Self {
        LoggedHttpBody { inner, p }
    }
}

impl<B> http_body::Body for LoggedHttpBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(f))) = &r {
            if let Some(d) = f.data_ref() {
                self.p.bytes += d.len() as u64;
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Writer {
    /// Writes what is queued, flushes, and ends the thread.
    pub fn stop(mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(
    rx: Receiver<Msg>,
    mut out: BufWriter<Box<dyn Write + Send>>,
    format: LogFormat,
    stats: &LogStats,
) {
    let mut line = String::with_capacity(256);
    // When the oldest line not yet flushed was written.
    let mut unflushed: Option<Instant> = None;
    let mut noted = false;
    let flush = |out: &mut BufWriter<Box<dyn Write + Send>>, noted: &mut bool| {
        if let Err(e) = out.flush() {
            if !*noted {
                eprintln!("fastudp: note: --access-log: {e}; lines are lost (counted)");
                *noted = true;
            }
        }
    };
    loop {
        let got = match unflushed {
            Some(t) => rx.recv_timeout((t + FLUSH_EVERY).saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(Msg::Line(r)) => {
                line.clear();
                match format {
                    LogFormat::Text => text_line(&mut line, &r),
                    LogFormat::Json => json_line(&mut line, &r),
                }
                match out.write_all(line.as_bytes()) {
                    Ok(()) => {
                        stats.written.fetch_add(1, Relaxed);
                        unflushed.get_or_insert_with(Instant::now);
                    }
                    Err(e) => {
                        stats.write_errors.fetch_add(1, Relaxed);
                        if !noted {
                            eprintln!("fastudp: note: --access-log: {e}; lines are lost (counted)");
                            noted = true;
                        }
                    }
                }
            }
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                flush(&mut out, &mut noted);
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if unflushed.is_some_and(|t| t.elapsed() >= FLUSH_EVERY) {
            flush(&mut out, &mut noted);
            unflushed = None;
        }
    }
}

/// RFC 3339, UTC, milliseconds: `2026-12-06T07:40:00.123Z`.
fn rfc3339(t: SystemTime) -> String {
    let d = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        d.year(),
        u8::from(d.month()),
        d.day(),
        d.hour(),
        d.minute(),
        d.second(),
        d.millisecond()
    )
}

fn client(r: &Record) -> String {
    r.client.map_or_else(|| "-".to_string(), |a| a.to_string())
}

/// A text line: the common log format's shape.
pub fn text_line(out: &mut String, r: &Record) {
    use std::fmt::Write as _;
    let _ = write!(
        out,
        "{} - - [{}] \"{} ",
        client(r),
        rfc3339(r.time),
        r.method
    );
    escape_into(out, &r.target);
    let _ = writeln!(
        out,
        " {}\" {} {} {:.6}",
        r.proto.as_str(),
        r.status,
        r.bytes,
        r.duration.as_secs_f64()
    );
}

/// A JSON line's fields, in order.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    time: String,
    client: Option<String>,
    proto: &'static str,
    method: &'a str,
    path: &'a str,
    status: u16,
    bytes: u64,
    duration_s: f64,
}

/// A JSON line.
pub fn json_line(out: &mut String, r: &Record) {
    let line = JsonLine {
        time: rfc3339(r.time),
        client: r.client.map(|a| a.to_string()),
        proto: r.proto.as_str(),
        method: r.method.as_str(),
        path: &r.target,
        status: r.status,
        bytes: r.bytes,
        duration_s: (r.duration.as_secs_f64() * 1e6).round() / 1e6,
    };
    // Serializing plain fields cannot fail.
    if let Ok(s) = serde_json::to_string(&line) {
        out.push_str(&s);
    }
    out.push('\n');
}

/// The target in a text line: `"` and `\` escaped with `\`, control
/// bytes and spaces as `\xHH`, so a line always parses.
fn escape_into(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() || c == ' ' => {
                let mut b = [0u8; 4];
                for byte in c.encode_utf8(&mut b).bytes() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            }
            c => out.push(c),
        }
    }
}

/// Says where the log goes.
pub fn announce(w: &Writer, format: LogFormat, json: bool) -> anyhow::Result<()> {
    let f = match format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "access_log",
                "dest": w.dest,
                "format": f,
                "queue": QUEUE,
                "flush_every_s": FLUSH_EVERY.as_secs_f64(),
            })
        )
    } else {
        out!(
            "access log: {} ({f}), {QUEUE} lines queued at most (more are dropped and counted), flushed every {} s",
            w.dest,
            FLUSH_EVERY.as_secs()
        )
    }
}

/// What the log counted: an `access_log` line after the summary.
pub fn summary(s: &LogStats, json: bool) -> anyhow::Result<()> {
    let (w, d, e) = (
        s.written.load(Relaxed),
        s.dropped.load(Relaxed),
        s.write_errors.load(Relaxed),
    );
    if json {
        out!(
            "{}",
            serde_json::json!({
                "kind": "access_log_summary",
                "written": w,
                "dropped": d,
                "write_errors": e,
            })
        )
    } else {
        out!("access log: {w} lines written, {d} dropped (queue full), {e} write errors")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_550_000_123),
            client: Some("127.0.0.1:5000".parse().unwrap()),
            proto: Proto::H3,
            method: Method::GET,
            target: "/a \"b\"\\c".into(),
            status: 200,
            bytes: 10,
            duration: Duration::from_micros(104),
        }
    }

    #[test]
    fn text_and_json_lines() {
        let mut s = String::new();
        text_line(&mut s, &rec());
        assert_eq!(
            s,
            "127.0.0.1:5000 - - [2026-12-06T09:40:00.123Z] \"GET /a\\x20\\\"b\\\"\\\\c h3\" 200 10 0.000104\n"
        );
        let mut j = String::new();
        json_line(&mut j, &rec());
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["time"], "2026-12-06T09:40:00.123Z");
        assert_eq!(v["client"], "127.0.0.1:5000");
        assert_eq!(v["path"], "/a \"b\"\\c");
        assert_eq!(v["duration_s"], 0.000104);
        let whole = Record {
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_550_000),
            ..rec()
        };
        assert_eq!(rfc3339(whole.time), "2026-12-06T09:40:00.000Z");
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        // A writer that never returns until told: the queue fills.
        struct Stuck(mpsc::Receiver<()>);
        impl Write for Stuck {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                let _ = self.0.recv();
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (go, wait) = mpsc::channel();
        let (log, w) = start(Box::new(Stuck(wait)), LogFormat::Text, "stuck".into());
        // The buffer (64 KiB) and the queue take what they can; the rest
        // is dropped, at once.
        let sent = QUEUE + 10_000;
        for _ in 0..sent {
            log.log(rec());
        }
        let dropped = w.stats.dropped.load(Relaxed);
        assert!(dropped > 0, "nothing dropped");
        drop(go);
        let stats = w.stats.clone();
        w.stop();
        assert_eq!(
            stats.written.load(Relaxed) + stats.dropped.load(Relaxed),
            sent as u64
        );
    }
}
