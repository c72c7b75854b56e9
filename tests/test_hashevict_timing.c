/* HashEvict's per-step timings go through the API (kvs_hashevict_timing and
 * kvs_hashevict_timing_line, for `kvslim bench`), never to stderr: the policy prints nothing,
 * whatever the environment (the KVS_HASHEVICT_TIMING switch is gone). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kvslim.h"
#include "policies/hashevict.h"

enum { PROMPT = 48, DECODE = 5, SLOTS = 32 };

static kvs_model *model;
static int32_t tokens[PROMPT + DECODE];

/* Runs spec over the prompt and DECODE tokens; checks what the policy reports; returns the
 * bytes the run wrote to stderr. */
static long run(const char *spec, int is_he)
{
    char tmp[512];
    check_tmp_path(tmp, sizeof tmp, "hashevict_timing.stderr");
    fflush(stderr);
    const int saved = dup(2), fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);

    kvs_session_params sp = kvs_session_default_params();
    sp.kv_policy = spec;
    kvs_session *s = NULL;
    kvs_error err = {0};
    kvs_status st = kvs_session_new(model, &sp, &s, &err);
    for (int t = 0; st == KVS_OK && t <= DECODE; t++)
        st = t == 0 ? kvs_session_eval(s, tokens, PROMPT, NULL, 0, &err)
                    : kvs_session_eval(s, tokens + PROMPT + t - 1, 1, NULL, 0, &err);
    char line[512];
    kvs_he_timing tm;
    const kvs_policy *p = s ? kvs_kv_policy(kvs_session_kv(s)) : NULL;
    if (st == KVS_OK && p && is_he) {
        /* paper prefill: SLOTS prompt tokens densely, the rest fed one by one */
        CHECK(kvs_hashevict_timing(p, &tm) == 0);
        CHECK(tm.steps[KVS_HE_DECODE] == DECODE && tm.steps[KVS_HE_FED] == PROMPT - SLOTS);
        CHECK(tm.hash_s[0] >= 0 && tm.victim_s[0] >= 0 && tm.evict_s[0] >= 0);
        CHECK(kvs_hashevict_timing_line(p, KVS_HE_DECODE, line, sizeof line) == 0);
        char want[128];
        snprintf(want, sizeof want, "%s timing, decode: %d steps; per step: hash ", spec, DECODE);
        CHECKF(strncmp(line, want, strlen(want)) == 0, "%s", line);
        CHECKF(strstr(line, " us, victim search ") &&
                   strstr(line, " us, evict (store removal + table) "),
               "%s", line);
        CHECK(kvs_hashevict_timing_line(p, KVS_HE_FED, line, sizeof line) == 0);
        CHECKF(strstr(line, "timing, fed prompt tokens: 16 steps; per step: hash "), "%s", line);
        CHECK(kvs_hashevict_timing_line(p, 2, line, sizeof line) == -1 && line[0] == 0);
    } else if (st == KVS_OK && p) {
        CHECK(kvs_hashevict_timing(p, &tm) == -1 && tm.steps[0] == 0);
        CHECK(kvs_hashevict_timing_line(p, KVS_HE_DECODE, line, sizeof line) == -1 &&
              line[0] == 0);
    }
    CHECKF(st == KVS_OK, "%s: %s", spec, err.msg);
    kvs_session_free(s);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(tmp, "r");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (f)
        fclose(f);
    remove(tmp);
    return n;
}

int main(void)
{
    char path[1024];
    kvs_error err = {0};
    FILE *f = fopen(check_shared_path(path, sizeof path,
                                      "models/golden/stories260K-sample-512.tokens"), "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f)
        return check_summary("test_hashevict_timing");
    int n = 0;
    while (n < PROMPT + DECODE && fscanf(f, "%d", &tokens[n]) == 1)
        n++;
    fclose(f);
    CHECKF(kvs_model_load(check_shared_path(path, sizeof path,
                                            "models/gguf/stories260K-f32.gguf"), &model, &err) ==
               KVS_OK, "%s", err.msg);
    if (!model || n != PROMPT + DECODE)
        return check_summary("test_hashevict_timing");

    /* The old switch printed the timings to stderr when the policy stopped. */
    setenv("KVS_HASHEVICT_TIMING", "1", 1);
    CHECK(run("hashevict:slots=32", 1) == 0);
    CHECK(run("l2evict:slots=32", 1) == 0);
    CHECK(run("h2o:slots=32", 0) == 0);
    kvs_model_free(model);
    return check_summary("test_hashevict_timing");
}
