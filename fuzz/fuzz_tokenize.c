/* Fuzzes tokenization of arbitrary bytes with real vocabularies: SentencePiece (stories260K,
 * through the public API: kvs_tokenize, kvs_tokenize_special, kvs_token_text) and byte-level
 * BPE with GPT-2's pre-tokenizer (ggml-vocab-gpt-2.gguf, a vocabulary-only file that
 * kvs_model_load refuses, so through the tokenizer those API calls wrap). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvslim.h"
#include "tokenizer/tokenizer.h"

/* Loaded once per process: loading takes far longer than one input. */
static kvs_model *g_spm;
static kvs_tokenizer *g_bpe;

static void free_vocabs(void)
{
    kvs_model_free(g_spm);
    kvs_tokenizer_free(g_bpe);
}

/* KVS_SHARED_DIR as the tests take it (tests/fixture.c); else ../shared, the folder beside the
 * repository when run from its root (make fuzz does). */
static void shared_path(char *buf, size_t size, const char *rel)
{
    const char *dir = getenv("KVS_SHARED_DIR");
    snprintf(buf, size, "%s/%s", dir && *dir ? dir : "../shared", rel);
}

static void load_vocabs(void)
{
    char path[1024];
    kvs_error err = {0};
    shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    if (kvs_model_load(path, &g_spm, &err) != KVS_OK) {
        fprintf(stderr, "fuzz_tokenize: %s (set KVS_SHARED_DIR)\n", err.msg);
        abort();
    }
    shared_path(path, sizeof path, "models/vocab/ggml-vocab-gpt-2.gguf");
    if (kvs_tokenizer_load_gguf(path, &g_bpe, &err) != KVS_OK) {
        fprintf(stderr, "fuzz_tokenize: %s (set KVS_SHARED_DIR)\n", err.msg);
        abort();
    }
    atexit(free_vocabs);
}

/* Reads a decoded token's last byte (a volatile store, so the read is not optimised away):
 * ASan then checks that *len bytes are really there. */
static void touch(const char *s, int len)
{
    volatile char sink = 0;
    if (len > 0)
        sink = s[len - 1];
    (void)sink;
}

static void spm_round(const char *text, int special)
{
    kvs_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    kvs_status st = special ? kvs_tokenize_special(g_spm, text, 1, 1, &ids, &n, &err)
                            : kvs_tokenize(g_spm, text, 1, &ids, &n, &err);
    if (st == KVS_OK)
        for (int i = 0; i < n; i++) {
            int len = 0;
            const char *s = kvs_token_text(g_spm, i ? ids[i - 1] : -1, ids[i], &len);
            touch(s, len);
        }
    free(ids);
}

static void bpe_round(const char *text, int special)
{
    kvs_error err = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (kvs_tokenizer_encode_ex(g_bpe, text, 1, special, &ids, &n, &err) == KVS_OK)
        for (int i = 0; i < n; i++) {
            int len = 0;
            const char *s = kvs_tokenizer_decode(g_bpe, i ? ids[i - 1] : -1, ids[i], &len);
            touch(s, len);
        }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_spm)
        load_vocabs();
    /* The API takes C strings: an embedded NUL ends the text, as it would for any caller. */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    spm_round(text, 0);
    spm_round(text, 1);
    bpe_round(text, 0);
    bpe_round(text, 1);
    free(text);
    return 0;
}
