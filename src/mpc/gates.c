/* Arithmetic gates: input, open, Beaver products, weight products, exact truncation (gates.h). */
#include "mpc/gates.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/corr.h"
#include "mpc/fss.h"

static kvs_status no_memory(kvs_error *err, const char *what, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %s (%zu values)", what, n);
}

kvs_status kvs_mpc_input(kvs_mpc *m, int owner, const uint64_t *x, size_t n, uint64_t *share,
                         kvs_error *err)
{
    if (kvs_mpc_is_dealer(m))
        return KVS_OK;
    if ((int)m->role != owner)
        return kvs_chan_recv(m->peer, KVS_OP_INPUT, share, n * sizeof *share, err);
    uint64_t *s = malloc(sizeof *s * (n ? n : 1)); /* the peer's share (x may alias share) */
    if (!s)
        return no_memory(err, "an input", n);
    kvs_prg_u64(m->own, s, n);
    kvs_status st = kvs_chan_send(m->peer, KVS_OP_INPUT, s, n * sizeof *s, err);
    /* a gate that ends on a send flushes it: the peer may wait for it while this party waits
     * for the dealer, and the dealer for room to write to the peer */
    if (st == KVS_OK)
        st = kvs_chan_flush(m->peer, err);
    for (size_t i = 0; i < n; i++)
        share[i] = x[i] - s[i];
    free(s);
    return st;
}

kvs_status kvs_mpc_open(kvs_mpc *m, kvs_mpc_op op, const uint64_t *share, size_t n,
                        uint64_t *out, kvs_error *err)
{
    if (kvs_mpc_is_dealer(m))
        return KVS_OK;
    kvs_status st = kvs_chan_send(m->peer, op, share, n * sizeof *share, err);
    if (st == KVS_OK)
        st = kvs_chan_recv(m->peer, op, out, n * sizeof *out, err);
    for (size_t i = 0; st == KVS_OK && i < n; i++)
        out[i] += share[i];
    return st;
}

void kvs_mpc_pack(kvs_mpc *m, const uint64_t *v, size_t n, int bits, uint8_t *out)
{
    const int nb = (bits + 7) / 8;
    const uint64_t keep = bits >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << bits) - 1;
    uint64_t fill[64];
    for (size_t i = 0; i < n; i++) {
        if (i % 64 == 0 && keep != ~(uint64_t)0)
            kvs_prg_u64(m->own, fill, n - i < 64 ? n - i : 64);
        const uint64_t w = (v[i] & keep) | (keep == ~(uint64_t)0 ? 0 : fill[i % 64] & ~keep);
        for (int j = 0; j < nb; j++)
            out[i * nb + j] = (uint8_t)(w >> (8 * j));
    }
}

uint64_t kvs_mpc_unpack(const uint8_t *in, size_t i, int bits)
{
    const int nb = (bits + 7) / 8;
    uint64_t w = 0;
    for (int j = 0; j < nb; j++)
        w |= (uint64_t)in[i * nb + j] << (8 * j);
    return bits >= 64 ? w : w & (((uint64_t)1 << bits) - 1);
}

kvs_status kvs_mpc_open_bits(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                             uint64_t *c, kvs_error *err)
{
    if (kvs_mpc_is_dealer(m) || n == 0)
        return KVS_OK;
    const size_t nb = (size_t)(bits + 7) / 8;
    const uint64_t keep = bits >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << bits) - 1;
    uint8_t *msg = malloc(2 * nb * n);
    if (!msg)
        return no_memory(err, "an opening", n);
    kvs_mpc_pack(m, x, n, bits, msg);
    kvs_status st = kvs_chan_send(m->peer, op, msg, nb * n, err);
    if (st == KVS_OK)
        st = kvs_chan_recv(m->peer, op, msg + nb * n, nb * n, err);
    for (size_t i = 0; st == KVS_OK && i < n; i++)
        c[i] = (kvs_mpc_unpack(msg + nb * n, i, bits) + x[i]) & keep;
    free(msg);
    return st;
}

kvs_status kvs_mpc_reveal(kvs_mpc *m, kvs_mpc_op op, int to, const uint64_t *share, size_t n,
                          uint64_t *out, kvs_error *err)
{
    if (kvs_mpc_is_dealer(m))
        return KVS_OK;
    if ((int)m->role != to) {
        kvs_status st = kvs_chan_send(m->peer, op, share, n * sizeof *share, err);
        return st == KVS_OK ? kvs_chan_flush(m->peer, err) : st;
    }
    kvs_status st = kvs_chan_recv(m->peer, op, out, n * sizeof *out, err);
    for (size_t i = 0; st == KVS_OK && i < n; i++)
        out[i] += share[i];
    return st;
}

kvs_status kvs_mpc_mul(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, const uint64_t *y,
                       size_t n, uint64_t *z, kvs_error *err)
{
    uint64_t *t = malloc(sizeof *t * 5 * (n ? n : 1));
    if (!t)
        return no_memory(err, "a product", n);
    uint64_t *a = t, *b = t + n, *c = t + 2 * n, *de = t + 3 * n; /* de: d then e */
    kvs_status st = kvs_corr_triples(m, op, n, a, b, c, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(t);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        de[i] = x[i] - a[i];
        de[n + i] = y[i] - b[i];
    }
    /* open d = x - a and e = y - b in one message */
    uint64_t *open = malloc(sizeof *open * 2 * (n ? n : 1));
    if (!open) {
        free(t);
        return no_memory(err, "a product", n);
    }
    st = kvs_mpc_open(m, op, de, 2 * n, open, err);
    for (size_t i = 0; st == KVS_OK && i < n; i++) {
        const uint64_t d = open[i], e = open[n + i];
        /* x y = (d + a)(e + b) = d e + d b + e a + c: party 0 adds the public d e */
        z[i] = d * b[i] + e * a[i] + c[i] + (m->role == KVS_MPC_P0 ? d * e : 0);
    }
    free(open);
    free(t);
    return st;
}

/* y (rows x n) += x (rows x k) M (k x n), mod 2^64. */
static void matmul_add(const uint64_t *x, const uint64_t *M, size_t rows, size_t k, size_t n,
                       uint64_t *y)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < k; i++) {
            const uint64_t v = x[r * k + i];
            const uint64_t *mi = M + i * n;
            uint64_t *yr = y + r * n;
            for (size_t j = 0; j < n; j++)
                yr[j] += v * mi[j];
        }
}

kvs_status kvs_mpc_matmul_batch(kvs_mpc *m, kvs_mpc_op op, const uint64_t *X,
                                const uint64_t *Y, size_t batch, size_t r, size_t k, size_t n,
                                uint64_t *Z, kvs_error *err)
{
    const size_t ak = r * k, bk = k * n, per = ak + bk;
    uint64_t *w = calloc(3 * batch * per + 1, sizeof *w);
    if (!w)
        return no_memory(err, "a matrix product", batch * per);
    uint64_t *AB = w, *de = AB + batch * per, *open = de + batch * per;
    const int dealer = kvs_mpc_is_dealer(m);
    kvs_status st = KVS_OK;
    for (size_t b = 0; b < batch && st == KVS_OK; b++)
        st = kvs_corr_matrix_triple(m, op, r, k, n, AB + b * per, AB + b * per + ak,
                                    dealer ? NULL : Z + b * r * n, err);
    if (st != KVS_OK || dealer) {
        free(w);
        return st;
    }
    for (size_t b = 0; b < batch; b++) {
        const uint64_t *A = AB + b * per, *B = A + ak;
        uint64_t *d = de + b * per;
        for (size_t i = 0; i < ak; i++)
            d[i] = X[b * ak + i] - A[i];
        for (size_t i = 0; i < bk; i++)
            d[ak + i] = Y[b * bk + i] - B[i];
    }
    st = kvs_mpc_open(m, op, de, batch * per, open, err);
    for (size_t b = 0; st == KVS_OK && b < batch; b++) {
        /* X Y = (D + A)(E + B) = D E + D B + A E + A B: Z holds C, party 0 adds D E */
        const uint64_t *A = AB + b * per, *B = A + ak, *D = open + b * per, *E = D + ak;
        uint64_t *z = Z + b * r * n;
        matmul_add(D, B, r, k, n, z);
        matmul_add(A, E, r, k, n, z);
        if (m->role == KVS_MPC_P0)
            matmul_add(D, E, r, k, n, z);
    }
    free(w);
    return st;
}

kvs_status kvs_mpc_matmul(kvs_mpc *m, kvs_mpc_op op, const uint64_t *X, const uint64_t *Y,
                          size_t r, size_t k, size_t n, uint64_t *Z, kvs_error *err)
{
    return kvs_mpc_matmul_batch(m, op, X, Y, 1, r, k, n, Z, err);
}

kvs_status kvs_mpc_trunc(kvs_mpc *m, kvs_mpc_op op, uint64_t *x, size_t n, int f,
                         kvs_error *err)
{
    if (f <= 0 || n == 0)
        return KVS_OK;
    if (f > 62)
        return kvs_fail(err, KVS_ERR_ARG, "truncation by %d bits: at most 62", f);
    const uint64_t bias = (uint64_t)1 << 62, low = ((uint64_t)1 << f) - 1;
    const size_t kb = kvs_dcf_key_bytes(f);
    /* r: the mask; rq: shares of floor(r / 2^f), then of msb(r) 2^(64 - f); alpha/beta: the
     * dealer's DCF parameters */
    uint64_t *w = malloc(sizeof *w * 7 * n);
    uint8_t *keys = malloc(kb * n);
    if (!w || !keys) {
        free(w);
        free(keys);
        return no_memory(err, "a truncation", n);
    }
    uint64_t *r = w, *rq = w + n, *alpha = w + 3 * n, *beta = w + 4 * n, *c = w + 5 * n,
             *tmp = w + 6 * n;
    kvs_corr_masks(m, n, r);
    if (kvs_mpc_is_dealer(m))
        for (size_t i = 0; i < n; i++) {
            alpha[i] = r[i] >> f;
            beta[i] = (r[i] >> 63) << (64 - f);
        }
    kvs_status st = kvs_corr_shares(m, op, 2 * n, alpha, rq, err); /* alpha, beta are adjacent */
    /* borrow of the low bits: [c mod 2^f < r mod 2^f], as 1 */
    if (st == KVS_OK && kvs_mpc_is_dealer(m))
        for (size_t i = 0; i < n; i++) {
            alpha[i] = r[i] & low;
            beta[i] = 1;
        }
    if (st == KVS_OK)
        st = kvs_corr_dcf(m, op, f, n, alpha, beta, keys, err);
    if (st != KVS_OK || kvs_mpc_is_dealer(m)) {
        free(w);
        free(keys);
        return st;
    }
    for (size_t i = 0; i < n; i++)
        tmp[i] = kvs_mpc_add_public(m, x[i], bias) + r[i];
    st = kvs_mpc_open(m, op, tmp, n, c, err);
    const int b = (int)m->role;
    uint64_t *borrow = alpha; /* the parties' use of the dealer's array */
    for (size_t i = 0; st == KVS_OK && i < n; i++)
        tmp[i] = c[i] & low;
    if (st == KVS_OK) /* all the keys in one batched walk */
        kvs_dcf_eval_many(b, keys, f, tmp, n, borrow);
    for (size_t i = 0; st == KVS_OK && i < n; i++) {
        /* y = x + 2^62 = c - r + wrap 2^64, so floor(y / 2^f) = floor(c / 2^f) - floor(r / 2^f)
         * - borrow + wrap 2^(64 - f); then remove the bias's 2^(62 - f). As y < 2^63, c = y + r
         * wraps exactly when r's top bit is set and c's is not (r < 2^63 cannot reach 2^64;
         * r >= 2^63 gives c >= 2^63 without the wrap and c < y < 2^63 with it): the wrap is
         * the dealer's msb(r) share, kept when c's top bit is clear. No comparison over 64
         * bits. */
        const uint64_t wrap = (c[i] >> 63) ? 0 : rq[n + i];
        uint64_t y = wrap - borrow[i] - rq[i];
        y = kvs_mpc_add_public(m, y, (c[i] >> f) - (bias >> f));
        x[i] = y;
    }
    free(w);
    free(keys);
    return st;
}

kvs_status kvs_mpc_weight_setup(kvs_mpc *m, kvs_mpc_weight *w, size_t k, size_t n,
                                const uint64_t *W, kvs_error *err)
{
    memset(w, 0, sizeof *w);
    w->k = k;
    w->n = n;
    const size_t kn = k * n;
    if (m->role != KVS_MPC_P0 && !(w->B = malloc(sizeof *w->B * (kn ? kn : 1))))
        return no_memory(err, "a weight mask", kn);
    kvs_corr_weight_mask(m, k, n, w->B);
    if (kvs_mpc_is_dealer(m))
        return KVS_OK;
    uint64_t *buf = malloc(sizeof *buf * (kn ? kn : 1));
    if (!buf) {
        kvs_mpc_weight_free(w);
        return no_memory(err, "a weight matrix", kn);
    }
    kvs_status st;
    if (m->role == KVS_MPC_P1) {
        memcpy(buf, W, sizeof *buf * kn);
        w->W = buf;
        uint64_t *wm = malloc(sizeof *wm * (kn ? kn : 1));
        if (!wm) {
            kvs_mpc_weight_free(w);
            return no_memory(err, "a weight matrix", kn);
        }
        for (size_t i = 0; i < kn; i++)
            wm[i] = W[i] - w->B[i];
        st = kvs_chan_send(m->peer, KVS_OP_INPUT, wm, sizeof *wm * kn, err);
        if (st == KVS_OK)
            st = kvs_chan_flush(m->peer, err);
        free(wm);
    } else {
        w->Wm = buf;
        st = kvs_chan_recv(m->peer, KVS_OP_INPUT, buf, sizeof *buf * kn, err);
    }
    if (st != KVS_OK)
        kvs_mpc_weight_free(w);
    return st;
}

void kvs_mpc_weight_free(kvs_mpc_weight *w)
{
    free(w->W);
    free(w->B);
    free(w->Wm);
    w->W = w->B = w->Wm = NULL;
}


kvs_status kvs_mpc_matmul_w(kvs_mpc *m, const kvs_mpc_weight *w, const uint64_t *x,
                            size_t rows, uint64_t *y, kvs_error *err)
{
    const size_t k = w->k, n = w->n;
    uint64_t *A = NULL, *D = malloc(sizeof *D * (rows * k + 1));
    if (m->role == KVS_MPC_P0)
        A = malloc(sizeof *A * (rows * k + 1));
    if (!D || (m->role == KVS_MPC_P0 && !A)) {
        free(A);
        free(D);
        return no_memory(err, "a weight product", rows * k);
    }
    /* party 1 and the dealer have no A: the dealer's correlation goes in y */
    uint64_t *C = kvs_mpc_is_dealer(m) ? NULL : y;
    kvs_status st = kvs_corr_matmul(m, KVS_OP_MATMUL, rows, k, n, w->B, A, C, err);
    if (st == KVS_OK && m->role == KVS_MPC_P0) {
        /* y0 = x0 Wm + C0; send D = x0 - A */
        for (size_t i = 0; i < rows * k; i++)
            D[i] = x[i] - A[i];
        st = kvs_chan_send(m->peer, KVS_OP_MATMUL, D, sizeof *D * rows * k, err);
        if (st == KVS_OK)
            st = kvs_chan_flush(m->peer, err);
        matmul_add(x, w->Wm, rows, k, n, y);
    } else if (st == KVS_OK && m->role == KVS_MPC_P1) {
        /* y1 = x1 W + D B + C1 */
        st = kvs_chan_recv(m->peer, KVS_OP_MATMUL, D, sizeof *D * rows * k, err);
        if (st == KVS_OK) {
            matmul_add(x, w->W, rows, k, n, y);
            matmul_add(D, w->B, rows, k, n, y);
        }
    }
    free(A);
    free(D);
    return st;
}
