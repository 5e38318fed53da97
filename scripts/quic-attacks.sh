#!/usr/bin/env bash
# Runs every hostile client of `fastudp-lab attack` against
# `fastudp quic serve` at its default settings, each for a bounded time,
# in two network namespaces of its own joined by a veth pair, and prints
# per attack: the server's peak RSS, whether and how fast a legitimate
# client (a fresh connection fetching /bytes/1000, up to 3 tries) was
# served during the attack, how long Ctrl-C took, and the server's drop
# counters.
#
# Needs root (namespaces, tc). Usage:
#   sudo scripts/quic-attacks.sh [SECONDS_PER_ATTACK] [FASTUDP_BINARY] [FASTUDP_LAB_BINARY]
# (the server and the legitimate client are FASTUDP_BINARY, default
# target/release/fastudp; the attacks are FASTUDP_LAB_BINARY, default
# target/release/fastudp-lab: cargo build --release -p fastudp-cli -p fastudp-lab).
# Traffic stays inside the namespaces; each attack ends by itself.
set -euo pipefail

SECS=${1:-10}
BIN=${2:-target/release/fastudp}
LAB=${3:-target/release/fastudp-lab}
[ "$(id -u)" = 0 ] || { echo "quic-attacks.sh: needs root (namespaces, tc)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "quic-attacks.sh: no binary at $BIN (cargo build --release -p fastudp-cli)" >&2; exit 2; }
[ -x "$LAB" ] || { echo "quic-attacks.sh: no binary at $LAB (cargo build --release -p fastudp-lab)" >&2; exit 2; }
BIN=$(readlink -f "$BIN")
LAB=$(readlink -f "$LAB")

TAG=$$
C=fu-qa-c-$TAG
S=fu-qa-s-$TAG
CIF=qa${TAG}c
SIF=qa${TAG}s
TMP=$(mktemp -d)
cleanup() {
    [ -n "${SRV:-}" ] && kill -INT "$SRV" 2>/dev/null || true
    ip netns del "$C" 2>/dev/null || true
    ip netns del "$S" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

ip netns add "$C"
ip netns add "$S"
# Two queues each, so that GRO can be turned on for the last attack.
ip link add "$CIF" numtxqueues 2 numrxqueues 2 netns "$C" type veth \
    peer name "$SIF" numtxqueues 2 numrxqueues 2 netns "$S"
ip -n "$C" addr add 10.232.0.1/24 dev "$CIF"
# The attacks send from an address of their own (the server bounds what
# one address holds: --max-connections-per-ip); the legitimate client
# sends from 10.232.0.1.
ip -n "$C" addr add 10.232.0.3/24 dev "$CIF"
ip -n "$S" addr add 10.232.0.2/24 dev "$SIF"
for n in "$C" "$S"; do ip -n "$n" link set lo up; done
ip -n "$C" link set "$CIF" up
ip -n "$S" link set "$SIF" up

PORT=4433
ADDR=10.232.0.2:$PORT

# Peak resident memory of a process, MiB.
hwm() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
# A number field of the last JSON line of a kind in a file.
field() { grep "\"kind\":\"$2\"" "$1" | tail -1 | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }

printf '%-14s %-40s %9s %8s %7s %8s %s\n' attack what peak_MiB served serve_s ctrl_c_s drops
run() {
    local name=$1 what=$2 shaped=$3
    shift 3
    if [ "$shaped" = yes ]; then
        # A slow egress whose queue outlasts the send socket's buffer:
        # sends find the socket full.
        ip netns exec "$S" tc qdisc add dev "$SIF" root tbf rate 10mbit burst 16kb limit 16mb
    fi
    ip netns exec "$S" "$BIN" quic serve --listen "$ADDR" --test-endpoints --json --stats >"$TMP/srv.json" 2>"$TMP/srv.err" &
    SRV=$!
    for _ in $(seq 100); do grep -q '"listening"' "$TMP/srv.json" 2>/dev/null && break; sleep 0.05; done
    ip netns exec "$C" "$LAB" attack "$@" --source 10.232.0.3 "$ADDR" --duration "$SECS" >"$TMP/att.out" 2>&1 &
    local att=$!
    sleep 2
    local t0 t1 served=no tries=0
    t0=$(date +%s.%N)
    # Like a real client, it tries again when nothing answered (`quic
    # load` gives up after 5 s of silence): its Initial competes with the
    # flood for the server's receive buffer.
    while [ "$served" = no ] && [ "$tries" -lt 3 ]; do
        tries=$((tries + 1))
        if ip netns exec "$C" "$BIN" quic load "$ADDR" --connections 1 --request /bytes/1000 \
            --json --timeout $((SECS + 30)) >"$TMP/load.json" 2>/dev/null; then
            served=yes
        fi
    done
    t1=$(date +%s.%N)
    # Ctrl-C a second before the attack ends (deadlines and timeouts
    # have had their time), while it still goes on.
    local left
    left=$(echo "$t0 - 2 + $SECS - 1 - $(date +%s.%N)" | bc)
    if [ "$(echo "$left > 0" | bc)" = 1 ]; then sleep "$left"; fi
    local peak stop0 stop1
    peak=$(hwm "$SRV")
    stop0=$(date +%s.%N)
    kill -INT "$SRV"
    wait "$SRV" || true
    stop1=$(date +%s.%N)
    SRV=
    wait "$att" || true
    local drops
    drops="fwd=$(field "$TMP/srv.json" summary forward_dropped) stateless=$(field "$TMP/srv.json" summary stateless_dropped) timeouts=$(field "$TMP/srv.json" summary request_timeouts) refused=$(field "$TMP/srv.json" summary refused)"
    printf '%-14s %-40s %9s %8s %7.2f %8.2f %s\n' "$name" "$what" "$peak" "$served/$tries" \
        "$(echo "$t1 - $t0" | bc)" "$(echo "$stop1 - $stop0" | bc)" "$drops"
    if [ "$shaped" = yes ]; then
        ip netns exec "$S" tc qdisc del dev "$SIF" root
    fi
}

run forward "1: trains steered to the wrong worker" no forward
run windows "2: 100 streams x gap at byte 0, 4 conns" no windows --connections 4 --streams 100
run version "3: unknown versions, send socket full" yes version
run slow-requests "4: unfinished requests, kept alive" no slow-requests --connections 50 --streams 100
run connections "5: idle connections" no connections --connections 2000 --streams 0
run never-read "6: responses never read" no never-read --connections 50 --streams 16
run initials "Initial flood from 64 ports" no initials

# The remote variant of the first: the trains are cut before the veth (a
# NIC without UDP segmentation offload) and coalesced again by GRO on the
# server's side (the testbed's wire-gro profile).
if command -v ethtool >/dev/null; then
    ip netns exec "$C" ethtool -K "$CIF" tx-udp-segmentation off
    ip netns exec "$C" ethtool -L "$CIF" rx 2 tx 2
    ip netns exec "$S" ethtool -L "$SIF" rx 2 tx 2
    ip netns exec "$S" ethtool -K "$SIF" gro on rx-udp-gro-forwarding on
    echo 50000 | ip netns exec "$S" tee "/sys/class/net/$SIF/gro_flush_timeout" >/dev/null
    run forward-gro "1: the same, cut on the wire, GRO again" no forward
else
    echo "forward-gro: skipped (needs ethtool)"
fi
