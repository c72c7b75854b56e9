/* PQCache's state (pqcache.md), shared by the policy (pqcache.c) and its clustering worker
 * (pqcache_worker.c). Per layer and KV head: the initial and local tokens in the store (the
 * fast tier), the middle tokens' K/V in the slow tier (pq_tier.h), their PQ codes and the
 * centroids here, and a block cache of hot middle blocks (pq_blocks.h). */
#ifndef KVS_PQCACHE_INTERNAL_H
#define KVS_PQCACHE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "core/debug.h"
#include "kv/attention.h"
#include "kv/policy.h"
#include "policies/pq.h"
#include "policies/pq_blocks.h"
#include "policies/pq_tier.h"

#define PQ_BLOCK 128 /* positions per block-cache block (pqcache.md §2.9) */

typedef enum { PQ_GQA_SOFTMAX, PQ_GQA_SUM, PQ_GQA_MAX } pq_gqa;

typedef struct pq_layer {
    int n_mid;        /* middle tokens in the slow tier (the same for every KV head) */
    int n_codes;      /* middle tokens with a code: [0, n_codes) */
    int codes_cap;    /* tokens the code arrays hold */
    uint8_t *codes;   /* per KV head h: codes_cap * m bytes at h * codes_cap * m */
    float *centroids; /* per KV head: m * 2^bits * d_m floats */
    int indexed;      /* the worker built the index; 0: too few points, every middle token is
                       * attended (pqcache.md §6 item 7) */
    int queued;       /* a clustering job was queued for this prompt */
    int ready;        /* the job is done (under pq_state.lock) */
    double t_kmeans;  /* seconds the job took */
    double t_compute; /* seconds of this layer's prefill (adaptive iterations) */
    int iters;        /* the iteration cap the job ran with */
    float *local_keys; /* the job's input: keys of the prompt's local window (F32), n_local
                        * rows per KV head, read by the worker */
    int local_rows;
    kvs_blocks *blocks;     /* block cache bookkeeping */
    char **arena;           /* per cache slot: PQ_BLOCK records of every KV head, or NULL */
    int *fill_block, *fill_slot; /* the blocks a step's cache update copies in (kcache each) */
    int n_fill;
    int fill_pending;       /* the worker is copying them (under pq_state.lock) */
    /* the last decode step, for attended_positions and the statistics */
    int att_mid;            /* middle tokens when the last step selected */
    double hits, misses, fetched_bytes, fill_bytes, code_bytes, steps;
    double t_select, t_gather, t_attend, t_update; /* seconds in each phase of attend */
    double recall_sum, recall_steps; /* recall of the exact top-k (measure=on) */
} pq_layer;

/* One pool thread's scratch for the selection phase (scores, top-k, exact reads); the KV
 * heads of a step are scored in parallel, each by one lane. */
typedef struct pq_lane {
    float *scores, *acc, *exact_scores, *lut;
    uint32_t *topk;
    int *idx_exact;
    char *run;                       /* slow-tier reads of exact scores */
    size_t run_cap;
    double recall_sum, recall_steps; /* this step's, added to the layer's after it */
    kvs_status st;
    kvs_error err;
} pq_lane;

typedef struct pq_state {
    int L, nkv, hd, group;
    size_t esz;         /* bytes per element of the store's type (2 F16, 4 F32) */
    size_t rec;         /* bytes of one slow-tier record: key then value */
    int n_init;         /* initial tokens of this prompt (min(init, prompt)) */
    int n_local, k;     /* local window and top-k of this prompt (§2.6) */
    int m, bits, iters, cache_blocks, kcache, lru, measure, exact;
    pq_gqa gqa;
    uint64_t seed;
    kvs_tier *tier;     /* region l * nkv + h: the middle records of (layer l, KV head h) */
    pq_layer *layers;
    kvs_store *gather;  /* one layer: the rows one step (or one prompt batch) attends */
    kvs_attn_scratch *attn;
    /* decode scratch (main thread) */
    pq_lane *lanes;     /* one per pool thread */
    int n_lanes;
    int *idx;           /* per KV head: scratch_cap selected middle indices */
    int *block_count, *rank, *rank_scratch;
    int scratch_cap;    /* tokens the score arrays of every lane hold */
    char *run;          /* bounce buffer for slow-tier reads */
    size_t run_cap;
    /* prefill timing of the layers (adaptive iterations) */
    double t_layer_start;
    int last_layer;
    /* the clustering worker */
    pthread_t thread;
    int thread_started, stop, failed;
    pthread_mutex_t lock; /* the queue, ready flags, and every slow-tier access */
    pthread_cond_t cond;
    int *queue, q_head, q_tail; /* a ring of 2 L jobs: l clusters layer l, L + l fills its
                                 * cache blocks; each layer has at most one of each queued */
    double sec_per_point_iter; /* measured by finished jobs (adaptive iterations) */
    char worker_err[sizeof((kvs_error *)0)->msg];
    int att_layer;             /* the layer the gather store holds (attended_positions) */
    double wait_seconds;       /* main thread waiting for the index at the first decode step */
    double kmeans_seconds;
} pq_state;

/* Seconds on the monotonic clock (the phases' timing). */
static inline double pq_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* pqcache_worker.c */
kvs_status pq_worker_start(pq_state *s, kvs_error *err);
void pq_worker_stop(pq_state *s);
/* Queues layer l's clustering (its local-window keys copied in); returns at once. */
kvs_status pq_worker_queue(pq_state *s, int l, kvs_error *err);
/* Waits for layer l's index (the first decode step); fails if the worker failed. */
kvs_status pq_worker_wait(pq_state *s, int l, kvs_error *err);
/* Queues the copy of layer l's n_fill new cache blocks from the slow tier (the step's cache
 * update, off the critical path: pqcache.md §6 item 16). */
void pq_worker_queue_fill(pq_state *s, int l);
/* Waits until layer l's cache blocks are filled (before the layer's next lookup); fails if
 * the worker failed. */
kvs_status pq_worker_wait_fill(pq_state *s, int l, kvs_error *err);

/* Slow-tier access under the state's lock. */
kvs_status pq_tier_read_locked(pq_state *s, int l, int h, int first, int n, void *dst,
                               kvs_error *err);
kvs_status pq_tier_write_locked(pq_state *s, int l, int h, int first, int n, const void *src,
                                kvs_error *err);

#endif
