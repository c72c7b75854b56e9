/* AES-128-CTR streams from 16-byte seeds, and OS seeds (prg.h). */
#include "mpc/prg.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

struct kvs_prg {
    EVP_CIPHER_CTX *ctx;
};

kvs_status kvs_prg_new(const uint8_t seed[16], kvs_prg **out, kvs_error *err)
{
    *out = NULL;
    static const uint8_t iv[16] = {0}; /* counter block 0: a seed is used for one stream */
    kvs_prg *g = calloc(1, sizeof *g);
    if (!g || !(g->ctx = EVP_CIPHER_CTX_new()) ||
        EVP_EncryptInit_ex(g->ctx, EVP_aes_128_ctr(), NULL, seed, iv) != 1) {
        kvs_prg_free(g);
        return kvs_fail(err, KVS_ERR_NOMEM, "cannot set up an AES-128-CTR stream (OpenSSL)");
    }
    *out = g;
    return KVS_OK;
}

void kvs_prg_free(kvs_prg *g)
{
    if (!g)
        return;
    EVP_CIPHER_CTX_free(g->ctx);
    free(g);
}

void kvs_prg_bytes(kvs_prg *g, void *out, size_t n)
{
    /* The keystream is AES_seed(counter): encrypting zeros yields it. In chunks, since
     * EVP_EncryptUpdate takes an int length. */
    uint8_t *p = out;
    memset(p, 0, n);
    while (n > 0) {
        const int step = n > (1u << 30) ? 1 << 30 : (int)n;
        int len = 0;
        EVP_EncryptUpdate(g->ctx, p, &len, p, step); /* CTR cannot fail on a valid context */
        p += step;
        n -= (size_t)step;
    }
}

void kvs_prg_u64(kvs_prg *g, uint64_t *out, size_t n)
{
    kvs_prg_bytes(g, out, n * sizeof *out);
    /* the stream's bytes in little-endian order, whatever the host */
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = (const uint8_t *)&out[i];
        out[i] = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 |
                 (uint64_t)b[3] << 24 | (uint64_t)b[4] << 32 | (uint64_t)b[5] << 40 |
                 (uint64_t)b[6] << 48 | (uint64_t)b[7] << 56;
    }
}

kvs_status kvs_prg_os_seed(uint8_t seed[16], kvs_error *err)
{
    size_t got = 0;
    while (got < 16) {
        ssize_t r = getrandom(seed + got, 16 - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return kvs_fail(err, KVS_ERR_IO, "the OS gave no random bytes (getrandom: %s)",
                            strerror(errno));
        got += (size_t)r;
    }
    return KVS_OK;
}
