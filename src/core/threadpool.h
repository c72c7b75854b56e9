/* A fixed pool of worker threads that run one data-parallel task at a time. */
#ifndef KVS_THREADPOOL_H
#define KVS_THREADPOOL_H

#include <stddef.h>

typedef struct kvs_pool kvs_pool;

/* fn is called once per thread with ith in [0, nth); the caller's thread is ith == 0. */
typedef void (*kvs_task_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 counts the calling thread. Returns NULL on failure. */
kvs_pool *kvs_pool_create(int n_threads);
void kvs_pool_destroy(kvs_pool *pool);
int kvs_pool_size(const kvs_pool *pool);
/* Runs fn on every thread and returns when all have finished. Not reentrant: fn must not call
 * kvs_pool_run on the same pool. */
void kvs_pool_run(kvs_pool *pool, kvs_task_fn fn, void *ctx);
/* Scratch memory owned by the pool, at least bytes long and 64-byte aligned; valid until the next
 * call with a larger size or kvs_pool_destroy. Returns NULL on allocation failure. Used by kernels
 * for quantised activations; callers outside core must not hold it across kernel calls. */
void *kvs_pool_scratch(kvs_pool *pool, size_t bytes);

#endif
