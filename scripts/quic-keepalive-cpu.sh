#!/usr/bin/env bash
# The server's CPU to keep idle connections alive (issue 39): `fastudp
# quic serve` (2 workers, HTTP/3 at its defaults, --stats) holds
# CONNECTIONS connections from 400 loopback addresses (127.1.0.0/16),
# each sending a keep-alive PING every 15 s and nothing else after its
# one request at the opening (`quic load --keepalive 15s`, no
# --request-every). Once the server's stats line counts 98% of them
# open, and WARM seconds later (default 5), the server's CPU seconds
# (utime + stime from /proc/PID/stat, not wall-clock) are read over a
# window of WINDOW seconds (default 45); the load is then stopped.
#
# Several server binaries are compared round by round in one run (A, B,
# A, B, ...), each against the same load generator (LOAD, default the
# first binary), so that a machine busy with other work weighs on each
# alike. Prints one line per run and, at the end, each binary's median
# cores and CPU per PING (CONNECTIONS / 15 PINGs per second).
#
# With FULL=1, each load runs to its end (HOLD_SECONDS) and its report
# is added: connections lost, handshakes/s, and what a new client waited
# (a probe every second, throughout), p50/p99.
#
# A BINARY written BINARY:quinn runs that binary's plain quinn server
# instead (`quic serve --stack quinn --test-endpoints`, hq-interop only:
# its load asks /bytes/100 over `--alpn hq-interop`), under the name
# NAME-quinn; quinn reports no datagram counts.
#
# With PERF=SECONDS, the last round also records a profile of each
# server (`perf record -e cpu-clock -g`, SECONDS long, from the start of
# the window) in perf.NAME.data (NAME: the binary's file name); the
# medians leave out these runs when there are others.
#
# Usage:
#   scripts/quic-keepalive-cpu.sh CONNECTIONS HOLD_SECONDS ROUNDS BINARY...
# HOLD_SECONDS bounds the load: the opening, WARM and WINDOW must fit.
# For example:
#   scripts/quic-keepalive-cpu.sh 20000 240 3 /tmp/fastudp-before target/release/fastudp
#   scripts/quic-keepalive-cpu.sh 100000 140 1 target/release/fastudp target/release/fastudp:quinn
# Loopback only; each run stops by itself (the server has --duration, the
# load --duration).
set -euo pipefail

N=${1:?CONNECTIONS}
HOLD=${2:?HOLD_SECONDS}
ROUNDS=${3:?ROUNDS}
shift 3
[ $# -ge 1 ] || { echo "quic-keepalive-cpu.sh: give at least one server binary" >&2; exit 2; }
BINS=()
for b in "$@"; do
    stack=
    case "$b" in *:quinn) b=${b%:quinn}; stack=:quinn ;; esac
    [ -x "$b" ] || { echo "quic-keepalive-cpu.sh: no binary at $b" >&2; exit 2; }
    BINS+=("$(readlink -f "$b")$stack")
done
LOAD=$(readlink -f "${LOAD:-${BINS[0]%:quinn}}")
WARM=${WARM:-5}
WINDOW=${WINDOW:-45}
ADDRS=$(( (N + 249) / 250 ))
[ "$ADDRS" -lt 400 ] && ADDRS=400
[ "$ADDRS" -gt 4096 ] && ADDRS=4096
TMP=$(mktemp -d)
SRV=
cleanup() {
    [ -n "$SRV" ] && kill -INT "$SRV" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$TMP/www"
head -c 100 /dev/zero > "$TMP/www/small.txt"
HZ=$(getconf CLK_TCK)
ulimit -n "$(ulimit -Hn)"
cpu_of() { awk -v hz="$HZ" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
rss_of() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
RESULTS=$TMP/results
: > "$RESULTS"

one() {
    local bin=$1 round=$2 name
    local serve=(--www "$TMP/www") ask=(--alpn h3 --request /small.txt)
    case "$bin" in
        *:quinn)
            bin=${bin%:quinn}
            serve=(--stack quinn --test-endpoints)
            ask=(--alpn hq-interop --request /bytes/100)
            name=$(basename "$bin")-quinn
            ;;
        *) name=$(basename "$bin") ;;
    esac
    "$bin" quic serve --listen 127.0.0.1:0 --workers 2 --duration $((HOLD + 600)) \
        --json --stats "${serve[@]}" > "$TMP/srv" 2>&1 &
    SRV=$!
    local port=
    for _ in $(seq 100); do
        port=$(grep -o '"addr":"127.0.0.1:[0-9]*"' "$TMP/srv" | grep -o '[0-9]*"$' | tr -d '"' || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "server did not start:" >&2; cat "$TMP/srv" >&2; return 1; }
    sleep 1
    local rss0
    rss0=$(rss_of "$SRV")
    "$LOAD" quic load "127.0.0.1:$port" --json --duration "${HOLD}s" \
        --connections "$N" --source 127.1.0.0/16 --endpoints "$ADDRS" \
        --threads 2 --concurrency 512 --keepalive 15s \
        "${ask[@]}" > "$TMP/load" 2> "$TMP/load-err" &
    local load=$! t0 opened=
    t0=$(date +%s.%N)
    # Every connection established (the server's stats line, once a
    # second), then WARM seconds.
    while kill -0 "$load" 2>/dev/null; do
        local held
        held=$(tail -n 1 "$TMP/srv" | grep -o '"connections":[0-9]*' | cut -d: -f2 || true)
        if [ -n "$held" ] && [ "$held" -ge $((N - N / 50)) ]; then
            opened=$(date +%s.%N)
            break
        fi
        sleep 0.5
    done
    local out
    if [ -z "$opened" ]; then
        local held
        held=$(tail -n 1 "$TMP/srv" | grep -o '"connections":[0-9]*' | cut -d: -f2 || true)
        out="{\"server\": \"$name\", \"round\": $round, \"error\": \"${held:-no} of $N connections open when the load ended (98% needed): $(tail -c 300 "$TMP/load-err" | tr -d '\"\n')\"}"
    else
        sleep "$WARM"
        local perf=
        if [ -n "${PERF:-}" ] && [ "$round" = "$ROUNDS" ]; then
            perf record -q -e cpu-clock -g -p "$SRV" -o "perf.$name.data" -- sleep "$PERF" \
                > /dev/null 2>&1 &
            perf=$!
        fi
        local c0 c1 w0 w1 rx0 rx1
        local l0 l1
        w0=$(date +%s.%N); c0=$(cpu_of "$SRV"); l0=$(wc -l < "$TMP/srv")
        sleep "$WINDOW"
        w1=$(date +%s.%N); c1=$(cpu_of "$SRV"); l1=$(wc -l < "$TMP/srv")
        # The server's stats lines of the window: the datagrams it
        # received and sent.
        sed -n "$((l0 + 1)),${l1}p" "$TMP/srv" | grep '"kind":"stats"' > "$TMP/window" || true
        local rss1 alive
        rss1=$(rss_of "$SRV")
        [ -n "$perf" ] && wait "$perf"
        alive=$(tail -n 1 "$TMP/srv" | grep -o '"connections":[0-9]*' | cut -d: -f2)
        # FULL=1: the load runs to its end, for its report (what a new
        # client waited, throughout).
        [ -n "${FULL:-}" ] && wait "$load"
        out=$(python3 - "$name" "$round" "$t0" "$opened" "$w0" "$w1" "$c0" "$c1" "$alive" \
            "$rss0" "$rss1" "$TMP/load" "$([ -n "$perf" ] && echo 1)" "$TMP/window" <<'PY'
import json, sys
name, rnd, t0, opened, w0, w1, c0, c1, alive, rss0, rss1, load, profiled, window = sys.argv[1:]
t0, opened, w0, w1, c0, c1 = map(float, (t0, opened, w0, w1, c0, c1))
cores = (c1 - c0) / (w1 - w0)
pings = int(alive) / 15.0
rx = tx = secs = 0.0
for l in open(window):
    v = json.loads(l)
    secs += v["seconds"]
    rx += (v["recv_calls_s"] or 0) * v["seconds"] * (v["datagrams_per_recv_call"] or 0)
    tx += (v["send_calls_s"] or 0) * v["seconds"] * (v["datagrams_per_send_call"] or 0)
rx_s = rx / secs if secs else None
out = {
    "server": name, "round": int(rnd), "connections": int(alive),
    "opening_s": round(opened - t0, 1), "window_s": round(w1 - w0, 1),
    "server_cpu_s": round(c1 - c0, 3), "server_cores": cores,
    "profiled": profiled == "1",
    "server_us_per_ping": cores / pings * 1e6 if pings else None,
    "datagrams_received_per_s": round(rx_s, 1) if rx_s else None,
    "datagrams_sent_per_s": round(tx / secs, 1) if tx else None,
    "server_us_per_datagram_received": cores / rx_s * 1e6 if rx_s else None,
    "server_rss_kib_before": int(rss0), "server_rss_kib_holding": int(rss1),
    "server_rss_kib_per_connection": (int(rss1) - int(rss0)) / int(alive) if int(alive) else None,
}
try:
    v = json.load(open(load))
    out.update({k: v.get(k) for k in ("established", "alive_at_end", "failures",
                                       "handshakes_per_s", "new_client", "client_rss_kib_peak")})
except Exception:
    pass
print(json.dumps(out))
PY
)
    fi
    # The load holds its connections until --duration ends: it is
    # stopped now, the measurement taken.
    kill -KILL "$load" 2>/dev/null || true
    wait "$load" 2>/dev/null || true
    kill -INT "$SRV" 2>/dev/null || true
    wait "$SRV" 2>/dev/null || true
    SRV=
    echo "$out" | tee -a "$RESULTS"
}

echo "quic-keepalive-cpu: $N connections, hold ${HOLD}s, $ROUNDS rounds; load $(uptime | sed 's/.*load average/load average/')"
for r in $(seq "$ROUNDS"); do
    for b in "${BINS[@]}"; do
        one "$b" "$r"
        echo "  (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    done
done
python3 - "$RESULTS" <<'PY'
import json, statistics, sys
by = {}
for l in open(sys.argv[1]):
    v = json.loads(l)
    if v.get("server_cores") is not None:
        by.setdefault(v["server"], []).append(v)
for name, vs in by.items():
    plain = [x for x in vs if not x.get("profiled")]
    vs = plain or vs
    c = statistics.median(x["server_cores"] for x in vs)
    u = statistics.median(x["server_us_per_ping"] for x in vs)
    d = [x["server_us_per_datagram_received"] for x in vs if x.get("server_us_per_datagram_received")]
    d = statistics.median(d) if d else float("nan")
    print(f"{name}: median {c:.4f} cores, {u:.1f} us per PING, {d:.1f} us per datagram received, over {len(vs)} runs "
          f"({', '.join('%.4f' % x['server_cores'] for x in vs)})")
PY
