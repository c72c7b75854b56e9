/* Matmul benchmark on the shapes of an 85.7M-parameter Llama (dim 768, hidden 2048).
 *
 *   bench_matmul [reps] [types] [threads]     e.g. bench_matmul 5 f32,q8_0 2
 * (defaults: 5 reps; f32,f16,bf16,q8_0,q4_0; 1 and 2 threads)
 * Types: f32, f16, bf16, q8_0, q4_0 (weights quantised from random values), and the read-only
 * types q4_k, q5_k, q6_k, iq4_nl, q4_1, q5_0, q5_1 (random quant bytes, finite fp16 scales and
 * mins), which kvs_matmul
 * multiplies with 8-bit activations (core/matmul_kq.c); with the suffix ":exact" (q4_k:exact)
 * the same weights go through kvs_matmul_deq instead (fp32 activations, dequantised weights).
 *
 * For each weight type and 1 and 2 threads:
 *   prefill  n_rows = 512, per shape GFLOP/s (2*rows*in*out / time), best of reps
 *   decode   n_rows = 1, GB/s of weight bytes read:
 *            "hot":  one matrix called repeatedly (stays in L2/L3)
 *            "model": 12 layers x (q, k, v, o, w1, w3, w2) with distinct weights (far larger than
 *                     L3 for F32), i.e. DRAM streaming as in a real decode step; also ms/token
 *                     for the matmuls alone.
 * With "blas" in the type list, F32 prefill is also timed through OpenBLAS cblas_sgemm, one
 * single-threaded call per pool thread on a slice of W rows (for comparison). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dequant.h"
#include "core/kernels.h"

extern void openblas_set_num_threads(int);

/* kvs_matmul (or, exact != 0, kvs_matmul_deq), stopping the benchmark if it cannot run. */
static void mm(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt, int rows,
               int n_in, int n_out, int exact)
{
    kvs_status st = exact ? kvs_matmul_deq(pool, y, x, w, wt, rows, n_in, n_out)
                          : kvs_matmul(pool, y, x, w, wt, rows, n_in, n_out);
    if (st != KVS_OK) {
        fprintf(stderr, "bench_matmul: kvs_matmul: %s\n", kvs_status_name(st));
        exit(1);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static float rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Random blocks of a read-only type: random bytes, then fp16 scales of about 0.05 / the
 * largest raw value, so that the weights are of the size make_weights gives the others. */
static void random_blocks(kvs_dtype wt, char *w, size_t bytes)
{
    const size_t bb = kvs_dtype_block_bytes(wt);
    const float range = wt == KVS_Q4_K ? 945 : wt == KVS_Q5_K ? 1953 : wt == KVS_Q6_K ? 4064
                        : wt == KVS_Q4_1 ? 15 : wt == KVS_Q5_0 ? 16 : wt == KVS_Q5_1 ? 31 : 127;
    for (size_t i = 0; i < bytes; i++)
        w[i] = (char)(rnd() * 127.0f);
    for (char *p = w; p < w + bytes; p += bb) {
        const uint16_t d = kvs_fp32_to_fp16(0.05f * rnd() / range), m = kvs_fp32_to_fp16(0.05f * rnd() / range);
        switch ((int)wt) {
        case KVS_Q4_K: ((kvs_block_q4_K *)p)->d = d, ((kvs_block_q4_K *)p)->dmin = m; break;
        case KVS_Q5_K: ((kvs_block_q5_K *)p)->d = d, ((kvs_block_q5_K *)p)->dmin = m; break;
        case KVS_Q6_K: ((kvs_block_q6_K *)p)->d = d; break;
        case KVS_Q4_1: ((kvs_block_q4_1 *)p)->d = d, ((kvs_block_q4_1 *)p)->m = kvs_fp32_to_fp16(0.05f * rnd()); break;
        case KVS_Q5_0: ((kvs_block_q5_0 *)p)->d = d; break;
        case KVS_Q5_1: ((kvs_block_q5_1 *)p)->d = d, ((kvs_block_q5_1 *)p)->m = kvs_fp32_to_fp16(0.05f * rnd()); break;
        default: ((kvs_block_iq4_nl *)p)->d = d; break;
        }
    }
}

static void *make_weights(kvs_dtype wt, int n_in, int n_out, size_t *bytes)
{
    uint64_t rb;
    kvs_dtype_bytes(wt, (uint64_t)n_in, &rb);
    *bytes = (size_t)rb * n_out;
    char *w = aligned_alloc(64, (*bytes + 63) / 64 * 64);
    if (kvs_deq_type(wt)) {
        random_blocks(wt, w, *bytes);
        return w;
    }
    float *row = malloc(sizeof(float) * n_in);
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            row[i] = rnd() * 0.05f;
        kvs_quantize_row(wt, row, w + (size_t)o * rb, n_in);
    }
    free(row);
    return w;
}

static const int shapes[3][2] = {{768, 768}, {768, 2048}, {2048, 768}};

struct blas_ctx {
    float *y;
    const float *x;
    const float *w;
    int rows, n_in, n_out;
};

static void blas_task(void *p, int ith, int nth)
{
    struct blas_ctx *c = p;
    const int units = (c->n_out + 15) / 16;
    int o0 = units * ith / nth * 16, o1 = units * (ith + 1) / nth * 16;
    if (o1 > c->n_out)
        o1 = c->n_out;
    if (o0 >= o1)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->rows, o1 - o0, c->n_in, 1.0f, c->x,
                c->n_in, c->w + (size_t)o0 * c->n_in, c->n_in, 0.0f, c->y + o0, c->n_out);
}

static void bench_type(kvs_dtype wt, int exact, int nt, int reps, int with_blas)
{
    kvs_pool *pool = kvs_pool_create(nt);
    const int rows = 512;
    float *x = aligned_alloc(64, sizeof(float) * rows * 2048);
    float *y = aligned_alloc(64, sizeof(float) * rows * 2048);
    for (int i = 0; i < rows * 2048; i++)
        x[i] = rnd();

    double pf_flops = 0, pf_time = 0, bl_time = 0;
    double hot_bytes = 0, hot_time = 0;
    printf("%-6s%s %dT |", kvs_dtype_name(wt), exact ? " exact" : "", nt);
    for (int s = 0; s < 3; s++) {
        const int n_in = shapes[s][0], n_out = shapes[s][1];
        size_t bytes;
        void *w = make_weights(wt, n_in, n_out, &bytes);
        mm(pool, y, x, w, wt, rows, n_in, n_out, exact); /* warm up */
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = now();
            mm(pool, y, x, w, wt, rows, n_in, n_out, exact);
            t = now() - t;
            best = t < best ? t : best;
        }
        const double flops = 2.0 * rows * n_in * n_out;
        pf_flops += flops;
        pf_time += best;
        printf(" %4d->%-4d pf %6.1f", n_in, n_out, flops / best * 1e-9);
        if (with_blas && wt == KVS_F32) {
            struct blas_ctx bc = {y, x, w, rows, n_in, n_out};
            kvs_pool_run(pool, blas_task, &bc);
            double bb = 1e30;
            for (int r = 0; r < reps; r++) {
                double t = now();
                kvs_pool_run(pool, blas_task, &bc);
                t = now() - t;
                bb = t < bb ? t : bb;
            }
            bl_time += bb;
            printf(" (blas %6.1f)", flops / bb * 1e-9);
        }
        /* decode, hot */
        best = 1e30;
        for (int r = 0; r < reps * 20; r++) {
            double t = now();
            mm(pool, y, x, w, wt, 1, n_in, n_out, exact);
            t = now() - t;
            best = t < best ? t : best;
        }
        hot_bytes += (double)bytes;
        hot_time += best;
        printf(" dec %5.1f |", bytes / best * 1e-9);
        free(w);
    }
    printf(" prefill %6.1f GFLOP/s", pf_flops / pf_time * 1e-9);
    if (with_blas && wt == KVS_F32)
        printf(" (blas %6.1f)", pf_flops / bl_time * 1e-9);
    printf(" | decode hot %5.1f GB/s", hot_bytes / hot_time * 1e-9);

    /* decode through a whole model's worth of distinct weights */
    enum { LAYERS = 12, MATS = 7 };
    static const int mshape[MATS] = {0, 0, 0, 0, 1, 1, 2};
    void *ws[LAYERS][MATS];
    size_t total = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < MATS; m++) {
            size_t b;
            ws[l][m] = make_weights(wt, shapes[mshape[m]][0], shapes[mshape[m]][1], &b);
            total += b;
        }
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t = now();
        for (int l = 0; l < LAYERS; l++)
            for (int m = 0; m < MATS; m++)
                mm(pool, y, x, ws[l][m], wt, 1, shapes[mshape[m]][0], shapes[mshape[m]][1], exact);
        t = now() - t;
        if (r > 0)
            best = t < best ? t : best;
    }
    printf(" | model decode %5.1f GB/s (%.2f ms/token, %.0f MB)\n", total / best * 1e-9, best * 1e3,
           total / 1e6);
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < MATS; m++)
            free(ws[l][m]);
    free(x);
    free(y);
    kvs_pool_destroy(pool);
}

/* A type name of the list: what kvs_dtype_parse knows, or a read-only type (optionally
 * ":exact"). Returns 0 for anything else (skipped, e.g. "blas"). */
static int parse_type(const char *tok, kvs_dtype *wt, int *exact)
{
    static const struct {
        const char *name;
        kvs_dtype t;
    } ro[] = {{"q4_k", KVS_Q4_K}, {"q5_k", KVS_Q5_K}, {"q6_k", KVS_Q6_K}, {"iq4_nl", KVS_IQ4_NL},
              {"q4_1", KVS_Q4_1}, {"q5_0", KVS_Q5_0}, {"q5_1", KVS_Q5_1}};
    if (kvs_dtype_parse(tok, wt) == 0)
        return 1;
    for (size_t i = 0; i < sizeof ro / sizeof ro[0]; i++) {
        const size_t n = strlen(ro[i].name);
        if (strncmp(tok, ro[i].name, n) == 0 && (tok[n] == 0 || strcmp(tok + n, ":exact") == 0)) {
            *wt = ro[i].t;
            *exact = tok[n] != 0;
            return 1;
        }
    }
    return 0;
}

static const char usage[] =
    "usage: bench_matmul [reps] [types] [threads]   e.g. bench_matmul 5 f32,q8_0 2\n"
    "  reps     timed calls per measurement, best kept (default 5)\n"
    "  types    comma-separated: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k iq4_nl q4_1 q5_0 q5_1\n"
    "           (a K-quant or block type with :exact takes the dequantising path; blas adds\n"
    "           OpenBLAS's F32 prefill); default f32,f16,bf16,q8_0,q4_0\n"
    "  threads  1 or 2 (default both)\n";

/* A whole decimal number in [lo, hi], or -1. */
static int parse_count(const char *s, int lo, int hi)
{
    char *end;
    const long v = strtol(s, &end, 10);
    return *s && !*end && v >= lo && v <= hi ? (int)v : -1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        fputs(usage, stdout);
        return 0;
    }
    const int reps = argc > 1 ? parse_count(argv[1], 1, 100000) : 5;
    const int t_arg = argc > 3 ? parse_count(argv[3], 1, 2) : 0;
    if (reps < 0 || t_arg < 0 || argc > 4) {
        const char *why = reps < 0    ? "reps must be a whole number from 1"
                          : t_arg < 0 ? "threads must be 1 or 2"
                                      : "too many arguments";
        fprintf(stderr, "bench_matmul: %s\n%s", why, usage);
        return 2;
    }
    const char *list = argc > 2 ? argv[2] : "f32,f16,bf16,q8_0,q4_0";
    const int with_blas = strstr(list, "blas") != NULL;
    openblas_set_num_threads(1);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    const int t_only = t_arg;
    for (int nt = 1; nt <= 2; nt++) {
        if (t_only > 0 && nt != t_only)
            continue;
        char tmp[256];
        memcpy(tmp, buf, sizeof tmp);
        for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ",")) {
            int exact = 0;
            kvs_dtype wt;
            if (!parse_type(tok, &wt, &exact)) {
                if (strcmp(tok, "blas") != 0 && nt == (t_only > 0 ? t_only : 1))
                    fprintf(stderr, "bench_matmul: unknown type '%s' skipped\n", tok);
                continue;
            }
            bench_type(wt, exact, nt, reps, with_blas);
            fflush(stdout);
        }
    }
    return 0;
}
