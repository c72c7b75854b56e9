/* Keyed random streams (src/core/random.h) and the documented streams built on them.
 *
 * Every expected value below was recorded from the implementations the module replaced (the
 * private splitmix64 / xoshiro256** copies in policies/random.c, policies/nacl.c,
 * policies/hashevict.c, model/synthetic.c and tokenizer/sampler.c, as of the commit before
 * src/core/random.c existed), so a change to any seeded stream fails here first. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "kvslim.h"
#include "policies/hashevict.h"
#include "policies/nacl.h"

/* ---- the module's primitives ---- */

static void test_splitmix64(void)
{
    static const uint64_t in[5] = {0, 1, 42, UINT64_MAX, 0x0123456789abcdefULL};
    static const uint64_t out[5] = {0xe220a8397b1dcdafULL, 0x910a2dec89025cc1ULL,
                                    0xbdd732262feb6e95ULL, 0xe4d971771b652c20ULL,
                                    0x157a3807a48faa9dULL};
    for (int i = 0; i < 5; i++)
        CHECKF(kvs_splitmix64(in[i]) == out[i], "input %d", i);
    /* The sequential generator: the state advances by the gamma, each output mixes it. */
    uint64_t x = 7;
    CHECK(kvs_splitmix64_next(&x) == 0x63cbe1e459320dd7ULL);
    CHECK(kvs_splitmix64_next(&x) == 0x044c3cd7f43c661cULL);
    CHECK(kvs_splitmix64_next(&x) == 0xe6984080bab12a02ULL);
    CHECK(x == 0xdaa66d2c7ddf7446ULL);
    CHECK(x == 7 + 3 * KVS_RANDOM_GAMMA);
}

static void test_xoshiro(void)
{
    /* Seeded as HashEvict seeds layer 3 of seed 5, and as the sampler seeds seed 42. */
    static const uint64_t he[4] = {0x9516496648c2d1e2ULL, 0xdf97a664bc15903eULL,
                                   0x239e1e5c11bcf662ULL, 0x382fea3378146208ULL};
    static const uint64_t sm[4] = {0x15780b2e0c2ec716ULL, 0x6104d9866d113a7eULL,
                                   0xae17533239e499a1ULL, 0xecb8ad4703b360a1ULL};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 5 ^ (0xd1b54a32d192ed03ULL * (3 + 1)));
    for (int i = 0; i < 4; i++)
        CHECKF(kvs_xoshiro_next(&g) == he[i], "draw %d", i);
    kvs_xoshiro_seed(&g, 42);
    for (int i = 0; i < 4; i++)
        CHECKF(kvs_xoshiro_next(&g) == sm[i], "draw %d", i);
}

/* The keyed chains and the two ways of indexing a keyed stream. */
static void test_keyed(void)
{
    /* random's (seed 9, layer 2, head 1): a counter stream. */
    const uint64_t rk[2] = {2, 1};
    const uint64_t key = kvs_random_key(9, rk, 2);
    CHECK(key == 0x8fff18f5f73a8d0aULL);
    kvs_random_stream s = {key, 0};
    CHECK(kvs_random_next(&s) == 0xd0eeb837abc811eaULL);
    CHECK(kvs_random_next(&s) == 0x8a2956ede9b1a36aULL);
    CHECK(kvs_random_next(&s) == 0x8481df8e6d65f7a5ULL);
    CHECK(s.counter == 3);
    CHECK(kvs_random_counter(key, 2) == 0x8a2956ede9b1a36aULL);
    static const uint64_t below[5] = {97, 260, 142, 264, 356};
    for (int i = 0; i < 5; i++)
        CHECKF(kvs_random_below(&s, 1000) == below[i], "draw %d", i);
    /* A bound just above 2^63 rejects almost half the range: the rejection path runs. */
    CHECK(kvs_random_below(&s, (1ULL << 63) + 1) == 6189093843813716595ULL);
    kvs_random_stream one = {key, 0};
    for (int i = 0; i < 8; i++)
        CHECK(kvs_random_below(&one, 1) == 0);

    /* NaCl's (seed 3, layer 4, head 1, event 2): indexed by position. */
    const uint64_t nk[3] = {4, 1, 2};
    const uint64_t k2 = kvs_random_key(3, nk, 3);
    CHECK(k2 == 0x16384a4c0afd2c1bULL);
    CHECK(kvs_random_unit_open(kvs_random_at(k2, 0)) == 0x1.9e4d976771f45p-2);
    CHECK(kvs_random_unit_open(kvs_random_at(k2, 17)) == 0x1.0f41a3f5d2313p-2);
    CHECK(kvs_random_unit_open(kvs_random_at(k2, (uint64_t)-1)) == 0x1.3351d3811c3eap-3);
    CHECK(kvs_random_key(3, NULL, 0) == kvs_splitmix64(3));
}

/* The three conversions to doubles and their ranges. */
static void test_units(void)
{
    CHECK(kvs_random_unit(0) == 0.0);
    CHECK(kvs_random_unit(UINT64_MAX) == 1.0 - 0x1p-53);
    CHECK(kvs_random_unit_open(0) == 0x1p-54);
    /* Above 2^52, b + 1/2 is a tie that rounds to even: the top value b = 2^53 - 1 gives
     * exactly 1 (NaCl's stream has always done so; probability 2^-53 per draw). */
    CHECK(kvs_random_unit_open(UINT64_MAX) == 1.0);
    CHECK(kvs_random_unit_open(UINT64_MAX - 2048) < 1.0);
    CHECK(kvs_random_unit_nonzero(0) == 0x1p-53);
    CHECK(kvs_random_unit_nonzero(UINT64_MAX) == 1.0);
    /* The synthetic model's weights: (0, 1] draws of the sequential generator from its seed. */
    uint64_t x = 11;
    CHECK(kvs_random_unit_nonzero(kvs_splitmix64_next(&x)) == 0x1.43d591f48e00ep-2);
    CHECK(kvs_random_unit_nonzero(kvs_splitmix64_next(&x)) == 0x1.0ca97349e9ac6p-2);
    CHECK(kvs_random_unit_nonzero(kvs_splitmix64_next(&x)) == 0x1.46ad7c60dd363p-1);
}

/* ---- the documented streams, through the functions that expose them ---- */

/* NaCl's Gumbel stream (nacl.h): uniform and Gumbel draws of (seed, layer, head, event, pos). */
static void test_nacl_stream(void)
{
    CHECK(kvs_nacl_uniform(3, 4, 1, 2, 17) == 0x1.0f41a3f5d2313p-2);
    CHECK(kvs_nacl_uniform(0, 0, 0, 0, 0) == 0x1.e2b96a69ad7f5p-2);
    CHECK(kvs_nacl_gumbel(3, 4, 1, 2, 17) == -0x1.22cbd5645fa15p-2);
    CHECK(kvs_nacl_gumbel(7, 1, 3, 0, 100) == -0x1.d1abb41d59dafp-1);
}

/* HashEvict's projection generator (hashevict.h): SplitMix64-seeded xoshiro256**, Box-Muller. */
static void test_hashevict_stream(void)
{
    static const float gauss[5] = {0x1.d99e66p-1f, -0x1.e331p-1f, 0x1.ab4d14p-4f,
                                   0x1.131f68p-1f, -0x1.ec12p-2f};
    static const float proj[6] = {0x1.583d9ap-1f, -0x1.510f2ep+0f, 0x1.8b9332p+0f,
                                  -0x1.4bd5fp+0f, 0x1.15ad7ep+0f, 0x1.9ac62p-2f};
    float g[5], R[6];
    kvs_he_gauss(5, 3, g, 5);
    CHECK(memcmp(g, gauss, sizeof g) == 0);
    kvs_he_projection(0, 1, 3, 2, R);
    CHECK(memcmp(R, proj, sizeof R) == 0);
}

/* The sampler's draws for a fixed seed and fixed logits (kvslim.h promises the same tokens on
 * every platform). */
static void test_sampler_stream(void)
{
    static const int expect[24] = {1, 13, 11, 14, 2, 14, 7, 3, 9, 10, 8, 4,
                                   3, 10, 6, 13, 9, 14, 15, 13, 13, 4, 6, 1};
    float logits[16];
    for (int i = 0; i < 16; i++)
        logits[i] = (float)(i % 5) * 0.3f;
    kvs_sampler_params sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 1234};
    kvs_sampler *s = NULL;
    kvs_error err;
    CHECK(kvs_sampler_new(16, &sp, &s, &err) == KVS_OK);
    if (!s)
        return;
    int same = 1;
    for (int i = 0; i < 24; i++)
        same &= kvs_sampler_sample(s, logits) == expect[i];
    CHECK(same);
    kvs_sampler_free(s);
}

int main(void)
{
    test_splitmix64();
    test_xoshiro();
    test_keyed();
    test_units();
    test_nacl_stream();
    test_hashevict_stream();
    test_sampler_stream();
    return check_summary("test_random");
}
