/* Random-weight llama models of any shape, for timing at realistic sizes without a download. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/random.h"
#include "model/llama_write.h"

/* Uniform in (0, 1]: the sequential SplitMix64 generator from the seed (core/random.h). */
static double uniform(uint64_t *s) { return kvs_random_unit_nonzero(kvs_splitmix64_next(s)); }

static void fill_normal(float *x, size_t n, float sd, uint64_t *s)
{
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(uniform(s))), a = 2.0 * M_PI * uniform(s);
        x[i] = (float)(sd * r * cos(a));
        if (i + 1 < n)
            x[i + 1] = (float)(sd * r * sin(a));
    }
}

kvs_status kvs_synthetic_write_to(const kvs_hparams *hp_in, kvs_wtype wt, uint64_t seed,
                                  const kvs_outfile_spec *out, FILE *log, kvs_error *err)
{
    kvs_hparams hp = *hp_in;
    if (hp.dim <= 0 || hp.hidden <= 0 || hp.n_layers <= 0 || hp.n_heads <= 0 ||
        hp.n_kv_heads <= 0 || hp.vocab <= 0 || hp.ctx <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "synthetic shape: every size must be positive");
    if (hp.dim % hp.n_heads != 0 || hp.n_heads % hp.n_kv_heads != 0 ||
        (hp.dim / hp.n_heads) % 2 != 0)
        return kvs_fail(err, KVS_ERR_ARG,
                        "synthetic shape: heads=%d must divide dim=%d into an even head size and "
                        "kv_heads=%d must divide heads", hp.n_heads, hp.dim, hp.n_kv_heads);
    /* Generating the weights takes long for a large shape: find out first whether the result
     * can be written at all. */
    kvs_status st = kvs_outfile_check(out, NULL, err);
    if (st != KVS_OK)
        return st;
    hp.head_dim = hp.dim / hp.n_heads;
    hp.rot_dim = hp.head_dim;
    hp.eps = 1e-5f;
    hp.rope_base = 10000.0f;

    /* The sizes come from the caller: make sure the weight count below cannot overflow. */
    const double d = hp.dim, kvd = (double)hp.n_kv_heads * hp.head_dim;
    const double want = 2.0 * hp.vocab * d + d +
                        (2 * d + 2 * d * d + 2 * d * kvd + 3 * d * hp.hidden) * hp.n_layers;
    if (want > (double)(SIZE_MAX / sizeof(float) / 2))
        return kvs_fail(err, KVS_ERR_ARG, "synthetic shape: %.3g weights are more than this "
                        "machine can address", want);
    const size_t dim = (size_t)hp.dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim,
                 hidden = (size_t)hp.hidden;
    const size_t per_layer = 2 * dim + 2 * dim * dim + 2 * dim * kv_dim + 3 * dim * hidden;
    /* Untied embedding and classifier, as most llama models have. */
    const size_t total = 2 * (size_t)hp.vocab * dim + dim + per_layer * (size_t)hp.n_layers;
    float *w = malloc(total * sizeof(float));
    kvs_llama_src_layer *layers = calloc((size_t)hp.n_layers, sizeof *layers);
    if (!w || !layers) {
        free(w);
        free(layers);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu synthetic weights", total);
    }
    uint64_t s = seed;
    float *p = w;
    kvs_llama_src src = {.hp = hp, .name = "synthetic", .layers = layers};
#define TAKE(n) (p += (n), p - (n))
    float *emb = TAKE(2 * (size_t)hp.vocab * dim);
    fill_normal(emb, 2 * (size_t)hp.vocab * dim, 0.02f, &s);
    src.tok_embd = emb;
    src.output = emb + (size_t)hp.vocab * dim;
    float *norm = TAKE(dim);
    for (size_t i = 0; i < dim; i++)
        norm[i] = 1.0f;
    src.output_norm = norm;
    for (int l = 0; l < hp.n_layers; l++) {
        kvs_llama_src_layer *L = &layers[l];
        float *an = TAKE(dim), *fn = TAKE(dim);
        for (size_t i = 0; i < dim; i++)
            an[i] = fn[i] = 1.0f;
        L->attn_norm = an;
        L->ffn_norm = fn;
        float *m = TAKE(per_layer - 2 * dim);
        fill_normal(m, per_layer - 2 * dim, 0.02f, &s);
        L->wq = m, m += dim * dim;
        L->wk = m, m += kv_dim * dim;
        L->wv = m, m += kv_dim * dim;
        L->wo = m, m += dim * dim;
        L->w_gate = m, m += hidden * dim;
        L->w_up = m, m += hidden * dim;
        L->w_down = m;
    }
#undef TAKE
    st = kvs_llama_write_gguf(&src, NULL, wt, out, log, err);
    free(w);
    free(layers);
    return st;
}

kvs_status kvs_synthetic_write(const kvs_hparams *hp, kvs_wtype wt, uint64_t seed,
                               const char *path, FILE *log, kvs_error *err)
{
    if (!path)
        return kvs_fail(err, KVS_ERR_ARG, "synthetic model: NULL path");
    kvs_outfile_spec out = {.path = path};
    return kvs_synthetic_write_to(hp, wt, seed, &out, log, err);
}
