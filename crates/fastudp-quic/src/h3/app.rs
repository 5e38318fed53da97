//! HTTP/3 as an application of the engine ([`H3App`]).

use super::backend::Link;
use super::executor::Executor;
use super::handler::{Builtin, Content, Handler, Route};
use super::service::{BoxError, RequestBody, ServeRequest};
use super::task::{H3Task, Responder, TaskStats};
use crate::app::{AppCx, AppEvent, Application, ConnApp, ConnInfo, Dir, WorkerApp};
use crate::hq::wire::{self as hq, Frames, Request};
use crate::limits;
use bytes::Bytes;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Makes a worker's request handler, on that worker's thread, from the
/// worker's number.
pub type MakeHandler = dyn Fn(usize) -> Rc<dyn Handler> + Send + Sync;

/// Makes a connection's service on one worker: from the connection's
/// facts and ALPN.
type ConnService = dyn Fn(ConnInfo, &[u8]) -> Rc<dyn ServeRequest>;

/// Makes a worker's [`ConnService`], on that worker's thread.
type MakeService = dyn Fn(usize) -> Box<ConnService> + Send + Sync;

/// What answers the requests.
#[derive(Clone)]
enum Answer {
    /// A synchronous handler per worker.
    Handler(Arc<MakeHandler>),
    /// An asynchronous service per worker, run with the worker's runtime.
    Service(Arc<MakeService>),
}

/// HTTP/3 (ALPN `h3`) with the `h3` crate: one task per connection,
/// driven by the engine's events, answering requests with a [`Handler`]
/// made once per worker thread, or with a `tower::Service`
/// ([`H3App::service`]; an axum `Router`) whose futures run on the worker
/// thread inside a tokio runtime of the worker's.
///
/// ```
/// use fastudp_quic::app::{hq::HqApp, Router};
/// use fastudp_quic::h3::H3App;
/// let app = Router::new()
///     .with(fastudp_quic::h3::ALPN, H3App::builtin())
///     .with(b"hq-interop", HqApp::default());
/// # use fastudp_quic::app::Application;
/// assert_eq!(app.alpn(), vec![b"h3".to_vec(), b"hq-interop".to_vec()]);
/// ```
#[derive(Clone)]
pub struct H3App {
    answer: Answer,
    request_timeout: Duration,
}

impl std::fmt::Debug for H3App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("H3App")
    }
}

impl H3App {
    /// HTTP/3 answering with the handler `make(worker)` gives each worker.
    pub fn new(make: impl Fn(usize) -> Rc<dyn Handler> + Send + Sync + 'static) -> Self {
        H3App {
            answer: Answer::Handler(Arc::new(make)),
            request_timeout: limits::REQUEST_TIMEOUT,
        }
    }

    /// HTTP/3 answered by `svc`, a `tower::Service` such as an axum
    /// `Router` (cloned for each connection), unchanged. Its futures run
    /// on the worker thread that owns the connection, inside a tokio
    /// current-thread runtime of the worker's, so they may await tokio's
    /// timers, channels and I/O; request and response bodies stream with
    /// flow control both ways, and a panic answers that request 500 (or
    /// resets its stream) while the connection and the worker go on
    /// ([`crate::h3::service`]).
    ///
    /// ```
    /// use fastudp_quic::h3::{H3App, RequestBody};
    /// use std::convert::Infallible;
    /// use std::future::{ready, Ready};
    /// use std::task::{Context, Poll};
    ///
    /// /// Answers every request with its path.
    /// #[derive(Clone)]
    /// struct Path;
    ///
    /// impl tower_service::Service<http::Request<RequestBody>> for Path {
    ///     type Response = http::Response<String>;
    ///     type Error = Infallible;
    ///     type Future = Ready<Result<Self::Response, Infallible>>;
    ///
    ///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
    ///         Poll::Ready(Ok(()))
    ///     }
    ///
    ///     fn call(&mut self, req: http::Request<RequestBody>) -> Self::Future {
    ///         ready(Ok(http::Response::new(req.uri().path().to_string())))
    ///     }
    /// }
    ///
    /// let _app = H3App::service(Path);
    /// ```
    pub fn service<S, B>(svc: S) -> Self
    where
        S: tower_service::Service<http::Request<RequestBody>, Response = http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: 'static,
        B: http_body::Body + 'static,
        B::Data: bytes::Buf,
        B::Error: Into<BoxError>,
    {
        H3App::service_per_worker(move |_| svc.clone())
    }

    /// HTTP/3 answered by the service `make(worker)` gives each worker, on
    /// that worker's thread (it need not be `Send`), cloned for each
    /// connection; otherwise as [`H3App::service`].
    pub fn service_per_worker<S, B>(make: impl Fn(usize) -> S + Send + Sync + 'static) -> Self
    where
        S: tower_service::Service<http::Request<RequestBody>, Response = http::Response<B>>
            + Clone
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: 'static,
        B: http_body::Body + 'static,
        B::Data: bytes::Buf,
        B::Error: Into<BoxError>,
    {
        let make: Arc<MakeService> = Arc::new(move |worker| {
            let svc = make(worker);
            Box::new(move |info: ConnInfo, alpn: &[u8]| {
                super::service::responder(svc.clone(), info, alpn)
            }) as Box<ConnService>
        });
        H3App {
            answer: Answer::Service(make),
            request_timeout: limits::REQUEST_TIMEOUT,
        }
    }

    /// How long a request stream may take to deliver its whole header
    /// section (default [`limits::REQUEST_TIMEOUT`], as hq-interop's request
    /// line): a stream without one by then is reset and stopped with
    /// `H3_REQUEST_INCOMPLETE` and counted in
    /// [`crate::Counters::request_timeouts`].
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// `/bytes/N` and `/video/RATE/SECONDS` as hq-interop serves them
    /// (frames every 40 ms), 404 for any other path.
    pub fn builtin() -> Self {
        H3App::builtin_with(Duration::from_millis(40), None)
    }

    /// The built-in endpoints with `/video` frames every `interval`, and
    /// other paths given to `fallback` (static files) instead of 404.
    pub fn builtin_with(interval: Duration, fallback: Option<Arc<MakeHandler>>) -> Self {
        let make = builtin_handler(interval, fallback);
        H3App::new(move |worker| make(worker))
    }
}

/// The handler of [`H3App::builtin_with`] on its own: `/bytes/N` and
/// `/video/RATE/SECONDS` with frames every `interval`, other paths given
/// to `fallback` (or 404). The TCP discovery listener
/// ([`crate::altsvc`]) answers with the same one, so that both transports
/// serve the same bytes.
pub fn builtin_handler(interval: Duration, fallback: Option<Arc<MakeHandler>>) -> Arc<MakeHandler> {
    Arc::new(move |worker| {
        let b = Builtin::new(PatternContent::new(interval));
        match &fallback {
            Some(f) => Rc::new(b.with_fallback(f(worker))) as Rc<dyn Handler>,
            None => Rc::new(b),
        }
    })
}

impl Application for H3App {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![super::ALPN.to_vec()]
    }

    fn close_codes(&self, _alpn: &[u8]) -> crate::app::CloseCodes {
        crate::app::CloseCodes::HTTP3
    }

    fn worker(&self, worker: usize) -> Box<dyn WorkerApp> {
        let answer = match &self.answer {
            Answer::Handler(make) => WorkerAnswer::Handler(make(worker)),
            Answer::Service(make) => match Executor::new(worker) {
                Ok(ex) => WorkerAnswer::Service(make(worker), ex),
                Err(e) => WorkerAnswer::NoRuntime(e.to_string()),
            },
        };
        Box::new(H3Worker {
            answer,
            request_timeout: self.request_timeout,
        })
    }
}

/// What answers on one worker.
enum WorkerAnswer {
    Handler(Rc<dyn Handler>),
    Service(Box<ConnService>, Executor),
    /// The worker's runtime could not be made (the reason): its
    /// connections are refused, and counted in
    /// [`crate::Counters::refused`].
    NoRuntime(#[allow(dead_code)] String),
}

/// HTTP/3 on one worker.
struct H3Worker {
    answer: WorkerAnswer,
    request_timeout: Duration,
}

impl WorkerApp for H3Worker {
    fn accept(&mut self, alpn: &[u8], info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        let (responder, runtime) = match &self.answer {
            WorkerAnswer::Handler(h) => (
                Responder::Handler(h.clone(), Some(Rc::new(info.clone()))),
                None,
            ),
            WorkerAnswer::Service(make, ex) => (
                Responder::Service(make(info.clone(), alpn)),
                Some(ex.handle().clone()),
            ),
            WorkerAnswer::NoRuntime(_) => return None,
        };
        Some(Box::new(H3Connection {
            responder,
            runtime,
            request_timeout: self.request_timeout,
            max_requests: info.bidi_streams as usize,
            task: None,
            reported: TaskStats::default(),
        }))
    }
}

/// One connection: its task, made at the first call (the connection is
/// reached through [`AppCx`]).
struct H3Connection {
    responder: Responder,
    runtime: Option<tokio::runtime::Handle>,
    request_timeout: Duration,
    /// The requests the client may have open at once
    /// ([`ConnInfo::bidi_streams`]).
    max_requests: usize,
    task: Option<H3Task>,
    /// What was added to the engine's counters so far.
    reported: TaskStats,
}

impl H3Connection {
    fn task(&mut self, cx: &mut AppCx<'_>) -> &mut H3Task {
        let responder = &self.responder;
        let runtime = &self.runtime;
        let request_timeout = self.request_timeout;
        let max_requests = self.max_requests;
        let task = self.task.get_or_insert_with(|| {
            // quinn-proto holds a copy of what h3 sends: bound it
            // (`limits::h3_per_connection`).
            cx.set_send_window(limits::H3_SEND_WINDOW);
            let t = H3Task::server(
                cx.conn().clone(),
                responder.clone(),
                max_requests,
                request_timeout,
                cx.now(),
            )
            .with_waker(cx.conn_waker());
            match runtime {
                Some(rt) => t.with_runtime(rt.clone()),
                None => t,
            }
        });
        // The engine drives the connection: the task's poll follows.
        task.driving();
        task
    }

    fn report(&mut self, cx: &AppCx<'_>) {
        let Some(t) = &self.task else { return };
        let s = t.stats();
        let c = cx.counters();
        c.h3_requests
            .fetch_add(s.requests - self.reported.requests, Relaxed);
        c.h3_refused
            .fetch_add(s.refused - self.reported.refused, Relaxed);
        c.request_timeouts
            .fetch_add(s.timeouts - self.reported.timeouts, Relaxed);
        c.app_panics
            .fetch_add(s.panics - self.reported.panics, Relaxed);
        if s.status != self.reported.status {
            for (i, n) in s.status.iter().enumerate() {
                let new = n - self.reported.status[i];
                if new > 0 {
                    c.h3_responses[i].fetch_add(new, Relaxed);
                }
            }
        }
        self.reported = s;
    }
}

fn quinn_dir(d: Dir) -> quinn_proto::Dir {
    match d {
        Dir::Bi => quinn_proto::Dir::Bi,
        Dir::Uni => quinn_proto::Dir::Uni,
    }
}

/// The connection ended before the engine said why (it tells only once
/// the connection is drained).
fn lost(link: &Link) {
    if link.error().is_none() {
        link.on_lost(&quinn_proto::ConnectionError::LocallyClosed);
    }
}

impl ConnApp for H3Connection {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        let link = self.task(cx).link();
        match ev {
            AppEvent::Opened(id) => link.on_opened(quinn_dir(id.dir()), id.quinn()),
            AppEvent::Readable(id) => link.on_readable(id.quinn()),
            AppEvent::Writable(id) => link.on_writable(id.quinn()),
            AppEvent::Stopped(id, _) => link.on_stopped(id.quinn()),
            AppEvent::CanOpen(d) => link.on_available(quinn_dir(d)),
            // Timers are fired by `poll`, which follows.
            _ => {}
        }
    }

    fn poll(&mut self, cx: &mut AppCx<'_>) {
        let now = cx.now();
        let closed = cx
            .conn()
            .try_borrow()
            .map(|c| c.is_closed())
            .unwrap_or(false);
        let task = self.task(cx);
        if closed {
            lost(task.link());
        }
        task.poll(now);
        // Goodput: the engine counts each finished stream's bytes once
        // the peer has acknowledged them.
        task.drain_finished(|id, len| cx.count_finished(id, len));
        self.report(cx);
    }

    fn timeout(&self) -> Option<Instant> {
        self.task.as_ref().and_then(H3Task::timeout)
    }

    fn on_drain(&mut self, cx: &mut AppCx<'_>) {
        // GOAWAY at the task's next poll, which follows.
        self.task(cx).drain();
    }

    fn drained(&self) -> bool {
        self.task.as_ref().is_none_or(H3Task::drained)
    }

    fn on_shutdown(&mut self, cx: &mut AppCx<'_>) {
        // H3_NO_ERROR: the server is going away.
        cx.close(super::backend::H3_NO_ERROR, b"server stopping");
    }

    fn on_closed(&mut self, _reason: crate::app::Closed) {
        if let Some(t) = &self.task {
            lost(t.link());
        }
        // The task and its handles go with it.
        self.task = None;
    }
}

/// The content of the built-in endpoints as hq-interop serves it
/// ([`crate::hq::wire`]): the same paths, limits and pattern.
#[derive(Debug, Clone, Copy)]
pub struct PatternContent {
    interval: Duration,
}

impl PatternContent {
    /// With `/video` frames every `interval` (more than 0).
    pub fn new(interval: Duration) -> Self {
        PatternContent {
            interval: interval.max(Duration::from_nanos(1)),
        }
    }
}

impl Content for PatternContent {
    fn route(&self, path: &str) -> Option<Route> {
        let mut line = Vec::with_capacity(path.len() + 4);
        line.extend_from_slice(b"GET ");
        line.extend_from_slice(path.as_bytes());
        match hq::parse(&line, true) {
            Ok(Some(Request::Bytes(n))) => Some(Route::Bytes(n)),
            Ok(Some(Request::Video { rate, seconds })) => {
                let f = Frames::new(rate, seconds, self.interval);
                Some(Route::Video {
                    bytes: f.bytes,
                    count: f.count,
                    interval: f.interval,
                })
            }
            _ => None,
        }
    }

    fn pattern(&self, off: u64, len: usize) -> Bytes {
        Bytes::from_static(hq::pattern(off, len as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_content_routes_as_hq_does() {
        let c = PatternContent::new(Duration::from_millis(40));
        assert_eq!(c.route("/bytes/10"), Some(Route::Bytes(10)));
        assert_eq!(
            c.route("/video/125000/3"),
            Some(Route::Video {
                bytes: 5000,
                count: 75,
                interval: Duration::from_millis(40)
            })
        );
        for bad in ["/", "/bytes/", "/bytes/-1", "/index.html", "/bytes/10/x"] {
            assert_eq!(c.route(bad), None, "{bad}");
        }
        let p = c.pattern(1000, 70_000);
        assert_eq!(p.len(), hq::CHUNK);
        assert_eq!(hq::check(1000, &p), Ok(()));
    }
}
