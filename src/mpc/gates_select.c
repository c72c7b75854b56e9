/* Selection gates: secret one-hots, top-k masks, ordered gather matrices (gates_select.h). */
#include "mpc/gates_select.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/corr.h"
#include "mpc/fxp.h"

static kvs_status no_memory(kvs_error *err, const char *what, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %s (%zu values)", what, n);
}

kvs_status kvs_mpc_onehot(kvs_mpc *m, kvs_mpc_op op, const uint64_t *idx, size_t n, int bits,
                          uint64_t *out, kvs_error *err)
{
    if (bits < 1 || bits > 16)
        return kvs_fail(err, KVS_ERR_ARG, "a one-hot over %d bits: expected 1 to 16", bits);
    if (n == 0)
        return KVS_OK;
    const size_t w = (size_t)1 << bits, per = w + 1, mask = w - 1;
    /* per index: r, then the one-hot of r (the dealer's values; the parties' shares) */
    uint64_t *d = malloc(sizeof *d * per * n), *c = malloc(sizeof *c * 2 * n);
    if (!d || !c) {
        free(d);
        free(c);
        return no_memory(err, "a one-hot", n * w);
    }
    if (kvs_mpc_is_dealer(m))
        for (size_t i = 0; i < n; i++) {
            uint64_t r;
            kvs_prg_u64(m->own, &r, 1);
            r &= mask;
            memset(d + i * per, 0, sizeof *d * per);
            d[i * per] = r;
            d[i * per + 1 + r] = 1;
        }
    kvs_status st = kvs_corr_shares(m, op, per * n, d, d, err);
    if (st == KVS_OK && !kvs_mpc_is_dealer(m)) {
        uint64_t *t = c + n;
        for (size_t i = 0; i < n; i++)
            t[i] = idx[i] - d[i * per];
        st = kvs_mpc_open_bits(m, op, t, n, bits, c, err);
        /* e_idx[j] = e_r[j - c]: idx = c + r */
        for (size_t i = 0; st == KVS_OK && i < n; i++)
            for (size_t j = 0; j < w; j++)
                out[i * w + j] = d[i * per + 1 + ((j - c[i]) & mask)];
    }
    free(d);
    free(c);
    return st;
}

/* ceil(log2 n) for n >= 1 */
static int log2_ceil(size_t n)
{
    int b = 0;
    while (((size_t)1 << b) < n)
        b++;
    return b;
}

kvs_status kvs_mpc_topk_mask(kvs_mpc *m, kvs_mpc_op op, const uint64_t *v, size_t rows,
                             size_t len, size_t k, int bits, uint64_t *sel, kvs_error *err)
{
    if (len < 1 || k > len)
        return kvs_fail(err, KVS_ERR_ARG, "top-%zu of %zu values: expected 1 <= len, k <= len",
                        k, len);
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t pairs = len * (len - 1) / 2, np = rows * pairs, nv = rows * len;
    uint64_t *a = calloc(np + nv + 1, sizeof *a);
    if (!a)
        return no_memory(err, "a top-k", np + nv);
    uint64_t *t = a + np;
    /* [v_i >= v_j] for every pair i < j of a row, in one batch */
    for (size_t r = 0, q = 0; !dealer && r < rows; r++)
        for (size_t i = 0; i < len; i++)
            for (size_t j = i + 1; j < len; j++)
                a[q++] = v[r * len + i] - v[r * len + j];
    kvs_status st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : a, np, bits, dealer ? NULL : a,
                                         err);
    /* rank_i: the lower j with v_j >= v_i, the higher j with v_j > v_i; t_i = k - 1 - rank_i */
    for (size_t r = 0, q = 0; !dealer && st == KVS_OK && r < rows; r++) {
        uint64_t *tr = t + r * len;
        for (size_t i = 0; i < len; i++)
            tr[i] = kvs_mpc_add_public(m, 0, (uint64_t)k - 1);
        for (size_t i = 0; i < len; i++)
            for (size_t j = i + 1; j < len; j++, q++) {
                tr[j] -= a[q];                                    /* i beats j */
                tr[i] -= kvs_mpc_add_public(m, (uint64_t)0 - a[q], 1); /* j beats i */
            }
    }
    /* sel = [t >= 0]: t lies in [-(len - 1), k - 1] */
    if (st == KVS_OK)
        st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : t, nv, log2_ceil(len) + 2,
                                 dealer ? NULL : sel, err);
    free(a);
    return st;
}

kvs_status kvs_mpc_topk_threshold(kvs_mpc *m, kvs_mpc_op op, const uint64_t *v, size_t rows,
                                  size_t len, size_t k, int bits, uint64_t *sel,
                                  kvs_error *err)
{
    if (len < 1 || k > len || bits < 3 || bits > 64)
        return kvs_fail(err, KVS_ERR_ARG,
                        "top-%zu of %zu values over %d bits: expected k <= len, 3 to 64 bits", k,
                        len, bits);
    const int dealer = kvs_mpc_is_dealer(m), cb = log2_ceil(len + 1) + 2;
    const size_t nv = rows * len;
    /* u: v + 2^(bits-2) in [0, 2^(bits-1)); d: the tests of a step; th: each row's threshold;
     * cnt: the rows' counts, then their tests */
    uint64_t *u = calloc(4 * nv + 3 * rows + 1, sizeof *u);
    if (!u)
        return no_memory(err, "a top-k", nv);
    uint64_t *d = u + nv, *e = d + nv, *g = e + nv, *th = g + nv, *cnt = th + rows,
             *ok = cnt + rows;
    const uint64_t off = (uint64_t)1 << (bits - 2);
    for (size_t i = 0; !dealer && i < nv; i++)
        u[i] = kvs_mpc_add_public(m, v[i], off);
    kvs_status st = KVS_OK;
    /* theta = the largest t with #{u >= t} >= k, bit by bit from the top */
    for (int b = bits - 2; b >= 0 && st == KVS_OK; b--) {
        const uint64_t step = (uint64_t)1 << b;
        for (size_t r = 0; !dealer && r < rows; r++)
            for (size_t i = 0; i < len; i++)
                d[r * len + i] = kvs_mpc_add_public(m, u[r * len + i] - th[r], 0 - step);
        st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : d, nv, bits, dealer ? NULL : d, err);
        for (size_t r = 0; !dealer && st == KVS_OK && r < rows; r++) {
            cnt[r] = kvs_mpc_add_public(m, 0, 0 - (uint64_t)k);
            for (size_t i = 0; i < len; i++)
                cnt[r] += d[r * len + i];
        }
        if (st == KVS_OK)
            st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : cnt, rows, cb, dealer ? NULL : ok,
                                     err);
        for (size_t r = 0; !dealer && st == KVS_OK && r < rows; r++)
            th[r] += ok[r] * step;
    }
    /* gt = [u > theta] into d, ge = [u >= theta] into e: one batch (d and e are adjacent) */
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t i = 0; i < len; i++) {
            e[r * len + i] = u[r * len + i] - th[r];
            d[r * len + i] = kvs_mpc_add_public(m, e[r * len + i], (uint64_t)0 - 1);
        }
    if (st == KVS_OK)
        st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : d, 2 * nv, bits, dealer ? NULL : d,
                                 err);
    /* ties eq = ge - gt (into e); keep the first k - #gt of them by index: the test
     * k - 1 - #gt - (ties before i) >= 0, then its product with eq */
    for (size_t r = 0; !dealer && st == KVS_OK && r < rows; r++) {
        uint64_t ngt = 0, before = 0;
        for (size_t i = 0; i < len; i++) {
            e[r * len + i] -= d[r * len + i];
            ngt += d[r * len + i];
        }
        for (size_t i = 0; i < len; i++) {
            g[r * len + i] = kvs_mpc_add_public(m, (uint64_t)0 - ngt - before, (uint64_t)k - 1);
            before += e[r * len + i];
        }
    }
    if (st == KVS_OK)
        st = kvs_mpc_nonneg_bits(m, op, dealer ? NULL : g, nv, cb, dealer ? NULL : g, err);
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, op, dealer ? NULL : e, dealer ? NULL : g, nv, dealer ? NULL : g,
                         err);
    for (size_t i = 0; !dealer && st == KVS_OK && i < nv; i++)
        sel[i] = d[i] + g[i];
    free(u);
    return st;
}

kvs_status kvs_mpc_gather_matrix(kvs_mpc *m, kvs_mpc_op op, const uint64_t *sel, size_t rows,
                                 size_t len, size_t k, uint64_t *G, kvs_error *err)
{
    if (k > len)
        return kvs_fail(err, KVS_ERR_ARG, "a gather of %zu of %zu values", k, len);
    const int dealer = kvs_mpc_is_dealer(m);
    int pb = log2_ceil(k + 1); /* positions 0..k: at least one bit */
    if (pb < 1)
        pb = 1;
    const size_t w = (size_t)1 << pb, nv = rows * len, ng = rows * k * len;
    uint64_t *pos = calloc(nv + nv * w + 2 * ng + 1, sizeof *pos);
    if (!pos)
        return no_memory(err, "a gather matrix", ng);
    uint64_t *oh = pos + nv, *x = oh + nv * w, *y = x + ng;
    /* the position of entry i among the selected: the selected before it */
    for (size_t r = 0; !dealer && r < rows; r++) {
        uint64_t acc = 0;
        for (size_t i = 0; i < len; i++) {
            pos[r * len + i] = acc;
            acc += sel[r * len + i];
        }
    }
    kvs_status st = kvs_mpc_onehot(m, op, dealer ? NULL : pos, nv, pb, dealer ? NULL : oh, err);
    /* G[r][p][i] = [pos_i == p] sel_i */
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t p = 0; p < k; p++)
            for (size_t i = 0; i < len; i++) {
                const size_t g = (r * k + p) * len + i;
                x[g] = oh[(r * len + i) * w + p];
                y[g] = sel[r * len + i];
            }
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, op, dealer ? NULL : x, dealer ? NULL : y, ng, dealer ? NULL : G,
                         err);
    free(pos);
    return st;
}

kvs_status kvs_mpc_cluster_reps(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, size_t s,
                                size_t d, uint64_t alpha, int bits, uint64_t *rep,
                                kvs_error *err)
{
    if (s == 0)
        return kvs_fail(err, KVS_ERR_ARG, "clusters of 0 rows");
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t nd = n * d;
    /* rows: (c, i) of x, then of -x, each its s values; mx: their maxima */
    uint64_t *t = calloc(2 * nd * s + 2 * nd + 1, sizeof *t);
    if (!t)
        return no_memory(err, "cluster bounds", 2 * nd * s);
    uint64_t *mx = t + 2 * nd * s;
    for (size_t c = 0; !dealer && c < n; c++)
        for (size_t j = 0; j < s; j++)
            for (size_t i = 0; i < d; i++) {
                const uint64_t v = x[(c * s + j) * d + i];
                t[(c * d + i) * s + j] = v;
                t[(nd + c * d + i) * s + j] = (uint64_t)0 - v;
            }
    kvs_status st = kvs_mpc_max_rows(m, op, dealer ? NULL : t, 2 * nd, s, bits,
                                     dealer ? NULL : mx, err);
    /* alpha max + (1 - alpha) min = alpha max - (1 - alpha) max(-x), then one truncation */
    const uint64_t one = (uint64_t)1 << m->frac, beta = one - alpha;
    for (size_t q = 0; !dealer && st == KVS_OK && q < nd; q++)
        rep[q] = alpha * mx[q] - beta * mx[nd + q];
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, op, dealer ? NULL : rep, nd, m->frac, err);
    free(t);
    return st;
}

void kvs_fx_cluster_reps(const uint64_t *x, size_t n, size_t s, size_t d, uint64_t alpha,
                         int frac, uint64_t *rep)
{
    const uint64_t beta = ((uint64_t)1 << frac) - alpha;
    for (size_t c = 0; c < n; c++)
        for (size_t i = 0; i < d; i++) {
            int64_t hi = (int64_t)x[c * s * d + i], lo = hi;
            for (size_t j = 1; j < s; j++) {
                const int64_t v = (int64_t)x[(c * s + j) * d + i];
                hi = v > hi ? v : hi;
                lo = v < lo ? v : lo;
            }
            rep[c * d + i] = kvs_fx_ars(alpha * (uint64_t)hi + beta * (uint64_t)lo, frac);
        }
}

void kvs_fx_topk_mask(const uint64_t *v, size_t rows, size_t len, size_t k, uint64_t *sel)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < len; i++) {
            const int64_t vi = (int64_t)v[r * len + i];
            size_t rank = 0;
            for (size_t j = 0; j < len; j++) {
                const int64_t vj = (int64_t)v[r * len + j];
                rank += j < i ? vj >= vi : j > i ? vj > vi : 0;
            }
            sel[r * len + i] = rank < k;
        }
}

void kvs_fx_gather_matrix(const uint64_t *sel, size_t rows, size_t len, size_t k, uint64_t *G)
{
    memset(G, 0, sizeof *G * rows * k * len);
    for (size_t r = 0; r < rows; r++) {
        size_t p = 0;
        for (size_t i = 0; i < len; i++)
            if (sel[r * len + i] && p < k)
                G[(r * k + p++) * len + i] = 1;
    }
}
