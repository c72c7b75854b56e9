/* Access to a session's parts for the eval harness and tests (not part of the public API). */
#ifndef KVS_SESSION_INTERNAL_H
#define KVS_SESSION_INTERNAL_H

#include "kv/kv.h"
#include "kvslim.h"

kvs_kv *kvs_session_kv(kvs_session *s);
/* Line i of the session's KV policy's own measurements (kvs_policy_type.report): 0 written,
 * -1 none. */
int kvs_session_policy_report(kvs_session *s, int i, char *buf, size_t size);

#endif
