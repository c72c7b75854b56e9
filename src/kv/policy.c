/* Policy parameters, budgets, the group mean of attention rows and the shared keep-top
 * eviction routine: what the kv layer and every policy share. */
#include "kv/policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/debug.h"
#include "core/number.h"

int kvs_policy_param_index(const kvs_policy_type *t, const char *name)
{
    for (int i = 0; i < t->n_params; i++)
        if (!strcmp(t->params[i].name, name))
            return i;
    return -1;
}

double kvs_policy_spec_param(const kvs_policy_spec *spec, const char *name)
{
    const int i = kvs_policy_param_index(spec->type, name);
    /* A name the type does not declare is a typo in the code asking, never the user's: every
     * key the user gives was checked against the declarations when the spec was parsed. */
    KVS_ASSERT(i >= 0 && "the policy declares no parameter of this name");
    return i >= 0 ? spec->values[i] : 0.0;
}

double kvs_policy_param(const kvs_policy *p, const char *name)
{
    return kvs_policy_spec_param(&p->spec, name);
}

double kvs_policy_param_or(const kvs_policy *p, const char *name, double fallback)
{
    const int i = kvs_policy_param_index(p->spec.type, name);
    return i >= 0 ? p->spec.values[i] : fallback;
}

int kvs_policy_min_budget(const kvs_policy_spec *spec)
{
    int m = spec->type && spec->type->min_budget ? spec->type->min_budget(spec) : 1;
    return m < 1 ? 1 : m;
}

/* round(F * n), half up, at least 1 */
static int fraction_slots(const kvs_policy_spec *spec, int n_prompt)
{
    double b = floor(spec->budget * n_prompt + 0.5);
    return b < 1 ? 1 : b > INT32_MAX ? INT32_MAX : (int)b;
}

int kvs_policy_budget_slots(const kvs_policy_spec *spec, int n_prompt)
{
    if (spec->budget <= 0)
        return INT32_MAX;
    if (!spec->budget_is_fraction)
        return (int)spec->budget;
    int b = fraction_slots(spec, n_prompt), min = kvs_policy_min_budget(spec);
    return b < min ? min : b;
}

int kvs_policy_budget_notice(const kvs_policy_spec *spec, int n_prompt, char *buf, size_t size)
{
    if (spec->budget <= 0 || !spec->budget_is_fraction)
        return 0;
    int b = fraction_slots(spec, n_prompt), min = kvs_policy_min_budget(spec);
    if (b >= min)
        return 0;
    char f[32];
    snprintf(buf, size, "--kv %s: a budget of %s of the %d-token prompt is %d slot%s, below the "
             "%d %s needs (its protected tokens plus one); using %d slots",
             spec->user[0] ? spec->user : spec->text,
             kvs_format_number(f, sizeof f, spec->budget), n_prompt, b, b == 1 ? "" : "s", min,
             spec->type->name, min);
    return 1;
}

void kvs_group_mean_add(float *dst, const float *rows, size_t stride, int group, int n)
{
    const float inv = 1.0f / (float)group;
    for (int g = 0; g < group; g++) {
        const float *r = rows + (size_t)g * stride;
        for (int j = 0; j < n; j++)
            dst[j] += r[j] * inv;
    }
}

kvs_status kvs_policy_add_group_mean(const kvs_policy *p, int layer, const kvs_chunk *c,
                                     float *score, int stride, kvs_error *err)
{
    const int group = p->n_heads / p->n_kv_heads;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        if (n > stride) /* slots from before this prompt: not a state these policies support */
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: %d slots for a prompt of %d tokens",
                            p->spec.user, n, stride);
        kvs_group_mean_add(score + (size_t)h * stride,
                           c->colsum + (size_t)h * group * c->colsum_stride,
                           (size_t)c->colsum_stride, group, n);
    }
    return KVS_OK;
}

typedef struct ranked {
    float score;
    int32_t pos;
    int slot;
} ranked;

static int by_score_keep_older(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int by_score_keep_newer(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->pos < y->pos) - (x->pos > y->pos);
}

static int by_position(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static int by_slot(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

kvs_status kvs_evict_keep_top(kvs_store *s, int layer, int head, const float *score, int budget,
                              int sinks, int recent, kvs_tie tie, kvs_error *err)
{
    const int n = kvs_store_count(s, layer, head);
    if (n <= budget)
        return KVS_OK;
    if (sinks > budget)
        sinks = budget;
    if (recent > budget - sinks)
        recent = budget - sinks;
    /* Without memory to rank the slots nothing is evicted and the caller fails: keeping some
     * other set (the newest, say) would be a different policy, silently. */
    int *keep = malloc(sizeof(int) * (size_t)budget);
    ranked *r = malloc(sizeof(ranked) * (size_t)n);
    if (!keep || !r) {
        free(keep);
        free(r);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory ranking %d slots of layer %d, KV "
                        "head %d", n, layer, head);
    }
    /* In position order (a head out of order is sorted here, not in the store), sinks are a
     * prefix and the recent window a suffix; the rest is ranked by score. */
    const int32_t *pos = kvs_store_pos(s, layer, head);
    for (int i = 0; i < n; i++)
        r[i] = (ranked){score[i], pos[i], i};
    if (!kvs_store_ordered(s, layer, head))
        qsort(r, (size_t)n, sizeof *r, by_position);
    int k = 0;
    for (int i = 0; i < sinks; i++)
        keep[k++] = r[i].slot;
    for (int i = n - recent; i < n; i++)
        keep[k++] = r[i].slot;
    ranked *mid = r + sinks;
    const int n_mid = n - recent - sinks;
    qsort(mid, (size_t)n_mid, sizeof *mid,
          tie == KVS_TIE_KEEP_OLDER ? by_score_keep_older : by_score_keep_newer);
    for (int i = 0; i < budget - sinks - recent; i++)
        keep[k++] = mid[i].slot;
    qsort(keep, (size_t)k, sizeof *keep, by_slot);
    kvs_store_keep(s, layer, head, keep, k);
    free(keep);
    free(r);
    KVS_ASSERT(kvs_store_count(s, layer, head) == budget);
    return KVS_OK;
}
