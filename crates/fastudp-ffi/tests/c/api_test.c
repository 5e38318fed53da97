/* Tests of libfastudp's C API from C: argument checks, errors and their
 * details, send/receive with GSO and GRO, the coalescer, the error queue
 * (ICMP), fallbacks and stats, wrapping a caller's descriptor, and (in a
 * build with FASTUDP_TEST_HOOKS) a panic inside the library coming back
 * as FASTUDP_ERR_PANIC. Built and run by tests/it/c.rs (also under
 * AddressSanitizer and valgrind) and by scripts/capi.sh check.
 *
 * Prints one line per failed check and "N passed, M failed" at the end;
 * exits 1 when a check failed. */
#include <fastudp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            passed++;                                                         \
        } else {                                                              \
            failed++;                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

#define OK(call)                                                              \
    do {                                                                      \
        fastudp_result r_ = (call);                                           \
        if (r_ != FASTUDP_OK) {                                               \
            char m_[512];                                                     \
            fastudp_last_error_message(m_, sizeof m_, NULL);                  \
            fprintf(stderr, "FAIL %s:%d: %s returned %d: %s\n", __FILE__,     \
                    __LINE__, #call, r_, m_);                                 \
            failed++;                                                         \
            return;                                                           \
        }                                                                     \
        passed++;                                                             \
    } while (0)

static struct sockaddr_in v4(const char *ip, unsigned port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

static char last_msg[1024];

static const char *last_message(void) {
    fastudp_last_error_message(last_msg, sizeof last_msg, NULL);
    return last_msg;
}

static fastudp_socket *bind_v4(const fastudp_config *cfg) {
    struct sockaddr_in a = v4("127.0.0.1", 0);
    fastudp_socket *s = NULL;
    fastudp_result r = fastudp_socket_bind((struct sockaddr *)&a, sizeof a, cfg, &s);
    if (r != FASTUDP_OK) {
        fprintf(stderr, "bind failed: %s\n", last_message());
        exit(1);
    }
    return s;
}

static struct sockaddr_in local_of(fastudp_socket *s) {
    struct sockaddr_storage ss;
    socklen_t len = 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    if (fastudp_socket_local_addr(s, &ss, &len) == FASTUDP_OK && len == sizeof a)
        memcpy(&a, &ss, sizeof a);
    return a;
}

/* Waits up to 2 s for the socket to become readable (data or error). */
static void wait_readable(fastudp_socket *s) {
    int fd;
    fastudp_socket_fd(s, &fd);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 2000);
}

static void test_version_and_names(void) {
    CHECK(strcmp(fastudp_version(), FASTUDP_VERSION_STRING) == 0,
          "library %s, header %s", fastudp_version(), FASTUDP_VERSION_STRING);
    CHECK(FASTUDP_VERSION_NUMBER ==
              FASTUDP_VERSION_MAJOR * 10000 + FASTUDP_VERSION_MINOR * 100 + FASTUDP_VERSION_PATCH,
          "version number");
    CHECK(strcmp(fastudp_strerror(FASTUDP_OK), "success") == 0, "%s", fastudp_strerror(0));
    CHECK(strstr(fastudp_strerror(FASTUDP_ERR_PANIC), "panicked") != NULL, "panic name");
    CHECK(strcmp(fastudp_strerror(12345), "unknown error code") == 0, "unknown code");
    CHECK(strcmp(fastudp_strerror(-1), "unknown error code") == 0, "negative code");
}

static void test_null_and_lengths(void) {
    fastudp_socket *s = bind_v4(NULL);
    struct sockaddr_in a = v4("127.0.0.1", 0);
    fastudp_socket *out = NULL;
    fastudp_sent sent;
    size_t n;
    CHECK(fastudp_socket_bind(NULL, sizeof a, NULL, &out) == FASTUDP_ERR_NULL, "NULL addr");
    CHECK(strstr(last_message(), "fastudp_socket_bind: argument 'addr' is NULL") != NULL, "%s",
          last_msg);
    CHECK(fastudp_socket_bind((struct sockaddr *)&a, sizeof a, NULL, NULL) == FASTUDP_ERR_NULL,
          "NULL out");
    CHECK(fastudp_socket_bind((struct sockaddr *)&a, 4, NULL, &out) == FASTUDP_ERR_INVALID,
          "short address");
    CHECK(strstr(last_message(), "too short") != NULL, "%s", last_msg);
    struct sockaddr_un_like { sa_family_t f; char path[30]; } u = {AF_UNIX, "x"};
    CHECK(fastudp_socket_bind((struct sockaddr *)&u, sizeof u, NULL, &out) == FASTUDP_ERR_INVALID,
          "AF_UNIX");
    CHECK(strstr(last_message(), "neither AF_INET") != NULL, "%s", last_msg);
    fastudp_config cfg;
    OK(fastudp_config_init(&cfg));
    CHECK(cfg.gro && !cfg.may_fragment && cfg.disabled == 0 && cfg.split_wait_ms == 5000,
          "defaults");
    cfg.disabled = 1u << 30;
    CHECK(fastudp_socket_bind((struct sockaddr *)&a, sizeof a, &cfg, &out) == FASTUDP_ERR_INVALID,
          "unknown feature bit");
    CHECK(fastudp_config_init(NULL) == FASTUDP_ERR_NULL, "config NULL");

    CHECK(fastudp_send(NULL, NULL, 0, &sent) == FASTUDP_ERR_NULL, "send NULL sock");
    CHECK(fastudp_send(s, NULL, 1, &sent) == FASTUDP_ERR_NULL, "send NULL transmits");
    CHECK(fastudp_send(s, NULL, 0, NULL) == FASTUDP_ERR_NULL, "send NULL sent");
    OK(fastudp_send(s, NULL, 0, &sent));
    CHECK(sent.transmits == 0 && sent.datagrams == 0, "empty send");
    fastudp_transmit t = {.destination = (struct sockaddr *)&a, .destination_len = sizeof a,
                          .contents = NULL, .contents_len = 10};
    CHECK(fastudp_send(s, &t, 1, &sent) == FASTUDP_ERR_INVALID, "NULL contents");
    CHECK(strstr(last_message(), "transmit 0: contents is NULL") != NULL, "%s", last_msg);
    t.contents = (const uint8_t *)"0123456789";
    t.ecn = 4;
    CHECK(fastudp_send(s, &t, 1, &sent) == FASTUDP_ERR_INVALID, "ECN 4");
    t.ecn = 0;
    t.destination_len = 3;
    CHECK(fastudp_send(s, &t, 1, &sent) == FASTUDP_ERR_INVALID, "short destination");

    fastudp_recv_batch *b = NULL;
    CHECK(fastudp_recv_batch_new(0, 0, &b) == FASTUDP_ERR_INVALID, "0 messages");
    CHECK(fastudp_recv_batch_new(129, 0, &b) == FASTUDP_ERR_INVALID, "129 messages");
    CHECK(fastudp_recv_batch_new(4, (size_t)1 << 30, &b) == FASTUDP_ERR_INVALID, "1 GiB");
    CHECK(fastudp_recv_batch_new(4, 0, NULL) == FASTUDP_ERR_NULL, "batch out NULL");
    OK(fastudp_recv_batch_new(4, 0, &b));
    CHECK(fastudp_recv(s, b, NULL) == FASTUDP_ERR_NULL, "recv NULL count");
    CHECK(fastudp_recv(s, NULL, &n) == FASTUDP_ERR_NULL, "recv NULL batch");
    const fastudp_recv_meta *meta;
    const uint8_t *data;
    CHECK(fastudp_recv_batch_message(b, 0, &meta, &data) == FASTUDP_ERR_INVALID,
          "message of an empty batch");
    fastudp_coalescer *c = NULL;
    CHECK(fastudp_coalescer_new(20, 0, &c) == FASTUDP_ERR_INVALID, "MTU 20");
    OK(fastudp_coalescer_new(0, 0, &c));
    CHECK(fastudp_coalescer_push(c, s, (struct sockaddr *)&a, sizeof a, NULL, 5, 0, NULL, 0,
                                 NULL) == FASTUDP_ERR_NULL,
          "push NULL data");
    CHECK(fastudp_coalescer_set_mtu(c, 70000) == FASTUDP_ERR_INVALID, "MTU 70000");
    fastudp_socket_error e;
    bool got;
    CHECK(fastudp_recv_error(s, &e, NULL) == FASTUDP_ERR_NULL, "recv_error NULL got");
    CHECK(fastudp_socket_fallback(s, 0, NULL) == FASTUDP_ERR_NULL, "fallback NULL");
    fastudp_fallback_event ev;
    CHECK(fastudp_socket_fallback(s, 0, &ev) == FASTUDP_ERR_INVALID, "no fallback 0");
    CHECK(fastudp_last_error(NULL) == FASTUDP_ERR_NULL, "last_error NULL");
    (void)got;

    /* snprintf semantics of the message, and the info. */
    CHECK(fastudp_socket_stats(s, NULL) == FASTUDP_ERR_NULL, "stats NULL");
    size_t len = 0;
    OK(fastudp_last_error_message(NULL, 0, &len));
    CHECK(len == strlen("fastudp_socket_stats: argument 'out' is NULL"), "length %zu", len);
    char small[8];
    OK(fastudp_last_error_message(small, sizeof small, &len));
    CHECK(strcmp(small, "fastudp") == 0, "cut to '%s'", small);
    CHECK(fastudp_last_error_message(NULL, 4, &len) == FASTUDP_ERR_NULL, "NULL buffer, cap 4");
    fastudp_error_info info;
    OK(fastudp_last_error(&info));
    CHECK(info.code == FASTUDP_ERR_NULL && !info.has_index, "info code %d", info.code);

    OK(fastudp_coalescer_free(c));
    OK(fastudp_recv_batch_free(b));
    OK(fastudp_socket_free(s));
    OK(fastudp_socket_free(NULL));
    OK(fastudp_recv_batch_free(NULL));
    OK(fastudp_coalescer_free(NULL));
}

static void test_send_errors_name_the_transmit(void) {
    fastudp_socket *s = bind_v4(NULL);
    struct sockaddr_in to = v4("127.0.0.1", 9);
    static uint8_t big[70000];
    fastudp_transmit t[3];
    for (int i = 0; i < 3; i++)
        t[i] = (fastudp_transmit){.destination = (struct sockaddr *)&to,
                                  .destination_len = sizeof to,
                                  .contents = big,
                                  .contents_len = 100};
    t[2].contents_len = 65508;
    fastudp_sent sent = {99, 99, 99};
    CHECK(fastudp_send(s, t, 3, &sent) == FASTUDP_ERR_PAYLOAD_TOO_LARGE, "too large");
    fastudp_error_info info;
    fastudp_last_error(&info);
    CHECK(info.has_index && info.index == 2, "index %zu", info.index);
    CHECK(strstr(last_message(), "transmit 2") != NULL, "%s", last_msg);
    fastudp_stats st;
    fastudp_socket_stats(s, &st);
    CHECK(st.send_calls == 0, "nothing was sent: %llu calls", (unsigned long long)st.send_calls);
    t[2].contents_len = 200 * 10;
    t[2].segment_size = 10; /* 200 segments: over any kernel's limit */
    CHECK(fastudp_send(s, t, 3, &sent) == FASTUDP_ERR_TOO_MANY_SEGMENTS, "segments");
    struct sockaddr_in6 six;
    memset(&six, 0, sizeof six);
    six.sin6_family = AF_INET6;
    six.sin6_port = htons(9);
    inet_pton(AF_INET6, "2001:db8::1", &six.sin6_addr);
    t[1].destination = (struct sockaddr *)&six;
    t[1].destination_len = sizeof six;
    t[2].segment_size = 0;
    t[2].contents_len = 10;
    CHECK(fastudp_send(s, t, 3, &sent) == FASTUDP_ERR_ADDRESS_FAMILY, "v6 on v4");
    fastudp_last_error(&info);
    CHECK(info.has_index && info.index == 1, "index %zu", info.index);
    /* A v4-mapped address too: the typed error, not EAFNOSUPPORT. */
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &six.sin6_addr);
    CHECK(fastudp_send(s, t, 3, &sent) == FASTUDP_ERR_ADDRESS_FAMILY, "v4-mapped on v4");
    fastudp_last_error(&info);
    CHECK(info.has_index && info.index == 1 && info.error_number == 0, "index %zu errno %d",
          info.index, info.error_number);

    /* Every transmit is checked before any is sent, however many: with
     * 100 transmits and #70 oversized, none goes out. */
    fastudp_socket *r = bind_v4(NULL);
    struct sockaddr_in rto = local_of(r);
    static fastudp_transmit many[100];
    for (int i = 0; i < 100; i++)
        many[i] = (fastudp_transmit){.destination = (struct sockaddr *)&rto,
                                     .destination_len = sizeof rto,
                                     .contents = big,
                                     .contents_len = 100};
    many[70].contents_len = 65508;
    sent = (fastudp_sent){99, 99, 99};
    CHECK(fastudp_send(s, many, 100, &sent) == FASTUDP_ERR_PAYLOAD_TOO_LARGE, "#70 too large");
    fastudp_last_error(&info);
    CHECK(info.has_index && info.index == 70, "index %zu", info.index);
    CHECK(sent.transmits == 99 && sent.datagrams == 99, "sent untouched on error");
    fastudp_socket_stats(s, &st);
    CHECK(st.send_calls == 0, "nothing of 100 was sent: %llu calls",
          (unsigned long long)st.send_calls);
    many[70].contents_len = 100;
    OK(fastudp_send(s, many, 100, &sent));
    CHECK(sent.transmits == 100, "all 100 sent once valid: %zu", sent.transmits);
    fastudp_socket_free(r);
    fastudp_socket_free(s);
}

static void test_gso_train_arrives_as_datagrams(void) {
    fastudp_socket *rx = bind_v4(NULL), *tx = bind_v4(NULL);
    struct sockaddr_in to = local_of(rx);
    fastudp_capabilities caps;
    OK(fastudp_socket_capabilities(tx, &caps));
    CHECK(caps.max_gso_segments >= 1 && caps.kernel_max_segments >= 1, "caps");
    size_t segs = caps.max_gso_segments > 1 ? 20 : 1, seg = 1000;
    uint8_t *buf = malloc(segs * seg + 7);
    for (size_t i = 0; i < segs * seg + 7; i++) buf[i] = (uint8_t)(i * 7 + i / seg);
    fastudp_transmit t[2] = {
        {.destination = (struct sockaddr *)&to, .destination_len = sizeof to,
         .contents = buf, .contents_len = segs * seg, .segment_size = seg},
        {.destination = (struct sockaddr *)&to, .destination_len = sizeof to,
         .contents = buf + segs * seg, .contents_len = 7},
    };
    fastudp_sent sent;
    OK(fastudp_send(tx, t, 2, &sent));
    CHECK(sent.transmits == 2 && sent.datagrams == 0, "sent %zu+%zu", sent.transmits,
          sent.datagrams);
    /* Loopback has no qdisc to fill: nothing was dropped locally. */
    CHECK(sent.dropped_locally == 0, "dropped locally %zu", sent.dropped_locally);
    fastudp_recv_batch *b;
    OK(fastudp_recv_batch_new(8, 0, &b));
    size_t got = 0, bytes = 0, msgs;
    int bad = 0;
    while (got < segs + 1) {
        wait_readable(rx);
        OK(fastudp_recv(rx, b, &msgs));
        fastudp_datagram_iter it;
        OK(fastudp_recv_batch_datagrams(b, &it));
        fastudp_datagram d;
        bool more;
        while (fastudp_datagram_iter_next(&it, &d, &more) == FASTUDP_OK && more) {
            size_t want = got < segs ? seg : 7;
            if (d.len != want || memcmp(d.data, buf + bytes, d.len) != 0) bad++;
            CHECK(d.meta->source_len == sizeof(struct sockaddr_in), "source length");
            bytes += d.len;
            got++;
        }
        if (msgs > 0) {
            const fastudp_recv_meta *m;
            const uint8_t *data;
            OK(fastudp_recv_batch_message(b, 0, &m, &data));
            CHECK(m->datagrams >= 1 && m->len >= 1 && data != NULL, "message 0");
            CHECK(m->destination_len == sizeof(struct sockaddr_in), "PKTINFO destination");
        }
    }
    CHECK(got == segs + 1 && bad == 0, "%zu datagrams, %d wrong", got, bad);
    /* An iterator set up before a receive is ended by it. */
    fastudp_datagram_iter it;
    OK(fastudp_recv_batch_datagrams(b, &it));
    int fd;
    fastudp_socket_fd(rx, &fd);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    CHECK(fastudp_recv(rx, b, &msgs) == FASTUDP_ERR_WOULD_BLOCK, "non-blocking, empty");
    CHECK(msgs == 0, "no messages");
    fastudp_error_info info;
    fastudp_last_error(&info);
    CHECK(info.error_number == EAGAIN, "errno %d", info.error_number);
    fastudp_datagram d;
    bool more;
    CHECK(fastudp_datagram_iter_next(&it, &d, &more) == FASTUDP_ERR_INVALID, "stale iterator");
    fastudp_stats st;
    OK(fastudp_socket_stats(tx, &st));
    CHECK(st.send_calls == 1, "one sendmmsg for a train and a datagram: %llu",
          (unsigned long long)st.send_calls);
    free(buf);
    fastudp_recv_batch_free(b);
    fastudp_socket_free(rx);
    fastudp_socket_free(tx);
}

static void test_coalescer(void) {
    fastudp_socket *rx = bind_v4(NULL), *tx = bind_v4(NULL);
    struct sockaddr_in to = local_of(rx);
    fastudp_coalescer *c;
    OK(fastudp_coalescer_new(1500, 0, &c));
    uint8_t d[1200];
    for (uint64_t i = 0; i < 100; i++) {
        memset(d, (int)i, sizeof d);
        uint64_t num = 99;
        OK(fastudp_coalescer_push(c, tx, (struct sockaddr *)&to, sizeof to, d, sizeof d,
                                  FASTUDP_ECN_ECT0, NULL, 0, &num));
        CHECK(num == i, "number %llu", (unsigned long long)num);
    }
    size_t qd, qt, flushed = 0;
    OK(fastudp_coalescer_queued(c, &qd, &qt));
    CHECK(qd == 100 && qt >= 1 && qt < 100, "queued %zu in %zu trains", qd, qt);
    OK(fastudp_coalescer_flush(c, tx, &flushed));
    CHECK(flushed == 100, "flushed %zu", flushed);
    fastudp_recv_batch *b;
    OK(fastudp_recv_batch_new(32, 0, &b));
    size_t got = 0, msgs, bad = 0, ecn = 0;
    while (got < 100) {
        wait_readable(rx);
        OK(fastudp_recv(rx, b, &msgs));
        fastudp_datagram_iter it;
        fastudp_recv_batch_datagrams(b, &it);
        fastudp_datagram dg;
        bool more;
        while (fastudp_datagram_iter_next(&it, &dg, &more) == FASTUDP_OK && more) {
            if (dg.len != 1200 || dg.data[0] != (uint8_t)got || dg.data[1199] != (uint8_t)got)
                bad++;
            if (dg.meta->ecn == FASTUDP_ECN_ECT0) ecn++;
            got++;
        }
    }
    CHECK(got == 100 && bad == 0, "%zu received, %zu wrong", got, bad);
    fastudp_capabilities caps;
    fastudp_socket_capabilities(rx, &caps);
    CHECK(!caps.ecn || ecn == 100, "ECN marks %zu", ecn);
    fastudp_stats st;
    fastudp_socket_stats(tx, &st);
    fastudp_socket_capabilities(tx, &caps);
    CHECK(caps.max_gso_segments <= 1 || st.send_messages < 100, "trains: %llu messages",
          (unsigned long long)st.send_messages);
    fastudp_coalescer_free(c);
    fastudp_recv_batch_free(b);
    fastudp_socket_free(rx);
    fastudp_socket_free(tx);
}

static void test_icmp_error_queue(void) {
    /* A port where nothing listens: the kernel answers port unreachable. */
    int probe = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in closed = v4("127.0.0.1", 0);
    bind(probe, (struct sockaddr *)&closed, sizeof closed);
    socklen_t len = sizeof closed;
    getsockname(probe, (struct sockaddr *)&closed, &len);
    close(probe);
    fastudp_socket *tx = bind_v4(NULL);
    fastudp_transmit t = {.destination = (struct sockaddr *)&closed,
                          .destination_len = sizeof closed,
                          .contents = (const uint8_t *)"hello",
                          .contents_len = 5};
    fastudp_sent sent;
    OK(fastudp_send(tx, &t, 1, &sent));
    wait_readable(tx);
    fastudp_socket_error e;
    bool got = false;
    OK(fastudp_recv_error(tx, &e, &got));
    CHECK(got, "an error came");
    if (got) {
        CHECK(e.kind == FASTUDP_SOCKET_ERROR_UNREACHABLE, "kind %u", e.kind);
        CHECK(e.reason == FASTUDP_UNREACHABLE_PORT, "reason %u", e.reason);
        CHECK(e.error_number == ECONNREFUSED, "errno %d", e.error_number);
        CHECK(e.destination_len == sizeof closed &&
                  ((struct sockaddr_in *)&e.destination)->sin_port == closed.sin_port,
              "destination");
        CHECK(strstr(e.description, "port unreachable") != NULL, "%s", e.description);
    }
    OK(fastudp_recv_error(tx, &e, &got));
    CHECK(!got, "one error only");
    fastudp_socket_free(tx);
}

static void test_wrapped_descriptor_and_gso_fallback(void) {
    /* The caller's own socket, borrowed. */
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = v4("127.0.0.1", 0);
    bind(fd, (struct sockaddr *)&a, sizeof a);
    fastudp_socket *tx;
    OK(fastudp_socket_from_fd(fd, 0, NULL, &tx));
    int got_fd = -1;
    OK(fastudp_socket_fd(tx, &got_fd));
    CHECK(got_fd == fd, "fd %d", got_fd);
    fastudp_socket *rx = bind_v4(NULL);
    struct sockaddr_in to = local_of(rx);
    fastudp_capabilities caps;
    fastudp_socket_capabilities(tx, &caps);
    if (caps.max_gso_segments > 1) {
        /* SO_NO_CHECK: the kernel refuses GSO (EINVAL); the train goes one
         * datagram at a time and the fallback is recorded. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_NO_CHECK, &one, sizeof one);
        static uint8_t buf[10 * 500];
        memset(buf, 0x5a, sizeof buf);
        fastudp_transmit t = {.destination = (struct sockaddr *)&to,
                              .destination_len = sizeof to,
                              .contents = buf,
                              .contents_len = sizeof buf,
                              .segment_size = 500};
        fastudp_sent sent;
        OK(fastudp_send(tx, &t, 1, &sent));
        CHECK(sent.transmits == 1, "the train went out");
        fastudp_stats st;
        OK(fastudp_socket_stats(tx, &st));
        CHECK(st.fallbacks == 1 && st.resent_unsegmented == 10, "fallbacks %zu, resent %llu",
              st.fallbacks, (unsigned long long)st.resent_unsegmented);
        fastudp_fallback_event ev;
        OK(fastudp_socket_fallback(tx, 0, &ev));
        CHECK(ev.feature == FASTUDP_FEATURE_GSO && ev.error_number == EINVAL,
              "feature %u errno %d", ev.feature, ev.error_number);
        CHECK(strlen(ev.reason) > 0, "a reason");
        size_t now;
        OK(fastudp_socket_max_gso_segments(tx, &now));
        CHECK(now == 1, "GSO off for now: %zu", now);
    }
    OK(fastudp_socket_free(tx));
    /* Borrowed: still open, still the caller's. */
    CHECK(fcntl(fd, F_GETFD) >= 0, "borrowed descriptor still open");
    /* Owned: closed by free. */
    OK(fastudp_socket_from_fd(fd, FASTUDP_FD_OWNED, NULL, &tx));
    OK(fastudp_socket_free(tx));
    CHECK(fcntl(fd, F_GETFD) < 0 && errno == EBADF, "owned descriptor closed");
    /* Not open, not a socket, unknown flags. */
    CHECK(fastudp_socket_from_fd(fd, 0, NULL, &tx) == FASTUDP_ERR_IO, "closed fd");
    fastudp_error_info info;
    fastudp_last_error(&info);
    CHECK(info.error_number == EBADF, "EBADF: %d", info.error_number);
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    fastudp_result r = fastudp_socket_from_fd(p[0], 0, NULL, &tx);
    CHECK(r == FASTUDP_ERR_SETUP, "a pipe: %d (%s)", r, last_message());
    CHECK(fastudp_socket_from_fd(p[0], 0x80, NULL, &tx) == FASTUDP_ERR_INVALID, "flags");
    CHECK(fastudp_socket_from_fd(-1, 0, NULL, &tx) == FASTUDP_ERR_INVALID, "fd -1");
    close(p[0]);
    close(p[1]);
    fastudp_socket_free(rx);
}

#ifdef FASTUDP_TEST_HOOKS
static void test_panic_becomes_an_error_code(void) {
    fastudp_socket *s = bind_v4(NULL);
    struct sockaddr_in to = local_of(s);
    fastudp_transmit t = {.destination = (struct sockaddr *)&to,
                          .destination_len = sizeof to,
                          .contents = (const uint8_t *)"x",
                          .contents_len = 1};
    fastudp_sent sent;
    OK(fastudp_test_panic_next());
    CHECK(fastudp_send(s, &t, 1, &sent) == FASTUDP_ERR_PANIC, "send panicked");
    CHECK(strstr(last_message(), "fastudp_send: internal error") != NULL &&
              strstr(last_msg, "panic requested by fastudp_test_panic_next") != NULL,
          "%s", last_msg);
    fastudp_error_info info;
    OK(fastudp_last_error(&info));
    CHECK(info.code == FASTUDP_ERR_PANIC, "code %d", info.code);
    /* The library keeps working. */
    OK(fastudp_send(s, &t, 1, &sent));
    CHECK(sent.transmits == 1, "sent after the panic");
    fastudp_recv_batch *b;
    OK(fastudp_test_panic_next());
    CHECK(fastudp_recv_batch_new(4, 0, &b) == FASTUDP_ERR_PANIC, "batch_new panicked");
    OK(fastudp_recv_batch_new(4, 0, &b));
    size_t n;
    OK(fastudp_recv(s, b, &n));
    CHECK(n == 1, "the datagram sent after the panic arrived");
    fastudp_recv_batch_free(b);
    fastudp_socket_free(s);
}
#endif

int main(void) {
    test_version_and_names();
    test_null_and_lengths();
    test_send_errors_name_the_transmit();
    test_gso_train_arrives_as_datagrams();
    test_coalescer();
    test_icmp_error_queue();
    test_wrapped_descriptor_and_gso_fallback();
#ifdef FASTUDP_TEST_HOOKS
    test_panic_becomes_an_error_code();
    printf("panic hook: tested\n");
#else
    printf("panic hook: not in this build (FASTUDP_TEST_HOOKS undefined)\n");
#endif
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
