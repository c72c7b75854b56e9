/* Fuzzes the two-party engine's message decoding (src/mpc/net.c) with the input as the bytes a
 * broken or malicious peer sends: the handshake (kvs_chan_open: the peer's hello, and with
 * encryption its key confirmation) and then the framing of kvs_chan_recv (header, op, length,
 * sequence number, payload). The peer's end is a socketpair whose writer has sent the input and
 * shut down, so every read ends in an error, never in a wait: the channel's timeout is set far
 * above libFuzzer's -timeout, and a receive that waited instead of failing on the closed peer
 * shows up as a timeout. Errors are expected; a crash, a leak, a hang, or a receive that
 * succeeds with a length other than the one asked for, is a bug.
 *
 * Only a plain channel (--insecure-plain) can be driven past its handshake: an encrypted one
 * needs the peer to answer our random nonce with a key confirmation sealed under the pre-shared
 * key, which the fuzzer cannot forge, so encrypted inputs test the hello and the confirmation's
 * header.
 *
 * Input layout: byte 0 is a set of flags (FL_*); bytes 1-12 are four receives of {u8 op (modulo
 * the number of ops), u16 little-endian length}; the rest is what the peer sends. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mpc/net.h"

#define FL_ENCRYPTED 1u /* the channel expects encryption (the peer's hello must say so too) */
#define FL_CAPTURE 2u   /* transcript capture on (the security tests' path) */
#define FL_SEND 4u      /* a send queued before each receive (flushed by it) */
#define FL_CLOSE 8u     /* the peer closes its end entirely, not just its writing half */
#define N_RECV 4
#define HEAD (1 + 3 * N_RECV)

static const uint8_t PSK[32] = "kvslim fuzz pre-shared key 0123";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEAD)
        return 0;
    const unsigned flags = data[0];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("fuzz_mpc_msg: socketpair");
        abort();
    }
    /* The peer's bytes are queued before the channel opens: without blocking, so an input over
     * the socket's buffer is cut (scripts/fuzz.sh's max_len keeps inputs well under it). */
    const uint8_t *stream = data + HEAD;
    size_t left = size - HEAD;
    while (left > 0) {
        ssize_t w = send(sv[1], stream, left, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            break;
        }
        stream += w;
        left -= (size_t)w;
    }
    if (flags & FL_CLOSE) {
        close(sv[1]);
        sv[1] = -1;
    } else {
        shutdown(sv[1], SHUT_WR);
    }

    kvs_chan_params p = {
        .insecure_plain = !(flags & FL_ENCRYPTED),
        .psk = PSK,
        .timeout_ms = 60000, /* never reached: libFuzzer's -timeout (10 s) reports a wait first */
        .version = 1,
        .ring_bits = 64,
        .frac_bits = 12,
        .role = 0,
        .peer_role = 1,
    };
    memset(p.model_hash, 0x5a, sizeof p.model_hash);
    kvs_error err = {0};
    kvs_chan *c = NULL;
    if (kvs_chan_open(sv[0], &p, &c, &err) == KVS_OK) {
        if (flags & FL_CAPTURE)
            kvs_chan_capture(c, 1);
        uint8_t buf[65535];
        for (int i = 0; i < N_RECV; i++) {
            const uint8_t *r = data + 1 + 3 * i;
            const kvs_mpc_op op = (kvs_mpc_op)(r[0] % KVS_OP_N);
            const size_t n = (size_t)r[1] | (size_t)r[2] << 8;
            if ((flags & FL_SEND) && kvs_chan_send(c, op, r, 3, &err) != KVS_OK)
                break;
            if (kvs_chan_recv(c, op, buf, n, &err) != KVS_OK)
                break;
            kvs_chan_stats s;
            kvs_chan_stats_get(c, &s);
            if (s.recv_payload[op] < n) {
                fprintf(stderr, "fuzz_mpc_msg: received %zu bytes, counted %llu\n", n,
                        (unsigned long long)s.recv_payload[op]);
                abort();
            }
        }
        size_t got;
        const uint8_t *cap = kvs_chan_captured(c, 1, &got);
        if (cap && got) {
            volatile uint8_t sink = cap[got - 1];
            (void)sink;
        }
        kvs_chan_close(c);
    }
    if (sv[1] >= 0)
        close(sv[1]);
    return 0;
}
