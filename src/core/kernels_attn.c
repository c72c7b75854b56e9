/* Decode attention's two passes over a head's F16 slots: the scaled scores of every key row
 * against one query, and the probability-weighted sum of the value rows.
 *
 * Decode reads every slot once per token, so these run at the rate the slots stream from DRAM.
 * The per-row kernels (kvs_dot_f16_f32, kvs_axpy_f16), called once per 128-byte row at head
 * size 64, kept the output in memory (a load and a store of it per value row) and left the
 * stream to the hardware prefetcher alone; here, for head sizes of 16 * NV (NV = 4 or 8: heads
 * of 64 and 128) the query or the output lives in NV registers for the whole pass and the rows
 * are prefetched KVS_PREFETCH_BYTES ahead when they are contiguous. Other head sizes, other
 * ISAs and selected (non-contiguous) rows use the per-row kernels, which are the reference. */
#include "kernels.h"

#include "kernels_internal.h"

#if KVS_AVX512
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
#endif
    for (int i = 0; i < hd; i++)
        out[i] = 0.0f;
    for (int j = 0; j < n; j++)
        kvs_axpy_f16(out, p[j], row_at(rows, sel, j, hd), hd);
}
