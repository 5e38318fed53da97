/* Shared by the fastudp C examples: the datagram format, timing, and
 * error reporting.
 *
 * Datagram format (compatible with `fastudp rx -v`, which reads the first
 * 8 bytes):
 *   bytes 0..8   sequence number, little-endian, from 0
 *   bytes 8..12  the send-buffer slot the datagram was built in, LE
 *   bytes 12..   byte i is (uint8_t)(slot * 31 + i)
 * The sender writes the pattern once per slot and then only stamps the
 * sequence number, as `fastudp tx` does; the receiver can check every
 * byte of every datagram without knowing the sender's buffer layout. */
#ifndef FASTUDP_EXAMPLE_COMMON_H
#define FASTUDP_EXAMPLE_COMMON_H

#include <fastudp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEADER_LEN 12

static inline void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Writes the pattern of `slot` into a datagram of `len` bytes. */
static inline void fill_pattern(uint8_t *d, size_t len, uint32_t slot) {
    if (len >= HEADER_LEN) put_le32(d + 8, slot);
    for (size_t i = HEADER_LEN; i < len; i++) d[i] = (uint8_t)(slot * 31u + i);
}

/* True when every byte after the sequence number is as the sender wrote it. */
static inline int pattern_ok(const uint8_t *d, size_t len) {
    if (len < HEADER_LEN) return 0;
    uint32_t slot = get_le32(d + 8);
    for (size_t i = HEADER_LEN; i < len; i++)
        if (d[i] != (uint8_t)(slot * 31u + i)) return 0;
    return 1;
}

/* The receiver's acknowledgement (receiver -a, sender -a): 24 bytes,
 *   bytes 0..8   "FUDPACK" and a NUL
 *   bytes 8..16  datagrams received so far, LE
 *   bytes 16..24 bytes the sender may have in flight (a quarter of the
 *                receiver's buffer), LE
 * The sender keeps no more than that unacknowledged, so the receive
 * buffer never overflows. */
#define ACK_LEN 24
static const char ACK_MAGIC[8] = "FUDPACK";

static inline double now_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Prints what the last libfastudp call on this thread said, and exits. */
static inline void die(const char *what, fastudp_result r) {
    char msg[512];
    fastudp_last_error_message(msg, sizeof msg, NULL);
    fprintf(stderr, "%s: %s (%s)\n", what, msg[0] ? msg : fastudp_strerror(r),
            fastudp_strerror(r));
    exit(1);
}

/* Parses a non-negative integer option, or exits with status 2. */
static inline unsigned long long parse_num(const char *opt, const char *s,
                                           unsigned long long min,
                                           unsigned long long max) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *s == '-' || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "%s %s: expected a whole number from %llu to %llu\n",
                opt, s, min, max);
        exit(2);
    }
    return v;
}

#endif
