/* fastudp-sender: the fastest sender of the NGINX QUIC article ("GSO,
 * merge sendmsg": one buffer of 32 datagrams of 1216 bytes, cut by the
 * kernel with UDP_SEGMENT, one system call per buffer), on libfastudp.
 *
 * What the article's program does by hand (socket option probe, cmsg
 * buffer, msghdr, sendmsg) is one fastudp_transmit per train and one
 * fastudp_send; libfastudp probes GSO, falls back to one datagram at a
 * time when the path refuses it, and reports exactly what went out.
 * With -m N, N trains go in one call (sendmmsg). With -a it keeps no more
 * in flight than `fastudp-receiver -a` acknowledges room for (flow
 * control: a transfer that loses nothing to a full receive buffer).
 *
 *   fastudp-sender -D 127.0.0.1 -p 8000 [-s 1216] [-g 32] [-m 1]
 *                  [-n 320000 | -l SECONDS] [-a] [-6] [-q]
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/time.h>
#include <unistd.h>

static void usage(void) {
    fprintf(stderr,
            "usage: fastudp-sender [-D ADDR] [-p PORT] [-s BYTES] [-g SEGMENTS] [-m TRAINS]\n"
            "                      [-n DATAGRAMS | -l SECONDS] [-a] [-6] [-q]\n"
            "  -D ADDR      destination address (127.0.0.1, or ::1 with -6)\n"
            "  -p PORT      destination port (8000)\n"
            "  -s BYTES     bytes per datagram (1216, the article's)\n"
            "  -g SEGMENTS  datagrams per GSO train (32, the article's; cut to the kernel's limit)\n"
            "  -m TRAINS    trains per fastudp_send call (1: one sendmsg per train, as the article)\n"
            "  -n DATAGRAMS datagrams to send (320000: the article's 10000 x 32)\n"
            "  -l SECONDS   send for this long instead\n"
            "  -a           wait for the receiver's acknowledgements (fastudp-receiver -a)\n"
            "  -6           IPv6\n"
            "  -q           only the summary\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *dest_s = NULL;
    unsigned port = 8000, ipv6 = 0, quiet = 0, acks = 0;
    size_t size = 1216, segs = 32, trains = 1;
    unsigned long long total = 320000;
    double secs = 0;
    int opt;
    while ((opt = getopt(argc, argv, "D:p:s:g:m:n:l:a6qh")) != -1) {
        switch (opt) {
        case 'D': dest_s = optarg; break;
        case 'p': port = (unsigned)parse_num("-p", optarg, 1, 65535); break;
        case 's': size = (size_t)parse_num("-s", optarg, HEADER_LEN, 65507); break;
        case 'g': segs = (size_t)parse_num("-g", optarg, 1, 128); break;
        case 'm': trains = (size_t)parse_num("-m", optarg, 1, 64); break;
        case 'n': total = parse_num("-n", optarg, 1, 1ULL << 40); break;
        case 'l': {
            char *end;
            secs = strtod(optarg, &end);
            if (*end != '\0' || !(secs >= 0.01 && secs <= 86400)) {
                fprintf(stderr, "-l %s: expected 0.01 to 86400 seconds\n", optarg);
                return 2;
            }
            break;
        }
        case 'a': acks = 1; break;
        case '6': ipv6 = 1; break;
        case 'q': quiet = 1; break;
        default: usage();
        }
    }
    if (optind != argc) usage();

    /* The destination, as the article's program builds it. */
    struct sockaddr_storage dest;
    socklen_t dest_len;
    memset(&dest, 0, sizeof dest);
    if (!dest_s) dest_s = ipv6 ? "::1" : "127.0.0.1";
    if (ipv6) {
        struct sockaddr_in6 *d6 = (struct sockaddr_in6 *)&dest;
        d6->sin6_family = AF_INET6;
        d6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, dest_s, &d6->sin6_addr) != 1) {
            fprintf(stderr, "-D %s: not an IPv6 address\n", dest_s);
            return 2;
        }
        dest_len = sizeof *d6;
    } else {
        struct sockaddr_in *d4 = (struct sockaddr_in *)&dest;
        d4->sin_family = AF_INET;
        d4->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, dest_s, &d4->sin_addr) != 1) {
            fprintf(stderr, "-D %s: not an IPv4 address (use -6 for IPv6)\n", dest_s);
            return 2;
        }
        dest_len = sizeof *d4;
    }

    /* A socket on the wildcard address, set up by libfastudp. */
    struct sockaddr_storage local;
    memset(&local, 0, sizeof local);
    local.ss_family = ipv6 ? AF_INET6 : AF_INET;
    socklen_t local_len = ipv6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    fastudp_config cfg;
    fastudp_config_init(&cfg);
    cfg.gro = false; /* a sender */
    fastudp_socket *sock;
    fastudp_result r = fastudp_socket_bind((const struct sockaddr *)&local, local_len, &cfg, &sock);
    if (r != FASTUDP_OK) die("bind", r);
    fastudp_capabilities caps;
    fastudp_socket_capabilities(sock, &caps);
    size_t max_payload = ipv6 ? 65527 : 65507;
    if (segs > caps.kernel_max_segments) segs = caps.kernel_max_segments;
    if (segs * size > max_payload) segs = max_payload / size;
    if (segs < 1) segs = 1;
    if (!quiet)
        printf("sender: %zu-byte datagrams, %zu per train, %zu trains per call to %s port %u"
               " (GSO %s, up to %zu segments)\n",
               size, segs, trains, dest_s, port,
               caps.max_gso_segments > 1 ? "on" : "off", caps.max_gso_segments);

    /* One call's worth of trains, the pattern written once. */
    size_t per_call = segs * trains;
    uint8_t *buf = malloc(per_call * size);
    fastudp_transmit *ts = calloc(trains, sizeof *ts);
    if (!buf || !ts) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < per_call; i++) fill_pattern(buf + i * size, size, (uint32_t)i);

    /* Flow control: acknowledgements arrive on the same socket. */
    fastudp_recv_batch *ack_batch = NULL;
    if (acks) {
        r = fastudp_recv_batch_new(8, 64, &ack_batch);
        if (r != FASTUDP_OK) die("batch", r);
        int fd;
        fastudp_socket_fd(sock, &fd);
        struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    uint64_t acked = 0, window = 64 * 1024;

    unsigned long long seq = 0, calls = 0;
    double t0 = now_s(CLOCK_MONOTONIC), cpu0 = now_s(CLOCK_THREAD_CPUTIME_ID);
    double deadline = t0 + secs;
    for (;;) {
        size_t n;
        if (secs > 0) {
            if (now_s(CLOCK_MONOTONIC) >= deadline) break;
            n = per_call;
        } else {
            if (seq >= total) break;
            n = total - seq < per_call ? (size_t)(total - seq) : per_call;
        }
        /* With -a: wait until the receiver has room for this call. */
        double waited = now_s(CLOCK_MONOTONIC);
        while (acks && (seq + n - acked) * size > window && seq > acked) {
            size_t msgs;
            r = fastudp_recv(sock, ack_batch, &msgs);
            if (r == FASTUDP_ERR_WOULD_BLOCK) {
                if (now_s(CLOCK_MONOTONIC) - waited > 60) {
                    fprintf(stderr, "sender: no acknowledgement for 60 s at %llu of %llu sent\n",
                            (unsigned long long)acked, seq);
                    return 1;
                }
                continue;
            }
            if (r != FASTUDP_OK) die("acknowledgements", r);
            for (size_t i = 0; i < msgs; i++) {
                const fastudp_recv_meta *m;
                const uint8_t *d;
                fastudp_recv_batch_message(ack_batch, i, &m, &d);
                if (m->len != ACK_LEN || memcmp(d, ACK_MAGIC, 8) != 0) continue;
                uint64_t a = get_le64(d + 8), w = get_le64(d + 16);
                if (a > acked) {
                    acked = a;
                    waited = now_s(CLOCK_MONOTONIC);
                }
                /* At least one call's worth, or nothing could ever go. */
                window = w > per_call * size ? w : per_call * size;
            }
        }
        /* Stamp the sequence numbers and describe the trains. */
        for (size_t i = 0; i < n; i++) put_le64(buf + i * size, seq + i);
        size_t k = 0;
        for (size_t off = 0; off < n; off += segs, k++) {
            size_t here = n - off < segs ? n - off : segs;
            ts[k] = (fastudp_transmit){
                .destination = (const struct sockaddr *)&dest,
                .destination_len = dest_len,
                .contents = buf + off * size,
                .contents_len = here * size,
                .segment_size = here > 1 ? size : 0,
            };
        }
        /* Send them all: resume where the kernel stopped, never twice. */
        size_t done = 0;
        while (done < k) {
            fastudp_sent sent;
            r = fastudp_send(sock, ts + done, k - done, &sent);
            calls++;
            if (r == FASTUDP_ERR_WOULD_BLOCK) continue; /* blocking socket: rare */
            if (r != FASTUDP_OK) die("send", r);
            done += sent.transmits;
            if (sent.datagrams > 0) {
                ts[done].contents += sent.datagrams * size;
                ts[done].contents_len -= sent.datagrams * size;
            }
        }
        seq += n;
        /* A receiver that went away shows up as an ICMP error. */
        if ((calls & 63) == 0) {
            fastudp_socket_error e;
            bool got;
            r = fastudp_recv_error(sock, &e, &got);
            if (r != FASTUDP_OK) die("error queue", r);
            if (got && e.kind == FASTUDP_SOCKET_ERROR_UNREACHABLE) {
                fprintf(stderr, "sender: %s; stopped after %llu datagrams\n", e.description, seq);
                return 1;
            }
        }
    }
    double secs_taken = now_s(CLOCK_MONOTONIC) - t0;
    double cpu = now_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    unsigned long long bytes = seq * size;
    fastudp_stats st;
    fastudp_socket_stats(sock, &st);
    for (size_t i = 0; i < st.fallbacks; i++) {
        fastudp_fallback_event ev;
        if (fastudp_socket_fallback(sock, i, &ev) == FASTUDP_OK)
            fprintf(stderr, "sender: fallback: %s\n", ev.reason);
    }
    printf("summary: role=tx datagrams=%llu bytes=%llu seconds=%.3f gbps=%.3f calls=%llu"
           " syscalls=%llu cpu_ns_per_byte=%.4f\n",
           seq, bytes, secs_taken, bytes * 8 / secs_taken / 1e9, calls,
           (unsigned long long)st.send_calls, bytes ? cpu * 1e9 / bytes : 0.0);
    fastudp_recv_batch_free(ack_batch);
    fastudp_socket_free(sock);
    free(ts);
    free(buf);
    return 0;
}
