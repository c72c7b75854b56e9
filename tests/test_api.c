/* The public C API (include/kvslim.h) as a program uses it: NULL arguments are refused with
 * KVS_ERR_ARG instead of crashing, a successful call clears the error, a context beyond the
 * trained one is refused unless asked for (then a notice), notices reach the log callback, a
 * llama2.c checkpoint is recognised, and the sampler. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "kvslim.h"

typedef struct notes {
    int n;
    char last[512];
} notes;

static void note(void *ctx, const char *msg)
{
    notes *l = ctx;
    l->n++;
    snprintf(l->last, sizeof l->last, "%s", msg);
}

/* A stale error, so a test can see that a successful call clears it. */
static void dirty(kvs_error *err)
{
    err->code = KVS_ERR_IO;
    snprintf(err->msg, sizeof err->msg, "stale");
}

static int cleared(const kvs_error *err) { return err->code == KVS_OK && err->msg[0] == 0; }

static void null_arguments(const kvs_model *m)
{
    kvs_error err = {0};
    kvs_model *mo = (kvs_model *)1;
    CHECK(kvs_model_load(NULL, &mo, &err) == KVS_ERR_ARG && mo == NULL && err.msg[0]);
    CHECK(kvs_model_load("x.gguf", NULL, &err) == KVS_ERR_ARG);
    CHECK(kvs_model_load(NULL, NULL, NULL) == KVS_ERR_ARG);
    kvs_model_free(NULL);
    kvs_model_info info;
    memset(&info, 0xff, sizeof info);
    kvs_model_get_info(NULL, &info);
    CHECK(info.n_vocab == 0 && info.weight_type != NULL);
    kvs_model_get_info(m, NULL);
    CHECK(kvs_token_bos(NULL) == -1 && kvs_token_eos(NULL) == -1);
    int len = 7;
    const char *t = kvs_token_text(NULL, 1, 2, &len);
    CHECK(t && len == 0);
    CHECK(kvs_token_text(m, 1, 2, NULL) != NULL);

    int32_t *ids = NULL;
    int n = 0;
    CHECK(kvs_tokenize(NULL, "a", 1, &ids, &n, &err) == KVS_ERR_ARG);
    CHECK(kvs_tokenize(m, NULL, 1, &ids, &n, &err) == KVS_ERR_ARG);
    CHECK(kvs_tokenize(m, "a", 1, NULL, &n, &err) == KVS_ERR_ARG);
    CHECK(kvs_tokenize(m, "a", 1, &ids, NULL, &err) == KVS_ERR_ARG);

    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = (kvs_session *)1;
    CHECK(kvs_session_new(NULL, &p, &s, &err) == KVS_ERR_ARG && s == NULL);
    CHECK(kvs_session_new(m, NULL, &s, &err) == KVS_ERR_ARG);
    CHECK(kvs_session_new(m, &p, NULL, &err) == KVS_ERR_ARG);
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    float *logits = malloc(sizeof(float) * 512);
    int32_t tok = 1;
    CHECK(kvs_session_eval(s, NULL, 1, logits, 0, &err) == KVS_ERR_ARG);
    CHECK(strstr(err.msg, "tokens") != NULL);
    CHECK(kvs_session_eval(NULL, &tok, 1, logits, 0, &err) == KVS_ERR_ARG);
    CHECK(kvs_session_n_past(s) == 0);
    free(logits);
    kvs_session_free(s);
    kvs_session_free(NULL);
    kvs_session_reset(NULL);
    CHECK(kvs_session_n_past(NULL) == 0);
    CHECK(kvs_session_kv_bytes(NULL) == 0 && kvs_session_kv_bytes_full_f16(NULL) == 0 &&
          kvs_session_kv_peak_bytes(NULL) == 0);
    kvs_step_stats st = {1, 1};
    kvs_session_last_step(NULL, &st);
    CHECK(st.slots_attended == 0);
    kvs_kv_policy_help(NULL);
    CHECK(kvs_kv_policy_check(NULL, &err) == KVS_ERR_ARG);
    CHECK(kvs_status_name(KVS_ERR_ARG) != NULL);
}

static void errors_cleared(const kvs_model *m, const char *gguf)
{
    kvs_error err;
    kvs_model *m2 = NULL;
    dirty(&err);
    CHECK(kvs_model_load(gguf, &m2, &err) == KVS_OK && cleared(&err));
    kvs_model_free(m2);
    int32_t *ids = NULL;
    int n = 0;
    dirty(&err);
    CHECK(kvs_tokenize(m, "Once upon a time", 1, &ids, &n, &err) == KVS_OK && cleared(&err));
    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = NULL;
    dirty(&err);
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK && cleared(&err));
    dirty(&err);
    CHECK(s && kvs_session_eval(s, ids, n, NULL, 0, &err) == KVS_OK && cleared(&err));
    dirty(&err);
    CHECK(kvs_kv_policy_check("h2o:budget=0.5", &err) == KVS_OK && cleared(&err));
    kvs_sampler_params sp = kvs_sampler_default_params();
    kvs_sampler *smp = NULL;
    dirty(&err);
    CHECK(kvs_sampler_new(512, &sp, &smp, &err) == KVS_OK && cleared(&err));
    kvs_sampler_free(smp);
    kvs_session_free(s);
    free(ids);
}

static void context_beyond_trained(const kvs_model *m)
{
    kvs_error err = {0};
    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = NULL;
    p.n_ctx = 1 << 30; /* the model was trained on 512 */
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_ERR_ARG && s == NULL);
    CHECKF(strstr(err.msg, "1073741824") && strstr(err.msg, "512") &&
               strstr(err.msg, "allow_ctx_beyond_trained"),
           "%s", err.msg);
    notes log = {0};
    p.n_ctx = 1024;
    p.allow_ctx_beyond_trained = 1;
    p.log = note;
    p.log_ctx = &log;
    CHECKF(kvs_session_new(m, &p, &s, &err) == KVS_OK, "%s", err.msg);
    CHECKF(log.n == 1 && strstr(log.last, "1024") && strstr(log.last, "512"), "%d '%s'", log.n,
           log.last);
    kvs_session_free(s);
    p.n_ctx = 512; /* the trained context: no notice */
    log.n = 0;
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK && log.n == 0);
    kvs_session_free(s);
    p.n_ctx = -1;
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_ERR_ARG);
}

/* A fraction below the policy's protected tokens is raised with a notice; slots=N is not. */
static void budget_clamp(const kvs_model *m)
{
    kvs_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    CHECK(kvs_tokenize(m, "Once upon a time", 1, &ids, &n, &err) == KVS_OK);
    notes log = {0};
    kvs_session_params p = kvs_session_default_params();
    p.kv_policy = "streaming:budget=0.5";
    p.log = note;
    p.log_ctx = &log;
    kvs_session *s = NULL;
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    CHECKF(s && kvs_session_eval(s, ids, n, NULL, 0, &err) == KVS_OK, "%s", err.msg);
    CHECKF(log.n == 1 && strstr(log.last, "streaming") && strstr(log.last, "budget=0.5") && strstr(log.last, "0.5 of the 5-token prompt is 3 slots") &&
               strstr(log.last, "5 slots"),
           "%d notices, last '%s'", log.n, log.last);
    kvs_session_free(s);
    p.kv_policy = "streaming:slots=3";
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    CHECK(s && kvs_session_eval(s, ids, n, NULL, 0, &err) == KVS_ERR_ARG);
    CHECKF(strstr(err.msg, "streaming:slots=3"), "%s", err.msg);
    kvs_session_free(s);
    free(ids);
}

static void llama2c_checkpoint(const char *bin)
{
    kvs_error err = {0};
    kvs_model *m = NULL;
    CHECK(kvs_model_load(bin, &m, &err) == KVS_ERR_FORMAT && !m);
    char want[1400];
    snprintf(want, sizeof want, "%s is a llama2.c checkpoint, not a GGUF file; convert it with "
             "`kvslim convert %s --tokenizer TOK.bin -o OUT.gguf`", bin, bin);
    CHECKF(strstr(err.msg, want) != NULL, "'%s'", err.msg);
}

static void sampler(void)
{
    kvs_error err = {0};
    kvs_sampler_params sp = kvs_sampler_default_params();
    CHECK(sp.temperature > 0 && sp.top_k == 40 && sp.top_p > 0.9f && sp.top_p < 1.0f);
    kvs_sampler *s = (kvs_sampler *)1;
    CHECK(kvs_sampler_new(0, &sp, &s, &err) == KVS_ERR_ARG && s == NULL);
    CHECK(kvs_sampler_new(8, NULL, &s, &err) == KVS_ERR_ARG);
    CHECK(kvs_sampler_new(8, &sp, NULL, &err) == KVS_ERR_ARG);
    kvs_sampler_params bad = sp;
    bad.top_p = 1.5f; /* [0, 1] */
    CHECK(kvs_sampler_new(8, &bad, &s, &err) == KVS_ERR_ARG && strstr(err.msg, "top_p"));
    bad = sp;
    bad.temperature = -1;
    CHECK(kvs_sampler_new(8, &bad, &s, &err) == KVS_ERR_ARG && strstr(err.msg, "temperature"));
    bad = sp;
    bad.top_k = -1;
    CHECK(kvs_sampler_new(8, &bad, &s, &err) == KVS_ERR_ARG && strstr(err.msg, "top_k"));
    CHECK(kvs_sampler_sample(NULL, NULL) == -1);

    const float logits[8] = {0, 1, 5, 2, 0, 0, 3, 0};
    sp.temperature = 0;
    CHECK(kvs_sampler_new(8, &sp, &s, &err) == KVS_OK);
    CHECK(kvs_sampler_sample(s, logits) == 2); /* greedy */
    CHECK(kvs_sampler_sample(s, NULL) == -1);
    kvs_sampler_free(s);
    /* Seeded: the same seed gives the same draws. */
    sp = kvs_sampler_default_params();
    sp.temperature = 2;
    sp.top_k = 0;
    sp.top_p = 1;
    sp.seed = 7;
    kvs_sampler *a = NULL, *b = NULL;
    CHECK(kvs_sampler_new(8, &sp, &a, &err) == KVS_OK && kvs_sampler_new(8, &sp, &b, &err) == KVS_OK);
    int same = 1, distinct = 0, prev = -1;
    for (int i = 0; i < 50; i++) {
        int x = kvs_sampler_sample(a, logits), y = kvs_sampler_sample(b, logits);
        same &= x == y && x >= 0 && x < 8;
        distinct += x != prev;
        prev = x;
    }
    CHECK(same && distinct > 1);
    kvs_sampler_free(a);
    kvs_sampler_free(b);
    kvs_sampler_free(NULL);
    /* top_k = 1 is greedy at any temperature. */
    sp.top_k = 1;
    CHECK(kvs_sampler_new(8, &sp, &s, &err) == KVS_OK);
    int all2 = 1;
    for (int i = 0; i < 20; i++)
        all2 &= kvs_sampler_sample(s, logits) == 2;
    CHECK(all2);
    kvs_sampler_free(s);
}

int main(void)
{
    char gguf[512], bin[512];
    check_shared_path(gguf, sizeof gguf, "models/gguf/stories260K-f32.gguf");
    check_shared_path(bin, sizeof bin, "models/stories260K.bin");
    kvs_model *m = NULL;
    kvs_error err = {0};
    CHECKF(kvs_model_load(gguf, &m, &err) == KVS_OK, "%s", err.msg);
    if (!m)
        return check_summary("api");
    null_arguments(m);
    errors_cleared(m, gguf);
    context_beyond_trained(m);
    budget_clamp(m);
    llama2c_checkpoint(bin);
    sampler();
    kvs_model_free(m);
    return check_summary("api");
}
