/* MPCache's per-head math (src/policies/mpcache_math.c) against methods/mpcache.md §2.2-2.5, §7.
 *
 * The references below are independent fp64 code written from the spec (softmax without the max
 * shift, top-k by repeated argmax, boxes and scores from their definitions, selection from the
 * §2.3.4 count formulas). Random draws come from a fixed-seed xoshiro256** (core/random.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "policies/mpcache_math.h"

#define PMAX 128
#define DMAX 32
#define GMAX 4

static kvs_xoshiro rng;

static double urand(void)
{
    return 2.0 * kvs_random_unit(kvs_xoshiro_next(&rng)) - 1.0;
}

static void rand_f(float *x, int n, double scale)
{
    for (int i = 0; i < n; i++)
        x[i] = (float)(scale * urand());
}

/* ---- references ---- */

/* ceil(ratio n) clamped to [1, n], with a tolerance for inexact ratios. */
static int ref_count(double ratio, int n)
{
    int c = (int)ceil(ratio * n - 1e-9);
    return c < 1 ? 1 : c > n ? n : c;
}

/* Top k of s[0..n) by repeated argmax (strict >, so ties go to the lower index), ascending. */
static void ref_topk(const double *s, int n, int k, int *out)
{
    char taken[PMAX * 4] = {0};
    for (int a = 0; a < k; a++) {
        int best = -1;
        for (int j = 0; j < n; j++)
            if (!taken[j] && (best < 0 || s[j] > s[best]))
                best = j;
        taken[best] = 1;
    }
    int m = 0;
    for (int j = 0; j < n; j++)
        if (taken[j])
            out[m++] = j;
}

/* Static scores: causal softmax rows of the window, exp(l) / sum exp(l), summed over heads. */
static void ref_static(const float *q, int G, int w, const float *k, int P, int d, double *sc)
{
    for (int j = 0; j < P; j++)
        sc[j] = 0.0;
    for (int h = 0; h < G; h++)
        for (int r = 0; r < w; r++) {
            const int p = P - w + r;
            double e[PMAX], z = 0.0;
            for (int j = 0; j <= p; j++) {
                double t = 0.0;
                for (int i = 0; i < d; i++)
                    t += (double)q[(h * w + r) * d + i] * k[j * d + i];
                e[j] = exp(t / sqrt((double)d));
                z += e[j];
            }
            for (int j = 0; j <= p; j++)
                sc[j] += e[j] / z;
        }
}

static double dot_qk(const float *q, int G, int d, const float *kj)
{
    double t = 0.0;
    for (int h = 0; h < G; h++)
        for (int i = 0; i < d; i++)
            t += (double)q[h * d + i] * kj[i];
    return t;
}

/* Reference selection: writes the chosen fine clusters (ascending) and returns n2. */
static int ref_select(const double *sc1, const double *sc2, int n, int s1, int s2, double rho1,
                      double eta, int *fine)
{
    const int r = s1 / s2, C1 = (n + s1 - 1) / s1, C2 = (n + s2 - 1) / s2;
    const int n1 = ref_count(rho1, C1);
    int sel1[PMAX], cand[PMAX], nc = 0, pick[PMAX];
    double cs[PMAX];
    ref_topk(sc1, C1, n1, sel1);
    for (int a = 0; a < n1; a++)
        for (int f = sel1[a] * r; f < sel1[a] * r + r && f < C2; f++) {
            cand[nc] = f;
            cs[nc++] = sc2[f];
        }
    int n2 = ref_count(eta, C2);
    if (n2 > nc)
        n2 = nc;
    ref_topk(cs, nc, n2, pick);
    for (int a = 0; a < n2; a++)
        fine[a] = cand[pick[a]];
    return n2;
}

/* ---- tests ---- */

/* Guards the count rounding (ceil with tolerance, clamp to [1, n]) and the reference's example. */
static void test_counts(void)
{
    CHECK(kvs_mp_ceil_count(0.2, 384) == 77);
    CHECK(kvs_mp_ceil_count(0.25, 384) == 96);
    CHECK(kvs_mp_ceil_count(0.7, 10) == 7);
    CHECK(kvs_mp_ceil_count(0.5, 3) == 2);
    CHECK(kvs_mp_ceil_count(0.001, 5) == 1);
    CHECK(kvs_mp_ceil_count(1.0, 5) == 5);
    CHECK(kvs_mp_n_clusters(96, 32) == 3 && kvs_mp_n_clusters(96, 16) == 6);
    CHECK(kvs_mp_n_clusters(3, 16) == 1 && kvs_mp_n_clusters(37, 16) == 3);
    CHECK(kvs_mp_default_rho1(0.4) == 0.5 && kvs_mp_default_rho1(0.5) == 1.0);
}

/* Guards the static scores against the fp64 causal softmax, their sum w G, and non-negativity. */
static void test_static_scores(void)
{
    static const int cfg[][4] = {{1, 20, 8, 4}, {2, 37, 16, 8}, {4, 5, 4, 5}, {1, 1, 4, 1},
                                 {3, 100, 32, 20}};
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        const int G = cfg[t][0], P = cfg[t][1], d = cfg[t][2], w = cfg[t][3];
        float q[GMAX * PMAX * DMAX], k[PMAX * DMAX];
        double sc[PMAX], ref[PMAX];
        rand_f(q, G * w * d, 2.0);
        rand_f(k, P * d, 2.0);
        CHECK(kvs_mp_static_scores(q, G, w, k, P, d, sc, NULL) == KVS_OK);
        ref_static(q, G, w, k, P, d, ref);
        double err = 0.0, sum = 0.0, mn = 1.0;
        for (int j = 0; j < P; j++) {
            err = fmax(err, fabs(sc[j] - ref[j]));
            sum += sc[j];
            mn = fmin(mn, sc[j]);
        }
        CHECKF(err < 1e-12, "G %d P %d: max err %g", G, P, err);
        CHECKF(fabs(sum - w * G) < 1e-9 * w * G, "sum %g vs %d", sum, w * G);
        CHECK(mn >= 0.0);
        /* causal: the last key gets mass only from the last row of each head */
        double last = 0.0;
        for (int h = 0; h < G; h++) {
            double z = 0.0, e = 0.0;
            for (int j = 0; j < P; j++) {
                double l = 0.0;
                for (int i = 0; i < d; i++)
                    l += (double)q[(h * w + w - 1) * d + i] * k[j * d + i];
                z += exp(l / sqrt((double)d));
                if (j == P - 1)
                    e = exp(l / sqrt((double)d));
            }
            last += e / z;
        }
        CHECKF(fabs(sc[P - 1] - last) < 1e-12, "last key %g vs %g", sc[P - 1], last);
    }
}

/* Guards the static keep set: count ceil(keep P), distinct ascending in [0, P), equal to the
 * reference top-k, and ties to the lower position. */
static void test_static_keep(void)
{
    static const int cfg[][3] = {{1, 20, 8}, {2, 37, 16}, {4, 5, 4}, {1, 1, 4}, {2, 128, 8}};
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        const int G = cfg[t][0], P = cfg[t][1], d = cfg[t][2];
        const int w = ref_count(0.2, P), nk = ref_count(0.25, P);
        float q[GMAX * PMAX * DMAX], k[PMAX * DMAX];
        double ref[PMAX];
        int keep[PMAX], rk[PMAX], n = -1;
        rand_f(q, G * w * d, 2.0);
        rand_f(k, P * d, 2.0);
        CHECK(kvs_mp_static_keep(q, G, k, P, d, 0.2, 0.25, keep, &n, NULL) == KVS_OK);
        CHECKF(n == nk, "P %d: kept %d, want %d", P, n, nk);
        ref_static(q, G, w, k, P, d, ref);
        ref_topk(ref, P, nk, rk);
        CHECK(n == nk && memcmp(keep, rk, (size_t)nk * sizeof *rk) == 0);
        int ok = 1;
        for (int a = 0; a < n; a++)
            ok &= keep[a] >= 0 && keep[a] < P && (a == 0 || keep[a] > keep[a - 1]);
        CHECK(ok);
    }
    /* zero keys: every row is uniform, so positions 0..P-w tie exactly; the lowest must win */
    {
        const int P = 20, d = 4, w = 4, G = 2;
        float q[GMAX * 4 * 4], k[20 * 4] = {0};
        int keep[20], n = 0;
        rand_f(q, G * w * d, 1.0);
        CHECK(kvs_mp_static_keep(q, G, k, P, d, 0.2, 0.25, keep, &n, NULL) == KVS_OK);
        CHECK(n == 5 && keep[0] == 0 && keep[1] == 1 && keep[2] == 2 && keep[3] == 3 &&
              keep[4] == 4);
    }
    /* a key much more aligned with the window queries must be kept */
    {
        const int P = 40, d = 8, G = 1, w = ref_count(0.2, P);
        float q[8 * 8], k[40 * 8];
        int keep[40], n = 0, found = 0;
        rand_f(k, P * d, 0.1);
        for (int r = 0; r < w; r++)
            for (int i = 0; i < d; i++)
                q[r * d + i] = 1.0f;
        for (int i = 0; i < d; i++)
            k[17 * d + i] = 3.0f;
        CHECK(kvs_mp_static_keep(q, G, k, P, d, 0.2, 0.1, keep, &n, NULL) == KVS_OK);
        for (int a = 0; a < n; a++)
            found |= keep[a] == 17;
        CHECK(n == 4 && found);
    }
}

/* Guards the boxes: exact min/max of each (possibly short) cluster, members inside, coarse from
 * fine equal to coarse from keys (§7 items 6, 8). */
static void test_bounds(void)
{
    static const int ns[] = {1, 3, 16, 37, 64, 96};
    static const int s2s[] = {1, 4, 16};
    static const int rs[] = {1, 2, 4};
    const int d = 5;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof s2s / sizeof s2s[0]; b++)
            for (size_t c = 0; c < sizeof rs / sizeof rs[0]; c++) {
                const int n = ns[a], s2 = s2s[b], r = rs[c], s1 = s2 * r;
                const int C2 = (n + s2 - 1) / s2, C1 = (n + s1 - 1) / s1;
                float k[PMAX * 5], mn2[PMAX * 5], mx2[PMAX * 5], mn1[PMAX * 5], mx1[PMAX * 5];
                float dn1[PMAX * 5], dx1[PMAX * 5];
                rand_f(k, n * d, 3.0);
                kvs_mp_cluster_bounds(k, n, d, s2, mn2, mx2);
                int exact = 1, inside = 1, covered = 0;
                for (int cl = 0; cl < C2; cl++)
                    for (int i = 0; i < d; i++) {
                        float lo = INFINITY, hi = -INFINITY;
                        for (int j = cl * s2; j < cl * s2 + s2 && j < n; j++) {
                            lo = fminf(lo, k[j * d + i]);
                            hi = fmaxf(hi, k[j * d + i]);
                            inside &= mn2[cl * d + i] <= k[j * d + i] &&
                                      k[j * d + i] <= mx2[cl * d + i];
                            covered += i == 0;
                        }
                        exact &= lo == mn2[cl * d + i] && hi == mx2[cl * d + i];
                    }
                CHECKF(exact && inside && covered == n, "n %d s2 %d", n, s2);
                kvs_mp_coarse_bounds(mn2, mx2, C2, d, r, mn1, mx1);
                kvs_mp_cluster_bounds(k, n, d, s1, dn1, dx1);
                CHECKF(memcmp(mn1, dn1, (size_t)C1 * d * sizeof(float)) == 0 &&
                           memcmp(mx1, dx1, (size_t)C1 * d * sizeof(float)) == 0,
                       "coarse n %d s1 %d", n, s1);
            }
}

/* Guards each similarity mode against its fp64 definition (summed over the group's heads), the
 * bound chain UB >= MAXDOT >= every member's dot, alpha = 1 / 0 identities, and s = 1 collapse
 * (§7 items 6, 7). */
static void test_scores(void)
{
    static const int cfg[][3] = {{1, 37, 16}, {2, 64, 16}, {3, 5, 8}, {4, 40, 4}, {2, 9, 1}};
    const int d = 16;
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++) {
        const int G = cfg[t][0], n = cfg[t][1], s = cfg[t][2], C = (n + s - 1) / s;
        float q[GMAX * 16], k[PMAX * 16], mn[PMAX * 16], mx[PMAX * 16];
        double lin[PMAX], mean[PMAX], md[PMAX], ub[PMAX], a1[PMAX], a0[PMAX];
        rand_f(q, G * d, 1.0);
        rand_f(k, n * d, 2.0);
        kvs_mp_cluster_bounds(k, n, d, s, mn, mx);
        kvs_mp_cluster_scores(KVS_MP_SIM_LINEAR, q, G, d, NULL, n, s, mn, mx, 0.6, lin, NULL);
        kvs_mp_cluster_scores(KVS_MP_SIM_LINEAR, q, G, d, NULL, n, s, mn, mx, 1.0, a1, NULL);
        kvs_mp_cluster_scores(KVS_MP_SIM_LINEAR, q, G, d, NULL, n, s, mn, mx, 0.0, a0, NULL);
        kvs_mp_cluster_scores(KVS_MP_SIM_MEAN, q, G, d, k, n, s, NULL, NULL, 0.6, mean, NULL);
        kvs_mp_cluster_scores(KVS_MP_SIM_MAXDOT, q, G, d, k, n, s, NULL, NULL, 0.6, md, NULL);
        kvs_mp_cluster_scores(KVS_MP_SIM_UB, q, G, d, NULL, n, s, mn, mx, 0.6, ub, NULL);
        double e_lin = 0, e_a1 = 0, e_a0 = 0, e_mean = 0, e_md = 0, e_ub = 0;
        int chain = 1;
        for (int c = 0; c < C; c++) {
            const int b = c * s, e = b + s < n ? b + s : n;
            double rl = 0, rmx = 0, rmn = 0, rub = 0, rmean = 0, rmd = -INFINITY;
            for (int h = 0; h < G; h++) /* unreordered Eq. 2, per head then summed */
                for (int i = 0; i < d; i++) {
                    const double qi = q[h * d + i];
                    rl += 0.6 * qi * mx[c * d + i] + 0.4 * qi * mn[c * d + i];
                    rmx += qi * mx[c * d + i];
                    rmn += qi * mn[c * d + i];
                }
            for (int i = 0; i < d; i++) {
                double qs = 0, m = 0;
                for (int h = 0; h < G; h++)
                    qs += q[h * d + i];
                rub += fmax(qs * mn[c * d + i], qs * mx[c * d + i]);
                for (int j = b; j < e; j++)
                    m += k[j * d + i];
                rmean += qs * m / (e - b);
            }
            for (int j = b; j < e; j++) {
                const double dj = dot_qk(q, G, d, k + j * d);
                rmd = fmax(rmd, dj);
                chain &= md[c] >= dj - 1e-12;
            }
            chain &= ub[c] >= md[c] - 1e-12;
            e_lin = fmax(e_lin, fabs(lin[c] - rl));
            e_a1 = fmax(e_a1, fabs(a1[c] - rmx));
            e_a0 = fmax(e_a0, fabs(a0[c] - rmn));
            e_mean = fmax(e_mean, fabs(mean[c] - rmean));
            e_md = fmax(e_md, fabs(md[c] - rmd));
            e_ub = fmax(e_ub, fabs(ub[c] - rub));
        }
        CHECKF(e_lin < 1e-12 && e_a1 < 1e-12 && e_a0 < 1e-12, "G %d: linear err %g %g %g", G,
               e_lin, e_a1, e_a0);
        CHECKF(e_mean < 1e-12 && e_md < 1e-12 && e_ub < 1e-12, "G %d: err %g %g %g", G, e_mean,
               e_md, e_ub);
        CHECKF(chain, "G %d n %d s %d: UB >= MAXDOT >= dot violated", G, n, s);
        if (s == 1) { /* one key per cluster: every mode is q . k */
            double e1 = 0;
            for (int c = 0; c < C; c++) {
                const double dj = dot_qk(q, G, d, k + c * d);
                e1 = fmax(e1, fmax(fmax(fabs(lin[c] - dj), fabs(ub[c] - dj)),
                                   fmax(fabs(md[c] - dj), fabs(mean[c] - dj))));
            }
            CHECKF(e1 < 1e-12, "s = 1: err %g", e1);
        }
    }
}

/* Checks one selection against the reference and the structural invariants (§7 item 4). */
static void check_select(const double *sc1, const double *sc2, int n, int s1, int s2,
                         double rho1, double eta)
{
    int fine[PMAX], slots[PMAX * 4], nf = -1, ns = -1, rf[PMAX];
    CHECK(kvs_mp_select(sc1, sc2, n, s1, s2, rho1, eta, 0, fine, &nf, slots, &ns, NULL) ==
          KVS_OK);
    const int rn = ref_select(sc1, sc2, n, s1, s2, rho1, eta, rf);
    CHECKF(nf == rn && memcmp(fine, rf, (size_t)rn * sizeof *rf) == 0,
           "n %d s1 %d s2 %d rho1 %g eta %g: n2 %d vs %d", n, s1, s2, rho1, eta, nf, rn);
    int ok = 1, want = 0;
    for (int a = 0; a < rn; a++)
        want += (rf[a] + 1) * s2 < n ? s2 : n - rf[a] * s2;
    for (int a = 0; a < ns; a++)
        ok &= slots[a] >= 0 && slots[a] < n && (a == 0 || slots[a] > slots[a - 1]);
    CHECK(ok && ns == want);
}

/* Guards hierarchical selection: counts n1/n2, reference equality, ties, rho1 = 1 == flat, the
 * paper-config example, short clusters and N < s2 (§2.3.4, §7 items 4, 12). */
static void test_select(void)
{
    static const int cfg[][3] = {{96, 32, 16}, {77, 32, 16}, {37, 8, 4}, {3, 8, 4},
                                 {64, 16, 16}, {100, 8, 2}, {1, 4, 4}};
    static const double ratios[][2] = {{0.5, 0.4}, {0.5, 0.2}, {1.0, 0.5}, {0.3, 0.01},
                                       {1.0, 1.0}, {0.7, 0.28}};
    double sc1[PMAX], sc2[PMAX];
    for (size_t t = 0; t < sizeof cfg / sizeof cfg[0]; t++)
        for (size_t u = 0; u < sizeof ratios / sizeof ratios[0]; u++)
            for (int rep = 0; rep < 5; rep++) {
                const int n = cfg[t][0], s1 = cfg[t][1], s2 = cfg[t][2];
                for (int c = 0; c < PMAX; c++) {
                    sc1[c] = urand();
                    sc2[c] = rep == 4 ? 0.0 : urand(); /* rep 4: all fine scores tie */
                }
                check_select(sc1, sc2, n, s1, s2, ratios[u][0], ratios[u][1]);
            }
    /* the reference's example: N = 96, s32/s16, rho1 0.5, eta 0.4 -> 3 fine of 6, 48 slots */
    {
        int fine[8], slots[96], nf, ns;
        for (int c = 0; c < 6; c++)
            sc2[c] = urand();
        CHECK(kvs_mp_select(sc1, sc2, 96, 32, 16, 0.5, 0.4, 0, fine, &nf, slots, &ns, NULL) ==
                  KVS_OK &&
              nf == 3 && ns == 48);
    }
    /* all scores tie: the lowest coarse clusters, then their lowest children */
    {
        double z[16] = {0};
        int fine[16], slots[128], nf, ns;
        CHECK(kvs_mp_select(z, z, 128, 32, 16, 0.5, 0.4, 0, fine, &nf, slots, &ns, NULL) ==
              KVS_OK);
        CHECK(nf == 4 && fine[0] == 0 && fine[1] == 1 && fine[2] == 2 && fine[3] == 3 &&
              ns == 64 && slots[63] == 63);
    }
    /* hierarchy off (rho1 = 1) equals flat top-n2 over all fine clusters */
    for (int rep = 0; rep < 10; rep++) {
        const int n = 77, C2 = 10, n2 = ref_count(0.35, C2);
        int fine[16], slots[128], nf, ns, flat[16];
        for (int c = 0; c < PMAX; c++) {
            sc1[c] = urand();
            sc2[c] = urand();
        }
        CHECK(kvs_mp_select(sc1, sc2, n, 32, 8, 1.0, 0.35, 0, fine, &nf, slots, &ns, NULL) ==
              KVS_OK);
        ref_topk(sc2, C2, n2, flat);
        CHECK(nf == n2 && memcmp(fine, flat, (size_t)n2 * sizeof *flat) == 0);
    }
    /* full budget: clusters cover every slot exactly once */
    {
        int fine[32], slots[128], nf, ns, ok = 1;
        CHECK(kvs_mp_select(sc1, sc2, 37, 8, 4, 1.0, 1.0, 0, fine, &nf, slots, &ns, NULL) ==
              KVS_OK);
        for (int a = 0; a < ns; a++)
            ok &= slots[a] == a;
        CHECK(nf == 10 && ns == 37 && ok);
    }
}

/* Guards the data-independent option: with padding the attended count is n2 s2 for every draw
 * even when N is not a multiple of s1, dummies are >= N, and a real cluster beats a dummy. */
static void test_select_pad(void)
{
    double sc1[PMAX], sc2[PMAX];
    int count0 = -1, constant = 1, ok = 1;
    for (int rep = 0; rep < 40; rep++) {
        const int n = 77, s1 = 32, s2 = 16; /* C1 = 3 (last has 13 slots), C2 = 5 */
        int fine[16], slots[128], nf, ns;
        for (int c = 0; c < PMAX; c++) {
            sc1[c] = urand();
            sc2[c] = urand();
        }
        CHECK(kvs_mp_select(sc1, sc2, n, s1, s2, 0.5, 0.4, 1, fine, &nf, slots, &ns, NULL) ==
              KVS_OK);
        constant &= nf == 2 && ns == 32; /* n2 = ceil(0.4 * 5) = 2 */
        if (count0 < 0)
            count0 = ns;
        constant &= ns == count0;
        for (int a = 0; a < ns; a++)
            ok &= slots[a] >= 0 && slots[a] < 3 * s1 && (a == 0 || slots[a] > slots[a - 1]);
        for (int a = 0; a < nf; a++)
            ok &= fine[a] != 5; /* fine 5 (slots 80..95) is wholly dummy; 3 real ones compete */
    }
    CHECK(constant && ok);
    /* one coarse cluster whose second child is wholly dummy: n2 = 1 must pick the real child
     * even at a score of -inf (tie to the lower index); its 4 slots include the dummy slot 3 */
    {
        int fine[4], slots[16], nf, ns;
        double a[1] = {0.0}, b[2] = {-INFINITY, 0.0}; /* b[1]: only read when n = 5 */
        CHECK(kvs_mp_select(a, b, 3, 8, 4, 1.0, 1.0, 1, fine, &nf, slots, &ns, NULL) == KVS_OK);
        CHECK(nf == 1 && fine[0] == 0 && ns == 4 && slots[0] == 0 && slots[3] == 3);
        CHECK(kvs_mp_select(a, b, 5, 8, 4, 1.0, 1.0, 1, fine, &nf, slots, &ns, NULL) == KVS_OK);
        CHECK(nf == 2 && ns == 8 && slots[7] == 7); /* slots 5..7 are dummies */
    }
}

/* Guards §3.5 / §7 item 14: LINEAR has no max ops and half of UB's multiplications; a sharing
 * layer does no selection work but attends the same k. */
static void test_ops(void)
{
    kvs_mp_ops lin, ub, sh;
    kvs_mp_op_counts(KVS_MP_SIM_LINEAR, 1, 12, 12, 5, 80, 3, 64, 32, 16, &lin);
    kvs_mp_op_counts(KVS_MP_SIM_UB, 1, 12, 12, 5, 80, 3, 64, 32, 16, &ub);
    kvs_mp_op_counts(KVS_MP_SIM_LINEAR, 0, 12, 12, 5, 80, 3, 64, 32, 16, &sh);
    CHECK(lin.sim_max_ops == 0 && lin.sim_mults == 24 * 64 && 2 * lin.sim_mults == ub.sim_mults);
    CHECK(ub.sim_max_ops == 24 * 64 && lin.gather_eq == 60 && lin.topk_len1 == 12);
    CHECK(lin.softmax_len == 83 && lin.attn_mults == 2 * 83 * 64);
    CHECK(sh.sim_mults == 0 && sh.topk_len1 == 0 && sh.gather_eq == 0 && sh.softmax_len == 83);
}

/* Guards argument checking: refused calls report KVS_ERR_ARG and a message. */
static void test_errors(void)
{
    kvs_error err;
    double s[4] = {0};
    int idx[4], nf, ns;
    float q[4] = {0}, k[4] = {0};
    CHECK(kvs_mp_topk_asc(s, 3, 4, idx, &err) == KVS_ERR_ARG && err.code == KVS_ERR_ARG);
    CHECK(kvs_mp_static_scores(q, 1, 3, k, 2, 2, s, &err) == KVS_ERR_ARG);
    CHECK(kvs_mp_select(s, s, 8, 6, 4, 0.5, 0.5, 0, idx, &nf, idx, &ns, &err) == KVS_ERR_ARG);
    CHECK(kvs_mp_select(s, s, 8, 8, 4, 0.0, 0.5, 0, idx, &nf, idx, &ns, NULL) == KVS_ERR_ARG);
    CHECK(kvs_mp_topk_asc(s, 0, 0, NULL, NULL) == KVS_OK);
}

int main(void)
{
    kvs_xoshiro_seed(&rng, 20260);
    test_counts();
    test_static_scores();
    test_static_keep();
    test_bounds();
    test_scores();
    test_select();
    test_select_pad();
    test_ops();
    test_errors();
    return check_summary("mpcache_math");
}
