/* Fuzzes the GGUF reader on a whole file (kvs_gguf_open_mem and every getter) and the llama
 * loader on the same bytes (kvs_llama_from_gguf, the rest of kvs_model_load: its checks on
 * metadata and tensors, and the tokenizer it builds). Errors are expected; a crash, a leak or a
 * hang is a bug. */
#include <stdint.h>
#include <stdlib.h>

#include "gguf/gguf.h"
#include "kvslim.h"
#include "model/llama.h"

/* Reads everything the reader exposes, so a bad offset or length found at open that the open
 * did not reject shows up here as an out-of-bounds read. */
static void walk(const kvs_gguf *g)
{
    kvs_error err = {0};
    volatile uint64_t sink = kvs_gguf_version(g) + kvs_gguf_alignment(g) + kvs_gguf_data_offset(g);
    uint64_t nk = kvs_gguf_n_keys(g);
    for (uint64_t i = 0; i < nk; i++) {
        const char *key = kvs_gguf_key_at(g, i);
        if (!key)
            continue;
        sink += (uint64_t)kvs_gguf_find_key(g, key);
        kvs_gguf_type t = kvs_gguf_key_type(g, i);
        if (t == KVS_GGUF_STRING) {
            kvs_gguf_str s;
            if (kvs_gguf_get_str(g, key, &s, &err) == KVS_OK && s.len)
                sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.len - 1];
        } else if (t == KVS_GGUF_ARRAY) {
            kvs_gguf_type et;
            uint64_t n;
            if (kvs_gguf_get_arr(g, key, &et, &n, &err) != KVS_OK || n == 0)
                continue;
            if (et == KVS_GGUF_STRING) {
                kvs_gguf_str s;
                /* The first and last elements: the ends of the array's extent. */
                if (kvs_gguf_arr_str(g, key, 0, &s, &err) == KVS_OK && s.len)
                    sink += (uint8_t)s.data[0];
                if (kvs_gguf_arr_str(g, key, n - 1, &s, &err) == KVS_OK && s.len)
                    sink += (uint8_t)s.data[s.len - 1];
            } else {
                const uint8_t *p = kvs_gguf_arr_data(g, key);
                uint64_t es = kvs_gguf_scalar_size(et);
                if (p && es)
                    sink += p[0] + p[n * es - 1];
            }
        } else {
            uint64_t u;
            int64_t s64;
            double d;
            if (kvs_gguf_get_u64(g, key, &u, &err) == KVS_OK)
                sink += u;
            if (kvs_gguf_get_i64(g, key, &s64, &err) == KVS_OK)
                sink += (uint64_t)s64;
            if (kvs_gguf_get_f64(g, key, &d, &err) == KVS_OK)
                sink += (uint64_t)(d == d);
        }
    }
    uint64_t nt = kvs_gguf_n_tensors(g);
    for (uint64_t i = 0; i < nt; i++) {
        const kvs_gguf_tensor *t = kvs_gguf_tensor_at(g, i);
        if (!t)
            continue;
        sink += (uint64_t)(kvs_gguf_find_tensor(g, t->name) != NULL);
        if (t->n_bytes) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->n_bytes - 1];
        }
    }
    (void)sink;
}

/* The input is parsed in place (kvs_gguf_open_mem): the file route's write, mmap and unmap
 * cost ten times the parse itself, and the parse is the same code (kvs_gguf_open only adds
 * open, fstat and mmap, which test_gguf covers). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvs_error err = {0};
    kvs_gguf *g = NULL;
    if (kvs_gguf_open_mem("fuzz-input", data, size, &g, &err) != KVS_OK)
        return 0;
    walk(g);
    kvs_model *m = NULL;
    /* kvs_model_load's route after the open: it takes g, and frees it on failure. */
    if (kvs_llama_from_gguf(g, "fuzz-input", &m, &err) == KVS_OK) {
        /* A loaded model's tokenizer came from the fuzzed metadata: use it once. */
        int32_t *ids = NULL;
        int n = 0;
        if (kvs_tokenize_special(m, "Once upon a <s> time", 1, 1, &ids, &n, &err) == KVS_OK)
            for (int i = 0; i < n; i++)
                (void)kvs_token_text(m, i ? ids[i - 1] : -1, ids[i], NULL);
        free(ids);
        kvs_model_free(m);
    }
    return 0;
}
