/* streaming (StreamingLLM): attention sinks plus the most recent tokens. */
#include "policies/policies.h"

#include <stdlib.h>

static const kvs_param_def params[] = {
    {"sinks", 4, 0, 1 << 20, 1, "oldest tokens always kept (attention sinks)"},
};

/* The sinks plus one slot for the newest token. */
static int min_budget(const kvs_policy_spec *spec)
{
    return (int)kvs_policy_spec_param(spec, "sinks") + 1;
}

/* The state is the index list a trim hands to the store: at most budget entries, allocated
 * once per prompt (a stack array would grow with the cache, past what a stack holds). It is
 * working memory, not data about the cached tokens, so it is not counted in the KV bytes (no
 * state_bytes), which stay those of the slots alone. */
static kvs_status start(kvs_policy *p, kvs_error *err)
{
    int sinks = (int)kvs_policy_param(p, "sinks");
    if (p->budget <= sinks)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget of %d slots leaves no room for recent tokens beside %d "
                        "sinks", p->spec.user, p->budget, sinks);
    if (!(p->state = malloc(sizeof(int) * (size_t)p->budget)))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for a list of %d slots",
                        p->spec.user, p->budget);
    return KVS_OK;
}

static void stop(kvs_policy *p)
{
    free(p->state);
    p->state = NULL;
}

/* Keeps the sinks and the newest slots: a keep-top with equal scores that prefers newer. */
static void trim(kvs_policy *p, int layer, int target)
{
    int sinks = (int)kvs_policy_param(p, "sinks");
    int *keep = p->state;
    for (int h = 0; h < p->n_kv_heads; h++) {
        int n = kvs_store_count(p->store, layer, h);
        if (n <= target)
            continue;
        int k = 0;
        for (int i = 0; i < sinks; i++)
            keep[k++] = i;
        for (int i = n - (target - sinks); i < n; i++)
            keep[k++] = i;
        kvs_store_keep(p->store, layer, h, keep, k);
    }
}

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    (void)c;
    (void)err;
    trim(p, layer, p->budget);
    return KVS_OK;
}

static kvs_status before_append(kvs_policy *p, int layer, const float *q, const float *k,
                                const float *v, int32_t pos, kvs_error *err)
{
    (void)q, (void)k, (void)v, (void)pos, (void)err;
    trim(p, layer, p->budget - 1);
    return KVS_OK;
}

const kvs_policy_type kvs_policy_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: attention sinks + the most recent tokens",
    .kind = KVS_KIND_EVICTING,
    .params = params,
    .n_params = 1,
    .min_budget = min_budget,
    .start = start,
    .stop = stop,
    .prefill_chunk = prefill_chunk,
    .before_append = before_append,
};
