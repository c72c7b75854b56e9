#include "kv/kv_store.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/debug.h"
#include "core/kernels.h"
#include "core/kernels_kivi.h"
#include "core/number.h"
#include "kv/kv_block.h"

/* Live slots occupy rows [start, start + count) of arrays of cap rows. A free prefix lets a
 * removal near the front move the few slots before it instead of the long tail after it. Every
 * array of a head lives in one block, so that a resize is one allocation: it either happens
 * whole or not at all, and a failed one leaves the head exactly as it was.
 *
 * Slot order. Appends always come after every held position, and every change but
 * kvs_store_remove_unordered keeps the slots' relative order; so a head is in position order
 * until a policy fills a victim's slot with the last row (unordered set), and even then the
 * slots after any position a query can have are a suffix (what attention's causal mask relies
 * on). newest is the largest position held: what an append must come after. */
/* KIVI state of a head (kivi.h, minicache.md §2.10). The F16 rows of the store are not used
 * (row_bytes is 0): a KIVI head holds only what §3.2 counts, in byte arrays of its own.
 *  - kc: the quantised key groups, one after another. Group g holds live slots
 *    [first[g], first[g + 1]) (the last ends at nqk), n tokens, in n * kcode_bytes bytes at
 *    first[g] * kcode_bytes, channel-major: channel c's code of the group's token j is at bit
 *    (c * n + j) * k_bits (kernels_kivi.h). gsm: per group fp16 scale[hd] then min[hd].
 *  - kr: fp16 key rows of the residual, slots [nqk, count).
 *  - vc: value code rows (vrow_bytes: codes, then fp16 scale and min per channel group) of
 *    slots [0, nqv); vr: fp16 value rows of the residual, slots [nqv, count).
 * Eviction moves codes and never re-quantises: a group keeps its scale and min and only its
 * surviving tokens' codes, repacked to the group's new size (so bytes follow the live tokens);
 * an emptied group is dropped. The survivors therefore dequantise to exactly what they did
 * before (re-quantising a group from dequantised values would shift the others' values). */
typedef struct kbuf {
    char *p;
    size_t off, len, cap; /* live bytes [off, off + len) of cap */
} kbuf;

typedef struct kivi_head {
    kbuf kc, gsm, gfirst, kr, vc, vr; /* gfirst: ng ints */
    int nqk, nqv, ng;
} kivi_head;

typedef struct store_head {
    char *block;         /* the arrays below; NULL when cap is 0 */
    size_t mapped;       /* kvs_kv_block_alloc's record of how the block was made */
    char *keys, *values; /* cap rows of row_bytes */
    int32_t *pos;
    float *meta[KVS_STORE_MAX_META];
    int start, count, cap;
    int32_t newest; /* the largest position held (count > 0) */
    int unordered;  /* the slots are not in position order (kvs_store_remove_unordered) */
    kivi_head kq;
} store_head;

struct kvs_store {
    kvs_store_config cfg;
    size_t row_bytes; /* bytes of one key (or value) row */
    kvs_kivi_cfg kivi; /* k_bits 0: not a KIVI store */
    int kivi_hold;     /* appends leave the residual unflushed (kvs_store_kivi_hold) */
    size_t kcode_bytes, vrow_bytes; /* KIVI: a key's codes, a value's codes with scales */
    store_head *heads;
};

static store_head *head_at(const kvs_store *s, int layer, int head)
{
    return &s->heads[(size_t)layer * s->cfg.n_kv_heads + head];
}

kvs_store *kvs_store_new(const kvs_store_config *cfg)
{
    if (cfg->n_layers <= 0 || cfg->n_kv_heads <= 0 || cfg->head_dim <= 0 ||
        cfg->max_slots <= 0 || (cfg->type != KVS_F32 && cfg->type != KVS_F16) ||
        cfg->n_meta < 0 || cfg->n_meta > KVS_STORE_MAX_META)
        return NULL;
    kvs_store *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->cfg = *cfg;
    s->row_bytes = (size_t)cfg->head_dim * (cfg->type == KVS_F32 ? 4 : 2);
    s->heads = calloc((size_t)cfg->n_layers * cfg->n_kv_heads, sizeof *s->heads);
    if (!s->heads) {
        free(s);
        return NULL;
    }
    return s;
}

static void head_release(store_head *h)
{
    kivi_head kq = h->kq; /* a KIVI head's data outlives its (pos, metadata) block */
    kvs_kv_block_free(h->block, h->mapped);
    memset(h, 0, sizeof *h);
    h->kq = kq;
}

/* The invariants of a head, checked after every change in debug builds: live rows inside the
 * arrays, capacity within the store's limit, positions strictly increasing unless the head is
 * unordered, newest the largest of them. */
static void check_head(const kvs_store *s, const store_head *h)
{
    KVS_ASSERT(h->start >= 0 && h->count >= 0 && h->start + h->count <= h->cap);
    KVS_ASSERT(h->cap <= s->cfg.max_slots);
    KVS_ASSERT((h->block != NULL) == (h->cap > 0));
    KVS_ASSERT(!h->unordered || h->count > 1);
    KVS_DEBUG_ONLY(int32_t most = INT32_MIN;
                   for (int i = h->start; i < h->start + h->count; i++) {
                       KVS_ASSERT(h->unordered || i == h->start || h->pos[i - 1] < h->pos[i]);
                       most = h->pos[i] > most ? h->pos[i] : most;
                   } KVS_ASSERT(h->count == 0 || most == h->newest);)
    (void)s;
    (void)h;
}

/* After slots left a head: its newest position again, and whether it is back in order. O(count)
 * only for an unordered head, whose removals are O(1) otherwise. */
static void refresh_order(store_head *h)
{
    if (h->count <= 1)
        h->unordered = 0;
    if (h->count == 0)
        return;
    const int32_t *p = h->pos + h->start;
    if (!h->unordered) {
        h->newest = p[h->count - 1];
        return;
    }
    int sorted = 1;
    h->newest = p[0];
    for (int i = 1; i < h->count; i++) {
        sorted &= p[i - 1] < p[i];
        h->newest = p[i] > h->newest ? p[i] : h->newest;
    }
    h->unordered = !sorted;
}

void kvs_store_free(kvs_store *s)
{
    if (!s)
        return;
    kvs_store_clear(s);
    free(s->heads);
    free(s);
}

static void kivi_release(kivi_head *k);

void kvs_store_clear(kvs_store *s)
{
    size_t n = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads;
    for (size_t i = 0; i < n; i++) {
        head_release(&s->heads[i]);
        kivi_release(&s->heads[i].kq);
    }
}

static void kivi_empty(kivi_head *k);

/* No live slots, the arrays kept (newest means nothing without slots). */
static void head_empty(store_head *h)
{
    h->start = h->count = 0;
    h->unordered = 0;
}

void kvs_store_empty(kvs_store *s)
{
    size_t n = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads;
    for (size_t i = 0; i < n; i++) {
        head_empty(&s->heads[i]);
        kivi_empty(&s->heads[i].kq);
        check_head(s, &s->heads[i]);
    }
}

const kvs_store_config *kvs_store_cfg(const kvs_store *s) { return &s->cfg; }
int kvs_store_count(const kvs_store *s, int layer, int head) { return head_at(s, layer, head)->count; }

const int32_t *kvs_store_pos(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
    return h->pos ? h->pos + h->start : NULL;
}

static char *kb_data(const kbuf *b);

const void *kvs_store_keys(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
    if (s->kivi.k_bits)
        return kb_data(&h->kq.kr);
    return h->keys ? h->keys + (size_t)h->start * s->row_bytes : NULL;
}

const void *kvs_store_values(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
    if (s->kivi.k_bits)
        return kb_data(&h->kq.vr);
    return h->values ? h->values + (size_t)h->start * s->row_bytes : NULL;
}

float *kvs_store_meta(kvs_store *s, int layer, int head, int c)
{
    store_head *h = head_at(s, layer, head);
    return h->meta[c] ? h->meta[c] + h->start : NULL;
}

static void row_to_f32(const kvs_store *s, const char *row, float *out)
{
    if (s->cfg.type == KVS_F32)
        memcpy(out, row, s->row_bytes);
    else
        kvs_dequantize_row(KVS_F16, row, out, s->cfg.head_dim);
}

/* ---- byte arrays of a KIVI head: amortised growth, a free prefix for dropping the front ---- */

static char *kb_data(const kbuf *b) { return b->p ? b->p + b->off : NULL; }

static void kb_free(kbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Room for `more` bytes after the live ones. Moves the live bytes to the front when that
 * leaves a quarter of the array free, else grows to 1.5 times what is needed: either way the
 * next move is at least a third of the live size of appends away, so appending is amortised
 * O(1) per byte, and the slack stays at most half the live size. -1 (the array unchanged) if
 * the memory is not there. */
static int kb_reserve(kbuf *b, size_t more)
{
    if (b->off + b->len + more <= b->cap)
        return 0;
    if (b->len + more <= b->cap - b->cap / 4) {
        memmove(b->p, b->p + b->off, b->len);
        b->off = 0;
        return 0;
    }
    size_t cap = b->len + more + (b->len + more) / 2;
    cap = cap < 256 ? 256 : cap;
    char *p = malloc(cap);
    if (!p)
        return -1;
    if (b->len)
        memcpy(p, b->p + b->off, b->len);
    free(b->p);
    b->p = p;
    b->off = 0;
    b->cap = cap;
    return 0;
}

/* n more live bytes (reserved), returned for the caller to fill. */
static char *kb_grow(kbuf *b, size_t n)
{
    KVS_ASSERT(b->off + b->len + n <= b->cap);
    char *at = b->p + b->off + b->len;
    b->len += n;
    return at;
}

static void kb_drop_front(kbuf *b, size_t n)
{
    KVS_ASSERT(n <= b->len);
    b->off += n;
    b->len -= n;
    if (b->len == 0)
        b->off = 0;
}

/* Gives memory back once half the array is free, keeping room for `keep` bytes
 * (what the array soon holds again: a residual refills to R rows), so that a residual does not
 * shrink and regrow every R tokens. Optional: a failed allocation leaves the array as it was. */
static void kb_shrink(kbuf *b, size_t keep)
{
    const size_t want = b->len > keep ? b->len : keep, cap = want + want / 2;
    if (b->cap <= 4096 || b->cap <= 2 * want)
        return;
    if (want == 0) {
        kb_free(b);
        return;
    }
    char *p = malloc(cap);
    if (!p)
        return;
    if (b->len)
        memcpy(p, b->p + b->off, b->len);
    free(b->p);
    b->p = p;
    b->off = 0;
    b->cap = cap;
}

static void kivi_release(kivi_head *k)
{
    kb_free(&k->kc);
    kb_free(&k->gsm);
    kb_free(&k->gfirst);
    kb_free(&k->kr);
    kb_free(&k->vc);
    kb_free(&k->vr);
    memset(k, 0, sizeof *k);
}

static void kivi_empty(kivi_head *k)
{
    kbuf *const b[] = {&k->kc, &k->gsm, &k->gfirst, &k->kr, &k->vc, &k->vr};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        b[i]->off = b[i]->len = 0;
    k->nqk = k->nqv = k->ng = 0;
}

static const int *kivi_first(const kivi_head *k) { return (const int *)(const void *)kb_data(&k->gfirst); }

/* One past the last live slot of key group g. */
static int group_end(const kivi_head *k, int g)
{
    return g + 1 < k->ng ? kivi_first(k)[g + 1] : k->nqk;
}

/* The key group holding quantised slot `slot` (< nqk): a binary search, O(log groups). */
static int key_group(const kivi_head *k, int slot)
{
    const int *first = kivi_first(k);
    int lo = 0, hi = k->ng; /* the last group with first <= slot */
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (first[mid] <= slot)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static size_t f16_row(const kvs_store *s) { return (size_t)s->cfg.head_dim * 2; }

static void kivi_key_f32(const kvs_store *s, const store_head *h, int slot, float *out)
{
    const int hd = s->cfg.head_dim, b = s->kivi.k_bits;
    const kivi_head *k = &h->kq;
    if (slot >= k->nqk) {
        kvs_dequantize_row(KVS_F16, kb_data(&k->kr) + (size_t)(slot - k->nqk) * f16_row(s), out,
                           hd);
        return;
    }
    const int g = key_group(k, slot), first = kivi_first(k)[g], n = group_end(k, g) - first;
    const uint8_t *codes = (const uint8_t *)kb_data(&k->kc) + (size_t)first * s->kcode_bytes;
    const uint16_t *sm = (const uint16_t *)(const void *)kb_data(&k->gsm) + (size_t)2 * hd * g;
    float sc[hd], mn[hd];
    kvs_dequantize_row(KVS_F16, sm, sc, hd);
    kvs_dequantize_row(KVS_F16, sm + hd, mn, hd);
    for (int c = 0; c < hd; c++)
        out[c] = (float)kvs_kivi_get(codes, b, c * n + slot - first) * sc[c] + mn[c];
}

void kvs_store_keys_f32(const kvs_store *s, int layer, int head, float *out)
{
    const store_head *h = head_at(s, layer, head);
    if (!s->kivi.k_bits) {
        for (int i = 0; i < h->count; i++)
            kvs_store_key_f32(s, layer, head, i, out + (size_t)i * s->cfg.head_dim);
        return;
    }
    /* Group by group: its scale and min converted once, its codes read in order. */
    const kivi_head *k = &h->kq;
    const int hd = s->cfg.head_dim, b = s->kivi.k_bits;
    float sc[hd], mn[hd];
    for (int g = 0; g < k->ng; g++) {
        const int first = kivi_first(k)[g], n = group_end(k, g) - first;
        const uint8_t *codes = (const uint8_t *)kb_data(&k->kc) + (size_t)first * s->kcode_bytes;
        const uint16_t *sm = (const uint16_t *)(const void *)kb_data(&k->gsm) + (size_t)2 * hd * g;
        kvs_dequantize_row(KVS_F16, sm, sc, hd);
        kvs_dequantize_row(KVS_F16, sm + hd, mn, hd);
        float *o = out + (size_t)first * hd;
        for (int c = 0; c < hd; c++)
            for (int j = 0; j < n; j++)
                o[(size_t)j * hd + c] = (float)kvs_kivi_get(codes, b, c * n + j) * sc[c] + mn[c];
    }
    if (h->count > k->nqk)
        kvs_dequantize_row(KVS_F16, kb_data(&k->kr), out + (size_t)k->nqk * hd,
                           (int64_t)(h->count - k->nqk) * hd);
}

void kvs_store_key_f32(const kvs_store *s, int layer, int head, int slot, float *out)
{
    if (s->kivi.k_bits) {
        kivi_key_f32(s, head_at(s, layer, head), slot, out);
        return;
    }
    row_to_f32(s, (const char *)kvs_store_keys(s, layer, head) + (size_t)slot * s->row_bytes, out);
}

void kvs_store_value_f32(const kvs_store *s, int layer, int head, int slot, float *out)
{
    if (s->kivi.k_bits) {
        const kivi_head *k = &head_at(s, layer, head)->kq;
        if (slot < k->nqv)
            kvs_kivi_dequantize_value_row((const uint8_t *)kb_data(&k->vc) +
                                              (size_t)slot * s->vrow_bytes,
                                          s->cfg.head_dim, s->kivi.v_bits, s->kivi.group, out);
        else
            kvs_dequantize_row(KVS_F16, kb_data(&k->vr) + (size_t)(slot - k->nqv) * f16_row(s),
                               out, s->cfg.head_dim);
        return;
    }
    row_to_f32(s, (const char *)kvs_store_values(s, layer, head) + (size_t)slot * s->row_bytes,
               out);
}

const kvs_kivi_cfg *kvs_store_kivi(const kvs_store *s) { return s->kivi.k_bits ? &s->kivi : NULL; }

void kvs_store_kivi_view(const kvs_store *s, int layer, int head, kvs_kivi_view *v)
{
    const kivi_head *k = &head_at(s, layer, head)->kq;
    v->kcodes = (const uint8_t *)kb_data(&k->kc);
    v->g_sm = (const uint16_t *)(const void *)kb_data(&k->gsm);
    v->g_first = kivi_first(k);
    v->kres = (const uint16_t *)(const void *)kb_data(&k->kr);
    v->vcodes = (const uint8_t *)kb_data(&k->vc);
    v->vres = (const uint16_t *)(const void *)kb_data(&k->vr);
    v->kcode_bytes = s->kcode_bytes;
    v->vrow_bytes = s->vrow_bytes;
    v->nqk = k->nqk;
    v->nqv = k->nqv;
    v->ng = k->ng;
}

kvs_status kvs_store_set_kivi(kvs_store *s, const kvs_kivi_cfg *k, kvs_error *err)
{
    if (s->cfg.type != KVS_F16 || kvs_store_total_slots(s) != 0)
        return kvs_fail(err, KVS_ERR_ARG, "KIVI storage needs an empty F16 store");
    const int hd = s->cfg.head_dim;
    /* A token's key codes are whole bytes, so that groups of any size sit at byte offsets
     * (true for every head_dim a model has: a multiple of 8). */
    if ((size_t)hd * k->k_bits % 8)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "KIVI kbits=%d needs head_dim * kbits to be "
                        "a multiple of 8 (head_dim is %d)", k->k_bits, hd);
    s->kivi = *k;
    s->kcode_bytes = (size_t)hd * k->k_bits / 8;
    s->vrow_bytes = kvs_kivi_value_row_bytes(hd, k->v_bits, k->group);
    s->row_bytes = 0; /* keys and values live in the KIVI arrays, not in the slot rows */
    return KVS_OK;
}

/* Makes room for everything an append of n tokens and the flushes before and after it write,
 * so that neither the append's copy nor a flush can fail. Only capacity changes. */
static int kivi_reserve(const kvs_store *s, kivi_head *k, int count, int n)
{
    const int G = s->kivi.group, R = s->kivi.residual, hd = s->cfg.head_dim;
    const size_t keys = (size_t)(count + n - k->nqk) / R * R, groups = keys / G;
    const int vals = count + n - R - k->nqv;
    return kb_reserve(&k->kc, keys * s->kcode_bytes) ||
           kb_reserve(&k->gsm, groups * 4 * (size_t)hd) ||
           kb_reserve(&k->gfirst, groups * sizeof(int)) ||
           kb_reserve(&k->vc, vals > 0 ? (size_t)vals * s->vrow_bytes : 0) ||
           kb_reserve(&k->kr, (size_t)n * f16_row(s)) || kb_reserve(&k->vr, (size_t)n * f16_row(s));
}

/* Quantises the oldest n residual keys (slots nqk..) into one new group (room reserved). */
static void kivi_quantize_keys(const kvs_store *s, kivi_head *k, int n)
{
    const int hd = s->cfg.head_dim, b = s->kivi.k_bits;
    float x[n * hd];
    kvs_dequantize_row(KVS_F16, kb_data(&k->kr), x, (int64_t)n * hd);
    uint16_t *sm = (uint16_t *)(void *)kb_grow(&k->gsm, (size_t)4 * hd);
    for (int c = 0; c < hd; c++)
        kvs_kivi_params(x + c, n, hd, b, &sm[c], &sm[hd + c]);
    uint8_t *codes = (uint8_t *)kb_grow(&k->kc, (size_t)n * s->kcode_bytes);
    memset(codes, 0, (size_t)n * s->kcode_bytes);
    for (int c = 0; c < hd; c++) {
        const float sc = kvs_fp16_to_fp32(sm[c]), mn = kvs_fp16_to_fp32(sm[hd + c]);
        for (int j = 0; j < n; j++)
            kvs_kivi_set(codes, b, c * n + j, kvs_kivi_code_f(x[(size_t)j * hd + c], sc, mn, b));
    }
    int *first = (int *)(void *)kb_grow(&k->gfirst, sizeof(int));
    *first = k->nqk;
    k->ng++;
    k->nqk += n;
    kb_drop_front(&k->kr, (size_t)n * f16_row(s));
}

/* The flush rules of §2.10: keys leave the residual R at a time once it holds R (so a prefill
 * of N quantises the first N - N mod R), values one at a time once older than the newest R. */
static void kivi_flush(const kvs_store *s, store_head *h)
{
    const int G = s->kivi.group, R = s->kivi.residual, hd = s->cfg.head_dim;
    kivi_head *k = &h->kq;
    while (h->count - k->nqk >= R)
        for (int a = 0; a < R; a += G)
            kivi_quantize_keys(s, k, G);
    float x[hd];
    while (h->count - k->nqv > R) {
        kvs_dequantize_row(KVS_F16, kb_data(&k->vr), x, hd);
        kvs_kivi_quantize_value_row(x, hd, s->kivi.v_bits, G,
                                    (uint8_t *)kb_grow(&k->vc, s->vrow_bytes));
        kb_drop_front(&k->vr, f16_row(s));
        k->nqv++;
    }
}

void kvs_store_kivi_hold(kvs_store *s, int hold) { s->kivi_hold = hold != 0; }

void kvs_store_kivi_flush(kvs_store *s, int layer)
{
    for (int h = 0; s->kivi.k_bits && h < s->cfg.n_kv_heads; h++) {
        store_head *H = head_at(s, layer, h);
        kivi_head *k = &H->kq;
        /* Room for what the flush quantises: an eviction since the last append may have given
         * the quantised arrays back (kb_shrink). Without the memory the tokens stay fp16:
         * correct, only larger. */
        if (kivi_reserve(s, k, H->count, 0) != 0)
            continue;
        kivi_flush(s, H);
        /* A prompt batch passed through the residuals: give back what they no longer hold.
         * (Not in the flush an append runs first: that would undo the append's reserve.) */
        kb_shrink(&k->kr, (size_t)s->kivi.residual * f16_row(s));
        kb_shrink(&k->vr, (size_t)(s->kivi.residual + 1) * f16_row(s));
    }
}

/* The old slot of kept slot i: slots[i], or with no list every slot but `skip`. */
static int kept_at(const int *slots, int skip, int i) { return slots ? slots[i] : i + (i >= skip); }

/* Moves the kept rows of an array of rows [0, rows) to the front, in order (kept[i] - base
 * for the kept slots i in [i0, i1), all in range). */
static void keep_rows(kbuf *b, size_t row, const int *slots, int skip, int i0, int i1, int base)
{
    char *p = kb_data(b);
    for (int i = i0, j; i < i1; i = j) {
        const int from = kept_at(slots, skip, i) - base, to = i - i0;
        for (j = i + 1; j < i1 && kept_at(slots, skip, j) - base == from + (j - i);)
            j++; /* one memmove per run of consecutive kept rows */
        if (from != to)
            memmove(p + (size_t)to * row, p + (size_t)from * row, (size_t)(j - i) * row);
    }
    b->len = (size_t)(i1 - i0) * row;
}

/* The KIVI part of keeping n slots (kept_at), before the slot rows move. Key groups: each
 * survivor's codes move, bit by bit within its group (a group untouched moves whole), to the
 * group's new place and size; the group keeps its scale and min. Writing in place is safe: a
 * code is written at a bit index no higher than the one it was read from, and every later
 * read is at a higher index. */
static void kivi_keep(const kvs_store *s, store_head *h, const int *slots, int skip, int n)
{
    kivi_head *k = &h->kq;
    const int hd = s->cfg.head_dim, b = s->kivi.k_bits;
    const size_t smb = (size_t)4 * hd;
    uint8_t *kc = (uint8_t *)kb_data(&k->kc);
    char *sm = kb_data(&k->gsm);
    int *first = (int *)(void *)kb_data(&k->gfirst);
    int i = 0, ng = 0, nq = 0;
    for (int g = 0; g < k->ng; g++) {
        const int f = first[g], gn = group_end(k, g) - f, i0 = i;
        while (i < n && kept_at(slots, skip, i) < f + gn)
            i++;
        const int m = i - i0;
        if (m == 0)
            continue;
        uint8_t *src = kc + (size_t)f * s->kcode_bytes, *dst = kc + (size_t)nq * s->kcode_bytes;
        if (m == gn) {
            if (dst != src)
                memmove(dst, src, (size_t)gn * s->kcode_bytes);
        } else {
            for (int c = 0; c < hd; c++)
                for (int t = 0; t < m; t++)
                    kvs_kivi_set(dst, b, c * m + t,
                                 kvs_kivi_get(src, b, c * gn + kept_at(slots, skip, i0 + t) - f));
        }
        if (ng != g)
            memmove(sm + smb * ng, sm + smb * g, smb);
        first[ng++] = nq; /* index ng <= g: group_end of a later group reads first[g + 1] */
        nq += m;
    }
    const int old_nqk = k->nqk, old_nqv = k->nqv;
    k->ng = ng;
    k->nqk = nq;
    k->kc.len = (size_t)nq * s->kcode_bytes;
    k->gsm.len = smb * ng;
    k->gfirst.len = sizeof(int) * ng;
    keep_rows(&k->kr, f16_row(s), slots, skip, nq, n, old_nqk);
    int nv = 0;
    while (nv < n && kept_at(slots, skip, nv) < old_nqv)
        nv++;
    keep_rows(&k->vc, s->vrow_bytes, slots, skip, 0, nv, 0);
    keep_rows(&k->vr, f16_row(s), slots, skip, nv, n, old_nqv);
    k->nqv = nv;
    kb_shrink(&k->kc, 0);
    kb_shrink(&k->gsm, 0);
    kb_shrink(&k->gfirst, 0);
    kb_shrink(&k->kr, (size_t)s->kivi.residual * f16_row(s));
    kb_shrink(&k->vc, 0);
    kb_shrink(&k->vr, (size_t)(s->kivi.residual + 1) * f16_row(s));
}

/* Moves rows [from, from + n) to [to, to + n) in every array of a head. */
static void move_rows(const kvs_store *s, store_head *h, int to, int from, int n)
{
    if (n <= 0 || to == from)
        return;
    memmove(h->keys + (size_t)to * s->row_bytes, h->keys + (size_t)from * s->row_bytes,
            (size_t)n * s->row_bytes);
    memmove(h->values + (size_t)to * s->row_bytes, h->values + (size_t)from * s->row_bytes,
            (size_t)n * s->row_bytes);
    memmove(h->pos + to, h->pos + from, (size_t)n * sizeof *h->pos);
    for (int c = 0; c < s->cfg.n_meta; c++)
        memmove(h->meta[c] + to, h->meta[c] + from, (size_t)n * sizeof(float));
}

/* Moves the live slots to row 0. */
static void rebase(const kvs_store *s, store_head *h)
{
    move_rows(s, h, 0, h->start, h->count);
    h->start = 0;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of a head's block of cap rows: keys, values, positions, metadata, each 64-aligned. */
static size_t block_bytes(const kvs_store *s, int cap)
{
    return 2 * align64((size_t)cap * s->row_bytes) +
           (1 + (size_t)s->cfg.n_meta) * align64((size_t)cap * sizeof(float));
}

/* A head's block, on a cache-line boundary, which the 64-byte offsets of its arrays assume:
 * from malloc (16-byte aligned) a 128-byte F16 row spanned three lines instead of two and
 * attention's vector loads split across lines. Large blocks go on huge pages (kv_block.c). */
static char *block_alloc(const kvs_store *s, int cap, size_t *mapped)
{
    return kvs_kv_block_alloc(block_bytes(s, cap), mapped);
}

/* Moves a head's live slots to row 0 of blk, a block of cap rows (cap >= count), and frees the
 * old block. Cannot fail: the allocation came first. */
static void head_adopt(const kvs_store *s, store_head *h, char *blk, size_t mapped, int cap)
{
    store_head n = {.block = blk, .mapped = mapped, .count = h->count, .cap = cap,
                    .newest = h->newest, .unordered = h->unordered, .kq = h->kq};
    const size_t rows = align64((size_t)cap * s->row_bytes), floats = align64((size_t)cap * 4);
    n.keys = blk;
    n.values = blk + rows;
    n.pos = (int32_t *)(blk + 2 * rows);
    for (int c = 0; c < s->cfg.n_meta; c++)
        n.meta[c] = (float *)(blk + 2 * rows + (1 + (size_t)c) * floats);
    if (h->count > 0) {
        const size_t at = (size_t)h->start, cnt = (size_t)h->count;
        memcpy(n.keys, h->keys + at * s->row_bytes, cnt * s->row_bytes);
        memcpy(n.values, h->values + at * s->row_bytes, cnt * s->row_bytes);
        memcpy(n.pos, h->pos + at, cnt * sizeof *n.pos);
        for (int c = 0; c < s->cfg.n_meta; c++)
            memcpy(n.meta[c], h->meta[c] + at, cnt * sizeof(float));
    }
    kvs_kv_block_free(h->block, h->mapped);
    *h = n;
}

/* Resizes a head to exactly cap slots (cap >= count; 0 releases it). All or nothing: returns -1
 * and leaves the head unchanged if the memory is not there. */
static int head_resize(const kvs_store *s, store_head *h, int cap)
{
    KVS_ASSERT(cap >= h->count && cap <= s->cfg.max_slots);
    if (cap == h->cap)
        return 0;
    if (cap == 0) {
        head_release(h);
        return 0;
    }
    size_t mapped;
    char *blk = block_alloc(s, cap, &mapped);
    if (!blk)
        return -1;
    head_adopt(s, h, blk, mapped, cap);
    return 0;
}

/* Slack beyond the live count: small, so memory follows the live slots closely, but enough
 * that one-token appends do not reallocate every step. */
static int slack(int count) { return 16 + count / 16; }

/* Keys and values must be finite, and for an F16 cache inside its range: a NaN or an
 * overflow to inf would otherwise flow silently into every later attention. Checked before
 * anything is stored, so a failed append leaves the store as it was. */
static kvs_status check_rows(const kvs_store *s, int layer, int n, const float *k, const float *v,
                             const int32_t *pos, kvs_error *err)
{
    const int hd = s->cfg.head_dim, nkv = s->cfg.n_kv_heads;
    /* Beyond this an F32 value rounds to inf in F16 (65504 is the largest F16 number). */
    const float f16_limit = s->cfg.type == KVS_F16 ? 65520.0f : INFINITY;
    /* The vector test first; the scan that names the first number at fault only after it
     * failed: in its place, scalar, it was most of the append's time in a decode step. */
    const size_t total = (size_t)n * nkv * hd;
    if (kvs_abs_below(k, total, f16_limit) && kvs_abs_below(v, total, f16_limit))
        return KVS_OK;
    for (int kind = 0; kind < 2; kind++) {
        const float *x = kind ? v : k;
        for (size_t i = 0; i < total; i++) {
            if (fabsf(x[i]) < f16_limit) /* false for NaN */
                continue;
            const int tok = (int)(i / ((size_t)nkv * hd)), h = (int)(i / hd % nkv);
            if (!isfinite(x[i]))
                return kvs_fail(err, KVS_ERR_FORMAT,
                                "non-finite %s (%s) at layer %d, KV head %d, position %d: the "
                                "model's weights or activations are not finite",
                                kind ? "value" : "key", isnan(x[i]) ? "NaN" : "inf", layer, h,
                                pos[tok]);
            char num[32];
            return kvs_fail(err, KVS_ERR_UNSUPPORTED,
                            "a %s of %s overflows the F16 KV cache (largest 65504) at layer %d, "
                            "KV head %d, position %d; use an F32 KV cache (--kv-type f32)",
                            kind ? "value" : "key", kvs_format_number(num, sizeof num, x[i]),
                            layer, h, pos[tok]);
        }
    }
    return KVS_OK;
}

/* The capacity a head of count slots grows to for n more. */
static int grown_cap(const kvs_store *s, int need)
{
    int cap = need + slack(need);
    return cap > s->cfg.max_slots ? s->cfg.max_slots : cap;
}

/* Whether n rows from position pos[0] on fit a head: within the context, after its last. */
static kvs_status check_room(const kvs_store *s, const store_head *H, int n, const int32_t *pos,
                             kvs_error *err)
{
    if (n > s->cfg.max_slots - H->count)
        return kvs_fail(err, KVS_ERR_ARG, "KV cache full: %d + %d tokens exceed the context of %d",
                        H->count, n, s->cfg.max_slots);
    if (n > 0 && H->count > 0 && pos[0] <= H->newest)
        return kvs_fail(err, KVS_ERR_ARG, "KV append: position %d is not after %d", pos[0],
                        H->newest);
    return KVS_OK;
}

/* Prefetches the cache lines of [p, p + bytes) for writing. */
static void prefetch_write(const void *p, size_t bytes)
{
    const uintptr_t last = ((uintptr_t)p + bytes - 1) & ~(uintptr_t)63;
    for (uintptr_t line = (uintptr_t)p & ~(uintptr_t)63; line <= last; line += 64)
        __builtin_prefetch((const void *)line, 1, 3);
}

void kvs_store_prefetch_append(const kvs_store *s, int layer)
{
    if (s->kivi.k_bits)
        return;
    for (int h = 0; h < s->cfg.n_kv_heads; h++) {
        const store_head *H = head_at(s, layer, h);
        const int slot = H->start + H->count;
        if (slot >= H->cap)
            continue; /* the append moves or grows the head first */
        prefetch_write(H->keys + (size_t)slot * s->row_bytes, s->row_bytes);
        prefetch_write(H->values + (size_t)slot * s->row_bytes, s->row_bytes);
        prefetch_write(H->pos + slot, sizeof *H->pos);
        for (int c = 0; c < s->cfg.n_meta; c++)
            prefetch_write(H->meta[c] + slot, sizeof(float));
    }
}

kvs_status kvs_store_append(kvs_store *s, int layer, int n, const float *k, const float *v,
                            const int32_t *pos, kvs_error *err)
{
    const int hd = s->cfg.head_dim, nkv = s->cfg.n_kv_heads;
    kvs_status cst = check_rows(s, layer, n, k, v, pos, err);
    if (cst != KVS_OK)
        return cst;
    KVS_DEBUG_ONLY(for (int i = 1; i < n; i++) KVS_ASSERT(pos[i - 1] < pos[i]);)
    /* All or nothing over the layer's heads: check every head and allocate every block that must
     * grow before any head changes. */
    for (int h = 0; h < nkv; h++) {
        kvs_status rst = check_room(s, head_at(s, layer, h), n, pos, err);
        if (rst != KVS_OK)
            return rst;
    }
    for (int h = 0; h < nkv && s->kivi.k_bits; h++) {
        store_head *H = head_at(s, layer, h);
        if (kivi_reserve(s, &H->kq, H->count, n) != 0)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory growing the KIVI KV cache");
    }
    /* What the last batch left in the residual (if the caller did not flush after its
     * attention) is quantised now, before the new tokens come in. */
    for (int h = 0; h < nkv && s->kivi.k_bits && !s->kivi_hold; h++)
        kivi_flush(s, head_at(s, layer, h));
    char *fresh[nkv];
    size_t fresh_mapped[nkv];
    for (int h = 0; h < nkv; h++) {
        const store_head *H = head_at(s, layer, h);
        fresh[h] = NULL;
        fresh_mapped[h] = 0;
        if (H->count + n <= H->cap)
            continue;
        if (!(fresh[h] = block_alloc(s, grown_cap(s, H->count + n), &fresh_mapped[h]))) {
            const int cap = grown_cap(s, H->count + n);
            while (h > 0) {
                h--;
                kvs_kv_block_free(fresh[h], fresh_mapped[h]);
            }
            return kvs_fail(err, KVS_ERR_NOMEM,
                            "out of memory growing the KV cache to %d slots", cap);
        }
    }
    for (int h = 0; h < nkv; h++) {
        store_head *H = head_at(s, layer, h);
        const int need = H->count + n;
        if (fresh[h])
            head_adopt(s, H, fresh[h], fresh_mapped[h], grown_cap(s, need));
        else if (H->start + need > H->cap)
            rebase(s, H);
        for (int i = 0; i < n; i++) {
            int slot = H->start + H->count + i;
            const float *kr = k + ((size_t)i * nkv + h) * hd, *vr = v + ((size_t)i * nkv + h) * hd;
            if (s->kivi.k_bits) { /* into the fp16 residuals (reserved above) */
                kvs_quantize_row(KVS_F16, kr, kb_grow(&H->kq.kr, f16_row(s)), hd);
                kvs_quantize_row(KVS_F16, vr, kb_grow(&H->kq.vr, f16_row(s)), hd);
            } else if (s->cfg.type == KVS_F32) {
                memcpy(H->keys + (size_t)slot * s->row_bytes, kr, s->row_bytes);
                memcpy(H->values + (size_t)slot * s->row_bytes, vr, s->row_bytes);
            } else {
                kvs_quantize_row(KVS_F16, kr, H->keys + (size_t)slot * s->row_bytes, hd);
                kvs_quantize_row(KVS_F16, vr, H->values + (size_t)slot * s->row_bytes, hd);
            }
            H->pos[slot] = pos[i];
            for (int c = 0; c < s->cfg.n_meta; c++)
                H->meta[c][slot] = 0.0f;
        }
        H->count = need;
        if (n > 0)
            H->newest = pos[n - 1];
        check_head(s, H);
    }
    return KVS_OK;
}

kvs_status kvs_store_append_raw(kvs_store *s, int layer, int head, int n, const void *k,
                                const void *v, size_t stride, const int32_t *pos,
                                kvs_error *err)
{
    store_head *H = head_at(s, layer, head);
    KVS_ASSERT(!s->kivi.k_bits);
    kvs_status rst = check_room(s, H, n, pos, err);
    if (rst != KVS_OK)
        return rst;
    const int need = H->count + n;
    if (need > H->cap) {
        size_t mapped;
        char *blk = block_alloc(s, grown_cap(s, need), &mapped);
        if (!blk)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory growing the KV cache to %d slots",
                            grown_cap(s, need));
        head_adopt(s, H, blk, mapped, grown_cap(s, need));
    } else if (H->start + need > H->cap) {
        rebase(s, H);
    }
    const int first = H->start + H->count;
    if (stride == s->row_bytes) { /* rows side by side: one copy each for keys and values */
        memcpy(H->keys + (size_t)first * s->row_bytes, k, (size_t)n * s->row_bytes);
        memcpy(H->values + (size_t)first * s->row_bytes, v, (size_t)n * s->row_bytes);
    } else {
        for (int i = 0; i < n; i++) {
            memcpy(H->keys + (size_t)(first + i) * s->row_bytes,
                   (const char *)k + (size_t)i * stride, s->row_bytes);
            memcpy(H->values + (size_t)(first + i) * s->row_bytes,
                   (const char *)v + (size_t)i * stride, s->row_bytes);
        }
    }
    memcpy(H->pos + first, pos, sizeof(int32_t) * (size_t)n);
    for (int c = 0; c < s->cfg.n_meta; c++)
        memset(H->meta[c] + first, 0, sizeof(float) * (size_t)n);
    H->count = need;
    if (n > 0)
        H->newest = pos[n - 1];
    check_head(s, H);
    return KVS_OK;
}

void kvs_store_reset_head(kvs_store *s, int layer, int head)
{
    head_empty(head_at(s, layer, head));
    KVS_ASSERT(!s->kivi.k_bits); /* a KIVI head also keeps codes and groups */
}

void kvs_store_keep(kvs_store *s, int layer, int head, const int *slots, int n)
{
    store_head *H = head_at(s, layer, head);
    KVS_ASSERT(n >= 0 && n <= H->count);
    KVS_DEBUG_ONLY(for (int i = 0; i < n; i++)
                       KVS_ASSERT(slots[i] >= 0 && slots[i] < H->count &&
                                  (i == 0 || slots[i - 1] < slots[i]));)
    if (s->kivi.k_bits)
        kivi_keep(s, H, slots, 0, n);
    /* One contiguous run [a, b) removed (a sliding window, a single victim): move whichever
     * side is shorter. Otherwise compact slot by slot. */
    int a = 0;
    while (a < n && slots[a] == a)
        a++;
    int b = a < n ? slots[a] : H->count;
    int one_gap = 1;
    for (int i = a; i < n && one_gap; i++)
        one_gap = slots[i] == b + (i - a);
    if (one_gap && b - a == H->count - n) {
        if (a < H->count - b) {
            move_rows(s, H, H->start + (b - a), H->start, a);
            H->start += b - a;
        } else {
            move_rows(s, H, H->start + a, H->start + b, H->count - b);
        }
    } else {
        for (int i = 0; i < n; i++)
            move_rows(s, H, H->start + i, H->start + slots[i], 1);
    }
    H->count = n;
    refresh_order(H);
    /* Give memory back once the slack is large. Optional: a failed shrink leaves the head as
     * it was, in its larger block. */
    if (H->cap > n + 2 * slack(n))
        (void)head_resize(s, H, n + slack(n));
    check_head(s, H);
}

void kvs_store_remove(kvs_store *s, int layer, int head, int slot)
{
    store_head *H = head_at(s, layer, head);
    KVS_ASSERT(slot >= 0 && slot < H->count);
    if (s->kivi.k_bits)
        kivi_keep(s, H, NULL, slot, H->count - 1);
    /* Move whichever side of the slot is shorter. */
    if (slot < H->count / 2) {
        move_rows(s, H, H->start + 1, H->start, slot);
        H->start++;
    } else {
        move_rows(s, H, H->start + slot, H->start + slot + 1, H->count - slot - 1);
    }
    H->count--;
    refresh_order(H);
    check_head(s, H);
}

void kvs_store_remove_unordered(kvs_store *s, int layer, int head, int slot)
{
    store_head *H = head_at(s, layer, head);
    KVS_ASSERT(slot >= 0 && slot < H->count);
    if (s->kivi.k_bits || slot == H->count - 1) {
        kvs_store_remove(s, layer, head, slot); /* KIVI codes are grouped in position order */
        return;
    }
    const int32_t gone = H->pos[H->start + slot];
    const int was_ordered = !H->unordered;
    move_rows(s, H, H->start + slot, H->start + H->count - 1, 1);
    H->count--;
    /* In order still only if the moved row (the newest of an ordered head) is now the last. */
    H->unordered = H->count > 1 && !(was_ordered && slot == H->count - 1);
    if (gone == H->newest)
        refresh_order(H);
    check_head(s, H);
}

int kvs_store_ordered(const kvs_store *s, int layer, int head)
{
    return !head_at(s, layer, head)->unordered;
}

/* The largest magnitude an F16 element holds. */
#define F16_MAX 65504.0f

static int by_pos(const void *a, const void *b)
{
    const kvs_pos_slot *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

void kvs_pos_slot_sort(kvs_pos_slot *v, int n)
{
    if (n > 1)
        qsort(v, (size_t)n, sizeof *v, by_pos);
}

const kvs_pos_slot *kvs_pos_slot_find(const kvs_pos_slot *v, int n, int32_t pos)
{
    const kvs_pos_slot key = {pos, 0};
    return n > 0 ? bsearch(&key, v, (size_t)n, sizeof *v, by_pos) : NULL;
}

/* A shift must keep the slots' order by position: new positions >= 0, increasing along the old
 * ones (along the slots, for a head in order). */
static kvs_status check_shift(const store_head *H, int layer, int head, const int32_t *new_pos,
                              kvs_error *err)
{
    const int32_t *old = H->pos + H->start;
    kvs_pos_slot *by = NULL;
    if (H->unordered) {
        if (!(by = malloc(sizeof *by * (size_t)H->count)))
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory checking a KV shift");
        for (int i = 0; i < H->count; i++)
            by[i] = (kvs_pos_slot){old[i], i};
        kvs_pos_slot_sort(by, H->count);
    }
    for (int r = 0; r < H->count; r++) {
        const int i = by ? by[r].slot : r, prev = r == 0 ? -1 : by ? by[r - 1].slot : r - 1;
        if (new_pos[i] < 0 || (prev >= 0 && new_pos[i] <= new_pos[prev])) {
            const int32_t after = prev >= 0 ? new_pos[prev] : -1;
            free(by);
            return kvs_fail(err, KVS_ERR_ARG, "KV shift, layer %d head %d: new position %d of "
                            "slot %d is not after %d", layer, head, new_pos[i], i, after);
        }
    }
    free(by);
    return KVS_OK;
}

kvs_status kvs_store_shift(kvs_store *s, int layer, int head, const int32_t *new_pos,
                           const kvs_rope_cfg *rope, kvs_error *err)
{
    store_head *H = head_at(s, layer, head);
    const int hd = s->cfg.head_dim;
    if (s->kivi.k_bits)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "position shifting cannot re-rotate KIVI "
                        "quantised keys (--kv-type kivi...): use --kv-type f16 or f32 with it");
    kvs_status vst = check_shift(H, layer, head, new_pos, err);
    if (vst != KVS_OK)
        return vst;
    float row[hd];
    if (s->cfg.type == KVS_F16) {
        /* Check every key before changing any: a rotation keeps each pair's norm but may move
         * it onto one element, past the F16 range. */
        for (int i = 0; i < H->count; i++) {
            const int slot = H->start + i;
            if (new_pos[i] == H->pos[slot])
                continue;
            row_to_f32(s, H->keys + (size_t)slot * s->row_bytes, row);
            kvs_rope_move(row, 1, hd, rope->rot_dim, H->pos[slot], new_pos[i], rope->base,
                          rope->neox);
            for (int d = 0; d < hd; d++)
                if (!(fabsf(row[d]) <= F16_MAX))
                    return kvs_fail(err, KVS_ERR_ARG, "KV cache (f16): the key of position %d "
                                    "(layer %d, KV head %d) leaves the F16 range when moved to "
                                    "position %d (use --kv-type f32)", H->pos[slot], layer,
                                    head, new_pos[i]);
        }
    }
    for (int i = 0; i < H->count; i++) {
        const int slot = H->start + i;
        if (new_pos[i] == H->pos[slot])
            continue;
        char *key = H->keys + (size_t)slot * s->row_bytes;
        if (s->cfg.type == KVS_F32) {
            kvs_rope_move((float *)key, 1, hd, rope->rot_dim, H->pos[slot], new_pos[i],
                          rope->base, rope->neox);
        } else {
            row_to_f32(s, key, row);
            kvs_rope_move(row, 1, hd, rope->rot_dim, H->pos[slot], new_pos[i], rope->base,
                          rope->neox);
            kvs_quantize_row(KVS_F16, row, key, hd);
        }
        H->pos[slot] = new_pos[i];
    }
    for (int i = 0; i < H->count; i++) /* the largest new position */
        if (i == 0 || H->pos[H->start + i] > H->newest)
            H->newest = H->pos[H->start + i];
    check_head(s, H);
    return KVS_OK;
}

size_t kvs_store_slot_bytes(const kvs_store *s)
{
    return 2 * s->row_bytes + sizeof(int32_t) + (size_t)s->cfg.n_meta * sizeof(float);
}

int64_t kvs_store_total_slots(const kvs_store *s)
{
    size_t n = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads;
    int64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += s->heads[i].count;
    return total;
}

size_t kvs_store_bytes(const kvs_store *s)
{
    if (!s->kivi.k_bits)
        return (size_t)kvs_store_total_slots(s) * kvs_store_slot_bytes(s);
    /* §3.2: codes, fp16 scale and min per group, the fp16 residuals; plus the first slot of
     * each key group (4 bytes per group, what locates it after evictions), and as for F32 and
     * F16 each slot's position and metadata. Exactly the live bytes of the head's arrays. */
    size_t total = 0;
    for (size_t i = 0; i < (size_t)s->cfg.n_layers * s->cfg.n_kv_heads; i++) {
        const store_head *h = &s->heads[i];
        const kivi_head *k = &h->kq;
        total += k->kc.len + k->gsm.len + k->gfirst.len + k->kr.len + k->vc.len + k->vr.len +
                 (size_t)h->count * kvs_store_slot_bytes(s);
    }
    return total;
}

size_t kvs_store_alloc_bytes(const kvs_store *s)
{
    size_t total = 0;
    for (size_t i = 0; i < (size_t)s->cfg.n_layers * s->cfg.n_kv_heads; i++) {
        const store_head *h = &s->heads[i];
        const kivi_head *k = &h->kq;
        total += (h->cap ? block_bytes(s, h->cap) : 0) + k->kc.cap + k->gsm.cap +
                 k->gfirst.cap + k->kr.cap + k->vc.cap + k->vr.cap;
    }
    return total;
}
