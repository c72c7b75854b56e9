/* Tokenizers: SentencePiece-style BPE with byte fallback ("llama") and byte-level BPE ("gpt2"). */
#ifndef KVS_TOKENIZER_H
#define KVS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "gguf/gguf.h"

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    KVS_TOKEN_NORMAL = 1,
    KVS_TOKEN_UNKNOWN = 2,
    KVS_TOKEN_CONTROL = 3,
    KVS_TOKEN_USER_DEFINED = 4,
    KVS_TOKEN_UNUSED = 5,
    KVS_TOKEN_BYTE = 6,
};

typedef struct kvs_tokenizer kvs_tokenizer;

/* Loads a llama2.c tokenizer file (int32 max_token_length, then per token: float32 score,
 * int32 byte length, bytes). Pieces are normalised to the GGUF convention used by llama.cpp's
 * llama2.c converter: ' ' becomes U+2581, id 0 is UNKNOWN, ids 1 and 2 (BOS, EOS) CONTROL,
 * <0xNN> BYTE, the rest NORMAL. Errors name the path and the token index. */
kvs_status kvs_tokenizer_load_llama2c(const char *path, kvs_tokenizer **out, kvs_error *err);
/* The file does not store its token count, so kvs_tokenizer_load_llama2c reads tokens up to the
 * end of the file (a file cut exactly between two tokens loads as a smaller vocabulary). This
 * variant takes the expected count (the model's vocab_size; 0 = read to the end) and fails if the
 * file holds fewer tokens or has bytes left over after n_vocab tokens. */
kvs_status kvs_tokenizer_load_llama2c_n(const char *path, int n_vocab, kvs_tokenizer **out,
                                        kvs_error *err);
/* Builds the tokenizer from tokenizer.ggml.* keys. model "llama" (SentencePiece): tokens,
 * scores, token_type, optional bos/eos/unknown ids (default 1/2/0). model "gpt2" (byte-level
 * BPE): tokens, token_type, merges, optional scores, pre (the pre-tokenizer's name; without it
 * "default", as llama.cpp; an unknown name is KVS_ERR_UNSUPPORTED), bos/eos/unknown ids (no
 * default: -1). Both: add_bos_token (default: true for "llama", false for "gpt2"). Nothing of g
 * is referenced afterwards. */
kvs_status kvs_tokenizer_from_gguf(const kvs_gguf *g, kvs_tokenizer **out, kvs_error *err);
/* The same from a GGUF file, e.g. a vocabulary-only one (metadata, no tensors); messages start
 * with the path. */
kvs_status kvs_tokenizer_load_gguf(const char *path, kvs_tokenizer **out, kvs_error *err);
void kvs_tokenizer_free(kvs_tokenizer *t);

int kvs_tokenizer_n_vocab(const kvs_tokenizer *t);
int kvs_tokenizer_bos(const kvs_tokenizer *t);
int kvs_tokenizer_eos(const kvs_tokenizer *t);
/* Unknown token id, or -1 if the vocabulary has none. */
int kvs_tokenizer_unk(const kvs_tokenizer *t);
/* Whether a BOS is added when the caller asks for one (tokenizer.ggml.add_bos_token). */
int kvs_tokenizer_add_bos(const kvs_tokenizer *t);
/* 1 for a byte-level BPE ("gpt2") vocabulary. */
int kvs_tokenizer_is_bpe(const kvs_tokenizer *t);
/* Piece text as stored (GGUF convention, NUL-terminated), its score and token type. For an id
 * out of range: NULL, 0.0f and 0. */
const char *kvs_tokenizer_piece(const kvs_tokenizer *t, int id);
float kvs_tokenizer_score(const kvs_tokenizer *t, int id);
int kvs_tokenizer_type(const kvs_tokenizer *t, int id);
/* Id of the token whose piece is exactly `piece` (GGUF convention, e.g. "\xe2\x96\x81the" or
 * "<s>"), or -1. Normal and user-defined tokens are found in O(1) (the lowest id among
 * duplicates); other types by a scan. */
int kvs_tokenizer_find(const kvs_tokenizer *t, const char *piece);
/* Id of the token whose piece is s[0..len), or -1; O(1). SentencePiece: normal and user-defined
 * tokens only; byte-level BPE: every token. */
int32_t kvs_tokenizer_lookup(const kvs_tokenizer *t, const char *s, size_t len);

/* Encodes UTF-8 text. A BOS is put first if add_bos and the vocabulary's add_bos_token (and it has
 * a BOS id). SentencePiece: a leading space is added to non-empty text (SentencePiece's
 * dummy prefix), spaces become U+2581, every code point maps to its piece or to byte-fallback
 * tokens, then the pair whose merged piece has the highest score is merged repeatedly (ties:
 * leftmost). Byte-level BPE: user-defined tokens are matched as whole tokens in the raw text
 * first (longest first), then every stretch between them is split by the pre-tokenizer and each
 * piece merged by merge rank (bpe.c); no prefix space. Control tokens' text is plain text here.
 * Bytes of invalid UTF-8 each become U+FFFD first (as llama.cpp does).
 * *ids is malloc'd and owned by the caller. */
kvs_status kvs_tokenizer_encode(const kvs_tokenizer *t, const char *text, int add_bos,
                                int32_t **ids, int *n_ids, kvs_error *err);
/* The same with special-token parsing (llama.cpp's parse_special): with it, the text of a
 * control, unknown or user-defined token (e.g. "<|im_start|>", "<|user|>", "<s>") becomes that
 * token wherever it occurs (longest first), and the text between is tokenized as above, each
 * stretch on its own. SentencePiece then gives a stretch the dummy-prefix space when it starts
 * the text or follows a special token, as llama.cpp does. parse_special 0 is
 * kvs_tokenizer_encode. */
kvs_status kvs_tokenizer_encode_ex(const kvs_tokenizer *t, const char *text, int add_bos,
                                   int parse_special, int32_t **ids, int *n_ids, kvs_error *err);
/* Text of token id as it should be printed after token prev: U+2581 becomes ' ', a leading space
 * is dropped right after BOS, <0xNN> byte tokens yield the raw byte, control tokens yield "".
 * Byte-level BPE: a normal token's GPT-2 byte symbols become their bytes, a user-defined one's
 * text is as stored, and nothing is dropped after BOS.
 * (Unused tokens also yield "", the unknown token its piece text, e.g. "<unk>"; an id out of
 * range yields "".)
 * Returns a pointer to a NUL-terminated string valid until the tokenizer is freed (the returned
 * length is in *len, since a byte token may be a NUL byte). */
const char *kvs_tokenizer_decode(const kvs_tokenizer *t, int prev, int id, int *len);

/* Writes tokenizer.ggml.model = "llama", tokens, scores, token_type, bos/eos/unknown ids (and
 * add_bos_token if false); for byte-level BPE model "gpt2", pre, tokens, token_type, merges,
 * scores if the source had them, the ids it has and add_bos_token. */
kvs_status kvs_tokenizer_to_gguf(const kvs_tokenizer *t, kvs_gguf_writer *w);

#endif
