/* The emulator's KV selection (fx_llama.h): mpcache_static.c's and mpcache_decode.c's steps on
 * clear values — the top-k masks are kvs_fx_topk_mask (ties to the lower index), a gather by a
 * one-hot is an index, and a wholly dummy cluster's score carries the protocol's penalty. */
#include "mpc/fx_llama_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/debug.h"
#include "mpc/fxp.h"
#include "mpc/gates_select.h"
#include "mpc/mpcache_internal.h"

void kvs_fx_sel_observe(kvs_fx_llama *E, int l, const uint64_t *p, int pos, size_t T)
{
    kvs_mpc_sel *s = E->plan.sel;
    uint64_t *win = s->layers[l].win;
    if (!win || s->compressed || pos < s->prompt_len - s->window || pos >= s->prompt_len)
        return;
    const size_t H = (size_t)E->plan.s.n_heads, G = H / (size_t)E->plan.s.n_kv_heads;
    const size_t P = (size_t)s->prompt_len;
    for (size_t hq = 0; hq < H; hq++)
        for (size_t t = 0; t < T && t < P; t++)
            win[hq / G * P + t] += p[hq * T + t];
}

/* The k best of len values (ties to the lower index), ascending, into idx. */
static kvs_status best_k(const uint64_t *v, size_t len, size_t k, int *idx, kvs_error *err)
{
    uint64_t *sel = malloc(sizeof *sel * (len + 1));
    if (!sel)
        return kvs_mpcache_no_memory(err, "a top-k", len);
    kvs_fx_topk_mask(v, 1, len, k, sel);
    for (size_t i = 0, n = 0; i < len; i++)
        if (sel[i])
            idx[n++] = (int)i;
    free(sel);
    return KVS_OK;
}

/* Appends n rows of hd words to a growing array. */
static kvs_status push_rows(uint64_t **a, size_t *len, size_t *cap, const uint64_t *rows,
                            size_t n, size_t hd, kvs_error *err)
{
    if (*len + n > *cap) {
        const size_t c = 2 * (*len + n);
        uint64_t *x = realloc(*a, sizeof *x * c * hd);
        if (!x)
            return kvs_mpcache_no_memory(err, "cluster representatives", c * hd);
        *a = x;
        *cap = c;
    }
    memcpy(*a + *len * hd, rows, sizeof *rows * n * hd);
    *len += n;
    return KVS_OK;
}

/* build_boxes of mpcache_static.c: n_rows rows (rows x heads x d), the first real real; the
 * representatives alpha max + (1 - alpha) min of the fine clusters and, with two levels, of the
 * coarse ones (the boxes of their children, a wholly dummy child standing for its first). */
static kvs_status build_reps(kvs_fx_llama *E, kvs_fx_layer *y, const uint64_t *rows,
                             size_t n_rows, size_t real, kvs_error *err)
{
    const kvs_mpc_sel *s = E->plan.sel;
    const int f = E->frac;
    const size_t s1 = (size_t)s->cfg.mp.s1, s2 = (size_t)s->cfg.mp.s2, r = s1 / s2;
    const size_t hd = (size_t)E->plan.s.n_kv_heads * E->plan.s.head_dim;
    const size_t nf = n_rows / s2, nc = n_rows / s1;
    const int coarse = s->cfg.mp.levels >= 2;
    uint64_t *mx = malloc(sizeof *mx * (2 * nf * hd + 2 * nc * hd + nf * hd + nc * hd + 1));
    if (!mx)
        return kvs_mpcache_no_memory(err, "cluster boxes", nf * hd);
    uint64_t *nmx = mx + nf * hd, *cmx = nmx + nf * hd, *cnmx = cmx + nc * hd;
    uint64_t *rep2 = cnmx + nc * hd, *rep1 = rep2 + nf * hd;
    for (size_t c = 0; c < nf; c++)
        for (size_t q = 0; q < hd; q++) {
            int64_t hi = 0, nhi = 0;
            for (size_t j = 0; j < s2; j++) {
                size_t src = c * s2 + j;
                if (src >= real)
                    src = c * s2 < real ? c * s2 : 0;
                const int64_t v = (int64_t)rows[src * hd + q], nv = (int64_t)(0 - (uint64_t)v);
                hi = j == 0 || v > hi ? v : hi;
                nhi = j == 0 || nv > nhi ? nv : nhi;
            }
            mx[c * hd + q] = (uint64_t)hi;
            nmx[c * hd + q] = (uint64_t)nhi;
        }
    for (size_t c = 0; coarse && c < nc; c++)
        for (size_t q = 0; q < hd; q++) {
            int64_t hi = 0, nhi = 0;
            for (size_t k = 0; k < r; k++) {
                const size_t ch = (c * r + k) * s2 < real || c * r * s2 >= real ? c * r + k
                                                                                 : c * r;
                const int64_t v = (int64_t)mx[ch * hd + q], nv = (int64_t)nmx[ch * hd + q];
                hi = k == 0 || v > hi ? v : hi;
                nhi = k == 0 || nv > nhi ? nv : nhi;
            }
            cmx[c * hd + q] = (uint64_t)hi;
            cnmx[c * hd + q] = (uint64_t)nhi;
        }
    const uint64_t alpha = kvs_fx_encode(s->cfg.mp.alpha, f), beta = ((uint64_t)1 << f) - alpha;
    for (size_t q = 0; q < nf * hd; q++)
        rep2[q] = kvs_fx_ars(alpha * mx[q] - beta * nmx[q], f);
    for (size_t q = 0; coarse && q < nc * hd; q++)
        rep1[q] = kvs_fx_ars(alpha * cmx[q] - beta * cnmx[q], f);
    kvs_status st = push_rows(&y->rep2, &y->n_rep2, &y->cap_rep2, rep2, nf, hd, err);
    if (st == KVS_OK && coarse)
        st = push_rows(&y->rep1, &y->n_rep1, &y->cap_rep1, rep1, nc, hd, err);
    free(mx);
    return st;
}

/* kept_rows of mpcache_static.c: head h's kept positions' rows in order, then the dummies (the
 * first row of the last real fine cluster). */
static void kept_rows(const kvs_fx_llama *E, const uint64_t *C, const int *keep, uint64_t *out)
{
    const kvs_mpc_sel *s = E->plan.sel;
    const size_t N = (size_t)s->n_keep, heads = (size_t)E->plan.s.n_kv_heads;
    const size_t d = (size_t)E->plan.s.head_dim, w = heads * d;
    for (size_t p = 0; p < N; p++)
        for (size_t h = 0; h < heads; h++) {
            const size_t src = keep ? (size_t)keep[h * N + p] : p;
            memcpy(out + p * w + h * d, C + src * w + h * d, sizeof *out * d);
        }
    const size_t s2 = kvs_mpcache_cluster_mode(s) ? (size_t)s->cfg.mp.s2 : 1;
    const size_t anchor = (N - 1) / s2 * s2;
    for (size_t p = N; p < (size_t)s->n_pad; p++)
        memcpy(out + p * w, out + anchor * w, sizeof *out * w);
}

kvs_status kvs_fx_sel_compress(kvs_fx_llama *E, kvs_error *err)
{
    kvs_mpc_sel *s = E->plan.sel;
    const size_t P = (size_t)s->prompt_len, N = (size_t)s->n_keep, Np = (size_t)s->n_pad;
    const size_t heads = (size_t)E->plan.s.n_kv_heads, w = heads * (size_t)E->plan.s.head_dim;
    if (s->compressed)
        return KVS_OK;
    /* Only kvs_fx_llama_step calls this, when plan.pos reaches P; E->len counts the same steps
     * (both grow by one a token, and only this function changes E->len otherwise, after which
     * compressed is set), so the prompt's rows are all here. */
    KVS_ASSERT(E->len == P);
    kvs_status st = kvs_fx_reserve(E, Np + 1, err);
    uint64_t *kr = st == KVS_OK ? malloc(sizeof *kr * (2 * Np * w + 1)) : NULL;
    if (st == KVS_OK && !kr)
        st = kvs_mpcache_no_memory(err, "the static step", 2 * Np * w);
    for (int l = 0; l < E->plan.s.n_layers && st == KVS_OK; l++) {
        kvs_fx_layer *y = &E->layers[l];
        const int *keep = NULL;
        if (N < P && kvs_mpcache_is_selector(s, l)) {
            if (!(y->keep = malloc(sizeof *y->keep * heads * N))) {
                st = kvs_mpcache_no_memory(err, "the static step", heads * N);
                break;
            }
            for (size_t h = 0; h < heads && st == KVS_OK; h++) {
                st = best_k(s->layers[l].win + h * P, P, N, y->keep + h * N, err);
                if (st == KVS_OK && E->on_keep)
                    E->on_keep(E->ctx, l, (int)h, y->keep + h * N, (int)N);
            }
            keep = y->keep;
        } else if (N < P) {
            keep = E->layers[kvs_mp_partner(&s->cfg.mp, l)].keep;
        }
        if (st != KVS_OK)
            break;
        kept_rows(E, y->K, keep, kr);
        kept_rows(E, y->V, keep, kr + Np * w);
        memcpy(y->K, kr, sizeof *kr * Np * w);
        memcpy(y->V, kr + Np * w, sizeof *kr * Np * w);
        if (kvs_mpcache_cluster_mode(s) && kvs_mpcache_is_selector(s, l))
            st = build_reps(E, y, kr, Np, N, err);
        free(s->layers[l].win);
        s->layers[l].win = NULL;
    }
    free(kr);
    if (st == KVS_OK) {
        E->len = Np;
        s->compressed = 1;
    }
    return st;
}

kvs_status kvs_fx_sel_seal(kvs_fx_llama *E, int l, kvs_error *err)
{
    const kvs_mpc_sel *s = E->plan.sel;
    kvs_fx_layer *y = &E->layers[l];
    const size_t s1 = (size_t)s->cfg.mp.s1;
    const size_t w = (size_t)E->plan.s.n_kv_heads * E->plan.s.head_dim;
    kvs_status st = KVS_OK;
    while (kvs_mpcache_cluster_mode(s) && st == KVS_OK &&
           E->len - (size_t)s->n_pad - (size_t)y->sealed >= s1) {
        if (kvs_mpcache_is_selector(s, l))
            st = build_reps(E, y, y->K + ((size_t)s->n_pad + (size_t)y->sealed) * w, s1, s1,
                            err);
        y->sealed += (int)s1;
    }
    return st;
}

/* choose() of mpcache_decode.c for KV head h: the n2 chosen fine clusters, ascending. */
static kvs_status choose(kvs_fx_llama *E, kvs_fx_layer *y, const uint64_t *q, size_t h,
                         const kvs_mp_shape *sh, int *F, kvs_error *err)
{
    const kvs_mpc_sel *s = E->plan.sel;
    const size_t d = (size_t)E->plan.s.head_dim, heads = (size_t)E->plan.s.n_kv_heads;
    const size_t G = (size_t)E->plan.s.n_heads / heads, w = heads * d;
    const size_t s2 = (size_t)s->cfg.mp.s2, r = (size_t)(s->cfg.mp.s1 / s->cfg.mp.s2);
    const size_t C2x = (size_t)sh->C2x, C1 = (size_t)sh->C1, n1 = (size_t)sh->n1;
    const size_t nc = (size_t)sh->n_cand, n2 = (size_t)sh->n2;
    uint64_t *qs = calloc(d + C2x + C1 + nc + 1, sizeof *qs);
    int *idx = malloc(sizeof *idx * (C2x + C1 + nc + 1));
    if (!qs || !idx) {
        free(qs);
        free(idx);
        return kvs_mpcache_no_memory(err, "a cluster choice", C2x);
    }
    uint64_t *all2 = qs + d, *sc1 = all2 + C2x, *sc2 = sc1 + C1;
    int *cand = idx + C1, *pick = cand + nc;
    for (size_t g = 0; g < G; g++)
        for (size_t i = 0; i < d; i++)
            qs[i] += q[(h * G + g) * d + i];
    for (size_t c = 0; c < C2x; c++) {
        all2[c] = kvs_fx_dot(qs, y->rep2 + c * w + h * d, d);
        if (!kvs_mpcache_slot_real(s, c * s2))
            all2[c] += kvs_mpcache_penalty(E->frac);
    }
    kvs_status st = KVS_OK;
    if (s->cfg.mp.levels >= 2) {
        for (size_t c = 0; c < C1; c++)
            sc1[c] = kvs_fx_dot(qs, y->rep1 + c * w + h * d, d);
        st = best_k(sc1, C1, n1, idx, err);
        for (size_t a = 0; a < n1; a++)
            for (size_t j = 0; j < r; j++) {
                cand[a * r + j] = idx[a] * (int)r + (int)j;
                sc2[a * r + j] = all2[(size_t)cand[a * r + j]];
            }
    } else {
        for (size_t c = 0; c < nc; c++) {
            cand[c] = (int)c;
            sc2[c] = all2[c];
        }
    }
    if (st == KVS_OK)
        st = best_k(sc2, nc, n2, pick, err);
    for (size_t p = 0; st == KVS_OK && p < n2; p++)
        F[p] = cand[pick[p]];
    free(qs);
    free(idx);
    return st;
}

/* One query head's attention over the gathered slots then the tail (sparse_softmax and the
 * value product of mpcache_decode.c): slot[p] (-1: an empty row of the one-hot, score 0) masked
 * by mask[p] (NULL: none, the token level), then the tail's slots t0 .. E->len. A gathered score
 * is the truncated q . k whether the protocol truncates before the gather (token level) or after
 * it (clusters): a one-hot picks one score exactly. */
static void attend_head(kvs_fx_llama *E, const kvs_fx_layer *y, const uint64_t *q, size_t h,
                        const long *slot, const uint64_t *mask, size_t k, size_t t0,
                        uint64_t *out)
{
    const size_t d = (size_t)E->plan.s.head_dim, w = (size_t)E->plan.s.n_kv_heads * d;
    const size_t W = k + E->len + 1 - t0;
    uint64_t *sc = E->work, *mk = sc + W;
    for (size_t p = 0; p < W; p++) {
        const long t = p < k ? slot[p] : (long)(t0 + p - k);
        sc[p] = t < 0 ? 0 : kvs_fx_ars(kvs_fx_dot(q, y->K + (size_t)t * w + h * d, d), E->frac);
        mk[p] = p < k && mask ? mask[p] : 1;
    }
    kvs_fx_softmax(sc, W, mask ? mk : NULL, E->frac);
    for (size_t i = 0; i < d; i++) {
        uint64_t acc = 0;
        for (size_t p = 0; p < W; p++) {
            const long t = p < k ? slot[p] : (long)(t0 + p - k);
            if (t >= 0)
                acc += sc[p] * y->V[(size_t)t * w + h * d + i];
        }
        out[i] = acc;
    }
}

kvs_status kvs_fx_sel_attend(kvs_fx_llama *E, int l, const uint64_t *q, uint64_t *out,
                             kvs_error *err)
{
    kvs_mpc_sel *s = E->plan.sel;
    kvs_fx_layer *y = &E->layers[l];
    const size_t heads = (size_t)E->plan.s.n_kv_heads, d = (size_t)E->plan.s.head_dim;
    const size_t G = (size_t)E->plan.s.n_heads / heads, w = heads * d, T = E->len + 1;
    const size_t s2 = (size_t)s->cfg.mp.s2;
    const int cluster = kvs_mpcache_cluster_mode(s);
    kvs_mp_shape sh = {0};
    size_t k, t0;
    if (cluster) {
        kvs_mp_shape_of(&s->cfg.mp, s->eta, s->n_keep, y->sealed, &sh);
        k = (size_t)sh.n2 * s2;
        t0 = (size_t)sh.C2x * s2;
    } else {
        t0 = T - 1;
        k = (size_t)kvs_mp_ceil_count(s->eta, (int)t0);
    }
    long *slot = malloc(sizeof *slot * (k + 1));
    uint64_t *mask = malloc(sizeof *mask * (k + t0 + 1));
    int *F = NULL;
    kvs_status st = slot && mask ? KVS_OK : kvs_mpcache_no_memory(err, "a selection", k);
    if (st == KVS_OK && cluster) {
        free(y->F);
        const size_t n2 = (size_t)sh.n2;
        if (!(F = y->F = malloc(sizeof *F * (heads * n2 + 1))))
            st = kvs_mpcache_no_memory(err, "a cluster choice", heads * n2);
        for (size_t i = 0; st == KVS_OK && i < heads * n2; i++)
            F[i] = -1;
        for (size_t h = 0; st == KVS_OK && h < heads; h++) {
            int *Fh = F + h * n2;
            if (!kvs_mpcache_is_selector(s, l)) {
                memcpy(Fh, E->layers[kvs_mp_partner(&s->cfg.mp, l)].F + h * n2,
                       sizeof *Fh * n2);
            } else if (sh.n2 >= sh.C2) {
                for (size_t c = 0, p = 0; c < (size_t)sh.C2x && p < n2; c++)
                    if (kvs_mpcache_slot_real(s, c * s2))
                        Fh[p++] = (int)c;
            } else {
                st = choose(E, y, q, h, &sh, Fh, err);
            }
            if (st == KVS_OK && kvs_mpcache_is_selector(s, l) && E->on_choice) {
                int n = 0;
                while (n < (int)n2 && Fh[n] >= 0)
                    n++;
                E->on_choice(E->ctx, l, (int)h, Fh, n);
            }
        }
    }
    for (size_t h = 0; st == KVS_OK && h < heads; h++) {
        if (cluster) {
            for (size_t p = 0; p < k; p++) {
                const int c = F[h * sh.n2 + p / s2];
                const size_t t = (size_t)c * s2 + p % s2;
                slot[p] = c < 0 ? -1 : (long)t;
                mask[p] = c >= 0 && kvs_mpcache_slot_real(s, t);
            }
        } else {
            /* the group's truncated scores summed, over every slot but the newest */
            uint64_t *sum = mask;
            int *idx = malloc(sizeof *idx * (k + 1));
            if (!idx) {
                st = kvs_mpcache_no_memory(err, "a token choice", k);
                break;
            }
            for (size_t t = 0; t < t0; t++) {
                sum[t] = 0;
                for (size_t g = 0; g < G; g++)
                    sum[t] += kvs_fx_ars(kvs_fx_dot(q + (h * G + g) * d, y->K + t * w + h * d, d),
                                         E->frac);
            }
            st = best_k(sum, t0, k, idx, err);
            for (size_t p = 0; p < k; p++) {
                slot[p] = idx[p];
                mask[p] = 1;
            }
            free(idx);
        }
        for (size_t g = 0; st == KVS_OK && g < G; g++)
            attend_head(E, y, q + (h * G + g) * d, h, slot, cluster ? mask : NULL, k, t0,
                        out + (h * G + g) * d);
    }
    free(slot);
    free(mask);
    return st;
}
