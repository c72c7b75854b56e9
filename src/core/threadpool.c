/* Persistent worker pool with low-latency dispatch.
 *
 * Dispatch protocol (all counters are 32-bit so they can be futex words):
 *   - kvs_pool_run publishes fn/ctx, sets `pending` to the number of workers and bumps `gen`
 *     (release). Workers spin on `gen` for a short while (KVS_POOL_SPIN_NS), then sleep on it
 *     with FUTEX_WAIT. The caller only issues FUTEX_WAKE when some worker announced (through
 *     `sleepers`) that it is going to sleep; the seq_cst store/load pairs on gen/sleepers make
 *     the "announce, re-check" handshake race free, and FUTEX_WAIT re-checks the word itself.
 *   - Each worker runs fn, then decrements `pending`. The caller runs ith 0 itself, then spins
 *     on `pending` and, after the same spin budget, sleeps on it; the worker that brings it to
 *     zero wakes the caller if it announced sleeping (`main_sleeping`).
 * The spin keeps the decode path (many small runs per token) off the futex syscalls, while idle
 * workers go to sleep after ~50 us so they do not steal the CPU from the main thread or from
 * OpenBLAS threads. On non-Linux systems a mutex/condvar pair replaces the futex calls. */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#define KVS_HAVE_FUTEX 1
#else
#define KVS_HAVE_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KVS_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define KVS_CPU_RELAX() ((void)0)
#endif

/* How long a waiting thread spins before sleeping. Decode issues a run every few tens of
 * microseconds, so this keeps the workers hot within a token while idle pools go quiet. */
#define KVS_POOL_SPIN_NS 50000LL
#define KVS_POOL_YIELD_NS 5000LL

struct kvs_worker {
    struct kvs_pool *pool;
    int ith;
    pthread_t thread;
};

struct kvs_pool {
    int n_threads;
    struct kvs_worker *workers; /* n_threads - 1 entries */
    int n_started;
    int oversubscribed; /* more threads than online CPUs: yield instead of pause while spinning */

    /* Written by the caller before publishing `gen`; read by workers after observing it. */
    kvs_task_fn fn;
    void *ctx;
    int stop;

    _Alignas(64) atomic_uint gen;
    atomic_int sleepers;
    _Alignas(64) atomic_uint pending;
    atomic_int main_sleeping;

#if !KVS_HAVE_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
#endif

    _Alignas(64) void *scratch;
    size_t scratch_size;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spins while (*word == val) == while_equal, at most about KVS_POOL_SPIN_NS. Returns the last
 * value seen. After the first KVS_POOL_YIELD_NS the spin also yields now and then, so that a
 * thread of ours that was preempted (busy machine, more threads than CPUs) gets the CPU back
 * quickly instead of after a full scheduler time slice. Spinning without yielding was tried
 * (issue 17): decode alone was no faster side by side (446 vs 456 tok/s, Q8_0, 2 threads), and
 * three test programs sharing 2 CPUs took 15.3 s instead of 12.6. */
static unsigned spin_on(const struct kvs_pool *pool, atomic_uint *word, unsigned val,
                        int while_equal)
{
    int64_t start = 0;
    for (unsigned i = 0;; i++) {
        unsigned cur = atomic_load_explicit(word, memory_order_acquire);
        if ((cur == val) != while_equal)
            return cur;
        if (pool->oversubscribed)
            sched_yield(); /* let the thread we are waiting for have the CPU */
        else
            KVS_CPU_RELAX();
        if ((i & 63) == 63) {
            int64_t t = now_ns();
            if (start == 0)
                start = t;
            else if (t - start > KVS_POOL_SPIN_NS)
                return cur;
            else if (t - start > KVS_POOL_YIELD_NS && !pool->oversubscribed)
                sched_yield();
        }
    }
}

#if KVS_HAVE_FUTEX
static void futex_wait(atomic_uint *word, unsigned val)
{
    /* Spurious wakeups and EAGAIN/EINTR are fine: callers loop on the condition. */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *word, int n)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#endif

/* Blocks until pool->gen != seen. */
static unsigned wait_for_work(struct kvs_pool *pool, unsigned seen)
{
    unsigned cur = spin_on(pool, &pool->gen, seen, 1);
    while (cur == seen) {
#if KVS_HAVE_FUTEX
        atomic_fetch_add(&pool->sleepers, 1);
        if (atomic_load(&pool->gen) == seen)
            futex_wait(&pool->gen, seen);
        atomic_fetch_sub(&pool->sleepers, 1);
#else
        pthread_mutex_lock(&pool->mu);
        atomic_fetch_add(&pool->sleepers, 1);
        while (atomic_load(&pool->gen) == seen)
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        atomic_fetch_sub(&pool->sleepers, 1);
        pthread_mutex_unlock(&pool->mu);
#endif
        cur = atomic_load_explicit(&pool->gen, memory_order_acquire);
    }
    return cur;
}

static void signal_done(struct kvs_pool *pool)
{
    if (atomic_fetch_sub(&pool->pending, 1) == 1 && /* seq_cst: pairs with main_sleeping */
        atomic_load(&pool->main_sleeping)) {
#if KVS_HAVE_FUTEX
        futex_wake(&pool->pending, 1);
#else
        pthread_mutex_lock(&pool->mu);
        pthread_cond_signal(&pool->cv_done);
        pthread_mutex_unlock(&pool->mu);
#endif
    }
}

static void *worker_main(void *arg)
{
    struct kvs_worker *w = arg;
    struct kvs_pool *pool = w->pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_for_work(pool, seen);
        if (pool->stop)
            break;
        pool->fn(pool->ctx, w->ith, pool->n_threads);
        signal_done(pool);
    }
    return NULL;
}

static void wait_done(struct kvs_pool *pool)
{
    if (spin_on(pool, &pool->pending, 0u, 0) == 0)
        return;
    for (;;) {
#if KVS_HAVE_FUTEX
        atomic_store(&pool->main_sleeping, 1);
        unsigned p = atomic_load(&pool->pending);
        if (p != 0)
            futex_wait(&pool->pending, p);
        atomic_store(&pool->main_sleeping, 0);
#else
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->main_sleeping, 1);
        while (atomic_load(&pool->pending) != 0)
            pthread_cond_wait(&pool->cv_done, &pool->mu);
        atomic_store(&pool->main_sleeping, 0);
        pthread_mutex_unlock(&pool->mu);
#endif
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0)
            return;
    }
}

static void publish(struct kvs_pool *pool)
{
    atomic_fetch_add(&pool->gen, 1); /* seq_cst: ordered before the sleepers load below */
    if (atomic_load(&pool->sleepers) > 0) {
#if KVS_HAVE_FUTEX
        futex_wake(&pool->gen, INT32_MAX);
#else
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv_work);
        pthread_mutex_unlock(&pool->mu);
#endif
    }
}

kvs_pool *kvs_pool_create(int n_threads)
{
    if (n_threads < 1)
        return NULL;
    struct kvs_pool *pool = aligned_alloc(64, (sizeof *pool + 63) / 64 * 64);
    if (!pool)
        return NULL;
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    pool->oversubscribed = n_cpu > 0 && n_threads > n_cpu;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->main_sleeping, 0);
#if !KVS_HAVE_FUTEX
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_work, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
#endif
    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) {
            kvs_pool_destroy(pool);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            struct kvs_worker *w = &pool->workers[i - 1];
            w->pool = pool;
            w->ith = i;
            if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
                kvs_pool_destroy(pool);
                return NULL;
            }
            pool->n_started++;
        }
    }
    return pool;
}

void kvs_pool_destroy(kvs_pool *pool)
{
    if (!pool)
        return;
    if (pool->n_started > 0) {
        pool->stop = 1;
        publish(pool);
        for (int i = 0; i < pool->n_started; i++)
            pthread_join(pool->workers[i].thread, NULL);
    }
#if !KVS_HAVE_FUTEX
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv_work);
    pthread_cond_destroy(&pool->cv_done);
#endif
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

int kvs_pool_size(const kvs_pool *pool) { return pool ? pool->n_threads : 1; }

void kvs_pool_run(kvs_pool *pool, kvs_task_fn fn, void *ctx)
{
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, (unsigned)(pool->n_threads - 1), memory_order_relaxed);
    publish(pool);
    fn(ctx, 0, pool->n_threads);
    wait_done(pool);
}

void *kvs_pool_scratch(kvs_pool *pool, size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    if (pool->scratch_size >= bytes)
        return pool->scratch;
    size_t size = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, size);
    if (!p)
        return NULL;
    free(pool->scratch);
    pool->scratch = p;
    pool->scratch_size = size;
    return p;
}
