/* Allocation failures: this program replaces the C allocator (malloc, calloc, realloc, free and
 * the aligned forms, which glibc lets a program define; they forward to glibc's __libc_*
 * functions) with one that can fail the N-th allocation, and runs short workloads through the
 * public API for N = 1 .. (every allocation the workload makes):
 *
 *   run     load the model, tokenize, a session with 2 threads, a prompt, sampled decode steps
 *   eval    the eval harness (src/eval): the full-cache reference, then one policy
 *   policy  every registered policy (kvs_policy_types), chunked prompt then decode steps
 *
 * Every failure must end in a clean error (KVS_ERR_NOMEM, with a message saying out of memory),
 * without a crash, a failed assertion (the library is compiled here without NDEBUG, so
 * KVS_ASSERT checks the store's invariants after every change) or a leak: the interposer counts
 * live blocks, and after everything is freed the count must be back where it started. A session
 * still alive after a failed call must hold no more than its budget, and must then work: the
 * same tokens give the same logits as a run without failures. A workload that succeeds despite
 * the failure (an optional allocation, such as giving memory back) must give the same results.
 *
 * Built without sanitizers only (ASan has its own allocator), see CMakeLists.txt. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../check.h"
#include "engine/session_internal.h"
#include "eval/eval.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "kvslim.h"

/* ---- the allocator ---- */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static atomic_long fail_at;   /* the allocation (1-based, since arming) to fail; 0: none */
static atomic_long n_allocs;  /* allocation calls since arming */
static atomic_long n_live;    /* blocks allocated and not freed */
static atomic_int injected;   /* the failure happened */
static atomic_int armed;      /* counting (and failing) allocations */

static int fail_now(void)
{
    if (!atomic_load(&armed))
        return 0;
    long k = atomic_fetch_add(&n_allocs, 1) + 1;
    if (k != atomic_load(&fail_at))
        return 0;
    atomic_store(&injected, 1);
    errno = ENOMEM;
    return 1;
}

static void *counted(void *p)
{
    if (p)
        atomic_fetch_add(&n_live, 1);
    return p;
}

void *malloc(size_t n) { return fail_now() ? NULL : counted(__libc_malloc(n)); }
void *calloc(size_t n, size_t size) { return fail_now() ? NULL : counted(__libc_calloc(n, size)); }

void free(void *p)
{
    if (p)
        atomic_fetch_sub(&n_live, 1);
    __libc_free(p);
}

void *realloc(void *p, size_t n)
{
    if (!p)
        return malloc(n);
    if (n == 0) { /* glibc frees the block */
        free(p);
        return NULL;
    }
    return fail_now() ? NULL : __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n * size);
}

void *memalign(size_t align, size_t n)
{
    return fail_now() ? NULL : counted(__libc_memalign(align, n));
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) / 4096 * 4096); }

int posix_memalign(void **out, size_t align, size_t n)
{
    void *p = memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

static void arm(long n)
{
    atomic_store(&n_allocs, 0);
    atomic_store(&injected, 0);
    atomic_store(&fail_at, n);
    atomic_store(&armed, 1);
}

static void disarm(void) { atomic_store(&armed, 0); }

/* The allocation the current pass fails (0: none); workloads arm with it once their own buffers
 * are allocated. */
static long target;

/* ---- shared data ---- */
enum { N_TOK = 48, DECODE = 4, EVAL_TOK = 24, EVAL_PROMPT = 16 };

/* A policy workload: the spec, then session settings and the tokens fed. */
typedef struct pcase {
    const char *spec;
    const char *kv_type; /* NULL: f32 */
    int n_ctx;           /* 0: the model's */
    int prompt, decode;  /* prompt + decode <= N_TOK */
} pcase;

static char model_path[1024];
static int32_t tokens[N_TOK];
static kvs_model *model; /* for the policy and eval workloads (loaded unarmed) */
static int vocab;

static int read_tokens(const char *path, int32_t *out, int max)
{
    return check_read_tokens(path, out, max); /* int32_t is int on every supported target */
}

/* A failure must be KVS_ERR_NOMEM and say so. */
static int clean_error(kvs_status st, const char *msg)
{
    return st == KVS_ERR_NOMEM && strstr(msg, "out of memory");
}

/* What a workload reports of one pass. */
typedef struct outcome {
    kvs_status st;
    char msg[512];
    float *logits; /* the workload's result, compared between passes; malloc'd */
    size_t n_logits;
    int32_t sampled[DECODE];
    int over_budget;   /* a session alive after a failed call held more than its budget */
    int retry_differs; /* ... and the same tokens afterwards did not give the reference */
} outcome;

static void outcome_free(outcome *o)
{
    free(o->logits);
    memset(o, 0, sizeof *o);
}

/* ---- workloads ---- */

/* The largest slot count of any head of a session's cache. */
static int most_slots(kvs_session *s)
{
    const kvs_store *st = kvs_kv_store(kvs_session_kv(s));
    const kvs_store_config *c = kvs_store_cfg(st);
    int most = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++)
            most = kvs_store_count(st, l, h) > most ? kvs_store_count(st, l, h) : most;
    return most;
}

/* Prompt then decode steps, teacher-forced; the logits of the last prompt token and of every
 * step go to out (1 + c->decode rows). */
static kvs_status feed(const pcase *c, kvs_session *s, float *out, kvs_error *err)
{
    kvs_status st = kvs_session_eval(s, tokens, c->prompt, out, 0, err);
    for (int t = 0; t < c->decode && st == KVS_OK; t++)
        st = kvs_session_eval(s, tokens + c->prompt + t, 1, out + (size_t)(t + 1) * vocab, 0,
                              err);
    return st;
}

/* One policy: a session with small prompt chunks (several prefill_chunk calls), then the
 * prompt and decode steps. ref: a pass without failures, for the retry check. */
static void policy_pass(const pcase *c, const outcome *ref, outcome *o)
{
    kvs_error err = {0};
    kvs_session_params p = kvs_session_default_params();
    p.kv_policy = c->spec;
    p.kv_type = c->kv_type;
    p.n_ctx = c->n_ctx;
    p.chunk = 16;
    kvs_session *s = NULL;
    o->n_logits = (size_t)(1 + c->decode) * vocab;
    disarm();
    o->logits = calloc(o->n_logits, sizeof(float));
    float *again = calloc(o->n_logits, sizeof(float));
    arm(target);
    o->st = kvs_session_new(model, &p, &s, &err);
    if (o->st == KVS_OK)
        o->st = feed(c, s, o->logits, &err);
    disarm();
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    if (s && o->st != KVS_OK) {
        /* A failed call leaves the session empty (kvs_session_eval's contract), so within its
         * budget, and usable: the same tokens then give the reference logits. */
        const kvs_policy *pol = kvs_kv_policy(kvs_session_kv(s));
        if ((pol->type->kind == KVS_KIND_EVICTING && most_slots(s) > pol->budget) ||
            kvs_session_kv_bytes(s) != 0 || kvs_session_n_past(s) != 0)
            o->over_budget = 1;
        if (ref) {
            kvs_error e2 = {0};
            if (feed(c, s, again, &e2) != KVS_OK ||
                memcmp(again, ref->logits, sizeof(float) * o->n_logits))
                o->retry_differs = 1;
        }
    }
    kvs_session_free(s);
    free(again);
}

static const pcase *g_case; /* the policy workload's case */
static void wl_policy(const outcome *ref, outcome *o) { policy_pass(g_case, ref, o); }

/* `kvslim run` through the public API: load, tokenize, 2 threads, prompt, sampled steps. */
static void wl_run(const outcome *ref, outcome *o)
{
    (void)ref;
    kvs_error err = {0};
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    kvs_sampler *smp = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    disarm();
    o->n_logits = (size_t)vocab;
    o->logits = calloc(o->n_logits, sizeof(float));
    arm(target);
    kvs_status st = kvs_model_load(model_path, &m, &err);
    if (st == KVS_OK)
        st = kvs_tokenize(m, "Once upon a time, there was a little girl named Lily.", 1, &ids,
                          &n_ids, &err);
    kvs_session_params p = kvs_session_default_params();
    p.n_threads = 2;
    p.kv_policy = "h2o:budget=0.5";
    if (st == KVS_OK)
        st = kvs_session_new(m, &p, &s, &err);
    kvs_sampler_params sp = kvs_sampler_default_params();
    if (st == KVS_OK)
        st = kvs_sampler_new(vocab, &sp, &smp, &err);
    if (st == KVS_OK)
        st = kvs_session_eval(s, ids, n_ids, o->logits, 0, &err);
    for (int t = 0; t < DECODE && st == KVS_OK; t++) {
        int32_t tok = kvs_sampler_sample(smp, o->logits);
        o->sampled[t] = tok;
        st = kvs_session_eval(s, &tok, 1, o->logits, 0, &err);
    }
    disarm();
    o->st = st;
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    if (s && st != KVS_OK) {
        const kvs_policy *pol = kvs_kv_policy(kvs_session_kv(s));
        if (most_slots(s) > pol->budget)
            o->over_budget = 1;
    }
    kvs_sampler_free(smp);
    kvs_session_free(s);
    free(ids);
    kvs_model_free(m);
}

/* The eval harness: reference, then one policy; the result's metrics are the outcome. */
static void wl_eval(const outcome *ref, outcome *o)
{
    (void)ref;
    kvs_error err = {0};
    kvs_eval_setup setup = {.tokens = tokens, .n_tokens = EVAL_TOK, .prompt_len = EVAL_PROMPT,
                            .n_threads = 1, .chunk = 8};
    kvs_eval_ref er;
    memset(&er, 0, sizeof er);
    kvs_eval_result r0, r1;
    memset(&r0, 0, sizeof r0);
    memset(&r1, 0, sizeof r1);
    disarm();
    o->n_logits = 6;
    o->logits = calloc(o->n_logits, sizeof(float));
    arm(target);
    kvs_status st = kvs_eval_reference(model, &setup, &er, &r0, &err);
    if (st == KVS_OK)
        st = kvs_eval_policy(model, &setup, &er, "snapkv:budget=0.5", &r1, &err);
    disarm();
    o->st = st;
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
    if (st == KVS_OK) { /* wall time aside, every number of the row */
        o->logits[0] = (float)r1.kl;
        o->logits[1] = (float)r1.top1;
        o->logits[2] = (float)r1.ppl;
        o->logits[3] = (float)r1.attn_recall;
        o->logits[4] = (float)r1.kv_bytes;
        o->logits[5] = (float)r1.slots_kept;
    }
    kvs_eval_ref_free(&er);
}

/* ---- the slot store alone ---- */

enum { ST_HEADS = 3, ST_HD = 8, ST_MAX = 256 };

/* What a head holds, to compare before and after a failed operation. */
typedef struct store_view {
    int count[ST_HEADS];
    int32_t pos[ST_HEADS][ST_MAX];
    float key[ST_HEADS][ST_MAX][ST_HD], meta[ST_HEADS][ST_MAX];
} store_view;

static void view(kvs_store *s, store_view *v)
{
    memset(v, 0, sizeof *v);
    for (int h = 0; h < ST_HEADS; h++) {
        v->count[h] = kvs_store_count(s, 0, h);
        for (int i = 0; i < v->count[h]; i++) {
            v->pos[h][i] = kvs_store_pos(s, 0, h)[i];
            kvs_store_key_f32(s, 0, h, i, v->key[h][i]);
            v->meta[h][i] = kvs_store_meta(s, 0, h, 1)[i];
        }
    }
}

/* Appends n tokens at positions from next on, with keys and values made from the position. A
 * failure must be out of memory and leave every head as it was; then the append is retried (the
 * allocator fails once). Returns 0 if the failure was not clean. */
static int store_add(kvs_store *s, int n, int32_t *next, store_view *before, store_view *after)
{
    float k[ST_MAX * ST_HEADS * ST_HD], v[ST_MAX * ST_HEADS * ST_HD];
    int32_t pos[ST_MAX];
    for (int i = 0; i < n; i++) {
        pos[i] = *next + 2 * i; /* gaps: positions are not slot indices */
        for (int j = 0; j < ST_HEADS * ST_HD; j++)
            k[i * ST_HEADS * ST_HD + j] = v[i * ST_HEADS * ST_HD + j] = (float)(pos[i] * 100 + j);
    }
    kvs_error err = {0};
    int clean = 1;
    view(s, before);
    kvs_status st = kvs_store_append(s, 0, n, k, v, pos, &err);
    if (st != KVS_OK) {
        view(s, after);
        clean = st == KVS_ERR_NOMEM && !memcmp(before, after, sizeof *before);
        st = kvs_store_append(s, 0, n, k, v, pos, &err);
    }
    for (int h = 0; h < ST_HEADS && st == KVS_OK; h++) /* mark the new slots' metadata */
        for (int i = kvs_store_count(s, 0, h) - n; i < kvs_store_count(s, 0, h); i++)
            kvs_store_meta(s, 0, h, 1)[i] = (float)kvs_store_pos(s, 0, h)[i];
    *next += 2 * n;
    return clean && st == KVS_OK;
}

/* Keeps every step-th slot of each head (from slot h, so the heads differ). */
static void store_thin(kvs_store *s, int step)
{
    int keep[ST_MAX];
    for (int h = 0; h < ST_HEADS; h++) {
        int n = 0, count = kvs_store_count(s, 0, h);
        for (int i = h % step; i < count; i += step)
            keep[n++] = i;
        kvs_store_keep(s, 0, h, keep, n);
    }
}

/* Grows the store token by token and in batches, shrinks it (giving memory back), removes
 * slots and grows it again; the final contents go to out. Returns 0 if a failure was not clean
 * (status, or a head changed by a failed append). */
static int store_workload(store_view *out, store_view *scratch)
{
    memset(out, 0, sizeof *out);
    kvs_store_config cfg = {1, ST_HEADS, ST_HD, ST_MAX, KVS_F32, 2};
    kvs_store *s = kvs_store_new(&cfg);
    if (!s)
        return 1; /* a clean failure to create */
    int32_t next = 0;
    int clean = 1;
    for (int t = 0; t < 60; t++)
        clean &= store_add(s, 1, &next, out, scratch);
    store_thin(s, 5); /* 60 -> 12: far below the slack, so it shrinks */
    clean &= store_add(s, 3, &next, out, scratch);
    for (int h = 0; h < ST_HEADS; h++)
        kvs_store_remove(s, 0, h, 0);
    for (int t = 0; t < 20; t++)
        clean &= store_add(s, 1, &next, out, scratch);
    store_thin(s, 4);
    clean &= store_add(s, 90, &next, out, scratch);
    store_thin(s, 7);
    for (int t = 0; t < 10; t++)
        clean &= store_add(s, 1, &next, out, scratch);
    view(s, out);
    kvs_store_free(s);
    return clean;
}

/* The store under every single allocation failure: each failed append is clean and retried, so
 * the final contents equal those of a run without failures. */
static long store_sweep(void)
{
    static store_view ref, got, a, b;
    long live0 = atomic_load(&n_live);
    arm(0);
    CHECK(store_workload(&ref, &a));
    disarm();
    long count = atomic_load(&n_allocs), covered = 0;
    CHECK(atomic_load(&n_live) == live0);
    for (long n = 1; n <= count; n++) {
        arm(n);
        int clean = store_workload(&got, &a);
        disarm();
        covered++;
        CHECKF(clean, "store: allocation %ld failed: not all-or-nothing", n);
        CHECKF(!memcmp(&got, &ref, sizeof ref) || got.count[0] + got.count[1] == 0,
               "store: allocation %ld failed: the contents differ from a run without failures",
               n);
        CHECKF(atomic_load(&n_live) == live0, "store: allocation %ld failed: %ld blocks leaked",
               n, atomic_load(&n_live) - live0);
        (void)b;
    }
    printf("%-48s %5ld allocations, %5ld failure points covered\n", "kv store", count, covered);
    return covered;
}

/* ---- the sweep ---- */

typedef void (*workload)(const outcome *ref, outcome *o);

/* Runs w once without failures (the reference and the allocation count), then fails each N in
 * 1..count (every N when step is 1, else every step-th plus the last few). Returns the number of
 * N covered. */
static long sweep(const char *name, workload w, long step)
{
    outcome ref;
    memset(&ref, 0, sizeof ref);
    target = 0; /* a first pass for what the C library allocates once (stdio, threads) */
    w(NULL, &ref);
    outcome_free(&ref);
    long live0 = atomic_load(&n_live);
    target = 0;
    w(NULL, &ref);
    long count = atomic_load(&n_allocs);
    CHECKF(ref.st == KVS_OK, "%s: fails without an injected failure: %s", name, ref.msg);
    long leaked0 = atomic_load(&n_live) - live0 - 1; /* ref.logits is still held */
    CHECKF(leaked0 == 0, "%s: %ld blocks leaked without a failure", name, leaked0);
    if (ref.st != KVS_OK) {
        outcome_free(&ref);
        return 0;
    }
    long covered = 0, bad = 0;
    for (long n = 1; n <= count; n += (n + 8 > count ? 1 : step)) {
        outcome o;
        memset(&o, 0, sizeof o);
        long live = atomic_load(&n_live);
        target = n;
        w(&ref, &o);
        disarm();
        covered++;
        long leaked = atomic_load(&n_live) - live - 1;
        int ok = 1;
        if (o.st == KVS_OK) {
            /* Succeeded although an allocation failed: only if nothing changed. */
            ok = o.n_logits == ref.n_logits &&
                 !memcmp(o.logits, ref.logits, sizeof(float) * o.n_logits) &&
                 !memcmp(o.sampled, ref.sampled, sizeof o.sampled);
            CHECKF(ok, "%s: allocation %ld failed, the call succeeded, the results differ", name,
                   n);
        } else {
            if (getenv("ALLOC_FAIL_VERBOSE")) /* every message, to read them */
                printf("  %s: allocation %ld: %s: %s\n", name, n, kvs_status_name(o.st), o.msg);
            CHECKF((ok = clean_error(o.st, o.msg)), "%s: allocation %ld failed: status %s, '%s'",
                   name, n, kvs_status_name(o.st), o.msg);
        }
        CHECKF(leaked == 0 || (ok = 0), "%s: allocation %ld failed: %ld blocks leaked (%s)", name,
               n, leaked, o.msg);
        CHECKF(!o.over_budget || (ok = 0),
               "%s: allocation %ld failed: the session is not empty (or over budget) (%s)", name,
               n, o.msg);
        CHECKF(!o.retry_differs || (ok = 0),
               "%s: allocation %ld failed (%s): the session afterwards gives other logits", name,
               n, o.msg);
        bad += !ok;
        outcome_free(&o);
        if (bad >= 5) {
            fprintf(stderr, "%s: stopping after 5 bad cases\n", name);
            break;
        }
    }
    printf("%-48s %5ld allocations, %5ld failure points covered%s\n", name, count, covered,
           step > 1 ? " (sampled)" : "");
    outcome_free(&ref);
    return covered;
}

/* Scenarios whose name contains argv[1] (all without it). */
static const char *only;

static int wanted(const char *name) { return !only || strstr(name, only); }

int main(int argc, char **argv)
{
    only = argc > 1 ? argv[1] : NULL;
    char path[1024];
    check_shared_path(model_path, sizeof model_path, "models/gguf/stories260K-f32.gguf");
    int n = read_tokens(check_shared_path(path, sizeof path,
                                          "models/golden/stories260K-sample-512.tokens"),
                        tokens, N_TOK);
    kvs_error err = {0};
    if (n != N_TOK || kvs_model_load(model_path, &model, &err) != KVS_OK) {
        fprintf(stderr, "cannot load the test data: %s\n", err.msg);
        return 1;
    }
    kvs_model_info info;
    kvs_model_get_info(model, &info);
    vocab = info.n_vocab;
    printf("allocation failures, one at a time:\n"); /* stdout's buffer before any counting */
    fflush(stdout);

    long total = wanted("kv store") ? store_sweep() : 0;
    if (wanted("run"))
        total += sweep("run (load, tokenize, h2o, sample)", wl_run, 1);
    if (wanted("eval"))
        total += sweep("eval (reference + snapkv)", wl_eval, 1);
    /* Every registered policy, at half the prompt: evicting ones trim during the prompt (chunks
     * of 16) and every decode step. */
    int n_types;
    const kvs_policy_type *const *types = kvs_policy_types(&n_types);
    for (int i = 0; i < n_types; i++) {
        char spec[96], name[128];
        snprintf(spec, sizeof spec, "%s%s", types[i]->name,
                 kvs_policy_kind_has_budget(types[i]->kind) ? ":budget=0.5" : "");
        snprintf(name, sizeof name, "policy %s", spec);
        pcase c = {spec, NULL, 0, 40, DECODE};
        g_case = &c;
        if (wanted(name))
            total += sweep(name, wl_policy, 1);
    }
    /* An F16 cache, and position shifting past a small context (kvs_kv_shift, the policies'
     * shift hooks). */
    static const pcase more[] = {
        {"h2o:budget=0.5", "f16", 0, 40, DECODE},
        {"streaming:slots=12,shift=on", NULL, 24, 16, 24},
        {"hashevict:slots=16,shift=on", NULL, 32, 20, 28},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "policy %s%s%s, context %d", more[i].spec,
                 more[i].kv_type ? ", " : "", more[i].kv_type ? more[i].kv_type : "",
                 more[i].n_ctx);
        g_case = &more[i];
        if (wanted(name))
            total += sweep(name, wl_policy, 1);
    }
    printf("%ld failure points in all\n", total);
    kvs_model_free(model);
    return check_summary("test_alloc_fail");
}
