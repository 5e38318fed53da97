#!/usr/bin/env python3
"""Late-ACK client: every datagram from the server is processed DELAY seconds late
(so its ACKs are late and the server's RTT estimate grows), for HOLD seconds; then
the client vanishes. Against a server started with --max-connections 1, probes a
new handshake every 0.5 s and prints how long after vanishing the place came free.

Usage: late_ack.py HOST PORT DELAY HOLD
"""
import socket, ssl, sys, time
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

host, port, delay, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
srv = (host, port)
now = time.time

def new_conn():
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["h3"], verify_mode=ssl.CERT_NONE, idle_timeout=600)
    c = QuicConnection(configuration=cfg)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); s.settimeout(0.02)
    c.connect(srv, now=now())
    return c, s

def flush(c, s):
    for d, a in c.datagrams_to_send(now=now()):
        s.sendto(d, srv)

def handshake(c, s, limit=2.0):
    flush(c, s); end = now() + limit
    while now() < end:
        if c._handshake_complete: return True
        try:
            d, a = s.recvfrom(65536); c.receive_datagram(d, a, now=now())
        except socket.timeout:
            t = c.get_timer()
            if t is not None and t <= now():
                c.handle_timer(now=now())
        flush(c, s)
    return c._handshake_complete

for _ in range(60):
    c, s = new_conn()
    if handshake(c, s, 1.0): break
    s.close(); time.sleep(0.5)
else:
    sys.exit("first handshake failed")
queue = []
start = now(); last_ping = 0
while now() - start < hold:
    try:
        d, a = s.recvfrom(65536); queue.append((now() + delay, d, a))
    except socket.timeout:
        pass
    while queue and queue[0][0] <= now():
        _, d, a = queue.pop(0); c.receive_datagram(d, a, now=now())
    t = c.get_timer()
    if t is not None and t <= now(): c.handle_timer(now=now())
    if now() - last_ping > 1.0:
        c.send_ping(int(now())); last_ping = now()
    flush(c, s)
gone = now()
s.close()
print(f"vanished after {hold}s with ACK delay {delay}s; probing for the free place")
while True:
    c2, s2 = new_conn()
    if handshake(c2, s2, 0.5):
        # A refused connection is closed by the server right after the handshake? check it stays
        t = now() + 0.3; closed = False
        while now() < t:
            try:
                d, a = s2.recvfrom(65536); c2.receive_datagram(d, a, now=now())
            except socket.timeout:
                pass
            ev = c2.next_event()
            while ev is not None:
                if type(ev).__name__ == "ConnectionTerminated": closed = True
                ev = c2.next_event()
        if not closed:
            print(f"place free {now() - gone:.1f} s after vanishing")
            break
    s2.close()
    if now() - gone > 300:
        print("place not free after 300 s"); break
    time.sleep(0.5)
