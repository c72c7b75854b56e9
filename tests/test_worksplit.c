/* The matrix products' work split (core/worksplit.h): every unit claimed exactly once, owners
 * from the front of their share, helpers from the back, and one claim for one thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "check.h"
#include "core/worksplit.h"

enum { MAX_UNITS = 5000 };

/* Claims interleaved one thread after the other: each unit once, and the claims of each thread
 * contiguous runs of at most grain units. */
static void interleaved(int units, int nth, int grain)
{
    kvs_split s;
    kvs_split_init(&s, units, nth, grain);
    static int owner[MAX_UNITS];
    memset(owner, -1, sizeof owner);
    int bad = 0, live = nth, claims = 0;
    int done[64] = {0};
    while (live > 0) {
        for (int t = 0; t < nth; t++) {
            int u0, u1;
            if (done[t])
                continue;
            if (!kvs_split_next(&s, t, &u0, &u1)) {
                done[t] = 1;
                live--;
                continue;
            }
            claims++;
            bad += u0 < 0 || u1 > units || u1 <= u0 || u1 - u0 > (grain > 0 ? grain : 1);
            for (int u = u0; u < u1 && u < units && u >= 0; u++) {
                bad += owner[u] != -1;
                owner[u] = t;
            }
        }
    }
    for (int u = 0; u < units; u++)
        bad += owner[u] == -1;
    CHECKF(bad == 0, "%d units, %d threads, grain %d: %d units claimed twice, never or out of "
           "range (%d claims)", units, nth, grain, bad, claims);
}

typedef struct {
    kvs_split *s;
    int ith;
    _Atomic int *count;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    int u0, u1;
    while (kvs_split_next(a->s, a->ith, &u0, &u1))
        for (int u = u0; u < u1; u++)
            atomic_fetch_add(&a->count[u], 1);
    return NULL;
}

/* Real threads racing for the same shares: each unit once. */
static void racing(int units, int nth)
{
    static _Atomic int count[MAX_UNITS];
    for (int u = 0; u < units; u++)
        atomic_init(&count[u], 0);
    kvs_split s;
    kvs_split_init(&s, units, nth, 1);
    pthread_t th[8];
    worker_arg args[8];
    for (int t = 0; t < nth; t++) {
        args[t] = (worker_arg){&s, t, count};
        CHECK(pthread_create(&th[t], NULL, worker, &args[t]) == 0);
    }
    for (int t = 0; t < nth; t++)
        pthread_join(th[t], NULL);
    int bad = 0;
    for (int u = 0; u < units; u++)
        bad += atomic_load(&count[u]) != 1;
    CHECKF(bad == 0, "%d units, %d racing threads: %d units not claimed exactly once", units, nth,
           bad);
}

int main(void)
{
    /* One thread: the grain is every unit, whatever the bytes, so one claim takes them all. */
    CHECK(kvs_split_grain(1000, 1, 64) == 1000 && kvs_split_grain(1000, 1, 0) == 1000);
    kvs_split one;
    kvs_split_init(&one, 1000, 1, kvs_split_grain(1000, 1, 64));
    int u0 = -1, u1 = -1;
    CHECK(kvs_split_next(&one, 0, &u0, &u1) && u0 == 0 && u1 == 1000);
    CHECK(!kvs_split_next(&one, 0, &u0, &u1));
    /* Streaming grains: about 32 KiB of weights; tiles: a quarter of a thread's share. */
    CHECK(kvs_split_grain(1000, 2, 1024) == 32 && kvs_split_grain(1000, 2, 0) == 125);
    CHECK(kvs_split_grain(10, 2, 1 << 20) == 1 && kvs_split_grain(10, 2, 16) == 10);
    /* The owner claims from the front of its share, a helper from the back of another's. */
    kvs_split two;
    kvs_split_init(&two, 100, 2, 10);
    CHECK(kvs_split_next(&two, 1, &u0, &u1) && u0 == 50 && u1 == 60);
    for (int i = 0; i < 4; i++)
        CHECK(kvs_split_next(&two, 1, &u0, &u1));
    CHECK(u0 == 90 && u1 == 100);
    CHECK(kvs_split_next(&two, 1, &u0, &u1) && u0 == 40 && u1 == 50); /* from 0's back */
    CHECK(kvs_split_next(&two, 0, &u0, &u1) && u0 == 0 && u1 == 10);

    const int units[] = {0, 1, 7, 100, 4099};
    const int threads[] = {1, 2, 3, 16, 20};
    const int grains[] = {1, 3, 64, 5000};
    for (size_t a = 0; a < sizeof units / sizeof *units; a++)
        for (size_t b = 0; b < sizeof threads / sizeof *threads; b++)
            for (size_t c = 0; c < sizeof grains / sizeof *grains; c++)
                interleaved(units[a], threads[b], grains[c]);
    racing(4099, 2);
    racing(4099, 8);
    return check_summary("test_worksplit");
}
