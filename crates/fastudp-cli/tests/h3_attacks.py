"""Hostile HTTP/3 and hq-interop clients against `fastudp quic serve --www`
(aioquic's QUIC layer, frames written by hand where a well-behaved H3
layer would refuse to). Each attack is bounded in time; prints one JSON
object: attack name -> what the server did.

    python3 h3_attacks.py HOST PORT ATTACK...

ATTACK is one of the names in ATTACKS (or `all`). The served directory
is expected to hold the tree `h3_attacks.rs` makes: `f1m.bin` (1,000,000
bytes of the pattern), `big.bin`, `noindex/`, `link-out` (a symbolic
link to `../secret`), `fifo` (a FIFO), and `secret` beside it.
"""

import asyncio
import json
import ssl
import sys

import pylsqpack
from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    StreamDataReceived,
    StreamReset,
)

HOST, PORT = sys.argv[1], int(sys.argv[2])
SECRET = b"outside-the-directory"


def varint(v):
    b = Buffer(capacity=8)
    b.push_uint_var(v)
    return b.data


def frame(t, payload):
    return varint(t) + varint(len(payload)) + payload


def settings(pairs):
    return frame(0x04, b"".join(varint(k) + varint(v) for k, v in pairs))


def headers_block(headers):
    enc = pylsqpack.Encoder()
    _, block = enc.encode(0, headers)
    return block


def req_headers(path, method=b"GET", extra=()):
    return [
        (b":method", method),
        (b":scheme", b"https"),
        (b":authority", b"localhost"),
        (b":path", path),
    ] + list(extra)


class Raw(QuicConnectionProtocol):
    """A QUIC connection whose HTTP/3 is written by hand: a control
    stream with SETTINGS is opened by `h3_open`, requests are HEADERS
    frames, responses are parsed just enough (status, body length)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.streams = {}
        self.resets = {}
        self.closed = None
        self.waiters = []
        self.ctrl = None

    def quic_event_received(self, e):
        if isinstance(e, StreamDataReceived):
            s = self.streams.setdefault(e.stream_id, {"data": bytearray(), "fin": False})
            s["data"].extend(e.data)
            s["fin"] = s["fin"] or e.end_stream
        elif isinstance(e, StreamReset):
            self.resets[e.stream_id] = e.error_code
        elif isinstance(e, ConnectionTerminated):
            self.closed = {"code": e.error_code, "reason": e.reason_phrase}
        for w in self.waiters:
            if not w.done():
                w.set_result(None)
        self.waiters = []

    async def changed(self, timeout):
        f = self._loop.create_future()
        self.waiters.append(f)
        try:
            await asyncio.wait_for(f, timeout)
        except asyncio.TimeoutError:
            pass

    def h3_open(self, extra=b""):
        self.ctrl = self._quic.get_next_available_stream_id(is_unidirectional=True)
        self._quic.send_stream_data(self.ctrl, varint(0) + settings([(6, 1 << 20)]) + extra)
        for t in (2, 3):
            sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
            self._quic.send_stream_data(sid, varint(t))
        self.transmit()

    def send(self, sid, data, fin=False):
        self._quic.send_stream_data(sid, data, end_stream=fin)
        self.transmit()

    def request(self, path, method=b"GET", extra=(), fin=True):
        sid = self._quic.get_next_available_stream_id()
        self.send(sid, frame(0x01, headers_block(req_headers(path, method, extra))), fin)
        return sid

    def done(self, sid):
        return sid in self.resets or (sid in self.streams and self.streams[sid]["fin"])

    async def wait(self, sids, timeout):
        end = self._loop.time() + timeout
        while self.closed is None and not all(self.done(s) for s in sids):
            left = end - self._loop.time()
            if left <= 0:
                break
            await self.changed(left)

    def response(self, sid):
        """{status, headers, body (bytes)} or {reset} or {pending}."""
        if sid in self.resets:
            return {"reset": self.resets[sid]}
        s = self.streams.get(sid)
        if s is None:
            return {"pending": True, "closed": self.closed}
        buf = Buffer(data=bytes(s["data"]))
        dec = pylsqpack.Decoder(4096, 16)
        out = {"headers": {}, "body": bytearray(), "fin": s["fin"]}
        while not buf.eof():
            try:
                t = buf.pull_uint_var()
                n = buf.pull_uint_var()
                payload = buf.pull_bytes(n)
            except Exception:
                out["truncated"] = True
                break
            if t == 0x01:
                _, hs = dec.feed_header(sid, payload)
                out["headers"].update({k.decode(): v.decode() for k, v in hs})
            elif t == 0x00:
                out["body"].extend(payload)
        out["status"] = int(out["headers"].get(":status", 0))
        return out


async def session(alpn=("h3",), **cfg_kw):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=list(alpn), **cfg_kw)
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = "localhost"
    return connect(HOST, PORT, configuration=cfg, create_protocol=Raw, wait_connected=True)


def summary(r):
    if "status" not in r:
        return r
    body = bytes(r["body"])
    return {
        "status": r["status"],
        "len": len(body),
        "secret": SECRET in body,
        "content_length": r["headers"].get("content-length"),
        "content_range": r["headers"].get("content-range"),
        "fin": r["fin"],
    }


async def fetch_all(paths, timeout=10, method=b"GET", extra=()):
    async with await session() as c:
        c.h3_open()
        sids = [c.request(p, method, extra) for p in paths]
        await c.wait(sids, timeout)
        return {p.decode("latin-1")[:80]: summary(c.response(s)) for p, s in zip(paths, sids)}


ESCAPES = [
    b"/../secret",
    b"/%2e%2e/secret",
    b"/%2E%2E/secret",
    b"/.%2e/secret",
    b"/%252e%252e/secret",
    b"/noindex/../../secret",
    b"/noindex/%2e%2e/%2e%2e/secret",
    b"/%2fetc/passwd",
    b"//etc/passwd",
    b"/..%2fsecret",
    b"/..\\secret",
    b"/%5c..%5csecret",
    b"/f1m.bin%00.txt",
    b"/f1m.bin\x00",
    b"/link-out",
    b"/link-in",
    b"/fifo",
    b"/noindex/",
    b"/noindex",
    b"/" + b"a/" * 3000,
    b"/" + b"%2e/" * 3000 + b"secret",
    b"/" + b"x" * 20000,
    b"secret",
    b"*",
    b"https://localhost/../secret",
    b"/./secret",
    b"/proc/self/root/etc/passwd",
    b"/%ff%fe",
]


async def a_escapes():
    return await fetch_all(ESCAPES)


RANGES = [
    b"bytes=0-0",
    b"bytes=-1",
    b"bytes=999999-",
    b"bytes=1000000-",
    b"bytes=0-99999999999999999999999999",
    b"bytes=-99999999999999999999999",
    b"bytes=5-1",
    b"bytes=" + b",".join(b"0-%d" % i for i in range(2000)),
    b"bytes=0-1,0-1,0-1",
    b"bytes=-0",
    b"bytes=abc",
    b"items=0-1",
    b"bytes = 10 - 20",
    b"bytes=18446744073709551615-",
]


async def a_ranges():
    out = {}
    async with await session() as c:
        c.h3_open()
        sids = [c.request(b"/f1m.bin", extra=[(b"range", r)]) for r in RANGES]
        await c.wait(sids, 15)
        for r, s in zip(RANGES, sids):
            out[r.decode()[:40]] = summary(c.response(s))
    return out


async def a_head_large():
    return await fetch_all([b"/big.bin", b"/f1m.bin"], method=b"HEAD")


async def a_big_headers():
    out = {}
    async with await session() as c:
        c.h3_open()
        one = [(b"x-big", b"a" * 15000)]
        over = [(b"x-big", b"a" * 17000)]
        huge = [(b"x-big%d" % i, b"a" * 30000) for i in range(7)]
        many = [(b"x-h%d" % i, b"v") for i in range(3000)]
        sids = {
            "15k": c.request(b"/f1m.bin", method=b"HEAD", extra=one),
            "17k": c.request(b"/f1m.bin", method=b"HEAD", extra=over),
            "200k": c.request(b"/f1m.bin", method=b"HEAD", extra=huge),
            "3000 fields": c.request(b"/f1m.bin", method=b"HEAD", extra=many),
        }
        await c.wait(list(sids.values()), 10)
        for k, s in sids.items():
            out[k] = summary(c.response(s))
        # Still usable?
        s = c.request(b"/f1m.bin", method=b"HEAD")
        await c.wait([s], 5)
        out["after"] = summary(c.response(s))
        out["closed"] = c.closed
    return out


async def a_many_streams():
    async with await session() as c:
        c.h3_open()
        sids = [c.request(b"/f1m.bin", method=b"HEAD") for _ in range(300)]
        await c.wait(sids, 20)
        rs = [c.response(s) for s in sids]
        return {
            "ok": sum(1 for r in rs if r.get("status") == 200),
            "other": [summary(r) for r in rs if r.get("status") != 200][:5],
            "closed": c.closed,
        }


async def a_no_fin():
    """HEADERS without FIN, half a HEADERS frame, and an empty stream: how
    long does the server keep each?"""
    async with await session() as c:
        c.h3_open()
        full = c.request(b"/f1m.bin", method=b"HEAD", fin=False)
        half = c._quic.get_next_available_stream_id()
        blk = frame(0x01, headers_block(req_headers(b"/f1m.bin")))
        c.send(half, blk[: len(blk) // 2])
        empty = c._quic.get_next_available_stream_id()
        c.send(empty, b"\x40")  # one byte of a frame type that never ends
        t0 = c._loop.time()
        await c.wait([full, half, empty], 12)
        return {
            "headers_no_fin": summary(c.response(full)),
            "half_headers": summary(c.response(half)),
            "empty": summary(c.response(empty)),
            "waited_s": round(c._loop.time() - t0, 1),
            "closed": c.closed,
        }


async def a_body_on_get():
    """A GET followed by DATA frames (a body nobody asked for), and a
    POST with a 100 KB body."""
    async with await session() as c:
        c.h3_open()
        g = c._quic.get_next_available_stream_id()
        c.send(g, frame(0x01, headers_block(req_headers(b"/f1m.bin", b"HEAD"))) + frame(0x00, b"x" * 50000), True)
        p = c._quic.get_next_available_stream_id()
        c.send(p, frame(0x01, headers_block(req_headers(b"/f1m.bin", b"POST"))) + frame(0x00, b"x" * 100000), True)
        await c.wait([g, p], 10)
        return {"get_with_body": summary(c.response(g)), "post": summary(c.response(p)), "closed": c.closed}


async def control(extra, label, settings_first=True, wait=3):
    async with await session() as c:
        if settings_first:
            c.h3_open(extra)
        else:
            c.ctrl = c._quic.get_next_available_stream_id(is_unidirectional=True)
            c.send(c.ctrl, varint(0) + extra)
        s = c.request(b"/f1m.bin", method=b"HEAD")
        await c.wait([s], wait)
        return {"request": summary(c.response(s)), "closed": c.closed}


async def a_control():
    out = {}
    cases = {
        "duplicate SETTINGS": (settings([]), True),
        "DATA on control": (frame(0x00, b"xx"), True),
        "HEADERS on control": (frame(0x01, b"\x00\x00"), True),
        "h2 PRIORITY 0x02": (frame(0x02, b"x"), True),
        "h2 PING 0x06": (frame(0x06, b"x" * 8), True),
        "h2 WINDOW_UPDATE 0x08": (frame(0x08, b"xxxx"), True),
        "h2 CONTINUATION 0x09": (frame(0x09, b""), True),
        "unknown 0x21 (grease)": (frame(0x21, b"abc"), True),
        "unknown 0x1f2e": (frame(0x1F2E, b"abc" * 100), True),
        "first frame not SETTINGS": (frame(0x07, varint(0)), False),
        "GOAWAY": (frame(0x07, varint(0)), True),
        "GOAWAY increasing": (frame(0x07, varint(0)) + frame(0x07, varint(4)), True),
        "CANCEL_PUSH": (frame(0x03, varint(0)), True),
        "MAX_PUSH_ID": (frame(0x0D, varint(10)), True),
        "MAX_PUSH_ID decreasing": (frame(0x0D, varint(10)) + frame(0x0D, varint(1)), True),
        "PUSH_PROMISE on control": (frame(0x05, varint(0)), True),
        "SETTINGS h2 id 0x02": (b"", None),
        "truncated frame": (varint(0x21) + varint(100) + b"x", True),
        "16k+1 frame": (varint(0x21) + varint(16 * 1024 + 1), True),
        "SETTINGS huge field section": (b"", "huge"),
    }
    for label, (extra, mode) in cases.items():
        try:
            if mode is None:
                async with await session() as c:
                    c.ctrl = c._quic.get_next_available_stream_id(is_unidirectional=True)
                    c.send(c.ctrl, varint(0) + settings([(0x02, 1)]))
                    s = c.request(b"/f1m.bin", method=b"HEAD")
                    await c.wait([s], 3)
                    out[label] = {"request": summary(c.response(s)), "closed": c.closed}
            elif mode == "huge":
                async with await session() as c:
                    c.ctrl = c._quic.get_next_available_stream_id(is_unidirectional=True)
                    c.send(c.ctrl, varint(0) + settings([(0x06, (1 << 62) - 1), (0x01, (1 << 62) - 1), (0x07, (1 << 62) - 1)]))
                    s = c.request(b"/f1m.bin", method=b"HEAD")
                    await c.wait([s], 3)
                    out[label] = {"request": summary(c.response(s)), "closed": c.closed}
            else:
                out[label] = await control(extra, label, mode)
        except Exception as e:  # a refused handshake and the like
            out[label] = {"error": repr(e)}
    return out


async def a_uni_streams():
    out = {}
    # Two control streams; a push stream from the client; an unknown type.
    for label, types in {
        "second control stream": [0, 0],
        "push stream from client": [1],
        "unknown stream type": [0x21, 0x21, 0x21, 0x21, 0x21],
        "second QPACK encoder": [2, 2],
    }.items():
        try:
            async with await session() as c:
                c.h3_open()
                for t in types:
                    sid = c._quic.get_next_available_stream_id(is_unidirectional=True)
                    c.send(sid, varint(t) + (settings([]) if t == 0 else b"junk"))
                s = c.request(b"/f1m.bin", method=b"HEAD")
                await c.wait([s], 3)
                out[label] = {"request": summary(c.response(s)), "closed": c.closed}
        except Exception as e:
            out[label] = {"error": repr(e)}
    return out


async def a_request_stream_frames():
    out = {}
    cases = {
        "SETTINGS on request": frame(0x04, b""),
        "GOAWAY on request": frame(0x07, varint(0)),
        "DATA before HEADERS": frame(0x00, b"x"),
        "unknown frame then HEADERS": frame(0x21, b"zz") + frame(0x01, headers_block(req_headers(b"/f1m.bin", b"HEAD"))),
        "bad QPACK": frame(0x01, b"\xff\xff\xff\xff"),
        "QPACK dynamic ref": frame(0x01, b"\x02\x00\x80"),
        "no :path": frame(0x01, headers_block([(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"x")])),
        "uppercase header": frame(0x01, headers_block(req_headers(b"/f1m.bin", b"HEAD", [(b"X-Up", b"1")]))),
        "CONNECT": frame(0x01, headers_block([(b":method", b"CONNECT"), (b":authority", b"localhost:1")])),
        "trailers then more": frame(0x01, headers_block(req_headers(b"/f1m.bin", b"HEAD"))) + frame(0x01, headers_block([(b"x", b"y")])) + frame(0x00, b"z"),
    }
    for label, data in cases.items():
        async with await session() as c:
            c.h3_open()
            sid = c._quic.get_next_available_stream_id()
            c.send(sid, data, True)
            await c.wait([sid], 3)
            out[label] = {"response": summary(c.response(sid)), "closed": c.closed}
    return out


async def a_alpn_confusion():
    out = {}
    # h3 connection, hq request line on a bidirectional stream.
    async with await session() as c:
        c.h3_open()
        sid = c._quic.get_next_available_stream_id()
        c.send(sid, b"GET /f1m.bin\r\n", True)
        await c.wait([sid], 3)
        r = c.response(sid)
        out["hq line over h3"] = {k: (len(v) if isinstance(v, (bytes, bytearray)) else v) for k, v in r.items() if k != "headers"}
        out["hq line over h3"]["closed"] = c.closed
    # hq-interop connection, an h3 HEADERS frame as the request.
    async with await session(alpn=("hq-interop",)) as c:
        sid = c._quic.get_next_available_stream_id()
        c.send(sid, frame(0x01, headers_block(req_headers(b"/f1m.bin"))), True)
        await c.wait([sid], 7)
        s = c.streams.get(sid, {})
        out["h3 frame over hq"] = {
            "reset": c.resets.get(sid),
            "bytes": len(s.get("data", b"")),
            "secret": SECRET in bytes(s.get("data", b"")),
            "closed": c.closed,
        }
    # hq-interop, escapes as request lines.
    async with await session(alpn=("hq-interop",)) as c:
        res = {}
        sids = {}
        for p in [b"/../secret", b"/%2e%2e/secret", b"/link-out", b"/fifo", b"/noindex/"]:
            sid = c._quic.get_next_available_stream_id()
            c.send(sid, b"GET " + p + b"\r\n", True)
            sids[p.decode()] = sid
        await c.wait(list(sids.values()), 7)
        for p, sid in sids.items():
            s = c.streams.get(sid, {})
            res[p] = {"reset": c.resets.get(sid), "bytes": len(s.get("data", b"")), "secret": SECRET in bytes(s.get("data", b""))}
        out["hq escapes"] = res
    # No ALPN in common.
    try:
        async with await session(alpn=("h2",)) as c:
            out["alpn h2"] = {"connected": True, "closed": c.closed}
    except Exception as e:
        out["alpn h2"] = {"error": repr(e)[:120]}
    return out


async def a_never_read(conns=8):
    """Connections that ask for 16 big files each and then never read
    (they vanish without a close): the server keeps retransmitting until
    the idle timeout. Returns once the requests are sent."""
    held = []
    for _ in range(conns):
        cm = await session(max_stream_data=64 * 1024 * 1024, max_data=1024 * 1024 * 1024)
        c = await cm.__aenter__()
        c.h3_open()
        for _ in range(16):
            c.request(b"/big.bin")
        held.append((cm, c))
    await asyncio.sleep(1.5)
    got = sum(sum(len(s["data"]) for s in c.streams.values()) for _, c in held)
    for _, c in held:
        # Vanish: no CONNECTION_CLOSE, no more ACKs.
        c._transport.close()
    return {"connections": conns, "bytes_received_before_vanishing": got}


async def a_cancel():
    """Requests cancelled by the client mid-response (H3_REQUEST_CANCELLED:
    RESET_STREAM and STOP_SENDING), and a STOP_SENDING alone: the server
    must end them and stay usable. The client's windows are small (64 KiB
    a stream, 256 KiB in all), so the responses are in progress, held by
    flow control, when they are cancelled (and a Python client is not
    flooded past its socket buffer)."""
    async with await session(max_data=256 * 1024, max_stream_data=64 * 1024) as c:
        c.h3_open()
        sids = [c.request(b"/big.bin") for _ in range(16)]
        await asyncio.sleep(0.3)
        for s in sids[:8]:
            # A whole cancel: both directions.
            c._quic.reset_stream(s, 0x10C)
            c._quic.stop_stream(s, 0x10C)
        for s in sids[8:]:
            c._quic.stop_stream(s, 0x10C)
        c.transmit()
        await asyncio.sleep(0.5)
        s = c.request(b"/f1m.bin")
        t0 = c._loop.time()
        await c.wait([s], 40)
        r = summary(c.response(s))
        return {"after_cancel": r, "closed": c.closed, "waited_s": round(c._loop.time() - t0, 1)}


async def a_shrink():
    """A file truncated, then replaced by a symbolic link out and by a
    FIFO, while it is served (needs WWW, the served directory, in the
    environment). The response in flight must end with a reset (its
    announced length cannot be met), never with outside bytes; the name
    then answers 404."""
    import os

    www = os.environ["WWW"]
    path = os.path.join(www, "shrink.bin")
    with open(path, "wb") as f:
        f.truncate(300 * 1024 * 1024)
    async with await session() as c:
        c.h3_open()
        s = c.request(b"/shrink.bin")
        while c.closed is None and len(c.streams.get(s, {"data": b""})["data"]) < 100000:
            await c.changed(5)
        os.truncate(path, 1024 * 1024)
        await c.wait([s], 20)
        r = c.response(s)
        os.unlink(path)
        os.symlink("../secret", path)
        link = c.request(b"/shrink.bin")
        await c.wait([link], 5)
        os.unlink(path)
        os.mkfifo(path)
        fifo = c.request(b"/shrink.bin")
        await c.wait([fifo], 5)
        os.unlink(path)
        return {
            "truncated": r if "reset" in r or "pending" in r else summary(r),
            "then_symlink": summary(c.response(link)),
            "then_fifo": summary(c.response(fifo)),
            "closed": c.closed,
        }


async def a_critical():
    """The critical streams closed: the client's control stream ended with
    FIN or reset, the server's control or QPACK stream stopped. Each is
    H3_CLOSED_CRITICAL_STREAM (RFC 9114 6.2.1), never a hang."""
    out = {}
    for label in ["control FIN", "control reset", "stop server control", "stop server QPACK encoder"]:
        async with await session() as c:
            c.h3_open()
            s = c.request(b"/f1m.bin", method=b"HEAD")
            await c.wait([s], 3)
            if label == "control FIN":
                c.send(c.ctrl, b"", True)
            elif label == "control reset":
                c._quic.reset_stream(c.ctrl, 0x100)
            elif label == "stop server control":
                c._quic.stop_stream(3, 0x100)
            else:
                c._quic.stop_stream(7, 0x100)
            c.transmit()
            t0 = c._loop.time()
            while c.closed is None and c._loop.time() - t0 < 5:
                await c.changed(5 - (c._loop.time() - t0))
            out[label] = {"first": summary(c.response(s)), "closed": c.closed}
    return out


ATTACKS = {
    "critical": a_critical,
    "shrink": a_shrink,
    "escapes": a_escapes,
    "ranges": a_ranges,
    "head_large": a_head_large,
    "big_headers": a_big_headers,
    "many_streams": a_many_streams,
    "no_fin": a_no_fin,
    "body_on_get": a_body_on_get,
    "control": a_control,
    "uni_streams": a_uni_streams,
    "request_stream_frames": a_request_stream_frames,
    "alpn_confusion": a_alpn_confusion,
    "cancel": a_cancel,
    "never_read": a_never_read,
}


async def main(names):
    if names == ["all"]:
        names = list(ATTACKS)
    out = {}
    for n in names:
        try:
            out[n] = await asyncio.wait_for(ATTACKS[n](), 60)
        except Exception as e:
            out[n] = {"error": repr(e)[:300]}
    print(json.dumps(out, default=str))


asyncio.run(main(sys.argv[3:]))
