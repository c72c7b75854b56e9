/* Adjacent-layer cosine similarity of the stored keys and values (see layer_similarity.h). */
#include "eval/layer_similarity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_store.h"

double kvs_cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0 || bb == 0)
        return 0;
    return ab / (sqrt(aa) * sqrt(bb));
}

double kvs_percentile_sorted(const double *x, int n, double p)
{
    if (n <= 0)
        return 0;
    double r = p / 100.0 * (n - 1);
    int lo = (int)floor(r);
    if (lo >= n - 1)
        return x[n - 1];
    double f = r - lo;
    return x[lo] + f * (x[lo + 1] - x[lo]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double l2(const float *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

static void summarise(double *c, int n, kvs_sim_summary *s)
{
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += c[i];
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    s->n = n;
    s->mean = n ? sum / n : 0;
    s->p10 = kvs_percentile_sorted(c, n, 10);
    s->p50 = kvs_percentile_sorted(c, n, 50);
    s->p90 = kvs_percentile_sorted(c, n, 90);
}

/* Token t of layer l, all KV heads concatenated, keys (kind 0) or values (kind 1). */
static void token_vec(const kvs_store *st, int l, int t, int kind, float *out)
{
    const kvs_store_config *c = kvs_store_cfg(st);
    for (int h = 0; h < c->n_kv_heads; h++) {
        float *dst = out + (size_t)h * c->head_dim;
        if (kind == 0)
            kvs_store_key_f32(st, l, h, t, dst);
        else
            kvs_store_value_f32(st, l, h, t, dst);
    }
}

/* Every (layer, head) must hold the same positions as (0, 0). */
static kvs_status check_full(const kvs_store *st, int *n_out, kvs_error *err)
{
    const kvs_store_config *c = kvs_store_cfg(st);
    int n = kvs_store_count(st, 0, 0);
    const int32_t *p0 = kvs_store_pos(st, 0, 0);
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            if (kvs_store_count(st, l, h) != n ||
                (n && memcmp(kvs_store_pos(st, l, h), p0, sizeof *p0 * (size_t)n)))
                return kvs_fail(err, KVS_ERR_ARG,
                                "layer similarity needs a full cache: layer %d head %d holds "
                                "other tokens than layer 0", l, h);
        }
    *n_out = n;
    return KVS_OK;
}

kvs_status kvs_layer_similarity(const kvs_kv *kv, kvs_layer_sim *out, kvs_error *err)
{
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_store_config *c = kvs_store_cfg(st);
    int n = 0;
    kvs_status s = check_full(st, &n, err);
    if (s != KVS_OK)
        return s;
    int d = c->n_kv_heads * c->head_dim;
    float *a = malloc(sizeof(float) * (size_t)d), *b = malloc(sizeof(float) * (size_t)d);
    double *cs = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *ratio = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!a || !b || !cs || !ratio) {
        s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the layer similarity of %d tokens",
                     n);
        goto done;
    }
    for (int l = 0; l + 1 < c->n_layers; l++) {
        out[l].layer = l;
        for (int kind = 0; kind < 2; kind++) {
            int nr = 0;
            for (int t = 0; t < n; t++) {
                token_vec(st, l, t, kind, a);
                token_vec(st, l + 1, t, kind, b);
                cs[t] = kvs_cosine(a, b, d);
                const double na = l2(a, d);
                if (na > 0)
                    ratio[nr++] = l2(b, d) / na;
            }
            summarise(cs, n, kind == 0 ? &out[l].k : &out[l].v);
            summarise(ratio, nr, kind == 0 ? &out[l].k_ratio : &out[l].v_ratio);
        }
    }
done:
    free(a);
    free(b);
    free(cs);
    free(ratio);
    return s;
}
