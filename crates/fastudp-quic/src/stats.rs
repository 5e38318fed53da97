//! The counters the engine keeps (and the baseline servers of the
//! `fastudp` command keep too, so that one report fits all).

use std::sync::atomic::AtomicU64;

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
    /// Datagrams received.
    pub datagrams_recv: AtomicU64,
    /// Send syscalls.
    pub send_calls: AtomicU64,
    /// Receive syscalls.
    pub recv_calls: AtomicU64,
    /// Packets declared lost (and retransmitted) by the connections.
    pub lost_packets: AtomicU64,
    /// Datagrams a worker handed to the worker owning their connection.
    pub forwarded: AtomicU64,
    /// Datagrams quinn-proto could not use (garbage, unknown connection).
    pub dropped: AtomicU64,
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
    /// ([`crate::EngineConfig::uring`]); also counted in `datagrams_recv`.
    pub recv_in_place: AtomicU64,
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
    /// HTTP/3 responses begun, by status class: index 0 counts 1xx, 1
    /// 2xx, 2 3xx, 3 4xx, 4 5xx (a status outside 100-599 is not counted).
    /// Requests h3 refused before an answer are in `h3_refused`.
    pub h3_responses: [AtomicU64; 5],
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
