#include "kv/kv_store.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/debug.h"
#include "core/kernels.h"
#include "core/number.h"

/* Live slots occupy rows [start, start + count) of arrays of cap rows. A free prefix lets a
 * removal near the front move the few slots before it instead of the long tail after it. Every
 * array of a head lives in one block, so that a resize is one allocation: it either happens
 * whole or not at all, and a failed one leaves the head exactly as it was. */
/* KIVI state of a head (kivi.h). Live slots [0, nqk) hold key codes, [nqk, count) fp16 keys;
 * [0, nqv) value code rows, [nqv, count) fp16 values. The quantised keys form ng groups of
 * consecutive slots, g_n[i] live slots each, with fp16 scale[head_dim] then min[head_dim] at
 * g_sm + 2 * head_dim * i. Eviction only shrinks a group: the survivors keep their codes and
 * the group its scale and min, so their values do not change; an emptied group is dropped. */
typedef struct kivi_head {
    int nqk, nqv, ng, gcap;
    int *g_n;
    uint16_t *g_sm;
} kivi_head;

typedef struct store_head {
    char *block;         /* the arrays below; NULL when cap is 0 */
    char *keys, *values; /* cap rows of row_bytes */
    int32_t *pos;
    float *meta[KVS_STORE_MAX_META];
    int start, count, cap;
    kivi_head kq;
} store_head;

struct kvs_store {
    kvs_store_config cfg;
    size_t row_bytes; /* bytes of one key (or value) row */
    kvs_kivi_cfg kivi; /* k_bits 0: not a KIVI store */
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
    free(h->block);
    free(h->kq.g_n);
    free(h->kq.g_sm);
    memset(h, 0, sizeof *h);
}

/* The invariants of a head, checked after every change in debug builds: live rows inside the
 * arrays, capacity within the store's limit, positions strictly increasing. */
static void check_head(const kvs_store *s, const store_head *h)
{
    KVS_ASSERT(h->start >= 0 && h->count >= 0 && h->start + h->count <= h->cap);
    KVS_ASSERT(h->cap <= s->cfg.max_slots);
    KVS_ASSERT((h->block != NULL) == (h->cap > 0));
    KVS_DEBUG_ONLY(for (int i = h->start + 1; i < h->start + h->count; i++)
                       KVS_ASSERT(h->pos[i - 1] < h->pos[i]);)
    (void)s;
    (void)h;
}

void kvs_store_free(kvs_store *s)
{
    if (!s)
        return;
    kvs_store_clear(s);
    free(s->heads);
    free(s);
}

void kvs_store_clear(kvs_store *s)
{
    size_t n = (size_t)s->cfg.n_layers * s->cfg.n_kv_heads;
    for (size_t i = 0; i < n; i++)
        head_release(&s->heads[i]);
}

const kvs_store_config *kvs_store_cfg(const kvs_store *s) { return &s->cfg; }
int kvs_store_count(const kvs_store *s, int layer, int head) { return head_at(s, layer, head)->count; }

const int32_t *kvs_store_pos(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
    return h->pos ? h->pos + h->start : NULL;
}

const void *kvs_store_keys(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
    return h->keys ? h->keys + (size_t)h->start * s->row_bytes : NULL;
}

const void *kvs_store_values(const kvs_store *s, int layer, int head)
{
    const store_head *h = head_at(s, layer, head);
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

/* The quantised key group holding live slot `slot` (< nqk) and the slot it starts at. */
static int key_group(const kivi_head *k, int slot, int *first)
{
    int g = 0, at = 0;
    while (at + k->g_n[g] <= slot)
        at += k->g_n[g++];
    *first = at;
    return g;
}

static void kivi_key_f32(const kvs_store *s, const store_head *h, int slot, float *out)
{
    const int hd = s->cfg.head_dim;
    const char *row = h->keys + (size_t)(h->start + slot) * s->row_bytes;
    if (slot >= h->kq.nqk) {
        kvs_dequantize_row(KVS_F16, row, out, hd);
        return;
    }
    int first;
    const uint16_t *sm = h->kq.g_sm + (size_t)2 * hd * key_group(&h->kq, slot, &first);
    for (int d = 0; d < hd; d++)
        out[d] = (float)kvs_kivi_get((const uint8_t *)row, s->kivi.k_bits, d) *
                     kvs_fp16_to_fp32(sm[d]) + kvs_fp16_to_fp32(sm[hd + d]);
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
    const char *row = (const char *)kvs_store_values(s, layer, head) + (size_t)slot * s->row_bytes;
    if (s->kivi.k_bits && slot < head_at(s, layer, head)->kq.nqv)
        kvs_kivi_dequantize_value_row((const uint8_t *)row, s->cfg.head_dim, s->kivi.v_bits,
                                      s->kivi.group, out);
    else
        row_to_f32(s, row, out);
}

const kvs_kivi_cfg *kvs_store_kivi(const kvs_store *s) { return s->kivi.k_bits ? &s->kivi : NULL; }

void kvs_store_kivi_view(const kvs_store *s, int layer, int head, kvs_kivi_view *v)
{
    const store_head *h = head_at(s, layer, head);
    v->keys = kvs_store_keys(s, layer, head);
    v->values = kvs_store_values(s, layer, head);
    v->row_bytes = s->row_bytes;
    v->nqk = h->kq.nqk;
    v->nqv = h->kq.nqv;
    v->ng = h->kq.ng;
    v->g_n = h->kq.g_n;
    v->g_sm = h->kq.g_sm;
}

kvs_status kvs_store_set_kivi(kvs_store *s, const kvs_kivi_cfg *k, kvs_error *err)
{
    if (s->cfg.type != KVS_F16 || kvs_store_total_slots(s) != 0)
        return kvs_fail(err, KVS_ERR_ARG, "KIVI storage needs an empty F16 store");
    const int hd = s->cfg.head_dim;
    s->kivi = *k;
    s->kcode_bytes = ((size_t)hd * k->k_bits + 7) / 8;
    s->vrow_bytes = kvs_kivi_value_row_bytes(hd, k->v_bits, k->group);
    /* A row holds an fp16 vector or codes, whichever is larger. */
    s->row_bytes = (size_t)hd * 2;
    if (s->vrow_bytes > s->row_bytes)
        s->row_bytes = s->vrow_bytes;
    if (s->kcode_bytes > s->row_bytes)
        s->row_bytes = s->kcode_bytes;
    s->row_bytes = (s->row_bytes + 3) & ~(size_t)3; /* fp16 rows stay aligned */
    return KVS_OK;
}

/* Makes room for `more` key groups. Leaves the head usable on failure. */
static int kivi_reserve(const kvs_store *s, kivi_head *k, int more)
{
    if (k->ng + more <= k->gcap)
        return 0;
    const int cap = k->ng + more + 8;
    int *n = realloc(k->g_n, sizeof *n * (size_t)cap);
    if (!n)
        return -1;
    k->g_n = n;
    uint16_t *sm = realloc(k->g_sm, sizeof *sm * 2 * (size_t)s->cfg.head_dim * (size_t)cap);
    if (!sm)
        return -1;
    k->g_sm = sm;
    k->gcap = cap;
    return 0;
}

/* Quantises the keys of live slots [a, a + n) (fp16 now) into one new group (room reserved). */
static void kivi_quantize_keys(const kvs_store *s, store_head *h, int a, int n)
{
    const int hd = s->cfg.head_dim, b = s->kivi.k_bits;
    float x[n * hd];
    for (int i = 0; i < n; i++)
        kvs_dequantize_row(KVS_F16, h->keys + (size_t)(h->start + a + i) * s->row_bytes,
                           x + (size_t)i * hd, hd);
    kivi_head *k = &h->kq;
    KVS_ASSERT(k->ng < k->gcap); /* reserved by the append that brought the tokens */
    uint16_t *sm = k->g_sm + (size_t)2 * hd * k->ng;
    for (int d = 0; d < hd; d++)
        kvs_kivi_params(x + d, n, hd, b, &sm[d], &sm[hd + d]);
    for (int i = 0; i < n; i++) {
        uint8_t *row = (uint8_t *)h->keys + (size_t)(h->start + a + i) * s->row_bytes;
        memset(row, 0, s->kcode_bytes);
        for (int d = 0; d < hd; d++)
            kvs_kivi_set(row, b, d, kvs_kivi_code(x[(size_t)i * hd + d], sm[d], sm[hd + d], b));
    }
    k->g_n[k->ng++] = n;
}

/* The flush rules of §2.10: keys leave the residual R at a time once it holds R (so a prefill
 * of N quantises the first N - N mod R), values one at a time once older than the newest R. */
static void kivi_flush(const kvs_store *s, store_head *h)
{
    const int G = s->kivi.group, R = s->kivi.residual, hd = s->cfg.head_dim;
    kivi_head *k = &h->kq;
    while (h->count - k->nqk >= R) {
        for (int a = 0; a < R; a += G)
            kivi_quantize_keys(s, h, k->nqk + a, G);
        k->nqk += R;
    }
    float x[hd];
    while (h->count - k->nqv > R) {
        uint8_t *row = (uint8_t *)h->values + (size_t)(h->start + k->nqv) * s->row_bytes;
        kvs_dequantize_row(KVS_F16, row, x, hd);
        kvs_kivi_quantize_value_row(x, hd, s->kivi.v_bits, G, row);
        k->nqv++;
    }
}

void kvs_store_kivi_flush(kvs_store *s, int layer)
{
    for (int h = 0; s->kivi.k_bits && h < s->cfg.n_kv_heads; h++)
        kivi_flush(s, head_at(s, layer, h));
}

/* Drops emptied key groups. */
static void kivi_compact_groups(const kvs_store *s, kivi_head *k)
{
    const size_t w = (size_t)2 * s->cfg.head_dim;
    int j = 0;
    for (int i = 0; i < k->ng; i++) {
        if (k->g_n[i] == 0)
            continue;
        if (i != j) {
            k->g_n[j] = k->g_n[i];
            memmove(k->g_sm + w * j, k->g_sm + w * i, w * sizeof *k->g_sm);
        }
        j++;
    }
    k->ng = j;
}

/* The KIVI bookkeeping of keeping the listed slots (before the rows move). */
static void kivi_keep(const kvs_store *s, store_head *h, const int *slots, int n)
{
    kivi_head *k = &h->kq;
    int nqk = 0, nqv = 0, g = 0, end = k->ng ? k->g_n[0] : 0;
    int kept[k->ng > 0 ? k->ng : 1];
    memset(kept, 0, sizeof kept);
    for (int i = 0; i < n; i++) {
        nqv += slots[i] < k->nqv;
        if (slots[i] >= k->nqk)
            continue;
        while (slots[i] >= end)
            end += k->g_n[++g];
        kept[g]++;
        nqk++;
    }
    for (int i = 0; i < k->ng; i++)
        k->g_n[i] = kept[i];
    k->nqk = nqk;
    k->nqv = nqv;
    kivi_compact_groups(s, k);
}

static void kivi_remove(const kvs_store *s, store_head *h, int slot)
{
    kivi_head *k = &h->kq;
    if (slot < k->nqv)
        k->nqv--;
    if (slot < k->nqk) {
        int first;
        k->g_n[key_group(k, slot, &first)]--;
        k->nqk--;
        kivi_compact_groups(s, k);
    }
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

/* Moves a head's live slots to row 0 of blk, a block of cap rows (cap >= count), and frees the
 * old block. Cannot fail: the allocation came first. */
static void head_adopt(const kvs_store *s, store_head *h, char *blk, int cap)
{
    store_head n = {.block = blk, .count = h->count, .cap = cap, .kq = h->kq};
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
    free(h->block);
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
    char *blk = malloc(block_bytes(s, cap));
    if (!blk)
        return -1;
    head_adopt(s, h, blk, cap);
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
    for (int kind = 0; kind < 2; kind++) {
        const float *x = kind ? v : k;
        for (size_t i = 0; i < (size_t)n * nkv * hd; i++) {
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
        const store_head *H = head_at(s, layer, h);
        if (n > s->cfg.max_slots - H->count)
            return kvs_fail(err, KVS_ERR_ARG,
                            "KV cache full: %d + %d tokens exceed the context of %d", H->count,
                            n, s->cfg.max_slots);
        if (H->count > 0 && pos[0] <= H->pos[H->start + H->count - 1])
            return kvs_fail(err, KVS_ERR_ARG, "KV append: position %d is not after %d", pos[0],
                            H->pos[H->start + H->count - 1]);
    }
    for (int h = 0; h < nkv && s->kivi.k_bits; h++) {
        store_head *H = head_at(s, layer, h);
        if (kivi_reserve(s, &H->kq, (H->count + n - H->kq.nqk) / s->kivi.group) != 0)
            return kvs_fail(err, KVS_ERR_NOMEM, "out of memory growing the KIVI key groups");
    }
    /* What the last batch left in the residual (if the caller did not flush after its
     * attention) is quantised now, before the new tokens come in. */
    for (int h = 0; h < nkv && s->kivi.k_bits; h++)
        kivi_flush(s, head_at(s, layer, h));
    char *fresh[nkv];
    for (int h = 0; h < nkv; h++) {
        const store_head *H = head_at(s, layer, h);
        fresh[h] = NULL;
        if (H->count + n <= H->cap)
            continue;
        if (!(fresh[h] = malloc(block_bytes(s, grown_cap(s, H->count + n))))) {
            const int cap = grown_cap(s, H->count + n);
            while (h > 0)
                free(fresh[--h]);
            return kvs_fail(err, KVS_ERR_NOMEM,
                            "out of memory growing the KV cache to %d slots", cap);
        }
    }
    for (int h = 0; h < nkv; h++) {
        store_head *H = head_at(s, layer, h);
        const int need = H->count + n;
        if (fresh[h])
            head_adopt(s, H, fresh[h], grown_cap(s, need));
        else if (H->start + need > H->cap)
            rebase(s, H);
        for (int i = 0; i < n; i++) {
            int slot = H->start + H->count + i;
            const float *kr = k + ((size_t)i * nkv + h) * hd, *vr = v + ((size_t)i * nkv + h) * hd;
            if (s->cfg.type == KVS_F32) {
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
        check_head(s, H);
    }
    return KVS_OK;
}

void kvs_store_keep(kvs_store *s, int layer, int head, const int *slots, int n)
{
    store_head *H = head_at(s, layer, head);
    KVS_ASSERT(n >= 0 && n <= H->count);
    KVS_DEBUG_ONLY(for (int i = 0; i < n; i++)
                       KVS_ASSERT(slots[i] >= 0 && slots[i] < H->count &&
                                  (i == 0 || slots[i - 1] < slots[i]));)
    if (s->kivi.k_bits)
        kivi_keep(s, H, slots, n);
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
        kivi_remove(s, H, slot);
    /* Move whichever side of the slot is shorter. */
    if (slot < H->count / 2) {
        move_rows(s, H, H->start + 1, H->start, slot);
        H->start++;
    } else {
        move_rows(s, H, H->start + slot, H->start + slot + 1, H->count - slot - 1);
    }
    H->count--;
    check_head(s, H);
}

/* The largest magnitude an F16 element holds. */
#define F16_MAX 65504.0f

kvs_status kvs_store_shift(kvs_store *s, int layer, int head, const int32_t *new_pos,
                           const kvs_rope_cfg *rope, kvs_error *err)
{
    store_head *H = head_at(s, layer, head);
    const int hd = s->cfg.head_dim;
    if (s->kivi.k_bits)
        return kvs_fail(err, KVS_ERR_UNSUPPORTED, "position shifting cannot re-rotate KIVI "
                        "quantised keys (--kv-type kivi...): use --kv-type f16 or f32 with it");
    for (int i = 0; i < H->count; i++)
        if (new_pos[i] < 0 || (i > 0 && new_pos[i] <= new_pos[i - 1]))
            return kvs_fail(err, KVS_ERR_ARG, "KV shift, layer %d head %d: new position %d of "
                            "slot %d is not after %d", layer, head, new_pos[i], i,
                            i > 0 ? new_pos[i - 1] : -1);
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
    /* §3.2: codes, fp16 scale and min per group, the fp16 residual; plus, as for F32 and F16,
     * each slot's position and metadata. */
    const size_t hd = (size_t)s->cfg.head_dim, per_slot = 4 + (size_t)s->cfg.n_meta * 4;
    size_t total = 0;
    for (size_t i = 0; i < (size_t)s->cfg.n_layers * s->cfg.n_kv_heads; i++) {
        const store_head *h = &s->heads[i];
        const size_t c = (size_t)h->count, qk = (size_t)h->kq.nqk, qv = (size_t)h->kq.nqv;
        total += qk * s->kcode_bytes + (size_t)h->kq.ng * hd * 4 + (c - qk) * hd * 2;
        total += qv * s->vrow_bytes + (c - qv) * hd * 2 + c * per_slot;
    }
    return total;
}
