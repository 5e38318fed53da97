//! `fastudp quic serve --upstream URL`: a reverse proxy in front of
//! HTTP/1.1 upstreams.
//!
//! [`Proxy`] is a `tower::Service`: HTTP/3 requests reach it through the
//! engine's service adapter ([`fastudp_quic::h3::H3App::service_per_worker`],
//! a proxy with its own pooled client per worker), and requests over
//! TLS/TCP (HTTP/1.1 and HTTP/2) through hyper-util's auto server
//! ([`TcpFront`]). It sends each one to an upstream through hyper-util's
//! pooled HTTP/1.1 client, bodies streamed both ways frame by frame (one
//! frame held at a time: the sender waits while the receiver does not
//! read).
//!
//! - The upstreams are taken in turn (round robin); one whose connection
//!   fails is skipped for [`FAIL_DURATION`] (passive health; a timeout,
//!   or the proxy's own lack of descriptors, does not skip it). With
//!   every upstream skipped the answer is 502 at once. Requests in
//!   flight are bounded per route and per client address (503 past
//!   them).
//! - Refused (or any error before a response head): 502. No response head
//!   within `--upstream-timeout`: 504. An upstream that fails during the
//!   response body: the error reaches the client as a reset HTTP/3 stream
//!   (or an aborted HTTP/1.1 or HTTP/2 response), never a shorter 200.
//! - Hop-by-hop headers (RFC 9110 7.6.1, and those the `Connection` header
//!   names) are removed both ways. `Host` is kept (HTTP/3 and HTTP/2 carry
//!   it as `:authority`, which becomes `Host`). `X-Forwarded-For`,
//!   `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded` (RFC 7239) are
//!   set from the connection, replacing what the client sent: a client
//!   cannot forge its address to the upstream.
//!
//! # Routes
//!
//! A [`Table`] of routes (`[[route]]` in the configuration file,
//! [`super::config`]) sends each request by the longest path prefix that
//! matches it: to a set of upstreams (round robin, passive health, as
//! above), or to the files beneath a directory (`www`, served as `--www`
//! serves them, the whole request path looked up beneath it). `--upstream`
//! alone is the route `/` to its upstreams. With `--test-endpoints`,
//! `/bytes/N` and `/video/RATE/SECONDS` come first. A path no route
//! matches is 404. With `--access-log`, each request's line is sent when
//! its response ends ([`super::access_log`]).

use super::access_log::{AccessLog, LoggedHttpBody};
use bytes::Bytes;
use fastudp_quic::app::ConnInfo;
use fastudp_quic::files::{self, Root};
use fastudp_quic::h3::{Content as _, PatternContent, Route as PathRoute};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The error type of the bodies the proxy passes on.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body passed on, either way.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// How long an upstream that failed (refused, or no answer in time) is
/// skipped, unless `--upstream-fail-duration` (or a route's
/// `fail_duration`) says otherwise.
pub const FAIL_DURATION: Duration = Duration::from_secs(10);

/// How long a pooled upstream connection may stay idle.
pub const POOL_IDLE: Duration = Duration::from_secs(60);

/// Idle upstream connections kept per upstream (per worker).
pub const POOL_MAX_IDLE: usize = 64;

/// Requests one client address (an IPv6 /64) may have in flight to one
/// route's upstreams at once; past it the answer is 503.
pub const MAX_IN_FLIGHT_PER_CLIENT: usize = 128;

/// Requests one route's upstreams may have in flight at once (each holds
/// an upstream connection); past it the answer is 503.
pub const MAX_IN_FLIGHT_PER_ROUTE: usize = 1024;

/// One upstream: where it is, and until when it is skipped.
#[derive(Debug)]
pub struct Upstream {
    authority: Authority,
    down_until: Mutex<Option<Instant>>,
}

impl Upstream {
    /// `http://HOST:PORT` (no path), or what is wrong with it.
    pub fn parse(s: &str) -> Result<Upstream, String> {
        let u: Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
        match u.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "scheme {other}: upstreams are HTTP/1.1 over plain TCP (http://HOST:PORT)"
                ))
            }
            None => return Err("no scheme: http://HOST:PORT".into()),
        }
        let authority = u.authority().ok_or("no host: http://HOST:PORT")?.clone();
        if authority.as_str().contains('@') {
            return Err("user information is not allowed".into());
        }
        // After the host (an IPv6 host is bracketed).
        let after_host = authority.as_str().rsplit(']').next().unwrap_or("");
        if let Some((_, port)) = after_host.rsplit_once(':') {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => return Err(format!("port {port}: from 1 to 65535")),
            }
        }
        if u.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err("a path is not allowed: the request's path is kept".into());
        }
        Ok(Upstream {
            authority,
            down_until: Mutex::new(None),
        })
    }

    /// `HOST:PORT`.
    pub fn authority(&self) -> &str {
        self.authority.as_str()
    }

    fn is_down(&self, now: Instant) -> bool {
        let g = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        g.is_some_and(|t| t > now)
    }

    fn failed(&self, skip: Duration) {
        *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + skip);
    }
}

/// What the proxy counted.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Requests answered by an upstream (a response head came back).
    pub forwarded: AtomicU64,
    /// 502s: an upstream refused or failed before its response head.
    pub bad_gateway: AtomicU64,
    /// 504s: no response head within `--upstream-timeout`.
    pub gateway_timeout: AtomicU64,
    /// 502s because every upstream was being skipped.
    pub no_upstream: AtomicU64,
    /// Requests sent again to the route's next upstream because the one
    /// tried refused the connection before any byte of the request body
    /// had gone to it.
    pub retries: AtomicU64,
    /// Response bodies that failed part way (the client's stream reset).
    pub aborted: AtomicU64,
    /// Request headers not passed on ([`strip_untrusted`]).
    pub headers_dropped: AtomicU64,
    /// 503s: the client's address or the route had
    /// [`MAX_IN_FLIGHT_PER_CLIENT`] or [`MAX_IN_FLIGHT_PER_ROUTE`]
    /// requests in flight.
    pub over_limit: AtomicU64,
    /// 503s: the proxy itself was out of file descriptors (EMFILE,
    /// ENFILE) connecting to an upstream; the upstream is not skipped.
    pub local_exhausted: AtomicU64,
}

/// What every worker's proxy shares: the upstreams and their health.
#[derive(Debug)]
pub struct Shared {
    upstreams: Vec<Upstream>,
    next: AtomicUsize,
    timeout: Duration,
    fail_duration: Duration,
    in_flight: AtomicUsize,
    per_client: fastudp_quic::limits::PerAddress,
    /// What was counted.
    pub stats: ProxyStats,
}

impl Shared {
    /// The upstreams (`http://HOST:PORT` each) and the time each may take
    /// to answer a request's head.
    pub fn new(upstreams: &[String], timeout: Duration) -> Result<Shared, String> {
        if upstreams.is_empty() {
            return Err("no upstream".into());
        }
        let upstreams = upstreams
            .iter()
            .map(|u| Upstream::parse(u).map_err(|e| format!("{u}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Shared {
            upstreams,
            next: AtomicUsize::new(0),
            timeout,
            fail_duration: FAIL_DURATION,
            in_flight: AtomicUsize::new(0),
            per_client: fastudp_quic::limits::PerAddress::new(MAX_IN_FLIGHT_PER_CLIENT),
            stats: ProxyStats::default(),
        })
    }

    /// How long an upstream that failed is skipped (default
    /// [`FAIL_DURATION`]).
    pub fn fail_duration(mut self, d: Duration) -> Shared {
        self.fail_duration = d;
        self
    }

    /// How long an upstream that failed is skipped.
    pub fn skip_time(&self) -> Duration {
        self.fail_duration
    }

    /// The upstreams.
    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }

    /// The next upstream in turn that is not being skipped.
    #[cfg(test)]
    fn pick(&self) -> Option<&Upstream> {
        self.pick_but(&[]).map(|i| &self.upstreams[i])
    }

    /// The index of the next upstream in turn that is not being skipped
    /// and not in `tried`.
    fn pick_but(&self, tried: &[usize]) -> Option<usize> {
        let n = self.upstreams.len();
        let start = self.next.fetch_add(1, Relaxed);
        let now = Instant::now();
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !tried.contains(&i) && !self.upstreams[i].is_down(now))
    }
}

/// The client address of a request that came over TCP (HTTP/3 requests
/// carry the engine's [`ConnInfo`]).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// Where a route's requests go.
#[derive(Debug)]
pub enum Target {
    /// To these upstreams, in turn.
    Upstreams(Arc<Shared>),
    /// To the files beneath a directory.
    Files {
        /// The directory, opened.
        root: Arc<Root>,
        /// Its path, as given.
        dir: std::path::PathBuf,
    },
}

/// A path prefix and where its requests go.
#[derive(Debug)]
pub struct Route {
    /// The prefix (a request's path starts with it, byte for byte).
    pub prefix: String,
    /// Where its requests go.
    pub target: Target,
}

/// The routes, the test endpoints and the access log: what every
/// worker's proxy shares.
#[derive(Debug)]
pub struct Table {
    /// Longest prefix first.
    routes: Vec<Route>,
    test: Option<PatternContent>,
    log: Option<AccessLog>,
}

impl Table {
    /// `routes` (two with one prefix: the first is kept), `/bytes/N` and
    /// `/video/...` served first with `test`, each request logged to
    /// `log`.
    pub fn new(
        mut routes: Vec<Route>,
        test: Option<PatternContent>,
        log: Option<AccessLog>,
    ) -> Table {
        // Stable: of two equal prefixes the first stays first.
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Table { routes, test, log }
    }

    /// The route of `path`: the longest prefix that matches.
    pub fn route(&self, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| path.starts_with(&r.prefix))
    }

    /// The routes, longest prefix first.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The upstreams' shared states, one per route that has upstreams.
    pub fn upstream_sets(&self) -> impl Iterator<Item = (&str, &Arc<Shared>)> {
        self.routes.iter().filter_map(|r| match &r.target {
            Target::Upstreams(s) => Some((r.prefix.as_str(), s)),
            Target::Files { .. } => None,
        })
    }
}

/// The reverse proxy, as a `tower::Service`: cheap to clone.
#[derive(Clone)]
pub struct Proxy {
    table: Arc<Table>,
    client: Client<HttpConnector, ProxyBody>,
}

impl Proxy {
    /// A proxy with a pooled client of its own (`connect_timeout` for
    /// each new upstream connection).
    pub fn new(table: Arc<Table>, connect_timeout: Duration) -> Proxy {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_MAX_IDLE)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(http);
        Proxy { table, client }
    }

    /// Answers `req`, its line logged when its response ends.
    async fn respond<B>(self, req: Request<B>) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let pending = self.table.log.as_ref().map(|l| l.pending(&req));
        let r = self.dispatch(req).await;
        match pending {
            Some(mut p) => {
                p.status = r.status().as_u16();
                r.map(|b| LoggedHttpBody::new(b, p).boxed_unsync())
            }
            None => r,
        }
    }

    /// The path normalised ([`normalize_path`], 400 when refused), then
    /// the test endpoints, then the route.
    async fn dispatch<B>(self, mut req: Request<B>) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if let Err(r) = normalize_target(&mut req) {
            return r;
        }
        if let Some(c) = &self.table.test {
            if let Some(r) = c.route(req.uri().path()) {
                return test_endpoint(req.method(), *c, r);
            }
        }
        match self.table.route(req.uri().path()).map(|r| &r.target) {
            Some(Target::Upstreams(s)) => forward(s.clone(), &self.client, req).await,
            Some(Target::Files { root, .. }) => file_response(root, &req),
            None => answer(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

/// Why a request path is refused before routing (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPath {
    /// Not starting with `/`, a `%` not followed by two hex digits, or a
    /// decoded byte that is not UTF-8.
    Malformed,
    /// An encoded `/` (`%2F`), `\` (`%5C`) or NUL (`%00`): it would
    /// mean one path to the proxy and another to an upstream.
    EncodedSeparator,
    /// `..` segments climbing above `/`.
    AboveRoot,
}

/// The path a request is routed by and forwarded with, as nginx's
/// `location` matching sees it: the percent-encoded unreserved
/// characters (RFC 3986 2.3: letters, digits, `-`, `.`, `_`, `~`)
/// decoded, other escapes kept (their hex digits in upper case), runs of
/// `/` merged, and the `.` and `..` segments resolved (RFC 3986 5.2.4).
/// Refused: an encoded `/`, `\` or NUL, and a `..` above the root.
pub fn normalize_path(path: &str) -> Result<String, BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath::Malformed);
    }
    let hex = |b: u8| -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    };
    // Decoded where unreserved.
    let raw = path.as_bytes();
    let mut dec = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'%' {
            dec.push(b);
            i += 1;
            continue;
        }
        let (Some(h), Some(l)) = (
            raw.get(i + 1).copied().and_then(hex),
            raw.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(BadPath::Malformed);
        };
        let c = h << 4 | l;
        match c {
            b'/' | b'\\' | 0 => return Err(BadPath::EncodedSeparator),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => dec.push(c),
            _ => dec.extend_from_slice(format!("%{c:02X}").as_bytes()),
        }
        i += 3;
    }
    let dec = String::from_utf8(dec).map_err(|_| BadPath::Malformed)?;
    // Dot segments resolved, empty segments merged.
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = dec[1..].split('/').collect();
    let last = segs.len() - 1;
    let mut trailing = false;
    for (k, s) in segs.iter().enumerate() {
        match *s {
            "" => trailing = k == last,
            "." => trailing = true,
            ".." => {
                if out.pop().is_none() {
                    return Err(BadPath::AboveRoot);
                }
                trailing = true;
            }
            s => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut p = String::with_capacity(dec.len());
    for s in &out {
        p.push('/');
        p.push_str(s);
    }
    if trailing || out.is_empty() {
        p.push('/');
    }
    Ok(p)
}

/// `req`'s target with its path normalised ([`normalize_path`]; the
/// query kept as sent), or the 400 to answer.
#[allow(clippy::result_large_err)]
fn normalize_target<B>(req: &mut Request<B>) -> Result<(), Response<ProxyBody>> {
    let bad = |e: BadPath| {
        answer(
            StatusCode::BAD_REQUEST,
            match e {
                BadPath::Malformed => "bad request path\n",
                BadPath::EncodedSeparator => "an encoded /, \\ or NUL in the path\n",
                BadPath::AboveRoot => "the path climbs above /\n",
            },
        )
    };
    let path = req.uri().path();
    if path == "*" {
        // OPTIONS *: no route matches it.
        return Ok(());
    }
    let p = normalize_path(path).map_err(bad)?;
    if p == path {
        return Ok(());
    }
    let pq = match req.uri().query() {
        Some(q) => format!("{p}?{q}"),
        None => p,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq.parse().map_err(|_| bad(BadPath::Malformed))?);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| bad(BadPath::Malformed))?;
    Ok(())
}

/// Sends `req` to one of `shared`'s upstreams; when that one refuses the
/// connection (before any byte of the body went to it), to the next one
/// not being skipped, each upstream tried once at most (as Caddy's
/// `reverse_proxy` with `lb_retries`). 502 when every one tried refused.
async fn forward<B>(
    shared: Arc<Shared>,
    pool: &Client<HttpConnector, ProxyBody>,
    req: Request<B>,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let s = &shared;
    let Some(held) = InFlight::take(&shared, peer_of(req.extensions())) else {
        s.stats.over_limit.fetch_add(1, Relaxed);
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight\n",
        );
    };
    let Some(mut at) = s.pick_but(&[]) else {
        s.stats.no_upstream.fetch_add(1, Relaxed);
        return answer(StatusCode::BAD_GATEWAY, "no upstream available\n");
    };
    let (mut parts, body) = req.into_parts();
    let client = parts
        .extensions
        .get::<ConnInfo>()
        .map(|c| c.remote)
        .or_else(|| parts.extensions.get::<Peer>().map(|p| p.0));
    let host = match request_host(&parts) {
        Ok(h) => h,
        Err(r) => return r,
    };
    strip_hop_by_hop(&mut parts.headers);
    let dropped = strip_untrusted(&mut parts.headers);
    s.stats.headers_dropped.fetch_add(dropped, Relaxed);
    forwarded_headers(&mut parts.headers, client, host.as_ref());
    if let Some(h) = host {
        parts.headers.insert(header::HOST, h);
    }
    let pq = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let mut body = body.map_err(Into::into).boxed_unsync();
    // The upstreams tried: a route's count at most.
    let mut tried: Vec<usize> = Vec::new();
    let got = loop {
        tried.push(at);
        let up = &s.upstreams[at];
        let Ok(uri) = Uri::builder()
            .scheme("http")
            .authority(up.authority.clone())
            .path_and_query(pq.clone())
            .build()
        else {
            return answer(StatusCode::BAD_REQUEST, "bad request target\n");
        };
        // The head is kept while another upstream may be tried.
        let headers = match tried.len() < s.upstreams.len() {
            true => parts.headers.clone(),
            false => std::mem::take(&mut parts.headers),
        };
        // The body comes back here if the connection fails before it is
        // read.
        let back = Arc::new(Mutex::new(None));
        let inner = Unsent {
            body: Some(body),
            back: back.clone(),
            read: false,
        }
        .boxed_unsync();
        // The timeout runs from the request's start, again from each
        // piece of the body the upstream takes and from the body's end;
        // it is held while the proxy waits on the client for the body (an
        // upload takes the time the client takes), so an upstream that
        // stops reading is 504 too.
        let (turn, turns) =
            tokio::sync::watch::channel(Turn::Upstream(tokio::time::Instant::now()));
        let mut r = Request::new(Paced { inner, turn }.boxed_unsync());
        *r.method_mut() = parts.method.clone();
        *r.uri_mut() = uri;
        *r.version_mut() = Version::HTTP_11;
        *r.headers_mut() = headers;
        let sent = pool.request(r);
        let got = tokio::select! {
            r = sent => Ok(r),
            () = upstream_deadline(turns, s.timeout) => Err(()),
        };
        match got {
            // The proxy's own lack of descriptors: neither the upstream's
            // failure nor a reason to try the next.
            Ok(Err(e)) if e.is_connect() && !out_of_descriptors(&e) => {
                up.failed(s.fail_duration);
                let unsent = back.lock().unwrap_or_else(|e| e.into_inner()).take();
                match (unsent, s.pick_but(&tried)) {
                    (Some(b), Some(next)) => {
                        s.stats.retries.fetch_add(1, Relaxed);
                        body = b;
                        at = next;
                    }
                    _ => break Ok(Err(e)),
                }
            }
            got => break got,
        }
    };
    match got {
        // A slow answer is not a failed upstream: only a failed connect
        // skips it (as Caddy's passive health), so that one slow request
        // cannot take the upstream away from every client.
        Err(()) => {
            s.stats.gateway_timeout.fetch_add(1, Relaxed);
            answer(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
        }
        Ok(Err(e)) if out_of_descriptors(&e) => {
            s.stats.local_exhausted.fetch_add(1, Relaxed);
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "the proxy is out of file descriptors\n",
            )
        }
        Ok(Err(_)) => {
            // A failed connect marked its upstream down in the loop above.
            s.stats.bad_gateway.fetch_add(1, Relaxed);
            answer(StatusCode::BAD_GATEWAY, "upstream failed\n")
        }
        Ok(Ok(resp)) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            // Upgrades are not proxied (and HTTP/2 and HTTP/3 forbid 101).
            s.stats.bad_gateway.fetch_add(1, Relaxed);
            answer(StatusCode::BAD_GATEWAY, "the upstream switched protocols\n")
        }
        Ok(Ok(resp)) => {
            s.stats.forwarded.fetch_add(1, Relaxed);
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(header::ALT_SVC);
            let shared = shared.clone();
            let body = body
                .map_err(move |e| {
                    shared.stats.aborted.fetch_add(1, Relaxed);
                    Box::new(e) as BoxError
                })
                .boxed_unsync();
            let body = Holding {
                inner: body,
                _guard: held,
            }
            .boxed_unsync();
            Response::from_parts(parts, body)
        }
    }
}

/// The `Host` to send upstream: the request target's authority when it
/// has one (HTTP/2's and HTTP/3's `:authority`, HTTP/1.1's absolute
/// form, which wins over `Host` as RFC 9112 3.2.2 says), its user
/// information left out; else the client's `Host`. Over HTTP/2 and
/// HTTP/3 a `Host` that differs from `:authority` is 400 (RFC 9113
/// 8.3.1). `None`: the client named no host.
#[allow(clippy::result_large_err)]
fn request_host(parts: &http::request::Parts) -> Result<Option<HeaderValue>, Response<ProxyBody>> {
    let given = parts.headers.get(header::HOST);
    let Some(a) = parts.uri.authority() else {
        return Ok(given.cloned());
    };
    let a = a.as_str();
    let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
    if parts.version >= Version::HTTP_2 && given.is_some_and(|g| g.as_bytes() != a.as_bytes()) {
        return Err(answer(
            StatusCode::BAD_REQUEST,
            "Host and :authority differ\n",
        ));
    }
    match HeaderValue::from_str(a) {
        Ok(v) => Ok(Some(v)),
        Err(_) => Err(answer(StatusCode::BAD_REQUEST, "bad authority\n")),
    }
}

/// The client's address: the engine's [`ConnInfo`] (HTTP/3) or the TCP
/// side's [`Peer`].
fn peer_of(x: &http::Extensions) -> Option<SocketAddr> {
    x.get::<ConnInfo>()
        .map(|c| c.remote)
        .or_else(|| x.get::<Peer>().map(|p| p.0))
}

/// Whether `e` is the proxy's own lack of file descriptors (EMFILE,
/// ENFILE), not the upstream's failure.
fn out_of_descriptors(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// A request in flight to a route's upstreams, counted against the
/// route's and its client's bounds until its response ends.
struct InFlight {
    shared: Arc<Shared>,
    ip: Option<std::net::IpAddr>,
}

impl InFlight {
    /// A place for a request from `client`, or `None` when the route or
    /// the client's address has no more.
    fn take(shared: &Arc<Shared>, client: Option<SocketAddr>) -> Option<InFlight> {
        let n = shared.in_flight.fetch_add(1, Relaxed);
        let ip = client.map(|c| c.ip());
        let mut h = InFlight {
            shared: shared.clone(),
            ip: None,
        };
        if n >= MAX_IN_FLIGHT_PER_ROUTE {
            return None;
        }
        if let Some(ip) = ip {
            if !shared.per_client.take(ip) {
                return None;
            }
            h.ip = Some(ip);
        }
        Some(h)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Relaxed);
        if let Some(ip) = self.ip {
            self.shared.per_client.give(ip);
        }
    }
}

/// A response body that holds `guard` until it is dropped: its request
/// counted in flight ([`InFlight`]), or counted as under way on its TCP
/// connection ([`Busy`]).
struct Holding<G> {
    inner: ProxyBody,
    _guard: G,
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body on its way to an upstream: dropped before any of it
/// was read (the connection failed), it goes back to `back`, to be sent
/// to the next upstream.
struct Unsent {
    body: Option<ProxyBody>,
    back: Arc<Mutex<Option<ProxyBody>>>,
    read: bool,
}

impl http_body::Body for Unsent {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let Some(b) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let r = Pin::new(b).poll_frame(cx);
        // Read from: it cannot go to another upstream any more.
        self.read |= r.is_ready();
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(b) = self.body.take().filter(|_| !self.read) {
            if let Ok(mut slot) = self.back.lock() {
                *slot = Some(b);
            }
        }
    }
}

/// Whose move it is while a request's body is sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The upstream's (to take what was handed over, or to answer), since
    /// then.
    Upstream(tokio::time::Instant),
    /// The client's: the proxy waits for more of the body.
    Client,
}

/// A request body that says whose move it is ([`Turn`]).
struct Paced {
    inner: ProxyBody,
    turn: tokio::sync::watch::Sender<Turn>,
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        let now = match r {
            Poll::Pending => Turn::Client,
            Poll::Ready(_) => Turn::Upstream(tokio::time::Instant::now()),
        };
        // The waiting side is woken when the turn changes hands; a later
        // instant of the upstream's turn is read when its sleep ends.
        self.turn.send_if_modified(|t| {
            let handed = std::mem::discriminant(t) != std::mem::discriminant(&now);
            *t = now;
            handed
        });
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Returns once the upstream has had its turn ([`Turn::Upstream`]) for
/// `timeout` without the turn moving on.
async fn upstream_deadline(mut turns: tokio::sync::watch::Receiver<Turn>, timeout: Duration) {
    loop {
        let t = *turns.borrow_and_update();
        match t {
            Turn::Client => {
                if turns.changed().await.is_err() {
                    // The body is gone while waiting on the client: the
                    // upstream has its turn from now.
                    tokio::time::sleep(timeout).await;
                    return;
                }
            }
            Turn::Upstream(since) => {
                let due = since + timeout;
                if tokio::time::Instant::now() >= due {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(due) => {}
                    r = turns.changed() => {
                        if r.is_err() {
                            // The body has ended: no more turns.
                            let last = match *turns.borrow() {
                                Turn::Upstream(t) => t,
                                Turn::Client => tokio::time::Instant::now(),
                            };
                            tokio::time::sleep_until(last + timeout).await;
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl<B> tower_service::Service<Request<B>> for Proxy
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { Ok(me.respond(req).await) })
    }
}

/// `/bytes/N` or `/video/RATE/SECONDS` (`--test-endpoints`), as the
/// built-in handler answers them: GET and HEAD, 405 otherwise.
fn test_endpoint(method: &http::Method, c: PatternContent, r: PathRoute) -> Response<ProxyBody> {
    if method != http::Method::GET && method != http::Method::HEAD {
        let mut a = answer(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
        a.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return a;
    }
    let body = match r {
        PathRoute::Bytes(n) => PatternStream {
            content: c,
            sent: 0,
            total: n,
            frame: n.max(1),
            interval: Duration::ZERO,
            start: tokio::time::Instant::now(),
            sleep: None,
        },
        PathRoute::Video {
            bytes,
            count,
            interval,
        } => PatternStream {
            content: c,
            sent: 0,
            total: bytes.saturating_mul(count),
            frame: bytes.max(1),
            interval,
            start: tokio::time::Instant::now(),
            sleep: None,
        },
    };
    let len = body.total;
    let mut resp = match *method == http::Method::HEAD {
        true => Response::new(empty()),
        false => Response::new(body.boxed_unsync()),
    };
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    resp
}

fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|n: Infallible| match n {})
        .boxed_unsync()
}

/// The pattern's bytes, in frames of `frame` bytes due every `interval`
/// from `start` (all at once for `/bytes/N`).
struct PatternStream {
    content: PatternContent,
    sent: u64,
    total: u64,
    frame: u64,
    interval: Duration,
    start: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for PatternStream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        if self.sent >= self.total {
            return Poll::Ready(None);
        }
        let k = self.sent / self.frame;
        if !self.interval.is_zero() {
            let due = self.start + self.interval * u32::try_from(k).unwrap_or(u32::MAX);
            if tokio::time::Instant::now() < due {
                let s = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                s.as_mut().reset(due);
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        }
        let frame_end = (k + 1).saturating_mul(self.frame).min(self.total);
        let n = usize::try_from(frame_end - self.sent)
            .unwrap_or(usize::MAX)
            .min(fastudp_quic::h3::CHUNK);
        let b = self.content.pattern(self.sent, n);
        self.sent += b.len() as u64;
        Poll::Ready(Some(Ok(http_body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.total
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.total - self.sent)
    }
}

/// A file beneath `root` (GET and HEAD, a single `Range`), as `--www`
/// serves it; 405 for other methods.
fn file_response<B>(root: &Root, req: &Request<B>) -> Response<ProxyBody> {
    let method = match *req.method() {
        http::Method::GET => files::Method::Get,
        http::Method::HEAD => files::Method::Head,
        _ => {
            let mut a = answer(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
            a.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return a;
        }
    };
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let range = req.headers().get(header::RANGE).map(HeaderValue::as_bytes);
    // The client's address, for its share of the descriptors.
    let peer = req
        .extensions()
        .get::<ConnInfo>()
        .map(|c| c.remote)
        .or_else(|| req.extensions().get::<Peer>().map(|p| p.0));
    let _p = peer.map(|a| files::Peer::set(a.ip()));
    let a = root.respond(method, target.as_bytes(), range);
    let mut r = Response::new(empty());
    let headers = a.headers();
    let status = a.status.code();
    if let Some(body) = a.body {
        *r.body_mut() = FileStream(body).boxed_unsync();
    }
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(HeaderName::from_static(name), v);
        }
    }
    r
}

/// A file's chunks as a body (each read with `pread` when asked for).
struct FileStream(files::FileBody);

impl http_body::Body for FileStream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Poll::Ready(match self.0.next_chunk() {
            Ok(Some(b)) => Some(Ok(http_body::Frame::data(b))),
            Ok(None) => None,
            // The promised length cannot be met: the stream is reset.
            Err(e) => Some(Err(Box::new(e))),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_done()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.remaining())
    }
}

/// A short plain-text answer of the proxy's own.
fn answer(status: StatusCode, text: &'static str) -> Response<ProxyBody> {
    let mut r = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|n: Infallible| match n {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The hop-by-hop headers of RFC 9110 7.6.1 and older practice.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers and those `Connection` names.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

/// Headers a client may not send to an upstream: the upstream could
/// take them for the proxy's word about the client (its address, port,
/// path prefix) or its path through proxies.
pub const UNTRUSTED: [&str; 6] = [
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "via",
];

/// Removes the request headers the upstream must not get from a client:
/// those whose names hold `_` (as nginx's `underscores_in_headers off`:
/// CGI and WSGI turn `X_Forwarded_For` into the same variable as
/// `X-Forwarded-For`) and [`UNTRUSTED`]. Returns how many went.
pub fn strip_untrusted(h: &mut HeaderMap) -> u64 {
    let under: Vec<HeaderName> = h
        .keys()
        .filter(|n| n.as_str().contains('_'))
        .cloned()
        .collect();
    let mut n = 0;
    for name in under {
        n += h.get_all(&name).iter().count() as u64;
        h.remove(name);
    }
    for name in UNTRUSTED {
        n += h.get_all(name).iter().count() as u64;
        h.remove(name);
    }
    n
}

/// `s` as the inside of a quoted-string (RFC 9110 5.6.4): `"` and `\`
/// escaped.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if c == '"' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q
}

/// Sets `X-Forwarded-For`, `-Proto`, `-Host` and `Forwarded` from the
/// connection, replacing the client's.
fn forwarded_headers(h: &mut HeaderMap, client: Option<SocketAddr>, host: Option<&HeaderValue>) {
    h.remove(header::FORWARDED);
    h.remove("x-forwarded-for");
    h.remove("x-forwarded-host");
    h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
    let mut fwd = String::new();
    if let Some(c) = client {
        // An IPv4 client on a dual-stack listener is named as IPv4.
        let ip = c.ip().to_canonical();
        if let Ok(v) = HeaderValue::from_str(&ip.to_string()) {
            h.insert("x-forwarded-for", v);
        }
        fwd = match ip {
            std::net::IpAddr::V4(a) => format!("for={a}"),
            std::net::IpAddr::V6(a) => format!("for=\"[{a}]\""),
        };
    }
    if let Some(host) = host.and_then(|v| v.to_str().ok()) {
        if let Ok(v) = HeaderValue::from_str(host) {
            h.insert("x-forwarded-host", v);
        }
        if !fwd.is_empty() {
            fwd.push(';');
        }
        fwd.push_str(&format!("host=\"{}\"", quoted(host)));
    }
    if !fwd.is_empty() {
        fwd.push(';');
    }
    fwd.push_str("proto=https");
    if let Ok(v) = HeaderValue::from_str(&fwd) {
        h.insert(header::FORWARDED, v);
    }
}

/// How long a TCP client may take from its connection to its first
/// complete request head (the TLS handshake, HTTP/2's preface and
/// SETTINGS, the bytes that tell HTTP/1.1 from HTTP/2, the head), and
/// over each later HTTP/1.1 request head.
pub const TCP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a TCP connection with no request under way is kept.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a write to a TCP client may wait for the client to take
/// bytes before the connection is closed (as the files' TCP listener's
/// [`fastudp_quic::altsvc::SEND_TIMEOUT`]).
pub const TCP_SEND_TIMEOUT: Duration = fastudp_quic::altsvc::SEND_TIMEOUT;

/// HTTP/2 on the TCP side: streams open at once per connection (as
/// HTTP/3's limit per connection).
pub const H2_MAX_STREAMS: u32 = 16;

/// HTTP/2 on the TCP side: the window each request stream starts with
/// (what a client may send before the upstream takes it).
pub const H2_STREAM_WINDOW: u32 = 64 * 1024;

/// HTTP/2 on the TCP side: the connection's window.
pub const H2_CONNECTION_WINDOW: u32 = 256 * 1024;

/// HTTP/2 on the TCP side: the response bytes buffered per stream while
/// the client's window or socket does not take them.
pub const H2_SEND_BUFFER: usize = 64 * 1024;

/// HTTP/2 on the TCP side: the largest header list taken (HTTP/3's
/// [`fastudp_quic::h3::MAX_FIELD_SECTION`]).
pub const H2_MAX_HEADER_LIST: u32 = 16 * 1024;

/// HTTP/2 on the TCP side: a PING after this long without a frame from
/// the client, and the connection closed when its answer takes longer
/// than [`H2_KEEP_ALIVE_TIMEOUT`].
pub const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// See [`H2_KEEP_ALIVE_INTERVAL`].
pub const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS/TCP side of the proxy: HTTP/1.1 and HTTP/2 (hyper-util's auto
/// server) on the engine's port number, every answer naming HTTP/3 in
/// `Alt-Svc`. At most `max_connections` connections at once; past it a
/// new one is closed at once and counted.
///
/// [`TcpFront::drain`] is hyper's graceful shutdown: the listener closes
/// (new connections are refused), an HTTP/1.1 connection closes after
/// the response under way (which says `connection: close`) or at once
/// when idle, an HTTP/2 one gets GOAWAY and closes after its streams.
pub struct TcpFront {
    addr: SocketAddr,
    rt: tokio::runtime::Runtime,
    /// What it counted.
    pub stats: Arc<TcpStats>,
    slots: Arc<tokio::sync::Semaphore>,
    max_connections: usize,
    drain: tokio::sync::watch::Sender<bool>,
    /// Says when the listener has closed after a drain began.
    closed: Mutex<std::sync::mpsc::Receiver<()>>,
}

/// What the TLS/TCP side of the proxy counted.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections closed at once because `max_connections` were open,
    /// or because their address held its share already.
    pub refused: AtomicU64,
    /// Of [`TcpStats::refused`], those refused for their address's share.
    pub refused_per_ip: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed because no complete request head came within
    /// [`TCP_HANDSHAKE_TIMEOUT`] of their start.
    pub head_timeouts: AtomicU64,
    /// Connections closed after [`TCP_IDLE_TIMEOUT`] with no request
    /// under way.
    pub idle_closed: AtomicU64,
    /// Connections closed because the client took no bytes for
    /// [`TCP_SEND_TIMEOUT`].
    pub send_timeouts: AtomicU64,
    /// Responses begun, by status class ([`fastudp_quic::status_class`]:
    /// index 0 counts 1xx, 4 counts 5xx).
    pub responses: [AtomicU64; 5],
}

impl TcpFront {
    /// Listens on `addr` (TCP) with `tls` (its ALPN set to h2 and
    /// http/1.1 here), answering by `table`'s routes.
    pub fn start(
        addr: SocketAddr,
        mut tls: rustls::ServerConfig,
        table: Arc<Table>,
        connect_timeout: Duration,
        max_connections: usize,
    ) -> anyhow::Result<TcpFront> {
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fastudp-tcp")
            .enable_all()
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let alt_svc = HeaderValue::from_str(&format!(
            "h3=\":{}\"; ma={}",
            addr.port(),
            fastudp_quic::altsvc::MAX_AGE
        ))?;
        let stats = Arc::new(TcpStats::default());
        let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
        let per_ip = Arc::new(fastudp_quic::limits::PerAddress::new(
            (max_connections / 4).max(1),
        ));
        let proxy = {
            let _g = rt.enter();
            Proxy::new(table, connect_timeout)
        };
        let (drain, drained) = tokio::sync::watch::channel(false);
        let (closing, closed) = std::sync::mpsc::channel();
        rt.spawn(accept(
            listener,
            closing,
            Front {
                tls: acceptor,
                proxy,
                alt_svc,
                slots: slots.clone(),
                per_ip,
                stats: stats.clone(),
            },
            drained,
        ));
        Ok(TcpFront {
            addr,
            rt,
            stats,
            slots,
            max_connections,
            drain,
            closed: Mutex::new(closed),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.max_connections
            .saturating_sub(self.slots.available_permits()) as u64
    }

    /// Starts hyper's graceful shutdown (see [`TcpFront`]) and returns
    /// once the listener is closed (a second at most): new connections
    /// are refused from then on. [`TcpFront::open`] falls to 0 as the
    /// connections end.
    pub fn drain(&self) {
        if self.drain.send(true).is_ok() {
            if let Ok(closed) = self.closed.lock() {
                let _ = closed.recv_timeout(Duration::from_secs(1));
            }
        }
    }

    /// The TCP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops: the listener and every connection, waiting `wait` at most.
    pub fn stop(self, wait: Duration) {
        self.rt.shutdown_timeout(wait);
    }
}

/// What each TCP connection of the proxy is served with.
struct Front {
    tls: tokio_rustls::TlsAcceptor,
    proxy: Proxy,
    alt_svc: HeaderValue,
    slots: Arc<tokio::sync::Semaphore>,
    /// A quarter of the slots at most for one address (an IPv6 /64), as
    /// the files' TCP listener.
    per_ip: Arc<fastudp_quic::limits::PerAddress>,
    stats: Arc<TcpStats>,
}

/// Accepts until a drain: then the listener closes, and every connection
/// is shut down gracefully.
async fn accept(
    l: tokio::net::TcpListener,
    closing: std::sync::mpsc::Sender<()>,
    f: Front,
    mut drain: tokio::sync::watch::Receiver<bool>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = l.accept() => a,
            _ = drain.wait_for(|d| *d) => break,
        };
        let Ok((tcp, peer)) = accepted else {
            // EMFILE and the like: wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = f.slots.clone().try_acquire_owned() else {
            f.stats.refused.fetch_add(1, Relaxed);
            drop(tcp);
            continue;
        };
        let Some(place) = AddressPlace::take(&f.per_ip, peer.ip()) else {
            f.stats.refused.fetch_add(1, Relaxed);
            f.stats.refused_per_ip.fetch_add(1, Relaxed);
            drop(tcp);
            continue;
        };
        f.stats.accepted.fetch_add(1, Relaxed);
        let _ = tcp.set_nodelay(true);
        let (tls, proxy, alt_svc) = (f.tls.clone(), f.proxy.clone(), f.alt_svc.clone());
        let stats = f.stats.clone();
        // Made now, so that a drain from here on reaches the connection.
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            let _place = place;
            let _open = Open::new(&stats);
            let activity = Arc::new(Activity::new());
            let Ok(Ok(stream)) = tokio::time::timeout(TCP_HANDSHAKE_TIMEOUT, tls.accept(tcp)).await
            else {
                return;
            };
            let stream = SendDeadline::new(stream, TCP_SEND_TIMEOUT, stats.clone());
            let svc = {
                let (stats, activity) = (stats.clone(), activity.clone());
                hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(Peer(peer));
                    let (proxy, alt_svc, stats) = (proxy.clone(), alt_svc.clone(), stats.clone());
                    let busy = Busy::begin(&activity);
                    async move {
                        let mut r = proxy.respond(req).await;
                        r.headers_mut().insert(header::ALT_SVC, alt_svc);
                        if let Some(i) = fastudp_quic::status_class(r.status().as_u16()) {
                            stats.responses[i].fetch_add(1, Relaxed);
                        }
                        Ok::<_, Infallible>(r.map(|b| {
                            Holding {
                                inner: b,
                                _guard: busy,
                            }
                            .boxed_unsync()
                        }))
                    }
                })
            };
            let conn = tcp_builder()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .into_owned();
            tokio::select! {
                _ = watcher.watch(conn) => {}
                why = activity.watchdog() => {
                    let n = match why {
                        Quiet::NoRequest => &stats.head_timeouts,
                        Quiet::Idle => &stats.idle_closed,
                    };
                    n.fetch_add(1, Relaxed);
                }
            }
        });
    }
    // New connections are refused from here on; those open finish.
    drop(l);
    let _ = closing.send(());
    graceful.shutdown().await;
}

/// hyper-util's server for a TCP connection: HTTP/1.1 with a deadline
/// for each request head, HTTP/2 with the bounds of HTTP/3 (16 streams,
/// 16 KiB header lists) and small windows and send buffers, so that a
/// client that does not read holds little.
fn tcp_builder() -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(TCP_HANDSHAKE_TIMEOUT);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_send_buf_size(H2_SEND_BUFFER)
        .max_header_list_size(H2_MAX_HEADER_LIST)
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    b
}

/// A place taken for a client address, given back when dropped.
struct AddressPlace {
    places: Arc<fastudp_quic::limits::PerAddress>,
    ip: std::net::IpAddr,
}

impl AddressPlace {
    /// A place for `ip`, or `None` when it holds its share already.
    fn take(places: &Arc<fastudp_quic::limits::PerAddress>, ip: std::net::IpAddr) -> Option<Self> {
        places.take(ip).then(|| AddressPlace {
            places: places.clone(),
            ip,
        })
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        self.places.give(self.ip);
    }
}

/// Counts an open connection in [`TcpStats::open`] while it lives.
struct Open(Arc<TcpStats>);

impl Open {
    fn new(s: &Arc<TcpStats>) -> Open {
        s.open.fetch_add(1, Relaxed);
        Open(s.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// Why a quiet connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quiet {
    /// No complete request head within [`TCP_HANDSHAKE_TIMEOUT`] of the
    /// connection's start.
    NoRequest,
    /// No request under way for [`TCP_IDLE_TIMEOUT`].
    Idle,
}

/// A TCP connection's requests under way, and since when none has been.
struct Activity {
    busy: AtomicUsize,
    any: std::sync::atomic::AtomicBool,
    since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            busy: AtomicUsize::new(0),
            any: std::sync::atomic::AtomicBool::new(false),
            since: Mutex::new(Instant::now()),
        }
    }

    fn since(&self) -> Instant {
        *self.since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns when the connection has had no request under way for its
    /// limit: [`TCP_HANDSHAKE_TIMEOUT`] from its start before its first
    /// request, [`TCP_IDLE_TIMEOUT`] after.
    async fn watchdog(&self) -> Quiet {
        loop {
            let (limit, why) = match self.any.load(Relaxed) {
                false => (TCP_HANDSHAKE_TIMEOUT, Quiet::NoRequest),
                true => (TCP_IDLE_TIMEOUT, Quiet::Idle),
            };
            let due = self.since() + limit;
            if self.busy.load(Relaxed) == 0 && Instant::now() >= due {
                return why;
            }
            let wait = match self.busy.load(Relaxed) {
                0 => due.saturating_duration_since(Instant::now()),
                _ => limit,
            };
            tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
        }
    }
}

/// A request under way on a TCP connection, from its head to the end of
/// its response's body.
struct Busy(Arc<Activity>);

impl Busy {
    fn begin(a: &Arc<Activity>) -> Busy {
        a.any.store(true, Relaxed);
        a.busy.fetch_add(1, Relaxed);
        Busy(a.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Relaxed);
    }
}

/// A connection whose writes fail (`TimedOut`) when the peer falls
/// behind for good: once a write has had to wait, the peer must take
/// [`TCP_SEND_PROGRESS`] bytes within `limit`, or the connection is
/// closed, with what was held for it. (A few bytes now and then, as a
/// growing socket buffer takes them, are not progress.)
struct SendDeadline<S> {
    inner: S,
    limit: Duration,
    /// Since a write had to wait: the deadline, and the bytes taken since.
    behind: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    /// Counted once.
    timed_out: bool,
    stats: Arc<TcpStats>,
}

/// See [`SendDeadline`].
pub const TCP_SEND_PROGRESS: usize = 64 * 1024;

impl<S> SendDeadline<S> {
    fn new(inner: S, limit: Duration, stats: Arc<TcpStats>) -> Self {
        SendDeadline {
            inner,
            limit,
            behind: None,
            timed_out: false,
            stats,
        }
    }

    /// `r`, what a write (`moved` bytes taken) or a flush gave, or
    /// `TimedOut` when the peer has been behind for `limit`.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<std::io::Result<T>>,
        moved: usize,
    ) -> Poll<std::io::Result<T>> {
        match &r {
            Poll::Ready(Err(_)) => return r,
            Poll::Pending => {
                let limit = self.limit;
                self.behind
                    .get_or_insert_with(|| (Box::pin(tokio::time::sleep(limit)), 0));
            }
            Poll::Ready(Ok(_)) => {
                if let Some((_, taken)) = &mut self.behind {
                    *taken += moved;
                    if *taken >= TCP_SEND_PROGRESS {
                        self.behind = None;
                    }
                }
            }
        }
        let Some((deadline, _)) = &mut self.behind else {
            return r;
        };
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                if !self.timed_out {
                    self.timed_out = true;
                    self.stats.send_timeouts.fetch_add(1, Relaxed);
                }
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client took too little within the send deadline",
                )))
            }
            Poll::Pending => r,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SendDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SendDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        let moved = match &r {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        self.check(cx, r, moved)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let moved = match &r {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        self.check(cx, r, moved)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, r, 0)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.check(cx, r, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        assert_eq!(
            Upstream::parse("http://127.0.0.1:8080")
                .unwrap()
                .authority(),
            "127.0.0.1:8080"
        );
        assert!(Upstream::parse("http://h:1/").is_ok());
        assert!(Upstream::parse("https://h:1")
            .unwrap_err()
            .contains("scheme"));
        assert!(Upstream::parse("h:1").is_err());
        assert!(Upstream::parse("http://h:1/x")
            .unwrap_err()
            .contains("path"));
        assert!(Upstream::parse("http://u@h:1").is_err());
    }

    #[test]
    fn hop_by_hop_and_connection_named_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn forwarded_replaces_the_clients() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        let host = HeaderValue::from_static("example.com:443");
        forwarded_headers(&mut h, Some("[::1]:5000".parse().unwrap()), Some(&host));
        assert_eq!(h["x-forwarded-for"], "::1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "example.com:443");
        assert_eq!(
            h["forwarded"],
            "for=\"[::1]\";host=\"example.com:443\";proto=https"
        );
    }

    #[test]
    fn untrusted_and_underscore_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("x_forwarded_for", "6.6.6.6"),
            ("x_forwarded_host", "evil.example"),
            ("x-real-ip", "6.6.6.6"),
            ("true-client-ip", "6.6.6.6"),
            ("x-client-ip", "6.6.6.6"),
            ("x-forwarded-port", "1"),
            ("x-forwarded-prefix", "/admin"),
            ("via", "1.1 evil"),
            ("x-kept", "1"),
        ] {
            h.append(n, HeaderValue::from_static(v));
        }
        h.append("x_forwarded_for", HeaderValue::from_static("7.7.7.7"));
        assert_eq!(strip_untrusted(&mut h), 9);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn forwarded_host_is_a_valid_quoted_string() {
        let mut h = HeaderMap::new();
        let host = HeaderValue::from_static("x\\\"y");
        forwarded_headers(&mut h, Some("127.0.0.1:5".parse().unwrap()), Some(&host));
        assert_eq!(
            h["forwarded"],
            "for=127.0.0.1;host=\"x\\\\\\\"y\";proto=https"
        );
    }

    #[test]
    fn in_flight_is_bounded_per_client_and_per_route() {
        let s = Arc::new(Shared::new(&["http://a:1".into()], Duration::from_secs(1)).unwrap());
        let one: SocketAddr = "10.0.0.1:5".parse().unwrap();
        let two: SocketAddr = "10.0.0.2:5".parse().unwrap();
        let mut held: Vec<InFlight> = (0..MAX_IN_FLIGHT_PER_CLIENT)
            .map(|_| InFlight::take(&s, Some(one)).unwrap())
            .collect();
        assert!(InFlight::take(&s, Some(one)).is_none());
        // Another address is let in; one that ends gives its place back.
        assert!(InFlight::take(&s, Some(two)).is_some());
        held.pop();
        held.push(InFlight::take(&s, Some(one)).unwrap());
        while held.len() < MAX_IN_FLIGHT_PER_ROUTE {
            held.push(InFlight::take(&s, None).unwrap());
        }
        assert!(InFlight::take(&s, Some(two)).is_none());
        assert!(InFlight::take(&s, None).is_none());
        drop(held);
        assert_eq!(s.in_flight.load(Relaxed), 0);
        assert!(InFlight::take(&s, Some(one)).is_some());
    }

    #[test]
    fn out_of_descriptors_is_the_proxys_own_failure() {
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        for (code, own) in [
            (libc::EMFILE, true),
            (libc::ENFILE, true),
            (libc::ECONNREFUSED, false),
        ] {
            let e = Wrap(std::io::Error::from_raw_os_error(code));
            assert_eq!(out_of_descriptors(&e), own, "{code}");
        }
    }

    #[test]
    fn the_host_sent_upstream() {
        let parts = |uri: &str, v: Version, host: Option<&'static str>| {
            let mut b = Request::builder().uri(uri).version(v);
            if let Some(h) = host {
                b = b.header("host", h);
            }
            b.body(()).unwrap().into_parts().0
        };
        let host = |p: &http::request::Parts| {
            request_host(p)
                .map(|h| h.map(|v| v.to_str().unwrap().to_string()))
                .map_err(|r| r.status())
        };
        let h11 = Version::HTTP_11;
        let h2 = Version::HTTP_2;
        assert_eq!(
            host(&parts("/", h11, Some("good"))),
            Ok(Some("good".into()))
        );
        assert_eq!(host(&parts("/", h11, None)), Ok(None));
        // The absolute form's authority wins over Host.
        assert_eq!(
            host(&parts("http://evil/x", h11, Some("good"))),
            Ok(Some("evil".into()))
        );
        assert_eq!(
            host(&parts("https://good/x", h2, None)),
            Ok(Some("good".into()))
        );
        assert_eq!(
            host(&parts("https://good/x", h2, Some("good"))),
            Ok(Some("good".into()))
        );
        assert_eq!(
            host(&parts("https://good/x", h2, Some("evil"))),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            host(&parts("https://user:pw@good/x", h2, None)),
            Ok(Some("good".into()))
        );
    }

    #[test]
    fn a_mapped_ipv4_client_is_named_as_ipv4() {
        let mut h = HeaderMap::new();
        forwarded_headers(&mut h, Some("[::ffff:10.1.2.3]:5".parse().unwrap()), None);
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        assert_eq!(h["forwarded"], "for=10.1.2.3;proto=https");
    }

    #[test]
    fn upstream_ports_are_checked() {
        assert!(Upstream::parse("http://h:0")
            .unwrap_err()
            .contains("port 0"));
        assert!(Upstream::parse("http://h:99999").is_err());
        assert!(Upstream::parse("http://h:65535").is_ok());
        assert!(Upstream::parse("http://h").is_ok());
        assert!(Upstream::parse("http://[::1]:8080").is_ok());
        assert!(Upstream::parse("http://[::1]:0").is_err());
    }

    #[test]
    fn round_robin_skips_a_failed_upstream() {
        let s = Shared::new(
            &["http://a:1".into(), "http://b:1".into()],
            Duration::from_secs(1),
        )
        .unwrap();
        let picks: Vec<_> = (0..4).map(|_| s.pick().unwrap().authority()).collect();
        assert_eq!(picks, ["a:1", "b:1", "a:1", "b:1"]);
        s.upstreams[0].failed(FAIL_DURATION);
        let picks: Vec<_> = (0..3).map(|_| s.pick().unwrap().authority()).collect();
        assert_eq!(picks, ["b:1", "b:1", "b:1"]);
        s.upstreams[1].failed(FAIL_DURATION);
        assert!(s.pick().is_none());
    }

    #[test]
    fn paths_are_normalised_before_routing() {
        let ok = |p: &str| normalize_path(p).unwrap();
        assert_eq!(ok("/"), "/");
        assert_eq!(ok("/a/b"), "/a/b");
        assert_eq!(ok("/a/b/"), "/a/b/");
        assert_eq!(ok("/public/../admin/secret.txt"), "/admin/secret.txt");
        assert_eq!(ok("/public/%2e%2e/admin/secret.txt"), "/admin/secret.txt");
        assert_eq!(ok("/public/%2E%2E/admin/secret.txt"), "/admin/secret.txt");
        assert_eq!(ok("/public//../admin/secret.txt"), "/admin/secret.txt");
        assert_eq!(ok("/public/./../admin/secret.txt"), "/admin/secret.txt");
        assert_eq!(ok("/public/.%2e/admin/x"), "/admin/x");
        assert_eq!(ok("/public/a/.."), "/public/");
        assert_eq!(ok("/public/."), "/public/");
        assert_eq!(ok("//public///x"), "/public/x");
        assert_eq!(ok("/%70ublic/%7e%41"), "/public/~A");
        assert_eq!(ok("/a%20b%c3%a9"), "/a%20b%C3%A9");
        assert_eq!(ok("/a/..."), "/a/...");
        for (p, e) in [
            ("/public/..%2fadmin/secret.txt", BadPath::EncodedSeparator),
            ("/public/..%2Fadmin", BadPath::EncodedSeparator),
            ("/public/..%5cadmin", BadPath::EncodedSeparator),
            ("/public/a%00.txt", BadPath::EncodedSeparator),
            ("/..", BadPath::AboveRoot),
            ("/public/../../etc/passwd", BadPath::AboveRoot),
            ("/%2e%2e/x", BadPath::AboveRoot),
            ("/a%2", BadPath::Malformed),
            ("/a%zz", BadPath::Malformed),
            ("x", BadPath::Malformed),
        ] {
            assert_eq!(normalize_path(p), Err(e), "{p}");
        }
    }

    #[test]
    fn the_longest_prefix_wins() {
        let up = |u: &str| {
            Target::Upstreams(Arc::new(
                Shared::new(&[u.to_string()], Duration::from_secs(1)).unwrap(),
            ))
        };
        let t = Table::new(
            vec![
                Route {
                    prefix: "/".into(),
                    target: up("http://root:1"),
                },
                Route {
                    prefix: "/api/v2/".into(),
                    target: up("http://v2:1"),
                },
                Route {
                    prefix: "/api/".into(),
                    target: up("http://api:1"),
                },
            ],
            None,
            None,
        );
        let to = |p: &str| match t.route(p).map(|r| &r.target) {
            Some(Target::Upstreams(s)) => s.upstreams()[0].authority().to_string(),
            _ => "none".into(),
        };
        assert_eq!(to("/api/v2/x"), "v2:1");
        assert_eq!(to("/api/v1"), "api:1");
        assert_eq!(to("/api"), "root:1");
        assert_eq!(to("/index.html"), "root:1");
        let no_root = Table::new(
            vec![Route {
                prefix: "/api/".into(),
                target: up("http://api:1"),
            }],
            None,
            None,
        );
        assert!(no_root.route("/other").is_none());
    }
}
