/* Position shifting and runs past the context with evicting policies (issue 7): the RoPE move
 * against direct rotation, the store's shift, and sessions on stories260K (context 512). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "check_store.h"
#include "core/kernels.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "kvslim.h"
#include "policies/hashevict.h"

static kvs_model *model;
static kvs_model_info info;

static unsigned rng = 2024;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return ((rng >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* ---- the RoPE move and the store's shift against direct rotation ---- */

/* max |a - b| / max |b| over n values. */
static double rel_err(const float *a, const float *b, int n)
{
    double d = 0, m = 0;
    for (int i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* A vector rotated at p then moved to p' equals the vector rotated at p' directly: both
 * pairings, partial rotary dims, positions near and far (the move undoes kvs_rope's own
 * angles, so float rounding of large angles does not accumulate). */
static void test_rope_move(void)
{
    enum { HEADS = 3, HD = 16 };
    static const int moves[][2] = {{0, 0},     {5, 1},      {511, 255},   {512, 4},
                                   {100, 90},  {3000, 300}, {70000, 12},  {1, 4095}};
    static const struct { int rot_dim, neox; float base; } ropes[] = {
        {16, 0, 10000.0f}, {16, 1, 10000.0f}, {8, 0, 500000.0f}, {8, 1, 10000.0f}};
    double worst = 0;
    for (size_t r = 0; r < sizeof ropes / sizeof ropes[0]; r++)
        for (size_t m = 0; m < sizeof moves / sizeof moves[0]; m++) {
            float x[HEADS * HD], direct[HEADS * HD];
            for (int i = 0; i < HEADS * HD; i++)
                x[i] = direct[i] = frand();
            kvs_rope(x, HEADS, HD, ropes[r].rot_dim, moves[m][0], ropes[r].base, ropes[r].neox);
            kvs_rope_move(x, HEADS, HD, ropes[r].rot_dim, moves[m][0], moves[m][1],
                          ropes[r].base, ropes[r].neox);
            kvs_rope(direct, HEADS, HD, ropes[r].rot_dim, moves[m][1], ropes[r].base,
                     ropes[r].neox);
            const double e = rel_err(x, direct, HEADS * HD);
            worst = fmax(worst, e);
            CHECKF(e < 1e-6, "rot_dim %d neox %d: %d -> %d: relative error %g",
                   ropes[r].rot_dim, ropes[r].neox, moves[m][0], moves[m][1], e);
            /* Dims past rot_dim are untouched (they carry no position). */
            for (int h = 0; h < HEADS; h++)
                for (int i = ropes[r].rot_dim; i < HD; i++)
                    CHECK(x[h * HD + i] == direct[h * HD + i]);
        }
    printf("rope move: worst relative error %.3g\n", worst);
}

/* The store's shift: keys stored at p, shifted to p', against keys rotated at p' and stored
 * (F32: 1e-5 relative; F16: both sides rounded to F16, so within two F16 steps, 2^-10
 * relative); values and metadata unchanged; positions must increase. */
static void test_store_shift(kvs_dtype type)
{
    enum { N = 24, HD = 8, NKV = 2 };
    const kvs_rope_cfg rope = {HD, 10000.0f, 0};
    kvs_store_config cfg = {1, NKV, HD, 64, type, 1};
    kvs_store *s = kvs_store_new(&cfg), *ref = kvs_store_new(&cfg);
    static float raw[N][NKV * HD], k[N][NKV * HD], kd[N][NKV * HD], v[N][NKV * HD];
    int32_t pos[N], to[N];
    for (int i = 0; i < N; i++) {
        pos[i] = 3 * i + (i > 4 ? 600 : 0); /* sinks 0..12, then a window from 615 */
        to[i] = i < 5 ? pos[i] : 40 + 2 * i;
        for (int d = 0; d < NKV * HD; d++) {
            raw[i][d] = 4.0f * frand();
            v[i][d] = frand();
        }
        memcpy(k[i], raw[i], sizeof k[i]);
        memcpy(kd[i], raw[i], sizeof kd[i]);
        kvs_rope(k[i], NKV, HD, HD, pos[i], rope.base, rope.neox);
        kvs_rope(kd[i], NKV, HD, HD, to[i], rope.base, rope.neox);
    }
    kvs_error err = {0};
    CHECK(kvs_store_append(s, 0, N, &k[0][0], &v[0][0], pos, &err) == KVS_OK);
    CHECK(kvs_store_append(ref, 0, N, &kd[0][0], &v[0][0], to, &err) == KVS_OK);
    for (int i = 0; i < N; i++)
        kvs_store_meta(s, 0, 1, 0)[i] = (float)i;
    /* Not increasing: refused, nothing changed. */
    int32_t bad[N];
    memcpy(bad, to, sizeof bad);
    bad[7] = bad[6];
    CHECK(kvs_store_shift(s, 0, 1, bad, &rope, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "not after"));
    CHECK(kvs_store_pos(s, 0, 1)[7] == pos[7]);
    for (int h = 0; h < NKV; h++)
        CHECKF(kvs_store_shift(s, 0, h, to, &rope, &err) == KVS_OK, "%s", err.msg);
    double worst = 0;
    for (int h = 0; h < NKV; h++)
        for (int i = 0; i < N; i++) {
            float a[HD], b[HD], va[HD], vb[HD];
            kvs_store_key_f32(s, 0, h, i, a);
            kvs_store_key_f32(ref, 0, h, i, b);
            const double e = rel_err(a, b, HD);
            worst = fmax(worst, e);
            CHECKF(e < (type == KVS_F32 ? 1e-5 : 2.0 / 1024), "%s head %d slot %d: %d -> %d: "
                   "relative error %g", kvs_dtype_name(type), h, i, pos[i], to[i], e);
            kvs_store_value_f32(s, 0, h, i, va);
            kvs_store_value_f32(ref, 0, h, i, vb);
            CHECK(memcmp(va, vb, sizeof va) == 0);
            CHECK(kvs_store_pos(s, 0, h)[i] == to[i]);
        }
    for (int i = 0; i < N; i++)
        CHECK(kvs_store_meta(s, 0, 1, 0)[i] == (float)i);
    printf("store shift %s: worst relative error %.3g\n", kvs_dtype_name(type), worst);
    kvs_store_free(s);
    kvs_store_free(ref);
}

/* F16: a pair (60000, 60000) is fine as stored, but rotated by 1 radian (position 1 of a single
 * pair) one element would be about 82900, past the F16 range: refused with a message, the head
 * unchanged. */
static void test_store_shift_f16_range(void)
{
    enum { HD = 2 };
    const kvs_rope_cfg rope = {HD, 10000.0f, 0};
    kvs_store_config cfg = {1, 1, HD, 8, KVS_F16, 0};
    kvs_store *s = kvs_store_new(&cfg);
    /* At position 0 the rotation is the identity, so the stored key is the raw one. */
    float k[HD] = {60000.0f, 60000.0f}, v[HD] = {1, 1};
    int32_t p0 = 0, p1 = 1;
    kvs_error err = {0};
    CHECK(kvs_store_append(s, 0, 1, k, v, &p0, &err) == KVS_OK);
    kvs_status st = kvs_store_shift(s, 0, 0, &p1, &rope, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "F16") && strstr(err.msg, "layer 0"),
           "status %d '%s'", st, err.msg);
    CHECK(kvs_store_pos(s, 0, 0)[0] == 0);
    kvs_store_free(s);
}

/* ---- sessions ---- */

typedef struct notices {
    int count;
    char first[512];
} notices;

static void on_notice(void *ctx, const char *msg)
{
    notices *n = ctx;
    if (n->count++ == 0)
        snprintf(n->first, sizeof n->first, "%s", msg);
}

static kvs_session *open_session(const char *spec, int shift, const char *kv_type, notices *n,
                                 kvs_error *err)
{
    kvs_session_params sp = kvs_session_default_params();
    sp.kv_policy = spec;
    sp.kv_type = kv_type;
    sp.context_shift = shift;
    sp.log = n ? on_notice : NULL;
    sp.log_ctx = n;
    kvs_session *s = NULL;
    if (kvs_session_new(model, &sp, &s, err) != KVS_OK)
        return NULL;
    return s;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int all_finite(const float *x, int n)
{
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Positions of every head distinct, increasing if the head is in order (check_store.h), and
 * (if bound > 0) below bound. Returns the largest position held, or -1 after reporting a
 * violation. */
static int check_positions(kvs_session *s, int bound, const char *what, int step)
{
    const kvs_store *st = kvs_kv_store(kvs_session_kv(s));
    int max = -1;
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++) {
            const int n = kvs_store_count(st, l, h);
            const int32_t *p = kvs_store_pos(st, l, h);
            const int bad = check_store_positions(st, l, h);
            if (bad >= 0) {
                CHECKF(0, "%s, step %d, layer %d head %d: slot %d out of order or repeated "
                       "(ordered %d)", what, step, l, h, bad, kvs_store_ordered(st, l, h));
                return -1;
            }
            for (int i = 0; i < n; i++) {
                if (p[i] < 0 || (bound > 0 && p[i] >= bound)) {
                    CHECKF(0, "%s, step %d, layer %d head %d slot %d: position %d (bound %d)",
                           what, step, l, h, i, p[i], bound);
                    return -1;
                }
                if (p[i] > max)
                    max = p[i];
            }
        }
    return max;
}

static const int32_t *prompt_tokens(int *n)
{
    static int32_t *ids;
    static int n_ids;
    kvs_error err = {0};
    if (!ids && kvs_tokenize(model, "Once upon a time", 1, &ids, &n_ids, &err) != KVS_OK)
        return NULL;
    *n = n_ids;
    return ids;
}

/* streaming at 64 slots, 3000 decode steps with shifting: bounded bytes, positions inside the
 * context, finite logits; identical logits to an unshifted session until the first shift. */
static void test_streaming_3000(const char *kv_type)
{
    enum { SLOTS = 64, STEPS = 3000 };
    kvs_error err = {0};
    notices na = {0}, nb = {0};
    kvs_session *a = open_session("streaming:slots=64", 1, kv_type, &na, &err);
    CHECKF(a, "%s", err.msg);
    kvs_session *b = open_session("streaming:slots=64", 0, kv_type, &nb, &err);
    CHECKF(b, "%s", err.msg);
    if (!a || !b) {
        kvs_session_free(a);
        kvs_session_free(b);
        return;
    }
    const int V = info.n_vocab;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int n_prompt = 0;
    const int32_t *prompt = prompt_tokens(&n_prompt);
    const size_t budget_bytes = (size_t)SLOTS * info.n_layers * info.n_kv_heads *
                                kvs_store_slot_bytes(kvs_kv_store(kvs_session_kv(a)));
    kvs_status sa = kvs_session_eval(a, prompt, n_prompt, la, 0, &err);
    CHECKF(sa == KVS_OK, "prompt: %s", err.msg);
    kvs_status sb = kvs_session_eval(b, prompt, n_prompt, lb, 0, &err);
    CHECKF(sb == KVS_OK, "prompt: %s", err.msg);
    int shifts = 0, prev_max = -1, before_shift_same = 1, over_budget = 0, bad_logits = 0;
    int step = 0;
    for (; step < STEPS && sa == KVS_OK; step++) {
        int32_t tok = argmax(la, V);
        if ((sa = kvs_session_eval(a, &tok, 1, la, 0, &err)) != KVS_OK) {
            CHECKF(0, "%s step %d: %s", kv_type, step, err.msg);
            break;
        }
        if (sb == KVS_OK && (sb = kvs_session_eval(b, &tok, 1, lb, 0, &err)) != KVS_OK)
            CHECKF(0, "no shift, %s step %d: %s", kv_type, step, err.msg);
        int max = check_positions(a, info.n_ctx, kv_type, step);
        if (max < 0)
            break;
        if (max < prev_max)
            shifts++;
        prev_max = max;
        if (shifts == 0 && sb == KVS_OK && memcmp(la, lb, sizeof(float) * V) != 0)
            before_shift_same = 0;
        over_budget += kvs_session_kv_bytes(a) > budget_bytes;
        bad_logits += !all_finite(la, V);
    }
    CHECKF(step == STEPS, "%s: stopped after %d of %d steps", kv_type, step, STEPS);
    /* A shift every n_ctx/2 tokens: about (prompt + steps - 512) / 256 + 1 of them. */
    CHECKF(shifts >= (n_prompt + STEPS - info.n_ctx) / (info.n_ctx / 2), "%s: %d shifts",
           kv_type, shifts);
    CHECKF(before_shift_same, "%s: logits differ from the unshifted run before the first shift",
           kv_type);
    CHECKF(over_budget == 0, "%s: KV bytes above the budget's %zu at %d steps", kv_type,
           budget_bytes, over_budget);
    CHECKF(kvs_session_kv_peak_bytes(a) <= budget_bytes + budget_bytes / SLOTS,
           "%s: peak %zu vs budget %zu", kv_type, kvs_session_kv_peak_bytes(a), budget_bytes);
    CHECKF(bad_logits == 0, "%s: non-finite logits at %d steps", kv_type, bad_logits);
    CHECKF(na.count == 0, "%s: shifting sent a notice: %s", kv_type, na.first);
    /* Without shifting: runs on past the context with one notice. */
    CHECKF(sb == KVS_OK, "%s: the unshifted run stopped", kv_type);
    CHECKF(nb.count == 1 && strstr(nb.first, "position 512 is past the model's trained context "
                                   "of 512") && strstr(nb.first, "shift"),
           "%s: %d notices, first '%s'", kv_type, nb.count, nb.first);
    free(la);
    free(lb);
    kvs_session_free(a);
    kvs_session_free(b);
}

/* With no protected prefix (sinks=0) a shift moves every kept key by the same offset as the
 * new queries, so every query-key product is unchanged: the logits must match an unshifted run
 * (positions up to 3000) to float rounding, after every shift. */
static void test_translation(void)
{
    enum { STEPS = 1600 };
    kvs_error err = {0};
    kvs_session *a = open_session("streaming:slots=48,sinks=0", 1, NULL, NULL, &err);
    CHECKF(a, "%s", err.msg);
    kvs_session *b = open_session("streaming:slots=48,sinks=0", 0, NULL, NULL, &err);
    CHECKF(b, "%s", err.msg);
    if (!a || !b) {
        kvs_session_free(a);
        kvs_session_free(b);
        return;
    }
    const int V = info.n_vocab;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    int n_prompt = 0;
    const int32_t *prompt = prompt_tokens(&n_prompt);
    kvs_status st = kvs_session_eval(a, prompt, n_prompt, la, 0, &err);
    if (st == KVS_OK)
        st = kvs_session_eval(b, prompt, n_prompt, lb, 0, &err);
    double worst = 0;
    int prev_max = -1, shifts = 0, step = 0;
    for (; step < STEPS && st == KVS_OK; step++) {
        int32_t tok = argmax(la, V);
        if ((st = kvs_session_eval(a, &tok, 1, la, 0, &err)) != KVS_OK ||
            (st = kvs_session_eval(b, &tok, 1, lb, 0, &err)) != KVS_OK)
            break;
        for (int i = 0; i < V; i++)
            worst = fmax(worst, fabs((double)la[i] - lb[i]));
        int max = check_positions(a, info.n_ctx, "translation", step);
        if (max < 0)
            break;
        shifts += max < prev_max;
        prev_max = max;
    }
    CHECKF(st == KVS_OK && step == STEPS, "step %d: %s", step, err.msg);
    CHECKF(shifts >= 4, "%d shifts", shifts);
    /* Logits are O(10); RoPE angles of positions near 2000 carry ~1e-4 absolute rounding in
     * float (pos * freq), so the two runs differ by float rounding of that order, not more. */
    CHECKF(worst < 2e-3, "max |logit difference| %g after %d shifts", worst, shifts);
    printf("translation: %d shifts, max |logit diff| vs unshifted %.3g\n", shifts, worst);
    free(la);
    free(lb);
    kvs_session_free(a);
    kvs_session_free(b);
}

/* Every evicting policy with shifting: decode far past the context; positions sorted, unique,
 * inside the context; hashevict's slot table in step with the store. */
static void test_policies_shift(const char *spec, const char *kv_type, int steps)
{
    kvs_error err = {0};
    kvs_session *s = open_session(spec, 1, kv_type, NULL, &err);
    CHECKF(s, "%s: %s", spec, err.msg);
    if (!s)
        return;
    const int V = info.n_vocab;
    float *lg = malloc(sizeof(float) * V);
    int n_prompt = 0;
    const int32_t *prompt = prompt_tokens(&n_prompt);
    kvs_status st = kvs_session_eval(s, prompt, n_prompt, lg, 0, &err);
    int step = 0, prev_max = -1, shifts = 0, bad = 0;
    for (; step < steps && st == KVS_OK; step++) {
        int32_t tok = argmax(lg, V);
        if ((st = kvs_session_eval(s, &tok, 1, lg, 0, &err)) != KVS_OK)
            break;
        bad += !all_finite(lg, V);
        int max = check_positions(s, info.n_ctx, spec, step);
        if (max < 0)
            break;
        shifts += max < prev_max;
        prev_max = max;
    }
    CHECKF(st == KVS_OK && step == steps, "%s %s: step %d: %s", spec, kv_type ? kv_type : "",
           step, err.msg);
    CHECKF(shifts >= 2, "%s: %d shifts", spec, shifts);
    CHECKF(bad == 0, "%s: non-finite logits at %d steps", spec, bad);
    const kvs_policy *p = kvs_kv_policy(kvs_session_kv(s));
    const kvs_store *store = kvs_kv_store(kvs_session_kv(s));
    kvs_he_view v;
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++) {
            CHECK(kvs_store_count(store, l, h) <= p->budget);
            if (kvs_hashevict_view(p, l, h, &v) != 0)
                continue;
            /* The table holds exactly the store's positions. */
            const int n = kvs_store_count(store, l, h);
            const int32_t *sp = kvs_store_pos(store, l, h);
            int found = 0;
            for (int i = 0; i < v.n_filled; i++)
                for (int j = 0; j < n; j++)
                    found += v.pos[i] == sp[j];
            CHECKF(v.n_filled == n && found == n, "%s layer %d head %d: table %d slots, store "
                   "%d, matching %d", spec, l, h, v.n_filled, n, found);
        }
    free(lg);
    kvs_session_free(s);
}

static int32_t *long_prompt(int n)
{
    char path[1024];
    check_shared_path(path, sizeof path, "models/golden/stories260K-sample-512.tokens");
    FILE *f = fopen(path, "r");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    int m = 0, v;
    while (f && m < n && fscanf(f, "%d", &v) == 1)
        ids[m++] = v;
    if (f)
        fclose(f);
    CHECKF(m > 0, "cannot read %s", path);
    for (int i = m; i < n && m > 0; i++) /* the sample again and again */
        ids[i] = ids[i % m];
    return ids;
}

/* A prompt of 1500 tokens on the 512-context model: evicting policies take it (with and
 * without shifting); the full cache refuses it as before. */
static void test_long_prompt(void)
{
    enum { N = 1500 };
    int32_t *ids = long_prompt(N);
    const int V = info.n_vocab;
    float *lg = malloc(sizeof(float) * V);
    static const char *const specs[] = {"streaming:slots=64", "h2o:slots=64", "tova:slots=64",
                                        "hashevict:slots=64", "l2evict:slots=64,prefill=norm"};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int shift = 0; shift < 2; shift++) {
            kvs_error err = {0};
            notices n = {0};
            kvs_session *s = open_session(specs[i], shift, NULL, &n, &err);
            CHECKF(s, "%s", err.msg);
            if (!s)
                continue;
            kvs_status st = kvs_session_eval(s, ids, N, lg, 0, &err);
            CHECKF(st == KVS_OK, "%s shift=%d: prompt of %d: %s", specs[i], shift, N, err.msg);
            for (int t = 0; t < 50 && st == KVS_OK; t++) {
                int32_t tok = argmax(lg, V);
                st = kvs_session_eval(s, &tok, 1, lg, 0, &err);
                CHECKF(st == KVS_OK, "%s shift=%d decode %d: %s", specs[i], shift, t, err.msg);
            }
            check_positions(s, shift ? info.n_ctx : 0, specs[i], -1);
            CHECK(all_finite(lg, V));
            CHECKF(shift ? n.count == 0 : n.count == 1, "%s shift=%d: %d notices", specs[i],
                   shift, n.count);
            /* Bounded: the budget plus one chunk of 512 at the peak. */
            const size_t slot = kvs_store_slot_bytes(kvs_kv_store(kvs_session_kv(s)));
            const size_t bound = (size_t)(64 + 512) * info.n_layers * info.n_kv_heads * slot +
                                 (kvs_session_kv_bytes(s) - kvs_store_bytes(kvs_kv_store(
                                                                kvs_session_kv(s))));
            CHECKF(kvs_session_kv_peak_bytes(s) <= bound, "%s: peak %zu > %zu", specs[i],
                   kvs_session_kv_peak_bytes(s), bound);
            kvs_session_free(s);
        }
    /* Non-evicting policies keep the context limit. */
    static const char *const strict[] = {NULL, "snapkv:slots=64", "quest:slots=64"};
    for (size_t i = 0; i < sizeof strict / sizeof strict[0]; i++) {
        kvs_error err = {0};
        kvs_session *s = open_session(strict[i], 0, NULL, NULL, &err);
        CHECKF(s, "%s", err.msg);
        if (!s)
            continue;
        kvs_status st = kvs_session_eval(s, ids, N, lg, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "exceeds the context"), "%s: %d '%s'",
               strict[i] ? strict[i] : "full", st, err.msg);
        kvs_session_free(s);
    }
    free(lg);
    free(ids);
}

/* The full cache still stops at the context in decode; shifting needs an evicting policy and a
 * budget that leaves room for a new token. */
static void test_limits(void)
{
    kvs_error err = {0};
    kvs_session *s = open_session(NULL, 1, NULL, NULL, &err);
    CHECKF(!s && err.code == KVS_ERR_ARG && strstr(err.msg, "evicting"), "full + shift: '%s'",
           err.msg);
    kvs_session_free(s);
    s = open_session("snapkv:budget=0.5", 1, NULL, NULL, &err);
    CHECKF(!s && strstr(err.msg, "evicting"), "snapkv + shift: '%s'", err.msg);
    kvs_session_free(s);

    s = open_session("streaming:slots=512", 1, NULL, NULL, &err);
    CHECKF(s, "%s", err.msg);
    int n_prompt = 0;
    const int32_t *prompt = prompt_tokens(&n_prompt);
    if (s) {
        kvs_status st = kvs_session_eval(s, prompt, n_prompt, NULL, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "512") && strstr(err.msg, "shift"),
               "budget = context with shifting: %d '%s'", st, err.msg);
        kvs_session_free(s);
    }

    /* full: decode up to the context, then the usual error. */
    s = open_session(NULL, 0, NULL, NULL, &err);
    if (s) {
        const int V = info.n_vocab;
        float *lg = malloc(sizeof(float) * V);
        kvs_status st = kvs_session_eval(s, prompt, n_prompt, lg, 0, &err);
        int t = n_prompt;
        for (; t < info.n_ctx && st == KVS_OK; t++) {
            int32_t tok = argmax(lg, V);
            st = kvs_session_eval(s, &tok, 1, lg, 0, &err);
        }
        CHECKF(st == KVS_OK && t == info.n_ctx, "full: %s", err.msg);
        int32_t tok = argmax(lg, V);
        st = kvs_session_eval(s, &tok, 1, lg, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "context"), "full past the context: '%s'",
               err.msg);
        free(lg);
        kvs_session_free(s);
    }
}

int main(void)
{
    char path[1024];
    kvs_error err = {0};
    check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    if (kvs_model_load(path, &model, &err) != KVS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    kvs_model_get_info(model, &info);
    test_rope_move();
    test_store_shift(KVS_F32);
    test_store_shift(KVS_F16);
    test_store_shift_f16_range();
    test_streaming_3000(NULL);
    test_streaming_3000("f16");
    test_translation();
    test_policies_shift("h2o:slots=64", NULL, 1500);
    test_policies_shift("h2o:slots=300", NULL, 1500);
    test_policies_shift("tova:slots=64", NULL, 1200);
    test_policies_shift("hashevict:slots=64", NULL, 1200);
    test_policies_shift("hashevict:slots=64", "f16", 1200);
    test_policies_shift("l2evict:slots=64", NULL, 1200);
    test_policies_shift("streaming:slots=400", "f16", 1200);
    test_long_prompt();
    test_limits();
    int n;
    free((void *)prompt_tokens(&n));
    kvs_model_free(model);
    return check_summary("shift");
}
