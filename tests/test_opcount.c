/* The MPC op-count model (src/eval/opcount.c) against counts worked out by hand from
 * methods/mpcache.md §3.3 and §3.5 (the arithmetic is in the comments), for a small shape:
 * L 4 layers, H 4 query heads, Hkv 2 KV heads, d 8, T 1024, F 0.05, tail 1, MPCache defaults
 * (keep 0.25, s1 32, s2 16, rho1 0.5, linear, 2 levels, sharing with skip 2, padding on). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "eval/opcount.h"

#define NEAR(a, b) (fabs((a) - (b)) < 1e-3 * fabs(b))

/* Every integer field of a row at once. */
typedef struct want {
    int sel;
    long long k, sim, max, div, topk_len, calls, eq, bits, softmax, attn;
} want;

static void check_row(const kvs_opcount_row *r, want w)
{
    const char *n = kvs_opcount_method_name(r->method);
    CHECKF(r->selector_layers == w.sel, "%s: sel %d, want %d", n, r->selector_layers, w.sel);
    CHECKF(r->attended == w.k, "%s: k %lld, want %lld", n, (long long)r->attended, w.k);
    CHECKF(r->sim_mults == w.sim, "%s: sim %lld, want %lld", n, (long long)r->sim_mults, w.sim);
    CHECKF(r->sim_max == w.max, "%s: max %lld, want %lld", n, (long long)r->sim_max, w.max);
    CHECKF(r->sim_div == w.div, "%s: div %lld, want %lld", n, (long long)r->sim_div, w.div);
    CHECKF(r->topk_len == w.topk_len, "%s: topk_len %lld, want %lld", n,
           (long long)r->topk_len, w.topk_len);
    CHECKF(r->topk_calls == w.calls, "%s: calls %lld, want %lld", n, (long long)r->topk_calls,
           w.calls);
    CHECKF(r->gather_eq == w.eq, "%s: eq %lld, want %lld", n, (long long)r->gather_eq, w.eq);
    CHECKF(r->gather_bits == w.bits, "%s: bits %lld, want %lld", n, (long long)r->gather_bits,
           w.bits);
    CHECKF(r->softmax_len == w.softmax, "%s: softmax %lld, want %lld", n,
           (long long)r->softmax_len, w.softmax);
    CHECKF(r->attn_mults == w.attn, "%s: attn %lld, want %lld", n, (long long)r->attn_mults,
           w.attn);
}

static kvs_opcount_input small_input(void)
{
    return (kvs_opcount_input){{4, 4, 2, 8}, 1024, 0.05, 1, kvs_mp_cfg_default()};
}

/* Selection totals multiply by (selector layers x Hkv) = 4 x 2 = 8 (sharing: 3 x 2 = 6);
 * softmax and qK/PV by (L x H) = 16. */
static void test_small_rows(void)
{
    kvs_opcount_input in = small_input();
    kvs_opcount_row r[KVS_OC_N_METHODS];
    kvs_error err = {0};
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_OK);
    /* full: k = T + tail = 1025; softmax 16 x 1025 = 16400; qK/PV 16 x 2 x 1025 x 8 = 262400 */
    check_row(&r[KVS_OC_FULL], (want){0, 1025, 0, 0, 0, 0, 0, 0, 0, 16400, 262400});
    /* token: k = ceil(0.05 x 1024 = 51.2) = 52 (+1 = 53). Per KV head: sim 1024 x 8 = 8192,
     * 1024 divisions, top-k 1024, gather 52 x 1024 = 53248 tests on 10 bits = 532480.
     * x8: 65536, 8192, 8192 (8 calls), 425984, 4259840. softmax 16 x 53 = 848;
     * qK/PV 16 x 2 x 53 x 8 = 13568 */
    check_row(&r[KVS_OC_TOKEN],
              (want){4, 53, 65536, 0, 8192, 8192, 8, 425984, 4259840, 848, 13568});
    /* quest: P = 1024 / 16 = 64 pages, ceil(51.2 / 16 = 3.2) = 4 chosen, k = 64 + 1 = 65.
     * Per KV head: 2 x 64 x 8 = 1024 mults, 64 x 8 = 512 max, top-k 64, gather 4 x 64 = 256
     * tests on 6 bits = 1536. x8: 8192, 4096, 512, 2048, 12288. softmax 16 x 65 = 1040;
     * qK/PV 16 x 2 x 65 x 8 = 16640 */
    check_row(&r[KVS_OC_QUEST],
              (want){4, 65, 8192, 4096, 0, 512, 8, 2048, 12288, 1040, 16640});
    /* mp:static+token: N = 0.25 x 1024 = 256, eta = 0.05 / 0.25 = 0.2, k = ceil(51.2) = 52.
     * Per KV head: sim 256 x 8 = 2048, 256 divisions, top-k 256, gather 52 x 256 = 13312 on
     * 8 bits = 106496. x8: 16384, 2048, 2048, 106496, 851968 */
    check_row(&r[KVS_OC_MP_TOKEN],
              (want){4, 53, 16384, 0, 2048, 2048, 8, 106496, 851968, 848, 13568});
    /* mp:+cluster: 256 slots (already a multiple of 32) in C2 = 16 fine clusters, n2 =
     * ceil(0.2 x 16 = 3.2) = 4, 64 slots, k 65. Per KV head: UB 2 x 16 x 8 = 256 mults,
     * 16 x 8 = 128 max, top-k 16, gather 4 x 16 = 64 on 4 bits = 256. x8: 2048, 1024, 128,
     * 512, 2048 */
    check_row(&r[KVS_OC_MP_CLUSTER],
              (want){4, 65, 2048, 1024, 0, 128, 8, 512, 2048, 1040, 16640});
    /* mp:+linear: 16 x 8 = 128 mults (x8 = 1024), no max; the rest as +cluster */
    check_row(&r[KVS_OC_MP_LINEAR], (want){4, 65, 1024, 0, 0, 128, 8, 512, 2048, 1040, 16640});
    /* mp:+hierarchy: C1 = 8, n1 = ceil(0.5 x 8) = 4, n_cand = 4 x 2 = 8, n2 = 4. Per KV head:
     * (8 + 8) x 8 = 128 mults, top-k 8 + 8 = 16 in 2 calls, gather 4 x 8 coarse on 3 bits
     * + 4 x 8 fine on 3 bits = 64 tests, 192 bits. x8: 1024, 128, 16, 512, 1536 */
    check_row(&r[KVS_OC_MP_HIERARCHY],
              (want){4, 65, 1024, 0, 0, 128, 16, 512, 1536, 1040, 16640});
    /* mp:+sharing: selectors 0, 1, 2 (layer 3 reuses 2): x6: 768, 96, 12, 384, 1152 */
    check_row(&r[KVS_OC_MP_SHARING],
              (want){3, 65, 768, 0, 0, 96, 12, 384, 1152, 1040, 16640});

    /* Reduction factors. full: 1. token: softmax 16400 / 848 = 19.34, mults 262400 /
     * (65536 + 13568) = 3.317, bits 1. quest bits 4259840 / 12288 = 346.67. mp:+linear mults
     * 262400 / (1024 + 16640) = 14.855; mp:+sharing bits 4259840 / 1152 = 3697.8 */
    CHECK(r[KVS_OC_FULL].red_softmax == 1.0 && r[KVS_OC_FULL].red_mults == 1.0);
    CHECK(isnan(r[KVS_OC_FULL].red_bits));
    CHECK(NEAR(r[KVS_OC_TOKEN].red_softmax, 19.3396));
    CHECK(NEAR(r[KVS_OC_TOKEN].red_mults, 3.31715));
    CHECK(r[KVS_OC_TOKEN].red_bits == 1.0);
    CHECK(NEAR(r[KVS_OC_QUEST].red_bits, 346.667));
    CHECK(NEAR(r[KVS_OC_MP_LINEAR].red_mults, 14.8551));
    CHECK(NEAR(r[KVS_OC_MP_SHARING].red_bits, 3697.78));
    CHECK(NEAR(r[KVS_OC_MP_SHARING].red_softmax, 16400.0 / 1040));

    /* Linear against UB: half the mults, no max, the rest identical. */
    CHECK(2 * r[KVS_OC_MP_LINEAR].sim_mults == r[KVS_OC_MP_CLUSTER].sim_mults);
    CHECK(r[KVS_OC_MP_LINEAR].sim_max == 0 && r[KVS_OC_MP_CLUSTER].sim_max > 0);
}

/* eta >= 0.5 (F 0.125: eta 0.5, rho1 1): the coarse level keeps all 8 clusters, so it is not
 * run. n2 = ceil(0.5 x 16) = 8 among all 16 fine clusters: per KV head 16 x 8 = 128 mults,
 * top-k 16 in 1 call, gather 8 x 16 = 128 on 4 bits = 512; x8: 1024, 128, 8, 1024, 4096.
 * k = 8 x 16 + 1 = 129: softmax 16 x 129 = 2064, qK/PV 16 x 2 x 129 x 8 = 33024. */
static void test_full_coarse_level(void)
{
    kvs_opcount_input in = small_input();
    in.budget = 0.125;
    kvs_opcount_row r[KVS_OC_N_METHODS];
    kvs_error err = {0};
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_OK);
    check_row(&r[KVS_OC_MP_HIERARCHY],
              (want){4, 129, 1024, 0, 0, 128, 8, 1024, 4096, 2064, 33024});
}

/* Sharing: every layer below skip selects, then one of each pair beyond it: 2 + (L - 2) / 2
 * rounded up (12 layers: 7; 32: 17, the spec's LLaMA-7B count; 4: 3). Without it, +sharing
 * equals +hierarchy. */
static void test_sharing(void)
{
    kvs_opcount_input in = small_input();
    kvs_opcount_row r[KVS_OC_N_METHODS];
    kvs_error err = {0};
    const int layers[] = {4, 12, 32, 13}, want_sel[] = {3, 7, 17, 8};
    for (int i = 0; i < 4; i++) {
        in.shape.n_layers = layers[i];
        CHECK(kvs_opcount_rows(&in, r, &err) == KVS_OK);
        CHECKF(r[KVS_OC_MP_SHARING].selector_layers == want_sel[i], "L %d: %d selectors",
               layers[i], r[KVS_OC_MP_SHARING].selector_layers);
        CHECK(r[KVS_OC_MP_HIERARCHY].selector_layers == layers[i]);
        CHECK(r[KVS_OC_MP_SHARING].sim_mults * layers[i] ==
              r[KVS_OC_MP_HIERARCHY].sim_mults * want_sel[i]);
        CHECK(r[KVS_OC_MP_SHARING].attn_mults == r[KVS_OC_MP_HIERARCHY].attn_mults);
    }
    in.cfg.share = 0;
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_OK);
    CHECK(!memcmp(&r[KVS_OC_MP_SHARING].selector_layers, &r[KVS_OC_MP_HIERARCHY].selector_layers,
                  sizeof(kvs_opcount_row) - offsetof(kvs_opcount_row, selector_layers)));
}

/* Table 2: k1 = 256 of T 1024 on 10 bits, k2 = 16 of C 64 on 6 bits. Tests per index 1024 / 64
 * = 16x, bits 10 / 6 = 1.667x, per index 10240 / 384 = 26.67x, tests 262144 / 1024 = 256x,
 * test-bits 2621440 / 6144 = 426.67x. */
static void test_table2(void)
{
    kvs_opcount_gather g;
    kvs_error err = {0};
    CHECK(kvs_opcount_gather_table(1024, 64, 0.25, &g, &err) == KVS_OK);
    CHECK(g.k1 == 256 && g.k2 == 16 && g.cmp1 == 1024 && g.cmp2 == 64);
    CHECK(g.bits1 == 10 && g.bits2 == 6);
    CHECK(g.tests1 == 262144 && g.tests2 == 1024);
    CHECK(g.testbits1 == 2621440 && g.testbits2 == 6144);
    CHECK(g.cmp_ratio == 16.0);
    CHECK(NEAR(g.bits_ratio, 1.66667));
    CHECK(NEAR(g.per_index_ratio, 26.6667));
    CHECK(g.tests_ratio == 256.0);
    CHECK(NEAR(g.testbits_ratio, 426.667));
    CHECK(g.paper_latency_ratio == 73.5 && g.paper_comm_ratio == 369.8);
    CHECK(kvs_opcount_gather_table(1, 64, 0.25, &g, &err) == KVS_ERR_ARG);
}

static void test_bits_and_errors(void)
{
    CHECK(kvs_opcount_index_bits(1) == 0 && kvs_opcount_index_bits(2) == 1);
    CHECK(kvs_opcount_index_bits(3) == 2 && kvs_opcount_index_bits(1024) == 10);
    CHECK(kvs_opcount_index_bits(1025) == 11);
    kvs_opcount_row r[KVS_OC_N_METHODS];
    kvs_error err = {0};
    kvs_opcount_input in = small_input();
    in.shape.n_heads = 3; /* not a multiple of 2 KV heads */
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_ERR_ARG && strstr(err.msg, "kv_heads"));
    in = small_input();
    in.shape.n_layers = 0;
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_ERR_ARG && strstr(err.msg, "layers"));
    in = small_input();
    in.ctx = 0;
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_ERR_ARG);
    in = small_input();
    in.budget = 0;
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_ERR_ARG);
    in = small_input();
    in.cfg.s1 = 24; /* s2 16 does not divide it */
    CHECK(kvs_opcount_rows(&in, r, &err) == KVS_ERR_ARG);
}

int main(void)
{
    test_small_rows();
    test_full_coarse_level();
    test_sharing();
    test_table2();
    test_bits_and_errors();
    return check_summary("opcount");
}
