/* The KV policy interface: a policy is a table of optional hooks plus declared parameters.
 * Hooks are called per layer by the kv layer (kv/kv.c) and act on the slot store. */
#ifndef KVS_POLICY_H
#define KVS_POLICY_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "kv/kv_store.h"

#define KVS_MAX_PARAMS 16

typedef enum kvs_policy_kind {
    KVS_KIND_FULL,      /* keeps everything */
    KVS_KIND_EVICTING,  /* holds the cache at the budget through prefill and decoding */
    KVS_KIND_ONE_SHOT,  /* compresses the prompt once at prefill end, then appends */
    KVS_KIND_SELECTION, /* keeps everything, attends a budget of slots per step */
    KVS_KIND_MERGING,   /* attends every position of a compressed form it keeps itself
                         * (MiniCache: adjacent layers share K/V); takes no budget */
    KVS_KIND_OFFLOADING, /* keeps every token, most of them in a slow tier of its own outside
                          * the store, and attends a budget of them per step (PQCache) */
} kvs_policy_kind;

/* Whether a policy of this kind takes a budget (budget=F or slots=N): every kind but the full
 * cache and the merging kind, which keep every position. */
static inline int kvs_policy_kind_has_budget(kvs_policy_kind k)
{
    return k == KVS_KIND_EVICTING || k == KVS_KIND_ONE_SHOT || k == KVS_KIND_SELECTION ||
           k == KVS_KIND_OFFLOADING;
}

typedef struct kvs_param_def {
    const char *name;
    double def;
    double min, max;
    int integer; /* 1: whole numbers only */
    const char *help;
} kvs_param_def;

/* A parameter whose value is a word (e.g. mode=query|key): the spec value is the word's index in
 * words, so the parameter's def/min/max are indices (min 0, max the last index, integer). */
typedef struct kvs_param_words {
    const char *param;        /* a name in the type's params */
    const char *const *words; /* NULL-terminated */
} kvs_param_words;

struct kvs_policy_type;

/* What a policy's shift hook learns of a position shift (kvs_kv_shift) of one layer. */
typedef struct kvs_shift_info {
    int32_t keep;  /* positions below keep (the policy's `sinks` parameter) did not move */
    int32_t delta; /* the others moved down by delta, or to the first free position >= keep
                    * where that would collide with the one before (a monotone map) */
    const int32_t *const *old_pos; /* per KV head: its positions before the shift, in slot
                                    * order; the store holds the new ones in the same order */
} kvs_shift_info;

/* A parsed "--kv NAME[:key=value,...]". */
typedef struct kvs_policy_spec {
    const struct kvs_policy_type *type;
    double values[KVS_MAX_PARAMS]; /* per type->params, defaults filled in */
    double budget;                 /* budget=F: fraction (0, 1]; slots=N: count >= 1; 0 = none */
    int budget_is_fraction;
    int shift;                     /* shift=on: position shifting (kvs_session_params) */
    char path[160];                /* the type's path parameter (path_param), "" when not given */
    char text[256];                /* canonical form, e.g. "h2o:budget=0.1", "h2o:slots=64" */
    char user[256];                /* as the user typed it, for messages */
} kvs_policy_spec;

/* A policy instance attached to one kv layer. */
typedef struct kvs_policy {
    const struct kvs_policy_type *type;
    kvs_policy_spec spec;
    kvs_store *store;
    int n_layers, n_heads, n_kv_heads, head_dim;
    int n_prompt; /* tokens of the current prompt */
    int budget;   /* slots per (layer, KV head), resolved at prompt start; INT32_MAX if none.
                   * A one-shot policy whose budget is what it attends rather than what it keeps
                   * (MPCache: budget = keep x eta) sets it in start to the slots it keeps, which
                   * the kv layer and the invariants read */
    int in_prompt; /* the current batch is part of the prompt (positions do not tell once they
                    * are shifted) */
    void *state;  /* owned by the policy */
} kvs_policy;

/* What a prefill hook sees of one chunk of prompt tokens of one layer (already appended and
 * attended). colsum[h * colsum_stride + slot] sums the softmax rows of the chunk's queries the
 * policy asked for (wants_row), over the head's slots as they were during attention. */
typedef struct kvs_chunk {
    int n;
    const float *q;       /* n rows of n_heads * head_dim, post-RoPE */
    const float *k, *v;   /* n rows of n_kv_heads * head_dim, post-RoPE keys */
    const int32_t *pos;
    const float *colsum;  /* NULL unless wants_row selected a row of this chunk */
    int colsum_stride;
    int last;             /* the prompt's final chunk */
} kvs_chunk;

typedef struct kvs_policy_type {
    const char *name;
    const char *summary;
    kvs_policy_kind kind;
    const kvs_param_def *params; /* besides "budget", which every non-full policy takes */
    int n_params;
    int n_meta; /* per-slot float channels the policy keeps in the store */
    const kvs_param_words *words; /* word-valued parameters (optional) */
    int n_words;
    /* One parameter whose value is a file path (PQCache's tier=PATH), kept as text in
     * spec.path; NULL when the type has none. */
    const char *path_param;
    const char *path_help;

    /* The smallest budget in slots the policy accepts with these parameters (protected tokens
     * plus one evictable slot, say); NULL: 1. A fractional budget that resolves below it is
     * raised to it (with a notice); a slots=N below it is rejected by start. */
    int (*min_budget)(const kvs_policy_spec *spec);

    /* A prompt begins: budget and n_prompt are set. Allocate state; reject a budget the policy
     * cannot honour. */
    kvs_status (*start)(kvs_policy *p, kvs_error *err);
    void (*stop)(kvs_policy *p);
    /* Bytes of policy state outside the store (counted as KV bytes). */
    size_t (*state_bytes)(const kvs_policy *p);
    /* Prompt batching (optional; NULL: any batch). The largest number of prompt tokens the next
     * prompt batch may hold once `done` prompt tokens have been processed; <= 0 means any. The
     * session splits the prompt to fit (kvs_kv_prompt_batch) and the kv layer rejects a larger
     * batch. A limit of exactly 1 makes the next prompt token a "fed" token, processed like a
     * decode step: before_append runs first (with the token's post-RoPE q, k, v and position),
     * then the token is stored and attended, then prefill_chunk (a chunk of one token) and, after
     * the prompt's last token, prefill_end run as for any chunk. The observer sees
     * "before_append" during the prompt for such tokens. HashEvict's paper prefill uses this:
     * the first budget tokens densely, every later prompt token through its pre-attention
     * eviction. The limit may depend only on the policy's state and done, not on the layer. */
    int (*prompt_batch)(const kvs_policy *p, int done);
    /* Prefill: should the softmax row of the query at pos be summed into kvs_chunk.colsum? */
    int (*wants_row)(const kvs_policy *p, int layer, int32_t pos);
    kvs_status (*prefill_chunk)(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err);
    kvs_status (*prefill_end)(kvs_policy *p, int layer, kvs_error *err);
    /* Decode (and fed prompt tokens, see prompt_batch), before the new token's K/V are stored. */
    kvs_status (*before_append)(kvs_policy *p, int layer, const float *q, const float *k,
                                const float *v, int32_t pos, kvs_error *err);
    /* Decode, before attention: writes the slots KV head kv_head attends (increasing) and
     * returns their count, or returns -1 for all slots. q holds the group's query rows. */
    int (*select)(kvs_policy *p, int layer, int kv_head, const float *q, int *slots);
    /* Decode, after attention: probs[h * stride + j] for query head h and its j-th attended
     * slot (all slots of its KV head unless select chose some). */
    kvs_status (*after_attention)(kvs_policy *p, int layer, const float *probs, int stride,
                                  kvs_error *err);
    /* Position shifting (evicting policies, between batches): the slots of every head of layer
     * moved to new positions and their keys were re-rotated; slot order and metadata are
     * unchanged. A policy that keeps positions or key-derived data of its own (hash codes)
     * updates them here. Optional. */
    kvs_status (*shift)(kvs_policy *p, int layer, const kvs_shift_info *sh, kvs_error *err);
    /* Decode (optional; the merging kind): the policy attends this layer itself, from what it
     * keeps, with the new token's post-RoPE q, k, v at pos, writing out (n_heads * head_dim).
     * It sets *attended to the slots each query head attended (every position <= pos) when it
     * did, and then the kv layer neither stores the token nor attends for this layer (nor runs
     * before_append, select or after_attention); it leaves *attended 0 for a layer it does not
     * take. pool: for kvs_attention. */
    kvs_status (*attend)(kvs_policy *p, kvs_pool *pool, int layer, const float *q,
                         const float *k, const float *v, int32_t pos, float *out, int *attended,
                         kvs_error *err);
    /* Optional, with attend: the positions KV head kv_head attended at the last attend of
     * layer (increasing), for eval's attention recall against every key (the shadow); returns
     * their count. Without it an attend hook counts as attending every position. */
    int (*attended_positions)(const kvs_policy *p, int layer, int kv_head, const int32_t **pos);
    /* The offloading kind: tokens of layer the policy holds outside the store (its slow
     * tier); the store and they together hold every token seen. */
    int (*offloaded)(const kvs_policy *p, int layer);
    /* Prefill (optional): the policy attends a prompt batch of one layer itself, in place of
     * the kv layer's attention over the store (the batch is already stored): dense causal
     * attention over what it keeps outside the store as well as the store's slots (PQCache's
     * slow tier holds the middle of a long prompt). q and out: n rows of n_heads * head_dim.
     * Not with wants_row. */
    kvs_status (*prefill_attend)(kvs_policy *p, kvs_pool *pool, int layer, int n,
                                 const float *q, const int32_t *pos, float *out, kvs_error *err);
    /* Optional: line i (0, 1, ...) of the policy's own measurements since the prompt began
     * (e.g. HashEvict's per-step costs), for `kvslim bench` to print; 0 when a line was
     * written, -1 when there is none for i. Policies never print. */
    int (*report)(const kvs_policy *p, int i, char *buf, size_t size);
} kvs_policy_type;

/* Index of the parameter called name in t->params, or -1 if t declares none of that name. */
int kvs_policy_param_index(const kvs_policy_type *t, const char *name);
/* Value of a declared parameter (its default when not given); a word-valued parameter gives
 * its word's index. The name must be one the policy's type declares: an undeclared one is a
 * programming error, stopped by KVS_ASSERT in debug builds (0.0 in release builds). */
double kvs_policy_param(const kvs_policy *p, const char *name);
/* The same for a parsed spec. */
double kvs_policy_spec_param(const kvs_policy_spec *spec, const char *name);
/* A parameter only some policies declare (the sinks position shifting leaves in place): its
 * value, or fallback for a type that does not declare it. */
double kvs_policy_param_or(const kvs_policy *p, const char *name, double fallback);
/* The smallest budget in slots the spec's policy accepts (type->min_budget, else 1). */
int kvs_policy_min_budget(const kvs_policy_spec *spec);
/* Slots per (layer, head) for a prompt of n_prompt tokens: a fraction F gives round(F * n)
 * (half up), raised to kvs_policy_min_budget; a count is taken as is. INT32_MAX when the spec
 * has no budget. */
int kvs_policy_budget_slots(const kvs_policy_spec *spec, int n_prompt);
/* If the fraction was raised for this prompt, writes a one-line notice naming the policy, the
 * fraction and the slots used into buf and returns 1; else returns 0. */
int kvs_policy_budget_notice(const kvs_policy_spec *spec, int n_prompt, char *buf, size_t size);

/* The GQA group mean, with the one rounding rule every policy uses (h2o, tova, snapkv, nacl):
 * for each of a KV head's `group` query heads g in order, dst[j] += rows[g * stride + j] *
 * (1 / group) in float32, j < n; rows points at the group's first row. Adding each term scaled,
 * rather than summing first, lets accumulating scores (h2o) add a mean without an extra
 * buffer. For a power-of-two group (1 / group exact; stories260K's group is 2) a term times
 * 1 / group equals the term divided by group, bit for bit; for other groups the two may differ
 * in the last bit, and this rule is the one kept. */
void kvs_group_mean_add(float *dst, const float *rows, size_t stride, int group, int n);

/* Adds a prompt chunk's column sums, as the group mean of each KV head's query heads
 * (kvs_group_mean_add), into score[h * stride + slot] for every slot the head holds. Fails if a
 * head holds more than stride slots (slots from before the prompt). */
kvs_status kvs_policy_add_group_mean(const kvs_policy *p, int layer, const kvs_chunk *c,
                                     float *score, int stride, kvs_error *err);

/* ---- shared eviction routine ---- */
typedef enum kvs_tie { KVS_TIE_KEEP_OLDER, KVS_TIE_KEEP_NEWER } kvs_tie;
/* Keeps in one head: the `sinks` oldest slots, the `recent` newest slots, and the highest
 * score[] among the rest until `budget` slots are kept (ties by position as `tie` says);
 * compacts the store. score has one entry per slot. A head of at most budget slots is left as
 * it is. KVS_ERR_NOMEM (nothing evicted) if the ranking's memory cannot be had: the caller must
 * fail, as its cache is then over budget. */
kvs_status kvs_evict_keep_top(kvs_store *s, int layer, int head, const float *score, int budget,
                              int sinks, int recent, kvs_tie tie, kvs_error *err);

/* For policies' start hooks: a budget given as a token count must fit the context (the
 * store's slot limit); a budget as large as the context keeps everything. */
static inline kvs_status kvs_policy_check_context(const kvs_policy *p, kvs_error *err)
{
    const int ctx = kvs_store_cfg(p->store)->max_slots;
    if (!p->spec.budget_is_fraction && p->budget > ctx)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget of %d slots exceeds the context of %d tokens",
                        p->spec.user, p->budget, ctx);
    return KVS_OK;
}

#endif
