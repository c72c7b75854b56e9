/* MPCache's per-head math (methods/mpcache.md §2.2-2.5, §3.5): pure functions, no state.
 *
 * Inputs are fp32 (queries, keys, boxes); every reduction and score is double, so rankings do
 * not depend on fp32 summation order. Loops run in index order: results are a deterministic
 * function of the inputs. Ranking is a total order: larger score first, NaN below every number,
 * equal scores to the lower index (§2.3.4, §7 item 11). */
#include "mpcache_math.h"

#include <math.h>
#include <stdlib.h>

int kvs_mp_ceil_count(double ratio, int n)
{
    if (n <= 0)
        return 0;
    const double c = ceil(ratio * n - 1e-9);
    if (!(c >= 1.0)) /* also NaN */
        return 1;
    return c >= n ? n : (int)c;
}

int kvs_mp_n_clusters(int n, int s)
{
    return n <= 0 || s <= 0 ? 0 : (n + s - 1) / s;
}

double kvs_mp_default_rho1(double eta)
{
    return eta < 0.5 ? 0.5 : 1.0;
}

typedef struct mp_rank {
    double s;
    int i;
} mp_rank;

/* Larger score first, NaN last, then lower index. */
static int rank_cmp(const void *a, const void *b)
{
    const mp_rank *x = a, *y = b;
    const int xn = isnan(x->s), yn = isnan(y->s);
    if (xn != yn)
        return xn - yn;
    if (!xn && x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int int_cmp(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

size_t kvs_mp_topk_scratch(int n)
{
    return (n > 0 ? (size_t)n : 1) * sizeof(mp_rank);
}

void kvs_mp_topk_with(const double *score, int n, int k, int *idx, void *scratch)
{
    if (k <= 0)
        return;
    mp_rank *r = scratch;
    for (int j = 0; j < n; j++) {
        r[j].s = score[j];
        r[j].i = j;
    }
    qsort(r, (size_t)n, sizeof *r, rank_cmp);
    for (int j = 0; j < k; j++)
        idx[j] = r[j].i;
    qsort(idx, (size_t)k, sizeof *idx, int_cmp);
}

kvs_status kvs_mp_topk_asc(const double *score, int n, int k, int *idx, kvs_error *err)
{
    if (n < 0 || k < 0 || k > n || (n > 0 && !score) || (k > 0 && !idx))
        return kvs_fail(err, KVS_ERR_ARG, "mpcache top-k: bad arguments (n %d, k %d)", n, k);
    if (k == 0)
        return KVS_OK;
    void *r = malloc(kvs_mp_topk_scratch(n));
    if (!r)
        return kvs_fail(err, KVS_ERR_NOMEM, "mpcache top-k: out of memory for %d scores", n);
    kvs_mp_topk_with(score, n, k, idx, r);
    free(r);
    return KVS_OK;
}

kvs_status kvs_mp_static_scores(const float *q, int G, int w, const float *k, int P, int d,
                                double *score, kvs_error *err)
{
    if (!q || !k || !score || G < 1 || d < 1 || P < 1 || w < 1 || w > P)
        return kvs_fail(err, KVS_ERR_ARG,
                        "mpcache static scores: bad arguments (G %d, w %d, P %d, d %d)", G, w, P,
                        d);
    double *lg = malloc((size_t)P * sizeof *lg);
    if (!lg)
        return kvs_fail(err, KVS_ERR_NOMEM, "mpcache static scores: out of memory for %d keys",
                        P);
    const double scale = 1.0 / sqrt((double)d);
    for (int j = 0; j < P; j++)
        score[j] = 0.0;
    for (int h = 0; h < G; h++) {
        for (int r = 0; r < w; r++) {
            const float *qr = q + ((size_t)h * w + r) * d;
            const int p = P - w + r; /* this row sees keys 0..p (causal) */
            double mx = -INFINITY;
            for (int j = 0; j <= p; j++) {
                const float *kj = k + (size_t)j * d;
                double s = 0.0;
                for (int i = 0; i < d; i++)
                    s += (double)qr[i] * kj[i];
                lg[j] = s * scale;
                if (lg[j] > mx)
                    mx = lg[j];
            }
            double sum = 0.0;
            for (int j = 0; j <= p; j++) {
                lg[j] = exp(lg[j] - mx);
                sum += lg[j];
            }
            const double inv = 1.0 / sum;
            for (int j = 0; j <= p; j++)
                score[j] += lg[j] * inv;
        }
    }
    free(lg);
    return KVS_OK;
}

kvs_status kvs_mp_static_keep(const float *q, int G, const float *k, int P, int d,
                              double win_ratio, double keep_ratio, int *keep, int *n_keep,
                              kvs_error *err)
{
    if (!keep || !n_keep || P < 1)
        return kvs_fail(err, KVS_ERR_ARG, "mpcache static keep: bad arguments (P %d)", P);
    const int w = kvs_mp_ceil_count(win_ratio, P), nk = kvs_mp_ceil_count(keep_ratio, P);
    double *score = malloc((size_t)P * sizeof *score);
    if (!score)
        return kvs_fail(err, KVS_ERR_NOMEM, "mpcache static keep: out of memory for %d keys", P);
    kvs_status st = kvs_mp_static_scores(q, G, w, k, P, d, score, err);
    if (st == KVS_OK)
        st = kvs_mp_topk_asc(score, P, nk, keep, err);
    free(score);
    if (st == KVS_OK)
        *n_keep = nk;
    return st;
}

/* Box of rows [b, e) of k into mn, mx (d floats each). */
static void box_rows(const float *k, int b, int e, int d, float *mn, float *mx)
{
    for (int i = 0; i < d; i++)
        mn[i] = mx[i] = k[(size_t)b * d + i];
    for (int j = b + 1; j < e; j++) {
        const float *kj = k + (size_t)j * d;
        for (int i = 0; i < d; i++) {
            if (kj[i] < mn[i])
                mn[i] = kj[i];
            if (kj[i] > mx[i])
                mx[i] = kj[i];
        }
    }
}

void kvs_mp_cluster_bounds(const float *k, int n, int d, int s, float *rmin, float *rmax)
{
    const int C = kvs_mp_n_clusters(n, s);
    for (int c = 0; c < C; c++) {
        const int b = c * s, e = b + s < n ? b + s : n;
        box_rows(k, b, e, d, rmin + (size_t)c * d, rmax + (size_t)c * d);
    }
}

void kvs_mp_coarse_bounds(const float *rmin2, const float *rmax2, int C2, int d, int r,
                          float *rmin1, float *rmax1)
{
    const int C1 = kvs_mp_n_clusters(C2, r);
    for (int c = 0; c < C1; c++) {
        const int b = c * r, e = b + r < C2 ? b + r : C2;
        float *mn = rmin1 + (size_t)c * d, *mx = rmax1 + (size_t)c * d;
        for (int i = 0; i < d; i++) {
            mn[i] = rmin2[(size_t)b * d + i];
            mx[i] = rmax2[(size_t)b * d + i];
        }
        for (int f = b + 1; f < e; f++)
            for (int i = 0; i < d; i++) {
                if (rmin2[(size_t)f * d + i] < mn[i])
                    mn[i] = rmin2[(size_t)f * d + i];
                if (rmax2[(size_t)f * d + i] > mx[i])
                    mx[i] = rmax2[(size_t)f * d + i];
            }
    }
}

void kvs_mp_qsum(const float *q, int G, int d, double *qs)
{
    for (int i = 0; i < d; i++) {
        double s = 0.0;
        for (int h = 0; h < G; h++)
            s += q[(size_t)h * d + i];
        qs[i] = s;
    }
}

double kvs_mp_score_box(kvs_mp_sim mode, const double *qs, int d, const float *mn,
                        const float *mx, double alpha)
{
    double acc = 0.0;
    if (mode == KVS_MP_SIM_UB) {
        for (int i = 0; i < d; i++) {
            const double a = qs[i] * mn[i], z = qs[i] * mx[i];
            acc += a > z ? a : z;
        }
    } else {
        for (int i = 0; i < d; i++)
            acc += qs[i] * (alpha * mx[i] + (1.0 - alpha) * mn[i]);
    }
    return acc;
}

double kvs_mp_score_keys(kvs_mp_sim mode, const double *qs, int d, const float *k, int rows)
{
    if (mode == KVS_MP_SIM_MEAN) {
        double acc = 0.0;
        for (int i = 0; i < d; i++) {
            double m = 0.0;
            for (int j = 0; j < rows; j++)
                m += k[(size_t)j * d + i];
            acc += qs[i] * (m / rows);
        }
        return acc;
    }
    double best = -INFINITY;
    for (int j = 0; j < rows; j++) {
        double t = 0.0;
        for (int i = 0; i < d; i++)
            t += qs[i] * k[(size_t)j * d + i];
        if (t > best)
            best = t;
    }
    return best;
}

kvs_status kvs_mp_cluster_scores(kvs_mp_sim mode, const float *q, int G, int d, const float *k,
                                 int n, int s, const float *rmin, const float *rmax,
                                 double alpha, double *out, kvs_error *err)
{
    double *qs = malloc((size_t)d * sizeof *qs);
    if (!qs)
        return kvs_fail(err, KVS_ERR_NOMEM, "mpcache cluster scores: out of memory");
    kvs_mp_qsum(q, G, d, qs);
    const int C = kvs_mp_n_clusters(n, s);
    for (int c = 0; c < C; c++) {
        const int b = c * s, e = b + s < n ? b + s : n;
        out[c] = mode == KVS_MP_SIM_LINEAR || mode == KVS_MP_SIM_UB
                     ? kvs_mp_score_box(mode, qs, d, rmin + (size_t)c * d, rmax + (size_t)c * d,
                                        alpha)
                     : kvs_mp_score_keys(mode, qs, d, k + (size_t)b * d, e - b);
    }
    free(qs);
    return KVS_OK;
}

kvs_status kvs_mp_select(const double *sc1, const double *sc2, int n, int s1, int s2,
                         double rho1, double eta, int pad, int *fine, int *n_fine, int *slots,
                         int *n_slots, kvs_error *err)
{
    if (!sc1 || !sc2 || !n_fine || !slots || !n_slots || n < 1 || s2 < 1 || s1 < s2 ||
        s1 % s2 != 0 || !(rho1 > 0.0 && rho1 <= 1.0) || !(eta > 0.0 && eta <= 1.0))
        return kvs_fail(err, KVS_ERR_ARG,
                        "mpcache select: bad arguments (n %d, s1 %d, s2 %d, rho1 %g, eta %g)", n,
                        s1, s2, rho1, eta);
    const int r = s1 / s2, C1 = kvs_mp_n_clusters(n, s1), C2 = kvs_mp_n_clusters(n, s2);
    const int n1 = kvs_mp_ceil_count(rho1, C1);
    const int C2x = pad ? C1 * r : C2; /* fine clusters incl. wholly dummy ones */
    int *sel1 = malloc((size_t)n1 * sizeof *sel1);
    int *cand = malloc((size_t)n1 * r * sizeof *cand);
    int *pick = malloc((size_t)n1 * r * sizeof *pick);
    double *cs = malloc((size_t)n1 * r * sizeof *cs);
    kvs_status st = KVS_OK;
    if (!sel1 || !cand || !pick || !cs) {
        st = kvs_fail(err, KVS_ERR_NOMEM, "mpcache select: out of memory for %d clusters", C2x);
        goto done;
    }
    st = kvs_mp_topk_asc(sc1, C1, n1, sel1, err);
    if (st != KVS_OK)
        goto done;
    int nc = 0; /* children of the chosen coarse clusters, ascending */
    for (int a = 0; a < n1; a++)
        for (int f = sel1[a] * r; f < (sel1[a] + 1) * r && f < C2x; f++) {
            cand[nc] = f;
            cs[nc++] = f < C2 ? sc2[f] : -INFINITY;
        }
    int n2 = kvs_mp_ceil_count(eta, C2);
    if (n2 > nc)
        n2 = nc;
    /* Wholly dummy clusters score -inf, so they only win ties with real -inf scores, which the
     * lower-index rule settles in the real clusters' favour. */
    st = kvs_mp_topk_asc(cs, nc, n2, pick, err);
    if (st != KVS_OK)
        goto done;
    int ns = 0;
    for (int a = 0; a < n2; a++) {
        const int f = cand[pick[a]];
        const int b = f * s2, e = pad ? b + s2 : (b + s2 < n ? b + s2 : n);
        if (fine)
            fine[a] = f;
        for (int j = b; j < e; j++)
            slots[ns++] = j;
    }
    *n_fine = n2;
    *n_slots = ns;
done:
    free(sel1);
    free(cand);
    free(pick);
    free(cs);
    return st;
}

void kvs_mp_op_counts(kvs_mp_sim mode, int selector, int C1, int n_cand, int n2, int n_slots,
                      int tail, int d, int s1, int s2, kvs_mp_ops *ops)
{
    const int64_t k = (int64_t)n_slots + tail;
    *ops = (kvs_mp_ops){0};
    ops->softmax_len = k;
    ops->attn_mults = 2 * k * d;
    if (!selector)
        return;
    const int64_t scored = (int64_t)C1 + n_cand;
    switch (mode) {
    case KVS_MP_SIM_LINEAR:
    case KVS_MP_SIM_MEAN:
        ops->sim_mults = scored * d;
        break;
    case KVS_MP_SIM_UB:
        ops->sim_mults = 2 * scored * d;
        ops->sim_max_ops = scored * d;
        break;
    case KVS_MP_SIM_MAXDOT: {
        const int64_t keys = (int64_t)C1 * s1 + (int64_t)n_cand * s2;
        ops->sim_mults = keys * d;
        ops->sim_max_ops = keys;
        break;
    }
    }
    ops->topk_len1 = C1;
    ops->topk_len2 = n_cand;
    ops->gather_eq = (int64_t)n2 * n_cand;
}

kvs_mp_cfg kvs_mp_cfg_default(void)
{
    return (kvs_mp_cfg){.keep = 0.25, .window = 0.2, .s1 = 32, .s2 = 16, .rho1 = 0.5,
                        .alpha = 0.6, .sim = KVS_MP_SIM_LINEAR, .levels = 2, .share = 1,
                        .skip = 2, .pad = 1, .ends = 0};
}

int kvs_mp_is_selector(const kvs_mp_cfg *c, int layer)
{
    return !c->share || layer < c->skip || (layer - c->skip) % 2 == 0;
}

int kvs_mp_partner(const kvs_mp_cfg *c, int layer)
{
    return kvs_mp_is_selector(c, layer) ? layer : layer - 1;
}

double kvs_mp_eta(double budget, double keep)
{
    const double e = budget / keep;
    return e > 1.0 ? 1.0 : e;
}

double kvs_mp_rho1(const kvs_mp_cfg *c, double eta)
{
    return c->levels < 2 || eta >= 0.5 ? 1.0 : c->rho1;
}

void kvs_mp_shape_of(const kvs_mp_cfg *c, double eta, int n_kept, int sealed, kvs_mp_shape *out)
{
    const int r = c->s1 / c->s2;
    const int padded = kvs_mp_n_clusters(n_kept, c->s1) * c->s1 + sealed;
    kvs_mp_shape s = {0};
    s.C2 = kvs_mp_n_clusters(n_kept, c->s2) + sealed / c->s2;
    s.C2x = c->pad ? padded / c->s2 : s.C2;
    if (c->levels >= 2) {
        s.C1 = padded / c->s1;
        s.n1 = kvs_mp_ceil_count(kvs_mp_rho1(c, eta), s.C1);
        s.n_cand = s.n1 * r < s.C2x ? s.n1 * r : s.C2x;
    } else {
        s.n_cand = s.C2x;
    }
    s.n2 = kvs_mp_ceil_count(eta, s.C2);
    if (s.n2 > s.n_cand)
        s.n2 = s.n_cand;
    s.n_slots = s.n2 * c->s2;
    *out = s;
}

static int has(const int *set, int k, int x)
{
    return bsearch(&x, set, (size_t)k, sizeof *set, int_cmp) != NULL;
}

double kvs_mp_commonality(const int *const *sets, int L, int k, int m)
{
    if (!sets || k < 1 || m < 1 || L <= m)
        return NAN;
    double total = 0.0;
    for (int l = 0; l + m < L; l++)
        for (int a = 0; a < k; a++) {
            int in_all = 1;
            for (int i = l + 1; i <= l + m && in_all; i++)
                in_all = has(sets[i], k, sets[l][a]);
            total += in_all;
        }
    return total / ((double)k * (L - m));
}
