/* MPCache and the token-level baseline on secret shares (mpcache.h).
 *
 * Why the attention gathers scores, not keys: in this engine a product of a shared query with
 * the masked cache costs one opening of the query (d words) whatever the cache length
 * (gates_cache.h), so q . k for every cached slot is nearly free online; what grows with the
 * attended length is the softmax (its max tree, exponentials and normalisation). Gathering the
 * chosen keys and values instead (the paper's gather, kvs_mpc_cache_gather) would hand the
 * parties n2 s2 x d shared rows, and every product with shared rows opens them: 2 n2 s2 d words
 * a head and layer, more than the full cache's attention at d = 64. So the one-hot F of the
 * chosen clusters gathers the scores of their slots (F times the scores grouped by cluster, one
 * matrix product: n2 C2x + C2x s2 G words) and scatters the probabilities back (F^T), and the
 * value product stays that of the masked cache. The softmax then runs over n2 s2 slots plus the
 * tail, which is the method's saving; the selected set is the one the paper's gather takes. */
#include "mpc/mpcache.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/fxp.h"
#include "mpc/gates_select.h"
#include "policies/mpcache.h"
#include "policies/registry.h"

/* Sign-test widths (each a promise about the values compared):
 * keys and window sums at frac are below 2^19 in value; cluster scores (qs . rep at 2 frac, qs
 * the sum of a group's scaled queries) below 2^17; a wholly dummy fine cluster's score gets
 * PENALTY, below every real score and within the width. */
#define KEY_BITS(f) ((f) + 21)
#define SCORE_BITS(f) (2 * (f) + 20)
#define SUM_BITS(f) ((f) + 16)
static uint64_t penalty(int f) { return (uint64_t)0 - ((uint64_t)1 << (2 * f + 18)); }

static kvs_status no_memory(kvs_error *err, const char *what, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %s (%zu values)", what, n);
}

kvs_mpc_kv_cfg kvs_mpc_kv_default(kvs_mpc_kv_mode mode)
{
    kvs_mpc_kv_cfg c = {.mode = mode, .static_step = mode == KVS_MPC_KV_CLUSTER,
                        .budget = 0.05, .mp = kvs_mp_cfg_default()};
    c.mp.pad = 1;
    return c;
}

kvs_status kvs_mpc_kv_parse(const char *text, int n_layers, kvs_mpc_kv_cfg *out,
                            kvs_error *err)
{
    *out = kvs_mpc_kv_default(KVS_MPC_KV_FULL);
    if (!text || !*text || !strcmp(text, "full"))
        return KVS_OK;
    kvs_policy_spec spec;
    kvs_status st = kvs_policy_parse(text, &spec, err);
    if (st != KVS_OK)
        return st;
    if (strcmp(spec.type->name, "mpcache") && strcmp(spec.type->name, "full"))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: the two-party engine runs full or mpcache "
                        "(mpcache:budget=F,...)", text);
    if (!strcmp(spec.type->name, "full"))
        return KVS_OK;
    if (!spec.budget_is_fraction || !(spec.budget > 0))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: under the protocol the budget is a share "
                        "of the prompt (budget=F)", text);
    *out = kvs_mpc_kv_default(KVS_MPC_KV_CLUSTER);
    out->budget = spec.budget > 1 ? 1 : spec.budget;
    st = kvs_mp_cfg_from_spec(&spec, n_layers, &out->mp, err);
    if (st == KVS_OK && (out->mp.sim != KVS_MP_SIM_LINEAR || !out->mp.pad || out->mp.ends))
        st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: under the protocol MPCache scores clusters "
                      "by the linear bound (sim=linear), pads (pad=on) and has no forced ends",
                      text);
    out->mp.pad = 1;
    return st;
}

static int cluster_mode(const kvs_mpc_sel *s) { return s->cfg.mode == KVS_MPC_KV_CLUSTER; }

static int is_selector(const kvs_mpc_sel *s, int l)
{
    return !cluster_mode(s) || kvs_mp_is_selector(&s->cfg.mp, l);
}

kvs_status kvs_mpc_sel_attach(kvs_mpc_llama *L, const kvs_mpc_kv_cfg *cfg, int P,
                              kvs_error *err)
{
    const kvs_mp_cfg *c = &cfg->mp;
    const int nl = L->s.n_layers;
    if (!(cfg->budget > 0 && cfg->budget <= 1))
        return kvs_fail(err, KVS_ERR_ARG, "budget=%g must be in (0, 1]", cfg->budget);
    if (P < 1)
        return kvs_fail(err, KVS_ERR_ARG, "a prompt of %d tokens", P);
    if ((int)cfg->mode < 0 || cfg->mode > KVS_MPC_KV_CLUSTER)
        return kvs_fail(err, KVS_ERR_ARG, "unknown selection mode %d", (int)cfg->mode);
    const int cl = cfg->mode == KVS_MPC_KV_CLUSTER, st = cl || cfg->static_step;
    if (st && !(c->keep > 0 && c->keep <= 1 && c->window > 0 && c->window <= 1))
        return kvs_fail(err, KVS_ERR_ARG, "keep=%g and window=%g must be in (0, 1]", c->keep,
                        c->window);
    if (cl) {
        if (c->s2 < 1 || c->s1 < c->s2 || c->s1 % c->s2)
            return kvs_fail(err, KVS_ERR_ARG, "s2=%d must divide s1=%d", c->s2, c->s1);
        if (!(c->rho1 > 0 && c->rho1 <= 1) || !(c->alpha >= 0 && c->alpha <= 1))
            return kvs_fail(err, KVS_ERR_ARG, "rho1=%g must be in (0, 1], alpha=%g in [0, 1]",
                            c->rho1, c->alpha);
        if (c->sim != KVS_MP_SIM_LINEAR && !(c->sim == KVS_MP_SIM_UB && c->levels == 1))
            return kvs_fail(err, KVS_ERR_ARG, "under the protocol the cluster score is linear, "
                            "or ub with levels=1 (the ablation step)");
        if (c->levels < 1 || c->levels > 2)
            return kvs_fail(err, KVS_ERR_ARG, "levels=%d must be 1 or 2", c->levels);
        if (c->share && c->skip + 1 >= nl)
            return kvs_fail(err, KVS_ERR_ARG, "share=on with skip=%d: no layer of this %d-layer "
                            "model would share (pass skip=0 or share=off)", c->skip, nl);
    }
    kvs_mpc_sel *s = calloc(1, sizeof *s);
    if (!s || !(s->layers = calloc((size_t)nl, sizeof *s->layers))) {
        free(s);
        return no_memory(err, "the selection state", (size_t)nl);
    }
    s->cfg = *cfg;
    s->cfg.static_step = st;
    s->cfg.mp.pad = 1;
    if (!cl)
        s->cfg.mp.share = 0;
    s->prompt_len = P;
    s->keep = st ? (c->keep > cfg->budget ? c->keep : cfg->budget) : 1.0;
    s->eta = kvs_mp_eta(cfg->budget, s->keep);
    s->window = kvs_mp_ceil_count(c->window, P);
    s->n_keep = st ? kvs_mp_ceil_count(s->keep, P) : P;
    s->n_pad = cl ? kvs_mp_n_clusters(s->n_keep, c->s1) * c->s1 : s->n_keep;
    s->compressed = !st;
    s->mark_pos = -1;
    L->sel = s;
    for (int l = 0; l < nl; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        kvs_mpc_cache_init(&y->rep1, L->s.n_kv_heads, L->s.head_dim);
        kvs_mpc_cache_init(&y->rep2, L->s.n_kv_heads, L->s.head_dim);
        if (st && is_selector(s, l) &&
            !(y->win = calloc((size_t)L->s.n_kv_heads * (size_t)P, sizeof *y->win))) {
            kvs_mpc_sel_free(L);
            return no_memory(err, "the window sums", (size_t)P);
        }
    }
    return KVS_OK;
}

void kvs_mpc_sel_free(kvs_mpc_llama *L)
{
    kvs_mpc_sel *s = L->sel;
    if (!s)
        return;
    for (int l = 0; s->layers && l < L->s.n_layers; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        free(y->win);
        free(y->gs);
        kvs_mpc_cache_free(&y->rep1);
        kvs_mpc_cache_free(&y->rep2);
        free(y->mx2);
        free(y->mn2);
        free(y->F);
    }
    free(s->layers);
    free(s);
    L->sel = NULL;
}

void kvs_mpc_sel_mark(kvs_mpc_llama *L)
{
    kvs_mpc_sel *s = L->sel;
    s->mark_pos = L->pos;
    for (int l = 0; l < L->s.n_layers; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        const size_t m[6] = {L->layers[l].k.len, L->layers[l].v.len, y->rep1.len, y->rep2.len,
                             y->n_box, (size_t)y->sealed};
        memcpy(y->mark, m, sizeof m);
    }
}

kvs_status kvs_mpc_sel_rewind(kvs_mpc_llama *L, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    if (!s || s->mark_pos < 0 || s->mark_pos > L->pos)
        return kvs_fail(err, KVS_ERR_ARG, "no mark to rewind to");
    L->pos = s->mark_pos;
    for (int l = 0; l < L->s.n_layers; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        L->layers[l].k.len = y->mark[0];
        L->layers[l].v.len = y->mark[1];
        y->rep1.len = y->mark[2];
        y->rep2.len = y->mark[3];
        y->n_box = y->mark[4];
        y->sealed = (int)y->mark[5];
    }
    return KVS_OK;
}

kvs_status kvs_mpc_sel_set_budget(kvs_mpc_llama *L, double budget, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    const double keep = s->cfg.static_step ? (s->cfg.mp.keep > budget ? s->cfg.mp.keep : budget)
                                           : 1.0;
    if (!(budget > 0 && budget <= 1) || keep != s->keep)
        return kvs_fail(err, KVS_ERR_ARG, "budget=%g: the static step kept %g of the prompt and "
                        "this budget needs %g", budget, s->keep, keep);
    s->cfg.budget = budget;
    s->eta = kvs_mp_eta(budget, keep);
    return KVS_OK;
}

int kvs_mpc_sel_active(const kvs_mpc_llama *L)
{
    const kvs_mpc_sel *s = L->sel;
    return s && s->compressed && s->cfg.mode != KVS_MPC_KV_FULL && L->pos >= s->prompt_len;
}

void kvs_mpc_sel_observe(kvs_mpc *m, kvs_mpc_llama *L, int l, const uint64_t *p, size_t n,
                         int pos, size_t T)
{
    kvs_mpc_sel *s = L->sel;
    uint64_t *win = s->layers[l].win;
    if (kvs_mpc_is_dealer(m) || !win || s->compressed)
        return;
    const size_t H = (size_t)L->s.n_heads, heads = (size_t)L->s.n_kv_heads, G = H / heads;
    const size_t P = (size_t)s->prompt_len;
    for (size_t r = 0; r < n; r++) {
        const int at = pos + (int)r;
        if (at < s->prompt_len - s->window || at >= s->prompt_len)
            continue;
        for (size_t hq = 0; hq < H; hq++) {
            const uint64_t *row = p + (r * H + hq) * T;
            uint64_t *w = win + hq / G * P;
            for (size_t t = 0; t < T && t < P; t++)
                w[t] += row[t];
        }
    }
}

/* Party b's shares of cache rows [t0, t0 + n) (n x heads x d): M = E + B, party 0 adds E. */
static void cache_shares(const kvs_mpc *m, const kvs_mpc_cache *c, size_t t0, size_t n,
                         uint64_t *out)
{
    const size_t w = (size_t)c->heads * c->d;
    for (size_t i = 0; i < n * w; i++)
        out[i] = c->B[t0 * w + i] + (m->role == KVS_MPC_P0 ? c->E[t0 * w + i] : 0);
}

/* Test-only (open_choices): opens M (heads x rows x cols of 0/1: a keep mask, rows 1, or a
 * one-hot F) and hands fn, per head, the columns where some row holds a 1, ascending. */
static kvs_status report_open(kvs_mpc *m, kvs_mpc_sel *s, kvs_mpc_choice_fn fn, int l,
                              const uint64_t *M, size_t heads, size_t rows, size_t cols,
                              kvs_error *err)
{
    if (!s->open_choices || kvs_mpc_is_dealer(m))
        return KVS_OK;
    const size_t n = heads * rows * cols;
    uint64_t *o = malloc(sizeof *o * (n + 1));
    int *idx = malloc(sizeof *idx * (cols + 1));
    kvs_status st = o && idx ? kvs_mpc_open(m, KVS_OP_OPEN, M, n, o, err)
                             : no_memory(err, "an opened choice", n);
    for (size_t h = 0; st == KVS_OK && h < heads; h++) {
        int k = 0;
        for (size_t c = 0; c < cols; c++) {
            uint64_t any = 0;
            for (size_t r = 0; r < rows; r++)
                any |= o[(h * rows + r) * cols + c];
            if (any)
                idx[k++] = (int)c;
        }
        if (fn)
            fn(s->choice_ctx, l, (int)h, idx, k);
    }
    free(o);
    free(idx);
    return st;
}

/* The k best of each of rows rows of len values (ties to the lower index) as their ordered
 * gather matrix G (rows x k x len): a top-k mask (sel, rows x len, left for the caller) by ranks
 * for the short rows of clusters, by a threshold for the long rows of tokens, then
 * kvs_mpc_gather_matrix. */
static kvs_status best_k(kvs_mpc *m, int by_threshold, const uint64_t *v, size_t rows,
                         size_t len, size_t k, int bits, uint64_t *sel, uint64_t *G,
                         kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    kvs_status st = by_threshold
                        ? kvs_mpc_topk_threshold(m, KVS_OP_TOPK, dealer ? NULL : v, rows, len,
                                                 k, bits, dealer ? NULL : sel, err)
                        : kvs_mpc_topk_mask(m, KVS_OP_TOPK, dealer ? NULL : v, rows, len, k,
                                            bits, dealer ? NULL : sel, err);
    if (st == KVS_OK)
        st = kvs_mpc_gather_matrix(m, KVS_OP_GATHER, dealer ? NULL : sel, rows, len, k,
                                   dealer ? NULL : G, err);
    return st;
}

/* ---- cluster boxes and representatives ---- */

/* The boxes of n_rows rows (n x heads x d shares; n_rows a multiple of s1) whose first `real`
 * are real: fine boxes over s2 rows (a dummy row copies its fine cluster's first row, and a
 * wholly dummy cluster copies row 0: its box is never used), coarse boxes from the fine ones
 * (a wholly dummy child copies its coarse cluster's first child). LINEAR: the representatives
 * go to the rep caches (coarse only with two levels); UB: the fine boxes to mx2/mn2. */
static kvs_status build_boxes(kvs_mpc *m, kvs_mpc_sel *s, kvs_mpc_sel_layer *y,
                              const uint64_t *rows, size_t n_rows, size_t real, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t s1 = (size_t)s->cfg.mp.s1, s2 = (size_t)s->cfg.mp.s2, r = s1 / s2;
    const size_t hd = (size_t)y->rep2.heads * y->rep2.d, nf = n_rows / s2, nc = n_rows / s1;
    const size_t a = 2 * nf * hd * s2, b = 2 * nf * hd, u = 2 * nc * hd * r;
    uint64_t *t = calloc(a + b + u + 2 * nc * hd + nf * hd + nc * hd + 1, sizeof *t);
    if (!t)
        return no_memory(err, "cluster boxes", a + u);
    uint64_t *fmx = t + a, *cu = fmx + b, *cmx = cu + u, *rep2 = cmx + 2 * nc * hd;
    uint64_t *rep1 = rep2 + nf * hd;
    for (size_t f = 0; !dealer && f < nf; f++)
        for (size_t j = 0; j < s2; j++) {
            size_t src = f * s2 + j;
            if (src >= real)
                src = f * s2 < real ? f * s2 : 0;
            for (size_t q = 0; q < hd; q++) {
                const uint64_t v = rows[src * hd + q];
                t[(f * hd + q) * s2 + j] = v;
                t[(nf * hd + f * hd + q) * s2 + j] = (uint64_t)0 - v;
            }
        }
    const int f = m->frac;
    kvs_status st = kvs_mpc_max_rows(m, KVS_OP_TOPK, dealer ? NULL : t, 2 * nf * hd, s2,
                                     KEY_BITS(f), dealer ? NULL : fmx, err);
    const int coarse = s->cfg.mp.levels >= 2 && s->cfg.mp.sim == KVS_MP_SIM_LINEAR;
    for (size_t c = 0; coarse && !dealer && c < nc; c++)
        for (size_t k = 0; k < r; k++) {
            const size_t ch = (c * r + k) * s2 < real || c * r * s2 >= real ? c * r + k : c * r;
            for (size_t half = 0; half < 2; half++)
                for (size_t q = 0; q < hd; q++)
                    cu[((half * nc + c) * hd + q) * r + k] = fmx[(half * nf + ch) * hd + q];
        }
    if (st == KVS_OK && coarse)
        st = kvs_mpc_max_rows(m, KVS_OP_TOPK, dealer ? NULL : cu, 2 * nc * hd, r, KEY_BITS(f),
                              dealer ? NULL : cmx, err);
    if (st == KVS_OK && s->cfg.mp.sim == KVS_MP_SIM_UB) {
        /* fine boxes kept as shares: max, and min = -max(-x) */
        if (y->n_box + nf > y->cap_box) {
            const size_t cap = 2 * (y->n_box + nf);
            uint64_t *x1 = realloc(y->mx2, sizeof *x1 * cap * hd);
            if (x1)
                y->mx2 = x1;
            uint64_t *x2 = realloc(y->mn2, sizeof *x2 * cap * hd);
            if (x2)
                y->mn2 = x2;
            if (!x1 || !x2) {
                free(t);
                return no_memory(err, "cluster boxes", cap * hd);
            }
            y->cap_box = cap;
        }
        for (size_t q = 0; !dealer && q < nf * hd; q++) {
            y->mx2[y->n_box * hd + q] = fmx[q];
            y->mn2[y->n_box * hd + q] = (uint64_t)0 - fmx[nf * hd + q];
        }
        y->n_box += nf;
        free(t);
        return KVS_OK;
    }
    /* alpha max + (1 - alpha) min = alpha max - (1 - alpha) max(-x), then one truncation */
    const uint64_t alpha = kvs_fx_encode(s->cfg.mp.alpha, f), beta = ((uint64_t)1 << f) - alpha;
    for (size_t q = 0; !dealer && q < nf * hd; q++)
        rep2[q] = alpha * fmx[q] - beta * fmx[nf * hd + q];
    for (size_t q = 0; !dealer && coarse && q < nc * hd; q++)
        rep1[q] = alpha * cmx[q] - beta * cmx[nc * hd + q];
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_TOPK, dealer ? NULL : rep2, nf * hd + (coarse ? nc * hd : 0),
                           f, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_TOPK, &y->rep2, dealer ? NULL : rep2, nf, err);
    if (st == KVS_OK && coarse)
        st = kvs_mpc_cache_append(m, KVS_OP_TOPK, &y->rep1, dealer ? NULL : rep1, nc, err);
    free(t);
    return st;
}

/* ---- the static step ---- */

/* Layer l's kept rows: the gather of its cache by gs (heads x N x P), as rows [p][h][i] into
 * out (n_pad rows: the dummies copy the first row of the last real fine cluster). */
static kvs_status kept_rows(kvs_mpc *m, const kvs_mpc_sel *s, const kvs_mpc_cache *c,
                            const uint64_t *gs, uint64_t *out, uint64_t *tmp, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t N = (size_t)s->n_keep, heads = (size_t)c->heads, d = (size_t)c->d;
    const size_t w = heads * d;
    kvs_status st = KVS_OK;
    if (N < (size_t)s->prompt_len) {
        st = kvs_mpc_cache_gather(m, KVS_OP_GATHER, c, dealer ? NULL : gs, N, 1,
                                  dealer ? NULL : tmp, err);
        for (size_t h = 0; !dealer && h < heads; h++)
            for (size_t p = 0; p < N; p++)
                memcpy(out + p * w + h * d, tmp + (h * N + p) * d, sizeof *out * d);
    } else if (!dealer) {
        cache_shares(m, c, 0, N, out);
    }
    const size_t s2 = cluster_mode(s) ? (size_t)s->cfg.mp.s2 : 1, anchor = (N - 1) / s2 * s2;
    for (size_t p = N; !dealer && p < (size_t)s->n_pad; p++)
        memcpy(out + p * w, out + anchor * w, sizeof *out * w);
    return st;
}

kvs_status kvs_mpc_sel_compress(kvs_mpc *m, kvs_mpc_llama *L, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    const int dealer = kvs_mpc_is_dealer(m), f = m->frac;
    const size_t P = (size_t)s->prompt_len, N = (size_t)s->n_keep, Np = (size_t)s->n_pad;
    const size_t heads = (size_t)L->s.n_kv_heads, w = heads * (size_t)L->s.head_dim;
    if (s->compressed)
        return KVS_OK;
    if (L->layers[0].k.len != P)
        return kvs_fail(err, KVS_ERR_ARG, "the static step needs the %zu prompt rows (%zu held)",
                        P, L->layers[0].k.len);
    uint64_t *mask = calloc(heads * P + 2 * Np * w + N * w + 1, sizeof *mask);
    if (!mask)
        return no_memory(err, "the static step", heads * P + 2 * Np * w);
    uint64_t *kr = mask + heads * P, *vr = kr + Np * w, *tmp = vr + Np * w;
    kvs_status st = KVS_OK;
    for (int l = 0; l < L->s.n_layers && st == KVS_OK; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        kvs_mpc_layer *Ly = &L->layers[l];
        const uint64_t *gs = NULL;
        if (N < P && is_selector(s, l)) {
            /* the N best window sums of each head, then their ordered gather matrix */
            if (!(y->gs = calloc(heads * N * P, sizeof *y->gs))) {
                st = no_memory(err, "the static gather", heads * N * P);
                break;
            }
            st = best_k(m, 1, y->win, heads, P, N, SUM_BITS(f), mask, y->gs, err);
            if (st == KVS_OK && s->open_choices)
                st = report_open(m, s, s->on_keep, l, mask, heads, 1, P, err);
            gs = y->gs;
        } else if (N < P) {
            gs = s->layers[kvs_mp_partner(&s->cfg.mp, l)].gs;
        }
        if (st == KVS_OK)
            st = kept_rows(m, s, &Ly->k, gs, kr, tmp, err);
        if (st == KVS_OK)
            st = kept_rows(m, s, &Ly->v, gs, vr, tmp, err);
        if (st != KVS_OK)
            break;
        kvs_mpc_cache_free(&Ly->k);
        kvs_mpc_cache_free(&Ly->v);
        st = kvs_mpc_cache_append(m, KVS_OP_GATHER, &Ly->k, dealer ? NULL : kr, Np, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_append(m, KVS_OP_GATHER, &Ly->v, dealer ? NULL : vr, Np, err);
        if (st == KVS_OK && cluster_mode(s) && is_selector(s, l))
            st = build_boxes(m, s, y, dealer ? NULL : kr, Np, N, err);
        free(y->win);
        y->win = NULL;
    }
    for (int l = 0; l < L->s.n_layers; l++) {
        free(s->layers[l].gs);
        s->layers[l].gs = NULL;
    }
    free(mask);
    if (st == KVS_OK)
        s->compressed = 1;
    return st;
}

/* ---- decode ---- */

kvs_status kvs_mpc_sel_seal(kvs_mpc *m, kvs_mpc_llama *L, int l, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    kvs_mpc_sel_layer *y = &s->layers[l];
    const kvs_mpc_cache *k = &L->layers[l].k;
    const size_t s1 = (size_t)s->cfg.mp.s1, w = (size_t)k->heads * k->d;
    if (!cluster_mode(s))
        return KVS_OK;
    kvs_status st = KVS_OK;
    while (st == KVS_OK && k->len - (size_t)s->n_pad - (size_t)y->sealed >= s1) {
        if (is_selector(s, l)) {
            uint64_t *rows = malloc(sizeof *rows * (s1 * w + 1));
            if (!rows)
                return no_memory(err, "a sealed cluster", s1 * w);
            if (!kvs_mpc_is_dealer(m))
                cache_shares(m, k, (size_t)(s->n_pad + y->sealed), s1, rows);
            st = build_boxes(m, s, y, rows, s1, s1, err);
            free(rows);
        }
        y->sealed += (int)s1;
    }
    return st;
}

/* Whether slot v of the padded layout holds a real token. */
static int slot_real(const kvs_mpc_sel *s, size_t v)
{
    return v < (size_t)s->n_keep || v >= (size_t)s->n_pad;
}

/* The fine scores of every fine cluster (heads x C2x at 2 frac), wholly dummy ones penalised. */
static kvs_status fine_scores(kvs_mpc *m, kvs_mpc_sel *s, kvs_mpc_sel_layer *y,
                              const uint64_t *qs, size_t C2x, uint64_t *sc, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m), f = m->frac;
    const size_t heads = (size_t)y->rep2.heads, d = (size_t)y->rep2.d, s2 = (size_t)s->cfg.mp.s2;
    kvs_status st = KVS_OK;
    if (s->cfg.mp.sim == KVS_MP_SIM_LINEAR) {
        st = kvs_mpc_cache_qk(m, KVS_OP_TOPK, &y->rep2, dealer ? NULL : qs, 1, 1,
                              dealer ? NULL : sc, err);
    } else { /* UB: sum over channels of max(qs_i mx_i, qs_i mn_i) */
        const size_t n = C2x * heads * d;
        uint64_t *x = malloc(sizeof *x * (4 * n + 1));
        if (!x)
            return no_memory(err, "bound scores", 4 * n);
        uint64_t *yv = x + 2 * n;
        for (size_t c = 0; !dealer && c < C2x; c++)
            for (size_t h = 0; h < heads; h++)
                for (size_t i = 0; i < d; i++) {
                    const size_t q = (c * heads + h) * d + i, o = (h * C2x + c) * d + i;
                    x[o] = x[n + o] = qs[h * d + i];
                    yv[o] = y->mx2[q];
                    yv[n + o] = y->mn2[q];
                }
        st = kvs_mpc_mul(m, KVS_OP_TOPK, dealer ? NULL : x, dealer ? NULL : yv, 2 * n,
                         dealer ? NULL : x, err);
        if (st == KVS_OK)
            st = kvs_mpc_max2(m, KVS_OP_TOPK, dealer ? NULL : x, dealer ? NULL : x + n, n,
                              SCORE_BITS(f), dealer ? NULL : x, err);
        for (size_t o = 0; !dealer && o < heads * C2x; o++) {
            uint64_t acc = 0;
            for (size_t i = 0; i < d; i++)
                acc += x[o * d + i];
            sc[o] = acc;
        }
        free(x);
    }
    for (size_t h = 0; !dealer && h < heads; h++)
        for (size_t c = 0; c < C2x; c++)
            if (!slot_real(s, c * s2)) /* a wholly dummy fine cluster */
                sc[h * C2x + c] = kvs_mpc_add_public(m, sc[h * C2x + c], penalty(f));
    return st;
}

/* A selecting layer's choice: F (heads x n2 x C2x) one-hot over fine clusters. */
static kvs_status choose(kvs_mpc *m, kvs_mpc_llama *L, kvs_mpc_sel_layer *y, const uint64_t *q,
                         const kvs_mp_shape *sh, uint64_t *F, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    const int dealer = kvs_mpc_is_dealer(m), f = m->frac;
    const size_t heads = (size_t)L->s.n_kv_heads, d = (size_t)L->s.head_dim;
    const size_t G = (size_t)L->s.n_heads / heads, r = (size_t)(s->cfg.mp.s1 / s->cfg.mp.s2);
    const size_t C2x = (size_t)sh->C2x, C1 = (size_t)sh->C1, n1 = (size_t)sh->n1;
    const size_t nc = (size_t)sh->n_cand, n2 = (size_t)sh->n2;
    const size_t words = heads * (d + C2x + C1 + C1 + n1 * C1 + C1 * r + nc + nc + n2 * nc +
                                  nc * C2x) + 1;
    uint64_t *qs = calloc(words, sizeof *qs);
    if (!qs)
        return no_memory(err, "a cluster choice", words);
    uint64_t *all2 = qs + heads * d, *sc1 = all2 + heads * C2x, *sel1 = sc1 + heads * C1;
    uint64_t *G1 = sel1 + heads * C1, *A2 = G1 + heads * n1 * C1, *sc2 = A2 + heads * C1 * r;
    uint64_t *sel2 = sc2 + heads * nc, *G2 = sel2 + heads * nc, *E1 = G2 + heads * n2 * nc;
    for (size_t h = 0; !dealer && h < heads; h++) /* qs: the group's queries summed */
        for (size_t g = 0; g < G; g++)
            for (size_t i = 0; i < d; i++)
                qs[h * d + i] += q[(h * G + g) * d + i];
    kvs_status st = fine_scores(m, s, y, qs, C2x, all2, err);
    if (s->cfg.mp.levels >= 2) {
        /* coarse top-k, then the chosen clusters' children's scores by the coarse gather */
        if (st == KVS_OK)
            st = kvs_mpc_cache_qk(m, KVS_OP_TOPK, &y->rep1, dealer ? NULL : qs, 1, 1,
                                  dealer ? NULL : sc1, err);
        if (st == KVS_OK)
            st = best_k(m, 0, sc1, heads, C1, n1, SCORE_BITS(f), sel1, G1, err);
        for (size_t i = 0; !dealer && i < heads * C1 * r; i++)
            A2[i] = all2[i]; /* [h][c][j] = fine cluster c r + j */
        if (st == KVS_OK)
            st = kvs_mpc_matmul_batch(m, KVS_OP_GATHER, dealer ? NULL : G1, dealer ? NULL : A2,
                                      heads, n1, C1, r, dealer ? NULL : sc2, err);
    } else {
        memcpy(sc2, all2, sizeof *sc2 * heads * C2x);
    }
    /* one level: the fine choice's gather matrix is F itself */
    const int one = s->cfg.mp.levels < 2;
    if (st == KVS_OK)
        st = best_k(m, 0, sc2, heads, nc, n2, SCORE_BITS(f), sel2, one ? F : G2, err);
    if (one) {
        free(qs);
        return st;
    }
    /* F = G2 E1 with E1[(q, j)][c] = G1[q][c / r] [c mod r == j]: the fine cluster of each chosen
     * candidate */
    for (size_t h = 0; !dealer && h < heads; h++)
        for (size_t a = 0; a < n1; a++)
            for (size_t j = 0; j < r; j++)
                for (size_t c = 0; c < C1; c++)
                    E1[(h * nc + a * r + j) * C2x + c * r + j] = G1[(h * n1 + a) * C1 + c];
    if (st == KVS_OK)
        st = kvs_mpc_matmul_batch(m, KVS_OP_GATHER, dealer ? NULL : G2, dealer ? NULL : E1,
                                  heads, n2, nc, C2x, dealer ? NULL : F, err);
    free(qs);
    return st;
}

/* Softmax over rows (h, g) of the gathered scores then the always-attended ones, and the
 * probabilities back: shared by the token-level and the cluster paths. Gs: heads x k x C one-hot
 * of clusters of s slots (C s = the gathered slots, [0, C s) of the cache); S: heads x G x len
 * scores, at frac (token level) or, with masked (the cluster path), at 2 frac, truncated after
 * the gather, and valid (heads x k s shares of 0/1) masks the dummy slots; Pfull: heads x G x
 * len. */
static kvs_status sparse_softmax(kvs_mpc *m, const uint64_t *Gs, const uint64_t *S,
                                 int masked, const uint64_t *valid, size_t heads, size_t G,
                                 size_t len, size_t k, size_t C, size_t s, uint64_t *Pfull,
                                 kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t cs = C * s, tail = len - cs, ks = k * s, W = ks + tail, rows = heads * G;
    const size_t words = heads * G * (2 * cs + ks) + heads * C * k + 3 * rows * W + 3 * rows;
    uint64_t *Sc = calloc(words + 1, sizeof *Sc);
    size_t *vlen = malloc(sizeof *vlen * (rows + 1));
    if (!Sc || !vlen) {
        free(Sc);
        free(vlen);
        return no_memory(err, "a sparse softmax", words);
    }
    uint64_t *Ss = Sc + heads * cs * G, *Ft = Ss + heads * ks * G, *Pc = Ft + heads * C * k;
    uint64_t *lg = Pc + heads * cs * G, *mk = lg + rows * W, *tmp = mk + rows * W;
    uint64_t *row = tmp + rows * W;
    for (size_t i = 0; i < rows; i++)
        vlen[i] = W;
    /* Sc[h][c][(j, g)] = S[h][g][c s + j] */
    for (size_t h = 0; !dealer && h < heads; h++)
        for (size_t c = 0; c < C; c++)
            for (size_t j = 0; j < s; j++)
                for (size_t g = 0; g < G; g++)
                    Sc[((h * C + c) * s + j) * G + g] = S[(h * G + g) * len + c * s + j];
    kvs_status st = kvs_mpc_matmul_batch(m, KVS_OP_GATHER, dealer ? NULL : Gs,
                                         dealer ? NULL : Sc, heads, k, C, s * G,
                                         dealer ? NULL : Ss, err);
    for (size_t h = 0; !dealer && h < heads; h++)
        for (size_t g = 0; g < G; g++) {
            uint64_t *o = lg + (h * G + g) * W, *mo = mk + (h * G + g) * W;
            for (size_t p = 0; p < ks; p++) {
                o[p] = Ss[(h * ks + p) * G + g];
                mo[p] = masked ? valid[h * ks + p] : (m->role == KVS_MPC_P0);
            }
            for (size_t t = 0; t < tail; t++) {
                o[ks + t] = S[(h * G + g) * len + cs + t];
                mo[ks + t] = m->role == KVS_MPC_P0;
            }
        }
    /* the cluster path's scores come at 2 frac: F picks one score exactly, so truncating
     * after the gather equals truncating before it, on n2 s2 + tail scores instead of all */
    if (st == KVS_OK && masked)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : lg, rows * W, m->frac, err);
    if (st == KVS_OK)
        st = kvs_mpc_softmax(m, dealer ? NULL : lg, rows, W, vlen, masked,
                             dealer ? NULL : mk, dealer ? NULL : tmp,
                             dealer ? NULL : row, err);
    /* the probabilities back: Pc[h] = Gs[h]^T (C x k) times Ps[h] (k x s G) */
    for (size_t h = 0; !dealer && h < heads; h++) {
        for (size_t p = 0; p < k; p++)
            for (size_t c = 0; c < C; c++)
                Ft[(h * C + c) * k + p] = Gs[(h * k + p) * C + c];
        for (size_t g = 0; g < G; g++)
            for (size_t p = 0; p < ks; p++)
                Ss[(h * ks + p) * G + g] = lg[(h * G + g) * W + p];
    }
    if (st == KVS_OK)
        st = kvs_mpc_matmul_batch(m, KVS_OP_GATHER, dealer ? NULL : Ft, dealer ? NULL : Ss,
                                  heads, C, k, s * G, dealer ? NULL : Pc, err);
    for (size_t h = 0; !dealer && st == KVS_OK && h < heads; h++)
        for (size_t g = 0; g < G; g++) {
            uint64_t *o = Pfull + (h * G + g) * len;
            for (size_t t = 0; t < cs; t++)
                o[t] = Pc[((h * C + t / s) * s + t % s) * G + g];
            for (size_t t = 0; t < tail; t++)
                o[cs + t] = lg[(h * G + g) * W + ks + t];
        }
    free(vlen);
    free(Sc);
    return st;
}

kvs_status kvs_mpc_sel_attend(kvs_mpc *m, kvs_mpc_llama *L, int l, const uint64_t *q,
                              uint64_t *out, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    kvs_mpc_sel_layer *y = &s->layers[l];
    kvs_mpc_layer *Ly = &L->layers[l];
    const int dealer = kvs_mpc_is_dealer(m), f = m->frac;
    const size_t heads = (size_t)L->s.n_kv_heads, G = (size_t)L->s.n_heads / heads;
    const size_t len = Ly->k.len, s2 = (size_t)s->cfg.mp.s2;
    uint64_t *S = malloc(sizeof *S * (heads * G * len * 2 + heads * len + 1));
    if (!S)
        return no_memory(err, "attention scores", heads * G * len);
    uint64_t *Pfull = S + heads * G * len, *aux = Pfull + heads * G * len;
    kvs_status st = kvs_mpc_cache_qk(m, KVS_OP_MATMUL, &Ly->k, dealer ? NULL : q, 1, (int)G,
                                     dealer ? NULL : S, err);
    /* the token-level path ranks these scores: truncated here (the cluster path truncates the
     * gathered ones only, sparse_softmax) */
    if (st == KVS_OK && s->cfg.mode == KVS_MPC_KV_TOKEN)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : S, heads * G * len, f, err);
    uint64_t *Gs = NULL, *valid = NULL;
    size_t k = 0, C = 0, cs = 1;
    if (st == KVS_OK && s->cfg.mode == KVS_MPC_KV_TOKEN) {
        /* top-k by q . k summed over the group, over every slot but the newest */
        C = len - 1;
        k = (size_t)kvs_mp_ceil_count(s->eta, (int)C);
        for (size_t h = 0; !dealer && h < heads; h++)
            for (size_t t = 0; t < C; t++) {
                uint64_t acc = 0;
                for (size_t g = 0; g < G; g++)
                    acc += S[(h * G + g) * len + t];
                aux[h * C + t] = acc;
            }
        uint64_t *mask = malloc(sizeof *mask * (heads * C + 1));
        Gs = calloc(heads * k * C + 1, sizeof *Gs);
        if (!mask || !Gs)
            st = no_memory(err, "a token gather", heads * k * C);
        if (st == KVS_OK)
            st = best_k(m, 1, aux, heads, C, k, SUM_BITS(f), mask, Gs, err);
        free(mask);
    } else if (st == KVS_OK) {
        kvs_mp_shape sh;
        kvs_mp_shape_of(&s->cfg.mp, s->eta, s->n_keep, y->sealed, &sh);
        C = (size_t)sh.C2x;
        k = (size_t)sh.n2;
        cs = s2;
        free(y->F);
        if (!(y->F = calloc(heads * k * C + 1, sizeof *y->F)) ||
            !(valid = calloc(heads * k * s2 + 1, sizeof *valid)))
            st = no_memory(err, "a cluster choice", heads * k * C);
        if (st == KVS_OK && !is_selector(s, l)) { /* the partner's choice (§2.4) */
            if (!dealer)
                memcpy(y->F, s->layers[kvs_mp_partner(&s->cfg.mp, l)].F,
                       sizeof *y->F * heads * k * C);
        } else if (st == KVS_OK && sh.n2 >= sh.C2) { /* every real fine cluster: public */
            for (size_t h = 0; m->role == KVS_MPC_P0 && h < heads; h++)
                for (size_t c = 0, p = 0; c < C && p < k; c++)
                    if (slot_real(s, c * s2))
                        y->F[(h * k + p++) * C + c] = 1;
        } else if (st == KVS_OK) {
            st = choose(m, L, y, q, &sh, y->F, err);
        }
        if (st == KVS_OK && is_selector(s, l))
            st = report_open(m, s, s->on_choice, l, y->F, heads, k, C, err);
        /* valid[h][p][j] = sum_c F[h][p][c] [slot c s2 + j is real]: local */
        for (size_t h = 0; !dealer && h < heads; h++)
            for (size_t p = 0; p < k; p++)
                for (size_t c = 0; c < C; c++)
                    for (size_t j = 0; j < s2; j++)
                        if (slot_real(s, c * s2 + j))
                            valid[(h * k + p) * s2 + j] += y->F[(h * k + p) * C + c];
        Gs = y->F;
    }
    if (st == KVS_OK)
        st = sparse_softmax(m, dealer ? NULL : Gs, dealer ? NULL : S,
                            s->cfg.mode == KVS_MPC_KV_CLUSTER, dealer ? NULL : valid, heads, G,
                            len, k, C, cs, dealer ? NULL : Pfull, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_pv(m, KVS_OP_MATMUL, &Ly->v, dealer ? NULL : Pfull, 1, (int)G,
                              dealer ? NULL : out, err);
    if (s->cfg.mode == KVS_MPC_KV_TOKEN)
        free(Gs);
    free(valid);
    free(S);
    return st;
}
