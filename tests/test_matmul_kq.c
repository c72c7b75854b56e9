/* kvs_matmul_kq (core/matmul_kq.c): Q4_K, Q5_K, Q6_K, IQ4_NL, Q4_1, Q5_0 and Q5_1 weights times 8-bit activations.
 * For random weights and activations (zero rows, a row with one huge value, negative values),
 * several shapes and 1 / 2 / 3 threads:
 *  (a) the fast paths (gemv for few rows, tiles for many) against the scalar reference
 *      kvs_matmul_kq_ref, within fp32 summation order; the AVX2 path of Q4_K / Q5_K / Q6_K
 *      (x block scales on the super-block's grid) against kvs_matmul_kq_ref_sb;
 *  (b) the references and the fast paths against the exact fp32 product with the dequantised
 *      weights, within the rigorous bound of the activation rounding: sum |w_i| xd_b / 2;
 *  (c) kvs_matmul routes these types here (same results as the reference).
 * Plus the type predicate, the refusal of other types, and a corrupted weight that must be
 * noticed (the checks can fail). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dequant.h"
#include "core/kernels.h"
#include "core/matmul_kq.h"
#include "kvslim.h"

#include "rng.h"

/* The build targets AVX2 (with FMA and F16C, as kernels_internal.h's KVS_AVX2). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVS_TEST_AVX2 1
#else
#define KVS_TEST_AVX2 0
#endif

static const kvs_dtype types[] = {KVS_Q4_K, KVS_Q6_K, KVS_Q5_K, KVS_IQ4_NL, KVS_Q4_1, KVS_Q5_0, KVS_Q5_1};
#define N_TYPES (sizeof types / sizeof types[0])

/* Random blocks: random quant and scale bytes, finite fp16 super-block scales (values about
 * +-1 in size: amp over the largest raw product of the type; Q4_1 / Q5_1 mins in [-1, 1]). */
static void random_blocks(kvs_dtype t, void *dst, int64_t n)
{
    const size_t bb = kvs_dtype_block_bytes(t), be = kvs_dtype_block_elems(t);
    const float range = t == KVS_Q4_K ? 945 : t == KVS_Q5_K ? 1953 : t == KVS_Q6_K ? 4064
                        : t == KVS_Q4_1 ? 15 : t == KVS_Q5_0 ? 16 : t == KVS_Q5_1 ? 31 : 127;
    char *p = dst;
    for (int64_t b = 0; b < n / (int64_t)be; b++, p += bb) {
        for (size_t i = 0; i < bb; i++)
            p[i] = (char)rnd_u32();
        const uint16_t d = kvs_fp32_to_fp16(rnd_unit() / range);
        const uint16_t m = kvs_fp32_to_fp16(rnd_unit() / range);
        switch ((int)t) {
        case KVS_Q4_K: ((kvs_block_q4_K *)p)->d = d, ((kvs_block_q4_K *)p)->dmin = m; break;
        case KVS_Q5_K: ((kvs_block_q5_K *)p)->d = d, ((kvs_block_q5_K *)p)->dmin = m; break;
        case KVS_Q6_K: ((kvs_block_q6_K *)p)->d = d; break;
        case KVS_Q4_1: ((kvs_block_q4_1 *)p)->d = d, ((kvs_block_q4_1 *)p)->m = kvs_fp32_to_fp16(rnd_unit()); break;
        case KVS_Q5_0: ((kvs_block_q5_0 *)p)->d = d; break;
        case KVS_Q5_1: ((kvs_block_q5_1 *)p)->d = d, ((kvs_block_q5_1 *)p)->m = kvs_fp32_to_fp16(rnd_unit()); break;
        default: ((kvs_block_iq4_nl *)p)->d = d; break;
        }
    }
}

/* Row r of x: kind 0 uniform in [-1, 1], 1 all zeros, 2 one huge value among small ones, 3 all
 * negative, 4 a zero block among uniform values. */
static void random_x_row(float *x, int n, int kind)
{
    for (int i = 0; i < n; i++)
        x[i] = kind == 1 ? 0.0f : kind == 3 ? -fabsf(rnd_unit()) * 3.0f : rnd_unit();
    if (kind == 2)
        x[(int)(rnd_u32() % (uint32_t)n)] = 3.0e4f;
    if (kind == 4)
        memset(x + 32 * (int)(rnd_u32() % (uint32_t)(n / 32)), 0, 32 * sizeof(float));
}

typedef struct {
    kvs_pool *pools[4]; /* NULL, 1, 2, 3 threads */
    int cases, bad_cases;
    int avx2_cases;       /* of them, on kvs_matmul_kq_avx2 */
    double worst_a, worst_b; /* worst |err| / tolerance seen */
} kq_state;

/* Checks y against yr (tolerance per output tol_a) and against the exact product ye (tol_b). */
static int count_bad(const float *y, const float *yr, const double *ye, const double *tol_a,
                     const double *tol_b, size_t n, kq_state *st)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double ea = fabs((double)y[i] - yr[i]), eb = fabs((double)y[i] - ye[i]);
        if (!(ea <= tol_a[i]) || !(eb <= tol_b[i])) {
            if (bad == 0) /* the first one, to diagnose */
                fprintf(stderr, "  output %zu: y %.9g ref %.9g exact %.9g tol_a %.3g tol_b %.3g\n", i,
                        y[i], yr[i], ye[i], tol_a[i], tol_b[i]);
            bad++;
        }
        if (ea / tol_a[i] > st->worst_a)
            st->worst_a = ea / tol_a[i];
        if (eb / tol_b[i] > st->worst_b)
            st->worst_b = eb / tol_b[i];
    }
    return bad;
}

/* The quantisation bounds of one case's outputs: sum |w_i| xd_b / 2 with xd_b the scale of x
 * block b, amax_b / 127 (grid = 0), or on its super-block's grid as matmul_kq.h defines it
 * (grid = 1: D = max amax / 127, k_b = ceil(128 amax_b / max amax) in 1..128, xd_b = D k_b /
 * 128), plus the summation-order term. */
static void bounds(const float *x, const float *wf, const double *sabs, int n_rows, int n_in,
                   int n_out, int grid, double *tol_b)
{
    const int nb = n_in / 32;
    float *am = malloc(sizeof(float) * (size_t)nb), *xd = malloc(sizeof(float) * (size_t)nb);
    if (!am || !xd) {
        CHECK(0);
        free(am), free(xd);
        return;
    }
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        for (int b = 0; b < nb; b++) {
            am[b] = 0.0f;
            for (int i = 0; i < 32; i++)
                am[b] = fmaxf(am[b], fabsf(xr[32 * b + i]));
            xd[b] = am[b] / 127.0f;
        }
        for (int sb = 0; grid && sb < nb / 8; sb++) {
            float m = 0.0f;
            for (int p = 0; p < 8; p++)
                m = fmaxf(m, am[8 * sb + p]);
            for (int p = 0; p < 8; p++) {
                const float k = m > 0.0f ? fminf(fmaxf(ceilf(am[8 * sb + p] * 128.0f / m), 1.0f), 128.0f) : 1.0f;
                xd[8 * sb + p] = m / 127.0f * k / 128.0f;
            }
        }
        for (int o = 0; o < n_out; o++) {
            const float *wr = wf + (size_t)o * n_in;
            double qerr = 0;
            for (int k = 0; k < n_in; k++)
                qerr += fabs((double)wr[k]) * xd[k / 32] * 0.5;
            const size_t i = (size_t)r * n_out + o;
            tol_b[i] = qerr * 1.01 + 1e-5 * sabs[i] + 1e-6;
        }
    }
    free(am), free(xd);
}

/* How many of y are off the reference yr (tol_a) or the exact product (tol_b); -1 when the
 * call failed. */
static int run_bad(kvs_status s, const float *y, const float *yr, const double *ye,
                   const double *tol_a, const double *tol_b, size_t n, kq_state *st)
{
    return s == KVS_OK ? count_bad(y, yr, ye, tol_a, tol_b, n, st) : -1;
}

static void check_case(kq_state *st, kvs_dtype t, int n_rows, int n_in, int n_out)
{
    uint64_t rb = 0;
    if (kvs_dtype_bytes(t, (uint64_t)n_in, &rb) != 0) {
        CHECKF(0, "bad shape %s %d", kvs_dtype_name(t), n_in);
        return;
    }
    const int super = t == KVS_Q4_K || t == KVS_Q5_K || t == KVS_Q6_K;
    const size_t ny = (size_t)n_rows * n_out;
    char *w = malloc(rb * (size_t)n_out);
    float *x = malloc(sizeof(float) * (size_t)n_rows * n_in);
    float *wf = malloc(sizeof(float) * (size_t)n_out * n_in);
    float *yr = malloc(sizeof(float) * ny), *ys = malloc(sizeof(float) * ny), *y = malloc(sizeof(float) * ny);
    double *ye = malloc(sizeof(double) * ny), *tol_a = malloc(sizeof(double) * ny);
    double *tol_b = malloc(sizeof(double) * ny), *tol_s = malloc(sizeof(double) * ny);
    double *sabs = calloc(ny, sizeof(double));
    if (!w || !x || !wf || !yr || !ys || !y || !ye || !tol_a || !tol_b || !tol_s || !sabs) {
        CHECK(0);
        goto out;
    }
    random_blocks(t, w, (int64_t)n_in * n_out);
    for (int r = 0; r < n_rows; r++)
        random_x_row(x + (size_t)r * n_in, n_in, n_rows == 1 ? (int)(rnd_u32() % 5) : r % 5);
    for (int o = 0; o < n_out; o++)
        kvs_dequantize_row_ref(t, w + (size_t)o * rb, wf + (size_t)o * n_in, n_in);
    kvs_matmul_kq_ref(yr, x, w, t, n_rows, n_in, n_out);
    if (super)
        kvs_matmul_kq_ref_sb(ys, x, w, t, n_rows, n_in, n_out);
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        for (int o = 0; o < n_out; o++) {
            const float *wr = wf + (size_t)o * n_in;
            /* Q4_1 / Q5_1 sum the two terms d u x and m x separately (in fp32), which may cancel:
             * the summation-order errors scale with |d u x| + |m x| <= (|w| + 2 |m|) |x| */
            const int has_min = t == KVS_Q4_1 || t == KVS_Q5_1;
            const size_t bb = kvs_dtype_block_bytes(t);
            double exact = 0, sa = 0;
            for (int k = 0; k < n_in; k++) {
                exact += (double)xr[k] * wr[k];
                sa += fabs((double)xr[k] * wr[k]);
                if (has_min) {
                    uint16_t m;
                    memcpy(&m, w + (size_t)o * rb + (size_t)(k / 32) * bb + 2, 2);
                    sa += 2.0 * fabs((double)kvs_fp16_to_fp32(m) * xr[k]);
                }
            }
            const size_t i = (size_t)r * n_out + o;
            ye[i] = exact;
            sabs[i] = sa;
            tol_a[i] = 1e-5 * sa + 1e-6;
        }
    }
    bounds(x, wf, sabs, n_rows, n_in, n_out, 0, tol_b);
    if (super)
        bounds(x, wf, sabs, n_rows, n_in, n_out, 1, tol_s);
    /* the references themselves obey their quantisation bounds */
    int ref_bad = 0;
    for (size_t i = 0; i < ny; i++)
        if (!(fabs((double)yr[i] - ye[i]) <= tol_b[i]) || (super && !(fabs((double)ys[i] - ye[i]) <= tol_s[i])))
            ref_bad++;
    CHECKF(ref_bad == 0, "ref %s rows=%d in=%d out=%d: %d outputs off the exact product",
           kvs_dtype_name(t), n_rows, n_in, n_out, ref_bad);
    /* kvs_matmul_kq has the arithmetic of the reference of its x group in this build */
    const int by_sb = kvs_matmul_kq_on_grid(t);
    CHECK(!by_sb || super);
    const float *yd = by_sb ? ys : yr;
    const double *tol_d = by_sb ? tol_s : tol_b;
    for (int p = 0; p < 4; p++) {
        for (size_t i = 0; i < ny; i++)
            y[i] = NAN;
        const kvs_status s = kvs_matmul_kq(st->pools[p], y, x, w, t, n_rows, n_in, n_out);
        const int bad = run_bad(s, y, yd, ye, tol_a, tol_d, ny, st);
        CHECKF(bad == 0, "kq %s rows=%d in=%d out=%d threads=%d: %d bad", kvs_dtype_name(t),
               n_rows, n_in, n_out, p, bad);
        st->cases++;
        st->bad_cases += bad != 0;
    }
    /* the AVX2 path, which CPUs without AVX-512 VNNI take, on any CPU with AVX2 */
    for (int p = 0; p < 4; p += 2) {
        for (size_t i = 0; i < ny; i++)
            y[i] = NAN;
        const kvs_status s = kvs_matmul_kq_avx2(st->pools[p], y, x, w, t, n_rows, n_in, n_out);
        if (s == KVS_ERR_UNSUPPORTED) {
            CHECKF(!KVS_TEST_AVX2 || !super, "kq avx2 %s: refused", kvs_dtype_name(t));
            break;
        }
        const int bad = run_bad(s, y, ys, ye, tol_a, tol_s, ny, st);
        CHECKF(bad == 0, "kq avx2 %s rows=%d in=%d out=%d threads=%d: %d bad", kvs_dtype_name(t),
               n_rows, n_in, n_out, p, bad);
        st->cases++;
        st->avx2_cases++;
        st->bad_cases += bad != 0;
    }
    /* (c) the routing: kvs_matmul gives these results too */
    for (size_t i = 0; i < ny; i++)
        y[i] = NAN;
    {
        const kvs_status s = kvs_matmul(st->pools[2], y, x, w, t, n_rows, n_in, n_out);
        const int bad = run_bad(s, y, yd, ye, tol_a, tol_d, ny, st);
        CHECKF(bad == 0, "kvs_matmul %s rows=%d in=%d out=%d: %d bad", kvs_dtype_name(t), n_rows,
               n_in, n_out, bad);
    }
out:
    free(w), free(x), free(wf), free(yr), free(ys), free(y), free(ye), free(tol_a), free(tol_b);
    free(tol_s), free(sabs);
}

/* kvs_matmul_kq_ref_sb's grid, worked by hand: x[0] = 1e4 makes D = 1e4 / 127 (k_0 = 128), so
 * a block of 1.0 in the same super-block gets k = ceil(128 / 1e4) = 1, xd = D / 128 and q =
 * rint(127 * 128 / 1e4) = 2: it counts as 2 D / 128 = 1.2303 each; in the next super-block
 * (its own D = 1 / 127) as 1.0, and in kvs_matmul_kq_ref (blocks of 32) as 1.0 everywhere. */
static void test_sb_grid(void)
{
    const kvs_dtype super[] = {KVS_Q4_K, KVS_Q5_K, KVS_Q6_K};
    for (size_t t = 0; t < 3; t++) {
        uint64_t rb = 0;
        CHECK(kvs_dtype_bytes(super[t], 512, &rb) == 0);
        char *w = malloc(rb);
        static float x[512], wf[512];
        random_blocks(super[t], w, 512);
        kvs_dequantize_row_ref(super[t], w, wf, 512);
        memset(x, 0, sizeof x);
        x[0] = 1.0e4f;
        for (int i = 32; i < 64; i++)
            x[i] = 1.0f;
        for (int i = 256; i < 288; i++)
            x[i] = 1.0f;
        const double dd = 1.0e4f / 127.0f, v = 2.0 * (float)(dd * (1.0 / 128.0));
        double e_sb = (double)wf[0] * 127.0 * dd, e_32 = (double)wf[0] * 1.0e4, sabs = fabs(e_32);
        for (int i = 32; i < 64; i++)
            e_sb += v * wf[i], e_32 += wf[i], sabs += fabs(v * wf[i]);
        for (int i = 256; i < 288; i++)
            e_sb += (double)wf[i], e_32 += wf[i], sabs += fabs(wf[i]);
        float ys, yr;
        kvs_matmul_kq_ref_sb(&ys, x, w, super[t], 1, 512, 1);
        kvs_matmul_kq_ref(&yr, x, w, super[t], 1, 512, 1);
        const double tol = 1e-5 * sabs + 1e-6;
        CHECKF(fabs(ys - e_sb) <= tol && fabs(yr - e_32) <= tol && fabs(e_sb - e_32) > 100 * tol,
               "%s: ref_sb %.9g (by hand %.9g), ref %.9g (%.9g)", kvs_dtype_name(super[t]), ys, e_sb,
               yr, e_32);
        free(w);
    }
}

static void test_shapes(kq_state *st)
{
    const int ins[] = {256, 768, 2048};
    const int outs[] = {1, 5, 16, 17, 48, 100};
    const int rows[] = {1, 2, 3, 4, 5, 8, 33};
    /* Under ThreadSanitizer a sub-grid (one row count of each tile path, few and many
     * columns), and one round of the repeated cases below. */
    const int tsan_ins[] = {256, 768}, tsan_outs[] = {1, 17, 100}, tsan_rows[] = {1, 3, 8, 33};
    const int n_ins = KVS_UNDER_TSAN ? 2 : 3, n_outs = KVS_UNDER_TSAN ? 3 : 6,
              n_rows = KVS_UNDER_TSAN ? 4 : 7;
    for (size_t t = 0; t < N_TYPES; t++)
        for (int a = 0; a < n_ins; a++)
            for (int b = 0; b < n_outs; b++)
                for (int c = 0; c < n_rows; c++)
                    check_case(st, types[t], KVS_UNDER_TSAN ? tsan_rows[c] : rows[c],
                               KVS_UNDER_TSAN ? tsan_ins[a] : ins[a],
                               KVS_UNDER_TSAN ? tsan_outs[b] : outs[b]);
    /* block-of-32 rows that are not whole groups of 8 blocks (odd block counts), and repeated
     * seeds */
    const kvs_dtype b32[] = {KVS_IQ4_NL, KVS_Q4_1, KVS_Q5_0, KVS_Q5_1};
    for (int rep = 0; rep < (KVS_UNDER_TSAN ? 1 : 3); rep++) {
        for (size_t t = 0; t < sizeof b32 / sizeof b32[0]; t++) {
            check_case(st, b32[t], 1, 32, 7);
            check_case(st, b32[t], 3, 96, 20);
            check_case(st, b32[t], 2, 416, 9);
            check_case(st, b32[t], 9, 160, 50);
            check_case(st, b32[t], 12, 224, 33);
        }
        for (size_t t = 0; t < N_TYPES; t++) {
            check_case(st, types[t], 1, 512, 33);
            check_case(st, types[t], 6, 1280, 70);
        }
        /* AVX2's 8-column tiles (from 16 or 24 rows) with 1, 2 and 3 x rows left over */
        const kvs_dtype ks[] = {KVS_Q4_K, KVS_Q5_K, KVS_Q6_K};
        for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
            check_case(st, ks[t], 26, 768, 17);
            check_case(st, ks[t], 35, 512, 100);
        }
    }
}

/* A corrupted weight byte gives results the checks reject: the tolerances are not vacuous. */
static void test_detects_errors(void)
{
    for (size_t t = 0; t < N_TYPES; t++) {
        const int n_in = 256, n_out = 8;
        uint64_t rb = 0;
        CHECK(kvs_dtype_bytes(types[t], n_in, &rb) == 0);
        char *w = malloc(rb * n_out), *w2 = malloc(rb * n_out);
        float x[256], y[8], y2[8];
        random_blocks(types[t], w, (int64_t)n_in * n_out);
        for (int i = 0; i < n_in; i++)
            x[i] = rnd_unit();
        memcpy(w2, w, rb * n_out);
        /* flip a high bit of a quant in the first super-block / block of row 3 */
        const size_t qoff = types[t] == KVS_Q6_K ? 5 : types[t] == KVS_IQ4_NL ? 7 : types[t] == KVS_Q5_K ? 60
                            : types[t] == KVS_Q4_1 ? 9 : types[t] == KVS_Q5_0 ? 11 : types[t] == KVS_Q5_1 ? 13 : 20;
        w2[3 * rb + qoff] ^= 0x88;
        CHECK(kvs_matmul_kq(NULL, y, x, w, types[t], 1, n_in, n_out) == KVS_OK);
        CHECK(kvs_matmul_kq(NULL, y2, x, w2, types[t], 1, n_in, n_out) == KVS_OK);
        float wf[256];
        kvs_dequantize_row_ref(types[t], w + 3 * rb, wf, n_in);
        double sabs = 0;
        for (int i = 0; i < n_in; i++)
            sabs += fabs((double)wf[i] * x[i]);
        CHECKF(fabs((double)y[3] - y2[3]) > 1e-5 * sabs + 1e-6 && y[2] == y2[2],
               "%s: corrupted weight not seen", kvs_dtype_name(types[t]));
        free(w), free(w2);
    }
}

static void test_types(kvs_pool *pool)
{
    for (size_t t = 0; t < N_TYPES; t++)
        CHECK(kvs_kq_type(types[t]));
    const kvs_dtype no[] = {KVS_F32, KVS_F16, KVS_BF16, KVS_Q8_0, KVS_Q4_0, KVS_Q2_K, KVS_Q3_K};
    float y = 42.0f, x[256] = {0};
    static _Alignas(64) char w[1024];
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        CHECKF(!kvs_kq_type(no[i]), "%s", kvs_dtype_name(no[i]));
        CHECK(kvs_matmul_kq(pool, &y, x, w, no[i], 1, 256, 1) == KVS_ERR_UNSUPPORTED);
    }
    CHECK(!kvs_kq_type((kvs_dtype)9) && !kvs_kq_type((kvs_dtype)-1));
    CHECK(y == 42.0f);
    /* kvs_matmul still checks the sizes for these types */
    CHECK(kvs_matmul(pool, &y, x, w, KVS_Q4_K, 1, 128, 1) == KVS_ERR_ARG);
    CHECK(kvs_matmul(pool, &y, x, w, KVS_IQ4_NL, 1, 48, 1) == KVS_ERR_ARG);
    CHECK(y == 42.0f);
}

int main(void)
{
    kq_state st;
    memset(&st, 0, sizeof st);
    st.pools[1] = kvs_pool_create(1);
    st.pools[2] = kvs_pool_create(2);
    st.pools[3] = kvs_pool_create(3);
    CHECK(st.pools[1] && st.pools[2] && st.pools[3]);
    test_types(st.pools[2]);
    test_detects_errors();
    test_sb_grid();
    test_shapes(&st);
    printf("matmul_kq: %d cases (%d on the AVX2 path), %d bad; worst err / tolerance: vs "
           "reference %.3g, vs exact %.3g\n",
           st.cases, st.avx2_cases, st.bad_cases, st.worst_a, st.worst_b);
    CHECK(!KVS_TEST_AVX2 || st.avx2_cases > 0);
    for (int i = 1; i < 4; i++)
        kvs_pool_destroy(st.pools[i]);
    return check_summary("test_matmul_kq");
}
