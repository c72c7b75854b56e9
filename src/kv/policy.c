/* Policy registry, "--kv" spec parsing, budgets, and the shared keep-top eviction routine. */
#include "kv/policy.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policies.h"

static const kvs_policy_type *const registry[] = {KVS_POLICY_REGISTRY};
#define N_POLICIES ((int)(sizeof registry / sizeof registry[0]))

const kvs_policy_type *const *kvs_policy_types(int *n)
{
    *n = N_POLICIES;
    return registry;
}

const kvs_policy_type *kvs_policy_find(const char *name)
{
    for (int i = 0; i < N_POLICIES; i++)
        if (!strcmp(registry[i]->name, name))
            return registry[i];
    return NULL;
}

static void list_names(char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < N_POLICIES && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? ", " : "", registry[i]->name);
}

static void list_keys(const kvs_policy_type *t, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "%s", t->kind == KVS_KIND_FULL ? "" : "budget");
    for (int i = 0; i < t->n_params && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", t->params[i].name);
    if (len == 0)
        snprintf(buf, size, "none");
}

/* The words of a word-valued parameter, or NULL for a number. */
static const char *const *param_words(const kvs_policy_type *t, const char *name)
{
    for (int i = 0; i < t->n_words; i++)
        if (!strcmp(t->words[i].param, name))
            return t->words[i].words;
    return NULL;
}

static void join_words(const char *const *w, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; w[i] && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? "|" : "", w[i]);
}

static kvs_status parse_number(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return KVS_ERR_ARG;
    *out = v;
    return KVS_OK;
}

static kvs_status parse_budget(kvs_policy_spec *spec, const char *val, kvs_error *err)
{
    double v;
    if (parse_number(val, &v) != KVS_OK || v <= 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget '%s' must be a fraction of the prompt in (0, 1] (e.g. "
                        "0.25) or a whole number of tokens >= 1 (e.g. 1024)",
                        spec->type->name, val);
    int fraction = strpbrk(val, ".eE") != NULL;
    if (fraction && v > 1)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget %s: a fraction must be in (0, 1]; write a token count "
                        "as a whole number", spec->type->name, val);
    if (!fraction && (v != floor(v) || v > INT32_MAX))
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: budget %s is not a valid token count",
                        spec->type->name, val);
    spec->budget = v;
    spec->budget_is_fraction = fraction;
    return KVS_OK;
}

kvs_status kvs_policy_parse(const char *text, kvs_policy_spec *out, kvs_error *err)
{
    char names[256], keys[256];
    memset(out, 0, sizeof *out);
    const char *colon = strchr(text, ':');
    size_t name_len = colon ? (size_t)(colon - text) : strlen(text);
    char name[64];
    if (name_len >= sizeof name)
        name_len = sizeof name - 1;
    memcpy(name, text, name_len);
    name[name_len] = 0;
    out->type = kvs_policy_find(name);
    if (!out->type) {
        list_names(names, sizeof names);
        return kvs_fail(err, KVS_ERR_ARG, "--kv: unknown policy '%s' (accepted: %s; see --kv help)",
                        name, names);
    }
    const kvs_policy_type *t = out->type;
    for (int i = 0; i < t->n_params; i++)
        out->values[i] = t->params[i].def;
    if (colon && colon[1]) {
        char *copy = strdup(colon + 1), *save = NULL;
        if (!copy)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
        kvs_status st = KVS_OK;
        for (char *kv = strtok_r(copy, ",", &save); kv && st == KVS_OK;
             kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) {
                st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: '%s' is not key=value", t->name, kv);
                break;
            }
            *eq = 0;
            const char *key = kv, *val = eq + 1;
            if (!strcmp(key, "budget") && t->kind != KVS_KIND_FULL) {
                st = parse_budget(out, val, err);
                continue;
            }
            int i;
            for (i = 0; i < t->n_params; i++)
                if (!strcmp(t->params[i].name, key))
                    break;
            if (i == t->n_params) {
                list_keys(t, keys, sizeof keys);
                st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: unknown parameter '%s' (accepted: %s)",
                              t->name, key, keys);
                break;
            }
            const kvs_param_def *d = &t->params[i];
            const char *const *words = param_words(t, key);
            if (words) {
                int w = 0;
                while (words[w] && strcmp(words[w], val))
                    w++;
                if (!words[w]) {
                    join_words(words, keys, sizeof keys);
                    st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s=%s is not one of %s", t->name,
                                  key, val, keys);
                    break;
                }
                out->values[i] = w;
                continue;
            }
            double v;
            if (parse_number(val, &v) != KVS_OK || v < d->min || v > d->max ||
                (d->integer && v != floor(v))) {
                st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s=%s is out of range (%s in [%g, %g])",
                              t->name, key, val, d->integer ? "a whole number" : "a number",
                              d->min, d->max);
                break;
            }
            out->values[i] = v;
        }
        free(copy);
        if (st != KVS_OK)
            return st;
    }
    if (t->kind != KVS_KIND_FULL && out->budget == 0)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: needs budget=F (fraction of the prompt) or "
                        "budget=N (tokens)", t->name);
    /* Canonical text: name, budget, then every parameter that differs from its default. */
    size_t len = (size_t)snprintf(out->text, sizeof out->text, "%s", t->name);
    char sep = ':';
    if (t->kind != KVS_KIND_FULL) {
        /* A fraction keeps its decimal point, so the text parses back to the same budget. */
        char b[32];
        snprintf(b, sizeof b, "%.10g", out->budget);
        if (out->budget_is_fraction && !strpbrk(b, ".eE"))
            strcat(b, ".0");
        len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%cbudget=%s", sep, b);
        sep = ',';
    }
    for (int i = 0; i < t->n_params && len < sizeof out->text; i++)
        if (out->values[i] != t->params[i].def) {
            const char *const *words = param_words(t, t->params[i].name);
            if (words)
                len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%c%s=%s", sep,
                                        t->params[i].name, words[(int)out->values[i]]);
            else
                len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%c%s=%g", sep,
                                        t->params[i].name, out->values[i]);
            sep = ',';
        }
    return KVS_OK;
}

static const char *kind_name(kvs_policy_kind k)
{
    switch (k) {
    case KVS_KIND_FULL: return "reference";
    case KVS_KIND_EVICTING: return "evicting: holds the budget through prefill and decoding";
    case KVS_KIND_ONE_SHOT: return "one-shot: compresses the prompt once, then appends";
    case KVS_KIND_SELECTION: return "selection: keeps all, attends the budget each step";
    }
    return "";
}

void kvs_policy_help(FILE *f)
{
    fprintf(f, "KV policies: --kv NAME[:key=value,...]\n"
               "budget=F with 0 < F <= 1 (written with a decimal point, e.g. 0.25 or 1.0) is a "
               "fraction of the prompt,\nround(F x prompt) slots, half up; budget=N (a whole "
               "number) is N slots; per layer and KV head.\n\n");
    for (int i = 0; i < N_POLICIES; i++) {
        const kvs_policy_type *t = registry[i];
        fprintf(f, "%-10s %s\n           (%s)\n", t->name, t->summary, kind_name(t->kind));
        if (t->kind != KVS_KIND_FULL)
            fprintf(f, "           budget      required\n");
        for (int j = 0; j < t->n_params; j++) {
            const char *const *words = param_words(t, t->params[j].name);
            char list[128];
            if (words) {
                join_words(words, list, sizeof list);
                fprintf(f, "           %-11s default %s, one of %s: %s\n", t->params[j].name,
                        words[(int)t->params[j].def], list, t->params[j].help);
            } else {
                fprintf(f, "           %-11s default %.10g, range [%.10g, %.10g]: %s\n",
                        t->params[j].name, t->params[j].def, t->params[j].min, t->params[j].max,
                        t->params[j].help);
            }
        }
    }
}

double kvs_policy_param(const kvs_policy *p, const char *name)
{
    for (int i = 0; i < p->type->n_params; i++)
        if (!strcmp(p->type->params[i].name, name))
            return p->spec.values[i];
    return 0.0;
}

int kvs_policy_budget_slots(const kvs_policy_spec *spec, int n_prompt)
{
    if (spec->budget <= 0)
        return INT32_MAX;
    if (!spec->budget_is_fraction)
        return (int)spec->budget;
    double b = floor(spec->budget * n_prompt + 0.5);
    return b < 1 ? 1 : (int)b;
}

kvs_status kvs_policy_add_group_mean(const kvs_policy *p, int layer, const kvs_chunk *c,
                                     float *score, int stride, kvs_error *err)
{
    const int group = p->n_heads / p->n_kv_heads;
    const float inv = 1.0f / (float)group;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n > stride) /* slots from before this prompt: not a state these policies support */
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %d slots for a prompt of %d tokens",
                            p->spec.text, n, stride);
        float *dst = score + (size_t)h * stride;
        for (int g = 0; g < group; g++) {
            const float *cs = c->colsum + (size_t)(h * group + g) * c->colsum_stride;
            for (int j = 0; j < n; j++)
                dst[j] += cs[j] * inv;
        }
    }
    return KVS_OK;
}

typedef struct ranked {
    float score;
    int slot;
} ranked;

static int by_score_keep_older(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->slot - y->slot;
}

static int by_score_keep_newer(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return y->slot - x->slot;
}

static int by_slot(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int kvs_evict_keep_top(kvs_store *s, int layer, int head, const float *score, int budget,
                       int sinks, int recent, kvs_tie tie)
{
    const int n = kvs_store_count(s, layer, head);
    if (n <= budget)
        return n;
    if (sinks > budget)
        sinks = budget;
    if (recent > budget - sinks)
        recent = budget - sinks;
    int *keep = malloc(sizeof(int) * (size_t)budget);
    ranked *mid = malloc(sizeof(ranked) * (size_t)n);
    if (!keep || !mid) {
        /* Without memory for ranking, fall back to keeping the sinks and the newest slots. */
        free(mid);
        if (!keep)
            return n;
        int k = 0;
        for (int i = 0; i < sinks; i++)
            keep[k++] = i;
        for (int i = n - (budget - sinks); i < n; i++)
            keep[k++] = i;
        kvs_store_keep(s, layer, head, keep, k);
        free(keep);
        return k;
    }
    /* Slots are sorted by position, so sinks are a prefix and the recent window a suffix. */
    int k = 0, n_mid = 0;
    for (int i = 0; i < sinks; i++)
        keep[k++] = i;
    for (int i = sinks; i < n - recent; i++)
        mid[n_mid++] = (ranked){score[i], i};
    qsort(mid, (size_t)n_mid, sizeof *mid,
          tie == KVS_TIE_KEEP_OLDER ? by_score_keep_older : by_score_keep_newer);
    for (int i = 0; i < budget - sinks - recent; i++)
        keep[k++] = mid[i].slot;
    for (int i = n - recent; i < n; i++)
        keep[k++] = i;
    qsort(keep, (size_t)k, sizeof *keep, by_slot);
    kvs_store_keep(s, layer, head, keep, k);
    free(keep);
    free(mid);
    return k;
}
