/* Retrieval evaluation on the recall model: answer-file parsing, prompt checks, one run
 * (see recall.h). */
#include "eval/recall.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/number.h"
#include "engine/session_internal.h"
#include "kv/kv.h"
#include "kv/kv_store.h"

void kvs_recall_prompt_free(kvs_recall_prompt *p)
{
    if (!p)
        return;
    free(p->tokens);
    free(p->answers);
    memset(p, 0, sizeof *p);
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Copies the next blank-separated word of [*s, end) into buf; 0 if there is none or it does
 * not fit. */
static int next_word(const char **s, const char *end, char *buf, size_t size)
{
    const char *p = *s;
    while (p < end && is_blank(*p))
        p++;
    const char *w = p;
    while (p < end && !is_blank(*p))
        p++;
    *s = p;
    size_t len = (size_t)(p - w);
    if (len == 0 || len >= size)
        return 0;
    memcpy(buf, w, len);
    buf[len] = 0;
    return 1;
}

kvs_status kvs_recall_parse_answers(const char *text, const char *path, kvs_recall_answer **out,
                                    int *n, kvs_error *err)
{
    *out = NULL;
    *n = 0;
    kvs_recall_answer *v = NULL;
    int count = 0, cap = 0, line = 0;
    for (const char *p = text; *p;) {
        line++;
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        const char *s = p;
        p = eol ? eol + 1 : end;
        while (s < end && is_blank(*s))
            s++;
        if (s == end)
            continue; /* a blank line */
        char a[32], b[32], extra[2];
        int64_t pos, id;
        const char *q = s;
        if (!next_word(&q, end, a, sizeof a) || !next_word(&q, end, b, sizeof b) ||
            next_word(&q, end, extra, sizeof extra) || q < end ||
            kvs_parse_i64(a, 0, INT32_MAX, &pos) != 0 ||
            kvs_parse_i64(b, 0, INT32_MAX, &id) != 0) {
            free(v);
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "%s:%d: expected 'POS ID' (two non-negative whole numbers: the "
                            "position fed and the answer's token id), got '%.*s'", path, line,
                            (int)(end - s > 60 ? 60 : end - s), s);
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 8;
            kvs_recall_answer *nv = realloc(v, sizeof *nv * (size_t)cap);
            if (!nv) {
                free(v);
                return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
            }
            v = nv;
        }
        v[count++] = (kvs_recall_answer){(int)pos, (int32_t)id};
    }
    if (count == 0) {
        free(v);
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: no answer line ('POS ID')", path);
    }
    *out = v;
    *n = count;
    return KVS_OK;
}

kvs_status kvs_recall_prompt_check(kvs_recall_prompt *p, int n_vocab, int n_ctx, int32_t q_id,
                                   const char *tokens_path, const char *answer_path,
                                   kvs_error *err)
{
    if (p->n_tokens > n_ctx)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: %d tokens exceed the model's context of %d",
                        tokens_path, p->n_tokens, n_ctx);
    int context = -1;
    for (int i = 0; i < p->n_tokens; i++) {
        if (p->tokens[i] < 0 || p->tokens[i] >= n_vocab)
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "%s: token id %d (token %d of the file) is outside the model's "
                            "vocabulary [0, %d)", tokens_path, p->tokens[i], i + 1, n_vocab);
        if (context < 0 && p->tokens[i] == q_id)
            context = i;
    }
    if (context < 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s: no question token Q (id %d): the context is every token before "
                        "the first Q", tokens_path, q_id);
    if (context == 0)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "%s: the first token is Q (id %d): no context before the question",
                        tokens_path, q_id);
    for (int a = 0; a < p->n_answers; a++) {
        const kvs_recall_answer *x = &p->answers[a];
        if (x->pos < context || x->pos >= p->n_tokens)
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "%s: answer %d: position %d is outside the decoded part [%d, %d] of "
                            "%s (the context, before the first Q, is prefilled and not scored)",
                            answer_path, a + 1, x->pos, context, p->n_tokens - 1, tokens_path);
        if (x->id >= n_vocab)
            return kvs_fail(err, KVS_ERR_FORMAT,
                            "%s: answer %d: token id %d is outside the model's vocabulary "
                            "[0, %d)", answer_path, a + 1, (int)x->id, n_vocab);
    }
    p->context = context;
    return KVS_OK;
}

double kvs_recall_margin(const float *logits, int n, int32_t id)
{
    double best_other = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != id && logits[i] > best_other)
            best_other = logits[i];
    return (double)logits[id] - best_other;
}

/* Field col (0-based) of the tab-separated line [p, end) into buf; 0 if missing or too long. */
static int tsv_field(const char *p, const char *end, int col, char *buf, size_t size)
{
    for (int c = 0; c < col; c++) {
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        if (!tab)
            return 0;
        p = tab + 1;
    }
    const char *tab = memchr(p, '\t', (size_t)(end - p));
    const char *fe = tab ? tab : end;
    while (fe > p && fe[-1] == '\r')
        fe--;
    if ((size_t)(fe - p) >= size)
        return 0;
    memcpy(buf, p, (size_t)(fe - p));
    buf[fe - p] = 0;
    return 1;
}

kvs_status kvs_recall_manifest_find(const char *text, const char *path, const char *name,
                                    double *depth, int *distance, kvs_error *err)
{
    *depth = -1;
    *distance = -1;
    static const char *const want[3] = {"name", "depth", "distance"};
    int col[3] = {-1, -1, -1};
    const char *eol = strchr(text, '\n');
    const char *end = eol ? eol : text + strlen(text);
    char f[128];
    for (int c = 0; tsv_field(text, end, c, f, sizeof f); c++)
        for (int k = 0; k < 3; k++)
            if (col[k] < 0 && !strcmp(f, want[k]))
                col[k] = c;
    for (int k = 0; k < 3; k++)
        if (col[k] < 0)
            return kvs_fail(err, KVS_ERR_FORMAT, "%s:1: no '%s' column in the header", path,
                            want[k]);
    int line = 1;
    for (const char *p = eol ? eol + 1 : end; *p;) {
        line++;
        eol = strchr(p, '\n');
        end = eol ? eol : p + strlen(p);
        const char *row = p;
        p = eol ? eol + 1 : end;
        if (end == row || (end - row == 1 && *row == '\r'))
            continue;
        char d[64], n[64];
        int64_t dist;
        if (!tsv_field(row, end, col[0], f, sizeof f) || !tsv_field(row, end, col[1], d, sizeof d) ||
            !tsv_field(row, end, col[2], n, sizeof n))
            return kvs_fail(err, KVS_ERR_FORMAT, "%s:%d: fewer fields than the header names",
                            path, line);
        if (strcmp(f, name))
            continue;
        if (kvs_parse_f64(d, 0, 1, depth) != 0 || kvs_parse_i64(n, 0, INT32_MAX, &dist) != 0) {
            *depth = -1;
            return kvs_fail(err, KVS_ERR_FORMAT, "%s:%d: depth '%s' (0 to 1) or distance '%s' "
                            "(a whole number) is not a number", path, line, d, n);
        }
        *distance = (int)dist;
        return KVS_OK;
    }
    return KVS_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The answer at position pos, or -1 (answers are few: a linear scan). */
static int answer_at(const kvs_recall_prompt *p, int pos, int from)
{
    for (int a = from; a < p->n_answers; a++)
        if (p->answers[a].pos == pos)
            return a;
    return -1;
}

/* Scores the answers at position t against this step's logits. */
static void score(const kvs_recall_prompt *p, int t, const float *logits, int V,
                  kvs_recall_result *r)
{
    for (int a = answer_at(p, t, 0); a >= 0; a = answer_at(p, t, a + 1)) {
        const int32_t id = p->answers[a].id;
        double m = kvs_recall_margin(logits, V, id);
        r->n_answers++;
        /* the argmax, first on ties: right only when the answer beats every other token or
         * ties only with later ids */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = i;
        r->n_correct += best == id;
        if (r->n_answers <= KVS_RECALL_SHOWN)
            r->predicted[r->n_answers - 1] = best;
        r->margin_sum += m;
        if (r->n_answers == 1 || m < r->margin_min)
            r->margin_min = m;
    }
}

/* Whether a head holds position x (its slots may be out of position order: kv_store.h). */
static int holds(const int32_t *pos, int n, int32_t x)
{
    for (int i = 0; i < n; i++)
        if (pos[i] == x)
            return 1;
    return 0;
}

/* r->needle_kept right after the context (kvs_recall_result). */
static void needle_kept(const kvs_kv *kv, const kvs_recall_prompt *p, int n_kv_heads,
                        kvs_recall_result *r)
{
    const kvs_store *store = kvs_kv_store(kv);
    const kvs_policy_kind kind = kvs_kv_policy(kv)->type->kind;
    const int32_t needle = p->n_answers > 0 && p->distance >= 0 ? p->answers[0].pos - p->distance
                                                                 : -1;
    for (int l = 0; l < r->n_layer_shares; l++) {
        int held = 0, empty = 1;
        for (int h = 0; h < n_kv_heads; h++) {
            const int n = kvs_store_count(store, l, h);
            empty &= n == 0;
            held += holds(kvs_store_pos(store, l, h), n, needle);
        }
        if (needle < 0)
            r->needle_kept[l] = -1;
        else if (kind == KVS_KIND_OFFLOADING || (kind == KVS_KIND_MERGING && empty))
            r->needle_kept[l] = 1;
        else
            r->needle_kept[l] = (double)held / n_kv_heads;
    }
}

kvs_status kvs_recall_run(const kvs_model *m, const kvs_recall_setup *s, const char *spec,
                          const kvs_recall_prompt *p, kvs_recall_result *r, kvs_error *err)
{
    memset(r, 0, sizeof *r);
    if (p->context < 1 || p->context >= p->n_tokens)
        return kvs_fail(err, KVS_ERR_ARG, "prompt %s: not checked (context %d of %d tokens)",
                        p->name, p->context, p->n_tokens);
    kvs_model_info info;
    kvs_model_get_info(m, &info);
    const int V = info.n_vocab, C = p->context, T = p->n_tokens;
    kvs_session_params sp = kvs_session_default_params();
    sp.n_threads = s->n_threads;
    if (s->chunk > 0)
        sp.chunk = s->chunk;
    sp.kv_policy = spec;
    sp.kv_type = s->kv_type;
    sp.log = s->log;
    sp.log_ctx = s->log_ctx;
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!logits)
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory");
    kvs_session *sess = NULL;
    double t0 = now();
    kvs_status st = kvs_session_new(m, &sp, &sess, err);
    if (st == KVS_OK)
        st = kvs_session_eval(sess, p->tokens, C, NULL, 0, err);
    r->n_layer_shares = info.n_layers < KVS_RECALL_MAX_LAYERS ? info.n_layers : KVS_RECALL_MAX_LAYERS;
    if (st == KVS_OK) {
        const kvs_store *store = kvs_kv_store(kvs_session_kv(sess));
        r->slots_kept = (int)(kvs_store_total_slots(store) /
                              ((size_t)info.n_layers * (size_t)info.n_kv_heads));
        needle_kept(kvs_session_kv(sess), p, info.n_kv_heads, r);
    }
    double attended = 0, share = 0, bytes = 0;
    for (int t = C; t < T && st == KVS_OK; t++) {
        if ((st = kvs_session_eval(sess, p->tokens + t, 1, logits, 0, err)) != KVS_OK)
            break;
        kvs_step_stats ss;
        kvs_session_last_step(sess, &ss);
        attended += ss.slots_attended;
        share += ss.slots_attended / (double)(t + 1); /* t + 1 tokens seen, this one included */
        for (int l = 0; l < r->n_layer_shares; l++)
            r->layer_share[l] += kvs_kv_last_step_layer(kvs_session_kv(sess), l) / (double)(t + 1);
        size_t b = kvs_session_kv_bytes(sess);
        bytes += (double)b;
        if (b > r->kv_bytes_max)
            r->kv_bytes_max = b;
        score(p, t, logits, V, r);
    }
    if (st == KVS_OK) {
        r->n_steps = T - C;
        r->slots_attended = attended / r->n_steps;
        r->attended_share = share / r->n_steps;
        for (int l = 0; l < r->n_layer_shares; l++)
            r->layer_share[l] /= r->n_steps;
        r->kv_bytes_mean = bytes / r->n_steps;
        r->seconds = now() - t0;
    }
    kvs_session_free(sess);
    free(logits);
    return st;
}
