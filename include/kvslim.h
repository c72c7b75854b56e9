/* kvslim: a C11 LLM inference engine built around the KV cache.
 *
 * Public API: opaque handles, status codes, no global state. Every function that can fail
 * returns a kvs_status; kvs_last_error() on the handle (or the error buffer passed in) tells why. */
#ifndef KVSLIM_H
#define KVSLIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_status {
    KVS_OK = 0,
    KVS_ERR_IO = 1,          /* a file could not be opened, read, mapped or written */
    KVS_ERR_FORMAT = 2,      /* a file is malformed: truncated, bad header, inconsistent sizes */
    KVS_ERR_UNSUPPORTED = 3, /* well-formed but not supported (architecture, tensor type) */
    KVS_ERR_ARG = 4,         /* a bad argument: out-of-range token, unknown option */
    KVS_ERR_NOMEM = 5,       /* an allocation failed */
} kvs_status;

const char *kvs_status_name(kvs_status s);

/* Filled by every fallible call: the status and a message naming the file, key, tensor or
 * argument at fault. */
typedef struct kvs_error {
    kvs_status code;
    char msg[512];
} kvs_error;

/* ---- models ---- */
typedef struct kvs_model kvs_model;

typedef struct kvs_model_info {
    int n_vocab, n_ctx, dim, hidden, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t n_params;
    const char *weight_type; /* type of the attention query weights, e.g. "q8_0" */
    size_t weight_bytes;     /* bytes of every weight tensor as stored */
} kvs_model_info;

/* Maps and validates a llama-architecture GGUF file. */
kvs_status kvs_model_load(const char *path, kvs_model **out, kvs_error *err);
void kvs_model_free(kvs_model *m);
void kvs_model_get_info(const kvs_model *m, kvs_model_info *info);

/* ---- tokens ---- */
int kvs_token_bos(const kvs_model *m);
int kvs_token_eos(const kvs_model *m);
/* Encodes text; *ids is malloc'd and owned by the caller (free()). */
kvs_status kvs_tokenize(const kvs_model *m, const char *text, int add_bos, int32_t **ids,
                        int *n_ids, kvs_error *err);
/* Printable bytes of token id following token prev; *len is set (may contain a NUL byte). */
const char *kvs_token_text(const kvs_model *m, int prev, int id, int *len);

/* ---- sessions: one sequence's KV cache and forward-pass state ---- */
typedef struct kvs_session kvs_session;

typedef struct kvs_session_params {
    int n_threads;         /* >= 1 */
    int n_ctx;             /* 0 = the model's trained context */
    int chunk;             /* prompt tokens per forward batch; 0 = 512 */
    const char *kv_policy; /* "NAME[:key=value,...]" (see kvs_kv_policy_help); NULL = full */
    const char *kv_type;   /* KV storage: "f32" (NULL, the default) or "f16" */
    int measure_recall;    /* keep a shadow of every key to measure attention recall */
    /* Position shifting (llama.cpp's context shift for post-RoPE keys): with an evicting
     * policy, when the next position would reach n_ctx, every kept key is rotated back by a
     * common offset so positions stay inside the trained window. Also a policy option
     * (shift=on). 0 = off. */
    int context_shift;
    /* Notices (a clamped budget, a context past the trained one, ...): one line each, no
     * trailing newline. NULL: no notices. */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
} kvs_session_params;

/* Lists the KV policies and their parameters. */
void kvs_kv_policy_help(FILE *f);
/* Checks a policy spec without a model; errors list what is accepted. */
kvs_status kvs_kv_policy_check(const char *spec, kvs_error *err);

kvs_session_params kvs_session_default_params(void);
kvs_status kvs_session_new(const kvs_model *m, const kvs_session_params *p, kvs_session **out,
                           kvs_error *err);
void kvs_session_free(kvs_session *s);
/* Forgets every token (keeps allocations). */
void kvs_session_reset(kvs_session *s);
/* Feeds n tokens at the next positions. The first call after creation or reset is the prompt:
 * it is processed in batches of the chunk size (smaller where the KV policy asks, e.g. HashEvict's
 * paper prefill feeds the prompt beyond its budget one token at a time) and the KV policy
 * compresses it by its rule;
 * later calls are decode steps, one token at a time. If logits is non-NULL it receives
 * n x n_vocab floats when all_logits, else the n_vocab logits of the last token. */
kvs_status kvs_session_eval(kvs_session *s, const int32_t *tokens, int n, float *logits,
                            int all_logits, kvs_error *err);
int kvs_session_n_past(const kvs_session *s);
/* Tokens kvs_session_eval still takes before the context is full: n_ctx - n_past, or (an
 * evicting KV policy, whose cache stays bounded: past the context its positions are shifted
 * back with context_shift, else they go past the trained window with a notice) INT32_MAX -
 * n_past. */
int kvs_session_ctx_left(const kvs_session *s);
/* Bytes held by the KV cache now, and bytes a full F16 cache of the same tokens would hold. */
size_t kvs_session_kv_bytes(const kvs_session *s);
size_t kvs_session_kv_bytes_full_f16(const kvs_session *s);
/* Largest KV bytes held at any point since the last reset. */
size_t kvs_session_kv_peak_bytes(const kvs_session *s);

typedef struct kvs_step_stats {
    double slots_attended; /* mean per layer and query head, last decode step */
    double attn_recall;    /* share of full-cache attention mass on attended slots (needs
                              measure_recall; else 1) */
} kvs_step_stats;
void kvs_session_last_step(const kvs_session *s, kvs_step_stats *st);

#ifdef __cplusplus
}
#endif
#endif
