/* kvslim convert: llama2.c checkpoint + tokenizer -> GGUF. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core/dtype.h"
#include "model/llama_write.h"

static const char *const help =
    "usage: kvslim convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf [--type TYPE]\n"
    "\n"
    "Converts a llama2.c checkpoint and its tokenizer into a GGUF file with llama.cpp's\n"
    "llama-architecture keys and tensor names.\n"
    "  --tokenizer TOK.bin  llama2.c tokenizer file\n"
    "  -o, --output FILE    GGUF file to write (written atomically)\n"
    "  --type TYPE          f32 (default), f16, bf16, q8_0 or q4_0 for weight matrices;\n"
    "                       norms stay f32; a matrix whose rows do not divide into 32-element\n"
    "                       blocks is stored as f16, with a note on stderr\n";

int cmd_convert(int argc, char **argv)
{
    const char *cmd = "convert", *model = NULL, *tok = NULL, *out = NULL;
    kvs_dtype type = KVS_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--tokenizer")) {
            if (!(tok = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out = cli_value(cmd, argc, argv, &i)))
                return CLI_USAGE;
        } else if (!strcmp(a, "--type")) {
            const char *v = cli_value(cmd, argc, argv, &i);
            if (!v)
                return CLI_USAGE;
            if (kvs_dtype_parse(v, &type) != 0) {
                cli_error(cmd, "--type: unknown type '%s' (expected f32, f16, bf16, q8_0, q4_0)",
                          v);
                return CLI_USAGE;
            }
        } else if (a[0] != '-' && !model) {
            model = a;
        } else {
            return cli_bad_arg(cmd, a);
        }
    }
    if (!model || !tok || !out) {
        cli_error(cmd, "needs MODEL.bin, --tokenizer TOK.bin and -o OUT.gguf (see --help)");
        return CLI_USAGE;
    }
    const kvs_outfile_input inputs[] = {{"MODEL", model}, {"--tokenizer", tok}};
    kvs_outfile_spec dst = cli_output("-o", out, inputs, 2);
    if (cli_check_output(cmd, &dst, NULL) != 0)
        return CLI_FAIL;
    kvs_error err = {0};
    if (kvs_llama2c_convert_to(model, tok, type, &dst, stderr, &err) != KVS_OK) {
        cli_error(cmd, "%s", err.msg);
        return CLI_FAIL;
    }
    fprintf(stderr, "wrote %s (%s)\n", out, kvs_dtype_name(type));
    return CLI_OK;
}
