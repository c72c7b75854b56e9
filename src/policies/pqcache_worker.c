/* PQCache's clustering worker (pqcache.md §2.2, §2.3): one thread per cache that builds a
 * layer's PQ index as soon as the layer's prompt keys are final, overlapping the prefill of
 * later layers; the first decode step waits for it layer by layer. */
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/random.h"
#include "policies/pqcache_internal.h"

kvs_status pq_tier_read_locked(pq_state *s, int l, int h, int first, int n, void *dst,
                               kvs_error *err)
{
    pthread_mutex_lock(&s->lock);
    kvs_status st = kvs_tier_read(s->tier, l * s->nkv + h, (size_t)first * s->rec, dst,
                                  (size_t)n * s->rec, err);
    pthread_mutex_unlock(&s->lock);
    return st;
}

kvs_status pq_tier_write_locked(pq_state *s, int l, int h, int first, int n, const void *src,
                                kvs_error *err)
{
    pthread_mutex_lock(&s->lock);
    kvs_status st = kvs_tier_write(s->tier, l * s->nkv + h, (size_t)first * s->rec, src,
                                   (size_t)n * s->rec, err);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The iteration cap of layer l's job over n points per head (§2.3 eq. 3 with alpha1 = 0): as
 * many Lloyd iterations as fit in one layer's prefill time at the per-point cost measured on
 * earlier jobs, clipped to [3, 10] (§6 item 8). The layer time is the previous layer's, whose
 * measurement is complete when layer l is queued (the layer's own is still being summed); 3
 * for layer 0 and before any job has been timed. */
static int job_iters(const pq_state *s, int l, int n)
{
    if (s->iters > 0)
        return s->iters;
    if (l == 0 || s->sec_per_point_iter <= 0 || s->layers[l - 1].t_compute <= 0)
        return 3;
    const double t_iter = s->sec_per_point_iter * n * s->nkv * s->m;
    return kvs_pq_adaptive_iters(s->layers[l - 1].t_compute, 3 * t_iter, t_iter, 3, 10);
}

/* Keys of (layer l, KV head h) as F32 rows: the middle records, read from the slow tier a
 * piece at a time through buf (PIECE records), then the local window's copy. */
#define PIECE 1024

static kvs_status job_keys(pq_state *s, int l, int h, float *x, char *buf, kvs_error *err)
{
    const pq_layer *L = &s->layers[l];
    const int hd = s->hd;
    for (int first = 0; first < L->n_mid; first += PIECE) {
        const int n = L->n_mid - first < PIECE ? L->n_mid - first : PIECE;
        kvs_status st = pq_tier_read_locked(s, l, h, first, n, buf, err);
        if (st != KVS_OK)
            return st;
        for (int i = 0; i < n; i++) {
            const char *key = buf + (size_t)i * s->rec;
            float *row = x + (size_t)(first + i) * hd;
            if (s->esz == 2)
                kvs_dequantize_row(KVS_F16, key, row, hd);
            else
                memcpy(row, key, sizeof(float) * hd);
        }
    }
    memcpy(x + (size_t)L->n_mid * hd, L->local_keys + (size_t)h * L->local_rows * hd,
           sizeof(float) * hd * (size_t)L->local_rows);
    return KVS_OK;
}

/* Builds layer l's index: per KV head, m independent K-Means runs over its prompt keys (all
 * but the initial tokens, §6 item 3), seeded by (seed, layer, head) so that the result does
 * not depend on threads or timing (§7 test 7). Too few points: no index (§6 item 7). */
static kvs_status run_job(pq_state *s, int l, kvs_error *err)
{
    pq_layer *L = &s->layers[l];
    const int n = L->n_mid + L->local_rows, hd = s->hd;
    if (n <= (1 << s->bits)) /* too few points: no index (indexed stays 0) */
        return KVS_OK;
    const double t0 = pq_now();
    pthread_mutex_lock(&s->lock); /* (the main thread may be running another layer's job) */
    L->iters = job_iters(s, l, n);
    pthread_mutex_unlock(&s->lock);
    float *x = malloc(sizeof(float) * (size_t)n * hd);
    char *buf = malloc(s->rec * PIECE);
    kvs_status st = KVS_OK;
    if (!x || !buf)
        st = kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the keys of layer %d "
                      "(%d tokens) to cluster", l, n);
    long iters_run = 0;
    const size_t cent = (size_t)s->m * ((size_t)1 << s->bits) * (hd / s->m);
    for (int h = 0; h < s->nkv && st == KVS_OK; h++) {
        if ((st = job_keys(s, l, h, x, buf, err)) != KVS_OK)
            break;
        const uint64_t words[2] = {(uint64_t)l, (uint64_t)h};
        kvs_pq_cfg c = {.dim = hd, .m = s->m, .bits = s->bits, .max_iters = L->iters,
                        .tol = 1e-4, .seed = kvs_random_key(s->seed, words, 2)};
        kvs_pq_stats ps;
        st = kvs_pq_train(&c, x, n, (size_t)hd, L->centroids + (size_t)h * cent,
                          L->codes + (size_t)h * L->codes_cap * s->m, &ps, err);
        iters_run += ps.iters;
    }
    free(x);
    free(buf);
    if (st != KVS_OK)
        return st;
    /* Under the lock: the main thread reads these while it may still be prefilling (its
     * byte count, the report); during decoding it reads them once it has waited. */
    pthread_mutex_lock(&s->lock);
    L->indexed = 1;
    L->n_codes = n;
    L->t_kmeans = pq_now() - t0;
    if (iters_run > 0) /* per point, iteration and sub-space job: the next layer's estimate */
        s->sec_per_point_iter = L->t_kmeans / ((double)n * (double)iters_run);
    pthread_mutex_unlock(&s->lock);
    return KVS_OK;
}

/* Copies layer l's new cache blocks in from the slow tier (every KV head of each). The main
 * thread touches neither these slots nor the layer's cache until pq_worker_wait_fill. */
static kvs_status run_fill(pq_state *s, int l, kvs_error *err)
{
    pq_layer *L = &s->layers[l];
    for (int i = 0; i < L->n_fill; i++)
        for (int h = 0; h < s->nkv; h++) {
            kvs_status st = pq_tier_read_locked(s, l, h, L->fill_block[i] * PQ_BLOCK, PQ_BLOCK,
                                                L->arena[L->fill_slot[i]] +
                                                    (size_t)h * PQ_BLOCK * s->rec,
                                                err);
            if (st != KVS_OK)
                return st;
        }
    return KVS_OK;
}

/* Takes the next queued job and runs it (the lock held on entry and on return, released
 * while the job runs): the worker's loop, and the main thread's while it waits. */
static void run_next_locked(pq_state *s)
{
    const int job = s->queue[s->q_head], failed = s->failed;
    s->q_head = (s->q_head + 1) % (2 * s->L);
    const int l = job % s->L, fill = job >= s->L;
    pthread_mutex_unlock(&s->lock);
    kvs_error err = {0};
    kvs_status st = failed ? KVS_ERR_IO : fill ? run_fill(s, l, &err) : run_job(s, l, &err);
    pthread_mutex_lock(&s->lock);
    if (st != KVS_OK && !s->failed) {
        s->failed = 1;
        snprintf(s->worker_err, sizeof s->worker_err, "%s", err.msg);
    }
    if (fill) {
        s->layers[l].fill_pending = 0;
    } else {
        s->kmeans_seconds += s->layers[l].t_kmeans;
        s->layers[l].ready = 1;
    }
    pthread_cond_broadcast(&s->cond);
}

static void *worker_main(void *arg)
{
    pq_state *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stop && s->q_head == s->q_tail)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->stop)
            break;
        run_next_locked(s);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

kvs_status pq_worker_start(pq_state *s, kvs_error *err)
{
    if (!(s->queue = malloc(sizeof(int) * 2 * (size_t)s->L)))
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: out of memory for the worker's queue");
    s->q_head = s->q_tail = 0;
    s->stop = s->failed = 0;
    if (pthread_create(&s->thread, NULL, worker_main, s) != 0)
        return kvs_fail(err, KVS_ERR_NOMEM, "pqcache: cannot start the clustering thread");
    s->thread_started = 1;
    return KVS_OK;
}

void pq_worker_stop(pq_state *s)
{
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        s->thread_started = 0;
    }
    free(s->queue);
    s->queue = NULL;
}

kvs_status pq_worker_queue(pq_state *s, int l, kvs_error *err)
{
    (void)err;
    pthread_mutex_lock(&s->lock);
    s->layers[l].queued = 1;
    s->layers[l].ready = 0;
    s->queue[s->q_tail] = l;
    s->q_tail = (s->q_tail + 1) % (2 * s->L);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return KVS_OK;
}

kvs_status pq_worker_wait(pq_state *s, int l, kvs_error *err)
{
    pq_layer *L = &s->layers[l];
    const double t0 = pq_now();
    pthread_mutex_lock(&s->lock);
    /* Not idle while waiting: the main thread takes queued jobs too (later layers' clustering),
     * so that two cores shorten the first decode step's wait. */
    while (!L->ready && !s->failed)
        if (s->q_head != s->q_tail)
            run_next_locked(s);
        else
            pthread_cond_wait(&s->cond, &s->lock);
    const int failed = s->failed;
    pthread_mutex_unlock(&s->lock);
    s->wait_seconds += pq_now() - t0;
    if (failed)
        return kvs_fail(err, KVS_ERR_IO, "pqcache: building the index failed: %s",
                        s->worker_err);
    return KVS_OK;
}

void pq_worker_queue_fill(pq_state *s, int l)
{
    pthread_mutex_lock(&s->lock);
    s->layers[l].fill_pending = 1;
    s->queue[s->q_tail] = s->L + l;
    s->q_tail = (s->q_tail + 1) % (2 * s->L);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

kvs_status pq_worker_wait_fill(pq_state *s, int l, kvs_error *err)
{
    pq_layer *L = &s->layers[l];
    pthread_mutex_lock(&s->lock);
    while (L->fill_pending && !s->failed)
        pthread_cond_wait(&s->cond, &s->lock);
    const int failed = s->failed;
    pthread_mutex_unlock(&s->lock);
    if (failed)
        return kvs_fail(err, KVS_ERR_IO, "pqcache: the slow-tier worker failed: %s",
                        s->worker_err);
    return KVS_OK;
}
