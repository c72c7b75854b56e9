/* Fuzzes the CLI's token-file parser, cli_read_tokens (tools/cli_io.c: one token id per line,
 * blank lines and surrounding white space ignored, used by `kvslim run --prompt-tokens` and
 * friends), through the file reader under it (cli_read_file: size limit, NUL bytes). Errors are
 * expected (printed on stderr, as the CLI prints them); a crash, a leak, a hang, or a success
 * that returns no ids or an id outside [0, INT32_MAX] is a bug. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

/* The parser reads a path: one temporary file per process, unlinked at once and opened through
 * /proc/self/fd (as fuzz_gguf.c does), rewritten for every input. */
static char g_path[64];
static int g_fd = -1;

static int write_input(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        char tmpl[] = "/tmp/kvs_fuzz_tokens_XXXXXX";
        g_fd = mkstemp(tmpl);
        if (g_fd < 0) {
            perror("fuzz_tokens: mkstemp");
            abort();
        }
        unlink(tmpl);
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    }
    if (ftruncate(g_fd, 0) != 0)
        return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(g_fd, data + done, size - done, (off_t)done);
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (write_input(data, size) != 0)
        return 0;
    int32_t *ids = NULL;
    int n = -1;
    if (cli_read_tokens("fuzz", g_path, &ids, &n) == 0) {
        if (!ids || n <= 0) {
            fprintf(stderr, "fuzz_tokens: success with %d ids\n", n);
            abort();
        }
        for (int i = 0; i < n; i++)
            if (ids[i] < 0) {
                fprintf(stderr, "fuzz_tokens: id %d is %d\n", i, (int)ids[i]);
                abort();
            }
        free(ids);
    }
    return 0;
}
