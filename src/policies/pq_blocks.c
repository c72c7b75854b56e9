/* The block cache's slot map and eviction order (pq_blocks.h). */
#include <stdint.h>
#include <stdlib.h>

#include "policies/pq_blocks.h"

struct kvs_blocks {
    int capacity, lru, resident;
    int *block;     /* per slot: the block it holds, -1 free */
    long *freq;     /* per slot: inserts since the block entered */
    uint64_t *tick; /* per slot: the insert counter at the block's last insert */
    uint64_t now;
    int *slot_of;   /* per block id below map_len: its slot, -1 */
    int map_len;
};

kvs_blocks *kvs_blocks_new(int capacity, int lru)
{
    kvs_blocks *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->capacity = capacity > 0 ? capacity : 0;
    b->lru = lru;
    const size_t n = (size_t)b->capacity + 1;
    b->block = malloc(sizeof(int) * n);
    b->freq = calloc(n, sizeof(long));
    b->tick = calloc(n, sizeof(uint64_t));
    if (!b->block || !b->freq || !b->tick) {
        kvs_blocks_free(b);
        return NULL;
    }
    for (int i = 0; i < b->capacity; i++)
        b->block[i] = -1;
    return b;
}

void kvs_blocks_free(kvs_blocks *b)
{
    if (!b)
        return;
    free(b->block);
    free(b->freq);
    free(b->tick);
    free(b->slot_of);
    free(b);
}

int kvs_blocks_lookup(const kvs_blocks *b, int block)
{
    return block >= 0 && block < b->map_len ? b->slot_of[block] : -1;
}

int kvs_blocks_resident(const kvs_blocks *b) { return b ? b->resident : 0; }

static int grow_map(kvs_blocks *b, int block)
{
    if (block < b->map_len)
        return 0;
    const int len = block + block / 2 + 16;
    int *m = realloc(b->slot_of, sizeof(int) * (size_t)len);
    if (!m)
        return -1;
    for (int i = b->map_len; i < len; i++)
        m[i] = -1;
    b->slot_of = m;
    b->map_len = len;
    return 0;
}

/* The slot to fill: a free one, else the victim (least frequent then least recent, or least
 * recent; lower slot on a tie, which a distinct tick per insert rules out anyway). */
static int victim(const kvs_blocks *b)
{
    int v = -1;
    for (int i = 0; i < b->capacity; i++) {
        if (b->block[i] < 0)
            return i;
        if (v < 0)
            v = i;
        else if (b->lru ? b->tick[i] < b->tick[v]
                        : b->freq[i] < b->freq[v] ||
                              (b->freq[i] == b->freq[v] && b->tick[i] < b->tick[v]))
            v = i;
    }
    return v;
}

int kvs_blocks_insert(kvs_blocks *b, int block, int *fresh, int *evicted)
{
    *fresh = 0;
    *evicted = -1;
    if (b->capacity == 0 || block < 0 || grow_map(b, block) != 0)
        return -1;
    b->now++;
    int s = b->slot_of[block];
    if (s >= 0) {
        b->freq[s]++;
        b->tick[s] = b->now;
        return s;
    }
    s = victim(b);
    if (b->block[s] >= 0) {
        *evicted = b->block[s];
        b->slot_of[b->block[s]] = -1;
    } else {
        b->resident++;
    }
    b->block[s] = block;
    b->slot_of[block] = s;
    b->freq[s] = 1;
    b->tick[s] = b->now;
    *fresh = 1;
    return s;
}

/* Sort order of kvs_blocks_rank (qsort_r over block ids, the counts as context): more
 * counted first, then the lower id. */
static int cmp_rank(const void *pa, const void *pb, void *ctx)
{
    const int *count = ctx, a = *(const int *)pa, b = *(const int *)pb;
    if (count[a] != count[b])
        return count[a] > count[b] ? -1 : 1;
    return (a > b) - (a < b);
}

int kvs_blocks_rank(const int *count, int n, int k, int *rank, int *scratch)
{
    int got = 0;
    for (int i = 0; i < n; i++)
        if (count[i] > 0)
            scratch[got++] = i;
    if (k <= 0 || got == 0)
        return 0;
    qsort_r(scratch, (size_t)got, sizeof(int), cmp_rank, (void *)count);
    const int take = got < k ? got : k;
    for (int i = 0; i < take; i++)
        rank[i] = scratch[i];
    return take;
}
