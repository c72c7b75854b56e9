/* GGUF v3 reader (mmap, strict bounds checks) and writer. */
#ifndef KVS_GGUF_H
#define KVS_GGUF_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/outfile.h"

typedef enum kvs_gguf_type {
    KVS_GGUF_UINT8 = 0,
    KVS_GGUF_INT8 = 1,
    KVS_GGUF_UINT16 = 2,
    KVS_GGUF_INT16 = 3,
    KVS_GGUF_UINT32 = 4,
    KVS_GGUF_INT32 = 5,
    KVS_GGUF_FLOAT32 = 6,
    KVS_GGUF_BOOL = 7,
    KVS_GGUF_STRING = 8,
    KVS_GGUF_ARRAY = 9,
    KVS_GGUF_UINT64 = 10,
    KVS_GGUF_INT64 = 11,
    KVS_GGUF_FLOAT64 = 12,
} kvs_gguf_type;

#define KVS_GGUF_MAX_DIMS 4
#define KVS_GGUF_DEFAULT_ALIGNMENT 32
#define KVS_GGUF_MAX_NESTING 8 /* deepest array-of-array nesting accepted */

#define KVS_GGUF_MAX_NAME 65535 /* longest key or tensor name accepted, in bytes */

/* Limits on the counts a file states, checked (after the checks against the file size) before
 * anything is allocated from them or looped over. The file-size checks alone do not bound
 * the work: a sparse file (or one on a compressing file system) can be terabytes long on paper
 * while its zero bytes read as valid empty strings and arrays. Each limit is far beyond what
 * any model file needs:
 * - keys: llama.cpp's files have under 100; each key costs about 100 bytes of index.
 * - tensors: the largest models have a few thousand (experts are stacked into one tensor per
 *   layer); each costs about 100 bytes of index.
 * - string array elements: vocabularies and merge lists have at most a few hundred thousand
 *   entries; the reader keeps an 8-byte offset per element (at most 128 MiB).
 * - other array elements: not copied, but checked one by one (bools, nested arrays), so the
 *   limit bounds the time open takes. */
#define KVS_GGUF_MAX_KEYS (1u << 20)
#define KVS_GGUF_MAX_TENSORS (1u << 20)
#define KVS_GGUF_MAX_STRINGS (1u << 24)
#define KVS_GGUF_MAX_ARRAY (1u << 28)

/* "u8", "string", "array", ...; "unknown" for an invalid id. */
const char *kvs_gguf_type_name(uint32_t t);
/* Bytes of one scalar of metadata type t; 0 for STRING, ARRAY and invalid ids. */
uint64_t kvs_gguf_scalar_size(uint32_t t);
/* Key and tensor names must be 1..KVS_GGUF_MAX_NAME bytes of valid UTF-8 without NUL bytes.
 * Returns NULL if s[0..len) is a valid name, else a short reason ("is empty", ...). */
const char *kvs_gguf_name_problem(const char *s, uint64_t len);

/* A string inside the mapped file: not NUL-terminated. */
typedef struct kvs_gguf_str {
    uint64_t len;
    const char *data;
} kvs_gguf_str;

typedef struct kvs_gguf_tensor {
    const char *name;              /* NUL-terminated copy owned by the kvs_gguf */
    uint32_t n_dims;
    uint64_t dims[KVS_GGUF_MAX_DIMS]; /* dims[0] is the contiguous (row) dimension; unused = 1 */
    kvs_dtype type;
    uint64_t offset;               /* relative to the start of the data section */
    uint64_t n_elems;
    uint64_t n_bytes;
    const void *data;              /* points into the mapping, aligned as the file says */
} kvs_gguf_tensor;

typedef struct kvs_gguf kvs_gguf;

/* Maps and validates the whole file: every count, length, offset and size is checked against
 * the file size with overflow-safe arithmetic, and the counts against the limits above; tensor types must be ones kvs_dtype_valid accepts;
 * tensor data must lie inside the file and not overlap. Errors name the path and the key or
 * tensor at fault. */
kvs_status kvs_gguf_open(const char *path, kvs_gguf **out, kvs_error *err);
/* The same parse of a file already in memory (the fuzzers' route: no file, no mmap). The
 * buffer is borrowed: it must outlive the handle and anything made from it; name stands in
 * for the path in messages. Tensor data is aligned relative to the buffer's start, so only as
 * well as the buffer itself is. */
kvs_status kvs_gguf_open_mem(const char *name, const void *data, uint64_t size, kvs_gguf **out,
                             kvs_error *err);
void kvs_gguf_close(kvs_gguf *g);
/* The caller has its own copy of the bytes [p, p + n) of the mapping: the whole pages among
 * them leave the process's resident set (they stay in the page cache, and are read back from
 * the file if touched again, so the data never changes). Nothing happens for a borrowed
 * buffer or a range outside the mapping. */
void kvs_gguf_release(kvs_gguf *g, const void *p, uint64_t n);

uint32_t kvs_gguf_version(const kvs_gguf *g);
uint32_t kvs_gguf_alignment(const kvs_gguf *g);
uint64_t kvs_gguf_n_keys(const kvs_gguf *g);
/* Key name of the i-th metadata entry (NUL-terminated, owned by g); NULL if i is out of range. */
const char *kvs_gguf_key_at(const kvs_gguf *g, uint64_t i);
/* Index of key, or -1 if absent. */
int64_t kvs_gguf_find_key(const kvs_gguf *g, const char *key);
/* Value type of the i-th entry; (kvs_gguf_type)-1 if i is out of range. */
kvs_gguf_type kvs_gguf_key_type(const kvs_gguf *g, uint64_t i);

/* Typed getters. Each fails with KVS_ERR_FORMAT and a message naming the key if the key is
 * missing or its value does not convert exactly (integers: any integer type whose value fits;
 * floats: FLOAT32 or FLOAT64). The *_opt variants return KVS_OK and leave *out untouched when the
 * key is absent (but still fail on a wrong type). */
kvs_status kvs_gguf_get_u32(const kvs_gguf *g, const char *key, uint32_t *out, kvs_error *err);
kvs_status kvs_gguf_get_u32_opt(const kvs_gguf *g, const char *key, uint32_t *out, kvs_error *err);
kvs_status kvs_gguf_get_f32(const kvs_gguf *g, const char *key, float *out, kvs_error *err);
kvs_status kvs_gguf_get_f32_opt(const kvs_gguf *g, const char *key, float *out, kvs_error *err);
kvs_status kvs_gguf_get_bool_opt(const kvs_gguf *g, const char *key, int *out, kvs_error *err);
kvs_status kvs_gguf_get_str(const kvs_gguf *g, const char *key, kvs_gguf_str *out, kvs_error *err);
/* Wider getters with the same rules (integers of any type whose value fits; FLOAT32/FLOAT64). */
kvs_status kvs_gguf_get_u64(const kvs_gguf *g, const char *key, uint64_t *out, kvs_error *err);
kvs_status kvs_gguf_get_i64(const kvs_gguf *g, const char *key, int64_t *out, kvs_error *err);
kvs_status kvs_gguf_get_f64(const kvs_gguf *g, const char *key, double *out, kvs_error *err);

/* Arrays: element type and count. Nested arrays (element type KVS_GGUF_ARRAY) are validated at
 * open (up to KVS_GGUF_MAX_NESTING levels) and reported here, but their elements are not
 * accessible: kvs_gguf_arr_data returns NULL for them. */
kvs_status kvs_gguf_get_arr(const kvs_gguf *g, const char *key, kvs_gguf_type *elem_type,
                            uint64_t *n, kvs_error *err);
/* i-th string of a string array (bounds-checked; returns KVS_ERR_ARG if out of range or not a
 * string array). */
kvs_status kvs_gguf_arr_str(const kvs_gguf *g, const char *key, uint64_t i, kvs_gguf_str *out,
                            kvs_error *err);
/* Raw little-endian element data of a numeric (or bool) array (may be unaligned: read with
 * memcpy); NULL if the key is absent or not a numeric array. */
const void *kvs_gguf_arr_data(const kvs_gguf *g, const char *key);

uint64_t kvs_gguf_n_tensors(const kvs_gguf *g);
const kvs_gguf_tensor *kvs_gguf_tensor_at(const kvs_gguf *g, uint64_t i);
const kvs_gguf_tensor *kvs_gguf_find_tensor(const kvs_gguf *g, const char *name);
/* Absolute file offset of the data section (a multiple of the alignment). */
uint64_t kvs_gguf_data_offset(const kvs_gguf *g);

/* ---- writer ---- */
typedef struct kvs_gguf_writer kvs_gguf_writer;

kvs_gguf_writer *kvs_gguf_writer_new(void);
void kvs_gguf_writer_free(kvs_gguf_writer *w);
/* Setters copy key and value. Setting a key twice replaces the value. Return KVS_ERR_NOMEM on
 * allocation failure, KVS_ERR_ARG for a NULL/empty/non-UTF-8 key or NULL value.
 * "general.alignment" (u32, power of two) changes the data alignment. */
kvs_status kvs_gguf_set_u32(kvs_gguf_writer *w, const char *key, uint32_t v);
kvs_status kvs_gguf_set_i32(kvs_gguf_writer *w, const char *key, int32_t v);
kvs_status kvs_gguf_set_u64(kvs_gguf_writer *w, const char *key, uint64_t v);
kvs_status kvs_gguf_set_f32(kvs_gguf_writer *w, const char *key, float v);
kvs_status kvs_gguf_set_bool(kvs_gguf_writer *w, const char *key, int v);
kvs_status kvs_gguf_set_str(kvs_gguf_writer *w, const char *key, const char *v);
kvs_status kvs_gguf_set_arr_str(kvs_gguf_writer *w, const char *key, const char *const *v,
                                uint64_t n);
kvs_status kvs_gguf_set_arr_f32(kvs_gguf_writer *w, const char *key, const float *v, uint64_t n);
kvs_status kvs_gguf_set_arr_i32(kvs_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Any scalar type except STRING/ARRAY; v points to the value in its C type (uint8_t, int8_t,
 * ..., float, double; BOOL is a uint8_t 0 or 1). KVS_ERR_ARG for a bad type or bool value. */
kvs_status kvs_gguf_set_scalar(kvs_gguf_writer *w, const char *key, kvs_gguf_type type,
                               const void *v);
/* Array of any scalar element type (same representation as kvs_gguf_set_scalar). */
kvs_status kvs_gguf_set_arr(kvs_gguf_writer *w, const char *key, kvs_gguf_type elem_type,
                            const void *v, uint64_t n);
/* Adds a tensor; data is referenced, not copied, and must stay valid until kvs_gguf_write.
 * dims[0] is the row length. Fails with KVS_ERR_ARG if dims[0] is not a whole number of blocks
 * of type, or the name is a duplicate. */
kvs_status kvs_gguf_add_tensor(kvs_gguf_writer *w, const char *name, kvs_dtype type,
                               uint32_t n_dims, const uint64_t *dims, const void *data,
                               kvs_error *err);
/* Writes the file to path as core/outfile.h describes: via a temporary file beside it and
 * rename(), so a failed write never leaves a partial file under path; a FIFO or device is
 * written through. */
kvs_status kvs_gguf_write(const kvs_gguf_writer *w, const char *path, kvs_error *err);
/* The same to dst: messages name dst->flag, dst->inputs are never overwritten, and
 * dst->on_temp learns the temporary file's path (for removal on a signal). */
kvs_status kvs_gguf_write_to(const kvs_gguf_writer *w, const kvs_outfile_spec *dst,
                             kvs_error *err);

#endif
