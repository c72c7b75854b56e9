/* kvslim run: stream generated text to stdout, one stats line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command run_cmd = {
    "run", CMD_RUN,
    "usage: kvslim run -m MODEL (-p TEXT | -f FILE) [options]\n"
    "       kvslim run -m MODEL --chat [--system TEXT] [--chat-template NAME] [-p TEXT | -f FILE]\n"
    "                  [options]\n"
    "\n"
    "Prints the prompt and the generated text to stdout; at the end one stats line on stderr:\n"
    "prompt and generated tokens, prefill and decode tok/s, KV bytes held vs a full F16 cache.\n"
    "The prompt is printed once the model has taken it (tokenized and prefilled), so an error\n"
    "never follows echoed text.\n"
    "\n"
    "With --chat, each line of stdin is a user turn (a prompt given with -p or -f is the first\n"
    "one), formatted with the model's chat template and answered on stdout, one reply per turn;\n"
    "the stats line counts every turn's tokens. printf 'hi\\nhow are you\\n' | kvslim run -m\n"
    "MODEL --chat -n 16 prints two replies. Exit codes: 2 bad usage, 1 a failure.\n",
    NULL};

void cli_print_run_stats(const kvs_session *s, const char *kv_type, int n_prompt, int n_gen,
                         double t_prefill, double t_decode)
{
    char held[32], full[32];
    fprintf(stderr,
            "prompt %d tokens, generated %d tokens, prefill %.1f tok/s, decode %.1f tok/s, "
            "KV %s held in %s (full F16 cache: %s)\n",
            n_prompt, n_gen, t_prefill > 0 ? n_prompt / t_prefill : 0.0,
            t_decode > 0 && n_gen > 1 ? (n_gen - 1) / t_decode : 0.0,
            cli_bytes(held, sizeof held, (double)kvs_session_kv_bytes(s)), kv_type,
            cli_bytes(full, sizeof full, (double)kvs_session_kv_bytes_full_f16(s)));
}

static int run(const cli_args *a)
{
    const char *cmd = "run", *model_path = a->str[FL_MODEL], *text = a->str[FL_PROMPT],
               *file = a->str[FL_FILE];
    const int chat = a->given[FL_CHAT] > 0;
    if (!chat && (a->given[FL_SYSTEM] || a->given[FL_CHAT_TEMPLATE])) {
        cli_error(cmd, "%s needs --chat (see --help)",
                  a->given[FL_SYSTEM] ? "--system" : "--chat-template");
        return CLI_USAGE;
    }
    if (chat && a->given[FL_PROGRESS]) {
        cli_error(cmd, "--progress is not taken with --chat (see --help)");
        return CLI_USAGE;
    }
    if (chat ? !model_path || (text && file) : !model_path || (!text == !file)) {
        cli_error(cmd, chat ? "--chat needs -m MODEL and at most one of -p TEXT or -f FILE (see "
                              "--help)"
                            : "needs -m MODEL and exactly one of -p TEXT or -f FILE (see --help)");
        return CLI_USAGE;
    }
    int n_predict = cli_get_int(a, FL_N_PREDICT, 256), n_ctx = cli_get_int(a, FL_CTX, 0);
    kvs_sampler_params sp = {.temperature = (float)cli_get_f64(a, FL_TEMP, 0.8),
                             .top_k = cli_get_int(a, FL_TOP_K, 40),
                             .top_p = (float)cli_get_f64(a, FL_TOP_P, 0.95),
                             .seed = a->given[FL_SEED] ? (uint64_t)a->i[FL_SEED] : 42};
    kvs_session_params params;
    if (cli_session_params(a, &params) != 0)
        return CLI_USAGE;
    params.n_ctx = n_ctx;
    params.context_shift = a->given[FL_CONTEXT_SHIFT] > 0;
    params.allow_ctx_beyond_trained = 1; /* -c asked for it; the session sends a notice */
    const int ignore_eos = a->given[FL_IGNORE_EOS] > 0;
    const int progress = cli_get_int(a, FL_PROGRESS, 0);

    char *owned = NULL;
    if (file && !(text = owned = cli_read_file(cmd, file, NULL)))
        return CLI_FAIL;
    if (chat) {
        int chat_rc = cli_run_chat(a, &params, text);
        free(owned);
        return chat_rc;
    }

    kvs_error err = {0};
    kvs_status st = KVS_OK;
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    kvs_sampler *sampler = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    int n_prompt = 0, n_gen = 0, rc = CLI_FAIL;
    kvs_model_info info;

    if ((st = kvs_model_load(model_path, &m, &err)) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    if ((st = kvs_tokenize(m, text, 1, &prompt, &n_prompt, &err)) != KVS_OK ||
        (st = kvs_session_new(m, &params, &s, &err)) != KVS_OK)
        goto fail;
    if ((st = kvs_sampler_new(info.n_vocab, &sp, &sampler, &err)) != KVS_OK)
        goto fail;
    if (!(logits = malloc(sizeof(float) * (size_t)info.n_vocab))) {
        st = kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }

    /* Prefill before echoing anything: the policy accepts or rejects the prompt here (budget,
     * protected tokens, context), and a rejection is then the only thing printed. */
    double t0 = cli_now();
    if ((st = kvs_session_eval(s, prompt, n_prompt, logits, 0, &err)) != KVS_OK)
        goto fail;
    double t_prefill = cli_now() - t0;
    fputs(text, stdout);
    fflush(stdout);

    /* Evicting policies may run past the context (kvs_session_ctx_left is then unbounded). */
    int ctx = n_ctx ? n_ctx : info.n_ctx;
    int prev = prompt[n_prompt - 1], ctx_left = kvs_session_ctx_left(s), stop_token = 0;
    t0 = cli_now();
    double t_last = t0;
    for (; n_gen < n_predict && n_gen < ctx_left; n_gen++) {
        int32_t tok = kvs_sampler_sample(sampler, logits);
        int end = tok == kvs_token_eos(m) || tok == kvs_token_bos(m);
        if (end && !ignore_eos) {
            stop_token = 1;
            break;
        }
        int len;
        const char *piece = end ? "\n" : kvs_token_text(m, prev, tok, &len);
        if (end)
            len = 1;
        fwrite(piece, 1, (size_t)len, stdout);
        fflush(stdout);
        prev = tok;
        if (n_gen + 1 < n_predict && n_gen + 1 < ctx_left &&
            (st = kvs_session_eval(s, &tok, 1, logits, 0, &err)) != KVS_OK) {
            fputc('\n', stdout); /* the error goes on a line of its own */
            fflush(stdout);
            goto fail;
        }
        if (progress && (n_gen + 1) % progress == 0) {
            double now = cli_now();
            fprintf(stderr, "kvslim run: progress: generated %d tokens, %.3f s, %.1f tok/s\n",
                    n_gen + 1, now - t0, now > t_last ? progress / (now - t_last) : 0.0);
            t_last = now;
        }
    }
    double t_decode = cli_now() - t0;
    fputc('\n', stdout);
    fflush(stdout);
    if (!stop_token && n_gen < n_predict)
        fprintf(stderr, "kvslim run: stopped: the context of %d tokens is full (prompt %d, "
                        "generated %d)\n", ctx, n_prompt, n_gen);
    cli_print_run_stats(s, params.kv_type, n_prompt, n_gen, t_prefill, t_decode);
    rc = CLI_OK;
fail:
    if (rc != CLI_OK) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
    }
    kvs_sampler_free(sampler);
    free(logits);
    free(prompt);
    free(owned);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}

int cmd_run(int argc, char **argv) { return cli_main(&run_cmd, run, argc, argv); }
