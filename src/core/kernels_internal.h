/* Private helpers shared by the kernel sources (not part of the public kernel API). */
#ifndef KVS_KERNELS_INTERNAL_H
#define KVS_KERNELS_INTERNAL_H

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define KVS_INLINE static inline __attribute__((always_inline))
#define KVS_NOINLINE __attribute__((noinline))
#else
#define KVS_INLINE static inline
#define KVS_NOINLINE
#endif

/* The micro-kernels index small accumulator arrays with loop counters that are compile-time
 * constants after inlining; full unrolling lets GCC keep them in registers at -O2. */
#if defined(__GNUC__) && !defined(__clang__)
#define KVS_UNROLL _Pragma("GCC unroll 16")
#elif defined(__clang__)
#define KVS_UNROLL _Pragma("unroll")
#else
#define KVS_UNROLL
#endif

/* The AVX-512 paths need F + BW + VL (+ VNNI for the integer kernels; the fp16 conversions
 * are part of AVX512F). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KVS_AVX512 1
#else
#define KVS_AVX512 0
#endif
#if KVS_AVX512 && defined(__AVX512VNNI__)
#define KVS_AVX512_VNNI 1
#else
#define KVS_AVX512_VNNI 0
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVS_AVX2 1
#else
#define KVS_AVX2 0
#endif

/* An empty asm that claims to change v, so the compiler keeps v in a register at that point and
 * cannot move or merge the operations on either side of it: used where GCC otherwise folded a
 * loaded operand into every instruction that uses it (matmul_deq.c) or regrouped a chain of
 * integer adds so that all the products were computed first and spilled (matmul_kq_avx2.c). */
#if defined(__GNUC__) && KVS_AVX512
#define KVS_KEEP_REG(v) __asm__("" : "+v"(v))
#elif defined(__GNUC__) && KVS_AVX2
#define KVS_KEEP_REG(v) __asm__("" : "+x"(v))
#else
#define KVS_KEEP_REG(v) ((void)0)
#endif

/* How far ahead of its reads a decode kernel prefetches the weights it streams. The quantised
 * kernels spend enough arithmetic per byte that the hardware prefetcher alone left DRAM idle
 * between bursts: on Zen 5, one thread streaming Q8_0 rows went from 17 to 37 GB/s with this
 * distance (2 KiB: 27, 4 KiB: 29, 16 KiB: 32). The float kernels gain at two threads. */
#ifndef KVS_PREFETCH_BYTES
#define KVS_PREFETCH_BYTES 8192
#endif

/* Prefetches the cache lines of [p, p + bytes) one KVS_PREFETCH_BYTES ahead (bytes a constant
 * after inlining, so the loop unrolls). A prefetch past the end of the weights is harmless. */
#if defined(__GNUC__)
#define KVS_PREFETCH_AHEAD(p, bytes)                                                            \
    do {                                                                                        \
        const char *kvs_pf_ = (const char *)(p) + KVS_PREFETCH_BYTES;                           \
        for (int kvs_pf_i_ = 0; kvs_pf_i_ <= (int)(bytes) / 64; kvs_pf_i_++)                    \
            __builtin_prefetch(kvs_pf_ + 64 * kvs_pf_i_, 0, 3);                                 \
    } while (0)
#else
#define KVS_PREFETCH_AHEAD(p, bytes) ((void)0)
#endif

/* The loop of the AVX2 products (kernels_matmul.c's Q8_0 below Q8_TILE_MIN_ROWS x rows,
 * matmul_kq.c's K-quants) over their x rows r0..r1 and weight rows o0..o1: blocks of 64 x
 * rows, whose quantised x stays in L2 while the weight rows pass over it; in each, every
 * weight row (a few KiB, read from L1 after the first group) against groups of up to 4 x rows:
 * KERNEL(R, c, row, r, y + o) for R 1..4. */
#define KVS_AVX2_ROW_BLOCKS(c, r0, r1, o0, o1, KERNEL)                                          \
    for (int kvs_rb_ = (r0); kvs_rb_ < (r1); kvs_rb_ += 64) {                                   \
        const int kvs_re_ = (r1) - kvs_rb_ < 64 ? (r1) : kvs_rb_ + 64;                          \
        for (int kvs_o_ = (o0); kvs_o_ < (o1); kvs_o_++) {                                      \
            const char *kvs_row_ = (c)->w + (size_t)kvs_o_ * (c)->row_bytes;                    \
            float *kvs_y_ = (c)->y + kvs_o_;                                                    \
            for (int kvs_r_ = kvs_rb_; kvs_r_ < kvs_re_; kvs_r_ += 4)                           \
                switch (kvs_re_ - kvs_r_) {                                                     \
                case 1: KERNEL(1, c, kvs_row_, kvs_r_, kvs_y_); break;                          \
                case 2: KERNEL(2, c, kvs_row_, kvs_r_, kvs_y_); break;                          \
                case 3: KERNEL(3, c, kvs_row_, kvs_r_, kvs_y_); break;                          \
                default: KERNEL(4, c, kvs_row_, kvs_r_, kvs_y_); break;                         \
                }                                                                               \
        }                                                                                       \
    }

/* An unaligned little-endian 16-bit field of a weight block (an fp16 scale). */
static inline uint16_t kvs_load_u16(const char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

#if KVS_AVX2
#include <immintrin.h>

/* The fp16 scales of blocks 0..ng-1 (ng <= 8) at base, stride bytes apart, as fp32; zero
 * beyond ng. Built with register inserts: going through a stack array made the vector reload
 * miss store forwarding, and VPGATHERDD is slow on Zen 4. */
static inline __attribute__((always_inline)) __m256 kvs_fp16x8_at(const char *base, size_t stride,
                                                                  int ng)
{
    __m128i h = _mm_setzero_si128();
#define KVS_INS(lane)                                                                           \
    if ((lane) < ng)                                                                            \
        h = _mm_insert_epi16(h, kvs_load_u16(base + (size_t)(lane) * stride), lane);
    KVS_INS(0) KVS_INS(1) KVS_INS(2) KVS_INS(3) KVS_INS(4) KVS_INS(5) KVS_INS(6) KVS_INS(7)
#undef KVS_INS
    return _mm256_cvtph_ps(h);
}

/* out[g] lane j = in[j] lane g: an 8 x 8 transposition of 32-bit lanes (the prefill tiles
 * turn 8 weight rows into the 8 lanes with it). */
static inline __attribute__((always_inline)) void kvs_transpose8_avx2(const __m256i *in, __m256i *out)
{
    __m256i t[8], v[8];
    KVS_UNROLL
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_epi32(in[j], in[j + 1]);     /* lanes 0 1 | 4 5 of rows j, j + 1 */
        t[j + 1] = _mm256_unpackhi_epi32(in[j], in[j + 1]); /* 2 3 | 6 7 */
    }
    KVS_UNROLL
    for (int h = 0; h < 8; h += 4) { /* rows h .. h + 3 */
        v[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);         /* lane 0 | 4 */
        v[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);     /* 1 | 5 */
        v[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]); /* 2 | 6 */
        v[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]); /* 3 | 7 */
    }
    KVS_UNROLL
    for (int g = 0; g < 4; g++) {
        out[g] = _mm256_permute2x128_si256(v[g], v[4 + g], 0x20);
        out[4 + g] = _mm256_permute2x128_si256(v[g], v[4 + g], 0x31);
    }
}

/* Stores the first nc (1..8) lanes of v at y (a tile's row of 8 output columns). */
static inline __attribute__((always_inline)) void kvs_store8_avx2(float *y, __m256 v, int nc)
{
    if (nc == 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    _Alignas(32) float t[8];
    _mm256_store_ps(t, v);
    for (int j = 0; j < nc; j++)
        y[j] = t[j];
}

/* The sum of the 8 lanes of v. */
static inline __attribute__((always_inline)) float kvs_hsum256(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* The largest |x_i| of x[0..n-1], n a multiple of 8. */
static inline __attribute__((always_inline)) float kvs_amax_avx2(const float *x, int n)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* 32 activations times the reciprocal id of their scale, rounded (cvtps rounds to nearest
 * even, as rintf): q[0..31] and the sums of q over each half of 16. */
static inline __attribute__((always_inline)) void kvs_quant32_id_avx2(const float *x, float id,
                                                                      int8_t *q, int32_t *s16)
{
    const __m256 vid = _mm256_set1_ps(id);
    __m256i iv[4];
    for (int j = 0; j < 4; j++)
        iv[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid));
    /* the packs interleave 128-bit lanes: dwords 0 4 1 5 2 6 3 7 put them back in order */
    const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]),
                                          _mm256_packs_epi32(iv[2], iv[3]));
    _mm256_storeu_si256((__m256i *)q,
                        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int half = 0; half < 2; half++) {
        const __m256i s8 = _mm256_add_epi32(iv[2 * half], iv[2 * half + 1]);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
        s16[half] = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1)));
    }
}

/* A block of 32 activations quantised as the scalar quantisers do (d = amax / 127, q =
 * rint(x / d) through the reciprocal): q[0..31], *d, and the sums of q over each half of 16. */
static inline __attribute__((always_inline)) void kvs_quant32_avx2(const float *x, int8_t *q,
                                                                   float *d, int32_t *s16)
{
    const float db = kvs_amax_avx2(x, 32) / 127.0f;
    kvs_quant32_id_avx2(x, db != 0.0f ? 1.0f / db : 0.0f, q, s16);
    *d = db;
}
#endif

static inline uint32_t kvs_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float kvs_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Portable scalar conversions (bit exact, round to nearest even). */
static inline float kvs_fp16_to_fp32_scalar(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return kvs_bits_f32(kvs_f32_bits(v) | sign);
    }
    if (exp == 31) /* inf, or NaN made quiet (as F16C's vcvtph2ps does) */
        return kvs_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    return kvs_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t kvs_fp32_to_fp16_scalar(float f)
{
    uint32_t x = kvs_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep the top payload bits, force quiet (as F16C does) */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity (inf included) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: half subnormal or zero */
        uint32_t e = ax >> 23;
        if (e < 102) /* < 2^-25: rounds to zero */
            return (uint16_t)sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static inline float kvs_bf16_to_fp32_scalar(uint16_t h) { return kvs_bits_f32((uint32_t)h << 16); }

static inline uint16_t kvs_fp32_to_bf16_scalar(float f)
{
    uint32_t x = kvs_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate and force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif
