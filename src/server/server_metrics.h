/* The server's counters and their Prometheus text exposition (format 0.0.4). */
#ifndef KVS_SERVER_METRICS_H
#define KVS_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "server/server_buf.h"
#include "server/server_request.h"
#include "server/server_slots.h"

#define KVS_SRV_RATE_WINDOW 60   /* seconds behind kvslim_decode_tokens_per_second */
#define KVS_SRV_MAX_POLICIES 64  /* distinct kv labels kept; later ones count as "other" */

typedef struct kvs_srv_req_count {
    char endpoint[32];
    int status;
    uint64_t count;
} kvs_srv_req_count;

typedef struct kvs_srv_policy_count {
    char kv[KVS_SRV_MAX_SPEC + 1];
    uint64_t requests, generated;
} kvs_srv_policy_count;

typedef struct kvs_srv_metrics {
    pthread_mutex_t mu;
    kvs_srv_req_count *req;
    int n_req, cap_req;
    kvs_srv_policy_count pol[KVS_SRV_MAX_POLICIES + 1]; /* + "other" */
    int n_pol;
    uint64_t prompt_tokens, generated_tokens;
    struct {
        int64_t second;
        uint64_t tokens;
    } window[KVS_SRV_RATE_WINDOW];
} kvs_srv_metrics;

/* What /metrics reports of the moment, besides the counters. */
typedef struct kvs_srv_metrics_now {
    int64_t second;              /* monotonic seconds */
    int busy, waiting, max_sequences;
    const kvs_srv_slot *slots;   /* max_sequences of them */
    uint64_t kv_bytes_bound;
} kvs_srv_metrics_now;

void kvs_srv_metrics_init(kvs_srv_metrics *m);
void kvs_srv_metrics_destroy(kvs_srv_metrics *m);
/* An answered request (endpoint: the route, or "other" for unknown paths). */
void kvs_srv_metrics_request(kvs_srv_metrics *m, const char *endpoint, int status);
/* A generation request that got a sequence: its policy and prompt tokens. */
void kvs_srv_metrics_started(kvs_srv_metrics *m, const char *kv, int prompt_tokens);
/* n tokens generated under policy kv at monotonic second `second`. */
void kvs_srv_metrics_generated(kvs_srv_metrics *m, const char *kv, int n, int64_t second);
/* Appends the exposition; 0, or -1 when out of memory. */
int kvs_srv_metrics_render(kvs_srv_metrics *m, const kvs_srv_metrics_now *now, kvs_srv_buf *out);
/* s as a Prometheus label value: backslash, double quote and line feed escaped. */
int kvs_srv_prom_label(kvs_srv_buf *out, const char *s);

#endif
