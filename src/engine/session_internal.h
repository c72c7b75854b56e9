/* Access to a session's parts for the eval harness and tests (not part of the public API). */
#ifndef KVS_SESSION_INTERNAL_H
#define KVS_SESSION_INTERNAL_H

#include "kv/kv.h"
#include "kvslim.h"

kvs_kv *kvs_session_kv(kvs_session *s);

#endif
