#!/usr/bin/env bash
# The C examples on libfastudp against `fastudp tx`/`rx` on loopback, with
# GSO trains of 44 datagrams of 1472 bytes, 8 trains per send call, and a
# GRO receiver (docs/BENCHMARKS.md, section 11). Four pairs per round, in
# turn: Rust -> Rust, C -> C, C -> Rust, Rust -> C; ROUNDS rounds of
# SECONDS each. One line per run (receiver's Gbit/s, sender's and
# receiver's thread CPU ns per byte), then per round the C/Rust ratios of
# each side, and their medians. The receiver runs on CPU 1 and the sender
# on CPU 0 (taskset), as `fastudp bench` pins them: unpinned, the run is
# bimodal on a 2-CPU VM (both threads on one CPU, or not). Both receivers
# ask for an 8 MiB receive buffer (`fastudp rx` does).
#
#   scripts/capi-bench.sh [ROUNDS] [SECONDS]
# Needs target/release/fastudp (cargo build --release -p fastudp-cli) and
# the examples built (scripts/capi.sh install --prefix P;
# PKG_CONFIG_PATH=P/lib/pkgconfig make -C examples/c).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-5}
B=${FASTUDP:-${CARGO_TARGET_DIR:-target}/release/fastudp}
C=examples/c
port=18000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# field NAME FILE: a number from a `summary:` line or fastudp's JSON.
field() {
    sed -n -e "s/.* $1=\([-0-9.e]*\).*/\1/p" -e "s/^ *\"$1\": \([-0-9.e]*\),*$/\1/p" "$2" | head -1
}

run() { # run TX RX: prints "tx rx rx_gbps tx_ns_per_byte rx_ns_per_byte"
    case "$2" in
    rust) taskset -c 1 "$B" rx -G -p $port --idle 1 -q --json >"$tmp/rx" & ;;
    c) taskset -c 1 "$C/fastudp-receiver" -p $port -b 8388608 -i 1 -q >"$tmp/rx" & ;;
    esac
    local rx=$!
    sleep 0.5
    case "$1" in
    rust) taskset -c 0 "$B" tx -D 127.0.0.1 -p $port -S 1472 -m -l "$secs" -q --json >"$tmp/tx" ;;
    c) taskset -c 0 "$C/fastudp-sender" -p $port -s 1472 -g 44 -m 8 -l "$secs" -q >"$tmp/tx" ;;
    esac
    wait $rx
    echo "$1 $2 $(field gbps "$tmp/rx") $(field cpu_ns_per_byte "$tmp/tx") $(field cpu_ns_per_byte "$tmp/rx")"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "round tx rx rx_gbps tx_ns_per_byte rx_ns_per_byte"
: >"$tmp/ratios"
for r in $(seq 1 "$rounds"); do
    rr=$(run rust rust); echo "$r $rr"
    cc=$(run c c); echo "$r $cc"
    cr=$(run c rust); echo "$r $cr"
    rc=$(run rust c); echo "$r $rc"
    # C / Rust: throughput and CPU per byte of both pairs; the sender
    # alone (C -> Rust vs Rust -> Rust) and the receiver alone (Rust -> C
    # vs Rust -> Rust).
    echo "$rr|$cc|$cr|$rc" | awk -F'|' '{
        split($1, rr, " "); split($2, cc, " "); split($3, cr, " "); split($4, rc, " ");
        printf "%.4f %.4f %.4f %.4f %.4f %.4f\n",
            cc[3] / rr[3], cc[4] / rr[4], cc[5] / rr[5], cr[4] / rr[4], rc[5] / rr[5], cr[3] / rr[3]
    }' >>"$tmp/ratios"
done
echo
echo "C/Rust per round: pair_gbps pair_tx_cpu pair_rx_cpu sender_cpu(C->Rust) receiver_cpu(Rust->C) C->Rust_gbps"
cat "$tmp/ratios"
printf 'median:'
for k in 1 2 3 4 5 6; do printf ' %s' "$(awk -v k=$k '{print $k}' "$tmp/ratios" | median)"; done
echo
