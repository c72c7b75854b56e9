/* PQCache's block cache bookkeeping (pqcache.md §2.9, §6 items 15-17): which blocks of middle
 * tokens sit in which of a fixed number of fast-tier slots, and which block leaves when a new
 * one enters (LFU, or LRU). It holds no K/V itself: the caller keeps one buffer per slot. */
#ifndef KVS_PQ_BLOCKS_H
#define KVS_PQ_BLOCKS_H

typedef struct kvs_blocks kvs_blocks;

/* A cache of capacity slots (0: a cache that holds nothing); lru 0 evicts the least
 * frequently inserted block (then the least recently inserted), 1 the least recently
 * inserted. NULL when out of memory. */
kvs_blocks *kvs_blocks_new(int capacity, int lru);
void kvs_blocks_free(kvs_blocks *b);

/* The slot holding block (>= 0), or -1. Changes nothing: hits are the caller's to count. */
int kvs_blocks_lookup(const kvs_blocks *b, int block);

/* Inserts block (or, resident, bumps its frequency and recency): returns its slot, *fresh 1
 * when the block was not resident (the caller fills the slot), *evicted the block that left
 * the slot or -1. -1 when the capacity is 0 or out of memory (the block is then not cached). */
int kvs_blocks_insert(kvs_blocks *b, int block, int *fresh, int *evicted);

/* Resident blocks (at most the capacity). */
int kvs_blocks_resident(const kvs_blocks *b);

/* The up to k blocks of n with count > 0, most counted first (lower id on ties), into rank;
 * scratch holds n ints. Returns how many. */
int kvs_blocks_rank(const int *count, int n, int k, int *rank, int *scratch);

#endif
