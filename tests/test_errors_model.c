/* Error paths of model loading and writing (issue 16): each malformed hyperparameter, tensor
 * or argument that the loaders, the llama2.c converter, the synthetic writer, the GGUF writer
 * and the session API refuse, with the status and the part of the message that names the key,
 * tensor, file or argument at fault. test_model.c covers the structural defects (missing or
 * misshapen tensors, unknown architecture, block counts); this covers the rest. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "gguf/gguf.h"
#include "kvslim.h"
#include "model/forward.h"
#include "model/llama.h"
#include "model/llama_write.h"

enum { DIM = 32, HIDDEN = 64, LAYERS = 1, HEADS = 4, KV = 2, VOCAB = 40, CTX = 64 };

static float zeros[VOCAB * DIM + DIM * HIDDEN];
static float ones[DIM + 1];

/* What a case changes in the otherwise valid model below. */
typedef struct tweak {
    void (*keys)(kvs_gguf_writer *w); /* called after the default keys (a key set twice is
                                       * replaced) */
    int emb_cols;                     /* token_embd.weight row length (0: DIM) */
    int n_tokens;                     /* tokenizer entries (0: VOCAB) */
    const float *rope_freqs;          /* write rope_freqs.weight (DIM / HEADS / 2 factors) */
    const char *arch;                 /* general.architecture (NULL: llama) */
    int out_rows;                     /* write an output.weight of this many rows (0: none) */
    int norm_len;                     /* output_norm.weight elements (0: DIM) */
    const char *extra;                /* one more tensor (DIM elements) of this name */
} tweak;

static void add(kvs_gguf_writer *w, const char *name, int rows, int cols, const float *data)
{
    uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows};
    kvs_error err;
    kvs_status st = kvs_gguf_add_tensor(w, name, KVS_F32, rows == 1 ? 1 : 2, dims, data, &err);
    CHECKF(st == KVS_OK, "%s: %s", name, err.msg);
}

static kvs_status write_model(const char *path, const tweak *t)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_gguf_set_str(w, "general.architecture", t->arch ? t->arch : "llama");
    kvs_gguf_set_u32(w, "llama.context_length", CTX);
    kvs_gguf_set_u32(w, "llama.embedding_length", DIM);
    kvs_gguf_set_u32(w, "llama.feed_forward_length", HIDDEN);
    kvs_gguf_set_u32(w, "llama.block_count", LAYERS);
    kvs_gguf_set_u32(w, "llama.attention.head_count", HEADS);
    kvs_gguf_set_u32(w, "llama.attention.head_count_kv", KV);
    if (t->keys)
        t->keys(w);
    fx_write_test_vocab(w, t->n_tokens ? t->n_tokens : VOCAB);
    add(w, "token_embd.weight", VOCAB, t->emb_cols ? t->emb_cols : DIM, zeros);
    add(w, "output_norm.weight", 1, t->norm_len ? t->norm_len : DIM, ones);
    if (t->out_rows)
        add(w, "output.weight", t->out_rows, DIM, zeros);
    if (t->extra)
        add(w, t->extra, 1, DIM, ones);
    if (t->rope_freqs)
        add(w, "rope_freqs.weight", 1, DIM / HEADS / 2, t->rope_freqs);
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        add(w, N("attn_norm.weight"), 1, DIM, ones);
        add(w, N("attn_q.weight"), DIM, DIM, zeros);
        add(w, N("attn_k.weight"), DIM / HEADS * KV, DIM, zeros);
        add(w, N("attn_v.weight"), DIM / HEADS * KV, DIM, zeros);
        add(w, N("attn_output.weight"), DIM, DIM, zeros);
        add(w, N("ffn_norm.weight"), 1, DIM, ones);
        add(w, N("ffn_gate.weight"), HIDDEN, DIM, zeros);
        add(w, N("ffn_up.weight"), HIDDEN, DIM, zeros);
        add(w, N("ffn_down.weight"), DIM, HIDDEN, zeros);
#undef N
    }
    kvs_error err;
    kvs_status st = kvs_gguf_write(w, path, &err);
    kvs_gguf_writer_free(w);
    return st;
}

/* Writes the tweaked model, loads it and checks the status and that the message names the
 * file and contains want. */
static void expect_load(const char *path, const tweak *t, kvs_status code, const char *want,
                        int line)
{
    CHECKF(write_model(path, t) == KVS_OK, "line %d: cannot write %s", line, path);
    kvs_model *m = NULL;
    kvs_error err = {0};
    kvs_status st = kvs_model_load(path, &m, &err);
    CHECKF(st == code && !m && strstr(err.msg, path) && strstr(err.msg, want),
           "line %d: status %d (want %d), msg '%s' (want '%s')", line, st, code, err.msg, want);
    kvs_model_free(m);
}
#define EXPECT_LOAD(t, code, want) expect_load(path, t, code, want, __LINE__)

/* Writes the tweaked model (t NULL: untweaked) and loads it, CHECKing both: the model or NULL. */
static kvs_model *load_ok(const char *path, const tweak *t, int line)
{
    static const tweak none = {0};
    CHECKF(write_model(path, t ? t : &none) == KVS_OK, "line %d: cannot write %s", line, path);
    kvs_model *m = NULL;
    kvs_error err = {0};
    CHECKF(kvs_model_load(path, &m, &err) == KVS_OK, "line %d: %s", line, err.msg);
    return m;
}
#define LOAD_OK(t) load_ok(path, t, __LINE__)

/* ---- hyperparameter defects ---- */
static void k_dim0(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.embedding_length", 0); }
static void k_ctx0(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.context_length", 0); }
static void k_keylen0(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.attention.key_length", 0); }
static void k_heads5(kvs_gguf_writer *w)
{
    kvs_gguf_set_u32(w, "llama.attention.head_count", 5);
    kvs_gguf_set_u32(w, "llama.attention.head_count_kv", 5);
}
static void k_vlen(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.attention.value_length", 4); }
static void k_rot_odd(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.rope.dimension_count", 3); }
static void k_rot_wide(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.rope.dimension_count", 10); }
static void k_eps0(kvs_gguf_writer *w)
{
    kvs_gguf_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 0.0f);
}
static void k_base1(kvs_gguf_writer *w) { kvs_gguf_set_f32(w, "llama.rope.freq_base", 1.0f); }
static void k_scale_neg(kvs_gguf_writer *w) { kvs_gguf_set_f32(w, "llama.rope.scaling.factor", -2.0f); }
static void k_scale_inf(kvs_gguf_writer *w) { kvs_gguf_set_f32(w, "llama.rope.scale_linear", INFINITY); }
static void k_scale2(kvs_gguf_writer *w) { kvs_gguf_set_f32(w, "llama.rope.scaling.factor", 2.0f); }
static void k_yarn(kvs_gguf_writer *w) { kvs_gguf_set_str(w, "llama.rope.scaling.type", "yarn"); }
static void k_none(kvs_gguf_writer *w) { kvs_gguf_set_str(w, "llama.rope.scaling.type", "none"); }
static void k_type_u32(kvs_gguf_writer *w) { kvs_gguf_set_u32(w, "llama.rope.scaling.type", 1); }
static void k_factor_str(kvs_gguf_writer *w) { kvs_gguf_set_str(w, "llama.rope.scaling.factor", "2"); }
static void k_kv_str(kvs_gguf_writer *w) { kvs_gguf_set_str(w, "llama.attention.head_count_kv", "2"); }
/* queries of 2^20 heads x 2^20 wide: 2^40 dims, beyond an int, refused before allocating */
static void k_huge_q(kvs_gguf_writer *w)
{
    kvs_gguf_set_u32(w, "llama.attention.head_count", 1u << 20);
    kvs_gguf_set_u32(w, "llama.attention.head_count_kv", 1u << 20);
    kvs_gguf_set_u32(w, "llama.attention.key_length", 1u << 20);
}
/* An f64 beyond float's range where an f32 is read: refused by the GGUF getter. */
static void k_eps_f64(kvs_gguf_writer *w)
{
    double big = 1e300;
    kvs_gguf_set_scalar(w, "llama.attention.layer_norm_rms_epsilon", KVS_GGUF_FLOAT64, &big);
}

static void test_hparams(const char *path)
{
    kvs_model_free(LOAD_OK(NULL)); /* the valid model */

    EXPECT_LOAD(&((tweak){.keys = k_dim0}), KVS_ERR_FORMAT,
                "llama metadata: embedding_length, feed_forward_length, block_count, head_count "
                "and context_length must all be positive");
    EXPECT_LOAD(&((tweak){.keys = k_ctx0}), KVS_ERR_FORMAT, "must all be positive");
    EXPECT_LOAD(&((tweak){.keys = k_keylen0}), KVS_ERR_FORMAT,
                "llama.attention.key_length must be positive");
    EXPECT_LOAD(&((tweak){.keys = k_heads5}), KVS_ERR_FORMAT,
                "llama.embedding_length 32 is not a multiple of head_count 5 (and there is no "
                "llama.attention.key_length)");
    EXPECT_LOAD(&((tweak){.keys = k_vlen}), KVS_ERR_UNSUPPORTED,
                "llama.attention.value_length 4 differs from the key length 8");
    EXPECT_LOAD(&((tweak){.keys = k_rot_odd}), KVS_ERR_FORMAT,
                "llama.rope.dimension_count 3 must be even and at most head dim 8");
    EXPECT_LOAD(&((tweak){.keys = k_rot_wide}), KVS_ERR_FORMAT,
                "llama.rope.dimension_count 10 must be even");
    EXPECT_LOAD(&((tweak){.keys = k_eps0}), KVS_ERR_FORMAT,
                "llama.attention.layer_norm_rms_epsilon must be > 0 and llama.rope.freq_base > 1");
    EXPECT_LOAD(&((tweak){.keys = k_base1}), KVS_ERR_FORMAT, "llama.rope.freq_base > 1");
    EXPECT_LOAD(&((tweak){.keys = k_scale_neg}), KVS_ERR_FORMAT,
                "llama.rope.scaling.factor is -2; it must be a positive number");
    /* without rope.scaling.factor, the older key is read, and named */
    EXPECT_LOAD(&((tweak){.keys = k_scale_inf}), KVS_ERR_FORMAT,
                "llama.rope.scale_linear is inf; it must be a positive number");
    EXPECT_LOAD(&((tweak){.keys = k_yarn}), KVS_ERR_UNSUPPORTED,
                "llama.rope.scaling.type is 'yarn': kvslim implements RoPE scaling 'none' and "
                "'linear' only");
    EXPECT_LOAD(&((tweak){.keys = k_type_u32}), KVS_ERR_FORMAT, "llama.rope.scaling.type");
    EXPECT_LOAD(&((tweak){.keys = k_factor_str}), KVS_ERR_FORMAT, "llama.rope.scaling.factor");
    EXPECT_LOAD(&((tweak){.keys = k_kv_str}), KVS_ERR_FORMAT, "llama.attention.head_count_kv");
    EXPECT_LOAD(&((tweak){.keys = k_huge_q}), KVS_ERR_FORMAT,
                "(1099511627776 query dims) need more weights than the file's");
    {   /* an architecture name is quoted up to 64 bytes */
        char arch[101];
        memset(arch, 'x', 100);
        arch[100] = '\0';
        char want[128];
        snprintf(want, sizeof want, "general.architecture is '%.64s', which", arch);
        EXPECT_LOAD(&((tweak){.arch = arch}), KVS_ERR_UNSUPPORTED, want);
    }
    kvs_model_free(LOAD_OK(&((tweak){.keys = k_none}))); /* "none" is no scaling: loads */
    EXPECT_LOAD(&((tweak){.keys = k_eps_f64}), KVS_ERR_FORMAT,
                "metadata key 'llama.attention.layer_norm_rms_epsilon': value 1e+300 does not "
                "fit in f32");
}

/* ---- tensor defects ---- */
static void test_tensors(const char *path)
{
    EXPECT_LOAD(&((tweak){.emb_cols = DIM + 1}), KVS_ERR_FORMAT,
                "tensor 'token_embd.weight' must have shape [32, n_vocab]");
    /* one RoPE factor per rotated pair (4 here); each must be positive and finite */
    const float zero_at_2[4] = {1, 1, 0, 1}, nan_at_0[4] = {NAN, 1, 1, 1};
    EXPECT_LOAD(&((tweak){.rope_freqs = zero_at_2}), KVS_ERR_FORMAT,
                "tensor 'rope_freqs.weight': factor 2 is 0; factors must be positive and finite");
    EXPECT_LOAD(&((tweak){.rope_freqs = nan_at_0}), KVS_ERR_FORMAT,
                "tensor 'rope_freqs.weight': factor 0 is nan");
    EXPECT_LOAD(&((tweak){.norm_len = DIM + 1}), KVS_ERR_FORMAT,
                "tensor 'output_norm.weight' has 33 elements; expected 32");
    EXPECT_LOAD(&((tweak){.out_rows = VOCAB + 1}), KVS_ERR_FORMAT,
                "tensor 'output.weight' has shape [32, 41] (2 dims); expected [32, 40]");
    /* block numbers: up to 10 digits are read (no overflow); a longer one, or none, is not a
     * block's name */
    EXPECT_LOAD(&((tweak){.extra = "blk.9999999999.attn_q.weight"}), KVS_ERR_FORMAT,
                "belongs to block 9999999999, but llama.block_count is 1");
    EXPECT_LOAD(&((tweak){.extra = "blk.12345678901.attn_q.weight"}), KVS_ERR_FORMAT,
                "tensor 'blk.12345678901.attn_q.weight' is not one kvslim's llama loader uses");
    EXPECT_LOAD(&((tweak){.extra = "blk.x.attn_q.weight"}), KVS_ERR_FORMAT,
                "tensor 'blk.x.attn_q.weight' is not one kvslim's llama loader uses");
    EXPECT_LOAD(&((tweak){.extra = "token_embd.bias"}), KVS_ERR_FORMAT,
                "tensor 'token_embd.bias' is not one");
    EXPECT_LOAD(&((tweak){.extra = "rope_freqs.bias"}), KVS_ERR_FORMAT,
                "tensor 'rope_freqs.bias' is not one");
    {   /* an untied output of the right shape, valid RoPE factors, and a tensor of another
         * naming scheme (not the llama loader's to judge) load */
        const float freqs[4] = {1, 2, 4, 8};
        tweak fine = {.out_rows = VOCAB, .rope_freqs = freqs, .extra = "mm.projector.weight"};
        kvs_model_free(LOAD_OK(&fine));
    }
    /* the vocabulary of the tokenizer and of the embedding must agree */
    EXPECT_LOAD(&((tweak){.n_tokens = VOCAB - 1}), KVS_ERR_FORMAT,
                "tokenizer.ggml.tokens has 39 entries but token_embd.weight has 40 rows");
}

/* ---- sessions ---- */
static void test_session(const char *path)
{
    kvs_error err = {0};
    kvs_model *m = LOAD_OK(NULL);
    if (!m)
        return;
    kvs_session_params p = kvs_session_default_params();
    kvs_session *s = NULL;
    const int threads[] = {0, -1, 257};
    for (int i = 0; i < 3; i++) {
        p.n_threads = threads[i];
        kvs_status st = kvs_session_new(m, &p, &s, &err);
        char want[64];
        snprintf(want, sizeof want, "threads must be in [1, 256], got %d", threads[i]);
        CHECKF(st == KVS_ERR_ARG && !s && strstr(err.msg, want), "%d '%s'", st, err.msg);
    }
    /* Position shifting moves keys away from the positions the recall measurement compares
     * them at: the two are refused together. */
    p = kvs_session_default_params();
    p.kv_policy = "h2o:slots=16";
    p.context_shift = 1;
    p.measure_recall = 1;
    kvs_status st = kvs_session_new(m, &p, &s, &err);
    CHECKF(st == KVS_ERR_ARG && !s && strstr(err.msg, "position shifting cannot be combined "
                                                      "with the attention recall measurement"),
           "%d '%s'", st, err.msg);
    /* An empty batch is an error, not a no-op (and the session is left as it was). */
    p = kvs_session_default_params();
    CHECKF(kvs_session_new(m, &p, &s, &err) == KVS_OK, "%s", err.msg);
    int32_t tok[2] = {1, 5};
    float logits[VOCAB];
    CHECK(s && kvs_session_eval(s, tok, 2, logits, 0, &err) == KVS_OK);
    const int ns[] = {0, -3};
    for (int i = 0; s && i < 2; i++) {
        st = kvs_session_eval(s, tok, ns[i], logits, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "no tokens to evaluate"), "n=%d: %d '%s'",
               ns[i], st, err.msg);
        CHECK(kvs_session_n_past(s) == 2);
    }
    kvs_session_free(s);

    /* NULL arguments are named */
    int32_t *ids = NULL;
    int n_ids = 0;
    static const char *const nulls[] = {"the model is NULL", "text is NULL", "ids is NULL",
                                        "n_ids is NULL"};
    for (int i = 0; i < 4; i++) {
        st = kvs_tokenize_special(i == 0 ? NULL : m, i == 1 ? NULL : "p3", 0, 0,
                                  i == 2 ? NULL : &ids, i == 3 ? NULL : &n_ids, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "kvs_tokenize_special: ") &&
                   strstr(err.msg, nulls[i]) && !ids && n_ids == 0, "%d: %d '%s'", i, st,
               err.msg);
    }
    p = kvs_session_default_params();
    static const char *const snulls[] = {"the model is NULL", "params is NULL", "out is NULL"};
    for (int i = 0; i < 3; i++) {
        s = NULL;
        st = kvs_session_new(i == 0 ? NULL : m, i == 1 ? NULL : &p, i == 2 ? NULL : &s, &err);
        CHECKF(st == KVS_ERR_ARG && !s && strstr(err.msg, "kvs_session_new: ") &&
                   strstr(err.msg, snulls[i]), "%d: %d '%s'", i, st, err.msg);
    }
    st = kvs_session_eval(NULL, tok, 1, logits, 0, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "kvs_session_eval: the session is NULL"),
           "%d '%s'", st, err.msg);
    CHECK(kvs_session_n_past(NULL) == 0);
    kvs_model_free(m);

    /* Shifting re-rotates keys with the unscaled frequencies: refused on a scaled model. */
    m = LOAD_OK(&((tweak){.keys = k_scale2}));
    p = kvs_session_default_params();
    p.kv_policy = "h2o:slots=16";
    p.context_shift = 1;
    s = NULL;
    st = m ? kvs_session_new(m, &p, &s, &err) : KVS_OK;
    CHECKF(st == KVS_ERR_UNSUPPORTED && !s && strstr(err.msg, path) &&
               strstr(err.msg, "scales them"), "%d '%s'", st, err.msg);
    kvs_model_free(m);
}

/* ---- the forward pass's own argument checks (the session checks first, so these guard the
 * internal API) ---- */
static void test_forward(const char *path)
{
    kvs_error err = {0};
    kvs_model *m = LOAD_OK(NULL);
    if (!m)
        return;
    kvs_forward_buf b;
    kvs_status st = kvs_forward_buf_init(&b, &m->hp, 4, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st == KVS_OK) {
        /* nothing is touched before the checks: no pool, no KV cache */
        int32_t toks[5] = {1, 2, 3, 4, 5};
        st = kvs_forward(m, NULL, NULL, &b, toks, 5, 0, NULL, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "batch of 5 tokens (capacity 4)"), "%d '%s'",
               st, err.msg);
        st = kvs_forward(m, NULL, NULL, &b, toks, 0, 0, NULL, 0, &err);
        CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "batch of 0 tokens (capacity 4)"), "%d '%s'",
               st, err.msg);
        const int32_t bad[2][2] = {{1, VOCAB}, {-1, 1}};
        for (int i = 0; i < 2; i++) {
            st = kvs_forward(m, NULL, NULL, &b, bad[i], 2, 0, NULL, 0, &err);
            char want[64];
            snprintf(want, sizeof want, "token id %d is outside the vocabulary [0, %d)",
                     bad[i][0] == 1 ? VOCAB : -1, VOCAB);
            CHECKF(st == KVS_ERR_ARG && strstr(err.msg, want), "%d '%s'", st, err.msg);
        }
        kvs_forward_buf_free(&b);
    }
    kvs_model_free(m);
}

/* A regular file that cannot be mapped: sysfs attributes are regular files of 4096 bytes whose
 * mmap fails (ENODEV). Returns the path, or NULL if this machine has none (probed). */
static const char *unmappable_file(void)
{
    static const char *const cands[] = {"/sys/kernel/mm/transparent_hugepage/enabled",
                                        "/sys/power/state", "/sys/kernel/profiling"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        struct stat sb;
        int fd = open(cands[i], O_RDONLY);
        if (fd < 0)
            continue;
        int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0;
        if (ok) {
            void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p != MAP_FAILED) {
                munmap(p, (size_t)sb.st_size);
                ok = 0;
            }
        }
        close(fd);
        if (ok)
            return cands[i];
    }
    return NULL;
}

static void test_unmappable(const char *out)
{
    const char *f = unmappable_file();
    if (!f) {
        printf("no unmappable regular file here: the mmap failures are not tested\n");
        return;
    }
    kvs_error err = {0};
    kvs_gguf *g = NULL;
    kvs_status st = kvs_gguf_open(f, &g, &err);
    char want[256];
    snprintf(want, sizeof want, "%s: cannot map: ", f);
    CHECKF(st == KVS_ERR_IO && !g && strstr(err.msg, want), "%d '%s'", st, err.msg);
    kvs_gguf_close(g);
    char tok[512];
    check_shared_path(tok, sizeof tok, "models/tok512.bin");
    st = kvs_llama2c_convert(f, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    snprintf(want, sizeof want, "%s: mmap failed: ", f);
    CHECKF(st == KVS_ERR_IO && strstr(err.msg, want), "%d '%s'", st, err.msg);
}

/* ---- the synthetic writer ---- */
static void test_synthetic(const char *path)
{
    kvs_error err = {0};
    const kvs_hparams good = {.dim = 16, .hidden = 32, .n_layers = 1, .n_heads = 2,
                              .n_kv_heads = 1, .vocab = 8, .ctx = 8};
    kvs_hparams hp = good;
    hp.vocab = 0;
    kvs_status st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "synthetic shape: every size must be positive"),
           "%d '%s'", st, err.msg);
    hp = good;
    hp.n_kv_heads = -1;
    st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "every size must be positive"), "%d '%s'", st,
           err.msg);
    /* heads must split dim into even head sizes, and kv_heads must divide heads */
    hp = good;
    hp.n_heads = 3;
    st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "synthetic shape: heads=3 must divide dim=16 "
                                                "into an even head size and kv_heads=1 must "
                                                "divide heads"), "%d '%s'", st, err.msg);
    hp = good;
    hp.n_heads = 16; /* head size 1: odd */
    st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "heads=16 must divide dim=16"), "%d '%s'", st,
           err.msg);
    hp = good;
    hp.n_kv_heads = 3;
    st = kvs_synthetic_write(&hp, KVS_WTYPE(KVS_F32), 1, path, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "kv_heads=3 must divide heads"), "%d '%s'", st,
           err.msg);
    st = kvs_synthetic_write(&good, KVS_WTYPE(KVS_F32), 1, NULL, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "synthetic model: NULL path"), "%d '%s'", st,
           err.msg);
}

/* ---- the llama2.c converter ---- */

/* A llama2.c checkpoint: the 7-int header and n_floats zero floats. */
static void write_ck(const char *path, const int32_t h[7], size_t n_floats)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    fwrite(h, 4, 7, f);
    float z = 0;
    for (size_t i = 0; i < n_floats; i++)
        fwrite(&z, 4, 1, f);
    CHECK(fclose(f) == 0);
}

static void test_llama2c(const char *ck, const char *out)
{
    char tok[512];
    check_shared_path(tok, sizeof tok, "models/tok512.bin");
    kvs_error err = {0};
    /* dim 8, hidden 8, 1 layer, 2 heads, 2 KV heads, vocab 4, seq_len 2: 32 embedding floats,
     * 464 layer floats, 8 final norm, 8 of RoPE tables = 512 */
    const int32_t h[7] = {8, 8, 1, 2, 2, 4, 2};
    write_ck(ck, h, 512 + 3);
    kvs_status st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_FORMAT && strstr(err.msg, ck) &&
               strstr(err.msg, ": 12 unexpected trailing bytes after the last tensor"),
           "%d '%s'", st, err.msg);
    const int32_t h3[7] = {8, 8, 1, 3, 1, 4, 2}; /* 3 heads do not divide 8 */
    write_ck(ck, h3, 512);
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_FORMAT && strstr(err.msg, ck) &&
               strstr(err.msg, "header: n_heads 3 must divide dim 8 into an even head size, and "
                               "n_kv_heads 1 must divide n_heads"), "%d '%s'", st, err.msg);
    const int32_t h8[7] = {8, 8, 1, 8, 8, 4, 2}; /* head size 1 is odd */
    write_ck(ck, h8, 512);
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_FORMAT && strstr(err.msg, "n_heads 8 must divide dim 8"), "%d '%s'", st,
           err.msg);
    /* a negative vocab_size: an unshared classifier (wcls, vocab x dim) follows the RoPE
     * tables, and is counted in the size the header implies */
    const int32_t hc[7] = {8, 8, 1, 2, 2, -4, 2};
    write_ck(ck, hc, 512);
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_FORMAT && strstr(err.msg, "truncated checkpoint") &&
               strstr(err.msg, "vocab_size -4, seq_len 2) needs 544 floats, the file holds 512"),
           "%d '%s'", st, err.msg);
    write_ck(ck, hc, 544 + 1);
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_FORMAT && strstr(err.msg, ": 4 unexpected trailing bytes"), "%d '%s'",
           st, err.msg);
    /* the output is never one of the inputs, and is refused before anything is read */
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), ck, NULL, &err);
    CHECKF(st == KVS_ERR_IO && strstr(err.msg, ck) &&
               strstr(err.msg, "is the same file as the checkpoint"), "%d '%s'", st, err.msg);
    /* kvs_llama2c_sniff: plausible header fields and the exact size they imply */
    write_ck(ck, hc, 544);
    CHECK(kvs_llama2c_sniff(ck) == 1);
    write_ck(ck, hc, 545);
    CHECK(kvs_llama2c_sniff(ck) == 0);
    write_ck(ck, h, 512);
    CHECK(kvs_llama2c_sniff(ck) == 1);
    write_ck(ck, h3, 512); /* heads do not divide dim */
    CHECK(kvs_llama2c_sniff(ck) == 0);
    const int32_t hbig[7] = {1 << 24, 1 << 24, 1 << 24, 1, 1, 4, 2}; /* implies > 2^60 floats */
    write_ck(ck, hbig, 0);
    CHECK(kvs_llama2c_sniff(ck) == 0);
    const int32_t hzero[7] = {8, 8, 0, 2, 2, 4, 2};
    write_ck(ck, hzero, 0);
    CHECK(kvs_llama2c_sniff(ck) == 0);
    remove(ck);
    CHECK(kvs_llama2c_sniff(ck) == 0); /* absent */
    /* the checkpoint cannot be opened, or is not a file */
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_IO && strstr(err.msg, ck) && strstr(err.msg, "No such file"), "%d '%s'",
           st, err.msg);
    CHECK(mkdir(ck, 0700) == 0);
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_IO && strstr(err.msg, ck) && strstr(err.msg, ": not a regular file"),
           "%d '%s'", st, err.msg);
    CHECK(kvs_llama2c_sniff(ck) == 0); /* a directory */
    CHECK(rmdir(ck) == 0);
    /* NULL arguments */
    st = kvs_llama2c_convert(NULL, tok, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "convert: NULL argument"), "%d '%s'", st,
           err.msg);
    st = kvs_llama2c_convert(ck, NULL, KVS_WTYPE(KVS_F32), out, NULL, &err);
    CHECK(st == KVS_ERR_ARG && strstr(err.msg, "convert: NULL argument"));
    st = kvs_llama2c_convert(ck, tok, KVS_WTYPE(KVS_F32), NULL, NULL, &err);
    CHECK(st == KVS_ERR_ARG && strstr(err.msg, "convert: NULL argument"));
    CHECK(access(out, F_OK) != 0); /* nothing was written */
}

/* ---- the GGUF writer ---- */
static void test_gguf_writer(const char *path)
{
    kvs_error err = {0};
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    uint64_t dims[2] = {4, 2};
    float data[8] = {0};
    kvs_status st = kvs_gguf_add_tensor(w, "t", KVS_F32, 2, dims, NULL, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "add tensor: NULL argument"), "%d '%s'", st,
           err.msg);
    CHECK(kvs_gguf_add_tensor(NULL, "t", KVS_F32, 2, dims, data, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_add_tensor(w, NULL, KVS_F32, 2, dims, data, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_add_tensor(w, "t", KVS_F32, 2, NULL, data, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "NULL argument"));
    uint64_t zero[2] = {4, 0};
    st = kvs_gguf_add_tensor(w, "t", KVS_F32, 2, zero, data, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "tensor 't': dims[1] = 0 is zero or overflows "
                                                "the element count"), "%d '%s'", st, err.msg);
    uint64_t huge[2] = {1ull << 40, 1ull << 40}; /* 2^80 elements */
    st = kvs_gguf_add_tensor(w, "t", KVS_F32, 2, huge, data, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "tensor 't': dims[1] = 1099511627776 is zero or "
                                                "overflows"), "%d '%s'", st, err.msg);
    /* Nothing failed above was added: a valid tensor of the same name still goes in. */
    CHECKF(kvs_gguf_add_tensor(w, "t", KVS_F32, 2, dims, data, &err) == KVS_OK, "%s", err.msg);

    st = kvs_gguf_write(NULL, path, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, "GGUF write: NULL argument"), "%d '%s'", st,
           err.msg);
    CHECK(kvs_gguf_write(w, NULL, &err) == KVS_ERR_ARG && strstr(err.msg, "NULL argument"));
    /* A device is written through: /dev/full fails every write with ENOSPC, reported with the
     * path. */
    if (access("/dev/full", W_OK) == 0) {
        st = kvs_gguf_write(w, "/dev/full", &err);
        CHECKF(st == KVS_ERR_IO && strstr(err.msg, "/dev/full: write failed: No space left"),
               "%d '%s'", st, err.msg);
    }
    kvs_gguf_writer_free(w);

    /* Two tensors of 2^63 bytes each (the data is only referenced, never read before the
     * sizes are summed): their total overflows 64 bits, refused before the file is opened. */
    w = kvs_gguf_writer_new();
    uint64_t big[2] = {1ull << 30, 1ull << 31}; /* 2^61 f32 elements = 2^63 bytes */
    CHECKF(kvs_gguf_add_tensor(w, "a", KVS_F32, 2, big, data, &err) == KVS_OK, "%s", err.msg);
    CHECKF(kvs_gguf_add_tensor(w, "b", KVS_F32, 2, big, data, &err) == KVS_OK, "%s", err.msg);
    remove(path);
    st = kvs_gguf_write(w, path, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, path) &&
               strstr(err.msg, ": tensor data too large"), "%d '%s'", st, err.msg);
    CHECK(access(path, F_OK) != 0);
    kvs_gguf_writer_free(w);
}

/* The writer's setters refuse what the reader would refuse (they return the status only). */
static void test_gguf_setters(const char *path)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    uint32_t u = 7;
    uint8_t two = 2, bools[3] = {0, 1, 2};
    /* keys: NULL, empty, invalid UTF-8; and a NULL writer */
    CHECK(kvs_gguf_set_u32(w, NULL, 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "", 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "bad.\xff", 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(NULL, "k", 1) == KVS_ERR_ARG);
    /* scalar types: not STRING, ARRAY or an invalid id; a value; bools 0 or 1 */
    CHECK(kvs_gguf_set_scalar(w, "k", KVS_GGUF_STRING, &u) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_scalar(w, "k", KVS_GGUF_ARRAY, &u) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_scalar(w, "k", (kvs_gguf_type)13, &u) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_scalar(w, "k", KVS_GGUF_UINT32, NULL) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_scalar(w, "k", KVS_GGUF_BOOL, &two) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr(w, "k", KVS_GGUF_STRING, &u, 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr(w, "k", KVS_GGUF_UINT32, NULL, 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr(w, "k", KVS_GGUF_UINT32, &u, UINT64_MAX / 2) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr(w, "k", KVS_GGUF_BOOL, bools, 3) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr(w, "k", KVS_GGUF_BOOL, bools, 2) == KVS_OK);
    CHECK(kvs_gguf_set_arr(w, "empty", KVS_GGUF_UINT32, NULL, 0) == KVS_OK);
    CHECK(kvs_gguf_set_str(w, "k", NULL) == KVS_ERR_ARG);
    const char *with_null[2] = {"a", NULL};
    CHECK(kvs_gguf_set_arr_str(w, "k", NULL, 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_arr_str(w, "k", with_null, 2) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "general.alignment", 0) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "general.alignment", 48) == KVS_ERR_ARG);
    /* a key set twice keeps the last value, also across types; nothing refused was stored */
    CHECK(kvs_gguf_set_u32(w, "k", 1) == KVS_OK);
    CHECK(kvs_gguf_set_str(w, "k", "last") == KVS_OK);
    kvs_error err = {0};
    CHECKF(kvs_gguf_write(w, path, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf_str str = {0};
    CHECK(g && kvs_gguf_n_keys(g) == 2 && kvs_gguf_get_str(g, "k", &str, &err) == KVS_OK &&
          str.len == 4 && !memcmp(str.data, "last", 4));
    kvs_gguf_close(g);
    /* general.alignment of another type than u32 is refused when writing */
    CHECK(kvs_gguf_set_u64(w, "general.alignment", 64) == KVS_OK);
    kvs_status st = kvs_gguf_write(w, path, &err);
    CHECKF(st == KVS_ERR_ARG && strstr(err.msg, path) &&
               strstr(err.msg, ": general.alignment must be a u32 power of two"), "%d '%s'", st,
           err.msg);
    kvs_gguf_writer_free(w);
}

int main(void)
{
    char path[512], ck[512], out[512];
    check_tmp_path(path, sizeof path, "test_errors_model.gguf");
    check_tmp_path(ck, sizeof ck, "test_errors_model.bin");
    check_tmp_path(out, sizeof out, "test_errors_model_out.gguf");
    for (int i = 0; i <= DIM; i++)
        ones[i] = 1.0f;
    test_hparams(path);
    test_tensors(path);
    test_session(path);
    test_forward(path);
    test_unmappable(out);
    test_synthetic(path);
    test_llama2c(ck, out);
    test_gguf_writer(path);
    test_gguf_setters(path);
    remove(path);
    remove(ck);
    remove(out);
    return check_summary("errors_model");
}
