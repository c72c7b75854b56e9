/* KIVI quantised KV storage (minicache.md §2.10, §3.2, §7 T18): round trip within scale/2 per
 * group, key blocks flushed at exactly R, value residual never above R, the prefill split,
 * eviction from quantised groups, exact bytes, attention equal to attention over the
 * dequantised copy, and the parameter errors. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/kernels.h"
#include "core/kernels_kivi.h"
#include "kv/attention.h"
#include "kv/kivi.h"
#include "kv/kv_store.h"

#define NKV 2
#define MAXS 1024

/* An append followed by the flush that kv.c runs after attention. */
static kvs_status app(kvs_store *s, int n, const float *k, const float *v, const int32_t *pos,
                      kvs_error *err)
{
    kvs_status st = kvs_store_append(s, 0, n, k, v, pos, err);
    if (st == KVS_OK)
        kvs_store_kivi_flush(s, 0);
    return st;
}

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* n tokens of NKV heads of hd: channel d has its own offset and spread (as real keys do). */
static void fill(float *x, int n, int hd)
{
    for (int i = 0; i < n; i++)
        for (int h = 0; h < NKV; h++)
            for (int d = 0; d < hd; d++)
                x[((size_t)i * NKV + h) * hd + d] = (float)(d % 5) - 2.0f + (1.0f + d % 3) * frand();
}

/* Tokens of key group g of a view. */
static int gsize(const kvs_kivi_view *v, int g)
{
    return (g + 1 < v->ng ? v->g_first[g + 1] : v->nqk) - v->g_first[g];
}

static float f16r(float x) { return kvs_fp16_to_fp32(kvs_fp32_to_fp16(x)); }

static kvs_store *new_kivi(int hd, int kb, int vb, int G, int R)
{
    kvs_store_config cfg = {1, NKV, hd, MAXS, KVS_F16, 0};
    kvs_store *s = kvs_store_new(&cfg);
    kvs_kivi_cfg k = {kb, vb, G, R};
    kvs_error err = {0};
    CHECK(s && kvs_store_set_kivi(s, &k, &err) == KVS_OK);
    return s;
}

/* The bound of T18 for a group of elements x[i * stride], i < n: scale/2 plus the fp16
 * rounding of scale and min (2^-11 relative each). */
static float group_bound(const float *x, int n, int stride, int bits)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[(size_t)i * stride]);
        hi = fmaxf(hi, x[(size_t)i * stride]);
    }
    const float top = (float)((1 << bits) - 1), scale = (hi - lo) / top;
    return scale / 2 + ldexpf(fabsf(lo) + top * scale, -11) * 1.01f + 1e-6f;
}

/* Every stored key and value of head h against orig (fp16-rounded originals of the live slots,
 * in slot order), with key groups of g_n (from the store) and value groups of G channels. */
static int check_round_trip(const kvs_store *s, int h, const float *ok, const float *ov, int hd,
                            int kb, int vb, int G)
{
    kvs_kivi_view v;
    kvs_store_kivi_view(s, 0, h, &v);
    const int n = kvs_store_count(s, 0, h);
    int bad = 0;
    float out[hd];
    for (int g = 0, first = 0; g < v.ng; first += gsize(&v, g), g++)
        for (int i = first; i < first + gsize(&v, g); i++) {
            kvs_store_key_f32(s, 0, h, i, out);
            for (int d = 0; d < hd; d++) {
                /* The group as quantised may have held evicted tokens too: bound by the live
                 * ones' range only when nothing was evicted (callers check equality after). */
                float b = group_bound(ok + (size_t)first * hd + d, gsize(&v, g), hd, kb);
                bad += !(fabsf(out[d] - ok[(size_t)i * hd + d]) <= b);
            }
        }
    for (int i = v.nqk; i < n; i++) {
        kvs_store_key_f32(s, 0, h, i, out);
        bad += memcmp(out, ok + (size_t)i * hd, sizeof out) != 0;
    }
    const int gv = G < hd ? G : hd;
    for (int i = 0; i < n; i++) {
        kvs_store_value_f32(s, 0, h, i, out);
        for (int c0 = 0; c0 < hd; c0 += gv) {
            const int len = hd - c0 < gv ? hd - c0 : gv;
            float b = i < v.nqv ? group_bound(ov + (size_t)i * hd + c0, len, 1, vb) : 0.0f;
            for (int d = c0; d < c0 + len; d++)
                bad += !(fabsf(out[d] - ov[(size_t)i * hd + d]) <= b);
        }
    }
    return bad;
}

/* One head's fp16-rounded rows out of the NKV-interleaved input. */
static void head_rows(const float *x, int n, int hd, int h, float *out)
{
    for (int i = 0; i < n; i++)
        for (int d = 0; d < hd; d++)
            out[(size_t)i * hd + d] = f16r(x[((size_t)i * NKV + h) * hd + d]);
}

static void round_trip_and_prefill_split(int hd, int kb, int vb, int N)
{
    const int G = 32, R = 128;
    kvs_store *s = new_kivi(hd, kb, vb, G, R);
    float *k = malloc(sizeof(float) * N * NKV * hd), *v = malloc(sizeof(float) * N * NKV * hd);
    float *ok = malloc(sizeof(float) * N * hd), *ov = malloc(sizeof(float) * N * hd);
    int32_t pos[N];
    for (int i = 0; i < N; i++)
        pos[i] = i;
    fill(k, N, hd);
    fill(v, N, hd);
    kvs_error err = {0};
    CHECK(app(s, N, k, v, pos, &err) == KVS_OK);
    for (int h = 0; h < NKV; h++) {
        kvs_kivi_view view;
        kvs_store_kivi_view(s, 0, h, &view);
        CHECKF(view.nqk == N - N % R, "prefill %d: %d keys quantised, want N - N mod R = %d", N,
               view.nqk, N - N % R);
        CHECKF(view.nqv == (N > R ? N - R : 0), "prefill %d: %d values quantised", N, view.nqv);
        head_rows(k, N, hd, h, ok);
        head_rows(v, N, hd, h, ov);
        int bad = check_round_trip(s, h, ok, ov, hd, kb, vb, G);
        CHECKF(bad == 0, "hd %d k%d v%d N %d head %d: %d elements beyond scale/2", hd, kb, vb, N,
               h, bad);
    }
    kvs_store_free(s);
    free(k);
    free(v);
    free(ok);
    free(ov);
}

/* Token by token: keys flush at exactly R (all R at once), values one by one past R. */
/* Without the flush, a batch stays in the residual (it attends to itself exactly); the next
 * append flushes it first. */
static void flush_deferred_to_after_attention(void)
{
    const int hd = 8, N = 300;
    kvs_store *s = new_kivi(hd, 4, 4, 32, 128);
    float k[N * NKV * hd], v[N * NKV * hd];
    int32_t pos[N + 1];
    for (int i = 0; i <= N; i++)
        pos[i] = i;
    fill(k, N, hd);
    fill(v, N, hd);
    kvs_error err = {0};
    CHECK(kvs_store_append(s, 0, N, k, v, pos, &err) == KVS_OK);
    kvs_kivi_view view;
    kvs_store_kivi_view(s, 0, 0, &view);
    CHECK(view.nqk == 0 && view.nqv == 0);
    CHECK(kvs_store_append(s, 0, 1, k, v, pos + N, &err) == KVS_OK);
    kvs_store_kivi_view(s, 0, 0, &view);
    CHECK(view.nqk == 256 && view.nqv == N - 128);
    kvs_store_free(s);
}

static void residual_flushes_at_r(void)
{
    const int hd = 8, G = 32, R = 128;
    kvs_store *s = new_kivi(hd, 4, 4, G, R);
    kvs_error err = {0};
    int bad = 0;
    for (int32_t p = 0; p < 3 * R + 5; p++) {
        float k[NKV * hd], v[NKV * hd];
        fill(k, 1, hd);
        fill(v, 1, hd);
        CHECK(app(s, 1, k, v, &p, &err) == KVS_OK);
        kvs_kivi_view view;
        kvs_store_kivi_view(s, 0, 0, &view);
        const int n = p + 1;
        bad += view.nqk != n / R * R || view.ng != n / R * R / G;
        bad += n - view.nqv != (n < R ? n : R);
    }
    CHECKF(bad == 0, "%d steps with the wrong flush state", bad);
    kvs_store_free(s);
}

/* The live bytes of a head recomputed from its view: §3.2 plus 4 bytes per key group and the
 * 4-byte positions. */
static double view_bytes(const kvs_store *s, int h, int hd)
{
    kvs_kivi_view v;
    kvs_store_kivi_view(s, 0, h, &v);
    const double c = kvs_store_count(s, 0, h);
    return (double)v.nqk * v.kcode_bytes + v.ng * (4.0 * hd + 4) + (c - v.nqk) * hd * 2 +
           (double)v.nqv * v.vrow_bytes + (c - v.nqv) * hd * 2 + 4 * c;
}

/* What the store allocates follows what it holds: growth slack of at most half of it, room
 * for the fp16 residuals to refill to R = 128 rows, the arrays' minimum size (256 bytes, the
 * positions' 64-byte blocks); and is below what the same tokens take as F16 rows. */
static void check_alloc(const kvs_store *s, int hd, int n)
{
    const size_t live = kvs_store_bytes(s), alloc = kvs_store_alloc_bytes(s);
    const size_t f16 = (size_t)NKV * n * (2 * (size_t)hd * 2 + 4);
    const size_t room = NKV * (2 * 129 * (size_t)hd * 2 * 3 / 2 + 6 * 256 + 2 * 64 + 4 * 32);
    CHECKF(alloc >= live && alloc <= live + live / 2 + room,
           "hd %d: %zu bytes held, %zu allocated", hd, live, alloc);
    if (n >= 384 && hd >= 64) /* (small arrays have a minimum size) */
        CHECKF(alloc < f16, "hd %d: %zu bytes allocated for %d tokens, as F16 rows %zu", hd,
               alloc, n, f16);
}

/* Eviction from quantised groups: the survivors keep exactly their dequantised values (the
 * group keeps its scale and min), hence stay within the quantisation error of the originals. */
static void eviction_from_groups(int hd)
{
    const int N = 300, G = 32, R = 128;
    kvs_store *s = new_kivi(hd, 2, 2, G, R);
    float *k = malloc(sizeof(float) * N * NKV * hd), *v = malloc(sizeof(float) * N * NKV * hd);
    float *before = malloc(sizeof(float) * N * 2 * hd);
    int32_t pos[N];
    for (int i = 0; i < N; i++)
        pos[i] = i;
    fill(k, N, hd);
    fill(v, N, hd);
    kvs_error err = {0};
    CHECK(app(s, N, k, v, pos, &err) == KVS_OK);
    for (int i = 0; i < N; i++) {
        kvs_store_key_f32(s, 0, 0, i, before + (size_t)i * 2 * hd);
        kvs_store_value_f32(s, 0, 0, i, before + (size_t)i * 2 * hd + hd);
    }
    const size_t bytes_before = kvs_store_bytes(s);
    /* Keep every third slot but all of slots 32..63 (group 1 untouched), none of 64..95 (group
     * 2 emptied), then remove one more quantised key. */
    int keep[N], n = 0;
    for (int i = 0; i < N; i++)
        if ((i >= 32 && i < 64) || (!(i >= 64 && i < 96) && i % 3 == 0))
            keep[n++] = i;
    kvs_store_keep(s, 0, 0, keep, n);
    kvs_store_remove(s, 0, 0, 5);
    memmove(keep + 5, keep + 6, sizeof(int) * (size_t)(n - 6));
    n--;
    CHECK(kvs_store_count(s, 0, 0) == n);
    kvs_kivi_view view;
    kvs_store_kivi_view(s, 0, 0, &view);
    int nqk = 0, nqv = 0, sum = 0;
    for (int i = 0; i < n; i++) {
        nqk += keep[i] < 256;
        nqv += keep[i] < N - R;
    }
    for (int g = 0; g < view.ng; g++)
        sum += gsize(&view, g) > 0 ? gsize(&view, g) : -100000;
    CHECKF(view.nqk == nqk && view.nqv == nqv && sum == nqk && view.ng == 7,
           "after eviction: nqk %d (want %d), nqv %d (want %d), %d groups summing to %d",
           view.nqk, nqk, view.nqv, nqv, view.ng, sum);
    int changed = 0;
    float out[hd];
    for (int i = 0; i < n; i++) {
        kvs_store_key_f32(s, 0, 0, i, out);
        changed += memcmp(out, before + (size_t)keep[i] * 2 * hd, sizeof out) != 0;
        kvs_store_value_f32(s, 0, 0, i, out);
        changed += memcmp(out, before + (size_t)keep[i] * 2 * hd + hd, sizeof out) != 0;
        changed += kvs_store_pos(s, 0, 0)[i] != keep[i];
    }
    CHECKF(changed == 0, "hd %d: %d surviving rows changed by the eviction", hd, changed);
    /* The whole head at once gives each slot's key exactly. */
    float *all = malloc(sizeof(float) * (size_t)n * hd);
    kvs_store_keys_f32(s, 0, 0, all);
    for (int i = 0; i < n; i++) {
        kvs_store_key_f32(s, 0, 0, i, out);
        changed += memcmp(out, all + (size_t)i * hd, sizeof out) != 0;
    }
    CHECKF(changed == 0, "hd %d: %d keys differ between kvs_store_keys_f32 and key_f32", hd,
           changed);
    free(all);
    /* The bytes follow the survivors exactly: codes of the live tokens only (the groups were
     * repacked), the dropped group's scale and min gone. */
    CHECKF((double)kvs_store_bytes(s) == view_bytes(s, 0, hd) + view_bytes(s, 1, hd) &&
           kvs_store_bytes(s) < bytes_before,
           "hd %d after eviction: %zu bytes, view says %.0f, before %zu", hd,
           kvs_store_bytes(s), view_bytes(s, 0, hd) + view_bytes(s, 1, hd), bytes_before);
    check_alloc(s, hd, 0);
    /* Appending after eviction keeps flushing by the rules. */
    for (int32_t p = N; p < N + R; p++) {
        float kk[NKV * hd], vv[NKV * hd];
        fill(kk, 1, hd);
        fill(vv, 1, hd);
        CHECK(app(s, 1, kk, vv, &p, &err) == KVS_OK);
    }
    kvs_store_kivi_view(s, 0, 0, &view);
    const int c = kvs_store_count(s, 0, 0);
    CHECKF(c - view.nqk < R && c - view.nqv == R, "after appends: count %d, nqk %d, nqv %d", c,
           view.nqk, view.nqv);
    kvs_store_free(s);
    free(k);
    free(v);
    free(before);
}

/* §3.2 for a full cache: KIVI-b bytes = N_q*h*b/8 + n_groups*2*2 + N_resid*h*2, per kind, plus
 * the 4-byte position of every slot (counted for F32 and F16 stores too). */
static void bytes_exact(int hd, int kb, int vb)
{
    const int N = 384 + 77, G = 32, R = 128;
    kvs_store *s = new_kivi(hd, kb, vb, G, R);
    float *k = malloc(sizeof(float) * N * NKV * hd), *v = malloc(sizeof(float) * N * NKV * hd);
    int32_t pos[N];
    for (int i = 0; i < N; i++)
        pos[i] = i;
    fill(k, N, hd);
    fill(v, N, hd);
    kvs_error err = {0};
    CHECK(app(s, N, k, v, pos, &err) == KVS_OK);
    const double nqk = N - N % R, nqv = N - R, gv = hd < G ? 1 : hd / G;
    const double key = nqk * hd * kb / 8 + (nqk / G * hd) * 2 * 2 + (N - nqk) * hd * 2;
    const double val = nqv * hd * vb / 8 + (nqv * gv) * 2 * 2 + (N - nqv) * hd * 2;
    /* plus the first slot of each key group (4 bytes, what locates a group after eviction) */
    const double want = NKV * (key + val + 4.0 * N + 4.0 * (nqk / G));
    CHECKF((double)kvs_store_bytes(s) == want, "hd %d k%d v%d: %zu bytes, formula %.0f", hd, kb,
           vb, kvs_store_bytes(s), want);
    check_alloc(s, hd, N);
    /* Token by token to the same N: the same bytes, and the allocation still follows. */
    kvs_store *t = new_kivi(hd, kb, vb, G, R);
    for (int i = 0; i < N; i++) {
        float kk[NKV * hd], vv[NKV * hd];
        for (int h = 0; h < NKV; h++) {
            memcpy(kk + h * hd, k + ((size_t)i * NKV + h) * hd, sizeof(float) * hd);
            memcpy(vv + h * hd, v + ((size_t)i * NKV + h) * hd, sizeof(float) * hd);
        }
        CHECK(app(t, 1, kk, vv, pos + i, &err) == KVS_OK);
    }
    CHECKF((double)kvs_store_bytes(t) == want, "hd %d k%d v%d token by token: %zu bytes, "
           "formula %.0f", hd, kb, vb, kvs_store_bytes(t), want);
    check_alloc(t, hd, N);
    kvs_store_free(t);
    kvs_store_free(s);
    free(k);
    free(v);
}

/* Attention over the KIVI store equals attention over an F32 store holding its dequantised
 * keys and values (kvs_store_key_f32 / value_f32), for prefill-sized and single query rows,
 * with a selection, and after an eviction. */
static void attention_matches_dequantised(int hd, int kb, int vb)
{
    const int N = 333, NH = 4, G = 32, R = 128;
    kvs_store *s = new_kivi(hd, kb, vb, G, R);
    float *k = malloc(sizeof(float) * N * NKV * hd), *v = malloc(sizeof(float) * N * NKV * hd);
    int32_t pos[N];
    for (int i = 0; i < N; i++)
        pos[i] = 2 * i;
    fill(k, N, hd);
    fill(v, N, hd);
    kvs_error err = {0};
    CHECK(app(s, N, k, v, pos, &err) == KVS_OK);
    int keep[N], n = 0;
    for (int i = 0; i < N; i++)
        if (i % 7 != 3)
            keep[n++] = i;
    kvs_store_keep(s, 0, 1, keep, n); /* head 1 evicted, head 0 not */
    kvs_pool *pool = kvs_pool_create(2);
    kvs_attn_scratch *sa = kvs_attn_scratch_new(), *sb = kvs_attn_scratch_new();
    const int QN = 20;
    float *q = malloc(sizeof(float) * QN * NH * hd), *oa = malloc(sizeof(float) * QN * NH * hd),
          *ob = malloc(sizeof(float) * QN * NH * hd);
    for (int i = 0; i < QN * NH * hd; i++)
        q[i] = frand();
    int32_t qpos[QN];
    for (int i = 0; i < QN; i++)
        qpos[i] = 2 * N - 2 * QN + 2 * i;
    for (int h = 0; h < NKV; h++) {
        kvs_store_config oc = {1, 1, hd, MAXS, KVS_F32, 0};
        kvs_store *one = kvs_store_new(&oc);
        const int c = kvs_store_count(s, 0, h);
        float *kr = malloc(sizeof(float) * c * hd), *vr = malloc(sizeof(float) * c * hd);
        for (int i = 0; i < c; i++) {
            kvs_store_key_f32(s, 0, h, i, kr + (size_t)i * hd);
            kvs_store_value_f32(s, 0, h, i, vr + (size_t)i * hd);
        }
        CHECK(kvs_store_append(one, 0, c, kr, vr, kvs_store_pos(s, 0, h), &err) == KVS_OK);
        /* Query heads of KV head h against the single-head copy and the KIVI store. */
        for (int rows = 1; rows <= QN; rows += QN - 1) {
            const float *qq = q + (size_t)(QN - rows) * NH * hd;
            kvs_attn_args a = {.store = s, .layer = 0, .n_heads = NH, .n = rows, .q = qq,
                               .qpos = qpos + QN - rows, .out = oa};
            CHECK(kvs_attention(pool, sa, &a, &err) == KVS_OK);
            /* Same queries, the two heads of group h only, over the copy. */
            float *q1 = malloc(sizeof(float) * rows * 2 * hd);
            for (int i = 0; i < rows; i++)
                memcpy(q1 + (size_t)i * 2 * hd, qq + ((size_t)i * NH + 2 * h) * hd,
                       sizeof(float) * 2 * hd);
            kvs_attn_args b = {.store = one, .layer = 0, .n_heads = 2, .n = rows, .q = q1,
                               .qpos = qpos + QN - rows, .out = ob};
            CHECK(kvs_attention(pool, sb, &b, &err) == KVS_OK);
            float worst = 0.0f;
            for (int i = 0; i < rows; i++)
                for (int e = 0; e < 2 * hd; e++)
                    worst = fmaxf(worst, fabsf(oa[((size_t)i * NH + 2 * h) * hd + e] -
                                               ob[(size_t)i * 2 * hd + e]));
            CHECKF(worst < 2e-5f, "hd %d k%d v%d head %d rows %d: max diff %g", hd, kb, vb, h,
                   rows, worst);
            free(q1);
        }
        /* One row with a selection (every other slot). */
        int sel[MAXS], ns = 0;
        /* (one list for both KV heads: within the shorter head) */
        const int c1 = kvs_store_count(s, 0, 1) < c ? kvs_store_count(s, 0, 1) : c;
        for (int i = 0; i < c1; i += 2)
            sel[ns++] = i;
        const int *selp[NKV] = {sel, sel};
        int nsel[NKV] = {ns, ns};
        kvs_attn_args a = {.store = s, .layer = 0, .n_heads = NH, .n = 1, .q = q,
                           .qpos = qpos + QN - 1, .out = oa, .sel = selp, .n_sel = nsel};
        CHECK(kvs_attention(pool, sa, &a, &err) == KVS_OK);
        float q1[2 * hd];
        memcpy(q1, q + (size_t)2 * h * hd, sizeof q1);
        kvs_attn_args b = {.store = one, .layer = 0, .n_heads = 2, .n = 1, .q = q1,
                           .qpos = qpos + QN - 1, .out = ob, .sel = selp, .n_sel = nsel};
        CHECK(kvs_attention(pool, sb, &b, &err) == KVS_OK);
        float worst = 0.0f;
        for (int e = 0; e < 2 * hd; e++)
            worst = fmaxf(worst, fabsf(oa[(size_t)2 * h * hd + e] - ob[e]));
        CHECKF(worst < 2e-5f, "hd %d head %d with selection: max diff %g", hd, h, worst);
        kvs_store_free(one);
        free(kr);
        free(vr);
    }
    kvs_attn_scratch_free(sa);
    kvs_attn_scratch_free(sb);
    kvs_pool_destroy(pool);
    kvs_store_free(s);
    free(q);
    free(oa);
    free(ob);
    free(k);
    free(v);
}

/* A first prompt batch, not yet flushed, is plain F16: the matrix-product path must give what
 * an F16 store gives. */
static void unflushed_batch_is_f16(void)
{
    const int hd = 8, N = 200, NH = 4;
    kvs_store *s = new_kivi(hd, 2, 2, 32, 128);
    kvs_store_config fc = {1, NKV, hd, MAXS, KVS_F16, 0};
    kvs_store *f = kvs_store_new(&fc);
    float *k = malloc(sizeof(float) * N * NKV * hd), *v = malloc(sizeof(float) * N * NKV * hd);
    float *q = malloc(sizeof(float) * N * NH * hd), *oa = malloc(sizeof(float) * N * NH * hd),
          *ob = malloc(sizeof(float) * N * NH * hd);
    int32_t pos[N];
    for (int i = 0; i < N; i++)
        pos[i] = i;
    fill(k, N, hd);
    fill(v, N, hd);
    for (int i = 0; i < N * NH * hd; i++)
        q[i] = frand();
    kvs_error err = {0};
    CHECK(kvs_store_append(s, 0, N, k, v, pos, &err) == KVS_OK);
    CHECK(kvs_store_append(f, 0, N, k, v, pos, &err) == KVS_OK);
    kvs_pool *pool = kvs_pool_create(2);
    kvs_attn_scratch *sc = kvs_attn_scratch_new();
    kvs_attn_args a = {.store = s, .layer = 0, .n_heads = NH, .n = N, .q = q, .qpos = pos, .out = oa};
    CHECK(kvs_attention(pool, sc, &a, &err) == KVS_OK);
    a.store = f;
    a.out = ob;
    CHECK(kvs_attention(pool, sc, &a, &err) == KVS_OK);
    CHECK(memcmp(oa, ob, sizeof(float) * N * NH * hd) == 0);
    kvs_attn_scratch_free(sc);
    kvs_pool_destroy(pool);
    kvs_store_free(s);
    kvs_store_free(f);
    free(k);
    free(v);
    free(q);
    free(oa);
    free(ob);
}

/* The kernels against a double-precision dequantise-then-multiply reference. */
static void kernels_match_reference(void)
{
    const int hd = 64, G = 32;
    for (int bits = 1; bits <= 8; bits *= 2) {
        float x[hd], w[hd], y[hd], yref[hd], deq[hd];
        uint8_t codes[hd], row[256];
        memset(codes, 0, sizeof codes);
        double ref = 0;
        for (int d = 0; d < hd; d++) {
            x[d] = frand();
            w[d] = frand();
            int c = (int)((rng >> 5) % (1u << bits));
            kvs_kivi_set(codes, bits, d, c);
            ref += (double)w[d] * c;
        }
        CHECK(fabs(kvs_dot_kivi_codes(codes, bits, w, hd) - ref) < 1e-4 * (1 << bits));
        for (int n = 1; n <= hd; n++) /* every length: the vector body and the scalar tail */
            CHECKF(fabsf(kvs_dot_kivi_codes(codes, bits, w, n) -
                         kvs_dot_kivi_codes_ref(codes, bits, w, n)) < 1e-4f * (1 << bits),
                   "bits %d n %d", bits, n);
        kvs_kivi_quantize_value_row(x, hd, bits, G, row);
        kvs_kivi_dequantize_value_row(row, hd, bits, G, deq);
        for (int d = 0; d < hd; d++)
            y[d] = yref[d] = (float)d;
        kvs_axpy_kivi_value(y, 0.37f, row, hd, bits, G);
        float worst = 0;
        for (int d = 0; d < hd; d++)
            worst = fmaxf(worst, fabsf(y[d] - (float)((double)yref[d] + 0.37 * deq[d])));
        CHECKF(worst < 1e-5f, "axpy bits %d: diff %g", bits, worst);
    }
}

/* The group-wise key scores and the folded value sums against their scalar references, for
 * full groups (the vector paths) and groups shrunk by eviction, every bit width, head_dim 8
 * (a value group is the whole head) and 64 / 128. */
static void group_kernels_match_reference(void)
{
    for (int hd = 8; hd <= 128; hd *= 2) {
        if (hd == 16 || hd == 32)
            continue;
        for (int bits = 1; bits <= 8; bits *= 2) {
            const int ns[] = {32, 31, 5, 1, 16, 40, 64, 65};
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int n = ns[ni];
                uint8_t codes[128 * 65];
                float qs[128], out[65], ref[65];
                memset(codes, 0, sizeof codes);
                for (int c = 0; c < hd; c++) {
                    qs[c] = frand();
                    for (int j = 0; j < n; j++)
                        kvs_kivi_set(codes, bits, c * n + j, (int)((rng >> 7) % (1u << bits)) ^ j % 2);
                    (void)frand();
                }
                if (n == 32) { /* the per-group preparation */
                    uint16_t sm[256];
                    float q[128], qa[128], qb[128];
                    for (int c = 0; c < 2 * hd; c++)
                        sm[c] = kvs_fp32_to_fp16(frand());
                    for (int c = 0; c < hd; c++)
                        q[c] = frand();
                    const float ba = kvs_kivi_key_prep(q, sm, hd, qa),
                                bb = kvs_kivi_key_prep_ref(q, sm, hd, qb);
                    CHECKF(fabsf(ba - bb) < 1e-5f * hd && memcmp(qa, qb, sizeof(float) * hd) == 0,
                           "key prep hd %d: bias %g vs %g", hd, ba, bb);
                }
                kvs_kivi_key_scores(codes, n, hd, bits, qs, 0.25f, out);
                kvs_kivi_key_scores_ref(codes, n, hd, bits, qs, 0.25f, ref);
                float worst = 0;
                for (int j = 0; j < n; j++)
                    worst = fmaxf(worst, fabsf(out[j] - ref[j]));
                CHECKF(worst < 1e-5f * hd * (1 << bits), "key scores hd %d bits %d n %d: %g", hd,
                       bits, n, worst);
            }
            /* values: 37 rows, groups of 32 channels (of the whole head when hd < 32) */
            const int G = 32, N = 37;
            const size_t rb = kvs_kivi_value_row_bytes(hd, bits, G);
            uint8_t rows[37 * 160];
            float x[128], p[37], y[128], yref[128], yacc[128], m[8], mref[8], macc[8];
            for (int t = 0; t < N; t++) {
                for (int d = 0; d < hd; d++)
                    x[d] = frand() * (1 + d % 3);
                kvs_kivi_quantize_value_row(x, hd, bits, G, rows + (size_t)t * rb);
                p[t] = (frand() + 1.0f) / N;
            }
            for (int d = 0; d < hd; d++)
                y[d] = yref[d] = yacc[d] = (float)d / 7;
            memset(m, 0, sizeof m);
            memset(mref, 0, sizeof mref);
            memset(macc, 0, sizeof macc);
            kvs_kivi_value_rows(y, m, rows, rb, p, N, hd, bits, G);
            kvs_kivi_value_rows_ref(yref, mref, rows, rb, p, N, hd, bits, G);
            for (int t = 0; t < N; t++)
                kvs_kivi_value_acc(yacc, macc, rows + (size_t)t * rb, p[t], hd, bits, G);
            kvs_kivi_value_finish(y, m, hd, G);
            kvs_kivi_value_finish(yref, mref, hd, G);
            kvs_kivi_value_finish(yacc, macc, hd, G);
            /* and the plain definition: sum_t p_t * dequant(row_t) */
            float worst = 0, deq[128];
            double def[128];
            for (int d = 0; d < hd; d++)
                def[d] = (double)d / 7;
            for (int t = 0; t < N; t++) {
                kvs_kivi_dequantize_value_row(rows + (size_t)t * rb, hd, bits, G, deq);
                for (int d = 0; d < hd; d++)
                    def[d] += (double)p[t] * deq[d];
            }
            for (int d = 0; d < hd; d++) {
                worst = fmaxf(worst, fabsf(y[d] - yref[d]));
                worst = fmaxf(worst, fabsf(yacc[d] - yref[d]));
                worst = fmaxf(worst, fabsf(yref[d] - (float)def[d]));
            }
            CHECKF(worst < 2e-5f * (1 << bits), "values hd %d bits %d: %g", hd, bits, worst);
        }
    }
}

/* The float-argument code equals kvs_kivi_code (roundf) everywhere, ties included. */
static void code_f_matches(void)
{
    int bad = 0;
    for (int bits = 1; bits <= 8; bits *= 2)
        for (int i = 0; i < 200000; i++) {
            const float m = frand() * 3, x = i % 7 == 0 ? m + (float)(i % 40) * 0.125f : frand() * 4;
            const uint16_t hs = kvs_fp32_to_fp16(i % 11 == 0 ? 0.25f : fabsf(frand()) + 1e-3f),
                           hm = kvs_fp32_to_fp16(m);
            bad += kvs_kivi_code(x, hs, hm, bits) !=
                   kvs_kivi_code_f(x, kvs_fp16_to_fp32(hs), kvs_fp16_to_fp32(hm), bits);
        }
    CHECKF(bad == 0, "%d codes differ from roundf's", bad);
}

static void parse_errors(void)
{
    kvs_kivi_cfg c;
    kvs_error err = {0};
    CHECK(kvs_kivi_parse("kivi4", &c, &err) == 1 && c.k_bits == 4 && c.v_bits == 4 &&
          c.group == 32 && c.residual == 128);
    CHECK(kvs_kivi_parse("kivi2", &c, &err) == 1 && c.k_bits == 2 && c.v_bits == 2);
    CHECK(kvs_kivi_parse("kivi:kbits=2,vbits=4,group=16,residual=64", &c, &err) == 1 &&
          c.k_bits == 2 && c.v_bits == 4 && c.group == 16 && c.residual == 64);
    CHECK(kvs_kivi_parse("f16", &c, &err) == 0);
    static const struct { const char *in, *msg; } bad[] = {
        {"kivi:group=7", "residual 128 must be a multiple of group 7 in [7, 65536]"},
        {"kivi:group=0", "group 0 is out of range [1, 1024]"},
        {"kivi:group=2048", "group 2048 is out of range [1, 1024]"},
        {"kivi:residual=16", "residual 16 must be a multiple of group 32"},
        {"kivi:kbits=3", "kbits and vbits must be 1, 2, 4 or 8"},
        {"kivi:vbits=0", "kbits and vbits must be 1, 2, 4 or 8"},
        {"kivi:bits=4", "unknown parameter 'bits' (kbits, vbits, group, residual)"},
        {"kivi:group=0x20", "group must be a whole number, not '0x20'"},
        {"kivi:group", "'group' is not KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = 0;
        int r = kvs_kivi_parse(bad[i].in, &c, &err);
        CHECKF(r == -1 && strstr(err.msg, bad[i].msg), "%s: %d '%s'", bad[i].in, r, err.msg);
    }
}

static void shift_refused(void)
{
    kvs_store *s = new_kivi(8, 4, 4, 32, 128);
    float k[NKV * 8], v[NKV * 8];
    fill(k, 1, 8);
    fill(v, 1, 8);
    int32_t p = 3, np = 1;
    kvs_error err = {0};
    CHECK(app(s, 1, k, v, &p, &err) == KVS_OK);
    kvs_rope_cfg rope = {8, 10000.0f, 0};
    CHECK(kvs_store_shift(s, 0, 0, &np, &rope, &err) == KVS_ERR_UNSUPPORTED &&
          strstr(err.msg, "KIVI") && strstr(err.msg, "--kv-type"));
    CHECK(kvs_store_pos(s, 0, 0)[0] == 3);
    kvs_store_free(s);
}

int main(void)
{
    kernels_match_reference();
    group_kernels_match_reference();
    code_f_matches();
    parse_errors();
    for (int hd = 8; hd <= 64; hd *= 8)
        for (int b = 2; b <= 4; b += 2) {
            round_trip_and_prefill_split(hd, b, b, 384);
            round_trip_and_prefill_split(hd, b, 6 - b, 300);
            round_trip_and_prefill_split(hd, b, b, 100);
            bytes_exact(hd, b, b);
            bytes_exact(hd, b, 6 - b);
            attention_matches_dequantised(hd, b, b);
        }
    residual_flushes_at_r();
    flush_deferred_to_after_attention();
    unflushed_batch_is_f16();
    eviction_from_groups(8);
    eviction_from_groups(64);
    shift_refused();
    return check_summary("test_kivi");
}
