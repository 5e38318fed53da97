"""An HTTP/3 client on aioquic's H3 layer, another implementation than
the server's: GETs every PATH from HOST PORT in parallel on one
connection (ALPN h3) and checks each body against the server's pattern
(byte i is i % 251). Prints one JSON line: each response's status, its
content-length, its bytes and whether they matched.

    python3 aioquic_h3_client.py HOST PORT PATH...
"""

import asyncio
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamReset


class H3(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}

    async def get(self, authority, path):
        sid = self._quic.get_next_available_stream_id()
        done = self._loop.create_future()
        self.waiting[sid] = ({"headers": {}, "body": bytearray()}, done)
        self.h3.send_headers(
            sid,
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
            ],
            end_stream=True,
        )
        self.transmit()
        return await done

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            _, done = self.waiting[event.stream_id]
            if not done.done():
                done.set_result({"reset": event.error_code})
            return
        for e in self.h3.handle_event(event):
            if e.stream_id not in self.waiting:
                continue
            r, done = self.waiting[e.stream_id]
            if isinstance(e, HeadersReceived):
                r["headers"].update({k.decode(): v.decode() for k, v in e.headers})
            elif isinstance(e, DataReceived):
                r["body"].extend(e.data)
            if e.stream_ended and not done.done():
                done.set_result(r)


def pattern_ok(data):
    period = bytes(i % 251 for i in range(251))
    full = period * (len(data) // 251 + 1)
    return data == full[: len(data)]


async def main(host, port, paths):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = "localhost"
    out = {"responses": []}
    async with connect(host, port, configuration=cfg, create_protocol=H3) as c:
        got = await asyncio.wait_for(
            asyncio.gather(*(c.get(f"localhost:{port}", p) for p in paths)), 120
        )
        for p, r in zip(paths, got):
            if "reset" in r:
                out["responses"].append({"path": p, "reset": r["reset"]})
                continue
            body = bytes(r["body"])
            h = r["headers"]
            out["responses"].append(
                {
                    "path": p,
                    "status": int(h.get(":status", "0")),
                    "content_length": int(h["content-length"]) if "content-length" in h else None,
                    "bytes": len(body),
                    "pattern": pattern_ok(body),
                }
            )
        out["alpn"] = c._quic.tls.alpn_negotiated
        c.close(error_code=0x100)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
