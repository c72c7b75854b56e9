/* The public API's view of a model's GGUF metadata (kvs_model_meta_str). */
#include <limits.h>
#include <string.h>

#include "model/llama.h"

int kvs_model_meta_str(const kvs_model *m, const char *key, char *buf, size_t size)
{
    if (buf && size)
        buf[0] = 0;
    if (!m || !key || !m->gguf)
        return -1;
    int64_t i = kvs_gguf_find_key(m->gguf, key);
    if (i < 0 || kvs_gguf_key_type(m->gguf, (uint64_t)i) != KVS_GGUF_STRING)
        return -1;
    kvs_gguf_str s;
    kvs_error err;
    if (kvs_gguf_get_str(m->gguf, key, &s, &err) != KVS_OK || s.len > INT_MAX)
        return -1;
    if (buf && size) {
        size_t n = s.len < size - 1 ? (size_t)s.len : size - 1;
        memcpy(buf, s.data, n);
        buf[n] = 0;
    }
    return (int)s.len;
}
