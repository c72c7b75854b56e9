/* The shared fixture of the unit tests on the reference model (tests/fixture.c, linked into
 * every unit test, which also writes the tokenizer keys of the tests' own small models):
 * stories260K and the golden token sample, a run helper that feeds the first FX_PROMPT tokens
 * as the prompt and decodes the following ones teacher-forced, and an observer that checks
 * the generic invariants of the policy's kind after every hook:
 *   - every head's positions increase, and none is a position not yet fed;
 *   - the exact live slots: evicting policies hold min(seen, budget) (budget - 1 after
 *     before_append, which makes room for the incoming token), one-shot policies min(seen,
 *     budget) at prefill_end, the others every token seen;
 *   - a selection policy's select returns valid increasing slots, at most its budget rounded up
 *     to its `page` (if declared), the newest slot included, none on its `dense_layers`;
 * and after every decode step the live slots of the kind (full and selection: every token,
 * one-shot: min(budget, prompt) + decoded, evicting: <= budget) and, for a selection policy, the
 * mean slots attended. It snapshots every head's kept positions after the prompt. */
#ifndef KVS_TEST_FIXTURE_H
#define KVS_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "kv/kv.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "kvslim.h"

enum { FX_N_TOK = 512, FX_PROMPT = 384, FX_MAX_L = 8, FX_MAX_H = 8, FX_MAX_HD = 64 };

/* Loads models/gguf/stories260K-f32.gguf and the first n (<= FX_N_TOK) tokens of
 * models/golden/stories260K-sample-512.tokens from KVS_SHARED_DIR. 0 on success; else -1 with
 * the reason in msg (and *model NULL). */
int fx_load(int32_t *tokens, int n, kvs_model **model, kvs_model_info *info, char *msg,
            size_t size);

typedef struct fx_obs fx_obs;
/* A test's own checks, called after the generic ones of every hook; newest is the newest
 * position stored in the layer. */
typedef void (*fx_extra)(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest);

struct fx_obs {
    int chunk, n_prompt;
    int decode_pos; /* position of the token being decoded; -1 during the prompt */
    int stored[FX_MAX_L];      /* tokens fed to each layer so far */
    int fed[FX_MAX_L];         /* a prompt token went through before_append (prompt_batch 1) */
    int chunks_done[FX_MAX_L]; /* prefill_chunk calls */
    long calls, violations;
    char first[256]; /* the first violation */
    /* slots per (layer, head) at the end of the prompt */
    int snap_n[FX_MAX_L][FX_MAX_H];
    int32_t snap_pos[FX_MAX_L][FX_MAX_H][FX_N_TOK];
    uint32_t rng;
    fx_extra extra;
};

/* Records a violation; the first is kept in o->first (fmt takes a and b). */
void fx_violation(fx_obs *o, const char *fmt, int layer, int h, const char *hook, int a, int b);

typedef struct fx_run {
    const char *spec; /* NULL: full */
    int threads;      /* 0: 1 */
    int chunk;        /* 0: the session's default */
    const char *kv_type;
    int decode;       /* tokens decoded after the prompt (at most FX_N_TOK - FX_PROMPT) */
    int rerun;        /* 1: a first, unobserved conversation of other tokens, longer, then
                         kvs_session_reset, then the run */
    fx_extra extra;
    /* results */
    kvs_status st;
    char err[512];
    float *logits; /* 1 + decode rows: after the prompt, then after each decoded token */
    fx_obs *o;     /* owned */
    size_t peak_bytes, end_bytes, slot_bytes; /* KV bytes: peak, after the last token */
    int budget; /* slots per (layer, KV head) the policy resolved */
    long loop_violations;
    char loop_first[256];
} fx_run;

/* Runs r on model with tokens, observed. */
void fx_exec(fx_run *r, const kvs_model *model, const int32_t *tokens);
void fx_run_free(fx_run *r);
/* Largest |difference| of the logits both runs hold (INFINITY if one has none; NaN counts). */
double fx_max_diff(const fx_run *a, const fx_run *b, int n_vocab);
/* Index of the largest of x[0, n) (the first on ties). */
int fx_argmax(const float *x, int n);
/* 1 if both runs kept the same positions in every (layer, head) at the end of the prompt. */
int fx_same_kept(const fx_run *a, const fx_run *b, const kvs_model_info *info);
/* 1 if the policy type declares a parameter of that name. */
int fx_has_param(const kvs_policy_type *t, const char *name);

/* Sets the tokenizer.ggml.* keys of a small llama vocabulary for the tests that write their own
 * GGUF model: n_tokens pieces <c0> <c1> <c2> (control) then p3, p4, ... (normal), scores 0,
 * BOS 1, EOS 2. KVS_OK, or the first setter's failure (KVS_ERR_NOMEM if out of memory). */
kvs_status fx_write_test_vocab(kvs_gguf_writer *w, int n_tokens);

#endif
