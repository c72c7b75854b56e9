/* The Llama forward pass on secret shares, a block of tokens at a time (forward.h). */
#include "mpc/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpc/fxp.h"
#include "mpc/gates_nl.h"
#include "mpc/mpcache.h"

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
    kvs_status st;
    if (m->role == KVS_MPC_P1 &&
        (st = kvs_llama_check_plain(model, "the two-party engine", err)) != KVS_OK)
        return st;
    if (!(out->layers = calloc((size_t)s->n_layers, sizeof *out->layers)))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d layers", s->n_layers);
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden;
    st = embedding(m, model, s, &out->emb, err);
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
    kvs_mpc_sel_free(L);
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

/* ---- a block of tokens ---- */

/* Scratch for a block of n tokens at context T (after the block), sized by the shape. */
typedef struct step_buf {
    uint64_t *x, *xn, *qkv, *qk, *v, *att, *o, *h, *a, *t, *sc, *e, *row;
    double *rot; /* n x rot_dim / 2 x (cos, sin) of the rows' RoPE angles, for every layer */
} step_buf;

/* x times public constants c (fixed point at frac) elementwise, then truncated: y may alias. */
static kvs_status mul_public(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, const uint64_t *c,
                             size_t n, uint64_t *y, kvs_error *err)
{
    for (size_t i = 0; !kvs_mpc_is_dealer(m) && i < n; i++)
        y[i] = x[i] * c[i];
    return kvs_mpc_trunc(m, op, kvs_mpc_is_dealer(m) ? NULL : y, n, m->frac, err);
}

/* y = x W for n rows of x, truncated back to frac (the weight's products carry 2 frac). */
static kvs_status linear(kvs_mpc *m, const kvs_mpc_weight *w, const uint64_t *x, size_t n,
                         uint64_t *y, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    if (!dealer)
        memset(y, 0, sizeof *y * n * w->n);
    kvs_status st = kvs_mpc_matmul_w(m, w, dealer ? NULL : x, n, dealer ? NULL : y, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : y, n * w->n, m->frac, err);
    return st;
}

/* xn = x / rms(x) for each of n rows (its weight is folded into the next matrix): the mean
 * square by products and a public 1/dim, plus eps, its reciprocal square root, a product.
 * tmp: n x dim words; row: 3 n words. */
static kvs_status rmsnorm(kvs_mpc *m, const kvs_mpc_shape *s, const uint64_t *x, size_t n,
                          uint64_t *xn, uint64_t *tmp, uint64_t *row, kvs_error *err)
{
    const size_t dim = (size_t)s->dim;
    const int dealer = kvs_mpc_is_dealer(m);
    uint64_t *ms = row, *r = row + n, *inv = row + 2 * n;
    kvs_status st = kvs_mpc_mul(m, KVS_OP_RMSNORM, x, x, n * dim, tmp, err);
    for (size_t j = 0; !dealer && j < n; j++) {
        ms[j] = 0;
        for (size_t i = 0; i < dim; i++)
            ms[j] += tmp[j * dim + i];
    }
    if (st == KVS_OK) /* at 2 frac: back to frac, then times 1/dim at frac */
        st = kvs_mpc_trunc(m, KVS_OP_RMSNORM, dealer ? NULL : ms, n, m->frac, err);
    for (size_t j = 0; j < n; j++)
        inv[j] = kvs_fx_encode(1.0 / (double)dim, m->frac);
    if (st == KVS_OK)
        st = mul_public(m, KVS_OP_RMSNORM, ms, inv, n, ms, err);
    /* eps, at least one unit: 1e-5 is below the resolution of 12-14 fraction bits */
    const uint64_t eps = kvs_fx_encode(s->eps, m->frac);
    for (size_t j = 0; !dealer && j < n; j++)
        ms[j] = kvs_mpc_add_public(m, ms[j], eps ? eps : 1);
    if (st == KVS_OK)
        st = kvs_mpc_rsqrt(m, KVS_OP_RMSNORM, dealer ? NULL : ms, n, dealer ? NULL : r, err);
    for (size_t j = 0; !dealer && j < n; j++)
        for (size_t i = 0; i < dim; i++)
            tmp[j * dim + i] = r[j];
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, KVS_OP_RMSNORM, x, tmp, n * dim, xn, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_RMSNORM, dealer ? NULL : xn, n * dim, m->frac, err);
    return st;
}

void kvs_mpc_rope_angles(const kvs_mpc_shape *s, int pos, size_t n, double *rot)
{
    const int pairs = s->rot_dim / 2;
    for (int p = 0; p < pairs; p++) {
        const double freq = pow(s->rope_base, -2.0 * p / s->rot_dim);
        for (size_t r = 0; r < n; r++) {
            const double th = (double)(pos + (int)r) * freq;
            rot[(r * (size_t)pairs + (size_t)p) * 2] = cos(th);
            rot[(r * (size_t)pairs + (size_t)p) * 2 + 1] = sin(th);
        }
    }
}

void kvs_mpc_rope_row(const kvs_mpc_shape *s, int frac, uint64_t *v, int heads, const double *rot,
                      double scale)
{
    const int hd = s->head_dim, pairs = s->rot_dim / 2;
    const uint64_t k = kvs_fx_encode(scale, frac);
    for (int p = 0; p < pairs; p++) {
        const uint64_t c = kvs_fx_encode(rot[2 * p] * scale, frac);
        const uint64_t sn = kvs_fx_encode(rot[2 * p + 1] * scale, frac);
        const int i0 = s->neox ? p : 2 * p, i1 = s->neox ? p + pairs : 2 * p + 1;
        for (int h = 0; h < heads; h++) {
            uint64_t *x = v + (size_t)h * hd;
            const uint64_t a = x[i0], b = x[i1];
            x[i0] = a * c - b * sn;
            x[i1] = a * sn + b * c;
        }
    }
    /* dims past rot_dim are only scaled */
    for (int h = 0; h < heads; h++)
        for (int i = 2 * pairs; i < hd; i++)
            v[(size_t)h * hd + i] *= k;
}

kvs_status kvs_mpc_softmax(kvs_mpc *m, uint64_t *sc, size_t rows, size_t len,
                          const size_t *valid, int masked, const uint64_t *mask, uint64_t *tmp,
                          uint64_t *row, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    uint64_t *mx = row, *sum = row + rows, *rc = row + 2 * rows;
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t t = valid[r]; t < len; t++)
            sc[r * len + t] = sc[r * len];
    /* scores differ by less than 2^11 (in value): a sign test over frac + 12 bits suffices */
    kvs_status st = kvs_mpc_max_rows(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, rows, len,
                                     m->frac + 12, dealer ? NULL : mx, err);
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t t = 0; t < len; t++)
            sc[r * len + t] -= mx[r];
    if (st == KVS_OK)
        st = kvs_mpc_exp_neg(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, rows * len, m->frac + 12,
                             dealer ? NULL : sc, err);
    for (size_t r = 0; !dealer && r < rows; r++) {
        sum[r] = 0;
        for (size_t t = valid[r]; t < len; t++)
            sc[r * len + t] = 0;
    }
    if (st == KVS_OK && masked)
        st = kvs_mpc_mul(m, KVS_OP_SOFTMAX, dealer ? NULL : sc, dealer ? NULL : mask, rows * len,
                         dealer ? NULL : sc, err);
    for (size_t r = 0; !dealer && r < rows; r++)
        for (size_t t = 0; t < len; t++)
            sum[r] += sc[r * len + t];
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

static kvs_status buf_alloc(step_buf *b, const kvs_mpc_shape *s, size_t n, size_t T)
{
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t hid = (size_t)s->hidden, v = (size_t)s->vocab;
    const size_t big = n * (size_t)s->n_heads * T, tw = n * (v > dim ? v : dim);
    const size_t words = n * (4 * dim + (dim + 2 * kvd) + (dim + kvd) + kvd + 2 * hid + hid) +
                         tw + 2 * big + 4 * n * (size_t)s->n_heads;
    uint64_t *p = calloc(words, sizeof *p);
    double *rot = malloc(sizeof *rot * (n * (size_t)(s->rot_dim / 2) * 2 + 1));
    if (!p || !rot) {
        free(p);
        free(rot);
        return KVS_ERR_NOMEM;
    }
    b->rot = rot;
    b->x = p;
    b->xn = b->x + n * dim;
    b->att = b->xn + n * dim;
    b->o = b->att + n * dim;
    b->qkv = b->o + n * dim;
    b->qk = b->qkv + n * (dim + 2 * kvd);
    b->v = b->qk + n * (dim + kvd);
    b->h = b->v + n * kvd;
    b->a = b->h + n * 2 * hid;
    b->t = b->a + n * hid; /* n x max(vocab, dim) words */
    b->sc = b->t + tw;
    b->e = b->sc + big;
    b->row = b->e + big; /* 3 n heads words, then n heads sizes */
    return KVS_OK;
}

/* One layer's attention over the block: x (n x dim) += softmax(q K^T) V Wo (over the slots the
 * KV selection chooses, when it is active: one token). */
static kvs_status attention(kvs_mpc *m, kvs_mpc_llama *L, int l, size_t n, step_buf *b,
                            const size_t *valid, kvs_error *err)
{
    kvs_mpc_layer *Ly = &L->layers[l];
    const int sparse = kvs_mpc_sel_active(L);
    const kvs_mpc_shape *s = &L->s;
    const int dealer = kvs_mpc_is_dealer(m), G = s->n_heads / s->n_kv_heads;
    const size_t dim = (size_t)s->dim, kvd = (size_t)s->n_kv_heads * s->head_dim;
    const size_t T = (size_t)L->pos + n, W = dim + 2 * kvd;
    const double qscale = 1.0 / sqrt((double)s->head_dim);
    kvs_status st = rmsnorm(m, s, b->x, n, b->xn, b->t, b->row, err);
    if (st == KVS_OK)
        st = linear(m, &Ly->qkv, b->xn, n, b->qkv, err);
    /* q and k side by side per row, rotated at their positions; v apart */
    for (size_t r = 0; !dealer && r < n; r++) {
        uint64_t *qk = b->qk + r * (dim + kvd);
        memcpy(qk, b->qkv + r * W, sizeof *qk * (dim + kvd));
        memcpy(b->v + r * kvd, b->qkv + r * W + dim + kvd, sizeof *b->v * kvd);
        const double *rot = b->rot + r * (size_t)(s->rot_dim / 2) * 2;
        kvs_mpc_rope_row(s, m->frac, qk, s->n_heads, rot, qscale);
        kvs_mpc_rope_row(s, m->frac, qk + dim, s->n_kv_heads, rot, 1.0);
    }
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b->qk, n * (dim + kvd), m->frac,
                           err);
    /* k (after each row's q) into the cache: gather the block's k rows, then its v rows */
    for (size_t r = 0; !dealer && r < n; r++)
        memcpy(b->o + r * kvd, b->qk + r * (dim + kvd) + dim, sizeof *b->o * kvd);
    if (st == KVS_OK && sparse)
        st = kvs_mpc_sel_seal(m, L, l, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &Ly->k, dealer ? NULL : b->o, n, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &Ly->v, dealer ? NULL : b->v, n, err);
    for (size_t r = 0; !dealer && r < n; r++)
        memmove(b->qk + r * dim, b->qk + r * (dim + kvd), sizeof *b->qk * dim);
    const size_t rows = n * (size_t)s->n_heads;
    if (st == KVS_OK && sparse) {
        st = kvs_mpc_sel_attend(m, L, l, dealer ? NULL : b->qk, dealer ? NULL : b->att, err);
    } else if (st == KVS_OK) {
        st = kvs_mpc_cache_qk(m, KVS_OP_MATMUL, &Ly->k, dealer ? NULL : b->qk, n, G,
                              dealer ? NULL : b->sc, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b->sc, rows * T, m->frac, err);
        if (st == KVS_OK)
            st = kvs_mpc_softmax(m, b->sc, rows, T, valid, 0, NULL, b->e, b->row, err);
        if (st == KVS_OK && L->sel)
            kvs_mpc_sel_observe(m, L, l, b->sc, n, L->pos, T);
        if (st == KVS_OK)
            st = kvs_mpc_cache_pv(m, KVS_OP_MATMUL, &Ly->v, dealer ? NULL : b->sc, n, G,
                                  dealer ? NULL : b->att, err);
    }
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_MATMUL, dealer ? NULL : b->att, n * dim, m->frac, err);
    if (st == KVS_OK)
        st = linear(m, &Ly->wo, b->att, n, b->o, err);
    for (size_t i = 0; !dealer && i < n * dim; i++)
        b->x[i] += b->o[i];
    return st;
}

/* One layer's feed-forward over the block: x += W2 (silu(W1 x) * W3 x). */
static kvs_status feed_forward(kvs_mpc *m, const kvs_mpc_shape *s, kvs_mpc_layer *Ly, size_t n,
                               step_buf *b, kvs_error *err)
{
    const int dealer = kvs_mpc_is_dealer(m);
    const size_t dim = (size_t)s->dim, hid = (size_t)s->hidden;
    kvs_status st = rmsnorm(m, s, b->x, n, b->xn, b->t, b->row, err);
    if (st == KVS_OK)
        st = linear(m, &Ly->w13, b->xn, n, b->h, err);
    /* gate halves to b->a, up halves to the start of b->h */
    for (size_t r = 0; !dealer && r < n; r++) {
        memcpy(b->a + r * hid, b->h + r * 2 * hid, sizeof *b->a * hid);
        memmove(b->h + r * hid, b->h + r * 2 * hid + hid, sizeof *b->h * hid);
    }
    if (st == KVS_OK)
        st = kvs_mpc_silu(m, KVS_OP_SILU, dealer ? NULL : b->a, n * hid,
                          KVS_MPC_SILU_BITS(m->frac), dealer ? NULL : b->a, err);
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, KVS_OP_SILU, dealer ? NULL : b->a, dealer ? NULL : b->h, n * hid,
                         dealer ? NULL : b->a, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_SILU, dealer ? NULL : b->a, n * hid, m->frac, err);
    if (st == KVS_OK)
        st = linear(m, &Ly->w2, b->a, n, b->o, err);
    for (size_t i = 0; !dealer && i < n * dim; i++)
        b->x[i] += b->o[i];
    return st;
}

int kvs_mpc_llama_block(const kvs_mpc_shape *s, int pos, int remaining)
{
    /* the block's score matrix, n x heads x (pos + n), within 2^17 values (the
     * dealer then holds about 200 MB of keys for its softmax), and n <= 64 */
    int n = 1;
    while (n < 64 && n < remaining &&
           (size_t)(2 * n) * (size_t)s->n_heads * (size_t)(pos + 2 * n) <= ((size_t)1 << 17))
        n *= 2;
    return n < remaining ? n : remaining;
}

kvs_status kvs_mpc_llama_forward(kvs_mpc *m, kvs_mpc_llama *L, const int32_t *tokens, int n,
                                 uint64_t *logits, kvs_error *err)
{
    const kvs_mpc_shape *s = &L->s;
    const int dealer = kvs_mpc_is_dealer(m), pos = L->pos;
    const size_t dim = (size_t)s->dim, V = (size_t)s->vocab, N = (size_t)n;
    if (n < 1)
        return kvs_fail(err, KVS_ERR_ARG, "a forward pass of %d tokens", n);
    for (int r = 0; m->role == KVS_MPC_P0 && r < n; r++)
        if (tokens[r] < 0 || tokens[r] >= s->vocab)
            return kvs_fail(err, KVS_ERR_ARG, "token id %d is outside the vocabulary [0, %d)",
                            tokens[r], s->vocab);
    const kvs_mpc_sel *sel = L->sel;
    if (sel && !sel->compressed && pos + n > sel->prompt_len)
        return kvs_fail(err, KVS_ERR_ARG, "a block of %d tokens at position %d crosses the "
                        "prompt's end (%d), where the static step runs", n, pos, sel->prompt_len);
    if (kvs_mpc_sel_active(L) && n != 1)
        return kvs_fail(err, KVS_ERR_ARG, "with KV selection, decoding takes one token a call "
                        "(%d given)", n);
    step_buf b = {0};
    if (buf_alloc(&b, s, N, (size_t)pos + N) != KVS_OK)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for %d tokens at position %d", n,
                        pos);
    if (!dealer)
        kvs_mpc_rope_angles(s, pos, N, b.rot);
    /* row r of a head's scores sees the cache up to its own position */
    size_t *valid = (size_t *)(b.row + 3 * N * (size_t)s->n_heads);
    for (size_t r = 0; r < N * (size_t)s->n_heads; r++)
        valid[r] = (size_t)pos + r / (size_t)s->n_heads + 1;
    /* the tokens as party 0's one-hot rows, times the embedding */
    uint64_t *onehot = b.t;
    if (m->role == KVS_MPC_P0) {
        memset(onehot, 0, sizeof *onehot * N * V);
        for (size_t r = 0; r < N; r++)
            onehot[r * V + (size_t)tokens[r]] = 1;
    }
    kvs_status st = kvs_mpc_input(m, 0, m->role == KVS_MPC_P0 ? onehot : NULL, N * V,
                                  dealer ? NULL : onehot, err);
    if (st == KVS_OK)
        st = kvs_mpc_matmul_w(m, &L->emb, dealer ? NULL : onehot, N, dealer ? NULL : b.x, err);
    for (int l = 0; l < s->n_layers && st == KVS_OK; l++) {
        st = attention(m, L, l, N, &b, valid, err);
        if (st == KVS_OK)
            st = feed_forward(m, s, &L->layers[l], N, &b, err);
    }
    /* the logits of the last token only */
    const uint64_t *last = b.x + (N - 1) * dim;
    if (st == KVS_OK)
        st = rmsnorm(m, s, dealer ? NULL : last, 1, b.xn, b.t, b.row, err);
    if (st == KVS_OK)
        st = linear(m, &L->out, b.xn, 1, logits, err);
    if (st == KVS_OK)
        L->pos += n;
    if (st == KVS_OK && sel && !sel->compressed && L->pos == sel->prompt_len)
        st = kvs_mpc_sel_compress(m, L, err);
    free(b.x);
    free(b.rot);
    return st;
}

kvs_status kvs_mpc_llama_step(kvs_mpc *m, kvs_mpc_llama *L, int32_t token, uint64_t *logits,
                              kvs_error *err)
{
    return kvs_mpc_llama_forward(m, L, &token, 1, logits, err);
}
