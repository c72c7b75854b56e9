/* The two-party engine's pseudorandom generator: AES-128 in counter mode keyed by a 16-byte seed
 * (OpenSSL), and fresh seeds from the OS. A party and the dealer that share a seed expand the
 * same stream, so correlated randomness needs no transfer (seed compression). */
#ifndef KVS_MPC_PRG_H
#define KVS_MPC_PRG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef struct kvs_prg kvs_prg;

/* A stream keyed by seed (16 bytes), starting at block 0. KVS_ERR_NOMEM when OpenSSL cannot
 * make a cipher context. */
kvs_status kvs_prg_new(const uint8_t seed[16], kvs_prg **out, kvs_error *err);
void kvs_prg_free(kvs_prg *g);
/* The next n bytes of the stream. */
void kvs_prg_bytes(kvs_prg *g, void *out, size_t n);
/* The next n 64-bit words (little-endian bytes of the stream). */
void kvs_prg_u64(kvs_prg *g, uint64_t *out, size_t n);
/* A fresh seed from the OS (getrandom). KVS_ERR_IO if the OS gives none. */
kvs_status kvs_prg_os_seed(uint8_t seed[16], kvs_error *err);

#endif
