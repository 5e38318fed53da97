//! Each worker's tokio runtime, for the futures of its requests.
//!
//! The worker owns a current-thread runtime. The requests' futures are
//! polled on the worker's thread, inside the runtime (`Handle::enter`), so
//! that they can use tokio's timers, channels and I/O; quinn-proto and
//! the engine stay on the worker, outside it. The runtime's driver (its
//! epoll and timer wheel) turns on a thread of its own beside the worker,
//! parked until a timer or an I/O event is due: when one fires, the
//! waker it wakes is a connection's, which ends the worker's wait at once
//! through the worker's eventfd ([`crate::app::AppCx::waker`]). So the
//! engine's own wait keeps its precision (a `ppoll` with nanosecond
//! timeouts) and the turns of a worker that serves no async request cost
//! nothing more. A task spawned with `tokio::spawn` from a request runs
//! on the driver's thread.

use std::thread::JoinHandle;

/// A worker's runtime: its handle, and the thread that turns its driver
/// until the worker lets go of it.
pub(crate) struct Executor {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Executor {
    /// A runtime for worker `worker`, or why none could be made.
    pub(crate) fn new(worker: usize) -> std::io::Result<Executor> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("fastudp-rt-{worker}"))
            .spawn(move || {
                rt.block_on(async move {
                    let _ = stopped.await;
                });
            })?;
        Ok(Executor {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The runtime's handle.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::{Duration, Instant};

    struct Flag(AtomicBool, std::thread::Thread);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
            self.1.unpark();
        }
    }

    /// A tokio timer polled on this thread, inside the runtime, fires
    /// through the driver's thread and wakes this one.
    #[test]
    fn a_timer_polled_here_is_fired_by_the_driver() {
        let ex = Executor::new(0).unwrap();
        let flag = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        let mut sleep = {
            let _g = ex.handle().enter();
            Box::pin(tokio::time::sleep(Duration::from_millis(20)))
        };
        {
            let _g = ex.handle().enter();
            assert!(sleep.as_mut().poll(&mut cx).is_pending());
        }
        while !flag.0.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(10), "never woken");
            std::thread::park_timeout(Duration::from_millis(100));
        }
        let _g = ex.handle().enter();
        assert_eq!(sleep.as_mut().poll(&mut cx), Poll::Ready(()));
        assert!(start.elapsed() >= Duration::from_millis(20));
    }
}
