/* quest: query-aware page selection. Every slot is kept; each decode step attends only the
 * pages most likely to matter to the current query.
 *
 * Per (layer, KV head) the slots are cut into pages of `page` consecutive slots (nothing is
 * evicted, so slot j is in page j / page; the newest page may be partial), each summarised by
 * the per-channel minimum and maximum of its post-RoPE keys, updated as tokens are appended.
 * select scores each page with the upper bound of q.k over the page,
 * sum_i max(q_i * min_i, q_i * max_i), summed over the query heads of the KV head, and attends
 * the top ceil(budget / page) pages (at least one), always including the newest page (ties:
 * the newer page), returning their slots in increasing order. The first dense_layers layers
 * attend every slot and keep no bounds. The bounds are counted as KV bytes: pages x 2 x
 * head_dim x 4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policies.h"

static const kvs_param_def params[] = {
    {"page", 16, 1, 1 << 16, 1, "slots per page"},
    {"dense_layers", 2, 0, 1 << 16, 1, "first layers that attend every slot"},
};

typedef struct quest_head {
    float *bounds; /* per page: head_dim minima then head_dim maxima */
    int cap;       /* pages allocated */
    int done;      /* slots summarised */
} quest_head;

typedef struct ranked {
    float score;
    int page;
} ranked;

typedef struct quest_state {
    quest_head *heads; /* n_layers x n_kv_heads */
    int page, dense;
    ranked *rank;      /* scratch for select */
    uint8_t *chosen;
    int rank_cap;
} quest_state;

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    kvs_status st = kvs_policy_check_context(p, err);
    if (st != KVS_OK)
        return st;
    int dense = (int)kvs_policy_param(p, "dense_layers");
    if (dense > p->n_layers)
        return kvs_fail(err, KVS_ERR_ARG,
                        "--kv %s: dense_layers=%d exceeds the model's %d layers", p->spec.user,
                        dense, p->n_layers);
    quest_state *s = calloc(1, sizeof *s);
    if (!s || !(s->heads = calloc((size_t)p->n_layers * p->n_kv_heads, sizeof *s->heads))) {
        free(s);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    }
    s->page = (int)kvs_policy_param(p, "page");
    s->dense = dense;
    p->state = s;
    return KVS_OK;
}

static void stop(kvs_policy *p)
{
    quest_state *s = p->state;
    if (!s)
        return;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        free(s->heads[i].bounds);
    free(s->heads);
    free(s->rank);
    free(s->chosen);
    free(s);
    p->state = NULL;
}

static int pages_of(int slots, int page) { return (int)(((int64_t)slots + page - 1) / page); }

static size_t state_bytes(const kvs_policy *p)
{
    const quest_state *s = p->state;
    if (!s)
        return 0;
    size_t pages = 0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++)
        pages += (size_t)pages_of(s->heads[i].done, s->page);
    return pages * 2 * (size_t)p->head_dim * sizeof(float);
}

/* Brings the page bounds of one head up to the store's slots. Returns 0, or -1 without memory. */
static int sync(kvs_policy *p, int layer, int h)
{
    quest_state *s = p->state;
    quest_head *q = &s->heads[(size_t)layer * p->n_kv_heads + h];
    const int hd = p->head_dim, n = kvs_store_count(p->store, layer, h);
    const int need = pages_of(n, s->page);
    if (need > q->cap) {
        int cap = need + need / 2 + 4;
        float *b = realloc(q->bounds, sizeof(float) * 2 * hd * (size_t)cap);
        if (!b)
            return -1;
        q->bounds = b;
        q->cap = cap;
    }
    float key[hd];
    for (int j = q->done; j < n; j++) {
        float *mn = q->bounds + (size_t)(j / s->page) * 2 * hd, *mx = mn + hd;
        kvs_store_key_f32(p->store, layer, h, j, key);
        if (j % s->page == 0) {
            memcpy(mn, key, sizeof key);
            memcpy(mx, key, sizeof key);
        } else {
            for (int i = 0; i < hd; i++) {
                mn[i] = key[i] < mn[i] ? key[i] : mn[i];
                mx[i] = key[i] > mx[i] ? key[i] : mx[i];
            }
        }
    }
    q->done = n;
    return 0;
}

static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    (void)c;
    if (layer < ((quest_state *)p->state)->dense)
        return KVS_OK; /* dense layers never select: no bounds */
    for (int h = 0; h < p->n_kv_heads; h++)
        if (sync(p, layer, h) != 0)
            return kvs_fail(err, KVS_ERR_NOMEM, "--kv %s: out of memory for page bounds",
                            p->spec.user);
    return KVS_OK;
}

static int by_score_newer_first(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return y->page - x->page;
}

static int select_pages(kvs_policy *p, int layer, int kv_head, const float *q, int *slots)
{
    quest_state *s = p->state;
    if (layer < s->dense || sync(p, layer, kv_head) != 0)
        return -1;
    const int hd = p->head_dim, group = p->n_heads / p->n_kv_heads, P = s->page;
    const int n = kvs_store_count(p->store, layer, kv_head), n_pages = pages_of(n, P);
    int want = pages_of(p->budget, P);
    if (want < 1)
        want = 1;
    if (want >= n_pages)
        return -1;
    if (n_pages > s->rank_cap) {
        int cap = n_pages + n_pages / 2 + 16;
        ranked *r = realloc(s->rank, sizeof *r * (size_t)cap);
        if (r)
            s->rank = r;
        uint8_t *ch = realloc(s->chosen, (size_t)cap);
        if (ch)
            s->chosen = ch;
        if (!r || !ch)
            return -1; /* without scratch memory, attend everything */
        s->rank_cap = cap;
    }
    const quest_head *qh = &s->heads[(size_t)layer * p->n_kv_heads + kv_head];
    const int newest = n_pages - 1;
    for (int pg = 0; pg < newest; pg++) {
        const float *mn = qh->bounds + (size_t)pg * 2 * hd, *mx = mn + hd;
        float sc = 0.0f;
        for (int g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * hd;
            for (int i = 0; i < hd; i++) {
                float a = qg[i] * mn[i], b = qg[i] * mx[i];
                sc += a > b ? a : b;
            }
        }
        s->rank[pg] = (ranked){sc, pg};
    }
    qsort(s->rank, (size_t)newest, sizeof *s->rank, by_score_newer_first);
    memset(s->chosen, 0, (size_t)n_pages);
    s->chosen[newest] = 1;
    for (int i = 0; i < want - 1; i++)
        s->chosen[s->rank[i].page] = 1;
    int k = 0;
    for (int pg = 0; pg < n_pages; pg++)
        if (s->chosen[pg])
            for (int j = pg * P; j < n && j < (pg + 1) * P; j++)
                slots[k++] = j;
    return k;
}

const kvs_policy_type kvs_policy_quest = {
    .name = "quest",
    .summary = "Quest: keep all, attend the pages whose key bounds best match the query",
    .kind = KVS_KIND_SELECTION,
    .params = params,
    .n_params = 2,
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .prefill_chunk = prefill_chunk,
    .select = select_pages,
};
