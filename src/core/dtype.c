#include "dtype.h"

#include <strings.h>

static const struct {
    kvs_dtype type;
    const char *name;
    size_t block_elems;
    size_t block_bytes;
} dtype_table[] = {
    {KVS_F32, "f32", 1, 4},
    {KVS_F16, "f16", 1, 2},
    {KVS_BF16, "bf16", 1, 2},
    {KVS_Q8_0, "q8_0", KVS_QK, sizeof(kvs_block_q8_0)},
    {KVS_Q4_0, "q4_0", KVS_QK, sizeof(kvs_block_q4_0)},
};
#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

_Static_assert(sizeof(kvs_block_q8_0) == 34, "Q8_0 block layout");
_Static_assert(sizeof(kvs_block_q4_0) == 18, "Q4_0 block layout");

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
        if (strcasecmp(name, dtype_table[i].name) == 0) {
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
