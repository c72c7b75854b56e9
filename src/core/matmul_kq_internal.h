/* The context and helpers that matmul_kq.c (the K-quant and block-of-32 products, their
 * dispatch and the VNNI and portable paths) shares with matmul_kq_avx2.c (the AVX2 paths of
 * Q4_K, Q5_K and Q6_K). Private to those two files. */
#ifndef KVS_MATMUL_KQ_INTERNAL_H
#define KVS_MATMUL_KQ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "worksplit.h"

enum { PATH_PORTABLE, PATH_GEMV, PATH_TILE, PATH_AVX2, PATH_AVX2_TILE };

typedef struct {
    float *y;
    const float *x;
    const char *w;
    kvs_dtype wt;
    int path;
    int n_rows, n_in, n_out;
    size_t row_bytes;

    /* Quantised x, per row: nbp = nb rounded up to 8 blocks (zero padded). */
    int nb, nbp;
    int8_t *xq; /* nbp * 32 bytes; gemv: permuted to match the weight vectors (fill_x_row) */
    float *xd;  /* nbp block scales */
    float *xo;  /* 2 * nbp fp32 x-sum terms (Q4_K / Q5_K / Q4_1 / Q5_1, layout by path) */
    int32_t *xi; /* 2 * nbp integer x-sum terms (tile Q6_K / IQ4_NL / Q5_0) */
    float *xl;  /* 2 * nbp: gemv K-quants, per super-block 16 lanes of xd (fill_x_row) */
    int32_t *xb; /* 8 * nbp: gemv Q6_K / IQ4_NL / Q5_0, per lane (4 bytes of xq) -off sum(q) */
    /* AVX2 (x blocks on their super-block's grid, kvs_matmul_kq_ref_sb; xd[sb] holds D / 128): */
    int16_t *xk; /* 2 * nbp: per super-block k_0..7, 8 zeros (Q6_K: k_0 k_0 k_1 k_1 .. k_7 k_7) */
    int16_t *xp; /* 16 * nbp: Q6_K, per pair of blocks (at the first's place) the 16 lanes of
                  * 32 (q_2i + q_2i+1) of both (in avx2_pair's order) */

    char *thread_scratch;
    size_t thread_scratch_bytes;

    /* Output columns shared among the threads as in kernels_matmul.c (core/worksplit.h). */
    int unit, by_rows;
    kvs_split split;
} kq_ctx;

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of one super-block (K-quants) or block (the blocks of 32) of wt. */
static inline size_t sb_bytes(kvs_dtype wt)
{
    switch ((int)wt) {
    case KVS_Q4_K: return sizeof(kvs_block_q4_K);
    case KVS_Q5_K: return sizeof(kvs_block_q5_K);
    case KVS_Q6_K: return sizeof(kvs_block_q6_K);
    case KVS_Q4_1: return sizeof(kvs_block_q4_1);
    case KVS_Q5_0: return sizeof(kvs_block_q5_0);
    case KVS_Q5_1: return sizeof(kvs_block_q5_1);
    }
    return sizeof(kvs_block_iq4_nl);
}

/* The scales of one super-block's 8 x blocks from their amax: D = max amax / 127, k_b =
 * ceil(128 amax_b / max amax) in 1..128, xd_b = D k_b / 128 (kvs_matmul_kq_ref_sb). */
void kvs_kq_sb_scales(const float *amax, int *k, float *xd, float *d);

/* AVX2 (no VNNI): smallest n_rows for the 8-column tiles (avx2_tile; below, the row kernels,
 * up to 4 x rows per pass over W). Measured on Zen 4, 768 x 2048, one thread, GFLOP/s tile / row
 * kernels (best of 7 x 20 calls, two runs, noisy VM):
 *   rows     8            12           16           20           24           32
 *   q4_K   60-67/62-88  78/63-88     69-79/63-87  73-83/62-87  67-91/59-87  83-89/85-86
 *   q6_K   43-61/56-78  51-72/64-79  77-78/76-79  82/74-75     83-86/66     89/63-65
 * (the panel is unpacked once per call: at 512 rows about 2% of the time). */
#ifndef KQ2_TILE_MIN_ROWS
#define KQ2_TILE_MIN_ROWS(wt) ((wt) == KVS_Q6_K ? 16 : 24)
#endif

/* The AVX2 paths (matmul_kq_avx2.c; builds with AVX2 only): the x row of the row kernels
 * (pairs of blocks interleaved) and of the tiles (element order), the row kernels over x rows
 * [r0, r1) and output columns [o0, o1), the tiles over the same with a thread's scratch, and
 * the bytes of that scratch. */
void kvs_kq2_fill_x_row_sb(const kq_ctx *c, int r);
void kvs_kq2_fill_x_row_tile(const kq_ctx *c, int r);
void kvs_kq2_rows(const kq_ctx *c, int r0, int r1, int o0, int o1);
void kvs_kq2_tile_rows(const kq_ctx *c, char *scratch, int r0, int r1, int o0, int o1);
size_t kvs_kq2_scratch_bytes(int nb);

#endif
