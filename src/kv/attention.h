/* Attention of query rows over the slots of a kvs_store. */
#ifndef KVS_ATTENTION_H
#define KVS_ATTENTION_H

#include <stdint.h>

#include "core/threadpool.h"
#include "kv/kv_store.h"

typedef struct kvs_attn_args {
    const kvs_store *store;
    int layer;
    int n_heads;          /* query heads; head h reads KV head h / (n_heads / n_kv_heads) */
    int n;                /* query rows */
    const float *q;       /* n rows of n_heads * head_dim */
    const int32_t *qpos;  /* query i sees the slots with position <= qpos[i] (causal) */
    float *out;           /* n rows of n_heads * head_dim */

    /* Optional: column sums of the softmax rows of the queries with row_mask[i] != 0, added
     * into colsum[h * colsum_stride + slot] (colsum_stride >= the largest head count). */
    const uint8_t *row_mask;
    float *colsum;
    int colsum_stride;

    /* Optional, one query row only: per KV head, the slots to attend (sel[kvh][0..n_sel[kvh])),
     * strictly increasing; NULL attends every visible slot. */
    const int *const *sel;
    const int *n_sel;

    /* Optional, one query row only: the probabilities, probs[h * probs_stride + j] for the j-th
     * attended slot of head h (j indexes sel when given, else the slots). */
    float *probs;
    int probs_stride;
} kvs_attn_args;

typedef struct kvs_attn_scratch kvs_attn_scratch;

kvs_attn_scratch *kvs_attn_scratch_new(void);
void kvs_attn_scratch_free(kvs_attn_scratch *sc);

kvs_status kvs_attention(kvs_pool *pool, kvs_attn_scratch *sc, const kvs_attn_args *a,
                         kvs_error *err);

#endif
