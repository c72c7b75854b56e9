/* How the matrix products share their output columns among the pool's threads: each thread owns
 * a contiguous share, which it claims grain by grain from the front; once its own share is done
 * it takes grains from the back of the others' (the one after it first). A thread that is
 * preempted or runs on a slower core is made up for by the others, while the owner of a share
 * keeps reading one sequential run of weights, which the prefetchers need: handing out small
 * chunks from one common counter cost Q8_0 decode at two threads 10-25% (489 tok/s with one
 * share per thread, 438 with 4 chunks per thread, 368 with 16), and taking grains from the
 * front of another's share, where its owner was about to read, cost 7%. */
#ifndef KVS_WORKSPLIT_H
#define KVS_WORKSPLIT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_SPLIT_SHARES 16 /* more threads than this share the shares, round robin */

typedef struct kvs_split {
    int n_shares, grain;
    struct {
        /* [front, back) still unclaimed: front in the low 32 bits, back in the high; one word
         * so that the owner (front) and a helper (back) can never both claim a unit */
        _Alignas(64) _Atomic uint64_t range;
    } share[KVS_SPLIT_SHARES];
} kvs_split;

/* units of work (>= 0) for nth threads, claimed grain (> 0; less is 1) units at a time. */
void kvs_split_init(kvs_split *s, int units, int nth, int grain);
/* The grain of the matrix products: about 32 KiB of weights when the product streams them
 * (decode: unit_bytes, the weight bytes of one unit of columns, > 0); else (unit_bytes 0: packed
 * or dequantised tiles, each grain prepared once and swept by every x row) a quarter of a
 * thread's share. One thread takes every unit at once. */
int kvs_split_grain(int units, int nth, size_t unit_bytes);
/* Whether a product shares its x rows among the threads (statically) instead of its columns:
 * fewer than 2 column units per thread, and at least 2 rows per thread. */
int kvs_split_by_rows(int col_units, int n_rows, int nth);
/* Claims the next units [*u0, *u1) for thread ith; 0 when nothing is left anywhere. */
int kvs_split_next(kvs_split *s, int ith, int *u0, int *u1);

#endif
