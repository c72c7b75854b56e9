/* The Llama-family forward pass over a batch of tokens (llama, qwen2, qwen3: model/llama.h). It
 * computes Q/K/V (with the architecture's biases and per-head norms), hands post-RoPE K/V to
 * the kv layer and asks it for attention; it never touches KV memory itself. */
#ifndef KVS_FORWARD_H
#define KVS_FORWARD_H

#include "core/threadpool.h"
#include "kv/kv.h"
#include "model/llama.h"

/* Activation buffers for batches of up to cap tokens. */
typedef struct kvs_forward_buf {
    int cap;
    int exact_matmul; /* 1: quantised weights times fp32 activations (kvs_matmul_ex) */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    int32_t *pos;
    float *rope_cs, *rope_sn; /* per row, the cos and sin of its position's RoPE pairs */
} kvs_forward_buf;

kvs_status kvs_forward_buf_init(kvs_forward_buf *b, const kvs_hparams *hp, int cap,
                                kvs_error *err);
void kvs_forward_buf_free(kvs_forward_buf *b);

/* Runs n <= b->cap tokens at positions pos0.. . logits (if non-NULL) receives n x vocab rows
 * when all_logits, else the last row only. Token ids must be < vocab (checked). */
kvs_status kvs_forward(const struct kvs_model *m, kvs_pool *pool, kvs_kv *kv,
                       kvs_forward_buf *b, const int32_t *tokens, int n, int pos0, float *logits,
                       int all_logits, kvs_error *err);

#endif
