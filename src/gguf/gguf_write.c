/* GGUF v3 writer: keys and tensors are collected in memory (tensor data by reference), then
 * written out through core/outfile (a temporary file beside the target, renamed into place;
 * FIFOs and devices written through). */
#include "gguf/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer stores host values as little-endian and needs a little-endian host"
#endif

typedef unsigned long long ull;

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* encoded value: exactly the bytes that follow the type in the file */
    size_t len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t n_dims;
    uint64_t dims[KVS_GGUF_MAX_DIMS];
    kvs_dtype type;
    uint64_t n_bytes;
    const void *data;
} wtensor;

struct kvs_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

kvs_gguf_writer *kvs_gguf_writer_new(void) { return calloc(1, sizeof(kvs_gguf_writer)); }

void kvs_gguf_writer_free(kvs_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static char *copy_str(const char *s)
{
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (c)
        memcpy(c, s, n + 1);
    return c;
}

/* Grows an array of elem-sized items to hold one more; 0 on success. */
static int grow(void **items, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? 2 * *cap : 16;
    if (nc > SIZE_MAX / elem)
        return -1;
    void *p = realloc(*items, nc * elem);
    if (!p)
        return -1;
    *items = p;
    *cap = nc;
    return 0;
}

/* Stores key = (type, encoded value), taking ownership of val (freed on failure). */
static kvs_status set_kv(kvs_gguf_writer *w, const char *key, uint32_t type, uint8_t *val,
                         size_t len)
{
    if (!w || !key || kvs_gguf_name_problem(key, strlen(key))) {
        free(val);
        return KVS_ERR_ARG;
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].len = len;
            return KVS_OK;
        }
    char *k = copy_str(key);
    if (!k || grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv) != 0) {
        free(k);
        free(val);
        return KVS_ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (wkv){k, type, val, len};
    return KVS_OK;
}

kvs_status kvs_gguf_set_scalar(kvs_gguf_writer *w, const char *key, kvs_gguf_type type,
                               const void *v)
{
    size_t size = (size_t)kvs_gguf_scalar_size(type);
    if (size == 0 || !v || (type == KVS_GGUF_BOOL && *(const uint8_t *)v > 1))
        return KVS_ERR_ARG;
    uint8_t *val = malloc(size);
    if (!val)
        return KVS_ERR_NOMEM;
    memcpy(val, v, size);
    return set_kv(w, key, type, val, size);
}

kvs_status kvs_gguf_set_arr(kvs_gguf_writer *w, const char *key, kvs_gguf_type elem_type,
                            const void *v, uint64_t n)
{
    size_t size = (size_t)kvs_gguf_scalar_size(elem_type);
    if (size == 0 || (!v && n > 0) || n > (SIZE_MAX - 12) / size)
        return KVS_ERR_ARG;
    if (elem_type == KVS_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)v)[i] > 1)
                return KVS_ERR_ARG;
    size_t len = 12 + (size_t)n * size;
    uint8_t *val = malloc(len);
    if (!val)
        return KVS_ERR_NOMEM;
    uint32_t et = elem_type;
    memcpy(val, &et, 4);
    memcpy(val + 4, &n, 8);
    if (n > 0)
        memcpy(val + 12, v, (size_t)n * size);
    return set_kv(w, key, KVS_GGUF_ARRAY, val, len);
}

kvs_status kvs_gguf_set_u32(kvs_gguf_writer *w, const char *key, uint32_t v)
{
    if (key && strcmp(key, "general.alignment") == 0 && (v == 0 || (v & (v - 1)) != 0))
        return KVS_ERR_ARG;
    return kvs_gguf_set_scalar(w, key, KVS_GGUF_UINT32, &v);
}

kvs_status kvs_gguf_set_i32(kvs_gguf_writer *w, const char *key, int32_t v)
{
    return kvs_gguf_set_scalar(w, key, KVS_GGUF_INT32, &v);
}

kvs_status kvs_gguf_set_u64(kvs_gguf_writer *w, const char *key, uint64_t v)
{
    return kvs_gguf_set_scalar(w, key, KVS_GGUF_UINT64, &v);
}

kvs_status kvs_gguf_set_f32(kvs_gguf_writer *w, const char *key, float v)
{
    return kvs_gguf_set_scalar(w, key, KVS_GGUF_FLOAT32, &v);
}

kvs_status kvs_gguf_set_bool(kvs_gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return kvs_gguf_set_scalar(w, key, KVS_GGUF_BOOL, &b);
}

kvs_status kvs_gguf_set_str(kvs_gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return KVS_ERR_ARG;
    uint64_t n = strlen(v);
    if (n > SIZE_MAX - 8)
        return KVS_ERR_ARG;
    uint8_t *val = malloc(8 + n);
    if (!val)
        return KVS_ERR_NOMEM;
    memcpy(val, &n, 8);
    memcpy(val + 8, v, n);
    return set_kv(w, key, KVS_GGUF_STRING, val, 8 + n);
}

kvs_status kvs_gguf_set_arr_str(kvs_gguf_writer *w, const char *key, const char *const *v,
                                uint64_t n)
{
    if (!v && n > 0)
        return KVS_ERR_ARG;
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!v[i])
            return KVS_ERR_ARG;
        size_t sl = strlen(v[i]);
        if (sl > SIZE_MAX - 8 - len)
            return KVS_ERR_NOMEM;
        len += 8 + sl;
    }
    uint8_t *val = malloc(len), *p = val;
    if (!val)
        return KVS_ERR_NOMEM;
    uint32_t et = KVS_GGUF_STRING;
    memcpy(p, &et, 4);
    memcpy(p + 4, &n, 8);
    p += 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t sl = strlen(v[i]);
        memcpy(p, &sl, 8);
        memcpy(p + 8, v[i], sl);
        p += 8 + sl;
    }
    return set_kv(w, key, KVS_GGUF_ARRAY, val, len);
}

kvs_status kvs_gguf_set_arr_f32(kvs_gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return kvs_gguf_set_arr(w, key, KVS_GGUF_FLOAT32, v, n);
}

kvs_status kvs_gguf_set_arr_i32(kvs_gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return kvs_gguf_set_arr(w, key, KVS_GGUF_INT32, v, n);
}

kvs_status kvs_gguf_add_tensor(kvs_gguf_writer *w, const char *name, kvs_dtype type,
                               uint32_t n_dims, const uint64_t *dims, const void *data,
                               kvs_error *err)
{
    if (!w || !name || !dims || !data)
        return kvs_fail(err, KVS_ERR_ARG, "add tensor: NULL argument");
    const char *why = kvs_gguf_name_problem(name, strlen(name));
    if (why)
        return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': name %s", name, why);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': duplicate name", name);
    if (!kvs_dtype_valid((uint32_t)type))
        return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': unsupported type %u", name,
                        (unsigned)type);
    if (n_dims < 1 || n_dims > KVS_GGUF_MAX_DIMS)
        return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': n_dims %u out of range (1..%d)",
                        name, n_dims, KVS_GGUF_MAX_DIMS);
    wtensor t = {.n_dims = n_dims, .type = type, .data = data};
    uint64_t n = 1;
    for (uint32_t d = 0; d < KVS_GGUF_MAX_DIMS; d++) {
        t.dims[d] = d < n_dims ? dims[d] : 1;
        if (t.dims[d] == 0 || t.dims[d] > INT64_MAX / n)
            return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': dims[%u] = %llu is zero or "
                            "overflows the element count", name, d, (ull)t.dims[d]);
        n *= t.dims[d];
    }
    if (t.dims[0] % kvs_dtype_block_elems(type) != 0 || kvs_dtype_bytes(type, n, &t.n_bytes))
        return kvs_fail(err, KVS_ERR_ARG, "tensor '%.100s': dims[0] = %llu is not a multiple of "
                        "the %s block size %zu", name, (ull)t.dims[0], kvs_dtype_name(type),
                        kvs_dtype_block_elems(type));
    if (!(t.name = copy_str(name)) ||
        grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t) != 0) {
        free(t.name);
        return kvs_fail(err, KVS_ERR_NOMEM, "tensor '%.100s': out of memory", name);
    }
    w->t[w->n_t++] = t;
    return KVS_OK;
}

/* ---- output ---- */

typedef struct out {
    FILE *f;
    uint64_t pos;
    int eno; /* first write error, 0 if none */
} out;

static void put(out *o, const void *p, size_t n)
{
    if (o->eno || n == 0)
        return;
    if (fwrite(p, 1, n, o->f) != n)
        o->eno = errno ? errno : EIO;
    o->pos += n;
}

static void put32(out *o, uint32_t v) { put(o, &v, 4); }
static void put64(out *o, uint64_t v) { put(o, &v, 8); }

static void pad_to(out *o, uint64_t align)
{
    static const uint8_t zeros[256];
    uint64_t n = (align - o->pos % align) % align;
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        put(o, zeros, k);
        n -= k;
    }
}

static void put_contents(const kvs_gguf_writer *w, out *o, uint32_t align)
{
    put(o, "GGUF", 4);
    put32(o, 3);
    put64(o, w->n_t);
    put64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        put64(o, strlen(kv->key));
        put(o, kv->key, strlen(kv->key));
        put32(o, kv->type);
        put(o, kv->val, kv->len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put64(o, strlen(t->name));
        put(o, t->name, strlen(t->name));
        put32(o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put64(o, t->dims[d]);
        put32(o, (uint32_t)t->type);
        put64(o, off);
        off += t->n_bytes + (align - t->n_bytes % align) % align;
    }
    pad_to(o, align);
    for (size_t i = 0; i < w->n_t; i++) {
        put(o, w->t[i].data, w->t[i].n_bytes);
        pad_to(o, align);
    }
}

kvs_status kvs_gguf_write_to(const kvs_gguf_writer *w, const kvs_outfile_spec *dst,
                             kvs_error *err)
{
    const char *path = dst->path;
    uint32_t align = KVS_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, "general.alignment") == 0) {
            uint32_t v = 0;
            if (w->kv[i].type == KVS_GGUF_UINT32)
                memcpy(&v, w->kv[i].val, 4);
            if (v == 0 || (v & (v - 1)) != 0)
                return kvs_fail(err, KVS_ERR_ARG, "%s: general.alignment must be a u32 power "
                                "of two", path);
            align = v;
        }
    uint64_t total = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        uint64_t n = w->t[i].n_bytes;
        if (total > UINT64_MAX - align || n > UINT64_MAX - align - total)
            return kvs_fail(err, KVS_ERR_ARG, "%s: tensor data too large", path);
        total += n + (align - n % align) % align;
    }

    kvs_outfile *f;
    kvs_status st = kvs_outfile_open(dst, &f, err);
    if (st != KVS_OK)
        return st;
    out o = {.f = kvs_outfile_stream(f)};
    put_contents(w, &o, align);
    if (o.eno) {
        kvs_outfile_abort(f);
        return kvs_fail(err, KVS_ERR_IO, "%s: write failed: %s", path, strerror(o.eno));
    }
    return kvs_outfile_commit(f, err);
}

kvs_status kvs_gguf_write(const kvs_gguf_writer *w, const char *path, kvs_error *err)
{
    if (!w || !path)
        return kvs_fail(err, KVS_ERR_ARG, "GGUF write: NULL argument");
    kvs_outfile_spec dst = {.path = path};
    return kvs_gguf_write_to(w, &dst, err);
}
