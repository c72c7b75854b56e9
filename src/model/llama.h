/* A Llama-family model: hyperparameters and weight views, loaded from a GGUF file whose
 * general.architecture is llama (Llama 1-3, Mistral), qwen2 or qwen3. All three share the
 * Llama block (RMSNorm, RoPE, GQA attention, SwiGLU); what differs is optional per block:
 * Q/K/V biases (qwen2), per-head Q/K RMSNorm (qwen3), the RoPE pairing (NORM: adjacent pairs,
 * llama; NEOX: halves, qwen2/qwen3), per-pair RoPE frequency divisors (Llama-3's
 * rope_freqs.weight, linear rope scaling) and a head width that need not be dim / n_heads. */
#ifndef KVS_LLAMA_H
#define KVS_LLAMA_H

#include <stddef.h>
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
    int head_dim;   /* attention.key_length, else dim / n_heads; Q is n_heads * head_dim wide */
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
    const float *bq, *bk, *bv;     /* Q/K/V biases (n_heads / n_kv_heads * head_dim), or NULL */
    const float *q_norm, *k_norm;  /* per-head Q/K RMSNorm weights (head_dim), or NULL */
    const float *ffn_norm;
    kvs_weight w_gate, w_up, w_down;
    /* wq|wk|wv and w_gate|w_up as single matrices (rows stacked), when resident.c could place
     * them back to back (same type and width); .data NULL otherwise. One product instead of
     * three (two) shares the quantised input and the threads' start-up. */
    kvs_weight wqkv, w_gate_up;
} kvs_layer;

struct kvs_model {
    kvs_gguf *gguf;          /* owns the mapping the weights point into */
    char *path;
    const char *arch;        /* general.architecture: "llama", "qwen2" or "qwen3" */
    kvs_hparams hp;
    /* RoPE pair i of every head turns by pos * rope_base^(-2i/rot_dim) / rope_div[i]
     * (rot_dim / 2 divisors: Llama-3's rope_freqs.weight times a linear scaling factor), or
     * by pos * rope_base^(-2i/rot_dim) when NULL. */
    float *rope_div;
    kvs_weight tok_embd;     /* vocab rows of dim */
    const float *output_norm;
    kvs_weight output;       /* vocab rows of dim; the embedding when tied */
    kvs_layer *layers;
    float *norm_storage;     /* fp32 copies of norm vectors stored in another type */
    kvs_tokenizer *tokenizer;
    int64_t n_params;
    void *resident;          /* the streamed matrices, moved out of the mapping (resident.c) */
};

/* Validates the metadata and every tensor's presence, type and shape; errors name the
 * key or tensor. Takes ownership of g on success and on failure. */
kvs_status kvs_llama_from_gguf(kvs_gguf *g, const char *path, struct kvs_model **out,
                               kvs_error *err);
void kvs_llama_free(struct kvs_model *m);
/* Moves the matrices decode streams into an owned, 64-byte-aligned buffer on huge pages and
 * points the weights at it (resident.c); leaves them in the mapping if it cannot. */
void kvs_llama_make_resident(struct kvs_model *m);
/* What m computes beyond the plain Llama block of llama2.c (queries n_embd wide, no biases, no
 * Q/K norms, unscaled RoPE): a comma-separated description into buf (size > 0), "" if nothing.
 * Returns the number of such features. */
int kvs_llama_extras(const struct kvs_model *m, char *buf, size_t size);
/* KVS_OK if m is a plain Llama block (kvs_llama_extras finds nothing); else
 * KVS_ERR_UNSUPPORTED with a message saying that `engine` does not implement the features
 * found, naming the file and its architecture. For engines that implement only that block. */
kvs_status kvs_llama_check_plain(const struct kvs_model *m, const char *engine, kvs_error *err);
/* 1 if path looks like a llama2.c checkpoint: seven plausible int32 header fields (dim, hidden,
 * layers, heads, kv_heads, vocab (negative: unshared classifier), seq_len) and a file size that
 * matches them exactly. Used to turn "bad magic" into advice to convert. */
int kvs_llama2c_sniff(const char *path);

/* Dequantises row `row` of w into out (w->cols floats). */
void kvs_weight_row(const kvs_weight *w, int row, float *out);

#endif
