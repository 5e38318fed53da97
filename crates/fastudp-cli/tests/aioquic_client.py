"""A client on aioquic, another QUIC implementation than the server's:
fetches every PATH from HOST PORT in parallel on one connection.

    python3 aioquic_client.py [--h3 [--any-status]] [--ca FILE] [--server-name NAME] HOST PORT PATH...

Without --h3 it speaks hq-interop (HTTP/0.9 over QUIC) and checks each body
against the server's /bytes pattern (byte i is i % 251); a stream reset is
reported with its code, and the exit status is 0 (the caller judges).

With --h3 it speaks HTTP/3 through aioquic's own H3Connection (QPACK and
framing are aioquic's): each response's status, its content-length header,
length, SHA-256 and pattern check. It exits 1 if any request fails, is
reset, or is not answered 200 (with --any-status: any status is an
answer, and only a failure or a reset exits 1).

Without --ca the server's certificate is not verified; with it, the
certificate must chain to FILE and name --server-name (default localhost).
The interop runner's cases: --chacha20 offers only ChaCha20-Poly1305,
--key-update updates the keys before the requests, --resume fetches the
first path on one connection and the rest on a second that resumes its
session, --0rtt does so with the second's requests in 0-RTT data.
--rebind port moves the client to a new source port every 50 ms during
the transfer (as a NAT rebinding would, the runner's rebind-port case),
--rebind addr to a new source address of 127.0.0.0/8 (rebind-addr); the
connection's "rebinds" says how many moves came before the last answer.
Prints one JSON line: {"alpn", "version", "peer_spki_sha256" (the
server certificate's SPKI SHA-256, base64), "responses": [...],
"connections": [{"cipher_suite", "resumed", "early_data_accepted",
"key_phase", ...}]}.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived, StreamReset
from aioquic.tls import CipherSuite, Epoch


class Hq(QuicConnectionProtocol):
    """HTTP/0.9 over QUIC: one bidirectional stream per request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.waiting = {}

    async def get(self, authority, path):
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
                done.set_result({"body": bytes(buf)})
        elif isinstance(event, StreamReset) and event.stream_id in self.waiting:
            _, done = self.waiting[event.stream_id]
            if not done.done():
                done.set_result({"reset": event.error_code})


class H3(QuicConnectionProtocol):
    """HTTP/3 through aioquic's H3Connection."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic)
        self.waiting = {}

    async def get(self, authority, path):
        sid = self._quic.get_next_available_stream_id()
        done = self._loop.create_future()
        self.waiting[sid] = {"headers": {}, "body": bytearray(), "done": done}
        self.http.send_headers(
            stream_id=sid,
            headers=[
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
                (b"user-agent", b"aioquic"),
            ],
            end_stream=True,
        )
        self.transmit()
        return await done

    def finish(self, w):
        if not w["done"].done():
            w["done"].set_result({"headers": w["headers"], "body": bytes(w["body"])})

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            done = self.waiting[event.stream_id]["done"]
            if not done.done():
                done.set_result({"reset": event.error_code})
            return
        for ev in self.http.handle_event(event):
            w = self.waiting.get(getattr(ev, "stream_id", None))
            if w is None:
                continue
            if isinstance(ev, HeadersReceived):
                for k, v in ev.headers:
                    w["headers"][k.decode()] = v.decode()
            elif isinstance(ev, DataReceived):
                w["body"].extend(ev.data)
            if getattr(ev, "stream_ended", False):
                self.finish(w)


def spki_sha256(cert):
    """SHA-256 of a certificate's SubjectPublicKeyInfo, base64: the form
    Chromium's --ignore-certificate-errors-spki-list takes."""
    if cert is None:
        return None
    from cryptography.hazmat.primitives import serialization

    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def pattern_ok(data):
    period = bytes(i % 251 for i in range(251))
    full = period * (len(data) // 251 + 1)
    return data == full[: len(data)]


async def fetch(a, cfg, paths, ticket_handler=None, early=False):
    """One connection: every path in parallel. Returns the raw responses
    and what the connection negotiated."""
    proto = H3 if a.h3 else Hq
    authority = f"{a.server_name}:{a.port}"
    ticket = asyncio.get_running_loop().create_future() if ticket_handler else None

    def on_ticket(t):
        if ticket is not None and not ticket.done():
            ticket.set_result(t)

    async with connect(
        a.host,
        a.port,
        configuration=cfg,
        create_protocol=proto,
        session_ticket_handler=on_ticket if ticket_handler else None,
        wait_connected=not early,
    ) as c:
        if a.key_update:
            # Sent once the handshake is confirmed; the transfer then runs
            # under the next keys, so the server must follow.
            c._quic.request_key_update()
            c.transmit()
        moves = []
        mover = asyncio.ensure_future(rebind(c, a.rebind, moves)) if a.rebind else None
        got = await asyncio.wait_for(
            asyncio.gather(*(c.get(authority, p) for p in paths)), a.timeout
        )
        rebinds = len(moves)
        if mover is not None:
            mover.cancel()
        tls_ = c._quic.tls
        info = {
            "alpn": tls_.alpn_negotiated,
            "version": c._quic._version,
            "peer_spki_sha256": spki_sha256(tls_._peer_certificate),
            "cipher_suite": tls_.key_schedule.cipher_suite.name if tls_.key_schedule else None,
            "resumed": tls_.session_resumed,
            "early_data_accepted": tls_.early_data_accepted,
            "key_phase": c._quic._cryptos[Epoch.ONE_RTT].key_phase,
            "rebinds": rebinds,
        }
        if ticket is not None:
            ticket_handler(await asyncio.wait_for(ticket, 10))
        c.close(error_code=0x100 if a.h3 else 0)
    return got, info


async def rebind(c, how, moves):
    """Every 50 ms, a new socket for connection `c` (the protocol takes it
    in connection_made), then the old one closed: a new port, or with
    `how` "addr" a new address too. Each move's local address goes into
    `moves`."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(0.05)
        n = len(moves)
        local = ("::ffff:127.0.0.%d" % (2 + n % 200), 0) if how == "addr" else ("::", 0)
        old = c._transport
        transport, _ = await loop.create_datagram_endpoint(lambda: c, local_addr=local)
        old.close()
        c._quic.send_ping(n)
        c.transmit()
        moves.append(transport.get_extra_info("sockname"))


async def main(a):
    alpn = H3_ALPN if a.h3 else ["hq-interop"]
    cfg = QuicConfiguration(is_client=True, alpn_protocols=alpn)
    if a.ca:
        cfg.load_verify_locations(a.ca)
    else:
        cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = a.server_name
    if a.chacha20:
        cfg.cipher_suites = [CipherSuite.CHACHA20_POLY1305_SHA256]
    out = {"responses": [], "connections": []}
    failed = False
    if a.resume or a.zero_rtt:
        # The first path on one connection, which must leave a session
        # ticket; the others on a second one that resumes with it (and
        # sends its requests as 0-RTT data with --0rtt).
        if len(a.paths) < 2:
            raise SystemExit("--resume and --0rtt need at least 2 paths")
        tickets = []
        got1, info1 = await fetch(a, cfg, a.paths[:1], ticket_handler=tickets.append)
        cfg.session_ticket = tickets[0]
        got2, info2 = await fetch(a, cfg, a.paths[1:], early=a.zero_rtt)
        got, out["connections"] = got1 + got2, [info1, info2]
    else:
        got, info = await fetch(a, cfg, a.paths)
        out["connections"] = [info]
    for p, r in zip(a.paths, got):
        row = {"path": p}
        if "reset" in r:
            row["reset"] = r["reset"]
            failed = True
        else:
            body = r["body"]
            row["bytes"] = len(body)
            row["sha256"] = hashlib.sha256(body).hexdigest()
            row["pattern"] = pattern_ok(body)
            if a.h3:
                row["status"] = int(r["headers"].get(":status", "0"))
                row["headers"] = {k: v for k, v in r["headers"].items() if k != ":status"}
                cl = row["headers"].get("content-length")
                row["content_length"] = int(cl) if cl is not None else None
                failed |= row["status"] != 200 and not a.any_status
        out["responses"].append(row)
    last = out["connections"][-1]
    for k in ("alpn", "version", "peer_spki_sha256"):
        out[k] = last[k]
    print(json.dumps(out))
    return 1 if a.h3 and failed else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h3", action="store_true", help="HTTP/3 (default: hq-interop)")
    ap.add_argument("--any-status", action="store_true", help="with --h3: exit 0 whatever the statuses")
    ap.add_argument("--ca", help="PEM certificate(s) to verify the server against")
    ap.add_argument("--server-name", default="localhost", help="SNI and name to verify")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for all requests (generous: a slow machine is not a failure)")
    ap.add_argument("--chacha20", action="store_true", help="offer only TLS_CHACHA20_POLY1305_SHA256")
    ap.add_argument("--key-update", action="store_true", help="update the 1-RTT keys before the requests")
    ap.add_argument("--resume", action="store_true", help="a second connection resumes the first's session")
    ap.add_argument("--0rtt", dest="zero_rtt", action="store_true", help="as --resume, requests sent as 0-RTT data")
    ap.add_argument("--rebind", choices=["port", "addr"], help="move to a new port (or address) every 50 ms")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("paths", nargs="+")
    sys.exit(asyncio.run(main(ap.parse_args())))
