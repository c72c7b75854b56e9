/* Eval planning (plan.h): spec x budget expansion, labels, and --equal-memory runs. */
#include "eval/plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/dtype.h"
#include "core/number.h"
#include "kv/kivi.h"
#include "policies/registry.h"

/* ---- string lists ---- */

typedef struct str_list {
    char **v;
    int n, cap;
} str_list;

static int str_add(str_list *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **p = realloc(l->v, sizeof *p * (size_t)cap);
        if (!p)
            return -1;
        l->v = p;
        l->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, s, len);
    c[len] = 0;
    l->v[l->n++] = c;
    return 0;
}

static void str_free(str_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    *l = (str_list){0};
}

/* Splits a comma-separated value into its items (empty ones included: callers check). */
static int split(const char *v, str_list *out)
{
    for (const char *p = v;;) {
        size_t len = strcspn(p, ",");
        if (str_add(out, p, len) != 0)
            return -1;
        p += len;
        if (!*p++)
            return 0;
    }
}

/* User text quoted in a message: kvs_error holds 512 bytes, so text past USER_TEXT_MAX bytes
 * is cut ("xxxx... (600 bytes)") to leave room for the reason that follows it. */
#define USER_TEXT_MAX 200

static const char *clip(const char *s, char *buf, size_t size)
{
    size_t len = strlen(s);
    if (len <= USER_TEXT_MAX)
        return s;
    snprintf(buf, size, "%.*s... (%zu bytes)", USER_TEXT_MAX - 40, s, len);
    return buf;
}

/* ---- jobs ---- */

void kvs_eval_jobs_free(kvs_eval_jobs *jobs)
{
    if (!jobs)
        return;
    for (int i = 0; i < jobs->n; i++) {
        free(jobs->v[i].spec);
        free(jobs->v[i].equal_memory_of);
    }
    free(jobs->v);
    *jobs = (kvs_eval_jobs){0};
}

/* Appends a job running spec (copied), with equal_memory_of (copied; NULL: none). */
static kvs_status jobs_add(kvs_eval_jobs *jobs, const char *spec, const char *canonical,
                           const char *label, const char *equal_memory_of, kvs_error *err)
{
    if (jobs->n == jobs->cap) {
        int cap = jobs->cap ? 2 * jobs->cap : 16;
        kvs_eval_job *p = realloc(jobs->v, sizeof *p * (size_t)cap);
        if (!p)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
        jobs->v = p;
        jobs->cap = cap;
    }
    kvs_eval_job j = {.spec = strdup(spec)};
    if (equal_memory_of)
        j.equal_memory_of = strdup(equal_memory_of);
    if (!j.spec || (equal_memory_of && !j.equal_memory_of)) {
        free(j.spec);
        free(j.equal_memory_of);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    snprintf(j.canonical, sizeof j.canonical, "%s", canonical);
    snprintf(j.label, sizeof j.label, "%s", label);
    jobs->v[jobs->n++] = j;
    return KVS_OK;
}

/* ---- pieces ---- */

/* Is this item of a spec its budget (a fraction, budget=, or a count, slots=)? */
static int is_budget_item(const char *item)
{
    return !strncmp(item, "budget=", 7) || !strncmp(item, "slots=", 6);
}

int kvs_eval_with_budget(const char *spec, const char *item, char *out, size_t size)
{
    const char *colon = strchr(spec, ':');
    size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
    size_t len = (size_t)snprintf(out, size, "%.*s:%s", (int)name_len, spec, item);
    for (const char *p = colon ? colon + 1 : ""; *p && len < size;) {
        size_t n = strcspn(p, ",");
        if (n && !is_budget_item(p))
            len += (size_t)snprintf(out + len, size - len, ",%.*s", (int)n, p);
        p += n;
        if (*p == ',')
            p++;
    }
    return len < size ? 0 : -1;
}

/* A bare whole number is refused: "1" read as one slot where "1.0" is the whole prompt. */
kvs_status kvs_eval_budget_item(const char *item, char *spec_item, size_t spec_item_size,
                                char *label, size_t label_size, kvs_error *err)
{
    int64_t count;
    double x;
    size_t len = strlen(item);
    char c[USER_TEXT_MAX + 1];
    if (!strncmp(item, "slots=", 6)) {
        if (kvs_parse_i64(item + 6, 1, INT32_MAX, &count) != 0)
            return kvs_fail(err, KVS_ERR_ARG, "--budget %s: slots= takes a whole number of slots "
                            "per layer and KV head, e.g. slots=96", clip(item, c, sizeof c));
        snprintf(spec_item, spec_item_size, "%s", item);
        snprintf(label, label_size, "%s", item + 6);
        return KVS_OK;
    }
    if (len > 1 && item[len - 1] == '%') {
        char num[64];
        snprintf(num, sizeof num, "%.*s", (int)(len - 1), item);
        if (kvs_parse_f64(num, -INFINITY, INFINITY, &x) == 0) {
            snprintf(spec_item, spec_item_size, "budget=%s", item);
            snprintf(label, label_size, "%s", item);
            return KVS_OK;
        }
    } else if (kvs_number_has_point(item) && kvs_parse_f64(item, -INFINITY, INFINITY, &x) == 0) {
        snprintf(spec_item, spec_item_size, "budget=%s", item);
        snprintf(label, label_size, "%s", item);
        return KVS_OK;
    } else if (kvs_parse_i64(item, INT64_MIN, INT64_MAX, &count) == 0) {
        return kvs_fail(err, KVS_ERR_ARG, "--budget %s: a bare whole number is ambiguous; write "
                        "%s%% (or a fraction with a point) for a share of the prompt, or slots=%s "
                        "for %s slots per layer and KV head", item, item, item, item);
    }
    return kvs_fail(err, KVS_ERR_ARG, "--budget %s: expected a fraction of the prompt (0.25 or "
                    "25%%) or a slot count (slots=96)", clip(item, c, sizeof c));
}

/* The budget label of a spec that carries its own budget: the value as the user typed it
 * ("0.1", "25%"; a slot count as its number), "-" without one. */
static void own_budget_label(const char *spec, char *label, size_t size)
{
    snprintf(label, size, "-");
    const char *colon = strchr(spec, ':');
    for (const char *p = colon ? colon + 1 : ""; *p;) {
        size_t n = strcspn(p, ",");
        if (is_budget_item(p)) {
            const char *v = strchr(p, '=') + 1;
            snprintf(label, size, "%.*s", (int)(n - (size_t)(v - p)), v);
        }
        p += n;
        if (*p == ',')
            p++;
    }
}

void kvs_eval_policy_label(const char *params, char *buf, size_t size)
{
    const char *colon = strchr(params, ':');
    size_t len = (size_t)snprintf(buf, size, "%.*s",
                                  (int)(colon ? (size_t)(colon - params) : strlen(params)),
                                  params);
    char sep = ':';
    for (const char *p = colon ? colon + 1 : ""; *p && len < size;) {
        size_t n = strcspn(p, ",");
        if (!is_budget_item(p)) {
            len += (size_t)snprintf(buf + len, size - len, "%c%.*s", sep, (int)n, p);
            sep = ',';
        }
        p += n;
        if (*p == ',')
            p++;
    }
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

/* ---- the plan ---- */

/* The values of a repeatable list flag (--kv, --kv-type) as items: a value with a comma and no
 * '=' or ':' is a list of bare names ("full,h2o,snapkv", "f16,kivi4"); any other value is one
 * item, commas and all ("h2o:budget=0.1,window=8", "kivi:kbits=4,vbits=2"). */
static kvs_status collect_items(const char *flag, const char *const *vals, int n_vals,
                                str_list *out, kvs_error *err)
{
    for (int k = 0; k < n_vals; k++) {
        const char *v = vals[k];
        int is_list = strchr(v, ',') && !strchr(v, '=') && !strchr(v, ':');
        if (is_list && (v[0] == ',' || strstr(v, ",,") || v[strlen(v) - 1] == ',')) {
            char c[USER_TEXT_MAX + 1];
            return kvs_fail(err, KVS_ERR_ARG, "%s '%s': empty item in the list", flag,
                            clip(v, c, sizeof c));
        }
        if (is_list ? split(v, out) != 0 : str_add(out, v, strlen(v)) != 0)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    return KVS_OK;
}

static kvs_status spec_too_long(kvs_error *err, const char *spec)
{
    char c[USER_TEXT_MAX + 1];
    return kvs_fail(err, KVS_ERR_ARG, "--kv %s: spec too long", clip(spec, c, sizeof c));
}

/* A spec the parser refused (in err), in the user's terms: the parser names the spec it was
 * given ("--kv h2o:budget=1.5: ..."), which with --budget is one the user never typed. */
static void budget_error(kvs_error *err, const char *spec, const char *use, const char *budget)
{
    char prefix[600];
    int len = snprintf(prefix, sizeof prefix, "--kv %s: ", use);
    if (!err || !budget || strncmp(err->msg, prefix, (size_t)len) != 0)
        return;
    kvs_error e = *err;
    kvs_fail(err, e.code, "--kv %s with --budget %s: %s", spec, budget, e.msg + len);
}

/* The runs of one non-full spec: at each budget, or at its own. */
static kvs_status plan_spec(kvs_eval_plan *plan, const char *spec, const str_list *budgets,
                            kvs_error *err)
{
    for (int b = 0; b < plan->n_groups; b++) {
        char text[512], item[128], label[48];
        const char *use = spec;
        kvs_status st;
        if (budgets->n) {
            st = kvs_eval_budget_item(budgets->v[b], item, sizeof item, label, sizeof label, err);
            if (st != KVS_OK)
                return st;
            if (kvs_eval_with_budget(spec, item, text, sizeof text) != 0)
                return spec_too_long(err, spec);
            use = text;
        } else {
            own_budget_label(spec, label, sizeof label);
        }
        kvs_policy_spec parsed;
        if ((st = kvs_policy_parse(use, &parsed, err)) != KVS_OK) {
            budget_error(err, spec, use, budgets->n ? budgets->v[b] : NULL);
            return st;
        }
        if ((st = jobs_add(&plan->jobs, use, parsed.text, label, NULL, err)) != KVS_OK)
            return st;
    }
    return KVS_OK;
}

static kvs_status plan_all(kvs_eval_plan *plan, const str_list *specs, const str_list *budgets,
                           int equal_memory, str_list *evicting, kvs_error *err)
{
    kvs_status st;
    plan->n_groups = budgets->n ? budgets->n : 1;
    for (int s = 0; s < specs->n; s++) {
        const char *spec = specs->v[s];
        kvs_policy_spec parsed;
        const kvs_policy_type *t = spec_type(spec);
        if (t && t->kind == KVS_KIND_FULL) { /* the reference is always run; it only parses */
            if ((st = kvs_policy_parse(spec, &parsed, err)) != KVS_OK)
                return st;
            plan->has_full = 1;
            continue;
        }
        if (t && !kvs_policy_kind_has_budget(t->kind)) {
            if ((st = kvs_policy_parse(spec, &parsed, err)) != KVS_OK ||
                (st = jobs_add(&plan->plain, spec, parsed.text, "-", NULL, err)) != KVS_OK)
                return st;
            continue;
        }
        if ((st = plan_spec(plan, spec, budgets, err)) != KVS_OK)
            return st;
        if (t && t->kind == KVS_KIND_EVICTING && str_add(evicting, spec, strlen(spec)))
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    if (equal_memory && evicting->n == 0) {
        int n_types;
        const kvs_policy_type *const *types = kvs_policy_types(&n_types);
        for (int i = 0; i < n_types; i++)
            if (types[i]->kind == KVS_KIND_EVICTING &&
                str_add(evicting, types[i]->name, strlen(types[i]->name)))
                return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    return KVS_OK;
}

kvs_status kvs_eval_plan_make(kvs_eval_plan *plan, const char *const *kv, int n_kv,
                              const char *budgets, int equal_memory, kvs_error *err)
{
    if (!plan)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_eval_plan_make: plan is NULL");
    *plan = (kvs_eval_plan){0};
    if (n_kv < 0 || (n_kv > 0 && !kv))
        return kvs_fail(err, KVS_ERR_ARG, "kvs_eval_plan_make: no --kv values");
    str_list specs = {0}, items = {0}, evicting = {0};
    kvs_status st = collect_items("--kv", kv, n_kv, &specs, err);
    if (st == KVS_OK && budgets && split(budgets, &items) != 0)
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    if (st == KVS_OK)
        st = plan_all(plan, &specs, &items, equal_memory, &evicting, err);
    str_free(&specs);
    str_free(&items);
    if (st != KVS_OK) {
        str_free(&evicting);
        kvs_eval_plan_free(plan);
        return st;
    }
    plan->evicting = evicting.v;
    plan->n_evicting = evicting.n;
    return KVS_OK;
}

void kvs_eval_plan_free(kvs_eval_plan *plan)
{
    if (!plan)
        return;
    kvs_eval_jobs_free(&plan->jobs);
    kvs_eval_jobs_free(&plan->plain);
    for (int i = 0; i < plan->n_evicting; i++)
        free(plan->evicting[i]);
    free(plan->evicting);
    *plan = (kvs_eval_plan){0};
}

int kvs_eval_plan_group_size(const kvs_eval_plan *plan)
{
    return plan && plan->n_groups > 0 ? plan->jobs.n / plan->n_groups : 0;
}

const kvs_eval_job *kvs_eval_plan_job(const kvs_eval_plan *plan, int group, int i)
{
    if (group < 0 || group >= (plan ? plan->n_groups : 0) || i < 0 ||
        i >= kvs_eval_plan_group_size(plan))
        return NULL;
    return &plan->jobs.v[i * plan->n_groups + group];
}

/* Adds " params" to a job's equal_memory_of. */
static kvs_status add_source(kvs_eval_job *j, const char *params, kvs_error *err)
{
    size_t len = strlen(j->equal_memory_of), add = strlen(params);
    char *p = realloc(j->equal_memory_of, len + 1 + add + 1);
    if (!p)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    p[len] = ' ';
    memcpy(p + len + 1, params, add + 1);
    j->equal_memory_of = p;
    return KVS_OK;
}

kvs_status kvs_eval_plan_equal_memory(const kvs_eval_plan *plan, const kvs_eval_result *run,
                                      kvs_eval_jobs *eq, kvs_error *err)
{
    if (!plan || !run || !eq)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_eval_plan_equal_memory: NULL argument");
    /* Runs that attend fewer slots than they hold (a selection or offloading policy attends a
     * budget of everything it keeps) are matched on what they attend, as one-shot runs are. */
    if (run->kind != KVS_KIND_ONE_SHOT && run->kind != KVS_KIND_SELECTION &&
        run->kind != KVS_KIND_OFFLOADING)
        return KVS_OK;
    int slots = (int)floor(run->slots_attended_mean + 0.5);
    char item[32], label[48];
    snprintf(item, sizeof item, "slots=%d", slots);
    snprintf(label, sizeof label, "eq:%d", slots);
    for (int s = 0; s < plan->n_evicting; s++) {
        char text[512];
        if (kvs_eval_with_budget(plan->evicting[s], item, text, sizeof text) != 0)
            return spec_too_long(err, plan->evicting[s]);
        kvs_policy_spec parsed;
        kvs_status st = kvs_policy_parse(text, &parsed, err);
        if (st != KVS_OK)
            return st;
        int prev = -1;
        for (int q = 0; q < eq->n && prev < 0; q++)
            if (!strcmp(eq->v[q].canonical, parsed.text))
                prev = q;
        st = prev >= 0 ? add_source(&eq->v[prev], run->params, err)
                       : jobs_add(eq, text, parsed.text, label, run->params, err);
        if (st != KVS_OK)
            return st;
    }
    return KVS_OK;
}

/* ---- storage types ---- */

void kvs_eval_types_free(kvs_eval_types *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        free(t->v[i]);
    free(t->v);
    *t = (kvs_eval_types){0};
}

int kvs_eval_type_is_f32(const char *type)
{
    kvs_dtype d;
    return !type || (kvs_dtype_parse(type, &d) == 0 && d == KVS_F32);
}

/* One storage type as the session will read it: f32, f16 or a KIVI type (kv/kivi.h). */
static kvs_status check_type(const char *given, const char *type, kvs_error *err)
{
    char c[USER_TEXT_MAX + 1], g[USER_TEXT_MAX + 1];
    kvs_kivi_cfg kivi;
    kvs_error kerr = {0};
    int is_kivi = kvs_kivi_parse(type, &kivi, &kerr);
    if (is_kivi > 0)
        return KVS_OK;
    if (is_kivi < 0) /* its message names the type: "--kv-type kivi:bits=4: unknown ..." */
        return kvs_fail(err, KVS_ERR_ARG, "%s", kerr.msg);
    kvs_dtype d;
    if (kvs_dtype_parse(type, &d) == 0 && (d == KVS_F32 || d == KVS_F16))
        return KVS_OK;
    /* The words and message of the other commands' --kv-type check (tools/cli_flags.c). */
    if (strchr(type, ',')) /* "f32,kivi:kbits=4" is one item, by --kv's rule */
        return kvs_fail(err, KVS_ERR_ARG, "--kv-type: unknown type '%s' (expected f32, f16, "
                        "kivi4, kivi2, kivi:...; a kivi:key=value,... type takes a --kv-type "
                        "of its own)", clip(type, c, sizeof c));
    if (!strcmp(given, type))
        return kvs_fail(err, KVS_ERR_ARG, "--kv-type: unknown type '%s' (expected f32, f16, "
                        "kivi4, kivi2, kivi:...)", clip(type, c, sizeof c));
    return kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: unknown type '%s' (expected f32, f16, "
                    "kivi4, kivi2, kivi:...)", clip(given, g, sizeof g), clip(type, c, sizeof c));
}

kvs_status kvs_eval_types_make(kvs_eval_types *t, const char *const *vals, int n_vals,
                               kvs_error *err)
{
    if (!t)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_eval_types_make: types is NULL");
    *t = (kvs_eval_types){0};
    if (n_vals < 0 || (n_vals > 0 && !vals))
        return kvs_fail(err, KVS_ERR_ARG, "kvs_eval_types_make: no --kv-type values");
    static const char *const f32[] = {"f32"};
    if (n_vals == 0) {
        vals = f32;
        n_vals = 1;
    }
    str_list items = {0};
    kvs_status st = KVS_OK;
    /* Value by value, so a message quotes the value the user typed. */
    for (int k = 0; k < n_vals && st == KVS_OK; k++) {
        int first = items.n;
        st = collect_items("--kv-type", vals + k, 1, &items, err);
        for (int i = first; i < items.n && st == KVS_OK; i++) {
            st = check_type(vals[k], items.v[i], err);
            for (int j = 0; j < i && st == KVS_OK; j++)
                if (!strcasecmp(items.v[j], items.v[i])) {
                    char c[USER_TEXT_MAX + 1];
                    st = kvs_fail(err, KVS_ERR_ARG, "--kv-type %s is listed twice",
                                  clip(items.v[i], c, sizeof c));
                }
        }
    }
    if (st != KVS_OK) {
        str_free(&items);
        return st;
    }
    t->v = items.v;
    t->n = items.n;
    return KVS_OK;
}
