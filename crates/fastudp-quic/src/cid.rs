//! The worker-ID connection-ID generator.

use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of every connection ID the server issues.
pub(crate) const CID_LEN: usize = 8;

/// Connection IDs whose first byte is the worker's index modulo the
/// number of workers; the rest is random.
pub(crate) struct WorkerCids {
    pub(crate) worker: u8,
    pub(crate) workers: u8,
    pub(crate) rng: ring::rand::SystemRandom,
    /// Should the system generator ever fail: IDs are then a keyed hash of
    /// the worker and a counter shared by all generators, as unlinkable.
    pub(crate) fallback: Arc<(ring::hmac::Key, std::sync::atomic::AtomicU64)>,
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        use ring::rand::SecureRandom;
        let mut b = [0u8; CID_LEN];
        if self.rng.fill(&mut b).is_err() {
            let (key, counter) = &*self.fallback;
            let mut m = [0u8; 9];
            m[0] = self.worker;
            m[1..].copy_from_slice(&counter.fetch_add(1, Relaxed).to_be_bytes());
            b.copy_from_slice(&ring::hmac::sign(key, &m).as_ref()[..CID_LEN]);
        }
        let n = u16::from(self.workers.max(1));
        let spread = (256 / n) as u8;
        b[0] = self
            .worker
            .wrapping_add(self.workers.wrapping_mul(b[0] % spread.max(1)));
        ConnectionId::new(&b)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// quinn-proto's HMAC key for stateless resets, from ring.
pub(crate) fn ring_hmac(k: &[u8]) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k)
}
