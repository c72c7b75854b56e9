/* kvslim serve: the OpenAI-compatible HTTP server (src/server/); this file only reads the flags. */
#include <stdio.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

/* tools/serve_page.html, embedded at build time (cmake/embed_file.cmake). */
extern const unsigned char kvs_serve_page[];
extern const size_t kvs_serve_page_len;

static const cli_command serve_cmd = {
    "serve", CMD_SERVE,
    "usage: kvslim serve -m MODEL [options]\n"
    "\n"
    "Serves the model over HTTP with OpenAI's API and a KV policy per request:\n"
    "  POST /v1/completions, /v1/chat/completions   (\"stream\": true for SSE; extra fields\n"
    "       \"kv\" and \"kv_type\", e.g. \"snapkv:budget=0.2\" and \"f16\"; usage reports KV bytes)\n"
    "  POST /tokenize, /detokenize   GET /v1/models, /health, /metrics (Prometheus)\n"
    "  GET /  a page running two KV policies side by side on one prompt\n"
    "Prints \"kvslim serve: listening on http://HOST:PORT\" once the socket listens, then loads\n"
    "the model (/health answers 503 until then) and logs one line per request on stderr.\n"
    "SIGINT or SIGTERM stops it: in-flight requests end, then it exits 0.\n",
    NULL};

static int serve(const cli_args *a)
{
    kvs_server_opts o = kvs_server_default_opts();
    o.model_path = a->str[FL_MODEL];
    if (!o.model_path) {
        cli_error("serve", "needs -m MODEL (see --help)");
        return CLI_USAGE;
    }
    o.host = cli_get_str(a, FL_HOST, o.host);
    o.port = cli_get_int(a, FL_PORT, o.port);
    o.parallel = cli_get_int(a, FL_PARALLEL, o.parallel);
    o.queue = cli_get_int(a, FL_QUEUE, o.queue);
    o.n_ctx = cli_get_int(a, FL_CTX, 0);
    o.n_threads = a->given[FL_THREADS] ? cli_threads(a) : 1;
    o.kv = cli_get_str(a, FL_KV, NULL);
    o.kv_type = cli_get_str(a, FL_KV_TYPE, NULL);
    o.exact_matmul = a->given[FL_EXACT_MATMUL] > 0;
    o.chat_template = cli_get_str(a, FL_CHAT_TEMPLATE, NULL);
    o.api_key = cli_get_str(a, FL_API_KEY, NULL);
    o.max_body = (size_t)cli_get_int(a, FL_MAX_BODY, (int)o.max_body);
    o.timeout_s = (unsigned)cli_get_int(a, FL_TIMEOUT, (int)o.timeout_s);
    o.page = kvs_serve_page;
    o.page_len = kvs_serve_page_len;
    return kvs_server_main(&o);
}

int cmd_serve(int argc, char **argv) { return cli_main(&serve_cmd, serve, argc, argv); }
