//! The engine: binds the reuseport group, sets up pacing, keys and the
//! shared state, and runs one [`crate::worker`] thread per socket.

use crate::app::Application;
use crate::cid::{ring_hmac, WorkerCids};
use crate::config::{EngineConfig, Pacing};
use crate::forward::{Inbox, SLOTS};
use crate::limits;
use crate::stats::{Counters, Stats, WorkerGauges, WorkerStats};
use crate::tx::{send_socket, Tx};
use crate::worker::{ring_receive, Setup, Worker};
use fastudp_io::pacing::{choose_mode, PacingMode};
use fastudp_io::UdpIo;
use fastudp_io::{Config, ReuseportGroup, Socket, ZeroCopySender};
use quinn_proto::{EndpointConfig, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What can stop an engine from starting, or end it.
///
/// Each variant carries what an embedder needs to act on it (which value,
/// which step, which worker) and, where one exists, the error beneath it
/// as its [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is not valid: which value, and why.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS configuration does not suit QUIC.
    #[error("TLS set-up: {0}")]
    Tls(#[from] TlsError),
    /// The listening address cannot be bound.
    #[error("{addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: fastudp_io::Error,
    },
    /// A socket, the random generator or a thread could not be set up:
    /// which step ([`SetupStep`]), and the system's error.
    #[error("{step}: {source}")]
    Setup {
        /// What was being set up.
        step: SetupStep,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A worker stopped on an error (or panicked); the engine stopped.
    #[error("worker {index}: {kind}")]
    Worker {
        /// The worker's index (0 to [`crate::EngineConfig::workers`] - 1).
        index: usize,
        /// What happened to it.
        kind: WorkerError,
    },
}

/// Why the TLS configuration does not suit QUIC: [`Error::Tls`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The configuration's crypto provider has no TLS_AES_128_GCM_SHA256,
    /// the cipher suite QUIC's Initial packets are protected with
    /// (RFC 9001 5.2).
    #[error(
        "the crypto provider has no TLS_AES_128_GCM_SHA256, which QUIC's Initial packets need"
    )]
    NoInitialCipherSuite(#[source] quinn_proto::crypto::rustls::NoInitialCipherSuite),
    /// rustls refuses the configuration for QUIC: it does not offer
    /// TLS 1.3, or its `max_early_data_size` is neither 0 nor
    /// `u32::MAX` (RFC 9001 4.6.1).
    #[error("rustls refuses it for QUIC: {0}")]
    Refused(#[source] rustls::Error),
}

/// The step of [`crate::Engine::start`] that failed: [`Error::Setup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetupStep {
    /// Reading the address the listening sockets were bound to
    /// (`getsockname`).
    LocalAddress,
    /// Making a worker's send socket on this address (bound with
    /// `SO_REUSEPORT` to the listening address).
    SendSocket(SocketAddr),
    /// Turning on `SO_TXTIME` on the send sockets (kernel pacing).
    Txtime,
    /// Drawing the keys from the system's random generator.
    Random,
    /// Starting a worker thread.
    Thread,
}

impl std::fmt::Display for SetupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupStep::LocalAddress => f.write_str("getsockname"),
            SetupStep::SendSocket(a) => write!(f, "send socket on {a}"),
            SetupStep::Txtime => f.write_str("SO_TXTIME"),
            SetupStep::Random => f.write_str("the system random generator"),
            SetupStep::Thread => f.write_str("cannot start a worker"),
        }
    }
}

/// What ended a worker: [`Error::Worker`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// Its receive socket or its receive buffers could not be set up.
    #[error("{0}")]
    Io(#[source] std::io::Error),
    /// It panicked more than [`MAX_RESTARTS`] times (application code the
    /// application did not guard), or its thread panicked outside the
    /// loop that restarts it.
    #[error("panicked")]
    Panicked,
}

/// What is wrong with an [`EngineConfig`] (or the application it is
/// started with): [`Error::Config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value is out of its range: the field of [`EngineConfig`],
    /// [`crate::Tuning`] or [`crate::Transport`] (`"workers"`,
    /// `"stream_window"`, ...), and the whole message, which starts with
    /// the field's name, its value and the range
    /// (`"workers 0: between 1 and 256"`).
    #[error("{reason}")]
    OutOfRange {
        /// The field's name.
        field: &'static str,
        /// What is wrong, said plainly.
        reason: String,
    },
    /// The memory budget does not hold the workers and one connection
    /// ([`EngineConfig::max_memory`]).
    #[error(transparent)]
    Budget(#[from] limits::BudgetError),
    /// The application names no ALPN protocol
    /// ([`crate::app::Application::alpn`]).
    #[error("the application names no ALPN protocol")]
    NoAlpn,
    /// [`EngineConfig::uring`] asked for io_uring, and the crate was built
    /// without its `uring` feature.
    #[error("uring: fastudp-quic was built without its `uring` feature")]
    UringUnavailable,
}

/// A running QUIC server: one worker thread per socket of a reuseport
/// group, until [`Engine::stop`] (or until it is dropped).
pub struct Engine {
    threads: Vec<JoinHandle<Result<(), Error>>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    gauges: Arc<Vec<WorkerGauges>>,
    failed: Arc<AtomicBool>,
    local_addr: SocketAddr,
    pacing: (PacingMode, String),
    zerocopy_error: Option<String>,
    uring_error: Arc<Mutex<Option<String>>>,
    budget: Arc<limits::Budget>,
    per_address: Arc<limits::PerAddress>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("local_addr", &self.local_addr)
            .field("workers", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Binds the address and starts the workers, serving `app`.
    pub fn start(cfg: EngineConfig, app: Arc<dyn Application>) -> Result<Engine, Error> {
        cfg.check()?;
        let n = cfg.workers;
        let max_connections = cfg.max_connections;
        let per_address = Arc::new(limits::PerAddress::new(cfg.per_ip()));
        let budget = Arc::new(
            cfg.budget()
                .map_err(|e| Error::Config(ConfigError::Budget(e)))?,
        );
        let server = server_config(&cfg, app.as_ref())?;
        let graded: Vec<Arc<ServerConfig>> = [limits::Grant::Small, limits::Grant::Minimal]
            .into_iter()
            .map(|g| {
                let mut s = (*server).clone();
                s.transport_config(Arc::new(transport(&cfg, g)));
                Arc::new(s)
            })
            .collect();
        let graded = Arc::new(graded);
        let (group, addr, txs) = bind(&cfg)?;
        let (pacing, why) = choose_pacing(&cfg, &txs)?;

        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let drain = Arc::new(AtomicBool::new(false));
        let gauges: Arc<Vec<WorkerGauges>> =
            Arc::new((0..n).map(|_| WorkerGauges::default()).collect());
        let failed = Arc::new(AtomicBool::new(false));
        let inboxes: Arc<Vec<Inbox>> = Arc::new((0..n).map(|_| Inbox::new(SLOTS)).collect());
        let reset_key = Arc::new(match &cfg.reset_key {
            Some(k) => k.hmac_key(),
            None => ring_hmac(&random_key::<64>()?),
        });
        let lb = cfg.quic_lb.clone().map(Arc::new);
        let cid_fallback = Arc::new((
            ring_hmac(&random_key::<32>()?),
            std::sync::atomic::AtomicU64::new(0),
        ));
        let mut zerocopy_error = None;
        let uring_error = Arc::new(Mutex::new(None));
        let mut handles = Vec::with_capacity(n);
        for (i, (rx, tx)) in group.into_sockets().into_iter().zip(txs).enumerate() {
            let ep = endpoint_config(i, n, reset_key.clone(), cid_fallback.clone(), lb.clone());
            let zc = if cfg.zerocopy {
                match ZeroCopySender::new(&tx) {
                    Ok(z) => Some(z),
                    Err(e) => {
                        zerocopy_error.get_or_insert(e.to_string());
                        None
                    }
                }
            } else {
                None
            };
            let tx = Tx::new(
                tx,
                zc,
                counters.clone(),
                cfg.total_rate.map(|r| r as f64 / n as f64),
                cfg.tuning.pacing_burst,
                cfg.tuning.max_train,
            )?;
            let setup = Setup {
                id: i,
                workers: n,
                local: addr,
                steering: cfg.steering(),
                server: server.clone(),
                graded: graded.clone(),
                endpoint: Arc::new(ep),
                inboxes: inboxes.clone(),
                counters: counters.clone(),
                stop: stop.clone(),
                drain: drain.clone(),
                gauges: gauges.clone(),
                failed: failed.clone(),
                pacing,
                retry: cfg.retry,
                max_connections,
                max_half_open: cfg.max_half_open,
                per_address: per_address.clone(),
                idle_timeout: cfg.idle_timeout,
                transport: cfg.transport.clone(),
                admission: cfg.admission.clone(),
                budget: budget.clone(),
                app: app.clone(),
                total_rate: cfg.total_rate,
                recv_arena: cfg.tuning.recv_arena,
                trains_per_turn: cfg.tuning.trains_per_turn,
                timer_tick: cfg.tuning.timer_tick,
                busy_poll: cfg.tuning.busy_poll,
                rx_coalesce: cfg.tuning.rx_coalesce,
                uring: cfg.uring && ring_receive(&rx, &counters, &uring_error),
                uring_error: uring_error.clone(),
            };
            match spawn_worker(i, setup, rx, tx) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The workers started so far stop before the error
                    // is returned.
                    stop.store(true, Relaxed);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(Error::Setup {
                        step: SetupStep::Thread,
                        source: e,
                    });
                }
            }
        }
        Ok(Engine {
            threads: handles,
            counters,
            stop,
            drain,
            gauges,
            failed,
            local_addr: addr,
            pacing: (pacing, why),
            zerocopy_error,
            uring_error,
            budget,
            per_address,
        })
    }

    /// The memory budget over what connections hold, live.
    pub fn budget(&self) -> &limits::Budget {
        &self.budget
    }

    /// Connections one client address may hold at most.
    pub fn per_ip(&self) -> usize {
        self.per_address.max()
    }

    /// The address the engine listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// The engine's counters, live.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// The engine's counters now, as plain numbers.
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// The pacing in force, and why (for [`Pacing::Kernel`]: whether the
    /// qdisc honours `SCM_TXTIME`, or why the engine fell back).
    pub fn pacing(&self) -> (PacingMode, &str) {
        (self.pacing.0, &self.pacing.1)
    }

    /// Why `MSG_ZEROCOPY` is not used although the configuration asked
    /// for it: the engine sends with copies then.
    pub fn zerocopy_error(&self) -> Option<&str> {
        self.zerocopy_error.as_deref()
    }

    /// Why a worker receives with syscalls although the configuration
    /// asked for io_uring ([`EngineConfig::uring`]): the first refusal
    /// seen, when the sockets were set up or later; how many workers fell
    /// back is [`Counters::uring_fallbacks`].
    pub fn uring_error(&self) -> Option<String> {
        self.uring_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A worker stopped on an error: the engine should be stopped, and
    /// [`Engine::join`] says why.
    pub fn failed(&self) -> bool {
        self.failed.load(Relaxed)
    }

    /// Each worker's own figures, as it last published them (about every
    /// 100 ms), in worker order.
    pub fn worker_stats(&self) -> Vec<WorkerStats> {
        self.gauges.iter().map(WorkerGauges::snapshot).collect()
    }

    /// A view of the engine's figures that another thread can keep (a
    /// metrics endpoint's).
    pub fn monitor(&self) -> Monitor {
        Monitor {
            counters: self.counters.clone(),
            budget: self.budget.clone(),
            gauges: self.gauges.clone(),
            drain: self.drain.clone(),
        }
    }

    /// Starts a graceful drain and returns at once. From the workers'
    /// next turn:
    /// - new connections are refused (quinn-proto's `CONNECTION_REFUSED`),
    ///   and counted in [`Counters::refused_draining`];
    /// - each connection's application is told ([`crate::app::ConnApp::on_drain`]:
    ///   HTTP/3 sends GOAWAY, and refuses requests past it; hq-interop
    ///   refuses new requests), and its requests under way go on;
    /// - a connection whose application has nothing under way
    ///   ([`crate::app::ConnApp::drained`]) and whose responses are all
    ///   acknowledged is closed (code 0), counted in [`Counters::drained`].
    ///
    /// The drain is over when [`Counters::connections`] is 0; the embedder
    /// decides how long to wait, then calls [`Engine::stop`] for what is
    /// left.
    pub fn drain(&self) {
        self.drain.store(true, Relaxed);
    }

    /// Whether [`Engine::drain`] was called.
    pub fn draining(&self) -> bool {
        self.drain.load(Relaxed)
    }

    /// Asks every worker to close its connections (within about a second,
    /// under any load) and stop. Returns at once; [`Engine::join`] waits.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// Waits for the workers to end (after [`Engine::stop`], or a failure).
    /// The error of a worker that failed, if one did.
    pub fn join(mut self) -> Result<(), Error> {
        let mut err = None;
        for (i, h) in std::mem::take(&mut self.threads).into_iter().enumerate() {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = Some(e),
                Err(_) => {
                    err = Some(Error::Worker {
                        index: i,
                        kind: WorkerError::Panicked,
                    })
                }
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A running engine's figures, read from any thread: its [`Counters`],
/// its memory budget, each worker's [`WorkerStats`], and whether it
/// drains. Cheap to clone; it may outlive the engine (the figures then
/// stay as they ended).
#[derive(Debug, Clone)]
pub struct Monitor {
    counters: Arc<Counters>,
    budget: Arc<limits::Budget>,
    gauges: Arc<Vec<WorkerGauges>>,
    drain: Arc<AtomicBool>,
}

impl Monitor {
    /// The engine's counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// [`Engine::stats`].
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// The memory budget (held, peak, bounds).
    pub fn budget(&self) -> &limits::Budget {
        &self.budget
    }

    /// [`Engine::worker_stats`].
    pub fn worker_stats(&self) -> Vec<WorkerStats> {
        self.gauges.iter().map(WorkerGauges::snapshot).collect()
    }

    /// [`Engine::draining`].
    pub fn draining(&self) -> bool {
        self.drain.load(Relaxed)
    }
}

impl Drop for Engine {
    /// An engine dropped without [`Engine::join`] stops its workers; they
    /// end on their own within [`STOP_WAIT`].
    fn drop(&mut self) {
        self.stop();
    }
}

/// The QUIC server configuration: the application's ALPN protocols on the
/// TLS configuration, the transport, and the bounds on connections not yet
/// accepted.
fn server_config(cfg: &EngineConfig, app: &dyn Application) -> Result<Arc<ServerConfig>, Error> {
    let alpn = app.alpn();
    if alpn.is_empty() {
        return Err(Error::Config(ConfigError::NoAlpn));
    }
    let mut tls = (*cfg.tls).clone();
    tls.alpn_protocols = alpn;
    let tls = Arc::new(tls);
    // What rustls would refuse at each handshake (a configuration without
    // TLS 1.3), refused once here instead.
    rustls::quic::ServerConnection::new(tls.clone(), rustls::quic::Version::V1, Vec::new())
        .map_err(TlsError::Refused)?;
    let crypto = quinn_proto::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(TlsError::NoInitialCipherSuite)?;
    let mut server = ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(Arc::new(transport(cfg, limits::Grant::Full)));
    // Memory held for connections not yet accepted stays small whatever a
    // flood of Initials does.
    server.max_incoming(4096);
    server.incoming_buffer_size(64 * 1024);
    server.incoming_buffer_size_total(limits::INCOMING_BUFFER);
    Ok(Arc::new(server))
}

/// The transport configuration of a connection accepted with grant `g`.
fn transport(cfg: &EngineConfig, g: limits::Grant) -> quinn_proto::TransportConfig {
    let mut transport = cfg.transport.quinn(cfg.idle_timeout, g);
    if let Some(n) = cfg.tuning.ack_every {
        crate::ack_every(&mut transport, n);
    }
    crate::max_udp_payload(&mut transport, cfg.tuning.max_udp_payload);
    transport
}

/// The reuseport group of receive sockets on the listening address, the
/// address it got, and one send socket per worker.
fn bind(cfg: &EngineConfig) -> Result<(ReuseportGroup, SocketAddr, Vec<Socket>), Error> {
    let config = Config::default()
        .recv_buffer(4 << 20)
        .disable(cfg.disabled.iter().copied());
    // The receive sockets only: sends stay on syscalls.
    #[cfg(feature = "uring")]
    let config = if cfg.uring {
        config.uring(true).uring_recv_buffers(limits::RING_BUFFERS)
    } else {
        config
    };
    let group = ReuseportGroup::bind(cfg.listen, cfg.workers, cfg.steering(), config).map_err(
        |source| Error::Listen {
            addr: cfg.listen,
            source,
        },
    )?;
    let addr = group.sockets()[0]
        .as_std()
        .local_addr()
        .map_err(|source| Error::Setup {
            step: SetupStep::LocalAddress,
            source,
        })?;
    let mut txs = Vec::with_capacity(cfg.workers);
    for _ in 0..cfg.workers {
        txs.push(send_socket(addr, &cfg.disabled)?);
    }
    Ok((group, addr, txs))
}

/// The pacing in force, and why; `SO_TXTIME` on every send socket when
/// the kernel paces.
fn choose_pacing(cfg: &EngineConfig, txs: &[Socket]) -> Result<(PacingMode, String), Error> {
    let (pacing, why) = match &cfg.pacing {
        Pacing::Quic => (
            PacingMode::User,
            "quinn-proto's pacer, in user space".to_string(),
        ),
        Pacing::Kernel { qdisc } => choose_mode(
            PacingMode::Kernel,
            txs[0].capabilities().supports(fastudp_io::Feature::Txtime),
            qdisc.as_deref(),
        ),
    };
    if pacing == PacingMode::Kernel {
        for s in txs {
            s.enable_txtime(false).map_err(|e| Error::Setup {
                step: SetupStep::Txtime,
                source: e.into(),
            })?;
        }
    }
    Ok((pacing, why))
}

/// `N` bytes from the system random generator.
fn random_key<const N: usize>() -> Result<[u8; N], Error> {
    use ring::rand::SecureRandom;
    let mut k = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut k)
        .map_err(|_| Error::Setup {
            step: SetupStep::Random,
            source: std::io::Error::other("ring's SystemRandom failed"),
        })?;
    Ok(k)
}

/// Worker `i`'s (of `n`) endpoint configuration: QUIC version 1, the
/// shared stateless-reset key, and connection IDs that steer to it (in the
/// QUIC-LB format with `lb`).
pub(crate) fn endpoint_config(
    i: usize,
    n: usize,
    reset_key: Arc<ring::hmac::Key>,
    fallback: Arc<(ring::hmac::Key, std::sync::atomic::AtomicU64)>,
    lb: Option<Arc<crate::lb::QuicLb>>,
) -> EndpointConfig {
    let mut ep = EndpointConfig::new(reset_key);
    // QUIC version 1 only (RFC 9000), not the drafts quinn-proto also
    // speaks by default.
    ep.supported_versions(vec![1]);
    let rng = ring::rand::SystemRandom::new();
    // 256 workers wrap to 0 in a byte: every byte value is then its own
    // worker's, as `byte % 256` says.
    let (w, nn) = (i as u8, n as u8);
    ep.cid_generator(move || {
        Box::new(WorkerCids {
            worker: w,
            workers: nn,
            rng: rng.clone(),
            fallback: fallback.clone(),
            lb: lb.clone(),
        })
    });
    ep
}

/// Starts worker `i`'s thread. A worker that fails (or panics) marks the
/// engine failed: the server stops rather than go on without it.
fn spawn_worker(
    i: usize,
    setup: Setup,
    rx: Socket,
    tx: Tx,
) -> std::io::Result<JoinHandle<Result<(), Error>>> {
    std::thread::Builder::new()
        .name(format!("quic-worker-{i}"))
        .spawn(move || {
            let failed = setup.failed.clone();
            let counters = setup.counters.clone();
            let gauges = setup.gauges.clone();
            let r = run_worker(i, setup, rx, tx, &counters, &gauges);
            if r.is_err() {
                // The server stops rather than go on without a worker.
                failed.store(true, Relaxed);
            }
            r
        })
}

/// Runs worker `i`; a worker whose loop panics (application code the
/// application did not guard) is made again on the same sockets, so that
/// its place in the reuseport group, where the steering sends about 1/N
/// of the connections, keeps being served: its connections are lost, the
/// restart counted in [`Counters::worker_restarts`]. Up to
/// [`MAX_RESTARTS`] times; then the worker ends with an error (and the
/// engine reports [`Engine::failed`]).
fn run_worker(
    i: usize,
    setup: Setup,
    rx: Socket,
    tx: Tx,
    counters: &Counters,
    gauges: &[WorkerGauges],
) -> Result<(), Error> {
    let mut parts = (setup, rx, tx);
    let mut restarts = 0;
    loop {
        let (setup, rx, tx) = parts;
        let mut w = Worker::new(setup, rx, tx)?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run())) {
            Ok(r) => return r,
            Err(_) if restarts < MAX_RESTARTS => {
                restarts += 1;
                counters.worker_restarts.fetch_add(1, Relaxed);
                if let Some(g) = gauges.get(i) {
                    g.restarts.fetch_add(1, Relaxed);
                }
                parts = w.salvage();
            }
            Err(_) => {
                return Err(Error::Worker {
                    index: i,
                    kind: WorkerError::Panicked,
                })
            }
        }
    }
}

/// How often one worker is made again after a panic before it gives up.
pub const MAX_RESTARTS: u32 = 1000;

/// How long [`Engine::stop`] takes at most, about.
pub const STOP_WAIT: Duration = crate::worker::CLOSE_WAIT;
