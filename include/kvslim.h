/* kvslim: a C11 LLM inference engine built around the KV cache.
 *
 * Public API: opaque handles, status codes, no global state. Every function that can fail
 * returns a kvs_status and fills the kvs_error passed in (which may be NULL): on failure its
 * code and a message, on success code KVS_OK and an empty message. A NULL handle or a NULL
 * required pointer is refused with KVS_ERR_ARG; functions that cannot fail treat a NULL handle
 * as empty (0, -1 or "" as documented) and free functions accept NULL. */
#ifndef KVSLIM_H
#define KVSLIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_status {
    KVS_OK = 0,
    KVS_ERR_IO = 1,          /* a file could not be opened, read, mapped or written */
    KVS_ERR_FORMAT = 2,      /* a file is malformed: truncated, bad header, inconsistent sizes */
    KVS_ERR_UNSUPPORTED = 3, /* well-formed but not supported (architecture, tensor type) */
    KVS_ERR_ARG = 4,         /* a bad argument: out-of-range token, unknown option */
    KVS_ERR_NOMEM = 5,       /* an allocation failed */
} kvs_status;

const char *kvs_status_name(kvs_status s);

/* Filled by every fallible call: the status and a message naming the file, key, tensor or
 * argument at fault; cleared (KVS_OK, "") when the call succeeds. */
typedef struct kvs_error {
    kvs_status code;
    char msg[512];
} kvs_error;

/* ---- models ---- */
typedef struct kvs_model kvs_model;

typedef struct kvs_model_info {
    int n_vocab, n_ctx, dim, hidden, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t n_params;
    const char *weight_type; /* type of the attention query weights, e.g. "q8_0" */
    size_t weight_bytes;     /* bytes of every weight tensor as stored */
} kvs_model_info;

/* Maps and validates a llama-architecture GGUF file. A llama2.c checkpoint is refused with a
 * message saying how to convert it. */
kvs_status kvs_model_load(const char *path, kvs_model **out, kvs_error *err);
void kvs_model_free(kvs_model *m);
/* A NULL model gives all zeros (weight_type ""). */
void kvs_model_get_info(const kvs_model *m, kvs_model_info *info);
/* The string value of the GGUF metadata key (e.g. "tokenizer.chat_template", "general.name"),
 * snprintf-style: copies at most size - 1 bytes and a NUL into buf (buf may be NULL when size is
 * 0) and returns the value's whole length, so a caller can size a buffer with a first call.
 * -1 (and "" in buf) when m or key is NULL, the key is absent or its value is not a string. */
int kvs_model_meta_str(const kvs_model *m, const char *key, char *buf, size_t size);

/* ---- tokens ---- */
/* -1 for a NULL model. */
int kvs_token_bos(const kvs_model *m);
int kvs_token_eos(const kvs_model *m);
/* Encodes text (SentencePiece, or byte-level BPE with the pre-tokenizer the GGUF names); *ids is
 * malloc'd and owned by the caller (free()). add_bos: prepend BOS when the vocabulary asks for it
 * (tokenizer.ggml.add_bos_token; absent: yes for SentencePiece, no for BPE). */
kvs_status kvs_tokenize(const kvs_model *m, const char *text, int add_bos, int32_t **ids,
                        int *n_ids, kvs_error *err);
/* kvs_tokenize with special-token parsing (llama.cpp's parse_special). With parse_special, the
 * text of a control, unknown or user-defined token of the vocabulary (e.g. "<|im_start|>",
 * "<|eot_id|>", "<|user|>", "<s>") becomes that token's id wherever it occurs (longer tokens
 * first), and each stretch of text between is tokenized as kvs_tokenize would (SentencePiece
 * gives a stretch its dummy-prefix space when it starts the text or follows a special token, as
 * llama.cpp does). Use it for text the program wrote, such as a chat template's output, not for
 * untrusted user text, which could then forge markers. parse_special 0 is kvs_tokenize. */
kvs_status kvs_tokenize_special(const kvs_model *m, const char *text, int add_bos,
                                int parse_special, int32_t **ids, int *n_ids, kvs_error *err);
/* Printable bytes of token id following token prev; *len is set (may contain a NUL byte).
 * "" with *len 0 for a NULL model or an id outside the vocabulary. len may be NULL. */
const char *kvs_token_text(const kvs_model *m, int prev, int id, int *len);

/* ---- chat templates: a conversation as the prompt text a chat model was trained on ----
 * The formats are built in; a GGUF's tokenizer.chat_template (Jinja) only selects one by its
 * markers. Tokenize the output with kvs_tokenize_special so the markers become single tokens. */
typedef enum kvs_chat_template {
    KVS_CHAT_DEFAULT = 0, /* "role: content\n" per message; the reply starts after "assistant:" */
    KVS_CHAT_LLAMA3,      /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    KVS_CHAT_CHATML,      /* <|im_start|>role\ncontent<|im_end|>\n (Qwen and others) */
    KVS_CHAT_PHI3,        /* <|role|>\ncontent<|end|>\n */
    KVS_CHAT_LLAMA2,      /* [INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] reply</s><s>[INST] */
} kvs_chat_template;

typedef struct kvs_chat_message {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} kvs_chat_message;

/* The format a Jinja chat template selects: "<|start_header_id|>" Llama-3, "<|im_start|>"
 * ChatML, "<|assistant|>" with "<|end|>" Phi-3, "[INST]" Llama-2; anything else (or NULL) the
 * default. */
kvs_chat_template kvs_chat_template_from_text(const char *jinja);
/* The same from the model's tokenizer.chat_template (the default without one or for NULL). */
kvs_chat_template kvs_chat_template_detect(const kvs_model *m);
/* "default", "llama3", "chatml", "phi3", "llama2". */
const char *kvs_chat_template_name(kvs_chat_template t);
/* The template of that name (to override detection); KVS_ERR_ARG listing the names if none. */
kvs_status kvs_chat_template_by_name(const char *name, kvs_chat_template *out, kvs_error *err);

/* Flags of kvs_chat_apply. */
enum {
    KVS_CHAT_ADD_ASSISTANT = 1, /* end with the start of an assistant turn (the model replies) */
    /* Begin by closing an assistant reply that was generated just before and stopped at its turn
     * end (or at a token limit) without the end marker being fed: for a conversation continued
     * on the same session, where only the new messages are formatted and fed. */
    KVS_CHAT_CLOSE_REPLY = 2,
};
/* msgs[0..n) in template t; *out is malloc'd (caller frees), "" for n 0 and no flags. The BOS
 * (Llama-3's <|begin_of_text|>, Llama-2's first <s>) is not written: tokenize the start of a
 * conversation with add_bos, and the vocabulary's add_bos_token adds it as the templates do. */
kvs_status kvs_chat_apply(kvs_chat_template t, const kvs_chat_message *msgs, int n, int flags,
                          char **out, kvs_error *err);
/* The text that ends an assistant turn, where generation stops ("<|eot_id|>", "<|im_end|>",
 * "<|end|>", "</s>"); NULL for the default template. */
const char *kvs_chat_turn_end(kvs_chat_template t);
/* The turn end's token id when the model's vocabulary has it as one control or user-defined
 * token (special-token parsing), else -1 (then it can only be matched as text). */
int kvs_chat_turn_end_token(const kvs_model *m, kvs_chat_template t);

/* ---- sessions: one sequence's KV cache and forward-pass state ---- */
typedef struct kvs_session kvs_session;

typedef struct kvs_session_params {
    int n_threads;         /* >= 1 */
    int n_ctx;             /* 0 = the model's trained context; more than it needs
                              allow_ctx_beyond_trained */
    int chunk;             /* prompt tokens per forward batch; 0 = 512 */
    const char *kv_policy; /* "NAME[:key=value,...]" (see kvs_kv_policy_help); NULL = full */
    const char *kv_type;   /* KV storage: "f32" (NULL, the default) or "f16" */
    int measure_recall;    /* keep a shadow of every key to measure attention recall */
    /* Position shifting (llama.cpp's context shift for post-RoPE keys): with an evicting
     * policy, when the next position would reach n_ctx, every kept key is rotated back by a
     * common offset so positions stay inside the trained window. Also a policy option
     * (shift=on). 0 = off. */
    int context_shift;
    /* Notices (a clamped budget, a context past the trained one, ...): one line each, no
     * trailing newline. NULL: no notices. */
    void (*log)(void *ctx, const char *msg);
    void *log_ctx;
    /* 1: accept an n_ctx beyond the model's trained context (positions past it were never
     * trained: quality degrades), with a notice to log. 0: such an n_ctx is refused. */
    int allow_ctx_beyond_trained;
    /* 1: multiply quantised weights with fp32 activations (the weights dequantised block by
     * block), as llama.cpp does on a copy of the file dequantised to F32: logits within fp32
     * rounding of that reference. 0 (default): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K
     * and IQ4_NL weights use integer kernels on activations quantised to 8-bit blocks of 32, as
     * llama.cpp's CPU kernels do (its numerics class), several times faster; the others (F32,
     * F16, BF16, Q2_K, Q3_K) are always exact. */
    int exact_matmul;
} kvs_session_params;

/* Lists the KV policies and their parameters. */
void kvs_kv_policy_help(FILE *f);
/* Checks a policy spec without a model; errors list what is accepted. */
kvs_status kvs_kv_policy_check(const char *spec, kvs_error *err);

kvs_session_params kvs_session_default_params(void);
kvs_status kvs_session_new(const kvs_model *m, const kvs_session_params *p, kvs_session **out,
                           kvs_error *err);
void kvs_session_free(kvs_session *s);
/* Forgets every token. Keeps the KV cache's memory, which the next prompt writes into instead of
 * allocating it again (a failed kvs_session_eval releases it). */
void kvs_session_reset(kvs_session *s);
/* Feeds n tokens at the next positions. The first call after creation or reset is the prompt:
 * it is processed in batches of the chunk size (smaller where the KV policy asks, e.g. HashEvict's
 * paper prefill feeds the prompt beyond its budget one token at a time) and the KV policy
 * compresses it by its rule;
 * later calls are decode steps, one token at a time. If logits is non-NULL it receives
 * n x n_vocab floats when all_logits, else the n_vocab logits of the last token. A call refused
 * before it starts (a bad token id, no room in the context) leaves the session as it was; a call
 * that fails part way (out of memory, non-finite values) leaves it reset (as kvs_session_reset,
 * holding no slots), since a half-processed batch cannot be continued. */
kvs_status kvs_session_eval(kvs_session *s, const int32_t *tokens, int n, float *logits,
                            int all_logits, kvs_error *err);
/* Tokens fed since creation or reset (0 for NULL). */
int kvs_session_n_past(const kvs_session *s);
/* Tokens kvs_session_eval still takes before the context is full: n_ctx - n_past, or (an
 * evicting KV policy, whose cache stays bounded: past the context its positions are shifted
 * back with context_shift, else they go past the trained window with a notice) INT32_MAX -
 * n_past. */
int kvs_session_ctx_left(const kvs_session *s);
/* Bytes held by the KV cache now, and bytes a full F16 cache of the same tokens would hold. */
size_t kvs_session_kv_bytes(const kvs_session *s);
size_t kvs_session_kv_bytes_full_f16(const kvs_session *s);
/* Largest KV bytes held at any point since the last reset. */
size_t kvs_session_kv_peak_bytes(const kvs_session *s);

typedef struct kvs_step_stats {
    double slots_attended; /* mean per layer and query head, last decode step */
    double attn_recall;    /* share of full-cache attention mass on attended slots (needs
                              measure_recall; else 1) */
} kvs_step_stats;
void kvs_session_last_step(const kvs_session *s, kvs_step_stats *st);

/* ---- sampling: the next token from a row of logits ---- */
typedef struct kvs_sampler kvs_sampler;

/* softmax(logits / temperature) over the candidates, keep the top_k most likely (ties: lower
 * id), then the smallest most-likely-first prefix reaching top_p, renormalise, draw. */
typedef struct kvs_sampler_params {
    float temperature; /* >= 0; 0 = greedy (argmax, ties to the lowest id) */
    int top_k;         /* >= 0; 0 = off */
    float top_p;       /* [0, 1]; 1 = off, 0 = the most likely token only */
    uint64_t seed;     /* the same seed and logits give the same tokens on every platform */
} kvs_sampler_params;

/* The CLI's defaults: temperature 0.8, top_k 40, top_p 0.95, seed 42. */
kvs_sampler_params kvs_sampler_default_params(void);
/* A sampler over n_vocab logits (kvs_model_info.n_vocab); params are copied. */
kvs_status kvs_sampler_new(int n_vocab, const kvs_sampler_params *params, kvs_sampler **out,
                           kvs_error *err);
/* A token id in [0, n_vocab) from n_vocab logits (not modified; NaN counts as -inf), or -1 if s
 * or logits is NULL. */
int kvs_sampler_sample(kvs_sampler *s, const float *logits);
void kvs_sampler_free(kvs_sampler *s);

#ifdef __cplusplus
}
#endif
#endif
