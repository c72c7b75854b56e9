/* Chat templates (kvslim.h kvs_chat_*) and special-token parsing of their output: detection from
 * Jinja text, the exact text of each format, that formatting a conversation turn by turn (the
 * reply closed by KVS_CHAT_CLOSE_REPLY) gives the same text as formatting it whole, and the exact
 * token ids of a formatted two-turn chat in a Llama-3 and a ChatML vocabulary and in Phi-3's.
 * No vocabulary in shared/models/vocab has the Llama-3 or ChatML markers, so those two are GPT-2's
 * vocabulary (ggml-vocab-gpt-2.gguf) with the markers appended as control tokens, written to a
 * temporary GGUF with the pre-tokenizer the real models name (llama-bpe, qwen2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gguf/gguf.h"
#include "kvslim.h"
#include "tokenizer/tokenizer.h"

static void test_detect(void)
{
    CHECK(kvs_chat_template_from_text("{% for m in messages %}<|start_header_id|>{{ m.role }}") ==
          KVS_CHAT_LLAMA3);
    CHECK(kvs_chat_template_from_text("{% for m in messages %}<|im_start|>{{ m.role }}\n") ==
          KVS_CHAT_CHATML);
    CHECK(kvs_chat_template_from_text("{{'<|user|>' + '\\n' + c + '<|end|>' + '<|assistant|>'}}") ==
          KVS_CHAT_PHI3);
    CHECK(kvs_chat_template_from_text("{{ bos_token }}[INST]") == KVS_CHAT_LLAMA2);
    CHECK(kvs_chat_template_from_text("{{ messages }}") == KVS_CHAT_DEFAULT);
    CHECK(kvs_chat_template_from_text(NULL) == KVS_CHAT_DEFAULT);
    CHECK(kvs_chat_template_detect(NULL) == KVS_CHAT_DEFAULT);
    CHECK(!strcmp(kvs_chat_template_name(KVS_CHAT_LLAMA3), "llama3") &&
          !strcmp(kvs_chat_template_name(KVS_CHAT_CHATML), "chatml") &&
          !strcmp(kvs_chat_template_name(KVS_CHAT_PHI3), "phi3") &&
          !strcmp(kvs_chat_template_name(KVS_CHAT_LLAMA2), "llama2") &&
          !strcmp(kvs_chat_template_name(KVS_CHAT_DEFAULT), "default"));
    CHECK(!strcmp(kvs_chat_turn_end(KVS_CHAT_LLAMA3), "<|eot_id|>") &&
          !strcmp(kvs_chat_turn_end(KVS_CHAT_CHATML), "<|im_end|>") &&
          !strcmp(kvs_chat_turn_end(KVS_CHAT_PHI3), "<|end|>") &&
          !strcmp(kvs_chat_turn_end(KVS_CHAT_LLAMA2), "</s>") &&
          kvs_chat_turn_end(KVS_CHAT_DEFAULT) == NULL);
}

static int apply_is(kvs_chat_template t, const kvs_chat_message *m, int n, int flags,
                    const char *want)
{
    char *p = NULL;
    kvs_error e = {0};
    kvs_status st = kvs_chat_apply(t, m, n, flags, &p, &e);
    int ok = st == KVS_OK && p && !strcmp(p, want);
    if (!ok)
        fprintf(stderr, "%s: got \"%s\" (%s), want \"%s\"\n", kvs_chat_template_name(t),
                p ? p : "(null)", e.msg, want);
    free(p);
    return ok;
}

static const kvs_chat_message two_turns[] = {{"system", "Be brief."}, {"user", "Hi"},
                                             {"assistant", "Hello!"}, {"user", "How are you?"}};

static void test_text(void)
{
    const kvs_chat_message *m = two_turns;
    const int A = KVS_CHAT_ADD_ASSISTANT;
    CHECK(apply_is(KVS_CHAT_DEFAULT, m, 2, A, "system: Be brief.\nuser: Hi\nassistant:"));
    CHECK(apply_is(KVS_CHAT_LLAMA3, m, 4, A,
                   "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    CHECK(apply_is(KVS_CHAT_CHATML, m, 4, A,
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(apply_is(KVS_CHAT_PHI3, m + 1, 3, A,
                   "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nHow are you?"
                   "<|end|>\n<|assistant|>\n"));
    CHECK(apply_is(KVS_CHAT_LLAMA2, m, 4, A,
                   "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello!</s><s>[INST] How are "
                   "you? [/INST]"));
    CHECK(apply_is(KVS_CHAT_CHATML, m, 0, 0, ""));
    CHECK(apply_is(KVS_CHAT_CHATML, NULL, 0, KVS_CHAT_CLOSE_REPLY, "<|im_end|>\n"));
    /* bad arguments */
    char *p = (char *)1;
    kvs_error e = {0};
    CHECK(kvs_chat_apply(KVS_CHAT_CHATML, m, 1, 0, NULL, &e) == KVS_ERR_ARG);
    CHECK(kvs_chat_apply((kvs_chat_template)99, m, 1, 0, &p, &e) == KVS_ERR_ARG && !p);
    kvs_chat_message bad = {"user", NULL};
    CHECK(kvs_chat_apply(KVS_CHAT_CHATML, &bad, 1, 0, &p, &e) == KVS_ERR_ARG &&
          strstr(e.msg, "content"));
}

/* Turn by turn: turn 1 with the assistant's start, the reply as generated, then turn 2 closing
 * the reply first: the same text as the whole conversation, for every template. (The default
 * and Llama-2 formats put a space before the reply, which the model generates.) */
static void test_incremental(void)
{
    const kvs_chat_template all[] = {KVS_CHAT_DEFAULT, KVS_CHAT_LLAMA3, KVS_CHAT_CHATML,
                                     KVS_CHAT_PHI3, KVS_CHAT_LLAMA2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        kvs_chat_template t = all[i];
        const char *reply = t == KVS_CHAT_DEFAULT || t == KVS_CHAT_LLAMA2 ? " Hello!" : "Hello!";
        char *first = NULL, *second = NULL, *whole = NULL;
        kvs_error e;
        kvs_chat_apply(t, two_turns, 2, KVS_CHAT_ADD_ASSISTANT, &first, &e);
        kvs_chat_apply(t, two_turns + 3, 1, KVS_CHAT_CLOSE_REPLY | KVS_CHAT_ADD_ASSISTANT,
                       &second, &e);
        kvs_chat_apply(t, two_turns, 4, KVS_CHAT_ADD_ASSISTANT, &whole, &e);
        CHECK(first && second && whole);
        if (first && second && whole) {
            size_t n = strlen(first) + strlen(reply) + strlen(second) + 1;
            char *cat = malloc(n);
            snprintf(cat, n, "%s%s%s", first, reply, second);
            int same = t == KVS_CHAT_DEFAULT
                           ? !strncmp(cat, "system: Be brief.\nuser: Hi\nassistant: Hello!\n"
                                           "user: How are you?\nassistant:", n)
                           : !strcmp(cat, whole);
            CHECKF(same, "%s: turn by turn \"%s\", whole \"%s\"", kvs_chat_template_name(t), cat,
                   whole);
            free(cat);
        }
        free(first);
        free(second);
        free(whole);
    }
}

/* GPT-2's vocabulary plus the markers as control tokens, written to path. */
static int write_marked_vocab(const char *path, const char *pre, const char *const *markers,
                              int n_markers)
{
    char src[1024];
    check_shared_path(src, sizeof src, "models/vocab/ggml-vocab-gpt-2.gguf");
    kvs_gguf *g = NULL;
    kvs_error e = {0};
    if (kvs_gguf_open(src, &g, &e) != KVS_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    kvs_gguf_type ty;
    uint64_t n_tok = 0, n_merge = 0;
    kvs_gguf_get_arr(g, "tokenizer.ggml.tokens", &ty, &n_tok, &e);
    kvs_gguf_get_arr(g, "tokenizer.ggml.merges", &ty, &n_merge, &e);
    uint64_t n = n_tok + (uint64_t)n_markers;
    char **tokens = calloc(n, sizeof *tokens), **merges = calloc(n_merge + 1, sizeof *merges);
    int32_t *types = calloc(n, sizeof *types);
    const int32_t *src_types = kvs_gguf_arr_data(g, "tokenizer.ggml.token_type");
    int rc = tokens && merges && types && src_types ? 0 : -1;
    for (uint64_t i = 0; rc == 0 && i < n_tok + n_merge; i++) {
        kvs_gguf_str s;
        int tok = i < n_tok;
        if (kvs_gguf_arr_str(g, tok ? "tokenizer.ggml.tokens" : "tokenizer.ggml.merges",
                             tok ? i : i - n_tok, &s, &e) != KVS_OK) {
            rc = -1;
            break;
        }
        char *c = strndup(s.data, (size_t)s.len);
        if (!c) rc = -1;
        if (tok) tokens[i] = c, types[i] = src_types[i];
        else merges[i - n_tok] = c;
    }
    for (int k = 0; rc == 0 && k < n_markers; k++) {
        tokens[n_tok + (uint64_t)k] = strdup(markers[k]);
        types[n_tok + (uint64_t)k] = KVS_TOKEN_CONTROL;
    }
    if (rc == 0) {
        kvs_gguf_writer *w = kvs_gguf_writer_new();
        kvs_gguf_set_str(w, "general.architecture", "llama");
        kvs_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
        kvs_gguf_set_str(w, "tokenizer.ggml.pre", pre);
        kvs_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, n);
        kvs_gguf_set_arr_i32(w, "tokenizer.ggml.token_type", types, n);
        kvs_gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merge);
        kvs_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)n_tok);
        kvs_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n_tok + 1);
        if (kvs_gguf_write(w, path, &e) != KVS_OK) {
            fprintf(stderr, "%s\n", e.msg);
            rc = -1;
        }
        kvs_gguf_writer_free(w);
    }
    for (uint64_t i = 0; tokens && i < n; i++) free(tokens[i]);
    for (uint64_t i = 0; merges && i < n_merge; i++) free(merges[i]);
    free(tokens);
    free(merges);
    free(types);
    kvs_gguf_close(g);
    return rc;
}

/* The formatted two-turn chat tokenized with special-token parsing is exactly want; without it
 * the markers are text (many tokens, none of the marker ids). */
static void check_chat_ids(const kvs_tokenizer *t, kvs_chat_template tpl,
                           const kvs_chat_message *m, int n, const int32_t *want, int nw,
                           int first_marker)
{
    char *text = NULL;
    kvs_error e = {0};
    CHECKF(kvs_chat_apply(tpl, m, n, KVS_CHAT_ADD_ASSISTANT, &text, &e) == KVS_OK, "%s", e.msg);
    if (!text) return;
    int32_t *ids = NULL, *plain = NULL;
    int n_ids = 0, n_plain = 0;
    CHECKF(kvs_tokenizer_encode_ex(t, text, 0, 1, &ids, &n_ids, &e) == KVS_OK, "%s", e.msg);
    int same = n_ids == nw && !memcmp(ids, want, sizeof *ids * (size_t)nw);
    CHECKF(same, "%s: %d ids, want %d", kvs_chat_template_name(tpl), n_ids, nw);
    if (!same) {
        for (int i = 0; i < n_ids; i++) fprintf(stderr, "%d,", ids[i]);
        fputc('\n', stderr);
    }
    CHECK(kvs_tokenizer_encode_ex(t, text, 0, 0, &plain, &n_plain, &e) == KVS_OK);
    int has_marker = 0;
    for (int i = 0; i < n_plain; i++) has_marker |= plain[i] >= first_marker;
    CHECKF(n_plain > n_ids + 10 && !has_marker, "%s: without parsing %d ids",
           kvs_chat_template_name(tpl), n_plain);
    printf("%s: two-turn chat of %zu bytes -> %d ids (%d without special-token parsing)\n",
           kvs_chat_template_name(tpl), strlen(text), n_ids, n_plain);
    free(ids);
    free(plain);
    free(text);
}

static void test_marked_vocabs(void)
{
    char path[512], name[64];
    snprintf(name, sizeof name, "kvs_chat_%d.gguf", (int)getpid());
    check_tmp_path(path, sizeof path, name);
    const kvs_chat_message *m = two_turns;
    /* GPT-2 ids: 10057 "system", 198 "\n", 3856 "Be", 4506 " brief", 13 ".", 7220 "user",
     * 17250 "Hi", 562 "ass", 10167 "istant", 15496 "Hello", 0 "!", 2437 "How", 389 " are",
     * 345 " you", 30 "?" */
    const char *llama3[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eot_id|>"};
    enum { L_SH = 50259, L_EH = 50260, L_EOT = 50261 };
    const int32_t want_llama3[] = {
        L_SH, 10057, L_EH, 628, 3856, 4506, 13, L_EOT,
        L_SH, 7220, L_EH, 628, 17250, L_EOT,
        L_SH, 562, 10167, L_EH, 628, 15496, 0, L_EOT,
        L_SH, 7220, L_EH, 628, 2437, 389, 345, 30, L_EOT,
        L_SH, 562, 10167, L_EH, 628};
    const char *chatml[] = {"<|im_start|>", "<|im_end|>"};
    enum { C_S = 50257, C_E = 50258 };
    const int32_t want_chatml[] = {
        C_S, 10057, 198, 3856, 4506, 13, C_E, 198,
        C_S, 7220, 198, 17250, C_E, 198,
        C_S, 562, 10167, 198, 15496, 0, C_E, 198,
        C_S, 7220, 198, 2437, 389, 345, 30, C_E, 198,
        C_S, 562, 10167, 198};
    struct {
        kvs_chat_template tpl;
        const char *pre;
        const char *const *markers;
        int n_markers;
        const int32_t *want;
        int nw;
    } cases[] = {
        {KVS_CHAT_LLAMA3, "llama-bpe", llama3, 5, want_llama3,
         (int)(sizeof want_llama3 / sizeof *want_llama3)},
        {KVS_CHAT_CHATML, "qwen2", chatml, 2, want_chatml,
         (int)(sizeof want_chatml / sizeof *want_chatml)},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (write_marked_vocab(path, cases[c].pre, cases[c].markers, cases[c].n_markers) != 0) {
            CHECKF(0, "cannot write the %s vocabulary", kvs_chat_template_name(cases[c].tpl));
            continue;
        }
        kvs_tokenizer *t = NULL;
        kvs_error e = {0};
        CHECKF(kvs_tokenizer_load_gguf(path, &t, &e) == KVS_OK, "%s", e.msg);
        if (t)
            check_chat_ids(t, cases[c].tpl, m, 4, cases[c].want, cases[c].nw, 50257);
        kvs_tokenizer_free(t);
        remove(path);
    }
}

/* Phi-3's own vocabulary (SentencePiece) has its markers as control tokens: 32010 <|user|>,
 * 32007 <|end|>, 32001 <|assistant|>. A stretch after a marker gets the dummy-prefix space, as
 * in llama.cpp: 29871 "\xe2\x96\x81", 13 <0x0A>, 18567 "Hi", 10994 "Hello", 29991 "!",
 * 5328 "How", 526 " are", 366 " you", 29973 "?". */
static void test_phi3(void)
{
    char path[1024];
    check_shared_path(path, sizeof path, "models/vocab/ggml-vocab-phi-3.gguf");
    kvs_tokenizer *t = NULL;
    kvs_error e = {0};
    if (access(path, R_OK) != 0) {
        printf("%s: not found, skipped\n", path);
        return;
    }
    CHECKF(kvs_tokenizer_load_gguf(path, &t, &e) == KVS_OK, "%s", e.msg);
    if (!t) return;
    const int32_t want[] = {32010, 29871, 13, 18567, 32007, 29871, 13,
                            32001, 29871, 13, 10994, 29991, 32007, 29871, 13,
                            32010, 29871, 13, 5328, 526, 366, 29973, 32007, 29871, 13,
                            32001, 29871, 13};
    check_chat_ids(t, KVS_CHAT_PHI3, two_turns + 1, 3, want, (int)(sizeof want / sizeof *want),
                   32000);
    kvs_tokenizer_free(t);
}

/* Through the public API on a model: stories260K's vocabulary has <s> and </s> as control
 * tokens (BOS 1, EOS 2), so Llama-2's turn end is one token; ChatML's is not in it. */
static void test_model(void)
{
    char path[1024];
    check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    kvs_model *m = NULL;
    kvs_error e = {0};
    if (kvs_model_load(path, &m, &e) != KVS_OK) {
        printf("%s: %s, skipped\n", path, e.msg);
        return;
    }
    CHECK(kvs_chat_template_detect(m) == KVS_CHAT_DEFAULT); /* no tokenizer.chat_template */
    CHECK(kvs_chat_turn_end_token(m, KVS_CHAT_LLAMA2) == 2);
    CHECK(kvs_chat_turn_end_token(m, KVS_CHAT_CHATML) == -1);
    CHECK(kvs_chat_turn_end_token(m, KVS_CHAT_DEFAULT) == -1);
    CHECK(kvs_chat_turn_end_token(NULL, KVS_CHAT_LLAMA2) == -1);
    int32_t *ids = NULL, *plain = NULL, *sp0 = NULL;
    int n = 0, n_plain = 0, n0 = 0;
    CHECK(kvs_tokenize_special(m, "<s>[INST] hi [/INST]</s>", 0, 1, &ids, &n, &e) == KVS_OK);
    CHECK(kvs_tokenize(m, "<s>[INST] hi [/INST]</s>", 0, &plain, &n_plain, &e) == KVS_OK);
    CHECK(kvs_tokenize_special(m, "<s>[INST] hi [/INST]</s>", 0, 0, &sp0, &n0, &e) == KVS_OK);
    CHECKF(ids && n > 2 && ids[0] == 1 && ids[n - 1] == 2 && n < n_plain, "%d ids", n);
    CHECK(plain && sp0 && n0 == n_plain && !memcmp(plain, sp0, sizeof *sp0 * (size_t)n0));
    for (int i = 0; plain && i < n_plain; i++)
        CHECK(plain[i] != 1 && plain[i] != 2);
    free(ids);
    free(plain);
    free(sp0);
    kvs_chat_template t = KVS_CHAT_DEFAULT;
    CHECK(kvs_chat_template_by_name("chatml", &t, &e) == KVS_OK && t == KVS_CHAT_CHATML);
    CHECK(kvs_chat_template_by_name("jinja", &t, &e) == KVS_ERR_ARG && strstr(e.msg, "llama3"));
    CHECK(kvs_tokenize_special(NULL, "x", 0, 1, &ids, &n, &e) == KVS_ERR_ARG && !ids && !n);
    kvs_model_free(m);
}

int main(void)
{
    test_detect();
    test_text();
    test_incremental();
    test_marked_vocabs();
    test_phi3();
    test_model();
    return check_summary("test_chat");
}
