/* Comparison gates: sign, select, max and row maxima by a comparison tree (gates.h). */
#include <stdlib.h>
#include <string.h>

#include "mpc/gates.h"

kvs_status kvs_mpc_nonneg(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *d,
                          kvs_error *err)
{
    if (!kvs_mpc_is_dealer(m) && d != x)
        memcpy(d, x, sizeof *d * n);
    kvs_status st = kvs_mpc_trunc(m, op, kvs_mpc_is_dealer(m) ? NULL : d, n, 62, err);
    if (st == KVS_OK && m->role == KVS_MPC_P0)
        for (size_t i = 0; i < n; i++)
            d[i] += 1; /* floor(x / 2^62) is -1 or 0 */
    return st;
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
                        size_t n, uint64_t *z, kvs_error *err)
{
    uint64_t *d = NULL;
    if (!kvs_mpc_is_dealer(m)) {
        if (!(d = calloc(n ? n : 1, sizeof *d)))
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a maximum of %zu", n);
        for (size_t i = 0; i < n; i++)
            d[i] = a[i] - b[i];
    }
    kvs_status st = kvs_mpc_nonneg(m, op, d, n, d, err);
    if (st == KVS_OK)
        st = kvs_mpc_select(m, op, d, a, b, n, z, err);
    free(d);
    return st;
}

kvs_status kvs_mpc_max_rows(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t rows,
                            size_t len, uint64_t *out, kvs_error *err)
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
        st = kvs_mpc_max2(m, op, a, b, rows * half, a, err);
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
