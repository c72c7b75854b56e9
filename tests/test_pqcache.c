/* PQCache as a policy (pqcache.md §7 tests 10-17 and the bad input), on stories260K
 * (sample-512, prompt 384, teacher-forced, F32 KV unless said): the full-budget equivalence,
 * the attended set after every decode step (initial, local and current tokens always, the
 * middle ones unique and in the middle, exactly k of them), the window invariant, the block
 * cache byte-identical to the slow tier with hits + misses = k, the accounting of codes and
 * fetches, clustering awaited at once equal to clustering overlapped, the exact top-k (scores=
 * exact) attending what an exact ranking picks, a file tier equal to the memory tier, and the
 * errors of bad parameters and tier paths. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "policies/pqcache_internal.h"
#include "policy_check.h"

enum { PROMPT = FX_PROMPT, DECODE = 24 };

static int32_t tokens[FX_N_TOK];
static kvs_model *model;
static kvs_model_info info;

/* What the observer saw (one run at a time). */
static struct {
    long steps, bad_set, bad_window, bad_cache, bad_count;
    char first[256];
    int sync;          /* wait for each layer's clustering as soon as it is queued */
    double hits, misses, fetched, code_bytes, code_expect;
    int k, n_local, n_init;
} seen;

static void note(const char *what, long *counter, int layer, int a, int b)
{
    if ((*counter)++ == 0 && !seen.first[0])
        snprintf(seen.first, sizeof seen.first, "layer %d: %s (%d, %d)", layer, what, a, b);
}

/* The attended positions of every KV head: initial tokens [0, n_init), then unique middle
 * positions in [n_init, first local), then every local token and the current one; exactly
 * n_init + min(k, middle) + local + 1. */
static void check_attended(pq_state *s, const kvs_kv *kv, int layer, int newest)
{
    const kvs_policy *p = kvs_kv_policy(kv);
    const int mid_then = s->layers[layer].att_mid; /* the middle when the step selected */
    const int local_first = s->n_init + mid_then;
    for (int h = 0; h < s->nkv; h++) {
        const int32_t *pos = NULL;
        const int n = p->type->attended_positions(p, layer, h, &pos);
        int i = 0;
        for (; i < s->n_init; i++)
            if (i >= n || pos[i] != i)
                return note("initial token missing", &seen.bad_set, layer, i, i < n ? pos[i] : -1);
        int mids = 0;
        for (; i < n && pos[i] < local_first; i++, mids++)
            if (pos[i] < s->n_init || (i > 0 && pos[i] <= pos[i - 1]))
                return note("middle position out of order", &seen.bad_set, layer, i, pos[i]);
        const int want_mid = mid_then < s->k ? mid_then : s->k;
        if (mids != want_mid)
            note("middle tokens attended vs min(k, middle)", &seen.bad_count, layer, mids,
                 want_mid);
        for (int q = local_first; q <= newest; q++, i++)
            if (i >= n || pos[i] != q)
                return note("local or current token missing", &seen.bad_set, layer, q,
                            i < n ? pos[i] : -1);
        if (i != n)
            note("attended more than init + middle + local + current", &seen.bad_set, layer, i, n);
    }
}

/* Every resident block of the cache equals the slow tier's copy of its positions. */
static void check_cache(pq_state *s, int layer)
{
    pq_layer *L = &s->layers[layer];
    const size_t bb = (size_t)s->nkv * PQ_BLOCK * s->rec;
    kvs_error werr = {0}; /* the worker copies new blocks in: wait as the next step would */
    if (pq_worker_wait_fill(s, layer, &werr) != KVS_OK)
        note("cache fill failed", &seen.bad_cache, layer, 0, 0);
    char *buf = malloc(bb);
    for (int b = 0; buf && b * PQ_BLOCK < L->n_mid; b++) {
        const int slot = kvs_blocks_lookup(L->blocks, b);
        if (slot < 0)
            continue;
        kvs_error err = {0};
        for (int h = 0; h < s->nkv; h++)
            if (pq_tier_read_locked(s, layer, h, b * PQ_BLOCK, PQ_BLOCK,
                                    buf + (size_t)h * PQ_BLOCK * s->rec, &err) != KVS_OK)
                note("tier read failed", &seen.bad_cache, layer, b, 0);
        if (memcmp(buf, L->arena[slot], bb))
            note("cached block differs from the slow tier", &seen.bad_cache, layer, b, slot);
    }
    free(buf);
}

static void extra(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    (void)o;
    const kvs_policy *p = kvs_kv_policy(kv);
    pq_state *s = p->state;
    if (!s)
        return;
    seen.k = s->k, seen.n_local = s->n_local, seen.n_init = s->n_init;
    if (!strcmp(hook, "prefill_end") && seen.sync) {
        kvs_error err = {0};
        if (pq_worker_wait(s, layer, &err) != KVS_OK)
            note("synchronous clustering failed", &seen.bad_cache, layer, 0, 0);
    }
    if (strcmp(hook, "attend"))
        return;
    const pq_layer *L = &s->layers[layer];
    seen.steps++;
    check_attended(s, kv, layer, newest);
    check_cache(s, layer);
    /* the window invariant: initial + local tokens in the store, the rest offloaded */
    for (int h = 0; h < s->nkv; h++) {
        const int n = kvs_store_count(kvs_kv_store(kv), layer, h);
        const int want = s->n_init + (s->n_local < newest + 1 - s->n_init ? s->n_local
                                                                          : newest + 1 - s->n_init);
        if (n != want)
            note("store holds vs initial + local", &seen.bad_window, layer, n, want);
    }
    seen.code_expect += (double)s->nkv * s->m * L->att_mid * s->bits / 8.0;
    /* the memory beyond the store is counted: a code byte per sub-space of every coded
     * token, the centroids, every resident cache block (all KV heads, key and value), and the
     * slow tier's records when it is memory */
    size_t want = 0;
    for (int l = 0; l < s->L && !kvs_tier_is_file(s->tier); l++)
        want += (size_t)s->layers[l].n_mid * s->nkv * s->rec;
    for (int l = 0; l < s->L; l++) {
        const pq_layer *Ll = &s->layers[l];
        if (Ll->indexed)
            want += (size_t)s->nkv * s->m * (size_t)Ll->n_codes +
                    sizeof(float) * (size_t)s->nkv * ((size_t)1 << s->bits) * (size_t)s->hd;
        want += (size_t)kvs_blocks_resident(Ll->blocks) * s->nkv * PQ_BLOCK * s->rec;
    }
    if (p->type->state_bytes(p) != want)
        note("state bytes vs codes + centroids + cache blocks", &seen.bad_cache, layer,
             (int)p->type->state_bytes(p), (int)want);
    if (L->indexed && L->n_codes < L->n_mid)
        note("a middle token without a code", &seen.bad_window, layer, L->n_codes, L->n_mid);
}

/* Totals of the last run's layers (read at the last hook, before the session is freed). */
static void totals(const kvs_kv *kv)
{
    pq_state *s = kvs_kv_policy(kv)->state;
    seen.hits = seen.misses = seen.fetched = seen.code_bytes = 0;
    for (int l = 0; l < s->L; l++) {
        seen.hits += s->layers[l].hits;
        seen.misses += s->layers[l].misses;
        seen.fetched += s->layers[l].fetched_bytes;
        seen.code_bytes += s->layers[l].code_bytes;
    }
}

static void extra_totals(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    extra(o, kv, layer, hook, newest);
    if (kvs_kv_policy(kv)->state && !strcmp(hook, "attend"))
        totals(kv);
}

static void run(fx_run *r, const char *spec, const char *kv_type, int threads)
{
    memset(&seen, 0, sizeof seen);
    *r = (fx_run){.spec = spec, .kv_type = kv_type, .threads = threads, .decode = DECODE,
                  .extra = extra_totals};
    fx_exec(r, model, tokens);
    CHECKF(r->st == KVS_OK, "%s: %s", spec, r->err);
    CHECKF(r->o && r->o->violations == 0, "%s: %ld hook violations, first: %s", spec,
           r->o ? r->o->violations : -1, r->o ? r->o->first : "");
    CHECKF(r->loop_violations == 0, "%s: decode violations, first: %s", spec, r->loop_first);
    CHECKF(seen.bad_set == 0 && seen.bad_count == 0 && seen.bad_window == 0 &&
               seen.bad_cache == 0,
           "%s: attended set %ld, count %ld, window %ld, cache %ld violations; first: %s", spec,
           seen.bad_set, seen.bad_count, seen.bad_window, seen.bad_cache, seen.first);
}

/* §7 test 12: k at least every middle token (k = the context) equals the dense cache up to
 * summation order, with the same greedy tokens; the spec's budget=1.0 is not enough. */
static void full_budget(const fx_run *full)
{
    fx_run r;
    run(&r, "pqcache:budget=1.0,k=512", "f32", 2);
    const double d = fx_max_diff(&r, full, info.n_vocab);
    printf("pqcache k=512 vs full: max logit difference %.3g\n", d);
    CHECKF(d <= 1e-4, "k >= middle: logits differ from the full cache by %g", d);
    int same = 1;
    for (int t = 0; t <= DECODE; t++)
        same &= fx_argmax(r.logits + (size_t)t * info.n_vocab, info.n_vocab) ==
                fx_argmax(full->logits + (size_t)t * info.n_vocab, info.n_vocab);
    CHECK(same);
    fx_run_free(&r);
}

/* §7 tests 10, 11, 14, 15, 17 at the spec's defaults (budget 0.25: k = local = 44 of 352),
 * with a small block cache so that blocks come and go. */
static void invariants(void)
{
    fx_run r;
    run(&r, "pqcache:budget=0.25,cache=256,kcache=2", "f32", 2);
    printf("pqcache budget 0.25: k %d, local %d, init %d; %ld layer steps, hits %.0f, misses "
           "%.0f, %.0f bytes fetched\n", seen.k, seen.n_local, seen.n_init, seen.steps,
           seen.hits, seen.misses, seen.fetched);
    CHECK(seen.k == 44 && seen.n_local == 44 && seen.n_init == 32);
    CHECKF(seen.steps == (long)DECODE * info.n_layers, "%ld attend hooks", seen.steps);
    /* every selected token is a hit or a miss; k per KV head per step */
    CHECKF(seen.hits + seen.misses == (double)seen.steps * info.n_kv_heads * seen.k,
           "hits %.0f + misses %.0f vs steps x heads x k", seen.hits, seen.misses);
    CHECK(seen.hits > 0 && seen.misses > 0);
    const size_t rec = 2 * (size_t)(info.dim / info.n_heads) * 4;
    CHECKF(seen.fetched >= seen.misses * rec, "fetched %.0f bytes for %.0f misses", seen.fetched,
           seen.misses);
    CHECKF(fabs(seen.code_bytes - seen.code_expect) < 1e-6, "code bytes %.1f vs h_kv m s b/8 "
           "summed %.1f", seen.code_bytes, seen.code_expect);
    fx_run_free(&r);
}

/* §7 test 16: clustering awaited as soon as it is queued gives the overlapped result, bit for
 * bit; so do 1 and 2 threads and F16 storage runs its own. */
static void async_equivalence(void)
{
    fx_run a, b;
    run(&a, "pqcache:budget=0.25", "f16", 2);
    memset(&seen, 0, sizeof seen);
    seen.sync = 1;
    b = (fx_run){.spec = "pqcache:budget=0.25", .kv_type = "f16", .threads = 1,
                 .decode = DECODE, .extra = extra};
    fx_exec(&b, model, tokens);
    CHECKF(b.st == KVS_OK, "%s", b.err);
    const double d = fx_max_diff(&a, &b, info.n_vocab);
    CHECKF(d == 0.0, "synchronous clustering (1 thread) vs overlapped (2 threads): %g", d);
    fx_run_free(&a);
    fx_run_free(&b);
}

/* Recall of the exact top-k over the layers of the last run (measure=on), read at its last
 * attend hook; and the mean share k / middle a random choice would get. */
static double rec_sum, rec_steps, rand_share, rand_n;

static void recall_totals(fx_obs *o, const kvs_kv *kv, int layer, const char *hook, int newest)
{
    extra(o, kv, layer, hook, newest);
    pq_state *s = kvs_kv_policy(kv)->state;
    if (!s || strcmp(hook, "attend"))
        return;
    rec_sum = rec_steps = 0;
    for (int l = 0; l < s->L; l++) {
        rec_sum += s->layers[l].recall_sum;
        rec_steps += s->layers[l].recall_steps;
    }
    rand_share += (double)s->k / s->layers[layer].att_mid;
    rand_n++;
}

static double measured_recall(const char *spec)
{
    memset(&seen, 0, sizeof seen);
    rec_sum = rec_steps = rand_share = rand_n = 0;
    fx_run r = {.spec = spec, .kv_type = "f32", .threads = 2, .decode = DECODE,
                .extra = recall_totals};
    fx_exec(&r, model, tokens);
    CHECKF(r.st == KVS_OK, "%s: %s", spec, r.err);
    fx_run_free(&r);
    return rec_steps > 0 ? rec_sum / rec_steps : 0;
}

/* §7 test 9: on the model's own keys and queries, PQ selection finds the exact top-k far more
 * often than a random choice of k middle tokens would (k / middle), and more of it with more
 * bits per code. */
static void rank_quality(void)
{
    const double r2 = measured_recall("pqcache:budget=0.1,measure=on,bits=2");
    const double chance = rand_n > 0 ? rand_share / rand_n : 1;
    const double r6 = measured_recall("pqcache:budget=0.1,measure=on");
    const double r8 = measured_recall("pqcache:budget=0.1,measure=on,m=4,bits=8");
    printf("recall of the exact top-k at budget 0.1: random %.3f, b=2 %.3f, b=6 %.3f, "
           "m=4 b=8 %.3f\n", chance, r2, r6, r8);
    CHECKF(r6 > 5 * chance, "PQ recall %.3f vs random %.3f", r6, chance);
    CHECKF(r2 < r6 && r6 < r8, "recall does not rise with the bits: %.3f, %.3f, %.3f", r2, r6,
           r8);
}

/* §7 test 13: exact scores (the Oracle) attend other tokens than PQ scores at a small k, and
 * stay closer to the full cache on average. */
static void oracle(const fx_run *full)
{
    fx_run pq, ex;
    run(&pq, "pqcache:budget=0.1", "f32", 2);
    run(&ex, "pqcache:budget=0.1,scores=exact", "f32", 2);
    const double dp = fx_max_diff(&pq, full, info.n_vocab), de = fx_max_diff(&ex, full, info.n_vocab);
    printf("budget 0.1: max logit difference from full: pq %.4f, exact top-k %.4f\n", dp, de);
    CHECK(dp > 0 && de > 0 && dp != de);
    fx_run_free(&pq);
    fx_run_free(&ex);
}

/* A file tier gives the memory tier's logits; the file is gone from the directory. */
static void file_tier(void)
{
    char dir[] = "/tmp/kvs-pqtier-XXXXXX", spec[160], path[80];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/tier.bin", dir);
    snprintf(spec, sizeof spec, "pqcache:budget=0.25,tier=%s", path);
    fx_run m, f;
    run(&m, "pqcache:budget=0.25", "f16", 2);
    run(&f, spec, "f16", 2);
    CHECKF(fx_max_diff(&m, &f, info.n_vocab) == 0.0, "file tier vs memory tier: %g",
           fx_max_diff(&m, &f, info.n_vocab));
    struct stat sb;
    CHECKF(stat(path, &sb) != 0 && errno == ENOENT, "%s is left behind", path);
    fx_run_free(&m);
    fx_run_free(&f);
    rmdir(dir);
}

static int start_fails(const char *spec, const char *kv_type, const char *needle)
{
    fx_run r = {.spec = spec, .kv_type = kv_type, .threads = 1, .decode = 1};
    fx_exec(&r, model, tokens);
    const int ok = r.st != KVS_OK && strstr(r.err, needle);
    if (!ok)
        fprintf(stderr, "%s: status %d '%s' (want '%s')\n", spec, r.st, r.err, needle);
    fx_run_free(&r);
    return ok;
}

static void bad_input(void)
{
    CHECK(error_mentions("pqcache:budget=0.1,bits=9", "bits=9 is out of range (a whole number in [1, 8])"));
    CHECK(error_mentions("pqcache:budget=0.1,bits=0", "bits=0 is out of range (a whole number in [1, 8])"));
    CHECK(error_mentions("pqcache:budget=0.1,evict=fifo", "evict"));
    CHECK(error_mentions("pqcache:budget=0.1,tier=", "tier= needs a file path"));
    CHECK(start_fails("pqcache:budget=0.1,m=3", NULL, "m=3 does not divide the head dimension 8"));
    CHECK(start_fails("pqcache:budget=0.1,k=600", NULL, "k=600 exceeds the context of 512"));
    CHECK(start_fails("pqcache:slots=20", NULL, "slots=20 leaves no room"));
    CHECK(start_fails("pqcache:budget=0.1", "kivi4", "KIVI storage"));
    CHECK(start_fails("pqcache:budget=0.1,tier=/tmp", NULL, "tier=/tmp"));
    CHECK(start_fails("pqcache:budget=0.1,tier=/nonexistent-kvs-dir/t.bin", NULL,
                      "tier=/nonexistent-kvs-dir/t.bin"));
}

int main(void)
{
    char msg[512];
    CHECKF(fx_load(tokens, FX_N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return check_summary("pqcache");
    fx_run full = {.spec = "full", .kv_type = "f32", .threads = 2, .decode = DECODE};
    fx_exec(&full, model, tokens);
    CHECKF(full.st == KVS_OK, "%s", full.err);
    full_budget(&full);
    invariants();
    async_equivalence();
    oracle(&full);
    rank_quality();
    file_tier();
    bad_input();
    fx_run_free(&full);
    kvs_model_free(model);
    return check_summary("pqcache");
}
