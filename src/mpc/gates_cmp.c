/* Comparison gates: sign, select, max and row maxima by a comparison tree (gates.h). */
#include <stdlib.h>
#include <string.h>

#include "mpc/corr.h"
#include "mpc/fss.h"
#include "mpc/gates.h"

/* v mod 2^bits */
static inline uint64_t low_bits(uint64_t v, int bits)
{
    return bits >= 64 ? v : v & (((uint64_t)1 << bits) - 1);
}

kvs_status kvs_mpc_nonneg_bits(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n,
                               int bits, uint64_t *d, kvs_error *err)
{
    if (bits < 2 || bits > 64)
        return kvs_fail(err, KVS_ERR_ARG, "sign test over %d bits: expected 2 to 64", bits);
    if (n == 0)
        return KVS_OK;
    const int lb = bits - 1;
    const size_t kb = kvs_dcf_key_bytes(lb);
    uint64_t *w = malloc(sizeof *w * 5 * n);
    uint8_t *keys = malloc(kb * n);
    if (!w || !keys) {
        free(w);
        free(keys);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu sign tests", n);
    }
    uint64_t *r = w, *rh = w + n, *alpha = w + 2 * n, *beta = w + 3 * n, *tmp = w + 4 * n;
    kvs_corr_masks(m, n, r);
    if (kvs_mpc_is_dealer(m))
        for (size_t i = 0; i < n; i++) {
            const uint64_t rr = low_bits(r[i], bits), top = rr >> lb;
            tmp[i] = top;                                /* shares of r's top bit */
            alpha[i] = low_bits(rr, lb);                 /* the borrow test */
            beta[i] = top ? (uint64_t)0 - 1 : 1;         /* top ? 1 - borrow : borrow */
        }
    kvs_status st = kvs_corr_shares(m, op, n, tmp, rh, err);
    if (st == KVS_OK)
        st = kvs_corr_dcf(m, op, lb, n, alpha, beta, keys, err);
    if (st == KVS_OK && !kvs_mpc_is_dealer(m)) {
        /* open c = (x + r) mod 2^bits */
        const int b = (int)m->role;
        uint64_t *c = alpha, *borrow = beta; /* the parties' use of the dealer's arrays */
        for (size_t i = 0; i < n; i++)
            tmp[i] = x[i] + r[i];
        st = kvs_mpc_open_bits(m, op, tmp, n, bits, c, err);
        for (size_t i = 0; st == KVS_OK && i < n; i++)
            tmp[i] = low_bits(c[i], lb);
        if (st == KVS_OK) /* all the keys in one batched walk */
            kvs_dcf_eval_many(b, keys, lb, tmp, n, borrow);
        for (size_t i = 0; st == KVS_OK && i < n; i++) {
            /* u = top(r) xor borrow, as shares; msb(x) = top(c) xor u */
            const uint64_t u = rh[i] + borrow[i];
            const uint64_t one = b == 0 ? 1 : 0;
            const uint64_t msb = (c[i] >> lb) ? one - u : u;
            d[i] = one - msb;
        }
    }
    free(w);
    free(keys);
    return st;
}

kvs_status kvs_mpc_nonneg(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *d,
                          kvs_error *err)
{
    return kvs_mpc_nonneg_bits(m, op, x, n, 64, d, err);
}

kvs_status kvs_mpc_select(kvs_mpc *m, kvs_mpc_op op, const uint64_t *c, const uint64_t *a,
                          const uint64_t *b, size_t n, uint64_t *z, kvs_error *err)
{
    uint64_t *t = NULL;
    if (!kvs_mpc_is_dealer(m)) {
        if (!(t = calloc(2 * (n ? n : 1), sizeof *t)))
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a selection of %zu", n);
        for (size_t i = 0; i < n; i++)
            t[i] = a[i] - b[i];
    }
    kvs_status st = kvs_mpc_mul(m, op, c, t, n, t ? t + n : NULL, err);
    for (size_t i = 0; st == KVS_OK && t && i < n; i++)
        z[i] = b[i] + t[n + i];
    free(t);
    return st;
}

kvs_status kvs_mpc_max2(kvs_mpc *m, kvs_mpc_op op, const uint64_t *a, const uint64_t *b,
                        size_t n, int bits, uint64_t *z, kvs_error *err)
{
    uint64_t *d = NULL;
    if (!kvs_mpc_is_dealer(m)) {
        if (!(d = calloc(n ? n : 1, sizeof *d)))
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a maximum of %zu", n);
        for (size_t i = 0; i < n; i++)
            d[i] = a[i] - b[i];
    }
    kvs_status st = kvs_mpc_nonneg_bits(m, op, d, n, bits, d, err);
    if (st == KVS_OK)
        st = kvs_mpc_select(m, op, d, a, b, n, z, err);
    free(d);
    return st;
}

kvs_status kvs_mpc_max_rows(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t rows,
                            size_t len, int bits, uint64_t *out, kvs_error *err)
{
    if (len == 0)
        return kvs_fail(err, KVS_ERR_ARG, "maximum of an empty row");
    const int data = !kvs_mpc_is_dealer(m);
    uint64_t *cur = NULL, *a = NULL, *b = NULL;
    if (data && (!(cur = malloc(sizeof *cur * rows * len)) ||
                 !(a = malloc(sizeof *a * rows * (len / 2 + 1))) ||
                 !(b = malloc(sizeof *b * rows * (len / 2 + 1))))) {
        free(cur);
        free(a);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for row maxima (%zu x %zu)", rows,
                        len);
    }
    if (data)
        memcpy(cur, x, sizeof *cur * rows * len);
    kvs_status st = KVS_OK;
    /* each level pairs elements 2i and 2i+1 of every row (an odd last one passes through) */
    for (size_t n = len; n > 1 && st == KVS_OK; n = (n + 1) / 2) {
        const size_t half = n / 2;
        for (size_t r = 0; data && r < rows; r++)
            for (size_t i = 0; i < half; i++) {
                a[r * half + i] = cur[r * len + 2 * i];
                b[r * half + i] = cur[r * len + 2 * i + 1];
            }
        st = kvs_mpc_max2(m, op, a, b, rows * half, bits, a, err);
        for (size_t r = 0; data && st == KVS_OK && r < rows; r++) {
            for (size_t i = 0; i < half; i++)
                cur[r * len + i] = a[r * half + i];
            if (n % 2)
                cur[r * len + half] = cur[r * len + n - 1];
        }
    }
    for (size_t r = 0; data && st == KVS_OK && r < rows; r++)
        out[r] = cur[r * len];
    free(cur);
    free(a);
    free(b);
    return st;
}

kvs_status kvs_mpc_argmax_rows(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t rows,
                               size_t len, int bits, uint64_t *idx, uint64_t *max,
                               kvs_error *err)
{
    if (len == 0)
        return kvs_fail(err, KVS_ERR_ARG, "argmax of an empty row");
    const int data = !kvs_mpc_is_dealer(m);
    const size_t pairs = rows * (len / 2 + 1);
    /* v, ix: the row's current candidates; c: the sign bits twice; e: (a - b, ia - ib); z */
    uint64_t *v = NULL, *ix = NULL, *c = NULL, *e = NULL, *z = NULL;
    if (data && (!(v = malloc(sizeof *v * rows * len)) || !(ix = malloc(sizeof *ix * rows * len)) ||
                 !(c = malloc(sizeof *c * 2 * pairs)) || !(e = malloc(sizeof *e * 2 * pairs)) ||
                 !(z = malloc(sizeof *z * 2 * pairs)))) {
        free(v);
        free(ix);
        free(c);
        free(e);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for argmax (%zu x %zu)", rows, len);
    }
    for (size_t r = 0; data && r < rows; r++)
        for (size_t i = 0; i < len; i++) {
            v[r * len + i] = x[r * len + i];
            ix[r * len + i] = m->role == KVS_MPC_P0 ? i : 0; /* public indices */
        }
    kvs_status st = KVS_OK;
    for (size_t n = len; n > 1 && st == KVS_OK; n = (n + 1) / 2) {
        const size_t half = n / 2, k = rows * half;
        for (size_t r = 0; data && r < rows; r++)
            for (size_t i = 0; i < half; i++) {
                const size_t a = r * len + 2 * i, b = a + 1, o = r * half + i;
                e[o] = v[a] - v[b];
                e[k + o] = ix[a] - ix[b];
            }
        /* [a >= b]: the first of equal values wins */
        st = kvs_mpc_nonneg_bits(m, op, e, k, bits, c, err);
        for (size_t o = 0; data && st == KVS_OK && o < k; o++)
            c[k + o] = c[o];
        if (st == KVS_OK)
            st = kvs_mpc_mul(m, op, c, e, 2 * k, z, err);
        for (size_t r = 0; data && st == KVS_OK && r < rows; r++) {
            for (size_t i = 0; i < half; i++) {
                const size_t b = r * len + 2 * i + 1, o = r * half + i;
                const uint64_t nv = v[b] + z[o], ni = ix[b] + z[k + o];
                v[r * len + i] = nv;
                ix[r * len + i] = ni;
            }
            if (n % 2) {
                v[r * len + half] = v[r * len + n - 1];
                ix[r * len + half] = ix[r * len + n - 1];
            }
        }
    }
    for (size_t r = 0; data && st == KVS_OK && r < rows; r++) {
        idx[r] = ix[r * len];
        if (max)
            max[r] = v[r * len];
    }
    free(v);
    free(ix);
    free(c);
    free(e);
    free(z);
    return st;
}
