/* Response bodies (server_json.h), built with cJSON. */
#include "server/server_json.h"

#include <cJSON.h>
#include <math.h>
#include <string.h>

#include "server/server_stop.h"

/* Prints root onto out (and frees it); -1 if anything failed on the way, root NULL included. */
static int emit(kvs_srv_buf *out, cJSON *root, const char *prefix, const char *suffix)
{
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return -1;
    int rc = kvs_srv_buf_puts(out, prefix) | kvs_srv_buf_puts(out, s) |
             kvs_srv_buf_puts(out, suffix);
    cJSON_free(s);
    return rc ? -1 : 0;
}

/* A new object appended to array; NULL, with nothing leaked, when out of memory (cJSON's adds
 * to a NULL object are no-ops, so a builder goes on and prints what it could build). */
static cJSON *new_item(cJSON *array)
{
    cJSON *item = cJSON_CreateObject();
    if (item && !cJSON_AddItemToArray(array, item)) {
        cJSON_Delete(item);
        return NULL;
    }
    return item;
}

/* Milliseconds and rates to 3 decimals: enough, and short. */
static double r3(double v) { return isfinite(v) ? round(v * 1e3) / 1e3 : 0.0; }

static cJSON *error_object(const kvs_srv_error *e)
{
    /* A message may quote the request (a role, a kv spec) or be cut by its buffer's size, so
     * it may hold bytes that are not UTF-8, or half a character: JSON must be UTF-8, so those
     * become U+FFFD as in generated text (found by fuzz/fuzz_server_request.c). */
    kvs_srv_buf msg = {0};
    if (kvs_srv_utf8_append(&msg, e->message, strlen(e->message)) != 0) {
        kvs_srv_buf_free(&msg);
        return NULL;
    }
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg.data ? msg.data : "");
    kvs_srv_buf_free(&msg);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code[0])
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return err ? root : (cJSON_Delete(root), NULL);
}

int kvs_srv_json_error(kvs_srv_buf *out, const kvs_srv_error *e)
{
    return emit(out, error_object(e), "", "");
}

int kvs_srv_json_stream_error(kvs_srv_buf *out, const kvs_srv_error *e)
{
    return emit(out, error_object(e), "data: ", "\n\n");
}

/* id, object, created, model: the head of every completion object. */
static cJSON *head(const kvs_srv_result *r, const char *object)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)r->created);
    cJSON_AddStringToObject(root, "model", r->model);
    return root;
}

/* usage, kv, kv_type and timings: what the end of a request reports. */
static void tail(cJSON *root, const kvs_srv_result *r)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", r->prompt_tokens + r->completion_tokens);
    cJSON_AddNumberToObject(u, "kv_bytes", (double)r->kv_bytes);
    cJSON_AddNumberToObject(u, "kv_bytes_full_f16", (double)r->kv_bytes_full_f16);
    cJSON_AddStringToObject(root, "kv", r->kv);
    cJSON_AddStringToObject(root, "kv_type", r->kv_type);
    cJSON *t = cJSON_AddObjectToObject(root, "timings");
    cJSON_AddNumberToObject(t, "prompt_ms", r3(r->prompt_ms));
    cJSON_AddNumberToObject(t, "decode_ms", r3(r->decode_ms));
    cJSON_AddNumberToObject(t, "decode_tok_per_s", r3(r->tok_per_s));
}

static void add_finish(cJSON *choice, const char *finish)
{
    if (finish)
        cJSON_AddStringToObject(choice, "finish_reason", finish);
    else
        cJSON_AddNullToObject(choice, "finish_reason");
}

int kvs_srv_json_completion(kvs_srv_buf *out, const kvs_srv_result *r, const char *text)
{
    cJSON *root = head(r, r->chat ? "chat.completion" : "text_completion");
    cJSON *choice = new_item(cJSON_AddArrayToObject(root, "choices"));
    if (r->chat) {
        cJSON_AddNumberToObject(choice, "index", 0);
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text);
        cJSON_AddNumberToObject(choice, "index", 0);
        cJSON_AddNullToObject(choice, "logprobs");
    }
    add_finish(choice, r->finish);
    tail(root, r);
    return emit(out, root, "", "");
}

int kvs_srv_json_chunk(kvs_srv_buf *out, const kvs_srv_result *r, const char *text, int role)
{
    cJSON *root = head(r, r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choice = new_item(cJSON_AddArrayToObject(root, "choices"));
    if (r->chat) {
        cJSON_AddNumberToObject(choice, "index", 0);
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (role)
            cJSON_AddStringToObject(delta, "role", "assistant");
        else if (text && text[0])
            cJSON_AddStringToObject(delta, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text ? text : "");
        cJSON_AddNumberToObject(choice, "index", 0);
        cJSON_AddNullToObject(choice, "logprobs");
    }
    add_finish(choice, r->finish);
    if (r->finish)
        tail(root, r);
    return emit(out, root, "data: ", "\n\n");
}

int kvs_srv_json_models(kvs_srv_buf *out, const char *id, long long created)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *m = new_item(cJSON_AddArrayToObject(root, "data"));
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "kvslim");
    return emit(out, root, "", "");
}

int kvs_srv_json_tokens(kvs_srv_buf *out, const int32_t *ids, int n)
{
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tokens");
    for (int i = 0; i < n && arr; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    return emit(out, root, "", "");
}

int kvs_srv_json_content(kvs_srv_buf *out, const char *text)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "content", text);
    return emit(out, root, "", "");
}

int kvs_srv_json_status(kvs_srv_buf *out, const char *status)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", status);
    return emit(out, root, "", "");
}
