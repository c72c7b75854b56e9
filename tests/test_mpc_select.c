/* The selection gates (src/mpc/gates_select.c) against their plaintext emulators, bit for bit:
 * the three roles on threads run one-hots of secret indices (edges of the range included),
 * top-k masks at several k over rows with ties (the lower index must win), over values at the
 * edge of the sign test's width, by ranks and by a threshold, and the ordered gather matrix of
 * each mask, MPCache's cluster representatives; the secret cache's cluster gather and the
 * product of two shared matrices against plain arithmetic; then what each gate sent and how many rounds it took. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/random.h"
#include "mpc/gates_cache.h"
#include "mpc/fxp.h"
#include "mpc/gates_select.h"
#include "mpc/local.h"

enum { NI = 40, OB = 5, ROWS = 4, LEN = 13, NK = 5, BITS = 24 };
/* the cluster gather: GH heads of GD values, GC clusters of GS rows, GK gathered */
enum { GH = 2, GD = 3, GC = 4, GS = 3, GK = 2 };
/* the shared matrix product: X (MR x MK, party 0's) times Y (MK x MN, party 1's) */
enum { MR = 3, MK = 5, MN = 4 };
/* cluster representatives: RN clusters of RS rows of RD values */
enum { RN = 6, RS = 5, RD = 4 };
static const size_t ks[NK] = {0, 1, 4, 12, 13};

typedef struct inputs {
    uint64_t idx[NI];       /* party 0's secret indices, below 2^OB */
    uint64_t v[ROWS * LEN]; /* party 1's values, |v| < 2^(BITS - 2) */
    uint64_t rows[GC * GS][GH * GD], g[GH * GK * GC]; /* party 0's cache rows, party 1's g */
    uint64_t X[MR * MK], Y[MK * MN];
    uint64_t cx[RN * RS * RD];
} inputs;

typedef struct outputs {
    uint64_t onehot[NI << OB];
    uint64_t sel[NK][ROWS * LEN], selt[NK][ROWS * LEN]; /* by ranks, by a threshold */
    uint64_t G[NK][ROWS * LEN * LEN];
    uint64_t rounds[4], sent[4]; /* one-hot, top-k, gather (the last k), top-k by threshold */
    uint64_t gathered[2][GH * GK * GS * GD]; /* clusters of GS rows, and of single rows */
    uint64_t gather_sent;
    uint64_t Z[MR * MN];
    uint64_t mm_rounds, mm_sent;
    uint64_t rep[RN * RD];
} outputs;

typedef struct sel_ctx {
    const inputs *in;
    outputs out[3];
} sel_ctx;

static void counters(const kvs_mpc *m, uint64_t *rounds, uint64_t *sent)
{
    kvs_chan_stats s;
    kvs_chan_stats_get(m->peer, &s);
    *rounds = *sent = 0;
    for (int op = 0; op < KVS_OP_N; op++) {
        *rounds += s.rounds[op];
        *sent += s.sent_payload[op];
    }
}

static kvs_status program(kvs_mpc *m, void *ctx, kvs_error *err)
{
    sel_ctx *c = ctx;
    const inputs *in = c->in;
    outputs *o = &c->out[m->role];
    const int dealer = kvs_mpc_is_dealer(m), p0 = m->role == KVS_MPC_P0;
    uint64_t idx[NI], v[ROWS * LEN];
    static uint64_t oh[3][NI << OB], sel[3][ROWS * LEN], G[3][ROWS * LEN * LEN];
    const int me = (int)m->role;
    kvs_status st = kvs_mpc_input(m, 0, p0 ? in->idx : NULL, NI, idx, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, m->role == KVS_MPC_P1 ? in->v : NULL, ROWS * LEN, v, err);
    uint64_t r0 = 0, s0 = 0, r1 = 0, s1 = 0;
    if (!dealer && st == KVS_OK) {
        st = kvs_chan_flush(m->peer, err);
        counters(m, &r0, &s0);
    }
    if (st == KVS_OK)
        st = kvs_mpc_onehot(m, KVS_OP_GATHER, dealer ? NULL : idx, NI, OB,
                            dealer ? NULL : oh[me], err);
    if (!dealer) {
        counters(m, &r1, &s1);
        o->rounds[0] = r1 - r0;
        o->sent[0] = s1 - s0;
    }
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, oh[me], NI << OB, o->onehot, err);
    for (int q = 0; q < NK && st == KVS_OK; q++) {
        if (!dealer)
            counters(m, &r0, &s0);
        st = kvs_mpc_topk_mask(m, KVS_OP_TOPK, dealer ? NULL : v, ROWS, LEN, ks[q], BITS,
                               dealer ? NULL : sel[me], err);
        if (!dealer) {
            counters(m, &r1, &s1);
            o->rounds[1] = r1 - r0;
            o->sent[1] = s1 - s0;
        }
        if (st == KVS_OK)
            st = kvs_mpc_gather_matrix(m, KVS_OP_GATHER, dealer ? NULL : sel[me], ROWS, LEN,
                                       ks[q], dealer ? NULL : G[me], err);
        if (!dealer) {
            counters(m, &r0, &s0);
            o->rounds[2] = r0 - r1;
            o->sent[2] = s0 - s1;
        }
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, sel[me], ROWS * LEN, o->sel[q], err);
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, G[me], ROWS * ks[q] * LEN, o->G[q], err);
        if (!dealer && st == KVS_OK) {
            st = kvs_chan_flush(m->peer, err);
            counters(m, &r0, &s0);
        }
        if (st == KVS_OK)
            st = kvs_mpc_topk_threshold(m, KVS_OP_TOPK, dealer ? NULL : v, ROWS, LEN, ks[q],
                                        BITS, dealer ? NULL : sel[me], err);
        if (!dealer) {
            counters(m, &r1, &s1);
            o->rounds[3] = r1 - r0;
            o->sent[3] = s1 - s0;
        }
        if (st == KVS_OK)
            st = kvs_mpc_open(m, KVS_OP_OPEN, sel[me], ROWS * LEN, o->selt[q], err);
    }
    /* the cluster gather, from a cache of party 0's rows and party 1's (any) g */
    kvs_mpc_cache cache;
    kvs_mpc_cache_init(&cache, GH, GD);
    uint64_t rows[GC * GS * GH * GD], g[GH * GK * GC], out[GH * GK * GS * GD];
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->rows[0] : NULL, GC * GS * GH * GD, rows, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &cache, dealer ? NULL : rows, GC * GS, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, m->role == KVS_MPC_P1 ? in->g : NULL, GH * GK * GC, g, err);
    if (!dealer && st == KVS_OK) {
        st = kvs_chan_flush(m->peer, err);
        counters(m, &r0, &s0);
    }
    if (st == KVS_OK)
        st = kvs_mpc_cache_gather(m, KVS_OP_GATHER, &cache, dealer ? NULL : g, GK, GS,
                                  dealer ? NULL : out, err);
    if (!dealer) {
        counters(m, &r1, &s1);
        o->gather_sent = s1 - s0;
    }
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, out, GH * GK * GS * GD, o->gathered[0], err);
    /* clusters of one row (s = 1): a cache of the first GC rows, the same g */
    kvs_mpc_cache one;
    kvs_mpc_cache_init(&one, GH, GD);
    if (st == KVS_OK)
        st = kvs_mpc_cache_append(m, KVS_OP_MATMUL, &one, dealer ? NULL : rows, GC, err);
    if (st == KVS_OK)
        st = kvs_mpc_cache_gather(m, KVS_OP_GATHER, &one, dealer ? NULL : g, GK, 1,
                                  dealer ? NULL : out, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, out, GH * GK * GD, o->gathered[1], err);
    kvs_mpc_cache_free(&cache);
    kvs_mpc_cache_free(&one);
    /* the shared matrix product */
    uint64_t X[MR * MK], Y[MK * MN], Z[MR * MN];
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->X : NULL, MR * MK, X, err);
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 1, m->role == KVS_MPC_P1 ? in->Y : NULL, MK * MN, Y, err);
    if (!dealer && st == KVS_OK) {
        st = kvs_chan_flush(m->peer, err);
        counters(m, &r0, &s0);
    }
    if (st == KVS_OK)
        st = kvs_mpc_matmul(m, KVS_OP_MUL, dealer ? NULL : X, dealer ? NULL : Y, MR, MK, MN,
                            dealer ? NULL : Z, err);
    if (!dealer) {
        counters(m, &r1, &s1);
        o->mm_rounds = r1 - r0;
        o->mm_sent = s1 - s0;
    }
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, Z, MR * MN, o->Z, err);
    /* cluster representatives at alpha = 0.6 */
    uint64_t cx[RN * RS * RD], rep[RN * RD];
    if (st == KVS_OK)
        st = kvs_mpc_input(m, 0, p0 ? in->cx : NULL, RN * RS * RD, cx, err);
    if (st == KVS_OK)
        st = kvs_mpc_cluster_reps(m, KVS_OP_TOPK, dealer ? NULL : cx, RN, RS, RD,
                                  kvs_fx_encode(0.6, m->frac), 24, dealer ? NULL : rep, err);
    if (st == KVS_OK)
        st = kvs_mpc_open(m, KVS_OP_OPEN, rep, RN * RD, o->rep, err);
    return st;
}

int main(void)
{
    static inputs in;
    kvs_xoshiro g;
    kvs_xoshiro_seed(&g, 77);
    for (int i = 0; i < NI; i++)
        in.idx[i] = i < 3 ? (uint64_t)(i == 0 ? 0 : i == 1 ? 1 : (1 << OB) - 1)
                          : kvs_xoshiro_next(&g) & ((1 << OB) - 1);
    /* row 0: random; row 1: many ties (values from a set of 3); row 2: all equal; row 3: the
     * extremes of the width (differences just below 2^(BITS - 1)) */
    const int64_t lim = ((int64_t)1 << (BITS - 2)) - 1;
    for (int j = 0; j < LEN; j++) {
        in.v[j] = (uint64_t)((int64_t)(kvs_xoshiro_next(&g) % (uint64_t)(2 * lim)) - lim);
        in.v[LEN + j] = (uint64_t)(int64_t)(kvs_xoshiro_next(&g) % 3) * 1000;
        in.v[2 * LEN + j] = (uint64_t)(int64_t)-7;
        in.v[3 * LEN + j] = (uint64_t)(j % 2 ? lim : -lim);
    }
    for (int t = 0; t < GC * GS; t++)
        for (int i = 0; i < GH * GD; i++)
            in.rows[t][i] = kvs_xoshiro_next(&g);
    for (int i = 0; i < GH * GK * GC; i++)
        in.g[i] = i % 3 == 0 ? 1 : kvs_xoshiro_next(&g);
    for (int i = 0; i < MR * MK; i++)
        in.X[i] = kvs_xoshiro_next(&g);
    for (int i = 0; i < MK * MN; i++)
        in.Y[i] = i == 0 ? ~(uint64_t)0 : kvs_xoshiro_next(&g);
    for (int i = 0; i < RN * RS * RD; i++) /* |x| < 2^20, with a tied cluster */
        in.cx[i] = i < RS * RD ? 77 : (uint64_t)((int64_t)(kvs_xoshiro_next(&g) % (1u << 21)) -
                                                 (1 << 20));
    static sel_ctx ctx;
    ctx.in = &in;
    kvs_mpc_local_cfg cfg = {.frac = 12, .insecure_plain = 1, .corr_seed = {{1}, {2}},
                             .own_seed = {{3}, {4}, {5}}, .timeout_ms = 30000};
    kvs_mpc_local_result res[3];
    kvs_error err = {0};
    const kvs_status st = kvs_mpc_run_local(program, &ctx, &cfg, res, &err);
    CHECKF(st == KVS_OK, "%s", err.msg);
    if (st != KVS_OK)
        return check_summary("mpc_select");
    const outputs *o = &ctx.out[0];
    int oh_ok = 1;
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < 1 << OB; j++)
            oh_ok &= o->onehot[(i << OB) + j] == (uint64_t)(in.idx[i] == (uint64_t)j);
    CHECK(oh_ok);
    for (int q = 0; q < NK; q++) {
        uint64_t want[ROWS * LEN], wantG[ROWS * LEN * LEN];
        kvs_fx_topk_mask(in.v, ROWS, LEN, ks[q], want);
        kvs_fx_gather_matrix(want, ROWS, LEN, ks[q], wantG);
        CHECKF(!memcmp(want, o->sel[q], sizeof want), "top-%zu mask differs from the emulator",
               ks[q]);
        CHECKF(!memcmp(want, o->selt[q], sizeof want),
               "top-%zu mask by threshold differs from the emulator", ks[q]);
        CHECKF(!memcmp(wantG, o->G[q], sizeof *wantG * ROWS * ks[q] * LEN),
               "gather matrix of the top-%zu differs from the emulator", ks[q]);
        size_t ones = 0;
        for (int i = 0; i < ROWS * LEN; i++)
            ones += want[i];
        CHECKF(ones == ROWS * ks[q], "the emulator keeps %zu, not %d x %zu", ones, ROWS, ks[q]);
    }
    /* the cluster gather against plain arithmetic (mod 2^64), for clusters of GS rows and of
     * single rows */
    int gather_ok = 1;
    for (int pass = 0; pass < 2; pass++) {
        const int S = pass == 0 ? GS : 1;
        for (int h = 0; h < GH; h++)
            for (int p = 0; p < GK; p++)
                for (int j = 0; j < S; j++)
                    for (int i = 0; i < GD; i++) {
                        uint64_t want = 0;
                        for (int c = 0; c < GC; c++)
                            want += in.g[(h * GK + p) * GC + c] * in.rows[c * S + j][h * GD + i];
                        gather_ok &= o->gathered[pass][((h * GK + p) * S + j) * GD + i] == want;
                    }
    }
    CHECK(gather_ok);
    CHECKF(o->gather_sent == 8 * GH * GK * GC, "the cluster gather sent %llu bytes",
           (unsigned long long)o->gather_sent);
    /* the shared matrix product, mod 2^64: one round, both matrices' masked copies */
    int mm_ok = 1;
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < MN; j++) {
            uint64_t want = 0;
            for (int t = 0; t < MK; t++)
                want += in.X[i * MK + t] * in.Y[t * MN + j];
            mm_ok &= o->Z[i * MN + j] == want;
        }
    CHECK(mm_ok);
    CHECKF(o->mm_rounds == 1 && o->mm_sent == 8 * (MR * MK + MK * MN),
           "matrix product: %llu rounds, %llu bytes", (unsigned long long)o->mm_rounds,
           (unsigned long long)o->mm_sent);
    /* cluster representatives against their emulator */
    uint64_t want_rep[RN * RD];
    kvs_fx_cluster_reps(in.cx, RN, RS, RD, kvs_fx_encode(0.6, 12), 12, want_rep);
    CHECK(!memcmp(want_rep, o->rep, sizeof want_rep));
    CHECK(want_rep[0] == kvs_fx_ars(77 * ((uint64_t)1 << 12), 12)); /* a constant cluster */
    /* the emulator on its own: ties go to the lower index */
    {
        const uint64_t t[6] = {5, 9, 9, 1, 9, 5};
        uint64_t s[6];
        kvs_fx_topk_mask(t, 1, 6, 2, s);
        CHECK(s[1] == 1 && s[2] == 1 && s[4] == 0 && s[0] == 0);
        kvs_fx_topk_mask(t, 1, 6, 4, s);
        CHECK(s[0] == 1 && s[5] == 0);
    }
    /* costs: one round for the one-hot (1 byte an index at 5 bits), two for the top-k, two for
     * the gather matrix */
    CHECKF(o->rounds[0] == 1 && o->sent[0] == NI, "one-hot: %llu rounds, %llu bytes",
           (unsigned long long)o->rounds[0], (unsigned long long)o->sent[0]);
    const uint64_t pairs = ROWS * LEN * (LEN - 1) / 2;
    CHECKF(o->rounds[1] == 2 && o->sent[1] == pairs * 3 + ROWS * LEN,
           "top-k: %llu rounds, %llu bytes (pairs %llu)", (unsigned long long)o->rounds[1],
           (unsigned long long)o->sent[1], (unsigned long long)pairs);
    CHECKF(o->rounds[2] == 2, "gather matrix: %llu rounds", (unsigned long long)o->rounds[2]);
    CHECKF(o->rounds[3] == 2 * BITS + 1, "top-k by threshold: %llu rounds",
           (unsigned long long)o->rounds[3]);
    printf("one-hot of %d indices over %d bits: %llu round, %llu bytes; top-k of %d rows of %d: "
           "%llu rounds, %llu bytes (by threshold: %llu rounds, %llu bytes); gather matrix: "
           "%llu rounds, %llu bytes\n",
           NI, OB, (unsigned long long)o->rounds[0], (unsigned long long)o->sent[0], ROWS, LEN,
           (unsigned long long)o->rounds[1], (unsigned long long)o->sent[1],
           (unsigned long long)o->rounds[3], (unsigned long long)o->sent[3],
           (unsigned long long)o->rounds[2], (unsigned long long)o->sent[2]);
    return check_summary("mpc_select");
}
