#!/bin/sh
# Figure 4 on the `bottleneck` testbed profile: 25 flows x 2 MB/s into a
# 500 Mbit/s tbf with a 32 KiB queue. Every interval (1, 2, 4, 8 ms) paced
# and unpaced with full GSO trains, the one-datagram-every-1-ms baseline,
# and a max-burst sweep at 8 ms; ROUNDS rounds, each config once per round
# (so that drift on the host touches every config alike). One CSV line per
# run; `cargo run -p fastudp-lab --example fig4 -- CSV SVG` turns it into
# medians and a chart. rx_loss is the receiver's, over the flows it saw;
# tx_dropped_locally the datagrams the sender's own full qdisc dropped
# (ENOBUFS); 1 - rx_bytes / tx_bytes the loss over every flow.
#
#   scripts/fig4.sh [ROUNDS] [OUT.csv]      (root; build with --release first)
set -eu
ROUNDS=${1:-5}
OUT=${2:-docs/fig4-runs.csv}
B=${FASTUDP:-target/release/fastudp}
TMP=$(mktemp -d)
"$B" testbed up bottleneck >/dev/null
trap '"$B" testbed down >/dev/null; rm -rf "$TMP"' EXIT INT TERM

field() { # field NAME FILE: a number from fastudp's pretty JSON
    sed -n "s/^ *\"$1\": \([-0-9.e]*\),*$/\1/p" "$2"
}

one() { # one INTERVAL BURST PACING ROUND
    ip netns exec fastudp-rx "$B" stream-rx --flows 25 --rate 2M --idle 1 --json >"$TMP/rx.json" &
    rx=$!
    sleep 0.5
    ip netns exec fastudp-tx "$B" stream --dest 10.200.0.2 --flows 25 --rate 2M \
        --interval "$1" --max-burst "$2" --pacing "$3" --duration 3 --json >"$TMP/tx.json"
    wait $rx
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$1" "$2" "$3" \
        "$(field gbps "$TMP/tx.json")" "$(field cpu_ns_per_byte "$TMP/tx.json")" \
        "$(field calls_per_sec "$TMP/tx.json")" "$(field loss "$TMP/rx.json")" \
        "$(field flows_within_5pct "$TMP/rx.json")" "$(field max_back_to_back "$TMP/rx.json")" \
        "$(field host_steal "$TMP/tx.json")" "$4" \
        "$(field datagrams "$TMP/tx.json")" "$(field dropped_locally "$TMP/tx.json")" \
        "$(field bytes "$TMP/tx.json")" "$(field bytes "$TMP/rx.json")" >>"$OUT"
}

echo "interval_ms,max_burst,pacing,tx_gbps,tx_cpu_ns_per_byte,tx_calls_per_sec,rx_loss,rx_flows_within_5pct,rx_max_back_to_back,host_steal,round,tx_datagrams,tx_dropped_locally,tx_bytes,rx_bytes" >"$OUT"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for i in 1 2 4 8; do
        for p in user none; do one "$i" 32 "$p" "$r"; done
    done
    one 1 1 user "$r"
    for b in 1 2 4 8; do
        for p in user none; do one 8 "$b" "$p" "$r"; done
    done
    echo "round $r of $ROUNDS done" >&2
    r=$((r + 1))
done
