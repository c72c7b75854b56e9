/* Security of the two-party engine, as tests (issue 12): on the secure forward pass of
 * stories260K (three roles on threads, a few tokens), what each party receives from the other
 * (1) is uniform bytes (chi-square over the 256 byte values), (2) has the same distribution for
 * two different prompts (party 1's view) and two different models (party 0's view; a two-sample
 * chi-square), (3) never contains a plaintext value: no 8-byte word of party 1's fixed-point
 * weights in party 0's view, none of party 0's embedding rows in party 1's, at any offset, and
 * (4) is a function of the seeds: the same seeds give the same bytes, another dealer seed other
 * bytes. The statistics are deterministic (fixed seeds): thresholds at p = 1e-6 of chi-square
 * with 255 degrees of freedom (~375). On the full cache (four tokens one at a time), then what
 * depends on the data, (1), (3) and the two prompts of (2), on MPCache's path (issue 13: a
 * 16-token prompt prefilled in blocks, the static step on shares, then four decode steps
 * choosing clusters, s1 8, s2 4, keep 0.5, budget 0.25). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/llama.h"
#include "mpc/forward.h"
#include "mpc/fxp.h"
#include "mpc/local.h"
#include "mpc/mpcache.h"

enum { STEPS = 4, PROMPT = 16, FRAC = 16 };
#define CHI2_255_P1E6 375.0

typedef struct sec_ctx {
    const struct kvs_model *model;
    kvs_mpc_shape shape;
    const int32_t *tokens;
    int mpcache; /* 0: STEPS tokens, full cache; 1: PROMPT tokens, then STEPS decode steps */
} sec_ctx;

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    sec_ctx *c = ctx;
    kvs_mpc_llama L;
    kvs_status st = kvs_mpc_llama_setup(m, m->role == KVS_MPC_P1 ? c->model : NULL, &c->shape,
                                        &L, err);
    uint64_t sh[512], out[512];
    const int prompt = c->mpcache ? PROMPT : 0;
    if (st == KVS_OK && c->mpcache) {
        kvs_mpc_kv_cfg k = kvs_mpc_kv_default(KVS_MPC_KV_CLUSTER);
        k.mp.s1 = 8;
        k.mp.s2 = 4;
        k.mp.keep = 0.5;
        k.budget = 0.25;
        st = kvs_mpc_sel_attach(&L, &k, PROMPT, err);
    }
    for (int t = 0; t < prompt && st == KVS_OK;) {
        const int n = kvs_mpc_llama_block(&c->shape, t, prompt - t);
        st = kvs_mpc_llama_forward(m, &L, c->tokens + t, n, kvs_mpc_is_dealer(m) ? NULL : sh,
                                   err);
        t += n;
    }
    for (int t = prompt; t < prompt + STEPS && st == KVS_OK; t++) {
        st = kvs_mpc_llama_step(m, &L, m->role == KVS_MPC_P0 ? c->tokens[t] : -1,
                                kvs_mpc_is_dealer(m) ? NULL : sh, err);
        if (st == KVS_OK) /* the logits go to party 0 only */
            st = kvs_mpc_reveal(m, KVS_OP_OPEN, 0, sh, (size_t)c->shape.vocab, out, err);
    }
    if (st == KVS_OK)
        kvs_mpc_llama_free(&L);
    return st;
}

static int run(const struct kvs_model *model, const int32_t *tokens, int mpcache,
               uint8_t dealer_seed, kvs_mpc_local_result res[3])
{
    static sec_ctx c;
    c.model = model;
    c.tokens = tokens;
    c.mpcache = mpcache;
    kvs_mpc_shape_of(model, &c.shape);
    kvs_mpc_local_cfg cfg = {.frac = FRAC, .insecure_plain = 1, .capture = 1,
                             .corr_seed = {{dealer_seed, 1}, {dealer_seed, 2}},
                             .own_seed = {{3}, {4}, {5}}, .timeout_ms = 60000};
    kvs_error err = {0};
    const kvs_status st = kvs_mpc_run_local(program, &c, &cfg, res, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    return st == KVS_OK ? 0 : -1;
}

static void histogram(const uint8_t *b, size_t n, double h[256])
{
    memset(h, 0, sizeof(double) * 256);
    for (size_t i = 0; i < n; i++)
        h[b[i]]++;
}

static double chi2_uniform(const uint8_t *b, size_t n)
{
    double h[256], s = 0, e = (double)n / 256;
    histogram(b, n, h);
    for (int i = 0; i < 256; i++)
        s += (h[i] - e) * (h[i] - e) / e;
    return s;
}

/* Two-sample chi-square of two byte streams (df 255). */
static double chi2_two(const uint8_t *a, size_t na, const uint8_t *b, size_t nb)
{
    double ha[256], hb[256], s = 0;
    histogram(a, na, ha);
    histogram(b, nb, hb);
    const double ka = sqrt((double)nb / na), kb = sqrt((double)na / nb);
    for (int i = 0; i < 256; i++)
        if (ha[i] + hb[i] > 0)
            s += (ka * ha[i] - kb * hb[i]) * (ka * ha[i] - kb * hb[i]) / (ha[i] + hb[i]);
    return s;
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* How many offsets of b hold (little-endian) one of the n sorted words. */
static size_t occurrences(const uint8_t *b, size_t len, const uint64_t *words, size_t n)
{
    size_t hits = 0;
    for (size_t i = 0; i + 8 <= len; i++) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        hits += bsearch(&w, words, n, sizeof w, cmp_u64) != NULL;
    }
    return hits;
}

/* Party 1's weights as party 1 holds them (fixed point): every weight row of the model. */
static uint64_t *weight_words(const struct kvs_model *m, size_t *n)
{
    const kvs_hparams *hp = &m->hp;
    size_t cap = (size_t)hp->vocab * hp->dim * 3 + (size_t)hp->n_layers *
                 ((size_t)hp->dim * hp->dim * 4 + (size_t)hp->dim * hp->hidden * 3);
    uint64_t *w = malloc(sizeof *w * cap);
    float *row = malloc(sizeof *row * (size_t)(hp->hidden > hp->dim ? hp->hidden : hp->dim));
    size_t k = 0;
    const kvs_weight *all[2] = {&m->tok_embd, &m->output};
    for (int a = 0; w && row && a < 2; a++)
        for (int r = 0; r < all[a]->rows; r++) {
            kvs_weight_row(all[a], r, row);
            for (int i = 0; i < all[a]->cols && k < cap; i++)
                w[k++] = kvs_fx_encode(row[i], FRAC);
        }
    for (int l = 0; w && row && l < hp->n_layers; l++) {
        const kvs_layer *L = &m->layers[l];
        const kvs_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                   &L->w_down};
        for (int a = 0; a < 7; a++)
            for (int r = 0; r < ws[a]->rows; r++) {
                kvs_weight_row(ws[a], r, row);
                for (int i = 0; i < ws[a]->cols && k < cap; i++)
                    w[k++] = kvs_fx_encode(row[i], FRAC);
            }
    }
    free(row);
    /* words that small carry no evidence of a leak: 0 and +-1..255 ulp */
    size_t j = 0;
    for (size_t i = 0; w && i < k; i++)
        if ((int64_t)w[i] > 255 || (int64_t)w[i] < -255)
            w[j++] = w[i];
    qsort(w, j, sizeof *w, cmp_u64);
    *n = j;
    return w;
}

/* The four checks on one path (mpcache: 0 the full cache, 1 MPCache's). */
static void check_path(const kvs_model *model, const kvs_model *other, const kvs_model_info *info,
                       const int32_t *tokens, int mpcache)
{
    const char *path = mpcache ? "mpcache" : "full cache";
    const int n_in = (mpcache ? PROMPT : 0) + STEPS;
    const int32_t *prompt_a = tokens, *prompt_b = tokens + 100; /* two different prompts */
    /* MPCache's path adds what depends on the data: (1), (3) and party 1's two prompts (2);
     * the two models and the seeds (4) are the engine's, checked on the full cache */
    static kvs_mpc_local_result a[3], b[3], c[3], d[3], e[3];
    if (run(model, prompt_a, mpcache, 1, a) || run(model, prompt_b, mpcache, 1, b) ||
        (!mpcache && (run(other, prompt_a, mpcache, 1, c) || run(model, prompt_a, mpcache, 1, d) ||
                      run(model, prompt_a, mpcache, 2, e))))
        return;

    /* (1) uniform bytes in both views */
    for (int p = 0; p < 2; p++) {
        const double x = chi2_uniform(a[p].payload, a[p].payload_len);
        printf("%s: party %d received %zu bytes: chi-square %.1f (255 df)\n", path, p,
               a[p].payload_len, x);
        CHECKF(a[p].payload_len > 100000 && x < CHI2_255_P1E6,
               "%s: party %d's view is not uniform: chi-square %.1f over %zu bytes", path, p, x,
               a[p].payload_len);
    }
    /* (2) party 1's view for two prompts; party 0's for two models */
    const double v1 = chi2_two(a[1].payload, a[1].payload_len, b[1].payload, b[1].payload_len);
    printf("%s: two-sample chi-square: party 1, two prompts %.1f\n", path, v1);
    CHECKF(a[1].payload_len == b[1].payload_len && v1 < CHI2_255_P1E6,
           "%s: party 1 tells two prompts apart: %.1f (%zu vs %zu bytes)", path, v1,
           a[1].payload_len, b[1].payload_len);
    if (!mpcache) {
        const double v0 =
            chi2_two(a[0].payload, a[0].payload_len, c[0].payload, c[0].payload_len);
        printf("%s: two-sample chi-square: party 0, two models %.1f\n", path, v0);
        CHECKF(a[0].payload_len == c[0].payload_len && v0 < CHI2_255_P1E6,
               "%s: party 0 tells two models apart: %.1f", path, v0);
    }
    /* (3) no plaintext: party 1's weights in party 0's view; party 0's embedding rows (its
     * secret input as the first layer sees it) in party 1's view */
    size_t nw = 0;
    uint64_t *w = weight_words(model, &nw);
    CHECK(w && nw > 10000);
    const size_t leak0 = w ? occurrences(a[0].payload, a[0].payload_len, w, nw) : 1;
    uint64_t emb[(PROMPT + STEPS) * 64];
    float row[64];
    size_t ne = 0;
    for (int t = 0; t < n_in && info->dim <= 64; t++) {
        kvs_weight_row(&model->tok_embd, prompt_a[t], row);
        for (int i = 0; i < info->dim; i++) {
            const uint64_t v = kvs_fx_encode(row[i], FRAC);
            if ((int64_t)v > 255 || (int64_t)v < -255)
                emb[ne++] = v;
        }
    }
    qsort(emb, ne, sizeof *emb, cmp_u64);
    const size_t leak1 = occurrences(a[1].payload, a[1].payload_len, emb, ne);
    printf("%s: plaintext words found: %zu of %zu weights in party 0's view, %zu of %zu input "
           "values in party 1's\n", path, leak0, nw, leak1, ne);
    CHECKF(leak0 == 0, "%s: %zu weight words appear in party 0's view", path, leak0);
    CHECKF(ne > 100 && leak1 == 0, "%s: %zu input words appear in party 1's view", path, leak1);
    free(w);
    /* (4) the seeds decide the bytes */
    kvs_mpc_local_result *all[5] = {a, b, c, d, e};
    if (mpcache) {
        for (int i = 0; i < 2; i++)
            for (int r = 0; r < 3; r++)
                kvs_mpc_local_result_free(&all[i][r]);
        return;
    }
    CHECKF(a[1].payload_len == d[1].payload_len &&
               !memcmp(a[1].payload, d[1].payload, a[1].payload_len),
           "%s: the same seeds gave party 1 different bytes", path);
    CHECKF(a[1].payload_len == e[1].payload_len &&
               memcmp(a[1].payload, e[1].payload, a[1].payload_len) != 0,
           "%s: another dealer seed gave party 1 the same bytes", path);
    for (int i = 0; i < 5; i++)
        for (int r = 0; r < 3; r++)
            kvs_mpc_local_result_free(&all[i][r]);
}

int main(void)
{
    static int32_t tokens[FX_N_TOK];
    kvs_model *model = NULL, *other = NULL;
    kvs_model_info info;
    char msg[512];
    kvs_error err = {0};
    CHECKF(fx_load(tokens, FX_N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    char path[1024];
    snprintf(path, sizeof path, "%s/models/gguf/stories260K-q8_0.gguf",
             getenv("KVS_SHARED_DIR") ? getenv("KVS_SHARED_DIR") : "../shared");
    CHECKF(kvs_model_load(path, &other, &err) == KVS_OK, "%s", err.msg);
    if (!model || !other)
        return check_summary("mpc_security");
    check_path(model, other, &info, tokens, 0);
    check_path(model, other, &info, tokens, 1);
    kvs_model_free(model);
    kvs_model_free(other);
    return check_summary("mpc_security");
}
