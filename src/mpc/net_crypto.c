/* The channel's cryptography over OpenSSL's EVP interface and getrandom (net_internal.h). */
#include "mpc/net_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/evp.h>
#include <openssl/kdf.h>

#include "mpc/net.h"

struct kvs_gcm {
    EVP_CIPHER_CTX *ctx;
    int encrypt;
};

int kvs_net_hkdf_sha256(const uint8_t *ikm, size_t ikm_n, const uint8_t *salt, size_t salt_n,
                        const uint8_t *info, size_t info_n, uint8_t out[32])
{
    if (ikm_n > INT_MAX || salt_n > INT_MAX || info_n > INT_MAX)
        return -1;
    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t out_n = 32;
    int ok = pc && EVP_PKEY_derive_init(pc) > 0 &&
             EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_salt(pc, salt, (int)salt_n) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(pc, ikm, (int)ikm_n) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(pc, info, (int)info_n) > 0 &&
             EVP_PKEY_derive(pc, out, &out_n) > 0 && out_n == 32;
    EVP_PKEY_CTX_free(pc);
    return ok ? 0 : -1;
}

int kvs_net_sha256(const uint8_t *a, size_t a_n, const uint8_t *b, size_t b_n, uint8_t out[32])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int out_n = 0;
    int ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) > 0 &&
             EVP_DigestUpdate(md, a, a_n) > 0 && EVP_DigestUpdate(md, b, b_n) > 0 &&
             EVP_DigestFinal_ex(md, out, &out_n) > 0 && out_n == 32;
    EVP_MD_CTX_free(md);
    return ok ? 0 : -1;
}

int kvs_net_getrandom(uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

kvs_status kvs_net_random_key(uint8_t key[32], kvs_error *err)
{
    if (!key)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_net_random_key: key is NULL");
    if (kvs_net_getrandom(key, 32) != 0)
        return kvs_fail(err, KVS_ERR_IO, "cannot draw a random key from the OS: %s",
                        strerror(errno));
    return KVS_OK;
}

kvs_gcm *kvs_gcm_new(const uint8_t key[32], int encrypt)
{
    kvs_gcm *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->encrypt = encrypt;
    g->ctx = EVP_CIPHER_CTX_new();
    int ok = g->ctx != NULL;
    if (ok && encrypt)
        ok = EVP_EncryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL) > 0;
    else if (ok)
        ok = EVP_DecryptInit_ex(g->ctx, EVP_aes_256_gcm(), NULL, key, NULL) > 0;
    if (ok)
        ok = EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) > 0;
    if (!ok) {
        kvs_gcm_free(g);
        return NULL;
    }
    return g;
}

void kvs_gcm_free(kvs_gcm *g)
{
    if (!g)
        return;
    EVP_CIPHER_CTX_free(g->ctx); /* clears the key schedule */
    free(g);
}

static void nonce_of(uint64_t seq, uint8_t iv[12])
{
    for (int i = 0; i < 8; i++)
        iv[i] = (uint8_t)(seq >> (8 * i));
    iv[8] = iv[9] = iv[10] = iv[11] = 0;
}

int kvs_gcm_seal(kvs_gcm *g, uint64_t seq, const uint8_t *aad, size_t aad_n, const uint8_t *in,
                 size_t n, uint8_t *out, uint8_t tag[16])
{
    uint8_t iv[12];
    int len = 0;
    if (!g->encrypt || n > INT_MAX || aad_n > INT_MAX)
        return -1;
    nonce_of(seq, iv);
    if (EVP_EncryptInit_ex(g->ctx, NULL, NULL, NULL, iv) <= 0 ||
        EVP_EncryptUpdate(g->ctx, NULL, &len, aad, (int)aad_n) <= 0)
        return -1;
    if (n > 0 && EVP_EncryptUpdate(g->ctx, out, &len, in, (int)n) <= 0)
        return -1;
    if (EVP_EncryptFinal_ex(g->ctx, out + n, &len) <= 0 ||
        EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) <= 0)
        return -1;
    return 0;
}

int kvs_gcm_open(kvs_gcm *g, uint64_t seq, const uint8_t *aad, size_t aad_n, const uint8_t *in,
                 size_t n, uint8_t *out, const uint8_t tag[16])
{
    uint8_t iv[12], t[16];
    int len = 0;
    if (g->encrypt || n > INT_MAX || aad_n > INT_MAX)
        return -1;
    nonce_of(seq, iv);
    memcpy(t, tag, 16);
    if (EVP_DecryptInit_ex(g->ctx, NULL, NULL, NULL, iv) <= 0 ||
        EVP_DecryptUpdate(g->ctx, NULL, &len, aad, (int)aad_n) <= 0)
        return -1;
    if (n > 0 && EVP_DecryptUpdate(g->ctx, out, &len, in, (int)n) <= 0)
        return -1;
    if (EVP_CIPHER_CTX_ctrl(g->ctx, EVP_CTRL_GCM_SET_TAG, 16, t) <= 0 ||
        EVP_DecryptFinal_ex(g->ctx, out + n, &len) <= 0)
        return -1;
    return 0;
}
