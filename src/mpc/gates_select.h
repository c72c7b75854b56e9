/* Selection gates of the two-party engine (for MPCache in 2PC, issue 13): a secret index as a
 * one-hot vector, top-k as a selection mask, and the ordered gather matrix of a mask.
 * Conventions as gates.h: all three roles call each gate in the same order, the dealer with
 * NULL data pointers (same shapes); counts (k, lengths) are public, which entries are chosen
 * stays secret; each gate equals its plaintext emulator bit for bit (tests/test_mpc_select.c). */
#ifndef KVS_MPC_GATES_SELECT_H
#define KVS_MPC_GATES_SELECT_H

#include "mpc/gates.h"

/* out[i][j] = [idx[i] == j] for j < 2^bits (out: n x 2^bits shares), for secret indices
 * 0 <= idx[i] < 2^bits (1 <= bits <= 16): the dealer shares a random r_i and the one-hot of
 * r_i; the parties open c_i = (idx[i] - r_i) mod 2^bits (ceil(bits/8) bytes each way, one round)
 * and rotate the one-hot by c_i, locally. Dealer: 2^bits + 1 words per index to party 1. */
kvs_status kvs_mpc_onehot(kvs_mpc *m, kvs_mpc_op op, const uint64_t *idx, size_t n, int bits,
                          uint64_t *out, kvs_error *err);

/* The k largest of each of rows rows of len values (v: rows x len, len >= 1, k <= len), as a
 * mask sel (rows x len shares of 0 or 1, exactly k ones a row): ties go to the lower index, as
 * MPCache's spec asks. Every pair of a row is compared once (i < j: [v_i >= v_j], one batch of
 * rows len (len - 1) / 2 sign tests over `bits` bits, for |v_i - v_j| < 2^(bits-1)); a value's
 * rank is the number of values that beat it, summed locally; sel = [rank < k] by one more batch
 * of sign tests over ceil(log2 len) + 2 bits. Two rounds in all, whatever k and len (a sorting
 * network would take about log^2 len); the price is len^2 / 2 comparisons a row, cheap at the
 * cluster counts MPCache selects among. */
kvs_status kvs_mpc_topk_mask(kvs_mpc *m, kvs_mpc_op op, const uint64_t *v, size_t rows,
                             size_t len, size_t k, int bits, uint64_t *sel, kvs_error *err);

/* The same mask by a threshold, for long rows (MPCache's static step and the token-level
 * baseline select among thousands): the k-th largest value theta of each row is found bit by bit
 * (bits - 1 steps, each one batch of len sign tests [v_i >= candidate] and one test of their
 * count against k: two rounds), then the values above theta and the first (k - their count) of
 * the values equal to it, by index, are kept (three more rounds). For v in
 * [-2^(bits-2), 2^(bits-2)); 2 bits + 1 rounds and about (bits + 2) len comparisons a row,
 * against len^2 / 2 for kvs_mpc_topk_mask. Equal to kvs_fx_topk_mask. */
kvs_status kvs_mpc_topk_threshold(kvs_mpc *m, kvs_mpc_op op, const uint64_t *v, size_t rows,
                                  size_t len, size_t k, int bits, uint64_t *sel,
                                  kvs_error *err);

/* The gather matrix of a selection mask: G[r][p][i] = 1 when entry i of row r is the p-th
 * selected one in index order (p < k), else 0 (sel: rows x len of 0 or 1 with k ones a row;
 * G: rows x k x len). The position of entry i among the selected is the prefix count of sel
 * (local), its one-hot over ceil(log2(k + 1)) bits comes from kvs_mpc_onehot, and a product
 * with sel keeps the selected entries: two rounds. G times a matrix gathers its selected rows in
 * order (the secret cache's kvs_mpc_cache_pv takes such rows). */
kvs_status kvs_mpc_gather_matrix(kvs_mpc *m, kvs_mpc_op op, const uint64_t *sel, size_t rows,
                                 size_t len, size_t k, uint64_t *G, kvs_error *err);

/* MPCache's cluster representatives (its linear score's bound): for n clusters of s rows of d
 * values (x: n x s x d, fixed point at m->frac), rep[c][i] = alpha max_j x[c][j][i] +
 * (1 - alpha) min_j x[c][j][i], truncated once (alpha: public, fixed point at m->frac). The
 * maxima and minima (the maxima of -x) go through one max tree over 2 n d rows of s values
 * (ceil(log2 s) levels of two rounds, sign tests over `bits` bits for |x_j - x_j'| <
 * 2^(bits-1)); the weighting is local, the truncation one round. Done once per sealed
 * cluster: the score q . rep is then a product with the representatives, no comparison. */
kvs_status kvs_mpc_cluster_reps(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, size_t s,
                                size_t d, uint64_t alpha, int bits, uint64_t *rep,
                                kvs_error *err);

/* The plaintext emulators (values as they are reconstructed: two's complement in Z_2^64). */
void kvs_fx_topk_mask(const uint64_t *v, size_t rows, size_t len, size_t k, uint64_t *sel);
void kvs_fx_gather_matrix(const uint64_t *sel, size_t rows, size_t len, size_t k, uint64_t *G);
void kvs_fx_cluster_reps(const uint64_t *x, size_t n, size_t s, size_t d, uint64_t alpha,
                         int frac, uint64_t *rep);

#endif
