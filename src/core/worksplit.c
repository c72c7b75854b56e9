/* kvs_split: contiguous shares claimed from the front by their owners, from the back by others. */
#include "core/worksplit.h"

static uint64_t pack(uint32_t front, uint32_t back) { return (uint64_t)back << 32 | front; }

void kvs_split_init(kvs_split *s, int units, int nth, int grain)
{
    s->n_shares = nth < 1 ? 1 : nth < KVS_SPLIT_SHARES ? nth : KVS_SPLIT_SHARES;
    s->grain = grain > 0 ? grain : 1;
    for (int i = 0; i < s->n_shares; i++)
        atomic_init(&s->share[i].range,
                    pack((uint32_t)((int64_t)units * i / s->n_shares),
                         (uint32_t)((int64_t)units * (i + 1) / s->n_shares)));
}

int kvs_split_grain(int units, int nth, size_t unit_bytes)
{
    if (nth <= 1) /* nobody to balance with: one claim, not one atomic exchange per grain */
        return units > 0 ? units : 1;
    const size_t g = unit_bytes ? ((size_t)32 << 10) / unit_bytes
                                : (size_t)units / (4 * (size_t)(nth > 0 ? nth : 1));
    return g > 0 ? (g < (size_t)units ? (int)g : units) : 1;
}

int kvs_split_by_rows(int col_units, int n_rows, int nth)
{
    return col_units < 2 * nth && n_rows >= 2 * nth;
}

/* Takes up to grain units from the front (own = 1) or the back of share i. */
static int claim(kvs_split *s, int i, int own, int *u0, int *u1)
{
    uint64_t cur = atomic_load_explicit(&s->share[i].range, memory_order_relaxed);
    for (;;) {
        const uint32_t front = (uint32_t)cur, back = (uint32_t)(cur >> 32);
        if (front >= back)
            return 0;
        const uint32_t n = back - front < (uint32_t)s->grain ? back - front : (uint32_t)s->grain;
        const uint64_t next = own ? pack(front + n, back) : pack(front, back - n);
        if (atomic_compare_exchange_weak_explicit(&s->share[i].range, &cur, next,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *u0 = (int)(own ? front : back - n);
            *u1 = (int)(own ? front + n : back);
            return 1;
        }
    }
}

int kvs_split_next(kvs_split *s, int ith, int *u0, int *u1)
{
    const int own = ith % s->n_shares;
    for (int k = 0; k < s->n_shares; k++)
        if (claim(s, (own + k) % s->n_shares, k == 0, u0, u1))
            return 1;
    return 0;
}
