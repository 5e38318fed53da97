/* Sizes out of range and allocation failures come back from libfastudp
 * as error codes, never as an abort or a panic, and print nothing: a
 * library must not write to its host's stderr (nor does a panic, which
 * the test hooks provoke). Run by tests/it/c.rs without
 * sanitizers (they reserve address space of their own), which checks that
 * stderr stays empty.
 *
 * Prints "N passed, M failed" at the end; exits 1 when a check failed. */
#include <fastudp.h>

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static int passed, failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            passed++;                                                         \
        } else {                                                              \
            failed++;                                                         \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
        }                                                                     \
    } while (0)

static const char *msg(void) {
    static char m[1024];
    m[0] = 0;
    fastudp_last_error_message(m, sizeof m, NULL);
    return m;
}

int main(void) {
    fastudp_coalescer *c = (fastudp_coalescer *)&passed;
    fastudp_recv_batch *b = (fastudp_recv_batch *)&passed;
    fastudp_result r;

    /* Out of range: refused before anything is allocated. */
    r = fastudp_coalescer_new(0, 1ULL << 40, &c);
    CHECK(r == FASTUDP_ERR_INVALID, "coalescer 2^40 trains: %d %s", r, msg());
    CHECK(strstr(msg(), "max_trains") != NULL, "%s", msg());
    r = fastudp_coalescer_new(0, SIZE_MAX, &c);
    CHECK(r == FASTUDP_ERR_INVALID, "coalescer SIZE_MAX trains: %d %s", r, msg());
    r = fastudp_coalescer_new(SIZE_MAX, 0, &c);
    CHECK(r == FASTUDP_ERR_INVALID, "coalescer SIZE_MAX mtu: %d %s", r, msg());
    CHECK(c == (fastudp_coalescer *)&passed, "no output on error");
    r = fastudp_recv_batch_new(SIZE_MAX, 0, &b);
    CHECK(r == FASTUDP_ERR_INVALID, "batch SIZE_MAX messages: %d %s", r, msg());
    r = fastudp_recv_batch_new(1, SIZE_MAX, &b);
    CHECK(r == FASTUDP_ERR_INVALID, "batch SIZE_MAX bytes: %d %s", r, msg());
    CHECK(b == (fastudp_recv_batch *)&passed, "no output on error");

    /* Socket buffer sizes are ints to the kernel: a larger one is refused,
     * not cut to its low 32 bits (4 GiB + 5 would have asked for 5). */
    {
        struct sockaddr_in any;
        memset(&any, 0, sizeof any);
        any.sin_family = AF_INET;
        any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fastudp_socket *s = (fastudp_socket *)&passed;
        const size_t sizes[] = {(size_t)INT_MAX + 1, ((size_t)1 << 32) + 5, SIZE_MAX};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            for (int which = 0; which < 2; which++) {
                fastudp_config cfg;
                fastudp_config_init(&cfg);
                if (which)
                    cfg.send_buffer = sizes[i];
                else
                    cfg.recv_buffer = sizes[i];
                const char *name = which ? "send_buffer" : "recv_buffer";
                r = fastudp_socket_bind((struct sockaddr *)&any, sizeof any, &cfg, &s);
                CHECK(r == FASTUDP_ERR_INVALID, "%s %zu: %d %s", name, sizes[i], r, msg());
                CHECK(strstr(msg(), name) != NULL, "%s", msg());
            }
        }
        CHECK(s == (fastudp_socket *)&passed, "no output on error");
    }

    /* A bug that panics inside the library comes back as
     * FASTUDP_ERR_PANIC with the panic's message and place in the last
     * error, and prints nothing either (the harness checks stderr). */
    {
        fastudp_config cfg;
        r = fastudp_test_panic_next();
        CHECK(r == FASTUDP_OK, "arm the panic: %d", r);
        r = fastudp_config_init(&cfg);
        CHECK(r == FASTUDP_ERR_PANIC, "a panic: %d %s", r, msg());
        CHECK(strstr(msg(), "panic requested by fastudp_test_panic_next") != NULL, "%s", msg());
        CHECK(strstr(msg(), "(at ") != NULL && strstr(msg(), "abi.rs:") != NULL, "where: %s",
              msg());
        CHECK(fastudp_config_init(&cfg) == FASTUDP_OK, "the next call works");
    }

    /* The documented maximums, under a memory limit they do not fit: an
     * error code, not an abort. */
    struct rlimit old, lim;
    if (getrlimit(RLIMIT_AS, &old) != 0) {
        printf("FAIL: getrlimit\n");
        return 1;
    }
    lim = old;
    lim.rlim_cur = 256UL << 20;
    if (setrlimit(RLIMIT_AS, &lim) != 0) {
        printf("FAIL: setrlimit\n");
        return 1;
    }
    r = fastudp_recv_batch_new(128, 16 << 20, &b);
    CHECK(r == FASTUDP_ERR_NO_MEMORY, "2 GiB batch under 256 MiB: %d %s", r, msg());
    CHECK(strstr(msg(), "allocate") != NULL, "%s", msg());
    CHECK(b == (fastudp_recv_batch *)&passed, "no output on error");
    r = fastudp_coalescer_new(0, FASTUDP_MAX_COALESCER_TRAINS, &c);
    CHECK(r == FASTUDP_OK, "the largest coalescer: %d %s", r, msg());
    if (r == FASTUDP_OK) {
        /* Its queue may hold 4096 trains of 64 KiB: it runs out of memory
         * first, and says so for the datagram it could not queue. */
        fastudp_socket *s = NULL;
        struct sockaddr_in lo;
        memset(&lo, 0, sizeof lo);
        lo.sin_family = AF_INET;
        lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        r = fastudp_socket_bind((struct sockaddr *)&lo, sizeof lo, NULL, &s);
        CHECK(r == FASTUDP_OK, "bind: %d %s", r, msg());
        static uint8_t d[1472];
        lo.sin_port = htons(9);
        uint64_t n = 0;
        for (; r == FASTUDP_OK && n < 4096 * 64; n++)
            r = fastudp_coalescer_push(c, s, (struct sockaddr *)&lo, sizeof lo, d, sizeof d,
                                       FASTUDP_ECN_NONE, NULL, 0, NULL);
        CHECK(r == FASTUDP_ERR_NO_MEMORY, "push under 256 MiB: %d after %llu: %s", r,
              (unsigned long long)n, msg());
        fastudp_error_info info;
        fastudp_last_error(&info);
        CHECK(info.has_index && info.index == n - 1, "the datagram named: %zu", info.index);
        size_t queued = 0, trains = 0;
        fastudp_coalescer_queued(c, &queued, &trains);
        CHECK(queued == n - 1, "every datagram before it still queued: %zu of %llu", queued,
              (unsigned long long)(n - 1));
        fastudp_coalescer_free(c);
        fastudp_socket_free(s);
    }
    if (setrlimit(RLIMIT_AS, &old) != 0) {
        printf("FAIL: setrlimit back\n");
        return 1;
    }
    /* Within the limits, the same calls work. */
    b = NULL;
    r = fastudp_recv_batch_new(128, 16 << 20, &b);
    CHECK(r == FASTUDP_OK && b != NULL, "2 GiB batch without a limit: %d %s", r, msg());
    fastudp_recv_batch_free(b);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
