/* The scorer adapter (scorer.h): the hooks of every policy that only scores slots. */
#include "policies/scorer.h"

#include <math.h>
#include <stdlib.h>

#include "policies/policies.h"

/* Per layer: n_kv_heads x n_prompt observed attention sums, from the layer's first observed
 * row to its prefill end. Only scorers with a window have state. */
typedef struct scorer_state {
    float **obs;
    int n_layers;
} scorer_state;

/* The type is the scorer's first member (scorer.h). */
static const kvs_scorer *scorer_of(const kvs_policy *p)
{
    return (const kvs_scorer *)(const void *)p->type;
}

kvs_status kvs_scorer_start(kvs_policy *p, kvs_error *err)
{
    const kvs_scorer *sc = scorer_of(p);
    kvs_status st = kvs_policy_check_context(p, err);
    if (st == KVS_OK && sc->check)
        st = sc->check(p, err);
    if (st != KVS_OK || !sc->window)
        return st;
    scorer_state *s = calloc(1, sizeof *s);
    if (!s || !(s->obs = calloc((size_t)p->n_layers, sizeof *s->obs))) {
        free(s);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    s->n_layers = p->n_layers;
    p->state = s;
    return KVS_OK;
}

void kvs_scorer_stop(kvs_policy *p)
{
    scorer_state *s = p->state;
    if (!s)
        return;
    for (int l = 0; l < s->n_layers; l++)
        free(s->obs[l]);
    free(s->obs);
    free(s);
    p->state = NULL;
}

size_t kvs_scorer_state_bytes(const kvs_policy *p)
{
    const scorer_state *s = p->state;
    size_t b = 0;
    for (int l = 0; s && l < s->n_layers; l++)
        if (s->obs[l])
            b += sizeof(float) * (size_t)p->n_kv_heads * p->n_prompt;
    return b;
}

int kvs_scorer_wants_row(const kvs_policy *p, int layer, int32_t pos)
{
    (void)layer;
    const kvs_scorer *sc = scorer_of(p);
    return sc->window && pos >= p->n_prompt - sc->window(p);
}

kvs_status kvs_scorer_prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c,
                                    kvs_error *err)
{
    scorer_state *s = p->state;
    if (!s || !c->colsum)
        return KVS_OK;
    const int n_prompt = p->n_prompt;
    if (!s->obs[layer] &&
        !(s->obs[layer] = calloc((size_t)p->n_kv_heads * n_prompt, sizeof(float))))
        return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for window scores",
                        p->spec.user);
    return kvs_policy_add_group_mean(p, layer, c, s->obs[layer], n_prompt, err);
}

kvs_status kvs_scorer_prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    const kvs_scorer *sc = scorer_of(p);
    scorer_state *s = p->state;
    int sinks = 0, recent = 0, n_max = 0;
    if (sc->protect)
        sc->protect(p, &sinks, &recent);
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(p->store, layer, h);
        n_max = n > n_max ? n : n_max;
    }
    kvs_status st = KVS_OK;
    if (n_max > p->budget) {
        /* scores, the key row, and zeros for a window that saw no row */
        const size_t n = (size_t)n_max;
        float *buf = calloc(2 * n + (size_t)p->head_dim, sizeof(float));
        if (!buf)
            st = kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for %d scores",
                          p->spec.user, n_max);
        for (int h = 0; h < p->n_kv_heads && st == KVS_OK; h++) {
            kvs_score_ctx c = {p, layer, h, kvs_store_count(p->store, layer, h), NULL,
                               buf + 2 * n};
            if (c.n <= p->budget)
                continue;
            if (s)
                c.obs = s->obs[layer] ? s->obs[layer] + (size_t)h * p->n_prompt : buf + n;
            if ((st = sc->score(&c, buf, err)) == KVS_OK)
                st = kvs_evict_keep_top(p->store, layer, h, buf, p->budget, sinks, recent,
                                        sc->tie, err);
        }
        free(buf);
    }
    if (s) {
        free(s->obs[layer]);
        s->obs[layer] = NULL;
    }
    return st;
}

const float *kvs_score_key(const kvs_score_ctx *c, int j)
{
    kvs_store_key_f32(c->p->store, c->layer, c->head, j, c->key);
    return c->key;
}

double kvs_score_key_norm(const kvs_score_ctx *c, int j)
{
    const float *k = kvs_score_key(c, j);
    double ss = 0;
    for (int i = 0; i < c->p->head_dim; i++)
        ss += (double)k[i] * k[i];
    return sqrt(ss);
}
