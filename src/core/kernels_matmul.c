/* kvs_matmul: y[r][o] = dot(x[r], W[o]) for F32 / F16 / BF16 / Q8_0 / Q4_0 weights (the other
 * block types go to kvs_matmul_deq, matmul_deq.c).
 *
 * Paths (chosen at compile time by the target ISA, at run time by shape):
 *
 *  AVX-512 (F, BW, VL, DQ; VNNI for the quantised types):
 *   - "gemv" (n_rows < KVS_TILE_MIN_ROWS, i.e. decode): weights are streamed once, straight from
 *     their storage format, one weight row after the other (a single sequential stream per
 *     thread, which the hardware prefetcher follows best); up to 4 x rows share each weight
 *     load. Float types: 4 zmm FMA accumulators per row (F16 via VCVTPH2PS, BF16 via a 16-bit
 *     shift). Quantised types: x is quantised to 8-bit blocks once; weight bytes are made
 *     unsigned (Q8_0: q ^ 0x80 = q + 128; Q4_0: the raw nibbles 0..15) and multiplied into the
 *     signed x bytes with 256-bit VPDPBUSD; the offset (128 or 8) times sum(x block) is the
 *     initial accumulator, so no sign tricks are needed and q = -128 weights are exact.
 *   - "tile" (n_rows >= KVS_TILE_MIN_ROWS, prefill): output columns are processed in panels of
 *     16*C columns. Each thread packs the panel of W once ("k-major": for every k a row of 16*C
 *     fp32 weights, F16/BF16 converted; for the quantised types, per block and 16 columns, 8 zmm
 *     of 16 lanes x 4 consecutive k bytes plus 16 fp32 scales) with register transposes, then
 *     reuses it for every row of x through an R x C register-blocked micro-kernel: for each k,
 *     x[r][k] is broadcast and multiplied into C zmm of packed weights (8 x 48 fp32 FMA tile;
 *     4 x 48 VPDPBUSD tile with a broadcast 4-byte group of x, one cvt + mul + FMA per block).
 *  AVX2+FMA+F16C: dot-product kernels per weight row (F16/BF16 rows converted to fp32 first;
 *     quantised types with the maddubs pattern, |w| times sign-adjusted x).
 *  Scalar: plain loops with the same arithmetic definitions.
 *
 * F32 prefill: own kernel vs OpenBLAS 0.3.21 (Cooperlake kernels; cblas_sgemm single-threaded
 * per pool thread on a slice of W rows), 512 rows, dims 768/2048, Zen 4 at ~3.6 GHz (peak
 * 115 GFLOP/s per core): own 111.6 GFLOP/s (1 thread), 221.8 (2 threads); OpenBLAS 96.5 and
 * 198.1. The own kernel wins, so OpenBLAS is not used (and its global thread setting is left
 * alone).
 *
 * Quantised types quantise x to 8-bit blocks of 32 with a *fp32* scale d = amax/127 and
 * q = rint(x / d) (round half to even, as GGML's SIMD quantiser does). Threads split the
 * output columns (or, when there are few columns and many rows, the rows). */
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "dequant.h"
#include "kernels.h"
#include "kernels_internal.h"
#include "matmul_kq.h"
#include "worksplit.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

/* Smallest n_rows for the packed tile kernels (below: gemv kernels, up to 4 x rows per pass over
 * W). Measured on Zen 4, 768x2048 weights, one thread (us, gemv / tile):
 *   rows     2          3          4          6          8
 *   f32   154/212    229/249    216/283    370/303    435/357
 *   q8_0   61/61      82/70     110/78     170/95     221/113
 *   q4_0   50/70      65/79      79/87     129/104    159/121 */
#ifndef KVS_TILE_MIN_ROWS
#define KVS_TILE_MIN_ROWS(wt) ((wt) == KVS_Q8_0 ? 3 : 5)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Shared context                                                                             */

typedef struct {
    float *y;
    const float *x;
    const char *w;
    kvs_dtype wt;
    int n_rows, n_in, n_out;
    size_t row_bytes; /* bytes of one weight row */

    /* Quantised x (Q8_0/Q4_0 weights): per row nbp blocks (nb real + zero padding). */
    int nb, nbp;
    int8_t *xq;     /* n_rows * nbp * 32 */
    float *xd;      /* n_rows * nbp */
    int32_t *xbias; /* n_rows * nbp: -offset * sum(q) */
    int32_t *xbv;   /* gemv only, n_rows * nbp * 8: per block (Q8_0) or pair (Q4_0) an 8-lane
                       VPDPBUSD start vector holding the bias in the block's first lane */
    int32_t offset; /* 128 for Q8_0, 8 for Q4_0 (what the unsigned weight bytes carry) */
    int xperm4;     /* x pairs stored as [b lo16 | b+1 lo16 | b hi16 | b+1 hi16] (Q4_0 gemv) */

    /* Per-thread scratch (packing / row conversion). */
    char *thread_scratch;
    size_t thread_scratch_bytes;

    /* Output columns in units of `unit`, shared among the threads by `split`; by_rows: too
     * few columns to go around, a static split of the x rows instead. */
    int unit, by_rows;
    kvs_split split;

} mm_ctx;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Splits [0, n) in units of `unit` into nth near-equal contiguous parts. */
static void split_range(int n, int unit, int ith, int nth, int *lo, int *hi)
{
    const int units = (n + unit - 1) / unit;
    const int u0 = (int)((int64_t)units * ith / nth), u1 = (int)((int64_t)units * (ith + 1) / nth);
    *lo = u0 * unit < n ? u0 * unit : n;
    *hi = u1 * unit < n ? u1 * unit : n;
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantisation                                                                    */

static void quantize_x_rows(const mm_ctx *c, int r0, int r1)
{
    const int n_in = c->n_in, nb = c->nb, nbp = c->nbp;
    for (int r = r0; r < r1; r++) {
        const float *x = c->x + (size_t)r * n_in;
        int8_t *q = c->xq + (size_t)r * nbp * KVS_QK;
        float *d = c->xd + (size_t)r * nbp;
        int32_t *bias = c->xbias + (size_t)r * nbp;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + b * KVS_QK;
            int8_t *qb = q + b * KVS_QK;
#if KVS_AVX512
            const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
            const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            _mm_storeu_si128((__m128i *)qb, _mm512_cvtepi32_epi8(i0));
            _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtepi32_epi8(i1));
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
#elif KVS_AVX2
            float db;
            int32_t s16[2];
            kvs_quant32_avx2(xb, qb, &db, s16);
            const int sum = s16[0] + s16[1];
#else
            float amax = 0.0f;
            for (int j = 0; j < KVS_QK; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            const float db = amax / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            int sum = 0;
            for (int j = 0; j < KVS_QK; j++) {
                qb[j] = (int8_t)rintf(xb[j] * id);
                sum += qb[j];
            }
#endif
            d[b] = db;
            bias[b] = -c->offset * sum;
        }
        if (nbp > nb)
            memset(q + (size_t)nb * KVS_QK, 0, (size_t)(nbp - nb) * KVS_QK);
        if (c->xperm4)
            for (int b = 0; b < nb; b += 2) {
                int8_t tmp[64];
                memcpy(tmp, q + (size_t)b * KVS_QK, 64);
                memcpy(q + (size_t)b * KVS_QK + 16, tmp + 32, 16);
                memcpy(q + (size_t)b * KVS_QK + 32, tmp + 16, 16);
            }
        if (nbp > nb) {
            memset(d + nb, 0, (size_t)(nbp - nb) * sizeof(float));
            memset(bias + nb, 0, (size_t)(nbp - nb) * sizeof(int32_t));
        }
        if (c->xbv) {
            int32_t *bv = c->xbv + (size_t)r * nbp * 8;
            memset(bv, 0, (size_t)nbp * 8 * sizeof(int32_t));
            for (int b = 0; b < nb; b++) {
                if (c->xperm4)
                    bv[(b >> 1) * 8 + (b & 1) * 4] = bias[b];
                else
                    bv[b * 8] = bias[b];
            }
        }
    }
}

static void quantize_x_task(void *p, int ith, int nth)
{
    const mm_ctx *c = p;
    int r0, r1;
    split_range(c->n_rows, 1, ith, nth, &r0, &r1);
    quantize_x_rows(c, r0, r1);
}

/* ========================================================================================== */
#if KVS_AVX512
/* ========================================================================================== */

KVS_INLINE __mmask16 mask16(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* 16 weights starting at element k of a float-type row, as fp32 (masked: m lanes valid). */
KVS_INLINE __m512 load_w16(kvs_dtype wt, const char *row, int k, __mmask16 m)
{
    if (wt == KVS_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    if (wt == KVS_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KVS_INLINE __m512 load_w16_full(kvs_dtype wt, const char *row, int k)
{
    if (wt == KVS_F32)
        return _mm512_loadu_ps((const float *)row + k);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (wt == KVS_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* ---- float gemv: NR x rows (1..4), one weight row at a time ----
 * Reading one weight row at a time keeps a single sequential stream per thread, which the
 * hardware prefetchers follow best: on this Zen 4, streaming F32 rows of 768 from DRAM ran at
 * 24 GB/s this way versus 15 GB/s with 4 rows interleaved. Software prefetch did not help from
 * the file mapping's 4 KiB pages; from the resident copy on huge pages (model/resident.c) it
 * took F32 decode at two threads on Zen 5 from 143 to 161 tok/s. */
KVS_INLINE void gemv_float_nr(const mm_ctx *c, int NR, int r0, int o0, int o1, kvs_dtype wt)
{
    const int K = c->n_in;
    const float *xr[4];
    KVS_UNROLL
    for (int r = 0; r < NR; r++)
        xr[r] = c->x + (size_t)(r0 + r) * K;
    const int k64 = K & ~63, k16 = K & ~15;
    const __mmask16 mt = mask16(K - k16);
    for (int o = o0; o < o1; o++) {
        const char *w0 = c->w + (size_t)o * c->row_bytes;
        __m512 acc[4][4];
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            KVS_UNROLL
            for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_setzero_ps();
        for (int k = 0; k < k64; k += 64) {
            __m512 wv[4];
            /* the next 64 weights' lines, one prefetch distance ahead (kernels_internal.h) */
            KVS_PREFETCH_AHEAD(w0 + (size_t)k * (wt == KVS_F32 ? 4 : 2), (wt == KVS_F32 ? 192 : 64));
            KVS_UNROLL
            for (int j = 0; j < 4; j++)
                wv[j] = load_w16_full(wt, w0, k + 16 * j);
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                KVS_UNROLL
                for (int j = 0; j < 4; j++)
                    acc[r][j] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + k + 16 * j), wv[j], acc[r][j]);
        }
        for (int k = k64; k < k16; k += 16) {
            const __m512 wv = load_w16_full(wt, w0, k);
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + k), wv, acc[r][0]);
        }
        if (k16 < K) {
            const __m512 wv = load_w16(wt, w0, k16, mt);
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                acc[r][3] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, xr[r] + k16), wv, acc[r][3]);
        }
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            c->y[(size_t)(r0 + r) * c->n_out + o] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3])));
    }
}

#define DEF_GEMV_FLOAT(name, WT)                                                                \
    static KVS_NOINLINE void name(const mm_ctx *c, int r0, int nr, int o0, int o1)             \
    {                                                                                           \
        switch (nr) {                                                                           \
        case 1: gemv_float_nr(c, 1, r0, o0, o1, WT); break;                                   \
        case 2: gemv_float_nr(c, 2, r0, o0, o1, WT); break;                                   \
        case 3: gemv_float_nr(c, 3, r0, o0, o1, WT); break;                                   \
        default: gemv_float_nr(c, 4, r0, o0, o1, WT); break;                                  \
        }                                                                                       \
    }
DEF_GEMV_FLOAT(gemv_f32, KVS_F32)
DEF_GEMV_FLOAT(gemv_f16, KVS_F16)
DEF_GEMV_FLOAT(gemv_bf16, KVS_BF16)

/* ---- quantised gemv ---- */
#if KVS_AVX512_VNNI

/* Decode kernel, 256-bit. Per Q8_0 block: the 32 weight bytes ^ 0x80 (= q + 128, unsigned)
 * times the 32 signed x bytes with VPDPBUSD -> 8 partial sums, converted and FMA'd with the
 * broadcast block scale dw*dx into 4 rotating accumulators. Per pair of Q4_0 blocks:
 * [qa | qb] & 0xf and (>> 4) & 0xf against x stored as [xa lo16 | xb lo16 | xa hi16 | xb hi16]
 * ("xperm4"): two VPDPBUSD into one vector whose halves belong to the two blocks. The offset
 * term -offset * sum(x block) enters as the initial VPDPBUSD accumulator (a precomputed vector
 * with the term in the block's first lane). Per-row horizontal sums are shared by 4 rows.
 * History (one thread, 768x2048, hot): a 512-bit variant with a cross-lane reduce tree and
 * gathered scales ran Q8_0 at 30 GB/s and Q4_0 at 15 GB/s; this one at 42 and 25 GB/s (the
 * reduce tree saturated Zen 4's shuffle pipes, VPGATHERDD is slow, and reloading scales
 * through the stack missed store forwarding). */
/* A group of ng <= 8 blocks starting at block g, for NR x rows. */
KVS_INLINE void gemv_q_group(int NR, kvs_dtype wt, const char *row, int g, int ng,
                             const int8_t *const *xq, const float *const *xd,
                             const int32_t *const *xbv, __m256 (*acc)[4])
{
    const int bb = wt == KVS_Q8_0 ? 34 : 18;
    const char *base = row + (size_t)g * bb;
    /* This group's bytes one prefetch distance ahead (KVS_PREFETCH_BYTES): without it the
     * block arithmetic and the DRAM stream took turns instead of overlapping. */
    KVS_PREFETCH_AHEAD(base, 8 * bb);
    const __m256 dw = kvs_fp16x8_at(base, (size_t)bb, ng);
    __m256 scv[4];
    KVS_UNROLL
    for (int r = 0; r < NR; r++)
        scv[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(xd[r] + g));
    /* scale of block i broadcast from the register (a stack round trip measured slower) */
#define KVS_SC(r, i) _mm256_permutexvar_ps(_mm256_set1_epi32(i), scv[r])
    if (wt == KVS_Q8_0) {
        const __m256i off = _mm256_set1_epi8((char)0x80);
        KVS_UNROLL
        for (int i = 0; i < 8; i += 2) {
            if (i >= ng)
                break;
            const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(base + i * 34 + 2)), off);
            const __m256i w1 = i + 1 < ng
                                   ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(base + (i + 1) * 34 + 2)), off)
                                   : _mm256_setzero_si256();
            KVS_UNROLL
            for (int r = 0; r < NR; r++) {
                const int8_t *xb = xq[r] + (size_t)(g + i) * KVS_QK;
                const int32_t *bv = xbv[r] + (size_t)(g + i) * 8;
                const __m256i d0 = _mm256_dpbusd_epi32(_mm256_load_si256((const __m256i *)bv), w0,
                                                       _mm256_load_si256((const __m256i *)xb));
                const __m256i d1 = _mm256_dpbusd_epi32(_mm256_load_si256((const __m256i *)(bv + 8)), w1,
                                                       _mm256_load_si256((const __m256i *)(xb + 32)));
                /* 4 accumulators: the FMA latency chain limited a 2-accumulator version */
                acc[r][i & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), KVS_SC(r, i), acc[r][i & 3]);
                acc[r][(i + 1) & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), KVS_SC(r, i + 1),
                                                      acc[r][(i + 1) & 3]);
            }
        }
    } else {
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        KVS_UNROLL
        for (int i = 0; i < 8; i += 2) {
            if (i >= ng)
                break;
            const __m128i qa = _mm_loadu_si128((const __m128i *)(base + i * 18 + 2));
            const __m128i qb = i + 1 < ng ? _mm_loadu_si128((const __m128i *)(base + (i + 1) * 18 + 2))
                                          : _mm_setzero_si128();
            const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
            const __m256i lo = _mm256_and_si256(t, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(t, 4), m4);
            KVS_UNROLL
            for (int r = 0; r < NR; r++) {
                const int8_t *xb = xq[r] + (size_t)(g + i) * KVS_QK;
                const int32_t *bv = xbv[r] + (size_t)(g + i) * 4;
                __m256i d = _mm256_dpbusd_epi32(_mm256_load_si256((const __m256i *)bv), lo,
                                                _mm256_load_si256((const __m256i *)xb));
                d = _mm256_dpbusd_epi32(d, hi, _mm256_load_si256((const __m256i *)(xb + 32)));
                const __m256 s = _mm256_permutexvar_ps(
                    _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1), scv[r]);
                acc[r][(i >> 1) & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[r][(i >> 1) & 3]);
            }
        }
    }
#undef KVS_SC
}

/* Horizontal sums of 4 vectors -> [sum a, sum b, sum c, sum d]. */
KVS_INLINE __m128 hsum4_ps256(__m256 a, __m256 b, __m256 c, __m256 d)
{
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Rows are processed one after the other (one sequential stream per thread), four at a time so
 * that the horizontal sums and stores of four outputs are shared. */
KVS_INLINE void gemv_q_nr(const mm_ctx *c, int NR, int r0, int o0, int o1, kvs_dtype wt)
{
    const int nb = c->nb, nbp = c->nbp, n_out = c->n_out;
    const size_t row_bytes = c->row_bytes;
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xbv[4];
    float *yr[4];
    KVS_UNROLL
    for (int r = 0; r < NR; r++) {
        xq[r] = c->xq + (size_t)(r0 + r) * nbp * KVS_QK;
        xd[r] = c->xd + (size_t)(r0 + r) * nbp;
        xbv[r] = c->xbv + (size_t)(r0 + r) * nbp * 8;
        yr[r] = c->y + (size_t)(r0 + r) * n_out;
    }
    const int nfull = nb & ~7;
    for (int o = o0; o < o1; o += 4) {
        const int no = o1 - o < 4 ? o1 - o : 4;
        __m256 res[4][4];
        KVS_UNROLL
        for (int j = 0; j < 4; j++) {
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                res[r][j] = _mm256_setzero_ps();
            if (j >= no)
                continue;
            const char *row = c->w + (size_t)(o + j) * row_bytes;
            __m256 acc[4][4];
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_ps();
            for (int g = 0; g < nfull; g += 8)
                gemv_q_group(NR, wt, row, g, 8, xq, xd, xbv, acc);
            if (nfull < nb)
                gemv_q_group(NR, wt, row, nfull, nb - nfull, xq, xd, xbv, acc);
            KVS_UNROLL
            for (int r = 0; r < NR; r++)
                res[r][j] = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]),
                                          _mm256_add_ps(acc[r][2], acc[r][3]));
        }
        KVS_UNROLL
        for (int r = 0; r < NR; r++) {
            const __m128 h = hsum4_ps256(res[r][0], res[r][1], res[r][2], res[r][3]);
            if (no == 4)
                _mm_storeu_ps(yr[r] + o, h);
            else
                _mm_mask_storeu_ps(yr[r] + o, (__mmask8)((1u << no) - 1u), h);
        }
    }
}

#define DEF_GEMV_Q(name, WT)                                                                    \
    static KVS_NOINLINE void name(const mm_ctx *c, int r0, int nr, int o0, int o1)             \
    {                                                                                           \
        switch (nr) {                                                                           \
        case 1: gemv_q_nr(c, 1, r0, o0, o1, WT); break;                                         \
        case 2: gemv_q_nr(c, 2, r0, o0, o1, WT); break;                                         \
        case 3: gemv_q_nr(c, 3, r0, o0, o1, WT); break;                                         \
        default: gemv_q_nr(c, 4, r0, o0, o1, WT); break;                                        \
        }                                                                                       \
    }
DEF_GEMV_Q(gemv_q8_0, KVS_Q8_0)
DEF_GEMV_Q(gemv_q4_0, KVS_Q4_0)
#endif /* KVS_AVX512_VNNI */

/* ---- packed float tiles ---- */

#define FT_R 8 /* x rows per micro-tile */
#define FT_C 3 /* 16-column groups per panel */

/* In-register transpose of 16 vectors of 16 fp32: on return v[k] = [v0[k], ..., v15[k]]. */
KVS_INLINE void transpose16x16_ps(__m512 *v)
{
    __m512 t[16], u[16];
    KVS_UNROLL
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    KVS_UNROLL
    for (int j = 0; j < 4; j++) {
        const __m512d a = _mm512_castps_pd(t[4 * j]), b = _mm512_castps_pd(t[4 * j + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * j + 2]), d = _mm512_castps_pd(t[4 * j + 3]);
        u[4 * j + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* u[4j + e], 128-bit lane q: rows 4j..4j+3 of element 4q + e */
    KVS_UNROLL
    for (int e = 0; e < 4; e++) {
        const __m512 ablo = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44);
        const __m512 abhi = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
        const __m512 cdlo = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        const __m512 cdhi = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
        v[0 + e] = _mm512_shuffle_f32x4(ablo, cdlo, 0x88);
        v[4 + e] = _mm512_shuffle_f32x4(ablo, cdlo, 0xdd);
        v[8 + e] = _mm512_shuffle_f32x4(abhi, cdhi, 0x88);
        v[12 + e] = _mm512_shuffle_f32x4(abhi, cdhi, 0xdd);
    }
}

/* Packs columns [o0, o0+nc) of W, elements [k0, k0+K), as bp[k - k0][16*C] fp32 (zero padded),
 * 16 columns x 16 k at a time through a register transpose. */
static void pack_float_panel(const mm_ctx *c, int o0, int nc, int C, int k0, int K, float *bp)
{
    const int ld = 16 * C;
    const kvs_dtype wt = c->wt;
    for (int g = 0; g < C; g++) {
        const int ncg = nc - 16 * g < 16 ? nc - 16 * g : 16;
        const char *rows[16];
        for (int j = 0; j < 16; j++)
            rows[j] = c->w + (size_t)(o0 + 16 * g + (j < ncg ? j : 0)) * c->row_bytes +
                      (size_t)k0 * (wt == KVS_F32 ? 4 : 2);
        float *dst = bp + 16 * g;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 v[16];
            KVS_UNROLL
            for (int j = 0; j < 16; j++)
                v[j] = j < ncg ? load_w16_full(wt, rows[j], k) : _mm512_setzero_ps();
            transpose16x16_ps(v);
            KVS_UNROLL
            for (int t = 0; t < 16; t++)
                _mm512_store_ps(dst + (size_t)(k + t) * ld, v[t]);
        }
        if (k < K) {
            const __mmask16 m = mask16(K - k);
            __m512 v[16];
            KVS_UNROLL
            for (int j = 0; j < 16; j++)
                v[j] = j < ncg ? load_w16(wt, rows[j], k, m) : _mm512_setzero_ps();
            transpose16x16_ps(v);
            for (int t = 0; k + t < K; t++)
                _mm512_store_ps(dst + (size_t)(k + t) * ld, v[t]);
        }
    }
}

/* y[r][0..nc) = sum_k x[r][k] * bp[k][..] for R rows, C column groups. */
KVS_INLINE void ftile_kernel(int R, int C, int K, const float *x, int ldx, const float *bp,
                             float *y, int ldy, int nc, int accum)
{
    __m512 acc[FT_R][FT_C];
    KVS_UNROLL
    for (int r = 0; r < R; r++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            acc[r][j] = accum ? _mm512_maskz_loadu_ps(mask16(nc - 16 * j), y + (size_t)r * ldy + 16 * j)
                              : _mm512_setzero_ps();
    const int ld = 16 * C;
    for (int k = 0; k < K; k++) {
        __m512 b[FT_C];
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            b[j] = _mm512_load_ps(bp + (size_t)k * ld + 16 * j);
        KVS_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            KVS_UNROLL
            for (int j = 0; j < C; j++)
                acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
        }
    }
    KVS_UNROLL
    for (int r = 0; r < R; r++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * j, mask16(nc - 16 * j), acc[r][j]);
}

#define DEF_FTILE(R, C)                                                                         \
    static KVS_NOINLINE void ftile_##R##_##C(int K, const float *x, int ldx, const float *bp,   \
                                             float *y, int ldy, int nc, int accum)              \
    {                                                                                           \
        ftile_kernel(R, C, K, x, ldx, bp, y, ldy, nc, accum);                                   \
    }
#define DEF_FTILE_C(C)                                                                          \
    DEF_FTILE(1, C) DEF_FTILE(2, C) DEF_FTILE(3, C) DEF_FTILE(4, C) DEF_FTILE(5, C)             \
        DEF_FTILE(6, C) DEF_FTILE(7, C) DEF_FTILE(8, C)
DEF_FTILE_C(1)
DEF_FTILE_C(2)
DEF_FTILE_C(3)

typedef void (*ftile_fn)(int, const float *, int, const float *, float *, int, int, int);
static const ftile_fn ftile_table[FT_C][FT_R] = {
    {ftile_1_1, ftile_2_1, ftile_3_1, ftile_4_1, ftile_5_1, ftile_6_1, ftile_7_1, ftile_8_1},
    {ftile_1_2, ftile_2_2, ftile_3_2, ftile_4_2, ftile_5_2, ftile_6_2, ftile_7_2, ftile_8_2},
    {ftile_1_3, ftile_2_3, ftile_3_3, ftile_4_3, ftile_5_3, ftile_6_3, ftile_7_3, ftile_8_3},
};

/* k-chunk of a packed float panel: 48 x 1024 fp32 = 192 KiB stays in L2 with room for x. */
#define FT_KC 1024

static size_t ftile_scratch_bytes(int K)
{
    return align64((size_t)(K < FT_KC ? K : FT_KC) * 16 * FT_C * sizeof(float));
}

static void tile_float(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    float *bp = (float *)scratch;
    const int K = c->n_in;
    /* equal chunks of at most FT_KC */
    const int n_kc = (K + FT_KC - 1) / FT_KC;
    for (int o = o0; o < o1; o += 16 * FT_C) {
        const int nc = o1 - o < 16 * FT_C ? o1 - o : 16 * FT_C;
        const int C = (nc + 15) / 16;
        for (int q = 0; q < n_kc; q++) {
            const int k0 = (int)((int64_t)K * q / n_kc), k1 = (int)((int64_t)K * (q + 1) / n_kc);
            pack_float_panel(c, o, nc, C, k0, k1 - k0, bp);
            for (int r = r0; r < r1; r += FT_R) {
                const int R = r1 - r < FT_R ? r1 - r : FT_R;
                ftile_table[C - 1][R - 1](k1 - k0, c->x + (size_t)r * K + k0, K, bp,
                                          c->y + (size_t)r * c->n_out + o, c->n_out, nc, q > 0);
            }
        }
    }
}

/* ---- packed quantised tiles ---- */
#if KVS_AVX512_VNNI

#define QT_R 4
#define QT_C 3
#define QPACK_BYTES 576 /* 8 x 64 weight bytes + 16 fp32 scales, per block per 16 columns */

/* Transposes 16 rows of 8 dwords (r[j], j < 16) into 8 vectors of 16 dwords:
 * out[k] = [r0[k], ..., r15[k]]. */
KVS_INLINE void transpose16x8_epi32(const __m256i *r, __m512i *out)
{
    __m512i z[8], t[8], u[8];
    KVS_UNROLL
    for (int i = 0; i < 8; i++) /* rows i (low half) and i + 8 (high half) */
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[i]), r[i + 8], 1);
    KVS_UNROLL
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    KVS_UNROLL
    for (int j = 0; j < 2; j++) {
        u[4 * j + 0] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    /* u[4j + e], 128-bit lane q = 2h + l: rows 8h + 4j .. +3 of element 4l + e */
    const __m512i i0 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i i1 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    KVS_UNROLL
    for (int e = 0; e < 4; e++) {
        out[e] = _mm512_permutex2var_epi64(u[e], i0, u[4 + e]);
        out[4 + e] = _mm512_permutex2var_epi64(u[e], i1, u[4 + e]);
    }
}

/* Packs columns [o0, o0+nc) as pk[b][C][576]: for k4 in 0..7 a 64-byte vector whose lane j holds
 * weight bytes 4*k4 .. 4*k4+3 of block b of column j (unsigned), then 16 fp32 scales. */
static void pack_q_panel(const mm_ctx *c, int o0, int nc, int C, char *pk)
{
    const int nb = c->nb;
    const int bb = c->wt == KVS_Q8_0 ? 34 : 18;
    for (int g = 0; g < C; g++) {
        const int ncg = nc - 16 * g < 16 ? nc - 16 * g : 16;
        const char *rows[16];
        for (int j = 0; j < 16; j++)
            rows[j] = c->w + (size_t)(o0 + 16 * g + (j < ncg ? j : 0)) * c->row_bytes;
        for (int b = 0; b < nb; b++) {
            char *dst = pk + ((size_t)b * C + g) * QPACK_BYTES;
            __m256i r[16];
            __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
            if (c->wt == KVS_Q8_0) {
                KVS_UNROLL
                for (int j = 0; j < 16; j++)
                    r[j] = j < ncg ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rows[j] + (size_t)b * 34 + 2)),
                                                      _mm256_set1_epi8((char)0x80))
                                   : _mm256_setzero_si256();
            } else {
                KVS_UNROLL
                for (int j = 0; j < 16; j++) {
                    if (j < ncg) {
                        const __m128i q = _mm_loadu_si128((const __m128i *)(rows[j] + (size_t)b * 18 + 2));
                        r[j] = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                                                _mm256_set1_epi8(0x0f));
                    } else {
                        r[j] = _mm256_setzero_si256();
                    }
                }
            }
#define KVS_INS(v, lane, j)                                                                     \
    if ((j) < ncg)                                                                              \
        v = _mm_insert_epi16(v, kvs_load_u16(rows[j] + (size_t)b * bb), lane);
            KVS_INS(h0, 0, 0) KVS_INS(h0, 1, 1) KVS_INS(h0, 2, 2) KVS_INS(h0, 3, 3)
            KVS_INS(h0, 4, 4) KVS_INS(h0, 5, 5) KVS_INS(h0, 6, 6) KVS_INS(h0, 7, 7)
            KVS_INS(h1, 0, 8) KVS_INS(h1, 1, 9) KVS_INS(h1, 2, 10) KVS_INS(h1, 3, 11)
            KVS_INS(h1, 4, 12) KVS_INS(h1, 5, 13) KVS_INS(h1, 6, 14) KVS_INS(h1, 7, 15)
#undef KVS_INS
            __m512i out[8];
            transpose16x8_epi32(r, out);
            KVS_UNROLL
            for (int k4 = 0; k4 < 8; k4++)
                _mm512_store_si512(dst + 64 * k4, out[k4]);
            _mm512_store_ps(dst + 512, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1)));
        }
    }
}

KVS_INLINE void qtile_kernel(int R, int C, const mm_ctx *c, int r, const char *pk, float *y,
                             int nc)
{
    const int nb = c->nb, nbp = c->nbp;
    __m512 facc[QT_R][QT_C];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            facc[i][j] = _mm512_setzero_ps();
    const int8_t *xq = c->xq + (size_t)r * nbp * KVS_QK;
    const float *xd = c->xd + (size_t)r * nbp;
    const int32_t *xb = c->xbias + (size_t)r * nbp;
    const size_t xqs = (size_t)nbp * KVS_QK;
    for (int b = 0; b < nb; b++) {
        const char *pb = pk + (size_t)b * C * QPACK_BYTES;
        __m512i iacc[QT_R][QT_C];
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            const __m512i bias = _mm512_set1_epi32(xb[(size_t)i * nbp + b]);
            KVS_UNROLL
            for (int j = 0; j < C; j++)
                iacc[i][j] = bias;
        }
        KVS_UNROLL
        for (int k4 = 0; k4 < 8; k4++) {
            __m512i wv[QT_C];
            KVS_UNROLL
            for (int j = 0; j < C; j++)
                wv[j] = _mm512_load_si512(pb + (size_t)j * QPACK_BYTES + 64 * k4);
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                int32_t xv4;
                memcpy(&xv4, xq + i * xqs + (size_t)b * KVS_QK + 4 * k4, 4);
                const __m512i xv = _mm512_set1_epi32(xv4);
                KVS_UNROLL
                for (int j = 0; j < C; j++)
                    iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], wv[j], xv);
            }
        }
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            const __m512 dx = _mm512_set1_ps(xd[(size_t)i * nbp + b]);
            KVS_UNROLL
            for (int j = 0; j < C; j++) {
                const __m512 s = _mm512_mul_ps(_mm512_load_ps((const float *)(pb + (size_t)j * QPACK_BYTES + 512)), dx);
                facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i][j]), s, facc[i][j]);
            }
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            _mm512_mask_storeu_ps(y + (size_t)i * c->n_out + 16 * j, mask16(nc - 16 * j), facc[i][j]);
}

#define DEF_QTILE(R, C)                                                                         \
    static KVS_NOINLINE void qtile_##R##_##C(const mm_ctx *c, int r, const char *pk, float *y,  \
                                             int nc)                                            \
    {                                                                                           \
        qtile_kernel(R, C, c, r, pk, y, nc);                                                    \
    }
#define DEF_QTILE_C(C) DEF_QTILE(1, C) DEF_QTILE(2, C) DEF_QTILE(3, C) DEF_QTILE(4, C)
DEF_QTILE_C(1)
DEF_QTILE_C(2)
DEF_QTILE_C(3)

typedef void (*qtile_fn)(const mm_ctx *, int, const char *, float *, int);
static const qtile_fn qtile_table[QT_C][QT_R] = {
    {qtile_1_1, qtile_2_1, qtile_3_1, qtile_4_1},
    {qtile_1_2, qtile_2_2, qtile_3_2, qtile_4_2},
    {qtile_1_3, qtile_2_3, qtile_3_3, qtile_4_3},
};

static size_t qtile_scratch_bytes(int nb) { return align64((size_t)nb * QT_C * QPACK_BYTES); }

static void tile_q(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    for (int o = o0; o < o1; o += 16 * QT_C) {
        const int nc = o1 - o < 16 * QT_C ? o1 - o : 16 * QT_C;
        const int C = (nc + 15) / 16;
        pack_q_panel(c, o, nc, C, scratch);
        for (int r = r0; r < r1; r += QT_R) {
            const int R = r1 - r < QT_R ? r1 - r : QT_R;
            qtile_table[C - 1][R - 1](c, r, scratch, c->y + (size_t)r * c->n_out + o, nc);
        }
    }
}
#endif /* KVS_AVX512_VNNI */

#endif /* KVS_AVX512 */

/* ========================================================================================== */
/* Portable (scalar / AVX2) kernels: one weight row at a time against every x row, but for    */
/* AVX2's register tiles (F32 and Q8_0 prefill).                                              */

#if !KVS_AVX2
/* Integer dot of one weight block with one x block: sum_j w_j * q_j. */
static int32_t dot_block_q8(const kvs_block_q8_0 *blk, const int8_t *xq)
{
    int32_t s = 0;
    for (int j = 0; j < KVS_QK; j++)
        s += (int32_t)blk->qs[j] * xq[j];
    return s;
}

static int32_t dot_block_q4(const kvs_block_q4_0 *blk, const int8_t *xq)
{
    int32_t s = 0;
    for (int j = 0; j < KVS_QK / 2; j++) {
        s += ((blk->qs[j] & 0x0f) - 8) * xq[j];
        s += ((blk->qs[j] >> 4) - 8) * xq[j + KVS_QK / 2];
    }
    return s;
}
#endif

static float dot_row_q(const mm_ctx *c, const char *row, int r)
{
    const int8_t *xq = c->xq + (size_t)r * c->nbp * KVS_QK;
    const float *xd = c->xd + (size_t)r * c->nbp;
#if KVS_AVX2
    __m256 acc = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < c->nb; b++) {
        __m256i wv;
        uint16_t dh;
        if (c->wt == KVS_Q8_0) {
            const kvs_block_q8_0 *blk = (const kvs_block_q8_0 *)row + b;
            wv = _mm256_loadu_si256((const __m256i *)blk->qs);
            dh = blk->d;
        } else {
            const kvs_block_q4_0 *blk = (const kvs_block_q4_0 *)row + b;
            const __m128i q = _mm_loadu_si128((const __m128i *)blk->qs);
            wv = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
            wv = _mm256_sub_epi8(_mm256_and_si256(wv, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
            dh = blk->d;
        }
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (size_t)b * KVS_QK));
        /* |w| * sign(x, w): unsigned x signed bytes, pairwise sums fit in int16 (|w|,|x| <= 128,
         * 127 -> 2 * 128 * 127 < 32768). */
        const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        const float s = kvs_fp16_to_fp32_scalar(dh) * xd[b];
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(s), acc);
    }
    return kvs_hsum256(acc);
#else
    float acc = 0.0f;
    for (int b = 0; b < c->nb; b++) {
        if (c->wt == KVS_Q8_0) {
            const kvs_block_q8_0 *blk = (const kvs_block_q8_0 *)row + b;
            acc += kvs_fp16_to_fp32_scalar(blk->d) * xd[b] *
                   (float)dot_block_q8(blk, xq + (size_t)b * KVS_QK);
        } else {
            const kvs_block_q4_0 *blk = (const kvs_block_q4_0 *)row + b;
            acc += kvs_fp16_to_fp32_scalar(blk->d) * xd[b] *
                   (float)dot_block_q4(blk, xq + (size_t)b * KVS_QK);
        }
    }
    return acc;
#endif
}

#if KVS_AVX2
/* AVX2 kernels (CPUs or VMs without AVX-512): a few weight rows against up to 4 x rows at a time,
 * so that each load feeds several FMA and the FMA chains overlap. Per weight row and x row they
 * read what portable_rows' per-pair dots read, in the same block order. */

/* One Q8_0 block w (aw = |w|) against one x block: lane i holds the exact sum of w q over
 * elements 4 i .. 4 i + 3, as fp32. |w| times sign(x, w) with VPMADDUBSW (pairs below
 * 2 * 128 * 127: no saturation), then VPMADDWD by ones. */
KVS_INLINE __m256 q8_lane_sums(__m256i w, __m256i aw, __m256i x)
{
    const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* Q8_0 decode: per block the lane sums and one FMA by d xd; the blocks' fp16 scales are
 * converted 8 at a time (F16C) and multiplied by the x rows' xd (zero-padded to nbp). Two FMA
 * chains per x row (even and odd blocks). */
KVS_INLINE void q8_block_avx2(int R, const mm_ctx *c, const kvs_block_q8_0 *k, int r, int b,
                              const __m256 *f, int lane, __m256 *acc)
{
    if (R == 1)
        KVS_PREFETCH_AHEAD(k, 0); /* one line per block of 34 bytes */
    const __m256i w = _mm256_loadu_si256((const __m256i *)k->qs);
    const __m256i aw = _mm256_sign_epi8(w, w);
    const __m256i idx = _mm256_set1_epi32(lane);
    KVS_UNROLL
    for (int i = 0; i < R; i++) {
        const __m256i x =
            _mm256_loadu_si256((const __m256i *)(c->xq + ((size_t)(r + i) * c->nbp + b) * KVS_QK));
        acc[i] = _mm256_fmadd_ps(q8_lane_sums(w, aw, x), _mm256_permutevar8x32_ps(f[i], idx),
                                 acc[i]);
    }
}

KVS_INLINE void q8_row_avx2(int R, const mm_ctx *c, const char *row, int r, float *y)
{
    const kvs_block_q8_0 *blk = (const kvs_block_q8_0 *)row;
    __m256 acc[2][4];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < c->nb; b0 += 8) {
        const int ng = c->nb - b0 < 8 ? c->nb - b0 : 8;
        const __m256 d8 = kvs_fp16x8_at((const char *)(blk + b0), sizeof *blk, ng);
        __m256 f[4];
        KVS_UNROLL
        for (int i = 0; i < R; i++)
            f[i] = _mm256_mul_ps(d8, _mm256_loadu_ps(c->xd + (size_t)(r + i) * c->nbp + b0));
        if (ng == 8) { /* unrolled: the lane and the chain are constants */
            KVS_UNROLL
            for (int g = 0; g < 8; g++)
                q8_block_avx2(R, c, blk + b0 + g, r, b0 + g, f, g, acc[g & 1]);
        } else {
            for (int g = 0; g < ng; g++)
                q8_block_avx2(R, c, blk + b0 + g, r, b0 + g, f, g, acc[0]);
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        y[(size_t)(r + i) * c->n_out] = kvs_hsum256(_mm256_add_ps(acc[0][i], acc[1][i]));
}

/* F32: NC weight rows (o, o + 1, ..) against R x rows, 8 floats per step, R * NC accumulators
 * (doubled by even / odd steps when there are fewer than 8); a scalar tail past the last 8. */
KVS_INLINE void f32_rows_avx2(int R, int NC, const mm_ctx *c, int o, int r)
{
    const int K = c->n_in, U = R * NC < 8 ? 2 : 1;
    const float *w[4], *x[4];
    KVS_UNROLL
    for (int j = 0; j < NC; j++)
        w[j] = (const float *)(c->w + (size_t)(o + j) * c->row_bytes);
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        x[i] = c->x + (size_t)(r + i) * K;
    __m256 acc[2][4][4];
    KVS_UNROLL
    for (int u = 0; u < U; u++)
        KVS_UNROLL
        for (int i = 0; i < R; i++)
            KVS_UNROLL
            for (int j = 0; j < NC; j++)
                acc[u][i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 * U <= K; k += 8 * U)
        KVS_UNROLL
        for (int u = 0; u < U; u++) {
            __m256 wv[4];
            KVS_UNROLL
            for (int j = 0; j < NC; j++)
                wv[j] = _mm256_loadu_ps(w[j] + k + 8 * u);
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                const __m256 xv = _mm256_loadu_ps(x[i] + k + 8 * u);
                KVS_UNROLL
                for (int j = 0; j < NC; j++)
                    acc[u][i][j] = _mm256_fmadd_ps(xv, wv[j], acc[u][i][j]);
            }
        }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < NC; j++) {
            __m256 a = acc[0][i][j];
            if (U == 2)
                a = _mm256_add_ps(a, acc[1][i][j]);
            float s = kvs_hsum256(a);
            for (int t = k; t < K; t++)
                s += x[i][t] * w[j][t];
            c->y[(size_t)(r + i) * c->n_out + o + j] = s;
        }
}

/* One group of nr (1..4) x rows from r against nc (1 or 2) weight rows from o. */
static void f32_group_avx2(const mm_ctx *c, int o, int nc, int r, int nr)
{
    switch (4 * (nc - 1) + (nr < 4 ? nr : 4)) {
    case 1: f32_rows_avx2(1, 1, c, o, r); break;
    case 2: f32_rows_avx2(2, 1, c, o, r); break;
    case 3: f32_rows_avx2(3, 1, c, o, r); break;
    case 4: f32_rows_avx2(4, 1, c, o, r); break;
    case 5: f32_rows_avx2(1, 2, c, o, r); break;
    case 6: f32_rows_avx2(2, 2, c, o, r); break;
    case 7: f32_rows_avx2(3, 2, c, o, r); break;
    default: f32_rows_avx2(4, 2, c, o, r); break;
    }
}

/* Columns by 2 (one at the end), x rows by 4, in blocks of 64 x rows (whose fp32 x stays in L2
 * while the columns pass over it). */
static void f32_avx2(const mm_ctx *c, int r0, int r1, int o0, int o1)
{
    for (int rb = r0; rb < r1; rb += 64) {
        const int re = r1 - rb < 64 ? r1 : rb + 64;
        for (int o = o0; o < o1; o += 2)
            for (int r = rb; r < re; r += 4)
                f32_group_avx2(c, o, o + 2 <= o1 ? 2 : 1, r, re - r);
    }
}

/* F32 with many x rows (prefill): panels of 16 weight columns packed k-major (bp[k][16], zero
 * beyond the last column) for at most F2_KC elements of k, then swept by every x row in tiles of
 * F2_R rows: per k, 2 packed vectors times one broadcast x element per row into 2 * F2_R
 * accumulators (12 of the 16 registers). The dot-product kernel above (4 x rows by 2 weight
 * rows, reduced at the end) ran at 47-51 GFLOP/s in bench_matmul on this Zen 4 VM. */
#define F2_R 6
#define F2_KC 1024
#define F2_MIN_ROWS 8

KVS_INLINE void f32_tile_avx2(int R, int K, const float *x, int ldx, const float *bp, float *y,
                              int ldy, int nc, int accum)
{
    __m256 acc[F2_R][2];
    KVS_UNROLL
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(bp + 16 * (size_t)k);
        const __m256 b1 = _mm256_loadu_ps(bp + 16 * (size_t)k + 8);
        KVS_UNROLL
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(x + (size_t)r * ldx + k);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    KVS_UNROLL
    for (int r = 0; r < R; r++) {
        float *yr = y + (size_t)r * ldy;
        if (nc == 16) {
            if (accum) {
                acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(yr));
                acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(yr + 8));
            }
            _mm256_storeu_ps(yr, acc[r][0]);
            _mm256_storeu_ps(yr + 8, acc[r][1]);
        } else {
            float t[16];
            _mm256_storeu_ps(t, acc[r][0]);
            _mm256_storeu_ps(t + 8, acc[r][1]);
            for (int j = 0; j < nc; j++)
                yr[j] = accum ? yr[j] + t[j] : t[j];
        }
    }
}

#define DEF_F2(R)                                                                               \
    static KVS_NOINLINE void f32_tile_##R(int K, const float *x, int ldx, const float *bp,      \
                                          float *y, int ldy, int nc, int accum)                 \
    {                                                                                           \
        f32_tile_avx2(R, K, x, ldx, bp, y, ldy, nc, accum);                                     \
    }
DEF_F2(1)
DEF_F2(2)
DEF_F2(3)
DEF_F2(4)
DEF_F2(5)
DEF_F2(6)
#undef DEF_F2

typedef void (*f2_fn)(int, const float *, int, const float *, float *, int, int, int);
static const f2_fn f2_table[F2_R] = {f32_tile_1, f32_tile_2, f32_tile_3,
                                     f32_tile_4, f32_tile_5, f32_tile_6};

/* Weight element k of row w as fp32 (F32, F16 or BF16). */
KVS_INLINE float f32_elem(kvs_dtype wt, const char *w, int k)
{
    if (wt == KVS_F32)
        return ((const float *)w)[k];
    if (wt == KVS_F16)
        return _cvtsh_ss(((const uint16_t *)w)[k]);
    return kvs_bf16_to_fp32_scalar(((const uint16_t *)w)[k]);
}

/* 8 weight elements from k of row w as fp32. */
KVS_INLINE __m256i f32_elem8(kvs_dtype wt, const char *w, int k)
{
    if (wt == KVS_F32)
        return _mm256_loadu_si256((const __m256i *)((const float *)w + k));
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    if (wt == KVS_F16)
        return _mm256_castps_si256(_mm256_cvtph_ps(h));
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16); /* BF16: the top half of an fp32 */
}

/* The panel of columns [o, o + nc) (nc <= 16; the rest zero) over inputs [k0, k1) as fp32,
 * bp[(k - k0) 16 + j]: 8 rows x 8 inputs at a time turned by an 8 x 8 transposition, the
 * rest element by element. */
static void f32_pack_panel(const mm_ctx *c, int o, int nc, int k0, int k1, float *bp)
{
    const int kn = k1 - k0, k8 = kn & ~7;
    for (int j0 = 0; j0 < 16; j0 += 8) {
        const char *w[8];
        for (int j = 0; j < 8; j++)
            w[j] = j0 + j < nc ? c->w + (size_t)(o + j0 + j) * c->row_bytes : NULL;
        int k = 0;
        if (j0 + 8 <= nc)
            for (; k < k8; k += 8) {
                __m256i in[8], tr[8];
                for (int j = 0; j < 8; j++)
                    in[j] = f32_elem8(c->wt, w[j], k0 + k);
                kvs_transpose8_avx2(in, tr);
                for (int t = 0; t < 8; t++)
                    _mm256_storeu_si256((__m256i *)(bp + (size_t)(k + t) * 16 + j0), tr[t]);
            }
        for (int j = 0; j < 8; j++)
            for (int kk = k; kk < kn; kk++)
                bp[(size_t)kk * 16 + j0 + j] = w[j] ? f32_elem(c->wt, w[j], k0 + kk) : 0.0f;
    }
}

static void f32_tiles(const mm_ctx *c, float *bp, int r0, int r1, int o0, int o1)
{
    const int K = c->n_in, n_kc = (K + F2_KC - 1) / F2_KC;
    for (int o = o0; o < o1; o += 16) {
        const int nc = o1 - o < 16 ? o1 - o : 16;
        for (int q = 0; q < n_kc; q++) {
            const int k0 = (int)((int64_t)K * q / n_kc), k1 = (int)((int64_t)K * (q + 1) / n_kc);
            f32_pack_panel(c, o, nc, k0, k1, bp);
            for (int r = r0; r < r1; r += F2_R) {
                const int R = r1 - r < F2_R ? r1 - r : F2_R;
                f2_table[R - 1](k1 - k0, c->x + (size_t)r * K + k0, K, bp,
                                c->y + (size_t)r * c->n_out + o, c->n_out, nc, q > 0);
            }
        }
    }
}

/* Q8_0 prefill: NC weight rows (o, o + 1) against R x rows (r ..) in registers, so that each
 * weight load feeds R products and each x load NC; per pair and block q8_lane_sums and one
 * FMA, as in q8_block_avx2. The pairs' scales dw * xd come 8 blocks at a time from one
 * multiply each, stored to sc and broadcast from there (a load, where q8_block_avx2 spends a
 * permute). dw holds the NC rows' scales as fp32, zero-padded to nbp like xd. */
KVS_INLINE void q8_tile_avx2(int R, int NC, const mm_ctx *c, const float *dw, int o, int r)
{
    const kvs_block_q8_0 *blk[2];
    const int8_t *xq[4];
    const float *xd[4];
    KVS_UNROLL
    for (int j = 0; j < NC; j++)
        blk[j] = (const kvs_block_q8_0 *)(c->w + (size_t)(o + j) * c->row_bytes);
    KVS_UNROLL
    for (int i = 0; i < R; i++) {
        xq[i] = c->xq + (size_t)(r + i) * c->nbp * KVS_QK;
        xd[i] = c->xd + (size_t)(r + i) * c->nbp;
    }
    __m256 acc[4][2];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < NC; j++)
            acc[i][j] = _mm256_setzero_ps();
    float sc[4][2][8];
    for (int b0 = 0; b0 < c->nb; b0 += 8) {
        KVS_UNROLL
        for (int j = 0; j < NC; j++) {
            const __m256 d = _mm256_loadu_ps(dw + (size_t)j * c->nbp + b0);
            KVS_UNROLL
            for (int i = 0; i < R; i++)
                _mm256_storeu_ps(sc[i][j], _mm256_mul_ps(d, _mm256_loadu_ps(xd[i] + b0)));
        }
        const int ng = c->nb - b0 < 8 ? c->nb - b0 : 8;
        for (int g = 0; g < ng; g++) {
            const int b = b0 + g;
            __m256i w[2], aw[2];
            KVS_UNROLL
            for (int j = 0; j < NC; j++) {
                w[j] = _mm256_loadu_si256((const __m256i *)blk[j][b].qs);
                aw[j] = _mm256_sign_epi8(w[j], w[j]);
            }
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)b * KVS_QK));
                KVS_UNROLL
                for (int j = 0; j < NC; j++)
                    acc[i][j] = _mm256_fmadd_ps(q8_lane_sums(w[j], aw[j], x),
                                                _mm256_broadcast_ss(&sc[i][j][g]), acc[i][j]);
            }
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < NC; j++)
            c->y[(size_t)(r + i) * c->n_out + o + j] = kvs_hsum256(acc[i][j]);
}

/* One tile of nr (1..4) x rows against nc (1 or 2) weight rows. */
static void q8_group_avx2(const mm_ctx *c, const float *dw, int o, int nc, int r, int nr)
{
    switch (4 * (nc - 1) + nr) {
    case 1: q8_tile_avx2(1, 1, c, dw, o, r); break;
    case 2: q8_tile_avx2(2, 1, c, dw, o, r); break;
    case 3: q8_tile_avx2(3, 1, c, dw, o, r); break;
    case 4: q8_tile_avx2(4, 1, c, dw, o, r); break;
    case 5: q8_tile_avx2(1, 2, c, dw, o, r); break;
    case 6: q8_tile_avx2(2, 2, c, dw, o, r); break;
    case 7: q8_tile_avx2(3, 2, c, dw, o, r); break;
    default: q8_tile_avx2(4, 2, c, dw, o, r); break;
    }
}

/* Q8_0 with 8 to Q8L_MIN_ROWS - 1 x rows (from Q8L_MIN_ROWS the lane tiles below, q8l_rows: with
 * them kvslim's Q8_0 pp512 at one thread went from 339-355 to 427-442 tok/s): blocks of x rows
 * of up to 256 KiB of 8-bit x (they stay in L2 while the thread's weight rows stream past once
 * per block), and within one, each pair of weight rows (scales converted once into dw) against
 * every group of 4 of them. bench_matmul, 2
 * threads, best of 15: blocks of 128-512 rows 140-147 GFLOP/s, of 16-64 rows 114-147, the
 * 64-row blocks of one weight row (q8_avx2) 91-127. */
#define Q8_TILE_MIN_ROWS 8 /* fewer x rows (decode, short chunks) take q8_avx2 */
#define Q8_TILE_X_BYTES (256 * 1024)
static void q8_tiles(const mm_ctx *c, float *dw, int r0, int r1, int o0, int o1)
{
    int rb = Q8_TILE_X_BYTES / (c->nbp * KVS_QK);
    rb = rb < 4 ? 4 : rb & ~3;
    for (int r = r0; r < r1; r += rb) {
        const int re = r1 - r < rb ? r1 : r + rb;
        for (int o = o0; o < o1; o += 2) {
            const int nc = o1 - o < 2 ? 1 : 2;
            for (int j = 0; j < nc; j++) {
                const kvs_block_q8_0 *blk =
                    (const kvs_block_q8_0 *)(c->w + (size_t)(o + j) * c->row_bytes);
                float *d = dw + (size_t)j * c->nbp;
                for (int b = 0; b < c->nbp; b++)
                    d[b] = b < c->nb ? _cvtsh_ss(blk[b].d) : 0.0f;
            }
            for (int i = r; i < re; i += 4)
                q8_group_avx2(c, dw, o, nc, i, re - i < 4 ? re - i : 4);
        }
    }
}

static void q8_avx2(const mm_ctx *c, int r0, int r1, int o0, int o1)
{
    KVS_AVX2_ROW_BLOCKS(c, r0, r1, o0, o1, q8_row_avx2)
}

/* Q8_0 prefill with 8 weight rows in the 8 lanes (as matmul_kq_avx2.c's K-quant tiles): each
 * thread transposes a panel of 8 columns once per call so that a vector holds one 4-byte group
 * of a block for each of the 8 rows, and runs x through it 4 rows at a time: per group and x
 * row the sign trick (VPSIGNB of the broadcast x group by w, VPMADDUBSW with |w|) and a
 * VPMADDWD by ones (two products of 127 x 127 can't share a 16-bit lane), the 32-bit sums per
 * block; per block and x row one conversion and one FMA by the 8 rows' d times xd, and no
 * horizontal sum (q8_tile_avx2: a conversion, an FMA and a broadcast scale per block, x row
 * and weight row, then a horizontal sum per output). */
/* Smallest n_rows for the lane tiles (fewer: q8_tiles, then q8_avx2). The panel is packed
 * once per call; Zen 4, 768 x 2048, one thread, GFLOP/s lane tiles / the others (best of 7 x 20
 * calls, two runs): 8 rows 58-61 / 68, 12 rows 65 / 69, 16 rows 69-76 / 57-70, 20 rows 80 /
 * 69-71, 32 rows 80-86 / 70-71. */
#ifndef Q8L_MIN_ROWS
#define Q8L_MIN_ROWS 16
#endif
#define Q8L_BLOCK_BYTES (8 * 32 + 32) /* per block: [8 groups][8 rows][4 bytes], 8 fp32 d */

static size_t q8l_scratch_bytes(int nb) { return align64((size_t)nb * Q8L_BLOCK_BYTES); }

/* Packs columns [o, o + nc) (nc <= 8; the rest zero) into pk. */
static void q8l_pack(const mm_ctx *c, int o, int nc, char *pk)
{
    for (int b = 0; b < c->nb; b++) {
        __m256i in[8], tr[8];
        _Alignas(32) float d[8];
        for (int j = 0; j < 8; j++) {
            const kvs_block_q8_0 *k = (const kvs_block_q8_0 *)(c->w + (size_t)(o + j) * c->row_bytes) + b;
            in[j] = j < nc ? _mm256_loadu_si256((const __m256i *)k->qs) : _mm256_setzero_si256();
            d[j] = j < nc ? _cvtsh_ss(k->d) : 0.0f;
        }
        kvs_transpose8_avx2(in, tr);
        char *pb = pk + (size_t)b * Q8L_BLOCK_BYTES;
        for (int g = 0; g < 8; g++)
            _mm256_store_si256((__m256i *)pb + g, tr[g]);
        _mm256_store_ps((float *)(pb + 256), _mm256_load_ps(d));
    }
}

/* y[i n_out + j] of x row r + i (i < R) and panel column j < nc. */
KVS_INLINE void q8l_tile(int R, const mm_ctx *c, int r, const char *pk, float *y, int nc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < c->nb; b++) {
        const char *pb = pk + (size_t)b * Q8L_BLOCK_BYTES;
        __m256i is[4];
        KVS_UNROLL
        for (int g = 0; g < 8; g++) {
            const __m256i w = _mm256_load_si256((const __m256i *)pb + g), aw = _mm256_sign_epi8(w, w);
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                int32_t x4;
                memcpy(&x4, c->xq + ((size_t)(r + i) * c->nbp + (size_t)b) * KVS_QK + 4 * g, 4);
                const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(x4), w);
                const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                is[i] = g == 0 ? p : _mm256_add_epi32(is[i], p);
                KVS_KEEP_REG(is[i]); /* the adds in order (as matmul_kq_avx2.c's tiles) */
            }
        }
        const __m256 dv = _mm256_load_ps((const float *)(pb + 256));
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            const __m256 s = _mm256_mul_ps(dv, _mm256_set1_ps(c->xd[(size_t)(r + i) * c->nbp + b]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i]), s, acc[i]);
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        kvs_store8_avx2(y + (size_t)i * c->n_out, acc[i], nc);
}

static KVS_NOINLINE void q8l_group(int R, const mm_ctx *c, int r, const char *pk, float *y, int nc)
{
    switch (R) {
    case 1: q8l_tile(1, c, r, pk, y, nc); break;
    case 2: q8l_tile(2, c, r, pk, y, nc); break;
    case 3: q8l_tile(3, c, r, pk, y, nc); break;
    default: q8l_tile(4, c, r, pk, y, nc); break;
    }
}

static void q8l_rows(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    for (int o = o0; o < o1; o += 8) {
        const int nc = o1 - o < 8 ? o1 - o : 8;
        q8l_pack(c, o, nc, scratch);
        for (int r = r0; r < r1; r += 4)
            q8l_group(r1 - r < 4 ? r1 - r : 4, c, r, scratch, c->y + (size_t)r * c->n_out + o, nc);
    }
}
#endif

/* 1 when AVX2's Q8_0 lane tiles (q8l_rows) take a call of n_rows x rows. */
static int q8l_takes(kvs_dtype wt, int n_rows)
{
#if KVS_AVX2
    return wt == KVS_Q8_0 && n_rows >= Q8L_MIN_ROWS;
#else
    (void)wt, (void)n_rows;
    return 0;
#endif
}

/* A row converted to fp32; with AVX2 also room for a packed F32 panel (f32_tiles). */
static size_t portable_scratch_bytes(int K)
{
#if KVS_AVX2
    const size_t panel = (size_t)16 * (K < F2_KC ? K : F2_KC);
    return align64((panel > (size_t)K ? panel : (size_t)K) * sizeof(float));
#else
    return align64((size_t)K * sizeof(float));
#endif
}

/* 1 when AVX2's packed F32 panels (f32_tiles) take a call of n_rows x rows: F32, F16 or BF16
 * weights and at least F2_MIN_ROWS rows; the work split gives them whole panels. */
static int f32_panel_rows(kvs_dtype wt, int n_rows)
{
#if KVS_AVX2
    return (wt == KVS_F32 || wt == KVS_F16 || wt == KVS_BF16) && n_rows >= F2_MIN_ROWS;
#else
    (void)wt, (void)n_rows;
    return 0;
#endif
}

static void portable_rows(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    const int K = c->n_in;
    float *wrow = (float *)scratch;
#if KVS_AVX2
    if (c->wt == KVS_Q8_0) {
        if (r1 - r0 >= Q8L_MIN_ROWS)
            q8l_rows(c, scratch, r0, r1, o0, o1);
        else if (r1 - r0 >= Q8_TILE_MIN_ROWS)
            q8_tiles(c, wrow, r0, r1, o0, o1);
        else
            q8_avx2(c, r0, r1, o0, o1);
        return;
    }
    /* F32 with one x row (decode) stays on the per-row dots below: this kernel streamed the
     * weights from DRAM more slowly there (bench_matmul's model decode 14-22 GB/s against
     * 23-28, alternating runs; with 2 or 1 weight rows at a time, with or without prefetch) */
    if (f32_panel_rows(c->wt, r1 - r0)) {
        f32_tiles(c, wrow, r0, r1, o0, o1);
        return;
    }
    if (c->wt == KVS_F32 && r1 - r0 > 1) {
        f32_avx2(c, r0, r1, o0, o1);
        return;
    }
#endif
    for (int o = o0; o < o1; o++) {
        const char *row = c->w + (size_t)o * c->row_bytes;
        if (c->wt == KVS_Q8_0 || c->wt == KVS_Q4_0) {
            for (int r = r0; r < r1; r++)
                c->y[(size_t)r * c->n_out + o] = dot_row_q(c, row, r);
            continue;
        }
        const float *wf = (const float *)row;
        if (c->wt != KVS_F32) {
            kvs_dequantize_row(c->wt, row, wrow, K);
            wf = wrow;
        }
        for (int r = r0; r < r1; r++)
            c->y[(size_t)r * c->n_out + o] = kvs_dot_f32(c->x + (size_t)r * K, wf, K);
    }
}

/* ========================================================================================== */
/* Dispatch                                                                                   */

/* Which kernels a call uses. */
enum { PATH_PORTABLE, PATH_GEMV, PATH_TILE };

static int choose_path(kvs_dtype wt, int n_rows)
{
#if KVS_AVX512
    const int quant = wt == KVS_Q8_0 || wt == KVS_Q4_0;
#if !KVS_AVX512_VNNI
    if (quant)
        return PATH_PORTABLE;
#endif
    (void)quant;
    return n_rows < KVS_TILE_MIN_ROWS(wt) ? PATH_GEMV : PATH_TILE;
#else
    (void)wt;
    (void)n_rows;
    return PATH_PORTABLE;
#endif
}

typedef struct {
    mm_ctx *c;
    int path;
} mm_task;

static void run_path(const mm_ctx *c, int path, char *scratch, int r0, int r1, int o0, int o1)
{
    switch (path) {
#if KVS_AVX512
    case PATH_GEMV:
        for (int r = r0; r < r1; r += 4) {
            const int nr = r1 - r < 4 ? r1 - r : 4;
            switch (c->wt) {
            case KVS_F32: gemv_f32(c, r, nr, o0, o1); break;
            case KVS_F16: gemv_f16(c, r, nr, o0, o1); break;
            case KVS_BF16: gemv_bf16(c, r, nr, o0, o1); break;
#if KVS_AVX512_VNNI
            case KVS_Q8_0: gemv_q8_0(c, r, nr, o0, o1); break;
            case KVS_Q4_0: gemv_q4_0(c, r, nr, o0, o1); break;
#endif
            default: break; /* the dequant.h types never get here (kvs_matmul_deq) */
            }
        }
        break;
    case PATH_TILE:
#if KVS_AVX512_VNNI
        if (c->wt == KVS_Q8_0 || c->wt == KVS_Q4_0) {
            tile_q(c, scratch, r0, r1, o0, o1);
            break;
        }
#endif
        tile_float(c, scratch, r0, r1, o0, o1);
        break;
#endif
    default:
        portable_rows(c, scratch, r0, r1, o0, o1);
        break;
    }
}

static void matmul_task(void *p, int ith, int nth)
{
    const mm_task *t = p;
    mm_ctx *c = t->c;
    char *scratch = c->thread_scratch + (size_t)ith * c->thread_scratch_bytes;
    if (c->by_rows) { /* few columns, many rows: static split of the rows */
        int r0, r1;
        split_range(c->n_rows, 1, ith, nth, &r0, &r1);
        if (r0 < r1)
            run_path(c, t->path, scratch, r0, r1, 0, c->n_out);
        return;
    }
    int u0, u1;
    while (kvs_split_next(&c->split, ith, &u0, &u1)) {
        const int o0 = u0 * c->unit, o1 = u1 * c->unit < c->n_out ? u1 * c->unit : c->n_out;
        run_path(c, t->path, scratch, 0, c->n_rows, o0, o1);
    }
}

/* Runs fn single-threaded when there is no pool. */
static void run(kvs_pool *pool, kvs_task_fn fn, void *ctx)
{
    if (pool)
        kvs_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* The weight types the kernels above handle: a type added to dtype.h is refused here until it
 * has one, rather than leaving y unwritten. */
static int has_kernel(kvs_dtype wt)
{
    switch (wt) {
    case KVS_F32: case KVS_F16: case KVS_BF16: case KVS_Q8_0: case KVS_Q4_0: return 1;
    default: break;
    }
    return 0;
}

kvs_status kvs_matmul(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                      int n_rows, int n_in, int n_out)
{
    return kvs_matmul_ex(pool, y, x, w, wt, n_rows, n_in, n_out, 0);
}

kvs_status kvs_matmul_ex(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                         int n_rows, int n_in, int n_out, int exact)
{
    uint64_t row_bytes;
    if (!has_kernel(wt) && !kvs_deq_type(wt))
        return KVS_ERR_UNSUPPORTED;
    if (n_rows < 0 || n_out < 0 || n_in < 0 || kvs_dtype_bytes(wt, (uint64_t)n_in, &row_bytes) != 0)
        return KVS_ERR_ARG;
    if (n_rows == 0 || n_out == 0)
        return KVS_OK;
    if (n_in == 0) {
        memset(y, 0, (size_t)n_rows * n_out * sizeof(float));
        return KVS_OK;
    }
    /* exact: every block type as fp32 x times dequantised W (matmul_deq.c) */
    if (exact && kvs_dequantize_fn(wt))
        return kvs_matmul_deq(pool, y, x, w, wt, n_rows, n_in, n_out);
    /* Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0, Q5_1: 8-bit x, integer dots (matmul_kq.c) */
    if (kvs_kq_type(wt))
        return kvs_matmul_kq(pool, y, x, w, wt, n_rows, n_in, n_out);
    if (kvs_deq_type(wt)) /* Q2_K, Q3_K: fp32 x, dequantised W */
        return kvs_matmul_deq(pool, y, x, w, wt, n_rows, n_in, n_out);
    const int nth = pool ? kvs_pool_size(pool) : 1;
    const int quant = wt == KVS_Q8_0 || wt == KVS_Q4_0;
    const int path = choose_path(wt, n_rows);

    mm_ctx c;
    memset(&c, 0, sizeof c);
    c.y = y;
    c.x = x;
    c.w = w;
    c.wt = wt;
    c.n_rows = n_rows;
    c.n_in = n_in;
    c.n_out = n_out;
    c.row_bytes = (size_t)row_bytes;

    /* scratch layout: [quantised x][per-thread buffers] */
    size_t xq_bytes = 0;
    if (quant) {
        c.nb = n_in / KVS_QK;
        c.nbp = (c.nb + 15) & ~15;
        c.offset = wt == KVS_Q8_0 ? 128 : 8;
        c.xperm4 = wt == KVS_Q4_0 && path == PATH_GEMV;
        xq_bytes = align64((size_t)n_rows * c.nbp * KVS_QK) + 2 * align64((size_t)n_rows * c.nbp * 4);
        if (path == PATH_GEMV)
            xq_bytes += align64((size_t)n_rows * c.nbp * 8 * 4);
    }
    size_t per_thread = portable_scratch_bytes(n_in);
#if KVS_AVX2
    if (path == PATH_PORTABLE && q8l_takes(wt, n_rows) && q8l_scratch_bytes(c.nb) > per_thread)
        per_thread = q8l_scratch_bytes(c.nb);
#endif
#if KVS_AVX512
    if (path == PATH_TILE) {
#if KVS_AVX512_VNNI
        if (quant)
            per_thread = qtile_scratch_bytes(c.nb);
        else
#endif
            per_thread = ftile_scratch_bytes(n_in);
    }
#endif
    c.thread_scratch_bytes = per_thread;
    const size_t total = xq_bytes + per_thread * (size_t)nth;
    char *mem = NULL, *owned = NULL;
    if (pool)
        mem = kvs_pool_scratch(pool, total);
    else
        mem = owned = aligned_alloc(64, align64(total));
    if (!mem)
        return KVS_ERR_NOMEM;
    if (quant) {
        c.xq = (int8_t *)mem;
        c.xd = (float *)(mem + align64((size_t)n_rows * c.nbp * KVS_QK));
        c.xbias = (int32_t *)((char *)c.xd + align64((size_t)n_rows * c.nbp * 4));
        if (path == PATH_GEMV)
            c.xbv = (int32_t *)((char *)c.xbias + align64((size_t)n_rows * c.nbp * 4));
    }
    c.thread_scratch = mem + xq_bytes;

    if (quant) {
        if (n_rows < 4 * nth || nth == 1)
            quantize_x_rows(&c, 0, n_rows);
        else
            run(pool, quantize_x_task, &c);
    }
    /* Work split (core/worksplit.h): columns in units of 16 for the tile kernels' panels (also
     * AVX2's F32 / F16 / BF16 panels, f32_tiles: in units of 4 a thread could take 8 columns,
     * half a panel, as attention's 64-column products did at two threads), of 4 for the gemv
     * kernels; grains of a quarter share for the tiles, of about 32 KiB of weights for gemv.
     * Rows instead when there are too few columns to go around and plenty of rows. */
    const int panels = path == PATH_PORTABLE && (f32_panel_rows(wt, n_rows) || q8l_takes(wt, n_rows));
    c.unit = path == PATH_TILE || panels ? 16 : 4;
    const int col_units = (n_out + c.unit - 1) / c.unit;
    c.by_rows = kvs_split_by_rows(col_units, n_rows, nth);
    kvs_split_init(&c.split, col_units, nth,
                   kvs_split_grain(col_units, nth, path == PATH_GEMV ? c.unit * c.row_bytes : 0));
    mm_task t = {&c, path};
    run(pool, matmul_task, &t);
    free(owned);
    return KVS_OK;
}
