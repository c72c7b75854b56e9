/* The two-party transport (src/mpc/net.h): framing, counters, encryption, handshake checks, timeouts, TCP.
 *
 * Each test runs the two ends of a channel in two threads over a socketpair (one over real TCP on
 * 127.0.0.1). The ends only record what they saw; every CHECK runs on the main thread after the
 * join. Wire bytes in the expectations are computed here from the documented frame layout
 * (20-byte header, 16-byte GCM tag), not taken from the implementation. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mpc/net.h"

#define HDR 20
#define TAG 16
#define HELLO_FRAME (HDR + 80)          /* the plain hello */
#define CONFIRM_FRAME (HDR + 32 + TAG)  /* the encrypted key confirmation */

static const uint8_t PSK_A[32] = "0123456789abcdef0123456789abcde";
static const uint8_t PSK_B[32] = "0123456789abcdef0123456789abcdX";
static const uint8_t MARKER[16] = {'S', 'E', 'C', 'R', 'E', 'T', '-', 'S',
                                   'H', 'A', 'R', 'E', '-', '4', '2', '!'};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 131u + seed * 7u + 1u);
}

static int is_filled(const uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (uint8_t)(i * 131u + seed * 7u + 1u))
            return 0;
    return 1;
}

static const void *find(const uint8_t *hay, size_t n, const uint8_t *needle, size_t m)
{
    return hay && n >= m ? memmem(hay, n, needle, m) : NULL;
}

static void le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A frame header written by hand from the documented layout. */
static void header(uint8_t h[HDR], int op, int flags, uint32_t len, uint64_t seq)
{
    memcpy(h, "KVS2", 4);
    le(h + 4, (uint64_t)op, 2);
    le(h + 6, (uint64_t)flags, 2);
    le(h + 8, len, 4);
    le(h + 12, seq, 8);
}

static void send_raw(int fd, const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* ---- two ends in two threads ---- */

typedef struct end end;
typedef void (*body_fn)(end *e, kvs_chan *c);

struct end {
    int fd;
    kvs_chan_params p;
    body_fn body;
    size_t n;          /* a size for the body */
    int *sync;         /* a pipe the two bodies share, when they need one */
    kvs_status open_st; /* kvs_chan_open */
    kvs_error open_err;
    kvs_status st; /* the body's first failure */
    kvs_error err;
    int bad;      /* payload mismatches seen by the body */
    int64_t ms;   /* time the body's failing call took */
    kvs_chan_stats hs, stats; /* counters after the handshake, and at the end of the body */
    size_t overhead;
    int wire_has_marker, payload_has_marker;
    size_t wire_n, payload_n;
    kvs_status again; /* a call after the failure */
    double secs;
};

static kvs_chan_params params(int role, int peer, int plain)
{
    kvs_chan_params p;
    memset(&p, 0, sizeof p);
    p.insecure_plain = plain;
    p.psk = PSK_A;
    p.timeout_ms = 2000;
    p.version = 1;
    p.ring_bits = 64;
    p.frac_bits = 12;
    memset(p.model_hash, 0xab, sizeof p.model_hash);
    p.role = role;
    p.peer_role = peer;
    return p;
}

static void end_init(end *e, int role, int peer, int plain, body_fn body)
{
    memset(e, 0, sizeof *e);
    e->p = params(role, peer, plain);
    e->body = body;
    e->st = e->open_st = KVS_OK;
}

static void *end_main(void *arg)
{
    end *e = arg;
    kvs_chan *c = NULL;
    e->open_st = kvs_chan_open(e->fd, &e->p, &c, &e->open_err);
    if (e->open_st != KVS_OK)
        return NULL;
    kvs_chan_stats_get(c, &e->hs);
    e->overhead = kvs_chan_overhead(c);
    if (e->body)
        e->body(e, c);
    kvs_chan_close(c);
    return NULL;
}

/* Runs a on this thread and b on another, over a socketpair. */
static void run_pair(end *a, end *b)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        CHECK(!"socketpair");
        return;
    }
    a->fd = sv[0];
    b->fd = sv[1];
    pthread_t t;
    pthread_create(&t, NULL, end_main, b);
    end_main(a);
    pthread_join(t, NULL);
}

#define BODY_TRY(e, call)                                                                    \
    do {                                                                                     \
        kvs_status st_ = (call);                                                             \
        if (st_ != KVS_OK) {                                                                 \
            if ((e)->st == KVS_OK)                                                           \
                (e)->st = st_;                                                               \
            return;                                                                          \
        }                                                                                    \
    } while (0)

/* ---- round trips ---- */

static const size_t sizes[] = {0, 1, 1000, 1u << 20};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

static void echo_client(end *e, kvs_chan *c)
{
    uint8_t *buf = malloc(1u << 20), *back = malloc(1u << 20);
    for (size_t i = 0; i < N_SIZES && buf && back; i++) {
        fill(buf, sizes[i], (unsigned)i);
        memset(back, 0, sizes[i]);
        if (kvs_chan_send(c, KVS_OP_INPUT, buf, sizes[i], &e->err) != KVS_OK ||
            kvs_chan_recv(c, KVS_OP_OPEN, back, sizes[i], &e->err) != KVS_OK) {
            e->st = e->err.code;
            break;
        }
        e->bad += !is_filled(back, sizes[i], (unsigned)i + 100);
    }
    free(buf);
    free(back);
}

static void echo_server(end *e, kvs_chan *c)
{
    uint8_t *buf = malloc(1u << 20);
    for (size_t i = 0; i < N_SIZES && buf; i++) {
        memset(buf, 0, sizes[i]);
        if (kvs_chan_recv(c, KVS_OP_INPUT, buf, sizes[i], &e->err) != KVS_OK) {
            e->st = e->err.code;
            break;
        }
        e->bad += !is_filled(buf, sizes[i], (unsigned)i);
        fill(buf, sizes[i], (unsigned)i + 100); /* a different reply, so an echo bug shows */
        if (kvs_chan_send(c, KVS_OP_OPEN, buf, sizes[i], &e->err) != KVS_OK) {
            e->st = e->err.code;
            break;
        }
    }
    free(buf);
}

static void test_round_trip(int plain)
{
    end a, b;
    end_init(&a, 0, 1, plain, echo_client);
    end_init(&b, 1, 0, plain, echo_server);
    run_pair(&a, &b);
    CHECKF(a.open_st == KVS_OK && b.open_st == KVS_OK, "plain %d: %s / %s", plain,
           a.open_err.msg, b.open_err.msg);
    CHECKF(a.st == KVS_OK && b.st == KVS_OK, "plain %d: %s / %s", plain, a.err.msg, b.err.msg);
    CHECKF(a.bad == 0 && b.bad == 0, "plain %d: %d and %d payloads differ", plain, a.bad, b.bad);
    CHECK(a.overhead == (size_t)(plain ? HDR : HDR + TAG));
}

/* ---- counters ---- */

static void count_a(end *e, kvs_chan *c)
{
    uint8_t buf[32] = {0};
    kvs_chan_stats_reset(c);
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_MUL, buf, 10, &e->err));
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_MUL, buf, 20, &e->err));
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_TRUNC, buf, 5, &e->err));
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_OPEN, buf, 7, &e->err));
    kvs_chan_stats_get(c, &e->stats);
}

static void count_b(end *e, kvs_chan *c)
{
    uint8_t buf[32] = {0};
    kvs_chan_stats_reset(c);
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_MUL, buf, 10, &e->err));
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_MUL, buf, 20, &e->err));
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_TRUNC, buf, 5, &e->err));
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_OPEN, buf, 7, &e->err));
    kvs_chan_stats_get(c, &e->stats);
}

static uint64_t total(const uint64_t *v)
{
    uint64_t t = 0;
    for (int i = 0; i < KVS_OP_N; i++)
        t += v[i];
    return t;
}

static void test_counters(int plain)
{
    end a, b;
    end_init(&a, 0, 1, plain, count_a);
    end_init(&b, 1, 0, plain, count_b);
    run_pair(&a, &b);
    CHECKF(a.open_st == KVS_OK && b.open_st == KVS_OK && a.st == KVS_OK && b.st == KVS_OK,
           "%s / %s / %s / %s", a.open_err.msg, b.open_err.msg, a.err.msg, b.err.msg);
    const uint64_t ov = plain ? HDR : HDR + TAG;
    const kvs_chan_stats *s = &a.stats, *r = &b.stats;
    CHECK(s->sent_payload[KVS_OP_MUL] == 30 && s->msgs_sent[KVS_OP_MUL] == 2);
    CHECKF(s->sent_wire[KVS_OP_MUL] == 30 + 2 * ov, "%llu",
           (unsigned long long)s->sent_wire[KVS_OP_MUL]);
    CHECK(s->sent_payload[KVS_OP_TRUNC] == 5 && s->sent_wire[KVS_OP_TRUNC] == 5 + ov &&
          s->msgs_sent[KVS_OP_TRUNC] == 1);
    CHECK(s->recv_payload[KVS_OP_OPEN] == 7 && s->recv_wire[KVS_OP_OPEN] == 7 + ov &&
          s->msgs_recv[KVS_OP_OPEN] == 1);
    CHECK(total(s->sent_payload) == 35 && total(s->msgs_sent) == 3 && total(s->msgs_recv) == 1);
    CHECKF(s->rounds[KVS_OP_OPEN] == 1 && total(s->rounds) == 1, "A: %llu rounds",
           (unsigned long long)total(s->rounds));
    /* The mirror image on B, which never waited after sending. */
    CHECK(r->recv_payload[KVS_OP_MUL] == 30 && r->recv_wire[KVS_OP_MUL] == 30 + 2 * ov &&
          r->msgs_recv[KVS_OP_MUL] == 2);
    CHECK(r->recv_payload[KVS_OP_TRUNC] == 5 && r->recv_wire[KVS_OP_TRUNC] == 5 + ov);
    CHECK(r->sent_payload[KVS_OP_OPEN] == 7 && r->sent_wire[KVS_OP_OPEN] == 7 + ov &&
          total(r->msgs_sent) == 1);
    CHECKF(total(r->rounds) == 0, "B: %llu rounds", (unsigned long long)total(r->rounds));
    /* The handshake: one hello each way (one round), plus the key confirmation when encrypted. */
    const uint64_t hs_wire = HELLO_FRAME + (plain ? 0 : CONFIRM_FRAME);
    CHECKF(a.hs.sent_wire[KVS_OP_HANDSHAKE] == hs_wire && a.hs.recv_wire[KVS_OP_HANDSHAKE] == hs_wire,
           "%llu", (unsigned long long)a.hs.sent_wire[KVS_OP_HANDSHAKE]);
    CHECK(a.hs.msgs_sent[KVS_OP_HANDSHAKE] == (plain ? 1u : 2u) &&
          a.hs.rounds[KVS_OP_HANDSHAKE] == (plain ? 1u : 2u) && total(a.hs.rounds) == (plain ? 1u : 2u));
}

/* ---- both sides flush large messages at each other ---- */

static void swap_body(end *e, kvs_chan *c)
{
    const size_t n = e->n;
    uint8_t *mine = malloc(n), *theirs = malloc(n);
    if (!mine || !theirs) {
        e->bad = 1;
    } else {
        fill(mine, n, (unsigned)e->p.role + 10);
        if (kvs_chan_send(c, KVS_OP_MATMUL, mine, n, &e->err) != KVS_OK ||
            kvs_chan_recv(c, KVS_OP_MATMUL, theirs, n, &e->err) != KVS_OK)
            e->st = e->err.code;
        else
            e->bad = !is_filled(theirs, n, (unsigned)e->p.peer_role + 10);
    }
    free(mine);
    free(theirs);
}

static void test_simultaneous(int plain)
{
    end a, b;
    end_init(&a, 0, 1, plain, swap_body);
    end_init(&b, 1, 0, plain, swap_body);
    a.n = b.n = 4u << 20; /* far beyond a socket buffer: would deadlock without reading while flushing */
    run_pair(&a, &b);
    CHECKF(a.open_st == KVS_OK && b.open_st == KVS_OK && a.st == KVS_OK && b.st == KVS_OK,
           "plain %d: %s / %s", plain, a.err.msg, b.err.msg);
    CHECK(a.bad == 0 && b.bad == 0);
}

/* ---- the wire hides the payload ---- */

static void marker_send(end *e, kvs_chan *c)
{
    uint8_t buf[1000];
    fill(buf, sizeof buf, 3);
    memcpy(buf + 500, MARKER, sizeof MARKER);
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_MATMUL, buf, sizeof buf, &e->err));
    BODY_TRY(e, kvs_chan_flush(c, &e->err));
}

static void marker_recv(end *e, kvs_chan *c)
{
    uint8_t buf[1000];
    kvs_chan_capture(c, 1);
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_MATMUL, buf, sizeof buf, &e->err));
    const uint8_t *w = kvs_chan_captured(c, 1, &e->wire_n);
    const uint8_t *p = kvs_chan_captured(c, 0, &e->payload_n);
    e->wire_has_marker = find(w, e->wire_n, MARKER, sizeof MARKER) != NULL;
    e->payload_has_marker = find(p, e->payload_n, MARKER, sizeof MARKER) != NULL;
    e->bad = memcmp(buf + 500, MARKER, sizeof MARKER) != 0;
}

static void test_ciphertext(int plain)
{
    end a, b;
    end_init(&a, 0, 1, plain, marker_send);
    end_init(&b, 1, 0, plain, marker_recv);
    run_pair(&a, &b);
    CHECKF(a.st == KVS_OK && b.st == KVS_OK && b.open_st == KVS_OK, "%s / %s", a.err.msg, b.err.msg);
    CHECK(b.bad == 0 && b.payload_has_marker && b.payload_n == 1000);
    CHECKF(b.wire_n == 1000 + (size_t)(plain ? HDR : HDR + TAG), "%zu", b.wire_n);
    /* The control: the marker is visible on a plain wire, so its absence means something. */
    CHECKF(b.wire_has_marker == plain, "plain %d: marker on the wire %d", plain, b.wire_has_marker);
}

/* ---- a relay that flips one byte of the stream from A to B ---- */

typedef struct relay {
    int x, y;        /* toward A, toward B */
    uint64_t flip_at; /* offset in the A -> B stream */
} relay;

static void *relay_main(void *arg)
{
    relay *r = arg;
    uint8_t buf[65536];
    uint64_t fwd = 0;
    struct pollfd p[2] = {{.fd = r->x, .events = POLLIN}, {.fd = r->y, .events = POLLIN}};
    for (int done = 0; !done;) {
        if (poll(p, 2, 4000) <= 0)
            break;
        for (int i = 0; i < 2 && !done; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = recv(p[i].fd, buf, sizeof buf, 0);
            if (n <= 0) {
                done = 1;
                break;
            }
            if (i == 0) {
                if (r->flip_at >= fwd && r->flip_at < fwd + (uint64_t)n)
                    buf[r->flip_at - fwd] ^= 0x01;
                fwd += (uint64_t)n;
            }
            send_raw(p[1 - i].fd, buf, (size_t)n);
        }
    }
    close(r->x);
    close(r->y);
    return NULL;
}

static void recv_100(end *e, kvs_chan *c)
{
    uint8_t buf[100];
    memset(buf, 0x55, sizeof buf);
    e->st = kvs_chan_recv(c, KVS_OP_MUL, buf, sizeof buf, &e->err);
    int zero = 1, untouched = 1;
    for (size_t i = 0; i < sizeof buf; i++) {
        zero &= buf[i] == 0;
        untouched &= buf[i] == 0x55;
    }
    /* A rejected payload is not left in the buffer: wiped, or never written. */
    e->bad = e->st != KVS_OK && !zero && !untouched;
    e->again = kvs_chan_recv(c, KVS_OP_MUL, buf, sizeof buf, NULL);
}

static void send_100(end *e, kvs_chan *c)
{
    uint8_t buf[100];
    fill(buf, sizeof buf, 9);
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_MUL, buf, sizeof buf, &e->err));
    BODY_TRY(e, kvs_chan_flush(c, &e->err));
}

/* Flips the byte at offset k of the A -> B stream (after the handshake's bytes). */
static void corrupt(int plain, uint64_t k, kvs_status want, const char *want_msg)
{
    int sa[2], sb[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sa) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sb) != 0) {
        CHECK(!"socketpair");
        return;
    }
    const uint64_t hs = HELLO_FRAME + (plain ? 0 : CONFIRM_FRAME);
    relay r = {.x = sa[1], .y = sb[0], .flip_at = hs + k};
    end a, b;
    end_init(&a, 0, 1, plain, send_100);
    end_init(&b, 1, 0, plain, recv_100);
    a.fd = sa[0];
    b.fd = sb[1];
    pthread_t tr, tb;
    pthread_create(&tr, NULL, relay_main, &r);
    pthread_create(&tb, NULL, end_main, &b);
    end_main(&a);
    pthread_join(tb, NULL);
    pthread_join(tr, NULL);
    CHECKF(a.open_st == KVS_OK && b.open_st == KVS_OK && a.st == KVS_OK, "%s / %s / %s",
           a.open_err.msg, b.open_err.msg, a.err.msg);
    CHECKF(b.st == want && strstr(b.err.msg, want_msg), "plain %d, byte %llu: status %d, '%s'",
           plain, (unsigned long long)k, b.st, b.err.msg);
    CHECK(b.bad == 0);
    CHECK(b.again != KVS_OK); /* the channel stays failed */
}

static void test_corruption(void)
{
    const char *auth = "message authentication failed on the link to party ";
    corrupt(0, HDR + 5, KVS_ERR_FORMAT, auth);        /* a payload byte */
    corrupt(0, HDR + 100 + 3, KVS_ERR_FORMAT, auth);  /* a tag byte */
    corrupt(0, 12, KVS_ERR_FORMAT, auth);             /* the sequence number */
    corrupt(0, 6, KVS_ERR_FORMAT, auth);              /* the encrypted flag: no downgrade */
    corrupt(1, 0, KVS_ERR_FORMAT, "malformed message header: not a kvslim peer");
    corrupt(1, 12, KVS_ERR_FORMAT, "message out of sequence");
}

/* ---- handshake mismatches ---- */

typedef struct mismatch {
    const char *what;
    void (*edit)(kvs_chan_params *b);
    const char *msg_a, *msg_b; /* expected in A's and B's errors (NULL: any failure) */
} mismatch;

static void edit_version(kvs_chan_params *b) { b->version = 2; }
static void edit_frac(kvs_chan_params *b) { b->frac_bits = 16; }
static void edit_ring(kvs_chan_params *b) { b->ring_bits = 32; }
static void edit_hash(kvs_chan_params *b) { b->model_hash[7] ^= 1; }
static void edit_plain(kvs_chan_params *b) { b->insecure_plain = 1; }
static void edit_psk(kvs_chan_params *b) { b->psk = PSK_B; }
static void edit_role(kvs_chan_params *b) { b->role = 2; }
static void edit_peer_role(kvs_chan_params *b) { b->peer_role = 2; }

static void test_handshake(void)
{
    static const mismatch cases[] = {
        {"version", edit_version, "peer speaks protocol version 2, we speak 1",
         "peer speaks protocol version 1, we speak 2"},
        {"frac", edit_frac, "peer uses 16 fraction bits, we use 12",
         "peer uses 12 fraction bits, we use 16"},
        {"ring", edit_ring, "peer computes in a 32-bit ring, we use 64 bits", NULL},
        {"hash", edit_hash, "peer's model hash differs: the two parties loaded different models",
         "peer's model hash differs"},
        {"plain", edit_plain, "peer runs --insecure-plain, we expect an encrypted channel",
         "peer expects an encrypted channel, we run --insecure-plain"},
        {"psk", edit_psk, "key confirmation did not authenticate",
         "key confirmation did not authenticate"},
        {"role", edit_role, "peer is the dealer, we expected party 1", NULL},
        {"peer role", edit_peer_role, "peer expects to talk to the dealer, we are party 0", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        end a, b;
        end_init(&a, 0, 1, 0, NULL);
        end_init(&b, 1, 0, 0, NULL);
        cases[i].edit(&b.p);
        run_pair(&a, &b);
        CHECKF(a.open_st == KVS_ERR_FORMAT && strstr(a.open_err.msg, cases[i].msg_a),
               "%s: A status %d, '%s'", cases[i].what, a.open_st, a.open_err.msg);
        CHECKF(b.open_st != KVS_OK && (!cases[i].msg_b || strstr(b.open_err.msg, cases[i].msg_b)),
               "%s: B status %d, '%s'", cases[i].what, b.open_st, b.open_err.msg);
    }
    /* The matching control: the same parameters pass, the dealer link too. */
    end a, b;
    end_init(&a, 2, 1, 0, NULL);
    end_init(&b, 1, 2, 0, NULL);
    memset(a.p.model_hash, 0, 32);
    memset(b.p.model_hash, 0, 32);
    run_pair(&a, &b);
    CHECKF(a.open_st == KVS_OK && b.open_st == KVS_OK, "%s / %s", a.open_err.msg, b.open_err.msg);

    /* Bad parameters are refused before any byte moves, and the fd is closed. */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
        kvs_chan_params p = params(1, 1, 0);
        kvs_chan *c = (kvs_chan *)(uintptr_t)1; /* must be reset to NULL */
        kvs_error err = {0};
        CHECK(kvs_chan_open(sv[0], &p, &c, &err) == KVS_ERR_ARG && c == NULL);
        CHECK(fcntl(sv[0], F_GETFD) == -1 && errno == EBADF);
        p = params(0, 1, 0);
        p.psk = NULL;
        CHECKF(kvs_chan_open(sv[1], &p, &c, &err) == KVS_ERR_ARG && strstr(err.msg, "pre-shared key"),
               "%s", err.msg);
    }
}

/* ---- timeouts, closed peers, wrong messages ---- */

static void wait_sync(end *e)
{
    struct pollfd p = {.fd = e->sync[0], .events = POLLIN};
    if (poll(&p, 1, 3000) > 0) {
        char ch;
        (void)!read(e->sync[0], &ch, 1);
    }
}

static void silent_peer(end *e, kvs_chan *c)
{
    (void)c;
    wait_sync(e); /* alive and connected, but never sends */
}

static void impatient(end *e, kvs_chan *c)
{
    uint8_t buf[8];
    int64_t t0 = now_ms();
    e->st = kvs_chan_recv(c, KVS_OP_MUL, buf, sizeof buf, &e->err);
    e->ms = now_ms() - t0;
    (void)!write(e->sync[1], "x", 1);
}

static void test_timeout(void)
{
    int sync[2];
    if (pipe(sync) != 0) {
        CHECK(!"pipe");
        return;
    }
    end a, b;
    end_init(&a, 0, 1, 0, impatient);
    end_init(&b, 1, 0, 0, silent_peer);
    a.p.timeout_ms = 200;
    a.sync = b.sync = sync;
    run_pair(&a, &b);
    CHECKF(a.st == KVS_ERR_IO &&
               strstr(a.err.msg, "no message from the peer within 200 ms while waiting for mul"),
           "status %d, '%s'", a.st, a.err.msg);
    CHECKF(a.ms >= 190 && a.ms < 1500, "took %lld ms", (long long)a.ms);
    close(sync[0]);
    close(sync[1]);
}

/* B writes part of a message by hand (the header and n of its 100 payload bytes; nothing when
 * n = 0), then closes. */
static void partial_writer(end *e, kvs_chan *c)
{
    (void)c;
    uint8_t h[HDR + 10];
    const int enc = !e->p.insecure_plain;
    header(h, KVS_OP_MUL, enc, 100, enc ? 2 : 1); /* after the hello (and the confirmation) */
    memset(h + HDR, 0x11, 10);
    if (e->n > 0)
        send_raw(e->fd, h, HDR + e->n);
}

static void recv_mul_100(end *e, kvs_chan *c)
{
    uint8_t buf[100];
    e->st = kvs_chan_recv(c, KVS_OP_MUL, buf, sizeof buf, &e->err);
}

static void test_closed(int plain, size_t part)
{
    end a, b;
    end_init(&a, 0, 1, plain, recv_mul_100);
    end_init(&b, 1, 0, plain, partial_writer);
    b.n = part;
    run_pair(&a, &b);
    char want[128];
    const size_t frame = HDR + 100 + (plain ? 0 : TAG);
    snprintf(want, sizeof want,
             "party 1 closed the connection while we waited for mul (%zu of %zu bytes)",
             part == 0 ? (size_t)0 : (size_t)HDR + part, frame);
    CHECKF(a.st == KVS_ERR_IO && strstr(a.err.msg, want), "status %d, '%s' (want '%s')", a.st,
           a.err.msg, want);
}

static void send_mul_8(end *e, kvs_chan *c)
{
    uint8_t buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_MUL, buf, sizeof buf, &e->err));
}

static void recv_wrong(end *e, kvs_chan *c)
{
    uint8_t buf[16];
    e->st = kvs_chan_recv(c, (kvs_mpc_op)e->n, buf, e->n == (size_t)KVS_OP_MUL ? 16 : 8, &e->err);
    e->again = kvs_chan_send(c, KVS_OP_MUL, buf, 1, NULL);
}

static void send_garbage(end *e, kvs_chan *c)
{
    (void)c;
    uint8_t h[HDR];
    if (e->n == 0) {
        memcpy(h, "HTTP/1.1 200 OK\r\nContent", HDR);
    } else if (e->n == 1) {
        header(h, KVS_OP_MUL, 0, 0x7fffffffu, 1); /* a length beyond the 1 GiB limit */
    } else {
        header(h, KVS_OP_MUL, 0, 512u << 20, 1); /* 512 MiB, within it: no payload follows */
    }
    send_raw(e->fd, h, sizeof h);
}

static void test_wrong_messages(void)
{
    for (int plain = 0; plain <= 1; plain++) {
        end a, b;
        end_init(&a, 0, 1, plain, recv_wrong);
        end_init(&b, 1, 0, plain, send_mul_8);
        a.n = KVS_OP_TRUNC;
        run_pair(&a, &b);
        CHECKF(a.st == KVS_ERR_FORMAT &&
                   strstr(a.err.msg, "expected a trunc message of 8 bytes, the peer sent a mul "
                                     "message of 8 bytes"),
               "status %d, '%s'", a.st, a.err.msg);
        CHECK(a.again == KVS_ERR_IO); /* unusable afterwards */

        end_init(&a, 0, 1, plain, recv_wrong);
        end_init(&b, 1, 0, plain, send_mul_8);
        a.n = KVS_OP_MUL;
        run_pair(&a, &b);
        CHECKF(a.st == KVS_ERR_FORMAT &&
                   strstr(a.err.msg, "expected a mul message of 16 bytes, the peer sent a mul "
                                     "message of 8 bytes"),
               "status %d, '%s'", a.st, a.err.msg);
    }
    for (size_t kind = 0; kind < 2; kind++) {
        end a, b;
        end_init(&a, 0, 1, 1, recv_mul_100);
        end_init(&b, 1, 0, 1, send_garbage);
        b.n = kind;
        run_pair(&a, &b);
        CHECKF(a.st == KVS_ERR_FORMAT &&
                   strstr(a.err.msg,
                          "malformed message header: not a kvslim peer or a corrupted stream"),
               "kind %zu: status %d, '%s'", kind, a.st, a.err.msg);
    }
    /* A length under the limit but over what the receive expects is refused from the header
     * alone, before anything is buffered for it (the peer sends no payload: a wait for one
     * would time out instead). */
    end a, b;
    end_init(&a, 0, 1, 1, recv_mul_100);
    end_init(&b, 1, 0, 1, send_garbage);
    b.n = 2;
    run_pair(&a, &b);
    CHECKF(a.st == KVS_ERR_FORMAT &&
               strstr(a.err.msg, "expected a mul message of 100 bytes, the peer sent a mul "
                                 "message of 536870912 bytes"),
           "status %d, '%s'", a.st, a.err.msg);
}

/* ---- TCP ---- */

typedef struct tcp_peer {
    int port;
    end e;
    kvs_status st;
    kvs_error err;
} tcp_peer;

static void *tcp_connect_main(void *arg)
{
    tcp_peer *t = arg;
    t->st = kvs_net_connect("127.0.0.1", t->port, 2000, &t->e.fd, &t->err);
    if (t->st == KVS_OK)
        end_main(&t->e);
    return NULL;
}

static void test_tcp(void)
{
    kvs_error err = {0};
    int lfd = -1, port = 0;
    CHECKF(kvs_net_listen("127.0.0.1", 0, &lfd, &port, &err) == KVS_OK && port > 0, "%s", err.msg);
    if (lfd < 0)
        return;
    /* A second listener on the same port. */
    int lfd2 = -1;
    char want[96];
    snprintf(want, sizeof want, "port %d is in use", port);
    CHECKF(kvs_net_listen("127.0.0.1", port, &lfd2, NULL, &err) == KVS_ERR_IO &&
               strstr(err.msg, want) && lfd2 == -1,
           "'%s'", err.msg);

    /* Nobody connects yet. */
    int fd = -1;
    int64_t t0 = now_ms();
    snprintf(want, sizeof want, "no peer connected to port %d within 100 ms", port);
    CHECKF(kvs_net_accept(lfd, 100, &fd, &err) == KVS_ERR_IO && strstr(err.msg, want), "'%s'",
           err.msg);
    CHECK(now_ms() - t0 < 1000);

    /* A real connection, encrypted, with an echo. */
    tcp_peer t;
    memset(&t, 0, sizeof t);
    t.port = port;
    end_init(&t.e, 1, 0, 0, echo_server);
    pthread_t th;
    pthread_create(&th, NULL, tcp_connect_main, &t);
    end a;
    end_init(&a, 0, 1, 0, echo_client);
    CHECKF(kvs_net_accept(lfd, 2000, &fd, &err) == KVS_OK, "%s", err.msg);
    if (fd >= 0) {
        a.fd = fd;
        end_main(&a);
    }
    pthread_join(th, NULL);
    CHECKF(t.st == KVS_OK, "%s", t.err.msg);
    CHECKF(a.open_st == KVS_OK && t.e.open_st == KVS_OK && a.st == KVS_OK && t.e.st == KVS_OK,
           "%s / %s / %s / %s", a.open_err.msg, t.e.open_err.msg, a.err.msg, t.e.err.msg);
    CHECK(a.bad == 0 && t.e.bad == 0);
    close(lfd);

    /* Nobody listens on the port any more. */
    t0 = now_ms();
    snprintf(want, sizeof want, "cannot reach 127.0.0.1:%d: connection refused", port);
    CHECKF(kvs_net_connect("127.0.0.1", port, 200, &fd, &err) == KVS_ERR_IO &&
               strstr(err.msg, want) && fd == -1,
           "'%s'", err.msg);
    const int64_t ms = now_ms() - t0;
    CHECKF(ms >= 150 && ms < 1500, "connect gave up after %lld ms", (long long)ms);
}

static void test_random_key(void)
{
    uint8_t k1[32], k2[32], zero[32] = {0};
    kvs_error err = {0};
    CHECK(kvs_net_random_key(k1, &err) == KVS_OK && kvs_net_random_key(k2, &err) == KVS_OK);
    CHECK(memcmp(k1, k2, 32) != 0 && memcmp(k1, zero, 32) != 0);
}

/* ---- throughput (printed, not asserted) ---- */

#define BENCH_MSG ((size_t)1 << 20)

static void bench_send(end *e, kvs_chan *c)
{
    uint8_t *buf = malloc(BENCH_MSG), ack = 0;
    if (!buf)
        return;
    fill(buf, BENCH_MSG, 1);
    double t0 = now_s();
    for (size_t i = 0; i < e->n; i++)
        BODY_TRY(e, kvs_chan_send(c, KVS_OP_MATMUL, buf, BENCH_MSG, &e->err));
    BODY_TRY(e, kvs_chan_recv(c, KVS_OP_OPEN, &ack, 1, &e->err));
    e->secs = now_s() - t0;
    free(buf);
}

static void bench_recv(end *e, kvs_chan *c)
{
    uint8_t *buf = malloc(BENCH_MSG), ack = 1;
    if (!buf)
        return;
    for (size_t i = 0; i < e->n; i++)
        BODY_TRY(e, kvs_chan_recv(c, KVS_OP_MATMUL, buf, BENCH_MSG, &e->err));
    BODY_TRY(e, kvs_chan_send(c, KVS_OP_OPEN, &ack, 1, &e->err));
    free(buf);
}

static void bench(void)
{
    const size_t msgs = 32;
    for (int plain = 1; plain >= 0; plain--) {
        end a, b;
        end_init(&a, 0, 1, plain, bench_send);
        end_init(&b, 1, 0, plain, bench_recv);
        a.n = b.n = msgs;
        run_pair(&a, &b);
        CHECKF(a.st == KVS_OK && b.st == KVS_OK, "%s / %s", a.err.msg, b.err.msg);
        if (a.secs > 0)
            printf("throughput over a socketpair, %s: %.0f MB/s (%zu x 1 MiB, overhead %zu bytes "
                   "per message)\n", plain ? "plain" : "AES-256-GCM",
                   (double)(msgs * BENCH_MSG) / 1e6 / a.secs, msgs, a.overhead);
    }
}

int main(void)
{
    const int64_t t0 = now_ms();
    for (int plain = 0; plain <= 1; plain++) {
        test_round_trip(plain);
        test_counters(plain);
        test_simultaneous(plain);
        test_ciphertext(plain);
        test_closed(plain, 0);
        test_closed(plain, 10);
    }
    test_corruption();
    test_handshake();
    test_timeout();
    test_wrong_messages();
    test_tcp();
    test_random_key();
    bench();
    printf("test_mpc_net: %lld ms\n", (long long)(now_ms() - t0));
    return check_summary("test_mpc_net");
}
