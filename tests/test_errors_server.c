/* The server's request checks that tests/test_server_request.c leaves out (issue 16): KV
 * settings longer than the server accepts, the storage types by name, a library message turned
 * into a field error, numbers JSON cannot hold exactly, the limit on max_tokens under either
 * name, white space after the body, text parts that are not text, and the /tokenize and
 * /detokenize bodies' remaining errors. Each refusal must be a 400 invalid_request_error that
 * names the field at fault (or none) and says what was wrong. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/server_request.h"

/* body must be refused with 400 naming param (NULL: no param), the message containing what. */
static void refused(const char *body, int chat, const char *param, const char *what)
{
    kvs_srv_request r;
    kvs_srv_error e;
    memset(&e, 0, sizeof e);
    int rc = kvs_srv_request_parse(body, strlen(body), chat, NULL, &r, &e);
    CHECKF(rc != 0 && e.status == 400, "%.80s: rc %d status %d", body, rc, e.status);
    CHECKF(!strcmp(e.param, param ? param : ""), "%.80s: param '%s', want '%s'", body, e.param,
           param ? param : "");
    CHECKF(e.type && !strcmp(e.type, "invalid_request_error"), "%.80s: type %s", body,
           e.type ? e.type : "(null)");
    CHECKF(strstr(e.message, what) != NULL, "%.80s: message '%s' lacks '%s'", body, e.message,
           what);
    CHECK(r.prompt == NULL && r.messages == NULL && r.kv == NULL && r.kv_type == NULL);
    kvs_srv_request_free(&r);
}

static int accepted(const char *body, int chat, kvs_srv_request *r)
{
    kvs_srv_error e;
    memset(&e, 0, sizeof e);
    int rc = kvs_srv_request_parse(body, strlen(body), chat, NULL, r, &e);
    CHECKF(rc == 0, "%.80s: refused: %s", body, e.message);
    return rc == 0;
}

static void test_kv_settings(void)
{
    /* 257 bytes: one more than the server takes (the texts label metrics) */
    char body[600], spec[258];
    memset(spec, 'a', 257);
    spec[257] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"a\",\"kv\":\"%s\"}", spec);
    refused(body, 0, "kv", "kv: longer than 256 bytes");
    snprintf(body, sizeof body, "{\"prompt\":\"a\",\"kv_type\":\"%s\"}", spec);
    refused(body, 0, "kv_type", "kv_type: longer than 256 bytes");

    /* the plain storage types by name, and a KIVI one */
    const char *types[] = {"f32", "f16", "kivi2"};
    for (int i = 0; i < 3; i++) {
        kvs_srv_request r;
        snprintf(body, sizeof body, "{\"prompt\":\"a\",\"kv_type\":\"%s\"}", types[i]);
        if (accepted(body, 0, &r))
            CHECKF(r.kv_type && !strcmp(r.kv_type, types[i]), "%s", types[i]);
        kvs_srv_request_free(&r);
    }
    kvs_srv_error e;
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_kv_type_check("--kv-type", "q8", &e) != 0 && !strcmp(e.param, "kv_type") &&
          strstr(e.message, "--kv-type: unknown type 'q8'"));
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_kv_check("--kv", spec, &e) != 0 && strstr(e.message, "--kv: longer than"));

    /* a library message names the CLI flag; the request's error names the field */
    memset(&e, 0, sizeof e);
    CHECKF(kvs_srv_bad_kv(&e, "--kv-type kivi: kbits=3 is not 2 or 4") == -1 &&
               e.status == 400 && !strcmp(e.param, "kv_type") &&
               !strcmp(e.message, "kv_type kivi: kbits=3 is not 2 or 4"),
           "'%s' '%s'", e.param, e.message);
    memset(&e, 0, sizeof e);
    CHECKF(kvs_srv_bad_kv(&e, "--kv: unknown policy 'x'") == -1 && !strcmp(e.param, "kv") &&
               !strcmp(e.message, "kv: unknown policy 'x'"),
           "'%s' '%s'", e.param, e.message);
    /* a flag name followed by neither ':' nor ' ' is another flag: kept whole, after the field */
    memset(&e, 0, sizeof e);
    CHECKF(kvs_srv_bad_kv(&e, "--kv-typeX odd") == -1 && !strcmp(e.param, "kv_type") &&
               !strcmp(e.message, "kv_type: --kv-typeX odd"),
           "'%s' '%s'", e.param, e.message);
    memset(&e, 0, sizeof e);
    CHECKF(kvs_srv_bad_kv(&e, "--kvx odd") == -1 && !strcmp(e.param, "kv") &&
               !strcmp(e.message, "kv: --kvx odd"),
           "'%s' '%s'", e.param, e.message);
    /* a message about neither: no field */
    memset(&e, 0, sizeof e);
    CHECKF(kvs_srv_bad_kv(&e, "the model has no KV heads") == -1 && !strcmp(e.param, "") &&
               !strcmp(e.message, "the model has no KV heads"),
           "'%s' '%s'", e.param, e.message);
}

static void test_numbers_and_body(void)
{
    /* 1e999 parses as infinity: not an integer, and the message shows the value */
    refused("{\"prompt\":\"a\",\"max_tokens\":1e999}", 0, "max_tokens",
            "max_tokens must be an integer, got inf");
    refused("{\"prompt\":\"a\",\"temperature\":-1e999}", 0, "temperature",
            "temperature must be a number, got -inf");
    /* the limit, under the chat endpoint's newer name too (the error names the field given) */
    refused("{\"prompt\":\"a\",\"max_tokens\":16777217}", 0, "max_tokens",
            "max_tokens must be in [1, 16777216], got 16777217");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"max_completion_tokens\":16777217}",
            1, "max_completion_tokens", "got 16777217");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"max_completion_tokens\":0}",
            1, "max_completion_tokens", "max_tokens must be in [1, ");
    kvs_srv_request r;
    if (accepted("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"max_completion_tokens\":5,\"max_tokens\":7}",
                 1, &r))
        CHECKF(r.max_tokens == 7, "max_tokens %d: max_tokens wins", r.max_tokens);
    kvs_srv_request_free(&r);
    /* white space after the object is fine; anything else after it is not */
    if (accepted("{\"prompt\":\"ws\"} \t\r\n", 0, &r))
        CHECK(!strcmp(r.prompt, "ws"));
    kvs_srv_request_free(&r);
    refused("{\"prompt\":\"a\"} \n{}", 0, NULL, "malformed JSON in the request body");

    /* content parts: a text part without a string text, a part that is not an object */
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}]}",
            1, "messages[0].content", "only text parts");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
            "\"b\"]}]}",
            1, "messages[0].content", "only text parts");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
            "\"content\":[{\"type\":5,\"text\":\"x\"}]}]}",
            1, "messages[1].content", "only text parts");
    /* an empty list of parts is an empty message */
    if (accepted("{\"messages\":[{\"role\":\"assistant\",\"content\":[]}]}", 1, &r))
        CHECK(r.n_messages == 1 && !strcmp(r.messages[0].content, "") &&
              !strcmp(r.messages[0].role, "assistant"));
    kvs_srv_request_free(&r);
}

static void test_tokenize_errors(void)
{
    kvs_srv_error e;
    char *content = (char *)"x";
    int add = 0;
    const char *b = "{\"content\":";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) != 0 &&
          e.status == 400 && strstr(e.message, "malformed JSON") && !content);
    b = "{\"add_special\":true}";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) != 0 &&
          !strcmp(e.param, "content") && strstr(e.message, "content is required") && !content);
    b = "{\"content\":null}";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) != 0 &&
          !strcmp(e.param, "content") && strstr(e.message, "content is required"));

    int32_t *ids = (int32_t *)&add;
    int n = 9;
    b = "[1,2]";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) != 0 &&
          e.status == 400 && !ids && n == 0);
    b = "";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_detokenize_parse(b, 0, NULL, 512, &ids, &n, &e) != 0 &&
          strstr(e.message, "the request body is empty"));
    b = "{}";
    memset(&e, 0, sizeof e);
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) != 0 &&
          !strcmp(e.param, "tokens") && strstr(e.message, "tokens is required"));
    /* each kind of bad id is named by its index */
    const char *bad[] = {"{\"tokens\":[\"1\"]}", "{\"tokens\":[0,1.5]}", "{\"tokens\":[0,1,-1]}",
                         "{\"tokens\":[null]}"};
    const char *at[] = {"tokens[0] must be a token id in [0, 512)", "tokens[1]", "tokens[2]",
                        "tokens[0]"};
    for (int i = 0; i < 4; i++) {
        memset(&e, 0, sizeof e);
        ids = (int32_t *)&add;
        CHECKF(kvs_srv_detokenize_parse(bad[i], strlen(bad[i]), NULL, 512, &ids, &n, &e) != 0 &&
                   !strcmp(e.param, "tokens") && strstr(e.message, at[i]) && !ids && n == 0,
               "%s: '%s'", bad[i], e.message);
    }
}

int main(void)
{
    test_kv_settings();
    test_numbers_and_body();
    test_tokenize_errors();
    return check_summary("test_errors_server");
}
