/* PQCache's block cache bookkeeping (pqcache.md §7 test 18, §6 items 15-17): against a model
 * kept here as a plain list, over long random sequences of inserts for LFU and LRU and several
 * capacities: the capacity is never exceeded, the evicted block is the least frequent (then
 * least recently inserted) or the least recently inserted, lookups agree with the model, and
 * the slot map is a bijection between resident blocks and occupied slots. Also the ranking of
 * blocks by selected tokens. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "policies/pq_blocks.h"

enum { MAX_CAP = 16, N_BLOCKS = 40, OPS = 4000 };

/* The model: resident blocks with their insert count and the step of their last insert. */
typedef struct model {
    int n, block[MAX_CAP];
    long freq[MAX_CAP], last[MAX_CAP];
} model;

static int model_find(const model *m, int block)
{
    for (int i = 0; i < m->n; i++)
        if (m->block[i] == block)
            return i;
    return -1;
}

/* Inserts like the spec says; returns the evicted block or -1. */
static int model_insert(model *m, int cap, int lru, int block, long step)
{
    int i = model_find(m, block);
    if (i >= 0) {
        m->freq[i]++;
        m->last[i] = step;
        return -1;
    }
    int evicted = -1;
    if (m->n == cap) {
        int v = 0;
        for (int j = 1; j < m->n; j++) {
            const int older = m->last[j] < m->last[v];
            if (lru ? older : (m->freq[j] < m->freq[v] || (m->freq[j] == m->freq[v] && older)))
                v = j;
        }
        evicted = m->block[v];
        m->block[v] = m->block[m->n - 1];
        m->freq[v] = m->freq[m->n - 1];
        m->last[v] = m->last[m->n - 1];
        m->n--;
    }
    m->block[m->n] = block;
    m->freq[m->n] = 1;
    m->last[m->n] = step;
    m->n++;
    return evicted;
}

static void sequence(int cap, int lru, uint64_t seed)
{
    kvs_blocks *b = kvs_blocks_new(cap, lru);
    CHECK(b != NULL);
    if (!b)
        return;
    model m = {0};
    kvs_random_stream rs = {seed, 0};
    long bad_evict = 0, bad_lookup = 0, bad_map = 0, bad_fresh = 0;
    for (long step = 1; step <= OPS; step++) {
        /* a skewed choice, so that frequencies differ: half the inserts hit 8 hot blocks */
        const int block = kvs_random_below(&rs, 2) ? (int)kvs_random_below(&rs, 8)
                                                   : (int)kvs_random_below(&rs, N_BLOCKS);
        const int was = model_find(&m, block) >= 0;
        const int want_evicted = model_insert(&m, cap, lru, block, step);
        int fresh = -1, evicted = -2;
        const int slot = kvs_blocks_insert(b, block, &fresh, &evicted);
        bad_evict += evicted != want_evicted;
        bad_fresh += fresh != !was || slot < 0 || slot >= cap;
        CHECK(kvs_blocks_resident(b) <= cap);
        /* lookups agree with the model; resident blocks occupy distinct slots */
        int used[MAX_CAP] = {0};
        for (int q = 0; q < N_BLOCKS; q++) {
            const int s = kvs_blocks_lookup(b, q);
            bad_lookup += (s >= 0) != (model_find(&m, q) >= 0);
            if (s >= 0)
                bad_map += s >= cap || used[s]++;
        }
        bad_map += kvs_blocks_resident(b) != m.n;
    }
    CHECKF(bad_evict == 0, "capacity %d, %s: %ld evictions differ from the model", cap,
           lru ? "lru" : "lfu", bad_evict);
    CHECKF(bad_lookup == 0 && bad_map == 0 && bad_fresh == 0,
           "capacity %d, %s: lookups %ld, map %ld, fresh/slot %ld wrong", cap, lru ? "lru" : "lfu",
           bad_lookup, bad_map, bad_fresh);
    CHECK(kvs_blocks_lookup(b, -1) == -1 && kvs_blocks_lookup(b, 1 << 20) == -1);
    kvs_blocks_free(b);
}

/* A hand-checked LFU case: the block inserted most often survives; among equals, the oldest
 * goes. */
static void lfu_by_hand(void)
{
    kvs_blocks *b = kvs_blocks_new(2, 0);
    int fresh, ev;
    kvs_blocks_insert(b, 5, &fresh, &ev);
    kvs_blocks_insert(b, 5, &fresh, &ev);
    CHECK(!fresh && ev == -1);
    kvs_blocks_insert(b, 7, &fresh, &ev);
    CHECK(fresh && ev == -1);
    kvs_blocks_insert(b, 9, &fresh, &ev); /* 7 has one insert, 5 two */
    CHECK(fresh && ev == 7);
    kvs_blocks_insert(b, 11, &fresh, &ev); /* 9 (1) goes before 5 (2) */
    CHECK(ev == 9 && kvs_blocks_lookup(b, 5) >= 0 && kvs_blocks_lookup(b, 9) == -1);
    kvs_blocks_free(b);
    b = kvs_blocks_new(2, 1); /* LRU: frequency does not matter */
    kvs_blocks_insert(b, 5, &fresh, &ev);
    kvs_blocks_insert(b, 5, &fresh, &ev);
    kvs_blocks_insert(b, 7, &fresh, &ev);
    kvs_blocks_insert(b, 9, &fresh, &ev);
    CHECK(ev == 5);
    kvs_blocks_free(b);
}

/* Capacity 0 caches nothing. */
static void empty_cache(void)
{
    kvs_blocks *b = kvs_blocks_new(0, 0);
    CHECK(b != NULL);
    int fresh = 1, ev = 0;
    CHECK(kvs_blocks_insert(b, 3, &fresh, &ev) == -1 && !fresh && ev == -1);
    CHECK(kvs_blocks_lookup(b, 3) == -1 && kvs_blocks_resident(b) == 0);
    kvs_blocks_free(b);
    kvs_blocks_free(NULL);
}

/* Ranking: counted blocks only, most first, lower id on ties, at most k. */
static void ranking(void)
{
    const int count[8] = {0, 3, 1, 3, 0, 5, 1, 0};
    int rank[8], scratch[8];
    int n = kvs_blocks_rank(count, 8, 4, rank, scratch);
    CHECK(n == 4 && rank[0] == 5 && rank[1] == 1 && rank[2] == 3 && rank[3] == 2);
    n = kvs_blocks_rank(count, 8, 32, rank, scratch);
    CHECK(n == 5 && rank[4] == 6);
    CHECK(kvs_blocks_rank(count, 8, 0, rank, scratch) == 0);
    const int none[3] = {0, 0, 0};
    CHECK(kvs_blocks_rank(none, 3, 2, rank, scratch) == 0);
}

int main(void)
{
    const int caps[] = {1, 2, 5, 16};
    for (int c = 0; c < 4; c++)
        for (int lru = 0; lru <= 1; lru++)
            for (uint64_t seed = 1; seed <= 3; seed++)
                sequence(caps[c], lru, seed * 77 + (uint64_t)c);
    lfu_by_hand();
    empty_cache();
    ranking();
    return check_summary("pq_blocks");
}
