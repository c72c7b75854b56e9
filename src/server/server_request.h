/* Request bodies (JSON) to validated structs, and the errors the server answers with. No HTTP
 * here: a body and its length in, a request or an OpenAI-shaped error out (fuzzable). */
#ifndef KVS_SERVER_REQUEST_H
#define KVS_SERVER_REQUEST_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}} and a status. */
typedef struct kvs_srv_error {
    int status;       /* HTTP status: 400, 401, 404, 405, 413, 500, 503 */
    const char *type; /* "invalid_request_error", "authentication_error", "server_error",
                         "overloaded_error" */
    char param[64];   /* the field at fault; "" is JSON null */
    char code[48];    /* a machine-readable reason ("context_length_exceeded"); "" is null */
    char message[640];
} kvs_srv_error;

/* Fills e and returns -1, so a validator can `return kvs_srv_fail(...)`. param and code may be
 * NULL. */
int kvs_srv_fail(kvs_srv_error *e, int status, const char *type, const char *param,
                 const char *code, const char *fmt, ...) KVS_PRINTF(6, 7);
/* A 400 invalid_request_error naming param. */
int kvs_srv_bad(kvs_srv_error *e, const char *param, const char *fmt, ...) KVS_PRINTF(3, 4);

#define KVS_SRV_MAX_STOP 4        /* OpenAI's limit on stop strings */
#define KVS_SRV_MAX_TOKENS (1 << 24)
#define KVS_SRV_MAX_SPEC 256      /* longest kv / kv_type accepted (they label metrics) */

typedef struct kvs_srv_message {
    char *role;    /* "system", "user" or "assistant" */
    char *content;
} kvs_srv_message;

/* A completion or chat completion request; strings are owned (kvs_srv_request_free). */
typedef struct kvs_srv_request {
    int chat;
    char *prompt;                 /* completions */
    kvs_srv_message *messages;    /* chat */
    int n_messages;
    int max_tokens;               /* >= 1; default 16 */
    float temperature;            /* default 1 */
    float top_p;                  /* default 1 */
    int top_k;                    /* default 0: off */
    int has_seed;
    uint64_t seed;
    char *stop[KVS_SRV_MAX_STOP]; /* non-empty strings */
    int n_stop;
    int stream;
    int ignore_eos;               /* kvslim extra (llama-server's name): generate max_tokens */
    char *kv, *kv_type;           /* NULL: the server's defaults; checked when given */
} kvs_srv_request;

/* Parses and validates a /v1/completions (chat 0) or /v1/chat/completions (chat 1) body.
 * Unknown fields are ignored, a null field counts as absent. json_lock (may be NULL)
 * serialises the JSON parse: cJSON records every parse's error position in a global.
 * Returns 0, or -1 with e set (400, naming the field); *out is then empty. */
int kvs_srv_request_parse(const char *body, size_t len, int chat, pthread_mutex_t *json_lock,
                          kvs_srv_request *out, kvs_srv_error *e);
void kvs_srv_request_free(kvs_srv_request *r);

/* /tokenize: {"content": string, "add_special": bool (default true)}; *content owned. */
int kvs_srv_tokenize_parse(const char *body, size_t len, pthread_mutex_t *json_lock,
                           char **content, int *add_special, kvs_srv_error *e);
/* /detokenize: {"tokens": [ids in [0, n_vocab)]}; *tokens malloc'd (NULL when empty). */
int kvs_srv_detokenize_parse(const char *body, size_t len, pthread_mutex_t *json_lock,
                             int n_vocab, int32_t **tokens, int *n_tokens, kvs_srv_error *e);

/* Checks a KV policy spec / KV storage type as a request or the server's defaults give them;
 * messages list what is accepted and start with what (e.g. "kv" or "--kv"). */
int kvs_srv_kv_check(const char *what, const char *spec, kvs_srv_error *e);
int kvs_srv_kv_type_check(const char *what, const char *type, kvs_srv_error *e);
/* A library error about a request's KV settings (a message naming --kv or --kv-type, as the
 * CLI sees it) as a 400 naming the request field (kv, kv_type; else no field). */
int kvs_srv_bad_kv(kvs_srv_error *e, const char *library_msg);

#endif
