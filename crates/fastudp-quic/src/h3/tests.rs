//! HTTP/3 over two in-process quinn-proto endpoints, without sockets: the
//! datagrams travel through queues under a virtual clock, h3's own client
//! runs on one side over the same backend, the server task on the other,
//! and a hand-rolled loop drives both with `std::task::Wake` wakers (no
//! runtime).

use super::backend::{ConnRef, H3Conn, Limits, Link};
use super::handler::{Builtin, Content, Route};
use super::task::{H3Task, TaskWaker, MAX_FIELD_SECTION, REQUEST_STREAM_CAP};
use bytes::{Buf, Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig, Event,
    ServerConfig, StreamEvent, TransportConfig, VarInt,
};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const SERVER: &str = "127.0.0.1:4433";
const CLIENT: &str = "127.0.0.1:50000";
/// One-way delay of the virtual path.
const DELAY: Duration = Duration::from_millis(5);
/// Bidirectional streams the server allows (the engine's limit).
const STREAMS: u32 = 16;

fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// The built-in content: `/bytes/N` and `/video/RATE/SECONDS` (10 frames
/// per second) over the `i % 251` pattern.
struct TestContent;

impl Content for TestContent {
    fn route(&self, path: &str) -> Option<Route> {
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            ["", "bytes", n] => n.parse().ok().map(Route::Bytes),
            ["", "video", rate, secs] => {
                let (rate, secs): (u64, u64) = (rate.parse().ok()?, secs.parse().ok()?);
                Some(Route::Video {
                    bytes: rate / 10,
                    count: secs * 10,
                    interval: Duration::from_millis(100),
                })
            }
            _ => None,
        }
    }

    fn pattern(&self, off: u64, len: usize) -> Bytes {
        (off..off + len as u64).map(pattern_byte).collect()
    }
}

/// A future polled only when its waker was called.
struct Driven<T> {
    fut: Option<Pin<Box<dyn Future<Output = T>>>>,
    flag: Arc<TaskWaker>,
    waker: Waker,
    out: Option<T>,
}

impl<T> Driven<T> {
    fn new(f: impl Future<Output = T> + 'static) -> Self {
        let flag = Arc::new(TaskWaker::default());
        Waker::from(flag.clone()).wake_by_ref();
        Driven {
            fut: Some(Box::pin(f)),
            waker: Waker::from(flag.clone()),
            flag,
            out: None,
        }
    }

    /// Polls if woken; true if it was polled.
    fn poll(&mut self) -> bool {
        let Some(f) = self.fut.as_mut() else {
            return false;
        };
        if !self.flag.queued.swap(false, Ordering::Relaxed) {
            return false;
        }
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            self.out = Some(v);
            self.fut = None;
        }
        true
    }
}

struct Cert {
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
}

fn cert() -> Cert {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("rcgen");
    Cert {
        chain: vec![c.cert.der().clone()],
        key: rustls::pki_types::PrivatePkcs8KeyDer::from(c.key_pair.serialize_der()).into(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn server_config(c: &Cert) -> ServerConfig {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_no_client_auth()
        .with_single_cert(c.chain.clone(), c.key.clone_key())
        .expect("cert");
    tls.alpn_protocols = vec![super::ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls).expect("quic tls");
    let mut s = ServerConfig::with_crypto(Arc::new(crypto));
    let mut t = TransportConfig::default();
    // As the engine sets them: 16 requests, the 3 unidirectional streams
    // HTTP/3 needs.
    t.max_concurrent_bidi_streams(VarInt::from_u32(STREAMS));
    t.max_concurrent_uni_streams(VarInt::from_u32(3));
    s.transport_config(Arc::new(t));
    s
}

fn client_config(c: &Cert, window: Option<u32>) -> ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.chain[0].clone()).expect("root");
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![super::ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
    let mut cc = ClientConfig::new(Arc::new(crypto));
    let mut t = TransportConfig::default();
    t.max_concurrent_uni_streams(VarInt::from_u32(3));
    if let Some(w) = window {
        t.stream_receive_window(VarInt::from_u32(w));
        t.receive_window(VarInt::from_u32(w * 4));
    }
    cc.transport_config(Arc::new(t));
    cc
}

/// A tiny deterministic generator for dropping datagrams.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The server side of one connection.
struct ServerConn {
    ch: ConnectionHandle,
    conn: ConnRef,
    task: H3Task,
    /// `StreamEvent::Writable`s forwarded to the task.
    writable: u64,
}

/// A client and a server endpoint joined by two delayed queues.
struct Pair {
    now: Instant,
    server_ep: Endpoint,
    client_ep: Endpoint,
    client_ch: ConnectionHandle,
    client: ConnRef,
    client_link: Rc<Link>,
    server: Option<ServerConn>,
    to_server: VecDeque<(Instant, Vec<u8>)>,
    to_client: VecDeque<(Instant, Vec<u8>)>,
    /// Per mille of datagrams dropped, each way.
    drop_per_mille: u64,
    rng: Rng,
    dropped: u64,
    /// Drives of the loop.
    turns: u64,
    /// Forward the server's events but do not poll its task.
    hold_task: bool,
    /// The server's request handler.
    handler: Rc<dyn super::Handler>,
    /// A service answering instead of `handler`, when set.
    service: Option<Rc<dyn super::service::ServeRequest>>,
}

impl Pair {
    fn new(window: Option<u32>) -> Pair {
        let c = cert();
        let now = Instant::now();
        let mut server_ep = Endpoint::new(
            Arc::new(EndpointConfig::default()),
            Some(Arc::new(server_config(&c))),
            true,
            Some([1; 32]),
        );
        let _ = &mut server_ep;
        let mut client_ep = Endpoint::new(
            Arc::new(EndpointConfig::default()),
            None,
            true,
            Some([2; 32]),
        );
        let (client_ch, client) = client_ep
            .connect(
                now,
                client_config(&c, window),
                SERVER.parse().unwrap(),
                "localhost",
            )
            .expect("connect");
        let client = Rc::new(RefCell::new(client));
        let client_link = Link::new(client.clone(), Limits::NONE, now);
        Pair {
            now,
            server_ep,
            client_ep,
            client_ch,
            client,
            client_link,
            server: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            drop_per_mille: 0,
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            dropped: 0,
            turns: 0,
            hold_task: false,
            handler: Rc::new(Builtin::new(TestContent)),
            service: None,
        }
    }

    fn lose(&mut self) -> bool {
        let lost = self.drop_per_mille > 0 && self.rng.next() % 1000 < self.drop_per_mille;
        self.dropped += lost as u64;
        lost
    }

    /// Delivers what is due, runs both connections' events, the server
    /// task and `client` (the client's h3 future), and queues what they
    /// send. Returns whether anything happened.
    fn turn<T>(&mut self, client: &mut Driven<T>) -> bool {
        self.turns += 1;
        let now = self.now;
        let mut buf = Vec::new();
        let mut busy = self.deliver_to_server(now, &mut buf);
        busy |= self.deliver_to_client(now, &mut buf);
        self.timers_and_endpoint_events(now);
        // Application events, then the applications, then transmits.
        loop {
            let Some(ev) = self.client.borrow_mut().poll() else {
                break;
            };
            self.client_link.forward(&ev);
        }
        self.client_link.set_now(now);
        busy |= client.poll();
        if let Some(s) = &mut self.server {
            loop {
                let Some(ev) = s.conn.borrow_mut().poll() else {
                    break;
                };
                if matches!(ev, Event::Stream(StreamEvent::Writable { .. })) {
                    s.writable += 1;
                }
                s.task.link().forward(&ev);
            }
            let before = s.task.polls();
            if !self.hold_task {
                s.task.poll(now);
            }
            busy |= s.task.polls() != before;
        }
        busy |= self.transmits(now, &mut buf);
        busy
    }

    /// Hands the server the datagrams due at `now`: true if there were any.
    fn deliver_to_server(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        let mut busy = false;
        while self.to_server.front().is_some_and(|(t, _)| *t <= now) {
            let (_, d) = self.to_server.pop_front().unwrap();
            busy = true;
            let ev = self.server_ep.handle(
                now,
                CLIENT.parse().unwrap(),
                None,
                None,
                BytesMut::from(&d[..]),
                buf,
            );
            match ev {
                Some(DatagramEvent::NewConnection(inc)) => {
                    let (ch, conn) = self.server_ep.accept(inc, now, buf, None).expect("accept");
                    let conn = Rc::new(RefCell::new(conn));
                    let task = H3Task::server(
                        conn.clone(),
                        match &self.service {
                            Some(s) => super::task::Responder::Service(s.clone()),
                            None => self.handler.clone().into(),
                        },
                        STREAMS as usize,
                        crate::limits::REQUEST_TIMEOUT,
                        now,
                    );
                    self.server = Some(ServerConn {
                        ch,
                        conn,
                        task,
                        writable: 0,
                    });
                }
                Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                    if let Some(s) = self.server.as_ref().filter(|s| s.ch == ch) {
                        s.conn.borrow_mut().handle_event(ev);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    let d = buf[..t.size].to_vec();
                    self.to_client.push_back((now + DELAY, d));
                }
                None => {}
            }
        }
        busy
    }

    /// Hands the client the datagrams due at `now`: true if there were any.
    fn deliver_to_client(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        let mut busy = false;
        while self.to_client.front().is_some_and(|(t, _)| *t <= now) {
            let (_, d) = self.to_client.pop_front().unwrap();
            busy = true;
            if let Some(DatagramEvent::ConnectionEvent(_, ev)) = self.client_ep.handle(
                now,
                SERVER.parse().unwrap(),
                None,
                None,
                BytesMut::from(&d[..]),
                buf,
            ) {
                self.client.borrow_mut().handle_event(ev);
            }
        }
        busy
    }

    /// Both sides' timers due at `now`, then their endpoint events.
    fn timers_and_endpoint_events(&mut self, now: Instant) {
        {
            let mut c = self.client.borrow_mut();
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
        if let Some(s) = &self.server {
            let mut c = s.conn.borrow_mut();
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
        // Endpoint events.
        loop {
            let Some(ev) = self.client.borrow_mut().poll_endpoint_events() else {
                break;
            };
            if let Some(ev) = self.client_ep.handle_event(self.client_ch, ev) {
                self.client.borrow_mut().handle_event(ev);
            }
        }
        if let Some(s) = &self.server {
            loop {
                let Some(ev) = s.conn.borrow_mut().poll_endpoint_events() else {
                    break;
                };
                if let Some(ev) = self.server_ep.handle_event(s.ch, ev) {
                    s.conn.borrow_mut().handle_event(ev);
                }
            }
        }
    }

    /// Both sides' transmits, onto the links (some lost, as asked): true
    /// if there were any.
    fn transmits(&mut self, now: Instant, buf: &mut Vec<u8>) -> bool {
        let mut busy = false;
        loop {
            buf.clear();
            let Some(t) = self.client.borrow_mut().poll_transmit(now, 1, buf) else {
                break;
            };
            busy = true;
            if !self.lose() {
                self.to_server
                    .push_back((now + DELAY, buf[..t.size].to_vec()));
            }
        }
        if let Some(s) = &self.server {
            loop {
                buf.clear();
                let Some(t) = s.conn.borrow_mut().poll_transmit(now, 1, buf) else {
                    break;
                };
                busy = true;
                let lost = {
                    let l = self.drop_per_mille > 0 && self.rng.next() % 1000 < self.drop_per_mille;
                    self.dropped += l as u64;
                    l
                };
                if !lost {
                    self.to_client
                        .push_back((now + DELAY, buf[..t.size].to_vec()));
                }
            }
        }
        busy
    }

    /// The next instant anything is due.
    fn next_event(&self) -> Option<Instant> {
        let mut t: Vec<Instant> = Vec::new();
        t.extend(self.to_server.front().map(|x| x.0));
        t.extend(self.to_client.front().map(|x| x.0));
        t.extend(self.client.borrow_mut().poll_timeout());
        if let Some(s) = &self.server {
            t.extend(s.conn.borrow_mut().poll_timeout());
            t.extend(s.task.timeout());
        }
        t.into_iter().min()
    }

    /// Runs until `client` is done (or the virtual time is over `limit`).
    fn run<T>(&mut self, client: &mut Driven<T>, limit: Duration) -> Option<T> {
        let end = self.now + limit;
        while client.out.is_none() && self.now < end {
            if !self.turn(client) {
                match self.next_event() {
                    Some(t) if t > self.now => self.now = t,
                    // Due but idle (a task held back): let time pass.
                    Some(_) => self.now += Duration::from_millis(1),
                    None => break,
                }
            }
        }
        if client.out.is_none() {
            let c = self.client.borrow();
            eprintln!(
                "stalled at +{:?} after {} turns: client handshaking {} closed {}, server {}, server task done {:?}, queues {} {}",
                self.now - (end - limit),
                self.turns,
                c.is_handshaking(),
                c.is_closed(),
                self.server.is_some(),
                self.server.as_ref().map(|s| s.task.is_done()),
                self.to_server.len(),
                self.to_client.len(),
            );
        }
        client.out.take()
    }

    /// Runs for `d` of virtual time.
    fn idle<T>(&mut self, client: &mut Driven<T>, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            if !self.turn(client) {
                match self.next_event() {
                    Some(t) if t > self.now && t <= end => self.now = t,
                    Some(t) if t <= self.now => self.now += Duration::from_millis(1),
                    _ => self.now = end,
                }
            }
        }
    }

    fn server(&self) -> &ServerConn {
        self.server.as_ref().expect("server connection")
    }

    fn h3_client(&self) -> H3Conn {
        H3Conn::new(self.client_link.clone())
    }
}

type Error = Box<dyn std::error::Error>;
/// Each response's status and body.
type Responses = Vec<(u16, Vec<u8>)>;

/// GETs `path` on an h3 client and returns the status and the body.
async fn get(
    send: &mut ::h3::client::SendRequest<super::backend::H3Opener, Bytes>,
    path: &str,
) -> Result<(u16, Vec<u8>), Error> {
    let req = http::Request::get(format!("https://localhost{path}")).body(())?;
    let mut s = send.send_request(req).await?;
    s.finish().await?;
    let resp = s.recv_response().await?;
    let mut body = Vec::new();
    while let Some(mut c) = s.recv_data().await? {
        while c.has_remaining() {
            let ch = c.chunk();
            body.extend_from_slice(ch);
            let n = ch.len();
            c.advance(n);
        }
    }
    Ok((resp.status().as_u16(), body))
}

/// An h3 client that runs `paths` in parallel on one connection and
/// returns each status and body.
fn client(conn: H3Conn, paths: Vec<String>) -> Driven<anyhow::Result<Responses>> {
    Driven::new(async move {
        let (mut driver, send) = ::h3::client::new(conn).await?;
        let reqs = async move {
            let futs = paths.into_iter().map(|p| {
                let mut send = send.clone();
                async move { get(&mut send, &p).await.map_err(|e| anyhow::anyhow!("{e}")) }
            });
            futures_util::future::join_all(futs)
                .await
                .into_iter()
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let drive = std::future::poll_fn(|cx| driver.poll_close(cx));
        futures_util::pin_mut!(reqs);
        futures_util::pin_mut!(drive);
        match futures_util::future::select(reqs, drive).await {
            futures_util::future::Either::Left((r, _)) => r,
            futures_util::future::Either::Right((e, _)) => {
                Err(anyhow::anyhow!("connection ended: {e}"))
            }
        }
    })
}

/// An h3 client that runs `paths` in parallel, puts the results in `out`,
/// and then keeps its connection (h3's driver) running.
fn client_staying(
    conn: H3Conn,
    paths: Vec<String>,
    out: Rc<RefCell<Option<Responses>>>,
) -> Driven<String> {
    Driven::new(async move {
        let (mut driver, send) = match ::h3::client::new(conn).await {
            Ok(x) => x,
            Err(e) => return e.to_string(),
        };
        let reqs = async move {
            let futs = paths.into_iter().map(|p| {
                let mut send = send.clone();
                async move { get(&mut send, &p).await.map_err(|e| e.to_string()) }
            });
            let r = futures_util::future::join_all(futs).await;
            *out.borrow_mut() = Some(r.into_iter().collect::<Result<Vec<_>, _>>().expect("ok"));
            // Keep the connection's request sender alive.
            std::future::pending::<()>().await;
            send
        };
        let drive = std::future::poll_fn(|cx| driver.poll_close(cx));
        futures_util::pin_mut!(reqs);
        futures_util::pin_mut!(drive);
        match futures_util::future::select(reqs, drive).await {
            futures_util::future::Either::Left(_) => "the requests ended".into(),
            futures_util::future::Either::Right((e, _)) => format!("connection ended: {e}"),
        }
    })
}

fn check_pattern(body: &[u8], len: usize) {
    assert_eq!(body.len(), len);
    if let Some(i) = (0..len).find(|&i| body[i] != pattern_byte(i as u64)) {
        panic!("byte {i} differs");
    }
}

#[test]
fn get_bytes_is_byte_exact() {
    let mut p = Pair::new(None);
    let mut c = client(p.h3_client(), vec!["/bytes/300000".into()]);
    let r = p
        .run(&mut c, Duration::from_secs(30))
        .expect("finished")
        .expect("ok");
    assert_eq!(r[0].0, 200);
    check_pattern(&r[0].1, 300_000);
    let s = p.server().task.stats();
    assert_eq!((s.requests, s.refused, s.cut), (1, 0, 0));
    assert_eq!(p.server().task.link().stats().borrow_faults, 0);
    // The finished stream is handed over for goodput: the body and its
    // framing.
    let f = p.server().task.take_finished();
    assert_eq!(f.len(), 1, "{f:?}");
    assert!((300_000..301_000).contains(&f[0].1), "{f:?}");
}

#[test]
fn parallel_requests_on_one_connection() {
    let mut p = Pair::new(None);
    let sizes = [0usize, 1, 1000, 65_536, 65_537, 200_000, 333_333, 1_000_000];
    let paths = sizes.iter().map(|n| format!("/bytes/{n}")).collect();
    let mut c = client(p.h3_client(), paths);
    let r = p
        .run(&mut c, Duration::from_secs(60))
        .expect("finished")
        .expect("ok");
    for (i, n) in sizes.iter().enumerate() {
        assert_eq!(r[i].0, 200, "/bytes/{n}");
        check_pattern(&r[i].1, *n);
    }
    assert_eq!(p.server().task.stats().requests, sizes.len() as u64);
}

#[test]
fn more_requests_than_streams_wait_for_credit() {
    let mut p = Pair::new(None);
    let n = STREAMS as usize * 2 + 3;
    let paths = (0..n).map(|i| format!("/bytes/{}", 1000 + i)).collect();
    let mut c = client(p.h3_client(), paths);
    let r = p
        .run(&mut c, Duration::from_secs(60))
        .expect("finished")
        .expect("ok");
    for (i, (status, body)) in r.iter().enumerate() {
        assert_eq!(*status, 200);
        check_pattern(body, 1000 + i);
    }
}

/// A client window of 4 KiB: the server's writes are refused again and
/// again, each refusal is followed by a `Writable`, and the response
/// completes.
#[test]
fn small_client_window_completes_on_writable_wakes() {
    let mut p = Pair::new(Some(4096));
    let mut c = client(
        p.h3_client(),
        vec!["/bytes/200000".into(), "/bytes/150000".into()],
    );
    let r = p
        .run(&mut c, Duration::from_secs(60))
        .expect("finished")
        .expect("ok");
    check_pattern(&r[0].1, 200_000);
    check_pattern(&r[1].1, 150_000);
    let w = p.server().writable;
    assert!(
        w >= 30,
        "only {w} Writable events: the window did not block"
    );
}

#[test]
fn unknown_path_is_404_and_head_has_no_body() {
    let mut p = Pair::new(None);
    let mut c = Driven::new({
        let conn = p.h3_client();
        async move {
            let (mut driver, mut send) =
                ::h3::client::new(conn).await.map_err(|e| e.to_string())?;
            let reqs = async move {
                let a = get(&mut send, "/nothing/here")
                    .await
                    .map_err(|e| e.to_string())?;
                let req = http::Request::head("https://localhost/bytes/5000")
                    .body(())
                    .map_err(|e| e.to_string())?;
                let mut s = send.send_request(req).await.map_err(|e| e.to_string())?;
                s.finish().await.map_err(|e| e.to_string())?;
                let resp = s.recv_response().await.map_err(|e| e.to_string())?;
                let len = resp.headers().get("content-length").cloned();
                let data = s.recv_data().await.map_err(|e| e.to_string())?.is_some();
                let req = http::Request::post("https://localhost/bytes/5")
                    .body(())
                    .map_err(|e| e.to_string())?;
                let mut s = send.send_request(req).await.map_err(|e| e.to_string())?;
                s.finish().await.map_err(|e| e.to_string())?;
                let post = s.recv_response().await.map_err(|e| e.to_string())?.status();
                Ok::<_, String>((a, resp.status().as_u16(), len, data, post.as_u16()))
            };
            let drive = std::future::poll_fn(|cx| driver.poll_close(cx));
            futures_util::pin_mut!(reqs);
            futures_util::pin_mut!(drive);
            match futures_util::future::select(reqs, drive).await {
                futures_util::future::Either::Left((r, _)) => r,
                futures_util::future::Either::Right((e, _)) => Err(e.to_string()),
            }
        }
    });
    let (a, head, len, data, post) = p
        .run(&mut c, Duration::from_secs(30))
        .expect("finished")
        .expect("ok");
    assert_eq!(a, (404, Vec::new()));
    assert_eq!(head, 200);
    assert_eq!(len.as_ref().and_then(|v| v.to_str().ok()), Some("5000"));
    assert!(!data, "HEAD got a body");
    assert_eq!(post, 405);
}

/// QPACK (RFC 9204 4.1.1): `v` with an `n`-bit prefix after `flags`.
fn prefix_int(out: &mut Vec<u8>, flags: u8, n: u32, mut v: u64) {
    let max = (1u64 << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

fn varint_bytes(out: &mut Vec<u8>, v: u64) {
    let mut b = BytesMut::new();
    quinn_proto::coding::Codec::encode(&VarInt::from_u64(v).unwrap(), &mut b);
    out.extend_from_slice(&b);
}

/// A HEADERS frame for `GET /bytes/10` with one extra header of `big`
/// bytes, QPACK-encoded by hand (h3's client refuses to send it once it
/// knows the server's limit).
fn big_request(big: usize) -> Vec<u8> {
    let mut block = vec![0, 0]; // required insert count 0, base 0
    block.push(0xC0 | 17); // :method GET (static 17)
    block.push(0xC0 | 23); // :scheme https (static 23)
    prefix_int(&mut block, 0x50, 4, 1); // :path, name from static 1
    prefix_int(&mut block, 0, 7, 9);
    block.extend_from_slice(b"/bytes/10");
    prefix_int(&mut block, 0x50, 4, 0); // :authority, static 0
    prefix_int(&mut block, 0, 7, 9);
    block.extend_from_slice(b"localhost");
    prefix_int(&mut block, 0x20, 3, 5); // literal name
    block.extend_from_slice(b"x-big");
    prefix_int(&mut block, 0, 7, big as u64);
    block.extend(std::iter::repeat_n(b'a', big));
    let mut frame = Vec::new();
    varint_bytes(&mut frame, 1); // HEADERS
    varint_bytes(&mut frame, block.len() as u64);
    frame.extend_from_slice(&block);
    frame
}

/// Writes `data` and FIN on a new bidirectional stream of the client's
/// connection, then reads what comes back until FIN or reset.
struct RawRequest {
    id: Option<quinn_proto::StreamId>,
    data: Vec<u8>,
    written: usize,
    got: Vec<u8>,
    end: Option<Result<(), u64>>,
}

impl RawRequest {
    fn step(&mut self, conn: &ConnRef) {
        let mut c = conn.borrow_mut();
        if self.id.is_none() {
            self.id = c.streams().open(Dir::Bi);
        }
        let Some(id) = self.id else { return };
        while self.written < self.data.len() {
            match c.send_stream(id).write(&self.data[self.written..]) {
                Ok(n) => self.written += n,
                Err(_) => return,
            }
        }
        let _ = c.send_stream(id).finish();
        if self.end.is_some() {
            return;
        }
        let mut s = c.recv_stream(id);
        let Ok(mut chunks) = s.read(true) else { return };
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(ch)) => self.got.extend_from_slice(&ch.bytes),
                Ok(None) => {
                    self.end = Some(Ok(()));
                    break;
                }
                Err(quinn_proto::ReadError::Reset(code)) => {
                    self.end = Some(Err(code.into_inner()));
                    break;
                }
                Err(quinn_proto::ReadError::Blocked) => break,
            }
        }
        let _ = chunks.finalize();
    }
}

/// A header section over 16 KiB is answered 431; one over the request
/// stream's cap is refused with H3_EXCESSIVE_LOAD before h3 buffers it;
/// the connection serves a normal request after both.
#[test]
fn oversized_header_sections_are_refused() {
    let mut p = Pair::new(None);
    // Handshake and h3's control streams first.
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    let mut over = RawRequest {
        id: None,
        data: big_request(MAX_FIELD_SECTION as usize + 1000),
        written: 0,
        got: Vec::new(),
        end: None,
    };
    let mut huge = RawRequest {
        id: None,
        data: big_request(REQUEST_STREAM_CAP as usize * 4),
        written: 0,
        got: Vec::new(),
        end: None,
    };
    for _ in 0..400 {
        over.step(&p.client);
        huge.step(&p.client);
        p.idle(&mut idle, Duration::from_millis(5));
        if over.end.is_some() && huge.end.is_some() {
            break;
        }
    }
    // 431: `:status` as a literal with the static name 24 and the
    // Huffman-coded value "431".
    assert_eq!(over.end, Some(Ok(())), "the 431 response did not end");
    assert!(
        over.got
            .windows(6)
            .any(|w| w == [0x5F, 0x09, 0x83, 0x69, 0x90, 0xFF]),
        "no :status 431 in {:02x?}",
        over.got
    );
    assert_eq!(huge.end, Some(Err(super::backend::H3_EXCESSIVE_LOAD)));
    let s = p.server().task.stats();
    assert_eq!((s.requests, s.refused), (0, 2));
    assert_eq!(p.server().task.link().stats().request_streams_over_cap, 1);
    // The connection still serves.
    let mut c = client(p.h3_client(), vec!["/bytes/1000".into()]);
    let r = p
        .run(&mut c, Duration::from_secs(10))
        .expect("finished")
        .expect("ok");
    check_pattern(&r[0].1, 1000);
}

/// A request stream whose header section never completes (half a
/// HEADERS frame, or nothing at all, without FIN) is reset and stopped
/// with `H3_REQUEST_INCOMPLETE` at the request deadline and counted; it
/// does not hold its place until the connection's idle timeout. The
/// connection still serves.
#[test]
fn an_unfinished_request_head_has_a_deadline() {
    let mut p = Pair::new(None);
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    let frame = big_request(10);
    let (half, empty) = {
        let mut c = p.client.borrow_mut();
        let half = c.streams().open(Dir::Bi).unwrap();
        let n = c
            .send_stream(half)
            .write(&frame[..frame.len() / 2])
            .unwrap();
        assert_eq!(n, frame.len() / 2);
        let empty = c.streams().open(Dir::Bi).unwrap();
        // A stream is opened on the wire by its first frame: one byte of
        // a frame type that never ends (a 2-byte varint).
        c.send_stream(empty).write(&[0x40]).unwrap();
        (half, empty)
    };
    let reset = |p: &Pair, id| -> Option<u64> {
        let mut c = p.client.borrow_mut();
        let mut s = c.recv_stream(id);
        let mut chunks = s.read(true).ok()?;
        let r = match chunks.next(usize::MAX) {
            Err(quinn_proto::ReadError::Reset(code)) => Some(code.into_inner()),
            _ => None,
        };
        let _ = chunks.finalize();
        r
    };
    p.idle(
        &mut idle,
        crate::limits::REQUEST_TIMEOUT - Duration::from_millis(500),
    );
    assert_eq!(reset(&p, half), None, "reset before the deadline");
    p.idle(&mut idle, Duration::from_secs(1));
    assert_eq!(reset(&p, half), Some(super::task::H3_REQUEST_INCOMPLETE));
    assert_eq!(reset(&p, empty), Some(super::task::H3_REQUEST_INCOMPLETE));
    assert_eq!(p.server().task.stats().timeouts, 2);
    assert!(
        p.client.borrow_mut().send_stream(half).write(b"x").is_err(),
        "not stopped"
    );
    // The deadline is the head's only: a response that lasts longer (7 s
    // of video) is whole.
    let mut c = client(
        p.h3_client(),
        vec!["/bytes/1000".into(), "/video/10000/7".into()],
    );
    let r = p
        .run(&mut c, Duration::from_secs(20))
        .expect("finished")
        .expect("ok");
    check_pattern(&r[0].1, 1000);
    check_pattern(&r[1].1, 70_000);
    assert_eq!(p.server().task.stats().timeouts, 2);
}

/// A client that stops the server's control stream (STOP_SENDING)
/// closes the connection with H3_CLOSED_CRITICAL_STREAM (RFC 9114 6.2.1),
/// counted; before, the server went on without its control stream.
#[test]
fn a_stopped_control_stream_closes_the_connection() {
    let mut p = Pair::new(None);
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    // The server's first unidirectional stream (id 3): its control stream.
    let ctrl = quinn_proto::StreamId::from(VarInt::from_u32(3));
    p.client
        .borrow_mut()
        .recv_stream(ctrl)
        .stop(VarInt::from_u32(0x100))
        .expect("the server's control stream is open");
    p.idle(&mut idle, Duration::from_secs(1));
    assert_eq!(p.server().task.link().stats().critical_streams_stopped, 1);
    assert!(p.server().conn.borrow().is_closed(), "server did not close");
    assert!(p.client.borrow().is_closed(), "client saw no close");
}

/// Responses the client stops (STOP_SENDING) free their streams: more
/// than the stream limit of them, one after another, and the connection
/// still serves. Before, a stopped stream was never reset, so quinn-proto
/// never freed it nor gave the client its credit back: after 16 the
/// connection could open no request.
#[test]
fn stopped_responses_free_their_streams() {
    let mut p = Pair::new(None);
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    let frame = {
        let mut block = vec![0, 0, 0xC0 | 17, 0xC0 | 23];
        prefix_int(&mut block, 0x50, 4, 1);
        let path = b"/bytes/1000000000";
        prefix_int(&mut block, 0, 7, path.len() as u64);
        block.extend_from_slice(path);
        prefix_int(&mut block, 0x50, 4, 0);
        prefix_int(&mut block, 0, 7, 9);
        block.extend_from_slice(b"localhost");
        let mut f = Vec::new();
        varint_bytes(&mut f, 1);
        varint_bytes(&mut f, block.len() as u64);
        f.extend_from_slice(&block);
        f
    };
    for i in 0..(2 * STREAMS) {
        let start = p.now;
        let id = loop {
            if let Some(id) = p.client.borrow_mut().streams().open(Dir::Bi) {
                break id;
            }
            assert!(
                p.now - start < Duration::from_secs(5),
                "no stream credit after {i} stopped responses"
            );
            p.idle(&mut idle, Duration::from_millis(50));
        };
        {
            let mut c = p.client.borrow_mut();
            assert_eq!(c.send_stream(id).write(&frame).unwrap(), frame.len());
            c.send_stream(id).finish().unwrap();
        }
        // Some of the response, then STOP_SENDING.
        p.idle(&mut idle, Duration::from_millis(50));
        p.client
            .borrow_mut()
            .recv_stream(id)
            .stop(VarInt::from_u32(0x10c))
            .unwrap();
        p.idle(&mut idle, Duration::from_millis(50));
    }
    let mut c = client(p.h3_client(), vec!["/bytes/1000".into()]);
    let r = p
        .run(&mut c, Duration::from_secs(10))
        .expect("finished")
        .expect("ok");
    check_pattern(&r[0].1, 1000);
}

/// The task is polled only when woken, and an idle connection's task is
/// not polled at all.
#[test]
fn task_is_polled_only_when_woken() {
    let mut p = Pair::new(None);
    let out = Rc::new(RefCell::new(None));
    let paths = vec!["/bytes/100000".into(), "/bytes/5".into()];
    let mut c = client_staying(p.h3_client(), paths, out.clone());
    p.idle(&mut c, Duration::from_millis(10));
    while out.borrow().is_none() {
        assert!(c.out.is_none(), "client: {:?}", c.out);
        p.idle(&mut c, Duration::from_millis(10));
    }
    check_pattern(&out.borrow().as_ref().unwrap()[0].1, 100_000);
    let t = &p.server().task;
    let (polls, wakes) = (t.polls(), t.wakes());
    // One poll for the start; every other one follows a wake.
    assert!(polls <= wakes + 1, "polls {polls} > wakes {wakes} + 1");
    assert!(
        polls < p.turns,
        "polled on every turn: {polls} of {}",
        p.turns
    );
    // Idle for 2 s of virtual time (ACKs, no requests): no poll.
    let turns = p.turns;
    p.idle(&mut c, Duration::from_secs(2));
    assert!(p.turns > turns);
    assert_eq!(p.server().task.polls(), polls, "polled while idle");
    assert!(c.out.is_none(), "client: {:?}", c.out);
}

/// Video frames are timed by the task's timer (no runtime timer): the
/// task's `timeout()` is the next frame, and the body arrives over the
/// stream's duration.
#[test]
fn video_frames_follow_the_task_timer() {
    let mut p = Pair::new(None);
    let start = p.now;
    // 100 kB/s for 2 s: 20 frames of 10 kB, 100 ms apart.
    let mut c = client(p.h3_client(), vec!["/video/100000/2".into()]);
    let r = p
        .run(&mut c, Duration::from_secs(30))
        .expect("finished")
        .expect("ok");
    check_pattern(&r[0].1, 200_000);
    let took = p.now - start;
    assert!(took >= Duration::from_millis(1900), "took {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // The task slept between frames: far fewer polls than 1 ms ticks.
    assert!(
        p.server().task.polls() < 400,
        "polls {}",
        p.server().task.polls()
    );
}

/// The client closes its connection in the middle of a response: the
/// server's task ends, without a panic, and counts the cut response.
#[test]
fn connection_closed_mid_response_ends_the_task() {
    let mut p = Pair::new(Some(64 * 1024));
    let mut c = client(p.h3_client(), vec!["/bytes/50000000".into()]);
    // Run until the response is under way.
    for _ in 0..20 {
        p.idle(&mut c, Duration::from_millis(20));
    }
    assert!(c.out.is_none(), "finished too early");
    let now = p.now;
    p.client
        .borrow_mut()
        .close(now, VarInt::from_u32(0x100), Bytes::from_static(b"bye"));
    for _ in 0..100 {
        p.idle(&mut c, Duration::from_millis(50));
        if p.server().task.is_done() {
            break;
        }
    }
    let s = p.server();
    assert!(s.task.is_done(), "the server task did not end");
    assert_eq!(s.task.stats().cut, 1);
    assert_eq!(s.task.link().stats().borrow_faults, 0);
    assert_eq!(s.task.timeout(), None);
}

#[test]
fn five_percent_loss_still_completes() {
    let mut p = Pair::new(None);
    p.drop_per_mille = 50;
    let paths = (0..4).map(|i| format!("/bytes/{}", 250_000 + i)).collect();
    let mut c = client(p.h3_client(), paths);
    let r = p
        .run(&mut c, Duration::from_secs(120))
        .expect("finished")
        .expect("ok");
    for (i, (status, body)) in r.iter().enumerate() {
        assert_eq!(*status, 200);
        check_pattern(body, 250_000 + i);
    }
    assert!(p.dropped > 20, "only {} datagrams dropped", p.dropped);
}

/// A borrow of the connection that fails (the engine holding it while the
/// task runs, which it must not) is counted, ends the task and closes the
/// connection with H3_INTERNAL_ERROR once the borrow is released: no
/// panic.
#[test]
fn a_failed_borrow_is_counted_and_closes() {
    let mut p = Pair::new(None);
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    // A request reaches the server; its task is woken but not polled.
    p.hold_task = true;
    let mut raw = RawRequest {
        id: None,
        data: big_request(10),
        written: 0,
        got: Vec::new(),
        end: None,
    };
    raw.step(&p.client);
    p.idle(&mut idle, Duration::from_millis(50));
    let now = p.now;
    {
        let s = p.server.as_mut().expect("server");
        assert!(!s.task.is_done());
        assert!(
            s.task.timeout().is_some_and(|t| t <= now),
            "the request did not wake the task"
        );
        // The task runs while the connection is borrowed.
        let conn = s.conn.clone();
        let _held = conn.borrow_mut();
        assert!(s.task.poll(now), "the task goes on without its connection");
        assert!(s.task.link().stats().borrow_faults >= 1);
        // The close waits for the borrow: the task asks to be driven.
        assert_eq!(s.task.timeout(), Some(now));
    }
    p.hold_task = false;
    p.idle(&mut idle, Duration::from_millis(100));
    assert_eq!(p.server().task.timeout(), None);
    match p.client_link.error() {
        Some(::h3::quic::ConnectionErrorIncoming::ApplicationClose { error_code }) => {
            assert_eq!(error_code, super::backend::H3_INTERNAL_ERROR)
        }
        other => panic!("client saw {other:?}"),
    }
}

/// A frame on the client's control stream longer than
/// [`super::CONTROL_FRAME_MAX`] closes the connection with
/// H3_EXCESSIVE_LOAD before h3 buffers it; frames within it are fine.
#[test]
fn a_long_control_frame_closes_the_connection() {
    let mut p = Pair::new(None);
    let mut idle: Driven<()> = Driven::new(std::future::pending());
    p.idle(&mut idle, Duration::from_millis(200));
    let id = p.client.borrow_mut().streams().open(Dir::Uni).expect("uni");
    // Control stream, SETTINGS (empty), a reserved frame type 0x21 of
    // 1 KiB (fine), then one of 100 KiB.
    let mut data = vec![0x00, 0x04, 0x00];
    varint_bytes(&mut data, 0x21);
    varint_bytes(&mut data, 1024);
    data.extend(std::iter::repeat_n(7u8, 1024));
    let fine = data.len();
    varint_bytes(&mut data, 0x21);
    varint_bytes(&mut data, 100 * 1024);
    data.extend(std::iter::repeat_n(7u8, 100 * 1024));
    let mut written = 0;
    for _ in 0..400 {
        {
            let mut c = p.client.borrow_mut();
            while written < data.len() {
                match c.send_stream(id).write(&data[written..]) {
                    Ok(n) => written += n,
                    Err(_) => break,
                }
            }
        }
        p.idle(&mut idle, Duration::from_millis(5));
        if p.client_link.error().is_some() {
            break;
        }
    }
    assert!(written > fine);
    match p.client_link.error() {
        Some(::h3::quic::ConnectionErrorIncoming::ApplicationClose { error_code }) => {
            assert_eq!(error_code, super::backend::H3_EXCESSIVE_LOAD)
        }
        other => panic!("client saw {other:?}"),
    }
    assert_eq!(p.server().task.link().stats().control_frames_too_long, 1);
}

/// Static files through the handler seam: GET byte-exact, a single range
/// (206), HEAD (headers only), an escape and a missing file (404).
#[test]
fn files_are_served_with_ranges() {
    let dir = std::env::temp_dir().join(format!("fastudp-h3-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(dir.join("a.bin"), &content).unwrap();
    let root = match crate::files::Root::open(&dir) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            // openat2 refused here (an old kernel, a seccomp filter): the
            // file server refuses to start, so there is nothing to test.
            let _ = std::fs::remove_dir_all(&dir);
            if std::env::var("FASTUDP_REQUIRE_PRIVILEGED_TESTS").as_deref() == Ok("1") {
                panic!("files_are_served_with_ranges: openat2 unavailable: {e}");
            }
            fastudp_test_support::note(
                &fastudp_test_support::current_test(),
                &format!("openat2 unavailable: {e}"),
            );
            return;
        }
    };
    let mut p = Pair::new(None);
    let handler = super::FilesHandler::new(root.clone());
    p.handler = Rc::new(Builtin::new(TestContent).with_fallback(Rc::new(handler)));
    let mut c = Driven::new({
        let conn = p.h3_client();
        async move {
            let (mut driver, send) = ::h3::client::new(conn).await.map_err(|e| e.to_string())?;
            let reqs = async move {
                let mut out = Vec::new();
                for (method, path, range) in [
                    ("GET", "/a.bin", None),
                    ("GET", "/a.bin", Some("bytes=1000-1999")),
                    ("HEAD", "/a.bin", None),
                    ("GET", "/../a.bin", None),
                    ("GET", "/%2e%2e/a.bin", None),
                    ("GET", "/missing", None),
                    ("GET", "/bytes/10", None),
                ] {
                    let mut send = send.clone();
                    let mut b = http::Request::builder()
                        .method(method)
                        .uri(format!("https://localhost{path}"));
                    if let Some(r) = range {
                        b = b.header("range", r);
                    }
                    let req = b.body(()).map_err(|e| e.to_string())?;
                    let mut s = send.send_request(req).await.map_err(|e| e.to_string())?;
                    s.finish().await.map_err(|e| e.to_string())?;
                    let resp = s.recv_response().await.map_err(|e| e.to_string())?;
                    let mut body = Vec::new();
                    while let Some(mut d) = s.recv_data().await.map_err(|e| e.to_string())? {
                        while d.has_remaining() {
                            let ch = d.chunk();
                            body.extend_from_slice(ch);
                            let n = ch.len();
                            d.advance(n);
                        }
                    }
                    let len = resp
                        .headers()
                        .get("content-length")
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                    out.push((resp.status().as_u16(), len, body));
                }
                Ok::<_, String>(out)
            };
            let drive = std::future::poll_fn(|cx| driver.poll_close(cx));
            futures_util::pin_mut!(reqs);
            futures_util::pin_mut!(drive);
            match futures_util::future::select(reqs, drive).await {
                futures_util::future::Either::Left((r, _)) => r,
                futures_util::future::Either::Right((e, _)) => Err(e.to_string()),
            }
        }
    });
    let r = p.run(&mut c, Duration::from_secs(60)).expect("finished");
    let _ = std::fs::remove_dir_all(&dir);
    let r = r.expect("ok");
    assert_eq!((r[0].0, r[0].1), (200, Some(300_000)));
    assert!(r[0].2 == content, "the file differs");
    assert_eq!((r[1].0, r[1].1), (206, Some(1000)));
    assert!(r[1].2 == content[1000..2000], "the range differs");
    assert_eq!((r[2].0, r[2].1, r[2].2.len()), (200, Some(300_000), 0));
    assert_eq!(r[3].0, 404);
    assert_eq!(r[4].0, 404);
    assert_eq!(r[5].0, 404);
    assert_eq!(r[6].0, 200);
    check_pattern(&r[6].2, 10);
    assert!(root.stats().escapes_refused >= 1, "{:?}", root.stats());
    // Every body byte went to quinn-proto by reference, none copied.
    assert_eq!(
        p.server().task.link().stats().body_bytes_by_reference,
        300_000 + 1000 + 10
    );
}

/// The public HTTP/3 codes are the ones the engine's HTTP/3 sends, and
/// HTTP/3's close codes are HTTP/3's.
#[test]
fn the_public_codes_are_the_ones_sent() {
    use super::code;
    assert_eq!(code::H3_NO_ERROR, super::backend::H3_NO_ERROR);
    assert_eq!(code::H3_INTERNAL_ERROR, super::backend::H3_INTERNAL_ERROR);
    assert_eq!(code::H3_EXCESSIVE_LOAD, super::backend::H3_EXCESSIVE_LOAD);
    assert_eq!(
        code::H3_CLOSED_CRITICAL_STREAM,
        super::backend::H3_CLOSED_CRITICAL_STREAM
    );
    assert_eq!(
        code::H3_REQUEST_INCOMPLETE,
        super::task::H3_REQUEST_INCOMPLETE
    );
    assert_eq!(code::H3_REQUEST_REJECTED, super::task::H3_REQUEST_REJECTED);
    assert_eq!(
        code::H3_MESSAGE_ERROR,
        u64::from(::h3::error::Code::H3_MESSAGE_ERROR)
    );
    assert_eq!(
        code::H3_GENERAL_PROTOCOL_ERROR,
        u64::from(::h3::error::Code::H3_GENERAL_PROTOCOL_ERROR)
    );
    assert_eq!(
        code::H3_GENERAL_PROTOCOL_ERROR,
        u64::from(crate::app::REFUSED)
    );
    use crate::app::{Application, CloseCodes};
    let app = super::H3App::builtin();
    assert_eq!(app.close_codes(super::ALPN), CloseCodes::HTTP3);
    assert_eq!(CloseCodes::HTTP3.address_limit, code::H3_EXCESSIVE_LOAD);
    let router = crate::app::Router::new()
        .with(super::ALPN, super::H3App::builtin())
        .with(crate::hq::wire::ALPN, crate::app::hq::HqApp::default());
    assert_eq!(router.close_codes(b"h3"), CloseCodes::HTTP3);
    assert_eq!(router.close_codes(b"hq-interop"), CloseCodes::HQ_INTEROP);
    assert_eq!(CloseCodes::HQ_INTEROP.address_limit, 0x14);
}

/// A service that reads the request body to its end and answers its
/// length; counts the DATA chunks it was handed.
#[derive(Clone)]
struct BodySink(Rc<std::cell::Cell<u64>>);

impl tower_service::Service<http::Request<super::RequestBody>> for BodySink {
    type Response = http::Response<String>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<super::RequestBody>) -> Self::Future {
        let chunks = self.0.clone();
        Box::pin(async move {
            let mut body = req.into_body();
            let mut n = 0u64;
            while let Some(f) =
                std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut body), cx))
                    .await
            {
                if let Ok(d) = f.expect("a body frame").into_data() {
                    n += d.len() as u64;
                    chunks.set(chunks.get() + 1);
                }
            }
            Ok(http::Response::new(n.to_string()))
        })
    }
}

/// An h3 client that POSTs `len` bytes to `/upload`, 10 kB per DATA
/// frame, and returns the status and the body of the answer.
fn uploader(conn: H3Conn, len: usize) -> Driven<anyhow::Result<(u16, Vec<u8>)>> {
    Driven::new(async move {
        let (mut driver, mut send) = ::h3::client::new(conn).await?;
        let req = async move {
            let r = http::Request::post("https://localhost/upload").body(())?;
            let mut s = send.send_request(r).await?;
            let mut off = 0;
            while off < len {
                let n = (len - off).min(10_000);
                s.send_data(Bytes::from(vec![7u8; n])).await?;
                off += n;
            }
            s.finish().await?;
            let resp = s.recv_response().await?;
            let mut body = Vec::new();
            while let Some(mut c) = s.recv_data().await? {
                body.extend_from_slice(&c.copy_to_bytes(c.remaining()));
            }
            anyhow::Ok((resp.status().as_u16(), body))
        };
        let drive = std::future::poll_fn(|cx| driver.poll_close(cx));
        futures_util::pin_mut!(req);
        futures_util::pin_mut!(drive);
        match futures_util::future::select(req, drive).await {
            futures_util::future::Either::Left((r, _)) => r,
            futures_util::future::Either::Right((e, _)) => {
                Err(anyhow::anyhow!("connection ended: {e}"))
            }
        }
    })
}

/// A request body's chunks already received reach the service in the
/// same poll of the task, as long as it asks for them: an upload is not
/// moved one chunk per poll (which, in the engine, is a few packets per
/// timer tick).
#[test]
fn a_service_takes_the_received_body_chunks_in_one_poll() {
    let mut p = Pair::new(None);
    let chunks = Rc::new(std::cell::Cell::new(0));
    let info = crate::app::ConnInfo {
        remote: CLIENT.parse().unwrap(),
        local: SERVER.parse().unwrap(),
        server_name: None,
        alpn: Some(super::ALPN.to_vec()),
        worker: 0,
        bidi_streams: STREAMS,
    };
    p.service = Some(super::service::responder(
        BodySink(chunks.clone()),
        info,
        super::ALPN,
    ));
    const LEN: usize = 1_000_000;
    let mut c = uploader(p.h3_client(), LEN);
    let (status, body) = p
        .run(&mut c, Duration::from_secs(60))
        .expect("finished")
        .expect("ok");
    assert_eq!((status, body), (200, LEN.to_string().into_bytes()));
    let (polls, chunks) = (p.server().task.polls(), chunks.get());
    eprintln!("{chunks} body chunks in {polls} polls of the task");
    assert!(chunks > 100, "{chunks} chunks: the test needs many");
    assert!(
        polls * 4 < chunks,
        "{polls} polls for {chunks} chunks: about one chunk per poll"
    );
}
