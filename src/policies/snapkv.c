/* snapkv: one-shot compression at prefill end, guided by the attention of the prompt's last
 * `window` queries (the observation window).
 *
 * Scores: the softmax rows of the window's queries (causal, over the whole prompt), averaged
 * over the query heads of each KV head (GQA group mean) and summed over the window rows, for
 * every prefix slot (positions < n_prompt - window). The prefix scores are max-pooled (kernel
 * `kernel`, stride 1, centred, -inf padding, so the pool at the prefix edges only covers prefix
 * slots). Keep: the top budget - window prefix slots (ties: the lower position) plus the whole
 * window; if budget <= window, the last budget slots; if budget >= the prompt, everything.
 *
 * Nothing is evicted before prefill_end, so during prefill slot j is prompt token j and the
 * column sums of every chunk index the same slots; they are summed into per-layer state. */
#include <stdlib.h>
#include <string.h>

#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"window", 32, 1, 1 << 20, 1, "observation window: the last prompt queries whose attention "
                                  "scores the prefix; always kept"},
    {"kernel", 7, 1, 1023, 1, "max-pool width over the prefix scores (odd; 1 = no pooling)"},
};

typedef struct snap_state {
    float **score; /* per layer: n_kv_heads x n_prompt, NULL until a window row is seen */
    int n_layers;
} snap_state;

static int window_of(const kvs_policy *p) { return (int)kvs_policy_param(p, "window"); }

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    kvs_status st = kvs_policy_check_context(p, err);
    if (st != KVS_OK)
        return st;
    int kernel = (int)kvs_policy_param(p, "kernel");
    if (kernel % 2 == 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: kernel=%d must be odd (the max-pool is centred on each slot)",
                        p->spec.user, kernel);
    snap_state *s = calloc(1, sizeof *s);
    if (!s || !(s->score = calloc((size_t)p->n_layers, sizeof *s->score))) {
        free(s);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    s->n_layers = p->n_layers;
    p->state = s;
    return KVS_OK;
}

static void stop(kvs_policy *p)
{
    snap_state *s = p->state;
    if (!s)
        return;
    for (int l = 0; l < s->n_layers; l++)
        free(s->score[l]);
    free(s->score);
    free(s);
    p->state = NULL;
}

static size_t state_bytes(const kvs_policy *p)
{
    const snap_state *s = p->state;
    size_t b = 0;
    for (int l = 0; s && l < s->n_layers; l++)
        if (s->score[l])
            b += sizeof(float) * (size_t)p->n_kv_heads * p->n_prompt;
    return b;
}

static int wants_row(const kvs_policy *p, int layer, int32_t pos)
{
    (void)layer;
    return pos >= p->n_prompt - window_of(p);
}

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    snap_state *s = p->state;
    if (!c->colsum)
        return KVS_OK;
    const int n_prompt = p->n_prompt;
    if (!s->score[layer] &&
        !(s->score[layer] = calloc((size_t)p->n_kv_heads * n_prompt, sizeof(float))))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for window scores",
                        p->spec.user);
    return kvs_policy_add_group_mean(p, layer, c, s->score[layer], n_prompt, err);
}

static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    snap_state *s = p->state;
    const int window = window_of(p), kernel = (int)kvs_policy_param(p, "kernel");
    const int half = kernel / 2, budget = p->budget;
    kvs_status st = KVS_OK;
    for (int h = 0; h < p->n_kv_heads && st == KVS_OK; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n <= budget)
            continue;
        if (budget <= window) { /* the last budget slots */
            int *keep = malloc(sizeof(int) * (size_t)budget);
            if (!keep) {
                st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
                break;
            }
            for (int i = 0; i < budget; i++)
                keep[i] = n - budget + i;
            kvs_store_keep(p->store, layer, h, keep, budget);
            free(keep);
            continue;
        }
        /* n > budget > window: a prefix of n - window slots to choose from. */
        const int prefix = n - window;
        const float *raw = s->score[layer] ? s->score[layer] + (size_t)h * p->n_prompt : NULL;
        float *pooled = malloc(sizeof(float) * (size_t)n);
        if (!pooled) {
            st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < prefix; i++) {
            int lo = i - half < 0 ? 0 : i - half, hi = i + half >= prefix ? prefix - 1 : i + half;
            float m = raw ? raw[lo] : 0.0f;
            for (int j = lo + 1; raw && j <= hi; j++)
                m = raw[j] > m ? raw[j] : m;
            pooled[i] = m;
        }
        for (int i = prefix; i < n; i++)
            pooled[i] = 0.0f; /* the window: protected, its score is not read */
        st = kvs_evict_keep_top(p->store, layer, h, pooled, budget, 0, window,
                                KVS_TIE_KEEP_OLDER, err);
        free(pooled);
        if (st != KVS_OK)
            break;
    }
    free(s->score[layer]);
    s->score[layer] = NULL;
    return st;
}

const kvs_policy_type kvs_policy_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: prefix slots the observation window attends to (max-pooled), + window",
    .kind = KVS_KIND_ONE_SHOT,
    .params = params,
    .n_params = 2,
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .wants_row = wants_row,
    .prefill_chunk = prefill_chunk,
    .prefill_end = prefill_end,
};
