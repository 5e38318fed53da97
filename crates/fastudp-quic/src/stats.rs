//! The counters the engine keeps (and the baseline servers of the
//! `fastudp` command keep too, so that one report fits all).

use std::sync::atomic::{AtomicU64, Ordering};

/// The most workers an engine runs ([`crate::EngineConfig::workers`]), and
/// so the shares of a [`PerWorker`] counter.
const MAX_WORKERS: usize = 256;

/// One worker's share of a [`PerWorker`] counter, on a cache line of its
/// own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Share(AtomicU64);

/// A counter that every worker bumps for each datagram: one share per
/// worker, each on a cache line of its own, so that workers counting at
/// once do not pass one line between their cores; read as the sum of the
/// shares. [`PerWorker::load`] reads it as [`AtomicU64::load`] reads a
/// plain counter (the sum is of shares read one after the other, as
/// [`Stats`] says of its counters).
pub struct PerWorker {
    shares: Box<[Share]>,
}

impl std::fmt::Debug for PerWorker {
    /// The sum, as a plain counter prints (not the 256 shares).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.load(Ordering::Relaxed))
    }
}

impl Default for PerWorker {
    fn default() -> Self {
        PerWorker {
            shares: (0..MAX_WORKERS).map(|_| Share::default()).collect(),
        }
    }
}

impl PerWorker {
    /// Adds `n` to `worker`'s share (a worker index past the last share
    /// wraps, so every count is kept).
    pub fn add(&self, worker: usize, n: u64) {
        self.shares[worker % self.shares.len()]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The sum of every worker's share.
    pub fn load(&self, order: Ordering) -> u64 {
        self.shares
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(order)))
    }

    /// `worker`'s own share.
    pub fn share(&self, worker: usize) -> u64 {
        self.shares[worker % self.shares.len()]
            .0
            .load(Ordering::Relaxed)
    }
}

/// Counters shared by a server's threads.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections accepted so far.
    pub accepted: AtomicU64,
    /// Connections accepted whose handshake is not done, server-wide.
    pub half_open: AtomicU64,
    /// Connections refused (--max-connections) so far.
    pub refused: AtomicU64,
    /// Connections refused because the memory budget was at its hard
    /// limit and no idle connection could be evicted (also counted in
    /// `refused`).
    pub refused_memory: AtomicU64,
    /// Connections closed to make room for a newcomer when the server was
    /// full: the oldest idle or stalled connection of the address holding
    /// the most, or, when none is, the oldest connection of an address
    /// holding 8 times what the newcomer holds (docs/SECURITY.md,
    /// "Fairness when full").
    pub evicted: AtomicU64,
    /// Connections closed because a response made no progress for
    /// [`crate::limits::STALL_TIMEOUT`].
    pub stalled_cut: AtomicU64,
    /// Retry packets sent.
    pub retries: AtomicU64,
    /// Response bytes delivered, counted per response when it is whole:
    /// QUIC stacks when the client has acknowledged its last byte,
    /// TLS over TCP when the kernel has taken it all and the connection
    /// shut down cleanly.
    pub app_bytes: AtomicU64,
    /// UDP payload bytes sent.
    pub wire_bytes: AtomicU64,
    /// Datagrams sent.
    pub datagrams_sent: AtomicU64,
    /// Datagrams received (each worker counts its own on a cache line of
    /// its own: [`PerWorker`]).
    pub datagrams_recv: PerWorker,
    /// Send syscalls.
    pub send_calls: AtomicU64,
    /// Receive syscalls.
    pub recv_calls: AtomicU64,
    /// Packets declared lost (and retransmitted) by the connections.
    pub lost_packets: AtomicU64,
    /// Datagrams a worker handed to the worker owning their connection
    /// (per worker: [`PerWorker`]).
    pub forwarded: PerWorker,
    /// Datagrams quinn-proto could not use (garbage, unknown connection;
    /// per worker: [`PerWorker`]).
    pub dropped: PerWorker,
    /// Datagrams for another worker dropped: its forwarding ring was full
    /// (or the datagram longer than a slot).
    pub forward_dropped: AtomicU64,
    /// Stateless replies dropped: a worker's queue of them was full.
    pub stateless_dropped: AtomicU64,
    /// Requests reset for not being whole within --request-timeout.
    pub request_timeouts: AtomicU64,
    /// HTTP/3 requests answered (their head read and a response begun).
    pub h3_requests: AtomicU64,
    /// HTTP/3 requests refused before an answer: a malformed or oversized
    /// header section (431), a request stream over its byte cap, a reset.
    pub h3_refused: AtomicU64,
    /// Panics in application code that were caught: an HTTP/3 request
    /// answered 500 or reset with `H3_INTERNAL_ERROR`, or its connection
    /// closed; or a client refused because the admission hook panicked
    /// ([`crate::EngineConfig::admission`]). The worker went on.
    pub app_panics: AtomicU64,
    /// Workers made again after a panic in their loop (application code
    /// that no guard caught): their connections were lost, and their
    /// socket served on.
    pub worker_restarts: AtomicU64,
    /// Datagrams the host's own queue (a full qdisc, `ENOBUFS`) dropped
    /// instead of sending; QUIC's loss recovery sends their frames again.
    /// Not counted in `datagrams_sent`; their bytes are in `wire_bytes`,
    /// which counts what the kernel was handed.
    pub dropped_locally: AtomicU64,
    /// Datagrams the kernel dropped because a worker's receive socket
    /// buffer was full (`fastudp_io::Stats::kernel_drops`: `SO_RXQ_OVFL`, or
    /// `SO_MEMINFO`): the worker did not read fast enough, under a flood
    /// say. QUIC's loss recovery resends what was a connection's.
    pub rx_overflow: AtomicU64,
    /// Send errors.
    pub send_errors: AtomicU64,
    /// Receive errors (ICMP errors reported on a receive, say).
    pub recv_errors: AtomicU64,
    /// Datagrams read in place in an io_uring ring's provided buffers
    /// ([`crate::EngineConfig::uring`]); also counted in `datagrams_recv`
    /// (per worker: [`PerWorker`]).
    pub recv_in_place: PerWorker,
    /// Workers asked to receive with io_uring that receive with syscalls
    /// instead: the kernel refused the ring when the socket was set up,
    /// or its multishot receive later (the reason:
    /// [`crate::Engine::uring_error`]).
    pub uring_fallbacks: AtomicU64,
    /// Times a worker's ring had no free provided buffer (`ENOBUFS`): the
    /// datagrams waited in the socket's buffer and were received after
    /// the receive was armed again; nothing was lost.
    pub uring_exhausted: AtomicU64,
    /// Connections refused because their client's address held its share
    /// of the places already (`max_connections_per_ip`; also counted in
    /// `refused`).
    pub refused_per_ip: AtomicU64,
    /// Connections refused because no application speaks the protocol
    /// their client asked for (ALPN; also counted in `refused`).
    pub refused_protocol: AtomicU64,
    /// Connections the embedder's admission hook refused
    /// ([`crate::EngineConfig::admission`]), or refused because it
    /// panicked (also counted in `refused`).
    pub refused_admission: AtomicU64,
    /// Connections refused because the server was draining
    /// ([`crate::Engine::drain`]) or stopping (also counted in `refused`).
    pub refused_draining: AtomicU64,
    /// Connections closed by a drain once their requests were done and
    /// acknowledged ([`crate::Engine::drain`]).
    pub drained: AtomicU64,
    /// QUIC DATAGRAM frames the applications read
    /// ([`crate::app::AppCx::recv_datagram`]).
    pub quic_datagrams_read: AtomicU64,
    /// QUIC DATAGRAM frames the applications queued to send
    /// ([`crate::app::AppCx::send_datagram`]).
    pub quic_datagrams_queued: AtomicU64,
    /// QUIC DATAGRAM frames an application could not queue: the
    /// connection's send buffer ([`crate::Transport::datagram_send_buffer`])
    /// was full ([`crate::app::DatagramError::Blocked`]).
    pub quic_datagrams_blocked: AtomicU64,
    /// QUIC DATAGRAM frames received that no application read: pushed out
    /// of the connection's full receive buffer (the oldest go first), or
    /// left unread when the connection ended. A frame pushed out is
    /// counted by the end of the drive of its connection that received
    /// the frame pushing it out; one left unread, when the connection
    /// ends.
    pub quic_datagrams_dropped: AtomicU64,
    /// HTTP/3 responses begun, by status class: index 0 counts 1xx, 1
    /// 2xx, 2 3xx, 3 4xx, 4 5xx (a status outside 100-599 is not counted).
    /// Requests h3 refused before an answer are in `h3_refused`.
    pub h3_responses: [AtomicU64; 5],
}

/// The engine's counters at one moment ([`crate::Engine::stats`],
/// [`crate::Monitor::stats`], [`Counters::snapshot`]): plain numbers, each
/// as [`Counters`] documents it. Each counter is read on its own (the
/// workers go on counting meanwhile), so two of them may be a few events
/// apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections open now.
    pub connections: u64,
    /// Connections accepted so far.
    pub accepted: u64,
    /// Connections accepted whose handshake is not done, server-wide.
    pub half_open: u64,
    /// Connections refused (--max-connections) so far.
    pub refused: u64,
    /// Connections refused because the memory budget was at its hard
    /// limit and no idle connection could be evicted (also counted in
    /// `refused`).
    pub refused_memory: u64,
    /// Connections closed to make room for a newcomer when the server was
    /// full: the oldest idle or stalled connection of the address holding
    /// the most, or, when none is, the oldest connection of an address
    /// holding 8 times what the newcomer holds (docs/SECURITY.md,
    /// "Fairness when full").
    pub evicted: u64,
    /// Connections closed because a response made no progress for
    /// [`crate::limits::STALL_TIMEOUT`].
    pub stalled_cut: u64,
    /// Retry packets sent.
    pub retries: u64,
    /// Response bytes delivered, counted per response when it is whole:
    /// QUIC stacks when the client has acknowledged its last byte,
    /// TLS over TCP when the kernel has taken it all and the connection
    /// shut down cleanly.
    pub app_bytes: u64,
    /// UDP payload bytes sent.
    pub wire_bytes: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams received.
    pub datagrams_recv: u64,
    /// Send syscalls.
    pub send_calls: u64,
    /// Receive syscalls.
    pub recv_calls: u64,
    /// Packets declared lost (and retransmitted) by the connections.
    pub lost_packets: u64,
    /// Datagrams a worker handed to the worker owning their connection.
    pub forwarded: u64,
    /// Datagrams quinn-proto could not use (garbage, unknown connection).
    pub dropped: u64,
    /// Datagrams for another worker dropped: its forwarding ring was full
    /// (or the datagram longer than a slot).
    pub forward_dropped: u64,
    /// Stateless replies dropped: a worker's queue of them was full.
    pub stateless_dropped: u64,
    /// Requests reset for not being whole within --request-timeout.
    pub request_timeouts: u64,
    /// HTTP/3 requests answered (their head read and a response begun).
    pub h3_requests: u64,
    /// HTTP/3 requests refused before an answer: a malformed or oversized
    /// header section (431), a request stream over its byte cap, a reset.
    pub h3_refused: u64,
    /// Panics in application code that were caught: an HTTP/3 request
    /// answered 500 or reset with `H3_INTERNAL_ERROR`, or its connection
    /// closed; or a client refused because the admission hook panicked
    /// ([`crate::EngineConfig::admission`]). The worker went on.
    pub app_panics: u64,
    /// Workers made again after a panic in their loop (application code
    /// that no guard caught): their connections were lost, and their
    /// socket served on.
    pub worker_restarts: u64,
    /// Datagrams the host's own queue (a full qdisc, `ENOBUFS`) dropped
    /// instead of sending; QUIC's loss recovery sends their frames again.
    /// Not counted in `datagrams_sent`; their bytes are in `wire_bytes`,
    /// which counts what the kernel was handed.
    pub dropped_locally: u64,
    /// Datagrams the kernel dropped because a worker's receive socket
    /// buffer was full (`fastudp_io::Stats::kernel_drops`: `SO_RXQ_OVFL`, or
    /// `SO_MEMINFO`): the worker did not read fast enough, under a flood
    /// say. QUIC's loss recovery resends what was a connection's.
    pub rx_overflow: u64,
    /// Send errors.
    pub send_errors: u64,
    /// Receive errors (ICMP errors reported on a receive, say).
    pub recv_errors: u64,
    /// Datagrams read in place in an io_uring ring's provided buffers
    /// ([`crate::EngineConfig::uring`]); also counted in `datagrams_recv`.
    pub recv_in_place: u64,
    /// Workers asked to receive with io_uring that receive with syscalls
    /// instead: the kernel refused the ring when the socket was set up,
    /// or its multishot receive later (the reason:
    /// [`crate::Engine::uring_error`]).
    pub uring_fallbacks: u64,
    /// Times a worker's ring had no free provided buffer (`ENOBUFS`): the
    /// datagrams waited in the socket's buffer and were received after
    /// the receive was armed again; nothing was lost.
    pub uring_exhausted: u64,
    /// Connections refused because their client's address held its share
    /// of the places already (`max_connections_per_ip`; also counted in
    /// `refused`).
    pub refused_per_ip: u64,
    /// Connections refused because no application speaks the protocol
    /// their client asked for (ALPN; also counted in `refused`).
    pub refused_protocol: u64,
    /// Connections the embedder's admission hook refused
    /// ([`crate::EngineConfig::admission`]), or refused because it
    /// panicked (also counted in `refused`).
    pub refused_admission: u64,
    /// Connections refused because the server was draining
    /// ([`crate::Engine::drain`]) or stopping (also counted in `refused`).
    pub refused_draining: u64,
    /// Connections closed by a drain once their requests were done and
    /// acknowledged ([`crate::Engine::drain`]).
    pub drained: u64,
    /// QUIC DATAGRAM frames the applications read
    /// ([`crate::app::AppCx::recv_datagram`]).
    pub quic_datagrams_read: u64,
    /// QUIC DATAGRAM frames the applications queued to send
    /// ([`crate::app::AppCx::send_datagram`]).
    pub quic_datagrams_queued: u64,
    /// QUIC DATAGRAM frames an application could not queue: the
    /// connection's send buffer ([`crate::Transport::datagram_send_buffer`])
    /// was full ([`crate::app::DatagramError::Blocked`]).
    pub quic_datagrams_blocked: u64,
    /// QUIC DATAGRAM frames received that no application read: pushed out
    /// of the connection's full receive buffer (the oldest go first), or
    /// left unread when the connection ended. A frame pushed out is
    /// counted by the end of the drive of its connection that received
    /// the frame pushing it out; one left unread, when the connection
    /// ends.
    pub quic_datagrams_dropped: u64,
    /// HTTP/3 responses begun, by status class: index 0 counts 1xx, 1
    /// 2xx, 2 3xx, 3 4xx, 4 5xx (a status outside 100-599 is not counted).
    /// Requests h3 refused before an answer are in `h3_refused`.
    pub h3_responses: [u64; 5],
}

impl Counters {
    /// The counters now, as plain numbers.
    pub fn snapshot(&self) -> Stats {
        use std::sync::atomic::Ordering::Relaxed;
        Stats {
            connections: self.connections.load(Relaxed),
            accepted: self.accepted.load(Relaxed),
            half_open: self.half_open.load(Relaxed),
            refused: self.refused.load(Relaxed),
            refused_memory: self.refused_memory.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
            stalled_cut: self.stalled_cut.load(Relaxed),
            retries: self.retries.load(Relaxed),
            app_bytes: self.app_bytes.load(Relaxed),
            wire_bytes: self.wire_bytes.load(Relaxed),
            datagrams_sent: self.datagrams_sent.load(Relaxed),
            datagrams_recv: self.datagrams_recv.load(Relaxed),
            send_calls: self.send_calls.load(Relaxed),
            recv_calls: self.recv_calls.load(Relaxed),
            lost_packets: self.lost_packets.load(Relaxed),
            forwarded: self.forwarded.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            forward_dropped: self.forward_dropped.load(Relaxed),
            stateless_dropped: self.stateless_dropped.load(Relaxed),
            request_timeouts: self.request_timeouts.load(Relaxed),
            h3_requests: self.h3_requests.load(Relaxed),
            h3_refused: self.h3_refused.load(Relaxed),
            app_panics: self.app_panics.load(Relaxed),
            worker_restarts: self.worker_restarts.load(Relaxed),
            dropped_locally: self.dropped_locally.load(Relaxed),
            rx_overflow: self.rx_overflow.load(Relaxed),
            send_errors: self.send_errors.load(Relaxed),
            recv_errors: self.recv_errors.load(Relaxed),
            recv_in_place: self.recv_in_place.load(Relaxed),
            uring_fallbacks: self.uring_fallbacks.load(Relaxed),
            uring_exhausted: self.uring_exhausted.load(Relaxed),
            refused_per_ip: self.refused_per_ip.load(Relaxed),
            refused_protocol: self.refused_protocol.load(Relaxed),
            refused_admission: self.refused_admission.load(Relaxed),
            refused_draining: self.refused_draining.load(Relaxed),
            drained: self.drained.load(Relaxed),
            quic_datagrams_read: self.quic_datagrams_read.load(Relaxed),
            quic_datagrams_queued: self.quic_datagrams_queued.load(Relaxed),
            quic_datagrams_blocked: self.quic_datagrams_blocked.load(Relaxed),
            quic_datagrams_dropped: self.quic_datagrams_dropped.load(Relaxed),
            h3_responses: std::array::from_fn(|i| self.h3_responses[i].load(Relaxed)),
        }
    }
}

/// The index of `status`'s class in [`Counters::h3_responses`] (0 for
/// 1xx to 4 for 5xx), or `None` outside 100-599.
pub fn status_class(status: u16) -> Option<usize> {
    match status {
        100..=599 => Some(usize::from(status / 100 - 1)),
        _ => None,
    }
}

/// What one worker counts of its own, published by the worker about
/// every 100 ms ([`crate::Engine::worker_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerStats {
    /// Connections in the worker's table (open or closing).
    pub connections: u64,
    /// Datagrams its send socket sent.
    pub datagrams_sent: u64,
    /// Datagrams its receive socket received.
    pub datagrams_received: u64,
    /// Its send syscalls.
    pub send_calls: u64,
    /// Its receive syscalls.
    pub recv_calls: u64,
    /// Datagrams the kernel dropped because its receive buffer was full.
    pub rx_overflow: u64,
    /// Times the worker was made again after a panic in its loop.
    pub restarts: u64,
}

/// One worker's published [`WorkerStats`], on a cache line of its own so
/// that workers publishing at once do not share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct WorkerGauges {
    pub(crate) connections: AtomicU64,
    pub(crate) datagrams_sent: AtomicU64,
    pub(crate) datagrams_received: AtomicU64,
    pub(crate) send_calls: AtomicU64,
    pub(crate) recv_calls: AtomicU64,
    pub(crate) rx_overflow: AtomicU64,
    pub(crate) restarts: AtomicU64,
}

impl WorkerGauges {
    /// The figures now.
    pub(crate) fn snapshot(&self) -> WorkerStats {
        use std::sync::atomic::Ordering::Relaxed;
        WorkerStats {
            connections: self.connections.load(Relaxed),
            datagrams_sent: self.datagrams_sent.load(Relaxed),
            datagrams_received: self.datagrams_received.load(Relaxed),
            send_calls: self.send_calls.load(Relaxed),
            recv_calls: self.recv_calls.load(Relaxed),
            rx_overflow: self.rx_overflow.load(Relaxed),
            restarts: self.restarts.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    /// Each counter lands in its own field of the snapshot.
    #[test]
    fn a_snapshot_copies_every_counter() {
        let c = Counters::default();
        let mut n = 0u64;
        let mut next = || {
            n += 1;
            n
        };
        c.connections.store(next(), Relaxed);
        c.accepted.store(next(), Relaxed);
        c.half_open.store(next(), Relaxed);
        c.refused.store(next(), Relaxed);
        c.refused_memory.store(next(), Relaxed);
        c.evicted.store(next(), Relaxed);
        c.stalled_cut.store(next(), Relaxed);
        c.retries.store(next(), Relaxed);
        c.app_bytes.store(next(), Relaxed);
        c.wire_bytes.store(next(), Relaxed);
        c.datagrams_sent.store(next(), Relaxed);
        c.datagrams_recv.add(1, next());
        c.send_calls.store(next(), Relaxed);
        c.recv_calls.store(next(), Relaxed);
        c.lost_packets.store(next(), Relaxed);
        c.forwarded.add(1, next());
        c.dropped.add(258, next());
        c.forward_dropped.store(next(), Relaxed);
        c.stateless_dropped.store(next(), Relaxed);
        c.request_timeouts.store(next(), Relaxed);
        c.h3_requests.store(next(), Relaxed);
        c.h3_refused.store(next(), Relaxed);
        c.app_panics.store(next(), Relaxed);
        c.worker_restarts.store(next(), Relaxed);
        c.dropped_locally.store(next(), Relaxed);
        c.rx_overflow.store(next(), Relaxed);
        c.send_errors.store(next(), Relaxed);
        c.recv_errors.store(next(), Relaxed);
        c.recv_in_place.add(1, next());
        c.uring_fallbacks.store(next(), Relaxed);
        c.uring_exhausted.store(next(), Relaxed);
        c.refused_per_ip.store(next(), Relaxed);
        c.refused_protocol.store(next(), Relaxed);
        c.refused_admission.store(next(), Relaxed);
        c.refused_draining.store(next(), Relaxed);
        c.drained.store(next(), Relaxed);
        c.quic_datagrams_read.store(next(), Relaxed);
        c.quic_datagrams_queued.store(next(), Relaxed);
        c.quic_datagrams_blocked.store(next(), Relaxed);
        c.quic_datagrams_dropped.store(next(), Relaxed);
        for a in &c.h3_responses {
            a.store(next(), Relaxed);
        }
        let s = c.snapshot();
        let mut n = 0u64;
        let mut next = || {
            n += 1;
            n
        };
        assert_eq!(s.connections, next(), "connections");
        assert_eq!(s.accepted, next(), "accepted");
        assert_eq!(s.half_open, next(), "half_open");
        assert_eq!(s.refused, next(), "refused");
        assert_eq!(s.refused_memory, next(), "refused_memory");
        assert_eq!(s.evicted, next(), "evicted");
        assert_eq!(s.stalled_cut, next(), "stalled_cut");
        assert_eq!(s.retries, next(), "retries");
        assert_eq!(s.app_bytes, next(), "app_bytes");
        assert_eq!(s.wire_bytes, next(), "wire_bytes");
        assert_eq!(s.datagrams_sent, next(), "datagrams_sent");
        assert_eq!(s.datagrams_recv, next(), "datagrams_recv");
        assert_eq!(s.send_calls, next(), "send_calls");
        assert_eq!(s.recv_calls, next(), "recv_calls");
        assert_eq!(s.lost_packets, next(), "lost_packets");
        assert_eq!(s.forwarded, next(), "forwarded");
        assert_eq!(s.dropped, next(), "dropped");
        assert_eq!(s.forward_dropped, next(), "forward_dropped");
        assert_eq!(s.stateless_dropped, next(), "stateless_dropped");
        assert_eq!(s.request_timeouts, next(), "request_timeouts");
        assert_eq!(s.h3_requests, next(), "h3_requests");
        assert_eq!(s.h3_refused, next(), "h3_refused");
        assert_eq!(s.app_panics, next(), "app_panics");
        assert_eq!(s.worker_restarts, next(), "worker_restarts");
        assert_eq!(s.dropped_locally, next(), "dropped_locally");
        assert_eq!(s.rx_overflow, next(), "rx_overflow");
        assert_eq!(s.send_errors, next(), "send_errors");
        assert_eq!(s.recv_errors, next(), "recv_errors");
        assert_eq!(s.recv_in_place, next(), "recv_in_place");
        assert_eq!(s.uring_fallbacks, next(), "uring_fallbacks");
        assert_eq!(s.uring_exhausted, next(), "uring_exhausted");
        assert_eq!(s.refused_per_ip, next(), "refused_per_ip");
        assert_eq!(s.refused_protocol, next(), "refused_protocol");
        assert_eq!(s.refused_admission, next(), "refused_admission");
        assert_eq!(s.refused_draining, next(), "refused_draining");
        assert_eq!(s.drained, next(), "drained");
        assert_eq!(s.quic_datagrams_read, next());
        assert_eq!(s.quic_datagrams_queued, next());
        assert_eq!(s.quic_datagrams_blocked, next());
        assert_eq!(s.quic_datagrams_dropped, next());
        for v in s.h3_responses {
            assert_eq!(v, next());
        }
        assert_eq!(Counters::default().snapshot(), Stats::default());
    }

    /// Two workers counting at once, each into its own share: the sum is
    /// every count, in the counter and in the snapshot, and each share is
    /// what its worker counted; a worker index past the shares wraps and
    /// still counts.
    #[test]
    fn per_worker_counters_sum_their_shares() {
        let c = std::sync::Arc::new(Counters::default());
        let n = 100_000u64;
        let threads: Vec<_> = (0..2)
            .map(|w| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..n {
                        c.datagrams_recv.add(w, 1);
                    }
                    c.forwarded.add(w, 10 + w as u64);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.datagrams_recv.share(0), n);
        assert_eq!(c.datagrams_recv.share(1), n);
        assert_eq!(c.datagrams_recv.load(Relaxed), 2 * n);
        assert_eq!(c.forwarded.load(Relaxed), 21);
        let s = c.snapshot();
        assert_eq!(s.datagrams_recv, 2 * n);
        assert_eq!(s.forwarded, 21);
        c.dropped.add(MAX_WORKERS + 1, 3);
        assert_eq!(c.dropped.share(1), 3);
        assert_eq!(c.snapshot().dropped, 3);
        assert_eq!(std::mem::align_of::<Share>(), 64, "a share per cache line");
    }
}
