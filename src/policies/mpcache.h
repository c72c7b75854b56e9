/* MPCache as a policy (methods/mpcache.md): its configuration from a parsed --kv spec, and what
 * a test may read of the last decode step. */
#ifndef KVS_MPCACHE_H
#define KVS_MPCACHE_H

#include "kv/policy.h"
#include "policies/mpcache_math.h"

/* The configuration a spec of the mpcache type gives, checked against the model: keep, window,
 * rho1 in (0, 1]; s2 divides s1; sharing needs a layer that shares (n_layers > skip + 1).
 * KVS_ERR_ARG naming the parameter. */
kvs_status kvs_mp_cfg_from_spec(const kvs_policy_spec *spec, int n_layers, kvs_mp_cfg *out,
                                kvs_error *err);

/* What one (layer, KV head) did at its last select (decode): the fine clusters of the padded
 * layout it attends (ascending), its shape, the tail and the prompt slots kept. Valid until
 * the next decode step. NULL before the first. */
typedef struct kvs_mp_last {
    const int *fine;
    int n_fine;       /* -1: it attended every slot */
    kvs_mp_shape shape;
    int n_kept;       /* statically kept prompt slots (store slots [0, n_kept)) */
    int sealed;       /* decode tokens sealed into clusters (slots [n_kept, n_kept + sealed)) */
    int tail;         /* slots after them, always attended (the newest included) */
    int selector;     /* the layer selected for itself (else it reused its partner's clusters) */
    kvs_mp_ops ops;   /* §3.5 counts of this step */
} kvs_mp_last;

const kvs_mp_last *kvs_mp_last_of(const kvs_policy *p, int layer, int kv_head);
/* The dynamic ratio and the configuration in use for the current prompt (0 / NULL before). */
double kvs_mp_eta_of(const kvs_policy *p);
const kvs_mp_cfg *kvs_mp_cfg_of(const kvs_policy *p);

#endif
