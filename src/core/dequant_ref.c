/* Scalar reference dequantisers for Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_NL.
 *
 * Written from the block layouts (dtype.h documents each one), one element at a time in the
 * clearest form, as the ground truth the vectorised dequantisers and the matrix kernels are
 * tested against. Each value is computed with the same fp32 operations, in the same order, as
 * GGML's dequantize_row_* and gguf-py's numpy dequantiser: a scale product first (d * sc, or
 * dmin * m), then the product with the quant, then the subtraction of the min term (or addition
 * of m), each rounded to fp32 (the build uses ISO C, whose default is no FMA contraction). The
 * results are therefore the exact F32 weights that `llama-quantize ... F32` writes. */
#include "dequant.h"

#include <string.h>

#include "kernels_internal.h"

int kvs_deq_type(kvs_dtype t)
{
    switch ((int)t) {
    case KVS_Q4_1: case KVS_Q5_0: case KVS_Q5_1: case KVS_Q2_K: case KVS_Q3_K: case KVS_Q4_K:
    case KVS_Q5_K: case KVS_Q6_K: case KVS_IQ4_NL:
        return 1;
    }
    return 0;
}

static float h2f(uint16_t h) { return kvs_fp16_to_fp32_scalar(h); }

/* ---- blocks of 32 -------------------------------------------------------------------------- */

/* The 4-bit index of element i (< 32) in Q4_0-style nibble packing. */
static int nibble(const uint8_t *qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }

/* Bit 4 of element i of a Q5 block: bit i of the little-endian uint32 qh. */
static int q5_high(const uint8_t *qh, int i) { return (qh[i / 8] >> (i % 8)) & 1; }

static void ref_q4_1(const kvs_block_q4_1 *b, float *y)
{
    const float d = h2f(b->d), m = h2f(b->m);
    for (int i = 0; i < KVS_QK; i++)
        y[i] = (float)nibble(b->qs, i) * d + m;
}

static void ref_q5_0(const kvs_block_q5_0 *b, float *y)
{
    const float d = h2f(b->d);
    for (int i = 0; i < KVS_QK; i++)
        y[i] = (float)((nibble(b->qs, i) | q5_high(b->qh, i) << 4) - 16) * d;
}

static void ref_q5_1(const kvs_block_q5_1 *b, float *y)
{
    const float d = h2f(b->d), m = h2f(b->m);
    for (int i = 0; i < KVS_QK; i++)
        y[i] = (float)(nibble(b->qs, i) | q5_high(b->qh, i) << 4) * d + m;
}

static void ref_iq4_nl(const kvs_block_iq4_nl *b, float *y)
{
    const float d = h2f(b->d);
    for (int i = 0; i < KVS_QK; i++)
        y[i] = d * (float)kvs_iq4nl_values[nibble(b->qs, i)];
}

/* ---- K-quants ----------------------------------------------------------------------------- */

/* Element e = 128 h + 32 j + l of Q2_K / Q3_K: its 2-bit value and its sub-block of 16. */
static int k2_value(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }
static int k2_sub(int e) { return 8 * (e / 128) + 2 * (e % 128 / 32) + e % 32 / 16; }

static void ref_q2_K(const kvs_block_q2_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int e = 0; e < KVS_QK_K; e++) {
        const int sc = b->scales[k2_sub(e)];
        const float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
        y[e] = dl * (float)k2_value(b->qs, e) - ml;
    }
}

/* Q3_K's 6-bit scale s (0..15), unbiased (-32..31). */
static int q3_scale(const uint8_t *sc, int s)
{
    const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static void ref_q3_K(const kvs_block_q3_K *b, float *y)
{
    const float d = h2f(b->d);
    for (int e = 0; e < KVS_QK_K; e++) {
        const float dl = d * (float)q3_scale(b->scales, k2_sub(e));
        const int hbit = (b->hmask[e % 32] >> (4 * (e / 128) + e % 128 / 32)) & 1;
        y[e] = dl * (float)(k2_value(b->qs, e) - (hbit ? 0 : 4));
    }
}

/* Q4_K / Q5_K's 6-bit scale and min of sub-block s (0..7). */
static void k4_scale_min(const uint8_t *q, int s, int *sc, int *m)
{
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 15) | (q[s - 4] >> 6) << 4;
        *m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
    }
}

/* Element e = 64 j + 32 half + l of Q4_K / Q5_K: its low 4 bits. */
static int k4_nibble(const uint8_t *qs, int e)
{
    const uint8_t byte = qs[32 * (e / 64) + e % 32];
    return e % 64 < 32 ? byte & 15 : byte >> 4;
}

static void ref_q4_K(const kvs_block_q4_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int e = 0; e < KVS_QK_K; e++) {
        int sc, m;
        k4_scale_min(b->scales, e / 32, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        y[e] = d1 * (float)k4_nibble(b->qs, e) - m1;
    }
}

static void ref_q5_K(const kvs_block_q5_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int e = 0; e < KVS_QK_K; e++) {
        int sc, m;
        k4_scale_min(b->scales, e / 32, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const int high = (b->qh[e % 32] >> (e / 32)) & 1; /* bit 2 j (+1 for the high half) */
        y[e] = d1 * (float)(k4_nibble(b->qs, e) + 16 * high) - m1;
    }
}

static void ref_q6_K(const kvs_block_q6_K *b, float *y)
{
    const float d = h2f(b->d);
    for (int e = 0; e < KVS_QK_K; e++) {
        const int h = e / 128, quarter = e % 128 / 32, l = e % 32;
        const uint8_t lbyte = b->ql[64 * h + 32 * (quarter & 1) + l];
        const int low = quarter < 2 ? lbyte & 15 : lbyte >> 4;
        const int high = (b->qh[32 * h + l] >> (2 * quarter)) & 3;
        const float ds = d * (float)b->scales[e / 16];
        y[e] = ds * (float)((low | high << 4) - 32);
    }
}

void kvs_dequantize_row_ref(kvs_dtype t, const void *src, float *dst, int64_t n)
{
    const size_t bb = kvs_dtype_block_bytes(t), be = kvs_dtype_block_elems(t);
    if (!kvs_deq_type(t) || be == 0)
        return;
    const char *p = src;
    for (int64_t i = 0; i < n / (int64_t)be; i++, p += bb, dst += be) {
        switch ((int)t) {
        case KVS_Q4_1: ref_q4_1((const kvs_block_q4_1 *)p, dst); break;
        case KVS_Q5_0: ref_q5_0((const kvs_block_q5_0 *)p, dst); break;
        case KVS_Q5_1: ref_q5_1((const kvs_block_q5_1 *)p, dst); break;
        case KVS_IQ4_NL: ref_iq4_nl((const kvs_block_iq4_nl *)p, dst); break;
        case KVS_Q2_K: ref_q2_K((const kvs_block_q2_K *)p, dst); break;
        case KVS_Q3_K: ref_q3_K((const kvs_block_q3_K *)p, dst); break;
        case KVS_Q4_K: ref_q4_K((const kvs_block_q4_K *)p, dst); break;
        case KVS_Q5_K: ref_q5_K((const kvs_block_q5_K *)p, dst); break;
        case KVS_Q6_K: ref_q6_K((const kvs_block_q6_K *)p, dst); break;
        }
    }
}
