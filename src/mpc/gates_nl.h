/* The two-party engine's non-linear gates on additive shares over Z_2^64: a DPF table lookup on
 * a masked input, and from it and the arithmetic gates (gates.h) exp on x <= 0, 1/x, SiLU and
 * 1/sqrt(x). Conventions as gates.h: all three roles call each gate in the same order, the dealer
 * with NULL data pointers (same shapes); x and out may alias; each gate equals its plaintext
 * emulator (fxp_nl.h) bit for bit on the reconstructed values, and the emulator is within the
 * error bound stated here of the true function (decoded output against the function of the
 * decoded input; f = m->frac, an ulp is 2^-f).
 *
 * Costs per value (tests/test_mpc_nl.c checks them; "online" is what each party sends to the
 * other, excluding message headers; "dealer" is what party 0 / party 1 receive from the dealer:
 * FSS keys to both, one extra word to party 1 per Beaver triple and per truncation; DCF and DPF
 * key sizes are in fss.h):
 *   lut (nbits)   1 round,  ceil(nbits/8) bytes; dealer: one DPF key over nbits to each party
 *                 (106, 203, 284 bytes at 5, 11, 16 bits).
 *   exp_neg       4 rounds, 34 bytes;  dealer 1925 / 1957 bytes at f = 12, 2022 / 2054 at 16
 *                 (64-bit clip test; f + 12 bits in softmax: smaller).
 *   silu          6 rounds, 74 bytes at f = 12, 76 at 16 (sign tests over f + 20 bits);
 *                 dealer 2224 / 2296 at f = 12, 2612 / 2684 at 16.
 *   recip         1 + 4 iters rounds (13 at f <= 14, 17 above), 20 ceil((f + 21)/8) + 48 iters
 *                 bytes (244 at f = 12, 292 at 16); dealer 17890 / 18194 at f = 12, 21236 /
 *                 21588 at 16.
 *   rsqrt         1 + 5 iters rounds (16), (f + 20) ceil((f + 21)/8) + 64 iters bytes (352 at
 *                 f = 12, 372 at 16); dealer 28438 / 28862 at f = 12, 36003 / 36459 at 16.
 * The sign tests of recip and rsqrt dominate their dealer bytes; they are all in one batch, so
 * they cost one round. Truncations take one DCF over f bits (gates.h). */
#ifndef KVS_MPC_GATES_NL_H
#define KVS_MPC_GATES_NL_H

#include "mpc/mpc.h"

#define KVS_MPC_LUT_MAX_BITS 16

/* out = table[x mod 2^nbits], table: 2^nbits public entries, 1 <= nbits <= 16 (the dealer may
 * pass table = NULL). The dealer draws a mask r and gives the parties shares of it and a DPF key
 * pair for the point r mod 2^nbits with value 1; the parties open c = (x + r) mod 2^nbits and
 * evaluate kvs_lut_eval (fss.h): one round. Wire format: each party sends its share of
 * (x + r) mod 2^nbits as ceil(nbits/8) little-endian bytes per value, the values consecutive, in
 * one message tagged op. */
kvs_status kvs_mpc_lut(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int nbits,
                       const uint64_t *table, uint64_t *out, kvs_error *err);

/* out ~ exp(x) for x <= 0 (6 <= f <= 40): x is clipped below at -16 (max2 against the shared
 * constant -16: two rounds), truncated to 6 fraction bits (one round), and the index i in
 * [-1024, 0] looked up (11 bits, one round) in a table of exp((i + 1/2)/64) (the middle of the
 * cell; 1 at i = 0): no interpolation. Error: |out - exp(x)| <= exp(max(x, -16)) (e^(1/128) - 1)
 * + 2^-(f+1) < 0.00785 exp(max(x, -16)) + 2^-(f+1) for every x <= 0 (the 1/128 is half the
 * input cell; below -16 the output is 0 for f <= 16). For 0 < x < 16 the output is 1. bits:
 * the clip's sign test width, the caller's promise that |x + 16| < 2^(bits-1) in fixed point
 * (64: any x; softmax's shifted scores, above -2^11, take f + 12). */
kvs_status kvs_mpc_exp_neg(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                           uint64_t *out, kvs_error *err);

/* out ~ 1/x for x in [1, 2^20) (1 <= f <= 20): one batch of 20 sign tests [x >= 2^j], j = 1..20
 * (one round, over f + 21 bits), the bucket guess 1/(1.5 2^j) of x in [2^j, 2^(j+1)) formed locally from them, then
 * iters Newton steps y <- y (2 - x y) with exact truncations (two products, two truncations,
 * four rounds each), iters = 3 for f <= 14, 4 above: the iteration's relative error from the
 * guess is at most 3^-(2^iters) < 2^-(f-2), and each step's two floors add at most one ulp
 * either way. Error: |out - 1/x| <= 2^-(f-2) / x + 2 2^-f; the relative error is below 2^-(f-2)
 * for x in [1, 2) only: beyond, 1/x has fewer than 2^(f-1) ulps and the output's resolution
 * dominates (1/x is under one ulp for x > 2^f). */
kvs_status kvs_mpc_recip(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                         kvs_error *err);

/* out ~ x sigmoid(x) (6 <= f <= 30, |x| < 2^(62 - 2f)): [x >= -8] and [x >= 8] in one batch of
 * sign tests (one round), the clip z = -8 + [x >= -8] (x + 8) - [x >= 8] (x - 8 + ulp) to
 * [-8, 8) by two products in one round, z truncated to 6 fraction bits (one round), the sigmoid
 * looked up over the 10-bit index range [-512, 512) (one round; cell midpoints, and the limits 0
 * and 1 in the two end cells), then x s by one product and a truncation by f (two rounds).
 * The end cells make the output 0 for x < -8 + 1/64 and x for x >= 8 - 1/64, so the error stays
 * bounded beyond the clip: |out - silu(x)| <= 2.8e-3 + 5 2^-f for every x (about 1.8e-3 + 5
 * 2^-f inside the clip range, from the 1/128 half cell; |silu(x)| <= 2.7e-3 for x <= -8 + 1/64,
 * |x - silu(x)| <= 2.7e-3 for x >= 8 - 1/64). bits: the sign tests' width, the caller's
 * promise that |x| + 8 < 2^(bits-1) in fixed point (64: any x). */
kvs_status kvs_mpc_silu(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, int bits,
                        uint64_t *out, kvs_error *err);
/* The forward pass's SiLU width: activations below 2^19 - 8 in magnitude (an FFN activation
 * of 2^19 = 524288 would be far outside any Llama's range). */
#define KVS_MPC_SILU_BITS(f) ((f) + 20)

/* out ~ 1/sqrt(x) for x in [2^-f, 2^20) (1 <= f <= 18): one batch of f + 20 sign tests
 * [x >= 2^j], j = -f+1..20 (one round, over f + 21 bits), the bucket guess 1/sqrt(1.5 2^j) formed locally, then
 * iters = 3 Newton steps y <- y (3 - x y^2) / 2: x y is kept whole (2f fraction bits), times y
 * (3f bits, below 2^55), truncated by 2f, then y (3 - t) truncated by f + 1 (three products,
 * two truncations, five rounds a step). The iteration's relative error from the guess is below
 * 2^-15 < 2^-(f-3). Error: |out - 1/sqrt(x)| <= 2^-(f-3) / sqrt(x) + 2 2^-f. */
kvs_status kvs_mpc_rsqrt(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                         kvs_error *err);

#endif
