#!/usr/bin/env bash
# Soak with fault injection (root):
#
#   sudo scripts/soak.sh [MINUTES]      (default 30; CI runs 1)
#
# Runs `fastudp-lab soak` for MINUTES: every send strategy (the io_uring ones
# included) and every receive strategy in turn, over IPv4 and IPv6,
# 10,000 datagrams/s of 1400 bytes, across a veth pair between two network
# namespaces of its own (fusoak-<pid>-tx/rx, veth fsk<pid>t/r; the shared
# testbed is not touched). Once per slot a fault strikes and heals. On the
# sending link: link down/up, MTU 1500 -> 1280 -> 1500, tx checksum
# offload off/on, tx-udp-segmentation off/on, a GSO refusal (no UDP
# checksum on the sending socket). On the receiving side: a receiver
# restart, link down/up, its MTU alone to 1280 and back, GRO toggled and
# back, and a receive-buffer squeeze. Every datagram carries a sequence
# number and a checksum. The run fails (non-zero exit) on a duplicate or
# damaged datagram, loss outside a fault's window, a fault the library did
# not report as an error or a counted fallback, a squeeze's loss the kernel
# did not count, an io_uring strategy that did not run on its ring, a
# sender that stalled or whose GSO did not come back on, a hang, or memory
# or descriptors that grow. Rates never fail it: the rate after each heal
# is reported against the slot's own rate before the fault.
#
# The report goes to stdout and, as JSON, to $SOAK_JSON (default
# target/soak/soak-<MINUTES>min.json). A hard wall-clock cap of MINUTES+2
# minutes stops a run that overstays (Ctrl-C first, then kill); whatever
# happens, the namespaces are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-30}
case $minutes in
  '' | *[!0-9]* | 0)
    echo "usage: scripts/soak.sh [MINUTES]   (a whole number of minutes, at least 1)" >&2
    exit 2
    ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "error: the soak needs root: it builds network namespaces and a veth pair and switches their offloads; run: sudo scripts/soak.sh $minutes" >&2
  exit 2
fi
for tool in ip ethtool timeout; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: the soak needs \`$tool\` (Debian: apt-get install iproute2 ethtool coreutils)" >&2
    exit 2
  fi
done

target=${CARGO_TARGET_DIR:-target}
json=${SOAK_JSON:-target/soak/soak-${minutes}min.json}
mkdir -p "$(dirname "$json")"
cargo build -p fastudp-lab
bin=$target/debug/fastudp-lab

# Namespaces of soak runs whose process is gone (a run killed at the cap
# cannot remove its own): only those, never a live run's.
cleanup() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fusoak-[0-9]+-(tx|rx)$' || true); do
    pid=${ns#fusoak-}
    pid=${pid%-*}
    if ! kill -0 "$pid" 2>/dev/null; then
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT

cap=$(((minutes + 2) * 60))
echo "soak: $minutes min (hard cap ${cap} s), report in $json; load: $(uptime)"
# timeout runs the soak in a process group of its own: Ctrl-C here is
# passed on (the soak then reports the slots done and removes its
# namespaces).
timeout --signal=INT --kill-after=20 "$cap" "$bin" soak --minutes "$minutes" --json "$json" &
tpid=$!
trap 'kill -INT "$tpid" 2>/dev/null || true' INT TERM
rc=0
wait "$tpid" || rc=$?
while kill -0 "$tpid" 2>/dev/null; do
  rc=0
  wait "$tpid" || rc=$?
done
case $rc in
  0) echo "soak: passed" ;;
  124 | 130 | 137) echo "soak: stopped at the ${cap}-second cap or interrupted (exit $rc)" >&2 ;;
  *) echo "soak: FAILED (exit $rc); see $json" >&2 ;;
esac
exit "$rc"
