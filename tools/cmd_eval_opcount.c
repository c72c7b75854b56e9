/* kvslim eval --task opcount: prints (and writes as JSON) the MPC op-count model of
 * methods/mpcache.md §3.5 for a model's shape at given context lengths and budgets
 * (src/eval/opcount.h), after the token-gather comparison of its Table 2 (§3.3). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command opcount_cmd = {
    "eval", CMD_EVAL_OPCOUNT,
    "usage: kvslim eval --task opcount (-m MODEL [--tokenizer TOK.bin] |\n"
    "                   --shape layers=L,heads=H,kv_heads=K,head_dim=D) --ctx T1,T2,...\n"
    "                   [--budget F1,F2,...] [--kv mpcache:...] [--json OUT]\n"
    "\n"
    "The data-independent MPC op-count model of methods/mpcache.md §3.5: the operations a\n"
    "secure (MPC) engine pays for attention and KV selection in one decode step, summed over\n"
    "layers and heads, for a model's shape at context T (prompt tokens in the cache) and budget\n"
    "F (the share of the context attended). No model is run and no MPC runtime is modelled:\n"
    "these are counts, not latencies. The first decode step is counted: the new token (tail 1)\n"
    "is attended by every method on top of what it selects. Selection runs per KV head (a GQA\n"
    "group's queries are summed, free in MPC); softmax and qK/PV per query head.\n"
    "\n"
    "First the token-gather comparison of the paper's Table 2 (T 1024, C 64, 25% gathered),\n"
    "then one table per context and budget with a row per method:\n"
    "  full             full attention, no selection\n"
    "  token            token-level cosine top-k of ceil(F T) tokens (LongCache-like)\n"
    "  quest            pages of 16 scored by the Eq. 1 bound, every layer selecting\n"
    "  mp:static+token  MPCache's static step (keep) + token-level top-k over the kept N\n"
    "  mp:+cluster      + fine clusters of s2, Eq. 1 upper-bound score\n"
    "  mp:+linear       + the linear score (Eq. 2): half the mults, no max\n"
    "  mp:+hierarchy    + coarse (s1) then fine selection, linear score\n"
    "  mp:+sharing      + cross-layer sharing: MPCache as configured\n"
    "Columns:\n"
    "  sel      layers that run selection\n"
    "  k        tokens one query head attends per layer (tail included)\n"
    "  sim_mul  similarity multiplications; max: max ops of the Eq. 1 bound;\n"
    "           div: the cosine's divisions (one per scored key)\n"
    "  topk_len the summed input length of every top-k call; calls: their number\n"
    "  gath_eq  gather equality tests (one one-hot over the list per chosen index);\n"
    "           gath_bits: tests x ceil(log2 list length), the bits they compare\n"
    "  softmax  softmax inputs (k summed over query heads and layers)\n"
    "  qkpv_mul qK and PV multiplications, 2 k d per query head and layer\n"
    "  sm_x     full's softmax length over the row's; mul_x: full's (similarity + qK/PV)\n"
    "           mults over the row's; bits_x: token's gather bits over the row's ('-': the\n"
    "           row gathers nothing; full attention has no gather to compare against)\n"
    "\n"
    "The MPCache rows use --kv's mpcache configuration (default keep 0.25, s1 32, s2 16,\n"
    "rho1 0.5, linear, 2 levels, sharing from layer 2, padding on); the ablation rows keep its\n"
    "keep, s1, s2, rho1 and padding and set their own levels, score and sharing. MPCache\n"
    "attends F of the context as keep x eta (eta = F / keep; keep is raised to F when F is\n"
    "larger, as the policy does). A coarse level that keeps every cluster (eta >= 0.5) is not\n"
    "run. A llama2.c checkpoint is read with its --tokenizer.\n"
    "\n",
    NULL};

#define MAX_LIST 64

typedef struct opcount_state {
    kvs_opcount_shape shape;
    const char *model_label; /* the model file's base name, or "--shape" */
    int ctx[MAX_LIST], n_ctx;
    double budget[MAX_LIST];
    int n_budget;
    kvs_mp_cfg cfg;
    const char *kv_spec; /* NULL: the default configuration */
} opcount_state;

/* ---- flags ---- */

/* One --shape key=value; -1 after printing why. */
static int shape_item(const char *cmd, const char *item, size_t len, kvs_opcount_shape *s,
                      int *seen)
{
    static const char *const keys[] = {"layers", "heads", "kv_heads", "head_dim"};
    int *fields[] = {&s->n_layers, &s->n_heads, &s->n_kv_heads, &s->head_dim};
    const char *eq = memchr(item, '=', len);
    for (int k = 0; k < 4 && eq; k++) {
        if ((size_t)(eq - item) != strlen(keys[k]) || strncmp(item, keys[k], strlen(keys[k])))
            continue;
        char val[32];
        size_t vl = len - (size_t)(eq - item) - 1;
        int64_t x;
        snprintf(val, sizeof val, "%.*s", (int)(vl < sizeof val ? vl : sizeof val - 1), eq + 1);
        if (vl >= sizeof val || kvs_parse_i64(val, 1, 1 << 20, &x) != 0) {
            cli_error(cmd, "--shape %.*s: expected a whole number >= 1", (int)len, item);
            return -1;
        }
        *fields[k] = (int)x;
        seen[k] = 1;
        return 0;
    }
    cli_error(cmd, "--shape %.*s: expected layers=L, heads=H, kv_heads=K or head_dim=D",
              (int)len, item);
    return -1;
}

/* --shape layers=L,heads=H,kv_heads=K,head_dim=D, all four, checked. */
static int parse_shape(const char *cmd, const char *text, kvs_opcount_shape *s)
{
    int seen[4] = {0};
    *s = (kvs_opcount_shape){0};
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        if (shape_item(cmd, p, len, s, seen) != 0)
            return -1;
        p += len + (p[len] == ',');
    }
    if (!seen[0] || !seen[1] || !seen[2] || !seen[3]) {
        cli_error(cmd, "--shape %s: needs layers=, heads=, kv_heads= and head_dim=", text);
        return -1;
    }
    kvs_error err = {0};
    if (kvs_opcount_shape_check(s, &err) != KVS_OK) {
        cli_error(cmd, "--shape %s: %s", text, err.msg);
        return -1;
    }
    return 0;
}

/* --ctx T1,T2,...: whole numbers 1 <= T <= 2^20 (the model's counts stay below 2^63). */
static int parse_ctx(const char *cmd, const char *text, opcount_state *e)
{
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char item[32];
        int64_t x;
        snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
        if (len >= sizeof item || kvs_parse_i64(item, 1, 1 << 20, &x) != 0) {
            cli_error(cmd, "--ctx %.*s: expected a whole number in [1, 1048576]", (int)len, p);
            return -1;
        }
        if (e->n_ctx == MAX_LIST) {
            cli_error(cmd, "--ctx %s: at most %d lengths", text, MAX_LIST);
            return -1;
        }
        e->ctx[e->n_ctx++] = (int)x;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* --budget F1,F2,...: fractions in (0, 1] (0.05) or percentages (5%). */
static int parse_budget(const char *cmd, const char *text, opcount_state *e)
{
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        char item[32];
        double x;
        int pct = len > 0 && p[len - 1] == '%';
        snprintf(item, sizeof item, "%.*s", (int)(len - (size_t)pct < sizeof item ?
                                                  len - (size_t)pct : sizeof item - 1), p);
        if (len >= sizeof item || kvs_parse_f64(item, 0, pct ? 100 : 1, &x) != 0 || x <= 0) {
            cli_error(cmd, "--budget %.*s: expected a fraction in (0, 1] (0.05) or a "
                           "percentage (5%%)", (int)len, p);
            return -1;
        }
        if (e->n_budget == MAX_LIST) {
            cli_error(cmd, "--budget %s: at most %d budgets", text, MAX_LIST);
            return -1;
        }
        e->budget[e->n_budget++] = pct ? x / 100 : x;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* The shape of -m's model; a llama2.c checkpoint is converted to a temporary GGUF with its
 * tokenizer, as eval --task recall does, since the library reads GGUF only. */
static int model_shape(const char *cmd, const char *path, const char *tok, kvs_opcount_shape *s)
{
    kvs_error err = {0};
    kvs_model *m = NULL;
    int rc = cli_load_model(cmd, path, tok, &m);
    if (rc != CLI_OK)
        return rc;
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    kvs_model_free(m);
    *s = (kvs_opcount_shape){info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim};
    if (kvs_opcount_shape_check(s, &err) != KVS_OK) {
        cli_error(cmd, "-m %s: %s", path, err.msg);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* Everything but the model: usage errors come out before any work. */
static int read_flags(const char *cmd, const cli_args *a, opcount_state *e)
{
    const int has_m = a->given[FL_MODEL] > 0, has_shape = a->given[FL_SHAPE] > 0;
    if (has_m == has_shape) {
        cli_error(cmd, "--task opcount needs either -m MODEL or --shape layers=L,heads=H,"
                       "kv_heads=K,head_dim=D%s (see kvslim eval --task opcount --help)",
                  has_m ? ", not both" : "");
        return CLI_USAGE;
    }
    if (a->given[FL_TOKENIZER] && !has_m) {
        cli_error(cmd, "--tokenizer goes with -m (a llama2.c checkpoint)");
        return CLI_USAGE;
    }
    if (!a->given[FL_CTX]) {
        cli_error(cmd, "--task opcount needs --ctx T1,T2,... (context lengths)");
        return CLI_USAGE;
    }
    if ((has_shape && parse_shape(cmd, a->str[FL_SHAPE], &e->shape) != 0) ||
        parse_ctx(cmd, a->str[FL_CTX], e) != 0 ||
        (a->given[FL_BUDGET] && parse_budget(cmd, a->str[FL_BUDGET], e) != 0))
        return CLI_USAGE;
    e->kv_spec = a->given[FL_KV] ? a->str[FL_KV] : NULL;
    return CLI_OK;
}

/* --kv's mpcache configuration for the model's layers (default without --kv); its budget= is
 * the budget when --budget is not given, else 0.05. */
static int read_cfg(const char *cmd, opcount_state *e)
{
    double spec_budget = 0;
    e->cfg = kvs_mp_cfg_default();
    if (e->kv_spec) {
        kvs_error err = {0};
        kvs_status st = kvs_opcount_cfg_from_spec(e->kv_spec, e->shape.n_layers, &e->cfg,
                                                  &spec_budget, &err);
        if (st != KVS_OK) {
            cli_error(cmd, "%s", err.msg); /* it names --kv and the spec */
            return cli_status_exit(st);
        }
    }
    if (e->n_budget == 0)
        e->budget[e->n_budget++] = spec_budget > 0 ? spec_budget : 0.05;
    return CLI_OK;
}

/* ---- output ---- */

static const char *sim_name(kvs_mp_sim s)
{
    return s == KVS_MP_SIM_LINEAR ? "linear" : s == KVS_MP_SIM_MEAN ? "mean"
           : s == KVS_MP_SIM_MAXDOT ? "maxdot" : "ub";
}

static void print_gather(FILE *f, const kvs_opcount_gather *g)
{
    fprintf(f, "Token gather (Table 2): T %d, C %d, %g gathered; one one-hot over the list per "
               "index\n", g->T, g->C, g->frac);
    fprintf(f, "  %-22s %8s %8s %8s %12s %12s\n", "", "indices", "tests/ix", "bits", "tests",
            "test-bits");
    fprintf(f, "  %-22s %8lld %8lld %8d %12lld %12lld\n", "token-level (k1 of T)",
            (long long)g->k1, (long long)g->cmp1, g->bits1, (long long)g->tests1,
            (long long)g->testbits1);
    fprintf(f, "  %-22s %8lld %8lld %8d %12lld %12lld\n", "cluster-level (k2 of C)",
            (long long)g->k2, (long long)g->cmp2, g->bits2, (long long)g->tests2,
            (long long)g->testbits2);
    fprintf(f, "  %-22s %8s %7.2fx %7.3fx %11.2fx %11.2fx\n", "reduction", "",
            g->cmp_ratio, g->bits_ratio, g->tests_ratio, g->testbits_ratio);
    fprintf(f, "  per index (T log T)/(C log C) = %.2fx; the paper measured %.1fx latency and "
               "%.1fx communication (SecretFlow-SPU 3PC: needs an MPC runtime, not modelled "
               "here)\n\n", g->per_index_ratio, g->paper_latency_ratio, g->paper_comm_ratio);
}

static void print_factor(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, " %7.2fx", x);
    else
        fprintf(f, " %8s", "-");
}

static void print_table(FILE *f, const opcount_state *e, int T, double F,
                        const kvs_opcount_row *rows)
{
    const kvs_mp_cfg *c = &e->cfg;
    const double keep = kvs_opcount_keep(c, F);
    const int N = kvs_mp_ceil_count(keep, T);
    const double eta = kvs_mp_eta(F, keep);
    kvs_mp_shape s;
    kvs_mp_shape_of(c, eta, N, 0, &s);
    fprintf(f, "T %d, budget %g, tail 1: MPCache keeps N %d (keep %g), eta %g, rho1 %g; C1 %d, "
               "C2 %d (padded %d), n1 %d, n_cand %d, n2 %d, slots %d; selector layers %d of %d\n",
            T, F, N, keep, eta, kvs_mp_rho1(c, eta), s.C1, s.C2, s.C2x, s.n1, s.n_cand, s.n2,
            s.n_slots, rows[KVS_OC_MP_SHARING].selector_layers, e->shape.n_layers);
    fprintf(f, "  %-16s %4s %7s %12s %10s %7s %9s %6s %12s %13s %9s %12s %8s %8s %8s\n",
            "method", "sel", "k", "sim_mul", "max", "div", "topk_len", "calls", "gath_eq",
            "gath_bits", "softmax", "qkpv_mul", "sm_x", "mul_x", "bits_x");
    for (int m = 0; m < KVS_OC_N_METHODS; m++) {
        const kvs_opcount_row *r = &rows[m];
        fprintf(f, "  %-16s %4d %7lld %12lld %10lld %7lld %9lld %6lld %12lld %13lld %9lld %12lld",
                kvs_opcount_method_name(r->method), r->selector_layers, (long long)r->attended,
                (long long)r->sim_mults, (long long)r->sim_max, (long long)r->sim_div,
                (long long)r->topk_len, (long long)r->topk_calls, (long long)r->gather_eq,
                (long long)r->gather_bits, (long long)r->softmax_len, (long long)r->attn_mults);
        print_factor(f, r->red_softmax);
        print_factor(f, r->red_mults);
        print_factor(f, r->red_bits);
        fputc('\n', f);
    }
    fputc('\n', f);
}

static void json_gather(FILE *f, const kvs_opcount_gather *g)
{
    fprintf(f, "  \"table2\": {\"T\": %d, \"C\": %d, \"fraction\": ", g->T, g->C);
    cli_json_num(f, g->frac);
    fprintf(f, ", \"k1\": %lld, \"k2\": %lld, \"tests_per_index1\": %lld, \"tests_per_index2\": "
               "%lld, \"bits1\": %d, \"bits2\": %d, \"tests1\": %lld, \"tests2\": %lld, "
               "\"test_bits1\": %lld, \"test_bits2\": %lld",
            (long long)g->k1, (long long)g->k2, (long long)g->cmp1, (long long)g->cmp2, g->bits1,
            g->bits2, (long long)g->tests1, (long long)g->tests2, (long long)g->testbits1,
            (long long)g->testbits2);
    const char *names[] = {"tests_per_index_ratio", "bits_ratio", "per_index_ratio",
                           "tests_ratio", "test_bits_ratio", "paper_latency_ratio",
                           "paper_comm_ratio"};
    const double vals[] = {g->cmp_ratio, g->bits_ratio, g->per_index_ratio, g->tests_ratio,
                           g->testbits_ratio, g->paper_latency_ratio, g->paper_comm_ratio};
    for (int i = 0; i < 7; i++) {
        fprintf(f, ", \"%s\": ", names[i]);
        cli_json_num(f, vals[i]);
    }
    fputs("},\n", f);
}

static void json_head(FILE *f, const opcount_state *e)
{
    const kvs_mp_cfg *c = &e->cfg;
    fputs("{\"task\": \"opcount\", \"model\": ", f);
    cli_json_str(f, e->model_label);
    fprintf(f, ",\n  \"shape\": {\"layers\": %d, \"heads\": %d, \"kv_heads\": %d, "
               "\"head_dim\": %d},\n  \"mpcache\": {\"spec\": ",
            e->shape.n_layers, e->shape.n_heads, e->shape.n_kv_heads, e->shape.head_dim);
    cli_json_str(f, e->kv_spec ? e->kv_spec : "mpcache (defaults)");
    fputs(", \"keep\": ", f);
    cli_json_num(f, c->keep);
    fprintf(f, ", \"s1\": %d, \"s2\": %d, \"rho1\": ", c->s1, c->s2);
    cli_json_num(f, c->rho1);
    fprintf(f, ", \"sim\": \"%s\", \"levels\": %d, \"share\": %s, \"skip\": %d, \"pad\": %s},\n",
            sim_name(c->sim), c->levels, c->share ? "true" : "false", c->skip,
            c->pad ? "true" : "false");
}

static void json_row(FILE *f, int T, double F, const kvs_opcount_row *r, int last)
{
    fprintf(f, "    {\"ctx\": %d, \"budget\": ", T);
    cli_json_num(f, F);
    fprintf(f, ", \"tail\": 1, \"method\": \"%s\", \"selector_layers\": %d, \"attended\": %lld, "
               "\"sim_mults\": %lld, \"sim_max\": %lld, \"sim_div\": %lld, \"topk_len\": %lld, "
               "\"topk_calls\": %lld, \"gather_eq\": %lld, \"gather_bits\": %lld, "
               "\"softmax_len\": %lld, \"attn_mults\": %lld, \"red_softmax\": ",
            kvs_opcount_method_name(r->method), r->selector_layers, (long long)r->attended,
            (long long)r->sim_mults, (long long)r->sim_max, (long long)r->sim_div,
            (long long)r->topk_len, (long long)r->topk_calls, (long long)r->gather_eq,
            (long long)r->gather_bits, (long long)r->softmax_len, (long long)r->attn_mults);
    cli_json_num(f, r->red_softmax);
    fputs(", \"red_mults\": ", f);
    cli_json_num(f, r->red_mults);
    fputs(", \"red_bits\": ", f);
    cli_json_num(f, r->red_bits);
    fputs(last ? "}\n" : "},\n", f);
}

/* Computes every table, prints it to stdout and, with json, into *buf (malloc'd). */
static int run(const char *cmd, const opcount_state *e, FILE *json)
{
    kvs_opcount_gather g;
    kvs_error err = {0};
    if (kvs_opcount_gather_table(1024, 64, 0.25, &g, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return CLI_FAIL;
    }
    printf("kvslim eval --task opcount: %s, %d layers, %d heads, %d KV heads, head_dim %d; "
           "mpcache %s\n\n", e->model_label, e->shape.n_layers, e->shape.n_heads,
           e->shape.n_kv_heads, e->shape.head_dim, e->kv_spec ? e->kv_spec : "(defaults)");
    print_gather(stdout, &g);
    if (json) {
        json_head(json, e);
        json_gather(json, &g);
        fputs("  \"rows\": [\n", json);
    }
    for (int t = 0; t < e->n_ctx; t++)
        for (int b = 0; b < e->n_budget; b++) {
            kvs_opcount_input in = {e->shape, e->ctx[t], e->budget[b], 1, e->cfg};
            kvs_opcount_row rows[KVS_OC_N_METHODS];
            kvs_status st = kvs_opcount_rows(&in, rows, &err);
            if (st != KVS_OK) {
                cli_error(cmd, "--ctx %d, --budget %g: %s", e->ctx[t], e->budget[b], err.msg);
                return cli_status_exit(st);
            }
            print_table(stdout, e, e->ctx[t], e->budget[b], rows);
            for (int m = 0; json && m < KVS_OC_N_METHODS; m++)
                json_row(json, e->ctx[t], e->budget[b], &rows[m],
                         t == e->n_ctx - 1 && b == e->n_budget - 1 && m == KVS_OC_N_METHODS - 1);
        }
    if (json)
        fputs("  ]}\n", json);
    fflush(stdout);
    return CLI_OK;
}

static int opcount(const cli_args *a)
{
    const char *cmd = "eval";
    opcount_state e = {0};
    const char *model = a->str[FL_MODEL], *tok = a->str[FL_TOKENIZER];
    int rc = read_flags(cmd, a, &e);
    kvs_outfile_input inputs[2] = {{"-m", model}, {"--tokenizer", tok ? tok : model}};
    kvs_outfile_spec out = cli_output("--json", a->str[FL_JSON], inputs, model ? 2 : 0);
    if (rc == CLI_OK && a->str[FL_JSON] && cli_check_output(cmd, &out, NULL) != 0)
        rc = CLI_FAIL;
    if (rc == CLI_OK && model)
        rc = model_shape(cmd, model, tok, &e.shape);
    const char *base = model ? strrchr(model, '/') : NULL;
    e.model_label = model ? (base ? base + 1 : model) : "--shape";
    if (rc == CLI_OK)
        rc = read_cfg(cmd, &e);
    if (rc != CLI_OK)
        return rc;
    char *buf = NULL;
    size_t len = 0;
    FILE *json = a->str[FL_JSON] ? open_memstream(&buf, &len) : NULL;
    if (a->str[FL_JSON] && !json) {
        cli_error(cmd, "out of memory");
        return CLI_FAIL;
    }
    rc = run(cmd, &e, json);
    if (json && fclose(json) != 0 && rc == CLI_OK) {
        free(buf);
        buf = NULL; /* reported as out of memory below */
    }
    if (json && rc == CLI_OK)
        return cli_write_built(cmd, &out, buf, len) == 0 ? CLI_OK : CLI_FAIL;
    free(buf);
    return rc;
}

int cmd_eval_opcount(int argc, char **argv)
{
    return cli_main(&opcount_cmd, opcount, argc, argv);
}
