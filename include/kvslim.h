/* kvslim: a C11 LLM inference engine built around the KV cache.
 *
 * Public API: opaque handles, status codes, no global state. Every function that can fail
 * returns a kvs_status; kvs_last_error() on the handle (or the error buffer passed in) tells why. */
#ifndef KVSLIM_H
#define KVSLIM_H

#include <stddef.h>
#include <stdint.h>

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
    int n_threads; /* >= 1 */
    int n_ctx;     /* 0 = the model's trained context */
    int chunk;     /* prompt tokens per forward batch; 0 = 512 */
} kvs_session_params;

kvs_session_params kvs_session_default_params(void);
kvs_status kvs_session_new(const kvs_model *m, const kvs_session_params *p, kvs_session **out,
                           kvs_error *err);
void kvs_session_free(kvs_session *s);
/* Forgets every token (keeps allocations). */
void kvs_session_reset(kvs_session *s);
/* Feeds n tokens at the next positions, in batches of the chunk size. If logits is non-NULL it
 * receives n x n_vocab floats when all_logits, else the n_vocab logits of the last token. */
kvs_status kvs_session_eval(kvs_session *s, const int32_t *tokens, int n, float *logits,
                            int all_logits, kvs_error *err);
int kvs_session_n_past(const kvs_session *s);
/* Bytes held by the KV cache now, and bytes a full F16 cache of the same tokens would hold. */
size_t kvs_session_kv_bytes(const kvs_session *s);
size_t kvs_session_kv_bytes_full_f16(const kvs_session *s);

#ifdef __cplusplus
}
#endif
#endif
