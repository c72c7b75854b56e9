/* MPCache's static step on shares at the prompt's end, and the cluster boxes and
 * representatives of the kept slots and of each sealed tail of decode tokens (mpcache.h). */
#include "mpc/mpcache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/fxp.h"
#include "mpc/gates_select.h"

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
        return kvs_mpcache_no_memory(err, "cluster boxes", a + u);
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
                return kvs_mpcache_no_memory(err, "cluster boxes", cap * hd);
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
        kvs_mpcache_cache_shares(m, c, 0, N, out);
    }
    const size_t s2 = kvs_mpcache_cluster_mode(s) ? (size_t)s->cfg.mp.s2 : 1;
    const size_t anchor = (N - 1) / s2 * s2;
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
        return kvs_mpcache_no_memory(err, "the static step", heads * P + 2 * Np * w);
    uint64_t *kr = mask + heads * P, *vr = kr + Np * w, *tmp = vr + Np * w;
    kvs_status st = KVS_OK;
    for (int l = 0; l < L->s.n_layers && st == KVS_OK; l++) {
        kvs_mpc_sel_layer *y = &s->layers[l];
        kvs_mpc_layer *Ly = &L->layers[l];
        const uint64_t *gs = NULL;
        if (N < P && kvs_mpcache_is_selector(s, l)) {
            /* the N best window sums of each head, then their ordered gather matrix */
            if (!(y->gs = calloc(heads * N * P, sizeof *y->gs))) {
                st = kvs_mpcache_no_memory(err, "the static gather", heads * N * P);
                break;
            }
            st = kvs_mpcache_best_k(m, 1, y->win, heads, P, N, SUM_BITS(f), mask, y->gs, err);
            if (st == KVS_OK && s->open_choices)
                st = kvs_mpcache_report_open(m, s, s->on_keep, l, mask, heads, 1, P, err);
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
        if (st == KVS_OK && kvs_mpcache_cluster_mode(s) && kvs_mpcache_is_selector(s, l))
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

/* ---- sealing a tail of decode tokens ---- */

kvs_status kvs_mpc_sel_seal(kvs_mpc *m, kvs_mpc_llama *L, int l, kvs_error *err)
{
    kvs_mpc_sel *s = L->sel;
    kvs_mpc_sel_layer *y = &s->layers[l];
    const kvs_mpc_cache *k = &L->layers[l].k;
    const size_t s1 = (size_t)s->cfg.mp.s1, w = (size_t)k->heads * k->d;
    if (!kvs_mpcache_cluster_mode(s))
        return KVS_OK;
    kvs_status st = KVS_OK;
    while (st == KVS_OK && k->len - (size_t)s->n_pad - (size_t)y->sealed >= s1) {
        if (kvs_mpcache_is_selector(s, l)) {
            uint64_t *rows = malloc(sizeof *rows * (s1 * w + 1));
            if (!rows)
                return kvs_mpcache_no_memory(err, "a sealed cluster", s1 * w);
            if (!kvs_mpc_is_dealer(m))
                kvs_mpcache_cache_shares(m, k, (size_t)(s->n_pad + y->sealed), s1, rows);
            st = build_boxes(m, s, y, rows, s1, s1, err);
            free(rows);
        }
        y->sealed += (int)s1;
    }
    return st;
}

