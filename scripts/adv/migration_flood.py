#!/usr/bin/env python3
"""Migration flood: after a handshake, each 1-RTT datagram (a PING) goes out from a
new source port ("victim" sockets). Counts what the server sends to those ports
versus what came from them (RFC 9000 8: at most 3x). Loopback only.

Usage: migration_flood.py HOST PORT PACKETS [PER_PORT] [VICTIM_IP]
"""
import asyncio, socket, ssl, sys, time
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
per_port = int(sys.argv[4]) if len(sys.argv) > 4 else 1
victim_ip = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1"
srv = (host, port)
cfg = QuicConfiguration(is_client=True, alpn_protocols=["h3"], verify_mode=ssl.CERT_NONE)
c = QuicConnection(configuration=cfg)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); s.settimeout(0.05)
now = time.time
c.connect(srv, now=now())
def flush(sock):
    sent = 0
    for d, a in c.datagrams_to_send(now=now()):
        sock.sendto(d, srv); sent += len(d)
    return sent
flush(s)
end = now() + 5
while not c._handshake_complete and now() < end:
    try:
        d, a = s.recvfrom(65536); c.receive_datagram(d, a, now=now())
    except socket.timeout:
        c.handle_timer(now=now())
    flush(s)
assert c._handshake_complete, "no handshake"
# drain a bit
t = now() + 0.3
while now() < t:
    try:
        d, a = s.recvfrom(65536); c.receive_datagram(d, a, now=now())
    except socket.timeout:
        pass
    flush(s)
victims = []
sent_v = 0
for i in range(n // per_port):
    v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.bind((victim_ip, 0)); v.setblocking(False)
    victims.append(v)
    for j in range(per_port):
        c.send_ping(i * per_port + j)
        sent_v += flush(v)
    time.sleep(0.002)
time.sleep(1.0)
got = 0; pk = 0
for v in victims:
    while True:
        try:
            d = v.recv(65536); got += len(d); pk += 1
        except BlockingIOError:
            break
print(f"migration flood: {len(victims)} ports x {per_port}, sent {sent_v} B from them, server sent {got} B in {pk} datagrams to them: {got/max(sent_v,1):.2f}x")
