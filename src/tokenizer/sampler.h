/* Next-token sampling: greedy, temperature, top-k, top-p; seeded and reproducible. */
#ifndef KVS_SAMPLER_H
#define KVS_SAMPLER_H

#include <stdint.h>

typedef struct kvs_sampler_params {
    float temperature; /* 0 = greedy (argmax, ties to the lowest id) */
    int top_k;         /* 0 = off */
    float top_p;       /* 1.0 = off */
    uint64_t seed;
} kvs_sampler_params;

typedef struct kvs_sampler kvs_sampler;

kvs_sampler *kvs_sampler_new(int n_vocab, kvs_sampler_params params);
void kvs_sampler_free(kvs_sampler *s);
/* Picks a token from logits (not modified). The same seed and logits give the same sequence on
 * every platform: the RNG is a counter-free xorshift/splitmix state inside the sampler. */
int kvs_sampler_sample(kvs_sampler *s, const float *logits);

#endif
