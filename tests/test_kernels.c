/* Kernel tests: conversions (exhaustive), quantisation layouts, matmul against references for
 * every weight type / shape / pool size, and the per-vector ops against scalar formulas. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/kernels.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                    */

#include "rng.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Independent fp32 -> fp16 reference: binary search for the nearest half by value (double),
 * ties to even mantissa. Finite, non-NaN input. */
static uint16_t ref_fp32_to_fp16(float f)
{
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    /* positive halves 0x0000..0x7bff are increasing in value */
    unsigned lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest h with value(h) <= a */
        unsigned mid = (lo + hi + 1) / 2;
        if ((double)kvs_fp16_to_fp32((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    const double vlo = kvs_fp16_to_fp32((uint16_t)lo);
    if (vlo == a || lo == 0x7bff) /* 0x7bff: a < 65520 rounds down */
        return sign | (uint16_t)lo;
    const double vhi = kvs_fp16_to_fp32((uint16_t)(lo + 1));
    const double dlo = a - vlo, dhi = vhi - a;
    if (dlo < dhi || (dlo == dhi && (lo & 1) == 0))
        return sign | (uint16_t)lo;
    return sign | (uint16_t)(lo + 1);
}

/* Reference value of a half via the formula (not bit manipulation). */
static double half_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 0x3ff;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0)
        return s * ldexp(m, -24);
    if (e == 31)
        return m ? NAN : s * INFINITY;
    return s * ldexp(1024 + m, e - 25);
}

/* ------------------------------------------------------------------------------------------ */

static void test_fp16(void)
{
    /* exhaustive: value matches the formula, and round trip is exact (NaN: quiet bit set) */
    int bad_val = 0, bad_rt = 0, bad_hw = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kvs_fp16_to_fp32((uint16_t)h);
        const double v = half_value((uint16_t)h);
        if (isnan(v) ? !isnan(f) : ((double)f != v || !signbit(f) != !signbit(v)))
            bad_val++;
        const uint16_t back = kvs_fp32_to_fp16(f);
        const int is_nan = ((h >> 10) & 31) == 31 && (h & 0x3ff);
        if (is_nan ? back != (h | 0x0200) : back != h)
            bad_rt++;
#if defined(__F16C__)
        if (fbits(_cvtsh_ss((unsigned short)h)) != fbits(f))
            bad_hw++;
#endif
    }
    CHECKF(bad_val == 0, "%d halves decode wrong", bad_val);
    CHECKF(bad_rt == 0, "%d halves fail round trip", bad_rt);
    CHECKF(bad_hw == 0, "%d halves differ from F16C", bad_hw);

    /* known values and ties */
    CHECK(kvs_fp32_to_fp16(1.0f) == 0x3c00);
    CHECK(kvs_fp32_to_fp16(-2.0f) == 0xc000);
    CHECK(kvs_fp32_to_fp16(0.0f) == 0x0000);
    CHECK(kvs_fp32_to_fp16(-0.0f) == 0x8000);
    CHECK(kvs_fp32_to_fp16(65504.0f) == 0x7bff);
    CHECK(kvs_fp32_to_fp16(65519.996f) == 0x7bff);
    CHECK(kvs_fp32_to_fp16(65520.0f) == 0x7c00); /* tie rounds to even = overflow */
    CHECK(kvs_fp32_to_fp16(1e10f) == 0x7c00);
    CHECK(kvs_fp32_to_fp16(-INFINITY) == 0xfc00);
    CHECK(kvs_fp32_to_fp16(INFINITY) == 0x7c00);
    CHECK((kvs_fp32_to_fp16(NAN) & 0x7e00) == 0x7e00);
    CHECK((kvs_fp32_to_fp16(bitsf(0x7f800001u)) & 0x7fff) > 0x7c00); /* sNaN stays NaN */
    CHECK(kvs_fp32_to_fp16(1.0f + 0x1p-11f) == 0x3c00);         /* tie -> even (down) */
    CHECK(kvs_fp32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02);     /* tie -> even (up) */
    CHECK(kvs_fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
    CHECK(kvs_fp32_to_fp16(0x1p-14f) == 0x0400);                /* smallest normal */
    CHECK(kvs_fp32_to_fp16(0x1p-24f) == 0x0001);                /* smallest subnormal */
    CHECK(kvs_fp32_to_fp16(0x1p-25f) == 0x0000);                /* tie -> even (zero) */
    CHECK(kvs_fp32_to_fp16(0x1p-25f * 1.0000001f) == 0x0001);
    CHECK(kvs_fp32_to_fp16(3 * 0x1p-25f) == 0x0002);            /* 1.5 ulp -> 2 */
    CHECK(kvs_fp32_to_fp16(5 * 0x1p-25f) == 0x0002);            /* 2.5 ulp -> 2 */
    CHECK(kvs_fp32_to_fp16(-0x1p-26f) == 0x8000);
    CHECK(kvs_fp32_to_fp16(1023 * 0x1p-24f) == 0x03ff);
    CHECK(kvs_fp32_to_fp16(0x1p-14f - 0x1p-25f) == 0x0400);     /* tie between 0x3ff and 0x400 */
    CHECK(kvs_fp16_to_fp32(0x3555) == 0x1.554p-2f);
    CHECK(kvs_fp16_to_fp32(0x0001) == 0x1p-24f);
    CHECK(kvs_fp16_to_fp32(0x7bff) == 65504.0f);
    CHECK(isinf(kvs_fp16_to_fp32(0xfc00)) && kvs_fp16_to_fp32(0xfc00) < 0);

    /* random floats (wide and half-range exponents) vs the independent reference and F16C */
    int bad_ref = 0, bad_hw2 = 0;
    for (int i = 0; i < 120000; i++) {
        uint32_t u = rnd_u32();
        if (i & 1) /* concentrate on exponents 100..145 where halves live */
            u = (u & 0x807fffffu) | ((100u + rnd_u32() % 46u) << 23);
        if (i % 7 == 0) /* exact ties and near-ties */
            u = (u & ~0x1fffu) | 0x1000u | (rnd_u32() % 3u == 0 ? 1u : 0u);
        const float f = bitsf(u);
        if (isnan(f))
            continue;
        const uint16_t h = kvs_fp32_to_fp16(f);
        if (h != ref_fp32_to_fp16(f))
            bad_ref++;
#if defined(__F16C__)
        if (h != _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))
            bad_hw2++;
#endif
    }
    CHECKF(bad_ref == 0, "%d floats round differently from the reference", bad_ref);
    CHECKF(bad_hw2 == 0, "%d floats round differently from F16C", bad_hw2);

    /* whole rows (the vectorised conversion of kvs_quantize_row) against the scalar one, NaNs,
     * infinities, subnormals and ties included, at every length up to 40 (the tails) */
    enum { ROW = 4099 };
    static float row[ROW];
    static uint16_t got[ROW];
    int bad_row = 0;
    for (int i = 0; i < ROW; i++) {
        uint32_t u = rnd_u32();
        if (i % 3 == 0)
            u = (u & 0x807fffffu) | ((100u + rnd_u32() % 46u) << 23);
        if (i % 5 == 0)
            u = (u & ~0x1fffu) | 0x1000u;
        row[i] = bitsf(u);
    }
    row[1] = NAN, row[2] = INFINITY, row[3] = -INFINITY, row[4] = 0x1p-25f, row[5] = 65520.0f;
    for (int n = 0; n <= 40; n++) {
        kvs_quantize_row(KVS_F16, row + 7, got, n);
        for (int i = 0; i < n; i++)
            bad_row += got[i] != kvs_fp32_to_fp16(row[7 + i]);
    }
    kvs_quantize_row(KVS_F16, row, got, ROW);
    for (int i = 0; i < ROW; i++)
        bad_row += got[i] != kvs_fp32_to_fp16(row[i]);
    CHECKF(bad_row == 0, "%d row elements differ from kvs_fp32_to_fp16", bad_row);
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kvs_bf16_to_fp32((uint16_t)h);
        if (fbits(f) != h << 16)
            bad++;
        const uint16_t back = kvs_fp32_to_bf16(f);
        const int is_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (is_nan ? back != (h | 0x40) : back != h)
            bad++;
    }
    CHECKF(bad == 0, "%d bf16 values fail", bad);
    CHECK(kvs_fp32_to_bf16(1.0f) == 0x3f80);
    CHECK(kvs_fp32_to_bf16(bitsf(0x3f808000u)) == 0x3f80); /* tie -> even (down) */
    CHECK(kvs_fp32_to_bf16(bitsf(0x3f818000u)) == 0x3f82); /* tie -> even (up) */
    CHECK(kvs_fp32_to_bf16(bitsf(0x3f808001u)) == 0x3f81);
    CHECK(kvs_fp32_to_bf16(bitsf(0x3f807fffu)) == 0x3f80);
    CHECK(kvs_fp32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80); /* overflow to inf */
    CHECK(kvs_fp32_to_bf16(bitsf(0x00010000u)) == 0x0001); /* subnormal kept */
    CHECK(kvs_fp32_to_bf16(-INFINITY) == 0xff80);
    CHECK((kvs_fp32_to_bf16(bitsf(0x7f800001u)) & 0x7fc0) == 0x7fc0); /* sNaN -> qNaN */
    CHECK(kvs_bf16_to_fp32(0xc040) == -3.0f);
}

static void test_quant_layouts(void)
{
    /* Q8_0 with d == 1: exercises roundf (half away from zero) */
    float x[64];
    memset(x, 0, sizeof x);
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -2.5f;
    x[3] = 0.5f;
    x[4] = -126.5f;
    x[5] = 0.49f;
    x[31] = -1.0f;
    for (int j = 0; j < 32; j++) /* second block: j - 16, amax 16 */
        x[32 + j] = (float)(j - 16);
    kvs_block_q8_0 q8[2];
    kvs_quantize_row(KVS_Q8_0, x, q8, 64);
    CHECK(q8[0].d == 0x3c00);
    CHECK(q8[0].qs[0] == 127 && q8[0].qs[1] == 3 && q8[0].qs[2] == -3 && q8[0].qs[3] == 1);
    CHECK(q8[0].qs[4] == -127 && q8[0].qs[5] == 0 && q8[0].qs[31] == -1 && q8[0].qs[6] == 0);
    /* d = 16/127 -> fp16 0x3008 (0.1259765625); id = 127/16 = 7.9375 */
    CHECK(q8[1].d == kvs_fp32_to_fp16(16.0f / 127.0f));
    CHECK(q8[1].d == 0x3008);
    CHECK(q8[1].qs[0] == -127 && q8[1].qs[31] == 119 && q8[1].qs[17] == 8 && q8[1].qs[18] == 16);
    CHECK(q8[1].qs[16] == 0 && q8[1].qs[15] == -8);
    {
        const unsigned char *raw = (const unsigned char *)q8;
        CHECK(sizeof q8 == 68 && raw[0] == 0x00 && raw[1] == 0x3c && raw[2] == 127 && raw[3] == 3);
        CHECK(raw[34] == 0x08 && raw[35] == 0x30 && (int8_t)raw[36] == -127);
    }
    float back[64];
    kvs_dequantize_row(KVS_Q8_0, q8, back, 64);
    CHECK(back[0] == 127.0f && back[1] == 3.0f && back[4] == -127.0f);
    CHECK(back[33] == -119 * kvs_fp16_to_fp32(0x3008) && q8[1].qs[1] == -119);

    /* zero block */
    float z[32] = {0};
    kvs_block_q8_0 qz;
    memset(&qz, 0x55, sizeof qz);
    kvs_quantize_row(KVS_Q8_0, z, &qz, 32);
    int zero_ok = qz.d == 0;
    for (int j = 0; j < 32; j++)
        zero_ok &= qz.qs[j] == 0;
    CHECK(zero_ok);

    /* Q4_0: max is the signed value of largest magnitude; d = max / -8 */
    float y[32];
    for (int j = 0; j < 32; j++)
        y[j] = 0.0f;
    y[5] = -8.0f; /* d = 1, id = 1 */
    y[0] = 7.0f;  /* 15.5 -> 15 */
    y[1] = 7.4f;  /* 15.9 -> 15 */
    y[2] = -0.5f; /* 8.0 -> 8 */
    y[3] = -0.6f; /* 7.9 -> 7 */
    y[16] = 3.0f; /* 11.5 -> 11, high nibble of qs[0] */
    y[21] = -7.9f; /* 0.6 -> 0 */
    y[31] = 1.0f; /* 9.5 -> 9 */
    kvs_block_q4_0 q4;
    kvs_quantize_row(KVS_Q4_0, y, &q4, 32);
    CHECK(q4.d == 0x3c00);
    CHECK(q4.qs[0] == (15 | 11 << 4));
    CHECK(q4.qs[1] == (15 | 8 << 4));
    CHECK(q4.qs[2] == (8 | 8 << 4) && q4.qs[3] == (7 | 8 << 4));
    CHECK(q4.qs[5] == (0 | 0 << 4));
    CHECK(q4.qs[15] == (8 | 9 << 4));
    CHECK(((const unsigned char *)&q4)[2] == (15 | 11 << 4) && sizeof q4 == 18);
    float yb[32];
    kvs_dequantize_row(KVS_Q4_0, &q4, yb, 32);
    CHECK(yb[0] == 7.0f && yb[5] == -8.0f && yb[16] == 3.0f && yb[21] == -8.0f && yb[31] == 1.0f);

    /* positive max: d = -1; -8 -> 16.5 -> clamped to 15 */
    for (int j = 0; j < 32; j++)
        y[j] = 0.0f;
    y[7] = 8.0f;
    y[8] = -8.0f; /* same magnitude, later: max stays +8 (first wins) */
    y[20] = -3.0f;
    kvs_quantize_row(KVS_Q4_0, y, &q4, 32);
    CHECK(q4.d == 0xbc00);
    CHECK((q4.qs[7] & 15) == 0 && (q4.qs[8] & 15) == 15 && (q4.qs[4] >> 4) == 11);
    CHECK((q4.qs[0] & 15) == 8);

    /* F16/BF16 rows match the scalar conversions; random Q8_0/Q4_0 round-trip error bounds */
    float r[256], rb[256];
    for (int i = 0; i < 256; i++)
        r[i] = rnd_unit() * 3.0f;
    uint16_t h[256];
    kvs_quantize_row(KVS_F16, r, h, 256);
    int ok = 1;
    for (int i = 0; i < 256; i++)
        ok &= h[i] == kvs_fp32_to_fp16(r[i]);
    kvs_dequantize_row(KVS_F16, h, rb, 256);
    for (int i = 0; i < 256; i++)
        ok &= rb[i] == kvs_fp16_to_fp32(h[i]);
    CHECK(ok);
    kvs_quantize_row(KVS_BF16, r, h, 256);
    ok = 1;
    for (int i = 0; i < 256; i++)
        ok &= h[i] == kvs_fp32_to_bf16(r[i]);
    kvs_dequantize_row(KVS_BF16, h, rb, 256);
    for (int i = 0; i < 256; i++)
        ok &= rb[i] == kvs_bf16_to_fp32(h[i]);
    CHECK(ok);
    kvs_quantize_row(KVS_F32, r, rb, 256);
    CHECK(memcmp(r, rb, sizeof r) == 0);

    kvs_block_q8_0 q8r[8];
    kvs_quantize_row(KVS_Q8_0, r, q8r, 256);
    kvs_dequantize_row(KVS_Q8_0, q8r, rb, 256);
    ok = 1;
    for (int b = 0; b < 8; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(r[b * 32 + j]));
        for (int j = 0; j < 32; j++)
            ok &= fabsf(rb[b * 32 + j] - r[b * 32 + j]) <= amax / 127.0f * 0.5f + amax * 1e-3f;
    }
    CHECK(ok);
    kvs_block_q4_0 q4r[8];
    kvs_quantize_row(KVS_Q4_0, r, q4r, 256);
    kvs_dequantize_row(KVS_Q4_0, q4r, rb, 256);
    ok = 1;
    for (int b = 0; b < 8; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(r[b * 32 + j]));
        for (int j = 0; j < 32; j++)
            ok &= fabsf(rb[b * 32 + j] - r[b * 32 + j]) <= amax / 8.0f * 1.0f + amax * 1e-3f;
    }
    CHECK(ok);
}

/* ------------------------------------------------------------------------------------------ */
/* matmul                                                                                     */

/* Reference for quantised weights that also quantises x the way kvs_matmul does: 8-bit blocks
 * with fp32 scale d = amax/127, q = rint(x / d) (ties to even). Exact integer block dots. */
static void ref_matmul_qx(double *y, double *yabs, const float *x, const void *w, kvs_dtype wt,
                          int n_rows, int n_in, int n_out)
{
    const int nb = n_in / 32;
    const size_t bb = wt == KVS_Q8_0 ? 34 : 18;
    int8_t *xq = malloc((size_t)n_in);
    float *xd = malloc((size_t)nb * sizeof(float));
    float wv[32];
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        for (int b = 0; b < nb; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(xr[b * 32 + j]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            xd[b] = d;
            for (int j = 0; j < 32; j++)
                xq[b * 32 + j] = (int8_t)rintf(xr[b * 32 + j] * id);
        }
        for (int o = 0; o < n_out; o++) {
            const char *row = (const char *)w + (size_t)o * nb * bb;
            double s = 0, sa = 0;
            for (int b = 0; b < nb; b++) {
                kvs_dequantize_row(wt, row + b * bb, wv, 32);
                uint16_t dh;
                memcpy(&dh, row + b * bb, 2);
                const float dw = kvs_fp16_to_fp32(dh);
                long isum = 0, iabs = 0;
                for (int j = 0; j < 32; j++) {
                    const long qw = dw != 0.0f ? lrint(wv[j] / dw) : 0;
                    isum += qw * xq[b * 32 + j];
                    iabs += labs(qw * xq[b * 32 + j]);
                }
                s += (double)dw * xd[b] * (double)isum;
                sa += fabs((double)dw * xd[b]) * (double)iabs;
            }
            y[(size_t)r * n_out + o] = s;
            yabs[(size_t)r * n_out + o] = sa;
        }
    }
    free(xq);
    free(xd);
}

static int n_matmul_cases;

static void check_matmul_case(kvs_pool **pools, int n_pools, kvs_dtype wt, int n_rows, int n_in,
                              int n_out, int odd_values)
{
    uint64_t rb;
    if (kvs_dtype_bytes(wt, (uint64_t)n_in, &rb) != 0)
        return;
    float *x = malloc((size_t)n_rows * n_in * sizeof(float));
    float *wf = malloc((size_t)n_in * sizeof(float));
    char *w = malloc((size_t)rb * n_out);
    float *y = malloc((size_t)n_rows * n_out * sizeof(float));
    float *yr = malloc((size_t)n_rows * n_out * sizeof(float));
    double *yq = malloc((size_t)n_rows * n_out * sizeof(double));
    double *yqa = malloc((size_t)n_rows * n_out * sizeof(double));
    float *wdq = malloc((size_t)n_in * n_out * sizeof(float));
    for (int i = 0; i < n_rows * n_in; i++)
        x[i] = rnd_unit();
    if (odd_values) {
        /* a zero block, a huge-magnitude row, and extreme weights */
        for (int i = 0; i < n_in && i < 32; i++)
            x[i] = 0.0f;
        if (n_rows > 1)
            for (int i = 0; i < n_in; i++)
                x[n_in + i] *= 1000.0f;
    }
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            wf[i] = rnd_unit() * (1.0f + (float)(o % 3));
        kvs_quantize_row(wt, wf, w + (size_t)o * rb, n_in);
        if (odd_values && wt == KVS_Q8_0) /* -128 never comes out of the quantiser; still valid */
            for (int b = 0; b < n_in / 32; b++)
                ((kvs_block_q8_0 *)(w + (size_t)o * rb))[b].qs[(o + b) % 32] = -128;
        kvs_dequantize_row(wt, w + (size_t)o * rb, wdq + (size_t)o * n_in, n_in);
    }
    kvs_matmul_ref(yr, x, w, wt, n_rows, n_in, n_out);
    const int quant = wt == KVS_Q8_0 || wt == KVS_Q4_0;
    if (quant)
        ref_matmul_qx(yq, yqa, x, w, wt, n_rows, n_in, n_out);

    /* per-output tolerances: sum |x w| (float rounding) and the x-quantisation error bound
     * sum |w| * amax(x block) / 254 (|x - deq(q(x))| <= d / 2, d = amax / 127) */
    double *sabs = malloc((size_t)n_rows * n_out * sizeof(double));
    double *qerr = malloc((size_t)n_rows * n_out * sizeof(double));
    float *bmax = malloc((size_t)(n_in / 32 + 1) * sizeof(float));
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (size_t)r * n_in;
        for (int k = 0; k < n_in; k += 32) {
            float m = 0;
            for (int j = 0; j < 32 && k + j < n_in; j++)
                m = fabsf(xr[k + j]) > m ? fabsf(xr[k + j]) : m;
            bmax[k / 32] = m;
        }
        for (int o = 0; o < n_out; o++) {
            const float *wr = wdq + (size_t)o * n_in;
            double sa = 0, qe = 0;
            for (int k = 0; k < n_in; k++) {
                sa += fabs((double)xr[k] * wr[k]);
                qe += fabs((double)wr[k]) * bmax[k / 32] / 254.0;
            }
            sabs[(size_t)r * n_out + o] = sa;
            qerr[(size_t)r * n_out + o] = qe;
        }
    }
    for (int p = 0; p < n_pools; p++) {
        for (int i = 0; i < n_rows * n_out; i++)
            y[i] = NAN;
        CHECK(kvs_matmul(pools[p], y, x, w, wt, n_rows, n_in, n_out) == KVS_OK);
        int bad = 0;
        double worst = 0;
        for (size_t i = 0; i < (size_t)n_rows * n_out; i++) {
            double err;
            if (!quant) {
                err = fabs((double)y[i] - yr[i]);
                if (!(err <= 1e-5 * sabs[i] + 1e-30))
                    bad++;
            } else {
                err = fabs((double)y[i] - yq[i]); /* same quantised x: float rounding only */
                if (!(err <= 1e-5 * yqa[i] + 1e-30))
                    bad++;
                /* against fp32 x: bounded by the x quantisation error */
                if (!(fabs((double)y[i] - yr[i]) <= qerr[i] * 1.01 + 1e-5 * sabs[i] + 1e-30))
                    bad++;
            }
            if (err > worst || err != err)
                worst = err;
        }
        CHECKF(bad == 0, "matmul %s rows=%d in=%d out=%d threads=%d: %d bad (worst abs err %g)",
               kvs_dtype_name(wt), n_rows, n_in, n_out, pools[p] ? kvs_pool_size(pools[p]) : 0, bad,
               worst);
        n_matmul_cases++;
    }
    free(x);
    free(wf);
    free(w);
    free(y);
    free(yr);
    free(yq);
    free(yqa);
    free(wdq);
    free(sabs);
    free(qerr);
    free(bmax);
}

static void test_matmul(void)
{
    kvs_pool *pools[4] = {NULL, kvs_pool_create(1), kvs_pool_create(2), kvs_pool_create(3)};
    CHECK(pools[1] && pools[2] && pools[3]);
    const kvs_dtype types[] = {KVS_F32, KVS_F16, KVS_BF16, KVS_Q8_0, KVS_Q4_0};
    const int rows[] = {1, 2, 3, 4, 5, 6, 17, 64};
    const int ins[] = {32, 64, 172, 768};
    const int outs[] = {1, 5, 32, 33, 172};
    /* Under ThreadSanitizer every other shape of each list, from the first (the cases after
     * the grid still cover the long rows and many-row tiles). */
    const size_t step = KVS_UNDER_TSAN ? 2 : 1;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t a = 0; a < sizeof rows / sizeof rows[0]; a += step)
            for (size_t b = 0; b < sizeof ins / sizeof ins[0]; b += step)
                for (size_t c = 0; c < sizeof outs / sizeof outs[0]; c += step) {
                    const int quant = types[t] == KVS_Q8_0 || types[t] == KVS_Q4_0;
                    if (quant && ins[b] % 32)
                        continue;
                    /* NULL pool only on a subset to save time */
                    const int first = (a + b + c) % 4 == 0 ? 0 : 1;
                    check_matmul_case(pools + first, 4 - first, types[t], rows[a], ins[b], outs[c], 0);
                }
    /* odd inputs, longer rows, odd block counts, more columns than one panel */
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        check_matmul_case(pools, 4, types[t], 3, 96, 20, 1);
        check_matmul_case(pools, 4, types[t], 9, 96, 50, 1);
        check_matmul_case(pools + 1, 3, types[t], 1, 2048, 40, 1);
        check_matmul_case(pools + 1, 3, types[t], 20, 2048, 97, 0);
        check_matmul_case(pools + 2, 1, types[t], 70, 544, 130, 1);
    }
    check_matmul_case(pools + 1, 3, KVS_F32, 7, 3, 9, 0);   /* n_in < 16 */
    check_matmul_case(pools + 1, 3, KVS_F32, 9, 1100, 50, 0); /* k-chunked panels */
    check_matmul_case(pools + 2, 2, KVS_F16, 12, 2100, 17, 0);
    check_matmul_case(pools + 2, 2, KVS_BF16, 8, 3000, 49, 0);
    check_matmul_case(pools + 1, 3, KVS_F16, 6, 17, 4, 0);
    /* Q8_0 prefill over long rows (256 blocks; AVX2's lane tiles, with a group of 3 x rows at
     * the end) */
    check_matmul_case(pools + 1, 3, KVS_Q8_0, 75, 8192, 5, 1);
    check_matmul_case(pools + 1, 3, KVS_BF16, 1, 1, 3, 0);

    /* n_rows == 0 / n_out == 0 are no-ops */
    float yy = 42.0f, xx = 1.0f, ww = 1.0f;
    CHECK(kvs_matmul(pools[2], &yy, &xx, &ww, KVS_F32, 0, 1, 1) == KVS_OK);
    CHECK(kvs_matmul(pools[2], &yy, &xx, &ww, KVS_F32, 1, 1, 0) == KVS_OK);
    CHECK(yy == 42.0f);
    /* A weight type without a kernel, or a row that is not whole blocks, is refused: y is not
     * written and the caller learns it (the loader admits only supported types, so the forward
     * pass names the tensor if one ever reaches it). */
    float wq[64] = {0}, xq[64] = {0};
    yy = 42.0f;
    CHECK(kvs_matmul(pools[2], &yy, xq, wq, (kvs_dtype)9, 1, 32, 1) == KVS_ERR_UNSUPPORTED);
    CHECK(kvs_matmul(NULL, &yy, xq, wq, (kvs_dtype)9, 1, 32, 1) == KVS_ERR_UNSUPPORTED);
    CHECK(kvs_matmul(pools[2], &yy, xq, wq, KVS_Q8_0, 1, 17, 1) == KVS_ERR_ARG);
    CHECK(kvs_matmul(pools[2], &yy, xq, wq, KVS_F32, -1, 1, 1) == KVS_ERR_ARG);
    CHECK(yy == 42.0f);
    for (int i = 0; i < 4; i++)
        kvs_pool_destroy(pools[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* per-vector ops                                                                             */

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * (fabs(b) + 1e-30); }

static void test_vector_ops(void)
{
    const int sizes[] = {1, 2, 7, 15, 16, 17, 31, 64, 100, 768, 1027};
    float a[1100], b[1100], c[1100], d[1100];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int n = sizes[s];
        for (int i = 0; i < n; i++) {
            a[i] = rnd_unit() * 4.0f;
            b[i] = rnd_unit() * 2.0f;
        }
        /* dot */
        double ref = 0, refabs = 0;
        for (int i = 0; i < n; i++) {
            ref += (double)a[i] * b[i];
            refabs += fabs((double)a[i] * b[i]);
        }
        CHECKF(fabs(kvs_dot_f32(a, b, n) - ref) <= 1e-6 * refabs + 1e-30, "dot n=%d", n);

        /* axpy */
        memcpy(c, a, sizeof(float) * n);
        kvs_axpy_f32(c, 0.75f, b, n);
        int ok = 1;
        for (int i = 0; i < n; i++)
            ok &= fabsf(c[i] - (a[i] + 0.75f * b[i])) <= 1e-6f * (fabsf(a[i]) + fabsf(b[i]));
        CHECKF(ok, "axpy n=%d", n);

        /* half-precision dot and axpy against the scalar conversion */
        uint16_t h[1100];
        for (int i = 0; i < n; i++)
            h[i] = kvs_fp32_to_fp16(a[i]);
        double href = 0, habs = 0;
        for (int i = 0; i < n; i++) {
            href += (double)kvs_fp16_to_fp32(h[i]) * b[i];
            habs += fabs((double)kvs_fp16_to_fp32(h[i]) * b[i]);
        }
        CHECKF(fabs(kvs_dot_f16_f32(h, b, n) - href) <= 1e-6 * habs + 1e-30, "dot f16 n=%d", n);
        memcpy(c, b, sizeof(float) * n);
        kvs_axpy_f16(c, -1.25f, h, n);
        ok = 1;
        for (int i = 0; i < n; i++) {
            float want = b[i] + -1.25f * kvs_fp16_to_fp32(h[i]);
            ok &= fabsf(c[i] - want) <= 1e-6f * (fabsf(b[i]) + fabsf(a[i]) * 1.25f);
        }
        CHECKF(ok, "axpy f16 n=%d", n);

        /* rmsnorm (also in place) */
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += (double)a[i] * a[i];
        const double scale = 1.0 / sqrt(ss / n + 1e-5);
        kvs_rmsnorm(c, a, b, n, 1e-5f);
        memcpy(d, a, sizeof(float) * n);
        kvs_rmsnorm(d, d, b, n, 1e-5f);
        ok = 1;
        for (int i = 0; i < n; i++) {
            const double e = a[i] * scale * b[i];
            ok &= fabs(c[i] - e) <= 1e-5 * fabs(e) + 1e-7;
            ok &= c[i] == d[i];
        }
        CHECKF(ok, "rmsnorm n=%d", n);

        /* softmax */
        memcpy(c, a, sizeof(float) * n);
        for (int i = 0; i < n; i++)
            c[i] *= 10.0f;
        if (n > 3)
            c[2] = -INFINITY; /* masked entry */
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++)
            mx = c[i] > mx ? c[i] : mx;
        for (int i = 0; i < n; i++)
            sum += exp((double)c[i] - mx);
        memcpy(d, c, sizeof(float) * n);
        kvs_softmax(d, n);
        ok = 1;
        double tot = 0;
        for (int i = 0; i < n; i++) {
            const double e = exp((double)c[i] - mx) / sum;
            ok &= fabs(d[i] - e) <= 2e-6 * e + 1e-12;
            tot += d[i];
        }
        ok &= fabs(tot - 1.0) < 1e-5;
        if (n > 3)
            ok &= d[2] == 0.0f;
        CHECKF(ok, "softmax n=%d", n);

        /* swiglu */
        memcpy(c, a, sizeof(float) * n);
        for (int i = 0; i < n; i++)
            c[i] *= 5.0f;
        memcpy(d, c, sizeof(float) * n);
        kvs_swiglu(d, b, n);
        ok = 1;
        for (int i = 0; i < n; i++) {
            const double v = c[i], e = v / (1.0 + exp(-v)) * b[i];
            ok &= fabs(d[i] - e) <= 2e-6 * fabs(e) + 1e-12;
        }
        CHECKF(ok, "swiglu n=%d", n);
    }
    /* softmax of one element, equal elements, large magnitudes */
    float one = 3.0f;
    kvs_softmax(&one, 1);
    CHECK(one == 1.0f);
    float eq[20];
    for (int i = 0; i < 20; i++)
        eq[i] = -1e30f;
    kvs_softmax(eq, 20);
    int ok = 1;
    for (int i = 0; i < 20; i++)
        ok &= close_rel(eq[i], 0.05, 1e-6);
    CHECK(ok);
    /* swiglu extremes: silu(-100) ~ 0, silu(100) = 100 */
    float sa[3] = {-100.0f, 100.0f, 0.0f}, sb[3] = {1.0f, 1.0f, 1.0f};
    kvs_swiglu(sa, sb, 3);
    CHECK(fabsf(sa[0]) < 1e-40f + 4e-42f && sa[1] == 100.0f && sa[2] == 0.0f);
}

/* kvs_abs_below against the plain scan, with one number at fault at every place of rows
 * around the vector width: NaN, infinities, the limit itself, and just under it. */
static void test_abs_below(void)
{
    const size_t ns[] = {0, 1, 15, 16, 17, 33, 100};
    const float lim = 65520.0f;
    const float odd[] = {NAN, INFINITY, -INFINITY, lim, -lim, nextafterf(lim, 0.0f), -1e30f};
    float x[100];
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const size_t n = ns[a];
        for (size_t i = 0; i < n; i++)
            x[i] = (rnd_unit() - 0.5f) * 1000.0f;
        int ok = kvs_abs_below(x, n, lim) == 1 && kvs_abs_below(x, n, INFINITY) == 1;
        for (size_t o = 0; o < sizeof odd / sizeof odd[0]; o++)
            for (size_t at = 0; at < n; at++) {
                const float keep = x[at];
                x[at] = odd[o];
                int want = 1, want_inf = 1;
                for (size_t i = 0; i < n; i++) {
                    want &= fabsf(x[i]) < lim;
                    want_inf &= fabsf(x[i]) < INFINITY;
                }
                ok &= kvs_abs_below(x, n, lim) == want && kvs_abs_below(x, n, INFINITY) == want_inf;
                x[at] = keep;
            }
        CHECKF(ok, "abs_below n=%zu", n);
    }
}

static void test_rope(void)
{
    const int head_dim = 64, n_heads = 3;
    float v[192], orig[192];
    for (int i = 0; i < 192; i++)
        orig[i] = rnd_unit();
    const int positions[] = {0, 1, 5, 511, 2047};
    for (int neox = 0; neox <= 1; neox++)
        for (int rd = 0; rd < 2; rd++) {
            const int rot_dim = rd ? 32 : 64;
            for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
                const int pos = positions[pi];
                memcpy(v, orig, sizeof v);
                kvs_rope(v, n_heads, head_dim, rot_dim, pos, 10000.0f, neox);
                int ok = 1;
                for (int h = 0; h < n_heads; h++) {
                    const float *o = orig + h * head_dim;
                    const float *r = v + h * head_dim;
                    for (int p = 0; p < rot_dim / 2; p++) {
                        const double th = pos * pow(10000.0, -2.0 * p / rot_dim);
                        const int i0 = neox ? p : 2 * p, i1 = neox ? p + rot_dim / 2 : 2 * p + 1;
                        const double e0 = o[i0] * cos(th) - o[i1] * sin(th);
                        const double e1 = o[i0] * sin(th) + o[i1] * cos(th);
                        /* float angle for pos up to 2047: ~pos * 1e-7 rad of error */
                        const double tol = 2e-6 + pos * 2e-7;
                        ok &= fabs(r[i0] - e0) <= tol && fabs(r[i1] - e1) <= tol;
                    }
                    for (int i = rot_dim; i < head_dim; i++)
                        ok &= r[i] == o[i];
                }
                CHECKF(ok, "rope neox=%d rot_dim=%d pos=%d", neox, rot_dim, pos);
            }
        }
    /* llama2.c formula, adjacent mode, float arithmetic: bit-exact expectation */
    memcpy(v, orig, sizeof v);
    kvs_rope(v, n_heads, head_dim, head_dim, 7, 10000.0f, 0);
    int ok = 1;
    for (int i = 0; i < n_heads * head_dim; i += 2) {
        const int hd = i % head_dim;
        const float freq = 1.0f / powf(10000.0f, hd / (float)head_dim);
        const float val = 7 * freq, fcr = cosf(val), fci = sinf(val);
        const float v0 = orig[i], v1 = orig[i + 1];
        ok &= fabsf(v[i] - (v0 * fcr - v1 * fci)) <= 1e-6f && fabsf(v[i + 1] - (v0 * fci + v1 * fcr)) <= 1e-6f;
    }
    CHECK(ok);
    /* The vector paths against the scalar pair loop, bit for bit: every rot_dim from 2 to 160
     * (remainders of both vector widths), heads wider than the rotation, both pairings. */
    enum { HDW = 168 };
    float x[2 * HDW], ref[2 * HDW], c2[HDW / 2], s2[HDW / 2];
    int same = 1;
    for (int rot = 2; rot <= 160; rot += 2)
        for (int neox = 0; neox <= 1; neox++) {
            for (int i = 0; i < rot / 2; i++) {
                c2[i] = rnd_unit() - 0.5f;
                s2[i] = rnd_unit() - 0.5f;
            }
            for (int i = 0; i < 2 * HDW; i++)
                x[i] = ref[i] = rnd_unit() - 0.5f;
            kvs_rope_apply(x, 2, HDW, rot, c2, s2, neox);
            for (int h = 0; h < 2; h++)
                for (int p = 0; p < rot / 2; p++) {
                    float *r = ref + h * HDW;
                    const int i0 = neox ? p : 2 * p, i1 = neox ? p + rot / 2 : 2 * p + 1;
                    const float a = r[i0], b = r[i1];
                    const float ac = a * c2[p], bs = b * s2[p], as = a * s2[p], bc = b * c2[p];
                    r[i0] = ac - bs; /* products apart: no contraction into an FMA */
                    r[i1] = as + bc;
                }
            same &= memcmp(x, ref, sizeof x) == 0;
        }
    CHECKF(same, "rope's vector paths differ from the scalar pair loop");
    /* In two steps (the forward pass's angles once per position): the same bits as kvs_rope,
     * also past kvs_rope's chunk of 128 pairs (rot_dim 384) and with a partial rotation. */
    enum { WIDE = 384 };
    float a[2 * WIDE], b[2 * WIDE], cs[WIDE / 2], sn[WIDE / 2];
    const int rots[] = {WIDE, 256, 64, 2};
    for (size_t r = 0; r < sizeof rots / sizeof rots[0]; r++)
        for (int neox = 0; neox <= 1; neox++)
            for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
                for (int i = 0; i < 2 * WIDE; i++)
                    a[i] = b[i] = rnd_unit();
                kvs_rope(a, 2, WIDE, rots[r], positions[pi], 500000.0f, neox);
                kvs_rope_angles(positions[pi], rots[r], 500000.0f, cs, sn);
                kvs_rope_apply(b, 2, WIDE, rots[r], cs, sn, neox);
                CHECKF(memcmp(a, b, sizeof a) == 0, "rope in two steps: rot_dim %d neox %d pos %d",
                       rots[r], neox, positions[pi]);
            }
}

/* Decode attention's row kernels (kernels_attn.c) against double sums over the fp16 rows:
 * head sizes with a vector path (64, 128) and without (40, 16), contiguous and selected rows,
 * row counts around the prefetch distance and none at all. */
static void test_attn_rows(void)
{
    const int hds[] = {64, 128, 40, 16}, ns[] = {0, 1, 7, 100, 300};
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (int use_sel = 0; use_sel < 2; use_sel++) {
                const int hd = hds[a], n = ns[b], slots = n + 5;
                uint16_t *rows = malloc(sizeof(uint16_t) * (size_t)slots * hd);
                float *q = malloc(sizeof(float) * hd), *p = malloc(sizeof(float) * (n + 1));
                float *scores = malloc(sizeof(float) * (n + 1)), *out = malloc(sizeof(float) * hd);
                int *sel = malloc(sizeof(int) * (n + 1));
                for (int i = 0; i < slots * hd; i++)
                    rows[i] = kvs_fp32_to_fp16(rnd_unit());
                for (int i = 0; i < hd; i++)
                    q[i] = rnd_unit();
                for (int j = 0; j < n; j++) {
                    p[j] = 0.5f + 0.5f * rnd_unit();
                    sel[j] = (int)((unsigned)(j * 7 + 3) % (unsigned)slots);
                }
                const int *s = use_sel ? sel : NULL;
                kvs_dot_rows_f16(scores, rows, s, n, hd, q, 0.125f);
                for (int i = 0; i < hd; i++)
                    out[i] = 1e30f; /* overwritten, not added to */
                kvs_weighted_rows_f16(out, p, rows, s, n, hd);
                int ok_s = 1, ok_o = 1;
                for (int j = 0; j < n; j++) {
                    const uint16_t *r = rows + (size_t)(s ? s[j] : j) * hd;
                    double ref = 0, mag = 0;
                    for (int i = 0; i < hd; i++) {
                        ref += (double)kvs_fp16_to_fp32(r[i]) * q[i];
                        mag += fabs((double)kvs_fp16_to_fp32(r[i]) * q[i]);
                    }
                    ok_s &= fabs(scores[j] - 0.125 * ref) <= 1e-6 * 0.125 * mag + 1e-30;
                }
                for (int i = 0; i < hd; i++) {
                    double ref = 0, mag = 0;
                    for (int j = 0; j < n; j++) {
                        const double v = kvs_fp16_to_fp32(rows[(size_t)(s ? s[j] : j) * hd + i]);
                        ref += p[j] * v;
                        mag += fabs(p[j] * v);
                    }
                    ok_o &= fabs(out[i] - ref) <= 1e-5 * mag + 1e-30;
                }
                CHECKF(ok_s, "dot rows f16 hd=%d n=%d sel=%d", hd, n, use_sel);
                CHECKF(ok_o, "weighted rows f16 hd=%d n=%d sel=%d", hd, n, use_sel);
                free(rows);
                free(q);
                free(p);
                free(scores);
                free(out);
                free(sel);
            }
}

/* kvs_transpose_f32 against the definition: every element in place, the ld gap and everything
 * past the block untouched (whole 8 x 8 blocks, edges of both kinds, single rows / columns). */
static void test_transpose(void)
{
    const int shapes[][2] = {{1, 1}, {1, 9}, {9, 1}, {8, 8}, {7, 9}, {16, 64}, {13, 67}, {24, 20}, {17, 8}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int rows = shapes[k][0], cols = shapes[k][1];
        const size_t ld = (size_t)rows + 5, n = (size_t)cols * ld + 3;
        float *src = malloc(sizeof(float) * (size_t)rows * cols), *dst = malloc(sizeof(float) * n);
        CHECK(src && dst);
        for (int i = 0; i < rows * cols; i++)
            src[i] = (float)i + 0.5f;
        for (size_t i = 0; i < n; i++)
            dst[i] = -1.0f;
        kvs_transpose_f32(dst, ld, src, rows, cols);
        int bad = 0;
        for (int c = 0; c < cols; c++)
            for (size_t r = 0; r < ld; r++) {
                const float want = (int)r < rows ? src[(size_t)r * cols + c] : -1.0f;
                bad += dst[(size_t)c * ld + r] != want;
            }
        for (size_t i = (size_t)cols * ld; i < n; i++)
            bad += dst[i] != -1.0f;
        CHECKF(bad == 0, "transpose %d x %d: %d elements wrong", rows, cols, bad);
        free(src);
        free(dst);
    }
}

int main(void)
{
    test_fp16();
    test_bf16();
    test_quant_layouts();
    test_vector_ops();
    test_attn_rows();
    test_rope();
    test_abs_below();
    test_matmul();
    test_transpose();
    printf("matmul cases: %d\n", n_matmul_cases);
    return check_summary("test_kernels");
}
