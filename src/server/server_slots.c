/* Sequences and the bounded queue (server_slots.h). A waiter is a node on its own thread's
 * stack; release hands the freed slot straight to the oldest, so nobody overtakes the queue. */
#include "server/server_slots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvs_srv_waiter {
    kvs_srv_waiter *next;
    int slot; /* -1 until release hands one over */
};

int kvs_srv_slots_init(kvs_srv_slots *s, int n, int max_waiting)
{
    memset(s, 0, sizeof *s);
    if (!(s->slot = calloc((size_t)n, sizeof *s->slot)))
        return -1;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->freed, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&s->mu, NULL);
    s->n = n;
    s->max_waiting = max_waiting;
    return 0;
}

void kvs_srv_slots_destroy(kvs_srv_slots *s)
{
    if (!s->slot)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->freed);
    free(s->slot);
    s->slot = NULL;
}

static void take(kvs_srv_slots *s, int i, const char *kv)
{
    s->slot[i].busy = 1;
    s->slot[i].kv_bytes = 0;
    snprintf(s->slot[i].kv, sizeof s->slot[i].kv, "%s", kv);
    s->busy++;
}

static void unlink_waiter(kvs_srv_slots *s, kvs_srv_waiter *w)
{
    kvs_srv_waiter **p = &s->head, *prev = NULL;
    while (*p && *p != w)
        prev = *p, p = &(*p)->next;
    if (!*p)
        return;
    *p = w->next;
    if (s->tail == w)
        s->tail = prev;
    s->waiting--;
}

kvs_srv_acquire kvs_srv_slots_acquire(kvs_srv_slots *s, const char *kv, int (*gone)(void *),
                                      void *ctx, int *slot)
{
    *slot = -1;
    pthread_mutex_lock(&s->mu);
    kvs_srv_acquire r = KVS_SRV_SLOT_OK;
    if (s->closed) {
        r = KVS_SRV_SLOT_CLOSED;
    } else if (s->busy < s->n && !s->head) {
        for (int i = 0; i < s->n; i++)
            if (!s->slot[i].busy) {
                take(s, i, kv);
                *slot = i;
                break;
            }
    } else if (s->waiting >= s->max_waiting) {
        r = KVS_SRV_SLOT_FULL;
    } else {
        kvs_srv_waiter w = {NULL, -1};
        /* The waiter lives on this thread's stack while it is in the queue: release unlinks it
         * (handing it a slot), or this function does below, both under s->mu, before it
         * returns; cppcheck sees only the address of a local stored through a parameter. */
        if (s->tail)
            s->tail->next = &w;
        else
            s->head = &w; /* cppcheck-suppress autoVariables */
        s->tail = &w;     /* cppcheck-suppress autoVariables */
        s->waiting++;
        while (w.slot < 0 && !s->closed) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += 100 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000L)
                until.tv_sec++, until.tv_nsec -= 1000000000L;
            int rc = pthread_cond_timedwait(&s->freed, &s->mu, &until);
            if (w.slot < 0 && rc == ETIMEDOUT && gone && gone(ctx)) {
                r = KVS_SRV_SLOT_GONE;
                break;
            }
        }
        if (w.slot >= 0) { /* release unlinked us and kept the slot busy for us */
            snprintf(s->slot[w.slot].kv, sizeof s->slot[w.slot].kv, "%s", kv);
            *slot = w.slot;
        } else {
            unlink_waiter(s, &w);
            if (r == KVS_SRV_SLOT_OK)
                r = KVS_SRV_SLOT_CLOSED;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

void kvs_srv_slots_set_bytes(kvs_srv_slots *s, int slot, size_t kv_bytes)
{
    pthread_mutex_lock(&s->mu);
    s->slot[slot].kv_bytes = kv_bytes;
    pthread_mutex_unlock(&s->mu);
}

void kvs_srv_slots_release(kvs_srv_slots *s, int slot)
{
    pthread_mutex_lock(&s->mu);
    s->slot[slot].kv_bytes = 0;
    s->slot[slot].kv[0] = 0;
    kvs_srv_waiter *w = s->head;
    if (w && !s->closed) { /* handed over still busy: a newcomer cannot take it meanwhile */
        s->head = w->next;
        if (!s->head)
            s->tail = NULL;
        s->waiting--;
        w->slot = slot;
        pthread_cond_broadcast(&s->freed);
    } else {
        s->slot[slot].busy = 0;
        s->busy--;
    }
    pthread_mutex_unlock(&s->mu);
}

void kvs_srv_slots_close(kvs_srv_slots *s)
{
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_cond_broadcast(&s->freed);
    pthread_mutex_unlock(&s->mu);
}

void kvs_srv_slots_snapshot(kvs_srv_slots *s, int *busy, int *waiting, kvs_srv_slot *slots)
{
    pthread_mutex_lock(&s->mu);
    *busy = s->busy;
    *waiting = s->waiting;
    memcpy(slots, s->slot, sizeof *slots * (size_t)s->n);
    pthread_mutex_unlock(&s->mu);
}
