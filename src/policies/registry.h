/* The registry of every KV policy kvslim ships, and the "--kv NAME[:key=value,...]" parser
 * that resolves a name through it. Above the kv layer: kv takes a parsed spec and knows no
 * policy by name. */
#ifndef KVS_REGISTRY_H
#define KVS_REGISTRY_H

#include <stdio.h>

#include "kv/policy.h"

const kvs_policy_type *const *kvs_policy_types(int *n);
const kvs_policy_type *kvs_policy_find(const char *name);
/* Parses "NAME[:key=value,...]"; errors list the accepted names, keys and ranges. */
kvs_status kvs_policy_parse(const char *text, kvs_policy_spec *out, kvs_error *err);
/* Lists every policy with its parameters and defaults. */
void kvs_policy_help(FILE *f);

#endif
