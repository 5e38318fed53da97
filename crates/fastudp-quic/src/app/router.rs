//! One port, several applications: the ALPN the client and server agree
//! on picks the application.

use super::{Application, CloseCodes, ConnApp, ConnInfo, WorkerApp};
use std::sync::Arc;

/// An [`Application`] that hands each connection to the application
/// registered for its ALPN, so that several protocols (`h3`,
/// `hq-interop`) share one port.
///
/// ```
/// use fastudp_quic::app::{hq::HqApp, Router};
/// let router = Router::new().with(b"hq-interop", HqApp::default());
/// # use fastudp_quic::app::Application;
/// assert_eq!(router.alpn(), vec![b"hq-interop".to_vec()]);
/// ```
#[derive(Clone, Default)]
pub struct Router {
    routes: Vec<(Vec<u8>, Arc<dyn Application>)>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.routes
                    .iter()
                    .map(|(a, _)| String::from_utf8_lossy(a).into_owned()),
            )
            .finish()
    }
}

impl Router {
    /// No routes: every connection refused.
    pub fn new() -> Self {
        Router::default()
    }

    /// Routes `alpn` to `app` (offered after the routes added before).
    /// A second route for the same ALPN replaces the first.
    pub fn with(self, alpn: &[u8], app: impl Application) -> Self {
        self.with_shared(alpn, Arc::new(app))
    }

    /// [`Router::with`], for an application already shared.
    pub fn with_shared(mut self, alpn: &[u8], app: Arc<dyn Application>) -> Self {
        match self.routes.iter_mut().find(|r| r.0 == alpn) {
            Some(r) => r.1 = app,
            None => self.routes.push((alpn.to_vec(), app)),
        }
        self
    }
}

impl Application for Router {
    fn alpn(&self) -> Vec<Vec<u8>> {
        self.routes.iter().map(|r| r.0.clone()).collect()
    }

    fn worker(&self, worker: usize) -> Box<dyn WorkerApp> {
        Box::new(RouterWorker {
            routes: self
                .routes
                .iter()
                .map(|(a, app)| (a.clone(), app.worker(worker)))
                .collect(),
        })
    }

    /// The codes of the application routed for `alpn` (the default's for
    /// a protocol without one).
    fn close_codes(&self, alpn: &[u8]) -> CloseCodes {
        match self.routes.iter().find(|r| r.0 == alpn) {
            Some((_, app)) => app.close_codes(alpn),
            None => CloseCodes::HTTP3,
        }
    }
}

/// A router's part on one worker.
struct RouterWorker {
    routes: Vec<(Vec<u8>, Box<dyn WorkerApp>)>,
}

impl WorkerApp for RouterWorker {
    fn accept(&mut self, alpn: &[u8], info: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        let (_, app) = self.routes.iter_mut().find(|r| r.0 == alpn)?;
        app.accept(alpn, info)
    }
}
