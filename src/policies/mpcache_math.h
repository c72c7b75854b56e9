/* MPCache's per-head math (methods/mpcache.md §2.2-2.5, §3.5): static scores and keep set,
 * cluster bounding boxes, cluster similarity scores, hierarchical cluster selection, op counts. */
#ifndef KVS_MPCACHE_MATH_H
#define KVS_MPCACHE_MATH_H

#include <stdint.h>

#include "core/error.h"

/* Cluster similarity (§2.3.3). qs = the sum of the group's query heads (§6 item 6, GQA_SUM). */
typedef enum kvs_mp_sim {
    KVS_MP_SIM_LINEAR, /* Eq. 2: qs . (alpha rmax + (1 - alpha) rmin), the default */
    KVS_MP_SIM_MEAN,   /* qs . mean of the cluster's keys */
    KVS_MP_SIM_MAXDOT, /* exact max over the cluster's keys of qs . k */
    KVS_MP_SIM_UB      /* Eq. 1: sum over channels of max(qs_i rmin_i, qs_i rmax_i) */
} kvs_mp_sim;

/* ceil(ratio * n - 1e-9) clamped to [1, n] (n >= 1; n <= 0 gives 0): the window w (ratio 0.2),
 * the static keep count (keep_ratio), n1 (rho1 of C1). The 1e-9 absorbs ratios such as 0.7 that
 * are not exact in binary (0.7 * 10 would otherwise round up to 8). */
int kvs_mp_ceil_count(double ratio, int n);

/* Clusters of s adjacent slots over n slots: ceil(n / s) (the last may be short). */
int kvs_mp_n_clusters(int n, int s);

/* §6 item 9: rho1 = 0.5 if eta < 0.5, else 1 (a single effective level). */
double kvs_mp_default_rho1(double eta);

/* The indices of the k largest of score[0..n), ties to the lower index, NaN below every number,
 * written ascending into idx (room for k). 0 <= k <= n. KVS_ERR_ARG / KVS_ERR_NOMEM. */
kvs_status kvs_mp_topk_asc(const double *score, int n, int k, int *idx, kvs_error *err);

/* Static-step scores for one KV head (§2.2 steps 2-3, §6 items 3, 6): q holds the G query
 * heads' post-RoPE queries of the last w prompt positions, q[(h * w + r) * d + i] for position
 * P - w + r; k the P post-RoPE keys, k[j * d + i]. score[j] (P doubles) = the sum over rows and
 * heads of the causal softmax probability softmax_j'<=p(q . k_j' / sqrt(d)) of key j, computed
 * in double. 1 <= w <= P, G >= 1, d >= 1. KVS_ERR_ARG / KVS_ERR_NOMEM. */
kvs_status kvs_mp_static_scores(const float *q, int G, int w, const float *k, int P, int d,
                                double *score, kvs_error *err);

/* The static step end to end: w = kvs_mp_ceil_count(win_ratio, P), scores as above, then the
 * kept set, n_keep = kvs_mp_ceil_count(keep_ratio, P) positions by score, ties to the lower
 * position, ascending into keep (room for P). q has G * w rows as above, so the caller must pass
 * the queries of exactly kvs_mp_ceil_count(win_ratio, P) positions. Returns the count in
 * *n_keep. KVS_ERR_ARG / KVS_ERR_NOMEM. */
kvs_status kvs_mp_static_keep(const float *q, int G, const float *k, int P, int d,
                              double win_ratio, double keep_ratio, int *keep, int *n_keep,
                              kvs_error *err);

/* Bounding boxes of the ceil(n / s) clusters of s adjacent rows of k (n rows of d floats; the
 * last cluster is rows [c s, n), possibly short): rmin[c * d + i], rmax[c * d + i] = min and max
 * of k[j * d + i] over the cluster's rows (§2.3.2). n >= 1, s >= 1. */
void kvs_mp_cluster_bounds(const float *k, int n, int d, int s, float *rmin, float *rmax);

/* Coarse boxes from fine ones (§2.3.4 resolution): coarse cluster c covers fine clusters
 * [c r, min((c + 1) r, C2)) with r = s1 / s2; rmin1 / rmax1 get ceil(C2 / r) boxes of d floats.
 * Equals kvs_mp_cluster_bounds with s1 when s2 divides s1. */
void kvs_mp_coarse_bounds(const float *rmin2, const float *rmax2, int C2, int d, int r,
                          float *rmin1, float *rmax1);

/* Scores of the C = ceil(n / s) clusters of s adjacent rows of k (n rows of d floats) for the
 * G query heads q[h * d + i] of one KV head, in double (§2.3.3): qs = sum of the heads, then the
 * mode's score. rmin / rmax: the clusters' boxes (LINEAR, UB; may be NULL otherwise); k: the keys
 * (MEAN, MAXDOT; may be NULL otherwise). alpha: LINEAR's weight. out: C doubles. */
void kvs_mp_cluster_scores(kvs_mp_sim mode, const float *q, int G, int d, const float *k, int n,
                           int s, const float *rmin, const float *rmax, double alpha,
                           double *out);

/* Hierarchical selection (§2.3.4, §2.5) over n kept slots with fine clusters of s2 and coarse
 * clusters of s1 (s2 divides s1; C1 = ceil(n / s1), C2 = ceil(n / s2)): n1 = ceil(rho1 C1)
 * coarse clusters by sc1 (C1 doubles), then n2 = clamp(ceil(eta C2), 1, |cand|) fine clusters
 * by sc2 (C2 doubles) among the children of the chosen coarse ones; ties to the lower cluster
 * index. Writes the chosen fine clusters ascending into fine (room for C1 * s1 / s2, or NULL)
 * and their slots ascending into slots (room for C1 * s1); *n_fine = n2, *n_slots = the slot
 * count.
 * pad != 0 (§2.3.4's data-independent option): the slots are padded with dummies to C1 s1, so
 * every coarse cluster has s1 / s2 children and |cand| = n1 s1 / s2; wholly dummy fine clusters
 * score below every real one; slots >= n in the output are dummies the caller must mask (key
 * logit -inf), and *n_slots = n2 s2 always, a function of (n, s1, s2, rho1, eta) only.
 * n >= 1, 1 <= s2, s1 % s2 == 0, rho1 and eta in (0, 1]. KVS_ERR_ARG / KVS_ERR_NOMEM. */
kvs_status kvs_mp_select(const double *sc1, const double *sc2, int n, int s1, int s2,
                         double rho1, double eta, int pad, int *fine, int *n_fine, int *slots,
                         int *n_slots, kvs_error *err);

/* §3.5's op-count model, per decode step, layer and KV head. */
typedef struct kvs_mp_ops {
    int64_t sim_mults;   /* similarity multiplications */
    int64_t sim_max_ops; /* max ops in the similarity (UB only) */
    int64_t topk_len1;   /* top-k input length, level 1 (C1) */
    int64_t topk_len2;   /* top-k input length, level 2 (n_cand) */
    int64_t gather_eq;   /* gather equality tests (n2 * n_cand, on log2 C bits) */
    int64_t softmax_len; /* attended tokens k = n_slots + tail */
    int64_t attn_mults;  /* qK and PV multiplications, 2 k d */
} kvs_mp_ops;

/* Fills *ops for a selector layer (selector != 0) or a sharing layer (0 selection ops, the same
 * attended count) with C1 coarse clusters, n_cand fine candidates, n2 chosen fine clusters,
 * n_slots attended cluster slots, tail always-attended tokens and head dim d. LINEAR and MEAN
 * cost one d-dim dot per scored cluster; UB costs two products and one max per channel (§3.2);
 * MAXDOT costs one d-dim dot and one max per key of the scored clusters, counted as
 * C1 s1 + n_cand s2 keys (an upper bound when the last cluster is short). */
void kvs_mp_op_counts(kvs_mp_sim mode, int selector, int C1, int n_cand, int n2, int n_slots,
                      int tail, int d, int s1, int s2, kvs_mp_ops *ops);

#endif
