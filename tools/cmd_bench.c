/* kvslim bench: prefill and decode speed on a model file or a synthetic model. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/dtype.h"
#include "engine/session_internal.h"
#include "model/llama_write.h"

static const char *const help =
    "usage: kvslim bench (-m MODEL | --synthetic SHAPE) [options]\n"
    "\n"
    "Times a prompt of random tokens (prefill) and then decoding one token at a time.\n"
    "  -m, --model MODEL     GGUF model\n"
    "  --synthetic SHAPE     random-weight llama model, SHAPE = comma-separated key=value of\n"
    "                        dim, hidden, layers, heads, kv_heads, vocab, ctx, type (f32, f16,\n"
    "                        bf16, q8_0, q4_0); e.g. dim=768,hidden=2048,layers=12,heads=12,\n"
    "                        kv_heads=12,vocab=512,type=q8_0 (weights N(0, 0.02), seed fixed)\n"
    "  --save FILE.gguf      with --synthetic: keep the generated model as a GGUF file\n"
    "  -p, --n-prompt N      prompt tokens (default 512)\n"
    "  -n, --n-gen N         generated tokens (default 128)\n"
    "  -t, --threads N       threads (default: online CPUs, at most 8)\n"
    "  -r, --reps N          repetitions, reported as mean (default 1)\n"
    "  --chunk N             prompt tokens per forward batch (default 512)\n"
    "  --json FILE           write the results as JSON (fields: model, threads, n_prompt,\n"
    "                        n_gen, prefill_tok_s, decode_tok_s, kv_bytes, peak_rss_bytes)\n";

typedef struct shape {
    kvs_hparams hp;
    kvs_dtype type;
} shape;

static int parse_shape(const char *cmd, const char *spec, shape *s)
{
    memset(s, 0, sizeof *s);
    s->hp.dim = 768, s->hp.hidden = 2048, s->hp.n_layers = 12, s->hp.n_heads = 12;
    s->hp.n_kv_heads = -1, s->hp.vocab = 512, s->hp.ctx = 0;
    s->type = KVS_F32;
    char *copy = strdup(spec), *save = NULL;
    int rc = copy ? 0 : -1;
    for (char *kv = copy ? strtok_r(copy, ",", &save) : NULL; kv && !rc;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            cli_error(cmd, "--synthetic: '%s' is not key=value", kv);
            rc = -1;
            break;
        }
        *eq = 0;
        const char *key = kv, *val = eq + 1;
        static const struct {
            const char *key;
            size_t off;
            long max;
        } ints[] = {
            {"dim", offsetof(kvs_hparams, dim), 1 << 16},
            {"hidden", offsetof(kvs_hparams, hidden), 1 << 18},
            {"layers", offsetof(kvs_hparams, n_layers), 1024},
            {"heads", offsetof(kvs_hparams, n_heads), 1024},
            {"kv_heads", offsetof(kvs_hparams, n_kv_heads), 1024},
            {"vocab", offsetof(kvs_hparams, vocab), 1 << 20},
            {"ctx", offsetof(kvs_hparams, ctx), 1 << 22},
        };
        size_t k;
        for (k = 0; k < sizeof ints / sizeof ints[0]; k++)
            if (!strcmp(key, ints[k].key))
                break;
        if (k < sizeof ints / sizeof ints[0]) {
            char flag[64];
            snprintf(flag, sizeof flag, "--synthetic %s", key);
            rc = cli_int(cmd, flag, val, 1, ints[k].max, (int *)((char *)&s->hp + ints[k].off));
        } else if (!strcmp(key, "type")) {
            if (kvs_dtype_parse(val, &s->type) != 0) {
                cli_error(cmd, "--synthetic type: unknown type '%s' (f32, f16, bf16, q8_0, "
                               "q4_0)", val);
                rc = -1;
            }
        } else {
            cli_error(cmd, "--synthetic: unknown key '%s' (accepted: dim, hidden, layers, "
                           "heads, kv_heads, vocab, ctx, type)", key);
            rc = -1;
        }
    }
    free(copy);
    if (s->hp.n_kv_heads < 0)
        s->hp.n_kv_heads = s->hp.n_heads;
    return rc;
}

static unsigned rand_next(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return *state >> 8;
}

int cmd_bench(int argc, char **argv)
{
    kvs_session_params params = kvs_session_default_params();
    const char *cmd = "bench", *model_path = NULL, *synthetic = NULL, *save = NULL,
               *json = NULL, *v;
    int n_prompt = 512, n_gen = 128, threads = cli_default_threads(), reps = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VALUE() (v = cli_value(cmd, argc, argv, &i))
        int kv = cli_kv_flags(cmd, argc, argv, &i, &params);
        if (kv < 0)
            return CLI_USAGE;
        if (kv == 2)
            return CLI_OK;
        if (kv == 1)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            fputs(cli_kv_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "--synthetic")) {
            if (!(synthetic = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "--save")) {
            if (!(save = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "--json")) {
            if (!(json = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 22, &n_prompt))
                return CLI_USAGE;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            if (!VALUE() || cli_int(cmd, a, v, 0, 1 << 22, &n_gen))
                return CLI_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 256, &threads))
                return CLI_USAGE;
        } else if (!strcmp(a, "--chunk")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 20, &params.chunk))
                return CLI_USAGE;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1000, &reps))
                return CLI_USAGE;
        } else {
            return cli_bad_arg(cmd, a);
        }
#undef VALUE
    }
    if (!model_path == !synthetic) {
        cli_error(cmd, "needs exactly one of -m MODEL or --synthetic SHAPE (see --help)");
        return CLI_USAGE;
    }
    if (save && !synthetic) {
        cli_error(cmd, "--save only applies to --synthetic");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"-m", model_path}};
    kvs_outfile_spec json_out = cli_output("--json", json, inputs, 1),
                     save_out = cli_output("--save", save, NULL, 0);
    kvs_outfile_kind save_kind = KVS_OUTFILE_NEW;
    if ((json && cli_check_output(cmd, &json_out, NULL) != 0) ||
        (save && cli_check_output(cmd, &save_out, &save_kind) != 0))
        return CLI_FAIL;
    /* A FIFO or device cannot be loaded back: the model goes to a private file, then to it. */
    const int save_through = save && save_kind == KVS_OUTFILE_THROUGH;

    kvs_error err = {0};
    char tmp_path[4096] = "";
    const char *label = model_path;
    if (synthetic) {
        shape sh;
        if (parse_shape(cmd, synthetic, &sh) != 0)
            return CLI_USAGE;
        if (sh.hp.ctx == 0)
            sh.hp.ctx = n_prompt + n_gen > 2048 ? n_prompt + n_gen : 2048;
        if (!save || save_through) {
            const char *dir = getenv("TMPDIR");
            snprintf(tmp_path, sizeof tmp_path, "%s/kvslim-synthetic-%d.gguf",
                     dir && *dir ? dir : "/tmp", (int)getpid());
        }
        model_path = save && !save_through ? save : tmp_path;
        kvs_outfile_spec model_out = save && !save_through ? save_out
                                                           : cli_output(NULL, tmp_path, NULL, 0);
        label = synthetic;
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "writing synthetic model %s ...\n", model_path);
        if (kvs_synthetic_write_to(&sh.hp, sh.type, 1234, &model_out, stderr, &err) != KVS_OK) {
            cli_error(cmd, "%s", err.msg);
            return CLI_FAIL;
        }
        if (tmp_path[0])
            cli_temp_track(NULL, tmp_path, 1);
        if (save_through && cli_copy_to_output(cmd, &save_out, tmp_path) != 0) {
            unlink(tmp_path);
            cli_temp_track(NULL, tmp_path, 0);
            return CLI_FAIL;
        }
    }
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    int32_t *tokens = NULL;
    int rc = CLI_FAIL;
    kvs_status st = kvs_model_load(model_path, &m, &err);
    if (tmp_path[0]) {
        unlink(tmp_path); /* the mapping stays valid */
        cli_temp_track(NULL, tmp_path, 0);
    }
    if (st != KVS_OK)
        goto fail;
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    if (n_prompt + n_gen > info.n_ctx) {
        snprintf(err.msg, sizeof err.msg,
                 "-p %d plus -n %d exceed the model's context of %d tokens", n_prompt, n_gen,
                 info.n_ctx);
        goto fail;
    }
    params.n_threads = threads;
    if (kvs_session_new(m, &params, &s, &err) != KVS_OK)
        goto fail;
    if (!(tokens = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_gen)))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    unsigned state = 7;
    for (int i = 0; i < n_prompt + n_gen; i++)
        tokens[i] = (int32_t)(rand_next(&state) % (unsigned)info.n_vocab);

    /* Warm-up: page in the weights, on a full-cache session so a short warm-up prompt cannot
     * conflict with the policy's budget. */
    {
        kvs_session_params wp = params;
        wp.kv_policy = NULL;
        kvs_session *warm_s = NULL;
        int warm = n_prompt < 32 ? n_prompt : 32;
        st = kvs_session_new(m, &wp, &warm_s, &err);
        if (st == KVS_OK)
            st = kvs_session_eval(warm_s, tokens, warm, NULL, 0, &err);
        kvs_session_free(warm_s);
        if (st != KVS_OK)
            goto fail;
    }
    double sum_prefill = 0, sum_decode = 0, sum_attn_share = 0, sum_hook_share = 0;
    size_t kv_bytes = 0, kv_peak = 0;
    for (int r = 0; r < reps; r++) {
        kvs_session_reset(s);
        cli_progress("prefill", r, reps);
        double t0 = cli_now();
        if (kvs_session_eval(s, tokens, n_prompt, NULL, 0, &err) != KVS_OK)
            goto fail;
        double t1 = cli_now();
        sum_hook_share += kvs_kv_prefill_hook_seconds(kvs_session_kv(s)) / (t1 - t0);
        for (int g = 0; g < n_gen; g++) {
            cli_progress("decode", g, n_gen);
            if (kvs_session_eval(s, tokens + n_prompt + g, 1, NULL, 0, &err) != KVS_OK)
                goto fail;
        }
        double t2 = cli_now();
        sum_prefill += n_prompt / (t1 - t0);
        if (n_gen) {
            sum_decode += n_gen / (t2 - t1);
            sum_attn_share += kvs_kv_decode_seconds(kvs_session_kv(s)) / (t2 - t1);
        }
        kv_bytes = kvs_session_kv_bytes(s);
        kv_peak = kvs_session_kv_peak_bytes(s);
    }
    cli_progress_end();
    double prefill = sum_prefill / reps, decode = sum_decode / reps,
           attn_share = sum_attn_share / reps, hook_share = sum_hook_share / reps;
    const char *kv_spec = params.kv_policy ? params.kv_policy : "full",
               *kv_type = params.kv_type ? params.kv_type : "f32";
    size_t rss = cli_peak_rss();
    char kvb[32], kvp[32], rssb[32], wb[32];
    printf("| model | params | weights | KV policy | KV type | threads | n_prompt | n_gen | "
           "prefill tok/s | prefill time in policy hooks | decode tok/s | decode time in KV layer | "
           "KV bytes (peak) | peak RSS |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| %s | %.1fM | %s %s | %s | %s | %d | %d | %d | %.1f | %.1f%% | %.1f | %.1f%% | %s (%s) "
           "| %s |\n",
           label, info.n_params / 1e6, info.weight_type,
           cli_bytes(wb, sizeof wb, (double)info.weight_bytes), kv_spec, kv_type, threads,
           n_prompt, n_gen, prefill, 100 * hook_share, decode, 100 * attn_share,
           cli_bytes(kvb, sizeof kvb, (double)kv_bytes), cli_bytes(kvp, sizeof kvp, (double)kv_peak),
           cli_bytes(rssb, sizeof rssb, (double)rss));
    if (json) {
        char buf[4096], jl[1024], jk[512];
        int len = snprintf(buf, sizeof buf,
                           "{\"model\": \"%s\", \"weight_type\": \"%s\", \"n_params\": %lld, "
                           "\"kv\": \"%s\", \"kv_type\": \"%s\", "
                           "\"threads\": %d, \"n_prompt\": %d, \"n_gen\": %d, "
                           "\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
                           "\"decode_kv_share\": %.4f, \"prefill_policy_share\": %.4f, \"kv_bytes\": %zu, \"kv_bytes_peak\": %zu, "
                           "\"peak_rss_bytes\": %zu}\n",
                           cli_json_escape(jl, sizeof jl, label), info.weight_type,
                           (long long)info.n_params, cli_json_escape(jk, sizeof jk, kv_spec),
                           kv_type, threads, n_prompt, n_gen, prefill, decode, attn_share,
                           hook_share, kv_bytes, kv_peak, rss);
        if (cli_write_output(cmd, &json_out, buf, (size_t)len) != 0) {
            err.msg[0] = 0;
            goto fail;
        }
    }
    rc = CLI_OK;
fail:
    cli_progress_end();
    if (rc != CLI_OK && err.msg[0])
        cli_error(cmd, "%s", err.msg);
    free(tokens);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}
