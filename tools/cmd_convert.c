/* kvslim convert: llama2.c checkpoint + tokenizer -> GGUF. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command convert_cmd = {
    "convert", CMD_CONVERT,
    "usage: kvslim convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf [--type TYPE]\n"
    "                      [--duplicate-layers L1,L2,...]\n"
    "\n"
    "Converts a llama2.c checkpoint and its tokenizer into a GGUF file with llama.cpp's\n"
    "llama-architecture keys and tensor names. --duplicate-layers writes a depth-up-scaled\n"
    "model whose duplicated layers are byte-identical copies (adjacent layers similar by\n"
    "construction, e.g. to show MiniCache where its premise holds).\n",
    "MODEL.bin"};

#define MAX_DUP 4096

/* --duplicate-layers as whole numbers, strictly increasing; -1 after printing why. */
static int parse_dup(const char *v, int *dup, int *n_dup)
{
    *n_dup = 0;
    for (const char *p = v; *p;) {
        char item[32];
        size_t len = strcspn(p, ",");
        int64_t x = 0;
        if (len >= sizeof item || (memcpy(item, p, len), item[len] = 0,
                                   kvs_parse_i64(item, 0, MAX_DUP - 1, &x) != 0)) {
            cli_error("convert", "--duplicate-layers: '%.*s' is not a layer index (a whole "
                      "number from 0)", (int)len, p);
            return -1;
        }
        if (*n_dup > 0 && x <= dup[*n_dup - 1]) {
            cli_error("convert", "--duplicate-layers: layer %d %s: list each layer once, in "
                      "increasing order", (int)x,
                      x == dup[*n_dup - 1] ? "is listed twice" : "comes after a later one");
            return -1;
        }
        if (*n_dup >= MAX_DUP) {
            cli_error("convert", "--duplicate-layers: more than %d layers", MAX_DUP);
            return -1;
        }
        dup[(*n_dup)++] = (int)x;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

static int convert(const cli_args *a)
{
    const char *cmd = "convert", *model = a->positional, *tok = a->str[FL_TOKENIZER],
               *out = a->str[FL_OUT];
    if (!model || !tok || !out) {
        cli_error(cmd, "needs MODEL.bin, --tokenizer TOK.bin and -o OUT.gguf (see --help)");
        return CLI_USAGE;
    }
    kvs_wtype wt = KVS_WTYPE(KVS_F32);
    if (a->given[FL_TYPE] && kvs_wtype_parse(a->str[FL_TYPE], &wt) != 0) {
        cli_error(cmd, "--type: unknown type '%s' (" KVS_WTYPE_NAMES ")", a->str[FL_TYPE]);
        return CLI_USAGE;
    }
    static int dup[MAX_DUP];
    int n_dup = 0;
    if (a->given[FL_DUPLICATE_LAYERS] && parse_dup(a->str[FL_DUPLICATE_LAYERS], dup, &n_dup))
        return CLI_USAGE;
    const kvs_outfile_input inputs[] = {{"MODEL", model}, {"--tokenizer", tok}};
    kvs_outfile_spec dst = cli_output("-o", out, inputs, 2);
    if (cli_check_output(cmd, &dst, NULL) != 0)
        return CLI_FAIL;
    kvs_error err = {0};
    kvs_status st = kvs_llama2c_convert_dup_to(model, tok, wt, dup, n_dup, &dst, stderr, &err);
    if (st != KVS_OK) {
        cli_error(cmd, "%s%s", n_dup && st == KVS_ERR_ARG ? "--duplicate-layers: " : "",
                  err.msg);
        return cli_status_exit(st);
    }
    fprintf(stderr, "wrote %s (%s)\n", out, kvs_wtype_name(wt));
    return CLI_OK;
}

int cmd_convert(int argc, char **argv) { return cli_main(&convert_cmd, convert, argc, argv); }
