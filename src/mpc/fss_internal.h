/* The GGM-tree PRG of the FSS schemes (fss.c): fixed-key AES-128 in Matyas-Meyer-Oseas mode. */
#ifndef KVS_MPC_FSS_INTERNAL_H
#define KVS_MPC_FSS_INTERNAL_H

#include <stdint.h>

/* A 128-bit block: lo holds bytes 0..7, hi bytes 8..15, each little-endian (AES byte order). */
typedef struct kvs_fss_block {
    uint64_t lo, hi;
} kvs_fss_block;

/* G's three outputs come from three fixed public AES-128 keys K_0, K_1, K_2 (fss_prg.c):
 * out_j = AES_{K_j}(s) xor s. The FSS trees read out_0 as (left seed, left bit), out_1 as
 * (right seed, right bit) and out_2 as (left value, right value) (fss.c). */
#define KVS_FSS_PRG_KEYS 3

/* A PRG context: the AES-NI path needs none (its key schedules are compile-time constants); the
 * OpenSSL fallback keeps one ECB cipher context per key. */
typedef struct kvs_fss_prg {
    int evp;                          /* 1: OpenSSL EVP, 0: AES-NI */
    void *ctx[KVS_FSS_PRG_KEYS];      /* EVP_CIPHER_CTX * when evp */
} kvs_fss_prg;

/* 1 if this build has the AES-NI path (compiled with __AES__). */
int kvs_fss_have_aesni(void);
/* Sets up g: AES-NI when the build has it and force_evp is 0, else OpenSSL. OpenSSL failing to
 * make a cipher context (out of memory) aborts with a message: the FSS functions return no
 * status. kvs_fss_prg_free releases it. */
void kvs_fss_prg_init(kvs_fss_prg *g, int force_evp);
void kvs_fss_prg_free(kvs_fss_prg *g);
/* out[j] = AES_{K_j}(s) xor s for j < nout (1 <= nout <= KVS_FSS_PRG_KEYS). */
void kvs_fss_prg_expand(const kvs_fss_prg *g, kvs_fss_block s, int nout, kvs_fss_block *out);

/* The batched form, so that AES-NI pipelines independent blocks: out[i nout + j] = G_j(s[i]) for
 * i < count <= KVS_FSS_PRG_BATCH. */
#define KVS_FSS_PRG_BATCH 8
void kvs_fss_prg_expand_batch(const kvs_fss_prg *g, const kvs_fss_block *s, int count, int nout,
                              kvs_fss_block *out);

/* For the tests: one AES-128 block encryption under any key, by AES-NI with its key expansion
 * computed at run time (evp = 0; returns -1 if the build has no AES-NI) or by OpenSSL (evp = 1).
 * 0 on success. */
int kvs_fss_aes128_block(int evp, const uint8_t key[16], const uint8_t in[16], uint8_t out[16]);
/* For the tests: 1 if the compile-time key schedules equal the run-time expansion of K_0..K_2
 * (always 1 without AES-NI, where the schedules are unused). */
int kvs_fss_schedule_ok(void);

#endif
