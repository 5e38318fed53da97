//! The embedder's admission hook: a decision on each client's first
//! datagram, before its handshake costs state
//! ([`crate::EngineConfig::admission`]).

use std::net::SocketAddr;
use std::sync::Arc;

/// What the engine knows of a client asking for a connection, when its
/// first datagram (an Initial) arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Admission {
    /// The client's address.
    pub remote: SocketAddr,
    /// The local address and port the client sent to: on a wildcard
    /// bind (`[::]:443`), the address it chose, as the kernel reports it
    /// (`IP_PKTINFO`); the listening address where the kernel says
    /// nothing.
    pub local: SocketAddr,
    /// Whether the client has proved its address: its Initial carries a
    /// token of this server's Retry. A client asked to retry comes back
    /// with one.
    pub validated: bool,
    /// The worker thread that decides.
    pub worker: usize,
}

/// What the admission hook decides for a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The handshake goes on.
    Accept,
    /// The connection is refused (quinn-proto's `CONNECTION_REFUSED`, a
    /// stateless reply), counted in [`crate::Counters::refused`] and
    /// [`crate::Counters::refused_admission`].
    Refuse,
    /// The client is sent a Retry (a stateless reply) and must come back
    /// with its token, proving its address. For a client whose address
    /// is validated already ([`Admission::validated`]), which may not be
    /// sent a second Retry (RFC 9000 17.2.5.2), it is [`Decision::Accept`].
    Retry,
}

/// The admission hook ([`crate::EngineConfig::admission`]): called on the
/// worker thread that owns the new connection, for each client's first
/// datagram that the server's own bounds (connection places, the memory
/// budget, handshakes from unvalidated addresses, draining) would
/// accept. It must be quick: it runs in the worker's loop, between the
/// packets of every connection of that worker. A panic in it refuses the
/// client and is counted in [`crate::Counters::app_panics`].
#[derive(Clone)]
pub struct AdmissionHook(Arc<dyn Fn(&Admission) -> Decision + Send + Sync>);

impl AdmissionHook {
    /// The hook `f`.
    pub fn new(f: impl Fn(&Admission) -> Decision + Send + Sync + 'static) -> Self {
        AdmissionHook(Arc::new(f))
    }

    /// What it decides for `a`; `None` when it panicked.
    pub(crate) fn decide(&self, a: &Admission) -> Option<Decision> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.0)(a))).ok()
    }
}

impl std::fmt::Debug for AdmissionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdmissionHook")
    }
}
