/* Byte-level BPE (GPT-2 style): the byte <-> symbol mapping, merge ranks and the merge loop.
 *
 * The byte-to-symbol mapping is a bijection on single bytes, so merging works on byte ranges of
 * the raw text: a symbol is a byte range with the id of its token, and a merge is looked up by
 * the pair of ids in an open-addressing table (pair -> rank and merged id). The merge loop is
 * the usual one: a binary heap of candidate pairs ordered by rank then position, symbols in a
 * linked list, stale heap entries skipped when popped; O(n log n) per piece. */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

struct kvs_bpe {
    kvs_pretok *pre;
    uint32_t n_merges;
    int32_t *mleft, *mright; /* per rank */
    uint64_t *keys;          /* pair table: left << 32 | right, EMPTY if free */
    int32_t *rank, *merged;
    uint32_t mask;
    int32_t byte_id[256]; /* token of each byte's symbol, or -1 */
};

#define EMPTY UINT64_MAX

int kvs_idvec_push(kvs_idvec *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        if (cap > SIZE_MAX / sizeof *v->v) return -1;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) return -1;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return 0;
}

static int printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static uint32_t byte_cpt(unsigned b)
{
    if (printable(b)) return b;
    /* the non-printable bytes in order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD */
    unsigned k = b <= 0x20 ? b : b <= 0xA0 ? 33 + (b - 0x7F) : 67;
    return 256 + k;
}

int kvs_bpe_byte_utf8(unsigned b, char out[4])
{
    uint32_t cp = byte_cpt(b & 0xFF);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int kvs_bpe_cpt_byte(uint32_t cp)
{
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned k = cp - 256;
    return k <= 32 ? (int)k : k <= 66 ? (int)(0x7F + k - 33) : 0xAD;
}

static uint32_t pair_hash(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

static uint32_t pair_slot(const kvs_bpe *b, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t h = pair_hash(key) & b->mask;
    while (b->keys[h] != EMPTY && b->keys[h] != key) h = (h + 1) & b->mask;
    return h;
}

void kvs_bpe_free(kvs_bpe *b)
{
    if (!b) return;
    kvs_pretok_free(b->pre);
    free(b->mleft);
    free(b->mright);
    free(b->keys);
    free(b->rank);
    free(b->merged);
    free(b);
}

const kvs_pretok *kvs_bpe_pretok(const kvs_bpe *b) { return b ? b->pre : NULL; }
uint32_t kvs_bpe_n_merges(const kvs_bpe *b) { return b ? b->n_merges : 0; }

void kvs_bpe_merge_at(const kvs_bpe *b, uint32_t r, int32_t *left, int32_t *right)
{
    *left = *right = -1;
    if (b && r < b->n_merges) {
        *left = b->mleft[r];
        *right = b->mright[r];
    }
}

kvs_status kvs_bpe_new(const kvs_tokenizer *t, const kvs_gguf *g, const char *merges_key,
                       kvs_pretok *pre, kvs_bpe **out, kvs_error *err)
{
    *out = NULL;
    kvs_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        kvs_pretok_free(pre);
        return kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory");
    }
    b->pre = pre;
    kvs_status s = KVS_OK;
    char *cat = NULL;
    size_t cat_cap = 0;

    for (unsigned i = 0; i < 256; i++) {
        char u[4];
        int n = kvs_bpe_byte_utf8(i, u);
        b->byte_id[i] = kvs_tokenizer_lookup(t, u, (size_t)n);
    }

    uint64_t nm = 0;
    kvs_gguf_type et;
    if (kvs_gguf_find_key(g, merges_key) < 0) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: missing key %s (a BPE vocabulary needs its merges)",
                     merges_key);
        goto fail;
    }
    if ((s = kvs_gguf_get_arr(g, merges_key, &et, &nm, err))) goto fail;
    if (et != KVS_GGUF_STRING) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s: array of %s, expected an array of string",
                     merges_key, kvs_gguf_type_name(et));
        goto fail;
    }
    if (nm > INT32_MAX / 4) {
        s = kvs_fail(err, KVS_ERR_FORMAT, "tokenizer: key %s has too many merges (%llu)", merges_key,
                     (unsigned long long)nm);
        goto fail;
    }
    b->n_merges = (uint32_t)nm;
    uint32_t cap = 16;
    while (cap < 2 * (uint32_t)nm) cap *= 2;
    b->mask = cap - 1;
    b->mleft = malloc((nm ? nm : 1) * sizeof *b->mleft);
    b->mright = malloc((nm ? nm : 1) * sizeof *b->mright);
    b->keys = malloc((size_t)cap * sizeof *b->keys);
    b->rank = malloc((size_t)cap * sizeof *b->rank);
    b->merged = malloc((size_t)cap * sizeof *b->merged);
    if (!b->mleft || !b->mright || !b->keys || !b->rank || !b->merged) goto nomem;
    for (uint32_t i = 0; i < cap; i++) b->keys[i] = EMPTY;

    for (uint64_t i = 0; i < nm; i++) {
        kvs_gguf_str str;
        if ((s = kvs_gguf_arr_str(g, merges_key, i, &str, err))) goto fail;
        const char *sp = str.len > 1 ? memchr(str.data + 1, ' ', (size_t)str.len - 1) : NULL;
        int shown = (int)(str.len > 80 ? 80 : str.len);
        if (!sp) {
            s = kvs_fail(err, KVS_ERR_FORMAT,
                         "tokenizer: key %s: merge %llu \"%.*s\" has no space between two tokens",
                         merges_key, (unsigned long long)i, shown, str.data);
            goto fail;
        }
        size_t ll = (size_t)(sp - str.data), rl = (size_t)str.len - ll - 1;
        int32_t l = kvs_tokenizer_lookup(t, str.data, ll);
        int32_t r = kvs_tokenizer_lookup(t, sp + 1, rl);
        if (l < 0 || r < 0) {
            const char *bad = l < 0 ? str.data : sp + 1;
            size_t bl = l < 0 ? ll : rl;
            s = kvs_fail(err, KVS_ERR_FORMAT,
                         "tokenizer: key %s: merge %llu \"%.*s\" refers to \"%.*s\", which is not "
                         "a token of the vocabulary",
                         merges_key, (unsigned long long)i, shown, str.data,
                         (int)(bl > 80 ? 80 : bl), bad);
            goto fail;
        }
        b->mleft[i] = l;
        b->mright[i] = r;
        uint32_t h = pair_slot(b, l, r);
        if (b->keys[h] != EMPTY) continue; /* duplicate: the first rank stays */
        if (ll + rl > cat_cap) {
            size_t nc = ll + rl + 64;
            char *p = realloc(cat, nc);
            if (!p) goto nomem;
            cat = p;
            cat_cap = nc;
        }
        memcpy(cat, str.data, ll);
        memcpy(cat + ll, sp + 1, rl);
        b->keys[h] = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        b->rank[h] = (int32_t)i;
        b->merged[h] = kvs_tokenizer_lookup(t, cat, ll + rl);
    }
    free(cat);
    *out = b;
    return KVS_OK;

nomem:
    s = kvs_fail(err, KVS_ERR_NOMEM, "tokenizer: out of memory reading %s", merges_key);
fail:
    free(cat);
    kvs_bpe_free(b);
    return s;
}

/* ---------- the merge loop ---------- */

typedef struct {
    int32_t id;
    uint32_t start, len;
    int32_t prev, next;
} bsym;

typedef struct {
    int32_t rank;
    int32_t left, right; /* symbol indices */
    int32_t lid, rid;    /* their ids when pushed: a change makes the entry stale */
    int32_t merged;
} bpair;

typedef struct {
    bsym *sym;
    bpair *heap;
    size_t cap; /* symbols; the heap holds 3 * cap */
    char *enc;  /* a piece's symbols as UTF-8 (ignore_merges lookups) */
} scratch;

static int pair_above(const bpair *a, const bpair *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpair *h, size_t *n, bpair v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pair_above(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static bpair heap_pop(bpair *h, size_t *n)
{
    bpair top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_above(&h[c + 1], &h[c])) c++;
        if (!pair_above(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_pair(const kvs_bpe *b, const bsym *sym, int32_t l, bpair *h, size_t *nh)
{
    if (l < 0) return;
    int32_t r = sym[l].next;
    if (r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    uint32_t slot = pair_slot(b, sym[l].id, sym[r].id);
    if (b->keys[slot] == EMPTY) return;
    bpair p = {b->rank[slot], l, r, sym[l].id, sym[r].id, b->merged[slot]};
    heap_push(h, nh, p);
}

static kvs_status push_bytes(const kvs_bpe *b, const kvs_tokenizer *t, const unsigned char *w,
                             size_t n, kvs_idvec *out, kvs_error *err)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = b->byte_id[w[i]];
        if (id < 0) id = kvs_tokenizer_unk(t);
        if (id < 0)
            return kvs_fail(err, KVS_ERR_ARG,
                            "tokenize: byte 0x%02X has no token in this vocabulary and the "
                            "vocabulary has no unknown token",
                            w[i]);
        if (kvs_idvec_push(out, id)) return kvs_fail(err, KVS_ERR_NOMEM, "tokenize: out of memory");
    }
    return KVS_OK;
}

static kvs_status bpe_piece(const kvs_bpe *b, const kvs_tokenizer *t, const unsigned char *w,
                            size_t n, scratch *sc, kvs_idvec *out, kvs_error *err)
{
    if (n == 0) return KVS_OK;
    if (n > sc->cap) {
        size_t cap = n < 256 ? 256 : n;
        bsym *sym = realloc(sc->sym, cap * sizeof *sym);
        if (sym) sc->sym = sym;
        bpair *heap = realloc(sc->heap, 3 * cap * sizeof *heap);
        if (heap) sc->heap = heap;
        char *enc = realloc(sc->enc, 2 * cap);
        if (enc) sc->enc = enc;
        if (!sym || !heap || !enc) return kvs_fail(err, KVS_ERR_NOMEM, "tokenize: out of memory");
        sc->cap = cap;
    }
    if (kvs_pretok_ignore_merges(b->pre)) {
        size_t el = 0;
        for (size_t i = 0; i < n; i++) el += (size_t)kvs_bpe_byte_utf8(w[i], sc->enc + el);
        int32_t id = kvs_tokenizer_lookup(t, sc->enc, el);
        if (id >= 0) {
            if (kvs_idvec_push(out, id)) return kvs_fail(err, KVS_ERR_NOMEM, "tokenize: out of memory");
            return KVS_OK;
        }
    }
    bsym *sym = sc->sym;
    for (size_t i = 0; i < n; i++)
        sym[i] = (bsym){b->byte_id[w[i]], (uint32_t)i, 1, (int32_t)i - 1, (int32_t)i + 1};
    sym[n - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(b, sym, (int32_t)i, sc->heap, &nh);
    while (nh > 0) {
        bpair p = heap_pop(sc->heap, &nh);
        bsym *L = &sym[p.left], *R = &sym[p.right];
        if (L->len == 0 || R->len == 0 || L->next != p.right || L->id != p.lid || R->id != p.rid)
            continue; /* stale */
        L->id = p.merged;
        L->len += R->len;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = p.left;
        R->len = 0;
        try_pair(b, sym, L->prev, sc->heap, &nh);
        try_pair(b, sym, p.left, sc->heap, &nh);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            if (kvs_idvec_push(out, sym[i].id))
                return kvs_fail(err, KVS_ERR_NOMEM, "tokenize: out of memory");
        } else {
            kvs_status s = push_bytes(b, t, w + sym[i].start, sym[i].len, out, err);
            if (s) return s;
        }
    }
    return KVS_OK;
}

kvs_status kvs_bpe_encode(const kvs_bpe *b, const kvs_tokenizer *t, const char *text, size_t len,
                          kvs_idvec *out, kvs_error *err)
{
    if (!b || !t || (!text && len) || !out)
        return kvs_fail(err, KVS_ERR_ARG, "tokenize: NULL argument");
    kvs_spans sp = {0};
    scratch sc = {0};
    kvs_status s = kvs_pretok_split(b->pre, text, len, &sp, err);
    for (size_t i = 0; s == KVS_OK && i < sp.n; i++)
        s = bpe_piece(b, t, (const unsigned char *)text + sp.v[i].off, sp.v[i].len, &sc, out, err);
    free(sp.v);
    free(sc.sym);
    free(sc.heap);
    free(sc.enc);
    return s;
}
