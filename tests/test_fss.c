/* Function secret sharing (src/mpc/fss.h) against the ideal functions.
 *
 * The AES under the tree PRG is checked against FIPS-197's AES-128 example on both paths (AES-NI
 * and OpenSSL), and the two paths' G against each other. DCF and DPF shares are summed mod 2^64
 * and compared with f(x) = beta [x < alpha] and beta [x == alpha]: exhaustively for small n,
 * at random and edge points up to n = 64. The lookup reconstructs table[x] from masked inputs.
 * Random draws come from a fixed-seed xoshiro256** (core/random.h). */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/random.h"
#include "mpc/fss.h"
#include "mpc/fss_internal.h"

static kvs_xoshiro rng;

static uint64_t rnd(void)
{
    return kvs_xoshiro_next(&rng);
}

static uint64_t mask_bits(int n)
{
    return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
}

static void rand_seed(uint8_t s[16])
{
    uint64_t a = rnd(), b = rnd();
    memcpy(s, &a, 8);
    memcpy(s + 8, &b, 8);
}

/* Large enough for any key (n = 64). */
#define KEY_MAX 2048
static uint8_t k0[KEY_MAX], k1[KEY_MAX];

static uint64_t dcf_ideal(int n, uint64_t alpha, uint64_t beta, uint64_t x)
{
    (void)n;
    return x < alpha ? beta : 0;
}

static uint64_t dpf_ideal(int n, uint64_t alpha, uint64_t beta, uint64_t x)
{
    (void)n;
    return x == alpha ? beta : 0;
}

typedef struct scheme {
    const char *name;
    size_t (*key_bytes)(int n);
    void (*gen)(int, uint64_t, uint64_t, const uint8_t *, const uint8_t *, uint8_t *, uint8_t *);
    uint64_t (*eval)(int, const uint8_t *, int, uint64_t);
    uint64_t (*ideal)(int, uint64_t, uint64_t, uint64_t);
} scheme;

static const scheme dcf = {"DCF", kvs_dcf_key_bytes, kvs_dcf_gen, kvs_dcf_eval, dcf_ideal};
static const scheme dpf = {"DPF", kvs_dpf_key_bytes, kvs_dpf_gen, kvs_dpf_eval, dpf_ideal};

static void gen_pair(const scheme *sc, int n, uint64_t alpha, uint64_t beta)
{
    uint8_t s0[16], s1[16];
    rand_seed(s0);
    rand_seed(s1);
    CHECK(sc->key_bytes(n) <= KEY_MAX);
    sc->gen(n, alpha, beta, s0, s1, k0, k1);
}

/* Counts a mismatch between the reconstruction at x and the ideal value; reports the first. */
static int check_point(const scheme *sc, int n, uint64_t alpha, uint64_t beta, uint64_t x,
                       int *reported)
{
    uint64_t y = sc->eval(0, k0, n, x) + sc->eval(1, k1, n, x);
    uint64_t want = sc->ideal(n, alpha, beta, x);
    if (y == want)
        return 0;
    if (!(*reported)++)
        fprintf(stderr, "%s n=%d alpha=%llu beta=%llu x=%llu: got %llu, want %llu\n", sc->name,
                n, (unsigned long long)alpha, (unsigned long long)beta, (unsigned long long)x,
                (unsigned long long)y, (unsigned long long)want);
    return 1;
}

/* Every x for the given alpha (small n). */
static int check_all_x(const scheme *sc, int n, uint64_t alpha, uint64_t beta, int *reported)
{
    int bad = 0;
    gen_pair(sc, n, alpha, beta);
    for (uint64_t x = 0; x <= mask_bits(n); x++)
        bad += check_point(sc, n, alpha, beta, x, reported);
    return bad;
}

/* The points around alpha and the domain's ends, then random ones. */
static int check_edges_random(const scheme *sc, int n, uint64_t alpha, uint64_t beta, int nx,
                              int *reported)
{
    uint64_t m = mask_bits(n);
    uint64_t edges[] = {0, 1, (alpha - 1) & m, alpha, (alpha + 1) & m, m};
    int bad = 0;
    gen_pair(sc, n, alpha, beta);
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        bad += check_point(sc, n, alpha, beta, edges[i], reported);
    for (int i = 0; i < nx; i++)
        bad += check_point(sc, n, alpha, beta, rnd() & m, reported);
    return bad;
}

static void test_aes(void)
{
    /* FIPS-197 Appendix C.1. */
    static const uint8_t key[16] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                    0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f};
    static const uint8_t pt[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                   0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
    static const uint8_t ct[16] = {0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30,
                                   0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4, 0xc5, 0x5a};
    uint8_t out[16];
    memset(out, 0, sizeof out);
    CHECK(kvs_fss_aes128_block(1, key, pt, out) == 0 && memcmp(out, ct, 16) == 0);
    if (kvs_fss_have_aesni()) {
        memset(out, 0, sizeof out);
        CHECK(kvs_fss_aes128_block(0, key, pt, out) == 0 && memcmp(out, ct, 16) == 0);
    } else {
        printf("fss: no AES-NI in this build: OpenSSL path only\n");
    }
    CHECK(kvs_fss_schedule_ok());

    /* G on both paths: equal outputs, and MMO's feed-forward (out != AES alone is implied by the
     * paths agreeing with each other; check the outputs differ from each other and the seed). */
    kvs_fss_prg ni, evp;
    kvs_fss_prg_init(&ni, 0);
    kvs_fss_prg_init(&evp, 1);
    CHECK(evp.evp == 1 && ni.evp == !kvs_fss_have_aesni());
    int same = 1, distinct = 1;
    for (int i = 0; i < 200; i++) {
        kvs_fss_block s = {rnd(), rnd()}, a[3], b[3];
        if (i == 0)
            s.lo = s.hi = 0;
        kvs_fss_prg_expand(&ni, s, 3, a);
        kvs_fss_prg_expand(&evp, s, 3, b);
        for (int j = 0; j < 3; j++) {
            same &= a[j].lo == b[j].lo && a[j].hi == b[j].hi;
            distinct &= !(a[j].lo == s.lo && a[j].hi == s.hi);
        }
        distinct &= a[0].hi != a[1].hi && a[1].hi != a[2].hi && a[0].hi != a[2].hi;
        /* Fewer outputs are a prefix of the full expansion. */
        kvs_fss_block c[3];
        kvs_fss_prg_expand(&ni, s, 2, c);
        same &= c[0].lo == a[0].lo && c[1].hi == a[1].hi;
    }
    CHECK(same);
    CHECK(distinct);
    /* The batched form (AES-NI's interleaved and VAES's 512-bit paths, by batch size) equals
     * OpenSSL seed by seed: a dealer and parties on different CPUs must expand alike. */
    int batch_same = 1;
    for (int count = 1; count <= KVS_FSS_PRG_BATCH; count++)
        for (int nout = 1; nout <= KVS_FSS_PRG_KEYS; nout++)
            for (int rep = 0; rep < 20; rep++) {
                kvs_fss_block in[KVS_FSS_PRG_BATCH], got[KVS_FSS_PRG_BATCH * KVS_FSS_PRG_KEYS];
                for (int i = 0; i < count; i++)
                    in[i] = (kvs_fss_block){rnd(), rnd()};
                kvs_fss_prg_expand_batch(&ni, in, count, nout, got);
                for (int i = 0; i < count; i++) {
                    kvs_fss_block want[KVS_FSS_PRG_KEYS];
                    kvs_fss_prg_expand(&evp, in[i], nout, want);
                    for (int j = 0; j < nout; j++)
                        batch_same &= got[i * nout + j].lo == want[j].lo &&
                                      got[i * nout + j].hi == want[j].hi;
                }
            }
    CHECK(batch_same);
    kvs_fss_prg_free(&ni);
    kvs_fss_prg_free(&evp);
}

static void test_small_exhaustive(const scheme *sc)
{
    static const int ns[] = {1, 2, 5};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k], bad = 0, reported = 0;
        for (uint64_t alpha = 0; alpha <= mask_bits(n); alpha++)
            bad += check_all_x(sc, n, alpha, rnd(), &reported);
        CHECKF(bad == 0, "%s n=%d: %d wrong points", sc->name, n, bad);
    }
    /* n = 8: every x for the edge alphas and 40 random ones. */
    int bad = 0, reported = 0;
    static const uint64_t edge_alpha[] = {0, 1, 127, 128, 254, 255};
    for (size_t i = 0; i < sizeof edge_alpha / sizeof edge_alpha[0]; i++)
        bad += check_all_x(sc, 8, edge_alpha[i], rnd(), &reported);
    for (int i = 0; i < 40; i++)
        bad += check_all_x(sc, 8, rnd() & 255, rnd(), &reported);
    /* beta = 0 and beta = -1 (the group's extremes). */
    bad += check_all_x(sc, 8, rnd() & 255, 0, &reported);
    bad += check_all_x(sc, 8, rnd() & 255, ~(uint64_t)0, &reported);
    CHECKF(bad == 0, "%s n=8: %d wrong points", sc->name, bad);
}

static void test_large(const scheme *sc)
{
    static const int ns[] = {16, 32, 63, 64};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k], bad = 0, reported = 0;
        uint64_t m = mask_bits(n);
        uint64_t edge_alpha[] = {0, 1, m, m - 1, (m >> 1) + 1};
        for (size_t i = 0; i < sizeof edge_alpha / sizeof edge_alpha[0]; i++)
            bad += check_edges_random(sc, n, edge_alpha[i], rnd(), 10, &reported);
        for (int i = 0; i < 25; i++)
            bad += check_edges_random(sc, n, rnd() & m, rnd(), 10, &reported);
        CHECKF(bad == 0, "%s n=%d: %d wrong points", sc->name, n, bad);
    }
}

static void test_dcf_many(void)
{
    enum { COUNT = 19 }; /* two batches of eight and a remainder of three (evaluation); nine
                            pairs of seeds and a remainder of one (generation) */
    static const int ns[] = {7, 64};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        size_t kb = kvs_dcf_key_bytes(n);
        static uint8_t keys0[COUNT * KEY_MAX], keys1[COUNT * KEY_MAX];
        static uint8_t many0[COUNT * KEY_MAX], many1[COUNT * KEY_MAX], seeds[COUNT * 32];
        uint64_t xs[COUNT], o0[COUNT], o1[COUNT], alpha[COUNT], beta[COUNT];
        for (int i = 0; i < COUNT; i++) {
            rand_seed(seeds + 32 * i);
            rand_seed(seeds + 32 * i + 16);
            alpha[i] = rnd() & mask_bits(n);
            beta[i] = rnd();
            xs[i] = i % 3 == 0 ? alpha[i] : rnd() & mask_bits(n);
            kvs_dcf_gen(n, alpha[i], beta[i], seeds + 32 * i, seeds + 32 * i + 16,
                        keys0 + i * kb, keys1 + i * kb);
        }
        /* the batched generation makes the same keys */
        kvs_dcf_gen_many(n, COUNT, alpha, beta, seeds, many0, many1);
        CHECKF(!memcmp(many0, keys0, COUNT * kb) && !memcmp(many1, keys1, COUNT * kb),
               "dcf_gen_many n=%d: keys differ from kvs_dcf_gen's", n);
        /* and for the DPF */
        const size_t pb = kvs_dpf_key_bytes(n);
        for (int i = 0; i < COUNT; i++)
            kvs_dpf_gen(n, alpha[i], beta[i], seeds + 32 * i, seeds + 32 * i + 16,
                        keys0 + i * pb, keys1 + i * pb);
        kvs_dpf_gen_many(n, COUNT, alpha, beta, seeds, many0, many1);
        CHECKF(!memcmp(many0, keys0, COUNT * pb) && !memcmp(many1, keys1, COUNT * pb),
               "dpf_gen_many n=%d: keys differ from kvs_dpf_gen's", n);
        for (int i = 0; i < COUNT; i++) /* back to the DCF keys for the evaluations below */
            kvs_dcf_gen(n, alpha[i], beta[i], seeds + 32 * i, seeds + 32 * i + 16,
                        keys0 + i * kb, keys1 + i * kb);
        kvs_dcf_eval_many(0, keys0, n, xs, COUNT, o0);
        kvs_dcf_eval_many(1, keys1, n, xs, COUNT, o1);
        int bad = 0;
        for (int i = 0; i < COUNT; i++) {
            bad += o0[i] + o1[i] != dcf_ideal(n, alpha[i], beta[i], xs[i]);
            bad += o0[i] != kvs_dcf_eval(0, keys0 + i * kb, n, xs[i]);
        }
        CHECKF(bad == 0, "dcf_eval_many n=%d: %d wrong", n, bad);
    }
}

static void test_dpf_eval_all(void)
{
    static uint64_t a0[1 << 16], a1[1 << 16];
    for (int n = 1; n <= 10; n++) {
        int bad_single = 0, bad_sum = 0;
        for (int rep = 0; rep < 4; rep++) {
            uint64_t m = mask_bits(n);
            uint64_t alpha = rep == 0 ? 0 : rep == 1 ? m : rnd() & m, beta = rnd();
            gen_pair(&dpf, n, alpha, beta);
            kvs_dpf_eval_all(0, k0, n, a0);
            kvs_dpf_eval_all(1, k1, n, a1);
            for (uint64_t x = 0; x <= m; x++) {
                bad_single += a0[x] != kvs_dpf_eval(0, k0, n, x);
                bad_single += a1[x] != kvs_dpf_eval(1, k1, n, x);
                bad_sum += a0[x] + a1[x] != (x == alpha ? beta : 0);
            }
        }
        CHECKF(bad_single == 0, "dpf_eval_all n=%d: %d differ from dpf_eval", n, bad_single);
        CHECKF(bad_sum == 0, "dpf_eval_all n=%d: %d wrong sums", n, bad_sum);
    }
    /* n = 16: the sums only. */
    uint64_t alpha = rnd() & 0xffff, beta = rnd();
    gen_pair(&dpf, 16, alpha, beta);
    kvs_dpf_eval_all(0, k0, 16, a0);
    kvs_dpf_eval_all(1, k1, 16, a1);
    int bad = 0, zero_shares = 0;
    for (uint64_t x = 0; x < (1u << 16); x++) {
        bad += a0[x] + a1[x] != (x == alpha ? beta : 0);
        zero_shares += a0[x] == 0;
    }
    CHECKF(bad == 0, "dpf_eval_all n=16: %d wrong sums", bad);
    /* One party's shares look random: off the point they are not the (zero) value. */
    CHECKF(zero_shares <= 1, "dpf_eval_all n=16: %d zero shares", zero_shares);
}

static void test_lut(void)
{
    static uint64_t table[1 << 12], scratch[1 << 12];
    static const int ns[] = {4, 8, 12};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k], bad = 0;
        uint64_t m = mask_bits(n);
        for (uint64_t i = 0; i <= m; i++)
            table[i] = rnd();
        for (int rep = 0; rep < 3; rep++) {
            uint64_t r = rep == 0 ? 0 : rep == 1 ? m : rnd() & m;
            gen_pair(&dpf, n, r, 1);
            int nx = n <= 8 ? (int)(m + 1) : 12;
            for (int i = 0; i < nx; i++) {
                uint64_t x = n <= 8 ? (uint64_t)i : rnd() & m, c = (x + r) & m;
                uint64_t y = kvs_lut_eval(0, k0, n, c, table, scratch) +
                             kvs_lut_eval(1, k1, n, c, table, scratch);
                bad += y != table[x];
            }
        }
        CHECKF(bad == 0, "lut n=%d: %d wrong lookups", n, bad);
    }
}

static void test_key_sanity(const scheme *sc)
{
    static const int ns[] = {1, 8, 64};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        size_t kb = sc->key_bytes(n);
        uint64_t alpha = rnd() & mask_bits(n), beta = rnd();
        uint8_t s0[16], s1[16], a0[KEY_MAX], a1[KEY_MAX];
        rand_seed(s0);
        rand_seed(s1);
        sc->gen(n, alpha, beta, s0, s1, a0, a1);
        CHECK(memcmp(a0, a1, kb) != 0);
        /* The pair differs in the root seed only; the root seeds are the given ones. */
        CHECK(memcmp(a0 + 16, a1 + 16, kb - 16) == 0);
        CHECK(memcmp(a0, s0, 16) == 0 && memcmp(a1, s1, 16) == 0);
        /* Another seed (one bit flipped) changes the corrections. */
        for (int which = 0; which < 2; which++) {
            uint8_t t0[16], t1[16];
            memcpy(t0, s0, 16);
            memcpy(t1, s1, 16);
            (which ? t1 : t0)[15] ^= 0x80;
            sc->gen(n, alpha, beta, t0, t1, k0, k1);
            CHECKF(memcmp(a0 + 16, k0 + 16, kb - 16) != 0, "%s n=%d: seed %d change ignored",
                   sc->name, n, which);
        }
        /* The same seeds give the same keys (the functions are deterministic). */
        sc->gen(n, alpha, beta, s0, s1, k0, k1);
        CHECK(memcmp(a0, k0, kb) == 0 && memcmp(a1, k1, kb) == 0);
    }
}

static void test_sizes(void)
{
    static const int ns[] = {8, 16, 32, 64};
    static const size_t want_dcf[] = {218, 412, 800, 1576}, want_dpf[] = {154, 284, 544, 1064};
    for (size_t k = 0; k < 4; k++) {
        int n = ns[k];
        printf("fss: n=%2d: DCF key %4zu bytes, DPF key %4zu bytes\n", n, kvs_dcf_key_bytes(n),
               kvs_dpf_key_bytes(n));
        CHECK(kvs_dcf_key_bytes(n) == want_dcf[k]);
        CHECK(kvs_dpf_key_bytes(n) == want_dpf[k]);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Speed, printed only. */
static void report_speed(void)
{
    enum { COUNT = 2000 };
    gen_pair(&dcf, 64, rnd(), rnd());
    uint64_t acc = 0;
    double t = now_s();
    for (int i = 0; i < COUNT; i++)
        acc += kvs_dcf_eval(0, k0, 64, rnd());
    t = now_s() - t;
    printf("fss: DCF n=64: %.0f evals/s (one party, one core; checksum %llu)\n", COUNT / t,
           (unsigned long long)(acc & 1));
    static uint8_t keys[64 * 1576];
    uint64_t xs[64], res[64];
    for (int i = 0; i < 64; i++) {
        memcpy(keys + i * kvs_dcf_key_bytes(64), k0, kvs_dcf_key_bytes(64));
        xs[i] = rnd();
    }
    t = now_s();
    for (int r = 0; r < COUNT / 64; r++)
        kvs_dcf_eval_many(0, keys, 64, xs, 64, res);
    t = now_s() - t;
    printf("fss: DCF n=64 batched (kvs_dcf_eval_many): %.0f evals/s\n", (COUNT / 64 * 64) / t);
    static uint64_t out[1 << 16];
    gen_pair(&dpf, 16, rnd() & 0xffff, 1);
    t = now_s();
    kvs_dpf_eval_all(0, k0, 16, out);
    t = now_s() - t;
    printf("fss: DPF n=16 full domain: %.2f ms\n", 1e3 * t);
}

int main(void)
{
    kvs_xoshiro_seed(&rng, 0xf55f55ULL);
    test_aes();
    test_sizes();
    test_small_exhaustive(&dcf);
    test_small_exhaustive(&dpf);
    test_large(&dcf);
    test_large(&dpf);
    test_dcf_many();
    test_dpf_eval_all();
    test_lut();
    test_key_sanity(&dcf);
    test_key_sanity(&dpf);
    report_speed();
    return check_summary("test_fss");
}
