/* Vectorised (AVX2) dequantisers for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL.
 *
 * Each block's quants are unpacked as bytes in 256-bit registers (nibbles by mask and shift,
 * extra high bits by compare against a bit mask, IQ4_NL's levels by a 16-entry PSHUFB table
 * lookup), widened 8 at a time to int32 and converted to fp32, then scaled with the same fp32
 * operations, in the same order, as the scalar reference (dequant_ref.c): a separate multiply
 * and add / subtract (never FMA), with the per-sub-block scale products computed in scalar code
 * exactly as there. The output is therefore bit-identical to the reference (tests/
 * test_quant_types.c checks every type bit for bit). With AVX-512 the unpacking stays 256-bit
 * and only the widening, conversion, scaling and stores are 16 lanes wide. Without AVX2 the
 * reference itself is used. */
#include "dequant.h"

#include <string.h>

#include "kernels.h"
#include "kernels_internal.h"

#if KVS_AVX2
#include <immintrin.h>

/* F16C's conversion: the same values as kvs_fp16_to_fp32_scalar (exact; NaN made quiet as
 * there), without its branches, which cost as much as a 32-element block's unpacking. */
KVS_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

#if KVS_AVX512
/* With AVX-512: one 16-lane widening, conversion and store per 16 elements (the matrix kernels
 * read the span back with 64-byte loads, which a single 64-byte store forwards to). */
KVS_INLINE __m512 u8x16_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
KVS_INLINE __m512 i8x16_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

KVS_INLINE void emit16_mul_sub(float *y, __m128i q, float d, float m)
{
    _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d), u8x16_ps(q)), _mm512_set1_ps(m)));
}

KVS_INLINE void emit16_mul_add(float *y, __m128i q, float d, float m)
{
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(u8x16_ps(q), _mm512_set1_ps(d)), _mm512_set1_ps(m)));
}

KVS_INLINE void emit16_mul_signed(float *y, __m128i q, float d)
{
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_set1_ps(d), i8x16_ps(q)));
}
#else
/* Widening conversions of 8 bytes (the low 64 bits of v) to 8 floats; only this branch uses
 * them (clang warns about an unused static inline function in a .c file). */
KVS_INLINE __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
KVS_INLINE __m256 i8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* y[0..16) = (d * q) - m for 16 unsigned bytes q. */
KVS_INLINE void emit16_mul_sub(float *y, __m128i q, float d, float m)
{
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(vd, u8_ps(q)), vm));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(vd, u8_ps(_mm_srli_si128(q, 8))), vm));
}

/* y[0..16) = (q * d) + m for 16 unsigned bytes q. */
KVS_INLINE void emit16_mul_add(float *y, __m128i q, float d, float m)
{
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(u8_ps(q), vd), vm));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(u8_ps(_mm_srli_si128(q, 8)), vd), vm));
}

/* y[0..16) = d * q for 16 signed bytes q. */
KVS_INLINE void emit16_mul_signed(float *y, __m128i q, float d)
{
    const __m256 vd = _mm256_set1_ps(d);
    _mm256_storeu_ps(y, _mm256_mul_ps(vd, i8_ps(q)));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(vd, i8_ps(_mm_srli_si128(q, 8))));
}
#endif

KVS_INLINE __m128i lo128(__m256i v) { return _mm256_castsi256_si128(v); }
KVS_INLINE __m128i hi128(__m256i v) { return _mm256_extracti128_si256(v, 1); }

/* Low and high nibbles of 16 bytes. */
KVS_INLINE __m128i nib_lo(__m128i q) { return _mm_and_si128(q, _mm_set1_epi8(15)); }
KVS_INLINE __m128i nib_hi(__m128i q) { return _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(15)); }

/* Bits 16 h .. 16 h + 15 of qh as 16 bytes of 0x10 (bit set) or 0. */
KVS_INLINE __m128i q5_bits(uint32_t qh, int h)
{
    const __m128i sel = h ? _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)
                          : _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, (char)128, 1, 2, 4, 8, 16, 32, 64,
                                      (char)128);
    const __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)qh), sel);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, bit), bit), _mm_set1_epi8(16));
}

static void simd_q8_0(const kvs_block_q8_0 *b, float *y)
{
    const float d = h2f(b->d);
    const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
    emit16_mul_signed(y, lo128(q), d);
    emit16_mul_signed(y + 16, hi128(q), d);
}

static void simd_q4_0(const kvs_block_q4_0 *b, float *y)
{
    const float d = h2f(b->d);
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs), off = _mm_set1_epi8(8);
    /* (q - 8) * d, as d * (q - 8) */
    emit16_mul_signed(y, _mm_sub_epi8(nib_lo(q), off), d);
    emit16_mul_signed(y + 16, _mm_sub_epi8(nib_hi(q), off), d);
}

static void simd_q4_1(const kvs_block_q4_1 *b, float *y)
{
    const float d = h2f(b->d), m = h2f(b->m);
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    emit16_mul_add(y, nib_lo(q), d, m);
    emit16_mul_add(y + 16, nib_hi(q), d, m);
}

static void simd_q5_0(const kvs_block_q5_0 *b, float *y)
{
    const float d = h2f(b->d);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs), off = _mm_set1_epi8(16);
    const __m128i a = _mm_sub_epi8(_mm_or_si128(nib_lo(q), q5_bits(qh, 0)), off);
    const __m128i c = _mm_sub_epi8(_mm_or_si128(nib_hi(q), q5_bits(qh, 1)), off);
    /* (q - 16) * d, as d * (q - 16) */
    emit16_mul_signed(y, a, d);
    emit16_mul_signed(y + 16, c, d);
}

static void simd_q5_1(const kvs_block_q5_1 *b, float *y)
{
    const float d = h2f(b->d), m = h2f(b->m);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    emit16_mul_add(y, _mm_or_si128(nib_lo(q), q5_bits(qh, 0)), d, m);
    emit16_mul_add(y + 16, _mm_or_si128(nib_hi(q), q5_bits(qh, 1)), d, m);
}

static void simd_iq4_nl(const kvs_block_iq4_nl *b, float *y)
{
    const float d = h2f(b->d);
    const __m128i table = _mm_loadu_si128((const __m128i *)kvs_iq4nl_values);
    const __m128i q = _mm_loadu_si128((const __m128i *)b->qs);
    emit16_mul_signed(y, _mm_shuffle_epi8(table, nib_lo(q)), d);
    emit16_mul_signed(y + 16, _mm_shuffle_epi8(table, nib_hi(q)), d);
}

/* Q2_K / Q3_K: the 2-bit values of quarter j of half h, as 32 bytes 0..3. */
KVS_INLINE __m256i k2_quarter(__m256i q, int j)
{
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), _mm256_set1_epi8(3));
}

static void simd_q2_K(const kvs_block_q2_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            const __m256i v = k2_quarter(q, j);
            const int s = 8 * h + 2 * j;
            float *o = y + 128 * h + 32 * j;
            emit16_mul_sub(o, lo128(v), d * (float)(b->scales[s] & 15), dmin * (float)(b->scales[s] >> 4));
            emit16_mul_sub(o + 16, hi128(v), d * (float)(b->scales[s + 1] & 15),
                           dmin * (float)(b->scales[s + 1] >> 4));
        }
    }
}

static void simd_q3_K(const kvs_block_q3_K *b, float *y)
{
    const float d = h2f(b->d);
    int sc[16];
    for (int s = 0; s < 16; s++) {
        const int lo = s < 8 ? b->scales[s] & 15 : b->scales[s - 8] >> 4;
        const int hi = (b->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        sc[s] = (lo | hi << 4) - 32;
    }
    const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask), four = _mm256_set1_epi8(4);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
        for (int j = 0; j < 4; j++) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            const __m256i v = _mm256_sub_epi8(k2_quarter(q, j), _mm256_andnot_si256(set, four));
            const int s = 8 * h + 2 * j;
            float *o = y + 128 * h + 32 * j;
            emit16_mul_signed(o, lo128(v), d * (float)sc[s]);
            emit16_mul_signed(o + 16, hi128(v), d * (float)sc[s + 1]);
        }
    }
}

/* Q4_K / Q5_K's 8 6-bit scales and mins. */
KVS_INLINE void k4_scales(const uint8_t *q, int *sc, int *m)
{
    for (int s = 0; s < 4; s++) {
        sc[s] = q[s] & 63;
        m[s] = q[s + 4] & 63;
    }
    for (int s = 4; s < 8; s++) {
        sc[s] = (q[s + 4] & 15) | (q[s - 4] >> 6) << 4;
        m[s] = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
    }
}

/* Q4_K / Q5_K: 32 elements of sub-block s, unsigned bytes v: (d * sc) * v - dmin * m. */
KVS_INLINE void k4_emit32(float *y, __m256i v, float d, float dmin, int sc, int m)
{
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    emit16_mul_sub(y, lo128(v), d1, m1);
    emit16_mul_sub(y + 16, hi128(v), d1, m1);
}

static void simd_q4_K(const kvs_block_q4_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    int sc[8], m[8];
    k4_scales(b->scales, sc, m);
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
        k4_emit32(y + 64 * j, _mm256_and_si256(q, m4), d, dmin, sc[2 * j], m[2 * j]);
        k4_emit32(y + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4), d, dmin,
                  sc[2 * j + 1], m[2 * j + 1]);
    }
}

static void simd_q5_K(const kvs_block_q5_K *b, float *y)
{
    const float d = h2f(b->d), dmin = h2f(b->dmin);
    int sc[8], m[8];
    k4_scales(b->scales, sc, m);
    const __m256i m4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
    for (int j = 0; j < 4; j++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
        const __m256i u1 = _mm256_set1_epi8((char)(1 << (2 * j)));
        const __m256i u2 = _mm256_set1_epi8((char)(2 << (2 * j)));
        const __m256i h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1), sixteen);
        const __m256i h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2), sixteen);
        k4_emit32(y + 64 * j, _mm256_or_si256(_mm256_and_si256(q, m4), h1), d, dmin, sc[2 * j],
                  m[2 * j]);
        k4_emit32(y + 64 * j + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h2),
                  d, dmin, sc[2 * j + 1], m[2 * j + 1]);
    }
}

static void simd_q6_K(const kvs_block_q6_K *b, float *y)
{
    const float d = h2f(b->d);
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_sub_epi8(q[k], off);
            const int s = 8 * h + 2 * k;
            float *o = y + 128 * h + 32 * k;
            emit16_mul_signed(o, lo128(v), d * (float)b->scales[s]);
            emit16_mul_signed(o + 16, hi128(v), d * (float)b->scales[s + 1]);
        }
    }
}

/* Whole rows of blocks, one function per type (matmul_deq.c calls them per span through
 * kvs_dequantize_fn, without a type switch per call). */
#define KVS_ROW_FN(name, fn, type, elems)                                                       \
    static void name(const void *src, float *dst, int64_t nb)                                   \
    {                                                                                           \
        const type *b = src;                                                                    \
        for (int64_t i = 0; i < nb; i++)                                                        \
            fn(b + i, dst + (size_t)i * (elems));                                               \
    }
KVS_ROW_FN(row_q8_0, simd_q8_0, kvs_block_q8_0, KVS_QK)
KVS_ROW_FN(row_q4_0, simd_q4_0, kvs_block_q4_0, KVS_QK)
KVS_ROW_FN(row_q4_1, simd_q4_1, kvs_block_q4_1, KVS_QK)
KVS_ROW_FN(row_q5_0, simd_q5_0, kvs_block_q5_0, KVS_QK)
KVS_ROW_FN(row_q5_1, simd_q5_1, kvs_block_q5_1, KVS_QK)
KVS_ROW_FN(row_iq4_nl, simd_iq4_nl, kvs_block_iq4_nl, KVS_QK)
KVS_ROW_FN(row_q2_K, simd_q2_K, kvs_block_q2_K, KVS_QK_K)
KVS_ROW_FN(row_q3_K, simd_q3_K, kvs_block_q3_K, KVS_QK_K)
KVS_ROW_FN(row_q4_K, simd_q4_K, kvs_block_q4_K, KVS_QK_K)
KVS_ROW_FN(row_q5_K, simd_q5_K, kvs_block_q5_K, KVS_QK_K)
KVS_ROW_FN(row_q6_K, simd_q6_K, kvs_block_q6_K, KVS_QK_K)
#undef KVS_ROW_FN

kvs_dequant_fn kvs_dequantize_fn(kvs_dtype t)
{
    switch ((int)t) {
    case KVS_Q8_0: return row_q8_0;
    case KVS_Q4_0: return row_q4_0;
    case KVS_Q4_1: return row_q4_1;
    case KVS_Q5_0: return row_q5_0;
    case KVS_Q5_1: return row_q5_1;
    case KVS_IQ4_NL: return row_iq4_nl;
    case KVS_Q2_K: return row_q2_K;
    case KVS_Q3_K: return row_q3_K;
    case KVS_Q4_K: return row_q4_K;
    case KVS_Q5_K: return row_q5_K;
    case KVS_Q6_K: return row_q6_K;
    }
    return NULL;
}

#else /* !KVS_AVX2: the reference, one block per call */

#define KVS_REF_FN(T)                                                                           \
    static void ref_##T(const void *src, float *dst, int64_t nb)                                \
    {                                                                                           \
        kvs_dequantize_row_ref(KVS_##T, src, dst, nb * (int64_t)kvs_dtype_block_elems(KVS_##T)); \
    }
/* Q8_0 and Q4_0's reference is kvs_dequantize_row's own loop (kernels.c). */
static void ref_Q8_0(const void *src, float *dst, int64_t nb) { kvs_dequantize_row(KVS_Q8_0, src, dst, nb * KVS_QK); }
static void ref_Q4_0(const void *src, float *dst, int64_t nb) { kvs_dequantize_row(KVS_Q4_0, src, dst, nb * KVS_QK); }
KVS_REF_FN(Q4_1)
KVS_REF_FN(Q5_0)
KVS_REF_FN(Q5_1)
KVS_REF_FN(IQ4_NL)
KVS_REF_FN(Q2_K)
KVS_REF_FN(Q3_K)
KVS_REF_FN(Q4_K)
KVS_REF_FN(Q5_K)
KVS_REF_FN(Q6_K)
#undef KVS_REF_FN

kvs_dequant_fn kvs_dequantize_fn(kvs_dtype t)
{
    switch ((int)t) {
    case KVS_Q8_0: return ref_Q8_0;
    case KVS_Q4_0: return ref_Q4_0;
    case KVS_Q4_1: return ref_Q4_1;
    case KVS_Q5_0: return ref_Q5_0;
    case KVS_Q5_1: return ref_Q5_1;
    case KVS_IQ4_NL: return ref_IQ4_NL;
    case KVS_Q2_K: return ref_Q2_K;
    case KVS_Q3_K: return ref_Q3_K;
    case KVS_Q4_K: return ref_Q4_K;
    case KVS_Q5_K: return ref_Q5_K;
    case KVS_Q6_K: return ref_Q6_K;
    }
    return NULL;
}

#endif

void kvs_dequantize_row_simd(kvs_dtype t, const void *src, float *dst, int64_t n)
{
    const kvs_dequant_fn fn = kvs_dequantize_fn(t);
    if (fn)
        fn(src, dst, n / (int64_t)kvs_dtype_block_elems(t));
}
