/* kvslim eval: fidelity of KV policies against the full cache, teacher-forced on a token file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "eval/eval.h"
#include "kv/policy.h"

static const char *const help =
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
    "  -m, --model MODEL   GGUF model\n"
    "  --tokens FILE       token ids, one per line (T of them)\n"
    "  --prompt-len N      prompt tokens, 1 <= N <= T-2\n"
    "  --kv SPEC           a policy NAME[:key=value,...]; repeat for more; '--kv a,b,c' lists\n"
    "                      bare names; '--kv help' lists the policies and their parameters\n"
    "  --budget B1,B2,...  run every non-full policy at each budget (overrides a spec's own\n"
    "                      budget=); a fraction of the prompt (0.25) or a token count (96)\n"
    "  --equal-memory      also run each evicting policy given with --kv (all evicting\n"
    "                      policies if none is) at budget = round(mean slots attended) of\n"
    "                      every one-shot run; those rows have budget 'eq:<slots>' and\n"
    "                      name the one-shot runs they match (equal_memory_of)\n"
    "  --kv-type TYPE      KV storage type: f32 (default) or f16\n"
    "  -t, --threads N     threads (default: online CPUs, at most 8)\n"
    "  --chunk N           prompt tokens per forward batch (default 512)\n"
    "  --json OUT          results as a JSON array of objects (written atomically)\n"
    "  --csv OUT           results as CSV with a header line (written atomically)\n"
    "  --plot OUT.png      KL and top-1 against mean KV bytes relative to the full cache, one\n"
    "                      line per policy across budgets (needs gnuplot)\n";

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

typedef struct list {
    char **items;
    int n, cap;
} list;

static int list_add(list *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **p = realloc(l->items, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        l->items = p;
        l->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, s, len);
    c[len] = 0;
    l->items[l->n++] = c;
    return 0;
}

static void list_free(list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
}

/* Splits a comma-separated value; empty items are an error. */
static int split(const char *cmd, const char *flag, const char *v, list *out)
{
    for (const char *p = v;;) {
        size_t len = strcspn(p, ",");
        if (len == 0) {
            cli_error(cmd, "%s '%s': empty item in the list", flag, v);
            return -1;
        }
        if (list_add(out, p, len) != 0) {
            cli_error(cmd, "out of memory");
            return -1;
        }
        p += len;
        if (!*p)
            return 0;
        p++;
    }
}

/* The spec with its budget set to budget: "NAME:budget=B[,other items]". */
static int with_budget(const char *spec, const char *budget, char *out, size_t size)
{
    const char *colon = strchr(spec, ':');
    size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
    size_t len = (size_t)snprintf(out, size, "%.*s:budget=%s", (int)name_len, spec, budget);
    for (const char *p = colon ? colon + 1 : ""; *p && len < size;) {
        size_t item = strcspn(p, ",");
        if (item && strncmp(p, "budget=", 7) != 0)
            len += (size_t)snprintf(out + len, size - len, ",%.*s", (int)item, p);
        p += item;
        if (*p == ',')
            p++;
    }
    return len < size ? 0 : -1;
}

static const kvs_policy_type *spec_type(const char *spec)
{
    char name[64];
    size_t len = strcspn(spec, ":");
    if (len >= sizeof name)
        return NULL;
    memcpy(name, spec, len);
    name[len] = 0;
    return kvs_policy_find(name);
}

/* The policy column: the canonical spec without the budget item. */
static void policy_label(const kvs_eval_result *r, char *buf, size_t size)
{
    const char *colon = strchr(r->params, ':');
    size_t len = (size_t)snprintf(buf, size, "%.*s",
                                  (int)(colon ? (size_t)(colon - r->params) : strlen(r->params)),
                                  r->params);
    char sep = ':';
    for (const char *p = colon ? colon + 1 : ""; *p && len < size;) {
        size_t item = strcspn(p, ",");
        if (strncmp(p, "budget=", 7) != 0) {
            len += (size_t)snprintf(buf + len, size - len, "%c%.*s", sep, (int)item, p);
            sep = ',';
        }
        p += item;
        if (*p == ',')
            p++;
    }
}

/* Can a file be created next to path? (Checked before the runs, so a typo costs nothing.) */
static int check_writable(const char *cmd, const char *flag, const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!*path) {
        cli_error(cmd, "%s: empty path", flag);
        return -1;
    }
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK | X_OK) != 0) {
        cli_error(cmd, "%s %s: directory %s is not writable: %s", flag, path, dir,
                  strerror(errno));
        return -1;
    }
    return 0;
}

static const char *kind_name(kvs_policy_kind k)
{
    switch (k) {
    case KVS_KIND_FULL: return "full";
    case KVS_KIND_EVICTING: return "evicting";
    case KVS_KIND_ONE_SHOT: return "one-shot";
    case KVS_KIND_SELECTION: return "selection";
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
        policy_label(r, name, sizeof name);
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

int cmd_eval(int argc, char **argv)
{
    const char *cmd = "eval", *model_path = NULL, *tokens_path = NULL, *kv_type = NULL;
    const char *json_path = NULL, *csv_path = NULL, *plot_path = NULL, *v;
    int threads = cli_default_threads(), chunk = 0, prompt_len = -1, equal_memory = 0;
    list specs = {0}, budgets = {0};
    int rc = CLI_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VALUE() (v = cli_value(cmd, argc, argv, &i))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            rc = CLI_OK;
            goto out;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = VALUE()))
                goto out;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tokens_path = VALUE()))
                goto out;
        } else if (!strcmp(a, "--prompt-len")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 24, &prompt_len))
                goto out;
        } else if (!strcmp(a, "--kv")) {
            if (!VALUE())
                goto out;
            if (!strcmp(v, "help")) {
                kvs_kv_policy_help(stdout);
                rc = CLI_OK;
                goto out;
            }
            int is_list = strchr(v, ',') && !strchr(v, '=') && !strchr(v, ':');
            if (is_list ? split(cmd, "--kv", v, &specs) != 0
                        : list_add(&specs, v, strlen(v)) != 0)
                goto out;
        } else if (!strcmp(a, "--budget")) {
            if (!VALUE() || split(cmd, "--budget", v, &budgets) != 0)
                goto out;
        } else if (!strcmp(a, "--equal-memory")) {
            equal_memory = 1;
        } else if (!strcmp(a, "--kv-type")) {
            if (!(kv_type = VALUE()))
                goto out;
            if (strcmp(kv_type, "f32") && strcmp(kv_type, "f16")) {
                cli_error(cmd, "--kv-type: unknown type '%s' (f32 or f16)", kv_type);
                goto out;
            }
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 256, &threads))
                goto out;
        } else if (!strcmp(a, "--chunk")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 20, &chunk))
                goto out;
        } else if (!strcmp(a, "--json")) {
            if (!(json_path = VALUE()))
                goto out;
        } else if (!strcmp(a, "--csv")) {
            if (!(csv_path = VALUE()))
                goto out;
        } else if (!strcmp(a, "--plot")) {
            if (!(plot_path = VALUE()))
                goto out;
        } else {
            rc = cli_bad_arg(cmd, a);
            goto out;
        }
#undef VALUE
    }
    if (!model_path || !tokens_path || prompt_len < 0 || specs.n == 0) {
        cli_error(cmd, "needs -m MODEL, --tokens FILE, --prompt-len N and at least one --kv SPEC "
                       "(see --help)");
        goto out;
    }

    /* The runs, checked before any work: each non-full spec at each budget (or its own). */
    list jobs = {0}, labels = {0};
    list evicting = {0}; /* specs of evicting policies, for --equal-memory */
    kvs_error err = {0};
    for (int s = 0; s < specs.n; s++) {
        const char *spec = specs.items[s];
        const kvs_policy_type *t = spec_type(spec);
        if (t && t->kind == KVS_KIND_FULL) {
            /* The reference is always run; a full spec only has to parse. */
            if (kvs_kv_policy_check(spec, &err) != KVS_OK) {
                cli_error(cmd, "%s", err.msg);
                goto out_jobs;
            }
            continue;
        }
        int nb = budgets.n ? budgets.n : 1;
        for (int b = 0; b < nb; b++) {
            char text[512];
            const char *use = spec;
            if (budgets.n) {
                if (with_budget(spec, budgets.items[b], text, sizeof text) != 0) {
                    cli_error(cmd, "--kv %s: spec too long", spec);
                    goto out_jobs;
                }
                use = text;
            }
            kvs_policy_spec parsed;
            if (kvs_policy_parse(use, &parsed, &err) != KVS_OK) {
                cli_error(cmd, "%s", err.msg);
                goto out_jobs;
            }
            char label[48];
            if (budgets.n)
                snprintf(label, sizeof label, "%.40s", budgets.items[b]);
            else
                snprintf(label, sizeof label, "%g", parsed.budget);
            if (list_add(&jobs, use, strlen(use)) || list_add(&labels, label, strlen(label))) {
                cli_error(cmd, "out of memory");
                goto out_jobs;
            }
        }
        if (t && t->kind == KVS_KIND_EVICTING && list_add(&evicting, spec, strlen(spec))) {
            cli_error(cmd, "out of memory");
            goto out_jobs;
        }
    }
    if (equal_memory && evicting.n == 0) {
        int n_types;
        const kvs_policy_type *const *types = kvs_policy_types(&n_types);
        for (int i = 0; i < n_types; i++)
            if (types[i]->kind == KVS_KIND_EVICTING &&
                list_add(&evicting, types[i]->name, strlen(types[i]->name))) {
                cli_error(cmd, "out of memory");
                goto out_jobs;
            }
    }
    if ((json_path && check_writable(cmd, "--json", json_path)) ||
        (csv_path && check_writable(cmd, "--csv", csv_path)) ||
        (plot_path && check_writable(cmd, "--plot", plot_path)))
        goto out_jobs;
    rc = CLI_FAIL;
    if (plot_path && kvs_eval_plot_check(&err) != KVS_OK) {
        cli_error(cmd, "--plot: %s", err.msg);
        goto out_jobs;
    }

    int32_t *ids = NULL;
    int n_ids = 0;
    if (cli_read_tokens(cmd, tokens_path, &ids, &n_ids) != 0)
        goto out_jobs;
    if (prompt_len > n_ids - 2) {
        cli_error(cmd, "--prompt-len %d is out of range: %s has %d tokens, so the prompt must "
                       "be 1..%d (at least one scored row needs two tokens after it)",
                  prompt_len, tokens_path, n_ids, n_ids - 2 > 0 ? n_ids - 2 : 0);
        rc = CLI_USAGE;
        free(ids);
        goto out_jobs;
    }

    kvs_model *m = NULL;
    kvs_eval_ref ref = {0};
    row_list rs = {0};
    char *json = NULL, *csv = NULL;
    void *png = NULL;
    size_t json_len = 0, csv_len = 0, png_len = 0;
    progress_ctx pc;
    kvs_eval_setup setup = {.tokens = ids, .n_tokens = n_ids, .prompt_len = prompt_len,
                            .n_threads = threads, .chunk = chunk, .kv_type = kv_type,
                            .progress = on_progress, .progress_ctx = &pc};
    err.msg[0] = 0;
    if (kvs_model_load(model_path, &m, &err) != KVS_OK)
        goto fail;
    if (kvs_eval_check_setup(m, &setup, &err) != KVS_OK) {
        /* name the file for token problems */
        cli_error(cmd, "%s: %s", tokens_path, err.msg);
        err.msg[0] = 0;
        goto fail;
    }

    /* Rows: the reference, then per budget group its runs followed by its equal-memory runs. */
    int total = 1 + jobs.n;
    row rw;
    memset(&rw, 0, sizeof rw);
    snprintf(pc.label, sizeof pc.label, "eval [1/%d] full", total);
    if (kvs_eval_reference(m, &setup, &ref, &rw.r, &err) != KVS_OK)
        goto fail;
    cli_progress_end();
    snprintf(rw.label, sizeof rw.label, "-");
    if (rows_append(&rs, &rw) != 0)
        goto nomem;

    int nb = budgets.n ? budgets.n : 1;
    int per_budget = jobs.n / nb; /* jobs are spec-major: spec s, budget b at s * nb + b */
    int done = 1;
    for (int b = 0; b < nb; b++) {
        int group_start = rs.n;
        for (int s = 0; s < per_budget; s++) {
            int j = s * nb + b;
            snprintf(pc.label, sizeof pc.label, "eval [%d/%d] %.280s", ++done, total,
                     jobs.items[j]);
            memset(&rw, 0, sizeof rw);
            if (kvs_eval_policy(m, &setup, &ref, jobs.items[j], &rw.r, &err) != KVS_OK)
                goto fail;
            cli_progress_end();
            snprintf(rw.label, sizeof rw.label, "%s", labels.items[j]);
            if (rows_append(&rs, &rw) != 0)
                goto nomem;
        }
        if (!equal_memory)
            continue;
        int group_end = rs.n;
        for (int k = group_start; k < group_end; k++) {
            if (rs.v[k].r.kind != KVS_KIND_ONE_SHOT)
                continue;
            int slots = (int)floor(rs.v[k].r.slots_attended_mean + 0.5);
            char count[32];
            snprintf(count, sizeof count, "%d", slots);
            for (int e = 0; e < evicting.n; e++) {
                char text[512];
                if (with_budget(evicting.items[e], count, text, sizeof text) != 0) {
                    snprintf(err.msg, sizeof err.msg, "--kv %s: spec too long",
                             evicting.items[e]);
                    goto fail;
                }
                /* Equal slot counts of several one-shot runs give one row naming them all. */
                kvs_policy_spec parsed;
                if (kvs_policy_parse(text, &parsed, &err) != KVS_OK)
                    goto fail;
                int prev = -1;
                for (int q = group_end; q < rs.n && prev < 0; q++)
                    if (!strcmp(rs.v[q].r.params, parsed.text))
                        prev = q;
                if (prev >= 0) {
                    size_t len = strlen(rs.v[prev].eq_of);
                    snprintf(rs.v[prev].eq_of + len, sizeof rs.v[prev].eq_of - len, " %s",
                             rs.v[k].r.params);
                    continue;
                }
                memset(&rw, 0, sizeof rw);
                snprintf(pc.label, sizeof pc.label, "eval [equal memory] %.280s", text);
                if (kvs_eval_policy(m, &setup, &ref, text, &rw.r, &err) != KVS_OK)
                    goto fail;
                cli_progress_end();
                rw.eq = 1;
                snprintf(rw.label, sizeof rw.label, "eq:%d", slots);
                snprintf(rw.eq_of, sizeof rw.eq_of, "%s", rs.v[k].r.params);
                if (rows_append(&rs, &rw) != 0)
                    goto nomem;
            }
        }
    }
    row *rows = rs.v;
    int n_rows = rs.n;

    /* Everything is computed; build every output before writing any. */
    if (json_path && !(json = to_json(rows, n_rows, &json_len))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    if (csv_path && !(csv = to_csv(rows, n_rows, &csv_len))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    if (plot_path) {
        kvs_eval_result *res = malloc(sizeof *res * (size_t)n_rows);
        int *eq = malloc(sizeof *eq * (size_t)n_rows);
        kvs_status st = KVS_ERR_NOMEM;
        if (res && eq) {
            for (int i = 0; i < n_rows; i++) {
                res[i] = rows[i].r;
                eq[i] = rows[i].eq;
            }
            char title[512];
            snprintf(title, sizeof title, "kvslim eval: %.150s, %.150s, prompt %d of %d tokens, "
                     "KV %s", base_name(model_path), base_name(tokens_path), prompt_len, n_ids,
                     kv_type ? kv_type : "f32");
            st = kvs_eval_plot(res, eq, n_rows, ref.kv_bytes_mean, title, &png, &png_len, &err);
        } else {
            snprintf(err.msg, sizeof err.msg, "out of memory");
        }
        free(res);
        free(eq);
        if (st != KVS_OK) {
            cli_error(cmd, "--plot %s: %s", plot_path, err.msg);
            err.msg[0] = 0;
            goto fail;
        }
    }

    printf("kvslim eval: %s, %s: %d tokens, prompt %d, %d scored rows, KV %s\n\n",
           base_name(model_path), base_name(tokens_path), n_ids, prompt_len, ref.n_rows,
           kv_type ? kv_type : "f32");
    print_table(stdout, rows, n_rows);
    fflush(stdout);
    err.msg[0] = 0;
    if ((json && cli_write_file(cmd, json_path, json, json_len) != 0) ||
        (csv && cli_write_file(cmd, csv_path, csv, csv_len) != 0) ||
        (png && cli_write_file(cmd, plot_path, png, png_len) != 0))
        goto fail;
    rc = CLI_OK;
    if (0) {
nomem:
        snprintf(err.msg, sizeof err.msg, "out of memory");
    }
fail:
    cli_progress_end();
    if (rc != CLI_OK && err.msg[0])
        cli_error(cmd, "%s", err.msg);
    free(json);
    free(csv);
    free(png);
    free(rs.v);
    kvs_eval_ref_free(&ref);
    kvs_model_free(m);
    free(ids);
out_jobs:
    list_free(&jobs);
    list_free(&labels);
    list_free(&evicting);
out:
    list_free(&specs);
    list_free(&budgets);
    return rc;
}
