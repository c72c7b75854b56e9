/* Plaintext emulators and public tables of the non-linear two-party gates (fxp_nl.h). */
#include "mpc/fxp_nl.h"

#include <math.h>

#include "mpc/fxp.h"

uint64_t kvs_fxnl_exp_entry(int i, int frac)
{
    if (i >= 0)
        return kvs_fx_encode(1.0, frac);
    return kvs_fx_encode(exp((i + 0.5) / (1 << KVS_FXNL_EXP_IN_FRAC)), frac);
}

/* table[i mod 2^bits] = entry(i) for i in [-2^(bits-1), 2^(bits-1)). */
static void fill_signed(int bits, int frac, uint64_t (*entry)(int, int), uint64_t *table)
{
    const int half = 1 << (bits - 1), mask = (1 << bits) - 1;
    for (int i = -half; i < half; i++)
        table[i & mask] = entry(i, frac);
}

void kvs_fxnl_exp_table(int frac, uint64_t *table)
{
    fill_signed(KVS_FXNL_EXP_BITS, frac, kvs_fxnl_exp_entry, table);
}

/* The signed index i of the table cell of v in [-2^(bits-1), 2^(bits-1)) as uint64 mod 2^64. */
static int signed_index(uint64_t v, int bits)
{
    const int mask = (1 << bits) - 1, half = 1 << (bits - 1);
    const int u = (int)(v & (uint64_t)mask);
    return u >= half ? u - (1 << bits) : u;
}

uint64_t kvs_fxnl_exp_neg(uint64_t x, int frac)
{
    const int64_t lo = -((int64_t)KVS_FXNL_EXP_MIN << frac);
    const uint64_t z = (int64_t)x < lo ? (uint64_t)lo : x;
    const uint64_t i = kvs_fx_ars(z, frac - KVS_FXNL_EXP_IN_FRAC);
    return kvs_fxnl_exp_entry(signed_index(i, KVS_FXNL_EXP_BITS), frac);
}

uint64_t kvs_fxnl_sigmoid_entry(int i, int frac)
{
    const int half = 1 << (KVS_FXNL_SILU_BITS - 1);
    if (i <= -half)
        return 0;
    if (i >= half - 1)
        return kvs_fx_encode(1.0, frac);
    return kvs_fx_encode(1.0 / (1.0 + exp(-(i + 0.5) / (1 << KVS_FXNL_SILU_IN_FRAC))), frac);
}

void kvs_fxnl_sigmoid_table(int frac, uint64_t *table)
{
    fill_signed(KVS_FXNL_SILU_BITS, frac, kvs_fxnl_sigmoid_entry, table);
}

uint64_t kvs_fxnl_silu(uint64_t x, int frac)
{
    const int64_t hi = (int64_t)KVS_FXNL_SILU_MAX << frac, v = (int64_t)x;
    const uint64_t z = (uint64_t)(v < -hi ? -hi : v > hi - 1 ? hi - 1 : v);
    const uint64_t i = kvs_fx_ars(z, frac - KVS_FXNL_SILU_IN_FRAC);
    const uint64_t s = kvs_fxnl_sigmoid_entry(signed_index(i, KVS_FXNL_SILU_BITS), frac);
    return kvs_fx_mul(x, s, frac);
}

uint64_t kvs_fxnl_recip_guess(int j, int frac)
{
    return kvs_fx_encode(1.0 / ldexp(1.5, j), frac);
}

uint64_t kvs_fxnl_rsqrt_guess(int j, int frac)
{
    return kvs_fx_encode(1.0 / sqrt(ldexp(1.5, j)), frac);
}

int kvs_fxnl_recip_iters(int frac)
{
    return frac <= 14 ? 3 : 4;
}

int kvs_fxnl_rsqrt_iters(int frac)
{
    return frac <= 18 ? 3 : 4;
}

/* The bucket of x: lo plus the number of j in (lo, hi] with x >= 2^j (signed, fixed point). */
static int bucket(uint64_t x, int lo, int hi, int frac)
{
    int b = lo;
    for (int j = lo + 1; j <= hi; j++)
        b += (int64_t)x >= (int64_t)1 << (j + frac);
    return b;
}

uint64_t kvs_fxnl_recip(uint64_t x, int frac)
{
    uint64_t y = kvs_fxnl_recip_guess(bucket(x, 0, KVS_FXNL_RECIP_MAXEXP, frac), frac);
    const uint64_t two = (uint64_t)2 << frac;
    for (int k = kvs_fxnl_recip_iters(frac); k > 0; k--) {
        const uint64_t t = kvs_fx_mul(x, y, frac);
        y = kvs_fx_mul(y, two - t, frac);
    }
    return y;
}

uint64_t kvs_fxnl_rsqrt(uint64_t x, int frac)
{
    uint64_t y = kvs_fxnl_rsqrt_guess(bucket(x, -frac, KVS_FXNL_RSQRT_MAXEXP, frac), frac);
    const uint64_t three = (uint64_t)3 << frac;
    for (int k = kvs_fxnl_rsqrt_iters(frac); k > 0; k--) {
        const uint64_t t = kvs_fx_mul(x * y, y, 2 * frac);
        y = kvs_fx_mul(y, three - t, frac + 1);
    }
    return y;
}
