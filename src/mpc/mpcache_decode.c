/* One decode step of MPCache on shares (mpcache.h): the cluster scores and the two-level choice
 * as a one-hot over fine clusters, or the token-level top-k, and the attention over the chosen
 * slots (scores gathered, probabilities scattered back; see mpcache.c for why). */
#include "mpc/mpcache_internal.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/gates_select.h"

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
            return kvs_mpcache_no_memory(err, "bound scores", 4 * n);
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
            if (!kvs_mpcache_slot_real(s, c * s2)) /* a wholly dummy fine cluster */
                sc[h * C2x + c] = kvs_mpc_add_public(m, sc[h * C2x + c], kvs_mpcache_penalty(f));
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
    const size_t words = heads * (d + C2x + C1 + C1 + n1 * C1 + nc + nc + n2 * nc + nc * C2x) + 1;
    uint64_t *qs = calloc(words, sizeof *qs);
    if (!qs)
        return kvs_mpcache_no_memory(err, "a cluster choice", words);
    uint64_t *all2 = qs + heads * d, *sc1 = all2 + heads * C2x, *sel1 = sc1 + heads * C1;
    uint64_t *G1 = sel1 + heads * C1, *sc2 = G1 + heads * n1 * C1;
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
            st = kvs_mpcache_best_k(m, 0, sc1, heads, C1, n1, SCORE_BITS(f), sel1, G1, err);
        /* all2 is [h][c][j] with fine cluster c r + j: C1 x r a head, as the product wants */
        if (st == KVS_OK)
            st = kvs_mpc_matmul_batch(m, KVS_OP_GATHER, dealer ? NULL : G1, dealer ? NULL : all2,
                                      heads, n1, C1, r, dealer ? NULL : sc2, err);
    }
    /* one level: every fine cluster is a candidate and the choice's gather matrix is F itself */
    const int one = s->cfg.mp.levels < 2;
    if (st == KVS_OK)
        st = kvs_mpcache_best_k(m, 0, one ? all2 : sc2, heads, nc, n2, SCORE_BITS(f), sel2,
                                one ? F : G2, err);
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
        return kvs_mpcache_no_memory(err, "a sparse softmax", words);
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
        return kvs_mpcache_no_memory(err, "attention scores", heads * G * len);
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
            st = kvs_mpcache_no_memory(err, "a token gather", heads * k * C);
        if (st == KVS_OK)
            st = kvs_mpcache_best_k(m, 1, aux, heads, C, k, SUM_BITS(f), mask, Gs, err);
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
            st = kvs_mpcache_no_memory(err, "a cluster choice", heads * k * C);
        if (st == KVS_OK && !kvs_mpcache_is_selector(s, l)) { /* the partner's choice (§2.4) */
            if (!dealer)
                memcpy(y->F, s->layers[kvs_mp_partner(&s->cfg.mp, l)].F,
                       sizeof *y->F * heads * k * C);
        } else if (st == KVS_OK && sh.n2 >= sh.C2) { /* every real fine cluster: public */
            for (size_t h = 0; m->role == KVS_MPC_P0 && h < heads; h++)
                for (size_t c = 0, p = 0; c < C && p < k; c++)
                    if (kvs_mpcache_slot_real(s, c * s2))
                        y->F[(h * k + p++) * C + c] = 1;
        } else if (st == KVS_OK) {
            st = choose(m, L, y, q, &sh, y->F, err);
        }
        if (st == KVS_OK && kvs_mpcache_is_selector(s, l))
            st = kvs_mpcache_report_open(m, s, s->on_choice, l, y->F, heads, k, C, err);
        /* valid[h][p][j] = sum_c F[h][p][c] [slot c s2 + j is real]: local */
        for (size_t h = 0; !dealer && h < heads; h++)
            for (size_t p = 0; p < k; p++)
                for (size_t c = 0; c < C; c++)
                    for (size_t j = 0; j < s2; j++)
                        if (kvs_mpcache_slot_real(s, c * s2 + j))
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
