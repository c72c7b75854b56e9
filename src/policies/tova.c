/* tova (Token Omission Via Attention): the cache holds the budget; whenever it is over, the
 * slots with the lowest attention from the current query go. No protected slots.
 *
 * Attention of a slot = the softmax probability from the newest query, averaged over the query
 * heads of its KV head (GQA group mean, kvs_group_mean_add).
 * Prefill: after every chunk, keep the top budget slots by the attention of the chunk's last
 * query row (computed here from c->q and the stored keys: scaled dot, softmax over every slot,
 * all of which are visible to the chunk's last position). Ties: the older slot goes.
 * Decode: the new token is appended, attention runs over budget + 1 slots, then
 * after_attention removes the one slot with the lowest attention (ties: the oldest goes). */
#include <math.h>
#include <stdlib.h>

#include "core/kernels.h"
#include "policies/policies.h"

/* A scratch buffer of floats, grown as the cache grows (hooks run on one thread). Working
 * memory like the attention kernel's scratch, not cache state: state_bytes does not count it. */
typedef struct tova_state {
    float *buf;
    size_t cap;
} tova_state;

static float *scratch(kvs_policy *p, size_t n, kvs_error *err)
{
    tova_state *st = p->state;
    if (n > st->cap) {
        float *b = realloc(st->buf, sizeof(float) * n);
        if (!b) {
            kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %zu scores", p->spec.user,
                     n);
            return NULL;
        }
        st->buf = b;
        st->cap = n;
    }
    return st->buf;
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    kvs_status st = kvs_policy_check_context(p, err);
    if (st != KVS_OK)
        return st;
    if (!(p->state = calloc(1, sizeof(tova_state))))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    return KVS_OK;
}

static void stop(kvs_policy *p)
{
    tova_state *st = p->state;
    if (st)
        free(st->buf);
    free(st);
    p->state = NULL;
}


static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    const int group = p->n_heads / p->n_kv_heads, hd = p->head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *q_last = c->q + (size_t)(c->n - 1) * p->n_heads * hd;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n <= p->budget)
            continue;
        float *buf = scratch(p, (size_t)(group + 1) * n + hd, err);
        if (!buf)
            return KVS_ERR_NOMEM;
        float *score = buf, *rows = buf + n, *key = buf + (size_t)(group + 1) * n;
        for (int j = 0; j < n; j++)
            score[j] = 0.0f;
        for (int g = 0; g < group; g++) {
            const float *q = q_last + (size_t)(h * group + g) * hd;
            float *row = rows + (size_t)g * n;
            for (int j = 0; j < n; j++) {
                kvs_store_key_f32(p->store, layer, h, j, key);
                row[j] = kvs_dot_f32(q, key, hd) * scale;
            }
            kvs_softmax(row, n);
        }
        kvs_group_mean_add(score, rows, (size_t)n, group, n);
        kvs_status st = kvs_evict_keep_top(p->store, layer, h, score, p->budget, 0, 0,
                                           KVS_TIE_KEEP_NEWER, err);
        if (st != KVS_OK)
            return st;
    }
    return KVS_OK;
}

static kvs_status after_attention(kvs_policy *p, int layer, const float *probs, int stride,
                                  kvs_error *err)
{
    const int group = p->n_heads / p->n_kv_heads;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n <= p->budget)
            continue;
        float *score = scratch(p, (size_t)n, err);
        if (!score)
            return KVS_ERR_NOMEM;
        for (int j = 0; j < n; j++)
            score[j] = 0.0f;
        kvs_group_mean_add(score, probs + (size_t)h * group * stride, (size_t)stride, group, n);
        if (n == p->budget + 1) {
            /* One victim, the lowest score (the oldest of equal ones), whose slot takes the last
             * slot's row (kvs_store_remove_unordered: one row moved, not half the head). */
            const int32_t *pos = kvs_store_pos(p->store, layer, h);
            int victim = 0;
            for (int j = 1; j < n; j++)
                if (score[j] < score[victim] || (score[j] == score[victim] && pos[j] < pos[victim]))
                    victim = j;
            kvs_store_remove_unordered(p->store, layer, h, victim);
        } else {
            kvs_status st = kvs_evict_keep_top(p->store, layer, h, score, p->budget, 0, 0,
                                               KVS_TIE_KEEP_NEWER, err);
            if (st != KVS_OK)
                return st;
        }
    }
    return KVS_OK;
}

const kvs_policy_type kvs_policy_tova = {
    .name = "tova",
    .summary = "TOVA: evict the token with the lowest attention from the current query",
    .kind = KVS_KIND_EVICTING,
    .start = start,
    .stop = stop,
    .prefill_chunk = prefill_chunk,
    .after_attention = after_attention,
};
