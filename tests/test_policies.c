/* KV policies on the reference model: memory bounds and slot invariants after every hook,
 * determinism across threads, equivalences with the full cache, chunked prefill, F16 storage,
 * and spec errors. Prompt = the first 384 tokens of the golden sample, then tokens from 384 on
 * are decoded one at a time, teacher-forced. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "policy_check.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "kvslim.h"

enum { N_TOK = 512, PROMPT = 384, MAX_L = 8, MAX_H = 8, MAX_HD = 64, PAGE = 16 };
/* Decoded tokens per run (teacher-forced, from token 384 on). The 384-token prefill dominates a
 * run under sanitizers, so most runs decode a few tokens with 2 threads (the determinism check
 * reruns the budget-0.25 sweep with 1); the chunked runs, whose prefill is cheap, decode the
 * whole continuation to the end of the context. */
enum { D_ALL = N_TOK - PROMPT, D_SWEEP = 8 };

static int32_t tokens[N_TOK];
static kvs_model *model;
static kvs_model_info info;

/* ---- the observer: invariants after every hook ---- */
typedef struct obs {
    int chunk, n_prompt;
    int decode_pos; /* position of the token being decoded; -1 during the prompt */
    int chunks_done[MAX_L];
    long calls, violations;
    char first[256]; /* the first violation */
    /* slots per (layer, head) right after prefill_end / the last prefill_chunk */
    int snap_n[MAX_L][MAX_H];
    int32_t snap_pos[MAX_L][MAX_H][N_TOK];
    uint32_t rng;
} obs;

static void violation(obs *o, const char *fmt, int layer, int h, const char *hook, int a, int b)
{
    if (o->violations++ == 0) {
        char what[160];
        snprintf(what, sizeof what, fmt, a, b);
        snprintf(o->first, sizeof o->first, "layer %d head %d after %s: %s", layer, h, hook,
                 what);
    }
}

static float urand(obs *o)
{
    o->rng = o->rng * 1664525u + 1013904223u;
    return (float)((o->rng >> 8) / 16777216.0) * 2.0f - 1.0f;
}

static int min_i(int a, int b) { return a < b ? a : b; }

/* Quest: the selection lists are private to the kv layer, so call the policy's select with
 * random queries and check what it returns. */
static void check_select(obs *o, const kvs_kv *kv, int layer, const kvs_policy *p)
{
    const kvs_store *st = kvs_kv_store(kv);
    const int group = p->n_heads / p->n_kv_heads, hd = p->head_dim;
    const int cap = ((p->budget + PAGE - 1) / PAGE) * PAGE;
    const int dense = (int)kvs_policy_param(p, "dense_layers");
    float q[MAX_H * MAX_HD];
    int slots[N_TOK];
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(st, layer, h);
        for (int i = 0; i < group * hd; i++)
            q[i] = 2.0f * urand(o);
        int r = p->type->select((kvs_policy *)p, layer, h, q, slots);
        if (layer < dense) {
            if (r != -1)
                violation(o, "dense layer selected %d slots (%d)", layer, h, "select", r, 0);
            continue;
        }
        if (r == -1) {
            if (n > cap)
                violation(o, "attends all %d slots, more than %d", layer, h, "select", n, cap);
            continue;
        }
        if (r < 1 || r > cap)
            violation(o, "selected %d slots, cap %d", layer, h, "select", r, cap);
        for (int i = 0; i < r; i++)
            if (slots[i] < 0 || slots[i] >= n || (i > 0 && slots[i] <= slots[i - 1])) {
                violation(o, "selection entry %d = %d invalid or not increasing", layer, h,
                          "select", i, slots[i]);
                break;
            }
        if (r > 0 && slots[r - 1] != n - 1)
            violation(o, "newest slot %d not selected (last %d)", layer, h, "select", n - 1,
                      slots[r - 1]);
    }
}

static void observer(void *ctx, const kvs_kv *kv, int layer, const char *hook)
{
    obs *o = ctx;
    o->calls++;
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const char *name = p->type->name;
    const kvs_policy_kind kind = p->type->kind;
    const int B = p->budget;
    int newest; /* the newest position stored so far */
    if (!strcmp(hook, "prefill_chunk"))
        newest = min_i(++o->chunks_done[layer] * o->chunk, o->n_prompt) - 1;
    else if (!strcmp(hook, "prefill_end"))
        newest = o->n_prompt - 1;
    else if (!strcmp(hook, "before_append"))
        newest = o->decode_pos - 1;
    else
        newest = o->decode_pos;
    const int seen = newest + 1, prefill = o->decode_pos < 0;

    if (!strcmp(hook, "select") && p->type->select)
        check_select(o, kv, layer, p);

    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(st, layer, h);
        const int32_t *pos = kvs_store_pos(st, layer, h);
        for (int i = 0; i < n; i++)
            if (pos[i] < 0 || pos[i] > newest || (i > 0 && pos[i] <= pos[i - 1])) {
                violation(o, "slot %d has position %d: unsorted, repeated or unseen", layer, h,
                          hook, i, pos[i]);
                break;
            }
        int expect = seen; /* the exact live count after this hook */
        if (kind == KVS_KIND_EVICTING)
            expect = min_i(seen, !strcmp(hook, "before_append") ? B - 1 : B);
        else if (kind == KVS_KIND_ONE_SHOT && !prefill)
            expect = -1; /* checked by the decode loop */
        else if (kind == KVS_KIND_ONE_SHOT && !strcmp(hook, "prefill_end"))
            expect = min_i(seen, B);
        if (expect >= 0 && n != expect)
            violation(o, "%d live slots, expected %d", layer, h, hook, n, expect);
        if (kind == KVS_KIND_EVICTING && n > B)
            violation(o, "%d live slots over the budget %d", layer, h, hook, n, B);

        if (!strcmp(name, "streaming")) {
            const int sinks = (int)kvs_policy_param(p, "sinks");
            for (int i = 0; i < min_i(sinks, n); i++)
                if (pos[i] != i)
                    violation(o, "sink %d missing (slot holds %d)", layer, h, hook, i, pos[i]);
            for (int i = sinks; i < n; i++)
                if (pos[i] != newest - (n - 1 - i))
                    violation(o, "recent slot %d holds position %d", layer, h, hook, i, pos[i]);
        } else if (!strcmp(name, "h2o")) {
            const int r = min_i(B / 2, seen);
            for (int i = 0; i < r && i < n; i++)
                if (pos[n - r + i] != newest - r + 1 + i)
                    violation(o, "recent window: slot %d holds position %d", layer, h, hook,
                              n - r + i, pos[n - r + i]);
        }
        if ((!strcmp(hook, "prefill_end") || (prefill && kind != KVS_KIND_ONE_SHOT)) &&
            layer < MAX_L && h < MAX_H) {
            o->snap_n[layer][h] = n;
            memcpy(o->snap_pos[layer][h], pos, sizeof(int32_t) * (size_t)n);
        }
    }
}

/* ---- runs ---- */
typedef struct run {
    const char *spec;
    int threads, chunk;
    const char *kv_type;
    int decode; /* tokens decoded after the prompt (at most N_TOK - PROMPT) */
    /* results */
    kvs_status st;
    char err[512];
    float *logits; /* 1 + decode rows: after the prompt, then after each decoded token */
    obs o;
    size_t peak_bytes, slot_bytes;
    long loop_violations;
    char loop_first[256];
} run;

static void loop_violation(run *r, const char *what, int t, int l, int h, int a, int b)
{
    if (r->loop_violations++ == 0)
        snprintf(r->loop_first, sizeof r->loop_first,
                 "after token %d, layer %d head %d: %s (%d vs %d)", t, l, h, what, a, b);
}

static void do_run(run *r)
{
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = r->threads ? r->threads : 1;
    sp.chunk = r->chunk;
    sp.kv_policy = r->spec;
    sp.kv_type = r->kv_type;
    kvs_session *s = NULL;
    kvs_error err = {0};
    memset(&r->o, 0, sizeof r->o);
    r->o.chunk = r->chunk ? r->chunk : 512;
    r->o.n_prompt = PROMPT;
    r->o.decode_pos = -1;
    r->o.rng = 777;
    r->loop_violations = 0;
    r->logits = NULL;
    r->st = kvs_session_new(model, &sp, &s, &err);
    if (r->st != KVS_OK) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    kvs_kv *kv = kvs_session_kv(s);
    kvs_kv_set_observer(kv, observer, &r->o);
    const int V = info.n_vocab, rows = 1 + r->decode;
    r->logits = calloc((size_t)rows * V, sizeof(float));
    if (!r->logits) {
        r->st = KVS_ERR_NOMEM;
        kvs_session_free(s);
        return;
    }
    r->st = kvs_session_eval(s, tokens, PROMPT, r->logits, 0, &err);
    const kvs_store *store = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const int dense = p->type->kind == KVS_KIND_SELECTION
                          ? (int)kvs_policy_param(p, "dense_layers") : 0;
    const int cap = p->type->kind == KVS_KIND_SELECTION ? (p->budget + PAGE - 1) / PAGE * PAGE : 0;
    for (int t = PROMPT; t < PROMPT + r->decode && r->st == KVS_OK; t++) {
        r->o.decode_pos = t;
        r->st = kvs_session_eval(s, tokens + t, 1, r->logits + (size_t)(t - PROMPT + 1) * V, 0,
                                 &err);
        const int decoded = t - PROMPT + 1, n_past = t + 1;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++) {
                const int n = kvs_store_count(store, l, h);
                switch (p->type->kind) {
                case KVS_KIND_FULL:
                case KVS_KIND_SELECTION:
                    if (n != n_past)
                        loop_violation(r, "slots vs tokens", t, l, h, n, n_past);
                    break;
                case KVS_KIND_ONE_SHOT:
                    if (n != min_i(p->budget, PROMPT) + decoded)
                        loop_violation(r, "slots vs min(budget, prompt) + decoded", t, l, h, n,
                                       min_i(p->budget, PROMPT) + decoded);
                    break;
                case KVS_KIND_EVICTING:
                    if (n > p->budget)
                        loop_violation(r, "slots vs budget", t, l, h, n, p->budget);
                    break;
                }
            }
        if (p->type->kind == KVS_KIND_SELECTION) {
            /* Mean slots attended per query head: dense layers all, the others <= cap. */
            kvs_step_stats ss;
            kvs_session_last_step(s, &ss);
            double bound = (dense * (double)n_past +
                            (info.n_layers - dense) * (double)min_i(cap, n_past)) / info.n_layers;
            if (ss.slots_attended > bound + 1e-9)
                loop_violation(r, "slots attended vs quest bound", t, 0, 0,
                               (int)ss.slots_attended, (int)bound);
        }
    }
    if (r->st != KVS_OK)
        snprintf(r->err, sizeof r->err, "%s", err.msg);
    r->peak_bytes = kvs_session_kv_peak_bytes(s);
    r->slot_bytes = kvs_store_slot_bytes(store);
    kvs_session_free(s);
}

static double max_diff(const run *a, const run *b)
{
    if (!a->logits || !b->logits)
        return INFINITY;
    const size_t n = (size_t)(1 + min_i(a->decode, b->decode)) * info.n_vocab;
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a->logits[i] - b->logits[i]);
        if (!(d <= m)) /* also catches NaN */
            m = d;
    }
    return m;
}

static void check_run(const run *r)
{
    CHECKF(r->st == KVS_OK, "%s: %s", r->spec ? r->spec : "full", r->err);
    CHECKF(r->o.violations == 0, "%s (chunk %d): %ld hook invariant violations, first: %s",
           r->spec ? r->spec : "full", r->o.chunk, r->o.violations, r->o.first);
    CHECKF(r->loop_violations == 0, "%s: %ld decode violations, first: %s",
           r->spec ? r->spec : "full", r->loop_violations, r->loop_first);
}

static void free_run(run *r)
{
    free(r->logits);
    r->logits = NULL;
}

/* A spec that parses but cannot start on this prompt: the prompt's eval fails. */
static int start_fails(const char *spec, const char *needle)
{
    run r = {.spec = spec};
    do_run(&r);
    int ok = r.st == KVS_ERR_ARG && strstr(r.err, needle) != NULL;
    if (!ok)
        fprintf(stderr, "spec '%s': status %d, message '%s' (want '%s')\n", spec, r.st, r.err,
                needle);
    free_run(&r);
    return ok;
}

static const char *policies[] = {"streaming", "h2o", "tova", "snapkv", "knorm", "random",
                                 "quest"};
#define N_POLICIES ((int)(sizeof policies / sizeof policies[0]))
/* 30 tokens: below snapkv's window of 32 (it then keeps the last 30), two quest pages. */
static const char *budgets[] = {"budget=0.1", "budget=0.25", "budget=0.5", "slots=30"};
#define N_BUDGETS ((int)(sizeof budgets / sizeof budgets[0]))

int main(void)
{
    char path[1024];
    kvs_error err = {0};
    FILE *f = fopen(check_shared_path(path, sizeof path,
                                      "models/golden/stories260K-sample-512.tokens"), "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f)
        return check_summary("policies");
    int n_tok = 0;
    while (n_tok < N_TOK && fscanf(f, "%d", &tokens[n_tok]) == 1)
        n_tok++;
    fclose(f);
    CHECK(n_tok == N_TOK);
    CHECKF(kvs_model_load(check_shared_path(path, sizeof path,
                                            "models/gguf/stories260K-f32.gguf"), &model, &err) ==
               KVS_OK, "%s", err.msg);
    if (!model || n_tok != N_TOK)
        return check_summary("policies");
    kvs_model_get_info(model, &info);
    CHECK(info.n_layers <= MAX_L && info.n_kv_heads <= MAX_H && info.head_dim <= MAX_HD);

    /* Parse errors name the problem. */
    CHECK(error_mentions("nosuch:budget=0.1", "unknown policy 'nosuch'"));
    CHECK(error_mentions("h2o:budget=0.1,foo=1", "unknown parameter 'foo'"));
    CHECK(error_mentions("snapkv:budget=0.1,window=0", "window=0 is out of range"));
    CHECK(error_mentions("quest:budget=0.1,page=2.5", "page=2.5 is out of range"));
    CHECK(error_mentions("random:budget=0.1,seed=-1", "seed=-1 is out of range"));
    CHECK(error_mentions("h2o", "needs budget"));
    CHECK(error_mentions("tova:window=3", "unknown parameter 'window'"));
    CHECK(error_mentions("knorm:budget=1.5", "must be a decimal number in (0, 1]"));
    CHECK(error_mentions("snapkv:slots=0", "slots=0: a number of slots is a whole number in [1, "));
    CHECK(error_mentions("snapkv:budget=0", "budget=0: the budget must be positive"));
    for (int i = 0; i < N_POLICIES; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s:budget=0.25", policies[i]);
        CHECKF(kvs_kv_policy_check(spec, &err) == KVS_OK, "%s: %s", spec, err.msg);
    }
    /* Budgets a policy cannot honour fail at the prompt's start, naming the spec. */
    CHECK(start_fails("streaming:slots=4", "streaming:slots=4"));
    CHECK(start_fails("h2o:slots=1000", "exceeds the context of 512"));
    CHECK(start_fails("snapkv:budget=0.1,kernel=4", "kernel=4 must be odd"));
    CHECK(start_fails("quest:budget=0.1,dense_layers=9", "dense_layers=9 exceeds"));

    /* The reference. */
    run full = {.spec = "full", .decode = D_SWEEP};
    do_run(&full);
    check_run(&full);

    /* Every policy and budget: invariants after every hook and decode step. */
    run at_quarter[N_POLICIES];
    for (int i = 0; i < N_POLICIES; i++)
        for (int b = 0; b < N_BUDGETS; b++) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s:%s", policies[i], budgets[b]);
            run r = {.spec = spec, .threads = 2, .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            CHECKF(r.o.calls > 0, "%s: no hook observed", spec);
            if (!strcmp(spec, "snapkv:slots=30")) {
                int last = 1;
                for (int l = 0; l < info.n_layers; l++)
                    for (int h = 0; h < info.n_kv_heads; h++)
                        for (int j = 0; j < 30; j++)
                            last &= r.o.snap_pos[l][h][j] == PROMPT - 30 + j;
                CHECKF(last, "snapkv: a budget below the window keeps the last 30 tokens");
            }
            if (b == 1) {
                at_quarter[i] = r;
                at_quarter[i].spec = policies[i]; /* spec[] goes out of scope */
            } else {
                free_run(&r);
            }
        }

    /* Same seed: identical logits with 1 and 2 threads. */
    for (int i = -1; i < N_POLICIES; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%s%s", i < 0 ? "full" : policies[i],
                 i < 0 ? "" : ":budget=0.25");
        run r = {.spec = spec, .threads = i < 0 ? 2 : 1, .decode = D_SWEEP};
        do_run(&r);
        check_run(&r);
        double d = max_diff(&r, i < 0 ? &full : &at_quarter[i]);
        CHECKF(d == 0.0, "%s: 1 and 2 threads differ by %g", spec, d);
        if (i >= 0 && !strcmp(policies[i], "random")) {
            int same = 1;
            for (int l = 0; l < info.n_layers; l++)
                for (int h = 0; h < info.n_kv_heads; h++)
                    same &= r.o.snap_n[l][h] == at_quarter[i].o.snap_n[l][h] &&
                            !memcmp(r.o.snap_pos[l][h], at_quarter[i].o.snap_pos[l][h],
                                    sizeof(int32_t) * (size_t)r.o.snap_n[l][h]);
            CHECKF(same, "random: seed 0 kept different slots with 1 and 2 threads");
        }
        free_run(&r);
    }

    /* random: another seed keeps another set (the same seed kept the same set above). */
    {
        run r1 = {.spec = "random:budget=0.25,seed=1", .threads = 2, .decode = D_SWEEP};
        do_run(&r1);
        check_run(&r1);
        int differ = 0;
        const run *q = &at_quarter[5];
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++)
                differ |= memcmp(r1.o.snap_pos[l][h], q->o.snap_pos[l][h],
                                 sizeof(int32_t) * (size_t)q->o.snap_n[l][h]) != 0;
        CHECKF(differ, "random: seeds 0 and 1 kept the same slots");
        CHECK(max_diff(&r1, q) > 0);
        free_run(&r1);
    }

    /* A budget of the whole prompt (or more): one-shot policies equal the full cache. */
    {
        const char *specs[] = {"snapkv:budget=1.0", "knorm:slots=384", "random:slots=400"};
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            run r = {.spec = specs[i], .threads = 2, .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            double d = max_diff(&r, &full);
            CHECKF(d == 0.0, "%s: logits differ from full by %g", specs[i], d);
            free_run(&r);
        }
    }

    /* Chunked prefill: the same logits for full; h2o and streaming hold the budget, with at
     * most one chunk on top of it at any time. snapkv sums its window over chunks. */
    {
        run r = {.spec = "full", .chunk = 64, .threads = 2, .decode = D_SWEEP};
        do_run(&r);
        check_run(&r);
        double d = max_diff(&r, &full);
        printf("full, chunk 64 vs one chunk: max logit difference %.3g\n", d);
        CHECKF(d < 1e-5, "full: chunked prefill differs by %g", d);
        free_run(&r);
        const char *specs[] = {"h2o:budget=0.1", "streaming:budget=0.1", "tova:slots=100",
                               "quest:budget=0.1"};
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            run c = {.spec = specs[i], .chunk = 64, .threads = 2, .decode = D_ALL};
            do_run(&c);
            check_run(&c);
            if (!strcmp(specs[i], "quest:budget=0.1")) {
                free_run(&c);
                continue; /* keeps everything; run for its page bounds over a long decode */
            }
            const int B = !strcmp(specs[i], "tova:slots=100") ? 100 : 38;
            const size_t heads = (size_t)info.n_layers * info.n_kv_heads;
            const double peak_slots = (double)c.peak_bytes / c.slot_bytes / heads;
            printf("%s, chunk 64: peak %.1f live slots per (layer, head), budget %d\n", specs[i],
                   peak_slots, B);
            CHECKF(c.peak_bytes <= c.slot_bytes * heads * (size_t)(B + 64),
                   "%s chunk 64: peak %zu bytes > budget + chunk", specs[i], c.peak_bytes);
            CHECK(c.o.chunks_done[0] == PROMPT / 64);
            free_run(&c);
        }
        /* snapkv: window rows split over two chunks (40 does not divide 352). */
        run s1 = {.spec = "snapkv:budget=0.25", .chunk = 40, .threads = 2, .decode = D_SWEEP};
        do_run(&s1);
        check_run(&s1);
        int same = 1;
        for (int l = 0; l < info.n_layers; l++)
            for (int h = 0; h < info.n_kv_heads; h++)
                same &= s1.o.snap_n[l][h] == at_quarter[3].o.snap_n[l][h] &&
                        !memcmp(s1.o.snap_pos[l][h], at_quarter[3].o.snap_pos[l][h],
                                sizeof(int32_t) * (size_t)s1.o.snap_n[l][h]);
        CHECKF(same, "snapkv: chunked prefill kept other slots");
        d = max_diff(&s1, &at_quarter[3]);
        CHECKF(d < 1e-4, "snapkv: chunked prefill differs by %g", d);
        free_run(&s1);
    }

    /* F16 KV storage with the full cache. */
    {
        run r = {.spec = "full", .kv_type = "f16", .threads = 2, .decode = D_SWEEP};
        do_run(&r);
        check_run(&r);
        /* F16 rounds keys and values to 11 significant bits (relative error <= 2^-11); over 5
         * layers this moves logits (magnitudes up to ~23) by ~3e-3 on average; the largest
         * difference grows with context, 0.06 over all 512 positions of this sample. */
        double d = max_diff(&r, &full), mean = 0;
        const size_t n = (size_t)(1 + D_SWEEP) * info.n_vocab;
        for (size_t i = 0; r.logits && i < n; i++)
            mean += fabs((double)r.logits[i] - full.logits[i]) / (double)n;
        printf("full, F16 KV vs F32 KV: max logit difference %.3g, mean %.3g\n", d, mean);
        CHECKF(mean < 1e-2, "F16 KV differs from F32 by %g on average", mean);
        CHECKF(d < 0.1, "F16 KV differs from F32 by up to %g", d);
        free_run(&r);
        /* A policy that reads keys itself, from an F16 store. */
        const char *specs[] = {"tova:budget=0.1"};
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            run p = {.spec = specs[i], .kv_type = "f16", .chunk = 64, .threads = 2,
                     .decode = D_SWEEP};
            do_run(&p);
            check_run(&p);
            free_run(&p);
        }
    }

    for (int i = 0; i < N_POLICIES; i++)
        free_run(&at_quarter[i]);
    free_run(&full);
    kvs_model_free(model);
    return check_summary("policies");
}
