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

/* One MPCache configuration (§2.5), as the policy's parameters give it. */
typedef struct kvs_mp_cfg {
    double keep;   /* static keep ratio of the prompt, (0, 1] */
    double window; /* observation window, a ratio of the prompt, (0, 1] */
    int s1, s2;    /* coarse and fine cluster sizes, s2 divides s1 */
    double rho1;   /* coarse keep fraction while eta < 0.5 (§6 item 9: 1 from eta 0.5 on) */
    double alpha;  /* SIM_LINEAR's weight of rmax */
    kvs_mp_sim sim;
    int levels;    /* 2: coarse then fine (the hierarchy); 1: fine clusters only */
    int share;     /* cross-layer index sharing in pairs (§2.4) */
    int skip;      /* with share: the first layers, which select for themselves */
    int pad;       /* data-independent counts: dummy slots pad the prompt to s1 (§2.3.4) */
    int ends;      /* also attend the first and the last clustered cluster (the authors' code) */
    int quant;     /* > 0: the static step ranks the window sums floored to multiples of 2^-quant
                    * (summed over the group's query heads), so ties fall to the lower position:
                    * the two-party engine's fixed-point ranking (frac bits), whose probabilities
                    * below 2^-frac are exact zeros; 0: full precision */
} kvs_mp_cfg;

/* The spec's defaults: keep 0.25, window 0.2, s1 32, s2 16, rho1 0.5, alpha 0.6, LINEAR,
 * 2 levels, sharing on with skip 2, padding on, ends off. */
kvs_mp_cfg kvs_mp_cfg_default(void);

/* Cross-layer sharing (§2.4, §6 item 7): whether layer selects for itself, and otherwise the
 * layer whose indices (and static keep set) it reuses. Without sharing, and below skip, every
 * layer selects; from skip on, layers pair up: skip, skip+2, ... select and the layer after each
 * reuses it. */
int kvs_mp_is_selector(const kvs_mp_cfg *c, int layer);
int kvs_mp_partner(const kvs_mp_cfg *c, int layer);

/* The dynamic ratio eta for an attended fraction `budget` of the prompt: budget = keep x eta
 * (§2.3.5), so eta = budget / keep, at most 1. */
double kvs_mp_eta(double budget, double keep);
/* rho1 in use: c->rho1 while eta < 0.5, else 1 (§6 item 9); 1 with one level. */
double kvs_mp_rho1(const kvs_mp_cfg *c, double eta);

/* The data-independent shape of one selection step of one KV head (§2.3.4 counts, with the
 * padding of §2.3.4 when c->pad): the prompt's n_kept statically kept slots are padded to a
 * multiple of s1, then `sealed` decode tokens follow (a multiple of s1: whole coarse clusters,
 * §2.3.6), then the tail (always attended, not clustered). */
typedef struct kvs_mp_shape {
    int C1;      /* coarse clusters (0 with one level) */
    int C2;      /* fine clusters holding a real token */
    int C2x;     /* fine clusters of the padded layout (C2 without padding) */
    int n1;      /* coarse clusters kept (0 with one level) */
    int n_cand;  /* fine candidates: n1 s1 / s2 with padding (an upper bound without: short
                  * clusters can have fewer children), C2x with one level */
    int n2;      /* fine clusters attended: clamp(ceil(eta C2), 1, n_cand) */
    int n_slots; /* attended cluster slots with padding, n2 s2 (dummies included) */
} kvs_mp_shape;

void kvs_mp_shape_of(const kvs_mp_cfg *c, double eta, int n_kept, int sealed, kvs_mp_shape *out);

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

/* The same without allocating: scratch holds kvs_mp_topk_scratch(n) bytes; 0 <= k <= n. */
size_t kvs_mp_topk_scratch(int n);
void kvs_mp_topk_with(const double *score, int n, int k, int *idx, void *scratch);

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

/* qs[i] = the sum over the G query heads q[h * d + i] of one KV head, in double (GQA_SUM). */
void kvs_mp_qsum(const float *q, int G, int d, double *qs);

/* One cluster's score from its box (LINEAR: qs . (alpha mx + (1 - alpha) mn); UB: sum over
 * channels of max(qs_i mn_i, qs_i mx_i)), or from its rows of keys (MEAN: qs . the mean key;
 * MAXDOT: the largest qs . k), in double, channels in order (§2.3.3). */
double kvs_mp_score_box(kvs_mp_sim mode, const double *qs, int d, const float *mn,
                        const float *mx, double alpha);
double kvs_mp_score_keys(kvs_mp_sim mode, const double *qs, int d, const float *k, int rows);

/* Scores of the C = ceil(n / s) clusters of s adjacent rows of k (n rows of d floats) for the
 * G query heads q[h * d + i] of one KV head: qs = kvs_mp_qsum, then the mode's score.
 * rmin / rmax: the clusters' boxes (LINEAR, UB; may be NULL otherwise); k: the keys (MEAN,
 * MAXDOT; may be NULL otherwise). alpha: LINEAR's weight. out: C doubles. KVS_ERR_NOMEM. */
kvs_status kvs_mp_cluster_scores(kvs_mp_sim mode, const float *q, int G, int d, const float *k,
                                 int n, int s, const float *rmin, const float *rmax,
                                 double alpha, double *out, kvs_error *err);

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

/* The commonality score of §2.4 as printed: CS(m) = 1 / (k (L - m)) x the sum over layers
 * l < L - m of |the intersection of sets[l..l+m]|, the m + 1 layers' top-k sets (k distinct
 * indices each, ascending). m = 1 compares pairs of adjacent layers. In [0, 1]; 1 when every
 * layer has the same set. NaN unless 1 <= m < L and k >= 1. */
double kvs_mp_commonality(const int *const *sets, int L, int k, int m);

#endif
