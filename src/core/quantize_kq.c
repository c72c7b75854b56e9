/* Quantisers for Q4_K, Q5_K and Q6_K: fp32 rows to the block layouts dtype.h describes, the
 * inverse of the reference dequantisers in dequant_ref.c.
 *
 * The method is a direct one (no search for the least-squares scales as llama.cpp does): every
 * sub-block gets the scale that just covers its values, the sub-scales are quantised against a
 * super-block scale, and each element is rounded to the nearest level of the scale the
 * dequantiser will actually use. The point of the design is a guaranteed error bound, which the
 * tests check: no value is ever clipped, so every element is within half a step of its original.
 *
 * - Sub-scales are rounded UP (ceil) against the fp16 super-block scale, and the fp16 scale
 *   itself is rounded up (fp16_at_least), so the quantised range always covers the sub-block.
 *   Rounding to nearest instead could shrink a sub-block's range and clip its extremes by up to
 *   half a super-block quantum times the number of levels.
 * - Q4_K / Q5_K: x = d * sc * q - dmin * m with q in 0..15 (0..31), sc and m 6-bit. Per
 *   32-element sub-block, lo = min(min x, 0) and hi = max x: GGML's format keeps m >= 0 (the
 *   offset is subtracted), so a sub-block of positive values starts its range at 0. m covers
 *   -lo (m = ceil(-lo / dmin), dmin = max(-lo) / 63); then sc = ceil((hi + dmin*m) / 15 / d)
 *   with d = max over sub-blocks of that required scale / 63, so the 16 (32) levels starting at
 *   -dmin*m reach hi. q = clamp(round((x + dmin*m) / (d*sc)), 0, 15 or 31).
 *   Error bound per element: 0.5 * d*sc <= 0.5 * ((hi - lo + dmin') / 15 + d'), where dmin' and
 *   d' are the stored fp16 values (<= the exact ones plus one fp16 ulp).
 * - Q6_K: x = d * sc * (q - 32) with q in 0..63, sc int8. Per 16-element sub-block, A is the
 *   largest magnitude and B the largest magnitude among elements of the opposite sign; the
 *   sub-block's scale magnitude a = max(A / 32, B / 31), signed so that A's element maps to the
 *   -32 end (the side with one more level): every element lands in [-32, 31] unclipped. The 16
 *   magnitudes are quantised as |sc| = ceil(a / d), d = max(a) / 127, |sc| <= 127. q =
 *   clamp(round(x / (d*sc)) + 32, 0, 63). Error bound: 0.5 * |d*sc| <= 0.5 * (a + d').
 *
 * Limits: values are expected well inside fp16's range (the scales are stored as fp16: |x| up
 * to about 6e7 for Q4_K, 2.6e8 for Q6_K); weights are many orders of magnitude smaller. A
 * super-block whose scale is below fp16's smallest subnormal (6e-8) gets that subnormal as its
 * scale, so tiny values (1e-30) round to 0 with an error below 1e-7. */
#include "dequant.h"

#include <math.h>
#include <string.h>

#include "kernels_internal.h"

/* The smallest non-negative fp16 value >= v (v >= 0, finite): the scale a ceil() against it
 * can rely on, so sc = ceil(s / d) never exceeds the level count the caller sized d for. */
static uint16_t fp16_at_least(float v)
{
    uint16_t h = kvs_fp32_to_fp16_scalar(v);
    if (v > 0.0f && kvs_fp16_to_fp32_scalar(h) < v)
        h++; /* positive fp16 bit patterns are ordered: +1 is the next larger value */
    return h;
}

/* ceil(s / d) clamped to 0..max; 0 when d is 0 (then s is 0 too: d is the largest s / max). */
static int ceil_level(float s, float d, int max)
{
    if (d <= 0.0f || s <= 0.0f)
        return 0;
    const float l = ceilf(s / d);
    return l > (float)max ? max : (int)l;
}

static int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- Q4_K / Q5_K ---------------------------------------------------------------------------- */

/* Writes the 6-bit scale sc and min m of sub-block s (0..7) into the 12 packed bytes exactly
 * as dequant_ref.c's k4_scale_min reads them back: sub-blocks 0..3 take the low 6 bits of
 * bytes s and s + 4; 4..7 put their low 4 bits in the nibbles of byte s + 4 and their top 2
 * bits in bits 6..7 of bytes s - 4 (sc) and s (m). */
static void k4_pack_scale_min(uint8_t *q, int s, int sc, int m)
{
    if (s < 4) {
        q[s] = (uint8_t)((q[s] & 0xC0) | sc);
        q[s + 4] = (uint8_t)((q[s + 4] & 0xC0) | m);
    } else {
        q[s + 4] = (uint8_t)((sc & 15) | (m & 15) << 4);
        q[s - 4] = (uint8_t)((q[s - 4] & 0x3F) | (sc >> 4) << 6);
        q[s] = (uint8_t)((q[s] & 0x3F) | (m >> 4) << 6);
    }
}

/* One Q4_K / Q5_K super-block: its fp16 scales, packed 6-bit scales and mins, and the levels
 * (0..nmax) of its 256 elements in q. */
static void k4_quantize_block(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                              uint8_t *scales, uint8_t *q)
{
    float lo[8], hi[8], need[8], max_m = 0.0f, max_need = 0.0f;
    int ls[8], lm[8];
    for (int s = 0; s < 8; s++) {
        lo[s] = 0.0f; /* m >= 0: the range starts at or below 0 */
        hi[s] = x[32 * s];
        for (int i = 0; i < 32; i++) {
            lo[s] = fminf(lo[s], x[32 * s + i]);
            hi[s] = fmaxf(hi[s], x[32 * s + i]);
        }
        max_m = fmaxf(max_m, -lo[s]);
    }
    const uint16_t dmin_h = fp16_at_least(max_m / 63.0f);
    const float dmin = kvs_fp16_to_fp32_scalar(dmin_h);
    for (int s = 0; s < 8; s++) {
        lm[s] = ceil_level(-lo[s], dmin, 63);
        const float m1 = dmin * (float)lm[s]; /* as the dequantiser forms it */
        need[s] = fmaxf(hi[s] + m1, 0.0f) / (float)nmax;
        max_need = fmaxf(max_need, need[s]);
    }
    const uint16_t d_h = fp16_at_least(max_need / 63.0f);
    const float d = kvs_fp16_to_fp32_scalar(d_h);
    memset(scales, 0, KVS_K_SCALE_SIZE);
    for (int s = 0; s < 8; s++) {
        ls[s] = ceil_level(need[s], d, 63);
        k4_pack_scale_min(scales, s, ls[s], lm[s]);
        const float d1 = d * (float)ls[s], m1 = dmin * (float)lm[s];
        for (int i = 0; i < 32; i++) {
            const int v = d1 > 0.0f ? (int)lrintf((x[32 * s + i] + m1) / d1) : 0;
            q[32 * s + i] = (uint8_t)clamp_int(v, 0, nmax);
        }
    }
    *d_out = d_h;
    *dmin_out = dmin_h;
}

/* The low 4 bits of element e = 64 j + 32 half + l go to qs[32 j + l] (low nibble for the
 * first 32 of each 64, high nibble for the second), as dequant_ref.c's k4_nibble reads them. */
static void k4_pack_nibbles(const uint8_t *q, uint8_t *qs)
{
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++)
            qs[32 * j + l] = (uint8_t)((q[64 * j + l] & 15) | (q[64 * j + 32 + l] & 15) << 4);
}

static void quantize_q4_K(const float *x, kvs_block_q4_K *y, int64_t nb)
{
    uint8_t q[KVS_QK_K];
    for (int64_t b = 0; b < nb; b++, x += KVS_QK_K) {
        k4_quantize_block(x, 15, &y[b].d, &y[b].dmin, y[b].scales, q);
        k4_pack_nibbles(q, y[b].qs);
    }
}

static void quantize_q5_K(const float *x, kvs_block_q5_K *y, int64_t nb)
{
    uint8_t q[KVS_QK_K];
    for (int64_t b = 0; b < nb; b++, x += KVS_QK_K) {
        k4_quantize_block(x, 31, &y[b].d, &y[b].dmin, y[b].scales, q);
        k4_pack_nibbles(q, y[b].qs);
        /* bit 4 of element e is bit e / 32 of qh[e % 32] */
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int e = 0; e < KVS_QK_K; e++)
            y[b].qh[e % 32] |= (uint8_t)((q[e] >> 4) << (e / 32));
    }
}

/* ---- Q6_K ----------------------------------------------------------------------------------- */

/* Sub-block (16 elements) scale: magnitude a covering the sub-block, sign so that its largest
 * magnitude maps to the -32 end. Returns the signed ideal scale a * sign. */
static float q6_sub_scale(const float *x)
{
    float amax = 0.0f, ext = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            ext = x[i];
        }
    float opp = 0.0f; /* the largest magnitude of the opposite sign: it must fit in +31 */
    for (int i = 0; i < 16; i++)
        if ((x[i] > 0.0f && ext < 0.0f) || (x[i] < 0.0f && ext > 0.0f))
            opp = fmaxf(opp, fabsf(x[i]));
    const float a = fmaxf(amax / 32.0f, opp / 31.0f);
    return ext > 0.0f ? -a : a; /* x / scale = -32 for the extreme */
}

/* Element e = 128 h + 32 quarter + l: low 4 bits in ql[64 h + 32 (quarter & 1) + l] (low
 * nibble for quarters 0, 1, high for 2, 3), top 2 bits in bits 2 quarter of qh[32 h + l], as
 * dequant_ref.c's ref_q6_K reads them. */
static void q6_pack(const uint8_t *q, kvs_block_q6_K *y)
{
    memset(y->ql, 0, sizeof y->ql);
    memset(y->qh, 0, sizeof y->qh);
    for (int e = 0; e < KVS_QK_K; e++) {
        const int h = e / 128, quarter = e % 128 / 32, l = e % 32;
        uint8_t *lbyte = &y->ql[64 * h + 32 * (quarter & 1) + l];
        *lbyte |= (uint8_t)((q[e] & 15) << (quarter < 2 ? 0 : 4));
        y->qh[32 * h + l] |= (uint8_t)((q[e] >> 4) << (2 * quarter));
    }
}

static void quantize_q6_K(const float *x, kvs_block_q6_K *y, int64_t nb)
{
    uint8_t q[KVS_QK_K];
    for (int64_t b = 0; b < nb; b++, x += KVS_QK_K) {
        float sub[16], amax = 0.0f;
        for (int s = 0; s < 16; s++) {
            sub[s] = q6_sub_scale(x + 16 * s);
            amax = fmaxf(amax, fabsf(sub[s]));
        }
        const uint16_t d_h = fp16_at_least(amax / 127.0f);
        const float d = kvs_fp16_to_fp32_scalar(d_h);
        for (int s = 0; s < 16; s++) {
            const int mag = ceil_level(fabsf(sub[s]), d, 127);
            y[b].scales[s] = (int8_t)(sub[s] < 0.0f ? -mag : mag);
            const float ds = d * (float)y[b].scales[s];
            for (int i = 0; i < 16; i++) {
                const int v = ds != 0.0f ? (int)lrintf(x[16 * s + i] / ds) : 0;
                q[16 * s + i] = (uint8_t)clamp_int(v + 32, 0, 63);
            }
        }
        y[b].d = d_h;
        q6_pack(q, &y[b]);
    }
}

void kvs_quantize_row_kq(kvs_dtype t, const float *src, void *dst, int64_t n)
{
    const int64_t nb = n / KVS_QK_K;
    switch ((int)t) {
    case KVS_Q4_K: quantize_q4_K(src, dst, nb); break;
    case KVS_Q5_K: quantize_q5_K(src, dst, nb); break;
    case KVS_Q6_K: quantize_q6_K(src, dst, nb); break;
    default: break;
    }
}
