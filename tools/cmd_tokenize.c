/* kvslim tokenize: print the token ids of a text, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const help =
    "usage: kvslim tokenize -m MODEL (-p TEXT | -f FILE) [--no-bos]\n"
    "\n"
    "Prints the token ids of TEXT, one per line, starting with BOS unless --no-bos.\n"
    "  -m, --model MODEL   GGUF model whose vocabulary to use\n"
    "  -p, --prompt TEXT   text to tokenize\n"
    "  -f, --file FILE     read the text from FILE\n"
    "  --no-bos            do not prepend the BOS token\n";

int cmd_tokenize(int argc, char **argv)
{
    const char *cmd = "tokenize", *model_path = NULL, *text = NULL, *file = NULL;
    int add_bos = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(text = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--no-bos")) {
            add_bos = 0;
        } else {
            return cli_bad_arg(cmd, a);
        }
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
    int32_t *ids = NULL;
    int n = 0, rc = CLI_OK;
    if (kvs_model_load(model_path, &m, &err) != KVS_OK ||
        kvs_tokenize(m, text, add_bos, &ids, &n, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        rc = CLI_FAIL;
    }
    for (int i = 0; i < n; i++)
        printf("%d\n", ids[i]);
    free(ids);
    free(owned);
    kvs_model_free(m);
    return rc;
}
