#!/bin/sh
# What the QUIC-LB balancer of `quic lb-rules` costs per packet
# (docs/BENCHMARKS.md, "QUIC-LB balancer"). On `testbed up fleet`, one
# server namespace (fastudp-s1) runs two `quic serve`:
#   lb      10.202.1.2:4433 (--lb-config 0:1:8 --server-id 01), reached
#           through the balancer's public address 10.201.0.2:4433: every
#           packet is matched and rewritten by the rules;
#   direct  10.202.1.2:4434, reached at its own address: the same hop
#           through the balancer's namespace (the same veths, forwarding
#           and routing), no rule matches it.
# The same load (CONN connections of BULK bytes, `quic load` in
# fastudp-cl) runs against each in turn, ROUNDS rounds. Per run: goodput;
# the CPU time of the client and of the server process (from the load's
# summary and /proc/PID/stat: the balancer's forwarding and rules run in
# softirq, charged to the thread whose send started them, so a packet's
# trip through the balancer counts in its sender's time; the machine's
# other load does not); the datagrams the clients sent and received; and
# for `lb` the packets the rules counted (a GSO train of the server
# crosses the balancer as one packet). One CSV line per run.
#
#   scripts/fleet-bench.sh [ROUNDS] [BIN] > runs.csv   (root; BIN defaults
#       to target/release/fastudp)
#   CONN=8 BULK=100000000 scripts/fleet-bench.sh ...
set -eu
ROUNDS=${1:-3}
BIN=${2:-target/release/fastudp}
CONN=${CONN:-8}
BULK=${BULK:-100000000}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p fastudp-cli" >&2; exit 2; }
KEY=$(mktemp)
trap 'kill $LB $DIRECT 2>/dev/null || true; "$BIN" testbed down >/dev/null 2>&1 || true; rm -f "$KEY"' EXIT INT TERM
head -c 32 /dev/urandom > "$KEY"
"$BIN" testbed up fleet >&2
# One server: the rules of a one-server fleet.
"$BIN" quic lb-rules --public 10.201.0.2:4433 --lb-config 0:1:8 --server 01=10.202.1.2 |
    ip netns exec fastudp-lb nft -f -
ip netns exec fastudp-s1 "$BIN" quic serve --listen 10.202.1.2:4433 --workers 1 \
    --lb-config 0:1:8 --server-id 01 --reset-key "$KEY" --test-endpoints --duration 3600 >/dev/null &
LB=$!
ip netns exec fastudp-s1 "$BIN" quic serve --listen 10.202.1.2:4434 --workers 1 \
    --test-endpoints --duration 3600 >/dev/null &
DIRECT=$!
sleep 1

# CPU ticks (user + system) of process $1.
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
# Packets of the rules' counters (all four).
counted() {
    ip netns exec fastudp-lb nft list counters table ip fastudp_lb |
        awk '/packets/{for(i=1;i<=NF;i++) if($i=="packets") s+=$(i+1)} END{print s+0}'
}
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

echo "mode,round,gbit_s,client_cpu_s,server_cpu_s,client_datagrams,rule_packets,cpu_us_per_datagram"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for mode in lb direct; do
        case $mode in
            lb) target=10.201.0.2:4433; pid=$LB ;;
            direct) target=10.202.1.2:4434; pid=$DIRECT ;;
        esac
        ip netns exec fastudp-lb nft reset counters table ip fastudp_lb >/dev/null
        b0=$(ticks "$pid")
        out=$(ip netns exec fastudp-cl "$BIN" quic load "$target" --connections "$CONN" \
            --endpoints "$CONN" --request "/bytes/$BULK" --json)
        b1=$(ticks "$pid")
        pk=$(counted)
        g=$(echo "$out" | field "['total_gbit_s']")
        rx=$(echo "$out" | field "['client_rx_datagrams']")
        tx=$(echo "$out" | field "['client_sent_packets']")
        ok=$(echo "$out" | field "['completed']")
        [ "$ok" = "$CONN" ] || { echo "$mode: only $ok of $CONN completed: $out" >&2; exit 1; }
        ccpu=$(echo "$out" | field "['client_cpu_s']")
        scpu=$(awk -v a="$b0" -v b="$b1" 'BEGIN{printf "%.3f", (b-a)/100}')
        per=$(awk -v c="$ccpu" -v s="$scpu" -v n="$((rx + tx))" 'BEGIN{printf "%.3f", (c+s)*1e6/n}')
        echo "$mode,$r,$g,$ccpu,$scpu,$((rx + tx)),$pk,$per"
    done
    r=$((r + 1))
done
