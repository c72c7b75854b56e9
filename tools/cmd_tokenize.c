/* kvslim tokenize: print the token ids of a text, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"

static const cli_command tokenize_cmd = {
    "tokenize", CMD_TOKENIZE,
    "usage: kvslim tokenize -m MODEL (-p TEXT | -f FILE) [--no-bos]\n"
    "\n"
    "Prints the token ids of TEXT, one per line, starting with BOS when the vocabulary adds\n"
    "one (tokenizer.ggml.add_bos_token: SentencePiece's default yes, BPE's no) unless --no-bos.\n",
    NULL};

static int tokenize(const cli_args *a)
{
    const char *cmd = "tokenize", *model_path = a->str[FL_MODEL], *text = a->str[FL_PROMPT],
               *file = a->str[FL_FILE];
    if (!model_path || (!text == !file)) {
        cli_error(cmd, "needs -m MODEL and exactly one of -p TEXT or -f FILE (see --help)");
        return CLI_USAGE;
    }
    char *owned = NULL;
    if (file && !(text = owned = cli_read_file(cmd, file, NULL)))
        return CLI_FAIL;
    kvs_error err = {0};
    kvs_status st;
    kvs_model *m = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = CLI_OK;
    if ((st = kvs_model_load(model_path, &m, &err)) != KVS_OK ||
        (st = kvs_tokenize_special(m, text, !a->given[FL_NO_BOS], a->given[FL_SPECIAL] > 0, &ids,
                                   &n, &err)) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
    }
    for (int i = 0; i < n; i++)
        printf("%d\n", ids[i]);
    free(ids);
    free(owned);
    kvs_model_free(m);
    return rc;
}

int cmd_tokenize(int argc, char **argv) { return cli_main(&tokenize_cmd, tokenize, argc, argv); }
