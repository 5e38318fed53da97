#!/bin/bash
# fastudp tx -C / rx --server side by side with iperf3 -u, at the same
# offered rate, on loopback; three rounds. Prints received MB/s, loss,
# jitter, and sender and receiver CPU per byte (iperf3: its own
# cpu_utilization_percent of each process; fastudp: each side's thread).
#   RATE=1G T=4 scripts/vs-iperf3.sh      (needs iperf3: apt-get install iperf3)
set -e
command -v iperf3 >/dev/null || { echo "needs iperf3 (Debian: apt-get install iperf3)" >&2; exit 2; }
B=${FASTUDP:-$(dirname "$0")/../target/release/fastudp}
RATE=${RATE:-1G}; T=${T:-4}
for round in 1 2 3; do
  iperf3 -s -p 5301 -1 >/dev/null 2>&1 & sleep 0.5
  iperf3 -c 127.0.0.1 -p 5301 -u -b $RATE -l 1472 -t $T -J > /tmp/ip3.json
  wait
  python3 - <<'PY'
import json; d=json.load(open('/tmp/ip3.json'))
e=d['end']; s=e['sum']; c=e['cpu_utilization_percent']
recv=(s['packets']-s['lost_packets'])*1472
print('iperf3        MB/s %5.0f loss %6.3f%% jitter %7.4f ms  tx ns/B %.3f  rx ns/B %.3f' % (recv/s['seconds']/1e6, 100*s['lost_packets']/max(s['packets'],1), s['jitter_ms'], c['host_total']/100*s['seconds']*1e9/s['bytes'], c['remote_total']/100*s['seconds']*1e9/max(recv,1)))
PY
  for mode in "-s 1472" "-S 1472 -m"; do
    $B rx --server --control-port 8201 --max-tests 1 -G -q & sleep 0.5
    $B tx -D 127.0.0.1 -C --control-port 8201 -b $RATE -l $T $mode --json > /tmp/fu.json
    wait
    MODE="$mode" python3 - <<'PY'
import json,os; d=json.load(open('/tmp/fu.json')); s=d['server']
print('fastudp %-12s MB/s %5.0f loss %6.3f%% jitter %7.4f ms  tx ns/B %.3f  rx ns/B %.3f' % (os.environ['MODE'], s['bytes']/d['seconds']/1e6, 100*s['lost']/max(d['datagrams'],1), s['jitter_ms'], d['cpu_ns_per_byte'], s['cpu_ns_per_byte']))
PY
  done
done
