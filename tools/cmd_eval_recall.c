/* kvslim eval --task recall: retrieval accuracy of KV policies on the recall model's prompt sets
 * (../shared/models/recall/README.md; one prompt's run is eval/recall.h). */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command recall_cmd = {
    "eval", CMD_EVAL_RECALL,
    "usage: kvslim eval --task recall -m MODEL [--tokenizer TOK.bin] --prompts DIR\n"
    "                   [--prompts DIR ...] --kv SPEC[,SPEC...] [--budget B1,B2,...]\n"
    "                   [--kv-type T1,T2,...] [--limit N] [--json OUT] [--csv OUT]\n"
    "                   [--plot OUT.png] [-t N] [--chunk N]\n"
    "\n"
    "Retrieval accuracy of KV policies on associative-recall prompts (the recall model,\n"
    "../shared/models/recall). A prompt set is a directory of NNN.tokens (token ids, one per\n"
    "line) and NNN.answer ('POS ID' per line: after feeding token POS, 0-based, the argmax\n"
    "of the logits must be ID). For each prompt, the context (every token before the first\n"
    "question token Q) is prefilled in one call, so the policy compresses it as a prompt;\n"
    "the rest is fed one token at a time (teacher-forced) and each answer position scored.\n"
    "A budget is a share of the context (or a slot count), per layer and KV head.\n"
    "\n"
    "One configuration is a policy x budget x KV type x prompt set; each gives one table row\n"
    "(stdout), one JSON object and one CSV row per prompt. Columns: accuracy = answers whose\n"
    "argmax is right; margin = mean of the answer's logit minus the best other logit\n"
    "(negative when wrong; 24.00 with the full cache); attended share = slots attended per\n"
    "decode step over the tokens seen so far (mean over steps, layers and query heads);\n"
    "slots attended = its numerator; needle kept = the share of the last layer's KV heads\n"
    "still holding the needle (the answer's value token: the answer position minus the\n"
    "manifest's distance) right after the context, mean over prompts ('-' without a\n"
    "manifest; JSON: per layer); KV bytes = mean over decode steps. A llama2.c\n"
    "checkpoint is converted to a temporary GGUF (F32) with its --tokenizer.\n"
    "\n"
    "--plot draws, in one PNG made at the end: per policy, budget and KV type, a heat map of\n"
    "accuracy over needle depth (rows: the manifest's depth to the nearest 0.1) x prompt set\n"
    "(columns, by context length), red 0 to green 1, each cell labelled right/answers, blank\n"
    "where no prompt fell; below them accuracy against attended share (log scale), one line\n"
    "per policy and KV type across its budgets (all prompt sets pooled).\n"
    "\n",
    NULL};

/* ---- inputs ---- */

typedef struct prompt_set {
    const char *dir;
    char label[128]; /* the directory's base name */
    kvs_recall_prompt *v;
    int n;
} prompt_set;

static void set_free(prompt_set *s)
{
    for (int i = 0; i < s->n; i++)
        kvs_recall_prompt_free(&s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The NNN of every regular NNN.tokens file in dir, sorted; -1 after printing why. */
static int list_prompts(const char *cmd, const char *dir, char ***out, int *n_out)
{
    DIR *d = opendir(dir);
    if (!d) {
        cli_error(cmd, "--prompts %s: %s", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 7 || strcmp(e->d_name + len - 7, ".tokens"))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, sizeof *p * (size_t)cap);
            if (!p)
                goto nomem;
            names = p;
        }
        if (!(names[n] = strndup(e->d_name, len - 7)))
            goto nomem;
        n++;
    }
    closedir(d);
    if (n == 0) {
        free(names);
        cli_error(cmd, "--prompts %s: no .tokens files (a prompt set holds NNN.tokens files, "
                       "each with its NNN.answer)", dir);
        return -1;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    *out = names;
    *n_out = n;
    return 0;
nomem:
    closedir(d);
    free_names(names, n);
    cli_error(cmd, "out of memory");
    return -1;
}

/* Reads, parses and checks one prompt (name: NNN in dir); manifest: the text of the set's
 * manifest.tsv, or NULL. */
static int load_prompt(const char *cmd, const char *dir, const char *name, const kvs_model *m,
                       int32_t q_id, const char *manifest, kvs_recall_prompt *p)
{
    char tpath[4096], apath[4096];
    if ((size_t)snprintf(tpath, sizeof tpath, "%s/%s.tokens", dir, name) >= sizeof tpath ||
        (size_t)snprintf(apath, sizeof apath, "%s/%s.answer", dir, name) >= sizeof apath) {
        cli_error(cmd, "--prompts %s: path too long", dir);
        return -1;
    }
    snprintf(p->name, sizeof p->name, "%s", name);
    if (cli_read_tokens(cmd, tpath, &p->tokens, &p->n_tokens) != 0)
        return -1;
    size_t len;
    char *text = cli_read_file(cmd, apath, &len);
    if (!text)
        return -1;
    kvs_error err = {0};
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    kvs_status st = kvs_recall_parse_answers(text, apath, &p->answers, &p->n_answers, &err);
    free(text);
    if (st == KVS_OK)
        st = kvs_recall_prompt_check(p, info.n_vocab, info.n_ctx, q_id, tpath, apath, &err);
    p->depth = -1;
    p->distance = -1;
    if (st == KVS_OK && manifest) {
        char mpath[4096];
        snprintf(mpath, sizeof mpath, "%s/manifest.tsv", dir);
        st = kvs_recall_manifest_find(manifest, mpath, name, &p->depth, &p->distance, &err);
    }
    if (st != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return -1;
    }
    return 0;
}

static int load_set(const char *cmd, const char *dir, int limit, const kvs_model *m, int32_t q_id,
                    prompt_set *s)
{
    s->dir = dir;
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        len--;
    const char *b = dir + len;
    while (b > dir && b[-1] != '/')
        b--;
    snprintf(s->label, sizeof s->label, "%.*s", (int)(dir + len - b), b);
    char **names;
    int n_names;
    if (list_prompts(cmd, dir, &names, &n_names) != 0)
        return -1;
    int n = limit > 0 && n_names > limit ? limit : n_names;
    int rc = (s->v = calloc((size_t)n, sizeof *s->v)) ? 0 : -1;
    if (rc)
        cli_error(cmd, "out of memory");
    /* manifest.tsv is optional: it adds each prompt's needle depth and distance to the CSV */
    char mpath[4096];
    char *manifest = NULL;
    size_t mlen;
    struct stat sb;
    snprintf(mpath, sizeof mpath, "%s/manifest.tsv", dir);
    if (rc == 0 && stat(mpath, &sb) == 0 && !(manifest = cli_read_file(cmd, mpath, &mlen)))
        rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = load_prompt(cmd, dir, names[i], m, q_id, manifest, &s->v[i]);
        s->n = i + 1; /* freed by set_free even when half loaded */
    }
    free(manifest);
    free_names(names, n_names);
    return rc;
}

/* The question token: the vocabulary's piece "Q". */
static int32_t find_question(const kvs_model *m)
{
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    for (int id = 0; id < info.n_vocab; id++) {
        int len;
        const char *t = kvs_token_text(m, -1, id, &len);
        if (len == 1 && t[0] == 'Q')
            return id;
    }
    return -1;
}

/* ---- --kv-type list ---- */

/* Splits "f32,f16,kivi:kbits=4,vbits=2" at the commas that start a new type: kivi:... has
 * commas of its own, so a piece holding '=' continues the type before it unless it begins
 * with "kivi:". */
static int split_types(const char *v, char ***out, int *n_out)
{
    char **t = NULL;
    int n = 0;
    for (const char *p = v; *p;) {
        const char *end = p;
        for (;;) {
            end += strcspn(end, ",");
            if (!*end)
                break;
            const char *next = end + 1;
            size_t w = strcspn(next, ",");
            int new_type = !strncmp(next, "kivi:", 5) || !memchr(next, '=', w);
            if (new_type)
                break;
            end++;
        }
        char **np = realloc(t, sizeof *np * (size_t)(n + 1));
        if (!np || !(np[n] = strndup(p, (size_t)(end - p)))) {
            free_names(np ? np : t, n);
            return -1;
        }
        t = np;
        n++;
        p = *end ? end + 1 : end;
    }
    *out = t;
    *n_out = n;
    return 0;
}

/* ---- results ---- */

typedef struct config_row {
    char policy[64], params[256], label[48], kv_type[128], prompts[128];
    int n_prompts, n_answers, n_correct;
    double budget; /* as in the spec: a fraction or a slot count; 0 = none */
    double margin_mean, margin_min, attended_share, slots_attended, kv_bytes_mean, slots_kept,
        context_mean, seconds;
    int n_layer_shares;
    double layer_share[KVS_RECALL_MAX_LAYERS]; /* attended share per layer, mean over prompts */
    /* needle kept per layer (kvs_recall_result), mean over the prompts that know it; -1 if none */
    double needle_kept[KVS_RECALL_MAX_LAYERS];
    int n_needle; /* prompts with a manifest distance */
} config_row;

typedef struct prompt_row {
    int config; /* index of its configuration */
    char name[128];
    int context, n_tokens, distance;
    double depth;
    kvs_recall_answer shown[KVS_RECALL_SHOWN];
    kvs_recall_result r;
} prompt_row;

typedef struct results {
    config_row *c;
    int nc, capc;
    prompt_row *p;
    int np, capp;
} results;

/* Room for need elements in *v (capacity *cap, doubled as needed). */
static int reserve(void **v, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*v, elem * (size_t)nc);
    if (!p)
        return -1;
    *v = p;
    *cap = nc;
    return 0;
}


static double accuracy(const config_row *c)
{
    return c->n_answers ? (double)c->n_correct / c->n_answers : 0;
}

static char *to_json(const results *rs, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    fputs("[\n", f);
    for (int i = 0; i < rs->nc; i++) {
        const config_row *c = &rs->c[i];
        fputs("  {\"policy\": ", f);
        cli_json_str(f, c->policy);
        fputs(", \"params\": ", f);
        cli_json_str(f, c->params);
        fputs(", \"budget\": ", f);
        if (c->budget > 0)
            cli_json_num(f, c->budget);
        else
            fputs("null", f);
        fputs(", \"budget_label\": ", f);
        cli_json_str(f, c->label);
        fputs(", \"kv_type\": ", f);
        cli_json_str(f, c->kv_type);
        fputs(", \"prompts\": ", f);
        cli_json_str(f, c->prompts);
        fprintf(f, ", \"n_prompts\": %d, \"n_answers\": %d, \"n_correct\": %d, \"accuracy\": ",
                c->n_prompts, c->n_answers, c->n_correct);
        cli_json_num(f, accuracy(c));
        fputs(", \"margin_mean\": ", f);
        cli_json_num(f, c->margin_mean);
        fputs(", \"margin_min\": ", f);
        cli_json_num(f, c->margin_min);
        fputs(", \"attended_share\": ", f);
        cli_json_num(f, c->attended_share);
        fputs(", \"attended_share_layers\": [", f);
        for (int l = 0; l < c->n_layer_shares; l++) {
            if (l)
                fputs(", ", f);
            cli_json_num(f, c->layer_share[l]);
        }
        fputs("]", f);
        fputs(", \"needle_kept_layers\": [", f);
        for (int l = 0; l < c->n_layer_shares; l++) {
            if (l)
                fputs(", ", f);
            if (c->n_needle)
                cli_json_num(f, c->needle_kept[l]);
            else
                fputs("null", f);
        }
        fputs("]", f);
        fputs(", \"slots_attended_mean\": ", f);
        cli_json_num(f, c->slots_attended);
        fputs(", \"slots_kept_mean\": ", f);
        cli_json_num(f, c->slots_kept);
        fputs(", \"kv_bytes_mean\": ", f);
        cli_json_num(f, c->kv_bytes_mean);
        fputs(", \"context_mean\": ", f);
        cli_json_num(f, c->context_mean);
        fputs(", \"seconds\": ", f);
        cli_json_num(f, c->seconds);
        fprintf(f, "}%s\n", i + 1 < rs->nc ? "," : "");
    }
    fputs("]\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Space-separated pieces of ids (a negative id: "?"). */
static void pieces(const kvs_model *m, const int32_t *ids, int n, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len < size; i++) {
        int l;
        const char *t = ids[i] >= 0 ? kvs_token_text(m, -1, ids[i], &l) : "?";
        if (ids[i] < 0)
            l = 1;
        len += (size_t)snprintf(buf + len, size - len, "%s%.*s", i ? " " : "", l, t);
    }
}

static char *to_csv(const results *rs, const kvs_model *m, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    fputs("policy,params,budget_label,kv_type,prompts,prompt,context,n_tokens,depth,distance,"
          "n_answers,"
          "n_correct,margin_mean,margin_min,expected,predicted,attended_share,"
          "slots_attended_mean,slots_kept,needle_kept_last_layer,kv_bytes_mean,seconds\n", f);
    for (int i = 0; i < rs->np; i++) {
        const prompt_row *p = &rs->p[i];
        const config_row *c = &rs->c[p->config];
        const char *cols[] = {c->policy, c->params, c->label, c->kv_type, c->prompts, p->name};
        for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++) {
            cli_csv_str(f, cols[k]);
            fputc(',', f);
        }
        int shown = p->r.n_answers < KVS_RECALL_SHOWN ? p->r.n_answers : KVS_RECALL_SHOWN;
        int32_t want[KVS_RECALL_SHOWN];
        for (int a = 0; a < shown; a++)
            want[a] = p->shown[a].id;
        char exp[256], got[256];
        pieces(m, want, shown, exp, sizeof exp);
        pieces(m, p->r.predicted, shown, got, sizeof got);
        fprintf(f, "%d,%d,", p->context, p->n_tokens);
        if (p->depth >= 0)
            fprintf(f, "%.4f,%d,", p->depth, p->distance);
        else
            fputs(",,", f);
        fprintf(f, "%d,%d,%.6f,%.6f,", p->r.n_answers,
                p->r.n_correct, p->r.n_answers ? p->r.margin_sum / p->r.n_answers : 0.0,
                p->r.margin_min);
        cli_csv_str(f, exp);
        fputc(',', f);
        cli_csv_str(f, got);
        fprintf(f, ",%.6f,%.4f,%d,", p->r.attended_share, p->r.slots_attended, p->r.slots_kept);
        const double nk = p->r.n_layer_shares ? p->r.needle_kept[p->r.n_layer_shares - 1] : -1;
        if (nk >= 0)
            fprintf(f, "%.4f", nk);
        fprintf(f, ",%.1f,%.4f\n", p->r.kv_bytes_mean, p->r.seconds);
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_table(FILE *f, const results *rs)
{
    fputs("| prompts | policy | budget | KV type | prompts run | accuracy | margin mean | "
          "attended share | mean slots attended | needle kept | KV bytes mean |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|\n", f);
    for (int i = 0; i < rs->nc; i++) {
        const config_row *c = &rs->c[i];
        char name[256], bytes[32], kept[32] = "-";
        kvs_eval_policy_label(c->params, name, sizeof name);
        if (c->n_needle && c->n_layer_shares)
            snprintf(kept, sizeof kept, "%.1f%%", 100 * c->needle_kept[c->n_layer_shares - 1]);
        fprintf(f, "| %s | %s | %s | %s | %d | %.1f%% | %.2f | %.4f | %.1f | %s | %s |\n",
                c->prompts, name, c->label, c->kv_type, c->n_prompts, 100 * accuracy(c),
                c->margin_mean, c->attended_share, c->slots_attended, kept,
                cli_bytes(bytes, sizeof bytes, c->kv_bytes_mean));
    }
}

/* ---- the command ---- */

/* Session notices (a raised budget, ...) repeat for every prompt: the first of each
 * configuration is printed, the rest counted. */
typedef struct notice_gate {
    const char *cmd;
    int seen;
} notice_gate;

static void gated_notice(void *ctx, const char *msg)
{
    notice_gate *g = ctx;
    if (g->seen++ == 0)
        cli_notice((void *)g->cmd, msg);
}

typedef struct recall_state {
    const char *model_path, *tok_path, *json_path, *csv_path, *plot_path;
    kvs_model *m;
    prompt_set *sets;
    int n_sets;
    char **types;
    int n_types;
    kvs_eval_plan plan;
    int run_full;     /* "full" was among the --kv specs */
    results rs;
    notice_gate gate;
    kvs_recall_setup setup;
    kvs_outfile_input inputs[2];
    kvs_outfile_spec json_out, csv_out, plot_out;
    kvs_outfile_kind json_kind, csv_kind;
} recall_state;

static void state_free(recall_state *e)
{
    for (int i = 0; i < e->n_sets; i++)
        set_free(&e->sets[i]);
    free(e->sets);
    free_names(e->types, e->n_types);
    kvs_eval_plan_free(&e->plan);
    kvs_model_free(e->m);
    free(e->rs.c);
    free(e->rs.p);
}

/* Was "full" among the --kv values (a spec, or an item of a list of bare names)? */
static int wants_full(const cli_args *a)
{
    for (int k = 0; k < a->given[FL_KV]; k++) {
        const char *v = cli_each(a, FL_KV, k);
        int list = strchr(v, ',') && !strchr(v, '=') && !strchr(v, ':');
        for (const char *p = v; *p;) {
            size_t n = list ? strcspn(p, ",") : strlen(p);
            if ((n == 4 || (n > 4 && p[4] == ':')) && !strncmp(p, "full", 4))
                return 1;
            p += n;
            if (*p)
                p++;
        }
    }
    return 0;
}

static int make_plan(const char *cmd, const cli_args *a, recall_state *e)
{
    int n_kv = a->given[FL_KV];
    const char **kv = malloc(sizeof *kv * (size_t)n_kv);
    if (!kv) {
        cli_error(cmd, "out of memory");
        return CLI_FAIL;
    }
    for (int k = 0; k < n_kv; k++)
        kv[k] = cli_each(a, FL_KV, k);
    kvs_error err = {0};
    kvs_status st = kvs_eval_plan_make(&e->plan, kv, n_kv,
                                       a->given[FL_BUDGET] ? a->str[FL_BUDGET] : NULL, 0, &err);
    free(kv);
    if (st != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return cli_status_exit(st);
    }
    e->run_full = wants_full(a);
    return CLI_OK;
}

/* A policy whose dense layers (dense_layers=, Quest's) cover every layer compresses nothing. */
static void warn_dense(const char *cmd, const recall_state *e)
{
    kvs_model_info info;
    kvs_model_get_info(e->m, &info);
    for (int s = 0; s < kvs_eval_plan_group_size(&e->plan); s++) {
        const kvs_eval_job *job = kvs_eval_plan_job(&e->plan, 0, s);
        kvs_policy_spec spec;
        kvs_error err = {0};
        if (kvs_policy_parse(job->spec, &spec, &err) != KVS_OK ||
            kvs_policy_param_index(spec.type, "dense_layers") < 0)
            continue;
        int dense = (int)kvs_policy_spec_param(&spec, "dense_layers");
        if (dense >= info.n_layers)
            fprintf(stderr, "kvslim %s: warning: --kv %s: dense_layers=%d covers all %d layers "
                    "of the model, so %s compresses nothing (dense_layers=%d leaves the last "
                    "layer compressed)\n", cmd, job->spec, dense, info.n_layers,
                    spec.type->name, info.n_layers - 1);
    }
}

/* Every (KV type, spec) against the model and the shortest context, before any run. */
static int check_runs(const char *cmd, recall_state *e)
{
    int min_ctx = 0;
    for (int s = 0; s < e->n_sets; s++)
        for (int i = 0; i < e->sets[s].n; i++)
            if (!min_ctx || e->sets[s].v[i].context < min_ctx)
                min_ctx = e->sets[s].v[i].context;
    kvs_eval_setup es = {.prompt_len = min_ctx, .n_threads = 1, .chunk = e->setup.chunk};
    kvs_error err = {0};
    for (int t = 0; t < e->n_types; t++) {
        es.kv_type = e->types[t];
        for (int j = -1; j < e->plan.jobs.n; j++) {
            kvs_status st = kvs_eval_check_policy(e->m, &es, j < 0 ? "full" : e->plan.jobs.v[j].spec,
                                                  &err);
            if (st != KVS_OK) {
                if (j < 0 && !strstr(err.msg, e->types[t]))
                    cli_error(cmd, "--kv-type %s: %s", e->types[t], err.msg);
                else
                    cli_error(cmd, "%s", err.msg);
                return cli_status_exit(st);
            }
        }
    }
    return CLI_OK;
}

static int save(const char *cmd, const recall_state *e, int final)
{
    size_t len = 0;
    if (e->json_path && (final || e->json_kind != KVS_OUTFILE_THROUGH)) {
        char *buf = to_json(&e->rs, &len);
        if (cli_write_built(cmd, &e->json_out, buf, len) != 0)
            return -1;
    }
    if (e->csv_path && (final || e->csv_kind != KVS_OUTFILE_THROUGH)) {
        char *buf = to_csv(&e->rs, e->m, &len);
        if (cli_write_built(cmd, &e->csv_out, buf, len) != 0)
            return -1;
    }
    return 0;
}

/* The PNG of --plot: every prompt row of every configuration. */
static int make_plot(const char *cmd, const recall_state *e)
{
    kvs_recall_plot_row *rows = malloc(sizeof *rows * (size_t)e->rs.np);
    char title[1024];
    kvs_model_info info;
    kvs_model_get_info(e->m, &info);
    const char *base = strrchr(e->model_path, '/');
    int len = snprintf(title, sizeof title, "kvslim eval --task recall: %.200s, %d layers; prompts",
                       base ? base + 1 : e->model_path, info.n_layers);
    for (int s = 0; s < e->n_sets && len > 0 && (size_t)len < sizeof title; s++)
        len += snprintf(title + len, sizeof title - (size_t)len, "%s %.100s (%d)", s ? "," : "",
                        e->sets[s].label, e->sets[s].n);
    void *png = NULL;
    size_t png_len = 0;
    kvs_error err = {0};
    kvs_status st = KVS_ERR_NOMEM;
    if (rows) {
        for (int i = 0; i < e->rs.np; i++) {
            const prompt_row *p = &e->rs.p[i];
            const config_row *c = &e->rs.c[p->config];
            rows[i] = (kvs_recall_plot_row){c->params, c->label, c->kv_type, c->prompts,
                                            p->context, p->depth, p->r.n_answers,
                                            p->r.n_correct, p->r.attended_share,
                                            p->r.slots_attended};
        }
        st = kvs_recall_plot(rows, e->rs.np, title, &png, &png_len, &err);
    } else {
        kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
    }
    free(rows);
    if (st != KVS_OK) {
        cli_error(cmd, "--plot %s: %s", e->plot_path, err.msg);
        return CLI_FAIL;
    }
    return cli_write_built(cmd, &e->plot_out, png, png_len) == 0 ? CLI_OK : CLI_FAIL;
}

/* One configuration: spec on every prompt of set with KV type type. */
static int run_config(const char *cmd, recall_state *e, const prompt_set *set, const char *type,
                      const char *spec, const char *label, const char *tag)
{
    kvs_policy_spec ps;
    kvs_error err = {0};
    kvs_status st = kvs_policy_parse(spec, &ps, &err);
    if (st != KVS_OK || reserve((void **)&e->rs.c, &e->rs.capc, e->rs.nc + 1, sizeof *e->rs.c) ||
        reserve((void **)&e->rs.p, &e->rs.capp, e->rs.np + set->n, sizeof *e->rs.p)) {
        cli_error(cmd, "%s", st != KVS_OK ? err.msg : "out of memory");
        return st != KVS_OK ? cli_status_exit(st) : CLI_FAIL;
    }
    config_row c = {.n_prompts = set->n, .budget = ps.budget};
    snprintf(c.policy, sizeof c.policy, "%s", ps.type->name);
    snprintf(c.params, sizeof c.params, "%s", ps.text);
    snprintf(c.label, sizeof c.label, "%s", label);
    snprintf(c.kv_type, sizeof c.kv_type, "%s", type);
    snprintf(c.prompts, sizeof c.prompts, "%s", set->label);
    e->setup.kv_type = type;
    e->gate.seen = 0;
    char progress[512];
    snprintf(progress, sizeof progress, "eval %s %s %.200s %.100s", tag, set->label, spec, type);
    double margin_sum = 0;
    for (int i = 0; i < set->n; i++) {
        const kvs_recall_prompt *p = &set->v[i];
        prompt_row *pr = &e->rs.p[e->rs.np];
        memset(pr, 0, sizeof *pr);
        pr->config = e->rs.nc;
        snprintf(pr->name, sizeof pr->name, "%s", p->name);
        pr->context = p->context;
        pr->n_tokens = p->n_tokens;
        pr->depth = p->depth;
        pr->distance = p->distance;
        for (int a = 0; a < p->n_answers && a < KVS_RECALL_SHOWN; a++)
            pr->shown[a] = p->answers[a];
        if ((st = kvs_recall_run(e->m, &e->setup, spec, p, &pr->r, &err)) != KVS_OK) {
            cli_progress_end();
            cli_error(cmd, "%s/%s.tokens: %s", set->dir, p->name, err.msg);
            return cli_status_exit(st);
        }
        e->rs.np++;
        const kvs_recall_result *r = &pr->r;
        c.n_answers += r->n_answers;
        c.n_correct += r->n_correct;
        margin_sum += r->margin_sum;
        if (i == 0 || r->margin_min < c.margin_min)
            c.margin_min = r->margin_min;
        c.attended_share += r->attended_share / set->n;
        c.n_layer_shares = r->n_layer_shares;
        for (int l = 0; l < r->n_layer_shares; l++)
            c.layer_share[l] += r->layer_share[l] / set->n;
        if (r->n_layer_shares && r->needle_kept[0] >= 0) {
            c.n_needle++;
            for (int l = 0; l < r->n_layer_shares; l++)
                c.needle_kept[l] += r->needle_kept[l];
        }
        c.slots_attended += r->slots_attended / set->n;
        c.slots_kept += (double)r->slots_kept / set->n;
        c.kv_bytes_mean += r->kv_bytes_mean / set->n;
        c.context_mean += (double)p->context / set->n;
        c.seconds += r->seconds;
        cli_progress(progress, i + 1, set->n);
    }
    c.margin_mean = c.n_answers ? margin_sum / c.n_answers : 0;
    for (int l = 0; l < c.n_layer_shares && c.n_needle; l++)
        c.needle_kept[l] /= c.n_needle;
    e->rs.c[e->rs.nc++] = c;
    char more[64] = "";
    if (e->gate.seen > 1)
        snprintf(more, sizeof more, " (%d more notices like the one above)", e->gate.seen - 1);
    cli_progress_line("eval %s %s %s kv %s: accuracy %.1f%%, margin %.2f, done in %.1f s%s", tag,
                      set->label, spec, type, 100 * accuracy(&c), c.margin_mean, c.seconds, more);
    return save(cmd, e, 0) == 0 ? CLI_OK : CLI_FAIL;
}

static int run_all(const char *cmd, recall_state *e)
{
    int per = (e->run_full ? 1 : 0) + e->plan.jobs.n;
    int total = per * e->n_types * e->n_sets, done = 0, rc = CLI_OK;
    char tag[48];
    for (int s = 0; s < e->n_sets && rc == CLI_OK; s++)
        for (int t = 0; t < e->n_types && rc == CLI_OK; t++) {
            if (e->run_full) {
                snprintf(tag, sizeof tag, "[%d/%d]", ++done, total);
                rc = run_config(cmd, e, &e->sets[s], e->types[t], "full", "-", tag);
            }
            for (int b = 0; b < e->plan.n_groups && rc == CLI_OK; b++)
                for (int j = 0; j < kvs_eval_plan_group_size(&e->plan) && rc == CLI_OK; j++) {
                    const kvs_eval_job *job = kvs_eval_plan_job(&e->plan, b, j);
                    snprintf(tag, sizeof tag, "[%d/%d]", ++done, total);
                    rc = run_config(cmd, e, &e->sets[s], e->types[t], job->spec, job->label,
                                    tag);
                }
        }
    return rc;
}

static int recall(const cli_args *a)
{
    const char *cmd = "eval";
    recall_state e = {0};
    e.model_path = a->str[FL_MODEL];
    e.tok_path = a->str[FL_TOKENIZER];
    e.json_path = a->str[FL_JSON];
    e.csv_path = a->str[FL_CSV];
    e.plot_path = a->str[FL_PLOT];
    if (!e.model_path || !a->given[FL_PROMPTS] || !a->given[FL_KV]) {
        cli_error(cmd, "--task recall needs -m MODEL, at least one --prompts DIR and at least one "
                       "--kv SPEC (see kvslim eval --task recall --help)");
        return CLI_USAGE;
    }
    int rc = make_plan(cmd, a, &e);
    if (rc == CLI_OK && split_types(a->given[FL_KV_TYPE] ? a->str[FL_KV_TYPE] : "f32", &e.types,
                                    &e.n_types) != 0) {
        cli_error(cmd, "out of memory");
        rc = CLI_FAIL;
    }
    for (int t = 0; t < e.n_types && rc == CLI_OK; t++)
        if (!e.types[t][0]) {
            cli_error(cmd, "--kv-type '%s': empty item in the list", a->str[FL_KV_TYPE]);
            rc = CLI_USAGE;
        }
    e.inputs[0] = (kvs_outfile_input){"-m", e.model_path};
    e.inputs[1] = (kvs_outfile_input){"--tokenizer", e.tok_path ? e.tok_path : e.model_path};
    e.json_out = cli_output("--json", e.json_path, e.inputs, 2);
    e.csv_out = cli_output("--csv", e.csv_path, e.inputs, 2);
    e.plot_out = cli_output("--plot", e.plot_path, e.inputs, 2);
    if (rc == CLI_OK && ((e.json_path && cli_check_output(cmd, &e.json_out, &e.json_kind)) ||
                         (e.csv_path && cli_check_output(cmd, &e.csv_out, &e.csv_kind)) ||
                         (e.plot_path && cli_check_output(cmd, &e.plot_out, NULL))))
        rc = CLI_FAIL;
    kvs_error perr = {0};
    if (rc == CLI_OK && e.plot_path && kvs_eval_plot_check(&perr) != KVS_OK) {
        cli_error(cmd, "--plot: %s", perr.msg);
        rc = CLI_FAIL;
    }
    if (rc == CLI_OK)
        rc = cli_load_model(cmd, e.model_path, e.tok_path, &e.m);
    int32_t q_id = -1;
    if (rc == CLI_OK && (q_id = find_question(e.m)) < 0) {
        cli_error(cmd, "-m %s: the vocabulary has no question token 'Q' (the recall model's "
                       "prompts mark the question with it)", e.model_path);
        rc = CLI_FAIL;
    }
    if (rc == CLI_OK && !(e.sets = calloc((size_t)a->given[FL_PROMPTS], sizeof *e.sets))) {
        cli_error(cmd, "out of memory");
        rc = CLI_FAIL;
    }
    for (int s = 0; s < a->given[FL_PROMPTS] && rc == CLI_OK; s++) {
        e.n_sets = s + 1;
        if (load_set(cmd, cli_each(a, FL_PROMPTS, s), cli_get_int(a, FL_LIMIT, 0), e.m, q_id,
                     &e.sets[s]) != 0)
            rc = CLI_FAIL;
    }
    e.gate.cmd = cmd;
    e.setup = (kvs_recall_setup){.n_threads = rc == CLI_OK ? cli_threads(a) : 1,
                                 .chunk = cli_get_int(a, FL_CHUNK, 0), .log = gated_notice,
                                 .log_ctx = &e.gate};
    if (rc == CLI_OK)
        rc = check_runs(cmd, &e);
    if (rc == CLI_OK) {
        warn_dense(cmd, &e);
        rc = run_all(cmd, &e);
    }
    if (rc == CLI_OK) {
        kvs_model_info info;
        kvs_model_get_info(e.m, &info);
        const char *s = strrchr(e.model_path, '/');
        printf("kvslim eval --task recall: %s, %d layers, context %d\n\n", s ? s + 1 : e.model_path,
               info.n_layers, info.n_ctx);
        print_table(stdout, &e.rs);
        fflush(stdout);
        if (save(cmd, &e, 1) != 0)
            rc = CLI_FAIL;
        if (rc == CLI_OK && e.plot_path)
            rc = make_plot(cmd, &e);
    }
    cli_progress_end();
    state_free(&e);
    return rc;
}

int cmd_eval_task(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--task=recall") ||
            (!strcmp(argv[i], "--task") && i + 1 < argc && !strcmp(argv[i + 1], "recall")))
            return cli_main(&recall_cmd, recall, argc, argv);
        if (!strcmp(argv[i], "--task=opcount") ||
            (!strcmp(argv[i], "--task") && i + 1 < argc && !strcmp(argv[i + 1], "opcount")))
            return cmd_eval_opcount(argc, argv);
    }
    return -1;
}
