#!/usr/bin/env bash
# The measurement of issue 39: many light, long-lived connections on one
# host. `fastudp quic serve` (2 workers) on loopback, and `fastudp quic
# load --duration` opening CONNECTIONS connections from the 127.1.0.0/16
# prefix (one socket per address, at least 400 addresses), each with a
# keep-alive PING every 15 s and one small request a minute. Prints, as
# one JSON line and a summary:
#   - the server's RSS per held connection (RSS while holding, less the
#     RSS before the load, over the connections open);
#   - the server's CPU to keep them (cores, over the holding time after
#     the opening, keep-alives and requests included);
#   - the handshake rate reached while opening them;
#   - what a new client waits (connect + first response), p50/p99,
#     sampled every second throughout;
#   - the load generator's own RSS, CPU and descriptors.
# With RATE=R in the environment, the connections are opened at R per
# second at most (by default as fast as 512 handshakes in flight allow,
# which saturates the server: a new client then waits behind them).
# With GREEDY=K in the environment, K more connections (from
# 127.2.0.0/16) download without limit during the hold, and the summary
# adds the server's peak RSS against its --max-memory and the light
# connections' requests served and failed.
# With STACK=both (or quinn), the same against plain quinn (`quic serve
# --stack quinn`, which speaks hq-interop: the load then asks /bytes/100
# over `--alpn hq-interop`); with STACK=quic-go-h3 (or all), against
# quic-go's own HTTP/3 server serving the same file
# (target/quic-go-h3server), and with STACK=quic-go against quic-go
# serving hq-interop (target/quic-go-hqserver); both are built by
# scripts/build-quic-go-client.sh (QUICGO_H3=PATH, QUICGO=PATH for others).
#
# Usage:
#   scripts/quic-100k.sh [CONNECTIONS] [HOLD_SECONDS] [FASTUDP_BINARY] [STACK]
# Defaults: 100000 connections, 180 s, target/release/fastudp, fastudp.
# (cargo build --release -p fastudp-cli). Loopback only; each run stops
# by itself (the server has --duration, the load --duration).
set -euo pipefail

N=${1:-100000}
HOLD=${2:-180}
BIN=${3:-target/release/fastudp}
STACK=${4:-fastudp}
[ -x "$BIN" ] || { echo "quic-100k.sh: no binary at $BIN (cargo build --release -p fastudp-cli)" >&2; exit 2; }
BIN=$(readlink -f "$BIN")
# quic-go's hq-interop server (STACK quic-go or all).
QUICGO=${QUICGO:-$(dirname "$BIN")/../quic-go-hqserver}
QUICGO_H3=${QUICGO_H3:-$(dirname "$BIN")/../quic-go-h3server}
# At least 400 source addresses, about 250 connections each at most.
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

# utime + stime of a process, seconds.
cpu_of() { awk -v hz="$HZ" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }
rss_of() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

one() {
    local stack=$1 extra=()
    [ "$stack" = fastudp ] && extra=(--www "$TMP/www")
    # The greedy connections ask /bytes/N, a test endpoint; plain quinn
    # serves nothing else (a binary from before the flag has none).
    if { [ "${GREEDY:-0}" -gt 0 ] || [ "$stack" = quinn ]; } \
        && "$BIN" quic serve --help | grep -- --test-endpoints >/dev/null; then
        extra+=(--test-endpoints)
    fi
    # The server outlives the load by a margin: opening plus holding.
    ulimit -n "$(ulimit -Hn)"
    if [ "$stack" = quic-go-h3 ]; then
        # quic-go's own HTTP/3 server (package http3) serving the same
        # directory (tools/quic-go-client/h3server).
        [ -x "$QUICGO_H3" ] || { echo "quic-100k.sh: no quic-go HTTP/3 server at $QUICGO_H3 (scripts/build-quic-go-client.sh)" >&2; return 1; }
        "$QUICGO_H3" -listen 127.0.0.1:0 -www "$TMP/www" -duration $((HOLD + 600))s \
            > "$TMP/srv.$stack" 2>&1 &
    elif [ "$stack" = quic-go ]; then
        # quic-go's server of the same hq-interop application
        # (tools/quic-go-client/hqserver), with room for every connection.
        [ -x "$QUICGO" ] || { echo "quic-100k.sh: no quic-go server at $QUICGO (scripts/build-quic-go-client.sh)" >&2; return 1; }
        "$QUICGO" -listen 127.0.0.1:0 -duration $((HOLD + 600))s \
            -max-connections $((N + 1000)) > "$TMP/srv.$stack" 2>&1 &
    else
        "$BIN" quic serve --listen 127.0.0.1:0 --stack "$stack" --workers 2 \
            --duration $((HOLD + 600)) --json "${extra[@]}" > "$TMP/srv.$stack" 2>&1 &
    fi
    SRV=$!
    local port=
    for _ in $(seq 100); do
        port=$(grep -o '"addr":"127.0.0.1:[0-9]*"' "$TMP/srv.$stack" | grep -o '[0-9]*"$' | tr -d '"' || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "quic-100k.sh: $stack server did not start:" >&2; cat "$TMP/srv.$stack" >&2; return 1; }
    grep '"limits"' "$TMP/srv.$stack" || true
    sleep 1
    local rss0 cpu0
    rss0=$(rss_of "$SRV")
    local path=/small.txt alpn=h3
    # Plain quinn's server and quic-go's hq server speak hq-interop only.
    case $stack in fastudp | quic-go-h3) ;; *) path=/bytes/100; alpn=hq-interop ;; esac
    # The server's RSS and CPU every 2 s, while the load runs.
    ( while kill -0 "$SRV" 2>/dev/null; do
          echo "$(date +%s.%N) $(rss_of "$SRV") $(cpu_of "$SRV")"
          sleep 2
      done ) > "$TMP/samples.$stack" &
    local sampler=$!
    # GREEDY=K: K more connections from 127.2.0.0/16, each downloading
    # without limit (a 1 TB response, asked again when done), from when
    # the light ones should be open until the end of the hold.
    local greedy=
    if [ "${GREEDY:-0}" -gt 0 ]; then
        local gpath=/bytes/1000000000000
        ( sleep $((N / 1200 + 15))
          "$BIN" quic load "127.0.0.1:$port" --json --duration "$((HOLD - N / 1200 - 15))s" \
              --connections "$GREEDY" --source 127.2.0.0/16 --endpoints 64 --threads 1 \
              --alpn "$alpn" --request "$gpath" ) > "$TMP/greedy.$stack" 2> "$TMP/greedy-err.$stack" &
        greedy=$!
    fi
    set +e
    "$BIN" quic load "127.0.0.1:$port" --json --duration "${HOLD}s" \
        --connections "$N" --source 127.1.0.0/16 --endpoints "$ADDRS" \
        --threads 2 --concurrency 512 --keepalive 15s --request-every 60s ${RATE:+--rate "$RATE"} \
        --alpn "$alpn" --request "$path" > "$TMP/load.$stack" 2> "$TMP/load-err.$stack"
    local rc=$?
    [ -n "$greedy" ] && wait "$greedy"
    set -e
    local rss1 cpu1
    rss1=$(rss_of "$SRV")
    cpu1=$(cpu_of "$SRV")
    kill "$sampler" 2>/dev/null || true
    kill -INT "$SRV" 2>/dev/null || true
    wait "$SRV" 2>/dev/null || true
    SRV=
    python3 - "$stack" "$TMP/load.$stack" "$TMP/samples.$stack" "$rss0" "$rss1" "$rc" \
        "$TMP/greedy.$stack" "$TMP/srv.$stack" <<'PY'
import json, os, sys
stack, load, samples, rss0, rss_end, rc, greedy_file, srv = sys.argv[1:]
try:
    v = json.load(open(load))
except Exception as e:
    print(f"{stack}: no report from quic load (exit {rc}): {e}")
    sys.exit(0)
rows = [list(map(float, l.split())) for l in open(samples) if len(l.split()) == 3]
t_start = rows[0][0] if rows else 0
opened = t_start + v["opening_s"]
# Holding: from 5 s after the opening to the last sample.
hold = [r for r in rows if r[0] >= opened + 5]
cpu_cores = (hold[-1][2] - hold[0][2]) / (hold[-1][0] - hold[0][0]) if len(hold) >= 2 else None
rss_hold = max((r[1] for r in hold), default=float(rss_end))
alive = v["alive_at_end"] or v["established"]
out = {
    "stack": stack,
    "connections_asked": v["connections"],
    "established": v["established"],
    "alive_at_end": v["alive_at_end"],
    "source_addresses": v["source_addresses"],
    "client_sockets": v["sockets"],
    "failures": v["failures"],
    "server_rss_kib_before": int(rss0),
    "server_rss_kib_holding": int(rss_hold),
    "server_rss_kib_per_connection": (rss_hold - int(rss0)) / alive if alive else None,
    "server_cpu_cores_holding": cpu_cores,
    "handshakes_per_s": v["handshakes_per_s"],
    "handshakes_per_s_peak": v["handshakes_per_s_peak"],
    "opening_s": v["opening_s"],
    "new_client": v["new_client"],
    "client_rss_kib_peak": v["client_rss_kib_peak"],
    "client_cpu_cores_holding": v["client_cpu_cores_holding"],
    "client_fds_peak": v["client_fds_peak"],
    "load_exit": int(rc),
    "server_rss_kib_peak": int(max((r[1] for r in rows), default=0)),
    "requests_ok": v.get("requests_ok"),
    "requests_failed": v.get("requests_failed"),
}
for line in open(srv):
    if '"limits"' in line:
        out["server_max_memory_kib"] = json.loads(line).get("max_memory", 0) // 1024
if os.path.exists(greedy_file) and os.path.getsize(greedy_file) > 0:
    try:
        g = json.load(open(greedy_file))
        out["greedy"] = {k: g.get(k) for k in ("connections", "established", "alive_at_end",
                         "requests_ok", "requests_failed", "failures")}
    except Exception as e:
        out["greedy"] = {"error": str(e)}
if "greedy" in out:
    print(f"{stack}: with greedy connections {out['greedy']}: server RSS peak "
          f"{out['server_rss_kib_peak']} KiB of max-memory {out.get('server_max_memory_kib')} KiB; "
          f"light requests ok {out['requests_ok']}, failed {out['requests_failed']}")
print(json.dumps(out))
per = out["server_rss_kib_per_connection"]
print(f"{stack}: {v['established']} of {v['connections']} established from {v['source_addresses']} addresses "
      f"over {v['sockets']} sockets, {v['alive_at_end']} open at the end; "
      f"server RSS {per if per is None else round(per, 1)} KiB per connection, "
      f"CPU {cpu_cores if cpu_cores is None else round(cpu_cores, 3)} cores holding; "
      f"{v['handshakes_per_s']:.0f} handshakes/s (best second {v['handshakes_per_s_peak']}); "
      f"new client p50 {v['new_client']['p50_ms']:.1f} ms, p99 {v['new_client']['p99_ms']:.1f} ms "
      f"({v['new_client']['samples']} samples); failures {v['failures']}")
PY
}

case "$STACK" in
    fastudp) one fastudp ;;
    quinn) one quinn ;;
    quic-go) one quic-go ;;
    quic-go-h3) one quic-go-h3 ;;
    both) one fastudp; one quinn ;;
    all) one fastudp; one quinn; one quic-go-h3 ;;
    *) echo "quic-100k.sh: STACK is fastudp, quinn, quic-go (hq-interop), quic-go-h3 (HTTP/3), both (fastudp and quinn) or all (fastudp, quinn, quic-go-h3)" >&2; exit 2 ;;
esac
