/* MPCache's claim under the two-party protocol (issue 13's headline table; a benchmark, not a
 * test): the cost of one decoded token after a context of T tokens, for the full cache, the
 * token-level dynamic baseline (top-k over every cached token, LongCache-like) and MPCache with
 * its optimisations added one at a time (the paper's Fig. 11 steps, as eval --task opcount names
 * them): static step + token-level selection, + clusters (Eq. 1 bound), + the linear score
 * (Eq. 2), + the hierarchy (coarse then fine), + cross-layer sharing.
 *
 * Each configuration runs the three roles on threads (plain loopback channels) with the model's
 * real weights; the context's KV cache and the static step's window sums are party 0's random
 * inputs, not a prefill under the protocol: the protocol's messages, their sizes and rounds are
 * the same whatever the cached values (tests/test_mpc_mpcache.c checks it for two prompts), and
 * a 4096-token prefill under the protocol takes about half an hour here. Then the static step
 * runs on shares (its cost is reported apart: once per prompt) and STEPS tokens are decoded
 * (random tokens, teacher-forced): online bytes (payload both parties send), party 0's rounds,
 * dealer bytes to both parties and party 0's wall time, per token; the LAN and WAN figures are
 * the session's model (rounds x RTT + wire bytes / bandwidth, session.h). The reduction factors
 * are against the full cache of the same run, beside the plaintext op-count model's prediction
 * of the softmax length's reduction (src/eval/opcount.c).
 *   mpc_mpcache_bench MODEL T[,T...] [BUDGET (0.05)] [STEPS (3)] [--json OUT] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eval/opcount.h"
#include "kvslim.h"
#include "model/llama.h"
#include "mpc/fxp.h"
#include "mpc/local.h"
#include "mpc/mpcache.h"
#include "mpc/net.h"
#include "mpc/session.h"

enum { N_CONF = 7, MAX_CTX = 8 };

typedef struct conf {
    const char *name;
    kvs_mpc_kv_mode mode;
    int static_step, levels, share;
    kvs_mp_sim sim;
    kvs_opcount_method oc; /* the op-count model's row */
} conf;

static const conf confs[N_CONF] = {
    {"full", KVS_MPC_KV_FULL, 0, 2, 0, KVS_MP_SIM_LINEAR, KVS_OC_FULL},
    {"token", KVS_MPC_KV_TOKEN, 0, 2, 0, KVS_MP_SIM_LINEAR, KVS_OC_TOKEN},
    {"mp:static+token", KVS_MPC_KV_TOKEN, 1, 2, 0, KVS_MP_SIM_LINEAR, KVS_OC_MP_TOKEN},
    {"mp:+cluster", KVS_MPC_KV_CLUSTER, 1, 1, 0, KVS_MP_SIM_UB, KVS_OC_MP_CLUSTER},
    {"mp:+linear", KVS_MPC_KV_CLUSTER, 1, 1, 0, KVS_MP_SIM_LINEAR, KVS_OC_MP_LINEAR},
    {"mp:+hierarchy", KVS_MPC_KV_CLUSTER, 1, 2, 0, KVS_MP_SIM_LINEAR, KVS_OC_MP_HIERARCHY},
    {"mp:+sharing", KVS_MPC_KV_CLUSTER, 1, 2, 1, KVS_MP_SIM_LINEAR, KVS_OC_MP_SHARING},
};

/* One phase's costs as party 0 sees them (party 1 fills sent[1] and dealer[1]). */
typedef struct cost {
    double sent[2], wire[2], dealer[2], rounds, wall;
} cost;

typedef struct bench_ctx {
    const kvs_model *model;
    kvs_mpc_shape shape;
    int T, steps;
    const conf *cf;
    kvs_mpc_kv_cfg cfg;
    cost decode[3], stat[3]; /* per role */
} bench_ctx;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


/* This role's counters now (a party: its party link and dealer bytes). */
static cost counters(const kvs_mpc *m)
{
    cost c = {{0}, {0}, {0}, 0, now()};
    if (kvs_mpc_is_dealer(m))
        return c;
    kvs_chan_stats s;
    kvs_chan_stats_get(m->peer, &s);
    for (int op = 0; op < KVS_OP_N; op++) {
        c.sent[m->role] += (double)s.sent_payload[op];
        c.wire[m->role] += (double)s.sent_wire[op];
        c.rounds += (double)s.rounds[op];
    }
    c.dealer[m->role] = (double)m->dealer_bytes;
    return c;
}

static cost minus(cost a, cost b)
{
    for (int i = 0; i < 2; i++) {
        a.sent[i] -= b.sent[i];
        a.wire[i] -= b.wire[i];
        a.dealer[i] -= b.dealer[i];
    }
    a.rounds -= b.rounds;
    a.wall -= b.wall;
    return a;
}

/* Party 0's random values in [lo, hi) (fixed point), the same for every configuration. */
static void randoms(uint64_t *state, uint64_t *x, size_t n, double lo, double hi, int frac)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
        const double u = (double)(*state >> 11) / 9007199254740992.0;
        x[i] = kvs_fx_encode(lo + (hi - lo) * u, frac);
    }
}

/* The context: T cached rows of keys and values per layer and the window sums, party 0's. */
static kvs_status fill(kvs_mpc *m, kvs_mpc_llama *L, int T, kvs_error *err)
{
    const size_t kvd = (size_t)L->s.n_kv_heads * L->s.head_dim, n = (size_t)T * kvd;
    const int p0 = m->role == KVS_MPC_P0;
    uint64_t *x = malloc(sizeof *x * (n + 1)), rng = 12345;
    if (!x)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the context");
    kvs_status st = KVS_OK;
    for (int l = 0; l < L->s.n_layers && st == KVS_OK; l++) {
        kvs_mpc_layer *Ly = &L->layers[l];
        for (int kv = 0; kv < 2 && st == KVS_OK; kv++) {
            if (p0)
                randoms(&rng, x, n, -1, 1, m->frac);
            st = kvs_mpc_input(m, 0, p0 ? x : NULL, n, x, err);
            if (st == KVS_OK)
                st = kvs_mpc_cache_append(m, KVS_OP_INPUT, kv ? &Ly->v : &Ly->k,
                                          kvs_mpc_is_dealer(m) ? NULL : x, (size_t)T, err);
        }
        uint64_t *win = L->sel ? L->sel->layers[l].win : NULL;
        const size_t nw = (size_t)L->s.n_kv_heads * (size_t)T;
        if (st == KVS_OK && win) { /* window sums: in [0, 1) */
            if (p0)
                randoms(&rng, x, nw, 0, 1, m->frac);
            st = kvs_mpc_input(m, 0, p0 ? x : NULL, nw, x, err);
            if (!kvs_mpc_is_dealer(m))
                memcpy(win, x, sizeof *x * nw);
        }
    }
    L->pos = T;
    free(x);
    return st;
}

static kvs_status program(kvs_mpc *m, void *vctx, kvs_error *err)
{
    bench_ctx *c = vctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    if (st != KVS_OK)
        return st;
    if (c->cf->mode != KVS_MPC_KV_FULL || c->cf->static_step)
        st = kvs_mpc_sel_attach(&L, &c->cfg, c->T, err);
    if (st == KVS_OK)
        st = fill(m, &L, c->T, err);
    cost a = {{0}, {0}, {0}, 0, 0};
    if (st == KVS_OK && L.sel && !L.sel->compressed) {
        if ((st = kvs_mpc_barrier(m, err)) == KVS_OK)
            a = counters(m);
        if (st == KVS_OK && (st = kvs_mpc_sel_compress(m, &L, err)) == KVS_OK)
            c->stat[m->role] = minus(counters(m), a);
    }
    uint64_t *logits = malloc(sizeof *logits * (size_t)c->shape.vocab), rng = 99;
    if (st == KVS_OK && !logits)
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    if (st == KVS_OK && (st = kvs_mpc_barrier(m, err)) == KVS_OK)
        a = counters(m);
    for (int e = 0; e < c->steps && st == KVS_OK; e++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        const int32_t tok = (int32_t)((rng >> 33) % (uint64_t)c->shape.vocab);
        st = kvs_mpc_llama_step(m, &L, tok, kvs_mpc_is_dealer(m) ? NULL : logits, err);
    }
    if (st == KVS_OK && (st = kvs_mpc_barrier(m, err)) == KVS_OK)
        c->decode[m->role] = minus(counters(m), a);
    free(logits);
    kvs_mpc_llama_free(&L);
    return st;
}

/* Both parties' view of one phase, per token. */
typedef struct row {
    double online, wire, rounds, dealer, wall, lan, wan;
} row;

static row per_token(const cost *c, double n)
{
    row r = {(c[0].sent[0] + c[1].sent[1]) / n, (c[0].wire[0] + c[1].wire[1]) / n,
             c[0].rounds / n, (c[0].dealer[0] + c[1].dealer[1]) / n, c[0].wall / n, 0, 0};
    r.lan = kvs_mpc_model_seconds(&kvs_mpc_lan, r.rounds, r.wire);
    r.wan = kvs_mpc_model_seconds(&kvs_mpc_wan, r.rounds, r.wire);
    return r;
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int ac = 0;
    char *av[8];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (ac < 8)
            av[ac++] = argv[i];
    }
    if (ac < 2) {
        fprintf(stderr, "usage: mpc_mpcache_bench MODEL T[,T...] [BUDGET] [STEPS] [--json OUT]\n");
        return 2;
    }
    int ctx[MAX_CTX], nctx = 0;
    for (char *p = av[1]; *p && nctx < MAX_CTX;) {
        ctx[nctx++] = (int)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    const double budget = ac > 2 ? atof(av[2]) : 0.05;
    const int steps = ac > 3 ? atoi(av[3]) : 3;
    kvs_error err = {0};
    kvs_model *model = NULL;
    if (kvs_model_load(av[0], &model, &err) != KVS_OK) {
        fprintf(stderr, "mpc_mpcache_bench: %s\n", err.msg);
        return 1;
    }
    static bench_ctx c;
    c.model = model;
    c.steps = steps;
    kvs_mpc_shape_of(model, &c.shape);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "mpc_mpcache_bench: cannot write %s\n", json);
        return 1;
    }
    if (jf)
        fprintf(jf, "{\"model\": \"%s\", \"budget\": %g, \"steps\": %d, \"rows\": [\n", av[0],
                budget, steps);
    const int nl = c.shape.n_layers;
    for (int ci = 0; ci < nctx; ci++) {
        c.T = ctx[ci];
        printf("\n%s, context %d, budget %g (keep 0.25, s1 32, s2 16; sharing skips %d layers), "
               "per decoded token (mean of %d), loopback, 2 shared cores\n", av[0], c.T, budget,
               nl > 3 ? 2 : 0, steps);
        printf("%-16s %11s %7s %11s %8s %8s %8s | %7s %7s %7s %7s %7s | %10s %7s %9s\n",
               "method", "online KiB", "rounds", "dealer MiB", "wall s", "LAN s", "WAN s",
               "comm /", "rounds/", "wall /", "LAN /", "WAN /", "model sm /", "static", "static s");
        row full = {0};
        kvs_opcount_input oi = {.shape = {nl, c.shape.n_heads, c.shape.n_kv_heads,
                                          c.shape.head_dim},
                                .ctx = c.T, .budget = budget, .tail = 1,
                                .cfg = kvs_mp_cfg_default()};
        oi.cfg.skip = nl > 3 ? 2 : 0;
        kvs_opcount_row oc[KVS_OC_N_METHODS];
        if (kvs_opcount_rows(&oi, oc, &err) != KVS_OK) {
            fprintf(stderr, "mpc_mpcache_bench: %s\n", err.msg);
            return 1;
        }
        for (int k = 0; k < N_CONF; k++) {
            const conf *cf = &confs[k];
            c.cf = cf;
            c.cfg = kvs_mpc_kv_default(cf->mode);
            c.cfg.static_step = cf->static_step;
            c.cfg.budget = budget;
            c.cfg.mp.levels = cf->levels;
            c.cfg.mp.sim = cf->sim;
            c.cfg.mp.share = cf->share;
            c.cfg.mp.skip = nl > 3 ? 2 : 0;
            memset(c.decode, 0, sizeof c.decode);
            memset(c.stat, 0, sizeof c.stat);
            kvs_mpc_local_cfg lc = {.frac = 16, .insecure_plain = 1, .corr_seed = {{7}, {8}},
                                    .own_seed = {{9}, {10}, {11}}, .timeout_ms = 1200000};
            kvs_mpc_local_result res[3];
            if (kvs_mpc_run_local(program, &c, &lc, res, &err) != KVS_OK) {
                fprintf(stderr, "mpc_mpcache_bench: %s at T %d: %s\n", cf->name, c.T, err.msg);
                return 1;
            }
            for (int r = 0; r < 3; r++)
                kvs_mpc_local_result_free(&res[r]);
            c.decode[0].sent[1] = c.decode[1].sent[1];
            c.decode[0].wire[1] = c.decode[1].wire[1];
            c.decode[0].dealer[1] = c.decode[1].dealer[1];
            c.stat[0].sent[1] = c.stat[1].sent[1];
            c.stat[0].wire[1] = c.stat[1].wire[1];
            c.stat[0].dealer[1] = c.stat[1].dealer[1];
            const row r = per_token(c.decode, steps), s = per_token(c.stat, 1);
            if (k == 0)
                full = r;
            const double lat_lan = r.wall + r.lan, lat_wan = r.wall + r.wan;
            const double sm = (double)oc[KVS_OC_FULL].softmax_len / (double)oc[cf->oc].softmax_len;
            printf("%-16s %11.1f %7.0f %11.2f %8.3f %8.4f %8.2f | %6.2fx %6.2fx %6.2fx %6.2fx "
                   "%6.2fx | %9.2fx %6.1fM %9.2f\n", cf->name, r.online / 1024, r.rounds,
                   r.dealer / 1048576, r.wall, r.lan, r.wan, full.online / r.online,
                   full.rounds / r.rounds, full.wall / r.wall,
                   (full.wall + full.lan) / lat_lan, (full.wall + full.wan) / lat_wan, sm,
                   s.online / 1048576, s.wall);
            fflush(stdout);
            if (jf)
                fprintf(jf, "%s{\"ctx\": %d, \"method\": \"%s\", \"online_bytes\": %.0f, "
                        "\"wire_bytes\": %.0f, \"rounds\": %.1f, \"dealer_bytes\": %.0f, "
                        "\"wall_s\": %.4f, \"lan_s\": %.5f, \"wan_s\": %.4f, "
                        "\"comm_reduction\": %.3f, \"lan_latency_reduction\": %.3f, "
                        "\"wan_latency_reduction\": %.3f, \"wall_reduction\": %.3f, "
                        "\"model_softmax_reduction\": %.3f, \"static_online_bytes\": %.0f, "
                        "\"static_rounds\": %.0f, \"static_dealer_bytes\": %.0f, "
                        "\"static_wall_s\": %.3f}", ci || k ? ",\n" : "", c.T, cf->name,
                        r.online, r.wire, r.rounds, r.dealer, r.wall, r.lan, r.wan,
                        full.online / r.online, (full.wall + full.lan) / lat_lan,
                        (full.wall + full.wan) / lat_wan, full.wall / r.wall, sm, s.online,
                        s.rounds, s.dealer, s.wall);
        }
    }
    if (jf) {
        fprintf(jf, "\n]}\n");
        fclose(jf);
    }
    printf("\ncomm / rounds / wall: the full cache's over the method's (larger is cheaper); LAN / "
           "WAN: wall + the network model, the full cache's over the method's; model sm /: the "
           "op-count model's softmax-length reduction; static: the static step's online MiB and "
           "wall s, once per prompt\n");
    kvs_model_free(model);
    return 0;
}
