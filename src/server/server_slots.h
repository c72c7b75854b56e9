/* The server's sequences: at most N requests generate at once, at most Q wait (first come,
 * first served) for one to free, more are turned away. Also what each busy sequence holds, for
 * /metrics. */
#ifndef KVS_SERVER_SLOTS_H
#define KVS_SERVER_SLOTS_H

#include <pthread.h>
#include <stddef.h>

#include "server/server_request.h"

typedef struct kvs_srv_slot {
    int busy;
    size_t kv_bytes;                  /* held by its session now */
    char kv[KVS_SRV_MAX_SPEC + 1];    /* the policy spec it runs */
} kvs_srv_slot;

typedef struct kvs_srv_waiter kvs_srv_waiter;

typedef struct kvs_srv_slots {
    pthread_mutex_t mu;
    pthread_cond_t freed;
    kvs_srv_slot *slot;
    int n, busy;
    int max_waiting, waiting;
    kvs_srv_waiter *head, *tail;      /* the queue, oldest first */
    int closed;                       /* shutting down: nobody gets a slot any more */
} kvs_srv_slots;

typedef enum kvs_srv_acquire {
    KVS_SRV_SLOT_OK,
    KVS_SRV_SLOT_FULL,   /* max_waiting requests are already waiting */
    KVS_SRV_SLOT_CLOSED, /* the server is shutting down */
    KVS_SRV_SLOT_GONE,   /* gone() said the client left while waiting */
} kvs_srv_acquire;

/* 0, or -1 when out of memory. */
int kvs_srv_slots_init(kvs_srv_slots *s, int n, int max_waiting);
void kvs_srv_slots_destroy(kvs_srv_slots *s);
/* Takes a free sequence for policy kv into *slot, waiting in the queue if none is free. While
 * waiting, gone(ctx) (may be NULL) is asked every 100 ms whether the client is still there. */
kvs_srv_acquire kvs_srv_slots_acquire(kvs_srv_slots *s, const char *kv, int (*gone)(void *),
                                      void *ctx, int *slot);
/* Records what a busy sequence holds now. */
void kvs_srv_slots_set_bytes(kvs_srv_slots *s, int slot, size_t kv_bytes);
/* Frees the sequence: the oldest waiter gets it. */
void kvs_srv_slots_release(kvs_srv_slots *s, int slot);
/* Wakes every waiter with KVS_SRV_SLOT_CLOSED and refuses later requests. */
void kvs_srv_slots_close(kvs_srv_slots *s);

/* A consistent copy for /metrics: busy slots, waiting requests, every slot's state. slots must
 * hold s->n entries. */
void kvs_srv_slots_snapshot(kvs_srv_slots *s, int *busy, int *waiting, kvs_srv_slot *slots);

#endif
