/* One sequence of the server (server_gen.h). */
#include "server/server_gen.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double kvs_srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A library status as the server answers it: bad arguments are the request's fault. */
static int library_fail(kvs_status st, const kvs_error *err, kvs_srv_error *e)
{
    if (st == KVS_ERR_ARG)
        return kvs_srv_bad_kv(e, err->msg);
    return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "%s", err->msg);
}

int kvs_srv_gen_start(kvs_srv_gen *g, const kvs_srv_gen_params *p, kvs_srv_error *e)
{
    memset(g, 0, sizeof *g);
    g->model = p->model;
    g->n_prompt = p->n_prompt;
    g->max_tokens = p->max_tokens;
    g->ignore_eos = p->ignore_eos;
    g->stop_token = p->stop_token;
    g->prev = p->prompt[p->n_prompt - 1];
    g->t_start = kvs_srv_now();
    kvs_srv_stop_init(&g->stop, p->stops, p->n_stops);
    kvs_model_info info;
    kvs_model_get_info(p->model, &info);
    kvs_error err = {0};
    kvs_status st = kvs_session_new(p->model, &p->session, &g->session, &err);
    if (st != KVS_OK) {
        library_fail(st, &err, e);
        goto fail;
    }
    /* An evicting policy's cache stays bounded: its sessions take any prompt. */
    int room = kvs_session_ctx_left(g->session);
    if (p->n_prompt > room) {
        kvs_srv_fail(e, 400, "invalid_request_error", NULL, "context_length_exceeded",
                     "the prompt is %d tokens, more than the context of %d tokens per sequence",
                     p->n_prompt, room);
        goto fail;
    }
    if ((st = kvs_sampler_new(info.n_vocab, &p->sampler, &g->sampler, &err)) != KVS_OK) {
        library_fail(st, &err, e);
        goto fail;
    }
    if (!(g->logits = malloc(sizeof(float) * (size_t)info.n_vocab))) {
        kvs_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for the logits");
        goto fail;
    }
    if ((st = kvs_session_eval(g->session, p->prompt, p->n_prompt, g->logits, 0, &err)) !=
        KVS_OK) {
        library_fail(st, &err, e);
        goto fail;
    }
    g->ctx_left = kvs_session_ctx_left(g->session);
    g->t_prefilled = g->t_end = kvs_srv_now();
    return 0;
fail:
    kvs_srv_gen_free(g);
    return -1;
}

static int finish(kvs_srv_gen *g, const char *reason, kvs_srv_buf *text, kvs_srv_error *e)
{
    g->finish = reason;
    g->t_end = kvs_srv_now();
    if (kvs_srv_stop_flush(&g->stop, text) != 0)
        return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

int kvs_srv_gen_step(kvs_srv_gen *g, int stopping, kvs_srv_buf *text, kvs_srv_error *e)
{
    if (g->finish)
        return 0;
    if (stopping)
        return finish(g, "stop", text, e);
    int tok = kvs_sampler_sample(g->sampler, g->logits);
    /* BOS ends a text as EOS does (kvslim run stops at both): stories260K starts a new story
     * with it. So does a chat turn's end marker when it is one token: it decodes to "", so the
     * stop string could never see it. */
    int end = tok == kvs_token_eos(g->model) || tok == kvs_token_bos(g->model) ||
              (g->stop_token >= 0 && tok == g->stop_token);
    if (end && !g->ignore_eos)
        return finish(g, "stop", text, e);
    g->n_gen++;
    int len = 1;
    const char *piece = end ? "\n" : kvs_token_text(g->model, g->prev, tok, &len);
    g->prev = tok;
    int matched = kvs_srv_stop_feed(&g->stop, piece, (size_t)len, text);
    if (matched < 0)
        return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (matched)
        return finish(g, "stop", text, e);
    /* The last token needs no room in the cache: it is never fed. */
    if (g->n_gen >= g->max_tokens || g->n_gen >= g->ctx_left)
        return finish(g, "length", text, e);
    kvs_error err = {0};
    int32_t t = tok;
    kvs_status st = kvs_session_eval(g->session, &t, 1, g->logits, 0, &err);
    g->t_end = kvs_srv_now();
    if (st != KVS_OK)
        return kvs_srv_fail(e, 500, "server_error", NULL, NULL, "decode step %d: %s", g->n_gen,
                            err.msg);
    return 1;
}

size_t kvs_srv_gen_kv_bytes(const kvs_srv_gen *g) { return kvs_session_kv_bytes(g->session); }
size_t kvs_srv_gen_kv_bytes_full_f16(const kvs_srv_gen *g)
{
    return kvs_session_kv_bytes_full_f16(g->session);
}

double kvs_srv_gen_prompt_ms(const kvs_srv_gen *g) { return (g->t_prefilled - g->t_start) * 1e3; }
double kvs_srv_gen_decode_ms(const kvs_srv_gen *g) { return (g->t_end - g->t_prefilled) * 1e3; }
double kvs_srv_gen_tok_per_s(const kvs_srv_gen *g)
{
    double s = g->t_end - g->t_prefilled;
    return s > 0 ? g->n_gen / s : 0.0;
}

void kvs_srv_gen_free(kvs_srv_gen *g)
{
    kvs_srv_stop_free(&g->stop);
    kvs_sampler_free(g->sampler);
    free(g->logits);
    kvs_session_free(g->session);
    g->sampler = NULL;
    g->logits = NULL;
    g->session = NULL;
}
