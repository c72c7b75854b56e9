/* Correlated randomness from the dealer: Beaver triples, weight masks and their product
 * correlations, masks, dealer-known shares, FSS keys (corr.h). */
#include "mpc/corr.h"

#include <stdlib.h>
#include <string.h>

#include "mpc/fss.h"

/* Dealer to party b: bytes, sent at once (the dealer never receives, so nothing else would
 * flush its channels). */
static kvs_status dealer_send(kvs_mpc *m, int b, kvs_mpc_op op, const void *v, size_t n,
                              kvs_error *err)
{
    m->dealer_bytes += n;
    kvs_status st = kvs_chan_send(m->to[b], op, v, n, err);
    return st == KVS_OK ? kvs_chan_flush(m->to[b], err) : st;
}

static kvs_status send_words(kvs_mpc *m, int b, kvs_mpc_op op, const uint64_t *v, size_t n,
                             kvs_error *err)
{
    return dealer_send(m, b, op, v, n * sizeof *v, err);
}

static kvs_status recv_words(kvs_mpc *m, kvs_mpc_op op, uint64_t *v, size_t n, kvs_error *err)
{
    m->dealer_bytes += n * sizeof *v;
    return kvs_chan_recv(m->dealer, op, v, n * sizeof *v, err);
}

static kvs_status no_memory(kvs_error *err, size_t n)
{
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu words of correlated randomness",
                    n);
}

kvs_status kvs_corr_triples(kvs_mpc *m, kvs_mpc_op op, size_t n, uint64_t *a, uint64_t *b, uint64_t *c,
                            kvs_error *err)
{
    if (m->role == KVS_MPC_P0) {
        kvs_prg_u64(m->corr[0], a, n);
        kvs_prg_u64(m->corr[0], b, n);
        kvs_prg_u64(m->corr[0], c, n);
        return KVS_OK;
    }
    if (m->role == KVS_MPC_P1) {
        kvs_prg_u64(m->corr[1], a, n);
        kvs_prg_u64(m->corr[1], b, n);
        return recv_words(m, op, c, n, err);
    }
    uint64_t *w = malloc(sizeof *w * 5 * (n ? n : 1));
    if (!w)
        return no_memory(err, 5 * n);
    uint64_t *a0 = w, *b0 = w + n, *c0 = w + 2 * n, *a1 = w + 3 * n, *b1 = w + 4 * n;
    kvs_prg_u64(m->corr[0], a0, n);
    kvs_prg_u64(m->corr[0], b0, n);
    kvs_prg_u64(m->corr[0], c0, n);
    kvs_prg_u64(m->corr[1], a1, n);
    kvs_prg_u64(m->corr[1], b1, n);
    for (size_t i = 0; i < n; i++)
        a1[i] = (a0[i] + a1[i]) * (b0[i] + b1[i]) - c0[i]; /* party 1's c, in place */
    kvs_status st = send_words(m, 1, op, a1, n, err);
    free(w);
    return st;
}

kvs_status kvs_corr_matrix_triple(kvs_mpc *m, kvs_mpc_op op, size_t r, size_t k, size_t n,
                                  uint64_t *A, uint64_t *B, uint64_t *C, kvs_error *err)
{
    if (m->role != KVS_MPC_DEALER) {
        kvs_prg *own = m->corr[m->role];
        kvs_prg_u64(own, A, r * k);
        kvs_prg_u64(own, B, k * n);
        if (m->role == KVS_MPC_P0) {
            kvs_prg_u64(own, C, r * n);
            return KVS_OK;
        }
        return recv_words(m, op, C, r * n, err);
    }
    /* the dealer: A = A0 + A1, B = B0 + B1, party 1's C = A B - C0 */
    const size_t ak = r * k, bk = k * n, cn = r * n;
    uint64_t *w = malloc(sizeof *w * (2 * ak + 2 * bk + 2 * cn + 1));
    if (!w)
        return no_memory(err, 2 * (ak + bk + cn));
    uint64_t *a = w, *b = a + ak, *c = b + bk, *a1 = c + cn, *b1 = a1 + ak, *c1 = b1 + bk;
    kvs_prg_u64(m->corr[0], a, ak);
    kvs_prg_u64(m->corr[0], b, bk);
    kvs_prg_u64(m->corr[0], c, cn);
    kvs_prg_u64(m->corr[1], a1, ak);
    kvs_prg_u64(m->corr[1], b1, bk);
    for (size_t i = 0; i < ak; i++)
        a[i] += a1[i];
    for (size_t i = 0; i < bk; i++)
        b[i] += b1[i];
    for (size_t i = 0; i < r; i++)
        for (size_t j = 0; j < n; j++) {
            uint64_t acc = 0;
            for (size_t t = 0; t < k; t++)
                acc += a[i * k + t] * b[t * n + j];
            c1[i * n + j] = acc - c[i * n + j];
        }
    kvs_status st = send_words(m, 1, op, c1, cn, err);
    free(w);
    return st;
}

void kvs_corr_weight_mask(kvs_mpc *m, size_t k, size_t n, uint64_t *B)
{
    if (m->role != KVS_MPC_P0)
        kvs_prg_u64(m->corr[1], B, k * n);
}

kvs_status kvs_corr_matmul(kvs_mpc *m, kvs_mpc_op op, size_t rows, size_t k, size_t n, const uint64_t *B,
                           uint64_t *A, uint64_t *C, kvs_error *err)
{
    if (m->role == KVS_MPC_P0) {
        kvs_prg_u64(m->corr[0], A, rows * k);
        kvs_prg_u64(m->corr[0], C, rows * n);
        return KVS_OK;
    }
    if (m->role == KVS_MPC_P1)
        return recv_words(m, op, C, rows * n, err);
    uint64_t *a = malloc(sizeof *a * (rows * k + rows * n + 1));
    if (!a)
        return no_memory(err, rows * (k + n));
    uint64_t *c = a + rows * k;
    kvs_prg_u64(m->corr[0], a, rows * k);
    kvs_prg_u64(m->corr[0], c, rows * n);
    for (size_t r = 0; r < rows; r++) {
        uint64_t *cr = c + r * n;
        for (size_t j = 0; j < n; j++)
            cr[j] = (uint64_t)0 - cr[j];
        for (size_t i = 0; i < k; i++) {
            const uint64_t x = a[r * k + i];
            const uint64_t *bi = B + i * n;
            for (size_t j = 0; j < n; j++)
                cr[j] += x * bi[j];
        }
    }
    kvs_status st = send_words(m, 1, op, c, rows * n, err);
    free(a);
    return st;
}

void kvs_corr_masks(kvs_mpc *m, size_t count, uint64_t *r)
{
    if (m->role != KVS_MPC_DEALER) {
        kvs_prg_u64(m->corr[m->role], r, count);
        return;
    }
    uint64_t tmp[256];
    for (size_t done = 0; done < count;) {
        const size_t step = count - done < 256 ? count - done : 256;
        kvs_prg_u64(m->corr[0], r + done, step);
        kvs_prg_u64(m->corr[1], tmp, step);
        for (size_t i = 0; i < step; i++)
            r[done + i] += tmp[i];
        done += step;
    }
}

kvs_status kvs_corr_shares(kvs_mpc *m, kvs_mpc_op op, size_t count, const uint64_t *v, uint64_t *share,
                           kvs_error *err)
{
    if (m->role == KVS_MPC_P0) {
        kvs_prg_u64(m->corr[0], share, count);
        return KVS_OK;
    }
    if (m->role == KVS_MPC_P1)
        return recv_words(m, op, share, count, err);
    uint64_t *s = malloc(sizeof *s * (count ? count : 1));
    if (!s)
        return no_memory(err, count);
    kvs_prg_u64(m->corr[0], s, count);
    for (size_t i = 0; i < count; i++)
        s[i] = v[i] - s[i];
    kvs_status st = send_words(m, 1, op, s, count, err);
    free(s);
    return st;
}

/* FSS key pairs: the dealer draws both root seeds of every pair from its private stream. */
typedef size_t (*key_bytes_fn)(int n);
typedef void (*key_gen_fn)(int n, size_t count, const uint64_t *alpha, const uint64_t *beta,
                           const uint8_t *seeds, uint8_t *k0, uint8_t *k1);

static kvs_status fss_pairs(kvs_mpc *m, kvs_mpc_op op, int nbits, size_t count,
                            const uint64_t *alpha, const uint64_t *beta, uint8_t *keys,
                            key_bytes_fn bytes, key_gen_fn gen, kvs_error *err)
{
    const size_t kb = bytes(nbits), total = kb * count;
    if (m->role != KVS_MPC_DEALER) {
        m->dealer_bytes += total;
        return kvs_chan_recv(m->dealer, op, keys, total, err);
    }
    uint8_t *k = malloc(2 * total + 32 * count + 1);
    if (!k)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu FSS keys", count);
    uint8_t *seeds = k + 2 * total;
    kvs_prg_bytes(m->own, seeds, 32 * count);
    gen(nbits, count, alpha, beta, seeds, k, k + total);
    kvs_status st = dealer_send(m, 0, op, k, total, err);
    if (st == KVS_OK)
        st = dealer_send(m, 1, op, k + total, total, err);
    free(k);
    return st;
}

kvs_status kvs_corr_dcf(kvs_mpc *m, kvs_mpc_op op, int nbits, size_t count,
                        const uint64_t *alpha, const uint64_t *beta, uint8_t *keys,
                        kvs_error *err)
{
    return fss_pairs(m, op, nbits, count, alpha, beta, keys, kvs_dcf_key_bytes,
                     kvs_dcf_gen_many, err);
}

kvs_status kvs_corr_dpf(kvs_mpc *m, kvs_mpc_op op, int nbits, size_t count,
                        const uint64_t *alpha, const uint64_t *beta, uint8_t *keys,
                        kvs_error *err)
{
    return fss_pairs(m, op, nbits, count, alpha, beta, keys, kvs_dpf_key_bytes, kvs_dpf_gen_many,
                     err);
}
