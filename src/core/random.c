/* Keyed random streams (see random.h for every definition). */
#include "core/random.h"

uint64_t kvs_splitmix64(uint64_t x)
{
    x += KVS_RANDOM_GAMMA;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t kvs_splitmix64_next(uint64_t *state)
{
    const uint64_t x = *state;
    *state += KVS_RANDOM_GAMMA;
    return kvs_splitmix64(x);
}

uint64_t kvs_random_key(uint64_t seed, const uint64_t *words, int n)
{
    uint64_t k = kvs_splitmix64(seed);
    for (int i = 0; i < n; i++)
        k = kvs_splitmix64(k ^ words[i]);
    return k;
}

uint64_t kvs_random_at(uint64_t key, uint64_t i)
{
    return kvs_splitmix64(key ^ (i * 0xd1b54a32d192ed03ULL));
}

uint64_t kvs_random_counter(uint64_t key, uint64_t i)
{
    return kvs_splitmix64(key + KVS_RANDOM_GAMMA * i);
}

uint64_t kvs_random_next(kvs_random_stream *s) { return kvs_random_counter(s->key, ++s->counter); }

uint64_t kvs_random_below(kvs_random_stream *s, uint64_t m)
{
    const uint64_t limit = UINT64_MAX - UINT64_MAX % m;
    uint64_t x;
    do
        x = kvs_random_next(s);
    while (x >= limit);
    return x % m;
}

void kvs_xoshiro_seed(kvs_xoshiro *g, uint64_t x)
{
    for (int i = 0; i < 4; i++)
        g->s[i] = kvs_splitmix64_next(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kvs_xoshiro_next(kvs_xoshiro *g)
{
    uint64_t *s = g->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kvs_random_unit(uint64_t x) { return (double)(x >> 11) * 0x1p-53; }

/* (x >> 11) + 0.5 rounds to even above 2^52, as the NaCl stream always has: keep the order. */
double kvs_random_unit_open(uint64_t x) { return ((double)(x >> 11) + 0.5) * 0x1p-53; }

double kvs_random_unit_nonzero(uint64_t x) { return ((double)(x >> 11) + 1.0) * 0x1p-53; }
