//! What the fuzz targets share: a reader for structured inputs, and the
//! CLI's parsers.
//!
//! The CLI is a binary crate, so its parsers cannot be imported. The
//! modules below compile the CLI's own source files (`#[path]`), laid out
//! as in the CLI so that their `crate::` and `super::` paths resolve: one
//! copy of the code, and a parser file that grows a dependency on the rest
//! of the CLI breaks this build (and `scripts/fuzz.sh`) at once.

pub mod engine;
pub mod host;
pub mod input;
pub mod stream;
