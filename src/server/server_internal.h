/* What the server's parts share: the server (one per kvs_server_main) and one HTTP exchange
 * (a request and its answer). Not for the tools: they see server.h. */
#ifndef KVS_SERVER_INTERNAL_H
#define KVS_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kvslim.h"
#include "server/server.h"
#include "server/server_buf.h"
#include "server/server_gen.h"
#include "server/server_json.h"
#include "server/server_metrics.h"
#include "server/server_request.h"
#include "server/server_slots.h"

typedef struct kvs_server {
    kvs_server_opts opts;
    const char *kv, *kv_type;     /* the defaults, resolved */
    struct MHD_Daemon *daemon;
    kvs_model *model;             /* written once before ready is set */
    atomic_int ready;             /* the model is loaded */
    atomic_int stopping;          /* a signal came: generations end at their next step */
    atomic_uint_fast64_t counter; /* ids and default seeds */
    char model_id[256];
    kvs_model_info info;
    int n_ctx;
    kvs_chat_template chat;
    int chat_end_token;           /* the turn end as one token, or -1 */
    uint64_t kv_bytes_bound;
    long long started;            /* unix seconds */
    kvs_srv_slots slots;
    kvs_srv_metrics metrics;
    pthread_mutex_t json_lock;    /* cJSON's parse writes a global (server_request.h) */
    pthread_mutex_t live_mu;      /* requests between arrival and their last callback */
    pthread_cond_t live_cv;
    int live;
} kvs_server;

typedef enum kvs_srv_route {
    KVS_ROUTE_NONE,
    KVS_ROUTE_PAGE,
    KVS_ROUTE_HEALTH,
    KVS_ROUTE_MODELS,
    KVS_ROUTE_COMPLETIONS,
    KVS_ROUTE_CHAT,
    KVS_ROUTE_TOKENIZE,
    KVS_ROUTE_DETOKENIZE,
    KVS_ROUTE_METRICS,
} kvs_srv_route;

/* Where a streamed answer is. */
typedef enum kvs_srv_phase {
    KVS_PHASE_ROLE,  /* chat: the {"role":"assistant"} chunk comes first */
    KVS_PHASE_TEXT,  /* decoding */
    KVS_PHASE_DONE,  /* the last chunk is out: data: [DONE] next */
    KVS_PHASE_END,   /* everything sent */
} kvs_srv_phase;

/* One request and its answer. Shared by MHD's request (released when it completes) and, when
 * streaming, by the response (released when MHD frees it): the last to let go logs the request
 * and frees it. Everything runs on the connection's thread. */
typedef struct kvs_srv_exchange {
    kvs_server *srv;
    atomic_int refs;
    struct MHD_Connection *conn;
    int fd;                        /* the client's socket: polled for a hang-up */
    kvs_srv_route route;
    char method[16], path[128];    /* for the log (path cut, control bytes replaced) */
    double t0;
    int status;                    /* answered with; 0 before */
    int gone;                      /* the client hung up before the end */
    const char *ended;             /* how MHD ended it, when not as planned (for the log) */
    kvs_srv_buf body;
    int body_too_large;
    /* a generation */
    kvs_srv_request req;
    kvs_srv_gen gen;
    int running;                   /* gen holds a session and slot holds a sequence */
    int slot;
    int reported;                  /* generated tokens already counted in the metrics */
    kvs_srv_result res;
    char id[40], kv[KVS_SRV_MAX_SPEC + 1], kv_type[KVS_SRV_MAX_SPEC + 1];
    const char *stops[KVS_SRV_MAX_STOP + 1]; /* the request's and the chat template's end */
    kvs_srv_buf text;              /* the text generated (whole, or this step's) */
    kvs_srv_buf out;               /* a stream's bytes not yet handed to MHD */
    kvs_srv_phase phase;
} kvs_srv_exchange;

/* server_http.c: MHD's callbacks, answers, the request log. */
enum MHD_Result kvs_srv_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_size, void **req_cls);
void kvs_srv_on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                          enum MHD_RequestTerminationCode toe);
/* Queues body (taken over, emptied) with status and content type; records the status. */
enum MHD_Result kvs_srv_answer(kvs_srv_exchange *x, int status, const char *type,
                               kvs_srv_buf *body);
/* Records that x was answered with status (the log, the metrics). */
void kvs_srv_answered(kvs_srv_exchange *x, int status);
enum MHD_Result kvs_srv_answer_error(kvs_srv_exchange *x, const kvs_srv_error *e);
/* Lets go of x: the last reference logs the request and frees it. */
void kvs_srv_exchange_release(kvs_srv_exchange *x);
/* Whether the client hung up (a non-blocking poll of its socket). */
int kvs_srv_client_gone(void *exchange);

/* server_api.c: the endpoints, once the request is whole and allowed. */
enum MHD_Result kvs_srv_api(kvs_srv_exchange *x);
/* Ends x's generation if it runs: frees its session, releases its sequence. */
void kvs_srv_gen_end(kvs_srv_exchange *x);

#endif
