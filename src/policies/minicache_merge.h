/* MiniCache's per-unit math (minicache.md §2.4–2.6): merging two layers' vectors into one
 * direction with per-layer norms, and choosing the tokens kept exact. */
#ifndef KVS_MINICACHE_MERGE_H
#define KVS_MINICACHE_MERGE_H

#include <stdint.h>

typedef enum kvs_mc_merge { KVS_MC_SLERP, KVS_MC_MEAN, KVS_MC_FMAX } kvs_mc_merge;
typedef enum kvs_mc_retain {
    KVS_MC_RET_RANGE,   /* d > d_max - (d_max - d_min) * gamma (the spec's resolution, default) */
    KVS_MC_RET_LITERAL, /* Eq. 4 as printed: d < d_min + (d_max - d_min) * gamma */
    KVS_MC_RET_TOPFRAC, /* the ceil(gamma * N - 1e-9) largest d, ties to the lower index */
    KVS_MC_RET_ALL      /* test mode: every token */
} kvs_mc_retain;

/* Merges xa (layer a = l-1, shallower) and xb (layer b = l), D floats each, with interpolation
 * t (Eq. 3; swap != 0: Algorithm 2's swapped weights, A1). Writes e (D floats), the norms the two
 * layers restore with (*na, *nb) and the angle *omega in [0, pi]. For SLERP, e is a unit
 * direction and na, nb are ||xa||, ||xb|| (§2.4, with its degenerate fallbacks: never NaN).
 * For MEAN and FMAX, e is the stored vector itself (§2.5) and *na = *nb = ||e||, so that the
 * common restoration e * n / ||e|| gives e back unchanged; *omega is still the angle. A layer
 * whose norm is at most 2^-40 of the other's counts as zero (e takes the other direction,
 * *omega = 0); when both are exactly zero e = 0 and the norms are 0, so a restoration must read
 * ||e|| = 0 as "restore 0" (as it must for F_max's zero mean). Inputs and outputs are fp32, the
 * arithmetic in between double; deterministic, never NaN for finite inputs (minicache_merge.c). */
void kvs_mc_merge_unit(const float *xa, const float *xb, int D, float t, kvs_mc_merge fn,
                       int swap, float *e, float *na, float *nb, float *omega);

/* The retained tokens among n with angular distances d[i] = omega_i / pi (§2.6): writes their
 * indices, increasing, into idx (room for n) and returns the count. scratch: room for n ints
 * (used by TOPFRAC). n = 0 gives 0. */
int kvs_mc_retain_select(const float *d, int n, double gamma, kvs_mc_retain mode, int *idx,
                         int *scratch);

/* §3.1's paper formula for one sequence of n_tokens over n_layers layers of KV width h
 * (n_kv_heads * head_dim): n_layers * n_tokens * (3.1 * h + 2) bytes (fp16, S = L/2, 5%
 * retention, per-token norms), and the full fp16 cache 4 * n_layers * h * n_tokens. */
double kvs_mc_paper_bytes(int n_layers, int h, int64_t n_tokens);
double kvs_mc_full_f16_bytes(int n_layers, int h, int64_t n_tokens);

#endif
