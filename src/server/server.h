/* kvslim serve: an OpenAI-compatible HTTP server over the library's sessions (the tools reach
 * it through kvslim_tools.h). One model, N sequences decoding at once (a session each, created
 * per request with the request's KV policy and freed when it ends), a bounded queue, SSE
 * streaming, Prometheus metrics. */
#ifndef KVS_SERVER_H
#define KVS_SERVER_H

#include <stddef.h>

typedef struct kvs_server_opts {
    const char *model_path; /* GGUF file; its basename is the model id */
    const char *host;       /* address to listen on; default "127.0.0.1" */
    int port;               /* 0: a free port (the listen line says which) */
    int parallel;           /* sequences decoding at once, >= 1 */
    int queue;              /* requests waiting for a sequence, >= 0 */
    int n_ctx;              /* context per sequence; 0: the model's */
    int n_threads;          /* threads per sequence, >= 1 */
    const char *kv;         /* KV policy of requests without "kv"; NULL: full */
    const char *kv_type;    /* KV storage of requests without "kv_type"; NULL: f16 */
    const char *api_key;    /* NULL: no authentication */
    size_t max_body;        /* bytes of a request body; more answers 413 */
    unsigned timeout_s;     /* idle connection timeout */
    const unsigned char *page; /* GET / (text/html); NULL: 404 */
    size_t page_len;
    const char *chat_template; /* a kvs_chat_template_by_name name; NULL: the model's */
    int exact_matmul;          /* kvs_session_params.exact_matmul of every sequence */
} kvs_server_opts;

/* The defaults of `kvslim serve` (port 8080, 2 sequences, a queue of 8, 1 MiB bodies, 600 s). */
kvs_server_opts kvs_server_default_opts(void);

/* Runs the server in the calling thread until SIGINT or SIGTERM: listens (printing "kvslim
 * serve: listening on http://HOST:PORT" to stderr), then loads the model (/health answers 503
 * until it has), then serves. On the signal it stops accepting, lets in-flight requests end
 * (generations stop at their next step), releases the port and frees everything. SIGINT and
 * SIGTERM are blocked in the calling thread (and so in every thread it starts) while it runs.
 * Messages go to stderr as "kvslim serve: ...", one line per request. Returns the exit code:
 * 0 after a signal, 1 when the socket or the model fails, 2 for bad options (named as the
 * command-line flags). */
int kvs_server_main(const kvs_server_opts *opts);

#endif
