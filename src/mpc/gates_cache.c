/* The secret KV cache: rows opened once under dealer masks, products with later queries
 * (gates_cache.h). */
#include "mpc/gates_cache.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/corr.h"
#include "mpc/gates.h"

void kvs_mpc_cache_init(kvs_mpc_cache *c, int heads, int d)
{
    memset(c, 0, sizeof *c);
    c->heads = heads;
    c->d = d;
}

void kvs_mpc_cache_free(kvs_mpc_cache *c)
{
    free(c->E);
    free(c->B);
    c->E = c->B = NULL;
    c->len = c->cap = 0;
}

static kvs_status no_memory(kvs_error *err, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the secret KV cache (%zu values)", n);
}

kvs_status kvs_mpc_cache_append(kvs_mpc *m, kvs_mpc_op op, kvs_mpc_cache *c,
                                const uint64_t *rows, size_t n, kvs_error *err)
{
    const size_t w = (size_t)c->heads * c->d;
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        while (cap < c->len + n)
            cap *= 2;
        uint64_t *E = realloc(c->E, sizeof *E * cap * w);
        if (E)
            c->E = E;
        uint64_t *B = realloc(c->B, sizeof *B * cap * w);
        if (B)
            c->B = B;
        if (!E || !B)
            return no_memory(err, cap * w);
        c->cap = cap;
    }
    uint64_t *B = c->B + c->len * w, *E = c->E + c->len * w;
    kvs_corr_masks(m, n * w, B);
    kvs_status st = KVS_OK;
    if (!kvs_mpc_is_dealer(m)) {
        uint64_t *t = malloc(sizeof *t * (n * w + 1));
        if (!t)
            return no_memory(err, n * w);
        for (size_t i = 0; i < n * w; i++)
            t[i] = rows[i] - B[i];
        st = kvs_mpc_open(m, op, t, n * w, E, err);
        free(t);
    }
    if (st == KVS_OK)
        c->len += n;
    return st;
}

/* M[h][t][i] for a cache array (E or B). */
static inline const uint64_t *row_of(const kvs_mpc_cache *c, const uint64_t *M, size_t t, int h)
{
    return M + (t * (size_t)c->heads + (size_t)h) * (size_t)c->d;
}

kvs_status kvs_mpc_cache_qk(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                            const uint64_t *x, size_t n, int G, uint64_t *out, kvs_error *err)
{
    const int d = c->d;
    const size_t T = c->len, Q = n * (size_t)c->heads * G; /* query vectors [r][h][g] */
    const size_t nx = Q * d, no = Q * T;
    uint64_t *A = malloc(sizeof *A * (nx + no + nx + 1));
    if (!A)
        return no_memory(err, nx + no);
    uint64_t *v = A + nx, *D = v + no;
    kvs_corr_masks(m, nx, A);
    if (kvs_mpc_is_dealer(m)) /* v = A B^T */
        for (size_t q = 0; q < Q; q++) {
            const uint64_t *a = A + q * d;
            const int h = (int)(q / G % (size_t)c->heads);
            for (size_t t = 0; t < T; t++) {
                const uint64_t *b = row_of(c, c->B, t, h);
                uint64_t s = 0;
                for (int i = 0; i < d; i++)
                    s += a[i] * b[i];
                v[q * T + t] = s;
            }
        }
    kvs_status st = kvs_corr_shares(m, op, no, v, v, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(A);
        return st;
    }
    for (size_t i = 0; i < nx; i++)
        A[i] = x[i] - A[i];
    st = kvs_mpc_open(m, op, A, nx, D, err);
    for (size_t q = 0; st == KVS_OK && q < Q; q++) {
        const uint64_t *xr = x + q * d, *dr = D + q * d;
        const int h = (int)(q / G % (size_t)c->heads);
        for (size_t t = 0; t < T; t++) {
            const uint64_t *e = row_of(c, c->E, t, h), *b = row_of(c, c->B, t, h);
            uint64_t s = v[q * T + t];
            for (int i = 0; i < d; i++)
                s += xr[i] * e[i] + dr[i] * b[i];
            out[q * T + t] = s;
        }
    }
    free(A);
    return st;
}

/* out[q][j][i] = sum_c w[q][c] M[c s + j][h(q)][i] for Q weight rows over C = len / s groups of
 * s rows, h(q) = (q / div) mod heads: M = E + B, E public, the B part through the opened w - A
 * and the dealer's shares of A B. cache_pv is the case s = 1, cache_gather the case of whole
 * clusters. */
static kvs_status weighted_rows(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                                const uint64_t *w, size_t Q, size_t s, size_t div,
                                uint64_t *out, kvs_error *err)
{
    const size_t d = (size_t)c->d, C = c->len / s, nw = Q * C, no = Q * s * d;
    uint64_t *A = malloc(sizeof *A * (nw + no + nw + 1));
    if (!A)
        return no_memory(err, nw + no);
    uint64_t *v = A + nw, *D = v + no;
    kvs_corr_masks(m, nw, A);
    for (size_t q = 0; kvs_mpc_is_dealer(m) && q < Q; q++) /* v = A B */
        for (size_t j = 0; j < s; j++) {
            uint64_t *vr = v + (q * s + j) * d;
            const int h = (int)(q / div % (size_t)c->heads);
            memset(vr, 0, sizeof *vr * d);
            for (size_t cl = 0; cl < C; cl++) {
                const uint64_t a = A[q * C + cl], *b = row_of(c, c->B, cl * s + j, h);
                for (size_t i = 0; i < d; i++)
                    vr[i] += a * b[i];
            }
        }
    kvs_status st = kvs_corr_shares(m, op, no, v, v, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(A);
        return st;
    }
    for (size_t i = 0; i < nw; i++)
        A[i] = w[i] - A[i];
    st = kvs_mpc_open(m, op, A, nw, D, err);
    for (size_t q = 0; st == KVS_OK && q < Q; q++)
        for (size_t j = 0; j < s; j++) {
            uint64_t *o = out + (q * s + j) * d;
            const int h = (int)(q / div % (size_t)c->heads);
            memcpy(o, v + (q * s + j) * d, sizeof *o * d);
            for (size_t cl = 0; cl < C; cl++) {
                const uint64_t wq = w[q * C + cl], dq = D[q * C + cl];
                const uint64_t *e = row_of(c, c->E, cl * s + j, h);
                const uint64_t *b = row_of(c, c->B, cl * s + j, h);
                for (size_t i = 0; i < d; i++)
                    o[i] += wq * e[i] + dq * b[i];
            }
        }
    free(A);
    return st;
}

kvs_status kvs_mpc_cache_pv(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                            const uint64_t *p, size_t n, int G, uint64_t *out, kvs_error *err)
{
    return weighted_rows(m, op, c, p, n * (size_t)c->heads * (size_t)G, 1, (size_t)G, out, err);
}

kvs_status kvs_mpc_cache_gather(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                                const uint64_t *g, size_t k, size_t s, uint64_t *out,
                                kvs_error *err)
{
    if (s == 0 || c->len % s != 0)
        return kvs_fail(err, KVS_ERR_ARG, "a gather of clusters of %zu rows from %zu rows", s,
                        c->len);
    if (k == 0)
        return KVS_OK;
    return weighted_rows(m, op, c, g, (size_t)c->heads * k, s, k, out, err);
}
