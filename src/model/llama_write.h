/* Writing llama-architecture GGUF files (llama.cpp's key and tensor names) from fp32 weights,
 * and the two sources of such weights: llama2.c checkpoints and synthetic random models. */
#ifndef KVS_LLAMA_WRITE_H
#define KVS_LLAMA_WRITE_H

#include <stdint.h>
#include <stdio.h>

#include "core/outfile.h"
#include "model/llama.h"

typedef struct kvs_llama_src_layer {
    const float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
} kvs_llama_src_layer;

/* fp32 weights, row-major [out][in], as llama2.c stores them. */
typedef struct kvs_llama_src {
    kvs_hparams hp;
    const char *name;
    const float *tok_embd;    /* vocab x dim */
    const float *output_norm; /* dim */
    const float *output;      /* vocab x dim, or NULL when tied to tok_embd */
    const kvs_llama_src_layer *layers;
} kvs_llama_src;

/* The weight types of a file to write: one type for every matrix, or one of llama.cpp's
 * K-quant mixes built on a base type (which matrix gets which type: llama_write.c). */
typedef struct kvs_wtype {
    kvs_dtype type; /* every matrix's type; with mix_m, the type of the matrices not bumped */
    int mix_m;      /* 1: llama.cpp's _M mix (Q4_K_M with Q4_K, Q5_K_M with Q5_K) */
} kvs_wtype;

/* Every matrix of type t. */
#define KVS_WTYPE(t) ((kvs_wtype){(t), 0})
/* The names kvs_wtype_parse accepts, for messages and --help. */
#define KVS_WTYPE_NAMES "f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m"

/* Parses one of KVS_WTYPE_NAMES (case-insensitive). Returns 0 on success, -1 otherwise. */
int kvs_wtype_parse(const char *name, kvs_wtype *out);
/* The name kvs_wtype_parse takes for w ("q4_k_m", "q8_0", ...). */
const char *kvs_wtype_name(kvs_wtype w);

/* Writes src as a GGUF with its matrices in the types wt gives (norms stay F32) to out (see
 * core/outfile.h). A matrix whose row length is not a whole number of blocks of its type is
 * stored as Q8_0 instead of a K-quant (F16 if its rows are not whole 32-element blocks either)
 * and a note naming it is printed to log (if non-NULL). The vocabulary comes from tok, or,
 * when tok is NULL, a synthetic one is written (<unk>, <s>, </s>, byte tokens, then "tokN"
 * pieces). */
kvs_status kvs_llama_write_gguf(const kvs_llama_src *src, const kvs_tokenizer *tok,
                                kvs_wtype wt, const kvs_outfile_spec *out, FILE *log,
                                kvs_error *err);

/* Depth up-scaling (SOLAR-style): out describes src with each layer listed in dup (n_dup
 * indices, strictly increasing, each in [0, n_layers)) appearing twice in a row, e.g. dup
 * {1,2,3} of 5 layers gives layers 0,1,1,2,2,3,3,4. The duplicates point at the same weights,
 * so they are written byte-identical. *layers (malloc'd, caller frees) backs out->layers.
 * Errors say which entry of the list is wrong. */
kvs_status kvs_llama_duplicate_layers(const kvs_llama_src *src, const int *dup, int n_dup,
                                      kvs_llama_src *out, kvs_llama_src_layer **layers,
                                      kvs_error *err);

/* Converts a llama2.c checkpoint and tokenizer file into a GGUF (see kvs_llama_write_gguf).
 * The output is checked before the checkpoint is read, and is never one of the two inputs
 * (whether or not out->inputs lists them). */
kvs_status kvs_llama2c_convert_to(const char *model_path, const char *tok_path, kvs_wtype wt,
                                  const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, with the layers listed in dup duplicated (kvs_llama_duplicate_layers; none when
 * n_dup is 0). */
kvs_status kvs_llama2c_convert_dup_to(const char *model_path, const char *tok_path,
                                      kvs_wtype wt, const int *dup, int n_dup,
                                      const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, writing to out_path. */
kvs_status kvs_llama2c_convert(const char *model_path, const char *tok_path, kvs_wtype wt,
                               const char *out_path, FILE *log, kvs_error *err);

/* Writes a random-weight llama model of shape hp (weights N(0, 0.02), norms 1.0, fixed seed)
 * to out; the output is checked before the weights are generated. */
kvs_status kvs_synthetic_write_to(const kvs_hparams *hp, kvs_wtype wt, uint64_t seed,
                                  const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, writing to path. */
kvs_status kvs_synthetic_write(const kvs_hparams *hp, kvs_wtype wt, uint64_t seed,
                               const char *path, FILE *log, kvs_error *err);

#endif
