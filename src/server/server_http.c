/* HTTP with libmicrohttpd: routing, authentication, bodies up to the limit, answers, the
 * per-request log line. The endpoints themselves are in server_api.c. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server_internal.h"
#include "server/server_json.h"

static const struct route_def {
    const char *path, *method;
    kvs_srv_route route;
    int open; /* answered without the API key */
} routes[] = {
    {"/", "GET", KVS_ROUTE_PAGE, 1},
    {"/health", "GET", KVS_ROUTE_HEALTH, 1},
    {"/v1/models", "GET", KVS_ROUTE_MODELS, 0},
    {"/v1/completions", "POST", KVS_ROUTE_COMPLETIONS, 0},
    {"/v1/chat/completions", "POST", KVS_ROUTE_CHAT, 0},
    {"/tokenize", "POST", KVS_ROUTE_TOKENIZE, 0},
    {"/detokenize", "POST", KVS_ROUTE_DETOKENIZE, 0},
    {"/metrics", "GET", KVS_ROUTE_METRICS, 0},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

static const struct route_def *route_of(kvs_srv_route r)
{
    for (size_t i = 0; i < N_ROUTES; i++)
        if (routes[i].route == r)
            return &routes[i];
    return NULL;
}

/* The metrics label of an endpoint: its path, "other" for unknown paths (their number is the
 * client's choice, a label's values must stay few). */
static const char *endpoint_label(const kvs_srv_exchange *x)
{
    const struct route_def *d = route_of(x->route);
    return d ? d->path : "other";
}

int kvs_srv_client_gone(void *exchange)
{
    kvs_srv_exchange *x = exchange;
    if (x->fd < 0)
        return 0;
    /* POLLRDHUP: the peer closed (or shut down its sending side); a pipelined next request
     * only sets POLLIN. */
    struct pollfd p = {x->fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
        x->gone = 1;
    return x->gone;
}

enum MHD_Result kvs_srv_answer(kvs_srv_exchange *x, int status, const char *type,
                               kvs_srv_buf *body)
{
    struct MHD_Response *r;
    if (body->data && !body->failed) {
        r = MHD_create_response_from_buffer(body->len, body->data, MHD_RESPMEM_MUST_FREE);
        if (r)
            memset(body, 0, sizeof *body); /* MHD owns the bytes now */
    } else {
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    kvs_srv_buf_free(body);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 503)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, route_of(x->route)->method);
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(x->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES)
        kvs_srv_answered(x, status);
    return ok;
}

void kvs_srv_answered(kvs_srv_exchange *x, int status)
{
    x->status = status;
    kvs_srv_metrics_request(&x->srv->metrics, endpoint_label(x), status);
}

enum MHD_Result kvs_srv_answer_error(kvs_srv_exchange *x, const kvs_srv_error *e)
{
    kvs_srv_buf body = {0};
    kvs_srv_json_error(&body, e);
    return kvs_srv_answer(x, e->status, "application/json", &body);
}

/* Constant-time comparison, so the time of a refusal does not tell how much of a key was
 * right. */
static int same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

static int authorized(const kvs_srv_exchange *x)
{
    const char *key = x->srv->opts.api_key;
    if (!key)
        return 1;
    const char *h = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7))
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    return same_secret(h, key);
}

static void copy_printable(char *dst, size_t size, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < size; i++)
        dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    dst[i] = 0;
}

static kvs_srv_exchange *exchange_new(kvs_server *srv, struct MHD_Connection *conn,
                                      const char *url, const char *method)
{
    kvs_srv_exchange *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    atomic_init(&x->refs, 1);
    x->srv = srv;
    x->conn = conn;
    x->slot = -1;
    x->t0 = kvs_srv_now();
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    x->fd = ci ? ci->connect_fd : -1;
    copy_printable(x->method, sizeof x->method, method);
    copy_printable(x->path, sizeof x->path, url);
    for (size_t i = 0; i < N_ROUTES; i++)
        if (!strcmp(url, routes[i].path))
            x->route = routes[i].route;
    pthread_mutex_lock(&srv->live_mu);
    srv->live++;
    pthread_mutex_unlock(&srv->live_mu);
    return x;
}

static void log_line(const kvs_srv_exchange *x)
{
    char status[8], line[640], why[96] = "";
    if (x->status)
        snprintf(status, sizeof status, "%d", x->status);
    else
        snprintf(status, sizeof status, "-");
    if (x->gone || x->ended)
        snprintf(why, sizeof why, " (%s)", x->gone ? "client gone" : x->ended);
    snprintf(line, sizeof line, "kvslim serve: %s %s %s prompt=%d gen=%d kv=%s tok/s=%.1f "
             "ms=%.1f%s\n", x->method, x->path, status, x->res.prompt_tokens,
             x->res.completion_tokens, x->kv[0] ? x->kv : "-", x->res.tok_per_s,
             (kvs_srv_now() - x->t0) * 1e3, why);
    fputs(line, stderr);
}

void kvs_srv_exchange_release(kvs_srv_exchange *x)
{
    if (!x || atomic_fetch_sub(&x->refs, 1) != 1)
        return;
    kvs_srv_gen_end(x);
    log_line(x);
    kvs_srv_request_free(&x->req);
    kvs_srv_buf_free(&x->body);
    kvs_srv_buf_free(&x->text);
    kvs_srv_buf_free(&x->out);
    kvs_server *srv = x->srv;
    free(x);
    pthread_mutex_lock(&srv->live_mu);
    if (--srv->live == 0)
        pthread_cond_broadcast(&srv->live_cv);
    pthread_mutex_unlock(&srv->live_mu);
}

void kvs_srv_on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                          enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)conn;
    kvs_srv_exchange *x = *req_cls;
    if (x && toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT)
        x->gone = 1;
    else if (x && toe == MHD_REQUEST_TERMINATED_WITH_ERROR && !x->gone)
        x->ended = "connection closed early";
    else if (x && toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED)
        x->ended = "idle timeout";
    else if (x && toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
        x->ended = "closed at shutdown";
    kvs_srv_exchange_release(x);
    *req_cls = NULL;
}

/* What can be answered from the request line and headers alone; -1 with e set, else 0. */
static int early_refusal(kvs_srv_exchange *x, const char *method, kvs_srv_error *e)
{
    kvs_server *srv = x->srv;
    const struct route_def *d = route_of(x->route);
    if (!d || (d->route == KVS_ROUTE_PAGE && !srv->opts.page))
        return kvs_srv_fail(e, 404, "invalid_request_error", NULL, "not_found",
                            "no endpoint %s (see GET /, /health, /v1/models, /metrics; POST "
                            "/v1/completions, /v1/chat/completions, /tokenize, /detokenize)",
                            x->path);
    int get = !strcmp(d->method, "GET");
    if (strcmp(method, d->method) && !(get && !strcmp(method, "HEAD")))
        return kvs_srv_fail(e, 405, "invalid_request_error", NULL, "method_not_allowed",
                            "%s takes %s, not %s", d->path, d->method, x->method);
    if (!d->open && !authorized(x))
        return kvs_srv_fail(e, 401, "authentication_error", NULL, "invalid_api_key",
                            "missing or wrong API key: send the header 'Authorization: Bearer "
                            "KEY' with the server's --api-key");
    if (!atomic_load(&srv->ready) && d->route != KVS_ROUTE_HEALTH)
        return kvs_srv_fail(e, 503, "server_error", NULL, "loading",
                            "the model is loading; retry when GET /health answers 200");
    const char *cl = MHD_lookup_connection_value(x->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > srv->opts.max_body)
        return kvs_srv_fail(e, 413, "invalid_request_error", NULL, "request_too_large",
                            "the body of %s bytes is over the limit of %zu (--max-body)", cl,
                            srv->opts.max_body);
    return 0;
}

enum MHD_Result kvs_srv_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_size, void **req_cls)
{
    (void)version;
    kvs_server *srv = cls;
    kvs_srv_exchange *x = *req_cls;
    if (!x) { /* the headers are in: refuse now what cannot be served, before any body */
        if (!(x = exchange_new(srv, conn, url, method)))
            return MHD_NO;
        *req_cls = x;
        kvs_srv_error e;
        /* MHD closes the connection after an answer given this early (a body may follow
         * unread), so what will be served waits for the last call, keeping it alive. */
        if (early_refusal(x, method, &e) != 0)
            return kvs_srv_answer_error(x, &e);
        return MHD_YES;
    }
    if (x->status) { /* answered already: the rest of the body is not wanted */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Past the limit the body is read and dropped, not stored: the 413 follows once it
         * ends (a body without Content-Length cannot be refused before it is read). */
        if (!x->body_too_large && *upload_size > srv->opts.max_body - x->body.len) {
            x->body_too_large = 1;
            kvs_srv_buf_free(&x->body);
        }
        /* Out of memory: MHD takes no answer in the middle of a body; close the connection. */
        if (!x->body_too_large && kvs_srv_buf_append(&x->body, upload_data, *upload_size) != 0)
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->body_too_large) {
        kvs_srv_error e;
        kvs_srv_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                     "the body is over the limit of %zu bytes (--max-body)", srv->opts.max_body);
        return kvs_srv_answer_error(x, &e);
    }
    return kvs_srv_api(x);
}
