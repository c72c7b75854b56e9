/* KV-cache selection inside the two-party forward pass (methods/mpcache.md §2-3, issue 13):
 * MPCache's look-once static eviction at the prompt's end and its clustered dynamic selection
 * per decode step, on secret shares, and the token-level baseline (top-k over every cached
 * token, LongCache-like) in the same engine. Every count (kept, clusters, chosen) is public and
 * a function of the prompt length, the step and the configuration only (the padding of §2.3.4);
 * which slots are kept and chosen stays secret.
 *
 * How the steps map onto the engine's gates:
 *   static step (once, after the prompt's last block): the window rows' softmax probabilities are
 *     summed locally during the prefill (per KV head, over its query heads); one top-k by
 *     threshold per head (kvs_mpc_topk_threshold, batched over heads), its ordered gather matrix,
 *     and the kept keys and values gathered (kvs_mpc_cache_gather) into new caches, padded with
 *     dummy slots to a multiple of s1 (a dummy holds a copy of a real key of its fine cluster, so
 *     it never raises a softmax max, and a public 0 in the slot validity); then the cluster boxes
 *     (one max tree over s2 rows, coarse boxes from fine ones) and the representatives
 *     alpha max + (1 - alpha) min, into small secret caches of their own.
 *   decode step, a selecting layer: coarse scores qs . rep1 (qs: the group's queries summed) as a
 *     product with the cached representatives (no comparison, Eq. 2); a top-k mask over the C1
 *     coarse clusters, batched over heads (kvs_mpc_topk_mask); the fine scores of the chosen
 *     clusters' children gathered by the coarse gather matrix; a top-k over the candidates;
 *     their gather matrices composed into a one-hot F (n2 x C2x) over fine clusters.
 *   attention over the chosen clusters: the scores q . k of the clustered slots are gathered
 *     by F (a product with the one-hot, clusters of s2 slots) and the probabilities scattered
 *     back by F^T, so the softmax runs over n2 s2 slots plus the tail (always attended) while
 *     the products with K and V stay those of the masked cache (see mpcache.c for why this
 *     costs less than gathering the rows). A sharing layer reuses its partner's F (§2.4). */
#ifndef KVS_MPC_MPCACHE_H
#define KVS_MPC_MPCACHE_H

#include "mpc/forward.h"
#include "policies/mpcache_math.h"

typedef enum kvs_mpc_kv_mode {
    KVS_MPC_KV_FULL,    /* attend every cached slot (after the static step, when it runs) */
    KVS_MPC_KV_TOKEN,   /* top-k over every cached slot but the newest, token-level gather */
    KVS_MPC_KV_CLUSTER  /* MPCache's clusters (mp.levels, mp.sim LINEAR or UB, mp.share) */
} kvs_mpc_kv_mode;

typedef struct kvs_mpc_kv_cfg {
    kvs_mpc_kv_mode mode;
    int static_step; /* evict at the prompt's end (always on in CLUSTER mode) */
    double budget;   /* the attended share of the prompt, (0, 1]: eta = budget / keep (§2.3.5) */
    kvs_mp_cfg mp;   /* keep, window, s1, s2, rho1, alpha, sim, levels, share, skip (pad is on) */
} kvs_mpc_kv_cfg;

/* One layer's selection state. Shares unless noted (the dealer holds the masks only). */
typedef struct kvs_mpc_sel_layer {
    uint64_t *win;            /* heads x P: the window rows' attention sums (prefill only) */
    uint64_t *gs;             /* heads x N x P: the static gather matrix (for the partner) */
    kvs_mpc_cache rep1, rep2; /* LINEAR: coarse and fine representatives, one row a cluster */
    uint64_t *mx2, *mn2;      /* UB: fine boxes, [cluster][head][d] */
    size_t n_box, cap_box;    /* UB: fine boxes held */
    uint64_t *F;              /* the last step's one-hot over fine clusters, heads x n2 x C2x */
    int sealed;               /* decode slots sealed into clusters (public) */
    size_t mark[6];           /* kvs_mpc_sel_mark: k, v, rep1, rep2 rows, boxes, sealed */
} kvs_mpc_sel_layer;

/* A test's view of one choice (test-only: the one-hot F is opened, which a deployment never
 * does): layer, KV head, the chosen fine clusters of the padded layout, ascending. */
typedef void (*kvs_mpc_choice_fn)(void *ctx, int layer, int head, const int *fine, int n);

typedef struct kvs_mpc_sel {
    kvs_mpc_kv_cfg cfg;
    double keep, eta;     /* in use (keep raised to the budget, as the plaintext policy does) */
    int prompt_len;       /* P: the static step runs once the forward pass reaches it */
    int window;           /* the window rows, ceil(window P) */
    int n_keep, n_pad;    /* N kept slots a head, and N padded to a multiple of s1 (CLUSTER) */
    int compressed;       /* the static step has run (or is not configured) */
    kvs_mpc_sel_layer *layers;
    int mark_pos;         /* kvs_mpc_sel_mark: L->pos, or -1 */
    int open_choices;     /* both parties, tests and benchmarks only: every choice is opened */
    kvs_mpc_choice_fn on_choice; /* and handed to this (may be NULL) */
    kvs_mpc_choice_fn on_keep;   /* the static step's kept positions (fine = positions) */
    void *choice_ctx;
} kvs_mpc_sel;

/* Checks cfg against the shape (a clear KVS_ERR_ARG naming the parameter) and attaches a
 * selection state to L before its prompt of P tokens; every role calls it with the same
 * arguments. The forward pass then sums the window, runs the static step once L->pos reaches P
 * and selects at every later token (one token a call). */
kvs_status kvs_mpc_sel_attach(kvs_mpc_llama *L, const kvs_mpc_kv_cfg *cfg, int P,
                              kvs_error *err);
void kvs_mpc_sel_free(kvs_mpc_llama *L);

/* Benchmarks: remember the state after the static step (kvs_mpc_sel_mark), decode, then go back
 * to it (kvs_mpc_sel_rewind: the decode tokens' rows and clusters are dropped; the kept masks of
 * the cache serve again, as they serve every step) and decode again, e.g. at another budget
 * (kvs_mpc_sel_set_budget: KVS_ERR_ARG when it would change the static step's keep). Every role
 * calls them at the same point. */
void kvs_mpc_sel_mark(kvs_mpc_llama *L);
kvs_status kvs_mpc_sel_rewind(kvs_mpc_llama *L, kvs_error *err);
kvs_status kvs_mpc_sel_set_budget(kvs_mpc_llama *L, double budget, kvs_error *err);

/* The configuration a --kv text gives under the protocol: "full" (mode FULL, no static step)
 * or "mpcache:budget=F[,...]" (the plaintext policy's parameters, budget a fraction; quant is
 * the protocol's own ranking and is ignored), checked against an n_layers model.
 * KVS_ERR_ARG naming the parameter. */
kvs_status kvs_mpc_kv_parse(const char *text, int n_layers, kvs_mpc_kv_cfg *out,
                            kvs_error *err);

/* The defaults of a mode (MPCache's spec defaults, share on, budget 0.05). */
kvs_mpc_kv_cfg kvs_mpc_kv_default(kvs_mpc_kv_mode mode);

/* ---- called by the forward pass (forward.c) ---- */

/* During the prompt: adds the softmax probabilities of the block's window rows (p: n rows x
 * n_heads x T, rows at positions pos .. pos + n - 1) to layer l's sums. Local. */
void kvs_mpc_sel_observe(kvs_mpc *m, kvs_mpc_llama *L, int l, const uint64_t *p, size_t n,
                         int pos, size_t T);

/* After the block that ends the prompt: the static step of every layer. */
kvs_status kvs_mpc_sel_compress(kvs_mpc *m, kvs_mpc_llama *L, kvs_error *err);

/* Whether layer l's attention at the current decode token goes through the selection path. */
int kvs_mpc_sel_active(const kvs_mpc_llama *L);

/* Before the decode token's key is appended to layer l's cache: a tail of s1 slots becomes one
 * coarse cluster (its boxes, representatives). */
kvs_status kvs_mpc_sel_seal(kvs_mpc *m, kvs_mpc_llama *L, int l, kvs_error *err);

/* One decode token's attention in layer l after its key and value were appended: q (n_heads x
 * head_dim, scaled by 1/sqrt(head_dim), at frac) -> out (n_heads x head_dim, at 2 frac: the
 * caller truncates, as for the full cache). */
kvs_status kvs_mpc_sel_attend(kvs_mpc *m, kvs_mpc_llama *L, int l, const uint64_t *q,
                              uint64_t *out, kvs_error *err);

#endif
