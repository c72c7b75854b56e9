/* random: one-shot at prefill end, keep budget slots per (layer, KV head) drawn uniformly
 * without replacement. The draw uses a counter-based generator keyed by (seed, layer, head), so
 * the kept set depends on nothing else (threads, call order, other heads). */
#include <stdint.h>
#include <stdlib.h>

#include "core/random.h"
#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"seed", 0, 0, 4294967295.0, 1, "random seed"},
};

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
        const uint64_t words[2] = {(uint64_t)layer, (uint64_t)h};
        kvs_random_stream s = {kvs_random_key(seed, words, 2), 0};
        /* Partial Fisher-Yates: the first b entries become a uniform sample without replacement. */
        for (int i = 0; i < b; i++) {
            int j = i + (int)kvs_random_below(&s, (uint64_t)(n - i));
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
