/* Thread pool: every ith runs exactly once per run, runs are ordered, scratch grows aligned. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/threadpool.h"

#define MAX_T 8

struct count_ctx {
    atomic_int hits[MAX_T];
    atomic_int bad_nth;
    int expect_nth;
    int round;             /* written by the caller between runs */
    int seen_round[MAX_T]; /* each thread records the round it saw */
};

static void count_task(void *p, int ith, int nth)
{
    struct count_ctx *c = p;
    if (nth != c->expect_nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&c->bad_nth, 1);
    else {
        atomic_fetch_add(&c->hits[ith], 1);
        c->seen_round[ith] = c->round;
    }
}

/* Each thread fills its slice of an array; checks the results are visible to the caller. */
struct fill_ctx {
    int *data;
    int n;
    int value;
};

static void fill_task(void *p, int ith, int nth)
{
    struct fill_ctx *c = p;
    int lo = (int)((int64_t)c->n * ith / nth), hi = (int)((int64_t)c->n * (ith + 1) / nth);
    for (int i = lo; i < hi; i++)
        c->data[i] = c->value + i;
}

static void slow_task(void *p, int ith, int nth)
{
    (void)nth;
    atomic_int *sum = p;
    if (ith != 0) {
        struct timespec ts = {0, 2000000}; /* 2 ms: longer than the spin, so the caller sleeps */
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(sum, ith + 1);
}

int main(void)
{
    CHECK(kvs_pool_create(0) == NULL);
    CHECK(kvs_pool_size(NULL) == 1);

    for (int n = 1; n <= 4; n++) {
        kvs_pool *pool = kvs_pool_create(n);
        CHECK(pool != NULL);
        if (!pool)
            continue;
        CHECK(kvs_pool_size(pool) == n);

        static struct count_ctx c;
        memset(&c, 0, sizeof c);
        c.expect_nth = n;
        const int runs = 20000;
        int order_ok = 1;
        for (int r = 0; r < runs; r++) {
            c.round = r;
            kvs_pool_run(pool, count_task, &c);
            for (int i = 0; i < n; i++)
                if (c.seen_round[i] != r)
                    order_ok = 0;
        }
        CHECK(order_ok);
        CHECK(atomic_load(&c.bad_nth) == 0);
        for (int i = 0; i < n; i++)
            CHECKF(atomic_load(&c.hits[i]) == runs, "n=%d ith=%d hits=%d", n, i,
                   atomic_load(&c.hits[i]));

        /* Runs after the workers have gone to sleep (idle longer than the spin). */
        for (int r = 0; r < 5; r++) {
            usleep(3000);
            int before = atomic_load(&c.hits[n - 1]);
            kvs_pool_run(pool, count_task, &c);
            CHECK(atomic_load(&c.hits[n - 1]) == before + 1);
        }

        /* Caller sleeping on a slow worker. */
        for (int r = 0; r < 3; r++) {
            atomic_int sum = 0;
            kvs_pool_run(pool, slow_task, &sum);
            CHECK(atomic_load(&sum) == n * (n + 1) / 2);
        }

        /* Memory written by workers is visible after the run. */
        int data[1000];
        struct fill_ctx f = {data, 1000, 0};
        int fill_ok = 1;
        for (int r = 0; r < 200; r++) {
            f.value = r * 7;
            kvs_pool_run(pool, fill_task, &f);
            for (int i = 0; i < 1000; i++)
                if (data[i] != r * 7 + i)
                    fill_ok = 0;
        }
        CHECK(fill_ok);

        /* Scratch: aligned, grows, keeps the buffer when big enough. */
        char *s1 = kvs_pool_scratch(pool, 100);
        CHECK(s1 != NULL && ((uintptr_t)s1 & 63) == 0);
        if (s1)
            memset(s1, 1, 100);
        char *s2 = kvs_pool_scratch(pool, 50);
        CHECK(s2 == s1);
        char *s3 = kvs_pool_scratch(pool, 1 << 20);
        CHECK(s3 != NULL && ((uintptr_t)s3 & 63) == 0);
        if (s3)
            memset(s3, 2, 1 << 20);
        CHECK(kvs_pool_scratch(pool, 0) != NULL);

        kvs_pool_destroy(pool);
    }

    /* Create/destroy churn, including destroy right after create. */
    for (int r = 0; r < 50; r++) {
        kvs_pool *pool = kvs_pool_create(1 + r % 4);
        CHECK(pool != NULL);
        if (r % 2) {
            static struct count_ctx c2;
            memset(&c2, 0, sizeof c2);
            c2.expect_nth = 1 + r % 4;
            kvs_pool_run(pool, count_task, &c2);
            CHECK(atomic_load(&c2.hits[0]) == 1);
        }
        kvs_pool_destroy(pool);
    }
    kvs_pool_destroy(NULL);
    return check_summary("test_threadpool");
}
