/* Error paths of the tokenizers (issue 16) that test_tokenizer.c does not reach: a byte-level
 * BPE vocabulary without a token for a byte and without an unknown token, a token text longer
 * than the loader accepts, and NULL arguments to the BPE and pre-tokenizer entry points. Each
 * checks the status and the part of the message that names the byte, key or token. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gguf/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"

/* Writes a byte-level BPE (gpt2) vocabulary of n tokens with the merges given, and no
 * unknown_token_id; loads it. */
static kvs_status load_bpe(const char *path, const char *const *pieces, int n,
                           const char *const *merges, int n_merges, kvs_tokenizer **t,
                           kvs_error *err)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    int32_t types[8];
    for (int i = 0; i < n; i++)
        types[i] = 1; /* normal */
    kvs_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", pieces, (uint64_t)n);
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    kvs_gguf_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    kvs_status st = kvs_gguf_write(w, path, err);
    kvs_gguf_writer_free(w);
    if (st != KVS_OK)
        return st;
    return kvs_tokenizer_load_gguf(path, t, err);
}

/* A vocabulary without byte tokens for some bytes and no unknown token cannot tokenize text
 * with those bytes: the error names the byte. */
static void test_bpe_missing_byte(const char *path)
{
    static const char *const pieces[] = {"a", "b", "ab"};
    static const char *const merges[] = {"a b"};
    kvs_tokenizer *t = NULL;
    kvs_error err = {0};
    kvs_status st = load_bpe(path, pieces, 3, merges, 1, &t, &err);
    CHECKF(st == KVS_OK && t, "load: %d %s", st, err.msg);
    if (!t)
        return;
    CHECK(kvs_tokenizer_unk(t) == -1);
    int32_t *ids = NULL;
    int n = 0;
    /* what the vocabulary covers tokenizes (and merges) */
    st = kvs_tokenizer_encode(t, "ab", 0, &ids, &n, &err);
    CHECKF(st == KVS_OK && n == 1 && ids && ids[0] == 2, "%d n=%d %s", st, n, err.msg);
    free(ids);
    ids = NULL;
    st = kvs_tokenizer_encode(t, "abc", 0, &ids, &n, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "tokenize: byte 0x63 has no token in this "
                                                "vocabulary and the vocabulary has no unknown "
                                                "token") && !ids, "%d '%s'", st, err.msg);
    free(ids);
    ids = NULL;
    /* a byte of a multi-byte character: "é" is C3 A9 */
    st = kvs_tokenizer_encode(t, "a\xc3\xa9", 0, &ids, &n, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "byte 0xC3 has no token") && !ids && n == 0,
           "%d '%s'", st, err.msg);
    free(ids);
    ids = NULL;
    /* invalid UTF-8 becomes U+FFFD (EF BF BD) first, as in llama.cpp: its first byte is named */
    st = kvs_tokenizer_encode(t, "ab\xff", 0, &ids, &n, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "byte 0xEF has no token") && !ids, "%d '%s'", st,
           err.msg);
    free(ids);
    kvs_tokenizer_free(t);
}

/* A token text over 16 MiB (MAX_PIECE_BYTES in tokenizer.c) is refused with its index. */
static void test_long_token(const char *path)
{
    const size_t len = (1u << 24) + 1;
    char *big = malloc(len + 1);
    CHECK(big != NULL);
    if (!big)
        return;
    memset(big, 'a', len);
    big[len] = '\0';
    const char *pieces[] = {"b", big};
    static const char *const merges[1] = {NULL};
    kvs_tokenizer *t = NULL;
    kvs_error err = {0};
    kvs_status st = load_bpe(path, pieces, 2, merges, 0, &t, &err);
    CHECKF(st == KVS_ERR_FORMAT && !t &&
               strstr(err.msg, "tokenizer: key tokenizer.ggml.tokens: token 1 is 16777217 bytes "
                               "long"), "%d '%.200s'", st, err.msg);
    kvs_tokenizer_free(t);
    free(big);
}

static void test_null_args(void)
{
    kvs_error err = {0};
    kvs_idvec out = {0};
    kvs_status st = kvs_bpe_encode(NULL, NULL, "x", 1, &out, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "tokenize: NULL argument"), "%d '%s'", st,
           err.msg);
    kvs_pretok *p = NULL;
    st = kvs_pretok_new("default", 7, &p, &err);
    CHECKF(st == KVS_OK && p, "%d %s", st, err.msg);
    kvs_spans sp = {0};
    st = kvs_pretok_split(NULL, "x", 1, &sp, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "pre-tokenizer: NULL argument"), "%d '%s'", st,
           err.msg);
    /* NULL text is fine when empty, not otherwise */
    st = p ? kvs_pretok_split(p, NULL, 0, &sp, &err) : KVS_OK;
    CHECK(st == KVS_OK && sp.n == 0);
    st = p ? kvs_pretok_split(p, NULL, 3, &sp, &err) : KVS_ERR_ARG;
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "pre-tokenizer: NULL argument"), "%d '%s'", st,
           err.msg);
    st = p ? kvs_pretok_split(p, "x", 1, NULL, &err) : KVS_ERR_ARG;
    CHECK(st == KVS_ERR_ARG);
    free(sp.v);
    kvs_pretok_free(p);
}

int main(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_errors_tokenizer.gguf");
    test_bpe_missing_byte(path);
    test_long_token(path);
    test_null_args();
    remove(path);
    return check_summary("errors_tokenizer");
}
