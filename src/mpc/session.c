/* One role of a two-party inference session over TCP (session.h). */
#include "mpc/session.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "mpc/forward.h"
#include "mpc/mpcache.h"

const kvs_mpc_netmodel kvs_mpc_lan = {"LAN", 377e6, 0.3e-3};
const kvs_mpc_netmodel kvs_mpc_wan = {"WAN", 100e6 / 8, 40e-3};

double kvs_mpc_model_seconds(const kvs_mpc_netmodel *net, double rounds, double bytes)
{
    return rounds * net->rtt_s + bytes / net->bytes_per_s;
}

kvs_status kvs_mpc_file_sha256(const char *path, uint8_t out[32], kvs_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvs_fail(err, KVS_ERR_IO, "cannot open %s to hash it: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    const size_t chunk = (size_t)1 << 20;
    unsigned char *buf = malloc(chunk);
    kvs_status st = KVS_OK;
    if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        st = kvs_fail(err, KVS_ERR_NOMEM, "cannot start a SHA-256 of %s", path);
    } else {
        size_t n;
        while ((n = fread(buf, 1, chunk, f)) > 0)
            if (EVP_DigestUpdate(ctx, buf, n) != 1)
                break;
        unsigned int len = 0;
        if (ferror(f))
            st = kvs_fail(err, KVS_ERR_IO, "cannot read %s to hash it", path);
        else if (EVP_DigestFinal_ex(ctx, out, &len) != 1 || len != 32)
            st = kvs_fail(err, KVS_ERR_IO, "cannot finish the SHA-256 of %s", path);
    }
    free(buf);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return st;
}

void kvs_mpc_session_result_free(kvs_mpc_session_result *res)
{
    if (!res)
        return;
    free(res->generated);
    res->generated = NULL;
    res->n_generated = 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *role_name(int r)
{
    return r == 0 ? "party 0" : r == 1 ? "party 1" : "the dealer";
}

/* ---- little-endian encoding of the setup messages ---- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_f64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put_u64(p, v);
}

static double get_f64(const uint8_t *p)
{
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

/* The shape message: 9 int32, 2 doubles, the model hash. */
#define SHAPE_MSG (9 * 4 + 2 * 8 + 32)

static void shape_encode(const kvs_mpc_shape *s, const uint8_t hash[32], uint8_t *p)
{
    const int v[9] = {s->dim, s->hidden, s->n_layers, s->n_heads, s->n_kv_heads,
                      s->head_dim, s->rot_dim, s->vocab, s->neox};
    for (int i = 0; i < 9; i++)
        put_u32(p + 4 * i, (uint32_t)v[i]);
    put_f64(p + 36, s->eps);
    put_f64(p + 44, s->rope_base);
    memcpy(p + 52, hash, 32);
}

static kvs_status shape_decode(const uint8_t *p, kvs_mpc_shape *s, uint8_t hash[32],
                               kvs_error *err)
{
    int v[9];
    for (int i = 0; i < 9; i++)
        v[i] = (int)get_u32(p + 4 * i);
    *s = (kvs_mpc_shape){.dim = v[0], .hidden = v[1], .n_layers = v[2], .n_heads = v[3],
                         .n_kv_heads = v[4], .head_dim = v[5], .rot_dim = v[6], .vocab = v[7],
                         .neox = v[8], .eps = get_f64(p + 36), .rope_base = get_f64(p + 44)};
    memcpy(hash, p + 52, 32);
    const int lim = 1 << 20;
    if (s->dim < 1 || s->dim > lim || s->hidden < 1 || s->hidden > lim || s->n_layers < 1 ||
        s->n_layers > 4096 || s->n_heads < 1 || s->n_heads > 4096 || s->n_kv_heads < 1 ||
        s->n_kv_heads > s->n_heads || s->n_heads % s->n_kv_heads || s->head_dim < 1 ||
        s->head_dim > lim || s->rot_dim < 0 || s->rot_dim > s->head_dim || s->vocab < 1 ||
        s->vocab > (1 << 24) || (s->neox != 0 && s->neox != 1) || !(s->eps > 0) ||
        !(s->eps < 1) || !(s->rope_base > 0) || !(s->rope_base < 1e12))
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "party 1 sent an implausible model shape (dim %d, hidden %d, layers %d, "
                        "heads %d/%d, head_dim %d, vocab %d)", s->dim, s->hidden, s->n_layers,
                        s->n_heads, s->n_kv_heads, s->head_dim, s->vocab);
    return KVS_OK;
}

/* ---- connections ---- */

static kvs_status open_link(const kvs_mpc_session_cfg *cfg, int fd, int peer_role,
                            const uint8_t *psk, int party_link, kvs_chan **c, kvs_error *err)
{
    kvs_chan_params p = {.insecure_plain = cfg->insecure_plain, .psk = psk,
                         .timeout_ms = cfg->timeout_ms,
                         .version = cfg->test_version ? cfg->test_version
                                                      : KVS_MPC_PROTOCOL_VERSION, .ring_bits = 64,
                         .frac_bits = cfg->frac, .role = (int)cfg->role, .peer_role = peer_role};
    if (party_link)
        memcpy(p.model_hash, cfg->model_hash, 32);
    kvs_status st = kvs_chan_open(fd, &p, c, err);
    if (st != KVS_OK) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        kvs_fail(err, st, "link to %s: %s", role_name(peer_role), msg);
    }
    return st;
}

/* Accepts on lfd, or connects to host:port; names the peer in errors. */
static kvs_status get_socket(const kvs_mpc_session_cfg *cfg, int lfd, const char *host,
                             int port, int peer_role, int *fd, kvs_error *err)
{
    kvs_status st = lfd >= 0 ? kvs_net_accept(lfd, cfg->timeout_ms, fd, err)
                             : kvs_net_connect(host, port, cfg->timeout_ms, fd, err);
    if (st != KVS_OK) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        kvs_fail(err, st, "waiting for %s: %s", role_name(peer_role), msg);
    }
    return st;
}

/* The dealer reads a connecting party's role byte (session.h). */
static kvs_status read_role_byte(int fd, int timeout_ms, int *role, kvs_error *err)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r;
    do
        r = poll(&pf, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return kvs_fail(err, KVS_ERR_IO, "a party connected but sent nothing within %d s",
                        (timeout_ms + 999) / 1000);
    uint8_t b = 0xff;
    ssize_t n;
    do
        n = read(fd, &b, 1);
    while (n < 0 && errno == EINTR);
    if (r < 0 || n != 1)
        return kvs_fail(err, KVS_ERR_IO, "a party connected and closed the connection");
    if (b > 1)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "a connection to the dealer's port did not start as a party does "
                        "(first byte %u, expected 0 or 1)", (unsigned)b);
    *role = b;
    return KVS_OK;
}

static kvs_status send_role_byte(int fd, int role, kvs_error *err)
{
    uint8_t b = (uint8_t)role;
    ssize_t n;
    do
        n = send(fd, &b, 1, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != 1)
        return kvs_fail(err, KVS_ERR_IO, "cannot write to the dealer's connection: %s",
                        strerror(errno));
    return KVS_OK;
}

static kvs_status connect_all(const kvs_mpc_session_cfg *cfg, kvs_mpc *m, kvs_error *err)
{
    kvs_status st = KVS_OK;
    int fd = -1;
    if (cfg->role == KVS_MPC_DEALER) {
        for (int k = 0; k < 2 && st == KVS_OK; k++) {
            int role = -1;
            if ((st = get_socket(cfg, cfg->dealer_listen_fd[k], NULL, 0, k, &fd, err)) != KVS_OK)
                break;
            if ((st = read_role_byte(fd, cfg->timeout_ms, &role, err)) != KVS_OK) {
                close(fd);
                break;
            }
            if (m->to[role]) {
                close(fd);
                return kvs_fail(err, KVS_ERR_FORMAT, "%s connected to the dealer twice",
                                role_name(role));
            }
            st = open_link(cfg, fd, role, cfg->psk_to[role], 0, &m->to[role], err);
        }
        return st;
    }
    const int me = (int)cfg->role;
    if ((st = get_socket(cfg, -1, cfg->dealer_host, cfg->dealer_port, KVS_MPC_DEALER, &fd,
                         err)) != KVS_OK)
        return st;
    if ((st = send_role_byte(fd, me, err)) != KVS_OK) {
        close(fd);
        return st;
    }
    if ((st = open_link(cfg, fd, KVS_MPC_DEALER, cfg->psk_dealer, 0, &m->dealer, err)) !=
        KVS_OK)
        return st;
    if ((st = get_socket(cfg, cfg->peer_listen_fd, cfg->peer_host, cfg->peer_port, 1 - me, &fd,
                         err)) != KVS_OK)
        return st;
    return open_link(cfg, fd, 1 - me, cfg->psk_peer, 1, &m->peer, err);
}

/* ---- accounting ---- */

typedef struct snap {
    kvs_chan_stats peer, dealer;
    double t;
} snap;

static void take_snap(const kvs_mpc *m, snap *s)
{
    kvs_chan_stats_get(m->peer, &s->peer);
    kvs_chan_stats_get(m->dealer, &s->dealer);
    s->t = now_s();
}

/* Party 0's (or 1's) view of a phase: the difference of two snapshots. */
static void phase_from(const snap *a, const snap *b, int me, kvs_mpc_phase_cost *p)
{
    p->wall_s = b->t - a->t;
    for (int op = 0; op < KVS_OP_N; op++) {
        const uint64_t sp = b->peer.sent_payload[op] - a->peer.sent_payload[op],
                       rp = b->peer.recv_payload[op] - a->peer.recv_payload[op];
        p->op_bytes[op] = sp + rp;
        p->online_payload += sp + rp;
        p->online_sent[me] += sp;
        p->online_sent[1 - me] += rp;
        p->online_wire += b->peer.sent_wire[op] - a->peer.sent_wire[op] + b->peer.recv_wire[op] -
                          a->peer.recv_wire[op];
        p->online_msgs += b->peer.msgs_sent[op] - a->peer.msgs_sent[op] +
                          b->peer.msgs_recv[op] - a->peer.msgs_recv[op];
        p->op_rounds[op] = b->peer.rounds[op] - a->peer.rounds[op];
        p->rounds += p->op_rounds[op];
        p->op_dealer[op] = b->dealer.recv_payload[op] - a->dealer.recv_payload[op];
        p->dealer_payload[me] += p->op_dealer[op];
        p->dealer_wire[me] += b->dealer.recv_wire[op] - a->dealer.recv_wire[op];
    }
}

/* Party 1's report: per phase its dealer payload, dealer wire bytes, rounds and dealer payload
 * per op. */
#define REPORT_PHASE ((3 + KVS_OP_N) * 8)
#define REPORT_MSG (KVS_MPC_PHASE_N * REPORT_PHASE)

/* ---- the step loop ---- */

static kvs_status control_send(kvs_mpc *m, uint8_t go, kvs_error *err)
{
    kvs_status st = kvs_chan_send(m->peer, KVS_OP_HANDSHAKE, &go, 1, err);
    if (st == KVS_OK)
        st = kvs_chan_send(m->dealer, KVS_OP_HANDSHAKE, &go, 1, err);
    if (st == KVS_OK)
        st = kvs_chan_flush(m->peer, err);
    if (st == KVS_OK)
        st = kvs_chan_flush(m->dealer, err);
    return st;
}

static kvs_status control_recv(kvs_mpc *m, uint8_t *go, kvs_error *err)
{
    kvs_chan *c = kvs_mpc_is_dealer(m) ? m->to[0] : m->peer;
    kvs_status st = kvs_chan_recv(c, KVS_OP_HANDSHAKE, go, 1, err);
    if (st == KVS_OK && *go > 1)
        st = kvs_fail(err, KVS_ERR_FORMAT, "party 0 sent a bad step control byte");
    return st;
}

/* The greedy choice of a step: the argmax of the secret logits (the first of ties), computed on
 * shares and revealed to party 0 alone, which learns the token and nothing else of the logits
 * (a logit difference stays below 2^11, so the comparisons take frac + 12 bits). *tok: party 0
 * only. */
static kvs_status next_token(kvs_mpc *m, const uint64_t *sh, int V, int32_t *tok,
                             kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    uint64_t idx = 0, out = 0;
    kvs_status st = kvs_mpc_argmax_rows(m, KVS_OP_ARGMAX, dealer ? NULL : sh, 1, (size_t)V,
                                        m->frac + 12, dealer ? NULL : &idx, NULL, err);
    if (st == KVS_OK)
        st = kvs_mpc_reveal(m, KVS_OP_ARGMAX, 0, dealer ? NULL : &idx, 1, &out, err);
    if (st == KVS_OK && m->role == KVS_MPC_P0) {
        if (out >= (uint64_t)V)
            return kvs_fail(err, KVS_ERR_FORMAT, "the revealed token %llu is outside the "
                            "vocabulary", (unsigned long long)out);
        *tok = (int32_t)out;
    }
    return st;
}

/* The tokens of the forward call that starts at token i: the prompt in blocks (a function of
 * public numbers, so every role agrees), then one token per step. */
static int call_tokens(const kvs_mpc_llama *L, int i, int P)
{
    return i < P ? kvs_mpc_llama_block(&L->s, i, P - i) : 1;
}

/* Party 0's loop: forward calls, the secure argmax, callbacks. Snapshots at the phase ends. */
static kvs_status loop_p0(const kvs_mpc_session_cfg *cfg, kvs_mpc *m, kvs_mpc_llama *L,
                          uint64_t *sh, kvs_mpc_session_result *res, snap *s,
                          kvs_error *err)
{
    const int T = cfg->n_tokens, P = cfg->prompt_len, N = cfg->n_gen, V = L->s.vocab;
    kvs_status st = KVS_OK;
    if (N > 0 && !(res->generated = malloc(sizeof *res->generated * (size_t)N)))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d tokens", N);
    for (int i = 0;;) {
        const int n = call_tokens(L, i, P), last = i + n - 1;
        const int32_t *tok = i < T ? cfg->tokens + i : res->generated + (i - T);
        if ((st = control_send(m, 1, err)) != KVS_OK ||
            (st = kvs_mpc_llama_forward(m, L, tok, n, sh, err)) != KVS_OK)
            return st;
        res->phase[i < P ? KVS_MPC_PHASE_PREFILL : KVS_MPC_PHASE_DECODE].steps += (uint64_t)n;
        i = last + 1;
        int32_t best = -1;
        if (last >= P - 1 && (st = next_token(m, sh, V, &best, err)) != KVS_OK)
            return st;
        if (last == P - 1)
            take_snap(m, &s[KVS_MPC_PHASE_PREFILL]);
        if (last < T - 1) {
            if (last >= P - 1) {
                res->forced++;
                res->forced_top1 += best == cfg->tokens[last + 1];
            }
            continue;
        }
        if (last == T - 1 && cfg->on_prefilled)
            cfg->on_prefilled(cfg->cb_ctx);
        if (res->n_generated >= N)
            break;
        const int32_t next = best;
        if (next == cfg->stop_token[0] || next == cfg->stop_token[1]) {
            res->stopped_at_end = 1;
            break;
        }
        res->generated[res->n_generated++] = next;
        if (cfg->on_token)
            cfg->on_token(cfg->cb_ctx, next);
        if (res->n_generated >= N)
            break;
    }
    return control_send(m, 0, err);
}

/* Party 1's and the dealer's loop: forward calls until party 0 says stop. */
static kvs_status loop_other(const kvs_mpc_session_cfg *cfg, kvs_mpc *m, kvs_mpc_llama *L,
                             int P, uint64_t *sh, kvs_mpc_session_result *res, snap *s,
                             kvs_error *err)
{
    kvs_status st;
    for (int i = 0, call = 1;; call++) {
        uint8_t go = 0;
        if ((st = control_recv(m, &go, err)) != KVS_OK)
            return st;
        if (!go)
            return KVS_OK;
        if (cfg->test_kill_step > 0 && call >= cfg->test_kill_step)
            raise(SIGKILL); /* tests only: a server or a dealer dying mid-run */
        const int32_t none = -1;
        const int n = call_tokens(L, i, P), last = i + n - 1;
        if ((st = kvs_mpc_llama_forward(m, L, &none, n, sh, err)) != KVS_OK)
            return st;
        res->phase[i < P ? KVS_MPC_PHASE_PREFILL : KVS_MPC_PHASE_DECODE].steps += (uint64_t)n;
        i = last + 1;
        int32_t unused;
        if (last >= P - 1 && (st = next_token(m, sh, L->s.vocab, &unused, err)) != KVS_OK)
            return st;
        if (last == P - 1)
            take_snap(m, &s[KVS_MPC_PHASE_PREFILL]);
    }
}

/* ---- the session ---- */

enum { KV_MSG = 256 }; /* the KV configuration's message: a NUL-padded --kv text */

static kvs_status setup_messages(const kvs_mpc_session_cfg *cfg, kvs_mpc *m,
                                 kvs_mpc_shape *shape, uint32_t plan[3], char kv[KV_MSG],
                                 kvs_error *err)
{
    kvs_status st = KVS_OK;
    uint8_t seed[16], msg[SHAPE_MSG], hash[32], pm[12];
    /* 1. correlated-randomness seeds */
    if (cfg->role == KVS_MPC_DEALER) {
        for (int b = 0; b < 2 && st == KVS_OK; b++) {
            if ((st = kvs_prg_os_seed(seed, err)) != KVS_OK ||
                (st = kvs_prg_new(seed, &m->corr[b], err)) != KVS_OK)
                break;
            st = kvs_chan_send(m->to[b], KVS_OP_HANDSHAKE, seed, sizeof seed, err);
            if (st == KVS_OK)
                st = kvs_chan_flush(m->to[b], err);
        }
    } else {
        const int me = (int)cfg->role;
        if ((st = kvs_chan_recv(m->dealer, KVS_OP_HANDSHAKE, seed, sizeof seed, err)) == KVS_OK)
            st = kvs_prg_new(seed, &m->corr[me], err);
    }
    memset(seed, 0, sizeof seed);
    if (st != KVS_OK)
        return st;
    /* 2. the shape, from party 1 */
    if (cfg->role == KVS_MPC_P1) {
        shape_encode(shape, cfg->model_hash, msg);
        if ((st = kvs_chan_send(m->peer, KVS_OP_HANDSHAKE, msg, sizeof msg, err)) != KVS_OK ||
            (st = kvs_chan_send(m->dealer, KVS_OP_HANDSHAKE, msg, sizeof msg, err)) != KVS_OK ||
            (st = kvs_chan_flush(m->dealer, err)) != KVS_OK)
            return st;
    } else {
        kvs_chan *c = cfg->role == KVS_MPC_DEALER ? m->to[1] : m->peer;
        if ((st = kvs_chan_recv(c, KVS_OP_HANDSHAKE, msg, sizeof msg, err)) != KVS_OK ||
            (st = shape_decode(msg, shape, hash, err)) != KVS_OK)
            return st;
        if ((cfg->role == KVS_MPC_P0 || cfg->has_model_hash) &&
            memcmp(hash, cfg->model_hash, 32) != 0)
            return kvs_fail(err, KVS_ERR_ARG,
                            "party 1 serves another model than expected (model hash differs)");
        if (cfg->role == KVS_MPC_P0 && cfg->vocab > 0 && shape->vocab != cfg->vocab)
            return kvs_fail(err, KVS_ERR_ARG,
                            "party 1's model has a vocabulary of %d tokens, the tokenizer %d",
                            shape->vocab, cfg->vocab);
    }
    /* 3. the step plan, from party 0 */
    if (cfg->role == KVS_MPC_P0) {
        for (int b = 0; b < 3; b++)
            put_u32(pm + 4 * b, plan[b]);
        memset(kv, 0, KV_MSG);
        if (cfg->kv_spec) {
            if (strlen(cfg->kv_spec) >= KV_MSG)
                return kvs_fail(err, KVS_ERR_ARG, "--kv: at most %d characters", KV_MSG - 1);
            memcpy(kv, cfg->kv_spec, strlen(cfg->kv_spec));
        }
        if ((st = kvs_chan_send(m->peer, KVS_OP_HANDSHAKE, pm, sizeof pm, err)) != KVS_OK ||
            (st = kvs_chan_send(m->peer, KVS_OP_HANDSHAKE, kv, KV_MSG, err)) != KVS_OK ||
            (st = kvs_chan_send(m->dealer, KVS_OP_HANDSHAKE, pm, sizeof pm, err)) != KVS_OK ||
            (st = kvs_chan_send(m->dealer, KVS_OP_HANDSHAKE, kv, KV_MSG, err)) != KVS_OK ||
            (st = kvs_chan_flush(m->dealer, err)) != KVS_OK)
            return st;
    } else {
        kvs_chan *c = cfg->role == KVS_MPC_DEALER ? m->to[0] : m->peer;
        if ((st = kvs_chan_recv(c, KVS_OP_HANDSHAKE, pm, sizeof pm, err)) != KVS_OK ||
            (st = kvs_chan_recv(c, KVS_OP_HANDSHAKE, kv, KV_MSG, err)) != KVS_OK)
            return st;
        if (!memchr(kv, 0, KV_MSG))
            return kvs_fail(err, KVS_ERR_FORMAT, "party 0 sent a bad KV configuration");
        for (int b = 0; b < 3; b++)
            plan[b] = get_u32(pm + 4 * b);
        if (plan[0] < 1 || plan[0] > (1u << 24) || plan[1] < 1 || plan[1] > plan[0] ||
            plan[2] > (1u << 24))
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "party 0 sent a bad step plan (tokens %u, prompt %u, generate %u)",
                            plan[0], plan[1], plan[2]);
    }
    return KVS_OK;
}

kvs_status kvs_mpc_session_run(const kvs_mpc_session_cfg *cfg, kvs_mpc_session_result *res,
                               kvs_error *err)
{
    memset(res, 0, sizeof *res);
    if (cfg->timeout_ms <= 0 || cfg->frac < 1 || cfg->frac > 30 ||
        (cfg->role == KVS_MPC_P1 && !cfg->model) ||
        (cfg->role == KVS_MPC_P0 &&
         (!cfg->tokens || cfg->n_tokens < 1 || cfg->prompt_len < 1 ||
          cfg->prompt_len > cfg->n_tokens || cfg->n_gen < 0)))
        return kvs_fail(err, KVS_ERR_ARG, "bad session configuration for %s",
                        role_name((int)cfg->role));
    const double t0 = now_s();
    kvs_mpc m = {.role = cfg->role, .frac = cfg->frac};
    kvs_mpc_llama L;
    kvs_mpc_shape shape;
    memset(&shape, 0, sizeof shape);
    int have_L = 0;
    uint64_t *sh = NULL;
    snap s0, s[KVS_MPC_PHASE_N];
    uint32_t plan[3] = {(uint32_t)cfg->n_tokens, (uint32_t)cfg->prompt_len,
                        (uint32_t)cfg->n_gen};
    char kv[KV_MSG] = {0};
    memset(s, 0, sizeof s);
    memset(&s0, 0, sizeof s0);
    s0.t = t0;
    uint8_t own_seed[16];
    kvs_status st = kvs_prg_os_seed(own_seed, err);
    if (st == KVS_OK)
        st = kvs_prg_new(own_seed, &m.own, err);
    memset(own_seed, 0, sizeof own_seed);
    if (cfg->role == KVS_MPC_P1)
        kvs_mpc_shape_of(cfg->model, &shape);
    if (st == KVS_OK && cfg->role == KVS_MPC_P1) /* before any connection: fail clearly */
        st = kvs_llama_check_plain(cfg->model, "the two-party engine", err);
    if (st == KVS_OK)
        st = connect_all(cfg, &m, err);
    if (st == KVS_OK)
        st = setup_messages(cfg, &m, &shape, plan, kv, err);
    if (st == KVS_OK) {
        st = kvs_mpc_llama_setup(&m, cfg->role == KVS_MPC_P1 ? cfg->model : NULL, &shape,
                                 &L, err);
        have_L = st == KVS_OK;
    }
    if (st == KVS_OK) { /* every role parses the same text: the same selection */
        kvs_mpc_kv_cfg kc;
        st = kvs_mpc_kv_parse(kv, shape.n_layers, &kc, err);
        if (st == KVS_OK && (kc.mode != KVS_MPC_KV_FULL || kc.static_step))
            st = kvs_mpc_sel_attach(&L, &kc, (int)plan[1], err);
        if (st != KVS_OK && cfg->role != KVS_MPC_P0) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            st = kvs_fail(err, KVS_ERR_FORMAT, "party 0 sent a KV configuration this role "
                          "refuses: %s", why);
        }
    }
    res->vocab = shape.vocab;
    res->dim = shape.dim;
    res->n_layers = shape.n_layers;
    if (st == KVS_OK && !kvs_mpc_is_dealer(&m)) {
        sh = malloc(sizeof *sh * (size_t)shape.vocab);
        if (!sh)
            st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d logits", shape.vocab);
    }
    if (st == KVS_OK) {
        take_snap(&m, &s[KVS_MPC_PHASE_SETUP]);
        s[KVS_MPC_PHASE_PREFILL] = s[KVS_MPC_PHASE_SETUP]; /* until the prefill ends */
        if (cfg->role == KVS_MPC_P0)
            st = loop_p0(cfg, &m, &L, sh, res, s, err);
        else
            st = loop_other(cfg, &m, &L, (int)plan[1], sh, res, s, err);
    }
    if (st == KVS_OK) {
        take_snap(&m, &s[KVS_MPC_PHASE_DECODE]);
        const int me = cfg->role == KVS_MPC_P1 ? 1 : 0;
        const snap *from[KVS_MPC_PHASE_N] = {&s0, &s[KVS_MPC_PHASE_SETUP],
                                             &s[KVS_MPC_PHASE_PREFILL]};
        if (!kvs_mpc_is_dealer(&m))
            for (int p = 0; p < KVS_MPC_PHASE_N; p++) {
                uint64_t steps = res->phase[p].steps;
                memset(&res->phase[p], 0, sizeof res->phase[p]);
                res->phase[p].steps = steps;
                phase_from(from[p], &s[p], me, &res->phase[p]);
            }
        /* 6. party 1's counts to party 0 */
        uint8_t rep[REPORT_MSG];
        if (cfg->role == KVS_MPC_P1) {
            for (int p = 0; p < KVS_MPC_PHASE_N; p++) {
                uint8_t *r = rep + REPORT_PHASE * p;
                put_u64(r, res->phase[p].dealer_payload[1]);
                put_u64(r + 8, res->phase[p].dealer_wire[1]);
                put_u64(r + 16, res->phase[p].rounds);
                for (int op = 0; op < KVS_OP_N; op++)
                    put_u64(r + 24 + 8 * op, res->phase[p].op_dealer[op]);
            }
            st = kvs_chan_send(m.peer, KVS_OP_HANDSHAKE, rep, sizeof rep, err);
        } else if (cfg->role == KVS_MPC_P0 &&
                   (st = kvs_chan_recv(m.peer, KVS_OP_HANDSHAKE, rep, sizeof rep, err)) ==
                       KVS_OK) {
            for (int p = 0; p < KVS_MPC_PHASE_N; p++) {
                const uint8_t *r = rep + REPORT_PHASE * p;
                res->phase[p].dealer_payload[1] = get_u64(r);
                res->phase[p].dealer_wire[1] = get_u64(r + 8);
                res->phase[p].rounds_p1 = get_u64(r + 16);
                for (int op = 0; op < KVS_OP_N; op++)
                    res->phase[p].op_dealer[op] += get_u64(r + 24 + 8 * op);
            }
        }
    }
    kvs_chan *all[4] = {m.peer, m.dealer, m.to[0], m.to[1]};
    for (int i = 0; i < 4; i++)
        if (all[i] && st == KVS_OK)
            st = kvs_chan_flush(all[i], err);
    for (int i = 0; i < 4; i++)
        kvs_chan_close(all[i]);
    /* the listening sockets were the session's */
    if (cfg->role != KVS_MPC_DEALER && cfg->peer_listen_fd >= 0)
        close(cfg->peer_listen_fd);
    if (cfg->role == KVS_MPC_DEALER && cfg->dealer_listen_fd[0] >= 0)
        close(cfg->dealer_listen_fd[0]);
    if (cfg->role == KVS_MPC_DEALER && cfg->dealer_listen_fd[1] >= 0 &&
        cfg->dealer_listen_fd[1] != cfg->dealer_listen_fd[0])
        close(cfg->dealer_listen_fd[1]);
    if (have_L)
        kvs_mpc_llama_free(&L);
    free(sh);
    kvs_prg_free(m.own);
    kvs_prg_free(m.corr[0]);
    kvs_prg_free(m.corr[1]);
    res->total_s = now_s() - t0;
    return st;
}
