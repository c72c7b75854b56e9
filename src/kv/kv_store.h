/* The slot store: per layer and KV head, slots of post-RoPE key, value, absolute position and
 * optional per-slot float metadata for the policy. Slots are in position order unless a policy
 * removed one with kvs_store_remove_unordered; appends always come after every held position.
 * Eviction compacts in place and gives memory back; accounting is exact. */
#ifndef KVS_KV_STORE_H
#define KVS_KV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "kv/kivi.h"

#define KVS_STORE_MAX_META 4

typedef struct kvs_store kvs_store;

typedef struct kvs_store_config {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int max_slots;  /* hard limit per (layer, head) */
    kvs_dtype type; /* KVS_F32 or KVS_F16 */
    int n_meta;     /* float metadata channels per slot, 0..KVS_STORE_MAX_META */
} kvs_store_config;

/* RoPE as the model applies it, for re-rotating stored keys (kvs_store_shift). */
typedef struct kvs_rope_cfg {
    int rot_dim; /* dims of each head that RoPE rotates */
    float base;
    int neox;
} kvs_rope_cfg;

kvs_store *kvs_store_new(const kvs_store_config *cfg);
void kvs_store_free(kvs_store *s);
/* Drops every slot and releases the memory. */
void kvs_store_clear(kvs_store *s);
/* Drops every slot but keeps each head's arrays for the tokens that come next, so that a
 * session started over (kvs_session_reset) writes into memory it already has instead of
 * allocating, copying and page-faulting it again as it grows. */
void kvs_store_empty(kvs_store *s);
const kvs_store_config *kvs_store_cfg(const kvs_store *s);

int kvs_store_count(const kvs_store *s, int layer, int head);
const int32_t *kvs_store_pos(const kvs_store *s, int layer, int head);
/* Keys / values of a head: count rows of head_dim elements of the store's type. */
const void *kvs_store_keys(const kvs_store *s, int layer, int head);
const void *kvs_store_values(const kvs_store *s, int layer, int head);
void kvs_store_key_f32(const kvs_store *s, int layer, int head, int slot, float *out);
void kvs_store_value_f32(const kvs_store *s, int layer, int head, int slot, float *out);
/* Every key of a head as floats (count rows of head_dim): what kvs_store_key_f32 gives for each
 * slot, for a KIVI store group by group. */
void kvs_store_keys_f32(const kvs_store *s, int layer, int head, float *out);
/* Metadata channel c of a head: count floats, moved along with the slots. */
float *kvs_store_meta(kvs_store *s, int layer, int head, int c);

/* A hint before a one-token append to layer (decode, ahead of the layer's Q/K/V product): brings
 * the lines the append will write into the cache, so that it does not wait on each head's
 * cold rows in turn. Changes nothing; KIVI stores and heads that must grow are skipped. */
void kvs_store_prefetch_append(const kvs_store *s, int layer);
/* Appends n tokens to every head of layer: k and v are n rows of n_kv_heads * head_dim floats;
 * pos[i] must be increasing and after every stored position. New metadata is zero. */
kvs_status kvs_store_append(kvs_store *s, int layer, int n, const float *k, const float *v,
                            const int32_t *pos, kvs_error *err);
/* Appends n rows to one head, rows already in the store's type (F32 or F16; not a KIVI store):
 * key row i at k + i * stride bytes, value row i at v + i * stride (stride lets a caller append
 * straight from records that hold a key and its value side by side). pos[i] increasing and
 * after every stored position of the head. PQCache assembles the rows a step attends, from
 * its two tiers, into a store of its own this way, so that kvs_attention serves them. */
kvs_status kvs_store_append_raw(kvs_store *s, int layer, int head, int n, const void *k,
                                const void *v, size_t stride, const int32_t *pos,
                                kvs_error *err);
/* Empties one head of an F32 or F16 store but keeps its memory (a store refilled at every
 * step). */
void kvs_store_reset_head(kvs_store *s, int layer, int head);
/* Keeps only the listed slots (strictly increasing indices) of one head, compacting in place. */
void kvs_store_keep(kvs_store *s, int layer, int head, const int *slots, int n);
/* Removes one slot of one head, keeping the others' order (moves the shorter side). */
void kvs_store_remove(kvs_store *s, int layer, int head, int slot);
/* Removes one slot of one head by moving the last slot's row (key, value, position, metadata)
 * into it: one row moved instead of up to half the head, for policies that evict one victim
 * per step. The head's slots are then out of position order (kvs_store_ordered), but appended
 * rows still follow every held position, so the rows a query may not see stay a suffix. A KIVI
 * store, whose codes are grouped in position order, removes in order (kvs_store_remove). */
void kvs_store_remove_unordered(kvs_store *s, int layer, int head, int slot);
/* Whether a head's slots are in position order: always, unless kvs_store_remove_unordered
 * moved a row out of it (a later keep or remove finds out whether it is back in order). */
int kvs_store_ordered(const kvs_store *s, int layer, int head);

/* A slot index and a position: what orders or finds the slots of a head out of order. */
typedef struct kvs_pos_slot {
    int32_t pos;
    int slot;
} kvs_pos_slot;
/* Sorts v[0..n) by position (positions distinct). */
void kvs_pos_slot_sort(kvs_pos_slot *v, int n);
/* The entry of position pos in v[0..n) sorted by kvs_pos_slot_sort, or NULL. */
const kvs_pos_slot *kvs_pos_slot_find(const kvs_pos_slot *v, int n, int32_t pos);

/* Position shifting: moves the count slots of one head to new_pos (count positions >= 0, in
 * the order of the old ones: increasing along the slots of a head in order) and re-rotates each key from its old position to its new one (F16 keys are
 * dequantised, rotated and rounded back). Values and metadata stay. Fails, leaving the head
 * unchanged, if new_pos breaks the order or a rotated F16 key leaves the F16 range. */
kvs_status kvs_store_shift(kvs_store *s, int layer, int head, const int32_t *new_pos,
                           const kvs_rope_cfg *rope, kvs_error *err);

/* KIVI storage (kivi.h): called on an empty F16 store, makes it a KIVI store with these
 * parameters. It then holds only what minicache.md §3.2 counts (see kv_store.c); its fp16
 * residual rows are what kvs_store_keys / kvs_store_values return (key slot nqk + i at row i,
 * value slot nqv + i at row i). Fails if head_dim * k_bits is not a multiple of 8. */
kvs_status kvs_store_set_kivi(kvs_store *s, const kvs_kivi_cfg *k, kvs_error *err);
/* Quantises what the flush rules of §2.10 say of one layer's residual: keys R at a time once
 * it holds R (a prefill of N leaves N mod R), values once older than the newest R. Called after
 * attention, so that a batch attends to its own tokens exactly (as KIVI's prefill does); an
 * append flushes what an earlier batch left. Cannot fail (the append reserved the room). No-op
 * for F32 / F16 stores. */
void kvs_store_kivi_flush(kvs_store *s, int layer);
/* hold != 0: appends stop flushing what earlier batches left in the residual, so a prompt
 * stays fp16 until kvs_store_kivi_flush quantises it (after a one-shot policy's prompt-end
 * eviction, so that groups form from the survivors). No-op for F32 / F16 stores. */
void kvs_store_kivi_hold(kvs_store *s, int hold);
/* The store's KIVI parameters, or NULL for an F32 / F16 store. */
const kvs_kivi_cfg *kvs_store_kivi(const kvs_store *s);
/* One head of a KIVI store, as attention reads it. Key slots [0, nqk) are quantised in ng
 * groups: group g holds slots [g_first[g], end) (end = g_first[g + 1], or nqk for the last),
 * n = end - g_first[g] tokens whose codes start at kcodes + g_first[g] * kcode_bytes,
 * channel-major (channel c of token j at bit (c * n + j) * k_bits; kernels_kivi.h), with fp16
 * scale[head_dim] then min[head_dim] at g_sm + 2 * head_dim * g. Key slots [nqk, count) are
 * fp16 rows of kres. Value slots [0, nqv) are rows of vrow_bytes at vcodes
 * (kvs_kivi_value_row_bytes), slots [nqv, count) fp16 rows of vres. */
typedef struct kvs_kivi_view {
    const uint8_t *kcodes, *vcodes;
    const uint16_t *g_sm, *kres, *vres;
    const int *g_first;
    size_t kcode_bytes, vrow_bytes;
    int nqk, nqv, ng;
} kvs_kivi_view;
void kvs_store_kivi_view(const kvs_store *s, int layer, int head, kvs_kivi_view *v);

/* Bytes of one slot: key, value, position and metadata (a KIVI store: position and metadata;
 * its keys and values are counted per group, kvs_store_bytes). */
size_t kvs_store_slot_bytes(const kvs_store *s);
/* Bytes held by live slots of every head: for a KIVI store the live bytes of its arrays,
 * exactly the §3.2 formula plus 4 bytes per key group and the positions and metadata. */
size_t kvs_store_bytes(const kvs_store *s);
/* Bytes the store has allocated for its heads (live bytes plus growth slack). */
size_t kvs_store_alloc_bytes(const kvs_store *s);
/* Live slots summed over every (layer, head). */
int64_t kvs_store_total_slots(const kvs_store *s);

#endif
