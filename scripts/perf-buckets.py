#!/usr/bin/env python3
"""Sorts a `perf record -e cpu-clock -a -g` profile's samples of one
process (the server; `PERF=DIR scripts/quic-bench.sh` writes its pid
beside each profile) into the buckets of BENCHMARKS sections 14, 16 and
17, by the symbol each sample was taken in: Rust servers (quinn-proto,
rustls with ring or aws-lc-rs, tokio) and the quic-go server (Go's crypto,
runtime, garbage collector and scheduler, quic-go).

    scripts/perf-buckets.py PERF.data PID [GBIT]
    scripts/perf-buckets.py PERF.data PID GBIT --top N

With GBIT (the gigabits the process served while it was recorded), each
bucket's CPU milliseconds per Gbit follow its share (samples times the
sampling period), so that profiles of runs that moved different amounts
compare bucket by bucket.

With --top N, the N symbols with the most samples instead, each with its
CPU ms per Gbit, its share, and its owner: the code it belongs to
(the kernel, libc, quinn-proto, h3, rustls, ring, aws-lc, tokio, this
engine, Go's runtime, crypto/tls, net/http, quic-go, ...), from the
symbol's name and the object it was taken in. A libc `memmove` or
`malloc` is its callers' cost: `perf report --no-children -S SYMBOL -G`
names them.
"""
import re
import subprocess
import sys

# First match wins. Go's symbols (the quic-go server) are package paths:
# its runtime's garbage collector and allocator, scheduler and memmove
# come before the broad patterns (`gcm` would match `runtime.gcMarkDone`
# case-blind). quic-go's own code shares the QUIC-stack bucket with
# quinn-proto's.
GO_ALLOC = (r"^runtime\.(gc|mallocgc|scan|mark|sweep|greyobject|findObject|"
            r"heapBits|wbBuf|bulkBarrier|nextFreeFast|memclr|newobject|"
            r"makeslice|growslice|mspan|mcache|mcentral|mheap|(\(\*m\w+\))|"
            r"deductAssist|typePointers|spanOf|pageIndexOf|bgsweep|bgscavenge)|"
            r"^internal/runtime/gc")
GO_SLEEP = (r"^runtime\.(schedule|findRunnable|park_m|netpoll|futex|notesleep|"
            r"notewakeup|notetsleep|stopm|startm|wakep|mPark|gopark|goready|"
            r"ready|runqget|runqsteal|stealWork|checkTimers|usleep|osyield|"
            r"semasleep|semawakeup|resetspinning|runtimer|execute|goschedImpl|"
            r"mcall|park|handoffp|entersyscall|exitsyscall|casgstatus|"
            r"(\(\*timer\))|(\(\*timers\)))")
BUCKETS = [
    ("allocation", GO_ALLOC),
    ("copies", r"^runtime\.memmove"),
    ("sleep/wake", GO_SLEEP),
    ("crypto", r"aes|(?<![a-z])gcm|ghash|chacha|poly1305|aws_lc|ring_core|gfmul|clmul|"
               r"rustls|header_protection|hkdf|sha256|x25519|p256|ecdsa|_sha|bn_|"
               r"^crypto/|golang\.org/x/crypto|HeaderProtector|Sealer\)|"
               r"Opener\)|sealer\)|opener\)"),
    ("copies", r"memmove|memcpy|copy_user|_copy_to_iter|_copy_from_iter|"
               r"copy_page|rep_movs|skb_copy|csum_partial_copy"),
    # quinn-proto's sent-packet and ACK-range maps are BTreeMaps: theirs.
    ("quinn-proto/quic-go", r"quinn_proto|quinn::|quinn_udp|btree|BTree|"
                            r"github\.com/quic-go/"),
    ("allocation", r"malloc|free|realloc|calloc|_int_|cfree|tcache|"
                   r"__rust_alloc|__rdl_alloc|__rust_dealloc|kmalloc|page_alloc|"
                   r"alloc_pages|alloc_skb|"
                   r"kmem_cache|slab|__slab|slub|memcg|page_frag|kfree|mmap|"
                   r"munmap|brk|memset"),
    ("sleep/wake", r"schedule|finish_task_switch|ppoll|epoll|futex|"
                   r"do_sys_poll|hrtimer|try_to_wake|idle|pick_next|enqueue_task|"
                   r"dequeue_task|update_curr|psi_"),
    ("kernel net/syscalls", r"udp|tcp|ip_|ipv4|ipv6|inet|skb|sock|veth|"
                            r"net_|netif|__dev|dev_|napi|gro|gso|sys_|"
                            r"syscall|entry_|do_syscall|nf_|sk_|__x64|"
                            r"raw_spin|_raw|fib|dst_|neigh|lock_sock|release_sock|"
                            r"^internal/poll\.|^net\.|^os\."),
    ("server loop/runtime", r"fastudp|tokio|hashbrown|BTree|btree|hq|h3|"
                            r"fastudp_quic|bytes::|core::|alloc::|std::|"
                            r"^runtime\.|^main\.|^sync\.|^sync/|^time\.|"
                            r"^internal/|^context\."),
]
# The buckets in the order they are printed.
ORDER = ["crypto", "copies", "quinn-proto/quic-go", "allocation", "sleep/wake",
         "kernel net/syscalls", "server loop/runtime"]


# The owner of a symbol, first match wins: (pattern on "DSO SYMBOL", owner).
OWNERS = [
    (r"^\[kernel", "kernel"),
    (r"quinn_proto", "quinn-proto"),
    (r"quinn_udp|quinn::", "quinn"),
    (r"^\S+ <?fastudp_(quic|io|sys|cli)::", "engine (fastudp)"),
    (r"(^|[^a-z_])h3::|h3_quinn", "h3"),
    (r"fastudp_quic|fastudp_io|fastudp_sys|fastudp::|fastudp_cli", "engine (fastudp)"),
    (r"rustls", "rustls"),
    (r"ring_core|ring::", "ring"),
    (r"aws_lc|aws-lc", "aws-lc"),
    (r"tokio", "tokio"),
    (r"bytes::", "bytes"),
    (r"hashbrown|core::|alloc::|std::|__rust", "Rust std"),
    (r"github\.com/quic-go/", "quic-go"),
    (r" crypto/tls|crypto/internal/fips140/aes|crypto/", "Go crypto"),
    (r" net/http|golang\.org/x/net/http2|vendor/golang\.org/x/net/http2", "Go net/http"),
    (r"github\.com/caddyserver", "Caddy"),
    (r" runtime\.|internal/runtime", "Go runtime"),
    (r" (net|os|internal/poll|syscall)\.", "Go net/os"),
    (r"^libc|^ld-linux", "libc"),
]


def top(data, pid, gbit, n):
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--pid", pid, "-n",
         "--sort", "dso,sym", "--stdio", "-g", "none", "--percent-limit", "0"],
        capture_output=True, text=True).stdout
    rows, total = [], 0.0
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        samples, dso, sym = float(m.group(2)), m.group(3), m.group(5).strip()
        total += samples
        key = ("[kernel] " if m.group(4) == "k" else dso + " ") + sym
        owner = "other (" + dso + ")"
        for rx, o in OWNERS:
            if re.search(rx, key):
                owner = o
                break
        rows.append((samples, sym, owner))
    ev = subprocess.run(["perf", "evlist", "-F", "-i", data],
                        capture_output=True, text=True).stdout
    m = re.search(r"sample_freq=(\d+)", ev)
    period_ms = 1000.0 / int(m.group(1)) if m else 0.25
    rows.sort(key=lambda r: -r[0])
    for samples, sym, owner in rows[:n]:
        print(f"{samples * period_ms / gbit:.1f} ms/Gbit\t{100 * samples / total:.1f}%\t{owner}\t{sym[:90]}")
    print(f"{total * period_ms / gbit:.1f} ms/Gbit\t100%\tall\t({len(rows)} symbols)")


def main():
    data, pid = sys.argv[1], sys.argv[2]
    gbit = float(sys.argv[3]) if len(sys.argv) > 3 else None
    if len(sys.argv) > 5 and sys.argv[4] == "--top":
        top(data, pid, gbit, int(sys.argv[5]))
        return
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--pid", pid, "-n",
         "--sort", "sym", "--stdio", "-g", "none", "--percent-limit", "0"],
        capture_output=True, text=True).stdout
    tot = {}
    total = 0.0
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\d+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        # Samples, not the rounded percentage.
        pct, sym = float(m.group(2)), m.group(4).strip()
        total += pct
        b = "other"
        for name, rx in BUCKETS:
            if re.search(rx, sym, re.I):
                b = name
                break
        tot[b] = tot.get(b, 0.0) + pct
    period_ms = None
    if gbit:
        ev = subprocess.run(["perf", "evlist", "-F", "-i", data],
                            capture_output=True, text=True).stdout
        m = re.search(r"sample_freq=(\d+)", ev)
        period_ms = 1000.0 / int(m.group(1)) if m else None
    for name in ORDER + ["other"]:
        share = 100 * tot.get(name, 0.0) / total if total else 0.0
        if period_ms:
            per = tot.get(name, 0.0) * period_ms / gbit
            print(f"{name}\t{share:.1f}%\t{per:.1f} ms/Gbit")
        else:
            print(f"{name}\t{share:.1f}%")
    if period_ms:
        print(f"total\t100%\t{total * period_ms / gbit:.1f} ms/Gbit")


main()
