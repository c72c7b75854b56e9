/* PQCache's slow tier (pq_tier.h): memory and file tiers return what was written, region by
 * region, and count it; the file exists under its name only while it is being created (it is
 * unlinked at once) and an existing file, a directory or a missing directory is refused
 * without touching anything; a write the file size limit stops fails with an I/O error naming
 * the tier, not a signal. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "policies/pq_tier.h"

enum { REGIONS = 3, REGION = 4096 };

static void fill(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 5));
}

/* Writes pieces to every region out of order, reads them back, piece by piece and whole. */
static void round_trip(kvs_tier *t, const char *what)
{
    unsigned char w[REGION], r[REGION];
    kvs_error err = {0};
    int ok = 1;
    for (int reg = REGIONS - 1; reg >= 0; reg--) {
        fill(w, REGION, (unsigned)reg + 1);
        for (size_t off = 0; off < REGION; off += 1000) { /* uneven pieces */
            const size_t n = off + 1000 <= REGION ? 1000 : REGION - off;
            ok &= kvs_tier_write(t, reg, off, w + off, n, &err) == KVS_OK;
        }
    }
    for (int reg = 0; reg < REGIONS; reg++) {
        fill(w, REGION, (unsigned)reg + 1);
        memset(r, 0, sizeof r);
        ok &= kvs_tier_read(t, reg, 0, r, REGION, &err) == KVS_OK && !memcmp(r, w, REGION);
        ok &= kvs_tier_read(t, reg, 123, r, 77, &err) == KVS_OK && !memcmp(r, w + 123, 77);
    }
    CHECKF(ok, "%s: round trip: %s", what, err.msg);
    CHECKF(kvs_tier_bytes(t) == (size_t)REGIONS * REGION, "%s: %zu bytes held", what,
           kvs_tier_bytes(t));
    CHECK(kvs_tier_bytes_written(t) == (double)REGIONS * REGION);
    CHECK(kvs_tier_bytes_read(t) == (double)REGIONS * (REGION + 77));
}

static void memory_tier(void)
{
    kvs_tier *t = NULL;
    kvs_error err = {0};
    CHECK(kvs_tier_open(NULL, REGIONS, REGION, &t, &err) == KVS_OK && t);
    if (!t)
        return;
    CHECK(!kvs_tier_is_file(t) && kvs_tier_bytes(t) == 0);
    round_trip(t, "memory");
    /* read in place: the bytes written, where they were written */
    unsigned char w[REGION];
    fill(w, REGION, 2);
    const void *in_place = kvs_tier_peek(t, 1, 100, 200);
    CHECK(in_place && !memcmp(in_place, w + 100, 200));
    kvs_tier_close(t);
    kvs_tier_close(NULL);
    CHECK(kvs_tier_open(NULL, 0, REGION, &t, &err) == KVS_ERR_ARG && t == NULL);
    CHECK(kvs_tier_open(NULL, 2, SIZE_MAX / 2 + 1, &t, &err) == KVS_ERR_ARG);
}

static void file_tier(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/tier.bin", dir);
    kvs_tier *t = NULL;
    kvs_error err = {0};
    CHECKF(kvs_tier_open(path, REGIONS, REGION, &t, &err) == KVS_OK, "%s", err.msg);
    if (!t)
        return;
    struct stat sb;
    CHECKF(stat(path, &sb) != 0 && errno == ENOENT, "%s exists while the tier is open", path);
    CHECK(kvs_tier_is_file(t));
    round_trip(t, "file");
    CHECK(kvs_tier_peek(t, 0, 0, 16) == NULL); /* a file is only read through a copy */
    kvs_tier_close(t);
}

/* Refusals: nothing is created, an existing file keeps its content. */
static void refusals(const char *dir)
{
    char path[600];
    kvs_tier *t = NULL;
    kvs_error err = {0};
    CHECK(kvs_tier_open(dir, 1, 64, &t, &err) == KVS_ERR_ARG && strstr(err.msg, dir) &&
          strstr(err.msg, "directory") && !t);
    snprintf(path, sizeof path, "%s/missing/t.bin", dir);
    CHECK(kvs_tier_open(path, 1, 64, &t, &err) == KVS_ERR_ARG && strstr(err.msg, path) && !t);
    snprintf(path, sizeof path, "%s/existing", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("keep", f);
        fclose(f);
    }
    CHECK(kvs_tier_open(path, 1, 64, &t, &err) == KVS_ERR_ARG && strstr(err.msg, "exists"));
    char buf[16] = {0};
    f = fopen(path, "r");
    CHECK(f && fgets(buf, sizeof buf, f) && !strcmp(buf, "keep"));
    if (f)
        fclose(f);
    unlink(path);
}

/* In a child: SIGXFSZ ignored, a 16 KiB file size limit, a write past it fails with
 * KVS_ERR_IO naming tier=PATH. Exit status 0 when it did. */
static void full_file(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/full.bin", dir);
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {16384, 16384};
        setrlimit(RLIMIT_FSIZE, &rl);
        kvs_tier *t = NULL;
        kvs_error err = {0};
        if (kvs_tier_open(path, 4, 8192, &t, &err) != KVS_OK)
            _exit(3);
        static unsigned char w[8192];
        int st = KVS_OK;
        for (int reg = 0; reg < 4 && st == KVS_OK; reg++)
            st = kvs_tier_write(t, reg, 0, w, sizeof w, &err);
        char want[700];
        snprintf(want, sizeof want, "tier=%s", path);
        const int ok = st == KVS_ERR_IO && strstr(err.msg, want) != NULL;
        if (!ok)
            fprintf(stderr, "full file: status %d '%s'\n", st, err.msg);
        kvs_tier_close(t);
        _exit(ok ? 0 : 4);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    struct stat sb;
    CHECK(stat(path, &sb) != 0);
}

int main(void)
{
    char dir[512];
    check_tmp_path(dir, sizeof dir, "kvs-pqtier-XXXXXX");
    if (!mkdtemp(dir)) {
        CHECKF(0, "mkdtemp %s", dir);
        return check_summary("pq_tier");
    }
    memory_tier();
    file_tier(dir);
    refusals(dir);
    full_file(dir);
    CHECKF(rmdir(dir) == 0, "%s is not empty", dir);
    return check_summary("pq_tier");
}
