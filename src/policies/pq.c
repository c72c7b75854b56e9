/* Product quantisation for PQCache: K-Means per sub-space, encoding, lookup tables, the scan
 * over codes, top-k and the adaptive iteration cap (pq.h; pqcache.md §2.2-§2.5, §6). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "policies/pq.h"

/* ---- nearest centroid ---- */

/* Centroids laid out for the distance kernel, in chunks of CHUNK: within a chunk transposed
 * (dimension-major, ct[i * kc + c]) so that the inner loop runs over the chunk's centroids and
 * vectorises without reassociating a sum (a chunk's accumulators stay in registers), plus
 * their squared norms. The distance to c is ||c||^2 - 2 x.c (||x||^2 is the same for every c,
 * so it does not change the argmin). K-Means fills every chunk at once; kvs_pq_encode one at a
 * time into a small stack buffer; both go through chunk_nearest(), so a token encoded after
 * clustering gets exactly the code K-Means gave it. */
#define CHUNK 32

typedef struct layout {
    int d, k;
    float *ct;   /* per chunk b: d * kc floats at b * CHUNK * d */
    float *norm; /* k */
} layout;

/* Lays out centroids [c0, c0 + kc) (kc <= CHUNK) at ct (d * kc floats) and norm (kc). */
static void chunk_fill(const float *centroids, int d, int c0, int kc, float *ct, float *norm)
{
    for (int c = 0; c < kc; c++) {
        const float *ce = centroids + (size_t)(c0 + c) * d;
        float nn = 0;
        for (int i = 0; i < d; i++) {
            ct[(size_t)i * kc + c] = ce[i];
            nn += ce[i] * ce[i];
        }
        norm[c] = nn;
    }
}

/* Folds the chunk's centroids [c0, c0 + kc) into the running minimum (*best, *best_val): a
 * later centroid wins only when strictly nearer, so ties go to the lowest index. */
static inline void chunk_nearest_n(const float *ct, const float *norm, int d, int c0,
                                   int kc, const float *x, int *best, float *best_val)
{
    float acc[CHUNK];
    for (int c = 0; c < kc; c++)
        acc[c] = norm[c];
    for (int i = 0; i < d; i++) {
        const float m2x = -2.0f * x[i];
        const float *row = ct + (size_t)i * kc;
        for (int c = 0; c < kc; c++)
            acc[c] += m2x * row[c];
    }
    for (int c = 0; c < kc; c++)
        if (*best < 0 || acc[c] < *best_val) {
            *best = c0 + c;
            *best_val = acc[c];
        }
}

/* Four points against a whole chunk at once: four times the independent accumulator chains
 * (one point's chain waits on each multiply-add's latency). Element for element the same
 * arithmetic in the same order as chunk_nearest_n, so the codes are the same. */
static void chunk_nearest4(const float *ct, const float *norm, int d, int c0,
                           const float *const x[4], int best[4], float best_val[4])
{
    float acc[4][CHUNK];
    for (int p = 0; p < 4; p++)
        for (int c = 0; c < CHUNK; c++)
            acc[p][c] = norm[c];
    for (int i = 0; i < d; i++) {
        const float *row = ct + (size_t)i * CHUNK;
        for (int p = 0; p < 4; p++) {
            const float m2x = -2.0f * x[p][i];
            for (int c = 0; c < CHUNK; c++)
                acc[p][c] += m2x * row[c];
        }
    }
    for (int p = 0; p < 4; p++)
        for (int c = 0; c < CHUNK; c++)
            if (best[p] < 0 || acc[p][c] < best_val[p]) {
                best[p] = c0 + c;
                best_val[p] = acc[p][c];
            }
}

/* A whole chunk with its length a constant, so that the compiler keeps the accumulators in
 * vector registers (the K-Means hot loop: every point against every centroid); the same
 * arithmetic in the same order as any other length. */
static void chunk_nearest(const float *ct, const float *norm, int d, int c0, int kc,
                          const float *x, int *best, float *best_val)
{
    if (kc == CHUNK)
        chunk_nearest_n(ct, norm, d, c0, CHUNK, x, best, best_val);
    else
        chunk_nearest_n(ct, norm, d, c0, kc, x, best, best_val);
}

static int chunk_len(int k, int c0) { return k - c0 < CHUNK ? k - c0 : CHUNK; }

static void layout_fill(layout *t, const float *centroids)
{
    for (int c0 = 0; c0 < t->k; c0 += CHUNK)
        chunk_fill(centroids, t->d, c0, chunk_len(t->k, c0), t->ct + (size_t)c0 * t->d,
                   t->norm + c0);
}

/* The nearest centroid of x (lowest index on ties). */
static int nearest(const layout *t, const float *x)
{
    int best = -1;
    float best_val = 0;
    for (int c0 = 0; c0 < t->k; c0 += CHUNK)
        chunk_nearest(t->ct + (size_t)c0 * t->d, t->norm + c0, t->d, c0, chunk_len(t->k, c0),
                      x, &best, &best_val);
    return best;
}

static double dist2(const float *a, const float *b, int d)
{
    double s = 0;
    for (int i = 0; i < d; i++) {
        const double e = (double)a[i] - (double)b[i];
        s += e * e;
    }
    return s;
}

/* ---- K-Means ---- */

typedef struct kmeans {
    const float *x;
    int n, d, k;
    size_t stride;
    float *cent;    /* k * d */
    uint8_t *code;  /* n */
    double *sum;    /* k * d: update accumulators */
    int *count;     /* k */
    double *pdist;  /* n: each point's squared distance to its centroid */
    char *taken;    /* n: a point an empty cluster already moved onto */
    layout t;
} kmeans;

static const float *point(const kmeans *km, int i) { return km->x + (size_t)i * km->stride; }

/* Assigns every point; returns the SSE (in double) and counts the changed codes. */
static double assign(kmeans *km, int *changed)
{
    layout_fill(&km->t, km->cent);
    double sse = 0;
    int ch = 0;
    int i = 0;
    if (km->k % CHUNK == 0) /* four points at a time over whole chunks */
        for (; i + 4 <= km->n; i += 4) {
            const float *const x[4] = {point(km, i), point(km, i + 1), point(km, i + 2),
                                       point(km, i + 3)};
            int best[4] = {-1, -1, -1, -1};
            float val[4] = {0, 0, 0, 0};
            for (int c0 = 0; c0 < km->k; c0 += CHUNK)
                chunk_nearest4(km->t.ct + (size_t)c0 * km->d, km->t.norm + c0, km->d, c0, x,
                               best, val);
            for (int p = 0; p < 4; p++) {
                ch += best[p] != km->code[i + p];
                km->code[i + p] = (uint8_t)best[p];
                km->pdist[i + p] = dist2(x[p], km->cent + (size_t)best[p] * km->d, km->d);
                sse += km->pdist[i + p];
            }
        }
    for (; i < km->n; i++) {
        const int c = nearest(&km->t, point(km, i));
        ch += c != km->code[i];
        km->code[i] = (uint8_t)c;
        km->pdist[i] = dist2(point(km, i), km->cent + (size_t)c * km->d, km->d);
        sse += km->pdist[i];
    }
    *changed = ch;
    return sse;
}

/* Initial centroids: points taken in the order of a seeded permutation of the indices
 * (Fisher-Yates, drawn lazily), skipping a point equal to one already taken while enough
 * points remain; the first pass over all points fills what distinct values cannot. */
static kvs_status init_centroids(kmeans *km, uint64_t seed, kvs_error *err)
{
    int *perm = malloc(sizeof(int) * (size_t)km->n);
    if (!perm)
        return kvs_fail(err, KVS_ERR_NOMEM, "pq: out of memory for the K-Means sample of %d "
                        "points", km->n);
    for (int i = 0; i < km->n; i++)
        perm[i] = i;
    kvs_random_stream rs = {seed, 0};
    int got = 0;
    for (int i = 0; i < km->n && got < km->k; i++) {
        const int j = i + (int)kvs_random_below(&rs, (uint64_t)(km->n - i));
        const int tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
        const float *p = point(km, perm[i]);
        int dup = 0;
        for (int c = 0; c < got && !dup; c++)
            dup = !memcmp(km->cent + (size_t)c * km->d, p, sizeof(float) * km->d);
        if (!dup)
            memcpy(km->cent + (size_t)got++ * km->d, p, sizeof(float) * km->d);
    }
    /* fewer distinct points than clusters: repeat the sample (those clusters stay empty and
     * are moved by the update; every centroid is a data point, never NaN) */
    for (int c = got; c < km->k; c++)
        memcpy(km->cent + (size_t)c * km->d, km->cent + (size_t)(c % (got ? got : 1)) * km->d,
               sizeof(float) * km->d);
    free(perm);
    return KVS_OK;
}

/* New centroids: the mean of each cluster's points; an empty cluster moves onto the point
 * farthest from its centroid that no other empty cluster took (lowest index on ties). Returns
 * the summed squared shift of the centroids. */
static double update(kmeans *km)
{
    const int d = km->d, k = km->k;
    memset(km->sum, 0, sizeof(double) * (size_t)k * d);
    memset(km->count, 0, sizeof(int) * (size_t)k);
    for (int i = 0; i < km->n; i++) {
        const float *p = point(km, i);
        double *s = km->sum + (size_t)km->code[i] * d;
        for (int j = 0; j < d; j++)
            s[j] += p[j];
        km->count[km->code[i]]++;
    }
    double shift = 0;
    int any_empty = 0;
    for (int c = 0; c < k; c++) {
        float *ce = km->cent + (size_t)c * d;
        if (km->count[c] == 0) {
            any_empty = 1;
            continue;
        }
        for (int j = 0; j < d; j++) {
            const float v = (float)(km->sum[(size_t)c * d + j] / km->count[c]);
            shift += ((double)v - ce[j]) * ((double)v - ce[j]);
            ce[j] = v;
        }
    }
    if (!any_empty)
        return shift;
    memset(km->taken, 0, (size_t)km->n);
    for (int c = 0; c < k; c++) {
        if (km->count[c] != 0)
            continue;
        int far = -1;
        for (int i = 0; i < km->n; i++)
            if (!km->taken[i] && (far < 0 || km->pdist[i] > km->pdist[far]))
                far = i;
        if (far < 0)
            break; /* more empty clusters than points: they keep their place */
        km->taken[far] = 1;
        float *ce = km->cent + (size_t)c * d;
        shift += dist2(ce, point(km, far), d);
        memcpy(ce, point(km, far), sizeof(float) * d);
    }
    return shift;
}

/* sklearn's tolerance: tol times the mean over dimensions of the data's variance. */
static double abs_tol(const kmeans *km, double tol)
{
    if (tol <= 0)
        return -1;
    double total = 0;
    for (int j = 0; j < km->d; j++) {
        double mean = 0, sq = 0;
        for (int i = 0; i < km->n; i++)
            mean += point(km, i)[j];
        mean /= km->n;
        for (int i = 0; i < km->n; i++)
            sq += (point(km, i)[j] - mean) * (point(km, i)[j] - mean);
        total += sq / km->n;
    }
    return tol * total / km->d;
}

kvs_status kvs_pq_kmeans(const float *x, int n, size_t stride, int d, int k, int max_iters,
                         double tol, uint64_t seed, float *centroids, uint8_t *codes,
                         double *sse_trace, int *iters, kvs_error *err)
{
    if (n <= 0 || d <= 0 || k <= 0 || k > 256)
        return kvs_fail(err, KVS_ERR_ARG, "pq: K-Means of %d points of %d floats into %d "
                        "clusters (needs n > 0, d > 0, 0 < k <= 256)", n, d, k);
    kmeans km = {.x = x, .n = n, .d = d, .k = k, .stride = stride, .cent = centroids,
                 .code = codes};
    km.sum = malloc(sizeof(double) * (size_t)k * d);
    km.count = malloc(sizeof(int) * (size_t)k);
    km.pdist = malloc(sizeof(double) * (size_t)n);
    km.taken = malloc((size_t)n);
    km.t = (layout){.d = d, .k = k, .ct = malloc(sizeof(float) * (size_t)k * d),
                    .norm = malloc(sizeof(float) * (size_t)k)};
    kvs_status st = KVS_OK;
    if (!km.sum || !km.count || !km.pdist || !km.taken || !km.t.ct || !km.t.norm)
        st = kvs_fail(err, KVS_ERR_NOMEM, "pq: out of memory for K-Means over %d points", n);
    int it = 0;
    if (st == KVS_OK && (st = init_centroids(&km, seed, err)) == KVS_OK) {
        memset(codes, 0, (size_t)n);
        int changed;
        double sse = assign(&km, &changed);
        if (sse_trace)
            sse_trace[0] = sse;
        const double limit = abs_tol(&km, tol);
        while (it < max_iters) {
            const double shift = update(&km);
            sse = assign(&km, &changed);
            it++;
            if (sse_trace)
                sse_trace[it] = sse;
            if (changed == 0 || shift <= limit)
                break;
        }
    }
    if (iters)
        *iters = it;
    free(km.sum);
    free(km.count);
    free(km.pdist);
    free(km.taken);
    free(km.t.ct);
    free(km.t.norm);
    return st;
}

kvs_status kvs_pq_train(const kvs_pq_cfg *c, const float *x, int n, size_t stride,
                        float *centroids, uint8_t *codes, kvs_pq_stats *stats, kvs_error *err)
{
    if (c->m <= 0 || c->dim % c->m != 0 || c->bits < 1 || c->bits > 8)
        return kvs_fail(err, KVS_ERR_ARG, "pq: m=%d, bits=%d for vectors of %d floats (m must "
                        "divide the dimension; bits in [1, 8])", c->m, c->bits, c->dim);
    const int dm = c->dim / c->m, k = 1 << c->bits;
    float *cent = malloc(sizeof(float) * (size_t)k * dm);
    uint8_t *sub = malloc((size_t)(n > 0 ? n : 1));
    kvs_status st = cent && sub ? KVS_OK
                                : kvs_fail(err, KVS_ERR_NOMEM, "pq: out of memory for the "
                                           "codes of %d points", n);
    kvs_pq_stats total = {0, 0};
    for (int j = 0; j < c->m && st == KVS_OK; j++) {
        const uint64_t word = (uint64_t)j;
        int it = 0;
        st = kvs_pq_kmeans(x + (size_t)j * dm, n, stride, dm, k, c->max_iters, c->tol,
                           kvs_random_key(c->seed, &word, 1), cent, sub, NULL, &it, err);
        if (st != KVS_OK)
            break;
        memcpy(centroids + (size_t)j * k * dm, cent, sizeof(float) * (size_t)k * dm);
        for (int i = 0; i < n; i++) {
            codes[(size_t)i * c->m + j] = sub[i];
            total.sse += dist2(x + (size_t)i * stride + (size_t)j * dm,
                               cent + (size_t)sub[i] * dm, dm);
        }
        total.iters += it;
    }
    if (stats)
        *stats = total;
    free(cent);
    free(sub);
    return st;
}

/* ---- encoding, tables, scan ---- */

void kvs_pq_encode(const kvs_pq_cfg *c, const float *centroids, const float *x, uint8_t *code)
{
    const int dm = c->dim / c->m, k = 1 << c->bits;
    float ct[CHUNK * dm], norm[CHUNK]; /* one chunk at a time: a bounded stack */
    for (int j = 0; j < c->m; j++) {
        const float *cj = centroids + (size_t)j * k * dm;
        int best = -1;
        float best_val = 0;
        for (int c0 = 0; c0 < k; c0 += CHUNK) {
            chunk_fill(cj, dm, c0, chunk_len(k, c0), ct, norm);
            chunk_nearest(ct, norm, dm, c0, chunk_len(k, c0), x + (size_t)j * dm, &best,
                          &best_val);
        }
        code[j] = (uint8_t)best;
    }
}

void kvs_pq_lut(const kvs_pq_cfg *c, const float *centroids, const float *q, float *lut)
{
    const int dm = c->dim / c->m, k = 1 << c->bits;
    for (int j = 0; j < c->m; j++)
        for (int cc = 0; cc < k; cc++) {
            const float *ce = centroids + ((size_t)j * k + cc) * dm, *qj = q + (size_t)j * dm;
            float s = 0;
            for (int i = 0; i < dm; i++)
                s += qj[i] * ce[i];
            lut[j * k + cc] = s;
        }
}

void kvs_pq_scan(const float *lut, int m, int bits, const uint8_t *codes, int n, float *out)
{
    const int k = 1 << bits;
    if (m == 2) { /* the default: one pass, two table reads per token */
        const float *l0 = lut, *l1 = lut + k;
        for (int t = 0; t < n; t++)
            out[t] = l0[codes[2 * t]] + l1[codes[2 * t + 1]];
        return;
    }
    for (int t = 0; t < n; t++) {
        const uint8_t *ct = codes + (size_t)t * m;
        float s = 0;
        for (int j = 0; j < m; j++)
            s += lut[j * k + ct[j]];
        out[t] = s;
    }
}

/* ---- top-k ---- */

/* A float as an unsigned key in the same order: every NaN 0 (below -inf), -0 as +0 (a tie).
 * Branch-free, so that the loop over a step's scores vectorises. */
static inline uint32_t order_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* All ones when the sign bit is set: 0 - 1 in unsigned arithmetic, not (int32_t)u >> 31,
     * whose right shift of a negative value is implementation-defined (cppcheck). */
    uint32_t key = u ^ ((0u - (u >> 31)) | 0x80000000u);
    key = x == 0.0f ? 0x80000000u : key;
    return x != x ? 0u : key;
}

int kvs_topk(const float *scores, int n, int k, int *idx, uint32_t *keys)
{
    if (k <= 0 || n <= 0)
        return 0;
    if (k >= n) {
        for (int i = 0; i < n; i++)
            idx[i] = i;
        return n;
    }
    /* The threshold: the k-th largest key, by radix select over 11 + 11 + 10 bits (each round
     * histograms the keys that share the bits found so far, then walks the buckets from the
     * top until the count reaches what is still wanted). What is left wanted at the end is
     * the number of keys equal to the threshold to take, the lowest indices first; one more
     * pass writes the indices in ascending order, so nothing is sorted. */
    static const int shift[3] = {21, 10, 0};
    static const uint32_t mask[3] = {0x7ff, 0x7ff, 0x3ff};
    for (int i = 0; i < n; i++)
        keys[i] = order_key(scores[i]);
    uint32_t prefix = 0, prefix_mask = 0;
    int want = k;
    for (int r = 0; r < 3; r++) {
        int hist[2048] = {0};
        if (r == 0)
            for (int i = 0; i < n; i++)
                hist[keys[i] >> 21]++;
        else
            for (int i = 0; i < n; i++)
                if ((keys[i] & prefix_mask) == prefix)
                    hist[(keys[i] >> shift[r]) & mask[r]]++;
        int b = (int)mask[r];
        while (hist[b] < want)
            want -= hist[b--];
        prefix |= (uint32_t)b << shift[r];
        prefix_mask |= mask[r] << shift[r];
        if (hist[b] == want) { /* the whole bucket is taken: no tie to break inside it */
            int got = 0;
            for (int i = 0; i < n; i++)
                if ((keys[i] & prefix_mask) >= prefix)
                    idx[got++] = i;
            return got;
        }
    }
    int got = 0;
    for (int i = 0; i < n && got < k; i++)
        if (keys[i] > prefix || (keys[i] == prefix && want-- > 0))
            idx[got++] = i;
    return got;
}

int kvs_pq_adaptive_iters(double t_comp, double t_km3, double t_iter, int lo, int hi)
{
    if (!(t_iter > 0))
        return lo;
    const double t = floor((t_comp - t_km3) / t_iter + 3.0);
    return !(t >= lo) ? lo : t > hi ? hi : (int)t; /* (NaN: lo) */
}
