//! The worker-ID connection-ID generator, with or without QUIC-LB
//! ([`crate::lb`]).

use crate::lb::{QuicLb, MAX_CID_LEN};
use quinn_proto::{ConnectionId, ConnectionIdGenerator};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of every connection ID the server issues without QUIC-LB.
pub(crate) const CID_LEN: usize = 8;

/// Connection IDs with a byte that is the worker's index modulo the
/// number of workers: the first, or with QUIC-LB the nonce's first
/// (after the first octet and the server ID); the rest is random.
pub(crate) struct WorkerCids {
    pub(crate) worker: u8,
    pub(crate) workers: u8,
    pub(crate) rng: ring::rand::SystemRandom,
    /// Should the system generator ever fail: IDs are then a keyed hash of
    /// the worker and a counter shared by all generators, as unlinkable.
    pub(crate) fallback: Arc<(ring::hmac::Key, std::sync::atomic::AtomicU64)>,
    /// The fleet's QUIC-LB configuration and this server's ID in it.
    pub(crate) lb: Option<Arc<QuicLb>>,
}

impl WorkerCids {
    /// The byte of the worker: its index plus a random multiple of the
    /// number of workers (so that it says nothing more than the worker).
    fn worker_byte(&self, random: u8) -> u8 {
        let n = u16::from(self.workers.max(1));
        let spread = (256 / n) as u8;
        self.worker
            .wrapping_add(self.workers.wrapping_mul(random % spread.max(1)))
    }
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        use ring::rand::SecureRandom;
        let mut b = [0u8; MAX_CID_LEN];
        if self.rng.fill(&mut b).is_err() {
            let (key, counter) = &*self.fallback;
            let mut m = [0u8; 9];
            m[0] = self.worker;
            m[1..].copy_from_slice(&counter.fetch_add(1, Relaxed).to_be_bytes());
            b.copy_from_slice(&ring::hmac::sign(key, &m).as_ref()[..MAX_CID_LEN]);
        }
        let w = self.worker_byte(b[0]);
        match &self.lb {
            None => {
                b[0] = w;
                ConnectionId::new(&b[..CID_LEN])
            }
            Some(lb) => {
                let mut cid = [0u8; MAX_CID_LEN];
                let len = lb.config().cid_len();
                lb.write_cid(w, &b[1..], &mut cid[..len]);
                ConnectionId::new(&cid[..len])
            }
        }
    }

    fn cid_len(&self) -> usize {
        self.lb.as_ref().map_or(CID_LEN, |lb| lb.config().cid_len())
    }

    /// With QUIC-LB: an ID whose config rotation bits say "unroutable"
    /// is none this fleet issued, and gets no stateless reset. Any other
    /// (this server's or another server's of the fleet) may.
    fn validate(&self, cid: &ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        match (&self.lb, cid.first()) {
            (Some(_), Some(b)) if b >> 5 == crate::lb::UNROUTABLE => Err(quinn_proto::InvalidCid),
            _ => Ok(()),
        }
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// quinn-proto's HMAC key for stateless resets, from ring.
pub(crate) fn ring_hmac(k: &[u8]) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::{LbConfig, ServerId};

    fn cids(worker: u8, workers: u8, lb: Option<QuicLb>) -> WorkerCids {
        WorkerCids {
            worker,
            workers,
            rng: ring::rand::SystemRandom::new(),
            fallback: Arc::new((ring_hmac(&[1; 32]), std::sync::atomic::AtomicU64::new(0))),
            lb: lb.map(Arc::new),
        }
    }

    /// Without QUIC-LB: 8 bytes, the first steering to the worker.
    #[test]
    fn worker_byte_first() {
        let mut g = cids(2, 3, None);
        assert_eq!(g.cid_len(), 8);
        for _ in 0..200 {
            let c = g.generate_cid();
            assert_eq!(c.len(), 8);
            let short = [&[0x40][..], &c[..]].concat();
            assert_eq!(fastudp_io::Steering::QuicCid.owner(&short, 3), Some(2));
        }
    }

    /// With QUIC-LB: the first octet and server ID fixed, the worker's
    /// byte in the nonce, which the engine's steering reads; the rest
    /// random (no two IDs alike).
    #[test]
    fn quic_lb_ids_route_across_and_within_hosts() {
        let c = LbConfig::new(3, 2, 6).unwrap();
        let lb = QuicLb::new(c, ServerId::parse_hex("beef").unwrap()).unwrap();
        let mut g = cids(1, 4, Some(lb));
        assert_eq!(g.cid_len(), 9);
        let steering = fastudp_io::Steering::QuicCidAt {
            index: c.worker_byte() as u8,
        };
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let cid = g.generate_cid();
            assert_eq!(cid.len(), 9);
            assert_eq!(cid[0], 0b011_01000);
            assert_eq!(c.server_id(&cid), Some(&[0xBE, 0xEF][..]));
            let short = [&[0x41][..], &cid[..]].concat();
            assert_eq!(steering.owner(&short, 4), Some(1));
            let long = [&[0xE0, 0, 0, 0, 1, 9][..], &cid[..]].concat();
            assert_eq!(steering.owner(&long, 4), Some(1));
            assert!(seen.insert(cid[3..].to_vec()), "a nonce repeated");
            assert!(g.validate(&cid).is_ok());
        }
        assert!(g
            .validate(&ConnectionId::new(&[0xE8, 0, 0, 0, 0, 0, 0, 0, 0]))
            .is_err());
    }
}
