/* Every KV policy kvslim ships; the registry lists them in this order. A scorer policy
 * (scorer.h) is listed by its type. */
#ifndef KVS_POLICIES_H
#define KVS_POLICIES_H

#include "kv/policy.h"
#include "policies/scorer.h"

extern const kvs_policy_type kvs_policy_full;
extern const kvs_policy_type kvs_policy_streaming;
extern const kvs_policy_type kvs_policy_h2o;
extern const kvs_policy_type kvs_policy_tova;
extern const kvs_scorer kvs_policy_snapkv;
extern const kvs_scorer kvs_policy_knorm;
extern const kvs_scorer kvs_policy_random;
extern const kvs_policy_type kvs_policy_quest;
extern const kvs_policy_type kvs_policy_nacl;
extern const kvs_policy_type kvs_policy_hashevict;
extern const kvs_policy_type kvs_policy_l2evict;
extern const kvs_policy_type kvs_policy_minicache;
extern const kvs_policy_type kvs_policy_pqcache;
extern const kvs_policy_type kvs_policy_mpcache;

#define KVS_POLICY_REGISTRY                                                                  \
    &kvs_policy_full, &kvs_policy_streaming, &kvs_policy_h2o, &kvs_policy_tova,              \
        &kvs_policy_snapkv.type, &kvs_policy_knorm.type, &kvs_policy_random.type,            \
        &kvs_policy_quest, &kvs_policy_nacl, &kvs_policy_hashevict, &kvs_policy_l2evict,     \
        &kvs_policy_minicache, &kvs_policy_pqcache, &kvs_policy_mpcache

#endif
