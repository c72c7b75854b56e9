/* kvslim eval: fidelity of KV policies against the full cache, teacher-forced on a token file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command eval_cmd = {
    "eval", CMD_EVAL,
    "usage: kvslim eval -m MODEL --tokens FILE --prompt-len N --kv SPEC [--kv SPEC ...]\n"
    "                   [--budget B1,B2,...] [--equal-memory] [--kv-type f32|f16] [-t N]\n"
    "                   [--chunk N] [--json OUT] [--csv OUT] [--plot OUT.png]\n"
    "\n"
    "Measures how far each KV policy's next-token distributions move from the full cache's.\n"
    "For T tokens in FILE, every run prefills tokens 0..N-1 as the prompt, then feeds N..T-1\n"
    "one at a time (teacher-forced). The logits after feeding token t, t = N..T-2, are scored\n"
    "(each predicts token t+1). The full cache is always run once, on the same path, as the\n"
    "reference; it is shown once, as the table's first row.\n"
    "\n"
    "Columns: KL = mean KL(full || policy) in nats; top-1 = share of rows whose argmax\n"
    "matches the full cache's; ppl, ppl_full = perplexity of tokens N+1..T-1; attn recall =\n"
    "share of the full softmax mass on the attended slots (mean over decode steps); slots\n"
    "kept = live slots per (layer, KV head) right after the prompt; slots attended = mean per\n"
    "layer and query head over the decode steps; KV bytes = sampled after every decode step\n"
    "(kv_bytes is their maximum, kv_bytes_mean their mean; kv_bytes_full_f16 the mean size a\n"
    "full F16 cache would have at the same points).\n"
    "\n"
    "Every spec is checked against the model and the prompt before the first run. Each finished\n"
    "run prints one line on stderr, and --json/--csv are rewritten after every run, so an\n"
    "interrupted eval keeps what it measured; the table (stdout) and the plot come at the end.\n"
    "\n",
    NULL};

/* One row of output. */
typedef struct row {
    kvs_eval_result r;
    char label[48];       /* budget column of the table */
    int eq;               /* an equal-memory run */
    char eq_of[1024];     /* the one-shot runs it matches, space-separated */
} row;

/* The rows so far; every row goes in through rows_append, the one place that grows it. */
typedef struct row_list {
    row *v;
    int n, cap;
} row_list;

static int rows_append(row_list *rs, const row *rw)
{
    if (rs->n == rs->cap) {
        int cap = rs->cap ? 2 * rs->cap : 16;
        row *p = realloc(rs->v, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        rs->v = p;
        rs->cap = cap;
    }
    rs->v[rs->n++] = *rw;
    return 0;
}

static const char *kind_name(kvs_policy_kind k)
{
    switch (k) {
    case KVS_KIND_FULL: return "full";
    case KVS_KIND_EVICTING: return "evicting";
    case KVS_KIND_ONE_SHOT: return "one-shot";
    case KVS_KIND_SELECTION: return "selection";
    case KVS_KIND_MERGING: return "merging";
    }
    return "";
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.10g", v);
    else
        fputs("null", f);
}

static void json_str(FILE *f, const char *s)
{
    char buf[4096];
    fprintf(f, "\"%s\"", cli_json_escape(buf, sizeof buf, s));
}

static void csv_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static char *to_json(const row *rows, int n, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    fputs("[\n", f);
    for (int i = 0; i < n; i++) {
        const kvs_eval_result *r = &rows[i].r;
        fputs("  {\"policy\": ", f);
        json_str(f, r->policy);
        fputs(", \"params\": ", f);
        json_str(f, r->params);
        fputs(", \"budget\": ", f);
        if (r->budget > 0)
            json_num(f, r->budget);
        else
            fputs("null", f);
        fputs(", \"kl\": ", f);
        json_num(f, r->kl);
        fputs(", \"top1\": ", f);
        json_num(f, r->top1);
        fputs(", \"ppl\": ", f);
        json_num(f, r->ppl);
        fputs(", \"ppl_full\": ", f);
        json_num(f, r->ppl_full);
        fputs(", \"attn_recall\": ", f);
        json_num(f, r->attn_recall);
        fputs(", \"slots_attended_mean\": ", f);
        json_num(f, r->slots_attended_mean);
        fprintf(f, ", \"kv_bytes\": %zu, \"kv_bytes_mean\": ", r->kv_bytes);
        json_num(f, r->kv_bytes_mean);
        fputs(", \"kv_bytes_full_f16\": ", f);
        json_num(f, r->kv_bytes_full_f16);
        fputs(", \"slots_kept\": ", f);
        json_num(f, r->slots_kept);
        fprintf(f, ", \"budget_slots\": %d, \"budget_label\": ", r->budget_slots);
        json_str(f, rows[i].label);
        fputs(", \"kind\": ", f);
        json_str(f, kind_name(r->kind));
        fputs(", \"equal_memory_of\": ", f);
        if (rows[i].eq)
            json_str(f, rows[i].eq_of);
        else
            fputs("null", f);
        fprintf(f, ", \"kv_bytes_peak_run\": %zu, \"rows\": %d, \"seconds\": ",
                r->kv_bytes_peak_run, r->n_rows);
        json_num(f, r->seconds);
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fputs("]\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static char *to_csv(const row *rows, int n, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    fputs("policy,params,budget,kl,top1,ppl,ppl_full,attn_recall,slots_attended_mean,kv_bytes,"
          "kv_bytes_mean,kv_bytes_full_f16,slots_kept,budget_slots,budget_label,kind,"
          "equal_memory_of,kv_bytes_peak_run,rows,seconds\n",
          f);
    for (int i = 0; i < n; i++) {
        const kvs_eval_result *r = &rows[i].r;
        csv_str(f, r->policy);
        fputc(',', f);
        csv_str(f, r->params);
        fputc(',', f);
        if (r->budget > 0)
            fprintf(f, "%.10g", r->budget);
        fprintf(f, ",%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,%zu,%.10g,%.10g,%.10g,%d,", r->kl,
                r->top1, r->ppl, r->ppl_full, r->attn_recall, r->slots_attended_mean,
                r->kv_bytes, r->kv_bytes_mean, r->kv_bytes_full_f16, r->slots_kept,
                r->budget_slots);
        csv_str(f, rows[i].label);
        fputc(',', f);
        csv_str(f, kind_name(r->kind));
        fputc(',', f);
        csv_str(f, rows[i].eq ? rows[i].eq_of : "");
        fprintf(f, ",%zu,%d,%.4f\n", r->kv_bytes_peak_run, r->n_rows, r->seconds);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_table(FILE *f, const row *rows, int n)
{
    fputs("| policy | budget | slots kept at prompt end | mean slots attended | KL | top-1 | ppl "
          "| ppl_full | attn recall | KV bytes mean | KV bytes vs full F16 |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|\n",
          f);
    for (int i = 0; i < n; i++) {
        const kvs_eval_result *r = &rows[i].r;
        char name[256], kept[32], bytes[32];
        kvs_eval_policy_label(r->params, name, sizeof name);
        if (r->slots_kept == floor(r->slots_kept))
            snprintf(kept, sizeof kept, "%.0f", r->slots_kept);
        else
            snprintf(kept, sizeof kept, "%.1f", r->slots_kept);
        fprintf(f, "| %s | %s | %s | %.1f | %.4f | %.3f | %.3f | %.3f | %.4f | %s | %.3f |\n",
                name, rows[i].label, kept, r->slots_attended_mean, r->kl, r->top1, r->ppl,
                r->ppl_full, r->attn_recall, cli_bytes(bytes, sizeof bytes, r->kv_bytes_mean),
                r->kv_bytes_full_f16 > 0 ? r->kv_bytes_mean / r->kv_bytes_full_f16 : 0.0);
    }
}

typedef struct progress_ctx {
    char label[320];
} progress_ctx;

static void on_progress(void *ctx, int done, int total)
{
    cli_progress(((progress_ctx *)ctx)->label, done, total);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Everything one eval holds. */
typedef struct eval_state {
    const char *model_path, *tokens_path, *kv_type, *json_path, *csv_path, *plot_path;
    int prompt_len, equal_memory;
    kvs_eval_plan plan; /* the runs, from --kv and --budget (eval/plan.h) */
    int32_t *ids;
    int n_ids;
    kvs_model *m;
    kvs_eval_setup setup;
    kvs_eval_ref ref;
    row_list rows;
    progress_ctx pc;
    kvs_error err;
    /* Destinations: a regular file is rewritten after every run; a FIFO, device or stdout
     * ("through") gets one document, at the end. */
    kvs_outfile_input inputs[2];
    kvs_outfile_spec json_out, csv_out, plot_out;
    kvs_outfile_kind json_kind, csv_kind;
} eval_state;

static void eval_free(eval_state *e)
{
    kvs_eval_plan_free(&e->plan);
    free(e->ids);
    kvs_eval_ref_free(&e->ref);
    kvs_model_free(e->m);
    free(e->rows.v);
}

/* The runs of --kv x --budget (eval/plan.h), every spec parsed. */
static int make_plan(const char *cmd, const cli_args *a, eval_state *e)
{
    int n_kv = a->given[FL_KV];
    const char **kv = malloc(sizeof *kv * (size_t)n_kv);
    if (!kv) {
        cli_error(cmd, "out of memory");
        return CLI_FAIL;
    }
    for (int k = 0; k < n_kv; k++)
        kv[k] = cli_each(a, FL_KV, k);
    kvs_status st = kvs_eval_plan_make(&e->plan, kv, n_kv,
                                       a->given[FL_BUDGET] ? a->str[FL_BUDGET] : NULL,
                                       e->equal_memory, &e->err);
    free(kv);
    if (st != KVS_OK) {
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    return CLI_OK;
}

/* The token file against --prompt-len, the model, and every planned run against both. */
static int load_and_check(const char *cmd, const cli_args *a, eval_state *e, int threads)
{
    if (cli_read_tokens(cmd, e->tokens_path, &e->ids, &e->n_ids) != 0)
        return CLI_FAIL;
    if (e->n_ids < 3) {
        cli_error(cmd, "%s has %d token%s; eval needs at least 3: a prompt and two more (one to "
                       "feed, one to score)", e->tokens_path, e->n_ids, e->n_ids == 1 ? "" : "s");
        return CLI_USAGE;
    }
    if (e->prompt_len > e->n_ids - 2) {
        cli_error(cmd, "--prompt-len %s is out of range: %s has %d tokens, so the prompt must "
                       "be 1..%d (at least one scored row needs two tokens after it)",
                  a->str[FL_PROMPT_LEN], e->tokens_path, e->n_ids, e->n_ids - 2);
        return CLI_USAGE;
    }
    e->setup = (kvs_eval_setup){.tokens = e->ids, .n_tokens = e->n_ids,
                                .prompt_len = e->prompt_len, .n_threads = threads,
                                .chunk = cli_get_int(a, FL_CHUNK, 0), .kv_type = e->kv_type,
                                .progress = on_progress, .progress_ctx = &e->pc,
                                .log = cli_notice, .log_ctx = (void *)cmd};
    kvs_status st;
    if ((st = kvs_model_load(e->model_path, &e->m, &e->err)) != KVS_OK) {
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    if ((st = kvs_eval_check_setup(e->m, &e->setup, &e->err)) != KVS_OK) {
        /* name the token file, unless the message already does */
        if (strstr(e->err.msg, e->tokens_path))
            cli_error(cmd, "%s", e->err.msg);
        else
            cli_error(cmd, "%s: %s", e->tokens_path, e->err.msg);
        return cli_status_exit(st);
    }
    for (int j = 0; j < e->plan.jobs.n; j++)
        if ((st = kvs_eval_check_policy(e->m, &e->setup, e->plan.jobs.v[j].spec, &e->err)) !=
            KVS_OK) {
            cli_error(cmd, "%s", e->err.msg);
            return cli_status_exit(st);
        }
    return CLI_OK;
}

/* Rewrites --json and --csv with every row so far (final: the last call; "through"
 * destinations are written only then). */
static int save_rows(const char *cmd, const eval_state *e, int final)
{
    char *buf;
    size_t len;
    if (e->json_path && (final || e->json_kind != KVS_OUTFILE_THROUGH)) {
        if (!(buf = to_json(e->rows.v, e->rows.n, &len))) {
            cli_error(cmd, "out of memory");
            return -1;
        }
        int rc = cli_write_output(cmd, &e->json_out, buf, len);
        free(buf);
        if (rc != 0)
            return -1;
    }
    if (e->csv_path && (final || e->csv_kind != KVS_OUTFILE_THROUGH)) {
        if (!(buf = to_csv(e->rows.v, e->rows.n, &len))) {
            cli_error(cmd, "out of memory");
            return -1;
        }
        int rc = cli_write_output(cmd, &e->csv_out, buf, len);
        free(buf);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* One run (spec NULL: the reference) appended as a row, saved, and reported on stderr. */
static int run_one(const char *cmd, eval_state *e, const char *spec, const char *tag,
                   row *rw)
{
    snprintf(e->pc.label, sizeof e->pc.label, "eval %s %.280s", tag, spec ? spec : "full");
    kvs_status st = spec ? kvs_eval_policy(e->m, &e->setup, &e->ref, spec, &rw->r, &e->err)
                         : kvs_eval_reference(e->m, &e->setup, &e->ref, &rw->r, &e->err);
    if (st != KVS_OK) {
        cli_progress_end();
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    cli_progress_line("eval %s %s done in %.1f s", tag, spec ? spec : "full", rw->r.seconds);
    if (rows_append(&e->rows, rw) != 0) {
        cli_error(cmd, "out of memory");
        return CLI_FAIL;
    }
    return save_rows(cmd, e, 0) == 0 ? CLI_OK : CLI_FAIL;
}

/* --equal-memory after one budget group (rows first..last-1): the runs the plan derives from
 * the group's one-shot rows (eval/plan.h), each a row naming the one-shot runs it matches. */
static int run_equal_memory(const char *cmd, eval_state *e, int first, int last)
{
    kvs_eval_jobs eq = {0};
    int rc = CLI_OK;
    for (int k = first; k < last && rc == CLI_OK; k++) {
        kvs_status st = kvs_eval_plan_equal_memory(&e->plan, &e->rows.v[k].r, &eq, &e->err);
        if (st != KVS_OK) {
            cli_error(cmd, "%s", e->err.msg);
            rc = cli_status_exit(st);
        }
    }
    for (int j = 0; j < eq.n && rc == CLI_OK; j++) {
        row rw = {.eq = 1};
        snprintf(rw.label, sizeof rw.label, "%s", eq.v[j].label);
        snprintf(rw.eq_of, sizeof rw.eq_of, "%s", eq.v[j].equal_memory_of);
        rc = run_one(cmd, e, eq.v[j].spec, "[equal memory]", &rw);
    }
    kvs_eval_jobs_free(&eq);
    return rc;
}

static int make_plot(const char *cmd, const eval_state *e)
{
    int n = e->rows.n;
    kvs_eval_result *res = malloc(sizeof *res * (size_t)n);
    int *eq = malloc(sizeof *eq * (size_t)n);
    void *png = NULL;
    size_t png_len = 0;
    kvs_error err = {0};
    kvs_status st = KVS_ERR_NOMEM;
    if (res && eq) {
        for (int i = 0; i < n; i++) {
            res[i] = e->rows.v[i].r;
            eq[i] = e->rows.v[i].eq;
        }
        char title[512];
        snprintf(title, sizeof title, "kvslim eval: %.150s, %.150s, prompt %d of %d tokens, "
                 "KV %s", base_name(e->model_path), base_name(e->tokens_path), e->prompt_len,
                 e->n_ids, e->kv_type ? e->kv_type : "f32");
        st = kvs_eval_plot(res, eq, n, title, &png, &png_len, &err);
    } else {
        kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
    }
    free(res);
    free(eq);
    int rc = CLI_OK;
    if (st != KVS_OK) {
        cli_error(cmd, "--plot %s: %s", e->plot_path, err.msg);
        rc = CLI_FAIL;
    } else if (cli_write_output(cmd, &e->plot_out, png, png_len) != 0) {
        rc = CLI_FAIL;
    }
    free(png);
    return rc;
}

static int eval(const cli_args *a)
{
    const char *cmd = "eval";
    eval_state e = {0};
    e.model_path = a->str[FL_MODEL];
    e.tokens_path = a->str[FL_TOKENS];
    e.kv_type = a->given[FL_KV_TYPE] ? a->str[FL_KV_TYPE] : cli_default_kv_type(cmd);
    e.json_path = a->str[FL_JSON];
    e.csv_path = a->str[FL_CSV];
    e.plot_path = a->str[FL_PLOT];
    e.prompt_len = cli_get_int(a, FL_PROMPT_LEN, -1);
    e.equal_memory = a->given[FL_EQUAL_MEMORY] > 0;
    if (!e.model_path || !e.tokens_path || e.prompt_len < 0 || !a->given[FL_KV]) {
        cli_error(cmd, "needs -m MODEL, --tokens FILE, --prompt-len N and at least one --kv SPEC "
                       "(see --help)");
        return CLI_USAGE;
    }
    int rc = make_plan(cmd, a, &e);
    e.inputs[0] = (kvs_outfile_input){"-m", e.model_path};
    e.inputs[1] = (kvs_outfile_input){"--tokens", e.tokens_path};
    e.json_out = cli_output("--json", e.json_path, e.inputs, 2);
    e.csv_out = cli_output("--csv", e.csv_path, e.inputs, 2);
    e.plot_out = cli_output("--plot", e.plot_path, e.inputs, 2);
    if (rc == CLI_OK && ((e.json_path && cli_check_output(cmd, &e.json_out, &e.json_kind)) ||
                         (e.csv_path && cli_check_output(cmd, &e.csv_out, &e.csv_kind)) ||
                         (e.plot_path && cli_check_output(cmd, &e.plot_out, NULL))))
        rc = CLI_FAIL;
    if (rc == CLI_OK && e.plot_path && kvs_eval_plot_check(&e.err) != KVS_OK) {
        cli_error(cmd, "--plot: %s", e.err.msg);
        rc = CLI_FAIL;
    }
    if (rc == CLI_OK)
        rc = load_and_check(cmd, a, &e, cli_threads(a));

    /* Rows: the reference, then per budget group its runs followed by its equal-memory runs. */
    int total = 1 + e.plan.jobs.n, done = 0;
    char tag[48];
    if (rc == CLI_OK) {
        row rw = {.label = "-"};
        snprintf(tag, sizeof tag, "[%d/%d]", ++done, total);
        rc = run_one(cmd, &e, NULL, tag, &rw);
    }
    for (int b = 0; b < e.plan.n_groups && rc == CLI_OK; b++) {
        int group_start = e.rows.n;
        for (int s = 0; s < kvs_eval_plan_group_size(&e.plan) && rc == CLI_OK; s++) {
            const kvs_eval_job *job = kvs_eval_plan_job(&e.plan, b, s);
            row rw = {0};
            snprintf(rw.label, sizeof rw.label, "%s", job->label);
            snprintf(tag, sizeof tag, "[%d/%d]", ++done, total);
            rc = run_one(cmd, &e, job->spec, tag, &rw);
        }
        if (rc == CLI_OK && e.equal_memory)
            rc = run_equal_memory(cmd, &e, group_start, e.rows.n);
    }
    if (rc == CLI_OK) {
        printf("kvslim eval: %s, %s: %d tokens, prompt %d, %d scored rows, KV %s\n\n",
               base_name(e.model_path), base_name(e.tokens_path), e.n_ids, e.prompt_len,
               e.ref.n_rows, e.kv_type ? e.kv_type : "f32");
        print_table(stdout, e.rows.v, e.rows.n);
        fflush(stdout);
        if (save_rows(cmd, &e, 1) != 0)
            rc = CLI_FAIL;
        if (rc == CLI_OK && e.plot_path)
            rc = make_plot(cmd, &e);
    }
    cli_progress_end();
    eval_free(&e);
    return rc;
}

int cmd_eval(int argc, char **argv) { return cli_main(&eval_cmd, eval, argc, argv); }
