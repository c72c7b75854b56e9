/* The server's parts without HTTP: request parsing and validation (every error names its
 * field), stop-string and UTF-8 hold-back, the Prometheus exposition, the
 * sequence queue, and kvs_model_meta_str, which the server reads the chat template with. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvslim.h"
#include "server/server_json.h"
#include "server/server_metrics.h"
#include "server/server_request.h"
#include "server/server_slots.h"
#include "server/server_stop.h"

/* Parses body; returns the status (200 on success) and leaves the error in *e. */
static int parse(const char *body, int chat, kvs_srv_request *r, kvs_srv_error *e)
{
    memset(e, 0, sizeof *e);
    return kvs_srv_request_parse(body, strlen(body), chat, NULL, r, e) == 0 ? 200 : e->status;
}

/* body must be refused with 400 naming param (NULL: no param), the message containing what. */
static void refused(const char *body, int chat, const char *param, const char *what)
{
    kvs_srv_request r;
    kvs_srv_error e;
    int status = parse(body, chat, &r, &e);
    CHECKF(status == 400, "%s: status %d", body, status);
    CHECKF(!strcmp(e.param, param ? param : ""), "%s: param '%s', want '%s'", body, e.param,
           param ? param : "");
    CHECKF(e.type && !strcmp(e.type, "invalid_request_error"), "%s: type %s", body,
           e.type ? e.type : "(null)");
    CHECKF(strstr(e.message, what) != NULL, "%s: message '%s' lacks '%s'", body, e.message, what);
    CHECK(r.prompt == NULL && r.messages == NULL && r.kv == NULL && r.n_stop == 0);
    kvs_srv_request_free(&r);
}

static void test_completion_fields(void)
{
    kvs_srv_request r;
    kvs_srv_error e;
    CHECK(parse("{\"prompt\":\"hi\"}", 0, &r, &e) == 200);
    CHECK(!strcmp(r.prompt, "hi") && r.max_tokens == 16 && r.temperature == 1.0f &&
          r.top_p == 1.0f && r.top_k == 0 && !r.has_seed && !r.stream && r.n_stop == 0 &&
          !r.kv && !r.kv_type && !r.ignore_eos);
    kvs_srv_request_free(&r);

    /* Every field, unknown ones ignored, null counting as absent. */
    CHECK(parse("{\"model\":42,\"prompt\":[\"Once\"],\"max_tokens\":7,\"temperature\":0,"
                "\"top_p\":0.5,\"top_k\":40,\"seed\":-1,\"stop\":[\"a\",\"bc\"],\"stream\":true,"
                "\"n\":1,\"kv\":\"snapkv:budget=0.2\",\"kv_type\":\"f16\",\"logprobs\":null,"
                "\"user\":{\"x\":[1,2]},\"echo\":false,\"suffix\":null,\"ignore_eos\":true}",
                0, &r, &e) == 200);
    CHECK(!strcmp(r.prompt, "Once") && r.max_tokens == 7 && r.temperature == 0.0f &&
          r.top_p == 0.5f && r.top_k == 40 && r.has_seed && r.seed == UINT64_MAX &&
          r.stream && r.ignore_eos && r.n_stop == 2 && !strcmp(r.stop[1], "bc") &&
          !strcmp(r.kv, "snapkv:budget=0.2") && !strcmp(r.kv_type, "f16"));
    kvs_srv_request_free(&r);
    CHECK(parse("{\"prompt\":\"\",\"stop\":\"\\n\",\"max_tokens\":null,\"seed\":12}", 0, &r,
                &e) == 200);
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "\n") && r.max_tokens == 16 && r.seed == 12);
    kvs_srv_request_free(&r);
    CHECK(parse("{\"prompt\":\"x\",\"max_completion_tokens\":3}", 0, &r, &e) == 200 &&
          r.max_tokens == 3);
    kvs_srv_request_free(&r);
}

static void test_completion_errors(void)
{
    refused("", 0, NULL, "empty");
    refused("{\"prompt\":", 0, NULL, "malformed JSON");
    refused("{\"prompt\":\"a\"} trailing", 0, NULL, "malformed JSON");
    refused("[\"prompt\"]", 0, NULL, "must be a JSON object");
    refused("{}", 0, "prompt", "prompt is required");
    refused("{\"prompt\":5}", 0, "prompt", "a string or an array of one string");
    refused("{\"prompt\":[\"a\",\"b\"]}", 0, "prompt", "array of 2 items");
    refused("{\"prompt\":[]}", 0, "prompt", "array of 0 items");
    refused("{\"prompt\":[7]}", 0, "prompt", "not a string");
    refused("{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 0, "max_tokens", "must be an integer");
    refused("{\"prompt\":\"a\",\"max_tokens\":2.5}", 0, "max_tokens", "must be an integer");
    refused("{\"prompt\":\"a\",\"max_tokens\":0}", 0, "max_tokens", "[1, ");
    refused("{\"prompt\":\"a\",\"max_tokens\":-3}", 0, "max_tokens", "[1, ");
    refused("{\"prompt\":\"a\",\"temperature\":\"hot\"}", 0, "temperature", "must be a number");
    refused("{\"prompt\":\"a\",\"temperature\":-0.5}", 0, "temperature", "[0, 100]");
    refused("{\"prompt\":\"a\",\"top_p\":1.5}", 0, "top_p", "[0, 1]");
    refused("{\"prompt\":\"a\",\"top_k\":true}", 0, "top_k", "must be an integer");
    refused("{\"prompt\":\"a\",\"top_k\":-1}", 0, "top_k", "[0, ");
    refused("{\"prompt\":\"a\",\"seed\":\"x\"}", 0, "seed", "must be an integer");
    refused("{\"prompt\":\"a\",\"seed\":0.5}", 0, "seed", "must be an integer");
    refused("{\"prompt\":\"a\",\"stream\":1}", 0, "stream", "boolean");
    refused("{\"prompt\":\"a\",\"ignore_eos\":\"yes\"}", 0, "ignore_eos", "boolean");
    refused("{\"prompt\":\"a\",\"n\":2}", 0, "n", "n must be 1");
    refused("{\"prompt\":\"a\",\"n\":0}", 0, "n", "n must be 1");
    refused("{\"prompt\":\"a\",\"n\":\"1\"}", 0, "n", "must be an integer");
    refused("{\"prompt\":\"a\",\"stop\":5}", 0, "stop", "at most 4 strings");
    refused("{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 0, "stop", "(got 5)");
    refused("{\"prompt\":\"a\",\"stop\":[\"a\",3]}", 0, "stop", "item 1 is not a string");
    refused("{\"prompt\":\"a\",\"stop\":[\"\"]}", 0, "stop", "must not be empty");
    refused("{\"prompt\":\"a\",\"stop\":\"\"}", 0, "stop", "must not be empty");
    refused("{\"prompt\":\"a\",\"kv\":7}", 0, "kv", "kv must be a string");
    refused("{\"prompt\":\"a\",\"kv\":\"\"}", 0, "kv", "must not be empty");
    /* The policy's own message, naming the field and listing what is accepted. */
    refused("{\"prompt\":\"a\",\"kv\":\"bogus\"}", 0, "kv", "kv: unknown policy 'bogus'");
    refused("{\"prompt\":\"a\",\"kv\":\"bogus\"}", 0, "kv", "snapkv");
    refused("{\"prompt\":\"a\",\"kv\":\"h2o:budget=2\"}", 0, "kv", "ambiguous");
    refused("{\"prompt\":\"a\",\"kv_type\":[\"f16\"]}", 0, "kv_type", "must be a string");
    refused("{\"prompt\":\"a\",\"kv_type\":\"f8\"}", 0, "kv_type", "kivi4");
    refused("{\"prompt\":\"a\",\"kv_type\":\"kivi:kbits=3\"}", 0, "kv_type", "kv_type kivi");
}

static void test_messages(void)
{
    kvs_srv_request r;
    kvs_srv_error e;
    CHECK(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":"
                "\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},{\"type\":\"text\","
                "\"text\":\"there\"}]}],\"max_tokens\":4}",
                1, &r, &e) == 200);
    CHECK(r.chat && r.n_messages == 2 && !strcmp(r.messages[0].role, "system") &&
          !strcmp(r.messages[1].content, "Hi there") && r.max_tokens == 4 && !r.prompt);
    kvs_srv_request_free(&r);
    refused("{}", 1, "messages", "messages is required");
    refused("{\"messages\":\"hi\"}", 1, "messages", "must be an array");
    refused("{\"messages\":[]}", 1, "messages", "must not be empty");
    refused("{\"messages\":[5]}", 1, "messages[0]", "must be an object");
    refused("{\"messages\":[{\"content\":\"x\"}]}", 1, "messages[0].role", "must be a string");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"bot\","
            "\"content\":\"x\"}]}", 1, "messages[1].role", "'bot' is not one of");
    refused("{\"messages\":[{\"role\":\"user\"}]}", 1, "messages[0].content", "is required");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":3}]}", 1, "messages[0].content",
            "must be a string");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 1,
            "messages[0].content", "only text parts");
    /* The chat endpoint checks the same sampling fields. */
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":3}", 1, "n", "n must be 1");
}

static void test_tokenize_bodies(void)
{
    kvs_srv_error e;
    char *content;
    int add;
    const char *b = "{\"content\":\"hi\",\"add_special\":false}";
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) == 0 &&
          !strcmp(content, "hi") && add == 0);
    free(content);
    b = "{\"content\":1}";
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) != 0 &&
          e.status == 400 && !strcmp(e.param, "content") && !content);
    b = "{\"content\":\"x\",\"add_special\":\"no\"}";
    CHECK(kvs_srv_tokenize_parse(b, strlen(b), NULL, &content, &add, &e) != 0 &&
          !strcmp(e.param, "add_special") && !content);
    int32_t *ids;
    int n;
    b = "{\"tokens\":[1,2,511]}";
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) == 0 && n == 3 &&
          ids[2] == 511);
    free(ids);
    b = "{\"tokens\":[]}";
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) == 0 && n == 0);
    free(ids);
    b = "{\"tokens\":[1,512]}";
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) != 0 &&
          strstr(e.message, "tokens[1]") && !ids);
    b = "{\"tokens\":\"1 2\"}";
    CHECK(kvs_srv_detokenize_parse(b, strlen(b), NULL, 512, &ids, &n, &e) != 0 &&
          !strcmp(e.param, "tokens"));
}

/* Feeds pieces (NULL-terminated) through a stopper; returns what was released (static buffer)
 * and the last feed's result in *matched. Flushes at the end unless a stop matched. */
static const char *run_stops(const char *const *stops, int n_stops, const char *const *pieces,
                             int *matched, const char **after_first)
{
    static char result[256], first[64];
    kvs_srv_stopper s;
    kvs_srv_buf out = {0};
    kvs_srv_stop_init(&s, stops, n_stops);
    *matched = 0;
    for (int i = 0; pieces[i] && !*matched; i++) {
        *matched = kvs_srv_stop_feed(&s, pieces[i], strlen(pieces[i]), &out);
        if (i == 0)
            snprintf(first, sizeof first, "%s", out.data ? out.data : "");
    }
    if (!*matched)
        kvs_srv_stop_flush(&s, &out);
    snprintf(result, sizeof result, "%s", out.data ? out.data : "");
    if (after_first)
        *after_first = first;
    kvs_srv_buf_free(&out);
    kvs_srv_stop_free(&s);
    return result;
}

static void test_stop_strings(void)
{
    const char *stops[] = {"END", "\n\n"};
    int matched;
    const char *first;
    const char *p1[] = {"Hello E", "N", "D more", NULL};
    const char *r = run_stops(stops, 2, p1, &matched, &first);
    /* "E" is held back (it may start END), the rest of the piece goes out at once. */
    CHECKF(!strcmp(first, "Hello ") && !strcmp(r, "Hello ") && matched == 1, "'%s' '%s'", first, r);
    const char *p2[] = {"an E", "ND", NULL};
    CHECK(!strcmp(run_stops(stops, 2, p2, &matched, NULL), "an ") && matched == 1);
    /* A partial match that does not complete is released. */
    const char *p3[] = {"ab EN", "x", NULL};
    r = run_stops(stops, 2, p3, &matched, &first);
    CHECKF(!strcmp(first, "ab ") && !strcmp(r, "ab ENx") && !matched, "'%s' '%s'", first, r);
    /* Held text that never became a stop is released at the end. */
    const char *p4[] = {"line\n", NULL};
    CHECK(!strcmp(run_stops(stops, 2, p4, &matched, &first), "line\n") && !strcmp(first, "line"));
    /* The earliest stop wins; text after it is dropped. */
    const char *p5[] = {"x\n\ny END", NULL};
    CHECK(!strcmp(run_stops(stops, 2, p5, &matched, NULL), "x") && matched == 1);
    /* No stop strings: everything goes out at once. */
    const char *p6[] = {"a", "b", NULL};
    CHECK(!strcmp(run_stops(NULL, 0, p6, &matched, &first), "ab") && !strcmp(first, "a"));
    /* A UTF-8 character split across pieces is held until whole ("é" = C3 A9). */
    const char *p7[] = {"caf\xC3", "\xA9!", NULL};
    r = run_stops(NULL, 0, p7, &matched, &first);
    CHECK(!strcmp(first, "caf") && !strcmp(r, "caf\xC3\xA9!"));
    /* Bytes that are not UTF-8 become U+FFFD; a truncated character at the end too. */
    const char *p8[] = {"a\xFF", "b\xE2\x82", NULL};
    CHECKF(!strcmp(run_stops(NULL, 0, p8, &matched, NULL), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD"),
           "%s", run_stops(NULL, 0, p8, &matched, NULL));
    kvs_srv_buf out = {0};
    CHECK(kvs_srv_utf8_append(&out, "a\0b", 3) == 0 && out.len == 5 &&
          !memcmp(out.data, "a\xEF\xBF\xBD", 4)); /* NUL would cut the JSON string */
    kvs_srv_buf_clear(&out);
    CHECK(kvs_srv_utf8_append(&out, "\xED\xA0\x80", 3) == 0 && out.len == 9); /* a surrogate */
    kvs_srv_buf_free(&out);
    CHECK(kvs_srv_utf8_whole("ab\xF0\x9F\x98", 5) == 2 && kvs_srv_utf8_whole("ab\xF0\x9F\x98\x80", 6) == 6 &&
          kvs_srv_utf8_whole("ab\x80", 3) == 3);
}

/* Every line of a Prometheus text exposition: a # HELP / # TYPE comment or a sample
 * name{label="value",...} number. Returns the number of bad lines. */
static int bad_prometheus_lines(const char *text)
{
    int bad = 0;
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n");
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        line += len + (line[len] == '\n');
        char name[128], type[32];
        if (!strncmp(buf, "# HELP ", 7) || !strncmp(buf, "# TYPE ", 7)) {
            if (sscanf(buf + 7, "%127s %31s", name, type) != 2 ||
                (!strncmp(buf, "# TYPE ", 7) && strcmp(type, "counter") && strcmp(type, "gauge")))
                bad++, fprintf(stderr, "bad comment: %s\n", buf);
            continue;
        }
        const char *p = buf;
        while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
            p++;
        if (p == buf)
            bad++, fprintf(stderr, "no metric name: %s\n", buf);
        if (*p == '{') {
            for (p++; *p && *p != '}';) {
                while (isalnum((unsigned char)*p) || *p == '_')
                    p++;
                if (p[0] != '=' || p[1] != '"') {
                    bad++, fprintf(stderr, "bad label: %s\n", buf);
                    break;
                }
                for (p += 2; *p && *p != '"'; p++)
                    if (*p == '\\' && (p[1] == '\\' || p[1] == '"' || p[1] == 'n'))
                        p++;
                if (*p == '"')
                    p++;
                if (*p == ',')
                    p++;
            }
            if (*p == '}')
                p++;
        }
        char *end;
        if (*p != ' ' || (strtod(p + 1, &end), *end != 0))
            bad++, fprintf(stderr, "bad sample: %s\n", buf);
    }
    return bad;
}

static void test_prometheus(void)
{
    kvs_srv_metrics m;
    kvs_srv_metrics_init(&m);
    kvs_srv_metrics_request(&m, "/v1/completions", 200);
    kvs_srv_metrics_request(&m, "/v1/completions", 200);
    kvs_srv_metrics_request(&m, "/v1/completions", 400);
    kvs_srv_metrics_request(&m, "other", 404);
    const char *odd = "we\"ird\\spec\nx"; /* not a valid policy: the escaping is what is tested */
    kvs_srv_metrics_started(&m, "snapkv:budget=0.2", 5);
    kvs_srv_metrics_started(&m, odd, 3);
    kvs_srv_metrics_generated(&m, "snapkv:budget=0.2", 30, 1000);
    kvs_srv_metrics_generated(&m, odd, 6, 1001);
    kvs_srv_metrics_generated(&m, "snapkv:budget=0.2", 100, 900); /* outside the last minute */
    kvs_srv_slot slots[2] = {{1, 4096, "snapkv:budget=0.2"}, {0, 0, ""}};
    kvs_srv_metrics_now now = {.second = 1010, .busy = 1, .waiting = 3, .max_sequences = 2,
                               .slots = slots, .kv_bytes_bound = 123456};
    kvs_srv_buf out = {0};
    CHECK(kvs_srv_metrics_render(&m, &now, &out) == 0);
    const char *t = out.data;
    const char *want[] = {
        "kvslim_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n",
        "kvslim_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n",
        "kvslim_requests_total{endpoint=\"other\",status=\"404\"} 1\n",
        "kvslim_prompt_tokens_total 8\n",
        "kvslim_generated_tokens_total 136\n",
        "kvslim_decode_tokens_per_second 0.6\n",
        "kvslim_kv_bytes_held 4096\n",
        "kvslim_kv_bytes_bound 123456\n",
        "kvslim_queue_depth 3\n",
        "kvslim_sequences_busy 1\n",
        "kvslim_sequences_max 2\n",
        "kvslim_policy_requests_total{kv=\"snapkv:budget=0.2\"} 1\n",
        "kvslim_policy_generated_tokens_total{kv=\"snapkv:budget=0.2\"} 130\n",
        "kvslim_policy_kv_bytes_held{kv=\"snapkv:budget=0.2\"} 4096\n",
        "kvslim_policy_requests_total{kv=\"we\\\"ird\\\\spec\\nx\"} 1\n",
        "kvslim_policy_kv_bytes_held{kv=\"we\\\"ird\\\\spec\\nx\"} 0\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(t && strstr(t, want[i]), "missing: %s", want[i]);
    const char *names[] = {"kvslim_requests_total", "kvslim_prompt_tokens_total",
                           "kvslim_generated_tokens_total", "kvslim_decode_tokens_per_second",
                           "kvslim_kv_bytes_held", "kvslim_kv_bytes_bound", "kvslim_queue_depth",
                           "kvslim_sequences_busy", "kvslim_sequences_max",
                           "kvslim_policy_requests_total", "kvslim_policy_generated_tokens_total",
                           "kvslim_policy_kv_bytes_held"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char help[96], type[96];
        snprintf(help, sizeof help, "# HELP %s ", names[i]);
        snprintf(type, sizeof type, "# TYPE %s ", names[i]);
        CHECKF(t && strstr(t, help) && strstr(t, type), "no HELP/TYPE for %s", names[i]);
    }
    CHECK(t && bad_prometheus_lines(t) == 0);
    kvs_srv_buf_free(&out);
    kvs_srv_buf lab = {0};
    CHECK(kvs_srv_prom_label(&lab, "a\"b\\c\nd") == 0 && !strcmp(lab.data, "a\\\"b\\\\c\\nd"));
    kvs_srv_buf_free(&lab);
    kvs_srv_metrics_destroy(&m);
}

static int never_gone(void *ctx) { return ctx != NULL; }

static void test_slots(void)
{
    kvs_srv_slots s;
    CHECK(kvs_srv_slots_init(&s, 1, 0) == 0);
    int a = -1, b = -1;
    CHECK(kvs_srv_slots_acquire(&s, "full", never_gone, NULL, &a) == KVS_SRV_SLOT_OK && a == 0);
    kvs_srv_slots_set_bytes(&s, a, 100);
    /* no queue: the second is turned away at once */
    CHECK(kvs_srv_slots_acquire(&s, "full", never_gone, NULL, &b) == KVS_SRV_SLOT_FULL && b < 0);
    int busy, waiting;
    kvs_srv_slot copy[1];
    kvs_srv_slots_snapshot(&s, &busy, &waiting, copy);
    CHECK(busy == 1 && waiting == 0 && copy[0].busy && copy[0].kv_bytes == 100 &&
          !strcmp(copy[0].kv, "full"));
    kvs_srv_slots_release(&s, a);
    kvs_srv_slots_snapshot(&s, &busy, &waiting, copy);
    CHECK(busy == 0 && !copy[0].busy && copy[0].kv_bytes == 0);
    kvs_srv_slots_close(&s);
    CHECK(kvs_srv_slots_acquire(&s, "full", NULL, NULL, &b) == KVS_SRV_SLOT_CLOSED);
    kvs_srv_slots_destroy(&s);
    /* A waiter whose client left gives up its place. */
    CHECK(kvs_srv_slots_init(&s, 1, 1) == 0);
    CHECK(kvs_srv_slots_acquire(&s, "full", NULL, NULL, &a) == KVS_SRV_SLOT_OK);
    CHECK(kvs_srv_slots_acquire(&s, "full", never_gone, &s, &b) == KVS_SRV_SLOT_GONE);
    kvs_srv_slots_snapshot(&s, &busy, &waiting, copy);
    CHECK(busy == 1 && waiting == 0);
    kvs_srv_slots_release(&s, a);
    kvs_srv_slots_destroy(&s);
}

static void test_model_meta(void)
{
    char path[512], buf[16];
    check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    kvs_model *m = NULL;
    kvs_error err;
    CHECK(kvs_model_meta_str(NULL, "general.architecture", buf, sizeof buf) == -1 && !buf[0]);
    if (kvs_model_load(path, &m, &err) != KVS_OK) {
        fprintf(stderr, "skipping kvs_model_meta_str on a model: %s\n", err.msg);
        return;
    }
    CHECK(kvs_model_meta_str(m, "general.architecture", NULL, 0) == 5);
    CHECK(kvs_model_meta_str(m, "general.architecture", buf, sizeof buf) == 5 &&
          !strcmp(buf, "llama"));
    CHECK(kvs_model_meta_str(m, "general.architecture", buf, 3) == 5 && !strcmp(buf, "ll"));
    CHECK(kvs_model_meta_str(m, "no.such.key", buf, sizeof buf) == -1 && !buf[0]);
    CHECK(kvs_model_meta_str(m, "llama.context_length", buf, sizeof buf) == -1); /* a number */
    CHECK(kvs_model_meta_str(m, NULL, buf, sizeof buf) == -1);
    kvs_model_free(m);
}

/* A refusal that quotes the request, cut inside a UTF-8 character at 64 bytes, is still answered
 * with valid UTF-8: the half character becomes U+FFFD (fuzz/regress/fuzz_server_request/). */
static void test_error_utf8(void)
{
    char body[256] = "{\"messages\":[{\"role\":\"x";
    for (int i = 0; i < 40; i++)
        strcat(body, "\xc3\xa9");
    strcat(body, "\",\"content\":\"x\"}]}");
    kvs_srv_request r;
    kvs_srv_error e;
    CHECK(parse(body, 1, &r, &e) == 400);
    kvs_srv_buf out = {0};
    CHECK(kvs_srv_json_error(&out, &e) == 0);
    CHECKF(out.data && strstr(out.data, "\xc3\xa9\xef\xbf\xbd' is not one of"), "%s",
           out.data ? out.data : "(null)");
    CHECK(out.data && !strstr(out.data, "\xc3' is not"));
    kvs_srv_buf_free(&out);
}

int main(void)
{
    test_error_utf8();
    test_completion_fields();
    test_completion_errors();
    test_messages();
    test_tokenize_bodies();
    test_stop_strings();
    test_prometheus();
    test_slots();
    test_model_meta();
    return check_summary("test_server_request");
}
