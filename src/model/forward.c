#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"

kvs_status kvs_forward_buf_init(kvs_forward_buf *b, const kvs_hparams *hp, int cap,
                                kvs_error *err)
{
    memset(b, 0, sizeof *b);
    size_t n = (size_t)cap, q_dim = (size_t)hp->n_heads * hp->head_dim,
           kv_dim = (size_t)hp->n_kv_heads * hp->head_dim;
    b->cap = cap;
    b->x = malloc(sizeof(float) * n * hp->dim);
    b->xb = malloc(sizeof(float) * n * (q_dim > (size_t)hp->dim ? q_dim : (size_t)hp->dim));
    b->q = malloc(sizeof(float) * n * q_dim);
    b->k = malloc(sizeof(float) * n * kv_dim);
    b->v = malloc(sizeof(float) * n * kv_dim);
    b->att = malloc(sizeof(float) * n * q_dim);
    b->hb = malloc(sizeof(float) * n * hp->hidden);
    b->hb2 = malloc(sizeof(float) * n * hp->hidden);
    b->pos = malloc(sizeof(int32_t) * n);
    if (!b->x || !b->xb || !b->q || !b->k || !b->v || !b->att || !b->hb || !b->hb2 || !b->pos) {
        kvs_forward_buf_free(b);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for activations of %d tokens", cap);
    }
    return KVS_OK;
}

void kvs_forward_buf_free(kvs_forward_buf *b)
{
    free(b->x);
    free(b->xb);
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->att);
    free(b->hb);
    free(b->hb2);
    free(b->pos);
    memset(b, 0, sizeof *b);
}

/* y = x W^T for n rows. A failure names the tensor as GGUF does (blk.L.NAME.weight, or
 * NAME.weight outside the layers: layer < 0). */
static kvs_status matmul(kvs_pool *pool, float *y, const float *x, const kvs_weight *w, int n,
                         int layer, const char *name, kvs_error *err)
{
    kvs_status st = kvs_matmul(pool, y, x, w->data, w->type, n, w->cols, w->rows);
    if (st == KVS_OK)
        return KVS_OK;
    char tensor[64];
    if (layer >= 0)
        snprintf(tensor, sizeof tensor, "blk.%d.%s.weight", layer, name);
    else
        snprintf(tensor, sizeof tensor, "%s.weight", name);
    switch (st) {
    case KVS_ERR_NOMEM:
        return kvs_fail(err, st, "out of memory for the product of %d rows with %s", n, tensor);
    case KVS_ERR_UNSUPPORTED:
        return kvs_fail(err, st, "tensor %s: type %s has no matrix product kernel", tensor,
                        kvs_dtype_name(w->type));
    default:
        return kvs_fail(err, st, "tensor %s: %d x %d of type %s cannot be multiplied (not "
                        "whole blocks)", tensor, w->rows, w->cols, kvs_dtype_name(w->type));
    }
}

static void add_rows(float *x, const float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* NaN or inf logits (NaN weights, an overflowing activation) would otherwise pass silently:
 * sampling reads NaN as -inf and every comparison against them looks perfect. One pass over
 * the vocabulary per row, negligible next to the output matmul. */
static kvs_status check_logits(const float *logits, int rows, int vocab, int pos, kvs_error *err)
{
    for (int r = 0; r < rows; r++) {
        const float *row = logits + (size_t)r * vocab;
        float acc = 0.0f; /* x * 0 is NaN exactly for NaN and inf x */
        for (int i = 0; i < vocab; i++)
            acc += row[i] * 0.0f;
        if (acc == 0.0f)
            continue;
        int i = 0;
        while (i < vocab && isfinite(row[i]))
            i++;
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "non-finite logit (%s for token %d) at position %d: the model's weights "
                        "or activations are not finite", isnan(row[i]) ? "NaN" : "inf", i,
                        pos + r);
    }
    return KVS_OK;
}

kvs_status kvs_forward(const struct kvs_model *m, kvs_pool *pool, kvs_kv *kv,
                       kvs_forward_buf *b, const int32_t *tokens, int n, int pos0, float *logits,
                       int all_logits, kvs_error *err)
{
    const kvs_hparams *hp = &m->hp;
    const int dim = hp->dim;
    if (n <= 0 || n > b->cap)
        return kvs_fail(err, KVS_ERR_ARG, "batch of %d tokens (capacity %d)", n, b->cap);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->vocab)
            return kvs_fail(err, KVS_ERR_ARG, "token id %d is outside the vocabulary [0, %d)",
                            tokens[i], hp->vocab);
        kvs_weight_row(&m->tok_embd, tokens[i], b->x + (size_t)i * dim);
        b->pos[i] = pos0 + i;
    }

    for (int l = 0; l < hp->n_layers; l++) {
        const kvs_layer *L = &m->layers[l];
        for (int i = 0; i < n; i++)
            kvs_rmsnorm(b->xb + (size_t)i * dim, b->x + (size_t)i * dim, L->attn_norm, dim,
                        hp->eps);
        kvs_status st;
        if ((st = matmul(pool, b->q, b->xb, &L->wq, n, l, "attn_q", err)) != KVS_OK ||
            (st = matmul(pool, b->k, b->xb, &L->wk, n, l, "attn_k", err)) != KVS_OK ||
            (st = matmul(pool, b->v, b->xb, &L->wv, n, l, "attn_v", err)) != KVS_OK)
            return st;
        for (int i = 0; i < n; i++) {
            kvs_rope(b->q + (size_t)i * L->wq.rows, hp->n_heads, hp->head_dim, hp->rot_dim,
                     b->pos[i], hp->rope_base, hp->rope_neox);
            kvs_rope(b->k + (size_t)i * L->wk.rows, hp->n_kv_heads, hp->head_dim, hp->rot_dim,
                     b->pos[i], hp->rope_base, hp->rope_neox);
        }
        if ((st = kvs_kv_layer(kv, pool, l, n, b->q, b->k, b->v, b->pos, b->att, err)) != KVS_OK ||
            (st = matmul(pool, b->xb, b->att, &L->wo, n, l, "attn_output", err)) != KVS_OK)
            return st;
        add_rows(b->x, b->xb, (size_t)n * dim);

        for (int i = 0; i < n; i++)
            kvs_rmsnorm(b->xb + (size_t)i * dim, b->x + (size_t)i * dim, L->ffn_norm, dim,
                        hp->eps);
        if ((st = matmul(pool, b->hb, b->xb, &L->w_gate, n, l, "ffn_gate", err)) != KVS_OK ||
            (st = matmul(pool, b->hb2, b->xb, &L->w_up, n, l, "ffn_up", err)) != KVS_OK)
            return st;
        kvs_swiglu(b->hb, b->hb2, n * hp->hidden);
        if ((st = matmul(pool, b->xb, b->hb, &L->w_down, n, l, "ffn_down", err)) != KVS_OK)
            return st;
        add_rows(b->x, b->xb, (size_t)n * dim);
    }

    kvs_kv_end_batch(kv, n);
    if (!logits)
        return KVS_OK;
    int first = all_logits ? 0 : n - 1;
    for (int i = first; i < n; i++)
        kvs_rmsnorm(b->x + (size_t)i * dim, b->x + (size_t)i * dim, m->output_norm, dim, hp->eps);
    kvs_status st = matmul(pool, logits, b->x + (size_t)first * dim, &m->output, n - first, -1,
                           "output", err);
    if (st != KVS_OK)
        return st;
    return check_logits(logits, n - first, hp->vocab, pos0 + first, err);
}
