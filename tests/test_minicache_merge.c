/* MiniCache's per-unit math (src/policies/minicache_merge.c) against methods/minicache.md §7.
 *
 * The reference below is independent fp64 code written from the spec's equations (Eq. 3 with
 * acos, §2.5, §2.6, §3.1), not from the implementation's midpoint form. Random draws come from a
 * fixed-seed xoshiro256** (core/random.h), so every run sees the same vectors. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "policies/minicache_merge.h"

#define DMAX 4096

/* ---- fp64 helpers and the reference ---- */

static double dnorm(const double *x, int D)
{
    double s = 0.0;
    for (int k = 0; k < D; k++)
        s += x[k] * x[k];
    return sqrt(s);
}

static double ddot(const double *x, const double *y, int D)
{
    double s = 0.0;
    for (int k = 0; k < D; k++)
        s += x[k] * y[k];
    return s;
}

static void to_double(const float *x, double *y, int D)
{
    for (int k = 0; k < D; k++)
        y[k] = x[k];
}

static void dunit(const float *x, double *u, int D)
{
    to_double(x, u, D);
    const double n = dnorm(u, D);
    for (int k = 0; k < D; k++)
        u[k] /= n;
}

/* The angle between two fp32 vectors, in double: acos of the normalised dot (clamped). */
static double angle_f(const float *x, const double *u, int D)
{
    double v[DMAX];
    dunit(x, v, D);
    double c = ddot(v, u, D) / dnorm(u, D);
    c = c > 1.0 ? 1.0 : c < -1.0 ? -1.0 : c;
    return acos(c);
}

/* Eq. 3 as printed: Omega = acos(u_a . u_b), e = sin((1-t)Omega)/sin Omega u_a + sin(t Omega)/
 * sin Omega u_b. Only for 0 < Omega < pi (the tests' random range). */
static double ref_slerp(const float *xa, const float *xb, int D, double t, double *e)
{
    double ua[DMAX], ub[DMAX];
    dunit(xa, ua, D);
    dunit(xb, ub, D);
    double c = ddot(ua, ub, D);
    c = c > 1.0 ? 1.0 : c < -1.0 ? -1.0 : c;
    const double om = acos(c), s = sin(om);
    for (int k = 0; k < D; k++)
        e[k] = sin((1.0 - t) * om) / s * ua[k] + sin(t * om) / s * ub[k];
    return om;
}

/* ||x - y|| / ||y|| with x fp32 and y fp64. */
static double rel_err(const float *x, const double *y, int D)
{
    double s = 0.0;
    for (int k = 0; k < D; k++)
        s += (x[k] - y[k]) * (x[k] - y[k]);
    return sqrt(s) / dnorm(y, D);
}

/* The restoration of Eq. 2 as a consumer computes it in fp32: e * (n / ||e||). */
static void restore(const float *e, float n, int D, float *out)
{
    double en = 0.0;
    for (int k = 0; k < D; k++)
        en += (double)e[k] * e[k];
    const float f = en > 0.0 ? (float)(n / sqrt(en)) : 0.0f;
    for (int k = 0; k < D; k++)
        out[k] = e[k] * f;
}

static int all_finite(const float *x, int D)
{
    for (int k = 0; k < D; k++)
        if (!isfinite(x[k]))
            return 0;
    return 1;
}

/* ---- random inputs ---- */

static double gauss(kvs_xoshiro *g)
{
    const double u1 = kvs_random_unit_open(kvs_xoshiro_next(g));
    const double u2 = kvs_random_unit(kvs_xoshiro_next(g));
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void rand_vec(kvs_xoshiro *g, float *x, int D, double scale)
{
    for (int k = 0; k < D; k++)
        x[k] = (float)(scale * gauss(g));
}

/* A pair at angle near om (exact in double, then rounded to fp32): xa random, xb = nb (cos om ua
 * + sin om v) with v a random unit vector orthogonal to ua. */
static void rand_pair(kvs_xoshiro *g, float *xa, float *xb, int D, double om)
{
    double ua[DMAX], v[DMAX];
    rand_vec(g, xa, D, 1.0 + 3.0 * kvs_random_unit(kvs_xoshiro_next(g)));
    dunit(xa, ua, D);
    for (int k = 0; k < D; k++)
        v[k] = gauss(g);
    const double c = ddot(v, ua, D);
    for (int k = 0; k < D; k++)
        v[k] -= c * ua[k];
    const double vn = dnorm(v, D), nb = 0.5 + 2.0 * kvs_random_unit(kvs_xoshiro_next(g));
    for (int k = 0; k < D; k++)
        xb[k] = (float)(nb * (cos(om) * ua[k] + sin(om) / vn * v[k]));
}

static const int dims[] = {8, 64, 128, 4096};
#define NDIMS ((int)(sizeof dims / sizeof dims[0]))

/* ---- T1, T2: identical and scaled inputs restore exactly ---- */

static void test_identical_and_scaled(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 9001);
    static float xa[DMAX], xb[DMAX], e[DMAX], r[DMAX];
    double ua[DMAX], xd[DMAX];
    const float ts[] = {0.0f, 0.3f, 0.6f, 1.0f};
    for (int di = 0; di < NDIMS; di++) {
        const int D = dims[di];
        for (int ti = 0; ti < 4; ti++) {
            float na, nb, om;
            rand_vec(&g, xa, D, 2.0);
            memcpy(xb, xa, sizeof(float) * D);
            kvs_mc_merge_unit(xa, xb, D, ts[ti], KVS_MC_SLERP, 0, e, &na, &nb, &om);
            dunit(xa, ua, D);
            CHECKF(rel_err(e, ua, D) < 1e-6, "T1 D=%d t=%g: e = u (err %g)", D, ts[ti],
                   rel_err(e, ua, D));
            to_double(xa, xd, D);
            restore(e, na, D, r);
            CHECKF(rel_err(r, xd, D) < 1e-6, "T1 D=%d: layer a restored (err %g)", D,
                   rel_err(r, xd, D));
            restore(e, nb, D, r);
            CHECKF(rel_err(r, xd, D) < 1e-6, "T1 D=%d: layer b restored", D);

            /* T2: x^b = alpha x^a, alpha = 3.7 (rounded per element) and 1/128 (exact) */
            const double alphas[] = {3.7, 1.0 / 128.0};
            for (int ai = 0; ai < 2; ai++) {
                for (int k = 0; k < D; k++)
                    xb[k] = (float)(alphas[ai] * xa[k]);
                kvs_mc_merge_unit(xa, xb, D, ts[ti], KVS_MC_SLERP, 0, e, &na, &nb, &om);
                restore(e, na, D, r);
                CHECKF(rel_err(r, xd, D) < 1e-6, "T2 D=%d alpha=%g: a restored (err %g)", D,
                       alphas[ai], rel_err(r, xd, D));
                double xbd[DMAX];
                to_double(xb, xbd, D);
                restore(e, nb, D, r);
                CHECKF(rel_err(r, xbd, D) < 1e-6, "T2 D=%d alpha=%g: b restored (err %g)", D,
                       alphas[ai], rel_err(r, xbd, D));
            }
        }
    }
}

/* ---- T3, T5, T6: unit direction, geodesic angles, magnitude, vs the fp64 reference ---- */

static void test_random_pairs(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 4242);
    static float xa[DMAX], xb[DMAX], e[DMAX], r[DMAX];
    double ua[DMAX], ub[DMAX], er[DMAX];
    double worst_norm = 0, worst_ang = 0, worst_ref = 0, worst_mag = 0;
    int n = 0;
    for (int di = 0; di < NDIMS; di++) {
        const int D = dims[di];
        const int reps = D >= 4096 ? 40 : 400;
        for (int i = 0; i < reps; i++) {
            /* the range's ends are drawn explicitly, the rest uniformly */
            const double lo = 1.5e-3, hi = M_PI - 1.5e-3;
            const double om = i == 0 ? lo : i == 1 ? hi : lo + (hi - lo) *
                                       kvs_random_unit(kvs_xoshiro_next(&g));
            const float t = i % 5 == 0 ? 0.6f : (float)kvs_random_unit(kvs_xoshiro_next(&g));
            rand_pair(&g, xa, xb, D, om);
            float na, nb, omf;
            kvs_mc_merge_unit(xa, xb, D, t, KVS_MC_SLERP, 0, e, &na, &nb, &omf);
            const double omr = ref_slerp(xa, xb, D, t, er);
            if (!(omr > 1e-3 && omr < M_PI - 1e-3))
                continue;
            n++;
            /* T3 */
            double ed[DMAX];
            to_double(e, ed, D);
            const double dn = fabs(dnorm(ed, D) - 1.0);
            worst_norm = fmax(worst_norm, dn);
            CHECKF(dn < 1e-6, "T3 D=%d Omega=%.6f t=%g: | ||e|| - 1 | = %g", D, omr, t, dn);
            CHECKF(fabs(omf - omr) < 1e-5, "T3 D=%d: Omega %.9f vs reference %.9f", D, omf, omr);
            /* T5 */
            dunit(xa, ua, D);
            dunit(xb, ub, D);
            const double aa = fabs(angle_f(e, ua, D) - t * omr);
            const double ab = fabs(angle_f(e, ub, D) - (1.0 - t) * omr);
            worst_ang = fmax(worst_ang, fmax(aa, ab));
            CHECKF(aa < 1e-5 && ab < 1e-5, "T5 D=%d Omega=%.6f t=%g: angle errors %g, %g", D,
                   omr, t, aa, ab);
            /* e itself, where the plane is well conditioned (not within 0.1 of antiparallel) */
            if (omr < M_PI - 0.1) {
                const double re = rel_err(e, er, D);
                worst_ref = fmax(worst_ref, re);
                CHECKF(re < 1e-5, "T3 D=%d Omega=%.6f t=%g: e vs reference %g", D, omr, t, re);
            }
            /* T6: the restored vectors have the original norms */
            const float ns[2] = {na, nb};
            const float *xs[2] = {xa, xb};
            for (int l = 0; l < 2; l++) {
                double xd[DMAX], rd[DMAX];
                to_double(xs[l], xd, D);
                restore(e, ns[l], D, r);
                to_double(r, rd, D);
                const double m = fabs(dnorm(rd, D) / dnorm(xd, D) - 1.0);
                worst_mag = fmax(worst_mag, m);
                CHECKF(m < 1e-6, "T6 D=%d layer %d: norm rel err %g", D, l, m);
            }
        }
    }
    CHECK(n > 1000);
    printf("random pairs: %d, worst | ||e|| - 1 | %.3g, angle %.3g rad, vs reference %.3g, "
           "restored norm %.3g\n", n, worst_norm, worst_ang, worst_ref, worst_mag);
}

/* ---- T4: endpoints ---- */

static void test_endpoints(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 77);
    static float xa[DMAX], xb[DMAX], e[DMAX], r[DMAX];
    double ua[DMAX], ub[DMAX], mid[DMAX], xd[DMAX];
    for (int di = 0; di < NDIMS; di++) {
        const int D = dims[di];
        for (int i = 0; i < 20; i++) {
            float na, nb, om;
            rand_pair(&g, xa, xb, D, 0.05 + 3.0 * i / 20.0);
            dunit(xa, ua, D);
            dunit(xb, ub, D);
            kvs_mc_merge_unit(xa, xb, D, 0.0f, KVS_MC_SLERP, 0, e, &na, &nb, &om);
            CHECKF(rel_err(e, ua, D) < 1e-6, "T4 D=%d t=0: e = u_a (err %g)", D,
                   rel_err(e, ua, D));
            to_double(xa, xd, D);
            restore(e, na, D, r);
            CHECKF(rel_err(r, xd, D) < 1e-6, "T4 D=%d t=0: layer a restored", D);
            kvs_mc_merge_unit(xa, xb, D, 1.0f, KVS_MC_SLERP, 0, e, &na, &nb, &om);
            CHECKF(rel_err(e, ub, D) < 1e-6, "T4 D=%d t=1: e = u_b (err %g)", D,
                   rel_err(e, ub, D));
            to_double(xb, xd, D);
            restore(e, nb, D, r);
            CHECKF(rel_err(r, xd, D) < 1e-6, "T4 D=%d t=1: layer b restored", D);
            kvs_mc_merge_unit(xa, xb, D, 0.5f, KVS_MC_SLERP, 0, e, &na, &nb, &om);
            for (int k = 0; k < D; k++)
                mid[k] = ua[k] + ub[k];
            const double mn = dnorm(mid, D);
            for (int k = 0; k < D; k++)
                mid[k] /= mn;
            CHECKF(rel_err(e, mid, D) < 1e-6, "T4 D=%d t=0.5: e = normalize(u_a + u_b) (err %g)",
                   D, rel_err(e, mid, D));
        }
    }
}

/* ---- T11: rotation equivariance (random orthogonal Q, RoPE) ---- */

static void apply_f(const double *Q, const float *x, float *y, int D)
{
    for (int i = 0; i < D; i++) {
        double s = 0.0;
        for (int k = 0; k < D; k++)
            s += Q[i * D + k] * x[k];
        y[i] = (float)s;
    }
}

static void apply_d(const double *Q, const float *x, double *y, int D)
{
    for (int i = 0; i < D; i++) {
        double s = 0.0;
        for (int k = 0; k < D; k++)
            s += Q[i * D + k] * x[k];
        y[i] = s;
    }
}

static void check_equivariance(const char *what, const double *Q, const float *xa,
                               const float *xb, int D, float t)
{
    float qa[DMAX], qb[DMAX], e[DMAX], eq[DMAX];
    double qe[DMAX];
    float na, nb, om, qna, qnb, qom;
    kvs_mc_merge_unit(xa, xb, D, t, KVS_MC_SLERP, 0, e, &na, &nb, &om);
    apply_f(Q, xa, qa, D);
    apply_f(Q, xb, qb, D);
    kvs_mc_merge_unit(qa, qb, D, t, KVS_MC_SLERP, 0, eq, &qna, &qnb, &qom);
    apply_d(Q, e, qe, D);
    CHECKF(rel_err(eq, qe, D) < 1e-5, "T11 %s D=%d: merge(Qa, Qb) vs Q merge(a, b): %g", what, D,
           rel_err(eq, qe, D));
    CHECKF(fabs(qna / na - 1) < 1e-6 && fabs(qnb / nb - 1) < 1e-6, "T11 %s: norms unchanged",
           what);
    CHECKF(fabs(qom - om) < 1e-5, "T11 %s: Omega %g vs %g", what, qom, om);
}

static void test_rotation(void)
{
    enum { D = 32 };
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 31337);
    static double Q[D * D];
    float xa[D], xb[D];
    /* Gram-Schmidt (twice per row) on a Gaussian matrix */
    for (int i = 0; i < D * D; i++)
        Q[i] = gauss(&g);
    for (int i = 0; i < D; i++) {
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < i; j++) {
                const double c = ddot(&Q[i * D], &Q[j * D], D);
                for (int k = 0; k < D; k++)
                    Q[i * D + k] -= c * Q[j * D + k];
            }
        const double n = dnorm(&Q[i * D], D);
        for (int k = 0; k < D; k++)
            Q[i * D + k] /= n;
    }
    for (int i = 0; i < 20; i++) {
        rand_pair(&g, xa, xb, D, 0.1 + 2.8 * kvs_random_unit(kvs_xoshiro_next(&g)));
        check_equivariance("orthogonal", Q, xa, xb, D, i % 2 ? 0.6f : 0.35f);
    }
    /* RoPE at position 123: rotate pairs (2i, 2i+1) by 123 * 10000^(-2i/D) */
    memset(Q, 0, sizeof Q);
    for (int i = 0; i < D / 2; i++) {
        const double th = 123.0 * pow(10000.0, -2.0 * i / D);
        Q[(2 * i) * D + 2 * i] = cos(th);
        Q[(2 * i) * D + 2 * i + 1] = -sin(th);
        Q[(2 * i + 1) * D + 2 * i] = sin(th);
        Q[(2 * i + 1) * D + 2 * i + 1] = cos(th);
    }
    for (int i = 0; i < 20; i++) {
        rand_pair(&g, xa, xb, D, 0.1 + 2.8 * kvs_random_unit(kvs_xoshiro_next(&g)));
        check_equivariance("RoPE", Q, xa, xb, D, 0.6f);
    }
}

/* ---- T12: swap symmetry, and the swap flag (A1) ---- */

static void test_swap(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 12);
    static float xa[DMAX], xb[DMAX], e1[DMAX], e2[DMAX];
    double ed[DMAX];
    for (int di = 0; di < NDIMS; di++) {
        const int D = dims[di];
        for (int i = 0; i < 30; i++) {
            const float t = i % 3 == 0 ? 0.6f : (float)kvs_random_unit(kvs_xoshiro_next(&g));
            float na1, nb1, om1, na2, nb2, om2;
            rand_pair(&g, xa, xb, D, 0.01 + 3.1 * i / 30.0);
            kvs_mc_merge_unit(xa, xb, D, t, KVS_MC_SLERP, 0, e1, &na1, &nb1, &om1);
            kvs_mc_merge_unit(xb, xa, D, 1.0f - t, KVS_MC_SLERP, 0, e2, &na2, &nb2, &om2);
            to_double(e1, ed, D);
            CHECKF(rel_err(e2, ed, D) < 1e-6, "T12 D=%d t=%g: merge(b, a, 1-t) vs merge(a, b, t): "
                   "%g", D, t, rel_err(e2, ed, D));
            CHECK(na1 == nb2 && nb1 == na2 && om1 == om2);
            /* swap = 1 is Algorithm 2's order: Eq. 3 at 1 - t */
            kvs_mc_merge_unit(xa, xb, D, 1.0f - t, KVS_MC_SLERP, 0, e2, &na2, &nb2, &om2);
            kvs_mc_merge_unit(xa, xb, D, t, KVS_MC_SLERP, 1, e1, &na1, &nb1, &om1);
            to_double(e2, ed, D);
            CHECKF(rel_err(e1, ed, D) < 1e-6, "A1 D=%d t=%g: swap flag = weights at 1 - t", D, t);
        }
    }
    /* the swap flag moves e toward layer a at t = 0.6 (Eq. 3 moves it toward b) */
    double ua[8], ub[8];
    rand_pair(&g, xa, xb, 8, 1.0);
    dunit(xa, ua, 8);
    dunit(xb, ub, 8);
    float na, nb, om;
    kvs_mc_merge_unit(xa, xb, 8, 0.6f, KVS_MC_SLERP, 0, e1, &na, &nb, &om);
    CHECK(angle_f(e1, ub, 8) < angle_f(e1, ua, 8));
    kvs_mc_merge_unit(xa, xb, 8, 0.6f, KVS_MC_SLERP, 1, e1, &na, &nb, &om);
    CHECK(angle_f(e1, ua, 8) < angle_f(e1, ub, 8));
}

/* ---- T15: Mean and F_max store one vector ---- */

static void test_mean_fmax(void)
{
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 15);
    static float xa[DMAX], xb[DMAX], e[DMAX], r[DMAX];
    double m[DMAX], ed[DMAX];
    for (int di = 0; di < NDIMS; di++) {
        const int D = dims[di];
        for (int i = 0; i < 10; i++) {
            float na, nb, om;
            rand_pair(&g, xa, xb, D, 0.2 + 0.25 * i);
            for (int k = 0; k < D; k++)
                m[k] = ((double)xa[k] + xb[k]) / 2.0;
            kvs_mc_merge_unit(xa, xb, D, 0.6f, KVS_MC_MEAN, 0, e, &na, &nb, &om);
            CHECKF(rel_err(e, m, D) < 1e-6, "T15 D=%d: Mean stores (x^a + x^b)/2 (err %g)", D,
                   rel_err(e, m, D));
            to_double(e, ed, D);
            CHECK(na == nb && fabs(na / dnorm(ed, D) - 1) < 1e-6);
            restore(e, na, D, r);
            CHECKF(rel_err(r, ed, D) < 1e-6, "T15 D=%d: Mean restores to e itself", D);
            CHECKF(fabs(om - (0.2 + 0.25 * i)) < 1e-5, "T15 D=%d: Mean reports Omega %g", D, om);

            double xad[DMAX], xbd[DMAX];
            to_double(xa, xad, D);
            to_double(xb, xbd, D);
            const double mx = fmax(dnorm(xad, D), dnorm(xbd, D)), mn = dnorm(m, D);
            for (int k = 0; k < D; k++)
                m[k] = m[k] / mn * mx;
            kvs_mc_merge_unit(xa, xb, D, 0.6f, KVS_MC_FMAX, 0, e, &na, &nb, &om);
            CHECKF(rel_err(e, m, D) < 1e-6, "T15 D=%d: F_max stores normalize(avg) max norm "
                   "(err %g)", D, rel_err(e, m, D));
            to_double(e, ed, D);
            CHECK(na == nb && fabs(na / mx - 1) < 1e-6);
            restore(e, na, D, r);
            CHECKF(rel_err(r, ed, D) < 1e-6, "T15 D=%d: F_max restores to e itself", D);
        }
    }
}

/* ---- T16: degenerate inputs ---- */

static void merge_check_finite(const char *what, const float *xa, const float *xb, int D,
                               float t, kvs_mc_merge fn, float *e, float *na, float *nb,
                               float *om)
{
    kvs_mc_merge_unit(xa, xb, D, t, fn, 0, e, na, nb, om);
    CHECKF(all_finite(e, D) && isfinite(*na) && isfinite(*nb) && isfinite(*om) && *om >= 0 &&
               *om < M_PI,
           "T16 %s fn=%d t=%g: finite outputs", what, (int)fn, t);
}

static void test_degenerate(void)
{
    enum { D = 64 };
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 16);
    float xa[D], xb[D], z[D] = {0}, e[D], r[D], na, nb, om;
    double ua[D], ub[D], xd[D];
    rand_vec(&g, xa, D, 1.0);
    dunit(xa, ua, D);
    to_double(xa, xd, D);
    for (int fn = KVS_MC_SLERP; fn <= KVS_MC_FMAX; fn++) {
        /* both zero */
        merge_check_finite("both zero", z, z, D, 0.6f, fn, e, &na, &nb, &om);
        CHECK(na == 0 && nb == 0 && om == 0);
        restore(e, na, D, r);
        for (int k = 0; k < D; k++)
            CHECK(r[k] == 0.0f);
        /* antiparallel with equal norms, t = 0.4 and 0.6 (and 0.5) */
        for (int k = 0; k < D; k++)
            xb[k] = -xa[k];
        const float ts[] = {0.4f, 0.5f, 0.6f};
        for (int i = 0; i < 3; i++)
            merge_check_finite("antiparallel", xa, xb, D, ts[i], fn, e, &na, &nb, &om);
    }
    /* one layer zero: it restores to exactly 0, the other exactly */
    merge_check_finite("a zero", z, xa, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECK(na == 0.0f && om == 0.0f);
    restore(e, na, D, r);
    for (int k = 0; k < D; k++)
        CHECK(r[k] == 0.0f);
    restore(e, nb, D, r);
    CHECKF(rel_err(r, xd, D) < 1e-6, "T16: the nonzero layer b restores");
    merge_check_finite("b zero", xa, z, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECK(nb == 0.0f && om == 0.0f);
    restore(e, nb, D, r);
    for (int k = 0; k < D; k++)
        CHECK(r[k] == 0.0f);
    restore(e, na, D, r);
    CHECKF(rel_err(r, xd, D) < 1e-6, "T16: the nonzero layer a restores");

    /* exactly parallel (x^b = 2 x^a, exact) */
    for (int k = 0; k < D; k++)
        xb[k] = 2.0f * xa[k];
    merge_check_finite("parallel", xa, xb, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECK(rel_err(e, ua, D) < 1e-6 && om < 1e-6f);
    /* exactly antiparallel (x^b = -3 x^a): SLERP picks an endpoint by t >= 0.5 */
    for (int k = 0; k < D; k++)
        xb[k] = -3.0f * xa[k];
    dunit(xb, ub, D);
    merge_check_finite("antiparallel", xa, xb, D, 0.4f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECKF(rel_err(e, ua, D) < 1e-6, "T16 antiparallel t=0.4: e = u_a");
    CHECK(fabs(om - M_PI) < 1e-6);
    merge_check_finite("antiparallel", xa, xb, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECKF(rel_err(e, ub, D) < 1e-6, "T16 antiparallel t=0.6: e = u_b");
    /* a layer below 2^-40 of its partner counts as zero; 2^-30 does not */
    float tiny[D];
    rand_vec(&g, tiny, D, 1.0);
    for (int k = 0; k < D; k++)
        xb[k] = ldexpf(tiny[k], -50);
    merge_check_finite("relatively tiny", xa, xb, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECK(om == 0.0f && rel_err(e, ua, D) < 1e-6 && nb > 0.0f);
    for (int k = 0; k < D; k++)
        xb[k] = ldexpf(tiny[k], -30);
    merge_check_finite("small", xa, xb, D, 0.6f, KVS_MC_SLERP, e, &na, &nb, &om);
    CHECK(om > 0.5f);
    /* scale invariance: a common power-of-two factor, even into subnormals, changes nothing */
    float sa[D], sb[D], es[D], nas, nbs, oms;
    for (int k = 0; k < D; k++) {
        xb[k] = tiny[k];
        sa[k] = ldexpf(xa[k], -140);
        sb[k] = ldexpf(xb[k], -140);
    }
    kvs_mc_merge_unit(xa, xb, D, 0.6f, KVS_MC_SLERP, 0, e, &na, &nb, &om);
    merge_check_finite("subnormal", sa, sb, D, 0.6f, KVS_MC_SLERP, es, &nas, &nbs, &oms);
    /* subnormal inputs keep fewer bits: compare with the reference on the scaled inputs */
    double ed[D];
    const double omr = ref_slerp(sa, sb, D, 0.6, ed);
    CHECKF(rel_err(es, ed, D) < 1e-6 && fabs(oms - omr) < 1e-6,
           "T16 subnormal inputs: the reference's direction (err %g)", rel_err(es, ed, D));
    to_double(e, ed, D);
    /* large inputs: squares beyond FLT_MAX */
    for (int k = 0; k < D; k++) {
        sa[k] = ldexpf(xa[k], 100);
        sb[k] = ldexpf(xb[k], 100);
    }
    merge_check_finite("large", sa, sb, D, 0.6f, KVS_MC_SLERP, es, &nas, &nbs, &oms);
    CHECKF(rel_err(es, ed, D) < 1e-6, "T16 large inputs: same direction");
}

/* ---- T8 and §2.6: retention ---- */

static int brute(const float *d, int n, double gamma, int range, int *idx)
{
    double lo = d[0], hi = d[0];
    for (int i = 1; i < n; i++) {
        lo = fmin(lo, d[i]);
        hi = fmax(hi, d[i]);
    }
    int c = 0;
    for (int i = 0; i < n; i++)
        if (range ? d[i] > hi - (hi - lo) * gamma : d[i] < lo + (hi - lo) * gamma)
            idx[c++] = i;
    return c;
}

static int increasing(const int *idx, int c, int n)
{
    for (int i = 0; i < c; i++)
        if (idx[i] < 0 || idx[i] >= n || (i > 0 && idx[i] <= idx[i - 1]))
            return 0;
    return 1;
}

static void test_retain(void)
{
    enum { N = 30 };
    /* three ties at d_min = 0.05, two at d_max = 0.9 */
    float d[N];
    int idx[N], scratch[N], want[N];
    for (int i = 0; i < N; i++)
        d[i] = 0.1f + 0.02f * (float)((i * 7) % N);
    d[3] = d[11] = d[20] = 0.05f;
    d[5] = d[25] = 0.9f;
    CHECK(kvs_mc_retain_select(d, 0, 0.5, KVS_MC_RET_RANGE, idx, scratch) == 0);
    CHECK(kvs_mc_retain_select(d, N, 0.0, KVS_MC_RET_RANGE, idx, scratch) == 0);
    int c = kvs_mc_retain_select(d, N, 1.0, KVS_MC_RET_RANGE, idx, scratch);
    CHECKF(c == N - 3 && increasing(idx, c, N), "T8 RANGE gamma=1: %d, want N - 3", c);
    for (int i = 0; i < c; i++)
        CHECK(d[idx[i]] != 0.05f);
    CHECK(kvs_mc_retain_select(d, N, 0.0, KVS_MC_RET_LITERAL, idx, scratch) == 0);
    c = kvs_mc_retain_select(d, N, 1.0, KVS_MC_RET_LITERAL, idx, scratch);
    CHECKF(c == N - 2 && increasing(idx, c, N), "LITERAL gamma=1: %d, want N - 2", c);
    /* intermediate gammas agree with the printed formulas */
    const double gs[] = {0.05, 0.1, 0.3, 0.5, 0.77, 0.99};
    for (int i = 0; i < 6; i++) {
        for (int range = 0; range < 2; range++) {
            const int wn = brute(d, N, gs[i], range, want);
            c = kvs_mc_retain_select(d, N, gs[i], range ? KVS_MC_RET_RANGE : KVS_MC_RET_LITERAL,
                                     idx, scratch);
            CHECKF(c == wn && memcmp(idx, want, sizeof(int) * c) == 0,
                   "%s gamma=%g: %d retained, want %d", range ? "RANGE" : "LITERAL", gs[i], c, wn);
        }
    }
    /* RANGE at gamma = 0.05: only the two d_max ties (0.9 - 0.0425 = 0.8575; next is 0.68) */
    c = kvs_mc_retain_select(d, N, 0.05, KVS_MC_RET_RANGE, idx, scratch);
    CHECK(c == 2 && idx[0] == 5 && idx[1] == 25);
    /* a d_min far below d_max: d_max - (d_max - d_min) rounds, d_min must still stay merged */
    float far[4] = {1.0f, 1e-30f, 0.5f, 1e-30f};
    c = kvs_mc_retain_select(far, 4, 1.0, KVS_MC_RET_RANGE, idx, scratch);
    CHECKF(c == 2 && idx[0] == 0 && idx[1] == 2, "T8 RANGE gamma=1 with d_min = 1e-30: %d", c);
    /* ... and d_max - d_min rounding down must not drop a token just above d_min */
    float far3[3] = {0.75f, 0x1.4p-54f, 0x1.cp-54f};
    c = kvs_mc_retain_select(far3, 3, 1.0, KVS_MC_RET_RANGE, idx, scratch);
    CHECKF(c == 2 && idx[0] == 0 && idx[1] == 2, "T8 RANGE gamma=1, rounded-down range: %d", c);
    float far2[3] = {1.0f, 0.0f, 1.0f - 0x1p-24f};
    c = kvs_mc_retain_select(far2, 3, 1.0, KVS_MC_RET_LITERAL, idx, scratch);
    CHECKF(c == 2 && idx[0] == 1 && idx[1] == 2, "LITERAL gamma=1 keeps all but d_max: %d", c);

    /* TOPFRAC: ceil(0.1 * 30 - 1e-9) = 3: the two 0.9 ties and the next largest */
    c = kvs_mc_retain_select(d, N, 0.1, KVS_MC_RET_TOPFRAC, idx, scratch);
    CHECKF(c == 3 && increasing(idx, c, N), "T8 TOPFRAC gamma=0.1 N=30: %d, want 3", c);
    /* 0.07 * 100 is 7.000000000000001 in double: the 1e-9 makes it 7, not 8 */
    static float d100[100];
    static int i100[100], s100[100];
    for (int i = 0; i < 100; i++)
        d100[i] = (float)i / 100.0f;
    c = kvs_mc_retain_select(d100, 100, 0.07, KVS_MC_RET_TOPFRAC, i100, s100);
    CHECKF(c == 7 && i100[0] == 93 && i100[6] == 99, "TOPFRAC gamma=0.07 N=100: %d, want 7", c);
    CHECK(kvs_mc_retain_select(d, N, 0.0, KVS_MC_RET_TOPFRAC, idx, scratch) == 0);
    CHECK(kvs_mc_retain_select(d, N, 1.0, KVS_MC_RET_TOPFRAC, idx, scratch) == N);
    CHECK(kvs_mc_retain_select(d, N, 0.05, KVS_MC_RET_TOPFRAC, idx, scratch) == 2);
    CHECK(kvs_mc_retain_select(d, N, 0.034, KVS_MC_RET_TOPFRAC, idx, scratch) == 2);
    /* ties go to the lower index: of three equal values, gamma 2/N keeps the first two */
    float eq[6] = {0.1f, 0.7f, 0.2f, 0.7f, 0.7f, 0.3f};
    c = kvs_mc_retain_select(eq, 6, 2.0 / 6.0, KVS_MC_RET_TOPFRAC, idx, scratch);
    CHECKF(c == 2 && idx[0] == 1 && idx[1] == 3, "TOPFRAC ties: %d [%d %d]", c, idx[0], idx[1]);
    c = kvs_mc_retain_select(eq, 6, 4.0 / 6.0, KVS_MC_RET_TOPFRAC, idx, scratch);
    CHECKF(c == 4 && idx[0] == 1 && idx[1] == 3 && idx[2] == 4 && idx[3] == 5,
           "TOPFRAC gamma=4/6: %d", c);
    /* a larger random set: count ceil(gamma N) and every kept d >= every dropped d */
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 8);
    enum { M = 1000 };
    static float dm[M];
    static int im[M], sm[M];
    for (int i = 0; i < M; i++)
        dm[i] = (float)(kvs_xoshiro_next(&g) % 50) / 50.0f;
    c = kvs_mc_retain_select(dm, M, 0.05, KVS_MC_RET_TOPFRAC, im, sm);
    CHECK(c == 50 && increasing(im, c, M));
    float kept_min = 1.0f;
    static char kept[M];
    for (int i = 0; i < c; i++) {
        kept[im[i]] = 1;
        kept_min = fminf(kept_min, dm[im[i]]);
    }
    int ok = 1;
    for (int i = 0; i < M; i++)
        if (!kept[i] && dm[i] > kept_min)
            ok = 0;
    /* among the tied boundary value, the kept ones are the lowest indices */
    int last_kept_tie = -1, first_dropped_tie = M;
    for (int i = 0; i < M; i++)
        if (dm[i] == kept_min) {
            if (kept[i])
                last_kept_tie = i;
            else if (first_dropped_tie == M)
                first_dropped_tie = i;
        }
    CHECK(ok && last_kept_tie < first_dropped_tie);
    CHECK(kvs_mc_retain_select(dm, M, 0.3, KVS_MC_RET_ALL, im, sm) == M && im[M - 1] == M - 1);
}

/* ---- §3.1 ---- */

static void test_paper_bytes(void)
{
    const double full = kvs_mc_full_f16_bytes(32, 4096, 1000);
    const double mc = kvs_mc_paper_bytes(32, 4096, 1000);
    CHECK(full == 4.0 * 32 * 4096 * 1000);
    CHECK(fabs(mc - 32.0 * 1000 * (3.1 * 4096 + 2)) < 1e-3);
    const double ratio = full / mc, want = 4.0 * 4096 / (3.1 * 4096 + 2);
    CHECKF(fabs(ratio - want) < 1e-12 && fabs(ratio - 1.29) < 0.005, "§3.1 ratio %.9f", ratio);
    /* large token counts do not overflow */
    CHECK(kvs_mc_full_f16_bytes(80, 8192, (int64_t)1 << 33) == 4.0 * 80 * 8192 * 8589934592.0);
}

int main(void)
{
    test_identical_and_scaled();
    test_random_pairs();
    test_endpoints();
    test_rotation();
    test_swap();
    test_mean_fmax();
    test_degenerate();
    test_retain();
    test_paper_bytes();
    return check_summary("minicache_merge");
}
