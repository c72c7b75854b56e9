/* The KV store's head blocks (kv/kv_block.c): small ones from aligned_alloc, large ones on
 * their own 2 MiB-aligned mapping of exactly their (4 KiB-rounded) size; every byte usable;
 * an impossible size refused with NULL. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "kv/kv_block.h"

/* Writes a pattern over the whole block and reads it back. */
static int fill_and_check(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4093)
        p[i] = (unsigned char)(i * 7);
    p[n - 1] = 0xA5;
    int ok = p[n - 1] == 0xA5;
    for (size_t i = 0; i < n - 1; i += 4093)
        ok &= p[i] == (unsigned char)(i * 7);
    return ok;
}

int main(void)
{
    const size_t sizes[] = {64, 4096, KVS_KV_HUGE_BYTES - 64, KVS_KV_HUGE_BYTES,
                            KVS_KV_HUGE_BYTES + 64, 3 * KVS_KV_HUGE_BYTES + 4160};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t mapped = 12345;
        unsigned char *p = kvs_kv_block_alloc(sizes[k], &mapped);
        CHECKF(p != NULL, "size %zu", sizes[k]);
        if (!p)
            continue;
        CHECKF((uintptr_t)p % 64 == 0, "size %zu: 64-byte aligned", sizes[k]);
        if (sizes[k] < KVS_KV_HUGE_BYTES) {
            CHECKF(mapped == 0, "size %zu: from aligned_alloc", sizes[k]);
        } else {
            CHECKF((uintptr_t)p % KVS_KV_HUGE_BYTES == 0, "size %zu: on a 2 MiB boundary", sizes[k]);
            CHECKF(mapped >= sizes[k] && mapped < sizes[k] + 4096 && mapped % 4096 == 0,
                   "size %zu: mapped %zu", sizes[k], mapped);
        }
        CHECKF(fill_and_check(p, sizes[k]), "size %zu: every byte usable", sizes[k]);
        kvs_kv_block_free(p, mapped);
    }
    size_t mapped = 7;
    CHECK(kvs_kv_block_alloc(SIZE_MAX / 2, &mapped) == NULL);
    CHECK(mapped == 0);
    kvs_kv_block_free(NULL, 0);
    return check_summary("kv_block");
}
