/* knorm (K-norm): one-shot at prefill end, keep the budget slots whose post-RoPE keys have the
 * lowest L2 norm (low-norm keys tend to draw high attention). No sinks, no window; ties: the
 * lower position stays. With a budget at least the prompt, everything is kept.
 *
 * Ties are real: RoPE preserves norms, so every occurrence of a token has the same layer-0 key
 * norm, but the float32 rotation leaves ~1e-7 relative noise that would break those ties by
 * rounding luck instead of by position. The norm is therefore rounded to 16 significant bits
 * (relative step <= 3e-5) before ranking; keys closer than that count as equal. */
#include <math.h>

#include "policies/policies.h"

/* x rounded to 16 significant bits. */
static double round_norm(double x)
{
    int e;
    double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    return ldexp(floor(m * 65536.0 + 0.5) / 65536.0, e);
}

static kvs_status score(const kvs_score_ctx *c, float *score, kvs_error *err)
{
    (void)err;
    for (int j = 0; j < c->n; j++)
        score[j] = (float)-round_norm(kvs_score_key_norm(c, j)); /* the lowest norms stay */
    return KVS_OK;
}

const kvs_scorer kvs_policy_knorm = {
    .type = {.name = "knorm",
             .summary = "K-norm: keep the tokens with the lowest key L2 norm (one-shot)",
             KVS_SCORER_HOOKS},
    .score = score,
};
