/* MiniCache (minicache.md): adjacent deep layers (a, b) = (S + 2j, S + 2j + 1) share one merged
 * direction e per token and kind (SLERP of their K, or of their V), each layer restoring its own
 * magnitude through a per-token scale s = n_r / ||stored e|| applied inside attention (the
 * restored x^ = s * e is never materialised), with the most distinct tokens kept exact.
 *
 * Where things live:
 * - Layers below S (and an unpaired last layer) use the kv layer's store as any policy.
 * - Prefill is exact (T10): the pair layers append and attend in the main store as always, and
 *   their exact post-RoPE K/V are copied aside. At the prefill_end of layer b the pair is merged
 *   once over the whole prompt (A10), the retained tokens chosen per kind and unit (§2.6), the
 *   e rows appended to a private pair store (one "layer" per pair, of the session's storage
 *   type: F32, F16 or KIVI with §2.10's split), the copies freed and both layers emptied in the
 *   main store: the memory is given back.
 * - Decode: the attend hook takes the pair layers. Layer a attends the pair store with its own
 *   scales, its exact rows over their slots and its exact new k, v as a tail, and keeps k, v
 *   pending; layer b does the same, then merges the pending token with its own, appends e and
 *   sets both layers' scales (§2.8). Decode tokens are not retained (A6), unless
 *   decode_retain=frozen (the prompt's threshold) or retain=all (the test mode of T9).
 * - Scales are folded (§2.10 point 4): s = n / ||e as stored||, recomputed when a row is
 *   quantised (a KIVI flush), so that ||x^|| = ||x|| up to the scale's own rounding (T6).
 *   Mean and F_max store the merged vector itself: no scales, no retention (§2.5). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/number.h"
#include "kv/attention.h"
#include "policies/minicache_internal.h"
#include "policies/minicache_merge.h"
#include "policies/policies.h"

enum { P_START, P_LAYERS, P_T, P_GAMMA, P_MERGE, P_RETAIN, P_UNIT, P_DRET, P_ORDER, P_NORM, P_N };

static const kvs_param_def params[] = {
    {"start", -1, -1, 65535, 1, "first merged layer S; -1: L/2 (integer), or L - layers"},
    {"layers", -1, -1, 65535, 1, "merge the deepest k layers instead (S = L - k; odd k leaves "
                                 "the last layer unmerged); -1: use start"},
    {"t", 0.6, 0, 1, 0, "SLERP interpolation: 0 = layer a's direction, 1 = layer b's"},
    {"gamma", 0.05, 0, 1, 0, "retention threshold (a share of the distance range, or of tokens "
                             "with retain=topfrac)"},
    {"merge", 0, 0, 2, 1, "merge function (mean, fmax: one stored vector, no norms, no "
                          "retention)"},
    {"retain", 0, 0, 3, 1, "retained tokens: most distinct by range (spec), Eq. 4 as printed, "
                           "top ceil(gamma N), or all (test mode: the unmerged cache)"},
    {"unit", 0, 0, 1, 1, "norm and angle per token (all KV heads) or per KV head"},
    {"decode_retain", 0, 0, 1, 1, "decode tokens: never retained, or by the prompt's frozen "
                                  "threshold"},
    {"order", 0, 0, 1, 1, "SLERP weights as Eq. 3, or swapped as Algorithm 2"},
    {"norm", 0, 0, 1, 1, "scale storage"},
};
static const char *const merge_words[] = {"slerp", "mean", "fmax", NULL};
static const char *const retain_words[] = {"range", "literal", "topfrac", "all", NULL};
static const char *const unit_words[] = {"token", "head", NULL};
static const char *const dret_words[] = {"none", "frozen", NULL};
static const char *const order_words[] = {"eq3", "alg2", NULL};
static const char *const norm_words[] = {"fp16", "fp32", NULL};
static const kvs_param_words words[] = {
    {"merge", merge_words}, {"retain", retain_words}, {"unit", unit_words},
    {"decode_retain", dret_words}, {"order", order_words}, {"norm", norm_words},
};

/* Token indices and exact rows of layers a and b kept for one (pair, kind, unit). */
typedef struct retained {
    int n, cap;
    int32_t *idx;
    char *ra, *rb; /* cap rows of unit_dim elements of the exact type */
    float thr;     /* decode_retain=frozen: the prompt's threshold on d */
} retained;

/* One (pair, kind): the scales of both layers per unit (unit-major: each unit's tokens
 * contiguous, as attention reads one KV head's row), and the retained sets per unit. */
typedef struct pair_kind {
    char **scale[2]; /* [r][unit]: cap tokens of the norm type; NULL without norms */
    retained *ret;   /* [unit] */
} pair_kind;

typedef struct mc_state {
    int n_pairs, first; /* pairs (first + 2j, first + 2j + 1) */
    int U, D, h;        /* units per token, their width, n_kv_heads * head_dim */
    kvs_mc_merge merge;
    kvs_mc_retain retain;
    int frozen, swap;
    float t;
    double gamma;
    kvs_dtype norm_type, exact_type; /* scales; retained rows (F32 with an F32 store, else F16) */
    size_t norm_sz, exact_sz;
    kvs_store *pairs;
    int tok_cap; /* tokens the scale arrays hold */
    int n_tok;   /* tokens in the pair store (every pair holds the same) */
    pair_kind *pk; /* [pair * 2 + kind] */
    /* prefill: the pair layers' exact K/V, [pair][layer r] rows of h floats */
    float **pre_k, **pre_v;
    int *pre_n;
    int32_t *pre_pos;
    int pre_cap;
    /* decode */
    float *pend_k, *pend_v; /* [pair] rows of h floats */
    uint8_t *pending;
    kvs_attn_scratch *scratch;
    /* attention arguments per KV head */
    const void **ks, **vs, **xk, **xv;
    const int32_t **xks, **xvs;
    int *xkn, *xvn;
    /* merge scratch */
    float *e, *na, *nb, *om, *d;
    int *sel, *sel_scratch;
    int scratch_cap;
} mc_state;

static int pair_of(const mc_state *s, int layer, int *r)
{
    if (layer < s->first || layer >= s->first + 2 * s->n_pairs)
        return -1;
    *r = (layer - s->first) & 1;
    return (layer - s->first) / 2;
}

static float get_scale(const mc_state *s, const char *row, int j)
{
    return s->norm_type == KVS_F16 ? kvs_fp16_to_fp32(((const uint16_t *)(const void *)row)[j])
                                   : ((const float *)(const void *)row)[j];
}

static void set_scale(const mc_state *s, char *row, int j, float v)
{
    if (s->norm_type == KVS_F16)
        kvs_quantize_row(KVS_F16, &v, row + (size_t)j * 2, 1);
    else
        ((float *)(void *)row)[j] = v;
}

static void put_exact(const mc_state *s, const float *x, char *dst)
{
    if (s->exact_type == KVS_F16)
        kvs_quantize_row(KVS_F16, x, dst, s->D);
    else
        memcpy(dst, x, sizeof(float) * s->D);
}

/* ---- start / stop ---- */

static void free_state(mc_state *s)
{
    if (!s)
        return;
    kvs_store_free(s->pairs);
    for (int i = 0; s->pk && i < 2 * s->n_pairs; i++) {
        for (int r = 0; r < 2; r++) {
            for (int u = 0; s->pk[i].scale[r] && u < s->U; u++)
                free(s->pk[i].scale[r][u]);
            free(s->pk[i].scale[r]);
        }
        for (int u = 0; s->pk[i].ret && u < s->U; u++) {
            free(s->pk[i].ret[u].idx);
            free(s->pk[i].ret[u].ra);
            free(s->pk[i].ret[u].rb);
        }
        free(s->pk[i].ret);
    }
    free(s->pk);
    for (int i = 0; i < 2 * s->n_pairs; i++) {
        if (s->pre_k)
            free(s->pre_k[i]);
        if (s->pre_v)
            free(s->pre_v[i]);
    }
    free(s->pre_k);
    free(s->pre_v);
    free(s->pre_n);
    free(s->pre_pos);
    free(s->pend_k);
    free(s->pend_v);
    free(s->pending);
    kvs_attn_scratch_free(s->scratch);
    free(s->ks);
    free(s->xks);
    free(s->xkn);
    free(s->e);
    free(s->sel);
    free(s->sel_scratch);
    free(s);
}

static void stop(kvs_policy *p)
{
    free_state(p->state);
    p->state = NULL;
}

/* The first merged layer, from start or layers (A9, A13), checked against the model. */
static kvs_status first_layer(const kvs_policy *p, int *first, kvs_error *err)
{
    const int L = p->n_layers;
    const double start = kvs_policy_param(p, "start"), layers = kvs_policy_param(p, "layers");
    char hi[32];
    if (L < 2)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: minicache merges pairs of adjacent layers; "
                        "this model has %d layer", p->spec.user, L);
    if (start >= 0 && layers >= 0)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: give start (the first merged layer) or "
                        "layers (how many of the deepest are merged), not both", p->spec.user);
    if (start > L - 1)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: start=%.0f is beyond the last layer (start "
                        "in [0, %s] for a model of %d layers; L - 1 merges nothing)",
                        p->spec.user, start, kvs_format_number(hi, sizeof hi, L - 1), L);
    if (layers > L)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: layers=%.0f exceeds the model's %d layers "
                        "(layers in [0, %s])", p->spec.user, layers, L,
                        kvs_format_number(hi, sizeof hi, L));
    *first = start >= 0 ? (int)start : layers >= 0 ? L - (int)layers : L / 2;
    return KVS_OK;
}

static kvs_status nomem(kvs_error *err, const char *what)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "minicache: out of memory for %s", what);
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    int first = 0;
    kvs_status st = first_layer(p, &first, err);
    if (st != KVS_OK)
        return st;
    mc_state *s = calloc(1, sizeof *s);
    if (!s)
        return nomem(err, "its state");
    p->state = s;
    const kvs_store_config *mc = kvs_store_cfg(p->store);
    const int nkv = p->n_kv_heads, hd = p->head_dim;
    s->first = first;
    s->n_pairs = (p->n_layers - first) / 2;
    s->merge = (kvs_mc_merge)kvs_policy_param(p, "merge");
    s->retain = (kvs_mc_retain)kvs_policy_param(p, "retain");
    s->frozen = kvs_policy_param(p, "decode_retain") == 1;
    s->swap = kvs_policy_param(p, "order") == 1;
    s->t = (float)kvs_policy_param(p, "t");
    s->gamma = kvs_policy_param(p, "gamma");
    s->h = nkv * hd;
    s->U = kvs_policy_param(p, "unit") == 1 ? nkv : 1;
    s->D = s->h / s->U;
    s->norm_type = kvs_policy_param(p, "norm") == 1 ? KVS_F32 : KVS_F16;
    s->norm_sz = s->norm_type == KVS_F32 ? 4 : 2;
    s->exact_type = mc->type == KVS_F32 && !kvs_store_kivi(p->store) ? KVS_F32 : KVS_F16;
    s->exact_sz = s->exact_type == KVS_F32 ? 4 : 2;
    if (s->n_pairs == 0)
        return KVS_OK; /* nothing merged: the unmerged cache (T9) */
    kvs_store_config pc = {s->n_pairs, nkv, hd, mc->max_slots, mc->type, 0};
    const size_t np = (size_t)s->n_pairs, h = (size_t)s->h;
    s->pairs = kvs_store_new(&pc);
    s->pk = calloc(2 * np, sizeof *s->pk);
    s->pre_k = calloc(2 * np, sizeof *s->pre_k);
    s->pre_v = calloc(2 * np, sizeof *s->pre_v);
    s->pre_n = calloc(2 * np, sizeof *s->pre_n);
    s->pend_k = malloc(sizeof(float) * np * h);
    s->pend_v = malloc(sizeof(float) * np * h);
    s->pending = calloc(np, 1);
    s->scratch = kvs_attn_scratch_new();
    s->ks = malloc(sizeof(void *) * 4 * (size_t)nkv);
    s->xks = malloc(sizeof(int32_t *) * 2 * (size_t)nkv);
    s->xkn = malloc(sizeof(int) * 2 * (size_t)nkv);
    int ok = s->pairs && s->pk && s->pre_k && s->pre_v && s->pre_n && s->pend_k && s->pend_v &&
             s->pending && s->scratch && s->ks && s->xks && s->xkn;
    for (size_t i = 0; ok && i < 2 * np; i++) {
        pair_kind *k = &s->pk[i];
        ok = (k->ret = calloc((size_t)s->U, sizeof *k->ret)) != NULL;
        for (int r = 0; ok && r < 2 && s->merge == KVS_MC_SLERP; r++)
            ok = (k->scale[r] = calloc((size_t)s->U, sizeof *k->scale[r])) != NULL;
    }
    if (!ok) {
        stop(p);
        return nomem(err, "its pairs");
    }
    s->vs = s->ks + nkv;
    s->xk = s->ks + 2 * nkv;
    s->xv = s->ks + 3 * nkv;
    s->xvs = s->xks + nkv;
    s->xvn = s->xkn + nkv;
    const kvs_kivi_cfg *kivi = kvs_store_kivi(p->store);
    if (kivi && (st = kvs_store_set_kivi(s->pairs, kivi, err)) != KVS_OK) {
        stop(p);
        return st;
    }
    return KVS_OK;
}

/* ---- growth ---- */

static int grow_scales(mc_state *s, int need)
{
    if (need <= s->tok_cap || s->merge != KVS_MC_SLERP)
        return 0;
    int cap = need + need / 2 + 16;
    for (int i = 0; i < 2 * s->n_pairs; i++)
        for (int r = 0; r < 2; r++)
            for (int u = 0; u < s->U; u++) {
                char *x = realloc(s->pk[i].scale[r][u], s->norm_sz * (size_t)cap);
                if (!x)
                    return -1;
                s->pk[i].scale[r][u] = x;
            }
    s->tok_cap = cap;
    return 0;
}

static int grow_retained(const mc_state *s, retained *rt, int need)
{
    if (need <= rt->cap)
        return 0;
    int cap = need + need / 2 + 4;
    const size_t row = s->exact_sz * (size_t)s->D;
    int32_t *idx = realloc(rt->idx, sizeof *idx * (size_t)cap);
    if (idx)
        rt->idx = idx;
    char *ra = realloc(rt->ra, row * (size_t)cap);
    if (ra)
        rt->ra = ra;
    char *rb = realloc(rt->rb, row * (size_t)cap);
    if (rb)
        rt->rb = rb;
    if (!idx || !ra || !rb)
        return -1;
    rt->cap = cap;
    return 0;
}

static int grow_scratch(mc_state *s, int n)
{
    if (n <= s->scratch_cap)
        return 0;
    free(s->e);
    free(s->sel);
    free(s->sel_scratch);
    const size_t N = (size_t)n;
    s->e = malloc(sizeof(float) * (2 * N * s->h + 4 * N));
    s->sel = malloc(sizeof(int) * N);
    s->sel_scratch = malloc(sizeof(int) * N);
    if (!s->e || !s->sel || !s->sel_scratch) {
        s->scratch_cap = 0;
        return -1;
    }
    s->na = s->e + 2 * N * s->h;
    s->nb = s->na + N;
    s->om = s->nb + N;
    s->d = s->om + N;
    s->scratch_cap = n;
    return 0;
}

/* ---- scales ---- */

/* ||e|| of unit u of pair row slot as stored (dequantised), over the unit's heads. */
static float stored_norm(const mc_state *s, int pair, int kind, int slot, int u)
{
    const kvs_store_config *c = kvs_store_cfg(s->pairs);
    const int heads = s->U == 1 ? c->n_kv_heads : 1, h0 = s->U == 1 ? 0 : u;
    float x[c->head_dim];
    double sum = 0;
    for (int h = h0; h < h0 + heads; h++) {
        if (kind == KVS_MC_K)
            kvs_store_key_f32(s->pairs, pair, h, slot, x);
        else
            kvs_store_value_f32(s->pairs, pair, h, slot, x);
        for (int i = 0; i < c->head_dim; i++)
            sum += (double)x[i] * x[i];
    }
    return (float)sqrt(sum);
}

/* Scale of one token: the layer's norm over the stored direction's (0 for a zero direction:
 * it restores to 0, never NaN, A18). */
static float fold(float n, float enorm) { return enorm > 0 ? n / enorm : 0.0f; }

/* Sets the scales of rows [lo, hi) of a pair from the layers' norms na, nb ([row - lo][unit],
 * both kinds: na + kind * rows * U). */
static void set_scales(mc_state *s, int pair, int lo, int hi, const float *na, const float *nb)
{
    const int rows = hi - lo;
    for (int kind = 0; kind < 2; kind++) {
        pair_kind *k = &s->pk[pair * 2 + kind];
        for (int i = lo; i < hi; i++)
            for (int u = 0; u < s->U; u++) {
                const size_t o = ((size_t)kind * rows + (i - lo)) * s->U + u;
                float en = stored_norm(s, pair, kind, i, u);
                set_scale(s, k->scale[0][u], i, fold(na[o], en));
                set_scale(s, k->scale[1][u], i, fold(nb[o], en));
            }
    }
}

/* KIVI: quantises what the flush rules say of a pair's rows, folding the new ||deq(e)|| into
 * their scales (§2.10 point 4): s <- s * ||e before|| / ||e after||. */
static int flush_fold(mc_state *s, int pair)
{
    if (!kvs_store_kivi(s->pairs))
        return 0;
    if (s->merge != KVS_MC_SLERP) {
        kvs_store_kivi_flush(s->pairs, pair);
        return 0;
    }
    const kvs_kivi_cfg *kc = kvs_store_kivi(s->pairs);
    kvs_kivi_view v;
    kvs_store_kivi_view(s->pairs, pair, 0, &v);
    const int count = kvs_store_count(s->pairs, pair, 0), R = kc->residual;
    /* Rows leaving the residual (the same for every head: they share the count). */
    int lo[2] = {v.nqk, v.nqv}, hi[2];
    hi[0] = v.nqk + (count - v.nqk) / R * R;
    hi[1] = count - v.nqv > R ? count - R : v.nqv;
    int n = hi[0] - lo[0] > hi[1] - lo[1] ? hi[0] - lo[0] : hi[1] - lo[1];
    if (n == 0)
        return 0;
    float *before = malloc(sizeof(float) * 2 * (size_t)n * s->U);
    if (!before)
        return -1;
    for (int kind = 0; kind < 2; kind++)
        for (int i = lo[kind]; i < hi[kind]; i++)
            for (int u = 0; u < s->U; u++)
                before[((size_t)kind * n + (i - lo[kind])) * s->U + u] =
                    stored_norm(s, pair, kind, i, u);
    kvs_store_kivi_flush(s->pairs, pair);
    for (int kind = 0; kind < 2; kind++) {
        pair_kind *k = &s->pk[pair * 2 + kind];
        for (int i = lo[kind]; i < hi[kind]; i++)
            for (int u = 0; u < s->U; u++) {
                float b = before[((size_t)kind * n + (i - lo[kind])) * s->U + u];
                float a = stored_norm(s, pair, kind, i, u);
                for (int r = 0; r < 2; r++) {
                    char *row = k->scale[r][u];
                    set_scale(s, row, i, a > 0 ? get_scale(s, row, i) * b / a : 0.0f);
                }
            }
    }
    free(before);
    return 0;
}

/* ---- merging ---- */

/* Merges n tokens of one kind: xa, xb rows of h floats; writes e (rows of h), the norms
 * na/nb ([i][unit]) and d = omega / pi ([unit][i], for the retention of each unit). */
static void merge_rows(const mc_state *s, const float *xa, const float *xb, int n, float *e,
                       float *na, float *nb, float *d)
{
    for (int i = 0; i < n; i++)
        for (int u = 0; u < s->U; u++) {
            const size_t o = (size_t)i * s->h + (size_t)u * s->D;
            float om;
            kvs_mc_merge_unit(xa + o, xb + o, s->D, s->t, s->merge, s->swap, e + o,
                              &na[(size_t)i * s->U + u], &nb[(size_t)i * s->U + u], &om);
            d[(size_t)u * n + i] = om / 3.14159265358979323846f;
        }
}

static void add_retained(const mc_state *s, retained *rt, int32_t tok, const float *xa,
                         const float *xb)
{
    const size_t row = s->exact_sz * (size_t)s->D;
    rt->idx[rt->n] = tok;
    put_exact(s, xa, rt->ra + row * rt->n);
    put_exact(s, xb, rt->rb + row * rt->n);
    rt->n++;
}

/* The frozen decode threshold of one retained set (A6): retained if d > thr (range, topfrac:
 * the least distinct token kept) or d < thr (literal). */
static float frozen_thr(const mc_state *s, const float *d, int n, const int *sel, int n_sel)
{
    float mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        mn = d[i] < mn ? d[i] : mn;
        mx = d[i] > mx ? d[i] : mx;
    }
    switch (s->retain) {
    case KVS_MC_RET_RANGE: return (float)(mx - (mx - mn) * s->gamma);
    case KVS_MC_RET_LITERAL: return (float)(mn + (mx - mn) * s->gamma);
    case KVS_MC_RET_TOPFRAC: {
        float lo = INFINITY;
        for (int i = 0; i < n_sel; i++)
            lo = d[sel[i]] < lo ? d[sel[i]] : lo;
        return n_sel ? nextafterf(lo, -INFINITY) : INFINITY;
    }
    case KVS_MC_RET_ALL: break;
    }
    return -INFINITY;
}

static int decode_retains(const mc_state *s, const retained *rt, float d)
{
    if (s->merge != KVS_MC_SLERP)
        return 0;
    if (s->retain == KVS_MC_RET_ALL)
        return 1;
    if (!s->frozen)
        return 0;
    return s->retain == KVS_MC_RET_LITERAL ? d < rt->thr : d > rt->thr;
}

/* ---- prefill ---- */

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    mc_state *s = p->state;
    int r, j = s->n_pairs ? pair_of(s, layer, &r) : -1;
    if (j < 0)
        return KVS_OK;
    const int slot = j * 2 + r, have = s->pre_n[slot];
    /* The whole prompt's rows (A10: merged once at its end). */
    const size_t bytes = sizeof(float) * (size_t)p->n_prompt * s->h;
    if ((!s->pre_k[slot] && !(s->pre_k[slot] = malloc(bytes))) ||
        (!s->pre_v[slot] && !(s->pre_v[slot] = malloc(bytes))))
        return nomem(err, "the prompt's K/V of a merged pair");
    if (!s->pre_pos) {
        if (!(s->pre_pos = malloc(sizeof(int32_t) * (size_t)p->n_prompt)))
            return nomem(err, "the prompt's positions");
        s->pre_cap = p->n_prompt;
    }
    if (have + c->n > p->n_prompt)
        return kvs_fail(err, KVS_ERR_ARG, "minicache: layer %d got %d prompt tokens after %d, "
                        "more than the prompt's %d", layer, c->n, have, p->n_prompt);
    const size_t off = (size_t)have * s->h, n = (size_t)c->n * s->h;
    memcpy(s->pre_k[slot] + off, c->k, sizeof(float) * n);
    memcpy(s->pre_v[slot] + off, c->v, sizeof(float) * n);
    memcpy(s->pre_pos + have, c->pos, sizeof(int32_t) * (size_t)c->n);
    s->pre_n[slot] = have + c->n;
    return KVS_OK;
}

/* Merges pair j over the prompt (§2.7). */
static kvs_status merge_prompt(mc_state *s, int j, kvs_error *err)
{
    const int N = s->pre_n[j * 2 + 1];
    if (N != s->pre_n[j * 2])
        return kvs_fail(err, KVS_ERR_ARG, "minicache: pair (%d, %d) saw %d and %d prompt tokens",
                        s->first + 2 * j, s->first + 2 * j + 1, s->pre_n[j * 2], N);
    if (N == 0)
        return KVS_OK;
    if (grow_scratch(s, N) != 0 || grow_scales(s, s->n_tok + N) != 0)
        return nomem(err, "merging a pair");
    const size_t NU = (size_t)N * s->U;
    float *eK = s->e, *eV = s->e + (size_t)N * s->h;
    /* norms of both kinds: na = [K: N x U][V: N x U], likewise nb; d per kind reuses s->d */
    float *na = malloc(sizeof(float) * 4 * NU), *nb = na ? na + 2 * NU : NULL;
    float *dk = malloc(sizeof(float) * 2 * NU);
    if (!na || !dk) {
        free(na);
        free(dk);
        return nomem(err, "merging a pair");
    }
    const float *xa[2] = {s->pre_k[j * 2], s->pre_v[j * 2]};
    const float *xb[2] = {s->pre_k[j * 2 + 1], s->pre_v[j * 2 + 1]};
    float *e[2] = {eK, eV};
    for (int kind = 0; kind < 2; kind++)
        merge_rows(s, xa[kind], xb[kind], N, e[kind], na + kind * NU, nb + kind * NU,
                   dk + kind * NU);
    kvs_status st = KVS_OK;
    for (int kind = 0; kind < 2 && st == KVS_OK && s->merge == KVS_MC_SLERP; kind++)
        for (int u = 0; u < s->U && st == KVS_OK; u++) {
            retained *rt = &s->pk[j * 2 + kind].ret[u];
            const float *d = dk + kind * NU + (size_t)u * N;
            int n_sel = s->retain == KVS_MC_RET_ALL
                            ? N
                            : kvs_mc_retain_select(d, N, s->gamma, s->retain, s->sel,
                                                   s->sel_scratch);
            if (s->retain == KVS_MC_RET_ALL)
                for (int i = 0; i < N; i++)
                    s->sel[i] = i;
            rt->thr = frozen_thr(s, d, N, s->sel, n_sel);
            if (grow_retained(s, rt, rt->n + n_sel) != 0) {
                st = nomem(err, "the retained tokens");
                break;
            }
            for (int i = 0; i < n_sel; i++) {
                const size_t o = (size_t)s->sel[i] * s->h + (size_t)u * s->D;
                add_retained(s, rt, s->pre_pos[s->sel[i]], xa[kind] + o, xb[kind] + o);
            }
        }
    if (st == KVS_OK)
        st = kvs_store_append(s->pairs, j, N, eK, eV, s->pre_pos, err);
    if (st == KVS_OK && s->merge == KVS_MC_SLERP) {
        /* [i][unit] norms of both kinds as set_scales reads them */
        set_scales(s, j, 0, N, na, nb);
    }
    if (st == KVS_OK && flush_fold(s, j) != 0)
        st = nomem(err, "quantising a pair");
    free(na);
    free(dk);
    return st;
}

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    mc_state *s = p->state;
    int r, j = s->n_pairs ? pair_of(s, layer, &r) : -1;
    if (j < 0 || r == 0)
        return KVS_OK;
    kvs_status st = merge_prompt(s, j, err);
    if (st != KVS_OK)
        return st;
    if (j == s->n_pairs - 1)
        s->n_tok = s->pre_n[j * 2 + 1];
    for (int l = 0; l < 2; l++) {
        free(s->pre_k[j * 2 + l]);
        free(s->pre_v[j * 2 + l]);
        s->pre_k[j * 2 + l] = s->pre_v[j * 2 + l] = NULL;
        s->pre_n[j * 2 + l] = 0;
        /* The memory of both layers is given back: the pair holds them now. */
        for (int h = 0; h < p->n_kv_heads; h++)
            kvs_store_keep(p->store, s->first + 2 * j + l, h, NULL, 0);
    }
    if (j == s->n_pairs - 1) {
        free(s->pre_pos);
        s->pre_pos = NULL;
        s->pre_cap = 0;
    }
    return KVS_OK;
}

/* ---- decode ---- */

/* Attention of layer r of pair j over the restored pair store plus the exact new token. */
static kvs_status attend_pair(const kvs_policy *p, mc_state *s, kvs_pool *pool, int j, int r,
                              const float *q, const float *k, const float *v, int32_t pos,
                              float *out, kvs_error *err)
{
    const int nkv = p->n_kv_heads, hd = p->head_dim;
    for (int h = 0; h < nkv; h++) {
        const int u = s->U == 1 ? 0 : h;
        const size_t hoff = s->U == 1 ? (size_t)h * hd * s->exact_sz : 0;
        const retained *rk = &s->pk[j * 2].ret[u], *rv = &s->pk[j * 2 + 1].ret[u];
        if (s->merge == KVS_MC_SLERP) {
            s->ks[h] = s->pk[j * 2].scale[r][u];
            s->vs[h] = s->pk[j * 2 + 1].scale[r][u];
        }
        s->xkn[h] = rk->n;
        s->xvn[h] = rv->n;
        s->xks[h] = rk->idx;
        s->xvs[h] = rv->idx;
        s->xk[h] = rk->n ? (r ? rk->rb : rk->ra) + hoff : NULL;
        s->xv[h] = rv->n ? (r ? rv->rb : rv->ra) + hoff : NULL;
    }
    const int32_t qpos = pos;
    kvs_attn_args a = {.store = s->pairs, .layer = j, .n_heads = p->n_heads, .n = 1, .q = q,
                       .qpos = &qpos, .out = out,
                       .kscale = s->merge == KVS_MC_SLERP ? s->ks : NULL,
                       .vscale = s->merge == KVS_MC_SLERP ? s->vs : NULL,
                       .scale_type = s->norm_type,
                       .xk_n = s->xkn, .xv_n = s->xvn, .xk_slot = s->xks, .xv_slot = s->xvs,
                       .xk = s->xk, .xv = s->xv, .x_stride = (size_t)s->D,
                       .x_type = s->exact_type, .tail_k = k, .tail_v = v};
    return kvs_attention(pool, s->scratch, &a, err);
}

/* Layer b's token: merge with the pending one, append, set the scales (§2.8). */
static kvs_status append_token(mc_state *s, int j, const float *kb, const float *vb,
                               int32_t pos, kvs_error *err)
{
    if (grow_scratch(s, 1) != 0 || grow_scales(s, s->n_tok + 1) != 0)
        return nomem(err, "a decode token");
    const size_t U = (size_t)s->U;
    float *eK = s->e, *eV = s->e + s->h, nrm[8 * U], *na = nrm, *nb = nrm + 2 * U,
          *d = nrm + 4 * U;
    const float *xa[2] = {s->pend_k + (size_t)j * s->h, s->pend_v + (size_t)j * s->h};
    const float *xb[2] = {kb, vb};
    float *e[2] = {eK, eV};
    for (int kind = 0; kind < 2; kind++)
        merge_rows(s, xa[kind], xb[kind], 1, e[kind], na + kind * U, nb + kind * U,
                   d + kind * U);
    for (int kind = 0; kind < 2; kind++)
        for (int u = 0; u < s->U; u++) {
            retained *rt = &s->pk[j * 2 + kind].ret[u];
            if (!decode_retains(s, rt, d[kind * U + u]))
                continue;
            if (grow_retained(s, rt, rt->n + 1) != 0)
                return nomem(err, "a retained decode token");
            const size_t o = (size_t)u * s->D;
            add_retained(s, rt, pos, xa[kind] + o, xb[kind] + o);
        }
    const int slot = kvs_store_count(s->pairs, j, 0);
    kvs_status st = kvs_store_append(s->pairs, j, 1, eK, eV, &pos, err);
    if (st != KVS_OK)
        return st;
    if (s->merge == KVS_MC_SLERP)
        set_scales(s, j, slot, slot + 1, na, nb);
    if (flush_fold(s, j) != 0)
        return nomem(err, "quantising a pair");
    return KVS_OK;
}

static kvs_status attend(kvs_policy *p, kvs_pool *pool, int layer, const float *q,
                         const float *k, const float *v, int32_t pos, float *out, int *attended,
                         kvs_error *err)
{
    mc_state *s = p->state;
    int r, j = s->n_pairs ? pair_of(s, layer, &r) : -1;
    if (j < 0)
        return KVS_OK;
    kvs_status st = attend_pair(p, s, pool, j, r, q, k, v, pos, out, err);
    if (st != KVS_OK)
        return st;
    if (r == 0) {
        memcpy(s->pend_k + (size_t)j * s->h, k, sizeof(float) * s->h);
        memcpy(s->pend_v + (size_t)j * s->h, v, sizeof(float) * s->h);
        s->pending[j] = 1;
    } else {
        if (!s->pending[j])
            return kvs_fail(err, KVS_ERR_ARG, "minicache: layer %d ran before layer %d in a "
                            "decode step", layer, layer - 1);
        if ((st = append_token(s, j, k, v, pos, err)) != KVS_OK)
            return st;
        s->pending[j] = 0;
        if (j == s->n_pairs - 1)
            s->n_tok++;
    }
    *attended = kvs_store_count(s->pairs, j, 0) + (r == 0);
    return KVS_OK;
}

/* ---- accounting ---- */

void kvs_mc_state_bytes(const kvs_policy *p, kvs_mc_bytes *b)
{
    memset(b, 0, sizeof *b);
    const mc_state *s = p->state;
    if (!s || s->n_pairs == 0)
        return;
    b->pair_store = kvs_store_bytes(s->pairs);
    b->pending = 2 * sizeof(float) * (size_t)s->n_pairs * s->h;
    for (int j = 0; j < s->n_pairs; j++) {
        const size_t toks = (size_t)kvs_store_count(s->pairs, j, 0);
        for (int kind = 0; kind < 2; kind++) {
            if (s->merge == KVS_MC_SLERP)
                b->scales += 2 * toks * (size_t)s->U * s->norm_sz;
            for (int u = 0; u < s->U; u++)
                b->retained += (size_t)s->pk[j * 2 + kind].ret[u].n *
                               (2 * s->exact_sz * (size_t)s->D + sizeof(int32_t));
        }
        for (int l = 0; l < 2; l++)
            if (s->pre_k[j * 2 + l])
                b->prefill += 2 * sizeof(float) * (size_t)p->n_prompt * s->h;
    }
    if (s->pre_pos)
        b->prefill += sizeof(int32_t) * (size_t)s->pre_cap;
}

static size_t state_bytes(const kvs_policy *p)
{
    kvs_mc_bytes b;
    kvs_mc_state_bytes(p, &b);
    return b.pair_store + b.scales + b.retained + b.prefill + b.pending;
}

/* §3.2's formula for what the cache holds now: unmerged layers as stored, and per pair E_K,
 * E_V as stored, 2 layers x 2 kinds x N x U norms and the retained rows with their indices;
 * positions are not counted (the spec does not). */
static double formula_bytes(const kvs_policy *p)
{
    const mc_state *s = p->state;
    const kvs_store *m = p->store;
    double total = 0;
    const double pos_bytes = 4; /* per slot, counted by kvs_store_bytes */
    for (int l = 0; l < p->n_layers; l++)
        for (int h = 0; h < p->n_kv_heads; h++)
            total -= pos_bytes * kvs_store_count(m, l, h);
    total += (double)kvs_store_bytes(m);
    if (!s || s->n_pairs == 0)
        return total;
    total += (double)kvs_store_bytes(s->pairs) -
             pos_bytes * (double)kvs_store_total_slots(s->pairs);
    kvs_mc_bytes b;
    kvs_mc_state_bytes(p, &b);
    return total + (double)b.scales + (double)b.retained;
}

static int report(const kvs_policy *p, int i, char *buf, size_t size)
{
    const mc_state *s = p->state;
    if (!s)
        return -1;
    if (i == 0) {
        size_t len = (size_t)snprintf(buf, size, "pairs");
        for (int j = 0; j < s->n_pairs && len < size; j++)
            len += (size_t)snprintf(buf + len, size - len, "%s(%d,%d)", j ? ", " : " ",
                                    s->first + 2 * j, s->first + 2 * j + 1);
        if (s->n_pairs == 0) {
            snprintf(buf + len, size - len, " none (start=%d: nothing merged)", s->first);
            return 0;
        }
        if (len < size)
            len += (size_t)snprintf(buf + len, size - len, "; retained");
        for (int j = 0; j < s->n_pairs && len < size; j++)
            for (int kind = 0; kind < 2 && len < size; kind++) {
                long n = 0;
                for (int u = 0; u < s->U; u++)
                    n += s->pk[j * 2 + kind].ret[u].n;
                len += (size_t)snprintf(buf + len, size - len, "%s%d-%d:%c %ld",
                                        j || kind ? ", " : " ", s->first + 2 * j,
                                        s->first + 2 * j + 1, kind ? 'V' : 'K', n);
            }
        return 0;
    }
    if (i == 1) {
        const int64_t N = kvs_store_count(p->store, 0, 0) > 0 || !s->n_pairs
                              ? kvs_store_count(p->store, 0, 0)
                              : kvs_store_count(s->pairs, 0, 0);
        const int h = p->n_kv_heads * p->head_dim;
        const double full = kvs_mc_full_f16_bytes(p->n_layers, h, N);
        const double measured = (double)(kvs_store_bytes(p->store) + state_bytes(p));
        if (full <= 0)
            return -1;
        snprintf(buf, size, "KV bytes vs full F16 at %lld tokens: measured %.4f, spec formula "
                 "(3.2) %.4f, paper formula (3.1) %.4f", (long long)N, measured / full,
                 formula_bytes(p) / full, kvs_mc_paper_bytes(p->n_layers, h, N) / full);
        return 0;
    }
    return -1;
}

/* ---- test access (minicache_internal.h) ---- */

int kvs_mc_n_pairs(const kvs_policy *p)
{
    const mc_state *s = p->state;
    return s ? s->n_pairs : 0;
}

int kvs_mc_pair_first(const kvs_policy *p, int pair)
{
    const mc_state *s = p->state;
    return s->first + 2 * pair;
}

const kvs_store *kvs_mc_pair_store(const kvs_policy *p)
{
    const mc_state *s = p->state;
    return s ? s->pairs : NULL;
}

int kvs_mc_units(const kvs_policy *p, int *unit_dim)
{
    const mc_state *s = p->state;
    *unit_dim = s->D;
    return s->U;
}

int kvs_mc_retained(const kvs_policy *p, int pair, int kind, int unit, const int32_t **idx,
                    const void **ra, const void **rb, kvs_dtype *type)
{
    const mc_state *s = p->state;
    const retained *rt = &s->pk[pair * 2 + kind].ret[unit];
    *idx = rt->idx;
    *ra = rt->ra;
    *rb = rt->rb;
    *type = s->exact_type;
    return rt->n;
}

float kvs_mc_scale(const kvs_policy *p, int pair, int kind, int r, int unit, int token)
{
    const mc_state *s = p->state;
    if (s->merge != KVS_MC_SLERP)
        return 1.0f;
    return get_scale(s, s->pk[pair * 2 + kind].scale[r][unit], token);
}

int kvs_mc_pending(const kvs_policy *p)
{
    const mc_state *s = p->state;
    for (int j = 0; s && j < s->n_pairs; j++)
        if (s->pending[j])
            return 1;
    return 0;
}

const kvs_policy_type kvs_policy_minicache = {
    .name = "minicache",
    .summary = "MiniCache: adjacent deep layers share one SLERP-merged direction per token, "
               "each keeping its norm; the most distinct tokens stay exact",
    .kind = KVS_KIND_MERGING,
    .params = params,
    .n_params = P_N,
    .words = words,
    .n_words = (int)(sizeof words / sizeof words[0]),
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .prefill_chunk = prefill_chunk,
    .prefill_end = prefill_end,
    .attend = attend,
    .report = report,
};
