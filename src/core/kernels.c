/* Type conversions, (de)quantisation, the scalar matmul reference and the per-vector ops.
 * kvs_matmul itself lives in kernels_matmul.c. */
#include "kernels.h"

#include <math.h>
#include <stdlib.h>

#include "dequant.h"
#include "kernels_internal.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

float kvs_fp16_to_fp32(uint16_t h) { return kvs_fp16_to_fp32_scalar(h); }
uint16_t kvs_fp32_to_fp16(float f) { return kvs_fp32_to_fp16_scalar(f); }
float kvs_bf16_to_fp32(uint16_t h) { return kvs_bf16_to_fp32_scalar(h); }
uint16_t kvs_fp32_to_bf16(float f) { return kvs_fp32_to_bf16_scalar(f); }

/* ------------------------------------------------------------------------------------------ */
/* Row conversions                                                                            */

static void quantize_q8_0(const float *x, kvs_block_q8_0 *y, int64_t n)
{
    for (int64_t b = 0; b < n / KVS_QK; b++) {
        const float *xb = x + b * KVS_QK;
        float amax = 0.0f;
        for (int j = 0; j < KVS_QK; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = kvs_fp32_to_fp16_scalar(d);
        for (int j = 0; j < KVS_QK; j++)
            y[b].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

static void quantize_q4_0(const float *x, kvs_block_q4_0 *y, int64_t n)
{
    for (int64_t b = 0; b < n / KVS_QK; b++) {
        const float *xb = x + b * KVS_QK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < KVS_QK; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = kvs_fp32_to_fp16_scalar(d);
        for (int j = 0; j < KVS_QK / 2; j++) {
            const float x0 = xb[j] * id, x1 = xb[j + KVS_QK / 2] * id;
            int q0 = (int8_t)(x0 + 8.5f), q1 = (int8_t)(x1 + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void fp16_to_fp32_row(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
#if KVS_AVX512
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#elif KVS_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++)
        dst[i] = kvs_fp16_to_fp32_scalar(src[i]);
}

void kvs_dequantize_row(kvs_dtype t, const void *src, float *dst, int64_t n)
{
    switch (t) {
    case KVS_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case KVS_F16:
        fp16_to_fp32_row(src, dst, n);
        break;
    case KVS_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = kvs_bf16_to_fp32_scalar(s[i]);
        break;
    }
    case KVS_Q8_0: {
        const kvs_block_q8_0 *b = src;
        for (int64_t i = 0; i < n / KVS_QK; i++) {
            const float d = kvs_fp16_to_fp32_scalar(b[i].d);
            for (int j = 0; j < KVS_QK; j++)
                dst[i * KVS_QK + j] = d * (float)b[i].qs[j];
        }
        break;
    }
    case KVS_Q4_0: {
        const kvs_block_q4_0 *b = src;
        for (int64_t i = 0; i < n / KVS_QK; i++) {
            const float d = kvs_fp16_to_fp32_scalar(b[i].d);
            for (int j = 0; j < KVS_QK / 2; j++) {
                dst[i * KVS_QK + j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
                dst[i * KVS_QK + j + KVS_QK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    default: /* Q4_1, Q5_0, Q5_1, the K-quants, IQ4_NL (dequant.h) */
        kvs_dequantize_row_simd(t, src, dst, n);
        break;
    }
}

/* F16C's conversion (round to nearest even, NaN made quiet: what kvs_fp32_to_fp16_scalar
 * gives, bit for bit); the KV store converts every new key and value row with it. */
static void fp32_to_fp16_row(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
#if KVS_AVX512
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif KVS_AVX2
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        dst[i] = kvs_fp32_to_fp16_scalar(src[i]);
}

void kvs_quantize_row(kvs_dtype t, const float *src, void *dst, int64_t n)
{
    switch (t) {
    case KVS_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case KVS_F16:
        fp32_to_fp16_row(src, dst, n);
        break;
    case KVS_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = kvs_fp32_to_bf16_scalar(src[i]);
        break;
    }
    case KVS_Q8_0:
        quantize_q8_0(src, dst, n);
        break;
    case KVS_Q4_0:
        quantize_q4_0(src, dst, n);
        break;
    case KVS_Q4_K: case KVS_Q5_K: case KVS_Q6_K:
        kvs_quantize_row_kq(t, src, dst, n);
        break;
    default: /* no quantiser for the types kvslim only reads (see kernels.h) */
        abort();
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Scalar matmul reference                                                                    */

void kvs_matmul_ref(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows, int n_in,
                    int n_out)
{
    uint64_t row_bytes = 0;
    if (n_rows <= 0 || n_out <= 0 || kvs_dtype_bytes(wt, (uint64_t)n_in, &row_bytes) != 0)
        return;
    float *wrow = malloc((size_t)(n_in > 0 ? n_in : 1) * sizeof(float));
    if (!wrow)
        abort();
    for (int o = 0; o < n_out; o++) {
        kvs_dequantize_row(wt, (const char *)w + (size_t)o * row_bytes, wrow, n_in);
        for (int r = 0; r < n_rows; r++) {
            const float *xr = x + (size_t)r * n_in;
            double s = 0.0;
            for (int i = 0; i < n_in; i++)
                s += (double)xr[i] * (double)wrow[i];
            y[(size_t)r * n_out + o] = (float)s;
        }
    }
    free(wrow);
}

/* ------------------------------------------------------------------------------------------ */
/* Vector exp (AVX-512): exp(x) = 2^n * p(r), r = x - n ln2, |r| <= ln2/2, degree-7 Taylor
 * polynomial (relative error < 1e-8 before rounding, ~1-2 ulp overall). scalef handles overflow
 * to inf and gradual underflow; the clamp keeps -inf inputs from producing NaN. */

#if KVS_AVX512
static inline __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x); /* operand order propagates NaN */
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#if KVS_AVX2 && !KVS_AVX512
/* The same exp with AVX2 (no scalef): 2^n applied as two factors 2^(n >> 1) and 2^(n - (n >> 1)),
 * each a normal float for the clamped range (|n| <= 231), so overflow still gives inf and the
 * products underflow gradually. */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-160.0f), x); /* operand order propagates NaN */
    x = _mm256_min_ps(_mm256_set1_ps(100.0f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1), bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* Per-vector ops                                                                             */

float kvs_dot_f32(const float *a, const float *b, int n)
{
    int i = 0;
    float s = 0.0f;
#if KVS_AVX512
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        i += 16;
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
        i = n;
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#elif KVS_AVX2
    /* 4 FMA chains: with 2 their latency was about the time an F32 weight row's bytes take in
     * decode (bench_matmul's F32 decode from cache, one thread: 47-50 GB/s with 2, 73-79 with
     * 4; from memory 22-26 and 25-28 GB/s). No software prefetch: 2-16 KiB ahead streamed
     * slower (20.4-24.7 GB/s against 28.4-28.5). */
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
           s3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#else
    float p[4] = {0, 0, 0, 0};
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            p[j] += a[i + j] * b[i + j];
    s = (p[0] + p[1]) + (p[2] + p[3]);
#endif
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void kvs_transpose_f32(float *dst, size_t ld, const float *src, int rows, int cols)
{
    int r = 0;
#if KVS_AVX2
    /* 8 x 8 blocks by register transposition; the edges below element by element */
    for (; r + 8 <= rows; r += 8)
        for (int c = 0; c + 8 <= cols; c += 8) {
            __m256i in[8], tr[8];
            for (int t = 0; t < 8; t++)
                in[t] = _mm256_castps_si256(_mm256_loadu_ps(src + (size_t)(r + t) * cols + c));
            kvs_transpose8_avx2(in, tr);
            for (int t = 0; t < 8; t++)
                _mm256_storeu_ps(dst + (size_t)(c + t) * ld + r, _mm256_castsi256_ps(tr[t]));
        }
    for (int rr = 0; rr < r; rr++) /* the columns past the last whole 8 of the block rows */
        for (int c = cols & ~7; c < cols; c++)
            dst[(size_t)c * ld + rr] = src[(size_t)rr * cols + c];
#endif
    for (; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * ld + r] = src[(size_t)r * cols + c];
}

void kvs_axpy_f32(float *y, float a, const float *x, int n)
{
    int i = 0;
#if KVS_AVX512
    const __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i),
                                              _mm512_maskz_loadu_ps(m, y + i)));
        i = n;
    }
#elif KVS_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += a * x[i];
}

float kvs_dot_f16_f32(const uint16_t *a, const float *b, int n)
{
    int i = 0;
    float s = 0.0f;
#if KVS_AVX512
    __m512 s0 = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(a + i))),
                             _mm512_loadu_ps(b + i), s0);
    s = _mm512_reduce_add_ps(s0);
#elif KVS_AVX2
    __m256 s0 = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                             _mm256_loadu_ps(b + i), s0);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++)
        s += kvs_fp16_to_fp32_scalar(a[i]) * b[i];
    return s;
}

void kvs_axpy_f16(float *y, float a, const uint16_t *x, int n)
{
    int i = 0;
#if KVS_AVX512
    const __m512 va = _mm512_set1_ps(a);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(va,
                                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))),
                                         _mm512_loadu_ps(y + i)));
#elif KVS_AVX2
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                         _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; i++)
        y[i] += a * kvs_fp16_to_fp32_scalar(x[i]);
}

void kvs_rmsnorm(float *o, const float *x, const float *w, int n, float eps)
{
    float ss;
#if KVS_AVX512
    {
        int i = 0;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (; i + 32 <= n; i += 32) {
            const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
            s0 = _mm512_fmadd_ps(a, a, s0);
            s1 = _mm512_fmadd_ps(b, b, s1);
        }
        for (; i < n; i += 16) {
            const int left = n - i;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            const __m512 a = _mm512_maskz_loadu_ps(m, x + i);
            s0 = _mm512_fmadd_ps(a, a, s0);
        }
        ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
#else
    {
        double s = 0.0;
        for (int i = 0; i < n; i++)
            s += (double)x[i] * (double)x[i];
        ss = (float)s;
    }
#endif
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    int i = 0;
#if KVS_AVX512
    const __m512 vs = _mm512_set1_ps(scale);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i,
                         _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), _mm512_loadu_ps(w + i)));
#endif
    for (; i < n; i++)
        o[i] = (x[i] * scale) * w[i];
}

void kvs_softmax(float *x, int n)
{
    if (n <= 0)
        return;
    float max = x[0];
    int i = 0;
#if KVS_AVX512
    if (n >= 16) {
        __m512 vm = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16)
            vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + i));
        max = _mm512_reduce_max_ps(vm);
    }
#elif KVS_AVX2
    if (n >= 8) {
        __m256 vm = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8)
            vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        max = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
#endif
    for (; i < n; i++)
        max = x[i] > max ? x[i] : max;

    float sum = 0.0f;
    i = 0;
#if KVS_AVX512
    {
        const __m512 vmax = _mm512_set1_ps(max);
        __m512 vsum = _mm512_setzero_ps();
        for (; i < n; i += 16) {
            const int left = n - i;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax));
            _mm512_mask_storeu_ps(x + i, m, e);
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
        }
        sum = _mm512_reduce_add_ps(vsum);
    }
#elif KVS_AVX2
    {
        const __m256 vmax = _mm256_set1_ps(max);
        __m256 vsum = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
            _mm256_storeu_ps(x + i, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        sum = kvs_hsum256(vsum);
    }
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = 1.0f / sum;
    i = 0;
#if KVS_AVX512
    const __m512 vinv = _mm512_set1_ps(inv);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv));
#elif KVS_AVX2
    const __m256 vinv = _mm256_set1_ps(inv);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
#endif
    for (; i < n; i++)
        x[i] *= inv;
}

int kvs_abs_below(const float *x, size_t n, float limit)
{
    size_t i = 0;
#if KVS_AVX512
    const __m512 lim = _mm512_set1_ps(limit);
    __mmask16 ok = 0xffff;
    for (; i + 16 <= n; i += 16) /* ordered compare: false for NaN */
        ok &= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + i)), lim, _CMP_LT_OQ);
    if (ok != 0xffff)
        return 0;
#endif
    for (; i < n; i++)
        if (!(fabsf(x[i]) < limit))
            return 0;
    return 1;
}

void kvs_swiglu(float *a, const float *b, int n)
{
    int i = 0;
#if KVS_AVX512
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i < n; i += 16) {
        const int left = n - i;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        const __m512 va = _mm512_maskz_loadu_ps(m, a + i);
        const __m512 vb = _mm512_maskz_loadu_ps(m, b + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), va));
        const __m512 silu = _mm512_div_ps(va, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(silu, vb));
    }
#elif KVS_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), va));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(va, _mm256_add_ps(one, e)), vb));
    }
#endif
    for (; i < n; i++) {
        const float v = a[i];
        a[i] = v / (1.0f + expf(-v)) * b[i];
    }
}

/* cos/sin of the RoPE angles of pairs [p0, p0 + np) at position pos, exactly as kvs_rope
 * computes them (in float, as llama2.c does), so that kvs_rope_move reproduces them. */
static void rope_cos_sin(int pos, int p0, int np, int rot_dim, float base, float *cs, float *sn)
{
    for (int p = 0; p < np; p++) {
        const float freq = 1.0f / powf(base, (float)(2 * (p0 + p)) / (float)rot_dim);
        const float val = (float)pos * freq;
#if defined(_GNU_SOURCE) && defined(__GLIBC__)
        sincosf(val, &sn[p], &cs[p]); /* same results as sinf/cosf in glibc, one call */
#else
        cs[p] = cosf(val);
        sn[p] = sinf(val);
#endif
    }
}

enum { ROPE_CHUNK = 128 };

void kvs_rope_angles(int pos, int rot_dim, float base, float *cs, float *sn)
{
    rope_cos_sin(pos, 0, rot_dim / 2, rot_dim, base, cs, sn);
}

/* Turns pairs [p0, p0 + np) of each head by cs / sn (indexed from p0). The vector paths do the
 * scalar loop's operations (two products, then their difference or sum, no fused multiply-add),
 * so every result has the same bits. The scalar loop names its products in statements of their
 * own: a compiler that contracts within an expression (clang's default) would otherwise fuse
 * one product into the sum. */
static void rope_turn(float *vec, int n_heads, int head_dim, int rot_dim, int p0, int np,
                      const float *cs, const float *sn, int neox)
{
    const int n_pairs = rot_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        int p = 0;
#if KVS_AVX512
        if (neox) { /* pairs (i, i + n_pairs): 16 pairs from two runs of 16 */
            for (; p + 16 <= np; p += 16) {
                float *x0 = v + p0 + p, *x1 = x0 + n_pairs;
                const __m512 a = _mm512_loadu_ps(x0), b = _mm512_loadu_ps(x1);
                const __m512 c = _mm512_loadu_ps(cs + p), sv = _mm512_loadu_ps(sn + p);
                _mm512_storeu_ps(x0, _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, sv)));
                _mm512_storeu_ps(x1, _mm512_add_ps(_mm512_mul_ps(a, sv), _mm512_mul_ps(b, c)));
            }
        } else { /* adjacent pairs: 8 pairs per vector, each cos / sin on both its lanes */
            const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            for (; p + 8 <= np; p += 8) {
                float *x = v + 2 * (p0 + p);
                const __m512 ab = _mm512_loadu_ps(x);
                const __m512 c = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(cs + p)));
                const __m512 sv = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(sn + p)));
                /* lane 2i: a c - b s; lane 2i + 1: b c + a s */
                const __m512 P = _mm512_mul_ps(ab, c), Q = _mm512_mul_ps(_mm512_permute_ps(ab, 0xB1), sv);
                _mm512_storeu_ps(x, _mm512_mask_sub_ps(_mm512_add_ps(P, Q), 0x5555, P, Q));
            }
        }
#endif
        for (; p < np; p++) {
            const int i0 = neox ? p0 + p : 2 * (p0 + p);
            const int i1 = neox ? p0 + p + n_pairs : i0 + 1;
            const float a = v[i0], b = v[i1];
            const float ac = a * cs[p], bs = b * sn[p], as = a * sn[p], bc = b * cs[p];
            v[i0] = ac - bs;
            v[i1] = as + bc;
        }
    }
}

void kvs_rope_apply(float *vec, int n_heads, int head_dim, int rot_dim, const float *cs,
                    const float *sn, int neox)
{
    rope_turn(vec, n_heads, head_dim, rot_dim, 0, rot_dim / 2, cs, sn, neox);
}

void kvs_rope(float *vec, int n_heads, int head_dim, int rot_dim, int pos, float base, int neox)
{
    /* cos/sin per pair are shared by all heads. */
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    const int n_pairs = rot_dim / 2;
    for (int p0 = 0; p0 < n_pairs; p0 += ROPE_CHUNK) {
        const int np = n_pairs - p0 < ROPE_CHUNK ? n_pairs - p0 : ROPE_CHUNK;
        rope_cos_sin(pos, p0, np, rot_dim, base, cs, sn);
        rope_turn(vec, n_heads, head_dim, rot_dim, p0, np, cs, sn, neox);
    }
}

void kvs_rope_move(float *vec, int n_heads, int head_dim, int rot_dim, int from, int to,
                   float base, int neox)
{
    if (from == to)
        return;
    /* Undo the rotation kvs_rope applied at `from` (its transpose, with the very cos/sin it
     * used), then apply kvs_rope's rotation at `to`: the result equals kvs_rope at `to` of the
     * unrotated vector to a few float roundings, whatever the positions' size (one rotation by
     * (to - from) * theta would instead carry the float rounding of both angles). */
    float cf[ROPE_CHUNK], sf[ROPE_CHUNK], ct[ROPE_CHUNK], st[ROPE_CHUNK];
    const int n_pairs = rot_dim / 2;
    for (int p0 = 0; p0 < n_pairs; p0 += ROPE_CHUNK) {
        const int np = n_pairs - p0 < ROPE_CHUNK ? n_pairs - p0 : ROPE_CHUNK;
        rope_cos_sin(from, p0, np, rot_dim, base, cf, sf);
        rope_cos_sin(to, p0, np, rot_dim, base, ct, st);
        for (int h = 0; h < n_heads; h++) {
            float *v = vec + (size_t)h * head_dim;
            for (int p = 0; p < np; p++) {
                const int i0 = neox ? p0 + p : 2 * (p0 + p);
                const int i1 = neox ? p0 + p + n_pairs : i0 + 1;
                const float a = v[i0] * cf[p] + v[i1] * sf[p];
                const float b = v[i1] * cf[p] - v[i0] * sf[p];
                v[i0] = a * ct[p] - b * st[p];
                v[i1] = a * st[p] + b * ct[p];
            }
        }
    }
}
