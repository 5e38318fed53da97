#!/usr/bin/env bash
# The workspace against the newest semver-compatible dependencies, as a
# new project that depends on fastudp-io or fastudp-quic resolves them
# (Cargo.lock pins older ones, so CI would not otherwise see, for example,
# a deprecation in a new rustls):
#
#   scripts/newest-deps.sh
#
# The workspace is copied (without target/ and .git) to
# $FASTUDP_NEWEST_DEPS_DIR/src (default ~/.cache/fastudp/newest-deps/src), `cargo update` resolves every dependency to its
# newest compatible release there (the vendored quinn-proto stays patched
# in through [patch.crates-io]), and then, with every warning of the
# workspace's crates an error:
#   - clippy over the workspace, every target (`-D warnings` applies to
#     the workspace's crates only: the vendored quinn-proto,
#     third_party/quinn-proto, is upstream's code, whose warnings with a
#     newer rustls are upstream's to fix; they are shown, not fatal);
#   - fastudp-quic's doc examples (`doc(test(attr(deny(warnings))))`),
#     what an embedder copies;
#   - the unit tests of fastudp-io and fastudp-quic.
# The build directory ($FASTUDP_NEWEST_DEPS_DIR/target) is kept between runs:
# the first run builds everything (about 15 min on 2 CPUs), later ones
# only what changed. Needs the crates.io index (network).
set -euo pipefail
cd "$(dirname "$0")/.."

root=$PWD
# Outside the clone, so that its build directory (about 2 GB) outlives a
# fresh checkout, as a CI cache would: FASTUDP_NEWEST_DEPS_DIR, or
# ~/.cache/fastudp/newest-deps.
scratch=${FASTUDP_NEWEST_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fastudp/newest-deps}
mkdir -p "$scratch"
# A fresh copy of the sources every run; the build directory stays.
rm -rf "$scratch/src"
mkdir -p "$scratch/src"
tar -C "$root" --exclude=./target --exclude=./.git --exclude=./fuzz/target \
    --exclude=./tools/quic-go-client/bin -cf - . | tar -C "$scratch/src" -xf -

cd "$scratch/src"
# The newest releases even where they need a newer Rust than the
# workspace's rust-version (resolver 3 would otherwise hold them back), as
# a project without a rust-version gets them.
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=allow
cargo update 2>&1 | sed 's/^/newest-deps: /'
echo "newest-deps: resolved:"
cargo tree -e normal --depth 1 -p fastudp-quic 2>/dev/null | sed 's/^/newest-deps:   /' || true

export CARGO_TARGET_DIR=$scratch/target
cargo clippy --workspace --all-targets -- -D warnings
cargo test -p fastudp-quic --doc
cargo test -p fastudp-io --lib
cargo test -p fastudp-quic --lib
echo "newest-deps: ok (clippy -D warnings, fastudp-quic's doc examples, fastudp-io and fastudp-quic unit tests)"
