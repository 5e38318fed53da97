#!/usr/bin/env bash
# The cost of `quic serve --metrics` on the hot path (docs/BENCHMARKS.md,
# section 24): the server's CPU per HTTP/3 request, small responses, with
# and without the metrics listener scraped every 100 ms (150 times as often
# as Prometheus' default 15 s), and against a build without the metrics
# (BASE=path to its fastudp; optional) for the counting every build does.
#
#   scripts/metrics-cost.sh [ROUNDS]     (default 2; each round runs every arm;
#                                        BIN, BASE, DURATION (15s) from the environment)
#
# The server runs with one worker on CPU 0, the load generator on CPU 1:
# `quic load --duration 15s --connections 200 --request /bytes/1000
# --request-every 20ms` (up to 10,000 requests/s over HTTP/3). CPU is the
# server process's utime+stime (/proc/PID/stat) over the load; the figure
# is CPU ms per 1,000 requests answered. Needs curl for the scrapes.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
bin=${BIN:-target/release/fastudp}
base=${BASE:-}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
command -v curl >/dev/null || { echo "metrics-cost.sh: needs curl" >&2; exit 1; }
tck=$(getconf CLK_TCK)

run() { # label binary metrics(0|1)
  local label=$1 b=$2 m=$3 args=()
  [ "$m" = 1 ] && args=(--metrics 127.0.0.1:0)
  # /bytes/N is a test endpoint (opt-in since --test-endpoints exists).
  if "$b" quic serve --help | grep -- --test-endpoints >/dev/null; then args+=(--test-endpoints); fi
  taskset -c 0 "$b" quic serve --listen 127.0.0.1:0 --workers 1 --json "${args[@]}" >"$tmp/srv" 2>"$tmp/srv.err" &
  local pid=$!
  for _ in $(seq 100); do grep -q '"listening"' "$tmp/srv" && break; sleep 0.1; done
  local addr url=
  addr=$(sed -n 's/.*"addr":"\([^"]*\)".*"kind":"listening".*/\1/p' "$tmp/srv" | head -1)
  local scraper=
  if [ "$m" = 1 ]; then
    for _ in $(seq 100); do grep -q '"kind":"metrics"' "$tmp/srv" && break; sleep 0.1; done
    url=$(sed -n 's/.*"url":"\([^"]*\)".*/\1/p' "$tmp/srv" | head -1)
    (while true; do curl -s -o /dev/null "$url"; sleep 0.1; done) &
    scraper=$!
  fi
  local c0 c1
  c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  taskset -c 1 "$b" quic load "$addr" --duration "${DURATION:-15s}" --connections 200 --request /bytes/1000 \
    --request-every 20ms --probe-every 0 --json >"$tmp/load"
  c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  [ -n "$scraper" ] && kill "$scraper"
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  local ok
  ok=$(sed -n 's/.*"requests_ok":\([0-9]*\).*/\1/p' "$tmp/load")
  awk -v l="$label" -v t=$((c1 - c0)) -v hz="$tck" -v n="$ok" \
    'BEGIN { printf "%-28s %8d requests  %7.1f CPU ms  %6.3f CPU ms per 1000 requests\n", l, n, t*1000/hz, t*1000/hz/n*1000 }'
}

for r in $(seq "$rounds"); do
  echo "round $r"
  [ -n "$base" ] && run "base (no metrics build)" "$base" 0
  run "metrics off" "$bin" 0
  run "metrics on, scraped 10/s" "$bin" 1
done
