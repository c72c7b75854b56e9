/* kvslim logits: teacher-forced logits of every position of a token file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const help =
    "usage: kvslim logits -m MODEL --tokens FILE --out FILE.f32 [-t N] [--chunk N]\n"
    "\n"
    "Feeds the tokens of FILE (one id per line) and writes the logits produced at every\n"
    "position: n_tokens x n_vocab little-endian float32, row-major.\n"
    "  -m, --model MODEL   GGUF model\n"
    "  --tokens FILE       token ids, one per line\n"
    "  -o, --out FILE      output file (written atomically)\n"
    "  -t, --threads N     threads (default: online CPUs, at most 8)\n"
    "  --chunk N           tokens per forward batch (default 512)\n";

int cmd_logits(int argc, char **argv)
{
    kvs_session_params params = kvs_session_default_params();
    const char *cmd = "logits", *model_path = NULL, *tokens_path = NULL, *out_path = NULL, *v;
    int threads = cli_default_threads(), chunk = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
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
            if (!(model_path = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--tokens")) {
            if (!(tokens_path = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
            if (!(out_path = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_value(cmd, argc, argv, &i)) || cli_int(cmd, a, v, 1, 256, &threads))
                return CLI_USAGE;
        } else if (!strcmp(a, "--chunk")) {
            if (!(v = cli_value(cmd, argc, argv, &i)) || cli_int(cmd, a, v, 1, 1 << 20, &chunk))
                return CLI_USAGE;
        } else {
            return cli_bad_arg(cmd, a);
        }
    }
    if (!model_path || !tokens_path || !out_path) {
        cli_error(cmd, "needs -m MODEL, --tokens FILE and --out FILE (see --help)");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"-m", model_path}, {"--tokens", tokens_path}};
    kvs_outfile_spec out = cli_output("--out", out_path, inputs, 2);
    if (cli_check_output(cmd, &out, NULL) != 0)
        return CLI_FAIL;
    int32_t *ids = NULL;
    int n = 0;
    if (cli_read_tokens(cmd, tokens_path, &ids, &n) != 0)
        return CLI_FAIL;

    kvs_error err = {0};
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    float *logits = NULL;
    int rc = CLI_FAIL;
    kvs_model_info info;
    params.n_threads = threads;
    params.chunk = chunk;
    if (kvs_model_load(model_path, &m, &err) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    for (int i = 0; i < n; i++)
        if (ids[i] >= info.n_vocab) {
            snprintf(err.msg, sizeof err.msg,
                     "%s: token id %d (token %d of the file) is outside the vocabulary [0, %d)",
                     tokens_path, ids[i], i + 1, info.n_vocab);
            goto fail;
        }
    if (n > info.n_ctx) {
        snprintf(err.msg, sizeof err.msg, "%s: %d tokens exceed the model's context of %d",
                 tokens_path, n, info.n_ctx);
        goto fail;
    }
    if (kvs_session_new(m, &params, &s, &err) != KVS_OK)
        goto fail;
    if (!(logits = malloc(sizeof(float) * (size_t)n * info.n_vocab))) {
        snprintf(err.msg, sizeof err.msg, "out of memory for %d x %d logits", n, info.n_vocab);
        goto fail;
    }
    if (kvs_session_eval(s, ids, n, logits, 1, &err) != KVS_OK)
        goto fail;
    if (cli_write_output(cmd, &out, logits, sizeof(float) * (size_t)n * info.n_vocab) != 0) {
        err.msg[0] = 0;
        goto fail;
    }
    rc = CLI_OK;
fail:
    if (rc != CLI_OK && err.msg[0])
        cli_error(cmd, "%s", err.msg);
    free(logits);
    free(ids);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}
