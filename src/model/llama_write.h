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

/* Writes src as a GGUF with matrices of type `type` (norms stay F32) to out (see
 * core/outfile.h). A matrix whose row length is not a whole number of blocks of `type` is
 * stored as F16 and a note is printed to log (if non-NULL). The vocabulary comes from tok, or,
 * when tok is NULL, a synthetic one is written (<unk>, <s>, </s>, byte tokens, then "tokN"
 * pieces). */
kvs_status kvs_llama_write_gguf(const kvs_llama_src *src, const kvs_tokenizer *tok,
                                kvs_dtype type, const kvs_outfile_spec *out, FILE *log,
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
kvs_status kvs_llama2c_convert_to(const char *model_path, const char *tok_path, kvs_dtype type,
                                  const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, with the layers listed in dup duplicated (kvs_llama_duplicate_layers; none when
 * n_dup is 0). */
kvs_status kvs_llama2c_convert_dup_to(const char *model_path, const char *tok_path,
                                      kvs_dtype type, const int *dup, int n_dup,
                                      const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, writing to out_path. */
kvs_status kvs_llama2c_convert(const char *model_path, const char *tok_path, kvs_dtype type,
                               const char *out_path, FILE *log, kvs_error *err);

/* Writes a random-weight llama model of shape hp (weights N(0, 0.02), norms 1.0, fixed seed)
 * to out; the output is checked before the weights are generated. */
kvs_status kvs_synthetic_write_to(const kvs_hparams *hp, kvs_dtype type, uint64_t seed,
                                  const kvs_outfile_spec *out, FILE *log, kvs_error *err);
/* The same, writing to path. */
kvs_status kvs_synthetic_write(const kvs_hparams *hp, kvs_dtype type, uint64_t seed,
                               const char *path, FILE *log, kvs_error *err);

#endif
