/* Adjacent-layer similarity of the KV cache (minicache.md §5.5 item 5, §7 T19): for every pair
 * of adjacent layers (l, l+1), the per-token cosine similarity of the stored (post-RoPE) keys and
 * of the values, summarised by mean and percentiles. A unit is the whole per-token vector, all
 * KV heads concatenated (D = n_kv_heads * head_dim): the spec's default MC_UNIT_TOKEN (§2.9). */
#ifndef KVS_LAYER_SIMILARITY_H
#define KVS_LAYER_SIMILARITY_H

#include "core/error.h"
#include "kv/kv.h"

typedef struct kvs_sim_summary {
    double mean, p10, p50, p90;
    int n; /* tokens measured */
} kvs_sim_summary;

typedef struct kvs_layer_sim {
    int layer; /* the pair (layer, layer + 1) */
    kvs_sim_summary k, v;
    /* Per token ||x^(l+1)|| / ||x^l|| (tokens with a zero vector in layer l left out): SLERP
     * keeps each layer's norm where the Mean merge gives both the norm of the average, so its
     * edge over Mean grows with how far these ratios are from 1. */
    kvs_sim_summary k_ratio, v_ratio;
} kvs_layer_sim;

/* Cosine similarity of a and b (n floats), in double; 0 when either is all zeros. */
double kvs_cosine(const float *a, const float *b, int n);
/* Percentile p (0..100) of n sorted values, linearly interpolated between ranks (numpy's
 * default). */
double kvs_percentile_sorted(const double *x, int n, double p);
/* Fills out[0 .. n_layers-2] from the tokens the store holds. Every layer and head must hold
 * the same positions (a full cache); otherwise fails naming the layer. */
kvs_status kvs_layer_similarity(const kvs_kv *kv, kvs_layer_sim *out, kvs_error *err);

#endif
