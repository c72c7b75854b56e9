/* A Llama-architecture model: hyperparameters and weight views, loaded from a GGUF file. */
#ifndef KVS_LLAMA_H
#define KVS_LLAMA_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

typedef struct kvs_hparams {
    int dim;        /* embedding width */
    int hidden;     /* feed-forward width */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int rot_dim;    /* dims of each head that RoPE rotates */
    int vocab;
    int ctx;        /* trained context length */
    float eps;      /* RMSNorm epsilon */
    float rope_base;
    int rope_neox;  /* 0: adjacent pairs (llama); 1: NeoX halves */
} kvs_hparams;

/* A weight matrix of rows x cols elements (cols contiguous), as stored in the file. */
typedef struct kvs_weight {
    const void *data;
    kvs_dtype type;
    int rows;
    int cols;
} kvs_weight;

typedef struct kvs_layer {
    const float *attn_norm;
    kvs_weight wq, wk, wv, wo;
    const float *ffn_norm;
    kvs_weight w_gate, w_up, w_down;
} kvs_layer;

struct kvs_model {
    kvs_gguf *gguf;          /* owns the mapping the weights point into */
    char *path;
    kvs_hparams hp;
    kvs_weight tok_embd;     /* vocab rows of dim */
    const float *output_norm;
    kvs_weight output;       /* vocab rows of dim; the embedding when tied */
    kvs_layer *layers;
    float *norm_storage;     /* fp32 copies of norm vectors stored in another type */
    kvs_tokenizer *tokenizer;
    int64_t n_params;
};

/* Validates the llama metadata and every tensor's presence, type and shape; errors name the
 * key or tensor. Takes ownership of g on success and on failure. */
kvs_status kvs_llama_from_gguf(kvs_gguf *g, const char *path, struct kvs_model **out,
                               kvs_error *err);
void kvs_llama_free(struct kvs_model *m);
/* 1 if path looks like a llama2.c checkpoint: seven plausible int32 header fields (dim, hidden,
 * layers, heads, kv_heads, vocab (negative: unshared classifier), seq_len) and a file size that
 * matches them exactly. Used to turn "bad magic" into advice to convert. */
int kvs_llama2c_sniff(const char *path);

/* Dequantises row `row` of w into out (w->cols floats). */
void kvs_weight_row(const kvs_weight *w, int row, float *out);

#endif
