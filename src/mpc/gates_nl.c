/* Non-linear two-party gates: DPF table lookup, exp, reciprocal, SiLU, inverse square root
 * (gates_nl.h). */
#include "mpc/gates_nl.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/corr.h"
#include "mpc/fss.h"
#include "mpc/fxp_nl.h"
#include "mpc/gates.h"

static kvs_status no_memory(kvs_error *err, const char *what, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %s (%zu values)", what, n);
}

/* n words of workspace for a party (NULL with *ok = 1 for the dealer, which holds no data). */
static uint64_t *party_words(const kvs_mpc *m, size_t n, int *ok)
{
    if (kvs_mpc_is_dealer(m)) {
        *ok = 1;
        return NULL;
    }
    uint64_t *p = malloc(sizeof *p * (n ? n : 1));
    *ok = p != NULL;
    return p;
}

kvs_status kvs_mpc_lut(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int nbits,
                       const uint64_t *table, uint64_t *out, kvs_error *err)
{
    if (nbits < 1 || nbits > KVS_MPC_LUT_MAX_BITS)
        return kvs_fail(err, KVS_ERR_ARG, "table lookup over %d bits: 1 to %d", nbits,
                        KVS_MPC_LUT_MAX_BITS);
    if (n == 0)
        return KVS_OK;
    const uint64_t mask = ((uint64_t)1 << nbits) - 1;
    const size_t kb = kvs_dpf_key_bytes(nbits);
    const size_t size = (size_t)1 << nbits;
    /* r: masks; alpha, beta: the dealer's DPF points; c: the opened values */
    uint64_t *w = malloc(sizeof *w * 4 * n);
    uint8_t *keys = malloc(kb * n);
    if (!w || !keys) {
        free(w);
        free(keys);
        return no_memory(err, "a table lookup", n);
    }
    uint64_t *r = w, *alpha = w + n, *beta = w + 2 * n, *c = w + 3 * n;
    kvs_corr_masks(m, n, r);
    if (kvs_mpc_is_dealer(m))
        for (size_t i = 0; i < n; i++) {
            alpha[i] = r[i] & mask;
            beta[i] = 1;
        }
    kvs_status st = kvs_corr_dpf(m, op, nbits, n, alpha, beta, keys, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(w);
        free(keys);
        return st;
    }
    uint64_t *scratch = malloc(sizeof *scratch * size);
    if (!scratch) {
        free(w);
        free(keys);
        return no_memory(err, "a table lookup", n);
    }
    /* open c = (x + r) mod 2^nbits */
    for (size_t i = 0; i < n; i++)
        alpha[i] = x[i] + r[i];
    st = kvs_mpc_open_bits(m, op, alpha, n, nbits, c, err);
    const int b = (int)m->role;
    for (size_t i = 0; st == KVS_OK && i < n; i++)
        out[i] = kvs_lut_eval(b, keys + kb * i, nbits, c[i], table, scratch);
    free(scratch);
    free(w);
    free(keys);
    return st;
}

kvs_status kvs_mpc_exp_neg(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                           uint64_t *out, kvs_error *err)
{
    const int f = m->frac, shift = f - KVS_FXNL_EXP_IN_FRAC;
    if (shift < 0 || f > 40)
        return kvs_fail(err, KVS_ERR_ARG, "exp with %d fraction bits: %d to 40", f,
                        KVS_FXNL_EXP_IN_FRAC);
    int ok;
    uint64_t *w = party_words(m, 2 * n, &ok), *z = w, *lo = w ? w + n : NULL;
    uint64_t table[1 << KVS_FXNL_EXP_BITS];
    if (!ok)
        return no_memory(err, "an exponential", n);
    for (size_t i = 0; w && i < n; i++)
        lo[i] = kvs_mpc_add_public(m, 0, (uint64_t)(-((int64_t)KVS_FXNL_EXP_MIN << f)));
    /* clip below at -16, then keep 6 fraction bits: an index in [-1024, 0] */
    kvs_status st = kvs_mpc_max2(m, op, x, lo, n, bits, z, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, op, z, n, shift, err);
    if (st == KVS_OK) {
        if (!kvs_mpc_is_dealer(m))
            kvs_fxnl_exp_table(f, table);
        st = kvs_mpc_lut(m, op, z, n, KVS_FXNL_EXP_BITS, table, out, err);
    }
    free(w);
    return st;
}

kvs_status kvs_mpc_silu(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                        uint64_t *out, kvs_error *err)
{
    const int f = m->frac, shift = f - KVS_FXNL_SILU_IN_FRAC;
    if (shift < 0 || f > 30)
        return kvs_fail(err, KVS_ERR_ARG, "SiLU with %d fraction bits: %d to 30", f,
                        KVS_FXNL_SILU_IN_FRAC);
    int ok;
    /* xs: a copy of x (out may alias it); cmp: x + 8, x - 8 then the clip products; d: bits */
    uint64_t *w = party_words(m, 7 * n, &ok);
    uint64_t table[1 << KVS_FXNL_SILU_BITS];
    if (!ok)
        return no_memory(err, "a SiLU", n);
    uint64_t *xs = w, *cmp = w ? w + n : NULL, *d = w ? w + 3 * n : NULL,
             *z = w ? w + 5 * n : NULL, *s = w ? w + 6 * n : NULL;
    const uint64_t eight = (uint64_t)KVS_FXNL_SILU_MAX << f;
    for (size_t i = 0; w && i < n; i++) {
        xs[i] = x[i];
        cmp[i] = kvs_mpc_add_public(m, x[i], eight);          /* x + 8 */
        cmp[n + i] = kvs_mpc_add_public(m, x[i], 0 - eight);  /* x - 8 */
    }
    /* d_lo = [x >= -8], d_hi = [x >= 8] in one batch */
    kvs_status st = kvs_mpc_nonneg_bits(m, op, cmp, 2 * n, bits, d, err);
    /* clip(x) = -8 + d_lo (x + 8) - d_hi (x - (8 - ulp)): one batch of two products */
    for (size_t i = 0; w && st == KVS_OK && i < n; i++)
        cmp[n + i] = kvs_mpc_add_public(m, cmp[n + i], 1);
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, op, d, cmp, 2 * n, cmp, err);
    for (size_t i = 0; w && st == KVS_OK && i < n; i++)
        z[i] = kvs_mpc_add_public(m, cmp[i] - cmp[n + i], 0 - eight);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, op, z, n, shift, err);
    if (st == KVS_OK) {
        if (w)
            kvs_fxnl_sigmoid_table(f, table);
        st = kvs_mpc_lut(m, op, z, n, KVS_FXNL_SILU_BITS, table, s, err);
    }
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, op, xs, s, n, s, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, op, s, n, f, err);
    if (st == KVS_OK && w)
        memcpy(out, s, sizeof *out * n);
    free(w);
    return st;
}

/* The bucket guess of n values x < 2^hi: the parties compare x with 2^j (j = lo+1..hi, fixed
 * point) in one batch of sign tests (x - 2^j is below 2^(hi+f) in magnitude: hi + f + 1 bits)
 * and form y = g(lo) + sum_j [x >= 2^j] (g(j) - g(j-1)), which is
 * g of x's bucket, locally (shared bits times public constants). */
static kvs_status bucket_guess(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int lo,
                               int hi, uint64_t (*guess)(int, int), uint64_t *y,
                               kvs_error *err)
{
    const int f = m->frac;
    const size_t k = (size_t)(hi - lo);
    int ok;
    uint64_t *d = party_words(m, n * k, &ok);
    if (!ok)
        return no_memory(err, "a range normalisation", n * k);
    for (size_t i = 0; d && i < n; i++)
        for (size_t j = 0; j < k; j++)
            d[i * k + j] = kvs_mpc_add_public(m, x[i], 0 - ((uint64_t)1 << (lo + 1 + (int)j + f)));
    kvs_status st = kvs_mpc_nonneg_bits(m, op, d, n * k, hi + f + 1, d, err);
    for (size_t i = 0; d && st == KVS_OK && i < n; i++) {
        uint64_t acc = kvs_mpc_add_public(m, 0, guess(lo, f));
        for (size_t j = 0; j < k; j++) {
            const int e = lo + 1 + (int)j;
            acc += d[i * k + j] * (guess(e, f) - guess(e - 1, f));
        }
        y[i] = acc;
    }
    free(d);
    return st;
}

kvs_status kvs_mpc_recip(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                         kvs_error *err)
{
    const int f = m->frac;
    if (f < 1 || f > 20)
        return kvs_fail(err, KVS_ERR_ARG, "reciprocal with %d fraction bits: 1 to 20", f);
    int ok;
    uint64_t *w = party_words(m, 3 * n, &ok);
    if (!ok)
        return no_memory(err, "a reciprocal", n);
    uint64_t *xs = w, *y = w ? w + n : NULL, *t = w ? w + 2 * n : NULL;
    if (w)
        memcpy(xs, x, sizeof *xs * n);
    kvs_status st = bucket_guess(m, op, xs, n, 0, KVS_FXNL_RECIP_MAXEXP, kvs_fxnl_recip_guess,
                                 y, err);
    const uint64_t two = (uint64_t)2 << f;
    /* Newton: t = x y, y = y (2 - t) */
    for (int it = kvs_fxnl_recip_iters(f); st == KVS_OK && it > 0; it--) {
        st = kvs_mpc_mul(m, op, xs, y, n, t, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, op, t, n, f, err);
        for (size_t i = 0; w && st == KVS_OK && i < n; i++)
            t[i] = kvs_mpc_add_public(m, 0 - t[i], two);
        if (st == KVS_OK)
            st = kvs_mpc_mul(m, op, y, t, n, y, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, op, y, n, f, err);
    }
    if (st == KVS_OK && w)
        memcpy(out, y, sizeof *out * n);
    free(w);
    return st;
}

kvs_status kvs_mpc_rsqrt(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                         kvs_error *err)
{
    const int f = m->frac;
    if (f < 1 || f > 18)
        return kvs_fail(err, KVS_ERR_ARG, "inverse square root with %d fraction bits: 1 to 18",
                        f);
    int ok;
    uint64_t *w = party_words(m, 3 * n, &ok);
    if (!ok)
        return no_memory(err, "an inverse square root", n);
    uint64_t *xs = w, *y = w ? w + n : NULL, *t = w ? w + 2 * n : NULL;
    if (w)
        memcpy(xs, x, sizeof *xs * n);
    kvs_status st = bucket_guess(m, op, xs, n, -f, KVS_FXNL_RSQRT_MAXEXP, kvs_fxnl_rsqrt_guess,
                                 y, err);
    const uint64_t three = (uint64_t)3 << f;
    /* Newton: t = (x y) y at 3f bits truncated by 2f, y = y (3 - t) / 2 */
    for (int it = kvs_fxnl_rsqrt_iters(f); st == KVS_OK && it > 0; it--) {
        st = kvs_mpc_mul(m, op, xs, y, n, t, err);
        if (st == KVS_OK)
            st = kvs_mpc_mul(m, op, t, y, n, t, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, op, t, n, 2 * f, err);
        for (size_t i = 0; w && st == KVS_OK && i < n; i++)
            t[i] = kvs_mpc_add_public(m, 0 - t[i], three);
        if (st == KVS_OK)
            st = kvs_mpc_mul(m, op, y, t, n, y, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, op, y, n, f + 1, err);
    }
    if (st == KVS_OK && w)
        memcpy(out, y, sizeof *out * n);
    free(w);
    return st;
}
