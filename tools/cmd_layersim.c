/* kvslim layersim: adjacent-layer cosine similarity of the full cache's keys and values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command layersim_cmd = {
    "layersim", CMD_LAYERSIM,
    "usage: kvslim layersim -m MODEL --tokens FILE [--prompt-len N] [--json OUT]\n"
    "\n"
    "Feeds the tokens (all of them, or the first N) through the full cache and prints, for\n"
    "every adjacent layer pair (l, l+1), the mean and the 10th, 50th and 90th percentiles\n"
    "of the per-token cosine similarity of the stored keys (after RoPE) and of the values.\n"
    "A token's vector is all its KV heads concatenated (MiniCache's per-token unit).\n"
    "MiniCache merges adjacent layers on the premise that this similarity is high.\n",
    NULL};

static void print_table(const kvs_layer_sim *r, int n)
{
    printf("%-7s %7s %7s %7s %7s   %7s %7s %7s %7s\n", "pair", "K mean", "K p10", "K p50",
           "K p90", "V mean", "V p10", "V p50", "V p90");
    for (int i = 0; i < n; i++) {
        char pair[32];
        snprintf(pair, sizeof pair, "(%d,%d)", r[i].layer, r[i].layer + 1);
        printf("%-7s %7.4f %7.4f %7.4f %7.4f   %7.4f %7.4f %7.4f %7.4f\n", pair, r[i].k.mean,
               r[i].k.p10, r[i].k.p50, r[i].k.p90, r[i].v.mean, r[i].v.p10, r[i].v.p50,
               r[i].v.p90);
    }
    printf("\nnorm ratio ||x(l+1)|| / ||x(l)|| per token (SLERP keeps both norms, Mean does not)\n");
    printf("%-7s %7s %7s %7s   %7s %7s %7s\n", "pair", "K p10", "K p50", "K p90", "V p10",
           "V p50", "V p90");
    for (int i = 0; i < n; i++) {
        char pair[32];
        snprintf(pair, sizeof pair, "(%d,%d)", r[i].layer, r[i].layer + 1);
        printf("%-7s %7.4f %7.4f %7.4f   %7.4f %7.4f %7.4f\n", pair, r[i].k_ratio.p10,
               r[i].k_ratio.p50, r[i].k_ratio.p90, r[i].v_ratio.p10, r[i].v_ratio.p50,
               r[i].v_ratio.p90);
    }
}

/* The table as JSON; NULL when out of memory. */
static char *json_table(const kvs_layer_sim *r, int n, const char *model, int n_tokens,
                        size_t *len)
{
    size_t cap = 512 + (size_t)n * 512 + strlen(model) * 6;
    char *buf = malloc(cap), esc[4096];
    if (!buf)
        return NULL;
    size_t off = 0;
    off += (size_t)snprintf(buf + off, cap - off, "[");
    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(
            buf + off, cap - off,
            "%s\n  {\"model\": \"%s\", \"unit\": \"token\", \"tokens\": %d, \"layer\": %d, "
            "\"next_layer\": %d, \"k_mean\": %.6f, \"k_p10\": %.6f, \"k_p50\": %.6f, "
            "\"k_p90\": %.6f, \"v_mean\": %.6f, \"v_p10\": %.6f, \"v_p50\": %.6f, "
            "\"v_p90\": %.6f, \"k_norm_ratio_p10\": %.6f, \"k_norm_ratio_p50\": %.6f, "
            "\"k_norm_ratio_p90\": %.6f, \"v_norm_ratio_p10\": %.6f, \"v_norm_ratio_p50\": %.6f, "
            "\"v_norm_ratio_p90\": %.6f}",
            i ? "," : "", cli_json_escape(esc, sizeof esc, model), n_tokens, r[i].layer,
            r[i].layer + 1, r[i].k.mean, r[i].k.p10, r[i].k.p50, r[i].k.p90, r[i].v.mean,
            r[i].v.p10, r[i].v.p50, r[i].v.p90, r[i].k_ratio.p10, r[i].k_ratio.p50,
            r[i].k_ratio.p90, r[i].v_ratio.p10, r[i].v_ratio.p50, r[i].v_ratio.p90);
    off += (size_t)snprintf(buf + off, cap - off, "\n]\n");
    *len = off;
    return buf;
}

static int layersim(const cli_args *a)
{
    const char *cmd = "layersim", *model_path = a->str[FL_MODEL],
               *tokens_path = a->str[FL_TOKENS], *json_path = a->str[FL_JSON];
    if (!model_path || !tokens_path) {
        cli_error(cmd, "needs -m MODEL and --tokens FILE (see --help)");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"-m", model_path}, {"--tokens", tokens_path}};
    kvs_outfile_spec dst = cli_output("--json", json_path, inputs, 2);
    if (json_path && cli_check_output(cmd, &dst, NULL) != 0)
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
    kvs_layer_sim *rows = NULL;
    char *json = NULL;
    int rc = CLI_FAIL;
    kvs_model_info info;
    if (a->given[FL_PROMPT_LEN]) {
        if (a->i[FL_PROMPT_LEN] > n) {
            st = kvs_fail(&err, KVS_ERR_ARG, "--prompt-len %lld exceeds the %d tokens of %s",
                          (long long)a->i[FL_PROMPT_LEN], n, tokens_path);
            goto fail;
        }
        n = (int)a->i[FL_PROMPT_LEN];
    }
    if (n < 1) {
        st = kvs_fail(&err, KVS_ERR_ARG, "%s holds no tokens", tokens_path);
        goto fail;
    }
    if ((st = kvs_model_load(model_path, &m, &err)) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    if (info.n_layers < 2) {
        st = kvs_fail(&err, KVS_ERR_ARG, "%s has %d layer: no adjacent pair to compare",
                      model_path, info.n_layers);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= info.n_vocab) {
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
    if ((st = kvs_session_eval(s, ids, n, NULL, 0, &err)) != KVS_OK)
        goto fail;
    if (!(rows = calloc((size_t)info.n_layers - 1, sizeof *rows))) {
        st = kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = kvs_layer_similarity(kvs_session_kv(s), rows, &err)) != KVS_OK)
        goto fail;
    printf("%s: %d tokens, KV %s, unit = token (%d KV heads x %d)\n", model_path, n,
           params.kv_type, info.n_kv_heads, info.head_dim);
    print_table(rows, info.n_layers - 1);
    if (json_path) {
        size_t len = 0;
        if (!(json = json_table(rows, info.n_layers - 1, model_path, n, &len))) {
            st = kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if (cli_write_output(cmd, &dst, json, len) != 0) {
            err.msg[0] = 0;
            goto fail;
        }
    }
    rc = CLI_OK;
fail:
    if (rc != CLI_OK && err.msg[0]) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
    }
    free(json);
    free(rows);
    free(ids);
    kvs_session_free(s);
    kvs_model_free(m);
    return rc;
}

int cmd_layersim(int argc, char **argv) { return cli_main(&layersim_cmd, layersim, argc, argv); }
