/* Tensor element types. The numeric values are the GGML/GGUF type ids (ggml.h's enum
 * ggml_type), and the block structs below are GGML's on-disk block layouts. */
#ifndef KVS_DTYPE_H
#define KVS_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvs_dtype {
    KVS_F32 = 0,
    KVS_F16 = 1,
    KVS_Q4_0 = 2,
    KVS_Q4_1 = 3,
    KVS_Q5_0 = 6,
    KVS_Q5_1 = 7,
    KVS_Q8_0 = 8,
    KVS_Q2_K = 10,
    KVS_Q3_K = 11,
    KVS_Q4_K = 12,
    KVS_Q5_K = 13,
    KVS_Q6_K = 14,
    KVS_IQ4_NL = 20,
    KVS_BF16 = 30,
} kvs_dtype;

#define KVS_QK 32   /* elements per Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL block */
#define KVS_QK_K 256 /* elements per K-quant super-block (Q2_K .. Q6_K) */
#define KVS_K_SCALE_SIZE 12 /* Q4_K / Q5_K: 8 6-bit scales and 8 6-bit mins, packed */

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

/* Q4_1: x[i] = d * q[i] + m, q in 0..15; nibbles as Q4_0 (element j low nibble of qs[j],
 * element j + 16 the high nibble). */
typedef struct {
    uint16_t d, m;
    uint8_t qs[KVS_QK / 2];
} kvs_block_q4_1;

/* Q5_0: x[i] = d * (q[i] - 16), q in 0..31: low 4 bits as Q4_0's nibbles, bit 4 of element i
 * is bit i of the little-endian uint32 qh. */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[KVS_QK / 2];
} kvs_block_q5_0;

/* Q5_1: x[i] = d * q[i] + m, q in 0..31, bits as Q5_0. */
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[KVS_QK / 2];
} kvs_block_q5_1;

/* IQ4_NL: x[i] = d * kvs_iq4nl_values[q[i]], 4-bit indices packed as Q4_0's nibbles. */
typedef struct {
    uint16_t d;
    uint8_t qs[KVS_QK / 2];
} kvs_block_iq4_nl;

/* The 16 non-linear IQ4_NL levels (GGML's kvalues_iq4nl). */
extern const int8_t kvs_iq4nl_values[16];

/* The K-quants: super-blocks of 256 elements in 16 or 8 sub-blocks, fp16 super-block scales.
 *
 * Q2_K: 16 sub-blocks of 16. scales[s] holds sub-block s's 4-bit scale (low nibble) and 4-bit
 * min (high nibble): x = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3 (2 bits). Element
 * 128 * h + 32 * j + l (h < 2, j < 4, l < 32) is bits 2j..2j+1 of qs[32 h + l] and is in
 * sub-block 8 h + 2 j + l / 16. */
typedef struct {
    uint8_t scales[KVS_QK_K / 16];
    uint8_t qs[KVS_QK_K / 4];
    uint16_t d, dmin;
} kvs_block_q2_K;

/* Q3_K: 16 sub-blocks of 16 with 6-bit scales (stored biased by 32, packed in 12 bytes: low 4
 * bits of scales 0..7 / 8..15 in the low / high nibbles of bytes 0..7, the top 2 bits of scale
 * 4 k + i in bits 2k..2k+1 of byte 8 + i). x = d * (scale - 32) * (q - 4 * !hbit), q the 2-bit
 * value placed as in Q2_K, hbit bit (4 h + j) of hmask[l] for element 128 h + 32 j + l. */
typedef struct {
    uint8_t hmask[KVS_QK_K / 8];
    uint8_t qs[KVS_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} kvs_block_q3_K;

/* Q4_K: 8 sub-blocks of 32 with 6-bit scale sc and min m (packed in scales[12]: for s < 4,
 * sc = scales[s] & 63, m = scales[s + 4] & 63; for s >= 4 the low 4 bits come from the nibbles
 * of scales[s + 4] and the top 2 bits from bits 6..7 of scales[s - 4] / scales[s]).
 * x = (d * sc) * q - dmin * m, q in 0..15. Element 64 j + l (l < 32) is the low nibble of
 * qs[32 j + l] (sub-block 2 j); element 64 j + 32 + l its high nibble (sub-block 2 j + 1). */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[KVS_K_SCALE_SIZE];
    uint8_t qs[KVS_QK_K / 2];
} kvs_block_q4_K;

/* Q5_K: Q4_K plus a fifth bit: element 64 j + l takes bit 2 j of qh[l], element 64 j + 32 + l
 * bit 2 j + 1 (as + 16), q in 0..31. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[KVS_K_SCALE_SIZE];
    uint8_t qh[KVS_QK_K / 8];
    uint8_t qs[KVS_QK_K / 2];
} kvs_block_q5_K;

/* Q6_K: 16 sub-blocks of 16 with int8 scales: x = (d * scales[s]) * (q - 32), q in 0..63. In
 * half h (128 elements; ql + 64 h, qh + 32 h, l < 32): element 128 h + l is the low nibble of
 * ql[l] with bits 0..1 of qh[l] on top; + 32: low nibble of ql[l + 32], bits 2..3; + 64: high
 * nibble of ql[l], bits 4..5; + 96: high nibble of ql[l + 32], bits 6..7. */
typedef struct {
    uint8_t ql[KVS_QK_K / 2];
    uint8_t qh[KVS_QK_K / 4];
    int8_t scales[KVS_QK_K / 16];
    uint16_t d;
} kvs_block_q6_K;

/* 1 for a type kvslim supports, 0 otherwise (any uint32 may be passed). */
int kvs_dtype_valid(uint32_t t);
const char *kvs_dtype_name(kvs_dtype t);
/* Parses "f32", "f16", "bf16", "q8_0", "q4_0" (case-insensitive): the row types kvslim can
 * write (kvs_quantize_row) in blocks of at most 32, which the command line offers. The types it
 * only reads (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL) are refused, and so are the K-quants it
 * writes as weights only (Q4_K, Q5_K, Q6_K: see model/llama_write.h's kvs_wtype_parse).
 * Returns 0 on success. */
int kvs_dtype_parse(const char *name, kvs_dtype *out);
size_t kvs_dtype_block_elems(kvs_dtype t);
size_t kvs_dtype_block_bytes(kvs_dtype t);
/* 1 for the K-quants (Q2_K .. Q6_K: rows in super-blocks of 256), else 0. */
int kvs_dtype_is_kquant(kvs_dtype t);
/* Bytes for n elements. Returns 0 on success, -1 if n is not a whole number of blocks or the
 * result would overflow. */
int kvs_dtype_bytes(kvs_dtype t, uint64_t n, uint64_t *out);

#endif
