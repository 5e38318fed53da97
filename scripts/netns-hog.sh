#!/usr/bin/env bash
# The library's network-namespace integrity tests, ROUNDS times in a row,
# with a CPU hog pinned to core 0 (root):
#
#   sudo scripts/netns-hog.sh [ROUNDS]      (default 3)
#
# Each round runs `cargo test -p fastudp-io --test it -- netns::` with
# FASTUDP_REQUIRE_PRIVILEGED_TESTS=1, so a skip fails the round. The
# tests check that every datagram is received once and intact, or that
# its loss is counted by a named kernel counter (the veths' tx/rx_dropped,
# the softnet backlog, the socket's RcvbufErrors/InErrors, the sender's
# local drops). A round fails on the first failed test; the script exits
# with the number of failed rounds. The hog is a shell busy loop, killed
# on exit. The tests take /tmp/fastudp-netns.lock per round, so other
# namespace tests on the machine wait rather than collide.
set -u
rounds=${1:-3}
case "$rounds" in
  ''|*[!0-9]*) echo "netns-hog: ROUNDS must be a positive number, not '$rounds'" >&2; exit 2 ;;
esac
[ "$rounds" -ge 1 ] || { echo "netns-hog: ROUNDS must be at least 1" >&2; exit 2; }
cd "$(dirname "$0")/.."
cargo test -p fastudp-io --test it --no-run || exit 2
taskset -c 0 sh -c 'while :; do :; done' &
hog=$!
trap 'kill "$hog" 2>/dev/null' EXIT INT TERM
echo "netns-hog: $rounds rounds, hog pid $hog on cpu 0, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
failed=0
for i in $(seq 1 "$rounds"); do
  echo "== round $i/$rounds $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
  if FASTUDP_REQUIRE_PRIVILEGED_TESTS=1 flock /tmp/fastudp-netns.lock \
       cargo test -q -p fastudp-io --test it -- netns:: --test-threads=2; then
    echo "round $i: passed"
  else
    echo "round $i: FAILED"
    failed=$((failed + 1))
  fi
done
echo "netns-hog: $((rounds - failed)) of $rounds rounds passed"
exit "$failed"
