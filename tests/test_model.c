/* The llama loader: a synthetic model loads and runs; each structural defect is reported with
 * the key or tensor at fault. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kvslim.h"
#include "model/llama_write.h"

enum { DIM = 32, HIDDEN = 64, LAYERS = 2, HEADS = 4, KV = 2, VOCAB = 300, CTX = 64 };

typedef struct defect {
    const char *skip_tensor;   /* leave this tensor out */
    const char *bad_shape;     /* write this tensor with one row too many */
    const char *arch;          /* general.architecture */
    const char *skip_key;      /* leave this key out */
    int heads_kv;              /* head_count_kv value */
    int block_count;           /* llama.block_count to write (0: LAYERS; tensors: LAYERS) */
    const char *extra_tensor;  /* one more (DIM-element) tensor of this name */
    uint32_t ctx;              /* llama.context_length (0: CTX) */
} defect;

static float zeros[VOCAB * DIM + DIM * HIDDEN];

static void add(kvs_gguf_writer *w, const defect *d, const char *name, int rows, int cols)
{
    if (d->skip_tensor && !strcmp(name, d->skip_tensor))
        return;
    if (d->bad_shape && !strcmp(name, d->bad_shape))
        rows++;
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
    kvs_gguf_add_tensor(w, name, KVS_F32, rows == 1 ? 1 : 2, dims, zeros, NULL);
}

static void set_u32(kvs_gguf_writer *w, const defect *d, const char *key, uint32_t v)
{
    if (!d->skip_key || strcmp(key, d->skip_key))
        kvs_gguf_set_u32(w, key, v);
}

static kvs_status write_model(const char *path, const defect *d)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_str(w, "general.architecture", d->arch ? d->arch : "llama");
    set_u32(w, d, "llama.context_length", d->ctx ? d->ctx : CTX);
    set_u32(w, d, "llama.embedding_length", DIM);
    set_u32(w, d, "llama.feed_forward_length", HIDDEN);
    set_u32(w, d, "llama.block_count", d->block_count ? (uint32_t)d->block_count : LAYERS);
    set_u32(w, d, "llama.attention.head_count", HEADS);
    set_u32(w, d, "llama.attention.head_count_kv", d->heads_kv ? (uint32_t)d->heads_kv : KV);
    const char *pieces[VOCAB];
    char names[VOCAB][16];
    for (int i = 0; i < VOCAB; i++) {
        snprintf(names[i], sizeof names[i], i < 3 ? "<c%d>" : "p%d", i);
        pieces[i] = names[i];
    }
    kvs_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", pieces, VOCAB);
    kvs_gguf_set_arr_f32(w, "tokenizer.ggml.scores", zeros, VOCAB);
    int32_t types[VOCAB];
    for (int i = 0; i < VOCAB; i++)
        types[i] = i < 3 ? 3 : 1;
    kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, VOCAB);
    kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    add(w, d, "token_embd.weight", VOCAB, DIM);
    add(w, d, "output_norm.weight", 1, DIM);
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        add(w, d, N("attn_norm.weight"), 1, DIM);
        add(w, d, N("attn_q.weight"), DIM, DIM);
        add(w, d, N("attn_k.weight"), DIM / HEADS * KV, DIM);
        add(w, d, N("attn_v.weight"), DIM / HEADS * KV, DIM);
        add(w, d, N("attn_output.weight"), DIM, DIM);
        add(w, d, N("ffn_norm.weight"), 1, DIM);
        add(w, d, N("ffn_gate.weight"), HIDDEN, DIM);
        add(w, d, N("ffn_up.weight"), HIDDEN, DIM);
        add(w, d, N("ffn_down.weight"), DIM, HIDDEN);
#undef N
    }
    if (d->extra_tensor)
        add(w, d, d->extra_tensor, 1, DIM);
    kvs_error err;
    kvs_status st = kvs_gguf_write(w, path, &err);
    kvs_gguf_writer_free(w);
    return st;
}

static void expect_load_error(const char *path, const defect *d, const char *want)
{
    CHECK(write_model(path, d) == KVS_OK);
    kvs_model *m = NULL;
    kvs_error err = {0};
    kvs_status st = kvs_model_load(path, &m, &err);
    /* The message names the file, once. */
    const char *at = strstr(err.msg, path);
    CHECKF(st != KVS_OK && strstr(err.msg, want) && at && !strstr(at + 1, path),
           "want '%s' and the path once, got status %d '%s'", want, st, err.msg);
    kvs_model_free(m);
}

int main(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_model.gguf");
    kvs_error err = {0};
    kvs_model *m = NULL;

    /* A well-formed model loads, and its forward pass gives finite logits. */
    defect ok = {0};
    CHECK(write_model(path, &ok) == KVS_OK);
    CHECKF(kvs_model_load(path, &m, &err) == KVS_OK, "%s", err.msg);
    if (m) {
        kvs_model_info info;
        kvs_model_get_info(m, &info);
        CHECK(info.n_vocab == VOCAB && info.n_layers == LAYERS && info.n_kv_heads == KV &&
              info.head_dim == DIM / HEADS && info.n_ctx == CTX);
        kvs_model_free(m);
    }

    kvs_hparams hp = {.dim = 48, .hidden = 96, .n_layers = 2, .n_heads = 6, .n_kv_heads = 3,
                      .vocab = 320, .ctx = 64};
    CHECKF(kvs_synthetic_write(&hp, KVS_WTYPE(KVS_Q8_0), 1, path, NULL, &err) == KVS_OK, "%s", err.msg);
    m = NULL;
    CHECKF(kvs_model_load(path, &m, &err) == KVS_OK, "%s", err.msg);
    if (m) {
        kvs_session *s = NULL;
        kvs_session_params p = kvs_session_default_params();
        p.n_threads = 2;
        p.chunk = 5;
        CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
        int32_t toks[12] = {1, 5, 9, 300, 4, 7, 8, 100, 200, 250, 3, 2};
        float *logits = malloc(sizeof(float) * 12 * 320), *one = malloc(sizeof(float) * 320);
        CHECK(kvs_session_eval(s, toks, 12, logits, 1, &err) == KVS_OK);
        int finite = 1;
        for (int i = 0; i < 12 * 320; i++)
            finite &= isfinite(logits[i]) != 0;
        CHECK(finite);
        /* Token by token gives the same logits as chunks of 5. */
        kvs_session_reset(s);
        double worst = 0;
        for (int t = 0; t < 12; t++) {
            CHECK(kvs_session_eval(s, &toks[t], 1, one, 0, &err) == KVS_OK);
            for (int i = 0; i < 320; i++)
                worst = fmax(worst, fabs(one[i] - logits[t * 320 + i]));
        }
        CHECKF(worst < 1e-4, "token-by-token vs chunked: %g", worst);
        int32_t bad = 320;
        CHECK(kvs_session_eval(s, &bad, 1, one, 0, &err) == KVS_ERR_ARG);
        CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
        CHECK(kvs_session_n_past(s) == 12);
        int32_t many[64] = {0};
        CHECK(kvs_session_eval(s, many, 60, NULL, 0, &err) == KVS_ERR_ARG);
        CHECK(strstr(err.msg, "exceed the context length 64") != NULL);
        /* Chunks of 20 tokens run the stages between the products on the thread pool (16
         * tokens or more): the same logits as token by token. */
        kvs_session *s2 = NULL;
        p.chunk = 20;
        CHECK(kvs_session_new(m, &p, &s2, &err) == KVS_OK);
        int32_t toks40[40];
        for (int t = 0; t < 40; t++)
            toks40[t] = (int32_t)((t * 37 + 11) % 320);
        float *logits40 = malloc(sizeof(float) * 40 * 320);
        CHECK(s2 && logits40 && kvs_session_eval(s2, toks40, 40, logits40, 1, &err) == KVS_OK);
        kvs_session_reset(s2);
        worst = 0;
        for (int t = 0; s2 && logits40 && t < 40; t++) {
            CHECK(kvs_session_eval(s2, &toks40[t], 1, one, 0, &err) == KVS_OK);
            for (int i = 0; i < 320; i++)
                worst = fmax(worst, fabs(one[i] - logits40[t * 320 + i]));
        }
        CHECKF(worst < 1e-4, "token-by-token vs chunks of 20: %g", worst);
        free(logits40);
        kvs_session_free(s2);
        free(logits);
        free(one);
        kvs_session_free(s);
        kvs_model_free(m);
    }

    defect d1 = {.skip_tensor = "blk.1.ffn_up.weight"};
    expect_load_error(path, &d1, "tensor 'blk.1.ffn_up.weight' is missing");
    defect d2 = {.bad_shape = "blk.0.attn_k.weight"};
    expect_load_error(path, &d2, "tensor 'blk.0.attn_k.weight' has shape");
    defect d3 = {.arch = "gpt2"};
    expect_load_error(path, &d3, "general.architecture is 'gpt2'");
    defect d4 = {.skip_key = "llama.block_count"};
    expect_load_error(path, &d4, "llama.block_count");
    defect d5 = {.heads_kv = 3};
    expect_load_error(path, &d5, "head_count_kv 3 does not divide head_count 4");
    defect d6 = {.skip_tensor = "token_embd.weight"};
    expect_load_error(path, &d6, "token_embd.weight");
    /* Tensors the loader would ignore are refused: blocks beyond block_count, unknown names. */
    defect d7 = {.block_count = LAYERS - 1};
    expect_load_error(path, &d7, "tensor 'blk.1.attn_norm.weight' belongs to block 1, but "
                                 "llama.block_count is 1");
    /* A block count far beyond the file's tensors is refused before the per-layer buffers are
     * allocated from it (fuzz/fuzz_gguf.c: a 22 KB file asked for 2.7 GB). */
    defect d7b = {.block_count = 65536};
    expect_load_error(path, &d7b, "llama.block_count 65536 and embedding_length 32 (32 query "
                                  "dims) need more weights than the file's");
    /* Sizes beyond kvslim's limits (core/limits.h) are refused with the key and the limit. */
    defect d7c = {.block_count = 100000000};
    expect_load_error(path, &d7c, "metadata key 'llama.block_count' is 100000000; kvslim "
                                  "supports at most 65536");
    defect d7d = {.ctx = (1u << 24) + 1};
    expect_load_error(path, &d7d, "metadata key 'llama.context_length' is 16777217; kvslim "
                                  "supports at most 16777216");
    defect d7e = {.ctx = UINT32_MAX};
    expect_load_error(path, &d7e, "'llama.context_length' is 4294967295");
    {   /* the limit itself loads, and a session on it allocates nothing from the context */
        defect ok = {.ctx = 1u << 24};
        CHECK(write_model(path, &ok) == KVS_OK);
        kvs_model *big = NULL;
        CHECKF(kvs_model_load(path, &big, &err) == KVS_OK, "%s", err.msg);
        kvs_session_params p = kvs_session_default_params();
        kvs_session *s = NULL;
        CHECKF(big && kvs_session_new(big, &p, &s, &err) == KVS_OK, "%s", err.msg);
        CHECK(s && kvs_session_ctx_left(s) == 1 << 24);
        kvs_session_free(s);
        p.n_ctx = (1 << 24) + 1;
        p.allow_ctx_beyond_trained = 1;
        CHECK(big && kvs_session_new(big, &p, &s, &err) == KVS_ERR_ARG && !s &&
              strstr(err.msg, "context length 16777217 exceeds kvslim's limit of 16777216"));
        kvs_model_free(big);
    }
    defect d8 = {.extra_tensor = "blk.0.attn_q.bias"};
    expect_load_error(path, &d8, "tensor 'blk.0.attn_q.bias' is not one kvslim's llama loader "
                                 "uses");
    defect d9 = {.extra_tensor = "blk.7.ffn_up.weight"};
    expect_load_error(path, &d9, "tensor 'blk.7.ffn_up.weight' belongs to block 7");
    defect d10 = {.extra_tensor = "output_norm.bias"};
    expect_load_error(path, &d10, "tensor 'output_norm.bias' is not one");
    {   /* a synthetic shape whose weight count would overflow size_t is refused up front */
        kvs_hparams hp = {.dim = 1 << 30, .hidden = 1 << 30, .n_layers = 1 << 30, .n_heads = 2,
                          .n_kv_heads = 2, .vocab = 1 << 30, .ctx = 1};
        kvs_status st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "weights are more than this machine can "
                                                    "address"), "%d %s", st, err.msg);
    }
    remove(path);
    return check_summary("model");
}
