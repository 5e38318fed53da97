//! Any `tower::Service<http::Request<RequestBody>>` (an axum `Router`, a
//! hyper service) answering HTTP/3 requests on the engine.
//!
//! Each request is a future in its connection's task, polled on the
//! worker thread that owns the connection, inside the worker's tokio
//! runtime (`super::executor`): the service's future may await timers,
//! channels, TCP clients, database drivers. Nothing of it needs to be
//! `Send`.
//!
//! - **Request body**: [`RequestBody`] is an `http_body::Body` read from
//!   the request stream as the service asks (h3's `recv_data`): one chunk
//!   is held at a time, and the stream's window is given back only as
//!   chunks are taken, so a slow reader holds the client back (flow
//!   control). It is `Send`, so it may be read from another task or
//!   thread; the request's future moves its bytes. Trailers arrive as a
//!   trailers frame.
//! - **Response body**: any `http_body::Body`; a frame is sent only once
//!   the previous one was taken by the QUIC stream (flow control the
//!   other way), so a slow client pins one frame here and the send window
//!   in quinn-proto.
//! - **Panics**: a panic in the service's `call`, its future or its
//!   response body is caught. Before the head was sent the request is
//!   answered 500; after, its stream is reset with `H3_INTERNAL_ERROR`.
//!   The connection and the worker go on.
//! - **Connection facts**: each request carries a [`ConnInfo`] (peer
//!   and local address, SNI, ALPN, worker) and the [`Alpn`] agreed, as
//!   extensions.

use super::backend::Link;
use super::task::{count_outcome, read_head, Clock, RequestStream as Stream, Resolver, TaskStats};
use crate::app::ConnInfo;
use bytes::{Buf, Bytes};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::cell::RefCell;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower_service::Service;

/// The error type services answer with, as tower and hyper take it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The ALPN protocol the connection agreed on, as a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alpn(pub Vec<u8>);

/// Why a request body ended early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestBodyError {
    /// The client reset the request stream with this code.
    #[error("the client reset the request stream (code {0:#x})")]
    Reset(u64),
    /// The connection ended, or the stream broke the protocol.
    #[error("the request body ended early: {0}")]
    Broken(String),
}

type SendHalf = ::h3::server::RequestStream<super::backend::H3Send<Bytes>, Bytes>;
type RecvHalf = ::h3::server::RequestStream<super::backend::H3Recv, Bytes>;

/// How a request served through a service ended.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Outcome {
    /// The response was cut short (reset, stopped, connection lost).
    pub(crate) cut: bool,
    /// Application code panicked.
    pub(crate) panicked: bool,
    /// The status of the response begun, if one was.
    pub(crate) status: Option<u16>,
}

/// Serves one request: the seam between the connection's task and a
/// service.
pub(crate) trait ServeRequest {
    /// The future of the request `resolver` holds: its head read (by
    /// `request_timeout`), then answered on its stream. One box per
    /// request, the head's reading and the service's future in it.
    fn request(
        &self,
        resolver: Resolver,
        clock: Rc<Clock>,
        stats: Rc<RefCell<TaskStats>>,
        request_timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = ()>>>;
}

/// A service and the facts of the connection it answers on.
pub(crate) struct ServiceResponder<S> {
    pub(crate) svc: S,
    pub(crate) info: ConnInfo,
    pub(crate) alpn: Alpn,
}

impl<S, B> ServeRequest for ServiceResponder<S>
where
    S: Service<Request<RequestBody>, Response = Response<B>> + Clone + 'static,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    B: Body + 'static,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    fn request(
        &self,
        resolver: Resolver,
        clock: Rc<Clock>,
        stats: Rc<RefCell<TaskStats>>,
        request_timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = ()>>> {
        let svc = self.svc.clone();
        let info = self.info.clone();
        let alpn = self.alpn.clone();
        Box::pin(async move {
            let Some((mut req, stream)) =
                read_head(resolver, &clock, &stats, request_timeout).await
            else {
                return;
            };
            req.extensions_mut().insert(info);
            req.extensions_mut().insert(alpn);
            let outcome = serve(svc, req, stream, clock.link().clone()).await;
            count_outcome(&stats, outcome);
        })
    }
}

/// What the request body and the request's future share.
#[derive(Default)]
struct BodyState {
    /// The chunk read, not yet taken.
    chunk: Option<Bytes>,
    /// The body asked for more.
    want: bool,
    /// The end: trailers (if any) to hand out, then `None`s.
    end: Option<Result<Option<HeaderMap>, RequestBodyError>>,
    /// The body was dropped: the rest of the stream is not wanted.
    dropped: bool,
    /// Who reads the body.
    reader: Option<Waker>,
    /// The request's future, which moves the bytes.
    pump: Option<Waker>,
}

fn lock(s: &Mutex<BodyState>) -> MutexGuard<'_, BodyState> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request's body, read from its HTTP/3 stream as it is asked for. At
/// most one chunk (what the QUIC stream had) is held; the client's window
/// is given back as chunks are taken.
pub struct RequestBody {
    shared: Arc<Mutex<BodyState>>,
    /// The `content-length` the client gave, if any.
    length: Option<u64>,
    /// Bytes handed out so far.
    read: u64,
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("length", &self.length)
            .field("read", &self.read)
            .finish()
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let w = {
            let mut s = lock(&self.shared);
            s.dropped = true;
            s.pump.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let shared = self.shared.clone();
        let mut s = lock(&shared);
        if let Some(c) = s.chunk.take() {
            let w = s.pump.take();
            drop(s);
            if let Some(w) = w {
                w.wake();
            }
            self.read += c.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(c))));
        }
        match &mut s.end {
            Some(Ok(trailers)) => {
                return Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Some(Err(e)) => return Poll::Ready(Some(Err(e.clone()))),
            None => {}
        }
        s.want = true;
        s.reader = Some(cx.waker().clone());
        let w = s.pump.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.shared);
        s.chunk.is_none() && matches!(s.end, Some(Ok(None)))
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(n) => SizeHint::with_exact(n.saturating_sub(self.read)),
            None => SizeHint::default(),
        }
    }
}

/// Moves the request body's bytes from the stream, as the body asks.
struct Pump {
    shared: Arc<Mutex<BodyState>>,
    recv: Option<RecvHalf>,
    /// Reading trailers (after the data ended).
    trailers: bool,
    /// The `content-length` the client gave, if any: DATA beyond it, or
    /// an end before it, make the request malformed (RFC 9114 4.1.2).
    length: Option<u64>,
    /// DATA bytes read so far.
    received: u64,
}

impl Pump {
    /// Does what it can; ready once the stream is read to its end (or
    /// given up).
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let Some(recv) = self.recv.as_mut() else {
                return Poll::Ready(());
            };
            let mut s = lock(&self.shared);
            if s.dropped {
                drop(s);
                // The rest is not wanted: the stream's receiving half,
                // dropped before its end, asks the client to stop sending
                // (`H3_NO_ERROR`).
                self.recv = None;
                return Poll::Ready(());
            }
            if s.chunk.is_some() || !s.want {
                s.pump = Some(cx.waker().clone());
                return Poll::Pending;
            }
            drop(s);
            let end = if self.trailers {
                match recv.poll_recv_trailers(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(t)) => Ok(t),
                    Poll::Ready(Err(e)) => Err(body_error(&e)),
                }
            } else {
                match recv.poll_recv_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(Some(mut b))) => {
                        let b = b.copy_to_bytes(b.remaining());
                        if b.is_empty() {
                            continue;
                        }
                        self.received += b.len() as u64;
                        if self.length.is_some_and(|n| self.received > n) {
                            self.malformed("more DATA than the content-length");
                            return Poll::Ready(());
                        }
                        let mut s = lock(&self.shared);
                        s.chunk = Some(b);
                        s.want = false;
                        let w = s.reader.take();
                        drop(s);
                        if let Some(w) = w {
                            w.wake();
                        }
                        continue;
                    }
                    Poll::Ready(Ok(None)) => {
                        if self.length.is_some_and(|n| self.received != n) {
                            self.malformed("less DATA than the content-length");
                            return Poll::Ready(());
                        }
                        self.trailers = true;
                        continue;
                    }
                    Poll::Ready(Err(e)) => Err(body_error(&e)),
                }
            };
            let mut s = lock(&self.shared);
            s.end = Some(end);
            let w = s.reader.take();
            drop(s);
            if let Some(w) = w {
                w.wake();
            }
            self.recv = None;
            return Poll::Ready(());
        }
    }
}

impl Pump {
    /// The service took the last chunk and asks for more, and the stream
    /// is still being read.
    fn wants_more(&self) -> bool {
        if self.recv.is_none() {
            return false;
        }
        let s = lock(&self.shared);
        !s.dropped && s.chunk.is_none() && s.want
    }

    /// A chunk waits for the service.
    fn has_chunk(&self) -> bool {
        lock(&self.shared).chunk.is_some()
    }
}

impl Drop for Pump {
    /// The request's future is gone (the connection closed, the response
    /// was cut, the service failed) before the body's end was read: a
    /// reader that outlives it (a spawned task) is told so, rather than
    /// left waiting for bytes nobody will move.
    fn drop(&mut self) {
        let w = {
            let mut s = lock(&self.shared);
            if s.end.is_some() || s.dropped {
                return;
            }
            s.end = Some(Err(RequestBodyError::Broken(
                "the request ended before its body was read".into(),
            )));
            s.reader.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl Pump {
    /// The request is malformed (RFC 9114 4.1.2): the body ends with an
    /// error and the client is asked to stop sending with
    /// `H3_MESSAGE_ERROR`.
    fn malformed(&mut self, why: &str) {
        if let Some(mut recv) = self.recv.take() {
            recv.stop_sending(::h3::error::Code::H3_MESSAGE_ERROR);
        }
        let mut s = lock(&self.shared);
        s.chunk = None;
        s.end = Some(Err(RequestBodyError::Broken(why.into())));
        let w = s.reader.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }
}

fn body_error(e: &::h3::error::StreamError) -> RequestBodyError {
    match e {
        ::h3::error::StreamError::RemoteTerminate { code, .. } => {
            RequestBodyError::Reset(code.value())
        }
        e => RequestBodyError::Broken(e.to_string()),
    }
}

/// Polls `f` with the body pump beside it; a panic in `f` is caught.
async fn with_pump<T>(
    pump: &mut Pump,
    f: impl Future<Output = T>,
) -> Result<T, Box<dyn std::any::Any + Send>> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        let _ = pump.poll(cx);
        // While the service takes each chunk and asks for the next, and
        // the stream has it, hand it over in this same poll: one chunk per
        // poll would move an upload a few packets per drive of the
        // connection (a task that woke itself is polled again at the next
        // timer tick).
        for _ in 0..PUMP_ROUNDS {
            match catch_unwind(AssertUnwindSafe(|| f.as_mut().poll(cx))) {
                Ok(Poll::Ready(v)) => return Poll::Ready(Ok(v)),
                Ok(Poll::Pending) => {}
                Err(p) => return Poll::Ready(Err(p)),
            }
            if !pump.wants_more() {
                break;
            }
            let _ = pump.poll(cx);
            if !pump.has_chunk() {
                break;
            }
        }
        Poll::Pending
    })
    .await
}

/// How many chunks of a request body one poll of its request may hand to
/// the service (the rest waits for the next poll, so that one upload
/// cannot hold the worker).
const PUMP_ROUNDS: usize = 64;

fn status_only(status: StatusCode) -> Response<()> {
    let mut r = Response::new(());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(0u64));
    r
}

/// Sends a response head with no body and finishes the stream.
async fn answer(send: &mut SendHalf, status: StatusCode) -> bool {
    send.send_response(status_only(status)).await.is_ok() && send.finish().await.is_ok()
}

/// The request's `content-length`: none, one value (repeated values that
/// agree count as one), or `Err` when it is not a number or its values
/// differ.
fn content_length(h: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut length = None;
    for v in h.get_all(http::header::CONTENT_LENGTH) {
        for part in v.to_str().map_err(|_| ())?.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            let n: u64 = part.parse().map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// One request through `svc`.
async fn serve<S, B>(mut svc: S, req: Request<()>, stream: Stream, link: Rc<Link>) -> Outcome
where
    S: Service<Request<RequestBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    let mut out = Outcome::default();
    let (mut send, recv) = stream.split();
    let length = match content_length(req.headers()) {
        Ok(n) => n,
        Err(()) => {
            // A malformed request (RFC 9114 4.1.2, RFC 9110 8.6): not
            // handed to the service.
            out.status = Some(400);
            out.cut = !answer(&mut send, StatusCode::BAD_REQUEST).await;
            return out;
        }
    };
    let shared = Arc::new(Mutex::new(BodyState::default()));
    let body = RequestBody {
        shared: shared.clone(),
        length,
        read: 0,
    };
    let mut pump = Pump {
        shared,
        recv: Some(recv),
        trailers: false,
        length,
        received: 0,
    };
    let req = req.map(|()| body);

    // tower's contract: ready, then call.
    let ready = with_pump(&mut pump, std::future::poll_fn(|cx| svc.poll_ready(cx))).await;
    let call = match ready {
        Ok(Ok(())) => catch_unwind(AssertUnwindSafe(|| svc.call(req))),
        Ok(Err(_)) => {
            out.status = Some(503);
            out.cut = !answer(&mut send, StatusCode::SERVICE_UNAVAILABLE).await;
            return out;
        }
        Err(_) => Err(Box::new(()) as Box<dyn std::any::Any + Send>),
    };
    let response = match call {
        Ok(fut) => with_pump(&mut pump, fut).await,
        Err(p) => Err(p),
    };
    let response = match response {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => {
            out.status = Some(500);
            out.cut = !answer(&mut send, StatusCode::INTERNAL_SERVER_ERROR).await;
            return out;
        }
        Err(_) => {
            out.panicked = true;
            out.status = Some(500);
            out.cut = !answer(&mut send, StatusCode::INTERNAL_SERVER_ERROR).await;
            return out;
        }
    };
    let (mut head, body) = response.into_parts();
    if !head.headers.contains_key(http::header::CONTENT_LENGTH) {
        if let Some(n) = body.size_hint().exact() {
            head.headers
                .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(n));
        }
    }
    out.status = Some(head.status.as_u16());
    let head = Response::from_parts(head, ());
    if with_pump(&mut pump, send.send_response(head))
        .await
        .map_or(true, |r| r.is_err())
    {
        out.cut = true;
        return out;
    }
    let mut body = std::pin::pin!(body);
    loop {
        let frame = with_pump(
            &mut pump,
            std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)),
        )
        .await;
        let sent = match frame {
            Err(_) => {
                out.panicked = true;
                send.stop_stream(::h3::error::Code::H3_INTERNAL_ERROR);
                out.cut = true;
                return out;
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                send.stop_stream(::h3::error::Code::H3_INTERNAL_ERROR);
                out.cut = true;
                return out;
            }
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut d) => {
                    let d = d.copy_to_bytes(d.remaining());
                    if d.is_empty() {
                        continue;
                    }
                    // Its bytes go to quinn-proto by reference.
                    link.lend(&d);
                    with_pump(&mut pump, send.send_data(d)).await
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(t) => {
                        // Trailers end the body: the stream is finished
                        // after them.
                        let r = with_pump(&mut pump, send.send_trailers(t)).await;
                        if !matches!(r, Ok(Ok(()))) {
                            out.cut = true;
                            return out;
                        }
                        break;
                    }
                    Err(_) => continue,
                },
            },
        };
        if !matches!(sent, Ok(Ok(()))) {
            out.cut = true;
            return out;
        }
    }
    if !matches!(with_pump(&mut pump, send.finish()).await, Ok(Ok(()))) {
        out.cut = true;
    }
    drain(&mut pump).await;
    out
}

/// The response is complete: what the body's reader still wants is moved;
/// a body nobody reads any more stops the stream (`H3_NO_ERROR`).
async fn drain(pump: &mut Pump) {
    std::future::poll_fn(|cx| pump.poll(cx)).await
}

/// A service answering on one connection: its facts added to each
/// request.
pub(crate) fn responder<S, B>(svc: S, info: ConnInfo, alpn: &[u8]) -> Rc<dyn ServeRequest>
where
    S: Service<Request<RequestBody>, Response = Response<B>> + Clone + 'static,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    B: Body + 'static,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    Rc::new(ServiceResponder {
        svc,
        info,
        alpn: Alpn(alpn.to_vec()),
    })
}
