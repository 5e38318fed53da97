//! The engine's memory model (`quic serve --stack fastudp`): what one connection,
//! one worker and the whole server may hold at most, and the number of
//! connections a memory budget (`--max-memory`) allows. docs/SECURITY.md
//! explains each term.

use std::time::Duration;

/// KiB.
const K: u64 = 1024;
/// MiB.
const M: u64 = 1024 * K;

/// The stream receive window the server grants a client per stream: a
/// request line is at most [`crate::hq::wire::MAX_REQUEST`] bytes.
pub const STREAM_WINDOW: u32 = 4 * 1024;
/// Concurrent bidirectional streams (requests) a client may open.
pub const STREAMS: u32 = 16;
/// Concurrent unidirectional streams a client may open (HTTP/3's
/// control and QPACK streams).
pub const UNI_STREAMS: u32 = 3;
/// The receive window of a whole connection: every stream's window.
pub const CONN_WINDOW: u32 = (STREAMS + UNI_STREAMS) * STREAM_WINDOW;
/// Bytes of the handshake (CRYPTO frames) buffered per packet space.
pub const CRYPTO_BUFFER: usize = 16 * 1024;
/// Bytes a connection may have sent and not yet had acknowledged.
pub const SEND_WINDOW: u64 = 8 << 20;
/// Bytes an HTTP/3 connection may have sent and not yet had acknowledged
/// (one bandwidth-delay product at 1 Gbit/s x 16 ms). h3 hands the
/// backend its frames as slices, so quinn-proto holds a copy of each
/// byte in flight: this window bounds the copies.
pub const H3_SEND_WINDOW: u64 = 2 << 20;
/// The send window of a connection once it serves a file (`--www`): file
/// bytes are copies quinn-proto holds until they are acknowledged (the
/// `/bytes` pattern is static and only referred to), so the window is
/// their bound. 2 MiB: one bandwidth-delay product at 1 Gbit/s x 16 ms.
pub const FILE_SEND_WINDOW: u64 = 2 << 20;
/// The default deadline for a request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default idle timeout: a connection that receives no packet for
/// this long is dropped. 30 s, as quinn's and quic-go's defaults: a
/// handshake whose server flights are all lost must outlast both sides'
/// backed-off probes (under 30% loss, a client's next probe after one
/// at 9.8 s came at 34.2 s), and a place is bounded by the connection
/// limits, not by this time (docs/SECURITY.md).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections one client address (an IPv6 /64) may hold, server-wide,
/// by default: this fraction of `--max-connections`, at least 1.
pub const PER_ADDRESS_SHARE: usize = 4;

/// The key a client's address is counted under: the IPv4 address (an
/// IPv4-mapped IPv6 address as its IPv4 one), or the IPv6 /64 (one host's
/// or one site's addresses).
pub fn address_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1)).into(),
        },
        v4 => v4,
    }
}

/// Connections per client address, server-wide (`--max-connections-per-ip`):
/// a connection is counted once its address is validated (a Retry token
/// or a finished handshake), so that Initials from spoofed sources cannot
/// use up another client's share.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    counts: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PerAddress {
    /// At most `max` connections from one address.
    pub fn new(max: usize) -> Self {
        PerAddress {
            max,
            counts: Default::default(),
        }
    }

    /// Takes a place for `ip`; false when it holds `max` already.
    pub fn take(&self, ip: std::net::IpAddr) -> bool {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(address_key(ip)).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    /// Gives back a place taken for `ip`.
    pub fn give(&self, ip: std::net::IpAddr) {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let k = address_key(ip);
        if let Some(n) = m.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                m.remove(&k);
            }
        }
    }
}

/// Trains one connection may queue in one loop turn; one with more to send
/// goes on in the next turn, after the others had theirs.
pub const TRAINS_PER_TURN: usize = 8;
/// Stateless replies (Version Negotiation, Retry, stateless reset, close
/// of a refused connection) a worker queues at most; more are dropped.
pub const STATELESS_QUEUE: usize = 256;
/// Bytes a stateless reply's buffer holds (quinn-proto's replies are at
/// most one datagram).
pub const STATELESS_BUF: usize = 1500;
/// Transmits (GSO trains) a worker queues at most before it sends them.
pub const PENDING_TRAINS: usize = 64;
/// Bytes of one train's buffer.
pub const TRAIN_BUF: usize = 40 * 1500;
/// Spare train buffers a worker keeps for reuse.
pub const SPARE_TRAINS: usize = 64;
/// Messages of a worker's receive batch (each of [`RECV_MESSAGE`] bytes).
pub const RECV_BATCH: usize = 64;
/// Bytes of one message of a worker's receive batch: a 64-segment GRO
/// train of 1472-byte datagrams (94208 bytes) fits, so none is truncated.
pub const RECV_MESSAGE: usize = 96 * 1024;
/// Provided buffers of a worker's io_uring receive ring
/// ([`crate::EngineConfig::uring`]), each of the library's default
/// message capacity: half of [`RECV_BATCH`]'s memory.
pub const RING_BUFFERS: u16 = (RECV_BATCH / 2) as u16;
/// Messages a worker reads in place from its ring at once, at most: a
/// quarter of [`RECV_BATCH`], so that half of the ring's buffers stay
/// free for the kernel while the worker holds the others. The receive
/// batch behind it (used only where io_uring is refused, then replaced by
/// one of [`RECV_BATCH`]) and the ring together hold less than
/// [`RECV_BATCH`] messages' memory, the term [`per_worker`] counts.
pub const RING_BATCH: usize = RECV_BATCH / 4;
/// Bytes quinn-proto may buffer for connections not yet accepted, per
/// worker (the server decides on each at once, so this is rarely used).
pub const INCOMING_BUFFER: u64 = 1 << 20;

/// What one connection may hold at most, bytes.
///
/// - 64 KiB: quinn-proto's connection and TLS state, packet spaces, the
///   connection's entry in the worker's tables.
/// - 3 packet spaces x ([`CRYPTO_BUFFER`] + 32 KiB): handshake data out of
///   order; quinn-proto's reassembly keeps at most 32 KiB of datagram
///   buffers beyond the bytes it holds before it copies them out.
/// - [`STREAMS`] x ([`STREAM_WINDOW`] + 32 KiB + 1 KiB of request line +
///   1 KiB of stream state): request bytes, held out of order by
///   quinn-proto or in order by the server until the line is whole.
/// - [`UNI_STREAMS`] x ([`STREAM_WINDOW`] + 32 KiB): a client's
///   unidirectional streams (HTTP/3's control and QPACK streams).
/// - [`SEND_WINDOW`] / 1,200 x 160 B: quinn-proto's record of each
///   packet in flight (response bytes are a static pattern quinn-proto
///   refers to, not copies).
/// - With the `h3` feature, what an HTTP/3 connection holds beyond that
///   ([`h3_per_connection`]).
pub fn per_connection() -> u64 {
    let base = 64 * K;
    let crypto = 3 * (CRYPTO_BUFFER as u64 + 32 * K);
    let streams = u64::from(STREAMS) * (u64::from(STREAM_WINDOW) + 32 * K + 2 * K)
        + u64::from(UNI_STREAMS) * (u64::from(STREAM_WINDOW) + 32 * K);
    let in_flight = SEND_WINDOW / 1200 * 160;
    base + crypto + streams + in_flight + h3_per_connection()
}

/// What an HTTP/3 connection holds beyond the transport's terms, bytes
/// (0 without the `h3` feature):
///
/// - [`H3_SEND_WINDOW`]: quinn-proto's copies of the response bytes in
///   flight.
/// - [`STREAMS`] x (64 KiB + 32 B): the body chunk h3 holds per stream
///   until the stream takes it, with its frame header.
/// - [`STREAMS`] x the request stream's byte cap
///   ([`crate::h3::REQUEST_STREAM_CAP`]): h3 reads a header section whole
///   before it decodes it.
/// - [`crate::h3::CONTROL_FRAME_MAX`]: the frame h3 is reading on the
///   client's control stream.
/// - 4 KiB: h3's connection state, the task, its timers and wakers.
pub fn h3_per_connection() -> u64 {
    #[cfg(feature = "h3")]
    {
        use crate::h3;
        H3_SEND_WINDOW
            + u64::from(STREAMS) * (h3::CHUNK as u64 + 32 + h3::REQUEST_STREAM_CAP)
            + h3::CONTROL_FRAME_MAX
            + 4 * K
    }
    #[cfg(not(feature = "h3"))]
    {
        0
    }
}

/// What a connection serving files (`--www`) may hold beyond
/// [`per_connection`], bytes: [`FILE_SEND_WINDOW`] of file bytes written
/// and not yet acknowledged, and one chunk read ahead
/// ([`crate::files::CHUNK`]) per stream.
pub fn per_connection_files() -> u64 {
    FILE_SEND_WINDOW + u64::from(STREAMS) * crate::files::CHUNK as u64
}

/// What one worker holds whatever its connections, bytes: the forwarding
/// rings, queued stateless replies and trains, spare buffers, the receive
/// batch (or the io_uring ring and its smaller batch, which hold less:
/// [`RING_BATCH`]), quinn-proto's buffer for connections not yet
/// accepted.
pub fn per_worker() -> u64 {
    let forward = 2 * (crate::forward::SLOTS * crate::forward::SLOT) as u64;
    let stateless = (STATELESS_QUEUE * STATELESS_BUF) as u64;
    let trains = ((PENDING_TRAINS + TRAINS_PER_TURN + SPARE_TRAINS) * TRAIN_BUF) as u64;
    let recv = (RECV_BATCH * RECV_MESSAGE) as u64;
    forward + stateless + trains + recv + INCOMING_BUFFER + M
}

/// The process itself: code, TLS configuration, threads' stacks.
pub const BASE: u64 = 32 * M;

/// The default budget: a quarter of the host's memory (MemTotal), or
/// 1 GiB where /proc/meminfo says nothing.
pub fn default_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kb| kb * K / 4)
        .unwrap_or(1 << 30)
}

/// A memory budget too small for the workers and one connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--max-memory {budget}: {workers} workers and one connection need {need} bytes ({} MiB)",
    need.div_ceil(M)
)]
#[non_exhaustive]
pub struct BudgetError {
    /// The budget, bytes.
    pub budget: u64,
    /// The workers.
    pub workers: usize,
    /// What the workers and one connection need, bytes.
    pub need: u64,
}

/// The connections `budget` bytes allow with `workers` workers, at most
/// `asked`; an error when the budget does not cover the workers and one
/// connection.
pub fn max_connections(budget: u64, workers: usize, asked: usize) -> Result<usize, BudgetError> {
    max_connections_with(budget, workers, asked, per_connection())
}

/// [`max_connections`], for connections that may hold `each` bytes (as
/// [`per_connection`] + [`per_connection_files`] with `--www`).
pub fn max_connections_with(
    budget: u64,
    workers: usize,
    asked: usize,
    each: u64,
) -> Result<usize, BudgetError> {
    let fixed = BASE + workers as u64 * per_worker();
    let need = fixed + each;
    if budget < need {
        return Err(BudgetError {
            budget,
            workers,
            need,
        });
    }
    let n = (budget - fixed) / each;
    Ok(usize::try_from(n).unwrap_or(usize::MAX).min(asked))
}

/// The worst case of a server with `workers` workers and `connections`
/// connections, bytes.
pub fn worst_case(workers: usize, connections: usize) -> u64 {
    worst_case_with(workers, connections, per_connection())
}

/// [`worst_case`], for connections that may hold `each` bytes.
pub fn worst_case_with(workers: usize, connections: usize, each: u64) -> u64 {
    BASE + workers as u64 * per_worker() + connections as u64 * each
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_the_worst_case() {
        for (budget, workers) in [(1u64 << 30, 2usize), (6 << 30, 2), (256 << 20, 1)] {
            let n = max_connections(budget, workers, usize::MAX).unwrap();
            assert!(n >= 1);
            assert!(worst_case(workers, n) <= budget, "{budget} {workers} {n}");
            assert!(
                worst_case(workers, n + 1) > budget,
                "{budget} {workers} {n}"
            );
        }
        assert_eq!(max_connections(1 << 30, 2, 10).unwrap(), 10);
        assert!(max_connections(BASE, 2, 10).is_err());
        // Serving files costs more per connection: fewer fit.
        let each = per_connection() + per_connection_files();
        let n = max_connections_with(1 << 30, 2, usize::MAX, each).unwrap();
        assert!(n < max_connections(1 << 30, 2, usize::MAX).unwrap());
        assert!(worst_case_with(2, n, each) <= 1 << 30);
        assert!(worst_case_with(2, n + 1, each) > 1 << 30);
    }
}

#[cfg(test)]
mod per_address_tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn an_ipv6_64_is_one_address_and_places_come_back() {
        let p = PerAddress::new(2);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        assert!(p.take(a));
        assert!(p.take(b));
        assert!(!p.take(a), "a /64 is one address");
        assert!(p.take(other));
        p.give(a);
        assert!(p.take(b));
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert!(p.take(v4));
        assert!(p.take(mapped));
        assert!(!p.take(v4), "a v4-mapped address is its IPv4 address");
    }
}
