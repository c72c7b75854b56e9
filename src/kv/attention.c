#include "kv/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/kernels_kivi.h"

/* Per-thread buffers: a score row, f32 copies of F16 rows, and a partial column-sum block. */
struct kvs_attn_scratch {
    float *buf;
    size_t per_thread; /* floats */
    int n_threads;
    float *gemm;       /* prefill path: grouped queries, scores, transposed values, outputs */
    size_t gemm_cap;   /* floats */
};

kvs_attn_scratch *kvs_attn_scratch_new(void) { return calloc(1, sizeof(kvs_attn_scratch)); }

void kvs_attn_scratch_free(kvs_attn_scratch *sc)
{
    if (!sc)
        return;
    free(sc->buf);
    free(sc->gemm);
    free(sc);
}

typedef struct task {
    const kvs_attn_args *a;
    kvs_attn_scratch *sc;
    int hd, group, max_count;
} task;

/* The scores of key group g of a KIVI head (v) against q, into out (one per token of the
 * group); returns the group's size. Per group qs = q * scale and sum q * min are computed once,
 * then the kernel sums qs over the channel-major codes of all the group's tokens at once. */
static int kivi_group_scores(const kvs_kivi_view *v, int g, const float *q, int hd, int bits,
                             float *qs, float *out)
{
    const int first = v->g_first[g], n = (g + 1 < v->ng ? v->g_first[g + 1] : v->nqk) - first;
    const float bias = kvs_kivi_key_prep(q, v->g_sm + (size_t)2 * hd * g, hd, qs);
    kvs_kivi_key_scores(v->kcodes + (size_t)first * v->kcode_bytes, n, hd, bits, qs, bias, out);
    return n;
}

static void scores_row_kivi(const kvs_store *s, int layer, int kvh, const float *q,
                            const int *sel, int n, float scale, float *scores)
{
    const int hd = kvs_store_cfg(s)->head_dim;
    const kvs_kivi_cfg *k = kvs_store_kivi(s);
    kvs_kivi_view v;
    kvs_store_kivi_view(s, layer, kvh, &v);
    float qsc[hd], qs[hd], tmp[k->group];
    for (int d = 0; d < hd; d++) /* the 1/sqrt(d) scale folded into the query */
        qsc[d] = q[d] * scale;
    if (!sel) {
        const int nq = n < v.nqk ? n : v.nqk;
        for (int g = 0; g < v.ng && v.g_first[g] < nq; g++) {
            const int first = v.g_first[g];
            const int gn = kivi_group_scores(&v, g, qsc, hd, k->k_bits, qs, tmp);
            memcpy(scores + first, tmp, sizeof(float) * (size_t)(first + gn <= nq ? gn : nq - first));
        }
        for (int j = nq; j < n; j++)
            scores[j] = kvs_dot_f16_f32(v.kres + (size_t)(j - v.nqk) * hd, q, hd) * scale;
        return;
    }
    int g = -1, first = 0, end = 0; /* the group whose scores tmp holds */
    for (int j = 0; j < n; j++) {
        const int slot = sel[j];
        if (slot >= v.nqk) {
            scores[j] = kvs_dot_f16_f32(v.kres + (size_t)(slot - v.nqk) * hd, q, hd) * scale;
            continue;
        }
        if (g < 0 || slot < first || slot >= end) {
            int lo = 0, hi = v.ng; /* the last group starting at or before slot */
            while (hi - lo > 1) {
                const int mid = (lo + hi) / 2;
                if (v.g_first[mid] <= slot)
                    lo = mid;
                else
                    hi = mid;
            }
            g = lo;
            first = v.g_first[g];
            end = first + kivi_group_scores(&v, g, qsc, hd, k->k_bits, qs, tmp);
        }
        scores[j] = tmp[slot - first];
    }
}

/* KIVI values: each quantised row adds (p * scale) * codes, its p * min summed per channel
 * group and added once at the end (kvs_kivi_value_acc). */
static void weighted_values_kivi(const kvs_store *s, int layer, int kvh, const float *p,
                                 const int *sel, int n, float *out)
{
    const int hd = kvs_store_cfg(s)->head_dim;
    const kvs_kivi_cfg *k = kvs_store_kivi(s);
    kvs_kivi_view v;
    kvs_store_kivi_view(s, layer, kvh, &v);
    float msum[hd];
    memset(msum, 0, sizeof msum);
    if (!sel) { /* the quantised rows are the prefix [0, nqv): one pass over them */
        const int nq = n < v.nqv ? n : v.nqv;
        kvs_kivi_value_rows(out, msum, v.vcodes, v.vrow_bytes, p, nq, hd, k->v_bits, k->group);
        for (int j = nq; j < n; j++)
            kvs_axpy_f16(out, p[j], v.vres + (size_t)(j - v.nqv) * hd, hd);
        kvs_kivi_value_finish(out, msum, hd, k->group);
        return;
    }
    for (int j = 0; j < n; j++) {
        const int slot = sel[j];
        if (slot < v.nqv)
            kvs_kivi_value_acc(out, msum, v.vcodes + (size_t)slot * v.vrow_bytes, p[j], hd,
                               k->v_bits, k->group);
        else
            kvs_axpy_f16(out, p[j], v.vres + (size_t)(slot - v.nqv) * hd, hd);
    }
    kvs_kivi_value_finish(out, msum, hd, k->group);
}

/* Dot products with keys stored as F32, F16 or KIVI codes. */
static void scores_row(const kvs_store *s, int layer, int kvh, const float *q, const int *sel,
                       int n, float scale, float *scores)
{
    const int hd = kvs_store_cfg(s)->head_dim;
    if (kvs_store_kivi(s)) {
        scores_row_kivi(s, layer, kvh, q, sel, n, scale, scores);
    } else if (kvs_store_cfg(s)->type == KVS_F16) {
        kvs_dot_rows_f16(scores, kvs_store_keys(s, layer, kvh), sel, n, hd, q, scale);
    } else {
        const float *keys = kvs_store_keys(s, layer, kvh);
        for (int j = 0; j < n; j++)
            scores[j] = kvs_dot_f32(q, keys + (size_t)(sel ? sel[j] : j) * hd, hd) * scale;
    }
}

static void weighted_values(const kvs_store *s, int layer, int kvh, const float *p,
                            const int *sel, int n, float *out)
{
    const int hd = kvs_store_cfg(s)->head_dim;
    if (!kvs_store_kivi(s) && kvs_store_cfg(s)->type == KVS_F16) {
        kvs_weighted_rows_f16(out, p, kvs_store_values(s, layer, kvh), sel, n, hd); /* sets out */
        return;
    }
    memset(out, 0, sizeof(float) * hd);
    if (kvs_store_kivi(s)) {
        weighted_values_kivi(s, layer, kvh, p, sel, n, out);
    } else {
        const float *values = kvs_store_values(s, layer, kvh);
        for (int j = 0; j < n; j++)
            kvs_axpy_f32(out, p[j], values + (size_t)(sel ? sel[j] : j) * hd, hd);
    }
}

/* A factor of a scale row (attention.h: kscale, vscale). */
static float scale_at(const void *row, kvs_dtype type, int j)
{
    return type == KVS_F16 ? kvs_fp16_to_fp32(((const uint16_t *)row)[j]) : ((const float *)row)[j];
}

static float dot_row(const void *row, kvs_dtype type, const float *q, int hd)
{
    return type == KVS_F16 ? kvs_dot_f16_f32(row, q, hd) : kvs_dot_f32(q, row, hd);
}

static void axpy_row(float *out, float w, const void *row, kvs_dtype type, int hd)
{
    if (type == KVS_F16)
        kvs_axpy_f16(out, w, row, hd);
    else
        kvs_axpy_f32(out, w, row, hd);
}

/* The restored view of one query row and head (attention.h: kscale, vscale, exact rows, tail)
 * over the n visible stored slots: scales on the score and probability rows around the store's
 * own kernels. The exact rows and the tail are summed in slot order into acc, after the stored
 * slots (whose weights there are 0), so that a view of nothing but exact rows adds in the same
 * order as the plain path. */
static void attend_restored(const kvs_attn_args *a, int kvh, const float *q, int n, int hd,
                            float *scores, float *out)
{
    const kvs_store *s = a->store;
    const float inv = 1.0f / sqrtf((float)hd);
    const int nk = a->xk_n ? a->xk_n[kvh] : 0, nv = a->xv_n ? a->xv_n[kvh] : 0;
    const int nt = n + (a->tail_k != NULL);
    const int32_t *ks = nk ? a->xk_slot[kvh] : NULL, *vs = nv ? a->xv_slot[kvh] : NULL;
    const size_t esz = a->x_type == KVS_F16 ? 2 : 4, hoff = (size_t)kvh * hd;
    if (nt == 0) {
        memset(out, 0, sizeof(float) * hd);
        return;
    }
    scores_row(s, a->layer, kvh, q, NULL, n, inv, scores);
    if (a->kscale)
        for (int j = 0; j < n; j++)
            scores[j] *= scale_at(a->kscale[kvh], a->scale_type, j);
    for (int j = 0; j < nk && ks[j] < n; j++)
        scores[ks[j]] = dot_row((const char *)a->xk[kvh] + j * a->x_stride * esz, a->x_type, q,
                                hd) * inv;
    if (a->tail_k)
        scores[n] = kvs_dot_f32(q, a->tail_k + hoff, hd) * inv;
    kvs_softmax(scores, nt);
    float acc[hd];
    memset(acc, 0, sizeof acc);
    for (int j = 0, x = 0; j < n; j++) {
        if (x < nv && vs[x] == j) {
            axpy_row(acc, scores[j], (const char *)a->xv[kvh] + x * a->x_stride * esz, a->x_type,
                     hd);
            scores[j] = 0.0f;
            x++;
        } else if (a->vscale) {
            scores[j] *= scale_at(a->vscale[kvh], a->scale_type, j);
        }
    }
    if (a->tail_k)
        kvs_axpy_f32(acc, scores[n], a->tail_v + hoff, hd);
    weighted_values(s, a->layer, kvh, scores, NULL, n, out);
    for (int d = 0; d < hd; d++)
        out[d] += acc[d];
}

/* A restored view (attention.h) is asked for. */
static int restored(const kvs_attn_args *a)
{
    return a->kscale || a->vscale || a->xk_n || a->xv_n || a->tail_k;
}

/* Attention of query row i, head h. */
static void attend_row(const task *t, int i, int h, float *scores)
{
    const kvs_attn_args *a = t->a;
    const kvs_store *s = a->store;
    const int hd = t->hd, kvh = h / t->group;
    const size_t off = ((size_t)i * a->n_heads + h) * hd;
    const int *sel = a->sel ? a->sel[kvh] : NULL;
    int n;
    if (sel) {
        n = a->n_sel[kvh];
    } else {
        /* The slots after the query's position are a suffix (kv_store.h), in an unordered
         * head too: the visible ones are a prefix. */
        const int32_t *pos = kvs_store_pos(s, a->layer, kvh);
        n = kvs_store_count(s, a->layer, kvh);
        while (n > 0 && pos[n - 1] > a->qpos[i])
            n--;
    }
    if (restored(a)) {
        attend_restored(a, kvh, a->q + off, n, hd, scores, a->out + off);
        return;
    }
    if (n == 0) {
        memset(a->out + off, 0, sizeof(float) * hd);
        return;
    }
    scores_row(s, a->layer, kvh, a->q + off, sel, n, 1.0f / sqrtf((float)hd), scores);
    kvs_softmax(scores, n);
    weighted_values(s, a->layer, kvh, scores, sel, n, a->out + off);
    if (a->probs)
        memcpy(a->probs + (size_t)h * a->probs_stride, scores, sizeof(float) * n);
    if (a->colsum && a->row_mask[i])
        kvs_axpy_f32(a->colsum + (size_t)h * a->colsum_stride, 1.0f, scores, n);
}

static void worker(void *ctx, int ith, int nth)
{
    task *t = ctx;
    const kvs_attn_args *a = t->a;
    float *scores = t->sc->buf + (size_t)ith * t->sc->per_thread;
    if (a->colsum) {
        /* Each thread owns whole heads and adds their rows in order, so the column sums do
         * not depend on the thread count. */
        for (int h = ith; h < a->n_heads; h += nth)
            for (int i = 0; i < a->n; i++)
                attend_row(t, i, h, scores);
    } else {
        /* Interleaved rows balance the causal lengths, which grow with i. */
        for (int k = ith; k < a->n * a->n_heads; k += nth)
            attend_row(t, k / a->n_heads, k % a->n_heads, scores);
    }
}

/* Prefill path: per KV head, the group's query rows times the keys (S = Q K^T) and the
 * probabilities times the values (O = P V) as matrix products on the pool, with the causal
 * softmax in between. */
typedef struct gemm_softmax {
    const kvs_attn_args *a;
    float *S;           /* rows x count: query i0 + r / group, head head0 + r % group */
    const int *visible; /* per query row i: slots it sees */
    int rows, group, i0, count, head0;
} gemm_softmax;

static void gemm_softmax_worker(void *ctx, int ith, int nth)
{
    gemm_softmax *g = ctx;
    for (int r = ith; r < g->rows; r += nth) {
        int L = g->visible[g->i0 + r / g->group];
        float *row = g->S + (size_t)r * g->count;
        if (L > 0)
            kvs_softmax(row, L);
        memset(row + L, 0, sizeof(float) * (size_t)(g->count - L));
    }
}

/* Column sums of the requested probability rows: threads split the columns and add the rows
 * in order, so the sums do not depend on the thread count. */
static void gemm_colsum_worker(void *ctx, int ith, int nth)
{
    gemm_softmax *g = ctx;
    const kvs_attn_args *a = g->a;
    int j0 = (int)((int64_t)g->count * ith / nth), j1 = (int)((int64_t)g->count * (ith + 1) / nth);
    for (int r = 0; r < g->rows; r++) {
        if (!a->row_mask[g->i0 + r / g->group] || j0 >= j1)
            continue;
        float *dst = a->colsum + (size_t)(g->head0 + r % g->group) * a->colsum_stride;
        kvs_axpy_f32(dst + j0, 1.0f, g->S + (size_t)r * g->count + j0, j1 - j0);
    }
}

static kvs_status reserve_gemm(kvs_attn_scratch *sc, size_t floats, kvs_error *err)
{
    if (floats <= sc->gemm_cap)
        return KVS_OK;
    free(sc->gemm);
    sc->gemm_cap = 0;
    if (!(sc->gemm = malloc(sizeof(float) * floats)))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for attention (%zu MiB)",
                        floats * sizeof(float) >> 20);
    sc->gemm_cap = floats;
    return KVS_OK;
}

/* The KV store's types (F32, F16) always have a kernel, so only memory can fail here. */
static kvs_status matmul_failed(kvs_status st, const char *what, int layer, kvs_error *err)
{
    return st == KVS_ERR_NOMEM
               ? kvs_fail(err, st, "out of memory for the %s of layer %d", what, layer)
               : kvs_fail(err, st, "the %s of layer %d cannot be computed (%s)", what, layer,
                          kvs_status_name(st));
}

/* A KIVI layer with nothing quantised: its residual rows are plain F16 rows. */
static int kivi_all_f16(const kvs_store *s, int layer)
{
    for (int h = 0; h < kvs_store_cfg(s)->n_kv_heads; h++) {
        kvs_kivi_view v;
        kvs_store_kivi_view(s, layer, h, &v);
        if (v.nqk || v.nqv)
            return 0;
    }
    return 1;
}

/* The values of a head transposed to VT (hd rows of count slots), for the second product. */
typedef struct {
    const kvs_store *s;
    int layer, kvh, kivi, hd, count;
    float *VT;
} vt_job;

static void vt_slots(const vt_job *v, int j0, int j1)
{
    const kvs_store_config *cfg = kvs_store_cfg(v->s);
    const char *values = kvs_store_values(v->s, v->layer, v->kvh);
    const int hd = v->hd;
    float rows[16 * hd]; /* 16 slots' values, then turned into VT's columns together */
    for (int j = j0; j < j1; j += 16) {
        const int m = j1 - j < 16 ? j1 - j : 16;
        if (!v->kivi && cfg->type == KVS_F32) {
            kvs_transpose_f32(v->VT + j, (size_t)v->count, (const float *)values + (size_t)j * hd, m, hd);
            continue;
        }
        for (int t = 0; t < m; t++) {
            if (v->kivi)
                kvs_store_value_f32(v->s, v->layer, v->kvh, j + t, rows + (size_t)t * hd);
            else
                kvs_dequantize_row(KVS_F16, values + (size_t)(j + t) * hd * 2, rows + (size_t)t * hd, hd);
        }
        kvs_transpose_f32(v->VT + j, (size_t)v->count, rows, m, hd);
    }
}

/* Slots split among the threads in multiples of 16, so that two rarely write one cache line. */
static void vt_task(void *p, int ith, int nth)
{
    const vt_job *v = p;
    const int units = (v->count + 15) / 16;
    const int j0 = (int)((int64_t)units * ith / nth) * 16;
    const int j1 = (int)((int64_t)units * (ith + 1) / nth) * 16;
    vt_slots(v, j0, j1 < v->count ? j1 : v->count);
}

/* Fewer slots are transposed on the calling thread (a pool run costs more than they do). */
#define KVS_VT_ON_POOL 256

/* Queries per chunk of the prefill products: a chunk multiplies only the slots its last query
 * sees when that is at most 3/4 of them, so a prompt's causal half is mostly skipped (pp512
 * from an empty cache: 1280 of 2048 query-by-slot blocks of 128 computed); a batch behind a
 * long prefix multiplies all. */
#define KVS_ATTN_CHUNK 128

static kvs_status attend_gemm(kvs_pool *pool, kvs_attn_scratch *sc, const kvs_attn_args *a,
                              const task *t, kvs_error *err)
{
    const kvs_store *s = a->store;
    const kvs_store_config *cfg = kvs_store_cfg(s);
    const int hd = t->hd, group = t->group, n = a->n, rows = group * n;
    /* KIVI with something quantised: the products run on dequantised copies */
    const int kivi = kvs_store_kivi(s) && !kivi_all_f16(s, a->layer);
    for (int kvh = 0; kvh < cfg->n_kv_heads; kvh++) {
        const int count = kvs_store_count(s, a->layer, kvh);
        const int32_t *pos = kvs_store_pos(s, a->layer, kvh);
        const int chunk_rows = group * (n < KVS_ATTN_CHUNK ? n : KVS_ATTN_CHUNK);
        /* Q, O: rows x hd; S: chunk_rows x count; VT, VTc: hd x count each; visible: n */
        size_t need = (size_t)rows * hd * 2 + (size_t)chunk_rows * count +
                      (size_t)hd * count * 2 + n;
        if (kvs_store_kivi(s)) /* room for a dequantised copy of the keys */
            need += (size_t)hd * count;
        kvs_status st = reserve_gemm(sc, need, err);
        if (st != KVS_OK)
            return st;
        float *Q = sc->gemm, *O = Q + (size_t)rows * hd, *S = O + (size_t)rows * hd,
              *VT = S + (size_t)chunk_rows * count, *VTc = VT + (size_t)hd * count;
        int *visible = (int *)(VTc + (size_t)hd * count);
        /* query-major rows (query i, head g at i * group + g), so that a chunk of queries is a
         * block of rows; scaled by 1 / sqrt(hd) here rather than the scores (the softmax
         * worker outside kvs_softmax was 5.3% and 9.7% of two pp8192 profiles at two threads,
         * 89% of that a scalar loop scaling the scores) */
        const float scale = 1.0f / sqrtf((float)hd);
        for (int i = 0; i < n; i++) {
            const float *qi = a->q + ((size_t)i * a->n_heads + kvh * group) * hd;
            float *Qi = Q + (size_t)i * group * hd;
            for (int e = 0; e < hd * group; e++)
                Qi[e] = qi[e] * scale;
        }
        for (int i = 0; i < n; i++) {
            int lo = 0, hi = count; /* first slot after qpos[i]: they are a suffix */
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (pos[mid] <= a->qpos[i])
                    lo = mid + 1;
                else
                    hi = mid;
            }
            visible[i] = lo;
        }
        vt_job vj = {s, a->layer, kvh, kivi, hd, count, VT};
        if (pool && count >= KVS_VT_ON_POOL)
            kvs_pool_run(pool, vt_task, &vj);
        else
            vt_slots(&vj, 0, count);
        const void *keys = kvs_store_keys(s, a->layer, kvh);
        kvs_dtype ktype = cfg->type;
        if (kivi) { /* a prompt batch over quantised keys: one dequantised copy per batch */
            float *K = (float *)(visible + n);
            kvs_store_keys_f32(s, a->layer, kvh, K);
            keys = K;
            ktype = KVS_F32;
        }
        for (int i0 = 0; i0 < n; i0 += KVS_ATTN_CHUNK) {
            const int i1 = n - i0 < KVS_ATTN_CHUNK ? n : i0 + KVS_ATTN_CHUNK;
            const int cr = group * (i1 - i0);
            int cols = 0; /* the slots the chunk's queries see */
            for (int i = i0; i < i1; i++)
                cols = visible[i] > cols ? visible[i] : cols;
            /* all of them when that skips little: the second product then reads VT in place,
             * where fewer slots need a copy (of hd x cols floats, on this thread) */
            if (cols > count - count / 4)
                cols = count;
            if (cols == 0) { /* nothing visible (no slot at or before these positions) */
                memset(O + (size_t)i0 * group * hd, 0, sizeof(float) * (size_t)cr * hd);
                continue;
            }
            st = kvs_matmul(pool, S, Q + (size_t)i0 * group * hd, keys, ktype, cr, hd, cols);
            if (st != KVS_OK)
                return matmul_failed(st, "attention scores", a->layer, err);
            gemm_softmax gs = {a, S, visible, cr, group, i0, cols, kvh * group};
            kvs_pool_run(pool, gemm_softmax_worker, &gs);
            if (a->colsum)
                kvs_pool_run(pool, gemm_colsum_worker, &gs);
            const float *vt = VT;
            if (cols < count) { /* the values' first cols slots, as rows of cols */
                for (int d = 0; d < hd; d++)
                    memcpy(VTc + (size_t)d * cols, VT + (size_t)d * count, sizeof(float) * cols);
                vt = VTc;
            }
            st = kvs_matmul(pool, O + (size_t)i0 * group * hd, S, vt, KVS_F32, cr, cols, hd);
            if (st != KVS_OK)
                return matmul_failed(st, "attention outputs", a->layer, err);
        }
        for (int i = 0; i < n; i++)
            memcpy(a->out + ((size_t)i * a->n_heads + kvh * group) * hd, O + (size_t)i * group * hd,
                   sizeof(float) * hd * group);
    }
    return KVS_OK;
}

/* Below this many query rows the per-row dot-product path is cheaper than the products. */
#define KVS_ATTN_GEMM_MIN_ROWS 16

kvs_status kvs_attention(kvs_pool *pool, kvs_attn_scratch *sc, const kvs_attn_args *a,
                         kvs_error *err)
{
    const kvs_store_config *cfg = kvs_store_cfg(a->store);
    task t = {.a = a, .sc = sc, .hd = cfg->head_dim, .group = a->n_heads / cfg->n_kv_heads};
    t.max_count = 1;
    for (int h = 0; h < cfg->n_kv_heads; h++) {
        int c = kvs_store_count(a->store, a->layer, h);
        if (c > t.max_count)
            t.max_count = c;
    }
    if (restored(a) && (a->n != 1 || a->sel || a->probs || a->colsum))
        return kvs_fail(err, KVS_ERR_ARG, "attention: a restored view takes one query row, "
                        "without a selection, probabilities or column sums");
    size_t per_thread = (size_t)t.max_count + 1; /* + the restored view's tail slot */
    per_thread = (per_thread + 15) & ~(size_t)15;
    int nth = kvs_pool_size(pool);
    if (per_thread > sc->per_thread || nth > sc->n_threads) {
        size_t want = per_thread > sc->per_thread ? per_thread + per_thread / 2 : sc->per_thread;
        float *buf = malloc(sizeof(float) * want * (size_t)nth);
        if (!buf)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for attention scratch");
        free(sc->buf);
        sc->buf = buf;
        sc->per_thread = want;
        sc->n_threads = nth;
    }
    /* Decode takes the per-row path, whose KIVI kernels read the codes directly; a prompt
     * batch over a KIVI store takes the matrix products on a dequantised copy of the head's
     * keys and values (made once per batch of many rows), or on its F16 rows while nothing of
     * the layer is quantised yet (a first prompt batch, flushed after its attention). */
    if (a->n >= KVS_ATTN_GEMM_MIN_ROWS && !a->sel && !a->probs) {
        kvs_status st = attend_gemm(pool, sc, a, &t, err);
        if (st != KVS_OK)
            return st;
    } else {
        kvs_pool_run(pool, worker, &t);
    }
    return KVS_OK;
}
