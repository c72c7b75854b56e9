/* Eval planning (src/eval/plan.h) without a model: budget items, budget replacement, job order
 * and labels, the evicting list, and --equal-memory runs from synthetic result rows. */
#include <string.h>

#include "check.h"
#include "eval/plan.h"
#include "policies/registry.h"

#define STREQ(a, b) CHECKF(!strcmp((a), (b)), "'%s' != '%s'", (a), (b))
#define HAS(msg, part) CHECKF(strstr((msg), (part)) != NULL, "'%s' lacks '%s'", (msg), (part))

static void budget_ok(const char *item, const char *want_item, const char *want_label)
{
    char spec_item[128] = "?", label[48] = "?";
    kvs_error err = {0};
    CHECKF(kvs_eval_budget_item(item, spec_item, sizeof spec_item, label, sizeof label, &err) ==
               KVS_OK, "%s: %s", item, err.msg);
    STREQ(spec_item, want_item);
    STREQ(label, want_label);
}

static void budget_bad(const char *item, const char *want_msg)
{
    char spec_item[128], label[48];
    kvs_error err = {0};
    CHECKF(kvs_eval_budget_item(item, spec_item, sizeof spec_item, label, sizeof label, &err) ==
               KVS_ERR_ARG, "%s accepted", item);
    STREQ(err.msg, want_msg);
}

static void test_budget_items(void)
{
    budget_ok("0.25", "budget=0.25", "0.25");
    budget_ok("1.0", "budget=1.0", "1.0"); /* the whole prompt, not one slot */
    budget_ok("25%", "budget=25%", "25%");
    budget_ok("slots=96", "slots=96", "96");
    /* Ranges are the spec parser's: a fraction over 1 is still an item here. */
    budget_ok("1.5", "budget=1.5", "1.5");

    budget_bad("96", "--budget 96: a bare whole number is ambiguous; write 96% (or a fraction "
                     "with a point) for a share of the prompt, or slots=96 for 96 slots per "
                     "layer and KV head");
    budget_bad("half", "--budget half: expected a fraction of the prompt (0.25 or 25%) or a slot "
                       "count (slots=96)");
    budget_bad("%", "--budget %: expected a fraction of the prompt (0.25 or 25%) or a slot count "
                    "(slots=96)");
    budget_bad("x%", "--budget x%: expected a fraction of the prompt (0.25 or 25%) or a slot "
                     "count (slots=96)");
    budget_bad("slots=0", "--budget slots=0: slots= takes a whole number of slots per layer and "
                          "KV head, e.g. slots=96");
    budget_bad("slots=1.5", "--budget slots=1.5: slots= takes a whole number of slots per layer "
                            "and KV head, e.g. slots=96");

    /* A long item is cut in the message so that the reason survives kvs_error's 512 bytes. */
    char item[400];
    memset(item, '7', sizeof item - 2);
    item[sizeof item - 2] = 'x';
    item[sizeof item - 1] = 0;
    char spec_item[128], label[48];
    kvs_error err = {0};
    CHECK(kvs_eval_budget_item(item, spec_item, sizeof spec_item, label, sizeof label, &err) ==
          KVS_ERR_ARG);
    HAS(err.msg, "... (399 bytes): expected a fraction of the prompt");
}

static void with_budget(const char *spec, const char *item, const char *want)
{
    char out[512] = "?";
    CHECKF(kvs_eval_with_budget(spec, item, out, sizeof out) == 0, "%s + %s", spec, item);
    STREQ(out, want);
}

static void test_with_budget(void)
{
    with_budget("h2o", "budget=0.1", "h2o:budget=0.1");
    with_budget("h2o:", "budget=0.1", "h2o:budget=0.1");
    with_budget("h2o:budget=0.5", "slots=64", "h2o:slots=64");
    with_budget("h2o:slots=50", "budget=25%", "h2o:budget=25%");
    /* Other items kept in order, every existing budget item dropped. */
    with_budget("streaming:sinks=2,budget=0.3", "slots=64", "streaming:slots=64,sinks=2");
    with_budget("snapkv:budget=0.3,window=8,slots=5,kernel=3", "budget=25%",
                "snapkv:budget=25%,window=8,kernel=3");
    with_budget("quest:page=8,dense_layers=1", "budget=0.1",
                "quest:budget=0.1,page=8,dense_layers=1");
    /* Too long for the buffer: -1. */
    char small[16];
    CHECK(kvs_eval_with_budget("streaming:sinks=2", "slots=64", small, sizeof small) == -1);
    CHECK(kvs_eval_with_budget("h2o", "slots=64", small, sizeof small) == 0);
    STREQ(small, "h2o:slots=64");
}

static void policy_label(const char *params, const char *want)
{
    char buf[256];
    kvs_eval_policy_label(params, buf, sizeof buf);
    STREQ(buf, want);
}

static void test_policy_label(void)
{
    policy_label("full", "full");
    policy_label("h2o:budget=0.1", "h2o");
    policy_label("h2o:slots=64", "h2o");
    policy_label("streaming:budget=0.1,sinks=2", "streaming:sinks=2");
    policy_label("snapkv:window=8,slots=96,kernel=3", "snapkv:window=8,kernel=3");
}

static const char *canonical(const char *spec, char *buf, size_t size)
{
    kvs_policy_spec parsed;
    kvs_error err = {0};
    CHECKF(kvs_policy_parse(spec, &parsed, &err) == KVS_OK, "%s: %s", spec, err.msg);
    snprintf(buf, size, "%s", parsed.text);
    return buf;
}

static void check_job(const kvs_eval_job *j, const char *spec, const char *label)
{
    CHECK(j != NULL);
    if (!j)
        return;
    char c[256];
    STREQ(j->spec, spec);
    STREQ(j->label, label);
    STREQ(j->canonical, canonical(spec, c, sizeof c));
    CHECK(j->equal_memory_of == NULL);
}

static void test_jobs(void)
{
    kvs_eval_plan p;
    kvs_error err = {0};
    const char *kv[] = {"full,streaming,snapkv", "quest:page=8"};
    CHECKF(kvs_eval_plan_make(&p, kv, 2, "0.1,25%,slots=40", 0, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.n_groups == 3);
    CHECK(p.jobs.n == 9); /* full is the reference, not a job */
    CHECK(kvs_eval_plan_group_size(&p) == 3);
    /* Spec-major: spec s at budget b is jobs.v[s * n_groups + b]. */
    const char *want[9][2] = {
        {"streaming:budget=0.1", "0.1"},   {"streaming:budget=25%", "25%"},
        {"streaming:slots=40", "40"},      {"snapkv:budget=0.1", "0.1"},
        {"snapkv:budget=25%", "25%"},      {"snapkv:slots=40", "40"},
        {"quest:budget=0.1,page=8", "0.1"}, {"quest:budget=25%,page=8", "25%"},
        {"quest:slots=40,page=8", "40"},
    };
    for (int j = 0; j < p.jobs.n && j < 9; j++)
        check_job(&p.jobs.v[j], want[j][0], want[j][1]);
    /* Groups in --budget order, each the specs in --kv order. */
    check_job(kvs_eval_plan_job(&p, 0, 0), "streaming:budget=0.1", "0.1");
    check_job(kvs_eval_plan_job(&p, 1, 1), "snapkv:budget=25%", "25%");
    check_job(kvs_eval_plan_job(&p, 2, 2), "quest:slots=40,page=8", "40");
    check_job(kvs_eval_plan_job(&p, 0, 2), "quest:budget=0.1,page=8", "0.1");
    check_job(kvs_eval_plan_job(&p, 2, 0), "streaming:slots=40", "40");
    CHECK(kvs_eval_plan_job(&p, 3, 0) == NULL);
    CHECK(kvs_eval_plan_job(&p, 0, 3) == NULL);
    CHECK(kvs_eval_plan_job(&p, -1, 0) == NULL);
    /* The evicting specs given (without --equal-memory they are still listed). */
    CHECK(p.n_evicting == 1 && !strcmp(p.evicting[0], "streaming"));
    kvs_eval_plan_free(&p);
    kvs_eval_plan_free(&p); /* freed twice: the plan was emptied */

    /* Without --budget: each spec at its own budget, labelled as typed. */
    const char *own[] = {"h2o:slots=50", "snapkv:budget=25%,window=8", "streaming:sinks=2,budget=0.3",
                         "full"};
    CHECKF(kvs_eval_plan_make(&p, own, 4, NULL, 0, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.n_groups == 1 && p.jobs.n == 3 && kvs_eval_plan_group_size(&p) == 3);
    if (p.jobs.n == 3) {
        check_job(&p.jobs.v[0], "h2o:slots=50", "50");
        check_job(&p.jobs.v[1], "snapkv:budget=25%,window=8", "25%");
        check_job(&p.jobs.v[2], "streaming:sinks=2,budget=0.3", "0.3");
    }
    /* Evicting specs as typed, in --kv order. */
    CHECK(p.n_evicting == 2 && !strcmp(p.evicting[0], "h2o:slots=50") &&
          !strcmp(p.evicting[1], "streaming:sinks=2,budget=0.3"));
    kvs_eval_plan_free(&p);

    /* --budget replaces a spec's own budget, keeping its other parameters. */
    const char *mixed[] = {"streaming:budget=0.3,sinks=2"};
    CHECKF(kvs_eval_plan_make(&p, mixed, 1, "0.1,slots=64", 0, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.jobs.n == 2);
    if (p.jobs.n == 2) {
        check_job(&p.jobs.v[0], "streaming:budget=0.1,sinks=2", "0.1");
        check_job(&p.jobs.v[1], "streaming:slots=64,sinks=2", "64");
    }
    kvs_eval_plan_free(&p);

    /* Only the reference: no jobs, and --budget items are not looked at. */
    const char *full[] = {"full"};
    CHECKF(kvs_eval_plan_make(&p, full, 1, "96", 1, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.jobs.n == 0 && kvs_eval_plan_group_size(&p) == 0 && p.n_groups == 1);
    CHECK(kvs_eval_plan_job(&p, 0, 0) == NULL);
    kvs_eval_plan_free(&p);
}

static void test_evicting_default(void)
{
    kvs_eval_plan p;
    kvs_error err = {0};
    const char *kv[] = {"snapkv,quest"};
    /* --equal-memory with no evicting spec: every registered evicting policy, in registry
     * order (a policy registered later is included without editing this test). */
    CHECKF(kvs_eval_plan_make(&p, kv, 1, "0.1", 1, &err) == KVS_OK, "%s", err.msg);
    int n_types, n_evicting = 0;
    const kvs_policy_type *const *types = kvs_policy_types(&n_types);
    for (int i = 0; i < n_types; i++)
        if (types[i]->kind == KVS_KIND_EVICTING) {
            CHECKF(n_evicting < p.n_evicting && !strcmp(p.evicting[n_evicting], types[i]->name),
                   "evicting %d: %s", n_evicting, types[i]->name);
            n_evicting++;
        }
    CHECK(p.n_evicting == n_evicting && n_evicting >= 3);
    kvs_eval_plan_free(&p);
    /* Without --equal-memory it stays empty. */
    CHECKF(kvs_eval_plan_make(&p, kv, 1, "0.1", 0, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.n_evicting == 0 && p.evicting == NULL);
    kvs_eval_plan_free(&p);
    /* With an evicting spec given, only the ones given. */
    const char *given[] = {"snapkv", "tova"};
    CHECKF(kvs_eval_plan_make(&p, given, 2, "0.1", 1, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.n_evicting == 1 && !strcmp(p.evicting[0], "tova"));
    kvs_eval_plan_free(&p);
}

static void plan_bad(const char *const *kv, int n_kv, const char *budgets, const char *want)
{
    kvs_eval_plan p;
    kvs_error err = {0};
    CHECKF(kvs_eval_plan_make(&p, kv, n_kv, budgets, 1, &err) == KVS_ERR_ARG, "%s accepted",
           kv[0]);
    CHECKF(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
    /* Left empty. */
    CHECK(p.jobs.n == 0 && p.jobs.v == NULL && p.n_evicting == 0 && p.evicting == NULL);
    kvs_eval_plan_free(&p);
}

static void test_plan_errors(void)
{
    plan_bad((const char *[]){"full,,h2o"}, 1, NULL, "--kv 'full,,h2o': empty item in the list");
    plan_bad((const char *[]){",h2o"}, 1, NULL, "--kv ',h2o': empty item in the list");
    plan_bad((const char *[]){"h2o,"}, 1, "0.1", "--kv 'h2o,': empty item in the list");
    plan_bad((const char *[]){"h2o"}, 1, NULL, "--kv h2o: needs budget=");
    plan_bad((const char *[]){"nope"}, 1, "0.1", "unknown policy 'nope'");
    plan_bad((const char *[]){"full:bogus=1"}, 1, NULL, "--kv full:bogus=1: unknown parameter");
    /* A spec refused at a --budget item is named as typed, with the item. */
    plan_bad((const char *[]){"h2o:bogus=1"}, 1, "0.5",
             "--kv h2o:bogus=1 with --budget 0.5: unknown parameter 'bogus'");
    plan_bad((const char *[]){"h2o"}, 1, "1.5", "--kv h2o with --budget 1.5: budget=1.5: a "
                                                 "fraction of the prompt must be");
    plan_bad((const char *[]){"h2o"}, 1, "0.1,96", "--budget 96: a bare whole number");
    /* Errors come in plan order: the first spec's second budget before the second spec. */
    plan_bad((const char *[]){"h2o", "nope"}, 2, "0.1,half", "--budget half:");
    plan_bad((const char *[]){"full", "h2o:budget=0.1", "h2o:bogus=2"}, 3, NULL,
             "--kv h2o:bogus=2: unknown parameter");
    /* A spec too long to take a budget item: the reason is not cut off. */
    char spec[600];
    snprintf(spec, sizeof spec, "streaming:sinks=%0580d", 1);
    plan_bad((const char *[]){spec}, 1, "0.1", "... (596 bytes): spec too long");
}

static void types_ok(const char *const *vals, int n, int want_n, const char *const *want)
{
    kvs_eval_types t;
    kvs_error err = {0};
    CHECKF(kvs_eval_types_make(&t, vals, n, &err) == KVS_OK, "%s", err.msg);
    CHECKF(t.n == want_n, "%d types, want %d", t.n, want_n);
    for (int i = 0; i < t.n && i < want_n; i++)
        CHECKF(!strcmp(t.v[i], want[i]), "type %d: %s, want %s", i, t.v[i], want[i]);
    kvs_eval_types_free(&t);
}

static void types_bad(const char *const *vals, int n, const char *want)
{
    kvs_eval_types t;
    kvs_error err = {0};
    CHECKF(kvs_eval_types_make(&t, vals, n, &err) == KVS_ERR_ARG, "%s accepted", vals[0]);
    CHECKF(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
    CHECK(t.n == 0 && t.v == NULL);
    kvs_eval_types_free(&t);
}

/* eval's --kv-type: a list by --kv's rule, each type checked, none given = f32. */
static void test_types(void)
{
    types_ok(NULL, 0, 1, (const char *[]){"f32"});
    types_ok((const char *[]){"f32,f16,kivi4,kivi2"}, 1, 4,
             (const char *[]){"f32", "f16", "kivi4", "kivi2"});
    /* A kivi:key=value,... type has commas of its own: one value, one type. */
    types_ok((const char *[]){"f16", "kivi:kbits=4,vbits=2", "kivi2,F32"}, 3, 4,
             (const char *[]){"f16", "kivi:kbits=4,vbits=2", "kivi2", "F32"});
    types_bad((const char *[]){"q9"}, 1,
              "--kv-type: unknown type 'q9' (expected f32, f16, kivi4, kivi2, kivi:...)");
    types_bad((const char *[]){"f16", "f32,q9"}, 2, "--kv-type f32,q9: unknown type 'q9'");
    types_bad((const char *[]){"q8_0"}, 1, "unknown type 'q8_0'"); /* a weight type */
    types_bad((const char *[]){"kivi3"}, 1, "unknown type 'kivi3'");
    types_bad((const char *[]){"f32", "kivi:bits=4"}, 2,
              "--kv-type kivi:bits=4: unknown parameter 'bits'");
    types_bad((const char *[]){"kivi:group=7"}, 1, "residual 128 must be a multiple of group 7");
    types_bad((const char *[]){"f16,,kivi4"}, 1, "--kv-type 'f16,,kivi4': empty item in the list");
    types_bad((const char *[]){"kivi4", "f16,KIVI4"}, 2, "--kv-type KIVI4 is listed twice");
    types_bad((const char *[]){"f32,kivi:kbits=4"}, 1, "takes a --kv-type of its own");

    CHECK(kvs_eval_type_is_f32(NULL) && kvs_eval_type_is_f32("f32") &&
          kvs_eval_type_is_f32("F32"));
    CHECK(!kvs_eval_type_is_f32("f16") && !kvs_eval_type_is_f32("kivi4") &&
          !kvs_eval_type_is_f32("q8_0"));

    /* A full spec among the --kv values: each non-F32 type gets a full row. */
    kvs_eval_plan p;
    kvs_error err = {0};
    CHECK(kvs_eval_plan_make(&p, (const char *[]){"full,h2o"}, 1, "0.1", 0, &err) == KVS_OK);
    CHECK(p.has_full == 1 && p.jobs.n == 1);
    kvs_eval_plan_free(&p);
    CHECK(kvs_eval_plan_make(&p, (const char *[]){"h2o"}, 1, "0.1", 0, &err) == KVS_OK);
    CHECK(p.has_full == 0);
    kvs_eval_plan_free(&p);
}

static kvs_eval_result result(const char *params, kvs_policy_kind kind, double attended)
{
    kvs_eval_result r = {.kind = kind, .slots_attended_mean = attended};
    snprintf(r.params, sizeof r.params, "%s", params);
    return r;
}

static void check_eq(const kvs_eval_jobs *eq, int i, const char *spec, const char *label,
                     const char *of)
{
    CHECKF(i < eq->n, "eq job %d of %d", i, eq->n);
    if (i >= eq->n)
        return;
    char c[256];
    STREQ(eq->v[i].spec, spec);
    STREQ(eq->v[i].label, label);
    STREQ(eq->v[i].canonical, canonical(spec, c, sizeof c));
    CHECK(eq->v[i].equal_memory_of != NULL);
    if (eq->v[i].equal_memory_of)
        STREQ(eq->v[i].equal_memory_of, of);
}

static void test_equal_memory(void)
{
    kvs_eval_plan p;
    kvs_error err = {0};
    const char *kv[] = {"streaming:sinks=2", "h2o", "snapkv,knorm,random,quest"};
    CHECKF(kvs_eval_plan_make(&p, kv, 3, "0.1", 1, &err) == KVS_OK, "%s", err.msg);
    CHECK(p.n_evicting == 2);

    /* One budget group's rows, as the harness reports them. */
    kvs_eval_result rows[] = {
        result("streaming:budget=0.1,sinks=2", KVS_KIND_EVICTING, 38.0),
        result("h2o:budget=0.1", KVS_KIND_EVICTING, 39.0),
        result("snapkv:budget=0.1", KVS_KIND_ONE_SHOT, 102.5),  /* half up: 103 */
        result("knorm:budget=0.1", KVS_KIND_ONE_SHOT, 103.49),  /* 103 too: merged */
        result("random:budget=0.1", KVS_KIND_ONE_SHOT, 102.49), /* 102 */
        result("quest:budget=0.1", KVS_KIND_SELECTION, 203.7),  /* attended: 204 */
        result("full", KVS_KIND_FULL, 448.5),
    };
    kvs_eval_jobs eq = {0};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        CHECKF(kvs_eval_plan_equal_memory(&p, &rows[k], &eq, &err) == KVS_OK, "%s", err.msg);
    CHECK(eq.n == 6);
    check_eq(&eq, 4, "streaming:slots=204,sinks=2", "eq:204", "quest:budget=0.1");
    check_eq(&eq, 5, "h2o:slots=204", "eq:204", "quest:budget=0.1");
    check_eq(&eq, 0, "streaming:slots=103,sinks=2", "eq:103",
             "snapkv:budget=0.1 knorm:budget=0.1");
    check_eq(&eq, 1, "h2o:slots=103", "eq:103", "snapkv:budget=0.1 knorm:budget=0.1");
    check_eq(&eq, 2, "streaming:slots=102,sinks=2", "eq:102", "random:budget=0.1");
    check_eq(&eq, 3, "h2o:slots=102", "eq:102", "random:budget=0.1");
    kvs_eval_jobs_free(&eq);
    CHECK(eq.n == 0 && eq.v == NULL);

    /* Evicting and full rows: no equal-memory runs. */
    for (int k = 0; k < 2; k++)
        CHECK(kvs_eval_plan_equal_memory(&p, &rows[k], &eq, &err) == KVS_OK);
    CHECK(kvs_eval_plan_equal_memory(&p, &rows[6], &eq, &err) == KVS_OK);
    CHECK(eq.n == 0);

    /* Rounding: exactly .5 goes up, just below stays down. */
    kvs_eval_result r = result("snapkv:budget=0.1", KVS_KIND_ONE_SHOT, 0.5);
    CHECK(kvs_eval_plan_equal_memory(&p, &r, &eq, &err) == KVS_OK);
    r = result("knorm:budget=0.1", KVS_KIND_ONE_SHOT, 1.4999);
    CHECK(kvs_eval_plan_equal_memory(&p, &r, &eq, &err) == KVS_OK);
    CHECK(eq.n == 2); /* both at 1 slot: one row each policy, naming both */
    check_eq(&eq, 0, "streaming:slots=1,sinks=2", "eq:1", "snapkv:budget=0.1 knorm:budget=0.1");
    check_eq(&eq, 1, "h2o:slots=1", "eq:1", "snapkv:budget=0.1 knorm:budget=0.1");
    kvs_eval_jobs_free(&eq);

    /* A one-shot run that attended (almost) nothing gives slots=0, which the parser refuses. */
    r = result("snapkv:budget=0.1", KVS_KIND_ONE_SHOT, 0.2);
    CHECK(kvs_eval_plan_equal_memory(&p, &r, &eq, &err) == KVS_ERR_ARG);
    HAS(err.msg, "slots=0");
    kvs_eval_jobs_free(&eq);
    CHECK(kvs_eval_plan_equal_memory(&p, NULL, &eq, &err) == KVS_ERR_ARG);
    kvs_eval_plan_free(&p);

    /* Without evicting policies to run (--equal-memory off): nothing. */
    CHECKF(kvs_eval_plan_make(&p, (const char *[]){"snapkv"}, 1, "0.1", 0, &err) == KVS_OK, "%s",
           err.msg);
    r = result("snapkv:budget=0.1", KVS_KIND_ONE_SHOT, 102.5);
    CHECK(kvs_eval_plan_equal_memory(&p, &r, &eq, &err) == KVS_OK && eq.n == 0);
    kvs_eval_plan_free(&p);
}

int main(void)
{
    test_budget_items();
    test_with_budget();
    test_policy_label();
    test_jobs();
    test_evicting_default();
    test_plan_errors();
    test_equal_memory();
    test_types();
    return check_summary("test_eval_plan");
}
