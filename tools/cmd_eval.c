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
    "                   [--budget B1,B2,...] [--equal-memory] [--kv-type T1,T2,...] [-t N]\n"
    "                   [--chunk N] [--json OUT] [--csv OUT] [--plot OUT.png]\n"
    "\n"
    "Measures how far each KV policy's next-token distributions move from the full cache's.\n"
    "For T tokens in FILE, every run prefills tokens 0..N-1 as the prompt, then feeds N..T-1\n"
    "one at a time (teacher-forced). The logits after feeding token t, t = N..T-2, are scored\n"
    "(each predicts token t+1). The reference is the full cache on F32 storage, run once on\n"
    "the same path whatever --kv-type says; it is the table's first row. Every policy and\n"
    "budget runs on each --kv-type (rows grouped by type), and 'full' on a type other than\n"
    "f32 is a row of its own: what that storage alone costs.\n"
    "\n"
    "Columns: KL = mean KL(full || policy) in nats; top-1 = share of rows whose argmax\n"
    "matches the full cache's; ppl, ppl_full = perplexity of tokens N+1..T-1; attn recall =\n"
    "share of the full softmax mass on the attended slots (mean over decode steps); slots\n"
    "kept = live slots per (layer, KV head) right after the prompt; slots attended = mean per\n"
    "layer and query head over the decode steps; KV bytes = the bytes the cache holds (codes,\n"
    "scales, residual rows, positions, policy state), sampled after every decode step\n"
    "(kv_bytes is their maximum, kv_bytes_mean their mean, kv_bytes_end the last;\n"
    "kv_bytes_full_f16 the mean size a full F16 cache would have at the same points, and\n"
    "kv_bytes_rel_f16 = kv_bytes_mean / kv_bytes_full_f16, the table's last column). JSON\n"
    "\"report\" (CSV \"notes\", joined by '; ') holds the policy's own report lines.\n"
    "\n"
    "--equal-memory also follows a selection or offloading run (quest, pqcache, ...), at the\n"
    "slots it attends (equal attended slots: it holds more). A one-shot run's equal-memory\n"
    "runs use its storage type: same\n"
    "slots on the same storage, so the same bytes (the kv_bytes columns show them).\n"
    "\n"
    "Every spec is checked against the model, the prompt and each type before the first run.\n"
    "Each finished run prints one line on stderr, and --json/--csv are rewritten after every\n"
    "run, so an interrupted eval keeps what it measured; the table (stdout) and the plot come\n"
    "at the end.\n"
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
    case KVS_KIND_OFFLOADING: return "offloading";
    }
    return "";
}


/* The report lines as one CSV field, joined by "; ". */
static void csv_notes(FILE *f, const char *report)
{
    char joined[2 * KVS_EVAL_REPORT_BYTES];
    size_t n = 0;
    for (const char *p = report; *p && n + 3 < sizeof joined; p++) {
        if (*p == '\n') {
            joined[n++] = ';';
            joined[n++] = ' ';
        } else {
            joined[n++] = *p;
        }
    }
    joined[n] = 0;
    cli_csv_str(f, joined);
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
        cli_json_str(f, r->policy);
        fputs(", \"params\": ", f);
        cli_json_str(f, r->params);
        fputs(", \"kv_type\": ", f);
        cli_json_str(f, r->kv_type);
        fputs(", \"budget\": ", f);
        if (r->budget > 0)
            cli_json_num(f, r->budget);
        else
            fputs("null", f);
        fputs(", \"kl\": ", f);
        cli_json_num(f, r->kl);
        fputs(", \"top1\": ", f);
        cli_json_num(f, r->top1);
        fputs(", \"ppl\": ", f);
        cli_json_num(f, r->ppl);
        fputs(", \"ppl_full\": ", f);
        cli_json_num(f, r->ppl_full);
        fputs(", \"attn_recall\": ", f);
        cli_json_num(f, r->attn_recall);
        fputs(", \"slots_attended_mean\": ", f);
        cli_json_num(f, r->slots_attended_mean);
        fprintf(f, ", \"kv_bytes\": %zu, \"kv_bytes_mean\": ", r->kv_bytes);
        cli_json_num(f, r->kv_bytes_mean);
        fprintf(f, ", \"kv_bytes_end\": %zu, \"kv_bytes_full_f16\": ", r->kv_bytes_end);
        cli_json_num(f, r->kv_bytes_full_f16);
        fputs(", \"kv_bytes_rel_f16\": ", f);
        cli_json_num(f, r->kv_bytes_rel_f16);
        fputs(", \"slots_kept\": ", f);
        cli_json_num(f, r->slots_kept);
        fprintf(f, ", \"budget_slots\": %d, \"budget_label\": ", r->budget_slots);
        cli_json_str(f, rows[i].label);
        fputs(", \"kind\": ", f);
        cli_json_str(f, kind_name(r->kind));
        fputs(", \"equal_memory_of\": ", f);
        if (rows[i].eq)
            cli_json_str(f, rows[i].eq_of);
        else
            fputs("null", f);
        fprintf(f, ", \"kv_bytes_peak_run\": %zu, \"rows\": %d, \"seconds\": ",
                r->kv_bytes_peak_run, r->n_rows);
        cli_json_num(f, r->seconds);
        fputs(", \"report\": [", f);
        for (const char *p = r->report; *p;) {
            char line[KVS_EVAL_REPORT_BYTES];
            size_t len = strcspn(p, "\n");
            snprintf(line, sizeof line, "%.*s", (int)len, p);
            fputs(p == r->report ? "" : ", ", f);
            cli_json_str(f, line);
            p += len + (p[len] == '\n');
        }
        fprintf(f, "]}%s\n", i + 1 < n ? "," : "");
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
          "equal_memory_of,kv_bytes_peak_run,rows,seconds,kv_type,kv_bytes_end,kv_bytes_rel_f16,"
          "notes\n",
          f);
    for (int i = 0; i < n; i++) {
        const kvs_eval_result *r = &rows[i].r;
        cli_csv_str(f, r->policy);
        fputc(',', f);
        cli_csv_str(f, r->params);
        fputc(',', f);
        if (r->budget > 0)
            fprintf(f, "%.10g", r->budget);
        fprintf(f, ",%.10g,%.10g,%.10g,%.10g,%.10g,%.10g,%zu,%.10g,%.10g,%.10g,%d,", r->kl,
                r->top1, r->ppl, r->ppl_full, r->attn_recall, r->slots_attended_mean,
                r->kv_bytes, r->kv_bytes_mean, r->kv_bytes_full_f16, r->slots_kept,
                r->budget_slots);
        cli_csv_str(f, rows[i].label);
        fputc(',', f);
        cli_csv_str(f, kind_name(r->kind));
        fputc(',', f);
        cli_csv_str(f, rows[i].eq ? rows[i].eq_of : "");
        fprintf(f, ",%zu,%d,%.4f,", r->kv_bytes_peak_run, r->n_rows, r->seconds);
        cli_csv_str(f, r->kv_type);
        fprintf(f, ",%zu,%.10g,", r->kv_bytes_end, r->kv_bytes_rel_f16);
        csv_notes(f, r->report);
        fputc('\n', f);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_table(FILE *f, const row *rows, int n)
{
    fputs("| policy | kv_type | budget | slots kept at prompt end | mean slots attended | KL | "
          "top-1 | ppl | ppl_full | attn recall | KV bytes mean | KV bytes vs full F16 |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
          f);
    for (int i = 0; i < n; i++) {
        const kvs_eval_result *r = &rows[i].r;
        char name[256], kept[32], bytes[32];
        kvs_eval_policy_label(r->params, name, sizeof name);
        if (r->slots_kept == floor(r->slots_kept))
            snprintf(kept, sizeof kept, "%.0f", r->slots_kept);
        else
            snprintf(kept, sizeof kept, "%.1f", r->slots_kept);
        fprintf(f, "| %s | %s | %s | %s | %.1f | %.4f | %.3f | %.3f | %.3f | %.4f | %s | %.3f |\n",
                name, r->kv_type, rows[i].label, kept, r->slots_attended_mean, r->kl, r->top1,
                r->ppl, r->ppl_full, r->attn_recall,
                cli_bytes(bytes, sizeof bytes, r->kv_bytes_mean), r->kv_bytes_rel_f16);
    }
}

typedef struct progress_ctx {
    char label[400];
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
    const char *model_path, *tokens_path, *json_path, *csv_path, *plot_path;
    int prompt_len, equal_memory;
    kvs_eval_plan plan;   /* the runs, from --kv and --budget (eval/plan.h) */
    kvs_eval_types types; /* each run is made on each of these, from --kv-type */
    int32_t *ids;
    int n_ids;
    kvs_model *m;
    kvs_eval_setup setup;
    kvs_eval_ref ref;
    row_list rows;
    int done, total; /* runs finished and planned, for the progress tag [done/total] */
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
    kvs_eval_types_free(&e->types);
    free(e->ids);
    kvs_eval_ref_free(&e->ref);
    kvs_model_free(e->m);
    free(e->rows.v);
}

/* The values of a repeatable flag, in order (malloc'd; NULL when out of memory). */
static const char **values_of(const cli_args *a, cli_flag_id id)
{
    const char **v = malloc(sizeof *v * (size_t)(a->given[id] + 1));
    for (int k = 0; v && k < a->given[id]; k++)
        v[k] = cli_each(a, id, k);
    return v;
}

/* The --kv-type list (eval/plan.h), every type checked: first, as the flag parser checks the
 * other commands' --kv-type. None given: eval's default, f32. */
static int make_types(const char *cmd, const cli_args *a, eval_state *e)
{
    const char **types = values_of(a, FL_KV_TYPE);
    kvs_status st = types ? kvs_eval_types_make(&e->types, types, a->given[FL_KV_TYPE], &e->err)
                          : kvs_fail(&e->err, KVS_ERR_NOMEM, "out of memory");
    free(types);
    if (st != KVS_OK) {
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    return CLI_OK;
}

/* The runs of --kv x --budget (eval/plan.h), every spec parsed. */
static int make_plan(const char *cmd, const cli_args *a, eval_state *e)
{
    const char **kv = values_of(a, FL_KV);
    kvs_status st = kv ? kvs_eval_plan_make(&e->plan, kv, a->given[FL_KV],
                                            a->given[FL_BUDGET] ? a->str[FL_BUDGET] : NULL,
                                            e->equal_memory, &e->err)
                       : kvs_fail(&e->err, KVS_ERR_NOMEM, "out of memory");
    free(kv);
    if (st != KVS_OK) {
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    return CLI_OK;
}

/* One planned spec on the setup's storage type, checked; a refusal that does not name the
 * type is said to be on it. */
static int check_on_type(const char *cmd, eval_state *e, const char *spec)
{
    kvs_status st = kvs_eval_check_policy(e->m, &e->setup, spec, &e->err);
    if (st == KVS_OK)
        return CLI_OK;
    if ((e->types.n > 1 || !kvs_eval_type_is_f32(e->setup.kv_type)) &&
        !strstr(e->err.msg, e->setup.kv_type))
        cli_error(cmd, "%s (with --kv-type %s)", e->err.msg, e->setup.kv_type);
    else
        cli_error(cmd, "%s", e->err.msg);
    return cli_status_exit(st);
}

/* The token file against --prompt-len, the model, and every planned run on every type against
 * both. */
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
                                .chunk = cli_get_int(a, FL_CHUNK, 0),
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
    int rc = CLI_OK;
    for (int t = 0; t < e->types.n && rc == CLI_OK; t++) {
        e->setup.kv_type = e->types.v[t];
        if (e->plan.has_full && !kvs_eval_type_is_f32(e->types.v[t]))
            rc = check_on_type(cmd, e, "full");
        for (int j = 0; j < e->plan.plain.n && rc == CLI_OK; j++)
            rc = check_on_type(cmd, e, e->plan.plain.v[j].spec);
        for (int j = 0; j < e->plan.jobs.n && rc == CLI_OK; j++)
            rc = check_on_type(cmd, e, e->plan.jobs.v[j].spec);
    }
    e->setup.kv_type = NULL;
    return rc;
}

/* Rewrites --json and --csv with every row so far (final: the last call; "through"
 * destinations are written only then). */
static int save_rows(const char *cmd, const eval_state *e, int final)
{
    size_t len = 0;
    if (e->json_path && (final || e->json_kind != KVS_OUTFILE_THROUGH)) {
        char *buf = to_json(e->rows.v, e->rows.n, &len);
        if (cli_write_built(cmd, &e->json_out, buf, len) != 0)
            return -1;
    }
    if (e->csv_path && (final || e->csv_kind != KVS_OUTFILE_THROUGH)) {
        char *buf = to_csv(e->rows.v, e->rows.n, &len);
        if (cli_write_built(cmd, &e->csv_out, buf, len) != 0)
            return -1;
    }
    return 0;
}

/* One run (spec NULL: the reference) on the setup's storage type appended as a row, saved, and
 * reported on stderr ("[equal memory]" runs say so). */
static int run_one(const char *cmd, eval_state *e, const char *spec, row *rw)
{
    char tag[32], on[140] = "";
    if (spec && (e->types.n > 1 || !kvs_eval_type_is_f32(e->setup.kv_type)))
        snprintf(on, sizeof on, " --kv-type %.120s", e->setup.kv_type);
    if (rw->eq) /* not planned: derived from the group's results */
        snprintf(tag, sizeof tag, "[equal memory]");
    else
        snprintf(tag, sizeof tag, "[%d/%d]", ++e->done, e->total);
    snprintf(e->pc.label, sizeof e->pc.label, "eval %s %.150s%s", tag, spec ? spec : "full",
             on);
    kvs_status st = spec ? kvs_eval_policy(e->m, &e->setup, &e->ref, spec, &rw->r, &e->err)
                         : kvs_eval_reference(e->m, &e->setup, &e->ref, &rw->r, &e->err);
    if (st != KVS_OK) {
        cli_progress_end();
        cli_error(cmd, "%s", e->err.msg);
        return cli_status_exit(st);
    }
    cli_progress_line("eval %s %s%s done in %.1f s", tag, spec ? spec : "full", on,
                      rw->r.seconds);
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
        rc = run_one(cmd, e, eq.v[j].spec, &rw);
    }
    kvs_eval_jobs_free(&eq);
    return rc;
}

/* The --kv-type list as "f32, kivi4" (cut to size). */
static const char *type_list(const eval_state *e, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int t = 0; t < e->types.n && n < size; t++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", t ? ", " : "", e->types.v[t]);
    return buf;
}

/* The runs on one storage type: "full" on it when a full spec was given (unless it is f32, the
 * reference's), then per budget group its runs followed by its equal-memory runs, which are
 * made on the same type. */
static int run_type(const char *cmd, eval_state *e, const char *type)
{
    int rc = CLI_OK;
    e->setup.kv_type = type;
    if (e->plan.has_full && !kvs_eval_type_is_f32(type)) {
        row rw = {.label = "-"};
        rc = run_one(cmd, e, "full", &rw);
    }
    for (int i = 0; i < e->plan.plain.n && rc == CLI_OK; i++) {
        row rw = {.label = "-"};
        rc = run_one(cmd, e, e->plan.plain.v[i].spec, &rw);
    }
    for (int b = 0; b < e->plan.n_groups && rc == CLI_OK; b++) {
        int group_start = e->rows.n;
        for (int s = 0; s < kvs_eval_plan_group_size(&e->plan) && rc == CLI_OK; s++) {
            const kvs_eval_job *job = kvs_eval_plan_job(&e->plan, b, s);
            row rw = {0};
            snprintf(rw.label, sizeof rw.label, "%s", job->label);
            rc = run_one(cmd, e, job->spec, &rw);
        }
        if (rc == CLI_OK && e->equal_memory)
            rc = run_equal_memory(cmd, e, group_start, e->rows.n);
    }
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
        char title[768], types[256];
        snprintf(title, sizeof title, "kvslim eval: %.150s, %.150s, prompt %d of %d tokens, "
                 "KV %s", base_name(e->model_path), base_name(e->tokens_path), e->prompt_len,
                 e->n_ids, type_list(e, types, sizeof types));
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
    e.json_path = a->str[FL_JSON];
    e.csv_path = a->str[FL_CSV];
    e.plot_path = a->str[FL_PLOT];
    e.prompt_len = cli_get_int(a, FL_PROMPT_LEN, -1);
    e.equal_memory = a->given[FL_EQUAL_MEMORY] > 0;
    int rc = make_types(cmd, a, &e);
    if (rc != CLI_OK)
        return rc;
    if (!e.model_path || !e.tokens_path || e.prompt_len < 0 || !a->given[FL_KV]) {
        cli_error(cmd, "needs -m MODEL, --tokens FILE, --prompt-len N and at least one --kv SPEC "
                       "(see --help)");
        eval_free(&e);
        return CLI_USAGE;
    }
    rc = make_plan(cmd, a, &e);
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

    /* Rows: the reference, then per storage type its runs (run_type). */
    int n_full = 0;
    for (int t = 0; t < e.types.n; t++)
        n_full += e.plan.has_full && !kvs_eval_type_is_f32(e.types.v[t]);
    e.total = 1 + n_full + e.types.n * (e.plan.plain.n + e.plan.jobs.n);
    if (rc == CLI_OK) {
        row rw = {.label = "-"};
        rc = run_one(cmd, &e, NULL, &rw);
    }
    for (int t = 0; t < e.types.n && rc == CLI_OK; t++)
        rc = run_type(cmd, &e, e.types.v[t]);
    if (rc == CLI_OK) {
        char types[256];
        printf("kvslim eval: %s, %s: %d tokens, prompt %d, %d scored rows, KV %s (reference: "
               "full, f32)\n\n", base_name(e.model_path), base_name(e.tokens_path), e.n_ids,
               e.prompt_len, e.ref.n_rows, type_list(&e, types, sizeof types));
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

/* --task recall runs cmd_eval_recall.c's command; it returns -1 for any other task. */
int cmd_eval_task(int argc, char **argv);

int cmd_eval(int argc, char **argv)
{
    int rc = cmd_eval_task(argc, argv);
    return rc >= 0 ? rc : cli_main(&eval_cmd, eval, argc, argv);
}
