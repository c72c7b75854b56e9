/* h2o (Heavy-Hitter Oracle): keeps the recent half of the budget and, among older tokens, the
 * "heavy hitters" with the largest accumulated attention.
 *
 * Score (metadata channel 0): the softmax probability a slot received, summed over every prompt
 * query row (prefill column sums) and every decode step, each row first averaged over the query
 * heads of the slot's KV head (GQA group mean, kvs_group_mean_add). Not normalised by age.
 * Keep: the budget/2 newest slots (integer division), and the top-scored among the rest.
 * Prefill: after every chunk the head is evicted down to the budget, so long prompts processed
 * in chunks stay bounded. Decode: the new token is appended (no before_append), attention runs
 * over budget + 1 slots, then after_attention adds the step's probabilities and evicts the one
 * lowest-scored slot outside the recent half (ties: the oldest goes), moving the newest slot's
 * row into the victim's (kvs_store_remove_unordered: one row moved, not half the head). */
#include <stdlib.h>

#include "policies/policies.h"

enum { SCORE = 0 };

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    return kvs_policy_check_context(p, err);
}

static int wants_row(const kvs_policy *p, int layer, int32_t pos)
{
    (void)p, (void)layer, (void)pos;
    return 1;
}

static int recent_of(const kvs_policy *p) { return p->budget / 2; }

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    (void)err;
    const int group = p->n_heads / p->n_kv_heads;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        float *score = kvs_store_meta(p->store, layer, h, SCORE);
        if (c->colsum)
            kvs_group_mean_add(score, c->colsum + (size_t)h * group * c->colsum_stride,
                               (size_t)c->colsum_stride, group, n);
        kvs_status st = kvs_evict_keep_top(p->store, layer, h, score, p->budget, 0,
                                           recent_of(p), KVS_TIE_KEEP_NEWER, err);
        if (st != KVS_OK)
            return st;
    }
    return KVS_OK;
}

/* The usual decode step's one victim: the lowest score outside the recent window (the oldest
 * of equal scores), found in one pass whatever the slots' order. The window is the positions
 * newest - recent + 1 .. newest, which holds when the window's positions are consecutive (one
 * token per step): -1 when it is not, and the caller ranks the head in full. */
static int one_victim(const kvs_policy *p, int layer, int h, const float *score, int recent)
{
    const int n = kvs_store_count(p->store, layer, h);
    const int32_t *pos = kvs_store_pos(p->store, layer, h);
    int32_t newest = pos[0];
    for (int j = 1; j < n; j++)
        newest = pos[j] > newest ? pos[j] : newest;
    const int32_t first_recent = newest - recent + 1;
    int in_window = 0, victim = -1;
    for (int j = 0; j < n; j++) {
        if (pos[j] >= first_recent)
            in_window++;
        else if (victim < 0 || score[j] < score[victim] ||
                 (score[j] == score[victim] && pos[j] < pos[victim]))
            victim = j;
    }
    return in_window == recent ? victim : -1;
}

static kvs_status after_attention(kvs_policy *p, int layer, const float *probs, int stride,
                                  kvs_error *err)
{
    (void)err;
    const int group = p->n_heads / p->n_kv_heads, recent = recent_of(p);
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        float *score = kvs_store_meta(p->store, layer, h, SCORE);
        kvs_group_mean_add(score, probs + (size_t)h * group * stride, (size_t)stride, group, n);
        if (n <= p->budget)
            continue;
        const int victim = n == p->budget + 1 ? one_victim(p, layer, h, score, recent) : -1;
        if (victim >= 0) {
            kvs_store_remove_unordered(p->store, layer, h, victim);
        } else {
            kvs_status st = kvs_evict_keep_top(p->store, layer, h, score, p->budget, 0,
                                               recent, KVS_TIE_KEEP_NEWER, err);
            if (st != KVS_OK)
                return st;
        }
    }
    return KVS_OK;
}

const kvs_policy_type kvs_policy_h2o = {
    .name = "h2o",
    .summary = "H2O: recent half + heavy hitters by accumulated attention (group mean)",
    .kind = KVS_KIND_EVICTING,
    .n_meta = 1,
    .start = start,
    .wants_row = wants_row,
    .prefill_chunk = prefill_chunk,
    .after_attention = after_attention,
};
