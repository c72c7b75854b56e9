/* What the files of MPCache on shares share (mpcache.c: configuration and state; mpcache_static.c:
 * the static step and cluster boxes; mpcache_decode.c: a decode step's choice and attention). */
#ifndef KVS_MPC_MPCACHE_INTERNAL_H
#define KVS_MPC_MPCACHE_INTERNAL_H

#include "mpc/mpcache.h"

/* Sign-test widths (each a promise about the values compared):
 * keys and window sums at frac are below 2^19 in value; cluster scores (qs . rep at 2 frac, qs
 * the sum of a group's scaled queries) below 2^17; a wholly dummy fine cluster's score gets
 * kvs_mpcache_penalty, below every real score and within the width. */
#define KEY_BITS(f) ((f) + 21)
#define SCORE_BITS(f) (2 * (f) + 20)
#define SUM_BITS(f) ((f) + 16)
static inline uint64_t kvs_mpcache_penalty(int f)
{
    return (uint64_t)0 - ((uint64_t)1 << (2 * f + 18));
}

/* KVS_ERR_NOMEM naming what and how many values. */
kvs_status kvs_mpcache_no_memory(kvs_error *err, const char *what, size_t n);

static inline int kvs_mpcache_cluster_mode(const kvs_mpc_sel *s)
{
    return s->cfg.mode == KVS_MPC_KV_CLUSTER;
}

/* Whether layer l chooses for itself (token level: every layer; clusters: §2.4). */
int kvs_mpcache_is_selector(const kvs_mpc_sel *s, int l);

/* Whether slot v of the padded layout holds a real token. */
static inline int kvs_mpcache_slot_real(const kvs_mpc_sel *s, size_t v)
{
    return v < (size_t)s->n_keep || v >= (size_t)s->n_pad;
}

/* Party b's shares of cache rows [t0, t0 + n) (n x heads x d): M = E + B, party 0 adds E. */
void kvs_mpcache_cache_shares(const kvs_mpc *m, const kvs_mpc_cache *c, size_t t0, size_t n,
                              uint64_t *out);

/* Test-only (open_choices): opens M (heads x rows x cols of 0/1: a keep mask, rows 1, or a
 * one-hot F) and hands fn, per head, the columns where some row holds a 1, ascending. */
kvs_status kvs_mpcache_report_open(kvs_mpc *m, kvs_mpc_sel *s, kvs_mpc_choice_fn fn, int l,
                                   const uint64_t *M, size_t heads, size_t rows, size_t cols,
                                   kvs_error *err);

/* The k best of each of rows rows of len values (ties to the lower index) as their ordered
 * gather matrix G (rows x k x len): a top-k mask (sel, rows x len, left for the caller) by ranks
 * for the short rows of clusters, by a threshold for the long rows of tokens, then
 * kvs_mpc_gather_matrix. */
kvs_status kvs_mpcache_best_k(kvs_mpc *m, int by_threshold, const uint64_t *v, size_t rows,
                              size_t len, size_t k, int bits, uint64_t *sel, uint64_t *G,
                              kvs_error *err);

#endif
