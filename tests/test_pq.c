/* Product quantisation (src/policies/pq.h) against methods/pqcache.md §7 tests 1-8 and 19:
 * code range, output shapes (guards past every buffer), the LUT identity, the exactness limit,
 * Lloyd monotonicity, more centroids giving lower error, determinism, incremental encoding
 * equal to the K-Means assignment, degenerate data (no NaN, SSE 0), top-k against a
 * brute-force reference and the adaptive iteration cap.
 *
 * Written from the header's contract and the spec only: every reference below is independent
 * fp64 code, and data is drawn from a fixed-seed xoshiro256** (core/random.h), so each run sees
 * the same inputs. Where exact equality is asserted the data is dyadic (small multiples of 1/8)
 * so that every sum and square the implementation may form is exact in float. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "policies/pq.h"

enum { GUARD = 16 };

/* ---- data ---- */

static double unif(kvs_xoshiro *g) { return kvs_random_unit(kvs_xoshiro_next(g)); }

static int below(kvs_xoshiro *g, int n) { return (int)(kvs_xoshiro_next(g) % (uint64_t)n); }

static double gauss(kvs_xoshiro *g)
{
    const double u = kvs_random_unit_nonzero(kvs_xoshiro_next(g));
    const double v = unif(g);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* n rows of d values at stride floats; the padding between rows is NaN, so an implementation
 * that reads past d (or ignores the stride) spreads NaN into its output. */
static float *alloc_rows(int n, size_t stride)
{
    float *x = xmalloc((size_t)n * stride * sizeof *x);
    for (size_t i = 0; i < (size_t)n * stride; i++)
        x[i] = NAN;
    return x;
}

static void fill_uniform(float *x, int n, int d, size_t stride, kvs_xoshiro *g)
{
    for (int i = 0; i < n; i++)
        for (int t = 0; t < d; t++)
            x[(size_t)i * stride + t] = (float)(2.0 * unif(g) - 1.0);
}

/* nc Gaussian blobs with centres in [-4, 4]^d and standard deviation spread. */
static void fill_clustered(float *x, int n, int d, size_t stride, int nc, double spread,
                           kvs_xoshiro *g)
{
    double *ctr = xmalloc((size_t)nc * d * sizeof *ctr);
    for (int c = 0; c < nc * d; c++)
        ctr[c] = 8.0 * unif(g) - 4.0;
    for (int i = 0; i < n; i++) {
        const int c = below(g, nc);
        for (int t = 0; t < d; t++)
            x[(size_t)i * stride + t] = (float)(ctr[c * d + t] + spread * gauss(g));
    }
    free(ctr);
}

/* A dyadic value: an integer in [-16, 16] over 8. */
static float dyadic(kvs_xoshiro *g) { return (float)(below(g, 33) - 16) / 8.0f; }

/* The guard pattern after every output buffer: a quiet NaN no implementation writes. */
static const uint32_t GUARD_BITS = 0x7fc0beefu;

static void put_guard_f(float *p, int n)
{
    for (int i = 0; i < n; i++)
        memcpy(&p[i], &GUARD_BITS, sizeof GUARD_BITS);
}

static int is_guard_f(const float *p)
{
    uint32_t b;
    memcpy(&b, p, sizeof b);
    return b == GUARD_BITS;
}

static int guard_intact_f(const float *p, int n)
{
    for (int i = 0; i < n; i++)
        if (!is_guard_f(&p[i]))
            return 0;
    return 1;
}

static int guard_intact_u8(const uint8_t *p, int n, uint8_t v)
{
    for (int i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

static int all_finite(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return 0;
    return 1;
}

/* ---- fp64 references ---- */

static double dist2(const float *a, const float *b, int d)
{
    double s = 0.0;
    for (int t = 0; t < d; t++) {
        const double e = (double)a[t] - (double)b[t];
        s += e * e;
    }
    return s;
}

static double norm2(const float *a, int d)
{
    double s = 0.0;
    for (int t = 0; t < d; t++)
        s += (double)a[t] * a[t];
    return s;
}

/* SSE of one K-Means result (k centroids of d, n codes). */
static double ref_sse(const float *x, int n, size_t stride, int d, const float *cent,
                      const uint8_t *codes)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += dist2(x + (size_t)i * stride, cent + (size_t)codes[i] * d, d);
    return s;
}

/* SSE of a trained quantiser: sub-space j of point i against C_j[codes[i m + j]]. */
static double ref_sse_pq(const kvs_pq_cfg *c, const float *x, int n, size_t stride,
                         const float *cent, const uint8_t *codes)
{
    const int dm = c->dim / c->m, K = 1 << c->bits;
    double s = 0.0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c->m; j++)
            s += dist2(x + (size_t)i * stride + j * dm,
                       cent + ((size_t)j * K + codes[(size_t)i * c->m + j]) * dm, dm);
    return s;
}

/* Whether code is a nearest centroid of v among k, up to fp32 rounding of the distances (the
 * implementation may use the |x|^2 - 2 x.c + |c|^2 expansion, whose error scales with norms). */
static int near_enough(const float *v, const float *cent, int k, int d, int code)
{
    double best = INFINITY, cmax = 0.0;
    for (int c = 0; c < k; c++) {
        const double e = dist2(v, cent + (size_t)c * d, d);
        best = e < best ? e : best;
        const double nc = norm2(cent + (size_t)c * d, d);
        cmax = nc > cmax ? nc : cmax;
    }
    const double got = dist2(v, cent + (size_t)code * d, d);
    return got <= best + 1e-5 * (best + norm2(v, d) + cmax) + 1e-30;
}

/* The lowest-index exact nearest centroid (exact for dyadic data). */
static int exact_nearest(const float *v, const float *cent, int k, int d)
{
    int arg = 0;
    double best = INFINITY;
    for (int c = 0; c < k; c++) {
        const double e = dist2(v, cent + (size_t)c * d, d);
        if (e < best) {
            best = e;
            arg = c;
        }
    }
    return arg;
}

/* One trained quantiser with its guarded buffers. */
typedef struct trained {
    kvs_pq_cfg cfg;
    int n, K, dm;
    size_t nc; /* centroid floats */
    float *cent;
    uint8_t *codes;
    kvs_pq_stats st;
    kvs_status status;
    int guards_ok;
} trained;

static trained train(const kvs_pq_cfg *c, const float *x, int n, size_t stride)
{
    trained t = {.cfg = *c, .n = n, .K = 1 << c->bits, .dm = c->dim / c->m};
    t.nc = (size_t)c->m * t.K * t.dm;
    t.cent = xmalloc((t.nc + GUARD) * sizeof *t.cent);
    t.codes = xmalloc((size_t)n * c->m + GUARD);
    put_guard_f(t.cent, (int)t.nc + GUARD);
    memset(t.codes, 0xa5, (size_t)n * c->m + GUARD);
    t.st.iters = -12345;
    t.st.sse = -1.0;
    kvs_error err;
    t.status = kvs_pq_train(c, x, n, stride, t.cent, t.codes, &t.st, &err);
    if (t.status != KVS_OK)
        fprintf(stderr, "kvs_pq_train: %s\n", err.msg);
    t.guards_ok = guard_intact_f(t.cent + t.nc, GUARD) &&
                  guard_intact_u8(t.codes + (size_t)n * c->m, GUARD, 0xa5);
    return t;
}

static void trained_free(trained *t)
{
    free(t->cent);
    free(t->codes);
}

/* Counts the points whose kvs_pq_encode differs from the trained code. */
static int encode_mismatches(const trained *t, const float *x, size_t stride)
{
    int bad = 0;
    uint8_t code[8 + GUARD];
    for (int i = 0; i < t->n; i++) {
        memset(code, 0x5a, sizeof code);
        kvs_pq_encode(&t->cfg, t->cent, x + (size_t)i * stride, code);
        if (memcmp(code, t->codes + (size_t)i * t->cfg.m, (size_t)t->cfg.m) != 0 ||
            !guard_intact_u8(code + t->cfg.m, GUARD, 0x5a))
            bad++;
    }
    return bad;
}

/* ---- §7 tests 1, 2, 8: code range, shapes, encode = train's assignment ---- */

/* Guards: codes >= 2^bits (a mask or a K off by one), writes past m 2^bits d_m centroid floats
 * or n m codes (a d instead of d_m, a stride mix-up), centroid slots left unwritten (guard NaN
 * remains), reads of the row padding (NaN spreads), an SSE statistic that is not the SSE of
 * the returned assignment, an input modified in place, and an encode that disagrees with the
 * final assignment (no final assignment pass after the last update). */
static void test_range_shapes(void)
{
    static const int dims[2] = {8, 64}, ms[4] = {1, 2, 4, 8};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 11);
    const int n = 300;
    for (int di = 0; di < 2; di++)
        for (int mi = 0; mi < 4; mi++)
            for (int bits = 1; bits <= 8; bits++) {
                const int dim = dims[di], m = ms[mi];
                const size_t stride = (size_t)dim + 3;
                float *x = alloc_rows(n, stride);
                if ((bits + mi) % 2)
                    fill_uniform(x, n, dim, stride, &g);
                else
                    fill_clustered(x, n, dim, stride, 5, 0.4, &g);
                float *x0 = xmalloc((size_t)n * stride * sizeof *x0);
                memcpy(x0, x, (size_t)n * stride * sizeof *x0);
                const kvs_pq_cfg c = {.dim = dim,
                                      .m = m,
                                      .bits = bits,
                                      .max_iters = 3,
                                      .tol = (bits % 3 == 0) ? 1e-4 : 0.0,
                                      .seed = 1000u + (uint64_t)(di * 100 + mi * 10 + bits)};
                trained t = train(&c, x, n, stride);
                CHECKF(t.status == KVS_OK, "dim %d m %d bits %d", dim, m, bits);
                CHECKF(t.guards_ok, "overrun: dim %d m %d bits %d", dim, m, bits);
                CHECKF(all_finite(t.cent, t.nc), "unwritten or non-finite centroid: dim %d m %d "
                       "bits %d", dim, m, bits);
                CHECKF(memcmp(x, x0, (size_t)n * stride * sizeof *x) == 0,
                       "input modified: dim %d m %d bits %d", dim, m, bits);
                int out_of_range = 0, far = 0;
                for (int i = 0; i < n * m; i++)
                    out_of_range += t.codes[i] >= t.K;
                CHECKF(out_of_range == 0, "%d codes >= 2^%d: dim %d m %d", out_of_range, bits,
                       dim, m);
                if (out_of_range == 0) {
                    for (int i = 0; i < n; i++)
                        for (int j = 0; j < m; j++)
                            far += !near_enough(x + (size_t)i * stride + j * t.dm,
                                                t.cent + (size_t)j * t.K * t.dm, t.K, t.dm,
                                                t.codes[(size_t)i * m + j]);
                    CHECKF(far == 0, "%d codes not a nearest centroid: dim %d m %d bits %d", far,
                           dim, m, bits);
                    const double sse = ref_sse_pq(&c, x, n, stride, t.cent, t.codes);
                    CHECKF(fabs(t.st.sse - sse) <= 1e-4 * sse + 1e-9,
                           "stats.sse %.9g, SSE of the result %.9g: dim %d m %d bits %d",
                           t.st.sse, sse, dim, m, bits);
                }
                CHECKF(t.st.iters >= 0 && t.st.iters <= m * c.max_iters,
                       "stats.iters %d: m %d max_iters %d", t.st.iters, m, c.max_iters);
                const int bad = encode_mismatches(&t, x, stride);
                CHECKF(bad == 0, "%d of %d encodes differ from train: dim %d m %d bits %d", bad,
                       n, dim, m, bits);
                trained_free(&t);
                free(x);
                free(x0);
            }
}

/* §7 test 8 across iteration caps and early stopping. Guards: an encode whose distance or tie
 * rule differs from the assignment (the degenerate cases have duplicate centroids, so ties
 * happen), codes left from the assignment before the last update (max_iters 1, 2 and the tol
 * stop are where a missing final pass shows), and a stats.iters beyond the cap. */
static void test_encode_consistency(void)
{
    static const int caps[5] = {0, 1, 2, 5, 50};
    static const double tols[3] = {0.0, 1e-3, 0.1};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 23);
    const int n = 400, dim = 16, m = 4;
    float *xu = alloc_rows(n, dim), *xc = alloc_rows(n, dim);
    fill_uniform(xu, n, dim, dim, &g);
    fill_clustered(xc, n, dim, dim, 6, 0.3, &g);
    int stopped_early = 0;
    for (int ci = 0; ci < 5; ci++)
        for (int ti = 0; ti < 3; ti++)
            for (int bits = 4; bits <= 6; bits += 2)
                for (int data = 0; data < 2; data++) {
                    const float *x = data ? xc : xu;
                    const kvs_pq_cfg c = {.dim = dim,
                                          .m = m,
                                          .bits = bits,
                                          .max_iters = caps[ci],
                                          .tol = tols[ti],
                                          .seed = 7u + (uint64_t)(ci * 31 + ti * 7 + bits)};
                    trained t = train(&c, x, n, dim);
                    CHECK(t.status == KVS_OK && t.guards_ok);
                    CHECKF(t.st.iters >= 0 && t.st.iters <= m * caps[ci],
                           "stats.iters %d, cap %d", t.st.iters, m * caps[ci]);
                    if (caps[ci] == 0)
                        CHECKF(t.st.iters == 0, "max_iters 0 but %d updates", t.st.iters);
                    stopped_early += t.st.iters < m * caps[ci];
                    const int bad = encode_mismatches(&t, x, dim);
                    CHECKF(bad == 0,
                           "%d of %d encodes differ: max_iters %d tol %g bits %d data %s", bad,
                           n, caps[ci], tols[ti], bits, data ? "clustered" : "uniform");
                    trained_free(&t);
                }
    /* The tol > 0 and max_iters 50 runs must include early stops, or the early-stop path was
     * never exercised above. */
    CHECKF(stopped_early > 0, "no run stopped before its cap");
    free(xu);
    free(xc);

    /* Ties: 3 distinct dyadic sub-vectors per sub-space and 8 centroids, so the initial sample
     * holds duplicates and every point is equidistant to two or more centroids. */
    float *xd = alloc_rows(60, 8);
    float pool[3][8];
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < 8; t++)
            pool[p][t] = dyadic(&g);
    for (int i = 0; i < 60; i++)
        memcpy(xd + (size_t)i * 8, pool[i < 3 ? i : below(&g, 3)], sizeof pool[0]);
    for (int cap = 0; cap <= 3; cap++) {
        const kvs_pq_cfg c = {.dim = 8, .m = 2, .bits = 3, .max_iters = cap, .seed = 5u + cap};
        trained t = train(&c, xd, 60, 8);
        CHECK(t.status == KVS_OK && t.guards_ok);
        const int bad = encode_mismatches(&t, xd, 8);
        CHECKF(bad == 0, "%d encodes differ on duplicate centroids, max_iters %d", bad, cap);
        /* The assignment itself takes the lowest index on ties (exact: dyadic data). */
        int not_lowest = 0;
        for (int i = 0; i < 60; i++)
            for (int j = 0; j < 2; j++)
                not_lowest += t.codes[i * 2 + j] !=
                              exact_nearest(xd + (size_t)i * 8 + j * 4, t.cent + j * 8 * 4, 8, 4);
        CHECKF(not_lowest == 0, "%d assignments not the lowest-index nearest, max_iters %d",
               not_lowest, cap);
        trained_free(&t);
    }
    free(xd);
}

/* kvs_pq_encode on hand-made centroids. Guards: the tie rule (lowest index, not last or
 * arbitrary), the sub-space layout of the centroids ([j][c][0..d_m)), and Euclidean distance
 * (an inner-product argmax would pick the largest centroid). Exact: every value is dyadic. */
static void test_encode_hand(void)
{
    /* dim 6, m 2, bits 2: sub-space 0 has (1,0,0), (0,1,0), (1,0,0), (0,0,1); sub-space 1 has
     * (2,2,2), (0,0,0), (0,0,0), (-1,-1,-1). */
    const float cent[2 * 4 * 3] = {1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1,
                                   2, 2, 2, 0, 0, 0, 0, 0, 0, -1, -1, -1};
    const kvs_pq_cfg c = {.dim = 6, .m = 2, .bits = 2};
    static const struct {
        float x[6];
        uint8_t want[2];
    } cases[] = {
        {{0, 0, 0, 0, 0, 0}, {0, 1}},            /* all of sub-space 0 tie; 1 and 2 tie */
        {{0, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, {1, 1}}, /* 1 and 3 tie at 0.5; then 1 and 2 */
        {{1, 0, 0, 1.25f, 1.25f, 1.25f}, {0, 0}}, /* duplicate 0 and 2: the lower */
        {{0, 0, 2, -0.5f, -0.5f, -0.5f}, {3, 1}}, /* 1 and 3 tie at 0.75 */
        {{0, 0, 2, -0.75f, -0.75f, -0.75f}, {3, 3}},
        {{5, 5, 5, 9, 9, 9}, {0, 0}}, /* all four tie in sub-space 0 */
        {{0, 3, 0, -8, 8, 0}, {1, 1}}, /* inner product would pick 0 in sub-space 1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t code[2 + GUARD];
        memset(code, 0x5a, sizeof code);
        kvs_pq_encode(&c, cent, cases[i].x, code);
        CHECKF(code[0] == cases[i].want[0] && code[1] == cases[i].want[1],
               "case %zu: got (%d, %d), want (%d, %d)", i, code[0], code[1], cases[i].want[0],
               cases[i].want[1]);
        CHECKF(guard_intact_u8(code + 2, GUARD, 0x5a), "case %zu: encode wrote past m", i);
    }

    /* Random dyadic centroids from a tiny alphabet (many exact ties) against the lowest-index
     * exact nearest, for several shapes. */
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 29);
    static const int shapes[4][3] = {{8, 8, 3}, {16, 4, 4}, {12, 3, 8}, {4, 1, 5}};
    for (int s = 0; s < 4; s++) {
        const kvs_pq_cfg cs = {.dim = shapes[s][0], .m = shapes[s][1], .bits = shapes[s][2]};
        const int K = 1 << cs.bits, dm = cs.dim / cs.m;
        float *cen = xmalloc((size_t)cs.m * K * dm * sizeof *cen);
        for (int i = 0; i < cs.m * K * dm; i++)
            cen[i] = (float)(below(&g, 5) - 2) / 2.0f;
        int bad = 0;
        for (int r = 0; r < 300; r++) {
            float x[16];
            uint8_t code[8];
            for (int t = 0; t < cs.dim; t++)
                x[t] = (float)(below(&g, 9) - 4) / 4.0f;
            kvs_pq_encode(&cs, cen, x, code);
            for (int j = 0; j < cs.m; j++)
                bad += code[j] != exact_nearest(x + j * dm, cen + (size_t)j * K * dm, K, dm);
        }
        CHECKF(bad == 0, "%d codes not the lowest-index nearest: dim %d m %d bits %d", bad,
               cs.dim, cs.m, cs.bits);
        free(cen);
    }
}

/* ---- §7 test 3: LUT identity ---- */

/* Guards: a LUT with swapped or shifted sub-spaces (q^(j) against C_{j'}), a LUT laid out
 * [c][j] instead of [j][c], a scan that reads codes sub-space-major instead of point-major or
 * uses the wrong 2^bits row length, a scan that drops or double-counts a sub-space, and writes
 * past n scores. The reference is fp64 over the concatenated centroids. */
static void test_lut_identity(void)
{
    static const int shapes[5][3] = {{64, 2, 6}, {32, 4, 8}, {16, 8, 2}, {8, 1, 3}, {24, 3, 5}};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 31);
    const int n = 500;
    for (int s = 0; s < 5; s++) {
        const int dim = shapes[s][0];
        const kvs_pq_cfg c = {.dim = dim,
                              .m = shapes[s][1],
                              .bits = shapes[s][2],
                              .max_iters = 4,
                              .seed = 99u + (uint64_t)s};
        float *x = alloc_rows(n, dim);
        fill_clustered(x, n, dim, dim, 7, 0.5, &g);
        trained t = train(&c, x, n, dim);
        CHECK(t.status == KVS_OK && t.guards_ok);
        const int K = t.K, dm = t.dm, m = c.m;
        float *lut = xmalloc(((size_t)m * K + GUARD) * sizeof *lut);
        float *out = xmalloc(((size_t)n + GUARD) * sizeof *out);
        for (int qi = 0; qi < 3; qi++) {
            float q[64];
            for (int i = 0; i < dim; i++)
                q[i] = (float)(qi == 2 ? 10.0 * gauss(&g) : gauss(&g));
            put_guard_f(lut, m * K + GUARD);
            kvs_pq_lut(&c, t.cent, q, lut);
            CHECKF(guard_intact_f(lut + m * K, GUARD), "lut overrun: shape %d", s);
            int bad_lut = 0;
            for (int j = 0; j < m; j++)
                for (int cc = 0; cc < K; cc++) {
                    const float *cv = t.cent + ((size_t)j * K + cc) * dm;
                    double ref = 0.0, mag = 0.0;
                    for (int i = 0; i < dm; i++) {
                        ref += (double)q[j * dm + i] * cv[i];
                        mag += fabs((double)q[j * dm + i] * cv[i]);
                    }
                    bad_lut += !(fabs(lut[j * K + cc] - ref) <= 1e-5 * mag + 1e-30);
                }
            CHECKF(bad_lut == 0, "%d LUT entries differ from q^(j).C_j[c]: shape %d", bad_lut, s);
            put_guard_f(out, n + GUARD);
            kvs_pq_scan(lut, m, c.bits, t.codes, n, out);
            CHECKF(guard_intact_f(out + n, GUARD), "scan overrun: shape %d", s);
            int bad = 0;
            double worst = 0.0;
            for (int p = 0; p < n; p++) {
                double ref = 0.0, mag = 0.0;
                for (int j = 0; j < m; j++) {
                    const float *cv = t.cent + ((size_t)j * K + t.codes[(size_t)p * m + j]) * dm;
                    for (int i = 0; i < dm; i++) {
                        ref += (double)q[j * dm + i] * cv[i];
                        mag += fabs((double)q[j * dm + i] * cv[i]);
                    }
                }
                const double e = fabs(out[p] - ref) / (mag + 1e-300);
                worst = e > worst ? e : worst;
                bad += !(e <= 1e-5);
            }
            CHECKF(bad == 0, "%d of %d scan scores differ from q.k^ (worst rel %.3g): shape %d "
                   "query %d", bad, n, worst, s, qi);
        }
        free(lut);
        free(out);
        trained_free(&t);
        free(x);
    }

    /* The scan alone: arbitrary LUT and codes (not from training), odd n, every bits. */
    static const int scan_ms[5] = {1, 2, 3, 4, 8};
    for (int bits = 1; bits <= 8; bits++)
        for (int mi = 0; mi < 5; mi++) {
            const int m = scan_ms[mi];
            const int K = 1 << bits, nn = 1 + below(&g, 97);
            float *lut = xmalloc((size_t)m * K * sizeof *lut);
            uint8_t *codes = xmalloc((size_t)nn * m);
            float *out = xmalloc(((size_t)nn + GUARD) * sizeof *out);
            for (int i = 0; i < m * K; i++)
                lut[i] = (float)gauss(&g);
            for (int i = 0; i < nn * m; i++)
                codes[i] = (uint8_t)below(&g, K);
            put_guard_f(out, nn + GUARD);
            kvs_pq_scan(lut, m, bits, codes, nn, out);
            int bad = 0;
            for (int p = 0; p < nn; p++) {
                double ref = 0.0, mag = 0.0;
                for (int j = 0; j < m; j++) {
                    ref += lut[j * K + codes[p * m + j]];
                    mag += fabs(lut[j * K + codes[p * m + j]]);
                }
                bad += !(fabs(out[p] - ref) <= 1e-6 * mag + 1e-30);
            }
            CHECKF(bad == 0 && guard_intact_f(out + nn, GUARD),
                   "scan of random codes: %d wrong, bits %d m %d n %d", bad, bits, m, nn);
            free(lut);
            free(codes);
            free(out);
        }
    /* n = 0 writes nothing. */
    float lut1[2] = {1.0f, 2.0f}, out0[GUARD];
    put_guard_f(out0, GUARD);
    kvs_pq_scan(lut1, 1, 1, NULL, 0, out0);
    CHECK(guard_intact_f(out0, GUARD));
}

/* ---- §7 test 4: exactness limit ---- */

/* Data with at most 2^bits distinct sub-vectors per sub-space (exactly 2^bits in some, fewer
 * in others) and more than 2^bits points. Guards: an initial sample that does not take points
 * of distinct value (it would leave a sub-vector without its own centroid), an update that
 * does not keep a centroid on its identical members, an empty-cluster rule that disturbs a
 * zero-error solution, and scores that differ from the exact q.k. Exact: dyadic data. */
static void test_exact_limit(void)
{
    static const int shapes[4][3] = {{16, 4, 2}, {16, 4, 3}, {8, 8, 1}, {12, 2, 4}};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 37);
    for (int s = 0; s < 4; s++)
        for (int variant = 0; variant < 3; variant++) {
            const int dim = shapes[s][0], m = shapes[s][1], bits = shapes[s][2];
            const int K = 1 << bits, dm = dim / m, n = 8 * K + 5;
            const size_t stride = (size_t)dim + 1;
            /* Pools of distinct dyadic sub-vectors: K in even sub-spaces, fewer in odd ones. */
            float *pool = xmalloc((size_t)m * K * dm * sizeof *pool);
            int *np = xmalloc((size_t)m * sizeof *np);
            for (int j = 0; j < m; j++) {
                np[j] = (j % 2 == 0) ? K : (K > 2 ? K - 1 - below(&g, K - 2) : 1);
                for (int p = 0; p < np[j]; p++) {
                    float *v = pool + ((size_t)j * K + p) * dm;
                    int dup;
                    do {
                        for (int i = 0; i < dm; i++)
                            v[i] = dyadic(&g);
                        dup = 0;
                        for (int o = 0; o < p; o++)
                            dup |= memcmp(v, pool + ((size_t)j * K + o) * dm,
                                          (size_t)dm * sizeof *v) == 0;
                    } while (dup);
                }
            }
            float *x = alloc_rows(n, stride);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++) {
                    const int p = i < np[j] ? i : below(&g, np[j]);
                    memcpy(x + (size_t)i * stride + j * dm, pool + ((size_t)j * K + p) * dm,
                           (size_t)dm * sizeof *x);
                }
            const kvs_pq_cfg c = {.dim = dim,
                                  .m = m,
                                  .bits = bits,
                                  .max_iters = variant == 0 ? 0 : 10,
                                  .tol = variant == 2 ? 1e-4 : 0.0,
                                  .seed = 400u + (uint64_t)(s * 3 + variant)};
            trained t = train(&c, x, n, stride);
            CHECK(t.status == KVS_OK && t.guards_ok);
            CHECK(all_finite(t.cent, t.nc));
            int inexact = 0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++)
                    inexact += memcmp(x + (size_t)i * stride + j * dm,
                                      t.cent + ((size_t)j * K + t.codes[(size_t)i * m + j]) * dm,
                                      (size_t)dm * sizeof *x) != 0;
            CHECKF(inexact == 0, "%d sub-vectors not reconstructed exactly: shape %d variant %d",
                   inexact, s, variant);
            CHECKF(t.st.sse == 0.0, "stats.sse %g, want 0: shape %d variant %d", t.st.sse, s,
                   variant);
            float *lut = xmalloc((size_t)m * K * sizeof *lut), *out = xmalloc((size_t)n * 4);
            for (int qi = 0; qi < 2; qi++) {
                float q[16];
                for (int i = 0; i < dim; i++)
                    q[i] = (float)gauss(&g);
                kvs_pq_lut(&c, t.cent, q, lut);
                kvs_pq_scan(lut, m, bits, t.codes, n, out);
                int bad = 0;
                for (int i = 0; i < n; i++) {
                    double ref = 0.0, mag = 0.0;
                    for (int d = 0; d < dim; d++) {
                        ref += (double)q[d] * x[(size_t)i * stride + d];
                        mag += fabs((double)q[d] * x[(size_t)i * stride + d]);
                    }
                    bad += !(fabs(out[i] - ref) <= 1e-5 * mag + 1e-30);
                }
                CHECKF(bad == 0, "%d approximate scores differ from exact q.k: shape %d "
                       "variant %d", bad, s, variant);
            }
            CHECK(encode_mismatches(&t, x, stride) == 0);
            free(lut);
            free(out);
            trained_free(&t);
            free(x);
            free(pool);
            free(np);
        }
}

/* ---- §7 tests 5 and 6: Lloyd monotonicity, T+1 vs T, more centroids ---- */

typedef struct kmres {
    float *cent;
    uint8_t *codes;
    double *trace;
    int iters;
    kvs_status status;
    int guards_ok;
} kmres;

static kmres kmeans(const float *x, int n, size_t stride, int d, int k, int max_iters, double tol,
                    uint64_t seed)
{
    kmres r = {0};
    r.cent = xmalloc(((size_t)k * d + GUARD) * sizeof *r.cent);
    r.codes = xmalloc((size_t)n + GUARD);
    r.trace = xmalloc(((size_t)max_iters + 1 + GUARD) * sizeof *r.trace);
    put_guard_f(r.cent, k * d + GUARD);
    memset(r.codes, 0xa5, (size_t)n + GUARD);
    for (int i = 0; i < max_iters + 1 + GUARD; i++)
        r.trace[i] = -7.0;
    r.iters = -12345;
    kvs_error err;
    r.status = kvs_pq_kmeans(x, n, stride, d, k, max_iters, tol, seed, r.cent, r.codes, r.trace,
                             &r.iters, &err);
    if (r.status != KVS_OK)
        fprintf(stderr, "kvs_pq_kmeans: %s\n", err.msg);
    int ok = guard_intact_f(r.cent + (size_t)k * d, GUARD) &&
             guard_intact_u8(r.codes + n, GUARD, 0xa5);
    for (int i = max_iters + 1; i < max_iters + 1 + GUARD; i++)
        ok &= r.trace[i] == -7.0;
    r.guards_ok = ok;
    return r;
}

static void kmres_free(kmres *r)
{
    free(r->cent);
    free(r->codes);
    free(r->trace);
}

/* Guards: an update that is not the mean of the members, an assignment that is not the
 * nearest centroid, an empty-cluster rule that moves a centroid somewhere worse, an SSE trace
 * off by one or not the SSE of the assignment, a result that depends on max_iters other than
 * by truncation, a tol rule that never fires or a stop that skips the final assignment, and
 * a convergence test that stops while assignments still change (centroid != member mean). */
static void test_lloyd(void)
{
    static const int ds[2] = {2, 8}, ks[3] = {4, 16, 64};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 41);
    const int n = 600, cap = 40;
    int converged = 0;
    for (int di = 0; di < 2; di++)
        for (int data = 0; data < 2; data++) {
            const int d = ds[di];
            const size_t stride = (size_t)d + 2;
            float *x = alloc_rows(n, stride);
            if (data)
                fill_clustered(x, n, d, stride, 10, 0.5, &g);
            else
                fill_uniform(x, n, d, stride, &g);
            for (int ki = 0; ki < 3; ki++)
                for (uint64_t seed = 1; seed <= 4; seed++) {
                    const int k = ks[ki];
                    kmres r = kmeans(x, n, stride, d, k, cap, 0.0, seed);
                    CHECK(r.status == KVS_OK && r.guards_ok);
                    CHECKF(r.iters >= 0 && r.iters <= cap, "iters %d", r.iters);
                    if (r.iters < 0 || r.iters > cap) {
                        kmres_free(&r);
                        continue;
                    }
                    int up = -1;
                    for (int t = 0; t < r.iters && up < 0; t++)
                        if (!(r.trace[t + 1] <= r.trace[t]))
                            up = t;
                    CHECKF(up < 0, "SSE rose from %.17g to %.17g at update %d: d %d k %d %s "
                           "seed %d", up < 0 ? 0 : r.trace[up], up < 0 ? 0 : r.trace[up + 1],
                           up + 1, d, k, data ? "clustered" : "uniform", (int)seed);
                    const double sse = ref_sse(x, n, stride, d, r.cent, r.codes);
                    CHECKF(fabs(r.trace[r.iters] - sse) <= 1e-4 * sse + 1e-9,
                           "trace[iters] %.9g, SSE of the result %.9g: d %d k %d", r.trace[r.iters],
                           sse, d, k);
                    if (r.iters < cap) {
                        /* Stopped with tol 0: no assignment changed, so every non-empty
                         * cluster's centroid is the mean of its members. */
                        converged++;
                        int off = 0;
                        for (int c = 0; c < k; c++) {
                            double mean[8] = {0}, mag = 0.0;
                            int cnt = 0;
                            for (int i = 0; i < n; i++)
                                if (r.codes[i] == c) {
                                    cnt++;
                                    for (int t = 0; t < d; t++) {
                                        mean[t] += x[(size_t)i * stride + t];
                                        mag += fabs(x[(size_t)i * stride + t]);
                                    }
                                }
                            if (!cnt)
                                continue;
                            for (int t = 0; t < d; t++)
                                off += !(fabs(mean[t] / cnt - r.cent[c * d + t]) <=
                                         1e-4 * mag / cnt + 1e-30);
                        }
                        CHECKF(off == 0, "converged at %d but %d centroid coordinates are not "
                               "member means: d %d k %d", r.iters, off, d, k);
                    }
                    kmres_free(&r);
                }
            /* T + 1 vs T with the same seed: the shorter run is a prefix of the longer. */
            for (int T = 0; T <= 6; T++) {
                kmres a = kmeans(x, n, stride, d, 16, T, 0.0, 9);
                kmres b = kmeans(x, n, stride, d, 16, T + 1, 0.0, 9);
                CHECK(a.status == KVS_OK && b.status == KVS_OK && a.guards_ok && b.guards_ok);
                CHECKF(a.iters >= 0 && a.iters <= T && b.iters >= a.iters && b.iters <= T + 1,
                       "iters %d (cap %d), %d (cap %d)", a.iters, T, b.iters, T + 1);
                if (a.iters >= 0 && a.iters <= T && b.iters >= a.iters && b.iters <= T + 1) {
                    CHECKF(b.trace[b.iters] <= a.trace[a.iters],
                           "SSE after %d updates %.17g > after %d %.17g: d %d %s", b.iters,
                           b.trace[b.iters], a.iters, a.trace[a.iters], d,
                           data ? "clustered" : "uniform");
                    CHECKF(memcmp(a.trace, b.trace, ((size_t)a.iters + 1) * sizeof *a.trace) == 0,
                           "max_iters %d and %d runs differ in their first %d SSEs", T, T + 1,
                           a.iters + 1);
                    if (a.iters < T) /* converged before the cap: the longer run is identical */
                        CHECK(b.iters == a.iters &&
                              memcmp(a.cent, b.cent, (size_t)16 * d * sizeof *a.cent) == 0 &&
                              memcmp(a.codes, b.codes, (size_t)n) == 0);
                }
                kmres_free(&a);
                kmres_free(&b);
            }
            /* tol: a huge tol stops after the first update; max_iters 0 runs none. */
            kmres h = kmeans(x, n, stride, d, 8, 10, 1e9, 3);
            CHECKF(h.status == KVS_OK && h.iters == 1, "tol 1e9: %d updates, want 1", h.iters);
            kmres_free(&h);
            free(x);
        }
    CHECKF(converged > 0, "no run converged before its cap of %d", cap);
}

/* §7 test 6: more centroids, lower mean SSE over 10 seeds on the same data. Guards: an
 * implementation that ignores k beyond some size or clusters the wrong sub-range. */
static void test_more_centroids(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 43);
    const int n = 400, d = 8, seeds = 10;
    float *x = alloc_rows(n, d);
    fill_uniform(x, n, d, d, &g);
    double mean[8] = {0};
    printf("pq: mean SSE over %d seeds (uniform, n %d, d %d, 10 iterations):", seeds, n, d);
    for (int bits = 1; bits <= 7; bits++) {
        for (uint64_t seed = 1; seed <= (uint64_t)seeds; seed++) {
            kmres r = kmeans(x, n, d, d, 1 << bits, 10, 0.0, seed * 7919u);
            CHECK(r.status == KVS_OK && r.guards_ok);
            mean[bits] += ref_sse(x, n, d, d, r.cent, r.codes) / seeds;
            kmres_free(&r);
        }
        printf(" b%d %.2f", bits, mean[bits]);
        if (bits > 1)
            CHECKF(mean[bits] <= mean[bits - 1], "mean SSE with 2^%d centroids %.6g > 2^%d %.6g",
                   bits, mean[bits], bits - 1, mean[bits - 1]);
    }
    printf("\n");
    free(x);

    /* Informative only: kvs_pq_train's SSE by bits for one seed (a per-seed ordering is not
     * guaranteed, so nothing is asserted on it). */
    const int nt = 300, dim = 64;
    float *xt = alloc_rows(nt, dim);
    fill_clustered(xt, nt, dim, dim, 12, 0.5, &g);
    printf("pq: train SSE (clustered, dim %d, m 2, n %d, 10 iterations) by bits:", dim, nt);
    for (int bits = 1; bits <= 8; bits++) {
        const kvs_pq_cfg c = {.dim = dim, .m = 2, .bits = bits, .max_iters = 10, .seed = 3};
        trained t = train(&c, xt, nt, dim);
        CHECK(t.status == KVS_OK);
        printf(" b%d %.1f", bits, t.st.sse);
        trained_free(&t);
    }
    printf("\n");
    free(xt);
}

/* ---- §7 test 7: determinism ---- */

/* Guards: hidden state (a static RNG or buffer), uninitialised memory reaching the output, a
 * seed that is ignored (the same sample for every seed), and an initial sample that is not k
 * data points of distinct value. */
static void test_determinism(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 47);
    const int n = 400, dim = 32;
    float *x = alloc_rows(n, dim);
    fill_clustered(x, n, dim, dim, 9, 0.6, &g);
    const kvs_pq_cfg c = {.dim = dim, .m = 4, .bits = 5, .max_iters = 8, .tol = 1e-4, .seed = 77};
    trained a = train(&c, x, n, dim);
    trained b = train(&c, x, n, dim);
    CHECK(a.status == KVS_OK && b.status == KVS_OK);
    CHECK(memcmp(a.cent, b.cent, a.nc * sizeof *a.cent) == 0);
    CHECK(memcmp(a.codes, b.codes, (size_t)n * c.m) == 0);
    CHECK(a.st.iters == b.st.iters && memcmp(&a.st.sse, &b.st.sse, sizeof a.st.sse) == 0);
    /* stats may be NULL, with the same result. */
    float *cent = xmalloc(a.nc * sizeof *cent);
    uint8_t *codes = xmalloc((size_t)n * c.m);
    CHECK(kvs_pq_train(&c, x, n, dim, cent, codes, NULL, NULL) == KVS_OK);
    CHECK(memcmp(a.cent, cent, a.nc * sizeof *cent) == 0);
    CHECK(memcmp(a.codes, codes, (size_t)n * c.m) == 0);
    free(cent);
    free(codes);
    trained_free(&a);
    trained_free(&b);

    /* Different seeds give different centroids: with max_iters 0 the centroids are the initial
     * sample, and two seeds taking the same ordered sample of 8 from 400 distinct points would
     * be a broken seed; after 3 updates on uniform data they differ as well. */
    float *xu = alloc_rows(n, 8);
    fill_uniform(xu, n, 8, 8, &g);
    for (int cap = 0; cap <= 3; cap += 3)
        for (uint64_t seed = 1; seed <= 5; seed++) {
            kmres r1 = kmeans(xu, n, 8, 8, 8, cap, 0.0, seed);
            kmres r2 = kmeans(xu, n, 8, 8, 8, cap, 0.0, seed + 1);
            kmres r3 = kmeans(xu, n, 8, 8, 8, cap, 0.0, seed);
            CHECKF(memcmp(r1.cent, r2.cent, 64 * sizeof *r1.cent) != 0,
                   "seeds %d and %d give the same centroids (max_iters %d)", (int)seed,
                   (int)seed + 1, cap);
            CHECK(memcmp(r1.cent, r3.cent, 64 * sizeof *r1.cent) == 0 &&
                  memcmp(r1.codes, r3.codes, (size_t)n) == 0 &&
                  memcmp(r1.trace, r3.trace, ((size_t)cap + 1) * sizeof *r1.trace) == 0);
            if (cap == 0) {
                /* The initial centroids: data points, pairwise distinct. */
                int not_point = 0, dup = 0;
                for (int cc = 0; cc < 8; cc++) {
                    int found = 0;
                    for (int i = 0; i < n && !found; i++)
                        found = memcmp(r1.cent + cc * 8, xu + (size_t)i * 8, 8 * sizeof *xu) == 0;
                    not_point += !found;
                    for (int o = 0; o < cc; o++)
                        dup += memcmp(r1.cent + cc * 8, r1.cent + o * 8, 8 * sizeof *xu) == 0;
                }
                CHECKF(not_point == 0 && dup == 0,
                       "initial centroids: %d not data points, %d duplicates (seed %d)",
                       not_point, dup, (int)seed);
                CHECKF(r1.iters == 0, "max_iters 0 ran %d updates", r1.iters);
            }
            kmres_free(&r1);
            kmres_free(&r2);
            kmres_free(&r3);
        }
    free(xu);
    free(x);
}

/* ---- §7 test 5/6 edge and §6 item 6: empty clusters and degenerate data ---- */

/* Guards: a division by a zero member count (NaN centroids), an empty-cluster rule that takes
 * the same point twice or picks a non-point, a tol rule that divides by a zero variance, and an
 * SSE that is not exactly 0 when every point has a centroid equal to it. */
static void test_degenerate(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 53);
    /* All points identical (dyadic, so any mean of copies is exact). */
    {
        const int n = 50, d = 4, k = 8;
        float *x = alloc_rows(n, d);
        const float v[4] = {0.375f, -1.25f, 2.0f, 0.0f};
        for (int i = 0; i < n; i++)
            memcpy(x + (size_t)i * d, v, sizeof v);
        for (int ti = 0; ti < 2; ti++) {
            kmres r = kmeans(x, n, d, d, k, 5, ti ? 1e-4 : 0.0, 3);
            CHECK(r.status == KVS_OK && r.guards_ok);
            CHECKF(all_finite(r.cent, (size_t)k * d), "NaN centroid, identical points, tol %g",
                   ti ? 1e-4 : 0.0);
            int bad = 0, notv = 0;
            for (int i = 0; i < n; i++)
                bad += r.codes[i] >= k;
            for (int c = 0; c < k; c++)
                notv += memcmp(r.cent + c * d, v, sizeof v) != 0;
            CHECKF(bad == 0, "%d codes out of range", bad);
            CHECKF(notv == 0, "%d centroids differ from the one point", notv);
            CHECK(r.iters >= 0 && r.iters <= 5);
            for (int t = 0; t >= 0 && t <= r.iters && t <= 5; t++)
                CHECKF(r.trace[t] == 0.0, "SSE[%d] %g, want 0", t, r.trace[t]);
            CHECK(ref_sse(x, n, d, d, r.cent, r.codes) == 0.0);
            kmres_free(&r);
        }
        const kvs_pq_cfg c = {.dim = 4, .m = 2, .bits = 3, .max_iters = 5, .seed = 1};
        trained t = train(&c, x, n, d);
        CHECK(t.status == KVS_OK && t.guards_ok && all_finite(t.cent, t.nc));
        CHECKF(t.st.sse == 0.0, "stats.sse %g on identical points", t.st.sse);
        CHECK(encode_mismatches(&t, x, d) == 0);
        trained_free(&t);
        free(x);
    }
    /* All points identical, non-dyadic: no NaN, SSE at most rounding. */
    {
        const int n = 300, d = 8, k = 256;
        float *x = alloc_rows(n, d);
        float v[8];
        for (int t = 0; t < d; t++)
            v[t] = (float)gauss(&g);
        for (int i = 0; i < n; i++)
            memcpy(x + (size_t)i * d, v, sizeof v);
        kmres r = kmeans(x, n, d, d, k, 4, 0.0, 5);
        CHECK(r.status == KVS_OK && r.guards_ok && all_finite(r.cent, (size_t)k * d));
        int bad = 0;
        for (int i = 0; i < n; i++)
            bad += r.codes[i] >= k;
        CHECK(bad == 0);
        const double sse = ref_sse(x, n, d, d, r.cent, r.codes);
        CHECKF(sse <= 1e-10 * n * norm2(v, d), "SSE %g on identical points", sse);
        kmres_free(&r);
        free(x);
    }
    /* Fewer distinct points than k (3 or 5 distinct, dyadic, repeated), and n < k. */
    static const int cases[4][4] = {/* n, d, k, distinct */
                                    {40, 4, 8, 3},
                                    {300, 2, 256, 5},
                                    {3, 4, 16, 3},
                                    {1, 3, 4, 1}};
    for (int ci = 0; ci < 4; ci++) {
        const int n = cases[ci][0], d = cases[ci][1], k = cases[ci][2], nd = cases[ci][3];
        float pool[5][4];
        for (int p = 0; p < nd; p++) {
            int dup;
            do {
                for (int t = 0; t < d; t++)
                    pool[p][t] = dyadic(&g);
                dup = 0;
                for (int o = 0; o < p; o++)
                    dup |= memcmp(pool[p], pool[o], (size_t)d * sizeof(float)) == 0;
            } while (dup);
        }
        float *x = alloc_rows(n, (size_t)d);
        for (int i = 0; i < n; i++)
            memcpy(x + (size_t)i * d, pool[i < nd ? i : below(&g, nd)], (size_t)d * sizeof *x);
        for (int cap = 0; cap <= 6; cap += 3) {
            kmres r = kmeans(x, n, d, d, k, cap, cap == 6 ? 1e-3 : 0.0, 11u + ci);
            CHECK(r.status == KVS_OK && r.guards_ok);
            CHECKF(all_finite(r.cent, (size_t)k * d), "NaN centroid: case %d max_iters %d", ci,
                   cap);
            int bad = 0, inexact = 0;
            for (int i = 0; i < n; i++) {
                bad += r.codes[i] >= k;
                if (r.codes[i] < k)
                    inexact += memcmp(x + (size_t)i * d, r.cent + (size_t)r.codes[i] * d,
                                      (size_t)d * sizeof *x) != 0;
            }
            CHECKF(bad == 0 && inexact == 0, "case %d max_iters %d: %d codes out of range, "
                   "%d points not on their centroid", ci, cap, bad, inexact);
            CHECK(r.iters >= 0 && r.iters <= cap);
            int nonzero = 0;
            for (int t = 0; t >= 0 && t <= r.iters && t <= cap; t++)
                nonzero += r.trace[t] != 0.0;
            CHECKF(nonzero == 0, "case %d max_iters %d: %d SSE trace entries not 0", ci, cap,
                   nonzero);
            kmres_free(&r);
        }
        free(x);
    }
}

/* ---- §6 item 14: top-k ---- */

typedef struct scored {
    float s;
    int i;
} scored;

/* Rank order: NaN lowest, higher score first, lower index first on ties. */
static int rank_cmp(const void *pa, const void *pb)
{
    const scored *a = pa, *b = pb;
    const int xn = isnan(a->s) != 0, yn = isnan(b->s) != 0;
    if (xn != yn)
        return xn - yn;
    if (!xn && a->s != b->s)
        return a->s > b->s ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int int_cmp(const void *pa, const void *pb)
{
    const int a = *(const int *)pa, b = *(const int *)pb;
    return (a > b) - (a < b);
}

static int ref_topk(const float *s, int n, int k, int *out)
{
    if (k <= 0 || n <= 0)
        return 0;
    scored *all = xmalloc((size_t)n * sizeof *all);
    for (int i = 0; i < n; i++)
        all[i] = (scored){s[i], i};
    qsort(all, (size_t)n, sizeof *all, rank_cmp);
    const int c = k < n ? k : n;
    for (int i = 0; i < c; i++)
        out[i] = all[i].i;
    qsort(out, (size_t)c, sizeof *out, int_cmp);
    free(all);
    return c;
}

/* Guards: a tie rule other than the lower index (selection algorithms that partition on a
 * pivot often keep an arbitrary subset of the equal scores), NaN treated as large or compared
 * unordered, a count other than min(k, n), an unsorted or duplicated result, writes past the
 * count, and a selection that permutes the caller's scores. */
static void test_topk(void)
{
    static const int ns[8] = {0, 1, 2, 3, 10, 100, 1000, 3000};
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 59);
    int cases = 0;
    for (int ni = 0; ni < 8; ni++)
        for (int dist = 0; dist < 7; dist++) {
            const int n = ns[ni];
            float *s = xmalloc((size_t)n * sizeof *s), *s0 = xmalloc((size_t)n * sizeof *s);
            for (int i = 0; i < n; i++) {
                const double u = unif(&g);
                switch (dist) {
                case 0: /* a few integer values: many ties */
                    s[i] = (float)below(&g, 4);
                    break;
                case 1: /* continuous */
                    s[i] = (float)gauss(&g);
                    break;
                case 2: /* ties and 10 % NaN */
                    s[i] = u < 0.1 ? NAN : (float)below(&g, 6) - 2.0f;
                    break;
                case 3: /* infinities, NaN and ties */
                    s[i] = u < 0.1   ? NAN
                           : u < 0.2 ? INFINITY
                           : u < 0.3 ? -INFINITY
                                     : (float)below(&g, 3);
                    break;
                case 4: /* all equal */
                    s[i] = 1.5f;
                    break;
                case 5: /* all NaN */
                    s[i] = NAN;
                    break;
                default: /* mostly NaN with a few -inf */
                    s[i] = u < 0.8 ? NAN : -INFINITY;
                    break;
                }
            }
            memcpy(s0, s, (size_t)n * sizeof *s);
            const int ks[9] = {0, 1, 2, n / 2, n - 1, n, n + 5, -1, n / 3 + 1};
            int *idx = xmalloc(((size_t)n + 5 + GUARD) * sizeof *idx);
            int *ref = xmalloc(((size_t)n + 5) * sizeof *ref);
            uint32_t *scratch = xmalloc((size_t)n * sizeof *scratch);
            for (int ki = 0; ki < 9; ki++) {
                const int k = ks[ki];
                for (int i = 0; i < n + 5 + GUARD; i++)
                    idx[i] = -77;
                const int want = ref_topk(s, n, k, ref);
                const int got = kvs_topk(s, n, k, idx, scratch);
                cases++;
                CHECKF(got == want, "n %d k %d dist %d: count %d, want %d", n, k, dist, got,
                       want);
                if (got != want)
                    continue;
                int first = -1;
                for (int i = 0; i < got && first < 0; i++)
                    if (idx[i] != ref[i])
                        first = i;
                CHECKF(first < 0, "n %d k %d dist %d: idx[%d] = %d, want %d", n, k, dist, first,
                       first < 0 ? 0 : idx[first], first < 0 ? 0 : ref[first]);
                int guard_ok = 1;
                for (int i = got; i < n + 5 + GUARD; i++)
                    guard_ok &= idx[i] == -77;
                CHECKF(guard_ok, "n %d k %d dist %d: wrote past the count", n, k, dist);
                CHECKF(n == 0 || memcmp(s, s0, (size_t)n * sizeof *s) == 0,
                       "n %d k %d: scores modified", n, k);
            }
            free(s);
            free(s0);
            free(idx);
            free(ref);
            free(scratch);
        }
    /* NaN ranks below everything, -inf included. */
    {
        const float s[5] = {NAN, -INFINITY, 1.0f, NAN, -INFINITY};
        int idx[5];
        uint32_t scratch[5];
        const int got = kvs_topk(s, 5, 2, idx, scratch);
        CHECKF(got == 2 && idx[0] == 1 && idx[1] == 2, "{NaN, -inf, 1, NaN, -inf}, k 2: got %d "
               "= {%d, %d}, want {1, 2}", got, idx[0], idx[1]);
        const int got3 = kvs_topk(s, 5, 3, idx, scratch);
        CHECKF(got3 == 3 && idx[0] == 1 && idx[1] == 2 && idx[2] == 4,
               "{NaN, -inf, 1, NaN, -inf}, k 3: got %d = {%d, %d, %d}, want {1, 2, 4}", got3,
               idx[0], idx[1], idx[2]);
    }
    /* Signed zeros are equal scores: ties to the lower index, whatever the sign bit. */
    {
        const float s[6] = {-0.0f, 0.0f, -1.0f, -0.0f, 0.0f, -0.0f};
        int idx[6];
        uint32_t scratch[6];
        const int got = kvs_topk(s, 6, 3, idx, scratch);
        CHECKF(got == 3 && idx[0] == 0 && idx[1] == 1 && idx[2] == 3,
               "signed zeros: got %d = {%d, %d, %d}, want {0, 1, 3}", got, idx[0], idx[1],
               idx[2]);
    }
    printf("pq: top-k checked against the brute-force reference in %d cases\n", cases);
}

/* ---- §7 test 19: adaptive iteration cap ---- */

/* Guards: a missing clip (or a clip applied before the floor or with lo and hi swapped), the
 * first-release form with t_comp / 2, a ceil or round instead of floor, a division by a zero or
 * negative t_iter, and an int conversion of an out-of-range quotient. */
static void test_adaptive(void)
{
    /* Hand-computed: quotients kept away from integers. */
    CHECK(kvs_pq_adaptive_iters(1.05, 0.3, 0.1, 3, 10) == 10);  /* 7.5 + 3 = 10.5 */
    CHECK(kvs_pq_adaptive_iters(0.55, 0.3, 0.1, 3, 10) == 5);   /* 2.5 + 3 = 5.5 */
    CHECK(kvs_pq_adaptive_iters(0.87, 0.3, 0.1, 3, 10) == 8);   /* 5.7 + 3 = 8.7 */
    CHECK(kvs_pq_adaptive_iters(0.87, 0.3, 0.1, 3, 300) == 8);
    CHECK(kvs_pq_adaptive_iters(2.05, 0.3, 0.1, 3, 300) == 20); /* 17.5 + 3 */
    CHECK(kvs_pq_adaptive_iters(2.05, 0.3, 0.1, 3, 10) == 10);  /* clipped high */
    CHECK(kvs_pq_adaptive_iters(0.25, 0.3, 0.1, 3, 10) == 3);   /* -0.5 + 3 = 2.5: clipped */
    CHECK(kvs_pq_adaptive_iters(0.25, 0.3, 0.1, 1, 10) == 2);   /* floor(2.5), not 3 */
    CHECK(kvs_pq_adaptive_iters(0.0, 1.0, 0.1, 3, 10) == 3);    /* -10 + 3 */
    /* A negative lo shows the floor: floor(-7.5) = -8, where truncation gives -7. */
    CHECK(kvs_pq_adaptive_iters(0.0, 1.05, 0.1, -20, 10) == -8);
    CHECK(kvs_pq_adaptive_iters(40.0, 0.3, 2.5, 3, 300) == 18); /* 15.88 + 3 */
    /* t_iter <= 0 gives lo. */
    CHECK(kvs_pq_adaptive_iters(100.0, 0.3, 0.0, 3, 10) == 3);
    CHECK(kvs_pq_adaptive_iters(100.0, 0.3, -0.1, 3, 10) == 3);
    CHECK(kvs_pq_adaptive_iters(-100.0, 0.3, -0.1, 4, 300) == 4);
    /* Quotients far outside int: clipped, not converted. */
    CHECK(kvs_pq_adaptive_iters(1e300, 0.0, 1e-300, 3, 10) == 10);
    CHECK(kvs_pq_adaptive_iters(-1e300, 0.0, 1e-300, 3, 10) == 3);
    CHECK(kvs_pq_adaptive_iters(1e12, 0.0, 1e-3, 3, 300) == 300);
    CHECK(kvs_pq_adaptive_iters(5.0, 5.0, 1.0, 7, 7) == 7);
    /* A NaN cost (a failed fit) is still clipped: converting NaN to int is undefined. */
    {
        const int T = kvs_pq_adaptive_iters(NAN, 0.3, 0.1, 3, 10);
        CHECKF(T >= 3 && T <= 10, "NaN t_comp gave %d, outside [3, 10]", T);
    }

    /* Always in [lo, hi] and non-decreasing in t_comp. */
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 61);
    int out = 0, down = 0;
    for (int r = 0; r < 200; r++) {
        const double km3 = 2.0 * unif(&g), it = unif(&g) * 0.3 + (r % 10 == 0 ? -0.1 : 0.001);
        const int lo = 1 + below(&g, 4), hi = lo + below(&g, 300);
        int prev = -1000000;
        for (double tc = -1.0; tc <= 20.0; tc += 0.0137) {
            const int T = kvs_pq_adaptive_iters(tc, km3, it, lo, hi);
            out += T < lo || T > hi;
            down += T < prev;
            prev = T;
        }
    }
    CHECKF(out == 0, "%d results outside [lo, hi]", out);
    CHECKF(down == 0, "%d decreases as t_comp grows", down);

    /* The cost models of §2.3: t_comp = a2 + b2 s + g2 s^2, t_iter = b1 s, t_km3 = 3 t_iter.
     * Then T = t_comp / t_iter = (g2 s + b2 + a2 / s) / b1, which is non-decreasing for s at
     * or beyond the crossover sqrt(a2 / g2) = 1000 and reaches the clip. */
    const double a2 = 1e-3, b2 = 1e-6, g2 = 1e-9, b1 = 1e-7;
    int prev = -1, dec = 0, lo_seen = 0, hi_seen = 0;
    for (double s = 1013.0; s <= 60000.0; s += 37.0) {
        const double t_iter = b1 * s, t_comp = a2 + b2 * s + g2 * s * s;
        const int T = kvs_pq_adaptive_iters(t_comp, 3.0 * t_iter, t_iter, 3, 300);
        dec += T < prev;
        prev = T;
        lo_seen |= T <= 35;
        hi_seen |= T == 300;
    }
    CHECKF(dec == 0, "T_max decreased %d times as s grew beyond the crossover", dec);
    CHECK(lo_seen && hi_seen);
    /* Before the crossover the a2 / s term makes short prompts allow many iterations as well:
     * still clipped to [lo, hi]. */
    for (double s = 1.0; s < 1000.0; s *= 1.7) {
        const double t_iter = b1 * s, t_comp = a2 + b2 * s + g2 * s * s;
        const int T = kvs_pq_adaptive_iters(t_comp, 3.0 * t_iter, t_iter, 3, 300);
        CHECK(T >= 3 && T <= 300);
    }
}

int main(void)
{
    test_range_shapes();
    test_encode_consistency();
    test_encode_hand();
    test_lut_identity();
    test_exact_limit();
    test_lloyd();
    test_more_centroids();
    test_determinism();
    test_degenerate();
    test_topk();
    test_adaptive();
    return check_summary("pq");
}
