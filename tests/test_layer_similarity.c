/* Adjacent-layer similarity (eval/layer_similarity.h) and depth up-scaling
 * (kvs_llama_duplicate_layers): the cosine helper's end points, percentiles, and a model whose
 * two layers are the same layer duplicated with zero output projections, so both layers see the
 * same input at the same positions and store the same keys and values: similarity exactly 1. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/session_internal.h"
#include "eval/layer_similarity.h"
#include "gguf/gguf.h"
#include "model/llama_write.h"

enum { DIM = 16, HIDDEN = 32, HEADS = 2, KVH = 2, VOCAB = 320, CTX = 64, NTOK = 20 };

static float rnd(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / (float)(1u << 24) - 0.5f) * 0.2f;
}

static void fill(float *x, size_t n, uint32_t *s)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rnd(s);
}

static void test_helpers(void)
{
    float a[5] = {1, -2, 3, 0.5f, 4}, neg[5], z[5] = {0};
    for (int i = 0; i < 5; i++)
        neg[i] = -a[i];
    CHECK(fabs(kvs_cosine(a, a, 5) - 1) < 1e-12);
    CHECK(fabs(kvs_cosine(a, neg, 5) + 1) < 1e-12);
    CHECK(kvs_cosine(a, z, 5) == 0);
    float e0[2] = {1, 0}, e1[2] = {0, 3};
    CHECK(fabs(kvs_cosine(e0, e1, 2)) < 1e-12);
    double s[5] = {0, 1, 2, 3, 4};
    CHECK(fabs(kvs_percentile_sorted(s, 5, 50) - 2) < 1e-12);
    CHECK(fabs(kvs_percentile_sorted(s, 5, 10) - 0.4) < 1e-12);
    CHECK(fabs(kvs_percentile_sorted(s, 5, 90) - 3.6) < 1e-12);
    CHECK(kvs_percentile_sorted(s, 1, 90) == 0);
}

static void test_duplicate_list(const kvs_llama_src *src)
{
    kvs_llama_src out;
    kvs_llama_src_layer *L = NULL;
    kvs_error err = {0};
    int bad_range[1] = {1}, twice[2] = {0, 0};
    CHECK(kvs_llama_duplicate_layers(src, bad_range, 1, &out, &L, &err) == KVS_ERR_ARG);
    CHECKF(strstr(err.msg, "outside the model's layers 0..0") != NULL, "%s", err.msg);
    CHECK(kvs_llama_duplicate_layers(src, twice, 2, &out, &L, &err) == KVS_ERR_ARG);
    CHECKF(strstr(err.msg, "listed twice") != NULL, "%s", err.msg);
    CHECK(L == NULL);
}

int main(void)
{
    test_helpers();

    uint32_t seed = 7;
    size_t hd = DIM / HEADS;
    float *embd = malloc(sizeof(float) * VOCAB * DIM), *norm = malloc(sizeof(float) * DIM),
          *wq = malloc(sizeof(float) * DIM * DIM), *wk = malloc(sizeof(float) * KVH * hd * DIM),
          *wv = malloc(sizeof(float) * KVH * hd * DIM), *wo = calloc(DIM * DIM, sizeof(float)),
          *wg = malloc(sizeof(float) * HIDDEN * DIM), *wu = malloc(sizeof(float) * HIDDEN * DIM),
          *wd = calloc(DIM * HIDDEN, sizeof(float));
    fill(embd, (size_t)VOCAB * DIM, &seed);
    fill(wq, (size_t)DIM * DIM, &seed);
    fill(wk, KVH * hd * DIM, &seed);
    fill(wv, KVH * hd * DIM, &seed);
    fill(wg, (size_t)HIDDEN * DIM, &seed);
    fill(wu, (size_t)HIDDEN * DIM, &seed);
    for (int i = 0; i < DIM; i++)
        norm[i] = 1;
    /* wo and w_down stay zero: the layer adds nothing to the residual stream. */
    kvs_llama_src_layer layer = {norm, wq, wk, wv, wo, norm, wg, wu, wd};
    kvs_llama_src src = {.hp = {.dim = DIM, .hidden = HIDDEN, .n_layers = 1, .n_heads = HEADS,
                                .n_kv_heads = KVH, .head_dim = (int)hd, .rot_dim = (int)hd,
                                .vocab = VOCAB, .ctx = CTX, .eps = 1e-5f, .rope_base = 10000},
                         .name = "dup-test", .tok_embd = embd, .output_norm = norm,
                         .layers = &layer};
    test_duplicate_list(&src);

    kvs_llama_src up;
    kvs_llama_src_layer *layers = NULL;
    kvs_error err = {0};
    int dup[1] = {0};
    CHECKF(kvs_llama_duplicate_layers(&src, dup, 1, &up, &layers, &err) == KVS_OK, "%s", err.msg);
    CHECK(up.hp.n_layers == 2 && src.hp.n_layers == 1);
    char path[512];
    check_tmp_path(path, sizeof path, "test_layer_similarity.gguf");
    kvs_outfile_spec out = {.path = path};
    CHECKF(kvs_llama_write_gguf(&up, NULL, KVS_WTYPE(KVS_F32), &out, NULL, &err) == KVS_OK, "%s", err.msg);
    free(layers);

    /* The duplicated layer's tensors are byte-identical. */
    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g) {
        const char *names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_up"};
        for (int i = 0; i < 5; i++) {
            char n0[64], n1[64];
            snprintf(n0, sizeof n0, "blk.0.%s.weight", names[i]);
            snprintf(n1, sizeof n1, "blk.1.%s.weight", names[i]);
            const kvs_gguf_tensor *t0 = kvs_gguf_find_tensor(g, n0), *t1 = kvs_gguf_find_tensor(g, n1);
            CHECKF(t0 && t1 && t0->n_bytes == t1->n_bytes &&
                       !memcmp(t0->data, t1->data, t0->n_bytes), "%s", names[i]);
        }
        kvs_gguf_close(g);
    }

    kvs_model *m = NULL;
    CHECKF(kvs_model_load(path, &m, &err) == KVS_OK, "%s", err.msg);
    if (m) {
        kvs_model_info info;
        kvs_model_get_info(m, &info);
        CHECK(info.n_layers == 2);
        kvs_session_params p = kvs_session_default_params();
        p.kv_type = "f32";
        p.n_threads = 1;
        kvs_session *s = NULL;
        CHECKF(kvs_session_new(m, &p, &s, &err) == KVS_OK, "%s", err.msg);
        int32_t toks[NTOK];
        for (int i = 0; i < NTOK; i++)
            toks[i] = (i * 37 + 5) % VOCAB;
        if (s) {
            CHECKF(kvs_session_eval(s, toks, NTOK, NULL, 0, &err) == KVS_OK, "%s", err.msg);
            kvs_layer_sim r = {0};
            CHECKF(kvs_layer_similarity(kvs_session_kv(s), &r, &err) == KVS_OK, "%s", err.msg);
            CHECK(r.layer == 0 && r.k.n == NTOK && r.v.n == NTOK);
            CHECKF(fabs(r.k.mean - 1) < 1e-6 && fabs(r.k.p10 - 1) < 1e-6, "K %f %f", r.k.mean,
                   r.k.p10);
            CHECKF(fabs(r.v.mean - 1) < 1e-6 && fabs(r.v.p10 - 1) < 1e-6, "V %f %f", r.v.mean,
                   r.v.p10);
            /* identical layers: every norm ratio is 1 */
            CHECKF(r.k_ratio.n == NTOK && fabs(r.k_ratio.p10 - 1) < 1e-6 &&
                       fabs(r.k_ratio.p90 - 1) < 1e-6 && fabs(r.v_ratio.p50 - 1) < 1e-6,
                   "norm ratios K %f..%f V %f", r.k_ratio.p10, r.k_ratio.p90, r.v_ratio.p50);
            kvs_session_free(s);
        }
        kvs_model_free(m);
    }
    remove(path);
    free(embd);
    free(norm);
    free(wq);
    free(wk);
    free(wv);
    free(wo);
    free(wg);
    free(wu);
    free(wd);
    return check_summary("layer_similarity");
}
