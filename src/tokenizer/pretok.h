/* Pre-tokenizer of byte-level BPE vocabularies: the regex lists tokenizer.ggml.pre names (PCRE2). */
#ifndef KVS_PRETOK_H
#define KVS_PRETOK_H

#include <stddef.h>

#include "core/error.h"

typedef struct kvs_pretok kvs_pretok;

/* A piece of the text: byte offset and length. */
typedef struct kvs_span {
    size_t off, len;
} kvs_span;

/* A growable list of spans (the caller frees v). */
typedef struct kvs_spans {
    kvs_span *v;
    size_t n, cap;
} kvs_spans;

/* Compiles the regex list named `name` (a tokenizer.ggml.pre value: "gpt-2", "llama-bpe", ...).
 * An unknown name fails with KVS_ERR_UNSUPPORTED and a message listing the supported names. */
kvs_status kvs_pretok_new(const char *name, size_t name_len, kvs_pretok **out, kvs_error *err);
void kvs_pretok_free(kvs_pretok *p);
/* The name as given to kvs_pretok_new (NUL-terminated). */
const char *kvs_pretok_name(const kvs_pretok *p);
/* 1 if the vocabulary's BPE takes a whole pre-token that is itself a token without merging it
 * (Llama 3's "ignore_merges"). */
int kvs_pretok_ignore_merges(const kvs_pretok *p);
/* Comma-separated list of the supported names, for messages. */
const char *kvs_pretok_supported(void);

/* Splits text[0..len) into pieces, appended to *out (offsets relative to text): every regex of the
 * list splits every piece the previous ones left, and the stretches between matches stay pieces
 * too, so the pieces always cover the whole text. Works on invalid UTF-8 (such bytes match no
 * regex item and end up in the stretches between matches). Thread-safe on a shared kvs_pretok. */
kvs_status kvs_pretok_split(const kvs_pretok *p, const char *text, size_t len, kvs_spans *out,
                            kvs_error *err);

#endif
