#!/usr/bin/env bash
# The application comparison of docs/BENCHMARKS.md ("An axum app over
# HTTP/3"): one axum Router (crates/fastudp-quic/examples/axum.rs) served
#   fastudp  over HTTP/3 on the engine, one worker (example `axum`);
#   quinn    over HTTP/3 on quinn + h3-quinn, one current-thread tokio
#            runtime (example `axum_quinn`, the same Router compiled in);
#   tcp-h1   over TLS/TCP, HTTP/1.1, hyper-util's auto server (the `axum`
#            example's TCP listener: the fastudp process);
#   tcp-h2   the same, HTTP/2;
#   caddy    Caddy v2.11.9's HTTP/3 (quic-go) with a `respond` of the same
#            1 KB document (the server users would pick);
# each server pinned to one core with taskset (SERVER_CPU), loaded by one
# client for all, quic-go-filebench (tools/quic-go-client/filebench: quic-go's
# http3, or Go's net/http over TLS/TCP), pinned to another (LOAD_CPU):
#   (1) small: CONNECTIONS (100) connections, each GETting /json (1,024
#       bytes of JSON from an async handler) one after the other for S
#       seconds: requests per server CPU-second;
#   (2) upload: 10 POSTs of 100 MB to /upload (which SHA-256s the body as
#       a stream and answers `LEN HEX`, checked by the client), one
#       connection, fastudp and quinn: server CPU-seconds per Gbit;
#   (3) wake: while (1)'s load runs, one more connection GETs /sleep (the
#       handler awaits a 1 ms tokio timer) and one more GETs /json:
#       their p50/p99 latency, fastudp and quinn.
# A server's CPU time is its utime + stime from /proc/PID/stat over the
# load. The servers take turns round by round (fastudp, quinn, tcp-h1,
# tcp-h2, caddy, then the uploads, then the wake probes), ROUNDS times;
# every line printed is one JSON measurement, and the last a summary:
# each figure's median over the rounds and the ratios of the medians
# (fastudp's against each other server). The run ends by itself: each
# load is bounded, and a watchdog stops the servers after MAX_SECONDS; the
# servers are stopped and the work directory removed on exit.
#
#   scripts/app-bench.sh [--rounds N] [--seconds S] [--only small|upload|wake]
#
# Environment: BIN (default target/release: the examples are
# BIN/examples/axum and axum_quinn, built by `cargo build --release -p
# fastudp-quic --examples`), FILEBENCH (default target/quic-go-filebench,
# built by scripts/build-quic-go-client.sh when missing), CADDY (default
# the cached build of scripts/proxy-bench.sh, built by it when missing),
# SERVER_CPU (default 1), LOAD_CPU (default 0), CONNECTIONS (default 100),
# STREAM_WINDOW (each request stream's receive window, both HTTP/3
# servers; default 1048576), MAX_SECONDS (default 3600), FASTUDP_ARGS
# (more arguments of the `axum` example, e.g. --recv-arena; default none).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
seconds=10
only=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "app-bench: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $only in ''|small|upload|wake) ;; *) echo "app-bench: --only small, upload or wake" >&2; exit 2 ;; esac

target=${CARGO_TARGET_DIR:-target}
BIN=${BIN:-$target/release}
AXUM=$BIN/examples/axum
AXUM_QUINN=$BIN/examples/axum_quinn
FILEBENCH=${FILEBENCH:-$target/quic-go-filebench}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
CONNECTIONS=${CONNECTIONS:-100}
STREAM_WINDOW=${STREAM_WINDOW:-1048576}
MAX_SECONDS=${MAX_SECONDS:-3600}
for b in "$AXUM" "$AXUM_QUINN"; do
  [ -x "$b" ] || { echo "app-bench: no $b (cargo build --release -p fastudp-quic --examples)" >&2; exit 1; }
done
if [ ! -x "$FILEBENCH" ]; then
  scripts/build-quic-go-client.sh >/dev/null
  FILEBENCH=$target/quic-go-filebench
fi
scripts/proxy-bench.sh --build-only >/dev/null
CADDY=${CADDY:-${XDG_CACHE_HOME:-$HOME/.cache}/fastudp/caddy-v2.11.9/caddy}

work=$(mktemp -d /tmp/app-bench.XXXXXX)
pids=()
watchdog=
cleanup() {
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$work/key.pem" -out "$work/cert.pem" -days 2 -subj /CN=localhost \
  -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
fastudp_port=$(free_port)
quinn_port=$(free_port)
caddy_port=$(free_port)

taskset -c "$SERVER_CPU" "$AXUM" --listen "127.0.0.1:$fastudp_port" --workers 1 \
  --cert "$work/cert.pem" --key "$work/key.pem" --stream-window "$STREAM_WINDOW" \
  ${FASTUDP_ARGS:-} >"$work/fastudp.log" 2>&1 &
fastudp_pid=$!
pids+=($fastudp_pid)
taskset -c "$SERVER_CPU" "$AXUM_QUINN" --listen "127.0.0.1:$quinn_port" \
  --cert "$work/cert.pem" --key "$work/key.pem" --stream-window "$STREAM_WINDOW" \
  >"$work/quinn.log" 2>&1 &
quinn_pid=$!
pids+=($quinn_pid)

# The load's lists: a file named as each path, as long as its answer.
mkdir -p "$work/json" "$work/sleep" "$work/upload"
for _ in $(seq 100); do
  curl -sfk "https://127.0.0.1:$fastudp_port/json" -o "$work/json/json" && break
  sleep 0.2
done
[ "$(stat -c %s "$work/json/json" 2>/dev/null)" = 1024 ] || {
  echo "app-bench: GET /json over TCP did not answer 1,024 bytes" >&2
  cat "$work"/*.log >&2
  exit 1
}
printf slept >"$work/sleep/sleep"
: >"$work/upload/upload"
grep -q '`' "$work/json/json" && { echo "app-bench: the document has a backquote" >&2; exit 1; }

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
	header Content-Type application/json
	respond \`$(cat "$work/json/json")\` 200
}
CADDY
taskset -c "$SERVER_CPU" "$CADDY" run --config "$work/Caddyfile" --adapter caddyfile \
  >"$work/caddy.log" 2>&1 &
caddy_pid=$!
pids+=($caddy_pid)

# The servers stop after MAX_SECONDS whatever happens to this script.
# The watchdog holds none of the script's output open (a pipe reading it
# ends with it), and takes its sleep with it when it is stopped.
(
  exec >/dev/null 2>&1
  sleep "$MAX_SECONDS" &
  sleeper=$!
  trap 'kill "$sleeper"; exit 0' TERM
  wait "$sleeper"
  kill "$fastudp_pid" "$quinn_pid" "$caddy_pid"
) &
watchdog=$!

# The load client: ARGS... -> its JSON line (errors fail the run).
load() {
  local out
  if ! out=$(taskset -c "$LOAD_CPU" "$FILEBENCH" load -insecure "$@"); then
    echo "app-bench: the load failed: $* -> $out" >&2
    exit 1
  fi
  echo "$out"
}

# Waits until a server answers GET /json (FILEBENCH ARGS... URL).
ready() {
  for _ in $(seq 100); do
    if "$FILEBENCH" load -insecure -verify -dir "$work/json" -connections 1 -duration 300ms "$@" \
      >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  echo "app-bench: nothing answers: $*" >&2
  cat "$work"/*.log >&2
  exit 1
}
ready -proto h3 "https://127.0.0.1:$fastudp_port"
ready -proto h3 "https://127.0.0.1:$quinn_port"
ready -proto https "https://127.0.0.1:$fastudp_port"
ready -proto h3 "https://127.0.0.1:$caddy_port"

# CPU seconds (user + system) of a process so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

# NAME -> "PID PROTO-ARGS URL".
server() {
  case $1 in
    fastudp) echo "$fastudp_pid -proto h3 https://127.0.0.1:$fastudp_port" ;;
    quinn) echo "$quinn_pid -proto h3 https://127.0.0.1:$quinn_port" ;;
    tcp-h1) echo "$fastudp_pid -proto https https://127.0.0.1:$fastudp_port" ;;
    tcp-h2) echo "$fastudp_pid -proto https -h2 https://127.0.0.1:$fastudp_port" ;;
    caddy) echo "$caddy_pid -proto h3 https://127.0.0.1:$caddy_port" ;;
  esac
}

# One measurement: ROUND KIND NAME LOAD-ARGS... -> a JSON line.
measure() {
  local round=$1 kind=$2 name=$3
  shift 3
  local pid args c0 c1 out
  read -r pid args <<<"$(server "$name")"
  c0=$(cpu_s "$pid")
  # shellcheck disable=SC2086 # args is words on purpose
  out=$(load "$@" $args)
  c1=$(cpu_s "$pid")
  python3 - "$round" "$kind" "$name" "$c0" "$c1" "$out" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
round_, kind, name, c0, c1, out, load = sys.argv[1:8]
out = json.loads(out)
cpu = float(c1) - float(c0)
r = {"round": int(round_), "kind": kind, "server": name, "proto": out["proto"],
     "connections": out["connections"], "seconds": round(out["seconds"], 2),
     "completed": out["completed"], "errors": out["errors"],
     "server_cpu_s": round(cpu, 2), "loadavg_1m": float(load),
     "p50_ms": out["p50_ms"], "p99_ms": out["p99_ms"]}
if kind == "small":
    r["req_per_s"] = round(out["completed"] / out["seconds"], 1)
    r["req_per_cpu_s"] = round(out["completed"] / cpu, 1) if cpu > 0 else None
else:
    gbit = out["bytes"] * 8 / 1e9
    r["gbit"] = round(gbit, 3)
    r["gbit_per_s"] = round(gbit / out["seconds"], 3)
    r["cpu_s_per_gbit"] = round(cpu / gbit, 3) if gbit > 0 else None
print(json.dumps(r))
PY
}

# The wake probe: while CONNECTIONS connections GET /json, one more GETs
# /sleep and one more GETs /json; NAME -> a JSON line.
wake() {
  local round=$1 name=$2 pid args
  read -r pid args <<<"$(server "$name")"
  # shellcheck disable=SC2086
  {
    load -dir "$work/json" -connections "$CONNECTIONS" -duration "${seconds}s" $args >"$work/bg.json" &
    local bg=$!
    load -dir "$work/sleep" -connections 1 -duration "${seconds}s" $args >"$work/sleep.json" &
    local sl=$!
    load -dir "$work/json" -connections 1 -duration "${seconds}s" $args >"$work/plain.json"
    wait "$bg"
    wait "$sl"
  }
  python3 - "$round" "$name" "$work/bg.json" "$work/sleep.json" "$work/plain.json" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
round_, name, bg, sl, plain, load = sys.argv[1:7]
bg, sl, plain = (json.load(open(f)) for f in (bg, sl, plain))
print(json.dumps({"round": int(round_), "kind": "wake", "server": name,
  "background_connections": bg["connections"], "background_req_per_s": round(bg["completed"] / bg["seconds"], 1),
  "sleep_completed": sl["completed"], "sleep_p50_ms": sl["p50_ms"], "sleep_p99_ms": sl["p99_ms"],
  "json_completed": plain["completed"], "json_p50_ms": plain["p50_ms"], "json_p99_ms": plain["p99_ms"],
  "added_p50_ms": round(sl["p50_ms"] - plain["p50_ms"], 3),
  "added_p99_ms": round(sl["p99_ms"] - plain["p99_ms"], 3),
  "loadavg_1m": float(load)}))
PY
}

echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs; loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# servers on CPU $SERVER_CPU, load on CPU $LOAD_CPU; $rounds rounds of ${seconds}s; caddy $("$CADDY" version | cut -d' ' -f1)"
for r in $(seq "$rounds"); do
  if [ -z "$only" ] || [ "$only" = small ]; then
    for s in fastudp quinn tcp-h1 tcp-h2 caddy; do
      measure "$r" small "$s" -dir "$work/json" -connections "$CONNECTIONS" -duration "${seconds}s" |
        tee -a "$work/results.jsonl"
    done
  fi
  if [ -z "$only" ] || [ "$only" = upload ]; then
    for s in fastudp quinn; do
      measure "$r" upload "$s" -dir "$work/upload" -connections 1 -count 10 -post 100000000 -duration 600s |
        tee -a "$work/results.jsonl"
    done
  fi
  if [ -z "$only" ] || [ "$only" = wake ]; then
    for s in fastudp quinn; do
      wake "$r" "$s" | tee -a "$work/results.jsonl"
    done
  fi
done

# The medians over the rounds, and their ratios.
python3 - "$work/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(kind, server, key):
    v = [r[key] for r in rows if r["kind"] == kind and r["server"] == server and r.get(key) is not None]
    return statistics.median(v) if v else None
out = {}
small = {s: med("small", s, "req_per_cpu_s") for s in ("fastudp", "quinn", "tcp-h1", "tcp-h2", "caddy")}
for s, v in small.items():
    if v:
        out[f"small {s} req_per_cpu_s"] = round(v, 1)
for s in ("quinn", "tcp-h1", "tcp-h2", "caddy"):
    if small["fastudp"] and small[s]:
        out[f"small fastudp/{s}"] = round(small["fastudp"] / small[s], 2)
up = {s: med("upload", s, "cpu_s_per_gbit") for s in ("fastudp", "quinn")}
for s, v in up.items():
    if v:
        out[f"upload {s} cpu_s_per_gbit"] = round(v, 3)
if up["fastudp"] and up["quinn"]:
    out["upload fastudp/quinn"] = round(up["fastudp"] / up["quinn"], 2)
for s in ("fastudp", "quinn"):
    for k in ("sleep_p50_ms", "sleep_p99_ms", "json_p50_ms", "json_p99_ms", "added_p50_ms", "added_p99_ms"):
        v = med("wake", s, k)
        if v is not None:
            out[f"wake {s} {k}"] = round(v, 3)
print(json.dumps({"kind": "summary", "medians_over_rounds": out}))
PY
