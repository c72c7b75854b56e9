/* Chat templates (kvslim.h): a conversation as the prompt text a chat model was trained on, in
 * one of a few formats written out here; the GGUF's Jinja template only chooses the format
 * (by its markers), since running Jinja would need an interpreter for a handful of layouts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

/* A growing NUL-terminated string; failed is sticky so callers check once at the end. */
typedef struct {
    char *p;
    size_t n, cap;
    int failed;
} text_buf;

static void put(text_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->failed = 1;
            return;
        }
        if (b->p && (size_t)w < b->cap - b->n) {
            b->n += (size_t)w;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n <= (size_t)w)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

kvs_chat_template kvs_chat_template_from_text(const char *jinja)
{
    if (!jinja)
        return KVS_CHAT_DEFAULT;
    if (strstr(jinja, "<|start_header_id|>"))
        return KVS_CHAT_LLAMA3;
    if (strstr(jinja, "<|im_start|>"))
        return KVS_CHAT_CHATML;
    if (strstr(jinja, "<|assistant|>") && strstr(jinja, "<|end|>"))
        return KVS_CHAT_PHI3;
    if (strstr(jinja, "[INST]"))
        return KVS_CHAT_LLAMA2;
    return KVS_CHAT_DEFAULT;
}

kvs_chat_template kvs_chat_template_detect(const kvs_model *m)
{
    int n = kvs_model_meta_str(m, "tokenizer.chat_template", NULL, 0);
    if (n <= 0)
        return KVS_CHAT_DEFAULT;
    char *tpl = malloc((size_t)n + 1);
    if (!tpl) /* detection is best effort: the default template still works */
        return KVS_CHAT_DEFAULT;
    kvs_model_meta_str(m, "tokenizer.chat_template", tpl, (size_t)n + 1);
    kvs_chat_template t = kvs_chat_template_from_text(tpl);
    free(tpl);
    return t;
}

const char *kvs_chat_template_name(kvs_chat_template t)
{
    switch (t) {
    case KVS_CHAT_LLAMA3:
        return "llama3";
    case KVS_CHAT_CHATML:
        return "chatml";
    case KVS_CHAT_PHI3:
        return "phi3";
    case KVS_CHAT_LLAMA2:
        return "llama2";
    case KVS_CHAT_DEFAULT:
        break;
    }
    return "default";
}

kvs_status kvs_chat_template_by_name(const char *name, kvs_chat_template *out, kvs_error *err)
{
    if (err)
        err->code = KVS_OK, err->msg[0] = 0;
    const kvs_chat_template all[] = {KVS_CHAT_DEFAULT, KVS_CHAT_LLAMA3, KVS_CHAT_CHATML,
                                     KVS_CHAT_PHI3, KVS_CHAT_LLAMA2};
    for (size_t i = 0; name && out && i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, kvs_chat_template_name(all[i]))) {
            *out = all[i];
            return KVS_OK;
        }
    return kvs_fail(err, KVS_ERR_ARG, "unknown chat template '%s': the templates are default, "
                    "llama3, chatml, phi3 and llama2", name ? name : "(null)");
}

const char *kvs_chat_turn_end(kvs_chat_template t)
{
    switch (t) {
    case KVS_CHAT_LLAMA3:
        return "<|eot_id|>";
    case KVS_CHAT_CHATML:
        return "<|im_end|>";
    case KVS_CHAT_PHI3:
        return "<|end|>";
    case KVS_CHAT_LLAMA2:
        return "</s>";
    case KVS_CHAT_DEFAULT:
        break;
    }
    return NULL;
}

/* What follows an assistant reply's last token to close its turn: the end marker and the
 * separator the template writes after it. */
static const char *close_text(kvs_chat_template t)
{
    switch (t) {
    case KVS_CHAT_LLAMA3:
        return "<|eot_id|>";
    case KVS_CHAT_CHATML:
        return "<|im_end|>\n";
    case KVS_CHAT_PHI3:
        return "<|end|>\n";
    case KVS_CHAT_LLAMA2:
        return "</s>";
    case KVS_CHAT_DEFAULT:
        break;
    }
    return "\n";
}

static int valid_template(kvs_chat_template t)
{
    return t == KVS_CHAT_DEFAULT || t == KVS_CHAT_LLAMA3 || t == KVS_CHAT_CHATML ||
           t == KVS_CHAT_PHI3 || t == KVS_CHAT_LLAMA2;
}

/* Llama-2: a system message goes inside the next [INST] (<<SYS>> block); every user turn but
 * the text's first starts with <s>, the BOS the tokenizer adds standing for the first. */
static void put_llama2(text_buf *b, const kvs_chat_message *msgs, int n, const char **sys)
{
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!strcmp(role, "system")) {
            *sys = c;
        } else if (!strcmp(role, "assistant")) {
            put(b, " %s</s>", c);
        } else {
            put(b, "%s[INST] ", b->n ? "<s>" : "");
            if (*sys)
                put(b, "<<SYS>>\n%s\n<</SYS>>\n\n", *sys);
            *sys = NULL;
            put(b, "%s [/INST]", c);
        }
    }
}

kvs_status kvs_chat_apply(kvs_chat_template t, const kvs_chat_message *msgs, int n, int flags,
                          char **out, kvs_error *err)
{
    if (err)
        err->code = KVS_OK, err->msg[0] = 0;
    if (out)
        *out = NULL;
    if (!out || n < 0 || (n > 0 && !msgs))
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chat_apply: %s",
                        !out ? "out is NULL" : n < 0 ? "negative message count" : "msgs is NULL");
    if (!valid_template(t))
        return kvs_fail(err, KVS_ERR_ARG, "kvs_chat_apply: unknown template %d", (int)t);
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return kvs_fail(err, KVS_ERR_ARG, "kvs_chat_apply: message %d has a NULL %s", i,
                            !msgs[i].role ? "role" : "content");
    text_buf b = {0};
    put(&b, "%s", ""); /* an empty conversation is "" rather than NULL */
    if (flags & KVS_CHAT_CLOSE_REPLY)
        put(&b, "%s", close_text(t));
    const char *sys = NULL;
    if (t == KVS_CHAT_LLAMA2)
        put_llama2(&b, msgs, n, &sys);
    for (int i = 0; t != KVS_CHAT_LLAMA2 && i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        switch (t) {
        case KVS_CHAT_LLAMA3:
            put(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", role, c);
            break;
        case KVS_CHAT_CHATML:
            put(&b, "<|im_start|>%s\n%s<|im_end|>\n", role, c);
            break;
        case KVS_CHAT_PHI3:
            put(&b, "<|%s|>\n%s<|end|>\n", role, c);
            break;
        default:
            put(&b, "%s: %s\n", role, c);
            break;
        }
    }
    if (flags & KVS_CHAT_ADD_ASSISTANT) {
        switch (t) {
        case KVS_CHAT_LLAMA3:
            put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            break;
        case KVS_CHAT_CHATML:
            put(&b, "<|im_start|>assistant\n");
            break;
        case KVS_CHAT_PHI3:
            put(&b, "<|assistant|>\n");
            break;
        case KVS_CHAT_LLAMA2:
            break; /* the reply follows [/INST] directly */
        case KVS_CHAT_DEFAULT:
            put(&b, "assistant:");
            break;
        }
    }
    if (b.failed) {
        free(b.p);
        return kvs_fail(err, KVS_ERR_NOMEM, "kvs_chat_apply: out of memory");
    }
    *out = b.p;
    return KVS_OK;
}

int kvs_chat_turn_end_token(const kvs_model *m, kvs_chat_template t)
{
    const char *end = kvs_chat_turn_end(t);
    if (!m || !end)
        return -1;
    int32_t *ids = NULL;
    int n = 0;
    kvs_error e;
    if (kvs_tokenizer_encode_ex(m->tokenizer, end, 0, 1, &ids, &n, &e) != KVS_OK)
        return -1;
    /* a marker the vocabulary lacks may still be one ordinary token by chance: not a turn end */
    int id = n == 1 ? ids[0] : -1;
    int ty = id >= 0 ? kvs_tokenizer_type(m->tokenizer, id) : 0;
    if (ty != KVS_TOKEN_CONTROL && ty != KVS_TOKEN_USER_DEFINED)
        id = -1;
    free(ids);
    return id;
}
