/* Memory read bandwidth, the roofline of bench/native_bench.sh.
 *
 *   membw [THREADS [BYTES [REPS]]]      (defaults: 1 thread, 1 GiB, 5 reps)
 *
 * One buffer of BYTES (far larger than any L3: the default 1 GiB), allocated with aligned_alloc
 * on 2 MiB and madvise(MADV_HUGEPAGE) before it is first touched, is written once; then each of
 * THREADS threads sums its own contiguous share (1/THREADS) of it, all starting together behind
 * a barrier. Strategies: plain sequential loads ("plain"), and the same loads with a software
 * prefetch 1, 4, 8 or 16 KiB ahead ("prefetch=N"). Each strategy runs REPS times; a rep's
 * bandwidth is BYTES / (time of the slowest thread). Prints the best of all reps and strategies:
 *
 *   read_gbps 42.3 prefetch=8192
 *
 * (GB = 1e9 bytes), then one line per strategy on stderr. Loads use AVX-512 or AVX2 when the
 * compiler targets them (-march=native), plain C otherwise.
 * Build: cc -O2 -march=native -pthread -o membw membw.c
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define HUGE_ALIGN ((size_t)2 << 20)
#define MAX_THREADS 256

static const size_t prefetch_dist[] = {0, 1024, 4096, 8192, 16384};
#define N_STRATEGIES (sizeof prefetch_dist / sizeof prefetch_dist[0])

struct job {
    const unsigned char *p;
    size_t n;        /* bytes, a multiple of 256 */
    size_t ahead;    /* prefetch distance in bytes; 0 = none */
    double sum;      /* keeps the loads alive */
    double t0, t1;   /* start and end, seconds */
};

static pthread_barrier_t start_barrier;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sums n bytes from p, 256 bytes per step, prefetching `ahead` bytes ahead when ahead > 0. */
static double sum_bytes(const unsigned char *p, size_t n, size_t ahead) {
#if defined(__AVX512F__)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 256) {
        if (ahead) {
            _mm_prefetch((const char *)p + i + ahead, _MM_HINT_T0);
            _mm_prefetch((const char *)p + i + ahead + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)p + i + ahead + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)p + i + ahead + 192, _MM_HINT_T0);
        }
        a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (double)_mm512_reduce_add_epi64(a0);
#elif defined(__AVX2__)
    __m256i a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i += 256) {
        if (ahead) {
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)p + i + ahead + 64 * k, _MM_HINT_T0);
        }
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_add_epi64(a[k], _mm256_load_si256((const __m256i *)(p + i + 32 * k)));
    }
    for (int k = 1; k < 8; k++) a[0] = _mm256_add_epi64(a[0], a[k]);
    int64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a[0]);
    return (double)(v[0] + v[1] + v[2] + v[3]);
#else
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a[8] = {0};
    for (size_t i = 0; i < n / 8; i += 32) {
#if defined(__GNUC__)
        if (ahead) {
            for (int k = 0; k < 4; k++) __builtin_prefetch(p + 8 * i + ahead + 64 * k, 0, 3);
        }
#endif
        for (int k = 0; k < 32; k++) a[k & 7] += q[i + (size_t)k];
    }
    return (double)(a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7]);
#endif
}

static void *worker(void *arg) {
    struct job *j = arg;
    pthread_barrier_wait(&start_barrier);
    j->t0 = now();
    j->sum = sum_bytes(j->p, j->n, j->ahead);
    j->t1 = now();
    return NULL;
}

static long parse(const char *s, const char *what, long lo) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo) {
        fprintf(stderr, "membw: bad %s '%s' (a whole number >= %ld)\n", what, s, lo);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: membw [THREADS [BYTES [REPS]]]  (defaults 1, 1073741824, 5)\n"
               "prints: read_gbps GB/s STRATEGY (the best of REPS reps of each strategy)\n");
        return 0;
    }
    if (argc > 4) {
        fprintf(stderr, "usage: membw [THREADS [BYTES [REPS]]]\n");
        return 2;
    }
    long threads = argc > 1 ? parse(argv[1], "THREADS", 1) : 1;
    long bytes_arg = argc > 2 ? parse(argv[2], "BYTES", 1 << 20) : 1L << 30;
    long reps = argc > 3 ? parse(argv[3], "REPS", 1) : 5;
    if (threads > MAX_THREADS) {
        fprintf(stderr, "membw: at most %d threads\n", MAX_THREADS);
        return 2;
    }
    /* Each thread's share: a multiple of 256 bytes. Slack at the end for the prefetches. */
    size_t share = ((size_t)bytes_arg / (size_t)threads) & ~(size_t)255;
    size_t total = share * (size_t)threads;
    size_t alloc = (total + 16384 + 256 + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
    unsigned char *buf = aligned_alloc(HUGE_ALIGN, alloc);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu bytes\n", alloc);
        return 1;
    }
#ifdef MADV_HUGEPAGE
    madvise(buf, alloc, MADV_HUGEPAGE); /* advisory: ignored where THP is off */
#endif
    for (size_t i = 0; i < alloc; i++) buf[i] = (unsigned char)(i * 131u + 7u);

    pthread_barrier_init(&start_barrier, NULL, (unsigned)threads);
    struct job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    double best[N_STRATEGIES] = {0}, checksum = 0;
    for (long r = 0; r < reps; r++) {
        for (size_t s = 0; s < N_STRATEGIES; s++) {
            for (long t = 0; t < threads; t++) {
                jobs[t] = (struct job){buf + (size_t)t * share, share, prefetch_dist[s], 0, 0, 0};
                if (t > 0 && pthread_create(&tid[t], NULL, worker, &jobs[t]) != 0) {
                    fprintf(stderr, "membw: pthread_create failed\n");
                    return 1;
                }
            }
            worker(&jobs[0]);
            double t0 = jobs[0].t0, t1 = jobs[0].t1;
            for (long t = 0; t < threads; t++) {
                if (t > 0) pthread_join(tid[t], NULL);
                if (jobs[t].t0 < t0) t0 = jobs[t].t0;
                if (jobs[t].t1 > t1) t1 = jobs[t].t1;
                checksum += jobs[t].sum;
            }
            double gbps = (double)total / (t1 - t0) / 1e9;
            if (gbps > best[s]) best[s] = gbps;
        }
    }
    size_t top = 0;
    for (size_t s = 0; s < N_STRATEGIES; s++) {
        if (prefetch_dist[s])
            fprintf(stderr, "prefetch=%zu %.2f GB/s\n", prefetch_dist[s], best[s]);
        else
            fprintf(stderr, "plain %.2f GB/s\n", best[s]);
        if (best[s] > best[top]) top = s;
    }
    if (prefetch_dist[top])
        printf("read_gbps %.2f prefetch=%zu\n", best[top], prefetch_dist[top]);
    else
        printf("read_gbps %.2f plain\n", best[top]);
    fprintf(stderr, "(threads %ld, %zu bytes, %ld reps, checksum %.0f)\n", threads, total, reps,
            checksum);
    pthread_barrier_destroy(&start_barrier);
    free(buf);
    return 0;
}
