/* Keyed random streams: every seeded draw in kvslim comes from here, so each stream is defined
 * once. No global state: a generator is a value its owner holds, and a keyed stream is a pure
 * function of its key, so draws do not depend on threads or call order.
 *
 * SplitMix64 (Steele, Lea and Flood, 2014) with gamma G = 0x9e3779b97f4a7c15:
 *   kvs_splitmix64(x): z = x + G; z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9;
 *                      z = (z ^ z >> 27) * 0x94d049bb133111eb; return z ^ z >> 31
 * i.e. the next output of a SplitMix64 generator whose state is x.
 *
 * Streams built on it (each user documents its own):
 *   - a key chain: key = kvs_splitmix64(seed), then key = kvs_splitmix64(key ^ word) per word
 *     (policies random and nacl key their streams by (seed, layer, head[, event]));
 *   - draw i of a counter stream: kvs_splitmix64(key + G * i), i = 1, 2, ... (random);
 *   - the draw at index i of a keyed stream: kvs_splitmix64(key ^ i * 0xd1b54a32d192ed03)
 *     (nacl: one draw per token position);
 *   - xoshiro256** (Blackman and Vigna) seeded with four successive SplitMix64 outputs (the
 *     sampler; HashEvict's projections).
 * Doubles take the top 53 bits b = x >> 11: b 2^-53 in [0, 1); (b + 1/2) 2^-53, computed in
 * double, in (0, 1] (b + 1/2 rounds to even above 2^52, so b = 2^53 - 1 gives exactly 1); and
 * (b + 1) 2^-53 in (0, 1]. */
#ifndef KVS_RANDOM_H
#define KVS_RANDOM_H

#include <stdint.h>

#define KVS_RANDOM_GAMMA 0x9e3779b97f4a7c15ULL

/* SplitMix64 of x (see above): a pure function, the building block of every keyed stream. */
uint64_t kvs_splitmix64(uint64_t x);
/* The sequential SplitMix64 generator: *state += G and returns kvs_splitmix64 of the old state. */
uint64_t kvs_splitmix64_next(uint64_t *state);

/* kvs_splitmix64(seed), then chained with each of the n words (n may be 0, words NULL). */
uint64_t kvs_random_key(uint64_t seed, const uint64_t *words, int n);
/* The draw at index i of the stream of key: kvs_splitmix64(key ^ i * 0xd1b54a32d192ed03). */
uint64_t kvs_random_at(uint64_t key, uint64_t i);
/* Draw i of the counter stream of key: kvs_splitmix64(key + G * i). */
uint64_t kvs_random_counter(uint64_t key, uint64_t i);

/* A counter stream: key and the number of draws taken. Start it at {key, 0}. */
typedef struct kvs_random_stream {
    uint64_t key, counter;
} kvs_random_stream;
/* The next draw: kvs_random_counter(key, ++counter). */
uint64_t kvs_random_next(kvs_random_stream *s);
/* Uniform in [0, m), m >= 1: draws until one falls below the largest multiple of m in the
 * 64-bit range (no modulo bias), then takes it modulo m. */
uint64_t kvs_random_below(kvs_random_stream *s, uint64_t m);

/* xoshiro256**, seeded from x by four kvs_splitmix64_next draws (never the all-zero state). */
typedef struct kvs_xoshiro {
    uint64_t s[4];
} kvs_xoshiro;
void kvs_xoshiro_seed(kvs_xoshiro *g, uint64_t x);
uint64_t kvs_xoshiro_next(kvs_xoshiro *g);

/* The top 53 bits of x as a double: in [0, 1); plus half a step, never 0 (1 only for the top
 * value, see above: the NaCl stream's documented rounding); plus one step, in (0, 1]. */
double kvs_random_unit(uint64_t x);
double kvs_random_unit_open(uint64_t x);
double kvs_random_unit_nonzero(uint64_t x);

#endif
