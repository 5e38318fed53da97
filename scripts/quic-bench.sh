#!/bin/sh
# Full-application figures of `fastudp quic serve` on the testbed
# (BENCHMARKS section 14): the same workloads against
#   a  quic serve (quinn-proto on fastudp, everything on)
#   b  the same with FASTUDP_DISABLE=gso,gro,mmsg (UDP without offloads)
#   c  --stack quinn (plain quinn, tokio, quinn's own socket)
#   d  --stack tls-tcp (rustls over TCP)
# on the `offload` and `bottleneck` profiles: VIDEO connections of video
# (1 Mbit/s on offload; 0.4 Mbit/s on bottleneck, whose tbf is 500 Mbit/s)
# for 10 s, and 10 bulk connections. The server runs in the sending
# namespace (fastudp-tx, whose veth carries the bottleneck's tbf), one
# worker, on CPU 1; the load generator in fastudp-rx, on CPU 0. One CSV line per run; ROUNDS rounds, each config once
# per round. `cargo run -p fastudp-cli --example quic_chart -- CSV SVG`
# draws the chart.
#
#   scripts/quic-bench.sh [ROUNDS] [OUT.csv]   (root; build with --release first)
#   PROFILES=bottleneck scripts/quic-bench.sh ...  (one profile only)
#   WORKLOADS=bulk CONFIGS="a a-arena a-aws c c-aws d d-aws" scripts/quic-bench.sh ...
#
# CONFIGS (default "a b c d") may also name the ablation's configs
# (BENCHMARKS section 17), each (a) or (c)/(d) with one switch changed:
#   a-arena  --recv-arena: received datagrams share 64 KiB blocks
#   a-aws    --crypto aws-lc-rs on server and client (c-aws, d-aws likewise)
#   a-ack10  --ack-every 10 on server and client (c-ack10 likewise)
#   a-train20 --max-train 20; a-turn2 / a-turn32: --trains-per-turn 2 / 32
#   a-uring  --uring: the workers receive with io_uring, each datagram
#            read in place in the ring's buffers (BENCHMARKS section 13.3)
# Rounds interleave the configs; the CSV's config column names them.
set -eu
ROUNDS=${1:-1}
OUT=${2:-docs/quic-runs.csv}
B=${FASTUDP:-target/release/fastudp}
PERF=${PERF:-}  # a directory: a 3 s `perf record -a -g` of each run
VIDEO=${VIDEO:-1000}
TMP=$(mktemp -d)
PORT=4433
PIN_S= PIN_C=
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
    PIN_S="taskset -c 1" PIN_C="taskset -c 0"
fi
trap '"$B" testbed down >/dev/null 2>&1; rm -rf "$TMP"' EXIT INT TERM

json() { # json FILE KEY...: fields of a JSON object, comma-separated
    f=$1; shift
    python3 -c 'import json,sys
v=json.loads([l for l in open(sys.argv[1]) if l.strip()][-1])
print(",".join("" if v.get(k) is None else str(v.get(k)) for k in sys.argv[2:]))' "$f" "$@"
}

one() { # one PROFILE WORKLOAD CONFIG ROUND
    # On the bottleneck, fastudp's server paces its connections together
    # just under the tbf's 500 Mbit/s (user-space pacing, as the paper does
    # where the qdisc cannot); quinn and TCP have no such setting.
    pace=
    [ "$1" = bottleneck ] && pace="--total-rate 58M"
    cextra=
    case $3 in
    a*) env= stack=fastudp client=quic extra=$pace ;;
    b) env=FASTUDP_DISABLE=gso,gro,mmsg stack=fastudp client=quic extra=$pace ;;
    c*) env= stack=quinn client=quic extra= ;;
    d*) env= stack=tls-tcp client=tls-tcp extra= ;;
    *) echo "unknown config $3" >&2; exit 2 ;;
    esac
    case $3 in
    *-arena) extra="$extra --recv-arena" ;;
    *-aws) extra="$extra --crypto aws-lc-rs" cextra="--crypto aws-lc-rs" ;;
    *-ack10) extra="$extra --ack-every 10" cextra="--ack-every 10" ;;
    *-train20) extra="$extra --max-train 20" ;;
    *-turn2) extra="$extra --trains-per-turn 2" ;;
    *-turn32) extra="$extra --trains-per-turn 32" ;;
    *-uring) extra="$extra --uring" ;;
    esac
    if [ "$2" = video ]; then
        rate=125000
        [ "$1" = bottleneck ] && rate=50000
        # Clients arrive over 1 s, so their frames' phases spread.
        load="--connections $VIDEO --request /video/$rate/10 --endpoints 4 --ramp 1"
    else
        size=200000000
        [ "$1" = bottleneck ] && size=50000000
        load="--connections 10 --request /bytes/$size"
    fi
    # shellcheck disable=SC2086
    ip netns exec fastudp-tx env $env $PIN_S "$B" quic serve --stack $stack \
        --listen 10.200.0.1:$PORT --workers 1 $extra --json >"$TMP/srv.json" 2>"$TMP/srv.err" &
    srv=$!
    sleep 1
    if [ -n "$PERF" ]; then
        echo $srv >"$PERF/$1-$2-$3-$4.pid"
        perf record -e cpu-clock -a -g -o "$PERF/$1-$2-$3-$4.data" -- sleep 3 >/dev/null 2>&1 &
    fi
    # shellcheck disable=SC2086
    ip netns exec fastudp-rx $PIN_C "$B" quic load 10.200.0.1:$PORT --stack $client \
        $load $cextra --json >"$TMP/load.json" 2>"$TMP/load.err" || true
    kill -INT $srv
    wait $srv || true
    wait
    printf '%s,%s,%s,%s,%s,%s,%s\n' "$1" "$2" "$3" "$4" \
        "$(json "$TMP/srv.json" cpu_s_per_gbit goodput_gbit_s cpu_cores send_calls_s recv_calls_s datagrams_per_send_call datagrams_per_recv_call retransmissions)" \
        "$(json "$TMP/load.json" connections completed on_rate_share stalls stalled_connections client_lost_packets total_gbit_s client_cpu_s_per_gbit)" \
        "$(uptime | sed 's/.*load average: //; s/,//g')" >>"$OUT"
    PORT=$((PORT + 1))
}

[ -f "$OUT" ] || echo "profile,workload,config,round,srv_cpu_s_per_gbit,srv_goodput_gbit_s,srv_cpu_cores,send_calls_s,recv_calls_s,dg_per_send_call,dg_per_recv_call,retransmissions,connections,completed,on_rate_share,stalls,stalled_connections,client_lost_packets,load_gbit_s,client_cpu_s_per_gbit,load_avg" >"$OUT"
for profile in ${PROFILES:-offload bottleneck}; do
    "$B" testbed up $profile >/dev/null
    r=1
    while [ "$r" -le "$ROUNDS" ]; do
        for w in ${WORKLOADS:-video bulk}; do
            for c in ${CONFIGS:-a b c d}; do one $profile $w $c $r; done
        done
        echo "$profile: round $r of $ROUNDS done" >&2
        r=$((r + 1))
    done
done
