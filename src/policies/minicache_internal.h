/* MiniCache's state as the tests read it (minicache.c): pairs, retained sets, scales and the
 * byte count by component. Not for the tools. */
#ifndef KVS_MINICACHE_INTERNAL_H
#define KVS_MINICACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_store.h"
#include "kv/policy.h"

enum { KVS_MC_K = 0, KVS_MC_V = 1 };

/* Bytes of MiniCache's state by component (their sum is state_bytes). */
typedef struct kvs_mc_bytes {
    size_t pair_store; /* E_K and E_V of every pair (kvs_store_bytes of the pair store) */
    size_t scales;     /* the folded norms s = n / ||stored e||, 2 layers x 2 kinds per pair */
    size_t retained;   /* exact rows of both layers and their int32 token indices */
    size_t prefill;    /* the pair layers' exact prompt K/V until the merge (prefill only) */
    size_t pending;    /* layer a's raw k, v of the current decode token, per pair */
} kvs_mc_bytes;

/* The number of merged pairs (0 before start), and pair i's layers (a = first, b = a + 1). */
int kvs_mc_n_pairs(const kvs_policy *p);
int kvs_mc_pair_first(const kvs_policy *p, int pair);
/* The private pair store: one "layer" per pair, E_K as keys and E_V as values. */
const kvs_store *kvs_mc_pair_store(const kvs_policy *p);
/* Units per token (1 for unit=token, n_kv_heads for unit=head) and their width. */
int kvs_mc_units(const kvs_policy *p, int *unit_dim);
/* Retained set of (pair, kind, unit): its count; *idx the token indices (increasing); *ra, *rb
 * the exact rows of layers a and b (unit_dim elements each, one after another), of *type. */
int kvs_mc_retained(const kvs_policy *p, int pair, int kind, int unit, const int32_t **idx,
                    const void **ra, const void **rb, kvs_dtype *type);
/* The scale of (pair, kind, layer r: 0 = a, 1 = b, unit, token) as attention applies it;
 * 1 when the merge stores no norms (mean, fmax). */
float kvs_mc_scale(const kvs_policy *p, int pair, int kind, int r, int unit, int token);
/* 1 if a pair still holds a pending decode token. */
int kvs_mc_pending(const kvs_policy *p);
void kvs_mc_state_bytes(const kvs_policy *p, kvs_mc_bytes *b);

#endif
