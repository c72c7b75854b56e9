/* eval --task opcount: the data-independent MPC op-count model of methods/mpcache.md §3.5 (per
 * decode step, summed over layers and heads) for full attention, token-level selection, Quest
 * and MPCache's step-by-step ablation, and the token-gather comparison of §3.3 (Table 2). */
#ifndef KVS_EVAL_OPCOUNT_H
#define KVS_EVAL_OPCOUNT_H

#include <stdint.h>

#include "core/error.h"
#include "policies/mpcache_math.h"

/* A model's attention shape (only what the counts depend on). */
typedef struct kvs_opcount_shape {
    int n_layers, n_heads, n_kv_heads, head_dim;
} kvs_opcount_shape;

/* Checks a shape: every field >= 1 and n_heads a multiple of n_kv_heads. KVS_ERR_ARG names the
 * offending field (layers, heads, kv_heads, head_dim) as the --shape keys spell it. */
kvs_status kvs_opcount_shape_check(const kvs_opcount_shape *s, kvs_error *err);

/* The methods, one row each, in this order. */
typedef enum kvs_opcount_method {
    KVS_OC_FULL,         /* full attention, no selection */
    KVS_OC_TOKEN,        /* token-level cosine top-k over the whole context (LongCache-like) */
    KVS_OC_QUEST,        /* pages of 16 scored by Eq. 1, every layer selecting */
    KVS_OC_MP_TOKEN,     /* MPCache ablation a: static step + token-level dynamic selection */
    KVS_OC_MP_CLUSTER,   /* b: + fine clusters (s2), Eq. 1 upper-bound score */
    KVS_OC_MP_LINEAR,    /* c: + linearised score (Eq. 2) */
    KVS_OC_MP_HIERARCHY, /* d: + coarse-then-fine selection (2 levels, linear) */
    KVS_OC_MP_SHARING,   /* e: + cross-layer sharing: MPCache as configured */
    KVS_OC_N_METHODS
} kvs_opcount_method;

/* The row's name: "full", "token", "quest", "mp:static+token", "mp:+cluster", "mp:+linear",
 * "mp:+hierarchy", "mp:+sharing". */
const char *kvs_opcount_method_name(kvs_opcount_method m);

/* One method's counts for one decode step, summed over layers and heads. Selection (similarity,
 * top-k, gather) is per KV head: the group's queries are summed locally, which is free in MPC.
 * Softmax and qK/PV are per query head. */
typedef struct kvs_opcount_row {
    kvs_opcount_method method;
    int selector_layers;  /* layers that run selection (0 for full) */
    int64_t attended;     /* tokens one query head attends in one layer (k, tail included) */
    int64_t sim_mults;    /* similarity multiplications */
    int64_t sim_max;      /* max ops in the similarity (Eq. 1 bound) */
    int64_t sim_div;      /* divisions of the cosine similarity (one per scored key) */
    int64_t topk_len;     /* the sum of every top-k call's input length */
    int64_t topk_calls;   /* top-k calls */
    int64_t gather_eq;    /* gather equality tests (one-hot of each chosen index) */
    int64_t gather_bits;  /* gather equality-test bits: tests x ceil(log2 list length) */
    int64_t softmax_len;  /* softmax inputs, summed over query heads */
    int64_t attn_mults;   /* qK and PV multiplications, 2 k d per query head */
    /* Reduction factors: the reference's total over this row's (larger is cheaper). Softmax and
     * mults (similarity + qK/PV) are against full attention; gather bits against the token-level
     * row, the baseline gather (full attention gathers nothing: NaN there, and for any row with
     * no gather). */
    double red_softmax, red_mults, red_bits;
} kvs_opcount_row;

/* The inputs of one table. */
typedef struct kvs_opcount_input {
    kvs_opcount_shape shape;
    int ctx;        /* T: the context (prompt tokens in the cache), >= 1 */
    double budget;  /* F: the share of the context attended, (0, 1] */
    int tail;       /* tokens after the context, always attended: 1 on the first decode step */
    kvs_mp_cfg cfg; /* MPCache's configuration (keep, s1, s2, rho1, pad, sim, levels, share) */
} kvs_opcount_input;

/* The static keep ratio MPCache uses at budget F: max(keep, F), as the policy does
 * (policies/mpcache.c), so that keep x eta can reach F; eta = F / that. */
double kvs_opcount_keep(const kvs_mp_cfg *c, double budget);

/* Fills rows[KVS_OC_N_METHODS] for in (shape checked as above, ctx >= 1, budget in (0, 1],
 * tail >= 0, cfg with s2 >= 1 dividing s1). KVS_ERR_ARG otherwise. */
kvs_status kvs_opcount_rows(const kvs_opcount_input *in, kvs_opcount_row *rows, kvs_error *err);

/* MPCache's configuration from a --kv spec text of the mpcache policy type, checked against a
 * model of n_layers layers (policies/mpcache.h). *budget gets the spec's budget=F fraction, or 0
 * when it has none. KVS_ERR_ARG for a spec that does not parse or is not mpcache. */
kvs_status kvs_opcount_cfg_from_spec(const char *text, int n_layers, kvs_mp_cfg *out,
                                     double *budget, kvs_error *err);

/* ceil(log2 n): the bits of an index into a list of n (0 for n <= 1). */
int kvs_opcount_index_bits(int64_t n);

/* The token-gather comparison of §3.3 (Table 2): k1 = ceil(frac T) token indices, each a one-hot
 * over T, against k2 = ceil(frac C) cluster indices, each a one-hot over C. */
typedef struct kvs_opcount_gather {
    int T, C;
    double frac;
    int64_t k1, k2;             /* indices gathered */
    int64_t cmp1, cmp2;         /* equality tests per index: T and C */
    int bits1, bits2;           /* bits per test: ceil(log2 T), ceil(log2 C) */
    int64_t tests1, tests2;     /* k x list */
    int64_t testbits1, testbits2; /* k x list x bits */
    double cmp_ratio, bits_ratio, per_index_ratio, tests_ratio, testbits_ratio;
    double paper_latency_ratio; /* 73.5: measured by the paper in SecretFlow-SPU (3PC) */
    double paper_comm_ratio;    /* 369.8: likewise; both need an MPC runtime to reproduce */
} kvs_opcount_gather;

/* Fills *out for T >= 2, C >= 2, frac in (0, 1]; KVS_ERR_ARG otherwise. */
kvs_status kvs_opcount_gather_table(int T, int C, double frac, kvs_opcount_gather *out,
                                    kvs_error *err);

#endif
