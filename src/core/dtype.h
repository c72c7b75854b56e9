/* Tensor element types. The numeric values are the GGML/GGUF type ids. */
#ifndef KVS_DTYPE_H
#define KVS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvs_dtype {
    KVS_F32 = 0,
    KVS_F16 = 1,
    KVS_Q4_0 = 2,
    KVS_Q8_0 = 8,
    KVS_BF16 = 30,
} kvs_dtype;

#define KVS_QK 32 /* elements per Q8_0 / Q4_0 block */

/* Q8_0: 32 int8 quants sharing one fp16 scale d: x[i] = d * qs[i]. */
typedef struct {
    uint16_t d;
    int8_t qs[KVS_QK];
} kvs_block_q8_0;

/* Q4_0: 32 4-bit quants, fp16 scale d: x[i] = d * (q[i] - 8). Element j (j < 16) is the low
 * nibble of qs[j], element j + 16 the high nibble of qs[j]. */
typedef struct {
    uint16_t d;
    uint8_t qs[KVS_QK / 2];
} kvs_block_q4_0;

/* 1 for a type kvslim supports, 0 otherwise (any uint32 may be passed). */
int kvs_dtype_valid(uint32_t t);
const char *kvs_dtype_name(kvs_dtype t);
/* Parses "f32", "f16", "bf16", "q8_0", "q4_0" (case-insensitive). Returns 0 on success. */
int kvs_dtype_parse(const char *name, kvs_dtype *out);
size_t kvs_dtype_block_elems(kvs_dtype t);
size_t kvs_dtype_block_bytes(kvs_dtype t);
/* Bytes for n elements. Returns 0 on success, -1 if n is not a whole number of blocks or the
 * result would overflow. */
int kvs_dtype_bytes(kvs_dtype t, uint64_t n, uint64_t *out);

#endif
