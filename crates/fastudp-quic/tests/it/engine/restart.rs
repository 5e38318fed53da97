//! A worker whose application panics unguarded is made again on its
//! socket: its place in the steered reuseport group black-holes nothing.

use super::*;
use std::sync::atomic::AtomicBool;

/// Panics at the first stream of the first connection; answers `ok` on
/// every stream after.
struct Panicky(Arc<AtomicBool>);

impl Application for Panicky {
    fn alpn(&self) -> Vec<Vec<u8>> {
        vec![b"panicky".to_vec()]
    }
    fn worker(&self, _: usize) -> Box<dyn WorkerApp> {
        Box::new(Panicky(self.0.clone()))
    }
}

impl WorkerApp for Panicky {
    fn accept(&mut self, _: &[u8], _: &ConnInfo) -> Option<Box<dyn ConnApp>> {
        Some(Box::new(PanickyConn(self.0.clone())))
    }
}

struct PanickyConn(Arc<AtomicBool>);

impl ConnApp for PanickyConn {
    fn on_event(&mut self, cx: &mut AppCx<'_>, ev: AppEvent) {
        if let AppEvent::Opened(id) = ev {
            if !self.0.swap(true, Relaxed) {
                panic!("the application's first stream panics, as the test asks");
            }
            let _ = cx.write(id, &mut [Bytes::from_static(b"ok")]);
            cx.finish(id, 2);
        }
    }
}

#[test]
fn a_worker_that_panics_is_made_again_and_serves() {
    let panicked = Arc::new(AtomicBool::new(false));
    // One worker: every connection is its.
    let (engine, cert) = start(Panicky(panicked.clone()), |c| c.workers(1));
    let addr = engine.local_addr();
    rt().block_on(async {
        let ep = client(cert.clone(), b"panicky", None);
        let first = connect(&ep, addr).await.unwrap();
        // Its stream meets the panic: no answer (the connection is lost).
        let lost = tokio::time::timeout(Duration::from_secs(3), fetch(&first, b"?")).await;
        assert!(
            !matches!(lost, Ok(Ok(_))),
            "an answer from a panicking worker: {lost:?}"
        );
        assert!(panicked.load(Relaxed));
        // A new connection is served by the worker made again.
        let ep2 = client(cert, b"panicky", None);
        let second = connect(&ep2, addr).await.unwrap();
        let body = tokio::time::timeout(Duration::from_secs(5), fetch(&second, b"?"))
            .await
            .expect("the worker serves again")
            .unwrap();
        assert_eq!(body, b"ok");
    });
    let c = engine.counters();
    assert_eq!(c.worker_restarts.load(Relaxed), 1);
    assert!(!engine.failed());
    eventually("the lost connection's place given back", || {
        c.connections.load(Relaxed) <= 1
    });
    stop(engine);
}
