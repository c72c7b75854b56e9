/* The two-party engine's channels: framing, buffering, counters, the handshake and the TCP helpers. */
#include "mpc/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "mpc/net_internal.h"

#define FRAME_MAGIC 0x3253564Bu /* "KVS2" in the little-endian byte order of the wire */
#define HELLO_MAGIC 0x4853564Bu /* "KVSH" */
#define HELLO_BYTES 80
#define HELLO_MAX 4096
#define FLAG_ENCRYPTED 1u
#define READ_CHUNK ((size_t)1 << 16)

static const uint8_t confirm_text[32] = "kvslim two-party key confirm v1";

typedef struct growbuf {
    uint8_t *p;
    size_t n, cap;
} growbuf;

struct kvs_chan {
    int fd, timeout_ms;
    int enc;             /* messages are sealed (set after the hellos of an encrypted channel) */
    int broken;          /* an earlier error left the stream in an unknown state */
    int in_handshake;
    int peer_eof;        /* the peer closed its end (seen while flushing) */
    int sent_since_recv; /* a send happened since the last receive: the next receive is a round */
    int role, peer_role;
    uint64_t send_seq, recv_seq;
    kvs_gcm *seal, *open;
    growbuf out;      /* framed messages not yet written */
    size_t out_done;  /* bytes of out already written */
    kvs_mpc_op out_op; /* op of the last message queued (for error messages) */
    growbuf in;       /* bytes read, not yet consumed */
    size_t in_pos;
    int capture;
    growbuf cap_payload, cap_wire;
    kvs_chan_stats st;
};

/* ---- small helpers ---- */

static int grow(growbuf *b, size_t need)
{
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int append(growbuf *b, const void *src, size_t n)
{
    if (n == 0)
        return 0;
    if (b->n > SIZE_MAX - n || grow(b, b->n + n) != 0)
        return -1;
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static const char *role_name(int role)
{
    return role == 0 ? "party 0" : role == 1 ? "party 1" : role == 2 ? "the dealer" : "an unknown role";
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "250 ms" or "10 s". */
static const char *duration(int ms, char *buf, size_t size)
{
    if (ms >= 1000 && ms % 1000 == 0)
        snprintf(buf, size, "%d s", ms / 1000);
    else
        snprintf(buf, size, "%d ms", ms);
    return buf;
}

/* The GCM failure, naming the link (an argument: role_name of the peer). */
#define AUTH_FAILED_PREFIX "message authentication failed"
#define AUTH_FAILED AUTH_FAILED_PREFIX " on the link to %s (corrupted, replayed or from another sender)"

static const char *closed_hint(const kvs_chan *c)
{
    return c->in_handshake ? " during the handshake (the peer may have rejected our parameters)" : "";
}

/* Fails and marks the channel unusable. */
#define CHAN_FAIL(c, err, code, ...) ((c)->broken = 1, kvs_fail(err, code, __VA_ARGS__))

static kvs_status check_usable(const kvs_chan *c, kvs_error *err)
{
    if (!c)
        return kvs_fail(err, KVS_ERR_ARG, "channel is NULL");
    if (c->broken)
        return kvs_fail(err, KVS_ERR_IO, "channel is unusable after an earlier error");
    return KVS_OK;
}

/* ---- reading and writing the socket ---- */

/* Reads what is available into c->in, making room for at least want more bytes. 1: bytes read,
 * 0: nothing available (EAGAIN), -1: error (errno), -2: the peer closed. */
static int read_some(kvs_chan *c, size_t want)
{
    if (c->in_pos > 0 && c->in_pos == c->in.n) {
        c->in.n = c->in_pos = 0;
    } else if (c->in_pos > 0 && c->in.cap - c->in.n < want) {
        memmove(c->in.p, c->in.p + c->in_pos, c->in.n - c->in_pos);
        c->in.n -= c->in_pos;
        c->in_pos = 0;
    }
    if (want < READ_CHUNK)
        want = READ_CHUNK;
    if (c->in.n > SIZE_MAX - want || grow(&c->in, c->in.n + want) != 0) {
        errno = ENOMEM;
        return -1;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->in.p + c->in.n, c->in.cap - c->in.n, 0);
        if (r > 0) {
            c->in.n += (size_t)r;
            return 1;
        }
        if (r == 0)
            return -2;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno == ECONNRESET)
            return -2;
        return -1;
    }
}

kvs_status kvs_chan_flush(kvs_chan *c, kvs_error *err)
{
    kvs_status st = check_usable(c, err);
    if (st != KVS_OK)
        return st;
    char dbuf[32];
    while (c->out_done < c->out.n) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT | (c->peer_eof ? 0 : POLLIN)};
        int r = poll(&pfd, 1, c->timeout_ms);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return CHAN_FAIL(c, err, KVS_ERR_IO, "poll failed while sending %s: %s",
                             kvs_mpc_op_name(c->out_op), strerror(errno));
        }
        if (r == 0)
            return CHAN_FAIL(c, err, KVS_ERR_IO,
                             "the peer accepted no data for %s while we sent %s (%zu of %zu bytes)",
                             duration(c->timeout_ms, dbuf, sizeof dbuf),
                             kvs_mpc_op_name(c->out_op), c->out_done, c->out.n);
        /* Read what the peer sends meanwhile, so that two sides flushing at each other progress. */
        if (pfd.revents & POLLIN) {
            int rr = read_some(c, READ_CHUNK);
            if (rr == -2)
                c->peer_eof = 1;
            else if (rr < 0)
                return CHAN_FAIL(c, err, KVS_ERR_IO, "cannot read from %s while sending %s: %s",
                                 role_name(c->peer_role), kvs_mpc_op_name(c->out_op), strerror(errno));
        }
        if (pfd.revents & (POLLOUT | POLLERR | POLLHUP)) {
            ssize_t w = send(c->fd, c->out.p + c->out_done, c->out.n - c->out_done, MSG_NOSIGNAL);
            if (w > 0) {
                c->out_done += (size_t)w;
            } else if (w < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
                if (errno == EPIPE || errno == ECONNRESET)
                    return CHAN_FAIL(c, err, KVS_ERR_IO,
                                     "%s closed the connection while we sent %s (%zu of %zu bytes)%s",
                                     role_name(c->peer_role), kvs_mpc_op_name(c->out_op), c->out_done, c->out.n,
                                     closed_hint(c));
                return CHAN_FAIL(c, err, KVS_ERR_IO, "cannot send %s to %s: %s",
                                 kvs_mpc_op_name(c->out_op), role_name(c->peer_role), strerror(errno));
            }
        }
    }
    c->out.n = c->out_done = 0;
    return KVS_OK;
}

/* Waits until c->in holds at least want unconsumed bytes (of a frame of total bytes). */
static kvs_status need(kvs_chan *c, size_t want, size_t total, kvs_mpc_op op, kvs_error *err)
{
    char dbuf[32];
    while (c->in.n - c->in_pos < want) {
        size_t have = c->in.n - c->in_pos;
        int rr = c->peer_eof ? -2 : read_some(c, want - have);
        if (rr == 1)
            continue;
        if (rr == -2)
            return CHAN_FAIL(c, err, KVS_ERR_IO,
                             "%s closed the connection while we waited for %s (%zu of %zu bytes)%s",
                             role_name(c->peer_role), kvs_mpc_op_name(op), have, total, closed_hint(c));
        if (rr < 0)
            return CHAN_FAIL(c, err, errno == ENOMEM ? KVS_ERR_NOMEM : KVS_ERR_IO,
                             "cannot read %s from the peer: %s", kvs_mpc_op_name(op),
                             strerror(errno));
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = poll(&pfd, 1, c->timeout_ms);
        if (r < 0 && errno != EINTR)
            return CHAN_FAIL(c, err, KVS_ERR_IO, "poll failed while waiting for %s: %s",
                             kvs_mpc_op_name(op), strerror(errno));
        if (r == 0) {
            if (have == 0)
                return CHAN_FAIL(c, err, KVS_ERR_IO,
                                 "no message from the peer within %s while waiting for %s",
                                 duration(c->timeout_ms, dbuf, sizeof dbuf), kvs_mpc_op_name(op));
            return CHAN_FAIL(c, err, KVS_ERR_IO,
                             "the peer stalled for %s in the middle of a message while we waited "
                             "for %s (%zu of %zu bytes)",
                             duration(c->timeout_ms, dbuf, sizeof dbuf), kvs_mpc_op_name(op), have,
                             total);
        }
    }
    return KVS_OK;
}

/* ---- messages ---- */

kvs_status kvs_chan_send(kvs_chan *c, kvs_mpc_op op, const void *buf, size_t n, kvs_error *err)
{
    kvs_status st = check_usable(c, err);
    if (st != KVS_OK)
        return st;
    if ((int)op < 0 || op >= KVS_OP_N)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_send: unknown op %d", (int)op);
    if (n > KVS_CHAN_MAX_PAYLOAD)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_send: a %s message of %zu bytes exceeds the "
                        "limit of %zu", kvs_mpc_op_name(op), n, KVS_CHAN_MAX_PAYLOAD);
    if (n > 0 && !buf)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_send: buffer is NULL");
    if (c->send_seq == UINT64_MAX)
        return CHAN_FAIL(c, err, KVS_ERR_IO, "message counter exhausted: open a new channel");
    const size_t tag = c->enc ? KVS_CHAN_TAG_BYTES : 0, frame = KVS_CHAN_HEADER_BYTES + n + tag;
    if (c->out.n > SIZE_MAX - frame || grow(&c->out, c->out.n + frame) != 0)
        return kvs_fail(err, KVS_ERR_NOMEM, "cannot buffer a %s message of %zu bytes",
                        kvs_mpc_op_name(op), n);
    uint8_t *h = c->out.p + c->out.n;
    put32(h, FRAME_MAGIC);
    put16(h + 4, (uint16_t)op);
    put16(h + 6, c->enc ? FLAG_ENCRYPTED : 0);
    put32(h + 8, (uint32_t)n);
    put64(h + 12, c->send_seq);
    uint8_t *body = h + KVS_CHAN_HEADER_BYTES;
    if (c->enc) {
        if (kvs_gcm_seal(c->seal, c->send_seq, h, KVS_CHAN_HEADER_BYTES, buf, n, body, body + n) != 0)
            return CHAN_FAIL(c, err, KVS_ERR_IO, "AES-GCM encryption of a %s message failed (OpenSSL)",
                             kvs_mpc_op_name(op));
    } else if (n > 0) {
        memcpy(body, buf, n);
    }
    c->out.n += frame;
    c->out_op = op;
    c->send_seq++;
    c->sent_since_recv = 1;
    c->st.sent_payload[op] += n;
    c->st.sent_wire[op] += frame;
    c->st.msgs_sent[op]++;
    return KVS_OK;
}

/* Receives a message tagged op of n_min..n_max bytes into buf; its length in *len. */
static kvs_status recv_msg(kvs_chan *c, kvs_mpc_op op, void *buf, size_t n_min, size_t n_max,
                           size_t *len, kvs_error *err)
{
    kvs_status st = kvs_chan_flush(c, err);
    if (st != KVS_OK)
        return st;
    if (c->sent_since_recv) {
        c->st.rounds[op]++;
        c->sent_since_recv = 0;
    }
    const size_t tag = c->enc ? KVS_CHAN_TAG_BYTES : 0;
    st = need(c, KVS_CHAN_HEADER_BYTES, KVS_CHAN_HEADER_BYTES + n_max + tag, op, err);
    if (st != KVS_OK)
        return st;
    const uint8_t *h = c->in.p + c->in_pos;
    const uint32_t magic = get32(h), flags = get16(h + 6), n32 = get32(h + 8);
    const unsigned got_op = get16(h + 4);
    const uint64_t seq = get64(h + 12);
    if (magic != FRAME_MAGIC || n32 > KVS_CHAN_MAX_PAYLOAD || (flags & ~FLAG_ENCRYPTED) != 0 ||
        got_op >= KVS_OP_N)
        return CHAN_FAIL(c, err, KVS_ERR_FORMAT,
                         "malformed message header: not a kvslim peer or a corrupted stream");
    if (c->enc && (seq != c->recv_seq || !(flags & FLAG_ENCRYPTED)))
        return CHAN_FAIL(c, err, KVS_ERR_FORMAT, AUTH_FAILED, role_name(c->peer_role));
    if (!c->enc && (flags & FLAG_ENCRYPTED))
        return CHAN_FAIL(c, err, KVS_ERR_FORMAT,
                         "the peer sent an encrypted message on a plain channel");
    if (!c->enc && seq != c->recv_seq)
        return CHAN_FAIL(c, err, KVS_ERR_FORMAT,
                         "message out of sequence: expected number %llu, the peer sent %llu "
                         "(a replayed, dropped or reordered message)",
                         (unsigned long long)c->recv_seq, (unsigned long long)seq);
    const size_t n = n32;
    if (got_op != (unsigned)op || n < n_min || n > n_max) {
        if (n_min == n_max)
            return CHAN_FAIL(c, err, KVS_ERR_FORMAT,
                             "expected a %s message of %zu bytes, the peer sent a %s message of "
                             "%zu bytes", kvs_mpc_op_name(op), n_min,
                             kvs_mpc_op_name((kvs_mpc_op)got_op), n);
        return CHAN_FAIL(c, err, KVS_ERR_FORMAT,
                         "expected a %s message of %zu to %zu bytes, the peer sent a %s message "
                         "of %zu bytes", kvs_mpc_op_name(op), n_min, n_max,
                         kvs_mpc_op_name((kvs_mpc_op)got_op), n);
    }
    const size_t frame = KVS_CHAN_HEADER_BYTES + n + tag;
    st = need(c, frame, frame, op, err);
    if (st != KVS_OK)
        return st;
    h = c->in.p + c->in_pos; /* need() may have moved the buffer */
    const uint8_t *body = h + KVS_CHAN_HEADER_BYTES;
    uint8_t dummy = 0; /* the target of an empty message: never read, but initialised */
    uint8_t *dst = n > 0 ? (uint8_t *)buf : &dummy;
    if (c->enc) {
        if (kvs_gcm_open(c->open, c->recv_seq, h, KVS_CHAN_HEADER_BYTES, body, n, dst, body + n) != 0) {
            if (n > 0)
                OPENSSL_cleanse(buf, n);
            return CHAN_FAIL(c, err, KVS_ERR_FORMAT, AUTH_FAILED, role_name(c->peer_role));
        }
    } else if (n > 0) {
        memcpy(buf, body, n);
    }
    if (c->capture && (append(&c->cap_payload, dst, n) != 0 || append(&c->cap_wire, h, frame) != 0))
        return CHAN_FAIL(c, err, KVS_ERR_NOMEM, "cannot grow the transcript capture");
    c->in_pos += frame;
    c->recv_seq++;
    c->st.recv_payload[op] += n;
    c->st.recv_wire[op] += frame;
    c->st.msgs_recv[op]++;
    *len = n;
    return KVS_OK;
}

kvs_status kvs_chan_recv(kvs_chan *c, kvs_mpc_op op, void *buf, size_t n, kvs_error *err)
{
    kvs_status st = check_usable(c, err);
    if (st != KVS_OK)
        return st;
    if ((int)op < 0 || op >= KVS_OP_N)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_recv: unknown op %d", (int)op);
    if (n > KVS_CHAN_MAX_PAYLOAD)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_recv: %zu bytes exceed the limit of %zu", n,
                        KVS_CHAN_MAX_PAYLOAD);
    if (n > 0 && !buf)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chan_recv: buffer is NULL");
    size_t len;
    return recv_msg(c, op, buf, n, n, &len, err);
}

/* ---- the handshake ---- */

static void hello_encode(const kvs_chan_params *p, const uint8_t nonce[32], uint8_t h[HELLO_BYTES])
{
    memset(h, 0, HELLO_BYTES);
    put32(h, HELLO_MAGIC);
    put32(h + 4, p->version);
    h[8] = (uint8_t)p->role;
    h[9] = (uint8_t)p->peer_role;
    h[10] = (uint8_t)p->ring_bits;
    h[11] = (uint8_t)p->frac_bits;
    h[12] = p->insecure_plain ? 0 : 1;
    memcpy(h + 16, p->model_hash, 32);
    memcpy(h + 48, nonce, 32);
}

static void hex8(const uint8_t *b, char out[17])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Compares the peer's hello (len bytes) with our parameters. */
static kvs_status hello_check(const kvs_chan_params *p, const uint8_t *h, size_t len, kvs_error *err)
{
    if (get32(h) != HELLO_MAGIC)
        return kvs_fail(err, KVS_ERR_FORMAT, "malformed handshake: the peer is not a kvslim "
                        "two-party engine");
    const uint32_t version = get32(h + 4);
    if (version != p->version)
        return kvs_fail(err, KVS_ERR_FORMAT, "peer speaks protocol version %u, we speak %u",
                        version, p->version);
    if (len != HELLO_BYTES)
        return kvs_fail(err, KVS_ERR_FORMAT, "malformed handshake: a hello of %zu bytes, "
                        "expected %d", len, HELLO_BYTES);
    if (h[8] != p->peer_role)
        return kvs_fail(err, KVS_ERR_FORMAT, "peer is %s, we expected %s", role_name(h[8]),
                        role_name(p->peer_role));
    if (h[9] != p->role)
        return kvs_fail(err, KVS_ERR_FORMAT, "peer expects to talk to %s, we are %s",
                        role_name(h[9]), role_name(p->role));
    if (h[12] > 1)
        return kvs_fail(err, KVS_ERR_FORMAT, "malformed handshake: encryption flag %u", h[12]);
    if (h[12] && p->insecure_plain)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "peer expects an encrypted channel, we run --insecure-plain");
    if (!h[12] && !p->insecure_plain)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "peer runs --insecure-plain, we expect an encrypted channel");
    if (h[10] != p->ring_bits)
        return kvs_fail(err, KVS_ERR_FORMAT, "peer computes in a %u-bit ring, we use %d bits",
                        h[10], p->ring_bits);
    if (h[11] != p->frac_bits)
        return kvs_fail(err, KVS_ERR_FORMAT, "peer uses %u fraction bits, we use %d", h[11],
                        p->frac_bits);
    if (memcmp(h + 16, p->model_hash, 32) != 0) {
        char theirs[17], ours[17];
        hex8(h + 16, theirs);
        hex8(p->model_hash, ours);
        return kvs_fail(err, KVS_ERR_FORMAT, "peer's model hash differs: the two parties loaded "
                        "different models (peer %s..., we %s...)", theirs, ours);
    }
    return KVS_OK;
}

/* HKDF info: a direction label and the hash of both hellos. */
static int derive(const kvs_chan_params *p, const uint8_t salt[64], const uint8_t transcript[32],
                  int from, int to, uint8_t key[32])
{
    uint8_t info[64 + 32];
    int k = snprintf((char *)info, 64, "kvslim-mpc-chan v1 key %d->%d", from, to);
    memcpy(info + k, transcript, 32);
    return kvs_net_hkdf_sha256(p->psk, 32, salt, 64, info, (size_t)k + 32, key);
}

static kvs_status handshake(kvs_chan *c, const kvs_chan_params *p, kvs_error *err)
{
    uint8_t nonce[32], mine[HELLO_BYTES], theirs[HELLO_MAX];
    size_t len = 0;
    if (kvs_net_getrandom(nonce, sizeof nonce) != 0)
        return kvs_fail(err, KVS_ERR_IO, "cannot draw the handshake nonce: %s", strerror(errno));
    hello_encode(p, nonce, mine);
    kvs_status st = kvs_chan_send(c, KVS_OP_HANDSHAKE, mine, sizeof mine, err);
    if (st == KVS_OK)
        st = recv_msg(c, KVS_OP_HANDSHAKE, theirs, 8, HELLO_MAX, &len, err);
    if (st == KVS_OK)
        st = hello_check(p, theirs, len, err);
    if (st != KVS_OK || p->insecure_plain)
        return st;

    /* Order by role, so both ends compute the same salt and transcript. */
    const int lo_is_me = p->role < p->peer_role;
    const uint8_t *hlo = lo_is_me ? mine : theirs, *hhi = lo_is_me ? theirs : mine;
    uint8_t salt[64], transcript[32], ksend[32], krecv[32];
    memcpy(salt, hlo + 48, 32);
    memcpy(salt + 32, hhi + 48, 32);
    int ok = kvs_net_sha256(hlo, HELLO_BYTES, hhi, HELLO_BYTES, transcript) == 0 &&
             derive(p, salt, transcript, p->role, p->peer_role, ksend) == 0 &&
             derive(p, salt, transcript, p->peer_role, p->role, krecv) == 0;
    if (ok) {
        c->seal = kvs_gcm_new(ksend, 1);
        c->open = kvs_gcm_new(krecv, 0);
        ok = c->seal && c->open;
    }
    OPENSSL_cleanse(ksend, sizeof ksend);
    OPENSSL_cleanse(krecv, sizeof krecv);
    if (!ok)
        return kvs_fail(err, KVS_ERR_IO, "key derivation failed (OpenSSL HKDF or AES-GCM)");
    c->enc = 1;

    uint8_t confirm[32];
    st = kvs_chan_send(c, KVS_OP_HANDSHAKE, confirm_text, sizeof confirm_text, err);
    if (st == KVS_OK)
        st = recv_msg(c, KVS_OP_HANDSHAKE, confirm, sizeof confirm, sizeof confirm, &len, err);
    if (st == KVS_OK && memcmp(confirm, confirm_text, sizeof confirm) != 0)
        st = kvs_fail(err, KVS_ERR_FORMAT, AUTH_FAILED, role_name(c->peer_role));
    if (st != KVS_OK && err && strncmp(err->msg, AUTH_FAILED_PREFIX, strlen(AUTH_FAILED_PREFIX)) == 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "handshake failed: the peer's key confirmation did not authenticate (the "
                        "two ends hold different pre-shared keys, or the handshake was altered in "
                        "transit)");
    return st;
}

static void chan_free(kvs_chan *c)
{
    if (c->fd >= 0)
        close(c->fd);
    kvs_gcm_free(c->seal);
    kvs_gcm_free(c->open);
    free(c->out.p);
    free(c->in.p);
    free(c->cap_payload.p);
    free(c->cap_wire.p);
    free(c);
}

kvs_status kvs_chan_open(int fd, const kvs_chan_params *p, kvs_chan **out, kvs_error *err)
{
    kvs_status st = KVS_OK;
    if (out)
        *out = NULL;
    if (!p || !out)
        st = kvs_fail(err, KVS_ERR_ARG, "kvs_chan_open: params or out is NULL");
    else if (fd < 0)
        st = kvs_fail(err, KVS_ERR_ARG, "kvs_chan_open: invalid socket %d", fd);
    else if (p->timeout_ms <= 0)
        st = kvs_fail(err, KVS_ERR_ARG, "channel timeout must be > 0 ms, got %d", p->timeout_ms);
    else if (p->role < 0 || p->role > 2 || p->peer_role < 0 || p->peer_role > 2 ||
             p->role == p->peer_role)
        st = kvs_fail(err, KVS_ERR_ARG, "invalid channel roles %d and %d (0 party 0, 1 party 1, "
                      "2 dealer, distinct)", p->role, p->peer_role);
    else if (p->ring_bits < 1 || p->ring_bits > 64 || p->frac_bits < 0 ||
             p->frac_bits >= p->ring_bits)
        st = kvs_fail(err, KVS_ERR_ARG, "invalid ring of %d bits with %d fraction bits",
                      p->ring_bits, p->frac_bits);
    else if (!p->insecure_plain && !p->psk)
        st = kvs_fail(err, KVS_ERR_ARG, "an encrypted channel needs a 32-byte pre-shared key "
                      "(or --insecure-plain)");
    if (st != KVS_OK) {
        if (fd >= 0)
            close(fd);
        return st;
    }
    kvs_chan *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return kvs_fail(err, KVS_ERR_NOMEM, "cannot allocate a channel");
    }
    c->fd = fd;
    c->timeout_ms = p->timeout_ms;
    c->role = p->role;
    c->peer_role = p->peer_role;
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly off TCP */
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        st = kvs_fail(err, KVS_ERR_IO, "cannot make the socket non-blocking: %s", strerror(errno));
        chan_free(c);
        return st;
    }
    c->in_handshake = 1;
    st = handshake(c, p, err);
    c->in_handshake = 0;
    if (st != KVS_OK) {
        chan_free(c);
        return st;
    }
    *out = c;
    return KVS_OK;
}

void kvs_chan_close(kvs_chan *c)
{
    if (!c)
        return;
    if (!c->broken && c->out_done < c->out.n)
        (void)kvs_chan_flush(c, NULL);
    chan_free(c);
}

/* ---- counters and capture ---- */

void kvs_chan_stats_get(const kvs_chan *c, kvs_chan_stats *s)
{
    if (!s)
        return;
    if (!c)
        memset(s, 0, sizeof *s);
    else
        *s = c->st;
}

void kvs_chan_stats_reset(kvs_chan *c)
{
    if (c)
        memset(&c->st, 0, sizeof c->st);
}

size_t kvs_chan_overhead(const kvs_chan *c)
{
    return KVS_CHAN_HEADER_BYTES + (c && c->enc ? KVS_CHAN_TAG_BYTES : 0);
}

void kvs_chan_capture(kvs_chan *c, int on)
{
    if (!c)
        return;
    if (on) {
        c->cap_payload.n = c->cap_wire.n = 0;
    }
    c->capture = on != 0;
}

const uint8_t *kvs_chan_captured(const kvs_chan *c, int wire, size_t *n)
{
    const growbuf *b = !c ? NULL : wire ? &c->cap_wire : &c->cap_payload;
    if (n)
        *n = b ? b->n : 0;
    return b ? b->p : NULL;
}

/* ---- TCP ---- */

static void set_nodelay(int fd)
{
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* strerror with a lower-case first letter, for "cannot reach ...: connection refused". */
static const char *lower_strerror(int e, char *buf, size_t size)
{
    snprintf(buf, size, "%s", strerror(e));
    if (buf[0] >= 'A' && buf[0] <= 'Z')
        buf[0] = (char)(buf[0] - 'A' + 'a');
    return buf;
}

static int sock_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

kvs_status kvs_net_listen(const char *host, int port, int *fd, int *bound_port, kvs_error *err)
{
    if (!fd)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_net_listen: fd is NULL");
    *fd = -1;
    if (port < 0 || port > 65535)
        return kvs_fail(err, KVS_ERR_ARG, "port %d is out of range 0-65535", port);
    const char *h = host && *host ? host : NULL;
    char service[16], ebuf[128];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(h, service, &hints, &res);
    if (gai != 0)
        return kvs_fail(err, KVS_ERR_IO, "cannot resolve %s: %s", h ? h : "(any)", gai_strerror(gai));
    int last = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            last = errno;
            continue;
        }
        const int one = 1;
        (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, a->ai_addr, a->ai_addrlen) == 0 && listen(s, 8) == 0) {
            freeaddrinfo(res);
            *fd = s;
            if (bound_port)
                *bound_port = sock_port(s);
            return KVS_OK;
        }
        last = errno;
        close(s);
    }
    freeaddrinfo(res);
    if (last == EADDRINUSE)
        return kvs_fail(err, KVS_ERR_IO, "port %d is in use", port);
    return kvs_fail(err, KVS_ERR_IO, "cannot listen on %s:%d: %s", h ? h : "*", port,
                    lower_strerror(last, ebuf, sizeof ebuf));
}

kvs_status kvs_net_accept(int listen_fd, int timeout_ms, int *fd, kvs_error *err)
{
    if (!fd)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_net_accept: fd is NULL");
    *fd = -1;
    if (timeout_ms <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "accept timeout must be > 0 ms, got %d", timeout_ms);
    const int64_t deadline = now_ms() + timeout_ms;
    char dbuf[32], ebuf[128];
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left < 0)
            left = 0;
        struct pollfd pfd = {.fd = listen_fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kvs_fail(err, KVS_ERR_IO, "cannot wait for a peer: %s",
                            lower_strerror(errno, ebuf, sizeof ebuf));
        if (r == 0)
            return kvs_fail(err, KVS_ERR_IO, "no peer connected to port %d within %s",
                            sock_port(listen_fd), duration(timeout_ms, dbuf, sizeof dbuf));
        int s = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0) {
            set_nodelay(s);
            *fd = s;
            return KVS_OK;
        }
        if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED)
            return kvs_fail(err, KVS_ERR_IO, "cannot accept a peer on port %d: %s",
                            sock_port(listen_fd), lower_strerror(errno, ebuf, sizeof ebuf));
    }
}

/* One non-blocking connect attempt of at most left ms: the socket, or -1 with errno. */
static int connect_once(const struct addrinfo *a, int64_t left)
{
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0)
        return -1;
    if (connect(s, a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            close(s);
            errno = e;
            return -1;
        }
        const int64_t deadline = now_ms() + left;
        int r;
        struct pollfd pfd = {.fd = s, .events = POLLOUT};
        do {
            int64_t l = deadline - now_ms();
            r = poll(&pfd, 1, l < 0 ? 0 : (int)l);
        } while (r < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r <= 0 || getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
            int e = r == 0 ? ETIMEDOUT : r < 0 ? errno : soerr ? soerr : errno;
            close(s);
            errno = e;
            return -1;
        }
    }
    const int fl = fcntl(s, F_GETFL);
    if (fl < 0 || fcntl(s, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    set_nodelay(s);
    return s;
}

kvs_status kvs_net_connect(const char *host, int port, int timeout_ms, int *fd, kvs_error *err)
{
    if (!fd)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_net_connect: fd is NULL");
    *fd = -1;
    if (!host || !*host)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_net_connect: no host");
    if (port <= 0 || port > 65535)
        return kvs_fail(err, KVS_ERR_ARG, "port %d is out of range 1-65535", port);
    if (timeout_ms <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "connect timeout must be > 0 ms, got %d", timeout_ms);
    char service[16], ebuf[128];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0)
        return kvs_fail(err, KVS_ERR_IO, "cannot reach %s:%d: %s", host, port, gai_strerror(gai));
    const int64_t deadline = now_ms() + timeout_ms;
    int last = ETIMEDOUT;
    for (;;) {
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int64_t left = deadline - now_ms();
            if (left <= 0)
                break;
            int s = connect_once(a, left);
            if (s >= 0) {
                freeaddrinfo(res);
                *fd = s;
                return KVS_OK;
            }
            last = errno;
        }
        int64_t left = deadline - now_ms();
        if (left <= 0)
            break;
        /* The peer may not be listening yet: retry shortly. */
        struct timespec ts = {0, (long)(left < 50 ? left : 50) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    freeaddrinfo(res);
    return kvs_fail(err, KVS_ERR_IO, "cannot reach %s:%d: %s", host, port,
                    lower_strerror(last, ebuf, sizeof ebuf));
}
