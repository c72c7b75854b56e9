/* MiniCache's per-unit math (methods/minicache.md §2.4-2.6, §3.1): pure functions, no state.
 *
 * SLERP is Eq. 3 as printed (sin((1-t) Omega)/sin(Omega) on u_a, layer a = l-1), with §2.4's
 * stable angle Omega = 2 atan2(||u_a - u_b||, ||u_a + u_b||) and sin(Omega) taken from the same
 * half-angle, 2 ||d|| ||s|| / (||d||^2 + ||s||^2) (s = u_a + u_b, d = u_a - u_b), which stays
 * accurate next to 0 and pi where sin of a rounded Omega would not.
 *
 * Precision: inputs and e are fp32; everything in between (u_a, u_b, s, d, the reductions, the
 * weights) is double, rounded once when e is stored. Not fp32 throughout: near antiparallel
 * Eq. 3's weights grow as 1/sin(Omega) (about 650 each at pi - 1.5e-3) and nearly cancel, and
 * fp32 unit vectors are unit only to about 1e-8. Measured with fp32 intermediates over §7's
 * range (tests/test_minicache_merge.c): | ||e|| - 1 | up to 1.1e-5 against T3's 1e-6 (and a
 * chord-midpoint rewrite of Eq. 3 in fp32 still missed T5's 1e-5 rad by 6%). In double the
 * worst is 4e-8. Double reductions also keep the accuracy from degrading with D (per-token
 * units are h = 4096 wide), and squares of fp32 values never overflow or underflow. Nothing is
 * threaded and every loop runs in index order: the result is a deterministic function of the
 * inputs.
 *
 * No scratch: e is the only D-sized buffer, so each pass recomputes u_a and u_b from the inputs
 * with the same expressions (hence the same values) instead of storing them.
 *
 * Degenerate inputs (§6 A18), never NaN for finite inputs:
 *  - a layer whose norm is at most MC_EPS_REL times the larger of the two is treated as zero:
 *    e is the other layer's direction and Omega = 0 (the pair is never "distinct" for
 *    retention). Relative rather than absolute so that scaling both inputs by a common factor
 *    never changes the branch: an absolute 1e-12 would call a legitimately small unit zero.
 *    2^-40 (about 1e-12, the spec's figure) is far below fp32's resolution 2^-24, so only a
 *    layer that is zero for practical purposes is caught: its restoration (e times its own
 *    norm) is off by at most 2^-39 of its partner's norm. Both exactly zero: e = 0, Omega = 0.
 *  - sin(Omega) < 1e-6 (§2.4): near parallel, the normalised lerp (the SLERP limit, error
 *    O(Omega^3)); near antiparallel the plane is undefined and e is u_b if t >= 1/2, else u_a.
 * The norms are outputs: they overflow to inf only if the true norm exceeds FLT_MAX. */
#include "minicache_merge.h"

#include <math.h>

#define MC_EPS_REL 0x1p-40
#define MC_SIN_MIN 1e-6

static double norm2(const float *x, int D)
{
    double s = 0.0;
    for (int k = 0; k < D; k++)
        s += (double)x[k] * x[k];
    return s;
}

static void scale_into(float *e, const float *x, double f, int D)
{
    for (int k = 0; k < D; k++)
        e[k] = (float)(x[k] * f);
}

/* Scales e in place to unit norm; a zero vector stays zero. */
static void normalize(float *e, int D)
{
    const double n = sqrt(norm2(e, D));
    if (n > 0.0)
        scale_into(e, e, 1.0 / n, D);
}

/* The pair's geometry, from the inputs' inverse norms. */
typedef struct mc_pair {
    const float *xa, *xb;
    double ia, ib; /* 1 / ||xa||, 1 / ||xb|| */
    double ss, dd; /* ||s||^2, ||d||^2 */
} mc_pair;

/* ||s||^2 and ||d||^2; returns Omega = 2 atan2(||d||, ||s||) (no acos near +-1). */
static double pair_angle(mc_pair *p, int D)
{
    double ss = 0.0, dd = 0.0;
    for (int k = 0; k < D; k++) {
        const double ua = p->xa[k] * p->ia, ub = p->xb[k] * p->ib;
        ss += (ua + ub) * (ua + ub);
        dd += (ub - ua) * (ub - ua);
    }
    p->ss = ss;
    p->dd = dd;
    return 2.0 * atan2(sqrt(dd), sqrt(ss));
}

/* Eq. 3: e = sin((1-t) Omega)/sin(Omega) u_a + sin(t Omega)/sin(Omega) u_b. */
static void slerp_eq3(const mc_pair *p, double t, double omega, double sin_omega, float *e,
                      int D)
{
    const double wa = sin((1.0 - t) * omega) / sin_omega, wb = sin(t * omega) / sin_omega;
    for (int k = 0; k < D; k++)
        e[k] = (float)(wa * (p->xa[k] * p->ia) + wb * (p->xb[k] * p->ib));
}

/* SLERP of the two directions (both norms > 0); returns Omega. */
static double slerp_unit(mc_pair *p, double t, float *e, int D)
{
    const double omega = pair_angle(p, D);
    const double r2 = p->ss + p->dd;
    /* sin(Omega) = 2 sin(Omega/2) cos(Omega/2) = 2 ||d|| ||s|| / r^2, accurate near 0 and pi */
    const double sin_omega = r2 > 0.0 ? 2.0 * sqrt(p->dd) * sqrt(p->ss) / r2 : 0.0;
    if (sin_omega >= MC_SIN_MIN) {
        slerp_eq3(p, t, omega, sin_omega, e, D);
    } else if (omega < M_PI_2) {
        for (int k = 0; k < D; k++)
            e[k] = (float)((1.0 - t) * (p->xa[k] * p->ia) + t * (p->xb[k] * p->ib));
        normalize(e, D);
    } else if (t >= 0.5) {
        scale_into(e, p->xb, p->ib, D);
    } else {
        scale_into(e, p->xa, p->ia, D);
    }
    return omega;
}

/* §2.5's stored vector: the mean, or (F_max) the mean's direction at the larger norm. */
static void merge_stored(const float *xa, const float *xb, int D, kvs_mc_merge fn, double na,
                         double nb, float *e)
{
    for (int k = 0; k < D; k++)
        e[k] = 0.5f * xa[k] + 0.5f * xb[k]; /* (xa + xb) / 2 without overflow */
    if (fn == KVS_MC_FMAX) {
        const double n = sqrt(norm2(e, D));
        /* a zero mean (both zero, or opposite with equal norms) has no direction: e stays 0 */
        if (n > 0.0)
            scale_into(e, e, fmax(na, nb) / n, D);
    }
}

void kvs_mc_merge_unit(const float *xa, const float *xb, int D, float t, kvs_mc_merge fn,
                       int swap, float *e, float *na, float *nb, float *omega)
{
    const double na2 = norm2(xa, D), nb2 = norm2(xb, D);
    const double nad = sqrt(na2), nbd = sqrt(nb2), top = fmax(nad, nbd);
    const int a_zero = nad <= MC_EPS_REL * top, b_zero = nbd <= MC_EPS_REL * top;
    /* A1: Algorithm 2's swapped weights are Eq. 3 at 1 - t. */
    const double tt = swap ? 1.0 - (double)t : (double)t;
    double om = 0.0;
    mc_pair p = {.xa = xa, .xb = xb, .ia = a_zero ? 0.0 : 1.0 / nad,
                 .ib = b_zero ? 0.0 : 1.0 / nbd};

    if (fn == KVS_MC_SLERP) {
        if (a_zero && b_zero) {
            for (int k = 0; k < D; k++)
                e[k] = 0.0f;
        } else if (a_zero) {
            scale_into(e, xb, p.ib, D);
        } else if (b_zero) {
            scale_into(e, xa, p.ia, D);
        } else {
            om = slerp_unit(&p, tt, e, D);
        }
        *na = (float)nad;
        *nb = (float)nbd;
    } else {
        if (!a_zero && !b_zero)
            om = pair_angle(&p, D);
        merge_stored(xa, xb, D, fn, nad, nbd, e);
        *na = *nb = (float)sqrt(norm2(e, D));
    }
    /* fp32's nearest to pi lies above pi: clamp to the float just below, so d = Omega / pi
     * never exceeds 1 however it is divided */
    const float om_max = 0x1.921fb4p+1f;
    *omega = om > om_max ? om_max : (float)om;
}

/* The threshold of RANGE (keep d > thr) or LITERAL (keep d < thr), in double. At gamma = 0 the
 * formulas give exactly d_max (RANGE) and d_min (LITERAL); at gamma = 1 the far end is set
 * exactly, and for gamma in [0, 1] thr is clamped to [d_min, d_max], so rounding of
 * d_max - d_min (exact only when it fits 53 bits) never retains a d_min tie (RANGE, gamma = 1)
 * or a d_max tie (LITERAL). Gamma outside [0, 1] follows the formula. */
static double retain_threshold(double dmin, double dmax, double gamma, kvs_mc_retain mode)
{
    const int in01 = gamma >= 0.0 && gamma <= 1.0;
    double thr;
    if (mode == KVS_MC_RET_RANGE)
        thr = gamma == 1.0 ? dmin : dmax - (dmax - dmin) * gamma;
    else
        thr = gamma == 1.0 ? dmax : dmin + (dmax - dmin) * gamma;
    if (in01)
        thr = thr < dmin ? dmin : thr > dmax ? dmax : thr;
    return thr;
}

/* TOPFRAC's order: a ranks before b if its d is larger, ties to the lower index. */
static inline int ranks_before(const float *d, int a, int b)
{
    /* a < b is the tie-break between two valid indices, not a bounds check (cppcheck). */
    /* cppcheck-suppress arrayIndexThenCheck */
    return d[a] > d[b] || (d[a] == d[b] && a < b);
}

static void sift_down(const float *d, int *h, int root, int n)
{
    for (;;) {
        int child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && ranks_before(d, h[child], h[child + 1]))
            child++;
        if (!ranks_before(d, h[root], h[child]))
            return;
        const int tmp = h[root];
        h[root] = h[child];
        h[child] = tmp;
        root = child;
    }
}

/* Heap sort of 0..n-1 into rank order (scratch[0] ranks first): O(n log n), no allocation. */
static void sort_by_rank(const float *d, int n, int *scratch)
{
    for (int i = 0; i < n; i++)
        scratch[i] = i;
    for (int i = n / 2 - 1; i >= 0; i--)
        sift_down(d, scratch, i, n);
    for (int end = n - 1; end > 0; end--) {
        const int tmp = scratch[0];
        scratch[0] = scratch[end];
        scratch[end] = tmp;
        sift_down(d, scratch, 0, end);
    }
}

int kvs_mc_retain_select(const float *d, int n, double gamma, kvs_mc_retain mode, int *idx,
                         int *scratch)
{
    int count = 0;
    if (n <= 0)
        return 0;
    if (mode == KVS_MC_RET_ALL) {
        for (int i = 0; i < n; i++)
            idx[i] = i;
        return n;
    }
    if (mode == KVS_MC_RET_TOPFRAC) {
        /* the 1e-9 keeps gamma * N that is an integer up to rounding (0.1 * 30) from rounding up */
        const double want = ceil(gamma * n - 1e-9);
        const int k = want <= 0.0 ? 0 : want >= n ? n : (int)want;
        if (k == 0)
            return 0;
        sort_by_rank(d, n, scratch);
        const int last = scratch[k - 1]; /* the k-th ranked: keep it and all ranked before */
        for (int i = 0; i < n; i++)
            if (i == last || ranks_before(d, i, last))
                idx[count++] = i;
        return count;
    }
    double dmin = d[0], dmax = d[0];
    for (int i = 1; i < n; i++) {
        dmin = d[i] < dmin ? d[i] : dmin;
        dmax = d[i] > dmax ? d[i] : dmax;
    }
    const double thr = retain_threshold(dmin, dmax, gamma, mode);
    for (int i = 0; i < n; i++)
        if (mode == KVS_MC_RET_RANGE ? d[i] > thr : d[i] < thr)
            idx[count++] = i;
    return count;
}

double kvs_mc_paper_bytes(int n_layers, int h, int64_t n_tokens)
{
    return (double)n_layers * (double)n_tokens * (3.1 * h + 2.0);
}

double kvs_mc_full_f16_bytes(int n_layers, int h, int64_t n_tokens)
{
    return 4.0 * n_layers * (double)h * (double)n_tokens;
}
