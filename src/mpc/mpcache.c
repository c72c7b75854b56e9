/* MPCache and the token-level baseline on secret shares (mpcache.h): the configuration, the
 * state and its life (attach, mark, rewind), the window sums of the prefill, and the helpers the
 * static step (mpcache_static.c) and the decode step (mpcache_decode.c) share.
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
#include "mpc/mpcache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/gates_select.h"
#include "policies/mpcache.h"
#include "policies/registry.h"

kvs_status kvs_mpcache_no_memory(kvs_error *err, const char *what, size_t n)
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

int kvs_mpcache_is_selector(const kvs_mpc_sel *s, int l)
{
    return !kvs_mpcache_cluster_mode(s) || kvs_mp_is_selector(&s->cfg.mp, l);
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
        return kvs_mpcache_no_memory(err, "the selection state", (size_t)nl);
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
        if (st && kvs_mpcache_is_selector(s, l) &&
            !(y->win = calloc((size_t)L->s.n_kv_heads * (size_t)P, sizeof *y->win))) {
            kvs_mpc_sel_free(L);
            return kvs_mpcache_no_memory(err, "the window sums", (size_t)P);
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

void kvs_mpcache_cache_shares(const kvs_mpc *m, const kvs_mpc_cache *c, size_t t0, size_t n,
                              uint64_t *out)
{
    const size_t w = (size_t)c->heads * c->d;
    for (size_t i = 0; i < n * w; i++)
        out[i] = c->B[t0 * w + i] + (m->role == KVS_MPC_P0 ? c->E[t0 * w + i] : 0);
}

kvs_status kvs_mpcache_report_open(kvs_mpc *m, kvs_mpc_sel *s, kvs_mpc_choice_fn fn, int l,
                                   const uint64_t *M, size_t heads, size_t rows, size_t cols,
                                   kvs_error *err)
{
    if (!s->open_choices || kvs_mpc_is_dealer(m))
        return KVS_OK;
    const size_t n = heads * rows * cols;
    uint64_t *o = malloc(sizeof *o * (n + 1));
    int *idx = malloc(sizeof *idx * (cols + 1));
    kvs_status st = o && idx ? kvs_mpc_open(m, KVS_OP_OPEN, M, n, o, err)
                             : kvs_mpcache_no_memory(err, "an opened choice", n);
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

kvs_status kvs_mpcache_best_k(kvs_mpc *m, int by_threshold, const uint64_t *v, size_t rows,
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

