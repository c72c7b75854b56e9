/* snapkv: one-shot compression at prefill end, guided by the attention of the prompt's last
 * `window` queries (the observation window).
 *
 * Scores: the softmax rows of the window's queries (causal, over the whole prompt), averaged
 * over the query heads of each KV head (GQA group mean) and summed over the window rows, for
 * every prefix slot (positions < n_prompt - window): the scorer adapter's observation. The
 * prefix scores are max-pooled (kernel `kernel`, stride 1, centred, -inf padding, so the pool
 * at the prefix edges only covers prefix slots). Keep: the top budget - window prefix slots
 * (ties: the lower position) plus the whole window; if budget <= window, the last budget
 * slots; if budget >= the prompt, everything. */
#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"window", 32, 1, 1 << 20, 1, "observation window: the last prompt queries whose attention "
                                  "scores the prefix; always kept"},
    {"kernel", 7, 1, 1023, 1, "max-pool width over the prefix scores (odd; 1 = no pooling)"},
};

static int window_of(const kvs_policy *p) { return (int)kvs_policy_param(p, "window"); }

/* The window is kvs_evict_keep_top's recent part (all of the budget if it is smaller). */
static void protect(const kvs_policy *p, int *sinks, int *recent)
{
    *sinks = 0;
    *recent = window_of(p);
}

static kvs_status check(const kvs_policy *p, kvs_error *err)
{
    const int kernel = (int)kvs_policy_param(p, "kernel");
    if (kernel % 2 == 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: kernel=%d must be odd (the max-pool is centred on each slot)",
                        p->spec.user, kernel);
    return KVS_OK;
}

static kvs_status score(const kvs_score_ctx *c, float *score, kvs_error *err)
{
    (void)err;
    const int half = (int)kvs_policy_param(c->p, "kernel") / 2, prefix = c->n - window_of(c->p);
    for (int i = 0; i < c->n; i++) {
        if (i >= prefix) {
            score[i] = 0.0f; /* the window: protected, its score is not read */
            continue;
        }
        const int lo = i - half < 0 ? 0 : i - half, hi = i + half >= prefix ? prefix - 1 : i + half;
        float m = c->obs[lo];
        for (int j = lo + 1; j <= hi; j++)
            m = c->obs[j] > m ? c->obs[j] : m;
        score[i] = m;
    }
    return KVS_OK;
}

const kvs_scorer kvs_policy_snapkv = {
    .type = {.name = "snapkv",
             .summary = "SnapKV: prefix slots the observation window attends to (max-pooled), "
                        "+ window",
             .params = params, .n_params = 2, KVS_SCORER_HOOKS},
    .score = score,
    .window = window_of,
    .protect = protect,
    .check = check,
};
