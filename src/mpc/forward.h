/* The Llama forward pass on secret shares (a block of tokens per call, full KV cache): party 1 holds
 * the weights, party 0 the tokens, and both learn only what a step reveals (the logits to party
 * 0, or nothing but the next token). Every role runs the same calls; the dealer's hold only
 * shapes and its masks. Norm weights are folded into the matrices that follow them (party 1's
 * own weights), so RMSNorm is a reciprocal square root and a product. */
#ifndef KVS_MPC_FORWARD_H
#define KVS_MPC_FORWARD_H

#include "mpc/gates.h"
#include "mpc/gates_cache.h"
#include "model/llama.h"

/* The public shape of the model (all three roles know it). */
typedef struct kvs_mpc_shape {
    int dim, hidden, n_layers, n_heads, n_kv_heads, head_dim, rot_dim, vocab, neox;
    double eps, rope_base;
} kvs_mpc_shape;

typedef struct kvs_mpc_layer {
    kvs_mpc_weight qkv; /* dim x (dim + 2 kv_dim), attention norm folded in */
    kvs_mpc_weight wo;  /* dim x dim */
    kvs_mpc_weight w13; /* dim x 2 hidden: gate then up, ffn norm folded in */
    kvs_mpc_weight w2;  /* hidden x dim */
    kvs_mpc_cache k, v;
} kvs_mpc_layer;

typedef struct kvs_mpc_llama {
    kvs_mpc_shape s;
    kvs_mpc_weight emb; /* vocab x dim */
    kvs_mpc_weight out; /* dim x vocab, output norm folded in */
    kvs_mpc_layer *layers;
    int pos;            /* tokens processed */
    struct kvs_mpc_sel *sel; /* KV-cache selection (mpcache.h), NULL: the full cache */
} kvs_mpc_llama;

/* The shape of a loaded model. */
void kvs_mpc_shape_of(const struct kvs_model *model, kvs_mpc_shape *s);

/* Sets up the secret model: party 1 passes its model (its weights become fixed point and are
 * masked, party 0 receives the masked copies once); the others pass NULL and the shape. */
kvs_status kvs_mpc_llama_setup(kvs_mpc *m, const struct kvs_model *model,
                               const kvs_mpc_shape *s, kvs_mpc_llama *out, kvs_error *err);
void kvs_mpc_llama_free(kvs_mpc_llama *L);

/* A block of n >= 1 tokens at positions L->pos .. L->pos + n - 1 (party 0's tokens; the others
 * pass any pointer, it is not read), each attending causally to the cache and the block's
 * earlier tokens: every matrix product, truncation and non-linear gate takes the block's rows
 * in one batch, so the rounds are those of one token while the bytes are the sum of the
 * tokens'. The result equals n single steps bit for bit (tests/test_mpc_forward.c). logits:
 * shares of the last token's vocab logits in fixed point (parties; NULL for the dealer). */
kvs_status kvs_mpc_llama_forward(kvs_mpc *m, kvs_mpc_llama *L, const int32_t *tokens, int n,
                                 uint64_t *logits, kvs_error *err);

/* One token: kvs_mpc_llama_forward with n = 1. */
kvs_status kvs_mpc_llama_step(kvs_mpc *m, kvs_mpc_llama *L, int32_t token, uint64_t *logits,
                              kvs_error *err);

/* The prefill's block size at position pos with remaining prompt tokens left: the largest power
 * of two up to 64 (and up to remaining) whose score matrix, n x heads x (pos + n), stays within
 * 2^17 values. A function of public numbers only, so every role computes the same blocks. */
/* Softmax of rows of len scores (at frac), in place, where row r may only see its first
 * valid[r] entries (a block's causal mask; the rest come out 0): a masked entry is first a copy
 * of the row's entry 0, which leaves the max unchanged, and after the exponential a zero. With
 * masked, mask (rows x len shares of 0 or 1; the dealer passes NULL) is a secret mask,
 * multiplied in after the exponential (one more product);
 * the caller makes sure a masked entry cannot raise the max (MPCache's dummy slots hold copies
 * of real keys). tmp: rows x len words; row: 3 rows words. */
kvs_status kvs_mpc_softmax(kvs_mpc *m, uint64_t *sc, size_t rows, size_t len,
                          const size_t *valid, int masked, const uint64_t *mask,
                          uint64_t *tmp, uint64_t *row, kvs_error *err);

int kvs_mpc_llama_block(const kvs_mpc_shape *s, int pos, int remaining);

/* The RoPE angles' cosines and sines of n rows from position pos (rot: n x rot_dim / 2 x (cos,
 * sin)): the same for every layer. */
void kvs_mpc_rope_angles(const kvs_mpc_shape *s, int pos, size_t n, double *rot);

/* RoPE of one row's heads by its angles (rot: rot_dim / 2 x (cos, sin)), with an extra public
 * factor (1/sqrt(head_dim) for queries): the rotated pairs are public linear maps of the shares
 * (a truncation follows, by the caller). */
void kvs_mpc_rope_row(const kvs_mpc_shape *s, int frac, uint64_t *v, int heads, const double *rot,
                      double scale);

#endif
