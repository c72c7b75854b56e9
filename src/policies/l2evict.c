/* l2evict: the HashEvict paper's "L2" baseline (methods/hashevict.md). The same pre-attention
 * machinery as hashevict (hashevict_internal.h): C = budget slots per (layer, KV head), a
 * physical slot table, sinks and a recent window protected; a slot's metadata is the L2 norm of
 * its key (computed once at insertion, in double, from the key as stored), and the evictable
 * slot with the largest norm goes. prefill=paper feeds the prompt beyond the budget token by
 * token through that eviction; prefill=norm (the reference code's prompt compression) keeps,
 * per chunk, the sinks, the recent window and the lowest norms up to C. */
#include <math.h>

#include "policies/hashevict_internal.h"

static const kvs_param_def params[] = {
    {"sinks", 4, 0, 1 << 20, 1, "first positions never evicted"},
    {"recent", 10, 0, 1 << 20, 1, "most recent positions never evicted"},
    {"ties", 0, 0, 1, 1, "equal norms: evict the oldest, or the lowest physical slot"},
    {"prefill", 0, 0, 1, 1, "prompt beyond the budget: fed token by token (paper) or sinks + "
                            "recent + lowest norms (authors' code)"},
};
static const char *const prefill_words[] = {"paper", "norm", NULL};
static const kvs_param_words words[] = {{"ties", kvs_he_ties_words}, {"prefill", prefill_words}};

float kvs_he_l2_norm(const float *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return (float)sqrt(s);
}

int kvs_he_victim_norm(const float *norm, const int32_t *pos, int n, int32_t t, int sinks,
                       int recent, int ties)
{
    int best = -1;
    for (int s = 0; s < n; s++) {
        if (!kvs_he_evictable(pos[s], t, sinks, recent))
            continue;
        if (best < 0 || norm[s] > norm[best] ||
            (norm[s] == norm[best] && ties == KVS_HE_TIES_OLDEST && pos[s] < pos[best]))
            best = s;
    }
    return best;
}

kvs_status kvs_l2_keep_lowest_norms(kvs_policy *p, int layer, int h, float *score, float *key,
                                    int sinks, int recent, kvs_error *err)
{
    const int n = kvs_store_count(p->store, layer, h);
    for (int i = 0; i < n; i++) {
        kvs_store_key_f32(p->store, layer, h, i, key);
        score[i] = -kvs_he_l2_norm(key, p->head_dim); /* keep-top keeps the highest */
    }
    return kvs_evict_keep_top(p->store, layer, h, score, p->budget, sinks, recent,
                              KVS_TIE_KEEP_NEWER, err);
}

static kvs_status start(kvs_policy *p, kvs_error *err) { return kvs_he_start(p, 1, err); }

const kvs_policy_type kvs_policy_l2evict = {
    .name = "l2evict",
    .summary = "L2 (HashEvict's baseline): evict the largest key norm (pre-attention; sinks + "
               "recent window kept)",
    .params = params,
    .n_params = (int)(sizeof params / sizeof params[0]),
    .words = words,
    .n_words = (int)(sizeof words / sizeof words[0]),
    .start = start,
    KVS_HE_HOOKS,
};
