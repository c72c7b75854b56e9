/* Internal API of matmul_kq.c: matrix products for Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0 and Q5_1
 * weights with the activations quantised to 8 bits (blocks of 32), multiplied as integers. kvs_matmul (kernels.h)
 * dispatches here for these types. */
#ifndef KVS_MATMUL_KQ_H
#define KVS_MATMUL_KQ_H

#include "dtype.h"
#include "kvslim.h"
#include "threadpool.h"

/* 1 for the weight types kvs_matmul_kq multiplies (Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0, Q5_1),
 * else 0 (any value may be passed). */
int kvs_kq_type(kvs_dtype t);

/* y[r][o] = x[r] . W[o] with x quantised per block of 32 (the arithmetic of kvs_matmul_kq_ref);
 * in builds with AVX2 but not AVX-512 VNNI, Q4_K, Q5_K and Q6_K put the block scales on their
 * super-block's grid (the arithmetic of kvs_matmul_kq_ref_sb).
 * Same contract as kvs_matmul_deq (dequant.h): kvs_matmul checks the sizes first (n_rows, n_out,
 * n_in >= 1, n_in whole blocks of wt) and calls it. Returns KVS_ERR_UNSUPPORTED for other types,
 * KVS_ERR_NOMEM without scratch memory (y untouched in both cases). */
kvs_status kvs_matmul_kq(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                         int n_rows, int n_in, int n_out);

/* 1 when kvs_matmul_kq follows kvs_matmul_kq_ref_sb for wt in this build (the AVX2 path: Q4_K,
 * Q5_K, Q6_K without AVX-512 VNNI), 0 when kvs_matmul_kq_ref. */
int kvs_matmul_kq_on_grid(kvs_dtype wt);

/* kvs_matmul_kq on its AVX2 path (what a CPU without AVX-512 VNNI runs) for Q4_K, Q5_K and
 * Q6_K (kvs_matmul_kq_ref_sb's arithmetic), so that a test can check that path on any CPU with
 * AVX2; KVS_ERR_UNSUPPORTED for the
 * other types, in a build without AVX2, or with VNNI (whose builds do not compile it). */
kvs_status kvs_matmul_kq_avx2(kvs_pool *pool, float *y, const float *x, const void *w,
                              kvs_dtype wt, int n_rows, int n_in, int n_out);

/* The scalar reference that defines the arithmetic (same arguments, single-threaded, no
 * allocation; does nothing for other types):
 *  - x is quantised per block b of 32 elements: xd_b = amax / 127 (fp32), id = xd_b != 0 ?
 *    1 / xd_b : 0, q_i = rintf(x_i * id).
 *  - for each weight sub-block s (32 elements for Q4_K / Q5_K and the blocks of IQ4_NL / Q4_1 /
 *    Q5_0 / Q5_1, 16 for Q6_K) with raw unsigned quants u_i, inside x block b:
 *    isum = sum u_i q_i, xs = sum q_i, and
 *      Q4_K, Q5_K:  y += (d sc_s) xd_b isum - (dmin m_s) xd_b xs
 *      Q6_K:        y += (d sc_s) xd_b (isum - 32 xs)
 *      IQ4_NL:      y += d xd_b sum kvalue(u_i) q_i
 *      Q4_1, Q5_1:  y += d xd_b isum + m xd_b xs
 *      Q5_0:        y += d xd_b (isum - 16 xs)
 *  - fp32 accumulation (the fast paths sum in another order). */
void kvs_matmul_kq_ref(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows,
                       int n_in, int n_out);

/* kvs_matmul_kq_ref with each x block's scale on its super-block's grid, for Q4_K, Q5_K and
 * Q6_K (nothing for other types): the arithmetic of the AVX2 path, whose integer sums run over
 * the super-block with integer scales. Per super-block of 8 blocks with amax_b: D = max amax_b
 * / 127, k_b = ceil(128 amax_b / max amax_b) in 1..128, xd_b = D k_b / 128 (fp32, in that
 * order), q = rint(x / xd_b) through the reciprocal; then kvs_matmul_kq_ref's block sums. A
 * block's xd_b is at most (amax_b + max amax / 128) / 127. */
void kvs_matmul_kq_ref_sb(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows,
                          int n_in, int n_out);

#endif
