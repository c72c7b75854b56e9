/* The public API: models, tokens and sessions (model + KV cache + forward-pass state).
 * Every entry point refuses a NULL handle or required pointer with KVS_ERR_ARG, and every
 * fallible one clears the caller's kvs_error first, so a success leaves (KVS_OK, ""). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kernels.h"
#include "core/limits.h"
#include "core/threadpool.h"
#include "kv/kv.h"
#include "model/forward.h"
#include "model/llama.h"
#include "policies/registry.h"
#include "engine/session_internal.h"

struct kvs_session {
    const kvs_model *model;
    kvs_session_params params;
    kvs_pool *pool;
    kvs_kv *kv;
    kvs_forward_buf buf;
    int n_past;        /* tokens seen */
    /* An evicting policy without the recall measurement: the cache stays bounded, so tokens
     * may go on past the context. */
    int unbounded;
    int shift;         /* position shifting on (context_shift or the policy's shift=on) */
    int32_t shifted;   /* total shift: the next token's position is n_past - shifted */
    int past_trained;  /* the notice about positions past the trained context was sent */
};

static void clear_error(kvs_error *err)
{
    if (err) {
        err->code = KVS_OK;
        err->msg[0] = 0;
    }
}

/* One notice line to the session's log callback, if any. */
static void notice(const kvs_session_params *p, const char *fmt, ...) KVS_PRINTF(2, 3);
static void notice(const kvs_session_params *p, const char *fmt, ...)
{
    if (!p->log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->log(p->log_ctx, msg);
}

kvs_status kvs_model_load(const char *path, kvs_model **out, kvs_error *err)
{
    clear_error(err);
    if (out)
        *out = NULL;
    if (!path || !out)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_model_load: %s is NULL", path ? "out" : "path");
    kvs_gguf *g = NULL;
    kvs_status st = kvs_gguf_open(path, &g, err);
    if (st == KVS_ERR_FORMAT && kvs_llama2c_sniff(path))
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s is a llama2.c checkpoint, not a GGUF file; convert it with `kvslim "
                        "convert %s --tokenizer TOK.bin -o OUT.gguf`", path, path);
    if (st != KVS_OK)
        return st;
    return kvs_llama_from_gguf(g, path, out, err);
}

void kvs_model_free(kvs_model *m) { kvs_llama_free(m); }

/* Bytes of a matrix as stored; *elems += its elements. */
static size_t weight_bytes(const kvs_weight *w, int64_t *elems)
{
    uint64_t row = 0;
    kvs_dtype_bytes(w->type, (uint64_t)w->cols, &row);
    *elems += (int64_t)w->rows * w->cols;
    return (size_t)row * (size_t)w->rows;
}

void kvs_model_get_info(const kvs_model *m, kvs_model_info *info)
{
    if (!info)
        return;
    memset(info, 0, sizeof *info);
    info->weight_type = "";
    if (!m)
        return;
    const kvs_hparams *hp = &m->hp;
    info->n_vocab = hp->vocab;
    info->n_ctx = hp->ctx;
    info->dim = hp->dim;
    info->hidden = hp->hidden;
    info->n_layers = hp->n_layers;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->n_params = m->n_params;
    info->weight_type = kvs_dtype_name(m->layers[0].wq.type);
    int64_t matrix_elems = 0;
    size_t bytes = weight_bytes(&m->tok_embd, &matrix_elems);
    if (m->output.data != m->tok_embd.data)
        bytes += weight_bytes(&m->output, &matrix_elems);
    for (int l = 0; l < hp->n_layers; l++) {
        const kvs_layer *L = &m->layers[l];
        const kvs_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++)
            bytes += weight_bytes(w[i], &matrix_elems);
    }
    /* every other parameter is an F32 vector: norms, and the biases and per-head norms of the
     * architectures that have them */
    bytes += sizeof(float) * (size_t)(m->n_params - matrix_elems);
    info->weight_bytes = bytes;
}

int kvs_token_bos(const kvs_model *m) { return m ? kvs_tokenizer_bos(m->tokenizer) : -1; }
int kvs_token_eos(const kvs_model *m) { return m ? kvs_tokenizer_eos(m->tokenizer) : -1; }

kvs_status kvs_tokenize(const kvs_model *m, const char *text, int add_bos, int32_t **ids,
                        int *n_ids, kvs_error *err)
{
    clear_error(err);
    if (ids)
        *ids = NULL;
    if (n_ids)
        *n_ids = 0;
    if (!m || !text || !ids || !n_ids)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_tokenize: %s is NULL",
                        !m ? "the model" : !text ? "text" : !ids ? "ids" : "n_ids");
    return kvs_tokenizer_encode(m->tokenizer, text, add_bos, ids, n_ids, err);
}

kvs_status kvs_tokenize_special(const kvs_model *m, const char *text, int add_bos,
                                int parse_special, int32_t **ids, int *n_ids, kvs_error *err)
{
    clear_error(err);
    if (ids)
        *ids = NULL;
    if (n_ids)
        *n_ids = 0;
    if (!m || !text || !ids || !n_ids)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_tokenize_special: %s is NULL",
                        !m ? "the model" : !text ? "text" : !ids ? "ids" : "n_ids");
    return kvs_tokenizer_encode_ex(m->tokenizer, text, add_bos, parse_special != 0, ids, n_ids,
                                   err);
}

const char *kvs_token_text(const kvs_model *m, int prev, int id, int *len)
{
    int n = 0;
    const char *t = m ? kvs_tokenizer_decode(m->tokenizer, prev, id, &n) : NULL;
    if (!t)
        t = "", n = 0;
    if (len)
        *len = n;
    return t;
}

kvs_session_params kvs_session_default_params(void)
{
    kvs_session_params p = {.n_threads = 1, .n_ctx = 0, .chunk = 512};
    return p;
}

/* Which evicting policies exist, for messages: "streaming, h2o, ...". */
static void evicting_names(char *buf, size_t size)
{
    int n;
    const kvs_policy_type *const *t = kvs_policy_types(&n);
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len < size; i++)
        if (t[i]->kind == KVS_KIND_EVICTING)
            len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", t[i]->name);
}

/* The context rules: an evicting policy (its budget bounds the cache) may run past the
 * context, with or without position shifting; every other policy stops at it. The recall
 * measurement keeps every key, so it keeps the limit too. */
static kvs_status setup_context(kvs_session *s, const kvs_policy_spec *spec, kvs_error *err)
{
    const kvs_policy *pol = kvs_kv_policy(s->kv);
    const int evicting = pol->type->kind == KVS_KIND_EVICTING;
    s->unbounded = evicting && pol->spec.budget > 0 && !s->params.measure_recall;
    s->shift = s->params.context_shift || (spec && spec->shift);
    if (s->shift && !evicting) {
        char names[256];
        evicting_names(names, sizeof names);
        return kvs_fail(err, KVS_ERR_ARG, "position shifting (--context-shift or shift=on) needs "
                        "an evicting KV policy (%s); %s keeps a cache that grows with the "
                        "tokens", names, pol->spec.text);
    }
    if (s->shift && s->params.measure_recall)
        return kvs_fail(err, KVS_ERR_ARG, "position shifting cannot be combined with the "
                        "attention recall measurement, which compares with every key at its "
                        "original position");
    if (s->shift && s->model->rope_div)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "position shifting (--context-shift or "
                        "shift=on) re-rotates keys with unscaled RoPE frequencies, and %s "
                        "scales them (rope_freqs.weight or linear rope scaling)",
                        s->model->path);
    return KVS_OK;
}

kvs_status kvs_session_new(const kvs_model *m, const kvs_session_params *p, kvs_session **out,
                           kvs_error *err)
{
    clear_error(err);
    if (out)
        *out = NULL;
    if (!m || !p || !out)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_session_new: %s is NULL",
                        !m ? "the model" : !p ? "params" : "out");
    if (p->n_threads < 1 || p->n_threads > 256)
        return kvs_fail(err, KVS_ERR_ARG, "threads must be in [1, 256], got %d", p->n_threads);
    if (p->n_ctx < 0 || p->chunk < 0)
        return kvs_fail(err, KVS_ERR_ARG, "context and chunk must not be negative");
    /* Positions past the trained context were never seen in training: refuse them unless the
     * caller asked, and then say so once. */
    if (p->n_ctx > m->hp.ctx && !p->allow_ctx_beyond_trained)
        return kvs_fail(err, KVS_ERR_ARG,
                        "context length %d exceeds the model's trained context of %d tokens; set "
                        "allow_ctx_beyond_trained to use it anyway (quality degrades past %d)",
                        p->n_ctx, m->hp.ctx, m->hp.ctx);
    /* The KV cache is sized from the context (an evicting one holds up to twice it). */
    if (p->n_ctx > KVS_MAX_CTX)
        return kvs_fail(err, KVS_ERR_ARG, "context length %d exceeds kvslim's limit of %d "
                        "tokens", p->n_ctx, KVS_MAX_CTX);
    kvs_session *s = calloc(1, sizeof *s);
    if (!s)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    s->model = m;
    s->params = *p;
    if (s->params.n_ctx == 0)
        s->params.n_ctx = m->hp.ctx;
    if (s->params.chunk == 0)
        s->params.chunk = 512;
    if (s->params.chunk > s->params.n_ctx)
        s->params.chunk = s->params.n_ctx;
    kvs_kv_config cfg = {m->hp.n_layers, m->hp.n_heads, m->hp.n_kv_heads, m->hp.head_dim,
                         s->params.n_ctx, KVS_F32, p->measure_recall};
    kvs_status st = KVS_OK;
    kvs_policy_spec spec;
    kvs_kivi_cfg kivi = {0, 0, 0, 0};
    int is_kivi = p->kv_type ? kvs_kivi_parse(p->kv_type, &kivi, err) : 0;
    if (is_kivi < 0)
        st = KVS_ERR_ARG;
    else if (is_kivi)
        cfg.type = KVS_F16; /* the residual's type */
    else if (p->kv_type && kvs_dtype_parse(p->kv_type, &cfg.type) != 0)
        st = kvs_fail(err, KVS_ERR_ARG, "--kv-type: unknown type '%s' (f32, f16, kivi4, kivi2 "
                      "or kivi:kbits=B,vbits=B,group=G,residual=R)", p->kv_type);
    if (st == KVS_OK) /* no policy: the full cache, the "full" policy */
        st = kvs_policy_parse(p->kv_policy ? p->kv_policy : "full", &spec, err);
    if (st == KVS_OK)
        st = kvs_kv_new(&cfg, &spec, &s->kv, err);
    if (st == KVS_OK && is_kivi)
        st = kvs_kv_set_kivi(s->kv, &kivi, err);
    if (st == KVS_OK)
        st = setup_context(s, &spec, err);
    if (st == KVS_OK && is_kivi && s->shift)
        st = kvs_fail(err, KVS_ERR_ARG, "--kv-type %s: position shifting (--context-shift or "
                      "shift=on) cannot re-rotate KIVI-quantised keys; use --kv-type f16 or f32 "
                      "with it", p->kv_type);
    if (st == KVS_OK && !(s->pool = kvs_pool_create(p->n_threads)))
        st = kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    if (st == KVS_OK)
        st = kvs_forward_buf_init(&s->buf, &m->hp, s->params.chunk, err);
    s->buf.exact_matmul = p->exact_matmul != 0;
    if (st != KVS_OK) {
        kvs_session_free(s);
        return st;
    }
    if (p->n_ctx > m->hp.ctx)
        notice(p, "context length %d is beyond the model's trained context of %d tokens: "
               "positions past %d were never trained and quality degrades", p->n_ctx,
               m->hp.ctx, m->hp.ctx);
    *out = s;
    return KVS_OK;
}

void kvs_session_free(kvs_session *s)
{
    if (!s)
        return;
    kvs_forward_buf_free(&s->buf);
    kvs_kv_free(s->kv);
    kvs_pool_destroy(s->pool);
    free(s);
}

/* Forgets every token; release: also gives the KV cache's memory back. */
static void start_over(kvs_session *s, int release)
{
    kvs_kv_reset(s->kv, release);
    s->n_past = 0;
    s->shifted = 0;
    s->past_trained = 0;
}

void kvs_session_reset(kvs_session *s)
{
    if (s)
        start_over(s, 0);
}

int kvs_session_ctx_left(const kvs_session *s)
{
    return s->unbounded ? INT32_MAX - s->n_past : s->params.n_ctx - s->n_past;
}

/* Before a batch at position next of an unbounded session: with shifting, shifts when the
 * batch would reach the context (or takes only what fits before it) and returns the batch
 * that fits; without, sends the notice once when positions pass the trained context. */
static kvs_status place_batch(kvs_session *s, int *batch, kvs_error *err)
{
    const int n_ctx = s->params.n_ctx, trained = s->model->hp.ctx;
    int32_t next = s->n_past - s->shifted;
    if (s->shift && next + *batch > n_ctx) {
        if (next >= n_ctx) {
            const kvs_hparams *hp = &s->model->hp;
            const kvs_rope_cfg rope = {hp->rot_dim, hp->rope_base, hp->rope_neox};
            int32_t delta = 0;
            kvs_status st = kvs_kv_shift(s->kv, next, &rope, &delta, err);
            if (st != KVS_OK)
                return st;
            s->shifted += delta;
            next -= delta;
            if (next >= n_ctx) /* the budget was checked at the prompt; defensive */
                return kvs_fail(err, KVS_ERR_ARG, "--kv %s: position shifting found no room "
                                "for a new token in the context of %d",
                                kvs_kv_policy(s->kv)->spec.text, n_ctx);
        }
        if (*batch > n_ctx - next)
            *batch = n_ctx - next;
    }
    if (!s->past_trained && next + *batch > trained) {
        s->past_trained = 1;
        const int32_t first = next > trained ? next : trained;
        if (s->shift)
            notice(&s->params, "position %d is past the model's trained context of %d (the session's "
                   "context is %d)", first, trained, n_ctx);
        else
            notice(&s->params, "position %d is past the model's trained context of %d; enable position "
                   "shifting (shift=on or --context-shift) to stay inside it", first, trained);
    }
    return KVS_OK;
}

/* A fractional budget below what the policy's protected tokens need is raised for this prompt
 * (kvs_policy_budget_slots); say so. */
static void budget_notice(const kvs_session *s, int n_prompt)
{
    char msg[512];
    if (s->params.log &&
        kvs_policy_budget_notice(&kvs_kv_policy(s->kv)->spec, n_prompt, msg, sizeof msg))
        s->params.log(s->params.log_ctx, msg);
}

/* A batch failed part way (out of memory, a non-finite key, a shift out of range): some layers
 * may hold its tokens and others not, and an evicting policy may have stored a chunk it could
 * not trim. Nothing of that can be continued, so the session starts over, holding no slots
 * (kvs_session_eval's contract); the error says why. */
static kvs_status fail_midway(kvs_session *s, kvs_status st)
{
    start_over(s, 1); /* and the memory back: the failure may have been its lack */
    return st;
}

kvs_status kvs_session_eval(kvs_session *s, const int32_t *tokens, int n, float *logits,
                            int all_logits, kvs_error *err)
{
    clear_error(err);
    if (!s || !tokens)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_session_eval: %s is NULL",
                        !s ? "the session" : "tokens");
    const int vocab = s->model->hp.vocab;
    if (n <= 0)
        return kvs_fail(err, KVS_ERR_ARG, "no tokens to evaluate");
    if (s->unbounded && n > INT32_MAX - s->n_past)
        return kvs_fail(err, KVS_ERR_ARG, "%d tokens after %d exceed the %d a session counts",
                        n, s->n_past, INT32_MAX);
    if (!s->unbounded && n > s->params.n_ctx - s->n_past)
        return s->n_past == 0
                   ? kvs_fail(err, KVS_ERR_ARG, "a prompt of %d tokens exceeds the context "
                              "length %d", n, s->params.n_ctx)
                   : kvs_fail(err, KVS_ERR_ARG, "%d tokens after %d exceed the context length "
                              "%d", n, s->n_past, s->params.n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return kvs_fail(err, KVS_ERR_ARG,
                            "token id %d (at index %d) is outside the vocabulary [0, %d)",
                            tokens[i], i, vocab);
    int prompt = s->n_past == 0;
    if (prompt) {
        budget_notice(s, n);
        kvs_status st = kvs_kv_begin_prompt(s->kv, n, err);
        if (st != KVS_OK)
            return st;
        /* Shifting keeps every kept slot and the new token inside the context. */
        const kvs_policy *pol = kvs_kv_policy(s->kv);
        if (s->shift && pol->budget >= s->params.n_ctx)
            return kvs_fail(err, KVS_ERR_ARG, "--kv %s: position shifting needs a budget below "
                            "the context: %d slots leave no room for a new token in a context "
                            "of %d", pol->spec.text, pol->budget, s->params.n_ctx);
    }
    for (int done = 0; done < n;) {
        int batch = !prompt ? 1 : n - done < s->buf.cap ? n - done : s->buf.cap;
        if (prompt) { /* the KV policy may take fewer at a time (e.g. one token per batch) */
            int lim = kvs_kv_prompt_batch(s->kv);
            batch = batch < lim ? batch : lim;
        }
        if (s->unbounded) {
            kvs_status st = place_batch(s, &batch, err);
            if (st != KVS_OK)
                return fail_midway(s, st);
        }
        int last = done + batch == n;
        float *out = NULL;
        if (logits && all_logits)
            out = logits + (size_t)done * vocab;
        else if (logits && last)
            out = logits;
        kvs_status st = kvs_forward(s->model, s->pool, s->kv, &s->buf, tokens + done, batch,
                                    s->n_past - s->shifted, out, all_logits, err);
        if (st != KVS_OK)
            return fail_midway(s, st);
        s->n_past += batch;
        done += batch;
    }
    return KVS_OK;
}

int kvs_session_n_past(const kvs_session *s) { return s ? s->n_past : 0; }
size_t kvs_session_kv_peak_bytes(const kvs_session *s) { return s ? kvs_kv_peak_bytes(s->kv) : 0; }

void kvs_session_last_step(const kvs_session *s, kvs_step_stats *st)
{
    if (!st)
        return;
    if (!s) {
        memset(st, 0, sizeof *st);
        return;
    }
    kvs_kv_step_stats k;
    kvs_kv_last_step(s->kv, &k);
    st->slots_attended = k.slots_attended;
    st->attn_recall = k.attn_recall;
}

void kvs_kv_policy_help(FILE *f)
{
    if (f)
        kvs_policy_help(f);
}

kvs_status kvs_kv_policy_check(const char *spec, kvs_error *err)
{
    clear_error(err);
    if (!spec)
        return kvs_fail(err, KVS_ERR_ARG, "kvs_kv_policy_check: spec is NULL");
    kvs_policy_spec parsed;
    return kvs_policy_parse(spec, &parsed, err);
}
size_t kvs_session_kv_bytes(const kvs_session *s) { return s ? kvs_kv_bytes(s->kv) : 0; }
size_t kvs_session_kv_bytes_full_f16(const kvs_session *s)
{
    return s ? kvs_kv_bytes_full_f16(s->kv, s->n_past) : 0;
}

kvs_kv *kvs_session_kv(kvs_session *s) { return s->kv; }

int kvs_session_policy_report(kvs_session *s, int i, char *buf, size_t size)
{
    const kvs_policy *p = kvs_kv_policy(s->kv);
    if (size > 0)
        buf[0] = 0;
    return p && p->type->report ? p->type->report(p, i, buf, size) : -1;
}
