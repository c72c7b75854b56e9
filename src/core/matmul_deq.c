/* Matrix products y = x W^T with W in a block type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K,
 * IQ4_NL) and fp32 x: the only product for the types without an integer kernel, and the one
 * every block type uses with exact_matmul (kvs_matmul_ex).
 *
 * Choice of arithmetic: the weights are used as stored, dequantised a span at a time (256
 * elements: one K-quant super-block, or 8 blocks of 32) to fp32 with the vectorised
 * dequantisers of dequant_simd.c, which give exactly the F32 weights GGML's dequantize_row_*
 * gives, and multiplied with the fp32 activations in fp32 FMA. The activations are never
 * quantised. This is more exact than llama.cpp's CPU kernels, which quantise x to Q8_K (blocks
 * of 256) for the K-quants or Q8_0 (blocks of 32) for the others before an integer dot product;
 * it computes what llama.cpp computes on the same weights dequantised to F32 (the `.deq`
 * references of shared/models/arch), up to fp32 summation order, and differs from llama.cpp's
 * native quantised runs by about their activation-quantisation error.
 *
 * Paths (the vector width is picked at compile time: AVX-512 16 lanes, AVX2 + FMA 8 lanes,
 * else scalar code with the same structure):
 *  - gemv (n_rows <= GEMV_MAX_ROWS, decode): each weight row is read once, one span at a time:
 *    the span is dequantised into a 1 KiB buffer (L1) and FMA'd into the accumulators of every
 *    x row (up to 4 rows share one dequantisation), then reduced per output.
 *  - tile (prefill): each thread dequantises a panel of PANEL weight rows x KC elements into its
 *    scratch (row-major fp32, 64 KiB at KC = 1024), then runs register-blocked dot tiles over
 *    it: TR x rows by TC weight rows, TR * TC vector accumulators over the k range, one load of
 *    each operand per TR * TC FMAs; the tile's sums are reduced and added to y per k chunk. The
 *    dequantisation cost is shared by every x row.
 * Threads share the output columns as kernels_matmul.c does (core/worksplit.h), or static
 * slices of the rows when there are too few columns to go around.
 *
 * Cost of the fp32 choice, measured on the development VM (AMD EPYC, AVX-512, shared and noisy:
 * ranges over runs), 1536 x 2048 weights, one thread: prefill (512 rows) 105-130 GFLOP/s for
 * every type (the F32 tile kernel of kernels_matmul.c: 175-195; Q8_0 / Q4_0 with 8-bit x:
 * 490-580); decode (1 row) 3-7 GB/s of weight bytes (Q8_0: 32-38). Decode is bound by widening,
 * converting and scaling every quant to fp32 (the dequantiser takes most of the profile); the
 * integer kernels multiply the quants as bytes. */
#include <stdlib.h>
#include <string.h>

#include "dequant.h"
#include "kernels_internal.h"
#include "worksplit.h"

#if KVS_AVX512 || KVS_AVX2
#include <immintrin.h>
#endif

#define SPAN 256          /* elements dequantised at once (whole blocks of every type) */
#define GEMV_MAX_ROWS 4   /* x rows per gemv pass; more rows use the tiles */
#define PANEL 16          /* weight rows per dequantised tile panel */
#define KC 1024           /* k chunk of a panel (a multiple of SPAN) */


/* ---- vector abstraction ------------------------------------------------------------------- */
#if KVS_AVX512
typedef __m512 vf;
#define VL 16
#define TR 4 /* x rows per tile */
#define TC 4 /* weight rows per tile: 16 zmm accumulators + 8 operands */
KVS_INLINE vf vzero(void) { return _mm512_setzero_ps(); }
KVS_INLINE vf vload(const float *p) { return _mm512_loadu_ps(p); }
KVS_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
KVS_INLINE vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
KVS_INLINE float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif KVS_AVX2
typedef __m256 vf;
#define VL 8
#define TR 2
#define TC 4 /* 8 ymm accumulators + 6 operands of 16 registers */
KVS_INLINE vf vzero(void) { return _mm256_setzero_ps(); }
KVS_INLINE vf vload(const float *p) { return _mm256_loadu_ps(p); }
KVS_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
KVS_INLINE vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
KVS_INLINE float vsum(vf v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#else
typedef float vf;
#define VL 1
#define TR 4
#define TC 4
KVS_INLINE vf vzero(void) { return 0.0f; }
KVS_INLINE vf vload(const float *p) { return *p; }
KVS_INLINE vf vfma(vf a, vf b, vf c) { return c + a * b; }
KVS_INLINE vf vadd(vf a, vf b) { return a + b; }
KVS_INLINE float vsum(vf v) { return v; }
#endif

/* Keeps a loaded operand in a register (KVS_KEEP_REG): without it GCC folds the load into every
 * FMA that uses it (4 loads of each weight vector per k step in the 4 x 4 tile), which made the
 * tile kernel load-bound at half the FMA rate. */
#define KEEP_REG(v) KVS_KEEP_REG(v)

/* Every span and k chunk is a multiple of 32 elements (the smallest block), hence of VL and of
 * 2 * VL (the two accumulators per row of the gemv). */
_Static_assert(32 % (2 * VL) == 0, "vector length must divide half a block");

typedef struct {
    float *y;
    const float *x;
    const char *w;
    kvs_dtype wt;
    int n_rows, n_in, n_out;
    size_t row_bytes, bb; /* bytes of a weight row, of a block */
    int be;               /* elements per block */
    kvs_dequant_fn deq;   /* the vectorised dequantiser of wt */
    int tile;             /* 0: gemv, 1: tile */
    char *scratch;        /* per-thread panels (tile path) */
    size_t scratch_bytes; /* per thread */
    int unit, by_rows;    /* columns in units; by_rows: a static split of the rows */
    kvs_split split;      /* the column units among the threads (core/worksplit.h) */
} dq_ctx;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Elements [k0, k0 + n) of weight row o, dequantised to out (k0 and n whole blocks). */
static void deq_span(const dq_ctx *c, int o, int k0, int n, float *out)
{
    const char *src = c->w + (size_t)o * c->row_bytes + (size_t)(k0 / c->be) * c->bb;
    c->deq(src, out, n / c->be);
}

/* ---- gemv ---------------------------------------------------------------------------------- */

KVS_INLINE void gemv_nr(const dq_ctx *c, int NR, int r0, int o0, int o1)
{
    const int K = c->n_in;
    _Alignas(64) float buf[SPAN];
    const float *xr[GEMV_MAX_ROWS];
    KVS_UNROLL
    for (int r = 0; r < NR; r++)
        xr[r] = c->x + (size_t)(r0 + r) * K;
    for (int o = o0; o < o1; o++) {
        /* 4 accumulators per row: with 2 the FMA latency chain bounded a single-row pass */
        vf acc[GEMV_MAX_ROWS][4];
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = vzero();
        for (int k0 = 0; k0 < K; k0 += SPAN) {
            const int n = K - k0 < SPAN ? K - k0 : SPAN;
            deq_span(c, o, k0, n, buf);
            int k = 0;
            for (; k + 4 * VL <= n; k += 4 * VL) {
                vf wv[4];
                KVS_UNROLL
                for (int j = 0; j < 4; j++)
                    wv[j] = vload(buf + k + j * VL);
                KVS_UNROLL
                for (int r = 0; r < NR; r++)
                    KVS_UNROLL
                    for (int j = 0; j < 4; j++)
                        acc[r][j] = vfma(vload(xr[r] + k0 + k + j * VL), wv[j], acc[r][j]);
            }
            for (; k < n; k += 2 * VL) { /* a tail of 32 (blocks of 32) */
                const vf w0 = vload(buf + k), w1 = vload(buf + k + VL);
                KVS_UNROLL
                for (int r = 0; r < NR; r++) {
                    acc[r][0] = vfma(vload(xr[r] + k0 + k), w0, acc[r][0]);
                    acc[r][1] = vfma(vload(xr[r] + k0 + k + VL), w1, acc[r][1]);
                }
            }
        }
        KVS_UNROLL
        for (int r = 0; r < NR; r++)
            c->y[(size_t)(r0 + r) * c->n_out + o] =
                vsum(vadd(vadd(acc[r][0], acc[r][1]), vadd(acc[r][2], acc[r][3])));
    }
}

static KVS_NOINLINE void gemv_rows(const dq_ctx *c, int r0, int r1, int o0, int o1)
{
    for (int r = r0; r < r1; r += GEMV_MAX_ROWS) {
        switch (r1 - r) {
        case 1: gemv_nr(c, 1, r, o0, o1); break;
        case 2: gemv_nr(c, 2, r, o0, o1); break;
        case 3: gemv_nr(c, 3, r, o0, o1); break;
        default: gemv_nr(c, 4, r, o0, o1); break;
        }
    }
}

/* ---- tiles --------------------------------------------------------------------------------- */

/* y[r][j] (+)= x[r][k0..k0+n) . wp[j][0..n) for R x rows (stride ldx, starting at element k0)
 * and C panel rows (stride ldw). */
KVS_INLINE void dot_tile(int R, int C, const float *x, size_t ldx, const float *wp, size_t ldw,
                         int n, float *y, size_t ldy, int accumulate)
{
    vf acc[TR][TC];
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++)
            acc[i][j] = vzero();
    for (int k = 0; k < n; k += VL) {
        vf xv[TR];
        KVS_UNROLL
        for (int i = 0; i < R; i++) {
            xv[i] = vload(x + (size_t)i * ldx + k);
            KEEP_REG(xv[i]);
        }
        KVS_UNROLL
        for (int j = 0; j < C; j++) {
            vf wv = vload(wp + (size_t)j * ldw + k);
            KEEP_REG(wv);
            KVS_UNROLL
            for (int i = 0; i < R; i++)
                acc[i][j] = vfma(xv[i], wv, acc[i][j]);
        }
    }
    KVS_UNROLL
    for (int i = 0; i < R; i++)
        KVS_UNROLL
        for (int j = 0; j < C; j++) {
            const float s = vsum(acc[i][j]);
            y[(size_t)i * ldy + j] = accumulate ? y[(size_t)i * ldy + j] + s : s;
        }
}

typedef void (*tile_fn)(const float *, size_t, const float *, size_t, int, float *, size_t, int);
#define DEF_TILE(R, C)                                                                          \
    static KVS_NOINLINE void tile_##R##_##C(const float *x, size_t ldx, const float *wp,        \
                                            size_t ldw, int n, float *y, size_t ldy, int acc)   \
    {                                                                                           \
        dot_tile(R, C, x, ldx, wp, ldw, n, y, ldy, acc);                                        \
    }
#define DEF_TILE_R(R) DEF_TILE(R, 1) DEF_TILE(R, 2) DEF_TILE(R, 3) DEF_TILE(R, 4)
DEF_TILE_R(1)
DEF_TILE_R(2)
#if TR > 2
DEF_TILE_R(3)
DEF_TILE_R(4)
#endif
static const tile_fn tile_table[TR][TC] = {
    {tile_1_1, tile_1_2, tile_1_3, tile_1_4},
    {tile_2_1, tile_2_2, tile_2_3, tile_2_4},
#if TR > 2
    {tile_3_1, tile_3_2, tile_3_3, tile_3_4},
    {tile_4_1, tile_4_2, tile_4_3, tile_4_4},
#endif
};

/* Row stride of a panel (floats). */
static size_t panel_ld(int K) { return (size_t)(K < KC ? K : KC); }

static void tile_rows(const dq_ctx *c, float *panel, int r0, int r1, int o0, int o1)
{
    const int K = c->n_in;
    const size_t ldw = panel_ld(K);
    for (int o = o0; o < o1; o += PANEL) {
        const int np = o1 - o < PANEL ? o1 - o : PANEL;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int n = K - k0 < KC ? K - k0 : KC;
            for (int j = 0; j < np; j++)
                for (int s = 0; s < n; s += SPAN)
                    deq_span(c, o + j, k0 + s, n - s < SPAN ? n - s : SPAN, panel + (size_t)j * ldw + s);
            for (int r = r0; r < r1; r += TR) {
                const int R = r1 - r < TR ? r1 - r : TR;
                for (int j = 0; j < np; j += TC) {
                    const int C = np - j < TC ? np - j : TC;
                    tile_table[R - 1][C - 1](c->x + (size_t)r * K + k0, (size_t)K,
                                             panel + (size_t)j * ldw, ldw, n,
                                             c->y + (size_t)r * c->n_out + o + j, (size_t)c->n_out,
                                             k0 > 0);
                }
            }
        }
    }
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static void run_range(const dq_ctx *c, char *scratch, int r0, int r1, int o0, int o1)
{
    if (c->tile)
        tile_rows(c, (float *)scratch, r0, r1, o0, o1);
    else
        gemv_rows(c, r0, r1, o0, o1);
}

static void dq_task(void *p, int ith, int nth)
{
    dq_ctx *c = p;
    char *scratch = c->scratch + (size_t)ith * c->scratch_bytes;
    if (c->by_rows) { /* few columns, many rows: a static slice of the rows each */
        const int r0 = (int)((int64_t)c->n_rows * ith / nth);
        const int r1 = (int)((int64_t)c->n_rows * (ith + 1) / nth);
        if (r0 < r1)
            run_range(c, scratch, r0, r1, 0, c->n_out);
        return;
    }
    int u0, u1;
    while (kvs_split_next(&c->split, ith, &u0, &u1)) {
        const int o0 = u0 * c->unit, o1 = u1 * c->unit < c->n_out ? u1 * c->unit : c->n_out;
        run_range(c, scratch, 0, c->n_rows, o0, o1);
    }
}

kvs_status kvs_matmul_deq(kvs_pool *pool, float *y, const float *x, const void *w, kvs_dtype wt,
                          int n_rows, int n_in, int n_out)
{
    uint64_t row_bytes; /* n_in is whole blocks: kvs_matmul checked it */
    const kvs_dequant_fn deq = kvs_dequantize_fn(wt);
    if (!deq)
        return KVS_ERR_UNSUPPORTED;
    if (kvs_dtype_bytes(wt, (uint64_t)n_in, &row_bytes) != 0)
        return KVS_ERR_ARG;
    const int nth = pool ? kvs_pool_size(pool) : 1;
    dq_ctx c;
    memset(&c, 0, sizeof c);
    c.y = y;
    c.x = x;
    c.w = w;
    c.wt = wt;
    c.n_rows = n_rows;
    c.n_in = n_in;
    c.n_out = n_out;
    c.row_bytes = (size_t)row_bytes;
    c.bb = kvs_dtype_block_bytes(wt);
    c.be = (int)kvs_dtype_block_elems(wt);
    c.deq = deq;
    c.tile = n_rows > GEMV_MAX_ROWS;
    c.unit = c.tile ? PANEL : 4;

    char *owned = NULL;
    if (c.tile) {
        c.scratch_bytes = align64((size_t)PANEL * panel_ld(n_in) * sizeof(float));
        const size_t total = c.scratch_bytes * (size_t)nth;
        c.scratch = pool ? kvs_pool_scratch(pool, total) : (owned = aligned_alloc(64, total));
        if (!c.scratch)
            return KVS_ERR_NOMEM;
    }
    const int col_units = (n_out + c.unit - 1) / c.unit;
    c.by_rows = kvs_split_by_rows(col_units, n_rows, nth);
    kvs_split_init(&c.split, col_units, nth, kvs_split_grain(col_units, nth, 0));
    if (pool)
        kvs_pool_run(pool, dq_task, &c);
    else
        dq_task(&c, 0, 1);
    free(owned);
    return KVS_OK;
}
