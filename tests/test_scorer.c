/* The scorer adapter (src/policies/scorer.h): a test-local scorer policy, written as a score
 * function plus a table entry, run through the adapter's hooks on a small store: top-k by score
 * with the declared protection and ties, the observation window's group mean, the slots a score
 * function sees, errors. Also: the group-mean rule, and the shipped scorers are registered with
 * the adapter's hooks. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "policies/policies.h"
#include "policies/scorer.h"

enum { HD = 2, NKV = 2, GROUP = 2, N = 10 };

/* What the score functions saw (a test, single-threaded). */
static int calls, seen_n[NKV];
static float seen_obs[NKV][N];

/* Score = the key's first component. */
static kvs_status key0(const kvs_score_ctx *c, float *score, kvs_error *err)
{
    (void)err;
    calls++;
    seen_n[c->head] = c->n;
    for (int j = 0; j < c->n; j++) {
        score[j] = kvs_score_key(c, j)[0];
        if (c->obs)
            seen_obs[c->head][j] = c->obs[j];
    }
    return KVS_OK;
}

static kvs_status fails(const kvs_score_ctx *c, float *score, kvs_error *err)
{
    (void)score;
    return kvs_fail(err, KVS_ERR_ARG, "--kv %s: scorer failed", c->p->spec.user);
}

static int window3(const kvs_policy *p)
{
    (void)p;
    return 3;
}

static void recent2(const kvs_policy *p, int *sinks, int *recent)
{
    (void)p;
    *sinks = 1;
    *recent = 2;
}

static const kvs_scorer plain = {.type = {.name = "key0", .summary = "t", KVS_SCORER_HOOKS},
                                 .score = key0};
static const kvs_scorer newer = {.type = {.name = "key0", .summary = "t", KVS_SCORER_HOOKS},
                                 .score = key0, .tie = KVS_TIE_KEEP_NEWER};
static const kvs_scorer guarded = {.type = {.name = "key0", .summary = "t", KVS_SCORER_HOOKS},
                                   .score = key0, .protect = recent2};
static const kvs_scorer observing = {.type = {.name = "key0", .summary = "t", KVS_SCORER_HOOKS},
                                     .score = key0, .window = window3};
static const kvs_scorer failing = {.type = {.name = "bad", .summary = "t", KVS_SCORER_HOOKS},
                                   .score = fails};

/* Head 0's keys: first components 5 3 9 3 1 7 3 8 2 6 at positions 0..9; head 1's: -(those). */
static const float k0[N] = {5, 3, 9, 3, 1, 7, 3, 8, 2, 6};

static kvs_store *filled_store(void)
{
    kvs_store_config cfg = {.n_layers = 1, .n_kv_heads = NKV, .head_dim = HD, .max_slots = 64,
                            .type = KVS_F32};
    kvs_store *s = kvs_store_new(&cfg);
    float k[N * NKV * HD], v[N * NKV * HD] = {0};
    int32_t pos[N];
    for (int i = 0; i < N; i++) {
        pos[i] = i;
        for (int h = 0; h < NKV; h++) {
            k[(i * NKV + h) * HD] = h ? -k0[i] : k0[i];
            k[(i * NKV + h) * HD + 1] = 0;
        }
    }
    kvs_error err;
    CHECK(s && kvs_store_append(s, 0, N, k, v, pos, &err) == KVS_OK);
    return s;
}

static void policy_of(kvs_policy *p, const kvs_scorer *sc, kvs_store *s, int budget)
{
    memset(p, 0, sizeof *p);
    p->type = &sc->type;
    p->spec.type = &sc->type;
    snprintf(p->spec.user, sizeof p->spec.user, "%s:slots=%d", sc->type.name, budget);
    p->store = s;
    p->n_layers = 1;
    p->n_heads = NKV * GROUP;
    p->n_kv_heads = NKV;
    p->head_dim = HD;
    p->n_prompt = N;
    p->budget = budget;
}

static int kept_is(kvs_store *s, int h, const int32_t *want, int n)
{
    return kvs_store_count(s, 0, h) == n &&
           !memcmp(kvs_store_pos(s, 0, h), want, sizeof(int32_t) * (size_t)n);
}

/* Runs sc over a fresh store with the given budget; returns the store. */
static kvs_store *run(const kvs_scorer *sc, int budget, kvs_status *st_out)
{
    kvs_store *s = filled_store();
    kvs_policy p;
    kvs_error err;
    policy_of(&p, sc, s, budget);
    kvs_status st = kvs_scorer_start(&p, &err);
    if (st == KVS_OK)
        st = kvs_scorer_prefill_end(&p, 0, &err);
    kvs_scorer_stop(&p);
    *st_out = st;
    return s;
}

static void test_top_k(void)
{
    kvs_status st;
    /* Top 4 by key0 (9, 8, 7, 6 at positions 2, 7, 5, 9), in position order; head 1 keeps the
     * lowest key0 (1, 2, then the three 3s: the oldest two). */
    calls = 0;
    kvs_store *s = run(&plain, 4, &st);
    CHECK(st == KVS_OK && calls == NKV && seen_n[0] == N && seen_n[1] == N);
    CHECK(kept_is(s, 0, (const int32_t[]){2, 5, 7, 9}, 4));
    CHECK(kept_is(s, 1, (const int32_t[]){1, 3, 4, 8}, 4));
    kvs_store_free(s);
    /* Ties the other way: the newest of the 3s stay. */
    s = run(&newer, 4, &st);
    CHECK(kept_is(s, 1, (const int32_t[]){3, 4, 6, 8}, 4));
    kvs_store_free(s);
    /* One sink and two recent slots protected, the best one of the rest (9 at 2). */
    s = run(&guarded, 4, &st);
    CHECK(kept_is(s, 0, (const int32_t[]){0, 2, 8, 9}, 4));
    kvs_store_free(s);
    /* Within budget: nothing scored, nothing evicted. */
    calls = 0;
    s = run(&plain, N, &st);
    CHECK(st == KVS_OK && calls == 0 && kvs_store_count(s, 0, 0) == N);
    kvs_store_free(s);
    /* A score function's error is the hook's, and nothing is evicted. */
    s = run(&failing, 4, &st);
    CHECK(st == KVS_ERR_ARG && kvs_store_count(s, 0, 0) == N);
    kvs_store_free(s);
}

/* The window's rows reach the score function as each KV head's group mean, summed over chunks;
 * a scorer without a window observes nothing. */
static void test_window(void)
{
    kvs_store *s = filled_store();
    kvs_policy p;
    kvs_error err;
    policy_of(&p, &observing, s, 4);
    CHECK(kvs_scorer_start(&p, &err) == KVS_OK);
    CHECK(!kvs_scorer_wants_row(&p, 0, 6) && kvs_scorer_wants_row(&p, 0, 7));
    float colsum[NKV * GROUP * N];
    for (int r = 0; r < NKV * GROUP; r++)
        for (int j = 0; j < N; j++)
            colsum[r * N + j] = (float)(r + 1) * (float)(j + 1);
    kvs_chunk c = {.n = 3, .colsum = colsum, .colsum_stride = N};
    for (int chunk = 0; chunk < 2; chunk++)
        CHECK(kvs_scorer_prefill_chunk(&p, 0, &c, &err) == KVS_OK);
    CHECK(kvs_scorer_state_bytes(&p) == sizeof(float) * NKV * N);
    memset(seen_obs, 0, sizeof seen_obs);
    CHECK(kvs_scorer_prefill_end(&p, 0, &err) == KVS_OK);
    int same = 1;
    for (int h = 0; h < NKV; h++)
        for (int j = 0; j < N; j++) /* 2 chunks x mean of rows 2h+1, 2h+2 = (4h + 3) (j + 1) */
            same &= seen_obs[h][j] == (float)(4 * h + 3) * (float)(j + 1);
    CHECK(same);
    CHECK(kvs_scorer_state_bytes(&p) == 0);
    kvs_scorer_stop(&p);
    policy_of(&p, &plain, s, 4);
    CHECK(kvs_scorer_start(&p, &err) == KVS_OK && p.state == NULL);
    CHECK(!kvs_scorer_wants_row(&p, 0, 9));
    kvs_scorer_stop(&p);
    kvs_store_free(s);
}

/* The one group-mean rounding rule (kv/policy.h): each row times 1/group, added in head order.
 * For power-of-two groups that is bit for bit the division tova used. */
static void test_group_mean(void)
{
    enum { M = 64 };
    float rows[4 * M], dst[M];
    uint32_t x = 12345;
    for (int i = 0; i < 4 * M; i++) {
        x = x * 1664525u + 1013904223u;
        rows[i] = (float)(x >> 8) * 0x1p-24f * (i % 7 == 0 ? 1e-30f : 1.0f);
    }
    for (int group = 1; group <= 4; group++) {
        for (int j = 0; j < M; j++)
            dst[j] = 0.5f;
        kvs_group_mean_add(dst, rows, M, group, M);
        const float inv = 1.0f / (float)group;
        int rule = 1, div = 1;
        for (int j = 0; j < M; j++) {
            float want = 0.5f, by_div = 0.5f;
            for (int g = 0; g < group; g++) {
                want += rows[g * M + j] * inv;
                by_div += rows[g * M + j] / (float)group;
            }
            rule &= dst[j] == want;
            div &= dst[j] == by_div;
        }
        CHECKF(rule, "group %d", group);
        if (group != 3)
            CHECKF(div, "group %d", group);
    }
}

/* knorm, random and snapkv are scorers: one-shot, with the adapter's hooks. */
static void test_registry(void)
{
    const char *names[] = {"knorm", "random", "snapkv"};
    for (int i = 0; i < 3; i++) {
        const kvs_policy_type *t = kvs_policy_find(names[i]);
        CHECKF(t && t->kind == KVS_KIND_ONE_SHOT && t->prefill_end == kvs_scorer_prefill_end &&
                   t->start == kvs_scorer_start,
               "%s", names[i]);
    }
    CHECK(kvs_policy_find("knorm") == &kvs_policy_knorm.type);
}

int main(void)
{
    test_top_k();
    test_window();
    test_group_mean();
    test_registry();
    return check_summary("test_scorer");
}
