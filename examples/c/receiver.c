/* fastudp-receiver: the NGINX QUIC article's GRO receiver ("recvmsg mode
 * with GRO support": UDP_GRO on, the segment size from the control
 * message, a coalesced buffer split back into datagrams), on libfastudp.
 *
 * libfastudp turns GRO on, receives a batch per call (recvmsg or
 * recvmmsg, as the backlog asks), decodes the control messages and splits
 * each message into its datagrams: fastudp_recv, then an iterator.
 *
 *   fastudp-receiver [-p 8000] [-6] [-n DATAGRAMS] [-v] [-c] [-b BYTES]
 *                    [-i IDLE_SECONDS] [-w WAIT_SECONDS] [-q]
 *
 * -v checks sequence numbers (lost, duplicate), -c also every byte of
 * every datagram (the format is in common.h). -a acknowledges what came
 * (for sender -a: flow control, so that nothing overflows the receive
 * buffer). With -p 0 it picks a free port and prints it. Exit status: 0, or 1 when a datagram was corrupt,
 * duplicate or missing without the kernel having counted a drop.
 */
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static void usage(void) {
    fprintf(stderr,
            "usage: fastudp-receiver [-p PORT] [-6] [-n DATAGRAMS] [-v] [-c] [-a] [-b BYTES]\n"
            "                        [-i IDLE_SECONDS] [-w WAIT_SECONDS] [-q]\n"
            "  -p PORT       port to listen on (8000; 0 picks one and prints it)\n"
            "  -6            IPv6 (dual stack)\n"
            "  -n DATAGRAMS  stop after this many (and check that all came, with -v)\n"
            "  -v            check sequence numbers (needs -n)\n"
            "  -c            check every byte (implies -v)\n"
            "  -a            acknowledge to the sender (for sender -a)\n"
            "  -b BYTES      receive buffer to ask for (SO_RCVBUF)\n"
            "  -i SECONDS    silence that ends the run once data came (2)\n"
            "  -w SECONDS    how long to wait for the first datagram (60)\n"
            "  -q            only the summary\n");
    exit(2);
}

/* Tells the sender how much came, and how much it may have in flight. */
static void send_ack(fastudp_socket *sock, const struct sockaddr_storage *peer, socklen_t len,
                     uint8_t *buf, uint64_t got, uint64_t window) {
    put_le64(buf + 8, got);
    put_le64(buf + 16, window);
    fastudp_transmit t = {.destination = (const struct sockaddr *)peer,
                          .destination_len = len,
                          .contents = buf,
                          .contents_len = ACK_LEN};
    fastudp_sent sent;
    fastudp_result r = fastudp_send(sock, &t, 1, &sent);
    /* A full send buffer loses this one; the next says more. */
    if (r != FASTUDP_OK && r != FASTUDP_ERR_WOULD_BLOCK) die("acknowledge", r);
}

int main(int argc, char **argv) {
    unsigned port = 8000, ipv6 = 0, verify = 0, check = 0, ack = 0, quiet = 0;
    unsigned long long total = 0, idle = 2, wait = 60;
    size_t rcvbuf = 0;
    int opt;
    while ((opt = getopt(argc, argv, "p:6n:vcab:i:w:qh")) != -1) {
        switch (opt) {
        case 'p': port = (unsigned)parse_num("-p", optarg, 0, 65535); break;
        case '6': ipv6 = 1; break;
        case 'n': total = parse_num("-n", optarg, 1, 1ULL << 32); break;
        case 'v': verify = 1; break;
        case 'c': check = verify = 1; break;
        case 'a': ack = 1; break;
        case 'b': rcvbuf = (size_t)parse_num("-b", optarg, 1, 1ULL << 31); break;
        case 'i': idle = parse_num("-i", optarg, 1, 3600); break;
        case 'w': wait = parse_num("-w", optarg, 1, 86400); break;
        case 'q': quiet = 1; break;
        default: usage();
        }
    }
    if (optind != argc) usage();
    if (verify && total == 0) {
        fprintf(stderr, "-v and -c need -n: the number of datagrams the sender sends\n");
        return 2;
    }

    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    socklen_t addr_len;
    if (ipv6) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        addr_len = sizeof *a6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        addr_len = sizeof *a4;
    }
    fastudp_config cfg;
    fastudp_config_init(&cfg); /* GRO on by default */
    cfg.recv_buffer = rcvbuf;
    fastudp_socket *sock;
    fastudp_result r = fastudp_socket_bind((const struct sockaddr *)&addr, addr_len, &cfg, &sock);
    if (r != FASTUDP_OK) die("bind", r);
    fastudp_capabilities caps;
    fastudp_socket_capabilities(sock, &caps);
    if (!caps.gro) fprintf(stderr, "receiver: warning: no UDP GRO on this kernel\n");

    /* Wake up every 100 ms to notice silence. */
    int fd;
    fastudp_socket_fd(sock, &fd);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
        perror("SO_RCVTIMEO");
        return 1;
    }
    int effective = 0;
    socklen_t elen = sizeof effective;
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &effective, &elen);
    uint64_t window = (uint64_t)effective / 4;
    struct sockaddr_storage bound;
    socklen_t bound_len;
    fastudp_socket_local_addr(sock, &bound, &bound_len);
    unsigned bound_port = ntohs(bound.ss_family == AF_INET6
                                    ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                    : ((struct sockaddr_in *)&bound)->sin_port);
    /* The test driver reads this line to learn the port. */
    printf("listening on port %u (GRO %s)\n", bound_port, caps.gro ? "on" : "off");
    fflush(stdout);

    fastudp_recv_batch *batch;
    r = fastudp_recv_batch_new(32, 0, &batch);
    if (r != FASTUDP_OK) die("batch", r);
    uint8_t *seen = verify ? calloc(total, 1) : NULL;
    if (verify && !seen) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    unsigned long long got = 0, bytes = 0, calls = 0, messages = 0;
    unsigned long long duplicates = 0, corrupt = 0, out_of_range = 0;
    double start = now_s(CLOCK_MONOTONIC), first = 0, last = 0, cpu0 = 0;
    struct sockaddr_storage peer;
    socklen_t peer_len = 0;
    uint8_t ack_buf[ACK_LEN];
    memcpy(ack_buf, ACK_MAGIC, 8);
    for (;;) {
        size_t n;
        r = fastudp_recv(sock, batch, &n);
        double now = now_s(CLOCK_MONOTONIC);
        if (r == FASTUDP_ERR_WOULD_BLOCK) {
            /* An acknowledgement may have been lost: say it again. */
            if (ack && peer_len) send_ack(sock, &peer, peer_len, ack_buf, got, window);
            if (first == 0 && now - start > (double)wait) {
                fprintf(stderr, "receiver: no datagram arrived in %llu s\n", wait);
                return 1;
            }
            if (first != 0 && now - last >= (double)idle) break;
            continue;
        }
        if (r != FASTUDP_OK) die("receive", r);
        if (first == 0) {
            first = now;
            cpu0 = now_s(CLOCK_THREAD_CPUTIME_ID);
        }
        last = now;
        calls++;
        messages += n;
        if (!verify) {
            /* Counting needs no splitting: each message says how many
             * datagrams it holds (as `fastudp rx` counts). */
            for (size_t i = 0; i < n; i++) {
                const fastudp_recv_meta *m;
                const uint8_t *data;
                fastudp_recv_batch_message(batch, i, &m, &data);
                got += m->datagrams;
                bytes += m->len;
                if (m->truncated) corrupt++;
            }
            if (total && got >= total) break;
            continue;
        }
        fastudp_datagram_iter it;
        fastudp_recv_batch_datagrams(batch, &it);
        fastudp_datagram d;
        bool more;
        while ((r = fastudp_datagram_iter_next(&it, &d, &more)) == FASTUDP_OK && more) {
            got++;
            bytes += d.len;
            if (d.meta->truncated) corrupt++;
            if (d.len < 8) {
                corrupt++;
                continue;
            }
            uint64_t seq = get_le64(d.data);
            if (seq >= total) {
                out_of_range++;
                continue;
            }
            if (seen[seq]) duplicates++;
            seen[seq] = 1;
            if (check && !pattern_ok(d.data, d.len)) {
                if (corrupt == 0)
                    fprintf(stderr, "receiver: datagram %llu (%zu bytes) is corrupt\n",
                            (unsigned long long)seq, d.len);
                corrupt++;
            }
        }
        if (r != FASTUDP_OK) die("iterate", r);
        if (ack && n > 0) {
            const fastudp_recv_meta *m;
            const uint8_t *data;
            fastudp_recv_batch_message(batch, 0, &m, &data);
            memcpy(&peer, &m->source, m->source_len);
            peer_len = m->source_len;
            send_ack(sock, &peer, peer_len, ack_buf, got, window);
        }
        if (total && got >= total) break;
    }
    double cpu = now_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    double secs = last - first > 1e-3 ? last - first : 1e-3;
    fastudp_stats st;
    fastudp_socket_stats(sock, &st);
    unsigned long long lost = 0;
    if (verify)
        for (unsigned long long s = 0; s < total; s++) lost += !seen[s];
    if (!quiet && st.truncated) fprintf(stderr, "receiver: %llu messages truncated\n",
                                        (unsigned long long)st.truncated);
    printf("summary: role=rx datagrams=%llu bytes=%llu seconds=%.3f gbps=%.3f calls=%llu"
           " messages=%llu cpu_ns_per_byte=%.4f lost=%llu duplicates=%llu corrupt=%llu"
           " out_of_range=%llu kernel_drops=%llu\n",
           got, bytes, secs, bytes * 8 / secs / 1e9, calls, messages,
           bytes ? cpu * 1e9 / bytes : 0.0, lost, duplicates, corrupt, out_of_range,
           (unsigned long long)st.kernel_drops);
    int bad = corrupt || duplicates || out_of_range;
    /* A missing datagram is a failure unless the kernel counted drops for
     * it (a GRO train dropped whole counts once, so drops can be fewer). */
    if (verify && lost > 0 && st.kernel_drops == 0) bad = 1;
    free(seen);
    fastudp_recv_batch_free(batch);
    fastudp_socket_free(sock);
    return bad ? 1 : 0;
}
