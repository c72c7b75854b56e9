/* Fixed-key AES-128 (Matyas-Meyer-Oseas) length expansion for the FSS trees (fss_internal.h). */
#include "mpc/fss_internal.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AES__
#include <wmmintrin.h>
#endif
#if defined(__AES__) && defined(__VAES__) && defined(__AVX512F__)
#include <immintrin.h>
#define KVS_FSS_VAES 1
#endif

/* The fixed public keys K_0..K_2: the ASCII strings below, 16 bytes each, no terminator. */
static const char kvs_fss_keys[KVS_FSS_PRG_KEYS][16] = {
    {'k', 'v', 's', 'l', 'i', 'm', ' ', 'f', 's', 's', ' ', 'G', ' ', 's', '.', 'L'},
    {'k', 'v', 's', 'l', 'i', 'm', ' ', 'f', 's', 's', ' ', 'G', ' ', 's', '.', 'R'},
    {'k', 'v', 's', 'l', 'i', 'm', ' ', 'f', 's', 's', ' ', 'G', ' ', 'v', 'a', 'l'},
};

#ifdef __AES__
/* Their AES-128 key schedules (round keys 0..10, FIPS-197 §5.2), precomputed so that the AES-NI
 * path needs no context; kvs_fss_schedule_ok checks them against the run-time expansion. */
static const uint8_t kvs_fss_round_keys[KVS_FSS_PRG_KEYS][11][16] = {
    {/* K_0 = "kvslim fss G s.L" */
     {0x6b, 0x76, 0x73, 0x6c, 0x69, 0x6d, 0x20, 0x66, 0x73, 0x73, 0x20, 0x47, 0x20, 0x73, 0x2e, 0x4c},
     {0xe5, 0x47, 0x5a, 0xdb, 0x8c, 0x2a, 0x7a, 0xbd, 0xff, 0x59, 0x5a, 0xfa, 0xdf, 0x2a, 0x74, 0xb6},
     {0x02, 0xd5, 0x14, 0x45, 0x8e, 0xff, 0x6e, 0xf8, 0x71, 0xa6, 0x34, 0x02, 0xae, 0x8c, 0x40, 0xb4},
     {0x62, 0xdc, 0x99, 0xa1, 0xec, 0x23, 0xf7, 0x59, 0x9d, 0x85, 0xc3, 0x5b, 0x33, 0x09, 0x83, 0xef},
     {0x6b, 0x30, 0x46, 0x62, 0x87, 0x13, 0xb1, 0x3b, 0x1a, 0x96, 0x72, 0x60, 0x29, 0x9f, 0xf1, 0x8f},
     {0xa0, 0x91, 0x35, 0xc7, 0x27, 0x82, 0x84, 0xfc, 0x3d, 0x14, 0xf6, 0x9c, 0x14, 0x8b, 0x07, 0x13},
     {0xbd, 0x54, 0x48, 0x3d, 0x9a, 0xd6, 0xcc, 0xc1, 0xa7, 0xc2, 0x3a, 0x5d, 0xb3, 0x49, 0x3d, 0x4e},
     {0xc6, 0x73, 0x67, 0x50, 0x5c, 0xa5, 0xab, 0x91, 0xfb, 0x67, 0x91, 0xcc, 0x48, 0x2e, 0xac, 0x82},
     {0x77, 0xe2, 0x74, 0x02, 0x2b, 0x47, 0xdf, 0x93, 0xd0, 0x20, 0x4e, 0x5f, 0x98, 0x0e, 0xe2, 0xdd},
     {0xc7, 0x7a, 0xb5, 0x44, 0xec, 0x3d, 0x6a, 0xd7, 0x3c, 0x1d, 0x24, 0x88, 0xa4, 0x13, 0xc6, 0x55},
     {0x8c, 0xce, 0x49, 0x0d, 0x60, 0xf3, 0x23, 0xda, 0x5c, 0xee, 0x07, 0x52, 0xf8, 0xfd, 0xc1, 0x07},
    },
    {/* K_1 = "kvslim fss G s.R" */
     {0x6b, 0x76, 0x73, 0x6c, 0x69, 0x6d, 0x20, 0x66, 0x73, 0x73, 0x20, 0x47, 0x20, 0x73, 0x2e, 0x52},
     {0xe5, 0x47, 0x73, 0xdb, 0x8c, 0x2a, 0x53, 0xbd, 0xff, 0x59, 0x73, 0xfa, 0xdf, 0x2a, 0x5d, 0xa8},
     {0x02, 0x0b, 0xb1, 0x45, 0x8e, 0x21, 0xe2, 0xf8, 0x71, 0x78, 0x91, 0x02, 0xae, 0x52, 0xcc, 0xaa},
     {0x06, 0x40, 0x1d, 0xa1, 0x88, 0x61, 0xff, 0x59, 0xf9, 0x19, 0x6e, 0x5b, 0x57, 0x4b, 0xa2, 0xf1},
     {0xbd, 0x7a, 0xbc, 0xfa, 0x35, 0x1b, 0x43, 0xa3, 0xcc, 0x02, 0x2d, 0xf8, 0x9b, 0x49, 0x8f, 0x09},
     {0x96, 0x09, 0xbd, 0xee, 0xa3, 0x12, 0xfe, 0x4d, 0x6f, 0x10, 0xd3, 0xb5, 0xf4, 0x59, 0x5c, 0xbc},
     {0x7d, 0x43, 0xd8, 0x51, 0xde, 0x51, 0x26, 0x1c, 0xb1, 0x41, 0xf5, 0xa9, 0x45, 0x18, 0xa9, 0x15},
     {0x90, 0x90, 0x81, 0x3f, 0x4e, 0xc1, 0xa7, 0x23, 0xff, 0x80, 0x52, 0x8a, 0xba, 0x98, 0xfb, 0x9f},
     {0x56, 0x9f, 0x5a, 0xcb, 0x18, 0x5e, 0xfd, 0xe8, 0xe7, 0xde, 0xaf, 0x62, 0x5d, 0x46, 0x54, 0xfd},
     {0x17, 0xbf, 0x0e, 0x87, 0x0f, 0xe1, 0xf3, 0x6f, 0xe8, 0x3f, 0x5c, 0x0d, 0xb5, 0x79, 0x08, 0xf0},
     {0x97, 0x8f, 0x82, 0x52, 0x98, 0x6e, 0x71, 0x3d, 0x70, 0x51, 0x2d, 0x30, 0xc5, 0x28, 0x25, 0xc0},
    },
    {/* K_2 = "kvslim fss G val" */
     {0x6b, 0x76, 0x73, 0x6c, 0x69, 0x6d, 0x20, 0x66, 0x73, 0x73, 0x20, 0x47, 0x20, 0x76, 0x61, 0x6c},
     {0x52, 0x99, 0x23, 0xdb, 0x3b, 0xf4, 0x03, 0xbd, 0x48, 0x87, 0x23, 0xfa, 0x68, 0xf1, 0x42, 0x96},
     {0xf1, 0xb5, 0xb3, 0x9e, 0xca, 0x41, 0xb0, 0x23, 0x82, 0xc6, 0x93, 0xd9, 0xea, 0x37, 0xd1, 0x4f},
     {0x6f, 0x8b, 0x37, 0x19, 0xa5, 0xca, 0x87, 0x3a, 0x27, 0x0c, 0x14, 0xe3, 0xcd, 0x3b, 0xc5, 0xac},
     {0x85, 0x2d, 0xa6, 0xa4, 0x20, 0xe7, 0x21, 0x9e, 0x07, 0xeb, 0x35, 0x7d, 0xca, 0xd0, 0xf0, 0xd1},
     {0xe5, 0xa1, 0x98, 0xd0, 0xc5, 0x46, 0xb9, 0x4e, 0xc2, 0xad, 0x8c, 0x33, 0x08, 0x7d, 0x7c, 0xe2},
     {0x3a, 0xb1, 0x00, 0xe0, 0xff, 0xf7, 0xb9, 0xae, 0x3d, 0x5a, 0x35, 0x9d, 0x35, 0x27, 0x49, 0x7f},
     {0xb6, 0x8a, 0xd2, 0x76, 0x49, 0x7d, 0x6b, 0xd8, 0x74, 0x27, 0x5e, 0x45, 0x41, 0x00, 0x17, 0x3a},
     {0x55, 0x7a, 0x52, 0xf5, 0x1c, 0x07, 0x39, 0x2d, 0x68, 0x20, 0x67, 0x68, 0x29, 0x20, 0x70, 0x52},
     {0xf9, 0x2b, 0x52, 0x50, 0xe5, 0x2c, 0x6b, 0x7d, 0x8d, 0x0c, 0x0c, 0x15, 0xa4, 0x2c, 0x7c, 0x47},
     {0xbe, 0x3b, 0xf2, 0x19, 0x5b, 0x17, 0x99, 0x64, 0xd6, 0x1b, 0x95, 0x71, 0x72, 0x37, 0xe9, 0x36},
    },
};
#endif

static void block_to_bytes(kvs_fss_block b, uint8_t out[16])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(b.lo >> (8 * i));
        out[8 + i] = (uint8_t)(b.hi >> (8 * i));
    }
}

static kvs_fss_block block_from_bytes(const uint8_t in[16])
{
    kvs_fss_block b = {0, 0};
    for (int i = 0; i < 8; i++) {
        b.lo |= (uint64_t)in[i] << (8 * i);
        b.hi |= (uint64_t)in[8 + i] << (8 * i);
    }
    return b;
}

#ifdef __AES__
/* One step of the AES-128 key expansion: w[4i..4i+3] from the previous round key and the
 * keygenassist word (SubWord(RotWord(w[4i-1])) xor Rcon in its top lane). */
static __m128i expand_step(__m128i key, __m128i assist)
{
    assist = _mm_shuffle_epi32(assist, 0xff);
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
    return _mm_xor_si128(key, assist);
}

#define KVS_FSS_ROUND(rk, i, rcon) \
    rk[i] = expand_step(rk[(i) - 1], _mm_aeskeygenassist_si128(rk[(i) - 1], rcon))

static void expand_key(const uint8_t key[16], __m128i rk[11])
{
    rk[0] = _mm_loadu_si128((const __m128i *)(const void *)key);
    KVS_FSS_ROUND(rk, 1, 0x01);
    KVS_FSS_ROUND(rk, 2, 0x02);
    KVS_FSS_ROUND(rk, 3, 0x04);
    KVS_FSS_ROUND(rk, 4, 0x08);
    KVS_FSS_ROUND(rk, 5, 0x10);
    KVS_FSS_ROUND(rk, 6, 0x20);
    KVS_FSS_ROUND(rk, 7, 0x40);
    KVS_FSS_ROUND(rk, 8, 0x80);
    KVS_FSS_ROUND(rk, 9, 0x1b);
    KVS_FSS_ROUND(rk, 10, 0x36);
}

static __m128i rk_load(int j, int r)
{
    return _mm_loadu_si128((const __m128i *)(const void *)kvs_fss_round_keys[j][r]);
}

/* x86 is little-endian, so a block's {lo, hi} is its byte string. */
static __m128i block_load(kvs_fss_block b)
{
    return _mm_set_epi64x((long long)b.hi, (long long)b.lo);
}

static kvs_fss_block block_store(__m128i v)
{
    kvs_fss_block b;
    b.lo = (uint64_t)_mm_cvtsi128_si64(v);
    b.hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v));
    return b;
}

/* The batch with its sizes known at compile time (the loops unroll, the state stays in
 * registers); inlined for each (count, nout) the callers use. */
static inline __attribute__((always_inline)) void
expand_batch_fixed(const kvs_fss_block *s, const int count, const int nout, kvs_fss_block *out)
{
    __m128i in[KVS_FSS_PRG_BATCH], x[KVS_FSS_PRG_BATCH * KVS_FSS_PRG_KEYS];
    for (int i = 0; i < count; i++) {
        in[i] = block_load(s[i]);
        for (int j = 0; j < nout; j++)
            x[i * nout + j] = _mm_xor_si128(in[i], rk_load(j, 0));
    }
    for (int r = 1; r < 10; r++)
        for (int i = 0; i < count; i++)
            for (int j = 0; j < nout; j++)
                x[i * nout + j] = _mm_aesenc_si128(x[i * nout + j], rk_load(j, r));
    for (int i = 0; i < count; i++)
        for (int j = 0; j < nout; j++)
            out[i * nout + j] = block_store(
                _mm_xor_si128(_mm_aesenclast_si128(x[i * nout + j], rk_load(j, 10)), in[i]));
}

/* One seed: the rounds of its nout keys interleaved, so that the AES units pipeline them. */
static void expand_aesni(kvs_fss_block s, int nout, kvs_fss_block *out)
{
    __m128i in = block_load(s), x[KVS_FSS_PRG_KEYS];
    for (int j = 0; j < nout; j++)
        x[j] = _mm_xor_si128(in, rk_load(j, 0));
    for (int r = 1; r < 10; r++)
        for (int j = 0; j < nout; j++)
            x[j] = _mm_aesenc_si128(x[j], rk_load(j, r));
    for (int j = 0; j < nout; j++)
        out[j] = block_store(_mm_xor_si128(_mm_aesenclast_si128(x[j], rk_load(j, 10)), in));
}

#ifdef KVS_FSS_VAES
/* A full batch of 8 seeds with VAES: four blocks per 512-bit register, one register per group of
 * four seeds and key, so nout x 2 registers go through the rounds side by side. */
static void expand8_vaes(const kvs_fss_block *s, int nout, kvs_fss_block *out)
{
    __m512i in[2], x[KVS_FSS_PRG_KEYS][2];
    in[0] = _mm512_loadu_si512((const void *)s);
    in[1] = _mm512_loadu_si512((const void *)(s + 4));
    for (int j = 0; j < nout; j++)
        for (int h = 0; h < 2; h++)
            x[j][h] = _mm512_xor_si512(in[h], _mm512_broadcast_i32x4(rk_load(j, 0)));
    for (int r = 1; r < 10; r++)
        for (int j = 0; j < nout; j++) {
            const __m512i k = _mm512_broadcast_i32x4(rk_load(j, r));
            x[j][0] = _mm512_aesenc_epi128(x[j][0], k);
            x[j][1] = _mm512_aesenc_epi128(x[j][1], k);
        }
    kvs_fss_block tmp[KVS_FSS_PRG_KEYS][8];
    for (int j = 0; j < nout; j++) {
        const __m512i k = _mm512_broadcast_i32x4(rk_load(j, 10));
        for (int h = 0; h < 2; h++)
            _mm512_storeu_si512((void *)(tmp[j] + 4 * h),
                                _mm512_xor_si512(_mm512_aesenclast_epi128(x[j][h], k), in[h]));
    }
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < nout; j++)
            out[i * nout + j] = tmp[j][i];
}
#endif

static void expand_batch_aesni(const kvs_fss_block *s, int count, int nout, kvs_fss_block *out)
{
#ifdef KVS_FSS_VAES
    if (count == 8) {
        expand8_vaes(s, nout, out);
        return;
    }
#endif
    if (count == KVS_FSS_PRG_BATCH && nout == 3)
        expand_batch_fixed(s, KVS_FSS_PRG_BATCH, 3, out);
    else if (count == KVS_FSS_PRG_BATCH && nout == 2)
        expand_batch_fixed(s, KVS_FSS_PRG_BATCH, 2, out);
    else
        for (int i = 0; i < count; i++)
            expand_aesni(s[i], nout, out + i * nout);
}
#endif

int kvs_fss_have_aesni(void)
{
#ifdef __AES__
    return 1;
#else
    return 0;
#endif
}

static EVP_CIPHER_CTX *evp_new(const uint8_t key[16])
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (!c || EVP_EncryptInit_ex(c, EVP_aes_128_ecb(), NULL, key, NULL) != 1 ||
        EVP_CIPHER_CTX_set_padding(c, 0) != 1) {
        EVP_CIPHER_CTX_free(c);
        return NULL;
    }
    return c;
}

static int evp_block(EVP_CIPHER_CTX *c, const uint8_t in[16], uint8_t out[16])
{
    int len = 0;
    return EVP_EncryptUpdate(c, out, &len, in, 16) == 1 && len == 16 ? 0 : -1;
}

static _Noreturn void evp_die(void)
{
    fprintf(stderr, "kvslim: fss: OpenSSL AES-128-ECB failed\n");
    abort();
}

void kvs_fss_prg_init(kvs_fss_prg *g, int force_evp)
{
    memset(g, 0, sizeof *g);
    g->evp = force_evp || !kvs_fss_have_aesni();
    if (!g->evp)
        return;
    for (int j = 0; j < KVS_FSS_PRG_KEYS; j++)
        if (!(g->ctx[j] = evp_new((const uint8_t *)kvs_fss_keys[j])))
            evp_die();
}

void kvs_fss_prg_free(kvs_fss_prg *g)
{
    for (int j = 0; j < KVS_FSS_PRG_KEYS; j++) {
        if (g->ctx[j])
            EVP_CIPHER_CTX_free((EVP_CIPHER_CTX *)g->ctx[j]);
        g->ctx[j] = NULL;
    }
}

void kvs_fss_prg_expand(const kvs_fss_prg *g, kvs_fss_block s, int nout, kvs_fss_block *out)
{
#ifdef __AES__
    if (!g->evp) {
        expand_aesni(s, nout, out);
        return;
    }
#endif
    uint8_t in[16], enc[16];
    block_to_bytes(s, in);
    for (int j = 0; j < nout; j++) {
        if (evp_block((EVP_CIPHER_CTX *)g->ctx[j], in, enc) != 0)
            evp_die();
        kvs_fss_block e = block_from_bytes(enc);
        out[j].lo = e.lo ^ s.lo;
        out[j].hi = e.hi ^ s.hi;
    }
}

void kvs_fss_prg_expand_batch(const kvs_fss_prg *g, const kvs_fss_block *s, int count, int nout,
                              kvs_fss_block *out)
{
#ifdef __AES__
    if (!g->evp) {
        expand_batch_aesni(s, count, nout, out);
        return;
    }
#endif
    for (int i = 0; i < count; i++)
        kvs_fss_prg_expand(g, s[i], nout, out + i * nout);
}

int kvs_fss_aes128_block(int evp, const uint8_t key[16], const uint8_t in[16], uint8_t out[16])
{
    if (evp) {
        EVP_CIPHER_CTX *c = evp_new(key);
        int rc = c ? evp_block(c, in, out) : -1;
        EVP_CIPHER_CTX_free(c);
        return rc;
    }
#ifdef __AES__
    __m128i rk[11];
    expand_key(key, rk);
    __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)in), rk[0]);
    for (int r = 1; r < 10; r++)
        x = _mm_aesenc_si128(x, rk[r]);
    _mm_storeu_si128((__m128i *)(void *)out, _mm_aesenclast_si128(x, rk[10]));
    return 0;
#else
    (void)in;
    (void)out;
    return -1;
#endif
}

int kvs_fss_schedule_ok(void)
{
#ifdef __AES__
    for (int j = 0; j < KVS_FSS_PRG_KEYS; j++) {
        __m128i rk[11];
        uint8_t b[16];
        expand_key((const uint8_t *)kvs_fss_keys[j], rk);
        for (int r = 0; r < 11; r++) {
            _mm_storeu_si128((__m128i *)(void *)b, rk[r]);
            if (memcmp(b, kvs_fss_round_keys[j][r], 16) != 0)
                return 0;
        }
    }
#endif
    return 1;
}
