/* random: one-shot at prefill end, keep budget slots per (layer, KV head) drawn uniformly
 * without replacement. The draw uses a counter-based generator keyed by (seed, layer, head), so
 * the kept set depends on nothing else (threads, call order, other heads). */
#include <stdint.h>
#include <stdlib.h>

#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"seed", 0, 0, 4294967295.0, 1, "random seed"},
};

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The i-th draw of the stream of key: splitmix64 of the key hash plus a counter. */
typedef struct stream {
    uint64_t key, counter;
} stream;

static uint64_t next(stream *s) { return splitmix64(s->key + 0x9e3779b97f4a7c15ULL * ++s->counter); }

/* Uniform in [0, m), m >= 1, by rejection of the biased top of the 64-bit range. */
static uint64_t below(stream *s, uint64_t m)
{
    const uint64_t limit = UINT64_MAX - UINT64_MAX % m;
    uint64_t x;
    do
        x = next(s);
    while (x >= limit);
    return x % m;
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    return kvs_policy_check_context(p, err);
}

static int by_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    const uint64_t seed = (uint64_t)kvs_policy_param(p, "seed");
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h), b = p->budget;
        if (n <= b)
            continue;
        int *idx = malloc(sizeof(int) * (size_t)n);
        if (!idx)
            return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", p->spec.user);
        for (int i = 0; i < n; i++)
            idx[i] = i;
        stream s = {splitmix64(splitmix64(splitmix64(seed) ^ (uint64_t)layer) ^ (uint64_t)h), 0};
        /* Partial Fisher-Yates: the first b entries become a uniform sample without replacement. */
        for (int i = 0; i < b; i++) {
            int j = i + (int)below(&s, (uint64_t)(n - i));
            int t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
        }
        qsort(idx, (size_t)b, sizeof *idx, by_int);
        kvs_store_keep(p->store, layer, h, idx, b);
        free(idx);
    }
    return KVS_OK;
}

const kvs_policy_type kvs_policy_random = {
    .name = "random",
    .summary = "random: keep a uniform random sample of the prompt tokens (one-shot, seeded)",
    .kind = KVS_KIND_ONE_SHOT,
    .params = params,
    .n_params = 1,
    .start = start,
    .prefill_end = prefill_end,
};
