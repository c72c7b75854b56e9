/* KV policies on the reference model, driven by the registry: every registered policy is run
 * through the generic invariants of its kind (tests/fixture.h: memory bounds and slot
 * invariants after every hook and decode step), 1 and 2 threads bit-identical, another seed
 * changing a seeded policy's kept set, a budget of the whole prompt equal to the full cache for
 * one-shot policies, chunked prefill bounded (evicting) or equal to one chunk (one-shot); plus
 * the checks of particular policies (streaming's sinks, h2o's recent window, snapkv's window),
 * F16 storage and spec errors. A policy registered later is tested without editing this file.
 * Prompt = the first 384 tokens of the golden sample, then tokens from 384 on are decoded one at
 * a time, teacher-forced. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "policy_check.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "kvslim.h"

enum { N_TOK = FX_N_TOK, PROMPT = FX_PROMPT };
/* Decoded tokens per run (teacher-forced, from token 384 on). The 384-token prefill dominates a
 * run under sanitizers, so most runs decode a few tokens with 2 threads (the determinism check
 * reruns the budget-0.25 sweep with 1); the chunked runs, whose prefill is cheap, decode the
 * whole continuation to the end of the context. */
enum { D_ALL = N_TOK - PROMPT, D_SWEEP = 8 };

static int32_t tokens[N_TOK];
static kvs_model *model;
static kvs_model_info info;

static int min_i(int a, int b) { return a < b ? a : b; }

/* ---- checks of particular policies, after the generic ones of every hook ---- */
static void named_checks(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const char *name = p->type->name;
    const int B = p->budget, seen = newest + 1;
    for (int h = 0; h < p->n_kv_heads; h++) {
        const int n = kvs_store_count(st, layer, h);
        const int32_t *pos = kvs_store_pos(st, layer, h);
        if (!strcmp(name, "streaming")) {
            const int sinks = (int)kvs_policy_param(p, "sinks");
            for (int i = 0; i < min_i(sinks, n); i++)
                if (pos[i] != i)
                    fx_violation(o, "sink %d missing (slot holds %d)", layer, h, hook, i, pos[i]);
            for (int i = sinks; i < n; i++)
                if (pos[i] != newest - (n - 1 - i))
                    fx_violation(o, "recent slot %d holds position %d", layer, h, hook, i,
                                 pos[i]);
        } else if (!strcmp(name, "h2o")) {
            /* The recent window: positions newest - r + 1 .. newest, each held (in any slot:
             * a victim's slot takes the newest row). */
            const int r = min_i(B / 2, seen);
            for (int32_t want = newest - r + 1; want <= newest; want++) {
                int held = 0;
                for (int i = 0; i < n && !held; i++)
                    held = pos[i] == want;
                if (!held)
                    fx_violation(o, "recent window: position %d not held (%d slots)", layer, h,
                                 hook, want, n);
            }
        }
    }
}

/* ---- runs ---- */
static void do_run(fx_run *r)
{
    r->extra = named_checks;
    fx_exec(r, model, tokens);
}

static double max_diff(const fx_run *a, const fx_run *b) { return fx_max_diff(a, b, info.n_vocab); }

static void check_run(const fx_run *r)
{
    CHECKF(r->st == KVS_OK, "%s: %s", r->spec ? r->spec : "full", r->err);
    CHECKF(r->o && r->o->violations == 0,
           "%s (chunk %d): %ld hook invariant violations, first: %s", r->spec ? r->spec : "full",
           r->o ? r->o->chunk : 0, r->o ? r->o->violations : -1, r->o ? r->o->first : "");
    CHECKF(r->loop_violations == 0, "%s: %ld decode violations, first: %s",
           r->spec ? r->spec : "full", r->loop_violations, r->loop_first);
}

/* A spec that parses but cannot start on this prompt: the prompt's eval fails. */
static int start_fails(const char *spec, const char *needle)
{
    fx_run r = {.spec = spec};
    do_run(&r);
    int ok = r.st == KVS_ERR_ARG && strstr(r.err, needle) != NULL;
    if (!ok)
        fprintf(stderr, "spec '%s': status %d, message '%s' (want '%s')\n", spec, r.st, r.err,
                needle);
    fx_run_free(&r);
    return ok;
}

/* The registered policies that take a budget (every kind but the full cache and the merging
 * kind), and those of the merging kind (no budget: they attend every position). */
static const kvs_policy_type *policies[64], *merging[16];
static int n_policies, n_merging;

/* 30 tokens: below snapkv's window of 32 (it then keeps the last 30), two quest pages. */
static const char *budgets[] = {"budget=0.1", "budget=0.25", "budget=0.5", "slots=30"};
#define N_BUDGETS ((int)(sizeof budgets / sizeof budgets[0]))
/* A budget of the whole prompt, in each form: the fraction 1, exactly the prompt, more. */
static const char *whole[] = {"budget=1.0", "slots=384", "slots=400"};
#define N_WHOLE ((int)(sizeof whole / sizeof whole[0]))

/* Every policy at every budget: invariants after every hook and decode step. The budget-0.25
 * runs are kept in quarter[] for the comparisons below. */
static void sweep(fx_run *quarter)
{
    for (int i = 0; i < n_policies; i++)
        for (int b = 0; b < N_BUDGETS; b++) {
            char spec[96];
            snprintf(spec, sizeof spec, "%s:%s", policies[i]->name, budgets[b]);
            kvs_policy_spec parsed;
            if (!strncmp(budgets[b], "slots=", 6) && kvs_policy_parse(spec, &parsed, NULL) ==
                KVS_OK && atoi(budgets[b] + 6) < kvs_policy_min_budget(&parsed)) {
                /* below what the policy can honour (pqcache's 32 initial tokens): refused */
                CHECKF(start_fails(spec, budgets[b]), "%s: a budget below the minimum %d slots "
                       "is not refused", spec, kvs_policy_min_budget(&parsed));
                continue;
            }
            fx_run r = {.spec = spec, .threads = 2, .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            CHECKF(r.o && r.o->calls > 0, "%s: no hook observed", spec);
            if (!strcmp(spec, "snapkv:slots=30") && r.o) {
                int last = 1;
                for (int l = 0; l < info.n_layers; l++)
                    for (int h = 0; h < info.n_kv_heads; h++)
                        for (int j = 0; j < 30; j++)
                            last &= r.o->snap_pos[l][h][j] == PROMPT - 30 + j;
                CHECKF(last, "snapkv: a budget below the window keeps the last 30 tokens");
            }
            if (b == 1) {
                quarter[i] = r;
                quarter[i].spec = policies[i]->name; /* spec[] goes out of scope */
            } else {
                fx_run_free(&r);
            }
        }
}

/* Same seed: identical logits and kept slots with 1 and 2 threads; for the full cache (every
 * policy of the full kind) 2 threads against the 1-thread reference. */
static void threads_identical(const fx_run *full, const fx_run *quarter)
{
    int n_types = 0;
    const kvs_policy_type *const *types = kvs_policy_types(&n_types);
    for (int i = 0; i < n_types; i++)
        if (types[i]->kind == KVS_KIND_FULL) {
            fx_run r = {.spec = types[i]->name, .threads = 2, .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            double d = max_diff(&r, full);
            CHECKF(d == 0.0, "%s: 1 and 2 threads differ by %g", r.spec, d);
            fx_run_free(&r);
        }
    for (int i = 0; i < n_policies; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25", policies[i]->name);
        fx_run r = {.spec = spec, .threads = 1, .decode = D_SWEEP};
        do_run(&r);
        check_run(&r);
        double d = max_diff(&r, &quarter[i]);
        CHECKF(d == 0.0, "%s: 1 and 2 threads differ by %g", spec, d);
        CHECKF(fx_same_kept(&r, &quarter[i], &info), "%s: kept different slots with 1 and 2 "
               "threads", spec);
        fx_run_free(&r);
    }
}

/* A policy with a seed parameter: another seed keeps another set (the same seed kept the same
 * set above) and so gives other logits. */
static void seeds_differ(const fx_run *quarter)
{
    for (int i = 0; i < n_policies; i++) {
        const kvs_policy_type *t = policies[i];
        const kvs_param_def *seed = NULL;
        for (int j = 0; j < t->n_params; j++)
            if (!strcmp(t->params[j].name, "seed"))
                seed = &t->params[j];
        if (!seed)
            continue;
        const double other = seed->def + 1 <= seed->max ? seed->def + 1 : seed->def - 1;
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25,seed=%.0f", t->name, other);
        fx_run r = {.spec = spec, .threads = 2, .decode = D_SWEEP};
        do_run(&r);
        check_run(&r);
        /* (an offloading policy's store is its fast tier, initial and local tokens, which
         * no seed changes: only what it selects from the slow tier does) */
        CHECKF(t->kind == KVS_KIND_OFFLOADING || !fx_same_kept(&r, &quarter[i], &info),
               "%s: seeds %.0f and %.0f kept the same slots", t->name, seed->def, other);
        CHECKF(max_diff(&r, &quarter[i]) > 0, "%s: seeds %.0f and %.0f give the same logits",
               t->name, seed->def, other);
        fx_run_free(&r);
    }
}

/* A budget of the whole prompt (or more): one-shot policies equal the full cache. */
static void whole_budget(const fx_run *full)
{
    for (int i = 0; i < n_policies; i++) {
        if (policies[i]->kind != KVS_KIND_ONE_SHOT)
            continue;
        for (int w = 0; w < N_WHOLE; w++) {
            char spec[96];
            snprintf(spec, sizeof spec, "%s:%s", policies[i]->name, whole[w]);
            fx_run r = {.spec = spec, .threads = 2, .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            double d = max_diff(&r, full);
            CHECKF(d == 0.0, "%s: logits differ from full by %g", spec, d);
            fx_run_free(&r);
        }
    }
}

/* Chunked prefill: the same logits for full; evicting policies hold the budget, with at most
 * one chunk on top of it at any time; selection policies keep their bounds over a long decode;
 * one-shot policies keep the same slots as with one chunk (snapkv: window rows split over two
 * chunks, as 40 does not divide 352). */
static void chunked(const fx_run *full, const fx_run *quarter)
{
    fx_run r = {.spec = "full", .chunk = 64, .threads = 2, .decode = D_SWEEP};
    do_run(&r);
    check_run(&r);
    double d = max_diff(&r, full);
    printf("full, chunk 64 vs one chunk: max logit difference %.3g\n", d);
    CHECKF(d < 1e-5, "full: chunked prefill differs by %g", d);
    fx_run_free(&r);
    const size_t heads = (size_t)info.n_layers * info.n_kv_heads;
    for (int i = 0; i < n_policies; i++) {
        const kvs_policy_type *t = policies[i];
        if (t->kind == KVS_KIND_ONE_SHOT) {
            char spec[96];
            snprintf(spec, sizeof spec, "%s:budget=0.25", t->name);
            fx_run c = {.spec = spec, .chunk = 40, .threads = 2, .decode = D_SWEEP};
            do_run(&c);
            check_run(&c);
            CHECKF(fx_same_kept(&c, &quarter[i], &info), "%s: chunked prefill kept other slots",
                   spec);
            d = max_diff(&c, &quarter[i]);
            CHECKF(d < 1e-4, "%s: chunked prefill differs by %g", spec, d);
            fx_run_free(&c);
            continue;
        }
        /* evicting: a fraction and a count; selection: a fraction */
        const char *forms[] = {"budget=0.1", t->kind == KVS_KIND_EVICTING ? "slots=100" : NULL};
        for (int f = 0; f < 2 && forms[f]; f++) {
            char spec[96];
            snprintf(spec, sizeof spec, "%s:%s", t->name, forms[f]);
            fx_run c = {.spec = spec, .chunk = 64, .threads = 2, .decode = D_ALL};
            do_run(&c);
            check_run(&c);
            if (t->kind == KVS_KIND_EVICTING && c.st == KVS_OK) {
                const int B = c.budget;
                const double peak_slots = (double)c.peak_bytes / c.slot_bytes / heads;
                printf("%s, chunk 64: peak %.1f live slots per (layer, head), budget %d\n", spec,
                       peak_slots, B);
                CHECKF(c.peak_bytes <= c.slot_bytes * heads * (size_t)(B + 64),
                       "%s chunk 64: peak %zu bytes > budget + chunk", spec, c.peak_bytes);
                /* A policy that limits prompt batches (feeding tokens one at a time) makes
                 * more chunks. */
                if (!t->prompt_batch)
                    CHECKF(c.o->chunks_done[0] == PROMPT / 64, "%s: %d chunks", spec,
                           c.o->chunks_done[0]);
            }
            fx_run_free(&c);
        }
    }
}

/* F16 KV storage with the full cache, and a policy that reads keys itself from an F16 store. */
static void f16_storage(const fx_run *full)
{
    fx_run r = {.spec = "full", .kv_type = "f16", .threads = 2, .decode = D_SWEEP};
    do_run(&r);
    check_run(&r);
    /* F16 rounds keys and values to 11 significant bits (relative error <= 2^-11); over 5
     * layers this moves logits (magnitudes up to ~23) by ~3e-3 on average; the largest
     * difference grows with context, 0.06 over all 512 positions of this sample. */
    double d = max_diff(&r, full), mean = 0;
    const size_t n = (size_t)(1 + D_SWEEP) * info.n_vocab;
    for (size_t i = 0; r.logits && i < n; i++)
        mean += fabs((double)r.logits[i] - full->logits[i]) / (double)n;
    printf("full, F16 KV vs F32 KV: max logit difference %.3g, mean %.3g\n", d, mean);
    CHECKF(mean < 1e-2, "F16 KV differs from F32 by %g on average", mean);
    CHECKF(d < 0.1, "F16 KV differs from F32 by up to %g", d);
    fx_run_free(&r);
    const char *specs[] = {"tova:budget=0.1"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        fx_run p = {.spec = specs[i], .kv_type = "f16", .chunk = 64, .threads = 2,
                    .decode = D_SWEEP};
        do_run(&p);
        check_run(&p);
        fx_run_free(&p);
    }
}

/* ---- KIVI storage under every policy ---- */
/* Per (layer, KV head, position): whether the token was quantised at the last hook, and its
 * dequantised key and value then. A quantised token must dequantise to exactly the same floats
 * at every later hook it survives (eviction moves codes, never re-quantises). */
enum { KV_MAXL = 16, KV_MAXH = 16, KV_MAXD = 64 };
static signed char kq_state[KV_MAXL][KV_MAXH][N_TOK]; /* 0 unseen, 1 fp16, 2 quantised */
static float kq_kv[KV_MAXL][KV_MAXH][N_TOK][2 * KV_MAXD];

static void kivi_checks(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    named_checks(o, kv, layer, hook, newest);
    const kvs_store *st = kvs_kv_store(kv);
    const int hd = kvs_store_cfg(st)->head_dim, nh = kvs_store_cfg(st)->n_kv_heads;
    if (layer >= KV_MAXL || nh > KV_MAXH || hd > KV_MAXD)
        return;
    for (int h = 0; h < nh; h++) {
        kvs_kivi_view v;
        kvs_store_kivi_view(st, layer, h, &v);
        const int n = kvs_store_count(st, layer, h);
        const int32_t *pos = kvs_store_pos(st, layer, h);
        for (int i = 0; i < n; i++) {
            float kvv[2 * KV_MAXD];
            kvs_store_key_f32(st, layer, h, i, kvv);
            kvs_store_value_f32(st, layer, h, i, kvv + hd);
            const int p = pos[i], qk = i < v.nqk, qv = i < v.nqv;
            float *prev = kq_kv[layer][h][p];
            /* bit 0: key quantised, bit 1: value quantised, at the last look */
            const int was = kq_state[layer][h][p] - 1;
            int changed = 0;
            for (int d = 0; was >= 0 && d < hd; d++) {
                changed += (was & 1) && memcmp(&prev[d], &kvv[d], 4) != 0;
                changed += (was & 2) && memcmp(&prev[hd + d], &kvv[hd + d], 4) != 0;
            }
            if (changed)
                fx_violation(o, "quantised token at slot %d (position %d) dequantises differently "
                             "after a change", layer, h, hook, i, p);
            if (was >= 0 && (((was & 1) && !qk) || ((was & 2) && !qv)))
                fx_violation(o, "slot %d (position %d) went back to fp16", layer, h, hook, i, p);
            memcpy(prev, kvv, sizeof(float) * 2 * (size_t)hd);
            kq_state[layer][h][p] = (signed char)(1 + qk + 2 * qv);
        }
        /* Bytes exactly the live ones of §3.2 (plus 4 per key group and the positions), and
         * the groups partition the quantised keys. */
        int sum = 0, ok = 1;
        for (int g = 0; g < v.ng; g++) {
            const int gn = (g + 1 < v.ng ? v.g_first[g + 1] : v.nqk) - v.g_first[g];
            ok &= gn > 0 && v.g_first[g] == sum;
            sum += gn;
        }
        if (!ok || sum != v.nqk)
            fx_violation(o, "key groups do not partition the %d quantised keys (%d)", layer, h,
                         hook, v.nqk, sum);
    }
}

/* Total live bytes of a KIVI store recomputed from its views. */
static double kivi_view_bytes(const kvs_store *st)
{
    const kvs_store_config *c = kvs_store_cfg(st);
    double total = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            kvs_kivi_view v;
            kvs_store_kivi_view(st, l, h, &v);
            const double n = kvs_store_count(st, l, h);
            total += (double)v.nqk * v.kcode_bytes + v.ng * (4.0 * c->head_dim + 4) +
                     (n - v.nqk) * c->head_dim * 2 + (double)v.nqv * v.vrow_bytes +
                     (n - v.nqv) * c->head_dim * 2 +
                     n * (double)kvs_store_slot_bytes(st);
        }
    return total;
}

static void kivi_bytes_check(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    kivi_checks(o, kv, layer, hook, newest);
    const kvs_store *st = kvs_kv_store(kv);
    if ((double)kvs_store_bytes(st) != kivi_view_bytes(st))
        fx_violation(o, "KIVI bytes %d differ from the live arrays' %d", layer, 0, hook,
                     (int)kvs_store_bytes(st), (int)kivi_view_bytes(st));
}

/* Every policy over KIVI storage (2-bit keys, 4-bit values, R = 64 so that the 384-token
 * prompt and the decode quantise, in 64-token chunks so that flushes, evictions and appends
 * interleave): the generic invariants, quantised tokens bit-identical for as long as they
 * survive, exact bytes at every hook, and (evicting and one-shot policies) fewer bytes than
 * the full KIVI cache. */
static void kivi_storage(void)
{
    const char *kt = "kivi:kbits=2,vbits=4,group=32,residual=64";
    fx_run full = {.spec = "full", .kv_type = kt, .chunk = 64, .threads = 2, .decode = D_SWEEP,
                   .extra = kivi_bytes_check};
    memset(kq_state, 0, sizeof kq_state);
    fx_exec(&full, model, tokens);
    check_run(&full);
    for (int i = 0; i < n_policies; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25", policies[i]->name);
        if (policies[i]->kind == KVS_KIND_OFFLOADING) { /* its tiers hold F16/F32 rows */
            fx_run r = {.spec = spec, .kv_type = kt, .threads = 1, .decode = 1};
            fx_exec(&r, model, tokens);
            CHECKF(r.st != KVS_OK && strstr(r.err, "KIVI storage"), "%s on KIVI: %s", spec,
                   r.st == KVS_OK ? "accepted" : r.err);
            fx_run_free(&r);
            continue;
        }
        fx_run r = {.spec = spec, .kv_type = kt, .chunk = 64, .threads = 2, .decode = D_SWEEP,
                    .extra = kivi_bytes_check};
        memset(kq_state, 0, sizeof kq_state);
        fx_exec(&r, model, tokens);
        check_run(&r);
        CHECKF(r.o && r.o->calls > 0, "%s on KIVI: no hook observed", spec);
        /* (a selection policy keeps everything, plus its own metadata; a one-shot policy holds
         * its prompt fp16 until the prompt-end eviction, so that quantised groups form from
         * survivors: its peak is the fp16 prompt, its cache after the prompt is below full) */
        CHECKF(policies[i]->kind == KVS_KIND_SELECTION ||
                   policies[i]->kind == KVS_KIND_ONE_SHOT || r.peak_bytes < full.peak_bytes,
               "%s on KIVI: peak %zu bytes, full KIVI %zu", spec, r.peak_bytes, full.peak_bytes);
        CHECKF(policies[i]->kind == KVS_KIND_SELECTION || r.end_bytes < full.end_bytes,
               "%s on KIVI: %zu bytes at the end, full KIVI %zu", spec, r.end_bytes,
               full.end_bytes);
        fx_run_free(&r);
    }
    fx_run_free(&full);
}

/* A fresh session and one reset after a first conversation (kvs_session_reset keeps the KV
 * memory, which the next conversation writes into): the same logits, kept slots and KV bytes,
 * bit for bit. fresh: the fresh run, or NULL to make one. */
static void same_after_reset(const char *spec, const char *kv_type, int threads, const fx_run *fresh)
{
    fx_run a = {.spec = spec, .kv_type = kv_type, .threads = threads, .decode = D_SWEEP}, b = a;
    b.rerun = 1;
    if (!fresh) {
        do_run(&a);
        check_run(&a);
        fresh = &a;
    }
    do_run(&b);
    check_run(&b);
    const double d = max_diff(&b, fresh);
    CHECKF(d == 0.0 && fx_same_kept(&b, fresh, &info) && b.peak_bytes == fresh->peak_bytes &&
               b.end_bytes == fresh->end_bytes,
           "%s on %s KV after a reset: logits differ by %g, %s slots kept, peak / end bytes %zu / "
           "%zu (fresh %zu / %zu)", spec, kv_type ? kv_type : "f32", d,
           fx_same_kept(&b, fresh, &info) ? "the same" : "other", b.peak_bytes, b.end_bytes,
           fresh->peak_bytes, fresh->end_bytes);
    fx_run_free(&a);
    fx_run_free(&b);
}

/* Every policy, the full cache and the merging kind, after a first conversation of other
 * tokens, longer, and a reset: as a fresh session, on F32, F16 and KIVI storage. */
static void reset_reuses_memory(const fx_run *full, const fx_run *quarter)
{
    const char *kivi = "kivi:kbits=2,vbits=4,group=32,residual=64";
    same_after_reset("full", NULL, 1, full);
    same_after_reset("full", "f16", 1, NULL);
    same_after_reset("full", kivi, 1, NULL);
    for (int i = 0; i < n_policies; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25", policies[i]->name);
        same_after_reset(spec, NULL, 2, &quarter[i]);
        same_after_reset(spec, "f16", 1, NULL);
        if (policies[i]->kind != KVS_KIND_OFFLOADING) /* its tiers hold F16/F32 rows */
            same_after_reset(spec, kivi, 1, NULL);
    }
    for (int i = 0; i < n_merging; i++) {
        same_after_reset(merging[i]->name, "f16", 1, NULL);
        same_after_reset(merging[i]->name, "kivi4", 1, NULL);
    }
}

/* The merging kind (no budget): the generic invariants with its defaults, F16 and KIVI-4
 * storage; 1 and 2 threads bit-identical; a chunked prefill as one chunk (it merges once at the
 * prompt's end); a budget refused. */
static void merging_kind(void)
{
    static const char *const types[] = {NULL, "f16", "kivi4"};
    for (int i = 0; i < n_merging; i++) {
        const char *name = merging[i]->name;
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25", name);
        CHECKF(error_mentions(spec, "takes no budget"), "%s", spec);
        fx_run one = {.spec = name, .threads = 1, .decode = D_SWEEP};
        do_run(&one);
        check_run(&one);
        CHECKF(one.o && one.o->calls > 0, "%s: no hook observed", name);
        fx_run two = {.spec = name, .threads = 2, .decode = D_SWEEP};
        do_run(&two);
        check_run(&two);
        double d = max_diff(&one, &two);
        CHECKF(d == 0.0, "%s: 1 and 2 threads differ by %g", name, d);
        fx_run c = {.spec = name, .chunk = 40, .threads = 2, .decode = D_SWEEP};
        do_run(&c);
        check_run(&c);
        d = max_diff(&c, &one);
        CHECKF(d < 1e-4, "%s: chunked prefill differs by %g", name, d);
        for (int t = 1; t < 3; t++) {
            fx_run r = {.spec = name, .kv_type = types[t], .chunk = 64, .threads = 2,
                        .decode = D_SWEEP};
            do_run(&r);
            check_run(&r);
            fx_run_free(&r);
        }
        fx_run_free(&c);
        fx_run_free(&two);
        fx_run_free(&one);
    }
}

int main(void)
{
    char msg[512];
    kvs_error err = {0};
    CHECKF(fx_load(tokens, N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return check_summary("policies");

    int n_types = 0;
    const kvs_policy_type *const *types = kvs_policy_types(&n_types);
    for (int i = 0; i < n_types; i++)
        if (kvs_policy_kind_has_budget(types[i]->kind) &&
            n_policies < (int)(sizeof policies / sizeof *policies))
            policies[n_policies++] = types[i];
        else if (types[i]->kind == KVS_KIND_MERGING &&
                 n_merging < (int)(sizeof merging / sizeof *merging))
            merging[n_merging++] = types[i];
    CHECKF(n_policies + n_merging == n_types - 1, "%d registered policies, %d with a budget, %d "
           "merging", n_types, n_policies, n_merging);
    printf("%d registered policies:", n_types);
    for (int i = 0; i < n_types; i++)
        printf(" %s", types[i]->name);
    printf("\n");

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
    /* Budgets a policy cannot honour fail at the prompt's start, naming the spec. */
    CHECK(start_fails("streaming:slots=4", "streaming:slots=4"));
    CHECK(start_fails("h2o:slots=1000", "exceeds the context of 512"));
    CHECK(start_fails("snapkv:budget=0.1,kernel=4", "kernel=4 must be odd"));
    CHECK(start_fails("quest:budget=0.1,dense_layers=9", "dense_layers=9 exceeds"));
    /* Every policy: a budget parses, none is refused, more slots than the context fail. */
    for (int i = 0; i < n_policies; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "%s:budget=0.25", policies[i]->name);
        CHECKF(kvs_kv_policy_check(spec, &err) == KVS_OK, "%s: %s", spec, err.msg);
        CHECKF(error_mentions(policies[i]->name, "needs budget"), "%s without a budget",
               policies[i]->name);
        snprintf(spec, sizeof spec, "%s:slots=1000", policies[i]->name);
        CHECKF(start_fails(spec, "exceeds the context of 512"), "%s", spec);
    }

    /* The reference. */
    fx_run full = {.spec = "full", .decode = D_SWEEP};
    do_run(&full);
    check_run(&full);

    fx_run quarter[sizeof policies / sizeof *policies];
    sweep(quarter);
    threads_identical(&full, quarter);
    seeds_differ(quarter);
    whole_budget(&full);
    chunked(&full, quarter);
    f16_storage(&full);
    kivi_storage();
    merging_kind();
    reset_reuses_memory(&full, quarter);

    for (int i = 0; i < n_policies; i++)
        fx_run_free(&quarter[i]);
    fx_run_free(&full);
    kvs_model_free(model);
    return check_summary("policies");
}
