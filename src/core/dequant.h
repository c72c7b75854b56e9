/* Internal API of the dequantised-weight types (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, IQ4_NL): their
 * scalar reference dequantisers, the vectorised ones, and their matrix product. The public entry
 * points stay kvs_dequantize_row and kvs_matmul (kernels.h), which dispatch here. */
#ifndef KVS_DEQUANT_H
#define KVS_DEQUANT_H

#include <stdint.h>

#include "dtype.h"
#include "kvslim.h"
#include "threadpool.h"

/* 1 if t is one of the types this header serves, else 0 (any value may be passed). */
int kvs_deq_type(kvs_dtype t);

/* dequant_ref.c: the scalar reference, written from GGML's block layouts (dtype.h). n elements
 * (a whole number of t's blocks) from src to dst. Arithmetic as GGML's dequantize_row_* and
 * gguf-py's dequantiser: each product and difference rounded to fp32 in turn (no FMA), so the
 * results are the F32 weights `llama-quantize ... F32` writes. Does nothing for other types. */
void kvs_dequantize_row_ref(kvs_dtype t, const void *src, float *dst, int64_t n);

/* quantize_kq.c: the inverse for Q4_K, Q5_K and Q6_K (the K-quants kvslim writes): n finite
 * elements (a multiple of 256) from src to n / 256 blocks at dst. Every element comes back from
 * kvs_dequantize_row_ref within half of its sub-block's quantisation step (the method and the
 * bound are in quantize_kq.c). Does nothing for other types. kvs_quantize_row dispatches here. */
void kvs_quantize_row_kq(kvs_dtype t, const float *src, void *dst, int64_t n);

/* dequant_simd.c: the same, vectorised with AVX2 where available (bit-identical to the
 * reference: the same fp32 operations in the same order per element); the reference otherwise. */
void kvs_dequantize_row_simd(kvs_dtype t, const void *src, float *dst, int64_t n);
/* The function kvs_dequantize_row_simd uses for t (also Q8_0 and Q4_0; NULL for other types): nb whole blocks from
 * src to dst, for callers that dequantise many short spans. */
typedef void (*kvs_dequant_fn)(const void *src, float *dst, int64_t nb);
kvs_dequant_fn kvs_dequantize_fn(kvs_dtype t);

/* matmul_deq.c: kvs_matmul (kernels.h) for these types, and kvs_matmul_ex's exact product for
 * every block type with a kvs_dequantize_fn (these and Q8_0, Q4_0): y[r][o] = x[r] . W[o] with x
 * in fp32 and W dequantised block by block to fp32 (never quantising x). kvs_matmul_ex checks
 * the sizes first (n_rows, n_out, n_in >= 1, n_in whole blocks) and calls it. Returns
 * KVS_ERR_UNSUPPORTED for other types, KVS_ERR_NOMEM without scratch memory (y untouched in
 * both cases). */
kvs_status kvs_matmul_deq(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                          int n_rows, int n_in, int n_out);

#endif
