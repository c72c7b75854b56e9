/* KIVI kernels: asymmetric uniform b-bit codes packed little-endian (element d at bit d * b),
 * with fp16 scale and minimum per group, x ~ code * scale + min. The dot and axpy kernels
 * dequantise inside the loop, as the F16 kernels do, so attention never needs a float copy. */
#include <math.h>
#include <string.h>

#include "core/kernels.h"
#include "core/kernels_kivi.h"
#include "kernels_internal.h"

#if KVS_AVX2 || KVS_AVX512
#include <immintrin.h>

/* Eight codes of 2, 4 or 8 bits starting at a byte boundary, as floats. Reads exactly the
 * bits bytes they occupy (never past the row). */
static inline __attribute__((always_inline)) __m256 codes8(const uint8_t *p, int bits)
{
    __m128i c;
    if (bits == 8) {
        uint64_t raw;
        memcpy(&raw, p, 8);
        c = _mm_cvtsi64_si128((long long)raw);
    } else if (bits == 4) {
        uint32_t raw;
        memcpy(&raw, p, 4);
        const __m128i b = _mm_cvtsi32_si128((int)raw), m = _mm_set1_epi8(0x0F);
        c = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    } else { /* 2 */
        uint16_t raw;
        memcpy(&raw, p, 2);
        const __m128i b = _mm_cvtsi32_si128(raw), m = _mm_set1_epi8(3);
        __m128i c0 = _mm_and_si128(b, m), c1 = _mm_and_si128(_mm_srli_epi16(b, 2), m),
                c2 = _mm_and_si128(_mm_srli_epi16(b, 4), m),
                c3 = _mm_and_si128(_mm_srli_epi16(b, 6), m);
        c = _mm_unpacklo_epi16(_mm_unpacklo_epi8(c0, c1), _mm_unpacklo_epi8(c2, c3));
    }
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c));
}

/* The vector body for a constant bits (so that codes8 folds to one unpacking). */
static inline __attribute__((always_inline)) __m256 dot_body(const uint8_t *codes, int bits,
                                                             const float *w, int n, int *dp)
{
    __m256 s = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= n; d += 8)
        s = _mm256_fmadd_ps(codes8(codes + d * bits / 8, bits), _mm256_loadu_ps(w + d), s);
    *dp = d;
    return s;
}

static inline __attribute__((always_inline)) void axpy_body(float *y, const uint8_t *row,
                                                            int bits, int d, int end, float as,
                                                            float am, int *dp)
{
    const __m256 vs = _mm256_set1_ps(as), vm = _mm256_set1_ps(am);
    for (; d + 8 <= end; d += 8)
        _mm256_storeu_ps(y + d, _mm256_add_ps(_mm256_loadu_ps(y + d),
                                              _mm256_fmadd_ps(vs, codes8(row + d * bits / 8, bits), vm)));
    *dp = d;
}

/* 32 codes of 2, 4 or 8 bits starting at a byte boundary, in order, as bytes: codes 0..15 in
 * *lo, 16..31 in *hi. */
static inline __attribute__((always_inline)) void codes32_bytes(const uint8_t *p, int bits,
                                                                __m128i *lo_out, __m128i *hi_out)
{
    __m128i lo, hi;
    if (bits == 8) {
        lo = _mm_loadu_si128((const __m128i *)(const void *)p);
        hi = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
    } else if (bits == 4) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0F);
        const __m128i ev = _mm_and_si128(b, m), od = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        lo = _mm_unpacklo_epi8(ev, od);
        hi = _mm_unpackhi_epi8(ev, od);
    } else { /* 2 */
        uint64_t raw;
        memcpy(&raw, p, 8);
        const __m128i b = _mm_cvtsi64_si128((long long)raw), m = _mm_set1_epi8(3);
        const __m128i c0 = _mm_and_si128(b, m), c1 = _mm_and_si128(_mm_srli_epi16(b, 2), m),
                      c2 = _mm_and_si128(_mm_srli_epi16(b, 4), m),
                      c3 = _mm_and_si128(_mm_srli_epi16(b, 6), m);
        const __m128i x01 = _mm_unpacklo_epi8(c0, c1), x23 = _mm_unpacklo_epi8(c2, c3);
        lo = _mm_unpacklo_epi16(x01, x23);
        hi = _mm_unpackhi_epi16(x01, x23);
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* The same 32 codes as four vectors of 8 floats. */
static inline __attribute__((always_inline)) void codes32(const uint8_t *p, int bits, __m256 out[4])
{
    __m128i lo, hi; /* codes 0..15 and 16..31 as bytes */
    codes32_bytes(p, bits, &lo, &hi);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

#if KVS_AVX512
/* 32 codes as two vectors of 16 (AVX-512: one widening per 16 codes, no lane shuffles). */
static inline __attribute__((always_inline)) void codes32x16(const uint8_t *p, int bits,
                                                              __m512 out[2])
{
    __m128i lo, hi;
    codes32_bytes(p, bits, &lo, &hi);
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
}
#endif

/* A full group of 32 tokens: per channel, the broadcast weight times the 32 tokens' codes. */
static inline __attribute__((always_inline)) void key_scores32(const uint8_t *codes, int hd,
                                                                int bits, const float *qs,
                                                                float bias, float *out)
{
    const size_t step = (size_t)32 * bits / 8;
#if KVS_AVX512
    /* Four channels per iteration into separate sums: the multiply-adds of one channel wait on
     * the previous one's only four channels later (FMA latency, not throughput, bound a single
     * chain). */
    __m512 b0 = _mm512_set1_ps(bias), b1 = b0, b2 = _mm512_setzero_ps(), b3 = b2, b4 = b2,
           b5 = b2, b6 = b2, b7 = b2;
#define KIVI_KSTEP(c, lo, hi)                                                                     \
    do {                                                                                         \
        __m512 x_[2];                                                                            \
        codes32x16(codes + (size_t)(c) * step, bits, x_);                                        \
        const __m512 w_ = _mm512_set1_ps(qs[c]);                                                 \
        lo = _mm512_fmadd_ps(w_, x_[0], lo);                                                     \
        hi = _mm512_fmadd_ps(w_, x_[1], hi);                                                     \
    } while (0)
    int c = 0;
    for (; c + 4 <= hd; c += 4) {
        KIVI_KSTEP(c, b0, b1);
        KIVI_KSTEP(c + 1, b2, b3);
        KIVI_KSTEP(c + 2, b4, b5);
        KIVI_KSTEP(c + 3, b6, b7);
    }
    for (; c < hd; c++)
        KIVI_KSTEP(c, b0, b1);
#undef KIVI_KSTEP
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(b0, b2), _mm512_add_ps(b4, b6)));
    _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_add_ps(b1, b3), _mm512_add_ps(b5, b7)));
#else
    __m256 a0 = _mm256_set1_ps(bias), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < hd; c++) {
        __m256 x[4];
        codes32(codes + (size_t)c * step, bits, x);
        const __m256 w = _mm256_broadcast_ss(qs + c);
        a0 = _mm256_fmadd_ps(w, x[0], a0);
        a1 = _mm256_fmadd_ps(w, x[1], a1);
        a2 = _mm256_fmadd_ps(w, x[2], a2);
        a3 = _mm256_fmadd_ps(w, x[3], a3);
    }
    _mm256_storeu_ps(out, a0);
    _mm256_storeu_ps(out + 8, a1);
    _mm256_storeu_ps(out + 16, a2);
    _mm256_storeu_ps(out + 24, a3);
#endif
}

/* 32 channels [c0, c0 + 32) of n value rows, with y's 32 floats held in registers across the
 * rows: y += sum_t (p[t] * scale_t) * codes_t. For a constant bits. */
static inline __attribute__((always_inline)) void values32(float *y, const uint8_t *rows,
                                                            size_t row_bytes, size_t sm_at,
                                                            const float *p, int n, int c0,
                                                            int bits)
{
    const size_t at = (size_t)c0 * bits / 8;
#if KVS_AVX512
    /* Four rows per iteration into separate sums (as in key_scores32). */
    __m512 b0 = _mm512_loadu_ps(y + c0), b1 = _mm512_loadu_ps(y + c0 + 16),
           b2 = _mm512_setzero_ps(), b3 = b2, b4 = b2, b5 = b2, b6 = b2, b7 = b2;
#define KIVI_VSTEP(t, lo, hi)                                                                     \
    do {                                                                                         \
        const uint8_t *row_ = rows + (size_t)(t) * row_bytes;                                    \
        uint16_t sc_;                                                                            \
        memcpy(&sc_, row_ + sm_at, 2);                                                           \
        const __m512 w_ = _mm512_set1_ps(p[t] * _cvtsh_ss(sc_));                                 \
        __m512 x_[2];                                                                            \
        codes32x16(row_ + at, bits, x_);                                                         \
        lo = _mm512_fmadd_ps(w_, x_[0], lo);                                                     \
        hi = _mm512_fmadd_ps(w_, x_[1], hi);                                                     \
    } while (0)
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        KIVI_VSTEP(t, b0, b1);
        KIVI_VSTEP(t + 1, b2, b3);
        KIVI_VSTEP(t + 2, b4, b5);
        KIVI_VSTEP(t + 3, b6, b7);
    }
    for (; t < n; t++)
        KIVI_VSTEP(t, b0, b1);
#undef KIVI_VSTEP
    _mm512_storeu_ps(y + c0, _mm512_add_ps(_mm512_add_ps(b0, b2), _mm512_add_ps(b4, b6)));
    _mm512_storeu_ps(y + c0 + 16, _mm512_add_ps(_mm512_add_ps(b1, b3), _mm512_add_ps(b5, b7)));
#else
    __m256 a0 = _mm256_loadu_ps(y + c0), a1 = _mm256_loadu_ps(y + c0 + 8),
           a2 = _mm256_loadu_ps(y + c0 + 16), a3 = _mm256_loadu_ps(y + c0 + 24);
    for (int t = 0; t < n; t++) {
        const uint8_t *row = rows + (size_t)t * row_bytes;
        uint16_t sc;
        memcpy(&sc, row + sm_at, 2);
        const __m256 w = _mm256_set1_ps(p[t] * _cvtsh_ss(sc));
        __m256 x[4];
        codes32(row + at, bits, x);
        a0 = _mm256_fmadd_ps(w, x[0], a0);
        a1 = _mm256_fmadd_ps(w, x[1], a1);
        a2 = _mm256_fmadd_ps(w, x[2], a2);
        a3 = _mm256_fmadd_ps(w, x[3], a3);
    }
    _mm256_storeu_ps(y + c0, a0);
    _mm256_storeu_ps(y + c0 + 8, a1);
    _mm256_storeu_ps(y + c0 + 16, a2);
    _mm256_storeu_ps(y + c0 + 24, a3);
#endif
}

/* The m codes of a packed stream starting at a byte boundary, as bytes (u8[i] = code i). */
static void unpack_u8(const uint8_t *codes, int bits, int m, uint8_t *u8)
{
    int i = 0;
    const size_t step = (size_t)32 * bits / 8;
    if (bits == 4) {
        const __m128i mask = _mm_set1_epi8(0x0F);
        for (; i + 32 <= m; i += 32) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(codes + i / 32 * step));
            const __m128i ev = _mm_and_si128(b, mask), od = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
            _mm_storeu_si128((__m128i *)(void *)(u8 + i), _mm_unpacklo_epi8(ev, od));
            _mm_storeu_si128((__m128i *)(void *)(u8 + i + 16), _mm_unpackhi_epi8(ev, od));
        }
    } else if (bits == 2) {
        const __m128i mask = _mm_set1_epi8(3);
        for (; i + 32 <= m; i += 32) {
            uint64_t raw;
            memcpy(&raw, codes + i / 32 * step, 8);
            const __m128i b = _mm_cvtsi64_si128((long long)raw);
            const __m128i c0 = _mm_and_si128(b, mask), c1 = _mm_and_si128(_mm_srli_epi16(b, 2), mask),
                          c2 = _mm_and_si128(_mm_srli_epi16(b, 4), mask),
                          c3 = _mm_and_si128(_mm_srli_epi16(b, 6), mask);
            const __m128i x01 = _mm_unpacklo_epi8(c0, c1), x23 = _mm_unpacklo_epi8(c2, c3);
            _mm_storeu_si128((__m128i *)(void *)(u8 + i), _mm_unpacklo_epi16(x01, x23));
            _mm_storeu_si128((__m128i *)(void *)(u8 + i + 16), _mm_unpackhi_epi16(x01, x23));
        }
    } else if (bits == 8) {
        memcpy(u8, codes, (size_t)m);
        return;
    }
    for (; i < m; i++)
        u8[i] = (uint8_t)kvs_kivi_get(codes, bits, i);
}

/* A group of n <= 64 tokens of any size (one shrunk by eviction, or G != 32): the group's code
 * stream unpacked to bytes once, then per channel the broadcast weight times 8 tokens at a
 * time (lanes past n are computed from the next channel's bytes and dropped). */
static void key_scores_any(const uint8_t *codes, int n, int hd, int bits, const float *qs,
                           float bias, float *out)
{
    uint8_t u8[(size_t)hd * n + 8];
    unpack_u8(codes, bits, hd * n, u8);
    memset(u8 + (size_t)hd * n, 0, 8);
    const int nv = (n + 7) / 8;
    __m256 acc[8];
    for (int v = 0; v < nv; v++)
        acc[v] = _mm256_set1_ps(bias);
    for (int c = 0; c < hd; c++) {
        const __m256 w = _mm256_broadcast_ss(qs + c);
        const uint8_t *row = u8 + (size_t)c * n;
        for (int v = 0; v < nv; v++) {
            uint64_t raw;
            memcpy(&raw, row + 8 * v, 8);
            const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)raw)));
            acc[v] = _mm256_fmadd_ps(w, x, acc[v]);
        }
    }
    float tmp[64];
    for (int v = 0; v < nv; v++)
        _mm256_storeu_ps(tmp + 8 * v, acc[v]);
    memcpy(out, tmp, sizeof(float) * (size_t)n);
}

static float hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#define KIVI_SIMD 1
#else
#define KIVI_SIMD 0
#endif

/* The scale and min of group k of a value row, stored after the codes (maybe unaligned). */
static void row_sm(const uint8_t *row, size_t code_bytes, int k, float *scale, float *mn)
{
    uint16_t sm[2];
    memcpy(sm, row + code_bytes + (size_t)4 * k, sizeof sm);
#if KIVI_SIMD
    *scale = _cvtsh_ss(sm[0]); /* F16C, which the AVX2 F16 kernels use too */
    *mn = _cvtsh_ss(sm[1]);
#else
    *scale = kvs_fp16_to_fp32(sm[0]);
    *mn = kvs_fp16_to_fp32(sm[1]);
#endif
}

int kvs_kivi_get(const uint8_t *codes, int bits, int d)
{
    const int bit = d * bits;
    return (codes[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}

void kvs_kivi_set(uint8_t *codes, int bits, int d, int q)
{
    const int bit = d * bits, mask = ((1 << bits) - 1) << (bit & 7);
    codes[bit >> 3] = (uint8_t)((codes[bit >> 3] & ~mask) | ((q << (bit & 7)) & mask));
}

void kvs_kivi_params(const float *x, int n, int stride, int bits, uint16_t *scale, uint16_t *mn)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        const float v = x[(size_t)i * stride];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    *mn = kvs_fp32_to_fp16(lo);
    *scale = kvs_fp32_to_fp16((hi - lo) / (float)((1 << bits) - 1));
}

int kvs_kivi_code_f(float x, float s, float m, int bits)
{
    const int top = (1 << bits) - 1;
    if (!(s > 0.0f))
        return 0;
    /* roundf (half away from zero) without the library call: exact for the non-negative
     * values that are not clamped to 0 (x - floor(x) is exact below 2^23). */
    const float v = (x - m) / s, f = floorf(v);
    const float q = v - f >= 0.5f ? f + 1.0f : f;
    return q < 0.0f ? 0 : q > (float)top ? top : (int)q;
}

int kvs_kivi_code(float x, uint16_t scale, uint16_t mn, int bits)
{
    /* The code is taken against the stored (fp16-rounded) scale and minimum, so the round trip
     * error is scale/2 plus only what the fp16 rounding of the range costs at the ends. */
    const float s = kvs_fp16_to_fp32(scale), m = kvs_fp16_to_fp32(mn);
    const int top = (1 << bits) - 1;
    if (!(s > 0.0f))
        return 0;
    const float q = roundf((x - m) / s);
    return q < 0.0f ? 0 : q > (float)top ? top : (int)q;
}

float kvs_dot_kivi_codes_ref(const uint8_t *codes, int bits, const float *w, int n)
{
    float acc = 0.0f;
    for (int d = 0; d < n; d++)
        acc += w[d] * (float)kvs_kivi_get(codes, bits, d);
    return acc;
}

float kvs_dot_kivi_codes(const uint8_t *codes, int bits, const float *w, int n)
{
    int d = 0;
    float acc = 0.0f;
#if KIVI_SIMD
    if (bits == 4)
        acc = hsum8(dot_body(codes, 4, w, n, &d));
    else if (bits == 2)
        acc = hsum8(dot_body(codes, 2, w, n, &d));
    else if (bits == 8)
        acc = hsum8(dot_body(codes, 8, w, n, &d));
#endif
    for (; d < n; d++)
        acc += w[d] * (float)kvs_kivi_get(codes, bits, d);
    return acc;
}

size_t kvs_kivi_value_row_bytes(int n, int bits, int group)
{
    const int g = group < n ? group : n;
    return ((size_t)n * bits + 7) / 8 + (size_t)((n + g - 1) / g) * 4;
}

void kvs_kivi_quantize_value_row(const float *x, int n, int bits, int group, uint8_t *row)
{
    const int g = group < n ? group : n;
    const size_t code_bytes = ((size_t)n * bits + 7) / 8;
    memset(row, 0, code_bytes);
    for (int k = 0, c0 = 0; c0 < n; k++, c0 += g) {
        const int len = n - c0 < g ? n - c0 : g;
        uint16_t sm[2];
        kvs_kivi_params(x + c0, len, 1, bits, &sm[0], &sm[1]);
        memcpy(row + code_bytes + (size_t)4 * k, sm, sizeof sm);
        const float sc = kvs_fp16_to_fp32(sm[0]), mn = kvs_fp16_to_fp32(sm[1]);
        for (int d = c0; d < c0 + len; d++)
            kvs_kivi_set(row, bits, d, kvs_kivi_code_f(x[d], sc, mn, bits));
    }
}

void kvs_kivi_dequantize_value_row(const uint8_t *row, int n, int bits, int group, float *out)
{
    const int g = group < n ? group : n;
    const size_t code_bytes = ((size_t)n * bits + 7) / 8;
    for (int k = 0, c0 = 0; c0 < n; k++, c0 += g) {
        const int len = n - c0 < g ? n - c0 : g;
        float sc, mn;
        row_sm(row, code_bytes, k, &sc, &mn);
        for (int d = c0; d < c0 + len; d++)
            out[d] = (float)kvs_kivi_get(row, bits, d) * sc + mn;
    }
}

void kvs_axpy_kivi_value(float *y, float a, const uint8_t *row, int n, int bits, int group)
{
    const int g = group < n ? group : n;
    const size_t code_bytes = ((size_t)n * bits + 7) / 8;
    for (int k = 0, c0 = 0; c0 < n; k++, c0 += g) {
        const int len = n - c0 < g ? n - c0 : g;
        float sc, mn;
        row_sm(row, code_bytes, k, &sc, &mn);
        const float as = a * sc, am = a * mn;
        int d = c0;
#if KIVI_SIMD
        if ((c0 * bits) % 8 == 0) {
            if (bits == 4)
                axpy_body(y, row, 4, d, c0 + len, as, am, &d);
            else if (bits == 2)
                axpy_body(y, row, 2, d, c0 + len, as, am, &d);
            else if (bits == 8)
                axpy_body(y, row, 8, d, c0 + len, as, am, &d);
        }
#endif
        for (; d < c0 + len; d++)
            y[d] += as * (float)kvs_kivi_get(row, bits, d) + am;
    }
}

float kvs_kivi_key_prep(const float *q, const uint16_t *sm, int hd, float *qs)
{
#if KIVI_SIMD
    if (hd % 8 == 0) {
        __m256 b = _mm256_setzero_ps();
        for (int c = 0; c < hd; c += 8) {
            const __m256 vq = _mm256_loadu_ps(q + c);
            const __m256 sc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sm + c)));
            const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(sm + hd + c)));
            _mm256_storeu_ps(qs + c, _mm256_mul_ps(vq, sc));
            b = _mm256_fmadd_ps(vq, mn, b);
        }
        return hsum8(b);
    }
#endif
    float sc[hd], mn[hd];
    kvs_dequantize_row(KVS_F16, sm, sc, hd);
    kvs_dequantize_row(KVS_F16, sm + hd, mn, hd);
    float bias = 0.0f;
    for (int c = 0; c < hd; c++) {
        qs[c] = q[c] * sc[c];
        bias += q[c] * mn[c];
    }
    return bias;
}

float kvs_kivi_key_prep_ref(const float *q, const uint16_t *sm, int hd, float *qs)
{
    float bias = 0.0f;
    for (int c = 0; c < hd; c++) {
        qs[c] = q[c] * kvs_fp16_to_fp32(sm[c]);
        bias += q[c] * kvs_fp16_to_fp32(sm[hd + c]);
    }
    return bias;
}

void kvs_kivi_key_scores_ref(const uint8_t *codes, int n, int hd, int bits, const float *qs,
                             float bias, float *out)
{
    for (int j = 0; j < n; j++) {
        float acc = bias;
        for (int c = 0; c < hd; c++)
            acc += qs[c] * (float)kvs_kivi_get(codes, bits, c * n + j);
        out[j] = acc;
    }
}

void kvs_kivi_key_scores(const uint8_t *codes, int n, int hd, int bits, const float *qs,
                         float bias, float *out)
{
#if KIVI_SIMD
    if (n == 32) {
        if (bits == 4)
            key_scores32(codes, hd, 4, qs, bias, out);
        else if (bits == 2)
            key_scores32(codes, hd, 2, qs, bias, out);
        else if (bits == 8)
            key_scores32(codes, hd, 8, qs, bias, out);
        else
            key_scores_any(codes, n, hd, bits, qs, bias, out);
        return;
    }
    if (n <= 64) {
        key_scores_any(codes, n, hd, bits, qs, bias, out);
        return;
    }
#endif
    /* A group shrunk by eviction (or another G): channel by channel, so that the codes are
     * still read in order. */
    for (int j = 0; j < n; j++)
        out[j] = bias;
    for (int c = 0; c < hd; c++) {
        const float w = qs[c];
        for (int j = 0; j < n; j++)
            out[j] += w * (float)kvs_kivi_get(codes, bits, c * n + j);
    }
}

void kvs_kivi_value_acc_ref(float *y, float *msum, const uint8_t *row, float p, int hd,
                            int bits, int group)
{
    const int g = group < hd ? group : hd;
    const size_t code_bytes = ((size_t)hd * bits + 7) / 8;
    for (int k = 0, c0 = 0; c0 < hd; k++, c0 += g) {
        const int len = hd - c0 < g ? hd - c0 : g;
        float sc, mn;
        row_sm(row, code_bytes, k, &sc, &mn);
        msum[k] += p * mn;
        for (int d = c0; d < c0 + len; d++)
            y[d] += p * sc * (float)kvs_kivi_get(row, bits, d);
    }
}

void kvs_kivi_value_acc(float *y, float *msum, const uint8_t *row, float p, int hd, int bits,
                        int group)
{
    const int g = group < hd ? group : hd;
    const size_t code_bytes = ((size_t)hd * bits + 7) / 8;
    for (int k = 0, c0 = 0; c0 < hd; k++, c0 += g) {
        const int len = hd - c0 < g ? hd - c0 : g;
        float sc, mn;
        row_sm(row, code_bytes, k, &sc, &mn);
        msum[k] += p * mn;
        const float as = p * sc;
        int d = c0;
#if KIVI_SIMD
        if ((c0 * bits) % 8 == 0 && (bits == 2 || bits == 4 || bits == 8)) {
            const __m256 va = _mm256_set1_ps(as);
            for (; d + 32 <= c0 + len; d += 32) {
                __m256 x[4];
                codes32(row + (size_t)d * bits / 8, bits, x);
                for (int i = 0; i < 4; i++)
                    _mm256_storeu_ps(y + d + 8 * i,
                                     _mm256_fmadd_ps(va, x[i], _mm256_loadu_ps(y + d + 8 * i)));
            }
            for (; d + 8 <= c0 + len; d += 8) {
                const __m256 x = bits == 4   ? codes8(row + (size_t)d * 4 / 8, 4)
                                 : bits == 2 ? codes8(row + (size_t)d * 2 / 8, 2)
                                             : codes8(row + d, 8);
                _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, x, _mm256_loadu_ps(y + d)));
            }
        }
#endif
        for (; d < c0 + len; d++)
            y[d] += as * (float)kvs_kivi_get(row, bits, d);
    }
}

void kvs_kivi_value_finish(float *y, const float *msum, int hd, int group)
{
    const int g = group < hd ? group : hd;
    for (int d = 0; d < hd; d++)
        y[d] += msum[d / g];
}

void kvs_kivi_value_rows_ref(float *y, float *msum, const uint8_t *rows, size_t row_bytes,
                             const float *p, int n, int hd, int bits, int group)
{
    for (int t = 0; t < n; t++)
        kvs_kivi_value_acc_ref(y, msum, rows + (size_t)t * row_bytes, p[t], hd, bits, group);
}

void kvs_kivi_value_rows(float *y, float *msum, const uint8_t *rows, size_t row_bytes,
                         const float *p, int n, int hd, int bits, int group)
{
#if KIVI_SIMD
    const int g = group < hd ? group : hd;
    /* Whole groups of 32-channel blocks: each block runs down every row with its 32 sums in
     * registers (rows are a few dozen bytes: the block's second pass finds them in cache). */
    if (g % 32 == 0 && hd % g == 0 && (bits == 2 || bits == 4 || bits == 8)) {
        const size_t code_bytes = (size_t)hd * bits / 8;
        for (int c0 = 0; c0 < hd; c0 += 32) {
            const size_t sm_at = code_bytes + (size_t)4 * (c0 / g);
            if (bits == 4)
                values32(y, rows, row_bytes, sm_at, p, n, c0, 4);
            else if (bits == 2)
                values32(y, rows, row_bytes, sm_at, p, n, c0, 2);
            else
                values32(y, rows, row_bytes, sm_at, p, n, c0, 8);
        }
        /* The minima: per group a dot product of p with the rows' minima, in four partial
         * sums (one running sum would wait on the multiply-add latency every row). */
        for (int k = 0; k < hd / g; k++) {
            const uint8_t *mp = rows + code_bytes + (size_t)4 * k + 2;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* (named: an array stays in memory) */
            uint16_t m0, m1, m2, m3;
            int t = 0;
            for (; t + 4 <= n; t += 4) {
                const uint8_t *r = mp + (size_t)t * row_bytes;
                memcpy(&m0, r, 2);
                memcpy(&m1, r + row_bytes, 2);
                memcpy(&m2, r + 2 * row_bytes, 2);
                memcpy(&m3, r + 3 * row_bytes, 2);
                s0 += p[t] * _cvtsh_ss(m0);
                s1 += p[t + 1] * _cvtsh_ss(m1);
                s2 += p[t + 2] * _cvtsh_ss(m2);
                s3 += p[t + 3] * _cvtsh_ss(m3);
            }
            for (; t < n; t++) {
                memcpy(&m0, mp + (size_t)t * row_bytes, 2);
                s0 += p[t] * _cvtsh_ss(m0);
            }
            msum[k] += (s0 + s1) + (s2 + s3);
        }
        return;
    }
#endif
    for (int t = 0; t < n; t++)
        kvs_kivi_value_acc(y, msum, rows + (size_t)t * row_bytes, p[t], hd, bits, group);
}
