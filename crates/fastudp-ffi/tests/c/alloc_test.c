/* Sizes out of range and allocation failures come back from libfastudp
 * as error codes, never as an abort or a panic, and print nothing: a
 * library must not write to its host's stderr. Run by tests/c.rs without
 * sanitizers (they reserve address space of their own), which checks that
 * stderr stays empty.
 *
 * Prints "N passed, M failed" at the end; exits 1 when a check failed. */
#include <fastudp.h>

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
    if (r == FASTUDP_OK)
        fastudp_coalescer_free(c);
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
