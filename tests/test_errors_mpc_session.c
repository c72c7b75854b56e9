/* The dealer's side of a two-party session (src/mpc/session.c) against parties written by hand
 * (issue 16): a connection that is not a party, a party that says nothing or hangs up, a party
 * that connects twice, and set-up messages a real party never sends (an implausible model
 * shape, another model, a KV text without its terminator, an impossible step plan). The dealer
 * runs kvs_mpc_session_run on a thread, on 127.0.0.1 with plain channels; the test plays both
 * parties with the transport's own calls (src/mpc/net.h) and the message layouts of session.c
 * (shape: 9 u32 then 2 f64, then the 32-byte model hash; plan: 3 u32; KV text: 256 bytes).
 * Party 0 is checked the same way against a hand-written dealer and party 1 (a model whose
 * vocabulary is not the tokenizer's, a --kv text too long for its message). Each case must end
 * the role under test with the documented status and a message naming what was wrong. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "mpc/net.h"
#include "mpc/session.h"

enum { SHAPE_BYTES = 9 * 4 + 2 * 8 + 32, KV_BYTES = 256 };

typedef struct dealer {
    kvs_mpc_session_cfg cfg;
    int port;
    kvs_status st;
    kvs_error err;
    pthread_t t;
} dealer;

static void *dealer_main(void *arg)
{
    dealer *d = arg;
    kvs_mpc_session_result res;
    d->st = kvs_mpc_session_run(&d->cfg, &res, &d->err);
    kvs_mpc_session_result_free(&res);
    return NULL;
}

/* A dealer listening on a free port of 127.0.0.1 (the session closes the listening socket). */
static int dealer_start(dealer *d, int timeout_ms, const uint8_t *expect_hash)
{
    memset(d, 0, sizeof *d);
    d->cfg.role = KVS_MPC_DEALER;
    d->cfg.frac = 12;
    d->cfg.insecure_plain = 1;
    d->cfg.timeout_ms = timeout_ms;
    d->cfg.peer_listen_fd = -1;
    if (expect_hash) {
        memcpy(d->cfg.model_hash, expect_hash, 32);
        d->cfg.has_model_hash = 1;
    }
    int lfd = -1;
    kvs_error err;
    if (kvs_net_listen("127.0.0.1", 0, &lfd, &d->port, &err) != KVS_OK) {
        CHECKF(0, "listen: %s", err.msg);
        return -1;
    }
    d->cfg.dealer_listen_fd[0] = d->cfg.dealer_listen_fd[1] = lfd;
    pthread_create(&d->t, NULL, dealer_main, d);
    return 0;
}

static void dealer_expect(dealer *d, kvs_status want_st, const char *want)
{
    pthread_join(d->t, NULL);
    CHECKF(d->st == want_st && strstr(d->err.msg, want), "status %d (want %d) '%s' (want '%s')",
           (int)d->st, (int)want_st, d->err.msg, want);
}

static int connect_to(const dealer *d)
{
    int fd = -1;
    kvs_error err;
    CHECKF(kvs_net_connect("127.0.0.1", d->port, 2000, &fd, &err) == KVS_OK, "%s", err.msg);
    return fd;
}

static void send_byte(int fd, uint8_t b)
{
    CHECK(send(fd, &b, 1, MSG_NOSIGNAL) == 1);
}

/* Party `role`'s link to the dealer: the role byte, then the channel handshake. */
static kvs_chan *party_link(const dealer *d, int role)
{
    int fd = connect_to(d);
    if (fd < 0)
        return NULL;
    send_byte(fd, (uint8_t)role);
    kvs_chan_params p;
    memset(&p, 0, sizeof p);
    p.insecure_plain = 1;
    p.timeout_ms = 2000;
    p.version = KVS_MPC_PROTOCOL_VERSION;
    p.ring_bits = 64;
    p.frac_bits = 12;
    p.role = role;
    p.peer_role = KVS_CHAN_ROLE_DEALER;
    kvs_chan *c = NULL;
    kvs_error err;
    CHECKF(kvs_chan_open(fd, &p, &c, &err) == KVS_OK, "party %d: %s", role, err.msg);
    return c;
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A small Llama shape; dim overrides the first field. */
static void shape_msg(uint8_t m[SHAPE_BYTES], int dim, uint8_t hash_byte)
{
    const int v[9] = {dim, 8, 1, 1, 1, 4, 4, 8, 0}; /* dim hidden layers heads kv_heads
                                                      * head_dim rot_dim vocab neox */
    for (int i = 0; i < 9; i++)
        put_le(m + 4 * i, (uint32_t)v[i], 4);
    double eps = 1e-5, base = 10000;
    uint64_t u;
    memcpy(&u, &eps, 8);
    put_le(m + 36, u, 8);
    memcpy(&u, &base, 8);
    put_le(m + 44, u, 8);
    memset(m + 52, hash_byte, 32);
}

static void send_msg(kvs_chan *c, const void *b, size_t n)
{
    kvs_error err;
    CHECKF(c && kvs_chan_send(c, KVS_OP_HANDSHAKE, b, n, &err) == KVS_OK &&
               kvs_chan_flush(c, &err) == KVS_OK,
           "%s", c ? err.msg : "no channel");
}

/* Both parties connect; party 1 sends the shape, party 0 the plan and the KV text. */
static void setup_case(const uint8_t *expect_hash, int dim, uint8_t hash_byte,
                       const uint32_t plan[3], const uint8_t *kv, int control,
                       kvs_status want_st, const char *want)
{
    dealer d;
    if (dealer_start(&d, 2000, expect_hash) != 0)
        return;
    kvs_chan *c0 = party_link(&d, 0), *c1 = party_link(&d, 1);
    uint8_t shape[SHAPE_BYTES], pm[12];
    shape_msg(shape, dim, hash_byte);
    send_msg(c1, shape, sizeof shape);
    if (plan) {
        for (int i = 0; i < 3; i++)
            put_le(pm + 4 * i, plan[i], 4);
        send_msg(c0, pm, sizeof pm);
        send_msg(c0, kv, KV_BYTES);
    }
    if (control >= 0) { /* party 0's step control byte: 1 go on, 0 stop */
        const uint8_t go = (uint8_t)control;
        send_msg(c0, &go, 1);
    }
    dealer_expect(&d, want_st, want);
    kvs_chan_close(c0);
    kvs_chan_close(c1);
}

static void test_setup_messages(void)
{
    /* a shape no model has: dim 0 */
    setup_case(NULL, 0, 0, NULL, NULL, -1, KVS_ERR_FORMAT,
               "party 1 sent an implausible model shape (dim 0, hidden 8, layers 1");
    /* the dealer was told which model to expect */
    uint8_t want_hash[32];
    memset(want_hash, 0x11, sizeof want_hash);
    setup_case(want_hash, 4, 0x22, NULL, NULL, -1, KVS_ERR_ARG,
               "party 1 serves another model than expected (model hash differs)");
    /* a KV text that fills its 256 bytes: no terminator */
    uint8_t kv[KV_BYTES];
    memset(kv, 'a', sizeof kv);
    const uint32_t plan[3] = {3, 2, 1};
    setup_case(NULL, 4, 0x22, plan, kv, -1, KVS_ERR_FORMAT,
               "party 0 sent a bad KV configuration");
    /* a prompt longer than the tokens */
    memset(kv, 0, sizeof kv);
    const uint32_t bad_plan[3] = {1, 2, 0};
    setup_case(NULL, 4, 0x22, bad_plan, kv, -1, KVS_ERR_FORMAT,
               "party 0 sent a bad step plan (tokens 1, prompt 2, generate 0)");
    /* a KV text the dealer's own parse refuses (after the secret model's set-up, which only
     * sends) */
    memcpy(kv, "mpcache:budget=2", 17);
    setup_case(NULL, 4, 0x22, plan, kv, -1, KVS_ERR_FORMAT,
               "party 0 sent a KV configuration this role refuses: --kv mpcache:budget=2: "
               "budget=2");
    /* a valid set-up (the full cache), then a step control byte that is neither go nor stop */
    memset(kv, 0, sizeof kv);
    setup_case(NULL, 4, 0x22, plan, kv, 2, KVS_ERR_FORMAT,
               "party 0 sent a bad step control byte");
}

static void test_connections(void)
{
    dealer d;
    /* something that is not a party: its first byte is not a role */
    if (dealer_start(&d, 2000, NULL) == 0) {
        int fd = connect_to(&d);
        send_byte(fd, 7);
        dealer_expect(&d, KVS_ERR_FORMAT, "did not start as a party does (first byte 7, "
                      "expected 0 or 1)");
        close(fd);
    }
    /* a connection closed at once */
    if (dealer_start(&d, 2000, NULL) == 0) {
        close(connect_to(&d));
        dealer_expect(&d, KVS_ERR_IO, "a party connected and closed the connection");
    }
    /* a connection that stays silent past the timeout (0.3 s, reported rounded up) */
    if (dealer_start(&d, 300, NULL) == 0) {
        int fd = connect_to(&d);
        dealer_expect(&d, KVS_ERR_IO, "a party connected but sent nothing within 1 s");
        close(fd);
    }
    /* party 0 twice: the first link is complete, the second claims the same role */
    if (dealer_start(&d, 2000, NULL) == 0) {
        kvs_chan *c0 = party_link(&d, 0);
        int fd = connect_to(&d);
        send_byte(fd, 0);
        dealer_expect(&d, KVS_ERR_FORMAT, "party 0 connected to the dealer twice");
        close(fd);
        kvs_chan_close(c0);
    }
    /* a configuration no role can run with */
    memset(&d, 0, sizeof d);
    d.cfg.role = KVS_MPC_DEALER;
    d.cfg.frac = 12;
    kvs_mpc_session_result res;
    CHECK(kvs_mpc_session_run(&d.cfg, &res, &d.err) == KVS_ERR_ARG &&
          strstr(d.err.msg, "bad session configuration for the dealer"));
}

/* ---- party 0 against a hand-written dealer and party 1 ---- */

typedef struct party0 {
    kvs_mpc_session_cfg cfg;
    kvs_status st;
    kvs_error err;
} party0;

static void *party0_main(void *arg)
{
    party0 *p = arg;
    kvs_mpc_session_result res;
    p->st = kvs_mpc_session_run(&p->cfg, &res, &p->err);
    kvs_mpc_session_result_free(&res);
    return NULL;
}

/* Accepts party 0 on lfd as `role` (the dealer reads party 0's role byte first). */
static kvs_chan *accept_party0(int lfd, int role, const uint8_t *hash)
{
    int fd = -1;
    kvs_error err;
    if (kvs_net_accept(lfd, 2000, &fd, &err) != KVS_OK) {
        CHECKF(0, "accept: %s", err.msg);
        return NULL;
    }
    uint8_t b = 0xff;
    if (role == KVS_CHAN_ROLE_DEALER)
        CHECK(read(fd, &b, 1) == 1 && b == 0);
    kvs_chan_params p;
    memset(&p, 0, sizeof p);
    p.insecure_plain = 1;
    p.timeout_ms = 2000;
    p.version = KVS_MPC_PROTOCOL_VERSION;
    p.ring_bits = 64;
    p.frac_bits = 12;
    p.role = role;
    p.peer_role = 0;
    if (hash)
        memcpy(p.model_hash, hash, 32);
    kvs_chan *c = NULL;
    CHECKF(kvs_chan_open(fd, &p, &c, &err) == KVS_OK, "as %d: %s", role, err.msg);
    return c;
}

/* Party 0 with tokenizer vocabulary vocab and KV text kv meets party 1's model of 8 tokens. */
static void party0_case(int vocab, const char *kv, const char *want)
{
    int ld = -1, lp = -1, dport = 0, pport = 0;
    kvs_error err;
    if (kvs_net_listen("127.0.0.1", 0, &ld, &dport, &err) != KVS_OK ||
        kvs_net_listen("127.0.0.1", 0, &lp, &pport, &err) != KVS_OK) {
        CHECKF(0, "listen: %s", err.msg);
        if (ld >= 0)
            close(ld);
        return;
    }
    static const int32_t toks[3] = {1, 2, 3};
    party0 p;
    memset(&p, 0, sizeof p);
    p.cfg.role = KVS_MPC_P0;
    p.cfg.frac = 12;
    p.cfg.insecure_plain = 1;
    p.cfg.timeout_ms = 2000;
    p.cfg.peer_listen_fd = -1;
    p.cfg.peer_host = p.cfg.dealer_host = "127.0.0.1";
    p.cfg.peer_port = pport;
    p.cfg.dealer_port = dport;
    p.cfg.dealer_listen_fd[0] = p.cfg.dealer_listen_fd[1] = -1;
    memset(p.cfg.model_hash, 0x22, 32);
    p.cfg.tokens = toks;
    p.cfg.n_tokens = 3;
    p.cfg.prompt_len = 2;
    p.cfg.kv_spec = kv;
    p.cfg.stop_token[0] = p.cfg.stop_token[1] = -1;
    p.cfg.vocab = vocab;
    pthread_t t;
    pthread_create(&t, NULL, party0_main, &p);
    kvs_chan *dealer_c = accept_party0(ld, KVS_CHAN_ROLE_DEALER, NULL);
    kvs_chan *p1 = accept_party0(lp, 1, p.cfg.model_hash);
    uint8_t seed[16] = {0}, shape[SHAPE_BYTES];
    send_msg(dealer_c, seed, sizeof seed);
    shape_msg(shape, 4, 0x22);
    send_msg(p1, shape, sizeof shape);
    pthread_join(t, NULL);
    CHECKF(p.st == KVS_ERR_ARG && strstr(p.err.msg, want), "status %d '%s' (want '%s')",
           (int)p.st, p.err.msg, want);
    kvs_chan_close(dealer_c);
    kvs_chan_close(p1);
    close(ld);
    close(lp);
}

static void test_party0(void)
{
    /* the tokenizer's vocabulary is not the model's */
    party0_case(9, NULL, "party 1's model has a vocabulary of 8 tokens, the tokenizer 9");
    /* a KV text longer than its message */
    char kv[300];
    memset(kv, 'a', sizeof kv - 1);
    kv[sizeof kv - 1] = 0;
    party0_case(8, kv, "--kv: at most 255 characters");
}

static void test_file_hash(void)
{
    uint8_t h[32];
    kvs_error err;
    memset(&err, 0, sizeof err);
    CHECKF(kvs_mpc_file_sha256("/nonexistent/model.gguf", h, &err) == KVS_ERR_IO &&
               strstr(err.msg, "cannot open /nonexistent/model.gguf to hash it: No such file"),
           "'%s'", err.msg);
    /* a directory opens, but does not read */
    memset(&err, 0, sizeof err);
    CHECKF(kvs_mpc_file_sha256("/", h, &err) == KVS_ERR_IO &&
               strstr(err.msg, "cannot read / to hash it"),
           "'%s'", err.msg);
}

int main(void)
{
    test_file_hash();
    test_connections();
    test_setup_messages();
    test_party0();
    return check_summary("test_errors_mpc_session");
}
