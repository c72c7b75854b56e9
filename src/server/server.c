/* The server's life: options, the listening socket, the MHD daemon, loading the model, waiting
 * for SIGINT/SIGTERM, shutting down in order. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_internal.h"

#define SHUTDOWN_GRACE_S 10 /* in-flight requests get this long to end before being cut */

kvs_server_opts kvs_server_default_opts(void)
{
    kvs_server_opts o = {.host = "127.0.0.1", .port = 8080, .parallel = 2, .queue = 8,
                         .n_threads = 1, .max_body = 1 << 20, .timeout_s = 600};
    return o;
}

static void say(const char *fmt, ...) KVS_PRINTF(1, 2);
static void say(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvslim serve: %s\n", line);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    /* How MHD reports the server ending a connection whose client hung up: the request's log
     * line says so already ("client gone"). */
    if (strstr(msg, "application error generating response") ||
        strstr(msg, "Application reported internal error") || strstr(msg, "by remote peer"))
        return;
    say("libmicrohttpd: %s", msg);
}

static int check_opts(const kvs_server_opts *o)
{
    kvs_srv_error e;
    if (!o->model_path)
        return say("needs -m MODEL (see kvslim serve --help)"), -1;
    if (o->parallel < 1 || o->queue < 0 || o->n_threads < 1 || o->n_ctx < 0 ||
        o->port < 0 || o->port > 65535 || o->max_body < 1 || o->timeout_s < 1)
        return say("an option is out of range (see kvslim serve --help)"), -1;
    if ((o->kv && kvs_srv_kv_check("--kv", o->kv, &e) != 0) ||
        (o->kv_type && kvs_srv_kv_type_check("--kv-type", o->kv_type, &e) != 0))
        return say("%s", e.message), -1;
    kvs_chat_template t;
    kvs_error err;
    if (o->chat_template && kvs_chat_template_by_name(o->chat_template, &t, &err) != KVS_OK)
        return say("--chat-template: %s", err.msg), -1;
    return 0;
}

/* Binds and listens on host:port (SO_REUSEADDR: a restarted server gets its port back at once).
 * Returns the socket, or -1 after saying why. */
static int listen_on(const char *host, int port, int *ipv6, int *bound)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0)
        return say("--host %s: %s", host, gai_strerror(rc)), -1;
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            err = errno;
        int one = 1;
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                        bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0)) {
            err = errno;
            close(fd);
            fd = -1;
        }
        if (fd >= 0)
            *ipv6 = a->ai_family == AF_INET6;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return say("cannot listen on %s port %d: %s", host, port, strerror(err)), -1;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    *bound = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Loads the model and what the endpoints derive from it; -1 after saying why. */
static int load_model(kvs_server *srv)
{
    kvs_error err = {0};
    const kvs_server_opts *o = &srv->opts;
    if (kvs_model_load(o->model_path, &srv->model, &err) != KVS_OK)
        return say("%s", err.msg), -1;
    kvs_model_get_info(srv->model, &srv->info);
    srv->n_ctx = o->n_ctx ? o->n_ctx : srv->info.n_ctx;
    if (srv->n_ctx > srv->info.n_ctx)
        say("notice: --ctx %d is beyond the model's trained context of %d tokens: positions "
            "past %d were never trained and quality degrades", srv->n_ctx, srv->info.n_ctx,
            srv->info.n_ctx);
    snprintf(srv->model_id, sizeof srv->model_id, "%s", basename_of(o->model_path));
    srv->chat = kvs_chat_template_detect(srv->model);
    if (o->chat_template) /* checked with the other options */
        kvs_chat_template_by_name(o->chat_template, &srv->chat, &err);
    srv->chat_end_token = kvs_chat_turn_end_token(srv->model, srv->chat);
    /* N full F16 caches of the context: 2 (K and V) x 2 bytes per element. */
    srv->kv_bytes_bound = (uint64_t)o->parallel * (uint64_t)srv->n_ctx * 4u *
                          (uint64_t)srv->info.n_layers * (uint64_t)srv->info.n_kv_heads *
                          (uint64_t)srv->info.head_dim;
    say("model %s loaded: context %d per sequence, %d sequence%s, queue %d, chat template %s",
        srv->model_id, srv->n_ctx, o->parallel, o->parallel == 1 ? "" : "s", o->queue,
        kvs_chat_template_name(srv->chat));
    return 0;
}

static int start_daemon(kvs_server *srv, int fd, int ipv6)
{
    const kvs_server_opts *o = &srv->opts;
    /* Generating requests, waiting ones, and room for health checks and metrics scrapes. */
    unsigned limit = (unsigned)(o->parallel + o->queue) + 32u;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC | (ipv6 ? MHD_USE_IPv6 : 0);
    srv->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, kvs_srv_on_request, srv,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, srv, /* first: it applies to the options after it */
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)256 * 1024, MHD_OPTION_CONNECTION_LIMIT,
        limit, MHD_OPTION_NOTIFY_COMPLETED, kvs_srv_on_completed, srv, MHD_OPTION_END);
    if (!srv->daemon)
        return say("cannot start the HTTP daemon (see the message above)"), -1;
    return 0;
}

/* Stops accepting, ends the generations, waits (a while) for in-flight requests, stops MHD. */
static void shut_down(kvs_server *srv)
{
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd); /* the port is free from here on */
    atomic_store(&srv->stopping, 1);
    kvs_srv_slots_close(&srv->slots);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += SHUTDOWN_GRACE_S;
    pthread_mutex_lock(&srv->live_mu);
    while (srv->live > 0 &&
           pthread_cond_timedwait(&srv->live_cv, &srv->live_mu, &until) != ETIMEDOUT) {
    }
    int left = srv->live;
    pthread_mutex_unlock(&srv->live_mu);
    if (left > 0)
        say("%d request%s still open after %d s: closing them", left, left == 1 ? "" : "s",
            SHUTDOWN_GRACE_S);
    MHD_stop_daemon(srv->daemon); /* closes every connection and joins its thread */
    srv->daemon = NULL;
}

static int init(kvs_server *srv, const kvs_server_opts *o)
{
    memset(srv, 0, sizeof *srv);
    srv->opts = *o;
    srv->kv = o->kv ? o->kv : "full";
    srv->kv_type = o->kv_type ? o->kv_type : "f16"; /* as kvslim run */
    srv->started = (long long)time(NULL);
    atomic_init(&srv->ready, 0);
    atomic_init(&srv->stopping, 0);
    atomic_init(&srv->counter, 0);
    if (kvs_srv_slots_init(&srv->slots, o->parallel, o->queue) != 0)
        return say("out of memory"), -1;
    kvs_srv_metrics_init(&srv->metrics);
    pthread_mutex_init(&srv->json_lock, NULL);
    pthread_mutex_init(&srv->live_mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&srv->live_cv, &attr);
    pthread_condattr_destroy(&attr);
    return 0;
}

static void destroy(kvs_server *srv)
{
    kvs_model_free(srv->model);
    kvs_srv_slots_destroy(&srv->slots);
    kvs_srv_metrics_destroy(&srv->metrics);
    pthread_mutex_destroy(&srv->json_lock);
    pthread_mutex_destroy(&srv->live_mu);
    pthread_cond_destroy(&srv->live_cv);
}

/* Takes the signals that came while they were blocked, so restoring the mask does not deliver
 * them. */
static void drain(const sigset_t *set)
{
    struct timespec zero = {0, 0};
    while (sigtimedwait(set, NULL, &zero) > 0) {
    }
}

int kvs_server_main(const kvs_server_opts *opts)
{
    if (!opts || check_opts(opts) != 0)
        return 2;
    kvs_server_opts resolved = *opts;
    if (!resolved.host)
        resolved.host = "127.0.0.1";
    const kvs_server_opts *o = &resolved;
    /* Blocked before any thread starts, so every thread inherits the mask and the signals
     * wait for sigwait below. */
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    kvs_server *srv = malloc(sizeof *srv);
    int rc = 1, fd = -1, ipv6 = 0, port = 0;
    const int literal_v6 = strchr(o->host, ':') != NULL; /* written in brackets in a URL */
    if (!srv || init(srv, o) != 0) {
        free(srv);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return 1;
    }
    if ((fd = listen_on(o->host, o->port, &ipv6, &port)) < 0)
        goto out;
    if (start_daemon(srv, fd, ipv6) != 0) {
        close(fd);
        goto out;
    }
    fprintf(stderr, "kvslim serve: listening on http://%s%s%s:%d\n", literal_v6 ? "[" : "",
            o->host, literal_v6 ? "]" : "", port);
    fflush(stderr);
    if (load_model(srv) != 0) {
        shut_down(srv);
        goto out;
    }
    atomic_store(&srv->ready, 1);
    int sig = 0;
    sigwait(&set, &sig);
    say("%s: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    shut_down(srv);
    say("stopped");
    rc = 0;
out:
    destroy(srv);
    free(srv);
    drain(&set);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
