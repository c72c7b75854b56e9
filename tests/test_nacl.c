/* NaCl (src/policies/nacl.c) against every invariant of ../shared/methods/nacl.md section 8,
 * numbered as there:
 *   1 exact budget (B after eviction, B + t after t decode steps, B + (t mod m) periodic)
 *   2 full budget / short prompt => logits bit-identical to the full cache, whole generation
 *   3 prefill exactness (logits at the last prompt position bit-identical)
 *   4 protection (sinks, recent window, proxies, a middle span)
 *   5 set hygiene, 6 top-k correctness, 7 score mass, 8 determinism (threads, seeds, streams)
 *   9 rho = 0 => no randomness, 10 sampling law (chi-square: uniform, multinomial, exact
 *     successive-sampling subset law), 11 degenerations (one-shot H2O, one-shot TOVA, rho = 1)
 *   12/13 mask equivalence (and with it RoPE continuity), 14 in-place compaction = gather,
 *   15 memory accounting, 16 edge cases; plus chunked prefill = one chunk.
 * Prompt = the first 384 tokens of the golden sample; decode teacher-forced from token 384. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "policy_check.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "kvslim.h"
#include "policies/nacl.h"

enum { N_TOK = 512, PROMPT = 384, MAX_L = 8, MAX_H = 8, MAX_HD = 16 };
enum { D_ALL = N_TOK - PROMPT, D_SHORT = 8, D_MASK = 40 };

static int32_t tokens[N_TOK];
static kvs_model *model;
static kvs_model_info info;

/* ---- chi-square ---- */

/* Regularised upper incomplete gamma Q(a, x) (series / continued fraction). */
static double gamma_q(double a, double x)
{
    if (x <= 0)
        return 1.0;
    const double gln = lgamma(a);
    if (x < a + 1) {
        double ap = a, sum = 1.0 / a, del = sum;
        for (int n = 0; n < 10000; n++) {
            del *= x / ++ap;
            sum += del;
            if (fabs(del) < fabs(sum) * 1e-15)
                break;
        }
        return 1.0 - sum * exp(-x + a * log(x) - gln);
    }
    double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < 1e-300)
            d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300)
            c = 1e-300;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15)
            break;
    }
    return exp(-x + a * log(x) - gln) * h;
}

/* p-value of observed counts against expected probabilities (k categories, N draws). */
static double chi2_p(const long *obs, const double *prob, int k, long N, double *stat)
{
    double x = 0;
    for (int i = 0; i < k; i++) {
        double e = prob[i] * (double)N;
        x += (obs[i] - e) * (obs[i] - e) / e;
    }
    *stat = x;
    return gamma_q((k - 1) / 2.0, x / 2.0);
}

/* ---- pure-function tests ---- */

static void test_plan(void)
{
    kvs_error err = {0};
    kvs_nacl_cfg c = {.proxy = 0.1, .proxy_begin = -1, .proxy_end = -1, .random_share = 0.7,
                      .sinks = 4, .recent = -1, .temperature = 1};
    kvs_nacl_plan pl;
    /* Worked example of spec 3.8: p = 256, r = 0.2 -> B = 51, n_P = n_recent = 25, sinks 4,
     * rest 22, C_r = 15, C_p = 7. */
    CHECK(kvs_nacl_make_plan(&c, 256, 51, "t", &pl, &err) == KVS_OK);
    CHECKF(pl.evict && pl.n_proxy == 25 && pl.n_recent == 25 && pl.n_sink == 4 &&
               pl.C_r == 15 && pl.C_p == 7 && pl.n_prot == 29,
           "p=256: n_P %d recent %d sinks %d C_r %d C_p %d", pl.n_proxy, pl.n_recent,
           pl.n_sink, pl.C_r, pl.C_p);
    /* The eval settings (p = 384): B 38 -> only protected (rest 0); 96 -> 17 + 37. */
    kvs_nacl_make_plan(&c, 384, 38, "t", &pl, &err);
    CHECKF(pl.n_proxy == 38 && pl.n_sink == 4 && pl.n_recent == 34 && pl.C_p == 0 &&
               pl.C_r == 0, "B=38: recent %d C_p %d C_r %d", pl.n_recent, pl.C_p, pl.C_r);
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECKF(pl.n_recent == 38 && pl.C_p == 17 && pl.C_r == 37, "B=96: C_p %d C_r %d", pl.C_p,
           pl.C_r);
    /* Gating: B >= p, p <= min_prompt. */
    kvs_nacl_make_plan(&c, 384, 384, "t", &pl, &err);
    CHECK(!pl.evict);
    c.min_prompt = 384;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECK(!pl.evict);
    c.min_prompt = 0;
    /* floor of decimal products: 0.29 x 100 is 28.999999999999996 in binary. */
    CHECK(kvs_nacl_floor(0.29 * 100) == 29 && kvs_nacl_floor(0.7 * 54) == 37);
    c.random_share = 0.29;
    kvs_nacl_make_plan(&c, 1000, 100 + 4 + 100, "t", &pl, &err);
    CHECKF(pl.C_r == 29, "0.29 x 100 -> %d", pl.C_r);
    c.random_share = 0.7;
    /* n_P = 1 (proxy 0), n_P = p (proxy 1). */
    c.proxy = 0;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECK(pl.n_proxy == 1 && pl.proxy_begin == 383 && pl.n_recent == 1);
    c.proxy = 1;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECK(pl.n_proxy == 384 && pl.n_recent == 92 && pl.C_p + pl.C_r == 0);
    c.proxy = 0.1;
    /* A middle span [100, 120): kept, charged to B. */
    c.proxy_begin = 100;
    c.proxy_end = 120;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECKF(pl.n_proxy == 20 && pl.n_recent == 20 && pl.prot_begin == 100 && pl.prot_end == 120 &&
               pl.n_prot == 44 && pl.C_p + pl.C_r == 52,
           "span: recent %d prot [%d,%d) n_prot %d", pl.n_recent, pl.prot_begin, pl.prot_end,
           pl.n_prot);
    /* A long recent window yields first: recent 100 -> 96 - 4 - 20 = 72. */
    c.recent = 100;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECKF(pl.n_recent == 72 && pl.n_prot == 96 && pl.C_p + pl.C_r == 0, "recent %d prot %d",
           pl.n_recent, pl.n_prot);
    /* Overlapping recent window and span: [370, 380) inside recent [364, 384). */
    c.recent = 20;
    c.proxy_begin = 370;
    c.proxy_end = 380;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECKF(pl.n_recent == 20 && pl.n_prot == 24, "overlap: recent %d prot %d", pl.n_recent,
           pl.n_prot);
    /* A span longer than B - sinks: its newest B - sinks positions are kept, no recent. */
    c.recent = -1;
    c.proxy_begin = 100;
    c.proxy_end = 200;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECKF(pl.n_recent == 0 && pl.prot_begin == 108 && pl.prot_end == 200 && pl.n_prot == 96,
           "long span: recent %d prot [%d,%d)", pl.n_recent, pl.prot_begin, pl.prot_end);
    /* A suffix span is an explicit n_P (protected through recent, default n_P). */
    c.proxy_end = -1;
    c.proxy_begin = 360;
    kvs_nacl_make_plan(&c, 384, 96, "t", &pl, &err);
    CHECK(pl.n_proxy == 24 && pl.n_recent == 24 && pl.prot_end <= pl.prot_begin);
    /* Bad spans. */
    c.proxy_begin = 300;
    c.proxy_end = 400;
    CHECK(kvs_nacl_make_plan(&c, 384, 96, "nacl:x", &pl, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "proxy span [300, 400)"));
    c.proxy_begin = -1;
    c.proxy_end = 10;
    CHECK(kvs_nacl_make_plan(&c, 384, 96, "nacl:x", &pl, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "proxy_end needs proxy_begin"));
}

static int sorted_eq(const int *a, int na, const int *b, int nb)
{
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}


/* Invariants 5, 6, 8 (streams) on synthetic scores. */
static void test_select(void)
{
    enum { N = 200 };
    float F[N];
    int32_t pos[N];
    uint8_t prot[N];
    for (int j = 0; j < N; j++) {
        F[j] = 0.05f * (float)sin(j * 0.7) + (j % 17 == 0 ? 2.0f : 0.0f); /* near-flat + spikes */
        F[j] = j == 50 || j == 51 ? 1.5f : F[j];                           /* an exact tie */
        pos[j] = 1000 + 3 * j;
        prot[j] = j < 4 || j >= N - 10;
    }
    const int Cp = 13, Cr = 20;
    int keep[N], top[N], rnd[N];
    int k = kvs_nacl_select(F, pos, prot, N, Cp, Cr, 1.0, 7, 2, 3, 0, keep, top, rnd);
    CHECK(k == 14 + Cp + Cr);
    /* 5: ascending, no duplicates, protected in, TOP and RND disjoint and unprotected. */
    int ok = 1, in_keep[N] = {0}, in_top[N] = {0}, in_rnd[N] = {0};
    for (int i = 0; i < k; i++) {
        ok &= keep[i] >= 0 && keep[i] < N && (i == 0 || keep[i] > keep[i - 1]);
        in_keep[keep[i]] = 1;
    }
    for (int i = 0; i < Cp; i++)
        in_top[top[i]]++;
    for (int i = 0; i < Cr; i++)
        in_rnd[rnd[i]]++;
    for (int j = 0; j < N; j++) {
        ok &= in_top[j] <= 1 && in_rnd[j] <= 1 && !(in_top[j] && in_rnd[j]);
        ok &= !prot[j] || (in_keep[j] && !in_top[j] && !in_rnd[j]);
        ok &= in_keep[j] == (prot[j] || in_top[j] || in_rnd[j]);
    }
    CHECKF(ok, "select: set hygiene");
    /* 6: min over TOP >= max over M \ TOP; at equal scores the lower position is in TOP. */
    float min_top = INFINITY, max_rest = -INFINITY;
    int tie_ok = 1;
    for (int j = 0; j < N; j++) {
        if (prot[j])
            continue;
        if (in_top[j])
            min_top = F[j] < min_top ? F[j] : min_top;
        else
            max_rest = F[j] > max_rest ? F[j] : max_rest;
    }
    for (int a = 0; a < N; a++)
        for (int b = a + 1; b < N; b++)
            if (!prot[a] && !prot[b] && F[a] == F[b] && in_top[b] && !in_top[a])
                tie_ok = 0;
    CHECKF(min_top >= max_rest, "top-k: min TOP %g < max rest %g", min_top, max_rest);
    CHECK(tie_ok);
    /* Ties at the cutoff: 10 equal candidates, C_p = 3 keeps the 3 lowest positions. */
    {
        float f[10];
        int32_t ps[10];
        int kp[10], tp[3];
        for (int j = 0; j < 10; j++)
            f[j] = 1.0f, ps[j] = j;
        kvs_nacl_select(f, ps, NULL, 10, 3, 0, 1.0, 0, 0, 0, 0, kp, tp, NULL);
        CHECK(kp[0] == 0 && kp[1] == 1 && kp[2] == 2);
    }
    /* 8: same inputs -> same sets; other seed / layer / head / event -> other RND. */
    int k2 = kvs_nacl_select(F, pos, prot, N, Cp, Cr, 1.0, 7, 2, 3, 0, keep, top, rnd);
    int keep2[N];
    memcpy(keep2, keep, sizeof keep2);
    k2 = kvs_nacl_select(F, pos, prot, N, Cp, Cr, 1.0, 7, 2, 3, 0, keep2, NULL, NULL);
    CHECK(sorted_eq(keep, k, keep2, k2));
    const int variants[5][4] = {{8, 2, 3, 0}, {7, 3, 3, 0}, {7, 2, 4, 0}, {7, 2, 3, 1},
                                {7, 0, 0, 0}};
    int sets[6][N], ns[6];
    ns[0] = k;
    memcpy(sets[0], keep, sizeof keep);
    for (int v = 0; v < 5; v++)
        ns[v + 1] = kvs_nacl_select(F, pos, prot, N, Cp, Cr, 1.0, (uint64_t)variants[v][0],
                                    variants[v][1], variants[v][2], (uint64_t)variants[v][3],
                                    sets[v + 1], NULL, NULL);
    int distinct = 1;
    for (int a = 0; a < 6; a++)
        for (int b = a + 1; b < 6; b++)
            distinct &= !sorted_eq(sets[a], ns[a], sets[b], ns[b]);
    CHECKF(distinct, "different seed / layer / head / event streams gave the same RND");
    /* 9 (pure): C_r = 0 -> independent of the seed; 11: C_p = 0 -> no TOP picks. */
    int ka = kvs_nacl_select(F, pos, prot, N, Cp + Cr, 0, 1.0, 1, 0, 0, 0, sets[0], NULL, NULL);
    int kb = kvs_nacl_select(F, pos, prot, N, Cp + Cr, 0, 1.0, 2, 0, 0, 0, sets[1], NULL, NULL);
    CHECK(sorted_eq(sets[0], ka, sets[1], kb));
    for (int i = 0; i < N; i++)
        top[i] = -7;
    kvs_nacl_select(F, pos, prot, N, 0, Cp + Cr, 1.0, 1, 0, 0, 0, sets[0], top, rnd);
    CHECK(top[0] == -7);
    /* Gumbel keys: the uniforms lie in (0, 1) and average 1/2. */
    double mean = 0, lo = 1, hi = 0;
    for (int i = 0; i < 100000; i++) {
        double u = kvs_nacl_uniform(3, 1, 2, 0, i);
        mean += u / 100000;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    CHECKF(lo > 0 && hi < 1 && fabs(mean - 0.5) < 0.005, "uniform: [%g, %g], mean %g", lo, hi,
           mean);
}

/* Invariant 10: many seeded draws from a pool of 6 with fixed scores, chi-square against the
 * exact law, rejecting only below p = 1e-3 (fixed seeds: reproducible). */
static void test_sampling_law(void)
{
    enum { NP = 6, DRAWS = 100000 };
    const float F[NP] = {0.0f, 0.4f, 1.1f, 1.7f, 2.3f, 3.0f};
    const int32_t pos[NP] = {10, 11, 12, 13, 14, 15};
    int keep[NP], rnd[NP];
    double w[NP], W = 0;
    for (int i = 0; i < NP; i++)
        W += w[i] = exp(F[i]);
    double stat, pv;

    /* (b) C_r = 1: the draw follows softmax(F) over the pool. */
    {
        long obs[NP] = {0};
        double prob[NP];
        for (int i = 0; i < NP; i++)
            prob[i] = w[i] / W;
        for (long d = 0; d < DRAWS; d++) {
            kvs_nacl_select(F, pos, NULL, NP, 0, 1, 1.0, (uint64_t)d, 0, 0, 0, keep, NULL, rnd);
            obs[rnd[0]]++;
        }
        pv = chi2_p(obs, prob, NP, DRAWS, &stat);
        printf("sampling law (b) C_r = 1, softmax(F): chi2 %.2f (df 5), p = %.3f\n", stat, pv);
        CHECKF(pv > 1e-3, "C_r = 1: chi2 %g, p %g", stat, pv);
    }
    /* (c) C_r = 3: exact subset law of successive sampling without replacement (enumerate
     * every ordered draw), over all C(6, 3) = 20 subsets. Also per (layer, head) stream. */
    {
        double prob[64] = {0};
        for (int a = 0; a < NP; a++)
            for (int b = 0; b < NP; b++)
                for (int c = 0; c < NP; c++) {
                    if (a == b || a == c || b == c)
                        continue;
                    prob[(1 << a) | (1 << b) | (1 << c)] +=
                        w[a] / W * w[b] / (W - w[a]) * w[c] / (W - w[a] - w[b]);
                }
        int masks[20], nm = 0;
        double p20[20], incl0 = 0;
        for (int m = 0; m < 64; m++)
            if (__builtin_popcount((unsigned)m) == 3) {
                masks[nm] = m;
                p20[nm++] = prob[m];
                if (m & 1)
                    incl0 += prob[m];
            }
        CHECK(nm == 20);
        /* Inclusion is not C_r x softmax: candidate 0 is in fewer subsets than 3 w0/W. */
        CHECK(fabs(incl0 - 3 * w[0] / W) > 1e-3);
        for (int variant = 0; variant < 2; variant++) {
            long obs[20] = {0};
            for (long d = 0; d < DRAWS; d++) {
                /* variant 0: seeds 0..; variant 1: one seed, streams over (layer, head) */
                uint64_t seed = variant ? 99 : (uint64_t)d;
                int layer = variant ? (int)(d / 1000) : 0, head = variant ? (int)(d % 1000) : 0;
                kvs_nacl_select(F, pos, NULL, NP, 0, 3, 1.0, seed, layer, head, 0, keep, NULL,
                                NULL);
                int m = (1 << keep[0]) | (1 << keep[1]) | (1 << keep[2]);
                for (int i = 0; i < 20; i++)
                    if (masks[i] == m)
                        obs[i]++;
            }
            pv = chi2_p(obs, p20, 20, DRAWS, &stat);
            printf("sampling law (c) C_r = 3, exact subset law, %s: chi2 %.2f (df 19), p = "
                   "%.3f\n", variant ? "over (layer, head) streams" : "over seeds", stat, pv);
            CHECKF(pv > 1e-3, "C_r = 3: chi2 %g, p %g", stat, pv);
        }
    }
    /* (a) tau = infinity (temperature 0): every C_r-subset equally likely; C_r = 2 -> 15. */
    {
        long obs[15] = {0};
        double prob[15];
        int masks[15], nm = 0;
        for (int m = 0; m < 64; m++)
            if (__builtin_popcount((unsigned)m) == 2)
                masks[nm++] = m;
        for (int i = 0; i < 15; i++)
            prob[i] = 1.0 / 15;
        for (long d = 0; d < DRAWS; d++) {
            kvs_nacl_select(F, pos, NULL, NP, 0, 2, 0.0, (uint64_t)d, 1, 1, 0, keep, NULL, NULL);
            int m = (1 << keep[0]) | (1 << keep[1]);
            for (int i = 0; i < 15; i++)
                if (masks[i] == m)
                    obs[i]++;
        }
        pv = chi2_p(obs, prob, 15, DRAWS, &stat);
        printf("sampling law (a) uniform (temperature 0), C_r = 2: chi2 %.2f (df 14), p = "
               "%.3f\n", stat, pv);
        CHECKF(pv > 1e-3, "uniform: chi2 %g, p %g", stat, pv);
    }
    /* A wrong law is rejected: the C_r = 3 counts against C_r x softmax inclusion. */
    {
        long obs[NP] = {0};
        double prob[NP];
        for (int i = 0; i < NP; i++)
            prob[i] = w[i] / W;
        for (long d = 0; d < 20000; d++) {
            kvs_nacl_select(F, pos, NULL, NP, 0, 3, 1.0, (uint64_t)d, 0, 0, 0, keep, NULL, NULL);
            for (int i = 0; i < 3; i++)
                obs[keep[i]]++;
        }
        pv = chi2_p(obs, prob, NP, 60000, &stat);
        CHECKF(pv < 1e-3, "the chi-square test does not reject a wrong law (p %g)", pv);
    }
}

/* ---- engine runs ---- */

typedef struct obs {
    int chunk, n_prompt, decode_pos;
    int chunks_done[MAX_L];
    int is_nacl, checks_state;
    kvs_nacl_plan plan;
    int have_plan;
    float F[MAX_L][MAX_H][PROMPT];
    int have_F[MAX_L];
    float pre_k[MAX_L][MAX_H][PROMPT * MAX_HD], pre_v[MAX_L][MAX_H][PROMPT * MAX_HD];
    int have_pre[MAX_L];
    float h2o[MAX_L][MAX_H][PROMPT];
    int n_kept[MAX_L][MAX_H];
    int32_t kept[MAX_L][MAX_H][N_TOK];
    long violations;
    char first[256];
} obs;

static void violation(obs *o, int layer, int h, const char *hook, const char *what, long a,
                      long b)
{
    if (o->violations++ == 0)
        snprintf(o->first, sizeof o->first, "layer %d head %d after %s: %s (%ld vs %ld)", layer,
                 h, hook, what, a, b);
}

static void snapshot(obs *o, const kvs_store *st, int layer)
{
    for (int h = 0; h < info.n_kv_heads; h++) {
        int n = kvs_store_count(st, layer, h);
        o->n_kept[layer][h] = n;
        memcpy(o->kept[layer][h], kvs_store_pos(st, layer, h), sizeof(int32_t) * (size_t)n);
    }
}

static void observer(void *ctx, const kvs_kv *kv, int layer, const char *hook)
{
    obs *o = ctx;
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const int G = info.n_kv_heads, hd = info.head_dim;
    if (o->decode_pos >= 0)
        return;
    if (!strcmp(hook, "prefill_chunk")) {
        o->chunks_done[layer]++;
        if (!strcmp(p->type->name, "h2o"))
            for (int h = 0; h < G; h++)
                memcpy(o->h2o[layer][h], kvs_store_meta((kvs_store *)st, layer, h, 0),
                       sizeof(float) * (size_t)kvs_store_count(st, layer, h));
        if (!strcmp(p->type->name, "tova"))
            snapshot(o, st, layer);
        if (o->is_nacl) {
            const float *F = kvs_nacl_scores(p, layer);
            if (F) {
                for (int h = 0; h < G; h++)
                    memcpy(o->F[layer][h], F + (size_t)h * PROMPT, sizeof(float) * PROMPT);
                o->have_F[layer] = 1;
            }
            o->plan = *kvs_nacl_plan_of(p);
            o->have_plan = 1;
            if (kvs_store_count(st, layer, 0) == PROMPT) {
                for (int h = 0; h < G; h++)
                    for (int s = 0; s < PROMPT; s++) {
                        kvs_store_key_f32(st, layer, h, s, &o->pre_k[layer][h][s * hd]);
                        kvs_store_value_f32(st, layer, h, s, &o->pre_v[layer][h][s * hd]);
                    }
                o->have_pre[layer] = 1;
            }
        }
    }
    if (!strcmp(hook, "prefill_end")) {
        snapshot(o, st, layer);
        /* 14: the compacted store holds exactly the gathered rows of the pre-eviction store. */
        if (o->is_nacl && o->have_pre[layer])
            for (int h = 0; h < G; h++) {
                const int32_t *pos = kvs_store_pos(st, layer, h);
                for (int s = 0; s < kvs_store_count(st, layer, h); s++) {
                    float k[MAX_HD], v[MAX_HD];
                    kvs_store_key_f32(st, layer, h, s, k);
                    kvs_store_value_f32(st, layer, h, s, v);
                    if (memcmp(k, &o->pre_k[layer][h][pos[s] * hd], sizeof(float) * hd) ||
                        memcmp(v, &o->pre_v[layer][h][pos[s] * hd], sizeof(float) * hd)) {
                        violation(o, layer, h, hook, "compacted slot differs from the gather",
                                  s, pos[s]);
                        break;
                    }
                }
            }
    }
    /* 15: policy state = the score buffers held (n_kv_heads x p floats per layer). */
    if (o->is_nacl && o->checks_state) {
        size_t held = 0;
        for (int l = 0; l < info.n_layers; l++)
            held += kvs_nacl_scores(p, l) ? sizeof(float) * (size_t)G * PROMPT : 0;
        size_t state = kvs_kv_bytes(kv) - kvs_store_bytes(st);
        if (state != held)
            violation(o, layer, 0, hook, "state bytes vs score buffers held", (long)state,
                      (long)held);
    }
}

typedef struct run {
    const char *spec;
    int threads, chunk, decode;
    kvs_status st;
    char err[512];
    float *logits; /* 1 + decode rows */
    obs *o;
    /* decode-loop checks */
    int expect_interval; /* periodic mode: expected count B + (t mod m) */
    long loop_violations;
    char loop_first[256];
} run;

static void loop_violation(run *r, const char *what, int t, long a, long b)
{
    if (r->loop_violations++ == 0)
        snprintf(r->loop_first, sizeof r->loop_first, "after token %d: %s (%ld vs %ld)", t, what,
                 a, b);
}

static void do_run(run *r)
{
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = r->threads ? r->threads : 2;
    sp.chunk = r->chunk;
    sp.kv_policy = r->spec;
    kvs_session *s = NULL;
    kvs_error err = {0};
    r->o = calloc(1, sizeof *r->o);
    r->logits = calloc((size_t)(1 + r->decode) * info.n_vocab, sizeof(float));
    if (!r->o || !r->logits) {
        r->st = KVS_ERR_NOMEM;
        return;
    }
    obs *o = r->o;
    o->chunk = r->chunk ? r->chunk : 512;
    o->n_prompt = PROMPT;
    o->decode_pos = -1;
    o->is_nacl = r->spec && !strncmp(r->spec, "nacl", 4);
    o->checks_state = o->is_nacl && !strstr(r->spec, "mask=1") && !strstr(r->spec, "interval");
    r->st = kvs_session_new(model, &sp, &s, &err);
    if (r->st != KVS_OK) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    kvs_kv *kv = kvs_session_kv(s);
    kvs_kv_set_observer(kv, observer, o);
    r->st = kvs_session_eval(s, tokens, PROMPT, r->logits, 0, &err);
    const kvs_store *store = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const int mask = r->spec && strstr(r->spec, "mask=1") != NULL;
    const int B = p->budget < PROMPT ? p->budget : PROMPT;
    const int evicts = o->have_plan && o->plan.evict;
    const size_t slot = kvs_store_slot_bytes(store);
    for (int t = PROMPT; t < PROMPT + r->decode && r->st == KVS_OK; t++) {
        o->decode_pos = t;
        r->st = kvs_session_eval(s, tokens + t, 1, r->logits + (size_t)(t - PROMPT + 1) *
                                 info.n_vocab, 0, &err);
        const int d = t - PROMPT + 1;
        long total = 0;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++) {
                const int n = kvs_store_count(store, l, h);
                const int32_t *pos = kvs_store_pos(store, l, h);
                total += n;
                int expect = -1;
                if (!strcmp(p->type->name, "full") || (o->is_nacl && (mask || !evicts)))
                    expect = PROMPT + d;
                else if (o->is_nacl)
                    expect = r->expect_interval ? B + d % r->expect_interval : B + d;
                if (expect >= 0 && n != expect) /* 1 */
                    loop_violation(r, "live slots", t, n, expect);
                if (o->is_nacl && evicts && !mask) {
                    /* 4: sinks stay; in periodic mode the newest n_recent slots are the newest
                     * positions after each re-eviction. */
                    for (int i = 0; i < o->plan.n_sink; i++)
                        if (pos[i] != i)
                            loop_violation(r, "sink missing", t, pos[i], i);
                    if (r->expect_interval && d % r->expect_interval == 0)
                        for (int i = 0; i < o->plan.n_recent; i++)
                            if (pos[n - 1 - i] != t - i)
                                loop_violation(r, "recent slot", t, pos[n - 1 - i], t - i);
                }
            }
        /* 15: KV bytes = slots x (key + value + position), nothing else held. */
        if (o->checks_state && kvs_session_kv_bytes(s) != (size_t)total * slot)
            loop_violation(r, "KV bytes", t, (long)kvs_session_kv_bytes(s), total * (long)slot);
    }
    if (r->st != KVS_OK)
        snprintf(r->err, sizeof r->err, "%s", err.msg);
    kvs_session_free(s);
}

static void check_run(const run *r)
{
    CHECKF(r->st == KVS_OK, "%s: %s", r->spec, r->err);
    CHECKF(r->o && r->o->violations == 0, "%s: %ld hook violations, first: %s", r->spec,
           r->o ? r->o->violations : -1, r->o ? r->o->first : "");
    CHECKF(r->loop_violations == 0, "%s: %ld decode violations, first: %s", r->spec,
           r->loop_violations, r->loop_first);
}

static void free_run(run *r)
{
    free(r->logits);
    free(r->o);
    r->logits = NULL;
    r->o = NULL;
}

/* Largest |a - b| over the first rows logit rows; rel: divided by max(1, |a|). */
static double diff_rows(const run *a, const run *b, int row0, int rows, int rel)
{
    if (!a->logits || !b->logits)
        return INFINITY;
    double m = 0;
    for (size_t i = (size_t)row0 * info.n_vocab; i < (size_t)(row0 + rows) * info.n_vocab; i++) {
        double d = fabs((double)a->logits[i] - b->logits[i]);
        if (rel)
            d /= fmax(1.0, fabs((double)a->logits[i]));
        if (!(d <= m))
            m = d;
    }
    return m;
}

static int same_kept(const obs *a, const obs *b)
{
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++)
            if (a->n_kept[l][h] != b->n_kept[l][h] ||
                memcmp(a->kept[l][h], b->kept[l][h], sizeof(int32_t) * (size_t)a->n_kept[l][h]))
                return 0;
    return 1;
}

/* The kept set of (l, h) as a membership array over the prompt. */
static void kept_mask(const obs *o, int l, int h, uint8_t *in)
{
    memset(in, 0, PROMPT);
    for (int i = 0; i < o->n_kept[l][h]; i++)
        if (o->kept[l][h][i] >= 0 && o->kept[l][h][i] < PROMPT)
            in[o->kept[l][h][i]] = 1;
}

/* Positions of the top-k of score over the unprotected positions (ties: lower position). */
static void top_k(const float *score, const uint8_t *prot, int k, uint8_t *out)
{
    memset(out, 0, PROMPT);
    for (int n = 0; n < k; n++) {
        int best = -1;
        for (int j = 0; j < PROMPT; j++)
            if (!prot[j] && !out[j] && (best < 0 || score[j] > score[best]))
                best = j;
        out[best] = 1;
    }
}

/* The invariants one nacl run must satisfy at prefill end (1, 4, 5, 6, 7, and the kept set
 * recomputed from the captured scores, TOP by an independent top-k, RND by the Gumbel keys). */
static void check_nacl_prefill(const run *r, const char *what)
{
    const obs *o = r->o;
    const kvs_nacl_plan *pl = &o->plan;
    CHECKF(o->have_plan, "%s: no plan", what);
    if (!o->have_plan || !pl->evict || strstr(r->spec, "mask=1"))
        return; /* mask mode: nothing compacted; checked by its logits against compaction */
    const double tau = strstr(r->spec, "temperature=0") ? 0 : 1;
    uint64_t seed = 0;
    const char *sp = strstr(r->spec, "seed=");
    if (sp)
        seed = strtoull(sp + 5, NULL, 10);
    int bad_count = 0, bad_prot = 0, bad_mass = 0, bad_top = 0, bad_rnd = 0, bad_keep = 0;
    double worst_mass = 0;
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++) {
            /* 1 */
            bad_count += o->n_kept[l][h] != pl->B;
            uint8_t in[PROMPT], prot[PROMPT], top[PROMPT];
            kept_mask(o, l, h, in);
            for (int j = 0; j < PROMPT; j++)
                prot[j] = (uint8_t)kvs_nacl_protected(pl, j);
            /* 4: sinks, recent window, the protected part of a span */
            for (int j = 0; j < PROMPT; j++)
                bad_prot += prot[j] && !in[j];
            for (int j = 0; j < pl->n_sink; j++)
                bad_prot += !in[j];
            for (int j = PROMPT - pl->n_recent; j < PROMPT; j++)
                bad_prot += !in[j];
            /* 7: sum_j F[j] = n_P (softmax rows sum to 1; group mean) */
            const float *F = o->F[l][h];
            double mass = 0;
            for (int j = 0; j < PROMPT; j++)
                mass += F[j];
            double rel = fabs(mass - pl->n_proxy) / pl->n_proxy;
            worst_mass = rel > worst_mass ? rel : worst_mass;
            bad_mass += !(rel <= 1e-4) || !o->have_F[l];
            /* causality: no proxy row reaches a key after the span's end */
            for (int j = pl->proxy_end; j < PROMPT; j++)
                bad_mass += F[j] != 0.0f;
            /* 6 and 5: TOP = top C_p of F over M, all kept */
            top_k(F, prot, pl->C_p, top);
            int n_top = 0;
            for (int j = 0; j < PROMPT; j++)
                if (top[j]) {
                    n_top++;
                    bad_top += !in[j];
                }
            bad_top += n_top != pl->C_p;
            /* RND = the C_r largest Gumbel keys over M \ TOP, all kept; nothing else kept. */
            uint8_t rnd[PROMPT] = {0};
            for (int n = 0; n < pl->C_r; n++) {
                int best = -1;
                double bk = 0;
                for (int j = 0; j < PROMPT; j++) {
                    if (prot[j] || top[j] || rnd[j])
                        continue;
                    double key = (tau > 0 ? (double)F[j] : 0.0) + kvs_nacl_gumbel(seed, l, h, 0, j);
                    if (best < 0 || key > bk)
                        best = j, bk = key;
                }
                rnd[best] = 1;
            }
            for (int j = 0; j < PROMPT; j++) {
                bad_rnd += rnd[j] && !in[j];
                bad_keep += in[j] != (prot[j] || top[j] || rnd[j]);
            }
            /* 5: strictly ascending, in range */
            for (int i = 0; i < o->n_kept[l][h]; i++)
                bad_keep += o->kept[l][h][i] < 0 || o->kept[l][h][i] >= PROMPT ||
                            (i && o->kept[l][h][i] <= o->kept[l][h][i - 1]);
        }
    CHECKF(!bad_count, "%s: %d heads do not hold B = %d", what, bad_count, pl->B);
    CHECKF(!bad_prot, "%s: %d protected positions evicted", what, bad_prot);
    CHECKF(!bad_mass, "%s: score mass off by up to %.3g relative (or non-causal)", what,
           worst_mass);
    CHECKF(!bad_top, "%s: %d TOP errors", what, bad_top);
    CHECKF(!bad_rnd, "%s: %d RND errors", what, bad_rnd);
    CHECKF(!bad_keep, "%s: %d kept-set errors", what, bad_keep);
}

static int start_fails(const char *spec, const char *needle)
{
    run r = {.spec = spec};
    do_run(&r);
    int ok = r.st == KVS_ERR_ARG && strstr(r.err, needle) != NULL;
    if (!ok)
        fprintf(stderr, "spec '%s': status %d, message '%s' (want '%s')\n", spec, r.st, r.err,
                needle);
    free_run(&r);
    return ok;
}

int main(void)
{
    test_plan();
    test_select();
    test_sampling_law();

    char msg[512];
    kvs_error err = {0};
    CHECKF(fx_load(tokens, N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return check_summary("nacl");
    CHECK(info.n_layers <= MAX_L && info.n_kv_heads <= MAX_H && info.head_dim <= MAX_HD);
    if (info.n_layers > MAX_L || info.n_kv_heads > MAX_H || info.head_dim > MAX_HD)
        return check_summary("nacl");

    /* Spec errors. */
    CHECK(kvs_kv_policy_check("nacl:budget=0.2", &err) == KVS_OK);
    CHECK(error_mentions("nacl:budget=0.2,random_share=1.5", "random_share=1.5 is out of range"));
    CHECK(error_mentions("nacl:budget=0.2,proxy=2", "proxy=2 is out of range"));
    CHECK(error_mentions("nacl", "needs budget"));
    CHECK(start_fails("nacl:budget=0.2,proxy_begin=300,proxy_end=400", "proxy span [300, 400)"));
    CHECK(start_fails("nacl:budget=0.2,proxy_end=10", "proxy_end needs proxy_begin"));
    CHECK(start_fails("nacl:slots=600", "exceeds the context"));

    /* The reference, decoded to the end of the context. */
    run full = {.spec = "full", .decode = D_ALL};
    do_run(&full);
    check_run(&full);

    /* Defaults at 0.25 (2 threads): 1, 3, 4, 5, 6, 7, 14, 15. */
    run def = {.spec = "nacl:budget=0.25", .decode = D_MASK};
    do_run(&def);
    check_run(&def);
    check_nacl_prefill(&def, "nacl:budget=0.25");
    CHECKF(def.o->plan.C_p == 17 && def.o->plan.C_r == 37 && def.o->plan.n_recent == 38,
           "plan at 0.25: C_p %d C_r %d", def.o->plan.C_p, def.o->plan.C_r);
    {
        int proxies_kept = 1;
        uint8_t in[PROMPT];
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++) {
                kept_mask(def.o, l, h, in);
                for (int j = def.o->plan.proxy_begin; j < PROMPT; j++)
                    proxies_kept &= in[j];
            }
        CHECKF(proxies_kept, "default settings: a proxy position was evicted");
        double d0 = diff_rows(&def, &full, 0, 1, 0);
        CHECKF(d0 == 0.0, "3: logits at the last prompt position differ by %g", d0);
        CHECKF(diff_rows(&def, &full, 1, D_MASK, 0) > 0, "eviction changed no decode logit");
    }

    /* 8: 1 thread = 2 threads (kept set and logits); another seed keeps another set. */
    {
        run one = {.spec = "nacl:budget=0.25", .threads = 1, .decode = D_SHORT};
        do_run(&one);
        check_run(&one);
        CHECKF(same_kept(one.o, def.o), "1 and 2 threads kept different slots");
        /* The engine sums each thread's column sums, so F may differ in the last bits. */
        double fd = 0;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++)
                for (int j = 0; j < PROMPT; j++)
                    fd = fmax(fd, fabs((double)one.o->F[l][h][j] - def.o->F[l][h][j]));
        printf("proxy scores, 1 vs 2 threads: max |dF| = %.3g\n", fd);
        CHECKF(fd == 0.0, "proxy scores depend on the thread count (max |dF| %g)", fd);
        double d = diff_rows(&one, &def, 0, 1 + D_SHORT, 0);
        CHECKF(d == 0.0, "1 and 2 threads: logits differ by %g", d);
        free_run(&one);
        run s1 = {.spec = "nacl:budget=0.25,seed=1", .decode = D_SHORT};
        do_run(&s1);
        check_run(&s1);
        check_nacl_prefill(&s1, "seed=1");
        int differ_heads = 0;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++)
                differ_heads += memcmp(s1.o->kept[l][h], def.o->kept[l][h],
                                       sizeof(int32_t) * (size_t)def.o->n_kept[l][h]) != 0;
        printf("seed 0 vs 1: %d of %d (layer, head) kept sets differ\n", differ_heads,
               info.n_layers * info.n_kv_heads);
        CHECKF(differ_heads > 0, "seeds 0 and 1 kept the same slots");
        CHECK(diff_rows(&s1, &def, 1, D_SHORT, 0) > 0);
        free_run(&s1);
    }

    /* 9: random_share = 0 -> the seed does not matter; the kept set is protected + top-k. */
    {
        run a = {.spec = "nacl:budget=0.25,random_share=0", .decode = D_SHORT};
        run b = {.spec = "nacl:budget=0.25,random_share=0,seed=5", .decode = D_SHORT};
        do_run(&a);
        do_run(&b);
        check_run(&a);
        check_run(&b);
        check_nacl_prefill(&a, "random_share=0");
        CHECK(a.o->plan.C_r == 0 && a.o->plan.C_p == 54);
        CHECKF(same_kept(a.o, b.o), "random_share=0: seeds 0 and 5 kept different slots");
        CHECKF(diff_rows(&a, &b, 0, 1 + D_SHORT, 0) == 0.0, "random_share=0: seed changed logits");
        free_run(&a);
        free_run(&b);
    }

    /* 11: n_P = p, rho = 0, no sinks or recent -> top-B of the full causal attention's column
     * sums (one-shot H2O): h2o with a budget over the prompt accumulates exactly those. */
    {
        run h = {.spec = "h2o:slots=512", .decode = 0};
        run n = {.spec = "nacl:budget=0.25,proxy=1,random_share=0,sinks=0,recent=0", .decode = 0};
        do_run(&h);
        do_run(&n);
        check_run(&h);
        check_run(&n);
        check_nacl_prefill(&n, "one-shot H2O");
        int same = 1;
        uint8_t none[PROMPT] = {0}, top[PROMPT], in[PROMPT];
        for (int l = 0; l < info.n_layers; l++)
            for (int hh = 0; hh < info.n_kv_heads; hh++) {
                top_k(h.o->h2o[l][hh], none, 96, top);
                kept_mask(n.o, l, hh, in);
                same &= !memcmp(top, in, PROMPT) && n.o->n_kept[l][hh] == 96;
            }
        CHECKF(same, "proxy=1, random_share=0, sinks=recent=0 is not one-shot H2O");
        free_run(&h);
        free_run(&n);
    }
    /* n_P = 1, rho = 0, no sinks or recent -> top-B of the last token's row (one-shot TOVA:
     * tova on a one-chunk prompt keeps the top B by the last prompt query). */
    {
        run t = {.spec = "tova:budget=0.25", .decode = 0};
        run n = {.spec = "nacl:budget=0.25,proxy=0,random_share=0,sinks=0,recent=0", .decode = 0};
        do_run(&t);
        do_run(&n);
        check_run(&t);
        check_run(&n);
        check_nacl_prefill(&n, "one-shot TOVA");
        CHECK(n.o->plan.n_proxy == 1);
        CHECKF(same_kept(t.o, n.o), "proxy=0, random_share=0, sinks=recent=0 is not one-shot TOVA");
        free_run(&t);
        free_run(&n);
    }
    /* rho = 1 -> C_p = 0 (16: C_p = 0). */
    {
        run n = {.spec = "nacl:budget=0.25,random_share=1", .decode = D_SHORT};
        do_run(&n);
        check_run(&n);
        check_nacl_prefill(&n, "random_share=1");
        CHECK(n.o->plan.C_p == 0 && n.o->plan.C_r == 54);
        free_run(&n);
    }

    /* Chunked prefill: chunks of 64 keep the same slots as one chunk. */
    {
        run c = {.spec = "nacl:budget=0.25", .chunk = 64, .decode = D_SHORT};
        do_run(&c);
        check_run(&c);
        check_nacl_prefill(&c, "chunk 64");
        CHECK(c.o->chunks_done[0] == PROMPT / 64);
        CHECKF(same_kept(c.o, def.o), "chunk 64 kept other slots than one chunk");
        double d = diff_rows(&c, &def, 0, 1 + D_SHORT, 0);
        printf("chunk 64 vs one chunk: max logit difference %.3g\n", d);
        CHECKF(d < 1e-4, "chunked prefill: logits differ by %g", d);
        free_run(&c);
    }

    /* 2: budget >= prompt, or a prompt <= min_prompt: bit-identical for the whole generation. */
    {
        const char *specs[] = {"nacl:budget=1.0", "nacl:slots=400,interval=4",
                               "nacl:budget=0.25,min_prompt=384"};
        for (int i = 0; i < 3; i++) {
            /* the whole continuation for the first; 40 tokens (5 periods) for the others */
            const int dec = i == 0 ? D_ALL : D_MASK;
            run r = {.spec = specs[i], .decode = dec};
            do_run(&r);
            check_run(&r);
            double d = diff_rows(&r, &full, 0, 1 + dec, 0);
            CHECKF(d == 0.0, "%s: logits differ from full by %g", specs[i], d);
            free_run(&r);
        }
    }

    /* 12/13: the compacted cache equals the full cache with evicted slots masked out (the
     * decode tokens at RoPE positions p, p+1, ...), up to float reordering; also the periodic
     * decode mode (interval 8) and a middle span. */
    {
        const char *specs[][2] = {
            {"nacl:budget=0.25", "nacl:budget=0.25,mask=1"},
            {"nacl:budget=0.25,interval=8", "nacl:budget=0.25,interval=8,mask=1"},
            {"nacl:budget=0.25,proxy_begin=100,proxy_end=140",
             "nacl:budget=0.25,proxy_begin=100,proxy_end=140,mask=1"}};
        for (int i = 0; i < 3; i++) {
            run c = {.spec = specs[i][0], .decode = D_MASK};
            run m = {.spec = specs[i][1], .decode = D_MASK};
            if (strstr(specs[i][0], "interval=8"))
                c.expect_interval = 8;
            do_run(&c);
            do_run(&m);
            check_run(&c);
            check_run(&m);
            check_nacl_prefill(&c, specs[i][0]);
            check_nacl_prefill(&m, specs[i][1]);
            double d = diff_rows(&c, &m, 0, 1 + D_MASK, 1);
            double dfull = diff_rows(&c, &full, 1, D_MASK, 0);
            printf("%s: compacted vs masked max |dlogit| / max(1, |logit|) = %.3g (vs full: "
                   "%.3g)\n", specs[i][0], d, dfull);
            CHECKF(d <= 1e-5, "%s: compacted and masked differ by %g", specs[i][0], d);
            CHECKF(dfull > 1e-3, "%s: indistinguishable from the full cache", specs[i][0]);
            if (i == 2) {
                /* 4, 16: a middle span is kept and charged to B; only its rows were scored. */
                CHECK(c.o->plan.n_proxy == 40 && c.o->plan.prot_begin == 100 &&
                      c.o->plan.prot_end == 140 && c.o->plan.n_recent == 40);
            }
            free_run(&c);
            free_run(&m);
        }
    }

    /* 16: edge cases. rest = 0 (budget 0.1: sinks + the last 34), n_P = 1, p = B + 1. */
    {
        run r = {.spec = "nacl:budget=0.1", .decode = D_SHORT};
        do_run(&r);
        check_run(&r);
        check_nacl_prefill(&r, "budget 0.1 (rest 0)");
        int only_prot = r.o->plan.C_p == 0 && r.o->plan.C_r == 0;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++)
                for (int i = 0; i < 38; i++)
                    only_prot &= r.o->kept[l][h][i] == (i < 4 ? i : PROMPT - 34 + (i - 4));
        CHECKF(only_prot, "rest = 0: not sinks + recent");
        free_run(&r);
        const char *specs[] = {"nacl:budget=0.25,proxy=0", "nacl:slots=383",
                               "nacl:slots=383,random_share=1,recent=0,sinks=0",
                               "nacl:budget=0.25,temperature=0"};
        for (int i = 0; i < 4; i++) {
            run e = {.spec = specs[i], .decode = D_SHORT};
            do_run(&e);
            check_run(&e);
            check_nacl_prefill(&e, specs[i]);
            free_run(&e);
        }
    }

    free_run(&def);
    free_run(&full);
    kvs_model_free(model);
    return check_summary("nacl");
}
