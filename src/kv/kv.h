/* The kv layer: the slot store, a policy and attention, behind the one call the forward pass
 * makes per layer. It tracks the phase (prompt chunks, then decode steps), calls the policy's
 * hooks in order, and keeps the statistics eval reports. */
#ifndef KVS_KV_H
#define KVS_KV_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "kv/kv_store.h"
#include "kv/policy.h"

typedef struct kvs_kv kvs_kv;

typedef struct kvs_kv_config {
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_slots;   /* the context length (an evicting policy's store holds up to twice as
                      * many slots: a budget of up to the context plus a prompt batch, which
                      * is never longer than the context) */
    kvs_dtype type;  /* KVS_F32 or KVS_F16 */
    int shadow;      /* eval mode: keep every key to measure attention recall (not counted) */
} kvs_kv_config;

/* spec NULL means the full cache. */
kvs_status kvs_kv_new(const kvs_kv_config *cfg, const kvs_policy_spec *spec, kvs_kv **out,
                      kvs_error *err);
void kvs_kv_free(kvs_kv *kv);
/* Forgets every token; release 0 keeps the store's memory for the next tokens (a session
 * reset), 1 gives it back (a session's failed batch). */
void kvs_kv_reset(kvs_kv *kv, int release);

/* A prompt of n_prompt tokens begins (resolves the budget, starts the policy). */
kvs_status kvs_kv_begin_prompt(kvs_kv *kv, int n_prompt, kvs_error *err);
/* One layer of a batch: stores k/v (n rows of n_kv_heads * head_dim, post-RoPE) at pos, runs
 * the policy's hooks and attention of q (n rows of n_heads * head_dim) into out. During the
 * prompt any n up to kvs_kv_prompt_batch; afterwards n must be 1. */
kvs_status kvs_kv_layer(kvs_kv *kv, kvs_pool *pool, int layer, int n, const float *q,
                        const float *k, const float *v, const int32_t *pos, float *out,
                        kvs_error *err);
/* A hint, before a layer's Q/K/V product: when the next kvs_kv_layer of layer is a decode step
 * that appends to the store, the lines it writes are brought into the cache meanwhile. */
void kvs_kv_prefetch_layer(const kvs_kv *kv, int layer);
/* During a prompt: the largest batch the next kvs_kv_layer calls may take, at most the prompt
 * tokens left (the policy's prompt_batch may limit it, e.g. to 1 for a token fed through its
 * decode-time eviction). Outside a prompt: 1. */
int kvs_kv_prompt_batch(const kvs_kv *kv);
/* Every layer of a batch of n tokens is done. */
void kvs_kv_end_batch(kvs_kv *kv, int n);

/* Position shifting, between batches (evicting policies; see DESIGN.md). The next token
 * would take position next. Slots below the policy's protected prefix (positions < its
 * `sinks` parameter, 0 if it has none) keep their positions; every other slot of every layer
 * and head moves down by one common delta, and where that would collide with the slot before
 * it (or fall below the prefix: old heavy hitters) it takes the first free position after it,
 * so the order is kept and positions stay unique. Keys are re-rotated from their old to their
 * new positions with rope, and the policy's shift hook runs per layer. delta brings the next
 * position to max(context / 2, keep + the most non-prefix slots of a head): half the window
 * stays free for new tokens, as llama.cpp's context shift discards half. *delta gets the
 * applied shift (0: nothing would be gained). On failure (an F16 key out of range) the cache is
 * left partly shifted and must be reset. */
kvs_status kvs_kv_shift(kvs_kv *kv, int32_t next, const kvs_rope_cfg *rope, int32_t *delta,
                        kvs_error *err);

const kvs_store *kvs_kv_store(const kvs_kv *kv);
/* Makes the (still empty, F16) cache a KIVI store (kivi.h); the shadow stays F32. */
kvs_status kvs_kv_set_kivi(kvs_kv *kv, const kvs_kivi_cfg *k, kvs_error *err);
const kvs_policy *kvs_kv_policy(const kvs_kv *kv);
/* Bytes held now: slots (keys, values, positions, policy metadata) and policy state. */
size_t kvs_kv_bytes(const kvs_kv *kv);
size_t kvs_kv_peak_bytes(const kvs_kv *kv);
/* Bytes a full F16 cache of n_tokens tokens would hold (keys and values). */
size_t kvs_kv_bytes_full_f16(const kvs_kv *kv, int64_t n_tokens);

/* Statistics of the last decode step, averaged over layers and heads. */
typedef struct kvs_kv_step_stats {
    double slots_attended; /* per query head */
    double attn_recall;    /* share of the full softmax mass on attended slots (shadow only) */
} kvs_kv_step_stats;
void kvs_kv_last_step(const kvs_kv *kv, kvs_kv_step_stats *st);
/* Slots attended per query head in one layer at the last decode step (0 for a layer out of
 * range): retrieval needs to see which layers a policy compresses. */
double kvs_kv_last_step_layer(const kvs_kv *kv, int layer);

/* Wall time spent in the kv layer (policy hooks and attention) during decode steps since the
 * last reset, in seconds. */
double kvs_kv_decode_seconds(const kvs_kv *kv);
/* Wall time in the policy's prefill hooks (prefill_chunk, prefill_end: scoring and one-shot
 * eviction) since the last reset, in seconds. */
double kvs_kv_prefill_hook_seconds(const kvs_kv *kv);

/* Tests: called after every policy hook with the hook's name. */
typedef void (*kvs_kv_observer)(void *ctx, const kvs_kv *kv, int layer, const char *hook);
void kvs_kv_set_observer(kvs_kv *kv, kvs_kv_observer fn, void *ctx);

#endif
