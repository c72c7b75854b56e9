/* HashEvict (src/policies/hashevict.c), against methods/hashevict.md section 7; numbers in the
 * comments (T1..T21) are that section's tests.
 *
 * Pure pieces first (hashing, Hamming distance, the victim rule, the projection's distribution,
 * SimHash's collision probability), then the policy on the reference model through the public
 * API: an observer recomputes, after every hook, the budget, the protected positions, the
 * physical slot table and its codes, and the victim by brute force, and records an eviction
 * trace. Prompt = the first 384 tokens of the golden sample; tokens after it are decoded one at a
 * time, teacher-forced. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_store.h"
#include "fixture.h"
#include "policy_check.h"
#include "core/kernels.h"
#include "core/threadpool.h"
#include "engine/session_internal.h"
#include "kv/attention.h"
#include "kv/kv.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "kvslim.h"
#include "policies/hashevict.h"

enum { N_TOK = 512, PROMPT = 384, MAX_L = 8, MAX_H = 8, MAX_G = 4, MAX_HD = 64, MAX_NW = 8 };
enum { DEC = 24 }; /* decoded tokens after the prompt in most runs */

/* ---- a test-local generator (independent of the policy's) ---- */
static uint64_t rng_state = 0x5eed;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double u01(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static int below(int n) { return (int)(rnd() % (uint64_t)n); }
static void gauss_vec(float *x, int n)
{
    for (int i = 0; i < n; i++)
        x[i] = (float)(sqrt(-2.0 * log(1.0 - u01())) * cos(2.0 * M_PI * u01()));
}

/* Bit-by-bit Hamming distance (the oracle never uses popcount). */
static int slow_hamming(const uint64_t *a, const uint64_t *b, int bits)
{
    int d = 0;
    for (int i = 0; i < bits; i++)
        d += (int)((a[i >> 6] >> (i & 63)) & 1) != (int)((b[i >> 6] >> (i & 63)) & 1);
    return d;
}

static uint64_t pad_mask(int bits, int w)
{
    const int used = bits - 64 * w;
    return used >= 64 ? ~0ULL : used <= 0 ? 0 : (1ULL << used) - 1;
}

/* ---- T1 distance basics ---- */
static void test_hamming_basics(void)
{
    int ok = 1;
    for (int trial = 0; trial < 2000; trial++) {
        const int nw = 1 + below(MAX_NW);
        uint64_t a[MAX_NW], b[MAX_NW], c[MAX_NW];
        for (int w = 0; w < nw; w++)
            a[w] = rnd(), b[w] = rnd(), c[w] = trial % 3 ? rnd() : a[w] ^ (1ULL << below(64));
        const int ab = kvs_he_hamming(a, b, nw), ba = kvs_he_hamming(b, a, nw),
                  ac = kvs_he_hamming(a, c, nw), bc = kvs_he_hamming(b, c, nw);
        ok &= kvs_he_hamming(a, a, nw) == 0 && ab == ba && ab >= 0 && ab <= 64 * nw;
        ok &= ab == slow_hamming(a, b, 64 * nw);
        ok &= ac <= ab + bc && ab <= ac + bc && bc <= ab + ac; /* triangle inequality */
    }
    CHECKF(ok, "T1: Hamming distance: identity, symmetry, range, triangle inequality");
}

/* ---- T2 bit semantics against a double-precision loop ---- */
static void test_bit_semantics(void)
{
    static const int bits_list[] = {1, 5, 16, 63, 64, 65, 100, 128, 512};
    static const int dims[] = {8, 64, 128};
    float *R = malloc(sizeof(float) * 512 * 128), x[128];
    long checked = 0, skipped = 0, wrong = 0, pad = 0;
    for (size_t bi = 0; bi < sizeof bits_list / sizeof *bits_list; bi++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
            const int bits = bits_list[bi], d = dims[di], nw = kvs_he_words(bits);
            kvs_he_projection(17 + bi, (int)di, bits, d, R);
            for (int trial = 0; trial < 40; trial++) {
                gauss_vec(x, d);
                const float scale = trial % 4 == 0 ? 1e3f : trial % 4 == 1 ? 1e-3f : 1.0f;
                for (int j = 0; j < d; j++)
                    x[j] *= scale;
                uint64_t code[MAX_NW];
                memset(code, 0xa5, sizeof code);
                kvs_he_hash(R, bits, d, x, code);
                for (int i = 0; i < bits; i++) {
                    double s = 0, a = 0;
                    for (int j = 0; j < d; j++) {
                        s += (double)R[(size_t)i * d + j] * x[j];
                        a += fabs((double)R[(size_t)i * d + j] * x[j]);
                    }
                    if (fabs(s) < 1e-5 * a) {
                        skipped++;
                        continue;
                    }
                    checked++;
                    wrong += (int)((code[i >> 6] >> (i & 63)) & 1) != (s >= 0);
                }
                for (int w = 0; w < nw; w++)
                    pad += (code[w] & ~pad_mask(bits, w)) != 0;
            }
        }
    printf("T2 bit semantics: %ld bits checked, %ld within rounding of 0 skipped\n", checked,
           skipped);
    CHECKF(wrong == 0, "T2: %ld of %ld bits differ from (R x)_i >= 0 in double", wrong, checked);
    CHECKF(pad == 0, "T2: %ld codes with unused padding bits set", pad);
    free(R);
}

/* ---- T3 scale, sign and zero ---- */
static void test_scale_sign(void)
{
    static const int bits_list[] = {16, 64, 100};
    static const float alphas[] = {1e-3f, 0.5f, 7.0f, 1e3f};
    float R[100 * 64], x[64], y[64];
    int ok_scale = 1, ok_neg = 1, ok_zero = 1;
    for (size_t bi = 0; bi < 3; bi++)
        for (int d = 8; d <= 64; d *= 8) {
            const int bits = bits_list[bi], nw = kvs_he_words(bits);
            kvs_he_projection(99, (int)bi, bits, d, R);
            for (int trial = 0; trial < 50; trial++) {
                uint64_t h[MAX_NW], hs[MAX_NW];
                gauss_vec(x, d);
                kvs_he_hash(R, bits, d, x, h);
                for (int a = 0; a < 4; a++) {
                    for (int j = 0; j < d; j++)
                        y[j] = alphas[a] * x[j];
                    kvs_he_hash(R, bits, d, y, hs);
                    ok_scale &= !memcmp(h, hs, sizeof(uint64_t) * nw);
                }
                for (int j = 0; j < d; j++)
                    y[j] = -x[j];
                kvs_he_hash(R, bits, d, y, hs);
                for (int w = 0; w < nw; w++)
                    ok_neg &= hs[w] == (~h[w] & pad_mask(bits, w));
                ok_neg &= kvs_he_hamming(h, hs, nw) == bits;
            }
            memset(x, 0, sizeof x);
            uint64_t z[MAX_NW];
            kvs_he_hash(R, bits, d, x, z);
            for (int w = 0; w < nw; w++)
                ok_zero &= z[w] == pad_mask(bits, w);
        }
    CHECKF(ok_scale, "T3: h(a x) == h(x) for a in {1e-3, 0.5, 7, 1e3}");
    CHECKF(ok_neg, "T3: h(-x) == ~h(x) on the used bits, distance b");
    CHECKF(ok_zero, "T3: h(0) is all ones");
}

/* ---- T4 collision probability: E[d_H]/b = theta/pi ---- */
static void test_collision(void)
{
    enum { T = 3000, B = 16 };
    const double thetas[] = {0, M_PI / 4, M_PI / 2, 3 * M_PI / 4, M_PI};
    for (int d = 8; d <= 64; d *= 8)
        for (int ti = 0; ti < 5; ti++) {
            const double th = thetas[ti];
            float R[B * 64], x[64], u[64], y[64];
            long sum = 0;
            for (int pair = 0; pair < T; pair++) {
                /* A fresh projection per pair: seeds 0..T-1, layer = angle index. */
                kvs_he_projection((uint64_t)pair + 100000u * (unsigned)d, ti, B, d, R);
                gauss_vec(x, d);
                gauss_vec(u, d);
                double xx = 0, xu = 0, uu = 0;
                for (int j = 0; j < d; j++)
                    xx += (double)x[j] * x[j];
                for (int j = 0; j < d; j++)
                    x[j] = (float)(x[j] / sqrt(xx));
                for (int j = 0; j < d; j++)
                    xu += (double)x[j] * u[j];
                for (int j = 0; j < d; j++)
                    u[j] = (float)(u[j] - xu * x[j]);
                for (int j = 0; j < d; j++)
                    uu += (double)u[j] * u[j];
                for (int j = 0; j < d; j++) {
                    u[j] = (float)(u[j] / sqrt(uu));
                    /* The endpoints are built directly: sin(pi) is not 0 in floating point. */
                    y[j] = ti == 0 ? x[j] : ti == 4 ? -x[j]
                                           : (float)(cos(th) * x[j] + sin(th) * u[j]);
                }
                uint64_t hx, hy;
                kvs_he_hash(R, B, d, x, &hx);
                kvs_he_hash(R, B, d, y, &hy);
                sum += kvs_he_hamming(&hx, &hy, 1);
            }
            const double p = th / M_PI, mean = (double)sum / ((double)T * B);
            const double sigma = sqrt(p * (1 - p) / ((double)T * B));
            printf("T4 collision: d=%d theta=%.4f: mean d_H/b %.4f, theta/pi %.4f, 5 sigma %.4f\n",
                   d, th, mean, p, 5 * sigma);
            if (ti == 0)
                CHECKF(sum == 0, "T4: theta=0 gives distance 0 (got %ld)", sum);
            else if (ti == 4)
                CHECKF(sum == (long)T * B, "T4: theta=pi gives distance b (got %ld)", sum);
            else
                CHECKF(fabs(mean - p) <= 5 * sigma, "T4: d=%d theta/pi=%.2f: %.4f vs %.4f +- %.4f",
                       d, p, mean, p, 5 * sigma);
        }
}

/* ---- T5 distribution of R ---- */
static void test_projection_distribution(void)
{
    enum { BITS = 512, D = 128, LAYERS = 16 };
    const size_t per = (size_t)BITS * D, n = per * LAYERS; /* 1,048,576 draws */
    float *R = malloc(sizeof(float) * n), *R2 = malloc(sizeof(float) * per);
    for (int l = 0; l < LAYERS; l++)
        kvs_he_projection(3, l, BITS, D, R + (size_t)l * per);
    double m = 0, v = 0;
    long tail = 0;
    for (size_t i = 0; i < n; i++)
        m += R[i];
    m /= (double)n;
    for (size_t i = 0; i < n; i++) {
        v += (R[i] - m) * (R[i] - m);
        tail += fabs(R[i]) > 1.96;
    }
    v /= (double)n;
    const double frac = (double)tail / (double)n;
    printf("T5 R: %zu draws, mean %.5f, var %.5f, P(|z| > 1.96) %.5f\n", n, m, v, frac);
    CHECKF(fabs(m) < 0.005, "T5: mean %g", m);
    CHECKF(fabs(v - 1) < 0.01, "T5: variance %g", v);
    CHECKF(frac >= 0.048 && frac <= 0.052, "T5: tail fraction %g", frac);
    /* Same seed and layer: bit-identical; another seed or layer: another R. */
    kvs_he_projection(3, 5, BITS, D, R2);
    CHECK(!memcmp(R2, R + 5 * per, sizeof(float) * per));
    kvs_he_projection(4, 5, BITS, D, R2);
    CHECK(memcmp(R2, R + 5 * per, sizeof(float) * per) != 0);
    CHECK(memcmp(R, R + per, sizeof(float) * per) != 0);
    free(R);
    free(R2);
}

/* ---- T6 monotonic ranking: Spearman(cosine, -d_H) ---- */
static void ranks(const double *x, int n, double *r)
{
    for (int i = 0; i < n; i++) { /* average ranks: O(n^2) is fine for n = 400 */
        int less = 0, eq = 0;
        for (int j = 0; j < n; j++)
            less += x[j] < x[i], eq += x[j] == x[i];
        r[i] = less + (eq - 1) / 2.0;
    }
}

static double spearman(const double *a, const double *b, int n)
{
    double ra[400], rb[400], ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    ranks(a, n, ra);
    ranks(b, n, rb);
    for (int i = 0; i < n; i++)
        ma += ra[i] / n, mb += rb[i] / n;
    for (int i = 0; i < n; i++) {
        sab += (ra[i] - ma) * (rb[i] - mb);
        saa += (ra[i] - ma) * (ra[i] - ma);
        sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    return sab / sqrt(saa * sbb);
}

/* Mean over 5 seeds of Spearman(cos(q, k), -d_H(h(q), h(k))) for 400 keys. controlled: keys at
 * angles spread uniformly over [0, pi] from q (for large d, where random cosines concentrate). */
static double ranking_corr(int bits, int d, int controlled)
{
    enum { NK = 400 };
    float *R = malloc(sizeof(float) * (size_t)bits * d), q[128], k[128], u[128];
    double cosv[NK], negd[NK], total = 0;
    for (int seed = 0; seed < 5; seed++) {
        kvs_he_projection(1000 + seed, 0, bits, d, R);
        gauss_vec(q, d);
        double qq = 0;
        for (int j = 0; j < d; j++)
            qq += (double)q[j] * q[j];
        for (int j = 0; j < d; j++)
            q[j] = (float)(q[j] / sqrt(qq));
        uint64_t hq[MAX_NW], hk[MAX_NW];
        kvs_he_hash(R, bits, d, q, hq);
        for (int i = 0; i < NK; i++) {
            if (controlled) {
                const double th = M_PI * (i + 0.5) / NK;
                gauss_vec(u, d);
                double qu = 0, uu = 0;
                for (int j = 0; j < d; j++)
                    qu += (double)q[j] * u[j];
                for (int j = 0; j < d; j++)
                    u[j] = (float)(u[j] - qu * q[j]);
                for (int j = 0; j < d; j++)
                    uu += (double)u[j] * u[j];
                for (int j = 0; j < d; j++)
                    k[j] = (float)(cos(th) * q[j] + sin(th) * u[j] / sqrt(uu));
            } else {
                gauss_vec(k, d);
            }
            double qk = 0, kk = 0;
            for (int j = 0; j < d; j++)
                qk += (double)q[j] * k[j], kk += (double)k[j] * k[j];
            cosv[i] = qk / sqrt(kk);
            kvs_he_hash(R, bits, d, k, hk);
            negd[i] = -kvs_he_hamming(hq, hk, kvs_he_words(bits));
        }
        total += spearman(cosv, negd, NK);
    }
    free(R);
    return total / 5;
}

static void test_ranking(void)
{
    const double r16 = ranking_corr(16, 8, 0), r64 = ranking_corr(64, 8, 0),
                 c64 = ranking_corr(64, 64, 1);
    printf("T6 Spearman(cos, -d_H), d=8 random keys: b=16 %.3f, b=64 %.3f; d=64 controlled "
           "angles, b=64: %.3f\n", r16, r64, c64);
    CHECKF(r64 > 0.75, "T6: b=64 correlation %.3f", r64);
    CHECKF(r64 > r16, "T6: correlation does not rise from b=16 (%.3f) to b=64 (%.3f)", r16, r64);
    CHECKF(c64 > 0.75, "T6: d=64 controlled angles correlation %.3f", c64);
}

/* ---- T12 victim oracle on random states, T13 toy, T17 G=1 reduction ---- */
static int brute_victim(const uint64_t *codes, const int32_t *pos, int n, int bits,
                        const uint64_t *q, int nq, int32_t t, int S, int W, int ties, int *n_max)
{
    const int nw = kvs_he_words(bits);
    int best = -1, bestd = -1;
    int dist[N_TOK];
    for (int s = 0; s < n; s++) {
        dist[s] = -1;
        if (pos[s] < S || pos[s] >= t - W)
            continue;
        int d = 0;
        for (int g = 0; g < nq; g++)
            d += slow_hamming(codes + (size_t)s * nw, q + (size_t)g * nw, bits);
        dist[s] = d;
        if (d > bestd)
            bestd = d;
    }
    *n_max = 0;
    for (int s = 0; s < n; s++)
        if (dist[s] == bestd && bestd >= 0) {
            ++*n_max;
            if (best < 0 || (ties == KVS_HE_TIES_OLDEST && pos[s] < pos[best]))
                best = s;
        }
    return best;
}

static void test_victim_random(void)
{
    long bad = 0, ties_seen = 0, none = 0, bad_norm = 0;
    for (int trial = 0; trial < 5000; trial++) {
        const int n = 1 + below(100), nw = trial % 2 ? 1 : 1 + below(3);
        const int bits = 64 * (nw - 1) + 1 + below(64);
        const int nq = 1 + below(MAX_G), ties = below(2), S = below(8), W = below(30);
        uint64_t pool[4][MAX_NW], codes[100 * 3], q[MAX_G * 3];
        for (int i = 0; i < 4; i++)
            for (int w = 0; w < nw; w++)
                pool[i][w] = rnd() & pad_mask(bits, w);
        int32_t pos[100];
        for (int s = 0; s < n; s++)
            pos[s] = s;
        for (int s = n - 1; s > 0; s--) { /* positions: a shuffled subset of 0..199 */
            int j = below(s + 1);
            int32_t t = pos[s];
            pos[s] = pos[j];
            pos[j] = t;
        }
        for (int s = 0; s < n; s++)
            pos[s] = pos[s] * 2 + (s & 1 && pos[s] > 3 ? -1 : 0);
        const int32_t t = 200 + below(20);
        for (int s = 0; s < n; s++)
            memcpy(codes + (size_t)s * nw, pool[below(4)], sizeof(uint64_t) * nw);
        for (int g = 0; g < nq; g++)
            for (int w = 0; w < nw; w++)
                q[g * nw + w] = rnd() & pad_mask(bits, w);
        int n_max;
        const int want = brute_victim(codes, pos, n, bits, q, nq, t, S, W, ties, &n_max);
        const int got = kvs_he_victim(codes, pos, n, nw, q, nq, t, S, W, ties);
        bad += want != got;
        if (nw == 1)
            bad += want != kvs_he_victim_portable(codes, pos, n, q, nq, t, S, W, ties);
        ties_seen += n_max > 1;
        none += want < 0;
        /* l2evict: the largest norm, same protection and ties. */
        float norm[100];
        for (int s = 0; s < n; s++)
            norm[s] = (float)below(5);
        int wn = -1;
        for (int s = 0; s < n; s++)
            if (pos[s] >= S && pos[s] < t - W &&
                (wn < 0 || norm[s] > norm[wn] ||
                 (norm[s] == norm[wn] && ties == KVS_HE_TIES_OLDEST && pos[s] < pos[wn])))
                wn = s;
        bad_norm += wn != kvs_he_victim_norm(norm, pos, n, t, S, W, ties);
    }
    printf("T12 victim oracle: 5000 random states, %ld with tied maxima, %ld with no evictable "
           "slot\n", ties_seen, none);
    CHECKF(bad == 0, "T12: %ld random states where the victim (fast or portable path) differs "
           "from brute force", bad);
    CHECKF(ties_seen > 500, "T12: too few ties exercised (%ld)", ties_seen);
    CHECKF(bad_norm == 0, "T20: %ld random states where the largest-norm victim differs",
           bad_norm);
}

static void test_toy(void)
{
    /* Fig. 1 style: C=5, S=W=0, 4-bit codes; distances to q=0000: 0, 4, 2, 4, 1. */
    const uint64_t codes[5] = {0x0, 0xF, 0x3, 0xF, 0x1}, q = 0x0;
    const int32_t pos[5] = {10, 14, 12, 11, 13};
    CHECKF(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 0, 0, KVS_HE_TIES_SLOT) == 1,
           "T13: largest distance, ties to the lowest slot");
    CHECKF(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 0, 0, KVS_HE_TIES_OLDEST) == 3,
           "T13: ties=oldest takes the older of the tied slots");
    const uint64_t q2 = 0xF; /* distances 4, 0, 2, 0, 3: a unique maximum */
    CHECK(kvs_he_victim(codes, pos, 5, 1, &q2, 1, 20, 0, 0, KVS_HE_TIES_SLOT) == 0);
    /* Sinks and the recent window are skipped: S=11 protects position 10 (slot 0); W=5
     * protects 15..19 (none), W=7 13..19 (slots 1 and 4), W=9 11..19 (all but the sink). */
    CHECK(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 11, 5, KVS_HE_TIES_SLOT) == 1);
    CHECK(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 11, 7, KVS_HE_TIES_SLOT) == 3);
    CHECK(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 11, 9, KVS_HE_TIES_SLOT) == -1);
    CHECK(kvs_he_victim(codes, pos, 5, 1, &q, 1, 20, 15, 0, KVS_HE_TIES_SLOT) == -1);
    /* Summed over a group of two queries. */
    const uint64_t qq[2] = {0x0, 0xC}; /* 0+2, 4+2, 2+4, 4+2, 1+3 */
    CHECK(kvs_he_victim(codes, pos, 5, 1, qq, 2, 20, 0, 0, KVS_HE_TIES_SLOT) == 1);
    CHECK(kvs_he_victim(codes, pos, 5, 1, qq, 2, 20, 0, 0, KVS_HE_TIES_OLDEST) == 3);
    CHECK(kvs_he_victim_portable(codes, pos, 5, qq, 2, 20, 0, 0, KVS_HE_TIES_SLOT) == 1);
    CHECK(kvs_he_victim_portable(codes, pos, 5, qq, 2, 20, 0, 0, KVS_HE_TIES_OLDEST) == 3);
}

static void test_gqa_reduction(void)
{
    /* G = 1: hashing the group's mean query (one query) or summing one distance is the same. */
    int same = 1;
    float R[16 * 8], qv[8], mean[8];
    kvs_he_projection(5, 0, 16, 8, R);
    for (int trial = 0; trial < 500; trial++) {
        gauss_vec(qv, 8);
        for (int i = 0; i < 8; i++) { /* the policy's mean: sum over the group, / G */
            float s = 0.0f;
            s += qv[i];
            mean[i] = s / 1.0f;
        }
        uint64_t hs, hm, codes[40];
        int32_t pos[40];
        kvs_he_hash(R, 16, 8, qv, &hs);
        kvs_he_hash(R, 16, 8, mean, &hm);
        for (int s = 0; s < 40; s++)
            codes[s] = rnd() & 0xffff, pos[s] = s;
        same &= hs == hm && kvs_he_victim(codes, pos, 40, 1, &hs, 1, 60, 4, 10, 0) ==
                                kvs_he_victim(codes, pos, 40, 1, &hm, 1, 60, 4, 10, 0);
    }
    CHECKF(same, "T17: with G=1, sum and meanq give the same codes and victims");
}

/* ---- T15 slot-order invariance of the attention kernel ---- */
static void test_slot_order(void)
{
    enum { NQ = 4, NKV = 2, HD = 8, N = 50 };
    kvs_store_config cfg = {1, NKV, HD, 64, KVS_F32, 0};
    kvs_store *a = kvs_store_new(&cfg), *b = kvs_store_new(&cfg);
    float k[N][NKV * HD], v[N][NKV * HD], q[NQ * HD], oa[NQ * HD], ob[NQ * HD];
    int perm[N];
    int32_t pos[N];
    kvs_error err = {0};
    for (int i = 0; i < N; i++) {
        gauss_vec(k[i], NKV * HD);
        gauss_vec(v[i], NKV * HD);
        perm[i] = i;
        pos[i] = i;
    }
    for (int i = N - 1; i > 0; i--) {
        int j = below(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < N; i++) { /* the same K/V rows, in two orders */
        CHECK(kvs_store_append(a, 0, 1, k[i], v[i], &pos[i], &err) == KVS_OK);
        CHECK(kvs_store_append(b, 0, 1, k[perm[i]], v[perm[i]], &pos[i], &err) == KVS_OK);
    }
    gauss_vec(q, NQ * HD);
    kvs_pool *pool = kvs_pool_create(1);
    kvs_attn_scratch *sc = kvs_attn_scratch_new();
    const int32_t qpos = N;
    kvs_attn_args aa = {.store = a, .layer = 0, .n_heads = NQ, .n = 1, .q = q, .qpos = &qpos,
                        .out = oa};
    kvs_attn_args ab = aa;
    ab.store = b;
    ab.out = ob;
    CHECK(kvs_attention(pool, sc, &aa, &err) == KVS_OK);
    CHECK(kvs_attention(pool, sc, &ab, &err) == KVS_OK);
    double m = 0;
    for (int i = 0; i < NQ * HD; i++)
        m = fmax(m, fabs((double)oa[i] - ob[i]));
    printf("T15 attention over permuted slots: max difference %.3g\n", m);
    CHECKF(m < 1e-5, "T15: attention changes by %g when the slots are permuted", m);
    kvs_attn_scratch_free(sc);
    kvs_pool_destroy(pool);
    kvs_store_free(a);
    kvs_store_free(b);
}

/* ---- the policy on the model ---- */
static int32_t tokens[N_TOK];
static kvs_model *model;
static kvs_model_info info;

typedef struct hob {
    int C, S, W, mode, ties, gqa, prefill, l2, bits, nw, f16;
    int decoding; /* the prompt's eval has returned */
    long calls, violations;
    char first[320];
    int seen_upto[MAX_L];
    int prev_n[MAX_L][MAX_H];
    int32_t prev_tpos[MAX_L][MAX_H][N_TOK];
    uint8_t have[MAX_L][MAX_H][N_TOK];
    uint64_t code_of[MAX_L][MAX_H][N_TOK][MAX_NW];
    float norm_of[MAX_L][MAX_H][N_TOK];
    long chunks0, fed0, decode0; /* hook calls on layer 0 */
    long evictions, fills, ties_cases;
    uint64_t trace;
} hob;

static void hviol(hob *o, int layer, int h, const char *hook, const char *what, long a, long b)
{
    if (o->violations++ == 0)
        snprintf(o->first, sizeof o->first, "layer %d head %d after %s: %s (%ld vs %ld)", layer,
                 h, hook, what, a, b);
}

static void fold(uint64_t *t, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        *t = (*t ^ ((x >> (8 * i)) & 0xff)) * 1099511628211ULL;
}

/* The key row as a store of this type holds it. */
static void stored_form(const hob *o, const float *k, float *out)
{
    if (!o->f16) {
        memcpy(out, k, sizeof(float) * info.head_dim);
        return;
    }
    uint16_t tmp[MAX_HD];
    kvs_quantize_row(KVS_F16, k, tmp, info.head_dim);
    kvs_dequantize_row(KVS_F16, tmp, out, info.head_dim);
}

static void key_code(const hob *o, const kvs_he_view *v, const float *key, uint64_t *code,
                     float *norm)
{
    if (o->l2) {
        double s = 0;
        for (int i = 0; i < info.head_dim; i++)
            s += (double)key[i] * key[i];
        *norm = (float)sqrt(s);
    } else {
        kvs_he_hash(v->R, o->bits, info.head_dim, key, code);
    }
}

static void hobserve(void *ctx, const kvs_kv *kv, int layer, const char *hook)
{
    hob *o = ctx;
    o->calls++;
    const kvs_store *st = kvs_kv_store(kv);
    const kvs_policy *p = kvs_kv_policy(kv);
    const int ba = !strcmp(hook, "before_append"), pc = !strcmp(hook, "prefill_chunk");
    const int hd = info.head_dim, G = info.n_heads / info.n_kv_heads, C = o->C;
    if (!ba && !pc) {
        hviol(o, layer, 0, hook, "unexpected hook", 0, 0);
        return;
    }
    if (layer == 0)
        ba ? (o->decoding ? o->decode0++ : o->fed0++) : o->chunks0++;
    const int32_t t = o->seen_upto[layer] + 1; /* before_append: the incoming token */
    int32_t newest = -1;
    for (int h = 0; h < info.n_kv_heads; h++) {
        kvs_he_view v;
        if (kvs_hashevict_view(p, layer, h, &v) != 0) {
            hviol(o, layer, h, hook, "no policy view", 0, 0);
            return;
        }
        const int n = kvs_store_count(st, layer, h);
        const int32_t *spos = kvs_store_pos(st, layer, h);
        /* T7 budget, T10 unique positions (in any order: the store fills a victim's slot with
         * its last row). */
        if (n > C)
            hviol(o, layer, h, hook, "live slots over the budget", n, C);
        if (v.n_filled > C || v.cap != C)
            hviol(o, layer, h, hook, "table over the budget", v.n_filled, C);
        const int bad = check_store_positions(st, layer, h);
        if (bad >= 0)
            hviol(o, layer, h, hook, "store positions repeated or out of order", bad,
                  kvs_store_ordered(st, layer, h));
        uint8_t present[N_TOK] = {0};
        for (int i = 0; i < n; i++)
            if (spos[i] >= 0 && spos[i] < N_TOK)
                present[spos[i]] = 1;
        /* Remember every key the first time it is seen in the store. */
        float key[MAX_HD];
        for (int i = 0; i < n; i++)
            if (!o->have[layer][h][spos[i]]) {
                kvs_store_key_f32(st, layer, h, i, key);
                key_code(o, &v, key, o->code_of[layer][h][spos[i]], &o->norm_of[layer][h][spos[i]]);
                o->have[layer][h][spos[i]] = 1;
            }
        const int pn = o->prev_n[layer][h];
        const int32_t *prev = o->prev_tpos[layer][h];
        if (ba) {
            if (v.last_pos != t)
                hviol(o, layer, h, hook, "policy saw another position", v.last_pos, t);
            for (int i = 0; i < n; i++)
                if (spos[i] >= t)
                    hviol(o, layer, h, hook, "store holds the incoming position", spos[i], t);
            const int expect = t < C - 1 ? t : C - 1;
            if (n != expect)
                hviol(o, layer, h, hook, "live slots before the append", n, expect);
            /* The new token's code, from its key as the store will hold it. */
            uint64_t kc[MAX_NW] = {0};
            float kn = 0;
            stored_form(o, v.last_k + (size_t)h * hd, key);
            key_code(o, &v, key, kc, &kn);
            memcpy(o->code_of[layer][h][t], kc, sizeof kc);
            o->norm_of[layer][h][t] = kn;
            o->have[layer][h][t] = 1;
            int j;
            if (pn < C) { /* T8 fill before evict */
                j = pn;
                o->fills++;
                if (v.last_victim != -1 || n != pn)
                    hviol(o, layer, h, hook, "evicted while the table had room", pn, n);
            } else { /* T12 brute-force victim over the table as it was */
                int n_max = 0;
                if (o->l2) {
                    j = -1;
                    for (int s = 0; s < pn; s++) {
                        if (prev[s] < o->S || prev[s] >= t - o->W)
                            continue;
                        const float ns = o->norm_of[layer][h][prev[s]];
                        if (j < 0 || ns > o->norm_of[layer][h][prev[j]] ||
                            (ns == o->norm_of[layer][h][prev[j]] &&
                             o->ties == KVS_HE_TIES_OLDEST && prev[s] < prev[j]))
                            j = s;
                    }
                } else {
                    uint64_t q[MAX_G * MAX_NW], codes[N_TOK * MAX_NW];
                    int nq = G;
                    const float *qg = v.last_q + (size_t)h * G * hd;
                    if (o->mode == KVS_HE_MODE_KEY) {
                        memcpy(q, kc, sizeof(uint64_t) * o->nw);
                        nq = 1;
                    } else if (o->gqa == KVS_HE_GQA_MEANQ) {
                        float mean[MAX_HD];
                        for (int i = 0; i < hd; i++) {
                            float s = 0.0f;
                            for (int g = 0; g < G; g++)
                                s += qg[(size_t)g * hd + i];
                            mean[i] = s / (float)G;
                        }
                        kvs_he_hash(v.R, o->bits, hd, mean, q);
                        nq = 1;
                    } else {
                        for (int g = 0; g < G; g++)
                            kvs_he_hash(v.R, o->bits, hd, qg + (size_t)g * hd, q + g * o->nw);
                    }
                    int unknown = 0;
                    for (int s = 0; s < pn; s++) {
                        unknown |= !o->have[layer][h][prev[s]];
                        memcpy(codes + (size_t)s * o->nw, o->code_of[layer][h][prev[s]],
                               sizeof(uint64_t) * o->nw);
                    }
                    if (unknown)
                        hviol(o, layer, h, hook, "a table position was never seen", 0, 0);
                    j = brute_victim(codes, prev, pn, o->bits, q, nq, t, o->S, o->W, o->ties,
                                     &n_max);
                }
                o->ties_cases += n_max > 1;
                o->evictions++;
                if (j < 0) {
                    hviol(o, layer, h, hook, "no evictable slot", 0, 0);
                    continue;
                }
                if (v.last_victim != prev[j])
                    hviol(o, layer, h, hook, "victim differs from brute force", v.last_victim,
                          prev[j]);
                if (present[prev[j]])
                    hviol(o, layer, h, hook, "victim still in the store", prev[j], 0);
                fold(&o->trace, (uint64_t)layer << 48 | (uint64_t)h << 32 | (uint32_t)t);
                fold(&o->trace, (uint32_t)prev[j]);
            }
            /* The new token takes slot j; every other slot is unchanged. */
            if (v.n_filled != (pn < C ? pn + 1 : C))
                hviol(o, layer, h, hook, "table count", v.n_filled, pn < C ? pn + 1 : C);
            for (int s = 0; s < v.n_filled; s++)
                if (v.pos[s] != (s == j ? t : prev[s]))
                    hviol(o, layer, h, hook, "table slot changed", s, v.pos[s]);
            /* T9 protection: sinks and positions t-W..t-1 are stored, t is in the table. */
            for (int32_t q = 0; q < o->S && q < t; q++)
                if (!present[q])
                    hviol(o, layer, h, hook, "sink missing", q, t);
            for (int32_t q = t - o->W < 0 ? 0 : t - o->W; q < t; q++)
                if (!present[q])
                    hviol(o, layer, h, hook, "recent position missing", q, t);
        } else {
            newest = n ? spos[n - 1] : -1;
            if (newest < o->seen_upto[layer])
                hviol(o, layer, h, hook, "newest position went back", newest,
                      o->seen_upto[layer]);
            if (newest == o->seen_upto[layer]) { /* a fed token: the table is as before */
                if (v.n_filled != pn || memcmp(v.pos, prev, sizeof(int32_t) * (size_t)pn))
                    hviol(o, layer, h, hook, "a fed token's chunk changed the table", pn,
                          v.n_filled);
            } else if (o->prefill == KVS_HE_PREFILL_PAPER) { /* dense: appended in order */
                if (n != newest + 1)
                    hviol(o, layer, h, hook, "dense prefill lost positions", n, newest + 1);
                for (int s = 0; s < v.n_filled; s++)
                    if (v.pos[s] != (s < pn ? prev[s] : s))
                        hviol(o, layer, h, hook, "dense prefill slot", s, v.pos[s]);
            } else if (o->l2) { /* norm: sinks, recent window, lowest norms; slot = rank */
                const int kept = newest + 1 <= C ? newest + 1 : C;
                if (n != kept)
                    hviol(o, layer, h, hook, "norm prefill count", n, kept);
                for (int i = 0; i < n; i++)
                    if (v.pos[i] != spos[i])
                        hviol(o, layer, h, hook, "norm prefill table order", i, v.pos[i]);
            } else { /* recent: sinks + the newest C - S, physical slot = rank */
                const int kept = newest + 1 <= C ? newest + 1 : C;
                if (n != kept)
                    hviol(o, layer, h, hook, "recent prefill count", n, kept);
                for (int i = 0; i < n; i++) {
                    const int32_t want = newest + 1 <= C || i < o->S ? i : newest - (n - 1 - i);
                    if (spos[i] != want)
                        hviol(o, layer, h, hook, "recent prefill position", spos[i], want);
                    if (v.pos[i] != spos[i])
                        hviol(o, layer, h, hook, "recent prefill table order", i, v.pos[i]);
                }
            }
            /* T9: the sinks are never lost, the newest W positions are stored. */
            for (int32_t q = 0; q < o->S && q <= newest; q++)
                if (!present[q])
                    hviol(o, layer, h, hook, "sink missing", q, newest);
            for (int32_t q = newest - o->W + 1 < 0 ? 0 : newest - o->W + 1; q <= newest; q++)
                if (!present[q])
                    hviol(o, layer, h, hook, "recent position missing", q, newest);
        }
        /* T10 + T11: the table holds exactly the stored positions (plus the incoming token
         * after before_append), each once, each with the code (norm) of its stored key. */
        uint8_t mark[N_TOK] = {0};
        for (int s = 0; s < v.n_filled; s++) {
            const int32_t q = v.pos[s];
            if (q < 0 || q > (ba ? t : newest) || mark[q]++)
                hviol(o, layer, h, hook, "table position invalid or repeated", s, q);
            else if (!(ba && q == t) && !present[q])
                hviol(o, layer, h, hook, "table position not in the store", s, q);
            else if (o->l2 ? v.norm[s] != o->norm_of[layer][h][q]
                           : memcmp(v.codes + (size_t)s * o->nw, o->code_of[layer][h][q],
                                    sizeof(uint64_t) * o->nw) != 0)
                hviol(o, layer, h, hook, "table code differs from the stored key's", s, q);
        }
        if (v.n_filled != n + ba)
            hviol(o, layer, h, hook, "table and store counts", v.n_filled, n + ba);
        o->prev_n[layer][h] = v.n_filled;
        memcpy(o->prev_tpos[layer][h], v.pos, sizeof(int32_t) * (size_t)v.n_filled);
    }
    o->seen_upto[layer] = ba ? t : newest;
}

typedef struct hrun {
    const char *spec;
    int threads, chunk, prompt, decode; /* prompt 0 = PROMPT, decode after it */
    const char *kv_type;
    kvs_status st;
    char err[512];
    float *logits; /* 1 + decode rows: after the prompt, then after each decoded token */
    hob *o;
    size_t peak, slot_bytes, state_bytes;
    kvs_he_bytes bytes;
    int final_n[MAX_L][MAX_H];
    int32_t *final_tpos; /* MAX_L x MAX_H x N_TOK */
    float R0[16 * MAX_HD];
} hrun;

/* The observer's copy of the policy's parameters, from the spec; C is the resolved budget. */
static void set_params(hob *o, const hrun *r, int C)
{
    kvs_policy_spec spec;
    kvs_error err = {0};
    if (kvs_policy_parse(r->spec, &spec, &err) != KVS_OK)
        return;
    kvs_policy tmp = {.type = spec.type, .spec = spec};
    o->C = C;
    o->l2 = spec.type == kvs_policy_find("l2evict");
    o->S = (int)kvs_policy_param(&tmp, "sinks");
    o->W = (int)kvs_policy_param(&tmp, "recent");
    o->ties = (int)kvs_policy_param(&tmp, "ties");
    o->prefill = (int)kvs_policy_param(&tmp, "prefill");
    o->mode = o->l2 ? 0 : (int)kvs_policy_param(&tmp, "mode");
    o->gqa = o->l2 ? 0 : (int)kvs_policy_param(&tmp, "gqa");
    o->bits = o->l2 ? 0 : (int)kvs_policy_param(&tmp, "bits");
    o->nw = o->l2 ? 0 : kvs_he_words(o->bits);
    o->f16 = r->kv_type && !strcmp(r->kv_type, "f16");
    for (int l = 0; l < MAX_L; l++)
        o->seen_upto[l] = -1;
    o->trace = 1469598103934665603ULL;
}

/* Prompt (r->prompt tokens, default 384), then r->decode tokens one at a time, all checked by
 * the observer; C is the budget the spec resolves to. */
static void run_checked(hrun *r, int C)
{
    const int P = r->prompt ? r->prompt : PROMPT;
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = r->threads ? r->threads : 2;
    sp.chunk = r->chunk;
    sp.kv_policy = r->spec;
    sp.kv_type = r->kv_type;
    kvs_session *s = NULL;
    kvs_error err = {0};
    r->o = calloc(1, sizeof(hob));
    r->final_tpos = calloc((size_t)MAX_L * MAX_H * N_TOK, sizeof(int32_t));
    r->logits = calloc((size_t)(1 + r->decode) * info.n_vocab, sizeof(float));
    if (!r->o || !r->final_tpos || !r->logits) {
        r->st = KVS_ERR_NOMEM;
        snprintf(r->err, sizeof r->err, "out of memory");
        return;
    }
    set_params(r->o, r, C);
    r->st = kvs_session_new(model, &sp, &s, &err);
    if (r->st != KVS_OK) {
        snprintf(r->err, sizeof r->err, "%s", err.msg);
        return;
    }
    kvs_kv *kv = kvs_session_kv(s);
    kvs_kv_set_observer(kv, hobserve, r->o);
    r->st = kvs_session_eval(s, tokens, P, r->logits, 0, &err);
    r->o->decoding = 1;
    for (int t = P; t < P + r->decode && r->st == KVS_OK; t++)
        r->st = kvs_session_eval(s, tokens + t, 1, r->logits + (size_t)(t - P + 1) * info.n_vocab,
                                 0, &err);
    if (r->st != KVS_OK)
        snprintf(r->err, sizeof r->err, "%s", err.msg);
    const kvs_policy *p = kvs_kv_policy(kv);
    r->peak = kvs_session_kv_peak_bytes(s);
    r->slot_bytes = kvs_store_slot_bytes(kvs_kv_store(kv));
    r->state_bytes = p->type->state_bytes ? p->type->state_bytes(p) : 0;
    kvs_hashevict_bytes(p, &r->bytes);
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++) {
            kvs_he_view v;
            if (kvs_hashevict_view(p, l, h, &v) != 0)
                continue;
            r->final_n[l][h] = v.n_filled;
            memcpy(r->final_tpos + ((size_t)l * MAX_H + h) * N_TOK, v.pos,
                   sizeof(int32_t) * (size_t)v.n_filled);
            if (l == 0 && h == 0 && v.R && v.bits <= 16)
                memcpy(r->R0, v.R, sizeof(float) * (size_t)v.bits * info.head_dim);
        }
    kvs_session_free(s);
}

static void free_hrun(hrun *r)
{
    free(r->o);
    free(r->logits);
    free(r->final_tpos);
    r->o = NULL;
    r->logits = NULL;
    r->final_tpos = NULL;
}

static void check_hrun(const hrun *r)
{
    CHECKF(r->st == KVS_OK, "%s: %s", r->spec, r->err);
    CHECKF(r->o && r->o->violations == 0, "%s: %ld violations, first: %s", r->spec,
           r->o ? r->o->violations : -1, r->o ? r->o->first : "");
    CHECKF(r->o && r->o->calls > 0, "%s: no hook observed", r->spec);
}

/* Largest |difference| of rows [ra, ra + n) of a and [rb, rb + n) of b. */
static double row_diff(const float *a, int ra, const float *b, int rb, int n)
{
    double m = 0;
    const size_t V = (size_t)info.n_vocab;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        double d = fabs((double)a[ra * V + i] - b[rb * V + i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

static int same_tables(const hrun *a, const hrun *b)
{
    for (int l = 0; l < info.n_layers; l++)
        for (int h = 0; h < info.n_kv_heads; h++)
            if (a->final_n[l][h] != b->final_n[l][h] ||
                memcmp(a->final_tpos + ((size_t)l * MAX_H + h) * N_TOK,
                       b->final_tpos + ((size_t)l * MAX_H + h) * N_TOK,
                       sizeof(int32_t) * (size_t)a->final_n[l][h]))
                return 0;
    return 1;
}

static int start_error(const char *spec, const char *needle)
{
    kvs_session_params sp = kvs_session_default_params();
    sp.kv_policy = spec;
    kvs_session *s = NULL;
    kvs_error err = {0};
    kvs_status st = kvs_session_new(model, &sp, &s, &err);
    if (st == KVS_OK)
        st = kvs_session_eval(s, tokens, PROMPT, NULL, 0, &err);
    kvs_session_free(s);
    if (st != KVS_ERR_ARG || !strstr(err.msg, needle)) {
        fprintf(stderr, "spec '%s': status %d, message '%s' (want '%s')\n", spec, st, err.msg,
                needle);
        return 0;
    }
    return 1;
}

/* T19 config validation, T21 overhead accounting (no model needed for the bytes). */
static void test_config_and_bytes(void)
{
    CHECK(error_mentions("hashevict:budget=0.1,bits=0", "bits=0 is out of range"));
    CHECK(error_mentions("hashevict:budget=0.1,bits=513", "bits=513 is out of range"));
    CHECK(error_mentions("hashevict:budget=1.5", "must be a decimal number in (0, 1]"));
    CHECK(error_mentions("hashevict:slots=0", "slots=0"));
    CHECK(error_mentions("hashevict:budget=0.1,mode=value", "mode=value is not one of query|key"));
    CHECK(error_mentions("hashevict:budget=0.1,ties=newest", "not one of oldest|slot"));
    CHECK(error_mentions("hashevict:budget=0.1,prefill=dense", "not one of paper|recent"));
    CHECK(error_mentions("l2evict:budget=0.1,prefill=recent", "not one of paper|norm"));
    CHECK(error_mentions("hashevict", "needs budget"));
    kvs_policy_spec spec;
    kvs_error err = {0};
    CHECK(kvs_policy_parse("hashevict:budget=0.25,bits=16,mode=key,ties=slot", &spec, &err) ==
          KVS_OK);
    CHECKF(!strcmp(spec.text, "hashevict:budget=0.25,mode=key,ties=slot"), "canonical text '%s'",
           spec.text);
    char text[256];
    snprintf(text, sizeof text, "%s", spec.text);
    CHECK(kvs_policy_parse(text, &spec, &err) == KVS_OK); /* parses back */
    CHECK(spec.values[3] == KVS_HE_MODE_KEY && spec.values[5] == KVS_HE_TIES_SLOT);

    /* T21: packed L*Hkv*C*ceil(b/8), allocated L*Hkv*C*nw*8, constant for b <= 64. */
    static const int bits_list[] = {1, 8, 9, 16, 32, 64, 65, 512};
    kvs_kv_config cfg = {5, 8, 4, 8, 512, KVS_F32, 0};
    const size_t heads = 5 * 4, C = 100;
    int ok = 1;
    for (size_t i = 0; i < sizeof bits_list / sizeof *bits_list; i++) {
        char text[96];
        const int b = bits_list[i];
        snprintf(text, sizeof text, "hashevict:slots=100,bits=%d", b);
        kvs_kv *kv = NULL;
        if (kvs_policy_parse(text, &spec, &err) != KVS_OK ||
            kvs_kv_new(&cfg, &spec, &kv, &err) != KVS_OK ||
            kvs_kv_begin_prompt(kv, 300, &err) != KVS_OK) {
            ok = 0;
            kvs_kv_free(kv);
            continue;
        }
        kvs_he_bytes by;
        const kvs_policy *p = kvs_kv_policy(kv);
        ok &= kvs_hashevict_bytes(p, &by) == 0;
        ok &= by.codes_packed == heads * C * (size_t)((b + 7) / 8);
        ok &= by.codes_allocated == heads * C * (size_t)kvs_he_words(b) * 8;
        ok &= by.projection == 5 * (size_t)b * 8 * 4 && by.slot_table == heads * C * 4;
        ok &= by.total == by.codes_allocated + by.projection + by.slot_table;
        ok &= kvs_kv_bytes(kv) == by.total; /* empty store: the state is all */
        if (b <= 64)
            ok &= by.codes_allocated == heads * C * 8;
        kvs_kv_free(kv);
    }
    CHECKF(ok, "T21: code bytes (packed and allocated), R and the slot table");
    /* l2evict: norms and the slot table, no codes. */
    kvs_kv *kv = NULL;
    CHECK(kvs_policy_parse("l2evict:slots=100", &spec, &err) == KVS_OK &&
          kvs_kv_new(&cfg, &spec, &kv, &err) == KVS_OK &&
          kvs_kv_begin_prompt(kv, 300, &err) == KVS_OK);
    kvs_he_bytes by;
    CHECK(kv && kvs_hashevict_bytes(kvs_kv_policy(kv), &by) == 0 && by.codes_allocated == 0 &&
          by.norms == heads * C * 4 && by.total == by.norms + by.slot_table);
    kvs_kv_free(kv);
}

int main(void)
{
    test_hamming_basics();
    test_bit_semantics();
    test_scale_sign();
    test_collision();
    test_projection_distribution();
    test_ranking();
    test_victim_random();
    test_toy();
    test_gqa_reduction();
    test_slot_order();
    test_config_and_bytes();

    char msg[512];
    kvs_error err = {0};
    CHECKF(fx_load(tokens, N_TOK, &model, &info, msg, sizeof msg) == 0, "%s", msg);
    if (!model)
        return check_summary("hashevict");
    CHECK(info.n_layers <= MAX_L && info.n_kv_heads <= MAX_H && info.head_dim <= MAX_HD &&
          info.n_heads / info.n_kv_heads <= MAX_G);
    const size_t heads = (size_t)info.n_layers * info.n_kv_heads;

    /* T19: budgets that leave no evictable slot are rejected at the prompt's start. */
    CHECK(start_error("hashevict:slots=14", "must exceed sinks + recent = 4 + 10"));
    CHECK(start_error("hashevict:slots=2,sinks=1,recent=1", "must exceed"));
    CHECK(start_error("l2evict:slots=14", "must exceed"));
    CHECK(start_error("hashevict:slots=600", "exceeds the context of 512"));

    /* The protocol's configuration: prompt 384, budget 0.25 (C = 96), paper prefill (96 dense
     * tokens, 288 fed), ties=oldest; every eviction checked against brute force. */
    hrun def = {.spec = "hashevict:budget=0.25", .decode = DEC};
    run_checked(&def, 96);
    check_hrun(&def);
    printf("hashevict:budget=0.25, prompt 384: %ld evictions checked against brute force, %ld "
           "with tied maxima; peak %zu bytes\n", def.o->evictions, def.o->ties_cases, def.peak);
    CHECKF(def.o->chunks0 == 1 + (PROMPT - 96) && def.o->fed0 == PROMPT - 96 &&
               def.o->decode0 == DEC,
           "paper prefill: %ld chunks, %ld fed tokens, %ld decode steps on layer 0", def.o->chunks0,
           def.o->fed0, def.o->decode0);
    CHECKF(def.o->evictions == (long)heads * (PROMPT - 96 + DEC), "evictions %ld",
           def.o->evictions);
    CHECKF(def.o->ties_cases > def.o->evictions / 10, "ties exercised in %ld of %ld evictions",
           def.o->ties_cases, def.o->evictions);
    /* T7: memory never beyond C slots (paper prefill) plus the policy state. */
    CHECKF(def.peak <= def.slot_bytes * heads * 96 + def.state_bytes,
           "T7: peak %zu bytes > C slots + state %zu", def.peak,
           def.slot_bytes * heads * 96 + def.state_bytes);
    CHECK(def.bytes.codes_packed == heads * 96 * 2 && def.bytes.codes_allocated == heads * 96 * 8);
    float R0[16 * MAX_HD];
    kvs_he_projection(0, 0, 16, info.head_dim, R0);
    CHECKF(!memcmp(R0, def.R0, sizeof(float) * 16 * info.head_dim),
           "T16: the policy's R is not kvs_he_projection(seed, layer)");

    /* Shorter runs: prompt 160 (budget 0.25 = 40 slots: 40 dense, 120 fed), 24 decoded. */
    enum { P2 = 160, C2 = 40 };
    float *ref = calloc((size_t)(1 + DEC) * info.n_vocab, sizeof(float));
    {
        kvs_session_params sp = kvs_session_default_params();
        kvs_session *s = NULL;
        kvs_status st = kvs_session_new(model, &sp, &s, &err);
        if (st == KVS_OK)
            st = kvs_session_eval(s, tokens, P2, ref, 0, &err);
        for (int t = P2; t < P2 + DEC && st == KVS_OK; t++)
            st = kvs_session_eval(s, tokens + t, 1, ref + (size_t)(t - P2 + 1) * info.n_vocab, 0,
                                  &err);
        CHECKF(st == KVS_OK, "full cache: %s", err.msg);
        kvs_session_free(s);
    }
    /* T14: a budget of prompt + decoded tokens gives the full cache's logits exactly. */
    {
        hrun r = {.spec = "hashevict:slots=184", .prompt = P2, .decode = DEC, .threads = 1};
        run_checked(&r, P2 + DEC);
        check_hrun(&r);
        double d = row_diff(r.logits, 0, ref, 0, 1 + DEC);
        CHECKF(d == 0.0 && r.o->evictions == 0,
               "T14: budget = prompt + decoded differs from full by %g (%ld evictions)", d,
               r.o->evictions);
        free_hrun(&r);
    }
    /* T8: budget 170: 10 decode steps fill free slots (logits still equal), then evictions. */
    {
        hrun r = {.spec = "hashevict:slots=170", .prompt = P2, .decode = DEC, .threads = 1};
        run_checked(&r, 170);
        check_hrun(&r);
        double d = row_diff(r.logits, 0, ref, 0, 11);
        CHECKF(d == 0.0, "T8: logits differ by %g while the table had free slots", d);
        CHECKF(r.o->fills == (long)heads * (170 - P2) &&
                   r.o->evictions == (long)heads * (P2 + DEC - 170),
               "T8: %ld fills, %ld evictions", r.o->fills, r.o->evictions);
        free_hrun(&r);
    }
    free(ref);

    /* T16: 1 and 2 threads give the same trace and logits; another seed another R and trace. */
    hrun d2 = {.spec = "hashevict:budget=0.25", .prompt = P2, .decode = DEC, .threads = 2};
    run_checked(&d2, C2);
    check_hrun(&d2);
    {
        hrun one = {.spec = "hashevict:budget=0.25", .prompt = P2, .decode = DEC, .threads = 1};
        run_checked(&one, C2);
        check_hrun(&one);
        CHECKF(one.o->trace == d2.o->trace && row_diff(one.logits, 0, d2.logits, 0, 1 + DEC) == 0,
               "T16: 1 and 2 threads differ");
        free_hrun(&one);
        hrun s1 = {.spec = "hashevict:budget=0.25,seed=1", .prompt = P2, .decode = DEC,
                   .threads = 1};
        run_checked(&s1, C2);
        check_hrun(&s1);
        CHECKF(s1.o->trace != d2.o->trace, "T16: seeds 0 and 1 evict the same");
        CHECKF(memcmp(s1.R0, d2.R0, sizeof(float) * 16 * info.head_dim) != 0,
               "T16: seeds 0 and 1 give the same R");
        free_hrun(&s1);
    }

    /* T18: paper prefill of 160 tokens = a 40-token prompt followed by 120 decode steps. */
    {
        hrun split = {.spec = "hashevict:slots=40", .prompt = C2, .decode = P2 - C2 + DEC,
                      .threads = 1};
        run_checked(&split, C2);
        check_hrun(&split);
        CHECKF(split.o->trace == d2.o->trace, "T18: the evictions differ");
        CHECKF(same_tables(&split, &d2), "T18: the final slot tables differ");
        double d = row_diff(d2.logits, 0, split.logits, P2 - C2, 1 + DEC);
        CHECKF(d == 0.0, "T18: logits differ by %g", d);
        free_hrun(&split);
        /* The dense part in chunks of 16 (16 + 16 + 8), then fed tokens. */
        hrun ch = {.spec = "hashevict:budget=0.25", .prompt = P2, .chunk = 16, .decode = 4,
                   .threads = 1};
        run_checked(&ch, C2);
        check_hrun(&ch);
        CHECKF(ch.o->chunks0 == 3 + (P2 - C2) && ch.o->fed0 == P2 - C2,
               "chunk 16: %ld chunks, %ld fed", ch.o->chunks0, ch.o->fed0);
        free_hrun(&ch);
    }
    /* Ties by the lowest physical slot (spec parity). */
    {
        hrun r = {.spec = "hashevict:budget=0.25,ties=slot", .prompt = P2, .decode = DEC,
                  .threads = 1};
        run_checked(&r, C2);
        check_hrun(&r);
        printf("ties=slot, prompt 160, budget 40: %ld evictions, %ld with tied maxima\n",
               r.o->evictions, r.o->ties_cases);
        CHECK(r.o->ties_cases > 0);
        CHECKF(r.o->trace != d2.o->trace, "ties=slot evicts as ties=oldest");
        free_hrun(&r);
    }
    /* T17: key mode (the victim is the argmax distance to the new key's code); meanq; other
     * code widths (8 bits; 100 bits = two words). */
    {
        const char *specs[] = {"hashevict:budget=0.25,mode=key", "hashevict:budget=0.5,gqa=meanq",
                               "hashevict:budget=0.25,bits=8", "hashevict:budget=0.25,bits=100"};
        const int caps[] = {C2, 80, C2, C2};
        for (int i = 0; i < 4; i++) {
            hrun r = {.spec = specs[i], .prompt = P2, .decode = 4, .threads = 1};
            run_checked(&r, caps[i]);
            check_hrun(&r);
            CHECKF(r.o->evictions > 0, "%s: nothing evicted", specs[i]);
            free_hrun(&r);
        }
    }
    /* prefill=recent: the sinks and the newest C - S after the prompt, in position order. */
    {
        hrun r = {.spec = "hashevict:budget=0.25,prefill=recent", .prompt = P2, .decode = DEC,
                  .threads = 1};
        run_checked(&r, C2);
        check_hrun(&r);
        CHECKF(r.o->chunks0 == 1 && r.o->fed0 == 0, "recent: %ld chunks, %ld fed", r.o->chunks0,
               r.o->fed0);
        /* One 160-token chunk: a layer holds the whole prompt before its prefill_chunk (dense
         * prefill over all N); the layers run one after another. */
        CHECKF(r.peak >= r.slot_bytes * info.n_kv_heads * P2, "recent: peak %zu", r.peak);
        CHECKF(!same_tables(&r, &d2), "recent and paper prefill end in the same state");
        CHECKF(row_diff(r.logits, 1, d2.logits, 1, DEC) > 0, "recent and paper give the same "
               "logits");
        free_hrun(&r);
        hrun c = {.spec = "hashevict:budget=0.25,prefill=recent", .prompt = P2, .chunk = 32,
                  .decode = 4, .threads = 1};
        run_checked(&c, C2);
        check_hrun(&c);
        CHECKF(c.peak <= c.slot_bytes * heads * (C2 + 32) + c.state_bytes,
               "recent, chunk 32: peak %zu over C + chunk", c.peak);
        free_hrun(&c);
    }
    /* F16 storage: codes are of the keys as stored. */
    {
        hrun r = {.spec = "hashevict:budget=0.25", .kv_type = "f16", .prompt = P2, .decode = 4,
                  .threads = 1};
        run_checked(&r, C2);
        check_hrun(&r);
        free_hrun(&r);
    }
    /* T20: l2evict (the largest stored norm goes; stored norm = |K[s]|), both prefills. */
    {
        const char *specs[] = {"l2evict:budget=0.25", "l2evict:budget=0.25,ties=slot"};
        for (int i = 0; i < 2; i++) {
            hrun r = {.spec = specs[i], .prompt = P2, .decode = DEC, .threads = 1};
            run_checked(&r, C2);
            check_hrun(&r);
            CHECK(r.o->evictions == (long)heads * (P2 - C2 + DEC));
            free_hrun(&r);
        }
        hrun n = {.spec = "l2evict:budget=0.25,prefill=norm", .prompt = P2, .decode = 4,
                  .threads = 1};
        run_checked(&n, C2);
        check_hrun(&n);
        free_hrun(&n);
    }

    free_hrun(&d2);
    free_hrun(&def);
    kvs_model_free(model);
    return check_summary("hashevict");
}
