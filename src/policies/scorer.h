/* Scorer policies: a method that only scores slots (kvpress's ScorerPress) is a score function
 * plus its parameter table; this adapter provides every hook.
 *
 * At prefill end, for each (layer, KV head) holding more than the budget, the adapter asks the
 * score function for one score per slot and keeps the top-scored slots with the shared
 * kvs_evict_keep_top (protecting the scorer's sinks and recent window, ties as declared). A
 * scorer with an observation window (`window`) also gets, per slot, the attention of the
 * prompt's last window queries: their softmax rows, as the GQA group mean of each KV head
 * (kvs_group_mean_add), summed over the window (nothing is evicted before prefill end, so slot j
 * is prompt token j in every chunk).
 *
 * A new scorer policy is a score function and a table entry:
 *
 *     static kvs_status score(const kvs_score_ctx *c, float *score, kvs_error *err)
 *     {
 *         (void)err;
 *         for (int j = 0; j < c->n; j++)
 *             score[j] = (float)-kvs_score_key_norm(c, j);
 *         return KVS_OK;
 *     }
 *     const kvs_scorer kvs_policy_mine = {
 *         .type = {.name = "mine", .summary = "...", KVS_SCORER_HOOKS},
 *         .score = score,
 *     };
 *
 * plus its line in the registry (policies.h). */
#ifndef KVS_SCORER_H
#define KVS_SCORER_H

#include "kv/policy.h"

/* What a score function sees of one (layer, KV head) at prefill end. */
typedef struct kvs_score_ctx {
    const kvs_policy *p;
    int layer, head;
    int n;            /* slots the head holds (> p->budget), in position order */
    const float *obs; /* scorers with a window: n observed attention sums; else NULL */
    float *key;       /* scratch row of p->head_dim floats (kvs_score_key) */
} kvs_score_ctx;

/* Writes score[j] for the n slots; the highest are kept. */
typedef kvs_status (*kvs_score_fn)(const kvs_score_ctx *c, float *score, kvs_error *err);

typedef struct kvs_scorer {
    kvs_policy_type type; /* first member: the registry lists &scorer.type, whose hooks
                           * (KVS_SCORER_HOOKS) find the scorer through it */
    kvs_score_fn score;
    /* Optional: observe the attention of the last window(p) prompt queries (into ctx->obs). */
    int (*window)(const kvs_policy *p);
    /* Optional: the slots kvs_evict_keep_top protects (default none). */
    void (*protect)(const kvs_policy *p, int *sinks, int *recent);
    /* Optional: parameter checks at prompt start, after the context check. */
    kvs_status (*check)(const kvs_policy *p, kvs_error *err);
    kvs_tie tie; /* equal scores (default KVS_TIE_KEEP_OLDER: the lower position stays) */
} kvs_scorer;

/* The adapter's hooks, for KVS_SCORER_HOOKS. */
kvs_status kvs_scorer_start(kvs_policy *p, kvs_error *err);
void kvs_scorer_stop(kvs_policy *p);
size_t kvs_scorer_state_bytes(const kvs_policy *p);
int kvs_scorer_wants_row(const kvs_policy *p, int layer, int32_t pos);
kvs_status kvs_scorer_prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c,
                                    kvs_error *err);
kvs_status kvs_scorer_prefill_end(kvs_policy *p, int layer, kvs_error *err);

/* The kind and hooks of a scorer's type, inside its designated initializer. */
#define KVS_SCORER_HOOKS                                                                       \
    .kind = KVS_KIND_ONE_SHOT, .start = kvs_scorer_start, .stop = kvs_scorer_stop,            \
    .state_bytes = kvs_scorer_state_bytes, .wants_row = kvs_scorer_wants_row,                  \
    .prefill_chunk = kvs_scorer_prefill_chunk, .prefill_end = kvs_scorer_prefill_end

/* Slot j's key (post-RoPE, as F32) in c->key, and its L2 norm (summed in double). */
const float *kvs_score_key(const kvs_score_ctx *c, int j);
double kvs_score_key_norm(const kvs_score_ctx *c, int j);

#endif
