/* Correlated randomness from the dealer (seed-compressed where it can be): each function is
 * called by all three roles in the same order. Party 0's part is drawn from the stream it shares
 * with the dealer; party 1's too, except one correction per output, which the dealer computes
 * and sends; FSS keys cannot be compressed and travel whole to both parties. The dealer passes
 * NULL for outputs it does not keep. Messages from the dealer carry the op of the gate they serve,
 * so the dealer link's counters break the offline bytes down by op; m->dealer_bytes counts them
 * all. */
#ifndef KVS_MPC_CORR_H
#define KVS_MPC_CORR_H

#include "mpc/mpc.h"

/* n Beaver triples: shares of a, b and c = a b (mod 2^64), elementwise. */
kvs_status kvs_corr_triples(kvs_mpc *m, kvs_mpc_op op, size_t n, uint64_t *a, uint64_t *b, uint64_t *c,
                            kvs_error *err);

/* A matrix Beaver triple: shares of A (r x k), B (k x n) and C = A B (r x n), row-major. Party 0
 * draws all three from its stream, party 1 A and B, and C as r x n corrections from the
 * dealer. */
kvs_status kvs_corr_matrix_triple(kvs_mpc *m, kvs_mpc_op op, size_t r, size_t k, size_t n,
                                  uint64_t *A, uint64_t *B, uint64_t *C, kvs_error *err);

/* The fixed mask B (k x n, row-major) of one weight matrix of party 1: drawn from party 1's
 * stream by party 1 and the dealer (party 0 draws nothing). Call once per matrix. */
void kvs_corr_weight_mask(kvs_mpc *m, size_t k, size_t n, uint64_t *B);

/* For a product of a shared (rows x k) matrix and a weight masked by B: party 0 gets A (rows x k)
 * and C (rows x n) from its stream, party 1 gets C = A B - C0 (rows x n) from the dealer. */
kvs_status kvs_corr_matmul(kvs_mpc *m, kvs_mpc_op op, size_t rows, size_t k, size_t n, const uint64_t *B,
                           uint64_t *A, uint64_t *C, kvs_error *err);

/* count random masks: party b gets its share from its stream, the dealer r = r0 + r1. */
void kvs_corr_masks(kvs_mpc *m, size_t count, uint64_t *r);

/* Shares of count values the dealer knows (v, dealer only): party 0's from its stream, party
 * 1's as corrections v - s0 from the dealer. */
kvs_status kvs_corr_shares(kvs_mpc *m, kvs_mpc_op op, size_t count, const uint64_t *v, uint64_t *share,
                           kvs_error *err);

/* count DCF key pairs over nbits (fss.h): f_i(x) = beta[i] if x < alpha[i], else 0 (alpha,
 * beta: dealer only). Party b receives its count keys, kvs_dcf_key_bytes(nbits) each, into
 * keys. */
kvs_status kvs_corr_dcf(kvs_mpc *m, kvs_mpc_op op, int nbits, size_t count, const uint64_t *alpha,
                        const uint64_t *beta, uint8_t *keys, kvs_error *err);

/* The same for DPF key pairs (f_i(x) = beta[i] if x == alpha[i]). */
kvs_status kvs_corr_dpf(kvs_mpc *m, kvs_mpc_op op, int nbits, size_t count, const uint64_t *alpha,
                        const uint64_t *beta, uint8_t *keys, kvs_error *err);

#endif
