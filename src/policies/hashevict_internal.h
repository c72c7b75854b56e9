/* Internal to policies/: the slot-table machinery that hashevict.c and l2evict.c share. The two
 * policies differ in a slot's metadata (a SimHash code, or the key's L2 norm), in their victim
 * rule and in their prompt rule beyond the budget; everything else (the physical slot table,
 * the pre-attention eviction, prompt batching, position shifting, accounting, timings) is one
 * implementation in hashevict.c, started for either policy by kvs_he_start. */
#ifndef KVS_HASHEVICT_INTERNAL_H
#define KVS_HASHEVICT_INTERNAL_H

#include "policies/hashevict.h"
#include "policies/policies.h"

/* The words of the ties parameter, shared by both policies. */
extern const char *const kvs_he_ties_words[];

/* Evictable: neither a sink (pos < sinks) nor in the recent window of the token at t. */
static inline int kvs_he_evictable(int32_t pos, int32_t t, int sinks, int recent)
{
    return pos >= sinks && (int64_t)pos < (int64_t)t - recent;
}

/* The machinery's hooks; kvs_he_start(p, l2, err) starts hashevict (l2 = 0) or l2evict. */
kvs_status kvs_he_start(kvs_policy *p, int l2, kvs_error *err);
int kvs_he_min_budget(const kvs_policy_spec *spec);
void kvs_he_stop(kvs_policy *p);
size_t kvs_he_state_bytes(const kvs_policy *p);
int kvs_he_prompt_batch(const kvs_policy *p, int done);
kvs_status kvs_he_prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err);
kvs_status kvs_he_before_append(kvs_policy *p, int layer, const float *q, const float *k,
                                const float *v, int32_t pos, kvs_error *err);
kvs_status kvs_he_shift(kvs_policy *p, int layer, const kvs_shift_info *sh, kvs_error *err);

/* Every hook but start, inside a type's designated initializer. */
#define KVS_HE_HOOKS                                                                           \
    .kind = KVS_KIND_EVICTING, .min_budget = kvs_he_min_budget, .stop = kvs_he_stop,          \
    .state_bytes = kvs_he_state_bytes, .prompt_batch = kvs_he_prompt_batch,                    \
    .prefill_chunk = kvs_he_prefill_chunk, .before_append = kvs_he_before_append,              \
    .shift = kvs_he_shift, .report = kvs_hashevict_timing_line

/* l2evict's slot metadata: the L2 norm of a key row as stored (summed in double). */
float kvs_he_l2_norm(const float *x, int n);
/* l2evict's prompt rule (prefill=norm), per chunk: keep in head h the sinks, the recent window
 * and the lowest norms up to the budget (equal norms: the older goes first). score: scratch of
 * the head's count, key: of head_dim floats. */
kvs_status kvs_l2_keep_lowest_norms(kvs_policy *p, int layer, int h, float *score, float *key,
                                    int sinks, int recent, kvs_error *err);

#endif
