/* kvslim: command-line entry point; one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef KVS_VERSION
#define KVS_VERSION "unknown"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"logits", cmd_logits, "teacher-forced logits of a token file"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"convert", cmd_convert, "convert a llama2.c checkpoint to GGUF"},
    {"bench", cmd_bench, "measure prefill and decode speed"},
    {"eval", cmd_eval, "fidelity of KV policies against the full cache"},
    {"layersim", cmd_layersim, "adjacent-layer cosine similarity of K and V"},
    {"mpc", cmd_mpc, "two-party secure inference (dealer, client, server)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with a KV policy per request"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvslim COMMAND [options]   (kvslim COMMAND --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nkvslim --version prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvslim %s\n", KVS_VERSION);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvslim: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
