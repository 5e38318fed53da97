//! Static files over HTTP/3: a [`Handler`] over [`crate::files::Root`].

use super::handler::{Body, Handler, Next, Reply};
use crate::files::{FileBody, Method, Root};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Serves the files beneath a [`Root`] for GET and HEAD, with a single
/// `Range`; 405 for any other method. The file is read chunk by chunk
/// with `pread` as the stream takes it.
#[derive(Debug, Clone)]
pub struct FilesHandler {
    root: Arc<Root>,
}

impl FilesHandler {
    /// Files beneath `root`.
    pub fn new(root: Arc<Root>) -> Self {
        FilesHandler { root }
    }
}

impl Handler for FilesHandler {
    fn handle(&self, req: &Request<()>, _now: Instant) -> Reply {
        let method = if req.method() == http::Method::GET {
            Method::Get
        } else if req.method() == http::Method::HEAD {
            Method::Head
        } else {
            let mut r = Reply::empty(StatusCode::METHOD_NOT_ALLOWED);
            r.head
                .headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        };
        // The target as the client sent it, percent-encoded.
        let target = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let range = req
            .headers()
            .get(http::header::RANGE)
            .map(HeaderValue::as_bytes);
        let answer = self.root.respond(method, target.as_bytes(), range);
        let mut head = Response::new(());
        *head.status_mut() =
            StatusCode::from_u16(answer.status.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in answer.headers() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                head.headers_mut().insert(HeaderName::from_static(name), v);
            }
        }
        let body = answer
            .body
            .map(|b| Box::new(FileChunks(b)) as Box<dyn Body>);
        Reply { head, body }
    }
}

/// A [`FileBody`] as a [`Body`].
struct FileChunks(FileBody);

impl Body for FileChunks {
    fn next(&mut self, _now: Instant, max: usize) -> io::Result<Next> {
        // At most `max` (and `files::CHUNK`, 64 KiB): the TCP listener
        // asks for 16 KiB and counts what it holds by length.
        Ok(match self.0.next_chunk_max(max)? {
            Some(b) => Next::Data(b),
            None => Next::End,
        })
    }
}
