#include "kv/kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/attention.h"

struct kvs_kv {
    kvs_kv_config cfg;
    kvs_store *store;
    kvs_store *shadow; /* eval mode: every key, never evicted */
    kvs_policy policy;
    int started;       /* policy->start ran for the current prompt */
    int prompt_left;   /* prompt tokens not yet processed */
    kvs_attn_scratch *scratch;

    uint8_t *row_mask;
    size_t row_mask_cap;
    float *fbuf; /* colsum or probs */
    size_t fbuf_cap;
    int *sel;    /* n_kv_heads x max_slots selection lists */
    int *n_sel;
    const int **sel_ptrs;
    float *recall_row;
    size_t recall_cap;

    double step_recall;
    int step_layers;
    double *layer_slots, *last_layer_slots; /* per layer: slots attended summed over query
                                             * heads in this step / the last decode step */
    kvs_kv_step_stats last;
    size_t peak;
    double decode_seconds;
    double prefill_hook_seconds; /* in prefill_chunk and prefill_end hooks */

    kvs_kv_observer observer;
    void *observer_ctx;
};

static void observe(kvs_kv *kv, int layer, const char *hook)
{
    if (kv->observer)
        kv->observer(kv->observer_ctx, kv, layer, hook);
}

kvs_status kvs_kv_new(const kvs_kv_config *cfg, const kvs_policy_spec *spec, kvs_kv **out,
                      kvs_error *err)
{
    *out = NULL;
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return kvs_fail(err, KVS_ERR_ARG, "KV heads %d do not divide query heads %d",
                        cfg->n_kv_heads, cfg->n_heads);
    if (cfg->type != KVS_F32 && cfg->type != KVS_F16)
        return kvs_fail(err, KVS_ERR_ARG, "KV type %s is not supported (f32 or f16)",
                        kvs_dtype_name(cfg->type));
    kvs_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the KV cache");
    kv->cfg = *cfg;
    kv->policy.spec = *spec; /* the full cache is the "full" policy, parsed by the caller */
    kv->policy.type = kv->policy.spec.type;
    kv->policy.n_layers = cfg->n_layers;
    kv->policy.n_heads = cfg->n_heads;
    kv->policy.n_kv_heads = cfg->n_kv_heads;
    kv->policy.head_dim = cfg->head_dim;
    kv->policy.budget = INT32_MAX;
    /* An evicting policy may run past the context (positions shifted or not): its store holds
     * a budget of up to the context plus a batch of up to the context before it trims. */
    const int evicting = kv->policy.type->kind == KVS_KIND_EVICTING;
    if (cfg->max_slots <= 0 || cfg->max_slots > INT32_MAX / 2) {
        kvs_kv_free(kv);
        return kvs_fail(err, KVS_ERR_ARG, "context of %d tokens is out of range [1, %d]",
                        cfg->max_slots, INT32_MAX / 2);
    }
    kvs_store_config sc = {cfg->n_layers, cfg->n_kv_heads, cfg->head_dim,
                           evicting ? 2 * cfg->max_slots : cfg->max_slots, cfg->type,
                           kv->policy.type->n_meta};
    kv->store = kvs_store_new(&sc);
    kv->policy.store = kv->store;
    kv->scratch = kvs_attn_scratch_new();
    kv->n_sel = calloc((size_t)cfg->n_kv_heads, sizeof *kv->n_sel);
    kv->sel_ptrs = calloc((size_t)cfg->n_kv_heads, sizeof *kv->sel_ptrs);
    kv->layer_slots = calloc((size_t)cfg->n_layers, sizeof *kv->layer_slots);
    kv->last_layer_slots = calloc((size_t)cfg->n_layers, sizeof *kv->last_layer_slots);
    int ok = kv->store && kv->scratch && kv->n_sel && kv->sel_ptrs && kv->layer_slots &&
             kv->last_layer_slots;
    if (ok && cfg->shadow) {
        kvs_store_config shc = sc;
        shc.max_slots = cfg->max_slots;
        shc.type = KVS_F32;
        shc.n_meta = 0;
        ok = (kv->shadow = kvs_store_new(&shc)) != NULL;
    }
    if (!ok) {
        kvs_kv_free(kv);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the KV cache");
    }
    *out = kv;
    return KVS_OK;
}

static void stop_policy(kvs_kv *kv)
{
    if (kv->started && kv->policy.type->stop)
        kv->policy.type->stop(&kv->policy);
    kv->policy.state = NULL;
    kv->started = 0;
}

void kvs_kv_free(kvs_kv *kv)
{
    if (!kv)
        return;
    stop_policy(kv);
    kvs_store_free(kv->store);
    kvs_store_free(kv->shadow);
    kvs_attn_scratch_free(kv->scratch);
    free(kv->row_mask);
    free(kv->fbuf);
    free(kv->sel);
    free(kv->n_sel);
    free(kv->layer_slots);
    free(kv->last_layer_slots);
    free(kv->sel_ptrs);
    free(kv->recall_row);
    free(kv);
}

void kvs_kv_reset(kvs_kv *kv, int release)
{
    stop_policy(kv);
    void (*drop)(kvs_store *) = release ? kvs_store_clear : kvs_store_empty;
    drop(kv->store);
    kvs_store_kivi_hold(kv->store, 0);
    if (kv->shadow)
        drop(kv->shadow);
    kv->prompt_left = 0;
    kv->peak = 0;
    kv->decode_seconds = 0;
    kv->prefill_hook_seconds = 0;
    memset(&kv->last, 0, sizeof kv->last);
    memset(kv->layer_slots, 0, sizeof *kv->layer_slots * (size_t)kv->cfg.n_layers);
    memset(kv->last_layer_slots, 0, sizeof *kv->last_layer_slots * (size_t)kv->cfg.n_layers);
}

kvs_status kvs_kv_begin_prompt(kvs_kv *kv, int n_prompt, kvs_error *err)
{
    stop_policy(kv);
    kv->policy.n_prompt = n_prompt;
    kv->policy.budget = kvs_policy_budget_slots(&kv->policy.spec, n_prompt);
    /* The policy's own check (kvs_policy_check_context) reads the store's limit, which is
     * doubled for evicting policies; a budget above the context is refused here, also when a
     * fraction of a prompt longer than the context gives it. */
    if (kv->policy.type->kind == KVS_KIND_EVICTING && kv->policy.budget != INT32_MAX &&
        kv->policy.budget > kv->cfg.max_slots)
        return kv->policy.spec.budget_is_fraction
                   ? kvs_fail(err, KVS_ERR_ARG, "--kv %s: budget of %d slots (of a prompt of %d "
                              "tokens) exceeds the context of %d tokens; give a count of "
                              "slots instead", kv->policy.spec.text, kv->policy.budget, n_prompt,
                              kv->cfg.max_slots)
                   : kvs_fail(err, KVS_ERR_ARG, "--kv %s: budget of %d slots exceeds the context "
                              "of %d tokens", kv->policy.spec.text, kv->policy.budget,
                              kv->cfg.max_slots);
    kvs_status st = kv->policy.type->start ? kv->policy.type->start(&kv->policy, err) : KVS_OK;
    if (st != KVS_OK)
        return st;
    kv->started = 1;
    kv->prompt_left = n_prompt;
    kvs_store_kivi_hold(kv->store, kv->policy.type->kind == KVS_KIND_ONE_SHOT);
    return KVS_OK;
}

static int max_count(const kvs_kv *kv, int layer)
{
    int m = 1;
    for (int h = 0; h < kv->cfg.n_kv_heads; h++) {
        int c = kvs_store_count(kv->store, layer, h);
        if (c > m)
            m = c;
    }
    return m;
}

static kvs_status reserve_floats(kvs_kv *kv, size_t n, kvs_error *err)
{
    if (n <= kv->fbuf_cap)
        return KVS_OK;
    float *p = realloc(kv->fbuf, sizeof(float) * n);
    if (!p)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for attention probabilities");
    kv->fbuf = p;
    kv->fbuf_cap = n;
    return KVS_OK;
}

static void update_peak(kvs_kv *kv)
{
    size_t b = kvs_kv_bytes(kv);
    if (b > kv->peak)
        kv->peak = b;
}

/* The policy's limit on the next prompt batch (prompt_batch); INT32_MAX when it sets none. */
static int policy_prompt_limit(const kvs_kv *kv)
{
    const kvs_policy_type *t = kv->policy.type;
    if (!t->prompt_batch)
        return INT32_MAX;
    int lim = t->prompt_batch(&kv->policy, kv->policy.n_prompt - kv->prompt_left);
    return lim <= 0 ? INT32_MAX : lim;
}

int kvs_kv_prompt_batch(const kvs_kv *kv)
{
    if (kv->prompt_left <= 0)
        return 1;
    int lim = policy_prompt_limit(kv);
    return lim < kv->prompt_left ? lim : kv->prompt_left;
}

/* fed: a prompt token the policy takes like a decode step (prompt_batch limit 1): before_append
 * runs before it is stored. */
static kvs_status prompt_layer(kvs_kv *kv, kvs_pool *pool, int layer, int n, const float *q,
                               const float *k, const float *v, const int32_t *pos, float *out,
                               int fed, kvs_error *err)
{
    const kvs_policy_type *t = kv->policy.type;
    kvs_status st;
    if (fed && t->before_append) {
        if ((st = t->before_append(&kv->policy, layer, q, k, v, pos[0], err)) != KVS_OK)
            return st;
        observe(kv, layer, "before_append");
    }
    st = kvs_store_append(kv->store, layer, n, k, v, pos, err);
    if (st == KVS_OK && kv->shadow)
        st = kvs_store_append(kv->shadow, layer, n, k, v, pos, err);
    if (st != KVS_OK)
        return st;
    update_peak(kv);

    kvs_attn_args a = {.store = kv->store, .layer = layer, .n_heads = kv->cfg.n_heads, .n = n,
                       .q = q, .qpos = pos, .out = out};
    int any_row = 0;
    if (t->wants_row) {
        if ((size_t)n > kv->row_mask_cap) {
            uint8_t *m = realloc(kv->row_mask, (size_t)n);
            if (!m)
                return kvs_fail(err, KVS_ERR_NOMEM,
                                "out of memory for a prompt batch of %d tokens", n);
            kv->row_mask = m;
            kv->row_mask_cap = (size_t)n;
        }
        for (int i = 0; i < n; i++)
            any_row |= kv->row_mask[i] = (uint8_t)(t->wants_row(&kv->policy, layer, pos[i]) != 0);
    }
    if (any_row) {
        int stride = max_count(kv, layer);
        size_t need = (size_t)kv->cfg.n_heads * stride;
        if ((st = reserve_floats(kv, need, err)) != KVS_OK)
            return st;
        memset(kv->fbuf, 0, sizeof(float) * need);
        a.row_mask = kv->row_mask;
        a.colsum = kv->fbuf;
        a.colsum_stride = stride;
    }
    st = t->prefill_attend ? t->prefill_attend(&kv->policy, pool, layer, n, q, pos, out, err)
                           : kvs_attention(pool, kv->scratch, &a, err);
    if (st != KVS_OK)
        return st;

    const int last = n == kv->prompt_left;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (t->prefill_chunk) {
        kvs_chunk c = {n, q, k, v, pos, a.colsum, a.colsum_stride, last};
        if ((st = t->prefill_chunk(&kv->policy, layer, &c, err)) != KVS_OK)
            return st;
        observe(kv, layer, "prefill_chunk");
        update_peak(kv); /* what the hook keeps until prefill_end (MiniCache's prompt copies) */
    }
    if (last && t->prefill_end) {
        if ((st = t->prefill_end(&kv->policy, layer, err)) != KVS_OK)
            return st;
        observe(kv, layer, "prefill_end");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kv->prefill_hook_seconds +=
        (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    /* KIVI quantises after the policy's hooks: what a chunk's eviction drops never enters a
     * quantised group, so groups form from survivors (an evicted token would otherwise leave a
     * group with fewer tokens but the same scale and minimum to pay for). A one-shot policy's
     * prompt stays fp16 until its prompt-end eviction (kvs_kv_begin_prompt holds the store). */
    if (kv->policy.type->kind != KVS_KIND_ONE_SHOT || last)
        kvs_store_kivi_flush(kv->store, layer);
    return KVS_OK;
}

/* Share of the full softmax (query over every shadow key) on the attended positions. */
static double recall_of(kvs_kv *kv, int layer, int kvh, const float *q, int32_t qpos,
                        const int *sel, int n_sel, const int32_t *att_pos)
{
    const int hd = kv->cfg.head_dim;
    const int n_all = kvs_store_count(kv->shadow, layer, kvh);
    const float *keys = kvs_store_keys(kv->shadow, layer, kvh);
    const int32_t *all_pos = kvs_store_pos(kv->shadow, layer, kvh);
    float *p = kv->recall_row;
    int n = 0;
    for (; n < n_all && all_pos[n] <= qpos; n++) {
        double d = 0;
        for (int i = 0; i < hd; i++)
            d += (double)q[i] * keys[(size_t)n * hd + i];
        p[n] = (float)(d / sqrt((double)hd));
    }
    if (n == 0)
        return 1.0;
    float m = p[0];
    for (int j = 1; j < n; j++)
        m = p[j] > m ? p[j] : m;
    double z = 0;
    for (int j = 0; j < n; j++)
        z += exp((double)p[j] - m);
    /* Each attended position in the shadow's (which never evicts, so is in position order);
     * the attended ones may be in any order (kvs_store_remove_unordered). */
    const int32_t *pos = att_pos ? att_pos : kvs_store_pos(kv->store, layer, kvh);
    int count = sel || att_pos ? n_sel : kvs_store_count(kv->store, layer, kvh);
    double mass = 0;
    for (int s = 0; s < count; s++) {
        const int32_t ps = pos[sel ? sel[s] : s];
        int lo = 0, hi = n;
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (all_pos[mid] < ps)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < n && all_pos[lo] == ps)
            mass += exp((double)p[lo] - m);
    }
    return mass / z;
}

static kvs_status reserve_recall_row(kvs_kv *kv, int layer, int kvh, kvs_error *err)
{
    size_t need = (size_t)kvs_store_count(kv->shadow, layer, kvh);
    if (need <= kv->recall_cap)
        return KVS_OK;
    float *r = realloc(kv->recall_row, sizeof(float) * need);
    if (!r)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the attention recall measurement");
    kv->recall_row = r;
    kv->recall_cap = need;
    return KVS_OK;
}

/* Attention recall of a layer the policy attended itself, from the positions it names. */
static kvs_status shadow_recall(kvs_kv *kv, int layer, const float *q, int32_t qpos,
                                kvs_error *err)
{
    const kvs_policy_type *t = kv->policy.type;
    const int group = kv->cfg.n_heads / kv->cfg.n_kv_heads, hd = kv->cfg.head_dim;
    for (int h = 0; h < kv->cfg.n_heads; h++) {
        const int kvh = h / group;
        kvs_status st = reserve_recall_row(kv, layer, kvh, err);
        if (st != KVS_OK)
            return st;
        const int32_t *att = NULL;
        const int n = t->attended_positions(&kv->policy, layer, kvh, &att);
        kv->step_recall += recall_of(kv, layer, kvh, q + (size_t)h * hd, qpos, NULL, n, att);
    }
    return KVS_OK;
}

static kvs_status decode_layer(kvs_kv *kv, kvs_pool *pool, int layer, const float *q,
                               const float *k, const float *v, const int32_t *pos, float *out,
                               kvs_error *err)
{
    const kvs_policy_type *t = kv->policy.type;
    const int nkv = kv->cfg.n_kv_heads, group = kv->cfg.n_heads / nkv, hd = kv->cfg.head_dim;
    kvs_status st;
    if (t->attend) { /* a layer the policy attends from what it keeps (the merging kind) */
        int attended = 0;
        if ((st = t->attend(&kv->policy, pool, layer, q, k, v, pos[0], out, &attended, err)) !=
            KVS_OK)
            return st;
        if (attended > 0) {
            observe(kv, layer, "attend");
            if (kv->shadow &&
                (st = kvs_store_append(kv->shadow, layer, 1, k, v, pos, err)) != KVS_OK)
                return st;
            update_peak(kv);
            kv->layer_slots[layer] += (double)attended * kv->cfg.n_heads;
            kv->step_layers++;
            if (!t->attended_positions) { /* every position attended: recall 1 for each head */
                kv->step_recall += kv->cfg.n_heads;
                return KVS_OK;
            }
            return kv->shadow ? shadow_recall(kv, layer, q, pos[0], err) : KVS_OK;
        }
    }
    if (t->before_append) {
        if ((st = t->before_append(&kv->policy, layer, q, k, v, pos[0], err)) != KVS_OK)
            return st;
        observe(kv, layer, "before_append");
    }
    if ((st = kvs_store_append(kv->store, layer, 1, k, v, pos, err)) != KVS_OK)
        return st;
    if (kv->shadow && (st = kvs_store_append(kv->shadow, layer, 1, k, v, pos, err)) != KVS_OK)
        return st;
    update_peak(kv);

    const int stride = max_count(kv, layer);
    kvs_attn_args a = {.store = kv->store, .layer = layer, .n_heads = kv->cfg.n_heads, .n = 1,
                       .q = q, .qpos = pos, .out = out};
    if (t->select) {
        size_t need = (size_t)nkv * stride;
        int *sel = realloc(kv->sel, sizeof(int) * need);
        if (!sel)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the selected slots");
        kv->sel = sel;
        int any = 0;
        for (int h = 0; h < nkv; h++) {
            int *list = kv->sel + (size_t)h * stride;
            int c = t->select(&kv->policy, layer, h, q + (size_t)h * group * hd, list);
            if (c < 0) { /* every slot */
                c = kvs_store_count(kv->store, layer, h);
                for (int i = 0; i < c; i++)
                    list[i] = i;
            } else {
                any = 1;
            }
            kv->n_sel[h] = c;
            kv->sel_ptrs[h] = list;
        }
        observe(kv, layer, "select");
        if (any) {
            a.sel = kv->sel_ptrs;
            a.n_sel = kv->n_sel;
        }
    }
    if (t->after_attention) {
        if ((st = reserve_floats(kv, (size_t)kv->cfg.n_heads * stride, err)) != KVS_OK)
            return st;
        a.probs = kv->fbuf;
        a.probs_stride = stride;
    }
    if ((st = kvs_attention(pool, kv->scratch, &a, err)) != KVS_OK)
        return st;
    kvs_store_kivi_flush(kv->store, layer); /* slot indices stay: probs still match */

    for (int h = 0; h < kv->cfg.n_heads; h++) {
        int kvh = h / group;
        int attended = a.sel ? a.n_sel[kvh] : kvs_store_count(kv->store, layer, kvh);
        kv->layer_slots[layer] += attended;
        if (kv->shadow) {
            if ((st = reserve_recall_row(kv, layer, kvh, err)) != KVS_OK)
                return st;
            kv->step_recall += recall_of(kv, layer, kvh, q + (size_t)h * hd, pos[0],
                                         a.sel ? a.sel[kvh] : NULL, a.sel ? a.n_sel[kvh] : 0,
                                         NULL);
        }
    }
    kv->step_layers++;
    if (t->after_attention) {
        if ((st = t->after_attention(&kv->policy, layer, a.probs, a.probs_stride, err)) != KVS_OK)
            return st;
        observe(kv, layer, "after_attention");
    }
    return KVS_OK;
}

kvs_status kvs_kv_layer(kvs_kv *kv, kvs_pool *pool, int layer, int n, const float *q,
                        const float *k, const float *v, const int32_t *pos, float *out,
                        kvs_error *err)
{
    kv->policy.in_prompt = kv->prompt_left > 0;
    if (kv->prompt_left > 0) {
        if (n > kv->prompt_left)
            return kvs_fail(err, KVS_ERR_ARG, "batch of %d tokens runs past the prompt's end (%d "
                            "left)", n, kv->prompt_left);
        const int lim = policy_prompt_limit(kv);
        if (n > lim)
            return kvs_fail(err, KVS_ERR_ARG, "batch of %d prompt tokens exceeds the %d the KV "
                            "policy %s takes next (kvs_kv_prompt_batch)", n, lim,
                            kv->policy.spec.text);
        return prompt_layer(kv, pool, layer, n, q, k, v, pos, out, lim == 1, err);
    }
    if (!kv->started)
        return kvs_fail(err, KVS_ERR_ARG, "no prompt has begun (kvs_kv_begin_prompt)");
    if (n != 1)
        return kvs_fail(err, KVS_ERR_ARG, "decode steps take one token, got %d", n);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kvs_status st = decode_layer(kv, pool, layer, q, k, v, pos, out, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kv->decode_seconds += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return st;
}

void kvs_kv_prefetch_layer(const kvs_kv *kv, int layer)
{
    /* the merging kind appends to a store of its own, when it does */
    if (kv->started && kv->prompt_left == 0 && !kv->policy.type->attend)
        kvs_store_prefetch_append(kv->store, layer);
}

void kvs_kv_end_batch(kvs_kv *kv, int n)
{
    if (kv->prompt_left > 0) {
        kv->prompt_left -= n;
        if (kv->prompt_left == 0)
            kvs_store_kivi_hold(kv->store, 0);
    } else if (kv->step_layers > 0) {
        double heads = (double)kv->step_layers * kv->cfg.n_heads, slots = 0;
        for (int l = 0; l < kv->cfg.n_layers; l++) {
            slots += kv->layer_slots[l];
            kv->last_layer_slots[l] = kv->layer_slots[l] / kv->cfg.n_heads;
        }
        kv->last.slots_attended = slots / heads;
        kv->last.attn_recall = kv->shadow ? kv->step_recall / heads : 1.0;
    }
    kv->step_recall = 0;
    kv->step_layers = 0;
    memset(kv->layer_slots, 0, sizeof *kv->layer_slots * (size_t)kv->cfg.n_layers);
    update_peak(kv);
}

/* New positions of one head's slots (see kvs_kv_shift): a monotone map, taken in position
 * order: along the slots, or along order[] (slot indices by position) for a head out of
 * order. */
static void shifted_positions(const int32_t *pos, int n, int32_t keep, int32_t delta,
                              const kvs_pos_slot *order, int32_t *out)
{
    int32_t prev = keep - 1;
    for (int r = 0; r < n; r++) {
        const int i = order ? order[r].slot : r;
        if (pos[i] < keep) {
            out[i] = pos[i];
            continue;
        }
        int32_t p = pos[i] - delta;
        out[i] = prev = p > prev ? p : prev + 1;
    }
}

kvs_status kvs_kv_shift(kvs_kv *kv, int32_t next, const kvs_rope_cfg *rope, int32_t *delta,
                        kvs_error *err)
{
    *delta = 0;
    if (kv->shadow)
        return kvs_fail(err, KVS_ERR_ARG, "position shifting cannot run with the attention "
                        "recall measurement, which keeps every key at its first position");
    const int L = kv->cfg.n_layers, nkv = kv->cfg.n_kv_heads;
    /* Policies without sinks (h2o, tova) keep no position in place. */
    double sinks = kvs_policy_param_or(&kv->policy, "sinks", 0.0);
    int32_t keep = sinks < 0 ? 0 : sinks > next ? next : (int32_t)sinks;
    /* The next position must stay above every moved slot: keep + the non-prefix slots. */
    int64_t need = keep, most = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < nkv; h++) {
            const int n = kvs_store_count(kv->store, l, h);
            const int32_t *pos = kvs_store_pos(kv->store, l, h);
            int pre = 0;
            for (int i = 0; i < n; i++)
                pre += pos[i] < keep;
            need = keep + (n - pre) > need ? keep + (n - pre) : need;
            most = n > most ? n : most;
        }
    int64_t target = kv->cfg.max_slots / 2;
    target = need > target ? need : target;
    if (target >= next)
        return KVS_OK;
    const int32_t d = next - (int32_t)target;
    int32_t *buf = malloc(sizeof(int32_t) * ((size_t)nkv * most + (size_t)most + 1));
    const int32_t **old = malloc(sizeof *old * (size_t)nkv);
    kvs_pos_slot *order = malloc(sizeof *order * (size_t)(most + 1));
    if (!buf || !old || !order) {
        free(buf);
        free(old);
        free(order);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for position shifting");
    }
    int32_t *new_pos = buf + (size_t)nkv * most;
    kvs_status st = KVS_OK;
    const kvs_shift_info sh = {keep, d, old};
    for (int l = 0; l < L && st == KVS_OK; l++) {
        for (int h = 0; h < nkv && st == KVS_OK; h++) {
            const int n = kvs_store_count(kv->store, l, h);
            int32_t *o = buf + (size_t)h * most;
            if (n > 0)
                memcpy(o, kvs_store_pos(kv->store, l, h), sizeof(int32_t) * (size_t)n);
            old[h] = o;
            const int ordered = kvs_store_ordered(kv->store, l, h);
            for (int i = 0; i < n && !ordered; i++)
                order[i] = (kvs_pos_slot){o[i], i};
            if (!ordered)
                kvs_pos_slot_sort(order, n);
            shifted_positions(o, n, keep, d, ordered ? NULL : order, new_pos);
            st = kvs_store_shift(kv->store, l, h, new_pos, rope, err);
        }
        if (st == KVS_OK && kv->policy.type->shift) {
            st = kv->policy.type->shift(&kv->policy, l, &sh, err);
            observe(kv, l, "shift");
        }
    }
    free(buf);
    free(old);
    free(order);
    if (st == KVS_OK)
        *delta = d;
    return st;
}

const kvs_store *kvs_kv_store(const kvs_kv *kv) { return kv->store; }

kvs_status kvs_kv_set_kivi(kvs_kv *kv, const kvs_kivi_cfg *k, kvs_error *err)
{
    return kvs_store_set_kivi(kv->store, k, err);
}
const kvs_policy *kvs_kv_policy(const kvs_kv *kv) { return &kv->policy; }

size_t kvs_kv_bytes(const kvs_kv *kv)
{
    size_t b = kvs_store_bytes(kv->store);
    if (kv->started && kv->policy.type->state_bytes)
        b += kv->policy.type->state_bytes(&kv->policy);
    return b;
}

size_t kvs_kv_peak_bytes(const kvs_kv *kv) { return kv->peak; }
double kvs_kv_decode_seconds(const kvs_kv *kv) { return kv->decode_seconds; }
double kvs_kv_prefill_hook_seconds(const kvs_kv *kv) { return kv->prefill_hook_seconds; }

size_t kvs_kv_bytes_full_f16(const kvs_kv *kv, int64_t n_tokens)
{
    return (size_t)n_tokens * (size_t)kv->cfg.n_layers * kv->cfg.n_kv_heads * kv->cfg.head_dim *
           2 * 2;
}

void kvs_kv_last_step(const kvs_kv *kv, kvs_kv_step_stats *st) { *st = kv->last; }

double kvs_kv_last_step_layer(const kvs_kv *kv, int layer)
{
    return layer >= 0 && layer < kv->cfg.n_layers ? kv->last_layer_slots[layer] : 0.0;
}

void kvs_kv_set_observer(kvs_kv *kv, kvs_kv_observer fn, void *ctx)
{
    kv->observer = fn;
    kv->observer_ctx = ctx;
}
