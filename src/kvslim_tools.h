/* kvslim's internal tools API: what the command-line tools (tools/), the benchmarks and the
 * tests need beyond the public API (include/kvslim.h). Not installed, not stable.
 *
 * The tools include only kvslim.h, this header and their own; tests/layers.sh checks it.
 * Everything here is declared in the library layer that owns it:
 *   core/number.h        the one decimal number parser and limit formatting
 *   core/error.h         kvs_fail: a status with a formatted message
 *   core/dtype.h         tensor types by name (convert --type, bench --synthetic type=)
 *   core/outfile.h       output destinations (atomic replace, write-through, inputs refused)
 *   model/llama_write.h  llama2.c conversion and synthetic models (convert, bench)
 *   engine/session_internal.h  a session's kv layer: timings of the KV layer and the policy's
 *                        own report lines (bench)
 *   kv/kv.h              those timings (kvs_kv_decode_seconds, kvs_kv_prefill_hook_seconds)
 *   policies/registry.h  the policy registry and the --kv parser (eval lists policies)
 *   eval/eval.h          the fidelity harness (eval)
 *   eval/layer_similarity.h  adjacent-layer K/V similarity (layersim)
 *   eval/plan.h          eval's runs: specs x budgets, labels, equal-memory runs
 *   eval/recall.h        eval --task recall: answer files, one prompt's run
 *   eval/opcount.h       eval --task opcount: the MPC op-count model
 *   mpc/session.h        mpc: one role of a two-party session over TCP, its cost model
 *   mpc/mpcache.h        mpc: the --kv configurations the protocol runs (kvs_mpc_kv_parse)
 *   mpc/net.h, mpc/ops.h mpc: listening sockets, keys, op names
 *   mpc/fxp.h            mpc: fixed-point decoding
 *   server/server.h      serve: the OpenAI-compatible HTTP server (kvs_server_main) */
#ifndef KVSLIM_TOOLS_H
#define KVSLIM_TOOLS_H

#include "kvslim.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/number.h"
#include "core/outfile.h"
#include "engine/session_internal.h"
#include "eval/eval.h"
#include "eval/layer_similarity.h"
#include "eval/opcount.h"
#include "eval/plan.h"
#include "eval/recall.h"
#include "kv/kv.h"
#include "kv/policy.h"
#include "policies/registry.h"
#include "model/llama_write.h"
#include "mpc/fxp.h"
#include "mpc/net.h"
#include "mpc/ops.h"
#include "mpc/mpcache.h"
#include "mpc/session.h"
#include "server/server.h"

#endif
