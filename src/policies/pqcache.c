/* PQCache (pqcache.md): the middle of the context lives in a slow tier; every decode step
 * scores it from product-quantised keys, fetches the top-k tokens' K/V (through a block cache)
 * and attends them exactly with the initial and local tokens, which stay in the store (the
 * fast tier). The prompt is attended densely, streaming the slow tier back in, so a prompt
 * whose full cache does not fit in memory still runs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/random.h"
#include "policies/policies.h"
#include "policies/pqcache_internal.h"

enum { P_INIT, P_LOCAL, P_K, P_M, P_BITS, P_ITERS, P_CACHE, P_KCACHE, P_EVICT, P_GQA, P_SCORES,
       P_MEASURE, P_SEED, P_N };

static const kvs_param_def params[] = {
    {"init", 32, 0, 65536, 1, "initial (sink) tokens, always attended"},
    {"local", -1, -1, 1048576, 1, "local window in tokens; -1: half the budget, or what k "
                                  "leaves of it"},
    {"k", -1, -1, 1048576, 1, "middle tokens selected per step and KV head; -1: half the "
                              "budget, or what local leaves of it"},
    {"m", 2, 1, 256, 1, "PQ sub-spaces per key (must divide the head dimension)"},
    {"bits", 6, 1, 8, 1, "bits per code: 2^bits centroids per sub-space"},
    {"iters", 10, 0, 300, 1, "K-Means iterations (at most); 0: adaptive, as many as fit in "
                             "the layer's prefill time, in [3, 10]"},
    {"cache", 4096, 0, 16777216, 1, "block cache capacity in tokens (blocks of 128 positions, "
                                    "all KV heads; 0: none)"},
    {"kcache", 32, 1, 65536, 1, "blocks inserted into the cache per step (the most selected)"},
    {"evict", 0, 0, 1, 1, "block cache eviction"},
    {"gqa", 0, 0, 2, 1, "how a KV head's query heads choose together: sum of their softmaxes "
                        "over the middle, sum of scores, or max"},
    {"scores", 0, 0, 1, 1, "pq: scores from the codes; exact: exact q.k read from the slow "
                           "tier (the Oracle)"},
    {"measure", 0, 0, 1, 1, "on: also rank exactly, to report the recall of the exact top-k "
                            "per layer (reads the slow tier every step)"},
    {"seed", 0, 0, 9007199254740992.0, 1, "K-Means initialisation seed"},
};
static const char *const evict_words[] = {"lfu", "lru", NULL};
static const char *const gqa_words[] = {"softmax", "sum", "max", NULL};
static const char *const scores_words[] = {"pq", "exact", NULL};
static const char *const measure_words[] = {"off", "on", NULL};
static const kvs_param_words words[] = {
    {"evict", evict_words}, {"gqa", gqa_words}, {"scores", scores_words},
    {"measure", measure_words}};

static int param_i(const kvs_policy *p, int i) { return (int)p->spec.values[i]; }

/* ---- budget (§2.6) ---- */

/* Local window and top-k of a prompt of P tokens with n_init initial ones: budget=F gives
 * floor((P - n_init) F / 2) each (the reference code's split); slots=N makes N the slots
 * attended per step, n_init + local + k + the current token, split the same way. local= or
 * k= alone takes its share and leaves the rest of the budget to the other; both set both. */
static kvs_status split_budget(const kvs_policy *p, int n_init, int *local, int *k,
                               kvs_error *err)
{
    int rest;
    if (p->spec.budget_is_fraction) {
        rest = 2 * (int)floor((double)(p->n_prompt - n_init) * p->spec.budget / 2.0);
    } else {
        rest = (int)p->spec.budget - n_init - 1;
        if (rest < 0) /* (start refuses it first when init is not cut by a short prompt) */
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: slots=%.0f leaves no room beside the "
                            "init=%d initial tokens and the current one; give more slots or a "
                            "smaller init", p->spec.user, p->spec.budget, n_init);
    }
    const int k_set = param_i(p, P_K), local_set = param_i(p, P_LOCAL);
    *k = rest / 2;
    *local = rest - *k;
    if (k_set >= 0 && local_set >= 0) {
        *k = k_set;
        *local = local_set;
    } else if (k_set >= 0) {
        *k = k_set;
        *local = rest > k_set ? rest - k_set : 0;
    } else if (local_set >= 0) {
        *local = local_set;
        *k = rest > local_set ? rest - local_set : 0;
    }
    return KVS_OK;
}

/* slots=N: the initial tokens and the current one, below which nothing is left to attend. A
 * fraction is not raised: it sizes the local window and top-k only (split_budget). */
static int min_budget(const kvs_policy_spec *spec)
{
    return spec->budget_is_fraction ? 1 : (int)kvs_policy_spec_param(spec, "init") + 1;
}

/* ---- state ---- */

static void free_layer(pq_state *s, pq_layer *L)
{
    free(L->codes);
    free(L->centroids);
    free(L->local_keys);
    if (L->arena)
        for (int i = 0; i < s->cache_blocks; i++)
            free(L->arena[i]);
    free(L->arena);
    free(L->fill_block);
    free(L->fill_slot);
    kvs_blocks_free(L->blocks);
}

static void free_lane_scores(pq_lane *ln)
{
    free(ln->scores);
    free(ln->acc);
    free(ln->exact_scores);
    free(ln->topk);
    free(ln->idx_exact);
    ln->scores = ln->acc = ln->exact_scores = NULL;
    ln->topk = NULL;
    ln->idx_exact = NULL;
}

static void free_lanes(pq_state *s)
{
    for (int i = 0; i < s->n_lanes; i++) {
        free_lane_scores(&s->lanes[i]);
        free(s->lanes[i].lut);
        free(s->lanes[i].run);
    }
    free(s->lanes);
    s->lanes = NULL;
    s->n_lanes = 0;
}

static void stop(kvs_policy *p)
{
    pq_state *s = p->state;
    if (!s)
        return;
    pq_worker_stop(s);
    for (int l = 0; s->layers && l < s->L; l++)
        free_layer(s, &s->layers[l]);
    free(s->layers);
    kvs_tier_close(s->tier);
    kvs_store_free(s->gather);
    kvs_attn_scratch_free(s->attn);
    free_lanes(s);
    free(s->idx);
    free(s->block_count);
    free(s->rank);
    free(s->rank_scratch);
    free(s->run);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    p->state = NULL;
}

static size_t centroid_floats(const pq_state *s)
{
    return (size_t)s->m * ((size_t)1 << s->bits) * (size_t)(s->hd / s->m);
}

static size_t block_bytes(const pq_state *s) { return (size_t)s->nkv * PQ_BLOCK * s->rec; }

static kvs_status check_params(const kvs_policy *p, int ctx, kvs_error *err)
{
    if (kvs_store_total_slots(p->store) > 0) /* its middle tokens would be lost with the tier */
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "--kv %s: pqcache takes one prompt per cache; "
                        "the cache already holds tokens", p->spec.user);
    if (kvs_store_kivi(p->store))
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "--kv %s: pqcache keeps F16 or F32 rows in "
                        "its two tiers; KIVI storage (--kv-type kivi...) is not supported with "
                        "it", p->spec.user);
    if (p->head_dim % param_i(p, P_M) != 0)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: m=%d does not divide the head dimension "
                        "%d (each key splits into m equal sub-vectors)", p->spec.user,
                        param_i(p, P_M), p->head_dim);
    if (param_i(p, P_K) > ctx)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: k=%d exceeds the context of %d tokens",
                        p->spec.user, param_i(p, P_K), ctx);
    if (param_i(p, P_LOCAL) > ctx)
        return kvs_fail(err, KVS_ERR_ARG, "--kv %s: local=%d exceeds the context of %d tokens",
                        p->spec.user, param_i(p, P_LOCAL), ctx);
    return kvs_policy_check_context(p, err);
}

static kvs_status alloc_layers(pq_state *s, kvs_error *err)
{
    if (!(s->layers = calloc((size_t)s->L, sizeof *s->layers)))
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    for (int l = 0; l < s->L; l++) {
        pq_layer *L = &s->layers[l];
        L->centroids = malloc(sizeof(float) * centroid_floats(s) * (size_t)s->nkv);
        L->blocks = kvs_blocks_new(s->cache_blocks, s->lru);
        L->arena = s->cache_blocks ? calloc((size_t)s->cache_blocks, sizeof(char *)) : NULL;
        L->fill_block = malloc(sizeof(int) * (size_t)s->kcache);
        L->fill_slot = malloc(sizeof(int) * (size_t)s->kcache);
        if (!L->centroids || !L->blocks || (s->cache_blocks && !L->arena) || !L->fill_block ||
            !L->fill_slot)
            return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    }
    return KVS_OK;
}

static kvs_status start(kvs_policy *p, kvs_error *err)
{
    const int ctx = kvs_store_cfg(p->store)->max_slots;
    kvs_status st = check_params(p, ctx, err);
    if (st != KVS_OK)
        return st;
    pq_state *s = calloc(1, sizeof *s);
    if (!s)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    p->state = s;
    s->L = p->n_layers;
    s->nkv = p->n_kv_heads;
    s->hd = p->head_dim;
    s->group = p->n_heads / p->n_kv_heads;
    s->esz = kvs_store_cfg(p->store)->type == KVS_F16 ? 2 : 4;
    s->rec = 2 * (size_t)s->hd * s->esz;
    s->n_init = param_i(p, P_INIT) < p->n_prompt ? param_i(p, P_INIT) : p->n_prompt;
    s->m = param_i(p, P_M);
    s->bits = param_i(p, P_BITS);
    s->iters = param_i(p, P_ITERS);
    s->cache_blocks = param_i(p, P_CACHE) / PQ_BLOCK;
    s->kcache = param_i(p, P_KCACHE);
    s->lru = param_i(p, P_EVICT);
    s->gqa = (pq_gqa)param_i(p, P_GQA);
    s->exact = param_i(p, P_SCORES);
    s->measure = param_i(p, P_MEASURE);
    s->seed = (uint64_t)p->spec.values[P_SEED];
    s->last_layer = -1;
    s->att_layer = -1;
    if ((st = split_budget(p, s->n_init, &s->n_local, &s->k, err)) != KVS_OK ||
        (st = alloc_layers(s, err)) != KVS_OK)
        goto fail;
    if ((st = kvs_tier_open(p->spec.path[0] ? p->spec.path : NULL, s->L * s->nkv,
                            (size_t)ctx * s->rec, &s->tier, err)) != KVS_OK) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        st = kvs_fail(err, st, "--kv %s: tier=%s: %s", p->spec.user, p->spec.path, msg);
        goto fail;
    }
    const kvs_store_config gc = {.n_layers = 1, .n_kv_heads = s->nkv, .head_dim = s->hd,
                                 .max_slots = ctx + 1, .type = kvs_store_cfg(p->store)->type};
    if (!(s->gather = kvs_store_new(&gc)) || !(s->attn = kvs_attn_scratch_new())) {
        st = kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
        goto fail;
    }
    if ((st = pq_worker_start(s, err)) != KVS_OK)
        goto fail;
    return KVS_OK;
fail:
    stop(p);
    return st;
}

/* ---- scratch ---- */

static kvs_status reserve_run(pq_state *s, size_t bytes, kvs_error *err)
{
    if (bytes <= s->run_cap)
        return KVS_OK;
    char *r = realloc(s->run, bytes);
    if (!r)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for a slow-tier read of "
                        "%zu KiB", bytes >> 10);
    s->run = r;
    s->run_cap = bytes;
    return KVS_OK;
}

/* Lanes for n_lanes pool threads, each with score arrays for n middle tokens (grown by half
 * again when short), and the per-step arrays beside them. */
static kvs_status reserve_scores(pq_state *s, int n_lanes, int n, kvs_error *err)
{
    if (n_lanes > s->n_lanes) {
        free_lanes(s);
        s->scratch_cap = 0;
        if (!(s->lanes = calloc((size_t)n_lanes, sizeof *s->lanes)))
            return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
        s->n_lanes = n_lanes;
        for (int i = 0; i < n_lanes; i++)
            if (!(s->lanes[i].lut = malloc(sizeof(float) * (size_t)s->m << s->bits)))
                return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    }
    if (n <= s->scratch_cap)
        return KVS_OK;
    const int cap = n + n / 2 + 64, blocks = cap / PQ_BLOCK + 1;
    s->scratch_cap = 0;
    free(s->idx);
    free(s->block_count);
    free(s->rank);
    free(s->rank_scratch);
    s->idx = malloc(sizeof(int) * (size_t)cap * s->nkv);
    s->block_count = malloc(sizeof(int) * (size_t)blocks);
    s->rank = malloc(sizeof(int) * (size_t)blocks);
    s->rank_scratch = malloc(sizeof(int) * (size_t)blocks);
    int ok = s->idx && s->block_count && s->rank && s->rank_scratch;
    for (int i = 0; i < s->n_lanes; i++) {
        pq_lane *ln = &s->lanes[i];
        free_lane_scores(ln);
        ln->scores = malloc(sizeof(float) * (size_t)cap);
        ln->acc = malloc(sizeof(float) * (size_t)cap);
        ln->exact_scores = malloc(sizeof(float) * (size_t)cap);
        ln->topk = malloc(sizeof(uint32_t) * (size_t)cap);
        ln->idx_exact = malloc(sizeof(int) * (size_t)cap);
        ok = ok && ln->scores && ln->acc && ln->exact_scores && ln->topk && ln->idx_exact;
    }
    if (!ok)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the scores of %d "
                        "tokens", n);
    s->scratch_cap = cap;
    return KVS_OK;
}

/* Slots of a store head with a position below lim (positions are sorted). */
static int slots_below(const kvs_store *st, int layer, int h, int32_t lim)
{
    const int32_t *pos = kvs_store_pos(st, layer, h);
    int n = kvs_store_count(st, layer, h), lo = 0;
    while (lo < n && pos[lo] < lim)
        lo++;
    return lo;
}

/* Appends store slots [a, b) of (layer, h) to the gather store's head h. */
static kvs_status gather_store_rows(pq_state *s, const kvs_store *st, int layer, int h, int a,
                                    int b, kvs_error *err)
{
    if (b <= a)
        return KVS_OK;
    const size_t row = (size_t)s->hd * s->esz;
    return kvs_store_append_raw(s->gather, 0, h, b - a,
                                (const char *)kvs_store_keys(st, layer, h) + (size_t)a * row,
                                (const char *)kvs_store_values(st, layer, h) + (size_t)a * row,
                                row, kvs_store_pos(st, layer, h) + a, err);
}

/* Middle records [first, first + n) of (layer, h): a memory tier's in place (only the main
 * thread writes the tier, and the worker reads other layers' regions), a file's read into buf
 * (room for n records). */
static kvs_status tier_view(pq_state *s, char *buf, int layer, int h, int first, int n,
                            const char **out, kvs_error *err)
{
    *out = kvs_tier_peek(s->tier, layer * s->nkv + h, (size_t)first * s->rec,
                         (size_t)n * s->rec);
    if (*out)
        return KVS_OK;
    *out = buf;
    return pq_tier_read_locked(s, layer, h, first, n, buf, err);
}

/* Appends middle tokens [first, first + n) of (layer, h), read from the slow tier. */
#define PIECE 1024

static kvs_status gather_middle_all(pq_state *s, int layer, int h, int n_mid, kvs_error *err)
{
    int32_t pos[PIECE];
    kvs_status st = reserve_run(s, (size_t)PIECE * s->rec, err);
    for (int first = 0; first < n_mid && st == KVS_OK; first += PIECE) {
        const int n = n_mid - first < PIECE ? n_mid - first : PIECE;
        const char *recs;
        if ((st = tier_view(s, s->run, layer, h, first, n, &recs, err)) != KVS_OK)
            break;
        for (int i = 0; i < n; i++)
            pos[i] = s->n_init + first + i;
        st = kvs_store_append_raw(s->gather, 0, h, n, recs, recs + (size_t)s->hd * s->esz,
                                  s->rec, pos, err);
    }
    return st;
}

/* ---- prefill ---- */

/* The wall time between consecutive layers of a prompt batch is that layer's compute, which
 * the adaptive iteration count fits the clustering into (§2.3). */
static void time_layers(pq_state *s, int layer)
{
    const double t = pq_now();
    if (s->last_layer >= 0 && layer == s->last_layer + 1)
        s->layers[s->last_layer].t_compute += t - s->t_layer_start;
    s->t_layer_start = t;
    s->last_layer = layer;
}

/* Dense causal attention of a prompt batch over the initial tokens, the middle ones in the
 * slow tier and the rest of the store: the prompt's attention is unchanged (§1.1); only what
 * it reads comes back from the slow tier. */
static kvs_status prefill_attend(kvs_policy *p, kvs_pool *pool, int layer, int n,
                                 const float *q, const int32_t *pos, float *out, kvs_error *err)
{
    pq_state *s = p->state;
    time_layers(s, layer);
    const pq_layer *L = &s->layers[layer];
    kvs_attn_args a = {.store = p->store, .layer = layer, .n_heads = p->n_heads, .n = n,
                       .q = q, .qpos = pos, .out = out};
    if (L->n_mid == 0)
        return kvs_attention(pool, s->attn, &a, err);
    kvs_status st = KVS_OK;
    for (int h = 0; h < s->nkv && st == KVS_OK; h++) {
        kvs_store_reset_head(s->gather, 0, h);
        const int i0 = slots_below(p->store, layer, h, s->n_init);
        if ((st = gather_store_rows(s, p->store, layer, h, 0, i0, err)) != KVS_OK ||
            (st = gather_middle_all(s, layer, h, L->n_mid, err)) != KVS_OK)
            break;
        st = gather_store_rows(s, p->store, layer, h, i0, kvs_store_count(p->store, layer, h),
                               err);
    }
    if (st != KVS_OK)
        return st;
    a.store = s->gather;
    a.layer = 0;
    return kvs_attention(pool, s->attn, &a, err);
}

/* Packs store slots [a, b) of (layer, h) as slow-tier records (key, then value) into s->run. */
static void pack_records(pq_state *s, const kvs_store *st, int layer, int h, int a, int b)
{
    const size_t row = (size_t)s->hd * s->esz;
    const char *keys = kvs_store_keys(st, layer, h), *vals = kvs_store_values(st, layer, h);
    for (int i = a; i < b; i++) {
        memcpy(s->run + (size_t)(i - a) * s->rec, keys + (size_t)i * row, row);
        memcpy(s->run + (size_t)(i - a) * s->rec + row, vals + (size_t)i * row, row);
    }
}

/* After a prompt batch: the tokens that will be middle tokens once the prompt ends (positions
 * [n_init, P - n_local)) leave the store for the slow tier, so the store never holds more
 * than the initial tokens, the local window and one batch. */
static kvs_status prefill_chunk(kvs_policy *p, int layer, const kvs_chunk *c, kvs_error *err)
{
    (void)c;
    pq_state *s = p->state;
    pq_layer *L = &s->layers[layer];
    const int32_t mid_end = p->n_prompt - s->n_local;
    /* the slots each head keeps (every head holds the same tokens, so one list serves all) */
    int *keep = malloc(sizeof(int) * ((size_t)kvs_store_count(p->store, layer, 0) + 1));
    if (!keep)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    kvs_status st = KVS_OK;
    int moved = -1;
    for (int h = 0; h < s->nkv && st == KVS_OK; h++) {
        const int i0 = slots_below(p->store, layer, h, s->n_init);
        const int i1 = slots_below(p->store, layer, h, mid_end > s->n_init ? mid_end : s->n_init);
        const int n = i1 - i0, count = kvs_store_count(p->store, layer, h);
        KVS_ASSERT(moved < 0 || moved == n);
        moved = n;
        if (n == 0)
            continue;
        KVS_ASSERT(kvs_store_pos(p->store, layer, h)[i0] == s->n_init + L->n_mid);
        for (int first = i0; first < i1 && st == KVS_OK; first += PIECE) {
            const int m = i1 - first < PIECE ? i1 - first : PIECE;
            if ((st = reserve_run(s, (size_t)m * s->rec, err)) != KVS_OK)
                break;
            pack_records(s, p->store, layer, h, first, first + m);
            st = pq_tier_write_locked(s, layer, h, L->n_mid + (first - i0), m, s->run, err);
        }
        if (st != KVS_OK)
            break;
        for (int i = 0, j = 0; i < count; i++)
            if (i < i0 || i >= i1)
                keep[j++] = i;
        kvs_store_keep(p->store, layer, h, keep, count - n);
    }
    free(keep);
    if (st == KVS_OK && moved > 0)
        L->n_mid += moved;
    return st;
}

/* The prompt's last batch of a layer: its keys are final, so the layer's clustering starts on
 * the worker (with a copy of the local window's keys) while later layers compute. */
static kvs_status prefill_end(kvs_policy *p, int layer, kvs_error *err)
{
    pq_state *s = p->state;
    pq_layer *L = &s->layers[layer];
    const int i0 = slots_below(p->store, layer, 0, s->n_init);
    L->local_rows = kvs_store_count(p->store, layer, 0) - i0;
    const int n = L->n_mid + L->local_rows;
    L->codes_cap = n + 64;
    free(L->codes);
    free(L->local_keys);
    L->codes = malloc((size_t)L->codes_cap * s->m * s->nkv);
    L->local_keys = malloc(sizeof(float) * ((size_t)L->local_rows * s->hd * s->nkv + 1));
    if (!L->codes || !L->local_keys)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the codes of layer %d",
                        layer);
    for (int h = 0; h < s->nkv; h++)
        for (int i = 0; i < L->local_rows; i++)
            kvs_store_key_f32(p->store, layer, h, i0 + i,
                              L->local_keys + ((size_t)h * L->local_rows + i) * s->hd);
    if (layer == s->L - 1) { /* the prompt-sized gather buffers are no longer needed */
        kvs_store_clear(s->gather);
        kvs_attn_scratch_free(s->attn);
        if (!(s->attn = kvs_attn_scratch_new()))
            return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory");
    }
    return pq_worker_queue(s, layer, err);
}

/* ---- decode ---- */

/* acc (+)= softmax(x * scale) over n tokens; x is overwritten with the exponentials. */
static void softmax_into(float *acc, float *x, int n, float scale, int first)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++)
        mx = x[j] * scale > mx ? x[j] * scale : mx;
    double z = 0;
    for (int j = 0; j < n; j++) {
        x[j] = expf(x[j] * scale - mx);
        z += x[j];
    }
    const float inv = (float)(1.0 / z);
    for (int j = 0; j < n; j++)
        acc[j] = first ? x[j] * inv : acc[j] + x[j] * inv;
}

/* Exact q.k of one query head over the middle tokens, read from the slow tier. */
static kvs_status exact_middle(pq_state *s, pq_lane *ln, int layer, int h, const float *q,
                               int n_mid, float *out, kvs_error *err)
{
    if (ln->run_cap < (size_t)PIECE * s->rec) {
        free(ln->run);
        ln->run_cap = 0;
        if (!(ln->run = malloc((size_t)PIECE * s->rec)))
            return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for a slow-tier read");
        ln->run_cap = (size_t)PIECE * s->rec;
    }
    kvs_status st = KVS_OK;
    for (int first = 0; first < n_mid && st == KVS_OK; first += PIECE) {
        const int n = n_mid - first < PIECE ? n_mid - first : PIECE;
        const char *recs;
        if ((st = tier_view(s, ln->run, layer, h, first, n, &recs, err)) != KVS_OK)
            break;
        for (int i = 0; i < n; i++) {
            const char *key = recs + (size_t)i * s->rec;
            out[first + i] = s->esz == 2 ? kvs_dot_f16_f32((const uint16_t *)key, q, s->hd)
                                         : kvs_dot_f32(q, (const float *)key, s->hd);
        }
    }
    return st;
}

/* The KV head's combined score of every middle token (§2.5, §6 item 9): per query head of the
 * group, scores from the PQ codes (or exact ones), then softmax-summed, summed or maxed. */
static kvs_status middle_scores(pq_state *s, pq_lane *ln, int layer, int h, const float *q,
                                int n_mid, int exact, float *acc, kvs_error *err)
{
    const pq_layer *L = &s->layers[layer];
    const float scale = 1.0f / sqrtf((float)s->hd);
    for (int r = 0; r < s->group; r++) {
        const float *qr = q + (size_t)r * s->hd;
        /* one query head per KV head: every combination ranks as its scores do */
        float *x = s->group == 1 ? acc : ln->scores;
        if (exact) {
            kvs_status st = exact_middle(s, ln, layer, h, qr, n_mid, x, err);
            if (st != KVS_OK)
                return st;
        } else {
            kvs_pq_cfg c = {.dim = s->hd, .m = s->m, .bits = s->bits};
            kvs_pq_lut(&c, L->centroids + (size_t)h * centroid_floats(s), qr, ln->lut);
            kvs_pq_scan(ln->lut, s->m, s->bits, L->codes + (size_t)h * L->codes_cap * s->m, n_mid,
                        x);
        }
        if (x == acc)
            continue;
        if (s->gqa == PQ_GQA_SOFTMAX)
            softmax_into(acc, x, n_mid, scale, r == 0);
        else
            for (int j = 0; j < n_mid; j++)
                acc[j] = r == 0 ? x[j]
                         : s->gqa == PQ_GQA_SUM ? acc[j] + x[j]
                                                : (x[j] > acc[j] ? x[j] : acc[j]);
    }
    return KVS_OK;
}

/* The middle tokens KV head h attends: all of them when they are no more than k or the layer
 * has no index, else the top-k of the combined scores (ascending). Measures the recall of the
 * exact top-k when asked. Returns the count. */
static kvs_status select_middle(pq_state *s, pq_lane *ln, int layer, int h, const float *q,
                                int *idx, int *n_sel, kvs_error *err)
{
    const pq_layer *L = &s->layers[layer];
    const int n_mid = L->n_mid;
    if (n_mid <= s->k || (!L->indexed && !s->exact)) {
        for (int j = 0; j < n_mid; j++)
            idx[j] = j;
        *n_sel = n_mid;
        return KVS_OK;
    }
    kvs_status st = middle_scores(s, ln, layer, h, q, n_mid, s->exact, ln->acc, err);
    if (st != KVS_OK)
        return st;
    *n_sel = kvs_topk(ln->acc, n_mid, s->k, idx, ln->topk);
    if (s->measure && !s->exact && s->k > 0) {
        if ((st = middle_scores(s, ln, layer, h, q, n_mid, 1, ln->exact_scores, err)) != KVS_OK)
            return st;
        const int ne = kvs_topk(ln->exact_scores, n_mid, s->k, ln->idx_exact, ln->topk);
        int common = 0;
        for (int a = 0, b = 0; a < *n_sel && b < ne;) /* both ascending */
            if (idx[a] == ln->idx_exact[b])
                common++, a++, b++;
            else if (idx[a] < ln->idx_exact[b])
                a++;
            else
                b++;
        ln->recall_sum += (double)common / ne;
        ln->recall_steps++;
    }
    return KVS_OK;
}

/* The selection phase of a step on the pool: lane ith scores and selects KV heads ith,
 * ith + nth, ... (each writes only its heads' index lists and its own lane). */
typedef struct select_task {
    pq_state *s;
    int layer;
    const float *q;
    int *n_sel;
} select_task;

static void select_heads(void *ctx, int ith, int nth)
{
    select_task *t = ctx;
    pq_state *s = t->s;
    pq_lane *ln = &s->lanes[ith];
    for (int h = ith; h < s->nkv && ln->st == KVS_OK; h += nth)
        ln->st = select_middle(s, ln, t->layer, h, t->q + (size_t)h * s->group * s->hd,
                               s->idx + (size_t)h * s->scratch_cap, &t->n_sel[h], &ln->err);
}

/* Runs the selection of every KV head (on the pool when there is one) and adds the lanes'
 * recall measurements to the layer's. */
static kvs_status select_all(pq_state *s, kvs_pool *pool, int layer, const float *q,
                             int *n_sel, kvs_error *err)
{
    const int nth = pool ? kvs_pool_size(pool) : 1;
    kvs_status st = reserve_scores(s, nth, s->layers[layer].n_mid, err);
    if (st != KVS_OK)
        return st;
    for (int i = 0; i < s->n_lanes; i++) {
        s->lanes[i].st = KVS_OK;
        s->lanes[i].recall_sum = s->lanes[i].recall_steps = 0;
    }
    select_task t = {s, layer, q, n_sel};
    if (pool && nth > 1 && s->nkv > 1)
        kvs_pool_run(pool, select_heads, &t);
    else
        select_heads(&t, 0, 1);
    pq_layer *L = &s->layers[layer];
    for (int i = 0; i < s->n_lanes; i++) {
        if (s->lanes[i].st != KVS_OK && st == KVS_OK) {
            st = s->lanes[i].st;
            *err = s->lanes[i].err;
        }
        L->recall_sum += s->lanes[i].recall_sum;
        L->recall_steps += s->lanes[i].recall_steps;
    }
    return st;
}

/* Appends the selected middle tokens of KV head h to the gather store, in order: a token in
 * a cached block is copied from the fast tier, the others are read from the slow tier in runs
 * (consecutive misses up to RUN_GAP apart are read as one range). The lookup sees the cache
 * as the previous step left it (§6 item 16). */
#define RUN_GAP 8

/* Appends the records of middle tokens idx[0, n) (ascending) to the gather store's head h:
 * token j's record at recs + (j - base) * rec. Consecutive tokens go in one append. */
static kvs_status append_records(pq_state *s, int h, const char *recs, int base, const int *idx,
                                 int n, kvs_error *err)
{
    const size_t row = (size_t)s->hd * s->esz;
    int32_t pos[64];
    kvs_status st = KVS_OK;
    for (int a = 0; a < n && st == KVS_OK;) {
        int b = a + 1;
        while (b < n && b - a < 64 && idx[b] == idx[b - 1] + 1)
            b++;
        for (int i = a; i < b; i++)
            pos[i - a] = s->n_init + idx[i];
        const char *r = recs + (size_t)(idx[a] - base) * s->rec;
        st = kvs_store_append_raw(s->gather, 0, h, b - a, r, r + row, s->rec, pos, err);
        a = b;
    }
    return st;
}

static kvs_status gather_selected(pq_state *s, int layer, int h, const int *idx, int n,
                                  kvs_error *err)
{
    pq_layer *L = &s->layers[layer];
    kvs_status st = KVS_OK;
    for (int a = 0; a < n && st == KVS_OK;) {
        const int j = idx[a], block = j / PQ_BLOCK;
        const int slot = s->cache_blocks ? kvs_blocks_lookup(L->blocks, block) : -1;
        int b = a + 1;
        if (slot >= 0) { /* the hits in this cached block */
            while (b < n && idx[b] / PQ_BLOCK == block)
                b++;
            st = append_records(s, h, L->arena[slot] + (size_t)h * PQ_BLOCK * s->rec,
                                block * PQ_BLOCK, idx + a, b - a, err);
            L->hits += b - a;
            a = b;
            continue;
        }
        /* the run of misses [idx[a], idx[b - 1]], read as one range */
        while (b < n && idx[b] - idx[b - 1] <= RUN_GAP &&
               (!s->cache_blocks || kvs_blocks_lookup(L->blocks, idx[b] / PQ_BLOCK) < 0))
            b++;
        const int span = idx[b - 1] - j + 1;
        const char *recs;
        if (kvs_tier_is_file(s->tier) &&
            (st = reserve_run(s, (size_t)span * s->rec, err)) != KVS_OK)
            break;
        if ((st = tier_view(s, s->run, layer, h, j, span, &recs, err)) != KVS_OK)
            break;
        L->fetched_bytes += (double)span * s->rec;
        st = append_records(s, h, recs, j, idx + a, b - a, err);
        L->misses += b - a;
        a = b;
    }
    return st;
}

/* After the step's fetch: the kcache blocks with the most selected tokens (summed over KV
 * heads; only blocks wholly in the slow tier) enter the block cache, a new one read from the
 * slow tier (§2.9 step 3). */
static kvs_status update_cache(pq_state *s, int layer, const int *const *sel, const int *n_sel,
                               kvs_error *err)
{
    pq_layer *L = &s->layers[layer];
    const int full = L->n_mid / PQ_BLOCK;
    if (!s->cache_blocks || full == 0)
        return KVS_OK;
    memset(s->block_count, 0, sizeof(int) * (size_t)full);
    for (int h = 0; h < s->nkv; h++)
        for (int i = 0; i < n_sel[h]; i++)
            if (sel[h][i] / PQ_BLOCK < full)
                s->block_count[sel[h][i] / PQ_BLOCK]++;
    const int n = kvs_blocks_rank(s->block_count, full, s->kcache, s->rank, s->rank_scratch);
    L->n_fill = 0;
    for (int i = 0; i < n; i++) {
        int fresh = 0, evicted = -1;
        const int slot = kvs_blocks_insert(L->blocks, s->rank[i], &fresh, &evicted);
        if (!fresh)
            continue;
        if (!L->arena[slot] && !(L->arena[slot] = malloc(block_bytes(s))))
            return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the block cache");
        /* a slot taken twice in one update (capacity below kcache) is filled once, last */
        for (int f = 0; f < L->n_fill; f++)
            if (L->fill_slot[f] == slot)
                L->fill_slot[f] = -1;
        L->fill_block[L->n_fill] = s->rank[i];
        L->fill_slot[L->n_fill++] = slot;
        L->fill_bytes += (double)block_bytes(s);
    }
    int kept = 0; /* drop the overwritten entries */
    for (int f = 0; f < L->n_fill; f++)
        if (L->fill_slot[f] >= 0) {
            L->fill_block[kept] = L->fill_block[f];
            L->fill_slot[kept++] = L->fill_slot[f];
        }
    L->n_fill = kept;
    if (kept > 0) /* copied in by the worker, off the critical path; waited for at the layer's
                   * next step (pqcache.md §6 item 16) */
        pq_worker_queue_fill(s, layer);
    return KVS_OK;
}

static kvs_status grow_codes(pq_state *s, pq_layer *L, kvs_error *err)
{
    const int cap = L->codes_cap + L->codes_cap / 2 + 64;
    uint8_t *c = malloc((size_t)cap * s->m * s->nkv);
    if (!c)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the codes");
    for (int h = 0; h < s->nkv; h++)
        memcpy(c + (size_t)h * cap * s->m, L->codes + (size_t)h * L->codes_cap * s->m,
               (size_t)L->n_codes * s->m);
    free(L->codes);
    L->codes = c;
    L->codes_cap = cap;
    return KVS_OK;
}

/* The oldest local token becomes a middle token (§2.7): its K/V go to the slow tier, and it
 * gets a code by nearest centroid unless the prompt's clustering coded it already. */
static kvs_status leave_window(kvs_policy *p, int layer, kvs_error *err)
{
    pq_state *s = p->state;
    pq_layer *L = &s->layers[layer];
    kvs_status st = reserve_run(s, s->rec, err);
    if (st != KVS_OK)
        return st;
    if (L->indexed && L->n_mid >= L->n_codes && L->n_codes == L->codes_cap &&
        (st = grow_codes(s, L, err)) != KVS_OK)
        return st;
    for (int h = 0; h < s->nkv; h++) {
        const int i0 = slots_below(p->store, layer, h, s->n_init);
        KVS_ASSERT(kvs_store_pos(p->store, layer, h)[i0] == s->n_init + L->n_mid);
        pack_records(s, p->store, layer, h, i0, i0 + 1);
        if ((st = pq_tier_write_locked(s, layer, h, L->n_mid, 1, s->run, err)) != KVS_OK)
            return st;
        if (L->indexed && L->n_mid >= L->n_codes) {
            float key[s->hd];
            kvs_store_key_f32(p->store, layer, h, i0, key);
            kvs_pq_cfg c = {.dim = s->hd, .m = s->m, .bits = s->bits};
            kvs_pq_encode(&c, L->centroids + (size_t)h * centroid_floats(s), key,
                          L->codes + ((size_t)h * L->codes_cap + L->n_mid) * s->m);
        }
        kvs_store_remove(p->store, layer, h, i0);
    }
    if (L->indexed && L->n_mid >= L->n_codes)
        L->n_codes = L->n_mid + 1;
    L->n_mid++;
    return KVS_OK;
}

static kvs_status attend(kvs_policy *p, kvs_pool *pool, int layer, const float *q,
                         const float *k, const float *v, int32_t pos, float *out, int *attended,
                         kvs_error *err)
{
    pq_state *s = p->state;
    pq_layer *L = &s->layers[layer];
    kvs_status st = KVS_OK;
    if (L->queued) { /* the first decode step waits for the layer's index (§2.2) */
        if ((st = pq_worker_wait(s, layer, err)) != KVS_OK)
            return st;
        L->queued = 0;
        free(L->local_keys);
        L->local_keys = NULL;
    }
    if (L->fill_pending && (st = pq_worker_wait_fill(s, layer, err)) != KVS_OK)
        return st;
    L->att_mid = L->n_mid;
    const int *sel[s->nkv];
    int n_sel[s->nkv];
    double t0 = pq_now();
    if ((st = select_all(s, pool, layer, q, n_sel, err)) != KVS_OK)
        return st;
    double t1 = pq_now();
    L->t_select += t1 - t0;
    for (int h = 0; h < s->nkv && st == KVS_OK; h++) {
        int *idx = s->idx + (size_t)h * s->scratch_cap;
        sel[h] = idx;
        kvs_store_reset_head(s->gather, 0, h);
        const int i0 = slots_below(p->store, layer, h, s->n_init);
        if ((st = gather_store_rows(s, p->store, layer, h, 0, i0, err)) != KVS_OK ||
            (st = gather_selected(s, layer, h, idx, n_sel[h], err)) != KVS_OK)
            break;
        st = gather_store_rows(s, p->store, layer, h, i0, kvs_store_count(p->store, layer, h),
                               err);
    }
    if (st != KVS_OK || (st = kvs_store_append(s->gather, 0, 1, k, v, &pos, err)) != KVS_OK)
        return st;
    kvs_attn_args a = {.store = s->gather, .layer = 0, .n_heads = p->n_heads, .n = 1, .q = q,
                       .qpos = &pos, .out = out};
    t0 = pq_now();
    L->t_gather += t0 - t1;
    if ((st = kvs_attention(pool, s->attn, &a, err)) != KVS_OK)
        return st;
    t1 = pq_now();
    L->t_attend += t1 - t0;
    *attended = kvs_store_count(s->gather, 0, 0);
    s->att_layer = layer;
    L->code_bytes += (double)s->nkv * s->m * L->n_mid * s->bits / 8.0;
    L->steps++;
    if ((st = update_cache(s, layer, sel, n_sel, err)) != KVS_OK ||
        (st = kvs_store_append(p->store, layer, 1, k, v, &pos, err)) != KVS_OK)
        return st;
    while (kvs_store_count(p->store, layer, 0) - slots_below(p->store, layer, 0, s->n_init) >
           s->n_local)
        if ((st = leave_window(p, layer, err)) != KVS_OK)
            return st;
    L->t_update += pq_now() - t1;
    return KVS_OK;
}

static int attended_positions(const kvs_policy *p, int layer, int kv_head, const int32_t **pos)
{
    const pq_state *s = p->state;
    if (!s || layer != s->att_layer) {
        *pos = NULL;
        return 0;
    }
    *pos = kvs_store_pos(s->gather, 0, kv_head);
    return kvs_store_count(s->gather, 0, kv_head);
}

static int offloaded(const kvs_policy *p, int layer)
{
    const pq_state *s = p->state;
    return s ? s->layers[layer].n_mid : 0;
}

/* What the cache holds in memory beyond the store: codes, centroids, the block cache, and
 * the slow tier when it is memory (a file tier is on disk, reported apart). */
static size_t state_bytes(const kvs_policy *p)
{
    const pq_state *s = p->state;
    if (!s)
        return 0;
    size_t b = kvs_tier_is_file(s->tier) ? 0 : kvs_tier_bytes(s->tier);
    pq_state *ws = p->state; /* the worker may be indexing a layer: read under its lock */
    pthread_mutex_lock(&ws->lock);
    for (int l = 0; l < s->L; l++) {
        const pq_layer *L = &s->layers[l];
        if (L->indexed)
            b += (size_t)L->n_codes * s->m * s->nkv +
                 sizeof(float) * centroid_floats(s) * (size_t)s->nkv;
        for (int i = 0; L->arena && i < s->cache_blocks; i++)
            b += L->arena[i] ? block_bytes(s) : 0;
    }
    pthread_mutex_unlock(&ws->lock);
    return b;
}

static int report(const kvs_policy *p, int i, char *buf, size_t size)
{
    const pq_state *s = p->state;
    if (!s)
        return -1;
    double steps = 0, hits = 0, misses = 0, fetched = 0, fill = 0, codes = 0;
    int indexed = 0, it_lo = 0, it_hi = 0;
    pq_state *ws = p->state; /* the worker may still be indexing (a prompt without decoding) */
    pthread_mutex_lock(&ws->lock);
    const double kmeans_seconds = s->kmeans_seconds;
    for (int l = 0; l < s->L; l++) {
        const pq_layer *L = &s->layers[l];
        steps += L->steps;
        hits += L->hits;
        misses += L->misses;
        fetched += L->fetched_bytes;
        fill += L->fill_bytes;
        codes += L->code_bytes;
        if (L->indexed) {
            it_lo = indexed == 0 || L->iters < it_lo ? L->iters : it_lo;
            it_hi = L->iters > it_hi ? L->iters : it_hi;
            indexed++;
        }
    }
    pthread_mutex_unlock(&ws->lock);
    const double per = steps > 0 ? steps : 1; /* per layer step */
    if (i == 0) {
        snprintf(buf, size, "pqcache: init %d, local %d, top-k %d per KV head; m=%d, bits=%d; "
                 "index on %d of %d layers (%d..%d iterations), k-means %.3f s on its thread, "
                 "%.3f s waited for it at the first decode step", s->n_init, s->n_local, s->k,
                 s->m, s->bits, indexed, s->L, it_lo, it_hi, kmeans_seconds,
                 s->wait_seconds);
        return 0;
    }
    if (i == 1) {
        snprintf(buf, size, "slow tier (%s): %.2f MiB; per layer and step: %.1f tokens and "
                 "%.1f KiB read, codes %.2f KiB (bit-packed); block cache: hit rate %.3f, "
                 "%.1f KiB filled", kvs_tier_is_file(s->tier) ? "file" : "memory",
                 (double)kvs_tier_bytes(s->tier) / 1048576.0, misses / per, fetched / per / 1024,
                 codes / per / 1024, hits + misses > 0 ? hits / (hits + misses) : 0.0,
                 fill / per / 1024);
        return 0;
    }
    if (i == 2) {
        double ts = 0, tg = 0, ta = 0, tu = 0;
        for (int l = 0; l < s->L; l++) {
            ts += s->layers[l].t_select;
            tg += s->layers[l].t_gather;
            ta += s->layers[l].t_attend;
            tu += s->layers[l].t_update;
        }
        snprintf(buf, size, "time per layer step: select %.1f us (scores and top-k), gather "
                 "%.1f us, attention %.1f us, cache update and window %.1f us",
                 1e6 * ts / per, 1e6 * tg / per, 1e6 * ta / per, 1e6 * tu / per);
        return 0;
    }
    if (i == 3 && s->measure) {
        size_t len = (size_t)snprintf(buf, size, "recall of the exact top-k per layer:");
        for (int l = 0; l < s->L && len < size; l++) {
            const pq_layer *L = &s->layers[l];
            if (L->recall_steps > 0)
                len += (size_t)snprintf(buf + len, size - len, " %d:%.3f", l,
                                        L->recall_sum / L->recall_steps);
            else
                len += (size_t)snprintf(buf + len, size - len, " %d:-", l);
        }
        return 0;
    }
    return -1;
}

const kvs_policy_type kvs_policy_pqcache = {
    .name = "pqcache",
    .summary = "PQCache: middle tokens in a slow tier, scored each step from product-quantised "
               "keys; the top-k, initial and local tokens attended exactly",
    .kind = KVS_KIND_OFFLOADING,
    .params = params,
    .n_params = P_N,
    .words = words,
    .n_words = (int)(sizeof words / sizeof words[0]),
    .path_param = "tier",
    .path_help = "keep the slow tier in a new file there (removed at once; its space is freed "
                 "on exit); default: memory",
    .min_budget = min_budget,
    .start = start,
    .stop = stop,
    .state_bytes = state_bytes,
    .prefill_attend = prefill_attend,
    .prefill_chunk = prefill_chunk,
    .prefill_end = prefill_end,
    .attend = attend,
    .attended_positions = attended_positions,
    .offloaded = offloaded,
    .report = report,
};
