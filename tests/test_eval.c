/* The eval harness: metric math on known examples, and the protocol on stories260K. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "eval/eval.h"

static void test_math(void)
{
    const float zero2[2] = {0, 0};
    CHECK(fabs(kvs_eval_logsumexp(zero2, 2) - log(2.0)) < 1e-15);
    const float big[3] = {1000, 1000, -1000};
    CHECK(fabs(kvs_eval_logsumexp(big, 3) - (1000 + log(2.0))) < 1e-12);

    /* Identical rows: exactly zero. */
    const float p[5] = {0.5f, -1.25f, 3.0f, 2.0f, -7.0f};
    double lp = kvs_eval_logsumexp(p, 5);
    CHECK(kvs_eval_kl(p, lp, p, lp, 5) == 0.0);

    /* P = (1/2, 1/2), Q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3). */
    const float q[2] = {(float)log(0.25), (float)log(0.75)};
    double kl = kvs_eval_kl(zero2, kvs_eval_logsumexp(zero2, 2), q, kvs_eval_logsumexp(q, 2), 2);
    CHECKF(fabs(kl - 0.5 * log(4.0 / 3.0)) < 1e-7, "kl %.10f", kl);
    /* The reverse direction differs: KL(Q || P) = 1/4 ln(1/2) + 3/4 ln(3/2). */
    double rkl = kvs_eval_kl(q, kvs_eval_logsumexp(q, 2), zero2, kvs_eval_logsumexp(zero2, 2), 2);
    CHECKF(fabs(rkl - (0.25 * log(0.5) + 0.75 * log(1.5))) < 1e-7, "rkl %.10f", rkl);

    /* Logits shifted by a constant give the same distribution. */
    float shifted[5];
    for (int i = 0; i < 5; i++)
        shifted[i] = p[i] + 42.0f;
    CHECK(fabs(kvs_eval_kl(p, lp, shifted, kvs_eval_logsumexp(shifted, 5), 5)) < 1e-6);

    /* A zero-probability entry of P contributes nothing (even where Q is -inf). */
    const float pm[3] = {0, 0, -INFINITY}, qm[3] = {0, -INFINITY, 0};
    double a = kvs_eval_kl(pm, kvs_eval_logsumexp(pm, 3), pm, kvs_eval_logsumexp(pm, 3), 3);
    CHECK(a == 0.0);
    CHECK(isinf(kvs_eval_kl(pm, kvs_eval_logsumexp(pm, 3), qm, kvs_eval_logsumexp(qm, 3), 3)));

    const float ties[4] = {1, 3, 3, 2};
    CHECK(kvs_eval_argmax(ties, 4) == 1);
    CHECK(kvs_eval_argmax(p, 5) == 2);
}

static int read_tokens(const char *path, int32_t *out, int max)
{
    return check_read_tokens(path, out, max); /* int32_t is int on every supported target */
}

static void count_notice(void *ctx, const char *msg)
{
    (void)msg;
    ++*(int *)ctx;
}

/* Storage types: the reference ignores the setup's kv_type (always the full F32 cache), and
 * the evaluated runs use it, naming it in their rows. */
static void test_storage_types(const kvs_model *m, const kvs_eval_setup *s,
                               const kvs_eval_ref *ref, const kvs_eval_result *full)
{
    kvs_error err = {0};
    static kvs_eval_result r; /* (results hold their report lines: keep them off the stack) */
    CHECK(!strcmp(full->kv_type, "f32"));
    CHECK(full->kv_bytes_end == full->kv_bytes && full->kv_bytes_end > 0);
    CHECK(full->kv_bytes_rel_f16 == full->kv_bytes_mean / full->kv_bytes_full_f16);
    CHECK(full->n_report == 0 && full->report[0] == 0);

    /* The reference with kv_type set to KIVI-2 is still the full F32 cache, to the bit. */
    const char *types[] = {"kivi2", "f16", "kivi:kbits=4,vbits=2"};
    for (int i = 0; i < 3; i++) {
        kvs_eval_setup ts = *s;
        ts.kv_type = types[i];
        kvs_eval_ref again;
        CHECK(kvs_eval_reference(m, &ts, &again, &r, &err) == KVS_OK);
        CHECKF(!strcmp(r.kv_type, "f32") && r.kl == 0.0 && r.ppl == full->ppl &&
                   r.kv_bytes_mean == full->kv_bytes_mean,
               "%s: reference on %s, ppl %.9g vs %.9g", types[i], r.kv_type, r.ppl, full->ppl);
        CHECK(again.n_rows == ref->n_rows &&
              !memcmp(again.logits, ref->logits,
                      sizeof(float) * (size_t)ref->n_rows * (size_t)ref->n_vocab));
        kvs_eval_ref_free(&again);

        /* The full policy on that storage: a row of its own, compared with the F32 cache. */
        CHECK(kvs_eval_policy(m, &ts, ref, "full", &r, &err) == KVS_OK);
        CHECKF(!strcmp(r.kv_type, types[i]) && r.kl > 0 && r.kl < 0.5, "%s: kl %g",
               types[i], r.kl);
        CHECKF(r.kv_bytes_mean < full->kv_bytes_mean && r.kv_bytes_end > 0 &&
                   r.kv_bytes_rel_f16 == r.kv_bytes_mean / r.kv_bytes_full_f16 &&
                   r.kv_bytes_full_f16 == full->kv_bytes_full_f16,
               "%s: %g bytes vs %g", types[i], r.kv_bytes_mean, full->kv_bytes_mean);
        CHECK(kvs_eval_check_policy(m, &ts, "streaming:slots=8", &err) == KVS_OK);
    }
    /* F16 is close to exact; the half-size cache. */
    kvs_eval_setup f16 = *s;
    f16.kv_type = "f16";
    CHECK(kvs_eval_policy(m, &f16, ref, "full", &r, &err) == KVS_OK);
    CHECKF(r.kl < 1e-4 && r.top1 == 1.0, "f16: kl %g top1 %g", r.kl, r.top1);
    CHECK(r.kv_bytes_end < full->kv_bytes_end / 2 + full->kv_bytes_end / 8);

    /* A bad type fails the check, naming it. */
    kvs_eval_setup bad = *s;
    bad.kv_type = "q9";
    CHECK(kvs_eval_check_policy(m, &bad, "full", &err) == KVS_ERR_ARG);
    CHECKF(strstr(err.msg, "'q9'") != NULL, "%s", err.msg);

    /* The policy's report lines (HashEvict reports its per-step costs). */
    if (kvs_eval_policy(m, s, ref, "hashevict:slots=16", &r, &err) == KVS_OK) {
        CHECKF(r.n_report >= 1 && strstr(r.report, "hashevict:slots=16 timing") == r.report,
               "%d lines: %s", r.n_report, r.report);
        int lines = 1;
        for (const char *p = r.report; *p; p++)
            lines += *p == '\n';
        CHECK(lines == r.n_report && r.report[strlen(r.report) - 1] != '\n');
    } else {
        CHECKF(0, "hashevict: %s", err.msg);
    }
}

static void test_protocol(void)
{
    char path[1024];
    kvs_error err = {0};
    kvs_model *m = NULL;
    int32_t tokens[48];
    int n = read_tokens(check_shared_path(path, sizeof path,
                                          "models/golden/stories260K-sample-512.tokens"),
                        tokens, 48);
    CHECK(n == 48);
    if (kvs_model_load(check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"),
                       &m, &err) != KVS_OK || n != 48) {
        fprintf(stderr, "skipping the protocol tests: %s\n", err.msg);
        check_failed++;
        kvs_model_free(m);
        return;
    }
    kvs_eval_setup s = {.tokens = tokens, .n_tokens = 48, .prompt_len = 32, .n_threads = 2,
                        .chunk = 8};
    kvs_eval_ref ref;
    kvs_eval_result full, again, st, one;
    CHECK(kvs_eval_reference(m, &s, &ref, &full, &err) == KVS_OK);
    CHECK(ref.n_rows == 15 && full.n_rows == 15 && full.n_steps == 16);
    CHECK(full.kl == 0.0 && full.top1 == 1.0 && full.ppl == full.ppl_full);
    CHECK(full.slots_kept == 32 && fabs(full.slots_attended_mean - 40.5) < 1e-9);
    CHECK(fabs(full.attn_recall - 1.0) < 1e-9);
    CHECK(full.kind == KVS_KIND_FULL && !strcmp(full.params, "full"));
    CHECK(full.kv_bytes_full_f16 > 0 && full.kv_bytes >= full.kv_bytes_mean);
    CHECK(isfinite(full.ppl) && full.ppl > 1);

    /* The full policy again, through kvs_eval_policy: the same path gives the same logits. */
    CHECK(kvs_eval_policy(m, &s, &ref, "full", &again, &err) == KVS_OK);
    CHECKF(again.kl == 0.0 && again.top1 == 1.0 && again.ppl == full.ppl, "kl %g", again.kl);

    CHECK(kvs_eval_policy(m, &s, &ref, "streaming:slots=8", &st, &err) == KVS_OK);
    CHECKF(st.kl > 0 && st.top1 <= 1.0, "kl %g", st.kl);
    CHECK(st.slots_kept == 8 && st.budget_slots == 8 && fabs(st.slots_attended_mean - 8) < 1e-9);
    CHECK(st.attn_recall < 1.0 && st.kv_bytes_mean < full.kv_bytes_mean);
    CHECK(st.ppl_full == full.ppl && st.kind == KVS_KIND_EVICTING);

    /* A fraction below StreamingLLM's 4 sinks + 1 (0.1 x 32 = 3 slots) is raised to 5 slots,
     * with a notice through the setup's log. */
    {
        int notices = 0;
        kvs_eval_setup ls = s;
        ls.log = count_notice;
        ls.log_ctx = &notices;
        kvs_eval_result low;
        CHECK(kvs_eval_policy(m, &ls, &ref, "streaming:budget=0.1", &low, &err) == KVS_OK);
        CHECKF(low.budget_slots == 5 && low.slots_kept == 5 && notices == 1, "%d slots, %d notices",
               low.budget_slots, notices);
    }

    /* budget=1.0 is the whole prompt, not one token, and its text says so. */
    CHECK(kvs_eval_policy(m, &s, &ref, "streaming:budget=1.0", &one, &err) == KVS_OK);
    CHECKF(one.budget_slots == 32 && one.slots_kept == 32, "%d", one.budget_slots);
    CHECKF(!strcmp(one.params, "streaming:budget=1.0"), "%s", one.params);

    /* Bad setups. */
    kvs_eval_result r;
    kvs_eval_setup bad = s;
    bad.prompt_len = 47;
    CHECK(kvs_eval_policy(m, &bad, &ref, "full", &r, &err) == KVS_ERR_ARG);
    CHECK(strstr(err.msg, "prompt length 47") != NULL);
    bad.prompt_len = 0;
    CHECK(kvs_eval_policy(m, &bad, &ref, "full", &r, &err) == KVS_ERR_ARG);
    bad = s;
    bad.prompt_len = 30; /* a different row count than the reference */
    CHECK(kvs_eval_policy(m, &bad, &ref, "full", &r, &err) == KVS_ERR_ARG);
    CHECK(kvs_eval_policy(m, &s, &ref, "nope", &r, &err) == KVS_ERR_ARG);
    CHECK(strstr(err.msg, "unknown policy 'nope'") != NULL);
    int32_t oov[48];
    memcpy(oov, tokens, sizeof oov);
    oov[40] = 100000;
    bad = s;
    bad.tokens = oov;
    CHECK(kvs_eval_policy(m, &bad, &ref, "full", &r, &err) == KVS_ERR_ARG);
    CHECK(strstr(err.msg, "token id 100000 (token 41") != NULL);

    test_storage_types(m, &s, &ref, &full);

    kvs_eval_ref_free(&ref);
    kvs_model_free(m);
}

int main(void)
{
    test_math();
    test_protocol();
    return check_summary("test_eval");
}
