/* Fuzzes the --kv spec parser: kvs_kv_policy_check on the input as a NUL-terminated string. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvslim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy with a NUL after it: the parser takes a C string, and ASan then catches any read
     * past the spec's end. An embedded NUL just ends the spec early, as it would on the CLI. */
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    kvs_error err = {0};
    (void)kvs_kv_policy_check(spec, &err);
    free(spec);
    return 0;
}
