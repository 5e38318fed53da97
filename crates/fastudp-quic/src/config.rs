//! The engine's configuration.

use crate::limits;
use crate::{ConfigError, Error};

/// A value out of its range: `field`, and `reason`, the whole message
/// (which starts with the field's name).
fn out_of_range(field: &'static str, reason: String) -> Error {
    Error::Config(ConfigError::OutOfRange { field, reason })
}
use quinn_proto::{TransportConfig, VarInt};
use std::time::Duration;

/// The transport settings every stack shares, with `idle_timeout` (whole
/// milliseconds; [`limits::IDLE_TIMEOUT`] where it does not fit a QUIC
/// varint): [`Transport::default`]'s.
pub fn transport(idle_timeout: Duration) -> TransportConfig {
    Transport::default().quinn(idle_timeout, limits::Grant::Full)
}

/// Sizes `t`'s windows for a connection accepted with grant `g`
/// ([`limits::Grant`]) under [`Transport::default`]: the requests it may
/// open at once, its receive window and, below [`limits::Grant::Full`],
/// its send window. Credit announced in the handshake cannot be taken
/// back, so a connection accepted under pressure starts with the smaller
/// grant.
pub fn graded(t: &mut TransportConfig, g: limits::Grant) {
    Transport::default().grade(t, g);
}

/// The smallest [`Transport::stream_window`]: a request line or an
/// HTTP/3 request's first frames must fit (today's default, 4 KiB).
pub const MIN_STREAM_WINDOW: u32 = limits::STREAM_WINDOW;
/// The largest [`Transport::stream_window`]: 16 MiB.
pub const MAX_STREAM_WINDOW: u32 = 16 << 20;
/// The largest [`Transport::connection_window`]: 256 MiB.
pub const MAX_CONNECTION_WINDOW: u64 = 256 << 20;
/// The most [`Transport::bidi_streams`].
pub const MAX_BIDI_STREAMS: u32 = 1024;
/// The most [`Transport::uni_streams`].
pub const MAX_UNI_STREAMS: u32 = 100;
/// The smallest [`Transport::datagram_receive_buffer`]: one datagram.
pub const MIN_DATAGRAM_BUFFER: usize = 1200;
/// The largest [`Transport::datagram_receive_buffer`] and
/// [`Transport::datagram_send_buffer`]: 16 MiB.
pub const MAX_DATAGRAM_BUFFER: usize = 16 << 20;
/// The largest [`Transport::send_window`]: 256 MiB. The smallest is
/// [`limits::MIN_SEND_WINDOW`], the least grant's.
pub const MAX_SEND_WINDOW: u64 = 256 << 20;

/// The QUIC transport an embedder configures
/// ([`EngineConfig::transport`]): flow-control windows, concurrent
/// streams, keep-alive, the send window and the DATAGRAM buffers.
///
/// The defaults are the engine's own, sized for small requests (see
/// [`crate::limits`]); an application that takes uploads raises the
/// windows. The memory model follows what is configured: what a
/// connection is counted for in the budget ([`Transport::held`]), the
/// light connections the budget holds ([`crate::limits::Budget::light_places`])
/// and the worst case of one connection ([`Transport::per_connection`]).
/// Under memory pressure every connection's grant still shrinks
/// ([`limits::Grant`]), from what is configured down.
///
/// The idle timeout is [`EngineConfig::idle_timeout`] (the engine enforces
/// it itself, whatever the round-trip time).
/// [`crate::Engine::start`] refuses a value out of range, naming it
/// ([`Transport::check`]).
///
/// ```
/// use fastudp_quic::Transport;
/// use std::time::Duration;
/// // Uploads of 1 MiB per round trip on each of 8 streams, 4 MiB per
/// // connection, and a PING every 10 s.
/// let t = Transport::new()
///     .stream_window(1 << 20)
///     .connection_window(Some(4 << 20))
///     .bidi_streams(8)
///     .keep_alive(Some(Duration::from_secs(10)));
/// assert!(t.check(Duration::from_secs(30)).is_ok());
/// assert_eq!(t.receive_window(), 4 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transport {
    /// The receive window the server grants each stream, bytes
    /// ([`MIN_STREAM_WINDOW`] to [`MAX_STREAM_WINDOW`]). Default:
    /// [`limits::STREAM_WINDOW`], 4 KiB.
    pub stream_window: u32,
    /// The receive window of a whole connection, bytes (at least
    /// [`Transport::stream_window`], at most [`MAX_CONNECTION_WINDOW`]).
    /// Default: `None`, every stream's window,
    /// (`bidi_streams` + `uni_streams`) x `stream_window` (76 KiB with
    /// the other defaults, [`limits::CONN_WINDOW`]).
    pub connection_window: Option<u64>,
    /// Bidirectional streams (requests) a client may have open at once
    /// (1 to [`MAX_BIDI_STREAMS`]). Default: [`limits::STREAMS`], 16.
    pub bidi_streams: u32,
    /// Unidirectional streams a client may have open at once (0 to
    /// [`MAX_UNI_STREAMS`]; HTTP/3 needs 3, RFC 9114 6.2). Default:
    /// [`limits::UNI_STREAMS`], 3.
    pub uni_streams: u32,
    /// The server sends a PING after this long without sending anything,
    /// so that NATs and the client's idle timer keep the connection
    /// (more than zero, less than the idle timeout). Default: `None`.
    pub keep_alive: Option<Duration>,
    /// QUIC DATAGRAM frames (RFC 9221), bytes a connection buffers of
    /// those received and not yet read ([`MIN_DATAGRAM_BUFFER`] to
    /// [`MAX_DATAGRAM_BUFFER`]; [`crate::app::AppCx::recv_datagram`]).
    /// When it is full the oldest are dropped, counted in
    /// [`crate::Counters::quic_datagrams_dropped`] as it happens (by the
    /// end of the drive of the connection that received them). Also what
    /// announces DATAGRAM support to the client. The budget counts it
    /// twice for every connection: quinn-proto's buffer and the engine's,
    /// where each drive moves what was received so that drops are seen.
    /// Default: `None`, no DATAGRAM frames.
    pub datagram_receive_buffer: Option<usize>,
    /// QUIC DATAGRAM frames queued to send, bytes
    /// ([`MIN_DATAGRAM_BUFFER`] to [`MAX_DATAGRAM_BUFFER`];
    /// [`crate::app::AppCx::send_datagram`]). When it is full a send is
    /// refused and counted in [`crate::Counters::quic_datagrams_blocked`].
    /// Counted whole in every connection's budget charge. Only with
    /// [`Transport::datagram_receive_buffer`] (without it there are no
    /// DATAGRAM frames). Default: `None`, the receive buffer's size.
    pub datagram_send_buffer: Option<usize>,
    /// Bytes a connection may have sent and not yet had acknowledged,
    /// at the full grant ([`limits::MIN_SEND_WINDOW`] to
    /// [`MAX_SEND_WINDOW`]): the bound on the copies of response bytes
    /// quinn-proto holds until the client acknowledges them, and on the
    /// bandwidth-delay product one connection can fill (2 MiB is 1 Gbit/s
    /// x 16 ms). When set, it replaces the applications' own (HTTP/3's
    /// and the file server's [`limits::H3_SEND_WINDOW`],
    /// [`crate::app::AppCx::set_send_window`]) and the budget counts it
    /// for every connection with a request open; under memory pressure a
    /// connection's window still shrinks to its grant's
    /// ([`crate::Transport::grant_send_window`]). Default: `None`, the
    /// applications' own, counted as [`limits::FULL_SEND_WINDOW`].
    pub send_window: Option<u64>,
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            stream_window: limits::STREAM_WINDOW,
            connection_window: None,
            bidi_streams: limits::STREAMS,
            uni_streams: limits::UNI_STREAMS,
            keep_alive: None,
            datagram_receive_buffer: None,
            datagram_send_buffer: None,
            send_window: None,
        }
    }
}

impl Transport {
    /// The defaults ([`Transport::default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`Transport::stream_window`].
    pub fn stream_window(mut self, bytes: u32) -> Self {
        self.stream_window = bytes;
        self
    }

    /// Sets [`Transport::connection_window`].
    pub fn connection_window(mut self, bytes: Option<u64>) -> Self {
        self.connection_window = bytes;
        self
    }

    /// Sets [`Transport::bidi_streams`].
    pub fn bidi_streams(mut self, n: u32) -> Self {
        self.bidi_streams = n;
        self
    }

    /// Sets [`Transport::uni_streams`].
    pub fn uni_streams(mut self, n: u32) -> Self {
        self.uni_streams = n;
        self
    }

    /// Sets [`Transport::keep_alive`].
    pub fn keep_alive(mut self, every: Option<Duration>) -> Self {
        self.keep_alive = every;
        self
    }

    /// Sets [`Transport::datagram_receive_buffer`].
    pub fn datagram_receive_buffer(mut self, bytes: Option<usize>) -> Self {
        self.datagram_receive_buffer = bytes;
        self
    }

    /// Sets [`Transport::datagram_send_buffer`].
    pub fn datagram_send_buffer(mut self, bytes: Option<usize>) -> Self {
        self.datagram_send_buffer = bytes;
        self
    }

    /// Sets [`Transport::send_window`].
    pub fn send_window(mut self, bytes: Option<u64>) -> Self {
        self.send_window = bytes;
        self
    }

    /// The DATAGRAM send buffer in force, bytes:
    /// [`Transport::datagram_send_buffer`], or the receive buffer's size
    /// (0 without DATAGRAM frames).
    pub fn datagram_send_buffer_in_force(&self) -> usize {
        self.datagram_send_buffer
            .or(self.datagram_receive_buffer)
            .unwrap_or(0)
    }

    /// The connection's receive window in force, bytes:
    /// [`Transport::connection_window`], or every stream's window.
    pub fn receive_window(&self) -> u64 {
        self.connection_window.unwrap_or(
            u64::from(self.bidi_streams.saturating_add(self.uni_streams))
                * u64::from(self.stream_window),
        )
    }

    /// Checks the values against their ranges, with the connection's
    /// `idle_timeout` ([`EngineConfig::idle_timeout`]): what is out of
    /// range, said plainly ([`Error::Config`]).
    pub fn check(&self, idle_timeout: Duration) -> Result<(), Error> {
        if !(MIN_STREAM_WINDOW..=MAX_STREAM_WINDOW).contains(&self.stream_window) {
            return Err(out_of_range(
                "stream_window",
                format!(
                    "stream_window {}: between {MIN_STREAM_WINDOW} and {MAX_STREAM_WINDOW} bytes",
                    self.stream_window
                ),
            ));
        }
        if let Some(w) = self.connection_window {
            if !(u64::from(self.stream_window)..=MAX_CONNECTION_WINDOW).contains(&w) {
                return Err(out_of_range(
                    "connection_window",
                    format!(
                        "connection_window {w}: between the stream window ({}) and \
                     {MAX_CONNECTION_WINDOW} bytes",
                        self.stream_window
                    ),
                ));
            }
        } else if self.receive_window() > MAX_CONNECTION_WINDOW {
            return Err(out_of_range(
                "connection_window",
                format!(
                    "connection_window: every stream's window is {} bytes, more than \
                 {MAX_CONNECTION_WINDOW}: set a smaller one",
                    self.receive_window()
                ),
            ));
        }
        if !(1..=MAX_BIDI_STREAMS).contains(&self.bidi_streams) {
            return Err(out_of_range(
                "bidi_streams",
                format!(
                    "bidi_streams {}: between 1 and {MAX_BIDI_STREAMS}",
                    self.bidi_streams
                ),
            ));
        }
        if self.uni_streams > MAX_UNI_STREAMS {
            return Err(out_of_range(
                "uni_streams",
                format!(
                    "uni_streams {}: at most {MAX_UNI_STREAMS}",
                    self.uni_streams
                ),
            ));
        }
        if let Some(k) = self.keep_alive {
            if k.is_zero() || (!idle_timeout.is_zero() && k >= idle_timeout) {
                return Err(out_of_range(
                    "keep_alive",
                    format!(
                        "keep_alive {k:?}: more than zero and less than the idle timeout \
                     ({idle_timeout:?})"
                    ),
                ));
            }
        }
        for (field, v) in [
            ("datagram_receive_buffer", self.datagram_receive_buffer),
            ("datagram_send_buffer", self.datagram_send_buffer),
        ] {
            if let Some(b) = v {
                if !(MIN_DATAGRAM_BUFFER..=MAX_DATAGRAM_BUFFER).contains(&b) {
                    return Err(out_of_range(
                        field,
                        format!(
                            "{field} {b}: between {MIN_DATAGRAM_BUFFER} and \
                         {MAX_DATAGRAM_BUFFER} bytes"
                        ),
                    ));
                }
            }
        }
        if self.datagram_send_buffer.is_some() && self.datagram_receive_buffer.is_none() {
            return Err(out_of_range(
                "datagram_send_buffer",
                "datagram_send_buffer: DATAGRAM frames are off; set datagram_receive_buffer \
                 to turn them on"
                    .to_string(),
            ));
        }
        if let Some(w) = self.send_window {
            if !(limits::MIN_SEND_WINDOW..=MAX_SEND_WINDOW).contains(&w) {
                return Err(out_of_range(
                    "send_window",
                    format!(
                        "send_window {w}: between {} and {MAX_SEND_WINDOW} bytes",
                        limits::MIN_SEND_WINDOW
                    ),
                ));
            }
        }
        Ok(())
    }

    /// quinn-proto's transport configuration for a connection accepted
    /// with grant `g`, with `idle_timeout` (whole milliseconds;
    /// [`limits::IDLE_TIMEOUT`] where it does not fit a QUIC varint).
    pub(crate) fn quinn(&self, idle_timeout: Duration, g: limits::Grant) -> TransportConfig {
        let mut t = TransportConfig::default();
        t.max_idle_timeout(Some(
            VarInt::from_u64(idle_timeout.as_millis().min(u128::from(u64::MAX)) as u64)
                .unwrap_or(VarInt::from_u32(limits::IDLE_TIMEOUT.as_millis() as u32))
                .into(),
        ));
        // Sized for the application (see [`limits`]): quinn-proto's
        // defaults (1.25 MB per stream, no bound per connection) would let
        // one client park 125 MB.
        t.max_concurrent_bidi_streams(VarInt::from_u32(self.bidi_streams));
        // HTTP/3 needs three of the client's (control, QPACK encoder and
        // decoder; RFC 9114 6.2), and the transport parameters are sent
        // before the ALPN is known: every protocol allows them
        // (hq-interop stops them at once).
        t.max_concurrent_uni_streams(VarInt::from_u32(self.uni_streams));
        t.stream_receive_window(VarInt::from_u32(self.stream_window));
        t.receive_window(varint(self.receive_window()));
        t.crypto_buffer_size(limits::CRYPTO_BUFFER);
        t.send_window(self.send_window.unwrap_or(limits::SEND_WINDOW));
        t.keep_alive_interval(self.keep_alive);
        t.datagram_receive_buffer_size(self.datagram_receive_buffer);
        t.datagram_send_buffer_size(self.datagram_send_buffer_in_force());
        self.grade(&mut t, g);
        t
    }

    /// Sizes `t`'s windows for grant `g` (nothing for
    /// [`limits::Grant::Full`]).
    pub(crate) fn grade(&self, t: &mut TransportConfig, g: limits::Grant) {
        if g == limits::Grant::Full {
            return;
        }
        t.max_concurrent_bidi_streams(VarInt::from_u32(self.grant_streams(g)));
        t.receive_window(varint(self.grant_receive_window(g)));
        t.send_window(self.grant_send_window(g));
    }
}

/// `v` as a QUIC varint (the largest where it does not fit).
fn varint(v: u64) -> VarInt {
    VarInt::from_u64(v).unwrap_or(VarInt::MAX)
}

/// The most datagrams of 1,472 bytes that fit one GSO train (64 KiB).
pub const MAX_TRAIN_LIMIT: usize = 44;

/// How the engine paces its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pacing {
    /// quinn-proto's own pacer decides when each connection sends.
    Quic,
    /// quinn-proto's pacer, and each train's departure time passed down as
    /// `SCM_TXTIME` where the egress qdisc honours it (fq, etf). Where it
    /// does not, the engine falls back to [`Pacing::Quic`] and says why
    /// ([`crate::Engine::pacing`]).
    Kernel {
        /// The root qdisc of the interface the engine sends on (`fq`,
        /// `pfifo_fast`, ...), as the caller found it; `None` if unknown.
        /// The engine reads no host state itself.
        qdisc: Option<String>,
    },
}

/// Connections at most, server-wide, unless the configuration says fewer:
/// the memory budget ([`EngineConfig::max_memory`]) bounds them first.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1_000_000;

/// What an [`crate::Engine`] runs with.
///
/// Built with [`EngineConfig::new`] and the builder methods; the fields
/// can be read, and more will be added.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use fastudp_quic::{EngineConfig, Pacing};
/// use std::sync::Arc;
/// use std::time::Duration;
/// # let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
/// # let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
/// # let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
/// #     rustls::crypto::aws_lc_rs::default_provider(),
/// # ))
/// # .with_protocol_versions(&[&rustls::version::TLS13])?
/// # .with_no_client_auth()
/// # .with_single_cert(vec![cert.cert.der().clone()], key.into())?;
/// // `tls`: the server's rustls configuration (TLS 1.3, its certificate).
/// let cfg = EngineConfig::new("[::]:4433".parse()?, Arc::new(tls))
///     .workers(4)
///     .pacing(Pacing::Quic)
///     .idle_timeout(Duration::from_secs(60));
/// assert_eq!(cfg.workers, 4);
/// assert_eq!(cfg.idle_timeout, Duration::from_secs(60));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The address to listen on (port 0 picks one:
    /// [`crate::Engine::local_addr`]).
    pub listen: std::net::SocketAddr,
    /// Worker threads, each with its own socket of a reuseport group:
    /// 1 to 256. Default: one per CPU.
    pub workers: usize,
    /// The TLS configuration: TLS 1.3 and the certificate. Its ALPN
    /// protocols are replaced by the application's
    /// ([`crate::app::Application::alpn`]).
    pub tls: std::sync::Arc<rustls::ServerConfig>,
    /// Pacing. Default: [`Pacing::Quic`].
    pub pacing: Pacing,
    /// The most all connections together may send, bytes/s, in batches of
    /// at most 16 KiB. Default: no limit.
    pub total_rate: Option<u64>,
    /// Send large trains with `MSG_ZEROCOPY` where the socket can.
    pub zerocopy: bool,
    /// Validate every client address with a Retry before accepting.
    pub retry: bool,
    /// Handshakes from unvalidated addresses a worker keeps open at most;
    /// above it new clients get a Retry first. Default: 1024.
    pub max_half_open: usize,
    /// Connections at most, server-wide; more are refused (or, when full,
    /// one may evict an idle one: docs/SECURITY.md). Default:
    /// [`DEFAULT_MAX_CONNECTIONS`]; the memory budget bounds them first.
    pub max_connections: usize,
    /// Connections at most from one client address (an IPv6 /64),
    /// counted once the address is validated. Default: `None`, a quarter
    /// of the places ([`EngineConfig::places`]), at least 1.
    pub max_connections_per_ip: Option<usize>,
    /// The most memory the server may hold, bytes: the process and its
    /// workers ([`crate::limits::BASE`], [`crate::limits::per_worker`])
    /// and a budget over what connections hold ([`crate::limits::Budget`])
    /// with the rest. Default: `None`, a quarter of the host's memory
    /// ([`crate::limits::default_budget`]).
    pub max_memory: Option<u64>,
    /// Bytes of [`EngineConfig::max_memory`] held outside the engine's
    /// connections and taken off before their budget: the TLS/TCP
    /// listener's bound ([`crate::altsvc::memory_bound`]) when one runs
    /// beside the engine. Default: 0.
    pub reserved: u64,
    /// Time without a packet after which a connection is dropped, also
    /// during its handshake. The engine drops it then (within
    /// [`Tuning::timer_tick`]) whatever its RTT: quinn-proto's own timer
    /// waits at least 3 probe timeouts, which a client that acknowledges
    /// late stretches without bound (docs/SECURITY.md). Default:
    /// [`crate::limits::IDLE_TIMEOUT`], 30 s.
    pub idle_timeout: Duration,
    /// The QUIC transport: windows, concurrent streams, keep-alive,
    /// DATAGRAM frames. Default: [`Transport::default`].
    pub transport: Transport,
    /// The embedder's decision on each new client, after the server's own
    /// bounds: accept, refuse or ask for a Retry, from its address
    /// ([`crate::AdmissionHook`]). Default: `None`, accept.
    pub admission: Option<crate::AdmissionHook>,
    /// Performance switches, each measured on its own in
    /// docs/BENCHMARKS.md section 17. Default: [`Tuning::default`].
    pub tuning: Tuning,
    /// Socket features to switch off on every socket of the engine
    /// ([`fastudp_io::Config::disable`]). Default: none.
    pub disabled: Vec<fastudp_io::Feature>,
    /// Receive with io_uring (the crate's `uring` feature, Linux): each
    /// worker's receive socket gets a ring of provided buffers
    /// ([`crate::limits::RING_BUFFERS`]) and a multishot receive, and the
    /// worker reads each datagram in place there
    /// (`fastudp_io::Socket::recv_borrowed`), copying it once, into the
    /// buffer quinn-proto takes, instead of twice (kernel to a receive
    /// batch, batch to quinn-proto). Where the kernel refuses io_uring
    /// (`kernel.io_uring_disabled`, seccomp, an old kernel) a worker
    /// receives with syscalls, as without it, and says so:
    /// [`crate::Counters::uring_fallbacks`] and
    /// [`crate::Engine::uring_error`]. Default: off. Without the `uring`
    /// feature, on is refused by [`crate::Engine::start`].
    pub uring: bool,
    /// This server's place in a fleet behind a QUIC-LB load balancer
    /// ([`crate::lb`]): its connection IDs carry the fleet's first octet
    /// and this server's ID, and the workers steer by the nonce's first
    /// byte. Default: `None`, 8-byte IDs whose first byte is the worker's.
    pub quic_lb: Option<crate::lb::QuicLb>,
    /// The secret the fleet's servers share for their stateless-reset
    /// tokens ([`crate::lb::ResetKey`]). Default: `None`, a random key at
    /// each start (a restarted server cannot reset its old connections).
    pub reset_key: Option<crate::lb::ResetKey>,
}

/// Performance switches of the engine. None changes what a peer sees
/// beyond its timing, except [`Tuning::ack_every`], which asks peers that
/// support the ACK-frequency extension to acknowledge less often.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tuning {
    /// Received datagrams are copied into one shared buffer (one
    /// allocation per 64 KiB of datagrams) instead of one allocation each.
    /// Default: off (no saving measured, docs/BENCHMARKS.md section 17).
    pub recv_arena: bool,
    /// Asks the peer (with the ACK-frequency extension,
    /// draft-ietf-quic-ack-frequency) to acknowledge every `N`th
    /// ack-eliciting packet instead of every second. `None` (the default)
    /// leaves the extension off; a peer without it is not affected.
    pub ack_every: Option<u32>,
    /// Datagrams per GSO train at most (capped by the socket's GSO limit and
    /// 44, a train's 64 KiB). Default: 40.
    pub max_train: usize,
    /// Trains one connection queues at most per loop turn. Default: 8
    /// ([`limits::TRAINS_PER_TURN`]).
    pub trains_per_turn: usize,
    /// The largest UDP payload path-MTU discovery probes for, bytes
    /// (quinn-proto's `MtuDiscoveryConfig::upper_bound`; 1200 to
    /// [`MAX_UDP_PAYLOAD_LIMIT`]). Default: 1452, quinn-proto's, for a
    /// 1500-byte MTU; 8972 fits a 9000-byte (jumbo) IPv4 path. A train
    /// holds fewer datagrams when they are larger: at most
    /// [`MAX_GSO_PAYLOAD`] bytes in all.
    pub max_udp_payload: u16,
    /// The worker sleeps until its next timer rounded up to a multiple of
    /// this, as tokio rounds its timers to 1 ms: timers due within one
    /// tick fire together, in one wake-up, at most one tick late (at most
    /// [`MAX_TIMER_TICK`]; zero: each timer at its own time). Default:
    /// 1 ms ([`DEFAULT_TIMER_TICK`]; video 0.75x the CPU per Gbit with
    /// [`Tuning::rx_coalesce`], docs/BENCHMARKS.md section 17.3).
    pub timer_tick: Duration,
    /// Before it sleeps, the worker polls its socket this long without
    /// sleeping (at most [`MAX_BUSY_POLL`]): a datagram that arrives
    /// meanwhile costs no sleep and wake-up, but the polling is CPU time.
    /// Default: zero, no polling.
    pub busy_poll: Duration,
    /// The worker starts a turn at most once per this long (at most
    /// [`MAX_RX_COALESCE`]): what arrives meanwhile waits and is read in
    /// one call, as a NIC's interrupt moderation batches its
    /// interrupts. It adds at most this much delay to a datagram; a
    /// worker with work left (more to send, a full socket, a receive call
    /// that returned a quarter of a batch or more) does not wait. After a
    /// turn that received at most one datagram (sparse traffic, such as
    /// keep-alives of idle connections) the worker sleeps until the next
    /// datagram first, and takes what is left of this wait only when one
    /// comes within it: a lone datagram costs one wake-up, not two.
    /// A worker that holds many connections waits longer: this much once
    /// per 3,125 connections, up to 4 ms (1 ms at 12,500, 2 ms at 25,000,
    /// 4 ms from 50,000 on, at the default), as the keep-alives of idle
    /// connections then come one by one a few hundred microseconds apart,
    /// each a wake-up of its own unless the wait gathers them (at 100,000
    /// connections on 2 workers, 1 ms cost 0.8x the CPU of 250 us, 2 ms
    /// 0.84x of 1 ms, and 4 ms 0.9x of 2 ms: docs/BENCHMARKS.md section
    /// 29).
    /// Zero: a turn as soon as something arrives. Default: 250 us
    /// ([`DEFAULT_RX_COALESCE`]).
    pub rx_coalesce: Duration,
    /// With [`EngineConfig::total_rate`], the most bytes a worker sends in
    /// one burst ([`MIN_PACING_BURST`] to [`MAX_PACING_BURST`]): the
    /// worker wakes once per burst, so a larger one costs fewer wake-ups,
    /// but the bottleneck's queue must take it whole. Default: 16 KiB.
    pub pacing_burst: usize,
}

/// The smallest [`Tuning::pacing_burst`]: one full-sized datagram.
pub const MIN_PACING_BURST: usize = 1452;
/// The largest [`Tuning::pacing_burst`]: one GSO train.
pub const MAX_PACING_BURST: usize = 64 * 1024;

/// The largest [`Tuning::rx_coalesce`].
pub const MAX_RX_COALESCE: Duration = Duration::from_millis(1);

/// The default [`Tuning::timer_tick`], tokio's timer resolution.
pub const DEFAULT_TIMER_TICK: Duration = Duration::from_millis(1);
/// The default [`Tuning::rx_coalesce`].
pub const DEFAULT_RX_COALESCE: Duration = Duration::from_micros(250);
/// The largest [`Tuning::timer_tick`]: the worker's longest sleep.
pub const MAX_TIMER_TICK: Duration = Duration::from_millis(10);
/// The largest [`Tuning::busy_poll`].
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(1);

/// The default [`Tuning::max_udp_payload`], quinn-proto's.
pub const DEFAULT_MAX_UDP_PAYLOAD: u16 = 1452;
/// The largest [`Tuning::max_udp_payload`]: a 9216-byte MTU's IPv4 UDP
/// payload.
pub const MAX_UDP_PAYLOAD_LIMIT: u16 = 9188;
/// The most UDP payload one GSO train may carry: what the kernel takes in
/// one `sendmsg` (65,535 bytes less the IPv4 and UDP headers).
pub const MAX_GSO_PAYLOAD: usize = 65_507;

/// Lets path-MTU discovery in `t` probe up to `max_udp_payload` bytes of
/// UDP payload (at least 1200: QUIC's minimum).
pub fn max_udp_payload(t: &mut TransportConfig, max_udp_payload: u16) {
    let mut m = quinn_proto::MtuDiscoveryConfig::default();
    m.upper_bound(max_udp_payload.max(1200));
    t.mtu_discovery_config(Some(m));
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            recv_arena: false,
            ack_every: None,
            max_train: crate::tx::MAX_TRAIN,
            trains_per_turn: limits::TRAINS_PER_TURN,
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
            timer_tick: DEFAULT_TIMER_TICK,
            busy_poll: Duration::ZERO,
            rx_coalesce: DEFAULT_RX_COALESCE,
            pacing_burst: crate::tx::DEFAULT_BATCH_BYTES,
        }
    }
}

/// Turns on the ACK-frequency extension in `t`, asking the peer to
/// acknowledge every `every`th ack-eliciting packet (at least 2).
pub fn ack_every(t: &mut TransportConfig, every: u32) {
    let mut f = quinn_proto::AckFrequencyConfig::default();
    // quinn-proto's threshold counts the packets that may go unacknowledged.
    f.ack_eliciting_threshold(VarInt::from_u32(every.max(2) - 1));
    t.ack_frequency_config(Some(f));
}

impl EngineConfig {
    /// The defaults, listening on `listen` with `tls`.
    pub fn new(listen: std::net::SocketAddr, tls: std::sync::Arc<rustls::ServerConfig>) -> Self {
        EngineConfig {
            listen,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(256),
            tls,
            pacing: Pacing::Quic,
            total_rate: None,
            zerocopy: false,
            retry: false,
            max_half_open: 1024,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: None,
            max_memory: None,
            reserved: 0,
            tuning: Tuning::default(),
            idle_timeout: limits::IDLE_TIMEOUT,
            transport: Transport::default(),
            admission: None,
            disabled: Vec::new(),
            uring: false,
            quic_lb: None,
            reset_key: None,
        }
    }

    /// Sets [`EngineConfig::quic_lb`].
    pub fn quic_lb(mut self, lb: Option<crate::lb::QuicLb>) -> Self {
        self.quic_lb = lb;
        self
    }

    /// Sets [`EngineConfig::reset_key`].
    pub fn reset_key(mut self, key: Option<crate::lb::ResetKey>) -> Self {
        self.reset_key = key;
        self
    }

    /// How the reuseport group steers: by the worker's byte of the
    /// destination connection ID, the first or, with QUIC-LB, the nonce's
    /// first.
    pub fn steering(&self) -> fastudp_io::Steering {
        match &self.quic_lb {
            None => fastudp_io::Steering::QuicCid,
            Some(lb) => fastudp_io::Steering::QuicCidAt {
                // At most 16: a server ID is at most 15 bytes.
                index: lb.config().worker_byte() as u8,
            },
        }
    }

    /// Sets [`EngineConfig::uring`].
    pub fn uring(mut self, on: bool) -> Self {
        self.uring = on;
        self
    }

    /// Sets [`EngineConfig::disabled`].
    pub fn disabled(mut self, features: impl IntoIterator<Item = fastudp_io::Feature>) -> Self {
        self.disabled = features.into_iter().collect();
        self
    }

    /// Sets [`EngineConfig::workers`].
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Sets [`EngineConfig::pacing`].
    pub fn pacing(mut self, p: Pacing) -> Self {
        self.pacing = p;
        self
    }

    /// Sets [`EngineConfig::total_rate`].
    pub fn total_rate(mut self, bytes_per_sec: Option<u64>) -> Self {
        self.total_rate = bytes_per_sec;
        self
    }

    /// Sets [`EngineConfig::zerocopy`].
    pub fn zerocopy(mut self, on: bool) -> Self {
        self.zerocopy = on;
        self
    }

    /// Sets [`EngineConfig::retry`].
    pub fn retry(mut self, on: bool) -> Self {
        self.retry = on;
        self
    }

    /// Sets [`EngineConfig::max_half_open`].
    pub fn max_half_open(mut self, n: usize) -> Self {
        self.max_half_open = n;
        self
    }

    /// Sets [`EngineConfig::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets [`EngineConfig::max_connections_per_ip`].
    pub fn max_connections_per_ip(mut self, n: Option<usize>) -> Self {
        self.max_connections_per_ip = n;
        self
    }

    /// Sets [`EngineConfig::max_memory`].
    pub fn max_memory(mut self, bytes: Option<u64>) -> Self {
        self.max_memory = bytes;
        self
    }

    /// Sets [`EngineConfig::reserved`].
    pub fn reserve(mut self, bytes: u64) -> Self {
        self.reserved = bytes;
        self
    }

    /// The memory budget over connections that [`EngineConfig::max_memory`]
    /// leaves with [`EngineConfig::workers`] workers and
    /// [`EngineConfig::reserved`], for connections of
    /// [`EngineConfig::transport`] ([`limits::Budget::light_connection`]).
    pub fn budget(&self) -> Result<limits::Budget, limits::BudgetError> {
        Ok(limits::Budget::for_server_reserving(
            self.max_memory.unwrap_or_else(limits::default_budget),
            self.workers,
            self.reserved,
        )?
        .light_connection(self.transport.light()))
    }

    /// The places for connections: `max_connections`, or fewer where the
    /// budget holds fewer light ones ([`limits::Budget::light_places`]).
    pub fn places(&self) -> usize {
        let light = self.budget().map(|b| b.light_places()).unwrap_or(1);
        self.max_connections.min(light).max(1)
    }

    /// Sets [`EngineConfig::idle_timeout`].
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// Sets [`EngineConfig::transport`].
    pub fn transport(mut self, t: Transport) -> Self {
        self.transport = t;
        self
    }

    /// Sets [`EngineConfig::admission`] to `f`.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fastudp_quic::{Decision, EngineConfig};
    /// # let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
    /// # let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
    /// # let tls = std::sync::Arc::new(rustls::ServerConfig::builder_with_provider(
    /// #     std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    /// # )
    /// # .with_protocol_versions(&[&rustls::version::TLS13])?
    /// # .with_no_client_auth()
    /// # .with_single_cert(vec![cert.cert.der().clone()], key.into())?);
    /// // Clients of 192.0.2.0/24 are refused; the others prove their
    /// // address with a Retry first.
    /// let cfg = EngineConfig::new("[::]:4433".parse()?, tls).admission(|a| {
    ///     match a.remote.ip().to_canonical() {
    ///         std::net::IpAddr::V4(v4) if v4.octets()[..3] == [192, 0, 2] => Decision::Refuse,
    ///         _ => Decision::Retry,
    ///     }
    /// });
    /// assert!(cfg.admission.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub fn admission(
        mut self,
        f: impl Fn(&crate::Admission) -> crate::Decision + Send + Sync + 'static,
    ) -> Self {
        self.admission = Some(crate::AdmissionHook::new(f));
        self
    }

    /// Sets [`EngineConfig::tuning`].
    pub fn tuning(mut self, t: Tuning) -> Self {
        self.tuning = t;
        self
    }

    /// Connections per client address in force.
    pub fn per_ip(&self) -> usize {
        self.max_connections_per_ip
            .unwrap_or((self.places() / limits::PER_ADDRESS_SHARE).max(1))
    }

    /// Checks the values; what is wrong, said plainly.
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.workers == 0 || self.workers > 256 {
            return Err(out_of_range(
                "workers",
                format!("workers {}: between 1 and 256", self.workers),
            ));
        }
        self.transport.check(self.idle_timeout)?;
        if self.max_connections == 0 {
            return Err(out_of_range(
                "max_connections",
                "max_connections 0: at least 1".into(),
            ));
        }
        if self.max_connections_per_ip == Some(0) {
            return Err(out_of_range(
                "max_connections_per_ip",
                "max_connections_per_ip 0: at least 1".into(),
            ));
        }
        if let Err(e) = self.budget() {
            return Err(Error::Config(ConfigError::Budget(e)));
        }
        if !(1..=MAX_TRAIN_LIMIT).contains(&self.tuning.max_train) {
            return Err(out_of_range(
                "max_train",
                format!(
                    "max_train {}: between 1 and {MAX_TRAIN_LIMIT}",
                    self.tuning.max_train
                ),
            ));
        }
        if self.tuning.trains_per_turn == 0 {
            return Err(out_of_range(
                "trains_per_turn",
                "trains_per_turn 0: at least 1".into(),
            ));
        }
        if self.tuning.timer_tick > MAX_TIMER_TICK {
            return Err(out_of_range(
                "timer_tick",
                format!(
                    "timer_tick {:?}: at most {MAX_TIMER_TICK:?}",
                    self.tuning.timer_tick
                ),
            ));
        }
        if !(MIN_PACING_BURST..=MAX_PACING_BURST).contains(&self.tuning.pacing_burst) {
            return Err(out_of_range(
                "pacing_burst",
                format!(
                    "pacing_burst {}: between {MIN_PACING_BURST} and {MAX_PACING_BURST} bytes",
                    self.tuning.pacing_burst
                ),
            ));
        }
        if self.tuning.rx_coalesce > MAX_RX_COALESCE {
            return Err(out_of_range(
                "rx_coalesce",
                format!(
                    "rx_coalesce {:?}: at most {MAX_RX_COALESCE:?}",
                    self.tuning.rx_coalesce
                ),
            ));
        }
        if self.tuning.busy_poll > MAX_BUSY_POLL {
            return Err(out_of_range(
                "busy_poll",
                format!(
                    "busy_poll {:?}: at most {MAX_BUSY_POLL:?}",
                    self.tuning.busy_poll
                ),
            ));
        }
        if !(1200..=MAX_UDP_PAYLOAD_LIMIT).contains(&self.tuning.max_udp_payload) {
            return Err(out_of_range(
                "max_udp_payload",
                format!(
                    "max_udp_payload {}: between 1200 and {MAX_UDP_PAYLOAD_LIMIT}",
                    self.tuning.max_udp_payload
                ),
            ));
        }
        if self.tuning.ack_every.is_some_and(|n| n < 2) {
            return Err(out_of_range("ack_every", "ack_every: at least 2".into()));
        }
        if self.max_half_open == 0 {
            return Err(out_of_range(
                "max_half_open",
                "max_half_open 0: at least 1".into(),
            ));
        }
        if self.uring && !cfg!(feature = "uring") {
            return Err(Error::Config(ConfigError::UringUnavailable));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: Tuning) -> EngineConfig {
        let tls = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(std::sync::Arc::new(
            rustls::server::ResolvesServerCertUsingSni::new(),
        ));
        EngineConfig::new("127.0.0.1:0".parse().unwrap(), std::sync::Arc::new(tls)).tuning(t)
    }

    /// Each tuning value out of range is refused with its name.
    #[test]
    fn tuning_is_checked() {
        assert!(cfg(Tuning::default()).check().is_ok());
        for (t, want) in [
            (
                Tuning {
                    max_train: 0,
                    ..Tuning::default()
                },
                "max_train 0",
            ),
            (
                Tuning {
                    max_train: MAX_TRAIN_LIMIT + 1,
                    ..Tuning::default()
                },
                "max_train 45",
            ),
            (
                Tuning {
                    trains_per_turn: 0,
                    ..Tuning::default()
                },
                "trains_per_turn 0",
            ),
            (
                Tuning {
                    ack_every: Some(1),
                    ..Tuning::default()
                },
                "ack_every",
            ),
            (
                Tuning {
                    timer_tick: MAX_TIMER_TICK + Duration::from_nanos(1),
                    ..Tuning::default()
                },
                "timer_tick 10.000001ms: at most 10ms",
            ),
            (
                Tuning {
                    busy_poll: Duration::from_millis(2),
                    ..Tuning::default()
                },
                "busy_poll 2ms: at most 1ms",
            ),
            (
                Tuning {
                    rx_coalesce: Duration::from_millis(2),
                    ..Tuning::default()
                },
                "rx_coalesce 2ms: at most 1ms",
            ),
            (
                Tuning {
                    pacing_burst: 1000,
                    ..Tuning::default()
                },
                "pacing_burst 1000: between 1452 and 65536 bytes",
            ),
            (
                Tuning {
                    max_udp_payload: 1199,
                    ..Tuning::default()
                },
                "max_udp_payload 1199",
            ),
            (
                Tuning {
                    max_udp_payload: MAX_UDP_PAYLOAD_LIMIT + 1,
                    ..Tuning::default()
                },
                "max_udp_payload 9189",
            ),
        ] {
            let e = cfg(t).check().unwrap_err();
            assert!(
                matches!(&e, Error::Config(ConfigError::OutOfRange { field, .. })
                    if want.starts_with(field)),
                "{e:?}"
            );
            assert!(e.to_string().starts_with(want), "{e}");
        }
        let ok = Tuning {
            max_train: MAX_TRAIN_LIMIT,
            ack_every: Some(2),
            ..Tuning::default()
        };
        assert!(cfg(ok).check().is_ok());
    }

    /// Each transport value out of range is refused with its name; the
    /// edges of each range are taken.
    #[test]
    fn transport_is_checked() {
        let idle = Duration::from_secs(30);
        assert!(Transport::default().check(idle).is_ok());
        for (t, want) in [
            (Transport::new().stream_window(4095), "stream_window 4095"),
            (
                Transport::new().stream_window(MAX_STREAM_WINDOW + 1),
                "stream_window 16777217",
            ),
            (
                Transport::new()
                    .stream_window(8192)
                    .connection_window(Some(8191)),
                "connection_window 8191",
            ),
            (
                Transport::new().connection_window(Some(MAX_CONNECTION_WINDOW + 1)),
                "connection_window 268435457",
            ),
            (
                Transport::new()
                    .stream_window(MAX_STREAM_WINDOW)
                    .bidi_streams(MAX_BIDI_STREAMS),
                "connection_window: every stream's window",
            ),
            (Transport::new().bidi_streams(0), "bidi_streams 0"),
            (
                Transport::new().bidi_streams(MAX_BIDI_STREAMS + 1),
                "bidi_streams 1025",
            ),
            (Transport::new().uni_streams(101), "uni_streams 101"),
            (
                Transport::new().keep_alive(Some(Duration::ZERO)),
                "keep_alive 0ns",
            ),
            (Transport::new().keep_alive(Some(idle)), "keep_alive 30s"),
            (
                Transport::new().datagram_receive_buffer(Some(100)),
                "datagram_receive_buffer 100",
            ),
            (
                Transport::new().datagram_receive_buffer(Some(MAX_DATAGRAM_BUFFER + 1)),
                "datagram_receive_buffer 16777217",
            ),
            (
                Transport::new()
                    .datagram_receive_buffer(Some(MIN_DATAGRAM_BUFFER))
                    .datagram_send_buffer(Some(1199)),
                "datagram_send_buffer 1199",
            ),
            (
                Transport::new()
                    .datagram_receive_buffer(Some(MIN_DATAGRAM_BUFFER))
                    .datagram_send_buffer(Some(MAX_DATAGRAM_BUFFER + 1)),
                "datagram_send_buffer 16777217",
            ),
            (
                Transport::new().datagram_send_buffer(Some(MIN_DATAGRAM_BUFFER)),
                "datagram_send_buffer: DATAGRAM frames are off",
            ),
            (
                Transport::new().send_window(Some(limits::MIN_SEND_WINDOW - 1)),
                "send_window 16383",
            ),
            (
                Transport::new().send_window(Some(MAX_SEND_WINDOW + 1)),
                "send_window 268435457",
            ),
        ] {
            let e = t.check(idle).unwrap_err();
            assert!(
                matches!(&e, Error::Config(ConfigError::OutOfRange { field, .. })
                    if want.starts_with(field)),
                "{e:?}"
            );
            assert!(e.to_string().starts_with(want), "{e}");
            // The engine's check says the same.
            let e = cfg(Tuning::default()).transport(t).check().unwrap_err();
            assert!(e.to_string().starts_with(want), "{e}");
        }
        let edges = Transport::new()
            .stream_window(MAX_STREAM_WINDOW)
            .connection_window(Some(MAX_CONNECTION_WINDOW))
            .bidi_streams(MAX_BIDI_STREAMS)
            .uni_streams(MAX_UNI_STREAMS)
            .keep_alive(Some(idle - Duration::from_millis(1)))
            .datagram_receive_buffer(Some(MIN_DATAGRAM_BUFFER))
            .datagram_send_buffer(Some(MAX_DATAGRAM_BUFFER))
            .send_window(Some(limits::MIN_SEND_WINDOW));
        assert!(edges.check(idle).is_ok());
        let edges = Transport::new().send_window(Some(MAX_SEND_WINDOW));
        assert!(edges.check(idle).is_ok());
        // No idle timeout: any keep-alive above zero.
        let k = Transport::new().keep_alive(Some(Duration::from_secs(3600)));
        assert!(k.check(Duration::ZERO).is_ok());
    }

    /// The defaults are the engine's own windows, and the memory model's
    /// figures under them are the constants' (`limits`).
    #[test]
    fn the_default_transport_is_the_engines_own() {
        let t = Transport::default();
        assert_eq!(t.receive_window(), u64::from(limits::CONN_WINDOW));
        for g in [
            limits::Grant::Full,
            limits::Grant::Small,
            limits::Grant::Minimal,
        ] {
            assert_eq!(t.grant_streams(g), g.streams());
            assert_eq!(t.grant_receive_window(g), u64::from(g.receive_window()));
            for (bi, uni) in [(0, 0), (1, 3), (16, 3), (4, 0)] {
                let old = limits::CONN_STATE
                    + bi * (u64::from(limits::STREAM_WINDOW) + limits::STREAM_HELD)
                    + uni * u64::from(limits::STREAM_WINDOW)
                    + if bi > 0 { g.send_window() } else { 0 };
                assert_eq!(t.held(false, bi, uni, g), old);
            }
        }
        let old = 64 * 1024
            + 3 * (limits::CRYPTO_BUFFER as u64 + 32 * 1024)
            + u64::from(limits::STREAMS) * (u64::from(limits::STREAM_WINDOW) + 34 * 1024)
            + u64::from(limits::UNI_STREAMS) * (u64::from(limits::STREAM_WINDOW) + 32 * 1024)
            + limits::SEND_WINDOW / 1200 * 160
            + limits::h3_per_connection();
        assert_eq!(t.per_connection(), old);
        assert_eq!(limits::per_connection(), old);
    }

    /// What the budget counts follows the configuration: larger windows,
    /// more streams and a DATAGRAM buffer cost more per connection, and
    /// the budget holds fewer light connections; grants shrink from what
    /// is configured.
    #[test]
    fn the_memory_model_follows_the_transport() {
        let d = Transport::default();
        let big = Transport::new()
            .stream_window(1 << 20)
            .connection_window(Some(4 << 20))
            .bidi_streams(64);
        // Credit is each open stream's window, at most the connection's.
        assert_eq!(
            big.held(false, 2, 0, limits::Grant::Full),
            limits::CONN_STATE + 2 * ((1 << 20) + limits::STREAM_HELD) + limits::FULL_SEND_WINDOW
        );
        assert_eq!(
            big.held(false, 10, 3, limits::Grant::Full),
            limits::CONN_STATE + (4 << 20) + 10 * limits::STREAM_HELD + limits::FULL_SEND_WINDOW
        );
        assert!(big.per_connection() > d.per_connection() + (4 << 20));
        assert_eq!(big.grant_streams(limits::Grant::Full), 64);
        assert_eq!(big.grant_streams(limits::Grant::Small), 4);
        assert_eq!(
            big.grant_receive_window(limits::Grant::Small),
            4 << 20,
            "(4 + 3) MiB capped by the connection's 4 MiB"
        );
        assert_eq!(big.grant_receive_window(limits::Grant::Minimal), 4 << 20);
        let dg = Transport::new().datagram_receive_buffer(Some(64 * 1024));
        // Received twice (quinn-proto's buffer and the engine's), and the
        // send buffer, the receive buffer's size by default.
        assert_eq!(dg.light(), d.light() + 3 * 64 * 1024);
        assert_eq!(dg.per_connection(), d.per_connection() + 3 * 64 * 1024);
        // A send buffer of its own.
        let dg2 = dg.clone().datagram_send_buffer(Some(1 << 20));
        assert_eq!(dg2.light(), d.light() + 2 * 64 * 1024 + (1 << 20));
        assert_eq!(
            dg2.per_connection(),
            d.per_connection() + 2 * 64 * 1024 + (1 << 20)
        );
        let q = dg2.quinn(Duration::from_secs(30), limits::Grant::Full);
        let q = format!("{q:?}");
        assert!(q.contains("datagram_send_buffer_size: 1048576"), "{q}");
        assert!(
            q.contains("datagram_receive_buffer_size: Some(65536)"),
            "{q}"
        );

        // A send window of the embedder's: counted with a request open,
        // for the full grant and capped below it; quinn-proto's records
        // and the copies beyond HTTP/3's own in the worst case.
        let sw = Transport::new().send_window(Some(16 << 20));
        assert_eq!(
            sw.held(false, 1, 0, limits::Grant::Full),
            d.held(false, 1, 0, limits::Grant::Full) - limits::FULL_SEND_WINDOW + (16 << 20)
        );
        assert_eq!(
            sw.held(false, 1, 0, limits::Grant::Small),
            d.held(false, 1, 0, limits::Grant::Small)
        );
        assert_eq!(sw.held(false, 0, 3, limits::Grant::Full), d.light());
        let h3 = if cfg!(feature = "h3") {
            limits::H3_SEND_WINDOW
        } else {
            0
        };
        assert_eq!(
            sw.per_connection(),
            d.per_connection() - limits::SEND_WINDOW / 1200 * 160
                + (16 << 20) / 1200 * 160
                + (16 << 20)
                - h3
        );
        let small = Transport::new().send_window(Some(64 * 1024));
        assert_eq!(small.grant_send_window(limits::Grant::Full), 64 * 1024);
        assert_eq!(small.grant_send_window(limits::Grant::Small), 64 * 1024);
        assert_eq!(
            small.grant_send_window(limits::Grant::Minimal),
            limits::MIN_SEND_WINDOW
        );
        let q = format!(
            "{:?}",
            sw.quinn(Duration::from_secs(30), limits::Grant::Full)
        );
        assert!(q.contains("send_window: 16777216"), "{q}");
        let q = format!(
            "{:?}",
            sw.quinn(Duration::from_secs(30), limits::Grant::Small)
        );
        assert!(
            q.contains(&format!("send_window: {}", limits::SMALL_SEND_WINDOW)),
            "{q}"
        );

        // The engine's budget: its light connection is the transport's.
        let base = cfg(Tuning::default()).max_memory(Some(1 << 30));
        let b0 = base.budget().unwrap();
        let wide = base.clone().transport(
            Transport::new()
                .stream_window(64 * 1024)
                .datagram_receive_buffer(Some(64 * 1024)),
        );
        let b1 = wide.budget().unwrap();
        assert_eq!(b0.hard(), b1.hard());
        assert_eq!(b0.light_places() as u64, b0.admit() / d.light());
        let light = wide.transport.light();
        assert_eq!(light, limits::CONN_STATE + 3 * 64 * 1024 + 3 * 64 * 1024);
        assert_eq!(b1.light_places() as u64, b1.admit() / light);
        assert!(b1.light_places() < b0.light_places());
        assert!(wide.places() < base.places());
    }

    /// The steering byte follows the QUIC-LB server ID's length.
    #[test]
    fn steering_offset_follows_the_server_id() {
        use crate::lb::{LbConfig, QuicLb, ServerId};
        assert_eq!(
            cfg(Tuning::default()).steering(),
            fastudp_io::Steering::QuicCid
        );
        for (sid, index) in [("01", 2), ("0102", 3), (&"ab".repeat(15)[..], 16)] {
            let id = ServerId::parse_hex(sid).unwrap();
            let c = LbConfig::new(0, id.as_bytes().len(), 4).unwrap();
            let lb = QuicLb::new(c, id).unwrap();
            assert_eq!(
                cfg(Tuning::default()).quic_lb(Some(lb)).steering(),
                fastudp_io::Steering::QuicCidAt { index }
            );
        }
    }
}
