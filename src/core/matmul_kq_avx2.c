/* The AVX2 paths of kvs_matmul_kq for Q4_K, Q5_K and Q6_K (CPUs or VMs without AVX-512 VNNI):
 * x on its super-block's grid (kvs_matmul_kq_ref_sb), row kernels for decode and short chunks,
 * 8-column lane tiles for prefill. matmul_kq.c dispatches here. */
#include "matmul_kq_internal.h"

#include <string.h>

#include "kernels_internal.h"

#if KVS_AVX2
#include <immintrin.h>

/* One super-block of an x row (256 values at xs) quantised on its grid (kvs_kq_sb_scales): the
 * blocks' k and xd, D / 128, the 8 blocks' q in element order, and each block's sum(q). */
static void sb_quantize(const float *xs, int *k, float *xdb, float *d128, int8_t *q, int32_t *qsum)
{
    float amax[8], dd;
    for (int p = 0; p < 8; p++)
        amax[p] = kvs_amax_avx2(xs + 32 * p, 32);
    kvs_kq_sb_scales(amax, k, xdb, &dd);
    for (int p = 0; p < 8; p++) {
        int32_t s16[2];
        kvs_quant32_id_avx2(xs + 32 * p, xdb[p] != 0.0f ? 1.0f / xdb[p] : 0.0f, q + 32 * p, s16);
        qsum[p] = s16[0] + s16[1];
    }
    *d128 = dd * (1.0f / 128.0f);
}

/* The row kernels' x row (sb_quantize), each pair of blocks in avx2_pair's order: xd[sb] =
 * D / 128, xk the k_b; Q4_K / Q5_K xo[b] = xd_b sum(q) (the min term), Q6_K xp the pair sums
 * times its offset 32 (what VPMADDUBSW of 32s and q gives). */
void kvs_kq2_fill_x_row_sb(const kq_ctx *c, int r)
{
    const int nbp = c->nbp;
    const float *x = c->x + (size_t)r * c->n_in;
    int8_t *xq = c->xq + (size_t)r * nbp * 32;
    float *xd = c->xd + (size_t)r * nbp, *xo = c->xo + (size_t)r * 2 * nbp;
    int16_t *xk = c->xk + (size_t)r * 2 * nbp, *xp = c->xp + (size_t)r * 16 * nbp;
    for (int sb = 0; sb < c->nb / 8; sb++) {
        _Alignas(32) int8_t q[8][32];
        float xdb[8];
        int32_t qsum[8];
        int k[8];
        sb_quantize(x + (size_t)256 * sb, k, xdb, xd + sb, q[0], qsum);
        for (int p = 0; p < 8; p += 2) {
            /* blocks p and p + 1 interleaved as the weights are (avx2_pair) */
            const int b = 8 * sb + p;
            const __m256i qa = _mm256_load_si256((const __m256i *)q[p]);
            const __m256i qb = _mm256_load_si256((const __m256i *)q[p + 1]);
            const __m256i v0 = _mm256_unpacklo_epi64(qa, qb), v1 = _mm256_unpackhi_epi64(qa, qb);
            _mm256_storeu_si256((__m256i *)(xq + (size_t)32 * b), v0);
            _mm256_storeu_si256((__m256i *)(xq + (size_t)32 * b + 32), v1);
            for (int e = 0; e < 2; e++) {
                if (c->wt == KVS_Q6_K) {
                    xk[16 * sb + 2 * (p + e)] = xk[16 * sb + 2 * (p + e) + 1] = (int16_t)k[p + e];
                } else {
                    xo[b + e] = xdb[p + e] * (float)qsum[p + e];
                    xk[16 * sb + p + e] = (int16_t)k[p + e];
                    xk[16 * sb + 8 + p + e] = 0;
                }
            }
            if (c->wt == KVS_Q6_K) {
                const __m256i m32 = _mm256_set1_epi8(32);
                _mm256_storeu_si256((__m256i *)(xp + (size_t)16 * b),
                                    _mm256_add_epi16(_mm256_maddubs_epi16(m32, v0),
                                                     _mm256_maddubs_epi16(m32, v1)));
            }
        }
    }
}

/* The tiles' x row (sb_quantize) in element order: xd[b] = xd_b; Q4_K / Q5_K xo[b] = xd_b
 * sum(q); Q6_K xp[4 b + g / 2] the offset lanes of groups g and g + 1 (what VPMADDUBSW of 32s
 * gives against them, summed: 32 (q0 + q1) of both in the even 16-bit lane, 32 (q2 + q3) in
 * the odd). */
void kvs_kq2_fill_x_row_tile(const kq_ctx *c, int r)
{
    const float *x = c->x + (size_t)r * c->n_in;
    int8_t *xq = c->xq + (size_t)r * c->nbp * 32;
    float *xd = c->xd + (size_t)r * c->nbp, *xo = c->xo + (size_t)r * 2 * c->nbp;
    int32_t *xp = (int32_t *)c->xp + (size_t)r * 4 * c->nbp;
    for (int sb = 0; sb < c->nb / 8; sb++) {
        int32_t qsum[8];
        int k[8];
        float d128;
        sb_quantize(x + (size_t)256 * sb, k, xd + 8 * sb, &d128, xq + (size_t)256 * sb, qsum);
        for (int p = 0; p < 8; p++) {
            const int b = 8 * sb + p;
            if (c->wt != KVS_Q6_K) {
                xo[b] = xd[b] * (float)qsum[p];
                continue;
            }
            const int8_t *q = xq + (size_t)32 * b;
            for (int g = 0; g < 8; g += 2) {
                const int ev = 32 * (q[4 * g] + q[4 * g + 1] + q[4 * g + 4] + q[4 * g + 5]);
                const int od = 32 * (q[4 * g + 2] + q[4 * g + 3] + q[4 * g + 6] + q[4 * g + 7]);
                xp[4 * b + g / 2] = (int32_t)((uint32_t)(uint16_t)ev | (uint32_t)(uint16_t)od << 16);
            }
        }
    }
}

/* ---- AVX2 (CPUs or VMs without AVX-512 VNNI): Q4_K, Q5_K and Q6_K ---------------------------
 *
 * x blocks are scaled on their super-block's grid (kvs_matmul_kq_ref_sb: xd_b = D k_b / 128),
 * so a super-block's products are one integer sum: no VPDPBUSD, so VPMADDUBSW multiplies the
 * unsigned quants u by the signed x bytes into 16-bit pair sums (at most 2 * 63 * 127: no
 * saturation), VPMADDWD multiplies those by the 16-bit sc_s k_b (sub-block scale times block
 * multiplier: at most 63 * 128, Q6_K 128 * 128) and adds pairs into 32 bits, and 8 lanes
 * gather the whole super-block; then one conversion and one FMA by d D / 128. Q6_K's offset
 * comes off the 16-bit pair sums (32 (q_2i + q_2i+1) precomputed with x), so every lane sums
 * (u - 32) q exactly (a separate offset sum in other lanes cancelled after the conversion,
 * losing precision). Q4_K / Q5_K's min term is one FMA per super-block of dmin m_b by xd_b
 * sum(q) (xo). Two blocks' pair sums add in 16 bits before the VPMADDWD (avx2_pair interleaves
 * their 8-byte groups, x is stored so; at most 4 x 31 x 127, Q6_K 4 x 32 x 127 after the
 * offset), so per x row and pair of blocks: 2 VPMADDUBSW, VPADDW, VPSHUFB (the scales to their
 * lanes), VPMADDWD, VPADDD; per x row and super-block one VPMULLW (sc k) and the FMA. A lane
 * adds 4 VPMADDWD results per super-block: below 2^31 (Q6_K 4 x 2 x 16256 x 128 x 128 =
 * 2.13e9). With x scaled per block of 32 on its own, each pair of blocks needed a horizontal
 * add, a conversion, a permutation and an FMA; with one scale per super-block (llama.cpp's
 * Q8_K) the logits of ../shared/models/arch moved 1.4 times as far from the fp32 product (rms
 * 0.14 against 0.097; the grid: 0.097-0.10). Up to 4 x rows share each unpacked super-block;
 * the pairing pays in decode too (natural order there, tried: tg128 Q4_K_M 13% slower). */

/* Q4_K / Q5_K scale bytes (blk + 4, dtype.h) as [sc_0..7 | m_0..7]: s[0..3] hold sc 0..3 in
 * bits 0..5 and the top of sc 4..7 in bits 6..7; s[4..7] the same for m; s[8..11] the low
 * nibbles of sc 4..7 (low) and m 4..7 (high). X gathers each output byte's low bits, Y its top
 * two. (The 16-byte load reads 4 bytes of the block beyond the scales.) */
KVS_INLINE __m128i avx2_k4_scales(const char *blk)
{
    const __m128i s = _mm_loadu_si128((const __m128i *)(blk + 4));
    const __m128i X = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i Y = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_and_si128(X, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i mh = _mm_and_si128(_mm_srli_epi16(X, 4),
                                     _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(Y, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(_mm_or_si128(lo, mh), top);
}

/* VPSHUFB control giving 16-bit lanes 0..3 of the low 128 bits the 16-bit lane a0 of their
 * source half, lanes 4..7 lane b0; of the high 128 bits a1 and b1. */
KVS_INLINE __m256i avx2_pick4(int a0, int b0, int a1, int b1)
{
#define KVS_W(l) ((short)(2 * (l) | (2 * (l) + 1) << 8))
    return _mm256_setr_epi16(KVS_W(a0), KVS_W(a0), KVS_W(a0), KVS_W(a0), KVS_W(b0), KVS_W(b0), KVS_W(b0), KVS_W(b0),
                             KVS_W(a1), KVS_W(a1), KVS_W(a1), KVS_W(a1), KVS_W(b1), KVS_W(b1), KVS_W(b1), KVS_W(b1));
#undef KVS_W
}

/* Blocks p and p + 1 (32 bytes each) as two vectors that map the same 16-bit lanes to the same
 * sub-blocks (the 8-byte groups of the two interleaved), so that their VPMADDUBSW pair sums add
 * in 16 bits before one VPMADDWD: lanes 0..3 and 8..11 are p's, 4..7 and 12..15 p + 1's (Q6_K's
 * sub-blocks of 16: lanes 0..3 2 p, 4..7 2 p + 2, 8..11 2 p + 1, 12..15 2 p + 3). x is stored
 * so (fill_x_row_sb). */
KVS_INLINE void avx2_pair(__m256i a, __m256i b, __m256i *v)
{
    v[0] = _mm256_unpacklo_epi64(a, b);
    v[1] = _mm256_unpackhi_epi64(a, b);
}

/* A super-block's 8 unpacked blocks u as 4 pairs (avx2_pair) in v. */
KVS_INLINE void avx2_pairs(const __m256i *u, __m256i *v)
{
    KVS_UNROLL
    for (int p = 0; p < 8; p += 2)
        avx2_pair(u[p], u[p + 1], v + p);
}

/* The 32 x bytes at block b (0..nb-1) of x row r (pairs of blocks in avx2_pair's order). */
KVS_INLINE __m256i avx2_xq(const kq_ctx *c, int r, int b)
{
    return _mm256_loadu_si256((const __m256i *)(c->xq + ((size_t)r * c->nbp + (size_t)b) * 32));
}

/* The k_b of super-block sb of x row r: 8 (Q4_K / Q5_K), or each twice (Q6_K). */
KVS_INLINE __m128i avx2_xk8(const kq_ctx *c, int r, int sb)
{
    return _mm_loadu_si128((const __m128i *)(c->xk + ((size_t)r * c->nbp + 8 * (size_t)sb) * 2));
}
KVS_INLINE __m256i avx2_xk16(const kq_ctx *c, int r, int sb)
{
    return _mm256_loadu_si256((const __m256i *)(c->xk + ((size_t)r * c->nbp + 8 * (size_t)sb) * 2));
}

/* The u of one Q4_K (five = 0) or Q5_K (five = 1) super-block at blk as its 8 blocks in element
 * order: block 2 j holds the low nibbles of qs[32 j ..], 2 j + 1 the high; Q5_K's bit 4 is bit
 * 2 j (2 j + 1) of qh[l]. */
KVS_INLINE void avx2_k4_unpack(int five, const char *blk, __m256i *u)
{
    const size_t qs_off = five ? offsetof(kvs_block_q5_K, qs) : offsetof(kvs_block_q4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(blk + offsetof(kvs_block_q5_K, qh)))
                            : _mm256_setzero_si256();
    KVS_UNROLL
    for (int j = 0; j < 4; j++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + qs_off + 32 * j));
        u[2 * j] = _mm256_and_si256(raw, m4);
        u[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if (five) {
            u[2 * j] = _mm256_or_si256(u[2 * j], _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * j), 4), b4));
            u[2 * j + 1] = _mm256_or_si256(u[2 * j + 1],
                                           _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * j + 1), 4), b4));
        }
    }
}

/* The u of one Q6_K super-block as its 8 blocks in element order (dtype.h's quarters of each
 * half: low or high nibbles of ql, two bits of qh). */
KVS_INLINE void avx2_q6k_unpack(const kvs_block_q6_K *k, __m256i *u)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    KVS_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(k->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(k->qh + 32 * h));
        u[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
        u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
        u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2));
        u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
    }
}

/* y of R x rows from r against one Q4_K (five = 0) or Q5_K (five = 1) row. */
KVS_INLINE void avx2_k4_row(int R, int five, const kq_ctx *c, const char *row, int r, float *y)
{
    const size_t sbb = five ? sizeof(kvs_block_q5_K) : sizeof(kvs_block_q4_K);
    __m256 acc[4], mac[4]; /* the sc terms, the min terms */
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        acc[i] = mac[i] = _mm256_setzero_ps();
    for (int sb = 0; sb < c->nb / 8; sb++) {
        const char *blk = row + (size_t)sb * sbb;
        if (R == 1)
            KVS_PREFETCH_AHEAD(blk, sbb - 1);
        const __m128i scm = avx2_k4_scales(blk);
        const __m128i sc = _mm_cvtepu8_epi16(scm); /* sc_0..7 as 16 bits */
        uint32_t dd;
        memcpy(&dd, blk, 4);
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* [d, dmin, ..] */
        const float d = _mm_cvtss_f32(dm);
        const __m256 mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8))),
                                        _mm256_broadcastss_ps(_mm_movehdup_ps(dm))); /* dmin m_0..7 */
        __m256i u[8];
        avx2_k4_unpack(five, blk, u);
        __m256i v[8];
        avx2_pairs(u, v);
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            /* sc_b k_b (at most 63 * 128) in both halves */
            const __m256i s = _mm256_broadcastsi128_si256(_mm_mullo_epi16(sc, avx2_xk8(c, r + i, sb)));
            __m256i is = _mm256_setzero_si256();
            KVS_UNROLL
            for (int p = 0; p < 8; p += 2) { /* pair sums at most 2 x 2 x 31 x 127 */
                const int b = 8 * sb + p;
                const __m256i pr = _mm256_add_epi16(_mm256_maddubs_epi16(v[p], avx2_xq(c, r + i, b)),
                                                    _mm256_maddubs_epi16(v[p + 1], avx2_xq(c, r + i, b + 1)));
                is = _mm256_add_epi32(is, _mm256_madd_epi16(pr, _mm256_shuffle_epi8(s, avx2_pick4(p, p + 1, p, p + 1))));
            }
            const size_t xr = (size_t)(r + i) * c->nbp;
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(d * c->xd[xr + sb]), acc[i]);
            mac[i] = _mm256_fmadd_ps(mn, _mm256_loadu_ps(c->xo + 2 * xr + 8 * (size_t)sb), mac[i]);
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        y[(size_t)(r + i) * c->n_out] = kvs_hsum256(_mm256_sub_ps(acc[i], mac[i]));
}

/* y of R x rows from r against one Q6_K row. */
KVS_INLINE void avx2_q6k_row(int R, const kq_ctx *c, const char *row, int r, float *y)
{
    __m256 acc[4];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    for (int sb = 0; sb < c->nb / 8; sb++) {
        const kvs_block_q6_K *k = (const kvs_block_q6_K *)row + sb;
        if (R == 1)
            KVS_PREFETCH_AHEAD(k, sizeof *k - 1);
        const float d = kvs_fp16_to_fp32_scalar(k->d);
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)k->scales)); /* sc_0..15 */
        __m256i u[8];
        avx2_q6k_unpack(k, u);
        __m256i v[8];
        avx2_pairs(u, v);
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            /* sc_g k_(g/2) (at most 128 * 128 in size); its halves in both halves */
            const __m256i s = _mm256_mullo_epi16(sc, avx2_xk16(c, r + i, sb));
            const __m256i sh[2] = {_mm256_permute2x128_si256(s, s, 0x00), _mm256_permute2x128_si256(s, s, 0x11)};
            __m256i is = _mm256_setzero_si256();
            KVS_UNROLL
            for (int p = 0; p < 8; p += 2) {
                /* blocks p, p + 1: the two VPMADDUBSW sums (each at most 2 x 63 x 127) added, then
                 * the offset's 32 (q_2i + q_2i+1) of both off (wrapping 16-bit arithmetic whose
                 * result, a sum of (u - 32) q over 4 elements, is at most 4 x 32 x 127): every
                 * lane sums (u - 32) q exactly */
                const int b = 8 * sb + p, l = 4 * ((p / 2) % 2);
                const __m256i off = _mm256_loadu_si256((const __m256i *)(c->xp + ((size_t)(r + i) * c->nbp + b) * 16));
                const __m256i pr = _mm256_sub_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(v[p], avx2_xq(c, r + i, b)),
                                                                     _mm256_maddubs_epi16(v[p + 1], avx2_xq(c, r + i, b + 1))),
                                                    off);
                is = _mm256_add_epi32(is, _mm256_madd_epi16(pr, _mm256_shuffle_epi8(sh[p / 4], avx2_pick4(l, l + 2, l + 1, l + 3))));
            }
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is),
                                     _mm256_set1_ps(d * c->xd[(size_t)(r + i) * c->nbp + sb]), acc[i]);
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        y[(size_t)(r + i) * c->n_out] = kvs_hsum256(acc[i]);
}

/* ---- AVX2 prefill tiles: 8 weight rows in the 8 lanes ---------------------------------------
 *
 * For n_rows >= KQ2_TILE_MIN_ROWS each thread unpacks a panel of 8 output columns once per call
 * (avx2_pack_panel) and runs every x row through it, 4 at a time: a vector of the panel holds
 * 4 consecutive u bytes of one block for each of the 8 weight rows (an 8 x 8 transposition of
 * the unpacked super-blocks), and VPMADDUBSW against a broadcast 4-byte group of x gives each
 * row's pair sums in its own two 16-bit lanes; so the outputs come out as 8 columns of a vector,
 * with no horizontal sum, and one panel load serves 4 x rows. Per x row and block of 32: 8
 * VPMADDUBSW whose sums add in 16 bits (Q4_K: at most 8 x 2 x 15 x 127 = 30480; Q5_K in halves
 * of 4 groups; Q6_K in pairs of groups less the offset, as in avx2_q6k_row), one VPMADDWD by the
 * rows' 16-bit scales (two for Q5_K's halves and Q6_K's sub-blocks of 16), a conversion and an
 * FMA by d times the block's xd_b (x on the same grid as the row kernels: kvs_matmul_kq_ref_sb;
 * only the summation order differs), plus Q4_K / Q5_K's min term, one FMA of the rows' dmin m_b
 * by xd_b sum(q). A block's 32-bit sums stay below 2^31 / 2 (Q6_K: 2 x 16 x 32 x 127 x 128). */

#define KQ2_SC_OFF 2048                 /* per super-block: u [8 blocks][8 groups][8 rows][4] */
#define KQ2_D_OFF (KQ2_SC_OFF + 16 * 32) /* 16-bit scales [block or Q6_K sub-block][8 rows x 2] */
#define KQ2_M_OFF (KQ2_D_OFF + 32)       /* d [8 rows], then Q4_K / Q5_K dmin m [8 blocks][8 rows] */
#define KQ2_SB_BYTES (KQ2_M_OFF + 8 * 32)

size_t kvs_kq2_scratch_bytes(int nb) { return align64((size_t)(nb / 8) * KQ2_SB_BYTES); }

/* 8 signed 32-bit lanes as 16-bit values in both halves (a VPMADDWD operand per lane pair). */
KVS_INLINE __m256i avx2_dup16(__m256i v)
{
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

/* Packs columns [o, o + nc) (nc <= 8; the rest zero, so they add nothing) into pk, per
 * super-block as the KQ2_ offsets lay out: each row's super-block unpacked (the row kernels'
 * avx2_k4_unpack / avx2_q6k_unpack) and its scales widened, then rows turned into lanes. */
static void avx2_pack_panel(const kq_ctx *c, int o, int nc, char *pk)
{
    const size_t sbb = sb_bytes(c->wt);
    const int six = c->wt == KVS_Q6_K;
    _Alignas(32) uint8_t un[8][8][32]; /* [row][block][element] */
    for (int sb = 0; sb < c->nb / 8; sb++) {
        char *ps = pk + (size_t)sb * KQ2_SB_BYTES;
        __m256i sc[2][8], mn[8], tr[8]; /* per row: scales (Q6_K: two halves), mins */
        _Alignas(32) float d[8], dmin[8];
        for (int j = 0; j < 8; j++) {
            __m256i u[8];
            const char *blk = c->w + (size_t)(o + j) * c->row_bytes + (size_t)sb * sbb;
            sc[0][j] = sc[1][j] = mn[j] = _mm256_setzero_si256();
            d[j] = dmin[j] = 0.0f;
            if (j >= nc) {
                for (int b = 0; b < 8; b++)
                    u[b] = _mm256_setzero_si256();
            } else if (six) {
                const kvs_block_q6_K *k = (const kvs_block_q6_K *)blk;
                avx2_q6k_unpack(k, u);
                const __m128i s8 = _mm_loadu_si128((const __m128i *)k->scales);
                sc[0][j] = avx2_dup16(_mm256_cvtepi8_epi32(s8));
                sc[1][j] = avx2_dup16(_mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8)));
                d[j] = kvs_fp16_to_fp32_scalar(k->d);
            } else {
                avx2_k4_unpack(c->wt == KVS_Q5_K, blk, u);
                const __m128i scm = avx2_k4_scales(blk);
                sc[0][j] = avx2_dup16(_mm256_cvtepu8_epi32(scm));
                mn[j] = _mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8));
                d[j] = kvs_fp16_to_fp32_scalar(kvs_load_u16(blk));
                dmin[j] = kvs_fp16_to_fp32_scalar(kvs_load_u16(blk + 2));
            }
            for (int b = 0; b < 8; b++)
                _mm256_store_si256((__m256i *)un[j][b], u[b]);
        }
        _mm256_store_ps((float *)(ps + KQ2_D_OFF), _mm256_load_ps(d));
        for (int h = 0; h < 1 + six; h++) {
            kvs_transpose8_avx2(sc[h], tr);
            for (int b = 0; b < 8; b++)
                _mm256_store_si256((__m256i *)(ps + KQ2_SC_OFF + 32 * (8 * h + b)), tr[b]);
        }
        if (!six) {
            kvs_transpose8_avx2(mn, tr);
            const __m256 dm = _mm256_load_ps(dmin);
            for (int b = 0; b < 8; b++)
                _mm256_store_ps((float *)(ps + KQ2_M_OFF + 32 * b),
                                _mm256_mul_ps(_mm256_cvtepi32_ps(tr[b]), dm));
        }
        /* each block: rows' 8 groups of 4 bytes -> groups' 8 rows */
        for (int b = 0; b < 8; b++) {
            __m256i in[8];
            for (int j = 0; j < 8; j++)
                in[j] = _mm256_load_si256((const __m256i *)un[j][b]);
            kvs_transpose8_avx2(in, tr);
            for (int g = 0; g < 8; g++)
                _mm256_store_si256((__m256i *)(ps + (size_t)b * 256) + g, tr[g]);
        }
    }
}

/* The 4 x bytes of group g of block b of x row r, in every 32-bit lane. */
KVS_INLINE __m256i kq2_x4(const kq_ctx *c, int r, int b, int g)
{
    int32_t v;
    memcpy(&v, c->xq + ((size_t)r * c->nbp + (size_t)b) * 32 + 4 * g, 4);
    return _mm256_set1_epi32(v);
}

/* y[i n_out + j] of x row r + i (i < R) and panel column j < nc. */
KVS_INLINE void avx2_tile(int R, kvs_dtype wt, const kq_ctx *c, int r, const char *pk, float *y, int nc)
{
    __m256 acc[4];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    for (int sb = 0; sb < c->nb / 8; sb++) {
        const char *ps = pk + (size_t)sb * KQ2_SB_BYTES;
        const __m256 dv = _mm256_load_ps((const float *)(ps + KQ2_D_OFF));
        for (int p = 0; p < 8; p++) {
            const int b = 8 * sb + p;
            const __m256i *w = (const __m256i *)(ps + (size_t)p * 256);
            __m256i is[4];
            if (wt == KVS_Q6_K) {
                KVS_UNROLL
                for (int h = 0; h < 2; h++) { /* the sub-blocks of 16: groups 4 h .. 4 h + 3 */
                    const __m256i sc =
                        _mm256_load_si256((const __m256i *)(ps + KQ2_SC_OFF + 32 * (2 * p + h)));
                    __m256i t[4];
                    KVS_UNROLL
                    for (int g = 4 * h; g < 4 * h + 4; g += 2) {
                        const __m256i w0 = _mm256_load_si256(w + g), w1 = _mm256_load_si256(w + g + 1);
                        KVS_UNROLL
                        for (int i = 0; i < R; i++) {
                            const int32_t *xp = (const int32_t *)c->xp + ((size_t)(r + i) * c->nbp + b) * 4;
                            const __m256i s2 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, kq2_x4(c, r + i, b, g)),
                                                                _mm256_maddubs_epi16(w1, kq2_x4(c, r + i, b, g + 1)));
                            const __m256i pr = _mm256_sub_epi16(s2, _mm256_set1_epi32(xp[g / 2]));
                            t[i] = g == 4 * h ? pr : _mm256_add_epi16(t[i], pr);
                            KVS_KEEP_REG(t[i]);
                        }
                    }
                    KVS_UNROLL
                    for (int i = 0; i < R; i++) {
                        const __m256i m = _mm256_madd_epi16(t[i], sc);
                        is[i] = h == 0 ? m : _mm256_add_epi32(is[i], m);
                    }
                }
            } else {
                const __m256i sc = _mm256_load_si256((const __m256i *)(ps + KQ2_SC_OFF + 32 * p));
                const int G = wt == KVS_Q5_K ? 4 : 8; /* groups whose 16-bit sums cannot overflow */
                KVS_UNROLL
                for (int g0 = 0; g0 < 8; g0 += G) {
                    __m256i t[4];
                    KVS_UNROLL
                    for (int g = g0; g < g0 + G; g++) {
                        const __m256i wv = _mm256_load_si256(w + g);
                        KVS_UNROLL
                        for (int i = 0; i < R; i++) {
                            const __m256i pr = _mm256_maddubs_epi16(wv, kq2_x4(c, r + i, b, g));
                            t[i] = g == g0 ? pr : _mm256_add_epi16(t[i], pr);
                            KVS_KEEP_REG(t[i]); /* the adds in order: no products spilled */
                        }
                    }
                    KVS_UNROLL
                    for (int i = 0; i < R; i++) {
                        const __m256i m = _mm256_madd_epi16(t[i], sc);
                        is[i] = g0 == 0 ? m : _mm256_add_epi32(is[i], m);
                    }
                }
            }
            const __m256 mv = wt == KVS_Q6_K ? _mm256_setzero_ps()
                                             : _mm256_load_ps((const float *)(ps + KQ2_M_OFF + 32 * p));
            KVS_UNROLL
            for (int i = 0; i < R; i++) {
                const size_t xr = (size_t)(r + i) * c->nbp;
                const __m256 s = _mm256_mul_ps(dv, _mm256_set1_ps(c->xd[xr + b]));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[i]), s, acc[i]);
                if (wt != KVS_Q6_K)
                    acc[i] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(c->xo[2 * xr + b]), acc[i]);
            }
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        kvs_store8_avx2(y + (size_t)i * c->n_out, acc[i], nc);
}

#define KQ2_TILE_FNS(name, wt)                                                                    \
    static KVS_NOINLINE void name(int R, const kq_ctx *c, int r, const char *pk, float *y, int nc) \
    {                                                                                            \
        switch (R) {                                                                             \
        case 1: avx2_tile(1, wt, c, r, pk, y, nc); break;                                        \
        case 2: avx2_tile(2, wt, c, r, pk, y, nc); break;                                        \
        case 3: avx2_tile(3, wt, c, r, pk, y, nc); break;                                        \
        default: avx2_tile(4, wt, c, r, pk, y, nc); break;                                       \
        }                                                                                        \
    }
KQ2_TILE_FNS(avx2_tile_q4k, KVS_Q4_K)
KQ2_TILE_FNS(avx2_tile_q5k, KVS_Q5_K)
KQ2_TILE_FNS(avx2_tile_q6k, KVS_Q6_K)
#undef KQ2_TILE_FNS

void kvs_kq2_tile_rows(const kq_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    void (*tile)(int, const kq_ctx *, int, const char *, float *, int) =
        c->wt == KVS_Q6_K ? avx2_tile_q6k : c->wt == KVS_Q5_K ? avx2_tile_q5k : avx2_tile_q4k;
    for (int o = o0; o < o1; o += 8) {
        const int nc = o1 - o < 8 ? o1 - o : 8;
        avx2_pack_panel(c, o, nc, scratch);
        for (int r = r0; r < r1; r += 4)
            tile(r1 - r < 4 ? r1 - r : 4, c, r, scratch, c->y + (size_t)r * c->n_out + o, nc);
    }
}

KVS_INLINE void avx2_row(int R, const kq_ctx *c, const char *row, int r, float *y)
{
    if (c->wt == KVS_Q6_K)
        avx2_q6k_row(R, c, row, r, y);
    else if (c->wt == KVS_Q5_K)
        avx2_k4_row(R, 1, c, row, r, y);
    else
        avx2_k4_row(R, 0, c, row, r, y);
}

void kvs_kq2_rows(const kq_ctx *c, int r0, int r1, int o0, int o1)
{
    KVS_AVX2_ROW_BLOCKS(c, r0, r1, o0, o1, avx2_row)
}

#endif /* KVS_AVX2 */
