/* Non-finite values fail where they appear instead of passing silently: NaN logits name the
 * position, a NaN key names the layer, KV head and position, a key too large for an F16 cache
 * says so, and the eval harness fails rather than report KL 0 / top-1 1.000 for NaN logits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval/eval.h"
#include "fixture.h"
#include "kvslim.h"
#include "gguf/gguf.h"

enum { DIM = 32, HIDDEN = 64, LAYERS = 2, HEADS = 4, KV = 2, VOCAB = 300, CTX = 64 };

/* Up to three tensors filled with a value; every other weight is zero except the norms (one). */
typedef struct fills {
    const char *name[3];
    float value[3];
} fills;

static float *buffers[64];
static int n_buffers;

static void add(kvs_gguf_writer *w, const fills *f, const char *name, int rows, int cols,
                float base)
{
    float v = base;
    for (int i = 0; i < 3; i++)
        if (f->name[i] && !strcmp(f->name[i], name))
            v = f->value[i];
    float *data = malloc(sizeof(float) * (size_t)rows * cols);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        data[i] = v;
    buffers[n_buffers++] = data;
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
    kvs_gguf_add_tensor(w, name, KVS_F32, rows == 1 ? 1 : 2, dims, data, NULL);
}

static kvs_status write_model(const char *path, const fills *f)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_str(w, "general.architecture", "llama");
    kvs_gguf_set_u32(w, "llama.context_length", CTX);
    kvs_gguf_set_u32(w, "llama.embedding_length", DIM);
    kvs_gguf_set_u32(w, "llama.feed_forward_length", HIDDEN);
    kvs_gguf_set_u32(w, "llama.block_count", LAYERS);
    kvs_gguf_set_u32(w, "llama.attention.head_count", HEADS);
    kvs_gguf_set_u32(w, "llama.attention.head_count_kv", KV);
    fx_write_test_vocab(w, VOCAB);
    add(w, f, "token_embd.weight", VOCAB, DIM, 0.01f);
    add(w, f, "output_norm.weight", 1, DIM, 1);
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        add(w, f, N("attn_norm.weight"), 1, DIM, 1);
        add(w, f, N("attn_q.weight"), DIM, DIM, 0.01f);
        add(w, f, N("attn_k.weight"), DIM / HEADS * KV, DIM, 0.01f);
        add(w, f, N("attn_v.weight"), DIM / HEADS * KV, DIM, 0.01f);
        add(w, f, N("attn_output.weight"), DIM, DIM, 0.01f);
        add(w, f, N("ffn_norm.weight"), 1, DIM, 1);
        add(w, f, N("ffn_gate.weight"), HIDDEN, DIM, 0.01f);
        add(w, f, N("ffn_up.weight"), HIDDEN, DIM, 0.01f);
        add(w, f, N("ffn_down.weight"), DIM, HIDDEN, 0.01f);
#undef N
    }
    kvs_error err;
    kvs_status st = kvs_gguf_write(w, path, &err);
    kvs_gguf_writer_free(w);
    while (n_buffers > 0)
        free(buffers[--n_buffers]);
    return st;
}

/* Evaluates 6 tokens (prompt of 4, then 2 decode steps) on a model with fills f and KV type
 * kv_type; returns the first failure's status and message (KVS_OK if none). */
static kvs_status run(const fills *f, const char *kv_type, char *msg, size_t size)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_nonfinite.gguf");
    kvs_error err = {0};
    msg[0] = 0;
    if (write_model(path, f) != KVS_OK)
        return KVS_ERR_IO;
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    float *logits = malloc(sizeof(float) * 4 * VOCAB);
    kvs_session_params p = kvs_session_default_params();
    p.kv_type = kv_type;
    int32_t toks[6] = {1, 5, 9, 7, 4, 3};
    kvs_status st = kvs_model_load(path, &m, &err);
    if (st == KVS_OK)
        st = kvs_session_new(m, &p, &s, &err);
    if (st == KVS_OK)
        st = kvs_session_eval(s, toks, 4, logits, 1, &err);
    for (int i = 4; i < 6 && st == KVS_OK; i++)
        st = kvs_session_eval(s, &toks[i], 1, logits, 0, &err);
    snprintf(msg, size, "%s", err.msg);
    kvs_session_free(s);
    kvs_model_free(m);
    free(logits);
    remove(path);
    return st;
}

/* Non-finite values are a defect of the model (KVS_ERR_FORMAT); a finite key too large for F16
 * is a limit of the cache type (KVS_ERR_UNSUPPORTED). */
static void check_fails(const fills *f, const char *kv_type, const char *want1, const char *want2)
{
    char msg[512];
    kvs_status st = run(f, kv_type, msg, sizeof msg);
    kvs_status code = strstr(want1, "overflows") ? KVS_ERR_UNSUPPORTED : KVS_ERR_FORMAT;
    CHECKF(st == code && strstr(msg, want1) && (!want2 || strstr(msg, want2)),
           "want '%s' / '%s', got %d '%s'", want1, want2 ? want2 : "", st, msg);
}

int main(void)
{
    char msg[512];
    fills none = {{0}, {0}};
    CHECKF(run(&none, NULL, msg, sizeof msg) == KVS_OK, "%s", msg);
    CHECKF(run(&none, "f16", msg, sizeof msg) == KVS_OK, "%s", msg);

    /* NaN in the final norm: every logit is NaN; the first position at fault is named. */
    fills out_nan = {{"output_norm.weight"}, {NAN}};
    check_fails(&out_nan, NULL, "non-finite logit", "position 0");
    /* An infinite output weight: inf or NaN logits. */
    fills out_inf = {{"token_embd.weight"}, {INFINITY}};
    check_fails(&out_inf, NULL, "non-finite", NULL);
    /* NaN keys from layer 1's key weights: named at the KV store, layer 1, before any logits. */
    fills k_nan = {{"blk.1.attn_k.weight"}, {NAN}};
    check_fails(&k_nan, NULL, "layer 1", "non-finite key");
    check_fails(&k_nan, "f16", "layer 1", "non-finite key");
    fills v_nan = {{"blk.0.attn_v.weight"}, {NAN}};
    check_fails(&v_nan, NULL, "layer 0", "non-finite value");
    /* Keys of 32 x 1e4 = 3.2e5 overflow an F16 cache (largest 65504) but not an F32 one. */
    fills k_big = {{"token_embd.weight", "blk.0.attn_k.weight"}, {1.0f, 1e4f}};
    check_fails(&k_big, "f16", "overflows the F16 KV cache", "layer 0, KV head 0, position 0");
    CHECKF(run(&k_big, NULL, msg, sizeof msg) == KVS_OK, "%s", msg);

    /* The eval harness fails instead of reporting KL 0 and top-1 1.000 against NaN logits. */
    {
        char path[512];
        check_tmp_path(path, sizeof path, "test_nonfinite_eval.gguf");
        CHECK(write_model(path, &out_nan) == KVS_OK);
        kvs_model *m = NULL;
        kvs_error err = {0};
        CHECK(kvs_model_load(path, &m, &err) == KVS_OK);
        int32_t toks[12] = {1, 5, 9, 7, 4, 3, 8, 10, 11, 12, 13, 14};
        kvs_eval_setup s = {.tokens = toks, .n_tokens = 12, .prompt_len = 6, .n_threads = 1};
        kvs_eval_ref ref;
        kvs_eval_result full;
        memset(&ref, 0, sizeof ref);
        kvs_status st = m ? kvs_eval_reference(m, &s, &ref, &full, &err) : KVS_ERR_IO;
        CHECKF(st != KVS_OK && strstr(err.msg, "non-finite"), "status %d, kl %g top1 %g: %s", st,
               st == KVS_OK ? full.kl : -1.0, st == KVS_OK ? full.top1 : -1.0, err.msg);
        if (st == KVS_OK)
            kvs_eval_ref_free(&ref);
        kvs_model_free(m);
        remove(path);
    }
    return check_summary("nonfinite");
}
