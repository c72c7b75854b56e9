/* The architectures beyond llama2.c's block, against llama.cpp's logits
 * (../shared/models/arch/README.md): llama in Llama-3 style (queries wider than the embedding,
 * GQA, rope_freqs.weight, untied output), qwen2 (Q/K/V biases, NEOX RoPE, tied output) and
 * qwen3 (per-head Q/K RMSNorm, wide queries, NEOX, tied). For each F32 file: all 128 x 2048
 * teacher-forced logits in one batch, in chunks and token by token, and the greedy
 * continuation. Then bad files (copies rewritten with the project's GGUF writer): an
 * unsupported architecture, missing, misshapen and unexpected tensors, RoPE scaling; and the
 * refusals of the engines that implement the plain Llama block only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "fixture.h"
#include "gguf/gguf.h"
#include "kvslim.h"
#include "model/llama.h"
#include "mpc/fx_llama.h"

enum { N_SEQ = 128, VOCAB = 2048, N_GEN = 32, MAX_IDS = 256 };

/* README: llama.cpp's own paths agree to about 1.5e-5; a correct F32 engine lands within
 * about 1e-4. */
#define TOL 1e-4

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}


static const char *arch_path(char *buf, size_t size, const char *name, const char *suffix)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/arch/%s%s", name, suffix);
    return check_shared_path(buf, size, rel);
}

static float *read_f32(const char *path, size_t n)
{
    FILE *f = fopen(path, "rb");
    float *x = malloc(sizeof(float) * n);
    size_t got = f && x ? fread(x, sizeof(float), n, f) : 0;
    if (f)
        fclose(f);
    if (got != n) {
        free(x);
        return NULL;
    }
    return x;
}

/* The ids after "label:" in a greedy.txt; their count, or -1. */
static int read_ids(const char *path, const char *label, int32_t *out, int max)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = -1;
    size_t ll = strlen(label);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, label, ll) && line[ll] == ':') {
            n = 0;
            char *p = line + ll + 1, *end;
            for (long v; n < max && (v = strtol(p, &end, 10), end != p); p = end)
                out[n++] = (int32_t)v;
            break;
        }
    fclose(f);
    return n;
}

typedef struct diff {
    double max, rms;
    int top1; /* rows whose argmax agrees */
} diff;

static diff compare(const float *a, const float *gold, int rows)
{
    diff d = {0, 0, 0};
    double sq = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * VOCAB, *g = gold + (size_t)r * VOCAB;
        for (int i = 0; i < VOCAB; i++) {
            const double e = fabs((double)x[i] - (double)g[i]);
            d.max = e > d.max || isnan(e) ? e : d.max;
            sq += e * e;
        }
        d.top1 += fx_argmax(x, VOCAB) == fx_argmax(g, VOCAB);
    }
    d.rms = sqrt(sq / ((double)rows * VOCAB));
    return d;
}

static kvs_session *new_session(const kvs_model *m, int chunk, const char *policy)
{
    kvs_session_params p = kvs_session_default_params();
    p.n_threads = 2;
    p.n_ctx = 256;
    p.chunk = chunk;
    p.kv_type = "f32";
    p.kv_policy = policy;
    kvs_session *s = NULL;
    kvs_error err = {0};
    CHECKF(kvs_session_new(m, &p, &s, &err) == KVS_OK, "%s", err.msg);
    return s;
}

static void report(const char *name, const char *how, diff d, double secs)
{
    printf("%-10s %-14s max |diff| %.3g  rms %.3g  top-1 %d/%d  (%.1f ms)\n", name, how, d.max,
           d.rms, d.top1, N_SEQ, secs * 1e3);
    CHECKF(d.max <= TOL, "%s %s: max |diff| %g > %g", name, how, d.max, TOL);
    CHECKF(d.top1 == N_SEQ, "%s %s: top-1 agrees on %d of %d rows", name, how, d.top1, N_SEQ);
}

/* Teacher-forced logits of seq128.tokens in one batch, in chunks of 48 and token by token,
 * and the greedy continuation, against llama.cpp's. */
static void golden(const char *name)
{
    char path[512];
    kvs_error err = {0};
    kvs_model *m = NULL;
    double t0 = now();
    kvs_status st = kvs_model_load(arch_path(path, sizeof path, name, ".gguf"), &m, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st != KVS_OK)
        return;
    printf("%-10s load %.1f ms\n", name, (now() - t0) * 1e3);
    /* all F32: the bytes held are 4 per parameter, the biases and per-head norms included */
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    CHECKF(info.weight_bytes == 4 * (size_t)info.n_params, "%s: weight_bytes %zu for %lld "
           "parameters", name, info.weight_bytes, (long long)info.n_params);
    int tok[N_SEQ];
    int32_t ids[N_SEQ];
    CHECK(check_read_tokens(arch_path(path, sizeof path, "seq128", ".tokens"), tok, N_SEQ) ==
          N_SEQ);
    for (int i = 0; i < N_SEQ; i++)
        ids[i] = tok[i];
    float *gold = read_f32(arch_path(path, sizeof path, name, ".logits.f32"),
                           (size_t)N_SEQ * VOCAB);
    float *out = malloc(sizeof(float) * N_SEQ * VOCAB);
    CHECK(gold && out);

    static const int chunks[] = {N_SEQ, 48};
    for (size_t c = 0; gold && out && c < sizeof chunks / sizeof *chunks; c++) {
        kvs_session *s = new_session(m, chunks[c], NULL);
        if (!s)
            continue;
        memset(out, 0, sizeof(float) * N_SEQ * VOCAB);
        t0 = now();
        st = kvs_session_eval(s, ids, N_SEQ, out, 1, &err);
        double t = now() - t0;
        CHECKF(st == KVS_OK, "%s", err.msg);
        char how[32];
        snprintf(how, sizeof how, chunks[c] == N_SEQ ? "one batch" : "chunks of %d", chunks[c]);
        report(name, how, compare(out, gold, N_SEQ), t);

        if (chunks[c] == N_SEQ) { /* token by token: the first is the prompt, then decode */
            kvs_session_reset(s);
            memset(out, 0, sizeof(float) * N_SEQ * VOCAB);
            t0 = now();
            for (int i = 0; i < N_SEQ && st == KVS_OK; i++)
                st = kvs_session_eval(s, &ids[i], 1, out + (size_t)i * VOCAB, 0, &err);
            t = now() - t0;
            CHECKF(st == KVS_OK, "%s", err.msg);
            report(name, "token by token", compare(out, gold, N_SEQ), t);
        }
        kvs_session_free(s);
    }

    /* Greedy: the prompt as one batch, then N_GEN argmax tokens fed back one at a time. */
    int32_t prompt[MAX_IDS], want[MAX_IDS], got[N_GEN];
    arch_path(path, sizeof path, name, ".greedy.txt");
    int n_prompt = read_ids(path, "prompt_ids", prompt, MAX_IDS);
    int n_want = read_ids(path, "generated_ids", want, MAX_IDS);
    CHECKF(n_prompt > 0 && n_want == N_GEN, "%s: prompt %d ids, generated %d", path, n_prompt,
           n_want);
    kvs_session *s = n_prompt > 0 && n_want == N_GEN ? new_session(m, N_SEQ, NULL) : NULL;
    if (s && out) {
        t0 = now();
        st = kvs_session_eval(s, prompt, n_prompt, out, 0, &err);
        for (int g = 0; g < N_GEN && st == KVS_OK; g++) {
            got[g] = fx_argmax(out, VOCAB);
            if (g + 1 < N_GEN)
                st = kvs_session_eval(s, &got[g], 1, out, 0, &err);
        }
        double t = now() - t0;
        CHECKF(st == KVS_OK, "%s", err.msg);
        int same = 0, first_diff = -1;
        for (int g = 0; g < N_GEN && st == KVS_OK; g++) {
            same += got[g] == want[g];
            if (got[g] != want[g] && first_diff < 0)
                first_diff = g;
        }
        printf("%-10s greedy         %d/%d ids equal (%.1f ms for %d prompt + %d tokens)\n",
               name, same, N_GEN, t * 1e3, n_prompt, N_GEN);
        CHECKF(same == N_GEN, "%s greedy: first difference at %d: %d, llama.cpp %d", name,
               first_diff, first_diff >= 0 ? got[first_diff] : -1,
               first_diff >= 0 ? want[first_diff] : -1);
    }
    kvs_session_free(s);
    free(gold);
    free(out);
    kvs_model_free(m);
}

/* ---- rewritten copies ---- */

typedef struct edit {
    const char *arch;          /* general.architecture to write instead */
    const char *drop;          /* tensor left out */
    const char *shrink;        /* 1-D tensor written with half its elements */
    const char *extra;         /* one more F32 tensor of extra_n zeros */
    int extra_n;
    const char *str_key, *str_val; /* one more string key */
    const char *f32_key;           /* one more f32 key */
    float f32_val;
    const char *scale;         /* F32 tensor written with its values times scale_by */
    float scale_by;
} edit;

static char *dup_str(kvs_gguf_str s)
{
    char *p = malloc(s.len + 1);
    if (p) {
        memcpy(p, s.data, s.len);
        p[s.len] = 0;
    }
    return p;
}

/* One metadata entry of g copied to w, with its type. */
static kvs_status copy_key(kvs_gguf_writer *w, const kvs_gguf *g, uint64_t i, kvs_error *err)
{
    const char *key = kvs_gguf_key_at(g, i);
    const kvs_gguf_type t = kvs_gguf_key_type(g, i);
    kvs_status st = KVS_OK;
    if (t == KVS_GGUF_STRING) {
        kvs_gguf_str s;
        char *v = NULL;
        if ((st = kvs_gguf_get_str(g, key, &s, err)) == KVS_OK)
            st = (v = dup_str(s)) ? kvs_gguf_set_str(w, key, v) : KVS_ERR_NOMEM;
        free(v);
    } else if (t == KVS_GGUF_ARRAY) {
        kvs_gguf_type et;
        uint64_t n;
        if ((st = kvs_gguf_get_arr(g, key, &et, &n, err)) != KVS_OK)
            return st;
        if (et != KVS_GGUF_STRING)
            return kvs_gguf_set_arr(w, key, et, kvs_gguf_arr_data(g, key), n);
        char **v = calloc(n ? n : 1, sizeof *v);
        for (uint64_t k = 0; v && k < n && st == KVS_OK; k++) {
            kvs_gguf_str s;
            if ((st = kvs_gguf_arr_str(g, key, k, &s, err)) == KVS_OK && !(v[k] = dup_str(s)))
                st = KVS_ERR_NOMEM;
        }
        st = !v ? KVS_ERR_NOMEM : st ? st : kvs_gguf_set_arr_str(w, key, (const char *const *)v, n);
        for (uint64_t k = 0; v && k < n; k++)
            free(v[k]);
        free(v);
    } else if (t == KVS_GGUF_FLOAT32) {
        float v;
        if ((st = kvs_gguf_get_f32(g, key, &v, err)) == KVS_OK)
            st = kvs_gguf_set_f32(w, key, v);
    } else if (t == KVS_GGUF_FLOAT64) {
        double v;
        if ((st = kvs_gguf_get_f64(g, key, &v, err)) == KVS_OK)
            st = kvs_gguf_set_scalar(w, key, t, &v);
    } else if (t == KVS_GGUF_BOOL) {
        int v = 0;
        if ((st = kvs_gguf_get_bool_opt(g, key, &v, err)) == KVS_OK) {
            uint8_t b = (uint8_t)v;
            st = kvs_gguf_set_scalar(w, key, t, &b);
        }
    } else { /* integers: through 64 bits, stored back in their own width (little-endian) */
        int64_t v = 0;
        uint64_t u = 0;
        const int is_signed = t == KVS_GGUF_INT8 || t == KVS_GGUF_INT16 ||
                              t == KVS_GGUF_INT32 || t == KVS_GGUF_INT64;
        st = is_signed ? kvs_gguf_get_i64(g, key, &v, err) : kvs_gguf_get_u64(g, key, &u, err);
        if (st == KVS_OK) {
            uint8_t b[8];
            uint64_t bits = is_signed ? (uint64_t)v : u;
            for (int k = 0; k < 8; k++)
                b[k] = (uint8_t)(bits >> (8 * k));
            st = kvs_gguf_set_scalar(w, key, t, b);
        }
    }
    return st;
}

/* Writes a copy of src with e's changes to dst. */
static kvs_status copy_gguf(const char *src, const char *dst, const edit *e)
{
    kvs_error err = {0};
    kvs_gguf *g = NULL;
    kvs_status st = kvs_gguf_open(src, &g, &err);
    if (st != KVS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return st;
    }
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    float *scaled = NULL, *zeros = calloc(e->extra_n > 0 ? (size_t)e->extra_n : 1, sizeof *zeros);
    st = w && zeros ? KVS_OK : KVS_ERR_NOMEM;
    for (uint64_t i = 0; st == KVS_OK && i < kvs_gguf_n_keys(g); i++) {
        if (e->arch && !strcmp(kvs_gguf_key_at(g, i), "general.architecture"))
            st = kvs_gguf_set_str(w, "general.architecture", e->arch);
        else
            st = copy_key(w, g, i, &err);
    }
    if (st == KVS_OK && e->str_key)
        st = kvs_gguf_set_str(w, e->str_key, e->str_val);
    if (st == KVS_OK && e->f32_key)
        st = kvs_gguf_set_f32(w, e->f32_key, e->f32_val);
    for (uint64_t i = 0; st == KVS_OK && i < kvs_gguf_n_tensors(g); i++) {
        const kvs_gguf_tensor *t = kvs_gguf_tensor_at(g, i);
        uint64_t dims[KVS_GGUF_MAX_DIMS];
        memcpy(dims, t->dims, sizeof dims);
        const void *data = t->data;
        if (e->drop && !strcmp(t->name, e->drop))
            continue;
        if (e->shrink && !strcmp(t->name, e->shrink))
            dims[0] /= 2;
        if (e->scale && !strcmp(t->name, e->scale) && t->type == KVS_F32) {
            if (!(scaled = malloc(sizeof(float) * t->n_elems))) {
                st = KVS_ERR_NOMEM;
                break;
            }
            for (uint64_t k = 0; k < t->n_elems; k++)
                scaled[k] = ((const float *)t->data)[k] * e->scale_by;
            data = scaled;
        }
        st = kvs_gguf_add_tensor(w, t->name, t->type, t->n_dims, dims, data, &err);
    }
    if (st == KVS_OK && e->extra) {
        uint64_t dims[1] = {(uint64_t)e->extra_n};
        st = kvs_gguf_add_tensor(w, e->extra, KVS_F32, 1, dims, zeros, &err);
    }
    if (st == KVS_OK)
        st = kvs_gguf_write(w, dst, &err);
    if (st != KVS_OK)
        fprintf(stderr, "copy of %s: status %d %s\n", src, st, err.msg);
    kvs_gguf_writer_free(w);
    kvs_gguf_close(g);
    free(scaled);
    free(zeros);
    return st;
}

/* A copy of the named model with e's changes fails to load with status want_st and a message
 * holding each of the wants and the path. */
static void expect_error(const char *name, const edit *e, kvs_status want_st, const char *want1,
                         const char *want2)
{
    char src[512], dst[512];
    arch_path(src, sizeof src, name, ".gguf");
    check_tmp_path(dst, sizeof dst, "test_arch.gguf");
    CHECK(copy_gguf(src, dst, e) == KVS_OK);
    kvs_model *m = NULL;
    kvs_error err = {0};
    kvs_status st = kvs_model_load(dst, &m, &err);
    CHECKF(st == want_st && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)) &&
               strstr(err.msg, dst),
           "%s: want status %d with '%s'%s%s, got %d '%s'", name, want_st, want1,
           want2 ? " and " : "", want2 ? want2 : "", st, err.msg);
    kvs_model_free(m);
    remove(dst);
}

/* Logits of the first n tokens of seq128 in one batch. */
static int first_logits(const char *path, float *out, int n)
{
    int tok[N_SEQ];
    int32_t ids[N_SEQ];
    char tp[512];
    if (check_read_tokens(arch_path(tp, sizeof tp, "seq128", ".tokens"), tok, N_SEQ) != N_SEQ)
        return -1;
    for (int i = 0; i < n; i++)
        ids[i] = tok[i];
    kvs_model *m = NULL;
    kvs_error err = {0};
    kvs_session *s = NULL;
    int rc = -1;
    if (kvs_model_load(path, &m, &err) == KVS_OK && (s = new_session(m, N_SEQ, NULL)) &&
        kvs_session_eval(s, ids, n, out, 1, &err) == KVS_OK)
        rc = 0;
    if (rc)
        fprintf(stderr, "%s: %s\n", path, err.msg);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}

static void bad_files(void)
{
    /* An architecture kvslim does not have: the message lists the ones it has. */
    edit arch = {.arch = "phi3"};
    expect_error("qwen2-f32", &arch, KVS_ERR_UNSUPPORTED, "general.architecture is 'phi3'",
                 "supported: llama, qwen2, qwen3");
    /* Keys are read under the architecture's name. */
    edit relabel = {.arch = "qwen3"};
    expect_error("qwen2-f32", &relabel, KVS_ERR_FORMAT, "qwen3.", NULL);
    /* Missing and misshapen tensors of the new parts are named. */
    edit no_bias = {.drop = "blk.1.attn_v.bias"};
    expect_error("qwen2-f32", &no_bias, KVS_ERR_FORMAT, "tensor 'blk.1.attn_v.bias' is missing",
                 "qwen2 has Q/K/V biases");
    edit short_bias = {.shrink = "blk.0.attn_k.bias"};
    expect_error("qwen2-f32", &short_bias, KVS_ERR_FORMAT,
                 "tensor 'blk.0.attn_k.bias' has 64 elements; expected 128", NULL);
    edit no_norm = {.drop = "blk.0.attn_k_norm.weight"};
    expect_error("qwen3-f32", &no_norm, KVS_ERR_FORMAT,
                 "tensor 'blk.0.attn_k_norm.weight' is missing", "per-head Q/K norms");
    edit short_norm = {.shrink = "blk.1.attn_q_norm.weight"};
    expect_error("qwen3-f32", &short_norm, KVS_ERR_FORMAT,
                 "tensor 'blk.1.attn_q_norm.weight' has 32 elements; expected 64", NULL);
    edit short_freqs = {.shrink = "rope_freqs.weight"};
    expect_error("llama3-f32", &short_freqs, KVS_ERR_FORMAT,
                 "tensor 'rope_freqs.weight' has 16 elements; expected 32", NULL);
    edit no_q = {.drop = "blk.0.attn_q.weight"};
    expect_error("qwen3-f32", &no_q, KVS_ERR_FORMAT, "tensor 'blk.0.attn_q.weight' is missing",
                 NULL);
    /* Tensors an architecture does not have are refused, not ignored. */
    edit bias_in_qwen3 = {.extra = "blk.0.attn_q.bias", .extra_n = 512};
    expect_error("qwen3-f32", &bias_in_qwen3, KVS_ERR_FORMAT,
                 "tensor 'blk.0.attn_q.bias' is not one kvslim's qwen3 loader uses", NULL);
    edit freqs_in_qwen2 = {.extra = "rope_freqs.weight", .extra_n = 32};
    expect_error("qwen2-f32", &freqs_in_qwen2, KVS_ERR_FORMAT,
                 "tensor 'rope_freqs.weight' is not one kvslim's qwen2 loader uses", NULL);
    edit norm_in_llama = {.extra = "blk.1.attn_k_norm.weight", .extra_n = 64};
    expect_error("llama3-f32", &norm_in_llama, KVS_ERR_FORMAT,
                 "tensor 'blk.1.attn_k_norm.weight' is not one kvslim's llama loader uses",
                 NULL);
    /* RoPE scaling other than linear is refused. */
    edit yarn = {.str_key = "qwen3.rope.scaling.type", .str_val = "yarn"};
    expect_error("qwen3-f32", &yarn, KVS_ERR_UNSUPPORTED, "qwen3.rope.scaling.type is 'yarn'",
                 "'none' and 'linear'");

    /* Linear scaling by 2 on top of rope_freqs divides every frequency by 2 more: the same
     * logits as rope_freqs x 2, and not those of the file as it is. */
    char src[512], a[512], b[512];
    arch_path(src, sizeof src, "llama3-f32", ".gguf");
    check_tmp_path(a, sizeof a, "test_arch_linear.gguf");
    check_tmp_path(b, sizeof b, "test_arch_freqs2.gguf");
    edit linear = {.str_key = "llama.rope.scaling.type", .str_val = "linear",
                   .f32_key = "llama.rope.scaling.factor", .f32_val = 2.0f};
    edit freqs2 = {.scale = "rope_freqs.weight", .scale_by = 2.0f};
    enum { N = 24 };
    float *la = malloc(sizeof(float) * N * VOCAB), *lb = malloc(sizeof(float) * N * VOCAB),
          *l0 = malloc(sizeof(float) * N * VOCAB);
    CHECK(la && lb && l0 && copy_gguf(src, a, &linear) == KVS_OK &&
          copy_gguf(src, b, &freqs2) == KVS_OK);
    if (la && lb && l0 && first_logits(a, la, N) == 0 && first_logits(b, lb, N) == 0 &&
        first_logits(src, l0, N) == 0) {
        double same = 0, moved = 0;
        for (int i = 0; i < N * VOCAB; i++) {
            same = fmax(same, fabs((double)la[i] - lb[i]));
            moved = fmax(moved, fabs((double)la[i] - l0[i]));
        }
        printf("linear rope scaling x2: max |diff| %.3g against rope_freqs x2, %.3g against "
               "none\n", same, moved);
        CHECKF(same == 0 && moved > 1e-3, "linear x2: %g against rope_freqs x2, %g against none",
               same, moved);
    } else {
        CHECK(!"the rope-scaling copies load and run");
    }
    free(la);
    free(lb);
    free(l0);
    remove(a);
    remove(b);
}

/* What only the plain Llama block's engines refuse: the 2PC engine and its fixed-point
 * emulator, and position shifting (it re-rotates keys with unscaled frequencies). */
static void plain_refusals(void)
{
    static const struct {
        const char *name, *feature1, *feature2;
    } cases[] = {
        {"llama3-f32", "queries 512 wide", "rope_freqs.weight"},
        {"qwen2-f32", "Q/K/V biases", NULL},
        {"qwen3-f32", "queries 512 wide", "per-head Q/K RMSNorm"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[512];
        kvs_model *m = NULL;
        kvs_error err = {0};
        if (kvs_model_load(arch_path(path, sizeof path, cases[c].name, ".gguf"), &m, &err)) {
            CHECKF(0, "%s", err.msg);
            continue;
        }
        kvs_status st = kvs_llama_check_plain(m, "the two-party engine", &err);
        CHECKF(st == KVS_ERR_UNSUPPORTED && strstr(err.msg, cases[c].feature1) &&
                   (!cases[c].feature2 || strstr(err.msg, cases[c].feature2)) &&
                   strstr(err.msg, "two-party engine"),
               "%s: %d '%s'", cases[c].name, st, err.msg);
        if (c == 1)
            printf("2PC refusal: %s\n", err.msg);
        kvs_fx_llama *E = NULL;
        st = kvs_fx_llama_new(m, 16, NULL, 8, &E, &err);
        CHECKF(st == KVS_ERR_UNSUPPORTED && !E && strstr(err.msg, cases[c].feature1),
               "%s emulator: %d '%s'", cases[c].name, st, err.msg);
        kvs_fx_llama_free(E);

        kvs_session_params p = kvs_session_default_params();
        p.n_ctx = 256;
        p.kv_policy = "streaming:slots=64,shift=on";
        kvs_session *s = NULL;
        st = kvs_session_new(m, &p, &s, &err);
        if (c == 0)
            CHECKF(st == KVS_ERR_UNSUPPORTED && !s && strstr(err.msg, "position shifting") &&
                       strstr(err.msg, "rope_freqs.weight"),
                   "llama3 shifting: %d '%s'", st, err.msg);
        else
            CHECKF(st == KVS_OK && s, "%s shifting: %s", cases[c].name, err.msg);
        kvs_session_free(s);
        kvs_model_free(m);
    }
}

int main(void)
{
    static const char *const names[] = {"llama3-f32", "qwen2-f32", "qwen3-f32"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        golden(names[i]);
    bad_files();
    plain_refusals();
    return check_summary("arch");
}
