/* The Q4_K / Q5_K / Q6_K quantisers (core/quantize_kq.c) and the K-quant weight mixes of the
 * GGUF writer (model/llama_write.c): round trips through the reference dequantiser within the
 * quantiser's stated per-element bound on several distributions, the rmse on N(0, 1), and
 * synthetic q4_k_m / q5_k_m / q6_k models whose tensor types match llama.cpp's own files and
 * which load and evaluate to finite logits. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/dequant.h"
#include "core/kernels.h"
#include "gguf/gguf.h"
#include "kvslim.h"
#include "model/llama_write.h"

#include "rng.h"
/* Uniform in (0, 1). */
static double rnd_open(void) { return ((rnd_u32() >> 8) + 0.5) * (1.0 / 16777216.0); }
static float rnd_normal(void)
{
    return (float)(sqrt(-2.0 * log(rnd_open())) * cos(2.0 * M_PI * rnd_open()));
}

/* ---- distributions --------------------------------------------------------------------------- */

typedef enum dist {
    D_NORMAL, D_UNIFORM, D_ZEROS, D_OUTLIER, D_NEGATIVE, D_POSITIVE, D_TINY, D_LARGE, D_CONST,
    D_SPARSE, N_DIST
} dist;
static const char *const dist_names[N_DIST] = {"normal",   "uniform", "zeros", "outlier",
                                               "negative", "positive", "tiny", "large",
                                               "constant", "sparse"};

static void fill(dist d, float *x, int n)
{
    for (int i = 0; i < n; i++) {
        switch (d) {
        case D_NORMAL: x[i] = rnd_normal(); break;
        case D_UNIFORM: x[i] = (float)(2.0 * rnd_open() - 1.0); break;
        case D_ZEROS: x[i] = 0.0f; break;
        case D_OUTLIER: x[i] = 0.01f * rnd_normal(); break;
        case D_NEGATIVE: x[i] = -fabsf(rnd_normal()) - 0.25f; break;
        case D_POSITIVE: x[i] = 1.0f + (float)rnd_open(); break;
        case D_TINY: x[i] = 1e-30f * rnd_normal(); break;
        case D_LARGE: x[i] = 1e4f * rnd_normal(); break;
        case D_CONST: x[i] = -0.75f; break;
        case D_SPARSE: x[i] = rnd_u32() % 16 == 0 ? rnd_normal() : 0.0f; break;
        default: break;
        }
    }
    if (d == D_OUTLIER) /* one outlier per 256, at a random place and sign */
        for (int b = 0; b < n / 256; b++)
            x[256 * b + rnd_u32() % 256] = rnd_u32() % 2 ? 50.0f : -50.0f;
}

/* ---- the stated bound ------------------------------------------------------------------------ */

/* An upper bound of the fp16 value the quantiser stores for a scale v >= 0: it rounds up, to at
 * most one fp16 ulp above v (relative 2^-10, or the smallest subnormal 2^-24). */
static double fp16_up(double v) { return v * (1.0 + 1.0 / 1024) + 1.0 / 16777216.0; }

/* The per-element error bound quantize_kq.c promises for one 256-element super-block, written
 * from the data alone: bound[i] for element i. */
static void kq_bound(kvs_dtype t, const float *x, double *bound)
{
    if (t == KVS_Q6_K) {
        double a[16], amax = 0;
        for (int s = 0; s < 16; s++) {
            double m = 0;
            for (int i = 0; i < 16; i++)
                m = fmax(m, fabs(x[16 * s + i]));
            a[s] = m / 31.0; /* the sub-block's scale magnitude is at most amax / 31 */
            amax = fmax(amax, a[s]);
        }
        const double d = fp16_up(amax / 127.0);
        for (int e = 0; e < 256; e++)
            bound[e] = 0.5 * (a[e / 16] + d); /* |sc| = ceil(a / d): at most a + d */
        return;
    }
    const int nmax = t == KVS_Q4_K ? 15 : 31;
    double lo[8], hi[8], max_m = 0, need[8], max_need = 0;
    for (int s = 0; s < 8; s++) {
        lo[s] = 0, hi[s] = x[32 * s];
        for (int i = 0; i < 32; i++) {
            lo[s] = fmin(lo[s], x[32 * s + i]);
            hi[s] = fmax(hi[s], x[32 * s + i]);
        }
        max_m = fmax(max_m, -lo[s]);
    }
    const double dmin = fp16_up(max_m / 63.0);
    for (int s = 0; s < 8; s++) {
        need[s] = (hi[s] - lo[s] + dmin) / nmax; /* the min term overshoots by < one dmin */
        max_need = fmax(max_need, need[s]);
    }
    const double d = fp16_up(max_need / 63.0);
    for (int e = 0; e < 256; e++) {
        const int s = e / 32;
        /* + fp32 rounding of d * sc * q - dmin * m, which cancels for all-negative blocks */
        bound[e] = 0.5 * (need[s] + d) + 1e-6 * (fabs(lo[s]) + fabs(hi[s]));
    }
}

/* ---- round trips ----------------------------------------------------------------------------- */

#define ROWS 64
#define ROW 1024 /* 4 super-blocks */

static const kvs_dtype kq_types[] = {KVS_Q4_K, KVS_Q5_K, KVS_Q6_K};

/* rmse / rms of one type on one distribution, over ROWS rows; counts bound violations and
 * non-finite or non-bit-identical (vectorised vs reference) dequantised values. */
static double round_trip(kvs_dtype t, dist d, int *over, int *nonfinite, int *simd_diff,
                         double *worst_ratio)
{
    uint64_t row_bytes = 0;
    kvs_dtype_bytes(t, ROW, &row_bytes);
    float *x = malloc(sizeof(float) * ROW), *y = malloc(sizeof(float) * ROW),
          *z = malloc(sizeof(float) * ROW);
    double *bound = malloc(sizeof(double) * ROW);
    uint8_t *q = malloc((size_t)row_bytes);
    double se = 0, ss = 0;
    *over = *nonfinite = *simd_diff = 0;
    *worst_ratio = 0;
    for (int r = 0; r < ROWS; r++) {
        fill(d, x, ROW);
        memset(q, 0xA5, (size_t)row_bytes); /* every byte must be written */
        kvs_quantize_row(t, x, q, ROW);
        kvs_dequantize_row_ref(t, q, y, ROW);
        kvs_dequantize_row(t, q, z, ROW);
        for (int b = 0; b < ROW / 256; b++)
            kq_bound(t, x + 256 * b, bound + 256 * b);
        for (int i = 0; i < ROW; i++) {
            if (!isfinite(y[i])) {
                (*nonfinite)++;
                continue;
            }
            const double err = fabs((double)y[i] - x[i]);
            if (err > bound[i])
                (*over)++;
            if (bound[i] > 0)
                *worst_ratio = fmax(*worst_ratio, err / bound[i]);
            *simd_diff += memcmp(&y[i], &z[i], sizeof(float)) != 0;
            se += err * err;
            ss += (double)x[i] * x[i];
        }
    }
    free(x);
    free(y);
    free(z);
    free(bound);
    free(q);
    return ss > 0 ? sqrt(se / ss) : sqrt(se);
}

static void test_round_trips(void)
{
    /* rmse / rms on N(0, 1), measured 0.0802 (Q4_K), 0.0393 (Q5_K), 0.0190 (Q6_K) over
     * 64 x 1024 values: the limits leave 1.5x. (The direct method covers each sub-block's
     * full range; llama.cpp's least-squares search trades clipped extremes for a finer step.) */
    const double rmse_max[3] = {0.12, 0.06, 0.029};
    for (size_t k = 0; k < 3; k++) {
        const kvs_dtype t = kq_types[k];
        for (int d = 0; d < N_DIST; d++) {
            int over, nonfinite, simd_diff;
            double worst;
            const double rel = round_trip(t, (dist)d, &over, &nonfinite, &simd_diff, &worst);
            CHECKF(over == 0 && nonfinite == 0, "%s %s: %d of %d values over the bound, %d not "
                   "finite (worst error / bound %.3f)", kvs_dtype_name(t), dist_names[d], over,
                   ROWS * ROW, nonfinite, worst);
            CHECKF(simd_diff == 0, "%s %s: vectorised dequantiser differs in %d values",
                   kvs_dtype_name(t), dist_names[d], simd_diff);
            if (d == D_NORMAL) {
                printf("%s: rmse / rms on N(0,1) %.4f, worst error / bound %.3f\n",
                       kvs_dtype_name(t), rel, worst);
                CHECKF(rel < rmse_max[k], "%s: rmse / rms %.4f on N(0,1)", kvs_dtype_name(t),
                       rel);
            }
            if (d == D_ZEROS || d == D_TINY) /* exact zeros stay zero; tiny ones become 0 */
                CHECKF(rel <= (d == D_ZEROS ? 0 : 1.0), "%s %s: rel %g", kvs_dtype_name(t),
                       dist_names[d], rel);
        }
    }
}

/* Hand-made super-blocks whose values lie exactly on levels the quantiser picks itself (its
 * scales are powers of two times the chosen 6-bit / int8 sub-scales, every sub-block reaching
 * both ends of its range): they must come back exactly, which checks the placement of every
 * sub-block's scale, min and quants (a swapped sub-block or nibble gives errors of whole
 * steps). */
static void test_exact_levels(void)
{
    float x[256], y[256];
    uint8_t q[256];
    /* Q4_K / Q5_K: x = (L_s / 64) q - M_s / 32: d = 2^-6 and dmin = 2^-5 (max L and M 63). */
    static const int L[8] = {63, 1, 5, 17, 32, 40, 50, 9}, M[8] = {0, 63, 7, 1, 20, 33, 62, 4};
    for (int k = 0; k < 2; k++) {
        const kvs_dtype t = k ? KVS_Q5_K : KVS_Q4_K;
        const int levels = k ? 32 : 16;
        for (int e = 0; e < 256; e++) /* 7 is odd: all levels within each 32 */
            x[e] = (float)L[e / 32] / 64.0f * (float)((e * 7) % levels) - (float)M[e / 32] / 32.0f;
        kvs_quantize_row(t, x, q, 256);
        kvs_dequantize_row_ref(t, q, y, 256);
        int wrong = 0;
        for (int e = 0; e < 256; e++)
            wrong += y[e] != x[e];
        CHECKF(wrong == 0, "%s exact levels: %d of 256 wrong", kvs_dtype_name(t), wrong);
    }
    /* Q6_K: x = (S_s / 128) (q - 32), S_s in -127..127 (max |S| 127, d = 2^-7); each sub-block
     * has q = 0 and q = 63, its extremes, and 14 other levels. */
    static const int S[16] = {127, -1, 5, -17, 32, 40, -50, 9, 100, -127, 64, 3, -3, 77, -90, 2};
    for (int e = 0; e < 256; e++) {
        const int i = e % 16, qv = i == 0 ? 0 : i == 1 ? 63 : (e * 13) % 64;
        x[e] = (float)S[e / 16] / 128.0f * (float)(qv - 32);
    }
    kvs_quantize_row(KVS_Q6_K, x, q, 256);
    kvs_dequantize_row_ref(KVS_Q6_K, q, y, 256);
    int wrong = 0;
    for (int e = 0; e < 256; e++)
        wrong += y[e] != x[e];
    CHECKF(wrong == 0, "q6_K exact levels: %d of 256 wrong", wrong);
}

/* ---- the writer's mixes ---------------------------------------------------------------------- */

static void test_wtype_names(void)
{
    static const struct {
        const char *name;
        kvs_dtype t;
        int mix;
    } ok[] = {{"f32", KVS_F32, 0},    {"Q4_K", KVS_Q4_K, 0},  {"q5_k", KVS_Q5_K, 0},
              {"q6_K", KVS_Q6_K, 0},  {"q4_k_m", KVS_Q4_K, 1}, {"Q5_K_M", KVS_Q5_K, 1},
              {"q8_0", KVS_Q8_0, 0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        kvs_wtype w = {KVS_F32, 0};
        CHECKF(kvs_wtype_parse(ok[i].name, &w) == 0 && w.type == ok[i].t && w.mix_m == ok[i].mix,
               "%s", ok[i].name);
    }
    kvs_wtype w;
    CHECK(kvs_wtype_parse("q6_k_m", &w) != 0 && kvs_wtype_parse("q3_k", &w) != 0 &&
          kvs_wtype_parse("q4_k_s", &w) != 0 && kvs_wtype_parse("", &w) != 0);
    CHECK(!strcmp(kvs_wtype_name((kvs_wtype){KVS_Q5_K, 1}), "q5_k_m"));
    /* The KV cache's row types (kvs_dtype_parse) stay the 32-element ones. */
    kvs_dtype t;
    CHECK(kvs_dtype_parse("q4_k", &t) != 0 && kvs_dtype_parse("q6_K", &t) != 0);
}

/* The type of tensor `name` in g, or -1. */
static int tensor_type(const kvs_gguf *g, const char *name)
{
    const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, name);
    return t ? (int)t->type : -1;
}

static const char *const matrices[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                       "ffn_gate", "ffn_up", "ffn_down"};

/* Writes a synthetic model of 2 layers in type `name` and compares the type of each matrix
 * with the same-named tensor of llama.cpp's file `ref` (shared/models/arch). */
static void check_against_llama_cpp(const char *name, const char *ref, uint32_t want_ftype)
{
    char path[512], rpath[512];
    check_tmp_path(path, sizeof path, "test_quantize_kq_mix.gguf");
    check_shared_path(rpath, sizeof rpath, ref);
    kvs_hparams hp = {.dim = 256, .hidden = 768, .n_layers = 2, .n_heads = 8, .n_kv_heads = 2,
                      .vocab = 300, .ctx = 64};
    kvs_wtype wt;
    kvs_error err = {0};
    CHECK(kvs_wtype_parse(name, &wt) == 0);
    CHECKF(kvs_synthetic_write(&hp, wt, 3, path, NULL, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf *g = NULL, *r = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    CHECKF(kvs_gguf_open(rpath, &r, &err) == KVS_OK, "%s", err.msg);
    if (g && r) {
        int n = 0, same = 0;
        char tn[64];
        for (int l = -1; l < 2; l++)
            for (int k = 0; k < (l < 0 ? 2 : 7); k++) {
                if (l < 0)
                    snprintf(tn, sizeof tn, "%s.weight", k ? "output" : "token_embd");
                else
                    snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, matrices[k]);
                const int a = tensor_type(g, tn), b = tensor_type(r, tn);
                n++;
                same += a == b && a >= 0;
                CHECKF(a == b && a >= 0, "%s: %s is %s, llama.cpp's %s", name, tn,
                       kvs_dtype_name((kvs_dtype)a), kvs_dtype_name((kvs_dtype)b));
            }
        uint32_t ft = 0;
        CHECK(kvs_gguf_get_u32(g, "general.file_type", &ft, &err) == KVS_OK && ft == want_ftype);
        uint32_t rft = 0;
        CHECK(kvs_gguf_get_u32(r, "general.file_type", &rft, &err) == KVS_OK && rft == ft);
        printf("%s: %d of %d matrix types as in llama.cpp's %s, file_type %u\n", name, same, n,
               ref, ft);
    }
    kvs_gguf_close(g);
    kvs_gguf_close(r);
    remove(path);
}

/* 8 layers of q5_k_m: use_more_bits holds for layers 0, 3, 6 and 7 (the first and last
 * eighth, and every third from layer 1 between them), which get Q6_K attn_v and ffn_down. */
static void test_mix_layers(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_quantize_kq_layers.gguf");
    kvs_hparams hp = {.dim = 256, .hidden = 512, .n_layers = 8, .n_heads = 4, .n_kv_heads = 4,
                      .vocab = 300, .ctx = 64};
    kvs_error err = {0};
    CHECKF(kvs_synthetic_write(&hp, (kvs_wtype){KVS_Q5_K, 1}, 5, path, NULL, &err) == KVS_OK,
           "%s", err.msg);
    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g) {
        static const int more[8] = {1, 0, 0, 1, 0, 0, 1, 1};
        char tn[64];
        for (int l = 0; l < 8; l++)
            for (int k = 0; k < 7; k++) {
                snprintf(tn, sizeof tn, "blk.%d.%s.weight", l, matrices[k]);
                const int bumped = more[l] && (k == 2 || k == 6);
                CHECKF(tensor_type(g, tn) == (bumped ? KVS_Q6_K : KVS_Q5_K), "%s is %s", tn,
                       kvs_dtype_name((kvs_dtype)tensor_type(g, tn)));
            }
        CHECK(tensor_type(g, "output.weight") == KVS_Q6_K);
        CHECK(tensor_type(g, "token_embd.weight") == KVS_Q5_K);
        CHECK(tensor_type(g, "blk.0.attn_norm.weight") == KVS_F32);
    }
    kvs_gguf_close(g);
    remove(path);
}

/* Rows that are not whole super-blocks: Q8_0 (whole 32-element blocks) or F16, with a note
 * naming the tensor. dim 96 gives rows of 96 to every matrix but ffn_down (rows of 256). */
static void test_fallback(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_quantize_kq_fallback.gguf");
    kvs_hparams hp = {.dim = 96, .hidden = 256, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2,
                      .vocab = 300, .ctx = 64};
    kvs_error err = {0};
    FILE *log = tmpfile();
    CHECKF(kvs_synthetic_write(&hp, (kvs_wtype){KVS_Q4_K, 1}, 5, path, log, &err) == KVS_OK,
           "%s", err.msg);
    char text[4096] = "";
    if (log) {
        rewind(log);
        text[fread(text, 1, sizeof text - 1, log)] = 0;
        fclose(log);
    }
    CHECKF(strstr(text, "note: blk.0.attn_q.weight has rows of 96, not a multiple of the q4_K "
                        "block size 256; stored as q8_0") != NULL, "log: %s", text);
    CHECKF(strstr(text, "output.weight has rows of 96, not a multiple of the q6_K") != NULL,
           "log: %s", text);
    CHECK(strstr(text, "ffn_down") == NULL);
    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g) {
        CHECK(tensor_type(g, "blk.0.attn_q.weight") == KVS_Q8_0);
        CHECK(tensor_type(g, "output.weight") == KVS_Q8_0);
        CHECK(tensor_type(g, "blk.0.ffn_down.weight") == KVS_Q6_K); /* 1 layer: more bits */
    }
    kvs_gguf_close(g);
    /* Rows of 48 are not whole Q8_0 blocks either: F16. */
    hp.dim = 48, hp.hidden = 256;
    CHECKF(kvs_synthetic_write(&hp, KVS_WTYPE(KVS_Q6_K), 5, path, NULL, &err) == KVS_OK, "%s",
           err.msg);
    g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g)
        CHECK(tensor_type(g, "blk.0.attn_q.weight") == KVS_F16 &&
              tensor_type(g, "blk.0.ffn_down.weight") == KVS_Q6_K);
    kvs_gguf_close(g);
    /* A type kvslim only reads is refused, naming it. */
    CHECK(kvs_synthetic_write(&hp, KVS_WTYPE(KVS_Q3_K), 5, path, NULL, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "q3_K") != NULL);
    remove(path);
}

/* Logits of 12 tokens of the synthetic model in type wt (seed fixed); NULL on failure. */
static float *eval_synthetic(kvs_wtype wt, int *n_vocab)
{
    char path[512];
    check_tmp_path(path, sizeof path, "test_quantize_kq_eval.gguf");
    kvs_hparams hp = {.dim = 256, .hidden = 512, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4,
                      .vocab = 300, .ctx = 64};
    kvs_error err = {0};
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    float *logits = NULL;
    CHECKF(kvs_synthetic_write(&hp, wt, 11, path, NULL, &err) == KVS_OK, "%s", err.msg);
    CHECKF(kvs_model_load(path, &m, &err) == KVS_OK, "%s: %s", kvs_wtype_name(wt), err.msg);
    remove(path); /* the mapping stays valid */
    if (!m)
        return NULL;
    kvs_session_params p = kvs_session_default_params();
    p.n_threads = 2;
    CHECK(kvs_session_new(m, &p, &s, &err) == KVS_OK);
    const int32_t toks[12] = {1, 5, 9, 299, 4, 7, 8, 100, 200, 250, 3, 2};
    *n_vocab = hp.vocab;
    logits = malloc(sizeof(float) * 12 * (size_t)hp.vocab);
    if (s && logits && kvs_session_eval(s, toks, 12, logits, 1, &err) != KVS_OK) {
        CHECKF(0, "%s: %s", kvs_wtype_name(wt), err.msg);
        free(logits);
        logits = NULL;
    }
    kvs_session_free(s);
    kvs_model_free(m);
    return logits;
}

/* q4_k_m, q5_k_m and q6_k models evaluate to finite logits close to the f32 model's. */
static void test_eval(void)
{
    int nv = 0;
    float *ref = eval_synthetic(KVS_WTYPE(KVS_F32), &nv);
    static const char *const names[] = {"q4_k_m", "q5_k_m", "q6_k", "q4_k", "q5_k", "q4_0", "q8_0"};
    /* rms of the logit difference / rms of the f32 logits (2 layers, weights N(0, 0.02)),
     * measured 0.176 (q4_k_m), 0.094 (q5_k_m), 0.053 (q6_k), 0.206 (q4_k), 0.113 (q5_k), and
     * for scale 0.231 (q4_0) and 0.018 (q8_0, whose matmul also quantises activations):
     * the limits are 1.5x those. */
    static const double max_rel[] = {0.26, 0.14, 0.08, 0.31, 0.17, 0.35, 0.027};
    for (size_t i = 0; ref && i < sizeof names / sizeof names[0]; i++) {
        kvs_wtype wt;
        kvs_wtype_parse(names[i], &wt);
        float *l = eval_synthetic(wt, &nv);
        if (!l)
            continue;
        int finite = 1;
        double se = 0, ss = 0;
        for (int k = 0; k < 12 * nv; k++) {
            finite &= isfinite(l[k]) != 0;
            se += ((double)l[k] - ref[k]) * ((double)l[k] - ref[k]);
            ss += (double)ref[k] * ref[k];
        }
        const double rel = sqrt(se / ss);
        CHECKF(finite, "%s: non-finite logits", names[i]);
        CHECKF(rel < max_rel[i], "%s: logits differ from f32's by %.4f (rms relative)", names[i],
               rel);
        printf("%s: logits vs f32 model rms relative %.4f\n", names[i], rel);
        free(l);
    }
    free(ref);
}

int main(void)
{
    test_round_trips();
    test_exact_levels();
    test_wtype_names();
    check_against_llama_cpp("q4_k_m", "models/arch/llama3-q4_k_m.gguf", 15);
    check_against_llama_cpp("q5_k_m", "models/arch/llama3-q5_k_m.gguf", 17);
    check_against_llama_cpp("q6_k", "models/arch/llama3-q6_k.gguf", 18);
    test_mix_layers();
    test_fallback();
    test_eval();
    return check_summary("test_quantize_kq");
}
