/* The shared fixture of the unit tests on the reference model; see fixture.h. */
#include "fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_store.h"
#include "engine/session_internal.h"
#include "kv/kv_store.h"

static const char *shared_path(char *buf, size_t size, const char *rel)
{
    const char *dir = getenv("KVS_SHARED_DIR");
    snprintf(buf, size, "%s/%s", dir ? dir : "../shared", rel);
    return buf;
}

int fx_load(int32_t *tokens, int n, kvs_model **model, kvs_model_info *info, char *msg,
            size_t size)
{
    char path[1024];
    *model = NULL;
    FILE *f = fopen(shared_path(path, sizeof path, "models/golden/stories260K-sample-512.tokens"),
                    "r");
    if (!f) {
        snprintf(msg, size, "cannot open %s", path);
        return -1;
    }
    int got = 0;
    while (got < n && fscanf(f, "%d", &tokens[got]) == 1)
        got++;
    fclose(f);
    if (got != n) {
        snprintf(msg, size, "%s: %d tokens, expected at least %d", path, got, n);
        return -1;
    }
    kvs_error err = {0};
    if (kvs_model_load(shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"), model,
                       &err) != KVS_OK) {
        snprintf(msg, size, "%s", err.msg);
        return -1;
    }
    kvs_model_get_info(*model, info);
    if (info->n_layers > FX_MAX_L || info->n_kv_heads > FX_MAX_H || info->head_dim > FX_MAX_HD) {
        snprintf(msg, size, "%s: %d layers, %d KV heads, head_dim %d exceed the fixture's bounds",
                 path, info->n_layers, info->n_kv_heads, info->head_dim);
        kvs_model_free(*model);
        *model = NULL;
        return -1;
    }
    return 0;
}

int fx_has_param(const kvs_policy_type *t, const char *name)
{
    for (int i = 0; i < t->n_params; i++)
        if (!strcmp(t->params[i].name, name))
            return 1;
    return 0;
}

/* A declared parameter's value, def if the type does not declare it (kvs_policy_param refuses
 * a name the type does not have). */
static int param_or(const kvs_policy *p, const char *name, int def)
{
    return fx_has_param(p->type, name) ? (int)kvs_policy_param(p, name) : def;
}

void fx_violation(fx_obs *o, const char *fmt, int layer, int h, const char *hook, int a, int b)
{
    if (o->violations++ == 0) {
        char what[160];
        snprintf(what, sizeof what, fmt, a, b);
        snprintf(o->first, sizeof o->first, "layer %d head %d after %s: %s", layer, h, hook,
                 what);
    }
}

static float urand(fx_obs *o)
{
    o->rng = o->rng * 1664525u + 1013904223u;
    return (float)((o->rng >> 8) / 16777216.0) * 2.0f - 1.0f;
}

static int min_i(int a, int b) { return a < b ? a : b; }

/* The most slots a selection policy attends per step: its budget rounded up to its pages. */
static int select_cap(const kvs_policy *p)
{
    const int page = param_or(p, "page", 1);
    return (p->budget + page - 1) / page * page;
}

/* A selection policy's lists are private to the kv layer, so call its select with random
 * queries and check what it returns. */
static void check_select(fx_obs *o, const kvs_kv *kv, int layer, const kvs_policy *p)
{
    const kvs_store *st = kvs_kv_store(kv);
    const int group = p->n_heads / p->n_kv_heads, hd = p->head_dim;
    const int cap = select_cap(p), dense = param_or(p, "dense_layers", 0);
    float q[FX_MAX_H * FX_MAX_HD];
    int slots[FX_N_TOK];
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(st, layer, h);
        if (n > FX_N_TOK || group > FX_MAX_H) {
            fx_violation(o, "%d slots or a group of %d beyond the fixture's bounds", layer, h,
                         "select", n, group);
            continue;
        }
        for (int i = 0; i < group * hd; i++)
            q[i] = 2.0f * urand(o);
        int r = p->type->select((kvs_policy *)p, layer, h, q, slots);
        if (layer < dense) {
            if (r != -1)
                fx_violation(o, "dense layer selected %d slots (%d)", layer, h, "select", r, 0);
            continue;
        }
        if (r == -1) {
            if (n > cap)
                fx_violation(o, "attends all %d slots, more than %d", layer, h, "select", n, cap);
            continue;
        }
        if (r < 1 || r > cap)
            fx_violation(o, "selected %d slots, cap %d", layer, h, "select", r, cap);
        for (int i = 0; i < r; i++)
            if (slots[i] < 0 || slots[i] >= n || (i > 0 && slots[i] <= slots[i - 1])) {
                fx_violation(o, "selection entry %d = %d invalid or not increasing", layer, h,
                             "select", i, slots[i]);
                break;
            }
        if (r > 0 && slots[r - 1] != n - 1)
            fx_violation(o, "newest slot %d not selected (last %d)", layer, h, "select", n - 1,
                         slots[r - 1]);
    }
}

/* The newest position the layer holds after this hook, from the tokens fed so far: prompt
 * batches are the run's chunk or less where the policy's prompt_batch limits them (a token it
 * takes through before_append is counted there). */
static int newest_position(fx_obs *o, const kvs_kv *kv, int layer, const char *hook)
{
    if (o->decode_pos >= 0)
        return !strcmp(hook, "before_append") ? o->decode_pos - 1 : o->decode_pos;
    if (!strcmp(hook, "before_append")) { /* a fed prompt token, stored after this hook */
        o->fed[layer] = 1;
        return o->stored[layer]++ - 1;
    }
    if (!strcmp(hook, "prefill_chunk")) {
        o->chunks_done[layer]++;
        if (o->fed[layer])
            o->fed[layer] = 0;
        else
            o->stored[layer] += min_i(o->chunk, kvs_kv_prompt_batch(kv));
    } else if (!strcmp(hook, "prefill_end")) {
        o->stored[layer] = o->n_prompt;
    }
    return o->stored[layer] - 1;
}

static void observer(void *ctx, const kvs_kv *kv, int layer, const char *hook)
{
    fx_obs *o = ctx;
    o->calls++;
    if (layer < 0 || layer >= FX_MAX_L) {
        fx_violation(o, "layer out of the fixture's bounds (%d, %d)", layer, 0, hook, layer, 0);
        return;
    }
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const kvs_policy_kind kind = p->type->kind;
    const int B = p->budget;
    const int newest = newest_position(o, kv, layer, hook);
    const int seen = newest + 1, prefill = o->decode_pos < 0;

    if (!strcmp(hook, "select") && kind == KVS_KIND_SELECTION)
        check_select(o, kv, layer, p);

    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(st, layer, h);
        const int32_t *pos = kvs_store_pos(st, layer, h);
        for (int i = 0; i < n; i++)
            if (pos[i] < 0 || pos[i] > newest) {
                fx_violation(o, "slot %d has position %d: unseen", layer, h, hook, i, pos[i]);
                break;
            }
        const int bad = check_store_positions(st, layer, h);
        if (bad >= 0)
            fx_violation(o, "slot %d: positions out of order or repeated (ordered: %d)", layer, h,
                         hook, bad, kvs_store_ordered(st, layer, h));
        int expect = seen; /* the exact live count after this hook */
        if (kind == KVS_KIND_EVICTING)
            expect = min_i(seen, !strcmp(hook, "before_append") ? B - 1 : B);
        else if (kind == KVS_KIND_ONE_SHOT && !prefill)
            expect = -1; /* checked by the decode loop */
        else if (kind == KVS_KIND_ONE_SHOT && !strcmp(hook, "prefill_end"))
            expect = min_i(seen, B);
        else if (kind == KVS_KIND_MERGING && n == 0 && (!prefill || !strcmp(hook, "prefill_end")))
            expect = 0; /* a merged layer: the policy holds it (test_minicache checks which) */
        else if (kind == KVS_KIND_OFFLOADING) /* the rest is in the policy's slow tier */
            expect = seen - p->type->offloaded(p, layer);
        if (expect >= 0 && n != expect)
            fx_violation(o, "%d live slots, expected %d", layer, h, hook, n, expect);
        if (kind == KVS_KIND_EVICTING && n > B)
            fx_violation(o, "%d live slots over the budget %d", layer, h, hook, n, B);
        if ((!strcmp(hook, "prefill_end") || (prefill && kind != KVS_KIND_ONE_SHOT)) &&
            h < FX_MAX_H && n <= FX_N_TOK) {
            o->snap_n[layer][h] = n;
            memcpy(o->snap_pos[layer][h], pos, sizeof(int32_t) * (size_t)n);
            /* the kept set, whatever the slots' order (kvs_store_remove_unordered) */
            qsort(o->snap_pos[layer][h], (size_t)n, sizeof(int32_t), check_store_cmp_i32);
        }
    }
    if (o->extra)
        o->extra(o, kv, layer, hook, newest);
}

static void loop_violation(fx_run *r, const char *what, int t, int l, int h, int a, int b)
{
    if (r->loop_violations++ == 0)
        snprintf(r->loop_first, sizeof r->loop_first,
                 "after token %d, layer %d head %d: %s (%d vs %d)", t, l, h, what, a, b);
}

/* After decode step t: the live slots of the policy's kind, and a selection policy's mean
 * slots attended per query head (dense layers all, the others at most its cap). */
static void check_step(fx_run *r, kvs_session *s, const kvs_model_info *info, int t)
{
    const kvs_kv *kv = kvs_session_kv(s);
    const kvs_store *store = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const int decoded = t - FX_PROMPT + 1, n_past = t + 1;
    for (int l = 0; l < info->n_layers; l++)
        for (int h = 0; h < info->n_kv_heads; h++) {
            const int n = kvs_store_count(store, l, h);
            switch (p->type->kind) {
            case KVS_KIND_FULL:
            case KVS_KIND_SELECTION:
                if (n != n_past)
                    loop_violation(r, "slots vs tokens", t, l, h, n, n_past);
                break;
            case KVS_KIND_OFFLOADING:
                if (n + p->type->offloaded(p, l) != n_past)
                    loop_violation(r, "slots + offloaded vs tokens", t, l, h,
                                   n + p->type->offloaded(p, l), n_past);
                break;
            case KVS_KIND_ONE_SHOT:
                if (n != min_i(p->budget, FX_PROMPT) + decoded)
                    loop_violation(r, "slots vs min(budget, prompt) + decoded", t, l, h, n,
                                   min_i(p->budget, FX_PROMPT) + decoded);
                break;
            case KVS_KIND_MERGING: /* a merged layer holds nothing (test_minicache) */
                if (n != n_past && n != 0)
                    loop_violation(r, "slots vs tokens (or 0, merged)", t, l, h, n, n_past);
                break;
            case KVS_KIND_EVICTING:
                if (n > p->budget)
                    loop_violation(r, "slots vs budget", t, l, h, n, p->budget);
                break;
            }
        }
    if (p->type->kind == KVS_KIND_SELECTION) {
        const int dense = param_or(p, "dense_layers", 0), cap = select_cap(p);
        kvs_step_stats ss;
        kvs_session_last_step(s, &ss);
        double bound = (dense * (double)n_past +
                        (info->n_layers - dense) * (double)min_i(cap, n_past)) / info->n_layers;
        if (ss.slots_attended > bound + 1e-9)
            loop_violation(r, "slots attended vs the selection bound", t, 0, 0,
                           (int)ss.slots_attended, (int)bound);
    }
}

void fx_exec(fx_run *r, const kvs_model *model, const int32_t *tokens)
{
    kvs_model_info info;
    kvs_model_get_info(model, &info);
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = r->threads ? r->threads : 1;
    sp.chunk = r->chunk;
    sp.kv_policy = r->spec;
    sp.kv_type = r->kv_type;
    kvs_session *s = NULL;
    kvs_error err = {0};
    r->loop_violations = 0;
    r->logits = NULL;
    r->o = calloc(1, sizeof *r->o);
    if (!r->o) {
        r->st = KVS_ERR_NOMEM;
        snprintf(r->err, sizeof r->err, "out of memory");
        return;
    }
    r->o->chunk = r->chunk ? r->chunk : 512;
    r->o->n_prompt = FX_PROMPT;
    r->o->decode_pos = -1;
    r->o->rng = 777;
    r->o->extra = r->extra;
    r->st = kvs_session_new(model, &sp, &s, &err);
    if (r->st != KVS_OK) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    kvs_kv *kv = kvs_session_kv(s);
    if (r->rerun) { /* the prompt one token on, then decode to the end of the sample */
        r->st = kvs_session_eval(s, tokens + 1, FX_PROMPT, NULL, 0, &err);
        for (int t = FX_PROMPT + 1; t < FX_N_TOK && r->st == KVS_OK; t++)
            r->st = kvs_session_eval(s, tokens + t, 1, NULL, 0, &err);
        if (r->st != KVS_OK) {
            snprintf(r->err, sizeof r->err, "first conversation: %.400s", err.msg);
            kvs_session_free(s);
            return;
        }
        kvs_session_reset(s);
    }
    kvs_kv_set_observer(kv, observer, r->o);
    const int V = info.n_vocab, rows = 1 + r->decode;
    r->logits = calloc((size_t)rows * V, sizeof(float));
    if (!r->logits) {
        r->st = KVS_ERR_NOMEM;
        snprintf(r->err, sizeof r->err, "out of memory");
        kvs_session_free(s);
        return;
    }
    r->st = kvs_session_eval(s, tokens, FX_PROMPT, r->logits, 0, &err);
    for (int t = FX_PROMPT; t < FX_PROMPT + r->decode && r->st == KVS_OK; t++) {
        r->o->decode_pos = t;
        r->st = kvs_session_eval(s, tokens + t, 1, r->logits + (size_t)(t - FX_PROMPT + 1) * V, 0,
                                 &err);
        if (r->st == KVS_OK)
            check_step(r, s, &info, t);
    }
    if (r->st != KVS_OK)
        snprintf(r->err, sizeof r->err, "%s", err.msg);
    r->peak_bytes = kvs_session_kv_peak_bytes(s);
    r->end_bytes = kvs_session_kv_bytes(s);
    r->slot_bytes = kvs_store_slot_bytes(kvs_kv_store(kv));
    r->budget = kvs_kv_policy(kv)->budget;
    kvs_session_free(s);
}

void fx_run_free(fx_run *r)
{
    free(r->logits);
    free(r->o);
    r->logits = NULL;
    r->o = NULL;
}

int fx_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

double fx_max_diff(const fx_run *a, const fx_run *b, int n_vocab)
{
    if (!a->logits || !b->logits)
        return INFINITY;
    const size_t n = (size_t)(1 + min_i(a->decode, b->decode)) * n_vocab;
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a->logits[i] - b->logits[i]);
        if (!(d <= m)) /* also catches NaN */
            m = d;
    }
    return m;
}

int fx_same_kept(const fx_run *a, const fx_run *b, const kvs_model_info *info)
{
    if (!a->o || !b->o)
        return 0;
    for (int l = 0; l < info->n_layers; l++)
        for (int h = 0; h < info->n_kv_heads; h++)
            if (a->o->snap_n[l][h] != b->o->snap_n[l][h] ||
                memcmp(a->o->snap_pos[l][h], b->o->snap_pos[l][h],
                       sizeof(int32_t) * (size_t)a->o->snap_n[l][h]))
                return 0;
    return 1;
}

kvs_status fx_write_test_vocab(kvs_gguf_writer *w, int n_tokens)
{
    const size_t n = n_tokens > 0 ? (size_t)n_tokens : 0;
    char(*names)[24] = malloc((n ? n : 1) * sizeof *names);
    const char **pieces = malloc((n ? n : 1) * sizeof *pieces);
    float *scores = calloc(n ? n : 1, sizeof *scores);
    int32_t *types = malloc((n ? n : 1) * sizeof *types);
    kvs_status st = names && pieces && scores && types ? KVS_OK : KVS_ERR_NOMEM;
    for (size_t i = 0; st == KVS_OK && i < n; i++) {
        snprintf(names[i], sizeof names[i], i < 3 ? "<c%zu>" : "p%zu", i);
        pieces[i] = names[i];
        types[i] = i < 3 ? 3 : 1;
    }
    if (st == KVS_OK)
        st = kvs_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", pieces, n);
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", scores, n);
    if (st == KVS_OK)
        st = kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, n);
    if (st == KVS_OK)
        st = kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (st == KVS_OK)
        st = kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    free(names);
    free(pieces);
    free(scores);
    free(types);
    return st;
}
