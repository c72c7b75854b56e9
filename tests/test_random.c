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
#include "kvslim.h"
#include "policies/hashevict.h"
#include "policies/nacl.h"

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
    test_nacl_stream();
    test_hashevict_stream();
    test_sampler_stream();
    return check_summary("test_random");
}
