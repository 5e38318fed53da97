//! A QUIC server engine on fastudp.
//!
//! The engine runs one worker per core on a `SO_REUSEPORT` group steered by
//! QUIC connection ID, receives in batches with GRO, sends every
//! connection's packets in as few `sendmmsg` calls as it can, paces, and
//! bounds everything a client can make it hold. Applications (hq-interop,
//! HTTP/3, static files, or your own) sit on top of it.
//!
//! # Shape
//!
//! - [`Engine`] runs the workers: [`Engine::start`] with an
//!   [`EngineConfig`] and an [`app::Application`], [`Engine::stop`] and
//!   [`Engine::join`] to end. It reads no host state and prints nothing:
//!   what it decided (the pacing in force, a zerocopy fallback) it says
//!   through its methods, and what it counts is in [`Counters`] (live)
//!   and [`Stats`] (a snapshot: [`Engine::stats`]).
//! - Each worker owns a socket of the group, a quinn-proto endpoint, its
//!   connections and their timers. A client's datagrams reach the worker
//!   that owns its connection: connection IDs start with the worker's
//!   index, and the group's BPF program steers on that byte
//!   ([`fastudp_io::Steering::QuicCid`]; with QUIC-LB, [`lb`], the byte
//!   after the server ID: [`fastudp_io::Steering::QuicCidAt`]); a
//!   datagram steered elsewhere is handed over through a fixed ring, or
//!   dropped and counted.
//! - The application ([`app`]) is called synchronously on the worker
//!   thread that owns the connection, with its events, and acts through
//!   an [`app::AppCx`]; [`app::AppCx::waker`] has the connection driven
//!   again from any thread, ending the worker's wait at once.
//! - HTTP/3 ([`h3::H3App`]) answers with a synchronous handler (the file
//!   server, the built-in paths) or with any `tower::Service`, an axum
//!   `Router` unchanged ([`h3::H3App::service`]): its futures run on the
//!   worker thread inside a tokio runtime of the worker's, with streaming
//!   request and response bodies, and a panic answers its request 500
//!   (`examples/axum.rs` serves one Router over HTTP/3 and TLS/TCP). [`app::Router`] picks the application by ALPN, so
//!   that several protocols share one port; [`app::hq::HqApp`] serves
//!   hq-interop (HTTP/0.9 over QUIC, as the QUIC interop runner uses).
//! - [`Transport`] is what an embedder configures of QUIC (windows,
//!   streams, keep-alive, send window, DATAGRAM buffers), and
//!   [`AdmissionHook`] its decision on each new client, from its remote
//!   and local addresses, before the handshake holds state
//!   ([`EngineConfig::admission`]). [`Error`] says what stopped the
//!   engine, typed ([`ConfigError`], [`TlsError`], [`SetupStep`],
//!   [`WorkerError`]).
//! - [`limits`] is the memory model: what a connection and a worker may
//!   hold at most, and how many connections a memory budget allows.
//!
//! # Example
//!
//! Serving hq-interop on port 4433 until Ctrl-C would stop the process
//! (`examples/embed.rs` is a whole server with an application of its own):
//!
//! ```no_run
//! use fastudp_quic::app::{hq::HqApp, Router};
//! use fastudp_quic::{Engine, EngineConfig};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A TLS 1.3 configuration with the server's certificate (here a
//! // self-signed one); the engine sets its ALPN protocols from the
//! // application.
//! let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
//! let key = rustls::pki_types::PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der());
//! let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
//!     rustls::crypto::aws_lc_rs::default_provider(),
//! ))
//! .with_protocol_versions(&[&rustls::version::TLS13])?
//! .with_no_client_auth()
//! .with_single_cert(vec![cert.cert.der().clone()], key.into())?;
//! let tls = Arc::new(tls);
//! let app = Router::new().with(b"hq-interop", HqApp::default());
//! let engine = Engine::start(EngineConfig::new("[::]:4433".parse()?, tls), Arc::new(app))?;
//! println!("listening on {}", engine.local_addr());
//! std::thread::sleep(std::time::Duration::from_secs(60));
//! engine.stop();
//! engine.join()?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod admission;
#[cfg(feature = "h3")]
pub mod altsvc;
pub mod app;
mod cid;
mod config;
mod engine;
pub mod files;
mod forward;
#[cfg(feature = "h3")]
pub mod h3;
pub mod hq;
pub mod lb;
pub mod limits;
mod slots;
mod stats;
mod tx;
mod worker;

pub use admission::{Admission, AdmissionHook, Decision};
pub use config::{
    ack_every, graded, max_udp_payload, transport, EngineConfig, Pacing, Transport, Tuning,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_UDP_PAYLOAD, DEFAULT_RX_COALESCE, DEFAULT_TIMER_TICK,
    MAX_BIDI_STREAMS, MAX_BUSY_POLL, MAX_CONNECTION_WINDOW, MAX_DATAGRAM_BUFFER, MAX_GSO_PAYLOAD,
    MAX_PACING_BURST, MAX_RX_COALESCE, MAX_SEND_WINDOW, MAX_STREAM_WINDOW, MAX_TIMER_TICK,
    MAX_TRAIN_LIMIT, MAX_UDP_PAYLOAD_LIMIT, MAX_UNI_STREAMS, MIN_DATAGRAM_BUFFER, MIN_PACING_BURST,
    MIN_STREAM_WINDOW,
};
pub use engine::{
    ConfigError, Engine, Error, Monitor, SetupStep, TlsError, WorkerError, MAX_RESTARTS, STOP_WAIT,
};
pub use fastudp_io::pacing::PacingMode;
pub use stats::{status_class, Counters, PerWorker, Stats, WorkerStats};
