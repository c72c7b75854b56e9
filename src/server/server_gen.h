/* One sequence: a session over the shared model, a sampler, stop strings, the text released
 * step by step. Created per request and freed when it ends, so sessions never outnumber the
 * server's sequences. */
#ifndef KVS_SERVER_GEN_H
#define KVS_SERVER_GEN_H

#include "kvslim.h"
#include "server/server_buf.h"
#include "server/server_request.h"
#include "server/server_stop.h"

typedef struct kvs_srv_gen_params {
    const kvs_model *model;
    const int32_t *prompt; /* with BOS; read by kvs_srv_gen_start only */
    int n_prompt;
    kvs_session_params session;
    kvs_sampler_params sampler;
    int max_tokens;
    int ignore_eos;     /* an end-of-text token is fed back, shown as a line break */
    const char *const *stops; /* must outlive the sequence */
    int n_stops;
    int stop_token;     /* a token that ends the text as EOS does (a chat turn's end), or -1 */
} kvs_srv_gen_params;

typedef struct kvs_srv_gen {
    const kvs_model *model;
    kvs_session *session;
    kvs_sampler *sampler;
    float *logits;
    kvs_srv_stopper stop;
    int n_prompt, n_gen, max_tokens, ignore_eos, stop_token;
    int ctx_left;          /* after the prompt: tokens that may still be generated */
    int prev;              /* the last token, for kvs_token_text */
    const char *finish;    /* NULL while running, then "stop" or "length" */
    double t_start, t_prefilled, t_end; /* seconds (monotonic) */
} kvs_srv_gen;

/* Creates the session, checks the prompt fits, prefills it. Returns 0, or -1 with e set: 400 for
 * the request's fault (a prompt over the context: code context_length_exceeded; KV settings the
 * policy refuses for this prompt), 500 otherwise. g is then empty. */
int kvs_srv_gen_start(kvs_srv_gen *g, const kvs_srv_gen_params *p, kvs_srv_error *e);
/* One decode step: samples a token, appends the text it releases to text (maybe nothing: held
 * back) and feeds the token. stopping: end now with finish "stop" (the server shuts down).
 * Returns 1 while running, 0 once finished (g->finish set, the held text released), -1 with e
 * set on a failure. */
int kvs_srv_gen_step(kvs_srv_gen *g, int stopping, kvs_srv_buf *text, kvs_srv_error *e);
/* KV bytes the sequence holds now, and a full F16 cache of its tokens would. */
size_t kvs_srv_gen_kv_bytes(const kvs_srv_gen *g);
size_t kvs_srv_gen_kv_bytes_full_f16(const kvs_srv_gen *g);
/* Milliseconds of the prompt, of decoding so far; decode tokens per second. */
double kvs_srv_gen_prompt_ms(const kvs_srv_gen *g);
double kvs_srv_gen_decode_ms(const kvs_srv_gen *g);
double kvs_srv_gen_tok_per_s(const kvs_srv_gen *g);
/* Frees the session at once (its KV memory is what the server bounds). */
void kvs_srv_gen_free(kvs_srv_gen *g);

/* Monotonic seconds. */
double kvs_srv_now(void);

#endif
