/* knorm (K-norm): one-shot at prefill end, keep the budget slots whose post-RoPE keys have the
 * lowest L2 norm (low-norm keys tend to draw high attention). No sinks, no window; ties: the
 * lower position stays. With a budget at least the prompt, everything is kept.
 *
 * Ties are real: RoPE preserves norms, so every occurrence of a token has the same layer-0 key
 * norm, but the float32 rotation leaves ~1e-7 relative noise that would break those ties by
 * rounding luck instead of by position. The norm is therefore rounded to 16 significant bits
 * (relative step <= 3e-5) before ranking; keys closer than that count as equal. */
#include <math.h>
#include <stdlib.h>

#include "policies/policies.h"

/* x rounded to 16 significant bits. */
static double round_norm(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    return ldexp(floor(m * 65536.0 + 0.5) / 65536.0, e);
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    return kvs_policy_check_context(p, err);
}

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    const int hd = p->head_dim;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n <= p->budget)
            continue;
        float *score = malloc(sizeof(float) * ((size_t)n + hd));
        if (!score)
            return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d norms",
                            p->spec.user, n);
        float *key = score + n;
        for (int j = 0; j < n; j++) {
            kvs_store_key_f32(p->store, layer, h, j, key);
            double ss = 0;
            for (int i = 0; i < hd; i++)
                ss += (double)key[i] * key[i];
            score[j] = (float)-round_norm(sqrt(ss)); /* keep-top keeps the highest */
        }
        kvs_status st = kvs_evict_keep_top(p->store, layer, h, score, p->budget, 0, 0,
                                           KVS_TIE_KEEP_OLDER, err);
        free(score);
        if (st != KVS_OK)
            return st;
    }
    return KVS_OK;
}

const kvs_policy_type kvs_policy_knorm = {
    .name = "knorm",
    .summary = "K-norm: keep the tokens with the lowest key L2 norm (one-shot)",
    .kind = KVS_KIND_ONE_SHOT,
    .start = start,
    .prefill_end = prefill_end,
};
