/* The non-linear two-party gates (src/mpc/gates_nl.c) against their plaintext emulators
 * (src/mpc/fxp_nl.c), bit for bit, at 12 and 16 fraction bits: the three roles run in one
 * process (kvs_mpc_run_local, plain channels) on random and edge inputs; the opened outputs are
 * compared with the emulator, each gate's rounds, bytes sent and dealer bytes with their
 * formulas, and, separately, the emulators with the true functions (in double) within the
 * error bounds documented in gates_nl.h. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "mpc/fss.h"
#include "mpc/fxp.h"
#include "mpc/fxp_nl.h"
#include "mpc/gates.h"
#include "mpc/gates_nl.h"
#include "mpc/local.h"

enum { NMAX = 320, NRAND = 200 };

typedef kvs_status (*gate_fn)(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n,
                              uint64_t *out, kvs_error *err);
typedef uint64_t (*emu_fn)(uint64_t x, int frac);

/* Public random tables for the lookups (filled before the runs, read-only in them). */
static uint64_t table5[1 << 5], table11[1 << 11], table16[1 << 16];

static kvs_status lut5(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                       kvs_error *err)
{
    return kvs_mpc_lut(m, op, x, n, 5, kvs_mpc_is_dealer(m) ? NULL : table5, out, err);
}
static kvs_status lut11(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                        kvs_error *err)
{
    return kvs_mpc_lut(m, op, x, n, 11, table11, out, err);
}
static kvs_status lut16(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                        kvs_error *err)
{
    return kvs_mpc_lut(m, op, x, n, 16, table16, out, err);
}
static uint64_t emu_lut5(uint64_t x, int frac)
{
    (void)frac;
    return kvs_fxnl_lut(x, 5, table5);
}
static uint64_t emu_lut11(uint64_t x, int frac)
{
    (void)frac;
    return kvs_fxnl_lut(x, 11, table11);
}
static uint64_t emu_lut16(uint64_t x, int frac)
{
    (void)frac;
    return kvs_fxnl_lut(x, 16, table16);
}

enum { G_LUT5, G_LUT11, G_LUT16, G_EXP, G_RECIP, G_SILU, G_RSQRT, G_N };

/* exp over the whole ring (its inputs reach -2^61); SiLU at the forward pass's narrower width
 * (its inputs stay within 2^28 < 2^(f + 19) for f >= 10) */
static kvs_status exp64(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n, uint64_t *out,
                        kvs_error *err)
{
    return kvs_mpc_exp_neg(m, op, x, n, 64, out, err);
}

static kvs_status silu_narrow(kvs_mpc *m, kvs_mpc_op op, const uint64_t *x, size_t n,
                              uint64_t *out, kvs_error *err)
{
    return kvs_mpc_silu(m, op, x, n, KVS_MPC_SILU_BITS(m->frac), out, err);
}

static const struct gate_desc {
    const char *name;
    gate_fn gate;
    emu_fn emu;
} gates[G_N] = {
    {"lut5", lut5, emu_lut5},
    {"lut11", lut11, emu_lut11},
    {"lut16", lut16, emu_lut16},
    {"exp_neg", exp64, kvs_fxnl_exp_neg},
    {"recip", kvs_mpc_recip, kvs_fxnl_recip},
    {"silu", silu_narrow, kvs_fxnl_silu},
    {"rsqrt", kvs_mpc_rsqrt, kvs_fxnl_rsqrt},
};

/* What one party saw of one gate. */
typedef struct gate_cost {
    uint64_t rounds, sent, dealer;
} gate_cost;

typedef struct nl_ctx {
    uint64_t x[G_N][NMAX];
    size_t n[G_N];
    uint64_t out[2][G_N][NMAX];
    gate_cost cost[2][G_N];
} nl_ctx;

static void stats_sum(const kvs_chan_stats *s, uint64_t *rounds, uint64_t *sent)
{
    *rounds = *sent = 0;
    for (int op = 0; op < KVS_OP_N; op++) {
        *rounds += s->rounds[op];
        *sent += s->sent_payload[op];
    }
}

static kvs_status program(kvs_mpc *m, void *vctx, kvs_error *err)
{
    nl_ctx *c = vctx;
    const int party = !kvs_mpc_is_dealer(m);
    static _Thread_local uint64_t sh[NMAX], y[NMAX];
    kvs_status st = KVS_OK;
    for (int g = 0; g < G_N && st == KVS_OK; g++) {
        const size_t n = c->n[g];
        st = kvs_mpc_input(m, 0, m->role == KVS_MPC_P0 ? c->x[g] : NULL, n, sh, err);
        /* the input's send is buffered: flush it, since the gate may first wait for the dealer
         * (which may be blocked on party 1, which waits for this input) */
        if (st == KVS_OK && m->role == KVS_MPC_P0)
            st = kvs_chan_flush(m->peer, err);
        kvs_chan_stats s;
        uint64_t r0 = 0, b0 = 0, r1, b1;
        const uint64_t d0 = m->dealer_bytes;
        if (party) {
            kvs_chan_stats_get(m->peer, &s);
            stats_sum(&s, &r0, &b0);
        }
        /* odd gates in place (x aliasing out) */
        if (st == KVS_OK)
            st = gates[g].gate(m, KVS_OP_LUT, party ? sh : NULL, n,
                               party ? (g % 2 ? sh : y) : NULL, err);
        if (st == KVS_OK && party) {
            kvs_chan_stats_get(m->peer, &s);
            stats_sum(&s, &r1, &b1);
            c->cost[m->role][g] = (gate_cost){r1 - r0, b1 - b0, m->dealer_bytes - d0};
            st = kvs_mpc_open(m, KVS_OP_OPEN, g % 2 ? sh : y, n, c->out[m->role][g], err);
        }
    }
    return st;
}

static void put(nl_ctx *c, int g, int64_t v)
{
    if (c->n[g] < NMAX)
        c->x[g][c->n[g]++] = (uint64_t)v;
}

/* log-uniform in [lo, hi) (fixed point integers), lo >= 1 */
static int64_t log_uniform(kvs_xoshiro *r, int64_t lo, int64_t hi)
{
    const double u = (double)(kvs_xoshiro_next(r) >> 11) / 9007199254740992.0;
    int64_t v = (int64_t)exp(log((double)lo) + u * (log((double)hi) - log((double)lo)));
    return v < lo ? lo : v >= hi ? hi - 1 : v;
}

static void make_inputs(nl_ctx *c, int f, kvs_xoshiro *r)
{
    memset(c->n, 0, sizeof c->n);
    const int64_t one = (int64_t)1 << f;
    /* lookups: edges of the index range, then random 64-bit values */
    const int lbits[3] = {5, 11, 16};
    for (int k = 0; k < 3; k++) {
        const int g = G_LUT5 + k;
        const int64_t top = (int64_t)1 << lbits[k];
        const int64_t e[] = {0, 1, top - 1, top, top + 1, -1, -top, INT64_MAX, INT64_MIN};
        for (size_t i = 0; i < sizeof e / sizeof *e; i++)
            put(c, g, e[i]);
        for (int i = 0; i < (k == 2 ? 8 : NRAND); i++)
            put(c, g, (int64_t)kvs_xoshiro_next(r));
    }
    /* exp: 0, the clip boundary and beyond, the cell boundaries, very negative values */
    const int64_t cell = (int64_t)1 << (f - 6), lo = -16 * one;
    const int64_t ee[] = {0, -1, -cell, -cell - 1, -cell + 1, -one, -one - 1, lo, lo + 1,
                          lo - 1, lo - cell, lo + cell, lo - 1000, -((int64_t)1 << 40),
                          -((int64_t)1 << 61), -8 * one};
    for (size_t i = 0; i < sizeof ee / sizeof *ee; i++)
        put(c, G_EXP, ee[i]);
    for (int i = 0; i < NRAND; i++)
        put(c, G_EXP, -(int64_t)(kvs_xoshiro_next(r) % (uint64_t)(17 * one)));
    /* recip: 1, 2^j - 1, 2^j, 2^j + 1 (ulps), the largest input */
    put(c, G_RECIP, one);
    put(c, G_RECIP, one + 1);
    for (int j = 1; j < KVS_FXNL_RECIP_MAXEXP; j++)
        for (int d = -1; d <= 1; d++)
            put(c, G_RECIP, ((int64_t)1 << (j + f)) + d);
    put(c, G_RECIP, ((int64_t)1 << (KVS_FXNL_RECIP_MAXEXP + f)) - 1);
    for (int i = 0; i < NRAND / 2; i++)
        put(c, G_RECIP, log_uniform(r, one, (int64_t)1 << (KVS_FXNL_RECIP_MAXEXP + f)));
    /* silu: 0, +-1, the clip boundaries and just beyond, far outside, random in [-12, 12] */
    const int64_t s8 = 8 * one;
    const int64_t se[] = {0, 1, -1, one, -one, s8, s8 - 1, s8 + 1, -s8, -s8 - 1, -s8 + 1,
                          s8 - cell, -s8 + cell, 100 * one, -100 * one, (int64_t)1 << 28,
                          -((int64_t)1 << 28)};
    for (size_t i = 0; i < sizeof se / sizeof *se; i++)
        put(c, G_SILU, se[i]);
    for (int i = 0; i < NRAND; i++)
        put(c, G_SILU, (int64_t)(kvs_xoshiro_next(r) % (uint64_t)(24 * one)) - 12 * one);
    /* rsqrt: the smallest input (one ulp), 2^j - 1, 2^j, 2^j + 1, the largest */
    put(c, G_RSQRT, 1);
    put(c, G_RSQRT, 2);
    for (int j = -f + 1; j < KVS_FXNL_RSQRT_MAXEXP; j++)
        for (int d = -1; d <= 1; d++)
            if (j + f > 1 || d >= 0)
                put(c, G_RSQRT, ((int64_t)1 << (j + f)) + d);
    put(c, G_RSQRT, ((int64_t)1 << (KVS_FXNL_RSQRT_MAXEXP + f)) - 1);
    while (c->n[G_RSQRT] < (size_t)(100 + 3 * (f + 20)))
        put(c, G_RSQRT, log_uniform(r, 1, (int64_t)1 << (KVS_FXNL_RSQRT_MAXEXP + f)));
}

/* The expected costs of each gate for party b (online rounds, bytes sent, dealer bytes). */
static gate_cost expected(int g, int f, size_t n, int b)
{
    const uint64_t cmp = kvs_dcf_key_bytes(63);
    /* the narrower sign tests: SiLU's (f + 20 bits), recip's and rsqrt's (f + 21) */
    const uint64_t cmp_s = kvs_dcf_key_bytes(f + 19), cmp_r = kvs_dcf_key_bytes(f + 20);
    const uint64_t by_s = (uint64_t)(f + 20 + 7) / 8, by_r = (uint64_t)(f + 21 + 7) / 8;
    const uint64_t w = b ? 8 : 0; /* party 1's word per triple / truncation */
    const uint64_t wrap = w;      /* a truncation's wrap: the mask's top bit, a word */
    gate_cost c = {0, 0, 0};
    if (g <= G_LUT16) {
        const int bits = g == G_LUT5 ? 5 : g == G_LUT11 ? 11 : 16;
        c.rounds = 1;
        c.sent = (uint64_t)(bits + 7) / 8;
        c.dealer = kvs_dpf_key_bytes(bits);
    } else if (g == G_EXP) {
        /* max2 (sign test + select), truncation by f - 6, 11-bit lookup */
        c.rounds = 4;
        c.sent = 8 + 16 + 8 + 2;
        c.dealer = cmp + w + w + kvs_dcf_key_bytes(f - 6) + wrap + w + kvs_dpf_key_bytes(11);
    } else if (g == G_SILU) {
        /* two sign tests, two products, truncation by f - 6, 10-bit lookup, product,
         * truncation by f */
        c.rounds = 6;
        c.sent = 2 * by_s + 32 + 8 + 2 + 16 + 8;
        c.dealer = 2 * (cmp_s + w) + 2 * w + kvs_dcf_key_bytes(f - 6) + wrap + w +
                   kvs_dpf_key_bytes(10) + w + kvs_dcf_key_bytes(f) + wrap + w;
    } else if (g == G_RECIP) {
        const uint64_t it = (uint64_t)kvs_fxnl_recip_iters(f);
        c.rounds = 1 + 4 * it;
        c.sent = by_r * 20 + it * (16 + 8 + 16 + 8);
        c.dealer = 20 * (cmp_r + w) + it * (2 * w + 2 * (kvs_dcf_key_bytes(f) + wrap + w));
    } else {
        const uint64_t it = (uint64_t)kvs_fxnl_rsqrt_iters(f), k = (uint64_t)f + 20;
        c.rounds = 1 + 5 * it;
        c.sent = by_r * k + it * (3 * 16 + 2 * 8);
        c.dealer = k * (cmp_r + w) + it * (3 * w + kvs_dcf_key_bytes(2 * f) + wrap + w +
                                         kvs_dcf_key_bytes(f + 1) + wrap + w);
    }
    c.sent *= n;
    c.dealer *= n;
    return c;
}

static void run_frac(int f, kvs_xoshiro *r)
{
    static nl_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    make_inputs(&ctx, f, r);
    kvs_mpc_local_cfg cfg = {.frac = f, .insecure_plain = 1,
                             .corr_seed = {{1, (uint8_t)f}, {2}}, .own_seed = {{3}, {4}, {5}}};
    kvs_mpc_local_result res[3];
    kvs_error err = {0};
    const kvs_status st = kvs_mpc_run_local(program, &ctx, &cfg, res, &err);
    CHECKF(st == KVS_OK, "frac %d: %s (p1: %s; dealer: %s)", f, err.msg, res[1].msg, res[2].msg);
    if (st != KVS_OK)
        return;
    for (int g = 0; g < G_N; g++) {
        const size_t n = ctx.n[g];
        size_t bad = 0, first = n, same = 1;
        for (size_t i = 0; i < n; i++) {
            const uint64_t want = gates[g].emu(ctx.x[g][i], f);
            same &= ctx.out[0][g][i] == ctx.out[1][g][i];
            if (ctx.out[0][g][i] != want) {
                bad++;
                first = first < n ? first : i;
            }
        }
        CHECKF(bad == 0, "frac %d %s: %zu of %zu differ from the emulator, first x = %lld: "
               "gate %lld, emulator %lld", f, gates[g].name, bad, n,
               first < n ? (long long)ctx.x[g][first] : 0LL,
               first < n ? (long long)ctx.out[0][g][first] : 0LL,
               first < n ? (long long)gates[g].emu(ctx.x[g][first], f) : 0LL);
        CHECKF(same, "frac %d %s: the parties opened different values", f, gates[g].name);
        for (int b = 0; b < 2; b++) {
            const gate_cost got = ctx.cost[b][g], want = expected(g, f, n, b);
            CHECKF(got.rounds == want.rounds && got.sent == want.sent &&
                       got.dealer == want.dealer,
                   "frac %d %s party %d: %llu rounds, %llu bytes sent, %llu dealer bytes; "
                   "expected %llu, %llu, %llu", f, gates[g].name, b,
                   (unsigned long long)got.rounds, (unsigned long long)got.sent,
                   (unsigned long long)got.dealer, (unsigned long long)want.rounds,
                   (unsigned long long)want.sent, (unsigned long long)want.dealer);
        }
        printf("frac %d %-7s n %3zu: %2llu rounds, %3llu bytes/value sent, dealer %llu / %llu "
               "bytes/value\n", f, gates[g].name, n, (unsigned long long)ctx.cost[0][g].rounds,
               (unsigned long long)(ctx.cost[0][g].sent / n),
               (unsigned long long)(ctx.cost[0][g].dealer / n),
               (unsigned long long)(ctx.cost[1][g].dealer / n));
    }
}

/* The emulators against the true functions over dense sweeps and random inputs: the worst
 * ratio of the error to its documented bound must stay <= 1. */
typedef struct err_stat {
    double max_abs, max_ratio, at;
} err_stat;

static void note(err_stat *e, double x, double got, double truth, double bound)
{
    const double d = fabs(got - truth);
    if (d > e->max_abs)
        e->max_abs = d;
    if (d / bound > e->max_ratio) {
        e->max_ratio = d / bound;
        e->at = x;
    }
}

static void check_accuracy(int f, kvs_xoshiro *r)
{
    const double ulp = ldexp(1.0, -f);
    const int64_t one = (int64_t)1 << f;
    err_stat ex = {0}, rc = {0}, rc_rel = {0}, rc_rel4 = {0}, si = {0}, rs = {0}, rs_rel = {0};
    /* exp: every input in [-17, 0] at f = 12, every 3rd at f = 16 */
    for (int64_t v = 0; v >= -17 * one; v -= f > 12 ? 3 : 1) {
        const double x = (double)v * ulp;
        const double got = kvs_fx_decode(kvs_fxnl_exp_neg((uint64_t)v, f), f);
        note(&ex, x, got, exp(x), exp(x < -16 ? -16 : x) * 0.00785 + ulp / 2);
    }
    const int64_t far[] = {-((int64_t)1 << 40), -((int64_t)1 << 61)};
    for (int i = 0; i < 2; i++)
        note(&ex, (double)far[i] * ulp, kvs_fx_decode(kvs_fxnl_exp_neg((uint64_t)far[i], f), f),
             0.0, exp(-16) * 0.00785 + ulp / 2);
    /* silu: every input in [-12, 12] at f = 12, every 3rd at 16; far outside */
    for (int64_t v = -12 * one; v <= 12 * one; v += f > 12 ? 3 : 1) {
        const double x = (double)v * ulp;
        note(&si, x, kvs_fx_decode(kvs_fxnl_silu((uint64_t)v, f), f), x / (1 + exp(-x)),
             2.8e-3 + 5 * ulp);
    }
    for (int64_t v = 12; v < ((int64_t)1 << 28); v = v * 3 / 2)
        for (int s = -1; s <= 1; s += 2) {
            const double x = (double)(s * v * one) * ulp;
            note(&si, x, kvs_fx_decode(kvs_fxnl_silu((uint64_t)(s * v * one), f), f),
                 x / (1 + exp(-x)), 2.8e-3 + 5 * ulp);
        }
    /* recip and rsqrt: every input in [1, 4) and log-uniform over the range */
    for (int64_t v = one; v < 4 * one; v++) {
        const double x = (double)v * ulp;
        const double got = kvs_fx_decode(kvs_fxnl_recip((uint64_t)v, f), f);
        note(&rc, x, got, 1 / x, ldexp(1.0 / x, -(f - 2)) + 2 * ulp);
        note(v < 2 * one ? &rc_rel : &rc_rel4, x, got * x, 1.0, 1.0);
    }
    for (int i = 0; i < 30000; i++) {
        const int64_t v = log_uniform(r, one, (int64_t)1 << (20 + f));
        const double x = (double)v * ulp;
        note(&rc, x, kvs_fx_decode(kvs_fxnl_recip((uint64_t)v, f), f), 1 / x,
             ldexp(1.0 / x, -(f - 2)) + 2 * ulp);
    }
    for (int64_t v = 1; v < 4 * one; v++) {
        const double x = (double)v * ulp, t = 1 / sqrt(x);
        const double got = kvs_fx_decode(kvs_fxnl_rsqrt((uint64_t)v, f), f);
        note(&rs, x, got, t, ldexp(t, -(f - 3)) + 2 * ulp);
        if (v >= one)
            note(&rs_rel, x, got / t, 1.0, 1.0);
    }
    for (int i = 0; i < 30000; i++) {
        const int64_t v = log_uniform(r, 1, (int64_t)1 << (20 + f));
        const double x = (double)v * ulp, t = 1 / sqrt(x);
        note(&rs, x, kvs_fx_decode(kvs_fxnl_rsqrt((uint64_t)v, f), f), t,
             ldexp(t, -(f - 3)) + 2 * ulp);
    }
    const struct {
        const char *name;
        const err_stat *e;
    } rows[] = {{"exp_neg", &ex}, {"silu", &si}, {"recip", &rc}, {"rsqrt", &rs}};
    for (int i = 0; i < 4; i++) {
        CHECKF(rows[i].e->max_ratio <= 1.0, "frac %d %s: error %.3g times its bound at x = %g",
               f, rows[i].name, rows[i].e->max_ratio, rows[i].e->at);
        printf("frac %d %-7s max |error| %.3e (%.2f ulp), worst error / bound %.3f at x = %g\n",
               f, rows[i].name, rows[i].e->max_abs, rows[i].e->max_abs / ulp,
               rows[i].e->max_ratio, rows[i].e->at);
    }
    /* relative error: below 2^-(f-2) for recip on [1, 2) (on [2, 4) 1/x is under 2^(f-1) ulps,
     * so the output's own resolution exceeds it), below 2^-(f-3) for rsqrt on [1, 4) */
    printf("frac %d recip max relative error on [1, 2) %.3e (2^%.1f), on [2, 4) %.3e (2^%.1f); "
           "rsqrt on [1, 4) %.3e (2^%.1f)\n", f, rc_rel.max_abs, log2(rc_rel.max_abs),
           rc_rel4.max_abs, log2(rc_rel4.max_abs), rs_rel.max_abs, log2(rs_rel.max_abs));
    CHECKF(rc_rel.max_abs < ldexp(1.0, -(f - 2)), "recip relative error on [1, 2)");
    CHECKF(rs_rel.max_abs < ldexp(1.0, -(f - 3)), "rsqrt relative error on [1, 4)");
}

int main(void)
{
    kvs_xoshiro r;
    kvs_xoshiro_seed(&r, 2024);
    for (size_t i = 0; i < sizeof table5 / sizeof *table5; i++)
        table5[i] = kvs_xoshiro_next(&r);
    for (size_t i = 0; i < sizeof table11 / sizeof *table11; i++)
        table11[i] = kvs_xoshiro_next(&r);
    for (size_t i = 0; i < sizeof table16 / sizeof *table16; i++)
        table16[i] = kvs_xoshiro_next(&r);
    /* the tables: the exp table at index 0 is 1 and decreasing below it; the sigmoid table
     * runs from 0 to 1 through 1/2 */
    uint64_t te[1 << KVS_FXNL_EXP_BITS], ts[1 << KVS_FXNL_SILU_BITS];
    kvs_fxnl_exp_table(12, te);
    kvs_fxnl_sigmoid_table(12, ts);
    CHECK(te[0] == 4096 && te[2047] < te[0] && te[1024] == kvs_fxnl_exp_entry(-1024, 12));
    CHECK(ts[512] == 0 && ts[511] == 4096 && ts[0] == kvs_fx_encode(1 / (1 + exp(-1 / 128.0)),
                                                                    12));
    for (int f = 12; f <= 16; f += 4) {
        run_frac(f, &r);
        check_accuracy(f, &r);
    }
    /* argument checks */
    kvs_mpc dummy = {.role = KVS_MPC_P0, .frac = 12};
    kvs_error err = {0};
    uint64_t v = 0;
    CHECK(kvs_mpc_lut(&dummy, KVS_OP_LUT, &v, 1, 17, table16, &v, &err) == KVS_ERR_ARG);
    CHECK(kvs_mpc_lut(&dummy, KVS_OP_LUT, &v, 1, 0, table16, &v, &err) == KVS_ERR_ARG);
    dummy.frac = 5;
    CHECK(kvs_mpc_exp_neg(&dummy, KVS_OP_LUT, &v, 1, 64, &v, &err) == KVS_ERR_ARG);
    return check_summary("mpc_nl");
}
