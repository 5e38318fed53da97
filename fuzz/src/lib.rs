//! What the fuzz targets share: a reader for structured inputs, and the
//! CLI's parsers.
//!
//! The CLI is a binary crate, so its parsers cannot be imported. The
//! modules below compile the CLI's own source files (`#[path]`), laid out
//! as in the CLI so that their `crate::` and `super::` paths resolve: one
//! copy of the code, and a parser file that grows a dependency on the rest
//! of the CLI breaks this build (and `scripts/fuzz.sh`) at once.

// The CLI's errors (`usage!`, `bail_usage!`), which the parsers use; its
// macros are defined before the modules that use them.
#[macro_use]
#[path = "../../crates/fastudp-cli/src/failure.rs"]
pub mod failure;
pub mod engine;
pub mod host;
pub mod input;
pub mod stream;

/// What `failure.rs` needs of the CLI's `interrupt` module.
pub mod interrupt {
    /// The exit status after Ctrl-C.
    pub const EXIT_STATUS: u8 = 130;
}
