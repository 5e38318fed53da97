#!/usr/bin/env bash
# The file-serving comparison of docs/BENCHMARKS.md (section 16): a
# directory of files served over HTTP/3 to many connections, by
#   fastudp   fastudp quic serve --www (the engine of crates/fastudp-quic)
#   quinn     quinn + h3-quinn on quinn-udp (examples/h3_quinn_files.rs)
#   quic-go   quic-go's http3 server (http.FileServer)
#   tcp-h1    Go net/http over TLS on TCP, HTTP/1.1 (http.FileServer)
#   tcp-h2    the same server, HTTP/2
#   fastudp-zc  fastudp quic serve --www --zerocopy (MSG_ZEROCOPY for large
#             trains, the library's adaptive sender)
#   caddy-h3  Caddy v2.11.9's file_server over HTTP/3 (quic-go)
#   caddy-h2  the same Caddy over TLS/TCP, HTTP/2
#   caddy-h1  the same Caddy over TLS/TCP, HTTP/1.1
#   fastudp-qc, caddy-h3-qc, quinn-qc
#             those HTTP/3 servers loaded by fastudp's own HTTP/3 client
#             (`fastudp quic load --alpn h3`: quinn + h3 on a socket with
#             UDP GRO, so the veth hands it each GSO train whole where
#             quic-go's client socket has it cut into datagrams on the
#             server's core; and it takes 8972-byte datagrams on `jumbo`,
#             where quic-go's stops at 1452); each connection GETs one file of the
#             workload again and again, back to back (`--request-every
#             0`), and only whole responses count
#             (the bytes of the responses cut by the end are in the
#             server's CPU but not in its Gbit: a bias against it)
# (Caddy: CADDY, default ~/.cache/fastudp/caddy-v2.11.9/caddy, as
# scripts/proxy-bench.sh builds it; one process per run, `servers {
# protocols h1 h2 h3 }`, no access log, the client choosing the protocol;
# a self-signed P-256 certificate made with openssl)
# all loaded by the same client (tools/quic-go-client/filebench: quic-go's
# http3 client, or net/http over TLS for TCP). Two workloads: `1MB`, CONNS1
# (100) connections fetching 1 MB files (64 of them) one after the other
# for SECONDS1 (10) s; `100MB`, CONNS100 (10) connections fetching 100 MB
# files (4 of them) for SECONDS100 (20) s.
#
# On the `offload` testbed: the server in namespace fastudp-tx on CPU 1
# (one worker, one tokio worker thread, GOMAXPROCS 1 by affinity), the
# client in fastudp-rx on CPU 0. Server CPU: utime + stime of the server
# process (/proc/PID/stat, all threads) from the start to the end of the
# load; goodput: the body bytes the client read over the load's time. The
# testbed is built and used under `flock /tmp/fastudp-netns.lock`, held for
# the measurement only.
#
# SMOKE=1: no testbed, no root: every server on 127.0.0.1 with small files
# (0 B to 1 MB + 1), 2 s of load by 4 connections comparing every byte of
# every body with the file (-verify); exits 1 if any server sent a wrong
# byte, a wrong length or an error status. No figures are printed then.
#
#   scripts/bench-files.sh [OUT.csv]               (root; builds what it needs)
#   SMOKE=1 scripts/bench-files.sh
#   SECONDS1=10 CONNS1=100 SERVERS="fastudp quinn" WORKLOADS=1MB scripts/bench-files.sh
#   LOGDIR=DIR scripts/bench-files.sh   (keeps each server's and client's output)
#
# Builds of fastudp side by side (an ablation): AB names each build and
# its binary; each is a server of that name, and ROUNDS (1) rounds run
# one after the other, every server once per round and workload, so the
# builds meet the same load on a shared machine. The table's ratios are
# to the first build's within each round, then their range over rounds.
# PROFILE=jumbo runs on the `jumbo` testbed (MTU 9000; `offload` by
# default); there the fastudp servers may probe up to 8972-byte datagrams
# (--max-udp-payload 8972), but quic-go's client, the h3 client of every
# QUIC server here, takes packets of at most 1452 bytes, so the QUIC rows
# cannot use the larger frames; TCP takes the MTU by itself.
#
# PERF=DIR records each server's samples, any stack's (`perf record -e
# cpu-clock -g -p PID`, for the load's time) into DIR/WORKLOAD-SERVER-
# ROUND.data and prints scripts/perf-buckets.py's buckets of each, with
# their CPU ms per Gbit served (the recording costs CPU: take the
# figures from a run without PERF). Beside each .data, .pid and .gbit
# keep the server's pid and the Gbit it served, for
# `scripts/perf-buckets.py DATA PID GBIT --top N` (the symbols and their
# owners).
#
#   AB="before=/tmp/fastudp-before after=target/release/fastudp" ROUNDS=3 \
#     SERVERS="before after" scripts/bench-files.sh OUT.csv
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-}
SMOKE=${SMOKE:-0}
DUR1=${SECONDS1:-10}
DUR100=${SECONDS100:-20}
CONNS1=${CONNS1:-100}
CONNS100=${CONNS100:-10}
LOGDIR=${LOGDIR:-}
AB=${AB:-}
ROUNDS=${ROUNDS:-1}
PERF=${PERF:-}
ROUND=1
RUN=smoke
SERVERS=${SERVERS:-fastudp quinn quic-go tcp-h1 tcp-h2}
WORKLOADS=${WORKLOADS:-1MB 100MB}
T=${CARGO_TARGET_DIR:-target}
FASTUDP=$T/release/fastudp
QUINN=$T/release/examples/h3_quinn_files
GOB=$T/quic-go-filebench
PROFILE=${PROFILE:-offload}
CADDY=${CADDY:-${XDG_CACHE_HOME:-$HOME/.cache}/fastudp/caddy-v2.11.9/caddy}
MTU=
[ "$PROFILE" = jumbo ] && MTU="--max-udp-payload 8972"

echo "building ..." >&2
# With AB, the builds are given; only the testbed's binary is needed.
if [ -z "$AB" ] || [ ! -x "$FASTUDP" ]; then
    cargo build --release -q -p fastudp-cli --bin fastudp --example h3_quinn_files
fi
scripts/build-quic-go-client.sh >/dev/null

TMP=$(mktemp -d)
srv=
cleanup() {
    if [ -n "$srv" ]; then kill -INT "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; fi
    if [ "$SMOKE" != 1 ] && [ -n "${TESTBED:-}" ]; then "$FASTUDP" testbed down >/dev/null 2>&1 || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# The files: random bytes, so nothing compresses or repeats.
if [ "$SMOKE" = 1 ]; then
    mkdir -p "$TMP/www-smoke"
    for n in 0 1 1000 65536 65537 100000 1048577; do
        head -c "$n" /dev/urandom >"$TMP/www-smoke/f$n.bin"
    done
    WORKLOADS=smoke
else
    mkdir -p "$TMP/www-1MB" "$TMP/www-100MB"
    for i in $(seq -w 1 64); do head -c 1000000 /dev/urandom >"$TMP/www-1MB/f$i.bin"; done
    for i in 1 2 3 4; do head -c 100000000 /dev/urandom >"$TMP/www-100MB/f$i.bin"; done
fi
case " $SERVERS " in
*" caddy-"*)
    [ -x "$CADDY" ] || { echo "bench-files: no Caddy at $CADDY (scripts/proxy-bench.sh builds it)" >&2; exit 1; }
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 -subj /CN=localhost \
        -addext subjectAltName=DNS:localhost,IP:127.0.0.1,IP:10.200.0.1 2>/dev/null ;;
esac

ticks() { # ticks PID: utime + stime of the process, in clock ticks
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

NS_S= NS_C= PIN_S= PIN_C= HOST=127.0.0.1
if [ "$SMOKE" != 1 ]; then
    NS_S="ip netns exec fastudp-tx" NS_C="ip netns exec fastudp-rx" HOST=10.200.0.1
    if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
        PIN_S="taskset -c 1" PIN_C="taskset -c 0"
    fi
fi
HZ=$(getconf CLK_TCK)
PORT=$((20000 + RANDOM % 20000))
fail=0
rows=()

one() { # one SERVER WORKLOAD
    local server=$1 w=$2 dir=$TMP/www-$2 conns dur proto=h3 h2= cmd client=go
    case $w in
    1MB) conns=$CONNS1 dur=$DUR1 ;;
    100MB) conns=$CONNS100 dur=$DUR100 ;;
    *) conns=4 dur=2 ;;
    esac
    PORT=$((PORT + 1))
    local addr=$HOST:$PORT
    local kind=$server
    case $server in
    fastudp-qc | caddy-h3-qc | quinn-qc) kind=${server%-qc} client=fastudp ;;
    esac
    case $kind in
    fastudp) cmd="$FASTUDP quic serve --listen $addr --www $dir --workers 1 --json $MTU" ;;
    fastudp-zc) cmd="$FASTUDP quic serve --listen $addr --www $dir --workers 1 --json $MTU --zerocopy" ;;
    quinn) cmd="$QUINN --listen $addr --www $dir --workers 1" ;;
    quic-go) cmd="$GOB serve -proto h3 -listen $addr -www $dir" ;;
    tcp-h1) cmd="$GOB serve -proto https -listen $addr -www $dir"; proto=https ;;
    tcp-h2) cmd="$GOB serve -proto https -listen $addr -www $dir"; proto=https h2=-h2 ;;
    caddy-h1 | caddy-h2 | caddy-h3)
        cat >"$TMP/Caddyfile" <<CADDYFILE
{
	admin off
	persist_config off
	auto_https off
	default_sni localhost
	grace_period 2s
	servers {
		protocols h1 h2 h3
	}
}
https://:$PORT {
	bind $HOST
	tls $TMP/cert.pem $TMP/key.pem
	root * $dir
	file_server
}
CADDYFILE
        cmd="$CADDY run --config $TMP/Caddyfile --adapter caddyfile"
        case $kind in
        caddy-h1) proto=https ;;
        caddy-h2) proto=https h2=-h2 ;;
        esac ;;
    *)
        local bin=
        for ab in $AB; do [ "${ab%%=*}" = "$server" ] && bin=${ab#*=}; done
        [ -n "$bin" ] || { echo "bench-files: unknown server $server" >&2; exit 2; }
        cmd="$bin quic serve --listen $addr --www $dir --workers 1 --json $MTU" ;;
    esac
    # shellcheck disable=SC2086
    $NS_S $PIN_S $cmd >"$TMP/srv.out" 2>"$TMP/srv.err" &
    srv=$!
    # Caddy says it serves on stderr; the others print `listening`.
    local up=listening upfile=$TMP/srv.out
    [ "${server#caddy-}" != "$server" ] && up="serving initial configuration" upfile=$TMP/srv.err
    for _ in $(seq 100); do
        grep -q "$up" "$upfile" 2>/dev/null && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.05
    done
    if ! grep -q "$up" "$upfile" 2>/dev/null; then
        echo "bench-files: $server did not start:" >&2; cat "$TMP/srv.err" >&2
        exit 1
    fi
    local verify= t0 t1 rc=0
    [ "$SMOKE" = 1 ] && verify=-verify
    t0=$(ticks "$srv")
    local perf=
    if [ -n "$PERF" ]; then
        mkdir -p "$PERF"
        perf record -e cpu-clock -g -p "$srv" -o "$PERF/$w-$server-$ROUND.data" >/dev/null 2>&1 &
        perf=$!
    fi
    if [ "$client" = fastudp ]; then
        # fastudp's own HTTP/3 client (quinn + h3), which takes datagrams
        # of up to 8972 bytes on `jumbo`: each connection GETs one file of
        # the workload again and again; only whole responses are counted.
        local file
        file=$(cd "$dir" && ls | head -1)
        # shellcheck disable=SC2086
        $NS_C $PIN_C "$FASTUDP" quic load --duration "${dur}s" --connections "$conns" --alpn h3 \
            --request "/$file" --request-every 0 --probe-every 0 $MTU --json "$addr" >"$TMP/qload.json" 2>"$TMP/load.err" || rc=$?
        python3 - "$TMP/qload.json" "$dir/$file" "$dur" "$conns" >"$TMP/load.json" <<'EOF2' || rc=1
import json, os, sys
rep = None
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "requests_ok" in j:
        rep = j
size, dur = os.path.getsize(sys.argv[2]), float(sys.argv[3])
ok = rep["requests_ok"]
print(json.dumps({"proto": "h3", "connections": int(sys.argv[4]), "seconds": dur, "bytes": ok * size,
                  "goodput_gbit": ok * size * 8 / 1e9 / dur, "completed": ok,
                  "errors": rep["requests_failed"] + rep["failed"], "client_cpu_s": rep["client_cpu_s"]}))
EOF2
    else
        # shellcheck disable=SC2086
        $NS_C $PIN_C "$GOB" load -proto $proto $h2 -dir "$dir" $verify -insecure \
            -connections "$conns" -duration "${dur}s" "https://$addr" >"$TMP/load.json" 2>"$TMP/load.err" || rc=$?
    fi
    t1=$(ticks "$srv")
    if [ -n "$perf" ]; then
        kill -INT "$perf" 2>/dev/null || true
        wait "$perf" 2>/dev/null || true
        local gb
        gb=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bytes"] * 8 / 1e9)' "$TMP/load.json" 2>/dev/null || true)
        echo "$srv" >"$PERF/$w-$server-$ROUND.pid"
        echo "$gb" >"$PERF/$w-$server-$ROUND.gbit"
        echo "$w $server round $ROUND:" $(scripts/perf-buckets.py "$PERF/$w-$server-$ROUND.data" "$srv" $gb | tr '\t\n' ' ,') >&2
    fi
    # fastudp drains on the first SIGINT (up to --drain-timeout, 30 s,
    # for responses the client left unread); the second stops it at once.
    kill -INT "$srv" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
    kill -INT "$srv" 2>/dev/null || true
    wait "$srv" || true
    srv=
    if [ -n "$LOGDIR" ]; then
        mkdir -p "$LOGDIR"
        for f in srv.out srv.err load.json load.err; do cp "$TMP/$f" "$LOGDIR/$w-$server-$f"; done
    fi
    if [ "$rc" != 0 ]; then
        echo "bench-files: $server $w: the client reported errors (exit $rc):" >&2
        cat "$TMP/load.json" "$TMP/load.err" >&2
        fail=1
    fi
    [ -s "$TMP/load.json" ] || return 0
    local row
    row=$(python3 - "$TMP/load.json" "$server" "$w" "$t0" "$t1" "$HZ" <<'EOF'
import json, sys
l = json.loads(open(sys.argv[1]).read())
server, w, t0, t1, hz = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
cpu = (t1 - t0) / hz
gbit = l["bytes"] * 8 / 1e9
print(",".join(str(x) for x in [w, server, l["proto"], l["connections"], round(l["seconds"], 3), l["bytes"],
    round(l["goodput_gbit"], 3), round(cpu, 2), round(cpu / gbit, 4) if gbit else "", l["completed"],
    l["errors"], round(l["client_cpu_s"], 2), round(l["client_cpu_s"] / gbit, 4) if gbit else ""]))
EOF
)
    rows+=("$RUN-r$ROUND,$row")
    echo "$row" >&2
}

HEADER="run,workload,server,proto,connections,seconds,bytes,goodput_gbit_s,server_cpu_s,server_cpu_s_per_gbit,completed,errors,client_cpu_s,client_cpu_s_per_gbit"
run_all() {
    for ROUND in $(seq "$ROUNDS"); do
        for w in $WORKLOADS; do
            for s in $SERVERS; do one "$s" "$w"; done
        done
    done
}

if [ "$SMOKE" = 1 ]; then
    run_all
    if [ "$fail" = 0 ]; then echo "bench-files: smoke: every server returned every file byte-exact"; fi
    exit "$fail"
fi

[ "$(id -u)" = 0 ] || { echo "bench-files: needs root (testbed namespaces)" >&2; exit 1; }
echo "waiting for /tmp/fastudp-netns.lock ..." >&2
exec 9>/tmp/fastudp-netns.lock
flock 9
TESTBED=1
"$FASTUDP" testbed up "$PROFILE" >/dev/null
RUN=$(date -u +%FT%TZ)
echo "start $RUN on $PROFILE, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run_all
echo "end $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$FASTUDP" testbed down >/dev/null
TESTBED=
flock -u 9

if [ -n "$OUT" ]; then
    [ -f "$OUT" ] || echo "$HEADER" >"$OUT"
    printf '%s\n' "${rows[@]}" >>"$OUT"
fi
# The table: each server's CPU per Gbit and goodput against fastudp's (or
# the first build's of AB) in the same workload and round.
BASE=fastudp
[ -n "$AB" ] && BASE=${AB%%=*}
printf '%s\n' "$HEADER" "${rows[@]}" | BASE=$BASE python3 -c '
import csv, os, sys
rows = list(csv.DictReader(sys.stdin))
B = os.environ["BASE"]
base = {(r["run"], r["workload"]): r for r in rows if r["server"] == B}
def ratio(r, k):
    try: return float(r[k]) / float(base[(r["run"], r["workload"])][k])
    except Exception: return None
def f(x): return "-" if x is None else "%.2f" % x
print("| round | workload | server | connections | goodput Gbit/s | server CPU s | CPU s/Gbit | CPU/Gbit vs %s | goodput vs %s | completed | errors | client CPU s/Gbit |" % (B, B))
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (r["run"].rsplit("-r", 1)[-1], r["workload"], r["server"], r["proto"],
        r["connections"], r["goodput_gbit_s"], r["server_cpu_s"], r["server_cpu_s_per_gbit"],
        f(ratio(r, "server_cpu_s_per_gbit")), f(ratio(r, "goodput_gbit_s")), r["completed"], r["errors"], r["client_cpu_s_per_gbit"]))
runs = sorted({r["run"] for r in rows})
if len(runs) > 1:
    print()
    print("| workload | server | CPU/Gbit vs %s: median (min-max) over %d rounds |" % (B, len(runs)))
    print("|---|---|---|")
    for w in dict.fromkeys(r["workload"] for r in rows):
        for s in dict.fromkeys(r["server"] for r in rows):
            v = sorted(x for x in (ratio(r, "server_cpu_s_per_gbit") for r in rows if r["workload"] == w and r["server"] == s) if x is not None)
            if v:
                print("| %s | %s | %.2f (%.2f-%.2f) |" % (w, s, v[len(v) // 2], v[0], v[-1]))
'
exit "$fail"
