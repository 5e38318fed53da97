#!/usr/bin/env bash
# What crates.io and docs.rs would see, checked before a release and in CI:
#
#   scripts/publish-check.sh
#
# 1. The library's documentation as docs.rs builds it (all features,
#    `--cfg docsrs`, so each feature-gated item shows its feature), with
#    every rustdoc warning (a broken link, a bad code block) an error.
#    `feature(doc_cfg)` is a nightly feature: RUSTC_BOOTSTRAP=1 lets the
#    stable rustdoc accept it, as docs.rs's nightly does.
# 2. `cargo publish --dry-run` of the publishable crates, fastudp-io and
#    fastudp-quic (fastudp-ffi, fastudp-tools and fastudp-cli, which uses
#    fastudp-tools, are `publish = false`): each is packaged and the
#    package built alone, as crates.io would, fastudp-quic against the
#    packaged library. Any warning of cargo's fails the check.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" \
    cargo doc -p fastudp-io --all-features --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc -p fastudp-io --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc -p fastudp-quic --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc -p fastudp-sys --all-features --no-deps --locked

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# cargo verifies fastudp-quic against the packaged library through a local
# registry, which it unpacks under $CARGO_HOME/registry/src/-<hash>/ (a
# local registry has no host name) and never unpacks again while the
# version is the same: a second run would build it against the first
# run's library. Remove those stale copies first.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for d in "$cargo_home"/registry/src/-*/fastudp-sys-[0-9]* "$cargo_home"/registry/src/-*/fastudp-io-[0-9]* "$cargo_home"/registry/src/-*/fastudp-quic-[0-9]*; do
    [ -d "$d" ] && rm -rf "$d"
done
# --allow-dirty: CI checks a tree that may hold build products.
cargo publish --dry-run --locked --allow-dirty -p fastudp-sys -p fastudp-io -p fastudp-quic 2>&1 | tee "$log"
# Warnings known and explained (docs/DEVELOPMENT.md, "Publishing"); any
# other fails the check:
# - every dry run says it aborts the upload;
# - no repository URL: there is no public repository yet.
known='aborting upload due to dry run|manifest has no documentation, homepage or repository'
if grep '^warning' "$log" | grep -Evq "$known"; then
    echo "publish-check.sh: cargo publish warned (above)" >&2
    exit 1
fi
echo "publish-check.sh: the documentation builds clean and the crates package and build"
