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

kvs_status kvs_mpc_cache_pv(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                            const uint64_t *p, size_t n, int G, uint64_t *out, kvs_error *err)
{
    const int d = c->d;
    const size_t T = c->len, Q = n * (size_t)c->heads * G; /* probability rows [r][h][g] */
    const size_t np = Q * T, no = Q * d;
    uint64_t *A = malloc(sizeof *A * (np + no + np + 1));
    if (!A)
        return no_memory(err, np + no);
    uint64_t *v = A + np, *D = v + no;
    kvs_corr_masks(m, np, A);
    if (kvs_mpc_is_dealer(m)) /* v = A B */
        for (size_t q = 0; q < Q; q++) {
            uint64_t *vr = v + q * d;
            const int h = (int)(q / G % (size_t)c->heads);
            memset(vr, 0, sizeof *vr * d);
            for (size_t t = 0; t < T; t++) {
                const uint64_t a = A[q * T + t];
                const uint64_t *b = row_of(c, c->B, t, h);
                for (int i = 0; i < d; i++)
                    vr[i] += a * b[i];
            }
        }
    kvs_status st = kvs_corr_shares(m, op, no, v, v, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(A);
        return st;
    }
    for (size_t i = 0; i < np; i++)
        A[i] = p[i] - A[i];
    st = kvs_mpc_open(m, op, A, np, D, err);
    for (size_t q = 0; st == KVS_OK && q < Q; q++) {
        uint64_t *o = out + q * d;
        const int h = (int)(q / G % (size_t)c->heads);
        memcpy(o, v + q * d, sizeof *o * d);
        for (size_t t = 0; t < T; t++) {
            const uint64_t pt = p[q * T + t], dt = D[q * T + t];
            const uint64_t *e = row_of(c, c->E, t, h), *b = row_of(c, c->B, t, h);
            for (int i = 0; i < d; i++)
                o[i] += pt * e[i] + dt * b[i];
        }
    }
    free(A);
    return st;
}

kvs_status kvs_mpc_cache_gather(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                                const uint64_t *g, size_t k, size_t s, uint64_t *out,
                                kvs_error *err)
{
    const int H = c->heads, d = c->d;
    if (s == 0 || c->len % s != 0)
        return kvs_fail(err, KVS_ERR_ARG, "a gather of clusters of %zu rows from %zu rows", s,
                        c->len);
    const size_t C = c->len / s, ng = (size_t)H * k * C, no = (size_t)H * k * s * (size_t)d;
    uint64_t *A = malloc(sizeof *A * (ng + no + ng + 1));
    if (!A)
        return no_memory(err, ng + no);
    uint64_t *v = A + ng, *D = v + no;
    kvs_corr_masks(m, ng, A);
    /* out[h][p][j] = sum_c g[h][p][c] (E + B)[c s + j][h]: E public, the B part through the
     * masked g (D = g - A) and the dealer's shares of A B */
    for (int h = 0; kvs_mpc_is_dealer(m) && h < H; h++)
        for (size_t p = 0; p < k; p++)
            for (size_t j = 0; j < s; j++) {
                uint64_t *vr = v + (((size_t)h * k + p) * s + j) * (size_t)d;
                memset(vr, 0, sizeof *vr * (size_t)d);
                for (size_t cl = 0; cl < C; cl++) {
                    const uint64_t a = A[((size_t)h * k + p) * C + cl];
                    const uint64_t *b = row_of(c, c->B, cl * s + j, h);
                    for (int i = 0; i < d; i++)
                        vr[i] += a * b[i];
                }
            }
    kvs_status st = kvs_corr_shares(m, op, no, v, v, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(A);
        return st;
    }
    for (size_t i = 0; i < ng; i++)
        A[i] = g[i] - A[i];
    st = kvs_mpc_open(m, op, A, ng, D, err);
    for (int h = 0; st == KVS_OK && h < H; h++)
        for (size_t p = 0; p < k; p++)
            for (size_t j = 0; j < s; j++) {
                uint64_t *o = out + (((size_t)h * k + p) * s + j) * (size_t)d;
                memcpy(o, v + (((size_t)h * k + p) * s + j) * (size_t)d, sizeof *o * (size_t)d);
                for (size_t cl = 0; cl < C; cl++) {
                    const uint64_t gq = g[((size_t)h * k + p) * C + cl];
                    const uint64_t dq = D[((size_t)h * k + p) * C + cl];
                    const uint64_t *e = row_of(c, c->E, cl * s + j, h);
                    const uint64_t *b = row_of(c, c->B, cl * s + j, h);
                    for (int i = 0; i < d; i++)
                        o[i] += gq * e[i] + dq * b[i];
                }
            }
    free(A);
    return st;
}
