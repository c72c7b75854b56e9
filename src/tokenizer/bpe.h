/* Byte-level BPE (GPT-2 style): the byte <-> symbol mapping, merge ranks and the merge loop. */
#ifndef KVS_BPE_H
#define KVS_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/pretok.h"
#include "tokenizer/tokenizer.h"

typedef struct kvs_bpe kvs_bpe;

/* A growable list of token ids (the caller frees v). */
typedef struct kvs_idvec {
    int32_t *v;
    size_t n, cap;
} kvs_idvec;

/* 0, or -1 if out of memory. */
int kvs_idvec_push(kvs_idvec *v, int32_t id);

/* GPT-2's byte-to-unicode mapping: the symbol of byte b as UTF-8 in out (returns 1 or 2). Bytes
 * that are printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to themselves, the
 * other 68 to U+0100.. in byte order (so ' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ'). */
int kvs_bpe_byte_utf8(unsigned b, char out[4]);
/* The byte whose symbol is code point cp, or -1. */
int kvs_bpe_cpt_byte(uint32_t cp);

/* Builds the merge table from the string array merges_key of g ("left right": the two tokens'
 * texts separated by the first space after the first byte), rank = index. Every merge's two
 * sides must be tokens of t (KVS_ERR_FORMAT naming the merge otherwise, as for a merge without a
 * space); a duplicate pair keeps its first rank. A merge whose result is not a token is kept (as
 * llama.cpp does): a symbol it makes falls back to its byte tokens. Takes ownership of pre (freed
 * on failure too). t must be complete (kvs_tokenizer_lookup works) and outlive the result. */
kvs_status kvs_bpe_new(const kvs_tokenizer *t, const kvs_gguf *g, const char *merges_key,
                       kvs_pretok *pre, kvs_bpe **out, kvs_error *err);
void kvs_bpe_free(kvs_bpe *b);

const kvs_pretok *kvs_bpe_pretok(const kvs_bpe *b);
uint32_t kvs_bpe_n_merges(const kvs_bpe *b);
/* The two token ids of the merge of rank r (for writing the vocabulary back). */
void kvs_bpe_merge_at(const kvs_bpe *b, uint32_t r, int32_t *left, int32_t *right);

/* Pre-tokenizes text[0..len) and appends the tokens of every piece to out: the piece's bytes
 * become their byte symbols, then the adjacent pair of lowest merge rank is merged repeatedly
 * (ties: leftmost). A byte without a token becomes the unknown token, or fails (KVS_ERR_ARG) if
 * the vocabulary has none. Thread-safe on a shared kvs_bpe. */
kvs_status kvs_bpe_encode(const kvs_bpe *b, const kvs_tokenizer *t, const char *text, size_t len,
                          kvs_idvec *out, kvs_error *err);

#endif
