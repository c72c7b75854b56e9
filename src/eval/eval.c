/* Fidelity evaluation: one teacher-forced run per policy, compared row by row with the full
 * cache's run on the same path (see eval.h). */
#include "eval/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "policies/registry.h"

double kvs_eval_logsumexp(const float *x, int n)
{
    double m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > m)
            m = x[i];
    if (!isfinite(m))
        return m;
    double z = 0;
    for (int i = 0; i < n; i++)
        z += exp((double)x[i] - m);
    /* m is finite, so some x[i] == m and z >= exp(0) = 1: cppcheck does not see that the loop
     * ran (n == 0 left with m = -inf above). */
    /* cppcheck-suppress invalidFunctionArg */
    return m + log(z);
}

double kvs_eval_kl(const float *p, double p_lse, const float *q, double q_lse, int n)
{
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double lp = (double)p[i] - p_lse;
        double pi = exp(lp);
        if (pi > 0)
            kl += pi * (lp - ((double)q[i] - q_lse));
    }
    return kl;
}

int kvs_eval_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

void kvs_eval_ref_free(kvs_eval_ref *ref)
{
    if (!ref)
        return;
    free(ref->logits);
    free(ref->lse);
    memset(ref, 0, sizeof *ref);
}

kvs_status kvs_eval_check_setup(const kvs_model *m, const kvs_eval_setup *s, kvs_error *err)
{
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    if (s->n_tokens < 3)
        return kvs_fail(err, KVS_ERR_ARG,
                        "%d tokens are too few: need a prompt, a decoded token and a scored one "
                        "(at least 3)", s->n_tokens);
    if (s->prompt_len < 1 || s->prompt_len > s->n_tokens - 2)
        return kvs_fail(err, KVS_ERR_ARG,
                        "prompt length %d is out of range [1, %d] for %d tokens (at least one "
                        "scored row needs two tokens after the prompt)", s->prompt_len,
                        s->n_tokens - 2, s->n_tokens);
    if (s->n_tokens > info.n_ctx)
        return kvs_fail(err, KVS_ERR_ARG, "%d tokens exceed the model's context of %d",
                        s->n_tokens, info.n_ctx);
    for (int i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] < 0 || s->tokens[i] >= info.n_vocab)
            return kvs_fail(err, KVS_ERR_ARG,
                            "token id %d (token %d of the file) is outside the vocabulary [0, %d)",
                            s->tokens[i], i + 1, info.n_vocab);
    if (s->n_threads < 1)
        return kvs_fail(err, KVS_ERR_ARG, "threads must be >= 1, got %d", s->n_threads);
    return KVS_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The policy's report lines into res (see kvs_eval_result.report). */
static void keep_report(kvs_session *sess, kvs_eval_result *res)
{
    size_t len = 0;
    char line[512];
    for (int i = 0; i < KVS_EVAL_REPORT_LINES; i++) {
        if (kvs_session_policy_report(sess, i, line, sizeof line) != 0)
            break;
        line[strcspn(line, "\n")] = 0; /* one line each: the separator is '\n' */
        size_t n = strlen(line);
        if (len + (len > 0) + n + 1 > sizeof res->report)
            break;
        if (len > 0)
            res->report[len++] = '\n';
        memcpy(res->report + len, line, n + 1);
        len += n;
        res->n_report++;
    }
}

/* One run on kv_type storage. With fill set, each scored row is first stored into fill (the
 * reference), and the comparison is then against fill itself. */
static kvs_status run(const kvs_model *m, const kvs_eval_setup *s, const char *kv_type,
                      const char *spec_text, kvs_eval_ref *fill, const kvs_eval_ref *cmp,
                      kvs_eval_result *res, kvs_error *err)
{
    memset(res, 0, sizeof *res);
    kvs_status st = kvs_eval_check_setup(m, s, err);
    if (st != KVS_OK)
        return st;
    kvs_policy_spec spec;
    if ((st = kvs_policy_parse(spec_text, &spec, err)) != KVS_OK)
        return st;
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    const int T = s->n_tokens, N = s->prompt_len, V = info.n_vocab;
    const int n_rows = T - N - 1, n_steps = T - N;
    if (cmp && (cmp->n_rows != n_rows || cmp->n_vocab != V))
        return kvs_fail(err, KVS_ERR_ARG, "reference has %d x %d rows, this run %d x %d",
                        cmp->n_rows, cmp->n_vocab, n_rows, V);

    snprintf(res->policy, sizeof res->policy, "%s", spec.type->name);
    snprintf(res->kv_type, sizeof res->kv_type, "%s", kv_type ? kv_type : "f32");
    snprintf(res->params, sizeof res->params, "%s", spec.text);
    res->kind = spec.type->kind;
    res->budget = spec.budget;
    res->budget_is_fraction = spec.budget_is_fraction;
    res->budget_slots = spec.budget > 0 ? kvs_policy_budget_slots(&spec, N) : 0;
    res->n_rows = n_rows;
    res->n_steps = n_steps;

    kvs_session_params p = kvs_session_default_params();
    p.n_threads = s->n_threads;
    if (s->chunk > 0)
        p.chunk = s->chunk;
    p.kv_policy = spec_text; /* errors echo the spec as the user typed it */
    p.kv_type = kv_type;
    p.measure_recall = 1;
    p.log = s->log;
    p.log_ctx = s->log_ctx;
    kvs_session *sess = NULL;
    float *row = malloc(sizeof(float) * (size_t)V);
    if (!row)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    double t0 = now();
    if ((st = kvs_session_new(m, &p, &sess, err)) != KVS_OK)
        goto done;
    if ((st = kvs_session_eval(sess, s->tokens, N, NULL, 0, err)) != KVS_OK)
        goto done;
    {
        const kvs_store *store = kvs_kv_store(kvs_session_kv(sess));
        res->slots_kept =
            (double)kvs_store_total_slots(store) / ((double)info.n_layers * info.n_kv_heads);
    }

    double kl = 0, nll = 0, recall = 0, attended = 0, bytes = 0, bytes_f16 = 0;
    int agree = 0;
    for (int t = N; t < T; t++) {
        if ((st = kvs_session_eval(sess, s->tokens + t, 1, row, 0, err)) != KVS_OK)
            goto done;
        kvs_step_stats ss;
        kvs_session_last_step(sess, &ss);
        recall += ss.attn_recall;
        attended += ss.slots_attended;
        size_t b = kvs_session_kv_bytes(sess);
        bytes += (double)b;
        res->kv_bytes_end = b;
        if (b > res->kv_bytes)
            res->kv_bytes = b;
        bytes_f16 += (double)kvs_session_kv_bytes_full_f16(sess);
        if (t <= T - 2) {
            const int r = t - N;
            const double lse = kvs_eval_logsumexp(row, V);
            if (fill) {
                memcpy(fill->logits + (size_t)r * V, row, sizeof(float) * (size_t)V);
                fill->lse[r] = lse;
            }
            const float *ref_row = cmp->logits + (size_t)r * V;
            kl += kvs_eval_kl(ref_row, cmp->lse[r], row, lse, V);
            agree += kvs_eval_argmax(ref_row, V) == kvs_eval_argmax(row, V);
            nll += lse - (double)row[s->tokens[t + 1]];
        }
        if (s->progress)
            s->progress(s->progress_ctx, t - N + 1, n_steps);
    }
    res->kl = kl / n_rows;
    res->top1 = (double)agree / n_rows;
    res->ppl = exp(nll / n_rows);
    if (fill) {
        fill->nll = nll / n_rows;
        fill->kv_bytes_mean = bytes / n_steps;
    }
    res->ppl_full = exp(cmp->nll);
    res->attn_recall = recall / n_steps;
    res->slots_attended_mean = attended / n_steps;
    res->kv_bytes_mean = bytes / n_steps;
    res->kv_bytes_full_f16 = bytes_f16 / n_steps;
    res->kv_bytes_rel_f16 =
        res->kv_bytes_full_f16 > 0 ? res->kv_bytes_mean / res->kv_bytes_full_f16 : 0;
    res->kv_bytes_peak_run = kvs_session_kv_peak_bytes(sess);
    keep_report(sess, res);
    res->seconds = now() - t0;
done:
    kvs_session_free(sess);
    free(row);
    return st;
}

kvs_status kvs_eval_reference(const kvs_model *m, const kvs_eval_setup *s, kvs_eval_ref *ref,
                              kvs_eval_result *res, kvs_error *err)
{
    memset(ref, 0, sizeof *ref);
    kvs_status st = kvs_eval_check_setup(m, s, err);
    if (st != KVS_OK)
        return st;
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    ref->n_rows = s->n_tokens - s->prompt_len - 1;
    ref->n_vocab = info.n_vocab;
    ref->logits = malloc(sizeof(float) * (size_t)ref->n_rows * (size_t)ref->n_vocab);
    ref->lse = malloc(sizeof(double) * (size_t)ref->n_rows);
    if (!ref->logits || !ref->lse) {
        kvs_eval_ref_free(ref);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d x %d reference logits",
                        s->n_tokens - s->prompt_len - 1, info.n_vocab);
    }
    /* The full policy has no budget, so its canonical text is just the name. */
    st = run(m, s, NULL, "full", ref, ref, res, err);
    if (st != KVS_OK)
        kvs_eval_ref_free(ref);
    return st;
}

kvs_status kvs_eval_check_policy(const kvs_model *m, const kvs_eval_setup *s, const char *spec,
                                 kvs_error *err)
{
    kvs_session_params p = kvs_session_default_params();
    p.n_threads = 1;
    if (s->chunk > 0)
        p.chunk = s->chunk;
    p.kv_policy = spec;
    p.kv_type = s->kv_type;
    kvs_session *sess = NULL;
    kvs_status st = kvs_session_new(m, &p, &sess, err);
    if (st == KVS_OK) /* the policy's start hook sees the budget and the prompt length here */
        st = kvs_kv_begin_prompt(kvs_session_kv(sess), s->prompt_len, err);
    kvs_session_free(sess);
    return st;
}

kvs_status kvs_eval_policy(const kvs_model *m, const kvs_eval_setup *s, const kvs_eval_ref *ref,
                           const char *spec, kvs_eval_result *res, kvs_error *err)
{
    if (!ref || !ref->logits)
        return kvs_fail(err, KVS_ERR_ARG, "no reference run to compare with");
    return run(m, s, s->kv_type, spec, NULL, ref, res, err);
}
