/* Tokenizer front end and SentencePiece-style BPE with byte fallback; byte-level BPE in bpe.c.
 *
 * Two vocabulary models: "llama" (SentencePiece BPE, scores, byte fallback) and "gpt2" (byte-level
 * BPE with merges and a regex pre-tokenizer, bpe.c and pretok.c); both load from GGUF.
 *
 * Storage: all pieces live in one arena (NUL-terminated, GGUF convention with U+2581 for spaces);
 * a second arena holds the decoded text of every token so kvs_tokenizer_decode never allocates.
 * Piece lookup during encoding uses an open-addressing hash table that only holds NORMAL and
 * USER_DEFINED tokens, so user text can never turn into control, unknown or byte tokens through
 * merging; byte-fallback ids are found through a 256-entry table built from the BYTE tokens.
 * A byte-level BPE vocabulary's table holds every token (merges and pieces may name any), its
 * pieces are stored as in the file (GPT-2 byte symbols, e.g. "\xc4\xa0the" for " the"), and
 * its user-defined, control and unknown tokens are also kept in a list by decreasing length,
 * for matching them in the raw text before pre-tokenization. */
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/limits.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretok.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3
#define MAX_PIECE_BYTES (1u << 24)

enum { KIND_SPM = 0, KIND_BPE = 1 };

struct kvs_tokenizer {
    int n;
    int kind;             /* KIND_SPM or KIND_BPE */
    int bos, eos, unk;    /* -1 = none (only possible for BPE) */
    int add_bos;          /* tokenizer.ggml.add_bos_token (SentencePiece default 1, BPE 0) */
    int has_scores;       /* BPE: the file had tokenizer.ggml.scores (written back if so) */
    kvs_bpe *bpe;         /* BPE only */
    int32_t *special;     /* user-defined/control/unknown ids, longest text first (matched in
                             raw text: BPE always, SentencePiece with parse_special) */
    int n_special;
    char *pieces;         /* arena of NUL-terminated pieces */
    size_t *piece_off;
    uint32_t *piece_len;
    float *scores;
    int32_t *types;
    char *dec;            /* arena of NUL-terminated decoded texts */
    size_t *dec_off;
    uint32_t *dec_len;
    int32_t *table;       /* hash table of ids (-1 = empty), size mask + 1 */
    uint32_t mask;
    uint32_t max_merge_len; /* longest piece in the table, in bytes */
    int32_t byte_id[256]; /* id of <0xNN>, or -1 */
};

/* ---------- small helpers ---------- */

typedef struct {
    char *p;
    size_t n, cap;
} strbuf;

static int sb_reserve(strbuf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->n - 1) return -1;
    size_t need = b->n + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int sb_append(strbuf *b, const char *s, size_t len)
{
    if (sb_reserve(b, len)) return -1;
    if (len) memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
    return 0;
}

/* Appends s with every ' ' replaced by U+2581. */
static int sb_append_spaces_to_mark(strbuf *b, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int rc = s[i] == ' ' ? sb_append(b, SPACE_MARK, SPACE_MARK_LEN) : sb_append(b, s + i, 1);
        if (rc) return -1;
    }
    return 0;
}

static int utf8_len(const unsigned char *s, size_t n);

static uint32_t hash_bytes(const char *s, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Byte value of a "<0xNN>" piece, or -1. */
static int parse_byte_piece(const char *s, size_t len)
{
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (hi < 0 || lo < 0) return -1;
    return hi * 16 + lo;
}

static uint32_t rd_le32(const void *p)
{
    const unsigned char *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---------- construction ---------- */

void kvs_tokenizer_free(kvs_tokenizer *t)
{
    if (!t) return;
    free(t->pieces);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->table);
    kvs_bpe_free(t->bpe);
    free(t->special);
    free(t);
}

/* Allocates a tokenizer with room for n tokens (piece arena filled by the caller). */
static kvs_tokenizer *tok_alloc(int n)
{
    kvs_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n = n;
    t->add_bos = 1;
    size_t un = (size_t)n;
    t->piece_off = malloc(un * sizeof *t->piece_off);
    t->piece_len = malloc(un * sizeof *t->piece_len);
    t->scores = malloc(un * sizeof *t->scores);
    t->types = malloc(un * sizeof *t->types);
    t->dec_off = malloc(un * sizeof *t->dec_off);
    t->dec_len = malloc(un * sizeof *t->dec_len);
    if (!t->piece_off || !t->piece_len || !t->scores || !t->types || !t->dec_off ||
        !t->dec_len) {
        kvs_tokenizer_free(t);
        return NULL;
    }
    return t;
}

static const char *piece_ptr(const kvs_tokenizer *t, int id)
{
    return t->pieces + t->piece_off[id];
}

static int32_t table_find(const kvs_tokenizer *t, const char *s, size_t len)
{
    if (len > t->max_merge_len) return -1;
    uint32_t h = hash_bytes(s, len) & t->mask;
    for (;;) {
        int32_t id = t->table[h];
        if (id < 0) return -1;
        if (t->piece_len[id] == len && memcmp(piece_ptr(t, id), s, len) == 0) return id;
        h = (h + 1) & t->mask;
    }
}

/* Completes a tokenizer whose pieces, scores, types and bos/eos/unk are set: validates the token
 * types, builds the byte table, the lookup table and the decode arena. `what` names the source
 * (path or key) in error messages. */
static kvs_status build_special(kvs_tokenizer *t, kvs_error *err);

static kvs_status tok_finish(kvs_tokenizer *t, const char *what, kvs_error *err)
{
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;

    /* table: power of two >= 2n */
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)t->n) cap *= 2;
    t->table = malloc((size_t)cap * sizeof *t->table);
    if (!t->table) return kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", what);
    t->mask = cap - 1;
    for (uint32_t i = 0; i < cap; i++) t->table[i] = -1;
    t->max_merge_len = 0;

    strbuf dec = {0};
    for (int id = 0; id < t->n; id++) {
        const char *p = piece_ptr(t, id);
        uint32_t len = t->piece_len[id];
        int type = t->types[id];
        t->dec_off[id] = dec.n;
        int rc = 0;
        switch (type) {
        case KVS_TOKEN_BYTE: {
            int b = parse_byte_piece(p, len);
            if (b < 0) {
                free(dec.p);
                return kvs_fail(err, KVS_ERR_FORMAT,
                                "%s: token %d has type byte but its piece \"%.*s\" is not <0xNN>",
                                what, id, (int)(len > 32 ? 32 : len), p);
            }
            if (t->byte_id[b] < 0) t->byte_id[b] = id;
            char c = (char)b;
            rc = sb_append(&dec, &c, 1);
            break;
        }
        case KVS_TOKEN_CONTROL:
        case KVS_TOKEN_UNUSED:
            rc = sb_append(&dec, "", 0);
            break;
        case KVS_TOKEN_NORMAL:
        case KVS_TOKEN_USER_DEFINED:
        case KVS_TOKEN_UNKNOWN:
            if (sb_reserve(&dec, len)) {
                rc = -1;
                break;
            }
            if (t->kind == KIND_BPE && type == KVS_TOKEN_NORMAL) {
                /* GPT-2 byte symbols -> bytes (a code point outside the mapping stays as is) */
                for (uint32_t i = 0; i < len;) {
                    int cl = utf8_len((const unsigned char *)p + i, len - i);
                    int b = -1;
                    if (cl == 2)
                        b = kvs_bpe_cpt_byte(((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F));
                    else if (cl == 1)
                        b = kvs_bpe_cpt_byte((unsigned char)p[i]);
                    if (cl < 1) cl = 1;
                    if (b >= 0) dec.p[dec.n++] = (char)b;
                    else
                        for (int k = 0; k < cl; k++) dec.p[dec.n++] = p[i + (uint32_t)k];
                    i += (uint32_t)cl;
                }
            } else if (t->kind == KIND_BPE) { /* user-defined and unknown: the text as stored */
                memcpy(dec.p + dec.n, p, len);
                dec.n += len;
            } else { /* U+2581 -> ' ' */
                for (uint32_t i = 0; i < len;) {
                    if (i + SPACE_MARK_LEN <= len &&
                        memcmp(p + i, SPACE_MARK, SPACE_MARK_LEN) == 0) {
                        dec.p[dec.n++] = ' ';
                        i += SPACE_MARK_LEN;
                    } else {
                        dec.p[dec.n++] = p[i++];
                    }
                }
            }
            dec.p[dec.n] = '\0';
            break;
        default:
            free(dec.p);
            return kvs_fail(err, KVS_ERR_FORMAT, "%s: token %d has invalid token type %d", what,
                            id, type);
        }
        if (rc) {
            free(dec.p);
            return kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", what);
        }
        if (t->kind == KIND_BPE || type == KVS_TOKEN_NORMAL || type == KVS_TOKEN_USER_DEFINED) {
            /* first id wins for duplicate pieces */
            uint32_t h = hash_bytes(p, len) & t->mask;
            int dup = 0;
            while (t->table[h] >= 0) {
                int32_t o = t->table[h];
                if (t->piece_len[o] == len && memcmp(piece_ptr(t, o), p, len) == 0) {
                    dup = 1;
                    break;
                }
                h = (h + 1) & t->mask;
            }
            if (!dup) t->table[h] = id;
            if (len > t->max_merge_len) t->max_merge_len = len;
        }
        /* every branch left dec allocated with a NUL at dec.p[dec.n]: keep it */
        t->dec_len[id] = (uint32_t)(dec.n - t->dec_off[id]);
        dec.n++;
    }
    t->dec = dec.p;
    return build_special(t, err);
}

/* ---------- llama2.c loader ---------- */

static kvs_status read_exact(FILE *f, void *dst, size_t n, const char *path, long long off,
                             kvs_error *err)
{
    if (n && fread(dst, 1, n, f) != n)
        return kvs_fail(err, ferror(f) ? KVS_ERR_IO : KVS_ERR_FORMAT,
                        "%s: read of %zu bytes at offset %lld failed%s", path, n, off,
                        ferror(f) ? "" : " (file shrank while reading?)");
    return KVS_OK;
}

kvs_status kvs_tokenizer_load_llama2c_n(const char *path, int n_vocab, kvs_tokenizer **out,
                                        kvs_error *err)
{
    if (out) *out = NULL;
    if (!path || !out) return kvs_fail(err, KVS_ERR_ARG, "tokenizer: NULL path or output");
    if (n_vocab < 0) return kvs_fail(err, KVS_ERR_ARG, "%s: negative expected vocab size %d", path, n_vocab);

    FILE *f = fopen(path, "rb");
    if (!f) return kvs_fail(err, KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int e = errno;
        fclose(f);
        return kvs_fail(err, KVS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        fclose(f);
        return kvs_fail(err, KVS_ERR_IO, "%s: not a regular file", path);
    }
    const long long size = (long long)st.st_size;

    kvs_status s = KVS_OK;
    kvs_tokenizer *t = NULL;
    strbuf arena = {0};
    char *raw = NULL;
    float *scores = NULL;
    size_t *offs = NULL;
    uint32_t *lens = NULL;
    int n = 0, cap = 0;

    unsigned char hdr[8];
    if (size < 4) {
        s = kvs_fail(err, KVS_ERR_FORMAT,
                     "%s: truncated header: file has %lld byte(s), need 4 for max_token_length", path, size);
        goto done;
    }
    if ((s = read_exact(f, hdr, 4, path, 0, err))) goto done;
    int32_t max_len = (int32_t)rd_le32(hdr);
    if (max_len < 0) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "%s: negative max_token_length %d", path, (int)max_len);
        goto done;
    }
    size_t raw_cap = 0; /* grown on demand: max_token_length itself is not trusted */

    long long off = 4;
    for (;;) {
        if (n_vocab > 0 ? n >= n_vocab : off >= size) break;
        if (n >= KVS_MAX_VOCAB) {
            s = kvs_fail(err, KVS_ERR_UNSUPPORTED, "%s: more than %d tokens; kvslim supports at "
                         "most %d", path, n, KVS_MAX_VOCAB);
            goto done;
        }
        if (size - off < 8) {
            if (n_vocab > 0 && off == size)
                s = kvs_fail(err, KVS_ERR_FORMAT,
                             "%s: truncated: file ends after %d of %d tokens (offset %lld)", path,
                             n, n_vocab, off);
            else
                s = kvs_fail(err, KVS_ERR_FORMAT,
                             "%s: token %d: truncated at offset %lld: need 8 bytes for score and "
                             "length, %lld left",
                             path, n, off, size - off);
            goto done;
        }
        if ((s = read_exact(f, hdr, 8, path, off, err))) goto done;
        float score = f32_from_bits(rd_le32(hdr));
        int32_t len = (int32_t)rd_le32(hdr + 4);
        if (len < 0) {
            s = kvs_fail(err, KVS_ERR_FORMAT, "%s: token %d: negative byte length %d at offset %lld",
                         path, n, (int)len, off + 4);
            goto done;
        }
        if (len > max_len) {
            s = kvs_fail(err, KVS_ERR_FORMAT,
                         "%s: token %d: byte length %d exceeds max_token_length %d (offset %lld)",
                         path, n, (int)len, (int)max_len, off + 4);
            goto done;
        }
        if ((uint32_t)len > MAX_PIECE_BYTES ||
            (size_t)len * SPACE_MARK_LEN > KVS_MAX_VOCAB_BYTES - arena.n) {
            s = kvs_fail(err, KVS_ERR_UNSUPPORTED,
                         "%s: token %d: byte length %d at offset %lld exceeds kvslim's limits "
                         "(%u bytes a token, %u bytes for all tokens)", path, n, (int)len,
                         off + 4, MAX_PIECE_BYTES, KVS_MAX_VOCAB_BYTES);
            goto done;
        }
        if ((long long)len > size - off - 8) {
            s = kvs_fail(err, KVS_ERR_FORMAT,
                         "%s: token %d: truncated: byte length %d at offset %lld but only %lld "
                         "bytes left",
                         path, n, (int)len, off + 4, size - off - 8);
            goto done;
        }
        if (isnan(score)) {
            s = kvs_fail(err, KVS_ERR_FORMAT, "%s: token %d: score is NaN (offset %lld)", path, n,
                         off);
            goto done;
        }
        if ((size_t)len + 1 > raw_cap) {
            char *nr = realloc(raw, (size_t)len + 1);
            if (!nr) {
                s = kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            raw = nr;
            raw_cap = (size_t)len + 1;
        }
        if ((s = read_exact(f, raw, (size_t)len, path, off + 8, err))) goto done;
        off += 8 + len;

        if (n == cap) {
            int ncap = cap ? (cap > INT32_MAX / 2 ? INT32_MAX : cap * 2) : 512;
            float *ns = realloc(scores, (size_t)ncap * sizeof *ns);
            if (ns) scores = ns;
            size_t *no = realloc(offs, (size_t)ncap * sizeof *no);
            if (no) offs = no;
            uint32_t *nl = realloc(lens, (size_t)ncap * sizeof *nl);
            if (nl) lens = nl;
            if (!ns || !no || !nl) {
                s = kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            cap = ncap;
        }
        scores[n] = score;
        offs[n] = arena.n;
        int rc;
        /* llama2.c stores the specials with decoration ("\n<s>\n"); use the canonical names */
        if (n == 0) rc = sb_append(&arena, "<unk>", 5);
        else if (n == 1) rc = sb_append(&arena, "<s>", 3);
        else if (n == 2) rc = sb_append(&arena, "</s>", 4);
        else rc = sb_append_spaces_to_mark(&arena, raw, (size_t)len);
        if (rc || sb_append(&arena, "", 0)) {
            s = kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        lens[n] = (uint32_t)(arena.n - offs[n]);
        arena.n++; /* keep the NUL */
        n++;
    }
    if (n_vocab > 0 && off != size) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "%s: %lld trailing bytes after %d tokens (offset %lld)",
                     path, size - off, n, off);
        goto done;
    }
    if (n < 3) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "%s: %d tokens, need at least 3 (<unk>, <s>, </s>)",
                     path, n);
        goto done;
    }

    t = tok_alloc(n);
    if (!t) {
        s = kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    t->pieces = arena.p;
    arena.p = NULL;
    memcpy(t->scores, scores, (size_t)n * sizeof *scores);
    memcpy(t->piece_off, offs, (size_t)n * sizeof *offs);
    memcpy(t->piece_len, lens, (size_t)n * sizeof *lens);
    for (int i = 0; i < n; i++) {
        if (i == 0) t->types[i] = KVS_TOKEN_UNKNOWN;
        else if (i <= 2) t->types[i] = KVS_TOKEN_CONTROL;
        else if (parse_byte_piece(piece_ptr(t, i), t->piece_len[i]) >= 0) t->types[i] = KVS_TOKEN_BYTE;
        else t->types[i] = KVS_TOKEN_NORMAL;
    }
    t->unk = 0;
    t->bos = 1;
    t->eos = 2;
    if ((s = tok_finish(t, path, err))) goto done;
    *out = t;
    t = NULL;

done:
    fclose(f);
    kvs_tokenizer_free(t);
    free(arena.p);
    free(raw);
    free(scores);
    free(offs);
    free(lens);
    return s;
}

kvs_status kvs_tokenizer_load_llama2c(const char *path, kvs_tokenizer **out, kvs_error *err)
{
    return kvs_tokenizer_load_llama2c_n(path, 0, out, err);
}

/* ---------- GGUF ---------- */

#define K_MODEL "tokenizer.ggml.model"
#define K_PRE "tokenizer.ggml.pre"
#define K_TOKENS "tokenizer.ggml.tokens"
#define K_SCORES "tokenizer.ggml.scores"
#define K_TYPES "tokenizer.ggml.token_type"
#define K_MERGES "tokenizer.ggml.merges"
#define K_BOS "tokenizer.ggml.bos_token_id"
#define K_EOS "tokenizer.ggml.eos_token_id"
#define K_UNK "tokenizer.ggml.unknown_token_id"
#define K_ADD_BOS "tokenizer.ggml.add_bos_token"

static kvs_status get_array(const kvs_gguf *g, const char *key, kvs_gguf_type want, uint64_t *n,
                            kvs_error *err)
{
    if (kvs_gguf_find_key(g, key) < 0)
        return kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: missing key %s", key);
    kvs_gguf_type et;
    kvs_status s = kvs_gguf_get_arr(g, key, &et, n, err);
    if (s) return s;
    if (et != want)
        return kvs_fail(err, KVS_ERR_FORMAT,
                        "tokenizer: key %s: array of %s, expected an array of %s", key,
                        kvs_gguf_type_name(et), kvs_gguf_type_name(want));
    return KVS_OK;
}

/* Reads an optional token id key; *id is left as is when the key is absent. */
static kvs_status get_id(const kvs_gguf *g, const char *key, int n, int *id, kvs_error *err)
{
    if (kvs_gguf_find_key(g, key) < 0) return KVS_OK;
    uint32_t v = 0;
    kvs_status s = kvs_gguf_get_u32(g, key, &v, err);
    if (s) return s;
    if (v >= (uint32_t)n)
        return kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s: token id %u out of range (vocab %d)",
                        key, v, n);
    *id = (int)v;
    return KVS_OK;
}

static int cmp_special(const void *a, const void *b, void *ctx);

/* The user-defined, control and unknown tokens, longest text first (ties: lower id first), for
 * matching them in the raw text. */
static kvs_status build_special(kvs_tokenizer *t, kvs_error *err)
{
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        int ty = t->types[i];
        if ((ty == KVS_TOKEN_USER_DEFINED || ty == KVS_TOKEN_CONTROL || ty == KVS_TOKEN_UNKNOWN) &&
            t->piece_len[i] > 0)
            n++;
    }
    t->special = malloc((size_t)(n ? n : 1) * sizeof *t->special);
    if (!t->special) return kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
    t->n_special = 0;
    for (int i = 0; i < t->n; i++) {
        int ty = t->types[i];
        if ((ty == KVS_TOKEN_USER_DEFINED || ty == KVS_TOKEN_CONTROL || ty == KVS_TOKEN_UNKNOWN) &&
            t->piece_len[i] > 0)
            t->special[t->n_special++] = i;
    }
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);
    return KVS_OK;
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const kvs_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->piece_len[x] != t->piece_len[y]) return t->piece_len[x] > t->piece_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

kvs_status kvs_tokenizer_from_gguf(const kvs_gguf *g, kvs_tokenizer **out, kvs_error *err)
{
    if (out) *out = NULL;
    if (!g || !out) return kvs_fail(err, KVS_ERR_ARG, "tokenizer: NULL gguf or output");

    kvs_gguf_str model;
    if (kvs_gguf_find_key(g, K_MODEL) < 0)
        return kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: missing key %s", K_MODEL);
    kvs_status s = kvs_gguf_get_str(g, K_MODEL, &model, err);
    if (s) return s;
    int kind;
    if (model.len == 5 && memcmp(model.data, "llama", 5) == 0)
        kind = KIND_SPM;
    else if (model.len == 4 && memcmp(model.data, "gpt2", 4) == 0)
        kind = KIND_BPE;
    else
        return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                        "tokenizer: key %s is \"%.*s\": the supported vocabularies are \"llama\" "
                        "(SentencePiece BPE) and \"gpt2\" (byte-level BPE)",
                        K_MODEL, (int)(model.len > 64 ? 64 : model.len), model.data);

    /* The pre-tokenizer first, so that an unsupported one is reported before the vocabulary is
     * read. Without the key a BPE vocabulary gets the "default" list, as llama.cpp does (it logs
     * "missing pre-tokenizer type, using: 'default'"; kvslim has no log hook, so this is
     * silent). */
    kvs_pretok *pre = NULL;
    if (kind == KIND_BPE) {
        const char *pname = "default";
        size_t plen = 7;
        if (kvs_gguf_find_key(g, K_PRE) >= 0) {
            kvs_gguf_str ps;
            if ((s = kvs_gguf_get_str(g, K_PRE, &ps, err))) return s;
            pname = ps.data;
            plen = (size_t)ps.len;
        }
        if ((s = kvs_pretok_new(pname, plen, &pre, err))) return s;
    }

    uint64_t n_tok, n_sc = 0, n_ty;
    int has_scores = kind == KIND_SPM || kvs_gguf_find_key(g, K_SCORES) >= 0;
    const unsigned char *sc = NULL, *ty = NULL;
    if ((s = get_array(g, K_TOKENS, KVS_GGUF_STRING, &n_tok, err))) goto fail_pre;
    if (has_scores && (s = get_array(g, K_SCORES, KVS_GGUF_FLOAT32, &n_sc, err))) goto fail_pre;
    if ((s = get_array(g, K_TYPES, KVS_GGUF_INT32, &n_ty, err))) goto fail_pre;
    if (n_tok == 0) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s is empty", K_TOKENS);
        goto fail_pre;
    }
    if (n_tok > KVS_MAX_VOCAB) {
        s = kvs_fail(err, KVS_ERR_UNSUPPORTED, "tokenizer: key %s has %llu entries; kvslim "
                     "supports at most %d", K_TOKENS, (unsigned long long)n_tok, KVS_MAX_VOCAB);
        goto fail_pre;
    }
    if (has_scores && n_sc != n_tok) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s has %llu entries but %s has %llu",
                     K_SCORES, (unsigned long long)n_sc, K_TOKENS, (unsigned long long)n_tok);
        goto fail_pre;
    }
    if (n_ty != n_tok) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s has %llu entries but %s has %llu",
                     K_TYPES, (unsigned long long)n_ty, K_TOKENS, (unsigned long long)n_tok);
        goto fail_pre;
    }
    if (has_scores) sc = kvs_gguf_arr_data(g, K_SCORES);
    ty = kvs_gguf_arr_data(g, K_TYPES);
    if ((has_scores && !sc) || !ty) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: cannot read the data of %s",
                     !ty ? K_TYPES : K_SCORES);
        goto fail_pre;
    }

    int n = (int)n_tok;
    kvs_tokenizer *t = tok_alloc(n);
    if (!t) {
        s = kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto fail_pre;
    }
    t->kind = kind;
    t->has_scores = has_scores;
    strbuf arena = {0};
    for (int i = 0; i < n; i++) {
        kvs_gguf_str str;
        if ((s = kvs_gguf_arr_str(g, K_TOKENS, (uint64_t)i, &str, err))) goto fail;
        if (str.len > MAX_PIECE_BYTES) {
            s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s: token %d is %llu bytes long",
                         K_TOKENS, i, (unsigned long long)str.len);
            goto fail;
        }
        if (str.len > KVS_MAX_VOCAB_BYTES - arena.n) {
            s = kvs_fail(err, KVS_ERR_UNSUPPORTED, "tokenizer: key %s: the token texts up to "
                         "token %d exceed kvslim's limit of %u bytes", K_TOKENS, i,
                         KVS_MAX_VOCAB_BYTES);
            goto fail;
        }
        t->piece_off[i] = arena.n;
        t->piece_len[i] = (uint32_t)str.len;
        if (sb_append(&arena, str.data, (size_t)str.len)) {
            s = kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        arena.n++; /* keep the NUL */
        t->scores[i] = sc ? f32_from_bits(rd_le32(sc + 4 * (size_t)i)) : 0.0f;
        int32_t type = (int32_t)rd_le32(ty + 4 * (size_t)i);
        if (type < KVS_TOKEN_NORMAL || type > KVS_TOKEN_BYTE) {
            s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s: token %d has invalid type %d",
                         K_TYPES, i, (int)type);
            goto fail;
        }
        t->types[i] = type;
        if (isnan(t->scores[i])) {
            s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s: score of token %d is NaN",
                         K_SCORES, i);
            goto fail;
        }
    }
    t->pieces = arena.p;
    arena.p = NULL;
    if (!t->pieces) {
        s = kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }

    if (kind == KIND_SPM) { /* SentencePiece/llama defaults when the ids are absent */
        t->unk = 0;
        t->bos = n > 1 ? 1 : 0;
        t->eos = n > 2 ? 2 : 0;
        t->add_bos = 1;
    } else { /* BPE: no defaults (llama.cpp's 11 is an artefact of one model) */
        t->unk = t->bos = t->eos = -1;
        t->add_bos = 0;
    }
    if ((s = get_id(g, K_BOS, n, &t->bos, err))) goto fail;
    if ((s = get_id(g, K_EOS, n, &t->eos, err))) goto fail;
    if ((s = get_id(g, K_UNK, n, &t->unk, err))) goto fail;
    if ((s = kvs_gguf_get_bool_opt(g, K_ADD_BOS, &t->add_bos, err))) goto fail;
    if ((s = tok_finish(t, "tokenizer: GGUF vocabulary (" K_TOKENS ", " K_TYPES ")", err))) goto fail;
    if (kind == KIND_BPE) {
        kvs_pretok *p = pre;
        pre = NULL; /* kvs_bpe_new owns it now, even on failure */
        if ((s = kvs_bpe_new(t, g, K_MERGES, p, &t->bpe, err))) goto fail;
    }
    *out = t;
    return KVS_OK;

fail:
    free(arena.p);
    kvs_tokenizer_free(t);
fail_pre:
    kvs_pretok_free(pre);
    return s;
}

kvs_status kvs_tokenizer_load_gguf(const char *path, kvs_tokenizer **out, kvs_error *err)
{
    if (out) *out = NULL;
    if (!path || !out) return kvs_fail(err, KVS_ERR_ARG, "tokenizer: NULL path or output");
    kvs_gguf *g = NULL;
    kvs_status s = kvs_gguf_open(path, &g, err);
    if (s) return s;
    s = kvs_tokenizer_from_gguf(g, out, err);
    kvs_gguf_close(g);
    if (s && err) {
        char tmp[sizeof err->msg];
        memcpy(tmp, err->msg, sizeof tmp);
        kvs_fail(err, s, "%s: %.400s", path, tmp);
    }
    return s;
}

/* The merges of a BPE vocabulary as "left right" strings. */
static kvs_status bpe_merge_strings(const kvs_tokenizer *t, char ***out, size_t *n_out)
{
    uint32_t n = kvs_bpe_n_merges(t->bpe);
    size_t total = 0;
    for (uint32_t r = 0; r < n; r++) {
        int32_t l, rt;
        kvs_bpe_merge_at(t->bpe, r, &l, &rt);
        total += (size_t)t->piece_len[l] + t->piece_len[rt] + 2;
    }
    char **v = malloc((n ? n : 1) * sizeof *v);
    char *arena = malloc(total ? total : 1);
    if (!v || !arena) {
        free(v);
        free(arena);
        return KVS_ERR_NOMEM;
    }
    char *p = arena;
    for (uint32_t r = 0; r < n; r++) {
        int32_t l, rt;
        kvs_bpe_merge_at(t->bpe, r, &l, &rt);
        v[r] = p;
        memcpy(p, piece_ptr(t, l), t->piece_len[l]);
        p += t->piece_len[l];
        *p++ = ' ';
        memcpy(p, piece_ptr(t, rt), t->piece_len[rt]);
        p += t->piece_len[rt];
        *p++ = '\0';
    }
    /* v[0] == arena when n > 0: the caller frees v[0] (if n) and v */
    if (n == 0) free(arena);
    *out = v;
    *n_out = n;
    return KVS_OK;
}

kvs_status kvs_tokenizer_to_gguf(const kvs_tokenizer *t, kvs_gguf_writer *w)
{
    if (!t || !w) return KVS_ERR_ARG;
    size_t n = (size_t)t->n;
    const char **v = malloc(n * sizeof *v);
    if (!v) return KVS_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) v[i] = piece_ptr(t, (int)i);
    kvs_status s;
    if (t->kind == KIND_BPE) {
        char **merges = NULL;
        size_t nm = 0;
        s = kvs_gguf_set_str(w, K_MODEL, "gpt2");
        if (!s) s = kvs_gguf_set_str(w, K_PRE, kvs_pretok_name(kvs_bpe_pretok(t->bpe)));
        if (!s) s = kvs_gguf_set_arr_str(w, K_TOKENS, v, n);
        if (!s && t->has_scores) s = kvs_gguf_set_arr_f32(w, K_SCORES, t->scores, n);
        if (!s) s = kvs_gguf_set_arr_i32(w, K_TYPES, t->types, n);
        if (!s) s = bpe_merge_strings(t, &merges, &nm);
        if (!s) s = kvs_gguf_set_arr_str(w, K_MERGES, (const char *const *)merges, nm);
        if (merges) {
            if (nm) free(merges[0]);
            free(merges);
        }
        if (!s && t->bos >= 0) s = kvs_gguf_set_u32(w, K_BOS, (uint32_t)t->bos);
        if (!s && t->eos >= 0) s = kvs_gguf_set_u32(w, K_EOS, (uint32_t)t->eos);
        if (!s && t->unk >= 0) s = kvs_gguf_set_u32(w, K_UNK, (uint32_t)t->unk);
        if (!s) s = kvs_gguf_set_bool(w, K_ADD_BOS, t->add_bos);
    } else {
        s = kvs_gguf_set_str(w, K_MODEL, "llama");
        if (!s) s = kvs_gguf_set_arr_str(w, K_TOKENS, v, n);
        if (!s) s = kvs_gguf_set_arr_f32(w, K_SCORES, t->scores, n);
        if (!s) s = kvs_gguf_set_arr_i32(w, K_TYPES, t->types, n);
        if (!s) s = kvs_gguf_set_u32(w, K_BOS, (uint32_t)t->bos);
        if (!s) s = kvs_gguf_set_u32(w, K_EOS, (uint32_t)t->eos);
        if (!s) s = kvs_gguf_set_u32(w, K_UNK, (uint32_t)t->unk);
        if (!s && !t->add_bos) s = kvs_gguf_set_bool(w, K_ADD_BOS, 0);
    }
    free(v);
    return s;
}

/* ---------- accessors ---------- */

int kvs_tokenizer_n_vocab(const kvs_tokenizer *t) { return t ? t->n : 0; }
int kvs_tokenizer_bos(const kvs_tokenizer *t) { return t ? t->bos : -1; }
int kvs_tokenizer_eos(const kvs_tokenizer *t) { return t ? t->eos : -1; }

const char *kvs_tokenizer_piece(const kvs_tokenizer *t, int id)
{
    if (!t || id < 0 || id >= t->n) return NULL;
    return piece_ptr(t, id);
}

float kvs_tokenizer_score(const kvs_tokenizer *t, int id)
{
    if (!t || id < 0 || id >= t->n) return 0.0f;
    return t->scores[id];
}

int kvs_tokenizer_type(const kvs_tokenizer *t, int id)
{
    if (!t || id < 0 || id >= t->n) return 0;
    return t->types[id];
}

int kvs_tokenizer_unk(const kvs_tokenizer *t) { return t ? t->unk : -1; }
int kvs_tokenizer_add_bos(const kvs_tokenizer *t) { return t ? t->add_bos : 0; }
int kvs_tokenizer_is_bpe(const kvs_tokenizer *t) { return t && t->kind == KIND_BPE; }

int32_t kvs_tokenizer_lookup(const kvs_tokenizer *t, const char *s, size_t len)
{
    return t && (s || !len) ? table_find(t, s, len) : -1;
}

int kvs_tokenizer_find(const kvs_tokenizer *t, const char *piece)
{
    if (!t || !piece) return -1;
    size_t len = strlen(piece);
    int32_t id = table_find(t, piece, len);
    if (id >= 0) return id;
    for (int i = 0; i < t->n; i++) /* control/byte/unknown pieces are not in the table */
        if (t->piece_len[i] == len && memcmp(piece_ptr(t, i), piece, len) == 0) return i;
    return -1;
}

const char *kvs_tokenizer_decode(const kvs_tokenizer *t, int prev, int id, int *len)
{
    if (!t || id < 0 || id >= t->n) {
        if (len) *len = 0;
        return "";
    }
    const char *p = t->dec + t->dec_off[id];
    int l = (int)t->dec_len[id];
    int type = t->types[id];
    if (t->kind == KIND_SPM && prev == t->bos && l > 0 && p[0] == ' ' && type != KVS_TOKEN_BYTE) {
        p++;
        l--;
    }
    if (len) *len = l;
    return p;
}

/* ---------- encoding ---------- */

typedef struct {
    int32_t id;
    int start, len; /* bytes of the normalised text */
    int prev, next; /* -1 at the ends */
    int mergeable;  /* 0 for byte-fallback symbols */
} symbol;

typedef struct {
    float score;
    int left, right;
    int llen, rlen;
    int32_t id;
} bigram;

/* a ranks above b: higher score, then further left */
static int bigram_above(const bigram *a, const bigram *b)
{
    if (a->score != b->score) return a->score > b->score;
    return a->left < b->left;
}

static void heap_push(bigram *h, int *n, bigram v)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!bigram_above(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bigram heap_pop(bigram *h, int *n)
{
    bigram top = h[0];
    bigram last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bigram_above(&h[c + 1], &h[c])) c++;
        if (!bigram_above(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const kvs_tokenizer *t, const char *buf, const symbol *sym, int l, bigram *h,
                     int *nh)
{
    if (l < 0) return;
    int r = sym[l].next;
    if (r < 0 || !sym[l].mergeable || !sym[r].mergeable) return;
    int32_t id = table_find(t, buf + sym[l].start, (size_t)sym[l].len + (size_t)sym[r].len);
    if (id < 0) return;
    bigram b = {t->scores[id], l, r, sym[l].len, sym[r].len, id};
    heap_push(h, nh, b);
}

/* Length of the valid UTF-8 sequence starting at s (n bytes left), or 0 if invalid. */
static int utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if ((size_t)len > n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

/* SentencePiece on text[0..tlen): spaces become U+2581 (a dummy-prefix one first if prefix),
 * every code point its piece or byte-fallback tokens, then the best-scored merges; the ids are
 * appended to out. */
static kvs_status encode_spm_frag(const kvs_tokenizer *t, const char *text, size_t tlen,
                                  int prefix, kvs_idvec *out, kvs_error *err)
{
    kvs_status s = KVS_OK;
    strbuf buf = {0};
    symbol *sym = NULL;
    bigram *heap = NULL;
    int nsym = 0;

    if (tlen > 0) {
        if (sb_reserve(&buf, 3 * tlen + 3)) goto nomem;
        if (prefix) sb_append(&buf, SPACE_MARK, SPACE_MARK_LEN); /* dummy prefix */
        for (size_t i = 0; i < tlen; i++) {
            if (text[i] == ' ') {
                memcpy(buf.p + buf.n, SPACE_MARK, SPACE_MARK_LEN);
                buf.n += SPACE_MARK_LEN;
            } else {
                buf.p[buf.n++] = text[i];
            }
        }
        buf.p[buf.n] = '\0';

        sym = malloc(buf.n * sizeof *sym); /* at most one symbol per byte */
        if (!sym) goto nomem;
        const unsigned char *u = (const unsigned char *)buf.p;
        for (size_t i = 0; i < buf.n;) {
            int cl = utf8_len(u + i, buf.n - i);
            int32_t id = cl > 0 ? table_find(t, buf.p + i, (size_t)cl) : -1;
            if (id >= 0) {
                sym[nsym] = (symbol){id, (int)i, cl, nsym - 1, nsym + 1, 1};
                nsym++;
                i += (size_t)cl;
                continue;
            }
            int nb = cl > 0 ? cl : 1; /* invalid UTF-8: one byte at a time */
            for (int k = 0; k < nb; k++) {
                int32_t bid = t->byte_id[u[i + (size_t)k]];
                if (bid < 0) bid = t->unk;
                sym[nsym] = (symbol){bid, (int)(i + (size_t)k), 1, nsym - 1, nsym + 1, 0};
                nsym++;
            }
            i += (size_t)nb;
        }
        sym[nsym - 1].next = -1;

        /* each merge removes a symbol and pushes at most two pairs */
        heap = malloc((size_t)3 * (size_t)nsym * sizeof *heap);
        if (!heap) goto nomem;
        int nh = 0;
        for (int i = 0; i + 1 < nsym; i++) try_pair(t, buf.p, sym, i, heap, &nh);
        while (nh > 0) {
            bigram b = heap_pop(heap, &nh);
            symbol *L = &sym[b.left], *R = &sym[b.right];
            if (L->len != b.llen || R->len != b.rlen || R->len == 0 || L->next != b.right)
                continue; /* stale */
            L->id = b.id;
            L->len += R->len;
            L->next = R->next;
            if (R->next >= 0) sym[R->next].prev = b.left;
            R->len = 0;
            try_pair(t, buf.p, sym, L->prev, heap, &nh);
            try_pair(t, buf.p, sym, b.left, heap, &nh);
        }
    }

    for (int i = 0; i < nsym; i = sym[i].next < 0 ? nsym : sym[i].next) {
        if (sym[i].id < 0) {
            s = kvs_fail(err, KVS_ERR_ARG,
                         "tokenizer_encode: byte 0x%02X has no byte token and the vocabulary has "
                         "no unknown token",
                         (unsigned char)buf.p[sym[i].start]);
            goto done;
        }
        if (kvs_idvec_push(out, sym[i].id)) goto nomem;
    }
    goto done;

nomem:
    s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
done:
    free(buf.p);
    free(sym);
    free(heap);
    return s;
}

/* ---------- special tokens in the raw text ---------- */

typedef struct {
    int32_t id; /* a matched added token, or -1 for raw text */
    size_t off, len;
} frag;

typedef struct {
    frag *v;
    size_t n, cap;
} fragvec;

static int frag_push(fragvec *f, int32_t id, size_t off, size_t len)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        frag *v = realloc(f->v, cap * sizeof *v);
        if (!v) return -1;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = (frag){id, off, len};
    return 0;
}

/* As llama.cpp's tokenizer_st_partition: every added token, longest first, splits the raw
 * fragments left by the longer ones at each of its occurrences (scanning left to right); the
 * raw fragments between them are then tokenized separately. User-defined tokens are always
 * matched; control and unknown tokens only with parse_special. text[0..tlen)
 * is not empty. On success *out holds the fragments in text order (the caller frees out->v). */
static kvs_status partition(const kvs_tokenizer *t, const char *text, size_t tlen,
                            int parse_special, fragvec *out, kvs_error *err)
{
    fragvec a = {0}, b = {0};
    if (frag_push(&a, -1, 0, tlen)) goto nomem;
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        int type = t->types[id];
        if (type != KVS_TOKEN_USER_DEFINED && !parse_special) continue;
        const char *p = piece_ptr(t, id);
        size_t pl = t->piece_len[id];
        if (pl > tlen || !memmem(text, tlen, p, pl)) continue;
        b.n = 0;
        for (size_t i = 0; i < a.n; i++) {
            frag f = a.v[i];
            if (f.id >= 0) {
                if (frag_push(&b, f.id, f.off, f.len)) goto nomem;
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            while (end - pos >= pl) {
                const char *q = memmem(text + pos, end - pos, p, pl);
                if (!q) break;
                size_t m = (size_t)(q - text);
                if (m > pos && frag_push(&b, -1, pos, m - pos)) goto nomem;
                if (frag_push(&b, id, m, pl)) goto nomem;
                pos = m + pl;
            }
            if (pos < end && frag_push(&b, -1, pos, end - pos)) goto nomem;
        }
        fragvec tmp = a;
        a = b;
        b = tmp;
    }
    free(b.v);
    *out = a;
    return KVS_OK;
nomem:
    free(a.v);
    free(b.v);
    return kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
}

/* SentencePiece. Without parse_special the whole text is one fragment (user-defined tokens are
 * reached through merges, as before). With it, special tokens split the text as in llama.cpp,
 * and a raw fragment gets the dummy-prefix space when it comes first or right after a special
 * token (llama.cpp's is_prev_special), so "<|user|>\nhi" tokenizes as the marker, then " \nhi". */
static kvs_status encode_spm(const kvs_tokenizer *t, const char *text, int add_bos,
                             int parse_special, kvs_idvec *out, kvs_error *err)
{
    size_t tlen = strlen(text);
    if (tlen > (size_t)(INT_MAX / 4))
        return kvs_fail(err, KVS_ERR_ARG, "the text to tokenize is too long: %zu bytes (at most "
                        "%d)", tlen, INT_MAX / 4);
    if (add_bos && kvs_idvec_push(out, t->bos))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
    if (!parse_special || tlen == 0) return encode_spm_frag(t, text, tlen, 1, out, err);
    fragvec f = {0};
    kvs_status s = partition(t, text, tlen, 1, &f, err);
    int prev_special = 1;
    for (size_t i = 0; i < f.n && s == KVS_OK; i++) {
        if (f.v[i].id >= 0) {
            if (kvs_idvec_push(out, f.v[i].id))
                s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text",
                             tlen);
            prev_special = 1;
        } else {
            s = encode_spm_frag(t, text + f.v[i].off, f.v[i].len, prev_special, out, err);
            prev_special = 0;
        }
    }
    free(f.v);
    return s;
}

/* ---------- byte-level BPE: added tokens, then pre-tokenizer and merges (bpe.c) ---------- */

/* User-defined tokens are always matched as whole tokens in the raw text; control and unknown
 * tokens only with parse_special; the stretches between are pre-tokenized and merged. */
static kvs_status encode_bpe(const kvs_tokenizer *t, const char *text, size_t tlen, int add_bos,
                             int parse_special, kvs_idvec *out, kvs_error *err)
{
    if (add_bos && kvs_idvec_push(out, t->bos))
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
    if (tlen == 0) return KVS_OK;
    fragvec a = {0};
    kvs_status s = partition(t, text, tlen, parse_special, &a, err);
    for (size_t i = 0; i < a.n && s == KVS_OK; i++) {
        if (a.v[i].id >= 0) {
            if (kvs_idvec_push(out, a.v[i].id))
                s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text",
                             tlen);
        } else {
            s = kvs_bpe_encode(t->bpe, t, text + a.v[i].off, a.v[i].len, out, err);
        }
    }
    free(a.v);
    return s;
}

kvs_status kvs_tokenizer_encode_ex(const kvs_tokenizer *t, const char *text, int add_bos,
                                   int parse_special, int32_t **ids, int *n_ids, kvs_error *err)
{
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!t || !text || !ids || !n_ids)
        return kvs_fail(err, KVS_ERR_ARG, "tokenize: the tokenizer, text or output is NULL");
    add_bos = add_bos && t->add_bos && t->bos >= 0;
    if (t->kind == KIND_SPM) {
        kvs_idvec v = {0};
        kvs_status s = encode_spm(t, text, add_bos, parse_special, &v, err);
        if (s == KVS_OK && !v.v && !(v.v = malloc(sizeof *v.v)))
            s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing text");
        if (s) {
            free(v.v);
            return s;
        }
        *ids = v.v;
        *n_ids = (int)v.n;
        return KVS_OK;
    }

    size_t tlen = strlen(text);
    if (tlen > (size_t)(INT_MAX / 4))
        return kvs_fail(err, KVS_ERR_ARG, "the text to tokenize is too long: %zu bytes (at most "
                        "%d)", tlen, INT_MAX / 4);
    /* Invalid UTF-8: every byte that is not part of a valid sequence becomes U+FFFD, as in
     * llama.cpp (and as text decoded with replacement reaches the Hugging Face tokenizers).
     * Keeping such bytes would make vocabularies differ: some have no token for them (falcon's
     * 0xC0, 0xF5...), others have a user-defined token that means a character (DeepSeek's "ý"
     * for 0xFD), which would decode to other bytes. */
    char *clean = NULL;
    const unsigned char *u = (const unsigned char *)text;
    size_t bad = 0;
    for (size_t i = 0; i < tlen;) {
        int cl = utf8_len(u + i, tlen - i);
        if (cl > 0) i += (size_t)cl;
        else bad++, i++;
    }
    if (bad) {
        if (bad > (size_t)(INT_MAX / 4) - tlen / 3)
            return kvs_fail(err, KVS_ERR_ARG, "the text to tokenize is too long: %zu bytes with %zu "
                            "invalid UTF-8 bytes", tlen, bad);
        clean = malloc(tlen + 2 * bad + 1);
        if (!clean)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
        size_t m = 0;
        for (size_t i = 0; i < tlen;) {
            int cl = utf8_len(u + i, tlen - i);
            if (cl > 0) {
                memcpy(clean + m, text + i, (size_t)cl);
                m += (size_t)cl;
                i += (size_t)cl;
            } else {
                memcpy(clean + m, "\xef\xbf\xbd", 3);
                m += 3;
                i++;
            }
        }
        clean[m] = '\0';
        text = clean;
        tlen = m;
    }
    kvs_idvec v = {0};
    kvs_status s = encode_bpe(t, text, tlen, add_bos, parse_special, &v, err);
    free(clean);
    if (s == KVS_OK && !v.v && !(v.v = malloc(sizeof *v.v)))
        s = kvs_fail(err, KVS_ERR_NOMEM, "out of memory tokenizing %zu bytes of text", tlen);
    if (s) {
        free(v.v);
        return s;
    }
    *ids = v.v;
    *n_ids = (int)v.n;
    return KVS_OK;
}

kvs_status kvs_tokenizer_encode(const kvs_tokenizer *t, const char *text, int add_bos,
                                int32_t **ids, int *n_ids, kvs_error *err)
{
    return kvs_tokenizer_encode_ex(t, text, add_bos, 0, ids, n_ids, err);
}

