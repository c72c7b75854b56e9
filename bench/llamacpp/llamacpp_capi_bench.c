/* llama.cpp through its C API, timed the way `kvslim bench` times kvslim.
 *
 *   llamacpp_capi_bench -m MODEL [-p N_PROMPT] [-n N_GEN] [-t THREADS] [-r REPS] [--seed S]
 *                       [--json OUT] [--lib-dir DIR] [--no-threadpool] [-v]
 *
 * Built by bench/run_engine_bench.sh against the llama.cpp headers of the exact release whose
 * prebuilt CPU libraries node-llama-cpp ships (the headers come out of the git bundle inside
 * the node-llama-cpp npm package; the libraries from @node-llama-cpp/linux-x64), and linked to
 * those libraries. Nothing here declares a llama.cpp struct by hand; a few default values of
 * the parameter structs are checked at start-up as a guard against a header/library mismatch.
 *
 * What it does, as llama-bench does: loads every ggml backend in the library directory (the
 * loader picks the best CPU variant, e.g. libggml-cpu-zen4.so), creates a context with
 * n_batch = n_ubatch = N_PROMPT, THREADS threads, llama.cpp's default KV type (F16) and flash
 * attention setting (auto), attaches a persistent ggml threadpool of THREADS threads (unless
 * --no-threadpool: then ggml makes a throw-away pool for every llama_decode, as
 * node-llama-cpp does), warms up once, then per repetition: clears the KV cache, decodes the
 * N_PROMPT random prompt tokens in one llama_decode, then N_GEN single-token llama_decode
 * calls with fixed random tokens. Each phase is timed with CLOCK_MONOTONIC around
 * llama_decode + llama_synchronize; llama.cpp's own perf counters are reported alongside.
 * Batches come from llama_batch_get_one (logits of the last token only, as in llama-bench). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

#ifndef LLAMACPP_TAG
#define LLAMACPP_TAG "unknown"
#endif

static const char *const usage =
    "usage: llamacpp_capi_bench -m MODEL [options]\n"
    "  -m, --model MODEL   GGUF model\n"
    "  -p, --n-prompt N    prompt tokens, one llama_decode (default 512)\n"
    "  -n, --n-gen N       single-token decode steps (default 128)\n"
    "  -t, --threads N     threads (default 2)\n"
    "  -r, --reps N        repetitions, reported as mean of tok/s (default 1)\n"
    "  --seed S            seed of the random token ids (default 7)\n"
    "  --json FILE         also write the JSON result to FILE\n"
    "  --lib-dir DIR       directory of the ggml backend libraries (default: libllama's)\n"
    "  --no-threadpool     no persistent threadpool (a throw-away one per llama_decode)\n"
    "  -v, --verbose       print llama.cpp's log to stderr\n";

static bool g_verbose;
static int g_flash_attn = -1; /* as resolved by llama.cpp, read from its log */

static void log_cb(enum ggml_log_level level, const char *text, void *user)
{
    (void)level, (void)user;
    if (strstr(text, "Flash Attention enabled"))
        g_flash_attn = 1;
    else if (strstr(text, "Flash Attention") && strstr(text, "disabled"))
        g_flash_attn = 0;
    if (g_verbose)
        fputs(text, stderr);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_int(const char *flag, const char *v, int min, int *out)
{
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || end == v || n < min || n > INT_MAX) {
        fprintf(stderr, "llamacpp_capi_bench: %s needs an integer >= %d\n", flag, min);
        return -1;
    }
    *out = (int)n;
    return 0;
}

/* The ggml CPU variant(s) mapped into this process: "zen4" for libggml-cpu-zen4.so. */
static void cpu_backend_variant(char *out, size_t size)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "/libggml-cpu-");
        if (!p)
            continue;
        p += strlen("/libggml-cpu-");
        char *e = strstr(p, ".so");
        if (!e)
            continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(e - p), p);
        if (!strstr(out, name))
            snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? "," : "", name);
    }
    fclose(f);
}

/* Guard against headers that don't match the library: these defaults are llama.cpp's. */
static int check_layouts(void)
{
    struct llama_context_params c = llama_context_default_params();
    struct llama_model_params m = llama_model_default_params();
    struct ggml_threadpool_params tp = ggml_threadpool_params_default(3);
    bool ok = c.n_ctx == 512 && c.n_batch == 2048 && c.n_ubatch == 512 && c.n_seq_max == 1 &&
              c.n_threads == GGML_DEFAULT_N_THREADS &&
              c.n_threads_batch == GGML_DEFAULT_N_THREADS &&
              c.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_AUTO && c.type_k == GGML_TYPE_F16 &&
              c.type_v == GGML_TYPE_F16 && c.cb_eval == NULL && c.abort_callback == NULL &&
              !c.embeddings && c.offload_kqv && c.no_perf && c.ctx_other == NULL &&
              m.devices == NULL && m.n_gpu_layers == -1 && m.kv_overrides == NULL &&
              !m.vocab_only && !m.check_tensors && tp.n_threads == 3 && !tp.paused;
    if (!ok)
        fprintf(stderr, "llamacpp_capi_bench: llama.cpp's default parameters are not as the "
                        "headers say: headers and libraries are from different releases\n");
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *json_path = NULL, *lib_dir = NULL;
    int n_prompt = 512, n_gen = 128, threads = 2, reps = 1, seed = 7;
    bool use_threadpool = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            g_verbose = true;
        } else if (!strcmp(a, "--no-threadpool")) {
            use_threadpool = false;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) {
            model_path = v, i++;
        } else if (!strcmp(a, "--json") && v) {
            json_path = v, i++;
        } else if (!strcmp(a, "--lib-dir") && v) {
            lib_dir = v, i++;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (parse_int(a, v, 1, &n_prompt))
                return 2;
            i++;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (parse_int(a, v, 0, &n_gen))
                return 2;
            i++;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (parse_int(a, v, 1, &threads))
                return 2;
            i++;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            if (parse_int(a, v, 1, &reps))
                return 2;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (parse_int(a, v, 0, &seed))
                return 2;
            i++;
        } else {
            fprintf(stderr, "llamacpp_capi_bench: bad argument '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "llamacpp_capi_bench: needs -m MODEL\n%s", usage);
        return 2;
    }
    if (check_layouts() != 0)
        return 1;

    llama_log_set(log_cb, NULL);
    char dir_buf[PATH_MAX];
    if (!lib_dir) {
        Dl_info info;
        if (!dladdr((void *)llama_backend_init, &info) || !info.dli_fname) {
            fprintf(stderr, "llamacpp_capi_bench: cannot locate libllama; pass --lib-dir\n");
            return 1;
        }
        snprintf(dir_buf, sizeof dir_buf, "%s", info.dli_fname);
        lib_dir = dirname(dir_buf);
    }
    ggml_backend_load_all_from_path(lib_dir);
    llama_backend_init();

    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu_dev) {
        fprintf(stderr, "llamacpp_capi_bench: no ggml CPU backend found in %s\n", lib_dir);
        return 1;
    }
    ggml_backend_dev_t devices[2] = {cpu_dev, NULL}; /* CPU only, whatever else is there */

    struct llama_model_params mp = llama_model_default_params();
    mp.devices = devices;
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "llamacpp_capi_bench: cannot load %s (see -v)\n", model_path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_gen + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = false;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llamacpp_capi_bench: cannot create a context (see -v)\n");
        return 1;
    }

    struct ggml_threadpool *tp = NULL;
    __typeof__(ggml_threadpool_free) *tp_free = NULL;
    if (use_threadpool) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu_dev);
        __typeof__(ggml_threadpool_new) *tp_new =
            (__typeof__(ggml_threadpool_new) *)ggml_backend_reg_get_proc_address(
                reg, "ggml_threadpool_new");
        tp_free = (__typeof__(ggml_threadpool_free) *)ggml_backend_reg_get_proc_address(
            reg, "ggml_threadpool_free");
        if (!tp_new || !tp_free) {
            fprintf(stderr, "llamacpp_capi_bench: the CPU backend has no ggml_threadpool_new\n");
            return 1;
        }
        struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
        if (!(tp = tp_new(&tpp))) {
            fprintf(stderr, "llamacpp_capi_bench: threadpool creation failed\n");
            return 1;
        }
        llama_attach_threadpool(ctx, tp, NULL);
    }

    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token skip[3] = {llama_vocab_bos(vocab), llama_vocab_eos(vocab), llama_vocab_eot(vocab)};
    int n_tok = n_prompt + n_gen;
    llama_token *tokens = malloc(sizeof *tokens * (size_t)n_tok);
    if (!tokens)
        return 1;
    uint32_t state = (uint32_t)seed; /* kvslim bench's LCG */
    for (int i = 0; i < n_tok;) {
        state = state * 1664525u + 1013904223u;
        llama_token t = (llama_token)((state >> 8) % (uint32_t)n_vocab);
        if (t != skip[0] && t != skip[1] && t != skip[2])
            tokens[i++] = t;
    }
    llama_token *prompt = tokens, *gen = tokens + n_prompt;
    llama_memory_t mem = llama_get_memory(ctx);

#define DECODE(ptr, n)                                                                     \
    do {                                                                                   \
        int rc_ = llama_decode(ctx, llama_batch_get_one((ptr), (n)));                      \
        if (rc_ != 0) {                                                                    \
            fprintf(stderr, "llamacpp_capi_bench: llama_decode failed (%d)\n", rc_);       \
            return 1;                                                                      \
        }                                                                                  \
        llama_synchronize(ctx);                                                            \
    } while (0)

    /* Warm-up once: page in the weights, build both graph shapes. */
    DECODE(prompt, n_prompt < 32 ? n_prompt : 32);
    for (int g = 0; g < n_gen && g < 2; g++)
        DECODE(gen + g, 1);

    double sum_pf = 0, sum_dec = 0, sum_pf_perf = 0, sum_dec_perf = 0;
    for (int r = 0; r < reps; r++) {
        llama_memory_clear(mem, true);
        llama_perf_context_reset(ctx);
        fprintf(stderr, "llama.cpp (C API): rep %d/%d ...\n", r + 1, reps);
        double t0 = now_s();
        DECODE(prompt, n_prompt);
        double t1 = now_s();
        for (int g = 0; g < n_gen; g++)
            DECODE(gen + g, 1);
        double t2 = now_s();
        struct llama_perf_context_data pd = llama_perf_context(ctx);
        sum_pf += n_prompt / (t1 - t0);
        sum_pf_perf += pd.t_p_eval_ms > 0 ? pd.n_p_eval / (pd.t_p_eval_ms * 1e-3) : 0;
        if (n_gen) {
            sum_dec += n_gen / (t2 - t1);
            sum_dec_perf += pd.t_eval_ms > 0 ? pd.n_eval / (pd.t_eval_ms * 1e-3) : 0;
        }
    }

    char backend[256];
    cpu_backend_variant(backend, sizeof backend);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char json[2048];
    int len = snprintf(
        json, sizeof json,
        "{\"engine\": \"llama.cpp\", \"harness\": \"c-api\", \"model\": \"%s\", "
        "\"threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, "
        "\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
        "\"prefill_tok_s_perf\": %.3f, \"decode_tok_s_perf\": %.3f, "
        "\"threadpool\": %s, \"batch_size\": %u, \"ubatch_size\": %u, \"context_size\": %u, "
        "\"kv_type_k\": \"%s\", \"kv_type_v\": \"%s\", \"flash_attn\": %s, "
        "\"ggml_cpu_backend\": \"%s\", \"llama_cpp_release\": \"%s\", "
        "\"peak_rss_bytes\": %ld}\n",
        model_path, threads, n_prompt, n_gen, reps, sum_pf / reps, sum_dec / reps,
        sum_pf_perf / reps, sum_dec_perf / reps, tp ? "true" : "false", llama_n_batch(ctx),
        llama_n_ubatch(ctx), llama_n_ctx(ctx), ggml_type_name(cp.type_k),
        ggml_type_name(cp.type_v),
        g_flash_attn < 0 ? "null" : g_flash_attn ? "true" : "false", backend, LLAMACPP_TAG,
        ru.ru_maxrss * 1024L);
    fputs(json, stdout);
    int rc = 0;
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f || fwrite(json, 1, (size_t)len, f) != (size_t)len || fclose(f) != 0) {
            fprintf(stderr, "llamacpp_capi_bench: cannot write %s\n", json_path);
            rc = 1;
        }
    }
    free(tokens);
    llama_free(ctx);
    if (tp)
        tp_free(tp);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
