/* The Llama forward pass on secret shares, one token per step (forward.h). */
#include "mpc/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpc/fxp.h"
#include "mpc/gates_nl.h"

void kvs_mpc_shape_of(const struct kvs_model *model, kvs_mpc_shape *s)
{
    const kvs_hparams *hp = &model->hp;
    *s = (kvs_mpc_shape){hp->dim, hp->hidden, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                         hp->head_dim, hp->rot_dim, hp->vocab, hp->rope_neox, hp->eps,
                         hp->rope_base};
}

/* ---- party 1's weights in fixed point ---- */

/* Column block of a k x n matrix: n_out columns from rows of w (w->rows outputs of k inputs),
 * each input i scaled by norm[i] (or 1), at column offset col0. */
static void put_rows(uint64_t *W, size_t n, size_t col0, const kvs_weight *w, const float *norm,
                     int frac, float *row)
{
    for (int j = 0; j < w->rows; j++) {
        kvs_weight_row(w, j, row);
        for (int i = 0; i < w->cols; i++)
            W[(size_t)i * n + col0 + (size_t)j] =
                kvs_fx_encode((double)row[i] * (norm ? (double)norm[i] : 1.0), frac);
    }
}

/* A k x n weight from up to two stored matrices side by side (party 1), masked and shared. */
static kvs_status weight(kvs_mpc *m, kvs_mpc_weight *out, size_t k, size_t n,
                         const kvs_weight *a, const kvs_weight *b, const kvs_weight *c,
                         const float *norm, kvs_error *err)
{
    uint64_t *W = NULL;
    float *row = NULL;
    if (m->role == KVS_MPC_P1) {
        W = malloc(sizeof *W * (k * n > 0 ? k * n : 1));
        row = malloc(sizeof *row * (k + 1));
        if (!W || !row) {
            free(W);
            free(row);
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a %zu x %zu weight", k, n);
        }
        size_t col = 0;
        const kvs_weight *parts[3] = {a, b, c};
        for (int i = 0; i < 3 && parts[i]; i++) {
            put_rows(W, n, col, parts[i], norm, m->frac, row);
            col += (size_t)parts[i]->rows;
        }
    }
    kvs_status st = kvs_mpc_weight_setup(m, out, k, n, W, err);
    free(W);
    free(row);
    return st;
}

/* The embedding as a vocab x dim weight: its rows are already tokens x dim. */
static kvs_status embedding(kvs_mpc *m, const struct kvs_model *model, const kvs_mpc_shape *s,
                            kvs_mpc_weight *out, kvs_error *err)
{
    const size_t k = (size_t)s->vocab, n = (size_t)s->dim;
    uint64_t *W = NULL;
    if (m->role == KVS_MPC_P1) {
        float *row = malloc(sizeof *row * n);
        W = malloc(sizeof *W * k * n);
        if (!W || !row) {
            free(W);
            free(row);
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the embedding");
        }
        for (size_t t = 0; t < k; t++) {
            kvs_weight_row(&model->tok_embd, (int)t, row);
            for (size_t i = 0; i < n; i++)
                W[t * n + i] = kvs_fx_encode(row[i], m->frac);
        }
        free(row);
    }
    kvs_status st = kvs_mpc_weight_setup(m, out, k, n, W, err);
    free(W);
    return st;
}

kvs_status kvs_mpc_llama_setup(kvs_mpc *m, const struct kvs_model *model,
                               const kvs_mpc_shape *s, kvs_mpc_llama *out, kvs_error *err)
{
    memset(out, 0, sizeof *out);
    out->s = *s;
    if (m->role == KVS_MPC_P1 && !model)
        return kvs_fail(err, KVS_ERR_ARG, "party 1 needs the model");
    if (!(out->layers = calloc((size_t)s->n_layers, sizeof *out->layers)))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d layers", s->n_layers);
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden;
    kvs_status st = embedding(m, model, s, &out->emb, err);
    for (int l = 0; l < s->n_layers && st == KVS_OK; l++) {
        const kvs_layer *L = model && m->role == KVS_MPC_P1 ? &model->layers[l] : NULL;
        kvs_mpc_layer *o = &out->layers[l];
        st = weight(m, &o->qkv, dim, dim + 2 * kvd, L ? &L->wq : NULL, L ? &L->wk : NULL,
                    L ? &L->wv : NULL, L ? L->attn_norm : NULL, err);
        if (st == KVS_OK)
            st = weight(m, &o->wo, dim, dim, L ? &L->wo : NULL, NULL, NULL, NULL, err);
        if (st == KVS_OK)
            st = weight(m, &o->w13, dim, 2 * hid, L ? &L->w_gate : NULL, L ? &L->w_up : NULL,
                        NULL, L ? L->ffn_norm : NULL, err);
        if (st == KVS_OK)
            st = weight(m, &o->w2, hid, dim, L ? &L->w_down : NULL, NULL, NULL, NULL, err);
        kvs_mpc_cache_init(&o->k, s->n_kv_heads, s->head_dim);
        kvs_mpc_cache_init(&o->v, s->n_kv_heads, s->head_dim);
    }
    if (st == KVS_OK)
        st = weight(m, &out->out, dim, (size_t)s->vocab,
                    m->role == KVS_MPC_P1 ? &model->output : NULL, NULL, NULL,
                    m->role == KVS_MPC_P1 ? model->output_norm : NULL, err);
    if (st != KVS_OK)
        kvs_mpc_llama_free(out);
    return st;
}

void kvs_mpc_llama_free(kvs_mpc_llama *L)
{
    for (int l = 0; L->layers && l < L->s.n_layers; l++) {
        kvs_mpc_layer *o = &L->layers[l];
        kvs_mpc_weight_free(&o->qkv);
        kvs_mpc_weight_free(&o->wo);
        kvs_mpc_weight_free(&o->w13);
        kvs_mpc_weight_free(&o->w2);
        kvs_mpc_cache_free(&o->k);
        kvs_mpc_cache_free(&o->v);
    }
    free(L->layers);
    L->layers = NULL;
    kvs_mpc_weight_free(&L->emb);
    kvs_mpc_weight_free(&L->out);
}

/* ---- one step ---- */

/* Scratch for one step, sized by the shape and the context. */
typedef struct step_buf {
    uint64_t *x, *xn, *qkv, *att, *o, *h, *a, *sc, *e, *t, *r;
    size_t cap_t;
} step_buf;

/* x times public constants c (fixed point at frac) elementwise, then truncated: y may alias. */
static kvs_status mul_public(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, const uint64_t *c,
                             size_t n, uint64_t *y, kvs_error *err)
{
    for (size_t i = 0; !kvs_mpc_is_dealer(m) && i < n; i++)
        y[i] = x[i] * c[i];
    return kvs_mpc_trunc(m, op, kvs_mpc_is_dealer(m) ? NULL : y, n, m->frac, err);
}

/* xn = x / rms(x), per the norm's shape (its weight is folded into the next matrix): the mean
 * square by products and a public 1/dim, plus eps, its reciprocal square root, a product. */
static kvs_status rmsnorm(kvs_mpc *m, const kvs_mpc_shape *s, const uint64_t *x, uint64_t *xn,
                          uint64_t *tmp, kvs_error *err)
{
    const int dim = s->dim, dealer = kvs_mpc_is_dealer(m);
    kvs_status st = kvs_mpc_mul(m, KVS_OP_RMSNORM, x, x, (size_t)dim, tmp, err);
    uint64_t ms = 0, r = 0;
    for (int i = 0; !dealer && i < dim; i++)
        ms += tmp[i];
    if (st == KVS_OK) /* at 2 frac: back to frac, then times 1/dim at frac */
        st = kvs_mpc_trunc(m, KVS_OP_RMSNORM, dealer ? NULL : &ms, 1, m->frac, err);
    const uint64_t inv_dim = kvs_fx_encode(1.0 / dim, m->frac);
    if (st == KVS_OK)
        st = mul_public(m, KVS_OP_RMSNORM, &ms, &inv_dim, 1, &ms, err);
    /* eps, at least one unit: 1e-5 is below the resolution of 12-14 fraction bits */
    const uint64_t eps = kvs_fx_encode(s->eps, m->frac);
    ms = kvs_mpc_add_public(m, ms, eps ? eps : 1);
    if (st == KVS_OK)
        st = kvs_mpc_rsqrt(m, KVS_OP_RMSNORM, dealer ? NULL : &ms, 1, dealer ? NULL : &r, err);
    for (int i = 0; !dealer && i < dim; i++)
        tmp[i] = r;
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, KVS_OP_RMSNORM, x, tmp, (size_t)dim, xn, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_RMSNORM, dealer ? NULL : xn, (size_t)dim, m->frac, err);
    return st;
}

/* RoPE at a public position, with an extra public factor (1/sqrt(head_dim) for queries): the
 * rotated pairs are public linear maps of the shares, then one truncation. */
static kvs_status rope(kvs_mpc *m, const kvs_mpc_shape *s, uint64_t *v, int heads, int pos,
                       double scale, kvs_error *err)
{
    const int hd = s->head_dim, pairs = s->rot_dim / 2;
    if (!kvs_mpc_is_dealer(m))
        for (int h = 0; h < heads; h++) {
            uint64_t *x = v + (size_t)h * hd;
            for (int p = 0; p < pairs; p++) {
                const double th = pos * pow(s->rope_base, -2.0 * p / s->rot_dim);
                const uint64_t c = kvs_fx_encode(cos(th) * scale, m->frac);
                const uint64_t sn = kvs_fx_encode(sin(th) * scale, m->frac);
                const int i0 = s->neox ? p : 2 * p, i1 = s->neox ? p + pairs : 2 * p + 1;
                const uint64_t a = x[i0], b = x[i1];
                x[i0] = a * c - b * sn;
                x[i1] = a * sn + b * c;
            }
            /* dims past rot_dim are only scaled */
            const uint64_t k = kvs_fx_encode(scale, m->frac);
            for (int i = 2 * pairs; i < hd; i++)
                x[i] *= k;
        }
    return kvs_mpc_trunc(m, KVS_OP_MATMUL, kvs_mpc_is_dealer(m) ? NULL : v,
                         (size_t)heads * hd, m->frac, err);
}

/* Softmax of rows rows of len scores (at frac), in place. */
static kvs_status softmax(kvs_mpc *m, uint64_t *sc, size_t rows, size_t len, uint64_t *tmp,
                          kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    uint64_t mx[64], sum[64], rc[64];
    if (rows > 64)
        return kvs_fail(err, KVS_ERR_ARG, "softmax of %zu rows at once (at most 64)", rows);
    /* scores differ by less than 2^11 (in value): a sign test over frac + 12 bits suffices */
    kvs_status st = kvs_mpc_max_rows(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, rows, len,
                                     m->frac + 12,
                                     dealer ? NULL : mx, err);
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t t = 0; t < len; t++)
            sc[r * len + t] -= mx[r];
    if (st == KVS_OK)
        st = kvs_mpc_exp_neg(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, rows * len, m->frac + 12,
                             dealer ? NULL : sc, err);
    for (size_t r = 0; !dealer && r < rows; r++) {
        sum[r] = 0;
        for (size_t t = 0; t < len; t++)
            sum[r] += sc[r * len + t];
    }
    if (st == KVS_OK)
        st = kvs_mpc_recip(m, KVS_OP_SOFTMAX, dealer ? NULL : sum, rows, dealer ? NULL : rc,
                           err);
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t t = 0; t < len; t++)
            tmp[r * len + t] = rc[r];
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, dealer ? NULL : tmp, rows * len,
                         dealer ? NULL : sc, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, rows * len, m->frac, err);
    return st;
}

static kvs_status buf_alloc(step_buf *b, const kvs_mpc_shape *s, size_t T)
{
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden, v = (size_t)s->vocab;
    const size_t big = (size_t)s->n_heads * T;
    size_t n = dim * 4 + (dim + 2 * kvd) + 2 * hid * 2 + v + 3 * big + dim;
    uint64_t *p = calloc(n, sizeof *p);
    if (!p)
        return KVS_ERR_NOMEM;
    b->x = p;
    b->xn = b->x + dim;
    b->att = b->xn + dim;
    b->o = b->att + dim;
    b->qkv = b->o + dim;
    b->h = b->qkv + dim + 2 * kvd;
    b->a = b->h + 2 * hid;
    b->t = b->a + 2 * hid; /* v or dim words */
    b->sc = b->t + (v > dim ? v : dim);
    b->e = b->sc + big;
    b->r = b->e + big;
    return KVS_OK;
}

kvs_status kvs_mpc_llama_step(kvs_mpc *m, kvs_mpc_llama *L, int32_t token, uint64_t *logits,
                              kvs_error *err)
{
    const kvs_mpc_shape *s = &L->s;
    const int dealer = kvs_mpc_is_dealer(m), pos = L->pos;
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden, T = (size_t)pos + 1;
    const int G = s->n_heads / s->n_kv_heads;
    if (m->role == KVS_MPC_P0 && (token < 0 || token >= s->vocab))
        return kvs_fail(err, KVS_ERR_ARG, "token id %d is outside the vocabulary [0, %d)", token,
                        s->vocab);
    step_buf b = {0};
    if (buf_alloc(&b, s, T) != KVS_OK)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for a step at position %d", pos);
    /* the token as party 0's one-hot input, times the embedding */
    uint64_t *onehot = b.t;
    if (m->role == KVS_MPC_P0) {
        memset(onehot, 0, sizeof *onehot * (size_t)s->vocab);
        onehot[token] = 1;
    }
    kvs_status st = kvs_mpc_input(m, 0, m->role == KVS_MPC_P0 ? onehot : NULL,
                                  (size_t)s->vocab, dealer ? NULL : onehot, err);
    if (st == KVS_OK)
        st = kvs_mpc_matmul_w(m, &L->emb, dealer ? NULL : onehot, 1, dealer ? NULL : b.x, err);
    const double qscale = 1.0 / sqrt((double)s->head_dim);
    for (int l = 0; l < s->n_layers && st == KVS_OK; l++) {
        kvs_mpc_layer *Ly = &L->layers[l];
        uint64_t *q = b.qkv, *k = b.qkv + dim, *v = b.qkv + dim + kvd;
        st = rmsnorm(m, s, b.x, b.xn, b.t, err);
        if (st == KVS_OK) {
            if (!dealer)
                memset(b.qkv, 0, sizeof *b.qkv * (dim + 2 * kvd));
            st = kvs_mpc_matmul_w(m, &Ly->qkv, dealer ? NULL : b.xn, 1, dealer ? NULL : b.qkv,
                                  err);
        }
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.qkv, dim + 2 * kvd, m->frac,
                               err);
        if (st == KVS_OK)
            st = rope(m, s, q, s->n_heads, pos, qscale, err);
        if (st == KVS_OK)
            st = rope(m, s, k, s->n_kv_heads, pos, 1.0, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &Ly->k, dealer ? NULL : k, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &Ly->v, dealer ? NULL : v, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_qk(m, KVS_OP_MATMUL, &Ly->k, dealer ? NULL : q, G,
                                  dealer ? NULL : b.sc, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.sc, (size_t)s->n_heads * T,
                               m->frac, err);
        if (st == KVS_OK)
            st = softmax(m, b.sc, (size_t)s->n_heads, T, b.e, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_pv(m, KVS_OP_MATMUL, &Ly->v, dealer ? NULL : b.sc, G,
                                  dealer ? NULL : b.att, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.att, dim, m->frac, err);
        if (st == KVS_OK) {
            if (!dealer)
                memset(b.o, 0, sizeof *b.o * dim);
            st = kvs_mpc_matmul_w(m, &Ly->wo, dealer ? NULL : b.att, 1, dealer ? NULL : b.o,
                                  err);
        }
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.o, dim, m->frac, err);
        for (size_t i = 0; !dealer && i < dim; i++)
            b.x[i] += b.o[i];
        /* feed-forward */
        if (st == KVS_OK)
            st = rmsnorm(m, s, b.x, b.xn, b.t, err);
        if (st == KVS_OK) {
            if (!dealer)
                memset(b.h, 0, sizeof *b.h * 2 * hid);
            st = kvs_mpc_matmul_w(m, &Ly->w13, dealer ? NULL : b.xn, 1, dealer ? NULL : b.h,
                                  err);
        }
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.h, 2 * hid, m->frac, err);
        if (st == KVS_OK)
            st = kvs_mpc_silu(m, KVS_OP_SILU, dealer ? NULL : b.h, hid, KVS_MPC_SILU_BITS(m->frac),
                              dealer ? NULL : b.a, err);
        if (st == KVS_OK)
            st = kvs_mpc_mul(m, KVS_OP_SILU, dealer ? NULL : b.a, dealer ? NULL : b.h + hid, hid,
                             dealer ? NULL : b.a, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_SILU, dealer ? NULL : b.a, hid, m->frac, err);
        if (st == KVS_OK) {
            if (!dealer)
                memset(b.o, 0, sizeof *b.o * dim);
            st = kvs_mpc_matmul_w(m, &Ly->w2, dealer ? NULL : b.a, 1, dealer ? NULL : b.o, err);
        }
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b.o, dim, m->frac, err);
        for (size_t i = 0; !dealer && i < dim; i++)
            b.x[i] += b.o[i];
    }
    if (st == KVS_OK)
        st = rmsnorm(m, s, b.x, b.xn, b.t, err);
    if (st == KVS_OK && !dealer)
        memset(logits, 0, sizeof *logits * (size_t)s->vocab);
    if (st == KVS_OK)
        st = kvs_mpc_matmul_w(m, &L->out, dealer ? NULL : b.xn, 1, dealer ? NULL : logits, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : logits, (size_t)s->vocab, m->frac,
                           err);
    if (st == KVS_OK)
        L->pos++;
    free(b.x);
    return st;
}
