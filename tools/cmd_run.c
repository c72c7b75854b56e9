/* kvslim run: stream generated text to stdout, one stats line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/sampler.h"

static const char *const help =
    "usage: kvslim run -m MODEL (-p TEXT | -f FILE) [options]\n"
    "\n"
    "Prints the prompt and the generated text to stdout; at the end one stats line on stderr:\n"
    "prompt and generated tokens, prefill and decode tok/s, KV bytes held vs a full F16 cache.\n"
    "  -m, --model MODEL   GGUF model (llama architecture)\n"
    "  -p, --prompt TEXT   prompt text (BOS is prepended)\n"
    "  -f, --file FILE     read the prompt from FILE\n"
    "  -n, --n-predict N   tokens to generate (default 256); stops early at EOS or BOS\n"
    "  --temp T            temperature (default 0.8); 0 = greedy\n"
    "  --top-k K           keep the K most likely tokens (default 40; 0 = off)\n"
    "  --top-p P           nucleus sampling threshold (default 0.95; 1 = off)\n"
    "  --seed S            sampling seed (default 42); same seed, same text\n"
    "  -t, --threads N     threads (default: online CPUs, at most 8)\n"
    "  -c, --ctx N         context length (default: the model's)\n"
    "  --chunk N           prompt tokens per forward batch (default 512)\n";


int cmd_run(int argc, char **argv)
{
    const char *cmd = "run", *model_path = NULL, *text = NULL, *file = NULL, *v;
    int n_predict = 256, n_ctx = 0, chunk = 0, threads = cli_default_threads();
    kvs_sampler_params sp = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42};
    kvs_session_params params = kvs_session_default_params();
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
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(text = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = VALUE()))
                return CLI_USAGE;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!VALUE() || cli_int(cmd, a, v, 0, 1 << 24, &n_predict))
                return CLI_USAGE;
        } else if (!strcmp(a, "--temp")) {
            if (!VALUE() || cli_float(cmd, a, v, 0, 100, &sp.temperature))
                return CLI_USAGE;
        } else if (!strcmp(a, "--top-k")) {
            if (!VALUE() || cli_int(cmd, a, v, 0, 1 << 24, &sp.top_k))
                return CLI_USAGE;
        } else if (!strcmp(a, "--top-p")) {
            if (!VALUE() || cli_float(cmd, a, v, 0, 1, &sp.top_p))
                return CLI_USAGE;
        } else if (!strcmp(a, "--seed")) {
            if (!VALUE() || cli_u64(cmd, a, v, &sp.seed))
                return CLI_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 256, &threads))
                return CLI_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 24, &n_ctx))
                return CLI_USAGE;
        } else if (!strcmp(a, "--context-shift")) {
            params.context_shift = 1; /* position shifting (evicting --kv policies) */
        } else if (!strcmp(a, "--chunk")) {
            if (!VALUE() || cli_int(cmd, a, v, 1, 1 << 20, &chunk))
                return CLI_USAGE;
        } else {
            return cli_bad_arg(cmd, a);
        }
#undef VALUE
    }
    if (!model_path || (!text == !file)) {
        cli_error(cmd, "needs -m MODEL and exactly one of -p TEXT or -f FILE (see --help)");
        return CLI_USAGE;
    }
    char *owned = NULL;
    if (file && !(text = owned = cli_read_file(cmd, file, NULL)))
        return CLI_FAIL;

    kvs_error err = {0};
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    kvs_sampler *sampler = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    int n_prompt = 0, n_gen = 0, rc = CLI_FAIL;
    double t_prefill = 0, t_decode = 0;
    kvs_model_info info;
    params.n_threads = threads;
    params.n_ctx = n_ctx;
    params.chunk = chunk;

    if (kvs_model_load(model_path, &m, &err) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    if (kvs_tokenize(m, text, 1, &prompt, &n_prompt, &err) != KVS_OK ||
        kvs_session_new(m, &params, &s, &err) != KVS_OK)
        goto fail;
    if (kvs_sampler_new(info.n_vocab, &sp, &sampler, &err) != KVS_OK)
        goto fail;
    if (!(logits = malloc(sizeof(float) * (size_t)info.n_vocab))) {
        snprintf(err.msg, sizeof err.msg, "out of memory");
        goto fail;
    }
    fputs(text, stdout);
    fflush(stdout);

    double t0 = cli_now();
    if (kvs_session_eval(s, prompt, n_prompt, logits, 0, &err) != KVS_OK)
        goto fail;
    t_prefill = cli_now() - t0;

    int prev = prompt[n_prompt - 1], ctx_left = kvs_session_ctx_left(s);
    t0 = cli_now();
    for (; n_gen < n_predict && n_gen < ctx_left; n_gen++) {
        int32_t tok = kvs_sampler_sample(sampler, logits);
        if (tok == kvs_token_eos(m) || tok == kvs_token_bos(m))
            break;
        int len;
        const char *piece = kvs_token_text(m, prev, tok, &len);
        fwrite(piece, 1, (size_t)len, stdout);
        fflush(stdout);
        prev = tok;
        if (n_gen + 1 < n_predict && n_gen + 1 < ctx_left &&
            kvs_session_eval(s, &tok, 1, logits, 0, &err) != KVS_OK)
            goto fail;
    }
    t_decode = cli_now() - t0;
    fputc('\n', stdout);
    fflush(stdout);
    {
        char held[32], full[32];
        fprintf(stderr,
                "prompt %d tokens, generated %d tokens, prefill %.1f tok/s, decode %.1f tok/s, "
                "KV %s held (full F16 cache: %s)\n",
                n_prompt, n_gen, t_prefill > 0 ? n_prompt / t_prefill : 0.0,
                t_decode > 0 && n_gen > 1 ? (n_gen - 1) / t_decode : 0.0,
                cli_bytes(held, sizeof held, (double)kvs_session_kv_bytes(s)),
                cli_bytes(full, sizeof full, (double)kvs_session_kv_bytes_full_f16(s)));
    }
    rc = CLI_OK;
fail:
    if (rc != CLI_OK)
        cli_error(cmd, "%s", err.msg);
    kvs_sampler_free(sampler);
    free(logits);
    free(prompt);
    free(owned);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}
