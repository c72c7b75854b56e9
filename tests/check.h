/* Minimal test harness: CHECK records failures without stopping; main returns check_summary(). */
#ifndef KVS_CHECK_H
#define KVS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

/* 1 in a ThreadSanitizer build (make tsan), where code runs 5 to 15 times slower: the threaded
 * tests then check fewer shapes (every kernel path and thread count still), so that CI's TSan
 * stage stays within its time. */
#if defined(__SANITIZE_THREAD__)
#define KVS_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVS_UNDER_TSAN 1
#endif
#endif
#ifndef KVS_UNDER_TSAN
#define KVS_UNDER_TSAN 0
#endif

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (cond) {                                                                          \
            check_passed++;                                                                  \
        } else {                                                                             \
            check_failed++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECKF(cond, ...)                                                                    \
    do {                                                                                     \
        if (cond) {                                                                          \
            check_passed++;                                                                  \
        } else {                                                                             \
            check_failed++;                                                                  \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fputc('\n', stderr);                                                             \
        }                                                                                    \
    } while (0)

/* Path under ../shared (from the KVS_SHARED_DIR environment variable set by ctest). */
static inline const char *check_shared_path(char *buf, size_t size, const char *rel)
{
    const char *dir = getenv("KVS_SHARED_DIR");
    snprintf(buf, size, "%s/%s", dir ? dir : "../shared", rel);
    return buf;
}

/* Directory for temporary files (KVS_TEST_TMP, else /tmp). */
static inline const char *check_tmp_path(char *buf, size_t size, const char *name)
{
    const char *dir = getenv("KVS_TEST_TMP");
    snprintf(buf, size, "%s/%s", dir ? dir : "/tmp", name);
    return buf;
}

/* Reads up to max whitespace-separated token ids from a file; the count, or -1 if unreadable. */
static inline int check_read_tokens(const char *path, int *out, int max)
{
    FILE *f = fopen(path, "r");
    int n = 0, v;
    if (!f)
        return -1;
    while (n < max && fscanf(f, "%d", &v) == 1)
        out[n++] = v;
    fclose(f);
    return n;
}

static inline int check_summary(const char *suite)
{
    printf("%s: %d checks passed, %d failed\n", suite, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
