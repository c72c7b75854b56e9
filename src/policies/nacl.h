/* NaCl internals exposed for tests (tests/test_nacl.c) and tools: the budget plan, the
 * counter-based Gumbel stream, the per-head selection, and read access to the proxy scores of
 * a running nacl policy. The policy itself is kvs_policy_nacl (policies.h). */
#ifndef KVS_NACL_H
#define KVS_NACL_H

#include <stdint.h>

#include "kv/policy.h"

/* The parameters of "--kv nacl:..." (see nacl.c for their meaning). */
typedef struct kvs_nacl_cfg {
    double proxy;       /* proxy fraction of the prompt: n_P = max(1, floor(proxy * p)) */
    int proxy_begin;    /* >= 0: explicit proxy span [proxy_begin, proxy_end) */
    int proxy_end;      /* < 0: the prompt's end */
    double random_share; /* rho */
    int sinks;
    int recent;         /* < 0: n_P */
    double temperature; /* tau; 0 = uniform sampling (tau = infinity) */
    uint64_t seed;
    int min_prompt;     /* prompts of at most this many tokens are kept whole */
    int interval;       /* decode re-eviction every `interval` steps; 0 = never */
    int mask;           /* reference path: keep every slot, attend the kept ones (select) */
} kvs_nacl_cfg;

/* What happens to one prompt (spec section 3.2, Steps 0 and 1). */
typedef struct kvs_nacl_plan {
    int evict;                     /* 0: the prompt is kept whole (B >= p or p <= min_prompt) */
    int p, B;
    int proxy_begin, proxy_end;    /* proxy rows [proxy_begin, proxy_end); n_P = end - begin */
    int n_proxy;
    int n_sink, n_recent;          /* after clamping */
    int prot_begin, prot_end;      /* the protected part of a middle span (empty if none) */
    int n_prot;                    /* |PROT| */
    int C_p, C_r;                  /* prefill split of B - n_prot */
    int dec_C_p, dec_C_r;          /* decode re-eviction split of B - n_sink - n_recent */
} kvs_nacl_plan;

/* Resolves the plan for a prompt of p tokens and a budget of B slots per (layer, KV head).
 * Fails (naming `name`, e.g. the spec text) on a span outside the prompt. */
kvs_status kvs_nacl_make_plan(const kvs_nacl_cfg *cfg, int p, int B, const char *name,
                              kvs_nacl_plan *out, kvs_error *err);
/* 1 if prompt position pos is protected (always kept) under the plan. */
int kvs_nacl_protected(const kvs_nacl_plan *pl, int pos);

/* floor(x) for a product of a decimal parameter and a count, robust to binary rounding of the
 * decimal (0.29 * 100 = 28.999999999999996 gives 29). */
int kvs_nacl_floor(double x);

/* The uniform of candidate position pos in stream (seed, layer, head, event), from
 * core/random.h: key = kvs_random_key(seed, {(uint32_t)layer, (uint32_t)head, event}), then
 * kvs_random_unit_open(kvs_random_at(key, pos)): the top 53 bits b of the draw as
 * (b + 1/2) 2^-53. Never 0; exactly 1 only for b = 2^53 - 1 (the + 1/2 rounds to even above
 * 2^52), whose Gumbel key is +inf: probability 2^-53 per draw. */
double kvs_nacl_uniform(uint64_t seed, int layer, int head, uint64_t event, int64_t pos);
/* Standard Gumbel noise -log(-log(u)) of the same stream. */
double kvs_nacl_gumbel(uint64_t seed, int layer, int head, uint64_t event, int64_t pos);

/* One (layer, KV head) selection over n entries: score[i] (F), position pos[i] (increasing),
 * prot[i] != 0 for protected entries (always kept; prot may be NULL). Picks:
 *   TOP: the C_p highest-scored unprotected entries (ties: lower position);
 *   RND: C_r of the remaining unprotected entries, without replacement from
 *        softmax(score * inv_tau) (inv_tau = 0: uniform), by Gumbel-top-k with keys
 *        score * inv_tau + kvs_nacl_gumbel(seed, layer, head, event, pos) (ties: lower pos).
 * Writes the kept entry indices (protected, TOP and RND) to keep[] in increasing order and
 * returns their count; top[] and rnd[] (optional, NULL to skip) receive the picked indices in
 * pick order. C_p + C_r must not exceed the unprotected count. Returns -1 out of memory. */
int kvs_nacl_select(const float *score, const int32_t *pos, const uint8_t *prot, int n, int C_p,
                    int C_r, double inv_tau, uint64_t seed, int layer, int head, uint64_t event,
                    int *keep, int *top, int *rnd);

/* Of a running nacl policy (type kvs_policy_nacl): its configuration and plan for the current
 * prompt, and the accumulated proxy scores F of one layer (n_kv_heads rows of plan.p floats),
 * NULL when the layer holds none (before its first proxy row and after its prefill_end). */
const kvs_nacl_cfg *kvs_nacl_config(const kvs_policy *p);
const kvs_nacl_plan *kvs_nacl_plan_of(const kvs_policy *p);
const float *kvs_nacl_scores(const kvs_policy *p, int layer);

#endif
