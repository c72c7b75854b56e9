/* The secret KV cache of the two-party engine: rows appended a block of tokens at a time, each opened
 * once under a fresh dealer mask (E = row - B: uniform to both parties), so that a product with a
 * later query costs one opening of the query's masked copy, not of the whole cache. For a shared
 * x and a cached M = E + B: x M^T = x E^T (local, E public) + (x - A) B^T + A B^T, with A a fresh
 * dealer mask and A B^T handed out by the dealer as shares. */
#ifndef KVS_MPC_GATES_CACHE_H
#define KVS_MPC_GATES_CACHE_H

#include "mpc/mpc.h"

typedef struct kvs_mpc_cache {
    int heads, d;    /* KV heads, values per row and head */
    size_t len, cap; /* rows per head */
    uint64_t *E;     /* parties: masked rows, [row][head][d] */
    uint64_t *B;     /* parties: their share of the masks; the dealer: the masks */
} kvs_mpc_cache;

void kvs_mpc_cache_init(kvs_mpc_cache *c, int heads, int d);
void kvs_mpc_cache_free(kvs_mpc_cache *c);

/* Appends n tokens' rows (rows: n x heads x d shares; NULL for the dealer): one opening of
 * n x heads x d words. */
kvs_status kvs_mpc_cache_append(kvs_mpc *m, kvs_mpc_op op, kvs_mpc_cache *c,
                                const uint64_t *rows, size_t n, kvs_error *err);

/* For n query rows r: out[r][h][g][t] = sum_i x[r][h][g][i] M[h][t][i] (mod 2^64, no
 * truncation) for G queries per head (x: n x heads x G x d; out: n x heads x G x len): one
 * opening of n x heads x G x d words; the dealer sends party 1 n x heads x G x len words. */
kvs_status kvs_mpc_cache_qk(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                            const uint64_t *x, size_t n, int G, uint64_t *out, kvs_error *err);

/* For n rows r: out[r][h][g][i] = sum_t p[r][h][g][t] M[h][t][i] (p: n x heads x G x len; out:
 * n x heads x G x d): one opening of n x heads x G x len words; the dealer sends party 1
 * n x heads x G x d words. */
kvs_status kvs_mpc_cache_pv(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                            const uint64_t *p, size_t n, int G, uint64_t *out, kvs_error *err);

/* Gathers whole clusters of s consecutive rows: out[h][p][j][i] = sum_c g[h][p][c] M[c s + j][h][i]
 * for p < k, j < s, i < d (g: heads x k x C with C = len / s; out: heads x k x s x d). With g a
 * one-hot per (h, p) (kvs_mpc_gather_matrix) it copies the chosen clusters' rows: MPCache's
 * cluster-level gather, whose opening is heads x k x C words (the token-level gather of the same
 * rows opens heads x k s x len); the dealer sends party 1 heads x k x s x d words. */
kvs_status kvs_mpc_cache_gather(kvs_mpc *m, kvs_mpc_op op, const kvs_mpc_cache *c,
                                const uint64_t *g, size_t k, size_t s, uint64_t *out,
                                kvs_error *err);

#endif
