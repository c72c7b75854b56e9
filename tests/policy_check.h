/* Helpers shared by the policy tests. */
#ifndef KVS_POLICY_CHECK_H
#define KVS_POLICY_CHECK_H

#include <stdio.h>
#include <string.h>

#include "kvslim.h"

/* 1 if the policy spec is rejected with a message containing needle. */
static inline int error_mentions(const char *spec, const char *needle)
{
    kvs_error err = {0};
    kvs_status st = kvs_kv_policy_check(spec, &err);
    if (st == KVS_OK || !strstr(err.msg, needle)) {
        fprintf(stderr, "spec '%s': status %d, message '%s' (want '%s')\n", spec, st, err.msg,
                needle);
        return 0;
    }
    return 1;
}

#endif
