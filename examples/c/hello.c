/* The smallest complete libfastudp program: two sockets on loopback, one
 * GSO train of four datagrams out, every datagram in and checked.
 *
 * Build and run it as the README shows (scripts/readme-c.sh runs exactly
 * that):
 *
 *   scripts/capi.sh install --prefix "$HOME/.local"
 *   export PKG_CONFIG_PATH="$HOME/.local/lib/pkgconfig"
 *   cc -std=c11 -Wall -o hello examples/c/hello.c $(pkg-config --cflags --libs fastudp) \
 *      -Wl,-rpath,"$(pkg-config --variable=libdir fastudp)"
 *   ./hello
 */
#include <fastudp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define SEGMENT 1200
#define DATAGRAMS 4

/* Prints what went wrong: the code's name and the library's sentence. */
static int fail(const char *what, fastudp_result r) {
    char msg[256] = "";
    fastudp_last_error_message(msg, sizeof msg, NULL); /* names the call and why */
    fprintf(stderr, "hello: %s: %s: %s\n", what, fastudp_strerror(r), msg);
    return 1;
}

int main(void) {
    /* 127.0.0.1, port 0: the kernel picks a port. */
    struct sockaddr_in any;
    memset(&any, 0, sizeof any);
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

    fastudp_socket *rx = NULL, *tx = NULL;
    fastudp_result r = fastudp_socket_bind((const struct sockaddr *)&any, sizeof any, NULL, &rx);
    if (r != FASTUDP_OK) return fail("bind the receiver", r);
    r = fastudp_socket_bind((const struct sockaddr *)&any, sizeof any, NULL, &tx);
    if (r != FASTUDP_OK) return fail("bind the sender", r);

    /* Where the receiver is: the port the kernel chose. */
    struct sockaddr_storage to;
    socklen_t to_len = sizeof to;
    r = fastudp_socket_local_addr(rx, &to, &to_len);
    if (r != FASTUDP_OK) return fail("local address", r);

    /* One GSO train: DATAGRAMS datagrams of SEGMENT bytes in one buffer,
     * datagram i filled with the byte 'a' + i; one system call. */
    static unsigned char buf[DATAGRAMS * SEGMENT];
    for (int i = 0; i < DATAGRAMS; i++) memset(buf + i * SEGMENT, 'a' + i, SEGMENT);
    fastudp_transmit t;
    memset(&t, 0, sizeof t);
    t.destination = (const struct sockaddr *)&to;
    t.destination_len = to_len;
    t.contents = buf;
    t.contents_len = sizeof buf;
    t.segment_size = SEGMENT;
    fastudp_sent sent; /* whole transmits, then datagrams of a train split part-way */
    r = fastudp_send(tx, &t, 1, &sent);
    if (r != FASTUDP_OK) return fail("send", r);
    printf("sent %zu train of %d datagrams\n", sent.transmits, DATAGRAMS);

    /* Receive until every datagram is in; a message may hold a whole GRO
     * train, which the iterator splits. */
    fastudp_recv_batch *batch = NULL;
    r = fastudp_recv_batch_new(32, 0, &batch);
    if (r != FASTUDP_OK) return fail("receive batch", r);
    int received = 0;
    while (received < DATAGRAMS) {
        size_t messages;
        r = fastudp_recv(rx, batch, &messages);
        if (r != FASTUDP_OK) return fail("receive", r);
        fastudp_datagram_iter it;
        r = fastudp_recv_batch_datagrams(batch, &it);
        if (r != FASTUDP_OK) return fail("datagrams", r);
        fastudp_datagram d;
        bool more;
        while (fastudp_datagram_iter_next(&it, &d, &more) == FASTUDP_OK && more) {
            if (d.len != SEGMENT || d.data[0] != 'a' + received || d.data[d.len - 1] != 'a' + received) {
                fprintf(stderr, "hello: datagram %d is not what was sent\n", received);
                return 1;
            }
            printf("datagram %d: %zu bytes of '%c', segment size %zu\n", received, d.len, d.data[0],
                   (size_t)d.meta->stride);
            received++;
        }
    }

    fastudp_recv_batch_free(batch);
    fastudp_socket_free(tx);
    fastudp_socket_free(rx);
    printf("received all %d datagrams\n", received);
    return 0;
}
