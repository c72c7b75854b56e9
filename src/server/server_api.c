/* The endpoints: completions and chat completions (whole or streamed as SSE, pulled by MHD one
 * decode step at a time), tokenize, detokenize, models, health, metrics, the page. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_internal.h"
#include "server/server_json.h"

/* splitmix64's finaliser: ids and default seeds from a counter and the clock. */
static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fresh(kvs_server *srv)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t n = atomic_fetch_add(&srv->counter, 1);
    return mix(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ mix(n));
}

static void session_notice(void *ctx, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "kvslim serve: notice: %s\n", msg);
}

/* Counts the tokens generated since the last call and records the KV bytes held now. */
static void account(kvs_srv_exchange *x)
{
    kvs_server *srv = x->srv;
    if (x->gen.n_gen > x->reported) {
        kvs_srv_metrics_generated(&srv->metrics, x->kv, x->gen.n_gen - x->reported,
                                  (int64_t)kvs_srv_now());
        x->reported = x->gen.n_gen;
    }
    kvs_srv_slots_set_bytes(&srv->slots, x->slot, kvs_srv_gen_kv_bytes(&x->gen));
}

void kvs_srv_gen_end(kvs_srv_exchange *x)
{
    if (!x->running)
        return;
    account(x);
    kvs_srv_result *r = &x->res;
    r->finish = x->gen.finish;
    r->completion_tokens = x->gen.n_gen;
    r->kv_bytes = kvs_srv_gen_kv_bytes(&x->gen);
    r->kv_bytes_full_f16 = kvs_srv_gen_kv_bytes_full_f16(&x->gen);
    r->prompt_ms = kvs_srv_gen_prompt_ms(&x->gen);
    r->decode_ms = kvs_srv_gen_decode_ms(&x->gen);
    r->tok_per_s = kvs_srv_gen_tok_per_s(&x->gen);
    kvs_srv_gen_free(&x->gen);
    kvs_srv_slots_release(&x->srv->slots, x->slot);
    x->slot = -1;
    x->running = 0;
}

/* The stream's next bytes: what is pending, else the next event, decoding as needed. */
static ssize_t stream_next(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    kvs_srv_exchange *x = cls;
    for (;;) {
        kvs_srv_buf *out = &x->out;
        if (out->failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (out->off < out->len) {
            size_t n = out->len - out->off < max ? out->len - out->off : max;
            memcpy(buf, out->data + out->off, n);
            out->off += n;
            return (ssize_t)n;
        }
        kvs_srv_buf_clear(out);
        switch (x->phase) {
        case KVS_PHASE_END:
            return MHD_CONTENT_READER_END_OF_STREAM;
        case KVS_PHASE_DONE:
            kvs_srv_buf_puts(out, "data: [DONE]\n\n");
            x->phase = KVS_PHASE_END;
            continue;
        case KVS_PHASE_ROLE:
            kvs_srv_json_chunk(out, &x->res, NULL, 1);
            x->phase = KVS_PHASE_TEXT;
            continue;
        case KVS_PHASE_TEXT:
            break;
        }
        if (kvs_srv_client_gone(x)) {
            kvs_srv_gen_end(x); /* free the sequence now, not when MHD notices */
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        kvs_srv_error e;
        kvs_srv_buf_clear(&x->text);
        int r = kvs_srv_gen_step(&x->gen, atomic_load(&x->srv->stopping), &x->text, &e);
        account(x);
        if (x->text.len > 0)
            kvs_srv_json_chunk(out, &x->res, x->text.data, 0);
        if (r < 0) {
            kvs_srv_gen_end(x);
            kvs_srv_json_stream_error(out, &e);
            x->phase = KVS_PHASE_DONE;
        } else if (r == 0) {
            kvs_srv_gen_end(x);
            kvs_srv_json_chunk(out, &x->res, "", 0);
            x->phase = KVS_PHASE_DONE;
        }
    }
}

/* MHD is done with the stream (sent, or the client left): the sequence is freed at once. */
static void stream_free(void *cls)
{
    kvs_srv_exchange *x = cls;
    kvs_srv_gen_end(x);
    kvs_srv_exchange_release(x);
}

static enum MHD_Result start_stream(kvs_srv_exchange *x)
{
    x->phase = x->res.chat ? KVS_PHASE_ROLE : KVS_PHASE_TEXT;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               stream_next, x, stream_free);
    if (!r) {
        kvs_srv_gen_end(x);
        kvs_srv_error e;
        kvs_srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory for the stream");
        return kvs_srv_answer_error(x, &e);
    }
    atomic_fetch_add(&x->refs, 1); /* the response's, let go in stream_free */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(x->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    if (ok == MHD_YES)
        kvs_srv_answered(x, MHD_HTTP_OK);
    return ok;
}

/* Decodes to the end in this connection's thread, watching for a hang-up between steps. */
static enum MHD_Result run_whole(kvs_srv_exchange *x)
{
    kvs_srv_error e;
    for (;;) {
        if (kvs_srv_client_gone(x)) {
            kvs_srv_gen_end(x);
            return MHD_NO;
        }
        int r = kvs_srv_gen_step(&x->gen, atomic_load(&x->srv->stopping), &x->text, &e);
        account(x);
        if (r < 0) {
            kvs_srv_gen_end(x);
            return kvs_srv_answer_error(x, &e);
        }
        if (r == 0)
            break;
    }
    kvs_srv_gen_end(x);
    kvs_srv_buf body = {0};
    kvs_srv_json_completion(&body, &x->res, x->text.data ? x->text.data : "");
    return kvs_srv_answer(x, MHD_HTTP_OK, "application/json", &body);
}

/* The text the model continues: the prompt, or the chat template over the messages. The
 * template's output is tokenized with special-token parsing, so its markers are single tokens
 * (markers typed inside a message's content are parsed too, as llama-server does); a
 * completion's prompt stays plain text, as before (llama-server would parse it). */
static int prompt_tokens(kvs_srv_exchange *x, int32_t **ids, int *n, kvs_srv_error *e)
{
    kvs_server *srv = x->srv;
    char *chat = NULL;
    kvs_error err = {0};
    if (x->req.chat) {
        kvs_chat_message *msgs = malloc(sizeof *msgs * (size_t)(x->req.n_messages + 1));
        if (!msgs)
            return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        for (int i = 0; i < x->req.n_messages; i++)
            msgs[i] = (kvs_chat_message){x->req.messages[i].role, x->req.messages[i].content};
        kvs_status st = kvs_chat_apply(srv->chat, msgs, x->req.n_messages,
                                       KVS_CHAT_ADD_ASSISTANT, &chat, &err);
        free(msgs);
        if (st != KVS_OK)
            return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "%s", err.msg);
    }
    kvs_status st = chat ? kvs_tokenize_special(srv->model, chat, 1, 1, ids, n, &err)
                         : kvs_tokenize(srv->model, x->req.prompt, 1, ids, n, &err);
    free(chat);
    if (st != KVS_OK)
        return kvs_srv_fail(e, st == KVS_ERR_ARG ? 400 : 500,
                            st == KVS_ERR_ARG ? "invalid_request_error" : "server_error",
                            x->req.chat ? "messages" : "prompt", NULL, "%s", err.msg);
    return 0;
}

static enum MHD_Result generate(kvs_srv_exchange *x)
{
    kvs_server *srv = x->srv;
    kvs_srv_error e;
    int chat = x->route == KVS_ROUTE_CHAT;
    if (kvs_srv_request_parse(x->body.data, x->body.len, chat, &srv->json_lock, &x->req, &e))
        return kvs_srv_answer_error(x, &e);
    kvs_srv_buf_free(&x->body);
    const kvs_srv_request *q = &x->req;
    snprintf(x->kv, sizeof x->kv, "%s", q->kv ? q->kv : srv->kv);
    snprintf(x->kv_type, sizeof x->kv_type, "%s", q->kv_type ? q->kv_type : srv->kv_type);
    int32_t *ids = NULL;
    int n_ids = 0;
    if (prompt_tokens(x, &ids, &n_ids, &e) != 0)
        return kvs_srv_answer_error(x, &e);
    kvs_srv_acquire got = kvs_srv_slots_acquire(&srv->slots, x->kv, kvs_srv_client_gone, x,
                                                &x->slot);
    if (got != KVS_SRV_SLOT_OK) {
        free(ids);
        if (got == KVS_SRV_SLOT_GONE)
            return MHD_NO;
        if (got == KVS_SRV_SLOT_FULL)
            kvs_srv_fail(&e, 503, "overloaded_error", NULL, "queue_full",
                         "all %d sequences are busy and %d requests are waiting; retry later",
                         srv->opts.parallel, srv->opts.queue);
        else
            kvs_srv_fail(&e, 503, "server_error", NULL, "shutting_down",
                         "the server is shutting down");
        return kvs_srv_answer_error(x, &e);
    }
    int n_stops = 0;
    for (; n_stops < q->n_stop; n_stops++)
        x->stops[n_stops] = q->stop[n_stops];
    /* The turn's end stops as a token (stop_token) when the vocabulary has it as one, and as
     * text for a vocabulary that spells it out. */
    if (chat && kvs_chat_turn_end(srv->chat))
        x->stops[n_stops++] = kvs_chat_turn_end(srv->chat);
    kvs_srv_gen_params gp = {.model = srv->model, .prompt = ids, .n_prompt = n_ids,
                             .session = kvs_session_default_params(),
                             .max_tokens = q->max_tokens, .ignore_eos = q->ignore_eos,
                             .stops = x->stops,
                             .n_stops = n_stops,
                             .stop_token = chat ? srv->chat_end_token : -1};
    gp.session.n_threads = srv->opts.n_threads;
    gp.session.exact_matmul = srv->opts.exact_matmul;
    gp.session.n_ctx = srv->n_ctx;
    gp.session.kv_policy = x->kv;
    gp.session.kv_type = x->kv_type;
    gp.session.allow_ctx_beyond_trained = 1; /* --ctx asked for it; noticed at start-up */
    gp.session.log = session_notice;
    gp.sampler = (kvs_sampler_params){q->temperature, q->top_k, q->top_p,
                                      q->has_seed ? q->seed : fresh(srv)};
    int rc = kvs_srv_gen_start(&x->gen, &gp, &e);
    free(ids);
    if (rc != 0) {
        kvs_srv_slots_release(&srv->slots, x->slot);
        x->slot = -1;
        return kvs_srv_answer_error(x, &e);
    }
    x->running = 1;
    kvs_srv_metrics_started(&srv->metrics, x->kv, n_ids);
    account(x);
    snprintf(x->id, sizeof x->id, "%s%016" PRIx64, chat ? "chatcmpl-" : "cmpl-", fresh(srv));
    x->res = (kvs_srv_result){.id = x->id, .created = (long long)time(NULL),
                              .model = srv->model_id, .chat = chat, .prompt_tokens = n_ids,
                              .kv = x->kv, .kv_type = x->kv_type};
    return q->stream ? start_stream(x) : run_whole(x);
}

static enum MHD_Result tokenize(kvs_srv_exchange *x)
{
    kvs_srv_error e;
    char *content;
    int add_special;
    if (kvs_srv_tokenize_parse(x->body.data, x->body.len, &x->srv->json_lock, &content,
                               &add_special, &e) != 0)
        return kvs_srv_answer_error(x, &e);
    int32_t *ids = NULL;
    int n = 0;
    kvs_error err = {0};
    kvs_status st = kvs_tokenize(x->srv->model, content, add_special, &ids, &n, &err);
    free(content);
    if (st != KVS_OK) {
        kvs_srv_fail(&e, st == KVS_ERR_ARG ? 400 : 500,
                     st == KVS_ERR_ARG ? "invalid_request_error" : "server_error", "content",
                     NULL, "%s", err.msg);
        return kvs_srv_answer_error(x, &e);
    }
    kvs_srv_buf body = {0};
    kvs_srv_json_tokens(&body, ids, n);
    free(ids);
    return kvs_srv_answer(x, MHD_HTTP_OK, "application/json", &body);
}

static enum MHD_Result detokenize(kvs_srv_exchange *x)
{
    kvs_srv_error e;
    int32_t *ids;
    int n;
    if (kvs_srv_detokenize_parse(x->body.data, x->body.len, &x->srv->json_lock,
                                 x->srv->info.n_vocab, &ids, &n, &e) != 0)
        return kvs_srv_answer_error(x, &e);
    kvs_srv_buf text = {0}, body = {0};
    kvs_srv_buf_puts(&text, "");
    for (int i = 0; i < n; i++) {
        int len = 0;
        const char *piece = kvs_token_text(x->srv->model, i ? ids[i - 1] : -1, ids[i], &len);
        kvs_srv_buf_append(&text, piece, (size_t)len);
    }
    free(ids);
    /* A byte token alone may be half a character: the JSON must stay valid UTF-8. */
    if (!text.failed)
        kvs_srv_utf8_append(&body, text.data, text.len);
    kvs_srv_buf_free(&text);
    kvs_srv_buf json = {0};
    if (!body.failed)
        kvs_srv_json_content(&json, body.data ? body.data : "");
    kvs_srv_buf_free(&body);
    return kvs_srv_answer(x, MHD_HTTP_OK, "application/json", &json);
}

static enum MHD_Result metrics(kvs_srv_exchange *x)
{
    kvs_server *srv = x->srv;
    kvs_srv_slot *slots = calloc((size_t)srv->slots.n, sizeof *slots);
    kvs_srv_buf body = {0};
    if (slots) {
        kvs_srv_metrics_now now = {.second = (int64_t)kvs_srv_now(), .slots = slots,
                                   .max_sequences = srv->slots.n,
                                   .kv_bytes_bound = srv->kv_bytes_bound};
        kvs_srv_slots_snapshot(&srv->slots, &now.busy, &now.waiting, slots);
        kvs_srv_metrics_render(&srv->metrics, &now, &body);
        free(slots);
    }
    return kvs_srv_answer(x, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", &body);
}

enum MHD_Result kvs_srv_api(kvs_srv_exchange *x)
{
    kvs_server *srv = x->srv;
    kvs_srv_buf body = {0};
    switch (x->route) {
    case KVS_ROUTE_PAGE:
        kvs_srv_buf_append(&body, srv->opts.page, srv->opts.page_len);
        return kvs_srv_answer(x, MHD_HTTP_OK, "text/html; charset=utf-8", &body);
    case KVS_ROUTE_HEALTH: {
        int ready = atomic_load(&srv->ready);
        kvs_srv_json_status(&body, ready ? "ok" : "loading");
        return kvs_srv_answer(x, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                              "application/json", &body);
    }
    case KVS_ROUTE_MODELS:
        kvs_srv_json_models(&body, srv->model_id, srv->started);
        return kvs_srv_answer(x, MHD_HTTP_OK, "application/json", &body);
    case KVS_ROUTE_METRICS:
        return metrics(x);
    case KVS_ROUTE_COMPLETIONS:
    case KVS_ROUTE_CHAT:
        return generate(x);
    case KVS_ROUTE_TOKENIZE:
        return tokenize(x);
    case KVS_ROUTE_DETOKENIZE:
        return detokenize(x);
    case KVS_ROUTE_NONE:
        break;
    }
    return MHD_NO;
}
