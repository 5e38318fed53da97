#!/usr/bin/env bash
# The README's test command: every test of the workspace (all targets, all
# features), then one line that counts the tests that skipped and says why.
#
#   scripts/test.sh [more cargo test arguments, e.g. -- quic::]
#
# A test that cannot run here (no root, no aioquic, no io_uring...) prints
# "SKIPPED test: why" and records it (crates/fastudp-test-support) in
# target/test-skips.log, which this script empties first; the count is
# printed even when a test fails. scripts/install-test-deps.sh installs
# what the tests use. Under FASTUDP_REQUIRE_PRIVILEGED_TESTS=1 (CI) a skip
# is a failure instead.
set -uo pipefail
cd "$(dirname "$0")/.."

mkdir -p target
log=$PWD/target/test-skips.log
: >"$log"
export FASTUDP_SKIP_LOG=$log

# The CLI tests run fastudp-quic's axum example as a program
# (tests/it/axum_clients.rs): `cargo test --all-targets` builds examples
# only as test harnesses, so the example's binary is built first (same
# profile and features: only the example itself compiles).
cargo build -p fastudp-quic --example axum --all-features
rc=$?
if [ $rc = 0 ]; then
  cargo test --workspace --all-targets --all-features --no-fail-fast "$@"
  rc=$?
fi

# One line: "N tests skipped: K why; K why; ..." (most frequent first).
n=$(grep -c . "$log" || true)
if [ "$n" = 0 ]; then
  echo "0 tests skipped"
else
  why=$(cut -f2- "$log" | sort | uniq -c | sort -rn |
    awk '{c=$1; $1=""; sub(/^ /, ""); printf "%s%d %s", (NR>1 ? "; " : ""), c, $0}')
  echo "$n tests skipped (list: target/test-skips.log): $why"
fi
exit $rc
