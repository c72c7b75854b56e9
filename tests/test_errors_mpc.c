/* The two-party engine's argument and handshake checks (issue 16): every call here must fail
 * with the documented status and a message naming the parameter, the peer or the address at
 * fault. The gate and forward-pass checks run before any message is exchanged, so a lone
 * context (no channels) reaches them; two local runs check how a role's failure is reported
 * and what happens without descriptors for the socket pairs. The transport's checks run on
 * socketpairs, with hello and confirmation messages written by hand from the documented layout
 * (tests/test_mpc_net.c has the wire format). Nothing here touches the network beyond
 * 127.0.0.1 and an unassignable address. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "mpc/gates.h"
#include "mpc/gates_cache.h"
#include "mpc/gates_nl.h"
#include "mpc/gates_select.h"
#include "mpc/local.h"
#include "mpc/mpcache.h"
#include "mpc/net.h"
#include "mpc/net_internal.h"

/* The call returns want_st with a message containing want (the call writes the global err). */
#define EXPECT(call, want_st, want)                                                          \
    do {                                                                                     \
        kvs_status st_ = (call);                                                             \
        CHECKF(st_ == (want_st) && strstr(err.msg, (want)) != NULL,                          \
               "status %d (want %d), message '%s' (want '%s')", (int)st_, (int)(want_st),    \
               err.msg, (want));                                                             \
    } while (0)

static kvs_error err;

static void reset(void) { memset(&err, 0, sizeof err); }

/* ---- gates: shape and precision checks (a context with no channels: they fail first) ---- */

static void test_gates(void)
{
    kvs_mpc m;
    memset(&m, 0, sizeof m);
    m.role = KVS_MPC_P0;
    m.frac = 12;
    uint64_t x[4] = {1, 2, 3, 4}, y[16] = {0}, idx[4] = {0};

    reset();
    EXPECT(kvs_mpc_trunc(&m, KVS_OP_TRUNC, x, 4, 63, &err), KVS_ERR_ARG, "truncation by 63 bits");
    reset();
    EXPECT(kvs_mpc_nonneg_bits(&m, KVS_OP_CMP, x, 4, 1, y, &err), KVS_ERR_ARG,
           "sign test over 1 bits: expected 2 to 64");
    reset();
    EXPECT(kvs_mpc_nonneg_bits(&m, KVS_OP_CMP, x, 4, 65, y, &err), KVS_ERR_ARG,
           "sign test over 65 bits");
    reset();
    EXPECT(kvs_mpc_max_rows(&m, KVS_OP_CMP, x, 2, 0, 24, y, &err), KVS_ERR_ARG,
           "maximum of an empty row");
    reset();
    EXPECT(kvs_mpc_argmax_rows(&m, KVS_OP_CMP, x, 2, 0, 24, y, y + 4, &err), KVS_ERR_ARG,
           "argmax of an empty row");

    /* the non-linear gates' tables are built for a range of fraction bits */
    m.frac = 31;
    reset();
    EXPECT(kvs_mpc_silu(&m, KVS_OP_LUT, x, 4, 16, y, &err), KVS_ERR_ARG,
           "SiLU with 31 fraction bits");
    m.frac = 0;
    reset();
    EXPECT(kvs_mpc_recip(&m, KVS_OP_LUT, x, 4, y, &err), KVS_ERR_ARG,
           "reciprocal with 0 fraction bits: 1 to 20");
    m.frac = 21;
    reset();
    EXPECT(kvs_mpc_recip(&m, KVS_OP_LUT, x, 4, y, &err), KVS_ERR_ARG,
           "reciprocal with 21 fraction bits");
    m.frac = 19;
    reset();
    EXPECT(kvs_mpc_rsqrt(&m, KVS_OP_LUT, x, 4, y, &err), KVS_ERR_ARG,
           "inverse square root with 19 fraction bits: 1 to 18");
    m.frac = 0;
    reset();
    EXPECT(kvs_mpc_rsqrt(&m, KVS_OP_LUT, x, 4, y, &err), KVS_ERR_ARG,
           "inverse square root with 0 fraction bits");
    m.frac = 12;

    /* selection gates */
    reset();
    EXPECT(kvs_mpc_onehot(&m, KVS_OP_CMP, idx, 4, 0, y, &err), KVS_ERR_ARG,
           "a one-hot over 0 bits: expected 1 to 16");
    reset();
    EXPECT(kvs_mpc_onehot(&m, KVS_OP_CMP, idx, 4, 17, y, &err), KVS_ERR_ARG,
           "a one-hot over 17 bits");
    reset();
    EXPECT(kvs_mpc_topk_mask(&m, KVS_OP_CMP, x, 1, 4, 5, 24, y, &err), KVS_ERR_ARG,
           "top-5 of 4 values");
    reset();
    EXPECT(kvs_mpc_topk_mask(&m, KVS_OP_CMP, x, 1, 0, 0, 24, y, &err), KVS_ERR_ARG,
           "top-0 of 0 values");
    reset();
    EXPECT(kvs_mpc_topk_threshold(&m, KVS_OP_CMP, x, 1, 4, 5, 24, y, &err), KVS_ERR_ARG,
           "top-5 of 4 values over 24 bits");
    reset();
    EXPECT(kvs_mpc_topk_threshold(&m, KVS_OP_CMP, x, 1, 4, 2, 2, y, &err), KVS_ERR_ARG,
           "top-2 of 4 values over 2 bits: expected k <= len, 3 to 64 bits");
    reset();
    EXPECT(kvs_mpc_topk_threshold(&m, KVS_OP_CMP, x, 1, 0, 0, 24, y, &err), KVS_ERR_ARG,
           "top-0 of 0 values");
    reset();
    EXPECT(kvs_mpc_gather_matrix(&m, KVS_OP_CMP, x, 1, 4, 5, y, &err), KVS_ERR_ARG,
           "a gather of 5 of 4 values");
    reset();
    EXPECT(kvs_mpc_cluster_reps(&m, KVS_OP_CMP, x, 2, 0, 2, 0, 24, y, &err), KVS_ERR_ARG,
           "clusters of 0 rows");

    /* the secret cache's cluster gather: clusters must tile the rows */
    kvs_mpc_cache c;
    kvs_mpc_cache_init(&c, 1, 2);
    c.len = 5;
    reset();
    EXPECT(kvs_mpc_cache_gather(&m, KVS_OP_SOFTMAX, &c, x, 1, 2, y, &err), KVS_ERR_ARG,
           "a gather of clusters of 2 rows from 5 rows");
    reset();
    EXPECT(kvs_mpc_cache_gather(&m, KVS_OP_SOFTMAX, &c, x, 1, 0, y, &err), KVS_ERR_ARG,
           "clusters of 0 rows from 5 rows");
    c.len = 0;
    kvs_mpc_cache_free(&c);
}

/* A gate's argument error inside a local run: every role fails alike, and the run reports the
 * first role's failure under its name. */
static kvs_status trunc_too_far(kvs_mpc *m, void *ctx, kvs_error *e)
{
    (void)ctx;
    uint64_t x[2] = {1, 2};
    return kvs_mpc_trunc(m, KVS_OP_TRUNC, kvs_mpc_is_dealer(m) ? NULL : x, 2, 63, e);
}

static void test_local_run(void)
{
    kvs_mpc_local_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.frac = 12;
    cfg.insecure_plain = 1;
    cfg.timeout_ms = 2000;
    kvs_mpc_local_result res[3];
    reset();
    EXPECT(kvs_mpc_run_local(trunc_too_far, NULL, &cfg, res, &err), KVS_ERR_ARG,
           "party 0: truncation by 63 bits: at most 62");
    for (int i = 0; i < 3; i++) {
        CHECKF(res[i].st == KVS_ERR_ARG && strstr(res[i].msg, "truncation by 63 bits"),
               "role %d: %d '%s'", i, (int)res[i].st, res[i].msg);
        kvs_mpc_local_result_free(&res[i]);
    }
}

/* No descriptors left for the socket pairs: the soft limit on open files is set to the lowest
 * free descriptor plus two, so the first pair is made and the second is not (the first must be
 * closed again: the next descriptor opened is the same lowest one). */
static void test_local_no_fds(void)
{
    struct rlimit old;
    int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (lowest < 0 || getrlimit(RLIMIT_NOFILE, &old) != 0) {
        CHECK(!"open or getrlimit");
        return;
    }
    close(lowest);
    struct rlimit tight = old;
    tight.rlim_cur = (rlim_t)lowest + 2;
    kvs_mpc_local_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.frac = 12;
    cfg.insecure_plain = 1;
    kvs_mpc_local_result res[3];
    reset();
    kvs_status st = KVS_ERR_IO;
    if (setrlimit(RLIMIT_NOFILE, &tight) == 0) {
        st = kvs_mpc_run_local(trunc_too_far, NULL, &cfg, res, &err);
        setrlimit(RLIMIT_NOFILE, &old);
    } else {
        CHECK(!"setrlimit");
    }
    CHECKF(st == KVS_ERR_IO && strstr(err.msg, "cannot make socket pairs for a local run"),
           "%d '%s'", (int)st, err.msg);
    int again = open("/dev/null", O_RDONLY | O_CLOEXEC);
    CHECKF(again == lowest, "descriptor %d after the failed run, %d before", again, lowest);
    close(again);
}

/* ---- the forward pass and the KV selection state (a shape, no weights) ---- */

static void shape_model(kvs_mpc_llama *L, kvs_mpc_layer *layers)
{
    memset(L, 0, sizeof *L);
    L->s.dim = 4;
    L->s.hidden = 8;
    L->s.n_layers = 1;
    L->s.n_heads = 1;
    L->s.n_kv_heads = 1;
    L->s.head_dim = 4;
    L->s.rot_dim = 4;
    L->s.vocab = 10;
    L->layers = layers;
    memset(layers, 0, sizeof *layers);
}

static kvs_mpc_kv_cfg kv_cfg(kvs_mpc_kv_mode mode, int static_step)
{
    kvs_mpc_kv_cfg c;
    memset(&c, 0, sizeof c);
    c.mode = mode;
    c.static_step = static_step;
    c.budget = 0.5;
    c.mp = kvs_mp_cfg_default();
    return c;
}

static void test_forward(void)
{
    kvs_mpc m;
    memset(&m, 0, sizeof m);
    m.role = KVS_MPC_P1;
    m.frac = 12;
    kvs_mpc_llama L;
    kvs_mpc_layer layer;
    kvs_mpc_shape s;
    memset(&s, 0, sizeof s);
    s.n_layers = 1;
    reset();
    EXPECT(kvs_mpc_llama_setup(&m, NULL, &s, &L, &err), KVS_ERR_ARG, "party 1 needs the model");
    kvs_mpc_llama_free(&L);

    m.role = KVS_MPC_P0;
    shape_model(&L, &layer);
    int32_t toks[4] = {1, 2, 3, 4};
    uint64_t logits[40];
    reset();
    EXPECT(kvs_mpc_llama_forward(&m, &L, toks, 0, logits, &err), KVS_ERR_ARG,
           "a forward pass of 0 tokens");
    const int32_t bad[2] = {3, 10};
    reset();
    EXPECT(kvs_mpc_llama_forward(&m, &L, bad, 2, logits, &err), KVS_ERR_ARG,
           "token id 10 is outside the vocabulary [0, 10)");
    const int32_t neg = -1;
    reset();
    EXPECT(kvs_mpc_llama_forward(&m, &L, &neg, 1, logits, &err), KVS_ERR_ARG,
           "token id -1 is outside");

    /* a static step at the prompt's end (P = 4): a block may not cross it */
    kvs_mpc_kv_cfg cfg = kv_cfg(KVS_MPC_KV_FULL, 1);
    reset();
    CHECKF(kvs_mpc_sel_attach(&L, &cfg, 4, &err) == KVS_OK, "%s", err.msg);
    L.pos = 2;
    reset();
    EXPECT(kvs_mpc_llama_forward(&m, &L, toks, 4, logits, &err), KVS_ERR_ARG,
           "a block of 4 tokens at position 2 crosses the prompt's end (4)");
    /* the static step needs every prompt row in the cache (none was appended here) */
    L.pos = 4;
    reset();
    EXPECT(kvs_mpc_sel_compress(&m, &L, &err), KVS_ERR_ARG,
           "the static step needs the 4 prompt rows (0 held)");
    /* a budget whose keep differs from the static step's */
    reset();
    EXPECT(kvs_mpc_sel_set_budget(&L, 0.9, &err), KVS_ERR_ARG,
           "budget=0.9: the static step kept 0.5 of the prompt and this budget needs 0.9");
    reset();
    EXPECT(kvs_mpc_sel_set_budget(&L, 0, &err), KVS_ERR_ARG, "budget=0:");
    /* no mark yet */
    reset();
    EXPECT(kvs_mpc_sel_rewind(&L, &err), KVS_ERR_ARG, "no mark to rewind to");
    kvs_mpc_sel_free(&L);
    reset();
    EXPECT(kvs_mpc_sel_rewind(&L, &err), KVS_ERR_ARG, "no mark to rewind to");

    /* token-level selection after the prompt: one token a call */
    cfg = kv_cfg(KVS_MPC_KV_TOKEN, 0);
    L.pos = 0;
    reset();
    CHECKF(kvs_mpc_sel_attach(&L, &cfg, 2, &err) == KVS_OK, "%s", err.msg);
    L.pos = 2;
    reset();
    EXPECT(kvs_mpc_llama_forward(&m, &L, toks, 2, logits, &err), KVS_ERR_ARG,
           "with KV selection, decoding takes one token a call (2 given)");
    kvs_mpc_sel_free(&L);

    /* configurations kvs_mpc_kv_parse would not produce, but the API takes */
    cfg = kv_cfg((kvs_mpc_kv_mode)7, 0);
    reset();
    EXPECT(kvs_mpc_sel_attach(&L, &cfg, 2, &err), KVS_ERR_ARG, "unknown selection mode 7");
    cfg = kv_cfg(KVS_MPC_KV_CLUSTER, 1);
    cfg.mp.levels = 3;
    reset();
    EXPECT(kvs_mpc_sel_attach(&L, &cfg, 64, &err), KVS_ERR_ARG, "levels=3 must be 1 or 2");
    CHECK(L.sel == NULL);
}

/* ---- the transport ---- */

static kvs_chan_params params(int role, int peer)
{
    kvs_chan_params p;
    memset(&p, 0, sizeof p);
    p.insecure_plain = 1;
    p.timeout_ms = 2000;
    p.version = 1;
    p.ring_bits = 64;
    p.frac_bits = 12;
    p.role = role;
    p.peer_role = peer;
    return p;
}

/* A descriptor number that is not open. */
static int closed_fd(void)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    close(fd);
    return fd;
}

static void test_open_args(void)
{
    kvs_chan_params p = params(0, 1);
    kvs_chan *c = (kvs_chan *)&p; /* must be reset to NULL on failure */
    reset();
    EXPECT(kvs_chan_open(-1, NULL, &c, &err), KVS_ERR_ARG, "params or out is NULL");
    CHECK(c == NULL);
    reset();
    EXPECT(kvs_chan_open(-1, &p, NULL, &err), KVS_ERR_ARG, "params or out is NULL");
    reset();
    EXPECT(kvs_chan_open(-1, &p, &c, &err), KVS_ERR_ARG, "invalid socket -1");
    p.timeout_ms = 0;
    /* a valid descriptor is owned (closed) even when the parameters are rejected */
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    reset();
    EXPECT(kvs_chan_open(fd, &p, &c, &err), KVS_ERR_ARG, "channel timeout must be > 0 ms, got 0");
    CHECK(fcntl(fd, F_GETFD) < 0);
    p = params(0, 1);
    p.ring_bits = 16;
    p.frac_bits = 16;
    reset();
    EXPECT(kvs_chan_open(open("/dev/null", O_RDONLY | O_CLOEXEC), &p, &c, &err), KVS_ERR_ARG,
           "invalid ring of 16 bits with 16 fraction bits");
    p = params(0, 1);
    p.ring_bits = 65;
    reset();
    EXPECT(kvs_chan_open(open("/dev/null", O_RDONLY | O_CLOEXEC), &p, &c, &err), KVS_ERR_ARG,
           "invalid ring of 65 bits");
    /* a descriptor that is not open: the switch to non-blocking mode fails */
    p = params(0, 1);
    reset();
    EXPECT(kvs_chan_open(closed_fd(), &p, &c, &err), KVS_ERR_IO,
           "cannot make the socket non-blocking: Bad file descriptor");
    CHECK(c == NULL);

    /* a NULL channel */
    uint8_t b[4] = {0};
    reset();
    EXPECT(kvs_chan_send(NULL, KVS_OP_OPEN, b, 4, &err), KVS_ERR_ARG, "channel is NULL");
    reset();
    EXPECT(kvs_chan_recv(NULL, KVS_OP_OPEN, b, 4, &err), KVS_ERR_ARG, "channel is NULL");
    reset();
    EXPECT(kvs_net_random_key(NULL, &err), KVS_ERR_ARG, "kvs_net_random_key: key is NULL");
}

typedef struct opener {
    int fd;
    kvs_chan_params p;
    kvs_chan *c;
    kvs_status st;
    kvs_error err;
} opener;

static void *open_main(void *arg)
{
    opener *o = arg;
    o->st = kvs_chan_open(o->fd, &o->p, &o->c, &o->err);
    return NULL;
}

/* The argument checks of an open channel's send and receive (a plain pair). */
static void test_send_recv_args(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        CHECK(!"socketpair");
        return;
    }
    opener o = {.fd = sv[1], .p = params(1, 0)};
    pthread_t t;
    pthread_create(&t, NULL, open_main, &o);
    kvs_chan_params p = params(0, 1);
    kvs_chan *c = NULL;
    reset();
    kvs_status st = kvs_chan_open(sv[0], &p, &c, &err);
    pthread_join(t, NULL);
    CHECKF(st == KVS_OK && o.st == KVS_OK, "%s / %s", err.msg, o.err.msg);
    if (st == KVS_OK) {
        uint8_t b[4] = {1, 2, 3, 4};
        const size_t big = KVS_CHAN_MAX_PAYLOAD + 1;
        reset();
        EXPECT(kvs_chan_send(c, KVS_OP_OPEN, b, big, &err), KVS_ERR_ARG,
               "kvs_chan_send: a open message of 1073741825 bytes exceeds the limit");
        reset();
        EXPECT(kvs_chan_send(c, KVS_OP_OPEN, NULL, 4, &err), KVS_ERR_ARG,
               "kvs_chan_send: buffer is NULL");
        reset();
        EXPECT(kvs_chan_recv(c, (kvs_mpc_op)-1, b, 4, &err), KVS_ERR_ARG,
               "kvs_chan_recv: unknown op -1");
        reset();
        EXPECT(kvs_chan_recv(c, KVS_OP_N, b, 4, &err), KVS_ERR_ARG, "kvs_chan_recv: unknown op");
        reset();
        EXPECT(kvs_chan_recv(c, KVS_OP_OPEN, b, big, &err), KVS_ERR_ARG,
               "kvs_chan_recv: 1073741825 bytes exceed the limit of 1073741824");
        reset();
        EXPECT(kvs_chan_recv(c, KVS_OP_OPEN, NULL, 4, &err), KVS_ERR_ARG,
               "kvs_chan_recv: buffer is NULL");
        /* argument errors leave the channel usable: one message each way still goes through */
        uint8_t back[4] = {0};
        reset();
        CHECKF(kvs_chan_send(c, KVS_OP_OPEN, b, 4, &err) == KVS_OK &&
                   kvs_chan_flush(c, &err) == KVS_OK &&
                   kvs_chan_recv(o.c, KVS_OP_OPEN, back, 4, &err) == KVS_OK &&
                   memcmp(back, b, 4) == 0,
               "%s", err.msg);
    }
    kvs_chan_close(c);
    kvs_chan_close(o.c);
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Opens a plain party-0 end against a hand-written hello of n bytes (a plain frame: header
 * {"KVS2", op 0 = handshake, flags 0, n, sequence 0}); the open must fail with want. */
static void bad_hello(const uint8_t *hello, size_t n, const char *want)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        CHECK(!"socketpair");
        return;
    }
    opener o = {.fd = sv[1], .p = params(0, 1)};
    pthread_t t;
    pthread_create(&t, NULL, open_main, &o);
    uint8_t frame[20 + 128];
    memcpy(frame, "KVS2", 4);
    put_le(frame + 4, KVS_OP_HANDSHAKE, 2);
    put_le(frame + 6, 0, 2);
    put_le(frame + 8, n, 4);
    put_le(frame + 12, 0, 8);
    memcpy(frame + 20, hello, n);
    CHECK(write(sv[0], frame, 20 + n) == (ssize_t)(20 + n));
    pthread_join(t, NULL);
    close(sv[0]);
    CHECKF(o.st == KVS_ERR_FORMAT && strstr(o.err.msg, want), "status %d '%s' (want '%s')",
           (int)o.st, o.err.msg, want);
    kvs_chan_close(o.c);
}

/* The hello: {u32 'KVSH', u32 version, role, expected peer role, ring bits, frac bits, encrypts,
 * 3 zero bytes, 32-byte model hash, 32-byte nonce} (80 bytes), as party 1 would send it. */
static void test_hello(void)
{
    uint8_t h[128];
    memset(h, 0, sizeof h);
    put_le(h, 0x4853564Bu, 4);
    put_le(h + 4, 1, 4);
    h[8] = 1;
    h[9] = 0;
    h[10] = 64;
    h[11] = 12;
    h[12] = 0;
    uint8_t x[128];
    memcpy(x, h, sizeof x);
    x[0] ^= 0xff; /* another program speaking on the port */
    bad_hello(x, 80, "malformed handshake: the peer is not a kvslim two-party engine");
    bad_hello(h, 96, "malformed handshake: a hello of 96 bytes, expected 80");
    bad_hello(h, 64, "malformed handshake: a hello of 64 bytes");
    memcpy(x, h, sizeof x);
    x[12] = 2;
    bad_hello(x, 80, "malformed handshake: encryption flag 2");
}

static int read_all(int fd, uint8_t *b, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* A peer that holds the right key but confirms it with other words: the handshake's GCM tag
 * verifies, the plaintext does not match. The peer is written by hand from net.h's description
 * (keys: HKDF-SHA256(psk, salt = both nonces, info = "kvslim-mpc-chan v1 key FROM->TO" and the
 * SHA-256 of both hellos, lower role first); GCM nonce = the sequence number; AAD = the
 * header). A conforming peer cannot do this, so it is the one way to reach the check. The same
 * peer confirming with the right words must be accepted: that shows its keys are right, so the
 * refusal comes from the comparison, not from the tag (both end in the same message). */
static void fake_confirmation(const uint8_t words[32], opener *o)
{
    static const uint8_t psk[32] = "0123456789abcdef0123456789abcde";
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        CHECK(!"socketpair");
        return;
    }
    memset(o, 0, sizeof *o);
    o->fd = sv[1];
    o->p = params(0, 1);
    o->p.insecure_plain = 0;
    o->p.psk = psk;
    pthread_t t;
    pthread_create(&t, NULL, open_main, o);
    /* our hello (party 1, encrypting) in a plain frame, sequence 0 */
    uint8_t mine[20 + 80], theirs[20 + 80];
    memset(mine, 0, sizeof mine);
    memcpy(mine, "KVS2", 4);
    put_le(mine + 8, 80, 4);
    uint8_t *h = mine + 20;
    put_le(h, 0x4853564Bu, 4);
    put_le(h + 4, 1, 4);
    h[8] = 1;
    h[9] = 0;
    h[10] = 64;
    h[11] = 12;
    h[12] = 1;
    for (int i = 0; i < 32; i++)
        h[48 + i] = (uint8_t)(3 * i + 1);
    CHECK(write(sv[0], mine, sizeof mine) == (ssize_t)sizeof mine);
    int ok = read_all(sv[0], theirs, sizeof theirs) == 0;
    CHECK(ok);
    /* party 0 is the lower role: its hello first */
    const uint8_t *lo = theirs + 20, *hi = h;
    uint8_t salt[64], transcript[32], key[32], info[64 + 32];
    memcpy(salt, lo + 48, 32);
    memcpy(salt + 32, hi + 48, 32);
    int k = snprintf((char *)info, 64, "kvslim-mpc-chan v1 key %d->%d", 1, 0);
    ok = ok && kvs_net_sha256(lo, 80, hi, 80, transcript) == 0;
    memcpy(info + k, transcript, 32);
    ok = ok && kvs_net_hkdf_sha256(psk, 32, salt, 64, info, (size_t)k + 32, key) == 0;
    kvs_gcm *g = ok ? kvs_gcm_new(key, 1) : NULL;
    CHECK(g != NULL);
    if (g) {
        uint8_t frame[20 + 32 + 16];
        memcpy(frame, "KVS2", 4);
        put_le(frame + 4, KVS_OP_HANDSHAKE, 2);
        put_le(frame + 6, 1, 2); /* encrypted */
        put_le(frame + 8, 32, 4);
        put_le(frame + 12, 1, 8);
        CHECK(kvs_gcm_seal(g, 1, frame, 20, words, 32, frame + 20, frame + 52) == 0);
        CHECK(write(sv[0], frame, sizeof frame) == (ssize_t)sizeof frame);
        kvs_gcm_free(g);
    }
    pthread_join(t, NULL);
    close(sv[0]);
}

static void test_wrong_confirmation(void)
{
    opener o;
    fake_confirmation((const uint8_t *)"kvslim two-party key confirm v1", &o);
    CHECKF(o.st == KVS_OK, "the right words: %s", o.err.msg);
    kvs_chan_close(o.c);
    fake_confirmation((const uint8_t *)"not the key confirmation text..", &o);
    CHECKF(o.st == KVS_ERR_FORMAT &&
               strstr(o.err.msg, "handshake failed: the peer's key confirmation did not "
                                 "authenticate"),
           "status %d '%s'", (int)o.st, o.err.msg);
    kvs_chan_close(o.c);
}

/* ---- TCP helpers ---- */

static void test_tcp_args(void)
{
    int fd = 0, port = 0;
    reset();
    EXPECT(kvs_net_listen("127.0.0.1", 0, NULL, NULL, &err), KVS_ERR_ARG,
           "kvs_net_listen: fd is NULL");
    reset();
    EXPECT(kvs_net_listen("127.0.0.1", 65536, &fd, NULL, &err), KVS_ERR_ARG,
           "port 65536 is out of range 0-65535");
    CHECK(fd == -1);
    reset();
    EXPECT(kvs_net_listen("127.0.0.1", -1, &fd, NULL, &err), KVS_ERR_ARG,
           "port -1 is out of range");
    /* a name glibc rejects without asking a DNS server (a space is not a host name character) */
    reset();
    EXPECT(kvs_net_listen("bad host!", 0, &fd, NULL, &err), KVS_ERR_IO,
           "cannot resolve bad host!:");
    /* TEST-NET-1 (RFC 5737): no interface of this machine has it */
    reset();
    EXPECT(kvs_net_listen("192.0.2.1", 0, &fd, &port, &err), KVS_ERR_IO,
           "cannot listen on 192.0.2.1:0: cannot assign requested address");

    reset();
    EXPECT(kvs_net_accept(0, 100, NULL, &err), KVS_ERR_ARG, "kvs_net_accept: fd is NULL");
    reset();
    EXPECT(kvs_net_accept(0, 0, &fd, &err), KVS_ERR_ARG, "accept timeout must be > 0 ms, got 0");
    /* a socket that is not listening: poll reports it at once and accept refuses it */
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    reset();
    EXPECT(kvs_net_accept(s, 2000, &fd, &err), KVS_ERR_IO, "cannot accept a peer on port 0:");
    CHECK(fd == -1);
    close(s);

    reset();
    EXPECT(kvs_net_connect("127.0.0.1", 1, 100, NULL, &err), KVS_ERR_ARG,
           "kvs_net_connect: fd is NULL");
    reset();
    EXPECT(kvs_net_connect(NULL, 1, 100, &fd, &err), KVS_ERR_ARG, "kvs_net_connect: no host");
    reset();
    EXPECT(kvs_net_connect("", 1, 100, &fd, &err), KVS_ERR_ARG, "kvs_net_connect: no host");
    reset();
    EXPECT(kvs_net_connect("127.0.0.1", 0, 100, &fd, &err), KVS_ERR_ARG,
           "port 0 is out of range 1-65535");
    reset();
    EXPECT(kvs_net_connect("127.0.0.1", 65536, 100, &fd, &err), KVS_ERR_ARG,
           "port 65536 is out of range");
    reset();
    EXPECT(kvs_net_connect("127.0.0.1", 1, 0, &fd, &err), KVS_ERR_ARG,
           "connect timeout must be > 0 ms, got 0");
    reset();
    EXPECT(kvs_net_connect("bad host!", 7001, 100, &fd, &err), KVS_ERR_IO,
           "cannot reach bad host!:7001:");
    CHECK(fd == -1);
}

int main(void)
{
    test_gates();
    test_local_run();
    test_local_no_fds();
    test_forward();
    test_open_args();
    test_send_recv_args();
    test_hello();
    test_wrong_confirmation();
    test_tcp_args();
    return check_summary("test_errors_mpc");
}
