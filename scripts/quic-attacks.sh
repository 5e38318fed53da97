#!/usr/bin/env bash
# Runs every hostile client of `fastudp-lab attack` against
# `fastudp quic serve` at its default settings, each for a bounded time,
# in two network namespaces of its own joined by a veth pair.
#
# Part 1 (floods): per attack, the server's peak RSS, whether and how
# fast a legitimate client (a fresh connection fetching /bytes/1000, up
# to 3 tries) was served during the attack, how long Ctrl-C took, and
# the server's drop counters.
#
# Part 2 (issue 37): the four attacks of issue 37 against
# `quic serve --www DIR --cert CERT --key KEY --alt-svc-tcp` at its
# defaults, each with a PASS or FAIL line against what docs/SECURITY.md
# promises, from measured numbers:
#   37.1 a migration flood: bytes the server sent the victim's ports /
#        bytes that came from them, at most 3 (every port, and in all);
#   37.2 clients that acknowledge late (a long RTT) and vanish: seconds
#        from their last packet until the server holds none of them, at
#        most --idle-timeout (30 s) and the 1 s between --stats lines;
#   37.3 5 and 50 addresses holding every place, with PINGs or with
#        stalled responses: a legitimate client from a new address served;
#   37.4 one address and the open-file limit (soft 1,024, hard 20,000
#        and hard 1,024): a legitimate client's file GET served over QUIC
#        and TCP, and descriptors left.
# 37.3 fills every place: at the defaults a host's places follow its
# memory (a quarter of MemTotal), so the server sees a /proc/meminfo of
# QA_MEMTOTAL_KB (default 1 GiB: about 4,700 places; as LXCFS shows a
# container its limit), bind-mounted in a mount namespace of its own;
# QA_MEMTOTAL_KB=host keeps the host's (148,288 places on 24 GiB).
#
# Needs root (namespaces, tc, mount). Usage:
#   sudo scripts/quic-attacks.sh [SECONDS_PER_ATTACK] [FASTUDP_BINARY] [FASTUDP_LAB_BINARY]
# (the server and the legitimate client are FASTUDP_BINARY, default
# target/release/fastudp; the attacks are FASTUDP_LAB_BINARY, default
# target/release/fastudp-lab: cargo build --release -p fastudp-cli -p fastudp-lab).
# QA_PARTS="37.1 37.2 37.3 37.4 floods" (the default) picks the parts;
# QA_DELAYS="0 20" the late-ACK delays of 37.2, seconds; QA_FAIR="ping5
# ping50 stall5 stall50" the runs of 37.3.
# Traffic stays inside the namespaces; each attack ends by itself. Exits
# 1 when a line says FAIL.
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
ip -n "$C" addr add 10.232.0.1/16 dev "$CIF"
# The attacks send from an address of their own (the server bounds what
# one address holds: --max-connections-per-ip); the legitimate client
# sends from 10.232.0.1. Issue 37's attacks send from 10.232.1.1 to
# 10.232.1.50 too, and 10.232.0.4 is the migration flood's victim (its
# sockets never answer).
ip -n "$C" addr add 10.232.0.3/16 dev "$CIF"
ip -n "$C" addr add 10.232.0.4/16 dev "$CIF"
for i in $(seq 1 50); do ip -n "$C" addr add "10.232.1.$i/16" dev "$CIF"; done
ip -n "$S" addr add 10.232.0.2/16 dev "$SIF"
for n in "$C" "$S"; do ip -n "$n" link set lo up; done
ip -n "$C" link set "$CIF" up
ip -n "$S" link set "$SIF" up

PORT=4433
ADDR=10.232.0.2:$PORT

# Peak resident memory of a process, MiB.
hwm() { awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }
# A number field of the last JSON line of a kind in a file.
field() { grep "\"kind\":\"$2\"" "$1" | tail -1 | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2; }

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

floods() {
    printf '%-14s %-40s %9s %8s %7s %8s %s\n' attack what peak_MiB served serve_s ctrl_c_s drops
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
}

# ---------------------------------------------------------------------------
# Part 2: issue 37, against `quic serve --www --cert --key --alt-svc-tcp`.

FAILS=0
# PASS or FAIL, and the line.
verdict() {
    if [ "$1" = 1 ]; then
        echo "PASS $2"
    else
        echo "FAIL $2"
        FAILS=$((FAILS + 1))
    fi
}
# A number field of the first JSON object in a file (or line).
jf() { grep -o "\"$2\":[0-9.e+-]*" "$1" | head -1 | cut -d: -f2; }
# A field of the server's last line of a kind (its first occurrence in
# the line: the top level, before the `tcp` object).
sf() { grep "\"kind\":\"$1\"" "$TMP/s37.json" | tail -1 | grep -o "\"$2\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
# awk as a test: true when the expression is.
is() { awk "BEGIN { exit !($1) }"; }

WWW=$TMP/www
mkdir -p "$WWW"
head -c 1000 /dev/urandom >"$WWW/small"
truncate -s 100M "$WWW/big"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>/dev/null

# The server at the defaults of issue 37, its command line after "$@"
# (prlimit, a mount namespace); its standard output in $TMP/s37.json,
# each line after the time it came ($EPOCHREALTIME).
start37() {
    : >"$TMP/s37.json"
    ip netns exec "$S" "$@" "$BIN" quic serve --listen "$ADDR" --www "$WWW" \
        --cert "$TMP/cert.pem" --key "$TMP/key.pem" --alt-svc-tcp --json --stats \
        > >(while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done >"$TMP/s37.json") \
        2>"$TMP/s37.err" &
    SRV=$!
    for _ in $(seq 200); do
        grep -q '"kind":"stats"' "$TMP/s37.json" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "the server did not start: $(cat "$TMP/s37.err")" >&2
    return 1
}
stop37() {
    kill -INT "$SRV" 2>/dev/null || true
    wait "$SRV" || true
    SRV=
    sleep 0.2
}

# A legitimate client from 10.232.0.1 (an address no attack uses): a new
# HTTP/3 connection GETs PATH, up to 3 tries (`quic load` gives up after
# 5 s of silence). Sets LEGIT ("served"/"not served"), LEGIT_TRIES,
# LEGIT_S.
legit() {
    local t0 tries=0
    LEGIT="not served"
    t0=$EPOCHREALTIME
    while [ "$LEGIT" != served ] && [ "$tries" -lt 3 ]; do
        tries=$((tries + 1))
        if ip netns exec "$C" "$BIN" quic load "$ADDR" --connections 1 --request "$1" \
            --json --timeout 20 >"$TMP/legit.json" 2>"$TMP/legit.err" &&
            [ "$(jf "$TMP/legit.json" completed)" = 1 ]; then
            LEGIT=served
        fi
    done
    LEGIT_TRIES=$tries
    LEGIT_S=$(awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $t0 }")
    if [ "$LEGIT" != served ]; then
        LEGIT="not served ($(grep -o '"errors":\[[^]]*\]' "$TMP/legit.json" 2>/dev/null | head -c 300)$(head -c 300 "$TMP/legit.err"))"
    fi
}

# legit() for a file: `quic load --duration` takes any path, and checks
# the body against its content-length.
legit_file() {
    local t0 tries=0
    LEGIT="not served"
    t0=$EPOCHREALTIME
    while [ "$LEGIT" != served ] && [ "$tries" -lt 3 ]; do
        tries=$((tries + 1))
        if ip netns exec "$C" "$BIN" quic load "$ADDR" --duration 2s --connections 1 \
            --request "$1" --probe-every 0 --json >"$TMP/legit.json" 2>"$TMP/legit.err" &&
            [ "$(jf "$TMP/legit.json" requests_ok)" -ge 1 ] 2>/dev/null; then
            LEGIT=served
        fi
    done
    LEGIT_TRIES=$tries
    LEGIT_S=$(awk "BEGIN { printf \"%.2f\", $EPOCHREALTIME - $t0 }")
}

# 37.1: PINGs after the handshake, each from a new port of 10.232.0.4,
# whose sockets never answer.
migration37() {
    local ports=$1 per=$2
    if ! ip netns exec "$C" "$LAB" attack migration "$ADDR" --source 10.232.0.3 \
        --victim 10.232.0.4 --ports "$ports" --per-port "$per" --duration 60 --json \
        >"$TMP/mig.json" 2>"$TMP/mig.err"; then
        verdict 0 "37.1 migration flood, $ports ports x $per PING: the attack failed: $(cat "$TMP/mig.err")"
        return
    fi
    local from to dg ratio worst ok=0
    from=$(jf "$TMP/mig.json" bytes_from_victim)
    to=$(jf "$TMP/mig.json" bytes_to_victim)
    dg=$(jf "$TMP/mig.json" datagrams_to_victim)
    ratio=$(jf "$TMP/mig.json" ratio)
    worst=$(jf "$TMP/mig.json" worst_port_ratio)
    # Nothing to the victim proves nothing: the server must answer.
    if [ "$dg" -gt 0 ] && is "$ratio <= 3 && $worst <= 3"; then ok=1; fi
    verdict $ok "$(printf '37.1 migration flood, %d new ports x %d PING: %d B from the victim'"'"'s ports, %d B in %d datagrams to them: %.2fx (worst port %.2fx; at most 3x)' \
        "$ports" "$per" "$from" "$to" "$dg" "$ratio" "$worst")"
}

# 37.2: 5 addresses x 144 connections take every datagram DELAY s late
# (their ACKs too: a long RTT), for DELAY + 20 s, then vanish; seconds
# until the server holds none of them.
late37() {
    local delay=$1 hold
    # The handshakes take a few seconds on a loaded machine, and the
    # first late sample comes DELAY s after them.
    hold=$(awk "BEGIN { print $delay + 20 }")
    start37 || { verdict 0 "37.2 late ACKs: no server"; return; }
    local idle
    idle=$(sf limits idle_timeout_s)
    ip netns exec "$C" "$LAB" attack late-ack "$ADDR" --source 10.232.1.1 --addresses 5 \
        --connections 144 --delay "$delay" --duration "$hold" --json \
        >"$TMP/late.json" 2>"$TMP/late.err" || true
    local gone est rtt freed="" deadline
    gone=$(jf "$TMP/late.json" vanished_at_unix)
    est=$(jf "$TMP/late.json" connections_established)
    rtt=$(jf "$TMP/late.json" rtt_ms_median)
    if [ -z "$gone" ]; then
        stop37
        verdict 0 "37.2 late ACKs, delay $delay s: the attack failed: $(cat "$TMP/late.err")"
        return
    fi
    deadline=$(awk "BEGIN { print $gone + $idle + 60 }")
    # The first --stats line after the vanishing with no connection.
    while [ -z "$freed" ] && is "$EPOCHREALTIME < $deadline"; do
        freed=$(awk -v g="$gone" '$1 > g && /"kind":"stats"/ {
            if (match($0, /"connections":[0-9]+/) && substr($0, RSTART + 14, RLENGTH - 14) == 0) {
                printf "%.1f", $1 - g; exit
            } }' "$TMP/s37.json")
        sleep 0.5
    done
    stop37
    local ok=0
    # The clients must have claimed the RTT (their own estimate, made of
    # the same late datagrams) and held their connections to the end.
    if [ -n "$freed" ] && [ "${est:-0}" -gt 0 ] && is "$freed <= $idle + 1" &&
        is "${rtt:-0} >= $delay * 1000 / 2"; then ok=1; fi
    [ -n "$freed" ] || freed="more than $(awk "BEGIN { print $idle + 60 }")"
    verdict $ok "$(printf '37.2 late ACKs, delay %s s: %s connections (RTT %.0f ms) vanished, none held %s s later (at most --idle-timeout %s s + 1 s between --stats lines)' \
        "$delay" "${est:-0}" "${rtt:-0}" "$freed" "$idle")"
}

# 37.3 fills every place: the server sees a host of QA_MEMTOTAL_KB.
MEMTOTAL=${QA_MEMTOTAL_KB:-1048576}
if [ "$MEMTOTAL" = host ]; then
    MEMNS=()
else
    grep -v '^MemTotal:' /proc/meminfo >"$TMP/meminfo"
    sed -i "1i MemTotal:       $MEMTOTAL kB" "$TMP/meminfo"
    MEMNS=(unshare -m sh -c 'mount --bind "$0" /proc/meminfo && exec "$@"' "$TMP/meminfo")
fi

# 37.3: ADDRESSES x CONNECTIONS (kept alive with a PING every 5 s, and
# opened again when closed; extra arguments: stalled GETs) try to hold
# every place; once the server turns clients away (full), a legitimate
# client from a new address.
fair37() {
    local what=$1 addresses=$2 conns=$3
    shift 3
    start37 "${MEMNS[@]}" || { verdict 0 "37.3 $what: no server"; return; }
    local places
    places=$(sf limits places)
    ip netns exec "$C" "$LAB" attack hold "$ADDR" --source 10.232.1.1 --addresses "$addresses" \
        --connections "$conns" --keep-alive 5 --duration 150 --json "$@" \
        >"$TMP/hold.json" 2>"$TMP/hold.err" &
    local att=$! full=no t0=$EPOCHREALTIME
    # The attackers hold all they can once the server turns their new
    # connections away: for want of room (full: at the defaults the
    # places are what the memory budget holds, `refused_memory`), or at
    # their addresses' shares (`refused` alone). Within 120 s.
    while is "$EPOCHREALTIME - $t0 < 120"; do
        if [ "$(sf stats refused)" -gt 0 ] 2>/dev/null; then full=shares; break; fi
        kill -0 "$att" 2>/dev/null || break
        sleep 0.5
    done
    local held filled_s
    filled_s=$(awk "BEGIN { printf \"%.0f\", $EPOCHREALTIME - $t0 }")
    if [ $full != no ]; then
        # Stalled responses become evictable after 2 s without progress,
        # seen at the next PING (5 s); the attackers refill meanwhile.
        sleep 6
        [ "$(sf stats refused_memory)" -gt 0 ] 2>/dev/null && full=full
        held=$(sf stats connections)
        legit_file /small
    else
        held=$(sf stats connections)
        LEGIT="not tried"; LEGIT_TRIES=0; LEGIT_S=0
    fi
    sleep 1.5
    local evicted refused refused_mem stalled
    evicted=$(sf stats evicted)
    refused=$(sf stats refused)
    refused_mem=$(sf stats refused_memory)
    stalled=$(sf stats stalled_cut)
    kill "$att" 2>/dev/null || true
    wait "$att" 2>/dev/null || true
    stop37
    local ok=0 state
    if [ $full != no ] && [ "$LEGIT" = served ]; then ok=1; fi
    case $full in
        full) state="full (memory) after $filled_s s" ;;
        shares) state="attackers at their shares after $filled_s s, server not full" ;;
        *) state="attackers never turned away in $filled_s s" ;;
    esac
    verdict $ok "$(printf '37.3 %s: %s places, %s, %s connections held; the legitimate client %s (%s tries, %s s); evicted %s, refused %s (memory %s), stalled cut %s' \
        "$what" "$places" "$state" "$held" "$LEGIT" "$LEGIT_TRIES" "$LEGIT_S" "$evicted" "$refused" "$refused_mem" "$stalled")"
}

# 37.4: under a soft open-file limit of 1,024 and a hard one of HARD, one
# address (10.232.0.3) asks for 128 x 16 stalled file responses over QUIC
# and 80 over TCP (read at 1 KB/s); a legitimate client's file GET over
# QUIC and over TCP, and the descriptors left.
fds37() {
    local hard=$1
    start37 prlimit --nofile=1024:"$hard" || { verdict 0 "37.4 descriptors: no server"; return; }
    local limit base maxf per
    limit=$(awk '/^Max open files/ { print $4 }' "/proc/$SRV/limits")
    base=$(ls "/proc/$SRV/fd" | wc -l)
    maxf=$(sf limits max_open_files)
    per=$(sf limits max_open_files_per_ip)
    ip netns exec "$C" "$LAB" attack hold "$ADDR" --source 10.232.0.3 --connections 128 \
        --streams 16 --request /big --window 1024 --keep-alive 5 --duration 20 --json \
        >"$TMP/fds.json" 2>"$TMP/fds.err" &
    local att=$! curls=()
    for _ in $(seq 80); do
        ip netns exec "$C" curl -sk --http1.1 --interface 10.232.0.3 --limit-rate 1k \
            --max-time 20 -o /dev/null "https://$ADDR/big" 2>/dev/null &
        curls+=($!)
    done
    local peak=0 n
    for _ in $(seq 12); do
        sleep 0.5
        n=$(ls "/proc/$SRV/fd" | wc -l)
        [ "$n" -gt "$peak" ] && peak=$n
    done
    legit_file /small
    local tcp
    tcp=$(ip netns exec "$C" curl -sk --http1.1 --max-time 20 -o "$TMP/small.tcp" \
        -w '%{http_code}' "https://$ADDR/small" 2>/dev/null || true)
    cmp -s "$TMP/small.tcp" "$WWW/small" || tcp="$tcp (wrong body)"
    n=$(ls "/proc/$SRV/fd" | wc -l)
    [ "$n" -gt "$peak" ] && peak=$n
    kill "$att" "${curls[@]}" 2>/dev/null || true
    wait "$att" "${curls[@]}" 2>/dev/null || true
    stop37
    local unavailable
    unavailable=$(grep '"kind":"files"' "$TMP/s37.json" | tail -1 | grep -o '"unavailable":[0-9]*' | cut -d: -f2)
    local ok=0
    if [ "$LEGIT" = served ] && [ "$tcp" = 200 ] && [ "$peak" -lt "$limit" ]; then ok=1; fi
    verdict $ok "$(printf '37.4 descriptors, limit 1024:%s: soft limit now %s, responses %s at most (%s per address); one address held the server at %s descriptors (%s before), %s left; file GET over QUIC %s (%s tries), over TCP %s; %s requests answered 503/reset' \
        "$hard" "$limit" "$maxf" "$per" "$peak" "$base" "$((limit - peak))" "$LEGIT" "$LEGIT_TRIES" "$tcp" "${unavailable:-?}")"
}

part_37_1() {
    if start37; then
        migration37 500 1
        migration37 250 2
        stop37
    else
        verdict 0 "37.1 migration flood: no server"
    fi
}
part_37_2() {
    for d in ${QA_DELAYS:-0 20}; do late37 "$d"; done
}
part_37_3() {
    echo "(37.3: the server sees MemTotal ${MEMTOTAL} kB)"
    for f in ${QA_FAIR:-ping5 ping50 stall5 stall50}; do
        case $f in
            ping5) fair37 "5 addresses, PINGs" 5 2000 ;;
            ping50) fair37 "50 addresses, PINGs" 50 400 ;;
            stall5) fair37 "5 addresses, stalled responses" 5 300 --streams 16 --request /big --window 1024 ;;
            stall50) fair37 "50 addresses, stalled responses" 50 30 --streams 16 --request /big --window 1024 ;;
        esac
    done
}
part_37_4() {
    fds37 20000
    fds37 1024
}

# QA_PARTS picks and orders the parts (issue 37's four, then the floods).
for part in ${QA_PARTS:-37.1 37.2 37.3 37.4 floods}; do
    case $part in
        floods) floods ;;
        37.1 | 37.2 | 37.3 | 37.4)
            echo "issue $part, at the defaults of quic serve --www --cert --key --alt-svc-tcp:"
            "part_${part/./_}"
            ;;
        *) echo "quic-attacks.sh: unknown part $part" >&2; exit 2 ;;
    esac
done
[ "$FAILS" = 0 ] || { echo "$FAILS FAIL line(s)"; exit 1; }
