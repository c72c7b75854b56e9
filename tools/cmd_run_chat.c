/* kvslim run --chat: a conversation on stdin/stdout over one session whose KV cache persists,
 * so each turn feeds only its own tokens (the chat template's text for the new user message,
 * closing the previous reply first), never the conversation again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_flags.h"
#include "kvslim_tools.h"

typedef struct chat_state {
    const kvs_model *m;
    kvs_session *s;
    kvs_sampler *sampler;
    float *logits;
    kvs_chat_template tpl;
    int end_token;          /* the turn end as one token, or -1 */
    int n_predict, ignore_eos;
    int turns;              /* user turns fed so far */
    int n_prompt, n_gen;    /* totals over the conversation, for the stats line */
    double t_prefill, t_decode;
    int context_full;       /* the last reply stopped because the context was full */
    int turn_fed, turn_before, turn_gen; /* the last turn: its tokens, the session's before */
} chat_state;

/* Feeds the user turn: the template's text (closing the previous reply, after the system message
 * on the first turn), tokenized with special-token parsing so markers are single tokens; BOS
 * only at the conversation's start. */
static kvs_status feed_turn(chat_state *c, const char *system, const char *user, kvs_error *err)
{
    kvs_chat_message msgs[2];
    int n = 0;
    if (c->turns == 0 && system)
        msgs[n++] = (kvs_chat_message){"system", system};
    msgs[n++] = (kvs_chat_message){"user", user};
    int flags = KVS_CHAT_ADD_ASSISTANT | (c->turns > 0 ? KVS_CHAT_CLOSE_REPLY : 0);
    char *text = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    kvs_status st = kvs_chat_apply(c->tpl, msgs, n, flags, &text, err);
    if (st == KVS_OK)
        st = kvs_tokenize_special(c->m, text, c->turns == 0, 1, &ids, &n_ids, err);
    free(text);
    if (st != KVS_OK)
        return st;
    int before = kvs_session_n_past(c->s), room = kvs_session_ctx_left(c->s);
    if (n_ids > room) {
        free(ids);
        return kvs_fail(err, KVS_ERR_ARG, "turn %d is %d tokens and the context has room for %d "
                        "more (it holds %d): start a new chat, or use -c or an evicting --kv "
                        "policy", c->turns + 1, n_ids, room, before);
    }
    double t0 = cli_now();
    st = kvs_session_eval(c->s, ids, n_ids, c->logits, 0, err);
    free(ids);
    if (st != KVS_OK)
        return st;
    c->t_prefill += cli_now() - t0;
    c->n_prompt += n_ids;
    c->turns++;
    c->turn_fed = n_ids;
    c->turn_before = before;
    return KVS_OK;
}

/* Generates the reply to stdout up to -n tokens, the turn's end, EOS/BOS or a full context.
 * Every printed token is fed, so the next turn continues right after it. */
static kvs_status reply(chat_state *c, kvs_error *err)
{
    int prev = -1, n = 0;
    c->context_full = 0;
    double t0 = cli_now();
    kvs_status st = KVS_OK;
    for (; n < c->n_predict; n++) {
        int32_t tok = kvs_sampler_sample(c->sampler, c->logits);
        if (tok == c->end_token)
            break;
        int eos = tok == kvs_token_eos(c->m) || tok == kvs_token_bos(c->m);
        if (eos && !c->ignore_eos)
            break;
        if (kvs_session_ctx_left(c->s) < 1) {
            c->context_full = 1;
            break;
        }
        int len = 1;
        const char *piece = eos ? "\n" : kvs_token_text(c->m, prev, tok, &len);
        fwrite(piece, 1, (size_t)len, stdout);
        fflush(stdout);
        prev = tok;
        if ((st = kvs_session_eval(c->s, &tok, 1, c->logits, 0, err)) != KVS_OK)
            break;
    }
    fputc('\n', stdout);
    fflush(stdout);
    c->t_decode += cli_now() - t0;
    c->n_gen += n;
    c->turn_gen = n;
    return st;
}

/* One user turn per line of stdin (the prompt, if given, first); blank lines are skipped. */
int cli_run_chat(const cli_args *a, const kvs_session_params *params, const char *first)
{
    const char *cmd = "run", *system = a->str[FL_SYSTEM];
    chat_state c = {.n_predict = cli_get_int(a, FL_N_PREDICT, 256),
                    .ignore_eos = a->given[FL_IGNORE_EOS] > 0};
    kvs_sampler_params sp = {.temperature = (float)cli_get_f64(a, FL_TEMP, 0.8),
                             .top_k = cli_get_int(a, FL_TOP_K, 40),
                             .top_p = (float)cli_get_f64(a, FL_TOP_P, 0.95),
                             .seed = a->given[FL_SEED] ? (uint64_t)a->i[FL_SEED] : 42};
    kvs_error err = {0};
    kvs_status st = KVS_OK;
    kvs_model *m = NULL;
    kvs_model_info info;
    char *line = NULL;
    size_t cap = 0;
    int rc = CLI_FAIL, interactive = isatty(STDIN_FILENO);

    kvs_chat_template forced = KVS_CHAT_DEFAULT;
    if (a->str[FL_CHAT_TEMPLATE] &&
        (st = kvs_chat_template_by_name(a->str[FL_CHAT_TEMPLATE], &forced, &err)) != KVS_OK)
        goto fail; /* KVS_ERR_ARG: bad usage */
    if ((st = kvs_model_load(a->str[FL_MODEL], &m, &err)) != KVS_OK)
        goto fail;
    kvs_model_get_info(m, &info);
    c.m = m;
    c.tpl = a->str[FL_CHAT_TEMPLATE] ? forced : kvs_chat_template_detect(m);
    c.end_token = kvs_chat_turn_end_token(m, c.tpl);
    if ((st = kvs_session_new(m, params, &c.s, &err)) != KVS_OK ||
        (st = kvs_sampler_new(info.n_vocab, &sp, &c.sampler, &err)) != KVS_OK)
        goto fail;
    if (!(c.logits = malloc(sizeof(float) * (size_t)info.n_vocab))) {
        st = kvs_fail(&err, KVS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    fprintf(stderr, "kvslim run: chat template %s%s\n", kvs_chat_template_name(c.tpl),
            interactive ? " (one line per turn; end with Ctrl-D)" : "");
    for (;;) {
        const char *user = first;
        first = NULL;
        if (!user) {
            if (interactive) {
                fputs("> ", stderr);
                fflush(stderr);
            }
            ssize_t got = getline(&line, &cap, stdin);
            if (got < 0)
                break;
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
                line[--got] = '\0';
            if (got == 0)
                continue;
            user = line;
        }
        if ((st = feed_turn(&c, system, user, &err)) != KVS_OK || (st = reply(&c, &err)) != KVS_OK)
            goto fail;
        /* Shows that a turn feeds only its own tokens: the session held the earlier turns. */
        fprintf(stderr, "kvslim run: turn %d: fed %d new tokens after %d in the session, replied "
                "with %d\n", c.turns, c.turn_fed, c.turn_before, c.turn_gen);
        if (c.context_full) {
            fprintf(stderr, "kvslim run: stopped: the context of %d tokens is full\n",
                    params->n_ctx ? params->n_ctx : info.n_ctx);
            break;
        }
    }
    if (ferror(stdin)) {
        st = kvs_fail(&err, KVS_ERR_IO, "reading standard input failed");
        goto fail;
    }
    cli_print_run_stats(c.s, params->kv_type, c.n_prompt, c.n_gen, c.t_prefill, c.t_decode);
    rc = CLI_OK;
fail:
    if (rc != CLI_OK) {
        cli_error(cmd, "%s", err.msg);
        rc = cli_status_exit(st);
        /* a turn over the context is the conversation's limit, not bad usage of the flags */
        if (c.turns > 0)
            rc = CLI_FAIL;
    }
    free(line);
    free(c.logits);
    kvs_sampler_free(c.sampler);
    kvs_session_free(c.s);
    kvs_model_free(m);
    return rc;
}
