/* The emulator's weights and forward pass (fx_llama.h): forward.c's steps on clear values. */
#include "mpc/fx_llama_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpc/fxp.h"
#include "mpc/fxp_nl.h"

/* ---- weights, encoded as forward.c's put_rows and embedding encode party 1's ---- */

/* A k x n matrix from up to three stored ones side by side, input i scaled by norm[i]. */
static uint64_t *weight(size_t k, size_t n, const kvs_weight *a, const kvs_weight *b,
                        const kvs_weight *c, const float *norm, int frac)
{
    uint64_t *W = malloc(sizeof *W * (k * n + 1));
    float *row = malloc(sizeof *row * (k + 1));
    const kvs_weight *parts[3] = {a, b, c};
    for (size_t col = 0, i = 0; W && row && i < 3 && parts[i]; col += (size_t)parts[i++]->rows)
        for (int j = 0; j < parts[i]->rows; j++) {
            kvs_weight_row(parts[i], j, row);
            for (size_t x = 0; x < k; x++)
                W[x * n + col + (size_t)j] =
                    kvs_fx_encode((double)row[x] * (norm ? (double)norm[x] : 1.0), frac);
        }
    free(row);
    if (!row) {
        free(W);
        return NULL;
    }
    return W;
}

static uint64_t *embedding(const struct kvs_model *model, int frac)
{
    const size_t V = (size_t)model->hp.vocab, dim = (size_t)model->hp.dim;
    uint64_t *W = malloc(sizeof *W * V * dim);
    float *row = malloc(sizeof *row * dim);
    for (size_t t = 0; W && row && t < V; t++) {
        kvs_weight_row(&model->tok_embd, (int)t, row);
        for (size_t i = 0; i < dim; i++)
            W[t * dim + i] = kvs_fx_encode(row[i], frac);
    }
    free(row);
    if (!row) {
        free(W);
        return NULL;
    }
    return W;
}

kvs_status kvs_fx_llama_new(const struct kvs_model *model, int frac, const kvs_mpc_kv_cfg *cfg,
                            int P, kvs_fx_llama **out, kvs_error *err)
{
    *out = NULL;
    if (frac < 6 || frac > 18)
        return kvs_fail(err, KVS_ERR_ARG, "frac=%d: the gates take 6 to 18 fraction bits", frac);
    kvs_status plain = kvs_llama_check_plain(model, "the fixed-point emulator", err);
    if (plain != KVS_OK)
        return plain;
    if (cfg && cfg->mode == KVS_MPC_KV_CLUSTER && cfg->mp.sim != KVS_MP_SIM_LINEAR)
        return kvs_fail(err, KVS_ERR_ARG, "the emulator scores clusters by the linear bound "
                        "only (sim=linear)");
    kvs_fx_llama *E = calloc(1, sizeof *E);
    if (!E)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the emulator");
    kvs_mpc_shape_of(model, &E->plan.s);
    E->frac = frac;
    const kvs_mpc_shape *s = &E->plan.s;
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden;
    kvs_status st = KVS_OK;
    if (cfg && (st = kvs_mpc_sel_attach(&E->plan, cfg, P, err)) != KVS_OK) {
        free(E);
        return st;
    }
    E->emb = embedding(model, frac);
    E->out = weight(dim, (size_t)s->vocab, &model->output, NULL, NULL, model->output_norm, frac);
    E->layers = calloc((size_t)s->n_layers, sizeof *E->layers);
    int ok = E->emb && E->out && E->layers;
    for (int l = 0; ok && l < s->n_layers; l++) {
        const kvs_layer *L = &model->layers[l];
        kvs_fx_layer *y = &E->layers[l];
        y->qkv = weight(dim, dim + 2 * kvd, &L->wq, &L->wk, &L->wv, L->attn_norm, frac);
        y->wo = weight(dim, dim, &L->wo, NULL, NULL, NULL, frac);
        y->w13 = weight(dim, 2 * hid, &L->w_gate, &L->w_up, NULL, L->ffn_norm, frac);
        y->w2 = weight(hid, dim, &L->w_down, NULL, NULL, NULL, frac);
        ok = y->qkv && y->wo && y->w13 && y->w2;
    }
    if (ok)
        st = kvs_fx_reserve(E, 64, err);
    else
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the emulator's weights");
    if (st != KVS_OK) {
        kvs_fx_llama_free(E);
        return st;
    }
    *out = E;
    return KVS_OK;
}

void kvs_fx_llama_free(kvs_fx_llama *E)
{
    if (!E)
        return;
    for (int l = 0; E->layers && l < E->plan.s.n_layers; l++) {
        kvs_fx_layer *y = &E->layers[l];
        free(y->qkv);
        free(y->wo);
        free(y->w13);
        free(y->w2);
        free(y->K);
        free(y->V);
        free(y->rep1);
        free(y->rep2);
        free(y->keep);
        free(y->F);
    }
    kvs_mpc_sel_free(&E->plan);
    free(E->layers);
    free(E->emb);
    free(E->out);
    free(E->work);
    free(E);
}

void kvs_fx_llama_report(kvs_fx_llama *E, kvs_mpc_choice_fn on_keep, kvs_mpc_choice_fn on_choice,
                         void *ctx)
{
    E->on_keep = on_keep;
    E->on_choice = on_choice;
    E->ctx = ctx;
}

kvs_status kvs_fx_reserve(kvs_fx_llama *E, size_t need, kvs_error *err)
{
    if (need <= E->cap)
        return KVS_OK;
    const kvs_mpc_shape *s = &E->plan.s;
    const size_t cap = need > 2 * E->cap ? need : 2 * E->cap;
    const size_t w = (size_t)s->n_kv_heads * s->head_dim;
    for (int l = 0; l < s->n_layers; l++) {
        kvs_fx_layer *y = &E->layers[l];
        uint64_t *k = realloc(y->K, sizeof *k * cap * w);
        if (k)
            y->K = k;
        uint64_t *v = realloc(y->V, sizeof *v * cap * w);
        if (v)
            y->V = v;
        if (!k || !v)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu cache slots", cap);
    }
    uint64_t *work = realloc(E->work, sizeof *work * 4 * (size_t)s->n_heads * (cap + 1));
    if (!work)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %zu cache slots", cap);
    E->work = work;
    E->cap = cap;
    return KVS_OK;
}

/* ---- the gates' compositions ---- */

uint64_t kvs_fx_dot(const uint64_t *x, const uint64_t *y, size_t n)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc += x[i] * y[i];
    return acc;
}

void kvs_fx_softmax(uint64_t *sc, size_t w, const uint64_t *mask, int frac)
{
    uint64_t mx = sc[0], sum = 0;
    for (size_t t = 1; t < w; t++)
        if ((int64_t)sc[t] > (int64_t)mx)
            mx = sc[t];
    for (size_t t = 0; t < w; t++) {
        sc[t] = kvs_fxnl_exp_neg(sc[t] - mx, frac);
        if (mask)
            sc[t] *= mask[t];
        sum += sc[t];
    }
    const uint64_t rc = kvs_fxnl_recip(sum, frac);
    for (size_t t = 0; t < w; t++)
        sc[t] = kvs_fx_mul(sc[t], rc, frac);
}

/* y = x W truncated (W: k x n). */
static void linear(const uint64_t *W, const uint64_t *x, size_t k, size_t n, int frac,
                   uint64_t *y)
{
    memset(y, 0, sizeof *y * n);
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < n; j++)
            y[j] += x[i] * W[i * n + j];
    for (size_t j = 0; j < n; j++)
        y[j] = kvs_fx_ars(y[j], frac);
}

/* xn = x / rms(x) (forward.c's rmsnorm: the mean square truncated, times a public 1/dim, plus
 * eps or one unit, its reciprocal square root, a product). */
static void rmsnorm(const kvs_mpc_shape *s, const uint64_t *x, int frac, uint64_t *xn)
{
    const size_t dim = (size_t)s->dim;
    uint64_t ms = kvs_fx_ars(kvs_fx_dot(x, x, dim), frac);
    ms = kvs_fx_mul(ms, kvs_fx_encode(1.0 / (double)dim, frac), frac);
    const uint64_t eps = kvs_fx_encode(s->eps, frac);
    ms += eps ? eps : 1;
    const uint64_t r = kvs_fxnl_rsqrt(ms, frac);
    for (size_t i = 0; i < dim; i++)
        xn[i] = kvs_fx_mul(x[i], r, frac);
}

/* RoPE of heads at position pos with a public extra scale (forward.c's), then the truncation. */
static void rope(const kvs_mpc_shape *s, uint64_t *v, int heads, int pos, double scale, int frac,
                 double *rot)
{
    kvs_mpc_rope_angles(s, pos, 1, rot);
    kvs_mpc_rope_row(s, frac, v, heads, rot, scale);
    for (size_t i = 0; i < (size_t)heads * s->head_dim; i++)
        v[i] = kvs_fx_ars(v[i], frac);
}

/* The dense attention of the token in slot E->len over slots [0, E->len]: out at 2 frac. */
static void dense(kvs_fx_llama *E, int l, const uint64_t *q, uint64_t *out)
{
    const kvs_mpc_shape *s = &E->plan.s;
    const kvs_fx_layer *y = &E->layers[l];
    const size_t T = E->len + 1, d = (size_t)s->head_dim, heads = (size_t)s->n_kv_heads;
    const size_t G = (size_t)s->n_heads / heads, w = heads * d;
    for (size_t hq = 0; hq < (size_t)s->n_heads; hq++) {
        uint64_t *p = E->work + hq * T;
        const size_t h = hq / G;
        for (size_t t = 0; t < T; t++)
            p[t] = kvs_fx_ars(kvs_fx_dot(q + hq * d, y->K + t * w + h * d, d), E->frac);
        kvs_fx_softmax(p, T, NULL, E->frac);
        for (size_t i = 0; i < d; i++) {
            uint64_t acc = 0;
            for (size_t t = 0; t < T; t++)
                acc += p[t] * y->V[t * w + h * d + i];
            out[hq * d + i] = acc;
        }
    }
    kvs_mpc_sel *sel = E->plan.sel;
    if (sel && !sel->compressed)
        kvs_fx_sel_observe(E, l, E->work, (int)E->len, T);
}

kvs_status kvs_fx_llama_step(kvs_fx_llama *E, int32_t token, uint64_t *logits, kvs_error *err)
{
    const kvs_mpc_shape *s = &E->plan.s;
    const int f = E->frac, pos = E->plan.pos;
    kvs_mpc_sel *sel = E->plan.sel;
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden, W = dim + 2 * kvd;
    if (token < 0 || token >= s->vocab)
        return kvs_fail(err, KVS_ERR_ARG, "token id %d is outside the vocabulary [0, %d)", token,
                        s->vocab);
    kvs_status st = kvs_fx_reserve(E, E->len + 1, err);
    const size_t words = 3 * dim + W + 3 * hid + (size_t)s->rot_dim + 1;
    uint64_t *x = st == KVS_OK ? malloc(sizeof *x * words) : NULL;
    if (st == KVS_OK && !x)
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a token");
    if (st != KVS_OK)
        return st;
    uint64_t *xn = x + dim, *att = xn + dim, *qkv = att + dim, *h = qkv + W, *a = h + 2 * hid;
    double *rot = (double *)(a + hid); /* rot_dim / 2 x (cos, sin) */
    memcpy(x, E->emb + (size_t)token * dim, sizeof *x * dim);
    const double qscale = 1.0 / sqrt((double)s->head_dim);
    const int sparse = kvs_mpc_sel_active(&E->plan);
    for (int l = 0; l < s->n_layers && st == KVS_OK; l++) {
        kvs_fx_layer *y = &E->layers[l];
        rmsnorm(s, x, f, xn);
        linear(y->qkv, xn, dim, W, f, qkv);
        rope(s, qkv, s->n_heads, pos, qscale, f, rot);
        rope(s, qkv + dim, s->n_kv_heads, pos, 1.0, f, rot);
        if (sparse)
            st = kvs_fx_sel_seal(E, l, err);
        memcpy(y->K + E->len * kvd, qkv + dim, sizeof *x * kvd);
        memcpy(y->V + E->len * kvd, qkv + dim + kvd, sizeof *x * kvd);
        if (st == KVS_OK && sparse)
            st = kvs_fx_sel_attend(E, l, qkv, att, err);
        else
            dense(E, l, qkv, att);
        for (size_t i = 0; i < dim; i++)
            att[i] = kvs_fx_ars(att[i], f);
        linear(y->wo, att, dim, dim, f, xn);
        for (size_t i = 0; i < dim; i++)
            x[i] += xn[i];
        rmsnorm(s, x, f, xn);
        linear(y->w13, xn, dim, 2 * hid, f, h);
        for (size_t i = 0; i < hid; i++)
            a[i] = kvs_fx_mul(kvs_fxnl_silu(h[i], f), h[hid + i], f);
        linear(y->w2, a, hid, dim, f, xn);
        for (size_t i = 0; i < dim; i++)
            x[i] += xn[i];
    }
    if (st == KVS_OK) {
        rmsnorm(s, x, f, xn);
        linear(E->out, xn, dim, (size_t)s->vocab, f, logits);
        E->len++;
        E->plan.pos++;
    }
    free(x);
    if (st == KVS_OK && sel && !sel->compressed && E->plan.pos == sel->prompt_len)
        st = kvs_fx_sel_compress(E, err);
    return st;
}
