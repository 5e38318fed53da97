//! The per-connection HTTP/3 task and how the engine drives it.
//!
//! One future per connection runs h3's server: it accepts requests and
//! keeps their futures in a `FuturesUnordered` bounded by the stream limit.
//! Nothing is spawned: the driver calls [`H3Task::poll`] in each drive
//! that calls the application (events, a wake, its timeout, the drain, a
//! closed connection: `ConnApp::poll`), after the connection's events were
//! forwarded to the [`Link`] and before it polls transmits, and the task
//! is polled only when something woke it.
//! Video frames sleep on a per-connection timer registry; its earliest
//! deadline is [`H3Task::timeout`], part of the connection's timer.
//!
//! A wake from outside the connection's drive (a tokio timer, a channel,
//! another thread) has the engine drive the connection again through its
//! [`ConnWaker`], which ends the worker's wait at once. With a runtime
//! ([`H3Task::with_runtime`]) the task is polled inside it, so that the
//! requests' futures can use tokio's timers and I/O. A panic in the task
//! is caught: the connection is closed with `H3_INTERNAL_ERROR`, and the
//! worker goes on.

use super::backend::{ConnRef, H3Conn, Limits, Link, H3_INTERNAL_ERROR};
use super::handler::{Handler, Next, CHUNK};
use super::service::{Outcome, ServeRequest};
use crate::app::{ConnInfo, ConnWaker};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use quinn_proto::{StreamId, VarInt};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// The largest header section taken (h3's `max_field_section_size`; its
/// default is unbounded). A larger one is answered 431.
pub const MAX_FIELD_SECTION: u64 = 16 * 1024;
/// The most bytes h3 is handed on one request stream: a header section of
/// [`MAX_FIELD_SECTION`] and its encoding's overhead (QPACK's encoding is
/// at most a few bytes a field longer than the size it is judged by, which
/// counts 32 bytes a field). h3 reads a HEADERS frame whole before it
/// checks its size, so beyond this the stream is refused with
/// `H3_EXCESSIVE_LOAD`; between the two, h3 answers 431.
pub const REQUEST_STREAM_CAP: u64 = MAX_FIELD_SECTION + 4 * 1024;
/// The longest frame taken on the peer's control stream (SETTINGS,
/// GOAWAY, PRIORITY_UPDATE and the like are a few dozen bytes). h3 reads
/// a frame whole before it decodes it; a longer one closes the connection
/// with `H3_EXCESSIVE_LOAD`. The QPACK streams are not read by h3 beyond
/// their type (its QPACK is stateless), so the transport window bounds
/// them.
pub const CONTROL_FRAME_MAX: u64 = 16 * 1024;
/// How often one [`H3Task::poll`] re-polls a task that woke itself before
/// it leaves the rest to the next drive (through [`H3Task::timeout`]).
const REPOLLS: usize = 4;
/// `H3_REQUEST_INCOMPLETE` (RFC 9114 section 8.1): a request stream whose
/// header section did not arrive in time is reset and stopped with it.
pub(crate) const H3_REQUEST_INCOMPLETE: u64 = 0x10d;
/// `H3_REQUEST_REJECTED` (RFC 9114 section 8.1): a request on a stream at
/// or past the GOAWAY's ID is refused with it, unprocessed.
pub(crate) const H3_REQUEST_REJECTED: u64 = 0x10b;
/// After its last request, a draining connection waits this many RTTs
/// (within [`LINGER_MIN`] and [`LINGER_MAX`]) from its GOAWAY before it
/// ends, so that the GOAWAY reaches the client before the close.
const LINGER_RTTS: u32 = 3;
const LINGER_MIN: Duration = Duration::from_millis(5);
const LINGER_MAX: Duration = Duration::from_secs(1);

/// The task's waker: marks the task as due and, unless the engine is
/// driving the connection (its poll of the task follows), has the
/// connection driven again, from any thread.
#[derive(Default)]
pub(crate) struct TaskWaker {
    pub(crate) queued: AtomicBool,
    wakes: AtomicU64,
    /// The engine is driving the connection: a poll of the task follows.
    pub(crate) driving: AtomicBool,
    /// Drives the connection again (none in tests without an engine).
    conn: Option<ConnWaker>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let was = self.queued.swap(true, Ordering::SeqCst);
        self.wakes.fetch_add(1, Ordering::Relaxed);
        // Already queued: a drive was asked for, or the engine reads the
        // flag through `timeout()` after its drive.
        if !was && !self.driving.load(Ordering::SeqCst) {
            if let Some(c) = &self.conn {
                c.wake_conn();
            }
        }
    }
}

/// What answers a connection's requests.
#[derive(Clone)]
pub(crate) enum Responder {
    /// A synchronous [`Handler`] (the file server, the built-in paths),
    /// and the facts of the connection each request carries to it as an
    /// extension.
    Handler(Rc<dyn Handler>, Option<Rc<ConnInfo>>),
    /// An asynchronous service (a `tower::Service`).
    Service(Rc<dyn ServeRequest>),
}

impl From<Rc<dyn Handler>> for Responder {
    fn from(h: Rc<dyn Handler>) -> Self {
        Responder::Handler(h, None)
    }
}

/// The deadlines the task's sleepers wait for: at most one per request
/// future, so bounded by the stream limit.
#[derive(Default)]
pub(crate) struct Timers {
    next_key: u64,
    due: BTreeMap<(Instant, u64), Waker>,
}

impl Timers {
    /// The earliest deadline.
    fn first(&self) -> Option<Instant> {
        self.due.keys().next().map(|(t, _)| *t)
    }

    /// Wakes (and forgets) every sleeper due at `now`.
    fn fire(&mut self, now: Instant) {
        while let Some(e) = self.due.first_entry() {
            if e.key().0 > now {
                break;
            }
            e.remove().wake();
        }
    }
}

/// What the request futures share with the driver: the clock and the
/// timers.
pub(crate) struct Clock {
    link: Rc<Link>,
    timers: RefCell<Timers>,
}

impl Clock {
    fn now(&self) -> Instant {
        self.link.now()
    }

    /// The connection's link.
    pub(crate) fn link(&self) -> &Rc<Link> {
        &self.link
    }
}

/// Sleeps until `at` on the connection's timers.
struct Sleep {
    clock: Rc<Clock>,
    at: Instant,
    key: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Ok(mut timers) = this.clock.timers.try_borrow_mut() else {
            // Never: the timers are borrowed only inside this crate's
            // short, non-reentrant calls. Waking through now is safe.
            return Poll::Ready(());
        };
        if let Some(k) = this.key.take() {
            timers.due.remove(&(this.at, k));
        }
        if this.clock.now() >= this.at {
            return Poll::Ready(());
        }
        let k = timers.next_key;
        timers.next_key += 1;
        timers.due.insert((this.at, k), cx.waker().clone());
        this.key = Some(k);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let (Some(k), Ok(mut t)) = (self.key, self.clock.timers.try_borrow_mut()) {
            t.due.remove(&(self.at, k));
        }
    }
}

/// What one connection's task did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskStats {
    /// Requests whose head was read and answered.
    pub(crate) requests: u64,
    /// Requests refused before an answer (bad or oversized head, reset).
    pub(crate) refused: u64,
    /// Responses cut short (reset, stopped, connection lost).
    pub(crate) cut: u64,
    /// Request streams whose header section was not whole by the request
    /// deadline (reset with `H3_REQUEST_INCOMPLETE`).
    pub(crate) timeouts: u64,
    /// Panics in application code caught (a request answered 500 or
    /// reset, or the connection closed).
    pub(crate) panics: u64,
    /// Responses begun, by status class ([`crate::status_class`]).
    pub(crate) status: [u64; 5],
}

/// The connection's HTTP/3 server task.
pub(crate) struct H3Task {
    link: Rc<Link>,
    clock: Rc<Clock>,
    fut: Option<Pin<Box<dyn Future<Output = ()>>>>,
    flag: Arc<TaskWaker>,
    waker: Waker,
    stats: Rc<RefCell<TaskStats>>,
    polls: u64,
    /// A failed borrow ended the task; the connection is still to be
    /// closed.
    close_pending: bool,
    /// A failed borrow was seen (and handled).
    faulted: bool,
    /// The runtime the task is polled in, if any.
    runtime: Option<tokio::runtime::Handle>,
    /// The drain, between the engine and the task.
    drain: Rc<Drain>,
}

/// A connection's drain: asked by [`H3Task::drain`] (the task then sends
/// GOAWAY), done once no request runs (the task then holds h3 without
/// polling it further: dropping h3 would close the connection before the
/// client has acknowledged the last responses; the engine closes it).
#[derive(Default)]
pub(crate) struct Drain {
    asked: Cell<bool>,
    done: Cell<bool>,
}

impl H3Task {
    /// The server task of `conn`, answering with `handler`, at most
    /// `max_requests` at once (the connection's bidirectional stream
    /// limit); a request stream whose header section is not whole within
    /// `request_timeout` of its acceptance is reset.
    pub(crate) fn server(
        conn: ConnRef,
        responder: impl Into<Responder>,
        max_requests: usize,
        request_timeout: Duration,
        now: Instant,
    ) -> H3Task {
        let limits = Limits {
            request_stream: Some(REQUEST_STREAM_CAP),
            control_frame: Some(CONTROL_FRAME_MAX),
        };
        let link = Link::new(conn, limits, now);
        let clock = Rc::new(Clock {
            link: link.clone(),
            timers: RefCell::default(),
        });
        let stats = Rc::new(RefCell::new(TaskStats::default()));
        let drain = Rc::new(Drain::default());
        let fut = serve_connection(
            H3Conn::new(link.clone()),
            responder.into(),
            clock.clone(),
            stats.clone(),
            max_requests.max(1),
            request_timeout,
            drain.clone(),
        );
        let flag = Arc::new(TaskWaker::default());
        // Due at once: the first poll opens h3's control streams.
        flag.queued.store(true, Ordering::Relaxed);
        H3Task {
            waker: Waker::from(flag.clone()),
            flag,
            link,
            clock,
            fut: Some(Box::pin(fut)),
            stats,
            polls: 0,
            close_pending: false,
            faulted: false,
            runtime: None,
            drain,
        }
    }

    /// The server drains: the task sends GOAWAY (requests accepted so far
    /// go on, later ones are refused with `H3_REQUEST_REJECTED`) and ends
    /// once its requests are done. Its next poll does it.
    pub(crate) fn drain(&self) {
        if !self.drain.asked.replace(true) {
            self.flag.queued.store(true, Ordering::SeqCst);
        }
    }

    /// Whether, after [`H3Task::drain`], the task has nothing under way
    /// (or has ended).
    pub(crate) fn drained(&self) -> bool {
        self.drain.done.get() || self.fut.is_none()
    }

    /// Has a wake from outside the connection's drive drive it again
    /// (through `waker`). Call before the first poll.
    pub(crate) fn with_waker(mut self, waker: ConnWaker) -> Self {
        let flag = Arc::new(TaskWaker {
            queued: AtomicBool::new(self.flag.queued.load(Ordering::SeqCst)),
            conn: Some(waker),
            ..TaskWaker::default()
        });
        self.waker = Waker::from(flag.clone());
        self.flag = flag;
        self
    }

    /// Polls the task inside `rt` (its timers and I/O reach the requests'
    /// futures).
    pub(crate) fn with_runtime(mut self, rt: tokio::runtime::Handle) -> Self {
        self.runtime = Some(rt);
        self
    }

    /// The engine is driving the connection: wakes until the end of the
    /// next [`H3Task::poll`] need no drive of their own.
    pub(crate) fn driving(&self) {
        self.flag.driving.store(true, Ordering::SeqCst);
    }

    /// Streams finished since the last call, with their bytes.
    #[cfg(test)]
    pub(crate) fn take_finished(&self) -> Vec<(quinn_proto::StreamId, u64)> {
        self.link.take_finished()
    }

    /// Hands `f` the streams finished since the last call, with their
    /// bytes (no allocation per call: `Link::drain_finished`).
    pub(crate) fn drain_finished(&self, f: impl FnMut(quinn_proto::StreamId, u64)) {
        self.link.drain_finished(f)
    }

    /// Where the connection's events go (`Link::forward`, `Link::on_*`).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// Polls the task if it was woken or a timer of it is due. Call with no
    /// borrow of the connection held. Returns `true` once the task ended.
    pub(crate) fn poll(&mut self, now: Instant) -> bool {
        self.link.set_now(now);
        if let Ok(mut t) = self.clock.timers.try_borrow_mut() {
            t.fire(now);
        }
        let _entered = self.runtime.as_ref().map(|rt| rt.enter());
        for _ in 0..REPOLLS {
            let Some(fut) = self.fut.as_mut() else {
                break;
            };
            if !self.flag.queued.swap(false, Ordering::SeqCst) {
                break;
            }
            self.polls += 1;
            let mut cx = Context::from_waker(&self.waker);
            // A panic that a request's own guard did not catch ends the
            // connection, not the worker.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fut.as_mut().poll(&mut cx)
            })) {
                Ok(Poll::Ready(())) => self.fut = None,
                Ok(Poll::Pending) => {}
                Err(_) => {
                    count(&self.stats, |s| s.panics += 1);
                    self.fut = None;
                    self.close_pending = true;
                }
            }
        }
        // Wakes from now on have the connection driven again.
        self.flag.driving.store(false, Ordering::SeqCst);
        if self.link.faulted() && !self.faulted {
            self.faulted = true;
            // A borrow failed: end the task, and the connection as soon as
            // it can be borrowed (`timeout()` asks for the next drive).
            self.fut = None;
            self.close_pending = true;
        }
        if self.close_pending {
            if let Ok(mut c) = self.link.conn().try_borrow_mut() {
                c.close(
                    now,
                    VarInt::from_u64(H3_INTERNAL_ERROR).unwrap_or(VarInt::MAX),
                    Bytes::from_static(b"internal error"),
                );
                self.close_pending = false;
            }
        }
        self.fut.is_none()
    }

    /// When the task must be polled next without a wake: its earliest
    /// sleeper, or at once when it woke itself and was left for the next
    /// drive.
    pub(crate) fn timeout(&self) -> Option<Instant> {
        if self.close_pending {
            return Some(self.link.now());
        }
        self.fut.as_ref()?;
        if self.flag.queued.load(Ordering::SeqCst) {
            return Some(self.link.now());
        }
        self.clock.timers.try_borrow().ok().and_then(|t| t.first())
    }

    /// Times the task was polled.
    #[cfg(test)]
    pub(crate) fn polls(&self) -> u64 {
        self.polls
    }

    /// Times the task was woken.
    #[cfg(test)]
    pub(crate) fn wakes(&self) -> u64 {
        self.flag.wakes.load(Ordering::Relaxed)
    }

    /// The task's counts.
    pub(crate) fn stats(&self) -> TaskStats {
        self.stats.try_borrow().map(|s| *s).unwrap_or_default()
    }

    /// Whether the task has ended.
    #[cfg(test)]
    pub(crate) fn is_done(&self) -> bool {
        self.fut.is_none()
    }
}

/// Counts a response begun with `status`, by its class.
fn count_status(stats: &RefCell<TaskStats>, status: u16) {
    if let Some(i) = crate::stats::status_class(status) {
        count(stats, |s| s.status[i] += 1);
    }
}

fn count(stats: &RefCell<TaskStats>, f: impl FnOnce(&mut TaskStats)) {
    if let Ok(mut s) = stats.try_borrow_mut() {
        f(&mut s);
    }
}

/// h3's handle on a request stream whose head is still to be read.
pub(crate) type Resolver = ::h3::server::RequestResolver<H3Conn, Bytes>;
/// A request stream, its head read.
pub(crate) type RequestStream = ::h3::server::RequestStream<super::backend::H3Bidi<Bytes>, Bytes>;

/// What the accept loop of a connection does next. It lives only
/// between the accept loop's poll and its match (as the `Option` of the
/// resolver did before the drain), so its size is not held.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// h3 gave a request stream, or said there are no more (the peer's
    /// GOAWAY, or the connection ended).
    Accepted(Result<Option<Resolver>, ::h3::error::ConnectionError>),
    /// The server drains: GOAWAY is to be sent.
    Drain,
    /// Nothing runs and nothing more is taken.
    Done,
}

/// The connection's future: h3's server, its accept loop, and the request
/// futures (at most `max_requests`). When `drain` is set it sends GOAWAY
/// with the ID of the next request stream: the requests accepted go on,
/// later ones are refused, and once none runs it ends.
async fn serve_connection(
    conn: H3Conn,
    responder: Responder,
    clock: Rc<Clock>,
    stats: Rc<RefCell<TaskStats>>,
    max_requests: usize,
    request_timeout: Duration,
    drain: Rc<Drain>,
) {
    // Grease streams are not sent: h3 opens its grease stream from the
    // control stream's poll and waits there for stream credit, so a client
    // that grants just the three required unidirectional streams would
    // stall our control stream.
    // The set-up's future is boxed, and so are the requests': a future
    // is as large as its largest state, and every connection holds this
    // one for its lifetime (6,088 bytes with the set-up inline, 3,104
    // without), and a `FuturesUnordered` allocates a task the size of its
    // future type up front (6,464 bytes per connection for an inline
    // request future, idle or not).
    let Ok(mut h3) = Box::pin(
        ::h3::server::builder()
            .max_field_section_size(MAX_FIELD_SECTION)
            .send_grease(false)
            .build::<_, Bytes>(conn),
    )
    .await
    else {
        return;
    };
    let mut requests: FuturesUnordered<Pin<Box<dyn Future<Output = ()>>>> = FuturesUnordered::new();
    let mut accepting = true;
    // The last request stream accepted, and the GOAWAY's stream ID with
    // when it was sent.
    let mut last: Option<u64> = None;
    let mut goaway: Option<(u64, Instant)> = None;
    loop {
        let step = {
            let accept = h3.accept();
            futures_util::pin_mut!(accept);
            std::future::poll_fn(|cx| {
                while let Poll::Ready(Some(())) = requests.poll_next_unpin(cx) {}
                if drain.asked.get() && goaway.is_none() {
                    return Poll::Ready(Step::Drain);
                }
                if accepting && requests.len() < max_requests {
                    if let Poll::Ready(r) = accept.as_mut().poll(cx) {
                        return Poll::Ready(Step::Accepted(r));
                    }
                }
                if (!accepting || goaway.is_some()) && requests.is_empty() {
                    return Poll::Ready(Step::Done);
                }
                Poll::Pending
            })
            .await
        };
        match step {
            Step::Accepted(Ok(Some(resolver))) => {
                let id = resolver.frame_stream.id().into_inner();
                if goaway.is_some_and(|(g, _)| id >= g) {
                    reject(&clock, id);
                    count(&stats, |s| s.refused += 1);
                    continue;
                }
                last = Some(id);
                // One box per request: a service's future is built
                // around the head's reading (`ServeRequest::request`).
                requests.push(match &responder {
                    Responder::Service(svc) => {
                        svc.request(resolver, clock.clone(), stats.clone(), request_timeout)
                    }
                    Responder::Handler(h, info) => Box::pin(serve_request(
                        resolver,
                        h.clone(),
                        info.clone(),
                        clock.clone(),
                        stats.clone(),
                        request_timeout,
                    )),
                })
            }
            // The peer's GOAWAY, or the connection ended: finish what runs.
            Step::Accepted(Ok(None)) | Step::Accepted(Err(_)) => accepting = false,
            Step::Drain => {
                // h3 names the stream after the last it accepted (the
                // first request stream when none): the same as ours.
                goaway = Some((last.map_or(0, |id| id + 4), clock.now()));
                // Boxed, as the set-up: every connection's future would
                // be as large as its largest state.
                if Box::pin(h3.shutdown(1)).await.is_err() {
                    accepting = false;
                }
            }
            Step::Done => {
                let Some((_, sent)) = goaway else {
                    return;
                };
                Box::pin(linger(&clock, sent)).await;
                // h3 is kept: the engine closes the connection once every
                // response is acknowledged.
                drain.done.set(true);
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Refuses request stream `id`, unprocessed, with `H3_REQUEST_REJECTED`
/// (it came at or past the GOAWAY's stream ID).
fn reject(clock: &Clock, id: u64) {
    let Ok(id) = VarInt::from_u64(id) else { return };
    if let Ok(mut c) = clock.link.conn().try_borrow_mut() {
        let code = VarInt::from_u64(H3_REQUEST_REJECTED).unwrap_or(VarInt::MAX);
        let _ = c.recv_stream(StreamId::from(id)).stop(code);
        let _ = c.send_stream(StreamId::from(id)).reset(code);
    }
}

/// Waits, after a GOAWAY sent at `sent`, [`LINGER_RTTS`] round trips
/// (within [`LINGER_MIN`] and [`LINGER_MAX`]): the GOAWAY reaches the
/// client before the connection closes.
async fn linger(clock: &Rc<Clock>, sent: Instant) {
    let rtt = clock
        .link
        .conn()
        .try_borrow()
        .map(|c| c.rtt())
        .unwrap_or(LINGER_MIN);
    let wait = (rtt * LINGER_RTTS).clamp(LINGER_MIN, LINGER_MAX);
    Sleep {
        clock: clock.clone(),
        at: sent + wait,
        key: None,
    }
    .await
}

/// Reads a request's head (by `clock.now() + request_timeout`): the
/// request and its stream, or `None` when it was refused or did not
/// arrive in time (counted).
pub(crate) async fn read_head(
    resolver: Resolver,
    clock: &Rc<Clock>,
    stats: &RefCell<TaskStats>,
    request_timeout: Duration,
) -> Option<(http::Request<()>, RequestStream)> {
    let id = StreamId::from(
        VarInt::from_u64(resolver.frame_stream.id().into_inner()).unwrap_or(VarInt::MAX),
    );
    let mut deadline = Sleep {
        clock: clock.clone(),
        at: clock.now() + request_timeout,
        key: None,
    };
    let resolve = resolver.resolve_request();
    futures_util::pin_mut!(resolve);
    let resolved = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = resolve.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if Pin::new(&mut deadline).poll(cx).is_ready() {
            // Refused before h3 lets go of the stream (which would finish
            // it: an empty, malformed response).
            if let Ok(mut c) = clock.link.conn().try_borrow_mut() {
                let code = VarInt::from_u64(H3_REQUEST_INCOMPLETE).unwrap_or(VarInt::MAX);
                let _ = c.recv_stream(id).stop(code);
                let _ = c.send_stream(id).reset(code);
            }
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await;
    // Its timer is not needed past the head.
    drop(deadline);
    let Some(resolved) = resolved else {
        count(stats, |s| s.timeouts += 1);
        return None;
    };
    match resolved {
        Ok(r) => {
            count(stats, |s| s.requests += 1);
            Some(r)
        }
        Err(_) => {
            // h3 already answered (431) or reset the stream.
            count(stats, |s| s.refused += 1);
            None
        }
    }
}

/// Counts how a request served through a service ended.
pub(crate) fn count_outcome(stats: &RefCell<TaskStats>, outcome: Outcome) {
    count(stats, |s| {
        s.cut += u64::from(outcome.cut);
        s.panics += u64::from(outcome.panicked);
    });
    if let Some(status) = outcome.status {
        count_status(stats, status);
    }
}

/// One request to a [`Handler`]: read the head, answer it, send the body.
async fn serve_request(
    resolver: Resolver,
    handler: Rc<dyn Handler>,
    info: Option<Rc<ConnInfo>>,
    clock: Rc<Clock>,
    stats: Rc<RefCell<TaskStats>>,
    request_timeout: Duration,
) {
    let Some((mut req, mut stream)) = read_head(resolver, &clock, &stats, request_timeout).await
    else {
        return;
    };
    if let Some(i) = info {
        req.extensions_mut().insert(ConnInfo::clone(&i));
    }
    let reply = handler.handle(&req, clock.now());
    count_status(&stats, reply.head.status().as_u16());
    if stream.send_response(reply.head).await.is_err() {
        count(&stats, |s| s.cut += 1);
        return;
    }
    if let Some(mut body) = reply.body {
        loop {
            match body.next(clock.now(), CHUNK) {
                Ok(Next::Data(b)) => {
                    // Its bytes go to quinn-proto by reference.
                    clock.link.lend(&b);
                    if stream.send_data(b).await.is_err() {
                        count(&stats, |s| s.cut += 1);
                        return;
                    }
                }
                Ok(Next::Wait(at)) => {
                    Sleep {
                        clock: clock.clone(),
                        at,
                        key: None,
                    }
                    .await
                }
                Ok(Next::End) => break,
                Err(_) => {
                    stream.stop_stream(::h3::error::Code::H3_INTERNAL_ERROR);
                    count(&stats, |s| s.cut += 1);
                    return;
                }
            }
        }
    }
    if stream.finish().await.is_err() {
        count(&stats, |s| s.cut += 1);
    }
}
