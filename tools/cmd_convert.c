/* kvslim convert: llama2.c checkpoint + tokenizer -> GGUF. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

static const cli_command convert_cmd = {
    "convert", CMD_CONVERT,
    "usage: kvslim convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf [--type TYPE]\n"
    "\n"
    "Converts a llama2.c checkpoint and its tokenizer into a GGUF file with llama.cpp's\n"
    "llama-architecture keys and tensor names.\n",
    "MODEL.bin"};

static int convert(const cli_args *a)
{
    const char *cmd = "convert", *model = a->positional, *tok = a->str[FL_TOKENIZER],
               *out = a->str[FL_OUT];
    if (!model || !tok || !out) {
        cli_error(cmd, "needs MODEL.bin, --tokenizer TOK.bin and -o OUT.gguf (see --help)");
        return CLI_USAGE;
    }
    kvs_dtype type = KVS_F32;
    if (a->given[FL_TYPE] && kvs_dtype_parse(a->str[FL_TYPE], &type) != 0) {
        cli_error(cmd, "--type: unknown type '%s'", a->str[FL_TYPE]); /* the table lists more */
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"MODEL", model}, {"--tokenizer", tok}};
    kvs_outfile_spec dst = cli_output("-o", out, inputs, 2);
    if (cli_check_output(cmd, &dst, NULL) != 0)
        return CLI_FAIL;
    kvs_error err = {0};
    kvs_status st = kvs_llama2c_convert_to(model, tok, type, &dst, stderr, &err);
    if (st != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return cli_status_exit(st);
    }
    fprintf(stderr, "wrote %s (%s)\n", out, kvs_dtype_name(type));
    return CLI_OK;
}

int cmd_convert(int argc, char **argv) { return cli_main(&convert_cmd, convert, argc, argv); }
