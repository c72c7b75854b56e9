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
    /* hb also takes the stacked products (q|k|v and gate|up rows) of fused matrices */
    size_t hb_w = 2 * (size_t)hp->hidden > q_dim + 2 * kv_dim ? 2 * (size_t)hp->hidden
                                                               : q_dim + 2 * kv_dim;
    b->hb = malloc(sizeof(float) * n * hb_w);
    b->hb2 = malloc(sizeof(float) * n * hp->hidden);
    b->pos = malloc(sizeof(int32_t) * n);
    const size_t pairs = hp->rot_dim / 2 > 0 ? (size_t)hp->rot_dim / 2 : 1;
    b->rope_cs = malloc(sizeof(float) * n * pairs);
    b->rope_sn = malloc(sizeof(float) * n * pairs);
    if (!b->x || !b->xb || !b->q || !b->k || !b->v || !b->att || !b->hb || !b->hb2 || !b->pos ||
        !b->rope_cs || !b->rope_sn) {
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
    free(b->rope_cs);
    free(b->rope_sn);
    memset(b, 0, sizeof *b);
}

/* y = x W^T for n rows. A failure names the tensor as GGUF does (blk.L.NAME.weight, or
 * NAME.weight outside the layers: layer < 0). */
static kvs_status matmul(kvs_pool *pool, float *y, const float *x, const kvs_weight *w, int n,
                         int exact, int layer, const char *name, kvs_error *err)
{
    kvs_status st = kvs_matmul_ex(pool, y, x, w->data, w->type, n, w->cols, w->rows, exact);
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

/* x[i] += bias for each of n rows of width w. */
static void add_bias(float *x, const float *bias, int n, int w)
{
    for (int i = 0; i < n; i++)
        add_rows(x + (size_t)i * w, bias, (size_t)w);
}

/* Rows [q | k | v] of the stacked product in b->hb, copied out to b->q, b->k and b->v. */
static void unstack_qkv(kvs_forward_buf *b, int n, int q_dim, int kv_dim)
{
    const size_t w = (size_t)q_dim + 2 * (size_t)kv_dim;
    for (int i = 0; i < n; i++) {
        const float *row = b->hb + (size_t)i * w;
        memcpy(b->q + (size_t)i * q_dim, row, sizeof(float) * (size_t)q_dim);
        memcpy(b->k + (size_t)i * kv_dim, row + q_dim, sizeof(float) * (size_t)kv_dim);
        memcpy(b->v + (size_t)i * kv_dim, row + q_dim + kv_dim, sizeof(float) * (size_t)kv_dim);
    }
}

/* Rows of width 2 * hidden in hb whose first halves hold silu(gate) * up (STAGE_SWIGLU_STACKED)
 * become rows of width hidden: row i moves down to i * hidden, in order, never over a row not
 * yet moved. */
static void swiglu_compact(float *hb, int n, int hidden)
{
    for (int i = 1; i < n; i++)
        memmove(hb + (size_t)i * hidden, hb + (size_t)i * 2 * hidden, sizeof(float) * (size_t)hidden);
}

/* RMSNorm of each of n_heads heads of vec by the same head_dim weights (qwen3's Q/K norm). */
static void head_norm(float *vec, const float *w, int n_heads, int head_dim, float eps)
{
    for (int h = 0; h < n_heads; h++)
        kvs_rmsnorm(vec + (size_t)h * head_dim, vec + (size_t)h * head_dim, w, head_dim, eps);
}

/* The cos and sin of RoPE pair i (of rot_dim / 2) at position pos: the pair turns by
 * pos * base^(-2i/rot_dim) / rope_div[i]; without divisors these are exactly kvs_rope's. With
 * them, the angles are formed as llama.cpp forms them (theta_0 = pos, then theta_i+1 =
 * theta_i * base^(-2/rot_dim) in float), which follows its rounding: on the llama3-f32 golden
 * logits, 3e-5 instead of the 7e-5 of base^(-2i/rot_dim) per pair (and 6e-5 in double).
 * Computed once per token for the queries and keys of every layer, not twice per layer: they
 * run between the parallel products, while the other threads wait. */
static void rope_angles(const struct kvs_model *m, int pos, float *cs, float *sn)
{
    const kvs_hparams *hp = &m->hp;
    if (!m->rope_div) {
        kvs_rope_angles(pos, hp->rot_dim, hp->rope_base, cs, sn);
        return;
    }
    const int half = hp->rot_dim / 2;
    const float step = powf(hp->rope_base, -2.0f / (float)hp->rot_dim);
    float theta = (float)pos;
    for (int i = 0; i < half; i++, theta *= step) {
        const float angle = theta / m->rope_div[i];
        cs[i] = cosf(angle);
        sn[i] = sinf(angle);
    }
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

/* The per-token stages between the products, row by row: on the pool for a batch of at least
 * ROWS_ON_POOL tokens (a prompt), else on the calling thread. Every row is computed alike
 * whatever the split. */
enum { STAGE_ATTN_NORM, STAGE_QK, STAGE_FFN_NORM, STAGE_SWIGLU, STAGE_SWIGLU_STACKED };
#define ROWS_ON_POOL 16

typedef struct {
    const kvs_model *m;
    const kvs_layer *L;
    kvs_forward_buf *b;
    int stage, n;
} rows_job;

static void rows_stage(const rows_job *j, int i0, int i1)
{
    const kvs_hparams *hp = &j->m->hp;
    const kvs_layer *L = j->L;
    kvs_forward_buf *b = j->b;
    const int dim = hp->dim, q_dim = hp->n_heads * hp->head_dim,
              kv_dim = hp->n_kv_heads * hp->head_dim;
    const size_t pairs = (size_t)hp->rot_dim / 2;
    for (int i = i0; i < i1; i++)
        switch (j->stage) {
        case STAGE_ATTN_NORM:
        case STAGE_FFN_NORM:
            kvs_rmsnorm(b->xb + (size_t)i * dim, b->x + (size_t)i * dim,
                        j->stage == STAGE_ATTN_NORM ? L->attn_norm : L->ffn_norm, dim, hp->eps);
            break;
        case STAGE_QK: { /* per-head norms, RoPE */
            float *q = b->q + (size_t)i * q_dim, *k = b->k + (size_t)i * kv_dim;
            if (L->q_norm) {
                head_norm(q, L->q_norm, hp->n_heads, hp->head_dim, hp->eps);
                head_norm(k, L->k_norm, hp->n_kv_heads, hp->head_dim, hp->eps);
            }
            const float *cs = b->rope_cs + (size_t)i * pairs, *sn = b->rope_sn + (size_t)i * pairs;
            kvs_rope_apply(q, hp->n_heads, hp->head_dim, hp->rot_dim, cs, sn, hp->rope_neox);
            kvs_rope_apply(k, hp->n_kv_heads, hp->head_dim, hp->rot_dim, cs, sn, hp->rope_neox);
            break;
        }
        case STAGE_SWIGLU:
            kvs_swiglu(b->hb + (size_t)i * hp->hidden, b->hb2 + (size_t)i * hp->hidden, hp->hidden);
            break;
        default: { /* rows [gate | up] of hb, in place (swiglu_compact moves them down after) */
            float *row = b->hb + (size_t)i * 2 * hp->hidden;
            kvs_swiglu(row, row + hp->hidden, hp->hidden);
            break;
        }
        }
}

static void rows_task(void *p, int ith, int nth)
{
    const rows_job *j = p;
    rows_stage(j, (int)((int64_t)j->n * ith / nth), (int)((int64_t)j->n * (ith + 1) / nth));
}

static void run_rows(kvs_pool *pool, const kvs_model *m, const kvs_layer *L, kvs_forward_buf *b,
                     int stage, int n)
{
    rows_job j = {m, L, b, stage, n};
    if (pool && n >= ROWS_ON_POOL)
        kvs_pool_run(pool, rows_task, &j);
    else
        rows_stage(&j, 0, n);
}

kvs_status kvs_forward(const struct kvs_model *m, kvs_pool *pool, kvs_kv *kv,
                       kvs_forward_buf *b, const int32_t *tokens, int n, int pos0, float *logits,
                       int all_logits, kvs_error *err)
{
    const kvs_hparams *hp = &m->hp;
    const int dim = hp->dim, q_dim = hp->n_heads * hp->head_dim,
              kv_dim = hp->n_kv_heads * hp->head_dim, ex = b->exact_matmul;
    const size_t pairs = (size_t)hp->rot_dim / 2; /* RoPE pairs: a row of rope_cs / rope_sn */
    if (n <= 0 || n > b->cap)
        return kvs_fail(err, KVS_ERR_ARG, "batch of %d tokens (capacity %d)", n, b->cap);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->vocab)
            return kvs_fail(err, KVS_ERR_ARG, "token id %d is outside the vocabulary [0, %d)",
                            tokens[i], hp->vocab);
        kvs_weight_row(&m->tok_embd, tokens[i], b->x + (size_t)i * dim);
        b->pos[i] = pos0 + i;
        rope_angles(m, b->pos[i], b->rope_cs + i * pairs, b->rope_sn + i * pairs);
    }

    for (int l = 0; l < hp->n_layers; l++) {
        const kvs_layer *L = &m->layers[l];
        run_rows(pool, m, L, b, STAGE_ATTN_NORM, n);
        /* Q, K, V: projections (plus biases), per-head norms, RoPE; the kv layer gets the
         * post-RoPE keys whatever the architecture. */
        kvs_status st;
        kvs_kv_prefetch_layer(kv, l); /* the append's rows arrive during the product */
        if (L->wqkv.data) { /* one product; a failure is wq's, whose type all three share */
            if ((st = matmul(pool, b->hb, b->xb, &L->wqkv, n, ex, l, "attn_q", err)) != KVS_OK)
                return st;
            unstack_qkv(b, n, q_dim, kv_dim);
        } else if ((st = matmul(pool, b->q, b->xb, &L->wq, n, ex, l, "attn_q", err)) != KVS_OK ||
                   (st = matmul(pool, b->k, b->xb, &L->wk, n, ex, l, "attn_k", err)) != KVS_OK ||
                   (st = matmul(pool, b->v, b->xb, &L->wv, n, ex, l, "attn_v", err)) != KVS_OK) {
            return st;
        }
        if (L->bq) {
            add_bias(b->q, L->bq, n, q_dim);
            add_bias(b->k, L->bk, n, kv_dim);
            add_bias(b->v, L->bv, n, kv_dim);
        }
        run_rows(pool, m, L, b, STAGE_QK, n);
        if ((st = kvs_kv_layer(kv, pool, l, n, b->q, b->k, b->v, b->pos, b->att, err)) != KVS_OK ||
            (st = matmul(pool, b->xb, b->att, &L->wo, n, ex, l, "attn_output", err)) != KVS_OK)
            return st;
        add_rows(b->x, b->xb, (size_t)n * dim);

        run_rows(pool, m, L, b, STAGE_FFN_NORM, n);
        if (L->w_gate_up.data) {
            st = matmul(pool, b->hb, b->xb, &L->w_gate_up, n, ex, l, "ffn_gate", err);
            if (st != KVS_OK)
                return st;
            run_rows(pool, m, L, b, STAGE_SWIGLU_STACKED, n);
            swiglu_compact(b->hb, n, hp->hidden);
        } else {
            st = matmul(pool, b->hb, b->xb, &L->w_gate, n, ex, l, "ffn_gate", err);
            if (st == KVS_OK)
                st = matmul(pool, b->hb2, b->xb, &L->w_up, n, ex, l, "ffn_up", err);
            if (st != KVS_OK)
                return st;
            run_rows(pool, m, L, b, STAGE_SWIGLU, n);
        }
        if ((st = matmul(pool, b->xb, b->hb, &L->w_down, n, ex, l, "ffn_down", err)) != KVS_OK)
            return st;
        add_rows(b->x, b->xb, (size_t)n * dim);
    }

    kvs_kv_end_batch(kv, n);
    if (!logits)
        return KVS_OK;
    int first = all_logits ? 0 : n - 1;
    for (int i = first; i < n; i++)
        kvs_rmsnorm(b->x + (size_t)i * dim, b->x + (size_t)i * dim, m->output_norm, dim, hp->eps);
    kvs_status st = matmul(pool, logits, b->x + (size_t)first * dim, &m->output, n - first, ex, -1,
                           "output", err);
    if (st != KVS_OK)
        return st;
    return check_logits(logits, n - first, hp->vocab, pos0 + first, err);
}
