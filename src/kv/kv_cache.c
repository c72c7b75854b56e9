#include "kv/kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"

typedef struct kv_head {
    float *keys;   /* cap x head_dim */
    float *values; /* cap x head_dim */
    int32_t *pos;  /* cap */
    int count;
    int cap;
} kv_head;

struct kvs_kv {
    kvs_kv_config cfg;
    kv_head *heads;  /* n_layers x n_kv_heads */
    float *scores;   /* per-thread attention rows: n_scores_threads x scores_cap */
    int scores_cap;
    int scores_threads;
};

static kv_head *head_at(const kvs_kv *kv, int layer, int head)
{
    return &kv->heads[(size_t)layer * kv->cfg.n_kv_heads + head];
}

kvs_kv *kvs_kv_new(const kvs_kv_config *cfg)
{
    if (cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 || cfg->head_dim <= 0 || cfg->max_slots <= 0)
        return NULL;
    kvs_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return NULL;
    kv->cfg = *cfg;
    kv->heads = calloc((size_t)cfg->n_layers * cfg->n_kv_heads, sizeof *kv->heads);
    if (!kv->heads) {
        free(kv);
        return NULL;
    }
    return kv;
}

void kvs_kv_free(kvs_kv *kv)
{
    if (!kv)
        return;
    size_t n = (size_t)kv->cfg.n_layers * kv->cfg.n_kv_heads;
    for (size_t i = 0; i < n; i++) {
        free(kv->heads[i].keys);
        free(kv->heads[i].values);
        free(kv->heads[i].pos);
    }
    free(kv->heads);
    free(kv->scores);
    free(kv);
}

void kvs_kv_clear(kvs_kv *kv)
{
    size_t n = (size_t)kv->cfg.n_layers * kv->cfg.n_kv_heads;
    for (size_t i = 0; i < n; i++)
        kv->heads[i].count = 0;
}

int kvs_kv_count(const kvs_kv *kv, int layer, int head) { return head_at(kv, layer, head)->count; }

/* Grows a head geometrically so appends are amortised O(1); memory follows the live count. */
static int head_reserve(kv_head *h, int need, int head_dim)
{
    if (need <= h->cap)
        return 0;
    int cap = h->cap ? h->cap : 64;
    while (cap < need)
        cap = cap > (1 << 29) ? need : cap * 2;
    float *k = realloc(h->keys, sizeof(float) * (size_t)cap * head_dim);
    if (!k)
        return -1;
    h->keys = k;
    float *v = realloc(h->values, sizeof(float) * (size_t)cap * head_dim);
    if (!v)
        return -1;
    h->values = v;
    int32_t *p = realloc(h->pos, sizeof(int32_t) * (size_t)cap);
    if (!p)
        return -1;
    h->pos = p;
    h->cap = cap;
    return 0;
}

kvs_status kvs_kv_append(kvs_kv *kv, int layer, int n, const float *k, const float *v,
                         const int32_t *pos, kvs_error *err)
{
    const int hd = kv->cfg.head_dim, nkv = kv->cfg.n_kv_heads;
    for (int h = 0; h < nkv; h++) {
        kv_head *H = head_at(kv, layer, h);
        if (H->count + n > kv->cfg.max_slots)
            return kvs_fail(err, KVS_ERR_ARG, "KV cache full: %d + %d tokens exceed the context "
                            "of %d", H->count, n, kv->cfg.max_slots);
        if (head_reserve(H, H->count + n, hd) != 0)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory growing the KV cache to %d slots",
                            H->count + n);
        for (int i = 0; i < n; i++) {
            int s = H->count + i;
            memcpy(H->keys + (size_t)s * hd, k + ((size_t)i * nkv + h) * hd, sizeof(float) * hd);
            memcpy(H->values + (size_t)s * hd, v + ((size_t)i * nkv + h) * hd,
                   sizeof(float) * hd);
            H->pos[s] = pos[i];
        }
        H->count += n;
    }
    return KVS_OK;
}

typedef struct attend_task {
    kvs_kv *kv;
    int layer, n, n_heads;
    const float *q;
    const int32_t *qpos;
    float *out;
} attend_task;

static void attend_one(const kv_head *H, int hd, const float *q, int32_t qpos, float *scores,
                       float *out)
{
    /* Slots are sorted by position, so the visible ones are a prefix. */
    int n = H->count;
    while (n > 0 && H->pos[n - 1] > qpos)
        n--;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int s = 0; s < n; s++)
        scores[s] = kvs_dot_f32(q, H->keys + (size_t)s * hd, hd) * scale;
    memset(out, 0, sizeof(float) * hd);
    if (n == 0)
        return;
    kvs_softmax(scores, n);
    for (int s = 0; s < n; s++)
        kvs_axpy_f32(out, scores[s], H->values + (size_t)s * hd, hd);
}

static void attend_worker(void *ctx, int ith, int nth)
{
    attend_task *t = ctx;
    kvs_kv *kv = t->kv;
    const int hd = kv->cfg.head_dim, group = t->n_heads / kv->cfg.n_kv_heads;
    float *scores = kv->scores + (size_t)ith * kv->scores_cap;
    int n_tasks = t->n * t->n_heads;
    /* Interleaved assignment balances the causal rows, whose lengths grow with i. */
    for (int task = ith; task < n_tasks; task += nth) {
        int i = task / t->n_heads, h = task % t->n_heads;
        size_t off = ((size_t)i * t->n_heads + h) * hd;
        attend_one(head_at(kv, t->layer, h / group), hd, t->q + off, t->qpos[i], scores,
                   t->out + off);
    }
}

kvs_status kvs_kv_attend(kvs_kv *kv, kvs_pool *pool, int layer, int n, int n_heads,
                         const float *q, const int32_t *qpos, float *out, kvs_error *err)
{
    int nth = kvs_pool_size(pool), need = 1;
    for (int h = 0; h < kv->cfg.n_kv_heads; h++)
        if (head_at(kv, layer, h)->count > need)
            need = head_at(kv, layer, h)->count;
    if (need > kv->scores_cap || nth > kv->scores_threads) {
        int cap = need > kv->scores_cap ? need + need / 2 : kv->scores_cap;
        float *s = malloc(sizeof(float) * (size_t)cap * nth);
        if (!s)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for attention scores");
        free(kv->scores);
        kv->scores = s;
        kv->scores_cap = cap;
        kv->scores_threads = nth;
    }
    attend_task t = {kv, layer, n, n_heads, q, qpos, out};
    kvs_pool_run(pool, attend_worker, &t);
    return KVS_OK;
}

size_t kvs_kv_bytes(const kvs_kv *kv)
{
    size_t n = (size_t)kv->cfg.n_layers * kv->cfg.n_kv_heads, slots = 0;
    for (size_t i = 0; i < n; i++)
        slots += (size_t)kv->heads[i].count;
    return slots * (2 * sizeof(float) * (size_t)kv->cfg.head_dim + sizeof(int32_t));
}

size_t kvs_kv_bytes_full_f16(const kvs_kv *kv, int64_t n_tokens)
{
    return (size_t)n_tokens * (size_t)kv->cfg.n_layers * kv->cfg.n_kv_heads * kv->cfg.head_dim *
           2 * 2;
}
