/* The policy registry, "--kv" spec parsing and the policy list of --kv help. */
#include "policies/registry.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/number.h"
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
    size_t len =
        (size_t)snprintf(buf, size, "%s", kvs_policy_kind_has_budget(t->kind) ? "budget" : "");
    for (int i = 0; i < t->n_params && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", t->params[i].name);
    if (t->path_param && len < size)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", t->path_param);
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

/* A parameter value as the canonical text writes it: whole numbers in full, others with the
 * fewest digits that read back to the same double. */
static void format_exact(char *buf, size_t size, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.0f", v);
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* budget=F (a decimal point or exponent, 0 < F <= 1) or budget=P% (0 < P <= 100). A whole
 * number is refused: "budget=1" reads as one slot to some and the whole prompt to others. */
static kvs_status parse_budget(kvs_policy_spec *spec, const char *text, const char *val,
                               kvs_error *err)
{
    double v;
    size_t len = strlen(val);
    if (len > 0 && val[len - 1] == '%') {
        char num[64];
        if (len - 1 >= sizeof num || (memcpy(num, val, len - 1), num[len - 1] = 0,
                                      kvs_parse_f64(num, 0, 100, &v) != 0) || v <= 0)
            return kvs_fail(err, KVS_ERR_ARG,
                            "--kv %s: budget=%s: a percentage of the prompt must be a decimal "
                            "number in (0, 100] followed by %% (e.g. budget=25%%)", text, val);
        spec->budget = v / 100;
        spec->budget_is_fraction = 1;
        return KVS_OK;
    }
    int64_t whole;
    if (kvs_parse_i64(val, INT64_MIN, INT64_MAX, &whole) == 0) {
        if (whole == 1)
            return kvs_fail(err, KVS_ERR_ARG,
                            "--kv %s: budget=1 is ambiguous: write budget=1.0 or budget=100%% for "
                            "the whole prompt, or slots=1 for one slot", text);
        if (whole > 1)
            return kvs_fail(err, KVS_ERR_ARG,
                            "--kv %s: budget=%s is ambiguous: write slots=%s for %s slots, or a "
                            "fraction of the prompt with a decimal point or a percent (e.g. "
                            "budget=0.25 or budget=25%%)", text, val, val, val);
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget=%s: the budget must be positive: a fraction of the "
                        "prompt in (0, 1] (e.g. budget=0.25 or budget=25%%) or slots=N", text,
                        val);
    }
    if (kvs_parse_f64(val, 0, 1, &v) != 0 || v <= 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: budget=%s: a fraction of the prompt must be a decimal number in "
                        "(0, 1] (e.g. budget=0.25 or budget=25%%); a number of slots is slots=N",
                        text, val);
    spec->budget = v;
    spec->budget_is_fraction = 1;
    return KVS_OK;
}

static kvs_status parse_slots(kvs_policy_spec *spec, const char *text, const char *val,
                              kvs_error *err)
{
    int64_t n;
    if (kvs_parse_i64(val, 1, INT32_MAX, &n) != 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: slots=%s: a number of slots is a whole number in [1, %d]; a "
                        "fraction of the prompt is budget=F (e.g. budget=0.25 or budget=25%%)",
                        text, val, INT32_MAX);
    spec->budget = (double)n;
    spec->budget_is_fraction = 0;
    return KVS_OK;
}

static kvs_status parse_param(kvs_policy_spec *out, const char *text, int i, const char *val,
                              kvs_error *err)
{
    const kvs_policy_type *t = out->type;
    const kvs_param_def *d = &t->params[i];
    const char *const *words = param_words(t, d->name);
    char list[256], lo[32], hi[32];
    if (words) {
        int w = 0;
        while (words[w] && strcmp(words[w], val))
            w++;
        if (!words[w]) {
            join_words(words, list, sizeof list);
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s=%s is not one of %s", text, d->name,
                            val, list);
        }
        out->values[i] = w;
        return KVS_OK;
    }
    double v;
    int64_t n;
    int bad = d->integer ? kvs_parse_i64(val, INT64_MIN, INT64_MAX, &n) != 0
                         : kvs_parse_f64(val, -HUGE_VAL, HUGE_VAL, &v) != 0;
    if (d->integer && !bad)
        v = (double)n;
    if (bad || v < d->min || v > d->max)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s=%s is out of range (%s in [%s, %s])", text,
                        d->name, val, d->integer ? "a whole number" : "a decimal number",
                        kvs_format_number(lo, sizeof lo, d->min),
                        kvs_format_number(hi, sizeof hi, d->max));
    out->values[i] = v;
    return KVS_OK;
}

/* One key=value item. seen[] marks keys already given: params by index, then budget/slots
 * (shared: one budget) and shift. */
enum { SEEN_BUDGET = KVS_MAX_PARAMS, SEEN_SHIFT, SEEN_PATH, N_SEEN };

static kvs_status parse_item(kvs_policy_spec *out, const char *text, const char *key,
                             const char *val, char *seen, const char **budget_key, kvs_error *err)
{
    const kvs_policy_type *t = out->type;
    char keys[256];
    int budget_key_here = !strcmp(key, "budget") || !strcmp(key, "slots");
    if (budget_key_here && kvs_policy_kind_has_budget(t->kind)) {
        if (seen[SEEN_BUDGET])
            return !strcmp(*budget_key, key)
                       ? kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s is given twice", text, key)
                       : kvs_fail(err, KVS_ERR_ARG, "--kv %s: give budget=F (a fraction of the "
                                  "prompt) or slots=N (a number of slots), not both", text);
        seen[SEEN_BUDGET] = 1;
        *budget_key = !strcmp(key, "budget") ? "budget" : "slots";
        return key[0] == 'b' ? parse_budget(out, text, val, err)
                             : parse_slots(out, text, val, err);
    }
    if (budget_key_here && t->kind == KVS_KIND_MERGING)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s takes no budget: it attends every "
                        "position (its parameters set its memory)", text, t->name);
    if (!strcmp(key, "shift")) {
        if (t->kind != KVS_KIND_EVICTING) {
            char list[256];
            size_t len = 0;
            list[0] = 0;
            for (int i = 0; i < N_POLICIES && len < sizeof list; i++)
                if (registry[i]->kind == KVS_KIND_EVICTING)
                    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                            len ? ", " : "", registry[i]->name);
            return kvs_fail(err, KVS_ERR_ARG,
                            "--kv %s: shift=%s: position shifting is only for evicting policies "
                            "(%s), whose cache stays bounded; %s is not one", text, val, list,
                            t->name);
        }
        if (seen[SEEN_SHIFT])
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: shift is given twice", text);
        seen[SEEN_SHIFT] = 1;
        if (strcmp(val, "on") && strcmp(val, "off"))
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: shift=%s is not one of on|off", text, val);
        out->shift = !strcmp(val, "on");
        return KVS_OK;
    }
    if (t->path_param && !strcmp(key, t->path_param)) {
        if (seen[SEEN_PATH])
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s is given twice", text, key);
        seen[SEEN_PATH] = 1;
        if (!val[0])
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s= needs a file path", text, key);
        if (strlen(val) >= sizeof out->path)
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: the %s path is longer than %zu bytes",
                            text, key, sizeof out->path - 1);
        snprintf(out->path, sizeof out->path, "%s", val);
        return KVS_OK;
    }
    for (int i = 0; i < t->n_params; i++)
        if (!strcmp(t->params[i].name, key)) {
            if (seen[i])
                return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %s is given twice", text, key);
            seen[i] = 1;
            return parse_param(out, text, i, val, err);
        }
    list_keys(t, keys, sizeof keys);
    return kvs_fail(err, KVS_ERR_ARG, "--kv %s: unknown parameter '%s' (accepted: %s)", text, key,
                    keys);
}

/* Canonical text: name, budget (budget=F with a decimal point, or slots=N), every parameter that
 * differs from its default, then shift=on. Parses back to the same spec. */
static void canonical_text(kvs_policy_spec *out)
{
    const kvs_policy_type *t = out->type;
    size_t len = (size_t)snprintf(out->text, sizeof out->text, "%s", t->name);
    char sep = ':', b[40];
    if (kvs_policy_kind_has_budget(t->kind)) {
        if (out->budget_is_fraction) {
            snprintf(b, sizeof b, "%.10g", out->budget);
            if (!strpbrk(b, ".eE"))
                strcat(b, ".0");
            len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%cbudget=%s", sep,
                                    b);
        } else {
            len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%cslots=%.0f", sep,
                                    out->budget);
        }
        sep = ',';
    }
    for (int i = 0; i < t->n_params && len < sizeof out->text; i++)
        if (out->values[i] != t->params[i].def) {
            const char *const *words = param_words(t, t->params[i].name);
            if (words)
                snprintf(b, sizeof b, "%s", words[(int)out->values[i]]);
            else
                format_exact(b, sizeof b, out->values[i]);
            len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%c%s=%s", sep,
                                    t->params[i].name, b);
            sep = ',';
        }
    if (out->path[0] && len < sizeof out->text) {
        len += (size_t)snprintf(out->text + len, sizeof out->text - len, "%c%s=%s", sep,
                                t->path_param, out->path);
        sep = ',';
    }
    if (out->shift && len < sizeof out->text)
        snprintf(out->text + len, sizeof out->text - len, "%cshift=on", sep);
}

kvs_status kvs_policy_parse(const char *text, kvs_policy_spec *out, kvs_error *err)
{
    char names[256];
    memset(out, 0, sizeof *out);
    snprintf(out->user, sizeof out->user, "%s", text);
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
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for --kv %s", text);
        char seen[N_SEEN] = {0};
        const char *budget_key = "";
        kvs_status st = KVS_OK;
        for (char *kv = strtok_r(copy, ",", &save); kv && st == KVS_OK;
             kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) {
                st = kvs_fail(err, KVS_ERR_ARG, "--kv %s: '%s' is not key=value", text, kv);
                break;
            }
            *eq = 0;
            st = parse_item(out, text, kv, eq + 1, seen, &budget_key, err);
        }
        free(copy);
        if (st != KVS_OK)
            return st;
    }
    if (kvs_policy_kind_has_budget(t->kind) && out->budget == 0)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: needs budget=F (a fraction of the prompt, "
                        "e.g. budget=0.25 or budget=25%%) or slots=N (a number of slots)", text);
    canonical_text(out);
    if (strlen(out->text) + 1 >= sizeof out->text)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: the specification is longer than %zu bytes",
                        text, sizeof out->text - 2);
    return KVS_OK;
}

static const char *kind_name(kvs_policy_kind k)
{
    switch (k) {
    case KVS_KIND_FULL: return "reference";
    case KVS_KIND_EVICTING: return "evicting: holds the budget through prefill and decoding";
    case KVS_KIND_ONE_SHOT: return "one-shot: compresses the prompt once, then appends";
    case KVS_KIND_SELECTION: return "selection: keeps all, attends the budget each step";
    case KVS_KIND_OFFLOADING: return "offloading: keeps all, most in a slow tier, attends the "
                                     "budget each step";
    case KVS_KIND_MERGING: return "merging: attends every position, adjacent layers share K/V; "
                                  "no budget";
    }
    return "";
}

void kvs_policy_help(FILE *f)
{
    fprintf(f, "KV policies: --kv NAME[:key=value,...]\n"
               "The budget, per layer and KV head, is one of:\n"
               "  budget=F    a fraction of the prompt, written with a decimal point (0 < F <= 1, "
               "e.g. 0.25 or 1.0)\n"
               "  budget=P%%   the same as a percentage (0 < P <= 100, e.g. 25%%)\n"
               "              round(F x prompt) slots, half up; raised (with a notice) to the "
               "fewest the policy accepts\n"
               "  slots=N     exactly N slots (a whole number >= 1)\n"
               "budget=N without a point is refused as ambiguous. Evicting policies also take "
               "shift=on|off\n(position shifting: keep generating past the context). Each key "
               "at most once.\n\n");
    for (int i = 0; i < N_POLICIES; i++) {
        const kvs_policy_type *t = registry[i];
        fprintf(f, "%-10s %s\n           (%s)\n", t->name, t->summary, kind_name(t->kind));
        if (kvs_policy_kind_has_budget(t->kind))
            fprintf(f, "           budget      required: budget=F, budget=P%% or slots=N\n");
        if (t->kind == KVS_KIND_EVICTING)
            fprintf(f, "           shift       default off, one of on|off: position shifting\n");
        if (t->path_param)
            fprintf(f, "           %-11s default none, a file path: %s\n", t->path_param,
                    t->path_help);
        for (int j = 0; j < t->n_params; j++) {
            const char *const *words = param_words(t, t->params[j].name);
            char list[128], def[32], lo[32], hi[32];
            if (words) {
                join_words(words, list, sizeof list);
                fprintf(f, "           %-11s default %s, one of %s: %s\n", t->params[j].name,
                        words[(int)t->params[j].def], list, t->params[j].help);
            } else {
                format_exact(def, sizeof def, t->params[j].def);
                fprintf(f, "           %-11s default %s, range [%s, %s]: %s\n",
                        t->params[j].name, def, kvs_format_number(lo, sizeof lo, t->params[j].min),
                        kvs_format_number(hi, sizeof hi, t->params[j].max), t->params[j].help);
            }
        }
    }
}

