/* Numeric kernels: type conversion, (de)quantisation, matmul, and the small per-vector ops of a
 * Llama forward pass. Every optimised kernel has a scalar reference (*_ref) that tests compare
 * against. */
#ifndef KVS_KERNELS_H
#define KVS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "kvslim.h"
#include "threadpool.h"

/* A status the caller must look at (a warning, so an error under -Werror, if it is dropped). */
#if defined(__GNUC__)
#define KVS_MUST_CHECK __attribute__((warn_unused_result))
#else
#define KVS_MUST_CHECK
#endif

/* IEEE half and bfloat16 conversions; fp32 -> half/bf16 round to nearest even, NaN preserved. */
float kvs_fp16_to_fp32(uint16_t h);
uint16_t kvs_fp32_to_fp16(float f);
float kvs_bf16_to_fp32(uint16_t h);
uint16_t kvs_fp32_to_bf16(float f);

/* Row conversion between fp32 and any dtype. n must be a multiple of the block size.
 * Dequantisation covers every dtype (Q4_1, Q5_0, Q5_1, the K-quants and IQ4_NL through
 * dequant.h, bit-identical to GGML's dequantize_row_*). Quantisation covers F32, F16, BF16,
 * Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (the types kvslim writes; any other type aborts, a caller
 * bug). Q8_0 and Q4_0 follow the standard GGML reference quantisers bit for bit:
 *   Q8_0: d = amax / 127, q = round(x / d)
 *   Q4_0: d = max / -8 (max = the element of largest magnitude, with its sign),
 *         q = min(15, (int8)(x / d + 8.5))
 * The K-quants use kvslim's own direct method (dequant.h, quantize_kq.c): GGML's block layouts,
 * not llama.cpp's search for the least-squares scales, so the bytes differ from llama.cpp's. */
void kvs_dequantize_row(kvs_dtype t, const void *src, float *dst, int64_t n);
void kvs_quantize_row(kvs_dtype t, const float *src, void *dst, int64_t n);

/* y[r][o] = sum_i x[r][i] * W[o][i] for r < n_rows, o < n_out. Q2_K and Q3_K weights are
 * dequantised block by block and multiplied in fp32 with fp32 x (dequant.h, matmul_deq.c):
 * within fp32 rounding of the fp32 reference.
 * W is n_out rows of n_in elements of type wt (row stride = bytes of n_in elements).
 * x is n_rows x n_in fp32 (row stride n_in), y is n_rows x n_out fp32 (row stride n_out).
 * Runs on every thread of pool. Q8_0/Q4_0 weights may quantise x to Q8_0 internally (as GGML
 * does), and Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0 and Q5_1 weights do (matmul_kq.h), so
 * results differ from the fp32 reference by that rounding. n_rows == 0 or n_out == 0 does
 * nothing. Returns KVS_OK with y written, or, with y not written: KVS_ERR_UNSUPPORTED for a
 * type without a kernel, KVS_ERR_ARG for negative sizes or n_in not a whole number of wt's
 * blocks, KVS_ERR_NOMEM when its scratch memory cannot be had. The caller names the tensor. */
kvs_status kvs_matmul(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                      int n_rows, int n_in, int n_out) KVS_MUST_CHECK;
/* kvs_matmul, or with exact != 0 the product that never quantises x: block-type weights
 * (Q8_0, Q4_0 and every type above) are dequantised to fp32 and multiplied with the fp32 x, so
 * the result is the fp32 product with the dequantised weights up to summation order (what
 * llama.cpp computes on a copy of the file dequantised to F32). Slower for the types with
 * integer kernels; the same for the others. */
kvs_status kvs_matmul_ex(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                         int n_rows, int n_in, int n_out, int exact) KVS_MUST_CHECK;
/* Scalar reference: dequantises each weight row and accumulates in double. */
void kvs_matmul_ref(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows, int n_in,
                    int n_out);

/* o = x / sqrt(mean(x^2) + eps) * w. o may alias x. */
void kvs_rmsnorm(float *o, const float *x, const float *w, int n, float eps);
/* In-place softmax of x[0..n). */
void kvs_softmax(float *x, int n);
/* a[i] = silu(a[i]) * b[i]. */
void kvs_swiglu(float *a, const float *b, int n);
/* Whether |x[i]| < limit for every i of n: 0 for any NaN (and any inf when limit is INFINITY). */
int kvs_abs_below(const float *x, size_t n, float limit);
/* Rotary embedding of n_heads consecutive heads of head_dim in vec at position pos, rotating
 * the first rot_dim dims of each head. Adjacent mode (neox = 0) rotates pairs (2i, 2i+1) with
 * theta = pos * base^(-2i/rot_dim); NeoX mode rotates (i, i + rot_dim/2) with the same theta. */
void kvs_rope(float *vec, int n_heads, int head_dim, int rot_dim, int pos, float base, int neox);
/* kvs_rope in two steps, for a position whose angles serve many vectors (every layer's queries
 * and keys): cs / sn (rot_dim / 2 each) get the cos and sin of its pairs exactly as kvs_rope
 * computes them, and kvs_rope_apply turns vec by them (by any cos / sin per pair). */
void kvs_rope_angles(int pos, int rot_dim, float base, float *cs, float *sn);
void kvs_rope_apply(float *vec, int n_heads, int head_dim, int rot_dim, const float *cs,
                    const float *sn, int neox);
/* Position shifting: vectors kvs_rope rotated at position `from` become (to float rounding)
 * what kvs_rope gives at position `to`. */
void kvs_rope_move(float *vec, int n_heads, int head_dim, int rot_dim, int from, int to,
                   float base, int neox);
/* Dot product of two fp32 vectors. */
float kvs_dot_f32(const float *a, const float *b, int n);
/* y += a * x. */
void kvs_axpy_f32(float *y, float a, const float *x, int n);
/* dst[c * ld + r] = src[r * cols + c] for r < rows, c < cols: a rows x cols block turned into
 * cols rows of ld floats (attention's values, slot-major, into the slots of VT). */
void kvs_transpose_f32(float *dst, size_t ld, const float *src, int rows, int cols);
/* The same with a half-precision a / x (the F16 KV cache's keys and values). */
float kvs_dot_f16_f32(const uint16_t *a, const float *b, int n);
void kvs_axpy_f16(float *y, float a, const uint16_t *x, int n);
/* Decode attention over n rows of hd fp16 (row j at rows + (sel ? sel[j] : j) * hd;
 * kernels_attn.c): scores[j] = scale * dot(row j, q), and out = sum_j p[j] * row j (out is
 * overwritten). Equal to the per-row kernels above up to the order of the additions. */
void kvs_dot_rows_f16(float *scores, const uint16_t *rows, const int *sel, int n, int hd,
                      const float *q, float scale);
void kvs_weighted_rows_f16(float *out, const float *p, const uint16_t *rows, const int *sel,
                           int n, int hd);

/* KIVI codes (kernels_kivi.c): b-bit codes (b in 1, 2, 4, 8) packed little-endian, element d
 * at bit d * b; x ~ code * scale + min with fp16 scale and min per group. */
int kvs_kivi_get(const uint8_t *codes, int bits, int d);
void kvs_kivi_set(uint8_t *codes, int bits, int d, int q);
/* scale = (max - min) / (2^b - 1) and min of n elements x[i * stride], both rounded to fp16. */
void kvs_kivi_params(const float *x, int n, int stride, int bits, uint16_t *scale, uint16_t *mn);
/* clamp(round((x - min) / scale), 0, 2^b - 1) against the fp16 scale and min. */
int kvs_kivi_code(float x, uint16_t scale, uint16_t mn, int bits);
/* sum_d w[d] * code[d]: with w = q * scale (per channel) plus sum q * min, a key dot product. */
float kvs_dot_kivi_codes(const uint8_t *codes, int bits, const float *w, int n);
float kvs_dot_kivi_codes_ref(const uint8_t *codes, int bits, const float *w, int n);
/* A value row: packed codes, then per group of `group` channels (the whole row when n <
 * group) its fp16 scale and min. */
size_t kvs_kivi_value_row_bytes(int n, int bits, int group);
void kvs_kivi_quantize_value_row(const float *x, int n, int bits, int group, uint8_t *row);
void kvs_kivi_dequantize_value_row(const uint8_t *row, int n, int bits, int group, float *out);
/* y += a * dequant(row). */
void kvs_axpy_kivi_value(float *y, float a, const uint8_t *row, int n, int bits, int group);

#endif
