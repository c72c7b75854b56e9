/* What the emulator's files share (fx_llama.c: weights, the forward pass, the dense attention;
 * fx_mpcache.c: the static step, the cluster representatives, a decode step's selection). */
#ifndef KVS_MPC_FX_LLAMA_INTERNAL_H
#define KVS_MPC_FX_LLAMA_INTERNAL_H

#include "mpc/fx_llama.h"

typedef struct kvs_fx_layer {
    uint64_t *qkv, *wo, *w13, *w2; /* k x n, rows of inputs, norms folded (as forward.c) */
    uint64_t *K, *V;               /* cache slots x kv heads x head_dim */
    uint64_t *rep1, *rep2;         /* coarse, fine representatives: cluster x kv heads x d */
    size_t n_rep1, n_rep2, cap_rep1, cap_rep2;
    int *keep;                     /* kv heads x n_keep: the static step's kept positions */
    int *F;                        /* kv heads x n2: the last decode step's fine clusters (-1:
                                    * none), ascending */
    int sealed;                    /* decode slots sealed into clusters */
} kvs_fx_layer;

struct kvs_fx_llama {
    kvs_mpc_llama plan; /* the shape, and with a selection its public plan (plan.sel: counts,
                         * configuration, window sums); no shares */
    int frac;
    uint64_t *emb, *out; /* vocab x dim; dim x vocab */
    kvs_fx_layer *layers;
    size_t len, cap;     /* cache slots held (every layer alike) and allocated */
    uint64_t *work;      /* scratch of the attention: 4 n_heads x (cap + 1) words */
    kvs_mpc_choice_fn on_keep, on_choice;
    void *ctx;
};

/* Softmax of one row of w scores at frac in place, as kvs_mpc_softmax reconstructs it: max,
 * exp_neg of the differences, times mask (NULL: none), the reciprocal of the sum, a product
 * truncated by frac. */
void kvs_fx_softmax(uint64_t *sc, size_t w, const uint64_t *mask, int frac);

/* x . y over n values, mod 2^64 (no truncation). */
uint64_t kvs_fx_dot(const uint64_t *x, const uint64_t *y, size_t n);

/* Grows every layer's K and V to hold need slots. */
kvs_status kvs_fx_reserve(kvs_fx_llama *E, size_t need, kvs_error *err);

/* ---- fx_mpcache.c, called by the forward pass ---- */

/* The prefill's window rows: adds the probabilities p (n_heads x T) of the row at position pos
 * to layer l's window sums. */
void kvs_fx_sel_observe(kvs_fx_llama *E, int l, const uint64_t *p, int pos, size_t T);
/* The static step, once the prompt's last token is in. */
kvs_status kvs_fx_sel_compress(kvs_fx_llama *E, kvs_error *err);
/* Before a decode token's key is appended: seals full tails into clusters. */
kvs_status kvs_fx_sel_seal(kvs_fx_llama *E, int l, kvs_error *err);
/* A decode token's attention in layer l over the chosen slots (its key and value are slot
 * E->len): q (n_heads x d at frac) -> out (n_heads x d at 2 frac). */
kvs_status kvs_fx_sel_attend(kvs_fx_llama *E, int l, const uint64_t *q, uint64_t *out,
                             kvs_error *err);

#endif
