/* Request bodies to validated structs (server_request.h): every error names its field. */
#include "server/server_request.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kivi.h"

static int vfail(kvs_srv_error *e, int status, const char *type, const char *param,
                 const char *code, const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    return -1;
}

int kvs_srv_fail(kvs_srv_error *e, int status, const char *type, const char *param,
                 const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, status, type, param, code, fmt, ap);
    va_end(ap);
    return -1;
}

int kvs_srv_bad(kvs_srv_error *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, 400, "invalid_request_error", param, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

/* The library names the CLI flag ("--kv h2o:budget=2: ..."); a request names its field. */
static int library_error(kvs_srv_error *e, const char *param, const char *flag, const char *what,
                         const char *msg)
{
    size_t n = strlen(flag);
    if (!strncmp(msg, flag, n) && (msg[n] == ':' || msg[n] == ' '))
        return kvs_srv_bad(e, param, "%s%s", what, msg + n);
    return kvs_srv_bad(e, param, "%s: %s", what, msg);
}

int kvs_srv_bad_kv(kvs_srv_error *e, const char *msg)
{
    if (!strncmp(msg, "--kv-type", 9))
        return library_error(e, "kv_type", "--kv-type", "kv_type", msg);
    if (!strncmp(msg, "--kv", 4))
        return library_error(e, "kv", "--kv", "kv", msg);
    return kvs_srv_bad(e, NULL, "%s", msg);
}

int kvs_srv_kv_check(const char *what, const char *spec, kvs_srv_error *e)
{
    kvs_error err = {0};
    if (strlen(spec) > KVS_SRV_MAX_SPEC)
        return kvs_srv_bad(e, "kv", "%s: longer than %d bytes", what, KVS_SRV_MAX_SPEC);
    if (kvs_kv_policy_check(spec, &err) != KVS_OK)
        return library_error(e, "kv", "--kv", what, err.msg);
    return 0;
}

int kvs_srv_kv_type_check(const char *what, const char *type, kvs_srv_error *e)
{
    kvs_error err = {0};
    kvs_kivi_cfg kivi;
    if (strlen(type) > KVS_SRV_MAX_SPEC)
        return kvs_srv_bad(e, "kv_type", "%s: longer than %d bytes", what, KVS_SRV_MAX_SPEC);
    int is_kivi = kvs_kivi_parse(type, &kivi, &err);
    if (is_kivi < 0)
        return library_error(e, "kv_type", "--kv-type", what, err.msg);
    if (!is_kivi && strcmp(type, "f32") && strcmp(type, "f16"))
        return kvs_srv_bad(e, "kv_type", "%s: unknown type '%s' (accepted: f32, f16, kivi4, "
                           "kivi2 or kivi:kbits=B,vbits=B,group=G,residual=R)", what, type);
    return 0;
}

/* The body as a JSON object, or a 400. */
static cJSON *parse_object(const char *body, size_t len, pthread_mutex_t *lock, kvs_srv_error *e)
{
    if (!body || len == 0) {
        kvs_srv_bad(e, NULL, "the request body is empty: expected a JSON object");
        return NULL;
    }
    if (lock)
        pthread_mutex_lock(lock);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (lock)
        pthread_mutex_unlock(lock);
    /* cJSON stops after the value: anything but white space after it is malformed too. */
    while (root && end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' ||
                                        *end == '\r'))
        end++;
    if (root && end != body + len) {
        cJSON_Delete(root);
        root = NULL;
    }
    if (!root) {
        kvs_srv_bad(e, NULL, "malformed JSON in the request body");
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        kvs_srv_bad(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* A field, or NULL when it is absent or null. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* The optional numeric field name in [lo, hi] into *out (untouched when absent); integer: it
 * must be a whole number. */
static int get_number(const cJSON *obj, const char *name, int integer, double lo, double hi,
                      double *out, kvs_srv_error *e)
{
    const cJSON *f = field(obj, name);
    if (!f)
        return 0;
    const char *kind = integer ? "an integer" : "a number";
    if (!cJSON_IsNumber(f))
        return kvs_srv_bad(e, name, "%s must be %s", name, kind);
    double v = f->valuedouble;
    if (!isfinite(v) || (integer && v != floor(v)))
        return kvs_srv_bad(e, name, "%s must be %s, got %.17g", name, kind, v);
    if (v < lo || v > hi)
        return kvs_srv_bad(e, name, "%s must be in [%.17g, %.17g], got %.17g", name, lo, hi, v);
    *out = v;
    return 0;
}

static int get_bool(const cJSON *obj, const char *name, int *out, kvs_srv_error *e)
{
    const cJSON *f = field(obj, name);
    if (!f)
        return 0;
    if (!cJSON_IsBool(f))
        return kvs_srv_bad(e, name, "%s must be a boolean (true or false)", name);
    *out = cJSON_IsTrue(f);
    return 0;
}

static char *dup_or_fail(const char *s, const char *param, kvs_srv_error *e)
{
    char *d = strdup(s);
    if (!d)
        kvs_srv_fail(e, 500, "server_error", param, NULL, "out of memory");
    return d;
}

/* An optional string field into *out (owned); NULL when absent. */
static int get_string(const cJSON *obj, const char *name, char **out, kvs_srv_error *e)
{
    const cJSON *f = field(obj, name);
    if (!f)
        return 0;
    if (!cJSON_IsString(f))
        return kvs_srv_bad(e, name, "%s must be a string", name);
    return (*out = dup_or_fail(f->valuestring, name, e)) ? 0 : -1;
}

static int parse_prompt(const cJSON *root, kvs_srv_request *r, kvs_srv_error *e)
{
    const cJSON *p = field(root, "prompt");
    if (!p)
        return kvs_srv_bad(e, "prompt", "prompt is required (a string)");
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n != 1 || !cJSON_IsString(cJSON_GetArrayItem(p, 0)))
            return kvs_srv_bad(e, "prompt", "prompt must be a string or an array of one string "
                               "(got an array of %d item%s)", n, n == 1 ? " that is not a string" : "s");
        p = cJSON_GetArrayItem(p, 0);
    } else if (!cJSON_IsString(p)) {
        return kvs_srv_bad(e, "prompt", "prompt must be a string or an array of one string");
    }
    return (r->prompt = dup_or_fail(p->valuestring, "prompt", e)) ? 0 : -1;
}

/* content: a string, or OpenAI's array of parts of which the text parts are joined. */
static int message_content(const cJSON *c, const char *param, char **out, kvs_srv_error *e)
{
    if (cJSON_IsString(c))
        return (*out = dup_or_fail(c->valuestring, param, e)) ? 0 : -1;
    if (!cJSON_IsArray(c))
        return kvs_srv_bad(e, param, "%s must be a string", param);
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return kvs_srv_bad(e, param, "%s: only text parts ({\"type\":\"text\",\"text\":"
                               "...}) are supported", param);
        len += strlen(text->valuestring);
    }
    if (!(*out = malloc(len + 1)))
        return kvs_srv_fail(e, 500, "server_error", param, NULL, "out of memory");
    len = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        memcpy(*out + len, t, strlen(t));
        len += strlen(t);
    }
    (*out)[len] = 0;
    return 0;
}

static int parse_messages(const cJSON *root, kvs_srv_request *r, kvs_srv_error *e)
{
    const cJSON *m = field(root, "messages");
    if (!m)
        return kvs_srv_bad(e, "messages", "messages is required (an array of {\"role\", "
                           "\"content\"} objects)");
    if (!cJSON_IsArray(m))
        return kvs_srv_bad(e, "messages", "messages must be an array of {\"role\", \"content\"} "
                           "objects");
    int n = cJSON_GetArraySize(m);
    if (n == 0)
        return kvs_srv_bad(e, "messages", "messages must not be empty");
    if (!(r->messages = calloc((size_t)n, sizeof *r->messages)))
        return kvs_srv_fail(e, 500, "server_error", "messages", NULL, "out of memory");
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        char param[64];
        int i = r->n_messages;
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(msg))
            return kvs_srv_bad(e, param, "%s must be an object with role and content", param);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        const cJSON *content = field(msg, "content");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role))
            return kvs_srv_bad(e, param, "%s must be a string", param);
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant"))
            return kvs_srv_bad(e, param, "%s '%.64s' is not one of system, user, assistant",
                               param, role->valuestring);
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!content)
            return kvs_srv_bad(e, param, "%s is required (a string)", param);
        if (message_content(content, param, &r->messages[i].content, e) != 0)
            return -1;
        r->n_messages++;
        if (!(r->messages[i].role = dup_or_fail(role->valuestring, param, e)))
            return -1;
    }
    return 0;
}

static int parse_stop(const cJSON *root, kvs_srv_request *r, kvs_srv_error *e)
{
    const cJSON *s = field(root, "stop");
    if (!s)
        return 0;
    const char *what = "stop must be a string or an array of at most 4 strings";
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0])
            return kvs_srv_bad(e, "stop", "stop strings must not be empty");
        r->n_stop = 1;
        return (r->stop[0] = dup_or_fail(s->valuestring, "stop", e)) ? 0 : -1;
    }
    if (!cJSON_IsArray(s))
        return kvs_srv_bad(e, "stop", "%s", what);
    int n = cJSON_GetArraySize(s);
    if (n > KVS_SRV_MAX_STOP)
        return kvs_srv_bad(e, "stop", "%s (got %d)", what, n);
    const cJSON *item;
    cJSON_ArrayForEach(item, s) {
        if (!cJSON_IsString(item))
            return kvs_srv_bad(e, "stop", "%s: item %d is not a string", what, r->n_stop);
        if (!item->valuestring[0])
            return kvs_srv_bad(e, "stop", "stop strings must not be empty (item %d)", r->n_stop);
        if (!(r->stop[r->n_stop] = dup_or_fail(item->valuestring, "stop", e)))
            return -1;
        r->n_stop++;
    }
    return 0;
}

static int parse_sampling(const cJSON *root, kvs_srv_request *r, kvs_srv_error *e)
{
    double max_tokens = 16, temperature = 1, top_p = 1, top_k = 0, n = 1, seed = 0;
    /* OpenAI's newer name for the chat limit; max_tokens wins when both are given. */
    if (get_number(root, "max_completion_tokens", 1, -1e300, 1e300, &max_tokens, e) != 0 ||
        get_number(root, "max_tokens", 1, -1e300, 1e300, &max_tokens, e) != 0)
        return -1;
    if (max_tokens < 1 || max_tokens > KVS_SRV_MAX_TOKENS)
        return kvs_srv_bad(e, field(root, "max_tokens") ? "max_tokens" : "max_completion_tokens",
                           "max_tokens must be in [1, %d], got %.17g", KVS_SRV_MAX_TOKENS,
                           max_tokens);
    if (get_number(root, "temperature", 0, 0, 100, &temperature, e) != 0 ||
        get_number(root, "top_p", 0, 0, 1, &top_p, e) != 0 ||
        get_number(root, "top_k", 1, 0, 1 << 24, &top_k, e) != 0 ||
        get_number(root, "n", 1, -1e300, 1e300, &n, e) != 0)
        return -1;
    if (n != 1)
        return kvs_srv_bad(e, "n", "n must be 1: one choice per request (got %.17g)", n);
    /* Seeds are whole numbers a double holds exactly; negative ones wrap as in C. */
    if (get_number(root, "seed", 1, -9007199254740992.0, 9007199254740992.0, &seed, e) != 0)
        return -1;
    r->has_seed = field(root, "seed") != NULL;
    r->seed = (uint64_t)(int64_t)seed;
    r->max_tokens = (int)max_tokens;
    r->temperature = (float)temperature;
    r->top_p = (float)top_p;
    r->top_k = (int)top_k;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e) != 0)
        return -1;
    return get_bool(root, "stream", &r->stream, e);
}

int kvs_srv_request_parse(const char *body, size_t len, int chat, pthread_mutex_t *json_lock,
                          kvs_srv_request *out, kvs_srv_error *e)
{
    memset(out, 0, sizeof *out);
    out->chat = chat;
    cJSON *root = parse_object(body, len, json_lock, e);
    if (!root)
        return -1;
    int rc = chat ? parse_messages(root, out, e) : parse_prompt(root, out, e);
    if (rc == 0)
        rc = parse_sampling(root, out, e);
    if (rc == 0)
        rc = parse_stop(root, out, e);
    if (rc == 0)
        rc = get_string(root, "kv", &out->kv, e);
    if (rc == 0 && out->kv)
        rc = out->kv[0] ? kvs_srv_kv_check("kv", out->kv, e)
                        : kvs_srv_bad(e, "kv", "kv must not be empty (e.g. \"full\" or "
                                      "\"snapkv:budget=0.2\")");
    if (rc == 0)
        rc = get_string(root, "kv_type", &out->kv_type, e);
    if (rc == 0 && out->kv_type)
        rc = kvs_srv_kv_type_check("kv_type", out->kv_type, e);
    cJSON_Delete(root);
    if (rc != 0)
        kvs_srv_request_free(out);
    return rc;
}

void kvs_srv_request_free(kvs_srv_request *r)
{
    if (!r)
        return;
    free(r->prompt);
    for (int i = 0; i < r->n_messages; i++) {
        free(r->messages[i].role);
        free(r->messages[i].content);
    }
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->kv);
    free(r->kv_type);
    int chat = r->chat;
    memset(r, 0, sizeof *r);
    r->chat = chat;
}

int kvs_srv_tokenize_parse(const char *body, size_t len, pthread_mutex_t *json_lock,
                           char **content, int *add_special, kvs_srv_error *e)
{
    *content = NULL;
    *add_special = 1;
    cJSON *root = parse_object(body, len, json_lock, e);
    if (!root)
        return -1;
    int rc = get_string(root, "content", content, e);
    if (rc == 0 && !*content)
        rc = kvs_srv_bad(e, "content", "content is required (a string)");
    if (rc == 0)
        rc = get_bool(root, "add_special", add_special, e);
    cJSON_Delete(root);
    if (rc != 0) {
        free(*content);
        *content = NULL;
    }
    return rc;
}

int kvs_srv_detokenize_parse(const char *body, size_t len, pthread_mutex_t *json_lock,
                             int n_vocab, int32_t **tokens, int *n_tokens, kvs_srv_error *e)
{
    *tokens = NULL;
    *n_tokens = 0;
    cJSON *root = parse_object(body, len, json_lock, e);
    if (!root)
        return -1;
    const cJSON *t = field(root, "tokens");
    int rc = 0, n = t ? cJSON_GetArraySize(t) : 0;
    if (!t || !cJSON_IsArray(t))
        rc = kvs_srv_bad(e, "tokens", "tokens is required (an array of token ids)");
    else if (n > 0 && !(*tokens = malloc(sizeof **tokens * (size_t)n)))
        rc = kvs_srv_fail(e, 500, "server_error", "tokens", NULL, "out of memory");
    const cJSON *item;
    int i = 0;
    if (rc == 0)
        cJSON_ArrayForEach(item, t) {
            double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
            if (!cJSON_IsNumber(item) || v != floor(v) || v < 0 || v >= n_vocab) {
                rc = kvs_srv_bad(e, "tokens", "tokens[%d] must be a token id in [0, %d)", i,
                                 n_vocab);
                break;
            }
            (*tokens)[i++] = (int32_t)v;
        }
    cJSON_Delete(root);
    if (rc != 0) {
        free(*tokens);
        *tokens = NULL;
        return rc;
    }
    *n_tokens = n;
    return 0;
}
