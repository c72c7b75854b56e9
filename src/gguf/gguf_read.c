/* GGUF v2/v3 reader: maps the file read-only and validates every field before trusting it.
 *
 * Decisions: versions 2 and 3 are accepted (same layout), version 1 and later versions are
 * rejected; nested arrays are validated (up to KVS_GGUF_MAX_NESTING levels) but their elements
 * are not exposed; key and tensor names must be valid UTF-8 without NUL bytes; string values
 * are not checked for UTF-8; key, tensor and array-element counts beyond the limits of gguf.h
 * (KVS_GGUF_MAX_*) are refused even when the file is large enough to hold them. */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvslim reads GGUF (little-endian) data in place and needs a little-endian host"
#endif

#define HEADER_BYTES 24u  /* magic, version, tensor count, key count */
#define MIN_KV_BYTES 14u  /* name length + 1-byte name + type + 1-byte value */
#define MIN_TENSOR_BYTES 33u /* name length + 1-byte name + n_dims + 1 dim + type + offset */

typedef unsigned long long ull;

typedef struct gguf_kv {
    char *key;
    kvs_gguf_type type;
    const uint8_t *val; /* scalars and strings: the value; arrays: the first element */
    kvs_gguf_type elem; /* arrays: element type */
    uint64_t n;         /* arrays: element count */
    uint64_t *str_pos;  /* string arrays: file offset of each element's length field */
} gguf_kv;

struct kvs_gguf {
    char *path;
    const uint8_t *map;
    uint64_t size;
    int borrowed; /* map is the caller's buffer (kvs_gguf_open_mem), not an mmap of ours */
    uint32_t version, alignment;
    uint64_t data_start;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    kvs_gguf_tensor *tensors;
    /* Open-addressing hash tables (capacity a power of two, at least twice the entry count)
     * holding entry index + 1; 0 marks an empty slot. */
    uint64_t *kv_tab, *t_tab;
    uint64_t kv_cap, t_cap;
};

/* ---- small helpers ---- */

static uint32_t rd32(const uint8_t *b)
{
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}

static uint64_t rd64(const uint8_t *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}

static char *copy_str(const void *s, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

const char *kvs_gguf_type_name(uint32_t t)
{
    static const char *const names[] = {"u8",     "i8",    "u16", "i16", "u32",
                                        "i32",    "f32",   "bool", "string", "array",
                                        "u64",    "i64",   "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

uint64_t kvs_gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case KVS_GGUF_UINT8: case KVS_GGUF_INT8: case KVS_GGUF_BOOL: return 1;
    case KVS_GGUF_UINT16: case KVS_GGUF_INT16: return 2;
    case KVS_GGUF_UINT32: case KVS_GGUF_INT32: case KVS_GGUF_FLOAT32: return 4;
    case KVS_GGUF_UINT64: case KVS_GGUF_INT64: case KVS_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

const char *kvs_gguf_name_problem(const char *str, uint64_t len)
{
    const uint8_t *s = (const uint8_t *)str;
    if (len == 0)
        return "is empty";
    if (len > KVS_GGUF_MAX_NAME)
        return "is longer than 65535 bytes";
    for (uint64_t i = 0; i < len;) {
        uint8_t c = s[i];
        if (c == 0)
            return "contains a NUL byte";
        if (c < 0x80) {
            i++;
            continue;
        }
        uint64_t n;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            n = 2;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return "is not valid UTF-8";
        if (n > len - i || s[i + 1] < lo || s[i + 1] > hi)
            return "is not valid UTF-8";
        for (uint64_t k = 2; k < n; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return "is not valid UTF-8";
        i += n;
    }
    return NULL;
}

/* ggml type ids kvslim does not support, for clearer messages. */
static const char *ggml_type_name(uint32_t t)
{
    static const char *const names[] = {
        "f32",   "f16",    "q4_0",    "q4_1",    "q4_2 (removed)", "q4_3 (removed)", "q5_0",
        "q5_1",  "q8_0",   "q8_1",    "q2_K",    "q3_K",    "q4_K",   "q5_K",   "q6_K",   "q8_K",
        "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",  "iq3_s",  "iq2_s",  "iq4_xs", "i8",
        "i16",   "i32",    "i64",     "f64",     "iq1_m",   "bf16"};
    return t < sizeof names / sizeof names[0] ? names[t] : NULL;
}

/* ---- name hash tables ---- */

static uint64_t hash_name(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static uint64_t table_cap(uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    return cap;
}

/* The slot holding name, or the empty slot where it would go. */
static uint64_t *table_slot(const kvs_gguf *g, int tensors, const char *name)
{
    uint64_t *tab = tensors ? g->t_tab : g->kv_tab;
    uint64_t mask = (tensors ? g->t_cap : g->kv_cap) - 1;
    for (uint64_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        if (tab[i] == 0)
            return &tab[i];
        const char *other = tensors ? g->tensors[tab[i] - 1].name : g->kv[tab[i] - 1].key;
        if (strcmp(other, name) == 0)
            return &tab[i];
    }
}

/* ---- parser ---- */

typedef struct parser {
    kvs_gguf *g;
    uint64_t pos;
    kvs_error *err;
    char ctx[160]; /* "metadata key #3 ('general.name')", "tensor 'x'" or "" */
} parser;

static kvs_status pfail(parser *p, kvs_status code, const char *fmt, ...) KVS_PRINTF(3, 4);

static kvs_status pfail(parser *p, kvs_status code, const char *fmt, ...)
{
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->ctx[0])
        return kvs_fail(p->err, code, "%s: %s: %s", p->g->path, p->ctx, msg);
    return kvs_fail(p->err, code, "%s: %s", p->g->path, msg);
}

static uint64_t left(const parser *p) { return p->g->size - p->pos; }

static kvs_status need(parser *p, uint64_t n, const char *what)
{
    if (n <= left(p))
        return KVS_OK;
    return pfail(p, KVS_ERR_FORMAT, "truncated: %s at offset %llu needs %llu bytes, %llu left "
                 "(file size %llu)", what, (ull)p->pos, (ull)n, (ull)left(p), (ull)p->g->size);
}

static kvs_status get_u32(parser *p, const char *what, uint32_t *v)
{
    kvs_status st = need(p, 4, what);
    if (st == KVS_OK) {
        *v = rd32(p->g->map + p->pos);
        p->pos += 4;
    }
    return st;
}

static kvs_status get_u64(parser *p, const char *what, uint64_t *v)
{
    kvs_status st = need(p, 8, what);
    if (st == KVS_OK) {
        *v = rd64(p->g->map + p->pos);
        p->pos += 8;
    }
    return st;
}

/* A GGUF string: uint64 length + bytes. what names it; index is an array position or
 * UINT64_MAX. Messages are formatted only on failure. */
static kvs_status get_str(parser *p, const char *what, uint64_t index, kvs_gguf_str *s)
{
    char desc[96];
    if (index == UINT64_MAX)
        snprintf(desc, sizeof desc, "%s", what);
    else if (left(p) < 8 || rd64(p->g->map + p->pos) > left(p) - 8)
        snprintf(desc, sizeof desc, "%s #%llu", what, (ull)index);
    else
        desc[0] = '\0'; /* will succeed: skip formatting */
    uint64_t len = 0;
    kvs_status st = get_u64(p, desc, &len);
    if (st != KVS_OK)
        return st;
    if (len > left(p))
        return pfail(p, KVS_ERR_FORMAT, "%s length %llu exceeds file size (%llu bytes left at "
                     "offset %llu, file size %llu)", desc, (ull)len, (ull)left(p), (ull)p->pos,
                     (ull)p->g->size);
    s->len = len;
    s->data = (const char *)p->g->map + p->pos;
    p->pos += len;
    return KVS_OK;
}

static kvs_status parse_array(parser *p, int depth, gguf_kv *kv);

/* Validates one non-array value of type t and steps over it. */
static kvs_status parse_value(parser *p, uint32_t t, int depth)
{
    if (t == KVS_GGUF_ARRAY)
        return parse_array(p, depth + 1, NULL);
    if (t == KVS_GGUF_STRING) {
        kvs_gguf_str s = {0, NULL};
        return get_str(p, "string", UINT64_MAX, &s);
    }
    uint64_t size = kvs_gguf_scalar_size(t);
    if (size == 0)
        return pfail(p, KVS_ERR_FORMAT, "value type %u is not a valid GGUF type (0..12)", t);
    kvs_status st = need(p, size, kvs_gguf_type_name(t));
    if (st != KVS_OK)
        return st;
    if (t == KVS_GGUF_BOOL && p->g->map[p->pos] > 1)
        return pfail(p, KVS_ERR_FORMAT, "bool value %u at offset %llu is not 0 or 1",
                     p->g->map[p->pos], (ull)p->pos);
    p->pos += size;
    return KVS_OK;
}

/* An array value (element type, count, elements) at nesting level depth (1 = a key's value).
 * kv (top level only) receives the element type, count and, for strings, the offset index. */
static kvs_status parse_array(parser *p, int depth, gguf_kv *kv)
{
    uint32_t et = 0;
    uint64_t n = 0;
    kvs_status st = get_u32(p, "array element type", &et);
    if (st == KVS_OK)
        st = get_u64(p, "array length", &n);
    if (st != KVS_OK)
        return st;
    uint64_t min = et == KVS_GGUF_STRING ? 8 : et == KVS_GGUF_ARRAY ? 12 : kvs_gguf_scalar_size(et);
    if (min == 0)
        return pfail(p, KVS_ERR_FORMAT, "array element type %u is not a valid GGUF type (0..12)",
                     et);
    if (et == KVS_GGUF_ARRAY && depth >= KVS_GGUF_MAX_NESTING)
        return pfail(p, KVS_ERR_UNSUPPORTED, "arrays nested more than %d levels deep",
                     KVS_GGUF_MAX_NESTING);
    if (n > left(p) / min)
        return pfail(p, KVS_ERR_FORMAT, "array length %llu of %s elements (at least %llu bytes "
                     "each) exceeds file size (%llu bytes left at offset %llu)", (ull)n,
                     kvs_gguf_type_name(et), (ull)min, (ull)left(p), (ull)p->pos);
    const uint64_t most = et == KVS_GGUF_STRING ? KVS_GGUF_MAX_STRINGS : KVS_GGUF_MAX_ARRAY;
    if (n > most)
        return pfail(p, KVS_ERR_UNSUPPORTED, "array length %llu of %s elements exceeds kvslim's "
                     "limit of %llu", (ull)n, kvs_gguf_type_name(et), (ull)most);
    if (kv) {
        kv->elem = (kvs_gguf_type)et;
        kv->n = n;
        kv->val = p->g->map + p->pos;
    }
    if (et == KVS_GGUF_STRING) {
        if (kv && n > 0 && !(kv->str_pos = malloc(n * sizeof *kv->str_pos)))
            return pfail(p, KVS_ERR_NOMEM, "out of memory for a string array of %llu", (ull)n);
        for (uint64_t i = 0; i < n; i++) {
            kvs_gguf_str s = {0, NULL};
            if (kv)
                kv->str_pos[i] = p->pos;
            if ((st = get_str(p, "string element", i, &s)) != KVS_OK)
                return st;
        }
    } else if (et == KVS_GGUF_ARRAY) {
        for (uint64_t i = 0; i < n; i++)
            if ((st = parse_array(p, depth + 1, NULL)) != KVS_OK)
                return st;
    } else {
        const uint8_t *b = p->g->map + p->pos;
        if (et == KVS_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (b[i] > 1)
                    return pfail(p, KVS_ERR_FORMAT, "bool array element #%llu is %u, not 0 or 1",
                                 (ull)i, b[i]);
        p->pos += n * min;
    }
    return KVS_OK;
}

/* Reads a name (key or tensor) and returns a NUL-terminated copy in *out. */
static kvs_status parse_name(parser *p, char **out)
{
    kvs_gguf_str s = {0, NULL};
    kvs_status st = get_str(p, "name", UINT64_MAX, &s);
    if (st != KVS_OK)
        return st;
    const char *why = kvs_gguf_name_problem(s.data, s.len);
    if (why)
        return pfail(p, KVS_ERR_FORMAT, "name %s", why);
    if (!(*out = copy_str(s.data, s.len)))
        return pfail(p, KVS_ERR_NOMEM, "out of memory");
    return KVS_OK;
}

static kvs_status parse_header(parser *p)
{
    kvs_gguf *g = p->g;
    if (g->size < 4 || memcmp(g->map, "GGUF", 4) != 0) {
        if (g->size < 4)
            return pfail(p, KVS_ERR_FORMAT, "truncated header (file size %llu)", (ull)g->size);
        return pfail(p, KVS_ERR_FORMAT, "bad magic (expected GGUF, found bytes %02x %02x %02x "
                     "%02x)", g->map[0], g->map[1], g->map[2], g->map[3]);
    }
    if (g->size < HEADER_BYTES)
        return pfail(p, KVS_ERR_FORMAT, "truncated header (file size %llu, need %u bytes)",
                     (ull)g->size, HEADER_BYTES);
    uint32_t v = rd32(g->map + 4);
    uint32_t swapped = __builtin_bswap32(v);
    if (swapped == 2 || swapped == 3)
        return pfail(p, KVS_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
    if (v == 1)
        return pfail(p, KVS_ERR_UNSUPPORTED, "GGUF version 1 is not supported (32-bit counts); "
                     "only versions 2 and 3 are");
    if (v != 2 && v != 3)
        return pfail(p, v == 0 ? KVS_ERR_FORMAT : KVS_ERR_UNSUPPORTED,
                     "unsupported GGUF version %u (expected 3)", v);
    g->version = v;
    g->n_tensors = rd64(g->map + 8);
    g->n_kv = rd64(g->map + 16);
    p->pos = HEADER_BYTES;
    uint64_t avail = g->size - HEADER_BYTES;
    if (g->n_kv > avail / MIN_KV_BYTES)
        return pfail(p, KVS_ERR_FORMAT, "metadata count %llu exceeds what the file could hold "
                     "(%llu bytes after the header, at least %u per key)", (ull)g->n_kv,
                     (ull)avail, MIN_KV_BYTES);
    avail -= g->n_kv * MIN_KV_BYTES;
    if (g->n_tensors > avail / MIN_TENSOR_BYTES)
        return pfail(p, KVS_ERR_FORMAT, "tensor count %llu exceeds what the file could hold "
                     "(file size %llu, at least %u bytes per tensor info)", (ull)g->n_tensors,
                     (ull)g->size, MIN_TENSOR_BYTES);
    if (g->n_kv > KVS_GGUF_MAX_KEYS)
        return pfail(p, KVS_ERR_UNSUPPORTED, "metadata count %llu exceeds kvslim's limit of %u "
                     "keys", (ull)g->n_kv, KVS_GGUF_MAX_KEYS);
    if (g->n_tensors > KVS_GGUF_MAX_TENSORS)
        return pfail(p, KVS_ERR_UNSUPPORTED, "tensor count %llu exceeds kvslim's limit of %u "
                     "tensors", (ull)g->n_tensors, KVS_GGUF_MAX_TENSORS);
    /* The counts are now bounded by the file size and the limits, so these allocations are
     * too. */
    g->kv_cap = table_cap(g->n_kv);
    g->t_cap = table_cap(g->n_tensors);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->kv_tab = calloc(g->kv_cap, sizeof *g->kv_tab);
    g->t_tab = calloc(g->t_cap, sizeof *g->t_tab);
    if (!g->kv || !g->tensors || !g->kv_tab || !g->t_tab)
        return pfail(p, KVS_ERR_NOMEM, "out of memory for %llu keys and %llu tensors",
                     (ull)g->n_kv, (ull)g->n_tensors);
    return KVS_OK;
}

static kvs_status parse_kvs(parser *p)
{
    kvs_gguf *g = p->g;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        snprintf(p->ctx, sizeof p->ctx, "metadata key #%llu", (ull)i);
        kvs_status st = parse_name(p, &kv->key);
        if (st != KVS_OK)
            return st;
        snprintf(p->ctx, sizeof p->ctx, "metadata key #%llu ('%.100s')", (ull)i, kv->key);
        uint64_t *slot = table_slot(g, 0, kv->key);
        if (*slot)
            return pfail(p, KVS_ERR_FORMAT, "duplicate key (also key #%llu)", (ull)(*slot - 1));
        *slot = i + 1;
        uint32_t t = 0;
        if ((st = get_u32(p, "value type", &t)) != KVS_OK)
            return st;
        if (t > KVS_GGUF_FLOAT64)
            return pfail(p, KVS_ERR_FORMAT, "value type %u is not a valid GGUF type (0..12)", t);
        kv->type = (kvs_gguf_type)t;
        kv->val = g->map + p->pos;
        st = t == KVS_GGUF_ARRAY ? parse_array(p, 1, kv) : parse_value(p, t, 0);
        if (st != KVS_OK)
            return st;
    }
    p->ctx[0] = '\0';
    g->alignment = KVS_GGUF_DEFAULT_ALIGNMENT;
    int64_t a = kvs_gguf_find_key(g, "general.alignment");
    if (a >= 0) {
        const gguf_kv *kv = &g->kv[a];
        if (kv->type != KVS_GGUF_UINT32)
            return pfail(p, KVS_ERR_FORMAT, "metadata key 'general.alignment' has type %s, "
                         "expected u32", kvs_gguf_type_name(kv->type));
        uint32_t v = rd32(kv->val);
        if (v == 0 || (v & (v - 1)) != 0)
            return pfail(p, KVS_ERR_FORMAT, "general.alignment %u is not a non-zero power of "
                         "two", v);
        g->alignment = v;
    }
    return KVS_OK;
}

static kvs_status parse_tensor_info(parser *p, uint64_t i)
{
    kvs_gguf *g = p->g;
    kvs_gguf_tensor *t = &g->tensors[i];
    snprintf(p->ctx, sizeof p->ctx, "tensor #%llu", (ull)i);
    char *name = NULL;
    kvs_status st = parse_name(p, &name);
    if (st != KVS_OK)
        return st;
    t->name = name;
    snprintf(p->ctx, sizeof p->ctx, "tensor '%.100s'", name);
    uint64_t *slot = table_slot(g, 1, name);
    if (*slot)
        return pfail(p, KVS_ERR_FORMAT, "duplicate tensor name (also tensor #%llu)",
                     (ull)(*slot - 1));
    *slot = i + 1;
    if ((st = get_u32(p, "n_dims", &t->n_dims)) != KVS_OK)
        return st;
    if (t->n_dims < 1 || t->n_dims > KVS_GGUF_MAX_DIMS)
        return pfail(p, KVS_ERR_FORMAT, "n_dims %u out of range (1..%d)", t->n_dims,
                     KVS_GGUF_MAX_DIMS);
    uint64_t n = 1;
    for (uint32_t d = 0; d < KVS_GGUF_MAX_DIMS; d++) {
        t->dims[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((st = get_u64(p, "dim", &t->dims[d])) != KVS_OK)
            return st;
        uint64_t v = t->dims[d];
        if (v == 0)
            return pfail(p, KVS_ERR_FORMAT, "dims[%u] is 0", d);
        if (v > INT64_MAX / n)
            return pfail(p, KVS_ERR_FORMAT, "element count overflows (dims[%u] = %llu)", d,
                         (ull)v);
        n *= v;
    }
    t->n_elems = n;
    uint32_t type = 0;
    if ((st = get_u32(p, "type", &type)) != KVS_OK)
        return st;
    if (!kvs_dtype_valid(type)) {
        const char *known = ggml_type_name(type);
        if (known)
            return pfail(p, KVS_ERR_UNSUPPORTED, "tensor type %u (%s) is not supported "
                         "(supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, "
                         "q4_K, q5_K, q6_K, iq4_nl)", type, known);
        return pfail(p, KVS_ERR_UNSUPPORTED, "unknown tensor type id %u", type);
    }
    t->type = (kvs_dtype)type;
    size_t block = kvs_dtype_block_elems(t->type);
    if (t->dims[0] % block != 0)
        return pfail(p, KVS_ERR_FORMAT, "dims[0] = %llu is not a multiple of the %s block size "
                     "%zu%s", (ull)t->dims[0], kvs_dtype_name(t->type), block,
                     kvs_dtype_is_kquant(t->type) ? " (a K-quant row is a whole number of "
                     "super-blocks of 256)" : "");
    if (kvs_dtype_bytes(t->type, n, &t->n_bytes) != 0)
        return pfail(p, KVS_ERR_FORMAT, "byte size of %llu %s elements overflows", (ull)n,
                     kvs_dtype_name(t->type));
    return get_u64(p, "data offset", &t->offset);
}

/* "q4_K [256, 2048] is 294912 bytes": the byte size a tensor's stated type and dimensions give,
 * for the messages about data that does not fit the file. */
static const char *shape_text(const kvs_gguf_tensor *t, char *buf, size_t size)
{
    char dims[100] = "";
    int n = 0;
    for (uint32_t d = 0; d < t->n_dims && n >= 0 && (size_t)n < sizeof dims; d++)
        n += snprintf(dims + n, sizeof dims - (size_t)n, "%s%llu", d ? ", " : "",
                      (ull)t->dims[d]);
    snprintf(buf, size, "%s [%s] is %llu bytes", kvs_dtype_name(t->type), dims,
             (ull)t->n_bytes);
    return buf;
}

static int cmp_offset(const void *a, const void *b)
{
    const kvs_gguf_tensor *x = *(const kvs_gguf_tensor *const *)a;
    const kvs_gguf_tensor *y = *(const kvs_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static kvs_status parse_tensors(parser *p)
{
    kvs_gguf *g = p->g;
    kvs_status st;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor_info(p, i)) != KVS_OK)
            return st;
    p->ctx[0] = '\0';
    uint64_t a = g->alignment;
    g->data_start = p->pos + (a - p->pos % a) % a;
    if (g->n_tensors == 0)
        return KVS_OK;
    if (g->data_start > g->size)
        return pfail(p, KVS_ERR_FORMAT, "data section starts at %llu, past end of file (size "
                     "%llu)", (ull)g->data_start, (ull)g->size);
    uint64_t data_size = g->size - g->data_start;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvs_gguf_tensor *t = &g->tensors[i];
        snprintf(p->ctx, sizeof p->ctx, "tensor '%.100s'", t->name);
        if (t->offset % a != 0)
            return pfail(p, KVS_ERR_FORMAT, "data offset %llu is not a multiple of the alignment "
                         "%u", (ull)t->offset, g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset) {
            char shape[160];
            return pfail(p, KVS_ERR_FORMAT, "data [offset %llu, %llu bytes] extends past end of "
                         "file (size %llu, data section at %llu); %s: the file is truncated, or "
                         "the stated type or dimensions do not match the data", (ull)t->offset,
                         (ull)t->n_bytes, (ull)g->size, (ull)g->data_start,
                         shape_text(t, shape, sizeof shape));
        }
        t->data = g->map + g->data_start + t->offset;
    }
    p->ctx[0] = '\0';
    const kvs_gguf_tensor **order = malloc(g->n_tensors * sizeof *order);
    if (!order)
        return pfail(p, KVS_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, cmp_offset);
    st = KVS_OK;
    for (uint64_t i = 1; i < g->n_tensors && st == KVS_OK; i++) {
        const kvs_gguf_tensor *x = order[i - 1], *y = order[i];
        char shape[160];
        if (x->n_bytes > y->offset - x->offset)
            st = pfail(p, KVS_ERR_FORMAT, "tensor '%.100s': data [offset %llu, %llu bytes] "
                       "overlaps tensor '%.100s' [offset %llu, %llu bytes]; %s: the stated type "
                       "or dimensions do not match the data, or an offset is wrong", x->name,
                       (ull)x->offset, (ull)x->n_bytes, y->name, (ull)y->offset,
                       (ull)y->n_bytes, shape_text(x, shape, sizeof shape));
        /* GGUF writers (GGML's, gguf-py, kvslim's) store the tensors back to back, each padded
         * to the alignment, and GGML's reader requires exactly that. A longer gap means that the
         * stated type or shape gives fewer bytes than the writer stored. */
        else if (y->offset - x->offset - x->n_bytes >= a)
            st = pfail(p, KVS_ERR_FORMAT, "tensor '%.100s': data [offset %llu, %llu bytes] ends "
                       "%llu bytes before the next tensor '%.100s' (at offset %llu), more than the "
                       "padding to the alignment %u; %s: the stated type or dimensions do not "
                       "match the data", x->name, (ull)x->offset,
                       (ull)x->n_bytes, (ull)(y->offset - x->offset - x->n_bytes), y->name,
                       (ull)y->offset, g->alignment, shape_text(x, shape, sizeof shape));
    }
    free(order);
    return st;
}

/* Parses the mapped bytes of g; on success *out = g, on failure g is closed. */
static kvs_status parse_all(kvs_gguf *g, kvs_gguf **out, kvs_error *err)
{
    parser p = {.g = g, .err = err};
    kvs_status st;
    if ((st = parse_header(&p)) != KVS_OK || (st = parse_kvs(&p)) != KVS_OK ||
        (st = parse_tensors(&p)) != KVS_OK) {
        kvs_gguf_close(g);
        return st;
    }
    *out = g;
    return KVS_OK;
}

kvs_status kvs_gguf_open(const char *path, kvs_gguf **out, kvs_error *err)
{
    *out = NULL;
    kvs_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = copy_str(path, strlen(path)))) {
        free(g);
        return kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvs_status st = kvs_fail(err, KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        kvs_gguf_close(g);
        return st;
    }
    struct stat sb;
    kvs_status st = KVS_OK;
    if (fstat(fd, &sb) != 0)
        st = kvs_fail(err, KVS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = kvs_fail(err, KVS_ERR_IO, "%s: not a regular file", path);
    else if ((uint64_t)sb.st_size > SIZE_MAX)
        st = kvs_fail(err, KVS_ERR_IO, "%s: file too large to map", path);
    else if (sb.st_size == 0)
        st = kvs_fail(err, KVS_ERR_FORMAT, "%s: truncated header (file is empty)", path);
    if (st == KVS_OK) {
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED)
            st = kvs_fail(err, KVS_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        else
            g->map = m, g->size = (uint64_t)sb.st_size;
    }
    close(fd);
    return st == KVS_OK ? parse_all(g, out, err) : (kvs_gguf_close(g), st);
}

kvs_status kvs_gguf_open_mem(const char *name, const void *data, uint64_t size, kvs_gguf **out,
                             kvs_error *err)
{
    *out = NULL;
    kvs_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = copy_str(name, strlen(name)))) {
        free(g);
        return kvs_fail(err, KVS_ERR_NOMEM, "%s: out of memory", name);
    }
    g->map = data, g->size = size, g->borrowed = 1;
    if (size == 0) {
        kvs_gguf_close(g);
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: truncated header (the buffer is empty)", name);
    }
    return parse_all(g, out, err);
}

void kvs_gguf_release(kvs_gguf *g, const void *p, uint64_t n)
{
    if (!g || !g->map || g->borrowed || n == 0)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t start = (uintptr_t)g->map, end = start + (uintptr_t)g->size;
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (lo < start || hi > end || hi <= lo)
        return;
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* read-only file pages: refaulted if read */
}

void kvs_gguf_close(kvs_gguf *g)
{
    if (!g)
        return;
    if (g->map && !g->borrowed)
        munmap((void *)g->map, (size_t)g->size);
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_pos);
        }
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++)
            free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_tab);
    free(g->t_tab);
    free(g->path);
    free(g);
}

/* ---- accessors ---- */

uint32_t kvs_gguf_version(const kvs_gguf *g) { return g->version; }
uint32_t kvs_gguf_alignment(const kvs_gguf *g) { return g->alignment; }
uint64_t kvs_gguf_n_keys(const kvs_gguf *g) { return g->n_kv; }
uint64_t kvs_gguf_n_tensors(const kvs_gguf *g) { return g->n_tensors; }
uint64_t kvs_gguf_data_offset(const kvs_gguf *g) { return g->data_start; }

const char *kvs_gguf_key_at(const kvs_gguf *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].key : NULL;
}

kvs_gguf_type kvs_gguf_key_type(const kvs_gguf *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].type : (kvs_gguf_type)-1;
}

int64_t kvs_gguf_find_key(const kvs_gguf *g, const char *key)
{
    if (!key)
        return -1;
    uint64_t slot = *table_slot(g, 0, key);
    return slot ? (int64_t)(slot - 1) : -1;
}

const kvs_gguf_tensor *kvs_gguf_tensor_at(const kvs_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvs_gguf_tensor *kvs_gguf_find_tensor(const kvs_gguf *g, const char *name)
{
    if (!name)
        return NULL;
    uint64_t slot = *table_slot(g, 1, name);
    return slot ? &g->tensors[slot - 1] : NULL;
}

/* ---- typed getters ---- */

/* Finds key; a missing key is an error unless opt (then *out = NULL and KVS_OK). */
static kvs_status lookup(const kvs_gguf *g, const char *key, int opt, const gguf_kv **out,
                         kvs_error *err)
{
    int64_t i = kvs_gguf_find_key(g, key);
    *out = i < 0 ? NULL : &g->kv[i];
    if (i < 0 && !opt)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s' is missing", g->path, key);
    return KVS_OK;
}

static kvs_status wrong_type(const kvs_gguf *g, const gguf_kv *kv, const char *expected,
                             kvs_error *err)
{
    return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s' has type %s, expected %s",
                    g->path, kv->key, kvs_gguf_type_name(kv->type), expected);
}

/* Integer value: *neg set and *s filled for negative values, else *u. -1 if not an integer. */
static int int_value(const gguf_kv *kv, int *neg, int64_t *s, uint64_t *u)
{
    const uint8_t *b = kv->val;
    int64_t sv;
    *neg = 0;
    switch (kv->type) {
    case KVS_GGUF_UINT8: *u = b[0]; return 0;
    case KVS_GGUF_UINT16: { uint16_t v; memcpy(&v, b, 2); *u = v; return 0; }
    case KVS_GGUF_UINT32: *u = rd32(b); return 0;
    case KVS_GGUF_UINT64: *u = rd64(b); return 0;
    case KVS_GGUF_INT8: sv = (int8_t)b[0]; break;
    case KVS_GGUF_INT16: { int16_t v; memcpy(&v, b, 2); sv = v; break; }
    case KVS_GGUF_INT32: { int32_t v; memcpy(&v, b, 4); sv = v; break; }
    case KVS_GGUF_INT64: memcpy(&sv, b, 8); break;
    default: return -1;
    }
    if (sv < 0)
        *neg = 1, *s = sv;
    else
        *u = (uint64_t)sv;
    return 0;
}

/* Unsigned getter core: the value must be an integer in [0, max]. */
static kvs_status get_unsigned(const kvs_gguf *g, const char *key, int opt, uint64_t max,
                               const char *tname, uint64_t *out, int *found, kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, opt, &kv, err);
    *found = kv != NULL;
    if (st != KVS_OK || !kv)
        return st;
    int neg = 0;
    int64_t s = 0;
    uint64_t u = 0;
    if (int_value(kv, &neg, &s, &u) != 0)
        return wrong_type(g, kv, "an integer", err);
    if (neg)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s': value %lld does not fit in "
                        "%s", g->path, key, (long long)s, tname);
    if (u > max)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s': value %llu does not fit in "
                        "%s", g->path, key, (ull)u, tname);
    *out = u;
    return KVS_OK;
}

static kvs_status get_u32_impl(const kvs_gguf *g, const char *key, int opt, uint32_t *out,
                               kvs_error *err)
{
    uint64_t v = 0;
    int found;
    kvs_status st = get_unsigned(g, key, opt, UINT32_MAX, "u32", &v, &found, err);
    if (st == KVS_OK && found)
        *out = (uint32_t)v;
    return st;
}

kvs_status kvs_gguf_get_u32(const kvs_gguf *g, const char *key, uint32_t *out, kvs_error *err)
{
    return get_u32_impl(g, key, 0, out, err);
}

kvs_status kvs_gguf_get_u32_opt(const kvs_gguf *g, const char *key, uint32_t *out,
                                kvs_error *err)
{
    return get_u32_impl(g, key, 1, out, err);
}

kvs_status kvs_gguf_get_u64(const kvs_gguf *g, const char *key, uint64_t *out, kvs_error *err)
{
    int found;
    return get_unsigned(g, key, 0, UINT64_MAX, "u64", out, &found, err);
}

kvs_status kvs_gguf_get_i64(const kvs_gguf *g, const char *key, int64_t *out, kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, 0, &kv, err);
    if (st != KVS_OK)
        return st;
    int neg = 0;
    int64_t s = 0;
    uint64_t u = 0;
    if (int_value(kv, &neg, &s, &u) != 0)
        return wrong_type(g, kv, "an integer", err);
    if (!neg && u > INT64_MAX)
        return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s': value %llu does not fit in "
                        "i64", g->path, key, (ull)u);
    *out = neg ? s : (int64_t)u;
    return KVS_OK;
}

static kvs_status get_float_impl(const kvs_gguf *g, const char *key, int opt, int want_f32,
                                 double *out, int *found, kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, opt, &kv, err);
    *found = kv != NULL;
    if (st != KVS_OK || !kv)
        return st;
    double d;
    if (kv->type == KVS_GGUF_FLOAT32) {
        float f;
        memcpy(&f, kv->val, 4);
        d = f;
    } else if (kv->type == KVS_GGUF_FLOAT64) {
        memcpy(&d, kv->val, 8);
        /* finite but outside float's range */
        if (want_f32 && d - d == 0 && (d > FLT_MAX || d < -FLT_MAX))
            return kvs_fail(err, KVS_ERR_FORMAT, "%s: metadata key '%s': value %g does not fit "
                            "in f32", g->path, key, d);
    } else {
        return wrong_type(g, kv, "f32 or f64", err);
    }
    *out = d;
    return KVS_OK;
}

kvs_status kvs_gguf_get_f32(const kvs_gguf *g, const char *key, float *out, kvs_error *err)
{
    double d = 0;
    int found;
    kvs_status st = get_float_impl(g, key, 0, 1, &d, &found, err);
    if (st == KVS_OK)
        *out = (float)d;
    return st;
}

kvs_status kvs_gguf_get_f32_opt(const kvs_gguf *g, const char *key, float *out, kvs_error *err)
{
    double d = 0;
    int found;
    kvs_status st = get_float_impl(g, key, 1, 1, &d, &found, err);
    if (st == KVS_OK && found)
        *out = (float)d;
    return st;
}

kvs_status kvs_gguf_get_f64(const kvs_gguf *g, const char *key, double *out, kvs_error *err)
{
    int found;
    return get_float_impl(g, key, 0, 0, out, &found, err);
}

kvs_status kvs_gguf_get_bool_opt(const kvs_gguf *g, const char *key, int *out, kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, 1, &kv, err);
    if (st != KVS_OK || !kv)
        return st;
    if (kv->type != KVS_GGUF_BOOL)
        return wrong_type(g, kv, "bool", err);
    *out = kv->val[0];
    return KVS_OK;
}

kvs_status kvs_gguf_get_str(const kvs_gguf *g, const char *key, kvs_gguf_str *out,
                            kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, 0, &kv, err);
    if (st != KVS_OK)
        return st;
    if (kv->type != KVS_GGUF_STRING)
        return wrong_type(g, kv, "string", err);
    out->len = rd64(kv->val);
    out->data = (const char *)kv->val + 8;
    return KVS_OK;
}

kvs_status kvs_gguf_get_arr(const kvs_gguf *g, const char *key, kvs_gguf_type *elem_type,
                            uint64_t *n, kvs_error *err)
{
    const gguf_kv *kv;
    kvs_status st = lookup(g, key, 0, &kv, err);
    if (st != KVS_OK)
        return st;
    if (kv->type != KVS_GGUF_ARRAY)
        return wrong_type(g, kv, "array", err);
    *elem_type = kv->elem;
    *n = kv->n;
    return KVS_OK;
}

kvs_status kvs_gguf_arr_str(const kvs_gguf *g, const char *key, uint64_t i, kvs_gguf_str *out,
                            kvs_error *err)
{
    int64_t k = kvs_gguf_find_key(g, key);
    if (k < 0)
        return kvs_fail(err, KVS_ERR_ARG, "%s: metadata key '%s' is missing", g->path, key);
    const gguf_kv *kv = &g->kv[k];
    if (kv->type != KVS_GGUF_ARRAY || kv->elem != KVS_GGUF_STRING)
        return kvs_fail(err, KVS_ERR_ARG, "%s: metadata key '%s' is not a string array",
                        g->path, key);
    if (i >= kv->n)
        return kvs_fail(err, KVS_ERR_ARG, "%s: metadata key '%s': index %llu out of range "
                        "(%llu strings)", g->path, key, (ull)i, (ull)kv->n);
    const uint8_t *b = g->map + kv->str_pos[i];
    out->len = rd64(b);
    out->data = (const char *)b + 8;
    return KVS_OK;
}

const void *kvs_gguf_arr_data(const kvs_gguf *g, const char *key)
{
    int64_t k = kvs_gguf_find_key(g, key);
    if (k < 0)
        return NULL;
    const gguf_kv *kv = &g->kv[k];
    if (kv->type != KVS_GGUF_ARRAY || kvs_gguf_scalar_size(kv->elem) == 0)
        return NULL;
    return kv->val;
}
