/* PQCache's slow tier (pqcache.md §1.3, §8 item 2): fixed-size regions of append-only records,
 * read back by offset, held either in an anonymous memory region or in a new file read and
 * written with pread/pwrite (no mapping, so a tier larger than the address-space limit still
 * works). The file is created exclusively and unlinked at once: it disappears when the tier is
 * closed or the process ends, however it ends. Not thread-safe: the caller serialises. */
#ifndef KVS_PQ_TIER_H
#define KVS_PQ_TIER_H

#include <stddef.h>

#include "core/error.h"

typedef struct kvs_tier kvs_tier;

/* n_regions regions of region_bytes each. path NULL: anonymous memory (pages are taken only
 * when written); else a new file at path (an existing file, a directory or a missing
 * directory is an error naming the path, and nothing is created or changed). */
kvs_status kvs_tier_open(const char *path, int n_regions, size_t region_bytes, kvs_tier **out,
                         kvs_error *err);
void kvs_tier_close(kvs_tier *t);

/* Writes n bytes at offset off of a region (off + n within the region). A failed file write
 * (disk full, file size limit) is KVS_ERR_IO naming the path as tier=PATH. */
kvs_status kvs_tier_write(kvs_tier *t, int region, size_t off, const void *src, size_t n,
                          kvs_error *err);
/* Reads n bytes at offset off of a region; only bytes written before may be read. */
kvs_status kvs_tier_read(kvs_tier *t, int region, size_t off, void *dst, size_t n,
                         kvs_error *err);

/* A memory tier's bytes [off, off + n) of a region, to read in place (no copy), valid until
 * the next write to that range; NULL for a file tier. Only bytes written before. */
const void *kvs_tier_peek(const kvs_tier *t, int region, size_t off, size_t n);

/* Whether the tier is a file; the bytes it holds (each region up to its highest write). */
int kvs_tier_is_file(const kvs_tier *t);
size_t kvs_tier_bytes(const kvs_tier *t);
/* Bytes read and written since the tier opened. */
double kvs_tier_bytes_read(const kvs_tier *t);
double kvs_tier_bytes_written(const kvs_tier *t);

#endif
