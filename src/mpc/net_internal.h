/* The channel's cryptography as net.c sees it: HKDF-SHA256, SHA-256, AES-256-GCM by counter, OS randomness. */
#ifndef KVS_MPC_NET_INTERNAL_H
#define KVS_MPC_NET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* One direction's AES-256-GCM key schedule (an OpenSSL context). */
typedef struct kvs_gcm kvs_gcm;

/* All return 0 on success, -1 on an OpenSSL or OS failure. */
int kvs_net_hkdf_sha256(const uint8_t *ikm, size_t ikm_n, const uint8_t *salt, size_t salt_n,
                        const uint8_t *info, size_t info_n, uint8_t out[32]);
int kvs_net_sha256(const uint8_t *a, size_t a_n, const uint8_t *b, size_t b_n, uint8_t out[32]);
int kvs_net_getrandom(uint8_t *buf, size_t n);

/* NULL on failure. encrypt: 1 sealing key, 0 opening key. */
kvs_gcm *kvs_gcm_new(const uint8_t key[32], int encrypt);
void kvs_gcm_free(kvs_gcm *g);
/* The nonce is the 96-bit counter seq (little-endian, high 32 bits zero); n <= INT_MAX. */
int kvs_gcm_seal(kvs_gcm *g, uint64_t seq, const uint8_t *aad, size_t aad_n, const uint8_t *in,
                 size_t n, uint8_t *out, uint8_t tag[16]);
/* -1 when the tag does not verify (out then holds unauthenticated bytes: the caller wipes it). */
int kvs_gcm_open(kvs_gcm *g, uint64_t seq, const uint8_t *aad, size_t aad_n, const uint8_t *in,
                 size_t n, uint8_t *out, const uint8_t tag[16]);

#endif
