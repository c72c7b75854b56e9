/* MiniCache (minicache.md §7), on two levels.
 * Synthetic: a kv layer driven directly with known K/V (adjacent layers similar, a few tokens
 * very different), so that every restored vector can be checked against its original:
 *   T6 restored norms (F32, F16 and KIVI-4 pair stores, fp16 and fp32 norms, per token and per
 *   head), T7 retained rows bit-exact, T13 the fused attention of every pair layer at every
 *   decode step against a materialised fp64 reference, T14 bookkeeping after every step, T17
 *   accounting (the state's bytes by component against the live buffers, the temporary prompt
 *   copies in the peak, and §3.2's formula = 4h / (3.1h + 2) at exactly 5% retention), bad
 *   input (1 layer, start / layers beyond the model, both given).
 * stories260K (sample-512, prompt 384, teacher-forced): T9 (retain=all and no pairs equal the
 * full cache), T10 (prefill logits identical, layers below S bit-identical caches), and the
 * reference numbers of fidelity-methods-2.md (KL 0.9426 / top-1 0.520 on F32, one retained
 * token of K and of V in pair (2,3); KL 0.9563 with KIVI-4, both against the exact F32 cache). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/kernels.h"
#include "engine/session_internal.h"
#include "fixture.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "policies/minicache_internal.h"
#include "policies/minicache_merge.h"
#include "policies/registry.h"
#include "policy_check.h"

/* ---- synthetic driver ---- */

typedef struct drv {
    kvs_kv *kv;
    kvs_pool *pool;
    int L, nkv, nh, hd, h, T; /* T: tokens fed */
    float *K, *V;             /* [L][ctx][h] every token's exact k, v */
    int ctx;
    uint32_t rng;
    double t13_max, t6_max;
    long t13_rows, t6_rows;
} drv;

static float urand(drv *d)
{
    d->rng = d->rng * 1664525u + 1013904223u;
    return (float)((d->rng >> 8) / 16777216.0) * 2.0f - 1.0f;
}

static kvs_status drv_new(drv *d, const char *spec, const char *kv_type, int L, int nkv, int hd,
                          int ctx, kvs_error *err)
{
    memset(d, 0, sizeof *d);
    d->L = L, d->nkv = nkv, d->nh = 2 * nkv, d->hd = hd, d->h = nkv * hd, d->ctx = ctx;
    d->rng = 12345;
    kvs_policy_spec ps;
    kvs_status st = kvs_policy_parse(spec, &ps, err);
    if (st != KVS_OK)
        return st;
    kvs_kivi_cfg kc;
    int kivi = kv_type ? kvs_kivi_parse(kv_type, &kc, err) : 0;
    kvs_kv_config cfg = {L, d->nh, nkv, hd, ctx,
                         kivi || (kv_type && !strcmp(kv_type, "f16")) ? KVS_F16 : KVS_F32, 0};
    if ((st = kvs_kv_new(&cfg, &ps, &d->kv, err)) != KVS_OK)
        return st;
    if (kivi && (st = kvs_kv_set_kivi(d->kv, &kc, err)) != KVS_OK)
        return st;
    d->pool = kvs_pool_create(1);
    d->K = calloc((size_t)L * ctx * d->h, sizeof(float));
    d->V = calloc((size_t)L * ctx * d->h, sizeof(float));
    return d->pool && d->K && d->V ? KVS_OK : KVS_ERR_NOMEM;
}

static void drv_free(drv *d)
{
    kvs_kv_free(d->kv);
    kvs_pool_destroy(d->pool);
    free(d->K);
    free(d->V);
}

static float *row(const drv *d, float *x, int l, int i) { return x + ((size_t)l * d->ctx + i) * d->h; }

/* Token i's k, v of every layer: layer l = 0.8 * layer l-1 + noise, except every 17th token,
 * whose layers disagree (a distinct token for the retention to find). */
static void gen_token(drv *d, int i)
{
    for (int l = 0; l < d->L; l++)
        for (int x = 0; x < d->h; x++) {
            float nk = urand(d), nv = urand(d);
            int odd = i % 17 == 5;
            row(d, d->K, l, i)[x] = l && !odd ? 0.8f * row(d, d->K, l - 1, i)[x] + 0.3f * nk : nk;
            row(d, d->V, l, i)[x] = l && !odd ? 0.8f * row(d, d->V, l - 1, i)[x] + 0.3f * nv : -nv;
        }
}

static const kvs_policy *pol(const drv *d) { return kvs_kv_policy(d->kv); }

static double norm_of(const float *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return sqrt(s);
}

/* A retained set's position of token i, or -1. */
static int ret_pos(const int32_t *idx, int n, int i)
{
    for (int j = 0; j < n; j++)
        if (idx[j] == i)
            return j;
    return -1;
}

static void exact_to_f32(const void *rows, kvs_dtype t, size_t at, int n, float *out)
{
    if (t == KVS_F16)
        kvs_dequantize_row(KVS_F16, (const char *)rows + at * 2, out, n);
    else
        memcpy(out, (const float *)rows + at, sizeof(float) * n);
}

/* The restored row of kind of layer r of pair j, token i, KV head kvh (§2.8 restore_r,
 * materialised). */
static void restored_row(const drv *d, int j, int kind, int r, int i, int kvh, float *out)
{
    const kvs_policy *p = pol(d);
    int D;
    const int U = kvs_mc_units(p, &D), u = U == 1 ? 0 : kvh;
    const int32_t *idx;
    const void *ra, *rb;
    kvs_dtype t;
    int n = kvs_mc_retained(p, j, kind, u, &idx, &ra, &rb, &t), at = ret_pos(idx, n, i);
    if (at >= 0) {
        exact_to_f32(r ? rb : ra, t, (size_t)at * D + (U == 1 ? (size_t)kvh * d->hd : 0), d->hd,
                     out);
        return;
    }
    const kvs_store *ps = kvs_mc_pair_store(p);
    if (kind == KVS_MC_K)
        kvs_store_key_f32(ps, j, kvh, i, out);
    else
        kvs_store_value_f32(ps, j, kvh, i, out);
    const float s = kvs_mc_scale(p, j, kind, r, u, i);
    for (int x = 0; x < d->hd; x++)
        out[x] *= s;
}

/* T13: the fused attention of layer l (of pair j, r) for q at position pos against the
 * materialised view in fp64: restored rows [0, count) plus the exact k, v as the tail. */
static void reference_attention(const drv *d, int j, int r, const float *q, const float *k,
                                const float *v, float *out)
{
    const int n = kvs_store_count(kvs_mc_pair_store(pol(d)), j, 0), group = d->nh / d->nkv;
    double sc[n + 1];
    float kr[d->hd], vr[d->hd];
    for (int qh = 0; qh < d->nh; qh++) {
        const int kvh = qh / group;
        const float *qq = q + (size_t)qh * d->hd;
        double m = -INFINITY, z = 0, acc[d->hd];
        for (int i = 0; i <= n; i++) {
            if (i < n)
                restored_row(d, j, KVS_MC_K, r, i, kvh, kr);
            const float *kk = i < n ? kr : k + (size_t)kvh * d->hd;
            double s = 0;
            for (int x = 0; x < d->hd; x++)
                s += (double)qq[x] * kk[x];
            sc[i] = s / sqrt((double)d->hd);
            m = sc[i] > m ? sc[i] : m;
        }
        memset(acc, 0, sizeof acc);
        for (int i = 0; i <= n; i++) {
            double w = exp(sc[i] - m);
            z += w;
            if (i < n)
                restored_row(d, j, KVS_MC_V, r, i, kvh, vr);
            const float *vv = i < n ? vr : v + (size_t)kvh * d->hd;
            for (int x = 0; x < d->hd; x++)
                acc[x] += w * vv[x];
        }
        for (int x = 0; x < d->hd; x++)
            out[(size_t)qh * d->hd + x] = (float)(acc[x] / z);
    }
}

/* Feeds n tokens (a prompt when d->T == 0, else one decode token), checking T13 on every pair
 * layer of a decode step. */
static kvs_status drv_feed(drv *d, int n, kvs_error *err)
{
    const int T0 = d->T;
    kvs_status st;
    if (T0 == 0 && (st = kvs_kv_begin_prompt(d->kv, n, err)) != KVS_OK)
        return st;
    float *q = malloc(sizeof(float) * (size_t)n * d->nh * d->hd), *out = malloc(sizeof(float) *
                                                                                 (size_t)n * d->nh *
                                                                                 d->hd);
    float *k = malloc(sizeof(float) * (size_t)n * d->h), *v = malloc(sizeof(float) * (size_t)n * d->h);
    float ref[d->nh * d->hd];
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    if (!q || !out || !k || !v || !pos)
        return KVS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        gen_token(d, T0 + i);
        pos[i] = T0 + i;
    }
    st = KVS_OK;
    for (int l = 0; l < d->L && st == KVS_OK; l++) {
        for (int i = 0; i < n; i++) {
            memcpy(k + (size_t)i * d->h, row(d, d->K, l, T0 + i), sizeof(float) * d->h);
            memcpy(v + (size_t)i * d->h, row(d, d->V, l, T0 + i), sizeof(float) * d->h);
        }
        for (int x = 0; x < n * d->nh * d->hd; x++)
            q[x] = 2.0f * urand(d);
        const kvs_policy *p = pol(d);
        int np = kvs_mc_n_pairs(p), j = -1, r = 0;
        for (int jj = 0; jj < np; jj++)
            if (l == kvs_mc_pair_first(p, jj) || l == kvs_mc_pair_first(p, jj) + 1)
                j = jj, r = l - kvs_mc_pair_first(p, jj);
        const int check = T0 > 0 && j >= 0;
        if (check)
            reference_attention(d, j, r, q, k, v, ref);
        st = kvs_kv_layer(d->kv, d->pool, l, n, q, k, v, pos, out, err);
        if (st == KVS_OK && check) {
            for (int x = 0; x < d->nh * d->hd; x++) {
                double e = fabs((double)out[x] - ref[x]);
                d->t13_max = e > d->t13_max || e != e ? e : d->t13_max;
            }
            d->t13_rows++;
        }
    }
    if (st == KVS_OK) {
        kvs_kv_end_batch(d->kv, n);
        d->T += n;
    }
    free(q);
    free(out);
    free(k);
    free(v);
    free(pos);
    return st;
}

/* T6, T7, T14 on the driver's state: every (pair, kind, layer, token, unit). */
static void check_state(drv *d, const char *what, int frozen)
{
    const kvs_policy *p = pol(d);
    const kvs_store *ps = kvs_mc_pair_store(p), *main = kvs_kv_store(d->kv);
    int D;
    const int U = kvs_mc_units(p, &D), np = kvs_mc_n_pairs(p);
    const int prompt = p->n_prompt;
    CHECKF(!kvs_mc_pending(p), "%s: a pair holds a pending token", what);
    int bad14 = 0, bad7 = 0;
    for (int l = 0; l < d->L; l++) {
        int merged = 0;
        for (int j = 0; j < np; j++)
            merged |= l == kvs_mc_pair_first(p, j) || l == kvs_mc_pair_first(p, j) + 1;
        for (int h = 0; h < d->nkv; h++)
            bad14 += kvs_store_count(main, l, h) != (merged ? 0 : d->T);
    }
    for (int j = 0; j < np; j++) {
        for (int h = 0; h < d->nkv; h++)
            bad14 += kvs_store_count(ps, j, h) != d->T;
        const int la = kvs_mc_pair_first(p, j);
        for (int kind = 0; kind < 2; kind++)
            for (int u = 0; u < U; u++) {
                const int32_t *idx;
                const void *ra, *rb;
                kvs_dtype t;
                int n = kvs_mc_retained(p, j, kind, u, &idx, &ra, &rb, &t);
                for (int x = 0; x < n; x++) {
                    bad14 += idx[x] < 0 || idx[x] >= (frozen ? d->T : prompt) ||
                             (x && idx[x] <= idx[x - 1]);
                    /* T7: the exact rows are the originals in the exact type, bit for bit */
                    for (int r = 0; r < 2; r++) {
                        const float *orig = row(d, kind ? d->V : d->K, la + r, idx[x]) + u * D;
                        const void *got = (const char *)(r ? rb : ra) +
                                          (size_t)x * D * (t == KVS_F16 ? 2 : 4);
                        if (t == KVS_F16) {
                            uint16_t want[D];
                            kvs_quantize_row(KVS_F16, orig, want, D);
                            bad7 += memcmp(want, got, sizeof want) != 0;
                        } else {
                            bad7 += memcmp(orig, got, sizeof(float) * D) != 0;
                        }
                    }
                }
                /* T6: ||restored|| = ||original|| for every token not retained */
                float e[d->hd];
                for (int i = 0; i < d->T; i++) {
                    if (ret_pos(idx, n, i) >= 0)
                        continue;
                    for (int r = 0; r < 2; r++) {
                        double sq = 0;
                        for (int h = U == 1 ? 0 : u; h < (U == 1 ? d->nkv : u + 1); h++) {
                            restored_row(d, j, kind, r, i, h, e);
                            sq += norm_of(e, d->hd) * norm_of(e, d->hd);
                        }
                        const double want = norm_of(row(d, kind ? d->V : d->K, la + r, i) + u * D,
                                                    D);
                        const double rel = fabs(sqrt(sq) - want) / want;
                        d->t6_max = rel > d->t6_max || rel != rel ? rel : d->t6_max;
                        d->t6_rows++;
                    }
                }
            }
    }
    CHECKF(bad14 == 0, "%s: %d bookkeeping violations (T14)", what, bad14);
    CHECKF(bad7 == 0, "%s: %d retained rows differ from the originals (T7)", what, bad7);
}

/* T17: the state's bytes by component are the live buffers. */
static void check_bytes(drv *d, const char *what, size_t prefill)
{
    const kvs_policy *p = pol(d);
    kvs_mc_bytes b;
    kvs_mc_state_bytes(p, &b);
    const kvs_store *ps = kvs_mc_pair_store(p);
    int D;
    const int U = kvs_mc_units(p, &D), np = kvs_mc_n_pairs(p);
    size_t ret = 0, esz = 0;
    for (int j = 0; j < np; j++)
        for (int kind = 0; kind < 2; kind++)
            for (int u = 0; u < U; u++) {
                const int32_t *idx;
                const void *ra, *rb;
                kvs_dtype t;
                int n = kvs_mc_retained(p, j, kind, u, &idx, &ra, &rb, &t);
                esz = t == KVS_F16 ? 2 : 4;
                ret += (size_t)n * (2 * esz * D + 4);
            }
    const size_t norm_sz = kvs_policy_param(p, "norm") == 1 ? 4 : 2;
    const size_t scales = kvs_policy_param(p, "merge") == 0 && np
                              ? (size_t)np * 4 * (size_t)kvs_store_count(ps, 0, 0) * U * norm_sz
                              : 0;
    const size_t pair_bytes = np ? kvs_store_bytes(ps) : 0;
    CHECKF(b.pair_store == pair_bytes, "%s: pair store %zu vs %zu", what, b.pair_store,
           pair_bytes);
    CHECKF(b.scales == scales, "%s: scales %zu bytes, expected %zu", what, b.scales, scales);
    CHECKF(b.retained == ret, "%s: retained %zu bytes, expected %zu", what, b.retained, ret);
    CHECKF(b.prefill == prefill, "%s: prompt copies %zu bytes, expected %zu", what, b.prefill,
           prefill);
    CHECKF(b.pending == (size_t)np * 2 * 4 * d->h, "%s: pending %zu bytes", what, b.pending);
    const size_t total = b.pair_store + b.scales + b.retained + b.prefill + b.pending;
    CHECKF(kvs_kv_bytes(d->kv) == kvs_store_bytes(kvs_kv_store(d->kv)) + total,
           "%s: kv bytes %zu vs store + state %zu", what, kvs_kv_bytes(d->kv),
           kvs_store_bytes(kvs_kv_store(d->kv)) + total);
}

/* A synthetic run: prompt of n tokens, then steps decode tokens, every check on the way. */
static void synthetic(const char *spec, const char *type, int L, int nkv, int hd, int n,
                      int steps, double t6_tol)
{
    drv d;
    kvs_error err = {0};
    char what[160];
    snprintf(what, sizeof what, "%s on %s (L=%d, %d x %d, prompt %d)", spec, type ? type : "f32",
             L, nkv, hd, n);
    kvs_status st = drv_new(&d, spec, type, L, nkv, hd, n + steps + 1, &err);
    CHECKF(st == KVS_OK, "%s: %s", what, err.msg);
    if (st == KVS_OK)
        st = drv_feed(&d, n, &err);
    CHECKF(st == KVS_OK, "%s: prompt: %s", what, err.msg);
    const int frozen = st == KVS_OK && (kvs_policy_param(pol(&d), "decode_retain") == 1 ||
                                        kvs_policy_param(pol(&d), "retain") == 3);
    if (st == KVS_OK) {
        check_state(&d, what, frozen);
        check_bytes(&d, what, 0);
    }
    for (int s = 0; s < steps && st == KVS_OK; s++) {
        st = drv_feed(&d, 1, &err);
        CHECKF(st == KVS_OK, "%s: step %d: %s", what, s, err.msg);
        if (st == KVS_OK)
            check_state(&d, what, frozen);
    }
    if (st == KVS_OK)
        check_bytes(&d, what, 0);
    printf("%-58s T6 max rel %.2e (%ld), T13 max abs %.2e (%ld rows)\n", what, d.t6_max,
           d.t6_rows, d.t13_max, d.t13_rows);
    CHECKF(d.t6_max < t6_tol, "%s: restored norm off by %g (T6)", what, d.t6_max);
    CHECKF(d.t13_max < 1e-5, "%s: fused vs materialised attention differ by %g (T13)", what,
           d.t13_max);
    CHECKF(steps == 0 || !strcmp(spec, "minicache:start=3") || d.t13_rows > 0,
           "%s: no pair layer checked", what);
    drv_free(&d);
}

/* The prompt copies count while they exist, and in the peak (T17). */
static void prompt_copies(void)
{
    drv d;
    kvs_error err = {0};
    const int N = 64;
    kvs_status st = drv_new(&d, "minicache", NULL, 4, 2, 8, N + 1, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st != KVS_OK)
        return;
    st = kvs_kv_begin_prompt(d.kv, N, &err);
    float q[N * 4 * 8], out[N * 4 * 8];
    int32_t pos[N];
    for (int i = 0; i < N; i++) {
        gen_token(&d, i);
        pos[i] = i;
    }
    size_t peak_want = 0;
    for (int l = 0; l < 4 && st == KVS_OK; l++) {
        float k[N * 16], v[N * 16];
        for (int i = 0; i < N; i++) {
            memcpy(k + i * 16, row(&d, d.K, l, i), sizeof(float) * 16);
            memcpy(v + i * 16, row(&d, d.V, l, i), sizeof(float) * 16);
        }
        for (int x = 0; x < N * 4 * 8; x++)
            q[x] = urand(&d);
        /* before layer 3 (b) is merged: the main store with it, and both layers' copies */
        if (l == 3) /* + layer b's rows in the store, + its K, V copies */
            peak_want = kvs_kv_bytes(d.kv) + (size_t)N * 2 * kvs_store_slot_bytes(
                            kvs_kv_store(d.kv)) + (size_t)N * 16 * 2 * 4;
        st = kvs_kv_layer(d.kv, d.pool, l, N, q, k, v, pos, out, &err);
        if (l == 2 && st == KVS_OK) /* layer a copied: its K and V, and the positions */
            check_bytes(&d, "after layer a's prompt", (size_t)N * 2 * 16 * 4 + N * 4);
    }
    CHECKF(st == KVS_OK, "%s", err.msg);
    check_bytes(&d, "after the merge", 0);
    CHECKF(kvs_kv_peak_bytes(d.kv) >= peak_want, "peak %zu below the moment before the merge %zu",
           kvs_kv_peak_bytes(d.kv), peak_want);
    drv_free(&d);
}

/* T17's formula case: fp16, per-token units, S = L/2 with L = 4, exactly 5% retained (topfrac,
 * N = 100): §3.2 without positions and indices gives 4h / (3.1h + 2). */
static void formula_case(void)
{
    drv d;
    kvs_error err = {0};
    const int N = 100;
    kvs_status st = drv_new(&d, "minicache:retain=topfrac", "f16", 4, 2, 8, N + 1, &err);
    if (st == KVS_OK)
        st = drv_feed(&d, N, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st != KVS_OK)
        return;
    const kvs_policy *p = pol(&d);
    const kvs_store *main = kvs_kv_store(d.kv), *ps = kvs_mc_pair_store(p);
    kvs_mc_bytes b;
    kvs_mc_state_bytes(p, &b);
    int n_ret = 0;
    for (int kind = 0; kind < 2; kind++) {
        const int32_t *idx;
        const void *ra, *rb;
        kvs_dtype t;
        int n = kvs_mc_retained(p, 0, kind, 0, &idx, &ra, &rb, &t);
        CHECKF(n == 5, "kind %d: %d retained, want 5%% of 100", kind, n);
        n_ret += n;
    }
    const double mc = (double)kvs_store_bytes(main) - 4.0 * kvs_store_total_slots(main) +
                      (double)kvs_store_bytes(ps) - 4.0 * kvs_store_total_slots(ps) +
                      (double)b.scales + (double)b.retained - 4.0 * n_ret;
    const int h = d.h;
    const double full = 2.0 * 4 * N * h * 2, ratio = full / mc, want = 4.0 * h / (3.1 * h + 2);
    printf("formula case: measured ratio %.12f, 4h/(3.1h+2) = %.12f, paper %.12f\n", ratio, want,
           kvs_mc_full_f16_bytes(4, h, N) / kvs_mc_paper_bytes(4, h, N));
    CHECKF(fabs(ratio - want) < 1e-9, "ratio %.12f vs %.12f", ratio, want);
    CHECKF(fabs(kvs_mc_full_f16_bytes(4, h, N) / kvs_mc_paper_bytes(4, h, N) - want) < 1e-9,
           "paper formula");
    drv_free(&d);
}

/* Bad input: clear messages naming the parameter and the range, at the prompt's start. */
static int start_error(const char *spec, int L, const char *needle)
{
    drv d;
    kvs_error err = {0};
    kvs_status st = drv_new(&d, spec, NULL, L, 2, 8, 16, &err);
    if (st == KVS_OK)
        st = kvs_kv_begin_prompt(d.kv, 8, &err);
    drv_free(&d);
    int ok = st == KVS_ERR_ARG && strstr(err.msg, needle);
    if (!ok)
        fprintf(stderr, "%s on %d layers: status %d, '%s' (want '%s')\n", spec, L, st, err.msg,
                needle);
    return ok;
}

/* ---- stories260K ---- */

static int32_t tokens[FX_N_TOK];
static kvs_model *model;
static kvs_model_info info;
enum { DEC = FX_N_TOK - FX_PROMPT - 1 }; /* 127 scored rows: after tokens 384..510 */

typedef struct srun {
    kvs_session *s;
    float *logits; /* 1 + DEC rows */
    char report0[256];
} srun;

static kvs_status srun_exec(srun *r, const char *spec, const char *type, int decode,
                            kvs_error *err)
{
    memset(r, 0, sizeof *r);
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = 2;
    sp.kv_policy = spec;
    sp.kv_type = type;
    kvs_status st = kvs_session_new(model, &sp, &r->s, err);
    if (st != KVS_OK)
        return st;
    const int V = info.n_vocab;
    if (!(r->logits = calloc((size_t)(1 + decode) * V, sizeof(float))))
        return KVS_ERR_NOMEM;
    st = kvs_session_eval(r->s, tokens, FX_PROMPT, r->logits, 0, err);
    for (int t = FX_PROMPT; t < FX_PROMPT + decode && st == KVS_OK; t++)
        st = kvs_session_eval(r->s, tokens + t, 1, r->logits + (size_t)(t - FX_PROMPT + 1) * V, 0,
                              err);
    if (kvs_session_policy_report(r->s, 0, r->report0, sizeof r->report0) != 0)
        r->report0[0] = 0;
    return st;
}

static void srun_free(srun *r)
{
    kvs_session_free(r->s);
    free(r->logits);
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m || d != d ? d : m;
    }
    return m;
}

/* Mean KL(full || run) and top-1 agreement over the scored rows 1..DEC. */
static void kl_top1(const float *full, const float *run, double *kl, double *top1)
{
    const int V = info.n_vocab;
    *kl = *top1 = 0;
    for (int r = 1; r <= DEC; r++) {
        const float *a = full + (size_t)r * V, *b = run + (size_t)r * V;
        double ma = a[0], mb = b[0];
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            if (a[i] > ma) ma = a[i], ia = i;
            if (b[i] > mb) mb = b[i], ib = i;
        }
        double za = 0, zb = 0;
        for (int i = 0; i < V; i++) {
            za += exp(a[i] - ma);
            zb += exp(b[i] - mb);
        }
        double k = 0;
        for (int i = 0; i < V; i++) {
            double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
            k += exp(la) * (la - lb);
        }
        *kl += k / DEC;
        *top1 += (ia == ib) / (double)DEC;
    }
}

/* The main store's rows of layer l, bitwise (F32 stores). */
static int same_layer(kvs_session *a, kvs_session *b, int l)
{
    const kvs_store *sa = kvs_kv_store(kvs_session_kv(a)), *sb = kvs_kv_store(kvs_session_kv(b));
    for (int h = 0; h < info.n_kv_heads; h++) {
        int n = kvs_store_count(sa, l, h);
        if (n != kvs_store_count(sb, l, h) ||
            memcmp(kvs_store_keys(sa, l, h), kvs_store_keys(sb, l, h),
                   sizeof(float) * n * info.head_dim) ||
            memcmp(kvs_store_values(sa, l, h), kvs_store_values(sb, l, h),
                   sizeof(float) * n * info.head_dim))
            return 0;
    }
    return 1;
}

static void model_tests(void)
{
    kvs_error err = {0};
    const size_t V = (size_t)info.n_vocab;
    srun full;
    kvs_status st = srun_exec(&full, "full", NULL, DEC, &err);
    CHECKF(st == KVS_OK, "full: %s", err.msg);
    if (st != KVS_OK)
        return;
    /* T9: every token exact (prompt and decode), or nothing merged: the full cache. */
    const char *same[] = {"minicache:retain=all", "minicache:retain=all,unit=head",
                          "minicache:start=4", "minicache:layers=0", "minicache:layers=1"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        srun r;
        st = srun_exec(&r, same[i], NULL, 16, &err);
        CHECKF(st == KVS_OK, "%s: %s", same[i], err.msg);
        double d = st == KVS_OK ? max_diff(r.logits, full.logits, 17 * V) : INFINITY;
        printf("T9 %-34s vs full: max logit difference %g over 16 decode steps\n", same[i], d);
        CHECKF(d < 1e-5, "%s differs from the full cache by %g (T9)", same[i], d);
        srun_free(&r);
    }
    /* T10: the prompt's logits identical whatever S, t, gamma; layers below S keep
     * bit-identical caches under teacher forcing. */
    const char *specs[] = {"minicache", "minicache:start=0", "minicache:start=1,t=0.3",
                           "minicache:gamma=0.5,retain=topfrac", "minicache:merge=mean",
                           "minicache:unit=head,t=0.9,gamma=0", "minicache:layers=4,order=alg2"};
    const int S[] = {2, 0, 1, 2, 2, 2, 1};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        srun r;
        st = srun_exec(&r, specs[i], NULL, 8, &err);
        CHECKF(st == KVS_OK, "%s: %s", specs[i], err.msg);
        if (st == KVS_OK) {
            CHECKF(max_diff(r.logits, full.logits, V) == 0.0, "%s: prompt logits differ (T10)",
                   specs[i]);
            /* full ran 127 steps: compare with a full run of the same length */
            srun f8;
            if (srun_exec(&f8, "full", NULL, 8, &err) == KVS_OK)
                for (int l = 0; l < S[i]; l++)
                    CHECKF(same_layer(r.s, f8.s, l), "%s: layer %d below S differs (T10)",
                           specs[i], l);
            srun_free(&f8);
        }
        srun_free(&r);
    }
    /* The reference numbers (fidelity-methods-2.md), against the exact F32 cache. */
    struct { const char *type; double kl, top1; } ref[] = {{NULL, 0.9426, 0.520},
                                                           {"kivi4", 0.9563, 0.528}};
    for (int i = 0; i < 2; i++) {
        srun r;
        st = srun_exec(&r, "minicache", ref[i].type, DEC, &err);
        CHECKF(st == KVS_OK, "minicache on %s: %s", ref[i].type, err.msg);
        if (st == KVS_OK) {
            double kl, top1;
            kl_top1(full.logits, r.logits, &kl, &top1);
            printf("minicache on %s: KL %.4f (reference %.4f), top-1 %.3f (reference %.3f); %s\n",
                   ref[i].type ? ref[i].type : "f32", kl, ref[i].kl, top1, ref[i].top1,
                   r.report0);
            CHECKF(fabs(kl - ref[i].kl) < 0.02 * ref[i].kl, "KL %.4f vs %.4f", kl, ref[i].kl);
            CHECKF(fabs(top1 - ref[i].top1) < 0.02, "top-1 %.3f vs %.3f", top1, ref[i].top1);
            CHECKF(!strcmp(r.report0, "pairs (2,3); retained 2-3:K 1, 2-3:V 1"), "report '%s'",
                   r.report0);
        }
        srun_free(&r);
    }
    srun_free(&full);
}

int main(void)
{
    /* Bad input. */
    CHECK(error_mentions("minicache:t=1.5", "t=1.5 is out of range (a decimal number in [0, 1])"));
    CHECK(error_mentions("minicache:gamma=-0.1", "gamma=-0.1 is out of range"));
    CHECK(error_mentions("minicache:merge=max", "merge=max is not one of slerp|mean|fmax"));
    CHECK(error_mentions("minicache:budget=0.5", "minicache takes no budget"));
    CHECK(error_mentions("minicache:slots=10", "minicache takes no budget"));
    CHECK(start_error("minicache", 1, "this model has 1 layer"));
    CHECK(start_error("minicache:start=4", 4, "start=4 is beyond the last layer (start in [0, 3]"));
    CHECK(start_error("minicache:layers=5", 4, "layers=5 exceeds the model's 4 layers (layers in "
                                               "[0, 4])"));
    CHECK(start_error("minicache:start=1,layers=2", 4, "give start"));

    /* Synthetic: T6, T7, T13, T14, T17 across storage types and options. fp16 norms: one
     * rounding (2^-11), two once a KIVI flush refolds them (s * old / new). */
    synthetic("minicache", NULL, 4, 2, 8, 40, 24, 1e-3);
    synthetic("minicache:norm=fp32", NULL, 4, 2, 8, 40, 24, 1e-5);
    synthetic("minicache", "f16", 5, 2, 8, 40, 24, 1e-3);
    synthetic("minicache:norm=fp32", "f16", 4, 2, 8, 40, 24, 1e-5);
    synthetic("minicache", "kivi:kbits=4,vbits=4,group=8,residual=16", 4, 2, 8, 40, 40, 1e-3);
    synthetic("minicache:norm=fp32", "kivi:kbits=4,vbits=4,group=8,residual=16", 4, 2, 8, 40, 40,
              1e-5);
    synthetic("minicache:unit=head", "kivi:kbits=2,vbits=2,group=8,residual=16", 6, 4, 8, 40, 40,
              1e-3);
    synthetic("minicache:unit=head,gamma=0.3", NULL, 4, 4, 16, 50, 12, 1e-3);
    synthetic("minicache:start=0,decode_retain=frozen,gamma=0.2", NULL, 4, 2, 8, 40, 40, 1e-3);
    synthetic("minicache:retain=all", "f16", 4, 2, 8, 20, 8, 1e-3);
    synthetic("minicache:retain=topfrac,gamma=0.1", NULL, 4, 2, 8, 30, 8, 1e-3);
    synthetic("minicache:retain=literal", NULL, 4, 2, 8, 30, 8, 1e-3);
    synthetic("minicache:merge=mean", "kivi:kbits=4,vbits=4,group=8,residual=16", 4, 2, 8, 40, 20,
              INFINITY);
    synthetic("minicache:merge=fmax", NULL, 4, 2, 8, 40, 8, INFINITY);
    synthetic("minicache:start=3", NULL, 4, 2, 8, 20, 4, 1e-3); /* no pairs */
    prompt_copies();
    formula_case();

    char msg[512];
    CHECKF(fx_load(tokens, FX_N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (model) {
        model_tests();
        kvs_model_free(model);
    }
    return check_summary("minicache");
}
