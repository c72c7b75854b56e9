/* kvslim logits: teacher-forced logits of every position of a token file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command logits_cmd = {
    "logits", CMD_LOGITS,
    "usage: kvslim logits -m MODEL --tokens FILE --out FILE.f32 [-t N] [--chunk N]\n"
    "\n"
    "Feeds the tokens of FILE (one id per line) and writes the logits produced at every\n"
    "position: n_tokens x n_vocab little-endian float32, row-major.\n",
    NULL};

static int logits(const cli_args *a)
{
    const char *cmd = "logits", *model_path = a->str[FL_MODEL],
               *tokens_path = a->str[FL_TOKENS], *out_path = a->str[FL_OUT];
    if (!model_path || !tokens_path || !out_path) {
        cli_error(cmd, "needs -m MODEL, --tokens FILE and --out FILE (see --help)");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"-m", model_path}, {"--tokens", tokens_path}};
    kvs_outfile_spec dst = cli_output("--out", out_path, inputs, 2);
    if (cli_check_output(cmd, &dst, NULL) != 0)
        return CLI_FAIL;
    kvs_session_params params;
    if (cli_session_params(a, &params) != 0)
        return CLI_USAGE;
    int32_t *ids = NULL;
    int n = 0;
    if (cli_read_tokens(cmd, tokens_path, &ids, &n) != 0)
        return CLI_FAIL;

    kvs_error err = {0};
    kvs_status st = KVS_OK;
    kvs_model *m = NULL;
    kvs_session *s = NULL;
    float *out = NULL;
    int rc = CLI_FAIL;
    kvs_model_info info;
    if ((st = kvs_model_load(model_path, &m, &err)) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    for (int i = 0; i < n; i++)
        if (ids[i] >= info.n_vocab) {
            st = kvs_fail(&err, KVS_ERR_ARG,
                          "%s: token id %d (token %d of the file) is outside the vocabulary "
                          "[0, %d)", tokens_path, ids[i], i + 1, info.n_vocab);
            goto fail;
        }
    if (n > info.n_ctx) {
        st = kvs_fail(&err, KVS_ERR_ARG, "%s: %d tokens exceed the model's context of %d",
                      tokens_path, n, info.n_ctx);
        goto fail;
    }
    if ((st = kvs_session_new(m, &params, &s, &err)) != KVS_OK)
        goto fail;
    if (!(out = malloc(sizeof(float) * (size_t)n * info.n_vocab))) {
        st = kvs_fail(&err, KVS_ERR_NOMEM, "out of memory for %d x %d logits", n, info.n_vocab);
        goto fail;
    }
    if ((st = kvs_session_eval(s, ids, n, out, 1, &err)) != KVS_OK)
        goto fail;
    if (cli_write_output(cmd, &dst, out, sizeof(float) * (size_t)n * info.n_vocab) != 0) {
        err.msg[0] = 0;
        goto fail;
    }
    if (dst.path && strcmp(dst.path, "-"))
        fprintf(stderr, "wrote %s: %d x %d logits (KV %s, policy %s)\n", out_path, n,
                info.n_vocab, params.kv_type, params.kv_policy ? params.kv_policy : "full");
    rc = CLI_OK;
fail:
    if (rc != CLI_OK && err.msg[0]) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
    }
    free(out);
    free(ids);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}

int cmd_logits(int argc, char **argv) { return cli_main(&logits_cmd, logits, argc, argv); }
