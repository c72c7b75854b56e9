#include "kv/kivi.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/number.h"

static int bits_ok(int64_t b) { return b == 1 || b == 2 || b == 4 || b == 8; }

int kvs_kivi_parse(const char *name, kvs_kivi_cfg *out, kvs_error *err)
{
    memset(out, 0, sizeof *out);
    kvs_kivi_cfg c = {4, 4, 32, 128};
    if (strcasecmp(name, "kivi4") == 0) {
        *out = c;
        return 1;
    }
    if (strcasecmp(name, "kivi2") == 0) {
        c.k_bits = c.v_bits = 2;
        *out = c;
        return 1;
    }
    if (strncasecmp(name, "kivi:", 5) != 0)
        return 0;
    const char *p = name + 5;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len >= sizeof item) {
            kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: parameter too long", name);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *eq = strchr(item, '=');
        if (!eq) {
            kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: '%s' is not KEY=VALUE (kbits, vbits, "
                     "group, residual)", name, item);
            return -1;
        }
        *eq = 0;
        int64_t v;
        int *field = strcmp(item, "kbits") == 0      ? &c.k_bits
                     : strcmp(item, "vbits") == 0    ? &c.v_bits
                     : strcmp(item, "group") == 0    ? &c.group
                     : strcmp(item, "residual") == 0 ? &c.residual
                                                     : NULL;
        if (!field) {
            kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: unknown parameter '%s' (kbits, vbits, "
                     "group, residual)", name, item);
            return -1;
        }
        if (kvs_parse_i64(eq + 1, 0, 1 << 30, &v) != 0) {
            kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: %s must be a whole number, not '%s'", name,
                     item, eq + 1);
            return -1;
        }
        *field = (int)v;
        p += len;
        if (*p == ',')
            p++;
    }
    if (!bits_ok(c.k_bits) || !bits_ok(c.v_bits)) {
        kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: kbits and vbits must be 1, 2, 4 or 8", name);
        return -1;
    }
    if (c.group < 1 || c.group > KVS_KIVI_MAX_GROUP) {
        kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: group %d is out of range [1, %d]", name,
                 c.group, KVS_KIVI_MAX_GROUP);
        return -1;
    }
    if (c.residual < c.group || c.residual > KVS_KIVI_MAX_RESIDUAL || c.residual % c.group) {
        kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: residual %d must be a multiple of group %d "
                 "in [%d, %d]", name, c.residual, c.group, c.group, KVS_KIVI_MAX_RESIDUAL);
        return -1;
    }
    *out = c;
    return 1;
}
