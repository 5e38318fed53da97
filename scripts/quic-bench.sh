#!/bin/sh
# Full-application figures of `fastudp quic serve` on the testbed
# (BENCHMARKS sections 14 and 17): the same workloads against
#   a  quic serve (quinn-proto on fastudp, everything on)
#   b  the same with FASTUDP_DISABLE=gso,gro,mmsg (UDP without offloads)
#   c  --stack quinn (plain quinn, tokio, quinn's own socket)
#   d  --stack tls-tcp (rustls over TCP)
#   g  quic-go (target/quic-go-hqserver, tools/quic-go-client/hqserver:
#      the same hq-interop requests and bytes; GOMAXPROCS=1)
# on the `offload` and `bottleneck` profiles (and `jumbo`, `offload` with
# MTU 9000, where (a) and (c) may probe for larger packets and the QUIC
# clients take them: --max-udp-payload 8972 on both sides (plain quinn
# stops at 6550); TCP takes the MTU by itself; quic-go cannot send
# packets over 1452 bytes): VIDEO connections of video
# (1 Mbit/s on offload; 0.4 Mbit/s on bottleneck, whose tbf is 500 Mbit/s)
# for 10 s, and 10 bulk connections. The server runs in the sending
# namespace (fastudp-tx, whose veth carries the bottleneck's tbf), one
# worker, on CPU 1; the load generator in fastudp-rx, on CPU 0. Every
# connection uses TLS_AES_128_GCM_SHA256 (the only suite `quic load`
# offers). One CSV line per run; ROUNDS rounds, each config once
# per round. `cargo run -p fastudp-lab --example quic_chart -- CSV SVG`
# draws the chart.
#
#   scripts/quic-bench.sh [ROUNDS] [OUT.csv]   (root; build with --release
#       and scripts/build-quic-go-client.sh first)
#   PROFILES=bottleneck scripts/quic-bench.sh ...  (one profile only)
#   PROFILES="offload jumbo" WORKLOADS=bulk CONFIGS="a c d g" scripts/quic-bench.sh ...
#   BULK=50000000 ... (bytes per bulk connection; default 200000000)
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
#   a-0      --timer-tick-us 0 --rx-coalesce-us 0: every timer at its own
#            time and a loop turn for every arrival (the defaults are 1 ms
#            ticks and a turn at most every 250 us; BENCHMARKS 17.3)
#   a-notick --timer-tick-us 0; a-nocoal --rx-coalesce-us 0: one of them
#   a-coal500 --rx-coalesce-us 500; a-tick2000 --timer-tick-us 2000
#   a-busy   --busy-poll-us 50: poll the socket 50 us before sleeping
# Rounds interleave the configs; the CSV's config column names them. Its
# last column is the mean UDP payload of the datagrams the QUIC clients
# received (the server's packet size; empty for TCP).
set -eu
ROUNDS=${1:-1}
OUT=${2:-docs/quic-runs.csv}
B=${FASTUDP:-target/release/fastudp}
QGO=${QUIC_GO_SERVER:-target/quic-go-hqserver}
PERF=${PERF:-}  # a directory: a 3 s `perf record -a -g` of each run
VIDEO=${VIDEO:-1000}
BULK=${BULK:-200000000}  # bytes per bulk connection (a quarter on bottleneck)
TMP=$(mktemp -d)
PORT=4433
PIN_S= PIN_C=
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
    PIN_S="taskset -c 1" PIN_C="taskset -c 0"
fi
trap '"$B" testbed down >/dev/null 2>&1; rm -rf "$TMP"' EXIT INT TERM

json() { # json FILE KEY...: fields of a JSON object, comma-separated
    # The object is the last `"kind":"summary"` line (quic serve prints its
    # drain and files lines after it), or the last line when none is.
    f=$1; shift
    python3 -c 'import json,sys
ls=[json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
s=[o for o in ls if o.get("kind") == "summary"]
v=(s or ls or [{}])[-1]
print(",".join("" if v.get(k) is None else str(v.get(k)) for k in sys.argv[2:]))' "$f" "$@"
}

one() { # one PROFILE WORKLOAD CONFIG ROUND
    # On the bottleneck, fastudp's server paces its connections together
    # just under the tbf's 500 Mbit/s (user-space pacing, as the paper does
    # where the qdisc cannot); quinn and TCP have no such setting.
    pace=
    [ "$1" = bottleneck ] && pace="--total-rate 58M"
    # On jumbo, path-MTU discovery may look up to the veth's 9000 bytes.
    mtu=
    [ "$1" = jumbo ] && mtu="--max-udp-payload 8972"
    cextra=
    [ "$1" = jumbo ] && cextra="--max-udp-payload 8972"
    perip="--max-connections-per-ip $VIDEO"
    case $3 in
    # The load generator is one address: fastudp's server would take only
    # a quarter of its connections from it (--max-connections-per-ip).
    a*) env= stack=fastudp client=quic extra="$pace $mtu $perip" ;;
    b) env=FASTUDP_DISABLE=gso,gro,mmsg stack=fastudp client=quic extra="$pace $mtu $perip" ;;
    c*) env= stack=quinn client=quic extra=$mtu ;;
    d*) env= stack=tls-tcp client=tls-tcp extra= ;;
    g) env=GOMAXPROCS=1 stack=quic-go client=quic extra= ;;
    *) echo "unknown config $3" >&2; exit 2 ;;
    esac
    case $3 in
    *-arena) extra="$extra --recv-arena" ;;
    *-aws) extra="$extra --crypto aws-lc-rs" cextra="$cextra --crypto aws-lc-rs" ;;
    *-ack10) extra="$extra --ack-every 10" cextra="$cextra --ack-every 10" ;;
    *-train20) extra="$extra --max-train 20" ;;
    *-turn2) extra="$extra --trains-per-turn 2" ;;
    *-turn32) extra="$extra --trains-per-turn 32" ;;
    *-uring) extra="$extra --uring" ;;
    *-0) extra="$extra --timer-tick-us 0 --rx-coalesce-us 0" ;;
    *-notick) extra="$extra --timer-tick-us 0" ;;
    *-nocoal) extra="$extra --rx-coalesce-us 0" ;;
    *-coal500) extra="$extra --rx-coalesce-us 500" ;;
    *-tick2000) extra="$extra --timer-tick-us 2000" ;;
    *-busy) extra="$extra --busy-poll-us 50" ;;
    esac
    if [ "$2" = video ]; then
        rate=125000
        [ "$1" = bottleneck ] && rate=50000
        # Clients arrive over 1 s, so their frames' phases spread.
        load="--connections $VIDEO --request /video/$rate/10 --endpoints 4 --ramp 1"
    else
        size=$BULK
        [ "$1" = bottleneck ] && size=$((BULK / 4))
        # A loaded machine may take minutes; a run is not given up on.
        load="--connections 10 --request /bytes/$size --timeout 900"
    fi
    if [ "$stack" = quic-go ]; then
        # shellcheck disable=SC2086
        ip netns exec fastudp-tx env $env $PIN_S "$QGO" -listen 10.200.0.1:$PORT \
            >"$TMP/srv.json" 2>"$TMP/srv.err" &
    else
        # shellcheck disable=SC2086
        ip netns exec fastudp-tx env $env $PIN_S "$B" quic serve --stack $stack \
            --listen 10.200.0.1:$PORT --workers 1 --test-endpoints $extra --json >"$TMP/srv.json" 2>"$TMP/srv.err" &
    fi
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
    printf '%s,%s,%s,%s,%s,%s,%s,%s\n' "$1" "$2" "$3" "$4" \
        "$(json "$TMP/srv.json" cpu_s_per_gbit goodput_gbit_s cpu_cores send_calls_s recv_calls_s datagrams_per_send_call datagrams_per_recv_call retransmissions)" \
        "$(json "$TMP/load.json" connections completed on_rate_share stalls stalled_connections client_lost_packets total_gbit_s client_cpu_s_per_gbit)" \
        "$(uptime | sed 's/.*load average: //; s/,//g')" \
        "$(python3 -c 'import json,sys
v=json.loads([l for l in open(sys.argv[1]) if l.strip()][-1])
d=v.get("client_rx_datagrams") or 0
print(round(v.get("client_rx_udp_bytes", 0) / d) if d else "")' "$TMP/load.json")" >>"$OUT"
    if [ -s "$TMP/load.err" ]; then sed "s/^/$1 $2 $3 $4: /" "$TMP/load.err" >&2; fi
    PORT=$((PORT + 1))
}

[ -f "$OUT" ] || echo "profile,workload,config,round,srv_cpu_s_per_gbit,srv_goodput_gbit_s,srv_cpu_cores,send_calls_s,recv_calls_s,dg_per_send_call,dg_per_recv_call,retransmissions,connections,completed,on_rate_share,stalls,stalled_connections,client_lost_packets,load_gbit_s,client_cpu_s_per_gbit,load_avg,rx_udp_bytes_per_datagram" >"$OUT"
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
