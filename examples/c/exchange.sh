#!/usr/bin/env bash
# Has fastudp-receiver and fastudp-sender (built here) exchange N datagrams
# over loopback: the receiver checks every byte and acknowledges, the
# sender keeps within its window, and the run fails unless all N arrive
# once and intact.
#
#   ./exchange.sh N [WRAP]     WRAP: a command to run both under (valgrind)
set -euo pipefail
cd "$(dirname "$0")"
n=${1:?usage: exchange.sh N [WRAP]}
read -r -a wrap <<<"${2:-}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"${wrap[@]}" ./fastudp-receiver -p 0 -n "$n" -c -a -q -i 10 >"$out" &
rx=$!
port=""
for _ in $(seq 1 600); do
    port=$(sed -n 's/^listening on port \([0-9]*\).*/\1/p' "$out")
    [ -n "$port" ] && break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "exchange.sh: the receiver did not start" >&2
    kill "$rx" 2>/dev/null || true
    exit 1
fi
"${wrap[@]}" ./fastudp-sender -p "$port" -n "$n" -a -q
status=0
wait "$rx" || status=$?
cat "$out"
summary=$(grep '^summary:' "$out" || true)
case "$summary" in
*" datagrams=$n "*" lost=0 duplicates=0 corrupt=0 out_of_range=0 "*) ;;
*) echo "exchange.sh: the receiver did not get all $n datagrams intact" >&2; exit 1 ;;
esac
[ "$status" = 0 ] || { echo "exchange.sh: receiver exit status $status" >&2; exit 1; }
echo "exchange.sh: $n datagrams, every byte checked"
