#!/usr/bin/env bash
# The reverse-proxy comparison of docs/BENCHMARKS.md ("The HTTP/3 front
# door against Caddy"): `fastudp quic serve --upstream` and Caddy's
# `reverse_proxy` (HTTP/3 on), each pinned to one core with taskset, in
# front of the same HTTP/1.1 upstream (Caddy's `file-server`, plain HTTP
# on loopback), loaded over HTTP/3 by quic-go's client
# (tools/quic-go-client/filebench, `load -proto h3`):
#   (a) 1 KB responses: requests per proxy CPU-second;
#   (b) 100 MB responses: proxy CPU-seconds per Gbit.
# The proxy's CPU time is its utime + stime from /proc/PID/stat over the
# load. Rounds interleave the two proxies (fastudp, Caddy, fastudp, ...).
#
# Caddy v2.11.9 is built from the Go module proxy when missing, into
# ~/.cache/fastudp/caddy-v2.11.9/caddy (a main.go calling caddycmd.Main
# with the standard modules).
#
#   scripts/proxy-bench.sh [--rounds N] [--seconds S] [--build-only]
#
# Environment: FASTUDP (default target/release/fastudp), CADDY (default
# the cached build), PROXY_CPU (default 1), LOAD_CPU (default 0),
# CONNECTIONS (default 16 for 1 KB; 2 for 100 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
CADDY_VERSION=v2.11.9
rounds=3
seconds=10
build_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    *) echo "proxy-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done

go=$(command -v go || true)
[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
cache=${XDG_CACHE_HOME:-$HOME/.cache}/fastudp/caddy-$CADDY_VERSION
CADDY=${CADDY:-$cache/caddy}

build_caddy() {
  if [ -x "$CADDY" ]; then return; fi
  if [ -z "$go" ]; then
    echo "proxy-bench: no Go toolchain to build Caddy (scripts/build-quic-go-client.sh says how to get one)" >&2
    exit 1
  fi
  mkdir -p "$cache/src"
  cat >"$cache/src/main.go" <<'GO'
// Caddy with its standard modules, as `xcaddy build` makes it.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func main() {
	caddycmd.Main()
}
GO
  (
    cd "$cache/src"
    export GOPROXY=${GOPROXY:-https://proxy.golang.org} GOFLAGS=
    [ -f go.mod ] || "$go" mod init fastudp-bench/caddy >/dev/null 2>&1
    "$go" get "github.com/caddyserver/caddy/v2@$CADDY_VERSION"
    "$go" mod tidy
    tmp=$(mktemp "$cache/caddy.XXXXXX")
    "$go" build -trimpath -o "$tmp" .
    mv "$tmp" "$CADDY"
  )
  "$CADDY" version
}

build_caddy
[ "$build_only" = 1 ] && exit 0

FASTUDP=${FASTUDP:-${CARGO_TARGET_DIR:-target}/release/fastudp}
FILEBENCH=${FILEBENCH:-${CARGO_TARGET_DIR:-target}/quic-go-filebench}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
[ -x "$FASTUDP" ] || { echo "proxy-bench: no $FASTUDP (cargo build --release -p fastudp-cli)" >&2; exit 1; }
if [ ! -x "$FILEBENCH" ]; then
  scripts/build-quic-go-client.sh >/dev/null
  FILEBENCH=${CARGO_TARGET_DIR:-target}/quic-go-filebench
fi

work=$(mktemp -d /tmp/proxy-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The upstream's files, and the load's lists of them (the same names and
# sizes: the client fetches /NAME from the proxy).
mkdir -p "$work/www" "$work/small" "$work/big"
head -c 1024 /dev/urandom >"$work/www/1k.bin"
head -c 100000000 /dev/urandom >"$work/www/100m.bin"
ln "$work/www/1k.bin" "$work/small/1k.bin"
ln "$work/www/100m.bin" "$work/big/100m.bin"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$work/key.pem" -out "$work/cert.pem" -days 2 -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port)
fastudp_port=$(free_port)
caddy_port=$(free_port)

# The upstream: Caddy's file server over plain HTTP/1.1, on the load's core.
taskset -c "$LOAD_CPU" "$CADDY" file-server --listen "127.0.0.1:$up_port" --root "$work/www" \
  >"$work/upstream.log" 2>&1 &
pids+=($!)

cat >"$work/Caddyfile" <<CADDY
{
	admin off
	persist_config off
	auto_https off
	default_sni localhost
	servers {
		protocols h1 h2 h3
	}
}
https://:$caddy_port {
	tls $work/cert.pem $work/key.pem
	reverse_proxy 127.0.0.1:$up_port
}
CADDY
taskset -c "$PROXY_CPU" "$CADDY" run --config "$work/Caddyfile" --adapter caddyfile \
  >"$work/caddy.log" 2>&1 &
caddy_pid=$!
pids+=($caddy_pid)

taskset -c "$PROXY_CPU" "$FASTUDP" quic serve --listen "127.0.0.1:$fastudp_port" --workers 1 \
  --cert "$work/cert.pem" --key "$work/key.pem" --upstream "http://127.0.0.1:$up_port" \
  >"$work/fastudp.log" 2>&1 &
fastudp_pid=$!
pids+=($fastudp_pid)

# Waits until a proxy answers a request for /1k.bin over HTTP/3.
ready() {
  for _ in $(seq 100); do
    if "$FILEBENCH" load -proto h3 -dir "$work/small" -connections 1 -duration 300ms -insecure \
      "https://127.0.0.1:$1" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  echo "proxy-bench: nothing answers on port $1" >&2
  cat "$work"/*.log >&2
  exit 1
}
ready "$fastudp_port"
ready "$caddy_port"

# CPU seconds (user + system) of a process so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

# One measurement: NAME PID PORT DIR CONNECTIONS -> a JSON line.
measure() {
  local name=$1 pid=$2 port=$3 dir=$4 conns=$5
  local c0 c1 out
  c0=$(cpu_s "$pid")
  # The client exits 1 when no response completed too (a 100 MB one may
  # not, in a short run): only errors fail the measurement.
  out=$(taskset -c "$LOAD_CPU" "$FILEBENCH" load -proto h3 -dir "$dir" -connections "$conns" \
    -duration "${seconds}s" -insecure "https://127.0.0.1:$port") || true
  c1=$(cpu_s "$pid")
  if ! python3 -c 'import json,sys; o=json.loads(sys.argv[1]); sys.exit(o["errors"] != 0 or o["bytes"] == 0)' "$out" 2>/dev/null; then
    echo "proxy-bench: $name: the load failed: $out" >&2
    exit 1
  fi
  python3 - "$name" "$c0" "$c1" "$out" <<'PY'
import json, sys
name, c0, c1, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
cpu = c1 - c0
gbit = out["bytes"] * 8 / 1e9
print(json.dumps({
    "proxy": name,
    "connections": out["connections"],
    "seconds": round(out["seconds"], 2),
    "completed": out["completed"],
    "errors": out["errors"],
    "gbit": round(gbit, 3),
    "proxy_cpu_s": round(cpu, 2),
    "req_per_cpu_s": round(out["completed"] / cpu, 1) if cpu > 0 else None,
    "cpu_s_per_gbit": round(cpu / gbit, 3) if gbit > 0 else None,
}))
PY
}

echo "# fastudp: $("$FASTUDP" --version 2>/dev/null || echo "$FASTUDP"); caddy: $("$CADDY" version | cut -d' ' -f1)"
echo "# proxy on CPU $PROXY_CPU, load and upstream on CPU $LOAD_CPU, $rounds rounds of ${seconds}s"
for r in $(seq "$rounds"); do
  for p in fastudp caddy; do
    if [ $p = fastudp ]; then pid=$fastudp_pid port=$fastudp_port; else pid=$caddy_pid port=$caddy_port; fi
    echo "{\"round\":$r,\"size\":\"1k\",\"result\":$(measure $p "$pid" "$port" "$work/small" "${CONNECTIONS:-16}")}"
    echo "{\"round\":$r,\"size\":\"100m\",\"result\":$(measure $p "$pid" "$port" "$work/big" "${CONNECTIONS_BIG:-2}")}"
  done
done
