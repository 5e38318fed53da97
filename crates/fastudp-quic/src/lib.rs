//! A QUIC server engine on fastudp.
//!
//! The engine runs one worker per core on a `SO_REUSEPORT` group steered by
//! QUIC connection ID, receives in batches with GRO, sends every
//! connection's packets in as few `sendmmsg` calls as it can, paces, and
//! bounds everything a client can make it hold. Applications (hq-interop,
//! HTTP/3, static files, or your own) sit on top of it.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod app;
mod cid;
mod config;
mod engine;
pub mod files;
mod forward;
pub mod hq;
pub mod limits;
mod stats;
mod worker;

pub use config::{transport, EngineConfig, Pacing, DEFAULT_MAX_CONNECTIONS};
pub use engine::{Engine, Error, STOP_WAIT};
pub use fastudp::pacing::PacingMode;
pub use stats::Counters;
