/* kvs_matmul: y[r][o] = dot(x[r], W[o]) for F32 / F16 / BF16 / Q8_0 / Q4_0 weights.
 *
 * Paths (chosen at compile time by the target ISA, at run time by shape):
 *
 *  AVX-512 (F, BW, VL, DQ; VNNI for the quantised types):
 *   - "gemv" (n_rows < KVS_TILE_MIN_ROWS, i.e. decode): weights are streamed once, straight from
 *     their storage format; up to 4 x rows share each weight load. Float types: 4 weight rows at
 *     a time, FMA into 16-lane accumulators, horizontal sums at the end. Quantised types: x is
 *     quantised to 8-bit blocks once; each pair of weight blocks becomes one zmm of unsigned
 *     bytes (Q8_0: q ^ 0x80 = q + 128; Q4_0: the raw nibbles 0..15) and is multiplied into the
 *     signed x bytes with VPDPBUSD. The offset (128 or 8) times sum(x block) is folded into the
 *     initial accumulator, so no sign tricks are needed and q = -128 weights are handled.
 *   - "tile" (n_rows >= KVS_TILE_MIN_ROWS, prefill): output columns are processed in panels of
 *     16*C columns. The panel of W is packed once per thread ("k-major": for every k a row of
 *     16*C weights, converted to fp32 for F16/BF16; for the quantised types, per block and per
 *     16 columns, 8 zmm of 16 lanes x 4 consecutive k bytes plus 16 fp32 scales), then reused
 *     by every row of x through an R x C register-blocked micro-kernel: for each k, x[r][k] is
 *     broadcast and multiplied into C zmm of packed weights (FMA for floats; VPDPBUSD with a
 *     broadcast 4-byte group of x for the quantised types, then one cvt + mul + FMA per block).
 *  AVX2+FMA+F16C: dot-product kernels per weight row (F16/BF16 rows converted to fp32 first;
 *     quantised types with the maddubs pattern, |w| times sign-adjusted x).
 *  Scalar: plain loops with the same arithmetic definitions.
 *
 * Quantised types quantise x to 8-bit blocks of 32 with a *fp32* scale d = amax/127 and
 * q = rint(x / d) (round half to even, as GGML's SIMD quantiser does); the reference for tests
 * is kvs_matmul_ref on the dequantised x. Threads split the output columns (or, when there are
 * few columns and many rows, the rows). */
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "kernels.h"
#include "kernels_internal.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

#define KVS_TILE_MIN_ROWS 4

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
    int32_t offset; /* 128 for Q8_0, 8 for Q4_0 (what the unsigned weight bytes carry) */

    /* Per-thread scratch (packing / row conversion). */
    char *thread_scratch;
    size_t thread_scratch_bytes;

    int tile; /* 1: packed tile kernels, 0: gemv kernels */
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
        if (nbp > nb) {
            memset(q + (size_t)nb * KVS_QK, 0, (size_t)(nbp - nb) * KVS_QK);
            memset(d + nb, 0, (size_t)(nbp - nb) * sizeof(float));
            memset(bias + nb, 0, (size_t)(nbp - nb) * sizeof(int32_t));
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

/* Horizontal sums of 4 vectors -> 4 floats. */
KVS_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    /* fold 512 -> 256 */
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 ab = _mm256_hadd_ps(a8, b8); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c8, d8);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0123 b0123 c0123 d0123 | a4567 ... */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* ---- float gemv: NR x rows (1..4) x 4 weight rows per step ---- */
KVS_INLINE void gemv_float_nr(const mm_ctx *c, int NR, int r0, int o0, int o1, kvs_dtype wt)
{
    const int K = c->n_in;
    const float *xr[4];
    for (int r = 0; r < NR; r++)
        xr[r] = c->x + (size_t)(r0 + r) * K;
    const int kfull = K & ~15;
    const __mmask16 mt = mask16(K - kfull);
    int o = o0;
    for (; o + 4 <= o1; o += 4) {
        const char *w0 = c->w + (size_t)o * c->row_bytes;
        const char *w1 = w0 + c->row_bytes, *w2 = w1 + c->row_bytes, *w3 = w2 + c->row_bytes;
        __m512 acc[4][4];
        for (int r = 0; r < NR; r++)
            for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_setzero_ps();
        for (int k = 0; k < kfull; k += 16) {
            const __m512 a0 = load_w16_full(wt, w0, k), a1 = load_w16_full(wt, w1, k);
            const __m512 a2 = load_w16_full(wt, w2, k), a3 = load_w16_full(wt, w3, k);
            for (int r = 0; r < NR; r++) {
                const __m512 xv = _mm512_loadu_ps(xr[r] + k);
                acc[r][0] = _mm512_fmadd_ps(xv, a0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, a1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(xv, a2, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(xv, a3, acc[r][3]);
            }
        }
        if (kfull < K) {
            const __m512 a0 = load_w16(wt, w0, kfull, mt), a1 = load_w16(wt, w1, kfull, mt);
            const __m512 a2 = load_w16(wt, w2, kfull, mt), a3 = load_w16(wt, w3, kfull, mt);
            for (int r = 0; r < NR; r++) {
                const __m512 xv = _mm512_maskz_loadu_ps(mt, xr[r] + kfull);
                acc[r][0] = _mm512_fmadd_ps(xv, a0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, a1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(xv, a2, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(xv, a3, acc[r][3]);
            }
        }
        for (int r = 0; r < NR; r++)
            _mm_storeu_ps(c->y + (size_t)(r0 + r) * c->n_out + o,
                          hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    }
    for (; o < o1; o++) {
        const char *w0 = c->w + (size_t)o * c->row_bytes;
        __m512 acc[4];
        for (int r = 0; r < NR; r++)
            acc[r] = _mm512_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            const __mmask16 m = mask16(K - k);
            const __m512 a0 = load_w16(wt, w0, k, m);
            for (int r = 0; r < NR; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xr[r] + k), a0, acc[r]);
        }
        for (int r = 0; r < NR; r++)
            c->y[(size_t)(r0 + r) * c->n_out + o] = _mm512_reduce_add_ps(acc[r]);
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

/* Weight bytes of blocks b and b+1 (only b if !two) as 64 unsigned bytes in natural order. */
KVS_INLINE __m512i load_wpair_q8(const char *row, int b, int two)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(row + (size_t)b * 34 + 2));
    const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(row + (size_t)(b + 1) * 34 + 2))
                           : _mm256_setzero_si256();
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                            _mm512_set1_epi8((char)0x80));
}

KVS_INLINE __m512i load_wpair_q4(const char *row, int b, int two)
{
    const __m128i qa = _mm_loadu_si128((const __m128i *)(row + (size_t)b * 18 + 2));
    const __m128i qb = two ? _mm_loadu_si128((const __m128i *)(row + (size_t)(b + 1) * 18 + 2))
                           : _mm_setzero_si128();
    const __m256i ya = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), _mm_srli_epi16(qa, 4), 1);
    const __m256i yb = _mm256_inserti128_si256(_mm256_castsi128_si256(qb), _mm_srli_epi16(qb, 4), 1);
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(ya), yb, 1),
                            _mm512_set1_epi8(0x0f));
}

/* fp32 scales of blocks b0 .. b0+n-1 (n <= 16) of a quantised row. */
KVS_INLINE __m512 load_wscales(const char *row, int b0, int n, int block_bytes)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(block_bytes));
    const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask16(n), idx,
                                                  row + (size_t)b0 * block_bytes, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
}

KVS_INLINE void gemv_q_nr(const mm_ctx *c, int NR, int r0, int o0, int o1, kvs_dtype wt)
{
    const int nb = c->nb, nbp = c->nbp;
    const int bb = wt == KVS_Q8_0 ? 34 : 18;
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xbias[4];
    for (int r = 0; r < NR; r++) {
        xq[r] = c->xq + (size_t)(r0 + r) * nbp * KVS_QK;
        xd[r] = c->xd + (size_t)(r0 + r) * nbp;
        xbias[r] = c->xbias + (size_t)(r0 + r) * nbp;
    }
    /* lanes 0-7 take block 2p, lanes 8-15 block 2p+1 */
    for (int o = o0; o < o1; o++) {
        const char *row = c->w + (size_t)o * c->row_bytes;
        __m512 acc[4];
        for (int r = 0; r < NR; r++)
            acc[r] = _mm512_setzero_ps();
        for (int g = 0; g < nb; g += 16) {
            const int ng = nb - g < 16 ? nb - g : 16;
            const __m512 dw = load_wscales(row, g, ng, bb);
            __m512 sc[4];
            __m512i bias[4];
            for (int r = 0; r < NR; r++) {
                sc[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd[r] + g));
                bias[r] = _mm512_loadu_si512(xbias[r] + g);
            }
            for (int p = 0; p < ng; p += 2) {
                const int two = p + 1 < ng;
                const __m512i wv = wt == KVS_Q8_0 ? load_wpair_q8(row, g + p, two)
                                                  : load_wpair_q4(row, g + p, two);
                const __m512i idx = _mm512_or_si512(
                    _mm512_set1_epi32(p),
                    _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
                for (int r = 0; r < NR; r++) {
                    const __m512i b0 = _mm512_maskz_permutexvar_epi32(0x0101, idx, bias[r]);
                    const __m512i xv = _mm512_load_si512(xq[r] + (size_t)(g + p) * KVS_QK);
                    const __m512i dp = _mm512_dpbusd_epi32(b0, wv, xv);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp),
                                             _mm512_permutexvar_ps(idx, sc[r]), acc[r]);
                }
            }
        }
        for (int r = 0; r < NR; r++)
            c->y[(size_t)(r0 + r) * c->n_out + o] = _mm512_reduce_add_ps(acc[r]);
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

/* Packs columns [o0, o0+nc) of W, all K, as bp[k][16*C] fp32 (zero padded). */
static void pack_float_panel(const mm_ctx *c, int o0, int nc, int C, float *bp)
{
    const int K = c->n_in, ld = 16 * C;
    if (nc < ld)
        for (int k = 0; k < K; k++)
            memset(bp + (size_t)k * ld + nc, 0, (size_t)(ld - nc) * sizeof(float));
    /* 16 columns x 16 k at a time through a register transpose would be faster; the simple
     * column-at-a-time copy below costs ~2-4% of a 512-row prefill. */
    float tmp[16];
    for (int j = 0; j < nc; j++) {
        const char *row = c->w + (size_t)(o0 + j) * c->row_bytes;
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            _mm512_storeu_ps(tmp, load_w16_full(c->wt, row, k));
            for (int t = 0; t < 16; t++)
                bp[(size_t)(k + t) * ld + j] = tmp[t];
        }
        if (k < K) {
            _mm512_storeu_ps(tmp, load_w16(c->wt, row, k, mask16(K - k)));
            for (int t = 0; k + t < K; t++)
                bp[(size_t)(k + t) * ld + j] = tmp[t];
        }
    }
}

/* y[r][0..nc) = sum_k x[r][k] * bp[k][..] for R rows, C column groups. */
KVS_INLINE void ftile_kernel(int R, int C, int K, const float *x, int ldx, const float *bp,
                             float *y, int ldy, int nc)
{
    __m512 acc[FT_R][FT_C];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++)
            acc[r][j] = _mm512_setzero_ps();
    const int ld = 16 * C;
    for (int k = 0; k < K; k++) {
        __m512 b[FT_C];
        for (int j = 0; j < C; j++)
            b[j] = _mm512_load_ps(bp + (size_t)k * ld + 16 * j);
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)r * ldx + k]);
            for (int j = 0; j < C; j++)
                acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++)
            _mm512_mask_storeu_ps(y + (size_t)r * ldy + 16 * j, mask16(nc - 16 * j), acc[r][j]);
}

#define DEF_FTILE(R, C)                                                                         \
    static KVS_NOINLINE void ftile_##R##_##C(int K, const float *x, int ldx, const float *bp,   \
                                             float *y, int ldy, int nc)                         \
    {                                                                                           \
        ftile_kernel(R, C, K, x, ldx, bp, y, ldy, nc);                                          \
    }
#define DEF_FTILE_C(C)                                                                          \
    DEF_FTILE(1, C) DEF_FTILE(2, C) DEF_FTILE(3, C) DEF_FTILE(4, C) DEF_FTILE(5, C)             \
        DEF_FTILE(6, C) DEF_FTILE(7, C) DEF_FTILE(8, C)
DEF_FTILE_C(1)
DEF_FTILE_C(2)
DEF_FTILE_C(3)

typedef void (*ftile_fn)(int, const float *, int, const float *, float *, int, int);
static const ftile_fn ftile_table[FT_C][FT_R] = {
    {ftile_1_1, ftile_2_1, ftile_3_1, ftile_4_1, ftile_5_1, ftile_6_1, ftile_7_1, ftile_8_1},
    {ftile_1_2, ftile_2_2, ftile_3_2, ftile_4_2, ftile_5_2, ftile_6_2, ftile_7_2, ftile_8_2},
    {ftile_1_3, ftile_2_3, ftile_3_3, ftile_4_3, ftile_5_3, ftile_6_3, ftile_7_3, ftile_8_3},
};

static size_t ftile_scratch_bytes(int K) { return align64((size_t)K * 16 * FT_C * sizeof(float)); }

static void tile_float(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    float *bp = (float *)scratch;
    const int K = c->n_in;
    for (int o = o0; o < o1; o += 16 * FT_C) {
        const int nc = o1 - o < 16 * FT_C ? o1 - o : 16 * FT_C;
        const int C = (nc + 15) / 16;
        pack_float_panel(c, o, nc, C, bp);
        for (int r = r0; r < r1; r += FT_R) {
            const int R = r1 - r < FT_R ? r1 - r : FT_R;
            ftile_table[C - 1][R - 1](K, c->x + (size_t)r * K, K, bp, c->y + (size_t)r * c->n_out + o,
                                      c->n_out, nc);
        }
    }
}

/* ---- packed quantised tiles ---- */
#if KVS_AVX512_VNNI

#define QT_R 4
#define QT_C 3
#define QPACK_BYTES 576 /* 8 x 64 weight bytes + 16 fp32 scales, per block per 16 columns */

/* Packs columns [o0, o0+nc) as pk[b][C][576]: for k4 in 0..7 a 64-byte vector whose lane j holds
 * weight bytes 4*k4 .. 4*k4+3 of block b of column j (unsigned), then 16 scales. */
static void pack_q_panel(const mm_ctx *c, int o0, int nc, int C, char *pk)
{
    const int nb = c->nb;
    for (int b = 0; b < nb; b++) {
        for (int g = 0; g < C; g++) {
            char *dst = pk + ((size_t)b * C + g) * QPACK_BYTES;
            uint32_t *dw = (uint32_t *)dst;
            float *sc = (float *)(dst + 512);
            for (int j = 0; j < 16; j++) {
                const int col = 16 * g + j;
                if (col >= nc) {
                    for (int k4 = 0; k4 < 8; k4++)
                        dw[k4 * 16 + j] = 0;
                    sc[j] = 0.0f;
                    continue;
                }
                const char *row = c->w + (size_t)(o0 + col) * c->row_bytes;
                if (c->wt == KVS_Q8_0) {
                    const kvs_block_q8_0 *blk = (const kvs_block_q8_0 *)row + b;
                    sc[j] = kvs_fp16_to_fp32_scalar(blk->d);
                    for (int k4 = 0; k4 < 8; k4++) {
                        uint32_t v;
                        memcpy(&v, blk->qs + 4 * k4, 4);
                        dw[k4 * 16 + j] = v ^ 0x80808080u;
                    }
                } else {
                    const kvs_block_q4_0 *blk = (const kvs_block_q4_0 *)row + b;
                    sc[j] = kvs_fp16_to_fp32_scalar(blk->d);
                    for (int k4 = 0; k4 < 4; k4++) {
                        uint32_t v;
                        memcpy(&v, blk->qs + 4 * k4, 4);
                        dw[k4 * 16 + j] = v & 0x0f0f0f0fu;
                        dw[(k4 + 4) * 16 + j] = (v >> 4) & 0x0f0f0f0fu;
                    }
                }
            }
        }
    }
}

KVS_INLINE void qtile_kernel(int R, int C, const mm_ctx *c, int r, const char *pk, float *y,
                             int nc)
{
    const int nb = c->nb, nbp = c->nbp;
    __m512 facc[QT_R][QT_C];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++)
            facc[i][j] = _mm512_setzero_ps();
    const int8_t *xq = c->xq + (size_t)r * nbp * KVS_QK;
    const float *xd = c->xd + (size_t)r * nbp;
    const int32_t *xb = c->xbias + (size_t)r * nbp;
    const size_t xqs = (size_t)nbp * KVS_QK;
    for (int b = 0; b < nb; b++) {
        const char *pb = pk + (size_t)b * C * QPACK_BYTES;
        __m512i iacc[QT_R][QT_C];
        for (int i = 0; i < R; i++) {
            const __m512i bias = _mm512_set1_epi32(xb[(size_t)i * nbp + b]);
            for (int j = 0; j < C; j++)
                iacc[i][j] = bias;
        }
        for (int k4 = 0; k4 < 8; k4++) {
            __m512i wv[QT_C];
            for (int j = 0; j < C; j++)
                wv[j] = _mm512_load_si512(pb + (size_t)j * QPACK_BYTES + 64 * k4);
            for (int i = 0; i < R; i++) {
                int32_t xv4;
                memcpy(&xv4, xq + i * xqs + (size_t)b * KVS_QK + 4 * k4, 4);
                const __m512i xv = _mm512_set1_epi32(xv4);
                for (int j = 0; j < C; j++)
                    iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], wv[j], xv);
            }
        }
        for (int i = 0; i < R; i++) {
            const __m512 dx = _mm512_set1_ps(xd[(size_t)i * nbp + b]);
            for (int j = 0; j < C; j++) {
                const __m512 s = _mm512_mul_ps(_mm512_load_ps((const float *)(pb + (size_t)j * QPACK_BYTES + 512)), dx);
                facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i][j]), s, facc[i][j]);
            }
        }
    }
    for (int i = 0; i < R; i++)
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
/* Portable (scalar / AVX2) kernels: one weight row at a time against every x row.            */

#if KVS_AVX2
KVS_INLINE float hsum256(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

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
    return hsum256(acc);
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

static float dot_f32_portable(const float *a, const float *b, int n)
{
    /* kvs_dot_f32 is vectorised where available */
    return kvs_dot_f32(a, b, n);
}

static size_t portable_scratch_bytes(int K) { return align64((size_t)K * sizeof(float)); }

static void portable_rows(const mm_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    const int K = c->n_in;
    float *wrow = (float *)scratch;
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
            c->y[(size_t)r * c->n_out + o] = dot_f32_portable(c->x + (size_t)r * K, wf, K);
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
    return n_rows < KVS_TILE_MIN_ROWS ? PATH_GEMV : PATH_TILE;
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

static void matmul_task(void *p, int ith, int nth)
{
    const mm_task *t = p;
    const mm_ctx *c = t->c;
    char *scratch = c->thread_scratch + (size_t)ith * c->thread_scratch_bytes;
    int r0 = 0, r1 = c->n_rows, o0 = 0, o1 = c->n_out;

    /* Split columns (in units of 16, or 4 for gemv) unless there are too few of them to go
     * around while there are plenty of rows. */
    const int unit = t->path == PATH_TILE ? 16 : 4;
    const int col_units = (c->n_out + unit - 1) / unit;
    if (col_units >= 2 * nth || c->n_rows < 2 * nth)
        split_range(c->n_out, unit, ith, nth, &o0, &o1);
    else
        split_range(c->n_rows, 1, ith, nth, &r0, &r1);
    if (r0 >= r1 || o0 >= o1)
        return;

    switch (t->path) {
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
#else
            default: break;
#endif
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

/* Runs fn single-threaded when there is no pool. */
static void run(kvs_pool *pool, kvs_task_fn fn, void *ctx)
{
    if (pool)
        kvs_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

void kvs_matmul(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                int n_rows, int n_in, int n_out)
{
    uint64_t row_bytes;
    if (n_rows <= 0 || n_out <= 0 || n_in < 0 || kvs_dtype_bytes(wt, (uint64_t)n_in, &row_bytes) != 0)
        return;
    if (n_in == 0) {
        memset(y, 0, (size_t)n_rows * n_out * sizeof(float));
        return;
    }
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
    c.tile = path == PATH_TILE;

    /* scratch layout: [quantised x][per-thread buffers] */
    size_t xq_bytes = 0;
    if (quant) {
        c.nb = n_in / KVS_QK;
        c.nbp = (c.nb + 15) & ~15;
        c.offset = wt == KVS_Q8_0 ? 128 : 8;
        xq_bytes = align64((size_t)n_rows * c.nbp * KVS_QK) + 2 * align64((size_t)n_rows * c.nbp * 4);
    }
    size_t per_thread = portable_scratch_bytes(n_in);
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
        abort(); /* out of memory for scratch: nothing sensible to return */
    if (quant) {
        c.xq = (int8_t *)mem;
        c.xd = (float *)(mem + align64((size_t)n_rows * c.nbp * KVS_QK));
        c.xbias = (int32_t *)((char *)c.xd + align64((size_t)n_rows * c.nbp * 4));
    }
    c.thread_scratch = mem + xq_bytes;

    if (quant) {
        if (n_rows < 4 * nth || nth == 1)
            quantize_x_rows(&c, 0, n_rows);
        else
            run(pool, quantize_x_task, &c);
    }
    mm_task t = {&c, path};
    run(pool, matmul_task, &t);
    free(owned);
}
