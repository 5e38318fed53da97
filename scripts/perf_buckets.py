#!/usr/bin/env python3
"""Buckets a `perf record -e cpu-clock -a -g` profile by kernel function.

Usage:
    perf_buckets.py [--top N] LABEL=FILE.data:BYTES[:PID] ...

For each profile, sums the self time (cpu-clock periods, ns) of every
symbol of every process except perf itself into buckets (segmentation,
veth, GRO, socket lookup, queueing, copy, wake-ups, alloc/free, the bench's
own user-space work, ...) and prints each bucket's CPU ns per byte moved
(BYTES is the payload the run moved, from the bench's output), next to the
other profiles and as a ratio to the first. `--top N` also prints each
profile's N costliest symbols with their bucket. With PID, only that
process counts, and the kernel's own softirq threads and the idle task
(whose samples include the softirq work run from interrupts while a CPU
was idle): on a machine shared with other work, the rest is theirs.

Only `perf report` is needed; the profile must have kernel symbols
(/proc/kallsyms readable, kptr_restrict 0).
"""

import re
import subprocess
import sys
from collections import defaultdict

# First match wins: the specific buckets before the broad ones.
BUCKETS = [
    ("idle", r"^(pv_native_safe_halt|default_idle|do_idle|cpuidle|poll_idle|"
             r"intel_idle|acpi_idle|default_idle_call|cpu_startup_entry)"),
    ("copy (user<->kernel)", r"(_copy_to_iter|_copy_from_iter|copy_user|"
                             r"__check_object_size|check_heap_object|"
                             r"__skb_datagram_iter|skb_copy_datagram|"
                             r"simple_copy_to_iter|rep_movs|copy_page|"
                             r"__pi_memcpy|^memcpy|csum_partial_copy)"),
    ("socket lookup", r"(lookup|ehashfn|compute_score|udp4_lib_lookup|"
                      r"__inet_lookup|udp_lib_lookup)"),
    ("segmentation (GSO)", r"(skb_segment|gso_segment|__skb_gso_segment|"
                           r"skb_mac_gso_segment|validate_xmit|"
                           r"ip_send_check|skb_gso|gso_reset)"),
    ("GRO", r"(gro|skb_gro_receive)"),
    ("wake-ups, scheduling", r"(_raw_spin_unlock_irqrestore|try_to_wake_up|"
                             r"sock_def_readable|__wake_up|wake|"
                             r"finish_task_switch|schedule|pick_next|"
                             r"enqueue_task|dequeue_task|update_curr|ttwu|"
                             r"select_task_rq|psi_|sched|tcp_data_ready|"
                             r"sk_wait_data|wait_woken|prepare_to_wait|"
                             r"finish_wait|__x2apic|native_apic|"
                             r"sysvec_|irq_exit|__irq_exit|hrtimer|"
                             r"sk_stream_wait)"),
    ("alloc/free", r"(alloc|kfree|slab|kmem_cache|free|skb_release|"
                   r"consume_skb|napi_skb_cache|page_frag|get_netmem|"
                   r"put_page|skb_attempt_defer|sock_wfree|tcp_wfree|"
                   r"skb_orphan|skb_clone|refill|__skb_header_release|"
                   r"kmalloc|skb_free_head|napi_consume|__put_page|"
                   r"folio|get_page|page_pool)"),
    ("socket queueing, protocol receive", r"(__udp_enqueue|udp_queue_rcv|"
                                          r"udp_rmem|skb_queue|"
                                          r"__skb_recv_udp|udp_recvmsg|"
                                          r"__skb_try_recv|tcp_rcv|"
                                          r"tcp_queue|tcp_data|"
                                          r"sk_add_backlog|release_sock|"
                                          r"lock_sock|tcp_recvmsg|"
                                          r"tcp_v4_rcv|tcp_ack|"
                                          r"tcp_clean_rtx|tcp_event|"
                                          r"udp_unicast|udp_rcv|"
                                          r"__udp4_lib_rcv|sk_filter|"
                                          r"udp_skb_destructor|"
                                          r"tcp_cleanup_rbuf|__tcp_ack|"
                                          r"tcp_send_ack|tcp_rack|"
                                          r"ip_local_deliver|"
                                          r"ip_protocol_deliver|"
                                          r"ip_rcv|ip_list_rcv|"
                                          r"ip_sublist_rcv|tcp_v4_do_rcv|"
                                          r"udp_post_recv|sk_reset_timer|"
                                          r"__sk_mem|sk_forced_mem|"
                                          r"skb_set_owner|tcp_rate|"
                                          r"tcp_mstamp|tcp_grow)"),
    ("veth, device, softirq", r"(veth|__dev_forward_skb|dev_hard_start_xmit|"
                              r"__dev_queue_xmit|netif_|eth_type_trans|"
                              r"__netif_receive|napi|net_rx_action|"
                              r"ptr_ring|xdp|dev_queue_xmit|sch_direct|"
                              r"qdisc|handle_softirqs|do_softirq|"
                              r"__local_bh_enable|skb_clone_tx_timestamp|"
                              r"neigh|ip_finish_output|ip_output|"
                              r"skb_scrub_packet|dst_release|"
                              r"__netif_receive_skb|process_backlog|"
                              r"skb_tx_timestamp|dev_xmit|txq|rps)"),
    ("syscall entry, socket layer", r"(entry_SYSCALL|do_syscall|syscall|"
                                    r"__sys_|__x64_sys|sock_sendmsg|"
                                    r"sock_recvmsg|____sys|___sys|"
                                    r"copy_msghdr|import_iovec|fdget|"
                                    r"__fget|rw_verify|security_|apparmor|"
                                    r"selinux|bpf_lsm|__rcu_read|"
                                    r"rcu_read|fput|__fput|inet_sendmsg|"
                                    r"inet_recvmsg|__import_iovec|"
                                    r"iovec_from_user|sockfd_lookup|"
                                    r"__cmsg|cmsghdr|put_cmsg|"
                                    r"clear_bhb|x86_return_thunk|"
                                    r"srso|retbleed|__pfx|"
                                    r"exit_to_user|fpregs|"
                                    r"switch_fpu|restore_fpregs|"
                                    r"arch_exit_to_user|"
                                    r"syscall_exit)"),
    ("protocol send (UDP/TCP/IP)", r"(udp|tcp|^ip_|inet|__ip_|ip4|"
                                   r"raw_spin|_raw_spin|spin_lock|"
                                   r"csum|skb_put|skb_push|skb_pull)"),
]
COMPILED = [(name, re.compile(rx)) for name, rx in BUCKETS]
USER = "bench/user space (sequence checking, buffers)"
OTHER = "other kernel"


def bucket(comm: str, sym: str, kernel: bool) -> str:
    if not kernel:
        return USER
    for name, rx in COMPILED:
        if rx.search(sym):
            return name
    return OTHER


LINE = re.compile(r"^\s*(\d+)\s+(\S.*?)\s+\[([k.])\]\s+(.*\S)\s*$")


def report(path: str, only):
    """(period, comm, kernel?, symbol) of every symbol; `only` is extra
    filter arguments of perf report (--pid, --comms)."""
    out = subprocess.run(
        ["perf", "report", "-i", path, "--stdio", "--no-children",
         "--sort", "comm,sym", "-F", "period,comm,sym", "-g", "none",
         "--percent-limit", "0"] + only,
        check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = LINE.match(line)
        if m:
            yield int(m[1]), m[2].strip(), m[3] == "k", m[4]


def load(path: str, pid):
    per_bucket = defaultdict(int)
    per_sym = defaultdict(int)
    if pid is None:
        rows = report(path, [])
    else:
        # The process's threads, then the softirq threads and the idle
        # task (irq-time softirq while idle), which work for it too.
        rows = list(report(path, ["--pid", str(pid)])) + list(
            report(path, ["--comms", "swapper,ksoftirqd/0,ksoftirqd/1,"
                          "ksoftirqd/2,ksoftirqd/3"]))
    for period, comm, kernel, sym in rows:
        if comm.startswith("perf"):
            continue
        b = bucket(comm, sym, kernel)
        per_bucket[b] += period
        per_sym[(sym, b)] += period
    return per_bucket, per_sym


def main(argv):
    top = 0
    if len(argv) >= 2 and argv[0] == "--top":
        top = int(argv[1])
        argv = argv[2:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for a in argv:
        try:
            label, rest = a.split("=", 1)
            parts = rest.split(":")
            path, nbytes = parts[0], float(parts[1])
            pid = int(parts[2]) if len(parts) > 2 else None
            if len(parts) > 3:
                raise ValueError
        except (ValueError, IndexError):
            print(f"bad argument {a!r}: want LABEL=FILE.data:BYTES[:PID]",
                  file=sys.stderr)
            return 2
        if nbytes <= 0:
            print(f"{a}: BYTES must be positive", file=sys.stderr)
            return 2
        pb, ps = load(path, pid)
        runs.append((label, nbytes, pb, ps))
    names = [n for n, _ in BUCKETS] + [USER, OTHER]
    w = max(len(n) for n in names)
    head = f"{'CPU ns per byte moved':<{w}}" + "".join(
        f" {r[0]:>12}" for r in runs)
    if len(runs) > 1:
        head += "".join(f" {r[0] + '/' + runs[0][0]:>14}" for r in runs[1:])
    print(head)
    totals = [0.0] * len(runs)
    for n in names:
        vals = [r[2].get(n, 0) / r[1] for r in runs]
        if all(v == 0 for v in vals):
            continue
        if n != "idle":
            totals = [t + v for t, v in zip(totals, vals)]
        line = f"{n:<{w}}" + "".join(f" {v:>12.3f}" for v in vals)
        if len(runs) > 1:
            line += "".join(
                f" {(v / vals[0]) if vals[0] else float('inf'):>13.2f}x"
                for v in vals[1:])
        print(line)
    line = f"{'total, idle left out':<{w}}" + "".join(
        f" {t:>12.3f}" for t in totals)
    if len(runs) > 1:
        line += "".join(f" {t / totals[0]:>13.2f}x" for t in totals[1:])
    print(line)
    for label, nbytes, _, ps in runs if top else []:
        print(f"\n{label}: the {top} costliest symbols (ns per byte)")
        for (sym, b), p in sorted(ps.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {p / nbytes:8.4f}  {sym:<45} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
