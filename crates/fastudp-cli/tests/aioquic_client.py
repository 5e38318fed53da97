"""An hq-interop (HTTP/0.9 over QUIC) client on aioquic, another QUIC
implementation than the server's: fetches each PATH from HOST PORT on one
connection and checks the bytes against the server's pattern (byte i is
i % 251). Prints one JSON line: the bytes of each response and whether
they matched; exits 1 on any failure.

    python3 aioquic_client.py HOST PORT PATH...
"""

import asyncio
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived, StreamReset


class Hq(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting = {}

    async def get(self, path):
        sid = self._quic.get_next_available_stream_id()
        done = self._loop.create_future()
        self.waiting[sid] = (bytearray(), done)
        self._quic.send_stream_data(sid, f"GET {path}\r\n".encode(), end_stream=True)
        self.transmit()
        return await done

    def quic_event_received(self, event):
        if isinstance(event, StreamDataReceived) and event.stream_id in self.waiting:
            buf, done = self.waiting[event.stream_id]
            buf.extend(event.data)
            if event.end_stream and not done.done():
                done.set_result(("ok", bytes(buf)))
        elif isinstance(event, StreamReset) and event.stream_id in self.waiting:
            _, done = self.waiting[event.stream_id]
            if not done.done():
                done.set_result(("reset", event.error_code))


def pattern_ok(data):
    period = bytes(i % 251 for i in range(251))
    full = period * (len(data) // 251 + 1)
    return data == full[: len(data)]


async def main(host, port, paths):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["hq-interop"])
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = "localhost"
    out = {"responses": []}
    async with connect(host, port, configuration=cfg, create_protocol=Hq) as c:
        for p in paths:
            kind, v = await asyncio.wait_for(c.get(p), 60)
            if kind == "ok":
                out["responses"].append({"path": p, "bytes": len(v), "pattern": pattern_ok(v)})
            else:
                out["responses"].append({"path": p, "reset": v})
        out["alpn"] = c._quic.tls.alpn_negotiated
        out["version"] = c._quic._version
        c.close(error_code=0)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
