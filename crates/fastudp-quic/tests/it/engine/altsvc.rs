//! The TLS-over-TCP discovery listener (`fastudp_quic::altsvc`) against a
//! plain rustls client speaking HTTP/1.1 and hyper's HTTP/2 client: the
//! `Alt-Svc` header, byte-exact bodies (files and `/bytes/N`),
//! keep-alive, 404, escapes refused, and every bound: a client that never
//! sends, one that stops in the middle of a head, one that idles, a head
//! too large (hyper's 431), too many connections, a response not taken
//! (a stalled socket, an HTTP/2 window left shut), drain and stop.

use super::{provider, server_tls, Cert};
use fastudp_quic::altsvc::{self, Config, Listener};
use fastudp_quic::files::Root;
use fastudp_quic::h3::{builtin_handler, FilesHandler, Handler, MakeHandler};
use fastudp_quic::hq::wire as hq;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The HTTP/3 port the listener advertises in these tests.
const H3_PORT: u16 = 4433;

struct Site {
    dir: PathBuf,
    root: Arc<Root>,
    file: Vec<u8>,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A directory with `a.bin` (200 kB that are not the pattern),
/// `index.html`, and a symbolic link that leads out of it.
fn site(tag: &str) -> Site {
    let dir = std::env::temp_dir().join(format!("fastudp-altsvc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("www")).unwrap();
    let file: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("www/a.bin"), &file).unwrap();
    std::fs::write(dir.join("www/index.html"), b"<p>hello</p>").unwrap();
    std::fs::write(dir.join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink(dir.join("secret"), dir.join("www/link")).unwrap();
    let root = Arc::new(Root::open(&dir.join("www")).unwrap());
    Site { dir, root, file }
}

fn start(site: &Site, f: impl FnOnce(&mut Config)) -> (Listener, Cert) {
    let (tls, cert) = server_tls();
    let root = site.root.clone();
    let files: Arc<MakeHandler> =
        Arc::new(move |_| Rc::new(FilesHandler::new(root.clone())) as Rc<dyn Handler>);
    let make = builtin_handler(Duration::from_millis(40), Some(files));
    let mut cfg = Config::new("127.0.0.1:0".parse().unwrap(), tls, H3_PORT, make);
    f(&mut cfg);
    (Listener::start(cfg).unwrap(), cert)
}

/// A rustls client for `cert` that has not touched a socket yet.
fn client_conn(cert: &Cert) -> rustls::ClientConnection {
    rustls::ClientConnection::new(
        client_tls(cert, b"http/1.1"),
        "localhost".try_into().unwrap(),
    )
    .unwrap()
}

/// A TLS 1.3 client configuration that trusts `cert` and offers `alpn`.
fn client_tls(cert: &Cert, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(tls)
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr` that trusts `cert`, offering http/1.1;
/// the handshake done.
fn connect(addr: SocketAddr, cert: &Cert) -> Client {
    let conn = client_conn(cert);
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    assert_eq!(s.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    s
}

/// One response: status, header fields (names lower-case), body.
#[derive(Debug)]
struct Resp {
    status: u16,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response whose body has a `content-length` (or none, for
/// HEAD) from `s`.
fn read_response(s: &mut Client, head_only: bool) -> Resp {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "the connection ended in a head");
        buf.push(b[0]);
    }
    let text = String::from_utf8(buf).unwrap();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let fields: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            (n.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    let len: usize = fields
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("content-length");
    let mut body = vec![0u8; if head_only { 0 } else { len }];
    s.read_exact(&mut body).unwrap();
    Resp {
        status,
        fields,
        body,
    }
}

fn get(s: &mut Client, path: &str) -> Resp {
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    s.flush().unwrap();
    read_response(s, false)
}

/// True once the server has closed `s` (EOF or reset), within 10 s.
fn closed_by_server(s: &mut impl Read) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

#[test]
fn alt_svc_files_and_bytes_are_served_byte_exact_over_tls_tcp() {
    let site = site("serve");
    let (l, cert) = start(&site, |_| {});
    let mut s = connect(l.local_addr(), &cert);
    // Three requests on one connection (keep-alive).
    let r = get(&mut s, "/a.bin");
    assert_eq!(r.status, 200);
    assert_eq!(r.field("alt-svc"), Some("h3=\":4433\"; ma=86400"));
    assert_eq!(r.body, site.file, "the file, byte-exact");
    assert_eq!(r.field("content-type"), Some("application/octet-stream"));
    let r = get(&mut s, "/bytes/100000");
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 100_000);
    assert_eq!(hq::check(0, &r.body), Ok(()), "the pattern, byte-exact");
    let r = get(&mut s, "/");
    assert_eq!((r.status, &r.body[..]), (200, &b"<p>hello</p>"[..]));
    assert_eq!(r.field("content-type"), Some("text/html; charset=utf-8"));
    // A range, and HEAD.
    write!(
        s,
        "GET /a.bin HTTP/1.1\r\nHost: localhost\r\nRange: bytes=10-19\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut s, false);
    assert_eq!((r.status, &r.body[..]), (206, &site.file[10..20]));
    write!(s, "HEAD /a.bin HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let r = read_response(&mut s, true);
    assert_eq!(r.status, 200);
    assert_eq!(r.field("content-length"), Some("200000"));
    // 404, and escapes refused (by the parser and by the kernel).
    for path in ["/missing", "/../secret", "/%2e%2e/secret", "/link"] {
        let r = get(&mut s, path);
        assert_eq!(r.status, 404, "{path}");
        assert!(r.body.is_empty());
        assert_eq!(r.field("alt-svc"), Some("h3=\":4433\"; ma=86400"));
    }
    let fs = site.root.stats();
    assert_eq!(fs.escapes_refused, 3, "{fs:?}");
    assert_eq!(fs.not_found, 1, "{fs:?}");
    // A request that asks to close gets `connection: close`, then EOF.
    write!(
        s,
        "GET /bytes/10 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut s, false);
    assert_eq!(r.field("connection"), Some("close"));
    assert!(closed_by_server(&mut s));
    let st = l.stats().snapshot();
    assert_eq!(st.requests, 10, "{st:?}");
    assert_eq!(st.accepted, 1, "{st:?}");
    assert_eq!(st.bad_requests, 0, "{st:?}");
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_malformed_and_oversized_requests_are_refused_and_counted() {
    let site = site("bad");
    let (l, cert) = start(&site, |_| {});
    let mut s = connect(l.local_addr(), &cert);
    write!(
        s,
        "GET http://localhost/a.bin HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut s, false);
    assert_eq!(r.status, 400);
    assert!(closed_by_server(&mut s));
    let mut s = connect(l.local_addr(), &cert);
    let big = "x".repeat(altsvc::MAX_HEAD);
    // The server answers once it has read MAX_HEAD bytes; it may reset
    // the connection before the rest is written.
    let _ = write!(s, "GET / HTTP/1.1\r\nHost: localhost\r\nX: {big}\r\n\r\n");
    let _ = s.flush();
    let r = read_response(&mut s, false);
    assert_eq!(r.status, 431);
    // hyper answers a head past its bounds itself: no Alt-Svc there.
    assert_eq!(r.field("alt-svc"), None);
    assert!(closed_by_server(&mut s));
    // One header field more than MAX_FIELDS (with Host): 431 too.
    let mut s = connect(l.local_addr(), &cert);
    let mut head = String::from("GET / HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..altsvc::MAX_FIELDS {
        head.push_str(&format!("X-{i}: v\r\n"));
    }
    write!(s, "{head}\r\n").unwrap();
    assert_eq!(read_response(&mut s, false).status, 431);
    assert!(closed_by_server(&mut s));
    // Exactly MAX_FIELDS is served.
    let mut s = connect(l.local_addr(), &cert);
    let mut head = String::from("GET /bytes/3 HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..altsvc::MAX_FIELDS - 1 {
        head.push_str(&format!("X-{i}: v\r\n"));
    }
    write!(s, "{head}\r\n").unwrap();
    assert_eq!(read_response(&mut s, false).status, 200);
    // A malformed head (a NUL in a value): hyper's 400.
    let mut s = connect(l.local_addr(), &cert);
    s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX: a\x00b\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut s, false).status, 400);
    assert!(closed_by_server(&mut s));
    // No Host, and Transfer-Encoding: refused here, with Alt-Svc.
    let mut s = connect(l.local_addr(), &cert);
    write!(s, "GET / HTTP/1.1\r\n\r\n").unwrap();
    let r = read_response(&mut s, false);
    assert_eq!(r.status, 400);
    assert_eq!(r.field("alt-svc"), Some("h3=\":4433\"; ma=86400"));
    assert!(closed_by_server(&mut s));
    let mut s = connect(l.local_addr(), &cert);
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut s, false).status, 501);
    assert!(closed_by_server(&mut s));
    let mut s = connect(l.local_addr(), &cert);
    write!(
        s,
        "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nabcd"
    )
    .unwrap();
    assert_eq!(read_response(&mut s, false).status, 413);
    // hyper's refusals are counted when their connection ends, which the
    // client may see first.
    super::eventually("seven refusals counted", || {
        l.stats().bad_requests.load(Relaxed) == 7
    });
    let st = l.stats().snapshot();
    assert_eq!(st.bad_requests, 7, "{st:?}");
    assert_eq!(st.requests, 1, "{st:?}");
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_slow_and_idle_clients_are_closed_at_their_deadlines() {
    let site = site("slow");
    let timeout = Duration::from_millis(400);
    let (l, cert) = start(&site, |c| {
        c.request_timeout = timeout;
        c.idle_timeout = Duration::from_millis(600);
    });
    // A client that connects and never sends (no TLS handshake).
    let t0 = Instant::now();
    let mut silent = TcpStream::connect(l.local_addr()).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(closed_by_server(&mut silent));
    let took = t0.elapsed();
    assert!(
        took >= timeout,
        "closed after {took:?}, before its deadline"
    );
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // One that completes the handshake, sends half a head, then nothing.
    let t0 = Instant::now();
    let mut half = connect(l.local_addr(), &cert);
    write!(half, "GET / HTTP/1.1\r\nHo").unwrap();
    half.flush().unwrap();
    assert!(closed_by_server(&mut half));
    assert!(t0.elapsed() < Duration::from_secs(5));
    // One that sends a byte every 100 ms: its head is never whole in time.
    let t0 = Instant::now();
    let mut drip = connect(l.local_addr(), &cert);
    let mut closed = false;
    for b in b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if drip.write_all(&[*b]).and_then(|_| drip.flush()).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed || closed_by_server(&mut drip));
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert_eq!(l.stats().request_timeouts.load(Relaxed), 3);
    // One that idles after a request.
    let mut idle = connect(l.local_addr(), &cert);
    assert_eq!(get(&mut idle, "/bytes/5").status, 200);
    assert!(closed_by_server(&mut idle));
    // The client sees the close before the connection's thread has ended
    // and counted it: wait for the count.
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    let st = l.stats().snapshot();
    assert_eq!(st.idle_closed, 1, "{st:?}");
    assert_eq!(st.request_timeouts, 3, "{st:?}");
    assert_eq!(st.open, 0, "{st:?}");
    l.stop(Duration::from_secs(2));
}

/// Sends `bytes` to `tcp` one at a time, `gap` apart, until the server
/// closes the connection or `limit` passes; how long it stayed open.
fn trickle(tcp: &mut TcpStream, bytes: &[u8], gap: Duration, limit: Duration) -> Duration {
    let t0 = Instant::now();
    tcp.set_nonblocking(true).unwrap();
    let mut scratch = [0u8; 4096];
    for b in bytes.iter().cycle() {
        if t0.elapsed() > limit {
            break;
        }
        if tcp.write_all(&[*b]).is_err() {
            return t0.elapsed();
        }
        std::thread::sleep(gap);
        // The server's handshake flight is read and dropped; EOF or a
        // reset is the close.
        loop {
            match tcp.read(&mut scratch) {
                Ok(0) => return t0.elapsed(),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return t0.elapsed(),
            }
        }
    }
    t0.elapsed()
}

#[test]
fn alt_svc_a_trickled_tls_handshake_or_record_is_closed_at_its_deadline() {
    let site = site("trickle");
    let (l, cert) = start(&site, |c| {
        c.request_timeout = Duration::from_millis(500);
        c.idle_timeout = Duration::from_millis(800);
    });
    // A ClientHello sent a byte every 100 ms: each byte comes well within
    // the request timeout, but the handshake is not done by then. Closed
    // at 0.5 s; the bound below only has to tell that from never (the
    // trickle gives up after 10 s), on however busy a machine.
    let mut conn = client_conn(&cert);
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut tcp = TcpStream::connect(l.local_addr()).unwrap();
    let open = trickle(
        &mut tcp,
        &hello,
        Duration::from_millis(100),
        Duration::from_secs(10),
    );
    assert!(
        open < Duration::from_secs(9),
        "a trickled handshake held its connection {open:?}"
    );
    super::eventually("the handshake counted", || {
        l.stats().request_timeouts.load(Relaxed) == 1
    });
    // After a request, the next one's TLS record a byte every 100 ms: no
    // byte of the head arrives until the record is whole.
    let mut s = connect(l.local_addr(), &cert);
    assert_eq!(get(&mut s, "/bytes/5").status, 200);
    write!(
        s.conn.writer(),
        "GET /bytes/5 HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    let mut record = Vec::new();
    while s.conn.wants_write() {
        s.conn.write_tls(&mut record).unwrap();
    }
    let open = trickle(
        &mut s.sock,
        &record,
        Duration::from_millis(100),
        Duration::from_secs(10),
    );
    assert!(
        open < Duration::from_secs(9),
        "a trickled record held its connection {open:?}"
    );
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    let st = l.stats().snapshot();
    assert_eq!(st.request_timeouts + st.idle_closed, 2, "{st:?}");
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_connections_over_the_bound_are_refused_and_stop_closes_the_rest() {
    let site = site("bound");
    let (l, cert) = start(&site, |c| {
        c.max_connections = 2;
        // All from one address: the global bound is what is tested.
        c.max_connections_per_ip = Some(2);
    });
    let a = connect(l.local_addr(), &cert);
    let mut b = connect(l.local_addr(), &cert);
    super::eventually("two open", || l.stats().open.load(Relaxed) == 2);
    let mut c = TcpStream::connect(l.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(closed_by_server(&mut c), "the third is closed at once");
    assert_eq!(l.stats().refused.load(Relaxed), 1);
    // Those open still work; stop closes them.
    assert_eq!(get(&mut b, "/bytes/3").status, 200);
    let stats = l.stats().clone();
    l.stop(Duration::from_secs(2));
    assert_eq!(stats.open.load(Relaxed), 0);
    assert!(closed_by_server(&mut b));
    drop(a);
}

/// A TCP connection to `addr` from the local address `from`.
fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let from: SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&from.into()).unwrap();
    s.connect(&addr.into()).unwrap();
    let s = TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn alt_svc_one_address_holds_a_quarter_of_the_connections() {
    let site = site("per-ip");
    let (l, _cert) = start(&site, |c| c.max_connections = 8);
    // 127.0.0.2 takes its share, 2 of 8; its third is closed at once.
    let held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from("127.0.0.2", l.local_addr()))
        .collect();
    super::eventually("two open", || l.stats().open.load(Relaxed) == 2);
    let mut third = connect_from("127.0.0.2", l.local_addr());
    assert!(closed_by_server(&mut third), "the third is closed at once");
    assert_eq!(l.stats().refused.load(Relaxed), 1);
    // Another address is still let in, up to its own share.
    let others: Vec<TcpStream> = (0..2)
        .map(|_| connect_from("127.0.0.3", l.local_addr()))
        .collect();
    super::eventually("four open", || l.stats().open.load(Relaxed) == 4);
    assert_eq!(l.stats().refused.load(Relaxed), 1);
    // A place given back is a place to take again.
    drop(held);
    super::eventually("two open", || l.stats().open.load(Relaxed) == 2);
    let _again = connect_from("127.0.0.2", l.local_addr());
    super::eventually("three open", || l.stats().open.load(Relaxed) == 3);
    assert_eq!(l.stats().refused.load(Relaxed), 1);
    drop(others);
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_a_client_that_takes_nothing_is_closed_after_one_send_timeout() {
    let site = site("stall");
    let send_timeout = Duration::from_secs(1);
    let (l, cert) = start(&site, |c| c.send_timeout = send_timeout);
    let mut s = connect(l.local_addr(), &cert);
    // A response far larger than the socket buffers, never read.
    write!(
        s,
        "GET /bytes/1000000000 HTTP/1.1\r\nHost: localhost\r\n\r\n"
    )
    .unwrap();
    s.flush().unwrap();
    let t0 = Instant::now();
    super::eventually("the stalled response counted", || {
        l.stats().send_failed.load(Relaxed) == 1
    });
    let took = t0.elapsed();
    // The buffers fill within a fraction of a second on loopback; then
    // one send timeout, not one per write rustls retries (which took over
    // 5). The margin is for a busy machine.
    assert!(took >= send_timeout, "cut after {took:?}");
    assert!(
        took < send_timeout * 4,
        "a client that took nothing held its response {took:?}"
    );
    l.stop(Duration::from_secs(2));
}

/// A tokio runtime for hyper's HTTP/2 client.
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

type H2Send = hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An HTTP/2 connection (ALPN h2) to `addr` with hyper's client; its
/// connection task runs on the caller's runtime.
async fn h2_connect(addr: SocketAddr, cert: &Cert) -> H2Send {
    let tls = client_tls(cert, b"h2");
    let t = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let s = tokio_rustls::TlsConnector::from(tls)
        .connect(name, t)
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

fn h2_get(path: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::builder()
        .uri(format!("https://localhost{path}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap()
}

#[test]
fn alt_svc_http2_serves_streams_at_once_byte_exact_with_alt_svc() {
    use http_body_util::BodyExt;
    let site = site("h2");
    let (l, cert) = start(&site, |_| {});
    let file = site.file.clone();
    rt().block_on(async {
        let send = h2_connect(l.local_addr(), &cert).await;
        // Streams at once on one connection: files, the pattern, 404.
        let mut tasks = Vec::new();
        for path in ["/a.bin", "/bytes/300000", "/missing", "/a.bin", "/"] {
            let mut send = send.clone();
            tasks.push(tokio::spawn(async move {
                let r = send.send_request(h2_get(path)).await.unwrap();
                assert_eq!(r.version(), http::Version::HTTP_2);
                let alt = r.headers().get(http::header::ALT_SVC).cloned();
                let status = r.status().as_u16();
                let body = r.into_body().collect().await.unwrap().to_bytes();
                (path, status, alt, body)
            }));
        }
        for t in tasks {
            let (path, status, alt, body) = t.await.unwrap();
            assert_eq!(
                alt.as_ref().map(|v| v.to_str().unwrap()),
                Some("h3=\":4433\"; ma=86400"),
                "{path}"
            );
            match path {
                "/a.bin" => assert_eq!((status, &body[..]), (200, &file[..])),
                "/bytes/300000" => {
                    assert_eq!((status, body.len()), (200, 300_000));
                    assert_eq!(hq::check(0, &body), Ok(()));
                }
                "/missing" => assert_eq!((status, body.len()), (404, 0)),
                _ => assert_eq!((status, &body[..]), (200, &b"<p>hello</p>"[..])),
            }
        }
        // A request with a body is refused; the connection serves on.
        let mut s = send.clone();
        let req = http::Request::builder()
            .method("POST")
            .uri("https://localhost/")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"abcd",
            )))
            .unwrap();
        let r = s.send_request(req).await.unwrap();
        assert_eq!(r.status(), 413);
        assert!(r.headers().contains_key(http::header::ALT_SVC));
        let r = s.send_request(h2_get("/bytes/7")).await.unwrap();
        assert_eq!(r.status(), 200);
    });
    let st = l.stats().snapshot();
    assert_eq!(st.accepted, 1, "{st:?}");
    assert_eq!(st.requests, 6, "{st:?}");
    assert_eq!(st.bad_requests, 1, "{st:?}");
    assert_eq!(st.send_failed, 0, "{st:?}");
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_http2_idle_connections_get_goaway_and_drain_finishes_streams() {
    use http_body_util::BodyExt;
    let site = site("h2-idle");
    let (l, cert) = start(&site, |c| c.idle_timeout = Duration::from_millis(300));
    rt().block_on(async {
        // Idle after a request: GOAWAY, then the connection ends.
        let mut send = h2_connect(l.local_addr(), &cert).await;
        let r = send.send_request(h2_get("/bytes/5")).await.unwrap();
        let _ = r.into_body().collect().await.unwrap();
        let t0 = Instant::now();
        while !send.is_closed() {
            assert!(t0.elapsed() < Duration::from_secs(10), "not closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    assert_eq!(l.stats().idle_closed.load(Relaxed), 1);
    // A drain while a slow stream is under way: the stream finishes
    // whole, then the connection closes; new connections are refused.
    let (l, cert) = start(&site, |_| {});
    rt().block_on(async {
        let mut send = h2_connect(l.local_addr(), &cert).await;
        // Frames of 1000 bytes, 40 ms apart (the built-in video route).
        let r = send.send_request(h2_get("/video/200000/1")).await.unwrap();
        assert_eq!(r.status(), 200);
        l.drain();
        assert!(
            tokio::net::TcpStream::connect(l.local_addr())
                .await
                .is_err(),
            "a new connection during the drain"
        );
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert!(!body.is_empty());
        let t0 = Instant::now();
        while !send.is_closed() {
            assert!(t0.elapsed() < Duration::from_secs(10), "not closed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    let st = l.stats().snapshot();
    assert_eq!((st.send_failed, st.requests), (0, 1), "{st:?}");
    l.stop(Duration::from_secs(2));
}

#[test]
fn alt_svc_http2_a_stream_whose_window_stays_shut_is_closed_after_the_send_timeout() {
    let site = site("h2-stall");
    let send_timeout = Duration::from_secs(1);
    let (l, cert) = start(&site, |c| c.send_timeout = send_timeout);
    rt().block_on(async {
        let mut send = h2_connect(l.local_addr(), &cert).await;
        // The client reads frames (its TCP is never behind) but never
        // takes the body, so the stream's window stays shut.
        let r = send
            .send_request(h2_get("/bytes/1000000000"))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let t0 = Instant::now();
        while l.stats().send_failed.load(Relaxed) == 0 {
            assert!(t0.elapsed() < send_timeout * 8, "the stalled stream held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            t0.elapsed() >= send_timeout / 2,
            "cut after {:?}",
            t0.elapsed()
        );
        drop(r);
    });
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    assert_eq!(l.stats().send_failed.load(Relaxed), 1);
    l.stop(Duration::from_secs(2));
}

/// An HTTP/2 connection from the local address `from` whose streams'
/// windows stay shut (`SETTINGS_INITIAL_WINDOW_SIZE` 0, and the client
/// never takes a body): the server can send heads, never data.
async fn h2_connect_shut(from: &str, addr: SocketAddr, cert: &Cert) -> H2Send {
    let tls = client_tls(cert, b"h2");
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let t = sock.connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let s = tokio_rustls::TlsConnector::from(tls)
        .connect(name, t)
        .await
        .unwrap();
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(0)
            .handshake(hyper_util::rt::TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// `n` requests for `/a.bin` on `send`, their heads received (200); the
/// responses (bodies never taken) are returned to be held.
async fn stalled_gets(send: &H2Send, n: usize) -> Vec<http::Response<hyper::body::Incoming>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            send.send_request(h2_get("/a.bin")).await.unwrap()
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    held
}

/// An HTTP/1.1 GET of `/` from the local address `from`, that may fail
/// (the server closed the connection at once): its status, or `None`.
fn try_get_from(from: &str, addr: SocketAddr, cert: &Cert) -> Option<u16> {
    let tcp = connect_from(from, addr);
    let mut s = rustls::StreamOwned::new(client_conn(cert), tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).ok()?;
    }
    write!(s, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    s.flush().ok()?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).ok()? == 0 {
            return None;
        }
        head.push(b[0]);
    }
    std::str::from_utf8(head.get(9..12)?).ok()?.parse().ok()
}

/// Every place is held by HTTP/2 connections whose windows stay shut
/// (two addresses, their shares full, a send timeout far away): a client
/// from a third address is served, in the place of a stalled connection
/// evicted for it. Without eviction it is refused until the send timeout.
#[test]
fn alt_svc_a_newcomer_evicts_a_stalled_connection_when_every_place_is_taken() {
    let site = site("evict");
    let (l, cert) = start(&site, |c| {
        c.max_connections = 4;
        c.max_connections_per_ip = Some(2);
        c.send_timeout = Duration::from_secs(600);
        c.stall_evict = Duration::from_millis(100);
    });
    let addr = l.local_addr();
    rt().block_on(async {
        let mut held = Vec::new();
        for from in ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"] {
            let send = h2_connect_shut(from, addr, &cert).await;
            let responses = stalled_gets(&send, 2).await;
            held.push((send, responses));
        }
        // Every place taken, each stream holding one chunk it cannot send.
        let stats = l.stats().clone();
        while stats.held.load(Relaxed) < 8 * altsvc::TCP_CHUNK as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(stats.open.load(Relaxed), 4);
        // The newcomer: refused at most while the streams are not yet
        // stalled, then served.
        let cert = cert.clone();
        let served = tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            loop {
                if let Some(status) = try_get_from("127.0.0.4", addr, &cert) {
                    return Some(status);
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .unwrap();
        assert_eq!(served, Some(200), "the newcomer was never served");
        let st = stats.snapshot();
        assert_eq!(st.evicted, 1, "{st:?}");
        // One of the stalled connections was closed for it.
        while held.iter().all(|(s, _)| !s.is_closed()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(held.iter().filter(|(s, _)| s.is_closed()).count(), 1);
        drop(held);
    });
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    l.stop(Duration::from_secs(2));
}

/// A client that opens every stream it may (16) for a large file and
/// never opens a window makes its connection hold one connection's bound
/// of response bytes, `CONN_BODY` (four 16 KiB chunks), not a chunk per
/// stream; the bytes are given back when the connection ends. The
/// listener's whole bound is what `--max-memory` is charged.
#[test]
fn alt_svc_a_connection_holds_at_most_its_bound_of_response_bytes() {
    let site = site("held");
    let (l, cert) = start(&site, |c| c.send_timeout = Duration::from_secs(600));
    let stats = l.stats().clone();
    rt().block_on(async {
        let send = h2_connect_shut("127.0.0.1", l.local_addr(), &cert).await;
        let responses = stalled_gets(&send, altsvc::H2_MAX_STREAMS as usize).await;
        while stats.held.load(Relaxed) < altsvc::CONN_BODY as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Every stream answered, each wants to send: still only the bound.
        let st = stats.snapshot();
        assert_eq!(st.held, altsvc::CONN_BODY as u64, "{st:?}");
        assert_eq!(st.held_peak, altsvc::CONN_BODY as u64, "{st:?}");
        assert_eq!(st.requests, u64::from(altsvc::H2_MAX_STREAMS), "{st:?}");
        drop(responses);
        drop(send);
    });
    super::eventually("no connection open", || stats.open.load(Relaxed) == 0);
    assert_eq!(stats.held.load(Relaxed), 0, "given back");
    assert_eq!(stats.held_peak.load(Relaxed), altsvc::CONN_BODY as u64);
    // The listener's bound: each place's response bytes and the rest.
    let cfg = Config::new(
        "127.0.0.1:0".parse().unwrap(),
        server_tls().0,
        H3_PORT,
        builtin_handler(Duration::from_millis(40), None),
    );
    assert_eq!(
        cfg.memory_bound(),
        altsvc::MAX_CONNECTIONS as u64 * (altsvc::CONN_BODY + altsvc::CONN_FIXED) as u64
    );
    assert_eq!(cfg.memory_bound(), 48 << 20);
    l.stop(Duration::from_secs(2));
}

/// A client whose HTTP/2 frames are malformed is closed by h2 with
/// GOAWAY, and that is counted.
#[test]
fn alt_svc_a_connection_h2_closes_with_goaway_is_counted() {
    let site = site("goaway");
    let (l, cert) = start(&site, |_| {});
    let tcp = TcpStream::connect(l.local_addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let tls = client_tls(&cert, b"h2");
    let c = rustls::ClientConnection::new(tls, "localhost".try_into().unwrap()).unwrap();
    let mut s = rustls::StreamOwned::new(c, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    assert_eq!(s.conn.alpn_protocol(), Some(&b"h2"[..]));
    // The preface, then a SETTINGS frame of 5 bytes (a multiple of 6 is
    // required): FRAME_SIZE_ERROR, a connection error.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 5, 4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5])
        .unwrap();
    s.flush().unwrap();
    assert!(closed_by_server(&mut s));
    super::eventually("no connection open", || l.stats().open.load(Relaxed) == 0);
    let st = l.stats().snapshot();
    assert_eq!(st.protocol_closed, 1, "{st:?}");
    l.stop(Duration::from_secs(2));
}
