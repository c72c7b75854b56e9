/* The two-party arithmetic gates (src/mpc/gates.c) against their plaintext fixed-point emulator
 * (src/mpc/fxp.h), bit for bit: three threads (dealer, party 0, party 1) joined by socket pairs
 * run the same program; the test then compares what the parties opened with what the emulator
 * computes from the inputs, over random and edge values, and checks what each gate sent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "mpc/corr.h"
#include "mpc/fss.h"
#include "mpc/fxp.h"
#include "mpc/gates.h"
#include "mpc/gates_cache.h"
#include "mpc/local.h"

enum { N = 200, ROWS = 3, K = 17, NC = 11, FRAC = 12, N_EDGE = 16, MR = 8, ML = 25 };
/* the secret cache: CH KV heads of CD values, CT rows, CG queries per head */
enum { CH = 2, CD = 4, CT = 5, CG = 3 };

/* The inputs: party 0's x (and the rows of the matrix product), party 1's y and W. */
typedef struct inputs {
    uint64_t x[N], y[N], edge[N_EDGE], xm[ROWS * K], W[K * NC];
    uint64_t rows[CT][CH * CD], q[CH * CG * CD], p[CH * CG * CT];
    uint64_t tied[N]; /* x with ties at the maxima: the first must win */
} inputs;

/* What a party opened. */
typedef struct outputs {
    uint64_t prod[N];      /* trunc(x y) */
    uint64_t raw[N];       /* x y, no truncation */
    uint64_t edge[N_EDGE]; /* trunc(edge) */
    uint64_t mm[ROWS * NC], mmt[ROWS * NC]; /* x W, and truncated */
    uint64_t nonneg[N], max2[N], maxr[MR]; /* [x >= 0], max(x, y), row maxima of x */
    uint64_t edge_nonneg[N_EDGE];
    uint64_t qk[CH * CG * CT], pv[CH * CG * CD];
    uint64_t amax[MR], amaxv[MR]; /* argmax of the rows of the tied copy of x, and the max */
    kvs_chan_stats stats;
    uint64_t dealer_bytes;
} outputs;

/* The program's shared context: the inputs and each role's outputs. */
typedef struct gates_ctx {
    const inputs *in;
    outputs out[3];
} gates_ctx;

static kvs_status program(kvs_mpc *m, const inputs *in, outputs *o, kvs_error *err)
{
    const int p0 = m->role == KVS_MPC_P0, p1 = m->role == KVS_MPC_P1;
    uint64_t x[N], y[N], e[N_EDGE], z[N], xm[ROWS * K], mm[ROWS * NC] = {0};
    kvs_mpc_weight w;
    kvs_status st = kvs_mpc_input(m, 0, p0 ? in->x : NULL, N, x, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, p1 ? in->y : NULL, N, y, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->edge : NULL, N_EDGE, e, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->xm : NULL, ROWS * K, xm, err);
    /* x y, opened raw, then truncated */
    if (st == KVS_OK)
        st = kvs_mpc_mul(m, KVS_OP_MUL, x, y, N, z, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, z, N, o->raw, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_TRUNC, z, N, FRAC, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, z, N, o->prod, err);
    if (st == KVS_OK)
        st = kvs_mpc_trunc(m, KVS_OP_TRUNC, e, N_EDGE, FRAC, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, e, N_EDGE, o->edge, err);
    /* x W with party 1's weights */
    if (st == KVS_OK)
        st = kvs_mpc_weight_setup(m, &w, K, NC, p1 ? in->W : NULL, err);
    if (st == KVS_OK) {
        st = kvs_mpc_matmul_w(m, &w, xm, ROWS, mm, err);
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, mm, ROWS * NC, o->mm, err);
        if (st == KVS_OK)
            st = kvs_mpc_trunc(m, KVS_OP_TRUNC, mm, ROWS * NC, FRAC, err);
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, mm, ROWS * NC, o->mmt, err);
        kvs_mpc_weight_free(&w);
    }
    /* comparisons */
    uint64_t d[N], mx[N], mr[MR], de[N_EDGE];
    if (st == KVS_OK)
        st = kvs_mpc_nonneg(m, KVS_OP_CMP, x, N, d, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, d, N, o->nonneg, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->edge : NULL, N_EDGE, e, err);
    if (st == KVS_OK)
        st = kvs_mpc_nonneg(m, KVS_OP_CMP, e, N_EDGE, de, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, de, N_EDGE, o->edge_nonneg, err);
    if (st == KVS_OK)
        st = kvs_mpc_max2(m, KVS_OP_CMP, x, y, N, 64, mx, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, mx, N, o->max2, err);
    if (st == KVS_OK)
        st = kvs_mpc_max_rows(m, KVS_OP_SOFTMAX, x, MR, ML, 23, mr, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, mr, MR, o->maxr, err);
    /* the secret cache: rows appended by party 0's input, products with queries */
    kvs_mpc_cache cache;
    kvs_mpc_cache_init(&cache, CH, CD);
    uint64_t row[CT * CH * CD], q[CH * CG * CD], p[CH * CG * CT], qk[CH * CG * CT],
        pv[CH * CG * CD];
    /* the first half of the rows as one block, the rest one by one */
    for (int t = 0; t < CT && st == KVS_OK;) {
        const int n = t == 0 ? CT / 2 : 1;
        st = kvs_mpc_input(m, 0, p0 ? in->rows[t] : NULL, (size_t)n * CH * CD, row, err);
        if (st == KVS_OK)
            st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &cache, row, (size_t)n, err);
        t += n;
    }
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, p1 ? in->q : NULL, CH * CG * CD, q, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, p1 ? in->p : NULL, CH * CG * CT, p, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_qk(m, KVS_OP_MATMUL, &cache, q, 1, CG, qk, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, qk, CH * CG * CT, o->qk, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_pv(m, KVS_OP_MATMUL, &cache, p, 1, CG, pv, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, pv, CH * CG * CD, o->pv, err);
    kvs_mpc_cache_free(&cache);
    uint64_t t[N], ai[MR], av[MR];
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->tied : NULL, N, t, err);
    if (st == KVS_OK)
        st = kvs_mpc_argmax_rows(m, KVS_OP_ARGMAX, t, MR, ML, 23, ai, av, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, ai, MR, o->amax, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, av, MR, o->amaxv, err);
    return st;
}

static kvs_status run_program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    gates_ctx *g = ctx;
    return program(m, g->in, &g->out[m->role], err);
}

int main(void)
{
    static inputs in;
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 99);
    /* values up to 2^20 in magnitude (fixed point with 12 fraction bits: |v| < 256): products
     * stay below 2^40, far inside the truncation's 2^62 */
    for (int i = 0; i < N; i++) {
        in.x[i] = (uint64_t)((int64_t)(kvs_xoshiro_next(&g) % (1u << 21)) - (1 << 20));
        in.y[i] = (uint64_t)((int64_t)(kvs_xoshiro_next(&g) % (1u << 21)) - (1 << 20));
    }
    const int64_t edges[N_EDGE] = {0, -1, 1, 4095, 4096, 4097, -4095, -4096, -4097,
                                   ((int64_t)1 << 61) - 1, -((int64_t)1 << 61),
                                   ((int64_t)1 << 62) - 1, -((int64_t)1 << 62), 123456789,
                                   -987654321, 8191};
    for (int i = 0; i < N_EDGE; i++)
        in.edge[i] = (uint64_t)edges[i];
    for (int i = 0; i < ROWS * K; i++)
        in.xm[i] = kvs_fx_encode(((int)(kvs_xoshiro_next(&g) % 2001) - 1000) / 250.0, FRAC);
    for (int i = 0; i < K * NC; i++)
        in.W[i] = kvs_fx_encode(((int)(kvs_xoshiro_next(&g) % 2001) - 1000) / 500.0, FRAC);
    for (int t = 0; t < CT; t++)
        for (int i = 0; i < CH * CD; i++)
            in.rows[t][i] = kvs_xoshiro_next(&g);
    /* ties: in each row copy the maximum to a later place (and in row 0 to every place) */
    memcpy(in.tied, in.x, sizeof in.tied);
    for (int r = 0; r < MR; r++) {
        int best = 0;
        for (int j = 1; j < ML; j++)
            if ((int64_t)in.tied[r * ML + j] > (int64_t)in.tied[r * ML + best])
                best = j;
        for (int j = best + 1; j < ML; j += r == 0 ? 1 : 7)
            in.tied[r * ML + j] = in.tied[r * ML + best];
    }
    for (int i = 0; i < CH * CG * CD; i++)
        in.q[i] = kvs_xoshiro_next(&g);
    for (int i = 0; i < CH * CG * CT; i++)
        in.p[i] = kvs_xoshiro_next(&g);

    static gates_ctx ctx;
    ctx.in = &in;
    kvs_mpc_local_cfg cfg = {.frac = FRAC, .insecure_plain = 1,
                             .corr_seed = {{1}, {2}}, .own_seed = {{3}, {4}, {5}}};
    kvs_mpc_local_result res[3];
    kvs_error err = {0};
    const kvs_status st = kvs_mpc_run_local(run_program, &ctx, &cfg, res, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st != KVS_OK)
        return check_summary("mpc_gates");
    struct {
        outputs out;
    } r[2];
    for (int i = 0; i < 2; i++) {
        r[i].out = ctx.out[i];
        r[i].out.stats = res[i].peer;
        r[i].out.dealer_bytes = res[i].dealer_bytes;
    }
    int raw = 1, prod = 1, edge = 1, mm = 1, mmt = 1, same = 1;
    for (int i = 0; i < N; i++) {
        raw &= r[0].out.raw[i] == in.x[i] * in.y[i];
        prod &= r[0].out.prod[i] == kvs_fx_mul(in.x[i], in.y[i], FRAC);
        same &= r[1].out.prod[i] == r[0].out.prod[i];
    }
    int first_edge = -1;
    for (int i = 0; i < N_EDGE; i++)
        if (r[0].out.edge[i] != kvs_fx_ars(in.edge[i], FRAC) && first_edge < 0) {
            first_edge = i;
            edge = 0;
        }
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < NC; j++) {
            uint64_t acc = 0;
            for (int t = 0; t < K; t++)
                acc += in.xm[i * K + t] * in.W[t * NC + j];
            mm &= r[0].out.mm[i * NC + j] == acc;
            mmt &= r[0].out.mmt[i * NC + j] == kvs_fx_ars(acc, FRAC);
        }
    int nn = 1, m2 = 1, mxr = 1, enn = 1;
    for (int i = 0; i < N; i++) {
        nn &= r[0].out.nonneg[i] == ((int64_t)in.x[i] >= 0);
        const int64_t a = (int64_t)in.x[i], b = (int64_t)in.y[i];
        m2 &= r[0].out.max2[i] == (uint64_t)(a > b ? a : b);
    }
    for (int i = 0; i < N_EDGE; i++)
        enn &= r[0].out.edge_nonneg[i] == (edges[i] >= 0);
    for (int i = 0; i < MR; i++) {
        int64_t best = (int64_t)in.x[i * ML];
        for (int j = 1; j < ML; j++)
            best = (int64_t)in.x[i * ML + j] > best ? (int64_t)in.x[i * ML + j] : best;
        mxr &= r[0].out.maxr[i] == (uint64_t)best;
    }
    int cqk = 1, cpv = 1;
    for (int h = 0; h < CH; h++)
        for (int gq = 0; gq < CG; gq++) {
            for (int t = 0; t < CT; t++) {
                uint64_t acc = 0;
                for (int i = 0; i < CD; i++)
                    acc += in.q[(h * CG + gq) * CD + i] * in.rows[t][h * CD + i];
                cqk &= r[0].out.qk[(h * CG + gq) * CT + t] == acc;
            }
            for (int i = 0; i < CD; i++) {
                uint64_t acc = 0;
                for (int t = 0; t < CT; t++)
                    acc += in.p[(h * CG + gq) * CT + t] * in.rows[t][h * CD + i];
                cpv &= r[0].out.pv[(h * CG + gq) * CD + i] == acc;
            }
        }
    int am = 1;
    for (int rr = 0; rr < MR; rr++) {
        int best = 0;
        for (int j = 1; j < ML; j++)
            if ((int64_t)in.tied[rr * ML + j] > (int64_t)in.tied[rr * ML + best])
                best = j;
        am &= r[0].out.amax[rr] == (uint64_t)best && r[0].out.amaxv[rr] == in.tied[rr * ML + best];
    }
    CHECKF(am, "argmax (first of ties) differs from the emulator");
    CHECKF(cqk, "secret cache: q K^T differs from plain arithmetic mod 2^64");
    CHECKF(cpv, "secret cache: p V differs from plain arithmetic mod 2^64");
    CHECKF(nn, "[x >= 0] differs from the emulator");
    CHECKF(enn, "[x >= 0] of the edge values differs");
    CHECKF(m2, "max(x, y) differs");
    CHECKF(mxr, "row maxima differ");
    CHECKF(r[0].out.stats.rounds[KVS_OP_SOFTMAX] == 2 * 5, "row maxima of %d: %llu rounds, "
           "expected 2 per level x 5 levels", ML,
           (unsigned long long)r[0].out.stats.rounds[KVS_OP_SOFTMAX]);
    CHECKF(raw, "Beaver product differs from x y mod 2^64");
    CHECKF(prod, "truncated product differs from the emulator");
    CHECKF(same, "the parties opened different values");
    CHECKF(edge, "truncation of edge value %lld: got %lld, emulator %lld",
           first_edge < 0 ? 0LL : (long long)edges[first_edge],
           first_edge < 0 ? 0LL : (long long)r[0].out.edge[first_edge],
           first_edge < 0 ? 0LL : (long long)kvs_fx_ars(in.edge[first_edge], FRAC));
    CHECKF(mm, "weight product differs from x W mod 2^64");
    CHECKF(mmt, "truncated weight product differs from the emulator");
    /* what went between the parties: party 0 sent ROWS x K words for the weight product, party
     * 1 the masked weights once; each truncation opened one word per value from each side */
    const kvs_chan_stats *s0 = &r[0].out.stats, *s1 = &r[1].out.stats;
    /* (the cache: CT appended rows, one query and one weights opening from each side) */
    const uint64_t cache_words = CT * CH * CD + CH * CG * CD + CH * CG * CT;
    CHECKF(s0->sent_payload[KVS_OP_MATMUL] == 8 * (ROWS * K + cache_words) &&
               s1->sent_payload[KVS_OP_MATMUL] == 8 * cache_words,
           "matmul bytes %llu / %llu", (unsigned long long)s0->sent_payload[KVS_OP_MATMUL],
           (unsigned long long)s1->sent_payload[KVS_OP_MATMUL]);
    CHECKF(s1->sent_payload[KVS_OP_INPUT] == 8 * (N + K * NC + CH * CG * (CD + CT)),
           "party 1 input bytes %llu",
           (unsigned long long)s1->sent_payload[KVS_OP_INPUT]);
    CHECKF(s0->sent_payload[KVS_OP_TRUNC] == 8 * (N + N_EDGE + ROWS * NC) &&
               s0->rounds[KVS_OP_TRUNC] == 3,
           "trunc: %llu bytes, %llu rounds", (unsigned long long)s0->sent_payload[KVS_OP_TRUNC],
           (unsigned long long)s0->rounds[KVS_OP_TRUNC]);
    CHECKF(s0->sent_payload[KVS_OP_MUL] == 16 * N && s0->rounds[KVS_OP_MUL] == 1,
           "mul: %llu bytes, %llu rounds", (unsigned long long)s0->sent_payload[KVS_OP_MUL],
           (unsigned long long)s0->rounds[KVS_OP_MUL]);
    /* dealer material: party 0 gets only FSS keys (its triples and masks come from its stream):
     * truncations by 12 bits (t12 values) and sign tests (one DCF over 63 bits: t62 values,
     * the max tree of 8 rows of 25 making 12 + 6 + 3 + 2 + 1 comparisons per row, over 23
     * bits: x is below 2^20 in magnitude, differences below 2^21); party 1 also
     * one word per triple and per weight-product output, and two per truncated value (its
     * mask's quotient and top bit) */
    const uint64_t t12 = N + N_EDGE + ROWS * NC, t62 = N + N_EDGE + N + MR * 24;
    const uint64_t keys = t12 * kvs_dcf_key_bytes(FRAC) +
                          (t62 - MR * 24) * kvs_dcf_key_bytes(63) +
                          2 * MR * 24 * kvs_dcf_key_bytes(22); /* max tree and argmax tree */
    const uint64_t words = (N + N + MR * 24) + ROWS * NC + 2 * t12 + t62 + CH * CG * (CT + CD) +
                           MR * 24 * 3; /* argmax: a sign share and two products a comparison */
    CHECKF(r[0].out.dealer_bytes == keys, "party 0 dealer bytes %llu, keys %llu",
           (unsigned long long)r[0].out.dealer_bytes, (unsigned long long)keys);
    CHECKF(r[1].out.dealer_bytes == keys + 8 * words, "party 1 dealer bytes %llu, expected %llu",
           (unsigned long long)r[1].out.dealer_bytes, (unsigned long long)(keys + 8 * words));
    /* the same program over encrypted channels: the same values, 16 more wire bytes a message */
    static gates_ctx enc;
    enc.in = &in;
    cfg.insecure_plain = 0;
    kvs_mpc_local_result eres[3];
    CHECKF(kvs_mpc_run_local(run_program, &enc, &cfg, eres, &err) == KVS_OK, "%s", err.msg);
    CHECK(!memcmp(enc.out[0].prod, ctx.out[0].prod, sizeof ctx.out[0].prod) &&
          !memcmp(enc.out[1].mmt, ctx.out[1].mmt, sizeof ctx.out[1].mmt));
    uint64_t wire_p = 0, wire_e = 0, msgs = 0;
    for (int op = KVS_OP_INPUT; op < KVS_OP_N; op++) {
        wire_p += res[0].peer.sent_wire[op];
        wire_e += eres[0].peer.sent_wire[op];
        msgs += res[0].peer.msgs_sent[op];
    }
    CHECKF(wire_e == wire_p + 16 * msgs, "encrypted wire bytes %llu, plain %llu, %llu messages",
           (unsigned long long)wire_e, (unsigned long long)wire_p, (unsigned long long)msgs);
    printf("dealer bytes: party 0 %llu, party 1 %llu; DCF key bytes %zu (%d bits), %zu (64)\n",
           (unsigned long long)r[0].out.dealer_bytes, (unsigned long long)r[1].out.dealer_bytes,
           kvs_dcf_key_bytes(FRAC), FRAC, kvs_dcf_key_bytes(64));
    return check_summary("mpc_gates");
}
