/* Decode attention's two passes over a head's F16 slots: the scaled scores of every key row
 * against one query, and the probability-weighted sum of the value rows.
 *
 * Decode reads every slot once per token, so these run at the rate the slots stream from DRAM.
 * The per-row kernels (kvs_dot_f16_f32, kvs_axpy_f16), called once per 128-byte row at head
 * size 64, kept the output in memory (a load and a store of it per value row) and left the
 * stream to the hardware prefetcher alone; here, for heads of 64 and 128, the query or the
 * output stays in registers for the whole pass (AVX-512: 4 or 8 zmm; AVX2: the scores of 8 rows
 * at a time, the output 64 columns per pass) and contiguous rows are prefetched
 * KVS_PREFETCH_BYTES ahead. Other head sizes and ISAs without AVX2 use the per-row kernels,
 * which are the reference; AVX-512 also takes them for selected (non-contiguous) rows. */
#include "kernels.h"

#include "kernels_internal.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

static const uint16_t *row_at(const uint16_t *rows, const int *sel, int j, int hd)
{
    return rows + (size_t)(sel ? sel[j] : j) * (size_t)hd;
}

#if KVS_AVX512
/* 16 fp16 at p as fp32. */
KVS_INLINE __m512 f16x16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

KVS_INLINE void dot_rows_nv(int NV, float *scores, const uint16_t *rows, const int *sel, int n,
                            const float *q, float scale)
{
    const int hd = 16 * NV;
    __m512 qv[8];
    KVS_UNROLL
    for (int c = 0; c < NV; c++)
        qv[c] = _mm512_loadu_ps(q + 16 * c);
    for (int j = 0; j < n; j++) {
        const uint16_t *r = row_at(rows, sel, j, hd);
        if (!sel)
            KVS_PREFETCH_AHEAD(r, 2 * hd - 1);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        KVS_UNROLL
        for (int c = 0; c < NV; c += 2) {
            a0 = _mm512_fmadd_ps(f16x16(r + 16 * c), qv[c], a0);
            a1 = _mm512_fmadd_ps(f16x16(r + 16 * c + 16), qv[c + 1], a1);
        }
        scores[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * scale;
    }
}

KVS_INLINE void weighted_rows_nv(int NV, float *out, const float *p, const uint16_t *rows,
                                 const int *sel, int n)
{
    const int hd = 16 * NV;
    __m512 o[8];
    KVS_UNROLL
    for (int c = 0; c < NV; c++)
        o[c] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const uint16_t *r = row_at(rows, sel, j, hd);
        if (!sel)
            KVS_PREFETCH_AHEAD(r, 2 * hd - 1);
        const __m512 w = _mm512_set1_ps(p[j]);
        KVS_UNROLL
        for (int c = 0; c < NV; c++)
            o[c] = _mm512_fmadd_ps(w, f16x16(r + 16 * c), o[c]);
    }
    KVS_UNROLL
    for (int c = 0; c < NV; c++)
        _mm512_storeu_ps(out + 16 * c, o[c]);
}
#elif KVS_AVX2
/* 8 fp16 at p as fp32. */
KVS_INLINE __m256 f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* AVX2 (16 registers): the scores of 8 rows at a time, 8 interleaved FMA chains over the head's
 * NV chunks of 8 (q read from L1), the 8 sums gathered into one vector by a tree of horizontal
 * adds; a one-row-at-a-time dot reduced each row by itself (8.5 GB/s in bench_attn_pages on
 * Zen 4). The rows past the last 8 take the per-row kernel. */
static void dot_rows_avx2(int NV, float *scores, const uint16_t *rows, const int *sel, int n,
                          const float *q, float scale)
{
    const int hd = 8 * NV;
    const __m256 vscale = _mm256_set1_ps(scale);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const uint16_t *r[8];
        KVS_UNROLL
        for (int s = 0; s < 8; s++)
            r[s] = row_at(rows, sel, j + s, hd);
        if (!sel)
            KVS_PREFETCH_AHEAD(r[0], 16 * hd - 1);
        __m256 a[8];
        KVS_UNROLL
        for (int s = 0; s < 8; s++)
            a[s] = _mm256_setzero_ps();
        for (int c = 0; c < NV; c++) {
            const __m256 qc = _mm256_loadu_ps(q + 8 * c);
            KVS_UNROLL
            for (int s = 0; s < 8; s++)
                a[s] = _mm256_fmadd_ps(f16x8(r[s] + 8 * c), qc, a[s]);
        }
        /* hadd pairs twice: per 128-bit half, lane s holds half of row s's sum */
        const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                         _mm256_permute2f128_ps(u0, u1, 0x31));
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sum, vscale));
    }
    for (; j < n; j++)
        scores[j] = kvs_dot_f16_f32(row_at(rows, sel, j, hd), q, hd) * scale;
}

/* The weighted sum of columns [off, off + 64) of the rows (hd apart) into out[off..]: 8
 * accumulators for the whole pass (a head of 128 takes two passes, one per half: 16
 * accumulators would leave no register for the rows). */
static void weighted_rows_avx2(float *out, const float *p, const uint16_t *rows, const int *sel,
                               int n, int hd, int off)
{
    __m256 o[8];
    KVS_UNROLL
    for (int c = 0; c < 8; c++)
        o[c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const uint16_t *r = row_at(rows, sel, j, hd) + off;
        if (!sel)
            KVS_PREFETCH_AHEAD(r, 127);
        const __m256 w = _mm256_set1_ps(p[j]);
        KVS_UNROLL
        for (int c = 0; c < 8; c++)
            o[c] = _mm256_fmadd_ps(w, f16x8(r + 8 * c), o[c]);
    }
    KVS_UNROLL
    for (int c = 0; c < 8; c++)
        _mm256_storeu_ps(out + off + 8 * c, o[c]);
}
#endif

void kvs_dot_rows_f16(float *scores, const uint16_t *rows, const int *sel, int n, int hd,
                      const float *q, float scale)
{
#if KVS_AVX512
    if (hd == 64) {
        dot_rows_nv(4, scores, rows, sel, n, q, scale);
        return;
    }
    if (hd == 128) {
        dot_rows_nv(8, scores, rows, sel, n, q, scale);
        return;
    }
#elif KVS_AVX2
    if (hd == 64 || hd == 128) {
        dot_rows_avx2(hd / 8, scores, rows, sel, n, q, scale);
        return;
    }
#endif
    for (int j = 0; j < n; j++)
        scores[j] = kvs_dot_f16_f32(row_at(rows, sel, j, hd), q, hd) * scale;
}

void kvs_weighted_rows_f16(float *out, const float *p, const uint16_t *rows, const int *sel,
                           int n, int hd)
{
#if KVS_AVX512
    if (hd == 64) {
        weighted_rows_nv(4, out, p, rows, sel, n);
        return;
    }
    if (hd == 128) {
        weighted_rows_nv(8, out, p, rows, sel, n);
        return;
    }
#elif KVS_AVX2
    if (hd == 64 || hd == 128) {
        for (int off = 0; off < hd; off += 64)
            weighted_rows_avx2(out, p, rows, sel, n, hd, off);
        return;
    }
#endif
    for (int i = 0; i < hd; i++)
        out[i] = 0.0f;
    for (int j = 0; j < n; j++)
        kvs_axpy_f16(out, p[j], row_at(rows, sel, j, hd), hd);
}
