/* Fuzzes the server's request parsers on arbitrary bodies: kvs_srv_request_parse for
 * /v1/completions (chat 0) and /v1/chat/completions (chat 1), kvs_srv_tokenize_parse and
 * kvs_srv_detokenize_parse (src/server/server_request.c, with cJSON under them), and the error
 * each refusal is answered with (kvs_srv_json_error). Refusals are expected. A bug is a crash,
 * a leak, a hang; an accepted request that breaks what server_request.h promises (a prompt or
 * messages present, max_tokens in range, at most 4 non-empty stop strings, token ids in range);
 * or an error response that is not valid UTF-8 JSON (a message that quotes the request must not
 * cut a character in two). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "server/server_json.h"
#include "server/server_request.h"

#define N_VOCAB 512

static pthread_mutex_t g_json_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_server_request: %s: %s\n", what, detail);
    abort();
}

/* Whether s (len bytes) is well-formed UTF-8: no stray continuation byte, no truncated or
 * overlong sequence, no surrogate, nothing above U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (len - i <= n)
            return 0;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += n + 1;
    }
    return 1;
}

/* The refusal as the server sends it: a JSON object, valid UTF-8, with a 4xx/5xx status. */
static void check_error(const kvs_srv_error *e)
{
    if (e->status < 400 || e->status > 599 || !e->type)
        fail("refusal without a status or type", e->message);
    kvs_srv_buf out = {0};
    if (kvs_srv_json_error(&out, e) == 0) {
        if (!utf8_valid((const unsigned char *)out.data, out.len))
            fail("error response is not valid UTF-8", out.data);
        cJSON *j = cJSON_ParseWithLength(out.data, out.len);
        if (!cJSON_IsObject(j))
            fail("error response is not a JSON object", out.data);
        cJSON_Delete(j);
    }
    kvs_srv_buf_free(&out);
}

static void check_request(const kvs_srv_request *r)
{
    if (r->chat) {
        if (r->n_messages < 1 || !r->messages)
            fail("chat request", "no messages");
        for (int i = 0; i < r->n_messages; i++)
            if (!r->messages[i].role || !r->messages[i].content ||
                (strcmp(r->messages[i].role, "system") && strcmp(r->messages[i].role, "user") &&
                 strcmp(r->messages[i].role, "assistant")))
                fail("chat request", "a message without a valid role or content");
    } else if (!r->prompt) {
        fail("completion request", "no prompt");
    }
    if (r->max_tokens < 1 || r->max_tokens > KVS_SRV_MAX_TOKENS)
        fail("request", "max_tokens out of range");
    if (r->n_stop < 0 || r->n_stop > KVS_SRV_MAX_STOP)
        fail("request", "too many stop strings");
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0])
            fail("request", "an empty stop string");
    if (!(r->temperature >= 0 && r->temperature <= 100) || !(r->top_p >= 0 && r->top_p <= 1) ||
        r->top_k < 0)
        fail("request", "a sampling parameter out of range");
    if ((r->kv && strlen(r->kv) > KVS_SRV_MAX_SPEC) ||
        (r->kv_type && strlen(r->kv_type) > KVS_SRV_MAX_SPEC))
        fail("request", "kv or kv_type over KVS_SRV_MAX_SPEC");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The body is not NUL-terminated (the server hands over the bytes it got, with their
     * length), so ASan sees any read past its end. */
    const char *body = (const char *)data;
    kvs_srv_error e;
    for (int chat = 0; chat <= 1; chat++) {
        kvs_srv_request r;
        memset(&e, 0, sizeof e);
        /* With and without the lock, as the server and the tests call it. */
        if (kvs_srv_request_parse(body, size, chat, chat ? &g_json_lock : NULL, &r, &e) == 0) {
            check_request(&r);
            kvs_srv_request_free(&r);
        } else {
            if (r.prompt || r.messages || r.n_stop || r.kv || r.kv_type)
                fail("refused request", "not left empty");
            check_error(&e);
        }
    }
    char *content = NULL;
    int add_special = -1;
    memset(&e, 0, sizeof e);
    if (kvs_srv_tokenize_parse(body, size, &g_json_lock, &content, &add_special, &e) == 0) {
        if (!content || (add_special != 0 && add_special != 1))
            fail("tokenize", "accepted without content or with a bad add_special");
        free(content);
    } else {
        if (content)
            fail("tokenize", "refused but content left");
        check_error(&e);
    }
    int32_t *tokens = NULL;
    int n = -1;
    memset(&e, 0, sizeof e);
    if (kvs_srv_detokenize_parse(body, size, NULL, N_VOCAB, &tokens, &n, &e) == 0) {
        if (n < 0 || (n > 0 && !tokens))
            fail("detokenize", "accepted with a bad count");
        for (int i = 0; i < n; i++)
            if (tokens[i] < 0 || tokens[i] >= N_VOCAB)
                fail("detokenize", "an id out of range");
        free(tokens);
    } else {
        if (tokens)
            fail("detokenize", "refused but tokens left");
        check_error(&e);
    }
    return 0;
}
