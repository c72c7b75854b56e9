/* Every KV policy kvslim ships; the registry lists them in this order. */
#ifndef KVS_POLICIES_H
#define KVS_POLICIES_H

#include "kv/policy.h"

extern const kvs_policy_type kvs_policy_full;
extern const kvs_policy_type kvs_policy_streaming;

#define KVS_POLICY_REGISTRY &kvs_policy_full, &kvs_policy_streaming

#endif
