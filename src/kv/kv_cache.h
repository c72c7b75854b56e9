/* The KV store: per layer and KV head, slots of post-RoPE key, value and absolute position,
 * kept sorted by position, plus attention of queries over those slots. */
#ifndef KVS_KV_CACHE_H
#define KVS_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/threadpool.h"

typedef struct kvs_kv kvs_kv;

typedef struct kvs_kv_config {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int max_slots; /* hard limit per (layer, head): the context length */
} kvs_kv_config;

kvs_kv *kvs_kv_new(const kvs_kv_config *cfg);
void kvs_kv_free(kvs_kv *kv);
/* Drops every slot (keeps the allocations). */
void kvs_kv_clear(kvs_kv *kv);
int kvs_kv_count(const kvs_kv *kv, int layer, int head);

/* Appends n tokens to every head of layer: k and v are n rows of n_kv_heads * head_dim floats,
 * pos[i] their absolute positions (increasing, after every stored position). */
kvs_status kvs_kv_append(kvs_kv *kv, int layer, int n, const float *k, const float *v,
                         const int32_t *pos, kvs_error *err);

/* Causal attention for n queries of layer: q is n rows of n_heads * head_dim floats, query i
 * at position qpos[i] attends the slots of its KV head (head h uses KV head h / (n_heads /
 * n_kv_heads)) whose position is <= qpos[i]. Writes n rows of n_heads * head_dim to out. */
kvs_status kvs_kv_attend(kvs_kv *kv, kvs_pool *pool, int layer, int n, int n_heads,
                         const float *q, const int32_t *qpos, float *out, kvs_error *err);

/* Bytes of keys, values and positions held by live slots. */
size_t kvs_kv_bytes(const kvs_kv *kv);
/* Bytes a full F16 cache of n_tokens tokens would hold (keys and values, no positions). */
size_t kvs_kv_bytes_full_f16(const kvs_kv *kv, int64_t n_tokens);

#endif
