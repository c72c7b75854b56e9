/* Memory for the KV store's head blocks: large blocks on transparent huge pages. */
#ifndef KVS_KV_BLOCK_H
#define KVS_KV_BLOCK_H

#include <stddef.h>

/* A block of `bytes` (a multiple of 64), 64-byte aligned; NULL without memory. Blocks of at
 * least KVS_KV_HUGE_BYTES are mapped on a 2 MiB boundary and advised for huge pages, the rest
 * come from aligned_alloc. *mapped is what kvs_kv_block_free needs back (0 for aligned_alloc). */
void *kvs_kv_block_alloc(size_t bytes, size_t *mapped);
void kvs_kv_block_free(void *block, size_t mapped);

#define KVS_KV_HUGE_BYTES ((size_t)2 << 20)

#endif
