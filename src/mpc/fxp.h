/* Fixed point in Z_2^64 and the plaintext emulator of the two-party gates: what each gate must
 * compute, bit for bit, on the reconstructed values (a value is an int64 read as uint64; products
 * wrap mod 2^64; truncation is floor division by 2^frac of the signed value). */
#ifndef KVS_MPC_FXP_H
#define KVS_MPC_FXP_H

#include <math.h>
#include <stdint.h>

/* round(x 2^frac) as a ring element (|x| 2^frac < 2^62 assumed by every gate). */
static inline uint64_t kvs_fx_encode(double x, int frac)
{
    return (uint64_t)(int64_t)llround(ldexp(x, frac));
}

static inline double kvs_fx_decode(uint64_t v, int frac)
{
    return ldexp((double)(int64_t)v, -frac);
}

/* floor(x / 2^f) of the signed value x (an arithmetic shift, written without relying on the
 * implementation-defined right shift of negative integers). */
static inline uint64_t kvs_fx_ars(uint64_t x, int f)
{
    if (f == 0)
        return x;
    const uint64_t sign = x >> 63, shifted = x >> f;
    return sign ? shifted | ~(~(uint64_t)0 >> f) : shifted;
}

/* The emulator of the fixed-point product: floor(x y / 2^f), the product taken mod 2^64. */
static inline uint64_t kvs_fx_mul(uint64_t x, uint64_t y, int f)
{
    return kvs_fx_ars(x * y, f);
}

#endif
