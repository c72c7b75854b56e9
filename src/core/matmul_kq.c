/* kvs_matmul for Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0 and Q5_1 weights: 8-bit activations times
 * the raw quants. */
/*
 * Arithmetic (kvs_matmul_kq_ref in matmul_kq.h defines it): x is quantised per block of 32 as
 * kernels_matmul.c does for Q8_0 (fp32 xd = amax / 127, q = rint(x / xd)). The weights are used
 * as their raw unsigned quants u (Q4_K, Q4_1 0..15, Q5_K, Q5_0, Q5_1 0..31, Q6_K 0..63, IQ4_NL
 * kvalue + 128 in 1..241) times the signed x bytes with VPDPBUSD; every per-sub-block constant
 * is applied after the integer sums:
 *   Q4_K / Q5_K: y += (d sc_s) xd_b sum(u q) - (dmin m_s) xd_b sum(q)
 *   Q6_K:        y += (d sc_s) xd_b (sum(u q) - 32 sum(q))
 *   IQ4_NL:      y += d xd_b (sum((kv + 128) q) - 128 sum(q))
 *   Q4_1 / Q5_1: y += d xd_b sum(u q) + m xd_b sum(q)
 *   Q5_0:        y += d xd_b (sum(u q) - 16 sum(q))
 * The x sums are computed once per x row and shared by every output column; the -32 / -128 / -16
 * terms are integers and start the VPDPBUSD sums, lane by lane (each lane then holds an exact
 * sum of (u - offset) q, so nothing cancels after the conversion to fp32). Against the exact
 * path (matmul_deq.c: fp32 x, dequantised weights) the results differ by the activation
 * rounding only (bounded by sum |w| xd / 2), as llama.cpp's CPU kernels do (which use one x
 * scale per 256 for the K-quants, where this uses one per 32).
 *
 * Paths (AVX-512 VNNI; without it, Q4_K / Q5_K / Q6_K on AVX2 (below, on kvs_matmul_kq_ref_sb's
 * x: row kernels for decode and short chunks, 8-column lane tiles from KQ2_TILE_MIN_ROWS x rows),
 * the other types the reference's scalar block dots on x quantised once):
 *  - gemv (n_rows < KQ_TILE_MIN_ROWS, decode): each weight row is streamed once, one K-quant
 *    super-block (256 elements) at a time, unpacked into four 64-byte vectors of u with no byte
 *    moved: Q4_K's low nibbles of qs[0..63] are elements 0..31 and 64..95, the high nibbles
 *    32..63 and 96..127, etc., and x is stored permuted per super-block to match; Q5_K's and
 *    Q6_K's high bits come from broadcast qh bytes, one variable shift per vector. The 6-bit
 *    (8-bit) scales become one vector of 16 fp32 constants [d sc_s | dmin m_s] (Q6_K: d sc_g).
 *    Per x row (up to 4 share the unpacking): the constants times their blocks' xd (1 mul), 4
 *    VPDPBUSD, 4 conversions, 4 permutations of the scaled constants to the lanes, 4 FMA, and
 *    one FMA for the min term. The block-of-32 types go by pairs of blocks of 32 (as Q4_0 in
 *    kernels_matmul.c, with its x layout): IQ4_NL's nibbles to kvalue + 128 with one VPSHUFB,
 *    Q5_0 / Q5_1's bit 4 added under a 64-bit byte mask built from the two blocks' qh, and
 *    Q4_1 / Q5_1's m xd_b sum(q) as one masked FMA per group of 8 blocks (m times the per-block
 *    xd_b sum(q) precomputed with x).
 *  - tile (prefill): each thread packs a panel of 16 * KQ_C columns once (per block of 32 and
 *    16 columns: 8 vectors of 16 lanes x 4 consecutive u bytes, then 2 x 16 fp32 constants;
 *    the scales unpacked once per super-block) and reuses it for every x row through a
 *    KQ_R x 16 KQ_C register-blocked VPDPBUSD micro-kernel with a broadcast 4-byte group of x:
 *    per block one conversion, multiplication and FMA per tile vector, plus an FMA for the
 *    Q4_K / Q5_K / Q4_1 / Q5_1 min term, or a second set for Q6_K's two sub-blocks of 16.
 *
 * Speed, development VM (AMD EPYC Zen 4, 2 vCPUs shared with other jobs: ranges over 2-4 runs
 * of bench_matmul 10 in quiet periods; shapes 768x768, 768x2048, 2048x768), one thread;
 * "exact" is kvs_matmul_deq on the same weights (prefill GFLOP/s / hot / model GB/s):
 *              prefill 512 rows   decode hot   decode model (84 distinct matrices)
 *   q8_0       590-625 GFLOP/s    42-45 GB/s   16-19 GB/s   (kernels_matmul.c, for reference)
 *   q4_K       531-553            32           23-27        exact: 115 / 4.6 / 3.9
 *   q5_K       528-537            36           27-28        exact: 119 / 5.0 / 4.3
 *   q6_K       398-451            45-47        27-33        exact: 117 / 6.5 / 5.5
 *   iq4_nl     545-564            28           22-23        exact: 108 / 6.3 / 5.0
 *   q4_1       517-529            27-28        22-23        exact: 112-113 / 8.6-8.8 / 7.6-7.9
 *   q5_0       522-556            26-27        22           exact: 110-112 / 7.9-8.3 / 5.0-7.2
 *   q5_1       517-527            27           21-22        exact: 109-112 / 8.2-8.6 / 5.1-7.3
 * (Q4_1 / Q5_0 / Q5_1 measured in 3 runs alongside q8_0 590-595 / 43-44 / 16.5 and q4_K 527-529 /
 * 31-32 / 23-24; their two-thread numbers were not measured in a quiet period.)
 * Two threads: prefill 820-950 GFLOP/s (q6_K 670-750; q8_0 920-930), decode hot 40-76 GB/s.
 * Per element, Q4_K's decode is 1.4x Q8_0's; it is bound by the vector ops (about 31 per
 * super-block and x row), not by the bytes. Q6_K's tiles pay two conversions, multiplications
 * and FMA per block (its sub-blocks of 16) where Q8_0 pays one; keeping both halves' sums in
 * registers would need more than 32 zmm.
 */
#include "matmul_kq.h"
#include "matmul_kq_internal.h"
#include "worksplit.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

/* Smallest n_rows for the packed tiles (below: gemv, up to 4 x rows per pass over W). Measured
 * on Zen 4, 768 x 2048 weights, one thread, GFLOP/s tile / gemv (median of 100 calls):
 *   rows     4        5        6        7        8        12
 *   q4_K   91/146  103/124  119/135  136/142  157/147  203/147
 *   q6_K   71/152   83/133   98/147  107/150  120/152  157/154
 *   iq4_nl 71/141   84/121   99/129  111/135  130/141  176/142
 * and the other blocks of 32 (a later run: iq4_nl 88/155 125/144 157/155 170/145 at 4 6 8 9):
 *   rows     4        6        7        8        9        12
 *   q4_1   80/149  111/134  121/137  135/149  153/138  191/150
 *   q5_0   81/145  116/134  131/143  146/149  158/134  197/149
 *   q5_1   82/136  104/122  119/129  133/136  144/122  179/136
 * (packing a panel costs more than Q8_0's, whose tiles win from 3 rows). */
#ifndef KQ_TILE_MIN_ROWS
#define KQ_TILE_MIN_ROWS(wt) ((wt) == KVS_Q6_K ? 12 : (wt) == KVS_Q4_K || (wt) == KVS_Q5_K ? 8 : 9)
#endif

int kvs_kq_type(kvs_dtype t)
{
    switch ((int)t) {
    case KVS_Q4_K: case KVS_Q5_K: case KVS_Q6_K: case KVS_IQ4_NL:
    case KVS_Q4_1: case KVS_Q5_0: case KVS_Q5_1: return 1;
    }
    return 0;
}

/* The K-quants with 256-element super-blocks (the types the AVX2 path takes). */
static int k_super_type(kvs_dtype wt) { return wt == KVS_Q4_K || wt == KVS_Q5_K || wt == KVS_Q6_K; }

/* The block-of-32 types (IQ4_NL, Q4_1, Q5_0, Q5_1), and their byte offsets in a block. */
static int b32_type(kvs_dtype wt)
{
    return wt == KVS_IQ4_NL || wt == KVS_Q4_1 || wt == KVS_Q5_0 || wt == KVS_Q5_1;
}
/* Q4_1 / Q5_1: w = d u + m (the m term applied to the x sums) */
static int b32_has_min(kvs_dtype wt) { return wt == KVS_Q4_1 || wt == KVS_Q5_1; }
static int b32_qs_off(kvs_dtype wt)
{
    return wt == KVS_Q4_1 ? 4 : wt == KVS_Q5_0 ? 6 : wt == KVS_Q5_1 ? 8 : 2;
}
static int b32_qh_off(kvs_dtype wt) { return wt == KVS_Q5_0 ? 2 : 4; } /* Q5_0 / Q5_1 */

/* ------------------------------------------------------------------------------------------ */
/* Scalar block arithmetic (the reference, and the portable path)                             */


static float amax32(const float *x)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}

/* x[0..31] -> q = rint(x / xd) through the reciprocal. */
static void quant_with(const float *x, float xd, int8_t *q)
{
    const float id = xd != 0.0f ? 1.0f / xd : 0.0f;
    for (int i = 0; i < 32; i++)
        q[i] = (int8_t)rintf(x[i] * id);
}

/* x block of 32 -> q, xd = amax / 127. */
static void quant_block32(const float *x, int8_t *q, float *xd)
{
    *xd = amax32(x) / 127.0f;
    quant_with(x, *xd, q);
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block s (0..7), packed as dtype.h describes. */
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

/* Raw unsigned quants of block b (elements 32 b .. 32 b + 31) of a weight row, in element order
 * (IQ4_NL: the 4-bit index). */
static void raw_block(kvs_dtype wt, const char *row, int b, uint8_t *u)
{
    const int p = b % 8; /* block within the super-block */
    switch ((int)wt) {
    case KVS_Q4_K: {
        const kvs_block_q4_K *k = (const kvs_block_q4_K *)row + b / 8;
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)((k->qs[32 * (p / 2) + l] >> (4 * (p % 2))) & 15);
        break;
    }
    case KVS_Q5_K: {
        const kvs_block_q5_K *k = (const kvs_block_q5_K *)row + b / 8;
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)(((k->qs[32 * (p / 2) + l] >> (4 * (p % 2))) & 15) | ((k->qh[l] >> p) & 1) << 4);
        break;
    }
    case KVS_Q6_K: {
        const kvs_block_q6_K *k = (const kvs_block_q6_K *)row + b / 8;
        const int h = p / 4, quarter = p % 4;
        for (int l = 0; l < 32; l++) {
            const uint8_t lb = k->ql[64 * h + 32 * (quarter & 1) + l];
            const int low = quarter < 2 ? lb & 15 : lb >> 4;
            u[l] = (uint8_t)(low | ((k->qh[32 * h + l] >> (2 * quarter)) & 3) << 4);
        }
        break;
    }
    case KVS_Q4_1: case KVS_Q5_0: case KVS_Q5_1: {
        const char *k = row + (size_t)b * sb_bytes(wt);
        const uint8_t *qs = (const uint8_t *)k + b32_qs_off(wt);
        uint32_t qh = 0;
        if (wt != KVS_Q4_1)
            memcpy(&qh, k + b32_qh_off(wt), 4);
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)((l < 16 ? qs[l] & 15 : qs[l - 16] >> 4) | ((qh >> l) & 1) << 4);
        break;
    }
    default: {
        const kvs_block_iq4_nl *k = (const kvs_block_iq4_nl *)row + b;
        for (int l = 0; l < 32; l++)
            u[l] = (uint8_t)(l < 16 ? k->qs[l] & 15 : k->qs[l - 16] >> 4);
        break;
    }
    }
}

/* The weight constants of block b: Q4_K / Q5_K ws[0] = d sc_s, wm[0] = dmin m_s; Q6_K ws[0..1] =
 * d sc of its two sub-blocks of 16; IQ4_NL, Q5_0 ws[0] = d; Q4_1, Q5_1 ws[0] = d, wm[0] = m. */
static void block_consts(kvs_dtype wt, const char *row, int b, float *ws, float *wm)
{
    const int p = b % 8;
    ws[0] = ws[1] = wm[0] = 0.0f;
    switch ((int)wt) {
    case KVS_Q4_K: case KVS_Q5_K: {
        const char *k = row + (size_t)(b / 8) * sb_bytes(wt);
        uint16_t d, dmin;
        memcpy(&d, k, 2);
        memcpy(&dmin, k + 2, 2);
        int sc, m;
        k4_scale_min((const uint8_t *)k + 4, p, &sc, &m);
        ws[0] = kvs_fp16_to_fp32_scalar(d) * (float)sc;
        wm[0] = kvs_fp16_to_fp32_scalar(dmin) * (float)m;
        break;
    }
    case KVS_Q6_K: {
        const kvs_block_q6_K *k = (const kvs_block_q6_K *)row + b / 8;
        const float d = kvs_fp16_to_fp32_scalar(k->d);
        ws[0] = d * (float)k->scales[2 * p];
        ws[1] = d * (float)k->scales[2 * p + 1];
        break;
    }
    case KVS_Q4_1: case KVS_Q5_0: case KVS_Q5_1: {
        const char *k = row + (size_t)b * sb_bytes(wt);
        ws[0] = kvs_fp16_to_fp32_scalar(kvs_load_u16(k));
        if (wt != KVS_Q5_0)
            wm[0] = kvs_fp16_to_fp32_scalar(kvs_load_u16(k + 2));
        break;
    }
    default:
        ws[0] = kvs_fp16_to_fp32_scalar(((const kvs_block_iq4_nl *)row + b)->d);
        break;
    }
}

/* Contribution of weight block b against the quantised x block (q, xd). */
static float block_dot(kvs_dtype wt, const char *row, int b, const int8_t *q, float xd)
{
    uint8_t u[32];
    float ws[2], wm[1];
    raw_block(wt, row, b, u);
    block_consts(wt, row, b, ws, wm);
    if (wt == KVS_Q6_K) {
        float y = 0.0f;
        for (int h = 0; h < 2; h++) {
            int32_t isum = 0, xs = 0;
            for (int l = 16 * h; l < 16 * h + 16; l++) {
                isum += u[l] * q[l];
                xs += q[l];
            }
            y += ws[h] * xd * (float)(isum - 32 * xs);
        }
        return y;
    }
    int32_t isum = 0, xs = 0;
    for (int l = 0; l < 32; l++) {
        isum += (wt == KVS_IQ4_NL ? kvs_iq4nl_values[u[l]] : u[l]) * q[l];
        xs += q[l];
    }
    if (wt == KVS_IQ4_NL)
        return ws[0] * xd * (float)isum;
    if (wt == KVS_Q5_0)
        return ws[0] * xd * (float)(isum - 16 * xs);
    if (b32_has_min(wt))
        return ws[0] * xd * (float)isum + wm[0] * xd * (float)xs;
    return ws[0] * xd * (float)isum - wm[0] * xd * (float)xs;
}

static size_t kq_row_bytes(kvs_dtype wt, int n_in)
{
    return (size_t)n_in / (b32_type(wt) ? 32 : 256) * sb_bytes(wt);
}

/* matmul_kq_internal.h: the grid of kvs_matmul_kq_ref_sb. */
void kvs_kq_sb_scales(const float *amax, int *k, float *xd, float *d)
{
    float m = 0.0f;
    for (int p = 0; p < 8; p++)
        m = fmaxf(m, amax[p]);
    const float dd = m / 127.0f;
    for (int p = 0; p < 8; p++) {
        const float kf = m > 0.0f ? ceilf(amax[p] * 128.0f / m) : 1.0f;
        k[p] = kf < 1.0f ? 1 : kf > 128.0f ? 128 : (int)kf;
        xd[p] = dd * (float)k[p] * (1.0f / 128.0f);
    }
    *d = dd;
}

/* The references: x quantised per block of 32, on its own (sb_grid = 0) or on its super-block's
 * grid (kvs_kq_sb_scales); the blocks in order for every output. */
static void matmul_ref(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows,
                       int n_in, int n_out, int sb_grid)
{
    const size_t rb = kq_row_bytes(wt, n_in);
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        float *yr = y + (size_t)r * n_out;
        float xdb[8] = {0};
        for (int o = 0; o < n_out; o++)
            yr[o] = 0.0f;
        for (int b = 0; b < n_in / 32; b++) {
            int8_t q[32];
            float xd;
            if (sb_grid) {
                if (b % 8 == 0) {
                    float am[8], dd;
                    int k[8];
                    for (int p = 0; p < 8; p++)
                        am[p] = amax32(xr + 32 * (b + p));
                    kvs_kq_sb_scales(am, k, xdb, &dd);
                }
                xd = xdb[b % 8];
                quant_with(xr + 32 * b, xd, q);
            } else {
                quant_block32(xr + 32 * b, q, &xd);
            }
            for (int o = 0; o < n_out; o++)
                yr[o] += block_dot(wt, (const char *)w + (size_t)o * rb, b, q, xd);
        }
    }
}

void kvs_matmul_kq_ref(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows,
                       int n_in, int n_out)
{
    if (kvs_kq_type(wt))
        matmul_ref(y, x, w, wt, n_rows, n_in, n_out, 0);
}

void kvs_matmul_kq_ref_sb(float *y, const float *x, const void *w, kvs_dtype wt, int n_rows,
                          int n_in, int n_out)
{
    if (k_super_type(wt))
        matmul_ref(y, x, w, wt, n_rows, n_in, n_out, 1);
}



static void split_range(int n, int ith, int nth, int *lo, int *hi)
{
    *lo = (int)((int64_t)n * ith / nth);
    *hi = (int)((int64_t)n * (ith + 1) / nth);
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantisation                                                                    */

/* Block b of x row -> q (natural order), xd, and the sums of its two halves of 16. */
static void quant_block(const float *xb, int8_t *q, float *xd, int32_t *s16)
{
#if KVS_AVX512
    /* the same operations as quant_block32 (cvtps rounds to nearest even, as rintf) */
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 vid = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(i1));
    s16[0] = _mm512_reduce_add_epi32(i0);
    s16[1] = _mm512_reduce_add_epi32(i1);
    *xd = d;
#elif KVS_AVX2
    kvs_quant32_avx2(xb, q, xd, s16);
#else
    quant_block32(xb, q, xd);
    s16[0] = s16[1] = 0;
    for (int l = 0; l < 32; l++)
        s16[l / 16] += q[l];
#endif
}

/* Where block b of a super-block sits in the gemv x layout of Q4_K / Q5_K: the weight vectors
 * hold blocks (0, 2), (1, 3), (4, 6), (5, 7) (low / high nibbles of qs[0..63], qs[64..127]). */
static int k4_pos(int p) { return p == 1 ? 2 : p == 2 ? 1 : p == 5 ? 6 : p == 6 ? 5 : p; }

static void fill_x_row(const kq_ctx *c, int r)
{
    const int nb = c->nb, nbp = c->nbp;
    const float *x = c->x + (size_t)r * c->n_in;
    int8_t *xq = c->xq + (size_t)r * nbp * 32;
    float *xd = c->xd + (size_t)r * nbp, *xo = c->xo + (size_t)r * 2 * nbp;
    int32_t *xi = c->xi + (size_t)r * 2 * nbp;
    float *xl = c->xl + (size_t)r * 2 * nbp;
    int32_t *xbl = c->xb + (size_t)r * 8 * nbp;
    const kvs_dtype wt = c->wt;
    const int gemv = c->path == PATH_GEMV;
    memset(xq, 0, (size_t)nbp * 32);
    memset(xd, 0, (size_t)nbp * sizeof(float));
    memset(xo, 0, (size_t)2 * nbp * sizeof(float));
    memset(xi, 0, (size_t)2 * nbp * sizeof(int32_t));
    memset(xl, 0, (size_t)2 * nbp * sizeof(float));
    memset(xbl, 0, (size_t)8 * nbp * sizeof(int32_t));
    for (int b = 0; b < nb; b++) {
        int8_t q[32];
        int32_t s16[2];
        quant_block(x + (size_t)32 * b, q, &xd[b], s16);
        const float d = xd[b];
        const int xs = s16[0] + s16[1];
        const int sb = b / 8, p = b % 8;
        if (!gemv) { /* tile and portable: natural order */
            memcpy(xq + (size_t)32 * b, q, 32);
            if (wt == KVS_Q4_K || wt == KVS_Q5_K)
                xo[b] = -d * (float)xs;
            else if (b32_has_min(wt))
                xo[b] = d * (float)xs;
            else if (wt == KVS_Q6_K)
                xi[2 * b] = -32 * s16[0], xi[2 * b + 1] = -32 * s16[1];
            else
                xi[b] = (wt == KVS_Q5_0 ? -16 : -128) * xs;
        } else if (b32_type(wt)) {
            /* pairs of blocks as [a 0..15 | b 0..15 | a 16..31 | b 16..31] (the nibble halves of
             * the two blocks' qs); Q4_1 / Q5_1: xo = xd sum(q) per block, for the m term */
            int8_t *dst = xq + (size_t)64 * (b / 2) + 16 * (b % 2);
            memcpy(dst, q, 16);
            memcpy(dst + 32, q + 16, 16);
            if (b32_has_min(wt))
                xo[b] = d * (float)xs;
        } else {
            /* xl: the xd of the lanes of the weight constants (Q4_K / Q5_K [d sc_s | dmin m_s],
             * Q6_K d sc_g for g = 2 p, 2 p + 1); xo: -sum(q) on the dmin m_s lanes */
            const int pos = wt == KVS_Q6_K ? p : k4_pos(p);
            memcpy(xq + (size_t)256 * sb + 32 * pos, q, 32);
            xl[16 * sb + (wt == KVS_Q6_K ? 2 * p : p)] = d;
            xl[16 * sb + (wt == KVS_Q6_K ? 2 * p + 1 : 8 + p)] = d;
            if (wt != KVS_Q6_K)
                xo[16 * sb + 8 + p] = -(float)xs;
        }
    }
    /* gemv Q6_K / IQ4_NL / Q5_0: the offset times the x sums enters each VPDPBUSD lane as its start
     * value (the sum over the lane's own 4 bytes), so that every lane holds an exact
     * sum (u - offset) q: a bias in one lane only would cancel against the other lanes after
     * the conversion to fp32, losing up to offset / |u - offset| of the precision. */
    if (gemv && (wt == KVS_Q6_K || wt == KVS_IQ4_NL || wt == KVS_Q5_0)) {
        const int off = wt == KVS_Q6_K ? 32 : wt == KVS_Q5_0 ? 16 : 128;
        for (int j = 0; j < 8 * nbp; j++) /* the whole padded row: pairs straddle nb */
            xbl[j] = -off * (xq[4 * j] + xq[4 * j + 1] + xq[4 * j + 2] + xq[4 * j + 3]);
    }
}


static void quantize_x_task(void *p, int ith, int nth)
{
    const kq_ctx *c = p;
    int r0, r1;
    split_range(c->n_rows, ith, nth, &r0, &r1);
    for (int r = r0; r < r1; r++) {
#if KVS_AVX2
        if (c->path == PATH_AVX2) {
            kvs_kq2_fill_x_row_sb(c, r);
            continue;
        }
        if (c->path == PATH_AVX2_TILE) {
            kvs_kq2_fill_x_row_tile(c, r);
            continue;
        }
#endif
        fill_x_row(c, r);
    }
}

/* ========================================================================================== */
#if KVS_AVX512_VNNI
/* ========================================================================================== */

/* ---- gemv, K-quants: one super-block of 256 unpacked into 4 x 64 u bytes + lane scales ---- */

/* Q4_K / Q5_K: scale / min constants as 16 fp32 lanes [d sc_0..7 | dmin m_0..7]. */
KVS_INLINE __m512 k4_consts(const char *blk)
{
    /* Scale bytes s[0..11] at blk + 4: s[0..3] sc 0..3 (bits 0..5) and the top of sc 4..7
     * (bits 6..7); s[4..7] the same for m; s[8..11] the low nibbles of sc 4..7 (low) and m 4..7
     * (high). Unpacked with byte shuffles in one vector register: X holds, for each output
     * byte, the byte with its low bits, Y the byte with its top two. Assembling the vector from
     * four unpacked scalar words instead made this the gemv's bottleneck: the scalar-to-vector
     * moves took Q4_K decode from cache from 34.9 to 29.4 GB/s (bench_matmul, Zen 5). */
    const __m128i s = _mm_loadu_si128((const __m128i *)(blk + 4)); /* s[12..15]: quants */
    const __m128i X = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i Y = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_and_si128(X, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i mh = _mm_and_si128(_mm_srli_epi16(X, 4), /* m 4..7: the high nibbles */
                                     _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(Y, 2), _mm_set1_epi8(0x30));
    const __m128i v = _mm_ternarylogic_epi32(lo, mh, top, 0xfe); /* lo | mh | top */
    const __m512 scm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
    uint32_t dd;
    memcpy(&dd, blk, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* [d, dmin, ..] */
    const __m512 dmv = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_castps128_ps512(dm));
    return _mm512_mul_ps(scm, dmv);
}

/* The 4 u vectors of a Q4_K / Q5_K super-block: (0, 2), (1, 3), (4, 6), (5, 7) by block. */
KVS_INLINE void k4_quants(kvs_dtype wt, const char *blk, __m512i *W)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const char *qs = blk + (wt == KVS_Q5_K ? 48 : 16);
    const __m512i z0 = _mm512_loadu_si512(qs), z1 = _mm512_loadu_si512(qs + 64);
    W[0] = _mm512_and_si512(z0, m4);
    W[1] = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
    W[2] = _mm512_and_si512(z1, m4);
    W[3] = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
    if (wt == KVS_Q5_K) {
        /* bit p of qh[l] is bit 4 of block p's element l: one variable 16-bit shift per vector
         * (counts per 32-byte half) moves both of its blocks' bits to bit 4 */
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)));
        const __m512i b4 = _mm512_set1_epi8(0x10);
#define KQ_HALVES(a, b) _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1)
        const __m512i h0 = _mm512_sllv_epi16(h, KQ_HALVES(4, 2)); /* bits 0, 2 */
        const __m512i h1 = _mm512_sllv_epi16(h, KQ_HALVES(3, 1)); /* bits 1, 3 */
        const __m512i h2 = _mm512_srlv_epi16(h, KQ_HALVES(0, 2)); /* bits 4, 6 */
        const __m512i h3 = _mm512_srlv_epi16(h, KQ_HALVES(1, 3)); /* bits 5, 7 */
        /* a | (b & c) */
        W[0] = _mm512_ternarylogic_epi32(W[0], h0, b4, 0xf8);
        W[1] = _mm512_ternarylogic_epi32(W[1], h1, b4, 0xf8);
        W[2] = _mm512_ternarylogic_epi32(W[2], h2, b4, 0xf8);
        W[3] = _mm512_ternarylogic_epi32(W[3], h3, b4, 0xf8);
    }
}

/* Q6_K: u vectors of elements 0..63, 64..127, 128..191, 192..255 (x in natural order). */
KVS_INLINE void k6_quants(const char *blk, __m512i *W)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), b45 = _mm512_set1_epi8(0x30);
    KVS_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512(blk + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
        /* elements +0..31 / +32..63: qh bits 0..1 / 2..3 to bits 4..5; +64.. / +96..: bits 4..5
         * stay, 6..7 move down */
        const __m512i ha = _mm512_sllv_epi16(qh, KQ_HALVES(4, 2));
        const __m512i hb = _mm512_srlv_epi16(qh, KQ_HALVES(0, 2));
        W[2 * h] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), ha, b45, 0xf8);
        W[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hb, b45, 0xf8);
    }
#undef KQ_HALVES
}

/* Q6_K: d sc_g for the 16 sub-blocks of 16. */
KVS_INLINE __m512 k6_consts(const char *blk)
{
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192))));
    return _mm512_mul_ps(sc, _mm512_set1_ps(_cvtsh_ss(kvs_load_u16(blk + 208))));
}

/* Lane-scale index vectors: Q4_K / Q5_K vector t holds blocks (0,2), (1,3), (4,6), (5,7) on
 * lanes 0..7 / 8..15; Q6_K vector t holds the sub-blocks of 16 4t .. 4t + 3, four lanes each. */
KVS_INLINE __m512i lane_index(kvs_dtype wt, int t)
{
    static const int k4[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    if (wt == KVS_Q6_K)
        return _mm512_add_epi32(_mm512_set1_epi32(4 * t),
                                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    return _mm512_mask_blend_epi32((__mmask16)0xff00, _mm512_set1_epi32(k4[t][0]), _mm512_set1_epi32(k4[t][1]));
}

/* One super-block for NR x rows: acc[r][t] += (lane scale) * (lane integer sum), and the min /
 * -32 term into acc[r][0]. */
KVS_INLINE void gemv_k_sb(int NR, kvs_dtype wt, const char *blk, int sb, const int8_t *const *xq,
                          const float *const *xl, const float *const *xo,
                          const int32_t *const *xbv, const __m512i *idx, __m512 (*acc)[4])
{
    __m512i W[4];
    __m512 consts;
    KVS_PREFETCH_AHEAD(blk, sb_bytes(wt)); /* see kernels_internal.h */
    if (wt == KVS_Q6_K) {
        k6_quants(blk, W);
        consts = k6_consts(blk);
    } else {
        k4_quants(wt, blk, W);
        consts = k4_consts(blk);
    }
    KVS_UNROLL
    for (int r = 0; r < NR; r++) {
        const int8_t *xb = xq[r] + (size_t)256 * sb;
        const int32_t *bb = xbv[r] + (size_t)64 * sb;
        /* the constants times their blocks' xd (one multiplication), spread to the lanes of
         * each u vector by a permutation: cheaper than one multiplication per vector, as the
         * FMA pipes are the bottleneck */
        const __m512 sx = _mm512_mul_ps(consts, _mm512_load_ps(xl[r] + (size_t)16 * sb));
        KVS_UNROLL
        for (int t = 0; t < 4; t++) {
            const __m512i s0 = wt == KVS_Q6_K ? _mm512_load_si512(bb + 16 * t) : _mm512_setzero_si512();
            const __m512i is = _mm512_dpbusd_epi32(s0, W[t], _mm512_load_si512(xb + 64 * t));
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(idx[t], sx), acc[r][t]);
        }
        if (wt != KVS_Q6_K) /* dmin m_s xd_s times -sum(q) */
            acc[r][0] = _mm512_fmadd_ps(sx, _mm512_load_ps(xo[r] + (size_t)16 * sb), acc[r][0]);
    }
}

/* ---- gemv, block-of-32 types: groups of up to 8 blocks, pairs of blocks per VPDPBUSD ---- */

/* IQ4_NL: nibbles to kvalue + 128 with one VPSHUFB; Q4_1 / Q5_0 / Q5_1: the nibbles, Q5's bit 4
 * added under a byte mask made of the two blocks' qh; Q4_1 / Q5_1's m xd sum(q) terms: one
 * masked FMA of 8 lanes per group and x row. */
KVS_INLINE void gemv_b32_group(int NR, kvs_dtype wt, const char *row, int g, int ng,
                               const int8_t *const *xq, const float *const *xd,
                               const float *const *xo, const int32_t *const *xbv, __m512 (*acc)[4])
{
    const size_t bs = sb_bytes(wt);
    const int qso = b32_qs_off(wt);
    const char *base = row + (size_t)g * bs;
    KVS_PREFETCH_AHEAD(base, 8 * bs); /* see kernels_internal.h */
    const __m256 dw = kvs_fp16x8_at(base, bs, ng);
    __m512 scv[4];
    KVS_UNROLL
    for (int r = 0; r < NR; r++)
        scv[r] = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(xd[r] + g)));
    if (b32_has_min(wt)) {
        const __m512 mw = _mm512_castps256_ps512(kvs_fp16x8_at(base + 2, bs, ng));
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            acc[r][0] = _mm512_mask3_fmadd_ps(mw, _mm512_castps256_ps512(_mm256_loadu_ps(xo[r] + g)), acc[r][0],
                                              (__mmask16)0xff);
    }
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(
        1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166, (char)181, (char)197,
        (char)217, (char)241)); /* kvs_iq4nl_values + 128 */
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    KVS_UNROLL
    for (int i = 0; i < 8; i += 2) {
        if (i >= ng)
            break;
        const __m128i qa = _mm_loadu_si128((const __m128i *)(base + i * bs + qso));
        const __m128i qb = i + 1 < ng ? _mm_loadu_si128((const __m128i *)(base + (i + 1) * bs + qso))
                                      : _mm_setzero_si128();
        const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
        const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(t, m4)),
                                               _mm256_and_si256(_mm256_srli_epi16(t, 4), m4), 1);
        __m512i u; /* [a lo | b lo | a hi | b hi] */
        if (wt == KVS_IQ4_NL) {
            u = _mm512_shuffle_epi8(table, nib);
        } else if (wt == KVS_Q4_1) {
            u = nib;
        } else {
            uint32_t ha, hb = 0;
            memcpy(&ha, base + i * bs + b32_qh_off(wt), 4);
            if (i + 1 < ng)
                memcpy(&hb, base + (i + 1) * bs + b32_qh_off(wt), 4);
            const uint64_t k = (uint64_t)(ha & 0xffffu) | (uint64_t)(hb & 0xffffu) << 16 |
                               (uint64_t)(ha >> 16) << 32 | (uint64_t)(hb >> 16) << 48;
            u = _mm512_mask_add_epi8(nib, _cvtu64_mask64(k), nib, _mm512_set1_epi8(0x10));
        }
        const __m512i sidx = _mm512_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1, i, i, i, i, i + 1,
                                               i + 1, i + 1, i + 1);
        KVS_UNROLL
        for (int r = 0; r < NR; r++) {
            const __m512i is = _mm512_dpbusd_epi32(_mm512_load_si512(xbv[r] + (size_t)8 * (g + i)), u,
                                                   _mm512_load_si512(xq[r] + (size_t)32 * (g + i)));
            acc[r][i >> 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_permutexvar_ps(sidx, scv[r]),
                                             acc[r][i >> 1]);
        }
    }
}

/* NR (1..4) x rows against weight rows [o0, o1), one weight row at a time (a single sequential
 * stream per thread). */
KVS_INLINE void gemv_nr(const kq_ctx *c, int NR, int r0, int o0, int o1, kvs_dtype wt)
{
    const int nbp = c->nbp;
    const int8_t *xq[4];
    const float *xl[4], *xo[4], *xd[4];
    const int32_t *xbv[4];
    float *yr[4];
    KVS_UNROLL
    for (int r = 0; r < NR; r++) {
        xq[r] = c->xq + (size_t)(r0 + r) * nbp * 32;
        xl[r] = c->xl + (size_t)(r0 + r) * nbp * 2;
        xbv[r] = c->xb + (size_t)(r0 + r) * nbp * 8;
        xo[r] = c->xo + (size_t)(r0 + r) * nbp * 2;
        xd[r] = c->xd + (size_t)(r0 + r) * nbp;
        yr[r] = c->y + (size_t)(r0 + r) * c->n_out;
    }
    __m512i idx[4];
    KVS_UNROLL
    for (int t = 0; t < 4; t++)
        idx[t] = lane_index(wt, t);
    const int nsb = c->n_in / 256, nb = c->nb;
    for (int o = o0; o < o1; o++) {
        const char *row = c->w + (size_t)o * c->row_bytes;
        __m512 acc[4][4];
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
        if (b32_type(wt)) {
            const int nfull = nb & ~7;
            for (int g = 0; g < nfull; g += 8)
                gemv_b32_group(NR, wt, row, g, 8, xq, xd, xo, xbv, acc);
            if (nfull < nb)
                gemv_b32_group(NR, wt, row, nfull, nb - nfull, xq, xd, xo, xbv, acc);
        } else {
            const size_t bb = c->row_bytes / (size_t)nsb;
            for (int sb = 0; sb < nsb; sb++)
                gemv_k_sb(NR, wt, row + (size_t)sb * bb, sb, xq, xl, xo, xbv, idx, acc);
        }
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            yr[r][o] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]),
                                                          _mm512_add_ps(acc[r][2], acc[r][3])));
    }
}

#define DEF_GEMV(name, WT)                                                                      \
    static KVS_NOINLINE void name(const kq_ctx *c, int r0, int nr, int o0, int o1)             \
    {                                                                                           \
        switch (nr) {                                                                           \
        case 1: gemv_nr(c, 1, r0, o0, o1, WT); break;                                          \
        case 2: gemv_nr(c, 2, r0, o0, o1, WT); break;                                          \
        case 3: gemv_nr(c, 3, r0, o0, o1, WT); break;                                          \
        default: gemv_nr(c, 4, r0, o0, o1, WT); break;                                         \
        }                                                                                       \
    }
DEF_GEMV(gemv_q4_K, KVS_Q4_K)
DEF_GEMV(gemv_q5_K, KVS_Q5_K)
DEF_GEMV(gemv_q6_K, KVS_Q6_K)
DEF_GEMV(gemv_iq4_nl, KVS_IQ4_NL)
DEF_GEMV(gemv_q4_1, KVS_Q4_1)
DEF_GEMV(gemv_q5_0, KVS_Q5_0)
DEF_GEMV(gemv_q5_1, KVS_Q5_1)

static void gemv_rows(const kq_ctx *c, int r0, int r1, int o0, int o1)
{
    for (int r = r0; r < r1; r += 4) {
        const int nr = r1 - r < 4 ? r1 - r : 4;
        switch ((int)c->wt) {
        case KVS_Q4_K: gemv_q4_K(c, r, nr, o0, o1); break;
        case KVS_Q5_K: gemv_q5_K(c, r, nr, o0, o1); break;
        case KVS_Q6_K: gemv_q6_K(c, r, nr, o0, o1); break;
        case KVS_Q4_1: gemv_q4_1(c, r, nr, o0, o1); break;
        case KVS_Q5_0: gemv_q5_0(c, r, nr, o0, o1); break;
        case KVS_Q5_1: gemv_q5_1(c, r, nr, o0, o1); break;
        default: gemv_iq4_nl(c, r, nr, o0, o1); break;
        }
    }
}

/* ---- tile (prefill): packed panels of 16 * KQ_C columns, KQ_R x KQ_C register tiles ---- */

#define KQ_R 4
#define KQ_C 3
#define KQ_PACK 640 /* per block and 16 columns: 8 x 64 u bytes, then 2 x 16 fp32 constants */

/* u bytes of block b of a weight row, in element order (as raw_block, vectorised). */
KVS_INLINE __m256i raw_block_v(kvs_dtype wt, const char *row, int b)
{
    const int p = b % 8;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m128i sh4 = _mm_cvtsi32_si128(4 * (p % 2));
    switch ((int)wt) {
    case KVS_Q4_K: case KVS_Q5_K: {
        const char *k = row + (size_t)(b / 8) * sb_bytes(wt);
        const char *qs = k + (wt == KVS_Q5_K ? 48 : 16) + 32 * (p / 2);
        __m256i v = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qs), sh4), m4);
        if (wt == KVS_Q5_K) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(k + 16));
            const __m256i hb = p <= 4 ? _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - p))
                                      : _mm256_srl_epi16(h, _mm_cvtsi32_si128(p - 4));
            v = _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
        }
        return v;
    }
    case KVS_Q6_K: {
        const char *k = row + (size_t)(b / 8) * sizeof(kvs_block_q6_K);
        const int h = p / 4, quarter = p % 4;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(k + 64 * h + 32 * (quarter & 1)));
        const __m256i low = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (quarter >> 1))), m4);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(k + 128 + 32 * h));
        const __m256i hb = quarter < 2 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - 2 * quarter))
                                       : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * quarter - 4));
        return _mm256_or_si256(low, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    case KVS_Q4_1: case KVS_Q5_0: case KVS_Q5_1: {
        const char *k = row + (size_t)b * sb_bytes(wt);
        const __m128i q = _mm_loadu_si128((const __m128i *)(k + b32_qs_off(wt)));
        const __m256i nib = _mm256_and_si256(
            _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
        if (wt == KVS_Q4_1)
            return nib;
        uint32_t qh;
        memcpy(&qh, k + b32_qh_off(wt), 4);
        return _mm256_mask_add_epi8(nib, _cvtu32_mask32(qh), nib, _mm256_set1_epi8(0x10));
    }
    default: {
        const __m128i q = _mm_loadu_si128((const __m128i *)(row + (size_t)b * 18 + 2));
        const __m256i nib = _mm256_and_si256(
            _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
        const __m256i table = _mm256_broadcastsi128_si256(_mm_setr_epi8(
            1, 24, 45, 63, 79, 93, 106, 118, (char)129, (char)141, (char)153, (char)166, (char)181,
            (char)197, (char)217, (char)241));
        return _mm256_shuffle_epi8(table, nib);
    }
    }
}

/* 16 rows of 8 dwords -> 8 vectors of 16: out[k] = [r0[k], ..., r15[k]]. Rows i and i + 8 share
 * a register (low / high 256 bits), so an 8 x 8 transpose within each half does it all. */
KVS_INLINE void transpose_16x8(const __m256i *r, __m512i *out)
{
    __m512i z[8], t[8], u[8];
    KVS_UNROLL
    for (int i = 0; i < 8; i++)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(r[i]), r[i + 8], 1);
    KVS_UNROLL
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    KVS_UNROLL
    for (int j = 0; j < 8; j += 4) {
        u[j + 0] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
        u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    /* u[e] / u[4 + e], 128-bit lane q: rows (4 of them) of element 4 (q % 2) + e */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    KVS_UNROLL
    for (int e = 0; e < 4; e++) {
        out[e] = _mm512_permutex2var_epi64(u[e], lo, u[4 + e]);
        out[4 + e] = _mm512_permutex2var_epi64(u[e], hi, u[4 + e]);
    }
}

/* Per-block constants c0, c1 of 16 columns for the 8 blocks of super-block (or group of 8
 * blocks) sb: cs[p][0..15] = c0 of block 8 sb + p, cs[8 + p][..] = c1. The K-quant scales are
 * unpacked once per super-block with the gemv code (not per block: this was most of the cost of
 * packing, which decides how few rows the tiles pay off for). Missing columns give zeros. */
static void panel_consts(const kq_ctx *c, const char *const *rows, int ncg, int sb, float (*cs)[16])
{
    const kvs_dtype wt = c->wt;
    _Alignas(64) float t[16][16];
    for (int j = 0; j < 16; j++) {
        if (j >= ncg) {
            _mm512_store_ps(t[j], _mm512_setzero_ps());
            continue;
        }
        if (b32_type(wt)) {
            /* d (and Q4_1 / Q5_1 m) per block; blocks past the row's end are zero */
            const size_t bs = sb_bytes(wt);
            const int hm = b32_has_min(wt);
            for (int p = 0; p < 8; p++) {
                const int in = 8 * sb + p < c->nb;
                const char *blk = rows[j] + (size_t)(8 * sb + p) * bs;
                t[j][p] = in ? _cvtsh_ss(kvs_load_u16(blk)) : 0.0f;
                t[j][8 + p] = in && hm ? _cvtsh_ss(kvs_load_u16(blk + 2)) : 0.0f;
            }
            continue;
        }
        const char *blk = rows[j] + (size_t)sb * sb_bytes(wt);
        if (wt == KVS_Q6_K) { /* d sc_g, g = 2 p + h -> c0 / c1 of block p */
            const __m512 v = k6_consts(blk);
            _mm512_store_ps(t[j], _mm512_permutexvar_ps(
                                      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), v));
        } else {
            _mm512_store_ps(t[j], k4_consts(blk)); /* [d sc_0..7 | dmin m_0..7] */
        }
    }
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 16; j++)
            cs[k][j] = t[j][k];
}

/* Packs columns [o0, o0 + nc) as pk[b][C][KQ_PACK]: 8 vectors (lane j: u bytes 4 k4 .. 4 k4 + 3
 * of block b of column j), then 16 fp32 c0 and 16 fp32 c1: Q4_K / Q5_K d sc, dmin m; Q6_K the d sc
 * of the two sub-blocks of 16; IQ4_NL, Q5_0 d (c1 unused); Q4_1 / Q5_1 d, m. Missing columns are
 * zero. */
static void pack_panel(const kq_ctx *c, int o0, int nc, int C, char *pk)
{
    const kvs_dtype wt = c->wt;
    for (int g = 0; g < C; g++) {
        const int ncg = nc - 16 * g < 16 ? nc - 16 * g : 16;
        const char *rows[16];
        for (int j = 0; j < 16; j++)
            rows[j] = c->w + (size_t)(o0 + 16 * g + (j < ncg ? j : 0)) * c->row_bytes;
        _Alignas(64) float cs[16][16];
        for (int b = 0; b < c->nb; b++) {
            if (b % 8 == 0)
                panel_consts(c, rows, ncg, b / 8, cs);
            char *dst = pk + ((size_t)b * C + g) * KQ_PACK;
            __m256i r[16];
            KVS_UNROLL
            for (int j = 0; j < 16; j++)
                r[j] = j < ncg ? raw_block_v(wt, rows[j], b) : _mm256_setzero_si256();
            __m512i out[8];
            transpose_16x8(r, out);
            KVS_UNROLL
            for (int k4 = 0; k4 < 8; k4++)
                _mm512_store_si512(dst + 64 * k4, out[k4]);
            _mm512_store_ps((float *)(dst + 512), _mm512_load_ps(cs[b % 8]));
            _mm512_store_ps((float *)(dst + 576), _mm512_load_ps(cs[8 + b % 8]));
        }
    }
}

KVS_INLINE void tile_kernel(int R, int C, kvs_dtype wt, const kq_ctx *c, int r, const char *pk,
                            float *y, int nc)
{
    const int nb = c->nb, nbp = c->nbp;
    __m512 facc[KQ_R][KQ_C];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            facc[i][j] = _mm512_setzero_ps();
    const int8_t *xq = c->xq + (size_t)r * nbp * 32;
    const float *xd = c->xd + (size_t)r * nbp, *xo = c->xo + (size_t)r * 2 * nbp;
    const int32_t *xi = c->xi + (size_t)r * 2 * nbp;
    const size_t xqs = (size_t)nbp * 32;
    /* Q6_K: two passes of 4 groups of 4 bytes (its sub-blocks of 16); the others one of 8 */
    const int halves = wt == KVS_Q6_K ? 2 : 1, k4n = 8 / halves;
    for (int b = 0; b < nb; b++) {
        const char *pb = pk + (size_t)b * C * KQ_PACK;
        for (int h = 0; h < halves; h++) {
            __m512i iacc[KQ_R][KQ_C];
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                /* the -32 / -128 / -16 sum(q) terms start the integer sums; the types with a min
                 * term start at 0 */
                const __m512i s = wt == KVS_Q6_K ? _mm512_set1_epi32(xi[(size_t)2 * i * nbp + 2 * b + h])
                                  : wt == KVS_IQ4_NL || wt == KVS_Q5_0
                                      ? _mm512_set1_epi32(xi[(size_t)2 * i * nbp + b])
                                      : _mm512_setzero_si512();
                KVS_UNROLL
                for (int j = 0; j < C; j++)
                    iacc[i][j] = s;
            }
            KVS_UNROLL
            for (int k = 0; k < k4n; k++) {
                const int k4 = h * k4n + k;
                __m512i wv[KQ_C];
                KVS_UNROLL
                for (int j = 0; j < C; j++)
                    wv[j] = _mm512_load_si512(pb + (size_t)j * KQ_PACK + 64 * k4);
                KVS_UNROLL
                for (int i = 0; i < R; i++) {
                    int32_t x4;
                    memcpy(&x4, xq + i * xqs + (size_t)32 * b + 4 * k4, 4);
                    const __m512i xv = _mm512_set1_epi32(x4);
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
                    const __m512 s = _mm512_mul_ps(_mm512_load_ps((const float *)(pb + (size_t)j * KQ_PACK + 512 + 64 * h)), dx);
                    facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[i][j]), s, facc[i][j]);
                }
            }
        }
        if (wt == KVS_Q4_K || wt == KVS_Q5_K || b32_has_min(wt)) {
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                /* Q4_K / Q5_K -xd sum(q) (c1 = dmin m_s), Q4_1 / Q5_1 xd sum(q) (c1 = m) */
                const __m512 xm = _mm512_set1_ps(xo[(size_t)2 * i * nbp + b]);
                KVS_UNROLL
                for (int j = 0; j < C; j++)
                    facc[i][j] = _mm512_fmadd_ps(_mm512_load_ps((const float *)(pb + (size_t)j * KQ_PACK + 576)), xm,
                                                 facc[i][j]);
            }
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++) {
            const int n = nc - 16 * j;
            _mm512_mask_storeu_ps(y + (size_t)i * c->n_out + 16 * j,
                                  n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u), facc[i][j]);
        }
}

typedef void (*tile_fn)(const kq_ctx *, int, const char *, float *, int);

#define DEF_TILE(WT, wn, R, C)                                                                  \
    static KVS_NOINLINE void tile_##wn##_##R##_##C(const kq_ctx *c, int r, const char *pk,      \
                                                   float *y, int nc)                            \
    {                                                                                           \
        tile_kernel(R, C, WT, c, r, pk, y, nc);                                                 \
    }
#define DEF_TILE_C(WT, wn, C) DEF_TILE(WT, wn, 1, C) DEF_TILE(WT, wn, 2, C) DEF_TILE(WT, wn, 3, C) DEF_TILE(WT, wn, 4, C)
#define DEF_TILE_T(WT, wn) DEF_TILE_C(WT, wn, 1) DEF_TILE_C(WT, wn, 2) DEF_TILE_C(WT, wn, 3)
#define TILE_ROW(wn, C) {tile_##wn##_1_##C, tile_##wn##_2_##C, tile_##wn##_3_##C, tile_##wn##_4_##C}
#define TILE_TABLE(wn) {TILE_ROW(wn, 1), TILE_ROW(wn, 2), TILE_ROW(wn, 3)}
DEF_TILE_T(KVS_Q4_K, q4k)
DEF_TILE_T(KVS_Q5_K, q5k)
DEF_TILE_T(KVS_Q6_K, q6k)
DEF_TILE_T(KVS_IQ4_NL, iq4)
DEF_TILE_T(KVS_Q4_1, q41)
DEF_TILE_T(KVS_Q5_0, q50)
DEF_TILE_T(KVS_Q5_1, q51)
/* [type: Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0, Q5_1][C - 1][R - 1] */
static const tile_fn tile_table[7][KQ_C][KQ_R] = {TILE_TABLE(q4k), TILE_TABLE(q5k), TILE_TABLE(q6k),
                                                   TILE_TABLE(iq4), TILE_TABLE(q41), TILE_TABLE(q50),
                                                   TILE_TABLE(q51)};

static int type_index(kvs_dtype wt)
{
    switch ((int)wt) {
    case KVS_Q4_K: return 0;
    case KVS_Q5_K: return 1;
    case KVS_Q6_K: return 2;
    case KVS_Q4_1: return 4;
    case KVS_Q5_0: return 5;
    case KVS_Q5_1: return 6;
    }
    return 3;
}

static size_t tile_scratch_bytes(int nb) { return align64((size_t)nb * KQ_C * KQ_PACK); }

static void tile_rows(const kq_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    const int ti = type_index(c->wt);
    for (int o = o0; o < o1; o += 16 * KQ_C) {
        const int nc = o1 - o < 16 * KQ_C ? o1 - o : 16 * KQ_C;
        const int C = (nc + 15) / 16;
        pack_panel(c, o, nc, C, scratch);
        for (int r = r0; r < r1; r += KQ_R) {
            const int R = r1 - r < KQ_R ? r1 - r : KQ_R;
            tile_table[ti][C - 1][R - 1](c, r, scratch, c->y + (size_t)r * c->n_out + o, nc);
        }
    }
}

#endif /* KVS_AVX512_VNNI */


/* ------------------------------------------------------------------------------------------ */
/* Portable path: the reference's block dots on x quantised once (natural order).             */

static void portable_rows(const kq_ctx *c, int r0, int r1, int o0, int o1)
{
    for (int o = o0; o < o1; o++) {
        const char *row = c->w + (size_t)o * c->row_bytes;
        for (int r = r0; r < r1; r++) {
            const int8_t *xq = c->xq + (size_t)r * c->nbp * 32;
            const float *xd = c->xd + (size_t)r * c->nbp;
            float acc = 0.0f;
            for (int b = 0; b < c->nb; b++)
                acc += block_dot(c->wt, row, b, xq + (size_t)32 * b, xd[b]);
            c->y[(size_t)r * c->n_out + o] = acc;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                   */

static void run_path(const kq_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    switch (c->path) {
#if KVS_AVX512_VNNI
    case PATH_GEMV: gemv_rows(c, r0, r1, o0, o1); break;
    case PATH_TILE: tile_rows(c, scratch, r0, r1, o0, o1); break;
#endif
#if KVS_AVX2
    case PATH_AVX2: kvs_kq2_rows(c, r0, r1, o0, o1); break;
    case PATH_AVX2_TILE: kvs_kq2_tile_rows(c, scratch, r0, r1, o0, o1); break;
#endif
    default:
        (void)scratch;
        portable_rows(c, r0, r1, o0, o1);
        break;
    }
}

static void matmul_task(void *p, int ith, int nth)
{
    kq_ctx *c = p;
    char *scratch = c->thread_scratch + (size_t)ith * c->thread_scratch_bytes;
    if (c->by_rows) { /* few columns, many rows: a static split of the rows */
        int r0, r1;
        split_range(c->n_rows, ith, nth, &r0, &r1);
        if (r0 < r1)
            run_path(c, scratch, r0, r1, 0, c->n_out);
        return;
    }
    int u0, u1;
    while (kvs_split_next(&c->split, ith, &u0, &u1)) {
        const int o0 = u0 * c->unit, o1 = u1 * c->unit < c->n_out ? u1 * c->unit : c->n_out;
        run_path(c, scratch, 0, c->n_rows, o0, o1);
    }
}

static void run(kvs_pool *pool, kvs_task_fn fn, void *ctx)
{
    if (pool)
        kvs_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

static int choose_path(kvs_dtype wt, int n_rows)
{
#if KVS_AVX512_VNNI
    return n_rows < KQ_TILE_MIN_ROWS(wt) ? PATH_GEMV : PATH_TILE;
#else
    if (!KVS_AVX2 || !k_super_type(wt))
        return PATH_PORTABLE;
    return n_rows < KQ2_TILE_MIN_ROWS(wt) ? PATH_AVX2 : PATH_AVX2_TILE;
#endif
}

static kvs_status matmul_on_path(kvs_pool *pool, float *y, const float *x, const void *w,
                                 kvs_dtype wt, int n_rows, int n_in, int n_out, int path);

int kvs_matmul_kq_on_grid(kvs_dtype wt) { return choose_path(wt, 1) == PATH_AVX2; }

kvs_status kvs_matmul_kq(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                         int n_rows, int n_in, int n_out)
{
    if (!kvs_kq_type(wt))
        return KVS_ERR_UNSUPPORTED;
    return matmul_on_path(pool, y, x, w, wt, n_rows, n_in, n_out, choose_path(wt, n_rows));
}

kvs_status kvs_matmul_kq_avx2(kvs_pool *pool, float *y, const float *x, const void *w,
                              kvs_dtype wt, int n_rows, int n_in, int n_out)
{
#if KVS_AVX2
    if (k_super_type(wt))
        return matmul_on_path(pool, y, x, w, wt, n_rows, n_in, n_out,
                              n_rows < KQ2_TILE_MIN_ROWS(wt) ? PATH_AVX2 : PATH_AVX2_TILE);
#endif
    (void)pool, (void)y, (void)x, (void)w, (void)wt, (void)n_rows, (void)n_in, (void)n_out;
    return KVS_ERR_UNSUPPORTED;
}

static kvs_status matmul_on_path(kvs_pool *pool, float *y, const float *x, const void *w,
                                 kvs_dtype wt, int n_rows, int n_in, int n_out, int path)
{
    if (n_rows <= 0 || n_out <= 0 || n_in <= 0) /* kvs_matmul never calls with these */
        return KVS_OK;
    const int nth = pool ? kvs_pool_size(pool) : 1;
    kq_ctx c;
    memset(&c, 0, sizeof c);
    c.y = y;
    c.x = x;
    c.w = w;
    c.wt = wt;
    c.path = path;
    c.n_rows = n_rows;
    c.n_in = n_in;
    c.n_out = n_out;
    c.row_bytes = kq_row_bytes(wt, n_in);
    c.nb = n_in / 32;
    c.nbp = (c.nb + 7) & ~7;

    /* scratch: [xq][xd][xo][xi][xl][xb][xk][xp][per-thread panels] */
    const size_t nr = (size_t)n_rows, nbp = (size_t)c.nbp;
    const size_t b_xq = align64(nr * nbp * 32), b_xd = align64(nr * nbp * 4);
    const size_t b_xo = align64(nr * nbp * 8), b_xi = b_xo, b_xl = b_xo, b_xb = align64(nr * nbp * 32);
    const size_t b_xk = path == PATH_AVX2 ? align64(nr * nbp * 4) : 0;
    const int avx2 = path == PATH_AVX2 || path == PATH_AVX2_TILE;
    const size_t b_xp = avx2 && wt == KVS_Q6_K ? align64(nr * nbp * 32) : 0;
    const size_t x_bytes = b_xq + b_xd + b_xo + b_xi + b_xl + b_xb + b_xk + b_xp;
    size_t per_thread = 0;
#if KVS_AVX512_VNNI
    if (c.path == PATH_TILE)
        per_thread = tile_scratch_bytes(c.nb);
#endif
#if KVS_AVX2
    if (c.path == PATH_AVX2_TILE)
        per_thread = kvs_kq2_scratch_bytes(c.nb);
#endif
    c.thread_scratch_bytes = per_thread;
    const size_t total = x_bytes + per_thread * (size_t)nth;
    char *mem = NULL, *owned = NULL;
    if (pool)
        mem = kvs_pool_scratch(pool, total);
    else
        mem = owned = aligned_alloc(64, align64(total));
    if (!mem)
        return KVS_ERR_NOMEM;
    c.xq = (int8_t *)mem;
    c.xd = (float *)(mem + b_xq);
    c.xo = (float *)(mem + b_xq + b_xd);
    c.xi = (int32_t *)(mem + b_xq + b_xd + b_xo);
    c.xl = (float *)(mem + b_xq + b_xd + b_xo + b_xi);
    c.xb = (int32_t *)(mem + b_xq + b_xd + b_xo + b_xi + b_xl);
    c.xk = (int16_t *)(mem + b_xq + b_xd + b_xo + b_xi + b_xl + b_xb);
    c.xp = (int16_t *)(mem + b_xq + b_xd + b_xo + b_xi + b_xl + b_xb + b_xk);
    c.thread_scratch = mem + x_bytes;

    if (n_rows < 4 * nth || nth == 1)
        quantize_x_task(&c, 0, 1);
    else
        run(pool, quantize_x_task, &c);

    /* Work split as kernels_matmul.c: columns in units of 16 for the tile panels, 4 otherwise;
     * grains of a quarter share for the tiles, of about 32 KiB of weights for gemv; or the rows
     * when there are too few columns and many rows. */
    c.unit = c.path == PATH_TILE ? 16 : c.path == PATH_AVX2_TILE ? 8 : 4;
    const int col_units = (n_out + c.unit - 1) / c.unit;
    c.by_rows = kvs_split_by_rows(col_units, n_rows, nth);
    kvs_split_init(&c.split, col_units, nth,
                   kvs_split_grain(col_units, nth,
                                   c.path == PATH_GEMV || c.path == PATH_AVX2 ? c.unit * c.row_bytes : 0));
    run(pool, matmul_task, &c);
    free(owned);
    return KVS_OK;
}
