/* Fidelity evaluation of KV policies against the full cache, teacher-forced on one token
 * sequence (the protocol of ../shared/reference/fidelity-stories260K.md).
 *
 * For T tokens and a prompt of N: a fresh session per run (measure_recall on) prefills tokens
 * 0..N-1 in one kvs_session_eval call, then feeds N..T-1 one at a time. The logits after
 * feeding token t, t = N..T-2, are the scored rows (row t predicts token t+1); the row after the
 * last prompt token is not scored. The reference is a run of the same path with the "full"
 * policy on F32 storage, whatever storage the evaluated runs use, so the reference compared
 * with itself gives exactly KL 0 and top-1 1, and "full" on another storage type (f16, kivi4)
 * measures what that storage costs. Per-step statistics (attention recall, slots attended, KV
 * bytes) are sampled after each of the T - N decode steps. */
#ifndef KVS_EVAL_H
#define KVS_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "kv/policy.h"
#include "kvslim.h"

typedef struct kvs_eval_setup {
    const int32_t *tokens;
    int n_tokens;   /* T */
    int prompt_len; /* N, in [1, T - 2] */
    int n_threads;  /* >= 1 */
    int chunk;      /* prompt tokens per forward batch; 0 = the session default */
    /* Storage of the evaluated runs (kvs_eval_policy, kvs_eval_check_policy): "f32" (NULL),
     * "f16", "kivi4", "kivi2", "kivi:key=value,...". Never the reference's: that is F32. */
    const char *kv_type;
    /* Called after every decode step (done of total), if set. */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
    /* Notices of the sessions (a fractional budget raised to the policy's minimum, ...), if
     * set: see kvs_session_params.log. */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
} kvs_eval_setup;

/* The full cache's scored rows. */
typedef struct kvs_eval_ref {
    int n_rows, n_vocab;
    float *logits; /* n_rows x n_vocab */
    double *lse;   /* log-sum-exp of each row */
    double nll;    /* mean negative log-likelihood of the scored tokens */
    double kv_bytes_mean; /* mean KV bytes over the decode steps */
} kvs_eval_ref;

/* The policy's report lines kept per run (kvs_session_policy_report), and their total size. */
#define KVS_EVAL_REPORT_LINES 8
#define KVS_EVAL_REPORT_BYTES 2048

/* One (policy, budget, storage type) run. */
typedef struct kvs_eval_result {
    char policy[64];  /* the policy's name */
    char kv_type[128]; /* the storage type as given ("f32" for the reference and for NULL) */
    char params[256]; /* canonical spec text, e.g. "h2o:budget=0.1" */
    kvs_policy_kind kind;
    double budget;          /* as given in the spec: fraction or token count; 0 = none */
    int budget_is_fraction;
    int budget_slots;       /* resolved slots per (layer, KV head); 0 when none */
    int n_rows;             /* scored rows: T - N - 1 */
    int n_steps;            /* decode steps: T - N */
    double kl;              /* mean KL(full || policy), nats */
    double top1;            /* share of rows whose argmax matches the full cache's */
    double ppl, ppl_full;   /* exp(mean NLL) of tokens N+1..T-1 */
    double attn_recall;     /* mean over decode steps */
    double slots_attended_mean; /* mean over decode steps, per layer and query head */
    double slots_kept;      /* live slots per (layer, KV head) right after the prompt */
    /* KV bytes held, as the store and the policy count them (kvs_session_kv_bytes: codes,
     * scales, minima, residual rows, positions, metadata and policy state of the slots that
     * are occupied), sampled after each decode step: */
    size_t kv_bytes;        /* the largest sample */
    double kv_bytes_mean;   /* their mean */
    size_t kv_bytes_end;    /* the last sample, after the last token */
    double kv_bytes_full_f16; /* mean bytes of a full F16 cache at the same points */
    double kv_bytes_rel_f16;  /* kv_bytes_mean / kv_bytes_full_f16 (0 if that is 0) */
    size_t kv_bytes_peak_run; /* kvs_session_kv_peak_bytes at the end: whole run, including
                                 prefill and within steps */
    double seconds;         /* wall time of the run */
    /* The policy's own report lines at the end of the run (its `report` hook, what bench
     * prints: e.g. HashEvict's per-step costs, MiniCache's formula bytes), '\n'-separated,
     * n_report of them; cut at KVS_EVAL_REPORT_LINES lines or KVS_EVAL_REPORT_BYTES bytes. */
    char report[KVS_EVAL_REPORT_BYTES];
    int n_report;
} kvs_eval_result;

/* Runs the full cache on F32 storage (s->kv_type is not used) and keeps its scored rows in ref
 * (free with kvs_eval_ref_free); res gets the reference's own row (KL 0, top-1 1). */
kvs_status kvs_eval_reference(const kvs_model *m, const kvs_eval_setup *s, kvs_eval_ref *ref,
                              kvs_eval_result *res, kvs_error *err);
/* Runs one policy spec ("NAME[:key=value,...]") on s->kv_type storage and compares it with
 * ref. */
kvs_status kvs_eval_policy(const kvs_model *m, const kvs_eval_setup *s, const kvs_eval_ref *ref,
                           const char *spec, kvs_eval_result *res, kvs_error *err);
void kvs_eval_ref_free(kvs_eval_ref *ref);

/* Checks tokens, prompt length and context against the model. */
kvs_status kvs_eval_check_setup(const kvs_model *m, const kvs_eval_setup *s, kvs_error *err);

/* ---- metric math (double precision) ---- */
/* log(sum_i exp(x_i)). */
double kvs_eval_logsumexp(const float *x, int n);
/* KL(P || Q) in nats of the softmaxes of logits p and q with their log-sum-exps. */
double kvs_eval_kl(const float *p, double p_lse, const float *q, double q_lse, int n);
/* Index of the largest element (the first on ties). */
int kvs_eval_argmax(const float *x, int n);

/* ---- plot (plot.c) ---- */
/* Is gnuplot on PATH? If not, err says how to install it (gnuplot.c). */
kvs_status kvs_eval_plot_check(kvs_error *err);
/* Draws KL and top-1 against mean KV bytes relative to a full F16 cache of the same tokens
 * (kv_bytes_rel_f16, as the table), one line per configuration (policy x kv_type) across
 * budgets: colour by policy, point shape by storage type; a storage-only row (full on kivi4)
 * is a single point; rows with equal_memory[i] set are drawn as separate dashed series. KL is
 * on a log scale when it spans more than a decade; the reference (KL 0) is then left out, as
 * the panel's title says. Runs gnuplot in a temporary directory; *png (malloc'd) receives the
 * image. */
kvs_status kvs_eval_plot(const kvs_eval_result *r, const int *equal_memory, int n,
                         const char *title, void **png, size_t *png_len, kvs_error *err);

/* Checks a policy spec against the model and the prompt before any run: parses it, creates a
 * session and starts a prompt of setup->prompt_len tokens, so budget and parameter limits that
 * depend on the model or the prompt fail here (KVS_ERR_ARG) instead of after other runs. */
kvs_status kvs_eval_check_policy(const kvs_model *m, const kvs_eval_setup *s, const char *spec,
                                 kvs_error *err);

#endif
