/* Head blocks of at least 2 MiB on their own mapping, aligned to 2 MiB and advised
 * MADV_HUGEPAGE before the first touch, so that decode attention's stream over a long head
 * crosses a TLB entry per 2 MiB instead of per 4 KiB. On the AMD EPYC (Zen 4) VM this was
 * measured on, one thread's attention kernels over 144 heads of 2048 slots read 14.3 GB/s with
 * one malloc'd block per head and 21.2 GB/s from one huge-page block (bench_attn_pages), and
 * bench/tools/membw read 31-35 GB/s with two threads on 4 KiB pages against 55-56 on huge
 * pages. The mapping is only as long as the block (rounded to 4 KiB): the 2 MiB ranges it
 * covers whole become huge pages, the rest stays on 4 KiB pages, so nothing is held beyond
 * the block. Where the kernel refuses huge pages the block is an ordinary mapping. */
#include "kv/kv_block.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

void *kvs_kv_block_alloc(size_t bytes, size_t *mapped)
{
    *mapped = 0;
    if (bytes < KVS_KV_HUGE_BYTES)
        return aligned_alloc(64, bytes);
    const size_t len = (bytes + 4095) & ~(size_t)4095, span = len + KVS_KV_HUGE_BYTES;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* keep [p, p + len) with p on a 2 MiB boundary; give back what is around it */
    char *p = (char *)(((uintptr_t)raw + KVS_KV_HUGE_BYTES - 1) & ~(uintptr_t)(KVS_KV_HUGE_BYTES - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len)
        munmap(p + len, (size_t)(raw + span - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advisory: a refusal only leaves 4 KiB pages */
#endif
    *mapped = len;
    return p;
}

void kvs_kv_block_free(void *block, size_t mapped)
{
    if (mapped)
        munmap(block, mapped);
    else
        free(block);
}
