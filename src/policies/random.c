/* random: one-shot at prefill end, keep budget slots per (layer, KV head) drawn uniformly
 * without replacement. The draw uses a counter-based stream (core/random.h) keyed by (seed,
 * layer, head), so the kept set depends on nothing else (threads, call order, other heads). */
#include <stdint.h>
#include <stdlib.h>

#include "core/random.h"
#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"seed", 0, 0, 4294967295.0, 1, "random seed"},
};

/* A partial Fisher-Yates shuffle: its first budget entries, a uniform sample without
 * replacement, score 1; the others 0. */
static kvs_status score(const kvs_score_ctx *c, float *score, kvs_error *err)
{
    const int n = c->n, b = c->p->budget;
    int *idx = malloc(sizeof(int) * (size_t)n);
    if (!idx)
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory", c->p->spec.user);
    for (int i = 0; i < n; i++) {
        idx[i] = i;
        score[i] = 0.0f;
    }
    const uint64_t words[2] = {(uint64_t)c->layer, (uint64_t)c->head};
    kvs_random_stream s = {kvs_random_key((uint64_t)kvs_policy_param(c->p, "seed"), words, 2), 0};
    for (int i = 0; i < b; i++) {
        const int j = i + (int)kvs_random_below(&s, (uint64_t)(n - i)), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        score[idx[i]] = 1.0f;
    }
    free(idx);
    return KVS_OK;
}

const kvs_scorer kvs_policy_random = {
    .type = {.name = "random",
             .summary = "random: keep a uniform random sample of the prompt tokens (one-shot, "
                        "seeded)",
             .params = params, .n_params = 1, KVS_SCORER_HOOKS},
    .score = score,
};
