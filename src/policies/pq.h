/* Product quantisation (pqcache.md §2.2, §2.5, §6 items 4-8, 14): seeded Lloyd K-Means per
 * sub-space, nearest-centroid encoding, the per-query lookup table, the gather-add scan over
 * codes, top-k selection and the adaptive iteration cap. Pure functions of their arguments:
 * no threads, no global state, bit-identical for equal inputs. */
#ifndef KVS_PQ_H
#define KVS_PQ_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct kvs_pq_cfg {
    int dim;       /* vector length; m divides it (d_m = dim / m) */
    int m;         /* sub-spaces */
    int bits;      /* 1..8: 2^bits centroids per sub-space, codes one byte each */
    int max_iters; /* Lloyd updates at most (0: the initial sample's assignment only) */
    double tol;    /* stop when the summed squared centroid shift is at most tol times the
                    * mean per-dimension variance of the data (sklearn's rule; 0: never) */
    uint64_t seed; /* sub-space j's initial sample is keyed by (seed, j) */
} kvs_pq_cfg;

typedef struct kvs_pq_stats {
    int iters;  /* Lloyd updates run, summed over the m sub-spaces */
    double sse; /* within-cluster sum of squares of the final assignment, summed */
} kvs_pq_stats;

/* One K-Means run over n points of d floats (point i at x + i * stride floats) into k
 * clusters: the initial centroids are k points of distinct value taken in the order of a
 * seeded permutation (duplicates only when the data has fewer than k distinct points), then
 * Lloyd updates until max_iters, no assignment changes, or the shift is within tol (as in
 * kvs_pq_cfg); an empty cluster moves onto the point farthest from its centroid (lowest index
 * on ties, each point taken once). The assignment is always recomputed after the last update,
 * so that kvs_pq_encode gives the same codes. Writes k * d centroids (row-major) and n codes;
 * sse_trace (optional, max_iters + 1 entries) gets the SSE after each assignment, the initial
 * one first; *iters the updates run. n must exceed 0 and k must be at most 256. */
kvs_status kvs_pq_kmeans(const float *x, int n, size_t stride, int d, int k, int max_iters,
                         double tol, uint64_t seed, float *centroids, uint8_t *codes,
                         double *sse_trace, int *iters, kvs_error *err);

/* Trains one head's quantiser: sub-space j of every point (dims [j d_m, (j + 1) d_m)) is
 * clustered on its own. centroids: m * 2^bits * d_m floats, [j][c][0..d_m); codes: n * m
 * bytes, point-major. stats may be NULL. */
kvs_status kvs_pq_train(const kvs_pq_cfg *c, const float *x, int n, size_t stride,
                        float *centroids, uint8_t *codes, kvs_pq_stats *stats, kvs_error *err);

/* The m codes of one vector: per sub-space the nearest centroid (Euclidean, lowest index on
 * ties), computed exactly as K-Means assigns. */
void kvs_pq_encode(const kvs_pq_cfg *c, const float *centroids, const float *x, uint8_t *code);

/* lut[j * 2^bits + c] = q^(j) . C_j[c]: the query's dot product with every centroid. */
void kvs_pq_lut(const kvs_pq_cfg *c, const float *centroids, const float *q, float *lut);

/* out[t] = sum_j lut[j * 2^bits + codes[t * m + j]] for t < n: q . k^ of every coded key. */
void kvs_pq_scan(const float *lut, int m, int bits, const uint8_t *codes, int n, float *out);

/* The k highest scores' indices (all n when k >= n; NaN ranks lowest; ties to the lower
 * index; -0 ties with +0), written to idx in ascending index order; scratch holds n keys.
 * Returns the count, min(k, n) (0 when k <= 0). O(n): a radix-selected threshold, then a
 * pass. */
int kvs_topk(const float *scores, int n, int k, int *idx, uint32_t *scratch);

/* The iteration cap that fits a layer's clustering into its prefill compute (§2.3, §6 item
 * 8): floor((t_comp - t_km3) / t_iter + 3) clipped to [lo, hi], where t_km3 is the time of a
 * 3-iteration run and t_iter that of one more iteration; lo when t_iter <= 0. */
int kvs_pq_adaptive_iters(double t_comp, double t_km3, double t_iter, int lo, int hi);

#endif
