/* Error paths of the eval harness and core utilities no other test reaches (issue 16): the
 * setup checks of kvs_eval_check_setup (too few tokens, more than the context, a negative id, no
 * threads), a policy run without a reference, the op-count model's limits (shape, context,
 * budget, tail, MPCache configuration, gather table) and its over-long --kv, the plan/types
 * builders' NULL arguments, a recall prompt without a question, a plot of nothing, and the
 * output-file API's NULL path and commit of a file never opened. Each asserts the status and
 * the value the message names. */
#include <string.h>

#include "check.h"
#include "core/outfile.h"
#include "eval/eval.h"
#include "eval/opcount.h"
#include "eval/plan.h"
#include "eval/recall.h"

#define CHECK_ERR(st_, want_st, needle)                                                      \
    CHECKF((st_) == (want_st) && strstr(err.msg, (needle)), "status %d, message '%s' (want %d, " \
           "'%s')", (int)(st_), err.msg, (int)(want_st), (needle))

static void eval_setup(void)
{
    char path[1024];
    kvs_error err = {0};
    kvs_model *m = NULL;
    if (kvs_model_load(check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"),
                       &m, &err) != KVS_OK) {
        fprintf(stderr, "cannot load the model: %s\n", err.msg);
        check_failed++;
        return;
    }
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    static int32_t tokens[4096]; /* token 1 everywhere: valid in any vocabulary */
    for (int i = 0; i < (int)(sizeof tokens / sizeof *tokens); i++)
        tokens[i] = 1;
    CHECK(info.n_ctx + 1 <= (int)(sizeof tokens / sizeof *tokens));

    kvs_eval_setup s = {.tokens = tokens, .n_tokens = 2, .prompt_len = 1, .n_threads = 1};
    kvs_status st = kvs_eval_check_setup(m, &s, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "2 tokens are too few: need a prompt, a decoded token and a "
                               "scored one (at least 3)");

    /* One token past the context (the prompt length itself in range). */
    s.n_tokens = info.n_ctx + 1;
    s.prompt_len = 8;
    st = kvs_eval_check_setup(m, &s, &err);
    char want[128];
    snprintf(want, sizeof want, "%d tokens exceed the model's context of %d", info.n_ctx + 1,
             info.n_ctx);
    CHECK_ERR(st, KVS_ERR_ARG, want);

    /* A negative id (the other end of the vocabulary check), named by its 1-based place. */
    s.n_tokens = 16;
    tokens[5] = -1;
    st = kvs_eval_check_setup(m, &s, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "token id -1 (token 6 of the file) is outside the vocabulary");
    tokens[5] = 1;

    s.n_threads = 0;
    st = kvs_eval_check_setup(m, &s, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "threads must be >= 1, got 0");
    s.n_threads = 1;
    CHECKF(kvs_eval_check_setup(m, &s, &err) == KVS_OK, "%s", err.msg);

    /* A policy run needs the reference's logits to compare with. */
    kvs_eval_result res;
    memset(&res, 0, sizeof res);
    st = kvs_eval_policy(m, &s, NULL, "h2o:budget=0.5", &res, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "no reference run to compare with");
    kvs_eval_ref empty = {0};
    st = kvs_eval_policy(m, &s, &empty, "h2o:budget=0.5", &res, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "no reference run to compare with");
    kvs_model_free(m);
}

static void opcount(void)
{
    kvs_error err = {0};
    kvs_opcount_shape sh = {4, 513, 1, 64};
    kvs_status st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "heads=513: expected 1 to 512");
    sh.n_heads = 0;
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "heads=0: expected 1 to 512");
    sh = (kvs_opcount_shape){4, 8, 2, 1025};
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "head_dim=1025: expected 1 to 1024");
    sh.head_dim = 0;
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "head_dim=0: expected 1 to 1024");

    sh = (kvs_opcount_shape){513, 8, 2, 64};
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "layers=513: expected 1 to 512");
    sh = (kvs_opcount_shape){4, 8, 0, 64};
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kv_heads=0: expected a divisor of heads=8");
    sh.n_kv_heads = 16;
    st = kvs_opcount_shape_check(&sh, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kv_heads=16: expected a divisor of heads=8");

    /* The tail is checked after the shape, context and budget. */
    kvs_opcount_input in;
    memset(&in, 0, sizeof in);
    in.shape = (kvs_opcount_shape){4, 8, 2, 64};
    in.ctx = 1024;
    in.budget = 0.25;
    in.tail = -1;
    kvs_opcount_row rows[KVS_OC_N_METHODS];
    st = kvs_opcount_rows(&in, rows, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "tail -1: expected 0 to 1048576");
    in.tail = (1 << 20) + 1;
    st = kvs_opcount_rows(&in, rows, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "tail 1048577: expected 0 to 1048576");
    in.tail = 1;
    in.ctx = (1 << 20) + 1;
    st = kvs_opcount_rows(&in, rows, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "context 1048577: expected 1 to 1048576");
    in.ctx = 1024;
    in.budget = 1.5;
    st = kvs_opcount_rows(&in, rows, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "budget 1.5: expected a fraction in (0, 1]");
    in.budget = 0.25;
    /* The MPCache configuration, one bad field at a time (valid: s1 16, s2 4, keep 0.5,
     * levels 2, skip 0). */
    static const struct {
        int s1, s2;
        double keep;
        int levels, skip;
    } bad[] = {{16, 0, 0.5, 2, 0}, {2, 4, 0.5, 2, 0},  {18, 4, 0.5, 2, 0}, {16, 4, 0, 2, 0},
               {16, 4, 1.5, 2, 0}, {16, 4, 0.5, 3, 0}, {16, 4, 0.5, 2, -1}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        in.cfg.s1 = bad[i].s1;
        in.cfg.s2 = bad[i].s2;
        in.cfg.keep = bad[i].keep;
        in.cfg.levels = bad[i].levels;
        in.cfg.skip = bad[i].skip;
        char want[128];
        snprintf(want, sizeof want, "(got s1 %d, s2 %d, keep %g, levels %d, skip %d)",
                 bad[i].s1, bad[i].s2, bad[i].keep, bad[i].levels, bad[i].skip);
        st = kvs_opcount_rows(&in, rows, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "mpcache configuration: need") &&
               strstr(err.msg, want), "case %zu: %d %s", i, st, err.msg);
    }

    /* The gather table's limits, each bound. */
    static const struct {
        int T, C;
        double frac;
    } g[] = {{1, 4, 0.5}, {(1 << 20) + 1, 4, 0.5}, {64, 1, 0.5}, {64, (1 << 20) + 1, 0.5},
             {64, 4, 0}, {64, 4, 1.5}};
    for (size_t i = 0; i < sizeof g / sizeof *g; i++) {
        kvs_opcount_gather out;
        char want[96];
        snprintf(want, sizeof want, "(got T %d, C %d, %g)", g[i].T, g[i].C, g[i].frac);
        st = kvs_opcount_gather_table(g[i].T, g[i].C, g[i].frac, &out, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "gather table: need 2 <= T, C <= 1048576") &&
               strstr(err.msg, want), "case %zu: %d %s", i, st, err.msg);
    }

    /* A --kv without a budget gets ",budget=1.0" appended; one too long for that is refused
     * with its first 200 characters quoted. */
    char spec[600];
    memset(spec, 'x', sizeof spec - 1);
    spec[sizeof spec - 1] = 0;
    memcpy(spec, "mpcache:", 8);
    kvs_mp_cfg cfg;
    double budget;
    st = kvs_opcount_cfg_from_spec(spec, 4, &cfg, &budget, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "...: too long");
    CHECK(strstr(err.msg, "--kv mpcache:xxx") != NULL);
}

static void plan_args(void)
{
    kvs_error err = {0};
    const char *kv[] = {"h2o:budget=0.5"};
    kvs_status st = kvs_eval_plan_make(NULL, kv, 1, NULL, 0, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_plan_make: plan is NULL");
    kvs_eval_plan plan;
    st = kvs_eval_plan_make(&plan, NULL, 1, NULL, 0, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_plan_make: no --kv values");
    st = kvs_eval_plan_make(&plan, kv, -1, NULL, 0, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_plan_make: no --kv values");

    const char *types[] = {"f16"};
    st = kvs_eval_types_make(NULL, types, 1, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_types_make: types is NULL");
    kvs_eval_types t;
    st = kvs_eval_types_make(&t, NULL, 1, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_types_make: no --kv-type values");
    st = kvs_eval_types_make(&t, types, -1, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "kvs_eval_types_make: no --kv-type values");
}

/* A recall prompt whose context leaves no question after it, or is empty, is refused by name
 * before the model is touched; a plot of no runs is refused before gnuplot is looked for. */
static void recall_and_plot(void)
{
    kvs_error err = {0};
    kvs_recall_setup rs;
    memset(&rs, 0, sizeof rs);
    kvs_recall_prompt p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "d0.50-003");
    p.n_tokens = 40;
    p.context = 40;
    kvs_recall_result r;
    kvs_status st = kvs_recall_run(NULL, &rs, "full", &p, &r, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "prompt d0.50-003: not checked (context 40 of 40 tokens)");
    p.context = 0;
    st = kvs_recall_run(NULL, &rs, "full", &p, &r, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "prompt d0.50-003: not checked (context 0 of 40 tokens)");

    void *png = (void *)1;
    size_t len = 1;
    kvs_eval_result res;
    memset(&res, 0, sizeof res);
    st = kvs_eval_plot(&res, NULL, 0, "t", &png, &len, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "nothing to plot");
    CHECK(png == NULL && len == 0);
}

static void outfile_args(void)
{
    kvs_error err = {0};
    kvs_outfile_kind kind;
    kvs_outfile *o = NULL;
    kvs_status st = kvs_outfile_check(NULL, &kind, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "output file: NULL path");
    kvs_outfile_spec spec = {.flag = "--json"};
    st = kvs_outfile_check(&spec, &kind, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "output file: NULL path");
    st = kvs_outfile_open(&spec, &o, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "output file: NULL path");
    CHECK(o == NULL);
    /* Committing what was never opened (a failed open's NULL) is an error, not a crash. */
    st = kvs_outfile_commit(NULL, &err);
    CHECK_ERR(st, KVS_ERR_ARG, "output file: not open");
}

int main(void)
{
    eval_setup();
    opcount();
    plan_args();
    recall_and_plot();
    outfile_args();
    return check_summary("test_errors_eval");
}
