/* GGUF reader/writer tests: round trip, the shared stories260K models, and corrupted files
 * (truncations, bad header fields, random byte flips) that must fail cleanly. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "gguf/gguf.h"

typedef unsigned long long ull;

static char tmp_file[512]; /* scratch file for corrupted images */

/* ---- byte buffers ---- */

typedef struct img {
    uint8_t *b;
    size_t n;
} img;

static img read_all(const char *path)
{
    img m = {0};
    FILE *f = fopen(path, "rb");
    if (!f)
        return m;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    m.b = malloc((size_t)n);
    if (m.b && fread(m.b, 1, (size_t)n, f) == (size_t)n)
        m.n = (size_t)n;
    fclose(f);
    return m;
}

static int write_all(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(b, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* When larger than the image: the scratch file's size, extended sparsely with zero bytes. */
static off_t sparse_size;

/* Opens an image written to the scratch file; returns the status, err filled. */
static kvs_status open_image(const uint8_t *b, size_t n, kvs_error *err)
{
    if (write_all(tmp_file, b, n) != 0 ||
        (sparse_size > (off_t)n && truncate(tmp_file, sparse_size) != 0)) {
        fprintf(stderr, "cannot write %s\n", tmp_file);
        exit(2);
    }
    kvs_gguf *g = NULL;
    memset(err, 0, sizeof *err);
    kvs_status st = kvs_gguf_open(tmp_file, &g, err);
    kvs_gguf_close(g);
    return st;
}

/* Patches a copy of m (at off: 4 or 8 bytes of v), opens it and checks the status and that the
 * message starts with the path and contains want. */
static void expect_fail(const img *m, size_t off, int width, uint64_t v, kvs_status code,
                        const char *want, int line)
{
    uint8_t *c = malloc(m->n);
    memcpy(c, m->b, m->n);
    if (width == 1)
        c[off] = (uint8_t)v;
    else if (width == 4)
        put32(c + off, (uint32_t)v);
    else
        put64(c + off, v);
    kvs_error err;
    kvs_status st = open_image(c, m->n, &err);
    CHECKF(st == code && strncmp(err.msg, tmp_file, strlen(tmp_file)) == 0 &&
               strstr(err.msg, want) != NULL,
           "line %d: patch @%zu = %llu: status %d (want %d), msg '%s' (want '%s')", line, off,
           (ull)v, st, code, err.msg, want);
    free(c);
}
#define EXPECT_FAIL(m, off, w, v, code, want) expect_fail(m, off, w, v, code, want, __LINE__)

/* ---- a minimal independent walker over a valid file, to locate fields ---- */

#define MAXF 64
typedef struct layout {
    size_t kv_name[MAXF], kv_type[MAXF], kv_val[MAXF];
    size_t t_name[MAXF], t_ndims[MAXF], t_dims[MAXF], t_type[MAXF], t_off[MAXF];
    size_t end; /* end of the tensor infos */
} layout;

static size_t elem_size(uint32_t t)
{
    static const size_t s[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? s[t] : 0;
}

static int walk(const img *m, layout *L)
{
    size_t p = 24;
    uint64_t nt = get64(m->b + 8), nk = get64(m->b + 16);
    if (nt > MAXF || nk > MAXF)
        return -1;
    for (uint64_t i = 0; i < nk; i++) {
        L->kv_name[i] = p;
        p += 8 + get64(m->b + p);
        L->kv_type[i] = p;
        uint32_t t = get32(m->b + p);
        p += 4;
        L->kv_val[i] = p;
        if (t == 8) {
            p += 8 + get64(m->b + p);
        } else if (t == 9) {
            uint32_t et = get32(m->b + p);
            uint64_t n = get64(m->b + p + 4);
            p += 12;
            if (et == 8)
                for (uint64_t k = 0; k < n; k++)
                    p += 8 + get64(m->b + p);
            else
                p += n * elem_size(et);
        } else {
            p += elem_size(t);
        }
    }
    for (uint64_t i = 0; i < nt; i++) {
        L->t_name[i] = p;
        p += 8 + get64(m->b + p);
        L->t_ndims[i] = p;
        uint32_t nd = get32(m->b + p);
        p += 4;
        L->t_dims[i] = p;
        p += 8 * nd;
        L->t_type[i] = p;
        L->t_off[i] = p + 4;
        p += 12;
    }
    L->end = p;
    return 0;
}

/* ---- round trip ---- */

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

static void test_round_trip(void)
{
    char path[512];
    check_tmp_path(path, sizeof path, "");
    snprintf(path + strlen(path), sizeof path - strlen(path), "gguf_rt_%d.gguf", (int)getpid());
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    CHECK(w != NULL);

    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int64_t i64 = -(INT64_C(1) << 62) - 3;
    double f64 = 2.718281828459045;
    const char *strs[] = {"<unk>", "", "\xc3\xbc\x62\x65\x72", "a b", "<s>"}; /* "über" */
    float f32s[] = {1.5f, -2.0f, 0.25f, 1e30f};
    int32_t i32s[] = {-1, 0, 7, INT32_MAX};
    uint8_t bools[] = {1, 0, 1};
    uint64_t u64s[] = {UINT64_MAX, 0, 42};
    double f64s[] = {-0.5, 1e300};
    CHECK(kvs_gguf_set_str(w, "general.name", "first") == KVS_OK);
    CHECK(kvs_gguf_set_u32(w, "general.alignment", 64) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.u8", KVS_GGUF_UINT8, &u8) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.i8", KVS_GGUF_INT8, &i8) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.u16", KVS_GGUF_UINT16, &u16) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.i16", KVS_GGUF_INT16, &i16) == KVS_OK);
    CHECK(kvs_gguf_set_u32(w, "t.u32", 4000000000u) == KVS_OK);
    CHECK(kvs_gguf_set_i32(w, "t.i32", -2000000000) == KVS_OK);
    CHECK(kvs_gguf_set_f32(w, "t.f32", 3.5f) == KVS_OK);
    CHECK(kvs_gguf_set_bool(w, "t.bool", 1) == KVS_OK);
    CHECK(kvs_gguf_set_bool(w, "t.bool0", 0) == KVS_OK);
    CHECK(kvs_gguf_set_u64(w, "t.u64", (UINT64_C(1) << 63) + 5) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.i64", KVS_GGUF_INT64, &i64) == KVS_OK);
    CHECK(kvs_gguf_set_scalar(w, "t.f64", KVS_GGUF_FLOAT64, &f64) == KVS_OK);
    CHECK(kvs_gguf_set_arr_str(w, "t.strs", strs, 5) == KVS_OK);
    CHECK(kvs_gguf_set_arr_f32(w, "t.f32s", f32s, 4) == KVS_OK);
    CHECK(kvs_gguf_set_arr_i32(w, "t.i32s", i32s, 4) == KVS_OK);
    CHECK(kvs_gguf_set_arr(w, "t.bools", KVS_GGUF_BOOL, bools, 3) == KVS_OK);
    CHECK(kvs_gguf_set_arr(w, "t.u64s", KVS_GGUF_UINT64, u64s, 3) == KVS_OK);
    CHECK(kvs_gguf_set_arr(w, "t.f64s", KVS_GGUF_FLOAT64, f64s, 2) == KVS_OK);
    CHECK(kvs_gguf_set_arr(w, "t.empty", KVS_GGUF_UINT8, NULL, 0) == KVS_OK);
    CHECK(kvs_gguf_set_str(w, "general.name", "w\xc3\xb6rld") == KVS_OK); /* replaces */
    /* writer argument checks */
    uint8_t two = 2;
    CHECK(kvs_gguf_set_scalar(w, "t.bad", KVS_GGUF_BOOL, &two) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_scalar(w, "t.bad", KVS_GGUF_STRING, "x") == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "", 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "bad\xff", 1) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_u32(w, "general.alignment", 48) == KVS_ERR_ARG);
    CHECK(kvs_gguf_set_str(w, "t.null", NULL) == KVS_ERR_ARG);

    /* tensors of every supported type, 1..4 dims */
    static uint8_t d_f32[7 * 4], d_f16[3 * 5 * 2], d_bf16[2 * 3 * 4 * 2], d_q8[3 * 34 * 2],
        d_q4[2 * 2 * 2 * 18];
    struct {
        const char *name;
        kvs_dtype type;
        uint32_t nd;
        uint64_t dims[4];
        uint8_t *data;
        size_t n;
    } ts[] = {
        {"t.f32", KVS_F32, 1, {7}, d_f32, sizeof d_f32},
        {"t.f16", KVS_F16, 2, {3, 5}, d_f16, sizeof d_f16},
        {"t.bf16", KVS_BF16, 3, {2, 3, 4}, d_bf16, sizeof d_bf16},
        {"t.q8_0", KVS_Q8_0, 2, {64, 3}, d_q8, sizeof d_q8},
        {"t.q4_0", KVS_Q4_0, 4, {32, 2, 2, 2}, d_q4, sizeof d_q4},
    };
    kvs_error err;
    for (unsigned i = 0; i < 5; i++) {
        fill(ts[i].data, ts[i].n, i + 1);
        CHECK(kvs_gguf_add_tensor(w, ts[i].name, ts[i].type, ts[i].nd, ts[i].dims, ts[i].data,
                                  &err) == KVS_OK);
    }
    uint64_t bad_dims[] = {33, 2};
    CHECK(kvs_gguf_add_tensor(w, "t.f32", KVS_F32, 1, bad_dims, d_f32, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "duplicate"));
    CHECK(kvs_gguf_add_tensor(w, "x", KVS_Q8_0, 2, bad_dims, d_q8, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "block size"));
    CHECK(kvs_gguf_add_tensor(w, "x", KVS_F32, 0, bad_dims, d_f32, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_add_tensor(w, "x", KVS_F32, 5, bad_dims, d_f32, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_add_tensor(w, "x", (kvs_dtype)16, 1, bad_dims, d_f32, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_add_tensor(w, "", KVS_F32, 1, bad_dims, d_f32, &err) == KVS_ERR_ARG);

    CHECKF(kvs_gguf_write(w, path, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf_writer_free(w);

    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (!g)
        return;
    CHECK(kvs_gguf_version(g) == 3);
    CHECK(kvs_gguf_alignment(g) == 64);
    CHECK(kvs_gguf_data_offset(g) % 64 == 0);
    CHECK(kvs_gguf_n_keys(g) == 21);
    CHECK(strcmp(kvs_gguf_key_at(g, 0), "general.name") == 0); /* replaced in place */
    CHECK(strcmp(kvs_gguf_key_at(g, 20), "t.empty") == 0);
    CHECK(kvs_gguf_key_at(g, 21) == NULL);
    CHECK(kvs_gguf_find_key(g, "t.f64") == 13);
    CHECK(kvs_gguf_find_key(g, "t.nope") == -1);
    static const kvs_gguf_type types[] = {
        KVS_GGUF_STRING, KVS_GGUF_UINT32, KVS_GGUF_UINT8, KVS_GGUF_INT8, KVS_GGUF_UINT16,
        KVS_GGUF_INT16, KVS_GGUF_UINT32, KVS_GGUF_INT32, KVS_GGUF_FLOAT32, KVS_GGUF_BOOL,
        KVS_GGUF_BOOL, KVS_GGUF_UINT64, KVS_GGUF_INT64, KVS_GGUF_FLOAT64, KVS_GGUF_ARRAY};
    for (unsigned i = 0; i < sizeof types / sizeof types[0]; i++)
        CHECKF(kvs_gguf_key_type(g, i) == types[i], "key %u", i);

    kvs_gguf_str s;
    CHECK(kvs_gguf_get_str(g, "general.name", &s, &err) == KVS_OK && s.len == 6 &&
          memcmp(s.data, "w\xc3\xb6rld", 6) == 0);
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    int64_t sv = 0;
    float f = 0;
    double d = 0;
    int b = -1;
    CHECK(kvs_gguf_get_u32(g, "t.u8", &u32, &err) == KVS_OK && u32 == 200);
    CHECK(kvs_gguf_get_u32(g, "t.u16", &u32, &err) == KVS_OK && u32 == 60000);
    CHECK(kvs_gguf_get_u32(g, "t.u32", &u32, &err) == KVS_OK && u32 == 4000000000u);
    CHECK(kvs_gguf_get_i64(g, "t.i8", &sv, &err) == KVS_OK && sv == -100);
    CHECK(kvs_gguf_get_i64(g, "t.i16", &sv, &err) == KVS_OK && sv == -30000);
    CHECK(kvs_gguf_get_i64(g, "t.i32", &sv, &err) == KVS_OK && sv == -2000000000);
    CHECK(kvs_gguf_get_i64(g, "t.i64", &sv, &err) == KVS_OK && sv == i64);
    CHECK(kvs_gguf_get_u64(g, "t.u64", &u64, &err) == KVS_OK && u64 == (UINT64_C(1) << 63) + 5);
    CHECK(kvs_gguf_get_i64(g, "t.u32", &sv, &err) == KVS_OK && sv == 4000000000);
    CHECK(kvs_gguf_get_f32(g, "t.f32", &f, &err) == KVS_OK && f == 3.5f);
    CHECK(kvs_gguf_get_f64(g, "t.f64", &d, &err) == KVS_OK && d == f64);
    CHECK(kvs_gguf_get_f32(g, "t.f64", &f, &err) == KVS_OK && f == (float)f64);
    CHECK(kvs_gguf_get_bool_opt(g, "t.bool", &b, &err) == KVS_OK && b == 1);
    CHECK(kvs_gguf_get_bool_opt(g, "t.bool0", &b, &err) == KVS_OK && b == 0);
    /* conversion failures and missing keys */
    CHECK(kvs_gguf_get_u32(g, "t.i8", &u32, &err) == KVS_ERR_FORMAT &&
          strstr(err.msg, "'t.i8'") && strstr(err.msg, "does not fit in u32"));
    CHECK(kvs_gguf_get_u32(g, "t.u64", &u32, &err) == KVS_ERR_FORMAT &&
          strstr(err.msg, "does not fit"));
    CHECK(kvs_gguf_get_i64(g, "t.u64", &sv, &err) == KVS_ERR_FORMAT);
    CHECK(kvs_gguf_get_u32(g, "general.name", &u32, &err) == KVS_ERR_FORMAT &&
          strstr(err.msg, "has type string"));
    CHECK(kvs_gguf_get_u32(g, "t.bool", &u32, &err) == KVS_ERR_FORMAT);
    CHECK(kvs_gguf_get_f32(g, "t.u32", &f, &err) == KVS_ERR_FORMAT);
    CHECK(kvs_gguf_get_str(g, "t.u32", &s, &err) == KVS_ERR_FORMAT);
    CHECK(kvs_gguf_get_bool_opt(g, "t.u8", &b, &err) == KVS_ERR_FORMAT);
    CHECK(kvs_gguf_get_u32(g, "t.nope", &u32, &err) == KVS_ERR_FORMAT &&
          strstr(err.msg, path) && strstr(err.msg, "'t.nope' is missing"));
    CHECK(kvs_gguf_get_f32(g, "t.nope", &f, &err) == KVS_ERR_FORMAT);
    u32 = 77;
    f = 7.0f;
    b = 5;
    CHECK(kvs_gguf_get_u32_opt(g, "t.nope", &u32, &err) == KVS_OK && u32 == 77);
    CHECK(kvs_gguf_get_f32_opt(g, "t.nope", &f, &err) == KVS_OK && f == 7.0f);
    CHECK(kvs_gguf_get_bool_opt(g, "t.nope", &b, &err) == KVS_OK && b == 5);
    CHECK(kvs_gguf_get_u32_opt(g, "general.name", &u32, &err) == KVS_ERR_FORMAT && u32 == 77);
    CHECK(kvs_gguf_get_u32_opt(g, "t.u16", &u32, &err) == KVS_OK && u32 == 60000);
    CHECK(kvs_gguf_get_f32_opt(g, "t.f32", &f, &err) == KVS_OK && f == 3.5f);

    /* arrays */
    kvs_gguf_type et;
    uint64_t n;
    CHECK(kvs_gguf_get_arr(g, "t.strs", &et, &n, &err) == KVS_OK && et == KVS_GGUF_STRING &&
          n == 5);
    for (uint64_t i = 0; i < 5; i++)
        CHECK(kvs_gguf_arr_str(g, "t.strs", i, &s, &err) == KVS_OK &&
              s.len == strlen(strs[i]) && memcmp(s.data, strs[i], s.len) == 0);
    CHECK(kvs_gguf_arr_str(g, "t.strs", 5, &s, &err) == KVS_ERR_ARG &&
          strstr(err.msg, "out of range"));
    CHECK(kvs_gguf_arr_str(g, "t.f32s", 0, &s, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_arr_str(g, "t.nope", 0, &s, &err) == KVS_ERR_ARG);
    CHECK(kvs_gguf_arr_data(g, "t.strs") == NULL);
    CHECK(kvs_gguf_arr_data(g, "t.u32") == NULL);
    CHECK(kvs_gguf_arr_data(g, "t.nope") == NULL);
    CHECK(kvs_gguf_get_arr(g, "t.u32", &et, &n, &err) == KVS_ERR_FORMAT);
    struct {
        const char *key;
        kvs_gguf_type et;
        const void *v;
        uint64_t n;
        size_t size;
    } arrs[] = {
        {"t.f32s", KVS_GGUF_FLOAT32, f32s, 4, 4}, {"t.i32s", KVS_GGUF_INT32, i32s, 4, 4},
        {"t.bools", KVS_GGUF_BOOL, bools, 3, 1},  {"t.u64s", KVS_GGUF_UINT64, u64s, 3, 8},
        {"t.f64s", KVS_GGUF_FLOAT64, f64s, 2, 8}, {"t.empty", KVS_GGUF_UINT8, NULL, 0, 1},
    };
    for (unsigned i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        CHECK(kvs_gguf_get_arr(g, arrs[i].key, &et, &n, &err) == KVS_OK && et == arrs[i].et &&
              n == arrs[i].n);
        const void *data = kvs_gguf_arr_data(g, arrs[i].key);
        CHECK(data != NULL && (n == 0 || memcmp(data, arrs[i].v, n * arrs[i].size) == 0));
    }

    /* tensors */
    CHECK(kvs_gguf_n_tensors(g) == 5);
    CHECK(kvs_gguf_tensor_at(g, 5) == NULL);
    CHECK(kvs_gguf_find_tensor(g, "t.nope") == NULL);
    for (unsigned i = 0; i < 5; i++) {
        const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, ts[i].name);
        CHECK(t != NULL && t == kvs_gguf_tensor_at(g, i));
        if (!t)
            continue;
        CHECK(strcmp(t->name, ts[i].name) == 0);
        CHECK(t->type == ts[i].type && t->n_dims == ts[i].nd);
        uint64_t ne = 1;
        for (unsigned k = 0; k < 4; k++) {
            CHECK(t->dims[k] == (k < ts[i].nd ? ts[i].dims[k] : 1));
            ne *= t->dims[k];
        }
        CHECK(t->n_elems == ne && t->n_bytes == ts[i].n);
        CHECK(t->offset % 64 == 0 && (uintptr_t)t->data % 64 == 0);
        CHECK(memcmp(t->data, ts[i].data, ts[i].n) == 0);
    }
    kvs_gguf_close(g);

    /* version 2 (same layout) is accepted; version 1 is not */
    img m = read_all(path);
    CHECK(m.n > 0);
    put32(m.b + 4, 2);
    write_all(tmp_file, m.b, m.n);
    CHECKF(kvs_gguf_open(tmp_file, &g, &err) == KVS_OK, "%s", err.msg);
    if (g)
        CHECK(kvs_gguf_version(g) == 2 && kvs_gguf_n_tensors(g) == 5);
    kvs_gguf_close(g);
    free(m.b);
    unlink(path);
}

/* Corruptions of a small file written by our writer (for fields the real file lacks). */
static void test_own_corruptions(void)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    static float data[16];
    uint64_t dims[] = {8};
    kvs_error err;
    CHECK(kvs_gguf_set_u32(w, "general.alignment", 64) == KVS_OK);
    CHECK(kvs_gguf_set_bool(w, "k.a", 1) == KVS_OK);
    CHECK(kvs_gguf_set_str(w, "k.b", "x") == KVS_OK);
    CHECK(kvs_gguf_add_tensor(w, "t0", KVS_F32, 1, dims, data, &err) == KVS_OK);
    CHECK(kvs_gguf_add_tensor(w, "t1", KVS_F32, 1, dims, data + 8, &err) == KVS_OK);
    char path[512];
    check_tmp_path(path, sizeof path, "");
    snprintf(path + strlen(path), sizeof path - strlen(path), "gguf_own_%d.gguf", (int)getpid());
    CHECKF(kvs_gguf_write(w, path, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf_writer_free(w);
    img m = read_all(path);
    unlink(path);
    CHECK(m.n == 320); /* 165-byte header padded to 192, two 32-byte tensors padded to 64 */
    if (m.n != 320) {
        free(m.b);
        return;
    }
    kvs_error e;
    CHECKF(open_image(m.b, m.n, &e) == KVS_OK, "%s", e.msg);
    const uint8_t *al = memmem(m.b, m.n, "general.alignment", 17);
    const uint8_t *ka = memmem(m.b, m.n, "k.a", 3), *kb = memmem(m.b, m.n, "k.b", 3);
    const uint8_t *t1 = memmem(m.b, m.n, "t1", 2);
    CHECK(al && ka && kb && t1);
    if (!al || !ka || !kb || !t1) {
        free(m.b);
        return;
    }
    size_t o_al = (size_t)(al - m.b) + 17, o_ka = (size_t)(ka - m.b), o_kb = (size_t)(kb - m.b);
    size_t o_t1 = (size_t)(t1 - m.b);
    EXPECT_FAIL(&m, o_al + 4, 4, 0, KVS_ERR_FORMAT, "general.alignment 0 is not a non-zero");
    EXPECT_FAIL(&m, o_al + 4, 4, 3, KVS_ERR_FORMAT, "general.alignment 3 is not");
    EXPECT_FAIL(&m, o_al, 4, KVS_GGUF_INT32, KVS_ERR_FORMAT, "has type i32, expected u32");
    EXPECT_FAIL(&m, o_ka + 3 + 4, 1, 2, KVS_ERR_FORMAT, "bool value 2");
    EXPECT_FAIL(&m, o_kb + 2, 1, 'a', KVS_ERR_FORMAT, "duplicate key (also key #1)");
    EXPECT_FAIL(&m, o_kb, 1, 0xff, KVS_ERR_FORMAT, "metadata key #2: name is not valid UTF-8");
    EXPECT_FAIL(&m, o_kb + 1, 1, 0, KVS_ERR_FORMAT, "name contains a NUL byte");
    EXPECT_FAIL(&m, o_kb - 8, 8, 0, KVS_ERR_FORMAT, "metadata key #2: name is empty");
    EXPECT_FAIL(&m, o_t1 + 1, 1, '0', KVS_ERR_FORMAT, "tensor 't0': duplicate tensor name");
    EXPECT_FAIL(&m, o_t1, 1, 0xc0, KVS_ERR_FORMAT, "tensor #1: name is not valid UTF-8");
    /* t1's offset field: after name, n_dims, 1 dim, type */
    size_t o_t1off = o_t1 + 2 + 4 + 8 + 4;
    CHECK(get64(m.b + o_t1off) == 64);
    EXPECT_FAIL(&m, o_t1off, 8, 0, KVS_ERR_FORMAT, "overlaps tensor");
    EXPECT_FAIL(&m, o_t1off, 8, 32, KVS_ERR_FORMAT, "not a multiple of the alignment 64");
    EXPECT_FAIL(&m, o_t1off, 8, 128, KVS_ERR_FORMAT, "extends past end of file (size 320");
    free(m.b);

    /* hand-made images: nested arrays (accepted up to the nesting limit), empty file */
    uint8_t buf[1024];
    size_t p = 0;
    memcpy(buf, "GGUF", 4);
    put32(buf + 4, 3);
    put64(buf + 8, 0);
    put64(buf + 16, 1);
    p = 24;
    put64(buf + p, 1), buf[p + 8] = 'n', p += 9;
    put32(buf + p, KVS_GGUF_ARRAY), p += 4;
    put32(buf + p, KVS_GGUF_ARRAY), put64(buf + p + 4, 2), p += 12;
    put32(buf + p, KVS_GGUF_INT32), put64(buf + p + 4, 2), p += 12;
    put32(buf + p, 1), put32(buf + p + 4, 2), p += 8;
    put32(buf + p, KVS_GGUF_STRING), put64(buf + p + 4, 1), p += 12;
    put64(buf + p, 2), memcpy(buf + p + 8, "ab", 2), p += 10;
    CHECK(write_all(tmp_file, buf, p) == 0);
    kvs_gguf *g = NULL;
    CHECKF(kvs_gguf_open(tmp_file, &g, &e) == KVS_OK, "%s", e.msg);
    if (g) {
        kvs_gguf_type et;
        uint64_t n;
        kvs_gguf_str s;
        CHECK(kvs_gguf_get_arr(g, "n", &et, &n, &e) == KVS_OK && et == KVS_GGUF_ARRAY && n == 2);
        CHECK(kvs_gguf_arr_data(g, "n") == NULL);
        CHECK(kvs_gguf_arr_str(g, "n", 0, &s, &e) == KVS_ERR_ARG);
        kvs_gguf_close(g);
    }
    img nm = {buf, p};
    EXPECT_FAIL(&nm, p - 10, 8, 3, KVS_ERR_FORMAT, "string element #0 length 3 exceeds");
    EXPECT_FAIL(&nm, 24 + 9 + 4 + 12, 4, 13, KVS_ERR_FORMAT, "array element type 13 is not");
    EXPECT_FAIL(&nm, 24 + 9 + 4 + 4, 8, 4, KVS_ERR_FORMAT, "array length 4 of array elements");
    EXPECT_FAIL(&nm, 24 + 9 + 4 + 4, 8, 3, KVS_ERR_FORMAT, "truncated: array element type");
    /* nesting deeper than the limit: array of array of ... of (empty) array */
    p = 24 + 9;
    put32(buf + p, KVS_GGUF_ARRAY), p += 4;
    for (int depth = 1; depth <= KVS_GGUF_MAX_NESTING + 1; depth++) {
        put32(buf + p, KVS_GGUF_ARRAY), put64(buf + p + 4, depth <= KVS_GGUF_MAX_NESTING), p += 12;
    }
    nm.n = p;
    EXPECT_FAIL(&nm, 0, 1, 'G', KVS_ERR_UNSUPPORTED, "nested more than 8 levels");
    /* the same, but the depth-8 array holds (no) i32s: exactly at the limit, accepted */
    put32(buf + p - 24, KVS_GGUF_INT32);
    put64(buf + p - 24 + 4, 0);
    nm.n = p - 12;
    CHECKF(open_image(buf, nm.n, &e) == KVS_OK, "%s", e.msg);

    CHECK(open_image(buf, 0, &e) == KVS_ERR_FORMAT && strstr(e.msg, "truncated header"));
    CHECK(open_image(buf, 3, &e) == KVS_ERR_FORMAT && strstr(e.msg, "truncated header"));
    CHECK(open_image(buf, 20, &e) == KVS_ERR_FORMAT && strstr(e.msg, "truncated header"));
    CHECK(open_image((const uint8_t *)"GGUX", 4, &e) == KVS_ERR_FORMAT && strstr(e.msg, "bad magic"));
}

static int has_tmp_leftover(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int found = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0 && strstr(de->d_name, ".tmp."))
            found = 1;
    if (d)
        closedir(d);
    return found;
}

static void test_writer_failures(void)
{
    kvs_gguf_writer *w = kvs_gguf_writer_new();
    kvs_error err = {0};
    CHECK(kvs_gguf_set_u32(w, "a", 1) == KVS_OK);
    char path[1024], dir[256], name[64];
    check_tmp_path(dir, sizeof dir, "");
    snprintf(path, sizeof path, "%sno_such_dir_%d/x.gguf", dir, (int)getpid());
    CHECK(kvs_gguf_write(w, path, &err) == KVS_ERR_IO && strstr(err.msg, path) &&
          strstr(err.msg, "does not exist"));
    CHECK(access(path, F_OK) != 0);
    /* an existing directory is refused before any temporary file is written */
    snprintf(name, sizeof name, "gguf_isdir_%d", (int)getpid());
    snprintf(path, sizeof path, "%s%s", dir, name);
    CHECK(mkdir(path, 0755) == 0);
    CHECK(kvs_gguf_write(w, path, &err) == KVS_ERR_IO && strstr(err.msg, path) &&
          strstr(err.msg, "is a directory"));
    CHECK(!has_tmp_leftover(dir[0] ? dir : ".", name));
    rmdir(path);
    /* an alignment key of the wrong type is refused at write time */
    CHECK(kvs_gguf_set_u64(w, "general.alignment", 64) == KVS_OK);
    snprintf(path, sizeof path, "%sgguf_badalign_%d.gguf", dir, (int)getpid());
    CHECK(kvs_gguf_write(w, path, &err) == KVS_ERR_ARG && strstr(err.msg, "general.alignment"));
    CHECK(access(path, F_OK) != 0);
    kvs_gguf_writer_free(w);
    kvs_gguf_writer_free(NULL);

    kvs_gguf *g = (kvs_gguf *)1;
    snprintf(path, sizeof path, "%sgguf_missing_%d.gguf", dir, (int)getpid());
    CHECK(kvs_gguf_open(path, &g, &err) == KVS_ERR_IO && g == NULL && strstr(err.msg, path) &&
          strstr(err.msg, "cannot open"));
    CHECK(kvs_gguf_open(dir[0] ? dir : ".", &g, &err) == KVS_ERR_IO &&
          strstr(err.msg, "not a regular file"));
    kvs_gguf_close(NULL);
}

/* ---- the shared stories260K models ---- */

static void test_real_models(void)
{
    char path[512];
    kvs_error err;
    kvs_gguf *g = NULL;
    check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g) {
        CHECK(kvs_gguf_n_tensors(g) == 48 && kvs_gguf_n_keys(g) == 19);
        CHECK(kvs_gguf_version(g) == 3 && kvs_gguf_alignment(g) == 32);
        kvs_gguf_str s;
        CHECK(kvs_gguf_get_str(g, "general.architecture", &s, &err) == KVS_OK && s.len == 5 &&
              memcmp(s.data, "llama", 5) == 0);
        uint32_t v = 0;
        CHECK(kvs_gguf_get_u32(g, "llama.block_count", &v, &err) == KVS_OK && v == 5);
        float eps = 0;
        CHECK(kvs_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err) ==
                  KVS_OK && eps > 0 && eps < 1e-3f);
        kvs_gguf_type et;
        uint64_t n;
        CHECK(kvs_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err) == KVS_OK &&
              et == KVS_GGUF_STRING && n == 512);
        CHECK(kvs_gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s, &err) == KVS_OK &&
              s.len == 3 && memcmp(s.data, "<s>", 3) == 0);
        CHECK(kvs_gguf_arr_str(g, "tokenizer.ggml.tokens", 511, &s, &err) == KVS_OK);
        CHECK(kvs_gguf_arr_str(g, "tokenizer.ggml.tokens", 512, &s, &err) == KVS_ERR_ARG);
        CHECK(kvs_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &err) == KVS_OK &&
              et == KVS_GGUF_FLOAT32 && n == 512 && kvs_gguf_arr_data(g, "tokenizer.ggml.scores"));
        const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, "token_embd.weight");
        CHECK(t && t->n_dims == 2 && t->dims[0] == 64 && t->dims[1] == 512 && t->type == KVS_F32 &&
              t->n_bytes == 64 * 512 * 4);
        uint64_t total = 0;
        for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++)
            total += kvs_gguf_tensor_at(g, i)->n_bytes;
        CHECK(kvs_gguf_data_offset(g) + total == 1185376); /* tightly packed, ends at EOF */
        kvs_gguf_close(g);
    }
    check_shared_path(path, sizeof path, "models/gguf/stories260K-q8_0.gguf");
    g = NULL;
    CHECKF(kvs_gguf_open(path, &g, &err) == KVS_OK, "%s", err.msg);
    if (g) {
        CHECK(kvs_gguf_n_tensors(g) == 48);
        const kvs_gguf_tensor *t = kvs_gguf_find_tensor(g, "blk.0.attn_q.weight");
        CHECK(t && t->type == KVS_Q8_0 && t->n_bytes == 64 * 64 / 32 * 34);
        for (int l = 0; l < 5; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
            t = kvs_gguf_find_tensor(g, name);
            CHECKF(t && t->type == KVS_F16 && t->dims[0] == 172 && t->dims[1] == 64, "%s", name);
        }
        kvs_gguf_close(g);
    }
}

/* kvs_gguf_open_mem on the bytes of the real file: the same keys, tensors and offsets as the
 * file route, data pointers into the caller's buffer, the name in messages, and an empty or cut
 * buffer refused like the file. */
static void test_open_mem(const img *m)
{
    char path[512];
    kvs_error err;
    kvs_gguf *f = NULL, *g = NULL;
    check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf");
    CHECKF(kvs_gguf_open(path, &f, &err) == KVS_OK, "%s", err.msg);
    CHECKF(kvs_gguf_open_mem("in-memory", m->b, m->n, &g, &err) == KVS_OK, "%s", err.msg);
    if (f && g) {
        CHECK(kvs_gguf_n_keys(g) == kvs_gguf_n_keys(f) && kvs_gguf_n_tensors(g) == 48);
        CHECK(kvs_gguf_data_offset(g) == kvs_gguf_data_offset(f));
        for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++) {
            const kvs_gguf_tensor *a = kvs_gguf_tensor_at(f, i), *b = kvs_gguf_tensor_at(g, i);
            CHECKF(strcmp(a->name, b->name) == 0 && a->n_bytes == b->n_bytes &&
                       (const uint8_t *)b->data >= m->b &&
                       (const uint8_t *)b->data + b->n_bytes <= m->b + m->n &&
                       memcmp(a->data, b->data, a->n_bytes) == 0,
                   "tensor %llu", (unsigned long long)i);
        }
    }
    kvs_gguf_close(f);
    kvs_gguf_close(g);
    g = NULL;
    CHECK(kvs_gguf_open_mem("empty-buffer", m->b, 0, &g, &err) == KVS_ERR_FORMAT && !g &&
          strstr(err.msg, "empty-buffer"));
    CHECK(kvs_gguf_open_mem("cut-buffer", m->b, m->n - 1, &g, &err) == KVS_ERR_FORMAT && !g &&
          strstr(err.msg, "cut-buffer"));
}

/* ---- corruption of the real f32 file ---- */

static void test_truncations(const img *m, const layout *L)
{
    int fd = open(tmp_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, m->b, m->n) == (ssize_t)m->n);
    kvs_gguf *g = NULL;
    kvs_error err;
    CHECKF(kvs_gguf_open(tmp_file, &g, &err) == KVS_OK, "%s", err.msg);
    kvs_gguf_close(g);
    /* descending lengths: a sample in the data region, then every byte of the header region */
    size_t hdr = L->end + 64, bad = 0, n_tried = 0;
    for (size_t len = m->n - 1; len + 1 > 0; len = len > hdr ? (len > 997 + hdr ? len - 997 : hdr)
                                                          : len - 1) {
        if (ftruncate(fd, (off_t)len) != 0)
            break;
        memset(&err, 0, sizeof err);
        g = NULL;
        kvs_status st = kvs_gguf_open(tmp_file, &g, &err);
        n_tried++;
        if (st != KVS_ERR_FORMAT || g != NULL || strncmp(err.msg, tmp_file, strlen(tmp_file)) ||
            strlen(err.msg) <= strlen(tmp_file) + 2) {
            if (bad++ < 5)
                fprintf(stderr, "truncation at %zu: status %d msg '%s'\n", len, st, err.msg);
        }
        kvs_gguf_close(g);
        if (len == 0)
            break;
    }
    CHECKF(bad == 0, "%zu of %zu truncations did not fail cleanly", bad, n_tried);
    CHECK(n_tried > hdr);
    close(fd);
}

static void test_header_corruptions(const img *m, const layout *L)
{
    size_t data_start = (L->end + 31) / 32 * 32;
    EXPECT_FAIL(m, 0, 1, 'g', KVS_ERR_FORMAT, "bad magic (expected GGUF");
    EXPECT_FAIL(m, 4, 4, 0, KVS_ERR_FORMAT, "version 0");
    EXPECT_FAIL(m, 4, 4, 1, KVS_ERR_UNSUPPORTED, "version 1 is not supported");
    EXPECT_FAIL(m, 4, 4, 4, KVS_ERR_UNSUPPORTED, "unsupported GGUF version 4");
    EXPECT_FAIL(m, 4, 4, 0xFFFFFFFF, KVS_ERR_UNSUPPORTED, "version 4294967295");
    EXPECT_FAIL(m, 4, 4, 0x03000000, KVS_ERR_UNSUPPORTED, "big-endian");
    EXPECT_FAIL(m, 8, 8, UINT64_MAX, KVS_ERR_FORMAT, "tensor count 18446744073709551615 exceeds");
    EXPECT_FAIL(m, 8, 8, UINT64_C(1) << 40, KVS_ERR_FORMAT, "tensor count");
    EXPECT_FAIL(m, 8, 8, 49, KVS_ERR_FORMAT, "tensor #48: name is empty");
    EXPECT_FAIL(m, 16, 8, UINT64_MAX, KVS_ERR_FORMAT, "metadata count 18446744073709551615");
    EXPECT_FAIL(m, 16, 8, UINT64_C(1) << 40, KVS_ERR_FORMAT, "metadata count");
    EXPECT_FAIL(m, 16, 8, 20, KVS_ERR_FORMAT, "tensor #0: name length");
    EXPECT_FAIL(m, 16, 8, 18, KVS_ERR_FORMAT, "tensor 'llama.attention.layer_norm_rms_epsilon': "
                "n_dims 6 out of range"); /* key #18 parsed as tensor #0 */

    /* key names and string values (key #5 is general.name = "llama") */
    EXPECT_FAIL(m, L->kv_name[3], 8, UINT64_MAX, KVS_ERR_FORMAT,
                "metadata key #3: name length 18446744073709551615 exceeds file size");
    EXPECT_FAIL(m, L->kv_name[3], 8, 0, KVS_ERR_FORMAT, "metadata key #3: name is empty");
    EXPECT_FAIL(m, L->kv_name[3], 8, 65536, KVS_ERR_FORMAT, "longer than 65535");
    EXPECT_FAIL(m, L->kv_val[5], 8, UINT64_MAX, KVS_ERR_FORMAT,
                "metadata key #5 ('general.name'): string length 18446744073709551615 exceeds "
                "file size");
    EXPECT_FAIL(m, L->kv_val[5], 8, m->n - (L->kv_val[5] + 8) + 1, KVS_ERR_FORMAT,
                "('general.name'): string length");
    EXPECT_FAIL(m, L->kv_val[0] + 12, 8, UINT64_MAX, KVS_ERR_FORMAT,
                "('tokenizer.ggml.tokens'): string element #0 length");
    /* array lengths (key 0: 512 strings, key 1: 512 f32) */
    EXPECT_FAIL(m, L->kv_val[0] + 4, 8, UINT64_MAX, KVS_ERR_FORMAT,
                "('tokenizer.ggml.tokens'): array length 18446744073709551615 of string elements");
    EXPECT_FAIL(m, L->kv_val[1] + 4, 8, UINT64_C(1) << 62, KVS_ERR_FORMAT,
                "('tokenizer.ggml.scores'): array length 4611686018427387904 of f32");
    EXPECT_FAIL(m, L->kv_val[1] + 4, 8, 513, KVS_ERR_FORMAT, "metadata key #2: name length");
    EXPECT_FAIL(m, L->kv_val[1], 4, 13, KVS_ERR_FORMAT, "array element type 13");
    /* value type ids */
    EXPECT_FAIL(m, L->kv_type[6], 4, 13, KVS_ERR_FORMAT,
                "metadata key #6 ('tokenizer.ggml.unknown_token_id'): value type 13 is not");
    EXPECT_FAIL(m, L->kv_type[6], 4, 0xFFFFFFFF, KVS_ERR_FORMAT, "value type 4294967295");
    /* tensor 0 is token_embd.weight [64, 512] f32 at offset 0; tensor 1 output_norm [64] */
    EXPECT_FAIL(m, L->t_ndims[0], 4, 0, KVS_ERR_FORMAT,
                "tensor 'token_embd.weight': n_dims 0 out of range");
    EXPECT_FAIL(m, L->t_ndims[0], 4, 5, KVS_ERR_FORMAT, "n_dims 5 out of range");
    EXPECT_FAIL(m, L->t_dims[0] + 8, 8, 0, KVS_ERR_FORMAT, "'token_embd.weight': dims[1] is 0");
    EXPECT_FAIL(m, L->t_dims[0], 8, UINT64_C(1) << 62, KVS_ERR_FORMAT,
                "element count overflows (dims[1] = 512)");
    EXPECT_FAIL(m, L->t_dims[0], 8, UINT64_MAX, KVS_ERR_FORMAT, "element count overflows");
    EXPECT_FAIL(m, L->t_type[0], 4, 99, KVS_ERR_UNSUPPORTED,
                "tensor 'token_embd.weight': unknown tensor type id 99");
    EXPECT_FAIL(m, L->t_type[0], 4, 16, KVS_ERR_UNSUPPORTED, "tensor type 16 (iq2_xxs) is not");
    {   /* output_norm.weight [64] as Q8_0 would be fine; with dims[0] = 48 it is not */
        img q = {malloc(m->n), m->n};
        memcpy(q.b, m->b, m->n);
        put32(q.b + L->t_type[1], KVS_Q8_0);
        EXPECT_FAIL(&q, L->t_dims[1], 8, 48, KVS_ERR_FORMAT,
                    "'output_norm.weight': dims[0] = 48 is not a multiple of the q8_0 block size 32");
        free(q.b);
    }
    EXPECT_FAIL(m, L->t_off[1], 8, get64(m->b + L->t_off[1]) + 4, KVS_ERR_FORMAT,
                "'output_norm.weight': data offset 131076 is not a multiple of the alignment 32");
    EXPECT_FAIL(m, L->t_off[1], 8, UINT64_C(1) << 40, KVS_ERR_FORMAT,
                "'output_norm.weight': data [offset 1099511627776, 256 bytes] extends past end "
                "of file (size 1185376");
    EXPECT_FAIL(m, L->t_off[0], 8, m->n - data_start - 32, KVS_ERR_FORMAT,
                "extends past end of file");
    EXPECT_FAIL(m, L->t_off[1], 8, UINT64_MAX - 31, KVS_ERR_FORMAT, "extends past end of file");
    EXPECT_FAIL(m, L->t_off[2], 8, 131072, KVS_ERR_FORMAT, "overlaps tensor");
    EXPECT_FAIL(m, L->t_off[1], 8, 32, KVS_ERR_FORMAT,
                "tensor 'token_embd.weight': data [offset 0, 131072 bytes] overlaps tensor "
                "'output_norm.weight'");
}

/* Random single-byte flips in the header region: any status is fine, but no crash or leak. */
/* Counts the file size would allow, in sparse files whose zero bytes read as empty names,
 * strings and arrays: kvslim's own limits (gguf.h) stop them before anything is allocated. */
static void test_limits(const img *m, const layout *L)
{
    sparse_size = (off_t)1 << 30;
    EXPECT_FAIL(m, 8, 8, KVS_GGUF_MAX_TENSORS + 1, KVS_ERR_UNSUPPORTED,
                "tensor count 1048577 exceeds kvslim's limit of 1048576 tensors");
    EXPECT_FAIL(m, 16, 8, KVS_GGUF_MAX_KEYS + 1, KVS_ERR_UNSUPPORTED,
                "metadata count 1048577 exceeds kvslim's limit of 1048576 keys");
    EXPECT_FAIL(m, L->kv_val[0] + 4, 8, KVS_GGUF_MAX_STRINGS + 1, KVS_ERR_UNSUPPORTED,
                "metadata key #0 ('tokenizer.ggml.tokens'): array length 16777217 of string "
                "elements exceeds kvslim's limit of 16777216");
    /* key #1, tokenizer.ggml.scores: f32; 2^28 + 1 of them need just over 1 GiB */
    sparse_size = ((off_t)1 << 30) + ((off_t)1 << 20);
    EXPECT_FAIL(m, L->kv_val[1] + 4, 8, KVS_GGUF_MAX_ARRAY + 1, KVS_ERR_UNSUPPORTED,
                "('tokenizer.ggml.scores'): array length 268435457 of f32 elements exceeds "
                "kvslim's limit of 268435456");
    sparse_size = 0;
}

static void test_fuzz(const img *m, const layout *L)
{
    int fd = open(tmp_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, m->b, m->n) == (ssize_t)m->n);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int opened = 0, failed = 0;
    for (int it = 0; it < 3000; it++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t off = (size_t)((rng >> 33) % (L->end + 32));
        uint8_t v = (uint8_t)(rng >> 17);
        if (v == m->b[off])
            v ^= 0x80;
        if (pwrite(fd, &v, 1, (off_t)off) != 1)
            break;
        kvs_gguf *g = NULL;
        kvs_error err = {0};
        if (kvs_gguf_open(tmp_file, &g, &err) == KVS_OK) {
            opened++;
            /* touch everything the reader hands out */
            uint64_t n = 0, sum = 0;
            kvs_gguf_type et;
            kvs_gguf_str s;
            if (kvs_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err) == KVS_OK)
                for (uint64_t i = 0; i < n; i++)
                    if (kvs_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &err) == KVS_OK &&
                        s.len > 0)
                        sum += (uint8_t)s.data[s.len - 1];
            for (uint64_t i = 0; i < kvs_gguf_n_tensors(g); i++) {
                const kvs_gguf_tensor *t = kvs_gguf_tensor_at(g, i);
                const uint8_t *d = t->data;
                sum += d[0] + d[t->n_bytes - 1];
            }
            for (uint64_t i = 0; i < kvs_gguf_n_keys(g); i++) {
                uint32_t u;
                kvs_gguf_get_u32_opt(g, kvs_gguf_key_at(g, i), &u, &err);
            }
            (void)sum;
        } else {
            failed++;
            CHECKF(err.msg[0] != '\0', "flip @%zu: empty message", off);
        }
        kvs_gguf_close(g);
        if (pwrite(fd, &m->b[off], 1, (off_t)off) != 1)
            break;
    }
    close(fd);
    CHECK(opened + failed == 3000);
    printf("fuzz: 3000 header byte flips, %d opened, %d rejected\n", opened, failed);
}

int main(void)
{
    check_tmp_path(tmp_file, sizeof tmp_file, "");
    snprintf(tmp_file + strlen(tmp_file), sizeof tmp_file - strlen(tmp_file),
             "gguf_scratch_%d.gguf", (int)getpid());
    test_round_trip();
    test_own_corruptions();
    test_writer_failures();
    test_real_models();

    char path[512];
    img m = read_all(check_shared_path(path, sizeof path, "models/gguf/stories260K-f32.gguf"));
    layout L = {0};
    int ok = m.n == 1185376 && walk(&m, &L) == 0;
    CHECK(ok);
    if (ok) {
        CHECK(L.end == 14152);
        test_open_mem(&m);
        test_header_corruptions(&m, &L);
        test_truncations(&m, &L);
        test_limits(&m, &L);
        test_fuzz(&m, &L);
    }
    free(m.b);
    unlink(tmp_file);
    return check_summary("gguf");
}
