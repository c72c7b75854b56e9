/* The unit tests' random numbers: xorshift64, its state private to each test program, so every
 * run draws the same cases. Define RNG_SEED before including to start elsewhere. */
#ifndef KVS_TEST_RNG_H
#define KVS_TEST_RNG_H

#include <stdint.h>

#ifndef RNG_SEED
#define RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng_state = RNG_SEED;

static inline uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in [-1, 1). */
static inline float rnd_unit(void)
{
    return (float)((rnd_u32() >> 8) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

#endif
