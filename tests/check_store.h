/* The store's position invariant, as tests check it after every hook (kv_store.h). */
#ifndef KVS_CHECK_STORE_H
#define KVS_CHECK_STORE_H

#include <stdint.h>
#include <stdlib.h>

#include "kv/kv_store.h"

static inline int check_store_cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Whether a head's positions are distinct and, when the store says the head is in position
 * order (kvs_store_ordered), increasing along the slots; a policy that evicts with
 * kvs_store_remove_unordered leaves them in any order. Returns -1 if so, else the first slot at
 * fault in the head (of its sorted positions, for a repeat). */
static inline int check_store_positions(const kvs_store *st, int layer, int head)
{
    const int n = kvs_store_count(st, layer, head);
    const int32_t *pos = kvs_store_pos(st, layer, head);
    if (kvs_store_ordered(st, layer, head)) {
        for (int i = 1; i < n; i++)
            if (pos[i] <= pos[i - 1])
                return i;
        return -1;
    }
    int32_t *sorted = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!sorted)
        abort();
    for (int i = 0; i < n; i++)
        sorted[i] = pos[i];
    qsort(sorted, (size_t)n, sizeof *sorted, check_store_cmp_i32);
    int bad = -1;
    for (int i = 1; i < n && bad < 0; i++)
        if (sorted[i] == sorted[i - 1])
            bad = i;
    free(sorted);
    return bad;
}

#endif
