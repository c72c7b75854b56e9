/* full: the reference, keeps every token. */
#include "policies/policies.h"

const kvs_policy_type kvs_policy_full = {
    .name = "full",
    .summary = "keep every token (the reference)",
    .kind = KVS_KIND_FULL,
};
