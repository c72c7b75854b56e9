/* The two-party engine's arithmetic gates on additive shares over Z_2^64: sharing an input,
 * opening, local affine maps, Beaver products, products with the server's private weights
 * (a fixed mask per matrix), and exact fixed-point truncation (an FSS gate on the masked
 * value). Every gate is called by the parties with their shares and by the dealer with no data
 * (NULL pointers, the same shapes): the dealer's call produces the gate's correlated randomness.
 * Each gate equals its plaintext emulator (fxp.h) bit for bit on the reconstructed values. */
#ifndef KVS_MPC_GATES_H
#define KVS_MPC_GATES_H

#include "mpc/mpc.h"

/* owner's n values x become shares: the owner keeps x - s and sends s, drawn from its private
 * stream (op KVS_OP_INPUT). The other party passes x = NULL. share may alias x. */
kvs_status kvs_mpc_input(kvs_mpc *m, int owner, const uint64_t *x, size_t n, uint64_t *share,
                         kvs_error *err);

/* Both parties learn the n values (each sends its share; one round). */
kvs_status kvs_mpc_open(kvs_mpc *m, kvs_mpc_op op, const uint64_t *share, size_t n,
                        uint64_t *out, kvs_error *err);

/* The wire form of n values of `bits` bits (an opening of masked values reduced mod 2^bits):
 * ceil(bits/8) little-endian bytes a value, the bits above `bits` filled from the party's
 * private stream, so that every byte on the wire is uniform (the receiver drops them: unpack).
 * out: n * ceil(bits/8) bytes. */
void kvs_mpc_pack(kvs_mpc *m, const uint64_t *v, size_t n, int bits, uint8_t *out);
/* Value i of a packed buffer, reduced mod 2^bits. */
uint64_t kvs_mpc_unpack(const uint8_t *in, size_t i, int bits);
/* c = (x0 + x1) mod 2^bits for shares x (parties; the dealer returns at once): each party sends
 * its share packed (kvs_mpc_pack: ceil(bits/8) bytes a value, random filler above bits), one
 * round. c may alias x. */
kvs_status kvs_mpc_open_bits(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                             uint64_t *c, kvs_error *err);

/* Only party `to` learns the n values: the other party sends its shares (half a round); out:
 * party `to` only. */
kvs_status kvs_mpc_reveal(kvs_mpc *m, kvs_mpc_op op, int to, const uint64_t *share, size_t n,
                          uint64_t *out, kvs_error *err);

/* z = x y elementwise mod 2^64 (no truncation): one Beaver triple each, one round. z may
 * alias x or y. */
kvs_status kvs_mpc_mul(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, const uint64_t *y,
                       size_t n, uint64_t *z, kvs_error *err);

/* Z (r x n) = X (r x k) Y (k x n) mod 2^64 for two shared matrices (no truncation): one matrix
 * triple; X - A and Y - B opened in one message (r k + k n words each way), one round. Z must
 * not alias X or Y. */
kvs_status kvs_mpc_matmul(kvs_mpc *m, kvs_mpc_op op, const uint64_t *X, const uint64_t *Y,
                          size_t r, size_t k, size_t n, uint64_t *Z, kvs_error *err);
/* batch independent products Z[b] = X[b] Y[b] (X: batch x r x k, Y: batch x k x n, Z:
 * batch x r x n): one matrix triple each, all openings in one message, one round. */
kvs_status kvs_mpc_matmul_batch(kvs_mpc *m, kvs_mpc_op op, const uint64_t *X,
                                const uint64_t *Y, size_t batch, size_t r, size_t k, size_t n,
                                uint64_t *Z, kvs_error *err);

/* x = floor(x / 2^f) of each signed value, exactly, for |x| < 2^62: the parties open
 * c = x + 2^62 + r for a dealer mask r (one round, 8 bytes each way per value); one DCF over f
 * bits gives the borrow of the low bits (Boyle et al. 2021), and since x + 2^62 < 2^63 the wrap
 * of c is msb(r) and not msb(c) — a dealer share of msb(r), no comparison (the known-MSB
 * truncation of SIRNN/Cheetah). Dealer: one DCF key over f bits to each party, two words to
 * party 1. */
kvs_status kvs_mpc_trunc(kvs_mpc *m, kvs_mpc_op op, uint64_t *x, size_t n, int f,
                         kvs_error *err);

/* Comparisons (gates_cmp.c). d = [x >= 0] as 0 or 1, for x in [-2^(bits-1), 2^(bits-1)) (bits
 * in [2, 64]; the shares are reduced mod 2^bits locally): the parties open c = (x + r) mod 2^bits
 * (ceil(bits/8) bytes each way, one round); the sign of x is the top bit of c xor the top bit of
 * r xor the borrow of the low bits, [c mod 2^(bits-1) < r mod 2^(bits-1)], which one DCF over
 * bits - 1 bits gives with the dealer's choice of beta = +-1 folding in r's top bit (Boyle et
 * al. 2021). Fewer bits: smaller keys and messages (the main lever; see ANCHORS.md). */
kvs_status kvs_mpc_nonneg_bits(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n,
                               int bits, uint64_t *d, kvs_error *err);
/* The same over the whole ring (bits = 64). */
kvs_status kvs_mpc_nonneg(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *d,
                          kvs_error *err);
/* z = c ? a : b for bits c (0 or 1): b + c (a - b), one product (one round). z may alias. */
kvs_status kvs_mpc_select(kvs_mpc *m, kvs_mpc_op op, const uint64_t *c, const uint64_t *a,
                          const uint64_t *b, size_t n, uint64_t *z, kvs_error *err);
/* z = max(a, b) elementwise, for |a - b| < 2^(bits-1) (the sign test's width): two rounds. */
kvs_status kvs_mpc_max2(kvs_mpc *m, kvs_mpc_op op, const uint64_t *a, const uint64_t *b,
                        size_t n, int bits, uint64_t *z, kvs_error *err);
/* The maximum of each of rows rows of len values (x: rows x len), by a tree of max2 over the
 * rows at once: ceil(log2 len) levels of two rounds. out: rows values. */
kvs_status kvs_mpc_max_rows(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t rows,
                            size_t len, int bits, uint64_t *out, kvs_error *err);

/* The index of the maximum of each of rows rows of len values (x: rows x len; the first on
 * ties), as shares, and the maximum itself (max may be NULL): a tree over (value, index) pairs,
 * each level one sign test over `bits` bits and one product selecting both (two rounds a
 * level). For greedy decoding: only the chosen token need be revealed. */
kvs_status kvs_mpc_argmax_rows(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t rows,
                               size_t len, int bits, uint64_t *idx, uint64_t *max,
                               kvs_error *err);

/* A weight matrix W (k x n, row-major, fixed point) owned by party 1. Party 1 keeps W and the
 * mask B (from its stream shared with the dealer, which keeps B too); party 0 keeps only
 * Wm = W - B, which party 1 sends once (op KVS_OP_INPUT): B is uniform and never reused for
 * another matrix, so Wm tells party 0 nothing, and the same B serves every token (the dealer's
 * per-product correlation is A B for a fresh A). */
typedef struct kvs_mpc_weight {
    size_t k, n;
    uint64_t *W;  /* party 1 */
    uint64_t *B;  /* party 1 and the dealer */
    uint64_t *Wm; /* party 0 */
} kvs_mpc_weight;

/* Sets up w from party 1's W (k x n; the others pass NULL). */
kvs_status kvs_mpc_weight_setup(kvs_mpc *m, kvs_mpc_weight *w, size_t k, size_t n,
                                const uint64_t *W, kvs_error *err);
void kvs_mpc_weight_free(kvs_mpc_weight *w);

/* y (rows x n) = x (rows x k) W mod 2^64, x shared: party 0 sends x0 - A (rows x k words, half
 * a round); no truncation. */
kvs_status kvs_mpc_matmul_w(kvs_mpc *m, const kvs_mpc_weight *w, const uint64_t *x,
                            size_t rows, uint64_t *y, kvs_error *err);

#endif
