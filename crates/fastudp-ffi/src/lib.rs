//! # libfastudp: the C ABI of fastudp
//!
//! This crate builds `libfastudp.so` and `libfastudp.a` for C and C++
//! programs (`scripts/capi.sh install` renames and installs them with
//! `fastudp.h` and `fastudp.pc`). The header, `include/fastudp.h` at the
//! repository root, is generated from this crate by cbindgen and checked
//! in; `tests/it/header.rs` fails when it differs from what the code says.
//!
//! The rules every function follows:
//! - it returns a [`fastudp_result`]: `FASTUDP_OK` (0) or an error code,
//!   which [`fastudp_strerror`](abi::fastudp_strerror) names and
//!   [`fastudp_last_error`](abi::fastudp_last_error) details (errno,
//!   transmit index, a sentence); the exceptions are `fastudp_strerror`
//!   and `fastudp_version`, which cannot fail and return a string;
//! - a panic never crosses the boundary: it becomes `FASTUDP_ERR_PANIC`,
//!   prints nothing, and leaves its message and place in the last error;
//! - nothing is printed: a failed allocation is `FASTUDP_ERR_NO_MEMORY`;
//! - every pointer is checked for NULL and every length against what it
//!   describes, and each pointer's ownership is documented.
//!
//! The crate keeps `unsafe` in one module, [`abi`]: the exported functions,
//! which read and write the caller's memory (`#![deny(unsafe_code)]`
//! everywhere else). [`types`] holds the C structures and [`result`] the
//! error codes and the per-thread last error.

#![deny(missing_docs)]
#![deny(unsafe_code)]
// Every `unsafe` block says why it is sound, in a `// SAFETY:` comment.
#![deny(clippy::undocumented_unsafe_blocks)]

// The repository's README: its Rust example runs as a doctest here (this
// crate depends on fastudp and is not published, so the path outside the
// crate is fine).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;

#[allow(unsafe_code)]
pub mod abi;
pub mod result;
pub mod types;

pub use result::fastudp_result;

/// Major version of the library (`FASTUDP_VERSION_MAJOR`).
pub const FASTUDP_VERSION_MAJOR: u32 = 0;
/// Minor version of the library (`FASTUDP_VERSION_MINOR`).
pub const FASTUDP_VERSION_MINOR: u32 = 1;
/// Patch version of the library (`FASTUDP_VERSION_PATCH`).
/// (`FASTUDP_VERSION_STRING`, the version as a string, is written into the
/// header from the package version by `tests/it/header.rs`: cbindgen exports
/// no string constants.)
pub const FASTUDP_VERSION_PATCH: u32 = 0;
/// The version as one number, `major * 10000 + minor * 100 + patch`
/// (`FASTUDP_VERSION_NUMBER`), for `#if` tests.
pub const FASTUDP_VERSION_NUMBER: u32 =
    FASTUDP_VERSION_MAJOR * 10000 + FASTUDP_VERSION_MINOR * 100 + FASTUDP_VERSION_PATCH;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_macros_follow_the_package_version() {
        // The header's macros are these constants: a version bump in
        // Cargo.toml must be carried here (and the header regenerated).
        let v: Vec<u32> = env!("CARGO_PKG_VERSION")
            .split(['.', '-'])
            .take(3)
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(
            v,
            [
                FASTUDP_VERSION_MAJOR,
                FASTUDP_VERSION_MINOR,
                FASTUDP_VERSION_PATCH
            ]
        );
    }
}
