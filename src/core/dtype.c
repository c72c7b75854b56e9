#include "dtype.h"

#include <strings.h>

static const struct {
    kvs_dtype type;
    const char *name;
    size_t block_elems;
    size_t block_bytes;
    /* kvs_dtype_parse knows the name: the types of 32-element blocks or less that
     * kvs_quantize_row writes, offered wherever a row type is chosen (also the KV cache's).
     * The K-quants it writes too (Q4_K, Q5_K, Q6_K) are offered only as weight types, through
     * model/llama_write.h's kvs_wtype_parse: a row of 256-element blocks fits weights only. */
    int writable;
} dtype_table[] = {
    {KVS_F32, "f32", 1, 4, 1},
    {KVS_F16, "f16", 1, 2, 1},
    {KVS_BF16, "bf16", 1, 2, 1},
    {KVS_Q8_0, "q8_0", KVS_QK, sizeof(kvs_block_q8_0), 1},
    {KVS_Q4_0, "q4_0", KVS_QK, sizeof(kvs_block_q4_0), 1},
    /* read only: dequantised by dequant.h */
    {KVS_Q4_1, "q4_1", KVS_QK, sizeof(kvs_block_q4_1), 0},
    {KVS_Q5_0, "q5_0", KVS_QK, sizeof(kvs_block_q5_0), 0},
    {KVS_Q5_1, "q5_1", KVS_QK, sizeof(kvs_block_q5_1), 0},
    {KVS_Q2_K, "q2_K", KVS_QK_K, sizeof(kvs_block_q2_K), 0},
    {KVS_Q3_K, "q3_K", KVS_QK_K, sizeof(kvs_block_q3_K), 0},
    {KVS_Q4_K, "q4_K", KVS_QK_K, sizeof(kvs_block_q4_K), 0},
    {KVS_Q5_K, "q5_K", KVS_QK_K, sizeof(kvs_block_q5_K), 0},
    {KVS_Q6_K, "q6_K", KVS_QK_K, sizeof(kvs_block_q6_K), 0},
    {KVS_IQ4_NL, "iq4_nl", KVS_QK, sizeof(kvs_block_iq4_nl), 0},
};
#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

_Static_assert(sizeof(kvs_block_q8_0) == 34, "Q8_0 block layout");
_Static_assert(sizeof(kvs_block_q4_0) == 18, "Q4_0 block layout");
/* GGML's block sizes (ggml-common.h's static_asserts give the same numbers). */
_Static_assert(sizeof(kvs_block_q4_1) == 20, "Q4_1 block layout");
_Static_assert(sizeof(kvs_block_q5_0) == 22, "Q5_0 block layout");
_Static_assert(sizeof(kvs_block_q5_1) == 24, "Q5_1 block layout");
_Static_assert(sizeof(kvs_block_iq4_nl) == 18, "IQ4_NL block layout");
_Static_assert(sizeof(kvs_block_q2_K) == 84, "Q2_K block layout");
_Static_assert(sizeof(kvs_block_q3_K) == 110, "Q3_K block layout");
_Static_assert(sizeof(kvs_block_q4_K) == 144, "Q4_K block layout");
_Static_assert(sizeof(kvs_block_q5_K) == 176, "Q5_K block layout");
_Static_assert(sizeof(kvs_block_q6_K) == 210, "Q6_K block layout");

const int8_t kvs_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

static int dtype_index(uint32_t t)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if ((uint32_t)dtype_table[i].type == t)
            return (int)i;
    return -1;
}

int kvs_dtype_valid(uint32_t t) { return dtype_index(t) >= 0; }

const char *kvs_dtype_name(kvs_dtype t)
{
    int i = dtype_index((uint32_t)t);
    return i < 0 ? "unknown" : dtype_table[i].name;
}

int kvs_dtype_parse(const char *name, kvs_dtype *out)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].writable && strcasecmp(name, dtype_table[i].name) == 0) {
            *out = dtype_table[i].type;
            return 0;
        }
    return -1;
}

size_t kvs_dtype_block_elems(kvs_dtype t)
{
    int i = dtype_index((uint32_t)t);
    return i < 0 ? 0 : dtype_table[i].block_elems;
}

size_t kvs_dtype_block_bytes(kvs_dtype t)
{
    int i = dtype_index((uint32_t)t);
    return i < 0 ? 0 : dtype_table[i].block_bytes;
}

int kvs_dtype_is_kquant(kvs_dtype t)
{
    return t == KVS_Q2_K || t == KVS_Q3_K || t == KVS_Q4_K || t == KVS_Q5_K || t == KVS_Q6_K;
}

int kvs_dtype_bytes(kvs_dtype t, uint64_t n, uint64_t *out)
{
    int i = dtype_index((uint32_t)t);
    if (i < 0)
        return -1;
    uint64_t be = dtype_table[i].block_elems, bb = dtype_table[i].block_bytes;
    if (n % be != 0)
        return -1;
    uint64_t blocks = n / be;
    if (blocks > UINT64_MAX / bb)
        return -1;
    *out = blocks * bb;
    return 0;
}
