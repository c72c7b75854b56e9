/* Decode attention's read rate by the memory layout of the KV slots.
 *
 *   bench_attn_pages [slots] [rounds]        (defaults: 2048 slots per head, 8 rounds)
 *
 * One thread runs the decode attention kernels (kvs_dot_rows_f16, kvs_softmax,
 * kvs_weighted_rows_f16) over 144 heads (12 layers x 12 KV heads of the 85.7M model, head size
 * 64) of `slots` F16 keys and values, laid out three ways, alternating round by round:
 *   heads     one 64-byte aligned allocation per head's keys and per head's values (as the KV
 *             store allocates its heads' blocks; glibc maps the large ones on 4 KiB pages)
 *   block-4k  all of them back to back in one block on 4 KiB pages (MADV_NOHUGEPAGE)
 *   block-2m  the same block on transparent huge pages (MADV_HUGEPAGE)
 * and prints GB/s of keys and values read per round, the best and median of each layout, and
 * the huge pages the process held (AnonHugePages). It measures a question for the KV store,
 * not the store itself. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/kernels.h"

enum { HEADS = 144, HD = 64, LAYOUTS = 3, MAX_ROUNDS = 100 };

static const char *const layout_name[LAYOUTS] = {"heads", "block-4k", "block-2m"};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* kB of AnonHugePages the process holds, or -1. */
static long huge_kb(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f)
        return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* A block of bytes (a multiple of 2 MiB) on 2 MiB boundaries, with the given THP advice. */
static char *block(size_t bytes, int advice)
{
    char *p = aligned_alloc((size_t)2 << 20, bytes);
    if (p)
        madvise(p, bytes, advice); /* a refusal only changes what is measured: reported below */
    return p;
}

int main(int argc, char **argv)
{
    const int slots = argc > 1 ? atoi(argv[1]) : 2048, rounds = argc > 2 ? atoi(argv[2]) : 8;
    if (slots < 1 || slots > (1 << 20) || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: bench_attn_pages [slots 1..1048576] [rounds 1..%d]\n", MAX_ROUNDS);
        return 2;
    }
    const size_t head_bytes = (size_t)slots * HD * sizeof(uint16_t);
    const size_t total = ((2 * head_bytes * HEADS) + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    uint16_t *keys[LAYOUTS][HEADS], *values[LAYOUTS][HEADS];
    char *blocks[2] = {block(total, MADV_NOHUGEPAGE), block(total, MADV_HUGEPAGE)};
    float *scores = malloc(sizeof(float) * (size_t)slots);
    if (!blocks[0] || !blocks[1] || !scores) {
        fprintf(stderr, "bench_attn_pages: out of memory for %zu MiB\n", 3 * total >> 20);
        return 1;
    }
    uint32_t seed = 1;
    for (int h = 0; h < HEADS; h++) {
        keys[0][h] = aligned_alloc(64, head_bytes);
        values[0][h] = aligned_alloc(64, head_bytes);
        if (!keys[0][h] || !values[0][h]) {
            fprintf(stderr, "bench_attn_pages: out of memory\n");
            return 1;
        }
        for (int l = 1; l < LAYOUTS; l++) {
            keys[l][h] = (uint16_t *)(blocks[l - 1] + 2 * head_bytes * h);
            values[l][h] = (uint16_t *)(blocks[l - 1] + 2 * head_bytes * h + head_bytes);
        }
        for (size_t i = 0; i < head_bytes / 2; i++) {
            seed = seed * 1103515245u + 12345u;
            const uint16_t x = (uint16_t)(0x3000 + (seed >> 16 & 0x3ff)); /* fp16 in [0.125, 0.25) */
            for (int l = 0; l < LAYOUTS; l++)
                keys[l][h][i] = values[l][h][i] = x;
        }
    }
    float q[HD], out[HD], sink = 0.0f;
    for (int d = 0; d < HD; d++)
        q[d] = 0.01f * (float)d;
    static double gbs[LAYOUTS][MAX_ROUNDS];
    printf("round");
    for (int l = 0; l < LAYOUTS; l++)
        printf(" %10s", layout_name[l]);
    printf("   GB/s of keys and values, %d heads x %d slots, 1 thread\n", HEADS, slots);
    for (int r = 0; r < rounds; r++) {
        printf("%5d", r + 1);
        for (int k = 0; k < LAYOUTS; k++) {
            const int l = (k + r) % LAYOUTS; /* each layout first in turn */
            const double t0 = now();
            for (int h = 0; h < HEADS; h++) {
                kvs_dot_rows_f16(scores, keys[l][h], NULL, slots, HD, q, 0.125f);
                kvs_softmax(scores, slots);
                kvs_weighted_rows_f16(out, scores, values[l][h], NULL, slots, HD);
                sink += out[0];
            }
            gbs[l][r] = 2.0 * (double)head_bytes * HEADS / (now() - t0) / 1e9;
        }
        for (int l = 0; l < LAYOUTS; l++)
            printf(" %10.1f", gbs[l][r]);
        printf("\n");
    }
    for (int l = 0; l < LAYOUTS; l++) {
        qsort(gbs[l], (size_t)rounds, sizeof(double), cmp_double);
        printf("%-9s best %5.1f  median %5.1f GB/s\n", layout_name[l], gbs[l][rounds - 1],
               gbs[l][(rounds - 1) / 2]);
    }
    /* the outputs' checksum keeps the kernels' work observable */
    printf("AnonHugePages held: %ld kB (block-2m is %zu kB); checksum %g\n", huge_kb(),
           total >> 10, (double)sink);
    for (int h = 0; h < HEADS; h++) {
        free(keys[0][h]);
        free(values[0][h]);
    }
    free(blocks[0]);
    free(blocks[1]);
    free(scores);
    return 0;
}
