#!/usr/bin/env bash
# The access log's cost on the hot path (docs/BENCHMARKS.md, section 23).
#
# `quic serve` (1 worker, pinned to CPU 1) answers small responses
# (`/bytes/1000` over HTTP/3) to `quic load --duration` (pinned to CPU 0)
# on loopback: CONNS connections, each asking again 10 ms after its last
# answer. Three cases, alternated ROUNDS times in one run so that the
# machine's drift falls on all of them alike:
#   off    no access log
#   text   --access-log FILE --access-log-format text
#   json   --access-log FILE --access-log-format json
# For each run: requests answered per second (the load's `requests_ok`
# over its `seconds`), the server's CPU time per request (utime + stime
# from /proc/PID/stat), and the log's lines written and dropped. Then the
# median of each case and its ratio to `off`.
#
#   BIN=target/release/fastudp scripts/access-log-bench.sh [ROUNDS] [SECONDS]
#
# Loopback only; every process it starts ends by itself (--duration).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/fastudp}
ROUNDS=${1:-3}
SECS=${2:-10}
CONNS=${CONNS:-200}
[ -x "$BIN" ] || { echo "access-log-bench: no $BIN (cargo build --release -p fastudp-cli)" >&2; exit 2; }
TMP=$(mktemp -d)
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
ROWS=$TMP/rows.csv
echo "round,case,requests_ok,seconds,requests_per_s,server_cpu_s,server_cpu_us_per_request,workers_cpu_us_per_request,log_thread_cpu_us_per_request,lines_written,lines_dropped" >"$ROWS"

# CPU ticks (utime + stime) of the server's threads: all but the access
# log's own thread ("fastudp-log"), and that thread.
cpu_ticks() {
    local rest=0 log=0 t c n
    for t in /proc/"$1"/task/*; do
        c=$(cat "$t/comm" 2>/dev/null) || continue
        n=$(awk '{print $14 + $15}' "$t/stat" 2>/dev/null) || continue
        if [ "$c" = fastudp-log ]; then log=$((log + n)); else rest=$((rest + n)); fi
    done
    echo "$rest $log"
}

run() {
    local round=$1 case=$2 extra=()
    case $case in
    off) ;;
    text) extra=(--access-log "$TMP/access.log" --access-log-format text) ;;
    json) extra=(--access-log "$TMP/access.log" --access-log-format json) ;;
    esac
    rm -f "$TMP/access.log"
    taskset -c 1 "$BIN" quic serve --listen 127.0.0.1:0 --workers 1 --test-endpoints \
        --json --duration $((SECS + 60)) "${extra[@]}" >"$TMP/srv.json" 2>"$TMP/srv.err" &
    SRV=$!
    for _ in $(seq 200); do
        grep -q '"listening"' "$TMP/srv.json" 2>/dev/null && break
        sleep 0.05
    done
    local addr
    addr=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if "\"listening\"" in l: print(json.loads(l)["addr"]); break' "$TMP/srv.json")
    [ -n "$addr" ] || { echo "access-log-bench: the server did not start:" >&2; cat "$TMP/srv.err" >&2; exit 1; }
    local t0 t1
    t0=$(cpu_ticks "$SRV")
    taskset -c 0 "$BIN" quic load "$addr" --duration "${SECS}s" --connections "$CONNS" \
        --request /bytes/1000 --request-every 10ms --probe-every 0 --json \
        >"$TMP/load.json" 2>"$TMP/load.err" || true
    t1=$(cpu_ticks "$SRV")
    kill -INT "$SRV"
    wait "$SRV" || true
    SRV=
    # shellcheck disable=SC2086
    python3 - "$TMP/load.json" "$TMP/srv.json" "$round" "$case" $t0 $t1 "$HZ" >>"$ROWS" <<'EOF'
import json, sys
load = json.load(open(sys.argv[1]))
log = {"written": 0, "dropped": 0}
for l in open(sys.argv[2]):
    try:
        v = json.loads(l)
    except ValueError:
        continue
    if v.get("kind") == "access_log_summary":
        log = v
rnd, case = sys.argv[3], sys.argv[4]
r0, l0, r1, l1, hz = (int(x) for x in sys.argv[5:10])
ok, secs = load["requests_ok"], load["seconds"]
rest, logt = (r1 - r0) / hz, (l1 - l0) / hz
per = lambda c: round(c / max(ok, 1) * 1e6, 2)
print(",".join(str(x) for x in [rnd, case, ok, round(secs, 3), round(ok / secs, 1), round(rest + logt, 2),
      per(rest + logt), per(rest), per(logt), log["written"], log["dropped"]]))
EOF
    tail -n 1 "$ROWS"
}

for r in $(seq "$ROUNDS"); do
    for c in off text json; do
        run "$r" "$c"
    done
done

python3 - "$ROWS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = {}
for c in ["off", "text", "json"]:
    rs = [r for r in rows if r["case"] == c]
    m = lambda k: statistics.median(float(r[k]) for r in rs)
    med[c] = (m("requests_per_s"), m("server_cpu_us_per_request"), m("workers_cpu_us_per_request"),
              m("log_thread_cpu_us_per_request"), sum(int(r["lines_dropped"]) for r in rs))
o = med["off"]
print()
print("| access log | requests/s | vs off | server CPU us/request | vs off | without the log's thread | vs off | the log's thread | lines dropped |")
print("|---|---|---|---|---|---|---|---|---|")
for c in ["off", "text", "json"]:
    rps, cpu, rest, logt, dropped = med[c]
    print("| %s | %.0f | %.3f | %.1f | %.3f | %.1f | %.3f | %.1f | %d |" % (
        c, rps, rps / o[0], cpu, cpu / o[1], rest, rest / o[2], logt, dropped))
print("(medians of %d rounds)" % len([r for r in rows if r["case"] == "off"]))
EOF
