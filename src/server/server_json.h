/* The JSON the server answers with: OpenAI's completion and chat shapes (whole and as SSE
 * chunks), errors, models, tokenize / detokenize. */
#ifndef KVS_SERVER_JSON_H
#define KVS_SERVER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "server/server_buf.h"
#include "server/server_request.h"

/* Everything but the text a completion response or chunk reports. */
typedef struct kvs_srv_result {
    const char *id;      /* "cmpl-..." / "chatcmpl-..." */
    long long created;   /* unix seconds */
    const char *model;
    int chat;
    const char *finish;  /* "stop" / "length"; NULL for a chunk before the last */
    int prompt_tokens, completion_tokens;
    size_t kv_bytes, kv_bytes_full_f16;
    const char *kv, *kv_type;
    double prompt_ms, decode_ms, tok_per_s;
} kvs_srv_result;

/* Each appends to out and returns 0, or -1 when out of memory. text is valid UTF-8 without NUL
 * bytes (server_stop.h makes it so). */
int kvs_srv_json_error(kvs_srv_buf *out, const kvs_srv_error *e);
/* The whole response of a request that did not stream. */
int kvs_srv_json_completion(kvs_srv_buf *out, const kvs_srv_result *r, const char *text);
/* One SSE event "data: {...}\n\n": a piece of text (r->finish NULL), or the last chunk (empty
 * text or delta, the finish reason, usage, kv, kv_type, timings). role: the chat stream's first
 * chunk, whose delta is {"role":"assistant"}. */
int kvs_srv_json_chunk(kvs_srv_buf *out, const kvs_srv_result *r, const char *text, int role);
/* An error inside a stream that has already answered 200: "data: {"error":{...}}\n\n". */
int kvs_srv_json_stream_error(kvs_srv_buf *out, const kvs_srv_error *e);
int kvs_srv_json_models(kvs_srv_buf *out, const char *id, long long created);
int kvs_srv_json_tokens(kvs_srv_buf *out, const int32_t *ids, int n);
int kvs_srv_json_content(kvs_srv_buf *out, const char *text);
int kvs_srv_json_status(kvs_srv_buf *out, const char *status);

#endif
