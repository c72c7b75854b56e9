/* Plaintext emulators of the non-linear two-party gates (gates_nl.h) and the public tables and
 * constants they share: each emulator computes, bit for bit, what its gate reconstructs (same
 * clips, same truncations kvs_fx_ars, same table entries, same Newton steps kvs_fx_mul). */
#ifndef KVS_MPC_FXP_NL_H
#define KVS_MPC_FXP_NL_H

#include <stdint.h>

/* exp_neg: input clip (-16), input resolution (6 fraction bits), index width (11 bits). */
#define KVS_FXNL_EXP_MIN 16
#define KVS_FXNL_EXP_IN_FRAC 6
#define KVS_FXNL_EXP_BITS 11
/* silu: clip to [-8, 8), 6 fraction bits, 10-bit index. */
#define KVS_FXNL_SILU_MAX 8
#define KVS_FXNL_SILU_IN_FRAC 6
#define KVS_FXNL_SILU_BITS 10
/* recip: buckets [2^j, 2^(j+1)) for j = 0..20 (comparisons against 2^1..2^20). */
#define KVS_FXNL_RECIP_MAXEXP 20
/* rsqrt: buckets for j = -frac..20 (comparisons against 2^(-frac+1)..2^20). */
#define KVS_FXNL_RSQRT_MAXEXP 20

/* out = table[x mod 2^nbits]. */
static inline uint64_t kvs_fxnl_lut(uint64_t x, int nbits, const uint64_t *table)
{
    return table[x & ((((uint64_t)1) << nbits) - 1)];
}

/* exp table entry for the 11-bit two's-complement index i in [-1024, 1023]: exp((i + 1/2)/64)
 * (the midpoint of the input cell [i/64, (i+1)/64)) for i < 0, 1.0 for i >= 0 (x = 0; positive
 * inputs are outside the domain and give 1), encoded with frac bits. */
uint64_t kvs_fxnl_exp_entry(int i, int frac);
/* The whole table, 2^11 entries indexed by i mod 2^11. */
void kvs_fxnl_exp_table(int frac, uint64_t *table);
/* ~exp(x) for x <= 0: i = floor(max(x, -16) / 2^(frac - 6)), table[i mod 2^11]. frac >= 6.
 * |out - exp(x)| <= exp(max(x, -16)) (e^(1/128) - 1) + 2^-(frac+1) < exp(max(x, -16)) 0.00785
 * + 2^-(frac+1) for every x <= 0. */
uint64_t kvs_fxnl_exp_neg(uint64_t x, int frac);

/* sigmoid table entry for the 10-bit index i in [-512, 511]: 0 at -512, 1 at 511 (the limits, so
 * that x sigmoid(clipped x) stays close to SiLU beyond the clip), sigmoid((i + 1/2)/64) between. */
uint64_t kvs_fxnl_sigmoid_entry(int i, int frac);
void kvs_fxnl_sigmoid_table(int frac, uint64_t *table); /* 2^10 entries */
/* ~x sigmoid(x): z = clip(x, -8, 8 - 2^-frac), i = floor(z / 2^(frac - 6)), s = table[i mod
 * 2^10], out = floor(x s / 2^frac). frac >= 6, |x| < 2^(62 - 2 frac). |out - silu(x)| <=
 * 2.8e-3 + 5 2^-frac for every such x (see gates_nl.h). */
uint64_t kvs_fxnl_silu(uint64_t x, int frac);

/* The initial guesses: 1/(1.5 2^j) and 1/sqrt(1.5 2^j), encoded with frac bits. */
uint64_t kvs_fxnl_recip_guess(int j, int frac);
uint64_t kvs_fxnl_rsqrt_guess(int j, int frac);
/* Newton iteration counts: 3 for frac <= 14 (else 4) for recip, 3 for frac <= 18 (else 4) for
 * rsqrt (the worst-case relative error of the iteration from the bucket guess is below
 * 2^-(frac-2), resp. 2^-(frac-3)). */
int kvs_fxnl_recip_iters(int frac);
int kvs_fxnl_rsqrt_iters(int frac);
/* ~1/x for x in [1, 2^20): y = recip_guess(bucket of x); then iters times t = floor(x y / 2^f),
 * y = floor(y (2 2^f - t) / 2^f). */
uint64_t kvs_fxnl_recip(uint64_t x, int frac);
/* ~1/sqrt(x) for x in [2^-frac, 2^20): y = rsqrt_guess(bucket of x); then iters times t =
 * floor(x y y / 2^(2f)) (the product x y is kept whole), y = floor(y (3 2^f - t) / 2^(f+1)). */
uint64_t kvs_fxnl_rsqrt(uint64_t x, int frac);

#endif
