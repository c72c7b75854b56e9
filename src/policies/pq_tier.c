/* The slow tier: anonymous memory or an unlinked file, by region and offset (pq_tier.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/debug.h"
#include "policies/pq_tier.h"

struct kvs_tier {
    int fd;             /* the file, or -1 */
    char *mem;          /* the anonymous region, or NULL */
    size_t mem_len;
    int n_regions;
    size_t region_bytes;
    size_t *high;       /* per region: bytes up to the highest write */
    double read, written;
    char path[4096];
};

kvs_status kvs_tier_open(const char *path, int n_regions, size_t region_bytes, kvs_tier **out,
                         kvs_error *err)
{
    *out = NULL;
    if (n_regions <= 0 || region_bytes == 0 || region_bytes > SIZE_MAX / (size_t)n_regions)
        return kvs_fail(err, KVS_ERR_ARG, "slow tier of %d regions of %zu bytes", n_regions,
                        region_bytes);
    if (path && strlen(path) >= sizeof((kvs_tier *)0)->path)
        return kvs_fail(err, KVS_ERR_ARG, "the path is too long");
    struct stat sb;
    if (path && stat(path, &sb) == 0)
        return kvs_fail(err, KVS_ERR_ARG, "%s already exists%s; the slow tier must be a new "
                        "file (it is removed when the run ends)", path,
                        S_ISDIR(sb.st_mode) ? " and is a directory" : "");
    kvs_tier *t = calloc(1, sizeof *t);
    if (!t || !(t->high = calloc((size_t)n_regions, sizeof(size_t)))) {
        free(t);
        return kvs_fail(err, KVS_ERR_NOMEM, "out of memory for the slow tier");
    }
    t->fd = -1;
    t->n_regions = n_regions;
    t->region_bytes = region_bytes;
    if (!path) {
        t->mem_len = (size_t)n_regions * region_bytes;
        void *m = mmap(NULL, t->mem_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            kvs_tier_close(t);
            return kvs_fail(err, KVS_ERR_NOMEM, "cannot reserve %.1f MiB of memory for the "
                            "slow tier (%s); give it a file with tier=PATH",
                            (double)n_regions * (double)region_bytes / 1048576.0, strerror(e));
        }
        t->mem = m;
        *out = t;
        return KVS_OK;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (t->fd < 0) {
        const int e = errno;
        kvs_tier_close(t);
        return kvs_fail(err, e == ENOENT || e == ENOTDIR || e == EISDIR || e == EEXIST
                                 ? KVS_ERR_ARG : KVS_ERR_IO,
                        "cannot create %s: %s", path, strerror(e));
    }
    /* Removed at once: the space lives as long as the descriptor, so no exit path, crash
     * included, leaves the file behind. */
    if (unlink(path) != 0) {
        const int e = errno;
        kvs_tier_close(t);
        return kvs_fail(err, KVS_ERR_IO, "cannot unlink %s after creating it: %s", path,
                        strerror(e));
    }
    *out = t;
    return KVS_OK;
}

void kvs_tier_close(kvs_tier *t)
{
    if (!t)
        return;
    if (t->fd >= 0)
        close(t->fd);
    if (t->mem)
        munmap(t->mem, t->mem_len);
    free(t->high);
    free(t);
}

static size_t at(const kvs_tier *t, int region, size_t off)
{
    return (size_t)region * t->region_bytes + off;
}

/* n bytes between buf and the file at off, all of them: pwrite or pread, retried on EINTR
 * and short transfers. A failure names the tier as tier=PATH. */
static kvs_status file_io(kvs_tier *t, int write, size_t off, void *buf, size_t n,
                          kvs_error *err)
{
    for (size_t done = 0; done < n;) {
        const ssize_t r = write ? pwrite(t->fd, (char *)buf + done, n - done, (off_t)(off + done))
                                : pread(t->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return kvs_fail(err, KVS_ERR_IO, "tier=%s: %s %zu bytes of the slow tier failed: %s",
                            t->path, write ? "writing" : "reading", n - done,
                            r < 0 ? strerror(errno)
                                  : write ? "no progress" : "unexpected end of file");
        done += (size_t)r;
    }
    return KVS_OK;
}

kvs_status kvs_tier_write(kvs_tier *t, int region, size_t off, const void *src, size_t n,
                          kvs_error *err)
{
    KVS_ASSERT(region >= 0 && region < t->n_regions && off + n <= t->region_bytes);
    if (t->mem) {
        memcpy(t->mem + at(t, region, off), src, n);
    } else {
        kvs_status st = file_io(t, 1, at(t, region, off), (void *)src, n, err);
        if (st != KVS_OK)
            return st;
    }
    if (off + n > t->high[region])
        t->high[region] = off + n;
    t->written += (double)n;
    return KVS_OK;
}

kvs_status kvs_tier_read(kvs_tier *t, int region, size_t off, void *dst, size_t n,
                         kvs_error *err)
{
    KVS_ASSERT(region >= 0 && region < t->n_regions && off + n <= t->high[region]);
    if (t->mem) {
        memcpy(dst, t->mem + at(t, region, off), n);
    } else {
        kvs_status st = file_io(t, 0, at(t, region, off), dst, n, err);
        if (st != KVS_OK)
            return st;
    }
    t->read += (double)n;
    return KVS_OK;
}

const void *kvs_tier_peek(const kvs_tier *t, int region, size_t off, size_t n)
{
    KVS_ASSERT(region >= 0 && region < t->n_regions && off + n <= t->high[region]);
    (void)n;
    return t->mem ? t->mem + at(t, region, off) : NULL;
}

int kvs_tier_is_file(const kvs_tier *t) { return t && t->fd >= 0; }

size_t kvs_tier_bytes(const kvs_tier *t)
{
    size_t b = 0;
    for (int r = 0; t && r < t->n_regions; r++)
        b += t->high[r];
    return b;
}

double kvs_tier_bytes_read(const kvs_tier *t) { return t ? t->read : 0; }
double kvs_tier_bytes_written(const kvs_tier *t) { return t ? t->written : 0; }
