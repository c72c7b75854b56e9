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

    /* Optional, one query row only, without sel, probs or colsum (MiniCache's restored view,
     * minicache.md §2.8, fused): per KV head, a factor on each stored slot's key score and one
     * on its value weight, kscale[kvh][j] and vscale[kvh][j] (F32 or F16 by scale_type; NULL:
     * 1): score_j = kscale_j * (q . k_j) / sqrt(head_dim), value sum += p_j * vscale_j * v_j.
     * They act on the score and probability rows, so the key and value kernels stay those of
     * the store's type (F32, F16, KIVI). */
    const void *const *kscale;
    const void *const *vscale;
    kvs_dtype scale_type;
    /* Optional (same conditions): per KV head, exact keys replacing stored slots: xk_n[kvh]
     * rows for slots xk_slot[kvh][0..xk_n) (strictly increasing), row j at xk[kvh] + j *
     * x_stride elements of type x_type (F32 or F16); their key scale does not apply. Likewise
     * exact values (xv_n, xv_slot, xv), a set of their own; their value scale does not apply. */
    const int *xk_n, *xv_n;
    const int32_t *const *xk_slot;
    const int32_t *const *xv_slot;
    const void *const *xk;
    const void *const *xv;
    size_t x_stride;
    kvs_dtype x_type;
    /* Optional (same conditions): one more slot after the stored ones, the exact F32 key and
     * value rows of the query's own token (n_kv_heads * head_dim each); NULL: none. */
    const float *tail_k, *tail_v;
} kvs_attn_args;

typedef struct kvs_attn_scratch kvs_attn_scratch;

kvs_attn_scratch *kvs_attn_scratch_new(void);
void kvs_attn_scratch_free(kvs_attn_scratch *sc);

kvs_status kvs_attention(kvs_pool *pool, kvs_attn_scratch *sc, const kvs_attn_args *a,
                         kvs_error *err);

#endif
