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
/// by default: this fraction of the places (`--max-connections`, or what
/// the budget holds of light connections, [`Budget::light_places`]),
/// at least 1. A carrier-grade NAT puts thousands of users behind one
/// address: with the default budget on a 24 GiB host that is about
/// 40,000 places per address. What keeps a few addresses from holding
/// every place is eviction when full ([`PerAddress::top`]), not this cap.
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

#[derive(Debug, Default)]
struct Places {
    counts: std::collections::HashMap<std::net::IpAddr, usize>,
    /// The same counts, ordered: the address holding the most is last.
    ordered: std::collections::BTreeSet<(usize, std::net::IpAddr)>,
}

impl Places {
    fn set(&mut self, k: std::net::IpAddr, old: usize, new: usize) {
        if old > 0 {
            self.ordered.remove(&(old, k));
        }
        if new > 0 {
            self.ordered.insert((new, k));
            self.counts.insert(k, new);
        } else {
            self.counts.remove(&k);
        }
    }
}

/// Connections per client address, server-wide (`--max-connections-per-ip`):
/// a connection is counted once its address is validated (a Retry token
/// or a finished handshake), so that Initials from spoofed sources cannot
/// use up another client's share. It also says which addresses hold the
/// most ([`PerAddress::top`]), for eviction when the server is full.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    places: std::sync::Mutex<Places>,
}

impl PerAddress {
    /// At most `max` connections from one address.
    pub fn new(max: usize) -> Self {
        PerAddress {
            max,
            places: Default::default(),
        }
    }

    /// The most connections one address may hold.
    pub fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for `ip`; false when it holds `max` already.
    pub fn take(&self, ip: std::net::IpAddr) -> bool {
        let k = address_key(ip);
        let mut p = self.lock();
        let n = p.counts.get(&k).copied().unwrap_or(0);
        if n >= self.max {
            return false;
        }
        p.set(k, n, n + 1);
        true
    }

    /// Gives back a place taken for `ip`.
    pub fn give(&self, ip: std::net::IpAddr) {
        let k = address_key(ip);
        let mut p = self.lock();
        if let Some(n) = p.counts.get(&k).copied() {
            p.set(k, n, n - 1);
        }
    }

    /// The connections `ip`'s address holds.
    pub fn count(&self, ip: std::net::IpAddr) -> usize {
        self.lock()
            .counts
            .get(&address_key(ip))
            .copied()
            .unwrap_or(0)
    }

    /// Addresses (keys) holding more than `above` connections each,
    /// those holding the most first, at most `n` of them.
    pub fn top(&self, above: usize, n: usize) -> Vec<(std::net::IpAddr, usize)> {
        self.lock()
            .ordered
            .iter()
            .rev()
            .take_while(|(c, _)| *c > above)
            .take(n)
            .map(|&(c, k)| (k, c))
            .collect()
    }
}

/// What an established connection holds whatever it does, bytes, as the
/// budget counts it: quinn-proto's connection and TLS state, its packet
/// spaces, its entries in the worker's tables. Measured: 1,127 light
/// connections took a server from 7.7 MB to 31.8 MB of RSS, 21 KB each
/// (docs/SECURITY.md).
pub const CONN_STATE: u64 = 24 * K;
/// What a connection holds beyond [`CONN_STATE`] during its handshake:
/// the CRYPTO frames of three packet spaces.
pub const HANDSHAKE_EXTRA: u64 = 3 * CRYPTO_BUFFER as u64;
/// What one open request stream may hold beyond its receive window, as
/// the budget counts it: the request line or header section being read
/// (2 KiB), and one chunk of the response read ahead and not yet taken
/// by the stream (a file's or h3's body chunk, 64 KiB).
pub const STREAM_HELD: u64 = 2 * K + 64 * K;
/// How long a response may make no progress (no STREAM frame sent while
/// a request stream is open) before its connection is closed and counted
/// ([`crate::Counters::stalled_cut`]): as the TCP listener's send
/// timeout, 10 s.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection with a request open must have made no progress
/// to count as stalled for eviction when the server is full.
pub const STALL_EVICT: Duration = Duration::from_secs(2);

/// The windows a connection is granted: what the budget lets it hold.
/// Each is applied at run time (quinn-proto's
/// `Connection::set_max_concurrent_streams`, `set_receive_window`,
/// `set_send_window`); a connection is granted the tier the budget's
/// level allows each time it is driven, so grants shrink for everyone
/// under pressure and grow back when it passes, as Linux's TCP under
/// `tcp_mem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Below the pressure mark: [`STREAMS`] requests at once, the whole
    /// [`CONN_WINDOW`], and the application's send window
    /// ([`FULL_SEND_WINDOW`] counted).
    Full,
    /// Between the pressure mark and the hard limit: 4 requests at once,
    /// a receive window of 7 streams, a send window of
    /// [`SMALL_SEND_WINDOW`].
    Small,
    /// At the hard limit: 1 request at once, a receive window of 4
    /// streams, a send window of [`MIN_SEND_WINDOW`].
    Minimal,
}

/// The send window counted for a [`Grant::Full`] connection with a
/// request open: the applications' largest ([`H3_SEND_WINDOW`],
/// [`FILE_SEND_WINDOW`]; the `/bytes` pattern is not copied, and its
/// 8 MiB window costs quinn-proto's records of the packets in flight,
/// about 1.1 MB).
pub const FULL_SEND_WINDOW: u64 = 2 << 20;
/// The send window of a [`Grant::Small`] connection.
pub const SMALL_SEND_WINDOW: u64 = 128 * K;
/// The send window of a [`Grant::Minimal`] connection.
pub const MIN_SEND_WINDOW: u64 = 16 * K;

impl Grant {
    /// Requests (bidirectional streams) a client may have open at once,
    /// under [`crate::Transport::default`]
    /// ([`crate::Transport::grant_streams`]).
    pub fn streams(self) -> u32 {
        match self {
            Grant::Full => STREAMS,
            Grant::Small => 4,
            Grant::Minimal => 1,
        }
    }

    /// The connection's receive window, bytes, under
    /// [`crate::Transport::default`]
    /// ([`crate::Transport::grant_receive_window`]).
    pub fn receive_window(self) -> u32 {
        (self.streams() + UNI_STREAMS) * STREAM_WINDOW
    }

    /// The send window counted while a request is open, bytes.
    pub fn send_window(self) -> u64 {
        match self {
            Grant::Full => FULL_SEND_WINDOW,
            Grant::Small => SMALL_SEND_WINDOW,
            Grant::Minimal => MIN_SEND_WINDOW,
        }
    }
}

/// What a connection holds as the budget counts it, bytes: its state, its
/// handshake's buffers while `handshaking`, the receive credit and
/// request state of its `bi` open requests and `uni` open unidirectional
/// streams, and the send window of its grant while a request is open;
/// under [`crate::Transport::default`] ([`crate::Transport::held`] for
/// another).
pub fn held(handshaking: bool, bi: u64, uni: u64, grant: Grant) -> u64 {
    crate::Transport::default().held(handshaking, bi, uni, grant)
}

impl crate::Transport {
    /// Requests (bidirectional streams) a client may have open at once
    /// under grant `g`: [`crate::Transport::bidi_streams`] for
    /// [`Grant::Full`], at most 4 for [`Grant::Small`], 1 for
    /// [`Grant::Minimal`].
    pub fn grant_streams(&self, g: Grant) -> u32 {
        match g {
            Grant::Full => self.bidi_streams,
            Grant::Small => self.bidi_streams.min(4),
            Grant::Minimal => 1,
        }
    }

    /// The connection's receive window under grant `g`, bytes: the whole
    /// [`crate::Transport::receive_window`] for [`Grant::Full`], below
    /// it the windows of the grant's requests and the unidirectional
    /// streams.
    pub fn grant_receive_window(&self, g: Grant) -> u64 {
        let all = self.receive_window();
        match g {
            Grant::Full => all,
            g => all.min(
                u64::from(self.grant_streams(g) + self.uni_streams) * u64::from(self.stream_window),
            ),
        }
    }

    /// The send window of a connection under grant `g`, bytes, as the
    /// budget counts it while a request is open: for [`Grant::Full`],
    /// [`crate::Transport::send_window`] or else [`FULL_SEND_WINDOW`];
    /// below, the grant's ([`Grant::send_window`]), never more than the
    /// configured one.
    pub fn grant_send_window(&self, g: Grant) -> u64 {
        match (g, self.send_window) {
            (Grant::Full, w) => w.unwrap_or(FULL_SEND_WINDOW),
            (g, Some(w)) => g.send_window().min(w),
            (g, None) => g.send_window(),
        }
    }

    /// What a connection holds as the budget counts it, bytes: its state
    /// ([`CONN_STATE`]), its handshake's buffers while `handshaking`
    /// ([`HANDSHAKE_EXTRA`]), the receive credit of its `bi` open requests
    /// and `uni` open unidirectional streams (their stream windows, at
    /// most the connection's; credit granted cannot be taken back, so
    /// the configured window counts under every grant), the request
    /// state of each request ([`STREAM_HELD`]), the send window of its
    /// grant while a request is open ([`crate::Transport::grant_send_window`]),
    /// and the DATAGRAM buffers ([`crate::Transport::datagram_bytes`]).
    pub fn held(&self, handshaking: bool, bi: u64, uni: u64, grant: Grant) -> u64 {
        let hs = if handshaking { HANDSHAKE_EXTRA } else { 0 };
        let send = if bi > 0 {
            self.grant_send_window(grant)
        } else {
            0
        };
        let credit = (bi.saturating_add(uni))
            .saturating_mul(u64::from(self.stream_window))
            .min(self.receive_window());
        let datagrams = self.datagram_bytes();
        CONN_STATE + hs + credit + bi.saturating_mul(STREAM_HELD) + send + datagrams
    }

    /// What a light connection holds as the budget counts it, bytes:
    /// established, no request open, every unidirectional stream open
    /// (HTTP/3's three).
    pub fn light(&self) -> u64 {
        self.held(false, 0, u64::from(self.uni_streams), Grant::Full)
    }

    /// What one connection may hold at most, bytes ([`per_connection`]'s
    /// terms, with the windows and streams configured): its state, its
    /// handshake's buffers, its receive windows and quinn-proto's
    /// reassembly slack per stream, its packets in flight (with
    /// [`crate::Transport::send_window`], quinn-proto's records of them
    /// and the copies of their bytes beyond HTTP/3's own term), HTTP/3's
    /// per-stream terms with the `h3` feature, and the DATAGRAM buffers
    /// ([`crate::Transport::datagram_bytes`]).
    pub fn per_connection(&self) -> u64 {
        let bi = u64::from(self.bidi_streams);
        let uni = u64::from(self.uni_streams);
        let base = 64 * K;
        let crypto = 3 * (CRYPTO_BUFFER as u64 + 32 * K);
        let windows = ((bi + uni) * u64::from(self.stream_window)).min(self.receive_window());
        let streams = windows + bi * (32 * K + 2 * K) + uni * 32 * K;
        let in_flight = match self.send_window {
            None => SEND_WINDOW / 1200 * 160,
            // The application's bytes in flight are copies (HTTP/3's
            // are in its own term).
            Some(w) => w / 1200 * 160 + w.saturating_sub(h3_send_window()),
        };
        base + crypto + streams + in_flight + h3_per_streams(bi) + self.datagram_bytes()
    }

    /// What a connection's DATAGRAM buffers hold at most, bytes: twice
    /// the receive buffer (quinn-proto's, and the engine's into which
    /// each drive moves what was received, so that a drop is counted as
    /// it happens) and the send buffer
    /// ([`crate::Transport::datagram_send_buffer_in_force`]).
    pub fn datagram_bytes(&self) -> u64 {
        2 * self.datagram_receive_buffer.unwrap_or(0) as u64
            + self.datagram_send_buffer_in_force() as u64
    }
}

/// The level of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Below the pressure mark.
    Normal,
    /// At or above the pressure mark.
    Pressure,
    /// At or above the admission mark (7/8 of the hard limit): no new
    /// connection, the least grants.
    Hard,
}

/// The server's memory budget over what its connections hold
/// (`--max-memory` less the process and its workers): one atomic sum,
/// charged and credited by every worker as its connections change
/// ([`held`]). Below [`Budget::pressure`] connections are granted full
/// windows, above it small ones; at [`Budget::admit`] the least, and no
/// new connection is taken (one may evict an idle one: docs/SECURITY.md).
/// The last eighth, up to [`Budget::hard`], is room for what connections
/// already taken grow into (a request opened within the least grant).
#[derive(Debug)]
pub struct Budget {
    hard: u64,
    pressure: u64,
    admit: u64,
    held: std::sync::atomic::AtomicU64,
    /// The most ever held.
    peak: std::sync::atomic::AtomicU64,
    /// What a light connection holds ([`crate::Transport::light`]).
    light: u64,
}

/// The pressure mark, as a fraction of the hard limit: 3/4.
pub const PRESSURE_NUM: u64 = 3;
/// See [`PRESSURE_NUM`].
pub const PRESSURE_DEN: u64 = 4;
/// The admission mark, in eighths of the hard limit: 7.
pub const ADMIT_EIGHTHS: u64 = 7;

impl Budget {
    /// A budget of `hard` bytes for connections, its pressure mark at
    /// 3/4 of it, its admission mark at 7/8.
    pub fn new(hard: u64) -> Self {
        Budget {
            hard,
            pressure: hard / PRESSURE_DEN * PRESSURE_NUM,
            admit: hard / 8 * ADMIT_EIGHTHS,
            held: Default::default(),
            peak: Default::default(),
            light: crate::Transport::default().light(),
        }
    }

    /// The same budget, for connections whose light one holds `bytes`
    /// ([`crate::Transport::light`] of the server's transport; default:
    /// [`crate::Transport::default`]'s): [`Budget::light_places`]
    /// follows.
    pub fn light_connection(mut self, bytes: u64) -> Self {
        self.light = bytes.max(1);
        self
    }

    /// The budget of a server with `workers` workers under `--max-memory`
    /// `max_memory`: what is left after the process and its workers; an
    /// error when that is not one connection's handshake.
    pub fn for_server(max_memory: u64, workers: usize) -> Result<Budget, BudgetError> {
        Budget::for_server_reserving(max_memory, workers, 0)
    }

    /// [`Budget::for_server`], with `reserved` bytes of `max_memory` taken
    /// first for what the server holds outside its QUIC connections (the
    /// TLS/TCP listener's bound, [`crate::altsvc::memory_bound`]).
    pub fn for_server_reserving(
        max_memory: u64,
        workers: usize,
        reserved: u64,
    ) -> Result<Budget, BudgetError> {
        let fixed = (BASE + workers as u64 * per_worker()).saturating_add(reserved);
        let need = fixed.saturating_add(CONN_STATE + HANDSHAKE_EXTRA);
        if max_memory < need {
            return Err(BudgetError {
                budget: max_memory,
                workers,
                need,
            });
        }
        Ok(Budget::new(max_memory - fixed))
    }

    /// The hard limit, bytes.
    pub fn hard(&self) -> u64 {
        self.hard
    }

    /// The pressure mark, bytes.
    pub fn pressure(&self) -> u64 {
        self.pressure
    }

    /// The admission mark, bytes: no new connection at or above it.
    pub fn admit(&self) -> u64 {
        self.admit
    }

    /// What connections hold now, as counted, bytes.
    pub fn held(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most connections have held at once, bytes.
    pub fn peak(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Light connections (established, no request open, every
    /// unidirectional stream open: HTTP/3's three) the admission mark
    /// holds, each as [`Budget::light_connection`] says.
    pub fn light_places(&self) -> usize {
        usize::try_from(self.admit / self.light).unwrap_or(usize::MAX)
    }

    /// The level now.
    pub fn level(&self) -> Level {
        let h = self.held();
        if h >= self.admit {
            Level::Hard
        } else if h >= self.pressure {
            Level::Pressure
        } else {
            Level::Normal
        }
    }

    /// The grant the level allows now.
    pub fn grant(&self) -> Grant {
        match self.level() {
            Level::Normal => Grant::Full,
            Level::Pressure => Grant::Small,
            Level::Hard => Grant::Minimal,
        }
    }

    /// Takes `bytes` for a new connection; false (nothing taken) when
    /// that would pass the admission mark.
    pub fn try_take(&self, bytes: u64) -> bool {
        self.take_below(bytes, self.admit)
    }

    /// Takes `bytes` for a new connection of an address that holds none,
    /// from the reserve: up to halfway between the admission mark and
    /// the hard bound. Clients that hold connections and refill what the
    /// server frees keep the budget at the admission mark; the reserve
    /// is what lets a newcomer in then.
    pub fn try_take_reserved(&self, bytes: u64) -> bool {
        self.take_below(bytes, self.admit + (self.hard - self.admit) / 2)
    }

    fn take_below(&self, bytes: u64, limit: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let r = self
            .held
            .fetch_update(Relaxed, Relaxed, |h| {
                (h.saturating_add(bytes) <= limit).then_some(h + bytes)
            })
            .map(|h| h + bytes);
        if let Ok(now) = r {
            self.peak.fetch_max(now, Relaxed);
        }
        r.is_ok()
    }

    /// A connection's count went from `old` to `new` bytes. Growth past
    /// the admission mark is allowed here: it is what a connection
    /// already holds (a request opened, data a client sent within credit
    /// granted before); the grants are the least until the sum is below
    /// the mark again.
    pub fn change(&self, old: u64, new: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if new > old {
            let now = self.held.fetch_add(new - old, Relaxed) + (new - old);
            self.peak.fetch_max(now, Relaxed);
        } else if old > new {
            self.held.fetch_sub(old - new, Relaxed);
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

/// What one connection may hold at most, bytes, under
/// [`crate::Transport::default`] ([`crate::Transport::per_connection`]
/// for another).
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
    crate::Transport::default().per_connection()
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
    h3_per_streams(u64::from(STREAMS))
}

/// The send window [`h3_per_connection`] counts: [`H3_SEND_WINDOW`] (0
/// without the `h3` feature).
fn h3_send_window() -> u64 {
    if cfg!(feature = "h3") {
        H3_SEND_WINDOW
    } else {
        0
    }
}

/// [`h3_per_connection`] with `streams` requests at once.
fn h3_per_streams(streams: u64) -> u64 {
    #[cfg(feature = "h3")]
    {
        use crate::h3;
        H3_SEND_WINDOW
            + streams * (h3::CHUNK as u64 + 32 + h3::REQUEST_STREAM_CAP)
            + h3::CONTROL_FRAME_MAX
            + 4 * K
    }
    #[cfg(not(feature = "h3"))]
    {
        let _ = streams;
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

/// Raises the process's soft open-file limit (`RLIMIT_NOFILE`) to its
/// hard limit, as servers do at start (systemd's default soft limit is
/// 1,024); the limits before and after, (soft, hard) each.
pub fn raise_open_files() -> std::io::Result<((u64, u64), (u64, u64))> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let pair = |r: &Rlimit| (r.current.unwrap_or(u64::MAX), r.maximum.unwrap_or(u64::MAX));
    let was = pair(&before);
    if before.current != before.maximum {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: before.maximum,
                maximum: before.maximum,
            },
        )?;
    }
    Ok((was, pair(&getrlimit(Resource::Nofile))))
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
    "--max-memory {budget}: {workers} workers, what is reserved outside the QUIC connections and one connection need {need} bytes ({} MiB)",
    need.div_ceil(M)
)]
#[non_exhaustive]
pub struct BudgetError {
    /// The budget, bytes.
    pub budget: u64,
    /// The workers.
    pub workers: usize,
    /// What the workers, the reservation and one connection need, bytes.
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
    /// The reserve: past the admission mark, only `try_take_reserved`
    /// takes, and only up to halfway to the hard bound.
    #[test]
    fn the_reserve_lies_between_the_admission_mark_and_the_bound() {
        let b = Budget::new(1 << 20);
        let (admit, hard) = (b.admit(), b.hard());
        assert!(b.try_take(admit));
        assert!(!b.try_take(1));
        let half = (hard - admit) / 2;
        assert!(b.try_take_reserved(half));
        assert!(!b.try_take_reserved(1));
        assert!(b.peak() <= hard);
    }

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
mod budget_tests {
    use super::*;

    /// The soft open-file limit below the hard one is raised to it.
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let r = getrlimit(Resource::Nofile);
        let hard = r.maximum.unwrap_or(u64::MAX);
        // One below the hard limit (and above what the other tests use).
        let low = hard.saturating_sub(1).max(512);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(low),
                maximum: r.maximum,
            },
        )
        .unwrap();
        let (before, after) = raise_open_files().unwrap();
        assert_eq!(before.0, low);
        assert_eq!(after, (hard, hard));
    }

    /// Levels and grants follow the marks; a new connection's take is
    /// refused past the hard limit, and what a connection already holds
    /// may pass it (the grants are then the least).
    #[test]
    fn the_budget_levels_and_grants() {
        let b = Budget::new(400 * K);
        assert_eq!(b.pressure(), 300 * K);
        assert_eq!(b.admit(), 350 * K);
        assert_eq!(b.grant(), Grant::Full);
        assert!(b.try_take(300 * K));
        assert_eq!(b.grant(), Grant::Small);
        assert!(!b.try_take(51 * K));
        assert!(b.try_take(50 * K));
        assert_eq!(b.level(), Level::Hard);
        assert_eq!(b.grant(), Grant::Minimal);
        assert!(!b.try_take(1));
        b.change(0, 10 * K);
        assert_eq!(b.held(), 360 * K);
        assert_eq!(b.peak(), 360 * K);
        b.change(360 * K, 0);
        assert_eq!(b.held(), 0);
        assert_eq!(b.grant(), Grant::Full);
        // A light connection: its state and three unidirectional streams.
        assert_eq!(
            held(false, 0, 3, Grant::Full),
            CONN_STATE + 3 * u64::from(STREAM_WINDOW)
        );
        assert!(held(false, 1, 3, Grant::Small) < held(false, 1, 3, Grant::Full));
        // The default budget on a 24 GiB host holds 100,000 light ones.
        let b = Budget::for_server(6 << 30, 2).unwrap();
        assert!(b.light_places() >= 100_000, "{}", b.light_places());
        assert!(Budget::for_server(BASE, 2).is_err());
        // A reservation (the TCP listener's) comes off the top.
        let r = Budget::for_server_reserving(6 << 30, 2, 48 << 20).unwrap();
        assert_eq!(
            r.hard(),
            Budget::for_server(6 << 30, 2).unwrap().hard() - (48 << 20)
        );
        let small = BASE + 2 * per_worker() + CONN_STATE + HANDSHAKE_EXTRA;
        assert!(Budget::for_server(small, 2).is_ok());
        assert!(Budget::for_server_reserving(small, 2, 1).is_err());
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
        // The addresses holding the most, most first.
        assert_eq!(p.count(a), 2);
        assert_eq!(
            p.top(1, 8),
            vec![
                ("2001:db8::".parse().unwrap(), 2),
                ("192.0.2.1".parse().unwrap(), 2)
            ]
        );
        assert!(p.top(2, 8).is_empty());
        p.give(v4);
        assert_eq!(p.top(1, 8), vec![("2001:db8::".parse().unwrap(), 2)]);
    }
}
