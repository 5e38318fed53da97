#!/usr/bin/env bash
# The QUIC server under faults (root):
#
#   sudo scripts/quic-soak.sh [ROUNDS]      (default 3)
#
# `fastudp quic serve` in one network namespace, `fastudp quic load` in
# another, a veth pair of their own between them (fuqsoak-<pid>-srv/cli,
# veth fqs<pid>s/c; the shared testbed is not touched). Each round runs
# three phases, each a load of 100 video connections
# (/video/62500/15: 62.5 kB/s each for 15 s, 50 Mbit/s in all):
#
#   link-down       5 s in, the server's link down for 2 s, then up
#   mtu-1280        5 s in, both ends' MTU 1500 -> 1280 for 4 s -> 1500
#   client-restart  5 s in, the load (the receiver) is killed and a new
#                   load of 100 connections starts at once
#
# The server runs with --idle-timeout 10 (the default is 30 s): longer
# than every fault, and short enough that a killed client's connections
# are gone soon after the kill. The run
# fails (non-zero exit) on:
#   - a connection lost to the link or MTU fault (every one of the 100
#     must complete, with the right bytes), or a failed connection of the
#     load started after a client restart;
#   - a connection that does not return to its rate within 10 s of the
#     heal (the time each one took is reported: median, 90th percentile,
#     maximum);
#   - the killed client's connections still open on the server 10 s
#     (the idle timeout) plus 10 s after the kill;
#   - server memory that grows: RSS after each phase, with every
#     connection gone, may grow at most 8 MB from the first round's end to
#     the last round's end;
#   - a server that exits, or a phase that overstays (each load is capped
#     by its own --timeout, and the whole run by a wall-clock cap).
# "Back at its rate": the first moment after the heal from which the
# connection received, over the next second, at least 90% of a second of
# its stream (from `quic load --timeline 100`). "low s": the median
# connection's lowest second while the fault lasted, as a share of the
# rate (the MTU fault is held 4 s, long enough to adapt within it).
#
# The report goes to stdout and, as JSON, to $QUIC_SOAK_JSON (default
# target/quic-soak/quic-soak-<ROUNDS>rounds.json). $QUIC_SOAK_DOWN sets the
# link-down's length in seconds (default 2): past the idle timeout (say
# 12), the connections are lost and the run fails, as it must.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${1:-3}
case $rounds in
  '' | *[!0-9]* | 0)
    echo "usage: scripts/quic-soak.sh [ROUNDS]   (a whole number, at least 1)" >&2
    exit 2
    ;;
esac
if [ "$rounds" -gt 100 ]; then
  echo "error: at most 100 rounds" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "error: needs root (network namespaces, a veth pair); run: sudo scripts/quic-soak.sh $rounds" >&2
  exit 2
fi
for tool in ip timeout python3; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: needs \`$tool\` (Debian: apt-get install iproute2 coreutils python3)" >&2
    exit 2
  fi
done

target=${CARGO_TARGET_DIR:-target}
json=${QUIC_SOAK_JSON:-target/quic-soak/quic-soak-${rounds}rounds.json}
mkdir -p "$(dirname "$json")"
cargo build -p fastudp-cli
bin=$(realpath "$target/debug/fastudp")

conns=100
rate=62500
secs=15
strike=5
idle=10
down=${QUIC_SOAK_DOWN:-2}
case $down in
  '' | *[!0-9]* | 0)
    echo "error: QUIC_SOAK_DOWN=$down: a whole number of seconds, at least 1" >&2
    exit 2
    ;;
esac
request=/video/$rate/$secs
srv=fuqsoak-$$-srv
cli=fuqsoak-$$-cli
sdev=fqs$$s
cdev=fqs$$c
saddr=10.78.0.1
caddr=10.78.0.2
work=$(mktemp -d /tmp/quic-soak.XXXXXX)
spid=

cleanup() {
  if [ -n "$spid" ]; then
    kill -INT "$spid" 2>/dev/null || true
    sleep 1
    kill -KILL "$spid" 2>/dev/null || true
  fi
  ip netns pids "$cli" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns del "$srv" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# The whole run's cap: phases of at most secs+40 s plus 30 s of drain.
cap=$((rounds * 3 * (secs + 70 + down) + 60))
(
  sleep "$cap"
  echo "quic-soak: the ${cap}-second cap passed; stopping" >&2
  kill -TERM $$ 2>/dev/null
) &
capper=$!
trap 'kill "$capper" 2>/dev/null || true; cleanup' EXIT
trap 'exit 143' TERM INT

ip netns add "$srv"
ip netns add "$cli"
ip -n "$srv" link add "$sdev" type veth peer name "$cdev" netns "$cli"
ip -n "$srv" addr add "$saddr/24" dev "$sdev"
ip -n "$cli" addr add "$caddr/24" dev "$cdev"
for x in "$srv $sdev" "$cli $cdev"; do
  set -- $x
  ip -n "$1" link set lo up
  ip -n "$1" link set "$2" mtu 1500 up
done

now_ms() { date +%s%3N; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$spid/status"; }
alive() {
  if ! kill -0 "$spid" 2>/dev/null; then
    echo "quic-soak: FAILED: the server exited; its output:" >&2
    tail -5 "$work/server.jsonl" >&2
    exit 1
  fi
}
# The server's open connections, from its latest stats line.
server_conns() {
  python3 -c '
import json, sys
n = None
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "connections" in j:
        n = j["connections"]
print(-1 if n is None else n)' "$work/server.jsonl"
}
# Waits until the server holds no connection (at most LIMIT s); prints
# the seconds it took, or fails.
drained() {
  local limit=$1 t0 n
  t0=$(now_ms)
  while :; do
    alive
    n=$(server_conns)
    if [ "$n" = 0 ]; then
      echo $((($(now_ms) - t0) / 1000))
      return 0
    fi
    if [ $(($(now_ms) - t0)) -gt $((limit * 1000)) ]; then
      echo "quic-soak: FAILED: the server still holds $n connections ${limit} s on" >&2
      exit 1
    fi
    sleep 0.5
  done
}
# Runs in the background as `load FILE &`: exec, so that $! is the load
# itself (ip netns exec execs too), which a client restart kills.
load() {
  exec ip netns exec "$cli" "$bin" quic load "$saddr:4433" --connections "$conns" \
    --request "$request" --timeline 100 --json --timeout $((secs + 30)) >"$1" 2>"$1.err"
}

ip netns exec "$srv" "$bin" quic serve --listen "$saddr:4433" --idle-timeout "$idle" \
  --test-endpoints --stats --json >"$work/server.jsonl" 2>"$work/server.err" &
spid=$!
for _ in $(seq 100); do
  grep -q '"listening"' "$work/server.jsonl" 2>/dev/null && break
  sleep 0.1
done
alive
echo "quic-soak: $rounds rounds x (link-down, mtu-1280, client-restart), $conns connections of $request; server pid $spid; load: $(uptime)"

phases=()
for r in $(seq "$rounds"); do
  for fault in link-down mtu-1280 client-restart; do
    alive
    out=$work/r$r-$fault.json
    load "$out" &
    lpid=$!
    sleep "$strike"
    struck=$(now_ms)
    case $fault in
      link-down)
        ip -n "$srv" link set "$sdev" down
        sleep "$down"
        ip -n "$srv" link set "$sdev" up
        ;;
      mtu-1280)
        ip -n "$srv" link set "$sdev" mtu 1280
        ip -n "$cli" link set "$cdev" mtu 1280
        sleep 4
        ip -n "$cli" link set "$cdev" mtu 1500
        ip -n "$srv" link set "$sdev" mtu 1500
        ;;
      client-restart)
        kill -KILL "$lpid" 2>/dev/null || true
        wait "$lpid" 2>/dev/null || true
        load "$out" &
        lpid=$!
        ;;
    esac
    healed=$(now_ms)
    rc=0
    wait "$lpid" || rc=$?
    alive
    # Every connection gone: the finished ones closed, a killed client's
    # timed out (the idle timeout, plus margin).
    took=$(drained $((idle + 10)))
    phases+=("$r $fault $struck $healed $rc $(rss_kb) $took $out")
    echo "quic-soak: round $r, $fault: load exit $rc, server RSS $(rss_kb) kB, drained in ${took} s"
  done
done

kill "$capper" 2>/dev/null || true
printf '%s\n' "${phases[@]}" >"$work/phases"
python3 - "$json" "$rate" "$conns" "$work/phases" <<'EOF'
import json, sys
out, rate, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phase_lines = open(sys.argv[4]).read().splitlines()
BOUND_MS = 10_000
MAX_RSS_GROWTH_KB = 8192
phases, failures = [], []
for line in phase_lines:
    r, fault, struck, healed, rc, rss, took, path = line.split()
    struck, healed = int(struck), int(healed)
    try:
        j = json.load(open(path))
    except (OSError, ValueError) as e:
        failures.append(f"round {r}, {fault}: no report from the load ({e})")
        continue
    p = {"round": int(r), "fault": fault, "load_exit": int(rc), "server_rss_kb": int(rss),
         "drained_s": int(took), "connections": j["connections"], "completed": j["completed"],
         "failed": j["failed"], "wrong_bytes": j["wrong_bytes"], "errors": j["errors"],
         "held_ms": healed - struck, "max_gap_ms": j["max_gap_ms"],
         "client_lost_packets": j["client_lost_packets"]}
    if j["failed"] or j["wrong_bytes"] or j["completed"] != conns:
        failures.append(f"round {r}, {fault}: {j['completed']} of {conns} connections completed, "
                        f"{j['wrong_bytes']} with wrong bytes: {j['errors']}")
    if fault != "client-restart":
        b = j["timeline_ms"]
        heal = (healed - j["started_unix_ms"]) / b
        strike = (struck - j["started_unix_ms"]) / b
        w = int(round(1000 / b))
        need = 0.9 * rate
        rec, late, lows = [], [], []
        for i, tl in enumerate(j["timelines"]):
            # The lowest second while the fault lasted, as a share of the
            # rate (windows that start in it).
            sums = [sum(tl[k:k + w]) for k in range(int(strike), int(heal) + 1)
                    if k + w <= len(tl)]
            if sums:
                lows.append(min(sums) / rate)
            start = int(heal)
            got = None
            for k in range(start, len(tl)):
                if sum(tl[k:k + w]) >= need:
                    got = max(0.0, (k - heal) * b)
                    break
                if k + w > len(tl):
                    break
            if got is None and sum(tl[start:]) > 0 and len(tl) - heal < w:
                # The stream ended within a second of the heal, at its
                # rate: back from the first byte.
                got = max(0.0, (next(k for k in range(start, len(tl)) if tl[k]) - heal) * b)
            if got is None or got > BOUND_MS:
                late.append(i)
            else:
                rec.append(got)
        if late:
            failures.append(f"round {r}, {fault}: {len(late)} connections not back at their "
                            f"rate within {BOUND_MS} ms of the heal (e.g. {late[:5]})")
        lows.sort()
        if lows:
            p["lowest_second_during_fault"] = {"median": lows[len(lows) // 2], "min": lows[0]}
        rec.sort()
        if rec:
            p["recovery_ms"] = {"median": rec[len(rec) // 2],
                                "p90": rec[min(len(rec) - 1, int(len(rec) * 0.9))],
                                "max": rec[-1], "connections": len(rec)}
    phases.append(p)
rss = {}
for p in phases:
    rss.setdefault(p["round"], p["server_rss_kb"])
    rss[p["round"]] = p["server_rss_kb"]
rounds = sorted(rss)
growth = rss[rounds[-1]] - rss[rounds[0]] if rounds else 0
if len(rounds) >= 2 and growth > MAX_RSS_GROWTH_KB:
    failures.append(f"server RSS grew {growth} kB from round {rounds[0]} to round {rounds[-1]} "
                    f"(at most {MAX_RSS_GROWTH_KB})")
rep = {"connections": conns, "rate_bytes_s": rate, "phases": phases,
       "server_rss_kb_per_round": [rss[k] for k in rounds], "server_rss_growth_kb": growth,
       "failures": failures, "passed": not failures}
json.dump(rep, open(out, "w"), indent=1)
print(f"{'round':>5} {'fault':<15} {'done':>8} {'held ms':>8} {'low s':>6} {'recovery median/p90/max ms':>28} {'RSS kB':>8} {'drained s':>9}")
for p in phases:
    rc = p.get("recovery_ms")
    rs = f"{rc['median']:.0f} / {rc['p90']:.0f} / {rc['max']:.0f}" if rc else "-"
    lo = p.get("lowest_second_during_fault")
    ls = f"{lo['median']:.0%}" if lo else "-"
    print(f"{p['round']:>5} {p['fault']:<15} {p['completed']:>4}/{p['connections']:<3} "
          f"{p['held_ms']:>8} {ls:>6} {rs:>28} {p['server_rss_kb']:>8} {p['drained_s']:>9}")
print(f"server RSS per round: {rep['server_rss_kb_per_round']} kB (growth {growth} kB)")
for f in failures:
    print("FAIL:", f)
print("PASS" if not failures else "FAILED", f"(report: {out})")
sys.exit(0 if not failures else 1)
EOF
