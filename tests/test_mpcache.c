/* MPCache as a policy (src/policies/mpcache.c) against methods/mpcache.md §7 tests 1-15 and the
 * issue's bad input.
 *
 * Most checks drive the policy's hooks by hand on a store of random keys (a "harness": the
 * prompt appended as one chunk, the window's softmax column sums computed here in double, then
 * decode steps of random q, k, v), so every quantity can be set against the pure reference
 * functions of mpcache_math (themselves tested against fp64 code in test_mpcache_math). Test 1
 * runs the engine on stories260K. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval/opcount.h"
#include "core/random.h"
#include "core/threadpool.h"
#include "fixture.h"
#include "kv/attention.h"
#include "kv/kv_store.h"
#include "policies/mpcache.h"

enum { MAXL = 6, MAXH = 4, MAXD = 16, MAXT = 600 };

typedef struct harness {
    kvs_policy p;
    kvs_store *store;
    int L, H, Hkv, d, P, pos;
    kvs_xoshiro rng;
    float keys[MAXL][MAXT][MAXH * MAXD]; /* every key appended, by position */
    float vals[MAXL][MAXT][MAXH * MAXD];
    float q[MAXL][MAXH * MAXD];          /* the last decode step's queries */
    int slots[MAXL][MAXH][MAXT];          /* the last decode step's selection */
    int n_slots[MAXL][MAXH];
    char err[512];
} harness;

static double urand(kvs_xoshiro *r)
{
    return 2.0 * kvs_random_unit(kvs_xoshiro_next(r)) - 1.0;
}

static void rand_row(harness *x, float *row, int n)
{
    for (int i = 0; i < n; i++)
        row[i] = (float)urand(&x->rng);
}

/* Causal scaled softmax of one query row over keys 0..r of one KV head, summed into colsum. */
static void add_probs(const float *q, const harness *x, int l, int kvh, int r, float *colsum)
{
    double lg[MAXT], mx = -INFINITY, z = 0;
    for (int j = 0; j <= r; j++) {
        double s = 0;
        for (int i = 0; i < x->d; i++)
            s += (double)q[i] * x->keys[l][j][kvh * x->d + i];
        lg[j] = s / sqrt((double)x->d);
        mx = lg[j] > mx ? lg[j] : mx;
    }
    for (int j = 0; j <= r; j++)
        z += lg[j] = exp(lg[j] - mx);
    for (int j = 0; j <= r; j++)
        colsum[j] += (float)(lg[j] / z);
}

/* Starts spec on L layers (H query heads, Hkv KV heads, head_dim d) and prefills P random
 * tokens; wq[l][r] (optional): the window's queries (row r of the prompt, H * d floats).
 * Returns the status; x->err has the message. */
static kvs_status h_start(harness *x, const char *spec, int L, int H, int Hkv, int d, int P,
                          uint64_t seed, void (*shape_keys)(harness *, int l, int t, float *k))
{
    memset(x, 0, sizeof *x);
    kvs_xoshiro_seed(&x->rng, seed);
    x->L = L, x->H = H, x->Hkv = Hkv, x->d = d, x->P = P;
    kvs_error err = {0};
    kvs_status st = kvs_policy_parse(spec, &x->p.spec, &err);
    if (st != KVS_OK) {
        snprintf(x->err, sizeof x->err, "%s", err.msg);
        return st;
    }
    kvs_store_config sc = {L, Hkv, d, MAXT, KVS_F32, 0};
    x->store = kvs_store_new(&sc);
    x->p.type = x->p.spec.type;
    x->p.store = x->store;
    x->p.n_layers = L, x->p.n_heads = H, x->p.n_kv_heads = Hkv, x->p.head_dim = d;
    x->p.n_prompt = P;
    x->p.budget = kvs_policy_budget_slots(&x->p.spec, P);
    x->p.in_prompt = 1;
    if ((st = x->p.type->start(&x->p, &err)) != KVS_OK) {
        snprintf(x->err, sizeof x->err, "%s", err.msg);
        return st;
    }
    static float q[MAXT][MAXH * MAXD], colsum[MAXH * MAXT], kp[MAXT * MAXH * MAXD],
        vp[MAXT * MAXH * MAXD], qp[MAXT * MAXH * MAXD];
    static int32_t pos[MAXT];
    for (int t = 0; t < P; t++)
        pos[t] = t;
    for (int l = 0; l < L && st == KVS_OK; l++) {
        for (int t = 0; t < P; t++) {
            rand_row(x, x->keys[l][t], Hkv * d);
            if (shape_keys)
                shape_keys(x, l, t, x->keys[l][t]);
            rand_row(x, x->vals[l][t], Hkv * d);
            rand_row(x, q[t], H * d);
        }
        for (int t = 0; t < P; t++) { /* packed rows for the store */
            memcpy(kp + (size_t)t * Hkv * d, x->keys[l][t], sizeof(float) * (size_t)Hkv * d);
            memcpy(vp + (size_t)t * Hkv * d, x->vals[l][t], sizeof(float) * (size_t)Hkv * d);
        }
        st = kvs_store_append(x->store, l, P, kp, vp, pos, &err);
        memset(colsum, 0, sizeof colsum);
        int any = 0;
        for (int r = 0; r < P; r++)
            if (x->p.type->wants_row(&x->p, l, r)) {
                any = 1;
                for (int h = 0; h < H; h++)
                    add_probs(q[r] + h * d, x, l, h / (H / Hkv), r, colsum + h * P);
            }
        for (int t = 0; t < P; t++)
            memcpy(qp + (size_t)t * H * d, q[t], sizeof(float) * (size_t)H * d);
        kvs_chunk c = {P, qp, kp, vp, pos, any ? colsum : NULL, P, 1};
        if (st == KVS_OK)
            st = x->p.type->prefill_chunk(&x->p, l, &c, &err);
        if (st == KVS_OK)
            st = x->p.type->prefill_end(&x->p, l, &err);
    }
    x->p.in_prompt = 0;
    x->pos = P;
    if (st != KVS_OK)
        snprintf(x->err, sizeof x->err, "%s", err.msg);
    return st;
}

/* One decode step: per layer random q, k, v (qfix: these queries instead, for every layer),
 * before_append, store, select per KV head into x->slots. */
static kvs_status h_step(harness *x, const float *qfix)
{
    kvs_error err = {0};
    const int32_t pos = x->pos++;
    for (int l = 0; l < x->L; l++) {
        float k[MAXH * MAXD], v[MAXH * MAXD];
        rand_row(x, x->q[l], x->H * x->d);
        if (qfix)
            memcpy(x->q[l], qfix, sizeof(float) * (size_t)x->H * x->d);
        rand_row(x, k, x->Hkv * x->d);
        rand_row(x, v, x->Hkv * x->d);
        memcpy(x->keys[l][pos], k, sizeof k);
        memcpy(x->vals[l][pos], v, sizeof v);
        kvs_status st = x->p.type->before_append(&x->p, l, x->q[l], k, v, pos, &err);
        if (st == KVS_OK)
            st = kvs_store_append(x->store, l, 1, k, v, &pos, &err);
        if (st != KVS_OK) {
            snprintf(x->err, sizeof x->err, "%s", err.msg);
            return st;
        }
        const int G = x->H / x->Hkv;
        for (int h = 0; h < x->Hkv; h++) {
            int n = x->p.type->select(&x->p, l, h, x->q[l] + h * G * x->d, x->slots[l][h]);
            if (n < 0) {
                n = kvs_store_count(x->store, l, h);
                for (int i = 0; i < n; i++)
                    x->slots[l][h][i] = i;
            }
            x->n_slots[l][h] = n;
        }
    }
    return KVS_OK;
}

static void h_free(harness *x)
{
    if (x->p.type && x->p.type->stop)
        x->p.type->stop(&x->p);
    kvs_store_free(x->store);
    x->store = NULL;
}

static harness hx, hy; /* large: static */

/* ---- 5: the static step ---- */

static void static_step(void)
{
    /* G = 2 (GQA), P = 150: w = 30, N = 38 (not a multiple of s1 = 8) */
    const int P = 150, d = 8;
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 2, 4, 2, d, P, 11, NULL) ==
          KVS_OK);
    const int N = kvs_mp_ceil_count(0.25, P), w = kvs_mp_ceil_count(0.2, P);
    CHECK(hx.p.budget == N && N == 38 && w == 30);
    int rows = 0;
    for (int r = 0; r < P; r++)
        rows += hx.p.type->wants_row(&hx.p, 0, r);
    CHECKF(rows == w, "window rows %d, expected %d", rows, w);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            const int n = kvs_store_count(hx.store, l, h);
            const int32_t *pos = kvs_store_pos(hx.store, l, h);
            CHECKF(n == N, "layer %d head %d keeps %d, expected %d", l, h, n, N);
            int sorted = 1, exact = 1;
            for (int i = 0; i < n; i++) {
                sorted &= pos[i] >= 0 && pos[i] < P && (i == 0 || pos[i] > pos[i - 1]);
                float k[MAXD];
                kvs_store_key_f32(hx.store, l, h, i, k);
                exact &= !memcmp(k, &hx.keys[l][pos[i]][h * d], sizeof(float) * d);
            }
            CHECKF(sorted, "layer %d head %d: kept positions not distinct, ascending, in range",
                   l, h);
            CHECKF(exact, "layer %d head %d: compacted keys differ from the kept ones", l, h);
        }
    h_free(&hx);
    /* a budget above keep raises keep to it (budget = keep x eta with eta <= 1): 0.5 of 200
     * kept, all of it attended; slots=N likewise */
    static const char *const raised[] = {"mpcache:budget=0.5,share=off", "mpcache:slots=100,"
                                         "share=off"};
    for (int i = 0; i < 2; i++) {
        CHECK(h_start(&hx, raised[i], 2, 4, 2, d, 200, 12, NULL) == KVS_OK);
        CHECK(h_step(&hx, NULL) == KVS_OK);
        CHECKF(hx.p.budget == 100 && kvs_store_count(hx.store, 1, 0) == 101 &&
                   kvs_mp_eta_of(&hx.p) == 1.0 && hx.n_slots[1][0] == 101,
               "%s: keeps %d, eta %g, attends %d", raised[i], hx.p.budget,
               kvs_mp_eta_of(&hx.p), hx.n_slots[1][0]);
        h_free(&hx);
    }
}

/* The reference choice of §2.5 on a head with nothing sealed: boxes and scores of the kept keys
 * from mpcache_math, then kvs_mp_select. Returns the number of fine clusters into fine. */
static int ref_choice(const harness *x, int l, int h, const kvs_mp_cfg *c, double eta, int *fine,
                      int *slots, int *n_slots)
{
    const int d = x->d, N = kvs_store_count(x->store, l, h) - (x->pos - x->P);
    static float k[MAXT * MAXD], mn[MAXT * MAXD], mx[MAXT * MAXD];
    static double sc1[MAXT], sc2[MAXT];
    for (int i = 0; i < N; i++)
        kvs_store_key_f32(x->store, l, h, i, k + (size_t)i * d);
    const int G = x->H / x->Hkv;
    const float *q = x->q[l] + h * G * d;
    kvs_mp_cluster_bounds(k, N, d, c->s1, mn, mx);
    kvs_mp_cluster_scores(c->sim, q, G, d, k, N, c->s1, mn, mx, c->alpha, sc1, NULL);
    kvs_mp_cluster_bounds(k, N, d, c->s2, mn, mx);
    kvs_mp_cluster_scores(c->sim, q, G, d, k, N, c->s2, mn, mx, c->alpha, sc2, NULL);
    int nf = 0;
    CHECK(kvs_mp_select(sc1, sc2, N, c->s1, c->s2, kvs_mp_rho1(c, eta), eta, c->pad, fine, &nf,
                        slots, n_slots, NULL) == KVS_OK);
    return nf;
}

/* ---- 4, 8, 2: the dynamic step against the reference, and the sparse attention ---- */

static void dynamic_step(void)
{
    static const char *const specs[] = {
        "mpcache:budget=0.05,s1=8,s2=4,share=off",
        "mpcache:budget=0.05,s1=8,s2=4,share=off,pad=off",
        "mpcache:budget=0.02,s1=16,s2=4,share=off,sim=ub",
        "mpcache:budget=0.1,s1=8,s2=2,share=off,sim=mean,rho1=0.7",
        "mpcache:budget=0.1,s1=8,s2=4,share=off,sim=maxdot",
        "mpcache:budget=0.2,keep=0.5,s1=8,s2=4,share=off,alpha=1",
    };
    kvs_attn_scratch *scr = kvs_attn_scratch_new();
    kvs_pool *pool = kvs_pool_create(1);
    for (size_t si = 0; si < sizeof specs / sizeof *specs; si++)
        for (uint64_t seed = 1; seed <= 4; seed++) {
            CHECKF(h_start(&hx, specs[si], 2, 4, 2, 8, 150 + (int)seed, seed, NULL) == KVS_OK,
                   "%s: %s", specs[si], hx.err);
            CHECK(h_step(&hx, NULL) == KVS_OK);
            const kvs_mp_cfg *c = kvs_mp_cfg_of(&hx.p);
            const double eta = kvs_mp_eta_of(&hx.p);
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    int fine[MAXT], slots[MAXT], ns = 0;
                    const int nf = ref_choice(&hx, l, h, c, eta, fine, slots, &ns);
                    const kvs_mp_last *last = kvs_mp_last_of(&hx.p, l, h);
                    CHECKF(last && last->n_fine == nf &&
                               !memcmp(last->fine, fine, sizeof(int) * (size_t)nf),
                           "%s seed %d layer %d head %d: clusters differ from the reference "
                           "(%d vs %d)", specs[si], (int)seed, l, h, last ? last->n_fine : -2,
                           nf);
                    /* the slots: the reference's real ones, then the tail (the new token) */
                    const int N = last ? last->n_kept : 0;
                    int want[MAXT], nw = 0;
                    for (int i = 0; i < ns; i++)
                        if (slots[i] < N)
                            want[nw++] = slots[i];
                    want[nw++] = N;
                    CHECKF(hx.n_slots[l][h] == nw &&
                               !memcmp(hx.slots[l][h], want, sizeof(int) * (size_t)nw),
                           "%s seed %d layer %d head %d: %d slots, reference %d", specs[si],
                           (int)seed, l, h, hx.n_slots[l][h], nw);
                }
            /* §7.2: attention over the chosen slots equals dense attention with every other
             * logit at -inf (double reference from the stored keys and values) */
            const int *sel[MAXH];
            for (int h = 0; h < 2; h++)
                sel[h] = hx.slots[1][h];
            float out[MAXH * MAXD];
            int32_t qpos = hx.pos - 1;
            kvs_attn_args a = {.store = hx.store, .layer = 1, .n_heads = 4, .n = 1,
                               .q = hx.q[1], .qpos = &qpos, .out = out, .sel = sel,
                               .n_sel = hx.n_slots[1]};
            CHECK(kvs_attention(pool, scr, &a, NULL) == KVS_OK);
            double worst = 0;
            for (int qh = 0; qh < 4; qh++) {
                const int h = qh / 2, n = kvs_store_count(hx.store, 1, h);
                double lg[MAXT], mx = -INFINITY, z = 0, o[MAXD] = {0};
                for (int j = 0; j < n; j++) {
                    int chosen = 0;
                    for (int i = 0; i < hx.n_slots[1][h]; i++)
                        chosen |= hx.slots[1][h][i] == j;
                    float kk[MAXD];
                    kvs_store_key_f32(hx.store, 1, h, j, kk);
                    double s = 0;
                    for (int i = 0; i < 8; i++)
                        s += (double)hx.q[1][qh * 8 + i] * kk[i];
                    lg[j] = chosen ? s / sqrt(8.0) : -INFINITY;
                    mx = lg[j] > mx ? lg[j] : mx;
                }
                for (int j = 0; j < n; j++) {
                    const double e = exp(lg[j] - mx);
                    float vv[MAXD];
                    kvs_store_value_f32(hx.store, 1, h, j, vv);
                    z += e;
                    for (int i = 0; i < 8; i++)
                        o[i] += e * vv[i];
                }
                for (int i = 0; i < 8; i++)
                    worst = fmax(worst, fabs(o[i] / z - out[qh * 8 + i]));
            }
            CHECKF(worst < 1e-5, "%s: sparse attention differs from the masked reference by %g",
                   specs[si], worst);
            h_free(&hx);
        }
    kvs_attn_scratch_free(scr);
    kvs_pool_destroy(pool);
}

/* ---- 3: counts that do not depend on the data ---- */

static void data_independent(void)
{
    /* N = 25 (P = 100, keep 0.25): the last coarse cluster of s1 = 8 holds one token */
    int ref_fine = -1, ref_k = -1, same = 1, varies = 0, first_k = -1;
    for (uint64_t seed = 1; seed <= 24; seed++) {
        CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 2, 2, 2, 8, 100, seed,
                      NULL) == KVS_OK);
        CHECK(h_start(&hy, "mpcache:budget=0.05,s1=8,s2=4,share=off,pad=off", 2, 2, 2, 8, 100,
                      seed, NULL) == KVS_OK);
        for (int step = 0; step < 3; step++) {
            CHECK(h_step(&hx, NULL) == KVS_OK && h_step(&hy, NULL) == KVS_OK);
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    const kvs_mp_last *a = kvs_mp_last_of(&hx.p, l, h);
                    const int k = (int)a->ops.softmax_len - step; /* the tail grows by one */
                    if (ref_fine < 0) {
                        ref_fine = a->n_fine;
                        ref_k = k;
                    }
                    same &= a->n_fine == ref_fine && k == ref_k;
                    const int kb = hy.n_slots[l][h] - step;
                    if (first_k < 0)
                        first_k = kb;
                    varies |= kb != first_k;
                }
        }
        h_free(&hx);
        h_free(&hy);
    }
    CHECKF(same, "pad=on: the attended count depends on the data (first %d clusters, %d slots)",
           ref_fine, ref_k);
    kvs_mp_shape sh;
    kvs_mp_cfg c = kvs_mp_cfg_default();
    c.s1 = 8, c.s2 = 4;
    kvs_mp_shape_of(&c, kvs_mp_eta(0.05, 0.25), 25, 0, &sh);
    CHECKF(ref_k == sh.n_slots + 1, "pad=on: %d slots attended, the shape says %d + 1 (tail)",
           ref_k, sh.n_slots);
    /* §7.3: without the padding a short last cluster makes the count data-dependent */
    CHECKF(varies, "pad=off: the attended count never varied over 24 seeds");
}

/* ---- 9: cross-layer sharing ---- */

static void sharing(void)
{
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4", 5, 4, 2, 8, 200, 5, NULL) == KVS_OK);
    for (int step = 0; step < 3; step++)
        CHECK(h_step(&hx, NULL) == KVS_OK);
    const int selects[5] = {1, 1, 1, 0, 1};
    for (int l = 0; l < 5; l++)
        for (int h = 0; h < 2; h++) {
            const kvs_mp_last *a = kvs_mp_last_of(&hx.p, l, h);
            CHECKF(a->selector == selects[l], "layer %d: selector %d", l, a->selector);
        }
    for (int h = 0; h < 2; h++) {
        const kvs_mp_last *a = kvs_mp_last_of(&hx.p, 2, h), *b = kvs_mp_last_of(&hx.p, 3, h);
        CHECKF(a->n_fine == b->n_fine &&
                   !memcmp(a->fine, b->fine, sizeof(int) * (size_t)a->n_fine),
               "head %d: layer 3 does not reuse layer 2's clusters", h);
        const int n2 = kvs_store_count(hx.store, 2, h), n3 = kvs_store_count(hx.store, 3, h);
        CHECKF(n2 == n3 && !memcmp(kvs_store_pos(hx.store, 2, h), kvs_store_pos(hx.store, 3, h),
                                   sizeof(int32_t) * (size_t)n2),
               "head %d: layers 2 and 3 keep different positions", h);
        CHECKF(b->ops.sim_mults == 0 && b->ops.topk_len1 == 0 && b->ops.gather_eq == 0 &&
                   b->ops.softmax_len == a->ops.softmax_len,
               "head %d: the sharing layer counts selection work", h);
        /* the kept sets of a selecting pair differ (each layer ranks its own attention) */
        const int n0 = kvs_store_count(hx.store, 0, h);
        CHECKF(memcmp(kvs_store_pos(hx.store, 0, h), kvs_store_pos(hx.store, 1, h),
                      sizeof(int32_t) * (size_t)n0) != 0,
               "head %d: layers 0 and 1 kept the same positions", h);
    }
    h_free(&hx);
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 5, 4, 2, 8, 200, 5, NULL) ==
          KVS_OK);
    CHECK(h_step(&hx, NULL) == KVS_OK);
    for (int l = 0; l < 5; l++)
        CHECKF(kvs_mp_last_of(&hx.p, l, 0)->selector, "share=off: layer %d does not select", l);
    h_free(&hx);
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,skip=0", 4, 2, 2, 8, 200, 5, NULL) ==
          KVS_OK);
    CHECK(h_step(&hx, NULL) == KVS_OK);
    const int sel0[4] = {1, 0, 1, 0};
    for (int l = 0; l < 4; l++)
        CHECKF(kvs_mp_last_of(&hx.p, l, 0)->selector == sel0[l], "skip=0: layer %d", l);
    h_free(&hx);
}

/* ---- 10: non-destructive selection; evicted tokens never come back ---- */

/* Fine cluster 1 of the kept slots cannot be told in advance, so the harness marks every
 * prompt key's channel 0 with its position's sign pattern: positions 40..79 get +3. */
static void mark_keys(harness *x, int l, int t, float *k)
{
    (void)x, (void)l;
    for (int h = 0; h < MAXH; h++)
        k[h * 8] = t >= 40 && t < 80 ? 3.0f : -0.1f;
}

static void non_destructive(void)
{
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 1, 2, 2, 8, 200, 9,
                  mark_keys) == KVS_OK);
    float qn[MAXH * MAXD] = {0}, qp[MAXH * MAXD] = {0};
    for (int h = 0; h < 2; h++) {
        qn[h * 8] = -4.0f; /* prefers the unmarked clusters */
        qp[h * 8] = 4.0f;  /* prefers the marked ones */
    }
    CHECK(h_step(&hx, qn) == KVS_OK);
    const int32_t *pos = kvs_store_pos(hx.store, 0, 0);
    int marked_before = 0, marked_after = 0, kept_marked = 0;
    for (int i = 0; i < kvs_store_count(hx.store, 0, 0); i++)
        kept_marked += pos[i] >= 40 && pos[i] < 80;
    for (int i = 0; i < hx.n_slots[0][0]; i++)
        marked_before += pos[hx.slots[0][0][i]] >= 40 && pos[hx.slots[0][0][i]] < 80;
    CHECK(h_step(&hx, qp) == KVS_OK);
    for (int i = 0; i < hx.n_slots[0][0]; i++)
        marked_after += pos[hx.slots[0][0][i]] >= 40 && pos[hx.slots[0][0][i]] < 80;
    CHECKF(kept_marked > 0 && marked_before == 0 && marked_after > 0,
           "marked slots kept %d, attended at step 1: %d, at step 2: %d", kept_marked,
           marked_before, marked_after);
    /* every attended position was kept by the static step or decoded */
    int stray = 0;
    for (int s = 0; s < 40; s++) {
        CHECK(h_step(&hx, NULL) == KVS_OK);
        pos = kvs_store_pos(hx.store, 0, 0);
        for (int i = 0; i < hx.n_slots[0][0]; i++) {
            const int32_t p = pos[hx.slots[0][0][i]];
            int ok = p >= 200;
            for (int j = 0; j < hx.p.budget && !ok; j++)
                ok = pos[j] == p;
            stray += !ok;
        }
    }
    CHECKF(stray == 0, "%d attended positions were evicted by the static step", stray);
    h_free(&hx);
}

/* ---- 11, 12, 13, 14 ---- */

static void determinism(void)
{
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4", 4, 4, 2, 8, 200, 3, NULL) == KVS_OK);
    CHECK(h_start(&hy, "mpcache:budget=0.05,s1=8,s2=4", 4, 4, 2, 8, 200, 3, NULL) == KVS_OK);
    int same = 1;
    for (int s = 0; s < 40; s++) {
        CHECK(h_step(&hx, NULL) == KVS_OK && h_step(&hy, NULL) == KVS_OK);
        for (int l = 0; l < 4; l++)
            for (int h = 0; h < 2; h++)
                same &= hx.n_slots[l][h] == hy.n_slots[l][h] &&
                        !memcmp(hx.slots[l][h], hy.slots[l][h],
                                sizeof(int) * (size_t)hx.n_slots[l][h]);
    }
    CHECK(same);
    h_free(&hx);
    h_free(&hy);
}

static void degenerate(void)
{
    static const struct {
        const char *spec;
        int P;
    } cases[] = {
        {"mpcache:budget=0.05,share=off", 1},                 /* T = 1 */
        {"mpcache:budget=0.05,share=off", 20},                /* T < s1 */
        {"mpcache:budget=0.1,share=off", 40},                 /* N = 10 < s2 */
        {"mpcache:budget=0.05,window=0.01,share=off", 50},    /* w = 1 */
        {"mpcache:budget=0.001,s1=8,s2=4,share=off", 300},    /* eta tiny: n2 = 1 */
        {"mpcache:slots=1,s1=8,s2=4,share=off", 300},         /* one slot */
        {"mpcache:budget=0.05,s1=1,s2=1,share=off,levels=1", 60},
        {"mpcache:budget=0.05,keep=1,share=off", 60},         /* dynamic step only */
        {"mpcache:budget=0.1,s1=4,s2=2,share=off", 24},       /* decode outgrows the prompt */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECKF(h_start(&hx, cases[i].spec, 2, 2, 1, 8, cases[i].P, 4, NULL) == KVS_OK, "%s P %d: "
               "%s", cases[i].spec, cases[i].P, hx.err);
        int ok = 1;
        const int steps = cases[i].P == 24 ? 400 : 3;
        for (int s = 0; s < steps && ok; s++) {
            ok = h_step(&hx, NULL) == KVS_OK;
            const kvs_mp_last *a = kvs_mp_last_of(&hx.p, 0, 0);
            ok = ok && a && hx.n_slots[0][0] >= 1 + s % kvs_mp_cfg_of(&hx.p)->s1 &&
                 hx.n_slots[0][0] <= kvs_store_count(hx.store, 0, 0);
            ok = ok && (a->n_fine < 0 || a->n_fine == a->shape.n2);
        }
        CHECKF(ok, "%s P %d: step failed or counts off", cases[i].spec, cases[i].P);
        if (i == 4)
            CHECKF(kvs_mp_last_of(&hx.p, 0, 0)->n_fine == 1, "eta tiny: %d fine clusters",
                   kvs_mp_last_of(&hx.p, 0, 0)->n_fine);
        h_free(&hx);
    }
}

static void tail(void)
{
    /* s1 = 8: the tail holds the decoded tokens until 8 of them precede a new one */
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 1, 2, 2, 8, 200, 6, NULL) ==
          KVS_OK);
    int ok = 1, tail_in = 1;
    for (int s = 0; s < 30; s++) {
        CHECK(h_step(&hx, NULL) == KVS_OK);
        const kvs_mp_last *a = kvs_mp_last_of(&hx.p, 0, 0);
        ok &= a->sealed == s / 8 * 8 && a->tail == s % 8 + 1;
        ok &= a->shape.C1 == kvs_mp_n_clusters(50, 8) + s / 8;
        const int n = kvs_store_count(hx.store, 0, 0);
        for (int j = n - a->tail; j < n; j++) {
            int in = 0;
            for (int i = 0; i < hx.n_slots[0][0]; i++)
                in |= hx.slots[0][0][i] == j;
            tail_in &= in;
        }
    }
    CHECKF(ok, "the tail did not seal into one coarse cluster every 8 steps");
    CHECKF(tail_in, "a tail token was not attended");
    h_free(&hx);
}

/* ends=on: the first and the last clustered fine cluster are attended besides the n2 chosen
 * ones (the authors' code), before and after a seal. */
static void ends_option(void)
{
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off,ends=on", 1, 2, 2, 8, 200, 10,
                  NULL) == KVS_OK);
    int ok = 1;
    for (int s = 0; s < 20; s++) {
        CHECK(h_step(&hx, NULL) == KVS_OK);
        for (int h = 0; h < 2; h++) {
            const kvs_mp_last *a = kvs_mp_last_of(&hx.p, 0, h);
            /* N = 50: 13 real fine clusters in 14 padded ones; sealed clusters follow */
            const int last = a->sealed ? a->shape.C2x - 1 : 12;
            int first_in = 0, last_in = 0;
            for (int i = 0; i < a->n_fine; i++) {
                first_in |= a->fine[i] == 0;
                last_in |= a->fine[i] == last;
                ok &= i == 0 || a->fine[i] > a->fine[i - 1];
            }
            ok &= first_in && last_in && a->n_fine == a->shape.n2 + 2;
        }
    }
    CHECKF(ok, "ends=on: the first and last clusters are not both attended besides n2");
    h_free(&hx);
}

static void op_counts(void)
{
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 1, 2, 2, 8, 200, 7, NULL) ==
          KVS_OK);
    CHECK(h_start(&hy, "mpcache:budget=0.05,s1=8,s2=4,share=off,sim=ub", 1, 2, 2, 8, 200, 7,
                  NULL) == KVS_OK);
    CHECK(h_step(&hx, NULL) == KVS_OK && h_step(&hy, NULL) == KVS_OK);
    const kvs_mp_last *a = kvs_mp_last_of(&hx.p, 0, 0), *b = kvs_mp_last_of(&hy.p, 0, 0);
    /* N = 50: C1 = 7, n1 = 4, candidates 8, C2 = 13, n2 = ceil(0.2 x 13) = 3 */
    CHECKF(a->shape.C1 == 7 && a->shape.n1 == 4 && a->ops.topk_len2 == 8 && a->n_fine == 3,
           "shape C1 %d n1 %d cand %d n2 %d", a->shape.C1, a->shape.n1, (int)a->ops.topk_len2,
           a->n_fine);
    CHECKF(a->ops.sim_max_ops == 0 && a->ops.sim_mults == (7 + 8) * 8, "linear: %lld mults, "
           "%lld max", (long long)a->ops.sim_mults, (long long)a->ops.sim_max_ops);
    CHECKF(b->ops.sim_mults == 2 * a->ops.sim_mults && b->ops.sim_max_ops == (7 + 8) * 8,
           "ub: %lld mults, %lld max", (long long)b->ops.sim_mults,
           (long long)b->ops.sim_max_ops);
    CHECKF(a->ops.gather_eq == 3 * 8 && a->ops.softmax_len == 3 * 4 + 1 &&
               a->ops.attn_mults == 2 * 13 * 8,
           "gather %lld, softmax %lld", (long long)a->ops.gather_eq,
           (long long)a->ops.softmax_len);
    h_free(&hx);
    h_free(&hy);
}

/* The policy's measured counts of a first decode step equal eval --task opcount's model of
 * MPCache as configured (the model also counts the coarse level's one-hot gather, n1 x C1). */
static void counts_match_model(void)
{
    static const char *const specs[] = {"mpcache:budget=0.05,s1=8,s2=4",
                                        "mpcache:budget=0.1,s1=8,s2=2,share=off",
                                        "mpcache:budget=0.03,s1=16,s2=4,skip=1"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        CHECK(h_start(&hx, specs[i], 5, 4, 2, 8, 300, 13, NULL) == KVS_OK);
        CHECK(h_step(&hx, NULL) == KVS_OK);
        kvs_opcount_input in = {{5, 4, 2, 8}, 300, hx.p.spec.budget, 1, *kvs_mp_cfg_of(&hx.p)};
        kvs_opcount_row rows[KVS_OC_N_METHODS];
        CHECK(kvs_opcount_rows(&in, rows, NULL) == KVS_OK);
        const kvs_opcount_row *m = &rows[KVS_OC_MP_SHARING];
        int64_t mults = 0, topk = 0, gather = 0, softmax = 0, attn = 0, coarse = 0;
        for (int l = 0; l < 5; l++)
            for (int h = 0; h < 2; h++) {
                const kvs_mp_last *a = kvs_mp_last_of(&hx.p, l, h);
                mults += a->ops.sim_mults;
                topk += a->ops.topk_len1 + a->ops.topk_len2;
                gather += a->ops.gather_eq;
                softmax += 2 * a->ops.softmax_len; /* 2 query heads per KV head */
                attn += 2 * a->ops.attn_mults;
                coarse += a->selector ? (int64_t)a->shape.n1 * a->shape.C1 : 0;
            }
        CHECKF(mults == m->sim_mults && topk == m->topk_len && gather + coarse == m->gather_eq &&
                   softmax == m->softmax_len && attn == m->attn_mults,
               "%s: measured %lld/%lld/%lld/%lld/%lld, model %lld/%lld/%lld/%lld/%lld", specs[i],
               (long long)mults, (long long)topk, (long long)(gather + coarse),
               (long long)softmax, (long long)attn, (long long)m->sim_mults,
               (long long)m->topk_len, (long long)m->gather_eq, (long long)m->softmax_len,
               (long long)m->attn_mults);
        h_free(&hx);
    }
}

/* ---- 15: the commonality score ---- */

/* Layer l's prompt keys equal layer 0's. */
static void same_keys(harness *x, int l, int t, float *k)
{
    if (l > 0)
        memcpy(k, x->keys[0][t], sizeof(float) * (size_t)x->Hkv * x->d);
}

static void commonality(void)
{
    /* the policy's measurement (share=off): identical keys, no static step (keep=1) and the
     * same query in every layer give identical choices: CS = 1; random layers give less */
    float q[MAXH * MAXD];
    for (int i = 0; i < MAXH * MAXD; i++)
        q[i] = (float)sin(1.0 + i);
    char line[512] = "";
    CHECK(h_start(&hx, "mpcache:budget=0.05,keep=1,s1=8,s2=4,share=off", 4, 2, 2, 8, 200, 8,
                  same_keys) == KVS_OK);
    CHECK(h_step(&hx, q) == KVS_OK);
    CHECK(hx.p.type->report(&hx.p, 2, line, sizeof line) == 0);
    CHECKF(strstr(line, "CS(1) 1.000, CS(2) 1.000, layers 0 and 1: 1.000"), "%s", line);
    h_free(&hx);
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4,share=off", 4, 2, 2, 8, 200, 8, NULL) ==
          KVS_OK);
    for (int i = 0; i < 5; i++)
        CHECK(h_step(&hx, NULL) == KVS_OK);
    double c1 = -1, c2 = -1, c01 = -1;
    CHECK(hx.p.type->report(&hx.p, 2, line, sizeof line) == 0);
    const char *at = strstr(line, "CS(1)");
    CHECKF(at && sscanf(at, "CS(1) %lf, CS(2) %lf, layers 0 and 1: %lf", &c1, &c2, &c01) == 3 &&
               c1 >= 0 && c1 < 1 && c2 >= 0 && c2 <= c1 && c01 >= 0 && c01 < 1,
           "%s", line);
    h_free(&hx);
    /* with sharing there is no such line */
    CHECK(h_start(&hx, "mpcache:budget=0.05,s1=8,s2=4", 4, 2, 2, 8, 200, 8, NULL) == KVS_OK);
    CHECK(h_step(&hx, NULL) == KVS_OK);
    CHECK(hx.p.type->report(&hx.p, 2, line, sizeof line) == -1);
    h_free(&hx);

    const int a[] = {1, 4, 7, 9}, b[] = {1, 4, 7, 9}, c[] = {2, 4, 8, 9}, e[] = {0, 3, 5, 6};
    const int *same[] = {a, b, a, b}, *mixed[] = {a, c, b}, *apart[] = {a, e};
    CHECK(kvs_mp_commonality(same, 4, 4, 1) == 1.0 && kvs_mp_commonality(same, 4, 4, 3) == 1.0);
    /* pairs (a, c): {4, 9}, (c, b): {4, 9} -> (2 + 2) / (4 x 2) = 0.5; the triple: {4, 9} */
    CHECK(kvs_mp_commonality(mixed, 3, 4, 1) == 0.5);
    CHECK(kvs_mp_commonality(mixed, 3, 4, 2) == 0.5);
    CHECK(kvs_mp_commonality(apart, 2, 4, 1) == 0.0);
    CHECK(isnan(kvs_mp_commonality(apart, 2, 4, 2)) && isnan(kvs_mp_commonality(apart, 2, 0, 1)));
}

/* ---- bad input ---- */

static void bad_input(void)
{
    static const struct {
        const char *spec;
        int L;
        const char *says;
    } cases[] = {
        {"mpcache:budget=0.1,s1=32,s2=12", 4, "s2=12 does not divide s1=32"},
        {"mpcache:budget=0.1,rho1=0", 4, "rho1=0 must be in (0, 1]"},
        {"mpcache:budget=0.1,keep=0", 4, "keep=0 must be in (0, 1]"},
        {"mpcache:budget=0.1,window=0", 4, "window=0 gives an observation window of zero"},
        {"mpcache:budget=0.1", 1, "share=on needs two layers or more"},
        {"mpcache:budget=0.1", 2, "share=on with skip=2: no layer"},
        {"mpcache:budget=0.1,skip=3", 4, "share=on with skip=3: no layer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvs_status st = h_start(&hx, cases[i].spec, cases[i].L, 2, 2, 8, 64, 1, NULL);
        CHECKF(st == KVS_ERR_ARG && strstr(hx.err, cases[i].says), "%s on %d layers: %s",
               cases[i].spec, cases[i].L, st == KVS_OK ? "accepted" : hx.err);
        h_free(&hx);
    }
    static const struct {
        const char *spec, *says;
    } parse[] = {
        {"mpcache:budget=0.1,keep=1.5", "keep=1.5 is out of range"},
        {"mpcache:budget=0.1,rho1=-1", "rho1=-1 is out of range"},
        {"mpcache:budget=0.1,sim=cosine", "sim=cosine is not one of linear|mean|maxdot|ub"},
        {"mpcache:budget=0.1,levels=3", "levels=3 is out of range"},
        {"mpcache", "needs budget"},
    };
    for (size_t i = 0; i < sizeof parse / sizeof *parse; i++) {
        kvs_policy_spec sp;
        kvs_error err = {0};
        CHECKF(kvs_policy_parse(parse[i].spec, &sp, &err) == KVS_ERR_ARG &&
                   strstr(err.msg, parse[i].says),
               "%s: %s", parse[i].spec, err.msg);
    }
}

/* ---- 1: the full budget equals the full cache, on stories260K ---- */

static void full_budget(void)
{
    static int32_t tokens[FX_N_TOK];
    kvs_model *model = NULL;
    kvs_model_info info;
    char msg[512];
    CHECKF(fx_load(tokens, FX_N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return;
    fx_run full = {.spec = "full", .threads = 2, .decode = 40};
    fx_exec(&full, model, tokens);
    CHECKF(full.st == KVS_OK, "%s", full.err);
    static const char *const specs[] = {
        "mpcache:budget=1.0,keep=1", "mpcache:budget=1.0,keep=1,share=off",
        "mpcache:budget=1.0,keep=1,pad=off,levels=1,s1=8,s2=8",
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        fx_run r = {.spec = specs[i], .threads = 2, .decode = 40};
        fx_exec(&r, model, tokens);
        CHECKF(r.st == KVS_OK && r.o->violations == 0 && r.loop_violations == 0, "%s: %s %s %s",
               specs[i], r.err, r.o ? r.o->first : "", r.loop_first);
        const double d = fx_max_diff(&r, &full, info.n_vocab);
        CHECKF(d == 0.0, "%s: logits differ from the full cache by %g", specs[i], d);
        fx_run_free(&r);
    }
    fx_run_free(&full);
    kvs_model_free(model);
}

int main(void)
{
    static_step();
    dynamic_step();
    data_independent();
    sharing();
    non_destructive();
    determinism();
    degenerate();
    tail();
    ends_option();
    op_counts();
    counts_match_model();
    commonality();
    bad_input();
    full_budget();
    return check_summary("mpcache");
}
